/* Layer registry and helpers shared by the layer modules. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"

typedef struct {
    const char *name;
    const clg_layer_ops *ops;
} layer_entry;

static const layer_entry registry[] = {
    {"convolutional", &clg_layer_conv_ops},
    {"conv", &clg_layer_conv_ops},
    {"dense", &clg_layer_dense_ops},
    {"connected", &clg_layer_dense_ops},
    {"maxpool", &clg_layer_maxpool_ops},
    {"avgpool", &clg_layer_avgpool_ops},
    {"gap", &clg_layer_gap_ops},
    {"activation", &clg_layer_activation_ops},
    {"batchnorm", &clg_layer_batchnorm_ops},
    {"dropout", &clg_layer_dropout_ops},
    {"flatten", &clg_layer_flatten_ops},
    {"add", &clg_layer_add_ops},
    {"concat", &clg_layer_concat_ops},
    {"softmax", &clg_layer_softmax_ops},
    {"mse", &clg_layer_mse_ops},
    {"embedding", &clg_layer_embedding_ops},
    {"posembed", &clg_layer_posembed_ops},
    {"layernorm", &clg_layer_layernorm_ops},
    {"attention", &clg_layer_attention_ops},
};

static const char *const type_names[] = {"convolutional", "conv",    "dense",   "connected", "maxpool",
                                         "avgpool",       "gap",     "activation", "batchnorm", "dropout",
                                         "flatten",       "add",     "concat",  "softmax",   "mse",
                                         "embedding",     "posembed", "layernorm", "attention",
                                         NULL};

const clg_layer_ops *clg_layer_lookup(const char *type)
{
    if (!type)
        return NULL;
    for (size_t i = 0; i < CLG_ARRAY_LEN(registry); i++)
        if (strcmp(registry[i].name, type) == 0)
            return registry[i].ops;
    return NULL;
}

const char *const *clg_layer_type_names(void) { return type_names; }

/* ---- helpers ---- */

void clg_layer_param_def(clg_layer *l, int idx, const char *name, int trainable, int ndim, int d0, int d1, int d2,
                         int d3)
{
    clg_param *p = &l->params[idx];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->trainable = trainable;
    p->ndim = ndim;
    int d[4] = {d0, d1, d2, d3};
    p->numel = 1;
    for (int i = 0; i < 4; i++) {
        p->shape[i] = i < ndim ? d[i] : 0;
        if (i < ndim)
            p->numel *= (size_t)d[i];
    }
    if (idx + 1 > l->nparams)
        l->nparams = idx + 1;
}

clg_status clg_layer_alloc_params(clg_layer *l, clg_device *dev)
{
    for (int i = 0; i < l->nparams && !l->draw_only; i++) {
        clg_param *p = &l->params[i];
        size_t bytes = p->numel * sizeof(float);
        if (!p->value)
            CLG_TRY(clg_buf_alloc(dev, bytes, &p->value));
        if (p->trainable && !p->grad) {
            CLG_TRY(clg_buf_alloc(dev, bytes, &p->grad));
            CLG_TRY(clg_buf_fill(dev, p->grad, 0, p->numel, 0.0f));
        }
    }
    return CLG_OK;
}

clg_status clg_layer_param_upload(clg_device *dev, clg_param *p, const float *host)
{
    CLG_CL_CHECK(clg_dev_err(dev), clEnqueueWriteBuffer(dev->queue, p->value, CL_TRUE, 0, p->numel * sizeof(float),
                                                        host, 0, NULL, NULL));
    return CLG_OK;
}

clg_status clg_layer_param_normal(clg_device *dev, clg_param *p, double std, clg_rng *rng)
{
    float *h = malloc(CLG_MAX(p->numel, 1) * sizeof(float));
    if (!h)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "out of host memory initialising '%s' (%zu floats)",
                           p->name, p->numel);
    for (size_t i = 0; i < p->numel; i++)
        h[i] = (float)(std * clg_rng_normal(rng));
    clg_status st = p->value ? clg_layer_param_upload(dev, p, h) : CLG_OK; /* none: drawn only (draw_only) */
    free(h);
    return st;
}

clg_status clg_layer_param_const(clg_device *dev, clg_param *p, float v)
{
    if (!p->value) /* draw_only */
        return CLG_OK;
    return clg_buf_fill(dev, p->value, 0, p->numel, v);
}

double clg_layer_init_std(clg_act act, int fan_in, int fan_out)
{
    if (act == CLG_ACT_RELU || act == CLG_ACT_LEAKY || clg_act_needs_x(act))
        return sqrt(2.0 / CLG_MAX(fan_in, 1));
    return sqrt(2.0 / CLG_MAX(fan_in + fan_out, 1));
}

clg_status clg_layer_read_act(clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec, const char *key,
                              const char *def, int allow_linear, clg_act *act, float *alpha)
{
    static const char *const no_linear[] = {"relu", "leaky", "sigmoid", "tanh", "gelu", "gelu_tanh", NULL};
    int idx = 0;
    if (allow_linear) {
        CLG_TRY(clg_cfg_enum(err, cfg, sec, key, def, clg_act_names(), &idx));
        *act = (clg_act)idx;
    } else {
        CLG_TRY(clg_cfg_enum(err, cfg, sec, key, def, no_linear, &idx));
        *act = (clg_act)(idx + 1);
    }
    double a = 0.01;
    CLG_TRY(clg_cfg_float(err, cfg, sec, "alpha", 0.01, 0.0, 1.0, &a));
    *alpha = (float)a;
    return CLG_OK;
}

clg_status clg_layer_req_int(clg_err *err, const clg_cfg *cfg, clg_cfg_section *sec, const char *key, long lo,
                             long hi, long *out)
{
    if (!clg_cfg_find(sec, key))
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [%s] is missing the required key '%s' (an integer in [%ld, %ld])",
                           cfg && cfg->source_name ? cfg->source_name : "<cfg>", sec->line, sec->name, key, lo, hi);
    return clg_cfg_int(err, cfg, sec, key, lo, lo, hi, out);
}

clg_status clg_layer_scratch(clg_device *dev, cl_mem *m, size_t *cap, size_t bytes)
{
    if (*m && *cap >= bytes)
        return CLG_OK;
    clg_buf_release(dev, *m);
    *m = NULL;
    *cap = 0;
    CLG_TRY(clg_buf_alloc(dev, bytes ? bytes : 4, m));
    *cap = bytes;
    return CLG_OK;
}

clg_status clg_layer_check_nin(clg_layer *l, clg_err *err, int lo, int hi)
{
    if (l->nin < lo || l->nin > hi) {
        if (lo == hi)
            return clg_err_set(err, CLG_ERR_SHAPE, "%s takes %d input%s, got %d", l->ops->type, lo, lo == 1 ? "" : "s",
                               l->nin);
        return clg_err_set(err, CLG_ERR_SHAPE, "%s takes %d to %d inputs, got %d", l->ops->type, lo, hi, l->nin);
    }
    for (int i = 0; i < l->nin; i++)
        for (int d = 0; d < 4; d++)
            if (l->in_shape[i][d] <= 0)
                return clg_err_set(err, CLG_ERR_SHAPE, "input %d has an empty shape %dx%dx%dx%d", i,
                                   l->in_shape[i][0], l->in_shape[i][1], l->in_shape[i][2], l->in_shape[i][3]);
    return CLG_OK;
}

clg_status clg_layer_setup_pointwise(clg_layer *l, clg_err *err)
{
    CLG_TRY(clg_layer_check_nin(l, err, 1, 1));
    for (int d = 0; d < 4; d++)
        l->out_shape[d] = l->in_shape[0][d];
    l->out_seq = l->in_seq[0];
    l->nparams = 0;
    l->flops = (double)l->in_shape[0][0] * l->in_shape[0][1] * l->in_shape[0][2] * l->in_shape[0][3];
    return CLG_OK;
}

clg_status clg_layer_priv(clg_layer *l, clg_err *err, size_t bytes)
{
    free(l->priv);
    l->priv = calloc(1, bytes);
    if (!l->priv)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of host memory");
    return CLG_OK;
}

/* ---- tests ---- */

clg_status clg_layer_create_for_test(clg_err *err, const char *type, const char *keys, int nin,
                                     const int (*in_shape)[4], clg_layer *l)
{
    return clg_layer_create_for_test_seq(err, type, keys, nin, in_shape, 0, l);
}

clg_status clg_layer_create_for_test_seq(clg_err *err, const char *type, const char *keys, int nin,
                                         const int (*in_shape)[4], unsigned seq_mask, clg_layer *l)
{
    memset(l, 0, sizeof *l);
    l->ops = clg_layer_lookup(type);
    if (!l->ops)
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "unknown layer type '%s'", type);
    if (nin < 0 || nin > CLG_MAX_INPUTS)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%d inputs (max %d)", nin, CLG_MAX_INPUTS);
    /* "[type]\nk=v\n..." */
    size_t cap = strlen(type) + 4 + 2 * strlen(keys ? keys : "") + 8;
    char *text = malloc(cap);
    if (!text)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of host memory");
    size_t n = (size_t)snprintf(text, cap, "[%s]\n", type);
    for (const char *p = keys ? keys : ""; *p; p++)
        text[n++] = (*p == ' ' || *p == '\t') ? '\n' : *p;
    text[n++] = '\n';
    text[n] = 0;
    clg_cfg *cfg = NULL;
    clg_status st = clg_cfg_parse(err, text, "<test>", &cfg);
    free(text);
    if (st != CLG_OK)
        return st;
    snprintf(l->name, sizeof l->name, "%s0", type);
    l->line = 1;
    l->nin = nin;
    for (int i = 0; i < nin; i++) {
        l->inputs[i] = i - 1;
        memcpy(l->in_shape[i], in_shape[i], sizeof l->in_shape[i]);
        l->in_seq[i] = (seq_mask >> i) & 1;
    }
    st = l->ops->configure(l, err, cfg, &cfg->sec[0]);
    if (st == CLG_OK)
        st = clg_cfg_check_unused(err, cfg, &cfg->sec[0]);
    if (st == CLG_OK)
        st = l->ops->setup(l, err);
    clg_cfg_free(cfg);
    return st;
}

void clg_layer_free(clg_layer *l, clg_device *dev)
{
    if (!l->ops)
        return;
    if (l->ops->destroy)
        l->ops->destroy(l, dev);
    else
        free(l->priv);
    l->priv = NULL;
    if (dev) {
        for (int i = 0; i < l->nparams; i++) {
            clg_buf_release(dev, l->params[i].value);
            clg_buf_release(dev, l->params[i].grad);
            l->params[i].value = l->params[i].grad = NULL;
        }
    }
}
