/* Sequence-op timings (not a test): build/tests/seq/bench_seq
 * The kernels of src/ops/seq.c at gpt-mini's shapes (batch 32 x context
 * 128 = 4096 tokens, width 128, vocab 256): median of 7 runs after 2
 * warm-ups, wall time around clFinish, device 0 (POCL_DEVICES chooses). */
#include <stdio.h>
#include <stdlib.h>

#include "device/device.h"
#include "ops/seq.h"

#define REPS 9
#define WARM 2

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static cl_mem buf(clg_device *dev, size_t n, float v)
{
    cl_mem m = NULL;
    if (clg_buf_alloc(dev, n * sizeof(float), &m) != CLG_OK || clg_buf_fill(dev, m, 0, n, v) != CLG_OK) {
        fprintf(stderr, "bench_seq: allocation failed\n");
        exit(1);
    }
    return m;
}

int main(void)
{
    clg_ctx_params cp;
    clg_ctx_params_init(&cp);
    clg_ctx *ctx = NULL;
    if (clg_ctx_create(&cp, &ctx) != CLG_OK) {
        fprintf(stderr, "bench_seq: no device: %s\n", clg_last_error(NULL));
        return 77;
    }
    clg_device *dev = &ctx->devs[0];
    const size_t ntok = 32 * 128;
    const int D = 128, V = 256;
    float *ids = malloc(ntok * sizeof(float));
    for (size_t i = 0; i < ntok; i++)
        ids[i] = (float)((i * 2654435761u) % (unsigned)V);
    cl_mem mid = buf(dev, ntok, 0), my = buf(dev, ntok * D, 0.1f), mt = buf(dev, (size_t)V * D, 0.01f),
           mdt = buf(dev, (size_t)V * D, 0), mf = buf(dev, 1, 0), mm = buf(dev, ntok, 0), mr = buf(dev, ntok, 0),
           mg = buf(dev, D, 1), mb = buf(dev, D, 0), mx = buf(dev, ntok * D, 0.5f), mdx = buf(dev, ntok * D, 0),
           mp = buf(dev, ntok * V, 0), ml = buf(dev, ntok, 0), mc = buf(dev, ntok, 0), mlab = buf(dev, ntok, 0);
    clEnqueueWriteBuffer(dev->queue, mid, CL_TRUE, 0, ntok * sizeof(float), ids, 0, NULL, NULL);
    cl_uint none = 0xffffffffu;
    clEnqueueWriteBuffer(dev->queue, mf, CL_TRUE, 0, sizeof none, &none, 0, NULL, NULL);
    static const char *const names[] = {"embedding fwd", "embedding bwd", "layernorm fwd", "layernorm bwd",
                                        "token loss fwd", "token loss bwd", "posembed fwd", "posembed bwd"};
    printf("%zu tokens, width %d, vocab %d (token loss: %zu x %d)\n", ntok, D, V, ntok, V);
    for (int k = 0; k < 8; k++) {
        double t[REPS];
        for (int rep = 0; rep < REPS + WARM; rep++) {
            clFinish(dev->queue);
            double t0 = clg_now_sec();
            clg_status st = CLG_OK;
            switch (k) {
            case 0: st = clg_seq_embedding_forward(dev, ntok, D, V, mid, 0, mt, my, 0, mf); break;
            case 1: st = clg_seq_embedding_backward(dev, ntok, D, V, mid, 0, my, 0, mdt, 0); break;
            case 2: st = clg_seq_layernorm_forward(dev, ntok, D, 1e-5f, mx, 0, mg, mb, my, 0, mm, mr); break;
            case 3: st = clg_seq_layernorm_backward(dev, ntok, D, mx, 0, my, 0, mg, mm, mr, mt, mdt, mdx, 0); break;
            case 4: st = clg_seq_token_xent_forward(dev, ntok, V, 1.0f, 0.0f, mp, 0, mp, 0, mlab, 0, ml, mc); break;
            case 5: st = clg_seq_token_xent_backward(dev, ntok, V, 1.0f, 0.0f, mp, 0, mlab, 0, mp, 0); break;
            case 6: st = clg_seq_pos_forward(dev, 32, 128, D, mx, 0, mt, my, 0); break;
            default: st = clg_seq_pos_backward(dev, 32, 128, D, 128, mx, 0, mdt); break;
            }
            clFinish(dev->queue);
            if (st != CLG_OK) {
                fprintf(stderr, "bench_seq: %s: %s\n", names[k], clg_last_error(ctx));
                return 1;
            }
            if (rep >= WARM)
                t[rep - WARM] = clg_now_sec() - t0;
        }
        qsort(t, REPS, sizeof *t, cmpd);
        printf("%-16s %8.3f ms\n", names[k], t[REPS / 2] * 1e3);
    }
    free(ids);
    cl_mem all[] = {mid, my, mt, mdt, mf, mm, mr, mg, mb, mx, mdx, mp, ml, mc, mlab};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        clg_buf_release(dev, all[i]);
    clg_ctx_destroy(ctx);
    return 0;
}
