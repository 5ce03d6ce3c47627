/* [dropout]: p=0.5, inverted dropout (training: y = x * keep / (1 - p);
 * inference: y = x). The mask is a hash of (seed, step, element index)
 * computed in the kernel; see clg_layer_set_rng in layers.h. */
#include <stdlib.h>

#include "model/layers.h"

typedef struct {
    float p;
    uint32_t seed, step, sample_base;
    uint32_t width, offset; /* a slice of a wider layer's features (0: the whole) */
} dropout_priv;

static clg_status dropout_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(dropout_priv)));
    dropout_priv *p = l->priv;
    double prob = 0.5;
    CLG_TRY(clg_cfg_float(err, cfg, sec, "p", 0.5, 0.0, 0.99, &prob));
    p->p = (float)prob;
    return CLG_OK;
}

void clg_layer_set_rng(clg_layer *l, uint32_t seed, uint32_t step, uint32_t sample_base)
{
    clg_layer_attention_set_rng(l, seed, step, sample_base);
    if (!l || l->ops != &clg_layer_dropout_ops || !l->priv)
        return;
    dropout_priv *p = l->priv;
    p->seed = seed;
    p->step = step;
    p->sample_base = sample_base;
    p->width = p->offset = 0;
}

void clg_layer_set_rng_slice(clg_layer *l, uint32_t width, uint32_t offset)
{
    if (!l || l->ops != &clg_layer_dropout_ops || !l->priv)
        return;
    dropout_priv *p = l->priv;
    p->width = width;
    p->offset = offset;
}

static clg_status dropout_setup(clg_layer *l, clg_err *err) { return clg_layer_setup_pointwise(l, err); }

static clg_status dropout_init(clg_layer *l, clg_device *dev, clg_rng *rng) { return CLG_OK; }

static uint32_t base_index(const dropout_priv *p, const clg_tensor *x)
{
    if (p->width)
        return (uint32_t)((uint64_t)p->sample_base * p->width + p->offset);
    return (uint32_t)((uint64_t)p->sample_base * (uint64_t)x->c * (uint64_t)x->h * (uint64_t)x->w);
}

static clg_status dropout_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                                  int training)
{
    dropout_priv *p = l->priv;
    size_t n = clg_tensor_numel(&in[0]);
    if (!training || p->p == 0.0f)
        return clg_nn_copy(dev, n, in[0].mem, in[0].off, out->mem, out->off);
    if (p->width)
        return clg_nn_dropout_rows(dev, n, p->p, p->seed, p->step, base_index(p, &in[0]), n / (size_t)in[0].n,
                                   p->width, in[0].mem, in[0].off, out->mem, out->off);
    return clg_nn_dropout(dev, n, p->p, p->seed, p->step, base_index(p, &in[0]), in[0].mem, in[0].off, out->mem,
                          out->off);
}

static clg_status dropout_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin,
                                   const clg_tensor *out, const clg_tensor *dout, clg_tensor *din)
{
    dropout_priv *p = l->priv;
    if (!din[0].mem)
        return CLG_OK;
    size_t n = clg_tensor_numel(&in[0]);
    if (p->p == 0.0f)
        return clg_nn_copy(dev, n, dout->mem, dout->off, din[0].mem, din[0].off);
    if (p->width)
        return clg_nn_dropout_rows(dev, n, p->p, p->seed, p->step, base_index(p, &in[0]), n / (size_t)in[0].n,
                                   p->width, dout->mem, dout->off, din[0].mem, din[0].off);
    return clg_nn_dropout(dev, n, p->p, p->seed, p->step, base_index(p, &in[0]), dout->mem, dout->off, din[0].mem,
                          din[0].off);
}

const clg_layer_ops clg_layer_dropout_ops = {
    .type = "dropout",
    .configure = dropout_configure,
    .setup = dropout_setup,
    .init = dropout_init,
    .forward = dropout_forward,
    .backward = dropout_backward,
};
