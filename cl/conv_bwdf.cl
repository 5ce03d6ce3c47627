// Weight and bias gradients as long reductions over (image, output pixel),
// read straight from dy in NCHW layout: per-(channel, image-chunk) partial
// sums, then one reduction. See src/ops/conv_bwdf.c.
//
// bwdf_small: filters with few taps per output channel (J = C*R*S <= 32,
// e.g. the first layer of an image network), where an im2col + GEMM pass
// would transpose dy and run a GEMM only J columns wide.
//   col: J rows x ldcol floats (im2col layout: column n*PQ + pq, images of
//   this chunk), dy: images n0.. of the batch (offdy points at image n0).
//   Work-item (k, ch) sums images [ch*nper, min(nimg, (ch+1)*nper)) and
//   writes J weight partials and the bias partial to
//   part[((pch0 + ch)*K + k)*(J+1) + j], j = J: bias.
// gws = (K, chunks), any local size.
#ifndef BFJ
#define BFJ 9
#endif

// Sum of the 8 lanes. Written with dot(), not as (h.x + h.y) + (h.z + h.w):
// LLVM turns a sum of lanes of one vector into a shufflevector whose mask
// has undef lanes, and oclgrind 21.10's --uninitialized checker crashes
// (segfault) on such masks; dot() stays a builtin call it handles.
#define HSUM8(v) dot((v).lo + (v).hi, (float4)(1.0f))

__kernel void bwdf_small(__global const float *dy, const int offdy, __global const float *col, const int ldcol,
                         const int nimg, const int K, const int PQ, const int nper, const int pch0,
                         __global float *part)
{
    const int k = get_global_id(0);
    const int ch = get_global_id(1);
    if (k >= K || ch * nper >= nimg)
        return;
    const int n0 = ch * nper, n1 = min(nimg, n0 + nper);
    float8 acc[BFJ];
    float8 accb = (float8)(0.0f);
    for (int j = 0; j < BFJ; j++)
        acc[j] = (float8)(0.0f);
    float tail[BFJ];
    float tailb = 0.0f;
    for (int j = 0; j < BFJ; j++)
        tail[j] = 0.0f;
    for (int n = n0; n < n1; n++) {
        __global const float *d = dy + offdy + ((size_t)n * K + k) * PQ;
        __global const float *c = col + (size_t)n * PQ;
        int i = 0;
        for (; i + 8 <= PQ; i += 8) {
            const float8 dv = vload8(0, d + i);
            accb += dv;
            for (int j = 0; j < BFJ; j++)
                acc[j] = fma(dv, vload8(0, c + (size_t)j * ldcol + i), acc[j]);
        }
        for (; i < PQ; i++) {
            const float dv = d[i];
            tailb += dv;
            for (int j = 0; j < BFJ; j++)
                tail[j] = fma(dv, c[(size_t)j * ldcol + i], tail[j]);
        }
    }
    __global float *o = part + ((size_t)(pch0 + ch) * K + k) * (BFJ + 1);
    for (int j = 0; j < BFJ; j++)
        o[j] = HSUM8(acc[j]) + tail[j];
    o[BFJ] = HSUM8(accb) + tailb;
}

// Bias gradient partials: work-item (k, ch) sums dy[n, k, :] over images
// [ch*nper, min(N, (ch+1)*nper)) into part[ch*K + k]. gws = (K, chunks).
__kernel void bias_part(__global const float *dy, const int offdy, const int N, const int K, const int PQ,
                        const int nper, __global float *part)
{
    const int k = get_global_id(0);
    const int ch = get_global_id(1);
    if (k >= K || ch * nper >= N)
        return;
    const int n1 = min(N, (ch + 1) * nper);
    float8 a0 = (float8)(0.0f), a1 = (float8)(0.0f);
    float t = 0.0f;
    for (int n = ch * nper; n < n1; n++) {
        __global const float *d = dy + offdy + ((size_t)n * K + k) * PQ;
        int i = 0;
        for (; i + 16 <= PQ; i += 16) {
            a0 += vload8(0, d + i);
            a1 += vload8(0, d + i + 8);
        }
        for (; i < PQ; i++)
            t += d[i];
    }
    part[(size_t)ch * K + k] = HSUM8(a0 + a1) + t;
}

// out[offo + i*ldo + j] = beta*out[...] + sum_ch part[(ch*rows + i)*ps + pc0 + j]
// for i < rows, j < cols: sums the partials of bwdf_small (ps = J+1; taps:
// pc0 = 0, cols = J; bias: pc0 = J, cols = 1) or bias_part (ps = 1).
// gws = (rows, cols).
__kernel void part_reduce(__global const float *part, const int chunks, const int rows, const int cols,
                          const int ps, const int pc0, const float beta, __global float *out, const int offo,
                          const int ldo)
{
    const int i = get_global_id(0);
    const int j = get_global_id(1);
    if (i >= rows || j >= cols)
        return;
    float s = 0.0f;
    for (int ch = 0; ch < chunks; ch++)
        s += part[((size_t)ch * rows + i) * ps + pc0 + j];
    __global float *o = out + offo + (size_t)i * ldo + j;
    *o = beta == 0.0f ? s : fma(beta, *o, s);
}
