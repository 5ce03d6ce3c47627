/* clgrad sweep's plot, DIR/sweep.svg: each trial's validation curve (its
 * log, epoch by epoch) and the first parameter against the final metric. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sweep.h"

#define SVG_W 980
#define SVG_H 380
#define PANEL_W 420
#define PANEL_H 280
#define MAX_EPOCHS 4096

typedef struct svg_buf {
    char *b;
    size_t len, cap;
} svg_buf;

static void put(svg_buf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(svg_buf *s, const char *fmt, ...)
{
    va_list ap;
    for (int tries = 0; tries < 2 && s->b; tries++) {
        va_start(ap, fmt);
        int n = vsnprintf(s->b + s->len, s->cap - s->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < s->cap - s->len) {
            s->len += (size_t)n;
            return;
        }
        size_t cap = s->cap * 2 + (size_t)n + 1;
        char *p = realloc(s->b, cap);
        if (!p) {
            free(s->b);
            s->b = NULL;
            return;
        }
        s->b = p;
        s->cap = cap;
    }
}

/* A trial's log: the metric after each epoch (index epoch - 1; NAN: none). Returns the epochs read. */
static int trial_curve(const sweep_run *r, int trial, double *v)
{
    char path[4200], line[512];
    snprintf(path, sizeof path, "%s/trial-%04d/log.csv", r->dir, trial);
    FILE *f = fopen(path, "r");
    int n = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        int e;
        long long step;
        double tl, ta, vl, va;
        if (sscanf(line, "%d,%lld,%lf,%lf,%lf,%lf", &e, &step, &tl, &ta, &vl, &va) != 6 || e < 1 || e > MAX_EPOCHS)
            continue;
        v[e - 1] = strcmp(r->metric, "val_loss") == 0 ? vl : va;
        n = e > n ? e : n;
    }
    fclose(f);
    return n;
}

static void axes(svg_buf *s, int x0, const char *title, const char *xl, double xlo, double xhi, double ylo,
                 double yhi, const char *ylabel)
{
    put(s, "<rect x='%d' y='50' width='%d' height='%d' fill='none' stroke='#444'/>\n", x0, PANEL_W, PANEL_H);
    put(s, "<text x='%d' y='40' font-size='14'>%s</text>\n", x0, title);
    put(s, "<text x='%d' y='%d' font-size='12'>%s</text>\n", x0 + PANEL_W / 2 - 40, 50 + PANEL_H + 32, xl);
    put(s, "<text x='%d' y='%d' font-size='11'>%.4g</text><text x='%d' y='%d' font-size='11'>%.4g</text>\n", x0,
        50 + PANEL_H + 15, xlo, x0 + PANEL_W - 30, 50 + PANEL_H + 15, xhi);
    put(s, "<text x='%d' y='62' font-size='11' text-anchor='end'>%.4g</text>\n", x0 - 4, yhi);
    put(s, "<text x='%d' y='%d' font-size='11' text-anchor='end'>%.4g</text>\n", x0 - 4, 50 + PANEL_H, ylo);
    put(s, "<text x='%d' y='%d' font-size='11' text-anchor='end'>%s</text>\n", x0 - 4, 50 + PANEL_H / 2, ylabel);
}

static double px(double x, double lo, double hi, int x0) { return x0 + (hi > lo ? (x - lo) / (hi - lo) : 0.5) * PANEL_W; }
static double py(double y, double lo, double hi) { return 50 + PANEL_H - (hi > lo ? (y - lo) / (hi - lo) : 0.5) * PANEL_H; }

/* The curves panel: every trial's metric by epoch, the best drawn last in a strong colour. */
static void curves(svg_buf *s, const sweep_run *r, const int *order, double *v)
{
    int n = r->sched->ntrials, emax = 1;
    double lo = INFINITY, hi = -INFINITY;
    for (int k = 0; k < n; k++) {
        for (int e = 0; e < MAX_EPOCHS; e++)
            v[e] = NAN;
        int m = trial_curve(r, order[k], v);
        emax = m > emax ? m : emax;
        for (int e = 0; e < m; e++)
            if (isfinite(v[e])) {
                lo = v[e] < lo ? v[e] : lo;
                hi = v[e] > hi ? v[e] : hi;
            }
    }
    if (!(lo <= hi))
        lo = 0, hi = 1;
    axes(s, 70, "validation curves (best in red)", "epoch", 1, emax, lo, hi, r->metric);
    for (int k = n - 1; k >= 0; k--) {
        for (int e = 0; e < MAX_EPOCHS; e++)
            v[e] = NAN;
        int m = trial_curve(r, order[k], v), started = 0;
        put(s, "<polyline fill='none' stroke='%s' stroke-width='%s' points='", k == 0 ? "#d62728" : "#7f9fbf",
            k == 0 ? "2.5" : "1");
        for (int e = 0; e < m; e++)
            if (isfinite(v[e])) {
                put(s, "%s%.1f,%.1f", started ? " " : "", px(e + 1, 1, emax, 70), py(v[e], lo, hi));
                started = 1;
            }
        put(s, "'><title>trial %d</title></polyline>\n", order[k]);
    }
}

/* The scatter panel: the first parameter (log axis for a log range, the values in order for a list) against
 * each trial's final metric; failed trials as crosses along the bottom. */
static void scatter(svg_buf *s, const sweep_run *r, const int *order)
{
    const sw_param *p = &r->space->p[0];
    double xlo = p->kind == SW_CHOICE ? 0 : p->kind == SW_LOG ? log10(p->lo) : p->lo;
    double xhi = p->kind == SW_CHOICE ? (p->nchoices > 1 ? p->nchoices - 1 : 1) : p->kind == SW_LOG ? log10(p->hi) : p->hi;
    double lo = INFINITY, hi = -INFINITY;
    for (int k = 0; k < r->nrows; k++)
        if (!r->rows[k].failed && isfinite(sweep_metric(r, &r->rows[k]))) {
            lo = fmin(lo, sweep_metric(r, &r->rows[k]));
            hi = fmax(hi, sweep_metric(r, &r->rows[k]));
        }
    if (!(lo <= hi))
        lo = 0, hi = 1;
    char xl[96];
    snprintf(xl, sizeof xl, "%s%s", p->kind == SW_LOG ? "log10 " : "", p->name);
    axes(s, 70 + PANEL_W + 80, "parameter vs final metric", xl, xlo, xhi, lo, hi, "");
    for (int k = 0; k < r->sched->ntrials; k++) {
        int i = order[k];
        const sw_trial *t = &r->sched->t[i];
        double x = 0;
        if (p->kind == SW_CHOICE) {
            for (int c = 0; c < p->nchoices; c++)
                if (strcmp(p->choices[c], t->val[0]) == 0)
                    x = c;
        } else {
            x = strtod(t->val[0], NULL);
            x = p->kind == SW_LOG ? log10(x) : x;
        }
        double X = px(x, xlo, xhi, 70 + PANEL_W + 80);
        if (t->state == SW_FAILED) {
            put(s, "<text x='%.1f' y='%d' fill='#d62728' font-size='12' text-anchor='middle'>x<title>trial %d "
                   "failed</title></text>\n", X, 50 + PANEL_H - 2, i);
        } else if (t->rung >= 0) {
            double y = r->maximize ? t->score[t->rung] : -t->score[t->rung];
            put(s, "<circle cx='%.1f' cy='%.1f' r='%d' fill='%s'><title>trial %d: %s=%s, %d epochs</title></circle>\n",
                X, py(y, lo, hi), 3 + t->rung, k == 0 ? "#d62728" : "#1f77b4", i, p->name, t->val[0],
                r->sched->epochs[t->rung]);
        }
    }
}

void sweep_svg(const sweep_run *r, const int *order)
{
    svg_buf s = {.b = malloc(65536), .cap = 65536};
    double *v = malloc(MAX_EPOCHS * sizeof *v);
    if (s.b && v && r->space->n > 0) {
        put(&s, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif'>\n", SVG_W,
            SVG_H);
        put(&s, "<rect width='100%%' height='100%%' fill='white'/>\n");
        curves(&s, r, order, v);
        scatter(&s, r, order);
        put(&s, "</svg>\n");
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/sweep.svg", r->dir);
    if (s.b && v && clg_write_file_atomic(path, s.b, s.len) != CLG_OK)
        cli_fail("sweep: %s", clg_last_error(NULL));
    free(s.b);
    free(v);
}
