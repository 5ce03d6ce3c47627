/* Sharded optimizer state with a pipeline (--shard-optimizer with dp=D,pp=K; ZeRO stage 1 within the layout):
 * stage s's optimizer state is split over its D replicas, replica d keeping floats [k0[s][d], k1[s][d]) of the
 * stage's parameter arena (the same layout on every replica; split as the data-parallel shards are). The
 * replicas' gradient sums stay as they are (the pipeline sums them on the host and every replica gets the whole
 * sum, which the clip norm and the fp16 overflow check read); each replica updates its part, and the stage's
 * updated parts are gathered through host memory before the stash slots are refreshed. The update kernels are
 * element-wise over the same sums, so the result is the unsharded one bitwise. Checkpoints keep the one-device
 * format: a tensor's state is gathered from the replicas that own its parts and scattered back at load. */
#ifndef CLG_PARALLEL_PIPE_ZERO_H
#define CLG_PARALLEL_PIPE_ZERO_H

#include "parallel/pipe.h"

typedef struct clg_pipe_zero {
    size_t k0[CLG_PIPE_MAX_STAGES][CLG_PIPE_MAX_REPLICAS], k1[CLG_PIPE_MAX_STAGES][CLG_PIPE_MAX_REPLICAS];
    float *host[CLG_PIPE_MAX_STAGES]; /* per stage: its arena, the parts gathered */
    int arrived[CLG_PIPE_MAX_STAGES], bad[CLG_PIPE_MAX_STAGES], bad_now[CLG_PIPE_MAX_STAGES];
    int64_t gen[CLG_PIPE_MAX_STAGES];
} clg_pipe_zero;

/* Shards the stages' optimizer state over the D replicas (before the first step; nothing with D = 1). */
CLG_INTERNAL clg_status clg_pipe_zero_setup(clg_pipe *p);
CLG_INTERNAL void clg_pipe_zero_free(clg_pipe *p);
/* Lane s's optimizer: of its part (sharded) or of its whole arena. */
CLG_INTERNAL clg_status clg_pipe_zero_optim(clg_pipe *p, int s, const clg_hparams *hp);
/* After lane st's update (rc: its status): the stage's parts gathered on every replica (waits for the stage's
 * other replicas; each arrives even when its update failed, so none waits for ever). */
CLG_INTERNAL clg_status clg_pipe_zero_gather(clg_pipe *p, clg_pipe_stage *st, clg_status rc);
/* The optimizer state of layer li's parameter slot (index fi in fo, the whole-network optimizer on the host
 * side's device) from the parts of every replica (to_full) or into replica d's part; tmp: the tensor's floats. */
CLG_INTERNAL clg_status clg_pipe_zero_state(clg_pipe *p, clg_optim *fo, int fi, int li, int slot, int to_full, int d,
                                            float *tmp);

/* State k (0 first, 1 second) of lane l's trainable parameter i (its optimizer's index) between buf (the whole
 * tensor, on lane l's device): gathered into buf from every replica of l's stage (to_buf) or lane l's part written
 * from it (checkpoints straight from and into the stages). */
CLG_INTERNAL clg_status clg_pipe_zero_buf(clg_pipe *p, int l, int i, int k, cl_mem buf, int to_buf);

#endif
