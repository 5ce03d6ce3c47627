/* Test helpers: device-or-skip, fresh random data, poisoning, references. */
#ifndef CLG_TESTUTIL_H
#define CLG_TESTUTIL_H

#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "device/device.h"

#define TU_SKIP 77

/* Seed for this process: $CLGRAD_TEST_SEED or time^pid (printed once). */
uint64_t tu_seed(void);
/* Context on `devices` (NULL: all); exits 77 (skip) when no device exists. */
clg_ctx *tu_ctx(const char *devices);
/* Context with a private cache directory (created under the build dir). */
clg_ctx *tu_ctx_cache(const char *devices, const char *cache_dir);
/* Context on every device with no timing-dependent choices (the convolution
 * algorithm and the GEMM backend of a shape are otherwise measured at first
 * use, so the first model of a context could compute with other kernels, and
 * other workspaces, than the second); mib > 0: every device capped at mib MiB
 * (option device_mem_limit). Exits 77 (skip) when no device exists. */
clg_ctx *tu_ctx_fixed(double mib);
/* The same with one more option set (name = value). */
clg_ctx *tu_ctx_fixed_opt(double mib, const char *name, const char *value);
/* Uniform in [lo, hi). */
void tu_fill(float *x, size_t n, float lo, float hi, clg_rng *r);
void tu_rng(clg_rng *r, uint64_t stream); /* seeded from tu_seed() */
/* NaN everywhere: an element a kernel fails to write stays NaN. */
void tu_poison(float *x, size_t n);
/* Device buffer of n floats from host (NULL host: poisoned), NaN after
 * them to the end of the (pool-sized) buffer. */
cl_mem tu_upload(clg_device *dev, const float *host, size_t n);
/* Device buffer holding host data at element offset off, NaN around it. */
cl_mem tu_upload_at(clg_device *dev, const float *host, size_t n, size_t off);
/* Writes n floats from host (NULL: NaN) and NaN after them over the whole
 * buffer. Whole-buffer writes matter under oclgrind 21.10: its
 * --uninitialized checker resizes a buffer's shadow memory to each host
 * write, so kernel stores past a partial write are not recorded and a pool
 * buffer reused as a workspace later reads as uninitialized (evidence and
 * reproducer: tests/oclgrind_check.sh). */
void tu_write_full(clg_device *dev, cl_mem m, const float *host, size_t n);
void tu_download(clg_device *dev, cl_mem m, float *host, size_t n);
/* n floats from element offset off (malloc'd, one spare element); fails
 * unless the NaN before off and the one after the n floats are intact
 * (buffers from tu_upload_at). */
float *tu_download_at(clg_device *dev, cl_mem m, size_t n, size_t off);
/* max |got - ref| / (|ref| + atol); NaN in got gives +inf. */
double tu_max_err(const float *got, const double *ref, size_t n, double atol);
/* Row-major double reference: C = alpha*op(A)op(B) + beta*C. */
void tu_gemm_ref(int ta, int tb, int M, int N, int K, double alpha, const float *A, int lda, const float *B, int ldb,
                 double beta, double *C, int ldc);
/* Batch-norm references in double over x (N x C x HW): y = bn(x) [+ r]
 * [then relu] with the batch statistics (written to mean, var: biased) or
 * with given running statistics; NULL r: no residual. */
void tu_bn_ref_train(const float *x, const float *r, int N, int C, int HW, const float *gamma, const float *beta,
                     double eps, int relu, double *y, double *mean, double *var);
void tu_bn_ref_infer(const float *x, const float *r, int N, int C, int HW, const float *gamma, const float *beta,
                     const float *rmean, const float *rvar, double eps, int relu, double *y);
/* The running statistics after a training step with momentum mom over
 * M = N HW values per channel (unbiased variance): erm, erv (C doubles). */
void tu_bn_ref_running(const float *rmean, const float *rvar, const double *mean, const double *var, int C, double M,
                       double mom, double *erm, double *erv);
/* The training backward for the output gradient g (doubles): dgamma,
 * dbeta (C doubles, overwritten) and dx (N C HW doubles). */
void tu_bn_ref_backward(const float *x, const double *g, int N, int C, int HW, const float *gamma, const double *mean,
                        const double *var, double eps, double *dgamma, double *dbeta, double *dx);
/* GEMM output buffers: C0[0..n) = sentinel, then batch blocks of M x N at
 * off + b stride, row stride ld, random in [-1, 1) (random != 0) or NaN. */
void tu_fill_blocks(float *C0, size_t n, float sentinel, size_t off, size_t stride, int batch, int M, int N, int ld,
                    int random, clg_rng *r);
/* Elements that held sentinel in before and hold something else in after:
 * writes outside the blocks (printed as `what` when any). */
size_t tu_count_stray(const float *before, const float *after, size_t n, float sentinel, const char *what);
/* Asserts an operation's event out, waits for it and releases it. */
void tu_wait_event(cl_event ev);
/* Runs a Check suite; returns the process exit code. */
int tu_run(Suite *s);
/* Runs tests[0..n) as one suite and test case called `name` with a timeout
 * of `timeout` s (tu_run); returns the process exit code. */
int tu_run_tests(const char *name, double timeout, const TTest *const *tests, int n);
/* The same with a checked fixture (setup, teardown around every test). */
int tu_run_fixture(const char *name, double timeout, void (*setup)(void), void (*teardown)(void),
                   const TTest *const *tests, int n);

#endif
