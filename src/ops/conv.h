/* Convolution launchers. Tensors are NCHW fp32 in device buffers, offsets in
 * elements. Legend: x (N,C,H,W)  w (K,C/groups,R,S)  y (N,K,P,Q)  bias (K)
 * with P = (H + 2*pad_h - dil_h*(R-1) - 1)/stride_h + 1, likewise Q. */
#ifndef CLG_OPS_CONV_H
#define CLG_OPS_CONV_H

#include "device/device.h"

typedef enum clg_conv_algo {
    CLG_CONV_AUTO = 0,
    CLG_CONV_IM2COL,    /* im2col + GEMM (any shape), col2im for bwd-data */
    CLG_CONV_WINOGRAD,  /* F(2x2,3x3), 3x3 stride 1 */
    CLG_CONV_WINOGRAD4, /* F(4x4,3x3), 3x3 stride 1 */
    CLG_CONV_DIRECT,    /* direct kernel (depthwise and small cases) */
    CLG_CONV_FFT,       /* clFFT, large kernels, forward */
    CLG_CONV_WINOGRAD_FUSED,  /* F(2x2,3x3) one-launch fused kernel, fwd + bwd-data; F(3x3,2x2) bwd-filter */
    CLG_CONV_WINOGRAD4_FUSED, /* F(4x4,3x3) one-launch fused kernel, fwd + bwd-data */
    CLG_CONV_ALGO_COUNT
} clg_conv_algo;

typedef enum clg_conv_pass { CLG_CONV_FWD = 0, CLG_CONV_BWD_DATA, CLG_CONV_BWD_FILTER } clg_conv_pass;

typedef struct clg_conv_shape {
    int N, C, H, W; /* input */
    int K, R, S;    /* filters: K outputs, R x S window */
    int pad_h, pad_w, stride_h, stride_w, dil_h, dil_w, groups;
} clg_conv_shape;

/* Output height/width; <= 0 when the shape is invalid. */
CLG_INTERNAL int clg_conv_out_h(const clg_conv_shape *s);
CLG_INTERNAL int clg_conv_out_w(const clg_conv_shape *s);
/* Validates a shape; error message names the bad field. */
CLG_INTERNAL clg_status clg_conv_check(clg_err *err, const clg_conv_shape *s);
/* Whether algo can run this shape/pass. */
CLG_INTERNAL int clg_conv_algo_supported(clg_conv_algo algo, const clg_conv_shape *s, clg_conv_pass pass);
CLG_INTERNAL const char *clg_conv_algo_name(clg_conv_algo algo);
/* Parses "auto", "im2col", "winograd", "winograd4", "direct", "fft",
 * "winograd-fused", "winograd4-fused". */
CLG_INTERNAL clg_status clg_conv_algo_parse(clg_err *err, const char *name, clg_conv_algo *out);

/* Weight-derived state cached between calls (e.g. Winograd-transformed
 * filters). The caller owns one per layer and bumps `weights_version`
 * whenever the weights change (after an optimizer step); launchers rebuild
 * the cache when the version differs. Free with clg_conv_cache_free. */
typedef struct clg_conv_cache {
    uint64_t weights_version;
    uint64_t built_version[CLG_CONV_ALGO_COUNT];
    cl_mem transformed[CLG_CONV_ALGO_COUNT];
    clg_conv_algo chosen[3]; /* per pass, resolved from AUTO; 0 = not chosen yet */
    unsigned chosen_gen;     /* clg_conv_auto_generation() when chosen: older choices resolve again */
    /* (added) backward-data filter transforms (flipped/transposed filters) */
    uint64_t built_version_bwd[CLG_CONV_ALGO_COUNT];
    cl_mem transformed_bwd[CLG_CONV_ALGO_COUNT];
} clg_conv_cache;
/* The automatic algorithm choices in force, for checkpoints: a resumed run
 * computes with the algorithms the interrupted one used, whatever the
 * cache file holds by then or a new measurement would pick.
 * clg_conv_auto_state appends, for the context's devices, every (device,
 * shape, pass) resolved in this process as "<device hash> <shape key>
 * <algorithm>;" and every shape still served by the default while its
 * measurement waits (option conv_auto_defer) as "<device hash> <shape key>
 * ~<uses so far>;". clg_conv_auto_pin takes such a text back: the algorithms
 * are pinned (they go ahead of the cache file and of measuring, for the rest
 * of the process) and the pending uses restored, so a deferred shape is
 * measured at the same use as in the uninterrupted run; entries of other
 * devices are skipped (logged); a malformed entry fails with CLG_ERR_FORMAT
 * naming `what` and the entry's number. Layers resolve again after a pin
 * (clg_conv_auto_generation). */
CLG_INTERNAL void clg_conv_auto_state(clg_ctx *ctx, clg_sbuf *out);
CLG_INTERNAL clg_status clg_conv_auto_pin(clg_ctx *ctx, clg_err *err, const char *state, const char *what);
CLG_INTERNAL unsigned clg_conv_auto_generation(void);
/* Training's per-layer profile: a convolution layer of shape s (s->N: the
 * batch it ran) spent fwd_ms and bwd_ms (backward-data + backward-filter;
 * <= 0: not measured) of kernel time per step over `steps` steps. From 3
 * steps on, an automatic choice the process computed with whose kernels ran
 * over 1.5x its recorded figure is marked in the algorithm cache to be
 * measured again at the next run (never in this one). */
CLG_INTERNAL void clg_conv_auto_observe(clg_device *dev, const clg_conv_shape *s, double fwd_ms, double bwd_ms,
                                        int steps);

/* A zero-initialised clg_conv_cache is empty; transforms count as built only
 * while transformed[a] != NULL and built_version[a] == weights_version. */
CLG_INTERNAL void clg_conv_cache_free(clg_device *dev, clg_conv_cache *c);

/* y = act(conv(x, w) + bias); bias may be NULL; relu 0/1. */
CLG_INTERNAL clg_status clg_conv_forward(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo,
                                         clg_conv_cache *cache, cl_mem x, size_t offx, cl_mem w, size_t offw,
                                         cl_mem bias, size_t offb, int relu, cl_mem y, size_t offy);
/* dx = conv_transpose(dy, w) (overwrites dx). */
CLG_INTERNAL clg_status clg_conv_backward_data(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo,
                                               clg_conv_cache *cache, cl_mem dy, size_t offdy, cl_mem w,
                                               size_t offw, cl_mem dx, size_t offdx);
/* dw = beta * dw + corr(x, dy); db (may be NULL) = beta * db + sum_{n,p,q} dy. */
CLG_INTERNAL clg_status clg_conv_backward_filter(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo,
                                                 cl_mem x, size_t offx, cl_mem dy, size_t offdy, float beta,
                                                 cl_mem dw, size_t offdw, cl_mem db, size_t offdb);

#endif
