// Element-wise kernels: activations (forward/backward), residual add,
// inverted dropout, strided row copies (concat/flatten), column sums (bias
// gradients). One element per work-item, no branches that depend on data
// beyond select()s, so the CPU back-ends vectorize across work-items.
// Offsets and counts are in elements (uint); see src/ops/nn.h.

#include "gelu.h"
CLG_GELU_FNS(float, )
CLG_GELU_FNS(float8, 8) // on 8 lanes (explicit vectors for kernels with a row loop)

// ---- activations ----
// fwd: y = f(x).  bwd: dx = dy * f'(.) computed from y where f' is a
// function of the output (relu, leaky with alpha > 0, sigmoid, tanh), from
// x for gelu.
#define ACT_KERNELS(NAME, FWD, BWD)                                                                    \
    __kernel void act_##NAME##_fwd(const uint n, const float alpha, __global const float *x,          \
                                   const uint ox, __global float *y, const uint oy)                    \
    {                                                                                                  \
        const uint i = get_global_id(0);                                                               \
        if (i >= n)                                                                                    \
            return;                                                                                    \
        const float v = x[ox + i];                                                                     \
        y[oy + i] = (FWD);                                                                             \
    }                                                                                                  \
    __kernel void act_##NAME##_bwd(const uint n, const float alpha, __global const float *x,          \
                                   const uint ox, __global const float *y, const uint oy,              \
                                   __global const float *dy, const uint ody, __global float *dx,       \
                                   const uint odx)                                                     \
    {                                                                                                  \
        const uint i = get_global_id(0);                                                               \
        if (i >= n)                                                                                    \
            return;                                                                                    \
        const float g = dy[ody + i];                                                                   \
        dx[odx + i] = (BWD);                                                                           \
    }

ACT_KERNELS(relu, fmax(v, 0.0f), select(0.0f, g, y[oy + i] > 0.0f))
ACT_KERNELS(leaky, select(alpha * v, v, v > 0.0f), select(alpha * g, g, y[oy + i] > 0.0f))
ACT_KERNELS(sigmoid, 1.0f / (1.0f + exp(-v)), g * y[oy + i] * (1.0f - y[oy + i]))
ACT_KERNELS(tanh, tanh(v), g * (1.0f - y[oy + i] * y[oy + i]))
ACT_KERNELS(gelu, clg_gelu(v), g * clg_gelu_grad(x[ox + i]))
ACT_KERNELS(gelu_tanh, clg_gelu_tanh(v), g * clg_gelu_tanh_grad(x[ox + i]))

// GELU forward that also keeps its derivative: y = f(x) and x = f'(x) in place
// (the product's fallback for clg_gemm_args.gelu 3, 4; dmul_colsum_part then
// takes the backward).
#define ACT_FWD_D(NAME, FD)                                                                            \
    __kernel void NAME(const uint n, __global float *x, const uint ox, __global float *y, const uint oy) \
    {                                                                                                  \
        const uint i = get_global_id(0);                                                               \
        if (i >= n)                                                                                    \
            return;                                                                                    \
        float d;                                                                                       \
        y[oy + i] = FD(x[ox + i], &d);                                                                 \
        x[ox + i] = d;                                                                                 \
    }
ACT_FWD_D(act_gelu_fwd_d, clg_gelu_fd)
ACT_FWD_D(act_gelu_tanh_fwd_d, clg_gelu_tanh_fd)

// ---- fill ----
// y[oy + i] = v (clg_buf_fill: stores the simulator's shadow memory tracks,
// unlike clEnqueueFillBuffer under oclgrind 21.10, see tests/oclgrind_check.sh)
__kernel void fill(const uint n, const float v, __global float *y, const uint oy)
{
    const uint i = get_global_id(0);
    if (i < n)
        y[oy + i] = v;
}

// y[oy + i] = x[ox + i] (clg_nn_copy; the ranges do not overlap). A kernel
// rather than clEnqueueCopyBuffer: under oclgrind 21.10 a copy to a nonzero
// destination offset leaves the destination's shadow memory uninitialised.
__kernel void copy(const uint n, __global const float *x, const uint ox, __global float *y, const uint oy)
{
    const uint i = get_global_id(0);
    if (i < n)
        y[oy + i] = x[ox + i];
}

// ---- residual add ----
// y = a + b
__kernel void add2(const uint n, __global const float *a, const uint oa, __global const float *b, const uint ob,
                   __global float *y, const uint oy)
{
    const uint i = get_global_id(0);
    if (i >= n)
        return;
    y[oy + i] = a[oa + i] + b[ob + i];
}

// y += a
__kernel void add_acc(const uint n, __global const float *a, const uint oa, __global float *y, const uint oy)
{
    const uint i = get_global_id(0);
    if (i >= n)
        return;
    y[oy + i] += a[oa + i];
}

// ---- inverted dropout ----
// The keep decision for element i is a pure function of (seed, step,
// base + i): backward recomputes it, and a batch split across devices
// (base = first element of the share) draws the same mask as one device.
inline uint clg_mix32(uint h)
{
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

inline float clg_dropout_scale(const uint seed, const uint step, const uint idx, const float p, const float inv_keep)
{
    const uint h = clg_mix32(idx ^ clg_mix32(seed ^ clg_mix32(step + 0x9e3779b9u)));
    const float u = (float)(h >> 8) * (1.0f / 16777216.0f); // [0, 1)
    return select(0.0f, inv_keep, u >= p);
}

// y = x * mask / (1 - p)  (also dx = dy * mask / (1 - p))
__kernel void dropout(const uint n, const uint seed, const uint step, const uint base, const float p,
                      const float inv_keep, __global const float *x, const uint ox, __global float *y, const uint oy)
{
    const uint i = get_global_id(0);
    if (i >= n)
        return;
    y[oy + i] = x[ox + i] * clg_dropout_scale(seed, step, base + i, p, inv_keep);
}

// The same mask on a slice of each sample's features (tensor parallelism): element i of rows of len floats
// is element (i / len) * stride + i % len of the whole layer's rows of stride floats (base: the first one's).
__kernel void dropout_rows(const uint n, const uint seed, const uint step, const uint base, const float p,
                           const float inv_keep, __global const float *x, const uint ox, __global float *y,
                           const uint oy, const uint len, const uint stride)
{
    const uint i = get_global_id(0);
    if (i >= n)
        return;
    const uint q = i / len; // no '%' of the same operands: LLVM's freeze, which oclgrind 21.10 cannot run
    y[oy + i] = x[ox + i] * clg_dropout_scale(seed, step, base + q * stride + (i - q * len), p, inv_keep);
}

// ---- strided rows copy (concat, flatten) ----
// dst[od + r*sd + i] = src[os + r*ss + i], i < len, r < rows
__kernel void copy_rows(const uint len, const uint rows, __global const float *src, const uint os, const uint ss,
                        __global float *dst, const uint od, const uint sd)
{
    const uint i = get_global_id(0);
    const uint r = get_global_id(1);
    if (i >= len || r >= rows)
        return;
    dst[od + r * sd + i] = src[os + r * ss + i];
}

// ---- column sums (dense bias gradient) ----
// y[j] = sum_r x[r*cols + j]   (overwrites y)
__kernel void colsum(const uint rows, const uint cols, __global const float *x, const uint ox, __global float *y,
                     const uint oy)
{
    const uint j = get_global_id(0);
    if (j >= cols)
        return;
    float s = 0.0f;
    for (uint r = 0; r < rows; r++)
        s += x[ox + r * cols + j];
    y[oy + j] = s;
}

// ---- column sums of tall matrices in row chunks ----
// Work-item (j, c) sums rows [c R, min(rows, (c + 1) R)) of column j in row
// order into part[c cols + j]; colsum_fin adds the chunks in chunk order: a
// fixed order (bitwise reproducible), and cols x chunks work-items instead
// of cols (colsum's one work-item per column leaves all but one core idle
// on a 4096 x 128 bias gradient). The act_*_bwd_colsum_part forms also
// write dz = dy * f'(x) (x: the forward input) of the rows they sum.
#define COLSUM_PART(NAME, DZ, STORE)                                                                   \
    __kernel void NAME(const uint rows, const uint cols, const uint R, __global const float *x,        \
                       const uint ox, __global const float *dy, const uint ody, __global float *dz,    \
                       const uint odz, __global float *part)                                           \
    {                                                                                                  \
        const uint j = get_global_id(0), c = get_global_id(1);                                         \
        if (j >= cols)                                                                                 \
            return;                                                                                    \
        const uint r1 = min(rows, (c + 1) * R);                                                        \
        float s = 0.0f;                                                                                \
        for (uint r = c * R; r < r1; r++) {                                                            \
            const uint i = r * cols + j;                                                               \
            const float g = dy[ody + i];                                                               \
            const float v = (DZ);                                                                      \
            if (STORE)                                                                                 \
                dz[odz + i] = v;                                                                       \
            s += v;                                                                                    \
        }                                                                                              \
        part[c * cols + j] = s;                                                                        \
    }
COLSUM_PART(colsum_part, g, 0)
COLSUM_PART(act_gelu_bwd_colsum_part, g * clg_gelu_grad(x[ox + i]), 1)
COLSUM_PART(act_gelu_tanh_bwd_colsum_part, g * clg_gelu_tanh_grad(x[ox + i]), 1)
COLSUM_PART(dmul_colsum_part, g * x[ox + i], 1) // x: the derivative kept by forward

// The same on 8 columns per work-item in explicit float8 vectors (cols a
// multiple of 8): the compilers that vectorize across work-items do not
// across a loop like this one, and the GELU derivative's exp then ran
// scalar (10x the element-wise act_gelu_bwd on PoCL).
#define COLSUM_PART8(NAME, DZ, STORE)                                                                  \
    __kernel void NAME(const uint rows, const uint cols, const uint R, __global const float *x,        \
                       const uint ox, __global const float *dy, const uint ody, __global float *dz,    \
                       const uint odz, __global float *part)                                           \
    {                                                                                                  \
        const uint j = get_global_id(0) * 8, c = get_global_id(1);                                     \
        if (j >= cols)                                                                                 \
            return;                                                                                    \
        const uint r1 = min(rows, (c + 1) * R);                                                        \
        float8 s = (float8)(0.0f);                                                                     \
        for (uint r = c * R; r < r1; r++) {                                                            \
            const uint i = r * cols + j;                                                               \
            const float8 g = vload8(0, dy + ody + i), xv = STORE ? vload8(0, x + ox + i) : g;           \
            const float8 v = (DZ);                                                                     \
            if (STORE)                                                                                 \
                vstore8(v, 0, dz + odz + i);                                                           \
            s += v;                                                                                    \
        }                                                                                              \
        vstore8(s, 0, part + c * cols + j);                                                            \
    }
COLSUM_PART8(colsum_part8, g, 0) // the plain sum (bias gradients): the same sums as colsum_part
COLSUM_PART8(act_gelu_bwd_colsum_part8, g * clg_gelu_grad8(xv), 1)
COLSUM_PART8(act_gelu_tanh_bwd_colsum_part8, g * clg_gelu_tanh_grad8(xv), 1)
COLSUM_PART8(dmul_colsum_part8, g * xv, 1)

__kernel void colsum_fin(const uint cols, const uint chunks, __global const float *part, __global float *y,
                         const uint oy)
{
    const uint j = get_global_id(0);
    if (j >= cols)
        return;
    float s = 0.0f;
    for (uint c = 0; c < chunks; c++)
        s += part[c * cols + j];
    y[oy + j] = s;
}

// Dense backward through ReLU with its bias gradient in one pass (one
// work-item per column j): dz[r, j] = y[r, j] > 0 ? dy[r, j] : 0 (y: the
// forward output, as act_relu_bwd) and db[j] = sum_r dz[r, j] in row order
// (as colsum; overwrites db).
__kernel void relu_bwd_colsum(const uint rows, const uint cols, __global const float *y, const uint oy,
                              __global const float *dy, const uint ody, __global float *dz, const uint odz,
                              __global float *db, const uint odb)
{
    const uint j = get_global_id(0);
    if (j >= cols)
        return;
    float s = 0.0f;
    for (uint r = 0; r < rows; r++) {
        const size_t i = (size_t)r * cols + j;
        const float g = select(0.0f, dy[ody + i], y[oy + i] > 0.0f);
        dz[odz + i] = g;
        s += g;
    }
    db[odb + j] = s;
}

// ---- plane sums (conv bias gradient fallback) ----
// One work-group of 64 per channel c: y[c] = sum_{n, i < hw} x[n*C*hw + c*hw + i]
#ifndef PS_WG // reduction group (power of two; the host lowers it to the device's limit)
#define PS_WG 64
#endif
__kernel __attribute__((reqd_work_group_size(PS_WG, 1, 1))) void
plane_sum(const uint N, const uint C, const uint hw, __global const float *x, const uint ox, __global float *y,
          const uint oy)
{
    __local float part[PS_WG];
    const uint c = get_group_id(0);
    const uint lid = get_local_id(0);
    float s = 0.0f;
    for (uint n = 0; n < N; n++) {
        __global const float *p = x + ox + ((size_t)n * C + c) * hw;
        for (uint i = lid; i < hw; i += PS_WG)
            s += p[i];
    }
    part[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = PS_WG / 2; w > 0; w >>= 1) {
        if (lid < w)
            part[lid] += part[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        y[oy + c] = part[0];
}
