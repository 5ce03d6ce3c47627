/* Layer-op timings (not a test). Usage:
 *   bench_layers              element-wise/pool/norm/loss ops at VGG-S-like shapes
 *   bench_layers bn           the fused batch-norm epilogues at ResNet-20's shapes only, beside a copy and an
 *                             add of the same size (the bandwidth they can reach)
 *   bench_layers bn-cold      the same at 128x16x28x28, 128x32x14x14, 128x16x32x32 on cold data (each run
 *                             the next of 8 buffer sets)
 *   bench_layers MODEL.cfg    per-layer forward/backward times of a model at batch 128
 * Medians (and minima: loaded machines) of 15 runs after 2 warm-ups, wall time around clFinish, device 0
 * (set CLGRAD_DEVICES / POCL_DEVICES to choose). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "model/network.h"
#include "ops/nn.h"

#ifndef REPS
#define REPS 15
#endif

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmpd);
    return v[n / 2];
}

#define TIME(label, bytes, expr)                                                                              \
    do {                                                                                                      \
        double t_[REPS], u_[REPS];                                                                            \
        for (int w_ = 0; w_ < 2; w_++)                                                                        \
            if ((expr) != CLG_OK) {                                                                           \
                fprintf(stderr, "%s failed: %s\n", label, clg_last_error(ctx));                              \
                return 1;                                                                                     \
            }                                                                                                 \
        clFinish(dev->queue);                                                                                 \
        for (int r_ = 0; r_ < REPS; r_++) {                                                                   \
            double t0_ = clg_now_sec(), c0_ = clg_process_cpu_sec();                                          \
            (void)(expr);                                                                                     \
            clFinish(dev->queue);                                                                             \
            t_[r_] = clg_now_sec() - t0_;                                                                     \
            u_[r_] = clg_process_cpu_sec() - c0_;                                                             \
        }                                                                                                     \
        double m_ = median(t_, REPS), cm_ = median(u_, REPS);                                                 \
        printf("%-34s %9.3f ms %8.2f GB/s  (min %.3f ms)  cpu %.3f ms\n", label, m_ * 1e3,                   \
               (double)(bytes) / m_ * 1e-9, t_[0] * 1e3, cm_ * 1e3);                                          \
    } while (0)

/* The fused batch-norm epilogues at ResNet-20's stage shapes (128 x C x H x W):
 * a = x, b = dy / residual, c = y; dx into a buffer of its own. */
/* Writes the same uniform [-0.5, 0.5) values (seed 1) into three buffers of n floats. */
static void fill_uniform(clg_device *dev, size_t n, cl_mem x, cl_mem y, cl_mem z)
{
    float *h = malloc(n * 4);
    if (!h)
        return;
    clg_rng r;
    clg_rng_seed(&r, 1, 1);
    for (size_t i = 0; i < n; i++)
        h[i] = clg_rng_uniform(&r) - 0.5f;
    cl_mem m[3] = {x, y, z};
    for (int i = 0; i < 3; i++)
        clEnqueueWriteBuffer(dev->queue, m[i], CL_TRUE, 0, n * 4, h, 0, NULL, NULL);
    free(h);
}

/* The four fused batch-norm epilogues' labels at 128xCxHxH. */
static void bn_labels(char lab[4][64], const char *pre, int C, int H)
{
    static const char *const what[4] = {"bn+relu fwd", "bn+add+relu fwd", "bn+relu bwd", "bn+add+relu bwd"};
    for (int i = 0; i < 4; i++)
        snprintf(lab[i], 64, "%s%s 128x%dx%dx%d", pre, what[i], C, H, H);
}

/* Eight per-channel parameter buffers of 64 ones (gamma, beta, statistics, their gradients). */
static int bn_params(clg_device *dev, cl_mem pm[8])
{
    float one[64];
    for (int i = 0; i < 64; i++)
        one[i] = 1.0f;
    for (int i = 0; i < 8; i++)
        if (clg_buf_alloc(dev, sizeof one, &pm[i]) != CLG_OK ||
            clEnqueueWriteBuffer(dev->queue, pm[i], CL_TRUE, 0, sizeof one, one, 0, NULL, NULL) != CL_SUCCESS)
            return 1;
    return 0;
}

static int bench_bn_resnet(clg_ctx *ctx, clg_device *dev, cl_mem a, cl_mem b, cl_mem c)
{
    static const int shp[5][2] = {{16, 32}, {32, 16}, {64, 8}, {16, 28}, {32, 14}};
    cl_mem pm[8], e;
    if (bn_params(dev, pm))
        return 1;
    if (clg_buf_alloc(dev, (size_t)128 * 16 * 32 * 32 * 4, &e) != CLG_OK)
        return 1;
    for (int t = 0; t < 5; t++) {
        int C = shp[t][0], H = shp[t][1];
        size_t HW = (size_t)H * H, B = (size_t)128 * C * HW * 4;
        /* the bandwidth yardsticks at this size: copy (read + write), add (2 reads + write) */
        char bw[2][64];
        snprintf(bw[0], sizeof bw[0], "copy 128x%dx%dx%d", C, H, H);
        snprintf(bw[1], sizeof bw[1], "add 128x%dx%dx%d", C, H, H);
        TIME(bw[0], 2 * B, clg_nn_copy(dev, B / 4, a, 0, c, 0));
        TIME(bw[1], 3 * B, clg_nn_add(dev, B / 4, a, 0, b, 0, c, 0));
        char lab[4][64];
        bn_labels(lab, "", C, H);
        TIME(lab[0], 3 * B,
             clg_nn_bn_forward_relu(dev, 128, C, HW, 1e-5f, 0.1f, 1, a, 0, NULL, 0, c, 0, pm[0], pm[1], pm[2], pm[3],
                                    pm[4], pm[5]));
        TIME(lab[1], 4 * B,
             clg_nn_bn_forward_relu(dev, 128, C, HW, 1e-5f, 0.1f, 1, a, 0, b, 0, c, 0, pm[0], pm[1], pm[2], pm[3],
                                    pm[4], pm[5]));
        TIME(lab[2], 7 * B,
             clg_nn_bn_backward_relu(dev, 128, C, HW, a, 0, c, 0, b, 0, pm[4], pm[5], pm[0], pm[1], pm[6], pm[7], e, 0, NULL,
                                     0));
        TIME(lab[3], 8 * B,
             clg_nn_bn_backward_relu(dev, 128, C, HW, a, 0, c, 0, b, 0, pm[4], pm[5], pm[0], NULL, pm[6], pm[7], e, 0, e, 0));
    }
    for (int i = 0; i < 8; i++)
        clg_buf_release(dev, pm[i]);
    clg_buf_release(dev, e);
    return 0;
}

/* The fused batch-norm epilogues on cold data: each run takes the next of
 * K sets of (x, dy, y, dx) buffers (about 200 MiB in all), as a training
 * step meets them (not in the core's caches, pages not in the TLB). */
static int bench_bn_cold(clg_ctx *ctx, clg_device *dev)
{
    enum { K = 8 };
    static const int shp[3][2] = {{16, 28}, {32, 14}, {16, 32}};
    cl_mem pm[8];
    if (bn_params(dev, pm))
        return 1;
    for (int t = 0; t < 3; t++) {
        int C = shp[t][0], H = shp[t][1];
        size_t HW = (size_t)H * H, n = (size_t)128 * C * HW, B = n * 4;
        cl_mem X[K], G[K], Y[K], D[K];
        for (int k = 0; k < K; k++) {
            if (clg_buf_alloc(dev, B, &X[k]) || clg_buf_alloc(dev, B, &G[k]) || clg_buf_alloc(dev, B, &Y[k]) ||
                clg_buf_alloc(dev, B, &D[k]))
                return 1;
            fill_uniform(dev, n, X[k], G[k], Y[k]);
        }
        int s = 0;
        char lab[4][64];
        bn_labels(lab, "cold ", C, H);
        TIME(lab[0], 3 * B,
             (s = (s + 1) % K, clg_nn_bn_forward_relu(dev, 128, C, HW, 1e-5f, 0.1f, 1, X[s], 0, NULL, 0, Y[s], 0, pm[0],
                                                      pm[1], pm[2], pm[3], pm[4], pm[5])));
        TIME(lab[1], 4 * B,
             (s = (s + 1) % K, clg_nn_bn_forward_relu(dev, 128, C, HW, 1e-5f, 0.1f, 1, X[s], 0, G[s], 0, Y[s], 0, pm[0],
                                                      pm[1], pm[2], pm[3], pm[4], pm[5])));
        TIME(lab[2], 5 * B,
             (s = (s + 1) % K, clg_nn_bn_backward_relu(dev, 128, C, HW, X[s], 0, Y[s], 0, G[s], 0, pm[4], pm[5], pm[0],
                                                       pm[1], pm[6], pm[7], D[s], 0, NULL, 0)));
        TIME(lab[3], 6 * B,
             (s = (s + 1) % K, clg_nn_bn_backward_relu(dev, 128, C, HW, X[s], 0, Y[s], 0, G[s], 0, pm[4], pm[5], pm[0],
                                                       NULL, pm[6], pm[7], D[s], 0, D[(s + 1) % K], 0)));
        for (int k = 0; k < K; k++) {
            clg_buf_release(dev, X[k]);
            clg_buf_release(dev, G[k]);
            clg_buf_release(dev, Y[k]);
            clg_buf_release(dev, D[k]);
        }
    }
    for (int i = 0; i < 8; i++)
        clg_buf_release(dev, pm[i]);
    return 0;
}

static int bench_ops(clg_ctx *ctx, clg_device *dev)
{
    const size_t big = (size_t)128 * 32 * 28 * 28;
    cl_mem a, b, c, d;
    if (clg_buf_alloc(dev, big * 4, &a) || clg_buf_alloc(dev, big * 4, &b) || clg_buf_alloc(dev, big * 4, &c) ||
        clg_buf_alloc(dev, big * 4, &d)) {
        fprintf(stderr, "allocation failed: %s\n", clg_last_error(ctx));
        return 1;
    }
    fill_uniform(dev, big, a, b, d);
    printf("shapes: activations 128x32x28x28 (%zu floats); pool2 128x64x14x14\n", big);
    clg_pool_shape s1 = {128, 32, 28, 28, 2, 2, 2, 2, 0, 0}, s2 = {128, 64, 14, 14, 2, 2, 2, 2, 0, 0};
    clg_pool_shape s3 = {128, 32, 28, 28, 3, 3, 2, 2, 1, 1};
    size_t B = big * 4;
    TIME("relu fwd", 2 * B, clg_nn_act_forward(dev, CLG_ACT_RELU, 0, big, a, 0, c, 0));
    TIME("relu bwd", 3 * B, clg_nn_act_backward(dev, CLG_ACT_RELU, 0, big, NULL, 0, a, 0, b, 0, c, 0));
    TIME("sigmoid fwd", 2 * B, clg_nn_act_forward(dev, CLG_ACT_SIGMOID, 0, big, a, 0, c, 0));
    TIME("tanh fwd", 2 * B, clg_nn_act_forward(dev, CLG_ACT_TANH, 0, big, a, 0, c, 0));
    TIME("gelu fwd", 2 * B, clg_nn_act_forward(dev, CLG_ACT_GELU, 0, big, a, 0, c, 0));
    TIME("gelu bwd", 3 * B, clg_nn_act_backward(dev, CLG_ACT_GELU, 0, big, a, 0, a, 0, b, 0, c, 0));
    TIME("add", 3 * B, clg_nn_add(dev, big, a, 0, b, 0, c, 0));
    TIME("dropout p=0.5", 2 * B, clg_nn_dropout(dev, big, 0.5f, 1, 2, 0, a, 0, c, 0));
    TIME("maxpool 2x2 fwd", B + B / 4, clg_nn_pool_forward(dev, 1, &s1, a, 0, c, 0));
    TIME("maxpool 2x2 bwd", 2 * B + B / 4, clg_nn_pool_backward(dev, 1, &s1, a, 0, b, 0, c, 0, 0));
    TIME("maxpool 2x2 fwd (128x64x14x14)", B / 2 + B / 8, clg_nn_pool_forward(dev, 1, &s2, a, 0, c, 0));
    TIME("maxpool 2x2 bwd (128x64x14x14)", B + B / 8, clg_nn_pool_backward(dev, 1, &s2, a, 0, b, 0, c, 0, 0));
    TIME("maxpool 3x3 s2 p1 fwd", B + B / 4, clg_nn_pool_forward(dev, 1, &s3, a, 0, c, 0));
    TIME("maxpool 3x3 s2 p1 bwd", 2 * B + B / 4, clg_nn_pool_backward(dev, 1, &s3, a, 0, b, 0, c, 0, 0));
    TIME("avgpool 2x2 fwd", B + B / 4, clg_nn_pool_forward(dev, 0, &s1, a, 0, c, 0));
    TIME("avgpool 2x2 bwd", B + B / 4, clg_nn_pool_backward(dev, 0, &s1, a, 0, b, 0, c, 0, 0));
    TIME("gap fwd (128x64x7x7)", (size_t)128 * 64 * 49 * 4, clg_nn_gap_forward(dev, 128 * 64, 49, a, 0, c, 0));
    TIME("batchnorm train fwd", 3 * B,
         clg_nn_bn_forward_train(dev, 128, 32, 784, 1e-5f, 0.1f, 1, a, 0, c, 0, b, b, d, d, d, d));
    TIME("batchnorm bwd", 5 * B, clg_nn_bn_backward(dev, 128, 32, 784, a, 0, b, 0, d, d, b, d, d, c, 0));
    TIME("batchnorm infer fwd", 2 * B, clg_nn_bn_forward_infer(dev, 128, 32, 784, 1e-5f, a, 0, c, 0, b, b, d, d));
    if (bench_bn_resnet(ctx, dev, a, b, c) != 0)
        return 1;
    TIME("colsum 128x256 (dense bias grad)", 128 * 256 * 4, clg_nn_colsum(dev, 128, 256, a, 0, c, 0));
    TIME("softmax xent fwd 128x10", 128 * 10 * 8,
         clg_nn_softmax_xent_forward(dev, 128, 10, a, 0, c, 0, d, 0, b, b));
    clg_buf_release(dev, a);
    clg_buf_release(dev, b);
    clg_buf_release(dev, c);
    clg_buf_release(dev, d);
    return 0;
}

static int bench_ops_bn(clg_ctx *ctx, clg_device *dev)
{
    const size_t big = (size_t)128 * 16 * 32 * 32;
    cl_mem a, b, c;
    if (clg_buf_alloc(dev, big * 4, &a) || clg_buf_alloc(dev, big * 4, &b) || clg_buf_alloc(dev, big * 4, &c))
        return 1;
    fill_uniform(dev, big, a, b, c);
    int rc = bench_bn_resnet(ctx, dev, a, b, c);
    clg_buf_release(dev, a);
    clg_buf_release(dev, b);
    clg_buf_release(dev, c);
    return rc;
}

static int bench_model(clg_ctx *ctx, clg_device *dev, const char *path)
{
    const int Bn = 128;
    clg_net *net = NULL;
    clg_replica *r = NULL;
    if (clg_net_load(&ctx->err, path, Bn, &net) != CLG_OK || clg_replica_create(net, dev, 1, &r) != CLG_OK) {
        fprintf(stderr, "%s\n", ctx->err.msg);
        return 1;
    }
    size_t nin = (size_t)Bn * net->in_c * net->in_h * net->in_w;
    cl_mem x, lab;
    if (clg_buf_alloc(dev, nin * 4, &x) || clg_buf_alloc(dev, (size_t)Bn * 4, &lab))
        return 1;
    float *h = malloc(nin * 4);
    clg_rng rng;
    clg_rng_seed(&rng, 2, 1);
    for (size_t i = 0; i < nin; i++)
        h[i] = clg_rng_uniform(&rng);
    int labels[128];
    for (int i = 0; i < Bn; i++)
        labels[i] = i % CLG_MAX(net->classes, 1);
    clEnqueueWriteBuffer(dev->queue, x, CL_TRUE, 0, nin * 4, h, 0, NULL, NULL);
    clEnqueueWriteBuffer(dev->queue, lab, CL_TRUE, 0, sizeof labels, labels, 0, NULL, NULL);
    free(h);
    clg_replica_set_input(r, x, 0);
    clg_replica_set_labels(r, lab, 0, 1.0f / Bn);
    for (int w = 0; w < 2; w++)
        if (clg_replica_forward(r, Bn, 1) != CLG_OK || clg_replica_backward(r, Bn) != CLG_OK) {
            fprintf(stderr, "%s\n", clg_last_error(ctx));
            return 1;
        }
    clFinish(dev->queue);
    int L = r->nlayers;
    double *tf = calloc((size_t)L * REPS, sizeof(double)), *tb = calloc((size_t)L * REPS, sizeof(double));
    for (int rep = 0; rep < REPS; rep++) {
        for (int i = 0; i < L; i++) {
            clg_layer *l = &r->layers[i];
            clg_tensor in[CLG_MAX_INPUTS];
            for (int k = 0; k < l->nin; k++)
                in[k] = l->inputs[k] < 0 ? r->input : r->act[l->inputs[k]];
            double t0 = clg_now_sec();
            if (l->ops->forward(l, dev, in, l->nin, &r->act[i], 1) != CLG_OK)
                return 1;
            clFinish(dev->queue);
            tf[(size_t)i * REPS + rep] = clg_now_sec() - t0;
        }
        for (int i = L - 1; i >= 0; i--) {
            clg_layer *l = &r->layers[i];
            clg_tensor in[CLG_MAX_INPUTS], din[CLG_MAX_INPUTS];
            for (int k = 0; k < l->nin; k++) {
                in[k] = l->inputs[k] < 0 ? r->input : r->act[l->inputs[k]];
                din[k] = l->inputs[k] < 0 ? in[k] : r->dact[l->inputs[k]];
                if (l->inputs[k] < 0)
                    din[k].mem = NULL;
            }
            double t0 = clg_now_sec();
            if (l->ops->backward(l, dev, in, l->nin, &r->act[i], &r->dact[i], din) != CLG_OK)
                return 1;
            clFinish(dev->queue);
            tb[(size_t)i * REPS + rep] = clg_now_sec() - t0;
        }
    }
    printf("%s, batch %d, per layer (median of %d; no optimizer step)\n", path, Bn, REPS);
    double tot = 0;
    for (int i = 0; i < L; i++) {
        double f = median(tf + (size_t)i * REPS, REPS), b = median(tb + (size_t)i * REPS, REPS);
        printf("%-10s %-14s fwd %9.2f ms  bwd %9.2f ms\n", r->layers[i].name, r->layers[i].ops->type, f * 1e3,
               b * 1e3);
        tot += f + b;
    }
    printf("sum of medians %.1f ms/step (%.0f images/s without the optimizer)\n", tot * 1e3, Bn / tot);
    free(tf);
    free(tb);
    clg_buf_release(dev, x);
    clg_buf_release(dev, lab);
    clg_replica_free(r);
    clg_net_free(net);
    return 0;
}

int main(int argc, char **argv)
{
    clg_ctx_params p;
    clg_ctx_params_init(&p);
    clg_ctx *ctx = NULL;
    if (clg_ctx_create(&p, &ctx) != CLG_OK) {
        fprintf(stderr, "%s\n", clg_last_error(NULL));
        return 1;
    }
    clg_device *dev = &ctx->devs[0];
    printf("device: %s\n", dev->info.name);
    int rc = argc > 1 && strcmp(argv[1], "bn") == 0       ? bench_ops_bn(ctx, dev)
             : argc > 1 && strcmp(argv[1], "bn-cold") == 0 ? bench_bn_cold(ctx, dev)
             : argc > 1                                    ? bench_model(ctx, dev, argv[1])
                                                     : bench_ops(ctx, dev);
    clg_ctx_destroy(ctx);
    return rc;
}
