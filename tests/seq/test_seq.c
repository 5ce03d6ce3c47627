/* Sequence layers (issue 23) against plain C references in double, on fresh
 * random inputs (seed printed), with poisoned outputs and gradients: token
 * embedding (gather, deterministic scatter-add, ids out of range), learned
 * positions, layer norm (two-pass; inputs far from 0), token loss with label
 * smoothing, gelu_tanh, dense per position, and networks of them (sequence
 * propagation, refusals with file and line, weight tying, fp16 storage).
 * Odd sizes and T = 1 throughout. Tolerance: max |got - ref| / (|ref| +
 * atol) as stated per check. */
#include <stdio.h>

#include "model/layer_harness.h"
#include "model/network.h"
#include "ops/nn.h"
#include "ops/seq.h"

static float *rnd(size_t n, float lo, float hi, uint64_t stream)
{
    clg_rng r;
    tu_rng(&r, stream);
    float *v = lh_alloc(n);
    tu_fill(v, n, lo, hi, &r);
    return v;
}

/* ---------------- embedding ---------------- */

static const int emb_cases[][4] = {/* N, T, V, D */ {3, 7, 37, 13}, {2, 1, 5, 40}, {4, 9, 256, 17}};

START_TEST(embedding_fwd_bwd)
{
    const int *cs = emb_cases[_i];
    int N = cs[0], T = cs[1], V = cs[2], D = cs[3];
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{N, 1, T, 1}};
    char keys[64];
    snprintf(keys, sizeof keys, "vocab=%d dim=%d", V, D);
    lh_make(&c, "embedding", keys, 1, shp, N, 0, 1, 900 + (uint64_t)_i);
    ck_assert_int_eq(c.l.out_seq, 1);
    ck_assert_int_eq(c.l.out_shape[1], T);
    ck_assert_int_eq(c.l.out_shape[2], D);
    clg_rng r;
    tu_rng(&r, 910 + (uint64_t)_i);
    for (size_t i = 0; i < c.nx[0]; i++) /* ids, some repeated; a few at the ends of the range */
        c.x[0][i] = (float)(i % 5 == 0 ? (i % 2 ? V - 1 : 0) : (int)(clg_rng_u32(&r) % (uint32_t)V));
    lh_reupload(&c);
    lh_forward(&c, 1);
    for (int p = 0; p < N * T; p++)
        for (int d = 0; d < D; d++)
            ck_assert_msg(c.y[(size_t)p * D + d] == c.p[0][(size_t)c.x[0][p] * D + d], "gather at %d,%d", p, d);
    float *dy = rnd(c.ny, -1, 1, 920 + (uint64_t)_i);
    lh_backward(&c, dy, 1);
    double *ref = lh_dalloc((size_t)V * D);
    for (int p = 0; p < N * T; p++)
        for (int d = 0; d < D; d++)
            ref[(size_t)c.x[0][p] * D + d] += dy[(size_t)p * D + d];
    LH_CLOSE(c.g[0], ref, (size_t)V * D, 1e-6, 1e-5, "embedding table gradient");
    /* bitwise reproducible */
    float *g1 = lh_alloc((size_t)V * D);
    memcpy(g1, c.g[0], (size_t)V * D * sizeof(float));
    lh_backward(&c, dy, 1);
    ck_assert_int_eq(memcmp(g1, c.g[0], (size_t)V * D * sizeof(float)), 0);
    /* accumulate mode (a tied head wrote first): dt = prior + scatter */
    float *prior = rnd((size_t)V * D, -1, 1, 930 + (uint64_t)_i);
    cl_mem dt = tu_upload(c.dev, prior, (size_t)V * D);
    cl_mem dym = tu_upload(c.dev, dy, c.ny);
    LH_OK(&c, clg_seq_embedding_backward(c.dev, (size_t)N * T, D, V, c.xm[0], 0, dym, 0, dt, 1));
    tu_download(c.dev, dt, g1, (size_t)V * D);
    for (size_t i = 0; i < (size_t)V * D; i++)
        ref[i] += prior[i];
    LH_CLOSE(g1, ref, (size_t)V * D, 1e-6, 1e-5, "embedding gradient, accumulated");
    clg_buf_release(c.dev, dt);
    clg_buf_release(c.dev, dym);
    free(prior);
    free(g1);
    free(ref);
    free(dy);
    lh_free(&c);
}
END_TEST

/* An id outside [0, vocab) or not an integer fails forward naming it and its position. */
START_TEST(embedding_bad_id)
{
    static const float bad[] = {7.0f, -1.0f, 2.5f, NAN};
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{2, 3, 1, 1}};
    lh_make(&c, "embedding", "vocab=7 dim=4", 1, shp, 2, 0, 1, 940);
    for (size_t i = 0; i < c.nx[0]; i++)
        c.x[0][i] = (float)(i % 7);
    c.x[0][4] = bad[_i];
    c.x[0][5] = 9.0f; /* a later bad position: the first is reported */
    lh_reupload(&c);
    clg_tensor in = lh_tensor(c.xm[0], c.shp[0], 2);
    int os[4] = {2, 3, 4, 1};
    clg_tensor out = lh_tensor(c.ym, os, 2);
    clg_status st = c.l.ops->forward(&c.l, c.dev, &in, 1, &out, 1);
    ck_assert_int_eq(st, CLG_ERR_INVALID_ARG);
    const char *msg = clg_last_error(c.ctx);
    ck_assert_msg(strstr(msg, "sample 1, position 1") && strstr(msg, "token id"), "message: %s", msg);
    /* the flag resets: good ids pass again */
    c.x[0][4] = 1.0f;
    c.x[0][5] = 6.0f;
    lh_reupload(&c);
    lh_forward(&c, 1);
    ck_assert_float_eq(c.y[5 * 4 + 3], c.p[0][6 * 4 + 3]);
    lh_free(&c);
}
END_TEST

/* ---------------- posembed ---------------- */

START_TEST(posembed_fwd_bwd)
{
    int T = _i ? 5 : 1, C = 6 + _i, N = 3, ctx = 9;
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{N, T, C, 1}};
    lh_make_seq(&c, "posembed", "context=9", 1, shp, 1, N, -1, 1, 950 + (uint64_t)_i);
    ck_assert_int_eq(c.l.out_seq, 1);
    lh_forward(&c, 1);
    double *ref = lh_dalloc(c.ny);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < T * C; j++)
            ref[(size_t)n * T * C + j] = (double)c.x[0][(size_t)n * T * C + j] + c.p[0][j];
    LH_CLOSE(c.y, ref, c.ny, 1e-6, 1e-6, "posembed forward");
    float *dy = rnd(c.ny, -1, 1, 960 + (uint64_t)_i);
    lh_backward(&c, dy, 0);
    double *gref = lh_dalloc((size_t)ctx * C);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < T * C; j++)
            gref[j] += dy[(size_t)n * T * C + j];
    LH_CLOSE(c.g[0], gref, (size_t)ctx * C, 1e-6, 1e-5, "posembed table gradient (0 past T)");
    for (size_t i = 0; i < c.ny; i++)
        ref[i] = dy[i];
    LH_CLOSE(c.dx[0], ref, c.ny, 1e-6, 0, "posembed dx");
    free(gref);
    free(ref);
    free(dy);
    lh_free(&c);
}
END_TEST

/* ---------------- layernorm ---------------- */

/* ref forward/backward over rows of C (double). */
static void ln_ref(const float *x, const float *g, const float *b, const float *dy, int rows, int C, double eps,
                   int affine, double *y, double *dx, double *dg, double *db)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++)
            m += xr[c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (xr[c] - m) * (xr[c] - m);
        v /= C;
        double rs = 1.0 / sqrt(v + eps), a = 0, bs = 0;
        for (int c = 0; c < C; c++) {
            double h = (xr[c] - m) * rs, gd = dy[(size_t)r * C + c] * (affine ? g[c] : 1.0);
            y[(size_t)r * C + c] = affine ? h * g[c] + b[c] : h;
            a += gd;
            bs += gd * h;
            if (affine) {
                dg[c] += dy[(size_t)r * C + c] * h;
                db[c] += dy[(size_t)r * C + c];
            }
        }
        for (int c = 0; c < C; c++) {
            double h = (xr[c] - m) * rs, gd = dy[(size_t)r * C + c] * (affine ? g[c] : 1.0);
            dx[(size_t)r * C + c] = rs * (gd - a / C - h * bs / C);
        }
    }
}

/* {5, 29, 64}: 145 rows, chunks of 64 rows and a partial one (CPU devices: ln_bwd_fused8) */
static const int ln_cases[][5] = {/* N, T, C, affine, seq */ {3, 5, 37, 1, 1}, {2, 1, 64, 1, 1}, {4, 3, 9, 0, 1},
                                  {3, 0, 0, 1, 0}, {5, 29, 64, 1, 1}, {3, 13, 24, 0, 1}};

START_TEST(layernorm_fwd_bwd)
{
    const int *cs = ln_cases[_i];
    int N = cs[0], T = cs[1], C = cs[2], affine = cs[3], seq = cs[4];
    int sh[1][4] = {{N, T, C, 1}};
    if (!seq) { /* a plain (N, C, H, W): over the C*H*W features of each sample */
        int s2[4] = {N, 3, 4, 5};
        memcpy(sh[0], s2, sizeof s2);
        T = 1;
        C = 60;
    }
    const int(*shp)[4] = (const int(*)[4])sh;
    lh_case c;
    lh_ctx(&c, NULL);
    char keys[64];
    snprintf(keys, sizeof keys, "eps=1e-5 affine=%d", affine);
    lh_make_seq(&c, "layernorm", keys, 1, shp, (unsigned)seq, N, -1, 1, 970 + (uint64_t)_i);
    ck_assert_int_eq(c.l.out_seq, seq);
    ck_assert_int_eq(c.l.nparams, affine ? 2 : 0);
    int rows = N * T;
    /* a large common offset per row: E[x^2] - E[x]^2 would lose every digit */
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < C; k++)
            c.x[0][(size_t)r * C + k] = c.x[0][(size_t)r * C + k] * 0.5f + 300.0f * (float)(r % 3 + 1);
    lh_reupload(&c);
    if (affine) {
        clg_rng rr;
        tu_rng(&rr, 975);
        tu_fill(c.p[0], (size_t)C, 0.5f, 1.5f, &rr);
        tu_fill(c.p[1], (size_t)C, -0.5f, 0.5f, &rr);
        lh_set_params(&c);
    }
    lh_forward(&c, 1);
    float *dy = rnd(c.ny, -1, 1, 980 + (uint64_t)_i);
    double *y = lh_dalloc(c.ny), *dx = lh_dalloc(c.ny), *dg = lh_dalloc((size_t)C), *db = lh_dalloc((size_t)C);
    ln_ref(c.x[0], c.p[0], c.p[1], dy, rows, C, 1e-5, affine, y, dx, dg, db);
    /* shifted by the row's first value, x - x0 is exact: fp32 rounding of the sums only */
    LH_CLOSE(c.y, y, c.ny, 1e-3, 1e-3, "layernorm forward");
    lh_backward(&c, dy, 0);
    LH_CLOSE(c.dx[0], dx, c.ny, 1e-3, 2e-3, "layernorm dx");
    if (affine) {
        LH_CLOSE(c.g[0], dg, (size_t)C, 1e-2, 5e-3, "layernorm dgamma");
        /* dbeta = a sum of up to 145 dy in [-1, 1]: fp32 rounding is absolute (a few 1e-6 where the terms
         * cancel), so the relative bound takes an offset of 0.1 (1e-5 absolute); one row lost is 0.5 */
        LH_CLOSE(c.g[1], db, (size_t)C, 0.1, 1e-4, "layernorm dbeta");
    }
    free(y);
    free(dx);
    free(dg);
    free(db);
    free(dy);
    lh_free(&c);
}
END_TEST

/* ---------------- token loss ---------------- */

START_TEST(token_loss)
{
    int N = 3, T = _i == 2 ? 1 : 4, V = _i >= 3 ? 8 * _i : 11; /* 11: one class per step; 24, 32: eight */
    double eps = _i == 1 || _i == 3 ? 0.1 : 0.0;
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{N, T, V, 1}};
    char keys[64];
    snprintf(keys, sizeof keys, "label_smoothing=%g", eps);
    lh_make_seq(&c, "softmax", keys, 1, shp, 1, N, -3, 3, 990 + (uint64_t)_i);
    ck_assert_int_eq(c.l.out_seq, 1);
    int rows = N * T;
    int *lab = malloc((size_t)rows * sizeof(int));
    clg_rng r;
    tu_rng(&r, 995);
    for (int i = 0; i < rows; i++)
        lab[i] = (int)(clg_rng_u32(&r) % (uint32_t)V);
    ck_assert_int_eq(clg_buf_alloc(c.dev, (size_t)rows * sizeof(int), &c.labels), CLG_OK);
    ck_assert_int_eq(clEnqueueWriteBuffer(c.dev->queue, c.labels, CL_TRUE, 0, (size_t)rows * sizeof(int), lab, 0,
                                          NULL, NULL),
                     CL_SUCCESS);
    c.l.loss.labels = c.labels;
    c.l.loss.grad_scale = 1.0f / N;
    lh_forward(&c, 1);
    double *p = lh_dalloc(c.ny), loss = 0, correct = 0;
    for (int i = 0; i < rows; i++) {
        const float *x = c.x[0] + (size_t)i * V;
        double mx = x[0], s = 0, sl = 0;
        int am = 0;
        for (int k = 1; k < V; k++)
            if (x[k] > mx) {
                mx = x[k];
                am = k;
            }
        for (int k = 0; k < V; k++)
            s += exp(x[k] - mx);
        for (int k = 0; k < V; k++) {
            p[(size_t)i * V + k] = exp(x[k] - mx) / s;
            sl += -log(p[(size_t)i * V + k]);
        }
        loss += ((1 - eps) * -log(p[(size_t)i * V + lab[i]]) + eps * sl / V) / T;
        correct += am == lab[i] ? 1.0 / T : 0.0;
    }
    LH_CLOSE(c.y, p, c.ny, 1e-6, 1e-4, "token softmax");
    float res[2];
    tu_download(c.dev, c.l.loss.result, res, 2);
    ck_assert_msg(fabs(res[0] - loss) <= 1e-4 * fabs(loss) + 1e-5, "loss %g vs %g", res[0], loss);
    ck_assert_msg(fabs(res[1] - correct) <= 1e-5, "correct %g vs %g", res[1], correct);
    float *dy = lh_alloc(c.ny);
    memset(dy, 0, c.ny * sizeof(float));
    lh_backward(&c, dy, 0);
    for (int i = 0; i < rows; i++)
        for (int k = 0; k < V; k++)
            p[(size_t)i * V + k] = (p[(size_t)i * V + k] - (k == lab[i] ? 1 - eps : 0) - eps / V) / ((double)N * T);
    LH_CLOSE(c.dx[0], p, c.ny, 1e-5, 1e-3, "token loss dx (mean over N*T)");
    if (T > 1) { /* one label per sample instead of per position: refused, not read past the buffer */
        cl_int e;
        cl_mem few = clCreateBuffer(c.dev->cl, CL_MEM_READ_WRITE, (size_t)N * sizeof(int), NULL, &e);
        ck_assert_int_eq(e, CL_SUCCESS);
        c.l.loss.labels = few;
        clg_tensor in = lh_tensor(c.xm[0], c.shp[0], N);
        int os[4] = {N, T, V, 1};
        clg_tensor out = lh_tensor(c.ym, os, N);
        ck_assert_int_eq(c.l.ops->forward(&c.l, c.dev, &in, 1, &out, 1), CLG_ERR_INVALID_ARG);
        ck_assert_msg(strstr(clg_last_error(c.ctx), "one per position") != NULL, "%s", clg_last_error(c.ctx));
        c.l.loss.labels = c.labels;
        clReleaseMemObject(few);
    }
    free(dy);
    free(p);
    free(lab);
    lh_free(&c);
}
END_TEST

/* ---------------- gelu_tanh, dense per position ---------------- */

static double gt_ref(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

/* got[i] against a double reference computed from the same float inputs: a
 * relative tolerance (as tu_max_err: rtol (|ref| + atol)) plus the fp32 rounding floor of a sum of k terms,
 * k 2^-24 sum|terms|, carried through f' (mag[i] = |f'| sum|terms|), times
 * slope. Near zero the relative part alone asks more than fp32 gives (an
 * output of 1e-5 from terms of size 1: one seed in ~50 failed). */
static void close_sums(const float *got, const double *ref, const double *mag, size_t n, int k, double slope,
                       double atol, double rtol, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double bound = rtol * (fabs(ref[i]) + atol) + slope * k * ldexp(1.0, -24) * mag[i];
        ck_assert_msg(isfinite(got[i]) && fabs(got[i] - ref[i]) <= bound,
                      "%s [%zu]: %.9g, reference %.9g, error %.3g > bound %.3g", what, i, (double)got[i], ref[i],
                      fabs(got[i] - ref[i]), bound);
    }
}

START_TEST(gelu_tanh_act)
{
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{3, 5, 7, 1}};
    lh_make_seq(&c, "activation", "type=gelu_tanh", 1, shp, 1, 3, -6, 6, 1000);
    ck_assert_int_eq(c.l.out_seq, 1);
    lh_forward(&c, 1);
    double *y = lh_dalloc(c.ny), *dx = lh_dalloc(c.ny);
    float *dy = rnd(c.ny, -1, 1, 1001);
    for (size_t i = 0; i < c.ny; i++) {
        double x = c.x[0][i], h = 1e-5;
        y[i] = gt_ref(x);
        dx[i] = dy[i] * (gt_ref(x + h) - gt_ref(x - h)) / (2 * h);
    }
    LH_CLOSE(c.y, y, c.ny, 1e-5, 1e-5, "gelu_tanh forward");
    lh_backward(&c, dy, 0);
    /* the kernel's f'(x) = s + x s (1 - s) 2K (1 + 3A x^2), s = sigmoid(2K (x + A x^3)):
     * near f' = 0 (x = -0.75) its two terms cancel, and s carries the
     * rounding of exp's argument (|arg| ulps, up to 25 at |x| = 6): floor
     * (|arg| + 8) 2^-24 (|s| + |second term|) |dy| */
    double *mg = lh_dalloc(c.ny);
    for (size_t i = 0; i < c.ny; i++) {
        double x = c.x[0][i], K = sqrt(2 / M_PI), A = 0.044715, arg = 2 * K * (x + A * x * x * x);
        double sg = 1 / (1 + exp(-arg)), t2 = fabs(x * sg * (1 - sg) * 2 * K * (1 + 3 * A * x * x));
        mg[i] = (fabs(arg) + 8) * (sg + t2) * fabs(dy[i]);
    }
    close_sums(c.dx[0], dx, mg, c.ny, 1, 1.0, 1e-5, 1e-4, "gelu_tanh backward");
    free(mg);
    free(y);
    free(dx);
    free(dy);
    lh_free(&c);
}
END_TEST

START_TEST(dense_per_position)
{
    int N = 2, T = _i ? 5 : 1, C = 7, U = 9;
    const char *act = _i == 2 ? "gelu" : "gelu_tanh";
    lh_case c;
    lh_ctx(&c, NULL);
    const int shp[1][4] = {{N, T, C, 1}};
    char keys[64];
    snprintf(keys, sizeof keys, "units=%d activation=%s", U, act);
    lh_make_seq(&c, "dense", keys, 1, shp, 1, N, -1, 1, 1010 + (uint64_t)_i);
    ck_assert_int_eq(c.l.out_seq, 1);
    ck_assert_int_eq(c.l.out_shape[1], T);
    ck_assert_int_eq(c.l.out_shape[2], U);
    clg_rng rr;
    tu_rng(&rr, 1015);
    tu_fill(c.p[1], (size_t)U, -0.5f, 0.5f, &rr);
    lh_set_params(&c);
    lh_forward(&c, 1);
    int rows = N * T;
    double *z = lh_dalloc((size_t)rows * U), *y = lh_dalloc((size_t)rows * U);
    tu_gemm_ref(0, 1, rows, U, C, 1.0, c.x[0], C, c.p[0], C, 0.0, z, U);
    for (int r = 0; r < rows; r++)
        for (int u = 0; u < U; u++) {
            double v = z[(size_t)r * U + u] + c.p[1][u];
            y[(size_t)r * U + u] = _i == 2 ? 0.5 * v * (1 + erf(v / sqrt(2.0))) : gt_ref(v);
        }
    /* z + b's fp32 rounding (C products, C - 1 sums, the bias) moves y by
     * |act'(z + b)| times it: the floor, per element */
    double *mz = lh_dalloc((size_t)rows * U);
    for (int r = 0; r < rows; r++)
        for (int u = 0; u < U; u++) {
            double v = z[(size_t)r * U + u] + c.p[1][u], h = 1e-5, m = fabs(c.p[1][u]);
            for (int k = 0; k < C; k++)
                m += fabs((double)c.x[0][(size_t)r * C + k] * c.p[0][(size_t)u * C + k]);
            double d = _i == 2 ? (0.5 * (v + h) * (1 + erf((v + h) / sqrt(2.0))) -
                                  0.5 * (v - h) * (1 + erf((v - h) / sqrt(2.0)))) / (2 * h)
                               : (gt_ref(v + h) - gt_ref(v - h)) / (2 * h);
            mz[(size_t)r * U + u] = fabs(d) * m;
        }
    close_sums(c.y, y, mz, c.ny, C + 1, 1.0, 1e-4, 1e-4, "dense per position forward");
    float *dy = rnd(c.ny, -1, 1, 1020);
    lh_backward(&c, dy, 0);
    /* dz = dy * act'(z) (central difference in double), dW = dz^T x, db = colsum dz, dx = dz W */
    double *dz = lh_dalloc((size_t)rows * U);
    float *dzf = lh_alloc((size_t)rows * U);
    for (int r = 0; r < rows; r++)
        for (int u = 0; u < U; u++) {
            double v = z[(size_t)r * U + u] + c.p[1][u], h = 1e-5;
            double d = _i == 2 ? (0.5 * (v + h) * (1 + erf((v + h) / sqrt(2.0))) -
                                  0.5 * (v - h) * (1 + erf((v - h) / sqrt(2.0)))) /
                                     (2 * h)
                               : (gt_ref(v + h) - gt_ref(v - h)) / (2 * h);
            dz[(size_t)r * U + u] = dy[(size_t)r * U + u] * d;
            dzf[(size_t)r * U + u] = (float)dz[(size_t)r * U + u];
        }
    double *dW = lh_dalloc((size_t)U * C), *db = lh_dalloc((size_t)U), *dx = lh_dalloc((size_t)rows * C);
    tu_gemm_ref(1, 0, U, C, rows, 1.0, dzf, U, c.x[0], C, 0.0, dW, C);
    tu_gemm_ref(0, 0, rows, C, U, 1.0, dzf, U, c.p[0], C, 0.0, dx, C);
    for (int r = 0; r < rows; r++)
        for (int u = 0; u < U; u++)
            db[u] += dz[(size_t)r * U + u];
    LH_CLOSE(c.g[0], dW, (size_t)U * C, 1e-4, 1e-3, "dense dW over N*T rows");
    LH_CLOSE(c.g[1], db, (size_t)U, 1e-4, 1e-3, "dense db over N*T rows");
    LH_CLOSE(c.dx[0], dx, (size_t)rows * C, 1e-4, 1e-3, "dense dx per position");
    free(mz);
    free(z);
    free(y);
    free(dy);
    free(dz);
    free(dzf);
    free(dW);
    free(db);
    free(dx);
    lh_free(&c);
}
END_TEST

/* ---------------- networks ---------------- */

#define NET_HEAD "[net]\nchannels=1\nheight=%d\nwidth=1\ninput=tokens\nbatch=%d\n"

static clg_status build(clg_ctx *ctx, const char *text, clg_net **net)
{
    return clg_net_build(&ctx->err, text, "seq.cfg", 0, net);
}

/* Refusals name the file, the line and the problem. */
START_TEST(net_errors)
{
    static const struct {
        const char *body, *want;
    } cases[] = {
        {"[embedding]\nvocab=0\ndim=8\n", "seq.cfg:8"},
        {"[embedding]\nvocab=16\ndim=0\n", "seq.cfg:9"},
        {"[embedding]\nvocab=16\n", "'dim'"},
        {"[embedding]\nvocab=16\ndim=8\n[dense]\ntie=nothere\n", "no layer has that name"},
        {"[embedding]\nvocab=16\ndim=8\n[layernorm]\nname=ln\n[dense]\ntie=ln\n", "names a [layernorm] layer (line 10)"},
        {"[embedding]\nvocab=16\ndim=8\n[dense]\nunits=15\ntie=embedding0\n", "tie = embedding0 has vocab = 16"},
        {"[embedding]\nvocab=16\ndim=8\n[dense]\nunits=5\n[dense]\ntie=embedding0\n", "the embedding's dim is 8"},
        {"[embedding]\nvocab=16\ndim=8\n[convolutional]\nfilters=4\nsize=1\n", "seq.cfg:10: layer 'convolutional1' (convolutional) does not take a sequence"},
        {"[embedding]\nvocab=16\ndim=8\n[batchnorm]\n", "does not take a sequence"},
        {"[embedding]\nvocab=16\ndim=8\n[posembed]\ncontext=5\n", "more than context = 5"},
        {"[embedding]\nvocab=16\ndim=8\n[dense]\nunits=3\n[mse]\n", "does not take a sequence"},
        {"[dense]\nunits=3\n[softmax]\nlabel_smoothing=0.1\n", "not yet"},
        {"[embedding]\nvocab=16\ndim=8\n[dense]\nname=h1\ntie=embedding0\n[dense]\nunits=8\n[dense]\ntie=embedding0\n",
         "seq.cfg:15: layer 'dense3' (dense): link: tie = embedding0: that embedding is tied by another"},
    };
    clg_ctx *ctx = tu_ctx("0");
    for (size_t i = 0; i < CLG_ARRAY_LEN(cases); i++) {
        char text[1024];
        int n = snprintf(text, sizeof text, NET_HEAD, 6, 2);
        snprintf(text + n, sizeof text - (size_t)n, "%s", cases[i].body);
        clg_net *net = NULL;
        clg_status st = build(ctx, text, &net);
        ck_assert_msg(st != CLG_OK, "case %zu accepted", i);
        ck_assert_msg(strstr(ctx->err.msg, cases[i].want) != NULL, "case %zu: '%s' lacks '%s'", i, ctx->err.msg,
                      cases[i].want);
        ck_assert_msg(strstr(ctx->err.msg, "seq.cfg") != NULL, "case %zu: no file in '%s'", i, ctx->err.msg);
    }
    clg_ctx_destroy(ctx);
}
END_TEST

static const char *block_body = "[embedding]\nname=tok\nvocab=%d\ndim=%d\n"
                                "[posembed]\ncontext=%d\n"
                                "[layernorm]\nname=ln1\n"
                                "[dense]\nunits=%d\nactivation=gelu\n"
                                "[dense]\nunits=%d\n"
                                "[add]\ninput=ln1,-1\n"
                                "[layernorm]\n"
                                "[dense]\n%s\n"
                                "[softmax]\n";

/* The block's text for T positions, batch B (vocab V, width D, MLP H). */
static void block_text(char *buf, size_t cap, int T, int B, int V, int D, int H, int ctx_len, const char *head)
{
    int n = snprintf(buf, cap, NET_HEAD, T, B);
    snprintf(buf + n, cap - (size_t)n, block_body, V, D, ctx_len, H, D, head);
}

/* Shapes, sequence flags, the tied parameter counted once. */
START_TEST(net_block_shapes)
{
    clg_ctx *ctx = tu_ctx("0");
    char text[2048];
    block_text(text, sizeof text, 7, 3, 19, 10, 12, 9, "tie=tok");
    clg_net *net = NULL;
    ck_assert_msg(build(ctx, text, &net) == CLG_OK, "%s", ctx->err.msg);
    ck_assert_int_eq(net->input_tokens, 1);
    ck_assert_int_eq(net->classes, 19);
    ck_assert_int_eq(clg_net_labels_per_sample(net), 7);
    const clg_layer *last = &net->proto[net->nlayers - 1];
    ck_assert_int_eq(last->out_seq, 1);
    ck_assert_int_eq(last->out_shape[1], 7);
    ck_assert_int_eq(last->out_shape[2], 19);
    for (int i = 0; i < net->nlayers; i++)
        ck_assert_msg(net->proto[i].out_seq == 1, "layer %d not a sequence", i);
    /* params: tok 19x10, pos 9x10, ln 2x10, fc1 12x10+12, fc2 10x12+10, ln 2x10, head bias 19 */
    uint64_t want = 190 + 90 + 20 + 132 + 130 + 20 + 19;
    ck_assert_uint_eq(net->nparams, want);
    ck_assert_int_eq(net->proto[7].nparams, 1);
    ck_assert_str_eq(net->proto[7].params[0].name, "bias");
    clg_net_free(net);
    clg_ctx_destroy(ctx);
}
END_TEST

/* The tied head: forward logits = x E^T + b; the table's gradient sums the
 * head's part and the embedding's part. Checked against the same network
 * with an untied head whose weight equals the table (dtable_tied =
 * dtable_untied + dW_head). fp32 and fp16 storage. */
static void run_block(clg_ctx *ctx, int tied, int fp16, int T, const float *ids, const int *lab, float *loss,
                      float **table_grad, float **head_grad, const float *table)
{
    char text[2048];
    int B = 3, V = 19, D = 10;
    block_text(text, sizeof text, T, B, V, D, 12, 9, tied ? "tie=tok" : "units=19"); /* untied: its own weight */
    clg_net *net = NULL;
    ck_assert_msg(build(ctx, text, &net) == CLG_OK, "%s", ctx->err.msg);
    net->fp16 = fp16;
    clg_device *dev = &ctx->devs[0];
    clg_replica *r = NULL;
    ck_assert_msg(clg_replica_create(net, dev, 77, &r) == CLG_OK, "%s", clg_last_error(ctx));
    clg_param_ref *refs = NULL;
    int np = 0;
    ck_assert_int_eq(clg_replica_params(r, 1, &refs, &np), CLG_OK);
    int table_i = -1, head_i = -1;
    for (int i = 0; i < np; i++) {
        if (refs[i].layer->index == 0)
            table_i = i;
        if (refs[i].layer->index == 7 && strcmp(refs[i].param->name, "weight") == 0)
            head_i = i;
    }
    ck_assert_int_ge(table_i, 0);
    ck_assert_int_eq(head_i >= 0, !tied);
    /* the same table (and head weight = table when untied) */
    ck_assert_int_eq(clEnqueueWriteBuffer(dev->queue, clg_replica_master(r, &refs[table_i]), CL_TRUE, 0,
                                          (size_t)V * D * sizeof(float), table, 0, NULL, NULL),
                     CL_SUCCESS);
    if (!tied)
        ck_assert_int_eq(clEnqueueWriteBuffer(dev->queue, clg_replica_master(r, &refs[head_i]), CL_TRUE, 0,
                                              (size_t)V * D * sizeof(float), table, 0, NULL, NULL),
                         CL_SUCCESS);
    ck_assert_int_eq(clg_replica_weights_updated(r), CLG_OK);
    cl_mem x = tu_upload(dev, ids, (size_t)B * T), lm;
    ck_assert_int_eq(clg_buf_alloc(dev, (size_t)B * T * sizeof(int), &lm), CLG_OK);
    ck_assert_int_eq(clEnqueueWriteBuffer(dev->queue, lm, CL_TRUE, 0, (size_t)B * T * sizeof(int), lab, 0, NULL, NULL),
                     CL_SUCCESS);
    clg_replica_set_input(r, x, 0);
    clg_replica_set_labels(r, lm, 0, 1.0f / B);
    ck_assert_msg(clg_replica_forward(r, B, 1) == CLG_OK, "%s", clg_last_error(ctx));
    ck_assert_msg(clg_replica_backward(r, B) == CLG_OK, "%s", clg_last_error(ctx));
    float res[2];
    tu_download(dev, r->layers[r->nlayers - 1].loss.result, res, 2);
    *loss = res[0] / B;
    *table_grad = lh_alloc((size_t)V * D);
    tu_download(dev, refs[table_i].param->grad, *table_grad, (size_t)V * D);
    if (!tied) {
        *head_grad = lh_alloc((size_t)V * D);
        tu_download(dev, refs[head_i].param->grad, *head_grad, (size_t)V * D);
    }
    free(refs);
    clg_buf_release(dev, x);
    clg_buf_release(dev, lm);
    clg_replica_free(r);
    clg_net_free(net);
}

START_TEST(net_tied_head)
{
    int T = _i ? 7 : 1, B = 3, V = 19, D = 10;
    clg_ctx *ctx = tu_ctx("0");
    float *ids = lh_alloc((size_t)B * T);
    int *lab = malloc((size_t)B * T * sizeof(int));
    clg_rng r;
    tu_rng(&r, 1100 + (uint64_t)_i);
    for (int i = 0; i < B * T; i++) {
        ids[i] = (float)(clg_rng_u32(&r) % (uint32_t)V);
        lab[i] = (int)(clg_rng_u32(&r) % (uint32_t)V);
    }
    float *table = rnd((size_t)V * D, -0.5f, 0.5f, 1110 + (uint64_t)_i);
    float lt, lu, l16, *gt = NULL, *gu = NULL, *hu = NULL, *g16 = NULL, *dummy = NULL;
    run_block(ctx, 1, 0, T, ids, lab, &lt, &gt, &dummy, table);
    run_block(ctx, 0, 0, T, ids, lab, &lu, &gu, &hu, table);
    ck_assert_msg(fabsf(lt - lu) <= 1e-6f * fabsf(lu) + 1e-6f, "tied loss %g vs untied %g", lt, lu);
    ck_assert_msg(isfinite(lu) && lu > 0.5f && lu < 10.0f, "loss %g is far from log(19) = 2.94", lu);
    double *want = lh_dalloc((size_t)V * D);
    for (int i = 0; i < V * D; i++)
        want[i] = (double)gu[i] + hu[i];
    LH_CLOSE(gt, want, (size_t)V * D, 1e-5, 1e-4, "tied table gradient = embedding part + head part");
    /* fp16 storage: the same within half precision of the activations */
    run_block(ctx, 1, 1, T, ids, lab, &l16, &g16, &dummy, table);
    ck_assert_msg(fabsf(l16 - lt) <= 2e-3f * fabsf(lt), "fp16 loss %g vs fp32 %g", l16, lt);
    /* half activations and gradients, amplified by the layer norms' 1/std: compare as a whole (L2) */
    double num = 0, den = 0;
    for (int i = 0; i < V * D; i++) {
        num += ((double)g16[i] - gt[i]) * ((double)g16[i] - gt[i]);
        den += (double)gt[i] * gt[i];
    }
    ck_assert_msg(sqrt(num) <= 2e-2 * sqrt(den), "fp16 tied table gradient: relative L2 error %g > 2e-2",
                  sqrt(num / den));
    free(want);
    free(gt);
    free(gu);
    free(hu);
    free(g16);
    free(table);
    free(ids);
    free(lab);
    clg_ctx_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("seq");
    TCase *tc = tcase_create("seq");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, embedding_fwd_bwd, 0, (int)CLG_ARRAY_LEN(emb_cases));
    tcase_add_loop_test(tc, embedding_bad_id, 0, 4);
    tcase_add_loop_test(tc, posembed_fwd_bwd, 0, 2);
    tcase_add_loop_test(tc, layernorm_fwd_bwd, 0, (int)CLG_ARRAY_LEN(ln_cases));
    tcase_add_loop_test(tc, token_loss, 0, 5);
    tcase_add_test(tc, gelu_tanh_act);
    tcase_add_loop_test(tc, dense_per_position, 0, 3);
    tcase_add_test(tc, net_errors);
    tcase_add_test(tc, net_block_shapes);
    tcase_add_loop_test(tc, net_tied_head, 0, 2);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
