/* Launch limits (clg_wg_fit, clg_launch), vendor defaults that fit GPU
 * limits, and stored measurements from another device being ignored. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "ops/conv_impl.h"
#include "ops/gemm.h"
#include "ops/tune.h"
#include "testutil.h"

static clg_ctx *g_ctx;

static size_t prod(const size_t *l, int dims)
{
    size_t p = 1;
    for (int d = 0; d < dims; d++)
        p *= l[d];
    return p;
}

START_TEST(wg_fit)
{
    clg_wg_limits L;
    memset(&L, 0, sizeof L);
    L.max_total = 256;
    L.max_item[0] = L.max_item[1] = L.max_item[2] = 256;
    L.multiple = 1;
    size_t a[3] = {512, 1, 1};
    clg_wg_fit(&L, 3, a);
    ck_assert_uint_eq(a[0], 256);
    size_t b[3] = {256, 2, 1}; /* the conv geometry that failed: 512 work-items */
    clg_wg_fit(&L, 3, b);
    ck_assert_uint_le(prod(b, 3), 256);
    ck_assert(256 % b[0] == 0 && 2 % b[1] == 0); /* divisors: global sizes stay multiples */
    size_t c[2] = {48, 48}; /* not powers of two */
    clg_wg_fit(&L, 2, c);
    ck_assert_uint_le(prod(c, 2), 256);
    ck_assert(48 % c[0] == 0 && 48 % c[1] == 0);
    L.max_item[1] = 4; /* a per-dimension limit */
    size_t d[2] = {8, 16};
    clg_wg_fit(&L, 2, d);
    ck_assert_uint_le(d[1], 4);
    /* geometry: within limits, global sizes multiples of local ones */
    size_t n[3] = {1000, 37, 3}, g[3], l[3];
    L.max_item[1] = 256;
    clg_wg_geom(&L, 3, n, 256, 512, g, l);
    ck_assert_uint_le(prod(l, 3), 256);
    for (int i = 0; i < 3; i++) {
        ck_assert_uint_ge(g[i], n[i]);
        ck_assert_uint_eq(g[i] % l[i], 0);
    }
}
END_TEST

START_TEST(launch_limits)
{
    clg_device *dev = &g_ctx->devs[0];
    cl_kernel k;
    size_t wg;
    ck_assert_int_eq(clg_kernel_get_wg(dev, "eltwise", "plane_sum", "PS_WG", 64, &k, &wg), CLG_OK);
    ck_assert_uint_eq(wg, 64);
    size_t max = 0;
    ck_assert_int_eq(clg_kernel_wg_limit(dev, k, &max), CLG_OK);
    ck_assert_uint_ge(max, 1);
    ck_assert_uint_le(max, dev->info.max_work_group_size);
    /* a reqd_work_group_size kernel launched with another size: a clear error, no enqueue */
    size_t gws = 256, lws = 128;
    ck_assert_int_eq(clg_launch(dev, k, 1, &gws, &lws, CLG_LAUNCH_FIT, NULL), CLG_ERR_UNSUPPORTED);
    const char *msg = clg_last_error(g_ctx);
    ck_assert_msg(strstr(msg, "plane_sum") && strstr(msg, "reqd_work_group_size") && strstr(msg, "limits of"), "%s",
                  msg);
    /* a group beyond the device: shrunk (FIT) or refused (FIXED) */
    cl_kernel kf;
    ck_assert_int_eq(clg_kernel_get(dev, "eltwise", "", "fill", &kf), CLG_OK);
    cl_mem m;
    ck_assert_int_eq(clg_buf_alloc(dev, 4 * 64, &m), CLG_OK);
    size_t big = dev->info.max_work_group_size * 2;
    size_t g2 = big;
    cl_uint n = 64, off = 0;
    float v = 3.0f;
    clSetKernelArg(kf, 0, sizeof n, &n);
    clSetKernelArg(kf, 1, sizeof v, &v);
    clSetKernelArg(kf, 2, sizeof m, &m);
    clSetKernelArg(kf, 3, sizeof off, &off);
    ck_assert_int_eq(clg_launch(dev, kf, 1, &g2, &big, CLG_LAUNCH_FIXED, NULL), CLG_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(clg_last_error(g_ctx), "fill") != NULL, "%s", clg_last_error(g_ctx));
    ck_assert_int_eq(clg_launch(dev, kf, 1, &g2, &big, CLG_LAUNCH_FIT, NULL), CLG_OK);
    float h[64];
    ck_assert_int_eq(clEnqueueReadBuffer(dev->queue, m, CL_TRUE, 0, sizeof h, h, 0, NULL, NULL), CL_SUCCESS);
    for (int i = 0; i < 64; i++)
        ck_assert(h[i] == 3.0f);
    /* clg_buf_fill at an offset */
    ck_assert_int_eq(clg_buf_fill(dev, m, 10, 20, -1.0f), CLG_OK);
    ck_assert_int_eq(clEnqueueReadBuffer(dev->queue, m, CL_TRUE, 0, sizeof h, h, 0, NULL, NULL), CL_SUCCESS);
    for (int i = 0; i < 64; i++)
        ck_assert(h[i] == (i >= 10 && i < 30 ? -1.0f : 3.0f));
    clg_buf_release(dev, m);
    /* empty range: nothing to do */
    size_t zero = 0;
    ck_assert_int_eq(clg_launch(dev, kf, 1, &zero, NULL, CLG_LAUNCH_FIXED, NULL), CLG_OK);
}
END_TEST

/* The device as another class of device: vendor, type and limits. */
static void pose(clg_device *d, const char *vendor, clg_device_type type, size_t wg, uint64_t lmem)
{
    snprintf(d->info.vendor, sizeof d->info.vendor, "%s", vendor);
    d->info.type = type;
    d->info.max_work_group_size = wg;
    d->info.local_mem_bytes = lmem;
    d->max_item[0] = d->max_item[1] = d->max_item[2] = wg;
}

START_TEST(vendor_defaults)
{
    clg_device saved = g_ctx->devs[0];
    clg_device *d = &g_ctx->devs[0];
    static const struct {
        const char *vendor;
        size_t wg;
        uint64_t lmem;
        int mwg, mdimc, vw;
    } cases[] = {
        {"NVIDIA Corporation", 1024, 49152, 64, 16, 4},
        {"Advanced Micro Devices, Inc.", 256, 65536, 64, 16, 4},
        {"Intel(R) Corporation", 512, 65536, 32, 8, 2},
        {"ARM", 256, 32768, 64, 16, 2},
        {"Oclgrind", 256, 32768, 64, 16, 2},
        {"NVIDIA Corporation", 128, 49152, 32, 8, 2}, /* below 256 work-items: the 8x8 set */
        {"Some GPU", 32, 4096, 16, 4, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pose(d, cases[i].vendor, CLG_DEVICE_GPU, cases[i].wg, cases[i].lmem);
        clg_gemm_params p;
        clg_gemm_params_default(d, &p);
        ck_assert_int_eq(p.family, CLG_GEMM_FAM_TILED);
        ck_assert_msg(p.MWG == cases[i].mwg && p.MDIMC == cases[i].mdimc && p.VWM == cases[i].vw,
                      "%s: MWG %d MDIMC %d VW %d", cases[i].vendor, p.MWG, p.MDIMC, p.VWM);
        ck_assert_int_eq(clg_gemm_params_check(d, &p), CLG_OK);
    }
    pose(d, "Tiny", CLG_DEVICE_GPU, 8, 4096);
    clg_gemm_params p;
    clg_gemm_params_default(d, &p);
    ck_assert_int_eq(p.family, CLG_GEMM_FAM_REF);

    /* untuned convolution choices */
    clg_conv_shape s;
    memset(&s, 0, sizeof s);
    s.N = 2, s.C = 32, s.H = s.W = 14, s.K = 32, s.R = s.S = 3, s.pad_h = s.pad_w = 1;
    s.stride_h = s.stride_w = s.dil_h = s.dil_w = s.groups = 1;
    pose(d, "NVIDIA Corporation", CLG_DEVICE_GPU, 1024, 49152);
    ck_assert_int_eq(clg_conv_algo_default(d, &s, CLG_CONV_FWD), CLG_CONV_WINOGRAD4);
    pose(d, "Intel(R) Corporation", CLG_DEVICE_GPU, 512, 65536);
    ck_assert_int_eq(clg_conv_algo_default(d, &s, CLG_CONV_FWD), CLG_CONV_WINOGRAD);
    pose(d, "AuthenticAMD", CLG_DEVICE_CPU, 4096, 1 << 20);
    ck_assert_int_eq(clg_conv_algo_default(d, &s, CLG_CONV_FWD), CLG_CONV_WINOGRAD4_FUSED);
    /* CPUs: strided and 5x5 few-channel windows by the shape-specialised direct kernels */
    ck_assert_int_eq(clg_conv_algo_default(d, &s, CLG_CONV_BWD_FILTER), CLG_CONV_WINOGRAD4);
    s.C = 1; /* a first layer: 3x3 by im2col, 5x5 direct */
    ck_assert_int_eq(clg_conv_algo_default(d, &s, CLG_CONV_FWD), CLG_CONV_IM2COL);
    s.R = s.S = 5;
    ck_assert_int_eq(clg_conv_algo_default(d, &s, CLG_CONV_FWD), CLG_CONV_DIRECT);
    s.R = s.S = 3;
    s.C = 32, s.R = s.S = 5;
    ck_assert_int_eq(clg_conv_algo_default(d, &s, CLG_CONV_FWD), CLG_CONV_DIRECT);
    s.R = s.S = 1, s.stride_h = s.stride_w = 2, s.pad_h = s.pad_w = 0; /* a strided 1x1 projection: a GEMM */
    ck_assert_int_eq(clg_conv_algo_default(d, &s, CLG_CONV_FWD), CLG_CONV_IM2COL);
    s.R = s.S = 5, s.stride_h = s.stride_w = 1, s.pad_h = s.pad_w = 1;
    pose(d, "Intel(R) Corporation", CLG_DEVICE_GPU, 512, 65536); /* GPUs keep im2col there */
    ck_assert_int_eq(clg_conv_algo_default(d, &s, CLG_CONV_FWD), CLG_CONV_IM2COL);
    ck_assert_int_eq(clg_conv_algo_default(d, &s, CLG_CONV_BWD_FILTER), CLG_CONV_IM2COL);
    s.R = s.S = 3, s.groups = 32, s.K = 32; /* depthwise */
    ck_assert_int_eq(clg_conv_algo_default(d, &s, CLG_CONV_FWD), CLG_CONV_DIRECT);
    *d = saved;
}
END_TEST

START_TEST(foreign_measurements)
{
    /* a tuning database saved under other limits is not used */
    clg_ctx *c = tu_ctx_cache(NULL, "limits-tune-test");
    clg_device *d = &c->devs[0];
    char path[1200], path2[1200], fp1[700], fp2[700];
    clg_tune_path(d, path, sizeof path);
    remove(path);
    clg_tune_dev_clear(clg_tune_dev_get(d));
    clg_tune_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.key, sizeof e.key, "gemm/M1N1K1");
    clg_tune_set(&e, "family", 1);
    ck_assert_int_eq(clg_tune_put(d, &e), CLG_OK);
    ck_assert_int_eq(clg_tune_save(d), CLG_OK);
    clg_device_fingerprint(d, fp1, sizeof fp1);
    clg_ctx_destroy(c);

    c = tu_ctx_cache(NULL, "limits-tune-test");
    d = &c->devs[0];
    ck_assert_ptr_nonnull(clg_tune_find(d, "gemm/M1N1K1")); /* same device: used */
    clg_ctx_destroy(c);

    c = tu_ctx_cache(NULL, "limits-tune-test");
    d = &c->devs[0];
    d->info.local_mem_bytes = 32768; /* the same device name and driver, other limits */
    d->info.max_work_group_size = 256;
    clg_device_fingerprint(d, fp2, sizeof fp2);
    ck_assert_str_ne(fp1, fp2);
    clg_tune_path(d, path2, sizeof path2);
    ck_assert_str_ne(path, path2);
    /* even a copy of the file at this device's path is refused */
    char *text = NULL;
    size_t len = 0;
    clg_err err;
    ck_assert_int_eq(clg_file_read(&err, path, &text, &len), CLG_OK);
    ck_assert_int_eq(clg_file_write_atomic(&err, path2, text, len), CLG_OK);
    free(text);
    ck_assert_ptr_null(clg_tune_find(d, "gemm/M1N1K1"));
    remove(path2);
    remove(path);
    clg_ctx_destroy(c);
}
END_TEST

/* CLG_LAUNCH_PAD: one local size for every range on CPU devices (PoCL
 * compiles each kernel once per local size), the range rounded up and the
 * kernel's bound checks keeping the padding out of the result; and the
 * same sums with the runtime's choice. part_reduce against a double sum. */
START_TEST(pad_launch)
{
    clg_wg_limits L;
    memset(&L, 0, sizeof L);
    L.max_total = 4096;
    L.max_item[0] = L.max_item[1] = L.max_item[2] = 4096;
    L.multiple = 8;
    L.canon = 1;
    size_t g1[3], l1[3], g2[3], l2[3], n1[3] = {7, 32, 128}, n2[3] = {7, 64, 100};
    clg_wg_geom(&L, 3, n1, 256, 512, g1, l1);
    clg_wg_geom(&L, 3, n2, 256, 512, g2, l2);
    ck_assert(l1[0] == l2[0] && l1[1] == l2[1] && l1[2] == l2[2]);
    for (int i = 0; i < 3; i++)
        ck_assert(g1[i] % l1[i] == 0 && g1[i] >= n1[i] && g2[i] % l2[i] == 0 && g2[i] >= n2[i]);

    clg_device *dev = &g_ctx->devs[0];
    int saved = dev->wg_canon;
    clg_rng r;
    tu_rng(&r, 41);
    const int shapes[][3] = {{3, 37, 5}, {1, 1, 1}, {2, 16, 4}, {4, 65, 19}, {2, 300, 7}}; /* chunks, rows, cols; 300 rows: the wide size */
    for (int mode = 1; mode <= 2; mode++) {
        dev->wg_canon = mode; /* 1: the runtime picks, 2: canonical */
        for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
            int chunks = shapes[t][0], rows = shapes[t][1], cols = shapes[t][2], ps = cols + 3, pc0 = 2;
            size_t np = (size_t)chunks * rows * ps, no = (size_t)rows * (cols + 1);
            float *part = malloc(np * sizeof *part), *out = malloc(no * sizeof *out);
            float *got = malloc(no * sizeof *got);
            tu_fill(part, np, -1.0f, 1.0f, &r);
            tu_fill(out, no, -1.0f, 1.0f, &r);
            cl_mem dp = tu_upload(dev, part, np), dout = tu_upload(dev, out, no);
            ck_assert_int_eq(clg_conv_part_reduce(dev, dp, chunks, rows, cols - pc0 > 0 ? cols - pc0 : cols, ps, pc0,
                                                  0.5f, dout, 0, cols + 1),
                             CLG_OK);
            tu_download(dev, dout, got, no);
            int c2 = cols - pc0 > 0 ? cols - pc0 : cols;
            for (int i = 0; i < rows; i++)
                for (int j = 0; j < cols + 1; j++) {
                    double want = out[i * (cols + 1) + j];
                    if (j < c2) {
                        double sum = 0;
                        for (int ch = 0; ch < chunks; ch++)
                            sum += part[((size_t)ch * rows + i) * ps + pc0 + j];
                        want = 0.5 * want + sum;
                    }
                    ck_assert_msg(fabs(got[i * (cols + 1) + j] - want) <= 1e-5 * (1 + fabs(want)),
                                  "mode %d shape %zu (%d,%d): %g, want %g", mode, t, i, j,
                                  (double)got[i * (cols + 1) + j], want);
                }
            clg_buf_release(dev, dp);
            clg_buf_release(dev, dout);
            free(part);
            free(out);
            free(got);
        }
    }
    dev->wg_canon = saved;
}
END_TEST

int main(void)
{
    g_ctx = tu_ctx(NULL);
    const TTest *tests[] = {wg_fit, launch_limits, vendor_defaults, foreign_measurements, pad_launch};
    int rc = tu_run_tests("limits", 120, tests, 5);
    clg_ctx_destroy(g_ctx);
    return rc;
}
