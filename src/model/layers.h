/* Layer modules (one src/model/layer_<type>.c each) and helpers they share.
 *
 * Section types and keys (see docs/formats.md):
 *   [convolutional] / [conv]  filters, size | size_h+size_w, stride=1, pad=0,
 *                             dilation=1, groups=1, bias=1, activation=linear,
 *                             alpha=0.01 (leaky), algo=auto|im2col|winograd|
 *                             winograd4|direct|fft
 *   [dense] / [connected]     units, bias=1, activation=linear, alpha=0.01,
 *                             tie=NAME (an [embedding]'s table as the weight);
 *                             per position on a sequence (N, T, C)
 *   [embedding]               vocab, dim: token ids -> sequence (N, T, dim)
 *   [posembed]                context: sequence + learned (context, C) table
 *   [layernorm]               eps=1e-5, affine=1 (over C at each position)
 *   [maxpool] [avgpool]       size, stride=size, pad=0 (pad <= size/2)
 *   [gap]                     global average pooling -> (N, C, 1, 1)
 *   [activation]              type=relu|leaky|sigmoid|tanh|gelu|gelu_tanh, alpha=0.01
 *   [batchnorm]               eps=1e-5, momentum=0.1
 *   [dropout]                 p=0.5
 *   [flatten] [add] [concat]
 *   [softmax]                 softmax + cross-entropy (int32 labels); on a
 *                             sequence: at every position (N*T labels),
 *                             label_smoothing=0
 *   [mse]                     mean squared error (float targets like the input)
 *
 * Activations: relu is fused into the conv/GEMM epilogue; the others run a
 * separate kernel in place on the output. A replica's fusion pass
 * (src/model/fuse.c, option bn_fuse) folds a relu [activation], or an [add]
 * + relu, that follows a [batchnorm] into the batch norm's apply pass. GELU layers inside dense/conv keep
 * their pre-activation (a private buffer) for backward. GELU is the erf form
 * x * Phi(x), Phi from an erfc approximation with |error| <= 1.5e-7.
 *
 * Semantics follow PyTorch: pooling floors the output size; max pooling pads
 * with -inf and routes the gradient to the first maximum of each window;
 * average pooling counts padding in the divisor (count_include_pad=True);
 * batchnorm's running_var uses the unbiased batch variance; softmax's loss
 * is the per-sample cross-entropy summed over the batch (a label outside
 * [0, classes) gives a NaN loss); mse's per-sample loss is the mean over the
 * sample's features. Loss layers: forward writes {loss sum, correct count}
 * to l->loss.result; backward writes grad_scale * d(loss sum)/dx.
 *
 * Memory: parameters, gradients and private buffers come from the device
 * pool (release with clg_buf_release, as clg_layer_free does); per-call
 * temporaries are pool buffers released right after enqueueing (the
 * in-order queue orders any reuse).
 *
 * Randomness: dropout draws its mask from a counter-based hash of
 * (seed, step, element index); see clg_layer_set_rng. */
#ifndef CLG_MODEL_LAYERS_H
#define CLG_MODEL_LAYERS_H

#include "model/layer.h"
#include "ops/nn.h"

extern CLG_INTERNAL const clg_layer_ops clg_layer_conv_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_dense_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_attention_ops;
/* The dropout mask of an [attention] layer (as clg_layer_set_rng; no-op for other layers). */
CLG_INTERNAL void clg_layer_attention_set_rng(clg_layer *l, uint32_t seed, uint32_t step, uint32_t sample_base);
extern CLG_INTERNAL const clg_layer_ops clg_layer_maxpool_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_avgpool_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_gap_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_activation_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_batchnorm_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_dropout_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_flatten_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_add_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_concat_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_softmax_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_mse_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_embedding_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_posembed_ops;
extern CLG_INTERNAL const clg_layer_ops clg_layer_layernorm_ops;

/* ---- sequences (issue 23) ---- */

/* l is an [embedding] (its params[0] "weight" is the (vocab, dim) table). */
CLG_INTERNAL int clg_layer_is_embedding(const clg_layer *l);
/* A [dense] tie = l head writes its weight gradient into l's table gradient
 * first (backward runs later layers first); l's backward then adds its own.
 * Returns 1 when l was tied already (one head per table is supported). */
CLG_INTERNAL int clg_layer_embedding_tie(clg_layer *l);

/* ---- a [dense] layer's weight gradient deferred (a pipeline stage's W/B split, parallel/pipe_wdefer.c) ---- */
/* l is an untied [dense]: *per its GEMM rows per sample, *in its input features, *units its outputs; else 0. */
CLG_INTERNAL int clg_dense_dims(const clg_layer *l, int *per, int *in, int *units);
/* With x set, l's backward computes its input and bias gradients only and copies its input rows and the gradient
 * the weight product takes (dz: after the activation's derivative) into x (rows x in features) and dz (rows x
 * units) from GEMM row `row` on, for clg_dense_wgrad later; x NULL: the weight gradient computed in backward. */
CLG_INTERNAL void clg_dense_defer(clg_layer *l, cl_mem x, cl_mem dz, size_t row);
/* dW = dz^T x over n GEMM rows into C from float offC (the kernel chosen by the product's size, as backward);
 * acc: added to C (each element C + the product, rounded once: as adding a gradient computed apart). */
CLG_INTERNAL clg_status clg_dense_wgrad(clg_layer *l, clg_device *dev, int n, cl_mem dz, size_t odz, cl_mem x,
                                        size_t ox, cl_mem C, size_t offC, int acc);

/* ---- a [convolutional] layer's filter gradient deferred (a pipeline stage's input gradients sent first) ---- */
/* l is a [convolutional]: *in and *out its input and output floats per sample; else 0. */
CLG_INTERNAL int clg_conv_defer_dims(const clg_layer *l, size_t *in, size_t *out);
/* With x set, l's backward computes its input gradient only and copies its input and the gradient the filter
 * product takes (after the activation's derivative) into x and dz (a batch of *in / *out floats per sample) for
 * clg_conv_wgrad; x NULL: the filter and bias gradients computed in backward. */
CLG_INTERNAL void clg_conv_defer(clg_layer *l, cl_mem x, cl_mem dz);
/* The filter and bias gradients of l's latest deferred backward, its operands kept in x and dz, into its parameter
 * gradients (the backward's kernel on the same operands: the same bits). */
CLG_INTERNAL clg_status clg_conv_wgrad(clg_layer *l, clg_device *dev, cl_mem x, cl_mem dz);

/* ---- the fusion pass (src/model/fuse.c) ---- */
/* l is a [batchnorm] that can take a fused epilogue (not synchronized). */
CLG_INTERNAL int clg_layer_batchnorm_fusable(const clg_layer *l);
/* Makes l's output relu(bn(x) + input 1), or relu(bn(x)) with one input;
 * the pass sets input 1 (an [add]'s other operand) itself. */
CLG_INTERNAL void clg_layer_batchnorm_fuse_relu(clg_layer *l);
/* l is an [activation] of type relu. */
CLG_INTERNAL int clg_layer_activation_is_relu(const clg_layer *l);
/* 1 when l is a [convolutional] with activation relu. */
CLG_INTERNAL int clg_layer_conv_is_relu(const clg_layer *l);
/* A relu convolution's backward pass leaves its relu's derivative to its
 * consumer (a 2x2 max pool, clg_layer_pool_fold_relu). */
CLG_INTERNAL void clg_layer_conv_fold_relu(clg_layer *l);
/* A 2x2 stride-2 max pool's backward pass also applies the derivative of
 * the relu that computed its input; 0 (nothing changed) for another pool. */
CLG_INTERNAL int clg_layer_pool_fold_relu(clg_layer *l);
/* 1 when max pool l folds the relu before it (tests). */
CLG_INTERNAL int clg_layer_pool_relu(const clg_layer *l);
/* ---- for the trainer ---- */

/* Dropout randomness for the next forward/backward pair: the keep mask of
 * element i of this replica's share is hash(seed, step, sample_base *
 * (C*H*W) + i), so a batch split across devices (sample_base = index of the
 * share's first sample in the global batch) draws the same masks as one
 * device, and backward (same step) recomputes forward's mask. Call it on
 * every layer before each training forward: a no-op for other types. */
CLG_INTERNAL void clg_layer_set_rng(clg_layer *l, uint32_t seed, uint32_t step, uint32_t sample_base);
/* A [dropout] holding features [offset, offset + its width) of a layer whose samples have width features
 * (tensor parallelism): its masks those of that slice of the whole layer. Call after clg_layer_set_rng; a no-op
 * for other types. */
CLG_INTERNAL void clg_layer_set_rng_slice(clg_layer *l, uint32_t width, uint32_t offset);

/* ---- for tests ---- */

/* Builds a layer of `type` from "key=value key=value ..." (whitespace
 * separated) with nin inputs of the given shapes (N, C, H, W): configure
 * (through the model-file parser, unknown keys rejected) and setup. The
 * caller owns l: clg_layer_free(l, dev) when done. */
CLG_INTERNAL clg_status clg_layer_create_for_test(clg_err *err, const char *type, const char *keys, int nin,
                                                  const int (*in_shape)[4], clg_layer *l);
/* The same with input i a sequence (N, T, C) = {N, T, C, 1} where bit i of
 * seq_mask is set. */
CLG_INTERNAL clg_status clg_layer_create_for_test_seq(clg_err *err, const char *type, const char *keys, int nin,
                                                      const int (*in_shape)[4], unsigned seq_mask, clg_layer *l);
/* destroy + release params (dev may be NULL before init). */
CLG_INTERNAL void clg_layer_free(clg_layer *l, clg_device *dev);

/* ---- helpers shared by the layer modules ---- */

/* Declares params[idx] (shape d[0..ndim)). */
CLG_INTERNAL void clg_layer_param_def(clg_layer *l, int idx, const char *name, int trainable, int ndim, int d0,
                                      int d1, int d2, int d3);
/* Allocates value (and grad when trainable) for every declared param. */
CLG_INTERNAL clg_status clg_layer_alloc_params(clg_layer *l, clg_device *dev);
/* Fills a param from host floats (numel). */
CLG_INTERNAL clg_status clg_layer_param_upload(clg_device *dev, clg_param *p, const float *host);
/* value ~ N(0, std^2) drawn on the host from rng; or a constant. */
CLG_INTERNAL clg_status clg_layer_param_normal(clg_device *dev, clg_param *p, double std, clg_rng *rng);
CLG_INTERNAL clg_status clg_layer_param_const(clg_device *dev, clg_param *p, float v);
/* He-normal for relu-like activations (relu, leaky, gelu), Glorot-normal
 * otherwise. */
CLG_INTERNAL double clg_layer_init_std(clg_act act, int fan_in, int fan_out);
/* Reads `activation` (default linear) and `alpha` (0.01). */
CLG_INTERNAL clg_status clg_layer_read_act(clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec, const char *key,
                                           const char *def, int allow_linear, clg_act *act, float *alpha);
/* Required integer key in [lo, hi]; error names the file and line. */
CLG_INTERNAL clg_status clg_layer_req_int(clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec, const char *key,
                                          long lo, long hi, long *out);
/* Grows a private scratch buffer to at least bytes. */
CLG_INTERNAL clg_status clg_layer_scratch(clg_device *dev, cl_mem *m, size_t *cap, size_t bytes);
/* Checks nin against [lo, hi]; error names the layer. */
CLG_INTERNAL clg_status clg_layer_check_nin(clg_layer *l, clg_err *err, int lo, int hi);
/* setup of an element-wise layer of one input and no parameters: the output
 * shape (and sequence flag) the input's, one flop per element. */
CLG_INTERNAL clg_status clg_layer_setup_pointwise(clg_layer *l, clg_err *err);
/* Allocates zeroed priv of size bytes. */
CLG_INTERNAL clg_status clg_layer_priv(clg_layer *l, clg_err *err, size_t bytes);

#endif
