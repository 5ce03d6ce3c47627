/* [batchnorm]: eps=1e-5, momentum=0.1 (PyTorch convention). Per channel C
 * of (N, C, H, W); a (N, F, 1, 1) input normalizes each feature like
 * BatchNorm1d. Params: gamma, beta (trainable), running_mean, running_var
 * (state: moved by training forwards, used by inference forwards).
 * Backward uses the statistics of the last training forward. Training with
 * one value per channel (batch 1 after a dense layer) is refused. */
#include <stdlib.h>

#include "model/layers.h"

typedef struct {
    float eps, momentum;
    cl_mem mean, invstd; /* batch statistics of the last training forward */
} bn_priv;

enum { BN_GAMMA = 0, BN_BETA, BN_RMEAN, BN_RVAR };

static clg_status bn_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(bn_priv)));
    bn_priv *p = l->priv;
    double eps, mom;
    CLG_TRY(clg_cfg_float(err, cfg, sec, "eps", 1e-5, 1e-12, 1.0, &eps));
    CLG_TRY(clg_cfg_float(err, cfg, sec, "momentum", 0.1, 0.0, 1.0, &mom));
    p->eps = (float)eps;
    p->momentum = (float)mom;
    return CLG_OK;
}

static clg_status bn_setup(clg_layer *l, clg_err *err)
{
    CLG_TRY(clg_layer_check_nin(l, err, 1, 1));
    const int *s = l->in_shape[0];
    for (int d = 0; d < 4; d++)
        l->out_shape[d] = s[d];
    l->nparams = 0;
    clg_layer_param_def(l, BN_GAMMA, "gamma", 1, 1, s[1], 0, 0, 0);
    clg_layer_param_def(l, BN_BETA, "beta", 1, 1, s[1], 0, 0, 0);
    clg_layer_param_def(l, BN_RMEAN, "running_mean", 0, 1, s[1], 0, 0, 0);
    clg_layer_param_def(l, BN_RVAR, "running_var", 0, 1, s[1], 0, 0, 0);
    l->flops = 4.0 * s[0] * s[1] * s[2] * s[3];
    return CLG_OK;
}

static clg_status bn_init(clg_layer *l, clg_device *dev, clg_rng *rng)
{
    bn_priv *p = l->priv;
    CLG_TRY(clg_layer_alloc_params(l, dev));
    CLG_TRY(clg_layer_param_const(dev, &l->params[BN_GAMMA], 1.0f));
    CLG_TRY(clg_layer_param_const(dev, &l->params[BN_BETA], 0.0f));
    CLG_TRY(clg_layer_param_const(dev, &l->params[BN_RMEAN], 0.0f));
    CLG_TRY(clg_layer_param_const(dev, &l->params[BN_RVAR], 1.0f));
    size_t bytes = (size_t)l->in_shape[0][1] * sizeof(float);
    if (!p->mean)
        CLG_TRY(clg_buf_alloc(dev, bytes, &p->mean));
    if (!p->invstd)
        CLG_TRY(clg_buf_alloc(dev, bytes, &p->invstd));
    return CLG_OK;
}

static clg_status bn_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                             int training)
{
    bn_priv *p = l->priv;
    const clg_tensor *x = &in[0];
    size_t hw = (size_t)x->h * x->w;
    if (training && (size_t)x->n * hw < 2)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_SHAPE,
                           "batchnorm '%s': training sees one value per channel (batch %d x %dx%d), so the batch "
                           "variance is 0 and the output meaningless: use a batch of 2 or more (or remove [batchnorm] "
                           "after a dense layer)",
                           l->name, x->n, x->h, x->w);
    if (training)
        return clg_nn_bn_forward_train(dev, x->n, x->c, hw, p->eps, p->momentum, 1, x->mem, x->off, out->mem,
                                       out->off, l->params[BN_GAMMA].value, l->params[BN_BETA].value,
                                       l->params[BN_RMEAN].value, l->params[BN_RVAR].value, p->mean, p->invstd);
    return clg_nn_bn_forward_infer(dev, x->n, x->c, hw, p->eps, x->mem, x->off, out->mem, out->off,
                                   l->params[BN_GAMMA].value, l->params[BN_BETA].value, l->params[BN_RMEAN].value,
                                   l->params[BN_RVAR].value);
}

static clg_status bn_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                              const clg_tensor *dout, clg_tensor *din)
{
    bn_priv *p = l->priv;
    const clg_tensor *x = &in[0];
    return clg_nn_bn_backward(dev, x->n, x->c, (size_t)x->h * x->w, x->mem, x->off, dout->mem, dout->off, p->mean,
                              p->invstd, l->params[BN_GAMMA].value, l->params[BN_GAMMA].grad,
                              l->params[BN_BETA].grad, din[0].mem, din[0].off);
}

static void bn_destroy(clg_layer *l, clg_device *dev)
{
    bn_priv *p = l->priv;
    if (p && dev) {
        clg_buf_release(dev, p->mean);
        clg_buf_release(dev, p->invstd);
    }
    free(p);
    l->priv = NULL;
}

const clg_layer_ops clg_layer_batchnorm_ops = {
    .type = "batchnorm",
    .configure = bn_configure,
    .setup = bn_setup,
    .init = bn_init,
    .forward = bn_forward,
    .backward = bn_backward,
    .destroy = bn_destroy,
};
