// GEMM kernels. Row-major; see src/ops/gemm.h for the argument contract:
// C = act(alpha * op(A) * op(B) + beta * C + bias).
//
// Always compiled (no options):
//   gemm_ref      one work-item per C element, guarded for any M, N, K; the
//                 correctness fallback. TA/TB are run-time arguments.
//   gemm_pack     copies op(A) (or op(B)^T) into zero-padded panels (gemm_pack2:
//                 both operands of a product in one launch):
//                 dst[b][p][k][j] = X(row p*P+j, col k), P rows per panel,
//                 Kp (>= K) columns; rows >= R and columns >= K are zero.
//                 With kmaj the element (r, k) is X[k*ld + r], else X[r*ld + k].
//   gemm_reduce   split-K: sums KS partial products and applies the epilogue.
//   gemm_epilogue bias + ReLU in place (after a backend without epilogue).
// With -D GEMM_CPU (MR, NV, VW): gemm_cpu, the CPU-friendly family: no
//   barriers, each work-item owns an MR x (NV*VW) register tile of floatVW
//   vectors, reads a packed B panel contiguously and broadcasts packed A.
// With -D GEMM_TILED (MWG NWG KWG MDIMC NDIMC VWM VWN PADA PADB): gemm_tiled,
//   the GPU-style family: a work-group tile MWG x NWG staged KWG deep in
//   __local memory, each work-item an (MWG/MDIMC) x (NWG/NDIMC) register tile.
// Both families read packed operands (so any M, N, K is safe: padding is
// zero) and guard every store to C.
// With -D GEMM_DOT (DR, DC): gemm_dot, C = A * B^T on unpacked row-major
// operands as dot products along K (long thin products, e.g. the reduction
// over tiles of the Winograd backward-filter pass).

#define GEMM_CAT_(a, b) a##b
#define GEMM_CAT(a, b) GEMM_CAT_(a, b)

__kernel void gemm_ref(const int M, const int N, const int K, const float alpha, const float beta,
                       const int ta, const int tb,
                       __global const float *A, const int offA, const int lda, const int strideA,
                       __global const float *B, const int offB, const int ldb, const int strideB,
                       __global float *C, const int offC, const int ldc, const int strideC,
                       __global const float *bias, const int offBias, const int bias_mode, const int relu)
{
    const int n = get_global_id(0);
    const int m = get_global_id(1);
    const int b = get_global_id(2);
    if (m >= M || n >= N)
        return;
    __global const float *a = A + offA + (size_t)b * strideA;
    __global const float *bb = B + offB + (size_t)b * strideB;
    __global float *c = C + offC + (size_t)b * strideC;
    float acc = 0.0f;
    // Select the index, not the loaded value: a select between two loads
    // lets the compiler speculate the unused one (which may read memory the
    // caller never wrote, e.g. past the end of a transposed operand).
    const size_t sa_k = ta ? (size_t)lda : 1, sa_m = ta ? 1 : (size_t)lda;
    const size_t sb_k = tb ? 1 : (size_t)ldb, sb_n = tb ? (size_t)ldb : 1;
    for (int k = 0; k < K; k++)
        acc = fma(a[(size_t)k * sa_k + (size_t)m * sa_m], bb[(size_t)k * sb_k + (size_t)n * sb_n], acc);
    float v = alpha * acc;
    if (beta != 0.0f)
        v += beta * c[(size_t)m * ldc + n];
    if (bias_mode == 1)
        v += bias[offBias + m];
    else if (bias_mode == 2)
        v += bias[offBias + n];
    if (relu)
        v = fmax(v, 0.0f);
    c[(size_t)m * ldc + n] = v;
}

// gemm_epi (the scalar epilogue of the guarded paths) and gemm_dot_block.
#include "gemm_common.h"

// One work-item's block of gemm_pack: depths k0 .. k0 + 15 of panel p of batch entry b.
inline void gemm_pack_block(const int R, const int K, const int Kp, const int kmaj, __global const float *X,
                            const int off, const int ld, const int stride, const int P, __global float *D,
                            const int dstride, const int k0, const int p, const int b)
{
    if (k0 >= Kp || p * P >= R) // the range may be padded to whole work-groups
        return;
    __global const float *x = X + off + (size_t)b * stride;
    __global float *d = D + (size_t)b * dstride + ((size_t)p * Kp + k0) * P;
    const int r0 = p * P;
    if (k0 + 16 <= K && r0 + P <= R) {
        if (kmaj && P % 16 == 0) { // whole vectors (B panels of the CPU kernel: NR = NV VW)
            for (int kk = 0; kk < 16; kk++) {
                __global const float *s = x + (size_t)(k0 + kk) * ld + r0;
                for (int q = 0; q < P / 16; q++)
                    vstore16(vload16(q, s), q, d + kk * P);
            }
        } else if (kmaj && P == 8) { // A^T panels of MR = 8 rows (AVX-512 tiles: the weight gradients' dz^T)
            for (int kk = 0; kk < 16; kk++)
                vstore8(vload8(0, x + (size_t)(k0 + kk) * ld + r0), 0, d + kk * 8);
        } else if (kmaj && P == 6) { // A^T panels of MR = 6 rows (the weight gradients' dz^T)
            for (int kk = 0; kk < 16; kk++) {
                __global const float *s = x + (size_t)(k0 + kk) * ld + r0;
                vstore4(vload4(0, s), 0, d + kk * 6);
                vstore2(vload2(0, s + 4), 0, d + kk * 6 + 4);
            }
        } else if (kmaj) {
            for (int kk = 0; kk < 16; kk++) {
                __global const float *s = x + (size_t)(k0 + kk) * ld + r0;
                for (int j = 0; j < P; j++)
                    d[kk * P + j] = s[j];
            }
        } else if (P == 4) { // a 4 x 16 block transposed in registers, four 16-float stores
            __global const float *s = x + (size_t)r0 * ld + k0;
            const float16 a = vload16(0, s), b = vload16(0, s + ld), c = vload16(0, s + 2 * (size_t)ld),
                          e = vload16(0, s + 3 * (size_t)ld);
            vstore16((float16)(a.s0, b.s0, c.s0, e.s0, a.s1, b.s1, c.s1, e.s1, a.s2, b.s2, c.s2, e.s2, a.s3, b.s3,
                               c.s3, e.s3), 0, d);
            vstore16((float16)(a.s4, b.s4, c.s4, e.s4, a.s5, b.s5, c.s5, e.s5, a.s6, b.s6, c.s6, e.s6, a.s7, b.s7,
                               c.s7, e.s7), 1, d);
            vstore16((float16)(a.s8, b.s8, c.s8, e.s8, a.s9, b.s9, c.s9, e.s9, a.sa, b.sa, c.sa, e.sa, a.sb, b.sb,
                               c.sb, e.sb), 2, d);
            vstore16((float16)(a.sc, b.sc, c.sc, e.sc, a.sd, b.sd, c.sd, e.sd, a.se, b.se, c.se, e.se, a.sf, b.sf,
                               c.sf, e.sf), 3, d);
        } else {
            __global const float *s = x + (size_t)r0 * ld + k0;
            for (int j = 0; j < P; j++) {
                const float16 v = vload16(0, s + (size_t)j * ld);
                d[0 * P + j] = v.s0;
                d[1 * P + j] = v.s1;
                d[2 * P + j] = v.s2;
                d[3 * P + j] = v.s3;
                d[4 * P + j] = v.s4;
                d[5 * P + j] = v.s5;
                d[6 * P + j] = v.s6;
                d[7 * P + j] = v.s7;
                d[8 * P + j] = v.s8;
                d[9 * P + j] = v.s9;
                d[10 * P + j] = v.sa;
                d[11 * P + j] = v.sb;
                d[12 * P + j] = v.sc;
                d[13 * P + j] = v.sd;
                d[14 * P + j] = v.se;
                d[15 * P + j] = v.sf;
            }
        }
    } else {
        const int kn = min(16, Kp - k0);
        for (int kk = 0; kk < kn; kk++) {
            const int k = k0 + kk;
            for (int j = 0; j < P; j++) {
                const int r = r0 + j;
                float v = 0.0f;
                if (k < K && r < R)
                    v = kmaj ? x[(size_t)k * ld + r] : x[(size_t)r * ld + k];
                d[kk * P + j] = v;
            }
        }
    }
}

// gws: (ceil(Kp/16), R panels, batch), dims 0-1 possibly rounded up. Each work-item writes 16 k-rows of
// one panel; the strided case reads 16 consecutive k (one cache line) per row.
__kernel void gemm_pack(const int K, const int Kp, const int R, const int kmaj,
                        __global const float *X, const int off, const int ld, const int stride,
                        const int P, __global float *D, const int dstride, const int batch)
{
    if (get_global_id(2) >= batch) // (never: dimension 2 is not padded)
        return;
    gemm_pack_block(R, K, Kp, kmaj, X, off, ld, stride, P, D, dstride, get_global_id(0) * 16, get_global_id(1),
                    get_global_id(2));
}

// Both operands of a product in one launch (as two gemm_pack launches): panels
// p < pa of dimension 1 are A's (ba batch entries), the rest B's (bb entries).
__kernel void gemm_pack2(const int K, const int Kp, const int pa,
                         const int Ra, const int kmaja, __global const float *XA, const int offa, const int lda,
                         const int stridea, const int PA, __global float *DA, const int dstridea, const int ba,
                         const int Rb, const int kmajb, __global const float *XB, const int offb, const int ldb,
                         const int strideb, const int PB, __global float *DB, const int dstrideb, const int bb)
{
    const int k0 = get_global_id(0) * 16, p = get_global_id(1), b = get_global_id(2);
    if (p < pa) {
        if (b < ba)
            gemm_pack_block(Ra, K, Kp, kmaja, XA, offa, lda, stridea, PA, DA, dstridea, k0, p, b);
    } else if (b < bb) {
        gemm_pack_block(Rb, K, Kp, kmajb, XB, offb, ldb, strideb, PB, DB, dstrideb, k0, p - pa, b);
    }
}

// gws: (N, M, batch). W holds KS partial products per batch entry, each
// Mp x Np (row-major, leading dimension Np).
__kernel void gemm_reduce(const int M, const int N, const int KS, const int Mp, const int Np,
                          __global const float *W, const float alpha, const float beta,
                          __global float *C, const int offC, const int ldc, const int strideC,
                          __global const float *bias, const int offBias, const int bias_mode, const int relu)
{
    const int n = get_global_id(0);
    const int m = get_global_id(1);
    const int b = get_global_id(2);
    if (m >= M || n >= N)
        return;
    __global const float *w = W + (size_t)b * KS * Mp * Np + (size_t)m * Np + n;
    float acc = 0.0f;
    for (int s = 0; s < KS; s++)
        acc += w[(size_t)s * Mp * Np];
    __global float *cp = C + offC + (size_t)b * strideC + (size_t)m * ldc + n;
    *cp = gemm_epi(acc, alpha, beta, cp, bias + offBias, bias_mode, m, n, relu);
}

// gws: (N, M, batch). C = act(C + bias), in place.
__kernel void gemm_epilogue(const int M, const int N, __global float *C, const int offC, const int ldc,
                            const int strideC, __global const float *bias, const int offBias, const int bias_mode,
                            const int relu)
{
    const int n = get_global_id(0);
    const int m = get_global_id(1);
    const int b = get_global_id(2);
    if (m >= M || n >= N)
        return;
    __global float *cp = C + offC + (size_t)b * strideC + (size_t)m * ldc + n;
    *cp = gemm_epi(*cp, 1.0f, 0.0f, cp, bias + offBias, bias_mode, m, n, relu);
}

#ifdef GEMM_CPU
#ifndef MR
#define MR 8
#endif
#ifndef NV
#define NV 2
#endif
#ifndef VW
#define VW 16
#endif
#define NR (NV * VW)
#define VEC GEMM_CAT(float, VW)
#define VLOAD GEMM_CAT(vload, VW)
#define VSTORE GEMM_CAT(vstore, VW)

#ifndef GEMM_GELU // epilogue GELU after the bias: 0 none, 1 erf form, 2 tanh form (W receives the pre-activation);
#define GEMM_GELU 0 // 3 erf form, 4 tanh form with W receiving the GELU's derivative at the pre-activation
#endif
#if GEMM_GELU
// GELU of the epilogue: cl/gelu.h, the arithmetic of cl/eltwise.cl's act_gelu_fwd and
// act_gelu_tanh_fwd, for a scalar (float) and a vector (VEC).
#include "gelu.h"
CLG_GELU_FNS(float, _s)
CLG_GELU_FNS(VEC, _v)
#define GEMM_GELU_APPLY(SUF, r) (GEMM_GELU == 1 ? clg_gelu##SUF(r) : clg_gelu_tanh##SUF(r))
#define GEMM_GELU_FD(SUF, r, d) (GEMM_GELU == 3 ? clg_gelu_fd##SUF(r, d) : clg_gelu_tanh_fd##SUF(r, d))
#endif

// gws: (Mt rounded up to the work-group size, Nt, batch * KS); lws (WGS, 1, 1).
// Ap: per batch entry apStride floats from apOff, panels of MR rows x K,
// panel i at i * aps, depth k at k * aks (packed: aps = K * MR, aks = MR;
// a view of a K x M row-major operand in place: aps = MR, aks = its lda;
// built with GEMM_AROWS, an M x K row-major operand in place: aps = MR * lda,
// aks = 1);
// Bp likewise with NR columns (bps, bks). Work-item (mt, nt, b*KS+s) computes rows mt*MR.., columns
// nt*NR.. over k in [s*kchunk, min(K, (s+1)*kchunk)). With KS > 1 it writes
// the raw sum into W (see gemm_reduce), else it applies the epilogue to C;
// built with GEMM_GELU (KS = 1 only) the epilogue ends with GELU and W
// receives the value before it (GEMM_GELU 3, 4: the GELU's derivative there)
// at b * strideC + m * ldc + n (C's index without offC).
__kernel void gemm_cpu(const int M, const int N, const int K, const int Mt, const float alpha, const float beta,
                       __global const float *Ap, const int apOff, const int apStride, const int aps, const int aks,
                       __global const float *Bp, const int bpOff, const int bpStride, const int bps, const int bks,
                       __global float *C, const int offC, const int ldc, const int strideC,
                       __global const float *bias, const int offBias, const int bias_mode, const int relu,
                       const int KS, const int kchunk, __global float *W)
{
    const int mt = get_global_id(0);
    const int nt = get_global_id(1);
    const int bs = get_global_id(2);
    if (mt >= Mt)
        return;
    const int b = bs / KS;
    const int s = bs - b * KS; // (not %: its expansion upsets oclgrind)
    const int k0 = s * kchunk;
    const int k1 = min(K, k0 + kchunk);
    __global const float *a = Ap + apOff + (size_t)b * apStride + (size_t)mt * aps + (size_t)k0 * aks;
    __global const float *bp = Bp + bpOff + (size_t)b * bpStride + (size_t)nt * bps + (size_t)k0 * bks;

#ifdef GEMM_AROWS
    // A row-major in place (see above): row i of the panel ro[i] floats from a, the
    // rows past M clamped to M - 1 (read, never stored)
    int ro[MR];
#pragma unroll
    for (int i = 0; i < MR; i++)
        ro[i] = min(i, M - 1 - mt * MR) * (aps / MR);
#define GEMM_AOFF(i) ro[i]
#else
#define GEMM_AOFF(i) (i)
#endif
    VEC acc[MR][NV];
#pragma unroll
    for (int i = 0; i < MR; i++)
#pragma unroll
        for (int v = 0; v < NV; v++)
            acc[i][v] = (VEC)(0.0f);

    for (int k = k0; k < k1; k++) {
        VEC bv[NV];
#pragma unroll
        for (int v = 0; v < NV; v++)
            bv[v] = VLOAD(v, bp);
#pragma unroll
        for (int i = 0; i < MR; i++) {
            const VEC av = (VEC)(a[GEMM_AOFF(i)]);
#pragma unroll
            for (int v = 0; v < NV; v++)
                acc[i][v] = fma(av, bv[v], acc[i][v]);
        }
        a += aks;
        bp += bks;
    }

    const int m0 = mt * MR, n0 = nt * NR;
    if (KS > 1) {
        const int Np = get_global_size(1) * NR;
        const int Mp = Mt * MR;
        __global float *w = W + ((size_t)bs * Mp + m0) * Np + n0;
#pragma unroll
        for (int i = 0; i < MR; i++)
#pragma unroll
            for (int v = 0; v < NV; v++)
                VSTORE(acc[i][v], v, w + (size_t)i * Np);
        return;
    }
    __global float *c = C + offC + (size_t)b * strideC;
    __global const float *bi = bias + offBias;
#pragma unroll
    for (int i = 0; i < MR; i++) {
        const int m = m0 + i;
        if (m < M) {
            __global float *crow = c + (size_t)m * ldc;
            const float brow = bias_mode == 1 ? bi[m] : 0.0f;
#pragma unroll
            for (int v = 0; v < NV; v++) {
                const int n = n0 + v * VW;
                if (n + VW <= N) {
                    VEC r = alpha * acc[i][v];
                    if (beta != 0.0f)
                        r = fma((VEC)(beta), VLOAD(0, crow + n), r);
                    if (bias_mode == 1)
                        r += (VEC)(brow);
                    else if (bias_mode == 2)
                        r += VLOAD(0, bi + n);
                    if (relu)
                        r = fmax(r, (VEC)(0.0f));
#if GEMM_GELU >= 3
                    {
                        VEC d;
                        r = GEMM_GELU_FD(_v, r, &d);
                        VSTORE(d, 0, W + (size_t)b * strideC + (size_t)m * ldc + n);
                    }
#elif GEMM_GELU
                    VSTORE(r, 0, W + (size_t)b * strideC + (size_t)m * ldc + n);
                    r = GEMM_GELU_APPLY(_v, r);
#endif
                    VSTORE(r, 0, crow + n);
                }
            }
        }
    }
    // The one partial vector of this tile (columns n .. N-1 of vector vt,
    // fewer than VW), handled once in a rolled loop: as an unrolled MR x NV
    // copy next to the full path it was most of this kernel's compile time
    // (about 2 s of PoCL's 2.2 s, paid at the first launch of every process
    // with a cold cache).
    const int vt = (N - n0) / VW;
    if (vt >= 0 && vt < NV && n0 + vt * VW < N) {
        const int n = n0 + vt * VW;
        const int cnt = N - n;
        float t[MR][VW];
#pragma unroll
        for (int i = 0; i < MR; i++)
#pragma unroll
            for (int v = 0; v < NV; v++)
                if (v == vt)
                    VSTORE(acc[i][v], 0, t[i]);
#pragma unroll 1
        for (int i = 0; i < MR && m0 + i < M; i++) {
            __global float *crow = c + (size_t)(m0 + i) * ldc + n;
            const float brow = bias_mode == 1 ? bi[m0 + i] : 0.0f;
#pragma unroll 1
            for (int j = 0; j < cnt; j++) {
                float r = alpha * t[i][j];
                if (beta != 0.0f)
                    r = fma(beta, crow[j], r);
                if (bias_mode == 1)
                    r += brow;
                else if (bias_mode == 2)
                    r += bi[n + j];
                if (relu)
                    r = fmax(r, 0.0f);
#if GEMM_GELU >= 3
                {
                    float d;
                    r = GEMM_GELU_FD(_s, r, &d);
                    W[(size_t)b * strideC + (size_t)(m0 + i) * ldc + n + j] = d;
                }
#elif GEMM_GELU
                W[(size_t)b * strideC + (size_t)(m0 + i) * ldc + n + j] = r;
                r = GEMM_GELU_APPLY(_s, r);
#endif
                crow[j] = r;
            }
        }
    }
}
#endif /* GEMM_CPU */

#ifdef GEMM_TILED
#define MWI (MWG / MDIMC)
#define NWI (NWG / NDIMC)
#define VECM GEMM_CAT(float, VWM)
#define VECN GEMM_CAT(float, VWN)
#define VLOADM GEMM_CAT(vload, VWM)
#define VLOADN GEMM_CAT(vload, VWN)
#define VSTOREM GEMM_CAT(vstore, VWM)
#define VSTOREN GEMM_CAT(vstore, VWN)

// gws: (Mp/MWG*MDIMC, Np/NWG*NDIMC, batch); lws (MDIMC, NDIMC, 1).
// Ap: panels of MWG rows x Kp (Kp a multiple of KWG), Bp: NWG columns x Kp.
// Work-item (tm, tn) owns rows (i/VWM)*MDIMC*VWM + tm*VWM + i%VWM of the
// work-group tile (strided, so neighbours read neighbouring local words).
__kernel __attribute__((reqd_work_group_size(MDIMC, NDIMC, 1)))
void gemm_tiled(const int M, const int N, const int Kp, const float alpha, const float beta,
                __global const float *Ap, const int apStride, __global const float *Bp, const int bpStride,
                __global float *C, const int offC, const int ldc, const int strideC,
                __global const float *bias, const int offBias, const int bias_mode, const int relu)
{
    __local float Al[KWG][MWG + PADA];
    __local float Bl[KWG][NWG + PADB];
    const int tm = get_local_id(0), tn = get_local_id(1);
    const int mb = get_group_id(0), nb = get_group_id(1);
    const int b = get_global_id(2);
    const int tid = tn * MDIMC + tm;
    __global const float *ap = Ap + (size_t)b * apStride + (size_t)mb * Kp * MWG;
    __global const float *bp = Bp + (size_t)b * bpStride + (size_t)nb * Kp * NWG;

    float acc[MWI][NWI];
#pragma unroll
    for (int i = 0; i < MWI; i++)
#pragma unroll
        for (int j = 0; j < NWI; j++)
            acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < Kp; k0 += KWG) {
        for (int idx = tid; idx < KWG * MWG / VWM; idx += MDIMC * NDIMC) {
            const int e = idx * VWM;
            VSTOREM(VLOADM(idx, ap), 0, &Al[e / MWG][e % MWG]);
        }
        for (int idx = tid; idx < KWG * NWG / VWN; idx += MDIMC * NDIMC) {
            const int e = idx * VWN;
            VSTOREN(VLOADN(idx, bp), 0, &Bl[e / NWG][e % NWG]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll 4
        for (int kk = 0; kk < KWG; kk++) {
            float ar[MWI], br[NWI];
#pragma unroll
            for (int w = 0; w < MWI / VWM; w++)
                VSTOREM(VLOADM(0, &Al[kk][(w * MDIMC + tm) * VWM]), w, ar);
#pragma unroll
            for (int w = 0; w < NWI / VWN; w++)
                VSTOREN(VLOADN(0, &Bl[kk][(w * NDIMC + tn) * VWN]), w, br);
#pragma unroll
            for (int i = 0; i < MWI; i++)
#pragma unroll
                for (int j = 0; j < NWI; j++)
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        ap += KWG * MWG;
        bp += KWG * NWG;
    }

    __global float *c = C + offC + (size_t)b * strideC;
    __global const float *bi = bias + offBias;
#pragma unroll
    for (int i = 0; i < MWI; i++) {
        const int m = mb * MWG + (i / VWM) * MDIMC * VWM + tm * VWM + i % VWM;
        if (m < M) {
#pragma unroll
            for (int j = 0; j < NWI; j++) {
                const int n = nb * NWG + (j / VWN) * NDIMC * VWN + tn * VWN + j % VWN;
                if (n < N) {
                    __global float *cp = c + (size_t)m * ldc + n;
                    *cp = gemm_epi(acc[i][j], alpha, beta, cp, bi, bias_mode, m, n, relu);
                }
            }
        }
    }
}
#endif /* GEMM_TILED */

#ifdef GEMM_DOT
// gws: (ceil(M/DR), ceil(N/DC), batch). C = act(alpha * A * B^T + beta * C
// + bias) for A (M x K) and B (N x K), both row-major with K contiguous:
// products of long, thin operands (K >> M, N) read in place, without
// packing. Each work-item owns a DR x DC block of C as DR*DC float16
// partial dot products along K, reduced at the end.
__kernel void gemm_dot(const int M, const int N, const int K, const float alpha, const float beta,
                       __global const float *A, const int offA, const int lda, const int strideA,
                       __global const float *B, const int offB, const int ldb, const int strideB,
                       __global float *C, const int offC, const int ldc, const int strideC,
                       __global const float *bias, const int offBias, const int bias_mode, const int relu)
{
    const int m0 = get_global_id(0) * DR;
    const int n0 = get_global_id(1) * DC;
    const int b = get_global_id(2);
    if (m0 >= M || n0 >= N)
        return;
    float sum[DR][DC];
    gemm_dot_block(A + offA + (size_t)b * strideA, lda, B + offB + (size_t)b * strideB, ldb, M, N, m0, n0, 0, K,
                   sum);
    __global float *c = C + offC + (size_t)b * strideC;
    __global const float *bi = bias + offBias;
#pragma unroll
    for (int i = 0; i < DR; i++) {
        const int m = m0 + i;
        if (m < M) {
#pragma unroll
            for (int j = 0; j < DC; j++) {
                const int n = n0 + j;
                if (n < N) {
                    __global float *cp = c + (size_t)m * ldc + n;
                    *cp = gemm_epi(sum[i][j], alpha, beta, cp, bi, bias_mode, m, n, relu);
                }
            }
        }
    }
}
#endif /* GEMM_DOT */

#ifdef GEMM_ROWS
// With -D GEMM_ROWS (RR, TA): gemm_rows, C = op(A) * B on unpacked
// row-major operands with B not transposed (its rows contiguous along N):
// each work-item computes RR rows x 16 columns from one 16-wide load of a
// row of B and RR scalars of op(A) per k (TA 1: A stored K x M, the RR
// scalars adjacent). Small products in one launch (the dense layers'
// gradients), no packing passes. ROWS_MI 1: gws (row blocks, column blocks,
// batch), so a strip of B (K x 16) is read from memory once and then from
// L1 by the other row blocks (op(A) small, B large); 0: gws (column blocks,
// row blocks, batch), a block of op(A) stays in L1.
__kernel void gemm_rows(const int M, const int N, const int K, const float alpha, const float beta,
                        __global const float *A, const int offA, const int lda, const int strideA,
                        __global const float *B, const int offB, const int ldb, const int strideB,
                        __global float *C, const int offC, const int ldc, const int strideC,
                        __global const float *bias, const int offBias, const int bias_mode, const int relu)
{
#if ROWS_MI // the row blocks innermost: the work-items sharing a 16-column strip of B run one after another
    const int n0 = get_global_id(1) * 16;
    const int m0 = get_global_id(0) * RR;
#else
    const int n0 = get_global_id(0) * 16;
    const int m0 = get_global_id(1) * RR;
#endif
    const int b = get_global_id(2);
    if (m0 >= M || n0 >= N)
        return;
    __global const float *a = A + offA + (size_t)b * strideA;
    __global const float *bb = B + offB + (size_t)b * strideB + n0;
    // rows past the edge repeat the last one (computed, never stored)
    size_t ai[RR];
#pragma unroll
    for (int i = 0; i < RR; i++)
#if TA
        ai[i] = (size_t)min(m0 + i, M - 1);
#else
        ai[i] = (size_t)min(m0 + i, M - 1) * lda;
#endif
#if TA
    const size_t ak = (size_t)lda;
#else
    const size_t ak = 1;
#endif
    float16 acc[RR];
#pragma unroll
    for (int i = 0; i < RR; i++)
        acc[i] = (float16)(0.0f);
    if (n0 + 16 <= N) {
        for (int k = 0; k < K; k++) {
            const float16 bv = vload16(0, bb + (size_t)k * ldb);
#pragma unroll
            for (int i = 0; i < RR; i++)
                acc[i] = fma((float16)(a[ai[i] + (size_t)k * ak]), bv, acc[i]);
        }
    } else { // the last, partial column block: columns past N repeat the last one
        const int nl = N - 1 - n0;
        for (int k = 0; k < K; k++) {
            float t[16];
#pragma unroll
            for (int j = 0; j < 16; j++)
                t[j] = bb[(size_t)k * ldb + min(j, nl)];
            const float16 bv = vload16(0, t);
#pragma unroll
            for (int i = 0; i < RR; i++)
                acc[i] = fma((float16)(a[ai[i] + (size_t)k * ak]), bv, acc[i]);
        }
    }
    __global float *c = C + offC + (size_t)b * strideC;
    __global const float *bi = bias + offBias;
    // full column blocks: the epilogue on the vector (scalar stores were
    // most of a short-K product's time, e.g. 128 x 256 x 10)
    const int full = n0 + 16 <= N;
#pragma unroll
    for (int i = 0; i < RR; i++) {
        const int m = m0 + i;
        if (m < M) {
            __global float *cp = c + (size_t)m * ldc + n0;
            if (full) {
                float16 v = alpha * acc[i];
                if (beta != 0.0f)
                    v += beta * vload16(0, cp);
                if (bias_mode == 1)
                    v += (float16)(bi[m]);
                else if (bias_mode == 2)
                    v += vload16(0, bi + n0);
                if (relu)
                    v = fmax(v, (float16)(0.0f));
                vstore16(v, 0, cp);
            } else {
                float t[16];
                vstore16(acc[i], 0, t);
                for (int j = 0; j < 16 && n0 + j < N; j++)
                    cp[j] = gemm_epi(t[j], alpha, beta, cp + j, bi, bias_mode, m, n0 + j, relu);
            }
        }
    }
}
#endif /* GEMM_ROWS */
