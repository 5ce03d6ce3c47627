/* A training session: network + one lane per selected device (replica,
 * optimizer, feed; src/parallel) + input normalization + the host staging of
 * the global batch (double-buffered) + progress and fp16 loss scaling. The
 * public clg_model is a session. Checkpoints (weights, optimizer state,
 * progress, the device set) are read and written here through
 * src/io/checkpoint.h: written from lane 0, read into every lane. */
#ifndef CLG_TRAIN_SESSION_H
#define CLG_TRAIN_SESSION_H

#include "io/checkpoint.h"
#include "io/dataset.h"
#include "parallel/dp.h"
#include "parallel/pipe.h"
#include "model/optim.h"

/* Dynamic loss scaling (--precision fp16): the loss gradient is multiplied
 * by S so small gradients survive half storage; gradients are multiplied by
 * 1/S (exact: S is a power of two) before the update. A step whose
 * gradients hold inf/NaN (on any device: the check runs on the reduced
 * gradient) is skipped on every device and halves S; CLG_LS_INTERVAL clean
 * steps in a row double it ($CLGRAD_FP16_SCALE_INTERVAL overrides the
 * interval, for tests). */
#define CLG_LS_INIT 4096.0
#define CLG_LS_MIN 1.0
#define CLG_LS_MAX 16777216.0
#define CLG_LS_INTERVAL 200

struct clg_model {
    clg_ctx *ctx;
    clg_net *net;
    clg_dp *dp;          /* lanes: one per device */
    /* pipeline parallelism (--parallel pp=K, --microbatches M): the steps run
     * on the stages, checkpoints go between them and the host; dp then has
     * one lane, on the first stage's device, whose replica is a stub of the
     * last layer, made the whole network for an evaluation (lane_whole),
     * the weights copied from the stages when pipe_stale (clg_pipe_sync;
     * bit 1: the weights, bit 2: the optimizer state) */
    clg_pipe *pipe;
    int pipe_stale;
    /* tensor parallelism (--parallel tp=T): the steps run on m->tp's lanes;
     * lane 0's replica is made whole (lane_whole) and gets their weights
     * (and optimizer state) when a checkpoint or an evaluation needs them
     * and tp_stale says it is behind (clg_session_pipe_gather) */
    struct clg_tp *tp;
    int tp_stale;
    /* MPI ranks around a pipeline or tensor-parallel layout (parallel/hybrid.h; NULL with one rank or plain
     * data parallelism): the stages' / slices' gradients summed over the ranks before each update */
    struct clg_hybrid *hy;
    int lane_whole;      /* pipeline: the lane's replica is the whole network now (else a stub of the last
                          * layer: created whole when a checkpoint or an evaluation needs it, back to the stub
                          * at the next step, after a checkpoint is written and after an evaluation) */
    clg_hparams hp;
    uint64_t seed;
    clg_ds_norm norm;    /* input normalization (identity unless loaded / computed) */
    int has_norm;
    int imported;        /* weights and normalization came with the model file (ONNX): kept by training */
    /* host staging of the global batch: CLG_STAGES buffers of net->batch samples */
    float *xhost[CLG_STAGES];
    int32_t *yhost[CLG_STAGES];
    float *lane_res;     /* 2 floats per lane (blocking steps) */
    /* progress */
    int64_t step;         /* optimizer steps taken */
    int epoch;            /* current epoch (0-based) */
    int batch_in_epoch;   /* next batch index within the epoch */
    clg_metrics last;
    clg_trace *trace;    /* --trace: owned until clg_session_trace_close */
    char resumed_from[256]; /* device set a resumed checkpoint was written with ("" when the same) */
    /* --precision fp16 (see CLG_LS_*) */
    int fp16;
    double loss_scale;   /* S */
    int64_t ls_good;     /* clean steps since S last changed */
    int ls_interval;     /* clean steps before S doubles */
    int64_t ls_skipped;  /* steps skipped for inf/NaN gradients */
    /* the stage of the last step or forward (-1: none yet) and whether it held labels: the batch a save
     * checks the weights on (see clg_session_save) */
    int check_stage;
    int check_labels;
    char model_hash[17];  /* clg_model_hash of net->text: stored as "model.hash", checked by a resume */
    int hash_unchecked;   /* the last resume's checkpoint had no model.hash (older clgrad) */
};

/* The model's identity for resume: FNV-1a 64 (16 hex digits) of the model
 * text normalized: comments, blank lines and spacing dropped, each layer
 * section's keys sorted, and of [net] only the input shape and classes
 * (hyper-parameters may change between runs). Different layer types or
 * settings with the same tensor shapes hash differently. */
CLG_INTERNAL clg_status clg_model_hash(clg_err *err, const char *text, const char *source, char out[17]);

/* The pipeline layout of parallel ("pp=K"), stages, microbatches (0: 4K)
 * and schedule name into *pp (stages 1: none); refusals name the value. */
CLG_INTERNAL clg_status clg_session_pipe_params(clg_err *err, const char *parallel, const char *stages,
                                                int microbatches, const char *schedule, int recompute,
                                                clg_pipe_params *pp);

/* Pipeline: lane 0's replica (with_state: and its optimizer state, created
 * for it) brought up to date with the stages' (a no-op without a pipeline
 * or when current). */
CLG_INTERNAL clg_status clg_session_pipe_gather(clg_model *m, int with_state);

/* Lane 0: the replica checkpoints are written from and summaries describe. */
static inline clg_replica *clg_session_rep(const clg_model *m) { return m->dp->lanes[0].rep; }
static inline clg_device *clg_session_dev(const clg_model *m) { return m->dp->lanes[0].dev; }

/* devices: selector over the context's devices ("all", "0,1", ...; NULL:
 * the one device `device`). fp16: store activations and weights in half (fp32 master
 * weights, dynamic loss scaling). dpp may be NULL (defaults). */
CLG_INTERNAL clg_status clg_session_create(clg_ctx *ctx, const char *devices, int device, const char *text,
                                           const char *source,
                                           int batch, uint64_t seed, int fp16, const clg_dp_params *dpp,
                                           clg_model **out);
/* "fp32" / "fp16" -> 0 / 1; -1 when unknown (NULL is fp32). */
CLG_INTERNAL int clg_precision_parse(const char *name);
CLG_INTERNAL void clg_session_free(clg_model *m);

/* Waits until stage s's host buffers may be refilled. */
CLG_INTERNAL clg_status clg_session_stage_wait(clg_model *m, int stage);
/* Splits the n staged samples over the lanes and uploads (non-blocking). */
CLG_INTERNAL clg_status clg_session_upload(clg_model *m, int stage, int n, int with_labels);

CLG_INTERNAL clg_status clg_session_ensure_optim(clg_model *m);
/* A training step (forward, backward, reduction, update; fp16: overflow
 * check, skip and halve S or count a clean step; clipping) on the stage's
 * batch. begin/end: the caller may prepare the next batch in between; res
 * (2 floats per lane, may be NULL) receives {loss sum, correct} per lane,
 * complete when res_ev[lane] is (res_ev NULL: by the time end returns). */
CLG_INTERNAL clg_status clg_session_step_begin(clg_model *m, int stage, double lr, float *res, cl_event *res_ev);
CLG_INTERNAL clg_status clg_session_step_end(clg_model *m);
/* After a non-finite loss or gradient: which layer went non-finite first
 * (clg_replica_explain_nonfinite on lane 0's replica and the batch of the
 * last training step), into buf. Only for a step that failed. */
CLG_INTERNAL void clg_session_explain_nonfinite(clg_model *m, char *buf, size_t cap);
/* begin + end; res (may be NULL): 2 floats, summed over the lanes. */
CLG_INTERNAL clg_status clg_session_train_step(clg_model *m, int stage, double lr, float *res);
/* Compiles a training step's kernels, layers last to first when reverse
 * (see session.c); clobbers the model's state. */
CLG_INTERNAL clg_status clg_session_precompile(clg_model *m, int reverse);
/* Forward only on the stage's batch: res (2 floats, may be NULL) the summed
 * {loss, correct} (needs labels), out (may be NULL) every sample's output. */
CLG_INTERNAL clg_status clg_session_forward(clg_model *m, int stage, int with_labels, float *res, float *out);

/* Largest weight magnitude a save accepts: beyond it the model has
 * diverged even when every value is finite (squares and sums of such
 * weights overflow float within a layer or two). */
#define CLG_SAVE_MAX_ABS 1e10

/* Checkpoint of weights (+ optimizer and progress when with_state). The
 * one save path (checkpoints, --save, the API): it refuses, writing
 * nothing and leaving an earlier file at path untouched, unless every
 * value is finite, every weight is at most CLG_SAVE_MAX_ABS in magnitude
 * and a forward of the weights to be saved on the last batch the session
 * stepped or evaluated (when there is one) gives a finite loss and finite
 * outputs. */
CLG_INTERNAL clg_status clg_session_save(clg_model *m, const char *path, int with_state, int64_t total_steps);
/* with_state (a resume) also requires the checkpoint's model to be this
 * one: its "model.hash" and the hash of the model text it stores must
 * equal m->model_hash (a checkpoint without model.hash, from an older
 * clgrad, is checked by its model text alone and sets m->hash_unchecked). */
CLG_INTERNAL clg_status clg_session_load(clg_model *m, const char *path, int with_state);
/* The same from a checkpoint in memory (an imported ONNX model's weights);
 * path names it in messages. */
CLG_INTERNAL clg_status clg_session_load_ckpt(clg_model *m, const clg_ckpt *ck, const char *path, int with_state);

/* Text data (ds->text): every byte must be a token id and a target of the
 * model, below its classes and its first [embedding]'s vocabulary; refused
 * naming the file, the byte and its offset in the file. */
CLG_INTERNAL clg_status clg_session_check_text(clg_model *m, const clg_dataset *ds);
/* Evaluation over a dataset (forward only). confusion (classes^2) may be NULL. */
CLG_INTERNAL clg_status clg_session_evaluate(clg_model *m, const clg_dataset *ds, long limit, double *loss,
                                             double *acc, int64_t *confusion, int *samples);

/* --trace FILE.json: a Chrome-trace timeline of the next `steps` training
 * steps, written by clg_session_trace_close (see src/parallel/trace.h). */
CLG_INTERNAL clg_status clg_session_trace_open(clg_model *m, const char *path, int steps);
CLG_INTERNAL clg_status clg_session_trace_close(clg_model *m);

/* The devices trained on and their shares ("0.50/0.50"; a pipeline:
 * "pp=2 M=8 1f1b", its stage count in *devices). */
/* Devices the memory table has rows for: the lanes, or a pipeline's stages. */
CLG_INTERNAL int clg_session_mem_rows(const clg_model *m);
/* Row i of the memory table: what device *dev (its context index) holds
 * for the model, bytes by kind, and its account's peak; *stage: the
 * pipeline stage on it (-1: data parallel). A pipeline stage's device that
 * also holds the session's whole-network lane counts the lane's too. */
CLG_INTERNAL void clg_session_memory(const clg_model *m, int i, clg_dp_mem *out, int *dev, int *stage);
CLG_INTERNAL void clg_session_shares(const clg_model *m, char *buf, size_t cap, int *devices);
/* A one-line description of the devices and their current shares. */
CLG_INTERNAL void clg_session_devices(const clg_model *m, char *buf, size_t cap);

#endif
