/* The fusion pass of a replica (option bn_fuse): a [batchnorm] whose only
 * consumer is a relu [activation] computes relu(bn(x)) itself, and one
 * whose only consumer is a two-input [add] whose only consumer is a relu
 * computes relu(bn(x) + r), r the add's other operand (a residual block's
 * tail), provided r is computed before the batch norm (its layer index is
 * lower). The fused-away layers keep their place (indices, names, the
 * hooks run after each layer) but lose their inputs, their forward and
 * backward are skipped and their outputs alias the batch norm's; their
 * consumers read the batch norm instead. Training statistics stay exact:
 * the batch norm still computes them in full before its one fused pass.
 *
 * Only whole fp32 replicas (not a pipeline stage, not fp16 storage) and
 * unsynchronized batch norms are fused; the last layer never is.
 *
 * Option relu_pool_fold: a relu [convolutional] whose only consumer is a
 * 2x2 stride-2 [maxpool] leaves its relu's derivative to the pool's
 * backward pass, which reads the window maxima anyway (the same gradients,
 * bit for bit; one pass over the activation fewer). Same replicas. */
#include <string.h>

#include "model/layers.h"
#include "model/network_impl.h"

/* The only consumer of layer i's output, -1 if none or several. */
static int only_consumer(const clg_replica *r, int i)
{
    int who = -1;
    for (int j = 0; j < r->nlayers; j++)
        for (int k = 0; k < r->layers[j].nin; k++)
            if (r->layers[j].inputs[k] == i) {
                if (who >= 0)
                    return -1;
                who = j;
            }
    return who;
}

/* Layer `gone` is computed by `into`: its consumers read `into`. */
static void retire(clg_replica *r, int gone, int into)
{
    for (int j = 0; j < r->nlayers; j++)
        for (int k = 0; k < r->layers[j].nin; k++)
            if (r->layers[j].inputs[k] == gone)
                r->layers[j].inputs[k] = into;
    r->layers[gone].nin = 0;
    r->layers[gone].fused_into = into + 1;
}

/* Fuses batch norm i with what follows it, where the pattern fits. */
static void fuse_bn(clg_replica *r, int i)
{
    int L = r->nlayers;
    clg_layer *bn = &r->layers[i];
    int j = only_consumer(r, i);
    if (j < 0 || j == L - 1)
        return;
    clg_layer *next = &r->layers[j];
    if (clg_layer_activation_is_relu(next)) {
        clg_layer_batchnorm_fuse_relu(bn);
        retire(r, j, i);
        return;
    }
    if (next->ops != &clg_layer_add_ops || next->nin != 2 || next->inputs[0] == next->inputs[1])
        return;
    int other = next->inputs[0] == i ? next->inputs[1] : next->inputs[0];
    int k = only_consumer(r, j);
    if (other >= i || k < 0 || k == L - 1 || !clg_layer_activation_is_relu(&r->layers[k]))
        return;
    if (memcmp(next->in_shape[0], next->in_shape[1], sizeof next->in_shape[0]) != 0)
        return;
    clg_layer_batchnorm_fuse_relu(bn);
    bn->inputs[1] = other;
    memcpy(bn->in_shape[1], next->in_shape[next->inputs[0] == i ? 1 : 0], sizeof bn->in_shape[1]);
    bn->in_seq[1] = 0;
    bn->nin = 2;
    retire(r, j, i);
    retire(r, k, i);
}

/* Folds conv i's relu derivative into its only consumer, where that is a 2x2 max pool. */
static void fold_relu_pool(clg_replica *r, int i)
{
    int j = only_consumer(r, i);
    if (j < 0 || !clg_layer_conv_is_relu(&r->layers[i]))
        return;
    if (clg_layer_pool_fold_relu(&r->layers[j]))
        clg_layer_conv_fold_relu(&r->layers[i]);
}

void clg_replica_fuse(clg_replica *r)
{
    if (r->fp16 || r->first != 0 || r->last != r->nlayers - 1)
        return;
    const clg_opts *o = &r->dev->ctx->opts;
    for (int i = 0; o->bn_fuse && i < r->nlayers - 1; i++)
        if (clg_layer_batchnorm_fusable(&r->layers[i]) && !r->layers[i].in_seq[0])
            fuse_bn(r, i);
    for (int i = 0; o->relu_pool_fold && i < r->nlayers - 1; i++)
        fold_relu_pool(r, i); /* the pool decides: clg_layer_pool_fold_relu */
}

void clg_replica_fuse_alias(clg_replica *r)
{
    for (int i = 0; i < r->nlayers; i++)
        if (r->layers[i].fused_into) {
            r->act[i] = r->act[r->layers[i].fused_into - 1];
            r->dact[i].mem = NULL;
        }
}
