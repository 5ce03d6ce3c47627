/* GEMM launcher: argument checks and backend choice. */
#include <string.h>

#include "gemm.h"

void clg_gemm_args_init(clg_gemm_args *a)
{
    memset(a, 0, sizeof *a);
    a->alpha = 1.0f;
    a->beta = 0.0f;
    a->batch = 1;
}

static clg_status check_args(clg_device *dev, const clg_gemm_args *a)
{
    clg_err *err = clg_dev_err(dev);
    if (a->M < 0 || a->N < 0 || a->K < 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: negative size M=%d N=%d K=%d", a->M, a->N, a->K);
    if (!a->A || !a->B || !a->C)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: NULL buffer");
    int rowsA = a->ta ? a->K : a->M, colsA = a->ta ? a->M : a->K;
    int rowsB = a->tb ? a->N : a->K, colsB = a->tb ? a->K : a->N;
    (void)rowsA;
    (void)rowsB;
    if (a->lda < CLG_MAX(1, colsA) || a->ldb < CLG_MAX(1, colsB) || a->ldc < CLG_MAX(1, a->N))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: leading dimension too small (lda=%d ldb=%d ldc=%d)",
                           a->lda, a->ldb, a->ldc);
    if (a->bias_mode != CLG_BIAS_NONE && !a->bias)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: bias mode set without a bias buffer");
    return CLG_OK;
}

static clg_status gemm_ref(clg_device *dev, const clg_gemm_args *a, cl_event *ev)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "gemm", "", "gemm_ref", &k));
    int batch = a->batch > 0 ? a->batch : 1;
    int offA = (int)a->offA, offB = (int)a->offB, offC = (int)a->offC, offBias = (int)a->offBias;
    int sA = (int)a->strideA, sB = (int)a->strideB, sC = (int)a->strideC;
    int bm = (int)a->bias_mode;
    cl_mem bias = a->bias ? a->bias : a->C;
    int i = 0;
    clg_err *err = clg_dev_err(dev);
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &a->M));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &a->N));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &a->K));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(float), &a->alpha));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(float), &a->beta));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &a->ta));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &a->tb));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(cl_mem), &a->A));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &offA));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &a->lda));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &sA));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(cl_mem), &a->B));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &offB));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &a->ldb));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &sB));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(cl_mem), &a->C));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &offC));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &a->ldc));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &sC));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(cl_mem), &bias));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &offBias));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &bm));
    CLG_CL_CHECK(err, clSetKernelArg(k, i++, sizeof(int), &a->relu));
    size_t gws[3] = {(size_t)a->N, (size_t)a->M, (size_t)batch};
    CLG_CL_CHECK(err, clEnqueueNDRangeKernel(dev->queue, k, 3, NULL, gws, NULL, 0, NULL, ev));
    return CLG_OK;
}

clg_status clg_gemm(clg_device *dev, const clg_gemm_args *a, cl_event *ev)
{
    if (ev)
        *ev = NULL;
    CLG_TRY(check_args(dev, a));
    if (a->M == 0 || a->N == 0 || (a->batch > 0 ? a->batch : 1) == 0)
        return CLG_OK;
    return gemm_ref(dev, a, ev);
}
