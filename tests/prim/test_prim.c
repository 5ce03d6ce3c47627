/* The primitives API (include/clgrad_prim.h) through the shared library, on
 * a context and queue this test creates itself, against double-precision C
 * references: fresh random inputs (seed printed; CLGRAD_TEST_SEED repeats a
 * run), outputs poisoned with NaN before the kernels write them, every
 * convolution algorithm on every pass it supports, GEMM transposes, alpha /
 * beta and epilogues on odd shapes, pooling, softmax; event wait lists and
 * out events (a user event holds a call back; a second queue waits on the
 * first; the wait list reaches one launch, several, CLBlast's and clFFT's
 * enqueues and an empty op); argument errors; the size field of the params structs; reference
 * counts of the caller's queue and context.
 * CLGRAD_TEST_TINY=1 (the oclgrind run): small shapes of GEMM (own kernels),
 * pooling and softmax only. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clgrad_prim.h"
#include "conv/conv_ref.h" /* double-precision convolution references (plain C) */

/* Output sizes for conv_ref.c (the library's own are not exported). */
static int out_dim(int in, int pad, int k, int dil, int stride) { return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1; }
int clg_conv_out_h(const clg_conv_shape *s) { return out_dim(s->H, s->pad_h, s->R, s->dil_h, s->stride_h); }
int clg_conv_out_w(const clg_conv_shape *s) { return out_dim(s->W, s->pad_w, s->S, s->dil_w, s->stride_w); }

// ---- fixture: the caller's OpenCL objects ----

static cl_context g_ctx;
static cl_device_id g_dev;
static cl_command_queue g_q;
static clg_prim *g_h;
static uint64_t g_rng;
static int g_tiny; /* CLGRAD_TEST_TINY: oclgrind, ~100x slower */

static uint64_t seed_value(void)
{
    const char *e = getenv("CLGRAD_TEST_SEED");
    return e && *e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
}

static double urand(void) /* uniform [-1, 1) (splitmix64) */
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static float *rand_vec(size_t n)
{
    float *v = malloc((n ? n : 1) * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)urand();
    return v;
}

static cl_mem buf_from(const float *host, size_t n)
{
    cl_int e;
    cl_mem m = clCreateBuffer(g_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, (n ? n : 1) * sizeof(float),
                              (void *)host, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    return m;
}

static cl_mem buf_nan(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    cl_mem m = buf_from(p, n);
    free(p);
    return m;
}

static void read_buf(cl_mem m, float *host, size_t n)
{
    ck_assert_int_eq(clEnqueueReadBuffer(g_q, m, CL_TRUE, 0, n * sizeof(float), host, 0, NULL, NULL), CL_SUCCESS);
}

#define CHECK_OK(call)                                                                                  \
    do {                                                                                                \
        clg_status st_ = (call);                                                                        \
        ck_assert_msg(st_ == CLG_OK, "%s -> %s: %s", #call, clg_status_name(st_), clg_prim_last_error(g_h)); \
    } while (0)

static void setup(void)
{
    cl_platform_id plats[16];
    cl_uint np = 0;
    if (clGetPlatformIDs(16, plats, &np) != CL_SUCCESS || np == 0) {
        fprintf(stderr, "skip: no OpenCL platform\n");
        exit(77);
    }
    cl_int e = CL_DEVICE_NOT_FOUND;
    for (cl_uint i = 0; i < np && e != CL_SUCCESS; i++)
        e = clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, 1, &g_dev, NULL);
    if (e != CL_SUCCESS) {
        fprintf(stderr, "skip: no OpenCL device\n");
        exit(77);
    }
    g_ctx = clCreateContext(NULL, 1, &g_dev, NULL, NULL, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    g_q = clCreateCommandQueue(g_ctx, g_dev, 0, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    clg_prim_params pp;
    clg_prim_params_init(&pp);
    clg_status st = clg_prim_create(g_q, &pp, &g_h);
    ck_assert_msg(st == CLG_OK, "clg_prim_create: %s", clg_last_error(NULL));
}

static void teardown(void)
{
    clg_prim_destroy(g_h);
    g_h = NULL;
    clReleaseCommandQueue(g_q);
    clReleaseContext(g_ctx);
}

// ---- GEMM ----

/* C = epi(alpha op(A) op(B) + beta C0) in double; returns max |C - ref| / max(1, max |ref|),
 * and checks the padding columns of C (ldc > n) kept their values. */
static double gemm_case(clg_prim *h, int ta, int tb, size_t M, size_t N, size_t K, float alpha, float beta,
                        int bias_mode, int relu)
{
    size_t ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
    size_t lda = ca + 3, ldb = cb + 1, ldc = N + 2, oa = 5, ob = 2, oc = 7, obias = 3;
    size_t na = oa + ra * lda, nb = ob + rb * ldb, nc = oc + M * ldc;
    float *A = rand_vec(na), *B = rand_vec(nb), *C0 = rand_vec(nc), *bias = rand_vec(obias + (M > N ? M : N));
    if (beta == 0.0f) /* never read: poison, a read shows as NaN */
        for (size_t i = 0; i < nc; i++)
            C0[i] = NAN;
    cl_mem a = buf_from(A, na), b = buf_from(B, nb), c = buf_from(C0, nc);
    cl_mem bb = buf_from(bias, obias + (M > N ? M : N));
    clg_prim_gemm_epilogue epi;
    clg_prim_gemm_epilogue_init(&epi);
    epi.bias = bias_mode ? bb : NULL;
    epi.bias_offset = obias;
    epi.bias_mode = (clg_prim_bias_mode)bias_mode;
    epi.relu = relu;
    clg_status st = clg_prim_sgemm(h, ta ? CLG_PRIM_TRANS : CLG_PRIM_NO_TRANS, tb ? CLG_PRIM_TRANS : CLG_PRIM_NO_TRANS,
                                   M, N, K, alpha, a, oa, lda, b, ob, ldb, beta, c, oc, ldc, &epi, 0, NULL, NULL);
    ck_assert_msg(st == CLG_OK, "sgemm: %s", clg_prim_last_error(h));
    float *C = malloc(nc * sizeof *C);
    read_buf(c, C, nc);
    double maxref = 1, maxerr = 0;
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < N; j++) {
            double acc = 0;
            for (size_t p = 0; p < K; p++) {
                double av = ta ? A[oa + p * lda + i] : A[oa + i * lda + p];
                double bv = tb ? B[ob + j * ldb + p] : B[ob + p * ldb + j];
                acc += av * bv;
            }
            double r = alpha * acc + (beta != 0.0f ? beta * (double)C0[oc + i * ldc + j] : 0.0);
            if (bias_mode == CLG_PRIM_BIAS_ROW)
                r += bias[obias + i];
            if (bias_mode == CLG_PRIM_BIAS_COL)
                r += bias[obias + j];
            if (relu && r < 0)
                r = 0;
            double got = C[oc + i * ldc + j];
            ck_assert_msg(isfinite(got), "C[%zu,%zu] not written or not finite (%g)", i, j, got);
            maxref = fmax(maxref, fabs(r));
            maxerr = fmax(maxerr, fabs(got - r));
        }
    for (size_t i = 0; i < M; i++) /* padding columns untouched */
        for (size_t j = N; j < ldc && oc + i * ldc + j < nc; j++) {
            float want = C0[oc + i * ldc + j], got = C[oc + i * ldc + j];
            ck_assert_msg((isnan(want) && isnan(got)) || want == got, "padding C[%zu,%zu] overwritten", i, j);
        }
    for (size_t i = 0; i < oc; i++)
        ck_assert_msg(isnan(C0[i]) ? isnan(C[i]) : C[i] == C0[i], "C before its offset overwritten");
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    clReleaseMemObject(c);
    clReleaseMemObject(bb);
    free(A);
    free(B);
    free(C0);
    free(C);
    free(bias);
    return maxerr / maxref;
}

static void gemm_all(clg_prim *h, const char *label)
{
    /* odd shapes, a single element, and one beyond a typical 64x64 tile */
    const size_t shapes[][3] = {{37, 29, 53}, {1, 1, 1}, {70, 67, 129}, {5, 130, 3}};
    const size_t tiny[][3] = {{7, 5, 9}, {1, 1, 1}};
    size_t nshapes = g_tiny ? 2 : sizeof shapes / sizeof shapes[0];
    for (size_t s = 0; s < nshapes; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                const int epis[][2] = {{0, 0}, {CLG_PRIM_BIAS_ROW, 0}, {CLG_PRIM_BIAS_COL, 1}, {0, 1}};
                int e = (int)((s * 4 + (size_t)ta * 2 + (size_t)tb) % 4);
                float alpha = (ta ^ tb) ? 0.5f : 1.0f, beta = tb ? 0.75f : 0.0f;
                const size_t *sh = g_tiny ? tiny[s] : shapes[s];
                double err = gemm_case(h, ta, tb, sh[0], sh[1], sh[2], alpha, beta, epis[e][0], epis[e][1]);
                /* fp32 sums of K products of [-1, 1) values: 5e-5 relative to the largest output
                 * (a wrong transpose, bias or ReLU gives errors of order 1) */
                ck_assert_msg(err <= 5e-5, "%s gemm M=%zu N=%zu K=%zu ta=%d tb=%d alpha=%g beta=%g bias=%d relu=%d: "
                              "rel err %.3g > 5e-5", label, sh[0], sh[1], sh[2], ta, tb,
                              (double)alpha, (double)beta, epis[e][0], epis[e][1], err);
            }
}

START_TEST(gemm_own)
{
    clg_prim_params pp;
    clg_prim_params_init(&pp);
    pp.gemm_backend = "own";
    clg_prim *h = NULL;
    ck_assert_msg(clg_prim_create(g_q, &pp, &h) == CLG_OK, "%s", clg_last_error(NULL));
    gemm_all(h, "own");
    clg_prim_destroy(h);
}
END_TEST

START_TEST(gemm_clblast)
{
    clg_prim_params pp;
    clg_prim_params_init(&pp);
    pp.gemm_backend = "clblast";
    if (g_tiny) { /* CLBlast's kernels are not ours to check under oclgrind */
        fprintf(stderr, "gemm_clblast: not run with CLGRAD_TEST_TINY\n");
        return;
    }
    clg_prim *h = NULL;
    clg_status st = clg_prim_create(g_q, &pp, &h);
    if (st == CLG_ERR_UNSUPPORTED) {
        fprintf(stderr, "note: built without CLBlast, clblast backend not tested (%s)\n", clg_last_error(NULL));
        return;
    }
    ck_assert_msg(st == CLG_OK, "%s", clg_last_error(NULL));
    gemm_all(h, "clblast");
    clg_prim_destroy(h);
}
END_TEST

START_TEST(gemm_auto_empty)
{
    if (!g_tiny) /* the automatic backend may time CLBlast */
        gemm_all(g_h, "auto");
    /* m == 0: nothing enqueued, the event still completes */
    cl_mem a = buf_nan(4), b = buf_nan(4), c = buf_nan(4);
    cl_event ev = NULL;
    CHECK_OK(clg_prim_sgemm(g_h, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, 0, 2, 2, 1, a, 0, 2, b, 0, 2, 0, c, 0, 2, NULL,
                            0, NULL, &ev));
    ck_assert_ptr_nonnull(ev);
    ck_assert_int_eq(clWaitForEvents(1, &ev), CL_SUCCESS);
    clReleaseEvent(ev);
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    clReleaseMemObject(c);
}
END_TEST

// ---- convolution ----

static clg_conv_shape to_shape(const clg_prim_conv_desc *d)
{
    return (clg_conv_shape){d->n, d->c, d->h, d->w, d->k, d->r, d->s, d->pad_h, d->pad_w, d->stride_h, d->stride_w,
                            d->dil_h, d->dil_w, d->groups};
}

static double max_rel(const float *got, const double *ref, size_t n, const char *what)
{
    double m = 1e-30, e = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(isfinite(got[i]), "%s[%zu] not written or not finite (%g)", what, i, (double)got[i]);
        m = fmax(m, fabs(ref[i]));
        e = fmax(e, fabs(got[i] - ref[i]));
    }
    return e / fmax(m, 1e-3);
}

/* Every algorithm on every pass it supports for shape d. */
static void conv_all(clg_prim_conv_desc *d)
{
    clg_conv_shape s = to_shape(d);
    char sh[200];
    cr_shape_str(&s, sh, sizeof sh);
    size_t nx = cr_nx(&s), nw = cr_nw(&s), ny = cr_ny(&s);
    int P = 0, Q = 0;
    CHECK_OK(clg_prim_conv_output_size(g_h, d, &P, &Q));
    ck_assert_uint_eq((size_t)d->n * d->k * P * Q, ny);
    const size_t ox = 3, ow = 1, oy = 2, ob = 4;
    float *x = rand_vec(nx + ox), *w = rand_vec(nw + ow), *bias = rand_vec(d->k + ob), *dy = rand_vec(ny + oy);
    float *dw0 = rand_vec(nw + ow), *db0 = rand_vec(d->k + ob);
    double *ry = malloc(ny * sizeof *ry), *rdx = malloc(nx * sizeof *rdx), *rdw = malloc(nw * sizeof *rdw);
    double *rdb = malloc(d->k * sizeof *rdb), *rdw1 = malloc(nw * sizeof *rdw1), *rdb1 = malloc(d->k * sizeof *rdb1);
    cr_fwd(&s, x + ox, w + ow, bias + ob, 1, ry);
    cr_bwd_data(&s, dy + oy, w + ow, rdx);
    cr_bwd_filter(&s, x + ox, dy + oy, 0.0f, NULL, rdw, rdb, NULL);
    cr_bwd_filter(&s, x + ox, dy + oy, 1.0f, dw0 + ow, rdw1, rdb1, db0 + ob);
    cl_mem X = buf_from(x, nx + ox), Wm = buf_from(w, nw + ow), B = buf_from(bias, d->k + ob), DY = buf_from(dy, ny + oy);
    float *got = malloc((nx + nw + ny + 64) * sizeof *got);
    int ran = 0;
    for (int a = 0; a < CLG_PRIM_CONV_ALGO_COUNT; a++) {
        /* tiny (oclgrind): AUTO times every candidate; clFFT's generated kernels are not ours */
        if (g_tiny && (a == CLG_PRIM_CONV_AUTO || a == CLG_PRIM_CONV_FFT))
            continue;
        d->algo = (clg_prim_conv_algo)a;
        /* F(4x4) sums more rounded terms: a looser stated bound */
        double tol = (a == CLG_PRIM_CONV_WINOGRAD4 || a == CLG_PRIM_CONV_WINOGRAD4_FUSED) ? 3e-4 : 1e-4;
        if (clg_prim_conv_algo_supported(d, d->algo, CLG_PRIM_CONV_FORWARD)) {
            cl_mem Y = buf_nan(ny + oy);
            CHECK_OK(clg_prim_conv_forward(g_h, d, X, ox, Wm, ow, B, ob, 1, Y, oy, 0, NULL, NULL));
            read_buf(Y, got, ny + oy);
            double e = max_rel(got + oy, ry, ny, "y");
            ck_assert_msg(e <= tol, "forward %s %s: rel err %.3g > %.0e", clg_prim_conv_algo_name(d->algo), sh, e, tol);
            ck_assert_msg(isnan(got[0]) && isnan(got[1]), "forward wrote before y's offset");
            clReleaseMemObject(Y);
            ran++;
        }
        if (clg_prim_conv_algo_supported(d, d->algo, CLG_PRIM_CONV_BACKWARD_DATA)) {
            cl_mem DX = buf_nan(nx + ox);
            CHECK_OK(clg_prim_conv_backward_data(g_h, d, DY, oy, Wm, ow, DX, ox, 0, NULL, NULL));
            read_buf(DX, got, nx + ox);
            double e = max_rel(got + ox, rdx, nx, "dx");
            ck_assert_msg(e <= tol, "bwd-data %s %s: rel err %.3g > %.0e", clg_prim_conv_algo_name(d->algo), sh, e, tol);
            clReleaseMemObject(DX);
            ran++;
        }
        if (clg_prim_conv_algo_supported(d, d->algo, CLG_PRIM_CONV_BACKWARD_FILTER)) {
            for (int acc = 0; acc < 2; acc++) { /* beta 0 on poisoned dw/db, then beta 1 */
                cl_mem DW = acc ? buf_from(dw0, nw + ow) : buf_nan(nw + ow);
                cl_mem DB = acc ? buf_from(db0, d->k + ob) : buf_nan(d->k + ob);
                CHECK_OK(clg_prim_conv_backward_filter(g_h, d, X, ox, DY, oy, (float)acc, DW, ow, DB, ob, 0, NULL,
                                                       NULL));
                read_buf(DW, got, nw + ow);
                double e = max_rel(got + ow, acc ? rdw1 : rdw, nw, "dw");
                ck_assert_msg(e <= tol, "bwd-filter %s beta %d %s: dw rel err %.3g > %.0e",
                              clg_prim_conv_algo_name(d->algo), acc, sh, e, tol);
                read_buf(DB, got, d->k + ob);
                e = max_rel(got + ob, acc ? rdb1 : rdb, (size_t)d->k, "db");
                ck_assert_msg(e <= 1e-4, "bwd-filter %s beta %d %s: db rel err %.3g", clg_prim_conv_algo_name(d->algo),
                              acc, sh, e);
                clReleaseMemObject(DW);
                clReleaseMemObject(DB);
            }
            ran++;
        }
    }
    ck_assert_int_ge(ran, g_tiny ? 3 : 4); /* auto on all three passes and at least one concrete algorithm */
    /* auto resolves to a concrete algorithm that supports the pass */
    d->algo = CLG_PRIM_CONV_AUTO;
    for (int p = 0; p < (g_tiny ? 0 : 3); p++) {
        clg_prim_conv_algo got_a = CLG_PRIM_CONV_AUTO;
        CHECK_OK(clg_prim_conv_algo_get(g_h, d, (clg_prim_conv_pass)p, &got_a));
        ck_assert_int_ne(got_a, CLG_PRIM_CONV_AUTO);
        ck_assert(clg_prim_conv_algo_supported(d, got_a, (clg_prim_conv_pass)p));
    }
    clReleaseMemObject(X);
    clReleaseMemObject(Wm);
    clReleaseMemObject(B);
    clReleaseMemObject(DY);
    free(x), free(w), free(bias), free(dy), free(dw0), free(db0), free(ry), free(rdx), free(rdw), free(rdb);
    free(rdw1), free(rdb1), free(got);
}

static clg_prim_conv_desc desc(int n, int c, int h, int w, int k, int r, int s, int pad_h, int pad_w, int stride,
                               int dil, int groups)
{
    clg_prim_conv_desc d;
    clg_prim_conv_desc_init(&d);
    d.n = n, d.c = c, d.h = h, d.w = w, d.k = k, d.r = r, d.s = s;
    d.pad_h = pad_h, d.pad_w = pad_w, d.stride_h = d.stride_w = stride, d.dil_h = d.dil_w = dil, d.groups = groups;
    return d;
}

START_TEST(conv_3x3)
{
    /* Winograd-eligible: every algorithm runs; odd spatial sizes cut tiles */
    clg_prim_conv_desc d = g_tiny ? desc(1, 8, 5, 7, 4, 3, 3, 1, 1, 1, 1, 1) : desc(2, 8, 9, 11, 12, 3, 3, 1, 1, 1, 1, 1);
    conv_all(&d);
}
END_TEST

START_TEST(conv_odd)
{
    clg_prim_conv_desc d = desc(3, 3, 10, 7, 5, 2, 3, 1, 0, 2, 1, 1); /* 2x3, stride 2, uneven padding */
    if (g_tiny) {
        d = desc(1, 4, 6, 5, 4, 2, 3, 1, 0, 2, 1, 2); /* 2x3, stride 2, two groups */
        conv_all(&d);
        return;
    }
    conv_all(&d);
    d = desc(2, 6, 9, 9, 4, 3, 3, 2, 2, 1, 2, 2); /* dilation 2, two groups */
    conv_all(&d);
    d = desc(2, 5, 8, 8, 5, 3, 3, 1, 1, 1, 1, 5); /* depthwise */
    conv_all(&d);
    d = desc(1, 4, 12, 12, 3, 5, 5, 2, 2, 1, 1, 1); /* 5x5 (FFT's case where built) */
    conv_all(&d);
}
END_TEST

// ---- pooling ----

static void pool_case(clg_prim_pool_mode mode, int n, int c, int h, int w, int win, int stride, int pad)
{
    clg_prim_pool_desc d;
    clg_prim_pool_desc_init(&d);
    d.mode = mode, d.n = n, d.c = c, d.h = h, d.w = w;
    d.win_h = d.win_w = win, d.stride_h = d.stride_w = stride, d.pad_h = d.pad_w = pad;
    int P = 0, Q = 0;
    CHECK_OK(clg_prim_pool_output_size(g_h, &d, &P, &Q));
    ck_assert_int_eq(P, (h + 2 * pad - win) / stride + 1);
    size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * P * Q;
    float *x = rand_vec(nx), *dy = rand_vec(ny), *got = malloc((nx + ny) * sizeof *got);
    double *ry = calloc(ny, sizeof *ry), *rdx = calloc(nx, sizeof *rdx);
    for (size_t pl = 0; pl < (size_t)n * c; pl++)
        for (int p = 0; p < P; p++)
            for (int q = 0; q < Q; q++) {
                double best = -INFINITY, sum = 0;
                long arg = -1;
                for (int i = 0; i < win; i++)
                    for (int j = 0; j < win; j++) {
                        int hh = p * stride - pad + i, ww = q * stride - pad + j;
                        if (hh < 0 || hh >= h || ww < 0 || ww >= w)
                            continue;
                        long idx = (long)(pl * h + hh) * w + ww;
                        sum += x[idx];
                        if (x[idx] > best) {
                            best = x[idx];
                            arg = idx;
                        }
                    }
                size_t o = (pl * P + p) * Q + q;
                if (mode == CLG_PRIM_POOL_MAX) {
                    ry[o] = best;
                    rdx[arg] += dy[o];
                } else {
                    ry[o] = sum / (win * win);
                    for (int i = 0; i < win; i++)
                        for (int j = 0; j < win; j++) {
                            int hh = p * stride - pad + i, ww = q * stride - pad + j;
                            if (hh >= 0 && hh < h && ww >= 0 && ww < w)
                                rdx[(pl * h + hh) * w + ww] += dy[o] / (win * win);
                        }
                }
            }
    cl_mem X = buf_from(x, nx), Y = buf_nan(ny), DY = buf_from(dy, ny), DX = buf_nan(nx);
    CHECK_OK(clg_prim_pool_forward(g_h, &d, X, 0, Y, 0, 0, NULL, NULL));
    read_buf(Y, got, ny);
    double e = max_rel(got, ry, ny, "pool y");
    ck_assert_msg(e <= 1e-6, "pool forward mode %d %dx%d/%d pad %d: rel err %.3g", mode, win, win, stride, pad, e);
    CHECK_OK(clg_prim_pool_backward(g_h, &d, mode == CLG_PRIM_POOL_MAX ? X : NULL, 0, DY, 0, DX, 0, 0, NULL, NULL));
    read_buf(DX, got, nx);
    e = max_rel(got, rdx, nx, "pool dx");
    ck_assert_msg(e <= 1e-6, "pool backward mode %d %dx%d/%d pad %d: rel err %.3g", mode, win, win, stride, pad, e);
    clReleaseMemObject(X), clReleaseMemObject(Y), clReleaseMemObject(DY), clReleaseMemObject(DX);
    free(x), free(dy), free(got), free(ry), free(rdx);
}

START_TEST(pool)
{
    for (int m = 0; m < 2; m++) {
        pool_case((clg_prim_pool_mode)m, 2, 3, 8, 10, 2, 2, 0); /* the vectorised 2x2 kernels */
        pool_case((clg_prim_pool_mode)m, 2, 3, 7, 9, 2, 2, 0);  /* odd sizes */
        pool_case((clg_prim_pool_mode)m, 1, 4, 9, 8, 3, 2, 1);  /* 3x3 stride 2 pad 1 */
        if (!g_tiny)
            pool_case((clg_prim_pool_mode)m, 3, 2, 5, 5, 3, 1, 0); /* overlapping windows */
    }
}
END_TEST

// ---- softmax ----

START_TEST(softmax)
{
    const size_t cases[][2] = {{3, 10}, {5, 1}, {2, 1000}, {7, 65}};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        size_t R = cases[t][0], C = cases[t][1], n = R * C;
        float *x = rand_vec(n), *dy = rand_vec(n), *got = malloc(n * sizeof *got);
        for (size_t i = 0; i < n; i++)
            x[i] *= 20.0f; /* large logits: the maximum must be subtracted */
        double *ry = malloc(n * sizeof *ry), *rdx = malloc(n * sizeof *rdx);
        for (size_t r = 0; r < R; r++) {
            double m = -INFINITY, s = 0, dot = 0;
            for (size_t c = 0; c < C; c++)
                m = fmax(m, x[r * C + c]);
            for (size_t c = 0; c < C; c++)
                s += exp((double)x[r * C + c] - m);
            for (size_t c = 0; c < C; c++)
                ry[r * C + c] = exp((double)x[r * C + c] - m) / s;
            for (size_t c = 0; c < C; c++)
                dot += dy[r * C + c] * ry[r * C + c];
            for (size_t c = 0; c < C; c++)
                rdx[r * C + c] = ry[r * C + c] * (dy[r * C + c] - dot);
        }
        cl_mem X = buf_from(x, n), Y = buf_nan(n), DY = buf_from(dy, n), DX = buf_nan(n);
        CHECK_OK(clg_prim_softmax_forward(g_h, R, C, X, 0, Y, 0, 0, NULL, NULL));
        read_buf(Y, got, n);
        /* logits up to +-20 in fp32: 1e-4 relative to the largest value */
        double e = max_rel(got, ry, n, "softmax y");
        ck_assert_msg(e <= 1e-4, "softmax %zux%zu: rel err %.3g", R, C, e);
        CHECK_OK(clg_prim_softmax_backward(g_h, R, C, Y, 0, DY, 0, DX, 0, 0, NULL, NULL));
        read_buf(DX, got, n);
        e = max_rel(got, rdx, n, "softmax dx");
        ck_assert_msg(e <= 1e-4, "softmax backward %zux%zu: rel err %.3g", R, C, e);
        CHECK_OK(clg_prim_softmax_forward(g_h, R, C, X, 0, X, 0, 0, NULL, NULL)); /* in place */
        read_buf(X, got, n);
        e = max_rel(got, ry, n, "softmax in place");
        ck_assert_msg(e <= 1e-4, "softmax in place %zux%zu: rel err %.3g", R, C, e);
        clReleaseMemObject(X), clReleaseMemObject(Y), clReleaseMemObject(DY), clReleaseMemObject(DX);
        free(x), free(dy), free(got), free(ry), free(rdx);
    }
}
END_TEST

// ---- layer normalization ----

START_TEST(layernorm)
{
    const size_t cases[][3] = {{3, 37, 1}, {1, 64, 1}, {6, 9, 0}, {5, 1, 1}};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        size_t R = cases[t][0], C = cases[t][1], n = R * C;
        int affine = (int)cases[t][2];
        float *x = rand_vec(n), *dy = rand_vec(n), *g = rand_vec(C), *b = rand_vec(C), *got = malloc(n * sizeof *got);
        for (size_t i = 0; i < n; i++)
            x[i] = x[i] * 0.5f + 100.0f * (float)(i / C % 3); /* rows far from 0: two passes keep the digits */
        for (size_t c = 0; c < C; c++)
            g[c] += 1.5f;
        double *ry = calloc(n, sizeof *ry), *rdx = calloc(n, sizeof *rdx), *rdg = calloc(C, sizeof *rdg),
               *rdb = calloc(C, sizeof *rdb);
        double term = 0; /* the largest |rstd * g * dy|: dx is a difference of such terms */
        for (size_t r = 0; r < R; r++) {
            double m = 0, v = 0, a = 0, bs = 0;
            for (size_t c = 0; c < C; c++)
                m += x[r * C + c];
            m /= (double)C;
            for (size_t c = 0; c < C; c++)
                v += (x[r * C + c] - m) * (x[r * C + c] - m);
            double rs = 1.0 / sqrt(v / (double)C + 1e-5);
            for (size_t c = 0; c < C; c++) {
                double hh = (x[r * C + c] - m) * rs, gd = dy[r * C + c] * (affine ? g[c] : 1.0);
                ry[r * C + c] = affine ? hh * g[c] + b[c] : hh;
                a += gd;
                bs += gd * hh;
                rdg[c] += dy[r * C + c] * hh;
                rdb[c] += dy[r * C + c];
            }
            for (size_t c = 0; c < C; c++) {
                double hh = (x[r * C + c] - m) * rs, gd = dy[r * C + c] * (affine ? g[c] : 1.0);
                rdx[r * C + c] = rs * (gd - a / (double)C - hh * bs / (double)C);
                term = fmax(term, rs * fabs(gd));
            }
        }
        cl_mem X = buf_from(x, n), Y = buf_nan(n), DY = buf_from(dy, n), DX = buf_nan(n), G = buf_from(g, C),
               B = buf_from(b, C), M = buf_nan(R), S = buf_nan(R), DG = buf_nan(C), DB = buf_nan(C);
        CHECK_OK(clg_prim_layernorm_forward(g_h, R, C, 1e-5f, X, 0, affine ? G : NULL, affine ? B : NULL, Y, 0, M, S,
                                            0, NULL, NULL));
        read_buf(Y, got, n);
        double e = max_rel(got, ry, n, "layernorm y");
        ck_assert_msg(e <= 1e-4, "layernorm %zux%zu: rel err %.3g", R, C, e);
        CHECK_OK(clg_prim_layernorm_backward(g_h, R, C, X, 0, DY, 0, affine ? G : NULL, M, S, DX, 0, DG, DB, 0, NULL,
                                             NULL));
        read_buf(DX, got, n);
        e = max_rel(got, rdx, n, "layernorm dx");
        /* 1e-3 relative to the largest dx, and no more than 1e-6 of the terms it is the difference of
         * (C = 1: dx is exactly 0 = rstd*g*dy - rstd*g*dy with rstd = 1/sqrt(eps) = 316; a device that
         * contracts to fma leaves the rounding of one product, ~1e-7 of it) */
        double e_abs = 0, m_ref = 1e-3;
        for (size_t i = 0; i < n; i++)
            e_abs = fmax(e_abs, fabs(got[i] - rdx[i])), m_ref = fmax(m_ref, fabs(rdx[i]));
        ck_assert_msg(e_abs <= 1e-3 * m_ref + 1e-6 * term, "layernorm dx %zux%zu: rel err %.3g (abs %.3g, terms %.3g)", R,
                      C, e, e_abs, term);
        read_buf(DG, got, C);
        e = max_rel(got, rdg, C, "layernorm dgamma");
        ck_assert_msg(e <= 1e-3, "layernorm dgamma %zux%zu: rel err %.3g", R, C, e);
        read_buf(DB, got, C);
        e = max_rel(got, rdb, C, "layernorm dbeta");
        ck_assert_msg(e <= 1e-4, "layernorm dbeta %zux%zu: rel err %.3g", R, C, e);
        /* refusals: gamma without beta, a short buffer */
        ck_assert_int_eq(clg_prim_layernorm_forward(g_h, R, C, 1e-5f, X, 0, G, NULL, Y, 0, M, S, 0, NULL, NULL),
                         CLG_ERR_INVALID_ARG);
        ck_assert_int_ne(clg_prim_layernorm_forward(g_h, R + 1, C, 1e-5f, X, 0, NULL, NULL, Y, 0, M, S, 0, NULL, NULL),
                         CLG_OK);
        clReleaseMemObject(X), clReleaseMemObject(Y), clReleaseMemObject(DY), clReleaseMemObject(DX);
        clReleaseMemObject(G), clReleaseMemObject(B), clReleaseMemObject(M), clReleaseMemObject(S);
        clReleaseMemObject(DG), clReleaseMemObject(DB);
        free(x), free(dy), free(g), free(b), free(got), free(ry), free(rdx), free(rdg), free(rdb);
    }
}
END_TEST

// ---- events ----

START_TEST(events)
{
    const size_t M = 33, N = 17, K = 21;
    float *A = rand_vec(M * K), *B = rand_vec(K * N), *C = malloc(M * N * sizeof *C), *D = malloc(M * N * sizeof *D);
    cl_mem a = buf_from(A, M * K), b = buf_from(B, K * N), c = buf_nan(M * N), d = buf_nan(M * N);
    cl_int e;
    /* 1. a user event holds the call back: its out event completes only after the user event does */
    cl_event gate = clCreateUserEvent(g_ctx, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    cl_event ev1 = NULL;
    CHECK_OK(clg_prim_sgemm(g_h, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, M, N, K, 1, a, 0, K, b, 0, N, 0, c, 0, N, NULL,
                            1, &gate, &ev1));
    ck_assert_ptr_nonnull(ev1);
    clFlush(g_q);
    usleep(100000);
    cl_int status = CL_QUEUED;
    ck_assert_int_eq(clGetEventInfo(ev1, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL), CL_SUCCESS);
    ck_assert_msg(status != CL_COMPLETE, "the operation completed before its wait list did");
    ck_assert_int_eq(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
    /* 2. a second queue with its own handle waits on the first's event:
     * d = 2 * c * I reads c, which is right only once ev1 has completed */
    cl_command_queue q2 = clCreateCommandQueue(g_ctx, g_dev, 0, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    clg_prim *h2 = NULL;
    ck_assert_msg(clg_prim_create(q2, NULL, &h2) == CLG_OK, "%s", clg_last_error(NULL));
    float one = 1.0f;
    float *I = calloc(N * N, sizeof *I); /* identity: d = 2 * c * I */
    for (size_t i = 0; i < N; i++)
        I[i * N + i] = one;
    cl_mem id = buf_from(I, N * N);
    cl_event ev2 = NULL;
    CHECK_OK(clg_prim_sgemm(h2, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, M, N, N, 2, c, 0, N, id, 0, N, 0, d, 0, N, NULL, 1,
                            &ev1, &ev2));
    ck_assert_int_eq(clWaitForEvents(1, &ev2), CL_SUCCESS);
    ck_assert_int_eq(clEnqueueReadBuffer(q2, d, CL_TRUE, 0, M * N * sizeof *D, D, 0, NULL, NULL), CL_SUCCESS);
    read_buf(c, C, M * N);
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < N; j++) {
            double r = 0;
            for (size_t p = 0; p < K; p++)
                r += (double)A[i * K + p] * B[p * N + j];
            ck_assert_msg(fabs(C[i * N + j] - r) <= 1e-4 * (1 + fabs(r)), "C[%zu,%zu] = %g, want %g", i, j,
                          (double)C[i * N + j], r);
            ck_assert_msg(fabs(D[i * N + j] - 2 * r) <= 2e-4 * (1 + fabs(r)), "D[%zu,%zu] = %g, want %g", i, j,
                          (double)D[i * N + j], 2 * r);
        }
    /* 3. a convolution with the automatic choice on a shape not seen before, held back by a user
     * event: the choice is measured before the call's wait list, so the call returns (no deadlock),
     * and the result waits for the event */
    clg_prim_conv_desc cd;
    clg_prim_conv_desc_init(&cd);
    /* a random size, so the choice is (almost surely) neither in memory nor in the cache file */
    cd.n = 1, cd.c = 3, cd.h = 5 + (int)((urand() + 1) * 120), cd.w = 5 + (int)((urand() + 1) * 30), cd.k = 2;
    cd.r = cd.s = 3, cd.pad_h = cd.pad_w = 1;
    size_t nxc = (size_t)cd.c * cd.h * cd.w, nyc = (size_t)cd.k * cd.h * cd.w;
    float *xc = rand_vec(nxc), *wc = rand_vec(54), *yc = malloc(nyc * sizeof *yc);
    cl_mem X = buf_from(xc, nxc), Wc = buf_from(wc, 54), Y = buf_nan(nyc);
    cl_event gate2 = clCreateUserEvent(g_ctx, &e), ev4 = NULL;
    CHECK_OK(clg_prim_conv_forward(g_h, &cd, X, 0, Wc, 0, NULL, 0, 0, Y, 0, 1, &gate2, &ev4));
    clFlush(g_q);
    ck_assert_int_eq(clGetEventInfo(ev4, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL), CL_SUCCESS);
    ck_assert_msg(status != CL_COMPLETE, "the convolution completed before its wait list did");
    ck_assert_int_eq(clSetUserEventStatus(gate2, CL_COMPLETE), CL_SUCCESS);
    ck_assert_int_eq(clWaitForEvents(1, &ev4), CL_SUCCESS);
    read_buf(Y, yc, nyc);
    clg_prim_conv_desc cref = cd;
    clg_conv_shape sc = to_shape(&cref);
    double *rc = malloc(nyc * sizeof *rc);
    cr_fwd(&sc, xc, wc, NULL, 0, rc);
    ck_assert(max_rel(yc, rc, nyc, "gated conv y") <= 1e-4);
    clReleaseEvent(gate2), clReleaseEvent(ev4);
    clReleaseMemObject(X), clReleaseMemObject(Wc), clReleaseMemObject(Y);
    free(xc), free(wc), free(yc), free(rc);
    /* 4. a failing call leaves *event NULL */
    cl_event ev3 = (cl_event)(intptr_t)1;
    ck_assert_int_ne(clg_prim_sgemm(g_h, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, M, N, K, 1, a, 0, K, b, 0, N, 0, c, 0,
                                    N - 1, NULL, 0, NULL, &ev3), CLG_OK);
    ck_assert_ptr_null(ev3);
    clReleaseEvent(gate), clReleaseEvent(ev1), clReleaseEvent(ev2);
    clg_prim_destroy(h2);
    clReleaseCommandQueue(q2);
    clReleaseMemObject(a), clReleaseMemObject(b), clReleaseMemObject(c), clReleaseMemObject(d), clReleaseMemObject(id);
    free(A), free(B), free(C), free(D), free(I);
}
END_TEST

/* The wait list goes into the op's launches and the out event is the op's
 * last command: (a) held back by a user event, the event is not complete and
 * the poisoned output is untouched (read on a second queue); (b) after the user
 * event, waiting on the out event alone (not the queue) gives the reference
 * output, read on the second queue. */
typedef struct gated {
    cl_event gate, ev;
    cl_command_queue q2;
} gated;

static void gated_begin(gated *g)
{
    cl_int e;
    g->gate = clCreateUserEvent(g_ctx, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    g->q2 = clCreateCommandQueue(g_ctx, g_dev, 0, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    g->ev = NULL;
}

/* After the call: out is still all NaN while the gate is closed; then open it,
 * wait on the event only and read n floats of out into got (on the second queue). */
static void gated_end(gated *g, const char *what, cl_mem out, float *got, size_t n)
{
    ck_assert_msg(g->ev != NULL, "%s: no out event", what);
    ck_assert_int_eq(clFlush(g_q), CL_SUCCESS);
    usleep(50000);
    cl_int status = CL_QUEUED;
    ck_assert_int_eq(clGetEventInfo(g->ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL),
                     CL_SUCCESS);
    ck_assert_msg(status != CL_COMPLETE, "%s: completed before its wait list did", what);
    ck_assert_int_eq(clEnqueueReadBuffer(g->q2, out, CL_TRUE, 0, n * sizeof *got, got, 0, NULL, NULL), CL_SUCCESS);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(isnan(got[i]), "%s: output[%zu] = %g written before the wait list completed", what, i,
                      (double)got[i]);
    ck_assert_int_eq(clSetUserEventStatus(g->gate, CL_COMPLETE), CL_SUCCESS);
    ck_assert_int_eq(clWaitForEvents(1, &g->ev), CL_SUCCESS);
    ck_assert_int_eq(clEnqueueReadBuffer(g->q2, out, CL_TRUE, 0, n * sizeof *got, got, 0, NULL, NULL), CL_SUCCESS);
    clReleaseEvent(g->gate), clReleaseEvent(g->ev);
    clReleaseCommandQueue(g->q2);
}

static cl_command_type event_type(cl_event ev)
{
    cl_command_type t = 0;
    ck_assert_int_eq(clGetEventInfo(ev, CL_EVENT_COMMAND_TYPE, sizeof t, &t, NULL), CL_SUCCESS);
    return t;
}

static void gated_gemm(clg_prim *h, const char *what)
{
    const size_t M = 19 + (size_t)((urand() + 1) * 20), N = 13 + (size_t)((urand() + 1) * 20), K = 27;
    float *A = rand_vec(M * K), *B = rand_vec(K * N), *got = malloc(M * N * sizeof *got);
    double *ref = malloc(M * N * sizeof *ref);
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < N; j++) {
            double r = 0;
            for (size_t p = 0; p < K; p++)
                r += (double)A[i * K + p] * B[p * N + j];
            ref[i * N + j] = r;
        }
    cl_mem a = buf_from(A, M * K), b = buf_from(B, K * N), c = buf_nan(M * N);
    gated g;
    gated_begin(&g);
    CHECK_OK(clg_prim_sgemm(h, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, M, N, K, 1, a, 0, K, b, 0, N, 0, c, 0, N, NULL, 1,
                            &g.gate, &g.ev));
    gated_end(&g, what, c, got, M * N);
    ck_assert_msg(max_rel(got, ref, M * N, what) <= 1e-4, "%s: wrong product", what);
    clReleaseMemObject(a), clReleaseMemObject(b), clReleaseMemObject(c);
    free(A), free(B), free(got), free(ref);
}

START_TEST(events_launch)
{
    /* 1. softmax: one launch, which takes the wait list and gives the event itself (no marker) */
    const size_t R = 7, C = 45, n = R * C;
    float *x = rand_vec(n), *got = malloc(n * sizeof *got);
    double *ry = malloc(n * sizeof *ry);
    for (size_t r = 0; r < R; r++) {
        double m = -INFINITY, s = 0;
        for (size_t c = 0; c < C; c++)
            m = fmax(m, x[r * C + c]);
        for (size_t c = 0; c < C; c++)
            s += exp((double)x[r * C + c] - m);
        for (size_t c = 0; c < C; c++)
            ry[r * C + c] = exp((double)x[r * C + c] - m) / s;
    }
    cl_mem X = buf_from(x, n), Y = buf_nan(n);
    gated g;
    gated_begin(&g);
    CHECK_OK(clg_prim_softmax_forward(g_h, R, C, X, 0, Y, 0, 1, &g.gate, &g.ev));
    ck_assert_msg(event_type(g.ev) == CL_COMMAND_NDRANGE_KERNEL, "softmax: the out event is not its launch's");
    gated_end(&g, "gated softmax", Y, got, n);
    ck_assert(max_rel(got, ry, n, "gated softmax y") <= 1e-4);
    clReleaseMemObject(X), clReleaseMemObject(Y);
    free(x), free(got), free(ry);
    /* 2. GEMM on the own kernels (one or more launches) and through CLBlast (enqueues of its own) */
    clg_prim_params pp;
    clg_prim_params_init(&pp);
    pp.gemm_backend = "own";
    clg_prim *h = NULL;
    ck_assert_msg(clg_prim_create(g_q, &pp, &h) == CLG_OK, "%s", clg_last_error(NULL));
    gated_gemm(h, "gated gemm (own)");
    clg_prim_destroy(h);
    pp.gemm_backend = "clblast";
    h = NULL;
    if (clg_prim_create(g_q, &pp, &h) == CLG_OK) {
        gated_gemm(h, "gated gemm (clblast)");
        clg_prim_destroy(h);
    } else
        fprintf(stderr, "note: built without CLBlast, gated CLBlast GEMM not tested\n");
    /* 3. the FFT convolution (clFFT enqueues its transforms itself) */
    clg_prim_conv_desc cd;
    clg_prim_conv_desc_init(&cd);
    cd.n = 2, cd.c = 3, cd.h = 11, cd.w = 9, cd.k = 4, cd.r = cd.s = 5, cd.pad_h = cd.pad_w = 2;
    cd.algo = CLG_PRIM_CONV_FFT;
    if (clg_prim_conv_algo_supported(&cd, CLG_PRIM_CONV_FFT, CLG_PRIM_CONV_FORWARD)) {
        clg_conv_shape sc = to_shape(&cd);
        size_t nx = cr_nx(&sc), nw = cr_nw(&sc), ny = cr_ny(&sc);
        float *xc = rand_vec(nx), *wc = rand_vec(nw), *yc = malloc(ny * sizeof *yc);
        double *rc = malloc(ny * sizeof *rc);
        cr_fwd(&sc, xc, wc, NULL, 0, rc);
        cl_mem Xc = buf_from(xc, nx), Wc = buf_from(wc, nw), Yc = buf_nan(ny);
        /* clFFT bakes a plan on a shape's first use with a blocking write on the queue, which
         * must not sit behind a closed wait list: a first call without one */
        CHECK_OK(clg_prim_conv_forward(g_h, &cd, Xc, 0, Wc, 0, NULL, 0, 0, Yc, 0, 0, NULL, NULL));
        clReleaseMemObject(Yc);
        Yc = buf_nan(ny);
        gated_begin(&g);
        CHECK_OK(clg_prim_conv_forward(g_h, &cd, Xc, 0, Wc, 0, NULL, 0, 0, Yc, 0, 1, &g.gate, &g.ev));
        gated_end(&g, "gated fft conv", Yc, yc, ny);
        ck_assert(max_rel(yc, rc, ny, "gated fft conv y") <= 1e-4);
        clReleaseMemObject(Xc), clReleaseMemObject(Wc), clReleaseMemObject(Yc);
        free(xc), free(wc), free(yc), free(rc);
    } else
        fprintf(stderr, "note: FFT convolution not available, gated FFT not tested\n");
    /* 4. an op with nothing to launch (m == 0) still waits for its list */
    cl_mem a = buf_nan(4), b = buf_nan(4), c = buf_nan(4);
    float c4[4];
    gated_begin(&g);
    CHECK_OK(clg_prim_sgemm(g_h, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, 0, 2, 2, 1, a, 0, 2, b, 0, 2, 0, c, 0, 2, NULL,
                            1, &g.gate, &g.ev));
    gated_end(&g, "gated empty gemm", c, c4, 4);
    clReleaseMemObject(a), clReleaseMemObject(b), clReleaseMemObject(c);
}
END_TEST

// ---- argument errors ----

static void expect_err(clg_status st, clg_status want, const char *needle)
{
    ck_assert_msg(st == want, "status %s, want %s (%s)", clg_status_name(st), clg_status_name(want),
                  clg_prim_last_error(g_h));
    ck_assert_msg(strstr(clg_prim_last_error(g_h), needle), "message '%s' lacks '%s'", clg_prim_last_error(g_h), needle);
}

START_TEST(errors)
{
    cl_mem small = buf_nan(10), big = buf_nan(1000);
    /* B too small for k x n = 8 x 8 */
    expect_err(clg_prim_sgemm(g_h, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, 8, 8, 8, 1, big, 0, 8, small, 0, 8, 0, big, 0,
                              8, NULL, 0, NULL, NULL),
               CLG_ERR_INVALID_ARG, "buffer 'b' holds 10 floats");
    /* an offset that runs past the end */
    expect_err(clg_prim_sgemm(g_h, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, 8, 8, 8, 1, big, 990, 8, big, 0, 8, 0, big, 0,
                              8, NULL, 0, NULL, NULL),
               CLG_ERR_INVALID_ARG, "buffer 'a'");
    expect_err(clg_prim_sgemm(g_h, CLG_PRIM_TRANS, CLG_PRIM_NO_TRANS, 8, 8, 4, 1, big, 0, 4, big, 0, 8, 0, big, 0, 8,
                              NULL, 0, NULL, NULL),
               CLG_ERR_SHAPE, "lda = 4");
    clg_prim_gemm_epilogue epi;
    clg_prim_gemm_epilogue_init(&epi);
    epi.bias_mode = CLG_PRIM_BIAS_ROW;
    expect_err(clg_prim_sgemm(g_h, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, 8, 8, 8, 1, big, 0, 8, big, 0, 8, 0, big, 0, 8,
                              &epi, 0, NULL, NULL),
               CLG_ERR_INVALID_ARG, "bias buffer is NULL");
    expect_err(clg_prim_sgemm(g_h, CLG_PRIM_NO_TRANS, CLG_PRIM_NO_TRANS, 8, 8, 8, 1, big, 0, 8, big, 0, 8, 0, big, 0, 8,
                              NULL, 2, NULL, NULL),
               CLG_ERR_INVALID_ARG, "wait list is NULL");
    /* an uninitialised descriptor (size 0) */
    clg_prim_conv_desc d;
    memset(&d, 0, sizeof d);
    d.n = d.c = d.h = d.w = d.k = d.r = d.s = 1;
    expect_err(clg_prim_conv_forward(g_h, &d, big, 0, big, 0, NULL, 0, 0, big, 0, 0, NULL, NULL), CLG_ERR_INVALID_ARG,
               "clg_prim_conv_desc_init");
    d = desc(2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1);
    expect_err(clg_prim_conv_forward(g_h, &d, big, 0, big, 0, NULL, 0, 0, small, 0, 0, NULL, NULL), CLG_ERR_INVALID_ARG,
               "buffer 'y' holds 10 floats");
    d.groups = 2;
    expect_err(clg_prim_conv_forward(g_h, &d, big, 0, big, 0, NULL, 0, 0, big, 0, 0, NULL, NULL), CLG_ERR_SHAPE,
               "not divisible by groups");
    d = desc(1, 2, 6, 6, 2, 3, 3, 0, 0, 2, 1, 1);
    d.algo = CLG_PRIM_CONV_WINOGRAD;
    expect_err(clg_prim_conv_forward(g_h, &d, big, 0, big, 0, NULL, 0, 0, big, 0, 0, NULL, NULL), CLG_ERR_UNSUPPORTED,
               "winograd");
    d = desc(1, 2, 6, 6, 2, 3, 3, 0, 0, 2, 1, 1); /* the fused F(3x3,4x4) weight gradient: stride 1 only */
    d.algo = CLG_PRIM_CONV_WINOGRAD4_FUSED;
    expect_err(clg_prim_conv_backward_filter(g_h, &d, big, 0, big, 0, 0, big, 0, NULL, 0, 0, NULL, NULL),
               CLG_ERR_UNSUPPORTED, "winograd4-fused");
    clg_prim_pool_desc pd;
    clg_prim_pool_desc_init(&pd);
    pd.n = 1, pd.c = 1, pd.h = 4, pd.w = 4, pd.pad_h = 2;
    expect_err(clg_prim_pool_forward(g_h, &pd, big, 0, big, 0, 0, NULL, NULL), CLG_ERR_SHAPE, "at most half the window");
    expect_err(clg_prim_softmax_forward(g_h, 4, 0, big, 0, big, 0, 0, NULL, NULL), CLG_ERR_SHAPE, "cols");
    /* a buffer of another context */
    cl_int e;
    cl_context other = clCreateContext(NULL, 1, &g_dev, NULL, NULL, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    cl_mem foreign = clCreateBuffer(other, CL_MEM_READ_WRITE, 4096, NULL, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    expect_err(clg_prim_softmax_forward(g_h, 4, 4, foreign, 0, big, 0, 0, NULL, NULL), CLG_ERR_INVALID_ARG,
               "another cl_context");
    clReleaseMemObject(foreign);
    clReleaseContext(other);
    /* an out-of-order queue is refused at creation */
    cl_command_queue ooo = clCreateCommandQueue(g_ctx, g_dev, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &e);
    if (e == CL_SUCCESS) {
        clg_prim *h = (clg_prim *)(intptr_t)1;
        ck_assert_int_eq(clg_prim_create(ooo, NULL, &h), CLG_ERR_UNSUPPORTED);
        ck_assert_ptr_null(h);
        ck_assert(strstr(clg_last_error(NULL), "out-of-order"));
        clReleaseCommandQueue(ooo);
    }
    clReleaseMemObject(small);
    clReleaseMemObject(big);
}
END_TEST

// ---- ABI: the size field; the caller's reference counts ----

START_TEST(abi_size)
{
    /* A caller compiled against an older header whose descriptor ended
     * before `algo`: the library must not read the bytes past its size. */
    struct {
        clg_prim_conv_desc d;
        char guard[64];
    } old;
    memset(&old, 0x5a, sizeof old);
    size_t old_size = offsetof(clg_prim_conv_desc, algo);
    clg_prim_conv_desc_init_size(&old.d, old_size);
    ck_assert_uint_eq(old.d.size, old_size);
    ck_assert_int_eq(old.d.stride_h, 1);
    unsigned char *bytes = (unsigned char *)&old.d;
    for (size_t i = old_size; i < sizeof old; i++) /* init wrote nothing past the caller's size */
        ck_assert_uint_eq(bytes[i], 0x5a);
    old.d.n = 1, old.d.c = 2, old.d.h = 5, old.d.w = 5, old.d.k = 2, old.d.r = 3, old.d.s = 3;
    /* old.d.algo holds 0x5a5a5a5a: read, it would be an unknown algorithm id */
    float *x = rand_vec(50), *w = rand_vec(36);
    cl_mem X = buf_from(x, 50), W = buf_from(w, 36), Y = buf_nan(18);
    CHECK_OK(clg_prim_conv_forward(g_h, &old.d, X, 0, W, 0, NULL, 0, 0, Y, 0, 0, NULL, NULL));
    float got[18];
    read_buf(Y, got, 18);
    clg_conv_shape s = to_shape(&old.d);
    double ref[18];
    cr_fwd(&s, x, w, NULL, 0, ref);
    ck_assert(max_rel(got, ref, 18, "y") <= 1e-4);
    clReleaseMemObject(X), clReleaseMemObject(W), clReleaseMemObject(Y);
    free(x), free(w);
    /* the same for the context params of clgrad.h */
    struct {
        clg_ctx_params p;
        char guard[32];
    } cp;
    memset(&cp, 0x5a, sizeof cp);
    clg_ctx_params_init_size(&cp.p, offsetof(clg_ctx_params, kernel_dir)); /* kernel_dir and verbose unknown */
    ck_assert_int_eq(cp.p.use_cache, 1);
    ck_assert_uint_eq(((unsigned char *)&cp.p)[offsetof(clg_ctx_params, kernel_dir)], 0x5a);
    cp.p.devices = "all";
    clg_ctx *ctx = NULL;
    clg_status st = clg_ctx_create(&cp.p, &ctx); /* a read of kernel_dir would follow a wild pointer */
    ck_assert_msg(st == CLG_OK || st == CLG_ERR_NO_DEVICE, "%s", clg_last_error(NULL));
    if (ctx) { /* a struct the library fills: no byte past the caller's size is written */
        struct {
            clg_device_info info;
            char guard[32];
        } di;
        memset(&di, 0x5a, sizeof di);
        size_t part = offsetof(clg_device_info, type);
        ck_assert_int_eq(clg_device_info_get_size(ctx, 0, &di.info, part), CLG_OK);
        ck_assert(di.info.name[0] != 0x5a);
        for (size_t i = part; i < sizeof di; i++)
            ck_assert_uint_eq(((unsigned char *)&di)[i], 0x5a);
    }
    clg_ctx_destroy(ctx);
    /* an uninitialised params struct is refused, naming its init */
    clg_prim_params pp;
    memset(&pp, 0, sizeof pp);
    clg_prim *h = NULL;
    ck_assert_int_eq(clg_prim_create(g_q, &pp, &h), CLG_ERR_INVALID_ARG);
    ck_assert(strstr(clg_last_error(NULL), "clg_prim_params_init"));
}
END_TEST

static cl_uint refcount_q(cl_command_queue q)
{
    cl_uint n = 0;
    clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof n, &n, NULL);
    return n;
}

static cl_uint refcount_c(cl_context c)
{
    cl_uint n = 0;
    clGetContextInfo(c, CL_CONTEXT_REFERENCE_COUNT, sizeof n, &n, NULL);
    return n;
}

/* PoCL drops the queue and context references an event holds only after it has
 * signalled the event complete (pocl_update_event_finished: broadcast, then
 * clReleaseEvent on the driver thread), so right after clFinish a count can
 * still be one or more above its settled value for a moment. Wait (bounded,
 * 20 s) until the queue and context counts equal the expected ones; a leak
 * keeps them above and fails the assertion after the wait. want_c 0: the
 * context count is not checked. */
static void wait_refs(cl_uint want_q, cl_uint want_c)
{
    clFinish(g_q);
    struct timespec nap = {0, 1000000};
    for (int i = 0; i < 20000 && (refcount_q(g_q) != want_q || (want_c && refcount_c(g_ctx) != want_c)); i++)
        nanosleep(&nap, NULL);
    ck_assert_uint_eq(refcount_q(g_q), want_q);
    if (want_c)
        ck_assert_uint_eq(refcount_c(g_ctx), want_c);
}

/* The settled counts: after clFinish, equal over 50 consecutive reads 1 ms apart. */
static void settled_refs(cl_uint *q, cl_uint *c)
{
    clFinish(g_q);
    struct timespec nap = {0, 1000000};
    *q = refcount_q(g_q), *c = refcount_c(g_ctx);
    for (int same = 0, i = 0; same < 50 && i < 20000; i++) {
        nanosleep(&nap, NULL);
        cl_uint q1 = refcount_q(g_q), c1 = refcount_c(g_ctx);
        same = (q1 == *q && c1 == *c) ? same + 1 : 0;
        *q = q1, *c = c1;
    }
}

START_TEST(ownership)
{
    cl_uint q0 = 0, c0 = 0;
    settled_refs(&q0, &c0);
    for (int i = 0; i < 3; i++) {
        clg_prim *h = NULL;
        CHECK_OK(clg_prim_create(g_q, NULL, &h));
        wait_refs(q0 + 1, 0);
        /* scratch buffers of the handle (im2col) live in the caller's context */
        clg_prim_conv_desc d = desc(1, 3, 6, 6, 2, 3, 3, 1, 1, 1, 1, 1);
        d.algo = CLG_PRIM_CONV_IM2COL;
        cl_mem X = buf_nan(108), W = buf_nan(54), Y = buf_nan(72);
        CHECK_OK(clg_prim_conv_forward(h, &d, X, 0, W, 0, NULL, 0, 0, Y, 0, 0, NULL, NULL));
        clg_prim_destroy(h);
        clReleaseMemObject(X), clReleaseMemObject(W), clReleaseMemObject(Y);
        wait_refs(q0, c0);
    }
    clg_prim_destroy(NULL);
}
END_TEST

int main(void)
{
    g_tiny = getenv("CLGRAD_TEST_TINY") && atoi(getenv("CLGRAD_TEST_TINY")) != 0;
    uint64_t seed = seed_value();
    g_rng = seed;
    fprintf(stderr, "test_prim: seed %llu (CLGRAD_TEST_SEED=%llu repeats this run)\n", (unsigned long long)seed,
            (unsigned long long)seed);
    Suite *s = suite_create("prim");
    TCase *tc = tcase_create("prim");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, gemm_own);
    tcase_add_test(tc, pool);
    tcase_add_test(tc, softmax);
    tcase_add_test(tc, layernorm);
    if (!g_tiny) { /* oclgrind: the kernels new to this API (softmax) and the public paths of pooling
                    * and the GEMM epilogue; the convolution kernels have their own oclgrind runs */
        tcase_add_test(tc, gemm_clblast);
        tcase_add_test(tc, gemm_auto_empty);
        tcase_add_test(tc, conv_3x3);
        tcase_add_test(tc, conv_odd);
        tcase_add_test(tc, events);
        tcase_add_test(tc, events_launch);
        tcase_add_test(tc, errors);
        tcase_add_test(tc, abi_size);
        tcase_add_test(tc, ownership);
    }
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
