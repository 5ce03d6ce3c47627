/* [attention]: multi-head self-attention on a sequence (N, T, C) stored as
 * {N, T, C, 1}: qkv = x Wqkv^T + bqkv (one GEMM, (N T, 3C)), per head
 * softmax(scale q k^T, causal mask) v read straight from qkv (no
 * transposes, see src/ops/attention.h), out = a Wout^T + bout.
 * Keys: heads (required, divides C), causal = 1, dropout = 0 (on the
 * probabilities, in training; the gemm algorithm and the fused kernels'
 * CPU variant, which draw the same mask: auto picks gemm, fused on other
 * devices refuses it at run time), algo = auto|fused|gemm. Params (torch.nn.MultiheadAttention's
 * in_proj / out_proj): qkv_weight (3C x C: rows of Wq, Wk, Wv), qkv_bias
 * (3C), out_weight (C x C), out_bias (C). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "ops/attention.h"
#include "ops/attn_cache.h"
#include "ops/gemm.h"
#include "ops/nn.h"

typedef struct {
    int heads, causal;
    float dropout;
    uint32_t seed, step, sample_base; /* dropout mask (clg_layer_attention_set_rng) */
    clg_attn_algo algo; /* configured (auto: chosen in setup, see attn_choose) */
    clg_attn_algo run;  /* what forward/backward run */
    int T, C, d;
    int trained;            /* the last forward ran in training mode (its dropout mask) */
    cl_mem qkv, att, saved; /* forward results kept for backward */
    size_t qkv_cap, att_cap, saved_cap;
    cl_mem kc, vc; /* decoding (attn_forward_step): keys, values of up to cache_cap positions */
    size_t kc_cap, vc_cap;
} attn_priv;

static clg_status attn_configure(clg_layer *l, clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec)
{
    CLG_TRY(clg_layer_priv(l, err, sizeof(attn_priv)));
    attn_priv *p = l->priv;
    long heads = 0, causal = 1;
    double dropout = 0;
    int algo = 0;
    CLG_TRY(clg_layer_req_int(err, cfg, sec, "heads", 1, 1L << 16, &heads));
    CLG_TRY(clg_cfg_int(err, cfg, sec, "causal", 1, 0, 1, &causal));
    CLG_TRY(clg_cfg_float(err, cfg, sec, "dropout", 0.0, 0.0, 0.99, &dropout));
    CLG_TRY(clg_cfg_enum(err, cfg, sec, "algo", "auto", clg_attn_algo_names(), &algo));
    p->dropout = (float)dropout;
    p->heads = (int)heads;
    p->causal = (int)causal;
    p->algo = (clg_attn_algo)algo;
    return CLG_OK;
}

/* algo = auto: the fused kernels wherever they build for the head width (d
 * up to CLG_ATTN_MAX_D) and no dropout is asked for, the GEMM path
 * otherwise. A fixed rule rather than a per-run measurement, so every
 * replica and a resumed run take the same path (the two differ in
 * rounding); measured, the fused path was 1.6-2.5x faster than the GEMM
 * path at T 128 and 2x at T 512 on PoCL (docs/benchmarks.md). */
static clg_attn_algo attn_choose(const attn_priv *p)
{
    if (p->algo != CLG_ATTN_AUTO)
        return p->algo;
    return p->d <= CLG_ATTN_MAX_D && p->dropout == 0.0f ? CLG_ATTN_FUSED : CLG_ATTN_GEMM;
}

void clg_layer_attention_set_rng(clg_layer *l, uint32_t seed, uint32_t step, uint32_t sample_base)
{
    if (!l || l->ops != &clg_layer_attention_ops || !l->priv)
        return;
    attn_priv *p = l->priv;
    p->seed = seed;
    p->step = step;
    p->sample_base = sample_base;
}

static clg_status attn_setup(clg_layer *l, clg_err *err)
{
    attn_priv *p = l->priv;
    CLG_TRY(clg_layer_check_nin(l, err, 1, 1));
    const int *s = l->in_shape[0];
    if (!l->in_seq[0] || s[3] != 1)
        return clg_err_set(err, CLG_ERR_SHAPE,
                           "[attention] needs a sequence input (N, T, C) (e.g. from [embedding]); got (%d, %d, %d, %d)",
                           s[0], s[1], s[2], s[3]);
    p->T = s[1];
    p->C = s[2];
    if (p->C % p->heads != 0)
        return clg_err_set(err, CLG_ERR_SHAPE, "[attention] heads = %d does not divide the width C = %d", p->heads,
                           p->C);
    p->d = p->C / p->heads;
    if (p->algo == CLG_ATTN_FUSED && p->d > CLG_ATTN_MAX_D)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "[attention] algo = fused: head width %d (C / heads) is over the fused kernels' %d", p->d,
                           CLG_ATTN_MAX_D);
    if ((long long)3 * p->C * p->C > (1LL << 30))
        return clg_err_set(err, CLG_ERR_SHAPE, "[attention] width %d is too large", p->C);
    p->run = attn_choose(p);
    for (int d = 0; d < 4; d++)
        l->out_shape[d] = s[d];
    l->out_seq = 1;
    l->nparams = 0;
    clg_layer_param_def(l, 0, "qkv_weight", 1, 2, 3 * p->C, p->C, 0, 0);
    clg_layer_param_def(l, 1, "qkv_bias", 1, 1, 3 * p->C, 0, 0, 0);
    clg_layer_param_def(l, 2, "out_weight", 1, 2, p->C, p->C, 0, 0);
    clg_layer_param_def(l, 3, "out_bias", 1, 1, p->C, 0, 0, 0);
    double rows = (double)s[0] * p->T;
    /* projections 2 * rows * 4C * C; scores and P V 2 * 2 * rows * T * C (halved when causal) */
    l->flops = 8.0 * rows * p->C * p->C + 4.0 * rows * p->T * p->C * (p->causal ? 0.5 : 1.0);
    return CLG_OK;
}

static clg_status attn_init(clg_layer *l, clg_device *dev, clg_rng *rng)
{
    attn_priv *p = l->priv;
    CLG_TRY(clg_layer_alloc_params(l, dev));
    /* Glorot-normal like the dense layers with a linear activation; zero biases */
    CLG_TRY(clg_layer_param_normal(dev, &l->params[0], clg_layer_init_std(CLG_ACT_LINEAR, p->C, p->C), rng));
    CLG_TRY(clg_layer_param_const(dev, &l->params[1], 0.0f));
    CLG_TRY(clg_layer_param_normal(dev, &l->params[2], clg_layer_init_std(CLG_ACT_LINEAR, p->C, p->C), rng));
    CLG_TRY(clg_layer_param_const(dev, &l->params[3], 0.0f));
    return CLG_OK;
}

/* C (M x N) = op(A) op(B) (+ bias per column), row-major, contiguous. */
static clg_status proj(clg_device *dev, int ta, int tb, int M, int N, int K, cl_mem A, size_t offA, cl_mem B,
                       size_t offB, cl_mem C, size_t offC, cl_mem bias)
{
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.ta = ta;
    g.tb = tb;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = A;
    g.offA = offA;
    g.lda = ta ? M : K;
    g.B = B;
    g.offB = offB;
    g.ldb = tb ? K : N;
    g.C = C;
    g.offC = offC;
    g.ldc = N;
    if (bias) {
        g.bias = bias;
        g.bias_mode = CLG_BIAS_COL;
    }
    return clg_gemm(dev, &g, NULL);
}

/* training: with the dropout mask of this step (element index from the
 * global sample index, as the dropout layer, so the data-parallel devices
 * draw the mask a single device would). */
static clg_attn_desc attn_desc(const attn_priv *p, int n, int training)
{
    clg_attn_desc a = {n, p->T, p->heads, p->d, p->causal, (float)(1.0 / sqrt((double)p->d)), 0, 0, 0, 0.0f, 0, 0, 0, 0};
    if (training && p->dropout > 0.0f) {
        a.dropout = p->dropout;
        a.seed = p->seed;
        a.step = p->step;
        a.base = (uint32_t)((uint64_t)p->sample_base * (uint64_t)p->heads * (uint64_t)p->T * (uint64_t)p->T);
    }
    return a;
}

static clg_status attn_forward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                               int training)
{
    attn_priv *p = l->priv;
    int n = in[0].n, M = n * p->T, C = p->C;
    clg_attn_desc a = attn_desc(p, n, training);
    p->trained = training;
    CLG_TRY(clg_layer_scratch(dev, &p->qkv, &p->qkv_cap, (size_t)M * 3 * C * sizeof(float)));
    CLG_TRY(clg_layer_scratch(dev, &p->att, &p->att_cap, (size_t)M * C * sizeof(float)));
    CLG_TRY(clg_layer_scratch(dev, &p->saved, &p->saved_cap, clg_attn_saved_floats(&a, p->run) * sizeof(float)));
    CLG_TRY(proj(dev, 0, 1, M, 3 * C, C, in[0].mem, in[0].off, l->params[0].value, 0, p->qkv, 0, l->params[1].value));
    clg_attn_seq q = {p->qkv, 0, 3 * C}, k = {p->qkv, (size_t)C, 3 * C}, v = {p->qkv, 2 * (size_t)C, 3 * C};
    clg_attn_seq o = {p->att, 0, C};
    CLG_TRY(clg_attn_forward(dev, &a, p->run, &q, &k, &v, &o, p->saved, 0));
    return proj(dev, 0, 1, M, C, C, p->att, 0, l->params[2].value, 0, out->mem, out->off, l->params[3].value);
}

/* Decoding (layer.h forward_step): the n new positions pos0 .. (n samples of
 * T = 1) append their keys and values to the cache (cap positions, ld C)
 * and attend over positions 0 .. pos0 + n - 1. */
static clg_status attn_forward_step(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, clg_tensor *out,
                                    int pos0, int cap)
{
    attn_priv *p = l->priv;
    int n = in[0].n, C = p->C;
    if (!p->causal) /* earlier positions would see later ones: their cached keys and values go stale */
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                           "attention: causal = 0 cannot generate position by position (needs causal = 1)");
    if (pos0 < 0 || pos0 + n > cap)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "attention: positions %d..%d outside the cache of %d",
                           pos0, pos0 + n - 1, cap);
    clg_attn_desc a = attn_desc(p, 1, 0);
    a.T = n;
    CLG_TRY(clg_layer_scratch(dev, &p->qkv, &p->qkv_cap, (size_t)n * 3 * C * sizeof(float)));
    CLG_TRY(clg_layer_scratch(dev, &p->att, &p->att_cap, (size_t)n * C * sizeof(float)));
    size_t esz = l->cache_half ? sizeof(cl_half) : sizeof(float); /* the cache's values: half or float */
    CLG_TRY(clg_layer_scratch(dev, &p->kc, &p->kc_cap, (size_t)cap * C * esz));
    CLG_TRY(clg_layer_scratch(dev, &p->vc, &p->vc_cap, (size_t)cap * C * esz));
    CLG_TRY(proj(dev, 0, 1, n, 3 * C, C, in[0].mem, in[0].off, l->params[0].value, 0, p->qkv, 0, l->params[1].value));
    clg_attn_seq q = {p->qkv, 0, 3 * C}, k = {p->qkv, (size_t)C, 3 * C}, v = {p->qkv, 2 * (size_t)C, 3 * C};
    clg_attn_seq kc = {p->kc, 0, C}, vc = {p->vc, 0, C}, o = {p->att, 0, C};
    CLG_TRY(clg_attn_cache_append_prec(dev, &a, l->cache_half, cap, pos0, &k, &v, &kc, &vc));
    CLG_TRY(clg_attn_forward_cached_prec(dev, &a, l->cache_half, cap, pos0, &q, &kc, &vc, &o));
    return proj(dev, 0, 1, n, C, C, p->att, 0, l->params[2].value, 0, out->mem, out->off, l->params[3].value);
}

static clg_status attn_backward_body(clg_layer *l, clg_device *dev, const clg_tensor *in, const clg_tensor *dout,
                                     clg_tensor *din, cl_mem datt, cl_mem dqkv)
{
    attn_priv *p = l->priv;
    int n = in[0].n, M = n * p->T, C = p->C;
    clg_attn_desc a = attn_desc(p, n, p->trained);
    /* output projection: dWout = dout^T att, dbout = colsum(dout), datt = dout Wout */
    CLG_TRY(proj(dev, 1, 0, C, C, M, dout->mem, dout->off, p->att, 0, l->params[2].grad, 0, NULL));
    CLG_TRY(clg_nn_colsum(dev, (size_t)M, (size_t)C, dout->mem, dout->off, l->params[3].grad, 0));
    CLG_TRY(proj(dev, 0, 0, M, C, C, dout->mem, dout->off, l->params[2].value, 0, datt, 0, NULL));
    clg_attn_seq q = {p->qkv, 0, 3 * C}, k = {p->qkv, (size_t)C, 3 * C}, v = {p->qkv, 2 * (size_t)C, 3 * C};
    clg_attn_seq o = {p->att, 0, C}, g = {datt, 0, C};
    clg_attn_seq dq = {dqkv, 0, 3 * C}, dk = {dqkv, (size_t)C, 3 * C}, dv = {dqkv, 2 * (size_t)C, 3 * C};
    CLG_TRY(clg_attn_backward(dev, &a, p->run, &q, &k, &v, &o, p->saved, 0, &g, &dq, &dk, &dv));
    /* input projection: dWqkv = dqkv^T x, dbqkv = colsum(dqkv), dx = dqkv Wqkv */
    CLG_TRY(proj(dev, 1, 0, 3 * C, C, M, dqkv, 0, in[0].mem, in[0].off, l->params[0].grad, 0, NULL));
    CLG_TRY(clg_nn_colsum(dev, (size_t)M, (size_t)3 * C, dqkv, 0, l->params[1].grad, 0));
    if (din[0].mem)
        CLG_TRY(proj(dev, 0, 0, M, C, 3 * C, dqkv, 0, l->params[0].value, 0, din[0].mem, din[0].off, NULL));
    return CLG_OK;
}

static clg_status attn_backward(clg_layer *l, clg_device *dev, const clg_tensor *in, int nin, const clg_tensor *out,
                                const clg_tensor *dout, clg_tensor *din)
{
    attn_priv *p = l->priv;
    size_t M = (size_t)in[0].n * p->T;
    cl_mem datt = NULL, dqkv = NULL;
    CLG_TRY(clg_buf_alloc(dev, M * p->C * sizeof(float), &datt));
    clg_status st = clg_buf_alloc(dev, M * 3 * p->C * sizeof(float), &dqkv);
    if (st == CLG_OK)
        st = attn_backward_body(l, dev, in, dout, din, datt, dqkv);
    clg_buf_release(dev, datt);
    clg_buf_release(dev, dqkv);
    return st;
}

static void attn_destroy(clg_layer *l, clg_device *dev)
{
    attn_priv *p = l->priv;
    if (p && dev) {
        clg_buf_release(dev, p->qkv);
        clg_buf_release(dev, p->att);
        clg_buf_release(dev, p->saved);
        clg_buf_release(dev, p->kc);
        clg_buf_release(dev, p->vc);
    }
    free(p);
    l->priv = NULL;
}

const clg_layer_ops clg_layer_attention_ops = {
    .type = "attention",
    .configure = attn_configure,
    .setup = attn_setup,
    .init = attn_init,
    .forward = attn_forward,
    .backward = attn_backward,
    .forward_step = attn_forward_step,
    .destroy = attn_destroy,
};
