/* Data parallelism over the lanes of a context: one replica per device, the
 * global batch split by measured speed, gradients reduced in buckets while
 * backward still runs, the optimizer on every lane from the same reduced
 * gradient (replicas stay bitwise identical). One device is the N = 1 case
 * of the same code: its reduction is the identity.
 *
 * One training step (clg_dp_train_begin / _end), on every lane at once:
 *   use stage s (its slice of the global batch) -> forward -> loss read
 *   -> backward; after the layer that finishes a bucket, the bucket's read
 *      to the host is enqueued (reverse layer order: last layers first)
 *   -> as each bucket reaches the host on every active lane, the lanes sum
 *      it in parts (nparts) in fixed lane order (0, 1, ...) with its squared
 *      norm -> every lane writes the sum back -> (BN running statistics:
 *      averaged weighted by slice size) -> fp16 overflow / clip decided from
 *      the global gradient -> optimizer on every lane.
 * Sharded optimizer state (shard_optimizer): each lane writes back only its
 * slice of every bucket, updates only that slice (its optimizer holds that
 * slice's state), then the lanes gather the updated slices through the host.
 * The caller fills and uploads the next batch between begin and end. */
#ifndef CLG_PARALLEL_DP_H
#define CLG_PARALLEL_DP_H

#include <pthread.h>

#include "parallel/comm.h"
#include "parallel/lane.h"
#include "parallel/team.h"
#include "parallel/trace.h"

#define CLG_DP_MAX_LANES 16
#define CLG_DP_SPREAD_WIN 16 /* steps in the window of the step-time spread check */

typedef struct clg_dp_params {
    const char *split; /* "auto" (default: by measured speed), "even", or weights "3,1" */
    double bucket_mb;  /* reduction bucket size in MiB (default 25) */
    const char *reduce; /* "auto" (default: the faster, measured), "host" or "device" (device to device: lanes
                           sharing one cl_context), or "copy" (the host path through copies even where it could
                           map the arenas: tests, A/B); the environment's CLGRAD_DP_REDUCE overrides */
    const struct clg_pipe_params *pipe; /* pipeline layout (pipe.h); NULL or 1 stage x 1 micro-batch: none */
    int shard_optimizer; /* 1: ZeRO-1, each lane keeps the optimizer state of its 1/N slice of the parameter
                            arena, updates that slice, and the lanes gather the updated slices */
    int stub_lanes;      /* 1: each lane's replica holds only the last layer (clg_lane_init; a pipeline's lane) */
} clg_dp_params;

/* Parses a split ("auto" or NULL, "even", or n weights "3,1": each a plain decimal in [0, 1e6], the non-zero
 * ones within a ratio of 1e6, not all 0) into n shares summing to 1; *fixed 0 for auto. Refusals name the split. */
CLG_INTERNAL clg_status clg_dp_parse_split(clg_err *err, const char *spec, int n, double *w, int *fixed);

/* The step handed to the lanes. */
typedef struct clg_dp_job {
    int stage;
    int training;         /* 1 train, 0 evaluate (labels), -1 predict */
    double lr;
    float grad_scale;     /* loss-gradient scale: loss scale / global batch */
    float inv_loss_scale; /* fp16: 1 / loss scale; else 1 */
    int fp16;
    double clip_norm;
    uint32_t seed, step;  /* dropout: (seed, step, global sample index) */
    float *res;           /* 2 floats per lane: {loss sum, correct} (may be NULL) */
    cl_event *res_ev;     /* per lane: the read of res (may be NULL: blocking) */
    float *out;           /* forward: the whole batch's outputs (may be NULL) */
    size_t out_w;         /* floats per sample of out */
    /* results of a training step */
    int overflow;         /* fp16: inf/NaN gradients, the update was skipped */
    double norm;          /* global gradient norm (when clipping or N > 1) */
} clg_dp_job;

typedef struct clg_dp_hook {
    struct clg_dp *dp;
    int lane;
    clg_layer_sync sync; /* the lane's layers' cross-device exchange (synchronized batch norm) */
} clg_dp_hook;

/* One exchange point of a step (layer, phase): every active lane's vector. */
typedef struct clg_dp_gather {
    size_t n;               /* doubles per lane (0: not used yet) */
    double *buf;            /* lanes * n */
    const double **all;     /* the active lanes' vectors in lane order */
    int arrived, done;
} clg_dp_gather;

typedef struct clg_dp {
    clg_ctx *ctx;
    clg_net *net;
    int n;                 /* lanes */
    clg_lane *lanes;
    clg_dp_hook *hooks;
    clg_team *team;
    size_t sample;         /* floats per sample */
    /* split */
    int split_fixed;       /* weights given by the caller */
    double share[CLG_DP_MAX_LANES];
    int cnt[CLG_STAGES][CLG_DP_MAX_LANES], total[CLG_STAGES]; /* the split of each stage */
    int min_slice;         /* fewest samples an active lane may get (2 with batch norm: one sample has
                              no variance) */
    int64_t measured;      /* training steps measured */
    int rebalances;
    int calibrations;      /* warm steps the split was set from (2: settled) */
    int64_t settled_at;    /* measured when the second calibration was done (later looks: every 8 steps) */
    double last_move[CLG_DP_MAX_LANES]; /* the shares' previous modelled change (consistency) */
    int prepares;          /* passes run to meet a new per-lane batch size outside a step */
    double prepare_s;      /* seconds those passes took */
    int last_prepared;     /* the last clg_dp_train_end ran one (clg_dp_settled) */
    int prep_lane;         /* the lane whose preparation runs (one at a time) */
    int same_kind;         /* every lane's device has the same fingerprint: the calibration moves the split
                              only for a modelled step 5% shorter (timing noise is no speed difference) */
    int cpu_timed;         /* the last look timed the lanes by their threads' CPU time (same kind, computing
                              in the lane's own thread: PoCL basic), not by the wall time */
    int frozen;            /* 1: the looks keep the split (bench train's timed steps: the split settled in
                              the warm-up; a move there would meet new batch sizes inside the timed window) */
    int moves_held;        /* looks that would have moved the split but kept it (frozen, or a move to new
                              batch sizes that would not pay back its preparation: rebalance) */
    /* step-time spread (clg_dp_spread_suspect): wall times of warm steps */
    double t_begin;
    int64_t steps_seen;    /* training steps ended */
    double steps_t[CLG_DP_SPREAD_WIN];
    int nsteps_t;          /* recorded (ring position: nsteps_t % CLG_DP_SPREAD_WIN) */
    char oversub[320];     /* the warning once the spread suggested oversubscription ("" none) */
    int oversub_shown;     /* the caller printed it */
    /* reduction (N > 1) */
    clg_grad_layout lay;
    int nbuckets;
    size_t *b_off, *b_bytes;
    int *b_layer;          /* a bucket is final after this layer's backward */
    size_t bucket_bytes;
    float *gsum;           /* the reduced gradients (host) */
    double *b_sumsq;       /* squared norm of each reduced bucket */
    int *arrived, *summed;
    /* the host path sums a bucket in parts (work-item ranges of its norm's grid: clg_dp_bucket_part), taken
     * by whichever lanes are free once every lane's copy has arrived (the one to arrive last first); the
     * one finishing the last part adds up the norm: bitwise what one thread summing it all gives (trace:
     * the last lane's first part is "sum bucket B", every other part "sum bucket B (part)") */
    int nparts;
    int *p_next, *p_fin;   /* per bucket: parts taken, parts finished */
    float *b_items;        /* per bucket: its norm's per-work-item sums (b_grid floats each) */
    size_t b_grid;
    /* device-to-device reduction (dreduce.c): every lane's device in one
     * cl_context, buckets summed by a kernel reading the arenas */
    int dev_reduce;        /* 1: on a device, 0: on the host */
    int red_wg;            /* lane_add's work-group size on lane 0's device (the norm's partial sums) */
    double t_red_host, t_red_dev; /* measured seconds per whole-arena reduction (0: not measured) */
    cl_mem gred;           /* the reduced gradients (arena layout) */
    cl_mem gpart;          /* per bucket: partial sums of squares of the reduced gradient */
    float *hpart;          /* their host copy */
    cl_event *sev, *pev;   /* per bucket: sum done, partials read */
    /* host path on devices whose memory is the host's (CPU devices: a map is the buffer's own storage, no
     * copy): with a single bucket, each active lane maps its arena for reading once backward is done
     * instead of reading it into ghost, the parts sum straight from the lanes' arenas, and a lane unmaps
     * once the bucket is summed, before its write-back (no command writes the arena while it is mapped, as
     * OpenCL requires; with several buckets a later backward kernel would) */
    int hmap;
    void **bmap;           /* per lane: its arena's mapping (NULL: not mapped) */
    /* this step (hmap, one rank, every lane active): the arenas are mapped for writing too and the parts
     * store the sum back into every lane's arena, so no lane writes it back from gsum */
    int inplace;
    /* sharded optimizer state (clg_dp_params.shard_optimizer, N > 1): lane l
     * owns floats [sh_k0[l], sh_k1[l]) of the parameter arena (aligned for
     * sub-buffers): only that part of each reduced bucket is written back
     * (reduce-scatter), its optimizer updates only it, then every lane reads
     * its updated slice into phost and writes the others' from there
     * (all-gather; p_arrived / p_done) */
    int shard;
    size_t sh_k0[CLG_DP_MAX_LANES], sh_k1[CLG_DP_MAX_LANES];
    size_t align;          /* the arena's alignment, bytes */
    float *phost;
    int p_arrived, p_done;
    clg_dp_gather *gathers; /* per layer and phase (2 * layers) */
    clg_param_ref *srefs;  /* non-trainable state (lane 0's refs: shapes) */
    int nstate;
    size_t state_floats;
    float *ssum;
    int s_arrived, s_done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* spinning waits (option dp_spin_us): a lane waiting for another (the next job, a bucket's sum, the
     * lanes' end) spins this long (yielding the core) before it sleeps on a condition variable, but only
     * where the lanes compute in their own threads (cpu_timed: PoCL basic) and have a core each, and not
     * for SPIN_BACKOFF steps after a step whose waits mostly outlasted their spin (a loaded machine: a lane
     * waits for a preempted one). The flags and counters a spinning lane reads (abort, arrived, summed,
     * p_next, done flags) are written with atomic stores, under mu as before. */
    int spin_us;           /* the option */
    int spin_now;          /* this step's */
    int spin_hit, spin_miss; /* this step's waits that ended within their spin, or slept */
    int spin_off;          /* steps left without spinning */
    int ncpu;              /* online CPUs */
    int abort, fail_lane;
    clg_status fail_status; /* of the first lane that failed (not the ones abandoning the step) */
    clg_dp_job job;
    /* test aid (option test_slow_lane = L:F): lane L waits F times its compute
     * time after each step, posing as a device 1/(1+F) as fast */
    int slow_lane;
    double slow_factor;
    clg_trace *trace;      /* borrowed; NULL: no trace */
    /* called once (then cleared) when the first training step's lanes have ended, before the split is
     * calibrated or new batch sizes measured (clg_dp_train_end): the caller stops its precompile helper */
    void (*first_end)(void *user);
    void *first_end_user;
    /* fault injection (tests): lane fault_lane fails training step
     * fault_step (job step) as an enqueue error would */
    int fault_lane;
    int64_t fault_step;
    /* across MPI ranks (comm.h): the global batch is split over the ranks
     * first (clg_comm_slice), total[] counts the global batch; each bucket's
     * host sum is all-reduced over the ranks on its own channel (started by
     * the lane that summed it, waited for before the write-back) */
    int ranks;             /* clg_comm_size() */
    clg_comm_op **b_op;    /* per bucket (NULL with one rank) */
    clg_comm_op *s_op;     /* the averaged non-trainable state */
} clg_dp;

/* Lanes on the context's devices devs[0..ndev) (each at most once), all with
 * replicas from seed, feed buffers for `batch` samples. */
CLG_INTERNAL clg_status clg_dp_create(clg_ctx *ctx, clg_net *net, const int *devs, int ndev, uint64_t seed,
                                      const clg_dp_params *p, clg_dp **out);
CLG_INTERNAL void clg_dp_free(clg_dp *dp);
/* Context device indices selected by sel ("all", "gpu", "cpu", "0,2",
 * "name:TEXT"; indices count the context's devices); NULL: the one device
 * `device`. */
CLG_INTERNAL clg_status clg_dp_select(clg_ctx *ctx, const char *sel, int device, int *devs, int *ndev);

/* Device-to-device reduction (dreduce.c). Setup picks the path (mode as
 * clg_dp_params.reduce); sum: lane r enqueues bucket b's sum over the active
 * lanes act[0..na) and the read of its partial squares; writeback: lane l
 * copies the sum into its arena; sumsq: the squared norm of the whole
 * reduced gradient (waits for every bucket's partials). writeback copies
 * bytes [off, off + bytes) of bucket b (all of it, or a shard's part). */
CLG_INTERNAL clg_status clg_dp_dev_setup(clg_dp *dp, const char *mode, clg_err *err);
CLG_INTERNAL clg_status clg_dp_dev_sum(clg_dp *dp, clg_lane *r, int b, const int *act, int na);
CLG_INTERNAL clg_status clg_dp_dev_writeback(clg_dp *dp, clg_lane *l, int b, size_t off, size_t bytes,
                                             cl_event *ev);
CLG_INTERNAL clg_status clg_dp_dev_sumsq(clg_dp *dp, clg_lane *l, double *sq);
/* The host path's squared norm of the reduced bucket x[0..n): to the bit
 * what the device path computes for it (clg_optk_sumsq_host), so the global
 * norm, and a clipped update, do not depend on the path dp_reduce = auto
 * measured in this process. */
CLG_INTERNAL double clg_dp_bucket_sumsq(const clg_dp *dp, const float *x, size_t n);
/* Part p (of dp->nparts) of bucket b's host sum over the active lanes act[0..na) in that order, into gsum,
 * with its norm's per-work-item sums; tree: the bucket's squared norm once every part is done (to the bit
 * clg_dp_bucket_sumsq of the summed bucket). */
CLG_INTERNAL void clg_dp_bucket_part(clg_dp *dp, int b, int p, const int *act, int na);
CLG_INTERNAL double clg_dp_bucket_tree(const clg_dp *dp, int b);
/* Whether the host path maps the lanes' arenas (dp->hmap) for reduction mode `mode` ("copy": never); after
 * clg_dp_dev_setup. */
CLG_INTERNAL int clg_dp_host_maps(const clg_dp *dp, const char *mode);
/* Floats of b_items per bucket (after clg_dp_dev_setup). */
CLG_INTERNAL size_t clg_dp_bucket_items(const clg_dp *dp);
CLG_INTERNAL void clg_dp_dev_free(clg_dp *dp);

/* Waits until stage s's host data may be overwritten. */
CLG_INTERNAL clg_status clg_dp_stage_wait(clg_dp *dp, int s);
/* Splits n samples of the host batch (x, y; y may be NULL) by the current
 * shares and uploads every lane's slice into stage s. */
CLG_INTERNAL clg_status clg_dp_upload(clg_dp *dp, int s, const float *x, const int32_t *y, int n);

/* Ensures every lane has its optimizer (sharded: the state of its slice only). */
CLG_INTERNAL clg_status clg_dp_ensure_optim(clg_dp *dp, const clg_hparams *hp);
/* Optimizer state `which` (1: momentum / first moment, 2: second moment) of
 * trainable parameter i (clg_replica_params order) from the lanes into host
 * (numel floats), or (write) from host into them: lane 0's copy and every
 * lane's, or with sharded state the parts each lane owns. Blocking. */
CLG_INTERNAL clg_status clg_dp_optim_state(clg_dp *dp, int i, int which, float *host, int write);
/* Per-device memory (bytes) of lane l: parameters (arenas, fp16 copies),
 * optimizer state, activations (the planned buffers), the rest of what the
 * buffer pool hands out (workspace, feeds), and the peak of the device's
 * account (pool in use + arenas). */
typedef struct clg_dp_mem {
    uint64_t params, optim, activations, workspace, peak, limit;
} clg_dp_mem;
CLG_INTERNAL void clg_dp_memory(const clg_dp *dp, int l, clg_dp_mem *out);
/* A training step on stage s (job filled by the caller; job->stage = s).
 * begin returns once every lane has started (N = 1: once its commands are
 * enqueued); end waits and updates the measured speeds and shares. */
CLG_INTERNAL void clg_dp_train_begin(clg_dp *dp, const clg_dp_job *job);
CLG_INTERNAL clg_status clg_dp_train_end(clg_dp *dp, clg_dp_job *job);
/* Meets the batch sizes the current shares give the lanes, where new to a
 * lane, outside any step: one forward and backward on meaningless values
 * builds their kernels and measures their algorithms; weights, optimizer
 * state and batch-norm running statistics are kept (clg_dp_train_end calls
 * it when the split moves to new sizes). One lane after the other: each
 * measures alone, and a lane of the same kind after it finds the
 * measurements made. */
CLG_INTERNAL clg_status clg_dp_prepare(clg_dp *dp);
/* 1 once the lanes run at speed: at least two training steps ended, the
 * split calibrated (auto: two calibrations; fixed weights or one lane: no
 * calibration), and the last step neither met a new batch size inside it
 * nor was followed by a preparation (so the next steps build and measure
 * nothing). What bench train's warm-up waits for. */
CLG_INTERNAL int clg_dp_settled(const clg_dp *dp);
/* Forward only (evaluate / predict) on stage s; blocking. */
CLG_INTERNAL clg_status clg_dp_forward(clg_dp *dp, clg_dp_job *job);
/* Waits for every lane's queues. */
CLG_INTERNAL clg_status clg_dp_finish(clg_dp *dp);
/* "0.52/0.48" (the shares of the last split). */
CLG_INTERNAL void clg_dp_shares(const clg_dp *dp, char *buf, size_t cap);
/* Step times t[0..n) (any order) spread as on a machine with more busy
 * threads than free cores: the 90th percentile above 2x the median, or one
 * step in 8 above 4x it (preemption stalls, not a one-off). *med and *p90
 * receive the figures (0 when n < 8: too few to judge, never suspect). */
CLG_INTERNAL int clg_dp_spread_suspect(const double *t, int n, double *med, double *p90);
/* The oversubscription warning, once: the text the first time it is asked
 * for after the spread check fired, NULL otherwise. */
CLG_INTERNAL const char *clg_dp_take_warning(clg_dp *dp);

#endif
