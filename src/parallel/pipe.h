/* Pipeline parallelism (issue #22): the layers cut into K contiguous stages,
 * one per device; the global batch split into M micro-batches that flow
 * through the stages; gradients accumulated over the micro-batches and the
 * optimizer run once per step on every stage, so a step equals one device's
 * step over the global batch with gradient accumulation (batch norm uses
 * each micro-batch's statistics).
 *
 * Stage s = a device running a replica of layers [first, last] only
 * (clg_replica_create_range): its parameters, optimizer state and
 * activations. One host thread per stage (team.c) walks the stage's
 * schedule (both accumulate the micro-batches' gradients in the order
 * 0 .. M-1, as one device accumulating them does: the same arithmetic):
 *   GPipe: F0 .. F(M-1), then B0 .. B(M-1) (M micro-batches in flight)
 *   1F1B (PipeDream-flush): min(K-1-s, M) forwards, then one forward and one
 *        backward alternately, then the remaining backwards (at most K-s
 *        micro-batches in flight on stage s)
 * Activations crossing a cut (every edge from a layer of stage a to a layer
 * of stage b > a, residual edges over several stages included) travel from
 * a to b, their gradients from b back to a (summed on a when several stages
 * read the tensor), through host memory (a read on one device's queue, a
 * write on the other's) or, between devices of one cl_context, device to
 * device (a copy into a buffer of the context on the sender's queue, which
 * the receiver reads in place where the rows are contiguous, else copies
 * out on its queue), whichever measured faster at creation; each
 * micro-batch's handed over under one lock.
 *
 * Stashed forwards: a stage keeps one slot per micro-batch in flight
 * (counted: peak_inflight). By default a slot is a replica of the stage with
 * its own activations and layer state (weights copied from the first after
 * each update; batch-norm running statistics handed from the slot of the
 * previous forward to the next, so they advance once per micro-batch in
 * order). With recompute a slot holds only the activations that entered the
 * stage, and the backward of a micro-batch that is not the stage's latest
 * forward runs the stage's forward on them again first (re-materialization,
 * as GPipe does; the same dropout masks; running statistics saved and
 * restored around it). */
#ifndef CLG_PARALLEL_PIPE_H
#define CLG_PARALLEL_PIPE_H

#include <pthread.h>

#include "model/optim.h"
#include "parallel/team.h"
#include "parallel/trace.h"

#define CLG_PIPE_MAX_STAGES 16 /* lanes (replicas x stages) */
#define CLG_PIPE_MAX_MICRO 1024
#define CLG_PIPE_MAX_REPLICAS 8

enum { CLG_PIPE_1F1B = 0, CLG_PIPE_GPIPE = 1 };

typedef struct clg_pipe_params {
    int stages;        /* K (>= 1) */
    const char *cuts;  /* "conv2,fc1": cut after these layers (K-1 names); "conv3:0.4": inside conv3, after 40% of
                          its output channels (pipe_split.c; one such cut at most); NULL or "": balanced by each
                          layer's time measured on the first device at the micro-batch size (FLOPs where that
                          fails), with a cut inside a layer when K = 2 and no layer boundary comes within 3% */
    int micro;         /* M (>= 1; 0: 4K, at most the batch) */
    int schedule;      /* CLG_PIPE_1F1B or CLG_PIPE_GPIPE */
    int transfer;      /* CLG_PIPE_XFER_*: how tensors cross a cut */
    int replicas;      /* D: data-parallel pipelines (dp=D,pp=K over D x K devices; 0: 1) */
    int recompute;     /* 1: stash only the activations entering a stage and run its forward again before a
                          backward (less memory, one more forward); 0: a whole activation set per slot */
    int tensor;        /* T: tensor parallelism over T devices (tp=T alone: parallel/tensor.h; with K >= 2: each
                          stage over T devices, parallel/pptp.h; 0 or 1: none) */
    int whole_layers;  /* 1: the default partition cuts between layers only (tests comparing with the unsplit
                          arithmetic bitwise, checkpoints straight from the stages); 0: inside one when better */
    int wdefer;        /* dense weight gradients after the schedule (parallel/pipe_wdefer.h): 1 per micro-batch
                          (the accumulated bits), 2 one product over the step's samples, -1 off, 0 the option
                          pipe_wdefer */
    int wlate;         /* 1: a stage sends its input gradients before it computes its weight gradients
                          (parallel/pipe_wdefer.h; the same bits), -1 not, 0 the option pipe_wlate */
} clg_pipe_params;

/* Transfers across a cut: AUTO times both on the largest carried tensor at
 * creation and keeps the faster (device to device needs the stages' devices
 * in one cl_context; else host). */
enum { CLG_PIPE_XFER_AUTO = 0, CLG_PIPE_XFER_HOST = 1, CLG_PIPE_XFER_DEVICE = 2 };

/* "gpipe" / "1f1b" -> CLG_PIPE_*; -1 when unknown. */
CLG_INTERNAL int clg_pipe_schedule_parse(const char *name);
/* "pp=K" / "dp=D,pp=K" (NULL or "": 1, 1) -> K and D (replicas may be NULL: then D > 1 is refused); refusals
 * name the text. tp is parsed apart (clg_tp_parse_layout) and refused here. */
CLG_INTERNAL clg_status clg_pipe_parse_layout(clg_err *err, const char *spec, int *stages, int *replicas);

/* A tensor crossing a cut: layer `tensor`'s output, made on stage `from`,
 * read on stage `to`; host buffers hold the global batch (floats samples). */
typedef struct clg_pipe_edge {
    int tensor, from, to;
    size_t fps;                 /* floats per sample */
    int at;                     /* the receiver's tensor it lands in: `tensor`, or (a cut inside a layer: L@0's
                                   output) the concat L, at its channel 0, its gradient read from there */
    size_t pitch;               /* floats per sample of tensor `at` on the receiver (fps unless a slice) */
    float *hf, *hb;             /* activation / gradient of every sample of the step */
    int64_t *ready_f, *ready_b; /* per micro-batch: the step sequence number it was posted in */
    cl_mem *df, *db;            /* device to device: per micro-batch, buffers of the shared cl_context */
} clg_pipe_edge;

typedef struct clg_pipe_stage {
    int index, first, last;    /* index: lane d * K + s (replica d, stage s) */
    int d, s;
    clg_device *dev;           /* borrowed */
    clg_replica *rep;          /* reps[0]: holds the parameters the optimizer updates */
    clg_replica **reps;        /* nreps: one per stash slot (the others' weights copied from reps[0] after each
                                  update), or just reps[0] with recompute */
    int nreps;
    int *last_fwd;             /* per replica: micro-batch of its latest forward (-1: none this step) */
    int state_rep;             /* the replica whose running statistics are the latest (forwards chain them) */
    clg_optim *opt;
    int reads_input, has_loss;
    cl_mem xbuf, ybuf;         /* the global batch's inputs / labels (where read) */
    cl_mem gacc;               /* gradients summed over the micro-batches (arena layout) */
    cl_mem gscr;               /* a received gradient to add (several readers of one tensor) */
    size_t gscr_bytes;
    int nslots;                /* stash slots: micro-batches in flight at most */
    cl_mem *stash;             /* recompute: nslots * nin_edges, the entering activations of each slot */
    int *slot_of;              /* per micro-batch: its slot, -1 none */
    int inflight, peak_inflight;
    int nstate;                /* non-trainable parameters (batch-norm running statistics) */
    cl_mem **state;            /* per replica: its non-trainable parameters (nstate each) */
    cl_mem *state_save;
    size_t *state_n;           /* floats of each */
    int nrecompute;            /* forwards run again this step */
    float res[2];              /* {loss sum, correct} over the step's micro-batches (the loss stage) */
    float *lres;               /* the loss stage: per micro-batch {loss sum, correct}, read without waiting */
    char *written;             /* per layer: its activation's gradient received this backward (scratch) */
    double norm_sq;            /* squared norm of the accumulated gradient (clipping) */
    int overflow;              /* fp16: the accumulated gradient had an inf or NaN this step */
    double t_wait, t_end;      /* this step: seconds waiting for other stages; when its schedule ended */
    double cpu_sum;            /* the stage thread's CPU seconds (its device's kernels on PoCL's basic and
                                  its schedule; not its waits), summed over the steps after the first */
    int cpu_n;
    double cost, mib;          /* its layers' cost (pipe.cost) and the MiB it plans (table) */
    int cur_n;                 /* samples of the micro-batch its replica is running (pp x tp's all-reduce) */
    struct clg_pipe_wd *wd;    /* deferred weight gradients (pipe_wdefer.h): nwd layers */
    int nwd;
    struct clg_pipe_wl *wl;    /* weight gradients after the input gradients' sends (pipe_wdefer.h): nwl layers */
    int nwl;
    size_t *acc_lo, *acc_hi;   /* the arena ranges (floats) a micro-batch's backward accumulates: nacc */
    int nacc;
    clg_tensor *home;          /* in place (pipe.inplace): per replica and edge, the replica's own act[] of an
                                  entering tensor or dact[] of a leaving one (nreps x nedges), put back after
                                  each backward */
} clg_pipe_stage;

typedef struct clg_pipe {
    clg_ctx *ctx;
    clg_net *net;              /* the network the stages run: the caller's, or split_net */
    clg_net *user_net;         /* the caller's (borrowed): clg_pipe_sync, clg_pipe_rep_of name its layers */
    clg_net *split_net;        /* a cut inside a layer (pipe_split.c): the caller's with layer split_layer made
                                  L@0 (its first split_c output channels), L@1 (the rest) and a concat named L;
                                  owned; NULL: none */
    int split_layer, split_c;  /* in the caller's net; -1: no cut inside a layer */
    int K, M, schedule, mb;    /* mb: largest micro-batch */
    int D, L;                  /* data-parallel replicas of the pipeline; lanes D x K (st[0 .. L)) */
    int d2d;                   /* transfers device to device (clEnqueueCopyBuffer in the shared context) */
    int inplace;               /* d2d: a stage reads a received tensor from the transfer buffer itself (one copy,
                                  the sender's): entering activations with contiguous rows, gradients */
    int recompute;             /* clg_pipe_params.recompute */
    int wdefer;                /* clg_pipe_params.wdefer resolved: 0 off, 1 deferred per micro-batch, 2 one product */
    int wlate;                 /* clg_pipe_params.wlate resolved: 1 on */
    double t_host, t_dev;      /* AUTO: measured seconds of the largest carried tensor's transfer (0: not timed) */
    clg_pipe_stage st[CLG_PIPE_MAX_STAGES];
    int *stage_of;             /* per layer */
    double *cost;              /* per layer: measured ms of forward + backward of a micro-batch (measured), or
                                  GFLOP of a global batch's forward + backward */
    int measured;
    int auto_split;            /* the default partition cut inside a layer (K = 2): its balance is remembered */
    int bias_kind;             /* the weight-gradient modes (the remembered balance's key, pipe_cost.h) */
    int mem_moved;             /* the default partition moved a cut so that every stage fits its device's cap */
    clg_pipe_edge *edges;
    int nedges;
    size_t sample;             /* floats per input sample */
    int fp16;                  /* the net's fp16 storage: activations and their gradients carried in half */
    size_t esize;              /* bytes per carried element (2 with fp16, else 4) */
    float inv_loss_scale;      /* fp16: 1 / the loss scale in the loss gradient (set before a step; 1) */
    int overflow;              /* fp16: the last step's gradients had an inf or NaN: skipped, no update */
    clg_team *team;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int abort, fail_stage;     /* the first stage that failed this step, -1 none */
    clg_status fail_status;    /* its status (the others only abandon the step) */
    int64_t seq;               /* steps run (mailbox generations) */
    /* the step */
    const float *x;
    const int32_t *y;
    int n, nm;                 /* samples; micro-batches per replica */
    int cnt[CLG_PIPE_MAX_REPLICAS][CLG_PIPE_MAX_MICRO], off[CLG_PIPE_MAX_REPLICAS][CLG_PIPE_MAX_MICRO];
                               /* per replica and micro-batch: size, offset in the global batch */
    int rcnt[CLG_PIPE_MAX_REPLICAS]; /* samples of each replica */
    /* D > 1: per stage, the replicas' accumulated gradients and running
     * statistics summed on the host in replica order (the last to arrive
     * sums; every replica writes the same back) */
    float **ghost, **shost;    /* per lane: arena / state floats */
    float **gsum, **ssum;      /* per stage */
    size_t *sfloats;           /* per stage: state floats */
    int red_arrived[CLG_PIPE_MAX_STAGES];
    int64_t red_done[CLG_PIPE_MAX_STAGES];
    double lr, clip_norm;
    float grad_scale;
    uint32_t seed, step;
    int phase;                 /* 0 schedule, 1 update, 2 schedule and update (no global check between them) */
    int ended;                 /* phase 2: stages whose schedule ended this step */
    float gscale;
    const clg_hparams *hp;
    clg_trace *trace;          /* borrowed; NULL: none (host rows: forward, backward, re-run forward, waits and
                                  sends of each micro-batch per stage) */
    double bubble_sum;         /* sum over steps of the stages' idle share (waits for another stage, and from
                                  the end of a stage's schedule to the end of the slowest) */
    int bubble_n;
    /* fault injection (tests): stage fault_stage fails the backward of
     * micro-batch fault_mb of step fault_step as an enqueue error would */
    int fault_stage, fault_mb;
    int64_t fault_step;
    /* MPI ranks as an outer data-parallel level (parallel/hybrid.h; borrowed, NULL with one rank): x and y
     * hold this rank's slice of the global batch, whose first sample has global index base (dropout); each
     * stage's summed gradients and running statistics are reduced over the ranks before the update */
    struct clg_hybrid *hy;
    int base;
    struct clg_pipe_zero *zero; /* --shard-optimizer with dp x pp (parallel/pipe_zero.h; owned), NULL: none */
    /* pp x tp (parallel/pptp.h): T > 1 tensor-parallel lanes per stage; D above counts the copies (data
     * replicas x T: copy r is data replica r / T's lane r % T) */
    int T;
    clg_net *tp_net;            /* owned: the lane network (the split widths divided by T) that net points to */
    int *tp_role;               /* per layer: CLG_TP_* (tensor.h) */
    struct clg_tp *tpg;         /* the stage groups' all-reduce (owned) */
    struct clg_pptp_hook {
        struct clg_pipe *p;
        int l, k;               /* lane, stash replica */
    } *tp_hooks;
} clg_pipe;

/* D replicas of K stages on the context's devices devs[0..ndev) (ndev ==
 * D x K: refused otherwise; replica d's stage s on devs[d * K + s]), weights
 * from seed, micro-batches of ceil(batch / (D x M)). */
CLG_INTERNAL clg_status clg_pipe_create(clg_ctx *ctx, clg_net *net, const int *devs, int ndev, uint64_t seed,
                                        int batch, const clg_pipe_params *p, clg_pipe **out);
CLG_INTERNAL void clg_pipe_free(clg_pipe *p);
/* The partition: per stage its device, layers, measured ms (or GFLOP) per step and planned MiB. */
CLG_INTERNAL void clg_pipe_print(const clg_pipe *p, FILE *f);
/* One training step over n host samples (x: n * sample floats, y: n labels):
 * every micro-batch forward and backward on the stages by the schedule, the
 * gradients accumulated, then the optimizer on every stage (hp: created on
 * the first step). grad_scale: the loss gradient's scale (1 / global
 * batch). res (may be NULL): {loss sum, correct} of the whole batch. A
 * failure names the stage and device; the other stages stop. */
CLG_INTERNAL clg_status clg_pipe_train_step(clg_pipe *p, const clg_hparams *hp, const float *x, const int32_t *y,
                                            int n, double lr, float grad_scale, double clip_norm, uint32_t seed,
                                            uint32_t step, float *res);
/* Forward only over n host samples (at most the global batch; x: n *
 * sample floats; y: n labels or NULL): the stages' first replicas run in
 * order on the calling thread, micro-batch by micro-batch, without
 * dropout and with batch norm on its running statistics, the tensors
 * crossing a cut through host memory (no device holds the whole network).
 * res (may be NULL; needs y): {loss sum, correct}; out (may be NULL): the
 * last layer's outputs, n rows. A failure names the stage and device. */
CLG_INTERNAL clg_status clg_pipe_forward(clg_pipe *p, const float *x, const int32_t *y, int n, float *res,
                                         float *out);
/* Copies every parameter (weights, batch-norm running statistics) and its
 * optimizer state (and the optimizer's step count) from the stages into
 * full, a whole-network replica of the same net (to_full = 1: before a
 * checkpoint or an evaluation on it), or from full into the stages
 * (to_full = 0: after a checkpoint was loaded into it). full_opt may be
 * NULL (weights only); the stages' optimizers are created from hp when
 * missing. Through host memory; blocking. */
CLG_INTERNAL clg_status clg_pipe_sync(clg_pipe *p, clg_replica *full, clg_optim *full_opt, const clg_hparams *hp,
                                      int to_full);
/* After new values were written into the stages' first replicas (a
 * checkpoint loaded straight into them): the other stash slots and the
 * derived copies updated. */
CLG_INTERNAL clg_status clg_pipe_loaded(clg_pipe *p);
/* Creates every stage's optimizer (from hp) where missing. */
CLG_INTERNAL clg_status clg_pipe_ensure_optim(clg_pipe *p, const clg_hparams *hp);
/* Mean idle share of the stages over the steps since the last reset (the
 * bubble; the ideal for equal stages is (K-1)/(M+K-1)); -1 before a step. */
static inline double clg_pipe_bubble(const clg_pipe *p) { return p->bubble_n ? p->bubble_sum / p->bubble_n : -1; }
static inline void clg_pipe_bubble_reset(clg_pipe *p) { p->bubble_sum = 0, p->bubble_n = 0; }
/* Largest number of micro-batches whose activations stage s held at once
 * (since creation). */
static inline int clg_pipe_peak(const clg_pipe *p, int s) { return p->st[s].peak_inflight; }
/* Memory of lane s's device (bytes): the stage's parameter arenas (every
 * stash replica's), optimizer state and planned activations, the rest of
 * the device's account in use (workspace, feeds, carried tensors), its
 * peak and cap (clg_dp_mem of parallel/dp.h). */
struct clg_dp_mem;
CLG_INTERNAL void clg_pipe_memory(const clg_pipe *p, int s, struct clg_dp_mem *out);
/* The stage owning layer i of the caller's net and its replica (parameters, checkpoints); NULL for a layer cut
 * inside (its parameters are on two stages: clg_pipe_sync gathers them). */
static inline clg_replica *clg_pipe_rep_of(const clg_pipe *p, int layer)
{
    if (p->split_layer >= 0 && layer >= p->split_layer)
        layer = layer == p->split_layer ? -1 : layer + 2;
    return layer < 0 ? NULL : p->st[p->stage_of[layer]].rep;
}

// ---- a cut inside a layer (pipe_split.c) ----

/* The output channels of layer `layer` when it can be cut inside (a convolution with groups 1, or a dense layer
 * on features, not the last layer), else 0. */
CLG_INTERNAL int clg_pipe_split_channels(const clg_net *net, int layer);
/* Finds a "name:fraction" item in cuts ("conv2,conv3:0.4"): *layer its index (-1: none) and *c the channels
 * before the cut (fraction x C rounded); rest (cap bytes) the cuts by name in the split network (the item made
 * "name@0"). Refuses a fraction outside (0, 1), one that leaves a side without a channel, a layer that cannot be
 * split and a second such item, naming them. */
CLG_INTERNAL clg_status clg_pipe_split_spec(clg_err *err, const clg_net *net, const char *cuts, int *layer, int *c,
                                            char *rest, size_t cap);
/* The default partition's choice for K = 2 from per-layer costs and the best cut between layers (cut[0]): the
 * layer to cut inside (-1: none) and *c its channels before the cut (pipe.c: when that cut leaves the larger stage
 * more than 3% over half, the layer where half the cost falls, in whole tiles of 8 or 4 channels where possible,
 * if that predicts a smaller largest stage). bias: cost added to the second stage (clg_pipe_bias_get); prev: the
 * last run's cut inside a layer ((layer + 1) * 65536 + channels; 0 none), kept unless it predicts a largest stage
 * more than 2% over the new choice's (so channel counts do not flip between runs on figures that jitter). */
CLG_INTERNAL int clg_pipe_split_auto(const clg_net *net, const double *cost, const int *cut, double bias, int prev,
                                     int *c);
/* A cut inside a layer in fp32 without tensor parallelism: the edge carrying L@0's output lands straight in its
 * channel slice of the concat's output on the stage after the cut, its gradient read from that slice of the
 * concat's output gradient (strided transfers), and that stage's concat skips the input (clg_layer.in_place). */
CLG_INTERNAL void clg_pipe_split_inplace(clg_pipe *p);
/* The network net with layer `layer` cut after its first c output channels (see pipe_split.c); *out owned by the
 * caller (clg_net_free). */
CLG_INTERNAL clg_status clg_pipe_split_net(clg_err *err, const clg_net *net, int layer, int c, int batch,
                                           clg_net **out);

#endif
