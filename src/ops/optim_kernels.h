/* Launchers of the optimizer kernels (cl/optim.cl, cl/convert.cl
 * `unscale_check`): the parameter update (SGD, Adam/AdamW), squared-norm
 * partial sums, the fp16 unscale/overflow check and the summing of lanes'
 * gradient buckets. They take plain buffers (one tensor or a whole
 * parameter arena) and scalars; the optimizer (model/optim.c) and the
 * data-parallel reduction (parallel/dreduce.c) call them and never set
 * kernel arguments themselves. Counts and offsets in floats; every launcher
 * only enqueues on dev->queue. */
#ifndef CLG_OPS_OPTIM_KERNELS_H
#define CLG_OPS_OPTIM_KERNELS_H

#include "device/device.h"

/* One SGD step over w[0..n): with momentum m (unused, may be g, when
 * momentum is 0), weight decay, Nesterov; the raw gradient g is multiplied
 * by gscale first. decay_mask (NULL: every element decays): n bytes, the
 * weight decay applies to element i only where byte i is not 0. */
typedef struct clg_sgd_step_args {
    cl_mem w, g, m;
    int n;
    float lr, momentum, weight_decay;
    int nesterov;
    float gscale;
    cl_mem decay_mask;
} clg_sgd_step_args;

/* One Adam / AdamW step over w[0..n) with moments m, v; omb1, omb2 are
 * 1 - beta1, 1 - beta2 and bc1, bc2 the bias corrections 1 - beta^t
 * (computed in double by the caller); decoupled: AdamW's weight decay. */
typedef struct clg_adam_step_args {
    cl_mem w, g, m, v;
    int n;
    float lr, beta1, beta2, omb1, omb2, eps, weight_decay;
    int decoupled;
    float bc1, bc2, gscale;
    cl_mem decay_mask; /* as in clg_sgd_step_args */
} clg_adam_step_args;

/* Work-group size of the element-wise updates (a sharded update aligns its
 * slices to it, so its launch groups the elements as the whole arena's). */
#define CLG_OPTK_STEP_WG 64

CLG_INTERNAL clg_status clg_optk_sgd_step(clg_device *dev, const clg_sgd_step_args *a);
CLG_INTERNAL clg_status clg_optk_adam_step(clg_device *dev, const clg_adam_step_args *a);

/* Partial sums of squares of x[0..n) into partial[off .. off + *groups):
 * *groups = max(1, min(max_groups, n / group size rounded up)) work-groups
 * of the reduction's fixed size (the device's largest power of two up to 256). */
CLG_INTERNAL clg_status clg_optk_sumsq_partial(clg_device *dev, cl_mem x, int n, cl_mem partial, int off,
                                               int max_groups, int *groups);

/* The squared norm of a reduced gradient bucket x[0..n) exactly as
 * lane_add (sq set, max_groups slots) computes it on a device whose
 * reduction group is wg (clg_optk_red_wg): the same float sums per work-item
 * and the same tree per group, then the groups' partials added in double in
 * group order, as the device path adds the partials it reads back. The host
 * and the device-to-device reduction thus give the same norm to the bit
 * (IEEE single precision, no contraction on either side; a device flushing
 * denormal squares to zero could differ in the last bit). */
CLG_INTERNAL double clg_optk_sumsq_host(const float *x, size_t n, int wg, int max_groups);
/* clg_optk_sumsq_host in parts, so that several threads can share a bucket:
 * grid: the work-items (global, returned) of a bucket of n floats, *wg clamped
 * as the host path clamps it; part: for the work-items [t0, t1) of global,
 * every element i < n with i mod global in [t0, t1) of y = src[0] + ... +
 * src[m-1] (added in that order; m = 0: zeros; y may be NULL: not stored),
 * and acc[t] = the float sum of those elements' squares per work-item in
 * element order; tree: the squared norm from acc[0 .. groups * wg) (each
 * group's tree, then the groups added in double in order). Parts covering
 * [0, global) give clg_optk_sumsq_host's result to the bit. */
CLG_INTERNAL size_t clg_optk_sumsq_grid(size_t n, int *wg, int max_groups);
CLG_INTERNAL void clg_optk_sum_sq_part(float *y, const float *const *src, int m, size_t n, size_t global, size_t t0,
                                       size_t t1, float *acc);
/* The same part with the sum stored back into every buf[l] (what the part read from them) instead of a y. */
CLG_INTERNAL void clg_optk_sum_sq_back(float *const *buf, int m, size_t n, size_t global, size_t t0, size_t t1,
                                       float *acc);
CLG_INTERNAL double clg_optk_sumsq_tree(const float *items, int wg, size_t groups);

/* The work-group size lane_add runs with on dev (builds the program). */
CLG_INTERNAL clg_status clg_optk_red_wg(clg_device *dev, int *wg);

/* g[0..n) *= inv_scale in place; *flag (an int on the device) is set to 1
 * when a result is inf or NaN (never cleared here). */
CLG_INTERNAL clg_status clg_optk_unscale_check(clg_device *dev, cl_mem g, int n, float inv_scale, cl_mem flag);

/* dst[k0 .. k0 + n) = a[k0 ..] (+ b[k0 ..] when b is not NULL), the lane sum
 * of a gradient bucket; with sq the partial sums of squares of the result go
 * to partial[off .. off + groups) with groups = the max_groups slots (slots
 * past the groups used are zeroed first). ev (may be NULL) receives the
 * launch's event. */
CLG_INTERNAL clg_status clg_optk_lane_add(clg_device *dev, cl_mem dst, cl_mem a, cl_mem b, size_t k0, size_t n, int sq,
                                          cl_mem partial, int off, int max_groups, cl_event *ev);

#endif
