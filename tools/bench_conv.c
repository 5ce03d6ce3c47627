/* clgrad bench conv: time each convolution algorithm and pass.
 * GFLOP/s counts direct-convolution FLOPs (2*N*K*P*Q*C/groups*R*S) for every
 * algorithm and pass, so numbers compare across algorithms. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

static const char *const passes[] = {"fwd", "bwd-data", "bwd-filter", "all", NULL};
static const char *const shape_sets[] = {"vgg-s", NULL};

typedef struct conv_opts {
    cli_common c;
    long n, ch, h, w, k, r, s, pad, stride, dil, groups, reps;
    int check;
    const char *shapes, *pass, *algo;
} conv_opts;

#define T conv_opts
#define DIM(nm, f, hi, hlp) CLI_INT_OPT(nm, T, f, 1, hi, "N", hlp)
static const cli_opt opts[] = {
    DIM("--n", n, 1 << 20, "batch (default 32; 128 for --shapes vgg-s)"),
    DIM("--c", ch, 1 << 20, "input channels (default 32)"),
    DIM("--h", h, 1 << 20, "input height (default 28)"),
    DIM("--w", w, 1 << 20, "input width (default 28)"),
    DIM("--k", k, 1 << 20, "output channels (default 32)"),
    DIM("--r", r, 1024, "filter height (default 3)"),
    DIM("--s", s, 1024, "filter width (default 3)"),
    CLI_INT_OPT("--pad", T, pad, 0, 1024, "N", "padding (default 1)"),
    DIM("--stride", stride, 1024, "stride (default 1)"),
    DIM("--dil", dil, 1024, "dilation (default 1)"),
    DIM("--groups", groups, 1 << 20, "groups (default 1)"),
    CLI_CHOICE_OPT("--shapes", T, shapes, shape_sets, "SET",
                   "vgg-s: the 3x3 conv layers of models/vgg-s (28x28x1 input, batch 128\n"
                   "unless --n)"),
    CLI_CHOICE_OPT("--pass", T, pass, passes, "P", "fwd, bwd-data, bwd-filter or all (default)"),
    CLI_STRING_OPT("--algo", T, algo, "A",
                   "winograd, winograd4, winograd-fused, winograd4-fused, im2col, direct,\n"
                   "fft, auto or all (default)"),
    DIM("--reps", reps, 1000, "timed runs after a warm-up (median; default 5)"),
    CLI_FLAG_OPT("--check", T, check, 1,
                 "also the error against a double-precision host reference:\n"
                 "max|got-ref| / max|ref| on N(0,1) inputs and filters"),
    CLI_OPT_DEVICES,
    CLI_OPT_JSON,
    CLI_END,
};
#undef DIM
#undef T

const cli_spec cli_spec_bench_conv = {
    .name = "bench conv",
    .synopsis = "[--n N --c C --h H --w W --k K --r R --s S --pad P --stride U --dil D --groups G]\n"
                "       [--shapes vgg-s] [--pass P] [--algo A] [--reps N] [--check] [--devices SEL] [--json]",
    .about = "Times each convolution algorithm and pass (median of --reps runs after a warm-up,\n"
             "wall clock around a finished queue) and prints ms and effective GFLOP/s\n"
             "(direct-convolution FLOPs: 2*N*K*P*Q*C/groups*R*S, so numbers compare across\n"
             "algorithms).",
    .opts = opts,
};

static const char *pass_names[3] = {"fwd", "bwd-data", "bwd-filter"};

/* One row: a pass of the shape with one algorithm. */
static void print_row(const char *label, const clg_bench_conv_shape *s, int pass, int a, const clg_bench_conv_result *r,
                      int check, int json)
{
    int P = (s->h + 2 * s->pad_h - s->dil_h * (s->r - 1) - 1) / s->stride_h + 1;
    int Q = (s->w + 2 * s->pad_w - s->dil_w * (s->s - 1) - 1) / s->stride_w + 1;
    double flops = 2.0 * s->n * s->k * P * Q * (double)(s->c / s->groups) * s->r * s->s;
    const char *name = clg_prim_conv_algo_name((clg_prim_conv_algo)a);
    const char *chosen = a == CLG_PRIM_CONV_AUTO ? clg_prim_conv_algo_name((clg_prim_conv_algo)r->chosen) : "";
    if (json) {
        printf("{\"shape\": \"%s\", \"n\": %d, \"c\": %d, \"h\": %d, \"w\": %d, \"k\": %d, \"r\": %d, \"s\": %d, "
               "\"pad\": %d, \"stride\": %d, \"algo\": \"%s\", \"pass\": \"%s\", \"ms\": %.4f, \"gflops\": %.3f",
               label, s->n, s->c, s->h, s->w, s->k, s->r, s->s, s->pad_h, s->stride_h, name, pass_names[pass], r->ms,
               flops / r->ms * 1e-6);
        if (a == CLG_PRIM_CONV_AUTO)
            printf(", \"chosen\": \"%s\"", chosen);
        if (check)
            printf(", \"rel_err\": %.3e", r->rel_err);
        printf("}\n");
    } else {
        printf("%-10s %-10s %-10s %10.3f ms %9.2f GFLOP/s", label, pass_names[pass], name, r->ms,
               flops / r->ms * 1e-6);
        if (a == CLG_PRIM_CONV_AUTO)
            printf("  (chose %s)", chosen);
        if (check)
            printf("  rel_err %.3e", r->rel_err);
        printf("\n");
    }
    fflush(stdout);
}

static int run_shape(clg_ctx *ctx, const char *label, const clg_bench_conv_shape *s, int pass_sel, int algo_sel,
                     int reps, int check, int json)
{
    if (clg_bench_conv_check(ctx, s) != CLG_OK)
        return cli_fail("%s", clg_last_error(ctx));
    int rc = CLI_OK;
    for (int pass = 0; pass < 3; pass++) {
        if (pass_sel >= 0 && pass != pass_sel)
            continue;
        for (int a = 0; a < CLG_PRIM_CONV_ALGO_COUNT; a++) {
            if (algo_sel >= 0 ? a != algo_sel : a == CLG_PRIM_CONV_AUTO)
                continue;
            if (!clg_bench_conv_supported(s, pass, a)) {
                if (algo_sel >= 0 && !json)
                    printf("%-10s %-10s %-10s unsupported for this shape\n", label, pass_names[pass],
                           clg_prim_conv_algo_name((clg_prim_conv_algo)a));
                continue;
            }
            clg_bench_conv_result r;
            if (clg_bench_conv_time(ctx, 0, s, pass, a, reps, check, &r) != CLG_OK) {
                fprintf(stderr, "clgrad: %s %s %s: %s\n", label, pass_names[pass],
                        clg_prim_conv_algo_name((clg_prim_conv_algo)a), clg_last_error(ctx));
                rc = CLI_FAIL;
                continue;
            }
            print_row(label, s, pass, a, &r, check, json);
        }
    }
    return rc;
}

/* Runs the vgg-s layers or the one shape of the options. */
static int run_shapes(clg_ctx *ctx, const conv_opts *o, int pass_sel, int algo_sel)
{
    if (!o->shapes) {
        clg_bench_conv_shape sh = {.n = o->n ? (int)o->n : 32, .c = (int)o->ch, .h = (int)o->h, .w = (int)o->w,
                                   .k = (int)o->k, .r = (int)o->r, .s = (int)o->s, .pad_h = (int)o->pad,
                                   .pad_w = (int)o->pad, .stride_h = (int)o->stride, .stride_w = (int)o->stride,
                                   .dil_h = (int)o->dil, .dil_w = (int)o->dil, .groups = (int)o->groups};
        return run_shape(ctx, "custom", &sh, pass_sel, algo_sel, (int)o->reps, o->check, o->c.json);
    }
    /* models/vgg-s: conv3x3 1->32, 32->32 @28x28, maxpool, 32->64, 64->64 @14x14, pad 1 */
    static const struct {
        const char *name;
        int c, k, hw;
    } vgg[] = {{"conv1", 1, 32, 28}, {"conv2", 32, 32, 28}, {"conv3", 32, 64, 14}, {"conv4", 64, 64, 14}};
    int rc = CLI_OK;
    for (size_t i = 0; i < sizeof vgg / sizeof vgg[0]; i++) {
        clg_bench_conv_shape sh = {.n = o->n ? (int)o->n : 128, .c = vgg[i].c, .h = vgg[i].hw, .w = vgg[i].hw,
                                   .k = vgg[i].k, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1, .stride_h = 1,
                                   .stride_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1};
        int r1 = run_shape(ctx, vgg[i].name, &sh, pass_sel, algo_sel, (int)o->reps, o->check, o->c.json);
        if (r1 != CLI_OK)
            rc = r1;
    }
    return rc;
}

/* The algorithm named, or -1 after a usage error listing the names. */
static int parse_algo(const char *name)
{
    char names[160] = "";
    for (int a = 0; a < CLG_PRIM_CONV_ALGO_COUNT; a++) {
        const char *n = clg_prim_conv_algo_name((clg_prim_conv_algo)a);
        if (strcmp(name, n) == 0)
            return a;
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, "%s%s", a ? ", " : "", n);
    }
    cli_usage_error("bench conv", "unknown convolution algorithm '%s' (%s)", name, names);
    return -1;
}

int bench_conv(int argc, char **argv)
{
    conv_opts o = {.ch = 32, .h = 28, .w = 28, .k = 32, .r = 3, .s = 3, .pad = 1, .stride = 1, .dil = 1,
                   .groups = 1, .reps = 5};
    int pass_sel = -1, algo_sel = -1;
    /* `auto` rows time the measured choice: measure at the first use, not after
     * a default run (clg_conv_auto_choose), unless the caller says otherwise */
    cli_option_default("conv_auto_defer", "0");
    CLI_PARSE(&cli_spec_bench_conv, argc, argv, &o);
    for (int p = 0; p < 3; p++)
        if (o.pass && strcmp(o.pass, pass_names[p]) == 0)
            pass_sel = p;
    if (o.algo && strcmp(o.algo, "all") != 0 && (algo_sel = parse_algo(o.algo)) < 0)
        return CLI_USAGE;
    int rc = CLI_OK;
    clg_ctx *ctx = cli_ctx_open(o.c.devices, 0, &rc);
    if (!ctx)
        return rc;
    rc = run_shapes(ctx, &o, pass_sel, algo_sel);
    clg_ctx_destroy(ctx);
    return rc;
}
