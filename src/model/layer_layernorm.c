/* [layernorm] eps = 1e-5, affine = 1: normalization over C at every
 * position of a sequence (N, T, C) (over the C*H*W features of each sample
 * otherwise), as torch.nn.LayerNorm: y = (x - mean) / sqrt(var + eps) *
 * gamma + beta, var biased. Params "gamma" (1) and "beta" (0), C each, when
 * affine. Forward keeps mean and rstd per row for backward; no running
 * statistics (training and inference compute the same). */
#include <stdlib.h>

#include "model/layers.h"
#include "ops/seq.h"

typedef struct {
    float eps;
    int affine;
    int per;   /* rows per sample */
    int C;     /* values per row */
    cl_mem mean, rstd;
    size_t mean_cap, rstd_cap;
} ln_priv;

static clg_status ln_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(ln_priv)));
    ln_priv *p = l->priv;
    double eps = 1e-5;
    long affine = 1;
    CLG_TRY(clg_cfg_float(err, cfg, sec, "eps", 1e-5, 1e-12, 1.0, &eps));
    CLG_TRY(clg_cfg_int(err, cfg, sec, "affine", 1, 0, 1, &affine));
    p->eps = (float)eps;
    p->affine = (int)affine;
    return CLG_OK;
}

static clg_status ln_setup(clg_layer *l, clg_err *err)
{
    ln_priv *p = l->priv;
    CLG_TRY(clg_layer_check_nin(l, err, 1, 1));
    const int *s = l->in_shape[0];
    long long C = l->in_seq[0] ? s[2] : (long long)s[1] * s[2] * s[3];
    if (C > (1 << 24))
        return clg_err_set(err, CLG_ERR_SHAPE, "layernorm over %lld values is too large", C);
    p->C = (int)C;
    p->per = l->in_seq[0] ? s[1] : 1;
    for (int d = 0; d < 4; d++)
        l->out_shape[d] = s[d];
    l->out_seq = l->in_seq[0];
    l->nparams = 0;
    if (p->affine) {
        clg_layer_param_def(l, 0, "gamma", 1, 1, p->C, 0, 0, 0);
        clg_layer_param_def(l, 1, "beta", 1, 1, p->C, 0, 0, 0);
    }
    l->flops = 8.0 * s[0] * s[1] * s[2] * s[3];
    return CLG_OK;
}

static clg_status ln_init(clg_layer *l, clg_device *dev, clg_rng *rng)
{
    ln_priv *p = l->priv;
    CLG_TRY(clg_layer_alloc_params(l, dev));
    if (p->affine) {
        CLG_TRY(clg_layer_param_const(dev, &l->params[0], 1.0f));
        CLG_TRY(clg_layer_param_const(dev, &l->params[1], 0.0f));
    }
    size_t rows = (size_t)CLG_MAX(l->in_shape[0][0], 1) * p->per;
    CLG_TRY(clg_layer_scratch(dev, &p->mean, &p->mean_cap, rows * sizeof(float)));
    return clg_layer_scratch(dev, &p->rstd, &p->rstd_cap, rows * sizeof(float));
}

static clg_status ln_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                             int training)
{
    ln_priv *p = l->priv;
    size_t rows = (size_t)in[0].n * p->per;
    CLG_TRY(clg_layer_scratch(dev, &p->mean, &p->mean_cap, CLG_MAX(rows, 1) * sizeof(float)));
    CLG_TRY(clg_layer_scratch(dev, &p->rstd, &p->rstd_cap, CLG_MAX(rows, 1) * sizeof(float)));
    return clg_seq_layernorm_forward(dev, rows, p->C, p->eps, in[0].mem, in[0].off,
                                     p->affine ? l->params[0].value : NULL, p->affine ? l->params[1].value : NULL,
                                     out->mem, out->off, p->mean, p->rstd);
}

static clg_status ln_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                              const clg_tensor *dout, clg_tensor *din)
{
    ln_priv *p = l->priv;
    size_t rows = (size_t)in[0].n * p->per;
    return clg_seq_layernorm_backward(dev, rows, p->C, in[0].mem, in[0].off, dout->mem, dout->off,
                                      p->affine ? l->params[0].value : NULL, p->mean, p->rstd,
                                      p->affine ? l->params[0].grad : NULL, p->affine ? l->params[1].grad : NULL,
                                      din[0].mem, din[0].off);
}

static void ln_destroy(clg_layer *l, clg_device *dev)
{
    ln_priv *p = l->priv;
    if (p && dev) {
        clg_buf_release(dev, p->mean);
        clg_buf_release(dev, p->rstd);
    }
    free(p);
    l->priv = NULL;
}

const clg_layer_ops clg_layer_layernorm_ops = {
    .type = "layernorm",
    .configure = ln_configure,
    .setup = ln_setup,
    .init = ln_init,
    .forward = ln_forward,
    .backward = ln_backward,
    .destroy = ln_destroy,
};
