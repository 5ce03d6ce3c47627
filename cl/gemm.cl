// GEMM kernels. Row-major; see src/ops/gemm.h for the argument contract.
// Reference kernel: one work-item per C element, guarded for any M, N, K.
// TA/TB select op(A)/op(B) at run time through kernel arguments.

__kernel void gemm_ref(const int M, const int N, const int K, const float alpha, const float beta,
                       const int ta, const int tb,
                       __global const float *A, const int offA, const int lda, const int strideA,
                       __global const float *B, const int offB, const int ldb, const int strideB,
                       __global float *C, const int offC, const int ldc, const int strideC,
                       __global const float *bias, const int offBias, const int bias_mode, const int relu)
{
    const int n = get_global_id(0);
    const int m = get_global_id(1);
    const int b = get_global_id(2);
    if (m >= M || n >= N)
        return;
    __global const float *a = A + offA + b * strideA;
    __global const float *bb = B + offB + b * strideB;
    __global float *c = C + offC + b * strideC;
    float acc = 0.0f;
    for (int k = 0; k < K; k++) {
        float av = ta ? a[k * lda + m] : a[m * lda + k];
        float bv = tb ? bb[n * ldb + k] : bb[k * ldb + n];
        acc = fma(av, bv, acc);
    }
    float v = alpha * acc;
    if (beta != 0.0f)
        v += beta * c[m * ldc + n];
    if (bias_mode == 1)
        v += bias[offBias + m];
    else if (bias_mode == 2)
        v += bias[offBias + n];
    if (relu)
        v = fmax(v, 0.0f);
    c[m * ldc + n] = v;
}
