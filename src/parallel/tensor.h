/* Tensor parallelism (issue #22, Megatron style): T devices ("lanes") each
 * run the whole network on the whole batch, but the weights of split layer
 * pairs are divided between them:
 *
 *   [dense] A (column-split) -> element-wise layers -> [dense] B (row-split)
 *
 * A keeps out/T rows of its weight and bias on each lane (lane t: rows
 * [t out/T, (t+1) out/T)), so its output and the element-wise layers after
 * it ([activation], [dropout]) hold lane t's slice of the features; B keeps
 * in/T columns of its weight (the same slice of its input features), so
 * each lane computes a partial product of B's output. Forward: the partial
 * outputs are all-reduced (summed in lane order; B's bias lives on lane 0
 * only, zero and kept zero elsewhere, so it is added once). Backward: B's
 * output gradient is the same on every lane; A's input gradient is a
 * partial sum and is all-reduced before the layer that produced A's input
 * (nothing when A reads the network input). Every other layer is replicated
 * (the same weights on every lane, identical inputs and gradients, so the
 * lanes stay equal without a reduction); the optimizer runs on every lane
 * over its own slices.
 *
 * Pairs are found in layer order: A is a [dense] (not tied, not on a
 * sequence) or a [convolutional] (one group) whose output, through a chain
 * of single-consumer per-channel layers ([activation], [dropout],
 * [maxpool], [avgpool], [gap], [flatten]), is read only by B, a [dense] or
 * [convolutional] with a linear activation (the sum must come before a
 * non-linearity); A's input is the network input or a layer read by A
 * alone. A convolution A is split by output channels (filters), B by the
 * same slice of its input channels (a [dense] after [flatten]: the same
 * slice of its channel-major input features). A pair whose width (A's
 * units or filters) T does not divide is refused, as is a model with no
 * pair.
 *
 * The lanes' networks are built from the model text with A's width divided
 * by T; their parameters are the slices of a whole-network replica's
 * (clg_tp_sync scatters them from it and gathers them back, optimizer state
 * included, for checkpoints in the one-device format; at creation, one
 * layer's replica at a time). Dropout inside a
 * split chain draws the mask of each element from its position in the
 * whole layer (clg_layer_set_rng_slice), so the masks equal one device's.
 * The all-reduce goes through host memory (each lane reads its partial, the
 * lanes sum 1/T of the elements each in lane order, each writes the sum
 * back), the data-parallel reduction's path on PoCL.
 *
 * dp x tp (D groups of T lanes): group d takes 1/D of the batch (sizes
 * differ by at most one; dropout by global sample index) and runs the above
 * on its T lanes; after backward, the gradient arenas of the lanes holding
 * the same slice are summed over the groups in group order (host, each of
 * those D lanes summing 1/D of the arena), so every group's copy of a slice
 * gets the same update. Running statistics (batch norm) are refused there:
 * the groups would need to average them. */
#ifndef CLG_PARALLEL_TENSOR_H
#define CLG_PARALLEL_TENSOR_H

#include <pthread.h>
#include <stdint.h>

#include "model/optim.h"
#include "parallel/team.h"
#include "parallel/trace.h"

#define CLG_TP_MAX 8

enum { CLG_TP_REPL = 0, CLG_TP_COL = 1, CLG_TP_MID = 2, CLG_TP_ROW = 3 };

/* "tp=T" out of a layout ("dp=D,tp=T", "pp=K,tp=T"): *tp (1 when absent) and, with tp > 1, *dp (1 when
 * absent); the layout without them in rest (cap bytes; "" when nothing else). */
CLG_INTERNAL clg_status clg_tp_parse_layout(clg_err *err, const char *spec, int *tp, int *dp, char *rest,
                                            size_t cap);

typedef struct clg_tp_lane {
    clg_device *dev;        /* borrowed */
    clg_net *net;           /* owned: the model with the split layers' widths divided by T */
    clg_replica *rep;
    clg_optim *opt;
    cl_mem xbuf, ybuf;      /* the whole batch's inputs and labels */
} clg_tp_lane;

typedef struct clg_tp {
    clg_ctx *ctx;
    clg_net *net;           /* borrowed: the whole model */
    int T;                  /* devices a split layer is divided over */
    int D, L;               /* dp x tp: D groups of T lanes, each group taking 1/D of the batch (L = D T lanes:
                               group d's lane t is ln[d T + t]); 1 and T without dp */
    int *role;              /* per layer: CLG_TP_* (MID: an element-wise layer between a pair) */
    int npairs;
    clg_tp_lane ln[CLG_TP_MAX];
    clg_team *team;
    size_t sample;          /* floats per input sample */
    float *red;             /* the all-reduce: T partials of the largest reduced tensor, then their sum */
    size_t red_cap;         /* floats per partial (each group has T partials and a sum) */
    float *gred;            /* dp x tp: every lane's gradient arena, then the T sums */
    size_t arena_floats;    /* a lane's gradient arena (the same on every lane) */
    struct clg_tp_hook {
        struct clg_tp *p;
        int l;
    } hook[CLG_TP_MAX];      /* each lane replica's after_layer user */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int bcount[CLG_TP_MAX + 1], abort, fail_lane; /* barriers: per group, [D] all lanes */
    int64_t bgen[CLG_TP_MAX + 1];
    clg_status fail_status; /* the failing lane's (the others only abandon the step) */
    /* the step */
    const float *x;
    const int32_t *y;
    int n;
    int cnt[CLG_TP_MAX], off[CLG_TP_MAX]; /* per group: its samples, the first one's index in the batch */
    double lr, clip_norm;
    float grad_scale, gscale; /* gscale: the clipping factor of the update (1: none) */
    double sq[CLG_TP_MAX][2]; /* clipping: per lane of group 0, squared norms of its split and replicated gradients */
    uint32_t seed, step;
    int phase;              /* 0 forward + backward, 1 optimizer */
    float *res[CLG_TP_MAX]; /* per group: its lane 0's {loss sum, correct} */
    clg_trace *trace;       /* borrowed; NULL: none (host rows per lane: forward, backward, each all-reduce with
                               its wait, the optimizer) */
    /* fault injection (tests): lane fault_lane fails right after the forward of its first row-split layer in
     * step fault_step, as an enqueue error would (-1: never) */
    int fault_lane;
    int64_t fault_step;
    /* (tests, fp16) lane inf_lane finds an inf in its summed gradients in step fault_step (-1: never) */
    int inf_lane;
    /* MPI ranks as an outer data-parallel level (parallel/hybrid.h; borrowed, NULL with one rank): x and y
     * hold this rank's slice of the global batch, whose first sample has global index base (dropout); each
     * slice's gradient sum (over the groups) is summed over the ranks (channel t) before the update */
    struct clg_hybrid *hy;
    int base;
    /* fp16 storage (the model's): each lane keeps fp32 master weights of its slices and half activations; the
     * partial products are summed in fp32 before their rounding to half (clg_replica before_round). Dynamic
     * loss scaling: each lane unscales its summed gradients by inv_loss_scale (set by the caller) and checks
     * them; overflow (after a step: skipped on every lane) is the OR over all lanes, so one lane's inf skips the
     * step everywhere */
    int fp16, overflow, ovf[CLG_TP_MAX];
    float inv_loss_scale;
    /* --shard-optimizer with dp x tp (ZeRO-1 within the layout; set before the first step, D > 1): each slice's
     * optimizer state is split over its D lanes, group d's lane keeping floats [sh_k0[d], sh_k1[d]) of the
     * slice's arena (the same layout on every lane). The gradient sum over the groups is reduce-scattered (each
     * lane gets the sum of its part only), each lane updates its part, and the updated parts are all-gathered
     * through host memory (pgat: a slice's arena per t). */
    int shard;
    size_t sh_k0[CLG_TP_MAX], sh_k1[CLG_TP_MAX];
    float *pgat;
} clg_tp;

/* D x T = ndev lanes on the context's devices devs[0..ndev) (D: data-parallel groups, 0 or 1: none); the split
 * layers found in net (refused: none, or a width T does not divide); weights the slices of those one device
 * draws from seed (drawn layer by layer on the first device). */
CLG_INTERNAL clg_status clg_tp_create(clg_ctx *ctx, clg_net *net, const int *devs, int ndev, int T, int D,
                                      uint64_t seed, clg_tp **out);
CLG_INTERNAL void clg_tp_free(clg_tp *p);
/* --shard-optimizer (before the first step): each slice's optimizer state split over its D data-parallel lanes
 * (nothing with D = 1: each lane's state is already its slice's alone). */
CLG_INTERNAL clg_status clg_tp_shard(clg_tp *p);
/* Prints the split layers and the lanes. */
CLG_INTERNAL void clg_tp_print(const clg_tp *p, FILE *f);
/* One training step over n host samples (every group its 1/D, each lane of
 * a group the group's samples): forward, backward, the optimizer on every
 * lane (created from hp on the first step). res (may be NULL): {loss sum,
 * correct}. clip_norm > 0: the update scaled to the global gradient norm
 * (every slice counted once, read to the host and summed in double). */
CLG_INTERNAL clg_status clg_tp_train_step(clg_tp *p, const clg_hparams *hp, const float *x, const int32_t *y, int n,
                                          double lr, float grad_scale, double clip_norm, uint32_t seed,
                                          uint32_t step, float *res);
/* Memory of lane l's device (bytes): the lane's parameter arena, optimizer
 * state and planned activations, the rest of the device's account in use,
 * its peak and cap (clg_dp_mem of parallel/dp.h). */
struct clg_dp_mem;
CLG_INTERNAL void clg_tp_memory(const clg_tp *p, int l, struct clg_dp_mem *out);
/* Parameters (weights, running statistics) and their optimizer state
 * (full_opt may be NULL: weights only) gathered from the lanes into full
 * (to_full = 1) or scattered from full into the lanes (0). Blocking. */
CLG_INTERNAL clg_status clg_tp_sync(clg_tp *p, clg_replica *full, clg_optim *full_opt, const clg_hparams *hp,
                                    int to_full);

// ---- pieces over a layer range (tensor.c; the pipeline's pp x tp, pptp.c, uses them per stage) ----

/* The split pairs with both layers in [first, last] (role[first..last] set: CLG_TP_*); refused: a pair's width
 * that T does not divide. *npairs may be 0. */
CLG_INTERNAL clg_status clg_tp_find_pairs(clg_err *err, const clg_net *net, int first, int last, int T, int *role,
                                          int *npairs);
/* The model text with every column-split layer's width divided by T (malloc'd; NULL: out of memory). */
CLG_INTERNAL char *clg_tp_lane_text(const clg_net *net, const int *role, int T);
/* What part of a whole parameter (ref: of the whole net) lane t holds: rows [r0, r0 + rows) x columns [c0, c0 +
 * cols) of a (R, C) matrix (a vector: R = 1). zero: none (the row-split bias on lanes > 0: zero there). */
typedef struct clg_tp_slice {
    size_t R, C, r0, rows, c0, cols;
    int zero;
} clg_tp_slice;
CLG_INTERNAL clg_tp_slice clg_tp_slice_of(const int *role, const clg_net *net, int T, const clg_param_ref *ref,
                                          int t);
/* whole <-> part (rows x cols floats) by s. */
CLG_INTERNAL void clg_tp_slice_copy(const clg_tp_slice *s, float *whole, float *part, int to_whole);
/* The slice s of a whole parameter (host: whole) and lane buffer lm on dev (part: room for the slice): read
 * into whole (to_whole = 1) or written from it. Blocking. */
CLG_INTERNAL clg_status clg_tp_slice_xfer(const clg_tp_slice *s, clg_device *dev, cl_mem lm, float *whole,
                                          float *part, int to_whole);
/* n floats of mem on dev read into whole (write = 0) or written from it. Blocking. */
CLG_INTERNAL clg_status clg_tp_whole_io(clg_device *dev, cl_mem mem, size_t n, float *whole, int write);
/* fn(user, ref, k, whole, part) for every parameter ref of full (k = 0: its value; with_state, trainable: also 1
 * and 2, its optimizer state), whole and part host scratch of the largest parameter's size. */
typedef clg_status (*clg_tp_sync_fn)(void *user, const clg_param_ref *ref, int k, float *whole, float *part);
CLG_INTERNAL clg_status clg_tp_sync_each(clg_err *err, clg_replica *full, int with_state, clg_tp_sync_fn fn,
                                         void *user);
/* The k-th buffer of parameter `slot` of layer li in replica r: 0 its (fp32 master) value, 1 and 2 o's state;
 * NULL when none. */
CLG_INTERNAL cl_mem clg_tp_param_buf(clg_replica *r, clg_optim *o, int li, int slot, int k);
/* The first weights one device draws from seed for layers [first, last], to the host: each layer's drawn on dev
 * (a replica of that layer alone); w[i * CLG_MAX_PARAMS + k] (malloc'd, the caller frees). */
CLG_INTERNAL clg_status clg_tp_draw_weights(clg_ctx *ctx, clg_net *net, clg_device *dev, uint64_t seed, int first,
                                            int last, float **w);
/* Lane t's slices of the drawn weights w into replica rep's layers [first, last] (part: clg_tp_most_floats). */
CLG_INTERNAL clg_status clg_tp_scatter(const int *role, const clg_net *net, int T, int t, float **w, clg_replica *rep,
                                       clg_device *dev, int first, int last, float *part);
/* The largest parameter of net (floats, at least 1). */
CLG_INTERNAL size_t clg_tp_most_floats(const clg_net *net);
/* The row-split biases' gradients of rep's layers [first, last] zeroed (lanes t > 0: those biases stay zero). */
CLG_INTERNAL clg_status clg_tp_zero_row_bias(const int *role, clg_replica *r, clg_device *dev, int first, int last);
/* Squared norms of rep's gradients within arena floats [s0, s1): sq[0] the split parameters', sq[1] the
 * replicated ones'. */
CLG_INTERNAL clg_status clg_tp_grad_sq(const int *role, clg_replica *r, clg_device *dev, size_t s0, size_t s1,
                                       double sq[2]);
/* A layer keeping non-trainable parameters (batch-norm running statistics): its name; NULL when none. */
CLG_INTERNAL const char *clg_tp_state_param(const clg_net *net);
/* The all-reduce alone, for `groups` groups of T threads (the other fields unused; clg_tp_free frees it): room
 * for red_cap floats per partial. */
CLG_INTERNAL clg_status clg_tp_group_create(clg_err *err, int groups, int T, size_t red_cap, clg_tp **out);
/* Thread t of group d: mem[off .. off + count) on dev := its sum over the group's T threads (thread order: the
 * same bits on each); CLG_ERR_INTERNAL when the step was abandoned (clg_tp_group_abort). */
CLG_INTERNAL clg_status clg_tp_group_reduce(clg_tp *p, clg_device *dev, int d, int t, cl_mem mem, size_t off,
                                            size_t count);
/* abort = 1: every waiting thread woken, the step abandoned; 0: reset before a step. */
CLG_INTERNAL void clg_tp_group_abort(clg_tp *p, int abort);

#endif
