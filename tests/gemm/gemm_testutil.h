/* Shared by the GEMM test programs: small parameter sets valid on any
 * device, and a fixture context that does not depend on a tuning database
 * or on lazy measurements. */
#ifndef CLG_TESTS_GEMM_TESTUTIL_H
#define CLG_TESTS_GEMM_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gemm.h"
#include "ops/tune.h"
#include "testutil.h"

/* CPU family: MR rows x NV vectors of VW columns, WGS work-items per group, KS split-K. */
static inline clg_gemm_params tg_cpu_params(int MR, int NV, int VW, int WGS, int KS)
{
    clg_gemm_params p;
    memset(&p, 0, sizeof p);
    p.family = CLG_GEMM_FAM_CPU;
    p.MR = MR;
    p.NV = NV;
    p.VW = VW;
    p.WGS = WGS;
    p.KS = KS;
    return p;
}

/* A small tiled (GPU-style, local memory) set. */
static inline clg_gemm_params tg_tiled_params(void)
{
    clg_gemm_params p;
    memset(&p, 0, sizeof p);
    p.family = CLG_GEMM_FAM_TILED;
    p.MWG = 8;
    p.NWG = 8;
    p.KWG = 4;
    p.MDIMC = 2;
    p.NDIMC = 2;
    p.VWM = 2;
    p.VWN = 2;
    p.PADA = 1;
    p.PADB = 1;
    return p;
}

/* Context on every device, backend auto, no lazy tuning measurements. */
static inline clg_ctx *tg_ctx(void)
{
    clg_ctx *c = tu_ctx(NULL);
    ck_assert_int_eq(clg_gemm_set_backend(c, CLG_GEMM_AUTO), CLG_OK);
    clg_tune_db_get(c)->auto_measure = 0;
    return c;
}

/* The checked fixture of a GEMM test program: a file-scope ctx and dev (its
 * first device) from tg_ctx, set before and destroyed after every test:
 *   TG_FIXTURE(); ... tu_run_fixture(name, timeout, setup, teardown, ...) */
#define TG_FIXTURE()                                                                                            \
    static clg_ctx *ctx;                                                                                        \
    static clg_device *dev;                                                                                     \
    static void setup(void)                                                                                     \
    {                                                                                                           \
        ctx = tg_ctx();                                                                                         \
        dev = &ctx->devs[0];                                                                                    \
    }                                                                                                           \
    static void teardown(void)                                                                                  \
    {                                                                                                           \
        clg_ctx_destroy(ctx);                                                                                   \
        ctx = NULL;                                                                                             \
    }

/* ref (M x N doubles, row stride N) = the M x N block of C0 at offset co,
 * row stride ldc: the beta input of the double reference. */
static inline void tg_ref_from(double *ref, const float *C0, size_t co, int ldc, int M, int N)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            ref[(size_t)m * N + n] = C0[co + (size_t)m * ldc + n];
}

/* Applies the epilogue to ref (bias[1 + m] per row or bias[1 + n] per
 * column, then ReLU), copies the M x N block of C at co (row stride ldc)
 * into got and returns tu_max_err(got, ref, M*N, 1); when that exceeds tol
 * it prints the first element that does (batch entry b). */
static inline double tg_epilogue_err(double *ref, float *got, const float *C, size_t co, int ldc, int M, int N,
                                     const float *bias, int bias_mode, int relu, double tol, int b)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double v = ref[(size_t)m * N + n];
            if (bias_mode == CLG_BIAS_ROW)
                v += bias[1 + m];
            else if (bias_mode == CLG_BIAS_COL)
                v += bias[1 + n];
            if (relu)
                v = v > 0 ? v : 0;
            ref[(size_t)m * N + n] = v;
            got[(size_t)m * N + n] = C[co + (size_t)m * ldc + n];
        }
    double e = tu_max_err(got, ref, (size_t)M * N, 1.0);
    for (size_t i = 0; e > tol && i < (size_t)M * N; i++)
        if (!(fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1.0) <= tol)) {
            fprintf(stderr, "batch %d C[%zu,%zu] = %g, expected %g\n", b, i / (size_t)N, i % (size_t)N,
                    (double)got[i], ref[i]);
            break;
        }
    return e;
}

/* g's layout from its shape and transposes: A, B, C at offsets off[0..2],
 * leading dimensions the operand's columns (at least 1) + pad[i], batch
 * strides its rows x ld + gap[i] (shareA: strideA 0, one A for every
 * entry). */
static inline void tg_layout(clg_gemm_args *g, const int off[3], const int pad[3], const int gap[3], int shareA)
{
    const int colsA = g->ta ? g->M : g->K, rowsA = g->ta ? g->K : g->M;
    const int colsB = g->tb ? g->K : g->N, rowsB = g->tb ? g->N : g->K;
    g->offA = (size_t)off[0];
    g->lda = CLG_MAX(colsA, 1) + pad[0];
    g->strideA = shareA ? 0 : (size_t)rowsA * g->lda + (size_t)gap[0];
    g->offB = (size_t)off[1];
    g->ldb = CLG_MAX(colsB, 1) + pad[1];
    g->strideB = (size_t)rowsB * g->ldb + (size_t)gap[1];
    g->offC = (size_t)off[2];
    g->ldc = CLG_MAX(g->N, 1) + pad[2];
    g->strideC = (size_t)g->M * g->ldc + (size_t)gap[2];
}

/* One unpacked GEMM case (A, B, C row-major in place): g is the caller's
 * template (shape, transposes, leading dimensions, offsets, batch strides,
 * strideA 0 for one A shared by every entry, alpha, beta, epilogue);
 * tg_case_make allocates and fills the host arrays (A, B, bias random in
 * [-1, 1], C0: each C block random where beta != 0, else poisoned, and
 * sentinel everywhere else), uploads them and points g's buffers at them. */
typedef struct tg_case {
    clg_gemm_args g;
    float *A, *B, *C0, *C, *bias, *got;
    double *ref;
    size_t nA, nB, nC;
    cl_mem dA, dB, dC, dBias;
    float sentinel;
} tg_case;

static inline void tg_case_make(tg_case *t, clg_device *dev, const clg_gemm_args *g, float sentinel, clg_rng *r)
{
    memset(t, 0, sizeof *t);
    t->g = *g;
    t->sentinel = sentinel;
    const int M = g->M, N = g->N, K = g->K, batch = g->batch > 0 ? g->batch : 1;
    const size_t rowsA = (size_t)(g->ta ? K : M), rowsB = (size_t)(g->tb ? N : K);
    t->nA = g->offA + (size_t)(batch - 1) * g->strideA + rowsA * (size_t)g->lda + 1;
    t->nB = g->offB + (size_t)(batch - 1) * g->strideB + rowsB * (size_t)g->ldb + 1;
    t->nC = g->offC + (size_t)(batch - 1) * g->strideC + (size_t)M * (size_t)g->ldc + 4;
    size_t nbias = (size_t)CLG_MAX(M, N) + 2, mn = CLG_MAX((size_t)1, (size_t)M * N);
    t->A = malloc(sizeof(float) * t->nA);
    t->B = malloc(sizeof(float) * t->nB);
    t->C0 = malloc(sizeof(float) * t->nC);
    t->C = malloc(sizeof(float) * t->nC);
    t->bias = malloc(sizeof(float) * nbias);
    t->ref = malloc(sizeof(double) * mn);
    t->got = malloc(sizeof(float) * mn);
    ck_assert(t->A && t->B && t->C0 && t->C && t->bias && t->ref && t->got);
    tu_fill(t->A, t->nA, -1, 1, r);
    tu_fill(t->B, t->nB, -1, 1, r);
    tu_fill(t->bias, nbias, -1, 1, r);
    tu_fill_blocks(t->C0, t->nC, sentinel, g->offC, g->strideC, batch, M, N, g->ldc, g->beta != 0.0f, r);
    t->dA = tu_upload(dev, t->A, t->nA);
    t->dB = tu_upload(dev, t->B, t->nB);
    t->dC = tu_upload(dev, t->C0, t->nC);
    t->dBias = tu_upload(dev, t->bias, nbias);
    t->g.A = t->dA;
    t->g.B = t->dB;
    t->g.C = t->dC;
    t->g.bias = g->bias_mode ? t->dBias : NULL;
}

/* Downloads C and returns the largest error of every batch entry against
 * the double reference (tg_epilogue_err at tol); asserts that nothing
 * outside the C blocks was written (what names the kernel). */
static inline double tg_case_check(tg_case *t, clg_device *dev, double tol, const char *what)
{
    const clg_gemm_args *g = &t->g;
    const int M = g->M, N = g->N, batch = g->batch > 0 ? g->batch : 1;
    tu_download(dev, t->dC, t->C, t->nC);
    double worst = 0;
    for (int b = 0; b < batch; b++) {
        size_t co = g->offC + (size_t)b * g->strideC;
        tg_ref_from(t->ref, t->C0, co, g->ldc, M, N);
        tu_gemm_ref(g->ta, g->tb, M, N, g->K, g->alpha, t->A + g->offA + (size_t)b * g->strideA, g->lda,
                    t->B + g->offB + (size_t)b * g->strideB, g->ldb, g->beta, t->ref, CLG_MAX(N, 1));
        worst = fmax(worst, tg_epilogue_err(t->ref, t->got, t->C, co, g->ldc, M, N, t->bias, g->bias_mode, g->relu,
                                            tol, b));
    }
    ck_assert_uint_eq(tu_count_stray(t->C0, t->C, t->nC, t->sentinel, what), 0);
    return worst;
}

static inline void tg_case_free(tg_case *t, clg_device *dev)
{
    clg_buf_release(dev, t->dA);
    clg_buf_release(dev, t->dB);
    clg_buf_release(dev, t->dC);
    clg_buf_release(dev, t->dBias);
    free(t->A), free(t->B), free(t->C0), free(t->C), free(t->bias), free(t->ref), free(t->got);
}

#endif
