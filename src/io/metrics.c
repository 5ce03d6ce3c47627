/* The training log (CSV, one row per epoch) and its SVG plot. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/metrics.h"

const char clg_metrics_csv_header[] =
    "epoch,step,train_loss,train_acc,test_loss,test_acc,lr,seconds,images_per_s\n";

// ---- CSV ----

clg_status clg_metrics_csv_open(clg_err *err, const char *path, int append, FILE **out)
{
    struct stat sb;
    int exists = stat(path, &sb) == 0;
    *out = NULL;
    FILE *f = fopen(path, append && exists ? "a" : "w");
    if (!f)
        return clg_err_set(err, CLG_ERR_IO, "cannot write log '%s': %s", path, strerror(errno));
    if (!(append && exists))
        fputs(clg_metrics_csv_header, f);
    *out = f;
    return CLG_OK;
}

void clg_metrics_csv_write(FILE *f, const clg_metrics_row *r)
{
    fprintf(f, "%d,%" PRId64 ",%.6f,%.6f,%.6f,%.6f,%.6g,%.3f,%.1f\n", r->epoch, r->step, r->train_loss, r->train_acc,
            r->test_loss, r->test_acc, r->lr, r->seconds, r->ips);
    fflush(f);
}

/* Returns 0 when the file cannot be opened (errno says why), -1 when out of
 * memory, 1 when read. */
static int read_rows(const char *path, clg_metrics_row **rows, int *n)
{
    *rows = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[512];
    int cap = 0, ok = 1;
    while (fgets(line, sizeof line, f)) {
        clg_metrics_row r;
        long long st;
        if (sscanf(line, "%d,%lld,%lf,%lf,%lf,%lf,%lf,%lf,%lf", &r.epoch, &st, &r.train_loss, &r.train_acc,
                   &r.test_loss, &r.test_acc, &r.lr, &r.seconds, &r.ips) != 9)
            continue;
        r.step = st;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            clg_metrics_row *nr = realloc(*rows, (size_t)cap * sizeof **rows);
            if (!nr) {
                ok = -1;
                break;
            }
            *rows = nr;
        }
        (*rows)[(*n)++] = r;
    }
    fclose(f);
    if (ok < 0) {
        free(*rows);
        *rows = NULL;
        *n = 0;
    }
    return ok;
}

clg_status clg_metrics_csv_read(clg_err *err, const char *path, clg_metrics_row **rows, int *n)
{
    int r = read_rows(path, rows, n);
    if (r == 0)
        return clg_err_set(err, CLG_ERR_IO, "cannot read the training log '%s': %s", path, strerror(errno));
    if (r < 0)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory reading the training log '%s'", path);
    return CLG_OK;
}

// ---- SVG ----

/* One panel's geometry and value range. */
typedef struct panel {
    double x0, y0, w, h, ymin, ymax;
    int maxep;
} panel;

/* which: 0 train loss, 1 test loss, 2 train accuracy, 3 test accuracy. */
static double row_value(const clg_metrics_row *r, int which)
{
    return which == 0 ? r->train_loss : which == 1 ? r->test_loss : which == 2 ? r->train_acc : r->test_acc;
}

static double panel_x(const panel *pn, int epoch)
{
    return pn->x0 + pn->w * (pn->maxep > 1 ? (double)(epoch - 1) / (pn->maxep - 1) : 0.5);
}

static double panel_y(const panel *pn, double v)
{
    return pn->y0 + pn->h - pn->h * (v - pn->ymin) / (pn->ymax - pn->ymin > 0 ? pn->ymax - pn->ymin : 1);
}

/* One series as a polyline plus a dot per epoch; negative and non-finite
 * values (not measured) are left out. */
static void svg_series(clg_sbuf *b, const clg_metrics_row *r, int n, int which, const panel *pn, const char *color,
                       int dashed)
{
    int any = 0;
    for (int i = 0; i < n; i++) {
        double v = row_value(&r[i], which);
        if (v < 0 || !isfinite(v))
            continue;
        if (!any)
            clg_sbuf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", color,
                            dashed ? " stroke-dasharray=\"6,4\"" : "");
        any = 1;
        clg_sbuf_printf(b, "%.1f,%.1f ", panel_x(pn, r[i].epoch), panel_y(pn, v));
    }
    if (any)
        clg_sbuf_printf(b, "\"/>\n");
    for (int i = 0; i < n; i++) {
        double v = row_value(&r[i], which);
        if (v < 0 || !isfinite(v))
            continue;
        clg_sbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", panel_x(pn, r[i].epoch),
                        panel_y(pn, v), color);
    }
}

/* The value range of a panel's two series (padded by 8%) and its last epoch. */
static void panel_range(panel *pn, const clg_metrics_row *r, int n, int acc)
{
    double ymin = INFINITY, ymax = -INFINITY;
    pn->maxep = 1;
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
        if (r[i].epoch > pn->maxep)
            pn->maxep = r[i].epoch;
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
    pn->ymin = ymin;
    pn->ymax = ymax;
}

/* Text content with XML's special characters escaped (a model file's name
 * may hold '&' or '<'). */
static void svg_text(clg_sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '&')
            clg_sbuf_printf(b, "&amp;");
        else if (*s == '<')
            clg_sbuf_printf(b, "&lt;");
        else if (*s == '>')
            clg_sbuf_printf(b, "&gt;");
        else
            clg_sbuf_printf(b, "%c", *s);
    }
}

/* Title, frame, value ticks with grid lines, epoch ticks and the axis label. */
static void svg_axes(clg_sbuf *b, const panel *pn, int acc, const char *title)
{
    double x0 = pn->x0, y0 = pn->y0, w = pn->w, h = pn->h;
    clg_sbuf_printf(b, "<text x=\"%.0f\" y=\"25\" font-size=\"15\" font-family=\"sans-serif\">", x0);
    svg_text(b, title);
    clg_sbuf_printf(b, "</text>\n");
    clg_sbuf_printf(b, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#888\"/>\n", x0,
                    y0, w, h);
    for (int t = 0; t <= 4; t++) {
        double v = pn->ymin + (pn->ymax - pn->ymin) * t / 4;
        double y = y0 + h - h * t / 4;
        clg_sbuf_printf(b, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\" font-family=\"sans-serif\">%.*f</text>\n",
                        x0 - 4, y + 4, acc ? 1 : 3, v);
        clg_sbuf_printf(b, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", x0, y, x0 + w, y);
    }
    for (int e = 1; e <= pn->maxep; e++) {
        if (pn->maxep > 12 && e % (pn->maxep / 10 + 1) != 0 && e != 1)
            continue;
        clg_sbuf_printf(b, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\" font-family=\"sans-serif\">%d</text>\n",
                        panel_x(pn, e), y0 + h + 15, e);
    }
    clg_sbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" text-anchor=\"middle\" font-family=\"sans-serif\">epoch</text>\n",
                    x0 + w / 2, y0 + h + 32);
}

/* A panel: loss (acc 0) or accuracy in % (acc 1), train solid, test dashed.
 * Returns 0 when out of memory. */
static int svg_panel(clg_sbuf *b, const clg_metrics_row *r, int n, int acc, double x0, const char *title)
{
    panel pn = {.x0 = x0, .y0 = 40, .w = 360, .h = 260};
    panel_range(&pn, r, n, acc);
    svg_axes(b, &pn, acc, title);
    clg_metrics_row *tmp = calloc((size_t)CLG_MAX(n, 1), sizeof *tmp);
    if (!tmp)
        return 0;
    for (int i = 0; i < n; i++) { /* accuracy in percent; "not measured" stays negative */
        tmp[i] = r[i];
        if (acc) {
            tmp[i].train_acc = r[i].train_acc >= 0 ? r[i].train_acc * 100 : -1;
            tmp[i].test_acc = r[i].test_acc >= 0 ? r[i].test_acc * 100 : -1;
        }
    }
    svg_series(b, tmp, n, acc ? 2 : 0, &pn, "#1f77b4", 0);
    svg_series(b, tmp, n, acc ? 3 : 1, &pn, "#d62728", 1);
    free(tmp);
    clg_sbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#1f77b4\" font-family=\"sans-serif\">train</text>\n",
                    x0 + pn.w - 90, pn.y0 + 16);
    clg_sbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#d62728\" font-family=\"sans-serif\">test</text>\n",
                    x0 + pn.w - 45, pn.y0 + 16);
    return 1;
}

clg_status clg_metrics_svg(clg_err *err, const clg_metrics_row *rows, int n, const char *title, char **out,
                           size_t *len)
{
    *out = NULL;
    *len = 0;
    clg_sbuf b = {0};
    clg_sbuf_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"860\" height=\"360\" viewBox=\"0 0 860 360\">\n");
    clg_sbuf_printf(&b, "<rect width=\"860\" height=\"360\" fill=\"white\"/>\n");
    char t1[300], t2[300];
    snprintf(t1, sizeof t1, "loss per epoch (%s)", title);
    snprintf(t2, sizeof t2, "accuracy %% per epoch (%s)", title);
    int ok = svg_panel(&b, rows, n, 0, 60, t1);
    ok = ok && svg_panel(&b, rows, n, 1, 480, t2);
    clg_sbuf_printf(&b, "</svg>\n");
    if (!ok || b.oom || !b.data) {
        clg_sbuf_free(&b);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory writing the plot");
    }
    *out = b.data;
    *len = b.len;
    return CLG_OK;
}

clg_status clg_metrics_plot(clg_err *err, const char *csv_path, const char *title)
{
    clg_metrics_row *rows = NULL;
    int n = 0;
    int r = read_rows(csv_path, &rows, &n);
    if (r == 0)
        return clg_err_set(err, CLG_ERR_IO, "cannot read '%s' to plot it: %s", csv_path, strerror(errno));
    if (r < 0)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory reading '%s' to plot it", csv_path);
    char *svg = NULL;
    size_t len = 0;
    clg_status st = clg_metrics_svg(err, rows, n, title, &svg, &len);
    free(rows);
    if (st != CLG_OK)
        return st;
    char path[1100];
    size_t L = strlen(csv_path);
    if (L > 4 && strcmp(csv_path + L - 4, ".csv") == 0)
        snprintf(path, sizeof path, "%.*s.svg", (int)(L - 4), csv_path);
    else
        snprintf(path, sizeof path, "%s.svg", csv_path);
    st = clg_file_write_atomic(err, path, svg, len);
    free(svg);
    return st;
}
