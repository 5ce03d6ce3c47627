/* clgrad bench conv: time each convolution algorithm and pass.
 * GFLOP/s counts direct-convolution FLOPs (2*N*K*P*Q*C/groups*R*S) for every
 * algorithm and pass, so numbers compare across algorithms. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"
#include "device/device.h"
#include "ops/conv.h"
#include "ops/conv_impl.h"

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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *pass_names[3] = {"fwd", "bwd-data", "bwd-filter"};

/* Reference error for one pass: downloads the device result and compares. */
static double ref_error(clg_device *dev, const clg_conv_shape *s, int pass, const float *x, const float *w,
                        const float *dy, cl_mem out)
{
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s), Cg = s->C / s->groups, Kg = s->K / s->groups;
    size_t nx = (size_t)s->N * s->C * s->H * s->W, nw = (size_t)s->K * Cg * s->R * s->S;
    size_t ny = (size_t)s->N * s->K * P * Q;
    size_t n = pass == 0 ? ny : pass == 1 ? nx : nw;
    double *ref = calloc(n, sizeof(double));
    float *got = malloc(n * sizeof(float));
    if (!ref || !got) {
        free(ref);
        free(got);
        return NAN;
    }
    clEnqueueReadBuffer(dev->queue, out, CL_TRUE, 0, n * sizeof(float), got, 0, NULL, NULL);
    for (int b = 0; b < s->N; b++)
        for (int k = 0; k < s->K; k++)
            for (int cc = 0; cc < Cg; cc++)
                for (int r = 0; r < s->R; r++)
                    for (int t = 0; t < s->S; t++) {
                        int c = (k / Kg) * Cg + cc;
                        size_t iw = (((size_t)k * Cg + cc) * s->R + r) * s->S + t;
                        for (int p = 0; p < P; p++) {
                            int h = p * s->stride_h - s->pad_h + r * s->dil_h;
                            if (h < 0 || h >= s->H)
                                continue;
                            for (int q = 0; q < Q; q++) {
                                int ww = q * s->stride_w - s->pad_w + t * s->dil_w;
                                if (ww < 0 || ww >= s->W)
                                    continue;
                                size_t ix = (((size_t)b * s->C + c) * s->H + h) * s->W + ww;
                                size_t iy = (((size_t)b * s->K + k) * P + p) * Q + q;
                                if (pass == 0)
                                    ref[iy] += (double)x[ix] * w[iw];
                                else if (pass == 1)
                                    ref[ix] += (double)dy[iy] * w[iw];
                                else
                                    ref[iw] += (double)x[ix] * dy[iy];
                            }
                        }
                    }
    double emax = 0, rmax = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]);
        if (isnan(got[i]))
            e = INFINITY;
        emax = e > emax ? e : emax;
        rmax = fabs(ref[i]) > rmax ? fabs(ref[i]) : rmax;
    }
    free(ref);
    free(got);
    return rmax > 0 ? emax / rmax : emax;
}

static int run_shape(clg_ctx *ctx, const char *label, const clg_conv_shape *s, int pass_sel, int algo_sel, int reps,
                     int check, int json)
{
    clg_device *dev = &ctx->devs[0];
    clg_err *err = &ctx->err;
    if (clg_conv_check(err, s) != CLG_OK)
        return cli_fail("%s", clg_last_error(ctx));
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s), Cg = s->C / s->groups;
    size_t nx = (size_t)s->N * s->C * s->H * s->W, nw = (size_t)s->K * Cg * s->R * s->S;
    size_t ny = (size_t)s->N * s->K * P * Q;
    double flops = 2.0 * s->N * s->K * P * Q * (double)Cg * s->R * s->S;
    float *hx = malloc(nx * sizeof(float)), *hw = malloc(nw * sizeof(float)), *hdy = malloc(ny * sizeof(float));
    float *hb = calloc((size_t)s->K, sizeof(float));
    if (!hx || !hw || !hdy || !hb) {
        free(hx), free(hw), free(hdy), free(hb);
        return cli_fail("out of host memory");
    }
    clg_rng r;
    clg_rng_seed(&r, 42, 0);
    for (size_t i = 0; i < nx; i++)
        hx[i] = clg_rng_normal(&r);
    for (size_t i = 0; i < nw; i++)
        hw[i] = clg_rng_normal(&r);
    for (size_t i = 0; i < ny; i++)
        hdy[i] = clg_rng_normal(&r);
    cl_mem x = NULL, w = NULL, y = NULL, dy = NULL, dx = NULL, dw = NULL, b = NULL, db = NULL;
    int rc = CLI_OK;
    if (clg_buf_alloc(dev, nx * 4, &x) || clg_buf_alloc(dev, nw * 4, &w) || clg_buf_alloc(dev, ny * 4, &y) ||
        clg_buf_alloc(dev, ny * 4, &dy) || clg_buf_alloc(dev, nx * 4, &dx) || clg_buf_alloc(dev, nw * 4, &dw) ||
        clg_buf_alloc(dev, (size_t)s->K * 4, &b) || clg_buf_alloc(dev, (size_t)s->K * 4, &db)) {
        rc = cli_fail("%s", clg_last_error(ctx));
        goto done;
    }
    clEnqueueWriteBuffer(dev->queue, x, CL_TRUE, 0, nx * 4, hx, 0, NULL, NULL);
    clEnqueueWriteBuffer(dev->queue, w, CL_TRUE, 0, nw * 4, hw, 0, NULL, NULL);
    clEnqueueWriteBuffer(dev->queue, dy, CL_TRUE, 0, ny * 4, hdy, 0, NULL, NULL);
    clEnqueueWriteBuffer(dev->queue, b, CL_TRUE, 0, (size_t)s->K * 4, hb, 0, NULL, NULL);
    for (int pass = 0; pass < 3; pass++) {
        if (pass_sel >= 0 && pass != pass_sel)
            continue;
        for (int a = 0; a < CLG_CONV_ALGO_COUNT; a++) {
            if (algo_sel >= 0 ? a != algo_sel : a == CLG_CONV_AUTO)
                continue;
            if (!clg_conv_algo_supported((clg_conv_algo)a, s, (clg_conv_pass)pass)) {
                if (algo_sel >= 0 && !json)
                    printf("%-10s %-10s %-10s unsupported for this shape\n", label, pass_names[pass],
                           clg_conv_algo_name((clg_conv_algo)a));
                continue;
            }
            clg_conv_cache cache;
            memset(&cache, 0, sizeof cache);
            double *t = malloc(sizeof(double) * (size_t)(reps + 1));
            clg_status st = CLG_OK;
            for (int i = 0; i <= reps && st == CLG_OK; i++) { /* i == 0: warm-up (builds, auto measurement) */
                double t0 = clg_now_sec();
                if (pass == 0)
                    st = clg_conv_forward(dev, s, (clg_conv_algo)a, &cache, x, 0, w, 0, b, 0, 0, y, 0);
                else if (pass == 1)
                    st = clg_conv_backward_data(dev, s, (clg_conv_algo)a, &cache, dy, 0, w, 0, dx, 0);
                else
                    st = clg_conv_backward_filter(dev, s, (clg_conv_algo)a, x, 0, dy, 0, 0.0f, dw, 0, db, 0);
                if (st == CLG_OK && clFinish(dev->queue) != CL_SUCCESS)
                    st = CLG_ERR_OPENCL;
                t[i] = (clg_now_sec() - t0) * 1e3;
                cache.weights_version++; /* training: transforms are rebuilt every step */
            }
            if (st != CLG_OK) {
                fprintf(stderr, "clgrad: %s %s %s: %s\n", label, pass_names[pass], clg_conv_algo_name((clg_conv_algo)a),
                        clg_last_error(ctx));
                clg_conv_cache_free(dev, &cache);
                free(t);
                rc = CLI_FAIL;
                continue;
            }
            qsort(t + 1, (size_t)reps, sizeof(double), cmp_double);
            double ms = t[1 + reps / 2];
            double e = check ? ref_error(dev, s, pass, hx, hw, hdy, pass == 0 ? y : pass == 1 ? dx : dw) : NAN;
            clg_conv_algo pick = cache.chosen[pass];
            if (a == CLG_CONV_AUTO && pass == CLG_CONV_BWD_FILTER) {
                /* backward-filter has no layer cache: read the choice back from the measurement table */
                clg_conv_io io;
                memset(&io, 0, sizeof io);
                io.x = x;
                io.dy = dy;
                io.dw = dw;
                if (clg_conv_auto_pick(dev, s, CLG_CONV_BWD_FILTER, &io, &pick) != CLG_OK)
                    pick = CLG_CONV_AUTO;
            }
            const char *chosen = a == CLG_CONV_AUTO ? clg_conv_algo_name(pick) : "";
            if (json) {
                printf("{\"shape\": \"%s\", \"n\": %d, \"c\": %d, \"h\": %d, \"w\": %d, \"k\": %d, \"r\": %d, \"s\": %d, "
                       "\"pad\": %d, \"stride\": %d, \"algo\": \"%s\", \"pass\": \"%s\", \"ms\": %.4f, \"gflops\": %.3f",
                       label, s->N, s->C, s->H, s->W, s->K, s->R, s->S, s->pad_h, s->stride_h,
                       clg_conv_algo_name((clg_conv_algo)a), pass_names[pass], ms, flops / ms * 1e-6);
                if (a == CLG_CONV_AUTO)
                    printf(", \"chosen\": \"%s\"", chosen);
                if (check)
                    printf(", \"rel_err\": %.3e", e);
                printf("}\n");
            } else {
                printf("%-10s %-10s %-10s %10.3f ms %9.2f GFLOP/s", label, pass_names[pass],
                       clg_conv_algo_name((clg_conv_algo)a), ms, flops / ms * 1e-6);
                if (a == CLG_CONV_AUTO)
                    printf("  (chose %s)", chosen);
                if (check)
                    printf("  rel_err %.3e", e);
                printf("\n");
            }
            fflush(stdout);
            clg_conv_cache_free(dev, &cache);
            free(t);
        }
    }
done:
    clg_buf_release(dev, x), clg_buf_release(dev, w), clg_buf_release(dev, y), clg_buf_release(dev, dy);
    clg_buf_release(dev, dx), clg_buf_release(dev, dw), clg_buf_release(dev, b), clg_buf_release(dev, db);
    free(hx), free(hw), free(hdy), free(hb);
    return rc;
}

/* Runs the vgg-s layers or the one shape of the options. */
static int run_shapes(clg_ctx *ctx, const conv_opts *o, int pass_sel, int algo_sel)
{
    if (!o->shapes) {
        clg_conv_shape sh = {.N = o->n ? (int)o->n : 32, .C = (int)o->ch, .H = (int)o->h, .W = (int)o->w,
                             .K = (int)o->k, .R = (int)o->r, .S = (int)o->s, .pad_h = (int)o->pad,
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
    for (size_t i = 0; i < CLG_ARRAY_LEN(vgg); i++) {
        clg_conv_shape sh = {.N = o->n ? (int)o->n : 128, .C = vgg[i].c, .H = vgg[i].hw, .W = vgg[i].hw,
                             .K = vgg[i].k, .R = 3, .S = 3, .pad_h = 1, .pad_w = 1, .stride_h = 1, .stride_w = 1,
                             .dil_h = 1, .dil_w = 1, .groups = 1};
        int r1 = run_shape(ctx, vgg[i].name, &sh, pass_sel, algo_sel, (int)o->reps, o->check, o->c.json);
        if (r1 != CLI_OK)
            rc = r1;
    }
    return rc;
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
    if (o.algo && strcmp(o.algo, "all") != 0) {
        clg_conv_algo a;
        if (clg_conv_algo_parse(NULL, o.algo, &a) != CLG_OK)
            return cli_usage_error("bench conv", "%s", clg_last_error(NULL));
        algo_sel = (int)a;
    }
    int rc = CLI_OK;
    clg_ctx *ctx = cli_ctx_open(o.c.devices, 0, &rc);
    if (!ctx)
        return rc;
    rc = run_shapes(ctx, &o, pass_sel, algo_sel);
    clg_ctx_destroy(ctx);
    return rc;
}
