/* Networks: a graph of layers built from a model file, shape inference, a
 * printed layer table, liveness-planned activation memory, and one replica
 * per device (layers + parameters + activations on that device). The
 * module's files are listed in network_impl.h.
 *
 * The [net] section (first section of a model file) holds:
 *   channels, height, width   input shape (required)
 *   classes                   number of classes (default: the last layer's C)
 *   input                     images (default) or tokens: the input holds
 *                             token ids, one target per position (text data)
 *   batch                     batch size (default 64)
 *   training defaults, overridable on the command line:
 *   learning_rate (0.01) momentum (0.9) nesterov (0|1, 0) weight_decay (0)
 *   optimizer (sgd|adam|adamw, sgd) beta1 (0.9) beta2 (0.999) epsilon (1e-8)
 *   schedule (none|step|cosine, none) step_size (epochs, 1) gamma (0.1)
 *   warmup (steps of linear warm-up, 0) epochs (10) clip_norm (0 = off)
 *   augment_flip (0|1, 0: random left-right mirror of training images)
 *   augment_shift (pixels 0..8, 0: random translation of training images)
 *   decay_matrices_only (0|1, 0: weight_decay applies to every trainable
 *           parameter; 1: only to matrices, clg_optim_param_decays)
 *
 * Every other section is a layer; its generic keys are
 *   name    unique name (default "<type><index>")
 *   input   comma list of producers: layer names, relative indices (-1 is
 *           the previous layer), absolute indices (0-based), or "data" for
 *           the network input. Default: the previous layer (the first layer
 *           reads the network input). */
#ifndef CLG_MODEL_NETWORK_H
#define CLG_MODEL_NETWORK_H

#include "model/layer.h"

typedef struct clg_hparams {
    double learning_rate, momentum, weight_decay;
    int nesterov;
    int optimizer; /* CLG_OPT_* */
    double beta1, beta2, epsilon;
    int schedule;  /* CLG_SCHED_* */
    double step_size, gamma;
    long warmup;
    int epochs;
    double clip_norm;
    int augment_flip, augment_shift; /* training-data augmentation (clg_ds_augment) */
    int decay_matrices_only;         /* weight decay on matrices only (clg_optim_param_decays) */
} clg_hparams;

/* Largest [net] augment_shift: the dataset's augmentation limit
 * (CLG_DS_MAX_SHIFT in io/dataset.h, which checks it again). */
#define CLG_HP_MAX_SHIFT 8

enum { CLG_OPT_SGD = 0, CLG_OPT_ADAM = 1, CLG_OPT_ADAMW = 2 };
enum { CLG_SCHED_NONE = 0, CLG_SCHED_STEP = 1, CLG_SCHED_COSINE = 2 };

CLG_INTERNAL void clg_hparams_defaults(clg_hparams *h);

typedef struct clg_net clg_net;

/* Per-device instance of a network. The phases of a training step are
 * separate calls so several replicas can run side by side:
 * set_input -> forward -> backward -> (gradient hand-off: params[].grad)
 * -> optimizer. */
typedef struct clg_replica {
    clg_net *net;
    clg_device *dev;
    clg_layer *layers; /* nlayers, own instances (own parameters) */
    int nlayers;
    /* layers this replica runs: [first, last] (every layer unless it is a
     * pipeline stage, clg_replica_create_range); layers outside hold no
     * parameters (nparams 0) and no activations, except the outputs of
     * earlier layers the range reads (and their gradients) */
    int first, last;
    int batch;          /* planned (maximum) batch */
    clg_tensor *act;    /* per layer output, N = batch */
    clg_tensor *dact;   /* per layer output gradient (mem NULL: none) */
    cl_mem *slots;      /* planned arena: one buffer per slot */
    size_t *slot_bytes;
    int nslots;
    cl_mem scratch[CLG_MAX_INPUTS]; /* gradient summation (lazily allocated) */
    size_t scratch_bytes[CLG_MAX_INPUTS];
    clg_tensor input;   /* network input (borrowed buffer), N = batch */
    int loss_index;     /* index of the loss layer, or -1 */
    uint64_t planned_bytes, naive_bytes;
    /* profiling (CLGRAD_PROFILE=1): per layer wall ms of forward / backward,
     * each layer finished before the next (slower, for finding hot spots) */
    int profile;
    double *prof_fwd, *prof_bwd;
    /* kernel time (OpenCL events) and launches of each layer: the rest of
     * its wall time is launch overhead and waiting */
    double *prof_fwd_k, *prof_bwd_k;
    long *prof_fwd_n, *prof_bwd_n;
    int prof_calls;
    /* --precision fp16 (net->fp16 when the replica was created): every act[]
     * except the last layer's output and every dact[] hold IEEE half values
     * (mem/off count halves); layers run on fp32 working buffers (work[i])
     * expanded from half before a layer runs and rounded back to half after
     * it. The half tensors and the working buffers are planned together by
     * liveness (sub-steps: expand, compute, store) as regions of one arena
     * (sub-buffers; separate buffers when the arena exceeds the device's
     * largest allocation). Trainable weights:
     * master[] holds the fp32 master copy the optimizer updates; w16[] the
     * half copy; the layer's param->value the half values expanded to fp32
     * (what forward and backward read). */
    int fp16;
    struct clg_layer_work {
        cl_mem f_in[CLG_MAX_INPUTS], f_out;                           /* forward */
        cl_mem b_in[CLG_MAX_INPUTS], b_out, b_dout, b_din[CLG_MAX_INPUTS]; /* backward */
        /* chains (fewer conversions, same numerics): fchain: layer i+1 reads
         * this layer's fp32 output f_out (rounded to half values in place)
         * instead of expanding act[i]; bchain: this layer's output gradient
         * is layer i+1's b_din[bchain_k] rounded in place (its only use), so
         * dact[i] and b_dout are not needed. */
        int fchain, bchain, bchain_k;
    } *work;
    cl_mem *master, *w16; /* nlayers * CLG_MAX_PARAMS, NULL where not trainable */
    uint64_t half_bytes;  /* fp16: bytes of the half tensors (before sharing) */
    uint64_t fp32_bytes;  /* what the same network plans in fp32 (both modes) */
    uint64_t fp32_offset_bytes; /* fp16 only: fp32 storage with the arena planner fp16 uses */
    cl_mem *subs;         /* fp16: one arena (slots[0]), a sub-buffer per tensor */
    int nsubs;
    /* (optional) called right after layer `layer`'s forward (backward = 0)
     * or backward (backward = 1) is enqueued. After a backward, the layer's
     * parameter gradients are final once the commands enqueued so far are
     * done: the data-parallel reduction starts the transfer of a finished
     * gradient bucket from here (and the trace places its markers). */
    clg_status (*after_layer)(void *user, int layer, int backward);
    void *after_layer_user;
    /* (optional, fp16 storage only; user: after_layer_user) called once layer `layer`'s forward (backward = 0)
     * or backward computed its fp32 results, before they are rounded to half: t[0..nt) its output, or its input
     * gradients (mem NULL where none), in fp32 working buffers of the pass's n samples. Tensor parallelism sums
     * partial products there, so that they are rounded once, as one device rounds the whole product. */
    clg_status (*before_round)(void *user, int layer, int backward, clg_tensor *t, int nt);
    /* Parameter arena (clg_replica_arena): the trainable parameters'
     * authoritative fp32 values (param->value; the master copies in fp16
     * mode) in one buffer and their gradients in another with the same
     * layout (arena_off[i]: byte offset of trainable parameter i in
     * clg_replica_params order; reverse layer order, each aligned for a
     * sub-buffer; padding stays zero). Every value / grad / master is a
     * sub-buffer of these, so the optimizer updates all of them with one
     * launch over the whole arena. fp16: varena holds the layers' fp32
     * views of the half weights (param->value) in the same layout and
     * harena the half values (element i of the arena at half i), so
     * round_weights is one launch too. */
    cl_mem parena, garena, varena, harena;
    cl_mem *psub, *gsub, *vsub; /* per trainable parameter (vsub: fp16 only) */
    size_t *arena_off;
    size_t arena_bytes;
    int narena;
    size_t arena_charged; /* bytes of the arenas in the device's memory account (clg_mem_charge) */
} clg_replica;

struct clg_net {
    clg_cfg *cfg;      /* owned */
    char *text;        /* model file text, owned */
    char source[256];  /* file name or "<string>" */
    int in_c, in_h, in_w, classes, batch;
    int input_tokens;  /* [net] input = tokens: the input holds token ids (floats holding integers, C*H*W per
                          sample), read by an [embedding]; the data is not normalized */
    clg_hparams hp;
    int nlayers;
    clg_layer *proto;  /* device-less instances: shapes, names, flops */
    int loss_index;
    uint64_t nparams;  /* trainable scalars */
    int fp16;          /* replicas created from now on store activations in half */
    double flops;      /* forward FLOPs per sample */
    /* replicas are owned by their lanes (src/parallel/lane.c), not the net */
};

/* Parses text and infers shapes for a batch of `batch` (0: [net] batch).
 * Errors name the file and line. */
CLG_INTERNAL clg_status clg_net_build(clg_err *err, const char *text, const char *source_name, int batch,
                                      clg_net **out);
/* clg_net_build with the input shape chw (channels, height, width) in
 * place of [net]'s (NULL: [net]'s): the decoder's T = 1 instance. */
CLG_INTERNAL clg_status clg_net_build_shape(clg_err *err, const char *text, const char *source_name, int batch,
                                            const int *chw, clg_net **out);
CLG_INTERNAL clg_status clg_net_load(clg_err *err, const char *path, int batch, clg_net **out);
CLG_INTERNAL void clg_net_free(clg_net *net);
/* Prints the layer table (name, type, output shape, params, MFLOPs). */
CLG_INTERNAL void clg_net_print(const clg_net *net, FILE *f);
/* Index of a layer by name, -1 when absent. */
CLG_INTERNAL int clg_net_find(const clg_net *net, const char *name);
/* int32 labels per sample the loss layer reads: T for a token loss on a
 * sequence (N, T, V) (one per position, in order), else 1. */
CLG_INTERNAL int clg_net_labels_per_sample(const clg_net *net);

/* Instantiates the network on dev, initialising parameters from rng (the
 * same seed on every device gives identical replicas), and plans and
 * allocates activation memory for `batch` samples. */
CLG_INTERNAL clg_status clg_replica_create(clg_net *net, clg_device *dev, uint64_t seed, clg_replica **out);
/* A pipeline stage: the replica of layers [first, last] only (fp32 storage).
 * Parameters are drawn as clg_replica_create draws them (the same seed gives
 * the stage the single-device replica's weights); those of the other layers
 * are released. batch: the planned batch (0: the network's). Activations are planned for the range and the earlier
 * outputs it reads (act[src]/dact[src] of a layer before first: where the
 * caller puts the received activation and finds the gradient to send back);
 * an output read by a later stage keeps act[i] until its own backward, and
 * dact[i] (the gradient received back) from before the range's backward. */
CLG_INTERNAL clg_status clg_replica_create_range(clg_net *net, clg_device *dev, uint64_t seed, int first, int last,
                                                 int batch, clg_replica **out);
CLG_INTERNAL void clg_replica_free(clg_replica *r);
/* Points the network input at buf (N x C x H x W floats at offset off). */
CLG_INTERNAL void clg_replica_set_input(clg_replica *r, cl_mem buf, size_t off);
/* Points the loss layer at labels (int32 per sample). */
CLG_INTERNAL void clg_replica_set_labels(clg_replica *r, cl_mem labels, size_t off, float grad_scale);
/* Forward pass over n <= batch samples. */
CLG_INTERNAL clg_status clg_replica_forward(clg_replica *r, int n, int training);
/* Backward pass (after a training forward over the same n samples). Every
 * trainable param's grad receives this batch's gradient. */
CLG_INTERNAL clg_status clg_replica_backward(clg_replica *r, int n);
/* The same over the replica's range; written (may be NULL; nlayers flags):
 * written[i] != 0 says dact[i] already holds a gradient (received from a
 * later stage) that the range's contributions are added to. */
CLG_INTERNAL clg_status clg_replica_backward_range(clg_replica *r, int n, const char *written);
/* Each layer's forward and backward once on zeros, last layer first when
 * reverse: compiles a step's kernels in another order (state is clobbered). */
CLG_INTERNAL clg_status clg_replica_precompile(clg_replica *r, int n, int reverse);
/* Output tensor of the last layer (probabilities for softmax). */
CLG_INTERNAL const clg_tensor *clg_replica_output(const clg_replica *r);

/* Visits every parameter in a fixed order (layer order, then param order). */
typedef struct clg_param_ref {
    clg_layer *layer;
    clg_param *param;
} clg_param_ref;
/* Fills refs (malloc'd) with every parameter; trainable_only selects. */
CLG_INTERNAL clg_status clg_replica_params(clg_replica *r, int trainable_only, clg_param_ref **refs, int *n);
/* The parameter of replica r that ref names in another replica of the
 * same network (same layer index, same parameter slot). */
static inline clg_param *clg_replica_param_of(const clg_replica *r, const clg_param_ref *ref)
{
    return &r->layers[ref->layer->index].params[ref->param - ref->layer->params];
}
/* Tells layers that parameters changed (after an optimizer step / load). */
CLG_INTERNAL void clg_replica_params_changed(clg_replica *r);
/* The buffer holding a parameter's authoritative fp32 value: the master
 * copy of a trainable weight in fp16 mode, else param->value. Optimizers
 * update it, checkpoints save and load it. */
CLG_INTERNAL cl_mem clg_replica_master(const clg_replica *r, const clg_param_ref *ref);
/* After master values changed (optimizer step, checkpoint load): in fp16
 * mode re-derives the half copies and the layers' fp32 views of them;
 * then tells the layers (params_changed). */
CLG_INTERNAL clg_status clg_replica_weights_updated(clg_replica *r);
/* After a step's loss or gradient norm went non-finite: runs a training
 * forward and backward of the n samples staged in r again, with a blocking
 * check after every layer, and writes into buf (NUL-terminated) the first
 * layer whose output (forward order) or gradient (backward order) is
 * non-finite, with its model-file line and whether its parameters were
 * non-finite already; or that the input batch is. Overwrites gradients and
 * batch-norm running statistics: call it only for a step that failed.
 * Synchronized layers run on this replica's statistics alone (the other
 * replicas are not in the step any more). The
 * device's last error is left as it was. Costs nothing unless called. */
CLG_INTERNAL void clg_replica_explain_nonfinite(clg_replica *r, int n, char *buf, size_t cap);
/* Moves every trainable parameter's value (fp16: master copy) and gradient
 * into the replica's parameter and gradient arenas laid out by off[i] (byte
 * offset of trainable parameter i, clg_replica_params order) within `bytes`;
 * off NULL: the default layout (reverse layer order, aligned to the device's
 * sub-buffer alignment, at least 128 bytes). Values and gradients are
 * copied over; nothing is done when the layout is the current one. */
CLG_INTERNAL clg_status clg_replica_arena(clg_replica *r, const size_t *off, size_t bytes);
/* Prints the per-layer profile (when profiling was on). */
CLG_INTERNAL void clg_replica_print_profile(const clg_replica *r, FILE *f);
/* Hands each layer its profiled kernel times (clg_layer_ops.profiled). */
CLG_INTERNAL void clg_replica_profile_feedback(clg_replica *r);
/* Clears the CLGRAD_PROFILE sums (bench train: from the timed steps on). */
CLG_INTERNAL void clg_replica_profile_reset(clg_replica *r);

#endif
