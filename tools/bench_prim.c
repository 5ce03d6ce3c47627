/* clgrad bench prim: the public primitives (clgrad_prim.h) against the
 * internal launchers they wrap, on the same device queue and buffers: GEMM
 * (what `clgrad bench gemm` runs through clg_gemm) and convolution forward,
 * backward-data and backward-filter with the automatic algorithm (what
 * `clgrad bench conv --algo auto` runs). Each sample is wall clock around a
 * finished queue; the two paths alternate within every round (the order
 * flips each round) so a change in machine load hits both; medians. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"
#include "clgrad_prim.h"
#include "device/device.h"
#include "ops/conv.h"
#include "ops/gemm.h"

typedef struct prim_opts {
    cli_common c;
    long rounds;
    int quick;
} prim_opts;

static const cli_opt opts[] = {
    CLI_INT_OPT("--rounds", prim_opts, rounds, 2, 1000, "N", "samples per path and case (default 41)"),
    CLI_FLAG_OPT("--quick", prim_opts, quick, 1, "small shapes only, 3 rounds unless --rounds (the test suite's smoke run)"),
    CLI_OPT_GEMM_BACKEND,
    CLI_STRING_OPT("--devices", cli_common, devices, "SEL", "device selector (default 0: the first device)"),
    CLI_OPT_JSON,
    CLI_END,
};

const cli_spec cli_spec_bench_prim = {
    .name = "bench prim",
    .synopsis = "[--rounds N] [--quick] [--gemm-backend B] [--devices SEL] [--json]",
    .about = "Times each case through the public primitives API and through the internal launcher\n"
             "on the same queue and buffers, alternating (the order flips every round), and prints\n"
             "the medians of both and the median over the rounds of public/internal (a round's two\n"
             "samples run back to back). A sample repeats the call until it spans >= 5 ms.",
    .opts = opts,
};

/* A sample repeats a call until it spans this long. */
#define SAMPLE_MS 5.0

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct gcase {
    const char *label;
    int M, N, K, ta, tb;
} gcase;

typedef struct ccase {
    const char *label;
    int N, C, H, W, K, R, pad;
} ccase;

typedef struct bench {
    clg_device *dev;
    clg_prim *h;
    /* GEMM */
    const gcase *g;
    cl_mem A, B, C;
    /* conv */
    clg_conv_shape s;
    clg_prim_conv_desc d;
    int pass;
    clg_conv_cache cache;
    cl_mem x, w, y, dy, dx, dw, db;
} bench;

/* One call of a path (0 internal, 1 public), not waited for. */
static clg_status run_once(bench *b, int conv, int pub)
{
    if (!conv) {
        const gcase *g = b->g;
        int lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
        if (pub)
            return clg_prim_sgemm(b->h, g->ta ? CLG_PRIM_TRANS : CLG_PRIM_NO_TRANS,
                                  g->tb ? CLG_PRIM_TRANS : CLG_PRIM_NO_TRANS, (size_t)g->M, (size_t)g->N, (size_t)g->K,
                                  1.0f, b->A, 0, (size_t)lda, b->B, 0, (size_t)ldb, 0.0f, b->C, 0, (size_t)g->N, NULL, 0,
                                  NULL, NULL);
        clg_gemm_args a;
        clg_gemm_args_init(&a);
        a.ta = g->ta, a.tb = g->tb, a.M = g->M, a.N = g->N, a.K = g->K;
        a.A = b->A, a.lda = lda, a.B = b->B, a.ldb = ldb, a.C = b->C, a.ldc = g->N;
        return clg_gemm(b->dev, &a, NULL);
    }
    if (pub) {
        if (b->pass == 0)
            return clg_prim_conv_forward(b->h, &b->d, b->x, 0, b->w, 0, NULL, 0, 0, b->y, 0, 0, NULL, NULL);
        if (b->pass == 1)
            return clg_prim_conv_backward_data(b->h, &b->d, b->dy, 0, b->w, 0, b->dx, 0, 0, NULL, NULL);
        return clg_prim_conv_backward_filter(b->h, &b->d, b->x, 0, b->dy, 0, 0.0f, b->dw, 0, b->db, 0, 0, NULL, NULL);
    }
    clg_status st;
    if (b->pass == 0)
        st = clg_conv_forward(b->dev, &b->s, CLG_CONV_AUTO, &b->cache, b->x, 0, b->w, 0, NULL, 0, 0, b->y, 0);
    else if (b->pass == 1)
        st = clg_conv_backward_data(b->dev, &b->s, CLG_CONV_AUTO, &b->cache, b->dy, 0, b->w, 0, b->dx, 0);
    else
        st = clg_conv_backward_filter(b->dev, &b->s, CLG_CONV_AUTO, b->x, 0, b->dy, 0, 0.0f, b->dw, 0, b->db, 0);
    b->cache.weights_version++; /* as `bench conv`: transforms rebuilt every call (the public path keeps none) */
    return st;
}

/* ms per call over `inner` calls, the queue finished. */
static double sample(bench *b, int conv, int pub, int inner, clg_status *st)
{
    double t0 = clg_now_sec();
    for (int i = 0; i < inner && *st == CLG_OK; i++)
        *st = run_once(b, conv, pub);
    if (*st == CLG_OK && clFinish(b->dev->queue) != CL_SUCCESS)
        *st = CLG_ERR_OPENCL;
    return (clg_now_sec() - t0) * 1e3 / inner;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Medians of both paths and of the per-round ratio public / internal (the
 * two samples of a round run back to back, so they see the same machine
 * load); returns 0 on success. */
static int measure(bench *b, int conv, int rounds, double *ms_int, double *ms_pub, double *ratio, clg_ctx *ctx)
{
    clg_status st = CLG_OK;
    /* warm-up: kernel builds, automatic choices, pool sizes */
    sample(b, conv, 0, 1, &st);
    sample(b, conv, 1, 1, &st);
    double est = sample(b, conv, 0, 1, &st);
    int inner = est >= SAMPLE_MS ? 1 : (int)ceil(SAMPLE_MS / fmax(est, 0.01));
    if (inner > 2000)
        inner = 2000;
    double *t[2] = {malloc(sizeof(double) * (size_t)rounds), malloc(sizeof(double) * (size_t)rounds)};
    double *q = malloc(sizeof(double) * (size_t)rounds);
    for (int r = 0; r < rounds && st == CLG_OK; r++)
        for (int k = 0; k < 2; k++) {
            int pub = (r + k) % 2; /* flips the order every round */
            t[pub][r] = sample(b, conv, pub, inner, &st);
        }
    for (int r = 0; r < rounds && st == CLG_OK; r++)
        q[r] = t[1][r] / t[0][r];
    if (st != CLG_OK) {
        fprintf(stderr, "clgrad: bench prim: %s\n", b->h ? clg_prim_last_error(b->h) : clg_last_error(ctx));
        free(t[0]), free(t[1]), free(q);
        return -1;
    }
    *ms_int = median(t[0], rounds);
    *ms_pub = median(t[1], rounds);
    *ratio = median(q, rounds);
    free(t[0]), free(t[1]), free(q);
    return 0;
}

/* log(public / internal) summed per op kind, for the geometric means */
static double g_logsum[2];
static int g_count[2];

static void report(int json, const char *kind, const char *label, const char *pass, double gflop, double mi, double mp,
                   double ratio)
{
    int conv = strcmp(kind, "conv") == 0;
    g_logsum[conv] += log(ratio);
    g_count[conv]++;
    if (json)
        printf("{\"op\": \"%s\", \"shape\": \"%s\", \"pass\": \"%s\", \"internal_ms\": %.4f, \"public_ms\": %.4f, "
               "\"ratio\": %.4f, \"internal_gflops\": %.3f}\n",
               kind, label, pass, mi, mp, ratio, gflop / mi * 1e3);
    else
        printf("%-5s %-24s %-26s %10.3f %10.3f %8.3f %9.1f\n", kind, label, pass, mi, mp, ratio, gflop / mi * 1e3);
    fflush(stdout);
}

static cl_mem alloc_rand(clg_device *dev, size_t n, unsigned *seed)
{
    cl_mem m = NULL;
    if (clg_buf_alloc(dev, (n ? n : 1) * sizeof(float), &m) != CLG_OK)
        return NULL;
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (!h) {
        clg_buf_release(dev, m);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        h[i] = (float)(*seed >> 8) / 16777216.0f - 0.5f;
    }
    cl_int e = clEnqueueWriteBuffer(dev->queue, m, CL_TRUE, 0, n * sizeof(float), h, 0, NULL, NULL);
    free(h);
    if (e != CL_SUCCESS) {
        clg_buf_release(dev, m);
        return NULL;
    }
    return m;
}

int bench_prim(int argc, char **argv)
{
    prim_opts o = {.c.gemm_backend = "own"};
    CLI_PARSE(&cli_spec_bench_prim, argc, argv, &o);
    long rounds = o.rounds ? o.rounds : o.quick ? 3 : 41;
    int json = o.c.json, quick = o.quick;
    const char *devices = o.c.devices, *backend = o.c.gemm_backend;
    int gb = clg_gemm_backend_parse(o.c.gemm_backend);
    int rc = CLI_OK;
    clg_ctx *ctx = cli_ctx_open(devices ? devices : "0", 0, &rc);
    if (!ctx)
        return rc;
    clg_device *dev = &ctx->devs[0];
    bench b;
    memset(&b, 0, sizeof b);
    b.dev = dev;
    clg_prim_params pp;
    clg_prim_params_init(&pp);
    pp.gemm_backend = backend;
    if (clg_gemm_set_backend(ctx, (clg_gemm_backend)gb) != CLG_OK || clg_prim_create(dev->queue, &pp, &b.h) != CLG_OK) {
        rc = cli_fail("bench prim: %s", clg_last_error(NULL));
        clg_ctx_destroy(ctx);
        return rc;
    }
    if (!json) {
        printf("device %s; gemm backend %s; %ld rounds, medians (ms per call)\n", dev->info.name, backend, rounds);
        printf("%-5s %-24s %-26s %10s %10s %8s %9s\n", "op", "shape", "pass", "internal", "public", "pub/int",
               "GFLOP/s");
    }
    static const gcase gcases[] = {
        {"64x64x64", 64, 64, 64, 0, 0},
        {"256x256x256", 256, 256, 256, 0, 0},
        {"512x512x512 (tb)", 512, 512, 512, 0, 1},
        {"1024x1024x1024", 1024, 1024, 1024, 0, 0},
        {"fc 128x256x3136 (tb)", 128, 256, 3136, 0, 1},
        {"conv 32x6272x288 (ta)", 32, 6272, 288, 1, 0},
    };
    unsigned seed = 7;
    int ng = quick ? 2 : (int)(sizeof gcases / sizeof gcases[0]);
    for (int i = 0; i < ng && rc == CLI_OK; i++) {
        const gcase *g = &gcases[i];
        b.g = g;
        b.A = alloc_rand(dev, (size_t)g->M * g->K, &seed);
        b.B = alloc_rand(dev, (size_t)g->K * g->N, &seed);
        b.C = alloc_rand(dev, (size_t)g->M * g->N, &seed);
        double mi = 0, mp = 0, ratio = 0;
        if (!b.A || !b.B || !b.C || measure(&b, 0, (int)rounds, &mi, &mp, &ratio, ctx) != 0)
            rc = cli_fail("bench prim: gemm %s failed", g->label);
        else
            report(json, "gemm", g->label, "-", 2e-9 * g->M * g->N * g->K, mi, mp, ratio);
        clg_buf_release(dev, b.A), clg_buf_release(dev, b.B), clg_buf_release(dev, b.C);
    }
    /* the 3x3 layers of models/vgg-s at batch 32, and LeNet-5's first 5x5 */
    static const ccase ccases[] = {
        {"vgg-s c1 1->32 28x28", 32, 1, 28, 28, 32, 3, 1},  {"vgg-s c2 32->32 28x28", 32, 32, 28, 28, 32, 3, 1},
        {"vgg-s c3 32->64 14x14", 32, 32, 14, 14, 64, 3, 1}, {"vgg-s c4 64->64 14x14", 32, 64, 14, 14, 64, 3, 1},
        {"lenet c1 1->6 28x28 5x5", 32, 1, 28, 28, 6, 5, 2},
    };
    static const ccase quick_case = {"tiny 8->8 10x10", 2, 8, 10, 10, 8, 3, 1};
    static const char *pass_names[3] = {"fwd", "bwd-data", "bwd-filter"};
    int nc = quick ? 1 : (int)(sizeof ccases / sizeof ccases[0]);
    for (int i = 0; i < nc && rc == CLI_OK; i++) {
        const ccase *c = quick ? &quick_case : &ccases[i];
        b.s = (clg_conv_shape){c->N, c->C, c->H, c->W, c->K, c->R, c->R, c->pad, c->pad, 1, 1, 1, 1, 1};
        clg_prim_conv_desc_init(&b.d);
        b.d.n = c->N, b.d.c = c->C, b.d.h = c->H, b.d.w = c->W, b.d.k = c->K, b.d.r = b.d.s = c->R;
        b.d.pad_h = b.d.pad_w = c->pad;
        int P = clg_conv_out_h(&b.s), Q = clg_conv_out_w(&b.s);
        size_t nx = (size_t)c->N * c->C * c->H * c->W, nw = (size_t)c->K * c->C * c->R * c->R;
        size_t ny = (size_t)c->N * c->K * P * Q;
        b.x = alloc_rand(dev, nx, &seed), b.w = alloc_rand(dev, nw, &seed), b.y = alloc_rand(dev, ny, &seed);
        b.dy = alloc_rand(dev, ny, &seed), b.dx = alloc_rand(dev, nx, &seed), b.dw = alloc_rand(dev, nw, &seed);
        b.db = alloc_rand(dev, (size_t)c->K, &seed);
        double gflop = 2e-9 * (double)ny * c->C * c->R * c->R;
        for (int p = 0; p < 3 && rc == CLI_OK; p++) {
            b.pass = p;
            memset(&b.cache, 0, sizeof b.cache);
            double mi = 0, mp = 0, ratio = 0;
            if (!b.x || !b.w || !b.y || !b.dy || !b.dx || !b.dw || !b.db ||
                measure(&b, 1, (int)rounds, &mi, &mp, &ratio, ctx) != 0)
                rc = cli_fail("bench prim: conv %s %s failed", c->label, pass_names[p]);
            else {
                char label[64];
                clg_prim_conv_algo a = CLG_PRIM_CONV_AUTO;
                clg_prim_conv_algo_get(b.h, &b.d, (clg_prim_conv_pass)p, &a);
                snprintf(label, sizeof label, "%s", c->label);
                char pass[40];
                snprintf(pass, sizeof pass, "%s:%s", pass_names[p], clg_prim_conv_algo_name(a));
                report(json, "conv", label, pass, gflop, mi, mp, ratio);
            }
            clg_conv_cache_free(dev, &b.cache);
        }
        clg_buf_release(dev, b.x), clg_buf_release(dev, b.w), clg_buf_release(dev, b.y), clg_buf_release(dev, b.dy);
        clg_buf_release(dev, b.dx), clg_buf_release(dev, b.dw), clg_buf_release(dev, b.db);
    }
    for (int k = 0; k < 2 && rc == CLI_OK; k++) {
        double gm = g_count[k] ? exp(g_logsum[k] / g_count[k]) : NAN;
        if (json)
            printf("{\"op\": \"%s\", \"summary\": \"geomean\", \"cases\": %d, \"ratio\": %.4f}\n", k ? "conv" : "gemm",
                   g_count[k], gm);
        else
            printf("%-5s geometric mean of public/internal over %d cases: %.3f\n", k ? "conv" : "gemm", g_count[k], gm);
    }
    clg_prim_destroy(b.h);
    clg_ctx_destroy(ctx);
    return rc;
}
