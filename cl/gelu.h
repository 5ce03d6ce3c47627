// GELU arithmetic shared by cl/eltwise.cl (act_gelu*, the fused GELU backward
// + column sums) and cl/gemm.cl (the GEMM epilogue), so the two cannot drift
// apart. Not a program of its own: a `#include "gelu.h"` line of a .cl file is
// replaced by this file's text, by tools/embed_cl.py at build time and by the
// program loader for CLGRAD_KERNEL_DIR sources (src/device/program.c).
//
// CLG_GELU_FNS(T, SUF) defines, for T = float or a float vector:
//   clg_phi##SUF(x)             standard normal CDF Phi(x)
//   clg_gelu##SUF(x)            x Phi(x)                         (erf form)
//   clg_gelu_grad##SUF(x)       Phi(x) + x phi(x)                (its derivative)
//   clg_gelu_tanh_s##SUF(x)     s = 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)), u = k (x + 0.044715 x^3)
//   clg_gelu_tanh##SUF(x)       x s                              (tanh form)
//   clg_gelu_tanh_grad##SUF(x)  s + x s (1 - s) 2k (1 + 3 * 0.044715 x^2)
//   clg_gelu_fd##SUF(x, &d), clg_gelu_tanh_fd##SUF(x, &d)
//                               the form's value, with its derivative in d (the same
//                               arithmetic as the two functions above, Phi or s once)
// with k = sqrt(2 / pi). x s has no 1 + tanh cancellation in the negative tail.
//
// Phi(x) = (1 + erf(x / sqrt 2)) / 2 with erfc(z) = t exp(-z^2 + P(t)), t = 1 /
// (1 + z / 2), P a degree-9 Chebyshev fit (Press et al., Numerical Recipes 6.2,
// erfcc: fractional error below 1.2e-7 for every z >= 0). Built from exp and
// arithmetic so it vectorizes (the built-in erf is a scalar call on some CPU
// back-ends, 20x slower); for x < 0 Phi = erfc(|x| / sqrt 2) / 2 directly, and
// the fit's error is relative, so the tail keeps its relative accuracy (no 1 -
// erf cancellation; -x^2 / 2 + P in one fma). In fp32: relative error <= 1.2e-6
// on [-4, 0], 6e-6 on [-9, -4], 3e-7 for x >= 0. (Abramowitz & Stegun 7.1.26,
// used before, has an absolute error bound: 2e-4 relative at x = -3.5, 38% far
// in the tail.)
#ifndef CLG_GELU_H
#define CLG_GELU_H

#define CLG_SQRT1_2 0.70710678118654752f
#define CLG_INV_SQRT_2PI 0.39894228040143268f
#define CLG_GELU_K 0.79788456080286536f
#define CLG_GELU_A 0.044715f

#define CLG_GELU_FNS(T, SUF)                                                                           \
    inline T clg_phi##SUF(const T x)                                                                   \
    {                                                                                                  \
        const T a = fabs(x);                                                                           \
        const T t = (T)(1.0f) / fma((T)(0.5f * CLG_SQRT1_2), a, (T)(1.0f));                            \
        T p = fma(t, (T)(0.17087277f), (T)(-0.82215223f));                                             \
        p = fma(p, t, (T)(1.48851587f));                                                               \
        p = fma(p, t, (T)(-1.13520398f));                                                              \
        p = fma(p, t, (T)(0.27886807f));                                                               \
        p = fma(p, t, (T)(-0.18628806f));                                                              \
        p = fma(p, t, (T)(0.09678418f));                                                               \
        p = fma(p, t, (T)(0.37409196f));                                                               \
        p = fma(p, t, (T)(1.00002368f));                                                               \
        p = fma(p, t, (T)(-1.26551223f));                                                              \
        const T half_erfc = (T)(0.5f) * t * exp(fma((T)(-0.5f) * a, a, p));                           \
        return select(half_erfc, (T)(1.0f) - half_erfc, x >= (T)(0.0f));                               \
    }                                                                                                  \
    inline T clg_gelu##SUF(const T v) { return v * clg_phi##SUF(v); }                                  \
    inline T clg_gelu_grad##SUF(const T v)                                                             \
    {                                                                                                  \
        return clg_phi##SUF(v) + v * (T)(CLG_INV_SQRT_2PI) * exp((T)(-0.5f) * v * v);                  \
    }                                                                                                  \
    inline T clg_gelu_tanh_s##SUF(const T v)                                                           \
    {                                                                                                  \
        return (T)(1.0f) / ((T)(1.0f) + exp((T)(-2.0f * CLG_GELU_K) * fma((T)(CLG_GELU_A) * v * v, v, v))); \
    }                                                                                                  \
    inline T clg_gelu_tanh##SUF(const T v) { return v * clg_gelu_tanh_s##SUF(v); }                     \
    inline T clg_gelu_tanh_grad##SUF(const T v)                                                        \
    {                                                                                                  \
        const T s = clg_gelu_tanh_s##SUF(v);                                                           \
        return fma(v * s * ((T)(1.0f) - s), (T)(2.0f * CLG_GELU_K) * fma((T)(3.0f * CLG_GELU_A), v * v, (T)(1.0f)), s); \
    }                                                                                                  \
    inline T clg_gelu_fd##SUF(const T v, T *d)                                                         \
    {                                                                                                  \
        const T p = clg_phi##SUF(v);                                                                   \
        *d = p + v * (T)(CLG_INV_SQRT_2PI) * exp((T)(-0.5f) * v * v);                                  \
        return v * p;                                                                                  \
    }                                                                                                  \
    inline T clg_gelu_tanh_fd##SUF(const T v, T *d)                                                    \
    {                                                                                                  \
        const T s = clg_gelu_tanh_s##SUF(v);                                                           \
        *d = fma(v * s * ((T)(1.0f) - s), (T)(2.0f * CLG_GELU_K) * fma((T)(3.0f * CLG_GELU_A), v * v, (T)(1.0f)), s); \
        return v * s;                                                                                  \
    }

#endif // CLG_GELU_H
