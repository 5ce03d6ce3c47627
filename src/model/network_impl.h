/* What the files of the network module share (private to src/model):
 *   net_config.c  [net] section: input shape, batch, training defaults
 *   network.c     graph build from the model text, shape inference, layer table
 *   plan.c        liveness-planned activation (and fp16 working) memory
 *   arena.c       parameter arena, fp16 master / half / fp32-view weights
 *   replica.c     replica lifecycle, parameter lists, profiling
 *   pass.c        forward, backward, precompile
 *   diagnose.c    clg_replica_explain_nonfinite
 * The module's interface is network.h. */
#ifndef CLG_MODEL_NETWORK_IMPL_H
#define CLG_MODEL_NETWORK_IMPL_H

#include "model/network.h"

/* Reads the [net] section s into net (input shape, classes, batch, hp). */
CLG_INTERNAL clg_status clg_net_parse_config(clg_err *err, clg_net *net, clg_cfg_section *s);

/* Configures + sets up one set of layer instances for `batch` samples
 * (first_time: also refuses unused keys). */
CLG_INTERNAL clg_status clg_net_instantiate(clg_err *err, clg_net *net, clg_layer *layers, int batch, int first_time);
/* Frees n layer instances (dev NULL: device-less prototypes). */
CLG_INTERNAL void clg_net_destroy_layers(clg_layer *layers, int n, clg_device *dev);
/* Prefixes err's message with the layer's location unless it names the
 * source already; returns st. */
CLG_INTERNAL clg_status clg_net_layer_fail(clg_err *err, clg_status st, const clg_net *net, const clg_layer *l,
                                           const char *what);

/* Plans activation memory (plan.c): half != 0 plans fp16 storage with its
 * working buffers; alloc != 0 allocates and points the replica's tensors at
 * the plan (alloc == 0 only sizes it); offsets != 0 places everything in one
 * arena of sub-buffers (separate slot buffers when it would exceed the
 * device's largest allocation). *total receives the planned bytes. */
/* The fusion pass (src/model/fuse.c; option bn_fuse): before planning,
 * batch norms take the relu (and residual add) after them; after
 * planning, the fused-away layers' outputs alias theirs. */
CLG_INTERNAL void clg_replica_fuse(clg_replica *r);
CLG_INTERNAL void clg_replica_fuse_alias(clg_replica *r);
CLG_INTERNAL clg_status clg_replica_plan_memory(clg_replica *r, int half, int alloc, int offsets, uint64_t *total);

/* fp16 storage: allocates the master (fp32) and half copies of the
 * trainable weights and derives the layers' views (arena.c). */
CLG_INTERNAL clg_status clg_replica_setup_fp16(clg_replica *r);
/* Hands the parameter arenas' sub-buffers back (the slots that point at
 * them become NULL) and frees the arenas. */
CLG_INTERNAL void clg_replica_arena_free(clg_replica *r);

/* t with batch n (same buffer and offset). */
static inline clg_tensor clg_tensor_with_n(const clg_tensor *t, int n)
{
    clg_tensor x = *t;
    x.n = n;
    return x;
}

#endif
