/* clgrad bench gemm: GFLOP/s per backend (own kernels, CLBlast, host
 * OpenBLAS) on the same shapes in the same run. Device backends are timed
 * with OpenCL events (first kernel start to last kernel end, packing
 * included), OpenBLAS with the wall clock; the backends run interleaved and
 * the median of --reps timed runs (each after a warm-up) is reported.
 * OpenBLAS is loaded at run time (dlopen), so clgrad itself does not need
 * it: the column is left out where the library is absent (e.g. a GPU
 * bundle, tools/device-bundle.sh, which leaves its 36 MiB behind). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

/* cblas_sgemm with the CBLAS enums as ints (row major 101, no transpose
 * 111, transpose 112) and 32-bit indices (LP64 OpenBLAS) */
typedef void (*cblas_sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
                               const float *B, int ldb, float beta, float *C, int ldc);

/* OpenBLAS's cblas_sgemm, or NULL where no OpenBLAS is installed. */
static cblas_sgemm_fn openblas_sgemm(void)
{
    static const char *const names[] = {"libopenblas.so.0", "libopenblas.so", "libopenblas.dylib", NULL};
    static int tried;
    static cblas_sgemm_fn fn;
    if (tried)
        return fn;
    tried = 1;
    for (int i = 0; names[i] && !fn; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        void *sym = h ? dlsym(h, "cblas_sgemm") : NULL;
        if (sym)
            memcpy(&fn, &sym, sizeof fn); /* object to function pointer, as POSIX allows */
        else if (h)
            dlclose(h);
    }
    return fn;
}

#define MIN_(a, b) ((a) < (b) ? (a) : (b))
#define MAX_(a, b) ((a) > (b) ? (a) : (b))
#define NSHAPES 64 /* at most this many shapes per run */

static const char *const backends[] = {"own", "clblast", "openblas", "all", NULL};
static const char *const shape_sets[] = {"dl", NULL};

typedef struct gemm_opts {
    cli_common c;
    long m, n, k, reps;
    int ta, tb;
    const char *backend, *shapes;
} gemm_opts;

#define T gemm_opts
static const cli_opt opts[] = {
    CLI_INT_OPT("--m", T, m, 1, 1 << 20, "M", "rows of C (default 1024)"),
    CLI_INT_OPT("--n", T, n, 1, 1 << 24, "N", "columns of C (default 1024)"),
    CLI_INT_OPT("--k", T, k, 1, 1 << 24, "K", "inner dimension (default 1024)"),
    CLI_FLAG_OPT("--ta", T, ta, 1, "A transposed"),
    CLI_FLAG_OPT("--tb", T, tb, 1, "B transposed"),
    CLI_INT_OPT("--batch", cli_common, batch, 1, CLI_BATCH_MAX, "N", "products per batched call (default 1)"),
    CLI_CHOICE_OPT("--shapes", T, shapes, shape_sets, "SET",
                   "dl: the GEMMs of VGG-S and LeNet-5 at batch 128 (forward, data and\n"
                   "weight gradients; conv as im2col M=Kout N=B*P*Q K=C*R*S)"),
    CLI_CHOICE_OPT("--backend", T, backend, backends, "B",
                   "own (tuned/default kernels), clblast, openblas (host), all (default)"),
    {.name = "--devices", .alias = "--device", .kind = CLI_LIST, CLI_FIELD_(cli_common, devices), .arg = "SEL",
     .help = "device selector: all (default), gpu, cpu, accelerator, 0,2 or name:TEXT"},
    CLI_INT_OPT("--reps", T, reps, 1, 64, "R", "timed runs per backend after one warm-up (median; default 5)"),
    CLI_FLAG_OPT("--json", cli_common, json, 1, "one JSON object per line and backend"),
    CLI_END,
};
#undef T

const cli_spec cli_spec_bench_gemm = {
    .name = "bench gemm",
    .synopsis = "[--m M --n N --k K] [--ta] [--tb] [--batch N] [--shapes dl]\n"
                "       [--backend own|clblast|openblas|all] [--devices SEL] [--reps R] [--json]",
    .about = "C = A*B (row-major, op() per --ta/--tb), single precision, default shape 1024^3:\n"
             "GFLOP/s per backend (own kernels, CLBlast, host OpenBLAS) on the same shapes in\n"
             "the same run. The backends run interleaved; the median of --reps timed runs (each\n"
             "after a warm-up) is reported.",
    .opts = opts,
};

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof t[0], cmp_d);
    return t[n / 2];
}

typedef struct host_op {
    float *A, *B, *C;
    size_t na, nb, nc;
} host_op;

static int host_init(host_op *h, const clg_bench_gemm_shape *s)
{
    int batch = s->batch > 0 ? s->batch : 1;
    h->na = (size_t)s->m * s->k;
    h->nb = (size_t)s->k * s->n;
    h->nc = (size_t)s->m * s->n;
    h->A = malloc(sizeof(float) * h->na * batch);
    h->B = malloc(sizeof(float) * h->nb * batch);
    h->C = malloc(sizeof(float) * h->nc * batch);
    if (!h->A || !h->B || !h->C)
        return 0;
    for (size_t i = 0; i < h->na * batch; i++)
        h->A[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < h->nb * batch; i++)
        h->B[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    return 1;
}

static void host_free(host_op *h)
{
    free(h->A);
    free(h->B);
    free(h->C);
    memset(h, 0, sizeof *h);
}

/* One product (all batch entries) with OpenBLAS; wall-clock ms. */
static double host_run(const host_op *h, const clg_bench_gemm_shape *s)
{
    int batch = s->batch > 0 ? s->batch : 1;
    cblas_sgemm_fn sgemm = openblas_sgemm();
    double t0 = cli_now();
    for (int b = 0; b < batch; b++)
        sgemm(101, s->ta ? 112 : 111, s->tb ? 112 : 111, s->m, s->n, s->k, 1.0f, h->A + b * h->na, s->ta ? s->m : s->k,
              h->B + b * h->nb, s->tb ? s->k : s->n, 0.0f, h->C + b * h->nc, s->n);
    return (cli_now() - t0) * 1e3;
}

static void report(int json, const char *dev, const clg_bench_gemm_shape *s, const char *backend, double ms, const char *note)
{
    int batch = s->batch > 0 ? s->batch : 1;
    double gf = 2.0 * s->m * s->n * s->k * batch / (ms * 1e6);
    if (json) {
        printf("{\"backend\": \"%s\", \"device\": \"%s\", \"label\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
               "\"ta\": %d, \"tb\": %d, \"batch\": %d, \"ms\": %.4f, \"gflops\": %.2f%s%s%s}\n",
               backend, dev, s->label ? s->label : "", s->m, s->n, s->k, s->ta, s->tb, batch, ms, gf,
               note ? ", \"params\": \"" : "", note ? note : "", note ? "\"" : "");
    } else {
        printf("%-22s %-9s %6d %6d %6d %2d %2d %4d %10.3f %9.1f  %s\n", s->label ? s->label : "-", backend, s->m,
               s->n, s->k, s->ta, s->tb, batch, ms, gf, note ? note : "");
    }
    fflush(stdout);
}

/* What one run times: the backends wanted and available, the ratios of own
 * over each peer per shape (first device) for the summary. */
typedef struct gemm_run {
    int json, reps, want_own, want_cb, want_ob;
    clg_ctx *ctx;
    double r_ob[64], r_cb[64];
    int n_ob, n_cb;
} gemm_run;

/* Backends from --backend; CLI_OK or an exit code when the one asked for is absent. */
static int pick_backends(const char *backend, gemm_run *g)
{
    int all = strcmp(backend, "all") == 0;
    g->want_own = all || strcmp(backend, "own") == 0;
    g->want_cb = all || strcmp(backend, "clblast") == 0;
    g->want_ob = all || strcmp(backend, "openblas") == 0;
    if (g->want_cb && !clg_have_clblast()) {
        if (!all)
            return cli_fail("this clgrad was built without CLBlast");
        g->want_cb = 0;
    }
    if (g->want_ob && !openblas_sgemm()) {
        if (!all)
            return cli_fail("OpenBLAS (libopenblas.so.0) is not installed: no host column");
        g->want_ob = 0;
    }
    return CLI_OK;
}

/* Times shape sh on device d (NULL: host only), the host column when
 * host is set; prints the rows. CLI_OK or CLI_FAIL. */
static int time_on_device(gemm_run *g, int d, const clg_bench_gemm_shape *sh, void *host)
{
    int dev = g->ctx != NULL;
    clg_device_info info = {0};
    if (dev)
        clg_device_info_get(g->ctx, d, &info);
    /* own: what clg_gemm runs for the shape (tuned or default parameters, or
     * an unpacked kernel for small and long-thin products) */
    char desc[160] = "";
    if (dev && g->want_own)
        clg_bench_gemm_describe(g->ctx, d, sh, desc, sizeof desc);
    int cb_ok = dev && g->want_cb;
    double t_ob[64], t_own[64], t_cb[64];
    for (int r = 0; r < g->reps; r++) {
        if (host)
            t_ob[r] = host_run(host, sh);
        if (dev && g->want_own && clg_bench_gemm_time(g->ctx, d, sh, "own", 1, &t_own[r]) != CLG_OK)
            return cli_fail("own gemm on device %d: %s", d, clg_last_error(g->ctx));
        if (cb_ok && clg_bench_gemm_time(g->ctx, d, sh, "clblast", 1, &t_cb[r]) != CLG_OK) {
            fprintf(stderr, "clgrad: clblast gemm on device %d: %s\n", d, clg_last_error(g->ctx));
            cb_ok = 0;
        }
    }
    double m_ob = host ? median(t_ob, g->reps) : 0;
    double m_own = dev && g->want_own ? median(t_own, g->reps) : 0;
    double m_cb = cb_ok ? median(t_cb, g->reps) : 0;
    if (host)
        report(g->json, "host", sh, "openblas", m_ob, NULL);
    if (m_own > 0)
        report(g->json, info.name, sh, "own", m_own, desc);
    if (m_cb > 0)
        report(g->json, info.name, sh, "clblast", m_cb, NULL);
    if (d == 0 && m_own > 0 && m_ob > 0 && g->n_ob < 64)
        g->r_ob[g->n_ob++] = m_ob / m_own;
    if (d == 0 && m_own > 0 && m_cb > 0 && g->n_cb < 64)
        g->r_cb[g->n_cb++] = m_cb / m_own;
    if (!g->json && m_own > 0 && (m_cb > 0 || m_ob > 0))
        printf("%-22s ratios: own/openblas %s%.2f  own/clblast %s%.2f (speed)\n", "", m_ob > 0 ? "" : "n/a ",
               m_ob > 0 ? m_ob / m_own : 0.0, m_cb > 0 ? "" : "n/a ", m_cb > 0 ? m_cb / m_own : 0.0);
    return CLI_OK;
}

/* One shape on every device (the host column once, with the first). */
static int time_shape(gemm_run *g, const clg_bench_gemm_shape *sh)
{
    int ndev = g->ctx ? clg_device_count(g->ctx) : 0;
    void *host = NULL;
    int rc = CLI_OK;
    host_op h;
    memset(&h, 0, sizeof h);
    if (g->want_ob) {
        if (!host_init(&h, sh)) {
            fprintf(stderr, "clgrad: no host memory for the OpenBLAS column\n");
        } else {
            host_run(&h, sh); /* warm-up */
            host = &h;
        }
    }
    for (int d = 0; d < MAX_(ndev, 1) && rc == CLI_OK; d++)
        rc = time_on_device(g, d, sh, d == 0 ? host : NULL);
    host_free(&h);
    return rc;
}

/* The shape set in one line per peer. */
static void print_summary(gemm_run *g)
{
    double *rs[2] = {g->r_ob, g->r_cb};
    int nr[2] = {g->n_ob, g->n_cb};
    static const char *const peer[2] = {"openblas", "clblast"};
    for (int q = 0; q < 2; q++) {
        if (nr[q] == 0)
            continue;
        double lo = rs[q][0], hi = rs[q][0];
        int at_least_1 = 0;
        for (int i = 0; i < nr[q]; i++) {
            lo = MIN_(lo, rs[q][i]);
            hi = MAX_(hi, rs[q][i]);
            at_least_1 += rs[q][i] >= 1.0;
        }
        printf("own/%s over %d shapes: median %.2f, min %.2f, max %.2f, %d at 1.0 or more\n", peer[q], nr[q],
               median(rs[q], nr[q]), lo, hi, at_least_1);
    }
}

int bench_gemm(int argc, char **argv)
{
    gemm_opts o = {.m = 1024, .n = 1024, .k = 1024, .reps = 5, .backend = "all", .c.batch = 1};
    CLI_PARSE(&cli_spec_bench_gemm, argc, argv, &o);
    gemm_run g = {.json = o.c.json, .reps = (int)o.reps};
    int rc = pick_backends(o.backend, &g);
    if (rc != CLI_OK)
        return rc;
    clg_bench_gemm_shape list[NSHAPES];
    int ns = 1;
    if (o.shapes)
        ns = MIN_(clg_bench_gemm_dl_shapes(128, list, NSHAPES), NSHAPES);
    else
        list[0] = (clg_bench_gemm_shape){"-", (int)o.m, (int)o.n, (int)o.k, o.ta, o.tb, o.c.batch};
    if (g.want_own || g.want_cb) {
        g.ctx = cli_ctx_open(o.c.devices, 0, &rc);
        if (!g.ctx)
            return rc;
    }
    if (!g.json)
        printf("%-22s %-9s %6s %6s %6s %2s %2s %4s %10s %9s\n", "shape", "backend", "M", "N", "K", "ta", "tb", "bat",
               "ms", "GFLOP/s");
    /* The backends run interleaved (one timed run of each per round, device
     * runs after their own warm-up), so load changes on a shared machine
     * hit them alike; each reports the median over the rounds. */
    for (int s = 0; s < ns && rc == CLI_OK; s++)
        rc = time_shape(&g, &list[s]);
    if (!g.json && rc == CLI_OK && ns > 1)
        print_summary(&g);
    clg_ctx_destroy(g.ctx);
    return rc;
}
