/* Convolution tests: every algorithm and pass against a plain C reference
 * in double precision on random shapes, finite-difference gradient checks,
 * filter-transform cache versions, auto choice, argument errors.
 * CLGRAD_TEST_TINY=1 runs fewer and smaller cases (oclgrind). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/conv.h"
#include "ops/conv_impl.h"
#include "ops/gemm.h"
#include "ops/tune.h"
#include "conv_ref.h"
#include "testutil.h"

static clg_ctx *g_ctx;
static int g_tiny;

static clg_device *dev0(void) { return &g_ctx->devs[0]; }


/* ---- helpers ---- */

static float *rnd(size_t n, clg_rng *r)
{
    float *p = malloc(sizeof(float) * (n + 1));
    ck_assert_ptr_nonnull(p);
    tu_fill(p, n, -1.0f, 1.0f, r);
    return p;
}

static int irand(clg_rng *r, int lo, int hi) { return lo + (int)(clg_rng_u32(r) % (uint32_t)(hi - lo + 1)); }

/* Runs all three passes of `algo` on s and checks them; returns worst error. */
static double check_algo(const clg_conv_shape *s, clg_conv_algo algo, clg_rng *r, double tol, int passes)
{
    clg_device *dev = dev0();
    char desc[200];
    cr_shape_str(s, desc, sizeof desc);
    if (getenv("CLGRAD_TEST_VERBOSE"))
        fprintf(stderr, "%s: %s\n", clg_conv_algo_name(algo), desc);
    size_t nx = cr_nx(s), nw = cr_nw(s), ny = cr_ny(s);
    size_t off = (size_t)irand(r, 0, 5); /* element offsets exercise the off* arguments */
    float *x = rnd(nx, r), *w = rnd(nw, r), *bias = rnd((size_t)s->K, r), *dy = rnd(ny, r);
    float *dw0 = rnd(nw, r), *db0 = rnd((size_t)s->K, r);
    double *ref = malloc(sizeof(double) * (nx > nw ? (nx > ny ? nx : ny) : (nw > ny ? nw : ny)) + 64);
    double *refb = malloc(sizeof(double) * (size_t)s->K);
    cl_mem dx_ = tu_upload_at(dev, x, nx, off), dw_ = tu_upload_at(dev, w, nw, off), db_ = tu_upload_at(dev, bias, s->K, off);
    cl_mem ddy = tu_upload_at(dev, dy, ny, off);
    double worst = 0;
    int relu = irand(r, 0, 1), use_bias = irand(r, 0, 1);
    if (passes & 1) {
        cl_mem dy_out = tu_upload_at(dev, NULL, ny, off);
        ck_assert_msg(clg_conv_forward(dev, s, algo, NULL, dx_, off, dw_, off, use_bias ? db_ : NULL, off, relu, dy_out,
                                       off) == CLG_OK,
                      "%s fwd %s: %s", clg_conv_algo_name(algo), desc, clg_last_error(g_ctx));
        float *got = tu_download_at(dev, dy_out, ny, off);
        cr_fwd(s, x, w, use_bias ? bias : NULL, relu, ref);
        double e = tu_max_err(got, ref, ny, 1.0);
        ck_assert_msg(e < tol, "%s fwd %s (relu %d bias %d): error %g > %g", clg_conv_algo_name(algo), desc, relu,
                      use_bias, e, tol);
        worst = fmax(worst, e);
        free(got);
        clg_buf_release(dev, dy_out);
    }
    if (passes & 2) {
        cl_mem dx_out = tu_upload_at(dev, NULL, nx, off);
        ck_assert_msg(clg_conv_backward_data(dev, s, algo, NULL, ddy, off, dw_, off, dx_out, off) == CLG_OK,
                      "%s bwd-data %s: %s", clg_conv_algo_name(algo), desc, clg_last_error(g_ctx));
        float *got = tu_download_at(dev, dx_out, nx, off);
        cr_bwd_data(s, dy, w, ref);
        double e = tu_max_err(got, ref, nx, 1.0);
        ck_assert_msg(e < tol, "%s bwd-data %s: error %g > %g", clg_conv_algo_name(algo), desc, e, tol);
        worst = fmax(worst, e);
        free(got);
        clg_buf_release(dev, dx_out);
    }
    if (passes & 4) {
        float beta = irand(r, 0, 1) ? 0.0f : 0.5f;
        /* beta 0: the old contents are poison and must not be read */
        cl_mem dw_out = tu_upload_at(dev, beta != 0 ? dw0 : NULL, nw, off);
        cl_mem db_out = tu_upload_at(dev, beta != 0 ? db0 : NULL, s->K, off);
        ck_assert_msg(clg_conv_backward_filter(dev, s, algo, dx_, off, ddy, off, beta, dw_out, off, db_out, off) ==
                          CLG_OK,
                      "%s bwd-filter %s: %s", clg_conv_algo_name(algo), desc, clg_last_error(g_ctx));
        float *got = tu_download_at(dev, dw_out, nw, off), *gotb = tu_download_at(dev, db_out, s->K, off);
        cr_bwd_filter(s, x, dy, beta, dw0, ref, refb, db0);
        double e = tu_max_err(got, ref, nw, 1.0), eb = tu_max_err(gotb, refb, s->K, 1.0);
        ck_assert_msg(e < tol, "%s bwd-filter %s (beta %g): dw error %g > %g", clg_conv_algo_name(algo), desc, beta, e,
                      tol);
        ck_assert_msg(eb < tol, "%s bwd-filter %s (beta %g): db error %g > %g", clg_conv_algo_name(algo), desc, beta,
                      eb, tol);
        worst = fmax(worst, fmax(e, eb));
        free(got);
        free(gotb);
        clg_buf_release(dev, dw_out);
        clg_buf_release(dev, db_out);
    }
    clg_buf_release(dev, dx_);
    clg_buf_release(dev, dw_);
    clg_buf_release(dev, db_);
    clg_buf_release(dev, ddy);
    free(x), free(w), free(bias), free(dy), free(dw0), free(db0), free(ref), free(refb);
    return worst;
}

/* A random valid shape; kind 0 general, 1 depthwise, 2 Winograd-eligible (3x3 s1). */
static clg_conv_shape random_shape(clg_rng *r, int kind)
{
    clg_conv_shape s;
    int big = g_tiny ? 0 : 1;
    for (;;) {
        memset(&s, 0, sizeof s);
        s.N = irand(r, 1, 2 + big);
        s.H = irand(r, 3, 7 + 6 * big);
        s.W = irand(r, 3, 7 + 6 * big);
        s.R = irand(r, 1, 4);
        s.S = irand(r, 1, 4);
        s.pad_h = irand(r, 0, 2);
        s.pad_w = irand(r, 0, 2);
        s.stride_h = irand(r, 1, 2);
        s.stride_w = irand(r, 1, 2);
        s.dil_h = irand(r, 1, 2);
        s.dil_w = irand(r, 1, 2);
        s.groups = irand(r, 1, 3);
        s.C = s.groups * irand(r, 1, 3 + 2 * big);
        s.K = s.groups * irand(r, 1, 3 + 2 * big);
        if (kind == 1) {
            s.C = irand(r, 1, 6 + 4 * big);
            s.groups = s.C;
            s.K = s.C * irand(r, 1, 2);
        } else if (kind == 2) {
            s.R = s.S = 3;
            s.stride_h = s.stride_w = s.dil_h = s.dil_w = s.groups = 1;
            s.C = irand(r, 1, 5 + 12 * big);
            s.K = irand(r, 1, 5 + 12 * big);
        }
        if (clg_conv_check(NULL, &s) == CLG_OK)
            return s;
    }
}

static int ncases(int full) { return g_tiny ? 2 : full; }

/* CLGRAD_TEST_TINY (oclgrind, ~100x slower than PoCL): a wide-row case keeps
 * its width (several tile groups, vector loads) with less depth. */
static void tiny_wide(clg_conv_shape *s)
{
    if (!g_tiny)
        return;
    s->N = 1;
    s->C = CLG_MIN(s->C, 2);
    s->K = CLG_MIN(s->K, 2);
    s->H = CLG_MIN(s->H, 5);
}

START_TEST(im2col_random)
{
    clg_rng r;
    tu_rng(&r, 11);
    for (int i = 0; i < ncases(14); i++) {
        clg_conv_shape s = random_shape(&r, i % 4 == 3 ? 1 : 0);
        check_algo(&s, CLG_CONV_IM2COL, &r, 1e-4, 7);
    }
}
END_TEST

/* im2col backward-data with a stride and dilation 1: the unrolled gather
 * with the stride fixed at compile time (col2im_s1 -D CU -D CV), strides 2-4,
 * 1x1 (the projection shortcut of a residual stage) to 4x3 windows, odd
 * planes, padding 0-2. */
START_TEST(im2col_strided)
{
    clg_rng r;
    tu_rng(&r, 13);
    static const int win[][2] = {{1, 1}, {3, 3}, {2, 3}, {4, 1}};
    for (int i = 0; i < ncases(8); i++) {
        clg_conv_shape s;
        memset(&s, 0, sizeof s);
        s.N = irand(&r, 1, 3);
        s.C = irand(&r, 1, 6);
        s.K = irand(&r, 1, 6);
        s.H = irand(&r, 5, g_tiny ? 7 : 13);
        s.W = irand(&r, 5, g_tiny ? 7 : 13);
        s.R = win[i % 4][0];
        s.S = win[i % 4][1];
        s.pad_h = irand(&r, 0, CLG_MIN(2, s.R - 1));
        s.pad_w = irand(&r, 0, CLG_MIN(2, s.S - 1));
        s.stride_h = irand(&r, 2, 4);
        s.stride_w = i % 2 ? s.stride_h : irand(&r, 1, 3);
        s.dil_h = s.dil_w = s.groups = 1;
        ck_assert_int_eq(clg_conv_check(NULL, &s), CLG_OK);
        check_algo(&s, CLG_CONV_IM2COL, &r, 1e-4, 7);
    }
}
END_TEST

START_TEST(im2col_1x1_gemm)
{
    /* 1x1, stride 1, pad 0: straight GEMM (no column buffer), with groups. */
    clg_rng r;
    tu_rng(&r, 12);
    for (int i = 0; i < ncases(4); i++) {
        clg_conv_shape s = random_shape(&r, 0);
        s.R = s.S = 1;
        s.pad_h = s.pad_w = 0;
        s.stride_h = s.stride_w = 1;
        check_algo(&s, CLG_CONV_IM2COL, &r, 1e-4, 7);
    }
}
END_TEST

START_TEST(direct_random)
{
    clg_rng r;
    tu_rng(&r, 13);
    for (int i = 0; i < ncases(12); i++) {
        clg_conv_shape s = random_shape(&r, i % 2); /* depthwise every other case */
        check_algo(&s, CLG_CONV_DIRECT, &r, 1e-4, 7);
    }
}
END_TEST

/* Strided backward-data by stride phases (direct: one dconv_fwdk per phase
 * writing straight into dx): a ResNet-like stride-2 3x3 shape left to the
 * automatic choice (phases on wide-vector CPUs) and, with the phases forced
 * (djit_fwd=k), more ResNet-like shapes and small odd ones -- strides 2-3, windows 2-5, paddings up to R-1, one stride
 * 1 dimension, sizes that leave a phase one row short. bwd-data only (the
 * other passes are direct_jit_random's); outputs poisoned, double reference. */
START_TEST(direct_phases)
{
    static const struct {
        int N, C, K, H, W, R, S, ph, pw, sh, sw, force;
    } cases[] = {
        {2, 16, 20, 15, 16, 3, 3, 1, 1, 2, 2, 0}, /* ResNet transition, odd height */
        {1, 17, 8, 16, 13, 3, 3, 1, 1, 2, 1, 1},  /* stride 1 along columns */
        {2, 16, 24, 16, 16, 3, 3, 1, 1, 2, 2, 1},
        {2, 5, 3, 11, 9, 5, 4, 2, 1, 3, 2, 1},
        {1, 3, 7, 8, 8, 2, 2, 0, 0, 2, 2, 1},
        {1, 4, 5, 10, 7, 4, 3, 3, 2, 2, 2, 1},
    };
    clg_rng r;
    tu_rng(&r, 23);
    for (size_t i = 0; i < CLG_ARRAY_LEN(cases); i++) {
        clg_conv_shape s = {.N = cases[i].N, .C = cases[i].C, .K = cases[i].K, .H = cases[i].H, .W = cases[i].W,
                            .R = cases[i].R, .S = cases[i].S, .pad_h = cases[i].ph, .pad_w = cases[i].pw,
                            .stride_h = cases[i].sh, .stride_w = cases[i].sw, .dil_h = 1, .dil_w = 1, .groups = 1};
        ck_assert_int_eq(clg_conv_check(NULL, &s), CLG_OK);
        ck_assert_int_eq(clg_ctx_option_set(g_ctx, "djit_fwd", cases[i].force ? "k" : "auto"), CLG_OK);
        check_algo(&s, CLG_CONV_DIRECT, &r, 1e-4, 2);
    }
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "djit_fwd", "auto"), CLG_OK);
}
END_TEST

/* The channel-vector forward (dconv_fwdk, djit_fwd=k) of ResNet's strided
 * 3x3 transitions: one strip whose right edge stays inside the plane (the
 * first-strip path, its column checks folded at compile time), two strips
 * (first + inner), a plane one column short (the right edge in the
 * padding: the general checks). Forward only; outputs poisoned, double
 * reference. */
START_TEST(direct_fwdk_strips)
{
    static const int cases[][5] = {
        /* N, C, K, H, W (3x3, pad 1, stride 2) */
        {2, 16, 32, 16, 16},
        {1, 16, 32, 32, 32},
        {2, 8, 20, 11, 15},
    };
    clg_rng r;
    tu_rng(&r, 31);
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "djit_fwd", "k"), CLG_OK);
    for (size_t i = 0; i < (g_tiny ? 1 : CLG_ARRAY_LEN(cases)); i++) { /* oclgrind: the first */
        const int *c = cases[i];
        clg_conv_shape s = {.N = g_tiny ? 1 : c[0], .C = c[1], .K = c[2], .H = c[3], .W = c[4], .R = 3, .S = 3,
                            .pad_h = 1, .pad_w = 1, .stride_h = 2, .stride_w = 2, .dil_h = 1, .dil_w = 1,
                            .groups = 1};
        ck_assert_int_eq(clg_conv_check(NULL, &s), CLG_OK);
        check_algo(&s, CLG_CONV_DIRECT, &r, 1e-4, 1);
    }
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "djit_fwd", "auto"), CLG_OK);
}
END_TEST

/* Strided 1x1 backward-data without padding (direct: dconv_fwdk over dy
 * into dx's phase (0, 0), the same work-items writing the zeros between):
 * ResNet's projections, odd planes (a last row / column of zeros only),
 * strides 2-4 by 1-2, channel counts off the vector width, a plane whose
 * row needs two strips. bwd-data only; outputs poisoned, double reference. */
START_TEST(direct_1x1_strided)
{
    static const int cases[][7] = {
        /* N, C, K, H, W, stride_h, stride_w */
        {2, 16, 32, 16, 16, 2, 2}, /* ResNet 16 -> 32 projection */
        {1, 5, 7, 9, 11, 2, 2},    /* odd plane */
        {2, 17, 20, 10, 7, 3, 2},
        {1, 20, 3, 13, 8, 4, 1},
        {1, 3, 9, 5, 70, 2, 2}, /* 35 output columns: two strips */
        {3, 32, 64, 8, 8, 2, 2},
    };
    clg_rng r;
    tu_rng(&r, 29);
    for (size_t i = 0; i < (g_tiny ? 2 : CLG_ARRAY_LEN(cases)); i++) { /* oclgrind: the first two */
        const int *c = cases[i];
        clg_conv_shape s = {.N = c[0], .C = c[1], .K = c[2], .H = c[3], .W = c[4], .R = 1, .S = 1,
                            .stride_h = c[5], .stride_w = c[6], .dil_h = 1, .dil_w = 1, .groups = 1};
        if (g_tiny)
            s.N = 1;
        ck_assert_int_eq(clg_conv_check(NULL, &s), CLG_OK);
        ck_assert(clg_conv_djit_ok(dev0(), &s, CLG_CONV_BWD_DATA));
        check_algo(&s, CLG_CONV_DIRECT, &r, 1e-4, 2);
    }
}
END_TEST

/* Direct weight gradient with several input channels per work-item (1x1 and
 * other few-tap windows: 4 or 2 where C allows, 1 for odd C), partial
 * channel vectors (K not a multiple of the vector width), beta 0 (poisoned
 * output) or 0.5, against the double-precision reference. */
START_TEST(direct_bwdf_blocks)
{
    clg_rng r;
    tu_rng(&r, 23);
    static const int cases[][9] = {
        /* N, C, H, W, K, R, S, stride, pad */
        {3, 12, 9, 11, 10, 1, 1, 2, 0}, /* 4 channels per work-item */
        {2, 6, 7, 7, 21, 1, 1, 1, 0},   /* 2 (3 channel vectors per work-item) */
        {2, 5, 8, 9, 3, 2, 2, 2, 1},    /* 1 */
    };
    for (size_t i = 0; i < (g_tiny ? 1 : CLG_ARRAY_LEN(cases)); i++) { /* oclgrind: the first */
        const int *c = cases[i];
        clg_conv_shape s;
        memset(&s, 0, sizeof s);
        s.N = c[0], s.C = c[1], s.H = c[2], s.W = c[3], s.K = c[4], s.R = c[5], s.S = c[6];
        s.stride_h = s.stride_w = c[7];
        s.pad_h = s.pad_w = c[8];
        s.dil_h = s.dil_w = s.groups = 1;
        ck_assert_int_eq(clg_conv_check(NULL, &s), CLG_OK);
        ck_assert(clg_conv_djit_ok(dev0(), &s, CLG_CONV_BWD_FILTER));
        check_algo(&s, CLG_CONV_DIRECT, &r, 1e-4, 4);
        check_algo(&s, CLG_CONV_DIRECT, &r, 1e-4, 4); /* a second draw of beta */
    }
}
END_TEST

/* The shape-specialised direct kernels (groups 1, dilation 1): strides 1-2
 * along rows and columns (3 along rows), windows 1-7, rows one to several
 * vectors long and longer than one run (wide images), channel counts that
 * leave partial channel blocks and vectors (K not a multiple of 4/8/16). */
START_TEST(direct_jit_random)
{
    clg_rng r;
    tu_rng(&r, 19);
    for (int i = 0; i < ncases(6); i++) { /* each case builds four programs (~1-4 s each on PoCL) */
        clg_conv_shape s;
        do {
            memset(&s, 0, sizeof s);
            s.N = irand(&r, 1, g_tiny ? 1 : 3);
            s.R = irand(&r, 1, 7);
            s.S = irand(&r, 1, 7);
            s.H = irand(&r, s.R, g_tiny ? 9 : 20);
            s.W = i % 3 == 2 && !g_tiny ? irand(&r, 60, 140) : irand(&r, s.S, g_tiny ? 20 : 40);
            s.pad_h = irand(&r, 0, CLG_MIN(3, s.R - 1));
            s.pad_w = irand(&r, 0, CLG_MIN(3, s.S - 1));
            s.stride_h = irand(&r, 1, 3);
            s.stride_w = irand(&r, 1, 2);
            s.dil_h = s.dil_w = s.groups = 1;
            s.C = irand(&r, 1, g_tiny ? 3 : 9);
            s.K = irand(&r, 1, g_tiny ? 5 : 21);
        } while (clg_conv_check(NULL, &s) != CLG_OK);
        if (i % 3 == 0) /* backward-data as a forward convolution needs stride 1 */
            s.stride_h = s.stride_w = 1;
        for (int pass = 0; pass < 3; pass++)
            ck_assert_msg(clg_conv_djit_ok(dev0(), &s, (clg_conv_pass)pass) || s.R * s.S > 25,
                          "direct: shape-specialised path not taken");
        /* both forward designs (row vectors, channel vectors) on every kind of shape */
        ck_assert_int_eq(clg_ctx_option_set(g_ctx, "djit_fwd", i % 2 ? "q" : "k"), CLG_OK);
        check_algo(&s, CLG_CONV_DIRECT, &r, 1e-4, 7);
    }
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "djit_fwd", "auto"), CLG_OK);
}
END_TEST

START_TEST(winograd2_random)
{
    clg_rng r;
    tu_rng(&r, 14);
    for (int i = 0; i < ncases(10); i++) {
        clg_conv_shape s = random_shape(&r, 2);
        s.pad_h = s.pad_w = i % 3; /* 0, 1, 2 */
        if (i == 1)
            s.N = 1;
        if (i == 0 || i == 2) { /* wide rows: several 8-tile groups per tile row, vector loads */
            s.W = irand(&r, 30, 45);
            tiny_wide(&s);
        }
        if (clg_conv_check(NULL, &s) != CLG_OK)
            continue;
        check_algo(&s, CLG_CONV_WINOGRAD, &r, 1e-4, 7);
    }
}
END_TEST

START_TEST(winograd4_random)
{
    clg_rng r;
    tu_rng(&r, 15);
    for (int i = 0; i < ncases(8); i++) {
        clg_conv_shape s = random_shape(&r, 2);
        s.pad_h = s.pad_w = i % 3;
        if (i == 0 || i == 2) { /* wide rows: VL=8 kernels, several tile groups, vector loads */
            s.W = irand(&r, 30, 75);
            tiny_wide(&s);
        }
        if (clg_conv_check(NULL, &s) != CLG_OK)
            continue;
        check_algo(&s, CLG_CONV_WINOGRAD4, &r, 1e-4, 7);
    }
}
END_TEST

/* FFT forward (clFFT) on random stride-1 shapes with 2x2 .. 7x7 kernels; the
 * filter spectra follow the layer cache's weights_version. */
START_TEST(fft_random)
{
    clg_device *dev = dev0();
    clg_rng r;
    tu_rng(&r, 19);
    clg_conv_shape probe = {.N = 1, .C = 1, .H = 8, .W = 8, .K = 1, .R = 5, .S = 5, .pad_h = 2, .pad_w = 2,
                            .stride_h = 1, .stride_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1};
    if (!clg_conv_algo_supported(CLG_CONV_FFT, &probe, CLG_CONV_FWD)) {
        fprintf(stderr, "fft_random: built without clFFT, nothing to test\n");
        return;
    }
    if (strstr(dev->info.platform, "Oclgrind") || strstr(dev->info.name, "Oclgrind")) {
        /* clFFT's own generated kernels crash oclgrind (segfault) and store
         * undef values: not ours to check there */
        fprintf(stderr, "fft_random: skipped under oclgrind (clFFT kernels)\n");
        return;
    }
    for (int i = 0; i < ncases(3); i++) { /* few cases: every new size bakes clFFT plans (~1 s each) */
        clg_conv_shape s = random_shape(&r, 2);
        s.R = irand(&r, 2, 7);
        s.S = irand(&r, 2, 7);
        s.pad_h = irand(&r, 0, 3);
        s.pad_w = irand(&r, 0, 3);
        s.H = irand(&r, s.R, s.R + 9);
        s.W = irand(&r, s.S, s.S + 9);
        if (i == 1)
            s.N = 1;
        if (clg_conv_check(NULL, &s) != CLG_OK)
            continue;
        check_algo(&s, CLG_CONV_FFT, &r, 1e-4, 1);
    }
    /* cached spectra: reused without a version bump, rebuilt after one */
    clg_conv_shape s = {.N = 2, .C = 3, .H = 9, .W = 7, .K = 4, .R = 5, .S = 5, .pad_h = 2, .pad_w = 1,
                        .stride_h = 1, .stride_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1};
    size_t nx = cr_nx(&s), nw = cr_nw(&s), ny = cr_ny(&s);
    float *x = rnd(nx, &r), *w1 = rnd(nw, &r), *w2 = rnd(nw, &r), *got = malloc(sizeof(float) * ny);
    double *ref = malloc(sizeof(double) * ny);
    cl_mem mx = tu_upload(dev, x, nx), mw = tu_upload(dev, w1, nw), my = tu_upload(dev, NULL, ny);
    clg_conv_cache cache;
    memset(&cache, 0, sizeof cache);
    cache.weights_version = 1;
    ck_assert_int_eq(clg_conv_forward(dev, &s, CLG_CONV_FFT, &cache, mx, 0, mw, 0, NULL, 0, 0, my, 0), CLG_OK);
    ck_assert(cache.built_version[CLG_CONV_FFT] == 1);
    tu_write_full(dev, mw, w2, nw);
    ck_assert_int_eq(clg_conv_forward(dev, &s, CLG_CONV_FFT, &cache, mx, 0, mw, 0, NULL, 0, 0, my, 0), CLG_OK);
    tu_download(dev, my, got, ny);
    cr_fwd(&s, x, w1, NULL, 0, ref);
    ck_assert_double_lt(tu_max_err(got, ref, ny, 1.0), 1e-4);
    cache.weights_version++;
    ck_assert_int_eq(clg_conv_forward(dev, &s, CLG_CONV_FFT, &cache, mx, 0, mw, 0, NULL, 0, 1, my, 0), CLG_OK);
    tu_download(dev, my, got, ny);
    cr_fwd(&s, x, w2, NULL, 1, ref);
    ck_assert_double_lt(tu_max_err(got, ref, ny, 1.0), 1e-4);
    clg_conv_cache_free(dev, &cache);
    free(x), free(w1), free(w2), free(got), free(ref);
    clg_buf_release(dev, mx), clg_buf_release(dev, mw), clg_buf_release(dev, my);
}
END_TEST

/* Gradients by central differences of the device forward pass. The loss
 * L = sum(g * conv(x, w)) is linear, so the differences are exact up to
 * fp32 rounding. */
START_TEST(finite_differences)
{
    clg_device *dev = dev0();
    clg_rng r;
    tu_rng(&r, 16);
    clg_conv_algo algos[] = {CLG_CONV_IM2COL, CLG_CONV_DIRECT, CLG_CONV_WINOGRAD, CLG_CONV_WINOGRAD4};
    if (g_tiny) { /* oclgrind: the same kernels as the *_random cases, ~1 min there */
        fprintf(stderr, "finite_differences: not run with CLGRAD_TEST_TINY\n");
        return;
    }
    for (size_t ai = 0; ai < CLG_ARRAY_LEN(algos); ai++) {
        clg_conv_algo algo = algos[ai];
        clg_conv_shape s = random_shape(&r, algo >= CLG_CONV_WINOGRAD && algo <= CLG_CONV_WINOGRAD4 ? 2 : 0);
        s.N = 1;
        size_t nx = cr_nx(&s), nw = cr_nw(&s), ny = cr_ny(&s);
        float *x = rnd(nx, &r), *w = rnd(nw, &r), *g = rnd(ny, &r), *y = malloc(sizeof(float) * ny);
        cl_mem dxm = tu_upload(dev, x, nx), dwm = tu_upload(dev, w, nw), dgm = tu_upload(dev, g, ny);
        cl_mem dym = tu_upload(dev, NULL, ny), dgx = tu_upload(dev, NULL, nx), dgw = tu_upload(dev, NULL, nw);
        ck_assert_int_eq(clg_conv_backward_data(dev, &s, algo, NULL, dgm, 0, dwm, 0, dgx, 0), CLG_OK);
        clg_conv_algo fa = clg_conv_algo_supported(algo, &s, CLG_CONV_BWD_FILTER) ? algo : CLG_CONV_IM2COL;
        ck_assert_int_eq(clg_conv_backward_filter(dev, &s, fa, dxm, 0, dgm, 0, 0.0f, dgw, 0, NULL, 0), CLG_OK);
        float *gx = malloc(sizeof(float) * nx), *gw = malloc(sizeof(float) * nw);
        tu_download(dev, dgx, gx, nx);
        tu_download(dev, dgw, gw, nw);
        const float eps = 0.25f;
        for (int t = 0; t < 6; t++) {
            int on_w = t & 1;
            size_t i = on_w ? clg_rng_u32(&r) % nw : clg_rng_u32(&r) % nx;
            float *v = on_w ? w : x;
            double L[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                float keep = v[i];
                v[i] = keep + (sgn ? -eps : eps);
                cl_mem m = on_w ? dwm : dxm;
                tu_write_full(dev, m, v, on_w ? nw : nx);
                ck_assert_int_eq(clg_conv_forward(dev, &s, algo, NULL, dxm, 0, dwm, 0, NULL, 0, 0, dym, 0), CLG_OK);
                tu_download(dev, dym, y, ny);
                double acc = 0;
                for (size_t j = 0; j < ny; j++)
                    acc += (double)g[j] * y[j];
                L[sgn] = acc;
                v[i] = keep;
                tu_write_full(dev, m, v, on_w ? nw : nx);
            }
            double fd = (L[0] - L[1]) / (2 * eps), an = on_w ? gw[i] : gx[i];
            ck_assert_msg(fabs(fd - an) <= 2e-3 * (1 + fabs(fd)), "%s: d/d%s[%zu] analytic %g vs finite difference %g",
                          clg_conv_algo_name(algo), on_w ? "w" : "x", i, an, fd);
        }
        free(x), free(w), free(g), free(y), free(gx), free(gw);
        clg_buf_release(dev, dxm), clg_buf_release(dev, dwm), clg_buf_release(dev, dgm);
        clg_buf_release(dev, dym), clg_buf_release(dev, dgx), clg_buf_release(dev, dgw);
    }
}
END_TEST

/* Transformed filters are reused while weights_version is unchanged and
 * rebuilt after it changes. */
START_TEST(filter_cache_versions)
{
    clg_device *dev = dev0();
    clg_rng r;
    tu_rng(&r, 17);
    clg_conv_shape s = {.N = 2, .C = 3, .H = 7, .W = 6, .K = 4, .R = 3, .S = 3, .pad_h = 1, .pad_w = 1,
                        .stride_h = 1, .stride_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1};
    if (g_tiny) /* oclgrind: the cache logic, on less work */
        s.N = 1, s.C = 2, s.K = 2, s.H = 5;
    size_t nx = cr_nx(&s), nw = cr_nw(&s), ny = cr_ny(&s);
    float *x = rnd(nx, &r), *w1 = rnd(nw, &r), *w2 = rnd(nw, &r), *got = malloc(sizeof(float) * (nx + ny));
    double *ref = malloc(sizeof(double) * (nx + ny)), *ref_old = malloc(sizeof(double) * (nx + ny));
    cl_mem mx = tu_upload(dev, x, nx), mw = tu_upload(dev, w1, nw), my = tu_upload(dev, NULL, ny);
    cl_mem mdx = tu_upload(dev, NULL, nx);
    clg_conv_cache cache;
    memset(&cache, 0, sizeof cache);
    clg_conv_algo algos[] = {CLG_CONV_WINOGRAD, CLG_CONV_WINOGRAD4};
    for (size_t ai = 0; ai < 2; ai++) {
        clg_conv_algo a = algos[ai];
        tu_write_full(dev, mw, w1, nw);
        cache.weights_version++;
        ck_assert_int_eq(clg_conv_forward(dev, &s, a, &cache, mx, 0, mw, 0, NULL, 0, 0, my, 0), CLG_OK);
        ck_assert_ptr_nonnull(cache.transformed[a]);
        ck_assert(cache.built_version[a] == cache.weights_version);
        /* weights change without a version bump: the cached transform (w1) is still used */
        tu_write_full(dev, mw, w2, nw);
        ck_assert_int_eq(clg_conv_forward(dev, &s, a, &cache, mx, 0, mw, 0, NULL, 0, 0, my, 0), CLG_OK);
        tu_download(dev, my, got, ny);
        cr_fwd(&s, x, w1, NULL, 0, ref_old);
        ck_assert_double_lt(tu_max_err(got, ref_old, ny, 1.0), 1e-4);
        /* after the bump the new weights are used */
        cache.weights_version++;
        ck_assert_int_eq(clg_conv_forward(dev, &s, a, &cache, mx, 0, mw, 0, NULL, 0, 0, my, 0), CLG_OK);
        tu_download(dev, my, got, ny);
        cr_fwd(&s, x, w2, NULL, 0, ref);
        ck_assert_double_lt(tu_max_err(got, ref, ny, 1.0), 1e-4);
        /* backward-data keeps its own (flipped) transform with the same rule */
        float *gy = rnd(ny, &r);
        cl_mem mgy = tu_upload(dev, gy, ny);
        ck_assert_int_eq(clg_conv_backward_data(dev, &s, a, &cache, mgy, 0, mw, 0, mdx, 0), CLG_OK);
        ck_assert(cache.built_version_bwd[a] == cache.weights_version);
        tu_download(dev, mdx, got, nx);
        cr_bwd_data(&s, gy, w2, ref);
        ck_assert_double_lt(tu_max_err(got, ref, nx, 1.0), 1e-4);
        free(gy);
        clg_buf_release(dev, mgy);
    }
    clg_conv_cache_free(dev, &cache);
    ck_assert_ptr_null(cache.transformed[CLG_CONV_WINOGRAD]);
    free(x), free(w1), free(w2), free(got), free(ref), free(ref_old);
    clg_buf_release(dev, mx), clg_buf_release(dev, mw), clg_buf_release(dev, my), clg_buf_release(dev, mdx);
}
END_TEST

/* AUTO resolves to a supported algorithm per pass, remembers it in the layer
 * cache and in conv-algos-*.json under the cache directory, and computes the
 * right result. */
START_TEST(auto_choice)
{
    clg_device *dev = dev0();
    clg_rng r;
    tu_rng(&r, 18);
    clg_conv_shape s = {.N = 2, .C = 4, .H = 9, .W = 8, .K = 5, .R = 3, .S = 3, .pad_h = 1, .pad_w = 1,
                        .stride_h = 1, .stride_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1};
    s.C = irand(&r, 2, 6); /* a fresh shape key most runs (the cache directory persists) */
    s.H = irand(&r, 9, 40), s.W = irand(&r, 8, 40);
    if (g_tiny) /* oclgrind: AUTO times every candidate 4 times per pass */
        s.N = 1, s.K = 2, s.H = 5, s.W = 5, s.C = irand(&r, 1, 3);
    size_t nx = cr_nx(&s), nw = cr_nw(&s), ny = cr_ny(&s);
    float *x = rnd(nx, &r), *w = rnd(nw, &r), *got = malloc(sizeof(float) * ny);
    double *ref = malloc(sizeof(double) * ny);
    cl_mem mx = tu_upload(dev, x, nx), mw = tu_upload(dev, w, nw), my = tu_upload(dev, NULL, ny);
    clg_conv_cache cache;
    memset(&cache, 0, sizeof cache);
    /* deferred (as the clgrad program runs): a new shape's first use runs the
     * untuned default, unmeasured and not remembered in the layer cache
     * (clg_conv_auto_choose); the second measures */
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "conv_auto_defer", "1"), CLG_OK);
    ck_assert_int_eq(clg_conv_forward(dev, &s, CLG_CONV_AUTO, &cache, mx, 0, mw, 0, NULL, 0, 1, my, 0), CLG_OK);
    if (cache.chosen[CLG_CONV_FWD] != CLG_CONV_AUTO) /* measured by an earlier run after all (1 in ~5000) */
        fprintf(stderr, "auto_choice: shape measured before; the deferred first use is not exercised this run\n");
    tu_download(dev, my, got, ny);
    cr_fwd(&s, x, w, NULL, 1, ref);
    ck_assert_double_lt(tu_max_err(got, ref, ny, 1.0), 1e-4);
    tu_write_full(dev, my, NULL, ny); /* poisoned again */
    ck_assert_int_eq(clg_conv_forward(dev, &s, CLG_CONV_AUTO, &cache, mx, 0, mw, 0, NULL, 0, 1, my, 0), CLG_OK);
    ck_assert_int_ne(cache.chosen[CLG_CONV_FWD], CLG_CONV_AUTO);
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "conv_auto_defer", "0"), CLG_OK);
    ck_assert(clg_conv_algo_supported(cache.chosen[CLG_CONV_FWD], &s, CLG_CONV_FWD));
    tu_download(dev, my, got, ny);
    cr_fwd(&s, x, w, NULL, 1, ref);
    ck_assert_double_lt(tu_max_err(got, ref, ny, 1.0), 1e-4);
    /* the measurement cache file exists and names an algorithm */
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "grep -l '\"algo\"' %s/conv-algos-*.json >/dev/null 2>&1", g_ctx->cache_dir);
    if (g_ctx->use_cache) /* CLGRAD_CACHE=0 (oclgrind run) keeps the choice in memory only */
        ck_assert_msg(system(cmd) == 0, "no conv-algos-*.json with entries under %s", g_ctx->cache_dir);
    /* backward passes via auto without a layer cache */
    cl_mem mdx = tu_upload(dev, NULL, nx), mdw = tu_upload(dev, NULL, nw);
    /* tiny (oclgrind): AUTO on the forward pass only, since choosing times
     * every candidate four times per pass (minutes there) */
    clg_conv_algo ab = g_tiny ? CLG_CONV_IM2COL : CLG_CONV_AUTO;
    ck_assert_int_eq(clg_conv_backward_data(dev, &s, ab, NULL, my, 0, mw, 0, mdx, 0), CLG_OK);
    ck_assert_int_eq(clg_conv_backward_filter(dev, &s, ab, mx, 0, my, 0, 0.0f, mdw, 0, NULL, 0), CLG_OK);
    float *gx = malloc(sizeof(float) * nx), *gw = malloc(sizeof(float) * nw), *yy = malloc(sizeof(float) * ny);
    double *rx = malloc(sizeof(double) * nx), *rw = malloc(sizeof(double) * nw), dbb[8];
    tu_download(dev, my, yy, ny);
    tu_download(dev, mdx, gx, nx);
    tu_download(dev, mdw, gw, nw);
    cr_bwd_data(&s, yy, w, rx);
    cr_bwd_filter(&s, x, yy, 0.0f, NULL, rw, dbb, NULL);
    ck_assert_double_lt(tu_max_err(gx, rx, nx, 1.0), 1e-4);
    ck_assert_double_lt(tu_max_err(gw, rw, nw, 1.0), 1e-4);
    clg_conv_cache_free(dev, &cache);
    free(x), free(w), free(got), free(ref), free(gx), free(gw), free(yy), free(rx), free(rw);
    clg_buf_release(dev, mx), clg_buf_release(dev, mw), clg_buf_release(dev, my);
    clg_buf_release(dev, mdx), clg_buf_release(dev, mdw);
}
END_TEST

START_TEST(argument_errors)
{
    clg_device *dev = dev0();
    clg_conv_shape s = {.N = 1, .C = 4, .H = 5, .W = 5, .K = 6, .R = 3, .S = 3, .pad_h = 0, .pad_w = 0,
                        .stride_h = 1, .stride_w = 1, .dil_h = 1, .dil_w = 1, .groups = 3};
    ck_assert_int_eq(clg_conv_check(&g_ctx->err, &s), CLG_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(clg_last_error(g_ctx), "groups"));
    s.groups = 2;
    ck_assert_int_eq(clg_conv_check(&g_ctx->err, &s), CLG_OK);
    ck_assert_int_eq(clg_conv_out_h(&s), 3);
    s.H = 1;
    ck_assert_int_le(clg_conv_out_h(&s), 0);
    ck_assert_int_eq(clg_conv_check(&g_ctx->err, &s), CLG_ERR_SHAPE);
    s.H = 5;
    s.stride_h = 0;
    ck_assert_int_eq(clg_conv_check(&g_ctx->err, &s), CLG_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(clg_last_error(g_ctx), "stride_h"));
    s.stride_h = 2;
    /* Winograd cannot run strided or grouped shapes: a clear error, no crash */
    cl_mem m = tu_upload(dev, NULL, 256);
    ck_assert_int_eq(clg_conv_forward(dev, &s, CLG_CONV_WINOGRAD, NULL, m, 0, m, 0, NULL, 0, 0, m, 0),
                     CLG_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(clg_last_error(g_ctx), "winograd"));
    ck_assert_int_eq(clg_conv_forward(dev, &s, CLG_CONV_IM2COL, NULL, NULL, 0, m, 0, NULL, 0, 0, m, 0),
                     CLG_ERR_INVALID_ARG);
    clg_conv_algo a;
    ck_assert_int_eq(clg_conv_algo_parse(&g_ctx->err, "winograd4", &a), CLG_OK);
    ck_assert_int_eq(a, CLG_CONV_WINOGRAD4);
    ck_assert_int_eq(clg_conv_algo_parse(&g_ctx->err, "fast", &a), CLG_ERR_INVALID_ARG);
    ck_assert_str_eq(clg_conv_algo_name(CLG_CONV_IM2COL), "im2col");
    clg_buf_release(dev, m);
}
END_TEST

typedef struct algos_seen {
    int n;
    char keys[16][160];
    clg_conv_algo_rec rec[16];
} algos_seen;

static void algos_put(void *user, uint64_t devhash, const char *key, const clg_conv_algo_rec *rec)
{
    (void)devhash;
    algos_seen *a = user;
    ck_assert_int_lt(a->n, 16);
    snprintf(a->keys[a->n], sizeof a->keys[a->n], "%s", key);
    a->rec[a->n++] = *rec;
}

/* The algorithm cache file reads back every entry the saver wrote (not only
 * the first) with its trust fields, reads a version-2 entry (no trust
 * fields) as unconfirmed, and skips entries of another device and malformed
 * lines. */
START_TEST(algo_cache_file)
{
    clg_rng r;
    tu_rng(&r, 77);
    uint64_t dev = ((uint64_t)clg_rng_u32(&r) << 32) | clg_rng_u32(&r), other = dev ^ (1ull << (clg_rng_u32(&r) % 64));
    const clg_conv_algo algos[] = {CLG_CONV_IM2COL, CLG_CONV_DIRECT, CLG_CONV_WINOGRAD, CLG_CONV_WINOGRAD4};
    int n = 3 + (int)(clg_rng_u32(&r) % 6), want = 0;
    char keys[16][160], wkeys[16][160];
    clg_conv_algo_rec wanted[16];
    clg_sbuf b = {0};
    clg_sbuf_printf(&b, "{\"format\": \"clgrad-conv-algos\", \"version\": 3, \"entries\": [\n");
    for (int i = 0; i < n; i++) {
        int mine = i == 0 || clg_rng_u32(&r) % 3 != 0;
        snprintf(keys[i], sizeof keys[i], "v3:fwd:n%d,c%u", i, clg_rng_u32(&r) % 1000);
        clg_conv_algo_rec rec = {.algo = algos[clg_rng_u32(&r) % CLG_ARRAY_LEN(algos)],
                                 .ms = 0.1 + clg_rng_uniform(&r),
                                 .margin = clg_rng_uniform(&r),
                                 .spread = clg_rng_uniform(&r),
                                 .load = clg_rng_uniform(&r) * 2,
                                 .n = 1 + (int)(clg_rng_u32(&r) % 256),
                                 .conf = (int)(clg_rng_u32(&r) % 2),
                                 .tries = (int)(clg_rng_u32(&r) % 3),
                                 .rev = (int)(clg_rng_u32(&r) % 9),
                                 .slow = (int)(clg_rng_u32(&r) % 2),
                                 .gemm = (double)clg_rng_u32(&r)};
        clg_conv_algos_format(&b, i == 0, mine ? dev : other, keys[i], &rec);
        if (mine) {
            memcpy(wkeys[want], keys[i], sizeof keys[i]);
            wanted[want++] = rec;
        }
        if (i == 1) { /* a damaged line and an old-format entry (no device) in between */
            clg_sbuf_printf(&b, ", {\"key\": \"v3:x\", \"algo\": \"im2col\", \"ms\": 1.0, \"dev\": \"zz\"}\n"
                                ", {\"key\": \"v3:y\", \"algo\": \"im2col\", \"ms\": 1.0}\n");
            /* a version-2 entry of this device: read, unconfirmed */
            clg_sbuf_printf(&b, ", {\"key\": \"v5:old\", \"algo\": \"direct\", \"ms\": 2.5, \"dev\": \"%016llx\"}\n",
                            (unsigned long long)dev);
            snprintf(wkeys[want], sizeof wkeys[want], "v5:old");
            wanted[want++] =
                (clg_conv_algo_rec){.algo = CLG_CONV_DIRECT, .ms = 2.5, .margin = -1, .load = -1, .gemm = -1};
        }
    }
    clg_sbuf_printf(&b, "]}\n");
    ck_assert(!b.oom);
    algos_seen seen = {0};
    ck_assert_int_eq(clg_conv_algos_parse(b.data, dev, algos_put, &seen), want);
    ck_assert_int_eq(seen.n, want);
    for (int i = 0; i < want; i++) {
        const clg_conv_algo_rec *g = &seen.rec[i], *w = &wanted[i];
        ck_assert_str_eq(seen.keys[i], wkeys[i]);
        ck_assert_int_eq(g->algo, w->algo);
        ck_assert_double_eq_tol(g->ms, w->ms, 1e-4);
        ck_assert_double_eq_tol(g->margin, w->margin, 1e-4);
        ck_assert_double_eq_tol(g->spread, w->spread, 1e-4);
        ck_assert_double_eq_tol(g->load, w->load, 1e-3);
        ck_assert_int_eq(g->n, w->n);
        ck_assert_int_eq(g->conf, w->conf);
        ck_assert_int_eq(g->tries, w->tries);
        ck_assert_int_eq(g->rev, w->rev);
        ck_assert_int_eq(g->slow, w->slow);
        ck_assert_msg(g->gemm == w->gemm, "GEMM stamp %.0f read back as %.0f", w->gemm, g->gemm);
    }
    clg_sbuf_free(&b);
}
END_TEST

/* ---- trust in a cached measurement: re-measured when timed under load,
 * by a near tie, in an older file version, or slow in training ---- */

static int g_favour, g_timed;
static double g_favour_ms, g_load;
static char g_algo_dir[256]; /* a private algorithm cache file (the programs stay in the shared cache) */

static double trust_timer(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo, clg_conv_pass pass)
{
    (void)dev, (void)s, (void)pass;
    g_timed++;
    return algo == (clg_conv_algo)g_favour ? g_favour_ms : 1.0;
}

static double trust_load(void) { return g_load; }

/* One forward pass of s through AUTO with a new layer cache, checked against
 * the reference; the algorithm it resolved to. */
static clg_conv_algo trust_forward(const clg_conv_shape *s, clg_rng *r)
{
    clg_device *dev = dev0();
    size_t nx = cr_nx(s), nw = cr_nw(s), ny = cr_ny(s);
    float *x = rnd(nx, r), *w = rnd(nw, r), *got = malloc(sizeof(float) * ny);
    double *ref = malloc(sizeof(double) * ny);
    cl_mem mx = tu_upload(dev, x, nx), mw = tu_upload(dev, w, nw), my = tu_upload(dev, NULL, ny);
    tu_write_full(dev, my, NULL, ny); /* poisoned */
    clg_conv_cache cache;
    memset(&cache, 0, sizeof cache);
    ck_assert_int_eq(clg_conv_forward(dev, s, CLG_CONV_AUTO, &cache, mx, 0, mw, 0, NULL, 0, 1, my, 0), CLG_OK);
    tu_download(dev, my, got, ny);
    cr_fwd(s, x, w, NULL, 1, ref);
    ck_assert_double_lt(tu_max_err(got, ref, ny, 1.0), 1e-4);
    clg_conv_algo a = cache.chosen[CLG_CONV_FWD];
    clg_conv_cache_free(dev, &cache);
    clg_buf_release(dev, mx), clg_buf_release(dev, mw), clg_buf_release(dev, my);
    free(x), free(w), free(got), free(ref);
    return a;
}

/* A run in a new process (the tables dropped): the favoured algorithm times
 * fav_ms against 1.0 for the others under load signal `load`; a second layer
 * of the same shape in the same run never measures again. */
static clg_conv_algo trust_run(const clg_conv_shape *s, clg_rng *r, int fav, double fav_ms, double load, int *timed)
{
    clg_conv_auto_forget();
    g_favour = fav, g_favour_ms = fav_ms, g_load = load, g_timed = 0;
    clg_conv_algo a = trust_forward(s, r);
    *timed = g_timed;
    ck_assert_int_eq(trust_forward(s, r), a);
    ck_assert_msg(g_timed == *timed, "a shape was measured twice in one run");
    return a;
}

static uint64_t dev_hash0(void)
{
    char fp[700];
    clg_device_fingerprint(dev0(), fp, sizeof fp);
    return clg_hash_str(fp, CLG_HASH_SEED);
}

static void trust_path(char *dst, size_t n)
{
    snprintf(dst, n, "%s/conv-algos-%016llx.json", g_algo_dir, (unsigned long long)dev_hash0());
}

typedef struct {
    char pat[160];
    int found;
    clg_conv_algo_rec rec;
} rec_find;

static void rec_put(void *user, uint64_t devhash, const char *key, const clg_conv_algo_rec *rec)
{
    (void)devhash;
    rec_find *f = user;
    if (strstr(key, f->pat))
        f->found = 1, f->rec = *rec;
}

static void shape_pat(const clg_conv_shape *s, char *dst, size_t n)
{
    snprintf(dst, n, ":fwd:n%d,c%d,h%d,w%d,k%d,r3,s3,", s->N, s->C, s->H, s->W, s->K);
}

/* The cache file's record of s's forward choice. */
static clg_conv_algo_rec trust_rec(const clg_conv_shape *s)
{
    char path[1200];
    trust_path(path, sizeof path);
    char *text = NULL;
    size_t len = 0;
    clg_err err;
    ck_assert_msg(clg_file_read(&err, path, &text, &len) == CLG_OK, "%s", err.msg);
    ck_assert_msg(strstr(text, "\"version\": 3,") != NULL, "cache file not rewritten as version 3");
    rec_find f = {0};
    shape_pat(s, f.pat, sizeof f.pat);
    clg_conv_algos_parse(text, dev_hash0(), rec_put, &f);
    free(text);
    ck_assert_msg(f.found, "no cache entry for %s", f.pat);
    return f.rec;
}

/* Rewrites the cache file as an older clgrad wrote it: version 2, and s's
 * entry (naming algo) without the trust fields. */
static void trust_make_old(const clg_conv_shape *s, clg_conv_algo algo)
{
    char path[1200], pat[160];
    trust_path(path, sizeof path);
    shape_pat(s, pat, sizeof pat);
    int lk = clg_file_lock(path, 10.0);
    char *text = NULL;
    size_t len = 0;
    clg_err err;
    ck_assert_msg(clg_file_read(&err, path, &text, &len) == CLG_OK, "%s", err.msg);
    clg_sbuf b = {0};
    int replaced = 0;
    for (char *line = text; *line;) {
        size_t l = strcspn(line, "\n");
        char *next = line + l + (line[l] == '\n');
        line[l] = 0;
        char *v = strstr(line, "\"version\": 3,");
        if (v && line == text)
            clg_sbuf_printf(&b, "%.*s\"version\": 2,%s\n", (int)(v - line), line, v + strlen("\"version\": 3,"));
        else if (strstr(line, pat)) {
            char *al = strstr(line, "\"algo\""), *dev = strstr(line, "\"dev\": \"");
            ck_assert(al && dev);
            clg_sbuf_printf(&b, "%.*s\"algo\": \"%s\", \"ms\": 0.5, %.25s}\n", (int)(al - line), line,
                            clg_conv_algo_name(algo), dev);
            replaced = 1;
        } else
            clg_sbuf_printf(&b, "%s\n", line);
        line = next;
    }
    ck_assert(replaced && !b.oom);
    ck_assert_msg(clg_file_write_atomic(&err, path, b.data, b.len) == CLG_OK, "%s", err.msg);
    clg_file_unlock(lk);
    clg_sbuf_free(&b);
    free(text);
}

START_TEST(auto_trust)
{
    if (!g_ctx->use_cache || g_ctx->cache_readonly) {
        fprintf(stderr, "auto_trust: needs a writable cache\n");
        return;
    }
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "conv_auto_defer", "0"), CLG_OK);
    clg_rng r;
    tu_rng(&r, 0);
    snprintf(g_algo_dir, sizeof g_algo_dir, "/tmp/clgrad-trust-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_algo_dir));
    clg_conv_auto_set_timer(trust_timer);
    clg_conv_auto_set_load(trust_load, g_algo_dir);
    /* a fixed geometry (its kernels built once into the shared cache), one batch size per case */
    clg_conv_shape s = {.N = 1, .C = 12, .H = 10, .W = 10, .K = 4,
                        .R = 3, .S = 3, .pad_h = 1, .pad_w = 1, .stride_h = 1, .stride_w = 1, .dil_h = 1,
                        .dil_w = 1, .groups = 1};
    const int A = CLG_CONV_IM2COL, B = CLG_CONV_WINOGRAD;
    int timed;
    clg_conv_algo_rec rec;
    /* 1. filled under load: unconfirmed; the next run (quiet) re-measures and replaces it; then kept */
    s.N = 1;
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 2.0, &timed), A);
    ck_assert_int_gt(timed, 0);
    rec = trust_rec(&s);
    ck_assert(!rec.conf && rec.tries == 0 && fabs(rec.load - 2.0) < 1e-3 && fabs(rec.margin - 1.0) < 1e-3);
    ck_assert_int_eq(trust_run(&s, &r, B, 0.5, 0.0, &timed), B);
    ck_assert_msg(timed > 0, "an entry measured under load was not measured again");
    rec = trust_rec(&s);
    ck_assert(rec.conf && rec.tries == 1 && rec.algo == (clg_conv_algo)B);
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 2.0, &timed), B);
    ck_assert_msg(timed == 0, "a confirmed entry was measured again");
    /* 2. filled quietly with a clear margin: kept without re-measuring */
    s.N = 2;
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 0.0, &timed), A);
    ck_assert(trust_rec(&s).conf);
    ck_assert_int_eq(trust_run(&s, &r, B, 0.5, 0.0, &timed), A);
    ck_assert_int_eq(timed, 0);
    /* 3. a near tie (1%), quiet: unconfirmed, re-measured once */
    s.N = 3;
    ck_assert_int_eq(trust_run(&s, &r, A, 0.99, 0.0, &timed), A);
    ck_assert(!trust_rec(&s).conf);
    ck_assert_int_eq(trust_run(&s, &r, B, 0.5, 0.0, &timed), B);
    ck_assert(timed > 0 && trust_rec(&s).conf);
    /* 4. loaded every time, the winners disagreeing: the less loaded kept,
     * confirmed after 2 re-measurements, then never measured again */
    s.N = 4;
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 2.0, &timed), A);
    ck_assert_int_eq(trust_run(&s, &r, B, 0.5, 1.0, &timed), B);
    rec = trust_rec(&s);
    ck_assert(timed > 0 && !rec.conf && rec.tries == 1 && rec.algo == (clg_conv_algo)B);
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 3.0, &timed), B);
    rec = trust_rec(&s);
    ck_assert(timed > 0 && rec.conf && rec.tries == 2 && fabs(rec.load - 1.0) < 1e-3);
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 3.0, &timed), B);
    ck_assert_int_eq(timed, 0);
    /* 5. loaded twice, agreeing: confirmed */
    s.N = 5;
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 2.0, &timed), A);
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 2.0, &timed), A);
    ck_assert(timed > 0 && trust_rec(&s).conf);
    /* 6. a version-2 file: read (its choice serves), the entry re-measured once, the file rewritten as version 3 */
    s.N = 6;
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 0.0, &timed), A);
    trust_make_old(&s, (clg_conv_algo)A);
    ck_assert_int_eq(trust_run(&s, &r, B, 0.5, 0.0, &timed), B);
    rec = trust_rec(&s);
    ck_assert(timed > 0 && rec.conf && rec.tries == 1);
    ck_assert_msg(trust_rec((clg_conv_shape[]){{.N = 5, .C = s.C, .H = s.H, .W = s.W, .K = s.K}}).conf,
                  "another entry of the version-2 file was lost or not read");
    /* 7. slow in training: 1.2x leaves it, 2x marks it (not measured again in this run), the next run re-measures */
    s.N = 7;
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 0.0, &timed), A);
    ck_assert_int_eq(trust_run(&s, &r, B, 0.5, 0.0, &timed), A);
    clg_conv_auto_observe(dev0(), &s, 0.6, -1, 5);
    ck_assert(trust_rec(&s).conf);
    clg_conv_auto_observe(dev0(), &s, 1.0, -1, 2); /* too few steps */
    ck_assert(trust_rec(&s).conf);
    clg_conv_auto_observe(dev0(), &s, 1.0, -1, 5);
    rec = trust_rec(&s);
    ck_assert(!rec.conf && rec.slow);
    g_timed = 0;
    ck_assert_int_eq(trust_forward(&s, &r), A);
    ck_assert_int_eq(g_timed, 0);
    ck_assert_int_eq(trust_run(&s, &r, B, 0.5, 0.0, &timed), B);
    rec = trust_rec(&s);
    ck_assert(timed > 0 && rec.conf && !rec.slow && rec.tries == 1);
    /* 8. the device's GEMM parameters change (background tuning, clgrad tune): a confirmed choice made
     * under the old ones is measured again once, by the new figures, then kept */
    clg_conv_shape s9 = s;
    s9.N = 12; /* a batch class of its own */
    ck_assert_int_eq(trust_run(&s9, &r, A, 0.5, 0.0, &timed), A);
    s.N = 8;
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 0.0, &timed), A);
    rec = trust_rec(&s);
    double stamp0 = clg_tune_gemm_stamp(dev0());
    ck_assert(rec.conf && rec.gemm == stamp0);
    ck_assert_int_eq(trust_run(&s, &r, B, 0.5, 0.0, &timed), A);
    ck_assert_msg(timed == 0, "a choice was measured again while the GEMM parameters stayed");
    clg_tune_dev *td = clg_tune_dev_get(dev0());
    ck_assert_ptr_nonnull(td);
    int n0 = td->n;
    clg_tune_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.key, sizeof e.key, "gemm/M%uN%uK%u", clg_rng_u32(&r) % 6, clg_rng_u32(&r) % 6, clg_rng_u32(&r) % 6);
    clg_gemm_params gp;
    clg_gemm_params_default(dev0(), &gp);
    clg_gemm_params_to_entry(&gp, &e);
    ck_assert_int_eq(clg_tune_put(dev0(), &e), CLG_OK); /* in memory only: the shared cache's file stays */
    double stamp1 = clg_tune_gemm_stamp(dev0());
    ck_assert(stamp1 != stamp0);
    ck_assert_int_eq(trust_run(&s, &r, B, 0.5, 0.0, &timed), B);
    rec = trust_rec(&s);
    ck_assert_msg(timed > 0, "a choice made under other GEMM parameters was not measured again");
    ck_assert(rec.conf && rec.gemm == stamp1 && rec.algo == (clg_conv_algo)B && rec.tries == 0 && rec.rev == 1);
    ck_assert_int_eq(trust_run(&s, &r, A, 0.5, 0.0, &timed), B);
    ck_assert_int_eq(timed, 0);
    /* ... or by the background tuner (clg_conv_auto_refresh), so the next run does not */
    clg_conv_auto_forget();
    /* at idle priority its load signal counts waits for any process: a clear margin with a small spread is trusted */
    g_favour = B, g_favour_ms = 0.5, g_load = 2.0, g_timed = 0;
    int refreshed = clg_conv_auto_refresh(dev0(), NULL, NULL);
    ck_assert_msg(refreshed >= 1 && g_timed > 0, "refresh measured %d choices", refreshed);
    rec = trust_rec(&s9);
    ck_assert(rec.conf && rec.gemm == stamp1 && rec.algo == (clg_conv_algo)B);
    ck_assert_int_eq(clg_conv_auto_refresh(dev0(), NULL, NULL), 0); /* nothing stale left */
    ck_assert_int_eq(trust_run(&s9, &r, A, 0.5, 0.0, &timed), B);
    ck_assert_int_eq(timed, 0);
    td->n = n0;
    clg_conv_auto_set_timer(NULL);
    clg_conv_auto_set_load(NULL, NULL);
    clg_conv_auto_forget();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_algo_dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    g_tiny = getenv("CLGRAD_TEST_TINY") && atoi(getenv("CLGRAD_TEST_TINY")) != 0;
    g_ctx = tu_ctx(NULL);
    Suite *su = suite_create("conv");
    /* one case per test so CK_RUN_CASE=<name> runs a single one */
    struct {
        const char *name;
        const TTest *fn;
    } tests[] = {
        {"argument_errors", argument_errors},   {"im2col_random", im2col_random},
        {"im2col_1x1_gemm", im2col_1x1_gemm},   {"direct_random", direct_random},
        {"im2col_strided", im2col_strided},
        {"direct_jit_random", direct_jit_random}, {"direct_phases", direct_phases},
        {"direct_1x1_strided", direct_1x1_strided}, {"direct_fwdk_strips", direct_fwdk_strips},
        {"direct_bwdf_blocks", direct_bwdf_blocks},
        {"winograd2_random", winograd2_random}, {"winograd4_random", winograd4_random},
        {"fft_random", fft_random},             {"finite_differences", finite_differences}, {"filter_cache_versions", filter_cache_versions},
        {"auto_choice", auto_choice},           {"algo_cache_file", algo_cache_file},
        {"auto_trust", auto_trust},
    };
    for (size_t i = 0; i < CLG_ARRAY_LEN(tests); i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_set_timeout(tc, 280);
        tcase_add_test(tc, tests[i].fn);
        suite_add_tcase(su, tc);
    }
    int rc = tu_run(su);
    clg_ctx_destroy(g_ctx);
    return rc;
}
