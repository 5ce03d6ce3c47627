/* Shared by the GEMM test programs: small parameter sets valid on any
 * device, and a fixture context that does not depend on a tuning database
 * or on lazy measurements. */
#ifndef CLG_TESTS_GEMM_TESTUTIL_H
#define CLG_TESTS_GEMM_TESTUTIL_H

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

#endif
