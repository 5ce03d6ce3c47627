/* The training log (CSV) and its plot (SVG): rows written, read back and
 * compared on fresh random values; resume appends without a second header;
 * the SVG is well-formed and draws each series in the order of its values. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "io/metrics.h"
#include "testutil.h"

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/clgrad-metrics-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void path_in(char *dst, size_t n, const char *name)
{
    snprintf(dst, n, "%s/%s", tmpdir, name);
}

/* n rows of fresh values; without_test: test figures -1 (not evaluated). */
static void random_rows(clg_metrics_row *r, int n, int without_test, clg_rng *g)
{
    for (int i = 0; i < n; i++) {
        r[i] = (clg_metrics_row){
            .epoch = i + 1,
            .step = (int64_t)(i + 1) * (1 + clg_rng_u32(g) % 5000) + ((int64_t)1 << 33) * (i == 1),
            .train_loss = 3.0 * clg_rng_uniform(g),
            .train_acc = clg_rng_uniform(g),
            .test_loss = without_test ? -1 : 3.0 * clg_rng_uniform(g),
            .test_acc = without_test ? -1 : clg_rng_uniform(g),
            .lr = 1e-4 + 0.1 * clg_rng_uniform(g),
            .seconds = 100.0 * clg_rng_uniform(g),
            .ips = 1e5 * clg_rng_uniform(g),
        };
    }
}

static void assert_row_near(const clg_metrics_row *got, const clg_metrics_row *want)
{
    ck_assert_int_eq(got->epoch, want->epoch);
    ck_assert_int_eq(got->step, want->step);
    ck_assert_double_eq_tol(got->train_loss, want->train_loss, 1e-6);
    ck_assert_double_eq_tol(got->train_acc, want->train_acc, 1e-6);
    ck_assert_double_eq_tol(got->test_loss, want->test_loss, 1e-6);
    ck_assert_double_eq_tol(got->test_acc, want->test_acc, 1e-6);
    ck_assert_double_eq_tol(got->lr, want->lr, 1e-5 * want->lr);
    ck_assert_double_eq_tol(got->seconds, want->seconds, 1e-3);
    ck_assert_double_eq_tol(got->ips, want->ips, 0.1);
}

static int count_lines_starting(const char *path, const char *prefix)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[512];
    int k = 0;
    while (fgets(line, sizeof line, f))
        k += strncmp(line, prefix, strlen(prefix)) == 0;
    fclose(f);
    return k;
}

START_TEST(test_csv_roundtrip)
{
    make_tmpdir();
    clg_rng g;
    tu_rng(&g, 1);
    enum { N = 23 };
    clg_metrics_row rows[N];
    random_rows(rows, N, 0, &g);
    char path[128];
    path_in(path, sizeof path, "run.csv");
    clg_err err = {0};
    /* a fresh run: header + 10 rows; its resume appends the rest */
    FILE *f = NULL;
    ck_assert_int_eq(clg_metrics_csv_open(&err, path, 0, &f), CLG_OK);
    for (int i = 0; i < 10; i++)
        clg_metrics_csv_write(f, &rows[i]);
    fclose(f);
    ck_assert_int_eq(clg_metrics_csv_open(&err, path, 1, &f), CLG_OK);
    for (int i = 10; i < N; i++)
        clg_metrics_csv_write(f, &rows[i]);
    fclose(f);
    ck_assert_int_eq(count_lines_starting(path, "epoch,step,"), 1);
    clg_metrics_row *got = NULL;
    int n = -1;
    ck_assert_int_eq(clg_metrics_csv_read(&err, path, &got, &n), CLG_OK);
    ck_assert_int_eq(n, N);
    for (int i = 0; i < N; i++)
        assert_row_near(&got[i], &rows[i]);
    free(got);
    /* a run that is not resumed starts the log again */
    ck_assert_int_eq(clg_metrics_csv_open(&err, path, 0, &f), CLG_OK);
    clg_metrics_csv_write(f, &rows[0]);
    fclose(f);
    ck_assert_int_eq(clg_metrics_csv_read(&err, path, &got, &n), CLG_OK);
    ck_assert_int_eq(n, 1);
    assert_row_near(&got[0], &rows[0]);
    free(got);
    /* resuming without a log: the header is written */
    char fresh[128];
    path_in(fresh, sizeof fresh, "fresh.csv");
    ck_assert_int_eq(clg_metrics_csv_open(&err, fresh, 1, &f), CLG_OK);
    fclose(f);
    ck_assert_int_eq(count_lines_starting(fresh, "epoch,step,"), 1);
    ck_assert_int_eq(clg_metrics_csv_read(&err, fresh, &got, &n), CLG_OK);
    ck_assert_int_eq(n, 0);
    free(got);
    unlink(fresh);
    unlink(path);
    rmdir(tmpdir);
}
END_TEST

START_TEST(test_csv_errors)
{
    make_tmpdir();
    clg_err err = {0};
    char path[128];
    path_in(path, sizeof path, "absent.csv");
    clg_metrics_row *rows = (clg_metrics_row *)0x1;
    int n = -1;
    ck_assert_int_eq(clg_metrics_csv_read(&err, path, &rows, &n), CLG_ERR_IO);
    ck_assert_ptr_null(rows);
    ck_assert_int_eq(n, 0);
    ck_assert_msg(strstr(err.msg, path) != NULL, "message '%s' lacks the path", err.msg);
    ck_assert_int_eq(clg_metrics_plot(&err, path, "t"), CLG_ERR_IO);
    ck_assert_msg(strstr(err.msg, path) != NULL, "message '%s' lacks the path", err.msg);
    path_in(path, sizeof path, "no/such/dir/run.csv");
    FILE *f = (FILE *)0x1;
    ck_assert_int_eq(clg_metrics_csv_open(&err, path, 0, &f), CLG_ERR_IO);
    ck_assert_ptr_null(f);
    ck_assert_msg(strstr(err.msg, path) != NULL, "message '%s' lacks the path", err.msg);
    rmdir(tmpdir);
}
END_TEST

/* Checks that every tag is closed in order and attribute quotes pair up. */
static void assert_well_formed(const char *svg)
{
    ck_assert_msg(strncmp(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"", 39) == 0, "starts with %.40s", svg);
    const char *stack[8];
    int depth = 0;
    const char *p = svg;
    while ((p = strchr(p, '<')) != NULL) {
        const char *q = strchr(p, '>');
        ck_assert_ptr_nonnull(q);
        int quotes = 0;
        for (const char *c = p; c < q; c++) {
            quotes += *c == '"';
            ck_assert_msg(c == p || *c != '<', "'<' inside a tag at %.40s", p);
        }
        ck_assert_msg(quotes % 2 == 0, "unpaired quote in %.*s", (int)(q - p + 1), p);
        if (p[1] == '/') {
            ck_assert_msg(depth > 0, "closing tag without an open one at %.40s", p);
            depth--;
            ck_assert_msg(strncmp(stack[depth] + 1, p + 2, strcspn(p + 2, ">")) == 0, "%.20s closes %.20s", p,
                          stack[depth]);
        } else if (q[-1] != '/') {
            ck_assert_int_lt(depth, 8);
            stack[depth++] = p;
        }
        /* text between tags holds no raw '&' except as an entity */
        const char *next = strchr(q, '<');
        for (const char *c = q + 1; next && c < next; c++)
            if (*c == '&')
                ck_assert_msg(strncmp(c, "&amp;", 5) == 0 || strncmp(c, "&lt;", 4) == 0 || strncmp(c, "&gt;", 4) == 0,
                              "raw '&' in text at %.20s", c);
        p = q + 1;
    }
    ck_assert_int_eq(depth, 0);
    ck_assert_str_eq(svg + strlen(svg) - 7, "</svg>\n");
}

static int count(const char *s, const char *w)
{
    int k = 0;
    for (const char *p = s; (p = strstr(p, w)) != NULL; p += strlen(w))
        k++;
    return k;
}

/* The k-th polyline's points: each inside the frame of the panel at x0, x
 * rising with the epoch, y falling as the value rises (SVG's y points down). */
static void assert_series(const char *svg, int k, double x0, const double *v, int n)
{
    const char *p = svg;
    for (int i = 0; i <= k; i++) {
        p = strstr(p, "<polyline");
        ck_assert_ptr_nonnull(p);
        p++;
    }
    p = strstr(p, "points=\"") + 8;
    double x[64], y[64];
    ck_assert_int_le(n, 64);
    for (int i = 0; i < n; i++) {
        int used = 0;
        ck_assert_msg(sscanf(p, "%lf,%lf %n", &x[i], &y[i], &used) == 2, "point %d of series %d", i, k);
        p += used;
    }
    ck_assert_msg(*p == '"', "series %d has more than %d points", k, n);
    for (int i = 0; i < n; i++) {
        ck_assert_msg(x[i] >= x0 - 0.05 && x[i] <= x0 + 360.05, "x %g outside the panel", x[i]);
        ck_assert_msg(y[i] >= 40 - 0.05 && y[i] <= 300.05, "y %g outside the panel", y[i]);
        if (i > 0)
            ck_assert_double_gt(x[i], x[i - 1]);
        for (int j = 0; j < i; j++)
            if (fabs(v[i] - v[j]) > 0.06) /* apart by more than the printed precision */
                ck_assert_msg((v[i] > v[j]) == (y[i] < y[j]), "series %d: values %g, %g at y %g, %g", k, v[j], v[i],
                              y[j], y[i]);
    }
}

START_TEST(test_svg)
{
    clg_rng g;
    tu_rng(&g, 2);
    enum { N = 17 };
    clg_metrics_row rows[N];
    for (int without_test = 0; without_test <= 1; without_test++) {
        random_rows(rows, N, without_test, &g);
        clg_err err = {0};
        char *svg = NULL;
        size_t len = 0;
        ck_assert_int_eq(clg_metrics_svg(&err, rows, N, "models/a&b<c>.cfg", &svg, &len), CLG_OK);
        ck_assert_uint_eq(len, strlen(svg));
        assert_well_formed(svg);
        ck_assert_msg(strstr(svg, "loss per epoch (models/a&amp;b&lt;c&gt;.cfg)") != NULL, "title");
        int series = without_test ? 2 : 4;
        ck_assert_int_eq(count(svg, "<polyline"), series);
        ck_assert_int_eq(count(svg, "<circle"), series * N);
        double v[4][N];
        for (int i = 0; i < N; i++) {
            v[0][i] = rows[i].train_loss;
            v[1][i] = rows[i].test_loss;
            v[2][i] = rows[i].train_acc;
            v[3][i] = rows[i].test_acc;
        }
        /* loss panel at x 60 (train, test), accuracy panel at x 480 (train, test) */
        if (without_test) {
            assert_series(svg, 0, 60, v[0], N);
            assert_series(svg, 1, 480, v[2], N);
        } else {
            for (int k = 0; k < 4; k++)
                assert_series(svg, k, k < 2 ? 60 : 480, v[k], N);
        }
        free(svg);
    }
}
END_TEST

START_TEST(test_plot_file)
{
    make_tmpdir();
    clg_rng g;
    tu_rng(&g, 3);
    clg_metrics_row rows[3];
    random_rows(rows, 3, 0, &g);
    clg_err err = {0};
    const char *names[] = {"run.csv", "log"}, *svgs[] = {"run.svg", "log.svg"};
    for (int k = 0; k < 2; k++) {
        char csv[128], svg[128];
        path_in(csv, sizeof csv, names[k]);
        path_in(svg, sizeof svg, svgs[k]);
        FILE *f = NULL;
        ck_assert_int_eq(clg_metrics_csv_open(&err, csv, 0, &f), CLG_OK);
        for (int i = 0; i < 3; i++)
            clg_metrics_csv_write(f, &rows[i]);
        fclose(f);
        ck_assert_int_eq(clg_metrics_plot(&err, csv, "lenet5"), CLG_OK);
        char *text = NULL;
        size_t len = 0;
        ck_assert_int_eq(clg_file_read_text(&err, svg, &text, &len), CLG_OK);
        assert_well_formed(text);
        ck_assert_int_eq(count(text, "<circle"), 4 * 3);
        ck_assert_msg(strstr(text, "accuracy % per epoch (lenet5)") != NULL, "title");
        free(text);
        unlink(svg);
        unlink(csv);
    }
    rmdir(tmpdir);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_csv_roundtrip, test_csv_errors, test_svg, test_plot_file};
    return tu_run_tests("metrics", 60, tests, (int)(sizeof tests / sizeof *tests));
}
