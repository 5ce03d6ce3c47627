// Split-K GEMM for long-K products with a small M x N output (weight
// gradients: K = N*H*W images x pixels, M x N = filters x taps).
//   gemm_splitk_part    cuts K into S chunks of kchunk; each work-group
//                       computes one TS x TS tile of op(A) * op(B) over one
//                       chunk and writes the partial tile to the workspace W
//                       (direct = 1, only for S = 1: applies the epilogue and
//                       writes C instead).
//   gemm_splitk_reduce  sums the S partials of every element in chunk order
//                       (a fixed order: the same result every run, no atomics)
//                       and applies alpha, beta * C, bias and ReLU.
// Operands are read in place (row-major, either transpose), staged TK deep
// in __local memory; loads follow each operand's contiguous dimension.
// The work-group is (TS/RT) x (TS/RT) work-items, each an RT x RT register
// tile with rows and columns WD apart (neighbouring work-items store
// neighbouring elements).

#ifndef TS
#define TS 32 // output tile per work-group (TS x TS)
#endif
#ifndef TK
#define TK 16 // depth of one __local stage
#endif
#ifndef RT
#define RT 4 // register tile per work-item (RT x RT)
#endif
#ifndef TA
#define TA 0 // op(A) = A^T (A stored K x M)
#endif
#ifndef TB
#define TB 0 // op(B) = B^T (B stored N x K)
#endif
#define WD (TS / RT)   // work-items per dimension
#define WGS (WD * WD)  // work-items per work-group

// gemm_epi (the epilogue) and gemm_dot_block (the float16 dot products).
#include "gemm_common.h"

// gws: (ceil(N/TS)*WD, ceil(M/TS)*WD, batch*S), lws (WD, WD, 1).
// W: batch*S partial products of M x N (row-major), entry b*S + s.
__kernel __attribute__((reqd_work_group_size(WD, WD, 1)))
void gemm_splitk_part(const int M, const int N, const int K, const int kchunk, const int S,
                      __global const float *A, const int offA, const int lda, const int strideA,
                      __global const float *B, const int offB, const int ldb, const int strideB,
                      __global float *W, const int direct, const float alpha, const float beta,
                      __global float *C, const int offC, const int ldc, const int strideC,
                      __global const float *bias, const int offBias, const int bias_mode, const int relu)
{
    __local float As[TK][TS + 1];
    __local float Bs[TK][TS + 1];
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int lid = ty * WD + tx;
    const int n0 = get_group_id(0) * TS, m0 = get_group_id(1) * TS;
    const int z = get_group_id(2);
    const int b = z / S, s = z - b * S; // (a '/' and '%' pair becomes LLVM's freeze, which oclgrind rejects)
    const int kb = s * kchunk, ke = min(K, kb + kchunk);
    __global const float *a = A + offA + (size_t)b * strideA;
    __global const float *bb = B + offB + (size_t)b * strideB;

    float acc[RT][RT];
    for (int i = 0; i < RT; i++)
        for (int j = 0; j < RT; j++)
            acc[i][j] = 0.0f;

    for (int kt = kb; kt < ke; kt += TK) {
        for (int e = lid; e < TS * TK; e += WGS) {
            // op(A)(m, k): A[m*lda + k], or A[k*lda + m] with TA; the
            // work-items step along the stored rows
#if TA
            const int ka = e / TS, mm = e - ka * TS;
#else
            const int mm = e / TK, ka = e - mm * TK;
#endif
            const int m = m0 + mm, k = kt + ka;
            float v = 0.0f;
            if (m < M && k < ke)
                v = a[TA ? (size_t)k * lda + m : (size_t)m * lda + k];
            As[ka][mm] = v;
            // op(B)(k, n): B[k*ldb + n], or B[n*ldb + k] with TB
#if TB
            const int nn = e / TK, kq = e - nn * TK;
#else
            const int kq = e / TS, nn = e - kq * TS;
#endif
            const int n = n0 + nn, k2 = kt + kq;
            float w = 0.0f;
            if (n < N && k2 < ke)
                w = bb[TB ? (size_t)n * ldb + k2 : (size_t)k2 * ldb + n];
            Bs[kq][nn] = w;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TK; kk++) {
            float ar[RT], br[RT];
            for (int i = 0; i < RT; i++)
                ar[i] = As[kk][ty + i * WD];
            for (int j = 0; j < RT; j++)
                br[j] = Bs[kk][tx + j * WD];
            for (int i = 0; i < RT; i++)
                for (int j = 0; j < RT; j++)
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int i = 0; i < RT; i++) {
        const int m = m0 + ty + i * WD;
        if (m >= M)
            break;
        for (int j = 0; j < RT; j++) {
            const int n = n0 + tx + j * WD;
            if (n >= N)
                break;
            if (direct) {
                __global float *cp = C + offC + (size_t)b * strideC + (size_t)m * ldc + n;
                *cp = gemm_epi(acc[i][j], alpha, beta, cp, bias + offBias, bias_mode, m, n, relu);
            } else {
                W[((size_t)z * M + m) * N + n] = acc[i][j];
            }
        }
    }
}

// gws: (N, M, batch), possibly rounded up.
__kernel void gemm_splitk_reduce(const int M, const int N, const int S, __global const float *W,
                                 const float alpha, const float beta,
                                 __global float *C, const int offC, const int ldc, const int strideC,
                                 __global const float *bias, const int offBias, const int bias_mode, const int relu)
{
    const int n = get_global_id(0), m = get_global_id(1), b = get_global_id(2);
    if (m >= M || n >= N)
        return;
    const size_t mn = (size_t)M * N;
    __global const float *w = W + (size_t)b * S * mn + (size_t)m * N + n;
    float acc = 0.0f;
    for (int s = 0; s < S; s++)
        acc += w[(size_t)s * mn];
    __global float *cp = C + offC + (size_t)b * strideC + (size_t)m * ldc + n;
    *cp = gemm_epi(acc, alpha, beta, cp, bias + offBias, bias_mode, m, n, relu);
}

// ---- barrier-free variant for CPU devices ----
// gws: (ceil(M/DR), ceil(N/DC), batch*S), dims 0-1 possibly rounded up.
// A (M x K) and B (N x K) row-major with K contiguous (op = A * B^T, the
// weight gradient's layout): each work-item owns a DR x DC block of C over
// one chunk of K as float16 partial dot products, reduced at the end; no
// local memory or barriers (CPU runtimes run a work-group's items in a loop).
// W and direct as in gemm_splitk_part.
__kernel void gemm_splitk_dot(const int M, const int N, const int K, const int kchunk, const int S,
                              __global const float *A, const int offA, const int lda, const int strideA,
                              __global const float *B, const int offB, const int ldb, const int strideB,
                              __global float *W, const int direct, const float alpha, const float beta,
                              __global float *C, const int offC, const int ldc, const int strideC,
                              __global const float *bias, const int offBias, const int bias_mode, const int relu)
{
    const int m0 = get_global_id(0) * DR, n0 = get_global_id(1) * DC;
    const int z = get_global_id(2);
    const int b = z / S, s = z - b * S;
    if (m0 >= M || n0 >= N)
        return;
    const int kb = s * kchunk, ke = min(K, kb + kchunk);
    float sum[DR][DC];
    gemm_dot_block(A + offA + (size_t)b * strideA, lda, B + offB + (size_t)b * strideB, ldb, M, N, m0, n0, kb, ke,
                   sum);
#pragma unroll
    for (int i = 0; i < DR; i++) {
        const int m = m0 + i;
        if (m >= M)
            break;
#pragma unroll
        for (int j = 0; j < DC; j++) {
            const int n = n0 + j;
            if (n >= N)
                break;
            if (direct) {
                __global float *cp = C + offC + (size_t)b * strideC + (size_t)m * ldc + n;
                *cp = gemm_epi(sum[i][j], alpha, beta, cp, bias + offBias, bias_mode, m, n, relu);
            } else {
                W[((size_t)z * M + m) * N + n] = sum[i][j];
            }
        }
    }
}
