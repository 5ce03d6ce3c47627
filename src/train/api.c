/* Public model API (include/clgrad.h, "Models and training"). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "onnx/export.h"
#include "onnx/onnx.h"
#include "parallel/comm.h"
#include "train/session.h"

static void model_params_defaults(clg_model_params *p)
{
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    p->seed = 1;
    p->learning_rate = -1;
    p->momentum = -1;
    p->weight_decay = -1;
}

void clg_model_params_init_size(clg_model_params *p, size_t size)
{
    clg_model_params d;
    model_params_defaults(&d);
    clg_sized_init(p, size, &d, sizeof d);
}

static clg_status model_create(clg_ctx *ctx, const char *text, const char *source, const clg_model_params *p,
                               clg_model **out)
{
    clg_model_params def; /* the caller's fields within its size, defaults after */
    model_params_defaults(&def);
    if (p)
        CLG_TRY(clg_sized_read(&ctx->err, "clg_model_params", &def, sizeof def, p));
    p = &def;
    int fp16 = clg_precision_parse(p->precision);
    if (fp16 < 0)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "unknown precision '%s' (fp32 or fp16)", p->precision);
    if (!isfinite(p->learning_rate) || !isfinite(p->momentum) || !isfinite(p->weight_decay) ||
        !isfinite(p->bucket_mb))
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG,
                           "model params: learning_rate, momentum, weight_decay and bucket_mb must be finite");
    clg_pipe_params pp;
    CLG_TRY(clg_session_pipe_params(&ctx->err, p->parallel, p->stages, p->microbatches, p->pipe_schedule,
                                        p->pipe_recompute, &pp));
    clg_dp_params dpp = {.split = p->split, .bucket_mb = p->bucket_mb, .pipe = &pp,
                         .shard_optimizer = p->shard_optimizer};
    clg_model *m = NULL;
    CLG_TRY(clg_session_create(ctx, p->devices, p->device, text, source, p->batch, p->seed, fp16, &dpp, &m));
    if (p->optimizer) {
        int o = clg_optim_parse(p->optimizer);
        if (o < 0) {
            clg_session_free(m);
            return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "unknown optimizer '%s' (sgd, adam or adamw)",
                               p->optimizer);
        }
        m->hp.optimizer = o;
    }
    if (p->learning_rate >= 0)
        m->hp.learning_rate = p->learning_rate;
    if (p->momentum >= 0)
        m->hp.momentum = p->momentum;
    if (p->weight_decay >= 0)
        m->hp.weight_decay = p->weight_decay;
    *out = m;
    return CLG_OK;
}

clg_status clg_model_create_file(clg_ctx *ctx, const char *path, const clg_model_params *p, clg_model **out)
{
    if (!out)
        return clg_err_set(ctx ? &ctx->err : NULL, CLG_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    if (!ctx || !path)
        return clg_err_set(ctx ? &ctx->err : NULL, CLG_ERR_INVALID_ARG, "context and path are required");
    char *text = NULL;
    clg_ckpt *w = NULL; /* ONNX (detected by content): the weights came with the file */
    CLG_TRY(clg_model_file_read(&ctx->err, path, &text, &w));
    clg_status st = model_create(ctx, text, path, p, out);
    free(text);
    if (st == CLG_OK && w) {
        (*out)->imported = 1;
        st = clg_session_load_ckpt(*out, w, path, 0);
        if (st != CLG_OK) {
            clg_model_destroy(*out);
            *out = NULL;
        }
    }
    clg_ckpt_free(w);
    return st;
}

int clg_model_has_file_weights(const clg_model *m) { return m && m->imported; }

clg_status clg_model_export_onnx(clg_model *m, const char *path)
{
    if (!m || !path)
        return clg_err_set(m ? &m->ctx->err : NULL, CLG_ERR_INVALID_ARG, "model and path are required");
    if (m->pipe && (m->pipe->split_net || m->pipe->T > 1)) /* a layer cut inside, tp: slices gathered into the
                                                               whole-network lane */
        CLG_TRY(clg_session_pipe_gather(m, 0));
    else if (m->pipe) { /* each layer's weights from its stage: no whole network */
        const clg_replica **reps = malloc(sizeof *reps * (size_t)m->net->nlayers);
        if (!reps)
            return clg_err_set(&m->ctx->err, CLG_ERR_HOST_OOM, "out of memory");
        for (int i = 0; i < m->net->nlayers; i++)
            reps[i] = clg_pipe_rep_of(m->pipe, i);
        clg_status st = clg_onnx_export_stages(&m->ctx->err, m->net, reps, m->has_norm ? &m->norm : NULL, path);
        free(reps);
        return st;
    }
    return clg_onnx_export(&m->ctx->err, m->net, clg_session_rep(m), m->has_norm ? &m->norm : NULL, path);
}

clg_status clg_model_create_string(clg_ctx *ctx, const char *text, const char *source_name, const clg_model_params *p,
                                   clg_model **out)
{
    if (!out)
        return clg_err_set(ctx ? &ctx->err : NULL, CLG_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    if (!ctx || !text)
        return clg_err_set(ctx ? &ctx->err : NULL, CLG_ERR_INVALID_ARG, "context and text are required");
    return model_create(ctx, text, source_name ? source_name : "<string>", p, out);
}

void clg_model_destroy(clg_model *m) { clg_session_free(m); }

void clg_model_shape(const clg_model *m, int *channels, int *height, int *width, int *classes, int *batch)
{
    if (channels)
        *channels = m->net->in_c;
    if (height)
        *height = m->net->in_h;
    if (width)
        *width = m->net->in_w;
    if (classes)
        *classes = m->net->classes;
    if (batch)
        *batch = m->net->batch;
}

size_t clg_model_summary(const clg_model *m, char *buf, size_t cap)
{
    char *data = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&data, &len);
    if (!f) {
        if (buf && cap)
            buf[0] = 0;
        return 0;
    }
    const clg_replica *r = clg_session_rep(m);
    clg_net_print(m->net, f);
    fprintf(f, "activations: %.2f MiB planned by liveness vs %.2f MiB naive (%d buffers) at batch %d\n",
            r->planned_bytes / 1048576.0, r->naive_bytes / 1048576.0, r->nslots, m->net->batch);
    if (m->fp16)
        fprintf(f, "precision fp16: %.2f MiB planned (half tensors + fp32 working buffers) vs %.2f MiB in fp32 (%.2f MiB with the same arena planner)\n",
                r->planned_bytes / 1048576.0, r->fp32_bytes / 1048576.0, r->fp32_offset_bytes / 1048576.0);
    char devs[512];
    clg_session_devices(m, devs, sizeof devs);
    fprintf(f, "devices: %s\n", devs);
    fclose(f);
    if (buf && cap) {
        size_t n = len < cap - 1 ? len : cap - 1;
        memcpy(buf, data, n);
        buf[n] = 0;
    }
    free(data);
    return len;
}

clg_status clg_model_load_weights(clg_model *m, const char *path)
{
    if (!m || !path)
        return clg_err_set(m ? &m->ctx->err : NULL, CLG_ERR_INVALID_ARG, "model and path are required");
    return clg_session_load(m, path, 0);
}

clg_status clg_model_save_weights(clg_model *m, const char *path)
{
    if (!m || !path)
        return clg_err_set(m ? &m->ctx->err : NULL, CLG_ERR_INVALID_ARG, "model and path are required");
    return clg_session_save(m, path, 0, 0);
}

/* Normalizes raw images (values as the dataset reader yields them) into the
 * stage's host buffer. */
static void stage_images(clg_model *m, int s, const float *images, int n)
{
    size_t hw = (size_t)m->net->in_h * m->net->in_w;
    size_t sample = hw * m->net->in_c;
    float *dst = m->xhost[s];
    for (int i = 0; i < n; i++)
        for (int c = 0; c < m->net->in_c; c++) {
            float mean = 0, sd = 1;
            if (m->has_norm && c < m->norm.c) {
                mean = m->norm.mean[c];
                sd = m->norm.std[c];
            }
            const float *src = images + i * sample + c * hw;
            float *d = dst + i * sample + c * hw;
            for (size_t k = 0; k < hw; k++)
                d[k] = (src[k] - mean) / sd;
        }
}

/* Prediction takes images: a model reading token ids is refused, naming what does apply to it. */
static clg_status predict_images_only(clg_model *m)
{
    if (!m->net->input_tokens)
        return CLG_OK;
    return clg_err_set(&m->ctx->err, CLG_ERR_UNSUPPORTED,
                       "predict: model %s reads token ids ([net] input = tokens), not images: predict a text's next "
                       "bytes with clg_model_predict_text (`clgrad predict MODEL --data text:FILE` or --prompt TEXT), "
                       "continue it with clg_model_generate (`clgrad generate MODEL --weights FILE --prompt TEXT`) or "
                       "measure its loss with clg_model_evaluate (`clgrad eval MODEL --data text:FILE`)",
                       m->net->source);
}

clg_status clg_model_predict(clg_model *m, const float *images, int n, float *probs)
{
    if (!m || !images || !probs || n < 1)
        return clg_err_set(m ? &m->ctx->err : NULL, CLG_ERR_INVALID_ARG, "predict: model, images, probs and n >= 1 are required");
    clg_err *err = &m->ctx->err;
    CLG_TRY(predict_images_only(m));
    int B = m->net->batch;
    size_t sample = (size_t)m->net->in_c * m->net->in_h * m->net->in_w;
    const clg_tensor *o = clg_replica_output(clg_session_rep(m));
    size_t ow = (size_t)o->c * o->h * o->w;
    if (ow != (size_t)m->net->classes) /* probs holds n * classes floats */
        return clg_err_set(err, CLG_ERR_SHAPE,
                           "predict: the model's output is %dx%dx%d per image, not %d class scores (a loss layer on a "
                           "spatial output?)",
                           o->c, o->h, o->w, m->net->classes);
    if (clg_comm_size() > 1) /* uploads take this rank's slice: the other rows would stay unwritten */
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "predict: runs in one process; under mpirun (%d ranks) use rank 0 alone or run it without "
                           "mpirun",
                           clg_comm_size());
    for (int start = 0; start < n; start += B) {
        int cnt = CLG_MIN(B, n - start);
        CLG_TRY(clg_session_stage_wait(m, 0));
        stage_images(m, 0, images + (size_t)start * sample, cnt);
        CLG_TRY(clg_session_upload(m, 0, cnt, 0));
        CLG_TRY(clg_session_forward(m, 0, 0, NULL, probs + (size_t)start * ow));
    }
    return CLG_OK;
}

clg_status clg_model_train_step(clg_model *m, const float *images, const int32_t *labels, int n)
{
    if (!m || !images || !labels)
        return clg_err_set(m ? &m->ctx->err : NULL, CLG_ERR_INVALID_ARG, "train_step: images and labels are required");
    clg_err *err = &m->ctx->err;
    if (n < 1 || n > m->net->batch)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "train_step: n = %d outside [1, %d] (the model's batch)", n,
                           m->net->batch);
    int lps = clg_net_labels_per_sample(m->net); /* token models: a target per position */
    for (int i = 0; i < n * lps; i++)
        if (labels[i] < 0 || labels[i] >= m->net->classes)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "train_step: label %d of sample %d outside [0, %d)",
                               labels[i], i / lps, m->net->classes);
    CLG_TRY(clg_session_stage_wait(m, 0));
    stage_images(m, 0, images, n);
    memcpy(m->yhost[0], labels, (size_t)n * lps * sizeof(int32_t));
    CLG_TRY(clg_session_upload(m, 0, n, 1));
    float res[2] = {0, 0};
    CLG_TRY(clg_session_train_step(m, 0, m->hp.learning_rate, res));
    m->last.step = m->step;
    m->last.loss = res[0] / n;
    m->last.accuracy = res[1] / n;
    m->last.samples = n;
    return CLG_OK;
}

clg_status clg_model_metrics_size(const clg_model *m, clg_metrics *out, size_t size)
{
    if (!m || !out)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "metrics: model and out are required");
    clg_metrics r = m->last;
    r.step = m->step;
    clg_sized_write(out, size, &r, sizeof r); /* the caller's sizeof */
    return CLG_OK;
}

clg_status clg_model_memory_size(const clg_model *m, int index, clg_device_memory *out, size_t size)
{
    if (!m || !out)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "memory: model and out are required");
    int rows = clg_session_mem_rows(m), dev = 0, stage = -1; /* a pipeline: a row per stage */
    if (index < 0 || index >= rows)
        return clg_err_set(&m->ctx->err, CLG_ERR_INVALID_ARG, "memory: device %d of a model on %d device(s)", index,
                           rows);
    clg_dp_mem dm;
    clg_session_memory(m, index, &dm, &dev, &stage);
    clg_device_memory r = {.devices = rows,
                           .device = dev,
                           .parameters = dm.params,
                           .optimizer = dm.optim,
                           .activations = dm.activations,
                           .workspace = dm.workspace,
                           .peak = dm.peak,
                           .limit = dm.limit};
    clg_sized_write(out, size, &r, sizeof r); /* the caller's sizeof */
    return CLG_OK;
}

static clg_status model_evaluate(clg_model *m, const char *data, long limit, clg_eval_report *out);

clg_status clg_model_evaluate_size(clg_model *m, const char *data, long limit, clg_eval_report *out, size_t size)
{
    clg_eval_report r;
    memset(&r, 0, sizeof r);
    clg_status st = model_evaluate(m, data, limit, out ? &r : NULL);
    clg_sized_write(out, size, &r, sizeof r); /* the caller's sizeof */
    return st;
}

static clg_status model_evaluate(clg_model *m, const char *data, long limit, clg_eval_report *out)
{
    if (!m || !data || !out)
        return clg_err_set(m ? &m->ctx->err : NULL, CLG_ERR_INVALID_ARG, "evaluate: model, data and out are required");
    memset(out, 0, sizeof *out);
    clg_err *err = &m->ctx->err;
    if (clg_session_rep(m)->loss_index < 0)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "%s: evaluation needs a loss layer (softmax)", m->net->source);
    clg_dataset *ds = NULL;
    int lps = clg_net_labels_per_sample(m->net);
    if ((lps > 1) != (clg_text_spec_path(data) != NULL))
        return clg_err_set(err, CLG_ERR_SHAPE, lps > 1 ? "model %s reads token ids: evaluate it on text data (--data "
                                                         "text:FILE), not '%s'"
                                                       : "model %s takes images: '%s' is text data",
                           m->net->source, data);
    CLG_TRY(clg_dataset_open_for(err, m->ctx->opts.data_dir, data, CLG_SPLIT_TEST, lps > 1 ? lps : 0, &ds));
    if (ds->text) { /* the held-out tail: loss per byte and bits per byte, no confusion matrix */
        clg_status st = clg_session_check_text(m, ds);
        if (st == CLG_OK)
            st = clg_session_evaluate(m, ds, limit, &out->loss, &out->accuracy, NULL, &out->samples);
        out->bits_per_byte = out->loss / M_LN2;
        clg_dataset_free(ds);
        return st;
    }
    clg_status st = CLG_OK;
    if (ds->c != m->net->in_c || ds->h != m->net->in_h || ds->w != m->net->in_w)
        st = clg_err_set(err, CLG_ERR_SHAPE, "dataset %s has images %dx%dx%d, the model %s expects %dx%dx%d",
                         ds->source, ds->c, ds->h, ds->w, m->net->source, m->net->in_c, m->net->in_h, m->net->in_w);
    else {
        int maxl = -1;
        for (int i = 0; i < ds->n; i++)
            if (ds->labels[i] > maxl)
                maxl = ds->labels[i];
        if (maxl < 0 || maxl >= m->net->classes)
            st = clg_err_set(err, CLG_ERR_SHAPE, "dataset %s: labels %s the model's %d classes", ds->source,
                             maxl < 0 ? "are missing, evaluation needs" : "exceed", m->net->classes);
    }
    int C = m->net->classes;
    if (st == CLG_OK) {
        out->confusion = calloc((size_t)C * C, sizeof(int64_t));
        if (!out->confusion)
            st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    if (st == CLG_OK)
        st = clg_session_evaluate(m, ds, limit, &out->loss, &out->accuracy, out->confusion, &out->samples);
    out->classes = C;
    clg_dataset_free(ds);
    if (st != CLG_OK) {
        free(out->confusion);
        out->confusion = NULL;
    }
    return st;
}

void clg_eval_report_free(clg_eval_report *r)
{
    if (r) {
        free(r->confusion);
        r->confusion = NULL;
    }
}

void clg_free(void *p) { free(p); }

clg_status clg_model_predict_file(clg_model *m, const char *path, float **probs, int *n)
{
    if (!m || !path || !probs || !n)
        return clg_err_set(m ? &m->ctx->err : NULL, CLG_ERR_INVALID_ARG, "predict: arguments are required");
    *probs = NULL;
    *n = 0;
    clg_err *err = &m->ctx->err;
    CLG_TRY(predict_images_only(m));
    clg_dataset *ds = NULL;
    CLG_TRY(clg_dataset_load_image(err, path, &ds));
    clg_status st = CLG_OK;
    if (ds->c != m->net->in_c || ds->h != m->net->in_h || ds->w != m->net->in_w)
        st = clg_err_set(err, CLG_ERR_SHAPE, "%s has images %dx%dx%d, the model %s expects %dx%dx%d", path, ds->c,
                         ds->h, ds->w, m->net->source, m->net->in_c, m->net->in_h, m->net->in_w);
    size_t sample = clg_dataset_sample_size(ds);
    float *x = NULL;
    const clg_tensor *o = clg_replica_output(clg_session_rep(m));
    size_t ow = (size_t)o->c * o->h * o->w;
    if (st == CLG_OK) {
        x = malloc((size_t)ds->n * sample * sizeof(float));
        *probs = malloc((size_t)ds->n * ow * sizeof(float));
        if (!x || !*probs)
            st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    if (st == CLG_OK) {
        /* raw values (scale only); clg_model_predict normalizes */
        int cnt = 0;
        st = clg_dataset_fill_batch(err, ds, NULL, NULL, 0, ds->n, x, NULL, &cnt);
    }
    if (st == CLG_OK)
        st = clg_model_predict(m, x, ds->n, *probs);
    free(x);
    if (st == CLG_OK)
        *n = ds->n;
    else {
        free(*probs);
        *probs = NULL;
    }
    clg_dataset_free(ds);
    return st;
}

// ---- bench ----

static void bench_train_params_defaults(clg_bench_train_params *p)
{
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    p->batch = 128;
    p->steps = 20;
    p->warmup = 3;
    p->seed = 1;
}

void clg_bench_train_params_init_size(clg_bench_train_params *p, size_t size)
{
    clg_bench_train_params d;
    bench_train_params_defaults(&d);
    clg_sized_init(p, size, &d, sizeof d);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static clg_status bench_train(clg_ctx *ctx, const clg_bench_train_params *p, clg_bench_train_report *out);

clg_status clg_bench_train_size(clg_ctx *ctx, const clg_bench_train_params *p, clg_bench_train_report *out,
                                size_t size)
{
    clg_bench_train_report r;
    memset(&r, 0, sizeof r);
    clg_status st = bench_train(ctx, p, out ? &r : NULL);
    clg_sized_write(out, size, &r, sizeof r); /* the caller's sizeof */
    return st;
}

/* The model params of a bench train run. */
static void bench_model_params(const clg_bench_train_params *p, clg_model_params *mp)
{
    clg_model_params_init(mp);
    mp->batch = p->batch;
    mp->device = p->device;
    mp->devices = p->devices;
    mp->split = p->split;
    mp->bucket_mb = p->bucket_mb;
    mp->parallel = p->parallel;
    mp->stages = p->stages;
    mp->microbatches = p->microbatches;
    mp->pipe_schedule = p->pipe_schedule;
    mp->pipe_recompute = p->pipe_recompute;
    mp->shard_optimizer = p->shard_optimizer;
    mp->seed = p->seed;
    mp->precision = p->precision;
}

/* The layout part of a bench train report: shares, pipeline bubble, the largest device's memory. */
static void bench_report_layout(clg_model *m, clg_bench_train_report *out)
{
    clg_session_shares(m, out->shares, sizeof out->shares, &out->devices);
    out->pipe_bubble = m->pipe ? clg_pipe_bubble(m->pipe) : -1;
    for (int l = 0; l < clg_session_mem_rows(m); l++) { /* a pipeline: its stages' devices */
        clg_dp_mem dm;
        int dev = 0, stage = -1;
        clg_session_memory(m, l, &dm, &dev, &stage);
        out->mem_peak_mib = fmax(out->mem_peak_mib, dm.peak / 1048576.0);
        out->mem_optim_mib = fmax(out->mem_optim_mib, dm.optim / 1048576.0);
    }
}

/* CPU seconds of the process so far (all threads; 0 where unknown). */
static double cpu_now(void)
{
    struct timespec cpu;
    return clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu) == 0 ? (double)cpu.tv_sec + 1e-9 * (double)cpu.tv_nsec : 0;
}

/* Extra warm-up steps at most while the data-parallel split settles (clg_dp_settled). */
#define BENCH_SETTLE_MAX 16

/* 1 when the warm-up must go on: data parallel over 2+ devices (no pipeline) not settled yet. */
static int bench_unsettled(const clg_model *m) { return !m->pipe && m->dp && m->dp->n > 1 && !clg_dp_settled(m->dp); }

/* Sets up the timed part: queues drained, profiles and counters reset, the trace opened. */
static clg_status bench_timed_start(clg_ctx *ctx, clg_model *m, const clg_bench_train_params *p,
                                    unsigned long long *launches0)
{
    clg_status st = clg_dp_finish(m->dp);
    clg_replica_profile_reset(clg_session_rep(m));
    if (m->pipe)
        clg_pipe_bubble_reset(m->pipe);
    *launches0 = 0;
    for (int d = 0; d < ctx->ndev; d++)
        *launches0 += ctx->devs[d].launches;
    if (st == CLG_OK && p->trace)
        st = clg_session_trace_open(m, p->trace, p->steps);
    return st;
}

/* The warm-up and timed steps of bench train: the warm-up runs p->warmup
 * steps, then (data parallel) on until the split has settled and every
 * per-device batch size was met (at most BENCH_SETTLE_MAX more), so the
 * timed steps build and measure nothing; times[] the timed steps' wall
 * times, out's throughput, start-up and split figures. */
static clg_status bench_steps(clg_ctx *ctx, clg_model *m, const clg_bench_train_params *p, double *times,
                              clg_bench_train_report *out)
{
    int B = m->net->batch, warm_end = p->warmup, moves0 = 0, prep0 = 0;
    double lr = m->hp.learning_rate * 0.1; /* small: random labels must not blow up the weights */
    double t_start = 0, prep_s0 = 0, cpu0 = 0;
    unsigned long long launches0 = 0;
    clg_status st = clg_session_upload(m, 0, B, 1);
    int hooked = 0; /* warm_done from the lanes' end of the first step, before its new batch sizes are met */
    if (p->warm_done && warm_end > 0 && m->dp && !m->pipe) {
        m->dp->first_end = p->warm_done;
        m->dp->first_end_user = p->warm_done_user;
        hooked = 1;
    }
    for (int i = 0; i < warm_end + p->steps && st == CLG_OK; i++) {
        int s = i % CLG_STAGES, nx = (i + 1) % CLG_STAGES;
        if (i == warm_end) {
            st = bench_timed_start(ctx, m, p, &launches0);
            moves0 = m->dp ? m->dp->rebalances : 0;
            prep0 = m->dp ? m->dp->prepares : 0;
            prep_s0 = m->dp ? m->dp->prepare_s : 0;
            if (m->dp && warm_end > 0) /* settled in the warm-up: kept (--warmup 0 times the calibration too) */
                m->dp->frozen = 1;
            t_start = clg_now_sec();
            cpu0 = cpu_now();
        }
        double t0 = clg_now_sec();
        if (st == CLG_OK)
            st = clg_session_step_begin(m, s, lr, NULL, NULL);
        clg_status su = CLG_OK;
        if (st == CLG_OK && i + 1 < warm_end + p->steps) { /* the next step's batch */
            su = clg_session_stage_wait(m, nx);
            if (su == CLG_OK)
                su = clg_session_upload(m, nx, B, 1);
        }
        if (st == CLG_OK)
            st = clg_session_step_end(m);
        if (st == CLG_OK)
            st = su;
        if (st == CLG_OK && i == 0) {
            /* start-up: time to the end of the first step (an untimed one
             * when there is warm-up; with --warmup 0 it is waited for anyway) */
            st = clg_dp_finish(m->dp);
            out->first_step_end = clg_now_sec();
            out->first_step_cpu_s = cpu_now();
            out->first_step_s = out->first_step_end - t0;
            /* every kernel of a step is built now: a background precompile helper still compiling would
             * only compete with the algorithm timing and the split's calibration of the next warm-up steps
             * (--warmup 0 times the start-up: nothing is stopped) */
            if (p->warm_done && warm_end > 0 && !hooked)
                p->warm_done(p->warm_done_user);
        }
        if (st == CLG_OK && i >= warm_end) {
            /* per-step time for the median: wait for the step */
            st = clg_dp_finish(m->dp);
            times[i - warm_end] = clg_now_sec() - t0;
        } else if (i + 1 == warm_end && warm_end < p->warmup + BENCH_SETTLE_MAX && bench_unsettled(m)) {
            warm_end++;
        }
    }
    if (m->dp)
        m->dp->frozen = 0;
    if (st != CLG_OK)
        return st;
    double el = clg_now_sec() - t_start;
    out->cpu_ms_per_step = 1000 * (cpu_now() - cpu0) / p->steps;
    out->seconds = el;
    out->images_per_s = (double)B * p->steps / el;
    out->ms_per_step = 1000 * el / p->steps;
    unsigned long long launches = 0;
    for (int d = 0; d < ctx->ndev; d++)
        launches += ctx->devs[d].launches;
    out->launches_per_step = (double)(launches - launches0) / p->steps;
    out->warmup_run = warm_end;
    if (m->dp) {
        out->split_moves_timed = m->dp->rebalances - moves0;
        out->prepares_timed = m->dp->prepares - prep0;
        out->prepare_timed_s = m->dp->prepare_s - prep_s0;
    }
    return CLG_OK;
}

static clg_status bench_train(clg_ctx *ctx, const clg_bench_train_params *p, clg_bench_train_report *out)
{
    clg_err *err = ctx ? &ctx->err : NULL;
    if (!ctx || !p || !out)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "bench train: context, params and report are required");
    clg_bench_train_params pl; /* the caller's fields within its size, defaults after */
    bench_train_params_defaults(&pl);
    CLG_TRY(clg_sized_read(err, "clg_bench_train_params", &pl, sizeof pl, p));
    p = &pl;
    if (!p->model)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "bench train: model is required");
    if (p->batch < 1 || p->steps < 1 || p->warmup < 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "bench train: batch and steps must be >= 1");
    memset(out, 0, sizeof *out);
    clg_model_params mp;
    bench_model_params(p, &mp);
    clg_model *m = NULL;
    double t_setup = clg_now_sec();
    CLG_TRY(clg_model_create_file(ctx, p->model, &mp, &m));
    out->setup_s = clg_now_sec() - t_setup;
    /* synthetic data: fixed random images and labels, uploaded each step like real batches */
    clg_rng r;
    clg_rng_seed(&r, p->seed, 77);
    int B = m->net->batch;
    size_t sample = (size_t)m->net->in_c * m->net->in_h * m->net->in_w;
    int lps = clg_net_labels_per_sample(m->net); /* token models: random ids below the classes, a target per position */
    for (int s = 0; s < CLG_STAGES; s++) {
        for (size_t i = 0; i < (size_t)B * sample; i++)
            m->xhost[s][i] = lps > 1 ? (float)(clg_rng_u32(&r) % (uint32_t)m->net->classes) : clg_rng_normal(&r);
        for (int i = 0; i < B * lps; i++)
            m->yhost[s][i] = (int32_t)(clg_rng_u32(&r) % (uint32_t)m->net->classes);
    }
    double *times = calloc((size_t)p->steps, sizeof(double));
    clg_status st = times ? CLG_OK : clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    if (st == CLG_OK)
        st = bench_steps(ctx, m, p, times, out);
    if (st == CLG_OK) {
        out->tokens_per_sample = m->net->input_tokens ? (int)sample : 0;
        out->tokens_per_s = out->images_per_s * out->tokens_per_sample;
        qsort(times, (size_t)p->steps, sizeof(double), cmp_d);
        out->ms_per_step_median = 1000 * times[p->steps / 2];
        bench_report_layout(m, out);
        const char *w = clg_dp_take_warning(m->dp);
        snprintf(out->warning, sizeof out->warning, "%s", w ? w : "");
    }
    free(times);
    if (m->trace) {
        clg_status tst = clg_session_trace_close(m);
        if (st == CLG_OK)
            st = tst;
    }
    if (st == CLG_OK)
        clg_replica_profile_feedback(clg_session_rep(m));
    clg_replica_print_profile(clg_session_rep(m), stderr);
    clg_model_destroy(m);
    return st;
}
