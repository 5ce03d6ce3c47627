/* [batchnorm]: eps=1e-5, momentum=0.1 (PyTorch convention). Per channel C
 * of (N, C, H, W); a (N, F, 1, 1) input normalizes each feature like
 * BatchNorm1d. Params: gamma, beta (trainable), running_mean, running_var
 * (state: moved by training forwards, used by inference forwards).
 * Backward uses the statistics of the last training forward. Training with
 * one value per channel (batch 1 after a dense layer) is refused.
 *
 * sync = 1 (data parallelism): the batch statistics are those of the whole
 * global batch, not of each device's slice. Forward: each device's
 * per-channel sums (shifted by its own first value) go to the host, every
 * device gathers all of them and combines them in device order (Chan's
 * pairwise update, in double: the same numbers on every device), and
 * normalizes with the result; the running statistics move by the global
 * batch's. Backward: the sums of dy and dy * (x - mean) are gathered the
 * same way, so dx is the global batch's; gamma's and beta's gradients stay
 * per slice (the gradient reduction adds them). Two host round trips per
 * layer and step; with one device it is the plain layer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"

typedef struct {
    float eps, momentum;
    int sync;            /* statistics over every device's slice */
    int relu;            /* fused epilogue: y = relu(bn(x) [+ input 1]) (the fusion pass) */
    cl_mem mean, invstd; /* batch statistics of the last training forward */
    /* sync: device scratch (4C floats; 2C each for the global dgamma/dbeta
     * sums), host copies, the global count of the last forward */
    cl_mem sbuf, gdg, gdb;
    float *hst;          /* 4C floats */
    double *hd;          /* 1 + 3C doubles */
    double count;
} bn_priv;

enum { BN_GAMMA = 0, BN_BETA, BN_RMEAN, BN_RVAR };

static clg_status bn_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(bn_priv)));
    bn_priv *p = l->priv;
    double eps, mom;
    CLG_TRY(clg_cfg_float(err, cfg, sec, "eps", 1e-5, 1e-12, 1.0, &eps));
    CLG_TRY(clg_cfg_float(err, cfg, sec, "momentum", 0.1, 0.0, 1.0, &mom));
    long sync;
    CLG_TRY(clg_cfg_int(err, cfg, sec, "sync", 0, 0, 1, &sync));
    p->eps = (float)eps;
    p->momentum = (float)mom;
    p->sync = (int)sync;
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

/* The scratch of the synchronized statistics, on first use. */
static clg_status sync_scratch(bn_priv *p, clg_device *dev, int C)
{
    if (p->hst)
        return CLG_OK;
    size_t bytes = (size_t)C * sizeof(float);
    if (!p->sbuf)
        CLG_TRY(clg_buf_alloc(dev, 4 * bytes, &p->sbuf));
    if (!p->gdg)
        CLG_TRY(clg_buf_alloc(dev, bytes, &p->gdg));
    if (!p->gdb)
        CLG_TRY(clg_buf_alloc(dev, bytes, &p->gdb));
    p->hst = malloc(4 * bytes);
    p->hd = malloc((1 + 3 * (size_t)C) * sizeof(double));
    if (!p->hst || !p->hd) {
        free(p->hst);
        p->hst = NULL;
        return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "out of memory");
    }
    return CLG_OK;
}

/* Forward with the global batch's statistics (see the top). */
static clg_status bn_forward_sync(clg_layer *l, clg_device *dev, const clg_tensor *x, clg_tensor *out)
{
    bn_priv *p = l->priv;
    clg_err *err = clg_dev_err(dev);
    int C = x->c;
    size_t hw = (size_t)x->h * x->w;
    CLG_TRY(sync_scratch(p, dev, C));
    CLG_TRY(clg_nn_bn_stats_local(dev, x->n, C, hw, x->mem, x->off, p->sbuf));
    CLG_CL_CHECK(err, clEnqueueReadBuffer(dev->queue, p->sbuf, CL_TRUE, 0, 3 * (size_t)C * sizeof(float), p->hst, 0,
                                          NULL, NULL));
    p->hd[0] = (double)x->n * hw;
    for (int k = 0; k < 3 * C; k++)
        p->hd[1 + k] = p->hst[k];
    const double *const *all = NULL;
    int nall = 0;
    CLG_TRY(l->sync->gather(l->sync->user, l->index, 0, p->hd, 1 + 3 * (size_t)C, &all, &nall));
    double M = 0; /* values per channel over every device */
    for (int d = 0; d < nall; d++)
        M += all[d][0];
    float *g = p->hst; /* {mean - K, invstd, mean, unbiased var} */
    for (int c = 0; c < C; c++) {
        /* Chan et al.: count, mean, sum of squared deviations, pairwise in
         * device order; each device's from its shifted sums */
        double n = 0, mean = 0, m2 = 0;
        for (int d = 0; d < nall; d++) {
            const double *v = all[d];
            double nd = v[0], K = v[1 + 3 * c], s = v[2 + 3 * c], q = v[3 + 3 * c];
            double md = K + s / nd, m2d = fmax(q - s * s / nd, 0.0);
            double delta = md - mean, nn = n + nd;
            mean += delta * nd / nn;
            m2 += m2d + delta * delta * n * nd / nn;
            n = nn;
        }
        double var = m2 / n;
        g[c] = (float)(mean - p->hd[1 + 3 * c]); /* shifted by this device's K */
        g[C + c] = (float)(1.0 / sqrt(var + (double)p->eps));
        g[2 * C + c] = (float)mean;
        g[3 * C + c] = (float)(n > 1 ? m2 / (n - 1) : var);
    }
    p->count = M;
    CLG_CL_CHECK(err, clEnqueueWriteBuffer(dev->queue, p->sbuf, CL_FALSE, 0, 4 * (size_t)C * sizeof(float), g, 0, NULL,
                                           NULL));
    return clg_nn_bn_sync_apply(dev, x->n, C, hw, p->momentum, 1, p->sbuf, x->mem, x->off, out->mem, out->off,
                                l->params[BN_GAMMA].value, l->params[BN_BETA].value, l->params[BN_RMEAN].value,
                                l->params[BN_RVAR].value, p->mean, p->invstd);
}

/* Backward with the global batch's sums (see the top). */
static clg_status bn_backward_sync(clg_layer *l, clg_device *dev, const clg_tensor *x, const clg_tensor *dout,
                                   clg_tensor *din)
{
    bn_priv *p = l->priv;
    clg_err *err = clg_dev_err(dev);
    int C = x->c;
    size_t hw = (size_t)x->h * x->w;
    CLG_TRY(clg_nn_bn_bwd_local(dev, x->n, C, hw, x->mem, x->off, dout->mem, dout->off, p->mean, p->invstd,
                                l->params[BN_GAMMA].grad, l->params[BN_BETA].grad, p->sbuf));
    CLG_CL_CHECK(err, clEnqueueReadBuffer(dev->queue, p->sbuf, CL_TRUE, 0, 2 * (size_t)C * sizeof(float), p->hst, 0,
                                          NULL, NULL));
    for (int k = 0; k < 2 * C; k++)
        p->hd[k] = p->hst[k];
    const double *const *all = NULL;
    int nall = 0;
    CLG_TRY(l->sync->gather(l->sync->user, l->index, 1, p->hd, 2 * (size_t)C, &all, &nall));
    float *g = p->hst; /* {sum dy, sum dy (x - mean)} over every device */
    for (int c = 0; c < C; c++) {
        double sb = 0, sg = 0;
        for (int d = 0; d < nall; d++) {
            sb += all[d][2 * c];
            sg += all[d][2 * c + 1];
        }
        g[c] = (float)sb;
        g[C + c] = (float)sg;
    }
    CLG_CL_CHECK(err, clEnqueueWriteBuffer(dev->queue, p->sbuf, CL_FALSE, 0, 2 * (size_t)C * sizeof(float), g, 0, NULL,
                                           NULL));
    return clg_nn_bn_bwd_data_sync(dev, x->n, C, hw, p->count, p->sbuf, x->mem, x->off, dout->mem, dout->off, p->mean,
                                   p->invstd, l->params[BN_GAMMA].value, p->gdg, p->gdb, din[0].mem, din[0].off);
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
    if (p->relu)
        return clg_nn_bn_forward_relu(dev, x->n, x->c, hw, p->eps, p->momentum, training, x->mem, x->off,
                                      nin > 1 ? in[1].mem : NULL, nin > 1 ? in[1].off : 0, out->mem, out->off,
                                      l->params[BN_GAMMA].value, l->params[BN_BETA].value,
                                      l->params[BN_RMEAN].value, l->params[BN_RVAR].value, p->mean, p->invstd);
    if (training && p->sync && l->sync)
        return bn_forward_sync(l, dev, x, out);
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
    if (p->relu)
        return clg_nn_bn_backward_relu(dev, x->n, x->c, (size_t)x->h * x->w, x->mem, x->off, out->mem, out->off,
                                       dout->mem, dout->off, p->mean, p->invstd, l->params[BN_GAMMA].value,
                                       nin > 1 ? NULL : l->params[BN_BETA].value, l->params[BN_GAMMA].grad,
                                       l->params[BN_BETA].grad, din[0].mem, din[0].off,
                                       nin > 1 ? din[1].mem : NULL, nin > 1 ? din[1].off : 0);
    if (p->sync && l->sync && p->hst && din[0].mem)
        return bn_backward_sync(l, dev, x, dout, din);
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
        clg_buf_release(dev, p->sbuf);
        clg_buf_release(dev, p->gdg);
        clg_buf_release(dev, p->gdb);
    }
    if (p) {
        free(p->hst);
        free(p->hd);
    }
    free(p);
    l->priv = NULL;
}

int clg_layer_batchnorm_fusable(const clg_layer *l)
{
    const bn_priv *p = l->priv;
    return l->ops == &clg_layer_batchnorm_ops && p && !p->sync && !p->relu && l->nin == 1;
}

void clg_layer_batchnorm_fuse_relu(clg_layer *l) { ((bn_priv *)l->priv)->relu = 1; }

const clg_layer_ops clg_layer_batchnorm_ops = {
    .type = "batchnorm",
    .configure = bn_configure,
    .setup = bn_setup,
    .init = bn_init,
    .forward = bn_forward,
    .backward = bn_backward,
    .destroy = bn_destroy,
};
