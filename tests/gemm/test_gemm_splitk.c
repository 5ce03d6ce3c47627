/* Split-K GEMM (src/ops/gemm_splitk.c, cl/gemm_splitk.cl) against a
 * double-precision host reference: fresh random inputs in [-1, 1], C
 * poisoned (NaN) where beta == 0 and surrounded by sentinels that must stay,
 * offsets, padded leading dimensions, batch strides, every transpose, S = 1
 * (direct), K not a multiple of the chunk, S beyond the chunks K holds,
 * beta 0 / 1 / other, bias and ReLU; determinism (two runs bitwise equal);
 * the route through clg_gemm (option gemm_splitk). CLGRAD_TEST_TINY=1
 * runs only tiny shapes (for oclgrind). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gemm.h"
#include "ops/gemm_splitk.h"
#include "gemm_testutil.h"

#define TOL 1e-4 /* |got - ref| / (|ref| + 1), inputs in [-1, 1], K up to a few thousand */
#define SENTINEL 1234.5f

TG_FIXTURE()
static uint64_t stream = 300;

typedef struct scase {
    int ta, tb, M, N, K, batch, S;
    int shareA; /* strideA 0: one A for every batch entry */
    float alpha, beta;
    int bias_mode, relu;
    int via_gemm; /* through clg_gemm (the option must route it) instead of clg_gemm_splitk */
    double tol;   /* 0: TOL */
    int kern;     /* 0: the plan's kernel, 1: gemm_splitk_part, 2: gemm_splitk_dot (ta 0, tb 1) */
} scase;

static scase sbase(int ta, int tb, int M, int N, int K, int S)
{
    scase c;
    memset(&c, 0, sizeof c);
    c.ta = ta;
    c.tb = tb;
    c.M = M;
    c.N = N;
    c.K = K;
    c.S = S;
    c.batch = 1;
    c.alpha = 1.0f;
    return c;
}

/* Runs c; returns the max error and, when out is not NULL, the whole C
 * buffer after the run (*nout floats, malloc'd). */
static double run_case(const scase *c, float **out, size_t *nout)
{
    clg_rng r;
    tu_rng(&r, stream++);
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.ta = c->ta;
    g.tb = c->tb;
    g.M = c->M;
    g.N = c->N;
    g.K = c->K;
    g.alpha = c->alpha;
    g.beta = c->beta;
    tg_layout(&g, (const int[]){5, 2, 3}, (const int[]){1, 2, 3}, (const int[]){7, 1, 2}, c->shareA);
    g.batch = c->batch;
    g.offBias = 1;
    g.bias_mode = (clg_bias_mode)c->bias_mode;
    g.relu = c->relu;
    g.backend = CLG_GEMM_OWN;
    tg_case t;
    tg_case_make(&t, dev, &g, SENTINEL, &r);
    cl_event e0 = NULL, e1 = NULL;
    clg_splitk_plan pl;
    clg_gemm_splitk_plan_for(dev, &t.g, c->S, &pl);
    if (c->kern)
        pl.dot = c->kern == 2;
    clg_status st = c->via_gemm ? clg_gemm_run(dev, &t.g, CLG_GEMM_OWN, NULL, &e0, &e1)
                                : clg_gemm_splitk_plan_run(dev, &t.g, &pl, &e0, &e1);
    if (st != CLG_OK)
        fprintf(stderr, "split-K failed: %s\n", clg_last_error(ctx));
    ck_assert_int_eq(st, CLG_OK);
    ck_assert_ptr_nonnull(e1);
    ck_assert_int_eq(clWaitForEvents(1, &e1), CL_SUCCESS);
    if (e0)
        clReleaseEvent(e0);
    clReleaseEvent(e1);
    double worst = tg_case_check(&t, dev, c->tol > 0 ? c->tol : TOL, "split-K");
    if (out) {
        *out = t.C;
        *nout = t.nC;
        t.C = NULL;
    }
    tg_case_free(&t, dev);
    return worst;
}

static void check1(const scase *c, const char *what)
{
    double e = run_case(c, NULL, NULL);
    if (!(e <= TOL))
        fprintf(stderr,
                "FAIL %s ta=%d tb=%d M=%d N=%d K=%d batch=%d S=%d kern=%d alpha=%g beta=%g bias=%d relu=%d: err %g\n",
                what, c->ta, c->tb, c->M, c->N, c->K, c->batch, c->S, c->kern, (double)c->alpha, (double)c->beta,
                c->bias_mode, c->relu, e);
    ck_assert(e <= (c->tol > 0 ? c->tol : TOL));
}

/* c with its plan's kernel; A * B^T cases also with each kernel forced. */
static void check(const scase *c, const char *what)
{
    check1(c, what);
    if (c->via_gemm || c->kern || c->ta || !c->tb)
        return;
    for (int k = 1; k <= 2; k++) {
        scase d = *c;
        d.kern = k;
        check1(&d, what);
    }
}

/* Plans: S bounded by the workspace and at least 1; chunks of whole stages;
 * the auto plan splits a long-K, small output. */
START_TEST(test_plan)
{
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.M = 32;
    g.N = 9;
    g.K = 100352;
    clg_splitk_plan pl;
    clg_gemm_splitk_plan_for(dev, &g, 0, &pl);
    ck_assert_int_ge(pl.S, 2);
    ck_assert_int_ge((long)pl.S * pl.kchunk, g.K);
    ck_assert_int_eq(pl.kchunk % 16, 0);
    clg_gemm_splitk_plan_for(dev, &g, 1, &pl);
    ck_assert_int_eq(pl.S, 1);
    ck_assert_int_eq(pl.kchunk, g.K);
    clg_gemm_splitk_plan_for(dev, &g, 100000, &pl);
    ck_assert_int_le(pl.S, CLG_SPLITK_MAX_S);
    g.M = g.N = 2048; /* 16 MiB per partial: the workspace bound caps S */
    clg_gemm_splitk_plan_for(dev, &g, 64, &pl);
    ck_assert_int_le((size_t)pl.S * 2048 * 2048 * sizeof(float), CLG_SPLITK_MAX_WS_BYTES);
    ck_assert_int_ge(pl.S, 1);
}
END_TEST

/* Every transpose; the callers' are (0, 1) (conv weight gradient) and (1, 0) (dense). */
START_TEST(test_transposes)
{
    static const int S[] = {1, 3, 0};
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < CLG_ARRAY_LEN(S); i++) {
            scase c = sbase(t >> 1, t & 1, 37, 45, 1000 + 7 * t, S[i]); /* K not a multiple of the chunk */
            c.beta = i == 1 ? 1.0f : 0.0f;
            c.alpha = t == 2 ? -0.5f : 1.0f;
            check(&c, "transposes");
        }
}
END_TEST

/* S beyond the chunks K holds (empty chunks add zeros), S = 1, K < one stage, K = 0. */
START_TEST(test_chunks)
{
    scase c = sbase(0, 1, 20, 33, 40, 8); /* 16-deep chunks: 3 hold K, 5 are empty */
    check(&c, "S > K chunks");
    c = sbase(1, 0, 20, 33, 5, 4);
    c.beta = 0.5f;
    check(&c, "K < stage");
    c = sbase(0, 1, 65, 70, 300, 1);
    c.bias_mode = CLG_BIAS_COL;
    check(&c, "S = 1");
    c = sbase(0, 0, 9, 11, 0, 3);
    c.beta = 0.25f;
    c.bias_mode = CLG_BIAS_ROW;
    check(&c, "K = 0");
    c = sbase(0, 1, 1, 1, 4097, 0);
    check(&c, "1 x 1");
}
END_TEST

/* Batch (with a shared A), beta, bias and ReLU through the reduction. */
START_TEST(test_epilogue)
{
    for (int bm = 0; bm < 3; bm++)
        for (int relu = 0; relu < 2; relu++) {
            scase c = sbase(bm == 1, 1, 19, 26, 777, 5);
            c.batch = 3;
            c.shareA = relu;
            c.alpha = 1.5f;
            c.beta = relu ? 0.0f : -0.5f;
            c.bias_mode = bm;
            c.relu = relu;
            check(&c, "epilogue");
        }
}
END_TEST

/* A weight-gradient-like shape, auto plan: two runs bitwise equal. */
START_TEST(test_deterministic)
{
    scase c = sbase(0, 1, 32, 72, 30000, 0);
    /* float sums of 30000 products (sums up to ~100 in magnitude) against
     * the double reference: eps * sqrt(K) * |sum| ~ 1e-3 */
    c.tol = 2e-3;
    float *r1 = NULL, *r2 = NULL;
    size_t n1 = 0, n2 = 0;
    stream = 900;
    ck_assert(run_case(&c, &r1, &n1) <= c.tol);
    stream = 900; /* the same inputs */
    ck_assert(run_case(&c, &r2, &n2) <= c.tol);
    ck_assert_uint_eq(n1, n2);
    ck_assert_int_eq(memcmp(r1, r2, sizeof(float) * n1), 0);
    free(r1);
    free(r2);
}
END_TEST

/* clg_gemm routes through split-K where the option says so. */
START_TEST(test_route)
{
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.tb = 1;
    g.M = 32;
    g.N = 9;
    g.K = 100352;
    g.lda = g.ldb = g.K;
    g.ldc = g.N;
    char d[128];
    ck_assert_int_eq(clg_ctx_option_set(ctx, "gemm_splitk", "1"), CLG_OK);
    clg_gemm_own_describe(dev, &g, d, sizeof d);
    ck_assert_ptr_nonnull(strstr(d, "split-K"));
    scase c = sbase(0, 1, 24, 40, 2000, 0);
    c.via_gemm = 1;
    c.beta = 1.0f;
    check(&c, "via clg_gemm");
    ck_assert_int_eq(clg_ctx_option_set(ctx, "gemm_splitk", "0"), CLG_OK);
    clg_gemm_own_describe(dev, &g, d, sizeof d);
    ck_assert_ptr_null(strstr(d, "split-K"));
    check(&c, "gemm_splitk=0");
    ck_assert_int_eq(clg_ctx_option_set(ctx, "gemm_splitk", "auto"), CLG_OK);
    /* auto: a long-K weight gradient with a small output on GPUs; on CPUs
     * only A * B^T with 4096-65536 outputs */
    g.N = 288;
    int cpu = (dev->info.type & CLG_DEVICE_CPU) != 0;
    if (cpu || dev->info.compute_units >= 16) /* a GPU with a few units: too few tiles to matter */
        ck_assert_int_eq(clg_gemm_splitk_wanted(dev, &g), 1);
    g.K = 256; /* short K */
    ck_assert_int_eq(clg_gemm_splitk_wanted(dev, &g), 0);
    g.K = 100352;
    if (cpu) {
        g.N = 9;
        ck_assert_int_eq(clg_gemm_splitk_wanted(dev, &g), 0);
        g.N = 288;
        g.ta = 1;
        g.tb = 0;
        ck_assert_int_eq(clg_gemm_splitk_wanted(dev, &g), 0);
    }
    g.gelu = 1; /* never for a GELU epilogue */
    ck_assert_int_eq(clg_gemm_splitk_wanted(dev, &g), 0);
}
END_TEST

START_TEST(test_errors)
{
    cl_mem m = tu_upload(dev, NULL, 64);
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.M = g.N = g.K = 4;
    g.A = g.B = g.C = m;
    g.lda = g.ldb = g.ldc = 4;
    ck_assert_int_eq(clg_gemm_splitk(dev, &g, 2, NULL, NULL), CLG_OK);
    ck_assert_int_eq(clFinish(dev->queue), CL_SUCCESS);
    g.lda = 3;
    ck_assert_int_eq(clg_gemm_splitk(dev, &g, 2, NULL, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "leading dimension"));
    g.lda = 4;
    g.B = NULL;
    ck_assert_int_eq(clg_gemm_splitk(dev, &g, 2, NULL, NULL), CLG_ERR_INVALID_ARG);
    g.B = m;
    g.bias_mode = CLG_BIAS_ROW;
    ck_assert_int_eq(clg_gemm_splitk(dev, &g, 2, NULL, NULL), CLG_ERR_INVALID_ARG);
    g.bias_mode = CLG_BIAS_NONE;
    g.gelu = 1;
    ck_assert_int_eq(clg_gemm_splitk(dev, &g, 2, NULL, NULL), CLG_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "GELU"));
    g.gelu = 0;
    /* plans: the dot kernel for A * B only, chunks that do not cover K */
    clg_splitk_plan pl;
    clg_gemm_splitk_plan_for(dev, &g, 2, &pl);
    pl.dot = 1;
    ck_assert_int_eq(clg_gemm_splitk_plan_run(dev, &g, &pl, NULL, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "dot"));
    pl.dot = 0;
    pl.kchunk = 1;
    ck_assert_int_eq(clg_gemm_splitk_plan_run(dev, &g, &pl, NULL, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "cover"));
    clg_buf_release(dev, m);
}
END_TEST

/* Tiny shapes for oclgrind: direct, split with empty chunks, every transpose, epilogue. */
START_TEST(test_tiny)
{
    for (int t = 0; t < 4; t++) {
        scase c = sbase(t >> 1, t & 1, 5 + t, 7, 37, t == 0 ? 1 : 3);
        c.beta = t == 1 ? 0.5f : 0.0f;
        c.bias_mode = t == 3 ? CLG_BIAS_COL : CLG_BIAS_NONE;
        c.relu = t == 3;
        c.batch = t == 2 ? 2 : 1;
        check(&c, "tiny");
    }
    scase c = sbase(0, 1, 3, 4, 20, 6);
    check(&c, "tiny empty chunks");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gemm-splitk");
    TCase *tc = tcase_create("gemm-splitk");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_tiny);
    tcase_add_test(tc, test_errors);
    if (!getenv("CLGRAD_TEST_TINY")) {
        tcase_add_test(tc, test_plan);
        tcase_add_test(tc, test_transposes);
        tcase_add_test(tc, test_chunks);
        tcase_add_test(tc, test_epilogue);
        tcase_add_test(tc, test_deterministic);
        tcase_add_test(tc, test_route);
    }
    suite_add_tcase(s, tc);
    return tu_run(s);
}
