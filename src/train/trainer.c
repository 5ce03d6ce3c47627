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
#include "train/session.h"
#include "onnx/onnx.h"
#include "train/trainer.h"

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

typedef struct epoch_row {
    int epoch;
    int64_t step;
    double train_loss, train_acc, test_loss, test_acc, lr, seconds, ips;
} epoch_row;

// ---- progress ----

typedef struct progress {
    int on, tty;
    double t_last, t_start;
    int last_pct;
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
        fprintf(stderr, "\repoch %d/%d [%s] %d/%d loss %.4f acc %5.2f%% %.0f img/s%s%s ETA %s   ", epoch + 1,
                epochs, bar, done, total, loss, 100 * acc, ips, shares ? " split " : "", shares ? shares : "", e);
        if (final)
            fputc('\n', stderr);
        fflush(stderr);
    } else {
        /* plain lines: every 25% of an epoch and at its end */
        if ((!final && pct / 25 == p->last_pct / 25) || (final && p->last_pct == 100))
            return;
        p->last_pct = pct;
        fprintf(stderr, "epoch %d/%d %3d%% (%d/%d) loss %.4f acc %.2f%% %.0f img/s%s%s ETA %s\n", epoch + 1, epochs,
                pct, done, total, loss, 100 * acc, ips, shares ? " split " : "", shares ? shares : "", e);
    }
}

// ---- CSV + SVG ----

static const char csv_header[] = "epoch,step,train_loss,train_acc,test_loss,test_acc,lr,seconds,images_per_s\n";

static int read_csv(const char *path, epoch_row **rows, int *n)
{
    *rows = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[512];
    int cap = 0;
    while (fgets(line, sizeof line, f)) {
        epoch_row r;
        long long st;
        if (sscanf(line, "%d,%lld,%lf,%lf,%lf,%lf,%lf,%lf,%lf", &r.epoch, &st, &r.train_loss, &r.train_acc,
                   &r.test_loss, &r.test_acc, &r.lr, &r.seconds, &r.ips) != 9)
            continue;
        r.step = st;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            epoch_row *nr = realloc(*rows, (size_t)cap * sizeof **rows);
            if (!nr)
                break;
            *rows = nr;
        }
        (*rows)[(*n)++] = r;
    }
    fclose(f);
    return 1;
}

static void svg_polyline(clg_sbuf *b, const epoch_row *r, int n, int which, double x0, double y0, double w,
                         double h, double ymin, double ymax, int maxep, const char *color, int dashed)
{
    int any = 0;
    for (int i = 0; i < n; i++) {
        double v = which == 0 ? r[i].train_loss : which == 1 ? r[i].test_loss : which == 2 ? r[i].train_acc : r[i].test_acc;
        if (v < 0 || !isfinite(v))
            continue;
        if (!any)
            clg_sbuf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", color,
                            dashed ? " stroke-dasharray=\"6,4\"" : "");
        any = 1;
        double x = x0 + w * (maxep > 1 ? (double)(r[i].epoch - 1) / (maxep - 1) : 0.5);
        double y = y0 + h - h * (v - ymin) / (ymax - ymin > 0 ? ymax - ymin : 1);
        clg_sbuf_printf(b, "%.1f,%.1f ", x, y);
    }
    if (any)
        clg_sbuf_printf(b, "\"/>\n");
    for (int i = 0; i < n; i++) {
        double v = which == 0 ? r[i].train_loss : which == 1 ? r[i].test_loss : which == 2 ? r[i].train_acc : r[i].test_acc;
        if (v < 0 || !isfinite(v))
            continue;
        double x = x0 + w * (maxep > 1 ? (double)(r[i].epoch - 1) / (maxep - 1) : 0.5);
        double y = y0 + h - h * (v - ymin) / (ymax - ymin > 0 ? ymax - ymin : 1);
        clg_sbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x, y, color);
    }
}

static void svg_panel(clg_sbuf *b, const epoch_row *r, int n, int acc, double x0, const char *title)
{
    double y0 = 40, w = 360, h = 260;
    double ymin = INFINITY, ymax = -INFINITY;
    int maxep = 1;
    for (int i = 0; i < n; i++) {
        double a = acc ? r[i].train_acc : r[i].train_loss, c = acc ? r[i].test_acc : r[i].test_loss;
        if (a >= 0 && isfinite(a)) {
            ymin = fmin(ymin, a);
            ymax = fmax(ymax, a);
        }
        if (c >= 0 && isfinite(c)) {
            ymin = fmin(ymin, c);
            ymax = fmax(ymax, c);
        }
        if (r[i].epoch > maxep)
            maxep = r[i].epoch;
    }
    if (!isfinite(ymin)) {
        ymin = 0;
        ymax = 1;
    }
    double pad = (ymax - ymin) * 0.08 + 1e-6;
    ymin -= pad;
    ymax += pad;
    if (acc) {
        ymin *= 100;
        ymax *= 100;
    }
    clg_sbuf_printf(b, "<text x=\"%.0f\" y=\"25\" font-size=\"15\" font-family=\"sans-serif\">%s</text>\n", x0, title);
    clg_sbuf_printf(b, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#888\"/>\n", x0,
                    y0, w, h);
    for (int t = 0; t <= 4; t++) {
        double v = ymin + (ymax - ymin) * t / 4;
        double y = y0 + h - h * t / 4;
        clg_sbuf_printf(b, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\" font-family=\"sans-serif\">%.*f</text>\n",
                        x0 - 4, y + 4, acc ? 1 : 3, v);
        clg_sbuf_printf(b, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", x0, y, x0 + w, y);
    }
    for (int e = 1; e <= maxep; e++) {
        if (maxep > 12 && e % (maxep / 10 + 1) != 0 && e != 1)
            continue;
        double x = x0 + w * (maxep > 1 ? (double)(e - 1) / (maxep - 1) : 0.5);
        clg_sbuf_printf(b, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\" font-family=\"sans-serif\">%d</text>\n",
                        x, y0 + h + 15, e);
    }
    clg_sbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" text-anchor=\"middle\" font-family=\"sans-serif\">epoch</text>\n",
                    x0 + w / 2, y0 + h + 32);
    double s = acc ? 100 : 1;
    epoch_row *tmp = calloc((size_t)CLG_MAX(n, 1), sizeof *tmp);
    if (!tmp)
        return;
    for (int i = 0; i < n; i++) {
        tmp[i] = r[i];
        if (acc) {
            tmp[i].train_acc = r[i].train_acc >= 0 ? r[i].train_acc * s : -1;
            tmp[i].test_acc = r[i].test_acc >= 0 ? r[i].test_acc * s : -1;
        }
    }
    svg_polyline(b, tmp, n, acc ? 2 : 0, x0, y0, w, h, ymin, ymax, maxep, "#1f77b4", 0);
    svg_polyline(b, tmp, n, acc ? 3 : 1, x0, y0, w, h, ymin, ymax, maxep, "#d62728", 1);
    free(tmp);
    clg_sbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#1f77b4\" font-family=\"sans-serif\">train</text>\n",
                    x0 + w - 90, y0 + 16);
    clg_sbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#d62728\" font-family=\"sans-serif\">test</text>\n",
                    x0 + w - 45, y0 + 16);
}

clg_status clg_train_write_svg(clg_err *err, const char *csv_path, const char *title)
{
    epoch_row *rows = NULL;
    int n = 0;
    if (!read_csv(csv_path, &rows, &n))
        return clg_err_set(err, CLG_ERR_IO, "cannot read '%s' to plot it: %s", csv_path, strerror(errno));
    clg_sbuf b = {0};
    clg_sbuf_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"860\" height=\"360\" viewBox=\"0 0 860 360\">\n");
    clg_sbuf_printf(&b, "<rect width=\"860\" height=\"360\" fill=\"white\"/>\n");
    char t1[300], t2[300];
    snprintf(t1, sizeof t1, "loss per epoch (%s)", title);
    snprintf(t2, sizeof t2, "accuracy %% per epoch (%s)", title);
    svg_panel(&b, rows, n, 0, 60, t1);
    svg_panel(&b, rows, n, 1, 480, t2);
    clg_sbuf_printf(&b, "</svg>\n");
    free(rows);
    if (b.oom) {
        clg_sbuf_free(&b);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory writing the plot");
    }
    char svg[1100];
    size_t L = strlen(csv_path);
    if (L > 4 && strcmp(csv_path + L - 4, ".csv") == 0)
        snprintf(svg, sizeof svg, "%.*s.svg", (int)(L - 4), csv_path);
    else
        snprintf(svg, sizeof svg, "%s.svg", csv_path);
    clg_status st = clg_file_write_atomic(err, svg, b.data, b.len);
    clg_sbuf_free(&b);
    return st;
}

// ---- the loop ----

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

static clg_status check_data(clg_err *err, const clg_model *m, const clg_dataset *ds)
{
    const clg_net *net = m->net;
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
} train_state;

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

static clg_status run(train_state *ts, clg_train_report *rep)
{
    clg_model *m = ts->m;
    const clg_train_params *p = ts->p;
    clg_err *err = &m->ctx->err;
    int N = ts->train->n;
    if (p->limit_train > 0 && p->limit_train < N)
        N = (int)p->limit_train;
    int B = m->net->batch, L = m->dp->n;
    int spe = CLG_CEIL_DIV(N, B);
    int epochs = m->hp.epochs;
    int64_t total = (int64_t)spe * epochs;
    if (m->batch_in_epoch > spe)
        return clg_err_set(err, CLG_ERR_FORMAT,
                           "the checkpoint's position (batch %d of epoch %d) lies beyond this dataset's %d batches per "
                           "epoch (another dataset or --limit-train?)",
                           m->batch_in_epoch, m->epoch + 1, spe);
    ts->perm = malloc((size_t)ts->train->n * sizeof(int32_t));
    ts->res = calloc((size_t)spe * L * 2, sizeof(float));
    ts->res_ev = calloc((size_t)spe * L, sizeof(cl_event));
    ts->nres = spe * L;
    if (!ts->perm || !ts->res || !ts->res_ev)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    progress pr = {.on = p->progress && clg_comm_rank() == 0, .tty = isatty(2), .t_start = clg_now_sec(), .last_pct = -1};
    double t_run = clg_now_sec();
    int64_t imgs_run = 0;
    char shares[128];
    rep->test_loss = -1;
    rep->test_accuracy = -1;
    for (int e = m->epoch; e < epochs; e++) {
        m->epoch = e;
        /* the permutation of epoch e depends only on (seed, epoch): a resumed run sees the same order */
        clg_dataset_epoch_perm(ts->perm, ts->train->n, m->seed, (uint64_t)e);
        if (N < ts->train->n) { /* a limited run shuffles its first N samples */
            clg_dataset_perm_identity(ts->perm, N);
            clg_rng r;
            clg_rng_seed(&r, m->seed, (uint64_t)e + 1000003u);
            clg_dataset_shuffle(ts->perm, N, &r);
        }
        /* augmentation choices depend only on (seed, epoch, position), like the order */
        const clg_ds_augment aug = {m->hp.augment_flip, m->hp.augment_shift, m->seed, (uint64_t)e};
        int b0 = m->batch_in_epoch;
        double t0 = clg_now_sec();
        int64_t imgs = 0;
        pr.last_pct = -1;
        int cnt[CLG_STAGES] = {0};
        int stop = 0;
        /* prefetch the first batch */
        if (b0 < spe) {
            int s = b0 % CLG_STAGES;
            CLG_TRY(clg_session_stage_wait(m, s));
            CLG_TRY(clg_dataset_fill_batch_aug(err, ts->train, &m->norm, ts->perm, b0 * B, CLG_MIN(B, N - b0 * B),
                                               &aug, m->xhost[s], m->yhost[s], &cnt[s]));
            CLG_TRY(clg_session_upload(m, s, cnt[s], 1));
        }
        double lsum = 0, csum = 0;
        int64_t seen = 0, seen_mine = 0; /* global samples; this rank's slice of them (MPI) */
        int next_read = b0;
        for (int b = b0; b < spe; b++) {
            if (p->max_steps > 0 && m->step >= p->max_steps) {
                stop = 1;
                break;
            }
            int s = b % CLG_STAGES, nx = (b + 1) % CLG_STAGES;
            int n = cnt[s];
            double lr = clg_sched_lr(&m->hp, m->step, spe, total);
            CLG_TRY(clg_session_step_begin(m, s, lr, &ts->res[(size_t)b * L * 2], &ts->res_ev[(size_t)b * L]));
            /* prepare the next batch on the host while the devices compute */
            clg_status st = CLG_OK;
            if (b + 1 < spe && !(p->max_steps > 0 && m->step + 1 >= p->max_steps)) {
                st = clg_session_stage_wait(m, nx);
                if (st == CLG_OK)
                    st = clg_dataset_fill_batch_aug(err, ts->train, &m->norm, ts->perm, (b + 1) * B,
                                                    CLG_MIN(B, N - (b + 1) * B), &aug, m->xhost[nx], m->yhost[nx],
                                                    &cnt[nx]);
                if (st == CLG_OK)
                    st = clg_session_upload(m, nx, cnt[nx], 1);
            }
            clg_status st2 = clg_session_step_end(m);
            CLG_TRY(st2);
            CLG_TRY(st);
            m->batch_in_epoch = b + 1;
            imgs += n;
            /* collect finished metrics without waiting; a non-finite loss ends the run at once */
            while (next_read <= b) {
                double l0 = lsum;
                if (!collect(ts, next_read, 0, &lsum, &csum))
                    break;
                if (!isfinite(lsum)) {
                    char why[512];
                    clg_session_explain_nonfinite(m, why, sizeof why);
                    return clg_err_set(err, CLG_ERR_INTERNAL,
                                       "training diverged at step %" PRId64 " (epoch %d, batch %d: loss %f): lower "
                                       "the learning rate; %s",
                                       m->step - (b - next_read), e + 1, next_read + 1, lsum - l0, why);
                }
                seen += CLG_MIN(B, N - next_read * B);
                seen_mine += slice_of(CLG_MIN(B, N - next_read * B));
                next_read++;
            }
            double el = clg_now_sec() - t0;
            double ips = el > 0 ? imgs / el : 0;
            double eta = ips > 0 ? ((double)(spe - b - 1) * B + (double)(epochs - e - 1) * N) / ips : 0;
            clg_dp_shares(m->dp, shares, sizeof shares);
            /* (MPI: the running figures are rank 0's slice; the epoch's are global) */
            progress_show(&pr, e, epochs, b + 1, spe, seen_mine ? lsum / seen_mine : 0,
                          seen_mine ? csum / seen_mine : 0, ips, eta, L > 1 ? shares : NULL, 0);
        }
        CLG_TRY(clg_dp_finish(m->dp));
        while (next_read < m->batch_in_epoch) {
            collect(ts, next_read, 1, &lsum, &csum);
            seen += CLG_MIN(B, N - next_read * B);
            next_read++;
        }
        if (clg_comm_size() > 1) { /* the epoch's loss and accuracy over every rank's slices */
            double sums[2] = {lsum, csum};
            CLG_TRY(clg_comm_allreduce_f64(err, sums, 2, "loss all-reduce"));
            lsum = sums[0];
            csum = sums[1];
        }
        double el = clg_now_sec() - t0;
        imgs_run += imgs;
        double ips = el > 0 ? imgs / el : 0;
        rep->train_loss = seen ? lsum / seen : 0;
        rep->train_accuracy = seen ? csum / seen : 0;
        clg_dp_shares(m->dp, shares, sizeof shares);
        progress_show(&pr, e, epochs, m->batch_in_epoch, spe, rep->train_loss, rep->train_accuracy, ips, 0,
                      L > 1 ? shares : NULL, 1);
        if (!isfinite(rep->train_loss))
            return clg_err_set(err, CLG_ERR_INTERNAL, "training diverged in epoch %d (loss is %f): lower the learning rate",
                               e + 1, rep->train_loss);
        if (stop || m->batch_in_epoch < spe) {
            CLG_TRY(save_ckpt(ts, total));
            break;
        }
        /* end of epoch: evaluate, log, checkpoint */
        double tl = -1, ta = -1;
        if (ts->test) {
            CLG_TRY(clg_session_evaluate(m, ts->test, p->limit_test, &tl, &ta, NULL, NULL));
            rep->test_loss = tl;
            rep->test_accuracy = ta;
            if (p->progress && clg_comm_rank() == 0)
                fprintf(stderr, "epoch %d/%d: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%%\n", e + 1, epochs,
                        rep->train_loss, 100 * rep->train_accuracy, tl, 100 * ta);
            if (!isfinite(tl))
                return clg_err_set(err, CLG_ERR_INTERNAL,
                                   "training diverged in epoch %d (test loss is %f): lower the learning rate", e + 1, tl);
        }
        if (ts->csv) {
            fprintf(ts->csv, "%d,%" PRId64 ",%.6f,%.6f,%.6f,%.6f,%.6g,%.3f,%.1f\n", e + 1, m->step, rep->train_loss,
                    rep->train_accuracy, tl, ta, clg_sched_lr(&m->hp, m->step > 0 ? m->step - 1 : 0, spe, total), el,
                    ips);
            fflush(ts->csv);
            CLG_TRY(clg_train_write_svg(err, p->log_csv, m->net->source));
        }
        m->epoch = e + 1;
        m->batch_in_epoch = 0;
        rep->epochs_done = e + 1;
        CLG_TRY(save_ckpt(ts, total));
        if (p->max_steps > 0 && m->step >= p->max_steps)
            break;
    }
    rep->steps = m->step;
    rep->seconds = clg_now_sec() - t_run;
    rep->images_per_s = rep->seconds > 0 ? imgs_run / rep->seconds : 0;
    rep->devices = L;
    clg_dp_shares(m->dp, rep->shares, sizeof rep->shares);
    return CLG_OK;
}

static clg_status train_run(clg_ctx *ctx, const clg_train_params *p, clg_train_report *out);

clg_status clg_train_run_size(clg_ctx *ctx, const clg_train_params *p, clg_train_report *out, size_t size)
{
    clg_train_report r;
    memset(&r, 0, sizeof r);
    clg_status st = train_run(ctx, p, out ? &r : NULL);
    clg_sized_write(out, size, &r, sizeof r); /* the caller's sizeof */
    return st;
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
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "--resume needs --checkpoint DIR");
    char *text = NULL;
    clg_ckpt *fw = NULL; /* ONNX: the weights that came with the model file */
    CLG_TRY(clg_model_file_read(err, p->model, &text, &fw));
    train_state ts;
    memset(&ts, 0, sizeof ts);
    ts.p = p;
    clg_dp_params dpp = {.split = p->split, .bucket_mb = p->bucket_mb};
    clg_status st = clg_session_create(ctx, p->devices, p->device, text, p->model, p->batch,
                                       p->seed ? p->seed : 1, fp16, &dpp, &ts.m);
    free(text);
    if (st == CLG_OK && fw) { /* fine-tuning: imported weights and normalization */
        ts.m->imported = 1;
        st = clg_session_load_ckpt(ts.m, fw, p->model, 0);
    }
    clg_ckpt_free(fw);
    if (st == CLG_OK)
        st = apply_overrides(err, ts.m, p);
    if (st == CLG_OK)
        st = clg_dataset_open_in(err, ctx->opts.data_dir, p->data, CLG_SPLIT_TRAIN, &ts.train);
    if (st == CLG_OK)
        st = check_data(err, ts.m, ts.train);
    if (st == CLG_OK && p->limit_test >= 0) {
        st = clg_dataset_open_in(err, ctx->opts.data_dir, p->data, CLG_SPLIT_TEST, &ts.test);
        if (st == CLG_OK)
            st = check_data(err, ts.m, ts.test);
    }
    if (st == CLG_OK && !ts.m->imported) { /* an imported model keeps the normalization it was trained with */
        st = clg_dataset_norm_compute(err, ts.train, &ts.m->norm);
        ts.m->has_norm = 1;
    }
    if (st == CLG_OK && p->checkpoint_dir &&
        (size_t)snprintf(ts.ckpt_path, sizeof ts.ckpt_path, "%s/last.safetensors", p->checkpoint_dir) >=
            sizeof ts.ckpt_path)
        st = clg_err_set(err, CLG_ERR_INVALID_ARG, "checkpoint directory path too long (%zu characters, at most %zu)",
                         strlen(p->checkpoint_dir), sizeof ts.ckpt_path - sizeof "/last.safetensors");
    if (st == CLG_OK && p->resume && access(ts.ckpt_path, F_OK) != 0)
        st = clg_err_set(err, CLG_ERR_NOT_FOUND, "--resume: no checkpoint to resume from at %s", ts.ckpt_path);
    if (st == CLG_OK && p->resume) {
        clg_ds_norm keep = ts.m->norm;
        st = clg_session_load(ts.m, ts.ckpt_path, 1);
        if (st == CLG_OK)
            ts.m->norm = keep; /* computed again from the same data: identical */
        if (st == CLG_OK && ts.m->resumed_from[0] && p->progress && clg_comm_rank() == 0)
            fprintf(stderr, "note: resuming a checkpoint written on %s onto %d device(s): the batch split differs, "
                            "so the run is not bitwise the same as one without the interruption\n",
                    ts.m->resumed_from, ts.m->dp->n);
    }
    if (st == CLG_OK)
        st = clg_session_ensure_optim(ts.m);
    if (st == CLG_OK && p->log_csv && clg_comm_rank() == 0) { /* MPI: rank 0 writes the log and plot */
        struct stat sb;
        int exists = stat(p->log_csv, &sb) == 0;
        ts.csv = fopen(p->log_csv, p->resume && exists ? "a" : "w");
        if (!ts.csv)
            st = clg_err_set(err, CLG_ERR_IO, "cannot write log '%s': %s", p->log_csv, strerror(errno));
        else if (!(p->resume && exists))
            fputs(csv_header, ts.csv);
    }
    if (st == CLG_OK && p->progress && clg_comm_rank() == 0) {
        clg_net_print(ts.m->net, stderr);
        const clg_replica *r0 = clg_session_rep(ts.m);
        fprintf(stderr, "activations: %.2f MiB planned by liveness vs %.2f MiB naive (%d buffers), batch %d\n",
                r0->planned_bytes / 1048576.0, r0->naive_bytes / 1048576.0, r0->nslots, ts.m->net->batch);
        char devs[512];
        clg_session_devices(ts.m, devs, sizeof devs);
        fprintf(stderr, "devices: %s (%s)\n", devs,
                ts.m->dp->n > 1 ? "data parallel: one replica each, batch split by measured speed" : "one device");
        if (clg_comm_size() > 1)
            fprintf(stderr, "MPI: %d ranks x these devices, each rank takes 1/%d of every global batch of %d (%s "
                            "all-reduce, timeout %.0f s)\n",
                    clg_comm_size(), clg_comm_size(), ts.m->net->batch,
                    clg_comm_algorithm(), clg_comm_timeout());
        if (fp16)
            fprintf(stderr,
                    "precision fp16: activations %.2f MiB planned (half tensors + fp32 working buffers) vs %.2f MiB "
                    "in fp32 (%.2f MiB with the same arena planner); loss scale %g\n",
                    r0->planned_bytes / 1048576.0, r0->fp32_bytes / 1048576.0, r0->fp32_offset_bytes / 1048576.0,
                    ts.m->loss_scale);
        fprintf(stderr, "training on %s: %d samples, optimizer %s, lr %g, %d epochs%s\n", ts.train->source,
                ts.train->n, clg_optim_name(ts.m->hp.optimizer), ts.m->hp.learning_rate, ts.m->hp.epochs,
                p->resume ? " (resumed)" : "");
    }
    if (st == CLG_OK && p->trace)
        st = clg_session_trace_open(ts.m, p->trace, p->trace_steps > 0 ? p->trace_steps : 20);
    if (st == CLG_OK)
        st = run(&ts, &rep);
    if (ts.m && ts.m->trace) {
        clg_status tst = clg_session_trace_close(ts.m);
        if (st == CLG_OK)
            st = tst;
    }
    if (st == CLG_OK && fp16 && p->progress && clg_comm_rank() == 0)
        fprintf(stderr, "precision fp16: final loss scale %g, %" PRId64 " of %" PRId64 " steps skipped (inf/NaN gradients)\n",
                ts.m->loss_scale, ts.m->ls_skipped, ts.m->step);
    if (st == CLG_OK && p->save_weights && clg_comm_rank() == 0)
        st = clg_session_save(ts.m, p->save_weights, 0, 0);
    if (ts.csv)
        fclose(ts.csv);
    if (ts.res_ev) {
        if (ts.m)
            clg_dp_finish(ts.m->dp);
        for (int i = 0; i < ts.nres; i++)
            clg_release_event(&ts.res_ev[i]);
    }
    free(ts.res_ev);
    free(ts.res);
    free(ts.perm);
    clg_dataset_free(ts.train);
    clg_dataset_free(ts.test);
    clg_session_free(ts.m);
    if (out)
        *out = rep;
    return st;
}
