/* Tensors and the layer vtable. A network holds one replica per device; a
 * replica holds its own clg_layer instances (and so its own parameters on
 * that device). Layers never touch files or threads.
 *
 * Legend: N batch, C channels, H height, W width, T positions. Every
 * activation is an NCHW fp32 tensor; a dense layer's output is (N, units,
 * 1, 1). A sequence (N, T, C) is stored as {N, T, C, 1} (C fastest) and
 * flagged by in_seq / out_seq: network.c copies each producer's out_seq
 * into its consumers' in_seq before setup, and refuses a sequence input to
 * a layer whose setup does not set out_seq (the layers that take sequences
 * say so by setting it). */
#ifndef CLG_MODEL_LAYER_H
#define CLG_MODEL_LAYER_H

#include "device/device.h"
#include "io/cfg.h"

#define CLG_MAX_INPUTS 8
#define CLG_MAX_PARAMS 6

typedef struct clg_tensor {
    cl_mem mem;   /* borrowed: owned by the network's activation arena */
    size_t off;   /* element offset into mem */
    int n, c, h, w;
} clg_tensor;

static inline size_t clg_tensor_numel(const clg_tensor *t) { return (size_t)t->n * t->c * t->h * t->w; }

typedef struct clg_param {
    char name[32];   /* "weight", "bias", "gamma", "beta", "running_mean", "running_var" */
    int trainable;   /* 0: state updated by forward (BN running stats), not by the optimizer */
    int ndim;
    int shape[4];
    size_t numel;
    cl_mem value;    /* owned by the layer; numel floats */
    cl_mem grad;     /* owned by the layer (trainable only); numel floats */
} clg_param;

typedef struct clg_layer clg_layer;

/* Loss layers (softmax cross-entropy, mse): the trainer sets the targets
 * before forward; forward writes {sum of per-sample loss, correct count} as
 * 2 floats into `result` (owned by the layer, allocated in init) so the host
 * reads both with one transfer when it wants them. backward ignores dout and
 * starts the chain with grad_scale * d(loss sum)/d(input). */
typedef struct clg_loss_io {
    cl_mem labels;     /* borrowed: int32 class per sample (softmax) or float targets like the input (mse) */
    size_t labels_off; /* elements */
    cl_mem result;     /* owned: 2 floats */
    float grad_scale;  /* backward scales d(loss sum)/d(input) by this: the trainer sets
                          1/global batch (times the fp16 loss scale) */
} clg_loss_io;

/* Slots marked (optional) may be NULL. */
typedef struct clg_layer_ops {
    const char *type; /* section name in the model file, e.g. "convolutional" */
    /* Reads this layer's keys from its section (errors name the line). */
    clg_status (*configure)(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec);
    /* Shape inference: from l->in_shape[0..nin) fills l->out_shape, the
     * parameter shapes (l->params[].shape/numel/name/trainable, l->nparams)
     * and l->flops (forward multiply-adds x 2 for one batch of in_shape[0][0]). */
    clg_status (*setup)(clg_layer *l, clg_err *err);
    /* Allocates parameters (and private device state) on dev and
     * initialises them from rng (He/Glorot for weights, 0 bias, 1 gamma). */
    clg_status (*init)(clg_layer *l, clg_device *dev, clg_rng *rng);
    /* out = f(in); training selects batch statistics / dropout. The batch
     * size n may be smaller than in_shape[0][0] (last batch, device share). */
    clg_status (*forward)(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                          int training);
    /* From dout computes din[i] (skipped where din[i].mem == NULL) and
     * overwrites every trainable param's grad with this batch's gradient
     * (summed over the batch; the loss layer already divides by the batch). */
    clg_status (*backward)(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                           const clg_tensor *dout, clg_tensor *din);
    /* (optional) after every layer of the network is set up: resolves
     * references to other layers of the same instance set (`[dense] tie`);
     * layers[0..nlayers) stay where they are for the instance's lifetime.
     * Errors name the file and line. */
    clg_status (*link)(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_layer *layers, int nlayers);
    /* (optional) incremental inference (src/model/decode.c): the layer was
     * set up for T = 1 and in / out hold n consecutive positions pos0 ..
     * pos0 + n - 1 of one sequence as n samples. For layers whose output
     * depends on the position or on earlier positions: [posembed] adds the
     * rows of those positions, [attention] appends their keys and values to
     * a cache of cap positions kept in priv (pos0 = 0 starts it over) and
     * attends over it. Per-position layers leave it NULL (forward runs). */
    clg_status (*forward_step)(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                               int pos0, int cap);
    /* (optional) called after the optimizer changed the parameters. */
    void (*params_changed)(clg_layer *l);
    /* (optional) frees priv and any device state besides params. */
    void (*destroy)(clg_layer *l, clg_device *dev);
    /* (optional) the per-layer profile of a run: the layer's kernels took
     * fwd_ms / bwd_ms per step over `steps` steps (conv: an automatic
     * choice far slower than measured is re-measured at the next run). */
    void (*profiled)(clg_layer *l, clg_device *dev, double fwd_ms, double bwd_ms, int steps);
} clg_layer_ops;

/* Cross-device exchange for layers whose forward or backward needs the
 * whole global batch (synchronized batch norm), set on every replica's
 * layers by the data-parallel lanes; NULL on a lone replica. gather hands
 * this replica's n doubles to the others taking part in the step and
 * returns, in *all, the *nall vectors of every participant in the fixed
 * device order (this one's among them; valid until the step ends), once
 * all have given theirs. phase: 0 forward, 1 backward. */
typedef struct clg_layer_sync {
    clg_status (*gather)(void *user, int layer, int phase, const double *mine, size_t n, const double *const **all,
                         int *nall);
    void *user;
} clg_layer_sync;

struct clg_layer {
    const clg_layer_ops *ops;
    char name[64];      /* "conv1" or "<type><index>" */
    int line;           /* model-file line of the section */
    int index;          /* position in the network */
    int inputs[CLG_MAX_INPUTS]; /* producing layer indices; -1 = network input */
    int nin;
    int in_shape[CLG_MAX_INPUTS][4]; /* N, C, H, W */
    int out_shape[4];
    int in_seq[CLG_MAX_INPUTS]; /* input i is a sequence (N, T, C) stored as in_shape {N, T, C, 1} */
    int out_seq;                /* the output is a sequence (N, T, C) stored as out_shape {N, T, C, 1} */
    clg_param params[CLG_MAX_PARAMS];
    int nparams;
    int draw_only;      /* init draws its parameters' random numbers without allocating or writing them (a
                           pipeline stage's replica, for a layer of another stage: its own layers get a whole
                           replica's draws) */
    double flops;
    int is_loss;        /* softmax/mse: forward computes loss, backward starts the chain */
    clg_loss_io loss;   /* used when is_loss */
    void *priv;         /* layer-specific options and state */
    const clg_layer_sync *sync; /* borrowed; NULL: this replica alone */
    /* The fusion pass (src/model/fuse.c): 1 + the index of the layer whose
     * fused epilogue computes this one's output; the passes skip its forward
     * and backward, its output aliases that layer's and it has no inputs
     * left (nin 0). 0: not fused. */
    int fused_into;
    /* Decoding (forward_step, set by src/model/decode.c): 1 keeps the key/
     * value cache in IEEE half (clgrad generate --precision fp16). */
    int cache_half;
    /* [concat] only: bit k set, input k's channels are already in their slice of the output (written there by
     * its producer's transfer, a pipeline cut inside a layer) and its gradient is read from the output
     * gradient's slice: forward and backward skip that input. 0: every input copied. */
    unsigned in_place;
};

/* Looks up a layer type by its section name ("convolutional", "conv"...);
 * NULL when unknown. Every type lives in its own src/model/layer_*.c. */
CLG_INTERNAL const clg_layer_ops *clg_layer_lookup(const char *type);
/* Names of every type (NULL-terminated), for error messages. */
CLG_INTERNAL const char *const *clg_layer_type_names(void);

#endif
