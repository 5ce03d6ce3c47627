// Precision conversion kernels for --precision fp16 (mixed precision).
//
// Storage is IEEE binary16 ("half"); every layer computes in fp32. Rounding
// float -> half is round-to-nearest-even (subnormals kept, overflow -> inf,
// NaN stays NaN); half -> float is exact.
//
// Without cl_khr_fp16 a `half` may only be reached through a pointer with
// vload_half / vstore_half_rte, which is what these kernels use. When the
// device has the extension the host builds with -D HAVE_FP16=1 and the
// kernels use the half type directly (same numerics: explicit rte
// conversions).
//
// Offsets and counts are in elements; every kernel is 1-D over n elements.
#ifdef HAVE_FP16
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#define LOAD_H(p, i) ((float)(p)[i])
#define STORE_H(v, p, i) ((p)[i] = convert_half_rte(v))
#else
#define LOAD_H(p, i) vload_half((i), (p))
#define STORE_H(v, p, i) vstore_half_rte((v), (i), (p))
#endif

// y[yoff + i] = half(x[xoff + i])
__kernel void f32_to_f16(__global const float *x, const int xoff, __global half *y, const int yoff, const int n)
{
    int i = get_global_id(0);
    if (i < n)
        STORE_H(x[xoff + i], y, yoff + i);
}

// y[yoff + i] = float(x[xoff + i])
__kernel void f16_to_f32(__global const half *x, const int xoff, __global float *y, const int yoff, const int n)
{
    int i = get_global_id(0);
    if (i < n)
        y[yoff + i] = LOAD_H(x, xoff + i);
}

// y[yoff + i] = half(float(y[yoff + i]) + x[xoff + i]): gradient summation
// where a tensor feeds several layers (the sum is formed in fp32, rounded once).
__kernel void f16_add_f32(__global half *y, const int yoff, __global const float *x, const int xoff, const int n)
{
    int i = get_global_id(0);
    if (i < n)
        STORE_H(LOAD_H(y, yoff + i) + x[xoff + i], y, yoff + i);
}

// Weights after an optimizer step: w16 = half(master) (the compact copy) and
// w32 = float(w16) (what the layer kernels read: exactly the half values).
__kernel void round_weights(__global const float *master, __global half *w16, __global float *w32, const int n)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    STORE_H(master[i], w16, i);
    w32[i] = LOAD_H(w16, i);
}

// Dynamic loss scaling: g *= inv_scale (a power of two: exact), and
// flag[0] = 1 when any result is inf or NaN (every writer stores the same value).
__kernel void unscale_check(__global float *g, const int n, const float inv_scale, __global int *flag)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float v = g[i] * inv_scale;
    if (!isfinite(v))
        flag[0] = 1;
    g[i] = v;
}

// The forward output stored in half and kept in fp32 for the next layer:
// y = half(x), x = float(y) (so the next layer reads exactly the stored values).
__kernel void f32_to_f16_keep(__global float *x, const int xoff, __global half *y, const int yoff, const int n)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    STORE_H(x[xoff + i], y, yoff + i);
    x[xoff + i] = LOAD_H(y, yoff + i);
}

// y = float(half(x)) (x == y allowed): a gradient handed straight to the
// next layer in fp32, rounded exactly as storing it in half and expanding
// it again would.
__kernel void f32_round_f16(__global float *x, const int xoff, __global float *y, const int yoff, const int n)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
#ifdef HAVE_FP16
    y[yoff + i] = (float)convert_half_rte(x[xoff + i]);
#else
    ushort t;
    vstore_half_rte(x[xoff + i], 0, (__private half *)&t);
    y[yoff + i] = vload_half(0, (__private const half *)&t);
#endif
}
