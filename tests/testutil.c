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
    /* CLGRAD_TEST_VERBOSE=2: the library's debug log (program builds with their times) on stderr */
    const char *v = getenv("CLGRAD_TEST_VERBOSE");
    p.verbose = v ? atoi(v) : 0;
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

clg_ctx *tu_ctx_fixed(double mib) { return tu_ctx_fixed_opt(mib, NULL, NULL); }

clg_ctx *tu_ctx_fixed_opt(double mib, const char *name, const char *value)
{
    clg_options *o = NULL;
    ck_assert(clg_options_create(&o) == CLG_OK);
    char v[64];
    snprintf(v, sizeof v, "%.6f", mib);
    ck_assert(clg_options_set(o, "conv_auto_measure", "0") == CLG_OK);
    ck_assert(clg_options_set(o, "gemm_auto_measure", "0") == CLG_OK);
    ck_assert_msg(clg_options_set(o, "device_mem_limit", v) == CLG_OK, "%s", clg_last_error(NULL));
    if (name)
        ck_assert_msg(clg_options_set(o, name, value) == CLG_OK, "%s", clg_last_error(NULL));
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

void tu_bn_ref_train(const float *x, const float *r, int N, int C, int HW, const float *gamma, const float *beta,
                     double eps, int relu, double *y, double *mean, double *var)
{
    double M = (double)N * HW;
    for (int ch = 0; ch < C; ch++) {
        double s = 0, q = 0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++)
                s += x[((size_t)n * C + ch) * HW + i];
        double mu = s / M;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                double d = x[((size_t)n * C + ch) * HW + i] - mu;
                q += d * d;
            }
        mean[ch] = mu;
        var[ch] = q / M;
        double is = 1.0 / sqrt(var[ch] + eps);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                size_t k = ((size_t)n * C + ch) * HW + i;
                double v = (x[k] - mu) * is * gamma[ch] + beta[ch] + (r ? r[k] : 0.0);
                y[k] = relu && v < 0 ? 0 : v;
            }
    }
}

void tu_bn_ref_infer(const float *x, const float *r, int N, int C, int HW, const float *gamma, const float *beta,
                     const float *rmean, const float *rvar, double eps, int relu, double *y)
{
    for (int ch = 0; ch < C; ch++) {
        double is = 1.0 / sqrt((double)rvar[ch] + eps);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                size_t k = ((size_t)n * C + ch) * HW + i;
                double v = (x[k] - rmean[ch]) * is * gamma[ch] + beta[ch] + (r ? r[k] : 0.0);
                y[k] = relu && v < 0 ? 0 : v;
            }
    }
}

void tu_bn_ref_running(const float *rmean, const float *rvar, const double *mean, const double *var, int C, double M,
                       double mom, double *erm, double *erv)
{
    for (int ch = 0; ch < C; ch++) {
        erm[ch] = (1 - mom) * rmean[ch] + mom * mean[ch];
        erv[ch] = (1 - mom) * rvar[ch] + mom * var[ch] * M / (M - 1);
    }
}

void tu_bn_ref_backward(const float *x, const double *g, int N, int C, int HW, const float *gamma, const double *mean,
                        const double *var, double eps, double *dgamma, double *dbeta, double *dx)
{
    double M = (double)N * HW;
    for (int ch = 0; ch < C; ch++) {
        double is = 1.0 / sqrt(var[ch] + eps);
        dgamma[ch] = dbeta[ch] = 0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                size_t k = ((size_t)n * C + ch) * HW + i;
                dbeta[ch] += g[k];
                dgamma[ch] += g[k] * (x[k] - mean[ch]) * is;
            }
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                size_t k = ((size_t)n * C + ch) * HW + i;
                double xh = (x[k] - mean[ch]) * is;
                dx[k] = gamma[ch] * is * (g[k] - dbeta[ch] / M - xh * dgamma[ch] / M);
            }
    }
}

void tu_fill_blocks(float *C0, size_t n, float sentinel, size_t off, size_t stride, int batch, int M, int N, int ld,
                    int random, clg_rng *r)
{
    for (size_t i = 0; i < n; i++)
        C0[i] = sentinel;
    for (int b = 0; b < batch; b++)
        for (int m = 0; m < M; m++)
            for (int j = 0; j < N; j++) {
                float v;
                if (random)
                    tu_fill(&v, 1, -1, 1, r);
                else
                    tu_poison(&v, 1);
                C0[off + (size_t)b * stride + (size_t)m * ld + j] = v;
            }
}

size_t tu_count_stray(const float *before, const float *after, size_t n, float sentinel, const char *what)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (before[i] == sentinel && after[i] != sentinel)
            bad++;
    if (bad)
        fprintf(stderr, "%s: %zu elements outside the output were written\n", what, bad);
    return bad;
}

void tu_wait_event(cl_event ev)
{
    ck_assert_ptr_nonnull(ev);
    ck_assert_int_eq(clWaitForEvents(1, &ev), CL_SUCCESS);
    clReleaseEvent(ev);
}

static TCase *tcase_of(const char *name, double timeout, const TTest *const *tests, int n)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, timeout);
    for (int i = 0; i < n; i++)
        tcase_add_test(tc, tests[i]);
    return tc;
}

int tu_run_fixture(const char *name, double timeout, void (*setup)(void), void (*teardown)(void),
                   const TTest *const *tests, int n)
{
    Suite *s = suite_create(name);
    TCase *tc = tcase_of(name, timeout, tests, n);
    tcase_add_checked_fixture(tc, setup, teardown);
    suite_add_tcase(s, tc);
    return tu_run(s);
}

int tu_run_tests(const char *name, double timeout, const TTest *const *tests, int n)
{
    Suite *s = suite_create(name);
    suite_add_tcase(s, tcase_of(name, timeout, tests, n));
    return tu_run(s);
}

int tu_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    /* OpenCL runtimes keep threads that do not survive fork(): run in-process */
    srunner_set_fork_status(sr, CK_NOFORK);
    /* CK_VERBOSITY=verbose prints each case's result as it ends (CK_NORMAL when unset) */
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
