/* The fused batch-norm epilogues of the fusion pass (src/model/fuse.c):
 * y = relu(bn(x)) and y = relu(bn(x) + r), training (batch statistics) and
 * inference (running statistics), forward and backward (dx, dgamma, dbeta
 * and the residual's gradient dr) against double-precision C references;
 * outputs and gradients poisoned, fresh random inputs, plane sizes that take
 * each vector width of the partial-sum kernels (HW % 8, % 4, odd), in the
 * row forms (option bn_rows, the CPU default: the relu mask of the backward
 * recomputed from x) and the strided forms. Then a network with both
 * patterns trains the same with the pass on and off, and one whose 2x2 max
 * pools fold the relu derivative of the convolution before them (option
 * relu_pool_fold) gives the same gradients bit for bit. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "layer_harness.h"
#include "model/network.h"

#define ATOL 1e-3

/* One case: batch N x C x H x W, res: with a residual input; rows: the
 * option bn_rows (0 auto, 1 off: the strided forms, 2 on). */
static void fused_case(int N, int C, int H, int W, int res, unsigned rows)
{
    lh_case c;
    lh_ctx(&c, NULL);
    c.ctx->opts.bn_rows = rows;
    const int shp[1][4] = {{N, C, H, W}};
    const double eps = 1e-4;
    lh_make(&c, "batchnorm", "eps=1e-4 momentum=0.2", 1, shp, N, -1, 3, 900 + (uint64_t)(C * 2 + res));
    ck_assert(clg_layer_batchnorm_fusable(&c.l));
    clg_layer_batchnorm_fuse_relu(&c.l);
    ck_assert(!clg_layer_batchnorm_fusable(&c.l));
    int HW = H * W;
    clg_rng rng;
    tu_rng(&rng, 901 + (uint64_t)C);
    if (res) { /* the residual: a second input of the same shape, as the pass sets it */
        c.nin = 2;
        c.l.nin = 2;
        c.l.inputs[1] = 0;
        memcpy(c.l.in_shape[1], c.l.in_shape[0], sizeof c.l.in_shape[1]);
        memcpy(c.shp[1], c.shp[0], sizeof c.shp[1]);
        c.nx[1] = c.nx[0];
        c.x[1] = lh_alloc(c.nx[1]);
        tu_fill(c.x[1], c.nx[1], -1.5f, 1.5f, &rng);
        c.xm[1] = tu_upload(c.dev, c.x[1], c.nx[1]);
    }
    tu_fill(c.p[0], (size_t)C, 0.5f, 1.5f, &rng);
    tu_fill(c.p[1], (size_t)C, -0.5f, 0.5f, &rng);
    tu_fill(c.p[2], (size_t)C, -0.2f, 0.2f, &rng);
    tu_fill(c.p[3], (size_t)C, 0.5f, 2.0f, &rng);
    lh_set_params(&c);
    const float *r = res ? c.x[1] : NULL;

    /* training forward */
    lh_forward(&c, 1);
    double *y = lh_dalloc(c.ny), *mean = lh_dalloc((size_t)C), *var = lh_dalloc((size_t)C);
    tu_bn_ref_train(c.x[0], r, N, C, HW, c.p[0], c.p[1], eps, 1, y, mean, var);
    LH_CLOSE(c.y, y, c.ny, ATOL, 2e-4, "fused batchnorm train forward");
    size_t zeros = 0;
    for (size_t k = 0; k < c.ny; k++)
        zeros += c.y[k] == 0.0f;
    ck_assert_msg(zeros > c.ny / 10 && zeros < c.ny * 9 / 10, "relu cut %zu of %zu: the case tests no mask", zeros,
                  c.ny);
    float *rm = lh_alloc((size_t)C), *rv = lh_alloc((size_t)C);
    tu_download(c.dev, c.l.params[2].value, rm, (size_t)C);
    tu_download(c.dev, c.l.params[3].value, rv, (size_t)C);
    double *erm = lh_dalloc((size_t)C), *erv = lh_dalloc((size_t)C);
    tu_bn_ref_running(c.p[2], c.p[3], mean, var, C, (double)N * HW, 0.2, erm, erv);
    LH_CLOSE(rm, erm, (size_t)C, 1e-4, 1e-4, "running_mean");
    LH_CLOSE(rv, erv, (size_t)C, 1e-4, 1e-4, "running_var");

    /* backward: g = dy where the (device's) output is > 0 */
    clg_rng rd;
    tu_rng(&rd, 902 + (uint64_t)C);
    float *dy = lh_alloc(c.ny);
    tu_fill(dy, c.ny, -1, 1, &rd);
    float *yout = lh_alloc(c.ny);
    memcpy(yout, c.y, c.ny * sizeof(float));
    lh_backward(&c, dy, 0);
    double *g = lh_dalloc(c.ny), *dg = lh_dalloc((size_t)C), *db = lh_dalloc((size_t)C), *dx = lh_dalloc(c.ny);
    for (size_t k = 0; k < c.ny; k++)
        g[k] = yout[k] > 0 ? dy[k] : 0.0;
    tu_bn_ref_backward(c.x[0], g, N, C, HW, c.p[0], mean, var, eps, dg, db, dx);
    LH_CLOSE(c.g[0], dg, (size_t)C, ATOL, 2e-3, "fused batchnorm dgamma");
    LH_CLOSE(c.g[1], db, (size_t)C, ATOL, 2e-3, "fused batchnorm dbeta");
    LH_CLOSE(c.dx[0], dx, c.ny, ATOL, 5e-3, "fused batchnorm dx");
    if (res) /* the residual's gradient is the masked dy itself */
        for (size_t k = 0; k < c.ny; k++)
            ck_assert_msg((double)c.dx[1][k] == g[k], "dr[%zu] = %g, expected %g", k, c.dx[1][k], g[k]);
    if (res) { /* dx without dr: the mask from y */
        lh_backward(&c, dy, 2u);
        LH_CLOSE(c.dx[0], dx, c.ny, ATOL, 5e-3, "fused batchnorm dx (no dr)");
    }
    /* skipped input gradients: parameter gradients still right */
    lh_backward(&c, dy, res ? 3u : 1u);
    LH_CLOSE(c.g[0], dg, (size_t)C, ATOL, 2e-3, "fused batchnorm dgamma (no dx)");

    /* inference: the running statistics */
    lh_forward(&c, 0);
    tu_bn_ref_infer(c.x[0], r, N, C, HW, c.p[0], c.p[1], rm, rv, eps, 1, y);
    LH_CLOSE(c.y, y, c.ny, ATOL, 2e-4, "fused batchnorm inference forward");
    free(y);
    free(mean);
    free(var);
    free(rm);
    free(rv);
    free(erm);
    free(erv);
    free(dy);
    free(yout);
    free(g);
    free(dg);
    free(db);
    free(dx);
    lh_free(&c);
}

START_TEST(relu_vec8)
{
    fused_case(3, 5, 4, 6, 0, 0);
    fused_case(3, 5, 4, 6, 0, 1);
    /* a ResNet-20 stage-1 plane at batch 32 (0.5M values): the backward's
     * relu mask, recomputed from x by the row forms, matches the forward's
     * y > 0 on every one (one miss is an error of order 1 in dx) */
    fused_case(32, 16, 32, 32, 0, 0);
}
END_TEST
START_TEST(relu_vec4_odd_c) { fused_case(2, 7, 3, 4, 0, 0); }
END_TEST
START_TEST(relu_odd_plane)
{
    fused_case(3, 3, 5, 7, 0, 0);
    fused_case(5, 3, 5, 5, 0, 2);
}
END_TEST
START_TEST(add_relu_vec8) { fused_case(2, 4, 8, 8, 1, 0); }
END_TEST
START_TEST(add_relu_vec4) { fused_case(3, 6, 2, 6, 1, 0); }
END_TEST
START_TEST(add_relu_odd_plane)
{
    fused_case(4, 3, 3, 3, 1, 0);
    fused_case(4, 3, 3, 3, 1, 1);
}
END_TEST

/* ---- the pass in a network: the same training with it on and off ---- */

static const char *NET = "[net]\nchannels=2\nheight=6\nwidth=5\nclasses=3\nbatch=4\noptimizer=sgd\n"
                         "learning_rate=0.05\nmomentum=0.9\n"
                         "[conv]\nname=c0\nfilters=4\nsize=3\npad=1\nbias=0\n"
                         "[batchnorm]\nname=b0\n[activation]\nname=r0\ntype=relu\n"
                         "[conv]\nname=c1\nfilters=4\nsize=3\npad=1\nbias=0\n"
                         "[batchnorm]\nname=b1\n[add]\nname=a1\ninput=b1,r0\n[activation]\nname=r1\ntype=relu\n"
                         "[conv]\nname=c2\nfilters=4\nsize=1\nbias=0\n"
                         "[batchnorm]\nname=b2\n[add]\nname=a2\ninput=r1,b2\n[activation]\nname=r2\ntype=relu\n"
                         "[gap]\n[dense]\nunits=3\n[softmax]\n";

/* One training forward + backward of replica r on x, lab (B samples of n
 * values): the loss and every trainable gradient (concatenated). */
static void train_grads(clg_ctx *ctx, clg_replica *r, const float *x, const int *lab, int B, int n, float *loss,
                        float **grads, size_t *ng)
{
    clg_device *dev = &ctx->devs[0];
    cl_mem xm = tu_upload(dev, x, (size_t)B * n), lm;
    ck_assert_int_eq(clg_buf_alloc(dev, (size_t)B * sizeof(int), &lm), CLG_OK);
    ck_assert_int_eq(clEnqueueWriteBuffer(dev->queue, lm, CL_TRUE, 0, (size_t)B * sizeof(int), lab, 0, NULL, NULL),
                     CL_SUCCESS);
    clg_replica_set_input(r, xm, 0);
    clg_replica_set_labels(r, lm, 0, 1.0f / B);
    ck_assert_msg(clg_replica_forward(r, B, 1) == CLG_OK, "%s", clg_last_error(ctx));
    ck_assert_msg(clg_replica_backward(r, B) == CLG_OK, "%s", clg_last_error(ctx));
    float res[2];
    tu_download(dev, r->layers[r->nlayers - 1].loss.result, res, 2);
    *loss = res[0] / B;
    clg_param_ref *refs = NULL;
    int np = 0;
    ck_assert_int_eq(clg_replica_params(r, 1, &refs, &np), CLG_OK);
    *ng = 0;
    for (int i = 0; i < np; i++)
        *ng += refs[i].param->numel;
    *grads = lh_alloc(*ng);
    size_t at = 0;
    for (int i = 0; i < np; i++) {
        tu_download(dev, refs[i].param->grad, *grads + at, refs[i].param->numel);
        at += refs[i].param->numel;
    }
    free(refs);
    clg_buf_release(dev, xm);
    clg_buf_release(dev, lm);
}

/* One training forward + backward and an inference forward of NET with the
 * pass on or off: loss, every trainable gradient (concatenated), the
 * inference output. The same seed gives the same weights. */
static void run_net(clg_ctx *ctx, int fuse, const float *x, const int *lab, float *loss, float **grads, size_t *ng,
                    float **out)
{
    clg_device *dev = &ctx->devs[0];
    ctx->opts.bn_fuse = fuse;
    clg_net *net = NULL;
    ck_assert_msg(clg_net_build(&ctx->err, NET, "bnfuse.cfg", 0, &net) == CLG_OK, "%s", ctx->err.msg);
    clg_replica *r = NULL;
    ck_assert_msg(clg_replica_create(net, dev, 5, &r) == CLG_OK, "%s", clg_last_error(ctx));
    /* r0 into b0; a1, r1 into b1; a2, r2 into b2 (its residual r1 = b1 now) */
    static const int into[] = {0, 0, 2, 0, 0, 5, 5, 0, 0, 9, 9, 0, 0, 0};
    for (int i = 0; i < r->nlayers; i++)
        ck_assert_msg(r->layers[i].fused_into == (fuse ? into[i] : 0), "layer %d fused into %d", i,
                      r->layers[i].fused_into);
    if (fuse)
        ck_assert(r->layers[8].nin == 2 && r->layers[8].inputs[1] == 4 && r->layers[4].nin == 2 &&
                  r->layers[4].inputs[1] == 1 && r->layers[7].inputs[0] == 4);
    int B = 4;
    train_grads(ctx, r, x, lab, B, 2 * 6 * 5, loss, grads, ng);
    ck_assert_msg(clg_replica_forward(r, B, 0) == CLG_OK, "%s", clg_last_error(ctx));
    const clg_tensor *o = &r->act[r->nlayers - 2]; /* the dense layer's logits */
    *out = lh_alloc((size_t)B * 3);
    ck_assert_int_eq(clEnqueueReadBuffer(dev->queue, o->mem, CL_TRUE, o->off * sizeof(float),
                                         (size_t)B * 3 * sizeof(float), *out, 0, NULL, NULL),
                     CL_SUCCESS);
    clg_replica_free(r);
    clg_net_free(net);
}

START_TEST(net_on_off)
{
    clg_ctx *ctx = tu_ctx("0");
    int B = 4, n = 2 * 6 * 5, lab[4];
    float *x = lh_alloc((size_t)B * n);
    clg_rng rng;
    tu_rng(&rng, 950);
    tu_fill(x, (size_t)B * n, -1, 1, &rng);
    for (int b = 0; b < B; b++)
        lab[b] = (int)(clg_rng_u32(&rng) % 3);
    float l1, l0, *g1, *g0, *o1, *o0;
    size_t n1, n0;
    run_net(ctx, 1, x, lab, &l1, &g1, &n1, &o1);
    run_net(ctx, 0, x, lab, &l0, &g0, &n0, &o0);
    ck_assert_uint_eq(n1, n0);
    ck_assert_msg(fabsf(l1 - l0) <= 1e-5f * fabsf(l0) + 1e-6f, "loss %.8g fused, %.8g not", l1, l0);
    double *ref = lh_dalloc(n0 > 12 ? n0 : 12);
    for (size_t k = 0; k < n0; k++)
        ref[k] = g0[k];
    LH_CLOSE(g1, ref, n0, 1e-3, 1e-3, "gradients fused vs not");
    for (size_t k = 0; k < 12; k++)
        ref[k] = o0[k];
    LH_CLOSE(o1, ref, 12, 1e-4, 1e-5, "inference logits fused vs not");
    free(ref);
    free(x);
    free(g1);
    free(g0);
    free(o1);
    free(o0);
    clg_ctx_destroy(ctx);
}
END_TEST

/* ---- option relu_pool_fold: a relu convolution's derivative applied by the 2x2 max pool after it ---- */

/* 12x12 -> pool (6x6: the float4 backward) -> 6x6 -> pool (3x3: odd, the scalar one); c2's pool has
 * padding and overlapping windows (no fold); c3 feeds two 2x2 pools whose sum goes on (no fold: its
 * gradient is a sum) */
static const char *PNET = "[net]\nchannels=2\nheight=12\nwidth=12\nclasses=3\nbatch=6\noptimizer=sgd\n"
                          "learning_rate=0.05\n"
                          "[conv]\nname=c0\nfilters=4\nsize=3\npad=1\nactivation=relu\n[maxpool]\nname=p0\nsize=2\n"
                          "[conv]\nname=c1\nfilters=4\nsize=3\npad=1\nactivation=relu\n[maxpool]\nname=p1\nsize=2\n"
                          "[conv]\nname=c2\nfilters=4\nsize=1\nactivation=relu\n"
                          "[maxpool]\nname=p2\nsize=2\nstride=1\npad=1\n"
                          "[conv]\nname=c3\nfilters=4\nsize=1\nactivation=relu\n"
                          "[maxpool]\nname=p3\nsize=2\n[maxpool]\nname=p4\ninput=c3\nsize=2\n"
                          "[add]\nname=a3\ninput=p3,p4\n"
                          "[dense]\nunits=3\n[softmax]\n";

START_TEST(relu_pool_on_off)
{
    clg_ctx *ctx = tu_ctx("0");
    int B = 6, n = 2 * 12 * 12, lab[6];
    float *x = lh_alloc((size_t)B * n), loss[2], *g[2];
    size_t ng[2];
    clg_rng rng;
    tu_rng(&rng, 960);
    tu_fill(x, (size_t)B * n, -1, 1, &rng);
    for (int b = 0; b < B; b++)
        lab[b] = (int)(clg_rng_u32(&rng) % 3);
    for (int fold = 0; fold < 2; fold++) {
        ctx->opts.relu_pool_fold = (unsigned)fold;
        clg_net *net = NULL;
        ck_assert_msg(clg_net_build(&ctx->err, PNET, "relufold.cfg", 0, &net) == CLG_OK, "%s", ctx->err.msg);
        clg_replica *r = NULL;
        ck_assert_msg(clg_replica_create(net, &ctx->devs[0], 7, &r) == CLG_OK, "%s", clg_last_error(ctx));
        /* p0 and p1 fold their convolution's relu, p2, p3 and p4 do not */
        for (int i = 0; i < r->nlayers; i++)
            if (r->layers[i].ops == &clg_layer_maxpool_ops)
                ck_assert_msg(clg_layer_pool_relu(&r->layers[i]) == (fold && i <= 3), "layer %d relu %d", i,
                              clg_layer_pool_relu(&r->layers[i]));
        train_grads(ctx, r, x, lab, B, n, &loss[fold], &g[fold], &ng[fold]);
        clg_replica_free(r);
        clg_net_free(net);
    }
    ck_assert_uint_eq(ng[0], ng[1]);
    ck_assert_msg(loss[0] == loss[1], "loss %.9g folded, %.9g not", loss[1], loss[0]);
    size_t zero = 0;
    for (size_t k = 0; k < ng[0]; k++) {
        ck_assert_msg(g[1][k] == g[0][k], "gradient %zu: %.9g folded, %.9g not", k, g[1][k], g[0][k]);
        zero += g[0][k] == 0.0f;
    }
    ck_assert_msg(zero < ng[0] / 2, "%zu of %zu gradients zero", zero, ng[0]);
    free(x);
    free(g[0]);
    free(g[1]);
    clg_ctx_destroy(ctx);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {relu_vec8,     relu_vec4_odd_c,    relu_odd_plane, add_relu_vec8,
                            add_relu_vec4, add_relu_odd_plane, net_on_off,     relu_pool_on_off};
    return tu_run_tests("bnfuse", 60, tests, (int)(sizeof tests / sizeof tests[0]));
}
