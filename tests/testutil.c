#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t tu_seed(void)
{
    static uint64_t seed;
    static int have;
    if (!have) {
        const char *e = getenv("CLGRAD_TEST_SEED");
        seed = e ? strtoull(e, NULL, 10) : ((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16));
        have = 1;
        fprintf(stderr, "test seed: %llu (set CLGRAD_TEST_SEED to repeat)\n", (unsigned long long)seed);
    }
    return seed;
}

void tu_rng(clg_rng *r, uint64_t stream) { clg_rng_seed(r, tu_seed(), stream); }

clg_ctx *tu_ctx_cache(const char *devices, const char *cache_dir)
{
    clg_ctx_params p;
    clg_ctx_params_init(&p);
    p.devices = devices;
    p.cache_dir = cache_dir;
    clg_ctx *ctx = NULL;
    clg_status st = clg_ctx_create(&p, &ctx);
    if (st == CLG_ERR_NO_DEVICE) {
        fprintf(stderr, "skip: %s\n", clg_last_error(NULL));
        exit(TU_SKIP);
    }
    if (st != CLG_OK) {
        fprintf(stderr, "context creation failed: %s\n", clg_last_error(NULL));
        exit(1);
    }
    return ctx;
}

clg_ctx *tu_ctx(const char *devices) { return tu_ctx_cache(devices, NULL); }

clg_ctx *tu_ctx_fixed(double mib)
{
    clg_options *o = NULL;
    ck_assert(clg_options_create(&o) == CLG_OK);
    char v[64];
    snprintf(v, sizeof v, "%.6f", mib);
    ck_assert(clg_options_set(o, "conv_auto_measure", "0") == CLG_OK);
    ck_assert(clg_options_set(o, "gemm_auto_measure", "0") == CLG_OK);
    ck_assert_msg(clg_options_set(o, "device_mem_limit", v) == CLG_OK, "%s", clg_last_error(NULL));
    clg_ctx_params p;
    clg_ctx_params_init(&p);
    p.options = o;
    clg_ctx *c = NULL;
    clg_status st = clg_ctx_create(&p, &c);
    clg_options_destroy(o);
    if (st == CLG_ERR_NO_DEVICE) {
        fprintf(stderr, "skip: %s\n", clg_last_error(NULL));
        exit(TU_SKIP);
    }
    ck_assert_msg(st == CLG_OK, "%s", clg_last_error(NULL));
    return c;
}

void tu_fill(float *x, size_t n, float lo, float hi, clg_rng *r)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * clg_rng_uniform(r);
}

void tu_poison(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

void tu_write_full(clg_device *dev, cl_mem m, const float *host, size_t n)
{
    size_t bytes = 0;
    ck_assert_int_eq(clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof bytes, &bytes, NULL), CL_SUCCESS);
    size_t nf = bytes / sizeof(float);
    ck_assert(nf >= n);
    float *tmp = malloc(bytes + sizeof(float));
    ck_assert_ptr_nonnull(tmp);
    tu_poison(tmp, nf + 1);
    if (host)
        memcpy(tmp, host, sizeof(float) * n);
    ck_assert_int_eq(clEnqueueWriteBuffer(dev->queue, m, CL_TRUE, 0, bytes, tmp, 0, NULL, NULL), CL_SUCCESS);
    free(tmp);
}

cl_mem tu_upload(clg_device *dev, const float *host, size_t n)
{
    cl_mem m = NULL;
    ck_assert_int_eq(clg_buf_alloc(dev, sizeof(float) * (n + 1), &m), CLG_OK);
    tu_write_full(dev, m, host, n);
    return m;
}

cl_mem tu_upload_at(clg_device *dev, const float *host, size_t n, size_t off)
{
    float *tmp = malloc(sizeof(float) * (n + off + 1));
    ck_assert_ptr_nonnull(tmp);
    tu_poison(tmp, n + off + 1);
    if (host)
        memcpy(tmp + off, host, sizeof(float) * n);
    cl_mem m = tu_upload(dev, tmp, n + off + 1);
    free(tmp);
    return m;
}

float *tu_download_at(clg_device *dev, cl_mem m, size_t n, size_t off)
{
    float *tmp = malloc(sizeof(float) * (n + off + 1));
    ck_assert_ptr_nonnull(tmp);
    tu_download(dev, m, tmp, n + off + 1);
    for (size_t i = 0; i < off; i++)
        ck_assert_msg(isnan(tmp[i]), "element %zu before the output was overwritten", i);
    ck_assert_msg(isnan(tmp[n + off]), "the element after the output was overwritten");
    float *out = malloc(sizeof(float) * (n + 1));
    ck_assert_ptr_nonnull(out);
    memcpy(out, tmp + off, sizeof(float) * n);
    free(tmp);
    return out;
}

void tu_download(clg_device *dev, cl_mem m, float *host, size_t n)
{
    ck_assert_int_eq(clEnqueueReadBuffer(dev->queue, m, CL_TRUE, 0, n * sizeof(float), host, 0, NULL, NULL),
                     CL_SUCCESS);
}

double tu_max_err(const float *got, const double *ref, size_t n, double atol)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (fabs(ref[i]) + atol);
        if (isnan(got[i]) || isinf(got[i]))
            return INFINITY;
        if (e > worst)
            worst = e;
    }
    return worst;
}

void tu_gemm_ref(int ta, int tb, int M, int N, int K, double alpha, const float *A, int lda, const float *B, int ldb,
                 double beta, double *C, int ldc)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = 0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k];
                double b = tb ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n];
                acc += a * b;
            }
            C[(size_t)m * ldc + n] = alpha * acc + (beta != 0 ? beta * C[(size_t)m * ldc + n] : 0);
        }
}

int tu_run_tests(const char *name, double timeout, const TTest *const *tests, int n)
{
    Suite *s = suite_create(name);
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, timeout);
    for (int i = 0; i < n; i++)
        tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    return tu_run(s);
}

int tu_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    /* OpenCL runtimes keep threads that do not survive fork(): run in-process */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
