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
/* Uniform in [lo, hi). */
void tu_fill(float *x, size_t n, float lo, float hi, clg_rng *r);
void tu_rng(clg_rng *r, uint64_t stream); /* seeded from tu_seed() */
/* NaN everywhere: an element a kernel fails to write stays NaN. */
void tu_poison(float *x, size_t n);
/* Device buffer initialised from host (NULL host: poisoned). */
cl_mem tu_upload(clg_device *dev, const float *host, size_t n);
void tu_download(clg_device *dev, cl_mem m, float *host, size_t n);
/* max |got - ref| / (|ref| + atol); NaN in got gives +inf. */
double tu_max_err(const float *got, const double *ref, size_t n, double atol);
/* Row-major double reference: C = alpha*op(A)op(B) + beta*C. */
void tu_gemm_ref(int ta, int tb, int M, int N, int K, double alpha, const float *A, int lda, const float *B, int ldb,
                 double beta, double *C, int ldc);
/* Runs a Check suite; returns the process exit code. */
int tu_run(Suite *s);

#endif
