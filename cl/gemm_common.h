// GEMM pieces shared by cl/gemm.cl and cl/gemm_splitk.cl, so the two cannot
// drift apart. Not a program of its own: a `#include "gemm_common.h"` line of
// a .cl file is replaced by this file's text, as for cl/gelu.h.
//
//   gemm_epi        the scalar epilogue act(alpha * acc + beta * C + bias).
//   gemm_dot_block  a DR x DC block of A * B^T over k in [kb, ke) as float16
//                   partial dot products, reduced at the end (gemm_dot,
//                   gemm_splitk_dot). DR, DC: -D options, 4 by default.
#ifndef CLG_GEMM_COMMON_H
#define CLG_GEMM_COMMON_H

#ifndef DR
#define DR 4 // rows of C per work-item (gemm_dot_block)
#endif
#ifndef DC
#define DC 4 // columns of C per work-item (gemm_dot_block)
#endif

// bias_mode 1: bias[m], 2: bias[n]. beta == 0 never reads C (it may hold
// anything, NaN included).
inline float gemm_epi(float acc, const float alpha, const float beta, __global const float *cp,
                      __global const float *bias, const int bias_mode, const int m, const int n, const int relu)
{
    float v = alpha * acc;
    if (beta != 0.0f)
        v += beta * *cp;
    if (bias_mode == 1)
        v += bias[m];
    else if (bias_mode == 2)
        v += bias[n];
    return relu ? fmax(v, 0.0f) : v;
}

// sum[i][j] = sum over k in [kb, ke) of A[m0 + i][k] * B[n0 + j][k] for A
// (M x K, lda) and B (N x K, ldb) row-major with K contiguous; rows past the
// edge (m0 + i >= M, n0 + j >= N) repeat the last one (computed, for the
// caller not to store).
inline void gemm_dot_block(__global const float *A, const int lda, __global const float *B, const int ldb,
                           const int M, const int N, const int m0, const int n0, const int kb, const int ke,
                           float sum[DR][DC])
{
    __global const float *ap[DR], *bp[DC];
#pragma unroll
    for (int i = 0; i < DR; i++)
        ap[i] = A + (size_t)min(m0 + i, M - 1) * lda;
#pragma unroll
    for (int j = 0; j < DC; j++)
        bp[j] = B + (size_t)min(n0 + j, N - 1) * ldb;
    float16 acc[DR][DC];
#pragma unroll
    for (int i = 0; i < DR; i++)
#pragma unroll
        for (int j = 0; j < DC; j++)
            acc[i][j] = (float16)(0.0f);
    int k = kb;
    for (; k + 16 <= ke; k += 16) {
        float16 av[DR], bv[DC];
#pragma unroll
        for (int i = 0; i < DR; i++)
            av[i] = vload16(0, ap[i] + k);
#pragma unroll
        for (int j = 0; j < DC; j++)
            bv[j] = vload16(0, bp[j] + k);
#pragma unroll
        for (int i = 0; i < DR; i++)
#pragma unroll
            for (int j = 0; j < DC; j++)
                acc[i][j] = fma(av[i], bv[j], acc[i][j]);
    }
#pragma unroll
    for (int i = 0; i < DR; i++)
#pragma unroll
        for (int j = 0; j < DC; j++) {
            // (halves through private memory and the last lanes through
            // dot(): oclgrind mis-tracks float16 swizzles and crashes on a
            // sum of lanes of one vector, see tests/oclgrind_check.sh)
            float t[16];
            vstore16(acc[i][j], 0, t);
            const float8 s8 = vload8(0, t) + vload8(1, t);
            sum[i][j] = dot(s8.lo + s8.hi, (float4)(1.0f));
        }
    for (; k < ke; k++)
#pragma unroll
        for (int i = 0; i < DR; i++)
#pragma unroll
            for (int j = 0; j < DC; j++)
                sum[i][j] = fma(ap[i][k], bp[j][k], sum[i][j]);
}

#endif // CLG_GEMM_COMMON_H
