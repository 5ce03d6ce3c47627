/* GEMM auto-tuner: candidate parameter sets, per-class search, DL shapes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tune.h"
#include "tune_gemm.h"

static int add(clg_device *dev, clg_gemm_params *out, int max, int n, const clg_gemm_params *p)
{
    clg_err saved = dev->err;
    int ok = clg_gemm_params_check(dev, p) == CLG_OK;
    dev->err = saved;
    if (!ok)
        return n;
    if (n < max)
        out[n] = *p;
    return n + 1;
}

int clg_gemm_candidates(clg_device *dev, int quick, clg_gemm_params *out, int max)
{
    int n = 0;
    clg_gemm_params p;
    int cpu = (dev->info.type & CLG_DEVICE_CPU) != 0;
    /* CPU family: register tile MR x NV*VW, work-group size (run-time). */
    static const int cpu_quick[][3] = {{8, 2, 16}, {6, 4, 16}, {12, 2, 16}, {4, 4, 16}, {4, 2, 16}, {8, 1, 16},
                                       {6, 2, 8}};
    static const int cpu_full[][3] = {{8, 2, 16}, {6, 4, 16}, {12, 2, 16}, {4, 4, 16}, {4, 2, 16}, {8, 1, 16},
                                      {16, 1, 16}, {6, 2, 16}, {8, 3, 16}, {4, 6, 16}, {8, 2, 8}, {16, 2, 8},
                                      {6, 2, 8}};
    static const int wgs_quick[] = {1, 4};
    static const int wgs_full[] = {1, 4, 8};
    if (cpu || !quick) {
        int nc = quick ? (int)CLG_ARRAY_LEN(cpu_quick) : (int)CLG_ARRAY_LEN(cpu_full);
        int nw = quick ? (int)CLG_ARRAY_LEN(wgs_quick) : (int)CLG_ARRAY_LEN(wgs_full);
        for (int i = 0; i < nc; i++)
            for (int w = 0; w < nw; w++) {
                const int *c = quick ? cpu_quick[i] : cpu_full[i];
                memset(&p, 0, sizeof p);
                p.family = CLG_GEMM_FAM_CPU;
                p.MR = c[0];
                p.NV = c[1];
                p.VW = c[2];
                p.WGS = quick ? wgs_quick[w] : wgs_full[w];
                n = add(dev, out, max, n, &p);
            }
    }
    /* Tiled (GPU-style) family: work-group tile, work-item tile, vectors, padding. */
    static const int tiled[][9] = {
        /* MWG NWG KWG MDIMC NDIMC VWM VWN PADA PADB */
        {64, 64, 16, 16, 16, 2, 2, 1, 1}, {64, 64, 16, 16, 16, 4, 4, 1, 1}, {32, 32, 16, 8, 8, 2, 2, 1, 1},
        {128, 64, 16, 16, 16, 4, 2, 1, 1}, {64, 128, 16, 16, 16, 2, 4, 1, 1}, {128, 128, 8, 16, 16, 4, 4, 1, 1},
        {64, 64, 32, 8, 8, 4, 4, 0, 0},   {16, 16, 16, 4, 4, 2, 2, 0, 0},
    };
    int nt = (int)CLG_ARRAY_LEN(tiled);
    if (quick)
        nt = cpu ? 1 : 6; /* on a CPU device one tiled set shows the contrast */
    for (int i = 0; i < nt; i++) {
        memset(&p, 0, sizeof p);
        p.family = CLG_GEMM_FAM_TILED;
        p.MWG = tiled[i][0];
        p.NWG = tiled[i][1];
        p.KWG = tiled[i][2];
        p.MDIMC = tiled[i][3];
        p.NDIMC = tiled[i][4];
        p.VWM = tiled[i][5];
        p.VWN = tiled[i][6];
        p.PADA = tiled[i][7];
        p.PADB = tiled[i][8];
        n = add(dev, out, max, n, &p);
    }
    return n;
}

int clg_gemm_dl_shapes(int batch, clg_gemm_shape *out, int max)
{
    /* conv as im2col: forward M=Kout N=B*P*Q K=C*R*S; data gradient
     * M=C*R*S N=B*P*Q K=Kout (ta); weight gradient M=Kout N=C*R*S K=B*P*Q (tb).
     * dense: forward M=B N=out K=in (tb); data M=B N=in K=out; weight M=out N=in K=B (ta).
     * The first layer of each net needs no data gradient. */
    typedef struct L {
        const char *name;
        int conv, first, out, in, pq; /* conv: out=Kout in=C*R*S pq=P*Q */
    } L;
    static const L layers[] = {
        {"vgg.conv1", 1, 1, 32, 1 * 9, 28 * 28},  {"vgg.conv2", 1, 0, 32, 32 * 9, 28 * 28},
        {"vgg.conv3", 1, 0, 64, 32 * 9, 14 * 14}, {"vgg.conv4", 1, 0, 64, 64 * 9, 14 * 14},
        {"vgg.fc1", 0, 0, 256, 7 * 7 * 64, 1},    {"vgg.fc2", 0, 0, 10, 256, 1},
        {"lenet.conv1", 1, 1, 6, 1 * 25, 28 * 28}, {"lenet.conv2", 1, 0, 16, 6 * 25, 10 * 10},
        {"lenet.fc1", 0, 0, 120, 5 * 5 * 16, 1},  {"lenet.fc2", 0, 0, 84, 120, 1},
        {"lenet.fc3", 0, 0, 10, 84, 1},
    };
    int n = 0;
    for (size_t i = 0; i < CLG_ARRAY_LEN(layers); i++) {
        const L *l = &layers[i];
        clg_gemm_shape s[3];
        int ns = 0;
        static char labels[CLG_ARRAY_LEN(layers)][3][32];
        if (l->conv) {
            int bpq = batch * l->pq;
            s[ns++] = (clg_gemm_shape){"fwd", l->out, bpq, l->in, 0, 0, 1};
            if (!l->first)
                s[ns++] = (clg_gemm_shape){"bwd-data", l->in, bpq, l->out, 1, 0, 1};
            s[ns++] = (clg_gemm_shape){"bwd-weight", l->out, l->in, bpq, 0, 1, 1};
        } else {
            s[ns++] = (clg_gemm_shape){"fwd", batch, l->out, l->in, 0, 1, 1};
            s[ns++] = (clg_gemm_shape){"bwd-data", batch, l->in, l->out, 0, 0, 1};
            s[ns++] = (clg_gemm_shape){"bwd-weight", l->out, l->in, batch, 1, 0, 1};
        }
        for (int j = 0; j < ns; j++) {
            snprintf(labels[i][j], sizeof labels[i][j], "%s.%s", l->name, s[j].label);
            s[j].label = labels[i][j];
            if (n < max)
                out[n] = s[j];
            n++;
        }
    }
    return n;
}

static void say(const clg_gemm_tune_opts *o, const char *fmt, ...) CLG_PRINTF(2, 3);
static void say(const clg_gemm_tune_opts *o, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (o->progress)
        o->progress(o->user, line);
    else
        clg_log(1, "%s", line);
}

/* The shapes to tune: the caller's, else three square products and the DL
 * preset. *shapes is malloc'd. */
static clg_status tune_shapes(clg_device *dev, const clg_gemm_tune_opts *o, int (**out)[3], int *count)
{
    clg_err *err = clg_dev_err(dev);
    int (*shapes)[3] = NULL;
    int ns = 0;
    if (o->shapes) {
        ns = o->nshapes;
        shapes = malloc(sizeof *shapes * (size_t)CLG_MAX(ns, 1));
        if (!shapes)
            return clg_err_set(err, CLG_ERR_HOST_OOM, "tune: out of memory");
        memcpy(shapes, o->shapes, sizeof *shapes * (size_t)ns);
    } else {
        clg_gemm_shape dl[64];
        int nd = clg_gemm_dl_shapes(128, dl, (int)CLG_ARRAY_LEN(dl));
        nd = CLG_MIN(nd, (int)CLG_ARRAY_LEN(dl));
        shapes = malloc(sizeof *shapes * (size_t)(nd + 3));
        if (!shapes)
            return clg_err_set(err, CLG_ERR_HOST_OOM, "tune: out of memory");
        static const int sq[3] = {256, 1024, 2048};
        for (int i = 0; i < 3; i++) {
            shapes[ns][0] = shapes[ns][1] = shapes[ns][2] = sq[i];
            ns++;
        }
        for (int i = 0; i < nd; i++) {
            shapes[ns][0] = dl[i].M;
            shapes[ns][1] = dl[i].N;
            shapes[ns][2] = dl[i].K;
            ns++;
        }
    }
    *out = shapes;
    *count = ns;
    return CLG_OK;
}

/* Times every candidate on the product a; a failing one is reported and
 * skipped. Returns 1 with the fastest in *bp and its time in *best. */
static int tune_fastest(clg_device *dev, const clg_gemm_tune_opts *o, const clg_gemm_args *a, const char *cls,
                        const clg_gemm_params *cand, int nc, int reps, clg_gemm_params *bp, double *best)
{
    clg_err *err = clg_dev_err(dev);
    double flop = 2.0 * a->M * a->N * a->K;
    int have = 0;
    *best = 1e30;
    for (int c = 0; c < nc; c++) {
        double ms = 0;
        clg_err saved = *err;
        clg_status r = clg_gemm_time(dev, a, CLG_GEMM_OWN, &cand[c], reps, &ms);
        char desc[160];
        clg_gemm_params_str(&cand[c], desc, sizeof desc);
        if (r != CLG_OK) {
            say(o, "  %s %dx%dx%d %s: failed (%s)", cls, a->M, a->N, a->K, desc, err->msg);
            *err = saved;
            continue;
        }
        if (ms > 0 && ms < *best) {
            *best = ms;
            *bp = cand[c];
            have = 1;
        }
        if (!o->quick || clg_log_level >= 2)
            say(o, "  %s %dx%dx%d %s: %.3f ms %.1f GFLOP/s", cls, a->M, a->N, a->K, desc, ms, flop / ms / 1e6);
    }
    return have;
}

/* With CLBlast: times it on the same product and stores which backend
 * "auto" should pick for the class ("gemm-auto/<class>"). */
static clg_status tune_vs_clblast(clg_device *dev, const clg_gemm_tune_opts *o, const clg_gemm_args *a,
                                  const char *cls, double best, int reps)
{
    clg_err *err = clg_dev_err(dev);
    double flop = 2.0 * a->M * a->N * a->K;
    double cb = 0;
    clg_err saved = *err;
    clg_status r = clg_gemm_time(dev, a, CLG_GEMM_CLBLAST, NULL, reps, &cb);
    clg_tune_entry ae;
    memset(&ae, 0, sizeof ae);
    snprintf(ae.key, sizeof ae.key, "gemm-auto/%s", cls);
    clg_tune_set(&ae, "own_ms", best);
    if (r == CLG_OK) {
        clg_tune_set(&ae, "clblast_ms", cb);
        say(o, "%s: clblast %.3f ms, %.1f GFLOP/s -> auto picks %s", cls, cb, flop / cb / 1e6,
            cb > 0 && cb < best ? "clblast" : "own");
    } else {
        say(o, "%s: clblast failed (%s) -> auto picks own", cls, err->msg);
        *err = saved;
    }
    snprintf(ae.backend, sizeof ae.backend, "%s", r == CLG_OK && cb > 0 && cb < best ? "clblast" : "own");
    return clg_tune_put(dev, &ae);
}

/* Times one parameter set on a; GFLOP/s, 0 when it does not run. */
static double figure(clg_device *dev, const clg_gemm_args *a, const clg_gemm_params *p, int reps)
{
    clg_err saved = *clg_dev_err(dev);
    double ms = 0;
    clg_status st = clg_gemm_params_check(dev, p);
    if (st == CLG_OK)
        st = clg_gemm_time(dev, a, CLG_GEMM_OWN, p, reps, &ms);
    *clg_dev_err(dev) = saved;
    return st == CLG_OK && ms > 0 ? 2.0 * a->M * a->N * a->K / ms / 1e6 : 0;
}

/* Records what the built-in defaults and the shipped family's set reach on
 * the same product ("def_gflops", "fam_gflops"): how far an untuned
 * device is from the tuned figure (clgrad devices). */
static void baseline_figures(clg_device *dev, const clg_gemm_args *a, const char *cls, int reps, clg_tune_entry *e)
{
    clg_gemm_params dp, fp;
    clg_gemm_params_default(dev, &dp);
    double dg = figure(dev, a, &dp, reps);
    if (dg > 0)
        clg_tune_set(e, "def_gflops", dg);
    clg_tune_family *f = clg_tune_family_get(dev);
    int bm, bn, bk;
    if (!f || !f->d.n || sscanf(cls, "M%dN%dK%d", &bm, &bn, &bk) != 3)
        return;
    const clg_tune_entry *fe = clg_tune_nearest_gemm(&f->d, bm, bn, bk);
    if (!fe || !clg_gemm_params_from_entry(fe, &fp))
        return;
    double fg = memcmp(&fp, &dp, sizeof fp) == 0 ? dg : figure(dev, a, &fp, reps);
    if (fg > 0)
        clg_tune_set(e, "fam_gflops", fg);
}

/* Tunes the class of the product a (shrunk to keep each timed run short)
 * and stores the best parameter set as "gemm/<class>". */
static clg_status tune_class(clg_device *dev, const clg_gemm_tune_opts *o, clg_gemm_args *a, const char *cls,
                             const clg_gemm_params *cand, int nc)
{
    int reps = o->quick ? 3 : 5;
    double max_gflop = o->max_gflop > 0 ? o->max_gflop : 2.0;
    /* shrink N (stays in the same class unless the shape is huge) */
    while (2.0 * a->M * a->N * a->K > max_gflop * 1e9 && a->N > 64)
        a->N /= 2;
    double flop = 2.0 * a->M * a->N * a->K;
    double best;
    clg_gemm_params bp;
    if (!tune_fastest(dev, o, a, cls, cand, nc, reps, &bp, &best)) {
        say(o, "  %s: no parameter set ran; defaults stay", cls);
        return CLG_OK;
    }
    clg_tune_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.key, sizeof e.key, "gemm/%s", cls);
    clg_gemm_params_to_entry(&bp, &e);
    clg_tune_set(&e, "gflops", flop / best / 1e6);
    baseline_figures(dev, a, cls, reps, &e);
    clg_tune_set(&e, "M", a->M);
    clg_tune_set(&e, "N", a->N);
    clg_tune_set(&e, "K", a->K);
    CLG_TRY(clg_tune_put(dev, &e));
    char desc[160];
    clg_gemm_params_str(&bp, desc, sizeof desc);
    say(o, "%s %dx%dx%d: best %s, %.3f ms, %.1f GFLOP/s", cls, a->M, a->N, a->K, desc, best, flop / best / 1e6);
    /* a class whose own-vs-CLBlast choice a run recorded against the parameters it
     * had then (clg_gemm_run's AUTO) is decided again against the new winner */
    char ak[64];
    snprintf(ak, sizeof ak, "gemm-auto/%s", cls);
    if ((o->clblast > 0 || (o->clblast < 0 && clg_tune_find(dev, ak))) && clg_gemm_have_clblast())
        return tune_vs_clblast(dev, o, a, cls, best, reps);
    return CLG_OK;
}

clg_status clg_gemm_tune(clg_device *dev, const clg_gemm_tune_opts *o)
{
    clg_err *err = clg_dev_err(dev);
    int (*shapes)[3] = NULL;
    int ns = 0;
    CLG_TRY(tune_shapes(dev, o, &shapes, &ns));
    int nc = clg_gemm_candidates(dev, o->quick, NULL, 0);
    clg_gemm_params *cand = malloc(sizeof *cand * (size_t)CLG_MAX(nc, 1));
    if (!cand) {
        free(shapes);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "tune: out of memory");
    }
    nc = clg_gemm_candidates(dev, o->quick, cand, nc);
    clg_status st = CLG_OK;
    char done[64][32]; /* the classes tuned, each once */
    int ndone = 0;
    double t0 = clg_now_sec();
    say(o, "tuning GEMM on %s (%s): %d parameter sets, %d shapes%s", dev->info.name, dev->info.driver_version, nc,
        ns, o->quick ? " (quick)" : "");
    for (int s = 0; s < ns && st == CLG_OK; s++) {
        clg_gemm_args a;
        clg_gemm_args_init(&a);
        a.M = shapes[s][0];
        a.N = shapes[s][1];
        a.K = shapes[s][2];
        if (a.M < 1 || a.N < 1 || a.K < 1)
            continue;
        char cls[32];
        clg_gemm_class(a.M, a.N, a.K, cls, sizeof cls);
        int seen = 0;
        for (int i = 0; i < ndone; i++)
            seen |= strcmp(done[i], cls) == 0;
        if (seen || ndone >= 64)
            continue;
        snprintf(done[ndone++], sizeof done[0], "%s", cls);
        st = tune_class(dev, o, &a, cls, cand, nc);
    }
    if (st == CLG_OK)
        st = clg_tune_save(dev);
    if (st == CLG_OK) {
        char path[1200];
        clg_tune_path(dev, path, sizeof path);
        say(o, "tuned %d shape classes on %s in %.1f s; saved %s", ndone, dev->info.name, clg_now_sec() - t0, path);
    }
    free(cand);
    free(shapes);
    return st;
}
