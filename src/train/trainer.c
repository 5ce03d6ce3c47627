/* The training loop: epochs over a seeded shuffled dataset, double-buffered
 * uploads, metrics, per-epoch evaluation, CSV log + SVG plot, progress on
 * stderr, checkpoints and exact resume. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parallel/comm.h"
#include "io/metrics.h"
#include "parallel/tensor.h"
#include "train/session.h"
#include "onnx/onnx.h"

static void train_params_defaults(clg_train_params *p)
{
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    p->learning_rate = -1;
    p->warmup = -1;
    p->momentum = -1;
    p->weight_decay = -1;
    p->clip_norm = -1;
    p->seed = 1;
    p->precision = "fp32";
}

void clg_train_params_init_size(clg_train_params *p, size_t size)
{
    clg_train_params d;
    train_params_defaults(&d);
    clg_sized_init(p, size, &d, sizeof d);
}

// ---- progress ----

typedef struct progress {
    int on, tty;
    double t_last, t_start;
    int last_pct;
    int tokens; /* text data: T tokens per sample, the rate shown in tokens/s */
} progress;

static void fmt_eta(char *dst, size_t n, double s)
{
    if (!isfinite(s) || s < 0)
        s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(dst, n, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else
        snprintf(dst, n, "%ld:%02ld", t / 60, t % 60);
}

static void progress_show(progress *p, int epoch, int epochs, int done, int total, double loss, double acc,
                          double ips, double eta, const char *shares, int final)
{
    if (!p->on)
        return;
    double now = clg_now_sec();
    int pct = total ? (int)(100.0 * done / total) : 100;
    const char *unit = p->tokens ? "tok/s" : "img/s";
    if (p->tokens)
        ips *= p->tokens;
    char e[32];
    fmt_eta(e, sizeof e, eta);
    if (p->tty) {
        if (!final && now - p->t_last < 0.2)
            return;
        p->t_last = now;
        char bar[31];
        int fill = total ? (int)(30.0 * done / total) : 30;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
        bar[30] = 0;
        fprintf(stderr, "\repoch %d/%d [%s] %d/%d loss %.4f acc %5.2f%% %.0f %s%s%s ETA %s   ", epoch + 1,
                epochs, bar, done, total, loss, 100 * acc, ips, unit, shares ? " split " : "", shares ? shares : "", e);
        if (final)
            fputc('\n', stderr);
        fflush(stderr);
    } else {
        /* plain lines: every 25% of an epoch and at its end */
        if ((!final && pct / 25 == p->last_pct / 25) || (final && p->last_pct == 100))
            return;
        p->last_pct = pct;
        fprintf(stderr, "epoch %d/%d %3d%% (%d/%d) loss %.4f acc %.2f%% %.0f %s%s%s ETA %s\n", epoch + 1, epochs,
                pct, done, total, loss, 100 * acc, ips, unit, shares ? " split " : "", shares ? shares : "", e);
    }
}

// ---- settings and data checks ----

/* "none", "flip", "shift:N" or "flip,shift:N" (either order). */
static clg_status parse_augment(clg_err *err, const char *spec, int *flip, int *shift)
{
    int f = 0, sh = 0;
    if (strcmp(spec, "none") != 0) {
        const char *p = spec;
        while (*p) {
            size_t n = strcspn(p, ",");
            int v = -1, used = 0;
            if (n == 4 && strncmp(p, "flip", 4) == 0)
                f = 1;
            else if (n > 6 && strncmp(p, "shift:", 6) == 0 && sscanf(p + 6, "%d%n", &v, &used) == 1 &&
                     (size_t)used == n - 6 && v >= 0 && v <= CLG_DS_MAX_SHIFT)
                sh = v;
            else
                return clg_err_set(err, CLG_ERR_INVALID_ARG,
                                   "augment '%s': expected none, flip, shift:N (N in 0..%d) or flip,shift:N", spec,
                                   CLG_DS_MAX_SHIFT);
            p += n;
            if (*p == ',')
                p++;
        }
    }
    *flip = f;
    *shift = sh;
    return CLG_OK;
}

static clg_status apply_overrides(clg_err *err, clg_model *m, const clg_train_params *p)
{
    clg_hparams *h = &m->hp;
    const struct {
        const char *name;
        double v;
    } num[] = {{"learning_rate", p->learning_rate}, {"momentum", p->momentum}, {"weight_decay", p->weight_decay},
               {"clip_norm", p->clip_norm}, {"bucket_mb", p->bucket_mb}};
    for (size_t i = 0; i < CLG_ARRAY_LEN(num); i++) /* NaN compares false with everything: refuse it by name */
        if (!isfinite(num[i].v))
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "train: %s is %g (must be a finite number)", num[i].name,
                               num[i].v);
    if (p->learning_rate >= 0)
        h->learning_rate = p->learning_rate;
    if (p->momentum >= 0)
        h->momentum = p->momentum;
    if (p->weight_decay >= 0)
        h->weight_decay = p->weight_decay;
    if (p->clip_norm >= 0)
        h->clip_norm = p->clip_norm;
    if (p->warmup >= 0)
        h->warmup = p->warmup;
    if (p->epochs > 0)
        h->epochs = p->epochs;
    if (p->optimizer) {
        int o = clg_optim_parse(p->optimizer);
        if (o < 0)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "unknown optimizer '%s' (sgd, adam or adamw)", p->optimizer);
        h->optimizer = o;
    }
    if (p->augment)
        CLG_TRY(parse_augment(err, p->augment, &h->augment_flip, &h->augment_shift));
    if (p->schedule) {
        int s = clg_sched_parse(p->schedule);
        if (s < 0)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "unknown schedule '%s' (none, step or cosine)", p->schedule);
        h->schedule = s;
    }
    return CLG_OK;
}

/* Text data goes with a model that reads token ids (clg_net_labels_per_sample > 1), and such a model with text. */
static clg_status check_text_model(clg_err *err, const clg_net *net, const char *spec)
{
    int tokens = clg_net_labels_per_sample(net) > 1;
    if (clg_text_spec_path(spec) && !tokens)
        return clg_err_set(err, CLG_ERR_SHAPE,
                           "--data %s: text data needs a model that reads token ids (its first layer an [embedding]); "
                           "%s takes %dx%dx%d images",
                           spec, net->source, net->in_c, net->in_h, net->in_w);
    if (!clg_text_spec_path(spec) && tokens)
        return clg_err_set(err, CLG_ERR_SHAPE, "model %s reads token ids: give it text data (--data text:FILE), not '%s'",
                           net->source, spec);
    return CLG_OK;
}

static clg_status check_data(clg_err *err, const clg_model *m, const clg_dataset *ds)
{
    const clg_net *net = m->net;
    if (ds->text) /* ids and targets are bytes: below the vocabulary (check_text_model) */
        return ds->n >= 1 ? CLG_OK : clg_err_set(err, CLG_ERR_FORMAT, "text data %s has no window", ds->source);
    if (ds->c != net->in_c || ds->h != net->in_h || ds->w != net->in_w)
        return clg_err_set(err, CLG_ERR_SHAPE, "dataset %s has images %dx%dx%d, the model %s expects %dx%dx%d",
                           ds->source, ds->c, ds->h, ds->w, net->source, net->in_c, net->in_h, net->in_w);
    if (ds->n < 1)
        return clg_err_set(err, CLG_ERR_FORMAT, "dataset %s is empty", ds->source);
    int maxl = -1;
    for (int i = 0; i < ds->n; i++)
        if (ds->labels[i] > maxl)
            maxl = ds->labels[i];
    if (maxl < 0)
        return clg_err_set(err, CLG_ERR_FORMAT, "dataset %s has no labels: it cannot be used for training", ds->source);
    if (maxl >= net->classes)
        return clg_err_set(err, CLG_ERR_SHAPE, "dataset %s has label %d, the model %s only %d classes", ds->source,
                           maxl, net->source, net->classes);
    return CLG_OK;
}

typedef struct train_state {
    clg_model *m;
    const clg_train_params *p;
    clg_dataset *train, *test;
    int32_t *perm;
    float *res;     /* 2 floats per lane per batch of the epoch */
    cl_event *res_ev; /* per lane per batch */
    int nres;
    FILE *csv;
    char ckpt_path[4200];
    /* the run's shape (set by run_setup) */
    int N, B, L, spe, epochs; /* samples used per epoch, batch, lanes, steps per epoch, epochs */
    int64_t total;            /* steps of the whole run */
    progress pr;
    int first_done; /* p->first_step_done was called */
} train_state;

/* One epoch in progress. */
typedef struct epoch_state {
    int e, b0;
    clg_ds_augment aug;
    int cnt[CLG_STAGES]; /* samples staged per host buffer */
    int stop;            /* max_steps reached inside the epoch */
    double t0;
    int64_t imgs;
    double lsum, csum;             /* loss and correct sums of the collected batches */
    int64_t seen, seen_mine;       /* global samples; this rank's slice of them (MPI) */
    int next_read;                 /* the first batch whose results are not collected */
} epoch_state;

static clg_status save_ckpt(train_state *ts, int64_t total)
{
    if (!ts->p->checkpoint_dir || clg_comm_rank() != 0) /* MPI: rank 0 writes (every rank holds the same) */
        return CLG_OK;
    clg_err *err = &ts->m->ctx->err;
    CLG_TRY(clg_mkdirs(err, ts->p->checkpoint_dir));
    return clg_session_save(ts->m, ts->ckpt_path, 1, total);
}

/* Folds batch b's per-lane results into the epoch sums once every lane's
 * read is done (wait: block for them). Returns 1 when folded. */
static int collect(train_state *ts, int b, int wait, double *lsum, double *csum)
{
    int L = ts->m->dp->n;
    cl_event *ev = &ts->res_ev[(size_t)b * L];
    for (int l = 0; l < L; l++) {
        if (!ev[l])
            continue;
        cl_int stv = CL_QUEUED;
        if (wait)
            clWaitForEvents(1, &ev[l]);
        if (clGetEventInfo(ev[l], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof stv, &stv, NULL) != CL_SUCCESS ||
            (stv != CL_COMPLETE && stv >= 0))
            return 0;
    }
    for (int l = 0; l < L; l++) {
        *lsum += ts->res[((size_t)b * L + l) * 2];
        *csum += ts->res[((size_t)b * L + l) * 2 + 1];
        clg_release_event(&ev[l]);
    }
    return 1;
}

/* This rank's share of n samples of a global batch (all of them with one rank). */
static int slice_of(int n)
{
    int off = 0, cnt = n;
    clg_comm_slice(n, &off, &cnt);
    return cnt;
}

// ---- one epoch ----

/* The run's shape and its per-batch result buffers. */
static clg_status run_setup(train_state *ts)
{
    clg_model *m = ts->m;
    const clg_train_params *p = ts->p;
    clg_err *err = &m->ctx->err;
    ts->N = ts->train->n;
    if (p->limit_train > 0 && p->limit_train < ts->N)
        ts->N = (int)p->limit_train;
    ts->B = m->net->batch;
    ts->L = m->dp->n;
    ts->spe = CLG_CEIL_DIV(ts->N, ts->B);
    ts->epochs = m->hp.epochs;
    ts->total = (int64_t)ts->spe * ts->epochs;
    if (m->epoch > ts->epochs || (m->epoch == ts->epochs && m->batch_in_epoch > 0))
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "checkpoint metadata 'epoch' = %d (batch %d) lies beyond this run's %d epochs: nothing "
                           "to train (a larger --epochs continues it)",
                           m->epoch, m->batch_in_epoch, ts->epochs);
    if (m->batch_in_epoch > ts->spe)
        return clg_err_set(err, CLG_ERR_FORMAT,
                           "the checkpoint's position (batch %d of epoch %d) lies beyond this dataset's %d batches per "
                           "epoch (another dataset or --limit-train?)",
                           m->batch_in_epoch, m->epoch + 1, ts->spe);
    ts->perm = malloc((size_t)ts->train->n * sizeof(int32_t));
    ts->res = calloc((size_t)ts->spe * ts->L * 2, sizeof(float));
    ts->res_ev = calloc((size_t)ts->spe * ts->L, sizeof(cl_event));
    ts->nres = ts->spe * ts->L;
    if (!ts->perm || !ts->res || !ts->res_ev)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    ts->pr = (progress){.on = p->progress && clg_comm_rank() == 0, .tty = isatty(2), .t_start = clg_now_sec(),
                        .last_pct = -1, .tokens = ts->train->text ? ts->train->h : 0};
    return CLG_OK;
}

/* The sample order of epoch e: it depends only on (seed, epoch), so a
 * resumed run sees the same order; a limited run shuffles its first N. */
static void epoch_order(train_state *ts, int e)
{
    clg_model *m = ts->m;
    clg_dataset_epoch_perm(ts->perm, ts->train->n, m->seed, (uint64_t)e);
    if (ts->N < ts->train->n) {
        clg_dataset_perm_identity(ts->perm, ts->N);
        clg_rng r;
        clg_rng_seed(&r, m->seed, (uint64_t)e + 1000003u);
        clg_dataset_shuffle(ts->perm, ts->N, &r);
    }
}

/* Fills batch b of the epoch into its host stage and uploads it. */
static clg_status stage_batch(train_state *ts, epoch_state *es, int b)
{
    clg_model *m = ts->m;
    int s = b % CLG_STAGES;
    clg_status st = clg_session_stage_wait(m, s);
    if (st == CLG_OK)
        st = clg_dataset_fill_batch_aug(&m->ctx->err, ts->train, &m->norm, ts->perm, b * ts->B,
                                        CLG_MIN(ts->B, ts->N - b * ts->B), &es->aug, m->xhost[s], m->yhost[s],
                                        &es->cnt[s]);
    if (st == CLG_OK)
        st = clg_session_upload(m, s, es->cnt[s], 1);
    return st;
}

/* Folds the finished batches' metrics up to batch b (wait: every one of
 * them, waiting for each); a non-finite loss ends the run at once, naming
 * the first batch where it went wrong, so the message and its step do not
 * depend on how far the device had got when the host looked. */
static clg_status collect_ready(train_state *ts, epoch_state *es, int b, int wait)
{
    clg_model *m = ts->m;
    int B = ts->B, N = ts->N;
    while (es->next_read <= b) {
        double l0 = es->lsum;
        if (!collect(ts, es->next_read, wait, &es->lsum, &es->csum))
            break;
        if (!isfinite(es->lsum)) {
            char why[512];
            clg_session_explain_nonfinite(m, why, sizeof why);
            return clg_err_set(&m->ctx->err, CLG_ERR_INTERNAL,
                               "training diverged at step %" PRId64 " (epoch %d, batch %d: loss %f): lower "
                               "the learning rate; %s",
                               m->step - (b - es->next_read), es->e + 1, es->next_read + 1, es->lsum - l0, why);
        }
        es->seen += CLG_MIN(B, N - es->next_read * B);
        es->seen_mine += slice_of(CLG_MIN(B, N - es->next_read * B));
        es->next_read++;
    }
    return CLG_OK;
}

/* The running figures after batch b (MPI: rank 0's slice; the epoch's are global). */
static void show_running(train_state *ts, const epoch_state *es, int b)
{
    char shares[128];
    double el = clg_now_sec() - es->t0;
    double ips = el > 0 ? es->imgs / el : 0;
    double eta = ips > 0 ? ((double)(ts->spe - b - 1) * ts->B + (double)(ts->epochs - es->e - 1) * ts->N) / ips : 0;
    clg_dp_shares(ts->m->dp, shares, sizeof shares);
    progress_show(&ts->pr, es->e, ts->epochs, b + 1, ts->spe, es->seen_mine ? es->lsum / es->seen_mine : 0,
                  es->seen_mine ? es->csum / es->seen_mine : 0, ips, eta, ts->L > 1 ? shares : NULL, 0);
    const char *w = clg_dp_take_warning(ts->m->dp); /* once a run */
    if (w && ts->pr.on)
        fprintf(stderr, "%swarning: %s\n", ts->pr.tty ? "\n" : "", w);
}

/* One step on batch b (staged already); the next batch is prepared on the
 * host while the devices compute. */
static clg_status train_batch(train_state *ts, epoch_state *es, int b)
{
    clg_model *m = ts->m;
    const clg_train_params *p = ts->p;
    int s = b % CLG_STAGES;
    int n = es->cnt[s];
    double lr = clg_sched_lr(&m->hp, m->step, ts->spe, ts->total);
    CLG_TRY(clg_session_step_begin(m, s, lr, &ts->res[(size_t)b * ts->L * 2], &ts->res_ev[(size_t)b * ts->L]));
    clg_status st = CLG_OK;
    if (b + 1 < ts->spe && !(p->max_steps > 0 && m->step + 1 >= p->max_steps))
        st = stage_batch(ts, es, b + 1);
    clg_status st2 = clg_session_step_end(m);
    CLG_TRY(st2);
    CLG_TRY(st);
    if (!ts->first_done) { /* every kernel of a step is built now (the clgrad program stops its helper) */
        ts->first_done = 1;
        if (p->first_step_done)
            p->first_step_done(p->first_step_done_user);
    }
    m->batch_in_epoch = b + 1;
    es->imgs += n;
    CLG_TRY(collect_ready(ts, es, b, 0));
    show_running(ts, es, b);
    return CLG_OK;
}

/* Epoch e's steps from the saved position, then the wait for their
 * metrics, summed over every rank. */
static clg_status epoch_train(train_state *ts, int e, epoch_state *es)
{
    clg_model *m = ts->m;
    const clg_train_params *p = ts->p;
    clg_err *err = &m->ctx->err;
    m->epoch = e;
    epoch_order(ts, e);
    memset(es, 0, sizeof *es);
    es->e = e;
    /* augmentation choices depend only on (seed, epoch, position), like the order */
    es->aug = (clg_ds_augment){m->hp.augment_flip, m->hp.augment_shift, m->seed, (uint64_t)e};
    es->b0 = es->next_read = m->batch_in_epoch;
    es->t0 = clg_now_sec();
    ts->pr.last_pct = -1;
    if (es->b0 < ts->spe) /* prefetch the first batch */
        CLG_TRY(stage_batch(ts, es, es->b0));
    for (int b = es->b0; b < ts->spe; b++) {
        if (p->max_steps > 0 && m->step >= p->max_steps) {
            es->stop = 1;
            break;
        }
        CLG_TRY(train_batch(ts, es, b));
    }
    CLG_TRY(clg_dp_finish(m->dp));
    CLG_TRY(collect_ready(ts, es, m->batch_in_epoch - 1, 1));
    if (clg_comm_size() > 1) { /* the epoch's loss and accuracy over every rank's slices */
        double sums[2] = {es->lsum, es->csum};
        CLG_TRY(clg_comm_allreduce_f64(err, sums, 2, "loss all-reduce"));
        es->lsum = sums[0];
        es->csum = sums[1];
    }
    return CLG_OK;
}

/* The test set's loss and accuracy after epoch e (-1 without a test set). */
static clg_status epoch_evaluate(train_state *ts, int e, clg_train_report *rep, double *tl, double *ta)
{
    clg_model *m = ts->m;
    *tl = *ta = -1;
    if (!ts->test)
        return CLG_OK;
    CLG_TRY(clg_session_evaluate(m, ts->test, ts->p->limit_test, tl, ta, NULL, NULL));
    rep->test_loss = *tl;
    rep->test_accuracy = *ta;
    if (ts->p->progress && clg_comm_rank() == 0 && ts->test->text)
        fprintf(stderr, "epoch %d/%d: train loss %.4f (%.4f bits per byte) | held-out loss %.4f, %.4f bits per byte\n",
                e + 1, ts->epochs, rep->train_loss, rep->train_loss / M_LN2, *tl, *tl / M_LN2);
    else if (ts->p->progress && clg_comm_rank() == 0)
        fprintf(stderr, "epoch %d/%d: train loss %.4f acc %.2f%% | %s loss %.4f acc %.2f%%\n", e + 1, ts->epochs,
                rep->train_loss, 100 * rep->train_accuracy, ts->p->val_fraction > 0 ? "val" : "test", *tl, 100 * *ta);
    if (!isfinite(*tl))
        return clg_err_set(&m->ctx->err, CLG_ERR_INTERNAL,
                           "training diverged in epoch %d (test loss is %f): lower the learning rate", e + 1, *tl);
    return CLG_OK;
}

/* After an epoch's steps: the report, the final progress line, and (for a
 * whole epoch) evaluation, the log row and plot and the checkpoint.
 * *last: the run ends here. */
static clg_status epoch_close(train_state *ts, const epoch_state *es, clg_train_report *rep, int *last)
{
    clg_model *m = ts->m;
    const clg_train_params *p = ts->p;
    clg_err *err = &m->ctx->err;
    int e = es->e;
    char shares[128];
    double el = clg_now_sec() - es->t0;
    double ips = el > 0 ? es->imgs / el : 0;
    rep->train_loss = es->seen ? es->lsum / es->seen : 0;
    rep->train_accuracy = es->seen ? es->csum / es->seen : 0;
    clg_dp_shares(m->dp, shares, sizeof shares);
    progress_show(&ts->pr, e, ts->epochs, m->batch_in_epoch, ts->spe, rep->train_loss, rep->train_accuracy, ips, 0,
                  ts->L > 1 ? shares : NULL, 1);
    if (!isfinite(rep->train_loss))
        return clg_err_set(err, CLG_ERR_INTERNAL, "training diverged in epoch %d (loss is %f): lower the learning rate",
                           e + 1, rep->train_loss);
    *last = 1;
    if (es->stop || m->batch_in_epoch < ts->spe)
        return save_ckpt(ts, ts->total);
    double tl, ta;
    CLG_TRY(epoch_evaluate(ts, e, rep, &tl, &ta));
    if (ts->csv) {
        const clg_metrics_row row = {
            .epoch = e + 1, .step = m->step, .train_loss = rep->train_loss, .train_acc = rep->train_accuracy,
            .test_loss = tl, .test_acc = ta, .seconds = el, .ips = ips,
            .lr = clg_sched_lr(&m->hp, m->step > 0 ? m->step - 1 : 0, ts->spe, ts->total)};
        clg_metrics_csv_write(ts->csv, &row);
        CLG_TRY(clg_metrics_plot(err, p->log_csv, m->net->source));
    }
    m->epoch = e + 1;
    m->batch_in_epoch = 0;
    rep->epochs_done = e + 1;
    CLG_TRY(save_ckpt(ts, ts->total));
    *last = p->max_steps > 0 && m->step >= p->max_steps;
    return CLG_OK;
}

// ---- the loop ----

static clg_status run(train_state *ts, clg_train_report *rep)
{
    clg_model *m = ts->m;
    CLG_TRY(run_setup(ts));
    double t_run = clg_now_sec();
    int64_t imgs_run = 0;
    rep->test_loss = -1;
    rep->test_accuracy = -1;
    for (int e = m->epoch; e < ts->epochs; e++) {
        epoch_state es;
        CLG_TRY(epoch_train(ts, e, &es));
        imgs_run += es.imgs;
        int last = 0;
        CLG_TRY(epoch_close(ts, &es, rep, &last));
        if (last)
            break;
    }
    rep->steps = m->step;
    rep->seconds = clg_now_sec() - t_run;
    rep->images_per_s = rep->seconds > 0 ? imgs_run / rep->seconds : 0;
    rep->tokens_per_sample = ts->train->text ? ts->train->h : 0;
    rep->tokens_per_s = rep->images_per_s * rep->tokens_per_sample;
    clg_session_shares(m, rep->shares, sizeof rep->shares, &rep->devices);
    return CLG_OK;
}

// ---- a training run: set-up, the loop, clean-up ----

static clg_status train_run(clg_ctx *ctx, const clg_train_params *p, clg_train_report *out);

clg_status clg_train_run_size(clg_ctx *ctx, const clg_train_params *p, clg_train_report *out, size_t size)
{
    clg_train_report r;
    memset(&r, 0, sizeof r);
    clg_status st = train_run(ctx, p, out ? &r : NULL);
    clg_sized_write(out, size, &r, sizeof r); /* the caller's sizeof */
    return st;
}

/* The session for the model file, with the weights an ONNX file brought
 * (fine-tuning: imported weights and normalization) and the overrides. */
static clg_status open_model(clg_ctx *ctx, train_state *ts, int fp16)
{
    const clg_train_params *p = ts->p;
    char *text = NULL;
    clg_ckpt *fw = NULL; /* ONNX: the weights that came with the model file */
    CLG_TRY(clg_model_file_read(&ctx->err, p->model, &text, &fw));
    clg_pipe_params pp;
    clg_status st = clg_session_pipe_params(&ctx->err, p->parallel, p->stages, p->microbatches, p->pipe_schedule,
                                            p->pipe_recompute, &pp);
    clg_dp_params dpp = {.split = p->split, .bucket_mb = p->bucket_mb, .pipe = &pp,
                         .shard_optimizer = p->shard_optimizer};
    if (st == CLG_OK)
        st = clg_session_create(ctx, p->devices, p->device, text, p->model, p->batch, p->seed ? p->seed : 1,
                                fp16, &dpp, &ts->m);
    free(text);
    if (st == CLG_OK && fw) {
        ts->m->imported = 1;
        st = clg_session_load_ckpt(ts->m, fw, p->model, 0);
    }
    clg_ckpt_free(fw);
    if (st == CLG_OK)
        st = apply_overrides(&ctx->err, ts->m, p);
    return st;
}

/* The training (and, unless limit_test < 0, test) split, checked against
 * the model; the input normalization computed from the training split. */
static clg_status open_data(train_state *ts)
{
    const clg_train_params *p = ts->p;
    clg_err *err = &ts->m->ctx->err;
    const char *dd = ts->m->ctx->opts.data_dir;
    int lps = clg_net_labels_per_sample(ts->m->net);
    CLG_TRY(check_text_model(err, ts->m->net, p->data));
    CLG_TRY(clg_dataset_open_for(err, dd, p->data, CLG_SPLIT_TRAIN, lps > 1 ? lps : 0, &ts->train));
    CLG_TRY(check_data(err, ts->m, ts->train));
    if (ts->train->text)
        CLG_TRY(clg_session_check_text(ts->m, ts->train));
    if (p->val_fraction > 0 && ts->train->text)
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "--data %s: --val-fraction is for image datasets (text data holds out its last 10%%)",
                           p->data);
    if (p->val_fraction > 0) { /* a validation split held out of the training set replaces the test set */
        clg_dataset *whole = ts->train, *val = NULL;
        clg_status st = clg_dataset_holdout(err, whole, p->val_fraction, p->val_seed ? p->val_seed : 1, &ts->train,
                                            &val);
        clg_dataset_free(whole);
        if (st != CLG_OK)
            return st;
        if (p->limit_test >= 0)
            ts->test = val;
        else
            clg_dataset_free(val);
    } else if (p->limit_test >= 0) {
        CLG_TRY(clg_dataset_open_for(err, dd, p->data, CLG_SPLIT_TEST, lps > 1 ? lps : 0, &ts->test));
        CLG_TRY(check_data(err, ts->m, ts->test));
        if (ts->test->text)
            CLG_TRY(clg_session_check_text(ts->m, ts->test));
    }
    if (ts->train->text && (ts->m->hp.augment_flip || ts->m->hp.augment_shift))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "--data %s: augmentation (flip, shift) is for images, not text",
                           p->data);
    if (ts->train->text) /* token ids are used as they are */
        return CLG_OK;
    if (!ts->m->imported) { /* an imported model keeps the normalization it was trained with */
        clg_status st = clg_dataset_norm_compute(err, ts->train, &ts->m->norm);
        ts->m->has_norm = 1;
        return st;
    }
    return CLG_OK;
}

/* The checkpoint path; with --resume, the state it holds. */
static clg_status open_checkpoint(train_state *ts)
{
    const clg_train_params *p = ts->p;
    clg_err *err = &ts->m->ctx->err;
    if (p->checkpoint_dir &&
        (size_t)snprintf(ts->ckpt_path, sizeof ts->ckpt_path, "%s/last.safetensors", p->checkpoint_dir) >=
            sizeof ts->ckpt_path)
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "checkpoint directory path too long (%zu characters, at most %zu)",
                           strlen(p->checkpoint_dir), sizeof ts->ckpt_path - sizeof "/last.safetensors");
    /* a save killed before its rename leaves PATH.tmp.XXXXXX: removed now, and said (the file at PATH is the
     * last complete one) */
    const char *paths[2] = {p->checkpoint_dir ? ts->ckpt_path : NULL, p->save_weights};
    for (int i = 0; i < 2 && clg_comm_rank() == 0; i++) {
        char first[4400];
        int n = paths[i] ? clg_file_remove_stale_temps(paths[i], first, sizeof first) : 0;
        if (n > 0)
            fprintf(stderr, "note: removed %s%s, left by a save that was interrupted (%s is the last complete file)\n",
                    first, n > 1 ? " and older temporary files beside it" : "", paths[i]);
    }
    if (!p->resume)
        return CLG_OK;
    const char *flag = p->resume == 2 ? "--resume-weights-only" : "--resume";
    if (access(ts->ckpt_path, F_OK) != 0)
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "%s: no checkpoint to resume from at %s", flag, ts->ckpt_path);
    clg_ds_norm keep = ts->m->norm;
    /* 2: the weights only (fine-tuning: another model's weights of the same names and shapes, from step 0) */
    CLG_TRY(clg_session_load(ts->m, ts->ckpt_path, p->resume != 2));
    if (p->resume != 2 && ts->m->hash_unchecked && p->progress && clg_comm_rank() == 0)
        fprintf(stderr, "note: %s has no model.hash (written by an older clgrad): the model it was trained with "
                        "is checked by the model text it stores\n",
                ts->ckpt_path);
    ts->m->norm = keep; /* computed again from the same data: identical */
    if (ts->m->resumed_from[0] && p->progress && clg_comm_rank() == 0)
        fprintf(stderr, "note: resuming a checkpoint written on %s onto %d device(s): the batch split differs, "
                        "so the run is not bitwise the same as one without the interruption\n",
                ts->m->resumed_from, ts->m->dp->n);
    return CLG_OK;
}

/* The set-up on stderr: network, memory plan, devices, ranks, precision, data. */
/* Per device: what the model holds before the first step (the optimizer
 * state is created by then) and the peak so far (clg_model_memory), MiB. */
static void print_memory(const clg_model *m)
{
    const double M = 1048576.0;
    int lim = m->ctx->devs[0].pool.limit != 0;
    fprintf(stderr,
            "memory per device, MiB%s:\n"
            "  %sdevice  parameters   optimizer  activations   workspace       total        peak%s\n",
            m->dp->shard || (m->tp && m->tp->shard) ? " (optimizer state sharded)"
            : m->pipe && m->pipe->zero              ? " (per pipeline stage, optimizer state sharded)"
            : m->pipe                               ? " (per pipeline stage)"
                                                    : "",
            m->pipe ? "stage  " : "", lim ? "       limit" : "");
    for (int l = 0; l < clg_session_mem_rows(m); l++) {
        clg_dp_mem d;
        int dev = 0, stage = -1;
        clg_session_memory(m, l, &d, &dev, &stage);
        if (m->pipe)
            fprintf(stderr, "  %5d", stage);
        fprintf(stderr, "  %6d  %10.2f  %10.2f  %11.2f  %10.2f  %10.2f  %10.2f", dev,
                d.params / M, d.optim / M, d.activations / M, d.workspace / M,
                (d.params + d.optim + d.activations + d.workspace) / M, d.peak / M);
        if (lim)
            fprintf(stderr, "  %10.2f", d.limit / M);
        fputc('\n', stderr);
    }
}

static void print_setup(const train_state *ts, int fp16)
{
    const clg_model *m = ts->m;
    clg_net_print(m->net, stderr);
    const clg_replica *r0 = clg_session_rep(ts->m);
    if (!m->pipe && !m->tp) /* a pipeline: per stage in its table; tensor parallel: per device in the memory table */
        fprintf(stderr, "activations: %.2f MiB planned by liveness vs %.2f MiB naive (%d buffers), batch %d\n",
                r0->planned_bytes / 1048576.0, r0->naive_bytes / 1048576.0, r0->nslots, m->net->batch);
    char devs[512];
    clg_session_devices(ts->m, devs, sizeof devs);
    if (m->pipe)
        clg_pipe_print(m->pipe, stderr);
    else if (m->tp)
        clg_tp_print(m->tp, stderr);
    else
        fprintf(stderr, "devices: %s (%s)\n", devs,
                m->dp->n > 1 ? "data parallel: one replica each, batch split by measured speed" : "one device");
    print_memory(m);
    if (clg_comm_size() > 1)
        fprintf(stderr, "MPI: %d ranks x these devices, each rank takes 1/%d of every global batch of %d (%s "
                        "all-reduce, timeout %.0f s)\n",
                clg_comm_size(), clg_comm_size(), m->net->batch, clg_comm_algorithm(), clg_comm_timeout());
    if (fp16)
        fprintf(stderr,
                "precision fp16: activations %.2f MiB planned (half tensors + fp32 working buffers) vs %.2f MiB "
                "in fp32 (%.2f MiB with the same arena planner); loss scale %g\n",
                r0->planned_bytes / 1048576.0, r0->fp32_bytes / 1048576.0, r0->fp32_offset_bytes / 1048576.0,
                m->loss_scale);
    fprintf(stderr, "training on %s: %d samples, optimizer %s, lr %g, %d epochs%s\n", ts->train->source, ts->train->n,
            clg_optim_name(m->hp.optimizer), m->hp.learning_rate, m->hp.epochs, ts->p->resume ? " (resumed)" : "");
    if (ts->train->text)
        fprintf(stderr, "text: %zu bytes, %zu for training (an epoch: %d windows of %d + 1 bytes at seeded random "
                        "offsets), the last %zu held out\n",
                ts->train->file_len, ts->train->text_len, ts->train->n, ts->train->h,
                ts->train->file_len - ts->train->text_len);
}

/* Everything before the first step: model, data, checkpoint, optimizer
 * state, log, set-up lines, trace. */
static clg_status train_prepare(clg_ctx *ctx, train_state *ts, int fp16)
{
    const clg_train_params *p = ts->p;
    CLG_TRY(open_model(ctx, ts, fp16));
    CLG_TRY(open_data(ts));
    CLG_TRY(open_checkpoint(ts));
    CLG_TRY(clg_session_ensure_optim(ts->m));
    if (p->log_csv && clg_comm_rank() == 0) /* MPI: rank 0 writes the log and plot */
        CLG_TRY(clg_metrics_csv_open(&ctx->err, p->log_csv, p->resume, &ts->csv));
    if (p->progress && clg_comm_rank() == 0)
        print_setup(ts, fp16);
    if (p->trace)
        CLG_TRY(clg_session_trace_open(ts->m, p->trace, p->trace_steps > 0 ? p->trace_steps : 20));
    return CLG_OK;
}

/* After the loop (also after a failure): the trace closed, the fp16
 * summary, the weights saved. Returns st or the first failure here. */
static clg_status train_finish(train_state *ts, clg_status st, int fp16)
{
    const clg_train_params *p = ts->p;
    if (ts->m && ts->m->trace) {
        clg_status tst = clg_session_trace_close(ts->m);
        if (st == CLG_OK)
            st = tst;
    }
    if (st == CLG_OK && fp16 && p->progress && clg_comm_rank() == 0)
        fprintf(stderr, "precision fp16: final loss scale %g, %" PRId64 " of %" PRId64 " steps skipped (inf/NaN gradients)\n",
                ts->m->loss_scale, ts->m->ls_skipped, ts->m->step);
    if (st == CLG_OK && p->save_weights && clg_comm_rank() == 0)
        st = clg_session_save(ts->m, p->save_weights, 0, 0);
    return st;
}

static void train_state_free(train_state *ts)
{
    if (ts->csv)
        fclose(ts->csv);
    if (ts->res_ev) {
        if (ts->m)
            clg_dp_finish(ts->m->dp);
        for (int i = 0; i < ts->nres; i++)
            clg_release_event(&ts->res_ev[i]);
    }
    free(ts->res_ev);
    free(ts->res);
    free(ts->perm);
    clg_dataset_free(ts->train);
    clg_dataset_free(ts->test);
    clg_session_free(ts->m);
}

static clg_status train_run(clg_ctx *ctx, const clg_train_params *p, clg_train_report *out)
{
    clg_err *err = ctx ? &ctx->err : NULL;
    if (!ctx || !p)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "train: context and params are required");
    clg_train_params pl; /* the caller's fields within its size, defaults after */
    train_params_defaults(&pl);
    CLG_TRY(clg_sized_read(err, "clg_train_params", &pl, sizeof pl, p));
    p = &pl;
    if (!p->model || !p->data)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "train: model and data are required");
    clg_train_report rep;
    memset(&rep, 0, sizeof rep);
    rep.test_loss = rep.test_accuracy = -1;
    int fp16 = clg_precision_parse(p->precision);
    if (fp16 < 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "unknown precision '%s' (fp32 or fp16)", p->precision);
    if (p->resume && !p->checkpoint_dir)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%s needs --checkpoint DIR",
                           p->resume == 2 ? "--resume-weights-only" : "--resume");
    if (p->resume < 0 || p->resume > 2)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "train: resume is %d (0, 1 or 2)", p->resume);
    if (!(p->val_fraction >= 0 && p->val_fraction < 1))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "train: val_fraction is %g (in [0, 1))", p->val_fraction);
    train_state ts;
    memset(&ts, 0, sizeof ts);
    ts.p = p;
    clg_status st = train_prepare(ctx, &ts, fp16);
    if (st == CLG_OK && p->first_step_done && ts.m->dp && !ts.m->pipe) { /* from the lanes' end of the first
                                                                             step, before its new sizes are met */
        ts.m->dp->first_end = p->first_step_done;
        ts.m->dp->first_end_user = p->first_step_done_user;
        ts.first_done = 1;
    }
    if (st == CLG_OK)
        st = run(&ts, &rep);
    st = train_finish(&ts, st, fp16);
    train_state_free(&ts);
    if (out)
        *out = rep;
    return st;
}
