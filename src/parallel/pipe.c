/* Pipeline parallelism (see pipe.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "ops/nn.h"
#include "parallel/comm.h"
#include "parallel/dp.h"
#include "parallel/fail.h"
#include "parallel/hybrid.h"
#include "parallel/pipe.h"
#include "parallel/pipe_cost.h"
#include "parallel/pipe_wdefer.h"
#include "parallel/pipe_zero.h"
#include "parallel/pptp.h"
#include "parallel/tensor.h"

static clg_status stage_fn(void *arg, int s);
static clg_status wait_flag(clg_pipe *p, const int64_t *flag);
static clg_status xfer_setup(clg_pipe *p, int mode);
static clg_status reduce_setup(clg_pipe *p);
static clg_status split_init(clg_pipe *p, uint64_t seed);

// ---- parsing ----

int clg_pipe_schedule_parse(const char *name)
{
    if (!name || !strcmp(name, "1f1b"))
        return CLG_PIPE_1F1B;
    if (!strcmp(name, "gpipe"))
        return CLG_PIPE_GPIPE;
    return -1;
}

/* One "key=N" of a layout; *end past it. */
static int layout_item(const char *s, const char **end, char key[8], long *v)
{
    int k = 0;
    while (*s >= 'a' && *s <= 'z' && k < 7)
        key[k++] = *s++;
    key[k] = 0;
    if (*s++ != '=' || *s < '0' || *s > '9')
        return 0;
    char *e = NULL;
    *v = strtol(s, &e, 10);
    *end = e;
    return *v >= 1 && *v <= 1024 && (*e == ',' || *e == 0);
}

clg_status clg_pipe_parse_layout(clg_err *err, const char *spec, int *stages, int *replicas)
{
    *stages = 1;
    if (replicas)
        *replicas = 1;
    if (!spec || !*spec)
        return CLG_OK;
    long dp = 1, pp = 1;
    for (const char *s = spec; *s;) {
        char key[8];
        long v = 0;
        const char *e = s;
        if (!layout_item(s, &e, key, &v) || (strcmp(key, "dp") && strcmp(key, "pp") && strcmp(key, "tp")))
            return clg_err_set(err, CLG_ERR_INVALID_ARG,
                               "parallel layout '%s': expected items dp=N, pp=N separated by commas", spec);
        if (!strcmp(key, "tp") && v > 1)
            return clg_err_set(err, CLG_ERR_UNSUPPORTED, "parallel layout '%s': tensor parallelism (tp) is not "
                                                         "supported yet", spec);
        if (!strcmp(key, "dp"))
            dp = v;
        if (!strcmp(key, "pp"))
            pp = v;
        s = *e ? e + 1 : e;
    }
    if (dp > 1 && (pp == 1 || !replicas))
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, pp == 1 ? "parallel layout '%s': dp=D alone is plain data "
                                                               "parallelism: select the devices with --devices"
                                                             : "parallel layout '%s': dp > 1 is not supported here",
                           spec);
    if (pp * dp > CLG_PIPE_MAX_STAGES || dp > CLG_PIPE_MAX_REPLICAS)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "parallel layout '%s': at most %d devices (dp at most %d)",
                           spec, CLG_PIPE_MAX_STAGES, CLG_PIPE_MAX_REPLICAS);
    *stages = (int)pp;
    if (replicas)
        *replicas = (int)dp;
    return CLG_OK;
}

// ---- partition ----

/* Cost of a layer for balancing: forward FLOPs (backward is about twice
 * that for every layer with weights) plus a small per-layer overhead. */
static double layer_cost(const clg_layer *l) { return 3.0 * l->flops + 1e5; }

/* The cut after each stage (cut[s] = last layer of stage s) by names. */
static clg_status cuts_by_name(clg_err *err, const clg_net *net, const char *names, int K, int *cut)
{
    int n = 0, prev = -1;
    const char *s = names;
    while (*s) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        char name[64];
        if (len == 0 || len >= sizeof name)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "--stages '%s': empty or overlong layer name", names);
        memcpy(name, s, len);
        name[len] = 0;
        int i = clg_net_find(net, name);
        if (i < 0)
            return clg_err_set(err, CLG_ERR_NOT_FOUND, "--stages '%s': '%s' is not a layer of %s", names, name,
                               net->source);
        if (i <= prev || i >= net->nlayers - 1)
            return clg_err_set(err, CLG_ERR_INVALID_ARG,
                               "--stages '%s': '%s' must come after the previous cut and before the last layer",
                               names, name);
        if (n >= K - 1)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "--stages '%s': %d stages need %d cut%s", names, K, K - 1,
                               K == 2 ? "" : "s");
        cut[n++] = prev = i;
        s = e ? e + 1 : s + len;
    }
    if (n != K - 1)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "--stages '%s': %d stages need %d cut%s, got %d", names, K,
                           K - 1, K == 2 ? "" : "s", n);
    cut[K - 1] = net->nlayers - 1;
    return CLG_OK;
}

/* Per-layer cost by measurement: a whole-network replica at the micro-batch
 * size on dev, one step to compile and warm, then wall ms of each layer's
 * forward + backward (each finished before the next) over two steps. 0 when
 * it cannot be measured (the caller falls back to FLOPs). wdefer: dense
 * weight gradients deferred (pipe_wdefer.h), not counted. */
static int measure_costs(clg_net *net, clg_device *dev, uint64_t seed, int mb, int wdefer, double *cost)
{
    clg_err saved = dev->err;
    clg_replica *r = NULL;
    cl_mem x = NULL, y = NULL, *keep = NULL;
    int L = net->nlayers, kprof = dev->kprof, ok = 0;
    size_t sample = (size_t)net->in_c * net->in_h * net->in_w;
    if (net->fp16 || clg_replica_create_range(net, dev, seed, 0, L - 1, mb, &r) != CLG_OK)
        goto out;
    if (clg_buf_alloc(dev, (size_t)mb * sample * sizeof(float), &x) != CLG_OK ||
        clg_buf_alloc(dev, (size_t)mb * sizeof(int32_t), &y) != CLG_OK ||
        clg_buf_fill(dev, x, 0, (size_t)mb * sample, 0.5f) != CLG_OK || clg_buf_fill(dev, y, 0, (size_t)mb, 0.0f) != CLG_OK)
        goto out;
    clg_replica_set_input(r, x, 0);
    clg_replica_set_labels(r, y, 0, 1.0f / (float)mb);
    if (wdefer && clg_pipe_wdefer_measure(r, mb, &keep) != CLG_OK)
        goto out;
    if (clg_replica_forward(r, mb, 1) != CLG_OK || clg_replica_backward(r, mb) != CLG_OK || clFinish(dev->queue))
        goto out;
    r->prof_fwd = calloc((size_t)L, sizeof(double));
    r->prof_bwd = calloc((size_t)L, sizeof(double));
    r->prof_fwd_k = calloc((size_t)L, sizeof(double));
    r->prof_bwd_k = calloc((size_t)L, sizeof(double));
    r->prof_fwd_n = calloc((size_t)L, sizeof(long));
    r->prof_bwd_n = calloc((size_t)L, sizeof(long));
    if (!r->prof_fwd || !r->prof_bwd || !r->prof_fwd_k || !r->prof_bwd_k || !r->prof_fwd_n || !r->prof_bwd_n)
        goto out;
    r->profile = 1;
    dev->kprof = 1;
    for (int t = 0; t < 5; t++) { /* per layer the least of 5 (other processes' load only adds time) */
        for (int i = 0; i < L; i++)
            r->prof_fwd[i] = r->prof_bwd[i] = 0;
        if (clg_replica_forward(r, mb, 1) != CLG_OK || clg_replica_backward(r, mb) != CLG_OK)
            goto out;
        for (int i = 0; i < L; i++)
            cost[i] = t == 0 ? r->prof_fwd[i] + r->prof_bwd[i] : CLG_MIN(cost[i], r->prof_fwd[i] + r->prof_bwd[i]);
    }
    clg_pipe_cost_remember(dev, net, mb, wdefer, cost); /* the least of this and earlier runs' (pipe_cost.h) */
    ok = 1;
out:
    if (r)
        clFinish(dev->queue);
    clg_kprof_take(dev, NULL, NULL);
    dev->kprof = kprof;
    clg_buf_release(dev, x);
    clg_buf_release(dev, y);
    if (r)
        clg_pipe_wdefer_unmeasure(r, keep);
    clg_replica_free(r);
    if (!ok)
        dev->err = saved; /* not a failure of the run: FLOPs decide */
    return ok;
}

/* The memory a stage plans (bytes), as stage_init makes it: per stash
 * replica its parameters and their gradients and its activations with
 * their gradients (counted without liveness sharing: an upper bound), plus
 * the accumulated gradients and the optimizer state. */
typedef struct mem_model {
    double *wpre, *apre;  /* prefix sums over the layers: parameter bytes; activation bytes of a micro-batch */
    double lim[CLG_PIPE_MAX_STAGES]; /* per stage: its devices' smallest cap (0: none) */
    int nreps[CLG_PIPE_MAX_STAGES];
    int nopt;
} mem_model;

static double stage_bytes(const mem_model *mm, int k, int i, int j) /* stage k holding layers [i, j) */
{
    double w = mm->wpre[j] - mm->wpre[i], a = mm->apre[j] - mm->apre[i];
    return mm->nreps[k] * (2 * w + 2 * a) + (1 + mm->nopt) * w;
}

static int stage_fits(const mem_model *mm, int k, int i, int j)
{
    return !mm || mm->lim[k] <= 0 || stage_bytes(mm, k, i, j) <= mm->lim[k];
}

/* Contiguous partition minimizing the largest stage cost (dynamic
 * programming over prefix sums; ties: the later cut), among those where
 * every stage fits its device's memory cap (mm may be NULL: no caps; none
 * fitting: *fits = 0 and the partition by cost alone). */
/* MPI ranks: every rank cuts where rank 0 would, from the ranks' mean measured costs (rounded, so last-bit
 * differences of the sum cannot move a cut); a rank without a measurement makes every rank use FLOPs. */
static clg_status costs_agree(clg_err *err, const clg_net *net, clg_pipe *p)
{
    int n = net->nlayers, ranks = clg_comm_size();
    if (ranks < 2)
        return CLG_OK;
    double *v = malloc(sizeof(double) * (size_t)(n + 1));
    if (!v)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory agreeing on the pipeline cuts");
    for (int i = 0; i < n; i++)
        v[i] = p->measured ? p->cost[i] : 0.0;
    v[n] = p->measured ? 1.0 : 0.0;
    clg_status rc = clg_comm_allreduce_f64(err, v, n + 1, "the pipeline's layer costs");
    p->measured = rc == CLG_OK && v[n] > ranks - 0.5;
    for (int i = 0; i < n && p->measured; i++)
        p->cost[i] = round(v[i] / ranks * 1e4) / 1e4;
    free(v);
    return rc;
}

static clg_status cuts_balanced(clg_err *err, const clg_net *net, int K, const double *cost, const mem_model *mm,
                                int *cut, int *fits)
{
    int L = net->nlayers;
    double *pre = calloc((size_t)L + 1, sizeof *pre), *best = malloc(sizeof(double) * (size_t)(L + 1) * (size_t)K);
    int *arg = malloc(sizeof(int) * (size_t)(L + 1) * (size_t)K);
    if (!pre || !best || !arg) {
        free(pre);
        free(best);
        free(arg);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory partitioning the pipeline");
    }
    for (int i = 0; i < L; i++)
        pre[i + 1] = pre[i] + cost[i];
    /* best[k][j]: the first j layers in k+1 stages */
    for (int j = 0; j <= L; j++)
        best[j] = j > 0 && stage_fits(mm, 0, 0, j) ? pre[j] : 1e300;
    for (int k = 1; k < K; k++)
        for (int j = 0; j <= L; j++) {
            double b = 1e300;
            int a = -1;
            for (int i = k; i < j; i++) {
                if (!stage_fits(mm, k, i, j) || best[(size_t)(k - 1) * (L + 1) + i] >= 1e300)
                    continue;
                double c = CLG_MAX(best[(size_t)(k - 1) * (L + 1) + i], pre[j] - pre[i]);
                if (c <= b) {
                    b = c;
                    a = i;
                }
            }
            best[(size_t)k * (L + 1) + j] = b;
            arg[(size_t)k * (L + 1) + j] = a;
        }
    *fits = best[(size_t)(K - 1) * (L + 1) + L] < 1e300;
    if (!*fits && mm) { /* nothing fits: by cost alone (a stage then fails to allocate, naming its device) */
        free(pre);
        free(best);
        free(arg);
        return cuts_balanced(err, net, K, cost, NULL, cut, fits);
    }
    int j = L;
    for (int k = K - 1; k >= 0; k--) {
        cut[k] = j - 1;
        if (k > 0)
            j = arg[(size_t)k * (L + 1) + j];
    }
    free(pre);
    free(best);
    free(arg);
    return CLG_OK;
}

/* The default partition: by cost, within each stage's device memory cap
 * (--device-mem-limit: what its device has left now). *moved: memory moved a
 * cut (the cost-only partition has a stage over its cap). */
static clg_status cuts_default(clg_ctx *ctx, const clg_net *net, const int *devs, int K, int D, int M, int mb,
                               const clg_pipe_params *pp, const double *cost, int *cut, int *moved)
{
    int L = net->nlayers, fits = 0, any = 0, cut0[CLG_PIPE_MAX_STAGES];
    *moved = 0;
    mem_model mm = {0};
    mm.nopt = net->hp.optimizer != CLG_OPT_SGD ? 2 : net->hp.momentum > 0;
    for (int s = 0; s < K; s++) {
        mm.nreps[s] = pp->recompute ? 1 : pp->schedule == CLG_PIPE_GPIPE ? M : CLG_MIN(M, K - s);
        for (int d = 0; d < D; d++) {
            const clg_pool *pool = &ctx->devs[devs[d * K + s]].pool;
            double used = (double)(pool->stats.bytes_in_use + pool->direct_bytes);
            double left = pool->limit > 0 ? CLG_MAX((double)pool->limit - used, 1.0) : 0;
            if (left > 0 && (mm.lim[s] <= 0 || left < mm.lim[s]))
                mm.lim[s] = left;
            any |= left > 0;
        }
    }
    if (!any)
        return cuts_balanced(&ctx->err, net, K, cost, NULL, cut, &fits);
    mm.wpre = calloc((size_t)L + 1, sizeof(double));
    mm.apre = calloc((size_t)L + 1, sizeof(double));
    clg_status rc = mm.wpre && mm.apre ? CLG_OK : clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    for (int i = 0; i < L && rc == CLG_OK; i++) {
        const clg_layer *l = &net->proto[i];
        double w = 0;
        for (int q = 0; q < l->nparams; q++)
            w += 4.0 * (double)l->params[q].numel;
        mm.wpre[i + 1] = mm.wpre[i] + w;
        mm.apre[i + 1] = mm.apre[i] + 4.0 * mb * l->out_shape[1] * l->out_shape[2] * l->out_shape[3];
    }
    if (rc == CLG_OK)
        rc = cuts_balanced(&ctx->err, net, K, cost, NULL, cut0, &fits);
    if (rc == CLG_OK)
        rc = cuts_balanced(&ctx->err, net, K, cost, &mm, cut, &fits);
    for (int s = 0; s < K && rc == CLG_OK; s++) {
        *moved |= cut[s] != cut0[s];
        clg_log(2, "pipeline partition: stage %d cut after %s (by cost alone: %s), plans %.2f MiB, %.2f MiB left on "
                   "its device", s, net->proto[cut[s]].name, net->proto[cut0[s]].name,
                stage_bytes(&mm, s, s ? cut[s - 1] + 1 : 0, cut[s] + 1) / 1048576.0, mm.lim[s] / 1048576.0);
    }
    free(mm.wpre);
    free(mm.apre);
    return rc;
}

// ---- creation ----

static clg_status add_edge(clg_pipe *p, int tensor, int from, int to)
{
    for (int e = 0; e < p->nedges; e++)
        if (p->edges[e].tensor == tensor && p->edges[e].to == to)
            return CLG_OK;
    clg_pipe_edge *ne = realloc(p->edges, sizeof *ne * (size_t)(p->nedges + 1));
    if (!ne)
        return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    p->edges = ne;
    const clg_layer *l = &p->net->proto[tensor];
    clg_pipe_edge *e = &p->edges[p->nedges++];
    memset(e, 0, sizeof *e);
    e->tensor = tensor;
    e->from = from;
    e->to = to;
    e->fps = (size_t)l->out_shape[1] * l->out_shape[2] * l->out_shape[3];
    e->at = tensor;
    e->pitch = e->fps;
    size_t B = (size_t)p->mb * (size_t)p->M * (size_t)(p->D / p->T); /* the global batch */
    e->hf = malloc(B * e->fps * sizeof(float));
    e->hb = malloc(B * e->fps * sizeof(float));
    e->ready_f = calloc((size_t)p->M, sizeof(int64_t));
    e->ready_b = calloc((size_t)p->M, sizeof(int64_t));
    if (!e->hf || !e->hb || !e->ready_f || !e->ready_b)
        return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory for the pipeline's transfers");
    return CLG_OK;
}

/* Every producer -> consumer pair on different stages (in each replica:
 * lanes d * K + s); what each stage reads. */
static clg_status find_edges(clg_pipe *p)
{
    const clg_net *net = p->net;
    for (int d = 0; d < p->D; d++)
        for (int j = 0; j < net->nlayers; j++)
            for (int k = 0; k < net->proto[j].nin; k++) {
                int src = net->proto[j].inputs[k], sj = d * p->K + p->stage_of[j];
                if (src < 0)
                    p->st[sj].reads_input = 1;
                else if (p->stage_of[src] != p->stage_of[j])
                    CLG_TRY(add_edge(p, src, d * p->K + p->stage_of[src], sj));
            }
    return CLG_OK;
}

static int nin_edges(const clg_pipe *p, int s)
{
    int n = 0;
    for (int e = 0; e < p->nedges; e++)
        n += p->edges[e].to == s;
    return n;
}

/* The non-trainable parameters (batch-norm running statistics) of replica k. */
static clg_status stage_state(clg_pipe *p, clg_pipe_stage *st, int k)
{
    clg_param_ref *refs = NULL;
    int n = 0;
    CLG_TRY(clg_replica_params(st->reps[k], 0, &refs, &n));
    st->state[k] = calloc((size_t)CLG_MAX(n, 1), sizeof(cl_mem));
    if (k == 0) {
        st->state_save = calloc((size_t)CLG_MAX(n, 1), sizeof(cl_mem));
        st->state_n = calloc((size_t)CLG_MAX(n, 1), sizeof(size_t));
    }
    clg_status rc = st->state[k] && st->state_save && st->state_n
                        ? CLG_OK
                        : clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    int ns = 0;
    for (int i = 0; i < n && rc == CLG_OK; i++) {
        if (refs[i].param->trainable)
            continue;
        st->state[k][ns] = refs[i].param->value;
        if (k == 0) {
            st->state_n[ns] = refs[i].param->numel;
            if (p->recompute) /* saved around a re-run forward */
                rc = clg_buf_alloc(st->dev, refs[i].param->numel * sizeof(float), &st->state_save[ns]);
        }
        ns++;
    }
    st->nstate = ns;
    free(refs);
    return rc;
}

/* recompute: a device buffer per slot for each activation entering the stage. */
static clg_status stage_stash(clg_pipe *p, clg_pipe_stage *st)
{
    int ne = nin_edges(p, st->index);
    st->stash = calloc((size_t)CLG_MAX(st->nslots * ne, 1), sizeof(cl_mem));
    if (!st->stash)
        return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    for (int q = 0, k = 0; q < p->nedges && p->recompute; q++) {
        if (p->edges[q].to != st->index)
            continue;
        for (int sl = 0; sl < st->nslots; sl++)
            CLG_TRY(clg_buf_alloc(st->dev, (size_t)p->mb * p->edges[q].fps * p->esize, &st->stash[sl * ne + k]));
        k++;
    }
    return CLG_OK;
}

/* A stage's replicas, stash, accumulation buffer and state lists. */
static clg_status stage_init(clg_pipe *p, clg_pipe_stage *st, uint64_t seed)
{
    clg_device *dev = st->dev;
    st->nslots = p->schedule == CLG_PIPE_GPIPE ? p->M : CLG_MIN(p->M, p->K - st->s);
    st->nreps = p->recompute ? 1 : st->nslots;
    st->reps = calloc((size_t)st->nreps, sizeof *st->reps);
    st->last_fwd = calloc((size_t)st->nreps, sizeof(int));
    st->state = calloc((size_t)st->nreps, sizeof(cl_mem *));
    st->slot_of = malloc(sizeof(int) * (size_t)p->M);
    st->written = calloc((size_t)p->net->nlayers, 1);
    if (!st->reps || !st->last_fwd || !st->state || !st->slot_of || !st->written)
        return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    for (int k = 0; k < st->nreps; k++) {
        CLG_TRY(clg_replica_create_range(p->net, dev, seed, st->first, st->last, p->mb, &st->reps[k]));
        CLG_TRY(stage_state(p, st, k));
    }
    clg_replica *r = st->rep = st->reps[0];
    st->has_loss = r->loss_index >= st->first && r->loss_index <= st->last;
    size_t B = (size_t)p->mb * (size_t)p->M * (size_t)(p->D / p->T); /* the global batch */
    if (st->reads_input)
        CLG_TRY(clg_buf_alloc(dev, B * p->sample * sizeof(float), &st->xbuf));
    if (st->has_loss)
        CLG_TRY(clg_buf_alloc(dev, B * sizeof(int32_t), &st->ybuf));
    if (st->has_loss && !(st->lres = calloc((size_t)p->M * 2, sizeof(float))))
        return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    CLG_TRY(clg_buf_alloc(dev, CLG_MAX(r->arena_bytes, 4), &st->gacc));
    CLG_TRY(stage_stash(p, st));
    for (int q = 0; q < p->nedges; q++)
        if (p->edges[q].from == st->index)
            st->gscr_bytes = CLG_MAX(st->gscr_bytes, (size_t)p->mb * p->edges[q].fps * p->esize);
    if (st->gscr_bytes)
        CLG_TRY(clg_buf_alloc(dev, st->gscr_bytes, &st->gscr));
    st->mib = (double)(st->nreps * (r->planned_bytes + (uint64_t)r->arena_bytes * 2) + 2 * (uint64_t)r->arena_bytes) /
              1048576.0;
    return CLG_OK;
}

/* After reps[0]'s weights changed (update, load): every slot replica gets them. */
static clg_status stage_spread(clg_pipe_stage *st)
{
    clg_err *err = clg_dev_err(st->dev);
    for (int k = 1; k < st->nreps; k++) {
        if (st->rep->arena_bytes)
            CLG_CL_CHECK(err, clEnqueueCopyBuffer(st->dev->queue, st->rep->parena, st->reps[k]->parena, 0, 0,
                                                  st->rep->arena_bytes, 0, NULL, NULL));
        CLG_TRY(clg_replica_weights_updated(st->reps[k]));
    }
    return CLG_OK;
}

/* Replica k's running statistics := replica j's. */
static clg_status state_copy(clg_pipe_stage *st, int j, int k)
{
    clg_err *err = clg_dev_err(st->dev);
    for (int i = 0; i < st->nstate && j != k; i++)
        CLG_CL_CHECK(err, clEnqueueCopyBuffer(st->dev->queue, st->state[j][i], st->state[k][i], 0, 0,
                                              st->state_n[i] * sizeof(float), 0, NULL, NULL));
    return CLG_OK;
}

static clg_status check_layout(clg_ctx *ctx, const clg_net *net, int K, int D, int ndev, int M, int batch)
{
    if (K < 1 || K > CLG_PIPE_MAX_STAGES)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "pipeline: %d stages (1 to %d)", K, CLG_PIPE_MAX_STAGES);
    if (K > net->nlayers)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "pipeline: %d stages but %s has only %d layers", K,
                           net->source, net->nlayers);
    if (D < 1 || D > CLG_PIPE_MAX_REPLICAS || D * K > CLG_PIPE_MAX_STAGES)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "pipeline: dp=%d x pp=%d (at most %d devices)", D, K,
                           CLG_PIPE_MAX_STAGES);
    if (ndev != D * K && D == 1)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG,
                           "pipeline: pp=%d needs %d devices, %d selected (dp x pp must equal the device count)", K,
                           K, ndev);
    if (ndev != D * K)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG,
                           "pipeline: dp=%d x pp=%d needs %d devices, %d selected (dp x pp must equal the device "
                           "count)", D, K, D * K, ndev);
    if (M < 1 || M > CLG_PIPE_MAX_MICRO || D * M > batch)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG,
                           "pipeline: %d micro-batches%s for a batch of %d (1 to %d)", M, D > 1 ? " per replica" : "",
                           batch, CLG_MIN(batch / D, CLG_PIPE_MAX_MICRO));
    if (net->loss_index != net->nlayers - 1)
        return clg_err_set(&ctx->err, CLG_ERR_UNSUPPORTED, "pipeline: %s must end with its loss layer",
                           net->source);
    return CLG_OK;
}

/* Layers to stages by the cuts; lane l (copy l / K's stage l % K) on the context's device devs[l]. */
static void lanes_place(clg_pipe *p, const int *cut, const int *devs)
{
    for (int s = 0, i = 0; s < p->K; s++)
        for (; i <= cut[s]; i++)
            p->stage_of[i] = s;
    for (int l = 0; l < p->L; l++) {
        clg_pipe_stage *st = &p->st[l];
        st->index = l;
        st->d = l / p->K;
        st->s = l % p->K;
        st->first = st->s == 0 ? 0 : cut[st->s - 1] + 1;
        st->last = cut[st->s];
        st->dev = &p->ctx->devs[devs[l]];
        for (int i = st->first; i <= st->last; i++)
            st->cost += p->cost[i];
    }
}

/* pp x tp: the device count and the combinations not supported yet. */
static clg_status check_tensor(clg_ctx *ctx, const clg_net *net, int K, int D, int T, int ndev,
                               const clg_pipe_params *pp)
{
    char lay[48];
    snprintf(lay, sizeof lay, "%spp=%d,tp=%d", D > 1 ? "dp x " : "", K, T);
    if (ndev != D * K * T)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG,
                           "pipeline: %s needs %d devices, %d selected (dp x pp x tp must equal the device count)",
                           lay, D * K * T, ndev);
    if (D * K * T > CLG_PIPE_MAX_STAGES || D * T > CLG_PIPE_MAX_REPLICAS)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "pipeline: %s: at most %d devices (dp x tp at most %d)",
                           lay, CLG_PIPE_MAX_STAGES, CLG_PIPE_MAX_REPLICAS);
    const char *what = net->fp16                     ? "fp16 storage"
                       : clg_comm_size() > 1         ? "MPI ranks"
                       : pp->cuts && strchr(pp->cuts, ':') ? "a cut inside a layer"
                       : D > 1 && clg_tp_state_param(net) ? "batch norm (running statistics) with dp > 1"
                                                          : NULL;
    if (what)
        return clg_err_set(&ctx->err, CLG_ERR_UNSUPPORTED, "pipeline x tensor parallelism (%s) with %s is not "
                                                           "supported yet", lay, what);
    return CLG_OK;
}

/* K = 2 by measured cost: a cut inside the layer where half the cost falls, when the best cut between layers
 * leaves the larger stage more than 3% over half the total and the split (channels in multiples of 8 or 4 where
 * C allows, the tiles kernels block by; 1% allowed for the concat and the extra transfer) predicts a smaller
 * largest stage. Returns the layer (-1: none); *c its channels before the cut. */
int clg_pipe_split_auto(const clg_net *net, const double *cost, const int *cut, double bias, int prev, int *c)
{
    double tot = 0, pre = 0, a = 0;
    for (int i = 0; i < net->nlayers; i++)
        tot += cost[i];
    for (int i = 0; i <= cut[0]; i++)
        a += cost[i];
    double best = CLG_MAX(a, tot - a + bias), half = (tot + bias) / 2; /* the first stage's share */
    if (best <= 0.515 * (tot + bias))
        return -1;
    for (int i = 0; i < net->nlayers; i++) {
        if (pre + cost[i] > half) {
            int C = clg_pipe_split_channels(net, i);
            if (!C)
                return -1;
            int g = C % 8 == 0 && C >= 16 ? 8 : C % 4 == 0 && C >= 8 ? 4 : 1; /* whole kernel tiles */
            int k = CLG_MAX(g, CLG_MIN(C - g, (int)((half - pre) / cost[i] * C / g + 0.5) * g));
            double s0 = pre + cost[i] * k / C, sp = pre + cost[i] * (prev % 65536) / C;
            if (prev / 65536 == i + 1 && prev % 65536 > 0 && prev % 65536 < C && /* the last run's, unless 2% worse */
                CLG_MAX(sp, tot - sp + bias) <= 1.02 * CLG_MAX(s0, tot - s0 + bias)) {
                k = prev % 65536;
                s0 = sp;
            }
            if (CLG_MAX(s0, tot - s0 + bias) * 1.01 >= best)
                return -1;
            *c = k;
            return i;
        }
        pre += cost[i];
    }
    return -1;
}

/* The split network of layer L cut after c channels: the per-layer costs and stage_of remade for it and the cuts
 * (by name in it: names, NULL: the split is the cut of K = 2). */
static clg_status split_setup(clg_pipe *p, int L, int c, const char *names, int K, int batch, int *cut)
{
    const clg_net *un = p->user_net;
    CLG_TRY(clg_pipe_split_net(&p->ctx->err, un, L, c, batch, &p->split_net));
    clg_net *sn = p->split_net;
    double *cost = malloc(sizeof(double) * (size_t)sn->nlayers);
    int *so = realloc(p->stage_of, sizeof(int) * (size_t)sn->nlayers);
    if (so)
        p->stage_of = so;
    if (!cost || !so) {
        free(cost);
        return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    }
    double C = un->proto[L].out_shape[1];
    for (int j = 0; j < sn->nlayers; j++)
        cost[j] = !p->measured ? layer_cost(&sn->proto[j]) / 1e9
                  : j < L      ? p->cost[j]
                  : j == L     ? p->cost[L] * c / C
                  : j == L + 1 ? p->cost[L] * (C - c) / C
                  : j == L + 2 ? 0.01 * p->cost[L]
                               : p->cost[j - 2];
    free(p->cost);
    p->cost = cost;
    p->split_layer = L;
    p->split_c = c;
    clg_log(1, "pipeline: cut inside %s after %d of its %d output channels", un->proto[L].name, c, (int)C);
    if (names)
        return cuts_by_name(&p->ctx->err, sn, names, K, cut);
    cut[0] = L;
    cut[1] = sn->nlayers - 1;
    return CLG_OK;
}

static void log_partition(const clg_pipe *p)
{
    const clg_net *net = p->net;
    for (int i = 0; i < net->nlayers; i++)
        clg_log(2, "pipeline: layer %s %.3f %s", net->proto[i].name, p->cost[i], p->measured ? "ms" : "GFLOP");
    for (int s = 0; s < p->K; s++)
        clg_log(2, "pipeline stage %d: layers %s..%s, %.3f %s per micro-batch; transfers %s", s,
                net->proto[p->st[s].first].name, net->proto[p->st[s].last].name, p->st[s].cost,
                p->measured ? "ms" : "GFLOP", p->d2d ? "device to device" : "through the host");
}

/* The default cut inside a layer (K = 2, T = 1), with the second stage's remembered measured extra cost; the key
 * of that figure (with the weight-gradient modes) kept for clg_pipe_free. */
static int split_default(clg_pipe *p, clg_ctx *ctx, const clg_net *net, const clg_pipe_params *pp, clg_device *dev,
                         int mb, int wdefer, const int *cut, int *c)
{
    p->bias_kind = wdefer + 4 * clg_pipe_wlate_mode(ctx, pp, 1, net->fp16 != 0);
    int prev = 0;
    double bias = clg_pipe_bias_get(dev, net, mb, p->bias_kind, &prev);
    int split = clg_pipe_split_auto(net, p->cost, cut, bias, prev, c);
    p->auto_split = split >= 0;
    return split;
}

clg_status clg_pipe_create(clg_ctx *ctx, clg_net *net, const int *devs, int ndev, uint64_t seed, int batch,
                           const clg_pipe_params *pp, clg_pipe **out)
{
    *out = NULL;
    int K = pp->stages, M = pp->micro, D = pp->replicas > 0 ? pp->replicas : 1, T = CLG_MAX(pp->tensor, 1);
    batch = batch > 0 ? batch : net->batch;
    if (M == 0) /* default: 4 per stage (bubble (K-1)/(5K-1)), at most one sample each */
        M = CLG_MIN(4 * K, CLG_MAX(batch / D, 1));
    if (T > 1)
        CLG_TRY(check_tensor(ctx, net, K, D, T, ndev, pp));
    CLG_TRY(check_layout(ctx, net, K, D, ndev / T, M, batch));
    int cut[CLG_PIPE_MAX_STAGES], mb = (batch + D * M - 1) / (D * M);
    clg_pipe *p = calloc(1, sizeof *p);
    if (p) {
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->cv, NULL);
    }
    if (!p || !(p->stage_of = malloc(sizeof(int) * (size_t)net->nlayers)) ||
        !(p->cost = malloc(sizeof(double) * (size_t)net->nlayers))) {
        clg_pipe_free(p);
        return clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of memory creating the pipeline");
    }
    /* per-layer cost: measured at the micro-batch size on the first device, else FLOPs */
    int wdefer = clg_pipe_wdefer_mode(ctx, pp, T);
    p->measured = !(pp->cuts && *pp->cuts) && K > 1 && measure_costs(net, &ctx->devs[devs[0]], seed, mb, wdefer,
                                                                      p->cost);
    clg_status rc = CLG_OK;
    if (!(pp->cuts && *pp->cuts) && K > 1)
        rc = costs_agree(&ctx->err, net, p);
    for (int i = 0; i < net->nlayers && !p->measured; i++)
        p->cost[i] = layer_cost(&net->proto[i]) / 1e9;
    char scuts[1024];
    int split = -1, split_c = 0, capped = 0;
    for (int l = 0; l < ndev; l++)
        capped |= ctx->devs[devs[l]].pool.limit > 0;
    if (rc == CLG_OK && pp->cuts && strchr(pp->cuts, ':'))
        rc = clg_pipe_split_spec(&ctx->err, net, pp->cuts, &split, &split_c, scuts, sizeof scuts);
    else if (rc == CLG_OK && pp->cuts && *pp->cuts)
        rc = cuts_by_name(&ctx->err, net, pp->cuts, K, cut);
    else if (rc == CLG_OK)
        rc = cuts_default(ctx, net, devs, K, D, M, mb, pp, p->cost, cut, &p->mem_moved);
    /* a cut inside a layer only where one process measures: ranks measuring apart could split differently */
    if (rc == CLG_OK && !(pp->cuts && *pp->cuts) && K == 2 && p->measured && !p->mem_moved && !capped &&
        !pp->whole_layers && clg_comm_size() <= 1 && T == 1)
        split = split_default(p, ctx, net, pp, &ctx->devs[devs[0]], mb, wdefer, cut, &split_c);
    p->ctx = ctx;
    p->user_net = net;
    p->split_layer = -1;
    if (rc == CLG_OK && split >= 0)
        rc = split_setup(p, split, split_c, pp->cuts && *pp->cuts ? scuts : NULL, K, batch, cut);
    p->K = K;
    p->T = T;
    p->mb = mb;
    if (rc == CLG_OK && T > 1) /* pp x tp: the pairs inside each stage, the lane network */
        rc = clg_pptp_setup(p, net, cut, pp->cuts && *pp->cuts, D);
    if (rc != CLG_OK) {
        clg_pipe_free(p);
        return rc;
    }
    if (p->split_net)
        net = p->split_net;
    if (p->tp_net)
        net = p->tp_net;
    p->net = net;
    p->D = D * T;
    p->L = D * T * K;
    p->recompute = pp->recompute != 0;
    p->wdefer = wdefer;
    p->wlate = clg_pipe_wlate_mode(ctx, pp, T, net->fp16 != 0);
    p->M = M;
    p->schedule = pp->schedule;
    p->fp16 = net->fp16 != 0;
    p->esize = p->fp16 ? 2 : sizeof(float); /* fp16: every carried activation and gradient is stored in half */
    p->inv_loss_scale = 1.0f;
    p->sample = (size_t)net->in_c * net->in_h * net->in_w;
    p->fault_stage = -1;
    lanes_place(p, cut, devs);
    rc = find_edges(p);
    for (int a = 0; a < p->nedges && rc == CLG_OK && p->fp16; a++)
        for (int b = a + 1; b < p->nedges && rc == CLG_OK; b++)
            if (p->edges[a].tensor == p->edges[b].tensor && p->edges[a].from == p->edges[b].from)
                rc = clg_err_set(&ctx->err, CLG_ERR_UNSUPPORTED,
                                 "pipeline: with fp16 storage, '%s' is read by stages %d and %d: summing its "
                                 "gradients from several stages in half precision is not supported yet (cut "
                                 "elsewhere with --stages)", net->proto[p->edges[a].tensor].name, p->edges[a].to,
                                 p->edges[b].to);
    for (int l = 0; l < p->L; l++) /* this model's peak (the cost measurement's replica gone) */
        p->st[l].dev->pool.total_peak = p->st[l].dev->pool.stats.bytes_in_use + p->st[l].dev->pool.direct_bytes;
    for (int s = 0; s < p->L && rc == CLG_OK; s++) {
        rc = stage_init(p, &p->st[s], seed);
        if (rc == CLG_OK)
            rc = clg_pipe_wdefer_init(p, &p->st[s]);
        if (rc == CLG_OK)
            rc = clg_pipe_wlate_init(p, &p->st[s]);
        if (rc != CLG_OK && p->st[s].dev->err.msg[0])
            rc = clg_err_set(&ctx->err, rc, "pipeline stage %d on device %d (%s): %s", s, p->st[s].dev->index,
                             p->st[s].dev->info.name, p->st[s].dev->err.msg);
    }
    if (rc == CLG_OK && p->split_net) /* the split layer's weights as one device draws them */
        rc = split_init(p, seed);
    if (rc == CLG_OK && p->split_net)
        rc = clg_pipe_loaded(p);
    if (rc == CLG_OK && p->split_net) /* L@0's output straight into the concat's slice */
        clg_pipe_split_inplace(p);
    if (rc == CLG_OK && T > 1) /* one device's weights sliced into the lanes */
        rc = clg_pptp_init(p, seed);
    if (rc == CLG_OK)
        rc = xfer_setup(p, pp->transfer);
    if (rc == CLG_OK)
        rc = reduce_setup(p);
    if (rc == CLG_OK)
        log_partition(p);
    if (rc == CLG_OK)
        rc = clg_team_create_ex(&ctx->err, p->L, 1, &p->team); /* stage 0 on the caller's thread */
    if (rc != CLG_OK) {
        clg_pipe_free(p);
        return rc;
    }
    *out = p;
    return CLG_OK;
}

/* A default cut inside a layer: the second stage's measured CPU per micro-batch beyond the first's, less the
 * layer costs' prediction, remembered for the next partition (pipe_cost.h; 2+ steps after the first on each). */
static void remember_balance(clg_pipe *p)
{
    const clg_pipe_stage *a = &p->st[0], *b = &p->st[1];
    if (!p->auto_split || p->L != 2 || !p->measured || a->cpu_n < 2 || b->cpu_n < 2 || p->nm < 1)
        return;
    double ms = 1000 * (b->cpu_sum / b->cpu_n - a->cpu_sum / a->cpu_n) / p->nm - (b->cost - a->cost);
    double lim = 0.2 * (a->cost + b->cost); /* a run disturbed beyond that says nothing */
    if (fabs(ms) <= lim)
        clg_pipe_bias_put(a->dev, p->user_net, p->mb, p->bias_kind, ms, (p->split_layer + 1) * 65536 + p->split_c);
}

void clg_pipe_free(clg_pipe *p)
{
    if (!p)
        return;
    for (int s = 0; s < p->L && p->team; s++) /* the stages' balance, as a loaded machine leaves it least changed */
        if (p->st[s].cpu_n)
            clg_log(1, "pipeline stage %d: %.1f ms CPU per step (its thread, %d steps after the first)", s,
                    1000 * p->st[s].cpu_sum / p->st[s].cpu_n, p->st[s].cpu_n);
    remember_balance(p);
    clg_team_free(p->team);
    clg_pipe_zero_free(p);
    for (int l = 0; l < p->L; l++) {
        free(p->ghost ? p->ghost[l] : NULL);
        free(p->shost ? p->shost[l] : NULL);
    }
    for (int s = 0; s < p->K; s++) {
        free(p->gsum ? p->gsum[s] : NULL);
        free(p->ssum ? p->ssum[s] : NULL);
    }
    free(p->ghost);
    free(p->shost);
    free(p->gsum);
    free(p->ssum);
    free(p->sfloats);
    for (int s = 0; s < p->L; s++) {
        clg_pipe_stage *st = &p->st[s];
        if (!st->dev)
            continue;
        clFinish(st->dev->queue);
        int ne = nin_edges(p, s);
        for (int i = 0; st->stash && i < st->nslots * ne; i++)
            clg_buf_release(st->dev, st->stash[i]);
        for (int i = 0; st->state_save && i < st->nstate; i++)
            clg_buf_release(st->dev, st->state_save[i]);
        clg_optim_free(st->opt); /* before its replica */
        st->opt = NULL;
        clg_pipe_wdefer_free(st);
        for (int k = 0; k < st->nreps && st->reps; k++) {
            clg_replica_free(st->reps[k]);
            free(st->state ? st->state[k] : NULL);
        }
        free(st->reps);
        free(st->last_fwd);
        free(st->lres);
        free(st->written);
        free(st->home);
        clg_buf_release(st->dev, st->xbuf);
        clg_buf_release(st->dev, st->ybuf);
        clg_buf_release(st->dev, st->gacc);
        clg_buf_release(st->dev, st->gscr);
        clg_optim_free(st->opt);
        free(st->stash);
        free(st->slot_of);
        free(st->state);
        free(st->state_save);
        free(st->state_n);
    }
    free(p->cost);
    for (int e = 0; e < p->nedges; e++) {
        clg_pipe_edge *ed = &p->edges[e];
        for (int m = 0; m < p->M && ed->df; m++) {
            clg_buf_release(p->st[ed->from].dev, ed->df[m]);
            clg_buf_release(p->st[ed->from].dev, ed->db[m]);
        }
        free(ed->df);
        free(ed->db);
        free(p->edges[e].hf);
        free(p->edges[e].hb);
        free(p->edges[e].ready_f);
        free(p->edges[e].ready_b);
    }
    free(p->edges);
    free(p->stage_of);
    clg_net_free(p->split_net); /* after the stages' replicas of it */
    clg_net_free(p->tp_net);
    clg_tp_free(p->tpg);
    free(p->tp_role);
    free(p->tp_hooks);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

void clg_pipe_print(const clg_pipe *p, FILE *f)
{
    int Dd = p->D / p->T;
    if (Dd > 1)
        fprintf(f, "data x pipeline: %d replicas of the pipeline below, each on its own %d devices, each taking 1/%d "
                   "of every batch; gradients summed per stage\n", Dd, p->K * p->T, Dd);
    if (p->T > 1)
        fprintf(f, "pipeline x tensor: each stage on %d devices (the rows below: copy d x %d + t, t its tensor "
                   "lane), its split pairs' slices summed among them (all-reduce through host memory)\n", p->T,
                p->T);
    for (int a = 0; a < p->net->nlayers && p->T > 1; a++)
        if (p->tp_role[a] == CLG_TP_COL)
            fprintf(f, "  split: %s (outputs: %d of %d per device), stage %d\n", p->net->proto[a].name,
                    p->net->proto[a].out_shape[1], p->user_net->proto[a].out_shape[1], p->stage_of[a]);
    fprintf(f, "pipeline: %d stages, %d micro-batches of %d, schedule %s; balanced by %s%s\n", p->K, p->M, p->mb,
            p->schedule == CLG_PIPE_GPIPE ? "gpipe" : "1f1b",
            p->measured ? "measured layer times (ms: forward + backward of a step's micro-batches)"
                        : "FLOPs (GFLOP: forward + backward of a global batch)",
            p->mem_moved ? "; cut moved so that every stage fits its device's memory limit" : "");
    fprintf(f, "%-5s %-28s %-24s %7s %9s %8s\n", "stage", "device", "layers", "count",
            p->measured ? "ms" : "GFLOP", "MiB");
    for (int s = 0; s < p->L; s++) {
        const clg_pipe_stage *st = &p->st[s];
        char range[64];
        snprintf(range, sizeof range, "%.11s..%.11s", p->net->proto[st->first].name, p->net->proto[st->last].name);
        fprintf(f, "%-5d %-28.28s %-24s %7d %9.3f %8.2f\n", st->s, st->dev->info.name, range, st->last - st->first + 1,
                st->cost * (p->measured ? p->M : 1), st->mib);
    }
    if (p->nedges)
        fprintf(f, "  transfers: %s", p->d2d ? "device to device" : "through host memory");
    if (p->nedges && p->t_host > 0)
        fprintf(f, " (measured %.3f ms device to device, %.3f ms through the host)", 1e3 * p->t_dev, 1e3 * p->t_host);
    if (p->nedges)
        fprintf(f, "\n");
    for (int e = 0; e < p->nedges; e++)
        if (p->edges[e].from < p->K) /* replica 0's (the others' are the same) */
            fprintf(f, "  carried: %s (stage %d -> %d, %zu floats per sample)\n",
                    p->net->proto[p->edges[e].tensor].name, p->edges[e].from, p->edges[e].to, p->edges[e].fps);
    clg_pipe_wdefer_print(p, f);
}

void clg_pipe_memory(const clg_pipe *p, int s, clg_dp_mem *out)
{
    const clg_pipe_stage *st = &p->st[s];
    const clg_pool *pool = &st->dev->pool;
    memset(out, 0, sizeof *out);
    for (int k = 0; k < st->nreps; k++) {
        out->params += st->reps[k]->arena_charged;
        out->activations += st->reps[k]->planned_bytes;
    }
    out->optim = clg_optim_state_bytes(st->opt);
    uint64_t total = pool->stats.bytes_in_use + pool->direct_bytes, known = out->params + out->optim + out->activations;
    out->workspace = total > known ? total - known : 0;
    out->peak = pool->total_peak;
    out->limit = pool->limit;
}

// ---- the schedule ----

/* Operation t (0 .. 2*nm-1) of stage s: *bwd and the micro-batch. */
static void schedule_op(const clg_pipe *p, int s, int t, int *bwd, int *m)
{
    int M = p->nm;
    if (p->schedule == CLG_PIPE_GPIPE) {
        *bwd = t >= M;
        *m = t < M ? t : t - M;
        return;
    }
    int w = CLG_MIN(p->K - 1 - s, M); /* warm-up forwards */
    if (t < w) {
        *bwd = 0;
        *m = t;
    } else if (t < w + 2 * (M - w)) {
        int u = t - w;
        *bwd = u & 1;
        *m = *bwd ? u / 2 : w + u / 2;
    } else {
        *bwd = 1;
        *m = t - (w + 2 * (M - w)) + (M - w);
    }
}

// ---- mailboxes ----

static void trace_span(clg_pipe *p, int s, const char *what, int m, double t0)
{
    if (p->trace && clg_trace_on(p->trace, p->step)) {
        char name[48];
        snprintf(name, sizeof name, "%s %d", what, m);
        clg_trace_host(p->trace, s, name, t0, clg_now_sec());
    }
}

/* Waits until *flag == seq (or the step is abandoned); the time goes to the
 * stage's idle sum (the bubble). */
static clg_status wait_ready(clg_pipe *p, clg_pipe_stage *st, const int64_t *flag, const char *what, int m)
{
    double t0 = clg_now_sec();
    clg_status rc = wait_flag(p, flag);
    st->t_wait += clg_now_sec() - t0;
    trace_span(p, st->index, what, m, t0);
    return rc;
}

static clg_status wait_flag(clg_pipe *p, const int64_t *flag)
{
    pthread_mutex_lock(&p->mu);
    while (*flag != p->seq && !p->abort)
        pthread_cond_wait(&p->cv, &p->mu);
    int ab = p->abort;
    pthread_mutex_unlock(&p->mu);
    return ab ? CLG_ERR_INTERNAL : CLG_OK; /* the failing stage holds the message */
}

static void post_ready(clg_pipe *p, int64_t *flag)
{
    pthread_mutex_lock(&p->mu);
    *flag = p->seq;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

// ---- transfers ----

/* n rows of row floats from src (off so, pitch sp floats per sample) to dst (dof, dp) on queue q: one copy, or a
 * strided one (a channel slice of a concat's output). es: bytes per float stored. */
static clg_status copy_rows(clg_err *err, cl_command_queue q, cl_mem src, size_t so, size_t sp, cl_mem dst,
                            size_t dof, size_t dp, size_t row, int n, size_t es)
{
    if (sp == row && dp == row) {
        CLG_CL_CHECK(err, clEnqueueCopyBuffer(q, src, dst, so * es, dof * es, (size_t)n * row * es, 0, NULL, NULL));
        return CLG_OK;
    }
    size_t sorg[3] = {so * es, 0, 0}, dorg[3] = {dof * es, 0, 0}, reg[3] = {row * es, (size_t)n, 1};
    CLG_CL_CHECK(err, clEnqueueCopyBufferRect(q, src, dst, sorg, dorg, reg, sp * es, 0, dp * es, 0, 0, NULL, NULL));
    return CLG_OK;
}

/* n rows of row floats between mem (off, pitch floats per sample) and packed host rows h (to_host: a read, 1
 * blocking, 2 not: complete when q finishes; 0: a write that does not block). */
static clg_status host_rows(clg_err *err, cl_command_queue q, int to_host, cl_mem mem, size_t off, size_t pitch,
                            void *h, size_t row, int n, size_t es)
{
    cl_bool block = to_host == 1 ? CL_TRUE : CL_FALSE;
    if (pitch == row) {
        CLG_CL_CHECK(err, to_host ? clEnqueueReadBuffer(q, mem, block, off * es, (size_t)n * row * es, h, 0, NULL,
                                                        NULL)
                                  : clEnqueueWriteBuffer(q, mem, CL_FALSE, off * es, (size_t)n * row * es, h, 0, NULL,
                                                         NULL));
        return CLG_OK;
    }
    size_t borg[3] = {off * es, 0, 0}, horg[3] = {0, 0, 0}, reg[3] = {row * es, (size_t)n, 1};
    CLG_CL_CHECK(err, to_host ? clEnqueueReadBufferRect(q, mem, block, borg, horg, reg, pitch * es, 0, row * es, 0,
                                                        h, 0, NULL, NULL)
                              : clEnqueueWriteBufferRect(q, mem, CL_FALSE, borg, horg, reg, pitch * es, 0, row * es,
                                                         0, h, 0, NULL, NULL));
    return CLG_OK;
}

/* Sends n samples of a tensor (on the sender's device at off, pitch floats
 * per sample) for micro-batch m of edge e: into the host buffer (hf / hb)
 * or the context buffer (df / db); enqueued on the sender's queue, complete
 * when that queue finishes. */
static clg_status xfer_send(clg_pipe *p, clg_pipe_edge *e, int grad, int m, cl_mem mem, size_t off, size_t pitch,
                            int n)
{
    clg_device *dev = p->st[grad ? e->to : e->from].dev;
    clg_err *err = clg_dev_err(dev);
    if (p->d2d)
        return copy_rows(err, dev->queue, mem, off, pitch, grad ? e->db[m] : e->df[m], 0, e->fps, e->fps, n,
                         p->esize);
    char *h = (char *)(grad ? e->hb : e->hf) + (size_t)p->off[e->from / p->K][m] * e->fps * p->esize;
    return host_rows(err, dev->queue, 2, mem, off, pitch, h, e->fps, n, p->esize);
}

/* Micro-batch m's tensors leaving stage st (grad 0: its activations from replica r) or going back (grad 1: the
 * gradients of its entering activations): every transfer enqueued, the queue finished once, then each posted. */
static clg_status send_all(clg_pipe *p, clg_pipe_stage *st, clg_replica *r, int grad, int m, int n)
{
    double t0 = clg_now_sec();
    int any = 0;
    for (int q = 0; q < p->nedges; q++) {
        clg_pipe_edge *e = &p->edges[q];
        if ((grad ? e->to : e->from) != st->index)
            continue;
        const clg_tensor *t = grad ? &r->dact[e->at] : &r->act[e->tensor];
        CLG_TRY(xfer_send(p, e, grad, m, t->mem, t->off, grad ? e->pitch : e->fps, n));
        any = 1;
    }
    if (!any)
        return CLG_OK;
    CLG_CL_CHECK(clg_dev_err(st->dev), clFinish(st->dev->queue));
    for (int q = 0; q < p->nedges; q++) {
        clg_pipe_edge *e = &p->edges[q];
        if ((grad ? e->to : e->from) == st->index)
            post_ready(p, grad ? &e->ready_b[m] : &e->ready_f[m]);
    }
    trace_span(p, st->index, grad ? "send gradient" : "send activation", m, t0);
    return CLG_OK;
}

/* Receives what xfer_send sent into mem at off (pitch floats per sample) on the receiver's queue. */
static clg_status xfer_recv(clg_pipe *p, clg_pipe_edge *e, int grad, int m, cl_mem mem, size_t off, size_t pitch,
                            int n)
{
    clg_device *dev = p->st[grad ? e->from : e->to].dev;
    clg_err *err = clg_dev_err(dev);
    if (p->d2d)
        return copy_rows(err, dev->queue, grad ? e->db[m] : e->df[m], 0, e->fps, mem, off, pitch, e->fps, n,
                         p->esize);
    /* not blocking: the host rows of micro-batch m stay as they are until the step ends, and every stage
       finishes its queue before that */
    char *h = (char *)(grad ? e->hb : e->hf) + (size_t)p->off[e->from / p->K][m] * e->fps * p->esize;
    return host_rows(err, dev->queue, 0, mem, off, pitch, h, e->fps, n, p->esize);
}

/* Whether the receiver of edge e reads the transfer buffer itself (grad 0: the activation, whose rows must be
 * contiguous there; grad 1: the gradient). */
static int in_place(const clg_pipe *p, const clg_pipe_edge *e, int grad)
{
    return p->inplace && p->d2d && (grad || e->pitch == e->fps);
}

/* Receives micro-batch m's tensor of edge e for replica k of stage st into t (its act[e->at] or dact[e->tensor]):
 * in place, t is pointed at the transfer buffer; else a copy into t's rows (pitch floats per sample). */
static clg_status recv_into(clg_pipe *p, clg_pipe_stage *st, int k, clg_pipe_edge *e, int grad, int m, clg_tensor *t,
                            size_t pitch, int n)
{
    if (!in_place(p, e, grad))
        return xfer_recv(p, e, grad, m, t->mem, t->off, pitch, n);
    clg_tensor *home = &st->home[(size_t)k * (size_t)p->nedges + (size_t)(e - p->edges)];
    if (!home->mem)
        *home = *t;
    t->mem = grad ? e->db[m] : e->df[m];
    t->off = 0;
    return CLG_OK;
}

/* The replica's own buffers back where recv_into pointed at transfer buffers. */
static void recv_home(clg_pipe *p, clg_pipe_stage *st, int k)
{
    for (int q = 0; q < p->nedges && st->home; q++) {
        clg_pipe_edge *e = &p->edges[q];
        clg_tensor *home = &st->home[(size_t)k * (size_t)p->nedges + (size_t)q];
        if (!home->mem)
            continue;
        if (e->to == st->index)
            st->reps[k]->act[e->at] = *home;
        else if (e->from == st->index)
            st->reps[k]->dact[e->tensor] = *home;
        home->mem = NULL;
    }
}

/* Seconds of one transfer of a micro-batch of edge e's tensor (sender's
 * activation into the receiver's) by the current path, best of 3 (in place: the send alone). */
static clg_status time_xfer(clg_pipe *p, clg_pipe_edge *e, double *t)
{
    p->off[e->from / p->K][0] = 0;
    *t = 1e30;
    cl_mem src = p->st[e->from].rep->act[e->tensor].mem, dst = p->st[e->to].rep->act[e->tensor].mem;
    size_t so = p->st[e->from].rep->act[e->tensor].off, dof = p->st[e->to].rep->act[e->tensor].off;
    for (int r = 0; r < 4; r++) {
        double t0 = clg_now_sec();
        CLG_TRY(xfer_send(p, e, 0, 0, src, so, e->fps, p->mb));
        CLG_CL_CHECK(clg_dev_err(p->st[e->from].dev), clFinish(p->st[e->from].dev->queue));
        if (!in_place(p, e, 0))
            CLG_TRY(xfer_recv(p, e, 0, 0, dst, dof, e->fps, p->mb));
        CLG_CL_CHECK(clg_dev_err(p->st[e->to].dev), clFinish(p->st[e->to].dev->queue));
        if (r > 0) /* the first warms */
            *t = CLG_MIN(*t, clg_now_sec() - t0);
    }
    return CLG_OK;
}

/* The transfer path: device buffers where every edge joins devices of one
 * cl_context (mode AUTO: only when that measured faster). */
static clg_status xfer_setup(clg_pipe *p, int mode)
{
    int shared = p->nedges > 0, big = -1;
    for (int q = 0; q < p->nedges; q++) {
        clg_pipe_edge *e = &p->edges[q];
        shared &= p->st[e->from].dev->cl == p->st[e->to].dev->cl;
        if (big < 0 || e->fps > p->edges[big].fps)
            big = q;
    }
    if (mode == CLG_PIPE_XFER_DEVICE && !shared && p->nedges > 0)
        return clg_err_set(&p->ctx->err, CLG_ERR_UNSUPPORTED,
                           "pipeline: device-to-device transfers need the stages' devices in one OpenCL context");
    if (mode == CLG_PIPE_XFER_HOST || !shared)
        return CLG_OK;
    p->inplace = p->T == 1; /* pp x tp's lanes keep their copies */
    for (int s = 0; s < p->L && p->inplace; s++) {
        p->st[s].home = calloc((size_t)p->st[s].nreps * (size_t)p->nedges, sizeof(clg_tensor));
        if (!p->st[s].home)
            return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    }
    for (int q = 0; q < p->nedges; q++) {
        clg_pipe_edge *e = &p->edges[q];
        clg_device *dev = p->st[e->from].dev;
        e->df = calloc((size_t)p->M, sizeof(cl_mem));
        e->db = calloc((size_t)p->M, sizeof(cl_mem));
        if (!e->df || !e->db)
            return clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
        for (int m = 0; m < p->M; m++) {
            CLG_TRY(clg_buf_alloc(dev, (size_t)p->mb * e->fps * p->esize, &e->df[m]));
            CLG_TRY(clg_buf_alloc(dev, (size_t)p->mb * e->fps * p->esize, &e->db[m]));
        }
    }
    p->d2d = 1;
    if (mode == CLG_PIPE_XFER_DEVICE)
        return CLG_OK;
    CLG_TRY(time_xfer(p, &p->edges[big], &p->t_dev));
    p->d2d = 0;
    CLG_TRY(time_xfer(p, &p->edges[big], &p->t_host));
    clg_pipe_xfer_remember(p->st[p->edges[big].from].dev, (size_t)p->mb * p->edges[big].fps * p->esize, &p->t_dev,
                           &p->t_host);
    p->d2d = p->t_dev < p->t_host;
    return CLG_OK;
}

// ---- one micro-batch on a stage ----

/* The replica micro-batch m runs on: its slot's (reps[0] with recompute). */
static int rep_of(const clg_pipe_stage *st, int m) { return st->nreps == 1 ? 0 : st->slot_of[m]; }

/* Points replica k at micro-batch m's inputs and labels; recompute: the
 * entering activations from the stash slot. */
static clg_status set_inputs(clg_pipe *p, clg_pipe_stage *st, int k, int m)
{
    clg_replica *r = st->reps[k];
    clg_err *err = clg_dev_err(st->dev);
    if (st->reads_input)
        clg_replica_set_input(r, st->xbuf, (size_t)p->off[st->d][m] * p->sample);
    if (st->has_loss)
        clg_replica_set_labels(r, st->ybuf, (size_t)p->off[st->d][m], p->grad_scale);
    for (int i = st->first; i <= st->last; i++)
        clg_layer_set_rng(&r->layers[i], p->seed, p->step, (uint32_t)(p->base + p->off[st->d][m]));
    if (p->T > 1) /* dropout inside a split pair: the slice's masks */
        clg_pptp_rng(p, st, r);
    int ne = nin_edges(p, st->index), j = 0;
    for (int q = 0; q < p->nedges && p->recompute; q++) {
        const clg_pipe_edge *e = &p->edges[q];
        if (e->to != st->index)
            continue;
        const clg_tensor *a = &r->act[e->at];
        CLG_TRY(copy_rows(err, st->dev->queue, st->stash[st->slot_of[m] * ne + j], 0, e->fps, a->mem, a->off,
                          e->pitch, e->fps, p->cnt[st->d][m], p->esize));
        j++;
    }
    return CLG_OK;
}

/* A free stash slot for micro-batch m (counted in flight). */
static clg_status take_slot(clg_pipe *p, clg_pipe_stage *st, int m)
{
    int slot = -1;
    for (int sl = 0; sl < st->nslots && slot < 0; sl++) {
        int used = 0;
        for (int q = 0; q < p->nm; q++)
            used |= st->slot_of[q] == sl;
        if (!used)
            slot = sl;
    }
    if (slot < 0)
        return clg_err_set(clg_dev_err(st->dev), CLG_ERR_INTERNAL,
                           "pipeline stage %d: more than %d micro-batches in flight", st->index, st->nslots);
    st->slot_of[m] = slot;
    st->inflight++;
    st->peak_inflight = CLG_MAX(st->peak_inflight, st->inflight);
    return CLG_OK;
}

static clg_status stage_forward(clg_pipe *p, clg_pipe_stage *st, int m)
{
    clg_err *err = clg_dev_err(st->dev);
    int n = p->cnt[st->d][m], ne = nin_edges(p, st->index);
    CLG_TRY(take_slot(p, st, m));
    int k = rep_of(st, m), slot = st->slot_of[m];
    clg_replica *r = st->reps[k];
    for (int q = 0, j = 0; q < p->nedges; q++) { /* the entering activations: into the slot */
        clg_pipe_edge *e = &p->edges[q];
        if (e->to != st->index)
            continue;
        CLG_TRY(wait_ready(p, st, &e->ready_f[m], "wait activation", m));
        if (p->recompute)
            CLG_TRY(xfer_recv(p, e, 0, m, st->stash[slot * ne + j], 0, e->fps, n));
        else
            CLG_TRY(recv_into(p, st, k, e, 0, m, &r->act[e->at], e->pitch, n));
        j++;
    }
    CLG_TRY(set_inputs(p, st, k, m));
    CLG_TRY(state_copy(st, st->state_rep, k)); /* running statistics advance in micro-batch order */
    st->state_rep = k;
    st->cur_n = n;
    CLG_TRY(clg_replica_forward(r, n, 1));
    st->last_fwd[k] = m;
    if (st->has_loss) /* no host round trip: read when the schedule ends (the queue is in order) */
        CLG_CL_CHECK(err, clEnqueueReadBuffer(st->dev->queue, r->layers[r->loss_index].loss.result, CL_FALSE, 0,
                                              2 * sizeof(float), st->lres + 2 * m, 0, NULL, NULL));
    return send_all(p, st, r, 0, m, n); /* the leaving activations */
}

/* recompute: the forward of micro-batch m again from its stash (reps[0]'s
 * activations were overwritten by later micro-batches); running statistics
 * kept as they were. */
static clg_status stage_recompute(clg_pipe *p, clg_pipe_stage *st, int m)
{
    clg_err *err = clg_dev_err(st->dev);
    cl_command_queue q = st->dev->queue;
    for (int i = 0; i < st->nstate; i++)
        CLG_CL_CHECK(err, clEnqueueCopyBuffer(q, st->state[0][i], st->state_save[i], 0, 0,
                                              st->state_n[i] * sizeof(float), 0, NULL, NULL));
    CLG_TRY(set_inputs(p, st, 0, m));
    st->cur_n = p->cnt[st->d][m];
    CLG_TRY(clg_replica_forward(st->rep, p->cnt[st->d][m], 1));
    for (int i = 0; i < st->nstate; i++)
        CLG_CL_CHECK(err, clEnqueueCopyBuffer(q, st->state_save[i], st->state[0][i], 0, 0,
                                              st->state_n[i] * sizeof(float), 0, NULL, NULL));
    st->last_fwd[0] = m;
    st->nrecompute++;
    return CLG_OK;
}

/* The gradients of this stage's tensors read by later stages, into dact[]. */
static clg_status receive_grads(clg_pipe *p, clg_pipe_stage *st, int k, int m, char *written)
{
    clg_replica *r = st->reps[k];
    int n = p->cnt[st->d][m];
    for (int q = 0; q < p->nedges; q++) {
        clg_pipe_edge *e = &p->edges[q];
        if (e->from != st->index)
            continue;
        CLG_TRY(wait_ready(p, st, &e->ready_b[m], "wait gradient", m));
        clg_tensor *g = &r->dact[e->tensor];
        if (!written[e->tensor]) {
            CLG_TRY(recv_into(p, st, k, e, 1, m, g, e->fps, n));
            written[e->tensor] = 1;
        } else {
            CLG_TRY(xfer_recv(p, e, 1, m, st->gscr, 0, e->fps, n));
            CLG_TRY(clg_nn_add_acc(st->dev, (size_t)n * e->fps, st->gscr, 0, g->mem, g->off));
        }
    }
    return CLG_OK;
}

static clg_status stage_backward(clg_pipe *p, clg_pipe_stage *st, int m, int first_bwd)
{
    clg_replica *r = st->reps[rep_of(st, m)];
    clg_err *err = clg_dev_err(st->dev);
    int n = p->cnt[st->d][m];
    if (st->index == p->fault_stage && m == p->fault_mb && (int64_t)p->step == p->fault_step)
        return clg_cl_fail(err, CL_INVALID_COMMAND_QUEUE, "clEnqueueNDRangeKernel (injected fault)", __FILE__,
                           __LINE__);
    char *written = st->written;
    memset(written, 0, (size_t)r->nlayers);
    double t0 = clg_now_sec();
    int rerun = st->last_fwd[rep_of(st, m)] != m;
    clg_status rc = rerun ? stage_recompute(p, st, m) : CLG_OK;
    if (rerun && rc == CLG_OK)
        trace_span(p, st->index, "re-run forward", m, t0);
    if (rc == CLG_OK)
        rc = receive_grads(p, st, rep_of(st, m), m, written);
    st->cur_n = n;
    clg_pipe_wdefer_arm(p, st, r, m, 1);
    clg_pipe_wlate_arm(st, r, 1);
    if (rc == CLG_OK)
        rc = clg_replica_backward_range(r, n, written);
    clg_pipe_wdefer_arm(p, st, r, m, 0);
    clg_pipe_wlate_arm(st, r, 0);
    CLG_TRY(rc);
    /* the entering activations' gradients go back before the accumulation: the other stage waits on them */
    CLG_TRY(send_all(p, st, r, 1, m, n));
    if (st->nwl) { /* the weight gradients the stage before does not wait for */
        double t0 = clg_now_sec();
        CLG_TRY(clg_pipe_wlate_run(st, r, n, first_bwd));
        trace_span(p, st->index, "late weight gradients", m, t0);
    }
    if (r->arena_bytes) /* accumulate (without the deferred weight gradients) */
        CLG_TRY(clg_pipe_wdefer_acc(st, r, first_bwd));
    recv_home(p, st, rep_of(st, m));
    st->slot_of[m] = -1;
    st->inflight--;
    return CLG_OK;
}

// ---- data x pipeline: the replicas' gradients and state ----

/* The sums' key of a lane: its stage and, with pp x tp, its tensor lane (the copies of one slice are summed). */
static int red_key(const clg_pipe *p, const clg_pipe_stage *st) { return st->d % p->T * p->K + st->s; }

static clg_status reduce_setup(clg_pipe *p)
{
    if ((p->D == p->T && !p->hy) || p->ghost)
        return CLG_OK;
    clg_err *err = &p->ctx->err;
    size_t nk = (size_t)p->K * (size_t)p->T;
    p->ghost = calloc((size_t)p->L, sizeof(float *));
    p->shost = calloc((size_t)p->L, sizeof(float *));
    p->gsum = calloc(nk, sizeof(float *));
    p->ssum = calloc(nk, sizeof(float *));
    p->sfloats = calloc(nk, sizeof(size_t));
    if (!p->ghost || !p->shost || !p->gsum || !p->ssum || !p->sfloats)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    for (int l = 0; l < p->L; l++) {
        const clg_pipe_stage *st = &p->st[l];
        size_t sf = 0;
        for (int i = 0; i < st->nstate; i++)
            sf += st->state_n[i];
        p->sfloats[red_key(p, st)] = sf;
        p->ghost[l] = malloc(CLG_MAX(st->rep->arena_bytes, 4));
        p->shost[l] = malloc(CLG_MAX(sf, 1) * sizeof(float));
        if (!p->ghost[l] || !p->shost[l])
            return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
        if (st->d < p->T && (!(p->gsum[red_key(p, st)] = malloc(CLG_MAX(st->rep->arena_bytes, 4))) ||
                             !(p->ssum[red_key(p, st)] = malloc(CLG_MAX(sf, 1) * sizeof(float)))))
            return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    return CLG_OK;
}

/* The sums over the replicas of stage s (key: pp x tp, of its tensor lane t's copies; the last to arrive adds
 * them in replica order: the same bits on every replica). */
static void reduce_sum(clg_pipe *p, int key)
{
    int s = key % p->K, t = key / p->K, l0 = t * p->K + s;
    size_t ng = p->st[l0].rep->arena_bytes / sizeof(float), ns = p->sfloats[key];
    float *g = p->gsum[key], *st = p->ssum[key];
    for (size_t k = 0; k < ng; k++)
        g[k] = p->ghost[l0][k];
    for (size_t k = 0; k < ns; k++)
        st[k] = (float)((double)p->rcnt[t] / p->n) * p->shost[l0][k];
    for (int d = p->T + t; d < p->D; d += p->T) {
        const float *gh = p->ghost[d * p->K + s], *sh = p->shost[d * p->K + s];
        float w = (float)((double)p->rcnt[d] / p->n);
        for (size_t k = 0; k < ng; k++)
            g[k] += gh[k];
        for (size_t k = 0; k < ns; k++)
            st[k] += w * sh[k];
    }
}

/* Every replica's stage st->s ends with the summed gradient (in gacc) and
 * the slice-weighted average of the running statistics. */
static clg_status reduce_replicas(clg_pipe *p, clg_pipe_stage *st)
{
    clg_err *err = clg_dev_err(st->dev);
    cl_command_queue q = st->dev->queue;
    size_t bytes = st->rep->arena_bytes, off = 0;
    float *sh = p->shost[st->index];
    if (bytes)
        CLG_CL_CHECK(err, clEnqueueReadBuffer(q, st->gacc, CL_TRUE, 0, bytes, p->ghost[st->index], 0, NULL, NULL));
    for (int i = 0; i < st->nstate; off += st->state_n[i], i++)
        CLG_CL_CHECK(err, clEnqueueReadBuffer(q, st->state[0][i], CL_TRUE, 0, st->state_n[i] * sizeof(float), sh + off, 0,
                                              NULL, NULL));
    double t0 = clg_now_sec();
    clg_status rr = CLG_OK;
    int key = red_key(p, st);
    pthread_mutex_lock(&p->mu);
    if (++p->red_arrived[key] == p->D / p->T) {
        reduce_sum(p, key);
        p->red_arrived[key] = 0;
        if (p->hy) { /* MPI: the stage's sums over the ranks (outside the lock: other stages go on) */
            pthread_mutex_unlock(&p->mu);
            rr = clg_hybrid_reduce(p->hy, st->s, err, p->gsum[st->s], bytes / sizeof(float), p->ssum[st->s],
                                   p->sfloats[st->s], p->n);
            pthread_mutex_lock(&p->mu);
        }
        if (rr == CLG_OK) {
            p->red_done[key] = p->seq;
            pthread_cond_broadcast(&p->cv);
        }
    }
    while (rr == CLG_OK && p->red_done[key] != p->seq && !p->abort)
        pthread_cond_wait(&p->cv, &p->mu);
    int ab = p->red_done[key] != p->seq;
    pthread_mutex_unlock(&p->mu);
    st->t_wait += clg_now_sec() - t0;
    trace_span(p, st->index, p->hy ? "gradient sum over replicas and ranks" : "gradient sum over replicas", 0, t0);
    if (rr != CLG_OK)
        return rr;
    if (ab)
        return CLG_ERR_INTERNAL; /* another lane failed: it holds the message */
    if (bytes)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(q, st->gacc, CL_TRUE, 0, bytes, p->gsum[key], 0, NULL, NULL));
    off = 0;
    for (int i = 0; i < st->nstate; off += st->state_n[i], i++)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(q, st->state[0][i], CL_TRUE, 0, st->state_n[i] * sizeof(float),
                                               p->ssum[key] + off, 0, NULL, NULL));
    return CLG_OK;
}

// ---- the step ----

static clg_status stage_schedule(clg_pipe *p, clg_pipe_stage *st)
{
    clg_err *err = clg_dev_err(st->dev);
    st->res[0] = st->res[1] = 0;
    for (int k = 0; k < st->nreps; k++)
        st->last_fwd[k] = -1;
    st->nrecompute = 0;
    st->inflight = 0;
    for (int m = 0; m < p->M; m++)
        st->slot_of[m] = -1;
    for (int k = 0; k < st->nreps; k++) /* an abandoned step's in-place receives */
        recv_home(p, st, k);
    CLG_CL_CHECK(err, clFinish(st->dev->queue)); /* nothing left of an abandoned step reads the host rows */
    if (st->reads_input)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(st->dev->queue, st->xbuf, CL_TRUE, 0,
                                               (size_t)p->n * p->sample * sizeof(float), p->x, 0, NULL, NULL));
    if (st->has_loss)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(st->dev->queue, st->ybuf, CL_TRUE, 0, (size_t)p->n * sizeof(int32_t),
                                               p->y, 0, NULL, NULL));
    int nb = 0;
    st->t_wait = 0;
    for (int t = 0; t < 2 * p->nm; t++) {
        int bwd, m;
        schedule_op(p, st->s, t, &bwd, &m);
        double t0 = clg_now_sec();
        if (bwd)
            CLG_TRY(stage_backward(p, st, m, nb++ == 0));
        else
            CLG_TRY(stage_forward(p, st, m));
        trace_span(p, st->index, bwd ? "backward" : "forward", m, t0);
    }
    if (st->nwd) { /* the deferred weight gradients over the step's samples */
        double t0 = clg_now_sec();
        CLG_TRY(clg_pipe_wdefer_finish(p, st));
        trace_span(p, st->index, "weight gradients", p->nm, t0);
    }
    CLG_TRY(state_copy(st, st->state_rep, 0)); /* the latest running statistics into reps[0] */
    st->state_rep = 0;
    if (p->D > p->T || p->hy)
        CLG_TRY(reduce_replicas(p, st));
    if (st->rep->arena_bytes) {
        CLG_CL_CHECK(err, clEnqueueCopyBuffer(st->dev->queue, st->gacc, st->rep->garena, 0, 0, st->rep->arena_bytes,
                                              0, NULL, NULL));
        st->norm_sq = 0;
        st->overflow = 0;
        if (p->fp16) /* dynamic loss scaling: the gradient unscaled, an inf / NaN flagged (the step is skipped) */
            CLG_TRY(clg_optim_unscale_check(st->opt, p->inv_loss_scale, &st->overflow));
        if (p->T > 1) /* pp x tp: row-split biases, the norm's share */
            CLG_TRY(clg_pptp_grads(p, st, p->clip_norm > 0));
        if (p->clip_norm > 0 && !st->overflow && p->T == 1) {
            double norm = 0;
            CLG_TRY(clg_optim_grad_norm(st->opt, 1.0f, &norm));
            st->norm_sq = norm * norm;
        }
    }
    CLG_CL_CHECK(err, clFinish(st->dev->queue));
    for (int m = 0; m < p->nm && st->has_loss; m++) { /* in micro-batch order */
        st->res[0] += st->lres[2 * m];
        st->res[1] += st->lres[2 * m + 1];
    }
    st->t_end = clg_now_sec();
    return CLG_OK;
}

static clg_status stage_update(clg_pipe *p, clg_pipe_stage *st)
{
    if (!st->rep->arena_bytes)
        return CLG_OK;
    clg_status rc = clg_optim_step(st->opt, p->lr, p->gscale);
    if (p->zero) /* sharded state: the replicas' updated parts gathered */
        rc = clg_pipe_zero_gather(p, st, rc);
    if (rc == CLG_OK)
        rc = stage_spread(st);
    if (rc == CLG_OK)
        rc = clFinish(st->dev->queue) == CL_SUCCESS ? CLG_OK
                                                    : clg_err_set(clg_dev_err(st->dev), CLG_ERR_OPENCL,
                                                                  "clFinish after the optimizer failed");
    return rc;
}

/* The update needs nothing from the other stages but their success (no clipping norm, no fp16 overflow check, no
 * sums over replicas or ranks): each stage updates as soon as every schedule has ended, in the same job. */
static int update_in_step(const clg_pipe *p, double clip_norm)
{
    return clip_norm <= 0 && !p->fp16 && p->T == 1 && p->D == 1 && !p->hy && !p->zero;
}

/* Waits until every stage's schedule ended (1) or one failed (0). */
static int schedules_ended(clg_pipe *p)
{
    pthread_mutex_lock(&p->mu);
    p->ended++;
    pthread_cond_broadcast(&p->cv);
    while (p->ended < p->L && !p->abort)
        pthread_cond_wait(&p->cv, &p->mu);
    int ok = !p->abort;
    pthread_mutex_unlock(&p->mu);
    return ok;
}

static clg_status stage_fn(void *arg, int s)
{
    clg_pipe *p = arg;
    clg_pipe_stage *st = &p->st[s];
    double c0 = clg_thread_cpu_sec();
    if (p->phase == 1) {
        clg_status rc = stage_update(p, st);
        st->cpu_sum += p->seq > 1 ? clg_thread_cpu_sec() - c0 : 0;
        return rc;
    }
    clg_status rc = stage_schedule(p, st);
    if (rc == CLG_OK && p->phase == 2 && schedules_ended(p)) /* no stage updates when one failed */
        rc = stage_update(p, st);
    if (p->seq > 1) { /* the first step measures and compiles */
        st->cpu_sum += clg_thread_cpu_sec() - c0;
        st->cpu_n++;
    }
    if (rc != CLG_OK)
        clg_fail_once(&p->mu, &p->cv, &p->abort, &p->fail_stage, &p->fail_status, s, rc);
    if (rc != CLG_OK && p->tpg) /* its tensor-parallel partners' all-reduces woken */
        clg_tp_group_abort(p->tpg, 1);
    return rc;
}

static clg_status stage_failed(clg_pipe *p, clg_status rc, int s)
{
    const clg_pipe_stage *st = &p->st[s];
    char rep[64] = "", where[256];
    if (p->T > 1)
        snprintf(rep, sizeof rep, ", tensor lane %d of replica %d", st->d % p->T, st->d / p->T);
    else if (p->D > 1)
        snprintf(rep, sizeof rep, " of replica %d", st->d);
    snprintf(where, sizeof where, "pipeline stage %d%s (layers %s..%s)", st->s, rep, p->net->proto[st->first].name,
             p->net->proto[st->last].name);
    return clg_fail_report(&p->ctx->err, rc, where, st->dev);
}

clg_status clg_pipe_train_step(clg_pipe *p, const clg_hparams *hp, const float *x, const int32_t *y, int n,
                               double lr, float grad_scale, double clip_norm, uint32_t seed, uint32_t step,
                               float *res)
{
    int Dd = p->D / p->T; /* data replicas (pp x tp: each over T copies that take the same samples) */
    if (n < Dd || n > p->mb * p->M * Dd)
        return clg_err_set(&p->ctx->err, CLG_ERR_INVALID_ARG, "pipeline step: %d samples (%d to %d)", n, Dd,
                           p->mb * p->M * Dd);
    for (int s = 0; s < p->L; s++)
        if (!p->st[s].opt)
            CLG_TRY(clg_pipe_zero_optim(p, s, hp)); /* sharded (pipe_zero.c) or whole */
    CLG_TRY(reduce_setup(p)); /* MPI (hy set after creation): the host sums */
    /* replica d takes samples [o_d, o_d + n_d) (sizes differ by at most one), in nm micro-batches */
    p->nm = CLG_MIN(p->M, n / Dd);
    for (int d = 0, o = 0; d < p->D; d++) {
        int dd = d / p->T, nd = n / Dd + (dd < n % Dd);
        p->rcnt[d] = nd;
        o = d % p->T ? o - nd : o; /* the T copies of a data replica: its samples again */
        for (int m = 0; m < p->nm; m++) {
            p->cnt[d][m] = nd / p->nm + (m < nd % p->nm);
            p->off[d][m] = o;
            o += p->cnt[d][m];
        }
    }
    if (p->tpg)
        clg_tp_group_abort(p->tpg, 0);
    p->x = x;
    p->y = y;
    p->n = n;
    p->lr = lr;
    p->grad_scale = grad_scale;
    p->clip_norm = clip_norm;
    p->seed = seed;
    p->step = step;
    p->abort = 0;
    p->fail_stage = -1;
    p->seq++;
    p->phase = update_in_step(p, clip_norm) ? 2 : 0; /* 2: the schedule and the update in one job */
    p->ended = 0;
    p->gscale = 1.0f;
    int failed = -1;
    double t0 = clg_now_sec();
    clg_status rc = clg_team_run(p->team, stage_fn, p, &failed);
    if (rc != CLG_OK)
        return p->fail_stage >= 0 ? stage_failed(p, p->fail_status, p->fail_stage) : stage_failed(p, rc, failed);
    double wall = clg_now_sec() - t0, idle = 0; /* bubble: idle share of the stages over the schedule's wall time */
    for (int s = 0; s < p->L && p->phase == 2; s++) /* the job held the update too: up to the last schedule's end */
        wall = s ? CLG_MAX(wall, p->st[s].t_end - t0) : p->st[s].t_end - t0;
    for (int s = 0; s < p->L; s++)
        idle += p->st[s].t_wait + (t0 + wall - p->st[s].t_end);
    if (wall > 0) {
        p->bubble_sum += idle / (p->L * wall);
        p->bubble_n++;
    }
    if (res) {
        res[0] = res[1] = 0;
        for (int d = 0; d < p->D; d += p->T) { /* pp x tp: lane t = 0's */
            res[0] += p->st[d * p->K + p->K - 1].res[0];
            res[1] += p->st[d * p->K + p->K - 1].res[1];
        }
    }
    double sq = 0; /* the replicas hold the same (summed) gradients: replica 0's stages (pp x tp: its T lanes) */
    p->overflow = 0;
    for (int s = 0; s < p->K * p->T; s++) {
        sq += p->st[s].norm_sq;
        p->overflow |= p->st[s].overflow;
    }
    if (p->overflow || p->phase == 2) /* fp16: no stage updates (the caller lowers the loss scale); or updated */
        return CLG_OK;
    double norm = sqrt(sq);
    if (!isfinite(norm))
        return clg_err_set(&p->ctx->err, CLG_ERR_INTERNAL,
                           "gradient norm is not finite at step %u (diverged: lower the learning rate)", step);
    p->gscale = 1.0f;
    if (clip_norm > 0 && norm > clip_norm)
        p->gscale = (float)(clip_norm / norm);
    p->phase = 1;
    rc = clg_team_run(p->team, stage_fn, p, &failed);
    if (rc != CLG_OK)
        return stage_failed(p, rc, failed);
    return CLG_OK;
}

// ---- the whole model on one replica (checkpoints, evaluation) ----

/* Copies n floats between buffers of two devices through the host (offsets in floats). */
static clg_status copy_between(clg_device *sd, cl_mem src, size_t so, clg_device *dd, cl_mem dst, size_t doff,
                               size_t n, float *tmp)
{
    CLG_CL_CHECK(clg_dev_err(sd), clEnqueueReadBuffer(sd->queue, src, CL_TRUE, so * sizeof(float), n * sizeof(float),
                                                      tmp, 0, NULL, NULL));
    CLG_CL_CHECK(clg_dev_err(dd), clEnqueueWriteBuffer(dd->queue, dst, CL_TRUE, doff * sizeof(float),
                                                       n * sizeof(float), tmp, 0, NULL, NULL));
    return CLG_OK;
}

/* Index of ref's parameter among o's (its replica's trainable list), -1 when absent. */
static int optim_index(const clg_optim *o, int layer, int slot)
{
    for (int i = 0; o && i < o->n; i++)
        if (o->refs[i].layer->index == layer && o->refs[i].param - o->refs[i].layer->params == slot)
            return i;
    return -1;
}

/* One parameter (value and optimizer state) between the full replica (of the caller's net) and its stage; a
 * layer cut inside: its leading rows with L@0's stage, the rest with L@1's. */
static clg_status sync_param(clg_pipe *p, clg_replica *full, clg_optim *fo, const clg_param_ref *ref, int to_full,
                             int d, float *tmp)
{
    int ui = ref->layer->index, slot = (int)(ref->param - ref->layer->params);
    int split = p->split_layer >= 0 && ui == p->split_layer, C = ref->layer->out_shape[1];
    size_t numel = ref->param->numel, n0 = split ? numel / (size_t)C * (size_t)p->split_c : numel;
    for (int part = 0; part < 1 + split; part++) {
        int li = p->split_layer >= 0 && ui >= p->split_layer ? ui + (ui == p->split_layer ? part : 2) : ui;
        size_t foff = part ? n0 : 0, n = part ? numel - n0 : n0;
        clg_pipe_stage *st = &p->st[d * p->K + p->stage_of[li]];
        clg_param_ref sref = {&st->rep->layers[li], &st->rep->layers[li].params[slot]};
        cl_mem sv = clg_replica_master(st->rep, &sref), fv = clg_replica_master(full, ref); /* fp16: fp32 masters */
        clg_device *a = to_full ? st->dev : full->dev, *b = to_full ? full->dev : st->dev;
        CLG_TRY(to_full ? copy_between(a, sv, 0, b, fv, foff, n, tmp) : copy_between(a, fv, foff, b, sv, 0, n, tmp));
        if (!ref->param->trainable || !fo || !st->opt)
            continue;
        int fi = optim_index(fo, ui, slot), si = optim_index(st->opt, li, slot);
        if (p->zero && fi >= 0 && si >= 0) /* sharded: the parts of every replica (pipe_zero.c; no split layer) */
            return clg_pipe_zero_state(p, fo, fi, li, slot, to_full, d, tmp);
        for (int k = 0; fi >= 0 && si >= 0 && k < clg_optim_nstate(fo); k++) {
            cl_mem fm = k == 0 ? fo->m[fi] : fo->v[fi], sm = k == 0 ? st->opt->m[si] : st->opt->v[si];
            if (fm && sm)
                CLG_TRY(to_full ? copy_between(a, sm, 0, b, fm, foff, n, tmp)
                                : copy_between(a, fm, foff, b, sm, 0, n, tmp));
        }
    }
    return CLG_OK;
}

/* A cut inside a layer: its parameters as one device draws them (a replica of that layer alone from seed),
 * scattered to L@0 and L@1 of every replica's stages (which drew theirs for the split shapes). */
static clg_status split_init(clg_pipe *p, uint64_t seed)
{
    clg_replica *r = NULL;
    CLG_TRY(clg_replica_create_range(p->user_net, p->st[0].dev, seed, p->split_layer, p->split_layer, 1, &r));
    clg_param_ref *refs = NULL;
    int n = 0;
    clg_status st = clg_replica_params(r, 0, &refs, &n);
    size_t most = 1;
    for (int i = 0; i < n && st == CLG_OK; i++)
        most = CLG_MAX(most, refs[i].param->numel);
    float *tmp = st == CLG_OK ? malloc(most * sizeof(float)) : NULL;
    if (st == CLG_OK && !tmp)
        st = clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    for (int d = 0; d < p->D; d++)
        for (int i = 0; i < n && st == CLG_OK; i++)
            if (refs[i].layer->index == p->split_layer)
                st = sync_param(p, r, NULL, &refs[i], 0, d, tmp);
    free(tmp);
    free(refs);
    clg_replica_free(r);
    return st;
}

clg_status clg_pipe_loaded(clg_pipe *p)
{
    for (int s = 0; s < p->L; s++) {
        CLG_TRY(clg_replica_weights_updated(p->st[s].rep));
        CLG_TRY(stage_spread(&p->st[s]));
    }
    return CLG_OK;
}

clg_status clg_pipe_ensure_optim(clg_pipe *p, const clg_hparams *hp)
{
    for (int s = 0; s < p->L; s++)
        if (!p->st[s].opt)
            CLG_TRY(clg_pipe_zero_optim(p, s, hp)); /* sharded (pipe_zero.c) or whole */
    return CLG_OK;
}

clg_status clg_pipe_sync(clg_pipe *p, clg_replica *full, clg_optim *full_opt, const clg_hparams *hp, int to_full)
{
    if (full_opt) /* the state goes both ways: every stage has its optimizer */
        CLG_TRY(clg_pipe_ensure_optim(p, hp));
    clg_param_ref *refs = NULL;
    int n = 0;
    CLG_TRY(clg_replica_params(full, 0, &refs, &n));
    size_t most = 1;
    for (int i = 0; i < n; i++)
        most = CLG_MAX(most, refs[i].param->numel);
    float *tmp = malloc(most * sizeof(float));
    clg_status st = tmp ? CLG_OK : clg_err_set(&p->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    if (p->T > 1 && st == CLG_OK) /* pp x tp: the lanes' slices */
        st = clg_pptp_sync(p, full, full_opt, to_full);
    for (int d = 0; d < (to_full ? 1 : p->D) && p->T == 1; d++) /* from replica 0; into every replica */
        for (int i = 0; i < n && st == CLG_OK; i++)
            st = sync_param(p, full, full_opt, &refs[i], to_full, d, tmp);
    free(tmp);
    free(refs);
    if (st == CLG_OK && full_opt && to_full)
        full_opt->t = p->st[0].opt->t;
    for (int s = 0; s < p->L && st == CLG_OK && full_opt && !to_full; s++)
        p->st[s].opt->t = full_opt->t;
    if (st == CLG_OK && to_full)
        st = clg_replica_weights_updated(full);
    for (int s = 0; s < p->L && st == CLG_OK && !to_full; s++) {
        st = clg_replica_weights_updated(p->st[s].rep);
        if (st == CLG_OK)
            st = stage_spread(&p->st[s]);
    }
    return st;
}

// ---- forward only (evaluation, predict, the save check) ----

/* Chunk [o, o + n) of the step's samples through the stages of replica 0 in
 * order on the calling thread: each stage's first replica runs its layers
 * (training = 0: dropout off, batch norm on its running statistics), the
 * tensors crossing a cut go through host memory. */
static clg_status forward_chunk(clg_pipe *p, const int32_t *y, int o, int n, float *res, float *out, size_t out_w,
                                int *fs)
{
    for (int s = 0; s < p->K; s++) {
        clg_pipe_stage *st = &p->st[s];
        *fs = s;
        clg_replica *r = st->rep;
        clg_err *err = clg_dev_err(st->dev);
        cl_command_queue q = st->dev->queue;
        if (st->reads_input)
            clg_replica_set_input(r, st->xbuf, (size_t)o * p->sample);
        if (st->has_loss)
            clg_replica_set_labels(r, st->ybuf, y ? (size_t)o : 0, 1.0f);
        for (int k = 0; k < p->nedges; k++) { /* the entering tensors (the queue finishes before hf changes) */
            const clg_pipe_edge *e = &p->edges[k];
            const clg_tensor *a = &r->act[e->at];
            if (e->to == s)
                CLG_TRY(host_rows(err, q, 0, a->mem, a->off, e->pitch, e->hf, e->fps, n, p->esize));
        }
        CLG_TRY(clg_replica_forward(r, n, 0));
        for (int k = 0; k < p->nedges; k++) { /* the leaving ones */
            const clg_pipe_edge *e = &p->edges[k];
            const clg_tensor *a = &r->act[e->tensor];
            if (e->from == s)
                CLG_CL_CHECK(err, clEnqueueReadBuffer(q, a->mem, CL_TRUE, a->off * p->esize,
                                                      (size_t)n * e->fps * p->esize, e->hf, 0, NULL, NULL));
        }
        if (st->has_loss && res) {
            float lr[2];
            CLG_CL_CHECK(err, clEnqueueReadBuffer(q, r->layers[r->loss_index].loss.result, CL_TRUE, 0, sizeof lr, lr,
                                                  0, NULL, NULL));
            res[0] += lr[0];
            res[1] += lr[1];
        }
        if (s == p->K - 1 && out) {
            const clg_tensor *a = &r->act[r->nlayers - 1];
            CLG_CL_CHECK(err, clEnqueueReadBuffer(q, a->mem, CL_TRUE, a->off * sizeof(float),
                                                  (size_t)n * out_w * sizeof(float), out + (size_t)o * out_w, 0, NULL,
                                                  NULL));
        }
        CLG_CL_CHECK(err, clFinish(q));
    }
    return CLG_OK;
}

clg_status clg_pipe_forward(clg_pipe *p, const float *x, const int32_t *y, int n, float *res, float *out)
{
    int B = p->mb * p->M * p->D;
    for (int s = 0; s < p->L; s++) /* an abandoned step's in-place receives */
        for (int k = 0; k < p->st[s].nreps; k++)
            recv_home(p, &p->st[s], k);
    if (p->T > 1) /* the T lanes of a stage would have to run side by side: a whole replica evaluates */
        return clg_err_set(&p->ctx->err, CLG_ERR_UNSUPPORTED, "pipeline forward with tp=%d: evaluate on a "
                                                              "whole-network replica (clg_pipe_sync)", p->T);
    if (n < 1 || n > B)
        return clg_err_set(&p->ctx->err, CLG_ERR_INVALID_ARG, "pipeline forward: %d samples (1 to %d)", n, B);
    if (res)
        res[0] = res[1] = 0;
    const clg_pipe_stage *last = &p->st[p->K - 1];
    const clg_tensor *o = &last->rep->act[last->rep->nlayers - 1];
    size_t out_w = (size_t)o->c * o->h * o->w;
    clg_status rc = CLG_OK;
    for (int s = 0; s < p->K && rc == CLG_OK; s++) { /* the batch onto the stages that read it */
        clg_pipe_stage *st = &p->st[s];
        clg_err *err = clg_dev_err(st->dev);
        cl_int e = CL_SUCCESS;
        if (st->reads_input)
            e = clEnqueueWriteBuffer(st->dev->queue, st->xbuf, CL_TRUE, 0, (size_t)n * p->sample * sizeof(float), x,
                                     0, NULL, NULL);
        if (e == CL_SUCCESS && st->has_loss && y)
            e = clEnqueueWriteBuffer(st->dev->queue, st->ybuf, CL_TRUE, 0, (size_t)n * sizeof(int32_t), y, 0, NULL,
                                     NULL);
        if (e != CL_SUCCESS)
            rc = clg_cl_fail(err, e, "clEnqueueWriteBuffer (pipeline forward)", __FILE__, __LINE__);
        else if (st->has_loss && !y) /* labels of 0: the loss is computed and not reported */
            rc = clg_buf_fill(st->dev, st->ybuf, 0, (size_t)p->mb, 0.0f);
        if (rc != CLG_OK)
            return stage_failed(p, rc, s);
    }
    for (int o0 = 0; o0 < n; o0 += p->mb) {
        int c = CLG_MIN(p->mb, n - o0);
        int fs = 0;
        rc = forward_chunk(p, y, o0, c, y ? res : NULL, out, out_w, &fs);
        if (rc != CLG_OK)
            return stage_failed(p, rc, fs);
    }
    return CLG_OK;
}
