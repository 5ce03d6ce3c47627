/* clg_prim_attention_forward/backward through the shared library alone, on
 * an OpenCL context and queue the test creates: both algorithms against the
 * double-precision reference (attn_ref.h) with separate (N, T, C) buffers at
 * offsets (q, k, v, o, dout and the gradients in one buffer each, NaN
 * around), an event chain, and argument errors (too-small buffer, bad head
 * width, NULL o for the fused backward). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <clgrad.h>

#include "attn_ref.h"

#define TOL 2e-4
#define ATOL 1e-2

static cl_context ctx;
static cl_command_queue queue;
static clg_prim *h;
static unsigned seed;

static float frand(void)
{
    seed = seed * 1664525u + 1013904223u;
    return (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
}

static void setup(void)
{
    cl_platform_id plat;
    cl_device_id dev;
    if (clGetPlatformIDs(1, &plat, NULL) != CL_SUCCESS || clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS)
        exit(77);
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, NULL);
    queue = clCreateCommandQueue(ctx, dev, 0, NULL);
    ck_assert_int_eq(clg_prim_create(queue, NULL, &h), CLG_OK);
}

static void teardown(void)
{
    clg_prim_destroy(h);
    clReleaseCommandQueue(queue);
    clReleaseContext(ctx);
}

static cl_mem buf(const float *host, size_t n)
{
    cl_int e;
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof(float), (void *)host, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    return m;
}

static double max_err(const float *got, const double *ref, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - ref[i]) / (fabs(ref[i]) + ATOL);
        if (!(d <= e))
            e = isnan(d) ? INFINITY : d;
    }
    return e;
}

#define OFF 3 /* every operand starts 3 floats in, NaN before and after */

static void run(int N, int T, int H, int d, int causal, clg_prim_attention_algo algo)
{
    int C = H * d;
    size_t nseq = (size_t)N * T * C, tot = nseq + 2 * OFF;
    /* host: q, k, v, dout in [-1, 1); device buffers NaN outside [OFF, OFF + nseq) */
    float *host[4], *nanb = malloc(sizeof(float) * tot);
    for (size_t i = 0; i < tot; i++)
        nanb[i] = NAN;
    cl_mem in[4], out[4];
    for (int b = 0; b < 4; b++) {
        host[b] = malloc(sizeof(float) * tot);
        for (size_t i = 0; i < tot; i++)
            host[b][i] = i >= OFF && i < OFF + nseq ? frand() : NAN;
        in[b] = buf(host[b], tot);
        out[b] = buf(nanb, tot); /* o, dq, dk, dv */
    }
    clg_prim_attention_desc desc;
    clg_prim_attention_desc_init(&desc);
    desc.n = N, desc.t = T, desc.heads = H, desc.head_dim = d, desc.causal = causal, desc.algo = algo;
    size_t ns = clg_prim_attention_saved_size(&desc);
    ck_assert_uint_gt(ns, 0);
    float *sv = malloc(sizeof(float) * ns);
    for (size_t i = 0; i < ns; i++)
        sv[i] = NAN;
    cl_mem saved = buf(sv, ns);
    cl_event e1 = NULL, e2 = NULL;
    clg_status st = clg_prim_attention_forward(h, &desc, in[0], OFF, in[1], OFF, in[2], OFF, out[0], OFF, saved, 0, 0,
                                               NULL, &e1);
    ck_assert_msg(st == CLG_OK, "forward: %s", clg_prim_last_error(h));
    st = clg_prim_attention_backward(h, &desc, in[0], OFF, in[1], OFF, in[2], OFF, out[0], OFF, saved, 0, in[3], OFF,
                                     out[1], OFF, out[2], OFF, out[3], OFF, 1, &e1, &e2);
    ck_assert_msg(st == CLG_OK, "backward: %s", clg_prim_last_error(h));
    ck_assert_ptr_nonnull(e2);
    ck_assert_int_eq(clWaitForEvents(1, &e2), CL_SUCCESS);
    clReleaseEvent(e1);
    clReleaseEvent(e2);
    float *got[4];
    for (int b = 0; b < 4; b++) {
        got[b] = malloc(sizeof(float) * tot);
        clEnqueueReadBuffer(queue, out[b], CL_TRUE, 0, sizeof(float) * tot, got[b], 0, NULL, NULL);
        ck_assert_msg(isnan(got[b][OFF - 1]) && isnan(got[b][OFF + nseq]), "output %d written outside its range", b);
    }
    /* reference on the (N, T, 3C) layout of attn_ref.h */
    double *qkv = malloc(sizeof(double) * 3 * nseq), *g = malloc(sizeof(double) * nseq);
    for (size_t r = 0; r < (size_t)N * T; r++)
        for (int c = 0; c < C; c++) {
            for (int b = 0; b < 3; b++)
                qkv[r * 3 * C + b * C + c] = host[b][OFF + r * C + c];
            g[r * C + c] = host[3][OFF + r * C + c];
        }
    double *o = malloc(sizeof(double) * nseq), *lse = malloc(sizeof(double) * N * H * T);
    double *dqkv = malloc(sizeof(double) * 3 * nseq), *ref = malloc(sizeof(double) * nseq);
    acase ac = {N, T, H, d, causal};
    ref_attention(&ac, qkv, g, o, lse, dqkv);
    const char *names[4] = {"o", "dq", "dk", "dv"};
    for (int b = 0; b < 4; b++) {
        for (size_t r = 0; r < (size_t)N * T; r++)
            for (int c = 0; c < C; c++)
                ref[r * C + c] = b == 0 ? o[r * C + c] : dqkv[r * 3 * C + (b - 1) * C + c];
        double e = max_err(got[b] + OFF, ref, nseq);
        ck_assert_msg(e < TOL, "%s algo %d N=%d T=%d H=%d d=%d causal=%d: error %g", names[b], (int)algo, N, T, H, d,
                      causal, e);
    }
    for (int b = 0; b < 4; b++) {
        free(host[b]);
        free(got[b]);
        clReleaseMemObject(in[b]);
        clReleaseMemObject(out[b]);
    }
    clReleaseMemObject(saved);
    free(nanb), free(sv), free(qkv), free(g), free(o), free(lse), free(dqkv), free(ref);
}

START_TEST(test_prim_attention)
{
    seed = (unsigned)time(NULL);
    printf("seed %u\n", seed);
    run(2, 19, 2, 32, 1, CLG_PRIM_ATTENTION_FUSED);
    run(2, 19, 2, 32, 1, CLG_PRIM_ATTENTION_GEMM);
    run(1, 40, 3, 16, 0, CLG_PRIM_ATTENTION_AUTO);
    run(3, 1, 1, 64, 1, CLG_PRIM_ATTENTION_FUSED);
}
END_TEST

START_TEST(test_prim_attention_errors)
{
    float z[64] = {0};
    cl_mem m = buf(z, 64);
    clg_prim_attention_desc d;
    clg_prim_attention_desc_init(&d);
    d.n = 1, d.t = 4, d.heads = 2, d.head_dim = 16; /* needs 4 x 32 floats */
    ck_assert_int_eq(clg_prim_attention_forward(h, &d, m, 0, m, 0, m, 0, m, 0, m, 0, 0, NULL, NULL),
                     CLG_ERR_INVALID_ARG);
    ck_assert_msg(strstr(clg_prim_last_error(h), "buffer 'q' holds 64 floats"), "%s", clg_prim_last_error(h));
    d.head_dim = 200;
    ck_assert_int_eq(clg_prim_attention_forward(h, &d, m, 0, m, 0, m, 0, m, 0, m, 0, 0, NULL, NULL), CLG_ERR_SHAPE);
    ck_assert_msg(strstr(clg_prim_last_error(h), "head_dim"), "%s", clg_prim_last_error(h));
    ck_assert_uint_eq(clg_prim_attention_saved_size(&d), 0);
    d.t = 1, d.heads = 1, d.head_dim = 16, d.ld_q = 8;
    ck_assert_int_eq(clg_prim_attention_forward(h, &d, m, 0, m, 0, m, 0, m, 0, m, 0, 0, NULL, NULL), CLG_ERR_SHAPE);
    ck_assert_msg(strstr(clg_prim_last_error(h), "ld_q"), "%s", clg_prim_last_error(h));
    d.ld_q = 0;
    ck_assert_int_eq(clg_prim_attention_backward(h, &d, m, 0, m, 0, m, 0, NULL, 0, m, 0, m, 0, m, 0, m, 0, m, 0, 0,
                                                 NULL, NULL),
                     CLG_ERR_INVALID_ARG);
    ck_assert_msg(strstr(clg_prim_last_error(h), "'o'"), "%s", clg_prim_last_error(h));
    clReleaseMemObject(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attention-prim");
    TCase *tc = tcase_create("attention-prim");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_prim_attention);
    tcase_add_test(tc, test_prim_attention_errors);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
