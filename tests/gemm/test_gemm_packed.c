/* GEMM entries without packing passes. clg_gemm_packed: products on
 * operands the caller already wrote in the own backend's panel layout
 * (clg_gemm_pack_layout); clg_gemm_dot: A * B^T on unpacked operands. Operands are packed on the
 * host from random matrices (padding rows/columns filled with random finite
 * values, which must not reach C), C is poisoned (NaN) where beta == 0 and
 * surrounded by sentinels, the result is compared with a double-precision
 * reference. CLGRAD_TEST_TINY=1 runs only tiny shapes (for oclgrind). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gemm.h"
#include "ops/tune.h"
#include "gemm_testutil.h"

#define TOL 1e-4 /* |got - ref| / (|ref| + 1): inputs in [-1, 1], K <= a few hundred */
#define SENTINEL 1234.5f

TG_FIXTURE()
static uint64_t stream = 100;

typedef struct pcase {
    int M, N, K, batch;
    int shareA, shareB; /* packed stride 0: one operand for every batch entry */
    int extraA, extraB; /* extra floats between packed batch entries */
    int padC, offC;
    float alpha, beta;
    int bias_mode, relu;
} pcase;

static pcase pbase(int M, int N, int K)
{
    pcase c;
    memset(&c, 0, sizeof c);
    c.M = M;
    c.N = N;
    c.K = K;
    c.batch = 1;
    c.alpha = 1.0f;
    return c;
}

/* Packs the R x K row-major matrix X (leading dim K) into panels of P rows x Kp:
 * (r, k) at ((r / P) * Kp + k) * P + r % P. Rows >= R get random finite
 * values (never reach a stored output), depth k >= K zero (required). */
static void host_pack(const float *X, int R, int K, int P, int Kp, float *D, clg_rng *r)
{
    int Rt = (R + P - 1) / P;
    for (int p = 0; p < Rt; p++)
        for (int k = 0; k < Kp; k++)
            for (int j = 0; j < P; j++) {
                int row = p * P + j;
                float v;
                if (k >= K)
                    v = 0.0f;
                else if (row < R)
                    v = X[(size_t)row * K + k];
                else
                    tu_fill(&v, 1, -100.0f, 100.0f, r);
                D[((size_t)p * Kp + k) * P + j] = v;
            }
}

/* Runs one case with parameters p (NULL: chosen) and returns the max error. */
static double run_packed_case(const pcase *c, const clg_gemm_params *p)
{
    clg_rng r;
    tu_rng(&r, stream++);
    clg_gemm_layout L;
    clg_status st = clg_gemm_pack_layout(dev, c->M, c->N, c->K, p, &L);
    if (st != CLG_OK)
        fprintf(stderr, "layout: %s\n", clg_last_error(ctx));
    ck_assert_int_eq(st, CLG_OK);
    const int M = c->M, N = c->N, K = c->K, batch = c->batch;
    const int Kp = clg_gemm_layout_kp(&L, K);
    ck_assert_int_ge(Kp, K);
    const size_t panA = clg_gemm_layout_floats_a(&L, M, K), panB = clg_gemm_layout_floats_b(&L, N, K);
    const size_t sA = c->shareA ? 0 : panA + (size_t)c->extraA, sB = c->shareB ? 0 : panB + (size_t)c->extraB;
    const int bA = c->shareA ? 1 : batch, bB = c->shareB ? 1 : batch;
    /* plain operands: A (M x K) and B^T (N x K) per batch entry, row-major */
    float *A = malloc(sizeof(float) * ((size_t)bA * M * K + 1));
    float *Bt = malloc(sizeof(float) * ((size_t)bB * N * K + 1));
    size_t nAp = (size_t)(bA - 1) * sA + panA, nBp = (size_t)(bB - 1) * sB + panB;
    float *Ap = malloc(sizeof(float) * (nAp + 1)), *Bp = malloc(sizeof(float) * (nBp + 1));
    ck_assert(A && Bt && Ap && Bp);
    tu_fill(A, (size_t)bA * M * K, -1, 1, &r);
    tu_fill(Bt, (size_t)bB * N * K, -1, 1, &r);
    tu_fill(Ap, nAp + 1, -100, 100, &r); /* gaps between packed entries: random, unused */
    tu_fill(Bp, nBp + 1, -100, 100, &r);
    for (int b = 0; b < bA; b++)
        host_pack(A + (size_t)b * M * K, M, K, L.PA, Kp, Ap + (size_t)b * sA, &r);
    for (int b = 0; b < bB; b++)
        host_pack(Bt + (size_t)b * N * K, N, K, L.PB, Kp, Bp + (size_t)b * sB, &r);

    const int ldc = CLG_MAX(1, N) + c->padC;
    const size_t sC = (size_t)M * ldc + 3;
    const size_t nC = (size_t)c->offC + (size_t)(batch - 1) * sC + (size_t)M * ldc + 5;
    float *C0 = malloc(sizeof(float) * nC), *C = malloc(sizeof(float) * nC);
    int nbias = CLG_MAX(M, N) + 2;
    float *bias = malloc(sizeof(float) * (size_t)nbias);
    double *ref = malloc(sizeof(double) * CLG_MAX((size_t)1, (size_t)M * N));
    float *got = malloc(sizeof(float) * CLG_MAX((size_t)1, (size_t)M * N));
    ck_assert(C0 && C && bias && ref && got);
    tu_fill(bias, (size_t)nbias, -1, 1, &r);
    tu_fill_blocks(C0, nC, SENTINEL, (size_t)c->offC, sC, batch, M, N, ldc, c->beta != 0.0f, &r);
    cl_mem dAp = tu_upload(dev, Ap, nAp + 1), dBp = tu_upload(dev, Bp, nBp + 1), dC = tu_upload(dev, C0, nC);
    cl_mem dBias = tu_upload(dev, bias, (size_t)nbias);

    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.M = M;
    g.N = N;
    g.K = K;
    g.alpha = c->alpha;
    g.beta = c->beta;
    g.C = dC;
    g.offC = (size_t)c->offC;
    g.ldc = ldc;
    g.strideC = sC;
    g.batch = batch;
    g.bias = c->bias_mode ? dBias : NULL;
    g.offBias = 1;
    g.bias_mode = (clg_bias_mode)c->bias_mode;
    g.relu = c->relu;
    g.backend = CLG_GEMM_REF; /* ignored by clg_gemm_packed */
    cl_event ev = NULL;
    st = clg_gemm_packed(dev, &L, &g, dAp, sA, dBp, sB, &ev);
    if (st != CLG_OK)
        fprintf(stderr, "gemm_packed failed: %s\n", clg_last_error(ctx));
    ck_assert_int_eq(st, CLG_OK);
    tu_wait_event(ev);
    tu_download(dev, dC, C, nC);

    double worst = 0;
    for (int b = 0; b < batch; b++) {
        const float *a = A + (c->shareA ? 0 : (size_t)b * M * K), *bt = Bt + (c->shareB ? 0 : (size_t)b * N * K);
        size_t co = (size_t)c->offC + b * sC;
        tg_ref_from(ref, C0, co, ldc, M, N);
        tu_gemm_ref(0, 1, M, N, K, c->alpha, a, CLG_MAX(K, 1), bt, CLG_MAX(K, 1), c->beta, ref, CLG_MAX(N, 1));
        double e = tg_epilogue_err(ref, got, C, co, ldc, M, N, bias, c->bias_mode, c->relu, TOL, b);
        worst = fmax(worst, e);
    }
    ck_assert_uint_eq(tu_count_stray(C0, C, nC, SENTINEL, "gemm_packed"), 0);
    clg_buf_release(dev, dAp);
    clg_buf_release(dev, dBp);
    clg_buf_release(dev, dC);
    clg_buf_release(dev, dBias);
    free(A), free(Bt), free(Ap), free(Bp), free(C0), free(C), free(bias), free(ref), free(got);
    return worst;
}

static void pcheck(const pcase *c, const clg_gemm_params *p, const char *what)
{
    double e = run_packed_case(c, p);
    char desc[200] = "chosen";
    if (p)
        clg_gemm_params_str(p, desc, sizeof desc);
    if (!(e <= TOL))
        fprintf(stderr,
                "FAIL %s [%s] M=%d N=%d K=%d batch=%d shareA=%d shareB=%d alpha=%g beta=%g bias=%d relu=%d: "
                "err %g\n",
                what, desc, c->M, c->N, c->K, c->batch, c->shareA, c->shareB, (double)c->alpha, (double)c->beta,
                c->bias_mode, c->relu, e);
    ck_assert(e <= TOL);
}

/* The layout matches the parameters it was derived from. */
START_TEST(test_layout)
{
    clg_gemm_params pd, pc = tg_cpu_params(6, 2, 8, 1, 0), pt = tg_tiled_params();
    clg_gemm_params_default(dev, &pd);
    clg_gemm_layout L;
    ck_assert_int_eq(clg_gemm_pack_layout(dev, 10, 20, 30, &pc, &L), CLG_OK);
    ck_assert_int_eq(L.PA, 6);
    ck_assert_int_eq(L.PB, 16);
    ck_assert_int_eq(clg_gemm_layout_kp(&L, 30), 30);
    ck_assert_uint_eq(clg_gemm_layout_floats_a(&L, 10, 30), 12 * 30);
    ck_assert_uint_eq(clg_gemm_layout_floats_b(&L, 20, 30), 32 * 30);
    ck_assert_int_eq(clg_gemm_pack_layout(dev, 10, 20, 30, &pt, &L), CLG_OK);
    ck_assert_int_eq(L.PA, 8);
    ck_assert_int_eq(L.PB, 8);
    ck_assert_int_eq(clg_gemm_layout_kp(&L, 30), 32);
    ck_assert_uint_eq(clg_gemm_layout_floats_a(&L, 10, 30), 16 * 32);
    /* NULL: the parameters clg_gemm would pick (no tuning db in tests: defaults) */
    ck_assert_int_eq(clg_gemm_pack_layout(dev, 64, 300, 64, NULL, &L), CLG_OK);
    clg_gemm_params pf;
    clg_gemm_params_for(dev, 64, 300, 64, &pf);
    ck_assert_int_eq(memcmp(&pf, &L.p, sizeof pf), 0);
    /* the reference family has no panels */
    clg_gemm_params pr;
    memset(&pr, 0, sizeof pr);
    ck_assert_int_eq(clg_gemm_pack_layout(dev, 4, 4, 4, &pr, &L), CLG_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "reference"));
    /* invalid parameters are refused with the reason */
    clg_gemm_params bad = tg_cpu_params(0, 2, 16, 1, 0);
    ck_assert_int_eq(clg_gemm_pack_layout(dev, 4, 4, 4, &bad, &L), CLG_ERR_INVALID_ARG);
}
END_TEST

START_TEST(test_packed_cpu)
{
    clg_gemm_params pd, p1 = tg_cpu_params(4, 1, 8, 2, 0), p2 = tg_cpu_params(6, 2, 8, 1, 0);
    clg_gemm_params_default(dev, &pd);
    const clg_gemm_params *ps[] = {&pd, &p1, &p2, NULL};
    int shapes[][3] = {{1, 1, 1}, {7, 33, 5}, {64, 224, 64}, {17, 65, 40}, {33, 9, 130}};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        for (size_t j = 0; j < sizeof shapes / sizeof shapes[0]; j++) {
            pcase c = pbase(shapes[j][0], shapes[j][1], shapes[j][2]);
            c.padC = (int)j % 3;
            c.offC = (int)j;
            c.alpha = j == 2 ? -0.75f : 1.0f;
            pcheck(&c, ps[i], "cpu");
        }
}
END_TEST

START_TEST(test_packed_batched)
{
    clg_gemm_params pd, p1 = tg_cpu_params(4, 1, 8, 2, 0), pt = tg_tiled_params();
    clg_gemm_params_default(dev, &pd);
    const clg_gemm_params *ps[] = {&pd, &p1, &pt};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        for (int v = 0; v < 4; v++) {
            pcase c = pbase(13 + v, 50 - 7 * v, 21 + 4 * v);
            c.batch = 3 + v;
            c.shareA = v == 1;
            c.shareB = v == 2;
            c.extraA = v == 3 ? 5 : 0;
            c.extraB = v == 0 ? 3 : 0;
            c.beta = v == 2 ? 0.5f : 0.0f;
            pcheck(&c, ps[i], "batched");
        }
}
END_TEST

START_TEST(test_packed_epilogue)
{
    clg_gemm_params pd, pt = tg_tiled_params();
    clg_gemm_params_default(dev, &pd);
    const clg_gemm_params *ps[] = {&pd, &pt};
    for (size_t i = 0; i < 2; i++)
        for (int bm = 0; bm < 3; bm++)
            for (int relu = 0; relu < 2; relu++) {
                pcase c = pbase(19, 37, 23);
                c.batch = 2;
                c.alpha = 1.5f;
                c.beta = relu ? 0.0f : -0.5f;
                c.bias_mode = bm;
                c.relu = relu;
                c.padC = 2;
                pcheck(&c, ps[i], "epilogue");
            }
}
END_TEST

START_TEST(test_packed_split_k)
{
    /* small tile grid, long K: explicit and automatic split-K on packed operands */
    clg_gemm_params pk = tg_cpu_params(4, 1, 8, 1, 5), pa = tg_cpu_params(4, 1, 8, 1, 0), pd;
    clg_gemm_params_default(dev, &pd);
    pcase c = pbase(6, 25, 1100);
    c.beta = 0.5f;
    pcheck(&c, &pk, "split-K");
    pcheck(&c, &pa, "split-K auto");
    pcheck(&c, &pd, "split-K default");
    c.batch = 2;
    c.bias_mode = CLG_BIAS_ROW;
    c.relu = 1;
    pcheck(&c, &pk, "split-K batched");
}
END_TEST

START_TEST(test_packed_k_zero)
{
    /* K = 0: C = beta * C + bias */
    clg_gemm_params pd;
    clg_gemm_params_default(dev, &pd);
    pcase c = pbase(5, 7, 0);
    c.beta = 0.5f;
    c.bias_mode = CLG_BIAS_COL;
    pcheck(&c, &pd, "K = 0");
}
END_TEST

START_TEST(test_packed_errors)
{
    clg_gemm_params pd;
    clg_gemm_params_default(dev, &pd);
    clg_gemm_layout L;
    ck_assert_int_eq(clg_gemm_pack_layout(dev, 16, 64, 8, &pd, &L), CLG_OK);
    size_t panA = clg_gemm_layout_floats_a(&L, 16, 8), panB = clg_gemm_layout_floats_b(&L, 64, 8);
    cl_mem a = tu_upload(dev, NULL, panA), b = tu_upload(dev, NULL, panB), cm = tu_upload(dev, NULL, 16 * 64);
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.M = 16;
    g.N = 64;
    g.K = 8;
    g.C = cm;
    g.ldc = 64;
    ck_assert_int_eq(clg_gemm_packed(dev, &L, &g, a, 0, b, 0, NULL), CLG_OK);
    ck_assert_int_eq(clFinish(dev->queue), CL_SUCCESS);
    /* packed A too small for two batch entries */
    g.batch = 2;
    g.strideC = 0;
    ck_assert_int_eq(clg_gemm_packed(dev, &L, &g, a, panA, b, 0, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "packed A"));
    /* stride smaller than one packed operand */
    ck_assert_int_eq(clg_gemm_packed(dev, &L, &g, a, 1, b, 0, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "stride"));
    g.batch = 1;
    /* ldc, NULL buffers, bias without buffer, a layout that does not match its parameters */
    g.ldc = 10;
    ck_assert_int_eq(clg_gemm_packed(dev, &L, &g, a, 0, b, 0, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "ldc"));
    g.ldc = 64;
    ck_assert_int_eq(clg_gemm_packed(dev, &L, &g, NULL, 0, b, 0, NULL), CLG_ERR_INVALID_ARG);
    g.bias_mode = CLG_BIAS_ROW;
    ck_assert_int_eq(clg_gemm_packed(dev, &L, &g, a, 0, b, 0, NULL), CLG_ERR_INVALID_ARG);
    g.bias_mode = CLG_BIAS_NONE;
    clg_gemm_layout L2 = L;
    L2.PA++;
    ck_assert_int_eq(clg_gemm_packed(dev, &L2, &g, a, 0, b, 0, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "does not match"));
    g.K = 10000; /* far deeper than the packed operands hold (the pool rounds sizes up) */
    ck_assert_int_eq(clg_gemm_packed(dev, &L, &g, a, 0, b, 0, NULL), CLG_ERR_INVALID_ARG);
    clg_buf_release(dev, a);
    clg_buf_release(dev, b);
    clg_buf_release(dev, cm);
}
END_TEST

/* clg_gemm_dot: C = act(alpha * A * B^T + beta * C + bias), or (rows)
 * clg_gemm_rows: C = act(alpha * op(A) * B + beta * C + bias), on unpacked
 * row-major operands (offsets, padded leading dims, batch strides). */
static double run_unpacked_case(int rows, int ta, int M, int N, int K, int batch, int shareA, float alpha, float beta,
                                int bias_mode, int relu)
{
    const char *fn = rows ? "gemm_rows" : "gemm_dot";
    if (!rows)
        ta = 0;
    clg_rng r;
    tu_rng(&r, stream++);
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.tb = !rows;
    g.ta = ta;
    g.M = M;
    g.N = N;
    g.K = K;
    g.alpha = alpha;
    g.beta = beta;
    tg_layout(&g, (const int[]){3, 1, 2}, (const int[]){(ta ? M : K) % 3, 1, 2}, (const int[]){1, 2, 3}, shareA);
    g.batch = batch;
    g.offBias = 1;
    g.bias_mode = (clg_bias_mode)bias_mode;
    g.relu = relu;
    tg_case t;
    tg_case_make(&t, dev, &g, SENTINEL, &r);
    cl_event ev = NULL;
    clg_status st = rows ? clg_gemm_rows(dev, &t.g, &ev) : clg_gemm_dot(dev, &t.g, &ev);
    if (st != CLG_OK)
        fprintf(stderr, "%s failed: %s\n", fn, clg_last_error(ctx));
    ck_assert_int_eq(st, CLG_OK);
    tu_wait_event(ev);
    double worst = tg_case_check(&t, dev, TOL, fn);
    if (!(worst <= TOL))
        fprintf(stderr, "FAIL %s ta=%d M=%d N=%d K=%d batch=%d shareA=%d alpha=%g beta=%g bias=%d relu=%d: err %g\n",
                fn, ta, M, N, K, batch, shareA, (double)alpha, (double)beta, bias_mode, relu, worst);
    tg_case_free(&t, dev);
    return worst;
}

static double run_dot_case(int M, int N, int K, int batch, int shareA, float alpha, float beta, int bias_mode,
                           int relu)
{
    return run_unpacked_case(0, 0, M, N, K, batch, shareA, alpha, beta, bias_mode, relu);
}

START_TEST(test_rows)
{
    /* edges of the 8-row x 16-column blocks, K = 0, the dense layers' gradient shapes; both block orders
     * (row blocks innermost for 8 < M <= 64 with op(A) smaller than B: {9, 17, 5} .. {64, 200, 96}) */
    int shapes[][3] = {{1, 1, 1},     {9, 17, 5},    {4, 16, 3},   {17, 33, 40}, {120, 84, 128},
                       {10, 84, 128}, {3, 5, 0},     {64, 200, 96}, {65, 48, 16}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int ta = 0; ta < 2; ta++) {
            int batch = 1 + (int)(i % 3);
            ck_assert(run_unpacked_case(1, ta, shapes[i][0], shapes[i][1], shapes[i][2], batch, i == 3,
                                        i == 4 ? -1.5f : 1.0f, (i % 2) ? 0.5f : 0.0f, (int)((i + ta) % 3),
                                        (int)((i + ta) % 2)) <= TOL);
        }
}
END_TEST

/* 4 x 4 x 4 on one buffer m, no transposes: the refusal tests' starting point. */
static clg_gemm_args args4(cl_mem m)
{
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.M = g.N = g.K = 4;
    g.A = g.B = g.C = m;
    g.lda = g.ldb = g.ldc = 4;
    return g;
}

START_TEST(test_rows_errors)
{
    cl_mem m = tu_upload(dev, NULL, 64);
    clg_gemm_args g = args4(m);
    g.tb = 1;
    ck_assert_int_eq(clg_gemm_rows(dev, &g, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "gemm_rows"));
    g.tb = 0;
    g.ldb = 3; /* smaller than N */
    ck_assert_int_eq(clg_gemm_rows(dev, &g, NULL), CLG_ERR_INVALID_ARG);
    g.ldb = 4;
    g.ta = 1;
    ck_assert_int_eq(clg_gemm_rows(dev, &g, NULL), CLG_OK);
    ck_assert_int_eq(clFinish(dev->queue), CL_SUCCESS);
    clg_buf_release(dev, m);
}
END_TEST

START_TEST(test_dot)
{
    /* edges of the 4 x 4 blocks, K below / at / past the 16-wide vectors, long K */
    int shapes[][3] = {{1, 1, 1}, {5, 7, 15}, {4, 4, 16}, {9, 3, 33}, {64, 64, 224}, {13, 30, 700}, {3, 5, 0}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int batch = 1 + (int)(i % 3);
        ck_assert(run_dot_case(shapes[i][0], shapes[i][1], shapes[i][2], batch, i == 3, i == 4 ? -1.5f : 1.0f,
                               (i % 2) ? 0.5f : 0.0f, (int)(i % 3), (int)(i % 2)) <= TOL);
    }
}
END_TEST

START_TEST(test_dot_errors)
{
    cl_mem m = tu_upload(dev, NULL, 64);
    clg_gemm_args g = args4(m);
    ck_assert_int_eq(clg_gemm_dot(dev, &g, NULL), CLG_ERR_INVALID_ARG); /* tb = 0 */
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "gemm_dot"));
    g.tb = 1;
    g.ta = 1;
    ck_assert_int_eq(clg_gemm_dot(dev, &g, NULL), CLG_ERR_INVALID_ARG);
    g.ta = 0;
    g.lda = 3; /* smaller than K */
    ck_assert_int_eq(clg_gemm_dot(dev, &g, NULL), CLG_ERR_INVALID_ARG);
    g.lda = 4;
    ck_assert_int_eq(clg_gemm_dot(dev, &g, NULL), CLG_OK);
    ck_assert_int_eq(clFinish(dev->queue), CL_SUCCESS);
    clg_buf_release(dev, m);
}
END_TEST

START_TEST(test_packed_tiny)
{
    /* oclgrind mode: each kernel once on tiny shapes */
    clg_gemm_params pc = tg_cpu_params(4, 1, 8, 2, 0), pk = tg_cpu_params(4, 1, 8, 1, 2), pt = tg_tiled_params();
    pcase c = pbase(5, 9, 6);
    c.padC = 1;
    c.bias_mode = CLG_BIAS_ROW;
    c.relu = 1;
    pcheck(&c, &pc, "tiny");
    pcheck(&c, &pt, "tiny");
    c.batch = 2;
    c.beta = 0.5f;
    c.shareA = 1;
    pcheck(&c, &pk, "tiny split-K");
    ck_assert(run_dot_case(5, 6, 19, 2, 0, 1.0f, 0.5f, CLG_BIAS_COL, 1) <= TOL);
    ck_assert(run_unpacked_case(1, 0, 5, 18, 3, 2, 0, 1.0f, 0.5f, CLG_BIAS_ROW, 1) <= TOL);
    ck_assert(run_unpacked_case(1, 1, 9, 16, 4, 1, 0, 1.0f, 0.0f, CLG_BIAS_NONE, 0) <= TOL);
}
END_TEST

int main(void)
{
    const TTest *const all[] = {test_packed_tiny, test_packed_errors,   test_dot_errors,     test_rows_errors,
                                test_layout,      test_packed_cpu,      test_packed_batched, test_packed_epilogue,
                                test_packed_split_k, test_packed_k_zero, test_dot,            test_rows};
    /* CLGRAD_TEST_TINY: the first four (tiny shapes and refusals) */
    int n = getenv("CLGRAD_TEST_TINY") ? 4 : (int)(sizeof all / sizeof all[0]);
    return tu_run_fixture("gemm-packed", 300, setup, teardown, all, n);
}
