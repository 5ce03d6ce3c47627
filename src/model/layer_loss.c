/* Loss layers.
 * [softmax]: out = softmax(x) over the C*H*W features of each sample;
 *   loss = -log p[label] per sample (int32 labels); correct = first argmax
 *   equals the label; backward: grad_scale * (p - onehot).
 * [mse]: out = x; loss = mean over features of (x - t)^2 per sample (float
 *   targets shaped like x); backward: grad_scale * 2 (x - t) / features.
 * forward writes {loss sum, correct count} to l->loss.result (2 floats).
 * [softmax] on a sequence (N, T, V): the token loss, softmax + cross-entropy
 *   over V at every position with N*T int32 labels (one per position, in
 *   order); optional label_smoothing (PyTorch's: targets (1 - eps) onehot +
 *   eps / V). Each sample's loss and correct count are its means over the T
 *   positions, and backward scales by grad_scale / T, so the trainer's
 *   1/global batch gives the mean over N*T positions and correct/N the
 *   per-token accuracy. */
#include <stdlib.h>

#include "model/layers.h"
#include "ops/seq.h"

typedef struct {
    int is_mse;
    int seq;          /* token loss: T positions of V classes per sample */
    float smoothing;  /* label_smoothing (sequences) */
    cl_mem loss, correct; /* per-sample scratch */
    size_t loss_cap, correct_cap;
} loss_priv;

static clg_status loss_configure_common(clg_layer *l, clg_err *err, int is_mse)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(loss_priv)));
    loss_priv *p = l->priv;
    p->is_mse = is_mse;
    l->is_loss = 1;
    l->loss.grad_scale = 1.0f;
    return CLG_OK;
}

static clg_status softmax_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(loss_configure_common(l, err, 0));
    double eps = 0.0;
    CLG_TRY(clg_cfg_float(err, cfg, sec, "label_smoothing", 0.0, 0.0, 1.0, &eps));
    ((loss_priv *)l->priv)->smoothing = (float)eps;
    return CLG_OK;
}

static clg_status mse_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    return loss_configure_common(l, err, 1);
}

static clg_status loss_setup(clg_layer *l, clg_err *err)
{
    loss_priv *p = l->priv;
    CLG_TRY(clg_layer_check_nin(l, err, 1, 1));
    p->seq = !p->is_mse && l->in_seq[0];
    if (!p->seq && p->smoothing != 0.0f)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "label_smoothing is supported on a sequence input (the token loss) only, not yet on %dx%dx%d "
                           "per sample",
                           l->in_shape[0][1], l->in_shape[0][2], l->in_shape[0][3]);
    for (int d = 0; d < 4; d++)
        l->out_shape[d] = l->in_shape[0][d];
    l->out_seq = p->seq;
    l->nparams = 0;
    l->is_loss = 1;
    l->flops = 3.0 * l->in_shape[0][0] * l->in_shape[0][1] * l->in_shape[0][2] * l->in_shape[0][3];
    return CLG_OK;
}

static clg_status loss_init(clg_layer *l, clg_device *dev, clg_rng *rng)
{
    loss_priv *p = l->priv;
    if (!l->loss.result) {
        CLG_TRY(clg_buf_alloc(dev, 2 * sizeof(float), &l->loss.result));
        CLG_TRY(clg_buf_fill(dev, l->loss.result, 0, 2, 0.0f));
    }
    size_t n = (size_t)CLG_MAX(l->in_shape[0][0], 1) * (p->seq ? l->in_shape[0][1] : 1) * sizeof(float);
    CLG_TRY(clg_layer_scratch(dev, &p->loss, &p->loss_cap, n));
    return clg_layer_scratch(dev, &p->correct, &p->correct_cap, n);
}

/* The labels buffer must hold one int32 per position (N*T), not one per sample. */
static clg_status token_labels_fit(clg_layer *l, clg_device *dev, size_t rows)
{
    if (!l->loss.labels)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: no labels set", l->ops->type);
    size_t bytes = 0;
    CLG_CL_CHECK(clg_dev_err(dev), clGetMemObjectInfo(l->loss.labels, CL_MEM_SIZE, sizeof bytes, &bytes, NULL));
    if ((l->loss.labels_off + rows) * sizeof(int32_t) > bytes)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG,
                           "token loss '%s': needs %zu labels (one per position) from offset %zu, the labels buffer "
                           "holds %zu",
                           l->name, rows, l->loss.labels_off, bytes / sizeof(int32_t));
    return CLG_OK;
}

/* Token loss: rows = n*T positions of V = in.h classes; per-position losses
 * weighted 1/T so the reduction gives per-sample means. */
static clg_status token_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, clg_tensor *out)
{
    loss_priv *p = l->priv;
    int T = in[0].c, V = in[0].h;
    size_t rows = (size_t)in[0].n * T;
    if (rows > (size_t)INT32_MAX)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED, "token loss over %zu positions", rows);
    CLG_TRY(clg_layer_scratch(dev, &p->loss, &p->loss_cap, CLG_MAX(rows, 1) * sizeof(float)));
    CLG_TRY(clg_layer_scratch(dev, &p->correct, &p->correct_cap, CLG_MAX(rows, 1) * sizeof(float)));
    CLG_TRY(token_labels_fit(l, dev, rows));
    CLG_TRY(clg_seq_token_xent_forward(dev, rows, V, 1.0f / (float)T, p->smoothing, in[0].mem, in[0].off, out->mem,
                                       out->off, l->loss.labels, l->loss.labels_off, p->loss, p->correct));
    return clg_nn_loss_reduce(dev, (int)rows, p->loss, p->correct, l->loss.result);
}

static clg_status loss_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                               int training)
{
    loss_priv *p = l->priv;
    if (p->seq)
        return token_forward(l, dev, in, out);
    int n = in[0].n;
    int F = in[0].c * in[0].h * in[0].w;
    CLG_TRY(clg_layer_scratch(dev, &p->loss, &p->loss_cap, (size_t)CLG_MAX(n, 1) * sizeof(float)));
    CLG_TRY(clg_layer_scratch(dev, &p->correct, &p->correct_cap, (size_t)CLG_MAX(n, 1) * sizeof(float)));
    if (!l->loss.labels)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: no %s set before forward", l->ops->type,
                           p->is_mse ? "targets" : "labels");
    if (!p->is_mse && (size_t)n * F <= CLG_SM_FUSED_MAX) /* small: softmax, loss and its sum in one launch */
        return clg_nn_softmax_xent_forward_reduce(dev, n, F, in[0].mem, in[0].off, out->mem, out->off,
                                                  l->loss.labels, l->loss.labels_off, l->loss.result);
    if (p->is_mse)
        CLG_TRY(clg_nn_mse_forward(dev, n, F, in[0].mem, in[0].off, l->loss.labels, l->loss.labels_off, out->mem,
                                   out->off, p->loss, p->correct));
    else
        CLG_TRY(clg_nn_softmax_xent_forward(dev, n, F, in[0].mem, in[0].off, out->mem, out->off, l->loss.labels,
                                            l->loss.labels_off, p->loss, p->correct));
    return clg_nn_loss_reduce(dev, n, p->loss, p->correct, l->loss.result);
}

static clg_status loss_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                                const clg_tensor *dout, clg_tensor *din)
{
    loss_priv *p = l->priv;
    if (!din[0].mem)
        return CLG_OK;
    int n = in[0].n;
    int F = in[0].c * in[0].h * in[0].w;
    if (!l->loss.labels)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "%s: no %s set before backward", l->ops->type,
                           p->is_mse ? "targets" : "labels");
    if (p->seq) {
        CLG_TRY(token_labels_fit(l, dev, (size_t)n * in[0].c));
        return clg_seq_token_xent_backward(dev, (size_t)n * in[0].c, in[0].h, l->loss.grad_scale / (float)in[0].c,
                                           p->smoothing, out->mem, out->off, l->loss.labels, l->loss.labels_off,
                                           din[0].mem, din[0].off);
    }
    if (p->is_mse)
        return clg_nn_mse_backward(dev, n, F, l->loss.grad_scale, in[0].mem, in[0].off, l->loss.labels,
                                   l->loss.labels_off, din[0].mem, din[0].off);
    return clg_nn_softmax_xent_backward(dev, n, F, l->loss.grad_scale, out->mem, out->off, l->loss.labels,
                                        l->loss.labels_off, din[0].mem, din[0].off);
}

static void loss_destroy(clg_layer *l, clg_device *dev)
{
    loss_priv *p = l->priv;
    if (dev) {
        if (p) {
            clg_buf_release(dev, p->loss);
            clg_buf_release(dev, p->correct);
        }
        clg_buf_release(dev, l->loss.result);
        l->loss.result = NULL;
    }
    free(p);
    l->priv = NULL;
}

const clg_layer_ops clg_layer_softmax_ops = {
    .type = "softmax",
    .configure = softmax_configure,
    .setup = loss_setup,
    .init = loss_init,
    .forward = loss_forward,
    .backward = loss_backward,
    .destroy = loss_destroy,
};

const clg_layer_ops clg_layer_mse_ops = {
    .type = "mse",
    .configure = mse_configure,
    .setup = loss_setup,
    .init = loss_init,
    .forward = loss_forward,
    .backward = loss_backward,
    .destroy = loss_destroy,
};
