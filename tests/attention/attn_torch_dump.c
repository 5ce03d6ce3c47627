/* Runs one [attention] layer (built directly, sequence input) forward and
 * backward on random inputs and parameters and writes everything to a raw
 * file for tests/attention/attn_torch_check.py, which recomputes it with
 * PyTorch's multi_head_attention_forward and autograd.
 * usage: attn_torch_dump OUT  (writes N T C heads causal as 5 int32, then
 * float32 arrays: x, qkv_weight, qkv_bias, out_weight, out_bias, dy, y, dx,
 * and the four parameter gradients). Exit 77 without an OpenCL device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/cfg.h"
#include "model/layers.h"
#include "testutil.h"

#define CHECK(expr)                                                                                  \
    do {                                                                                             \
        clg_status s_ = (expr);                                                                      \
        if (s_ != CLG_OK) {                                                                          \
            fprintf(stderr, "%s: %s: %s\n", #expr, clg_status_name(s_), clg_last_error(ctx));         \
            return 1;                                                                                \
        }                                                                                            \
    } while (0)

static clg_ctx *ctx;

static cl_mem upload(clg_device *dev, const float *h, size_t n)
{
    cl_mem m = NULL;
    if (clg_buf_alloc(dev, n * sizeof(float), &m) != CLG_OK)
        return NULL;
    clEnqueueWriteBuffer(dev->queue, m, CL_TRUE, 0, n * sizeof(float), h, 0, NULL, NULL);
    return m;
}

static void put(FILE *f, clg_device *dev, cl_mem m, const float *h, size_t n)
{
    float *tmp = malloc(n * sizeof(float));
    if (m)
        clEnqueueReadBuffer(dev->queue, m, CL_TRUE, 0, n * sizeof(float), tmp, 0, NULL, NULL);
    else
        memcpy(tmp, h, n * sizeof(float));
    fwrite(tmp, sizeof(float), n, f);
    free(tmp);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: attn_torch_dump OUT\n");
        return 2;
    }
    const int N = 2, T = 9, C = 32, heads = 4, causal = 1;
    clg_ctx_params cp;
    clg_ctx_params_init(&cp);
    cp.devices = "0";
    if (clg_ctx_create(&cp, &ctx) != CLG_OK)
        return 77;
    clg_device *dev = &ctx->devs[0];
    clg_layer l;
    memset(&l, 0, sizeof l);
    l.ops = clg_layer_lookup("attention");
    clg_cfg *cfg = NULL;
    CHECK(clg_cfg_parse(&ctx->err, "[attention]\nheads = 4\ncausal = 1\n", "<test>", &cfg));
    l.nin = 1;
    l.inputs[0] = -1;
    l.in_shape[0][0] = N, l.in_shape[0][1] = T, l.in_shape[0][2] = C, l.in_shape[0][3] = 1;
    l.in_seq[0] = 1;
    CHECK(l.ops->configure(&l, &ctx->err, cfg, &cfg->sec[0]));
    CHECK(l.ops->setup(&l, &ctx->err));
    clg_cfg_free(cfg);
    clg_rng rng;
    tu_rng(&rng, 7);
    CHECK(l.ops->init(&l, dev, &rng));
    size_t nx = (size_t)N * T * C;
    float *x = malloc(nx * sizeof(float)), *dy = malloc(nx * sizeof(float));
    tu_fill(x, nx, -1.0f, 1.0f, &rng);
    tu_fill(dy, nx, -1.0f, 1.0f, &rng);
    float *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = malloc(l.params[i].numel * sizeof(float));
        tu_fill(p[i], l.params[i].numel, -0.3f, 0.3f, &rng);
        CHECK(clg_layer_param_upload(dev, &l.params[i], p[i]));
    }
    cl_mem xm = upload(dev, x, nx), dym = upload(dev, dy, nx), ym = upload(dev, x, nx), dxm = upload(dev, x, nx);
    clg_tensor in = {xm, 0, N, T, C, 1}, out = {ym, 0, N, T, C, 1}, dout = {dym, 0, N, T, C, 1};
    clg_tensor din = {dxm, 0, N, T, C, 1};
    CHECK(l.ops->forward(&l, dev, &in, 1, &out, 1));
    CHECK(l.ops->backward(&l, dev, &in, 1, &out, &dout, &din));
    FILE *f = fopen(argv[1], "wb");
    if (!f)
        return 1;
    int hdr[5] = {N, T, C, heads, causal};
    fwrite(hdr, sizeof(int), 5, f);
    put(f, dev, NULL, x, nx);
    for (int i = 0; i < 4; i++)
        put(f, dev, NULL, p[i], l.params[i].numel);
    put(f, dev, NULL, dy, nx);
    put(f, dev, ym, NULL, nx);
    put(f, dev, dxm, NULL, nx);
    for (int i = 0; i < 4; i++)
        put(f, dev, l.params[i].grad, NULL, l.params[i].numel);
    fclose(f);
    cl_mem bufs[] = {xm, dym, ym, dxm};
    for (int i = 0; i < 4; i++)
        clg_buf_release(dev, bufs[i]);
    for (int i = 0; i < 4; i++)
        free(p[i]);
    free(x);
    free(dy);
    clg_layer_free(&l, dev);
    clg_ctx_destroy(ctx);
    return 0;
}
