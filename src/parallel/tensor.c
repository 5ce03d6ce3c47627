/* Tensor parallelism: split dense pairs over T lanes (see tensor.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "parallel/tensor.h"

clg_status clg_tp_parse_layout(clg_err *err, const char *spec, int *tp, char *rest, size_t cap)
{
    *tp = 1;
    if (cap)
        rest[0] = 0;
    size_t used = 0;
    for (const char *s = spec; s && *s;) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len > 3 && !strncmp(s, "tp=", 3)) {
            char num[16];
            char *end = NULL;
            snprintf(num, sizeof num, "%.*s", (int)CLG_MIN(len - 3, sizeof num - 1), s + 3);
            long v = strtol(num, &end, 10);
            if (num[0] < '0' || num[0] > '9' || *end || v < 1 || v > CLG_TP_MAX || len - 3 >= sizeof num)
                return clg_err_set(err, CLG_ERR_INVALID_ARG,
                                   "parallel layout '%s': tp=T takes a whole number of devices from 1 to %d", spec,
                                   CLG_TP_MAX);
            *tp = (int)v;
        } else {
            if (used + len + 2 > cap)
                return clg_err_set(err, CLG_ERR_INVALID_ARG, "parallel layout '%s': too long", spec);
            used += (size_t)snprintf(rest + used, cap - used, "%s%.*s", used ? "," : "", (int)len, s);
        }
        s = e ? e + 1 : s + len;
    }
    return CLG_OK;
}

// ---- the split layers ----

static const char *cfg_value(const clg_net *net, int layer, const char *key)
{
    const clg_cfg_kv *kv = clg_cfg_find(&net->cfg->sec[layer + 1], key);
    return kv ? kv->value : NULL;
}

static int is_dense(const clg_net *net, int i)
{
    const clg_layer *l = &net->proto[i];
    return l->ops == &clg_layer_dense_ops && !l->in_seq[0] && !cfg_value(net, i, "tie");
}

static int is_eltwise(const clg_layer *l)
{
    return (l->ops == &clg_layer_activation_ops || l->ops == &clg_layer_dropout_ops) && l->nin == 1;
}

/* The only layer reading layer i's output, -1 when none or several. */
static int sole_consumer(const clg_net *net, int i)
{
    int c = -1, k = 0;
    for (int j = 0; j < net->nlayers; j++)
        for (int q = 0; q < net->proto[j].nin; q++)
            if (net->proto[j].inputs[q] == i) {
                c = j;
                k++;
            }
    return k == 1 ? c : -1;
}

/* Pair starting at dense a: the row-split dense it feeds through element-wise layers, -1 when none. */
static int pair_end(const clg_net *net, int a)
{
    int src = net->proto[a].inputs[0];
    if (src >= 0 && sole_consumer(net, src) != a)
        return -1;
    for (int i = sole_consumer(net, a); i >= 0; i = sole_consumer(net, i)) {
        const clg_layer *l = &net->proto[i];
        if (is_dense(net, i)) {
            const char *act = cfg_value(net, i, "activation");
            return !act || !strcmp(act, "linear") ? i : -1;
        }
        if (!is_eltwise(l) || l->is_loss)
            return -1;
    }
    return -1;
}

static clg_status find_pairs(clg_err *err, const clg_net *net, int T, int *role, int *npairs)
{
    *npairs = 0;
    for (int i = 0; i < net->nlayers; i++)
        role[i] = CLG_TP_REPL;
    for (int a = 0; a < net->nlayers; a++) {
        if (!is_dense(net, a))
            continue;
        int b = pair_end(net, a);
        if (b < 0)
            continue;
        int units = net->proto[a].out_shape[1];
        if (units % T)
            return clg_err_set(err, CLG_ERR_INVALID_ARG,
                               "tp=%d: layer '%s' (%s:%d) has %d units, which %d devices cannot split evenly (its "
                               "width must be a multiple of tp)",
                               T, net->proto[a].name, net->source, net->proto[a].line, units, T);
        role[a] = CLG_TP_COL;
        role[b] = CLG_TP_ROW;
        for (int i = sole_consumer(net, a); i != b; i = sole_consumer(net, i))
            role[i] = CLG_TP_MID;
        (*npairs)++;
        a = b;
    }
    if (!*npairs)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "tp=%d: %s has no layer tensor parallelism can split (a [dense] followed, through "
                           "[activation] or [dropout] layers only, by a [dense] with a linear activation)",
                           T, net->source);
    return CLG_OK;
}

/* The model text with every column-split layer's units divided by T (its `units` line rewritten). */
static char *lane_text(const clg_net *net, const int *role, int T)
{
    size_t len = strlen(net->text);
    char *out = malloc(len + 64 * (size_t)net->nlayers + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    int line = 1;
    for (const char *s = net->text; *s;) {
        const char *e = strchr(s, '\n');
        size_t n = e ? (size_t)(e - s) + 1 : strlen(s);
        int rewritten = 0;
        for (int i = 0; i < net->nlayers && !rewritten; i++) {
            const clg_cfg_kv *kv = clg_cfg_find(&net->cfg->sec[i + 1], "units");
            if (role[i] == CLG_TP_COL && kv && kv->line == line) {
                o += (size_t)sprintf(out + o, "units = %d\n", net->proto[i].out_shape[1] / T);
                rewritten = 1;
            }
        }
        if (!rewritten) {
            memcpy(out + o, s, n);
            o += n;
        }
        s += n;
        line++;
    }
    out[o] = 0;
    return out;
}

// ---- parameters between the whole network and the lanes ----

/* What part of a whole parameter lane t holds: rows [r0, r0 + rows) x columns [c0, c0 + cols) of a (R, C)
 * matrix (a vector: R = 1). zero: none (the row-split bias on lanes > 0: zero there). */
typedef struct slice {
    size_t R, C, r0, rows, c0, cols;
    int zero;
} slice;

static slice slice_of(const clg_tp *p, const clg_param_ref *ref, int t)
{
    const clg_param *q = ref->param;
    slice s = {1, q->numel, 0, 1, 0, q->numel, 0};
    int role = p->role[ref->layer->index], bias = !strcmp(q->name, "bias");
    if (role == CLG_TP_COL) { /* weight (units, in) and bias (units): a block of rows */
        size_t units = (size_t)p->net->proto[ref->layer->index].out_shape[1];
        s.R = units;
        s.C = q->numel / units;
        s.rows = units / p->T;
        s.r0 = s.rows * t;
        s.cols = s.C;
    } else if (role == CLG_TP_ROW && !bias) { /* weight (units, in): a block of columns */
        s.R = (size_t)q->shape[0];
        s.C = q->numel / s.R;
        s.rows = s.R;
        s.cols = s.C / p->T;
        s.c0 = s.cols * t;
    } else if (role == CLG_TP_ROW && bias) {
        s.zero = t > 0;
    }
    return s;
}

/* whole <-> part (rows x cols floats) by s. */
static void slice_copy(const slice *s, float *whole, float *part, int to_whole)
{
    for (size_t r = 0; r < s->rows; r++) {
        float *w = whole + (s->r0 + r) * s->C + s->c0, *q = part + r * s->cols;
        if (to_whole)
            memcpy(w, q, s->cols * sizeof(float));
        else if (s->zero)
            memset(q, 0, s->cols * sizeof(float));
        else
            memcpy(q, w, s->cols * sizeof(float));
    }
}

static int optim_index(const clg_optim *o, int layer, int slot)
{
    for (int i = 0; o && i < o->n; i++)
        if (o->refs[i].layer->index == layer && o->refs[i].param - o->refs[i].layer->params == slot)
            return i;
    return -1;
}

/* The k-th buffer of ref's parameter in replica r (0 value, 1 and 2 optimizer state of o); NULL when none. */
static cl_mem param_buf(clg_replica *r, clg_optim *o, const clg_param_ref *ref, int k)
{
    int li = ref->layer->index, slot = (int)(ref->param - ref->layer->params);
    if (k == 0)
        return r->layers[li].params[slot].value;
    int i = optim_index(o, li, slot);
    if (i < 0 || k > clg_optim_nstate(o))
        return NULL;
    return k == 1 ? o->m[i] : o->v[i];
}

static clg_status sync_buf(clg_tp *p, clg_replica *full, clg_optim *fo, const clg_param_ref *ref, int k,
                           int to_full, float *whole, float *part)
{
    cl_mem fm = param_buf(full, fo, ref, k);
    size_t n = ref->param->numel;
    if (!fm)
        return CLG_OK;
    clg_err *ferr = clg_dev_err(full->dev);
    if (!to_full)
        CLG_CL_CHECK(ferr, clEnqueueReadBuffer(full->dev->queue, fm, CL_TRUE, 0, n * sizeof(float), whole, 0, NULL,
                                               NULL));
    for (int t = 0; t < p->T; t++) {
        clg_tp_lane *ln = &p->ln[t];
        cl_mem lm = param_buf(ln->rep, ln->opt, ref, k);
        slice s = slice_of(p, ref, t);
        size_t pn = s.rows * s.cols;
        clg_err *lerr = clg_dev_err(ln->dev);
        if (!lm || (to_full && s.zero))
            continue;
        if (to_full && p->role[ref->layer->index] == CLG_TP_REPL && t > 0)
            break; /* replicated: lane 0's */
        if (to_full) {
            CLG_CL_CHECK(lerr, clEnqueueReadBuffer(ln->dev->queue, lm, CL_TRUE, 0, pn * sizeof(float), part, 0, NULL,
                                                   NULL));
            slice_copy(&s, whole, part, 1);
        } else {
            slice_copy(&s, whole, part, 0);
            CLG_CL_CHECK(lerr, clEnqueueWriteBuffer(ln->dev->queue, lm, CL_TRUE, 0, pn * sizeof(float), part, 0,
                                                    NULL, NULL));
        }
    }
    if (to_full)
        CLG_CL_CHECK(ferr, clEnqueueWriteBuffer(full->dev->queue, fm, CL_TRUE, 0, n * sizeof(float), whole, 0, NULL,
                                                NULL));
    return CLG_OK;
}

static clg_status ensure_optim(clg_tp *p, const clg_hparams *hp)
{
    for (int t = 0; t < p->T; t++)
        if (!p->ln[t].opt)
            CLG_TRY(clg_optim_create(p->ln[t].rep, hp, &p->ln[t].opt));
    return CLG_OK;
}

clg_status clg_tp_sync(clg_tp *p, clg_replica *full, clg_optim *full_opt, const clg_hparams *hp, int to_full)
{
    if (full_opt)
        CLG_TRY(ensure_optim(p, hp));
    clg_param_ref *refs = NULL;
    int n = 0;
    CLG_TRY(clg_replica_params(full, 0, &refs, &n));
    size_t most = 1;
    for (int i = 0; i < n; i++)
        most = CLG_MAX(most, refs[i].param->numel);
    float *whole = malloc(most * sizeof(float)), *part = malloc(most * sizeof(float));
    clg_status st = whole && part ? CLG_OK : clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    for (int i = 0; i < n && st == CLG_OK; i++)
        for (int k = 0; k < (full_opt && refs[i].param->trainable ? 3 : 1) && st == CLG_OK; k++)
            st = sync_buf(p, full, full_opt, &refs[i], k, to_full, whole, part);
    free(whole);
    free(part);
    free(refs);
    if (st == CLG_OK && full_opt && to_full)
        full_opt->t = p->ln[0].opt->t;
    for (int t = 0; t < p->T && st == CLG_OK && full_opt && !to_full; t++)
        p->ln[t].opt->t = full_opt->t;
    if (st == CLG_OK && to_full)
        st = clg_replica_weights_updated(full);
    for (int t = 0; t < p->T && st == CLG_OK && !to_full; t++)
        st = clg_replica_weights_updated(p->ln[t].rep);
    return st;
}

// ---- the all-reduce ----

/* Every lane waits for the others; CLG_ERR_INTERNAL when a lane failed (the step is abandoned). */
static clg_status barrier(clg_tp *p, int t)
{
    pthread_mutex_lock(&p->mu);
    int64_t gen = p->bgen;
    if (!p->abort && ++p->bcount == p->T) {
        p->bcount = 0;
        p->bgen++;
        pthread_cond_broadcast(&p->cv);
    }
    while (!p->abort && gen == p->bgen)
        pthread_cond_wait(&p->cv, &p->mu);
    int ab = p->abort;
    pthread_mutex_unlock(&p->mu);
    if (ab)
        return clg_err_set(clg_dev_err(p->ln[t].dev), CLG_ERR_INTERNAL, "tensor-parallel step abandoned: another "
                                                                        "device failed");
    return CLG_OK;
}

/* mem[off .. off + count) := its sum over the lanes (lane order, the same bits on every lane). */
static clg_status all_reduce(clg_tp *p, int t, cl_mem mem, size_t off, size_t count)
{
    clg_tp_lane *ln = &p->ln[t];
    clg_err *err = clg_dev_err(ln->dev);
    if (count > p->red_cap)
        return clg_err_set(err, CLG_ERR_INTERNAL, "tensor parallel: %zu floats to reduce, room for %zu", count,
                           p->red_cap);
    float *mine = p->red + (size_t)t * p->red_cap, *sum = p->red + (size_t)p->T * p->red_cap;
    CLG_CL_CHECK(err, clEnqueueReadBuffer(ln->dev->queue, mem, CL_TRUE, off * sizeof(float), count * sizeof(float),
                                          mine, 0, NULL, NULL));
    CLG_TRY(barrier(p, t));
    size_t k0 = count * (size_t)t / (size_t)p->T, k1 = count * (size_t)(t + 1) / (size_t)p->T;
    for (size_t k = k0; k < k1; k++) {
        float s = p->red[k];
        for (int u = 1; u < p->T; u++)
            s += p->red[(size_t)u * p->red_cap + k];
        sum[k] = s;
    }
    CLG_TRY(barrier(p, t));
    CLG_CL_CHECK(err, clEnqueueWriteBuffer(ln->dev->queue, mem, CL_TRUE, off * sizeof(float), count * sizeof(float),
                                           sum, 0, NULL, NULL));
    return CLG_OK;
}

/* After layer i's forward (backward = 0) or backward was enqueued on lane t: the row-split layer's partial
 * outputs summed; the column-split layer's partial input gradient summed. */
static clg_status after_layer(void *user, int i, int backward)
{
    struct clg_tp_hook *h = user;
    clg_tp *p = h->p;
    clg_replica *r = p->ln[h->t].rep;
    if (!backward && p->role[i] == CLG_TP_ROW && h->t == p->fault_lane && (int64_t)p->step == p->fault_step)
        return clg_err_set(clg_dev_err(p->ln[h->t].dev), CLG_ERR_OPENCL, "injected fault after %s's forward",
                           p->net->proto[i].name);
    if (!backward && p->role[i] == CLG_TP_ROW)
        return all_reduce(p, h->t, r->act[i].mem, r->act[i].off, (size_t)p->n * (clg_tensor_numel(&r->act[i]) /
                                                                                 (size_t)r->act[i].n));
    int src = r->layers[i].inputs[0];
    if (backward && p->role[i] == CLG_TP_COL && src >= 0)
        return all_reduce(p, h->t, r->dact[src].mem, r->dact[src].off,
                          (size_t)p->n * (clg_tensor_numel(&r->dact[src]) / (size_t)r->dact[src].n));
    return CLG_OK;
}

/* The row-split biases' gradients of lane t > 0 zeroed (those biases are zero and stay zero). */
static clg_status zero_bias_grads(clg_tp *p, int t)
{
    clg_tp_lane *ln = &p->ln[t];
    for (int i = 0; i < p->net->nlayers && t > 0; i++) {
        clg_layer *l = &ln->rep->layers[i];
        for (int k = 0; k < l->nparams && p->role[i] == CLG_TP_ROW; k++) {
            if (strcmp(l->params[k].name, "bias") || !l->params[k].grad)
                continue;
            float zero = 0;
            CLG_CL_CHECK(clg_dev_err(ln->dev), clEnqueueFillBuffer(ln->dev->queue, l->params[k].grad, &zero,
                                                                   sizeof zero, 0, l->params[k].numel * sizeof(float),
                                                                   0, NULL, NULL));
        }
    }
    return CLG_OK;
}

static clg_status lane_step(clg_tp *p, int t, float *res)
{
    clg_tp_lane *ln = &p->ln[t];
    clg_err *err = clg_dev_err(ln->dev);
    clg_replica *r = ln->rep;
    cl_command_queue q = ln->dev->queue;
    int lps = clg_net_labels_per_sample(p->net);
    CLG_CL_CHECK(err, clEnqueueWriteBuffer(q, ln->xbuf, CL_FALSE, 0, (size_t)p->n * p->sample * sizeof(float), p->x, 0,
                                           NULL, NULL));
    CLG_CL_CHECK(err, clEnqueueWriteBuffer(q, ln->ybuf, CL_FALSE, 0, (size_t)p->n * lps * sizeof(int32_t), p->y, 0,
                                           NULL, NULL));
    clg_replica_set_input(r, ln->xbuf, 0);
    clg_replica_set_labels(r, ln->ybuf, 0, p->grad_scale);
    for (int i = 0; i < r->nlayers; i++) {
        clg_layer *l = &r->layers[i];
        clg_layer_set_rng(l, p->seed, p->step, 0);
        if (p->role[i] == CLG_TP_MID && l->ops == &clg_layer_dropout_ops) /* the mask of the whole layer's slice */
            clg_layer_set_rng_slice(l, (uint32_t)p->net->proto[i].out_shape[1], (uint32_t)(l->out_shape[1] * t));
    }
    CLG_TRY(clg_replica_forward(r, p->n, 1));
    CLG_TRY(clg_replica_backward(r, p->n));
    CLG_TRY(zero_bias_grads(p, t));
    if (res)
        CLG_CL_CHECK(err, clEnqueueReadBuffer(q, r->layers[r->loss_index].loss.result, CL_TRUE, 0, 2 * sizeof(float),
                                              res, 0, NULL, NULL));
    CLG_CL_CHECK(err, clFinish(q));
    return CLG_OK;
}

static clg_status lane_fn(void *arg, int t)
{
    clg_tp *p = arg;
    clg_tp_lane *ln = &p->ln[t];
    clg_status rc;
    if (p->phase == 1) {
        rc = clg_optim_step(ln->opt, p->lr, 1.0f);
        if (rc == CLG_OK && clFinish(ln->dev->queue) != CL_SUCCESS)
            rc = clg_err_set(clg_dev_err(ln->dev), CLG_ERR_OPENCL, "clFinish after the optimizer failed");
        return rc;
    }
    rc = lane_step(p, t, t == 0 ? p->res : NULL);
    if (rc != CLG_OK) {
        pthread_mutex_lock(&p->mu);
        if (!p->abort) {
            p->abort = 1;
            p->fail_lane = t;
            p->fail_status = rc;
        }
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    return rc;
}

static clg_status lane_failed(clg_tp *p, int t, clg_status rc)
{
    const clg_tp_lane *ln = &p->ln[t];
    return clg_err_set(&p->ctx->err, rc,
                       "tensor-parallel lane %d on device %d (%s): %s", t, ln->dev->index, ln->dev->info.name,
                       ln->dev->err.msg);
}

clg_status clg_tp_train_step(clg_tp *p, const clg_hparams *hp, const float *x, const int32_t *y, int n, double lr,
                             float grad_scale, double clip_norm, uint32_t seed, uint32_t step, float *res)
{
    if (n < 1 || n > p->net->batch)
        return clg_err_set(&p->ctx->err, CLG_ERR_INVALID_ARG, "tensor-parallel step: %d samples (1 to %d)", n,
                           p->net->batch);
    if (clip_norm > 0)
        return clg_err_set(&p->ctx->err, CLG_ERR_UNSUPPORTED,
                           "gradient clipping (clip_norm %g) with tensor parallelism is not supported yet", clip_norm);
    CLG_TRY(ensure_optim(p, hp));
    p->x = x;
    p->y = y;
    p->n = n;
    p->lr = lr;
    p->grad_scale = grad_scale;
    p->seed = seed;
    p->step = step;
    p->abort = 0;
    p->bcount = 0;
    p->fail_lane = -1;
    float r2[2] = {0, 0};
    p->res = r2;
    p->phase = 0;
    int failed = -1;
    clg_status rc = clg_team_run(p->team, lane_fn, p, &failed);
    if (rc != CLG_OK)
        return p->fail_lane >= 0 ? lane_failed(p, p->fail_lane, p->fail_status) : lane_failed(p, failed, rc);
    p->phase = 1;
    rc = clg_team_run(p->team, lane_fn, p, &failed);
    if (rc != CLG_OK)
        return lane_failed(p, failed, rc);
    if (res)
        memcpy(res, r2, sizeof r2);
    return CLG_OK;
}

// ---- creation ----

static clg_status lane_init(clg_tp *p, int t, clg_device *dev, const char *text)
{
    clg_tp_lane *ln = &p->ln[t];
    clg_err *err = &p->ctx->err;
    ln->dev = dev;
    CLG_TRY(clg_net_build(err, text, p->net->source, p->net->batch, &ln->net));
    for (int i = 0; i < p->net->nlayers; i++) {
        const int *a = ln->net->proto[i].out_shape, *b = p->net->proto[i].out_shape;
        int want = p->role[i] == CLG_TP_COL || p->role[i] == CLG_TP_MID ? b[1] / p->T : b[1];
        if (a[1] != want)
            return clg_err_set(err, CLG_ERR_INTERNAL, "tensor parallel: layer '%s' of the split model has %d "
                                                      "outputs, expected %d", p->net->proto[i].name, a[1], want);
        size_t w = clg_tensor_numel(&(clg_tensor){.n = p->net->batch, .c = a[1], .h = a[2], .w = a[3]});
        if (p->role[i] == CLG_TP_ROW)
            p->red_cap = CLG_MAX(p->red_cap, w);
        int src = p->net->proto[i].inputs[0];
        if (p->role[i] == CLG_TP_COL && src >= 0) {
            const int *s = ln->net->proto[src].out_shape;
            p->red_cap = CLG_MAX(p->red_cap, (size_t)p->net->batch * s[1] * s[2] * s[3]);
        }
    }
    CLG_TRY(clg_replica_create(ln->net, dev, 0, &ln->rep));
    ln->rep->after_layer = after_layer;
    p->hook[t].p = p;
    p->hook[t].t = t;
    ln->rep->after_layer_user = &p->hook[t];
    int lps = clg_net_labels_per_sample(p->net);
    CLG_TRY(clg_buf_alloc(dev, (size_t)p->net->batch * p->sample * sizeof(float), &ln->xbuf));
    CLG_TRY(clg_buf_alloc(dev, (size_t)p->net->batch * lps * sizeof(int32_t), &ln->ybuf));
    return CLG_OK;
}

clg_status clg_tp_create(clg_ctx *ctx, clg_net *net, const int *devs, int ndev, int T, clg_replica *full,
                         clg_tp **out)
{
    *out = NULL;
    if (T < 2 || T > CLG_TP_MAX)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "tp=%d: 2 to %d devices", T, CLG_TP_MAX);
    if (ndev != T)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG,
                           "tp=%d needs %d devices, %d selected (dp x pp x tp must equal the device count)", T, T,
                           ndev);
    if (net->fp16)
        return clg_err_set(&ctx->err, CLG_ERR_UNSUPPORTED, "tensor parallelism with fp16 storage is not supported yet");
    if (net->loss_index != net->nlayers - 1)
        return clg_err_set(&ctx->err, CLG_ERR_UNSUPPORTED, "tensor parallelism needs a model whose last layer is its "
                                                           "loss");
    clg_tp *p = calloc(1, sizeof *p);
    if (!p || !(p->role = calloc((size_t)net->nlayers, sizeof(int)))) {
        free(p);
        return clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->ctx = ctx;
    p->net = net;
    p->T = T;
    p->fault_lane = -1;
    p->sample = (size_t)net->in_c * net->in_h * net->in_w;
    clg_status st = find_pairs(&ctx->err, net, T, p->role, &p->npairs);
    char *text = st == CLG_OK ? lane_text(net, p->role, T) : NULL;
    if (st == CLG_OK && !text)
        st = clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    for (int t = 0; t < T && st == CLG_OK; t++)
        st = lane_init(p, t, &ctx->devs[devs[t]], text);
    free(text);
    if (st == CLG_OK && !(p->red = malloc(((size_t)T + 1) * CLG_MAX(p->red_cap, 1) * sizeof(float))))
        st = clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of memory for the tensor-parallel reduction");
    if (st == CLG_OK)
        st = clg_team_create(&ctx->err, T, &p->team);
    if (st == CLG_OK)
        st = clg_tp_sync(p, full, NULL, NULL, 0);
    if (st != CLG_OK) {
        clg_tp_free(p);
        return st;
    }
    *out = p;
    return CLG_OK;
}

void clg_tp_free(clg_tp *p)
{
    if (!p)
        return;
    clg_team_free(p->team);
    for (int t = 0; t < p->T; t++) {
        clg_tp_lane *ln = &p->ln[t];
        if (ln->dev) {
            clFinish(ln->dev->queue);
            clg_buf_release(ln->dev, ln->xbuf);
            clg_buf_release(ln->dev, ln->ybuf);
        }
        clg_optim_free(ln->opt);
        clg_replica_free(ln->rep);
        clg_net_free(ln->net);
    }
    free(p->red);
    free(p->role);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

void clg_tp_print(const clg_tp *p, FILE *f)
{
    fprintf(f, "tensor parallel: tp=%d over", p->T);
    for (int t = 0; t < p->T; t++)
        fprintf(f, "%s device %d (%s)", t ? "," : "", p->ln[t].dev->index, p->ln[t].dev->info.name);
    fprintf(f, "; all-reduce through host memory\n");
    for (int a = 0; a < p->net->nlayers; a++) {
        if (p->role[a] != CLG_TP_COL)
            continue;
        int b = a + 1;
        while (p->role[b] != CLG_TP_ROW)
            b++;
        fprintf(f, "  split: %s (columns: %d of %d units per device) -> %s (rows: %d of %d inputs per device)\n",
                p->net->proto[a].name, p->net->proto[a].out_shape[1] / p->T, p->net->proto[a].out_shape[1],
                p->net->proto[b].name, p->ln[0].rep->layers[b].in_shape[0][1], p->net->proto[a].out_shape[1]);
    }
    fprintf(f, "  every other layer replicated on each device\n");
}
