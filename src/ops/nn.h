/* Launchers for the non-GEMM network ops: activations, residual add,
 * dropout, row copies, bias sums, pooling, losses, batch normalization.
 * Kernels live in cl/eltwise.cl, cl/pool.cl, cl/softmax.cl, cl/norm.cl.
 * Buffers are fp32 device buffers; offsets and counts in elements, each
 * below 2^32 (checked). Every launcher only enqueues on dev->queue. */
#ifndef CLG_OPS_NN_H
#define CLG_OPS_NN_H

#include "device/device.h"

typedef enum clg_act {
    CLG_ACT_LINEAR = 0,
    CLG_ACT_RELU,
    CLG_ACT_LEAKY,   /* x > 0 ? x : alpha * x, alpha >= 0 */
    CLG_ACT_SIGMOID,
    CLG_ACT_TANH,
    CLG_ACT_GELU,    /* exact: x * Phi(x) (erf form) */
    CLG_ACT_GELU_TANH, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    CLG_ACT_COUNT
} clg_act;

/* "linear", "relu", "leaky", "sigmoid", "tanh", "gelu", "gelu_tanh"
 * (NULL-terminated, indexed by clg_act). */
CLG_INTERNAL const char *const *clg_act_names(void);
/* Activations whose backward reads the forward input x (the GELU forms). */
static inline int clg_act_needs_x(clg_act a) { return a == CLG_ACT_GELU || a == CLG_ACT_GELU_TANH; }

/* y = f(x) over n elements (y may be x: in place). Linear copies unless
 * y == x at the same offset. */
CLG_INTERNAL clg_status clg_nn_act_forward(clg_device *dev, clg_act act, float alpha, size_t n, cl_mem x,
                                           size_t ox, cl_mem y, size_t oy);
/* dx = dy * f'(.) over n elements. y is the forward output; x the forward
 * input, read only by the GELU forms (may be NULL otherwise). dx may alias dy. */
CLG_INTERNAL clg_status clg_nn_act_backward(clg_device *dev, clg_act act, float alpha, size_t n, cl_mem x,
                                            size_t ox, cl_mem y, size_t oy, cl_mem dy, size_t ody, cl_mem dx,
                                            size_t odx);

/* y = a + b */
CLG_INTERNAL clg_status clg_nn_add(clg_device *dev, size_t n, cl_mem a, size_t oa, cl_mem b, size_t ob, cl_mem y,
                                   size_t oy);
/* y += a */
CLG_INTERNAL clg_status clg_nn_add_acc(clg_device *dev, size_t n, cl_mem a, size_t oa, cl_mem y, size_t oy);
/* dst = src (n elements) */
CLG_INTERNAL clg_status clg_nn_copy(clg_device *dev, size_t n, cl_mem src, size_t os, cl_mem dst, size_t od);
/* dst[od + r*sd + i] = src[os + r*ss + i] for r < rows, i < len */
CLG_INTERNAL clg_status clg_nn_copy_rows(clg_device *dev, size_t len, size_t rows, cl_mem src, size_t os,
                                         size_t ss, cl_mem dst, size_t od, size_t sd);

/* Inverted dropout: y = x * keep / (1 - p) with keep = hash(seed, step,
 * base + i) >= p, i < n. Backward is the same call on dy -> dx. */
CLG_INTERNAL clg_status clg_nn_dropout(clg_device *dev, size_t n, float p, uint32_t seed, uint32_t step,
                                       uint32_t base, cl_mem x, size_t ox, cl_mem y, size_t oy);
/* The same on rows of len of the stride features a sample has in the whole layer: element i's mask is that of
 * element base + (i / len) * stride + i % len (a tensor-parallel lane's slice of the features). */
CLG_INTERNAL clg_status clg_nn_dropout_rows(clg_device *dev, size_t n, float p, uint32_t seed, uint32_t step,
                                            uint32_t base, size_t len, size_t stride, cl_mem x, size_t ox, cl_mem y,
                                            size_t oy);
/* Host mirror of the kernel's keep decision (for tests): scale 0 or 1/(1-p). */
CLG_INTERNAL float clg_nn_dropout_scale_host(uint32_t seed, uint32_t step, uint32_t idx, float p);

/* y[j] = sum_r x[r*cols + j] (overwrites): the bias gradient of a dense
 * layer. In row order up to 511 rows; from 512 rows in chunks of 64 rows
 * (in row order each), then the chunks in order: fixed, reproducible. */
CLG_INTERNAL clg_status clg_nn_colsum(clg_device *dev, size_t rows, size_t cols, cl_mem x, size_t ox, cl_mem y,
                                      size_t oy);
/* Dense backward through ReLU and its bias gradient in one launch:
 * dz = y > 0 ? dy : 0 (y: the forward output, rows x cols), db[j] = sum_r
 * dz[r, j] (overwrites); the same values as clg_nn_act_backward + clg_nn_colsum. */
CLG_INTERNAL clg_status clg_nn_relu_bwd_colsum(clg_device *dev, size_t rows, size_t cols, cl_mem y, size_t oy,
                                               cl_mem dy, size_t ody, cl_mem dz, size_t odz, cl_mem db, size_t odb);
/* Dense backward through a GELU form (act CLG_ACT_GELU or _GELU_TANH, else
 * CLG_ERR_UNSUPPORTED) and its bias gradient in one pass over the rows:
 * dz = dy * f'(x) (x: the forward input, rows x cols; dz may alias dy),
 * db[j] = sum_r dz[r, j] (overwrites) in chunks of 64 rows, then the chunks
 * in order; the same values as clg_nn_act_backward + clg_nn_colsum. */
CLG_INTERNAL clg_status clg_nn_act_bwd_colsum(clg_device *dev, clg_act act, size_t rows, size_t cols, cl_mem x,
                                              size_t ox, cl_mem dy, size_t ody, cl_mem dz, size_t odz, cl_mem db,
                                              size_t odb);
/* dz = dy * d (d: an activation's derivative kept by forward, rows x cols;
 * dz may alias dy), db = colsum(dz) as clg_nn_act_bwd_colsum. */
CLG_INTERNAL clg_status clg_nn_dmul_colsum(clg_device *dev, size_t rows, size_t cols, cl_mem d, size_t od, cl_mem dy,
                                           size_t ody, cl_mem dz, size_t odz, cl_mem db, size_t odb);
/* GELU forward keeping its derivative (act CLG_ACT_GELU or _GELU_TANH, else
 * CLG_ERR_UNSUPPORTED): y = f(x), then x = f'(x) in place (n elements). */
CLG_INTERNAL clg_status clg_nn_act_forward_d(clg_device *dev, clg_act act, size_t n, cl_mem x, size_t ox, cl_mem y,
                                             size_t oy);
/* y[c] = sum over n and the hw plane of x (N, C, hw) (overwrites). */
CLG_INTERNAL clg_status clg_nn_plane_sum(clg_device *dev, int N, int C, size_t hw, cl_mem x, size_t ox, cl_mem y,
                                         size_t oy);

typedef struct clg_pool_shape {
    int N, C, H, W;
    int kh, kw, sh, sw, ph, pw;
} clg_pool_shape;
/* PyTorch floor rule; <= 0 when the window does not fit. */
CLG_INTERNAL int clg_pool_out_h(const clg_pool_shape *s);
CLG_INTERNAL int clg_pool_out_w(const clg_pool_shape *s);
/* is_max 1: max pooling (padding -inf, gradient to the first maximum);
 * 0: average pooling (padding counted in the divisor, as PyTorch's default). */
CLG_INTERNAL clg_status clg_nn_pool_forward(clg_device *dev, int is_max, const clg_pool_shape *s, cl_mem x,
                                            size_t ox, cl_mem y, size_t oy);
/* dx (overwritten) from dy; x (the forward input) read by max pooling only.
 * relu 1 (where clg_nn_pool_relu_foldable): x is a relu's output and dx also
 * carries the relu's derivative (the gradient of the relu's input). */
CLG_INTERNAL clg_status clg_nn_pool_backward(clg_device *dev, int is_max, const clg_pool_shape *s, cl_mem x,
                                             size_t ox, cl_mem dy, size_t ody, cl_mem dx, size_t odx, int relu);
/* 1 when clg_nn_pool_backward can fold a relu's derivative (2x2 stride-2 max pooling of even planes). */
CLG_INTERNAL int clg_nn_pool_relu_foldable(int is_max, const clg_pool_shape *s);
/* Global average pooling over hw per plane (planes = N*C). */
CLG_INTERNAL clg_status clg_nn_gap_forward(clg_device *dev, size_t planes, size_t hw, cl_mem x, size_t ox, cl_mem y,
                                           size_t oy);
CLG_INTERNAL clg_status clg_nn_gap_backward(clg_device *dev, size_t planes, size_t hw, cl_mem dy, size_t ody,
                                            cl_mem dx, size_t odx);

/* Softmax + cross-entropy over C classes for N samples: p = softmax(x);
 * loss[s], correct[s] per sample (scratch, N floats each); then
 * clg_nn_loss_reduce folds them into result[0..1]. */
CLG_INTERNAL clg_status clg_nn_softmax_xent_forward(clg_device *dev, int N, int C, cl_mem x, size_t ox, cl_mem p,
                                                    size_t op, cl_mem labels, size_t ol, cl_mem loss,
                                                    cl_mem correct);
/* Largest N * C for clg_nn_softmax_xent_forward_reduce (one work-group
 * does all samples: small batches of few classes). */
#define CLG_SM_FUSED_MAX 16384
/* Softmax + cross-entropy forward and the loss reduction in one launch:
 * p = softmax(x), result[0] = loss sum, result[1] = correct count (as
 * clg_nn_softmax_xent_forward + clg_nn_loss_reduce, no per-sample scratch);
 * N * C at most CLG_SM_FUSED_MAX. */
CLG_INTERNAL clg_status clg_nn_softmax_xent_forward_reduce(clg_device *dev, int N, int C, cl_mem x, size_t ox,
                                                           cl_mem p, size_t op, cl_mem labels, size_t ol,
                                                           cl_mem result);
/* dx = scale * (p - onehot(label)) */
CLG_INTERNAL clg_status clg_nn_softmax_xent_backward(clg_device *dev, int N, int C, float scale, cl_mem p, size_t op,
                                                     cl_mem labels, size_t ol, cl_mem dx, size_t odx);
/* Softmax over each of N rows of C values: y = softmax(x) (y may be x). */
CLG_INTERNAL clg_status clg_nn_softmax_forward(clg_device *dev, int N, int C, cl_mem x, size_t ox, cl_mem y,
                                               size_t oy);
/* dx = y * (dy - sum_c dy * y) per row, y the forward output (dx may alias dy). */
CLG_INTERNAL clg_status clg_nn_softmax_backward(clg_device *dev, int N, int C, cl_mem y, size_t oy, cl_mem dy,
                                                size_t ody, cl_mem dx, size_t odx);
/* MSE per sample over F features: loss[s] = mean (x - t)^2; y = x. */
CLG_INTERNAL clg_status clg_nn_mse_forward(clg_device *dev, int N, int F, cl_mem x, size_t ox, cl_mem t, size_t ot,
                                           cl_mem y, size_t oy, cl_mem loss, cl_mem correct);
/* dx = scale * 2 (x - t) / F */
CLG_INTERNAL clg_status clg_nn_mse_backward(clg_device *dev, int N, int F, float scale, cl_mem x, size_t ox,
                                            cl_mem t, size_t ot, cl_mem dx, size_t odx);
/* result[0] = sum loss[0..N), result[1] = sum correct[0..N). */
CLG_INTERNAL clg_status clg_nn_loss_reduce(clg_device *dev, int N, cl_mem loss, cl_mem correct, cl_mem result);

/* Batch normalization, x (N, C, HW). Training: batch statistics into
 * mean/invstd (C floats each, kept for backward; mean is stored shifted,
 * as batch mean - x[0, c, 0], so x - mean keeps its precision when the
 * mean is large against the spread); update_running moves
 * rmean/rvar with momentum (PyTorch convention, unbiased running_var). */
CLG_INTERNAL clg_status clg_nn_bn_forward_train(clg_device *dev, int N, int C, size_t HW, float eps, float momentum,
                                                int update_running, cl_mem x, size_t ox, cl_mem y, size_t oy,
                                                cl_mem gamma, cl_mem beta, cl_mem rmean, cl_mem rvar, cl_mem mean,
                                                cl_mem invstd);
CLG_INTERNAL clg_status clg_nn_bn_forward_infer(clg_device *dev, int N, int C, size_t HW, float eps, cl_mem x,
                                                size_t ox, cl_mem y, size_t oy, cl_mem gamma, cl_mem beta,
                                                cl_mem rmean, cl_mem rvar);
/* Batch norm with its fused epilogue (the fusion pass, src/model/fuse.c):
 * y = relu(bn(x) + r), or relu(bn(x)) when r is NULL; training: the batch
 * statistics (exact, as clg_nn_bn_forward_train, running stats moved),
 * else the running ones. */
CLG_INTERNAL clg_status clg_nn_bn_forward_relu(clg_device *dev, int N, int C, size_t HW, float eps, float momentum,
                                               int training, cl_mem x, size_t ox, cl_mem r, size_t orr, cl_mem y,
                                               size_t oy, cl_mem gamma, cl_mem beta, cl_mem rmean, cl_mem rvar,
                                               cl_mem mean, cl_mem invstd);
/* Its backward from y (the stored output) and dy: g = dy where y > 0, else
 * 0; dgamma, dbeta, dx (may be NULL) as clg_nn_bn_backward from g, and dr
 * (may be NULL) = g, the residual's gradient. beta: the forward's beta for
 * relu(bn(x)) (the row forms then recompute the mask from x, gamma and
 * beta, which must be the forward's), NULL after relu(bn(x) + r). */
CLG_INTERNAL clg_status clg_nn_bn_backward_relu(clg_device *dev, int N, int C, size_t HW, cl_mem x, size_t ox,
                                                cl_mem y, size_t oy, cl_mem dy, size_t ody, cl_mem mean,
                                                cl_mem invstd, cl_mem gamma, cl_mem beta, cl_mem dgamma,
                                                cl_mem dbeta, cl_mem dx, size_t odx, cl_mem dr, size_t odr);
/* Gradients for training-mode statistics: dgamma, dbeta overwritten; dx
 * (may be NULL: skipped) overwritten. */
CLG_INTERNAL clg_status clg_nn_bn_backward(clg_device *dev, int N, int C, size_t HW, cl_mem x, size_t ox, cl_mem dy,
                                           size_t ody, cl_mem mean, cl_mem invstd, cl_mem gamma, cl_mem dgamma,
                                           cl_mem dbeta, cl_mem dx, size_t odx);

/* Synchronized batch norm (statistics over several devices' slices): the
 * local sums, then the global statistics in (gathered and combined on the
 * host, see layer_batchnorm.c).
 *   stats_local: st3 = {K, sum (x - K), sum (x - K)^2} per channel (3C floats)
 *   sync_apply:  g4 = {mean - K, invstd, mean, unbiased var} (4 vectors of
 *                C): sets mean/invstd, moves the running stats, normalizes
 *   bwd_local:   dgamma/dbeta of this slice, st2 = {sum dy, sum dy (x - mean)}
 *   bwd_data_sync: g2 = those sums over every device (2 vectors of C), M the
 *                values per channel over every device: dx (gdg, gdb scratch
 *                of C floats). */
CLG_INTERNAL clg_status clg_nn_bn_stats_local(clg_device *dev, int N, int C, size_t HW, cl_mem x, size_t ox,
                                              cl_mem st3);
CLG_INTERNAL clg_status clg_nn_bn_sync_apply(clg_device *dev, int N, int C, size_t HW, float momentum,
                                             int update_running, cl_mem g4, cl_mem x, size_t ox, cl_mem y, size_t oy,
                                             cl_mem gamma, cl_mem beta, cl_mem rmean, cl_mem rvar, cl_mem mean,
                                             cl_mem invstd);
CLG_INTERNAL clg_status clg_nn_bn_bwd_local(clg_device *dev, int N, int C, size_t HW, cl_mem x, size_t ox, cl_mem dy,
                                            size_t ody, cl_mem mean, cl_mem invstd, cl_mem dgamma, cl_mem dbeta,
                                            cl_mem st2);
CLG_INTERNAL clg_status clg_nn_bn_bwd_data_sync(clg_device *dev, int N, int C, size_t HW, double M, cl_mem g2,
                                                cl_mem x, size_t ox, cl_mem dy, size_t ody, cl_mem mean, cl_mem invstd,
                                                cl_mem gamma, cl_mem gdg, cl_mem gdb, cl_mem dx, size_t odx);

#endif
