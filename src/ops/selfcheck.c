/* clg_selfcheck: a small GEMM on every device against a double reference. */
#include <math.h>
#include <stdlib.h>

#include "gemm.h"

static clg_status check_device(clg_device *dev, double *worst)
{
    const int M = 67, N = 45, K = 93;
    clg_err *err = clg_dev_err(dev);
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N), *C = malloc(sizeof(float) * M * N);
    cl_mem dA = NULL, dB = NULL, dC = NULL;
    clg_status st = CLG_OK;
    if (!A || !B || !C) {
        st = clg_err_set(err, CLG_ERR_HOST_OOM, "no memory");
        goto done;
    }
    clg_rng r;
    clg_rng_seed(&r, 1234, (uint64_t)dev->index);
    for (int i = 0; i < M * K; i++)
        A[i] = clg_rng_uniform(&r) * 2 - 1;
    for (int i = 0; i < K * N; i++)
        B[i] = clg_rng_uniform(&r) * 2 - 1;
    for (int i = 0; i < M * N; i++)
        C[i] = NAN; /* poison */
    if ((st = clg_buf_alloc(dev, sizeof(float) * M * K, &dA)) || (st = clg_buf_alloc(dev, sizeof(float) * K * N, &dB)) ||
        (st = clg_buf_alloc(dev, sizeof(float) * M * N, &dC)))
        goto done;
    cl_int e = clEnqueueWriteBuffer(dev->queue, dA, CL_FALSE, 0, sizeof(float) * M * K, A, 0, NULL, NULL);
    if (e == CL_SUCCESS)
        e = clEnqueueWriteBuffer(dev->queue, dB, CL_FALSE, 0, sizeof(float) * K * N, B, 0, NULL, NULL);
    if (e == CL_SUCCESS)
        e = clEnqueueWriteBuffer(dev->queue, dC, CL_FALSE, 0, sizeof(float) * M * N, C, 0, NULL, NULL);
    if (e != CL_SUCCESS) {
        st = clg_cl_fail(err, e, "clEnqueueWriteBuffer", __FILE__, __LINE__);
        goto done;
    }
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = dA;
    g.lda = K;
    g.B = dB;
    g.ldb = N;
    g.C = dC;
    g.ldc = N;
    if ((st = clg_gemm(dev, &g, NULL)) != CLG_OK)
        goto done;
    e = clEnqueueReadBuffer(dev->queue, dC, CL_TRUE, 0, sizeof(float) * M * N, C, 0, NULL, NULL);
    if (e != CL_SUCCESS) {
        st = clg_cl_fail(err, e, "clEnqueueReadBuffer", __FILE__, __LINE__);
        goto done;
    }
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                ref += (double)A[m * K + k] * B[k * N + n];
                mag += fabs((double)A[m * K + k] * B[k * N + n]);
            }
            double rel = fabs(C[m * N + n] - ref) / (mag + 1e-30);
            if (!(rel <= 1e-5)) { /* NaN fails too */
                st = clg_err_set(err, CLG_ERR_INTERNAL,
                                 "self-check failed on device %d (%s): C[%d,%d] = %g, expected %g", dev->index,
                                 dev->info.name, m, n, C[m * N + n], ref);
                goto done;
            }
            if (rel > *worst)
                *worst = rel;
        }
done:
    clg_buf_release(dev, dA);
    clg_buf_release(dev, dB);
    clg_buf_release(dev, dC);
    free(A);
    free(B);
    free(C);
    return st;
}

clg_status clg_selfcheck(clg_ctx *ctx, double *max_rel_err)
{
    if (!ctx)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_selfcheck: NULL context");
    double worst = 0;
    for (int i = 0; i < ctx->ndev; i++)
        CLG_TRY(check_device(&ctx->devs[i], &worst));
    if (max_rel_err)
        *max_rel_err = worst;
    return CLG_OK;
}
