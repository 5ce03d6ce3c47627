/* clgrad bench gemm: GFLOP/s per backend (own kernels, CLBlast, host
 * OpenBLAS) on the same shapes in the same run. Device backends are timed
 * with OpenCL events (first kernel start to last kernel end, packing
 * included), OpenBLAS with the wall clock; the backends run interleaved and
 * the median of --reps timed runs (each after a warm-up) is reported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "clg_config.h"
#include "ops/gemm.h"
#include "ops/tune_gemm.h"

#if CLG_HAVE_OPENBLAS
#include <cblas.h>
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clgrad bench gemm [--m M --n N --k K] [--ta] [--tb] [--batch B] [--shapes dl]\n"
            "                         [--backend own|clblast|openblas|all] [--devices SEL] [--reps R] [--json]\n"
            "  C = A*B (row-major, op() per --ta/--tb), single precision. Default shape 1024^3.\n"
            "  --shapes dl  the GEMMs of VGG-S and LeNet-5 at batch 128 (forward, data and\n"
            "               weight gradients; conv as im2col M=Kout N=B*P*Q K=C*R*S)\n"
            "  --backend    own (tuned/default kernels), clblast, openblas (host), all (default)\n"
            "  --reps R     timed runs per backend after one warm-up (median; default 5)\n"
            "  --json       one JSON object per line and backend\n");
}


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

#if CLG_HAVE_OPENBLAS
typedef struct host_op {
    float *A, *B, *C;
    size_t na, nb, nc;
} host_op;

static int host_init(host_op *h, const clg_gemm_shape *s)
{
    int batch = s->batch > 0 ? s->batch : 1;
    h->na = (size_t)s->M * s->K;
    h->nb = (size_t)s->K * s->N;
    h->nc = (size_t)s->M * s->N;
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
static double host_run(const host_op *h, const clg_gemm_shape *s)
{
    int batch = s->batch > 0 ? s->batch : 1;
    double t0 = clg_now_sec();
    for (int b = 0; b < batch; b++)
        cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, s->M, s->N,
                    s->K, 1.0f, h->A + b * h->na, s->ta ? s->M : s->K, h->B + b * h->nb, s->tb ? s->K : s->N, 0.0f,
                    h->C + b * h->nc, s->N);
    return (clg_now_sec() - t0) * 1e3;
}
#endif

static void report(int json, const char *dev, const clg_gemm_shape *s, const char *backend, double ms, const char *note)
{
    int batch = s->batch > 0 ? s->batch : 1;
    double gf = 2.0 * s->M * s->N * s->K * batch / (ms * 1e6);
    if (json) {
        printf("{\"backend\": \"%s\", \"device\": \"%s\", \"label\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
               "\"ta\": %d, \"tb\": %d, \"batch\": %d, \"ms\": %.4f, \"gflops\": %.2f%s%s%s}\n",
               backend, dev, s->label ? s->label : "", s->M, s->N, s->K, s->ta, s->tb, batch, ms, gf,
               note ? ", \"params\": \"" : "", note ? note : "", note ? "\"" : "");
    } else {
        printf("%-22s %-9s %6d %6d %6d %2d %2d %4d %10.3f %9.1f  %s\n", s->label ? s->label : "-", backend, s->M,
               s->N, s->K, s->ta, s->tb, batch, ms, gf, note ? note : "");
    }
    fflush(stdout);
}

int bench_gemm(int argc, char **argv)
{
    long M = 1024, N = 1024, K = 1024, batch = 1, reps = 5;
    int ta = 0, tb = 0, json = 0, dl = 0;
    const char *backend = "all", *devices = NULL, *shapes = NULL;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return CLI_OK;
        }
        if ((r = cli_opt_int(argc, argv, &i, "--m", 1, 1 << 20, &M)) != 0 ||
            (r = cli_opt_int(argc, argv, &i, "--n", 1, 1 << 24, &N)) != 0 ||
            (r = cli_opt_int(argc, argv, &i, "--k", 1, 1 << 24, &K)) != 0 ||
            (r = cli_opt_int(argc, argv, &i, "--batch", 1, 1 << 16, &batch)) != 0 ||
            (r = cli_opt_int(argc, argv, &i, "--reps", 1, 64, &reps)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--backend", &backend)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--devices", &devices)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--device", &devices)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--shapes", &shapes)) != 0) {
            if (r < 0)
                return CLI_USAGE;
        } else if (strcmp(argv[i], "--ta") == 0) {
            ta = 1;
        } else if (strcmp(argv[i], "--tb") == 0) {
            tb = 1;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else {
            return cli_usage_error("bench gemm", "unknown option '%s'", argv[i]);
        }
    }
    if (shapes) {
        if (strcmp(shapes, "dl") != 0)
            return cli_usage_error("bench gemm", "unknown shape preset '%s' (dl)", shapes);
        dl = 1;
    }
    int want_own = 0, want_cb = 0, want_ob = 0;
    if (strcmp(backend, "all") == 0)
        want_own = want_cb = want_ob = 1;
    else if (strcmp(backend, "own") == 0)
        want_own = 1;
    else if (strcmp(backend, "clblast") == 0)
        want_cb = 1;
    else if (strcmp(backend, "openblas") == 0)
        want_ob = 1;
    else
        return cli_usage_error("bench gemm", "unknown backend '%s' (own, clblast, openblas or all)", backend);
    if (want_cb && !clg_gemm_have_clblast()) {
        if (strcmp(backend, "clblast") == 0)
            return cli_fail("this clgrad was built without CLBlast");
        want_cb = 0;
    }
    if (want_ob && !CLG_HAVE_OPENBLAS) {
        if (strcmp(backend, "openblas") == 0)
            return cli_fail("this clgrad was built without OpenBLAS");
        want_ob = 0;
    }

    clg_gemm_shape list[64];
    int ns;
    if (dl) {
        ns = CLG_MIN(clg_gemm_dl_shapes(128, list, (int)CLG_ARRAY_LEN(list)), (int)CLG_ARRAY_LEN(list));
    } else {
        list[0] = (clg_gemm_shape){"-", (int)M, (int)N, (int)K, ta, tb, (int)batch};
        ns = 1;
    }

    clg_ctx *ctx = NULL;
    if (want_own || want_cb) {
        int orc = CLI_OK;
        ctx = cli_ctx_open(devices, 0, &orc);
        if (!ctx)
            return orc;
    }
    if (!json)
        printf("%-22s %-9s %6s %6s %6s %2s %2s %4s %10s %9s\n", "shape", "backend", "M", "N", "K", "ta", "tb", "bat",
               "ms", "GFLOP/s");
    /* The backends run interleaved (one timed run of each per round, device
     * runs after their own warm-up), so load changes on a shared machine
     * hit them alike; each reports the median over the rounds. */
    int rc = CLI_OK;
    double t_ob[64], t_own[64], t_cb[64];
    double r_ob[64], r_cb[64]; /* own's speed over each peer, per shape (first device) */
    int n_ob = 0, n_cb = 0;
    for (int s = 0; s < ns && rc == CLI_OK; s++) {
        const clg_gemm_shape *sh = &list[s];
        int ndev = ctx ? ctx->ndev : 0;
        int have_ob = 0;
#if CLG_HAVE_OPENBLAS
        host_op h;
        memset(&h, 0, sizeof h);
        if (want_ob) {
            have_ob = host_init(&h, sh);
            if (!have_ob)
                fprintf(stderr, "clgrad: no host memory for the OpenBLAS column\n");
            else
                host_run(&h, sh); /* warm-up */
        }
#endif
        for (int d = 0; d < CLG_MAX(ndev, 1) && rc == CLI_OK; d++) {
            clg_device *dev = ctx ? &ctx->devs[d] : NULL;
            int ob_now = have_ob && d == 0; /* the host column once per shape */
            clg_gemm_args a;
            clg_gemm_args_init(&a);
            a.M = sh->M;
            a.N = sh->N;
            a.K = sh->K;
            a.ta = sh->ta;
            a.tb = sh->tb;
            a.batch = sh->batch;
            /* own: what clg_gemm runs for the shape (tuned or default
             * parameters, or an unpacked kernel for small and long-thin
             * products) */
            char desc[160] = "";
            if (dev && want_own)
                clg_gemm_own_describe(dev, &a, desc, sizeof desc);
            int cb_ok = dev && want_cb;
            for (int r = 0; r < reps && rc == CLI_OK; r++) {
#if CLG_HAVE_OPENBLAS
                if (ob_now)
                    t_ob[r] = host_run(&h, sh);
#endif
                if (dev && want_own && clg_gemm_time(dev, &a, CLG_GEMM_OWN, NULL, 1, &t_own[r]) != CLG_OK)
                    rc = cli_fail("own gemm on device %d: %s", d, clg_last_error(ctx));
                if (rc == CLI_OK && cb_ok && clg_gemm_time(dev, &a, CLG_GEMM_CLBLAST, NULL, 1, &t_cb[r]) != CLG_OK) {
                    fprintf(stderr, "clgrad: clblast gemm on device %d: %s\n", d, clg_last_error(ctx));
                    cb_ok = 0;
                }
            }
            if (rc != CLI_OK)
                break;
            double m_ob = ob_now ? median(t_ob, (int)reps) : 0;
            double m_own = dev && want_own ? median(t_own, (int)reps) : 0;
            double m_cb = cb_ok ? median(t_cb, (int)reps) : 0;
            if (ob_now)
                report(json, "host", sh, "openblas", m_ob, NULL);
            if (m_own > 0)
                report(json, dev->info.name, sh, "own", m_own, desc);
            if (m_cb > 0)
                report(json, dev->info.name, sh, "clblast", m_cb, NULL);
            if (d == 0 && m_own > 0 && m_ob > 0 && n_ob < 64)
                r_ob[n_ob++] = m_ob / m_own;
            if (d == 0 && m_own > 0 && m_cb > 0 && n_cb < 64)
                r_cb[n_cb++] = m_cb / m_own;
            if (!json && m_own > 0 && (m_cb > 0 || m_ob > 0))
                printf("%-22s ratios: own/openblas %s%.2f  own/clblast %s%.2f (speed)\n", "", m_ob > 0 ? "" : "n/a ",
                       m_ob > 0 ? m_ob / m_own : 0.0, m_cb > 0 ? "" : "n/a ", m_cb > 0 ? m_cb / m_own : 0.0);
        }
#if CLG_HAVE_OPENBLAS
        host_free(&h);
#endif
        (void)have_ob;
    }
    if (!json && rc == CLI_OK && ns > 1) { /* the shape set in one line per peer */
        double *rs[2] = {r_ob, r_cb};
        int nr[2] = {n_ob, n_cb};
        static const char *const peer[2] = {"openblas", "clblast"};
        for (int q = 0; q < 2; q++) {
            if (nr[q] == 0)
                continue;
            double lo = rs[q][0], hi = rs[q][0];
            int at_least_1 = 0;
            for (int i = 0; i < nr[q]; i++) {
                lo = CLG_MIN(lo, rs[q][i]);
                hi = CLG_MAX(hi, rs[q][i]);
                at_least_1 += rs[q][i] >= 1.0;
            }
            printf("own/%s over %d shapes: median %.2f, min %.2f, max %.2f, %d at 1.0 or more\n", peer[q], nr[q],
                   median(rs[q], nr[q]), lo, hi, at_least_1);
        }
    }
    clg_ctx_destroy(ctx);
    return rc;
}
