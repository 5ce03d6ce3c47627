/* [dense] (alias [connected]): y = act(x W^T + b), x flattened to
 * (N, C*H*W); weight (units, in_features) row-major like torch.nn.Linear.
 * On a sequence (N, T, C) it applies per position: one GEMM over N*T rows
 * of C, output the sequence (N, T, units).
 * tie = NAME: the weight is [embedding] NAME's (vocab, dim) table (units =
 * vocab, in_features = dim; the layer owns only its bias); backward writes
 * the table's gradient, which the embedding's backward (later in the
 * reverse pass) then adds to: a fixed order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "ops/gemm.h"
#include "ops/gemm_splitk.h"
#include "ops/tune.h"

/* Largest forward product (batch x units x in_features multiply-adds) run
 * by the single-launch dot-product GEMM. */
#define DENSE_DOT_MAX (1 << 25)
/* dx = dz W by clg_gemm_rows up to this many rows on CPU devices without a family parameter dense_dx_rows */
#define DENSE_DX_ROWS 64

typedef struct {
    int units, bias;
    clg_act act;
    float alpha;
    int in_features;
    int per;        /* rows per sample: T on a sequence, else 1 */
    int bi;         /* index of the bias param (0 when tied) */
    char tie[64];   /* [embedding] whose table is the weight ("" untied) */
    int tie_dim;
    clg_layer *tied; /* that layer in this instance set (link) */
    cl_mem pre; /* gelu: pre-activation kept for backward (pre_d: the GELU's derivative there) */
    size_t pre_cap;
    cl_mem keep_x, keep_dz; /* clg_dense_defer: the weight gradient's operands kept at row keep_row (NULL: none) */
    size_t keep_row;
    int pre_d;
} dense_priv;

/* The section named `name` in cfg (a layer's `name` key, else its default
 * "<type><index>"); NULL when none. */
static clg_cfg_section *find_section(const clg_cfg *cfg, const char *name)
{
    int first = cfg->nsec > 0 && strcmp(cfg->sec[0].name, "net") == 0;
    for (int k = first; k < cfg->nsec; k++) {
        const clg_cfg_kv *kv = clg_cfg_find(&cfg->sec[k], "name");
        char def[96];
        snprintf(def, sizeof def, "%s%d", cfg->sec[k].name, k - first);
        if (strcmp(kv ? kv->value : def, name) == 0)
            return &cfg->sec[k];
    }
    return NULL;
}

/* tie = NAME: NAME must be an [embedding]; *units receives its vocab. */
static clg_status dense_tie_config(dense_priv *p, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec,
                                   const char *tie, long *units)
{
    const char *src = cfg && cfg->source_name ? cfg->source_name : "<cfg>";
    const clg_cfg_kv *kv = clg_cfg_find(sec, "tie");
    int line = kv ? kv->line : sec->line;
    if (strlen(tie) >= sizeof p->tie)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [dense] tie = '%s': name too long", src, line, tie);
    clg_cfg_section *e = find_section(cfg, tie);
    if (!e)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [dense] tie = '%s': no layer has that name", src, line, tie);
    if (strcmp(e->name, "embedding") != 0)
        return clg_err_set(err, CLG_ERR_FORMAT,
                           "%s:%d: [dense] tie = '%s' names a [%s] layer (line %d); tie takes an [embedding]", src,
                           line, tie, e->name, e->line);
    const clg_cfg_kv *v = clg_cfg_find(e, "vocab"), *d = clg_cfg_find(e, "dim");
    *units = v ? strtol(v->value, NULL, 10) : 0;
    p->tie_dim = d ? (int)strtol(d->value, NULL, 10) : 0;
    if (*units < 1 || p->tie_dim < 1) /* the embedding's own configure reports its keys */
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [dense] tie = '%s': that embedding (line %d) has no valid vocab "
                           "and dim", src, line, tie, e->line);
    snprintf(p->tie, sizeof p->tie, "%s", tie);
    return CLG_OK;
}

static clg_status dense_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(dense_priv)));
    dense_priv *p = l->priv;
    long units = 0, bias = 1;
    const char *tie = NULL;
    CLG_TRY(clg_cfg_str(err, cfg, sec, "tie", "", &tie));
    if (tie[0])
        CLG_TRY(dense_tie_config(p, err, cfg, sec, tie, &units));
    if (!tie[0] || clg_cfg_find(sec, "units")) {
        long want = units;
        CLG_TRY(clg_layer_req_int(err, cfg, sec, "units", 1, 1L << 24, &units));
        if (tie[0] && units != want) {
            const clg_cfg_kv *kv = clg_cfg_find(sec, "units");
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [dense] units = %ld, but tie = %s has vocab = %ld",
                               cfg && cfg->source_name ? cfg->source_name : "<cfg>", kv->line, units, tie, want);
        }
    }
    CLG_TRY(clg_cfg_int(err, cfg, sec, "bias", 1, 0, 1, &bias));
    CLG_TRY(clg_layer_read_act(err, cfg, sec, "activation", "linear", 1, &p->act, &p->alpha));
    p->units = (int)units;
    p->bias = (int)bias;
    p->bi = tie[0] ? 0 : 1;
    return CLG_OK;
}

static clg_status dense_setup(clg_layer *l, clg_err *err)
{
    dense_priv *p = l->priv;
    CLG_TRY(clg_layer_check_nin(l, err, 1, 1));
    const int *s = l->in_shape[0];
    long long inf = l->in_seq[0] ? s[2] : (long long)s[1] * s[2] * s[3];
    if (inf > (1LL << 30))
        return clg_err_set(err, CLG_ERR_SHAPE, "dense input of %lld features is too large", inf);
    p->in_features = (int)inf;
    p->per = l->in_seq[0] ? s[1] : 1;
    if (p->tie[0] && p->in_features != p->tie_dim)
        return clg_err_set(err, CLG_ERR_SHAPE, "tie = %s: the input has %d features, the embedding's dim is %d",
                           p->tie, p->in_features, p->tie_dim);
    l->out_shape[0] = s[0];
    l->out_shape[1] = l->in_seq[0] ? p->per : p->units;
    l->out_shape[2] = l->in_seq[0] ? p->units : 1;
    l->out_shape[3] = 1;
    l->out_seq = l->in_seq[0];
    l->nparams = 0;
    if (!p->tie[0])
        clg_layer_param_def(l, 0, "weight", 1, 2, p->units, p->in_features, 0, 0);
    if (p->bias)
        clg_layer_param_def(l, p->bi, "bias", 1, 1, p->units, 0, 0, 0);
    double rows = (double)s[0] * p->per;
    l->flops = 2.0 * rows * (double)p->in_features * p->units;
    if (p->act != CLG_ACT_LINEAR)
        l->flops += rows * p->units;
    return CLG_OK;
}

static clg_status dense_init(clg_layer *l, clg_device *dev, clg_rng *rng)
{
    dense_priv *p = l->priv;
    CLG_TRY(clg_layer_alloc_params(l, dev));
    if (!p->tie[0])
        CLG_TRY(clg_layer_param_normal(dev, &l->params[0], clg_layer_init_std(p->act, p->in_features, p->units),
                                       rng));
    if (p->bias)
        CLG_TRY(clg_layer_param_const(dev, &l->params[p->bi], 0.0f));
    return CLG_OK;
}

static clg_status dense_link(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_layer *layers, int nlayers)
{
    dense_priv *p = l->priv;
    if (!p->tie[0])
        return CLG_OK;
    p->tied = NULL;
    for (int j = 0; j < nlayers; j++)
        if (strcmp(layers[j].name, p->tie) == 0)
            p->tied = &layers[j];
    if (!p->tied || !clg_layer_is_embedding(p->tied))
        return clg_err_set(err, CLG_ERR_FORMAT, "tie = %s is not an [embedding] of this network", p->tie);
    if (p->tied->index >= l->index)
        return clg_err_set(err, CLG_ERR_FORMAT, "tie = %s: the embedding must come before the layer that ties it",
                           p->tie);
    if (clg_layer_embedding_tie(p->tied))
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "tie = %s: that embedding is tied by another dense layer already (one tie per embedding is "
                           "supported)",
                           p->tie);
    return CLG_OK;
}

/* The weight's value and gradient buffers (the tied embedding's table). */
static clg_param *dense_weight(clg_layer *l)
{
    dense_priv *p = l->priv;
    return p->tie[0] ? &p->tied->params[0] : &l->params[0];
}

static clg_status dense_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                                int training)
{
    dense_priv *p = l->priv;
    if (p->tie[0] && !p->tied)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "dense '%s': tie = %s was not linked", l->name,
                           p->tie);
    int n = in[0].n * p->per; /* GEMM rows */
    size_t ny = (size_t)n * p->units;
    cl_mem y = out->mem;
    size_t oy = out->off;
    p->pre_d = 0;
    if (clg_act_needs_x(p->act)) {
        CLG_TRY(clg_layer_scratch(dev, &p->pre, &p->pre_cap, ny * sizeof(float)));
        y = p->pre;
        oy = 0;
    }
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.tb = 1;
    g.M = n;
    g.N = p->units;
    g.K = p->in_features;
    g.A = in[0].mem;
    g.offA = in[0].off;
    g.lda = p->in_features;
    g.B = dense_weight(l)->value;
    g.ldb = p->in_features;
    g.C = y;
    g.offC = oy;
    g.ldc = p->units;
    if (p->bias) {
        g.bias = l->params[p->bi].value;
        g.bias_mode = CLG_BIAS_COL;
    }
    g.relu = p->act == CLG_ACT_RELU;
    /* small products in one launch (dot products along K on the operands in
     * place, bias + ReLU in its epilogue) instead of two packing passes and
     * the packed kernel: on PoCL the kernel time was the same or lower for
     * every dense layer of LeNet-5 and VGG-S (fc3 128x10x84: 0.009 against
     * 0.023-0.034 ms) and two launches fewer; larger products keep the
     * tuned packed kernels. On CPU devices also a long dot product (K >= 4
     * x units) over few rows (<= 256): packing would copy the whole weight
     * per call for little reuse (VGG-S fc1 256 x 256 x 3136 on PoCL: 5.0
     * against 6.1 ms, at 64 rows 1.3 against 2.4 ms). */
    int small = (double)n * p->units * p->in_features <= DENSE_DOT_MAX ||
                ((dev->info.type & CLG_DEVICE_CPU) && n <= 256 && p->in_features >= 4 * p->units);
    if (!small && clg_act_needs_x(p->act)) {
        /* GELU in the GEMM's epilogue: the output and the pre-activation
         * (kept for backward) in one pass, no separate activation launch;
         * with a bias (backward's fused pass) the derivative instead, which
         * backward then only multiplies (no second Phi and exp there) */
        g.gelu = (p->act == CLG_ACT_GELU ? 1 : 2) + (p->bias ? 2 : 0);
        p->pre_d = p->bias;
        g.pre = p->pre;
        g.C = out->mem;
        g.offC = out->off;
        return clg_gemm(dev, &g, NULL);
    }
    if (small)
        CLG_TRY(clg_gemm_dot(dev, &g, NULL));
    else
        CLG_TRY(clg_gemm(dev, &g, NULL));
    if (p->act != CLG_ACT_LINEAR && p->act != CLG_ACT_RELU)
        CLG_TRY(clg_nn_act_forward(dev, p->act, p->alpha, ny, y, oy, out->mem, out->off));
    return CLG_OK;
}

/* dz (tmp) = dout * act'(.), with fused also the bias gradient. */
static clg_status dense_act_backward(clg_layer *l, clg_device *dev, int n, int fused, const clg_tensor *out,
                                     const clg_tensor *dout, cl_mem tmp)
{
    dense_priv *p = l->priv;
    size_t rows = (size_t)n, cols = (size_t)p->units;
    if (fused && p->act == CLG_ACT_RELU)
        return clg_nn_relu_bwd_colsum(dev, rows, cols, out->mem, out->off, dout->mem, dout->off, tmp, 0,
                                      l->params[p->bi].grad, 0);
    if (fused && p->pre_d) /* GELU: the derivative kept by forward */
        return clg_nn_dmul_colsum(dev, rows, cols, p->pre, 0, dout->mem, dout->off, tmp, 0, l->params[p->bi].grad, 0);
    if (fused) /* GELU: its derivative from the pre-activation kept by forward */
        return clg_nn_act_bwd_colsum(dev, p->act, rows, cols, p->pre, 0, dout->mem, dout->off, tmp, 0,
                                     l->params[p->bi].grad, 0);
    return clg_nn_act_backward(dev, p->act, p->alpha, rows * cols, clg_act_needs_x(p->act) ? p->pre : NULL, 0,
                               out->mem, out->off, dout->mem, dout->off, tmp, 0);
}

/* dW = dz^T x (+ C with acc) over n GEMM rows into C (offC floats); the product's kernel chosen by its size as
 * backward does. */
clg_status clg_dense_wgrad(clg_layer *l, clg_device *dev, int n, cl_mem dz, size_t odz, cl_mem x, size_t ox, cl_mem C,
                           size_t offC, int acc)
{
    dense_priv *p = l->priv;
    int small = (double)n * p->units * p->in_features <= DENSE_DOT_MAX;
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.ta = 1;
    g.M = p->units;
    g.N = p->in_features;
    g.K = n;
    g.A = dz;
    g.offA = odz;
    g.lda = p->units;
    g.B = x;
    g.offB = ox;
    g.ldb = p->in_features;
    g.C = C;
    g.offC = offC;
    g.ldc = p->in_features;
    g.beta = acc ? 1.0f : 0.0f; /* C + the product: rounded as an addition of the product to C */
    /* a long batch (K) with a small output: clg_gemm's split-K where it would
     * take it (GPUs; gemm_rows would run few work-items over the whole batch) */
    int rows = small && !clg_gemm_splitk_wanted(dev, &g);
    return rows ? clg_gemm_rows(dev, &g, NULL) : clg_gemm(dev, &g, NULL);
}

int clg_dense_dims(const clg_layer *l, int *per, int *in, int *units)
{
    if (l->ops != &clg_layer_dense_ops || !l->priv || ((const dense_priv *)l->priv)->tie[0])
        return 0;
    const dense_priv *p = l->priv;
    *per = p->per;
    *in = p->in_features;
    *units = p->units;
    return 1;
}

void clg_dense_defer(clg_layer *l, cl_mem x, cl_mem dz, size_t row)
{
    dense_priv *p = l->priv;
    p->keep_x = x;
    p->keep_dz = x ? dz : NULL;
    p->keep_row = row;
}

/* The deferred weight gradient's operands: the n input rows and dz rows into keep_x / keep_dz at keep_row. */
static clg_status dense_keep(clg_layer *l, clg_device *dev, int n, const clg_tensor *in, cl_mem dz, size_t odz)
{
    dense_priv *p = l->priv;
    CLG_TRY(clg_nn_copy(dev, (size_t)n * p->in_features, in[0].mem, in[0].off, p->keep_x,
                        p->keep_row * p->in_features));
    return clg_nn_copy(dev, (size_t)n * p->units, dz, odz, p->keep_dz, p->keep_row * p->units);
}

static clg_status dense_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                                 const clg_tensor *dout, clg_tensor *din)
{
    dense_priv *p = l->priv;
    int n = in[0].n * p->per; /* GEMM rows */
    size_t ny = (size_t)n * p->units;
    cl_mem dz = dout->mem, tmp = NULL;
    size_t odz = dout->off;
    /* ReLU or GELU with a bias: the activation's backward and the bias gradient in one pass */
    int fused = (p->act == CLG_ACT_RELU || clg_act_needs_x(p->act)) && p->bias;
    if (p->act != CLG_ACT_LINEAR) {
        CLG_TRY(clg_buf_alloc(dev, ny * sizeof(float), &tmp));
        clg_status st = dense_act_backward(l, dev, n, fused, out, dout, tmp);
        if (st != CLG_OK) {
            clg_buf_release(dev, tmp);
            return st;
        }
        dz = tmp;
        odz = 0;
    }
    clg_status st = CLG_OK;
    /* small: both products in one launch each (clg_gemm_rows) */
    int small = (double)n * p->units * p->in_features <= DENSE_DOT_MAX;
    if (p->keep_x) /* the weight gradient deferred: its operands kept */
        st = dense_keep(l, dev, n, in, dz, odz);
    else
        st = clg_dense_wgrad(l, dev, n, dz, odz, in[0].mem, in[0].off, dense_weight(l)->grad, 0, 0);
    if (st == CLG_OK && p->bias && !fused)
        st = clg_nn_colsum(dev, (size_t)n, (size_t)p->units, dz, odz, l->params[p->bi].grad, 0);
    if (st == CLG_OK && din[0].mem) {
        /* dx = dz W */
        clg_gemm_args g;
        clg_gemm_args_init(&g);
        g.M = n;
        g.N = p->in_features;
        g.K = p->units;
        g.A = dz;
        g.offA = odz;
        g.lda = p->units;
        g.B = dense_weight(l)->value;
        g.ldb = p->in_features;
        g.C = din[0].mem;
        g.offC = din[0].off;
        g.ldc = p->in_features;
        /* few rows on CPU devices (at most the family parameter dense_dx_rows, default 64, 0 off;
         * data/tune-families.json): gemm_rows reads the weight once, row blocks innermost (clg_gemm's packed
         * kernel packs it and then reads it once per row panel). Measured ahead on an AMD EPYC Zen 4; behind
         * on an Intel Xeon (pocl-cpu-avx512-intel: 0) */
        int rows_dx = small || ((dev->info.type & CLG_DEVICE_CPU) &&
                                n <= clg_tune_family_param(dev, "dense_dx_rows", DENSE_DX_ROWS));
        st = rows_dx ? clg_gemm_rows(dev, &g, NULL) : clg_gemm(dev, &g, NULL);
    }
    clg_buf_release(dev, tmp);
    return st;
}

static void dense_destroy(clg_layer *l, clg_device *dev)
{
    dense_priv *p = l->priv;
    if (p && dev)
        clg_buf_release(dev, p->pre);
    free(p);
    l->priv = NULL;
}

const clg_layer_ops clg_layer_dense_ops = {
    .type = "dense",
    .configure = dense_configure,
    .setup = dense_setup,
    .init = dense_init,
    .forward = dense_forward,
    .backward = dense_backward,
    .link = dense_link,
    .destroy = dense_destroy,
};
