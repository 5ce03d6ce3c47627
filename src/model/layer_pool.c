/* [maxpool], [avgpool]: size, stride (default size), pad=0 (at most size/2),
 * PyTorch semantics (floor output size; max: padding is -inf; avg: padding
 * counted in the divisor). [gap]: global average pooling -> (N, C, 1, 1). */
#include <stdlib.h>

#include "model/layers.h"

typedef struct {
    int is_max, is_gap;
    int size, stride, pad;
    int relu; /* backward also applies the relu before it (clg_layer_pool_fold_relu) */
} pool_priv;

static clg_status pool_configure_common(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec,
                                        int is_max)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(pool_priv)));
    pool_priv *p = l->priv;
    p->is_max = is_max;
    long size, stride, pad;
    CLG_TRY(clg_layer_req_int(err, cfg, sec, "size", 1, 1 << 16, &size));
    CLG_TRY(clg_cfg_int(err, cfg, sec, "stride", size, 1, 1 << 16, &stride));
    CLG_TRY(clg_cfg_int(err, cfg, sec, "pad", 0, 0, size / 2, &pad));
    p->size = (int)size;
    p->stride = (int)stride;
    p->pad = (int)pad;
    return CLG_OK;
}

static clg_status maxpool_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    return pool_configure_common(l, err, cfg, sec, 1);
}

static clg_status avgpool_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    return pool_configure_common(l, err, cfg, sec, 0);
}

static clg_status gap_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(pool_priv)));
    pool_priv *p = l->priv;
    p->is_gap = 1;
    return CLG_OK;
}

static clg_pool_shape pshape(const pool_priv *p, int n, const int *s)
{
    clg_pool_shape ps = {n, s[1], s[2], s[3], p->size, p->size, p->stride, p->stride, p->pad, p->pad};
    return ps;
}

static clg_status pool_setup(clg_layer *l, clg_err *err)
{
    pool_priv *p = l->priv;
    CLG_TRY(clg_layer_check_nin(l, err, 1, 1));
    const int *s = l->in_shape[0];
    l->nparams = 0;
    l->out_shape[0] = s[0];
    l->out_shape[1] = s[1];
    if (p->is_gap) {
        l->out_shape[2] = l->out_shape[3] = 1;
        l->flops = (double)s[0] * s[1] * s[2] * s[3];
        return CLG_OK;
    }
    clg_pool_shape ps = pshape(p, s[0], s);
    int P = clg_pool_out_h(&ps), Q = clg_pool_out_w(&ps);
    if (P <= 0 || Q <= 0)
        return clg_err_set(err, CLG_ERR_SHAPE, "window %d (pad %d) does not fit the %dx%d input", p->size, p->pad,
                           s[2], s[3]);
    l->out_shape[2] = P;
    l->out_shape[3] = Q;
    l->flops = (double)s[0] * s[1] * P * Q * p->size * p->size;
    return CLG_OK;
}

static clg_status pool_init(clg_layer *l, clg_device *dev, clg_rng *rng) { return CLG_OK; }

static clg_status pool_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                               int training)
{
    pool_priv *p = l->priv;
    const clg_tensor *x = &in[0];
    if (p->is_gap)
        return clg_nn_gap_forward(dev, (size_t)x->n * x->c, (size_t)x->h * x->w, x->mem, x->off, out->mem, out->off);
    int s[4] = {x->n, x->c, x->h, x->w};
    clg_pool_shape ps = pshape(p, x->n, s);
    return clg_nn_pool_forward(dev, p->is_max, &ps, x->mem, x->off, out->mem, out->off);
}

static clg_status pool_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                                const clg_tensor *dout, clg_tensor *din)
{
    pool_priv *p = l->priv;
    const clg_tensor *x = &in[0];
    if (!din[0].mem)
        return CLG_OK;
    if (p->is_gap)
        return clg_nn_gap_backward(dev, (size_t)x->n * x->c, (size_t)x->h * x->w, dout->mem, dout->off, din[0].mem,
                                   din[0].off);
    int s[4] = {x->n, x->c, x->h, x->w};
    clg_pool_shape ps = pshape(p, x->n, s);
    return clg_nn_pool_backward(dev, p->is_max, &ps, x->mem, x->off, dout->mem, dout->off, din[0].mem, din[0].off,
                                p->relu);
}

int clg_layer_pool_relu(const clg_layer *l)
{
    return l->ops == &clg_layer_maxpool_ops && l->priv && ((const pool_priv *)l->priv)->relu;
}

int clg_layer_pool_fold_relu(clg_layer *l)
{
    if (l->ops != &clg_layer_maxpool_ops || !l->priv)
        return 0;
    pool_priv *p = l->priv;
    clg_pool_shape ps = pshape(p, l->in_shape[0][0], l->in_shape[0]);
    p->relu = clg_nn_pool_relu_foldable(1, &ps);
    return p->relu;
}

const clg_layer_ops clg_layer_maxpool_ops = {
    .type = "maxpool",
    .configure = maxpool_configure,
    .setup = pool_setup,
    .init = pool_init,
    .forward = pool_forward,
    .backward = pool_backward,
};

const clg_layer_ops clg_layer_avgpool_ops = {
    .type = "avgpool",
    .configure = avgpool_configure,
    .setup = pool_setup,
    .init = pool_init,
    .forward = pool_forward,
    .backward = pool_backward,
};

const clg_layer_ops clg_layer_gap_ops = {
    .type = "gap",
    .configure = gap_configure,
    .setup = pool_setup,
    .init = pool_init,
    .forward = pool_forward,
    .backward = pool_backward,
};
