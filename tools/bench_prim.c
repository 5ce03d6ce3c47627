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

typedef struct prim_opts {
    cli_common c;
    long rounds;
    int quick;
} prim_opts;

static const cli_opt opts[] = {
    CLI_INT_OPT("--rounds", prim_opts, rounds, 2, 1000, "N", "samples per path and case (default 41)"),
    CLI_FLAG_OPT("--quick", prim_opts, quick, 1, "small shapes only, 3 rounds unless --rounds (the test suite's smoke run)"),
    CLI_OPT_GEMM_BACKEND,
    CLI_LIST_OPT("--devices", cli_common, devices, "SEL", "device selector (default 0: the first device)"),
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

typedef struct gcase {
    const char *label;
    int M, N, K, ta, tb;
} gcase;

typedef struct ccase {
    const char *label;
    int N, C, H, W, K, R, pad;
} ccase;

/* The GEMM cases (the first two with --quick). */
static int run_gemms(clg_ctx *ctx, clg_bench_prim *b, int quick, int rounds, int json)
{
    static const gcase gcases[] = {
        {"64x64x64", 64, 64, 64, 0, 0},
        {"256x256x256", 256, 256, 256, 0, 0},
        {"512x512x512 (tb)", 512, 512, 512, 0, 1},
        {"1024x1024x1024", 1024, 1024, 1024, 0, 0},
        {"fc 128x256x3136 (tb)", 128, 256, 3136, 0, 1},
        {"conv 32x6272x288 (ta)", 32, 6272, 288, 1, 0},
    };
    int ng = quick ? 2 : (int)(sizeof gcases / sizeof gcases[0]);
    for (int i = 0; i < ng; i++) {
        const gcase *g = &gcases[i];
        clg_bench_prim_result r;
        if (clg_bench_prim_gemm(b, g->M, g->N, g->K, g->ta, g->tb, rounds, &r) != CLG_OK) {
            fprintf(stderr, "clgrad: bench prim: %s\n", clg_last_error(ctx));
            return cli_fail("bench prim: gemm %s failed", g->label);
        }
        report(json, "gemm", g->label, "-", 2e-9 * g->M * g->N * g->K, r.internal_ms, r.public_ms, r.ratio);
    }
    return CLI_OK;
}

/* The convolution cases, three passes each (one tiny case with --quick). */
static int run_convs(clg_ctx *ctx, clg_bench_prim *b, int quick, int rounds, int json)
{
    /* the 3x3 layers of models/vgg-s at batch 32, and LeNet-5's first 5x5 */
    static const ccase ccases[] = {
        {"vgg-s c1 1->32 28x28", 32, 1, 28, 28, 32, 3, 1},  {"vgg-s c2 32->32 28x28", 32, 32, 28, 28, 32, 3, 1},
        {"vgg-s c3 32->64 14x14", 32, 32, 14, 14, 64, 3, 1}, {"vgg-s c4 64->64 14x14", 32, 64, 14, 14, 64, 3, 1},
        {"lenet c1 1->6 28x28 5x5", 32, 1, 28, 28, 6, 5, 2},
    };
    static const ccase quick_case = {"tiny 8->8 10x10", 2, 8, 10, 10, 8, 3, 1};
    static const char *pass_names[3] = {"fwd", "bwd-data", "bwd-filter"};
    int nc = quick ? 1 : (int)(sizeof ccases / sizeof ccases[0]);
    for (int i = 0; i < nc; i++) {
        const ccase *c = quick ? &quick_case : &ccases[i];
        clg_bench_conv_shape s = {.n = c->N, .c = c->C, .h = c->H, .w = c->W, .k = c->K, .r = c->R, .s = c->R,
                                  .pad_h = c->pad, .pad_w = c->pad, .stride_h = 1, .stride_w = 1, .dil_h = 1,
                                  .dil_w = 1, .groups = 1};
        int P = c->H + 2 * c->pad - c->R + 1, Q = c->W + 2 * c->pad - c->R + 1;
        double gflop = 2e-9 * (double)c->N * c->K * P * Q * c->C * c->R * c->R;
        for (int p = 0; p < 3; p++) {
            clg_bench_prim_result r;
            if (clg_bench_prim_conv(b, &s, p, rounds, &r) != CLG_OK) {
                fprintf(stderr, "clgrad: bench prim: %s\n", clg_last_error(ctx));
                return cli_fail("bench prim: conv %s %s failed", c->label, pass_names[p]);
            }
            char pass[40];
            snprintf(pass, sizeof pass, "%s:%s", pass_names[p], clg_prim_conv_algo_name((clg_prim_conv_algo)r.algo));
            report(json, "conv", c->label, pass, gflop, r.internal_ms, r.public_ms, r.ratio);
        }
    }
    return CLI_OK;
}

int bench_prim(int argc, char **argv)
{
    prim_opts o = {.c.gemm_backend = "own"};
    CLI_PARSE(&cli_spec_bench_prim, argc, argv, &o);
    int rounds = (int)(o.rounds ? o.rounds : o.quick ? 3 : 41);
    int json = o.c.json, quick = o.quick;
    const char *backend = o.c.gemm_backend;
    int rc = CLI_OK;
    clg_ctx *ctx = cli_ctx_open(o.c.devices ? o.c.devices : "0", 0, &rc);
    if (!ctx)
        return rc;
    clg_bench_prim *b = NULL;
    if (clg_bench_prim_create(ctx, backend, &b) != CLG_OK) {
        rc = cli_fail("bench prim: %s", clg_last_error(ctx));
        clg_ctx_destroy(ctx);
        return rc;
    }
    if (!json) {
        clg_device_info info;
        memset(&info, 0, sizeof info);
        clg_device_info_get(ctx, 0, &info);
        printf("device %s; gemm backend %s; %d rounds, medians (ms per call)\n", info.name, backend, rounds);
        printf("%-5s %-24s %-26s %10s %10s %8s %9s\n", "op", "shape", "pass", "internal", "public", "pub/int",
               "GFLOP/s");
    }
    rc = run_gemms(ctx, b, quick, rounds, json);
    if (rc == CLI_OK)
        rc = run_convs(ctx, b, quick, rounds, json);
    for (int k = 0; k < 2 && rc == CLI_OK; k++) {
        double gm = g_count[k] ? exp(g_logsum[k] / g_count[k]) : NAN;
        if (json)
            printf("{\"op\": \"%s\", \"summary\": \"geomean\", \"cases\": %d, \"ratio\": %.4f}\n", k ? "conv" : "gemm",
                   g_count[k], gm);
        else
            printf("%-5s geometric mean of public/internal over %d cases: %.3f\n", k ? "conv" : "gemm", g_count[k], gm);
    }
    clg_bench_prim_destroy(b);
    clg_ctx_destroy(ctx);
    return rc;
}
