/* The transformer MLP's fused passes against double-precision references:
 *   - clg_gemm with a GELU epilogue (clg_gemm_args.gelu, erf and tanh forms):
 *     C = gelu(A B^T + bias) and the pre-activation (forms 3, 4: the GELU's
 *     derivative there), through the own CPU
 *     kernel's epilogue (chosen and explicit parameters, split-K asked for),
 *     the unpacked and reference paths (product, then the activation pass);
 *   - clg_nn_act_bwd_colsum: dz = dy * gelu'(x) and the bias gradient
 *     colsum(dz) in one pass (chunks of 64 rows); clg_nn_dmul_colsum the
 *     same with the derivative given;
 *   - clg_nn_colsum on tall matrices (the chunked two-stage form).
 * Fresh random inputs per case, outputs poisoned (NaN) before the kernels
 * write them, odd sizes (1 row, rows not a multiple of the chunk, columns
 * not a multiple of the vector width). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gemm.h"
#include "ops/nn.h"
#include "gemm_testutil.h"

#define TOL 1e-4 /* |got - ref| / (|ref| + 1); inputs in [-1, 1], K <= a few hundred */

TG_FIXTURE()
static uint64_t stream = 300;

static double gelu_ref(int form, double v)
{
    if (form == 1)
        return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
    return 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
}

static double gelu_grad_ref(int form, double v)
{
    if (form == 1)
        return 0.5 * (1.0 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI);
    double k = sqrt(2.0 / M_PI), u = k * (v + 0.044715 * v * v * v), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * v * v);
}

/* C (M x N, at offset offC) = gelu(A (M x K) B^T (B: N x K) + bias[n]) with
 * pre-activation; p NULL: clg_gemm's choice with backend b. Returns the
 * larger error of C and pre. */
static double gelu_case(int form, int M, int N, int K, int offC, clg_gemm_backend b, const clg_gemm_params *p)
{
    clg_rng r;
    tu_rng(&r, stream++);
    size_t nA = (size_t)M * K, nB = (size_t)N * K, nC = (size_t)M * N;
    float *A = malloc(sizeof(float) * nA), *B = malloc(sizeof(float) * nB), *bias = malloc(sizeof(float) * N);
    float *C = malloc(sizeof(float) * (nC + offC)), *pre = malloc(sizeof(float) * nC);
    double *ref = malloc(sizeof(double) * nC), *gref = malloc(sizeof(double) * nC);
    ck_assert(A && B && bias && C && pre && ref && gref);
    tu_fill(A, nA, -1, 1, &r);
    tu_fill(B, nB, -1, 1, &r);
    tu_fill(bias, N, -1, 1, &r);
    tu_poison(C, nC + offC);
    tu_poison(pre, nC);
    cl_mem dA = tu_upload(dev, A, nA), dB = tu_upload(dev, B, nB), dbias = tu_upload(dev, bias, N);
    cl_mem dC = tu_upload(dev, C, nC + offC), dpre = tu_upload(dev, pre, nC);
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.tb = 1;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = dA;
    g.lda = K;
    g.B = dB;
    g.ldb = K;
    g.C = dC;
    g.offC = (size_t)offC;
    g.ldc = N;
    g.bias = dbias;
    g.bias_mode = CLG_BIAS_COL;
    g.gelu = form;
    g.pre = dpre;
    clg_status st = clg_gemm_run(dev, &g, b, p, NULL, NULL);
    if (st != CLG_OK)
        fprintf(stderr, "gemm gelu: %s\n", clg_last_error(ctx));
    ck_assert_int_eq(st, CLG_OK);
    tu_download(dev, dC, C, nC + offC);
    tu_download(dev, dpre, pre, nC);
    memset(ref, 0, sizeof(double) * nC);
    tu_gemm_ref(0, 1, M, N, K, 1.0, A, K, B, K, 0.0, ref, N);
    for (size_t i = 0; i < nC; i++) {
        ref[i] += bias[i % N];
        gref[i] = gelu_ref(form > 2 ? form - 2 : form, ref[i]);
        if (form > 2) /* pre: the derivative */
            ref[i] = gelu_grad_ref(form - 2, ref[i]);
    }
    double e = CLG_MAX(tu_max_err(pre, ref, nC, 1.0), tu_max_err(C + offC, gref, nC, 1.0));
    for (int i = 0; i < offC; i++) /* before offC: untouched (still NaN) */
        ck_assert(isnan(C[i]));
    if (e > TOL)
        fprintf(stderr, "gelu %d M=%d N=%d K=%d backend %d: error %g\n", form, M, N, K, (int)b, e);
    clReleaseMemObject(dA);
    clReleaseMemObject(dB);
    clReleaseMemObject(dbias);
    clReleaseMemObject(dC);
    clReleaseMemObject(dpre);
    free(A), free(B), free(bias), free(C), free(pre), free(ref), free(gref);
    return e;
}

START_TEST(test_gemm_gelu)
{
    /* the first chosen case below runs the packed kernel (its fused epilogue), the next two unpacked */
    clg_gemm_args shape;
    clg_gemm_args_init(&shape);
    shape.tb = 1;
    shape.M = 700, shape.N = 77, shape.K = 160;
    char what[128];
    clg_gemm_own_describe(dev, &shape, what, sizeof what);
    ck_assert_msg(strncmp(what, "unpacked", 8) != 0 || !(dev->info.type & CLG_DEVICE_CPU), "%s", what);
    clg_gemm_params p1 = tg_cpu_params(4, 1, 8, 2, 0), p2 = tg_cpu_params(6, 2, 16, 1, 3); /* KS 3 asked: forced to 1 */
    for (int form = 1; form <= 4; form++) {
        /* chosen: packed (large) and unpacked (small) products; the gpt-mini MLP shape scaled down */
        ck_assert(gelu_case(form, 700, 77, 160, 3, CLG_GEMM_OWN, NULL) <= TOL);
        ck_assert(gelu_case(form, 1, 5, 3, 0, CLG_GEMM_OWN, NULL) <= TOL);
        ck_assert(gelu_case(form, 37, 45, 19, 1, CLG_GEMM_OWN, NULL) <= TOL);
        /* explicit CPU parameters: partial vectors and tiles, one row (forms 3, 4: one kernel variant) */
        ck_assert(gelu_case(form, 29, 23, 17, 2, CLG_GEMM_OWN, &p1) <= TOL);
        ck_assert(gelu_case(form, 1, 33, 600, 0, CLG_GEMM_OWN, form <= 2 ? &p2 : &p1) <= TOL);
        ck_assert(form > 2 || gelu_case(form, 61, 50, 7, 5, CLG_GEMM_OWN, &p2) <= TOL);
        /* the reference backend: product into pre, then the activation pass */
        ck_assert(gelu_case(form, 13, 11, 9, 2, CLG_GEMM_REF, NULL) <= TOL);
    }
}
END_TEST

/* Bad GELU arguments are refused with a message. */
START_TEST(test_gemm_gelu_errors)
{
    float z[16] = {0};
    cl_mem m = tu_upload(dev, z, 16);
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.tb = 1;
    g.M = g.N = g.K = 2;
    g.A = g.B = g.C = m;
    g.lda = g.ldb = g.ldc = 2;
    g.gelu = 1; /* no pre */
    ck_assert_int_eq(clg_gemm(dev, &g, NULL), CLG_ERR_INVALID_ARG);
    ck_assert(strstr(clg_last_error(ctx), "pre-activation") != NULL);
    g.pre = m;
    g.gelu = 5;
    ck_assert_int_eq(clg_gemm(dev, &g, NULL), CLG_ERR_INVALID_ARG);
    g.gelu = 1;
    ck_assert_int_eq(clg_gemm_dot(dev, &g, NULL), CLG_ERR_UNSUPPORTED);
    ck_assert_int_eq(clg_nn_act_bwd_colsum(dev, CLG_ACT_RELU, 2, 2, m, 0, m, 0, m, 0, m, 0), CLG_ERR_UNSUPPORTED);
    clReleaseMemObject(m);
}
END_TEST

/* dz = dy * gelu'(x), db = colsum(dz) (form 1, 2), dz = dy * x (form 3:
 * clg_nn_dmul_colsum), or db = colsum(dy) (form 0: clg_nn_colsum); returns
 * the larger error of dz and db. */
static double bwd_case(int form, size_t rows, size_t cols, size_t off)
{
    clg_rng r;
    tu_rng(&r, stream++);
    size_t n = rows * cols;
    float *x = malloc(sizeof(float) * (n + off + 1)), *dy = malloc(sizeof(float) * (n + off + 1));
    float *dz = malloc(sizeof(float) * (n + 1)), *db = malloc(sizeof(float) * (cols + 2));
    double *rz = malloc(sizeof(double) * (n + 1)), *rb = calloc(cols, sizeof(double));
    ck_assert(x && dy && dz && db && rz && rb);
    tu_fill(x, n + off + 1, -4, 4, &r);
    tu_fill(dy, n + off + 1, -1, 1, &r);
    tu_poison(dz, n + 1);
    tu_poison(db, cols + 2);
    cl_mem dx = tu_upload(dev, x, n + off + 1), ddy = tu_upload(dev, dy, n + off + 1);
    cl_mem ddz = tu_upload(dev, dz, n + 1), ddb = tu_upload(dev, db, cols + 2);
    clg_status st = form == 3 ? clg_nn_dmul_colsum(dev, rows, cols, dx, off, ddy, off, ddz, 0, ddb, 1)
                    : form  ? clg_nn_act_bwd_colsum(dev, form == 1 ? CLG_ACT_GELU : CLG_ACT_GELU_TANH, rows, cols,
                                                    dx, off, ddy, off, ddz, 0, ddb, 1)
                            : clg_nn_colsum(dev, rows, cols, ddy, off, ddb, 1);
    if (st != CLG_OK)
        fprintf(stderr, "bwd colsum: %s\n", clg_last_error(ctx));
    ck_assert_int_eq(st, CLG_OK);
    tu_download(dev, ddz, dz, n + 1);
    tu_download(dev, ddb, db, cols + 2);
    for (size_t i = 0; i < n; i++) {
        rz[i] = form == 3 ? (double)dy[off + i] * x[off + i]
                : form    ? dy[off + i] * gelu_grad_ref(form, x[off + i])
                          : dy[off + i];
        rb[i % cols] += rz[i];
    }
    double e = tu_max_err(db + 1, rb, cols, 1.0);
    ck_assert(isnan(db[0]) && isnan(db[cols + 1])); /* only db[1 .. cols] written */
    if (form) {
        e = CLG_MAX(e, tu_max_err(dz, rz, n, 1.0));
        ck_assert(isnan(dz[n]));
    }
    if (e > TOL)
        fprintf(stderr, "bwd colsum form %d rows %zu cols %zu: error %g\n", form, rows, cols, e);
    clReleaseMemObject(dx);
    clReleaseMemObject(ddy);
    clReleaseMemObject(ddz);
    clReleaseMemObject(ddb);
    free(x), free(dy), free(dz), free(db), free(rz), free(rb);
    return e;
}

START_TEST(test_act_bwd_colsum)
{
    for (int form = 1; form <= 3; form++) {
        ck_assert(bwd_case(form, 1, 7, 0) <= TOL);
        ck_assert(bwd_case(form, 65, 17, 3) <= TOL);
        ck_assert(bwd_case(form, 1000, 130, 1) <= TOL);
        ck_assert(bwd_case(form, 64, 1, 0) <= TOL);
        /* columns a multiple of 8: the float8 kernels */
        ck_assert(bwd_case(form, 1, 8, 0) <= TOL);
        ck_assert(bwd_case(form, 300, 136, 3) <= TOL);
    }
}
END_TEST

START_TEST(test_colsum_tall)
{
    ck_assert(bwd_case(0, 511, 9, 2) <= TOL); /* the one-pass kernel */
    ck_assert(bwd_case(0, 512, 9, 0) <= TOL); /* chunked from here */
    ck_assert(bwd_case(0, 4097, 131, 5) <= TOL);
    ck_assert(bwd_case(0, 700, 1, 0) <= TOL);
    ck_assert(bwd_case(0, 1000, 136, 3) <= TOL); /* columns a multiple of 8: colsum_part8 */
}
END_TEST

int main(void)
{
    const TTest *const all[] = {test_gemm_gelu, test_gemm_gelu_errors, test_act_bwd_colsum, test_colsum_tall};
    return tu_run_fixture("gemm-gelu", 300, setup, teardown, all, (int)(sizeof all / sizeof all[0]));
}
