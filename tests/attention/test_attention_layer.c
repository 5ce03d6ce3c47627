/* The [attention] layer built directly (in_shape {N, T, C, 1} with in_seq
 * set): forward and backward, projections included, against a double
 * reference (QKV projection, attention of attn_ref.h, output projection and
 * every gradient), with both algorithms; fresh random inputs and parameters,
 * outputs and gradients poisoned first. Bad configurations are refused with
 * a message naming the problem. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/cfg.h"
#include "model/layer_harness.h"
#include "attn_ref.h"

#define TOL 1e-3 /* fp32 through three chained products and a sum over N T rows */
#define ATOL 1e-2

/* Builds the layer from "k=v k=v" with a sequence input (n, T, C): as
 * clg_layer_create_for_test, plus in_seq[0] = 1 before setup. */
static clg_status make_layer(clg_err *err, const char *keys, const int shp[4], clg_layer *l)
{
    memset(l, 0, sizeof *l);
    l->ops = clg_layer_lookup("attention");
    char text[256];
    snprintf(text, sizeof text, "[attention]\n%s\n", keys);
    for (char *t = text; *t; t++)
        if (*t == ' ')
            *t = '\n';
    clg_cfg *cfg = NULL;
    CLG_TRY(clg_cfg_parse(err, text, "<test>", &cfg));
    snprintf(l->name, sizeof l->name, "attention0");
    l->line = 1;
    l->nin = 1;
    l->inputs[0] = -1;
    memcpy(l->in_shape[0], shp, sizeof l->in_shape[0]);
    l->in_seq[0] = 1;
    clg_status st = l->ops->configure(l, err, cfg, &cfg->sec[0]);
    if (st == CLG_OK)
        st = clg_cfg_check_unused(err, cfg, &cfg->sec[0]);
    if (st == CLG_OK)
        st = l->ops->setup(l, err);
    clg_cfg_free(cfg);
    return st;
}

/* y (M x N) = x (M x K) W^T (N x K) + b, in double */
static void linear(int M, int N, int K, const double *x, const float *W, const float *b, double *y)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = b ? b[n] : 0;
            for (int k = 0; k < K; k++)
                s += x[(size_t)m * K + k] * W[(size_t)n * K + k];
            y[(size_t)m * N + n] = s;
        }
}

/* Backward of linear: dx (M x K) = dy W, dW (N x K) = dy^T x, db = colsum dy. */
static void linear_bwd(int M, int N, int K, const double *x, const float *W, const double *dy, double *dx, double *dW,
                       double *db)
{
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            double s = 0;
            for (int n = 0; n < N; n++)
                s += dy[(size_t)m * N + n] * W[(size_t)n * K + k];
            dx[(size_t)m * K + k] = s;
        }
    for (int n = 0; n < N; n++) {
        db[n] = 0;
        for (int k = 0; k < K; k++)
            dW[(size_t)n * K + k] = 0;
        for (int m = 0; m < M; m++) {
            db[n] += dy[(size_t)m * N + n];
            for (int k = 0; k < K; k++)
                dW[(size_t)n * K + k] += dy[(size_t)m * N + n] * x[(size_t)m * K + k];
        }
    }
}

static uint64_t stream = 100;

/* Layer planned for batch Nplan (in_shape), run on batch N <= Nplan. */
static void run_layer_n(int Nplan, int N, int T, int C, int heads, int causal, const char *algo)
{
    lh_case c;
    lh_ctx(&c, NULL);
    int shp[4] = {Nplan, T, C, 1};
    char keys[128];
    snprintf(keys, sizeof keys, "heads=%d causal=%d algo=%s", heads, causal, algo);
    clg_status st = make_layer(&c.ctx->err, keys, shp, &c.l);
    ck_assert_msg(st == CLG_OK, "create: %s", c.ctx->err.msg);
    ck_assert_int_eq(c.l.out_seq, 1);
    ck_assert_int_eq(c.l.out_shape[1], T);
    ck_assert_int_eq(c.l.out_shape[2], C);
    clg_rng rng;
    tu_rng(&rng, stream++);
    LH_OK(&c, c.l.ops->init(&c.l, c.dev, &rng));
    c.nin = 1;
    c.n = N;
    shp[0] = N;
    memcpy(c.shp[0], shp, sizeof shp);
    c.nx[0] = (size_t)N * T * C;
    c.x[0] = lh_alloc(c.nx[0]);
    tu_fill(c.x[0], c.nx[0], -1.0f, 1.0f, &rng);
    c.xm[0] = tu_upload(c.dev, c.x[0], c.nx[0]);
    c.ny = c.nx[0];
    c.y = lh_alloc(c.ny);
    c.ym = tu_upload(c.dev, NULL, c.ny);
    /* random parameters, biases included (init leaves them 0) */
    for (int i = 0; i < c.l.nparams; i++) {
        c.p[i] = lh_alloc(c.l.params[i].numel);
        tu_fill(c.p[i], c.l.params[i].numel, -0.4f, 0.4f, &rng);
    }
    lh_set_params(&c);
    float *dy = lh_alloc(c.ny);
    tu_fill(dy, c.ny, -1.0f, 1.0f, &rng);
    lh_forward(&c, 1);
    lh_backward(&c, dy, 0);

    int M = N * T, d = C / heads;
    acase ac = {N, T, heads, d, causal};
    double *x = lh_dalloc(c.nx[0]), *qkv = lh_dalloc((size_t)M * 3 * C), *att = lh_dalloc((size_t)M * C);
    double *y = lh_dalloc((size_t)M * C), *lse = lh_dalloc((size_t)N * heads * T), *g = lh_dalloc((size_t)M * C);
    double *datt = lh_dalloc((size_t)M * C), *dqkv = lh_dalloc((size_t)M * 3 * C), *dx = lh_dalloc(c.nx[0]);
    double *dWo = lh_dalloc((size_t)C * C), *dbo = lh_dalloc(C), *dWi = lh_dalloc((size_t)3 * C * C);
    double *dbi = lh_dalloc(3 * C);
    for (size_t i = 0; i < c.nx[0]; i++)
        x[i] = c.x[0][i];
    for (size_t i = 0; i < c.ny; i++)
        g[i] = dy[i];
    linear(M, 3 * C, C, x, c.p[0], c.p[1], qkv);
    /* attention forward, then (with dO unknown yet) the output projection */
    ref_attention(&ac, qkv, NULL, att, lse, NULL);
    linear(M, C, C, att, c.p[2], c.p[3], y);
    linear_bwd(M, C, C, att, c.p[2], g, datt, dWo, dbo);
    ref_attention(&ac, qkv, datt, att, lse, dqkv);
    linear_bwd(M, 3 * C, C, x, c.p[0], dqkv, dx, dWi, dbi);
    char what[160];
    snprintf(what, sizeof what, "N=%d T=%d C=%d heads=%d causal=%d algo=%s", N, T, C, heads, causal, algo);
    char w2[200];
    snprintf(w2, sizeof w2, "%s: forward", what);
    LH_CLOSE(c.y, y, c.ny, ATOL, TOL, w2);
    snprintf(w2, sizeof w2, "%s: dx", what);
    LH_CLOSE(c.dx[0], dx, c.nx[0], ATOL, TOL, w2);
    snprintf(w2, sizeof w2, "%s: qkv_weight grad", what);
    LH_CLOSE(c.g[0], dWi, (size_t)3 * C * C, ATOL, TOL, w2);
    snprintf(w2, sizeof w2, "%s: qkv_bias grad", what);
    LH_CLOSE(c.g[1], dbi, (size_t)3 * C, ATOL, TOL, w2);
    snprintf(w2, sizeof w2, "%s: out_weight grad", what);
    LH_CLOSE(c.g[2], dWo, (size_t)C * C, ATOL, TOL, w2);
    snprintf(w2, sizeof w2, "%s: out_bias grad", what);
    LH_CLOSE(c.g[3], dbo, (size_t)C, ATOL, TOL, w2);
    double *all[] = {x, qkv, att, y, lse, g, datt, dqkv, dx, dWo, dbo, dWi, dbi};
    for (size_t i = 0; i < CLG_ARRAY_LEN(all); i++)
        free(all[i]);
    free(dy);
    lh_free(&c);
}

static void run_layer(int N, int T, int C, int heads, int causal, const char *algo)
{
    run_layer_n(N, N, T, C, heads, causal, algo);
}

START_TEST(test_layer_fused)
{
    run_layer(2, 7, 32, 2, 1, "fused");
    run_layer(2, 33, 64, 4, 1, "fused");
    run_layer(1, 20, 48, 3, 0, "fused");
}
END_TEST

START_TEST(test_layer_gemm)
{
    run_layer(2, 7, 32, 2, 1, "gemm");
    run_layer(2, 33, 64, 4, 1, "gemm");
    run_layer(1, 1, 32, 1, 1, "auto");
    /* a batch smaller than planned (the last batch, a device's share) */
    run_layer_n(3, 2, 10, 32, 2, 1, "gemm");
    run_layer_n(3, 1, 10, 32, 2, 1, "fused");
}
END_TEST

START_TEST(test_layer_errors)
{
    clg_err err;
    memset(&err, 0, sizeof err);
    clg_layer l;
    int shp[4] = {2, 8, 30, 1};
    ck_assert_int_eq(make_layer(&err, "heads=4", shp, &l), CLG_ERR_SHAPE);
    ck_assert_msg(strstr(err.msg, "heads = 4 does not divide the width C = 30"), "%s", err.msg);
    clg_layer_free(&l, NULL);
    int shp2[4] = {2, 8, 32, 1};
    /* dropout with the fused kernels: accepted (their CPU variant has it; others refuse at run time) */
    ck_assert_int_eq(make_layer(&err, "heads=2 dropout=0.1 algo=fused", shp2, &l), CLG_OK);
    clg_layer_free(&l, NULL);
    ck_assert_int_eq(make_layer(&err, "heads=2 dropout=0.1", shp2, &l), CLG_OK); /* auto: gemm */
    clg_layer_free(&l, NULL);
    ck_assert_int_ne(make_layer(&err, "heads=2 algo=winograd", shp, &l), CLG_OK);
    ck_assert_msg(strstr(err.msg, "algo"), "%s", err.msg);
    clg_layer_free(&l, NULL);
    /* not a sequence: refused */
    const int img[1][4] = {{2, 8, 30, 1}};
    ck_assert_int_eq(clg_layer_create_for_test(&err, "attention", "heads=2", 1, img, &l), CLG_ERR_SHAPE);
    ck_assert_msg(strstr(err.msg, "needs a sequence input"), "%s", err.msg);
    clg_layer_free(&l, NULL);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_layer_fused, test_layer_gemm, test_layer_errors};
    return tu_run_tests("attention-layer", 300, tests, 3);
}
