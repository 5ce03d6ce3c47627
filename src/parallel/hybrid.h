/* Hybrid layouts (issue #22): MPI ranks as the outer data-parallel level of
 * a pipeline (pp=K, dp=D,pp=K) or tensor-parallel (tp=T, dp=D,tp=T) layout.
 *
 * Every rank runs the same layout on its own devices over its slice of the
 * global batch (clg_comm_slice: B / R samples, the first B mod R ranks one
 * more; dropout by global sample index, the loss gradient scaled by
 * 1 / global batch), as data parallelism over ranks does. After the
 * in-process accumulation and reduction, each pipeline stage's (or each
 * tensor-parallel slice's) gradient arena is summed over the ranks on a
 * channel of its own (one clg_comm_op per stage or slice: the stages' and
 * slices' threads reduce independently, in any order), through host memory,
 * before the optimizer step; so the clip norm and fp16 overflow are those of
 * the global gradient. A pipeline's batch-norm running statistics are
 * averaged over the ranks, weighted by slice size. */
#ifndef CLG_PARALLEL_HYBRID_H
#define CLG_PARALLEL_HYBRID_H

#include "parallel/comm.h"

typedef struct clg_hybrid {
    int n;             /* channels */
    clg_comm_op **op;  /* per channel */
    int total;         /* the step's global batch (set before each step) */
} clg_hybrid;

/* Collective: every rank creates the same channels in the same order. With
 * one rank *out stays NULL (nothing to reduce). what names the channels in
 * messages ("pipeline stage", "tensor-parallel slice"). */
CLG_INTERNAL clg_status clg_hybrid_create(clg_err *err, int channels, const char *what, clg_hybrid **out);
CLG_INTERNAL void clg_hybrid_free(clg_hybrid *h);
/* Channel ch: g[0..ng) := its sum over the ranks; st[0..ns) (may be NULL),
 * this rank's statistics over n_local samples, := their average over the
 * ranks weighted by slice size (n_local / total each). Blocking (polled,
 * with the communicator's timeout); err receives a failure. */
CLG_INTERNAL clg_status clg_hybrid_reduce(clg_hybrid *h, int ch, clg_err *err, float *g, size_t ng, float *st,
                                          size_t ns, int n_local);

#endif
