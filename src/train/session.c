/* Training session: lanes + host staging + checkpoints + eval (see session.h). */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/cfg.h"
#include "model/layers.h"
#include "ops/conv.h"
#include "parallel/comm.h"
#include "parallel/hybrid.h"
#include "parallel/pipe_zero.h"
#include "parallel/tensor.h"
#include "train/session.h"

int clg_precision_parse(const char *name)
{
    if (!name || strcmp(name, "fp32") == 0)
        return 0;
    if (strcmp(name, "fp16") == 0)
        return 1;
    return -1;
}

/* The core FNV-1a of s without its terminator, chained on h (the model hash
 * separates its pieces with "[", "]", "=" and newlines). */
static uint64_t hash_piece(uint64_t h, const char *s) { return clg_hash64(s, strlen(s), h); }

static int kv_cmp(const void *a, const void *b)
{
    return strcmp((*(const clg_cfg_kv *const *)a)->key, (*(const clg_cfg_kv *const *)b)->key);
}

clg_status clg_model_hash(clg_err *err, const char *text, const char *source, char out[17])
{
    static const char *const net_keys[] = {"channels", "height", "width", "classes"};
    clg_cfg *cfg = NULL;
    CLG_TRY(clg_cfg_parse(err, text, source, &cfg));
    uint64_t h = CLG_HASH_SEED;
    clg_status st = CLG_OK;
    for (int i = 0; i < cfg->nsec && st == CLG_OK; i++) {
        const clg_cfg_section *sec = &cfg->sec[i];
        int is_net = strcmp(sec->name, "net") == 0;
        const clg_cfg_kv **kv = malloc((size_t)CLG_MAX(sec->nkv, 1) * sizeof *kv);
        if (!kv) {
            st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
            break;
        }
        int n = 0;
        for (int k = 0; k < sec->nkv; k++) {
            int keep = !is_net;
            for (size_t j = 0; is_net && j < CLG_ARRAY_LEN(net_keys); j++)
                keep |= strcmp(sec->kv[k].key, net_keys[j]) == 0;
            if (keep)
                kv[n++] = &sec->kv[k];
        }
        qsort(kv, (size_t)n, sizeof *kv, kv_cmp);
        h = hash_piece(hash_piece(hash_piece(h, "["), sec->name), "]\n");
        for (int k = 0; k < n; k++)
            h = hash_piece(hash_piece(hash_piece(hash_piece(h, kv[k]->key), "="), kv[k]->value), "\n");
        free(kv);
    }
    clg_cfg_free(cfg);
    snprintf(out, 17, "%016" PRIx64, h);
    return st;
}

/* Tensor parallelism: the lanes over the devices and one lane on the first for checkpoints and evaluation (a
 * stub, made whole only for them, as a pipeline's). */
static clg_status create_tp(clg_model *m, const int *devs, int ndev, const clg_dp_params *dpp)
{
    clg_err *err = &m->ctx->err;
    int T = dpp->pipe->tensor;
    int D = CLG_MAX(dpp->pipe->replicas, 1);
    if (ndev != D * T)
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "%stp=%d needs %d devices, %d selected (dp x pp x tp must equal the device count)",
                           D > 1 ? "dp x " : "", T, D * T, ndev);
    clg_dp_params one = *dpp; /* the lane's replica: a stub until a checkpoint or an evaluation (pipe_lane_whole) */
    one.pipe = NULL;
    one.stub_lanes = 1;
    CLG_TRY(clg_dp_create(m->ctx, m->net, devs, 1, m->seed, &one, &m->dp));
    CLG_TRY(clg_tp_create(m->ctx, m->net, devs, ndev, T, D, m->seed, &m->tp));
    if (dpp->shard_optimizer) /* each slice's state over its D lanes */
        CLG_TRY(clg_tp_shard(m->tp));
    /* MPI ranks: the outer data-parallel level, a channel per slice (hybrid.h) */
    CLG_TRY(clg_hybrid_create(err, T, "tensor-parallel slice", &m->hy));
    m->tp->hy = m->hy;
    return CLG_OK;
}

/* The data-parallel lanes, or a pipeline over the devices and one lane on
 * the first for checkpoints and evaluation. */
static clg_status create_lanes(clg_model *m, const int *devs, int ndev, const clg_dp_params *dpp)
{
    if (dpp && dpp->pipe && dpp->pipe->tensor > 1 && dpp->pipe->stages <= 1)
        return create_tp(m, devs, ndev, dpp);
    if (!dpp || !dpp->pipe || dpp->pipe->stages <= 1)
        return clg_dp_create(m->ctx, m->net, devs, ndev, m->seed, dpp, &m->dp);
    if (dpp->pipe->tensor > 1 && dpp->shard_optimizer) /* pp x tp (pptp.h) */
        return clg_err_set(&m->ctx->err, CLG_ERR_UNSUPPORTED, "pipeline x tensor parallelism (pp=%d,tp=%d) with "
                                                              "--shard-optimizer is not supported yet",
                           dpp->pipe->stages, dpp->pipe->tensor);
    clg_pipe_params pp = *dpp->pipe;
    pp.whole_layers |= dpp->shard_optimizer != 0; /* sharded state keeps whole layers (pipe_zero.c) */
    CLG_TRY(clg_pipe_create(m->ctx, m->net, devs, ndev, m->seed, m->net->batch, &pp, &m->pipe));
    if (dpp->shard_optimizer) /* each stage's state over its dp replicas (nothing without dp: a stage's state is
                                 already its layers' alone) */
        CLG_TRY(clg_pipe_zero_setup(m->pipe));
    /* MPI ranks: the outer data-parallel level, a channel per stage (hybrid.h) */
    CLG_TRY(clg_hybrid_create(&m->ctx->err, m->pipe->K, "pipeline stage", &m->hy));
    m->pipe->hy = m->hy;
    clg_dp_params one = *dpp; /* the lane's replica: a stub until a checkpoint or an evaluation (pipe_lane_whole) */
    one.stub_lanes = 1;
    return clg_dp_create(m->ctx, m->net, devs, 1, m->seed, &one, &m->dp);
}

clg_status clg_session_pipe_params(clg_err *err, const char *parallel, const char *stages, int microbatches,
                                   const char *schedule, int recompute, clg_pipe_params *pp)
{
    memset(pp, 0, sizeof *pp);
    char rest[256];
    int tdp = 1;
    CLG_TRY(clg_tp_parse_layout(err, parallel, &pp->tensor, &tdp, rest, sizeof rest));
    CLG_TRY(clg_pipe_parse_layout(err, rest, &pp->stages, pp->tensor > 1 ? NULL : &pp->replicas));
    if (pp->tensor > 1)
        pp->replicas = tdp; /* dp x tp, dp x pp x tp: data-parallel groups of tp lanes (pipelines) */
    pp->schedule = clg_pipe_schedule_parse(schedule);
    if (pp->schedule < 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "unknown pipeline schedule '%s' (1f1b or gpipe)", schedule);
    if (microbatches < 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "microbatches %d: must be positive", microbatches);
    if (pp->stages == 1 && (microbatches > 0 || (stages && *stages)))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "micro-batches and stage cuts need a pipeline (pp=K, K >= 2)");
    pp->micro = microbatches; /* 0: clg_pipe_create's default */
    pp->recompute = recompute != 0;
    pp->cuts = stages;
    return CLG_OK;
}

/* A pipeline with a cut inside a layer: checkpoints go through the whole-network lane (which gathers the split
 * layer's slices), as with tensor parallelism, not straight from the stages. */
static int pipe_split(const clg_model *m) { return m->pipe && (m->pipe->split_net || m->pipe->T > 1); }

/* Swaps lane 0's replica for r (its optimizer, made for the old one, freed). */
static void lane_swap(clg_model *m, clg_replica *r)
{
    clg_lane *l = &m->dp->lanes[0];
    (void)clg_dp_finish(m->dp);
    clg_optim_free(l->opt);
    l->opt = NULL;
    r->after_layer = l->rep->after_layer; /* clg_dp_create's hook */
    r->after_layer_user = l->rep->after_layer_user;
    clg_replica_free(l->rep);
    l->rep = r;
    m->pipe_stale = 3;
    m->tp_stale = 3;
}

/* Pipeline: lane 0's replica made the whole network (from the stub
 * create_lanes gives it), for a checkpoint or an evaluation. */
static clg_status pipe_lane_whole(clg_model *m)
{
    if ((!m->pipe && !m->tp) || m->lane_whole)
        return CLG_OK;
    clg_replica *r = NULL;
    CLG_TRY(clg_replica_create(m->net, m->dp->lanes[0].dev, m->seed, &r));
    lane_swap(m, r);
    m->lane_whole = 1;
    return CLG_OK;
}

/* Pipeline: lane 0's whole-network replica (and optimizer state) freed,
 * back to the stub: the stages hold the authoritative weights and state, so
 * that the first device holds the whole network only while a checkpoint is
 * written or read or an evaluation runs. Failing to make the stub keeps the
 * whole replica (correct, only larger). */
static void pipe_lane_release(clg_model *m)
{
    if ((!m->pipe && !m->tp) || !m->lane_whole)
        return;
    clg_replica *r = NULL;
    (void)clg_dp_finish(m->dp);
    if (clg_replica_create_range(m->net, m->dp->lanes[0].dev, m->seed, m->net->nlayers - 1, m->net->nlayers - 1,
                                 m->net->batch, &r) != CLG_OK)
        return;
    lane_swap(m, r);
    m->lane_whole = 0;
}

clg_status clg_session_pipe_gather(clg_model *m, int with_state)
{
    int need = with_state ? 3 : 1;
    if (m->tp)
        CLG_TRY(pipe_lane_whole(m));
    if (m->tp && (m->tp_stale & need)) { /* the lanes' slices into the whole-network lane */
        if (with_state)
            CLG_TRY(clg_dp_ensure_optim(m->dp, &m->hp));
        CLG_TRY(clg_tp_sync(m->tp, clg_session_rep(m), with_state ? m->dp->lanes[0].opt : NULL, &m->hp, 1));
        m->tp_stale &= ~need;
    }
    if (!m->pipe)
        return CLG_OK;
    CLG_TRY(pipe_lane_whole(m));
    if (!(m->pipe_stale & need))
        return CLG_OK;
    if (with_state)
        CLG_TRY(clg_dp_ensure_optim(m->dp, &m->hp));
    CLG_TRY(clg_pipe_sync(m->pipe, clg_session_rep(m), with_state ? m->dp->lanes[0].opt : NULL, &m->hp, 1));
    m->pipe_stale &= ~need;
    return CLG_OK;
}


clg_status clg_session_create(clg_ctx *ctx, const char *devices, int device, const char *text, const char *source,
                              int batch,
                              uint64_t seed, int fp16, const clg_dp_params *dpp, clg_model **out)
{
    *out = NULL;
    clg_err *err = ctx ? &ctx->err : NULL;
    if (!ctx)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "no context");
    int devs[CLG_DP_MAX_LANES], ndev = 0;
    CLG_TRY(clg_dp_select(ctx, devices, device, devs, &ndev));
    clg_model *m = calloc(1, sizeof *m);
    if (!m)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    m->ctx = ctx;
    m->seed = seed;
    m->fp16 = fp16 != 0;
    m->loss_scale = m->fp16 ? CLG_LS_INIT : 1.0;
    m->ls_interval = CLG_LS_INTERVAL;
    m->check_stage = -1;
    if (ctx->opts.fp16_scale_interval > 0) /* test aid: grow S sooner */
        m->ls_interval = (int)ctx->opts.fp16_scale_interval;
    clg_status st = clg_net_build(err, text, source, batch, &m->net);
    if (st == CLG_OK) {
        m->net->fp16 = m->fp16;
        m->hp = m->net->hp;
        clg_ds_norm_identity(&m->norm, m->net->in_c <= CLG_DS_MAX_CHANNELS ? m->net->in_c : CLG_DS_MAX_CHANNELS);
        st = create_lanes(m, devs, ndev, dpp);
    }
    int B = m->net ? m->net->batch : 0;
    size_t sample = m->net ? (size_t)m->net->in_c * m->net->in_h * m->net->in_w : 0;
    for (int s = 0; s < CLG_STAGES && st == CLG_OK; s++) {
        m->xhost[s] = malloc((size_t)B * sample * sizeof(float));
        m->yhost[s] = calloc((size_t)B * clg_net_labels_per_sample(m->net), sizeof(int32_t));
        if (!m->xhost[s] || !m->yhost[s])
            st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory for input staging");
    }
    if (st == CLG_OK)
        st = clg_model_hash(err, m->net->text, m->net->source, m->model_hash);
    if (st == CLG_OK && !(m->lane_res = calloc((size_t)2 * ndev, sizeof(float))))
        st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    if (st != CLG_OK) {
        clg_session_free(m);
        return st;
    }
    *out = m;
    return CLG_OK;
}

void clg_session_free(clg_model *m)
{
    if (!m)
        return;
    if (m->dp)
        m->dp->trace = NULL;
    if (m->pipe)
        m->pipe->trace = NULL;
    if (m->tp)
        m->tp->trace = NULL;
    clg_trace_free(m->trace);
    clg_pipe_free(m->pipe);
    clg_tp_free(m->tp);
    clg_hybrid_free(m->hy);
    clg_dp_free(m->dp);
    for (int s = 0; s < CLG_STAGES; s++) {
        free(m->xhost[s]);
        free(m->yhost[s]);
    }
    free(m->lane_res);
    clg_net_free(m->net);
    free(m);
}

clg_status clg_session_trace_open(clg_model *m, const char *path, int steps)
{
    clg_err *err = &m->ctx->err;
    char rpath[4200]; /* MPI: rank R > 0 writes PATH.rankR.json beside rank 0's PATH */
    size_t L = strlen(path);
    int json = L > 5 && strcmp(path + L - 5, ".json") == 0;
    if (clg_comm_rank() > 0)
        snprintf(rpath, sizeof rpath, "%.*s.rank%d%s", (int)(json ? L - 5 : L), path, clg_comm_rank(),
                 json ? ".json" : "");
    else
        snprintf(rpath, sizeof rpath, "%s", path);
    CLG_TRY(clg_trace_create(err, rpath, (int)CLG_MIN((int64_t)m->step + steps, INT32_MAX), &m->trace));
    if (m->tp) { /* a row per tensor-parallel lane */
        for (int l = 0; l < m->tp->L; l++)
            if (clg_trace_lane(m->trace, l, m->tp->ln[l].dev) != CLG_OK) {
                clg_trace_free(m->trace);
                m->trace = NULL;
                return clg_err_set(err, CLG_ERR_OPENCL, "trace: %s", m->tp->ln[l].dev->err.msg);
            }
        m->tp->trace = m->trace;
        return CLG_OK;
    }
    if (m->pipe) { /* a row per stage */
        for (int s = 0; s < m->pipe->L; s++)
            if (clg_trace_lane(m->trace, s, m->pipe->st[s].dev) != CLG_OK) {
                clg_trace_free(m->trace);
                m->trace = NULL;
                return clg_err_set(err, CLG_ERR_OPENCL, "trace: %s", m->pipe->st[s].dev->err.msg);
            }
        m->pipe->trace = m->trace;
        return CLG_OK;
    }
    for (int i = 0; i < m->dp->n; i++) {
        clg_status st = clg_trace_lane(m->trace, i, m->dp->lanes[i].dev);
        if (st != CLG_OK) {
            clg_trace_free(m->trace);
            m->trace = NULL;
            return clg_err_set(err, st, "trace: %s", m->dp->lanes[i].dev->err.msg);
        }
    }
    m->dp->trace = m->trace;
    return CLG_OK;
}

clg_status clg_session_trace_close(clg_model *m)
{
    if (!m->trace)
        return CLG_OK;
    clg_dp_finish(m->dp);
    m->dp->trace = NULL;
    if (m->pipe)
        m->pipe->trace = NULL;
    if (m->tp)
        m->tp->trace = NULL;
    clg_trace *t = m->trace;
    m->trace = NULL;
    return clg_trace_close(&m->ctx->err, t);
}

void clg_session_shares(const clg_model *m, char *buf, size_t cap, int *devices)
{
    if (m->tp) {
        *devices = m->tp->L;
        if (m->tp->D > 1)
            snprintf(buf, cap, "dp=%d,tp=%d", m->tp->D, m->tp->T);
        else
            snprintf(buf, cap, "tp=%d", m->tp->T);
        return;
    }
    if (!m->pipe) {
        *devices = m->dp->n;
        clg_dp_shares(m->dp, buf, cap);
        return;
    }
    *devices = m->pipe->K;
    *devices = m->pipe->L;
    char dp[16] = "", tp[16] = "";
    if (m->pipe->D / m->pipe->T > 1)
        snprintf(dp, sizeof dp, "dp=%d ", m->pipe->D / m->pipe->T);
    if (m->pipe->T > 1)
        snprintf(tp, sizeof tp, "tp=%d ", m->pipe->T);
    snprintf(buf, cap, "%spp=%d %sM=%d %s", dp, m->pipe->K, tp, m->pipe->M,
             m->pipe->schedule == CLG_PIPE_GPIPE ? "gpipe" : "1f1b");
}

void clg_session_devices(const clg_model *m, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < m->dp->n && used < cap; i++) {
        const clg_device *d = m->dp->lanes[i].dev;
        used += (size_t)snprintf(buf + used, cap - used, "%s%d:%s", i ? ", " : "", d->index, d->info.name);
    }
}

clg_status clg_session_ensure_optim(clg_model *m)
{
    if (clg_session_rep(m)->loss_index < 0)
        return clg_err_set(&m->ctx->err, CLG_ERR_UNSUPPORTED,
                           "%s: the model has no loss layer (softmax or mse): it cannot be trained", m->net->source);
    if (m->pipe || m->tp) /* the stages (lanes) create theirs at the first step; the whole-network lane's only when
                             a checkpoint or an evaluation copies them into it (clg_session_pipe_gather) */
        return CLG_OK;
    return clg_dp_ensure_optim(m->dp, &m->hp);
}

int clg_session_mem_rows(const clg_model *m) { return m->pipe ? m->pipe->L : m->tp ? m->tp->L : m->dp->n; }

/* A pipeline's or tensor-parallel lanes' device row (out) plus the whole-network lane when it shares the device. */
static void add_whole_lane(const clg_model *m, const clg_device *dev, clg_dp_mem *out)
{
    if (dev != m->dp->lanes[0].dev)
        return;
    clg_dp_mem l;
    clg_dp_memory(m->dp, 0, &l);
    uint64_t total = out->params + out->optim + out->activations + out->workspace;
    out->params += l.params;
    out->optim += l.optim;
    out->activations += l.activations;
    uint64_t known = out->params + out->optim + out->activations;
    out->workspace = total > known ? total - known : 0;
}

void clg_session_memory(const clg_model *m, int i, clg_dp_mem *out, int *dev, int *stage)
{
    if (m->tp) {
        clg_tp_memory(m->tp, i, out);
        *dev = m->tp->ln[i].dev->index;
        *stage = -1;
        add_whole_lane(m, m->tp->ln[i].dev, out);
        return;
    }
    if (!m->pipe) {
        clg_dp_memory(m->dp, i, out);
        *dev = m->dp->lanes[i].dev->index;
        *stage = -1;
        return;
    }
    clg_pipe_memory(m->pipe, i, out);
    const clg_pipe_stage *st = &m->pipe->st[i];
    *dev = st->dev->index;
    *stage = st->s;
    add_whole_lane(m, st->dev, out);
}

clg_status clg_session_stage_wait(clg_model *m, int s) { return clg_dp_stage_wait(m->dp, s); }

clg_status clg_session_upload(clg_model *m, int s, int n, int with_labels)
{
    if (n < 1 || n > m->net->batch)
        return clg_err_set(&m->ctx->err, CLG_ERR_INVALID_ARG, "batch of %d samples outside [1, %d]", n,
                           m->net->batch);
    return clg_dp_upload(m->dp, s, m->xhost[s], with_labels ? m->yhost[s] : NULL, n);
}

clg_status clg_session_step_begin(clg_model *m, int s, double lr, float *res, cl_event *res_ev)
{
    CLG_TRY(clg_session_ensure_optim(m));
    clg_dp_job j;
    memset(&j, 0, sizeof j);
    j.stage = s;
    j.training = 1;
    j.lr = lr;
    /* loss gradient scale: 1 / global batch (times the fp16 loss scale S) */
    j.grad_scale = (float)(m->loss_scale / m->dp->total[s]);
    j.inv_loss_scale = (float)(1.0 / m->loss_scale);
    j.fp16 = m->fp16;
    j.clip_norm = m->hp.clip_norm;
    j.seed = (uint32_t)m->seed;
    j.step = (uint32_t)m->step;
    j.res = res;
    j.res_ev = res_ev;
    m->check_stage = s;
    m->check_labels = 1;
    int off = 0, mine = m->dp->total[s]; /* MPI: this rank's slice of the global batch (pipeline, tp) */
    clg_comm_slice(m->dp->total[s], &off, &mine);
    const float *xs = m->xhost[s] + (size_t)off * m->net->in_c * m->net->in_h * m->net->in_w;
    const int32_t *ys = m->yhost[s] + (size_t)off * clg_net_labels_per_sample(m->net);
    if (m->hy)
        m->hy->total = m->dp->total[s];
    if (m->tp) { /* synchronous, as a pipeline */
        pipe_lane_release(m);
        if (res_ev)
            res_ev[0] = NULL;
        m->tp_stale = 3;
        float r2[2] = {0, 0};
        m->tp->base = off;
        m->tp->inv_loss_scale = j.inv_loss_scale; /* fp16: an overflow is flagged in m->tp->overflow */
        clg_status st = clg_tp_train_step(m->tp, &m->hp, xs, ys, mine, lr, j.grad_scale, j.clip_norm, j.seed, j.step,
                                          r2);
        if (res)
            memcpy(res, r2, sizeof r2);
        return st;
    }
    if (m->pipe) { /* synchronous: every stage's work is done when it returns */
        pipe_lane_release(m);
        if (res_ev)
            res_ev[0] = NULL;
        m->pipe_stale = 3;
        float r2[2] = {0, 0};
        m->pipe->inv_loss_scale = j.inv_loss_scale; /* fp16: an overflow is flagged in m->pipe->overflow */
        m->pipe->base = off;
        clg_status st = clg_pipe_train_step(m->pipe, &m->hp, xs, ys, mine, lr, j.grad_scale, j.clip_norm, j.seed,
                                            j.step, r2);
        if (res)
            memcpy(res, r2, sizeof r2);
        return st;
    }
    clg_dp_train_begin(m->dp, &j);
    return CLG_OK;
}

void clg_session_explain_nonfinite(clg_model *m, char *buf, size_t cap)
{
    clg_lane *l = &m->dp->lanes[0];
    if (clg_session_pipe_gather(m, 0) != CLG_OK) /* a pipeline: the whole network on lane 0 */
        m->pipe_stale &= ~1;
    clg_replica_explain_nonfinite(l->rep, l->cnt[m->dp->job.stage], buf, cap);
}

clg_status clg_session_step_end(clg_model *m)
{
    clg_dp_job j;
    memset(&j, 0, sizeof j);
    if (!m->pipe)
        CLG_TRY(clg_dp_train_end(m->dp, &j));
    else
        j.overflow = m->fp16 && m->pipe->overflow;
    if (m->tp)
        j.overflow = m->fp16 && m->tp->overflow;
    if (j.overflow) {
        if (m->loss_scale <= CLG_LS_MIN) {
            char why[512];
            clg_session_explain_nonfinite(m, why, sizeof why);
            return clg_err_set(&m->ctx->err, CLG_ERR_INTERNAL,
                               "fp16: gradients are inf/NaN at step %" PRId64
                               " even with loss scale %g (diverged: lower the learning rate); %s",
                               m->step, m->loss_scale, why);
        }
        clg_log(2, "fp16: inf/NaN gradients at step %" PRId64 ": step skipped, loss scale %g -> %g", m->step,
                m->loss_scale, m->loss_scale / 2);
        m->loss_scale /= 2;
        m->ls_good = 0;
        m->ls_skipped++;
    } else if (m->fp16 && ++m->ls_good >= m->ls_interval) {
        if (m->loss_scale < CLG_LS_MAX)
            m->loss_scale *= 2;
        m->ls_good = 0;
    }
    m->step++;
    return CLG_OK;
}

/* res (may be NULL) = the lanes' {loss sum, correct} added up. */
static void sum_lanes(const clg_model *m, float *res)
{
    if (!res)
        return;
    res[0] = res[1] = 0;
    for (int i = 0; i < m->dp->n; i++) {
        res[0] += m->lane_res[2 * i];
        res[1] += m->lane_res[2 * i + 1];
    }
}

clg_status clg_session_train_step(clg_model *m, int s, double lr, float *res)
{
    CLG_TRY(clg_session_step_begin(m, s, lr, res ? m->lane_res : NULL, NULL));
    CLG_TRY(clg_session_step_end(m));
    sum_lanes(m, res);
    return CLG_OK;
}

/* Compiles what a training step launches, in another order than the step
 * (reverse: the optimizer first, then each layer's forward + backward from
 * the last layer to the first), then takes one real step with learning rate
 * 0 for the rest (reductions, norms). A background process runs this on a
 * cold cache while the training process takes its first step front to back
 * (PoCL compiles one kernel at a time per process): the two meet in the
 * middle, and each finds what the other compiled in the runtime's on-disk
 * kernel cache. The model's state is meaningless afterwards. */
clg_status clg_session_precompile(clg_model *m, int reverse)
{
    int B = m->net->batch;
    size_t sample = (size_t)m->net->in_c * m->net->in_h * m->net->in_w;
    memset(m->xhost[0], 0, (size_t)B * sample * sizeof(float));
    memset(m->yhost[0], 0, (size_t)B * clg_net_labels_per_sample(m->net) * sizeof(int32_t));
    CLG_TRY(clg_session_upload(m, 0, B, 1));
    if (m->pipe) /* the stages' kernels, front to back (no whole network on the first device) */
        return clg_session_rep(m)->loss_index >= 0 ? clg_session_train_step(m, 0, 0.0, NULL)
                                                   : clg_session_forward(m, 0, 0, NULL, NULL);
    int trains = clg_session_rep(m)->loss_index >= 0;
    if (trains)
        CLG_TRY(clg_session_ensure_optim(m));
    if (trains)
        CLG_TRY(clg_dp_ensure_optim(m->dp, &m->hp)); /* a pipeline's lane too */
    for (int i = 0; i < m->dp->n; i++) {
        clg_lane *l = &m->dp->lanes[i];
        clg_err *err = clg_dev_err(l->dev);
        if (trains && reverse)
            CLG_TRY(clg_optim_step(l->opt, 0.0, 1.0f));
        CLG_TRY(clg_lane_use_stage(l, 0, 1, 1.0f));
        if (l->cnt[0] > 0)
            CLG_TRY(clg_replica_precompile(l->rep, l->cnt[0], reverse));
        CLG_TRY(clg_lane_stage_release(l, 0));
        CLG_CL_CHECK(err, clFinish(l->dev->queue));
    }
    return trains ? clg_session_train_step(m, 0, 0.0, NULL) : CLG_OK;
}

clg_status clg_session_forward(clg_model *m, int s, int with_labels, float *res, float *out)
{
    const clg_tensor *o = clg_replica_output(clg_session_rep(m));
    clg_dp_job j;
    memset(&j, 0, sizeof j);
    j.stage = s;
    j.training = with_labels ? 0 : -1;
    j.res = res ? m->lane_res : NULL;
    j.out = out;
    j.out_w = (size_t)o->c * o->h * o->w;
    m->check_stage = s;
    m->check_labels = with_labels != 0;
    if (m->pipe && m->pipe->T > 1) /* pp x tp: the whole-network lane, with the lanes' weights */
        CLG_TRY(clg_session_pipe_gather(m, 0));
    else if (m->pipe) { /* the stages' forwards in order: no device holds the whole network; MPI: this rank's slice */
        int off = 0, mine = m->dp->total[s];
        clg_comm_slice(m->dp->total[s], &off, &mine);
        const float *xs = m->xhost[s] + (size_t)off * m->net->in_c * m->net->in_h * m->net->in_w;
        const int32_t *ys = with_labels ? m->yhost[s] + (size_t)off * clg_net_labels_per_sample(m->net) : NULL;
        return clg_pipe_forward(m->pipe, xs, ys, mine, res, out ? out + (size_t)off * j.out_w : NULL);
    }
    CLG_TRY(clg_dp_forward(m->dp, &j));
    sum_lanes(m, res);
    return CLG_OK;
}

// ---- checkpoints ----

static void param_name(char *dst, size_t n, const char *prefix, const clg_param_ref *r)
{
    snprintf(dst, n, "%s%s.%s", prefix, r->layer->name, r->param->name);
}

/* max_abs: the largest magnitude accepted (weights: CLG_SAVE_MAX_ABS; optimizer state: only finite).
 * opt_which > 0: the optimizer state of trainable parameter opt_i, gathered from the lanes (mem unused).
 * dev (may be NULL: the session's): mem is read on dev's queue (a pipeline stage's value or state). */
static clg_status add_device_tensor_x(clg_model *m, clg_ckpt *ck, const char *name, const clg_param *p, cl_mem mem,
                                      double max_abs, int opt_i, int opt_which, clg_device *dev)
{
    clg_err *err = &m->ctx->err;
    int64_t shape[4];
    for (int d = 0; d < p->ndim; d++)
        shape[d] = p->shape[d];
    void *data = NULL;
    if (p->ndim == 0) {
        shape[0] = (int64_t)p->numel;
        CLG_TRY(clg_ckpt_add(err, ck, name, CLG_CKPT_F32, 1, shape, NULL, &data));
    } else {
        CLG_TRY(clg_ckpt_add(err, ck, name, CLG_CKPT_F32, p->ndim, shape, NULL, &data));
    }
    if (opt_which > 0 && !dev)
        CLG_TRY(clg_dp_optim_state(m->dp, opt_i, opt_which, data, 0));
    else
        CLG_CL_CHECK(err, clEnqueueReadBuffer((dev ? dev : clg_session_dev(m))->queue, mem, CL_TRUE, 0,
                                              p->numel * sizeof(float), data, 0, NULL, NULL));
    const float *f = data;
    for (size_t k = 0; k < p->numel; k++) /* a diverged model never replaces a good file */
        if (!isfinite(f[k]))
            return clg_err_set(err, CLG_ERR_INTERNAL,
                               "not saving: tensor '%s' holds a non-finite value (%g at element %zu); the model "
                               "diverged (lower the learning rate)",
                               name, (double)f[k], k);
        else if (fabs((double)f[k]) > max_abs)
            return clg_err_set(err, CLG_ERR_INTERNAL,
                               "not saving: tensor '%s' holds %g at element %zu, beyond the %g a trained weight may "
                               "reach; the model diverged (lower the learning rate)",
                               name, (double)f[k], k, max_abs);
    return CLG_OK;
}

static clg_status add_device_tensor(clg_model *m, clg_ckpt *ck, const char *name, const clg_param *p, cl_mem mem,
                                    double max_abs)
{
    return add_device_tensor_x(m, ck, name, p, mem, max_abs, -1, 0, NULL);
}

/* A pipeline stage's optimizer state `which` (1, 2) of its trainable parameter i into the checkpoint (sharded:
 * gathered from the stage's replicas through a buffer on its device). */
static clg_status add_pipe_state(clg_model *m, clg_ckpt *ck, const char *name, clg_pipe_stage *sg, int i, int which)
{
    const clg_optim *o = sg->opt;
    if (!m->pipe->zero)
        return add_device_tensor_x(m, ck, name, o->refs[i].param, which == 1 ? o->m[i] : o->v[i], HUGE_VAL, i, 0,
                                   sg->dev);
    cl_mem b = NULL;
    CLG_TRY(clg_buf_alloc(sg->dev, CLG_MAX(o->refs[i].param->numel, 1) * sizeof(float), &b));
    clg_status st = clg_pipe_zero_buf(m->pipe, sg->index, i, which - 1, b, 1);
    if (st == CLG_OK)
        st = add_device_tensor_x(m, ck, name, o->refs[i].param, b, HUGE_VAL, i, 0, sg->dev);
    clg_buf_release(sg->dev, b);
    return st;
}

/* A pipeline's tensors straight from its stages (replica 0's) to the host,
 * under the one-device names: each stage's parameters (weights, batch-norm
 * statistics) and, with_state, its optimizer state; no whole network. */
static clg_status build_pipe_tensors(clg_model *m, clg_ckpt *ck, int with_state)
{
    clg_pipe *p = m->pipe;
    char name[160];
    if (with_state)
        CLG_TRY(clg_pipe_ensure_optim(p, &m->hp));
    for (int s = 0; s < p->K; s++) {
        clg_pipe_stage *sg = &p->st[s];
        clg_param_ref *refs = NULL;
        int n = 0;
        CLG_TRY(clg_replica_params(sg->rep, 0, &refs, &n));
        clg_status st = CLG_OK;
        for (int i = 0; i < n && st == CLG_OK; i++) {
            param_name(name, sizeof name, "", &refs[i]);
            st = add_device_tensor_x(m, ck, name, refs[i].param, clg_replica_master(sg->rep, &refs[i]),
                                     CLG_SAVE_MAX_ABS, -1, 0, sg->dev);
        }
        free(refs);
        CLG_TRY(st);
        const clg_optim *o = sg->opt;
        int ns = with_state ? clg_optim_nstate(o) : 0;
        for (int i = 0; ns >= 1 && i < o->n; i++) {
            param_name(name, sizeof name, "opt.m.", &o->refs[i]);
            CLG_TRY(add_pipe_state(m, ck, name, sg, i, 1));
            if (ns < 2)
                continue;
            param_name(name, sizeof name, "opt.v.", &o->refs[i]);
            CLG_TRY(add_pipe_state(m, ck, name, sg, i, 2));
        }
    }
    return CLG_OK;
}

/* The convolution algorithms the run computes with (and the shapes whose
 * measurement still waits), so a resume uses the same ones: "conv.algos". */
static clg_status save_conv_algos(clg_model *m, clg_ckpt *ck)
{
    clg_sbuf b = {0};
    clg_conv_auto_state(m->ctx, &b);
    clg_status st = b.oom ? clg_err_set(&m->ctx->err, CLG_ERR_HOST_OOM, "out of memory")
                          : clg_ckpt_set_meta(&m->ctx->err, ck, "conv.algos", b.data ? b.data : "");
    clg_sbuf_free(&b);
    return st;
}

static clg_status build_ckpt(clg_model *m, clg_ckpt *ck, int with_state, int64_t total_steps)
{
    clg_err *err = &m->ctx->err;
    clg_param_ref *refs = NULL;
    int n = 0;
    if (m->pipe && !pipe_split(m)) /* from the stages */
        CLG_TRY(build_pipe_tensors(m, ck, with_state));
    else
        CLG_TRY(clg_replica_params(clg_session_rep(m), 0, &refs, &n));
    char name[160];
    clg_status st = CLG_OK;
    for (int i = 0; i < n && st == CLG_OK; i++) {
        param_name(name, sizeof name, "", &refs[i]);
        st = add_device_tensor(m, ck, name, refs[i].param, clg_replica_master(clg_session_rep(m), &refs[i]),
                               CLG_SAVE_MAX_ABS);
    }
    free(refs);
    CLG_TRY(st);
    CLG_TRY(clg_ckpt_set_meta(err, ck, CLG_CKPT_KEY_MODEL, m->net->text));
    CLG_TRY(clg_ckpt_set_meta(err, ck, "model.hash", m->model_hash));
    CLG_TRY(clg_ckpt_set_meta(err, ck, "precision", m->fp16 ? "fp16" : "fp32"));
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "norm.channels", m->has_norm ? m->norm.c : 0));
    char key[64];
    for (int c = 0; m->has_norm && c < m->norm.c; c++) {
        snprintf(key, sizeof key, "norm.mean.%d", c);
        CLG_TRY(clg_ckpt_set_meta_f64(err, ck, key, m->norm.mean[c]));
        snprintf(key, sizeof key, "norm.std.%d", c);
        CLG_TRY(clg_ckpt_set_meta_f64(err, ck, key, m->norm.std[c]));
    }
    if (!with_state)
        return CLG_OK;
    char devs[256];
    clg_session_devices(m, devs, sizeof devs);
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "devices.count", m->dp->n));
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "ranks", clg_comm_size())); /* MPI ranks x devices.count lanes */
    for (int i = 0; i < m->dp->n; i++) { /* the split continues where it was */
        char key[48];
        snprintf(key, sizeof key, "devices.share.%d", i);
        CLG_TRY(clg_ckpt_set_meta_f64(err, ck, key, m->dp->share[i]));
    }
    CLG_TRY(clg_ckpt_set_meta(err, ck, "devices", devs));
    CLG_TRY(save_conv_algos(m, ck));
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, CLG_CKPT_KEY_STEP, m->step));
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, CLG_CKPT_KEY_EPOCH, m->epoch));
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "batch_in_epoch", m->batch_in_epoch));
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "batch", m->net->batch));
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "total_steps", total_steps));
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "seed", (int64_t)m->seed));
    if (m->fp16) {
        CLG_TRY(clg_ckpt_set_meta_f64(err, ck, "fp16.loss_scale", m->loss_scale));
        CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "fp16.good_steps", m->ls_good));
        CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "fp16.skipped", m->ls_skipped));
    }
    clg_rng r;
    clg_rng_seed(&r, m->seed, (uint64_t)m->epoch);
    CLG_TRY(clg_ckpt_set_rng(err, ck, CLG_CKPT_KEY_RNG, &r));
    CLG_TRY(clg_ckpt_set_meta(err, ck, CLG_CKPT_KEY_OPTIMIZER, clg_optim_name(m->hp.optimizer)));
    CLG_TRY(clg_ckpt_set_meta_f64(err, ck, "optimizer.lr", m->hp.learning_rate));
    CLG_TRY(clg_ckpt_set_meta_f64(err, ck, "optimizer.momentum", m->hp.momentum));
    CLG_TRY(clg_ckpt_set_meta_f64(err, ck, "optimizer.weight_decay", m->hp.weight_decay));
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "optimizer.nesterov", m->hp.nesterov));
    CLG_TRY(clg_ckpt_set_meta_f64(err, ck, "optimizer.beta1", m->hp.beta1));
    CLG_TRY(clg_ckpt_set_meta_f64(err, ck, "optimizer.beta2", m->hp.beta2));
    CLG_TRY(clg_ckpt_set_meta_f64(err, ck, "optimizer.epsilon", m->hp.epsilon));
    const clg_optim *o = m->dp->lanes[0].opt; /* every lane's is the same */
    if (m->pipe && !pipe_split(m)) /* the tensors came from the stages */
        return clg_ckpt_set_meta_i64(err, ck, "optimizer.t", m->pipe->st[0].opt->t);
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "optimizer.t", o ? o->t : 0));
    if (o) {
        int ns = clg_optim_nstate(o);
        for (int i = 0; i < o->n; i++) {
            if (ns >= 1) {
                param_name(name, sizeof name, "opt.m.", &o->refs[i]);
                CLG_TRY(add_device_tensor_x(m, ck, name, o->refs[i].param, NULL, HUGE_VAL, i, 1, NULL));
            }
            if (ns >= 2) {
                param_name(name, sizeof name, "opt.v.", &o->refs[i]);
                CLG_TRY(add_device_tensor_x(m, ck, name, o->refs[i].param, NULL, HUGE_VAL, i, 2, NULL));
            }
        }
    }
    return CLG_OK;
}

/* A forward of the current weights on the last batch the session stepped
 * or evaluated: the loss (when the batch has labels and the model a loss)
 * and every output must be finite. No batch yet: nothing to check. */
static clg_status check_forward(clg_model *m, const char *path)
{
    clg_err *err = &m->ctx->err;
    if (m->check_stage < 0)
        return CLG_OK;
    CLG_TRY(clg_dp_finish(m->dp));
    const clg_tensor *o = clg_replica_output(clg_session_rep(m));
    size_t outw = (size_t)o->c * o->h * o->w, nout = (size_t)m->net->batch * outw;
    float *out = calloc(CLG_MAX(nout, 1), sizeof(float));
    if (!out)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    int labels = m->check_labels && clg_session_rep(m)->loss_index >= 0;
    float res[2] = {0, 0};
    clg_status st = clg_session_forward(m, m->check_stage, labels, labels ? res : NULL, out);
    if (st == CLG_OK)
        st = clg_dp_finish(m->dp);
    size_t bad = nout;
    for (size_t k = 0; st == CLG_OK && k < nout && bad == nout; k++)
        if (!isfinite(out[k]))
            bad = k;
    if (st == CLG_OK && labels && !isfinite(res[0]))
        st = clg_err_set(err, CLG_ERR_INTERNAL,
                         "not saving %s: the weights give a non-finite loss (%g) on the last batch; the model "
                         "diverged (lower the learning rate); an earlier file there is kept",
                         path, (double)res[0]);
    else if (st == CLG_OK && bad < nout)
        st = clg_err_set(err, CLG_ERR_INTERNAL,
                         "not saving %s: the weights give a non-finite output (%g, sample %zu) on the last batch; "
                         "the model diverged (lower the learning rate); an earlier file there is kept",
                         path, (double)out[bad], bad / CLG_MAX(outw, 1));
    free(out);
    return st;
}

clg_status clg_session_save(clg_model *m, const char *path, int with_state, int64_t total_steps)
{
    clg_err *err = &m->ctx->err;
    clg_ckpt *ck = NULL;
    /* a pipeline: straight from the stages, no whole network (the forward check runs the stages in order);
       tensor parallelism: the slices are gathered into the whole lane first */
    clg_status st = m->tp || pipe_split(m) ? clg_session_pipe_gather(m, with_state) : CLG_OK;
    if (st == CLG_OK)
        st = check_forward(m, path);
    if (st == CLG_OK)
        st = clg_ckpt_create(err, &ck);
    if (st == CLG_OK)
        st = build_ckpt(m, ck, with_state, total_steps);
    if (st == CLG_OK)
        st = clg_ckpt_save(err, ck, path);
    clg_ckpt_free(ck);
    pipe_lane_release(m);
    return st;
}

/* Lane l's copy of the authoritative value of ref (a parameter of lane 0's replica). */
static cl_mem lane_buf(clg_lane *l, const clg_param_ref *ref)
{
    clg_param_ref own = {&l->rep->layers[ref->layer->index], clg_replica_param_of(l->rep, ref)};
    return clg_replica_master(l->rep, &own);
}

/* The tensor `name` into every lane's copy of the buffer lane_buf names
 * (weights, master copies: identical on every lane), or with which 1 / 2
 * into the optimizer's first / second state of trainable parameter i
 * (clg_dp_optim_state: every lane's, or each lane's shard). dev (may be
 * NULL): into mem on dev instead (a pipeline stage's value or state). */
static clg_status load_device_tensor(clg_model *m, const clg_ckpt *ck, const char *name, const clg_param_ref *ref,
                                     int i, int which, const char *path, clg_device *dev, cl_mem mem)
{
    clg_err *err = &m->ctx->err;
    const clg_param *p = ref->param;
    float *host = malloc(CLG_MAX(p->numel, 1) * sizeof(float));
    if (!host)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    clg_status st = clg_ckpt_get_f32(err, ck, name, p->ndim, p->shape, p->numel, host);
    if (st != CLG_OK) { /* clg_err_set may format from the buffer it writes */
        free(host);
        return clg_err_set(err, st, "%s: %s (is it a checkpoint of another model?)", path, err->msg);
    }
    for (size_t k = 0; k < p->numel; k++)
        if (!isfinite(host[k])) {
            free(host);
            return clg_err_set(err, CLG_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value at element %zu", path,
                               name, k);
        }
    if (dev) {
        cl_int e = clEnqueueWriteBuffer(dev->queue, mem, CL_TRUE, 0, p->numel * sizeof(float), host, 0, NULL, NULL);
        free(host);
        return e == CL_SUCCESS ? CLG_OK : clg_cl_fail(err, e, "upload checkpoint tensor", __FILE__, __LINE__);
    }
    if (which > 0) /* optimizer state: every lane's copy, or each lane's shard */
        st = clg_dp_optim_state(m->dp, i, which, host, 1);
    for (int l = 0; l < m->dp->n && st == CLG_OK && which == 0; l++) {
        clg_lane *ln = &m->dp->lanes[l];
        cl_int e = clEnqueueWriteBuffer(ln->dev->queue, lane_buf(ln, ref), CL_TRUE, 0,
                                        p->numel * sizeof(float), host, 0, NULL, NULL);
        if (e != CL_SUCCESS)
            st = clg_cl_fail(err, e, "upload checkpoint tensor", __FILE__, __LINE__);
    }
    free(host);
    return st;
}

/* A metadata value that must lie in [lo, hi]; the message names the file. */
static clg_status meta_i64_range(clg_err *err, const clg_ckpt *ck, const char *path, const char *key, int64_t lo,
                                 int64_t hi, int64_t *v)
{
    clg_status st = clg_ckpt_get_meta_i64_range(err, ck, key, lo, hi, v);
    if (st != CLG_OK) /* clg_err_set may format from the buffer it writes */
        return clg_err_set(err, st, "%s: %s", path, err->msg);
    return CLG_OK;
}

clg_status clg_session_load(clg_model *m, const char *path, int with_state)
{
    clg_ckpt *ck = NULL;
    CLG_TRY(clg_ckpt_load(&m->ctx->err, path, &ck));
    clg_status st = clg_session_load_ckpt(m, ck, path, with_state);
    clg_ckpt_free(ck);
    return st;
}

/* The weights: every parameter of the model by name, and no other tensor
 * than the optimizer's ("opt.*"). */
/* A pipeline stage's optimizer state `which` (1, 2) of its trainable parameter i from the checkpoint (sharded:
 * its part, through a buffer on its device). */
static clg_status load_pipe_state(clg_model *m, const clg_ckpt *ck, const char *name, clg_pipe_stage *sg, int i,
                                  int which, const char *path)
{
    const clg_optim *o = sg->opt;
    if (!m->pipe->zero)
        return load_device_tensor(m, ck, name, &o->refs[i], i, which, path, sg->dev, which == 1 ? o->m[i] : o->v[i]);
    cl_mem b = NULL;
    CLG_TRY(clg_buf_alloc(sg->dev, CLG_MAX(o->refs[i].param->numel, 1) * sizeof(float), &b));
    clg_status st = load_device_tensor(m, ck, name, &o->refs[i], i, which, path, sg->dev, b);
    if (st == CLG_OK)
        st = clg_pipe_zero_buf(m->pipe, sg->index, i, which - 1, b, 0);
    clg_buf_release(sg->dev, b);
    return st;
}

/* A pipeline: the weights (which 0) or the optimizer state (1) straight
 * into every stage (of every data-parallel replica); *n: the parameters of
 * one pipeline. */
static clg_status load_pipe_tensors(clg_model *m, const clg_ckpt *ck, const char *path, int which, int *n)
{
    clg_pipe *p = m->pipe;
    char name[160];
    *n = 0;
    if (which)
        CLG_TRY(clg_pipe_ensure_optim(p, &m->hp));
    for (int l = 0; l < p->L; l++) {
        clg_pipe_stage *sg = &p->st[l];
        clg_param_ref *refs = NULL;
        int nr = 0;
        clg_status st = which ? CLG_OK : clg_replica_params(sg->rep, 0, &refs, &nr);
        for (int i = 0; i < nr && st == CLG_OK; i++) {
            param_name(name, sizeof name, "", &refs[i]);
            st = load_device_tensor(m, ck, name, &refs[i], i, 0, path, sg->dev,
                                    clg_replica_master(sg->rep, &refs[i]));
        }
        free(refs);
        *n += l < p->K ? nr : 0;
        const clg_optim *o = sg->opt;
        int ns = which ? clg_optim_nstate(o) : 0;
        for (int i = 0; ns >= 1 && i < o->n && st == CLG_OK; i++) {
            param_name(name, sizeof name, "opt.m.", &o->refs[i]);
            st = load_pipe_state(m, ck, name, sg, i, 1, path);
            param_name(name, sizeof name, "opt.v.", &o->refs[i]);
            if (ns >= 2 && st == CLG_OK)
                st = load_pipe_state(m, ck, name, sg, i, 2, path);
        }
        CLG_TRY(st);
    }
    return CLG_OK;
}

static clg_status load_weights(clg_model *m, const clg_ckpt *ck, const char *path)
{
    clg_err *err = &m->ctx->err;
    clg_param_ref *refs = NULL;
    int n = 0;
    int straight = m->pipe && !pipe_split(m);
    clg_status st = straight ? load_pipe_tensors(m, ck, path, 0, &n) /* done: only the count is checked below */
                            : clg_replica_params(clg_session_rep(m), 0, &refs, &n);
    char name[160];
    int nweights = 0;
    for (int i = 0; i < ck->nt && st == CLG_OK; i++)
        if (strncmp(ck->t[i].name, "opt.", 4) != 0)
            nweights++;
    for (int i = 0; i < n && st == CLG_OK && !straight; i++) {
        param_name(name, sizeof name, "", &refs[i]);
        st = load_device_tensor(m, ck, name, &refs[i], i, 0, path, NULL, NULL);
    }
    free(refs);
    if (st == CLG_OK && nweights != n)
        st = clg_err_set(err, CLG_ERR_SHAPE, "%s: checkpoint holds %d weight tensors, the model %s has %d (a checkpoint of another model?)",
                         path, nweights, m->net->source, n);
    return st;
}

/* The input normalization, when the checkpoint holds one. */
static clg_status load_norm(clg_model *m, const clg_ckpt *ck, const char *path)
{
    clg_err *err = &m->ctx->err;
    int64_t nc = 0;
    if (!clg_ckpt_get_meta(ck, "norm.channels"))
        return CLG_OK;
    clg_status st = meta_i64_range(err, ck, path, "norm.channels", 0, CLG_DS_MAX_CHANNELS, &nc);
    if (st == CLG_OK && nc != 0 && nc != m->net->in_c)
        st = clg_err_set(err, CLG_ERR_FORMAT, "%s: normalization has %" PRId64 " channels, the model %d", path, nc,
                         m->net->in_c);
    char key[64];
    for (int c = 0; c < nc && st == CLG_OK; c++) {
        double mean = 0, sd = 1;
        snprintf(key, sizeof key, "norm.mean.%d", c);
        st = clg_ckpt_get_meta_f64_range(err, ck, key, -1e5, 1e5, &mean);
        snprintf(key, sizeof key, "norm.std.%d", c);
        if (st == CLG_OK)
            st = clg_ckpt_get_meta_f64_range(err, ck, key, 1e-6, 1e5, &sd);
        if (st != CLG_OK)
            break;
        m->norm.mean[c] = (float)mean;
        m->norm.std[c] = (float)sd;
    }
    if (st == CLG_OK && nc > 0) {
        m->norm.c = (int)nc;
        m->has_norm = 1;
    }
    return st;
}

/* A metadata double that must be finite and lie in [lo, hi]; the message names the file. */
static clg_status meta_f64_range(clg_err *err, const clg_ckpt *ck, const char *path, const char *key, double lo,
                                 double hi, double *v)
{
    clg_status st = clg_ckpt_get_meta_f64_range(err, ck, key, lo, hi, v);
    if (st != CLG_OK) /* clg_err_set may format from the buffer it writes */
        return clg_err_set(err, st, "%s: %s", path, err->msg);
    return CLG_OK;
}

/* The run's position (step, epoch, batch in epoch, seed, total steps, the
 * rng state they imply), then the batch and precision it was trained with,
 * which a resume must match. Every key is required and range-checked. */
static clg_status load_position(clg_model *m, const clg_ckpt *ck, const char *path)
{
    clg_err *err = &m->ctx->err;
    int64_t v = 0, step = 0, epoch = 0, bie = 0, seed = 0, total = 0;
    clg_status st = meta_i64_range(err, ck, path, CLG_CKPT_KEY_STEP, 0, INT64_MAX / 2, &step);
    if (st == CLG_OK)
        st = meta_i64_range(err, ck, path, CLG_CKPT_KEY_EPOCH, 0, 1000000, &epoch);
    /* a batch index within an epoch: at most the dataset's batches (checked against the data by the trainer) */
    if (st == CLG_OK)
        st = meta_i64_range(err, ck, path, "batch_in_epoch", 0, INT32_MAX, &bie);
    if (st == CLG_OK) /* the run continues with its own shuffles and masks; --seed is in [0, INT64_MAX] */
        st = meta_i64_range(err, ck, path, "seed", 0, INT64_MAX, &seed);
    /* steps per epoch x epochs of the run that wrote it, at least the steps taken (0: not a training run's,
     * e.g. the library's clg_session_save with the state) */
    if (st == CLG_OK)
        st = meta_i64_range(err, ck, path, "total_steps", 0, INT64_MAX / 2, &total);
    if (st == CLG_OK && total > 0 && total < step)
        st = clg_err_set(err, CLG_ERR_FORMAT,
                         "%s: checkpoint metadata 'total_steps' = %" PRId64 " is below its 'step' = %" PRId64, path,
                         total, step);
    if (st == CLG_OK && clg_ckpt_get_meta(ck, CLG_CKPT_KEY_RNG)) { /* the epoch's stream of that seed */
        clg_rng r, want;
        st = clg_ckpt_get_rng(err, ck, CLG_CKPT_KEY_RNG, &r);
        if (st != CLG_OK)
            st = clg_err_set(err, st, "%s: %s", path, err->msg);
        clg_rng_seed(&want, (uint64_t)seed, (uint64_t)epoch);
        if (st == CLG_OK && (r.state != want.state || r.inc != want.inc))
            st = clg_err_set(err, CLG_ERR_FORMAT,
                             "%s: checkpoint metadata '%s' = '%s' is not the rng state of seed %" PRId64
                             " at epoch %" PRId64,
                             path, CLG_CKPT_KEY_RNG, clg_ckpt_get_meta(ck, CLG_CKPT_KEY_RNG), seed, epoch);
    }
    if (st == CLG_OK) {
        m->step = step;
        m->epoch = (int)epoch;
        m->batch_in_epoch = (int)bie;
        m->seed = (uint64_t)seed;
    }
    if (st == CLG_OK)
        st = meta_i64_range(err, ck, path, "batch", 1, 1 << 20, &v);
    if (st == CLG_OK && v != m->net->batch)
        st = clg_err_set(err, CLG_ERR_INVALID_ARG,
                         "%s: the checkpoint was trained with batch %" PRId64 ", this run uses %d (resume needs the same batch)",
                         path, v, m->net->batch);
    const char *prec = clg_ckpt_get_meta(ck, "precision");
    if (!prec)
        prec = "fp32"; /* written before fp16 existed */
    if (st == CLG_OK && clg_precision_parse(prec) != m->fp16)
        st = clg_err_set(err, CLG_ERR_INVALID_ARG,
                         "%s: the checkpoint was trained with --precision %s, this run uses %s (resume needs the same precision)",
                         path, prec, m->fp16 ? "fp16" : "fp32");
    return st;
}

/* fp16: the loss scale and its counters. */
static clg_status load_loss_scale(clg_model *m, const clg_ckpt *ck, const char *path)
{
    clg_err *err = &m->ctx->err;
    if (!m->fp16)
        return CLG_OK;
    double ls = 0;
    int64_t good = 0, skipped = 0;
    clg_status st = meta_f64_range(err, ck, path, "fp16.loss_scale", CLG_LS_MIN, CLG_LS_MAX, &ls);
    if (st == CLG_OK)
        st = meta_i64_range(err, ck, path, "fp16.good_steps", 0, INT64_MAX, &good);
    if (st == CLG_OK)
        st = meta_i64_range(err, ck, path, "fp16.skipped", 0, INT64_MAX, &skipped);
    if (st == CLG_OK) {
        m->loss_scale = ls;
        m->ls_good = good;
        m->ls_skipped = skipped;
    }
    return st;
}

/* The optimizer (the same one), its step count and its state tensors, into every lane. */
static clg_status load_optim_state(clg_model *m, const clg_ckpt *ck, const char *path)
{
    clg_err *err = &m->ctx->err;
    const char *opt = clg_ckpt_get_meta(ck, CLG_CKPT_KEY_OPTIMIZER);
    if (!opt || clg_optim_parse(opt) != m->hp.optimizer)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%s: the checkpoint's optimizer is '%s', this run uses '%s'",
                           path, opt ? opt : "(none)", clg_optim_name(m->hp.optimizer));
    int64_t v = 0;
    /* the run's own hyper-parameters apply, but what the file holds must be sane (written by clgrad:
     * the ranges of the model file's keys and the command line's options) */
    const double below1 = nextafter(1.0, 0.0);
    const struct {
        const char *key;
        double lo, hi;
    } hyper[] = {{"optimizer.lr", 0, DBL_MAX},       {"optimizer.weight_decay", 0, DBL_MAX},
                 {"optimizer.momentum", 0, below1},  {"optimizer.beta1", 0, below1},
                 {"optimizer.beta2", 0, below1},     {"optimizer.epsilon", 0, 1}};
    for (size_t i = 0; i < CLG_ARRAY_LEN(hyper); i++) {
        double d = 0;
        if (clg_ckpt_get_meta(ck, hyper[i].key))
            CLG_TRY(meta_f64_range(err, ck, path, hyper[i].key, hyper[i].lo, hyper[i].hi, &d));
    }
    if (clg_ckpt_get_meta(ck, "optimizer.nesterov"))
        CLG_TRY(meta_i64_range(err, ck, path, "optimizer.nesterov", 0, 1, &v));
    CLG_TRY(clg_session_ensure_optim(m));
    if (m->tp || pipe_split(m)) /* the whole-network lane's, scattered to the lanes after */
        CLG_TRY(clg_dp_ensure_optim(m->dp, &m->hp));
    CLG_TRY(meta_i64_range(err, ck, path, "optimizer.t", 0, m->step, &v));
    if (m->pipe && !pipe_split(m)) { /* straight into the stages */
        int n = 0;
        CLG_TRY(load_pipe_tensors(m, ck, path, 1, &n));
        for (int l = 0; l < m->pipe->L; l++)
            m->pipe->st[l].opt->t = v;
        return CLG_OK;
    }
    for (int l = 0; l < m->dp->n; l++)
        m->dp->lanes[l].opt->t = v;
    const clg_optim *o = m->dp->lanes[0].opt;
    int ns = clg_optim_nstate(o);
    char name[160];
    clg_status st = CLG_OK;
    for (int i = 0; st == CLG_OK && i < o->n; i++) {
        if (ns >= 1) {
            param_name(name, sizeof name, "opt.m.", &o->refs[i]);
            st = load_device_tensor(m, ck, name, &o->refs[i], i, 1, path, NULL, NULL);
        }
        if (ns >= 2 && st == CLG_OK) {
            param_name(name, sizeof name, "opt.v.", &o->refs[i]);
            st = load_device_tensor(m, ck, name, &o->refs[i], i, 2, path, NULL, NULL);
        }
    }
    return st;
}

/* The device set it was written with: another one is noted in
 * m->resumed_from; the same one (split not fixed) takes back its shares. */
static void load_device_set(clg_model *m, const clg_ckpt *ck)
{
    clg_err *err = &m->ctx->err;
    int64_t nd = 0;
    int64_t nr = 1;
    if (clg_ckpt_get_meta(ck, "ranks") && clg_ckpt_get_meta_i64(err, ck, "ranks", &nr) != CLG_OK)
        nr = 1;
    if (clg_ckpt_get_meta(ck, "devices.count") && clg_ckpt_get_meta_i64(err, ck, "devices.count", &nd) == CLG_OK &&
        (nd != m->dp->n || nr != clg_comm_size())) {
        const char *d = clg_ckpt_get_meta(ck, "devices");
        snprintf(m->resumed_from, sizeof m->resumed_from, "%" PRId64 " rank(s) x %" PRId64 " device(s): %s", nr, nd,
                 d ? d : "?");
    } else if (nd == m->dp->n && !m->dp->split_fixed) {
        double sh[CLG_DP_MAX_LANES], sum = 0;
        int ok = 1;
        for (int i = 0; i < m->dp->n && ok; i++) {
            char key[48];
            snprintf(key, sizeof key, "devices.share.%d", i);
            ok = clg_ckpt_get_meta(ck, key) && clg_ckpt_get_meta_f64(err, ck, key, &sh[i]) == CLG_OK &&
                 isfinite(sh[i]) && sh[i] >= 0 && sh[i] <= 1;
            sum += ok ? sh[i] : 0;
        }
        for (int i = 0; ok && sum > 0.99 && sum < 1.01 && i < m->dp->n; i++)
            m->dp->share[i] = sh[i] / sum;
    }
}

/* Resume: the normalization the run uses (computed from the data, or the
 * model file's) must be the one the checkpoint was trained with: norm.channels
 * present and equal to its channels (0 only for a model without one). */
static clg_status check_norm_channels(clg_model *m, const clg_ckpt *ck, const char *path, int had_norm)
{
    clg_err *err = &m->ctx->err;
    int64_t nc = 0;
    int want = had_norm ? m->net->in_c : 0;
    CLG_TRY(meta_i64_range(err, ck, path, "norm.channels", 0, CLG_DS_MAX_CHANNELS, &nc));
    if (nc != want)
        return clg_err_set(err, CLG_ERR_FORMAT,
                           "%s: checkpoint metadata 'norm.channels' = %" PRId64 ", this run normalizes %d input "
                           "channel(s) (resume needs the normalization it was trained with)",
                           path, nc, want);
    return CLG_OK;
}

/* Resume: the checkpoint is of this model (see clg_session_load). */
static clg_status check_model(clg_model *m, const clg_ckpt *ck, const char *path)
{
    clg_err *err = &m->ctx->err;
    const char *stored = clg_ckpt_get_meta(ck, "model.hash");
    const char *text = clg_ckpt_get_meta(ck, CLG_CKPT_KEY_MODEL);
    m->hash_unchecked = !stored;
    if (stored && strcmp(stored, m->model_hash) != 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "%s: the checkpoint is of another model: its model hash is %s, this run's model %s "
                           "hashes to %s (--resume-weights-only loads only the weights, for fine-tuning)",
                           path, stored, m->net->source, m->model_hash);
    if (!text)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s: checkpoint has no metadata '%s' (the model it was trained with)",
                           path, CLG_CKPT_KEY_MODEL);
    char th[17];
    if (clg_model_hash(err, text, path, th) != CLG_OK)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s: the model text stored in the checkpoint does not parse: %s", path,
                           err->msg);
    if (strcmp(th, m->model_hash) != 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "%s: the model text stored in the checkpoint hashes to %s%s%s, this run's model %s to %s: "
                           "another model, or an edited checkpoint (--resume-weights-only loads only the weights, "
                           "for fine-tuning)",
                           path, th, stored ? ", its model.hash is " : "", stored ? stored : "", m->net->source,
                           m->model_hash);
    return CLG_OK;
}

clg_status clg_session_load_ckpt(clg_model *m, const clg_ckpt *ck, const char *path, int with_state)
{
    if (m->tp || pipe_split(m)) /* loaded into the whole-network lane, then scattered to the lanes */
        CLG_TRY(pipe_lane_whole(m));
    int had_norm = m->has_norm;
    clg_status st = with_state ? check_model(m, ck, path) : CLG_OK;
    if (st == CLG_OK)
        st = load_weights(m, ck, path);
    if (st == CLG_OK && with_state)
        st = check_norm_channels(m, ck, path, had_norm);
    if (st == CLG_OK)
        st = load_norm(m, ck, path);
    if (st == CLG_OK && with_state) { /* the training state, for an exact resume */
        m->resumed_from[0] = 0;
        st = load_position(m, ck, path);
        if (st == CLG_OK)
            st = load_loss_scale(m, ck, path);
        if (st == CLG_OK && clg_ckpt_get_meta(ck, "conv.algos")) { /* written since the algorithms are kept */
            char what[1200];
            snprintf(what, sizeof what, "%s: checkpoint metadata 'conv.algos'", path);
            st = clg_conv_auto_pin(m->ctx, &m->ctx->err, clg_ckpt_get_meta(ck, "conv.algos"), what);
        }
        if (st == CLG_OK)
            st = load_optim_state(m, ck, path);
        if (st == CLG_OK)
            load_device_set(m, ck);
    }
    for (int l = 0; l < m->dp->n && st == CLG_OK; l++) /* fp16: half copies of the loaded masters */
        st = clg_replica_weights_updated(m->dp->lanes[l].rep);
    if (st == CLG_OK && m->tp) { /* loaded into the whole-network lane: scattered to the tensor-parallel lanes */
        if (with_state)
            st = clg_dp_ensure_optim(m->dp, &m->hp);
        if (st == CLG_OK)
            st = clg_tp_sync(m->tp, clg_session_rep(m), with_state ? m->dp->lanes[0].opt : NULL, &m->hp, 0);
        m->tp_stale = 0;
    }
    if (st == CLG_OK && pipe_split(m)) { /* loaded into the whole-network lane: scattered to the stages */
        if (with_state)
            st = clg_dp_ensure_optim(m->dp, &m->hp);
        if (st == CLG_OK)
            st = clg_pipe_sync(m->pipe, clg_session_rep(m), with_state ? m->dp->lanes[0].opt : NULL, &m->hp, 0);
    } else if (st == CLG_OK && m->pipe) { /* written into the stages: their stash slots; the lane (if whole) is stale */
        st = clg_pipe_loaded(m->pipe);
    }
    if (m->pipe)
        m->pipe_stale = 3;
    pipe_lane_release(m);
    return st;
}

// ---- evaluation ----

/* Every byte of text data is a token id and a target: below the model's
 * classes and below the rows of its first [embedding]'s table (vocab, dim). */
clg_status clg_session_check_text(clg_model *m, const clg_dataset *ds)
{
    clg_err *err = &m->ctx->err;
    const clg_net *net = m->net;
    int limit = net->classes;
    const char *what = "classes";
    const clg_layer *e = net->nlayers > 0 ? &net->proto[0] : NULL;
    if (e && e->ops && strcmp(e->ops->type, "embedding") == 0 && e->nparams > 0 && e->params[0].ndim == 2 &&
        e->params[0].shape[0] < limit) {
        limit = e->params[0].shape[0];
        what = "embedding vocabulary";
    }
    for (size_t i = 0; i < ds->text_len; i++)
        if (ds->text[i] >= limit)
            return clg_err_set(err, CLG_ERR_SHAPE,
                               "text data %s: byte %u at offset %zu is not a token id of model %s (its %s: %d)",
                               ds->source, ds->text[i], i + (ds->text_random ? 0 : ds->file_len - ds->text_len),
                               net->source, what, limit);
    return CLG_OK;
}

clg_status clg_session_evaluate(clg_model *m, const clg_dataset *ds, long limit, double *loss, double *acc,
                                int64_t *confusion, int *samples)
{
    clg_err *err = &m->ctx->err;
    int N = ds->n;
    if (limit > 0 && limit < N)
        N = (int)limit;
    int B = m->net->batch, classes = m->net->classes;
    if (m->tp || (m->pipe && m->pipe->T > 1)) /* tensor parallelism: lane 0 made the whole network, with the
                                                   lanes' weights */
        CLG_TRY(clg_session_pipe_gather(m, 0));
    const clg_tensor *outp = clg_replica_output(clg_session_rep(m));
    int outw = outp->c * outp->h * outp->w;
    float *probs = confusion ? malloc((size_t)B * outw * sizeof(float)) : NULL;
    if (confusion && !probs)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    int nb = CLG_CEIL_DIV(N, B);
    double ls = 0, cs = 0;
    clg_status st = CLG_OK;
    int cnt[CLG_STAGES] = {0};
    /* batch b + 1 is uploaded (transfer queue) while batch b computes */
    for (int b = 0; b <= nb && st == CLG_OK; b++) {
        if (b < nb) {
            int s = b % CLG_STAGES, start = b * B;
            st = clg_session_stage_wait(m, s);
            if (st == CLG_OK)
                st = clg_dataset_fill_batch(err, ds, &m->norm, NULL, start, CLG_MIN(B, N - start), m->xhost[s],
                                            m->yhost[s], &cnt[s]);
            if (st == CLG_OK)
                st = clg_session_upload(m, s, cnt[s], 1);
        }
        if (b == 0 || st != CLG_OK)
            continue;
        int pb = b - 1, s = pb % CLG_STAGES;
        float res[2] = {0, 0};
        st = clg_session_forward(m, s, 1, clg_session_rep(m)->loss_index >= 0 ? res : NULL, probs);
        ls += res[0];
        cs += res[1];
        int i0 = 0, mine = cnt[s]; /* this rank's slice (the whole batch with one rank) */
        clg_comm_slice(cnt[s], &i0, &mine);
        for (int i = i0; st == CLG_OK && confusion && i < i0 + mine; i++) {
            int best = 0;
            for (int k = 1; k < outw; k++)
                if (probs[(size_t)i * outw + k] > probs[(size_t)i * outw + best])
                    best = k;
            int y = ds->labels[pb * B + i];
            if (y >= 0 && y < classes && best < classes)
                confusion[(size_t)y * classes + best]++;
        }
    }
    clg_status fe = clg_dp_finish(m->dp);
    free(probs);
    pipe_lane_release(m);
    if (st != CLG_OK)
        return st;
    CLG_TRY(fe);
    if (clg_comm_size() > 1) { /* every rank evaluated its slice of each batch */
        double sums[2] = {ls, cs};
        CLG_TRY(clg_comm_allreduce_f64(err, sums, 2, "evaluation all-reduce"));
        ls = sums[0];
        cs = sums[1];
        int64_t nc = (int64_t)classes * classes;
        double *cf = confusion ? malloc((size_t)CLG_MAX(nc, 1) * sizeof(double)) : NULL;
        if (confusion && !cf)
            return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
        for (int64_t k = 0; cf && k < nc; k++)
            cf[k] = (double)confusion[k];
        st = cf ? clg_comm_allreduce_f64(err, cf, (int)nc, "confusion all-reduce") : CLG_OK;
        for (int64_t k = 0; cf && st == CLG_OK && k < nc; k++)
            confusion[k] = (int64_t)cf[k];
        free(cf);
        CLG_TRY(st);
    }
    *loss = N ? ls / N : 0;
    *acc = N ? cs / N : 0;
    if (samples)
        *samples = N;
    return CLG_OK;
}
