/* cuBLAS SGEMM 2048^3 probe for bench/device-check.sh: the vendor BLAS figure
 * beside clgrad's own GEMM on an NVIDIA machine. Built by
 * tools/device-bundle.sh where nvcc is found (links libcublas dynamically:
 * it runs where the CUDA runtime libraries are), or by device-check.sh on a
 * machine with nvcc. Operands are zeros: the figure is speed only. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
int main(void)
{
    const int n = 2048, reps = 10;
    float *a, *b, *c, one = 1, zero = 0;
    cudaMalloc((void **)&a, sizeof(float) * n * n);
    cudaMalloc((void **)&b, sizeof(float) * n * n);
    cudaMalloc((void **)&c, sizeof(float) * n * n);
    cudaMemset(a, 0, sizeof(float) * n * n);
    cudaMemset(b, 0, sizeof(float) * n * n);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { puts("cublasCreate failed"); return 1; }
    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < reps; i++)
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    printf("cublas sgemm 2048^3: %.3f ms, %.1f GFLOP/s (fp32, default math mode)\n", ms / reps,
           2.0 * n * n * n / (ms / reps) / 1e6);
    return 0;
}
