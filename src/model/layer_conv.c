/* [convolutional] (alias [conv]): y = act(conv(x, W) + b).
 * Keys: filters, size (or size_h + size_w), stride=1, pad=0, dilation=1,
 * groups=1, bias=1, activation=linear|relu|leaky|sigmoid|tanh|gelu,
 * alpha=0.01, algo=auto|im2col|winograd|winograd4|direct|fft|winograd-fused|
 * winograd4-fused.
 * Weight (K, C/groups, R, S), bias (K). relu runs in the conv epilogue; the
 * other activations as a separate kernel on the output. A pass the chosen
 * algorithm cannot run (e.g. fft backward) uses auto. */
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "ops/conv.h"
#include "ops/nn.h"

typedef struct {
    int K, R, S, stride, pad, dil, groups, bias;
    clg_act act;
    float alpha;
    clg_conv_algo algo;
    clg_conv_cache cache;
    cl_mem pre; /* gelu: pre-activation kept for backward */
    size_t pre_cap;
    int last_n; /* the batch of the latest forward (the profile's shape) */
    cl_mem keep_x, keep_dz; /* clg_conv_defer: the filter gradient's operands kept (NULL: computed in backward) */
    int keep_n;             /* the samples they hold */
    int relu_folded;        /* the relu's derivative comes with dout (clg_layer_conv_fold_relu) */
} conv_priv;

static const char *const algo_choices[] = {"auto",   "im2col", "winograd", "winograd4", "direct",
                                            "fft",    "winograd-fused", "winograd4-fused", NULL}; /* clg_conv_algo order */

static clg_status conv_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(conv_priv)));
    conv_priv *p = l->priv;
    const char *src = cfg && cfg->source_name ? cfg->source_name : "<cfg>";
    long K, R = 0, S = 0, stride, pad, dil, groups, bias;
    CLG_TRY(clg_layer_req_int(err, cfg, sec, "filters", 1, 1L << 20, &K));
    if (clg_cfg_find(sec, "size")) {
        if (clg_cfg_find(sec, "size_h") || clg_cfg_find(sec, "size_w"))
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [%s] give either 'size' or 'size_h' + 'size_w', not both",
                               src, clg_cfg_find(sec, "size")->line, sec->name);
        CLG_TRY(clg_cfg_int(err, cfg, sec, "size", 1, 1, 1 << 12, &R));
        S = R;
    } else {
        if (!clg_cfg_find(sec, "size_h") || !clg_cfg_find(sec, "size_w"))
            return clg_err_set(err, CLG_ERR_FORMAT,
                               "%s:%d: [%s] is missing the required key 'size' (or both 'size_h' and 'size_w')", src,
                               sec->line, sec->name);
        CLG_TRY(clg_cfg_int(err, cfg, sec, "size_h", 1, 1, 1 << 12, &R));
        CLG_TRY(clg_cfg_int(err, cfg, sec, "size_w", 1, 1, 1 << 12, &S));
    }
    CLG_TRY(clg_cfg_int(err, cfg, sec, "stride", 1, 1, 1 << 12, &stride));
    CLG_TRY(clg_cfg_int(err, cfg, sec, "pad", 0, 0, 1 << 12, &pad));
    CLG_TRY(clg_cfg_int(err, cfg, sec, "dilation", 1, 1, 1 << 12, &dil));
    CLG_TRY(clg_cfg_int(err, cfg, sec, "groups", 1, 1, 1L << 20, &groups));
    CLG_TRY(clg_cfg_int(err, cfg, sec, "bias", 1, 0, 1, &bias));
    CLG_TRY(clg_layer_read_act(err, cfg, sec, "activation", "linear", 1, &p->act, &p->alpha));
    int a = 0;
    CLG_TRY(clg_cfg_enum(err, cfg, sec, "algo", "auto", algo_choices, &a));
    p->K = (int)K;
    p->R = (int)R;
    p->S = (int)S;
    p->stride = (int)stride;
    p->pad = (int)pad;
    p->dil = (int)dil;
    p->groups = (int)groups;
    p->bias = (int)bias;
    p->algo = (clg_conv_algo)a;
    return CLG_OK;
}

static clg_conv_shape cshape(const conv_priv *p, int N, int C, int H, int W)
{
    clg_conv_shape s;
    memset(&s, 0, sizeof s);
    s.N = N;
    s.C = C;
    s.H = H;
    s.W = W;
    s.K = p->K;
    s.R = p->R;
    s.S = p->S;
    s.pad_h = s.pad_w = p->pad;
    s.stride_h = s.stride_w = p->stride;
    s.dil_h = s.dil_w = p->dil;
    s.groups = p->groups;
    return s;
}

static clg_status conv_setup(clg_layer *l, clg_err *err)
{
    conv_priv *p = l->priv;
    CLG_TRY(clg_layer_check_nin(l, err, 1, 1));
    const int *in = l->in_shape[0];
    clg_conv_shape s = cshape(p, in[0], in[1], in[2], in[3]);
    CLG_TRY(clg_conv_check(err, &s));
    if (p->algo != CLG_CONV_AUTO && !clg_conv_algo_supported(p->algo, &s, CLG_CONV_FWD))
        return clg_err_set(err, CLG_ERR_SHAPE,
                           "algo=%s cannot run this convolution (size %dx%d, stride %d, dilation %d, groups %d)",
                           clg_conv_algo_name(p->algo), p->R, p->S, p->stride, p->dil, p->groups);
    int P = clg_conv_out_h(&s), Q = clg_conv_out_w(&s);
    l->out_shape[0] = in[0];
    l->out_shape[1] = p->K;
    l->out_shape[2] = P;
    l->out_shape[3] = Q;
    l->nparams = 0;
    clg_layer_param_def(l, 0, "weight", 1, 4, p->K, in[1] / p->groups, p->R, p->S);
    if (p->bias)
        clg_layer_param_def(l, 1, "bias", 1, 1, p->K, 0, 0, 0);
    l->flops = 2.0 * in[0] * (double)p->K * P * Q * (in[1] / p->groups) * p->R * p->S;
    if (p->act != CLG_ACT_LINEAR)
        l->flops += (double)in[0] * p->K * P * Q;
    return CLG_OK;
}

static clg_status conv_init(clg_layer *l, clg_device *dev, clg_rng *rng)
{
    conv_priv *p = l->priv;
    CLG_TRY(clg_layer_alloc_params(l, dev));
    int cg = l->in_shape[0][1] / p->groups;
    int fan_in = cg * p->R * p->S, fan_out = (p->K / p->groups) * p->R * p->S;
    CLG_TRY(clg_layer_param_normal(dev, &l->params[0], clg_layer_init_std(p->act, fan_in, fan_out), rng));
    if (p->bias)
        CLG_TRY(clg_layer_param_const(dev, &l->params[1], 0.0f));
    p->cache.weights_version++;
    return CLG_OK;
}

static clg_status conv_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                               int training)
{
    conv_priv *p = l->priv;
    clg_conv_shape s = cshape(p, in[0].n, in[0].c, in[0].h, in[0].w);
    p->last_n = in[0].n;
    size_t ny = clg_tensor_numel(out);
    cl_mem y = out->mem;
    size_t oy = out->off;
    if (clg_act_needs_x(p->act)) {
        CLG_TRY(clg_layer_scratch(dev, &p->pre, &p->pre_cap, ny * sizeof(float)));
        y = p->pre;
        oy = 0;
    }
    CLG_TRY(clg_conv_forward(dev, &s, p->algo, &p->cache, in[0].mem, in[0].off, l->params[0].value, 0,
                             p->bias ? l->params[1].value : NULL, 0, p->act == CLG_ACT_RELU, y, oy));
    if (p->act != CLG_ACT_LINEAR && p->act != CLG_ACT_RELU)
        CLG_TRY(clg_nn_act_forward(dev, p->act, p->alpha, ny, y, oy, out->mem, out->off));
    return CLG_OK;
}

static clg_status conv_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                                const clg_tensor *dout, clg_tensor *din)
{
    conv_priv *p = l->priv;
    clg_conv_shape s = cshape(p, in[0].n, in[0].c, in[0].h, in[0].w);
    size_t ny = clg_tensor_numel(out);
    cl_mem dz = dout->mem, tmp = NULL;
    size_t odz = dout->off;
    if (p->act != CLG_ACT_LINEAR && !p->relu_folded) { /* deferred filter gradient: straight into its kept operand */
        if (!p->keep_x)
            CLG_TRY(clg_buf_alloc(dev, ny * sizeof(float), &tmp));
        dz = p->keep_x ? p->keep_dz : tmp;
        odz = 0;
        clg_status st = clg_nn_act_backward(dev, p->act, p->alpha, ny, clg_act_needs_x(p->act) ? p->pre : NULL, 0,
                                            out->mem, out->off, dout->mem, dout->off, dz, 0);
        if (st != CLG_OK) {
            clg_buf_release(dev, tmp);
            return st;
        }
    }
    clg_conv_algo af = clg_conv_algo_supported(p->algo, &s, CLG_CONV_BWD_FILTER) ? p->algo : CLG_CONV_AUTO;
    clg_status st;
    if (p->keep_x) { /* the filter and bias gradients deferred: their operands kept */
        p->keep_n = s.N;
        st = clg_nn_copy(dev, clg_tensor_numel(&in[0]), in[0].mem, in[0].off, p->keep_x, 0);
        if (st == CLG_OK && dz != p->keep_dz)
            st = clg_nn_copy(dev, ny, dz, odz, p->keep_dz, 0);
    } else {
        st = clg_conv_backward_filter(dev, &s, af, in[0].mem, in[0].off, dz, odz, 0.0f, l->params[0].grad, 0,
                                      p->bias ? l->params[1].grad : NULL, 0);
    }
    if (st == CLG_OK && din[0].mem) {
        clg_conv_algo ad = clg_conv_algo_supported(p->algo, &s, CLG_CONV_BWD_DATA) ? p->algo : CLG_CONV_AUTO;
        st = clg_conv_backward_data(dev, &s, ad, &p->cache, dz, odz, l->params[0].value, 0, din[0].mem, din[0].off);
    }
    clg_buf_release(dev, tmp);
    return st;
}

int clg_layer_conv_is_relu(const clg_layer *l)
{
    return l->ops == &clg_layer_conv_ops && l->priv && ((const conv_priv *)l->priv)->act == CLG_ACT_RELU;
}

void clg_layer_conv_fold_relu(clg_layer *l) { ((conv_priv *)l->priv)->relu_folded = 1; }

int clg_conv_defer_dims(const clg_layer *l, size_t *in, size_t *out)
{
    if (l->ops != &clg_layer_conv_ops || !l->priv)
        return 0;
    *in = (size_t)l->in_shape[0][1] * (size_t)l->in_shape[0][2] * (size_t)l->in_shape[0][3];
    *out = (size_t)l->out_shape[1] * (size_t)l->out_shape[2] * (size_t)l->out_shape[3];
    return 1;
}

void clg_conv_defer(clg_layer *l, cl_mem x, cl_mem dz)
{
    conv_priv *p = l->priv;
    p->keep_x = x;
    p->keep_dz = x ? dz : NULL;
}

clg_status clg_conv_wgrad(clg_layer *l, clg_device *dev, cl_mem x, cl_mem dz)
{
    conv_priv *p = l->priv;
    const int *in = l->in_shape[0];
    clg_conv_shape s = cshape(p, p->keep_n, in[1], in[2], in[3]);
    clg_conv_algo af = clg_conv_algo_supported(p->algo, &s, CLG_CONV_BWD_FILTER) ? p->algo : CLG_CONV_AUTO;
    return clg_conv_backward_filter(dev, &s, af, x, 0, dz, 0, 0.0f, l->params[0].grad, 0,
                                    p->bias ? l->params[1].grad : NULL, 0);
}

static void conv_params_changed(clg_layer *l)
{
    conv_priv *p = l->priv;
    if (p)
        p->cache.weights_version++;
}

static void conv_profiled(clg_layer *l, clg_device *dev, double fwd_ms, double bwd_ms, int steps)
{
    conv_priv *p = l->priv;
    if (!p || p->algo != CLG_CONV_AUTO || p->last_n <= 0)
        return;
    const int *in = l->in_shape[0];
    clg_conv_shape s = cshape(p, p->last_n, in[1], in[2], in[3]);
    clg_conv_auto_observe(dev, &s, fwd_ms, bwd_ms, steps);
}

static void conv_destroy(clg_layer *l, clg_device *dev)
{
    conv_priv *p = l->priv;
    if (p && dev) {
        clg_conv_cache_free(dev, &p->cache);
        clg_buf_release(dev, p->pre);
    }
    free(p);
    l->priv = NULL;
}

const clg_layer_ops clg_layer_conv_ops = {
    .type = "convolutional",
    .configure = conv_configure,
    .setup = conv_setup,
    .init = conv_init,
    .forward = conv_forward,
    .backward = conv_backward,
    .params_changed = conv_params_changed,
    .destroy = conv_destroy,
    .profiled = conv_profiled,
};
