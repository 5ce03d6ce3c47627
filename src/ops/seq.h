/* Launchers for the sequence ops of cl/seq.cl (issue 23): token embedding,
 * learned positions, layer normalization, token cross-entropy.
 *
 * Legend: a sequence (N, T, C) is row-major, C fastest; rows = N*T. Buffers
 * are fp32 device buffers; offsets and counts in elements, each below 2^32
 * (checked). Every launcher only enqueues on dev->queue. Every sum has one
 * owner and a fixed order (no float atomics): results are bitwise
 * reproducible run to run. Per-row kernels (layer norm, token loss) run one
 * work-item per row, eight values per step in float8 when the row length is
 * a multiple of 8 (on PoCL 5-20x faster than the strided scalar loop, and
 * than a work-group per row, whose barriers cost more). Timings:
 * build/tests/seq/bench_seq. */
#ifndef CLG_OPS_SEQ_H
#define CLG_OPS_SEQ_H

#include "device/device.h"

/* y (ntok, D) = table[ids] with table (V, D), ids ntok floats holding
 * integers. flag (one uint, set to 0xffffffff by the caller) receives the
 * smallest position whose id is not an integer in [0, V); its row of y is 0. */
CLG_INTERNAL clg_status clg_seq_embedding_forward(clg_device *dev, size_t ntok, int D, int V, cl_mem ids, size_t oid,
                                                  cl_mem table, cl_mem y, size_t oy, cl_mem flag);
/* dtable (V, D) = (acc ? dtable : 0) + sum over the positions p holding id
 * v of dy[p] (in position order); invalid ids contribute nothing. A counting
 * sort of the positions by id (O(V * ntok) id reads), then one owner per
 * table element: four launches, pool temporaries of V + ntok uints. */
CLG_INTERNAL clg_status clg_seq_embedding_backward(clg_device *dev, size_t ntok, int D, int V, cl_mem ids, size_t oid,
                                                   cl_mem dy, size_t ody, cl_mem dtable, int acc);

/* y (N, T, C) = x + P[0..T) with P (context, C), T <= context. */
CLG_INTERNAL clg_status clg_seq_pos_forward(clg_device *dev, int N, int T, int C, cl_mem x, size_t ox, cl_mem P,
                                            cl_mem y, size_t oy);
/* dP (context, C) = sum over n of dy (N, T, C) (in n order); rows t >= T are 0. */
CLG_INTERNAL clg_status clg_seq_pos_backward(clg_device *dev, int N, int T, int C, int context, cl_mem dy,
                                             size_t ody, cl_mem dP);

/* Layer normalization of rows x C values: y = (x - mean) * rstd (* gamma +
 * beta when gamma is not NULL: beta must be given too); mean and rstd (rows
 * floats each) saved for backward. Two passes per row (mean, then the
 * squared deviations). */
CLG_INTERNAL clg_status clg_seq_layernorm_forward(clg_device *dev, size_t rows, int C, float eps, cl_mem x, size_t ox,
                                                  cl_mem gamma, cl_mem beta, cl_mem y, size_t oy, cl_mem mean,
                                                  cl_mem rstd);
/* dx (NULL: skipped), dgamma and dbeta (C floats; NULL: skipped, both or
 * neither) from dy; gamma NULL when the forward had no affine part. */
CLG_INTERNAL clg_status clg_seq_layernorm_backward(clg_device *dev, size_t rows, int C, cl_mem x, size_t ox, cl_mem dy,
                                                   size_t ody, cl_mem gamma, cl_mem mean, cl_mem rstd, cl_mem dgamma,
                                                   cl_mem dbeta, cl_mem dx, size_t odx);

/* Token cross-entropy over V classes at each of rows positions: p =
 * softmax(x); loss[r] = w ((1 - eps) (-log p[label]) + eps mean_c (-log
 * p_c)), correct[r] = w when the first argmax is the label (rows floats
 * each; fold with clg_nn_loss_reduce); int32 labels, one per position. */
CLG_INTERNAL clg_status clg_seq_token_xent_forward(clg_device *dev, size_t rows, int V, float w, float eps, cl_mem x,
                                                   size_t ox, cl_mem p, size_t op, cl_mem labels, size_t ol,
                                                   cl_mem loss, cl_mem correct);
/* dx = scale (p - (1 - eps) onehot(label) - eps / V) */
CLG_INTERNAL clg_status clg_seq_token_xent_backward(clg_device *dev, size_t rows, int V, float scale, float eps,
                                                    cl_mem p, size_t op, cl_mem labels, size_t ol, cl_mem dx,
                                                    size_t odx);

#endif
