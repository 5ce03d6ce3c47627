/* Fused Winograd convolution ("winograd-fused" F(2x2,3x3), "winograd4-fused"
 * F(4x4,3x3)): forward with bias + ReLU, backward-data and the weight
 * gradient (F(3x3,2x2), F(3x3,4x4)) with beta 0 / 1 / 0.5 against a
 * double-precision host reference on random shapes (odd sizes, channel
 * counts off the kernel's blocking, batch 1, C = 1, padding 0..2), poisoned
 * outputs, the channel-chunked scratch path, the kernel variants, the
 * transformed-filter cache, and the transformed filters themselves (every
 * value and padding channel, in NaN-filled buffers). Error measure: max|got - ref| / max|ref| on
 * N(0,1) data, tolerance 1e-4. CLGRAD_TEST_TINY=1 runs fewer, smaller cases
 * (the oclgrind run). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/conv.h"
#include "conv_ref.h"
#include "testutil.h"

#define TOL 1e-4

static clg_ctx *g_ctx;
static int g_tiny;

static clg_device *dev0(void) { return &g_ctx->devs[0]; }


static int irand(clg_rng *r, int lo, int hi) { return lo + (int)(clg_rng_u32(r) % (uint32_t)(hi - lo + 1)); }

static float *randn(size_t n, clg_rng *r)
{
    float *p = malloc(sizeof(float) * (n + 1));
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = clg_rng_normal(r);
    return p;
}

static double rel_err(const float *got, const double *ref, size_t n)
{
    double emax = 0, rmax = 0;
    for (size_t i = 0; i < n; i++) {
        double e = isfinite(got[i]) ? fabs(got[i] - ref[i]) : INFINITY;
        emax = e > emax ? e : emax;
        rmax = fabs(ref[i]) > rmax ? fabs(ref[i]) : rmax;
    }
    return rmax > 0 ? emax / rmax : emax;
}


static clg_conv_shape wshape(int N, int C, int H, int W, int K, int ph, int pw)
{
    clg_conv_shape s = {.N = N, .C = C, .H = H, .W = W, .K = K, .R = 3, .S = 3, .pad_h = ph, .pad_w = pw,
                        .stride_h = 1, .stride_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1};
    return s;
}

/* Weight gradient of algo (mx, mdy: x and dy uploaded at element offset
 * off) with beta 0 into a poisoned dw, and with beta 1 and 0.5 onto random
 * dw0 / db0 (the bias gradient too); worst relative error. */
static double check_bwd_filter(const clg_conv_shape *s, clg_conv_algo algo, clg_rng *r, const float *x,
                               const float *dy, cl_mem mx, cl_mem mdy, size_t off, const char *desc)
{
    clg_device *dev = dev0();
    size_t nw = cr_nw(s), K = (size_t)s->K;
    float *dw0 = randn(nw, r), *db0 = randn(K, r);
    double *rdw = malloc(sizeof(double) * nw), *rdb = malloc(sizeof(double) * K);
    double worst = 0;
    static const float betas[] = {0.0f, 1.0f, 0.5f};
    for (int bi = 0; bi < 3; bi++) {
        const float beta = betas[bi];
        cl_mem mdw = tu_upload_at(dev, beta != 0.0f ? dw0 : NULL, nw, off);
        cl_mem mdb = tu_upload_at(dev, beta != 0.0f ? db0 : NULL, K, off);
        ck_assert_msg(clg_conv_backward_filter(dev, s, algo, mx, off, mdy, off, beta, mdw, off, mdb, off) ==
                          CLG_OK,
                      "%s bwd-filter %s: %s", clg_conv_algo_name(algo), desc, clg_last_error(g_ctx));
        cr_bwd_filter(s, x, dy, beta, beta != 0.0f ? dw0 : NULL, rdw, rdb, beta != 0.0f ? db0 : NULL);
        float *gw = tu_download_at(dev, mdw, nw, off), *gb = tu_download_at(dev, mdb, K, off);
        double e = fmax(rel_err(gw, rdw, nw), rel_err(gb, rdb, K));
        ck_assert_msg(e < TOL, "%s bwd-filter %s (beta %g): relative error %g >= %g", clg_conv_algo_name(algo), desc,
                      beta, e, TOL);
        worst = fmax(worst, e);
        free(gw), free(gb);
        clg_buf_release(dev, mdw), clg_buf_release(dev, mdb);
    }
    free(dw0), free(db0), free(rdw), free(rdb);
    return worst;
}

/* Forward (passes & 1, random bias/ReLU) and backward-data (passes & 2) of
 * algo on s against the reference; returns the worst relative error. */
static double check_case(const clg_conv_shape *s, clg_conv_algo algo, clg_rng *r, int passes)
{
    clg_device *dev = dev0();
    char desc[160];
    cr_shape_str(s, desc, sizeof desc);
    ck_assert_msg(clg_conv_algo_supported(algo, s,
                                          passes & 1   ? CLG_CONV_FWD
                                          : passes & 2 ? CLG_CONV_BWD_DATA
                                                       : CLG_CONV_BWD_FILTER),
                  "%s should support %s", clg_conv_algo_name(algo), desc);
    size_t nx = cr_nx(s), nw = cr_nw(s), ny = cr_ny(s);
    size_t off = (size_t)irand(r, 0, 5);
    float *x = randn(nx, r), *w = randn(nw, r), *bias = randn((size_t)s->K, r), *dy = randn(ny, r);
    double *ref = malloc(sizeof(double) * (nx > ny ? nx : ny));
    cl_mem mx = tu_upload_at(dev0(), x, nx, off), mw = tu_upload_at(dev0(), w, nw, off), mb = tu_upload_at(dev0(), bias, (size_t)s->K, off);
    cl_mem mdy = tu_upload_at(dev0(), dy, ny, off);
    double worst = 0;
    if (passes & 1) {
        int relu = irand(r, 0, 1), use_bias = irand(r, 0, 1);
        cl_mem my = tu_upload_at(dev0(), NULL, ny, off);
        ck_assert_msg(clg_conv_forward(dev, s, algo, NULL, mx, off, mw, off, use_bias ? mb : NULL, off, relu, my,
                                       off) == CLG_OK,
                      "%s fwd %s: %s", clg_conv_algo_name(algo), desc, clg_last_error(g_ctx));
        float *got = tu_download_at(dev0(), my, ny, off);
        cr_fwd(s, x, w, use_bias ? bias : NULL, relu, ref);
        double e = rel_err(got, ref, ny);
        ck_assert_msg(e < TOL, "%s fwd %s (bias %d relu %d): relative error %g >= %g", clg_conv_algo_name(algo), desc,
                      use_bias, relu, e, TOL);
        worst = fmax(worst, e);
        free(got);
        clg_buf_release(dev, my);
    }
    if (passes & 2) {
        cl_mem mdx = tu_upload_at(dev0(), NULL, nx, off);
        ck_assert_msg(clg_conv_backward_data(dev, s, algo, NULL, mdy, off, mw, off, mdx, off) == CLG_OK,
                      "%s bwd-data %s: %s", clg_conv_algo_name(algo), desc, clg_last_error(g_ctx));
        float *got = tu_download_at(dev0(), mdx, nx, off);
        cr_bwd_data(s, dy, w, ref);
        double e = rel_err(got, ref, nx);
        ck_assert_msg(e < TOL, "%s bwd-data %s: relative error %g >= %g", clg_conv_algo_name(algo), desc, e, TOL);
        worst = fmax(worst, e);
        free(got);
        clg_buf_release(dev, mdx);
    }
    if (passes & 4)
        worst = fmax(worst, check_bwd_filter(s, algo, r, x, dy, mx, mdy, off, desc));
    if (getenv("CLGRAD_TEST_VERBOSE"))
        fprintf(stderr, "%s %s: worst relative error %.3g\n", clg_conv_algo_name(algo), desc, worst);
    clg_buf_release(dev, mx), clg_buf_release(dev, mw), clg_buf_release(dev, mb), clg_buf_release(dev, mdy);
    free(x), free(w), free(bias), free(dy), free(ref);
    return worst;
}

/* Random 3x3 shapes: odd sizes, channel counts off the 8-channel blocking,
 * batch 1 and C = 1 cases, padding i % 3. */
static void random_cases(clg_conv_algo algo, uint64_t stream, int passes)
{
    clg_rng r;
    tu_rng(&r, stream);
    int n = g_tiny ? 3 : 8;
    for (int i = 0; i < n; i++) {
        int pad = i % 3;
        int big = !g_tiny;
        clg_conv_shape s = wshape(irand(&r, 1, 2 + big), irand(&r, 1, 5 + 14 * big), irand(&r, 3, 7 + 10 * big),
                                  irand(&r, 3, 7 + 10 * big), irand(&r, 1, 5 + 14 * big), pad, pad);
        if (i == 1)
            s.N = 1;
        if (i == 2)
            s.C = 1;
        if (i == 3) { /* rectangular, mixed padding */
            s.pad_h = 0;
            s.pad_w = 2;
        }
        if (i == 4 && !g_tiny) { /* many tile blocks per image, K with a partial block */
            s.H = irand(&r, 25, 33) | 1;
            s.W = irand(&r, 25, 33) | 1;
            s.K = 8 * irand(&r, 1, 2) + 3;
        }
        if (clg_conv_check(NULL, &s) != CLG_OK || s.H + 2 * s.pad_h < 3 || s.W + 2 * s.pad_w < 3)
            continue;
        check_case(&s, algo, &r, passes);
    }
}

START_TEST(fused2_forward) { random_cases(CLG_CONV_WINOGRAD_FUSED, 41, 1); }
END_TEST
START_TEST(fused4_forward) { random_cases(CLG_CONV_WINOGRAD4_FUSED, 42, 1); }
END_TEST
START_TEST(fused2_backward_data) { random_cases(CLG_CONV_WINOGRAD_FUSED, 43, 2); }
END_TEST
START_TEST(fused4_backward_data) { random_cases(CLG_CONV_WINOGRAD4_FUSED, 44, 2); }
END_TEST
START_TEST(fused2_backward_filter)
{
    if (!g_tiny) /* oclgrind: the first two shapes below */
        random_cases(CLG_CONV_WINOGRAD_FUSED, 48, 4);
    /* several chunks per work-item, chunks across tile rows and images,
     * partial 8-tile groups; 2 x 4-tile groups (<= 8 columns); N = 1, C = 1 */
    clg_rng r;
    tu_rng(&r, 49);
    clg_conv_shape s = g_tiny ? wshape(1, 3, 5, 11, 2, 1, 1) : wshape(3, 20, 33, 31, 22, 1, 1);
    check_case(&s, CLG_CONV_WINOGRAD_FUSED, &r, 4);
    /* outputs of <= 8 columns: groups of 4 tiles in each of 2 tile rows, an odd
     * count of tile rows (the last group's second row past the output) */
    s = g_tiny ? wshape(1, 2, 5, 6, 3, 1, 1) : wshape(3, 19, 9, 7, 21, 1, 1);
    check_case(&s, CLG_CONV_WINOGRAD_FUSED, &r, 4);
    if (g_tiny) /* oclgrind: small shapes (CI time) */
        return;
    s = wshape(1, 1, 9, 8, 7, 2, 0);
    check_case(&s, CLG_CONV_WINOGRAD_FUSED, &r, 4);
    s = wshape(4, 64, 8, 8, 64, 1, 1); /* ResNet-20 stage 3 (batch 4): 2 x 4 tiles per group, all lanes used */
    check_case(&s, CLG_CONV_WINOGRAD_FUSED, &r, 4);
    s = wshape(2, 5, 2, 7, 6, 1, 1); /* one tile row: groups of 4 tiles in one row */
    check_case(&s, CLG_CONV_WINOGRAD_FUSED, &r, 4);
}
END_TEST

/* winograd4-fused weight gradient, F(3x3, 4x4): groups of 8 tiles in one
 * tile row (outputs wider than 16 columns, partial groups past 32), of 2 x 4
 * tiles (9..16 columns) and of 4 x 2 tiles (<= 8 columns, tile rows of
 * several images in one group, segments past the batch); odd sizes,
 * channel counts off the 4-channel blocking, padding 0..2, several chunks
 * per work-item. Max error measured against the double reference on N(0,1)
 * data: ~3e-6 (F(3x3, 2x2): ~3e-7). */
START_TEST(fused4_backward_filter)
{
    if (!g_tiny)
        random_cases(CLG_CONV_WINOGRAD4_FUSED, 50, 4);
    clg_rng r;
    tu_rng(&r, 51);
    clg_conv_shape s = g_tiny ? wshape(1, 3, 5, 19, 2, 1, 1) : wshape(2, 6, 37, 41, 5, 1, 1); /* 8 tiles a row */
    check_case(&s, CLG_CONV_WINOGRAD4_FUSED, &r, 4);
    s = g_tiny ? wshape(3, 2, 5, 6, 3, 1, 1) : wshape(3, 9, 9, 7, 13, 1, 1); /* 4 x 2 tiles, 3 tile rows an image */
    check_case(&s, CLG_CONV_WINOGRAD4_FUSED, &r, 4);
    s = g_tiny ? wshape(1, 2, 7, 11, 3, 0, 0) : wshape(3, 19, 13, 14, 21, 0, 0); /* 2 x 4 tiles */
    check_case(&s, CLG_CONV_WINOGRAD4_FUSED, &r, 4);
    if (g_tiny) /* oclgrind: small shapes (CI time) */
        return;
    s = wshape(1, 1, 9, 8, 7, 2, 0);
    check_case(&s, CLG_CONV_WINOGRAD4_FUSED, &r, 4);
    s = wshape(4, 64, 8, 8, 64, 1, 1); /* ResNet-20 stage 3 (batch 4) */
    check_case(&s, CLG_CONV_WINOGRAD4_FUSED, &r, 4);
    s = wshape(2, 5, 2, 7, 6, 1, 1); /* one tile row */
    check_case(&s, CLG_CONV_WINOGRAD4_FUSED, &r, 4);
    s = wshape(8, 40, 32, 32, 40, 1, 1); /* two chunks per work-item, chunks across images */
    double e = check_case(&s, CLG_CONV_WINOGRAD4_FUSED, &r, 4);
    ck_assert_msg(e < 2e-5, "winograd4-fused bwd-filter 8x40x32x32: relative error %g", e);
}
END_TEST

/* VGG-S conv1 style: one input channel, 28x28 (small batch). */
START_TEST(single_input_channel)
{
    clg_rng r;
    tu_rng(&r, 45);
    clg_conv_shape s = g_tiny ? wshape(1, 1, 9, 10, 3, 1, 1) : wshape(2, 1, 28, 28, 32, 1, 1);
    check_case(&s, CLG_CONV_WINOGRAD_FUSED, &r, 3);
    check_case(&s, CLG_CONV_WINOGRAD4_FUSED, &r, 3);
}
END_TEST

/* Lanes over whole tile rows (the shuffle path of wf_conv): 8 consecutive
 * tiles of one tile row (>= 8 tiles per row, rows with and without a partial
 * last group), F(4x4) half groups (4 tiles per row: two tile rows per 8
 * lanes) with whole and partial output tiles, padding 0 and 1, batch 1 and
 * 3, channel counts off the blocking; forward and backward-data, poisoned
 * outputs against the double-precision reference. */
START_TEST(row_groups)
{
    clg_rng r;
    tu_rng(&r, 50);
    static const int shapes[][6] = {
        /* N, C, H, W, K, pad */
        {3, 5, 32, 35, 7, 1},  /* 9 tiles per row: row groups and gathered groups */
        {1, 9, 34, 34, 11, 0}, /* 8 tiles per row, pad 0 */
        {3, 13, 16, 16, 6, 1}, /* half groups, whole tiles */
        {3, 6, 14, 15, 10, 1}, /* half groups, partial last tile row and column */
        {1, 3, 18, 17, 5, 0},  /* half groups, pad 0, partial last column */
    };
    static const int tiny[][6] = {{1, 2, 6, 32, 3, 1}, {1, 2, 8, 16, 3, 1}};
    int n = g_tiny ? 2 : (int)CLG_ARRAY_LEN(shapes);
    for (int i = 0; i < n; i++) {
        const int *v = g_tiny ? tiny[i] : shapes[i];
        clg_conv_shape s = wshape(v[0], v[1], v[2], v[3], v[4], v[5], v[5]);
        check_case(&s, CLG_CONV_WINOGRAD4_FUSED, &r, 3);
        check_case(&s, CLG_CONV_WINOGRAD_FUSED, &r, 3);
    }
}
END_TEST

/* Scratch too small for all channels: channel chunks accumulated in the
 * scratch, groups of channel blocks, inputs re-transformed per group. Also
 * the other kernel variants (tiles per work-item, channels per block,
 * work-group size) and the error when even one chunk cannot fit. */
START_TEST(chunked_and_variants)
{
    clg_rng r;
    tu_rng(&r, 46);
    clg_conv_shape s = g_tiny ? wshape(1, 11, 6, 7, 9, 1, 1) : wshape(2, 37, 11, 13, 21, 1, 1);
    /* F(4x4): 14 channel slots of 16 tiles; F(2x2): 32 */
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "wfused_scratch_kb", "32"), CLG_OK);
    check_case(&s, CLG_CONV_WINOGRAD4_FUSED, &r, 3);
    check_case(&s, CLG_CONV_WINOGRAD_FUSED, &r, 3);
    /* below one channel + one block for F(4x4) */
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "wfused_scratch_kb", "8"), CLG_OK);
    size_t nx = cr_nx(&s), nw = cr_nw(&s), ny = cr_ny(&s);
    cl_mem mx = tu_upload(dev0(), NULL, nx), mw = tu_upload(dev0(), NULL, nw), my = tu_upload(dev0(), NULL, ny);
    ck_assert_int_eq(clg_conv_forward(dev0(), &s, CLG_CONV_WINOGRAD4_FUSED, NULL, mx, 0, mw, 0, NULL, 0, 0, my, 0),
                     CLG_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(clg_last_error(g_ctx), "winograd-fused"));
    clg_buf_release(dev0(), mx), clg_buf_release(dev0(), mw), clg_buf_release(dev0(), my);
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "wfused_scratch_kb", "256"), CLG_OK);
    static const char *variants[][3] = {{"1", "4", "1"}, {"1", "16", "2"}, {"4", "8", "1"}};
    int nv = g_tiny ? 1 : 3;
    for (int v = 0; v < nv; v++) {
        ck_assert_int_eq(clg_ctx_option_set(g_ctx, "wfused_nt", variants[v][0]), CLG_OK);
        ck_assert_int_eq(clg_ctx_option_set(g_ctx, "wfused_kb", variants[v][1]), CLG_OK);
        ck_assert_int_eq(clg_ctx_option_set(g_ctx, "wfused_wgs", variants[v][2]), CLG_OK);
        check_case(&s, CLG_CONV_WINOGRAD4_FUSED, &r, 3);
        check_case(&s, CLG_CONV_WINOGRAD_FUSED, &r, 1);
    }
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "wfused_nt", "2"), CLG_OK);
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "wfused_kb", "auto"), CLG_OK);
    ck_assert_int_eq(clg_ctx_option_set(g_ctx, "wfused_wgs", "1"), CLG_OK);
}
END_TEST

/* Transformed filters are reused while weights_version is unchanged and
 * rebuilt after it changes (forward and backward-data slots). */
START_TEST(filter_cache_versions)
{
    clg_device *dev = dev0();
    clg_rng r;
    tu_rng(&r, 47);
    clg_conv_shape s = wshape(2, 5, 9, 7, 6, 1, 1);
    size_t nx = cr_nx(&s), nw = cr_nw(&s), ny = cr_ny(&s);
    float *x = randn(nx, &r), *w1 = randn(nw, &r), *w2 = randn(nw, &r), *gy = randn(ny, &r);
    float *got = malloc(sizeof(float) * (nx + ny));
    double *ref = malloc(sizeof(double) * (nx + ny));
    cl_mem mx = tu_upload(dev0(), x, nx), mw = tu_upload(dev0(), w1, nw), my = tu_upload(dev0(), NULL, ny);
    cl_mem mgy = tu_upload(dev0(), gy, ny), mdx = tu_upload(dev0(), NULL, nx);
    clg_conv_cache cache;
    memset(&cache, 0, sizeof cache);
    clg_conv_algo algos[] = {CLG_CONV_WINOGRAD_FUSED, CLG_CONV_WINOGRAD4_FUSED};
    for (size_t ai = 0; ai < 2; ai++) {
        clg_conv_algo a = algos[ai];
        tu_write_full(dev0(), mw, w1, nw);
        cache.weights_version++;
        ck_assert_int_eq(clg_conv_forward(dev, &s, a, &cache, mx, 0, mw, 0, NULL, 0, 0, my, 0), CLG_OK);
        ck_assert_ptr_nonnull(cache.transformed[a]);
        ck_assert(cache.built_version[a] == cache.weights_version);
        ck_assert_int_eq(clg_conv_backward_data(dev, &s, a, &cache, mgy, 0, mw, 0, mdx, 0), CLG_OK);
        ck_assert(cache.built_version_bwd[a] == cache.weights_version);
        /* new weights without a version bump: both cached transforms (w1) still used */
        tu_write_full(dev0(), mw, w2, nw);
        ck_assert_int_eq(clg_conv_forward(dev, &s, a, &cache, mx, 0, mw, 0, NULL, 0, 0, my, 0), CLG_OK);
        tu_download(dev, my, got, ny);
        cr_fwd(&s, x, w1, NULL, 0, ref);
        ck_assert_double_lt(rel_err(got, ref, ny), TOL);
        ck_assert_int_eq(clg_conv_backward_data(dev, &s, a, &cache, mgy, 0, mw, 0, mdx, 0), CLG_OK);
        tu_download(dev, mdx, got, nx);
        cr_bwd_data(&s, gy, w1, ref);
        ck_assert_double_lt(rel_err(got, ref, nx), TOL);
        /* after the bump the new weights are used, and the result changes */
        cache.weights_version++;
        ck_assert_int_eq(clg_conv_forward(dev, &s, a, &cache, mx, 0, mw, 0, NULL, 0, 1, my, 0), CLG_OK);
        ck_assert(cache.built_version[a] == cache.weights_version);
        tu_download(dev, my, got, ny);
        cr_fwd(&s, x, w2, NULL, 1, ref);
        ck_assert_double_lt(rel_err(got, ref, ny), TOL);
        ck_assert_int_eq(clg_conv_backward_data(dev, &s, a, &cache, mgy, 0, mw, 0, mdx, 0), CLG_OK);
        ck_assert(cache.built_version_bwd[a] == cache.weights_version);
        tu_download(dev, mdx, got, nx);
        cr_bwd_data(&s, gy, w2, ref);
        ck_assert_double_lt(rel_err(got, ref, nx), TOL);
    }
    clg_conv_cache_free(dev, &cache);
    ck_assert_ptr_null(cache.transformed[CLG_CONV_WINOGRAD4_FUSED]);
    free(x), free(w1), free(w2), free(gy), free(got), free(ref);
    clg_buf_release(dev, mx), clg_buf_release(dev, mw), clg_buf_release(dev, my);
    clg_buf_release(dev, mgy), clg_buf_release(dev, mdx);
}
END_TEST

/* G g G^T (alpha x alpha) of a 3x3 g in double; G of F(2x2,3x3) or F(4x4,3x3) (Lavin & Gray's points). */
static void filter_ref(int m, double g[3][3], double *u)
{
    static const double G2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    static const double G4[6][3] = {{0.25, 0, 0},
                                    {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                    {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                    {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                    {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                    {0, 0, 1}};
    int A = m + 2;
    for (int a = 0; a < A; a++)
        for (int b = 0; b < A; b++) {
            double v = 0;
            for (int r = 0; r < 3; r++)
                for (int q = 0; q < 3; q++)
                    v += (m == 2 ? G2[a][r] : G4[a][r]) * g[r][q] * (m == 2 ? G2[b][q] : G4[b][q]);
            u[a * A + b] = v;
        }
}

/* The transformed filters the cache holds (wf_filter), forward and backward-data, against G g G^T in double,
 * read back element by element in the kernel's layout U[((xi*Kb + kb)*Cin + c)*KB + i] (output channel
 * kb*KB + i; the channels past Kout of the last block zero). The cache's buffers are NaN-poisoned pool blocks,
 * so a value the kernel does not write shows. Kout 11 (8-channel blocks, 5 padding channels), 3 (4-channel blocks)
 * and 6 (8-channel blocks, 2 padding); the oclgrind run (CLGRAD_TEST_TINY) the first only. */
START_TEST(filter_transform_layout)
{
    clg_device *dev = dev0();
    clg_rng r;
    tu_rng(&r, 48);
    static const int KC[][2] = {{11, 5}, {3, 7}, {6, 11}};
    for (size_t t = 0; t < (g_tiny ? 1 : CLG_ARRAY_LEN(KC)); t++)
        for (int m = 2; m <= 4; m += 2)
            for (int flip = 0; flip < 2; flip++) {
                clg_conv_algo a = m == 2 ? CLG_CONV_WINOGRAD_FUSED : CLG_CONV_WINOGRAD4_FUSED;
                clg_conv_shape s = wshape(1, KC[t][1], 6, 5, KC[t][0], 1, 1);
                int Kout = flip ? s.C : s.K, Cin = flip ? s.K : s.C, A = m + 2;
                int KB = Kout <= 1 ? 1 : Kout <= 2 ? 2 : Kout <= 4 ? 4 : 8, Kb = (Kout + KB - 1) / KB;
                size_t nu = (size_t)A * A * Kb * KB * Cin, nw = cr_nw(&s), nx = cr_nx(&s), ny = cr_ny(&s);
                float *w = randn(nw, &r), *xy = randn(nx + ny, &r); /* x and dy: written (oclgrind) */
                cl_mem mw = tu_upload(dev, w, nw), mx = tu_upload(dev, xy, nx), my = tu_upload(dev, xy + nx, ny);
                /* the only free pool block of the cache slot's size class: NaN-filled (the others held meanwhile) */
                size_t cls = clg_pool_class(nu * sizeof(float));
                cl_mem held[16], poison = NULL;
                int nheld = 0;
                for (int q = 0; q < dev->pool.nfree; q++)
                    nheld += dev->pool.free_blocks[q].size == cls;
                ck_assert(nheld <= (int)CLG_ARRAY_LEN(held));
                for (int q = 0; q < nheld; q++)
                    ck_assert_int_eq(clg_buf_alloc(dev, cls, &held[q]), CLG_OK);
                ck_assert_int_eq(clg_buf_alloc(dev, nu * sizeof(float), &poison), CLG_OK);
                ck_assert_int_eq(clg_buf_fill(dev, poison, 0, cls / sizeof(float), NAN), CLG_OK);
                clg_buf_release(dev, poison);
                clg_conv_cache cache;
                memset(&cache, 0, sizeof cache);
                cache.weights_version = 1;
                if (flip)
                    ck_assert_int_eq(clg_conv_backward_data(dev, &s, a, &cache, my, 0, mw, 0, mx, 0), CLG_OK);
                else
                    ck_assert_int_eq(clg_conv_forward(dev, &s, a, &cache, mx, 0, mw, 0, NULL, 0, 0, my, 0), CLG_OK);
                cl_mem U = flip ? cache.transformed_bwd[a] : cache.transformed[a];
                ck_assert_msg(U == poison, "F(%dx%d) %s Kout %d Cin %d: the cache slot is not the poisoned pool block",
                              m, m, flip ? "backward-data" : "forward", Kout, Cin);
                float *got = malloc(sizeof(float) * nu);
                tu_download(dev, U, got, nu);
                double worst = 0;
                for (int k = 0; k < Kb * KB; k++)
                    for (int c = 0; c < Cin; c++) {
                        double g[3][3], u[36];
                        for (int i = 0; i < 9; i++) /* flip: rot180 of w[c][k], w stored (Cin, Kout, 3, 3) */
                            g[i / 3][i % 3] = k >= Kout ? 0.0
                                              : flip    ? w[((size_t)c * Kout + k) * 9 + 8 - i]
                                                        : w[((size_t)k * Cin + c) * 9 + i];
                        filter_ref(m, g, u);
                        for (int xi = 0; xi < A * A; xi++) {
                            float v = got[(((size_t)xi * Kb + k / KB) * Cin + c) * KB + k % KB];
                            double e = isfinite(v) ? fabs(v - u[xi]) : INFINITY;
                            ck_assert_msg(e <= 1e-5 * (1 + fabs(u[xi])) && (k < Kout || v == 0.0f),
                                          "F(%dx%d) %s Kout %d Cin %d: U at point %d, channel %d (of %d), input "
                                          "channel %d is %g, expected %g",
                                          m, m, flip ? "backward-data" : "forward", Kout, Cin, xi, k, Kout, c, v,
                                          u[xi]);
                            worst = fmax(worst, e);
                        }
                    }
                if (getenv("CLGRAD_TEST_VERBOSE"))
                    fprintf(stderr, "wf_filter F(%dx%d) flip %d Kout %d Cin %d: max error %.3g\n", m, m, flip, Kout,
                            Cin, worst);
                free(got);
                free(w);
                free(xy);
                for (int q = 0; q < nheld; q++)
                    clg_buf_release(dev, held[q]);
                clg_conv_cache_free(dev, &cache);
                clg_buf_release(dev, mw), clg_buf_release(dev, mx), clg_buf_release(dev, my);
            }
}
END_TEST

/* Names, parsing and the passes/shapes the fused algorithms refuse. */
START_TEST(names_and_support)
{
    clg_conv_algo a;
    ck_assert_int_eq(clg_conv_algo_parse(&g_ctx->err, "winograd-fused", &a), CLG_OK);
    ck_assert_int_eq(a, CLG_CONV_WINOGRAD_FUSED);
    ck_assert_int_eq(clg_conv_algo_parse(&g_ctx->err, "winograd4-fused", &a), CLG_OK);
    ck_assert_int_eq(a, CLG_CONV_WINOGRAD4_FUSED);
    ck_assert_str_eq(clg_conv_algo_name(CLG_CONV_WINOGRAD4_FUSED), "winograd4-fused");
    clg_conv_shape s = wshape(1, 3, 8, 8, 4, 1, 1);
    ck_assert(clg_conv_algo_supported(CLG_CONV_WINOGRAD4_FUSED, &s, CLG_CONV_BWD_FILTER));
    ck_assert(clg_conv_algo_supported(CLG_CONV_WINOGRAD_FUSED, &s, CLG_CONV_BWD_FILTER));
    s.C = 600; /* the weight gradient's per-work-item partials: C*K <= 512*512 */
    s.K = 500;
    ck_assert(!clg_conv_algo_supported(CLG_CONV_WINOGRAD_FUSED, &s, CLG_CONV_BWD_FILTER));
    ck_assert(!clg_conv_algo_supported(CLG_CONV_WINOGRAD4_FUSED, &s, CLG_CONV_BWD_FILTER));
    s.C = 3;
    s.K = 4;
    ck_assert(clg_conv_algo_supported(CLG_CONV_WINOGRAD4_FUSED, &s, CLG_CONV_BWD_DATA));
    s.pad_h = 3;
    ck_assert(!clg_conv_algo_supported(CLG_CONV_WINOGRAD_FUSED, &s, CLG_CONV_FWD));
    s.pad_h = 1;
    s.stride_w = 2;
    ck_assert(!clg_conv_algo_supported(CLG_CONV_WINOGRAD_FUSED, &s, CLG_CONV_FWD));
    cl_mem m = tu_upload(dev0(), NULL, 512);
    ck_assert_int_eq(clg_conv_forward(dev0(), &s, CLG_CONV_WINOGRAD_FUSED, NULL, m, 0, m, 0, NULL, 0, 0, m, 0),
                     CLG_ERR_UNSUPPORTED);
    ck_assert_int_eq(clg_conv_backward_filter(dev0(), &s, CLG_CONV_WINOGRAD4_FUSED, m, 0, m, 0, 0.0f, m, 0, NULL, 0),
                     CLG_ERR_UNSUPPORTED);
    s.stride_w = 1;
    clg_buf_release(dev0(), m);
}
END_TEST

int main(void)
{
    g_tiny = getenv("CLGRAD_TEST_TINY") && atoi(getenv("CLGRAD_TEST_TINY")) != 0;
    g_ctx = tu_ctx(NULL);
    Suite *su = suite_create("wfused");
    struct {
        const char *name;
        const TTest *fn;
    } tests[] = {
        {"names_and_support", names_and_support},
        {"fused2_forward", fused2_forward},
        {"fused4_forward", fused4_forward},
        {"fused2_backward_data", fused2_backward_data},
        {"fused4_backward_data", fused4_backward_data},
        {"fused2_backward_filter", fused2_backward_filter},
        {"fused4_backward_filter", fused4_backward_filter},
        {"single_input_channel", single_input_channel},
        {"row_groups", row_groups},
        {"chunked_and_variants", chunked_and_variants},
        {"filter_cache_versions", filter_cache_versions},
        {"filter_transform_layout", filter_transform_layout},
    };
    for (size_t i = 0; i < CLG_ARRAY_LEN(tests); i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, tests[i].fn);
        suite_add_tcase(su, tc);
    }
    int rc = tu_run(su);
    clg_ctx_destroy(g_ctx);
    return rc;
}
