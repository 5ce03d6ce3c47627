/* Deferred weight gradients in a pipeline stage (the W/B split of zero-bubble
 * schedules; clg_pipe_params.wdefer, option pipe_wdefer): a micro-batch's
 * backward computes the input gradients the previous stage waits for (B)
 * and the small parameters' gradients, and keeps, for each untied [dense]
 * layer of the stage, its input rows and the gradient its weight product
 * takes in per-step buffers at the micro-batch's rows; after the schedule
 * the stage computes each such weight gradient once over all its samples
 * (one GEMM with K = the replica's batch instead of M with K = a
 * micro-batch) straight into the accumulated gradient, while the stages
 * before it still run their last backwards. The per-micro-batch
 * accumulation then adds only the rest of the parameter arena. wdefer 1: the
 * weight products per micro-batch, each added to the sum in micro-batch
 * order by the GEMM's epilogue (C + product, rounded once, as the
 * accumulation adds a micro-batch's gradient: the same bits); 2: one product
 * over the replica's samples (K = its batch; the samples summed in the
 * GEMM's order: equal within rounding). Not with fp16 storage or tensor
 * parallelism (those stages compute W as before). */
#ifndef CLG_PARALLEL_PIPE_WDEFER_H
#define CLG_PARALLEL_PIPE_WDEFER_H

#include <stdio.h>

#include "parallel/pipe.h"

typedef struct clg_pipe_wd {
    int layer;           /* its index in the stage's network */
    int per, in, units;  /* GEMM rows per sample, input features, outputs */
    size_t woff;         /* the weight's gradient in the arena (floats) */
    size_t wn;           /* its floats */
    cl_mem x, dz;        /* the step's input rows and product gradients (rows of the replica's batch) */
} clg_pipe_wd;

/* A layer of a stage that sends gradients back whose weight gradient runs after those sends (wlate): a
 * [convolutional] (its filter and bias gradients, into the replica's gradients) or an untied [dense] not deferred
 * to the step's end (its weight gradient, added straight to the sum), the operands of one micro-batch kept in x
 * and dz. */
typedef struct clg_pipe_wl {
    int layer, dense;
    int per;             /* dense: GEMM rows per sample */
    size_t woff, wn;     /* dense: the weight's gradient in the arena (floats) and its floats */
    cl_mem x, dz;
} clg_pipe_wl;

/* The mode (0 off, 1 per micro-batch, 2 one product) of pipeline params pp with T tensor lanes: pp->wdefer, or
 * where that is 0 the option pipe_wdefer; 0 with T > 1. */
CLG_INTERNAL int clg_pipe_wdefer_mode(const clg_ctx *ctx, const clg_pipe_params *pp, int T);
/* Stage st's deferred layers (none unless p->wdefer, fp32, no tensor parallelism) and the arena ranges the
 * micro-batches accumulate; after stage_init. */
CLG_INTERNAL clg_status clg_pipe_wdefer_init(clg_pipe *p, clg_pipe_stage *st);
CLG_INTERNAL void clg_pipe_wdefer_free(clg_pipe_stage *st);
/* Before (on = 1) and after (on = 0) micro-batch m's backward on replica r: its deferred layers keep their
 * operands at m's rows. */
CLG_INTERNAL void clg_pipe_wdefer_arm(const clg_pipe *p, clg_pipe_stage *st, clg_replica *r, int m, int on);
/* r's parameter gradients into st->gacc (first: copied, else added), the deferred weights' left out. */
CLG_INTERNAL clg_status clg_pipe_wdefer_acc(clg_pipe_stage *st, clg_replica *r, int first);
/* After the schedule: each deferred weight gradient over the replica's samples into st->gacc. */
CLG_INTERNAL clg_status clg_pipe_wdefer_finish(const clg_pipe *p, clg_pipe_stage *st);

/* wlate (clg_pipe_params.wlate, option pipe_wlate; 0 with fp16 storage or T > 1): on a stage that sends
 * gradients back, each micro-batch's backward computes the input gradients first, the stage sends them, then it
 * runs its layers' weight gradients (the same kernels on the same operands: the same bits), so the stage before
 * waits for the input gradients only. */
CLG_INTERNAL int clg_pipe_wlate_mode(const clg_ctx *ctx, const clg_pipe_params *pp, int T, int fp16);
/* Stage st's late layers (none unless p->wlate and st has entering edges); after clg_pipe_wdefer_init. */
CLG_INTERNAL clg_status clg_pipe_wlate_init(clg_pipe *p, clg_pipe_stage *st);
/* Before (on = 1) and after (on = 0) a micro-batch's backward on replica r: its late layers keep their operands. */
CLG_INTERNAL void clg_pipe_wlate_arm(clg_pipe_stage *st, clg_replica *r, int on);
/* After the sends: the late layers' weight gradients of r's latest backward (n samples): convolutions' into r's
 * gradients (before the accumulation), dense layers' into st->gacc (first: the step's first backward). */
CLG_INTERNAL clg_status clg_pipe_wlate_run(clg_pipe_stage *st, clg_replica *r, int n, int first);

/* The partition table's lines (clg_pipe_print): per stage of replica 0 its deferred layers and their buffers' MiB
 * (nothing when none). */
CLG_INTERNAL void clg_pipe_wdefer_print(const clg_pipe *p, FILE *f);
/* The per-layer cost measurement of a pipeline with deferral (pipe.c): r's untied dense layers keep their
 * operands in scratch buffers of mb rows (*keep: two per layer, owned), so their measured backward leaves out the
 * weight product a stage computes once per step, at the end of its schedule, where the stages before it still
 * run their last backwards (the bubble). clg_pipe_wdefer_unmeasure releases them (keep may be NULL). */
CLG_INTERNAL clg_status clg_pipe_wdefer_measure(clg_replica *r, int mb, cl_mem **keep);
CLG_INTERNAL void clg_pipe_wdefer_unmeasure(clg_replica *r, cl_mem *keep);

#endif
