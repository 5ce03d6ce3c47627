/* GEMM: C = act(alpha * op(A) * op(B) + beta * C + bias), row-major.
 * A: op(A) is M x K (A stored M x K, or K x M when ta), leading dim lda;
 * B: op(B) is K x N (B stored K x N, or N x K when tb), leading dim ldb;
 * C: M x N, leading dim ldc. Offsets and strides are in elements.
 * Batched: `batch` independent products, operand i at off + i * stride. */
#ifndef CLG_OPS_GEMM_H
#define CLG_OPS_GEMM_H

#include "device/device.h"

typedef enum clg_gemm_backend {
    CLG_GEMM_AUTO = 0,
    CLG_GEMM_OWN = 1,
    CLG_GEMM_CLBLAST = 2
} clg_gemm_backend;

typedef enum clg_bias_mode {
    CLG_BIAS_NONE = 0,
    CLG_BIAS_ROW = 1, /* bias[m] added to row m (length M) */
    CLG_BIAS_COL = 2  /* bias[n] added to column n (length N) */
} clg_bias_mode;

typedef struct clg_gemm_args {
    int ta, tb;
    int M, N, K;
    float alpha, beta;
    cl_mem A;
    size_t offA;
    int lda;
    cl_mem B;
    size_t offB;
    int ldb;
    cl_mem C;
    size_t offC;
    int ldc;
    int batch; /* 0 or 1: single product */
    size_t strideA, strideB, strideC;
    cl_mem bias; /* optional epilogue */
    size_t offBias;
    clg_bias_mode bias_mode;
    int relu;
    clg_gemm_backend backend;
} clg_gemm_args;

/* Fills defaults: alpha 1, beta 0, batch 1, backend auto. */
CLG_INTERNAL void clg_gemm_args_init(clg_gemm_args *a);
/* Enqueues the GEMM on dev's queue. ev (may be NULL) receives an event for
 * the last kernel of the product, to release by the caller. */
CLG_INTERNAL clg_status clg_gemm(clg_device *dev, const clg_gemm_args *a, cl_event *ev);

#endif
