/* GEMM: every backend, kernel family and tuner parameter set against a plain
 * C reference in double; outputs poisoned before each run, fresh random
 * inputs per run (seed printed), guard sentinels around C.
 * CLGRAD_TEST_TINY=1 runs only tiny shapes (for oclgrind). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gemm.h"
#include "ops/tune.h"
#include "ops/tune_gemm.h"
#include "gemm_testutil.h"

#define TOL 1e-4    /* |got - ref| / (|ref| + 1): inputs in [-1, 1], K <= a few hundred */
#define SENTINEL 1234.5f

static clg_ctx *ctx;
static clg_device *dev;
static uint64_t stream = 1;

typedef struct gcase {
    int ta, tb, M, N, K, batch;
    int padA, padB, padC;     /* extra leading-dimension elements */
    int offA, offB, offC;     /* element offsets */
    int shareA;               /* strideA = 0 (same A for every batch entry) */
    float alpha, beta;
    int bias_mode, relu;
} gcase;

static gcase base(int M, int N, int K)
{
    gcase c;
    memset(&c, 0, sizeof c);
    c.M = M;
    c.N = N;
    c.K = K;
    c.batch = 1;
    c.alpha = 1.0f;
    return c;
}

/* Runs one case on backend b (params p for own) and returns the max error;
 * also fails when anything outside the C matrices changed. */
static double run_case(const gcase *c, clg_gemm_backend b, const clg_gemm_params *p)
{
    clg_rng r;
    tu_rng(&r, stream++);
    int rowsA = c->ta ? c->K : c->M, colsA = c->ta ? c->M : c->K;
    int rowsB = c->tb ? c->N : c->K, colsB = c->tb ? c->K : c->N;
    int lda = CLG_MAX(1, colsA) + c->padA, ldb = CLG_MAX(1, colsB) + c->padB, ldc = CLG_MAX(1, c->N) + c->padC;
    int batch = c->batch;
    size_t sA = c->shareA ? 0 : (size_t)rowsA * lda, sB = (size_t)rowsB * ldb + 3, sC = (size_t)c->M * ldc + 5;
    size_t nA = c->offA + (batch - 1) * sA + (size_t)rowsA * lda + 1;
    size_t nB = c->offB + (batch - 1) * sB + (size_t)rowsB * ldb + 1;
    size_t nC = c->offC + (batch - 1) * sC + (size_t)c->M * ldc + 7;
    int nbias = CLG_MAX(c->M, c->N) + 2;
    float *A = malloc(sizeof(float) * nA), *B = malloc(sizeof(float) * nB), *C = malloc(sizeof(float) * nC);
    float *C0 = malloc(sizeof(float) * nC), *bias = malloc(sizeof(float) * nbias);
    double *ref = malloc(sizeof(double) * CLG_MAX((size_t)1, (size_t)c->M * c->N));
    ck_assert(A && B && C && C0 && bias && ref);
    tu_fill(A, nA, -1, 1, &r);
    tu_fill(B, nB, -1, 1, &r);
    tu_fill(bias, nbias, -1, 1, &r);
    /* C: sentinel everywhere; inside the matrices random (beta != 0) or NaN */
    for (size_t i = 0; i < nC; i++)
        C0[i] = SENTINEL;
    for (int bt = 0; bt < batch; bt++)
        for (int m = 0; m < c->M; m++)
            for (int n = 0; n < c->N; n++) {
                float v;
                if (c->beta != 0.0f)
                    tu_fill(&v, 1, -1, 1, &r);
                else
                    tu_poison(&v, 1);
                C0[c->offC + bt * sC + (size_t)m * ldc + n] = v;
            }
    cl_mem dA = tu_upload(dev, A, nA), dB = tu_upload(dev, B, nB), dC = tu_upload(dev, C0, nC);
    cl_mem dBias = tu_upload(dev, bias, (size_t)nbias);
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.ta = c->ta;
    g.tb = c->tb;
    g.M = c->M;
    g.N = c->N;
    g.K = c->K;
    g.alpha = c->alpha;
    g.beta = c->beta;
    g.A = dA;
    g.offA = (size_t)c->offA;
    g.lda = lda;
    g.B = dB;
    g.offB = (size_t)c->offB;
    g.ldb = ldb;
    g.C = dC;
    g.offC = (size_t)c->offC;
    g.ldc = ldc;
    g.batch = batch;
    g.strideA = sA;
    g.strideB = sB;
    g.strideC = sC;
    g.bias_mode = (clg_bias_mode)c->bias_mode;
    g.bias = c->bias_mode ? dBias : NULL;
    g.offBias = 1;
    g.relu = c->relu;
    cl_event ev = NULL;
    clg_status st = clg_gemm_run(dev, &g, b, p, NULL, &ev);
    if (st != CLG_OK)
        fprintf(stderr, "gemm failed: %s\n", clg_last_error(ctx));
    ck_assert_int_eq(st, CLG_OK);
    if (ev) {
        ck_assert_int_eq(clWaitForEvents(1, &ev), CL_SUCCESS);
        clReleaseEvent(ev);
    }
    tu_download(dev, dC, C, nC);
    double worst = 0;
    for (int bt = 0; bt < batch; bt++) {
        const float *a = A + c->offA + bt * sA, *bb = B + c->offB + bt * sB;
        size_t co = c->offC + bt * sC;
        tg_ref_from(ref, C0, co, ldc, c->M, c->N);
        tu_gemm_ref(c->ta, c->tb, c->M, c->N, c->K, c->alpha, a, lda, bb, ldb, c->beta, ref, c->N);
        float *got = malloc(sizeof(float) * CLG_MAX((size_t)1, (size_t)c->M * c->N));
        double e = tg_epilogue_err(ref, got, C, co, ldc, c->M, c->N, bias, c->bias_mode, c->relu, TOL, bt);
        free(got);
        if (e > worst)
            worst = e;
    }
    /* nothing outside the matrices may change */
    size_t bad = 0;
    for (size_t i = 0; i < nC; i++)
        if (C0[i] == SENTINEL && C[i] != SENTINEL)
            bad++;
    if (bad)
        fprintf(stderr, "%zu elements outside C were written\n", bad);
    ck_assert_uint_eq(bad, 0);
    clg_buf_release(dev, dA);
    clg_buf_release(dev, dB);
    clg_buf_release(dev, dC);
    clg_buf_release(dev, dBias);
    free(A);
    free(B);
    free(C);
    free(C0);
    free(bias);
    free(ref);
    return worst;
}

static void check(const gcase *c, clg_gemm_backend b, const clg_gemm_params *p, const char *what)
{
    double e = run_case(c, b, p);
    char desc[200] = "";
    if (p)
        clg_gemm_params_str(p, desc, sizeof desc);
    if (!(e <= TOL))
        fprintf(stderr, "FAIL %s [%s %s] ta=%d tb=%d M=%d N=%d K=%d batch=%d alpha=%g beta=%g bias=%d relu=%d: err %g\n",
                what, clg_gemm_backend_name(b), desc, c->ta, c->tb, c->M, c->N, c->K, c->batch, (double)c->alpha,
                (double)c->beta, c->bias_mode, c->relu, e);
    ck_assert(e <= TOL);
}

static void setup(void)
{
    ctx = tg_ctx();
    dev = &ctx->devs[0];
}

static void teardown(void)
{
    clg_ctx_destroy(ctx);
    ctx = NULL;
}

START_TEST(test_transposes)
{
    /* every transpose case, odd sizes, padded leading dims, offsets, alpha/beta */
    clg_gemm_params pc = tg_cpu_params(4, 1, 8, 2, 0), pt = tg_tiled_params(), pd;
    clg_gemm_params_default(dev, &pd);
    for (int t = 0; t < 4; t++) {
        gcase c = base(37, 53, 29);
        c.ta = t & 1;
        c.tb = t >> 1;
        c.padA = 3;
        c.padB = 1;
        c.padC = 2;
        c.offA = 5;
        c.offB = 7;
        c.offC = 11;
        c.alpha = 0.75f;
        c.beta = -0.5f;
        check(&c, CLG_GEMM_OWN, NULL, "transposes");
        check(&c, CLG_GEMM_OWN, &pd, "transposes");
        check(&c, CLG_GEMM_OWN, &pc, "transposes");
        check(&c, CLG_GEMM_OWN, &pt, "transposes");
        check(&c, CLG_GEMM_REF, NULL, "transposes");
        c.beta = 0.0f; /* C poisoned: must not be read */
        check(&c, CLG_GEMM_OWN, NULL, "transposes beta=0");
    }
}
END_TEST

START_TEST(test_odd_sizes)
{
    static const int dims[][3] = {{1, 1, 1}, {1, 17, 3}, {13, 1, 7}, {5, 7, 1}, {31, 33, 2}, {2, 3, 97},
                                  {17, 65, 41}, {71, 19, 13}, {64, 64, 64}, {3, 129, 5}};
    clg_gemm_params pd, pt = tg_tiled_params();
    clg_gemm_params_default(dev, &pd);
    for (size_t i = 0; i < CLG_ARRAY_LEN(dims); i++) {
        gcase c = base(dims[i][0], dims[i][1], dims[i][2]);
        c.ta = (int)(i & 1);
        c.tb = (int)((i >> 1) & 1);
        c.padC = (int)(i % 3);
        check(&c, CLG_GEMM_OWN, &pd, "odd sizes");
        check(&c, CLG_GEMM_OWN, &pt, "odd sizes");
    }
}
END_TEST

START_TEST(test_k_zero)
{
    /* K = 0: C = beta*C (+ epilogue) */
    gcase c = base(9, 21, 0);
    c.beta = 0.5f;
    c.bias_mode = CLG_BIAS_COL;
    c.relu = 1;
    clg_gemm_params pt = tg_tiled_params();
    check(&c, CLG_GEMM_OWN, NULL, "K=0");
    check(&c, CLG_GEMM_OWN, &pt, "K=0");
    check(&c, CLG_GEMM_CLBLAST * clg_gemm_have_clblast() + CLG_GEMM_OWN * !clg_gemm_have_clblast(), NULL, "K=0");
}
END_TEST

START_TEST(test_batched)
{
    clg_gemm_params pt = tg_tiled_params(), pc = tg_cpu_params(4, 1, 8, 2, 0);
    for (int t = 0; t < 4; t++) {
        gcase c = base(19, 23, 17);
        c.batch = 3;
        c.ta = t & 1;
        c.tb = t >> 1;
        c.offA = 2;
        c.offC = 3;
        c.beta = 0.25f;
        c.shareA = t == 3; /* shared weights (stride 0) */
        check(&c, CLG_GEMM_OWN, NULL, "batched");
        check(&c, CLG_GEMM_OWN, &pt, "batched");
        check(&c, CLG_GEMM_OWN, &pc, "batched");
        if (clg_gemm_have_clblast() && !c.shareA)
            check(&c, CLG_GEMM_CLBLAST, NULL, "batched");
    }
}
END_TEST

START_TEST(test_epilogue)
{
    clg_gemm_params pt = tg_tiled_params(), pk = tg_cpu_params(4, 1, 8, 2, 3), pd;
    clg_gemm_params_default(dev, &pd);
    for (int bm = 0; bm < 3; bm++)
        for (int relu = 0; relu < 2; relu++) {
            gcase c = base(27, 45, 70);
            c.bias_mode = bm;
            c.relu = relu;
            c.beta = bm == 2 ? 0.5f : 0.0f;
            c.alpha = 1.5f;
            c.tb = relu;
            check(&c, CLG_GEMM_OWN, &pd, "epilogue");
            check(&c, CLG_GEMM_OWN, &pt, "epilogue");
            check(&c, CLG_GEMM_OWN, &pk, "epilogue split-K");
            check(&c, CLG_GEMM_REF, NULL, "epilogue");
            if (clg_gemm_have_clblast())
                check(&c, CLG_GEMM_CLBLAST, NULL, "epilogue");
        }
}
END_TEST

START_TEST(test_split_k)
{
    /* small tile grid, long K: split-K (explicit and automatic) */
    clg_gemm_params pk = tg_cpu_params(4, 1, 8, 2, 5), pa = tg_cpu_params(4, 1, 8, 2, 0), pd;
    clg_gemm_params_default(dev, &pd);
    gcase c = base(6, 25, 1100);
    c.tb = 1;
    c.beta = 0.5f;
    check(&c, CLG_GEMM_OWN, &pk, "split-K");
    check(&c, CLG_GEMM_OWN, &pa, "split-K auto");
    check(&c, CLG_GEMM_OWN, &pd, "split-K default");
    c.batch = 2;
    c.bias_mode = CLG_BIAS_ROW;
    check(&c, CLG_GEMM_OWN, &pk, "split-K batched");
}
END_TEST

START_TEST(test_clblast)
{
    if (!clg_gemm_have_clblast()) {
        gcase c = base(4, 4, 4);
        clg_gemm_args g;
        clg_gemm_args_init(&g);
        (void)c;
        ck_assert_int_eq(clg_gemm_set_backend(ctx, CLG_GEMM_CLBLAST), CLG_ERR_UNSUPPORTED);
        return;
    }
    for (int t = 0; t < 4; t++) {
        gcase c = base(33, 18, 47);
        c.ta = t & 1;
        c.tb = t >> 1;
        c.offA = 1;
        c.offC = 2;
        c.padB = 3;
        c.alpha = -1.25f;
        c.beta = 0.5f;
        check(&c, CLG_GEMM_CLBLAST, NULL, "clblast");
    }
}
END_TEST

START_TEST(test_tuner_params)
{
    /* every parameter set the tuner can emit (full space) is built and checked */
    int n = clg_gemm_candidates(dev, 0, NULL, 0);
    ck_assert_int_gt(n, 0);
    clg_gemm_params *p = malloc(sizeof *p * (size_t)n);
    ck_assert_int_eq(clg_gemm_candidates(dev, 0, p, n), n);
    int nq = clg_gemm_candidates(dev, 1, NULL, 0);
    ck_assert_int_gt(nq, 0);
    ck_assert_int_le(nq, n);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(clg_gemm_params_check(dev, &p[i]), CLG_OK);
        gcase c = base(23 + i % 5, 41 + 3 * (i % 7), 19 + i % 4);
        c.ta = i & 1;
        c.tb = (i >> 1) & 1;
        c.beta = (i % 3) ? 0.0f : 0.5f;
        c.bias_mode = i % 3;
        c.relu = i % 2;
        check(&c, CLG_GEMM_OWN, &p[i], "tuner parameter set");
    }
    free(p);
}
END_TEST

START_TEST(test_invalid_args)
{
    cl_mem m = tu_upload(dev, NULL, 64);
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.M = g.N = g.K = 4;
    g.A = g.B = g.C = m;
    g.lda = 4;
    g.ldb = 4;
    g.ldc = 3; /* too small */
    ck_assert_int_eq(clg_gemm(dev, &g, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "leading dimension"));
    g.ldc = 4;
    g.M = -1;
    ck_assert_int_eq(clg_gemm(dev, &g, NULL), CLG_ERR_INVALID_ARG);
    g.M = 4;
    g.bias_mode = CLG_BIAS_ROW;
    ck_assert_int_eq(clg_gemm(dev, &g, NULL), CLG_ERR_INVALID_ARG);
    g.bias_mode = CLG_BIAS_NONE;
    clg_gemm_params bad;
    memset(&bad, 0, sizeof bad);
    bad.family = CLG_GEMM_FAM_CPU;
    bad.MR = 0;
    ck_assert_int_eq(clg_gemm_run(dev, &g, CLG_GEMM_OWN, &bad, NULL, NULL), CLG_ERR_INVALID_ARG);
    bad.family = CLG_GEMM_FAM_TILED;
    bad.MWG = 12;
    bad.MDIMC = 8;
    bad.VWM = 2;
    ck_assert_int_eq(clg_gemm_run(dev, &g, CLG_GEMM_OWN, &bad, NULL, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(clg_gemm_backend_parse("own"), CLG_GEMM_OWN);
    ck_assert_int_eq(clg_gemm_backend_parse("auto"), CLG_GEMM_AUTO);
    ck_assert_int_eq(clg_gemm_backend_parse("nope"), -1);
    clg_buf_release(dev, m);
}
END_TEST

START_TEST(test_tune_db)
{
    /* round trip, tuned lookup, corrupt / foreign files ignored */
    const char *dir = "gemm-tune-db-test"; /* under the build dir; tests run one at a time */
    clg_ctx *c2 = tu_ctx_cache(NULL, dir);
    clg_device *d = &c2->devs[0];
    char path[1200];
    clg_tune_path(d, path, sizeof path);
    remove(path); /* start from nothing */
    clg_tune_dev_clear(clg_tune_dev_get(d));
    clg_gemm_params p = tg_cpu_params(4, 1, 8, 2, 2), q;
    clg_tune_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.key, sizeof e.key, "gemm/M1N2K3");
    clg_gemm_params_to_entry(&p, &e);
    clg_tune_set(&e, "gflops", 12.5);
    ck_assert_int_eq(clg_tune_put(d, &e), CLG_OK);
    memset(&e, 0, sizeof e);
    snprintf(e.key, sizeof e.key, "gemm-auto/M1N2K3");
    snprintf(e.backend, sizeof e.backend, "clblast");
    ck_assert_int_eq(clg_tune_put(d, &e), CLG_OK);
    ck_assert_int_eq(clg_tune_save(d), CLG_OK);
    clg_ctx_destroy(c2);

    c2 = tu_ctx_cache(NULL, dir);
    d = &c2->devs[0];
    const clg_tune_entry *f = clg_tune_find(d, "gemm/M1N2K3");
    ck_assert_ptr_nonnull(f);
    ck_assert(clg_gemm_params_from_entry(f, &q));
    ck_assert_int_eq(q.family, p.family);
    ck_assert_int_eq(q.MR, p.MR);
    ck_assert_int_eq(q.WGS, p.WGS);
    ck_assert_int_eq(q.KS, p.KS);
    ck_assert(fabs(clg_tune_param(f, "gflops", 0) - 12.5) < 1e-9);
    f = clg_tune_find(d, "gemm-auto/M1N2K3");
    ck_assert_ptr_nonnull(f);
    ck_assert_str_eq(f->backend, "clblast");
    /* a shape of that class uses the tuned set; a far class the nearest */
    clg_gemm_params_for(d, 8, 30, 100, &q);
    ck_assert_int_eq(q.MR, 4);
    clg_gemm_params_for(d, 3000, 3000, 3000, &q);
    ck_assert_int_eq(q.MR, 4);
    clg_ctx_destroy(c2);

    /* two contexts saving in turn: neither loses the other's entries */
    clg_ctx *ca = tu_ctx_cache(NULL, dir), *cb = tu_ctx_cache(NULL, dir);
    ck_assert_ptr_nonnull(clg_tune_find(&ca->devs[0], "gemm/M1N2K3"));
    ck_assert_ptr_nonnull(clg_tune_find(&cb->devs[0], "gemm/M1N2K3"));
    memset(&e, 0, sizeof e);
    snprintf(e.key, sizeof e.key, "gemm/M5N5K5");
    clg_tune_set(&e, "family", 1);
    ck_assert_int_eq(clg_tune_put(&ca->devs[0], &e), CLG_OK);
    ck_assert_int_eq(clg_tune_save(&ca->devs[0]), CLG_OK);
    snprintf(e.key, sizeof e.key, "gemm/M0N0K0");
    ck_assert_int_eq(clg_tune_put(&cb->devs[0], &e), CLG_OK);
    ck_assert_int_eq(clg_tune_save(&cb->devs[0]), CLG_OK);
    clg_ctx_destroy(ca);
    clg_ctx_destroy(cb);
    c2 = tu_ctx_cache(NULL, dir);
    ck_assert_ptr_nonnull(clg_tune_find(&c2->devs[0], "gemm/M5N5K5"));
    ck_assert_ptr_nonnull(clg_tune_find(&c2->devs[0], "gemm/M0N0K0"));
    ck_assert_ptr_nonnull(clg_tune_find(&c2->devs[0], "gemm/M1N2K3"));
    clg_ctx_destroy(c2);

    /* corrupt file: ignored, defaults used */
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fputs("{\"format\": \"clgrad-tune\", \"entries\": {\"gemm/M1N2K3\": {\"MR\": 4,", fp);
    fclose(fp);
    c2 = tu_ctx_cache(NULL, dir);
    d = &c2->devs[0];
    ck_assert_ptr_null(clg_tune_find(d, "gemm/M1N2K3"));
    clg_gemm_params_for(d, 8, 30, 100, &q);
    clg_gemm_params_default(d, &p);
    ck_assert_int_eq(q.family, p.family);
    ck_assert_int_eq(q.MR, p.MR);
    clg_ctx_destroy(c2);

    /* parser: foreign device rejected, unknown keys skipped */
    clg_tune_dev td;
    memset(&td, 0, sizeof td);
    clg_err err;
    const char *txt = "{\"format\":\"clgrad-tune\",\"version\":1,\"device\":\"X\",\"driver\":\"1\",\"extra\":[1,{\"a\":null}],"
                      "\"entries\":{\"k\":{\"backend\":\"own\",\"MR\":6,\"note\":\"x\\u0041\"}}}";
    ck_assert_int_eq(clg_tune_parse(&err, txt, "Y", "1", &td), CLG_ERR_FORMAT);
    ck_assert_int_eq(td.n, 0);
    ck_assert_int_eq(clg_tune_parse(&err, txt, "X", "1", &td), CLG_OK);
    ck_assert_int_eq(td.n, 1);
    ck_assert_str_eq(td.e[0].backend, "own");
    ck_assert(clg_tune_param(&td.e[0], "MR", 0) == 6);
    clg_sbuf sb = {0};
    clg_tune_format(&td, "X", "1", &sb);
    clg_tune_dev td2;
    memset(&td2, 0, sizeof td2);
    ck_assert_int_eq(clg_tune_parse(&err, sb.data, "X", "1", &td2), CLG_OK);
    ck_assert_int_eq(td2.n, 1);
    clg_sbuf_free(&sb);
    clg_tune_dev_clear(&td);
    clg_tune_dev_clear(&td2);
    remove(path);
}
END_TEST

START_TEST(test_tuner_run)
{
    /* the tuner on two small shapes: entries written, saved, and used */
    const char *dir = "gemm-tune-run-test";
    clg_ctx *c2 = tu_ctx_cache(NULL, dir);
    clg_device *d = &c2->devs[0];
    char path[1200];
    clg_tune_path(d, path, sizeof path);
    remove(path);
    clg_tune_dev_clear(clg_tune_dev_get(d));
    static const int shapes[2][3] = {{40, 70, 50}, {3, 20, 4000}};
    clg_gemm_tune_opts o;
    memset(&o, 0, sizeof o);
    o.quick = 1;
    o.clblast = clg_gemm_have_clblast();
    o.shapes = shapes;
    o.nshapes = 2;
    ck_assert_int_eq(clg_gemm_tune(d, &o), CLG_OK);
    clg_ctx_destroy(c2);
    c2 = tu_ctx_cache(NULL, dir);
    d = &c2->devs[0];
    for (int i = 0; i < 2; i++) {
        char cls[32], key[64];
        clg_gemm_class(shapes[i][0], shapes[i][1], shapes[i][2], cls, sizeof cls);
        snprintf(key, sizeof key, "gemm/%s", cls);
        const clg_tune_entry *e = clg_tune_find(d, key);
        ck_assert_ptr_nonnull(e);
        clg_gemm_params p, q;
        ck_assert(clg_gemm_params_from_entry(e, &p));
        ck_assert_int_eq(clg_gemm_params_check(d, &p), CLG_OK);
        ck_assert(clg_tune_param(e, "gflops", 0) > 0);
        clg_gemm_params_for(d, shapes[i][0], shapes[i][1], shapes[i][2], &q);
        ck_assert_int_eq(memcmp(&p, &q, sizeof p), 0);
        if (clg_gemm_have_clblast()) {
            snprintf(key, sizeof key, "gemm-auto/%s", cls);
            e = clg_tune_find(d, key);
            ck_assert_ptr_nonnull(e);
            ck_assert(strcmp(e->backend, "own") == 0 || strcmp(e->backend, "clblast") == 0);
        }
    }
    /* the tuned sets compute correctly on their shapes (via AUTO) */
    clg_device *save = dev;
    clg_ctx *savec = ctx;
    dev = d;
    ctx = c2;
    clg_tune_db_get(c2)->auto_measure = 0;
    gcase c = base(40, 70, 50);
    c.bias_mode = CLG_BIAS_ROW;
    check(&c, CLG_GEMM_AUTO, NULL, "tuned");
    c = base(3, 20, 4000);
    c.tb = 1;
    check(&c, CLG_GEMM_AUTO, NULL, "tuned");
    dev = save;
    ctx = savec;
    clg_ctx_destroy(c2);
    remove(path);
}
END_TEST

START_TEST(test_auto_backend)
{
    /* AUTO follows the db entry of the class; context default overrides */
    clg_tune_entry e;
    memset(&e, 0, sizeof e);
    char cls[32];
    clg_gemm_class(21, 22, 23, cls, sizeof cls);
    snprintf(e.key, sizeof e.key, "gemm-auto/%s", cls);
    snprintf(e.backend, sizeof e.backend, "%s", clg_gemm_have_clblast() ? "clblast" : "own");
    ck_assert_int_eq(clg_tune_put(dev, &e), CLG_OK);
    gcase c = base(21, 22, 23);
    c.beta = 0.5f;
    c.bias_mode = CLG_BIAS_ROW;
    check(&c, CLG_GEMM_AUTO, NULL, "auto from db");
    ck_assert_int_eq(clg_gemm_set_backend(ctx, CLG_GEMM_REF), CLG_OK);
    ck_assert_int_eq(clg_gemm_get_backend(ctx), CLG_GEMM_REF);
    check(&c, CLG_GEMM_AUTO, NULL, "auto -> ref");
}
END_TEST

/* AUTO on two identical devices (data-parallel lanes): the first measures
 * own vs CLBlast, the second takes its choice without measuring (two
 * measurements could disagree, and a later process reading the stored
 * choice would then compute differently on one lane); the choice is saved
 * for the next process. A fresh cache; skipped without CLBlast or a second
 * device. */
START_TEST(test_auto_same_kind)
{
    if (!clg_gemm_have_clblast() || ctx->ndev < 2 ||
        strcmp(ctx->devs[0].info.name, ctx->devs[1].info.name) != 0) {
        fprintf(stderr, "test_auto_same_kind: needs CLBlast and two identical devices: skipped\n");
        return;
    }
    const char *dir = "gemm-auto-kind-test";
    clg_ctx *c2 = tu_ctx_cache(NULL, dir);
    char path[1200];
    clg_tune_path(&c2->devs[0], path, sizeof path);
    remove(path);
    clg_ctx_destroy(c2);
    c2 = tu_ctx_cache(NULL, dir);
    clg_tune_db_get(c2)->auto_measure = 1;
    clg_tune_dev_get(&c2->devs[0]); /* both databases read before either measures, as lanes starting together */
    clg_tune_dev_get(&c2->devs[1]);
    char cls[32], key[64];
    gcase c = base(1000, 1000, 500); /* 1e9 flops: large enough to be measured */
    clg_gemm_class(c.M, c.N, c.K, cls, sizeof cls);
    snprintf(key, sizeof key, "gemm-auto/%s", cls);
    clg_device *save = dev;
    clg_ctx *savec = ctx;
    ctx = c2;
    const clg_tune_entry *e[2];
    for (int d = 0; d < 2; d++) {
        dev = &c2->devs[d];
        ck_assert_ptr_null(clg_tune_find(dev, key));
        check(&c, CLG_GEMM_AUTO, NULL, "auto, identical devices");
        e[d] = clg_tune_find(dev, key);
        ck_assert_ptr_nonnull(e[d]);
    }
    ck_assert(clg_tune_param(e[0], "own_ms", -1) > 0); /* measured */
    ck_assert_msg(clg_tune_param(e[1], "own_ms", -1) < 0, "the second identical device measured again");
    ck_assert_str_eq(e[0]->backend, e[1]->backend);
    char want[16];
    snprintf(want, sizeof want, "%s", e[0]->backend);
    dev = save;
    ctx = savec;
    clg_ctx_destroy(c2);
    c2 = tu_ctx_cache(NULL, dir); /* the next process: the stored choice, on both */
    for (int d = 0; d < 2; d++) {
        const clg_tune_entry *f = clg_tune_find(&c2->devs[d], key);
        ck_assert_ptr_nonnull(f);
        ck_assert_str_eq(f->backend, want);
    }
    clg_ctx_destroy(c2);
    remove(path);
}
END_TEST

/* The own backend's unpacked kernels (clg_gemm with no parameters on a CPU
 * device): small products and long, thin A * B^T run as one gemm_rows /
 * gemm_dot launch; wide ones stay packed; CLGRAD_GEMM_UNPACKED overrides. */
static void routed(const gcase *c, const char *want, const char *what)
{
    clg_gemm_args a;
    clg_gemm_args_init(&a);
    a.M = c->M;
    a.N = c->N;
    a.K = c->K;
    a.ta = c->ta;
    a.tb = c->tb;
    char desc[160];
    clg_gemm_own_describe(dev, &a, desc, sizeof desc);
    /* want NULL: packed (tuned or default parameters, either family) */
    int ok = want ? strncmp(desc, want, strlen(want)) == 0 : strncmp(desc, "unpacked", 8) != 0;
    if (!ok)
        fprintf(stderr, "FAIL %s: %dx%dx%d ta=%d tb=%d runs '%s', expected '%s'\n", what, c->M, c->N, c->K, c->ta,
                c->tb, desc, want ? want : "packed");
    ck_assert(ok);
    check(c, CLG_GEMM_OWN, NULL, what);
}

START_TEST(test_unpacked)
{
    if (!(dev->info.type & CLG_DEVICE_CPU)) {
        fprintf(stderr, "unpacked: %s is not a CPU device; the packed kernels serve every shape\n", dev->info.name);
        return;
    }
    ck_assert_int_eq(clg_ctx_option_set(dev->ctx, "gemm_unpacked", "auto"), CLG_OK);
    /* small: every transpose but ta=tb=1, batched, shared A, epilogues */
    for (int t = 0; t < 3; t++) {
        gcase c = base(45 + t, 37, 61);
        c.ta = t & 1;
        c.tb = t >> 1;
        c.batch = 3;
        c.shareA = t == 1;
        c.offA = 3;
        c.offB = 2;
        c.offC = 5;
        c.padA = 1;
        c.padC = 2;
        c.alpha = 0.5f;
        c.beta = t == 0 ? 0.0f : -0.75f;
        c.bias_mode = t;
        c.relu = t != 1;
        routed(&c, c.tb ? "unpacked dot" : "unpacked rows", "unpacked small");
    }
    gcase c = base(45, 37, 61);
    c.ta = c.tb = 1;
    routed(&c, NULL, "small, both transposed: packed");
    /* long and thin A * B^T beyond the small limit: dot, odd K */
    c = base(24, 40, 9001);
    c.tb = 1;
    c.bias_mode = CLG_BIAS_ROW;
    routed(&c, "unpacked dot", "long thin");
    /* wide: packed */
    c = base(8, 4100, 300);
    routed(&c, NULL, "wide");
    /* overrides */
    ck_assert_int_eq(clg_ctx_option_set(dev->ctx, "gemm_unpacked", "1"), CLG_OK);
    c = base(64, 300, 601);
    c.ta = 1;
    routed(&c, "unpacked rows", "gemm_unpacked=1");
    ck_assert_int_eq(clg_ctx_option_set(dev->ctx, "gemm_unpacked", "0"), CLG_OK);
    c = base(13, 17, 19);
    c.tb = 1;
    routed(&c, NULL, "gemm_unpacked=0");
    ck_assert_int_eq(clg_ctx_option_set(dev->ctx, "gemm_unpacked", "auto"), CLG_OK);
}
END_TEST

/* op(A) = A^T and op(B) = B read in place by the CPU kernel where the
 * panels tile the operand (M a multiple of MR, N of NV * VW), op(A) = A
 * row by row (any M of 4 MR or more): every
 * combination with padded leading dimensions, offsets, batches (shared A),
 * split-K and epilogues. The launch count shows whether anything was packed
 * (one launch for one operand or both: gemm_pack / gemm_pack2). */
static void inplace_case(const gcase *c, const clg_gemm_params *p, long want, const char *what)
{
    long l0 = (long)dev->launches;
    check(c, CLG_GEMM_OWN, p, what);
    long got = (long)dev->launches - l0;
    if (got != want)
        fprintf(stderr, "FAIL %s: ta=%d tb=%d M=%d N=%d K=%d: %ld launches, expected %ld\n", what, c->ta, c->tb, c->M,
                c->N, c->K, got, want);
    ck_assert_int_eq(got, want);
}

START_TEST(test_inplace)
{
    if (!(dev->info.type & CLG_DEVICE_CPU)) {
        fprintf(stderr, "in place: %s is not a CPU device; the tiled kernels read packed operands\n", dev->info.name);
        return;
    }
    clg_gemm_params pc = tg_cpu_params(4, 1, 8, 2, 0), pk = tg_cpu_params(4, 2, 8, 1, 3);
    /* auto: in place when both operands are (small ones); gemm_unpacked=1:
     * either operand alone too (the same launch counts: one pack launch) */
    for (int t = 0; t < 8; t++) {
        if (t % 4 == 0)
            ck_assert_int_eq(clg_ctx_option_set(dev->ctx, "gemm_unpacked", t ? "1" : "auto"), CLG_OK);
        const clg_gemm_params *p = t & 2 ? &pk : &pc;
        int PB = p->NV * p->VW, ks = t & 2 ? 3 : 1;
        gcase c = {.ta = 1, .tb = t & 1, .M = 4 * (9 + t), .N = PB * (3 + t), .K = 37 + 20 * t,
                   .batch = 1 + t % 2 * 2, .padA = 3, .padB = 5, .padC = 1, .offA = 7, .offB = 2, .offC = 3,
                   .shareA = t == 3, .alpha = 0.75f, .beta = t == 1 ? -0.5f : 0.0f, .bias_mode = t % 3,
                   .relu = t == 2};
        /* A in place (and B with tb = 0: no pack launch); split-K adds its reduction */
        inplace_case(&c, p, 1 + c.tb + (ks > 1), t < 4 ? "in place A and B" : "in place A");
        /* op(A) = A: its rows read in place (GEMM_AROWS); B in place
         * only when tb = 0 and gemm_unpacked=1 (auto: B packed) */
        c.ta = 0;
        long bpack = t < 4 || c.tb;
        inplace_case(&c, p, 1 + bpack + (ks > 1), "A rows in place");
        c.M += 1; /* the last panel's rows past M clamped */
        inplace_case(&c, p, 1 + bpack + (ks > 1), "A rows in place, M not tiled");
        c.ta = 1; /* A^T no longer tiled exactly: packed */
        inplace_case(&c, p, 2 + (ks > 1), "A not tiled");
        c.N += 3;
        inplace_case(&c, p, 2 + (ks > 1), "neither tiled");
    }
    /* auto, op(A) = A: rows up to 12 tile columns (N <= 12 NV VW), packed
     * past them (two launches either way: B, or both, packed) */
    gcase w = base(40, 12 * 8, 33);
    w.tb = 1;
    inplace_case(&w, &pc, 2, "op(A) = A, 12 tile columns: rows, B packed");
    w.N = 13 * 8 + 5;
    inplace_case(&w, &pc, 2, "op(A) = A, 14 tile columns: packed");
    /* CLGRAD_GEMM_UNPACKED=0: always packed (both operands, one launch) */
    ck_assert_int_eq(clg_ctx_option_set(dev->ctx, "gemm_unpacked", "0"), CLG_OK);
    gcase c = base(16, 16, 40);
    c.ta = 1;
    inplace_case(&c, &pc, 2, "gemm_unpacked=0");
    c.ta = 0;
    c.M = 45;
    inplace_case(&c, &pc, 2, "gemm_unpacked=0, op(A) = A");
    ck_assert_int_eq(clg_ctx_option_set(dev->ctx, "gemm_unpacked", "auto"), CLG_OK);
}
END_TEST

START_TEST(test_tiny)
{
    /* oclgrind mode: each kernel once on tiny shapes */
    clg_gemm_params pc = tg_cpu_params(4, 1, 8, 2, 0), pk = tg_cpu_params(4, 1, 8, 2, 2), pt = tg_tiled_params(), pd;
    clg_gemm_params_default(dev, &pd);
    for (int t = 0; t < 4; t++) {
        gcase c = base(5, 9, 3 + t);
        c.ta = t & 1;
        c.tb = t >> 1;
        c.offA = 1;
        c.padC = 1;
        c.beta = t == 2 ? 0.5f : 0.0f;
        c.bias_mode = t % 3;
        c.relu = t & 1;
        check(&c, CLG_GEMM_OWN, &pc, "tiny");
        check(&c, CLG_GEMM_OWN, &pt, "tiny");
        check(&c, CLG_GEMM_REF, NULL, "tiny");
    }
    gcase c = base(3, 17, 9);
    c.batch = 2;
    c.bias_mode = CLG_BIAS_COL;
    check(&c, CLG_GEMM_OWN, &pk, "tiny split-K");
    check(&c, CLG_GEMM_OWN, &pd, "tiny default");
    check(&c, CLG_GEMM_OWN, NULL, "tiny unpacked rows");
    c.tb = 1;
    check(&c, CLG_GEMM_OWN, NULL, "tiny unpacked dot");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gemm");
    TCase *tc = tcase_create("gemm");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    if (getenv("CLGRAD_TEST_TINY")) {
        tcase_add_test(tc, test_tiny);
        tcase_add_test(tc, test_invalid_args);
    } else {
        tcase_add_test(tc, test_transposes);
        tcase_add_test(tc, test_odd_sizes);
        tcase_add_test(tc, test_k_zero);
        tcase_add_test(tc, test_batched);
        tcase_add_test(tc, test_epilogue);
        tcase_add_test(tc, test_split_k);
        tcase_add_test(tc, test_clblast);
        tcase_add_test(tc, test_tuner_params);
        tcase_add_test(tc, test_invalid_args);
        tcase_add_test(tc, test_tune_db);
        tcase_add_test(tc, test_tuner_run);
        tcase_add_test(tc, test_auto_backend);
        TCase *tk = tcase_create("auto_kind"); /* CK_RUN_CASE=auto_kind runs it alone */
        tcase_add_checked_fixture(tk, setup, teardown);
        tcase_set_timeout(tk, 600);
        tcase_add_test(tk, test_auto_same_kind);
        suite_add_tcase(s, tk);
        tcase_add_test(tc, test_unpacked);
        tcase_add_test(tc, test_inplace);
        tcase_add_test(tc, test_tiny);
    }
    suite_add_tcase(s, tc);
    return tu_run(s);
}
