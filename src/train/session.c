/* Training session: replica + optimizer + staging + checkpoints + eval. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "train/session.h"

static void release_ev(cl_event *e)
{
    if (*e) {
        clReleaseEvent(*e);
        *e = NULL;
    }
}

int clg_precision_parse(const char *name)
{
    if (!name || strcmp(name, "fp32") == 0)
        return 0;
    if (strcmp(name, "fp16") == 0)
        return 1;
    return -1;
}

clg_status clg_session_create(clg_ctx *ctx, int device, const char *text, const char *source, int batch,
                              uint64_t seed, int fp16, clg_model **out)
{
    *out = NULL;
    clg_err *err = ctx ? &ctx->err : NULL;
    if (!ctx || device < 0 || device >= ctx->ndev)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "device index %d outside the context's %d devices", device,
                           ctx ? ctx->ndev : 0);
    clg_model *m = calloc(1, sizeof *m);
    if (!m)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    m->ctx = ctx;
    m->dev = &ctx->devs[device];
    m->seed = seed;
    m->fp16 = fp16 != 0;
    m->loss_scale = m->fp16 ? CLG_LS_INIT : 1.0;
    m->ls_interval = CLG_LS_INTERVAL;
    const char *lsi = getenv("CLGRAD_FP16_SCALE_INTERVAL"); /* for tests: grow S sooner */
    if (lsi && atoi(lsi) > 0)
        m->ls_interval = atoi(lsi);
    clg_status st = clg_net_build(err, text, source, batch, &m->net);
    if (st == CLG_OK) {
        m->net->fp16 = m->fp16;
        m->hp = m->net->hp;
        clg_ds_norm_identity(&m->norm, m->net->in_c <= CLG_DS_MAX_CHANNELS ? m->net->in_c : CLG_DS_MAX_CHANNELS);
        st = clg_replica_create(m->net, m->dev, seed, &m->rep);
    }
    int B = m->net ? m->net->batch : 0;
    size_t sample = m->net ? (size_t)m->net->in_c * m->net->in_h * m->net->in_w : 0;
    if (st == CLG_OK) {
        cl_int e = CL_SUCCESS;
        m->upq = clCreateCommandQueue(m->dev->cl, m->dev->id, 0, &e);
        if (e != CL_SUCCESS)
            st = clg_cl_fail(err, e, "clCreateCommandQueue (transfer queue)", __FILE__, __LINE__);
    }
    for (int s = 0; s < CLG_STAGES && st == CLG_OK; s++) {
        m->xhost[s] = malloc((size_t)B * sample * sizeof(float));
        m->yhost[s] = calloc((size_t)B, sizeof(int32_t));
        if (!m->xhost[s] || !m->yhost[s])
            st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory for input staging");
        if (st == CLG_OK)
            st = clg_buf_alloc(m->dev, (size_t)B * sample * sizeof(float), &m->xbuf[s]);
        if (st == CLG_OK)
            st = clg_buf_alloc(m->dev, (size_t)B * sizeof(int32_t), &m->ybuf[s]);
    }
    if (st == CLG_OK)
        st = clg_buf_alloc(m->dev, (size_t)B * sizeof(int32_t), &m->dummy_labels);
    if (st == CLG_OK) {
        int zero = 0;
        cl_int e = clEnqueueFillBuffer(m->dev->queue, m->dummy_labels, &zero, sizeof zero, 0,
                                       (size_t)B * sizeof(int32_t), 0, NULL, NULL);
        if (e != CL_SUCCESS)
            st = clg_cl_fail(err, e, "fill labels", __FILE__, __LINE__);
    }
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
    if (m->dev)
        clFinish(m->dev->queue);
    if (m->upq) {
        clFinish(m->upq);
        clReleaseCommandQueue(m->upq);
    }
    for (int s = 0; s < CLG_STAGES; s++) {
        release_ev(&m->up_ev[s]);
        release_ev(&m->done_ev[s]);
        if (m->dev) {
            clg_buf_release(m->dev, m->xbuf[s]);
            clg_buf_release(m->dev, m->ybuf[s]);
        }
        free(m->xhost[s]);
        free(m->yhost[s]);
    }
    if (m->dev)
        clg_buf_release(m->dev, m->dummy_labels);
    clg_optim_free(m->opt);
    clg_replica_free(m->rep); /* replicas are not attached to the net */
    clg_net_free(m->net);
    free(m);
}

clg_status clg_session_ensure_optim(clg_model *m)
{
    if (m->opt)
        return CLG_OK;
    if (m->rep->loss_index < 0)
        return clg_err_set(clg_dev_err(m->dev), CLG_ERR_UNSUPPORTED,
                           "%s: the model has no loss layer (softmax or mse): it cannot be trained", m->net->source);
    return clg_optim_create(m->rep, &m->hp, &m->opt);
}

clg_status clg_session_stage_wait(clg_model *m, int s)
{
    clg_err *err = clg_dev_err(m->dev);
    if (m->up_ev[s]) {
        CLG_CL_CHECK(err, clWaitForEvents(1, &m->up_ev[s]));
        release_ev(&m->up_ev[s]);
    }
    return CLG_OK;
}

clg_status clg_session_upload(clg_model *m, int s, int n, int with_labels)
{
    clg_err *err = clg_dev_err(m->dev);
    size_t sample = (size_t)m->net->in_c * m->net->in_h * m->net->in_w;
    cl_event wait = m->done_ev[s];
    cl_event ev = NULL;
    CLG_CL_CHECK(err, clEnqueueWriteBuffer(m->upq, m->xbuf[s], CL_FALSE, 0, (size_t)n * sample * sizeof(float),
                                           m->xhost[s], wait ? 1 : 0, wait ? &wait : NULL, with_labels ? NULL : &ev));
    if (with_labels)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(m->upq, m->ybuf[s], CL_FALSE, 0, (size_t)n * sizeof(int32_t),
                                               m->yhost[s], wait ? 1 : 0, wait ? &wait : NULL, &ev));
    /* the transfer queue is in order: the last write's event covers both */
    release_ev(&m->up_ev[s]);
    m->up_ev[s] = ev;
    CLG_CL_CHECK(err, clFlush(m->upq));
    return CLG_OK;
}

clg_status clg_session_use_stage(clg_model *m, int s, int n, int training)
{
    clg_err *err = clg_dev_err(m->dev);
    if (m->up_ev[s])
        CLG_CL_CHECK(err, clEnqueueBarrierWithWaitList(m->dev->queue, 1, &m->up_ev[s], NULL));
    clg_replica_set_input(m->rep, m->xbuf[s], 0);
    /* fp16: the loss scale S (a power of two) rides on the loss gradient */
    clg_replica_set_labels(m->rep, training >= 0 ? m->ybuf[s] : m->dummy_labels, 0,
                           (1.0f / (float)n) * (float)m->loss_scale);
    return CLG_OK;
}

clg_status clg_session_stage_release(clg_model *m, int s)
{
    clg_err *err = clg_dev_err(m->dev);
    release_ev(&m->done_ev[s]);
    CLG_CL_CHECK(err, clEnqueueMarkerWithWaitList(m->dev->queue, 0, NULL, &m->done_ev[s]));
    CLG_CL_CHECK(err, clFlush(m->dev->queue));
    return CLG_OK;
}

static clg_status read_result(clg_model *m, float *res, cl_event *ev)
{
    if (m->rep->loss_index < 0 || !res)
        return CLG_OK;
    clg_layer *l = &m->rep->layers[m->rep->loss_index];
    CLG_CL_CHECK(clg_dev_err(m->dev), clEnqueueReadBuffer(m->dev->queue, l->loss.result, ev ? CL_FALSE : CL_TRUE, 0,
                                                          2 * sizeof(float), res, 0, NULL, ev));
    return CLG_OK;
}

clg_status clg_session_train_step(clg_model *m, int s, int n, double lr, float *res, cl_event *res_ev)
{
    CLG_TRY(clg_session_ensure_optim(m));
    CLG_TRY(clg_session_use_stage(m, s, n, 1));
    for (int i = 0; i < m->rep->nlayers; i++)
        clg_layer_set_rng(&m->rep->layers[i], (uint32_t)m->seed, (uint32_t)m->step, 0);
    CLG_TRY(clg_replica_forward(m->rep, n, 1));
    CLG_TRY(read_result(m, res, res_ev));
    CLG_TRY(clg_replica_backward(m->rep, n));
    CLG_TRY(clg_session_stage_release(m, s));
    return clg_session_apply(m, lr);
}

clg_status clg_session_apply(clg_model *m, double lr)
{
    clg_err *err = clg_dev_err(m->dev);
    CLG_TRY(clg_session_ensure_optim(m));
    if (m->fp16) {
        int overflow = 0;
        CLG_TRY(clg_optim_unscale_check(m->opt, (float)(1.0 / m->loss_scale), &overflow));
        if (overflow) {
            if (m->loss_scale <= CLG_LS_MIN)
                return clg_err_set(err, CLG_ERR_INTERNAL,
                                   "fp16: gradients are inf/NaN at step %" PRId64
                                   " even with loss scale %g (diverged: lower the learning rate)",
                                   m->step, m->loss_scale);
            clg_log(2, "fp16: inf/NaN gradients at step %" PRId64 ": step skipped, loss scale %g -> %g", m->step,
                    m->loss_scale, m->loss_scale / 2);
            m->loss_scale /= 2;
            m->ls_good = 0;
            m->ls_skipped++;
            m->step++;
            return CLG_OK;
        }
    }
    float gscale = 1.0f;
    if (m->hp.clip_norm > 0) {
        double norm = 0;
        CLG_TRY(clg_optim_grad_norm(m->opt, 1.0f, &norm));
        if (!isfinite(norm))
            return clg_err_set(err, CLG_ERR_INTERNAL,
                               "gradient norm is not finite at step %" PRId64 " (diverged: lower the learning rate)",
                               m->step);
        if (norm > m->hp.clip_norm)
            gscale = (float)(m->hp.clip_norm / norm);
    }
    CLG_TRY(clg_optim_step(m->opt, lr, gscale));
    if (m->fp16 && ++m->ls_good >= m->ls_interval) {
        if (m->loss_scale < CLG_LS_MAX)
            m->loss_scale *= 2;
        m->ls_good = 0;
    }
    m->step++;
    return CLG_OK;
}

clg_status clg_session_fill(clg_model *m, int s, const clg_dataset *ds, const int32_t *perm, int start, int *count)
{
    return clg_dataset_fill_batch(clg_dev_err(m->dev), ds, &m->norm, perm, start, m->net->batch, m->xhost[s],
                                  m->yhost[s], count);
}

// ---- checkpoints ----

static void param_name(char *dst, size_t n, const char *prefix, const clg_param_ref *r)
{
    snprintf(dst, n, "%s%s.%s", prefix, r->layer->name, r->param->name);
}

static clg_status add_device_tensor(clg_model *m, clg_ckpt *ck, const char *name, const clg_param *p, cl_mem mem)
{
    clg_err *err = clg_dev_err(m->dev);
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
    CLG_CL_CHECK(err, clEnqueueReadBuffer(m->dev->queue, mem, CL_TRUE, 0, p->numel * sizeof(float), data, 0, NULL,
                                          NULL));
    return CLG_OK;
}

static clg_status build_ckpt(clg_model *m, clg_ckpt *ck, int with_state, int64_t total_steps)
{
    clg_err *err = clg_dev_err(m->dev);
    clg_param_ref *refs = NULL;
    int n = 0;
    CLG_TRY(clg_replica_params(m->rep, 0, &refs, &n));
    char name[160];
    clg_status st = CLG_OK;
    for (int i = 0; i < n && st == CLG_OK; i++) {
        param_name(name, sizeof name, "", &refs[i]);
        st = add_device_tensor(m, ck, name, refs[i].param, clg_replica_master(m->rep, &refs[i]));
    }
    free(refs);
    CLG_TRY(st);
    CLG_TRY(clg_ckpt_set_meta(err, ck, CLG_CKPT_KEY_MODEL, m->net->text));
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
    CLG_TRY(clg_ckpt_set_meta_i64(err, ck, "optimizer.t", m->opt ? m->opt->t : 0));
    if (m->opt) {
        int ns = clg_optim_nstate(m->opt);
        for (int i = 0; i < m->opt->n; i++) {
            if (ns >= 1) {
                param_name(name, sizeof name, "opt.m.", &m->opt->refs[i]);
                CLG_TRY(add_device_tensor(m, ck, name, m->opt->refs[i].param, m->opt->m[i]));
            }
            if (ns >= 2) {
                param_name(name, sizeof name, "opt.v.", &m->opt->refs[i]);
                CLG_TRY(add_device_tensor(m, ck, name, m->opt->refs[i].param, m->opt->v[i]));
            }
        }
    }
    return CLG_OK;
}

clg_status clg_session_save(clg_model *m, const char *path, int with_state, int64_t total_steps)
{
    clg_err *err = clg_dev_err(m->dev);
    clg_ckpt *ck = NULL;
    CLG_TRY(clg_ckpt_create(err, &ck));
    clg_status st = build_ckpt(m, ck, with_state, total_steps);
    if (st == CLG_OK)
        st = clg_ckpt_save(err, ck, path);
    clg_ckpt_free(ck);
    return st;
}

static clg_status load_device_tensor(clg_model *m, const clg_ckpt *ck, const char *name, const clg_param *p,
                                     cl_mem mem, const char *path)
{
    clg_err *err = clg_dev_err(m->dev);
    float *host = malloc(CLG_MAX(p->numel, 1) * sizeof(float));
    if (!host)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    clg_status st = clg_ckpt_get_f32(err, ck, name, p->ndim, p->shape, p->numel, host);
    if (st != CLG_OK) {
        char tmp[CLG_ERR_LEN];
        snprintf(tmp, sizeof tmp, "%s", (err ? err : clg_err_tls())->msg);
        free(host);
        return clg_err_set(err, st, "%s: %s (is it a checkpoint of another model?)", path, tmp);
    }
    cl_int e = clEnqueueWriteBuffer(m->dev->queue, mem, CL_TRUE, 0, p->numel * sizeof(float), host, 0, NULL, NULL);
    free(host);
    if (e != CL_SUCCESS)
        return clg_cl_fail(err, e, "upload checkpoint tensor", __FILE__, __LINE__);
    return CLG_OK;
}

clg_status clg_session_load(clg_model *m, const char *path, int with_state)
{
    clg_err *err = clg_dev_err(m->dev);
    clg_ckpt *ck = NULL;
    CLG_TRY(clg_ckpt_load(err, path, &ck));
    clg_param_ref *refs = NULL;
    int n = 0;
    clg_status st = clg_replica_params(m->rep, 0, &refs, &n);
    char name[160];
    int nweights = 0;
    for (int i = 0; i < ck->nt && st == CLG_OK; i++)
        if (strncmp(ck->t[i].name, "opt.", 4) != 0)
            nweights++;
    for (int i = 0; i < n && st == CLG_OK; i++) {
        param_name(name, sizeof name, "", &refs[i]);
        st = load_device_tensor(m, ck, name, refs[i].param, clg_replica_master(m->rep, &refs[i]), path);
    }
    free(refs);
    if (st == CLG_OK && nweights != n)
        st = clg_err_set(err, CLG_ERR_SHAPE, "%s: checkpoint holds %d weight tensors, the model %s has %d (a checkpoint of another model?)",
                         path, nweights, m->net->source, n);
    /* normalization */
    int64_t nc = 0;
    if (st == CLG_OK && clg_ckpt_get_meta(ck, "norm.channels")) {
        st = clg_ckpt_get_meta_i64(err, ck, "norm.channels", &nc);
        if (st == CLG_OK && nc != 0 && nc != m->net->in_c)
            st = clg_err_set(err, CLG_ERR_FORMAT, "%s: normalization has %" PRId64 " channels, the model %d", path, nc,
                             m->net->in_c);
        char key[64];
        for (int c = 0; c < nc && st == CLG_OK; c++) {
            double mean = 0, sd = 1;
            snprintf(key, sizeof key, "norm.mean.%d", c);
            st = clg_ckpt_get_meta_f64(err, ck, key, &mean);
            snprintf(key, sizeof key, "norm.std.%d", c);
            if (st == CLG_OK)
                st = clg_ckpt_get_meta_f64(err, ck, key, &sd);
            m->norm.mean[c] = (float)mean;
            m->norm.std[c] = (float)sd;
        }
        if (st == CLG_OK && nc > 0) {
            m->norm.c = (int)nc;
            m->has_norm = 1;
        }
    }
    if (st == CLG_OK && with_state) {
        int64_t v = 0;
        st = clg_ckpt_get_meta_i64(err, ck, CLG_CKPT_KEY_STEP, &v);
        m->step = v;
        if (st == CLG_OK)
            st = clg_ckpt_get_meta_i64(err, ck, CLG_CKPT_KEY_EPOCH, &v);
        m->epoch = (int)v;
        if (st == CLG_OK)
            st = clg_ckpt_get_meta_i64(err, ck, "batch_in_epoch", &v);
        m->batch_in_epoch = (int)v;
        if (st == CLG_OK)
            st = clg_ckpt_get_meta_i64(err, ck, "batch", &v);
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
        if (st == CLG_OK && m->fp16) {
            double ls = 0;
            int64_t good = 0, skipped = 0;
            st = clg_ckpt_get_meta_f64(err, ck, "fp16.loss_scale", &ls);
            if (st == CLG_OK)
                st = clg_ckpt_get_meta_i64(err, ck, "fp16.good_steps", &good);
            if (st == CLG_OK)
                st = clg_ckpt_get_meta_i64(err, ck, "fp16.skipped", &skipped);
            if (st == CLG_OK && !(ls >= CLG_LS_MIN && ls <= CLG_LS_MAX && good >= 0))
                st = clg_err_set(err, CLG_ERR_FORMAT, "%s: fp16 loss scale %g / good steps %" PRId64 " out of range",
                                 path, ls, good);
            if (st == CLG_OK) {
                m->loss_scale = ls;
                m->ls_good = good;
                m->ls_skipped = skipped;
            }
        }
        const char *opt = clg_ckpt_get_meta(ck, CLG_CKPT_KEY_OPTIMIZER);
        if (st == CLG_OK && (!opt || clg_optim_parse(opt) != m->hp.optimizer))
            st = clg_err_set(err, CLG_ERR_INVALID_ARG, "%s: the checkpoint's optimizer is '%s', this run uses '%s'",
                             path, opt ? opt : "(none)", clg_optim_name(m->hp.optimizer));
        if (st == CLG_OK)
            st = clg_session_ensure_optim(m);
        if (st == CLG_OK)
            st = clg_ckpt_get_meta_i64(err, ck, "optimizer.t", &v);
        if (st == CLG_OK)
            m->opt->t = v;
        int ns = m->opt ? clg_optim_nstate(m->opt) : 0;
        for (int i = 0; st == CLG_OK && i < m->opt->n; i++) {
            if (ns >= 1) {
                param_name(name, sizeof name, "opt.m.", &m->opt->refs[i]);
                st = load_device_tensor(m, ck, name, m->opt->refs[i].param, m->opt->m[i], path);
            }
            if (ns >= 2 && st == CLG_OK) {
                param_name(name, sizeof name, "opt.v.", &m->opt->refs[i]);
                st = load_device_tensor(m, ck, name, m->opt->refs[i].param, m->opt->v[i], path);
            }
        }
    }
    clg_ckpt_free(ck);
    if (st == CLG_OK)
        st = clg_replica_weights_updated(m->rep); /* fp16: half copies of the loaded masters */
    return st;
}

// ---- evaluation ----

clg_status clg_session_evaluate(clg_model *m, const clg_dataset *ds, long limit, double *loss, double *acc,
                                int64_t *confusion, int *samples)
{
    clg_err *err = clg_dev_err(m->dev);
    int N = ds->n;
    if (limit > 0 && limit < N)
        N = (int)limit;
    int B = m->net->batch, classes = m->net->classes;
    const clg_tensor *outp = clg_replica_output(m->rep);
    int outw = outp->c * outp->h * outp->w;
    float *probs = confusion ? malloc((size_t)B * outw * sizeof(float)) : NULL;
    int nb = CLG_CEIL_DIV(N, B);
    float *res = calloc((size_t)CLG_MAX(nb, 1) * 2, sizeof(float));
    if (!res || (confusion && !probs)) {
        free(probs);
        free(res);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    clg_status st = CLG_OK;
    int cnt[CLG_STAGES] = {0};
    /* prefetch batch 0 */
    int count = 0;
    st = clg_session_stage_wait(m, 0);
    if (st == CLG_OK)
        st = clg_dataset_fill_batch(err, ds, &m->norm, NULL, 0, CLG_MIN(B, N), m->xhost[0], m->yhost[0], &count);
    cnt[0] = count;
    if (st == CLG_OK)
        st = clg_session_upload(m, 0, count, 1);
    for (int b = 0; b < nb && st == CLG_OK; b++) {
        int s = b % CLG_STAGES, nx = (b + 1) % CLG_STAGES;
        int n = cnt[s];
        st = clg_session_use_stage(m, s, n, 0);
        if (st == CLG_OK)
            st = clg_replica_forward(m->rep, n, 0);
        if (st == CLG_OK && m->rep->loss_index >= 0) { /* non-blocking: completed by the clFinish below */
            cl_int e = clEnqueueReadBuffer(m->dev->queue, m->rep->layers[m->rep->loss_index].loss.result, CL_FALSE, 0,
                                           2 * sizeof(float), &res[2 * b], 0, NULL, NULL);
            if (e != CL_SUCCESS)
                st = clg_cl_fail(err, e, "read evaluation loss", __FILE__, __LINE__);
        }
        if (st == CLG_OK && confusion) {
            cl_int e = clEnqueueReadBuffer(m->dev->queue, outp->mem, CL_TRUE, outp->off * sizeof(float),
                                           (size_t)n * outw * sizeof(float), probs, 0, NULL, NULL);
            if (e != CL_SUCCESS)
                st = clg_cl_fail(err, e, "read predictions", __FILE__, __LINE__);
        }
        if (st == CLG_OK)
            st = clg_session_stage_release(m, s);
        if (st == CLG_OK && b + 1 < nb) {
            int start = (b + 1) * B;
            st = clg_session_stage_wait(m, nx);
            if (st == CLG_OK)
                st = clg_dataset_fill_batch(err, ds, &m->norm, NULL, start, CLG_MIN(B, N - start), m->xhost[nx],
                                            m->yhost[nx], &count);
            cnt[nx] = count;
            if (st == CLG_OK)
                st = clg_session_upload(m, nx, count, 1);
        }
        if (st == CLG_OK && confusion) {
            for (int i = 0; i < n; i++) {
                int best = 0;
                for (int k = 1; k < outw; k++)
                    if (probs[(size_t)i * outw + k] > probs[(size_t)i * outw + best])
                        best = k;
                int y = ds->labels[b * B + i];
                if (y >= 0 && y < classes && best < classes)
                    confusion[(size_t)y * classes + best]++;
            }
        }
    }
    cl_int fe = clFinish(m->dev->queue); /* always: pending reads target res */
    if (st == CLG_OK && fe != CL_SUCCESS)
        st = clg_cl_fail(err, fe, "clFinish after evaluation", __FILE__, __LINE__);
    double ls = 0, cs = 0;
    for (int b = 0; b < nb; b++) {
        ls += res[2 * b];
        cs += res[2 * b + 1];
    }
    free(res);
    free(probs);
    if (st != CLG_OK)
        return st;
    *loss = N ? ls / N : 0;
    *acc = N ? cs / N : 0;
    if (samples)
        *samples = N;
    return CLG_OK;
}
