/* Pipeline x tensor parallelism (pp=K,tp=T; dp=D,pp=K,tp=T): see pptp.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "parallel/pptp.h"
#include "parallel/tensor.h"

/* The pairs (a[j], b[j]) of role, in order; their count. */
static int pair_list(const clg_net *net, const int *role, int *a, int *b)
{
    int n = 0;
    for (int i = 0; i < net->nlayers; i++) {
        if (role[i] == CLG_TP_COL)
            a[n] = i;
        if (role[i] == CLG_TP_ROW)
            b[n++] = i;
    }
    return n;
}

/* Pairs lying wholly in layers [lo, hi]; *cross: one starts at or before c and ends after it (c = hi). */
static int pairs_in(const int *a, const int *b, int np, int lo, int hi, int *cross)
{
    int n = 0;
    *cross = 0;
    for (int j = 0; j < np; j++) {
        n += a[j] >= lo && b[j] <= hi;
        *cross |= a[j] <= hi && b[j] > hi;
    }
    return n;
}

/* The cuts (stage s ends after layer cut[s]) between split pairs, each stage holding one at least: a user's cut
 * inside a pair is refused; the default partition is made again from the layers' costs, the cut of stage s the
 * allowed one nearest to (s + 1) / K of the total (every later stage keeping a pair). */
static clg_status cuts_between_pairs(clg_pipe *p, const clg_net *net, int *cut, int user_cuts, const int *role)
{
    int *a = malloc(sizeof(int) * (size_t)net->nlayers), *b = malloc(sizeof(int) * (size_t)net->nlayers);
    double *pre = malloc(sizeof(double) * (size_t)net->nlayers);
    if (!a || !b || !pre) {
        free(a);
        free(b);
        free(pre);
        return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    }
    int np = pair_list(net, role, a, b), cross = 0;
    for (int i = 0; i < net->nlayers; i++)
        pre[i] = (i ? pre[i - 1] : 0) + p->cost[i];
    clg_status st = CLG_OK;
    for (int s = 0, prev = -1; s + 1 < p->K && st == CLG_OK; prev = cut[s], s++) {
        if (user_cuts) {
            pairs_in(a, b, np, prev + 1, cut[s], &cross);
            for (int j = 0; j < np && cross; j++)
                if (a[j] <= cut[s] && b[j] > cut[s])
                    st = clg_err_set(&p->ctx->err, CLG_ERR_UNSUPPORTED,
                                     "pp=%d,tp=%d: the cut after '%s' separates the split pair %s -> %s (its slices "
                                     "cannot cross a cut yet): cut after '%s' or before '%s' (--stages)",
                                     p->K, p->T, net->proto[cut[s]].name, net->proto[a[j]].name,
                                     net->proto[b[j]].name, net->proto[b[j]].name, net->proto[a[j]].name);
            continue;
        }
        int best = -1;
        double target = pre[net->nlayers - 1] * (s + 1) / p->K, bd = 0;
        for (int c = prev + 1; c + 1 < net->nlayers; c++) {
            int c2 = 0, mine = pairs_in(a, b, np, prev + 1, c, &cross);
            if (cross || !mine || pairs_in(a, b, np, c + 1, net->nlayers - 1, &c2) < p->K - 1 - s)
                continue;
            if (best < 0 || fabs(pre[c] - target) < bd) {
                best = c;
                bd = fabs(pre[c] - target);
            }
        }
        if (best < 0)
            st = clg_err_set(&p->ctx->err, CLG_ERR_UNSUPPORTED,
                             "pp=%d,tp=%d: %s has %d layer pairs tensor parallelism can split, and each of the %d "
                             "stages needs one of its own", p->K, p->T, net->source, np, p->K);
        else
            cut[s] = best;
    }
    free(a);
    free(b);
    free(pre);
    return st;
}

/* Floats per partial of the largest all-reduce (a micro-batch of a row-split output or of a column-split layer's
 * input gradient) in the lane network. */
static size_t reduce_floats(const clg_net *ln, const int *role, int mb)
{
    size_t most = 1;
    for (int i = 0; i < ln->nlayers; i++) {
        const int *o = ln->proto[i].out_shape;
        int src = ln->proto[i].inputs[0];
        if (role[i] == CLG_TP_ROW)
            most = CLG_MAX(most, (size_t)mb * o[1] * o[2] * o[3]);
        if (role[i] == CLG_TP_COL && src >= 0) {
            const int *s = ln->proto[src].out_shape;
            most = CLG_MAX(most, (size_t)mb * s[1] * s[2] * s[3]);
        }
    }
    return most;
}

clg_status clg_pptp_setup(clg_pipe *p, clg_net *net, int *cut, int user_cuts, int D)
{
    clg_err *err = &p->ctx->err;
    int T = p->T, n = 0;
    if (!(p->tp_role = calloc((size_t)net->nlayers, sizeof(int))))
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    CLG_TRY(clg_tp_find_pairs(err, net, 0, net->nlayers - 1, T, p->tp_role, &n));
    CLG_TRY(cuts_between_pairs(p, net, cut, user_cuts, p->tp_role));
    for (int s = 0, first = 0; s < p->K; first = cut[s] + 1, s++) { /* the stages first, then their pairs */
        CLG_TRY(clg_tp_find_pairs(err, net, first, cut[s], T, p->tp_role, &n));
        if (!n)
            return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                               "pp=%d,tp=%d: stage %d (layers %s..%s) has no layer pair tensor parallelism can "
                               "split (a [dense] or [convolutional] followed, through [activation], [dropout], "
                               "pooling or [flatten] layers only, by a [dense] or [convolutional] with a linear "
                               "activation, both in the stage): move the cuts (--stages) or use pp=%d alone",
                               p->K, T, s, net->proto[first].name, net->proto[cut[s]].name, p->K);
    }
    char *text = clg_tp_lane_text(net, p->tp_role, T);
    if (!text)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    clg_status st = clg_net_build(err, text, net->source, net->batch, &p->tp_net);
    free(text);
    CLG_TRY(st);
    p->tp_net->fp16 = net->fp16;
    return clg_tp_group_create(err, D * p->K, T, reduce_floats(p->tp_net, p->tp_role, p->mb), &p->tpg);
}

/* After layer i's forward (backward = 0) or backward on a stage's replica: the row-split layer's partial outputs
 * summed over the stage's T lanes; the column-split layer's partial input gradient likewise. */
static clg_status after_layer(void *user, int i, int backward)
{
    const struct clg_pptp_hook *h = user;
    clg_pipe *p = h->p;
    clg_pipe_stage *st = &p->st[h->l];
    clg_replica *r = st->reps[h->k];
    int role = p->tp_role[i], src = r->layers[i].inputs[0];
    int g = st->d / p->T * p->K + st->s, t = st->d % p->T;
    const clg_tensor *x = !backward && role == CLG_TP_ROW                ? &r->act[i]
                          : backward && role == CLG_TP_COL && src >= 0 ? &r->dact[src]
                                                                       : NULL;
    if (!x)
        return CLG_OK;
    double t0 = clg_now_sec();
    clg_status rc = clg_tp_group_reduce(p->tpg, st->dev, g, t, x->mem, x->off,
                                        (size_t)st->cur_n * (clg_tensor_numel(x) / (size_t)x->n));
    if (p->trace && clg_trace_on(p->trace, p->step)) { /* a row per lane: the all-reduce, its wait included */
        char name[96];
        snprintf(name, sizeof name, "%s %s", backward ? "all-reduce gradient before" : "all-reduce output of",
                 r->layers[i].name);
        clg_trace_host(p->trace, h->l, name, t0, clg_now_sec());
    }
    return rc;
}

clg_status clg_pptp_init(clg_pipe *p, uint64_t seed)
{
    clg_net *net = p->user_net;
    int nh = 0;
    for (int l = 0; l < p->L; l++)
        nh += p->st[l].nreps;
    float **w = calloc((size_t)net->nlayers * CLG_MAX_PARAMS, sizeof(float *));
    float *part = malloc(clg_tp_most_floats(net) * sizeof(float));
    p->tp_hooks = calloc((size_t)nh, sizeof *p->tp_hooks);
    clg_status st = w && part && p->tp_hooks ? CLG_OK : clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    if (st == CLG_OK) /* one device's first weights, a layer at a time */
        st = clg_tp_draw_weights(p->ctx, net, p->st[0].dev, seed, 0, net->nlayers - 1, w);
    for (int l = 0, j = 0; l < p->L && st == CLG_OK; l++) {
        clg_pipe_stage *sg = &p->st[l];
        st = clg_tp_scatter(p->tp_role, net, p->T, sg->d % p->T, w, sg->rep, sg->dev, sg->first, sg->last, part);
        for (int k = 0; k < sg->nreps; k++, j++) {
            p->tp_hooks[j] = (struct clg_pptp_hook){p, l, k};
            sg->reps[k]->after_layer = after_layer;
            sg->reps[k]->after_layer_user = &p->tp_hooks[j];
        }
    }
    for (int i = 0; w && i < net->nlayers * CLG_MAX_PARAMS; i++)
        free(w[i]);
    free(w);
    free(part);
    return st == CLG_OK ? clg_pipe_loaded(p) : st;
}

void clg_pptp_rng(const clg_pipe *p, const clg_pipe_stage *st, clg_replica *r)
{
    for (int i = st->first; i <= st->last; i++) {
        clg_layer *y = &r->layers[i];
        if (p->tp_role[i] != CLG_TP_MID || y->ops != &clg_layer_dropout_ops)
            continue;
        const int *w = p->user_net->proto[i].out_shape, *v = y->out_shape; /* the mask of the whole layer's slice */
        clg_layer_set_rng_slice(y, (uint32_t)w[1] * w[2] * w[3], (uint32_t)(v[1] * v[2] * v[3] * (st->d % p->T)));
    }
}

clg_status clg_pptp_grads(clg_pipe *p, clg_pipe_stage *st, int clip)
{
    int t = st->d % p->T;
    if (t > 0)
        CLG_TRY(clg_tp_zero_row_bias(p->tp_role, st->rep, st->dev, st->first, st->last));
    if (!clip)
        return CLG_OK;
    double sq[2];
    CLG_TRY(clg_tp_grad_sq(p->tp_role, st->rep, st->dev, 0, SIZE_MAX, sq));
    st->norm_sq = sq[0] + (t == 0 ? sq[1] : 0); /* every slice once, the replicated parameters once */
    return CLG_OK;
}

/* Buffer k of one whole parameter (0 its fp32 value, 1 and 2 its optimizer state) between full and the stages'
 * slices (to_full: from the lanes of data replica 0, a slice once, a replicated parameter from lane t = 0; else
 * into every lane). */
struct pptp_sync {
    clg_pipe *p;
    clg_replica *full;
    clg_optim *fo;
    int to_full;
};

static clg_status sync_buf(void *user, const clg_param_ref *ref, int k, float *whole, float *part)
{
    const struct pptp_sync *j = user;
    clg_pipe *p = j->p;
    clg_replica *full = j->full;
    int to_full = j->to_full, li = ref->layer->index, slot = (int)(ref->param - ref->layer->params), s = p->stage_of[li];
    cl_mem fm = clg_tp_param_buf(full, j->fo, li, slot, k);
    if (!fm)
        return CLG_OK;
    if (!to_full)
        CLG_TRY(clg_tp_whole_io(full->dev, fm, ref->param->numel, whole, 0));
    for (int r = 0; r < (to_full ? p->T : p->D); r++) {
        clg_pipe_stage *sg = &p->st[r * p->K + s];
        int t = r % p->T;
        cl_mem lm = clg_tp_param_buf(sg->rep, sg->opt, li, slot, k);
        clg_tp_slice sl = clg_tp_slice_of(p->tp_role, p->user_net, p->T, ref, t);
        if (lm && !(to_full && (sl.zero || (p->tp_role[li] == CLG_TP_REPL && t > 0))))
            CLG_TRY(clg_tp_slice_xfer(&sl, sg->dev, lm, whole, part, to_full));
    }
    return to_full ? clg_tp_whole_io(full->dev, fm, ref->param->numel, whole, 1) : CLG_OK;
}

clg_status clg_pptp_sync(clg_pipe *p, clg_replica *full, clg_optim *full_opt, int to_full)
{
    struct pptp_sync j = {p, full, full_opt, to_full};
    return clg_tp_sync_each(&p->ctx->err, full, full_opt != NULL, sync_buf, &j);
}
