/* [embedding] vocab, dim: token ids -> vectors. Input: N samples of T ids
 * (floats holding integers; any NCHW shape with C*H*W = T, e.g. [net]
 * channels = 1, height = T, width = 1); output the sequence (N, T, dim).
 * Param "weight" (vocab, dim), initialised N(0, 0.02^2). Backward is a
 * scatter-add with one owner per (row, columns) summing the positions in
 * order: deterministic. An id that is not an integer in [0, vocab) fails the
 * forward with a status naming the id and its position (the kernel records
 * the first one; the host reads that one flag after the launch).
 *
 * [posembed] context: y = x + P[t] for a sequence x (N, T, C), T <= context;
 * param "weight" (context, C), N(0, 0.02^2). */
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "ops/seq.h"

#define EMB_INIT_STD 0.02
#define FLAG_NONE 0xffffffffu

typedef struct {
    int vocab, dim, T;
    int tied; /* a [dense] tie = this layer: backward adds to the gradient the head wrote first */
    cl_mem flag;
} emb_priv;

static clg_status emb_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(emb_priv)));
    emb_priv *p = l->priv;
    long vocab = 0, dim = 0;
    CLG_TRY(clg_layer_req_int(err, cfg, sec, "vocab", 1, 1L << 24, &vocab));
    CLG_TRY(clg_layer_req_int(err, cfg, sec, "dim", 1, 1L << 20, &dim));
    p->vocab = (int)vocab;
    p->dim = (int)dim;
    return CLG_OK;
}

static clg_status emb_setup(clg_layer *l, clg_err *err)
{
    emb_priv *p = l->priv;
    CLG_TRY(clg_layer_check_nin(l, err, 1, 1));
    if (l->in_seq[0])
        return clg_err_set(err, CLG_ERR_SHAPE, "embedding reads token ids (N, T), not a sequence of vectors");
    const int *s = l->in_shape[0];
    long long T = (long long)s[1] * s[2] * s[3];
    if (T > (1 << 24))
        return clg_err_set(err, CLG_ERR_SHAPE, "embedding input of %lld ids per sample is too long", T);
    if ((double)p->vocab * p->dim > 4294967295.0 || (double)s[0] * T * p->dim > 4294967295.0)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "embedding of %d x %d for %lld ids exceeds 2^32 elements",
                           p->vocab, p->dim, (long long)s[0] * T);
    p->T = (int)T;
    l->out_shape[0] = s[0];
    l->out_shape[1] = p->T;
    l->out_shape[2] = p->dim;
    l->out_shape[3] = 1;
    l->out_seq = 1;
    l->nparams = 0;
    clg_layer_param_def(l, 0, "weight", 1, 2, p->vocab, p->dim, 0, 0);
    l->flops = (double)s[0] * p->T * p->dim;
    return CLG_OK;
}

static clg_status flag_reset(clg_device *dev, cl_mem flag)
{
    cl_uint v = FLAG_NONE;
    CLG_CL_CHECK(clg_dev_err(dev), clEnqueueWriteBuffer(dev->queue, flag, CL_TRUE, 0, sizeof v, &v, 0, NULL, NULL));
    return CLG_OK;
}

static clg_status emb_init(clg_layer *l, clg_device *dev, clg_rng *rng)
{
    emb_priv *p = l->priv;
    CLG_TRY(clg_layer_alloc_params(l, dev));
    CLG_TRY(clg_layer_param_normal(dev, &l->params[0], EMB_INIT_STD, rng));
    if (!p->flag)
        CLG_TRY(clg_buf_alloc(dev, sizeof(cl_uint), &p->flag));
    return flag_reset(dev, p->flag);
}

static clg_status emb_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                              int training)
{
    emb_priv *p = l->priv;
    size_t ntok = (size_t)in[0].n * p->T;
    CLG_TRY(clg_seq_embedding_forward(dev, ntok, p->dim, p->vocab, in[0].mem, in[0].off, l->params[0].value,
                                      out->mem, out->off, p->flag));
    cl_uint bad = FLAG_NONE;
    CLG_CL_CHECK(clg_dev_err(dev),
                 clEnqueueReadBuffer(dev->queue, p->flag, CL_TRUE, 0, sizeof bad, &bad, 0, NULL, NULL));
    if (bad == FLAG_NONE)
        return CLG_OK;
    float id = 0.0f;
    CLG_CL_CHECK(clg_dev_err(dev), clEnqueueReadBuffer(dev->queue, in[0].mem, CL_TRUE,
                                                       (in[0].off + bad) * sizeof(float), sizeof id, &id, 0, NULL,
                                                       NULL));
    CLG_TRY(flag_reset(dev, p->flag));
    return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG,
                       "embedding '%s': token id %g at sample %u, position %u of this batch is not an integer in "
                       "[0, %d) (vocab = %d)",
                       l->name, (double)id, bad / (cl_uint)p->T, bad % (cl_uint)p->T, p->vocab, p->vocab);
}

static clg_status emb_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                               const clg_tensor *dout, clg_tensor *din)
{
    emb_priv *p = l->priv;
    size_t ntok = (size_t)in[0].n * p->T;
    /* no input gradient: ids are not differentiable (din[0] is NULL for the network input) */
    return clg_seq_embedding_backward(dev, ntok, p->dim, p->vocab, in[0].mem, in[0].off, dout->mem, dout->off,
                                      l->params[0].grad, p->tied);
}

static void emb_destroy(clg_layer *l, clg_device *dev)
{
    emb_priv *p = l->priv;
    if (p && dev)
        clg_buf_release(dev, p->flag);
    free(p);
    l->priv = NULL;
}

const clg_layer_ops clg_layer_embedding_ops = {
    .type = "embedding",
    .configure = emb_configure,
    .setup = emb_setup,
    .init = emb_init,
    .forward = emb_forward,
    .backward = emb_backward,
    .destroy = emb_destroy,
};

int clg_layer_is_embedding(const clg_layer *l) { return l && l->ops == &clg_layer_embedding_ops; }

int clg_layer_embedding_tie(clg_layer *l)
{
    if (!clg_layer_is_embedding(l) || !l->priv)
        return 0;
    emb_priv *p = l->priv;
    int before = p->tied;
    p->tied = 1;
    return before;
}

// ---- [posembed] ----

typedef struct {
    int context, T, C;
} pos_priv;

static clg_status pos_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(pos_priv)));
    pos_priv *p = l->priv;
    long ctx = 0;
    CLG_TRY(clg_layer_req_int(err, cfg, sec, "context", 1, 1L << 20, &ctx));
    p->context = (int)ctx;
    return CLG_OK;
}

static clg_status pos_setup(clg_layer *l, clg_err *err)
{
    pos_priv *p = l->priv;
    CLG_TRY(clg_layer_check_nin(l, err, 1, 1));
    const int *s = l->in_shape[0];
    if (!l->in_seq[0])
        return clg_err_set(err, CLG_ERR_SHAPE,
                           "posembed needs a sequence input (N, T, C), e.g. an [embedding]; input is %dx%dx%dx%d", s[0],
                           s[1], s[2], s[3]);
    if (s[1] > p->context)
        return clg_err_set(err, CLG_ERR_SHAPE, "the sequence has %d positions, more than context = %d", s[1],
                           p->context);
    p->T = s[1];
    p->C = s[2];
    for (int d = 0; d < 4; d++)
        l->out_shape[d] = s[d];
    l->out_seq = 1;
    l->nparams = 0;
    clg_layer_param_def(l, 0, "weight", 1, 2, p->context, p->C, 0, 0);
    l->flops = (double)s[0] * s[1] * s[2];
    return CLG_OK;
}

static clg_status pos_init(clg_layer *l, clg_device *dev, clg_rng *rng)
{
    CLG_TRY(clg_layer_alloc_params(l, dev));
    return clg_layer_param_normal(dev, &l->params[0], EMB_INIT_STD, rng);
}

static clg_status pos_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                              int training)
{
    pos_priv *p = l->priv;
    return clg_seq_pos_forward(dev, in[0].n, p->T, p->C, in[0].mem, in[0].off, l->params[0].value, out->mem,
                               out->off);
}

/* Decoding (layer.h forward_step): the n positions pos0 .. are n samples of T = 1. */
static clg_status pos_forward_step(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                                   int pos0, int cap)
{
    pos_priv *p = l->priv;
    int n = in[0].n;
    if (pos0 < 0 || pos0 + n > p->context)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "posembed: positions %d..%d outside context = %d",
                           pos0, pos0 + n - 1, p->context);
    return clg_nn_add(dev, (size_t)n * p->C, in[0].mem, in[0].off, l->params[0].value, (size_t)pos0 * p->C, out->mem,
                      out->off);
}

static clg_status pos_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                               const clg_tensor *dout, clg_tensor *din)
{
    pos_priv *p = l->priv;
    CLG_TRY(clg_seq_pos_backward(dev, in[0].n, p->T, p->C, p->context, dout->mem, dout->off, l->params[0].grad));
    if (!din[0].mem)
        return CLG_OK;
    return clg_nn_copy(dev, clg_tensor_numel(&in[0]), dout->mem, dout->off, din[0].mem, din[0].off);
}

const clg_layer_ops clg_layer_posembed_ops = {
    .type = "posembed",
    .configure = pos_configure,
    .setup = pos_setup,
    .init = pos_init,
    .forward = pos_forward,
    .backward = pos_backward,
    .forward_step = pos_forward_step,
};
