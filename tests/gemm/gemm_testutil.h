/* Shared by the GEMM test programs: small parameter sets valid on any
 * device, and a fixture context that does not depend on a tuning database
 * or on lazy measurements. */
#ifndef CLG_TESTS_GEMM_TESTUTIL_H
#define CLG_TESTS_GEMM_TESTUTIL_H

#include <math.h>
#include <stdio.h>
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

#endif
