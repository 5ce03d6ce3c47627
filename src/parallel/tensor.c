/* Tensor parallelism: split dense pairs over T lanes (see tensor.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "ops/optim_kernels.h"
#include "parallel/comm.h"
#include "parallel/dp.h"
#include "parallel/fail.h"
#include "parallel/hybrid.h"
#include "parallel/tensor.h"

/* "key=N" at s (len characters) with key `key`: *v; 0 when another key, -1 when not a count in [1, max]. */
static int layout_count(const char *s, size_t len, const char *key, int max, int *v)
{
    size_t k = strlen(key);
    if (len <= k || strncmp(s, key, k) || s[k] != '=')
        return 0;
    char num[16];
    char *end = NULL;
    if (len - k - 1 >= sizeof num)
        return -1;
    snprintf(num, sizeof num, "%.*s", (int)(len - k - 1), s + k + 1);
    long x = strtol(num, &end, 10);
    if (num[0] < '0' || num[0] > '9' || *end || x < 1 || x > max)
        return -1;
    *v = (int)x;
    return 1;
}

clg_status clg_tp_parse_layout(clg_err *err, const char *spec, int *tp, int *dp, char *rest, size_t cap)
{
    *tp = *dp = 1;
    for (const char *s = spec; s && *s;) { /* tp first: with it, dp belongs to this layout too */
        size_t len = strcspn(s, ",");
        if (layout_count(s, len, "tp", CLG_TP_MAX, tp) < 0)
            return clg_err_set(err, CLG_ERR_INVALID_ARG,
                               "parallel layout '%s': tp=T takes a whole number of devices from 1 to %d", spec,
                               CLG_TP_MAX);
        s += len + (s[len] == ',');
    }
    size_t used = 0;
    if (cap)
        rest[0] = 0;
    for (const char *s = spec; s && *s;) {
        size_t len = strcspn(s, ",");
        int v = 0, isdp = *tp > 1 ? layout_count(s, len, "dp", CLG_TP_MAX / *tp, dp) : 0;
        if (isdp < 0)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "parallel layout '%s': dp=D with tp=%d takes 1 to %d", spec,
                               *tp, CLG_TP_MAX / *tp);
        if (!isdp && !layout_count(s, len, "tp", CLG_TP_MAX, &v)) {
            if (used + len + 2 > cap)
                return clg_err_set(err, CLG_ERR_INVALID_ARG, "parallel layout '%s': too long", spec);
            used += (size_t)snprintf(rest + used, cap - used, "%s%.*s", used ? "," : "", (int)len, s);
        }
        s += len + (s[len] == ',');
    }
    return CLG_OK;
}

// ---- the split layers ----

static const char *cfg_value(const clg_net *net, int layer, const char *key)
{
    const clg_cfg_kv *kv = clg_cfg_find(&net->cfg->sec[layer + 1], key);
    return kv ? kv->value : NULL;
}

/* A layer whose weight splits by outputs or inputs: a [dense] (not tied, not on a sequence) or a
 * [convolutional] of one group. */
static int is_splittable(const clg_net *net, int i)
{
    const clg_layer *l = &net->proto[i];
    const char *g = cfg_value(net, i, "groups");
    if (l->ops == &clg_layer_conv_ops)
        return !g || !strcmp(g, "1");
    return l->ops == &clg_layer_dense_ops && !l->in_seq[0] && !cfg_value(net, i, "tie");
}

/* The key holding a splittable layer's width. */
static const char *width_key(const clg_net *net, int i)
{
    return net->proto[i].ops == &clg_layer_conv_ops ? "filters" : "units";
}

/* A layer that works on each channel (feature) alone, so it runs on a slice of them. */
static int is_eltwise(const clg_layer *l)
{
    return (l->ops == &clg_layer_activation_ops || l->ops == &clg_layer_dropout_ops ||
            l->ops == &clg_layer_maxpool_ops || l->ops == &clg_layer_avgpool_ops || l->ops == &clg_layer_gap_ops ||
            l->ops == &clg_layer_flatten_ops) &&
           l->nin == 1 && !l->in_seq[0];
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

/* Pair starting at a: the row-split layer it feeds through per-channel layers, -1 when none. */
static int pair_end(const clg_net *net, int a)
{
    int src = net->proto[a].inputs[0];
    if (src >= 0 && sole_consumer(net, src) != a)
        return -1;
    for (int i = sole_consumer(net, a); i >= 0; i = sole_consumer(net, i)) {
        const clg_layer *l = &net->proto[i];
        if (is_splittable(net, i)) {
            const char *act = cfg_value(net, i, "activation");
            return !act || !strcmp(act, "linear") ? i : -1;
        }
        if (!is_eltwise(l) || l->is_loss)
            return -1;
    }
    return -1;
}

clg_status clg_tp_find_pairs(clg_err *err, const clg_net *net, int first, int last, int T, int *role, int *npairs)
{
    *npairs = 0;
    for (int i = first; i <= last; i++)
        role[i] = CLG_TP_REPL;
    for (int a = first; a <= last; a++) {
        if (!is_splittable(net, a))
            continue;
        int b = pair_end(net, a);
        if (b < 0 || b > last)
            continue;
        int units = net->proto[a].out_shape[1];
        if (units % T)
            return clg_err_set(err, CLG_ERR_INVALID_ARG,
                               "tp=%d: layer '%s' (%s:%d) has %d outputs, which %d devices cannot split evenly (its "
                               "width must be a multiple of tp)",
                               T, net->proto[a].name, net->source, net->proto[a].line, units, T);
        role[a] = CLG_TP_COL;
        role[b] = CLG_TP_ROW;
        for (int i = sole_consumer(net, a); i != b; i = sole_consumer(net, i))
            role[i] = CLG_TP_MID;
        (*npairs)++;
        a = b;
    }
    return CLG_OK;
}

static clg_status find_pairs(clg_err *err, const clg_net *net, int T, int *role, int *npairs)
{
    CLG_TRY(clg_tp_find_pairs(err, net, 0, net->nlayers - 1, T, role, npairs));
    if (!*npairs)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "tp=%d: %s has no layer tensor parallelism can split (a [dense] or [convolutional] "
                           "followed, through [activation], [dropout], pooling or [flatten] layers only, by a "
                           "[dense] or [convolutional] with a linear activation)",
                           T, net->source);
    return CLG_OK;
}

/* The model text with every column-split layer's units divided by T (its `units` line rewritten). */
char *clg_tp_lane_text(const clg_net *net, const int *role, int T)
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
            const clg_cfg_kv *kv = clg_cfg_find(&net->cfg->sec[i + 1], width_key(net, i));
            if (role[i] == CLG_TP_COL && kv && kv->line == line) {
                o += (size_t)sprintf(out + o, "%s = %d\n", width_key(net, i), net->proto[i].out_shape[1] / T);
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

clg_tp_slice clg_tp_slice_of(const int *role_of, const clg_net *net, int T, const clg_param_ref *ref, int t)
{
    const clg_param *q = ref->param;
    clg_tp_slice s = {1, q->numel, 0, 1, 0, q->numel, 0};
    int role = role_of[ref->layer->index], bias = !strcmp(q->name, "bias");
    if (role == CLG_TP_COL) { /* weight (units, in) and bias (units): a block of rows */
        size_t units = (size_t)net->proto[ref->layer->index].out_shape[1];
        s.R = units;
        s.C = q->numel / units;
        s.rows = units / T;
        s.r0 = s.rows * t;
        s.cols = s.C;
    } else if (role == CLG_TP_ROW && !bias) { /* weight (units, in): a block of columns */
        s.R = (size_t)q->shape[0];
        s.C = q->numel / s.R;
        s.rows = s.R;
        s.cols = s.C / T;
        s.c0 = s.cols * t;
    } else if (role == CLG_TP_ROW && bias) {
        s.zero = t > 0;
    }
    return s;
}

typedef clg_tp_slice slice;

static slice slice_of(const clg_tp *p, const clg_param_ref *ref, int t)
{
    return clg_tp_slice_of(p->role, p->net, p->T, ref, t);
}

void clg_tp_slice_copy(const clg_tp_slice *s, float *whole, float *part, int to_whole)
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

clg_status clg_tp_slice_xfer(const clg_tp_slice *s, clg_device *dev, cl_mem lm, float *whole, float *part,
                             int to_whole)
{
    size_t pn = s->rows * s->cols;
    clg_err *err = clg_dev_err(dev);
    if (to_whole) {
        CLG_CL_CHECK(err, clEnqueueReadBuffer(dev->queue, lm, CL_TRUE, 0, pn * sizeof(float), part, 0, NULL, NULL));
        clg_tp_slice_copy(s, whole, part, 1);
    } else {
        clg_tp_slice_copy(s, whole, part, 0);
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(dev->queue, lm, CL_TRUE, 0, pn * sizeof(float), part, 0, NULL, NULL));
    }
    return CLG_OK;
}

cl_mem clg_tp_param_buf(clg_replica *r, clg_optim *o, int li, int slot, int k)
{
    if (k == 0) { /* fp16: the fp32 master of a trainable weight */
        clg_param_ref own = {&r->layers[li], &r->layers[li].params[slot]};
        return clg_replica_master(r, &own);
    }
    int i = optim_index(o, li, slot);
    if (i < 0 || k > clg_optim_nstate(o))
        return NULL;
    return k == 1 ? o->m[i] : o->v[i];
}

/* Sharded optimizer state (k = 1, 2) of ref's parameter between whole (the full replica's, on the host) and the
 * lanes: slice t's state lies in the state arenas of its D lanes, group d's holding arena floats
 * [sh_k0[d], sh_k1[d]). */
static clg_status sync_shard_state(clg_tp *p, const clg_param_ref *ref, int k, int to_full, float *whole,
                                   float *part)
{
    int li = ref->layer->index, slot = (int)(ref->param - ref->layer->params);
    for (int t = 0; t < p->T; t++) {
        slice s = slice_of(p, ref, t);
        if (to_full && (s.zero || (p->role[li] == CLG_TP_REPL && t > 0)))
            continue; /* zero there; replicated: lane 0's */
        if (!to_full)
            clg_tp_slice_copy(&s, whole, part, 0);
        for (int d = 0; d < p->D; d++) {
            clg_tp_lane *ln = &p->ln[d * p->T + t];
            clg_optim *o = ln->opt;
            int oi = optim_index(o, li, slot);
            cl_mem buf = oi < 0 ? NULL : k == 1 ? o->marena : o->varena;
            size_t a = buf ? ln->rep->arena_off[oi] / sizeof(float) : 0, n = s.rows * s.cols;
            size_t x0 = CLG_MAX(a, o->k0), x1 = CLG_MIN(a + n, o->k1);
            if (!buf || x1 <= x0)
                continue;
            clg_err *err = clg_dev_err(ln->dev);
            if (to_full)
                CLG_CL_CHECK(err, clEnqueueReadBuffer(ln->dev->queue, buf, CL_TRUE, (x0 - o->k0) * sizeof(float),
                                                      (x1 - x0) * sizeof(float), part + (x0 - a), 0, NULL, NULL));
            else
                CLG_CL_CHECK(err, clEnqueueWriteBuffer(ln->dev->queue, buf, CL_TRUE, (x0 - o->k0) * sizeof(float),
                                                       (x1 - x0) * sizeof(float), part + (x0 - a), 0, NULL, NULL));
        }
        if (to_full)
            clg_tp_slice_copy(&s, whole, part, 1);
    }
    return CLG_OK;
}

clg_status clg_tp_whole_io(clg_device *dev, cl_mem mem, size_t n, float *whole, int write)
{
    clg_err *err = clg_dev_err(dev);
    if (write)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(dev->queue, mem, CL_TRUE, 0, n * sizeof(float), whole, 0, NULL, NULL));
    else
        CLG_CL_CHECK(err, clEnqueueReadBuffer(dev->queue, mem, CL_TRUE, 0, n * sizeof(float), whole, 0, NULL, NULL));
    return CLG_OK;
}

static clg_status sync_buf(clg_tp *p, clg_replica *full, clg_optim *fo, const clg_param_ref *ref, int k,
                           int to_full, float *whole, float *part)
{
    int li = ref->layer->index, slot = (int)(ref->param - ref->layer->params);
    cl_mem fm = clg_tp_param_buf(full, fo, li, slot, k);
    if (!fm)
        return CLG_OK;
    if (!to_full)
        CLG_TRY(clg_tp_whole_io(full->dev, fm, ref->param->numel, whole, 0));
    if (k > 0 && p->shard)
        CLG_TRY(sync_shard_state(p, ref, k, to_full, whole, part));
    for (int l = 0; l < (k > 0 && p->shard ? 0 : to_full ? p->T : p->L); l++) { /* from group 0; into every group */
        int t = l % p->T;
        clg_tp_lane *ln = &p->ln[l];
        cl_mem lm = clg_tp_param_buf(ln->rep, ln->opt, li, slot, k);
        slice s = slice_of(p, ref, t);
        if (!lm || (to_full && s.zero))
            continue;
        if (to_full && p->role[li] == CLG_TP_REPL && t > 0)
            break; /* replicated: lane 0's */
        CLG_TRY(clg_tp_slice_xfer(&s, ln->dev, lm, whole, part, to_full));
    }
    return to_full ? clg_tp_whole_io(full->dev, fm, ref->param->numel, whole, 1) : CLG_OK;
}

static clg_status ensure_optim(clg_tp *p, const clg_hparams *hp)
{
    for (int l = 0; l < p->L; l++) {
        clg_tp_lane *ln = &p->ln[l];
        if (!ln->opt && p->shard)
            CLG_TRY(clg_optim_create_shard(ln->rep, hp, p->sh_k0[l / p->T], p->sh_k1[l / p->T], &ln->opt));
        else if (!ln->opt)
            CLG_TRY(clg_optim_create(ln->rep, hp, &ln->opt));
    }
    return CLG_OK;
}

clg_status clg_tp_shard(clg_tp *p)
{
    if (p->D < 2 || p->shard)
        return CLG_OK;
    if (p->ln[0].opt)
        return clg_err_set(&p->ctx->err, CLG_ERR_INTERNAL, "tensor parallel: the optimizer state is sharded before "
                                                           "the first step only");
    size_t align = 128; /* each part a sub-buffer of the arenas on every device, in whole update work-groups */
    for (int l = 0; l < p->L; l++) {
        cl_uint bits = 0;
        if (clGetDeviceInfo(p->ln[l].dev->id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL) ==
                CL_SUCCESS &&
            bits / 8 > align)
            align = bits / 8;
    }
    size_t ub = CLG_MAX(align, (size_t)CLG_OPTK_STEP_WG * sizeof(float)), unit = ub / sizeof(float);
    size_t A = p->arena_floats, units = A * sizeof(float) / ub;
    for (int d = 0; d < p->D; d++) {
        p->sh_k0[d] = units * (size_t)d / (size_t)p->D * unit;
        p->sh_k1[d] = d == p->D - 1 ? A : units * (size_t)(d + 1) / (size_t)p->D * unit;
    }
    if (!(p->pgat = malloc((size_t)p->T * CLG_MAX(A, 1) * sizeof(float))))
        return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory for the parameter gather");
    p->shard = 1;
    return CLG_OK;
}

clg_status clg_tp_sync_each(clg_err *err, clg_replica *full, int with_state, clg_tp_sync_fn fn, void *user)
{
    clg_param_ref *refs = NULL;
    int n = 0;
    CLG_TRY(clg_replica_params(full, 0, &refs, &n));
    size_t most = 1;
    for (int i = 0; i < n; i++)
        most = CLG_MAX(most, refs[i].param->numel);
    float *whole = malloc(most * sizeof(float)), *part = malloc(most * sizeof(float));
    clg_status st = whole && part ? CLG_OK : clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    for (int i = 0; i < n && st == CLG_OK; i++)
        for (int k = 0; k < (with_state && refs[i].param->trainable ? 3 : 1) && st == CLG_OK; k++)
            st = fn(user, &refs[i], k, whole, part);
    free(whole);
    free(part);
    free(refs);
    return st;
}

struct sync_job {
    clg_tp *p;
    clg_replica *full;
    clg_optim *fo;
    int to_full;
};

static clg_status sync_one(void *user, const clg_param_ref *ref, int k, float *whole, float *part)
{
    struct sync_job *j = user;
    return sync_buf(j->p, j->full, j->fo, ref, k, j->to_full, whole, part);
}

clg_status clg_tp_sync(clg_tp *p, clg_replica *full, clg_optim *full_opt, const clg_hparams *hp, int to_full)
{
    if (full_opt)
        CLG_TRY(ensure_optim(p, hp));
    struct sync_job j = {p, full, full_opt, to_full};
    clg_status st = clg_tp_sync_each(&p->ctx->err, full, full_opt != NULL, sync_one, &j);
    if (st == CLG_OK && full_opt && to_full)
        full_opt->t = p->ln[0].opt->t;
    for (int l = 0; l < p->L && st == CLG_OK && full_opt && !to_full; l++)
        p->ln[l].opt->t = full_opt->t;
    if (st == CLG_OK && to_full)
        st = clg_replica_weights_updated(full);
    for (int l = 0; l < p->L && st == CLG_OK && !to_full; l++)
        st = clg_replica_weights_updated(p->ln[l].rep);
    return st;
}

// ---- the all-reduce ----

static void trace_span(clg_tp *p, int l, const char *what, const char *layer, double t0)
{
    if (p->trace && clg_trace_on(p->trace, p->step)) {
        char name[96];
        snprintf(name, sizeof name, "%s%s%s", what, layer ? " " : "", layer ? layer : "");
        clg_trace_host(p->trace, l, name, t0, clg_now_sec());
    }
}

/* The lanes of group g (g < 0: every lane) wait for each other; CLG_ERR_INTERNAL (on dev's error buffer) when a
 * lane failed (the step is abandoned). */
static clg_status barrier_dev(clg_tp *p, clg_device *dev, int g)
{
    int k = g < 0 ? p->D : g, members = g < 0 ? p->L : p->T;
    pthread_mutex_lock(&p->mu);
    int64_t gen = p->bgen[k];
    if (!p->abort && ++p->bcount[k] == members) {
        p->bcount[k] = 0;
        p->bgen[k]++;
        pthread_cond_broadcast(&p->cv);
    }
    while (!p->abort && gen == p->bgen[k])
        pthread_cond_wait(&p->cv, &p->mu);
    int ab = p->abort;
    pthread_mutex_unlock(&p->mu);
    if (ab)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INTERNAL, "tensor-parallel step abandoned: another device "
                                                               "failed");
    return CLG_OK;
}

static clg_status barrier(clg_tp *p, int l, int g) { return barrier_dev(p, p->ln[l].dev, g); }

clg_status clg_tp_group_reduce(clg_tp *p, clg_device *dev, int d, int t, cl_mem mem, size_t off, size_t count)
{
    clg_err *err = clg_dev_err(dev);
    if (count > p->red_cap)
        return clg_err_set(err, CLG_ERR_INTERNAL, "tensor parallel: %zu floats to reduce, room for %zu", count,
                           p->red_cap);
    float *red = p->red + (size_t)d * (p->T + 1) * p->red_cap;
    float *mine = red + (size_t)t * p->red_cap, *sum = red + (size_t)p->T * p->red_cap;
    CLG_CL_CHECK(err, clEnqueueReadBuffer(dev->queue, mem, CL_TRUE, off * sizeof(float), count * sizeof(float), mine,
                                          0, NULL, NULL));
    CLG_TRY(barrier_dev(p, dev, d));
    size_t k0 = count * (size_t)t / (size_t)p->T, k1 = count * (size_t)(t + 1) / (size_t)p->T;
    for (size_t k = k0; k < k1; k++) {
        float v = red[k];
        for (int u = 1; u < p->T; u++)
            v += red[(size_t)u * p->red_cap + k];
        sum[k] = v;
    }
    CLG_TRY(barrier_dev(p, dev, d));
    CLG_CL_CHECK(err, clEnqueueWriteBuffer(dev->queue, mem, CL_TRUE, off * sizeof(float), count * sizeof(float), sum,
                                           0, NULL, NULL));
    return CLG_OK;
}

/* Lane l's mem[off .. off + count) := its sum over the T lanes of its group (lane order: the same bits on
 * each). */
static clg_status all_reduce(clg_tp *p, int l, cl_mem mem, size_t off, size_t count)
{
    return clg_tp_group_reduce(p, p->ln[l].dev, l / p->T, l % p->T, mem, off, count);
}

clg_status clg_tp_group_create(clg_err *err, int groups, int T, size_t red_cap, clg_tp **out)
{
    *out = NULL;
    if (groups < 1 || groups > CLG_TP_MAX || T < 2)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "tensor parallel: %d groups of %d devices (at most %d groups)",
                           groups, T, CLG_TP_MAX);
    clg_tp *p = calloc(1, sizeof *p);
    if (p)
        p->red = malloc((size_t)groups * ((size_t)T + 1) * CLG_MAX(red_cap, 1) * sizeof(float));
    if (!p || !p->red) {
        free(p);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory for the tensor-parallel reduction");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->T = T;
    p->D = groups;
    p->red_cap = red_cap;
    *out = p;
    return CLG_OK;
}

void clg_tp_group_abort(clg_tp *p, int abort)
{
    pthread_mutex_lock(&p->mu);
    p->abort = abort;
    if (!abort)
        memset(p->bcount, 0, sizeof p->bcount);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* dp x tp: lane l's gradient arena := its sum over the D groups' lanes of the same slice (group order: every
 * group gets the same bits); each of those D lanes sums 1/D of the arena. MPI (hy): that sum then summed over
 * the ranks by group 0's lane of the slice (channel t), with D = 1 the lane's own arena. */
static clg_status reduce_groups(clg_tp *p, int l)
{
    clg_tp_lane *ln = &p->ln[l];
    clg_err *err = clg_dev_err(ln->dev);
    int d = l / p->T, t = l % p->T;
    size_t A = p->arena_floats;
    float *mine = p->gred + (size_t)l * A, *sum = p->gred + ((size_t)p->L + t) * A;
    CLG_CL_CHECK(err, clEnqueueReadBuffer(ln->dev->queue, ln->rep->garena, CL_TRUE, 0, A * sizeof(float), mine, 0,
                                          NULL, NULL));
    if (p->D == 1) /* MPI alone: this lane's arena over the ranks */
        sum = mine;
    CLG_TRY(barrier(p, l, -1));
    size_t k0 = A * (size_t)d / (size_t)p->D, k1 = A * (size_t)(d + 1) / (size_t)p->D;
    for (size_t k = k0; k < k1 && p->D > 1; k++) {
        float v = p->gred[(size_t)t * A + k];
        for (int e = 1; e < p->D; e++)
            v += p->gred[((size_t)e * p->T + t) * A + k];
        sum[k] = v;
    }
    if (p->hy && p->D > 1) /* every group's part of the sum written */
        CLG_TRY(barrier(p, l, -1));
    if (p->hy && d == 0)
        CLG_TRY(clg_hybrid_reduce(p->hy, t, err, sum, A, NULL, 0, 0));
    CLG_TRY(barrier(p, l, -1));
    size_t w0 = p->shard ? p->sh_k0[d] : 0, w1 = p->shard ? p->sh_k1[d] : A; /* sharded: a reduce-scatter */
    if (w1 > w0)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(ln->dev->queue, ln->rep->garena, CL_TRUE, w0 * sizeof(float),
                                               (w1 - w0) * sizeof(float), sum + w0, 0, NULL, NULL));
    return CLG_OK;
}

/* After layer i's forward (backward = 0) or backward was enqueued on a lane: the row-split layer's partial
 * outputs summed; the column-split layer's partial input gradient summed. */
static clg_status after_layer(void *user, int i, int backward)
{
    struct clg_tp_hook *h = user;
    clg_tp *p = h->p;
    int l = h->l, n = p->cnt[l / p->T];
    clg_replica *r = p->ln[l].rep;
    if (!backward && p->role[i] == CLG_TP_ROW && l == p->fault_lane && (int64_t)p->step == p->fault_step)
        return clg_err_set(clg_dev_err(p->ln[l].dev), CLG_ERR_OPENCL, "injected fault after %s's forward",
                           p->net->proto[i].name);
    if (r->fp16) /* summed in before_round, before the rounding to half */
        return CLG_OK;
    int src = r->layers[i].inputs[0];
    double t0 = clg_now_sec();
    clg_status st = CLG_OK;
    if (!backward && p->role[i] == CLG_TP_ROW)
        st = all_reduce(p, l, r->act[i].mem, r->act[i].off,
                        (size_t)n * (clg_tensor_numel(&r->act[i]) / (size_t)r->act[i].n));
    else if (backward && p->role[i] == CLG_TP_COL && src >= 0)
        st = all_reduce(p, l, r->dact[src].mem, r->dact[src].off,
                        (size_t)n * (clg_tensor_numel(&r->dact[src]) / (size_t)r->dact[src].n));
    else
        return CLG_OK;
    trace_span(p, l, backward ? "all-reduce gradient before" : "all-reduce output of", p->net->proto[i].name, t0);
    return st;
}

/* fp16 storage: the row-split layer's partial outputs (fp32) summed before they are rounded to half; the
 * column-split layer's partial input gradient (fp32) likewise (as one device rounds the whole product once). */
static clg_status before_round(void *user, int i, int backward, clg_tensor *t, int nt)
{
    struct clg_tp_hook *h = user;
    clg_tp *p = h->p;
    int l = h->l;
    clg_replica *r = p->ln[l].rep;
    if (!backward && p->role[i] == CLG_TP_ROW && l == p->fault_lane && (int64_t)p->step == p->fault_step)
        return clg_err_set(clg_dev_err(p->ln[l].dev), CLG_ERR_OPENCL, "injected fault after %s's forward",
                           p->net->proto[i].name);
    int sum = !backward ? p->role[i] == CLG_TP_ROW : p->role[i] == CLG_TP_COL && r->layers[i].inputs[0] >= 0;
    if (!sum || nt < 1 || !t[0].mem)
        return CLG_OK;
    double t0 = clg_now_sec();
    clg_status st = all_reduce(p, l, t[0].mem, t[0].off, clg_tensor_numel(&t[0]));
    trace_span(p, l, backward ? "all-reduce gradient before" : "all-reduce output of", p->net->proto[i].name, t0);
    return st;
}

clg_status clg_tp_zero_row_bias(const int *role, clg_replica *r, clg_device *dev, int first, int last)
{
    for (int i = first; i <= last; i++) {
        clg_layer *y = &r->layers[i];
        for (int k = 0; k < y->nparams && role[i] == CLG_TP_ROW; k++) {
            if (strcmp(y->params[k].name, "bias") || !y->params[k].grad)
                continue;
            float zero = 0;
            CLG_CL_CHECK(clg_dev_err(dev), clEnqueueFillBuffer(dev->queue, y->params[k].grad, &zero, sizeof zero, 0,
                                                               y->params[k].numel * sizeof(float), 0, NULL, NULL));
        }
    }
    return CLG_OK;
}

/* The row-split biases' gradients of lanes t > 0 of a group zeroed (those biases are zero and stay zero). */
static clg_status zero_bias_grads(clg_tp *p, int l)
{
    if (l % p->T == 0)
        return CLG_OK;
    return clg_tp_zero_row_bias(p->role, p->ln[l].rep, p->ln[l].dev, 0, p->net->nlayers - 1);
}

clg_status clg_tp_grad_sq(const int *role, clg_replica *r, clg_device *dev, size_t s0, size_t s1, double sq[2])
{
    size_t A = r->arena_bytes / sizeof(float);
    float *g = malloc(CLG_MAX(A, 1) * sizeof(float));
    clg_param_ref *refs = NULL;
    int n = 0;
    clg_status st = g ? clg_replica_params(r, 1, &refs, &n)
                      : clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "out of memory");
    if (st == CLG_OK && A)
        st = clEnqueueReadBuffer(dev->queue, r->garena, CL_TRUE, 0, A * sizeof(float), g, 0, NULL, NULL) ==
                     CL_SUCCESS
                 ? CLG_OK
                 : clg_err_set(clg_dev_err(dev), CLG_ERR_OPENCL, "reading the gradients for their norm failed");
    sq[0] = sq[1] = 0;
    s1 = CLG_MIN(s1, A);
    for (int i = 0; i < n && st == CLG_OK; i++) {
        size_t a0 = r->arena_off[i] / sizeof(float), k0 = CLG_MAX(a0, s0) - a0,
               k1 = CLG_MIN(a0 + refs[i].param->numel, CLG_MAX(s1, a0)) - a0;
        const float *v = g + a0;
        double a = 0;
        for (size_t k = k0; k < k1; k++)
            a += (double)v[k] * v[k];
        sq[role[refs[i].layer->index] == CLG_TP_REPL] += a;
    }
    free(refs);
    free(g);
    return st;
}

/* Clipping: the squared norms of lane l's gradients, split and replicated parameters apart (the global norm
 * counts every slice once and the replicated parameters once); sharded: its part. */
static clg_status lane_norms(clg_tp *p, int l)
{
    clg_tp_lane *ln = &p->ln[l];
    size_t s0 = p->shard ? p->sh_k0[l / p->T] : 0, s1 = p->shard ? p->sh_k1[l / p->T] : SIZE_MAX;
    return clg_tp_grad_sq(p->role, ln->rep, ln->dev, s0, s1, p->sq[l]);
}

static clg_status lane_step(clg_tp *p, int l, float *res)
{
    clg_tp_lane *ln = &p->ln[l];
    int d = l / p->T, t = l % p->T, n = p->cnt[d], off = p->off[d];
    clg_err *err = clg_dev_err(ln->dev);
    clg_replica *r = ln->rep;
    cl_command_queue q = ln->dev->queue;
    int lps = clg_net_labels_per_sample(p->net);
    CLG_CL_CHECK(err, clEnqueueWriteBuffer(q, ln->xbuf, CL_FALSE, 0, (size_t)n * p->sample * sizeof(float),
                                           p->x + (size_t)off * p->sample, 0, NULL, NULL));
    CLG_CL_CHECK(err, clEnqueueWriteBuffer(q, ln->ybuf, CL_FALSE, 0, (size_t)n * lps * sizeof(int32_t),
                                           p->y + (size_t)off * lps, 0, NULL, NULL));
    clg_replica_set_input(r, ln->xbuf, 0);
    clg_replica_set_labels(r, ln->ybuf, 0, p->grad_scale);
    for (int i = 0; i < r->nlayers; i++) {
        clg_layer *y = &r->layers[i];
        clg_layer_set_rng(y, p->seed, p->step, (uint32_t)(p->base + off));
        if (p->role[i] == CLG_TP_MID && y->ops == &clg_layer_dropout_ops) { /* the mask of the whole layer's slice */
            const int *w = p->net->proto[i].out_shape, *v = y->out_shape;
            clg_layer_set_rng_slice(y, (uint32_t)w[1] * w[2] * w[3], (uint32_t)(v[1] * v[2] * v[3] * t));
        }
    }
    double t0 = clg_now_sec();
    CLG_TRY(clg_replica_forward(r, n, 1));
    trace_span(p, l, "forward", NULL, t0);
    t0 = clg_now_sec();
    CLG_TRY(clg_replica_backward(r, n));
    CLG_TRY(zero_bias_grads(p, l));
    trace_span(p, l, "backward", NULL, t0);
    t0 = clg_now_sec();
    if (p->D > 1 || p->hy)
        CLG_TRY(reduce_groups(p, l));
    if (p->D > 1 || p->hy)
        trace_span(p, l, p->hy ? "gradients summed over the groups and ranks" : "gradients summed over the groups",
                   NULL, t0);
    p->ovf[l] = 0;
    if (l == p->inf_lane && (int64_t)p->step == p->fault_step) { /* test aid: this lane's gradient overflows */
        float inf = INFINITY;
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(q, r->garena, CL_TRUE, 0, sizeof inf, &inf, 0, NULL, NULL));
    }
    if (p->fp16) /* dynamic loss scaling: the summed gradients unscaled, an inf / NaN flagged */
        CLG_TRY(clg_optim_unscale_check(ln->opt, p->inv_loss_scale, &p->ovf[l]));
    if (p->clip_norm > 0 && (l < p->T || p->shard)) /* group 0's (every group holds the same sums); sharded: each
                                                        lane its part */
        CLG_TRY(lane_norms(p, l));
    if (res)
        CLG_CL_CHECK(err, clEnqueueReadBuffer(q, r->layers[r->loss_index].loss.result, CL_TRUE, 0, 2 * sizeof(float),
                                              res, 0, NULL, NULL));
    CLG_CL_CHECK(err, clFinish(q));
    return CLG_OK;
}

/* Sharded optimizer state, after the lanes' updates of their parts (all-gather within each slice): the lane's
 * updated part to the host, then the other parts of its slice from there; the fp16 copies follow. */
static clg_status gather_parts(clg_tp *p, int l)
{
    clg_tp_lane *ln = &p->ln[l];
    clg_err *err = clg_dev_err(ln->dev);
    int d = l / p->T, t = l % p->T;
    size_t A = p->arena_floats, k0 = p->sh_k0[d], k1 = p->sh_k1[d];
    float *h = p->pgat + (size_t)t * A;
    cl_mem pa = ln->rep->parena;
    double t0 = clg_now_sec();
    if (k1 > k0)
        CLG_CL_CHECK(err, clEnqueueReadBuffer(ln->dev->queue, pa, CL_TRUE, k0 * sizeof(float),
                                              (k1 - k0) * sizeof(float), h + k0, 0, NULL, NULL));
    CLG_TRY(barrier(p, l, -1));
    if (k0 > 0)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(ln->dev->queue, pa, CL_TRUE, 0, k0 * sizeof(float), h, 0, NULL, NULL));
    if (k1 < A)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(ln->dev->queue, pa, CL_TRUE, k1 * sizeof(float),
                                               (A - k1) * sizeof(float), h + k1, 0, NULL, NULL));
    trace_span(p, l, "parameter gather", NULL, t0);
    return clg_replica_weights_updated(ln->rep);
}

static clg_status lane_fn(void *arg, int l)
{
    clg_tp *p = arg;
    clg_tp_lane *ln = &p->ln[l];
    clg_status rc;
    if (p->phase == 1) {
        double t0 = clg_now_sec();
        rc = clg_optim_step(ln->opt, p->lr, p->gscale);
        trace_span(p, l, "optimizer", NULL, t0);
        if (rc == CLG_OK && p->shard)
            rc = gather_parts(p, l);
        if (rc == CLG_OK && clFinish(ln->dev->queue) != CL_SUCCESS)
            rc = clg_err_set(clg_dev_err(ln->dev), CLG_ERR_OPENCL, "clFinish after the optimizer failed");
    } else {
        rc = lane_step(p, l, l % p->T == 0 ? p->res[l / p->T] : NULL);
    }
    if (rc != CLG_OK)
        clg_fail_once(&p->mu, &p->cv, &p->abort, &p->fail_lane, &p->fail_status, l, rc);
    return rc;
}

static clg_status lane_failed(clg_tp *p, int l, clg_status rc)
{
    char where[48];
    snprintf(where, sizeof where, "tensor-parallel lane %d", l);
    return clg_fail_report(&p->ctx->err, rc, where, p->ln[l].dev);
}

clg_status clg_tp_train_step(clg_tp *p, const clg_hparams *hp, const float *x, const int32_t *y, int n, double lr,
                             float grad_scale, double clip_norm, uint32_t seed, uint32_t step, float *res)
{
    if (n < p->D || n > p->net->batch)
        return clg_err_set(&p->ctx->err, CLG_ERR_INVALID_ARG, "tensor-parallel step: %d samples (%d to %d)", n, p->D,
                           p->net->batch);
    CLG_TRY(ensure_optim(p, hp));
    p->x = x;
    p->y = y;
    p->n = n;
    p->lr = lr;
    p->grad_scale = grad_scale;
    p->seed = seed;
    p->step = step;
    p->clip_norm = clip_norm;
    p->gscale = 1.0f;
    p->abort = 0;
    memset(p->bcount, 0, sizeof p->bcount);
    p->fail_lane = -1;
    float r2[CLG_TP_MAX][2] = {{0}};
    for (int d = 0, o = 0; d < p->D; d++) { /* group d takes samples [o, o + cnt): sizes differ by at most one */
        p->cnt[d] = n / p->D + (d < n % p->D);
        p->off[d] = o;
        o += p->cnt[d];
        p->res[d] = r2[d];
    }
    p->phase = 0;
    int failed = -1;
    clg_status rc = clg_team_run(p->team, lane_fn, p, &failed);
    if (rc != CLG_OK)
        return p->fail_lane >= 0 ? lane_failed(p, p->fail_lane, p->fail_status) : lane_failed(p, failed, rc);
    for (int d = 0; res && d < p->D; d++) {
        res[0] = d ? res[0] + r2[d][0] : r2[d][0];
        res[1] = d ? res[1] + r2[d][1] : r2[d][1];
    }
    p->overflow = 0;
    for (int l = 0; l < p->L && p->fp16; l++) /* global: one lane's inf skips the step on every lane */
        p->overflow |= p->ovf[l];
    if (p->overflow) /* fp16: no lane updates; the caller lowers the loss scale */
        return CLG_OK;
    if (clip_norm > 0) { /* the global norm: every slice once (group 0's lanes), the replicated once (lane 0's);
                            sharded: every lane's part, the replicated parts of the lanes t = 0 */
        double sq = 0;
        for (int d = 0; d < (p->shard ? p->D : 1); d++)
            sq += p->sq[d * p->T][1];
        for (int l = 0; l < (p->shard ? p->L : p->T); l++)
            sq += p->sq[l][0];
        double norm = sqrt(sq);
        if (!isfinite(norm))
            return clg_err_set(&p->ctx->err, CLG_ERR_INTERNAL,
                               "gradient norm is not finite at step %u (diverged: lower the learning rate)", step);
        if (norm > clip_norm)
            p->gscale = (float)(clip_norm / norm);
    }
    p->phase = 1;
    rc = clg_team_run(p->team, lane_fn, p, &failed);
    if (rc != CLG_OK)
        return p->fail_lane >= 0 ? lane_failed(p, p->fail_lane, p->fail_status) : lane_failed(p, failed, rc);
    return CLG_OK;
}

// ---- creation ----

static clg_status lane_init(clg_tp *p, int l, clg_device *dev, const char *text)
{
    clg_tp_lane *ln = &p->ln[l];
    clg_err *err = &p->ctx->err;
    ln->dev = dev;
    CLG_TRY(clg_net_build(err, text, p->net->source, p->net->batch, &ln->net));
    ln->net->fp16 = p->net->fp16;
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
    ln->rep->before_round = before_round;
    p->hook[l].p = p;
    p->hook[l].l = l;
    ln->rep->after_layer_user = &p->hook[l];
    p->arena_floats = ln->rep->arena_bytes / sizeof(float); /* the same on every lane: equal slices */
    int lps = clg_net_labels_per_sample(p->net);
    CLG_TRY(clg_buf_alloc(dev, (size_t)p->net->batch * p->sample * sizeof(float), &ln->xbuf));
    CLG_TRY(clg_buf_alloc(dev, (size_t)p->net->batch * lps * sizeof(int32_t), &ln->ybuf));
    return CLG_OK;
}

/* A non-trainable parameter (batch-norm running statistics): its name; NULL when none. */
const char *clg_tp_state_param(const clg_net *net)
{
    for (int i = 0; i < net->nlayers; i++)
        for (int k = 0; k < net->proto[i].nparams; k++)
            if (!net->proto[i].params[k].trainable)
                return net->proto[i].name;
    return NULL;
}

clg_status clg_tp_draw_weights(clg_ctx *ctx, clg_net *net, clg_device *dev, uint64_t seed, int first, int last,
                               float **w)
{
    for (int i = first; i <= last; i++) {
        if (!net->proto[i].nparams)
            continue;
        clg_replica *r = NULL;
        int fp16 = net->fp16; /* fp32: the drawn values, which one device's fp16 masters start from */
        net->fp16 = 0;
        clg_status cst = clg_replica_create_range(net, dev, seed, i, i, 1, &r);
        net->fp16 = fp16;
        CLG_TRY(cst);
        clg_status st = CLG_OK;
        for (int k = 0; k < r->layers[i].nparams && st == CLG_OK; k++) {
            const clg_param *q = &r->layers[i].params[k];
            float **h = &w[i * CLG_MAX_PARAMS + k];
            if (!(*h = malloc(CLG_MAX(q->numel, 1) * sizeof(float))))
                st = clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of memory for the first weights");
            else if (clEnqueueReadBuffer(dev->queue, q->value, CL_TRUE, 0, q->numel * sizeof(float), *h, 0, NULL,
                                         NULL) != CL_SUCCESS)
                st = clg_err_set(clg_dev_err(dev), CLG_ERR_OPENCL, "reading the first weights of %s failed",
                                 r->layers[i].name);
        }
        clg_replica_free(r);
        CLG_TRY(st);
    }
    return CLG_OK;
}

clg_status clg_tp_scatter(const int *role, const clg_net *net, int T, int t, float **w, clg_replica *rep,
                          clg_device *dev, int first, int last, float *part)
{
    for (int i = first; i <= last; i++)
        for (int k = 0; k < net->proto[i].nparams; k++) {
            clg_param_ref ref = {&net->proto[i], &net->proto[i].params[k]};
            clg_tp_slice sl = clg_tp_slice_of(role, net, T, &ref, t);
            clg_param_ref own = {&rep->layers[i], &rep->layers[i].params[k]};
            clg_tp_slice_copy(&sl, w[i * CLG_MAX_PARAMS + k], part, 0);
            if (clEnqueueWriteBuffer(dev->queue, clg_replica_master(rep, &own), CL_TRUE, 0,
                                     sl.rows * sl.cols * sizeof(float), part, 0, NULL, NULL) != CL_SUCCESS)
                return clg_err_set(clg_dev_err(dev), CLG_ERR_OPENCL, "writing the first weights failed");
        }
    return clg_replica_weights_updated(rep);
}

size_t clg_tp_most_floats(const clg_net *net)
{
    size_t most = 1;
    for (int i = 0; i < net->nlayers; i++)
        for (int k = 0; k < net->proto[i].nparams; k++)
            most = CLG_MAX(most, net->proto[i].params[k].numel);
    return most;
}

/* The drawn weights sliced into every lane. */
static clg_status scatter_weights(clg_tp *p, float **w)
{
    float *part = malloc(clg_tp_most_floats(p->net) * sizeof(float));
    if (!part)
        return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    clg_status st = CLG_OK;
    for (int l = 0; l < p->L && st == CLG_OK; l++)
        st = clg_tp_scatter(p->role, p->net, p->T, l % p->T, w, p->ln[l].rep, p->ln[l].dev, 0, p->net->nlayers - 1,
                            part);
    free(part);
    return st;
}

clg_status clg_tp_create(clg_ctx *ctx, clg_net *net, const int *devs, int ndev, int T, int D, uint64_t seed,
                         clg_tp **out)
{
    *out = NULL;
    D = D > 0 ? D : 1;
    if (T < 2 || D * T > CLG_TP_MAX)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "tp=%d, dp=%d: 2 to %d devices in all", T, D, CLG_TP_MAX);
    if (ndev != D * T)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG,
                           "%stp=%d needs %d devices, %d selected (dp x pp x tp must equal the device count)",
                           D > 1 ? "dp x " : "", T, D * T, ndev);
    if (D > 1 && clg_tp_state_param(net))
        return clg_err_set(&ctx->err, CLG_ERR_UNSUPPORTED, "dp=%d x tp=%d: layer '%s' keeps running statistics, "
                                                           "which data-parallel groups would need to average: not "
                                                           "supported yet (use tp=T alone)", D, T, clg_tp_state_param(net));
    if (clg_comm_size() > 1 && clg_tp_state_param(net))
        return clg_err_set(&ctx->err, CLG_ERR_UNSUPPORTED, "tp=%d over %d MPI ranks: layer '%s' keeps running "
                                                           "statistics, which the ranks would need to average: not "
                                                           "supported yet (run one process)", T, clg_comm_size(),
                           clg_tp_state_param(net));
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
    p->D = D;
    p->L = D * T;
    p->fault_lane = p->inf_lane = -1;
    p->fp16 = net->fp16 != 0;
    p->inv_loss_scale = 1.0f;
    p->sample = (size_t)net->in_c * net->in_h * net->in_w;
    float **w = calloc((size_t)net->nlayers * CLG_MAX_PARAMS, sizeof(float *)); /* drawn before the lanes exist */
    clg_status st = w ? find_pairs(&ctx->err, net, T, p->role, &p->npairs)
                      : clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    if (st == CLG_OK)
        st = clg_tp_draw_weights(ctx, net, &ctx->devs[devs[0]], seed, 0, net->nlayers - 1, w);
    char *text = st == CLG_OK ? clg_tp_lane_text(net, p->role, T) : NULL;
    if (st == CLG_OK && !text)
        st = clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    for (int l = 0; l < p->L && st == CLG_OK; l++) /* group d's lane t on devs[d T + t] */
        st = lane_init(p, l, &ctx->devs[devs[l]], text);
    free(text);
    if (st == CLG_OK && !(p->red = malloc((size_t)D * ((size_t)T + 1) * CLG_MAX(p->red_cap, 1) * sizeof(float))))
        st = clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of memory for the tensor-parallel reduction");
    if (st == CLG_OK && (D > 1 || clg_comm_size() > 1) && /* dp x tp, MPI ranks: the gradient sums */
        !(p->gred = malloc(((size_t)p->L + T) * CLG_MAX(p->arena_floats, 1) * sizeof(float))))
        st = clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of memory for the gradient reduction");
    if (st == CLG_OK)
        st = clg_team_create(&ctx->err, p->L, &p->team);
    if (st == CLG_OK)
        st = scatter_weights(p, w);
    for (int i = 0; w && i < net->nlayers * CLG_MAX_PARAMS; i++)
        free(w[i]);
    free(w);
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
    for (int l = 0; l < p->L; l++) {
        clg_tp_lane *ln = &p->ln[l];
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
    free(p->gred);
    free(p->pgat);
    free(p->role);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

void clg_tp_memory(const clg_tp *p, int l, clg_dp_mem *out)
{
    const clg_tp_lane *ln = &p->ln[l];
    const clg_pool *pool = &ln->dev->pool;
    memset(out, 0, sizeof *out);
    out->params = ln->rep->arena_charged;
    out->optim = clg_optim_state_bytes(ln->opt);
    out->activations = ln->rep->planned_bytes;
    uint64_t total = pool->stats.bytes_in_use + pool->direct_bytes, known = out->params + out->optim + out->activations;
    out->workspace = total > known ? total - known : 0;
    out->peak = pool->total_peak;
    out->limit = pool->limit;
}

void clg_tp_print(const clg_tp *p, FILE *f)
{
    if (p->D > 1)
        fprintf(f, "data x tensor parallel: dp=%d groups (each 1/%d of the batch, gradients summed over the groups) "
                   "x tp=%d over", p->D, p->D, p->T);
    else
        fprintf(f, "tensor parallel: tp=%d over", p->T);
    for (int l = 0; l < p->L; l++)
        fprintf(f, "%s device %d (%s)", l ? "," : "", p->ln[l].dev->index, p->ln[l].dev->info.name);
    fprintf(f, "; all-reduce through host memory%s\n",
            p->shard ? "; optimizer state sharded over the dp groups (reduce-scatter, all-gather)" : "");
    for (int a = 0; a < p->net->nlayers; a++) {
        if (p->role[a] != CLG_TP_COL)
            continue;
        int b = a + 1;
        while (p->role[b] != CLG_TP_ROW)
            b++;
        fprintf(f, "  split: %s (outputs: %d of %d per device) -> %s (the same slice of its inputs per device)\n",
                p->net->proto[a].name, p->net->proto[a].out_shape[1] / p->T, p->net->proto[a].out_shape[1],
                p->net->proto[b].name);
    }
    fprintf(f, "  every other layer replicated on each device\n");
}
