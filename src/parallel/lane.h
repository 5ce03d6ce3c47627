/* A lane: one device's share of a data-parallel job. It owns the device's
 * replica of the network, its optimizer state, a transfer queue and the
 * double-buffered input feed, and the replica's gradients as one flat
 * arena (a sub-buffer per trainable parameter, laid out in reverse layer
 * order, so a reduction bucket is one contiguous transfer). A lane is driven
 * by one host thread at a time (its team worker). */
#ifndef CLG_PARALLEL_LANE_H
#define CLG_PARALLEL_LANE_H

#include "model/optim.h"

#define CLG_STAGES 2
#define CLG_LANE_OBS 8

/* Where each trainable parameter's gradient lives in the arena; identical
 * on every lane (offsets aligned to the strictest device of the set). */
typedef struct clg_grad_layout {
    int n;             /* trainable parameters, in clg_replica_params order */
    size_t *off;       /* byte offset of parameter i */
    size_t bytes;      /* arena size */
} clg_grad_layout;

typedef struct clg_lane {
    int index;                /* position in the fixed reduction order */
    clg_device *dev;          /* borrowed */
    clg_replica *rep;
    clg_optim *opt;           /* created with the first training step */
    cl_command_queue upq;     /* transfer queue: uploads overlap compute */
    cl_mem xbuf[CLG_STAGES], ybuf[CLG_STAGES], dummy_labels;
    cl_mem dummy_x;           /* zeros, a batch of inputs (a valid image and valid token ids): made by the first
                                 preparation of a new per-lane size (dp.c: lane_prepare), which must not read a
                                 feed buffer that holds garbage or a batch being uploaded */
    cl_event up_ev[CLG_STAGES];   /* upload of stage s done */
    cl_event done_ev[CLG_STAGES]; /* compute that read stage s done */
    int cnt[CLG_STAGES], off[CLG_STAGES]; /* slice of the global batch in stage s */
    cl_mem arena;             /* gradients: the replica's gradient arena (borrowed, rep->garena) */
    float *ghost;             /* host copy of the arena (reduction) */
    float *shost;             /* host copy of the non-trainable state (BN running stats) */
    cl_event *bev;            /* per bucket: its read finished */
    cl_event wev;             /* the last write-back (host buffers reused next step) */
    cl_event res_ev;          /* loss result read of the last step */
    double t_compute;         /* seconds the last step took until its gradients were read */
    double t_cpu0, t_cpu;     /* this thread's CPU seconds at the step's start; over the same span as t_compute */
    double t_pcpu0, t_pcpu;   /* the process's CPU seconds, likewise (every thread's: lanes, driver workers) */
    /* speed model t(n) = a + b n (dp.c): the compute times of the last
     * CLG_LANE_OBS warm steps (a step meeting a new batch size is not one) */
    int obs_n[CLG_LANE_OBS];
    double obs_t[CLG_LANE_OBS];
    int nobs;                 /* recorded (ring position: nobs % CLG_LANE_OBS) */
    unsigned char *ready;     /* [0, batch]: uses of each batch size so far, up to 2 (kernels built at the first,
                                 algorithms measured by the second) */
    int cold;                 /* this step meets a new batch size: not a speed measurement */
    cl_event mark;            /* trace: the last marker on the compute queue */
} clg_lane;

/* Creates the lane's replica (weights from seed: identical on every lane),
 * queues and feed buffers for `batch` samples per stage. stub: the replica
 * holds only the network's last layer (a pipeline's bookkeeping lane, made
 * whole by its owner when a checkpoint or an evaluation needs it). */
CLG_INTERNAL clg_status clg_lane_init(clg_lane *l, int index, clg_net *net, clg_device *dev, uint64_t seed,
                                      int batch, int stub);
CLG_INTERNAL void clg_lane_release(clg_lane *l);
/* Lays the replica's parameter and gradient arenas out by lay
 * (clg_replica_arena). */
CLG_INTERNAL clg_status clg_lane_grad_arena(clg_lane *l, const clg_grad_layout *lay);
/* Uploads samples [off, off + n) of the host batch into stage s
 * (non-blocking, on the transfer queue, after the stage's last reader). */
CLG_INTERNAL clg_status clg_lane_upload(clg_lane *l, int s, const float *x, const int32_t *y, size_t sample, int off,
                                        int n);
/* Makes the compute queue wait for stage s's upload and points the replica at
 * it; labels: the stage's (training >= 0) or dummy ones (predict). */
CLG_INTERNAL clg_status clg_lane_use_stage(clg_lane *l, int s, int training, float grad_scale);
/* Marks stage s free once the compute enqueued so far is done; flushes. */
CLG_INTERNAL clg_status clg_lane_stage_release(clg_lane *l, int s);
/* Waits for the stage's previous upload (host buffers may then be reused). */
CLG_INTERNAL clg_status clg_lane_stage_wait(clg_lane *l, int s);

CLG_INTERNAL void clg_release_event(cl_event *e);

#endif
