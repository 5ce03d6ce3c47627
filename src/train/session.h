/* A training session on one device: network + replica + optimizer +
 * input normalization + double-buffered input staging. The public
 * clg_model is a session. Checkpoints (weights, optimizer state, progress)
 * are read and written here through src/io/checkpoint.h. */
#ifndef CLG_TRAIN_SESSION_H
#define CLG_TRAIN_SESSION_H

#include "io/checkpoint.h"
#include "io/dataset.h"
#include "train/optim.h"

#define CLG_STAGES 2

/* Dynamic loss scaling (--precision fp16): the loss gradient is multiplied
 * by S so small gradients survive half storage; gradients are multiplied by
 * 1/S (exact: S is a power of two) before the update. A step whose
 * gradients hold inf/NaN is skipped and halves S; CLG_LS_INTERVAL clean
 * steps in a row double it ($CLGRAD_FP16_SCALE_INTERVAL overrides the
 * interval, for tests). */
#define CLG_LS_INIT 4096.0
#define CLG_LS_MIN 1.0
#define CLG_LS_MAX 16777216.0
#define CLG_LS_INTERVAL 200

struct clg_model {
    clg_ctx *ctx;
    clg_device *dev;
    clg_net *net;
    clg_replica *rep;
    clg_optim *opt;      /* created on the first training step */
    clg_hparams hp;
    uint64_t seed;
    clg_ds_norm norm;    /* input normalization (identity unless loaded / computed) */
    int has_norm;
    /* staging: CLG_STAGES device input/label buffers, host mirrors */
    cl_command_queue upq; /* transfer queue (uploads overlap compute) */
    cl_mem xbuf[CLG_STAGES], ybuf[CLG_STAGES];
    float *xhost[CLG_STAGES];
    int32_t *yhost[CLG_STAGES];
    cl_event up_ev[CLG_STAGES];   /* upload of stage s done */
    cl_event done_ev[CLG_STAGES]; /* compute that read stage s done */
    cl_mem dummy_labels;
    /* progress */
    int64_t step;         /* optimizer steps taken */
    int epoch;            /* current epoch (0-based) */
    int batch_in_epoch;   /* next batch index within the epoch */
    clg_metrics last;
    /* --precision fp16 (see CLG_LS_*) */
    int fp16;
    double loss_scale;   /* S */
    int64_t ls_good;     /* clean steps since S last changed */
    int ls_interval;     /* clean steps before S doubles */
    int64_t ls_skipped;  /* steps skipped for inf/NaN gradients */
};

/* fp16: store activations and weights in half (fp32 master weights, dynamic
 * loss scaling). */
CLG_INTERNAL clg_status clg_session_create(clg_ctx *ctx, int device, const char *text, const char *source,
                                           int batch, uint64_t seed, int fp16, clg_model **out);
/* "fp32" / "fp16" -> 0 / 1; -1 when unknown (NULL is fp32). */
CLG_INTERNAL int clg_precision_parse(const char *name);
CLG_INTERNAL void clg_session_free(clg_model *m);

/* Enqueues the upload of n samples from the stage's host buffers
 * (non-blocking, on the transfer queue). Waits first until the stage's
 * previous compute and upload finished, so host and device buffers can be
 * reused. */
CLG_INTERNAL clg_status clg_session_stage_wait(clg_model *m, int stage);
CLG_INTERNAL clg_status clg_session_upload(clg_model *m, int stage, int n, int with_labels);
/* Points the replica at stage `stage` and makes the compute queue wait on
 * its upload; after the compute is enqueued, call stage_release. */
CLG_INTERNAL clg_status clg_session_use_stage(clg_model *m, int stage, int n, int training);
CLG_INTERNAL clg_status clg_session_stage_release(clg_model *m, int stage);

/* Forward+backward+optimizer step on the stage's batch (n samples). The
 * loss result (2 floats) is read non-blocking into res (may be NULL). */
CLG_INTERNAL clg_status clg_session_train_step(clg_model *m, int stage, int n, double lr, float *res, cl_event *res_ev);
CLG_INTERNAL clg_status clg_session_ensure_optim(clg_model *m);
/* The update half of a train step, after backward: in fp16 mode unscale +
 * overflow check (skip and halve S, or update and count a clean step),
 * clipping, the optimizer; counts the step either way. */
CLG_INTERNAL clg_status clg_session_apply(clg_model *m, double lr);

/* Checkpoint of weights (+ optimizer and progress when with_state). */
CLG_INTERNAL clg_status clg_session_save(clg_model *m, const char *path, int with_state, int64_t total_steps);
CLG_INTERNAL clg_status clg_session_load(clg_model *m, const char *path, int with_state);

/* Evaluation over a dataset (forward only). confusion (classes^2) may be NULL. */
CLG_INTERNAL clg_status clg_session_evaluate(clg_model *m, const clg_dataset *ds, long limit, double *loss,
                                             double *acc, int64_t *confusion, int *samples);

/* Image data: fill the stage host buffer from a dataset. */
CLG_INTERNAL clg_status clg_session_fill(clg_model *m, int stage, const clg_dataset *ds, const int32_t *perm,
                                         int start, int *count);

#endif
