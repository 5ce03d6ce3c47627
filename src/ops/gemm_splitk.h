/* Split-K GEMM (cl/gemm_splitk.cl) for long-K products with a small M x N
 * output, e.g. weight gradients (M x N = filters x taps, K = images x
 * pixels), where the tile grid of the other kernels has fewer work-groups
 * than the device has compute units. The K range is cut into S chunks; each
 * work-group computes a partial tile of one chunk into a workspace, and a
 * second kernel sums the S partials of each element in chunk order (the
 * same result every run: no atomics) and applies alpha, beta * C, bias and
 * ReLU. Operands are read in place (no packing passes). */
#ifndef CLG_OPS_GEMM_SPLITK_H
#define CLG_OPS_GEMM_SPLITK_H

#include "gemm.h"

/* Workspace bound: S partials of M x N per batch entry. */
#define CLG_SPLITK_MAX_WS_BYTES ((size_t)64 << 20)
#define CLG_SPLITK_MAX_S 256

typedef struct clg_splitk_plan {
    int dot;    /* 1: gemm_splitk_dot (CPU devices, ta = 0 and tb = 1), 0: gemm_splitk_part */
    int TS, RT; /* gemm_splitk_part: work-group tile TS x TS, work-item tile RT x RT ((TS/RT)^2 work-items) */
    int S;      /* chunks of K */
    int kchunk; /* depth of one chunk (a multiple of 16 unless S = 1) */
} clg_splitk_plan;

/* Plan for a's shape with S chunks (0: chosen from the compute units and
 * the tile count). S is bounded by CLG_SPLITK_MAX_S and the workspace bound;
 * chunks past K are empty. The kernel: gemm_splitk_dot on CPU devices for
 * A * B^T, else gemm_splitk_part. */
CLG_INTERNAL void clg_gemm_splitk_plan_for(const clg_device *dev, const clg_gemm_args *a, int S, clg_splitk_plan *pl);

/* Whether clg_gemm's own backend should run a (parameters left to it) as
 * split-K: the gemm_splitk option (auto by the rule below, 0 never, 1 for
 * every product it applies to: batch 1 or any, no GELU epilogue, K > 0).
 * Auto rule (measured, see gemm_splitk.c): a product whose output tiles
 * would leave compute units idle and whose K is long enough to cut. */
CLG_INTERNAL int clg_gemm_splitk_wanted(clg_device *dev, const clg_gemm_args *a);

/* C = act(alpha * op(A) * op(B) + beta * C + bias) as clg_gemm (offsets,
 * strides, batch, bias, ReLU; no GELU) with S chunks of K (0: auto plan).
 * first/last (may be NULL) receive events for the first and the last
 * kernel (release both; the same event twice when one kernel ran). */
CLG_INTERNAL clg_status clg_gemm_splitk(clg_device *dev, const clg_gemm_args *a, int S, cl_event *first,
                                        cl_event *last);
/* The same with an explicit plan (tests: either kernel on any device;
 * pl->dot needs ta = 0 and tb = 1). */
CLG_INTERNAL clg_status clg_gemm_splitk_plan_run(clg_device *dev, const clg_gemm_args *a, const clg_splitk_plan *pl,
                                                 cl_event *first, cl_event *last);

#endif
