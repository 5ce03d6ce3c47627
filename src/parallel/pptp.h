/* Pipeline x tensor parallelism (issue #22): --parallel pp=K,tp=T over K x T devices and dp=D,pp=K,tp=T over
 * D x K x T. The pipeline (pipe.h) runs D x T copies of itself ("replicas" r = d T + t; lane r K + s on the
 * (r K + s)-th device): the T copies of data replica d take the same micro-batches, and copy t's stage s runs
 * the layers of stage s of the lane network (every column-split layer's width divided by T, tensor.h), holding
 * lane t's slices of the stage's split pairs. The stages are cut first (whole layers: a cut inside a layer is
 * refused, a default cut inside a pair moved after it, a --stages cut inside a pair refused), then the pairs
 * are found inside each stage (a stage without one is refused). The T lanes of stage s walk the same schedule,
 * so they meet at the same all-reduces in the same order: after a row-split layer's forward and a column-split
 * layer's backward (its input gradient), per micro-batch, among the T threads of (d, s) (tensor.c's group
 * all-reduce through host memory). At a cut the activations are whole (replicated), so lane t of stage s sends
 * to lane t of stage s + 1. Gradients accumulate per lane over the micro-batches; the data replicas' sums run
 * per (t, s); the row-split biases' gradients are zeroed on t > 0; the clipping norm counts every slice once
 * and the replicated parameters once. Checkpoints and evaluation go through a whole-network replica
 * (clg_pipe_sync slices and gathers, optimizer state included). Refused: fp16 storage, MPI ranks,
 * --shard-optimizer and batch norm with dp > 1. */
#ifndef CLG_PARALLEL_PPTP_H
#define CLG_PARALLEL_PPTP_H

#include "parallel/pipe.h"

/* After the partition (cut[s]: the last layer of stage s of net, the whole network; user_cuts: from --stages),
 * before the stages exist: the cuts checked against the pairs, the pairs found per stage, p->tp_net (the lane
 * network) built and the groups' all-reduce (D data replicas x K stages) made. */
CLG_INTERNAL clg_status clg_pptp_setup(clg_pipe *p, clg_net *net, int *cut, int user_cuts, int D);
/* After the stages exist: one device's first weights sliced into every lane, the all-reduce hooked into every
 * stash replica. */
CLG_INTERNAL clg_status clg_pptp_init(clg_pipe *p, uint64_t seed);
/* Dropout inside a split pair: replica r of stage st draws the masks of its slice of the whole layer. */
CLG_INTERNAL void clg_pptp_rng(const clg_pipe *p, const clg_pipe_stage *st, clg_replica *r);
/* After the stage's accumulated gradients are in its garena: the row-split biases' zeroed on t > 0; clip: the
 * stage's share of the squared global norm into st->norm_sq. */
CLG_INTERNAL clg_status clg_pptp_grads(clg_pipe *p, clg_pipe_stage *st, int clip);
/* Parameters and their optimizer state (full_opt may be NULL) between full (a whole-network replica) and the
 * lanes' slices: gathered from data replica 0 (to_full = 1) or scattered into every lane. */
CLG_INTERNAL clg_status clg_pptp_sync(clg_pipe *p, clg_replica *full, clg_optim *full_opt, int to_full);

#endif
