/* Optimizers running as kernels on the device (cl/optim.cl): SGD with
 * momentum / Nesterov / weight decay, Adam and AdamW; gradient clipping by
 * global norm; learning-rate schedules (host side); the optimizer and
 * schedule name tables. One optimizer per replica: the state (momentum, Adam
 * moments) lives next to the parameters. It depends on the network only, so
 * it sits in model/, below parallel/ and train/; its kernels are launched by
 * ops/optim_kernels.c. */
#ifndef CLG_MODEL_OPTIM_H
#define CLG_MODEL_OPTIM_H

#include "model/network.h"

typedef struct clg_optim {
    clg_hparams hp;
    clg_replica *rep; /* borrowed */
    int64_t t;        /* optimizer steps taken */
    int n;            /* trainable parameters */
    clg_param_ref *refs;
    cl_mem *m, *v;    /* per param: momentum / first moment; second moment (Adam) */
    cl_mem partial;   /* squared-norm partial sums */
    cl_mem flag;      /* fp16 overflow flag (1 int), allocated on first use */
    int groups;       /* partial sums per parameter */
    /* Arena mode (the replica has a parameter arena, rep->parena): the state
     * lives in arenas laid out like the parameters (m[i], v[i] are
     * sub-buffers of marena, varena), and the update, the squared-norm
     * partial sums and the fp16 unscale/overflow check are one launch each
     * over the whole arena (padding is zero in every arena and stays zero).
     * per_tensor: the same kernels launched per tensor instead (the
     * reference path; CLGRAD_OPTIM_PER_TENSOR=1). */
    cl_mem marena, varena;
    int arena, per_tensor;
    /* hp.decay_matrices_only with a weight decay, arena mode: one byte per
     * arena float, 1 where clg_optim_param_decays (padding 0) */
    cl_mem decay_mask;
    /* Sharded state (clg_optim_create_shard): the state arenas hold floats
     * [k0, k1) of the parameter arena only (m[i], v[i] stay NULL), the
     * update covers that slice (psh, gsh: sub-buffers of the parameter and
     * gradient arenas over it), and clg_optim_step leaves the rest of the
     * parameters and the fp16 copies to the caller's gather. */
    int shard;
    size_t k0, k1;
    cl_mem psh, gsh;
} clg_optim;

/* Whether the weight decay applies to ref's parameter: always, unless
 * hp->decay_matrices_only; then only to matrices (ndim >= 2: dense,
 * convolution and attention weights), not to vectors (biases, norm scales
 * and shifts) nor to the tables of [embedding] and [posembed] layers (the
 * AdamW recipe of GPT-style models). */
CLG_INTERNAL int clg_optim_param_decays(const clg_hparams *hp, const clg_param_ref *ref);

CLG_INTERNAL const char *clg_optim_name(int optimizer);
/* "sgd", "adam", "adamw" -> CLG_OPT_*; -1 when unknown. */
CLG_INTERNAL int clg_optim_parse(const char *name);
CLG_INTERNAL const char *clg_sched_name(int schedule);
CLG_INTERNAL int clg_sched_parse(const char *name);

/* Learning rate for optimizer step `step` (0-based) with steps_per_epoch
 * and total_steps (cosine). */
CLG_INTERNAL double clg_sched_lr(const clg_hparams *hp, int64_t step, int64_t steps_per_epoch, int64_t total_steps);

CLG_INTERNAL clg_status clg_optim_create(clg_replica *rep, const clg_hparams *hp, clg_optim **out);
/* The optimizer of floats [k0, k1) of rep's parameter arena only (k0, k1
 * multiples of the device's base alignment in floats): ZeRO-1 state
 * sharding over data-parallel lanes. Needs the arena mode (refused
 * otherwise, CLG_ERR_UNSUPPORTED). */
CLG_INTERNAL clg_status clg_optim_create_shard(clg_replica *rep, const clg_hparams *hp, size_t k0, size_t k1,
                                               clg_optim **out);
/* Bytes of device memory the optimizer state takes (state arenas or
 * per-tensor buffers; not the small partial-sum scratch). */
CLG_INTERNAL uint64_t clg_optim_state_bytes(const clg_optim *o);
CLG_INTERNAL void clg_optim_free(clg_optim *o);
/* Global L2 norm of all gradients (scaled by gscale); blocks on the queue. */
CLG_INTERNAL clg_status clg_optim_grad_norm(clg_optim *o, float gscale, double *norm);
/* One update with learning rate lr; the raw gradient is multiplied by gscale. */
CLG_INTERNAL clg_status clg_optim_step(clg_optim *o, double lr, float gscale);
/* Dynamic loss scaling (fp16): multiplies every trainable gradient by
 * inv_scale in place and sets *overflow when any result is inf or NaN
 * (one flag for all gradients; blocks on the queue to read it). */
CLG_INTERNAL clg_status clg_optim_unscale_check(clg_optim *o, float inv_scale, int *overflow);
/* Number of state buffers per parameter (0 plain SGD, 1 momentum, 2 Adam). */
CLG_INTERNAL int clg_optim_nstate(const clg_optim *o);

#endif
