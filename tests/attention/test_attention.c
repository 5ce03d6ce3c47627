/* Attention kernels (src/ops/attention.c): the fused and the GEMM paths,
 * forward and backward, against a double-precision C reference on fresh
 * random inputs (seed printed), outputs poisoned with NaN first. Q, K, V are
 * read strided from one (N, T, 3C) buffer, as the layer does, and the
 * gradients written into one (N, T, 3C) buffer; O sits at an offset between
 * NaN guards. Shapes: T in {1, 7, 33, 69} (not multiples of the 32-row tile),
 * head widths 16, 32, 64, N x heads = 4, causal and not.
 * Also generation with a key/value cache against the full-sequence result.
 * CLGRAD_TEST_TINY=1: a few tiny shapes (oclgrind). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/attention.h"
#include "ops/nn.h"
#include "attn_ref.h"
#include "testutil.h"

/* max |got - ref| / (|ref| + ATOL): inputs in [-1, 1], fp32 accumulation over
 * at most 69 keys and 64 widths, exp/log in single precision */
#define TOL 2e-4
#define ATOL 1e-2

static clg_ctx *ctx;
static clg_device *dev;
static uint64_t stream = 1;


typedef struct {
    float *o, *lse, *dqkv; /* device results (lse: fused only) */
} aresult;

static void result_free(aresult *r)
{
    free(r->o);
    free(r->lse);
    free(r->dqkv);
}

#define OOFF 5 /* element offset of O / dO inside their buffers */

/* Runs algo (fused: kernel variant, see clg_attn_desc) forward and backward on device with qkv and g (dO). */
static aresult run_algo_pass(const acase *c, clg_attn_algo algo, int variant, int per_head, const float *qkv,
                             const float *g)
{
    int C = c->H * c->d;
    size_t nseq = (size_t)c->N * c->T * C;
    clg_attn_desc a = {c->N, c->T, c->H, c->d, c->causal, (float)(1.0 / sqrt((double)c->d)), variant, 0, 0, 0.0f, 0, 0, 0,
                       per_head};
    size_t nsaved = clg_attn_saved_floats(&a, algo);
    cl_mem mqkv = tu_upload(dev, qkv, 3 * nseq), mg = tu_upload_at(dev, g, nseq, OOFF);
    cl_mem mo = tu_upload_at(dev, NULL, nseq, OOFF), msaved = tu_upload(dev, NULL, nsaved);
    cl_mem mdqkv = tu_upload(dev, NULL, 3 * nseq);
    clg_attn_seq q = {mqkv, 0, 3 * C}, k = {mqkv, (size_t)C, 3 * C}, v = {mqkv, 2 * (size_t)C, 3 * C};
    clg_attn_seq o = {mo, OOFF, C}, go = {mg, OOFF, C};
    clg_attn_seq dq = {mdqkv, 0, 3 * C}, dk = {mdqkv, (size_t)C, 3 * C}, dv = {mdqkv, 2 * (size_t)C, 3 * C};
    clg_status st = clg_attn_forward(dev, &a, algo, &q, &k, &v, &o, msaved, 0);
    ck_assert_msg(st == CLG_OK, "forward: %s", clg_last_error(ctx));
    st = clg_attn_backward(dev, &a, algo, &q, &k, &v, &o, msaved, 0, &go, &dq, &dk, &dv);
    ck_assert_msg(st == CLG_OK, "backward: %s", clg_last_error(ctx));
    aresult r = {NULL, NULL, NULL};
    r.o = tu_download_at(dev, mo, nseq, OOFF);
    r.dqkv = malloc(sizeof(float) * 3 * nseq);
    tu_download(dev, mdqkv, r.dqkv, 3 * nseq);
    if (algo == CLG_ATTN_FUSED) {
        r.lse = malloc(sizeof(float) * nsaved);
        tu_download(dev, msaved, r.lse, nsaved);
    }
    clg_buf_release(dev, mqkv);
    clg_buf_release(dev, mg);
    clg_buf_release(dev, mo);
    clg_buf_release(dev, msaved);
    clg_buf_release(dev, mdqkv);
    return r;
}

static aresult run_algo(const acase *c, clg_attn_algo algo, int variant, const float *qkv, const float *g)
{
    return run_algo_pass(c, algo, variant, 0, qkv, g);
}

static double max_err_ff(const float *a, const float *b, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + ATOL);
        if (!(d <= e))
            e = isnan(d) ? INFINITY : d;
    }
    return e;
}

static int tiny(void)
{
    const char *s = getenv("CLGRAD_TEST_TINY");
    return s && *s == '1';
}

static void run_case(const acase *c)
{
    clg_rng r;
    tu_rng(&r, stream++);
    int C = c->H * c->d;
    size_t nseq = (size_t)c->N * c->T * C, rows = (size_t)c->N * c->H * c->T;
    float *qkv = malloc(sizeof(float) * 3 * nseq), *g = malloc(sizeof(float) * nseq);
    tu_fill(qkv, 3 * nseq, -1.0f, 1.0f, &r);
    tu_fill(g, nseq, -1.0f, 1.0f, &r);
    double *o = malloc(sizeof(double) * nseq), *lse = malloc(sizeof(double) * rows);
    double *dqkv = malloc(sizeof(double) * 3 * nseq);
    double *qkvd = malloc(sizeof(double) * 3 * nseq), *gd = malloc(sizeof(double) * nseq);
    for (size_t i = 0; i < 3 * nseq; i++)
        qkvd[i] = qkv[i];
    for (size_t i = 0; i < nseq; i++)
        gd[i] = g[i];
    ref_attention(c, qkvd, gd, o, lse, dqkv);
    free(qkvd);
    free(gd);
    /* the fused kernels: the device's default variant on every shape; the others (local-memory
     * tiles, direct reads, CPU register tiles) on head width 16 (and on every shape under
     * oclgrind): each kernel build is a separate program build, seconds on PoCL */
    aresult f = run_algo(c, CLG_ATTN_FUSED, 0, qkv, g);
    aresult m = run_algo(c, CLG_ATTN_GEMM, 0, qkv, g);
    for (int variant = 1; variant <= 3 && (c->d == 16 || tiny()); variant++) {
        aresult f2 = run_algo(c, CLG_ATTN_FUSED, variant, qkv, g);
        double e2 = CLG_MAX(CLG_MAX(tu_max_err(f2.o, o, nseq, ATOL), tu_max_err(f2.lse, lse, rows, ATOL)),
                            tu_max_err(f2.dqkv, dqkv, 3 * nseq, ATOL));
        ck_assert_msg(e2 < TOL, "fused (variant %d) N=%d T=%d H=%d d=%d causal=%d: err %g", variant, c->N, c->T, c->H,
                      c->d, c->causal, e2);
        result_free(&f2);
    }
    /* the CPU variant's two forms (one work-item per head: forward transposing its own K,
     * backward in one pass; blocks of rows: transposes, split dQ and dK/dV), every shape whose
     * width it takes */
    for (int ph = 1; ph <= 2 && c->d % 8 == 0; ph++) {
        aresult f3 = run_algo_pass(c, CLG_ATTN_FUSED, 3, ph, qkv, g);
        double e3 = CLG_MAX(CLG_MAX(tu_max_err(f3.o, o, nseq, ATOL), tu_max_err(f3.lse, lse, rows, ATOL)),
                            tu_max_err(f3.dqkv, dqkv, 3 * nseq, ATOL));
        ck_assert_msg(e3 < TOL, "fused (variant 3, per_head %d) N=%d T=%d H=%d d=%d causal=%d: err %g", ph, c->N, c->T,
                      c->H, c->d, c->causal, e3);
        result_free(&f3);
    }
    double ef = tu_max_err(f.o, o, nseq, ATOL), el = tu_max_err(f.lse, lse, rows, ATOL);
    double edf = tu_max_err(f.dqkv, dqkv, 3 * nseq, ATOL);
    double eg = tu_max_err(m.o, o, nseq, ATOL), edg = tu_max_err(m.dqkv, dqkv, 3 * nseq, ATOL);
    double eo = max_err_ff(f.o, m.o, nseq), ed = max_err_ff(f.dqkv, m.dqkv, 3 * nseq);
    const char *what = c->causal ? "causal" : "full";
    if (getenv("ATT_DEBUG"))
        fprintf(stderr, "N=%d T=%d H=%d d=%d %s: %g %g %g %g %g %g %g\n", c->N, c->T, c->H, c->d, what, ef, el, edf, eg,
                edg, eo, ed);
    ck_assert_msg(ef < TOL && el < TOL, "fused forward N=%d T=%d H=%d d=%d %s: o err %g lse err %g", c->N, c->T, c->H,
                  c->d, what, ef, el);
    ck_assert_msg(edf < TOL, "fused backward N=%d T=%d H=%d d=%d %s: err %g", c->N, c->T, c->H, c->d, what, edf);
    ck_assert_msg(eg < TOL, "gemm forward N=%d T=%d H=%d d=%d %s: err %g", c->N, c->T, c->H, c->d, what, eg);
    ck_assert_msg(edg < TOL, "gemm backward N=%d T=%d H=%d d=%d %s: err %g", c->N, c->T, c->H, c->d, what, edg);
    ck_assert_msg(eo < TOL && ed < TOL, "fused vs gemm N=%d T=%d d=%d %s: o %g grads %g", c->N, c->T, c->d, what, eo,
                  ed);
    result_free(&f);
    result_free(&m);
    free(qkv);
    free(g);
    free(o);
    free(lse);
    free(dqkv);
}

static void setup(void)
{
    ctx = tu_ctx("0");
    dev = &ctx->devs[0];
}

static void teardown(void) { clg_ctx_destroy(ctx); }

START_TEST(test_shapes)
{
    static const int Ts[] = {1, 7, 33, 69};
    static const int ds[] = {16, 32, 64};
    if (tiny()) {
        acase t[] = {{1, 5, 2, 16, 1}, {2, 3, 1, 16, 0}, {1, 18, 1, 8, 1}};
        for (size_t i = 0; i < CLG_ARRAY_LEN(t); i++)
            run_case(&t[i]);
        return;
    }
    for (size_t di = 0; di < CLG_ARRAY_LEN(ds); di++)
        for (size_t ti = 0; ti < CLG_ARRAY_LEN(Ts); ti++) {
            acase c = {2, Ts[ti], 2, ds[di], 1};
            run_case(&c);
            if (ti == 2) { /* one non-causal case per width */
                c.causal = 0;
                run_case(&c);
            }
        }
    /* T padded past 256 (cl/attention.cl FWD_TP_MAX): the CPU forward's online softmax, not the two-pass one */
    acase big = {1, 260, 1, 32, 1};
    run_case(&big);
}
END_TEST

/* Batch 1 with several heads, and several samples of one head (N x heads > 1 both ways). */
START_TEST(test_heads)
{
    if (tiny())
        return;
    acase a = {1, 40, 4, 16, 1}, b = {3, 20, 1, 32, 1};
    if (!getenv("ATT_B_ONLY"))
        run_case(&a);
    if (!getenv("ATT_A_ONLY"))
        run_case(&b);
}
END_TEST

/* Generation with a key/value cache: a prefix of 5 positions, then one
 * position at a time, each step appending its keys and values to the cache
 * and attending from its queries; every row equals the full-sequence
 * forward's (and the double reference) for T = 12. */
START_TEST(test_cached)
{
    const int N = 2, T = 12, H = 2, d = 16, C = H * d, Tc = 16;
    clg_rng r;
    tu_rng(&r, 999);
    size_t nseq = (size_t)N * T * C;
    float *qkv = malloc(sizeof(float) * 3 * nseq);
    tu_fill(qkv, 3 * nseq, -1.0f, 1.0f, &r);
    double *qkvd = malloc(sizeof(double) * 3 * nseq), *o = malloc(sizeof(double) * nseq);
    double *lse = malloc(sizeof(double) * N * H * T);
    for (size_t i = 0; i < 3 * nseq; i++)
        qkvd[i] = qkv[i];
    acase ac = {N, T, H, d, 1};
    ref_attention(&ac, qkvd, NULL, o, lse, NULL);
    cl_mem kc = tu_upload(dev, NULL, (size_t)N * Tc * C), vc = tu_upload(dev, NULL, (size_t)N * Tc * C);
    clg_attn_seq skc = {kc, 0, C}, svc = {vc, 0, C};
    double err = 0;
    for (int past = 0; past < T;) {
        int tn = past == 0 ? 5 : 1;
        /* the new positions' q, k, v as a (N, tn, 3C) buffer, as a projection would write them */
        size_t nn = (size_t)N * tn * 3 * C;
        float *step = malloc(sizeof(float) * nn);
        for (int n = 0; n < N; n++)
            memcpy(step + (size_t)n * tn * 3 * C, qkv + ((size_t)n * T + past) * 3 * C, sizeof(float) * tn * 3 * C);
        cl_mem ms = tu_upload(dev, step, nn), mo = tu_upload(dev, NULL, (size_t)N * tn * C);
        clg_attn_desc a = {N, tn, H, d, 1, 0.25f, 0, 0, 0, 0.0f, 0, 0, 0, 0};
        clg_attn_seq q = {ms, 0, 3 * C}, k = {ms, (size_t)C, 3 * C}, v = {ms, 2 * (size_t)C, 3 * C}, so = {mo, 0, C};
        ck_assert_msg(clg_attn_cache_append(dev, &a, Tc, past, &k, &v, &skc, &svc) == CLG_OK, "%s",
                      clg_last_error(ctx));
        ck_assert_msg(clg_attn_forward_cached(dev, &a, Tc, past, &q, &skc, &svc, &so) == CLG_OK, "%s",
                      clg_last_error(ctx));
        float *got = malloc(sizeof(float) * N * tn * C);
        tu_download(dev, mo, got, (size_t)N * tn * C);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < tn; i++)
                for (int c = 0; c < C; c++) {
                    double ref = o[((size_t)n * T + past + i) * C + c];
                    double e = fabs(got[((size_t)n * tn + i) * C + c] - ref) / (fabs(ref) + ATOL);
                    err = isnan(e) || e > err ? (isnan(e) ? INFINITY : e) : err;
                }
        free(got);
        free(step);
        clg_buf_release(dev, ms);
        clg_buf_release(dev, mo);
        past += tn;
    }
    ck_assert_msg(err < TOL, "cached generation: error %g against the full-sequence reference", err);
    /* a cache too small for the new positions */
    clg_attn_desc a = {N, 5, H, d, 1, 0.25f, 0, 0, 0, 0.0f, 0, 0, 0, 0};
    clg_attn_seq q = {kc, 0, C};
    ck_assert_int_eq(clg_attn_forward_cached(dev, &a, Tc, 12, &q, &skc, &svc, &q), CLG_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "do not fit a cache of 16 positions"));
    clg_buf_release(dev, kc);
    clg_buf_release(dev, vc);
    free(qkv), free(qkvd), free(o), free(lse);
}
END_TEST

/* Runs algo (fused: variant) forward and backward with dropout desc a into
 * poisoned outputs; returns the errors of o and dqkv against the references. */
static void dropout_run(const clg_attn_desc *a, clg_attn_algo algo, const float *qkv, const float *g, const double *o,
                        const double *dqkv, double *eo, double *eg)
{
    int C = a->heads * a->d;
    size_t nseq = (size_t)a->N * a->T * C, ns = clg_attn_saved_floats(a, algo);
    cl_mem mqkv = tu_upload(dev, qkv, 3 * nseq), mg = tu_upload(dev, g, nseq), mo = tu_upload(dev, NULL, nseq);
    cl_mem ms = tu_upload(dev, NULL, ns), md = tu_upload(dev, NULL, 3 * nseq);
    clg_attn_seq sq = {mqkv, 0, 3 * C}, sk = {mqkv, (size_t)C, 3 * C}, sv = {mqkv, 2 * (size_t)C, 3 * C};
    clg_attn_seq so = {mo, 0, C}, sg = {mg, 0, C};
    clg_attn_seq dq = {md, 0, 3 * C}, dk = {md, (size_t)C, 3 * C}, dv = {md, 2 * (size_t)C, 3 * C};
    ck_assert_msg(clg_attn_forward(dev, a, algo, &sq, &sk, &sv, &so, ms, 0) == CLG_OK, "%s", clg_last_error(ctx));
    ck_assert_msg(clg_attn_backward(dev, a, algo, &sq, &sk, &sv, &so, ms, 0, &sg, &dq, &dk, &dv) == CLG_OK, "%s",
                  clg_last_error(ctx));
    float *got = malloc(sizeof(float) * 3 * nseq);
    tu_download(dev, mo, got, nseq);
    *eo = tu_max_err(got, o, nseq, ATOL);
    tu_download(dev, md, got, 3 * nseq);
    *eg = tu_max_err(got, dqkv, 3 * nseq, ATOL);
    cl_mem m[] = {mqkv, mg, mo, ms, md};
    for (int i = 0; i < 5; i++)
        clg_buf_release(dev, m[i]);
    free(got);
}

/* Dropout on the probabilities, the gemm algorithm and the fused CPU kernels
 * (variant 3): against a double reference with the dropout layer's mask
 * (clg_nn_dropout_scale_host) for element base + ((n H + h) T + i) T + j;
 * T = 37 spans three 16-key tiles. The other fused variants refuse it. */
START_TEST(test_dropout)
{
    enum { TMAX = 64 };
    const int N = 2, T = 37, H = 2, d = 16, C = H * d;
    const float pdrop = 0.3f;
    const uint32_t seed = 11, step = 3, base = 5;
    clg_rng r;
    tu_rng(&r, 4242);
    size_t nseq = (size_t)N * T * C;
    float *qkv = malloc(sizeof(float) * 3 * nseq), *g = malloc(sizeof(float) * nseq);
    tu_fill(qkv, 3 * nseq, -1.0f, 1.0f, &r);
    tu_fill(g, nseq, -1.0f, 1.0f, &r);
    double *o = calloc(nseq, sizeof(double)), *dqkv = calloc(3 * nseq, sizeof(double));
    double scale = 0.25, p[TMAX], dp[TMAX];
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)n * T + i) * 3 * C + h * d, *gi = g + ((size_t)n * T + i) * C + h * d;
                double m = -INFINITY, sum = 0, D = 0, mk[TMAX];
                for (int j = 0; j <= i; j++) {
                    const float *k = qkv + ((size_t)n * T + j) * 3 * C + C + h * d;
                    double s = 0;
                    for (int e = 0; e < d; e++)
                        s += (double)q[e] * k[e];
                    p[j] = s * scale;
                    m = fmax(m, p[j]);
                }
                for (int j = 0; j <= i; j++)
                    sum += (p[j] = exp(p[j] - m));
                for (int j = 0; j <= i; j++) {
                    const float *v = qkv + ((size_t)n * T + j) * 3 * C + 2 * C + h * d;
                    p[j] /= sum;
                    mk[j] = clg_nn_dropout_scale_host(seed, step, base + (uint32_t)((((size_t)n * H + h) * T + i) * T + j),
                                                      pdrop);
                    dp[j] = 0;
                    for (int e = 0; e < d; e++) {
                        o[((size_t)n * T + i) * C + h * d + e] += p[j] * mk[j] * v[e];
                        dp[j] += (double)gi[e] * v[e];
                    }
                    dp[j] *= mk[j];
                    D += p[j] * dp[j];
                }
                for (int j = 0; j <= i; j++) {
                    const float *k = qkv + ((size_t)n * T + j) * 3 * C + C + h * d;
                    double ds = p[j] * (dp[j] - D) * scale;
                    double *dq = dqkv + ((size_t)n * T + i) * 3 * C + h * d;
                    double *dk = dqkv + ((size_t)n * T + j) * 3 * C + C + h * d, *dv = dk + C;
                    for (int e = 0; e < d; e++) {
                        dq[e] += ds * k[e];
                        dk[e] += ds * q[e];
                        dv[e] += p[j] * mk[j] * gi[e];
                    }
                }
            }
    clg_attn_desc a = {N, T, H, d, 1, (float)scale, 0, 0, 0, pdrop, seed, step, base, 0};
    ck_assert_uint_eq(clg_attn_saved_floats(&a, CLG_ATTN_GEMM), 2 * (size_t)N * H * T * T);
    double eo, eg;
    dropout_run(&a, CLG_ATTN_GEMM, qkv, g, o, dqkv, &eo, &eg);
    ck_assert_msg(eo < TOL && eg < TOL, "gemm with dropout: output error %g, gradient error %g", eo, eg);
    clg_attn_desc f = a;
    f.variant = 3;
    for (f.per_head = 0; f.per_head <= 2; f.per_head++) {
        dropout_run(&f, CLG_ATTN_FUSED, qkv, g, o, dqkv, &eo, &eg);
        ck_assert_msg(eo < TOL && eg < TOL,
                      "fused (CPU variant, per_head %d) with dropout: output error %g, gradient error %g", f.per_head,
                      eo, eg);
    }
    f.variant = 1;
    float z[1] = {0};
    cl_mem mz = tu_upload(dev, z, 1);
    clg_attn_seq s1 = {mz, 0, 3 * C};
    ck_assert_int_eq(clg_attn_forward(dev, &f, CLG_ATTN_FUSED, &s1, &s1, &s1, &s1, mz, 0), CLG_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "not supported yet by variant 1"));
    clg_buf_release(dev, mz);
    free(qkv), free(g), free(o), free(dqkv);
}
END_TEST

START_TEST(test_errors)
{
    float one = 0;
    cl_mem m = tu_upload(dev, &one, 1);
    clg_attn_seq s = {m, 0, 16};
    clg_attn_desc a = {1, 1, 1, 16, 1, 0.25f, 0, 0, 0, 0.0f, 0, 0, 0, 0};
    clg_attn_desc bad = a;
    bad.d = CLG_ATTN_MAX_D + 1;
    ck_assert_int_eq(clg_attn_forward(dev, &bad, CLG_ATTN_FUSED, &s, &s, &s, &s, m, 0), CLG_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "head width"));
    bad = a;
    bad.T = 0;
    ck_assert_int_eq(clg_attn_forward(dev, &bad, CLG_ATTN_FUSED, &s, &s, &s, &s, m, 0), CLG_ERR_SHAPE);
    clg_attn_seq narrow = {m, 0, 8};
    ck_assert_int_eq(clg_attn_forward(dev, &a, CLG_ATTN_FUSED, &narrow, &s, &s, &s, m, 0), CLG_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "'q' row pitch"));
    clg_attn_seq none = {NULL, 0, 16};
    ck_assert_int_eq(clg_attn_forward(dev, &a, CLG_ATTN_GEMM, &s, &none, &s, &s, m, 0), CLG_ERR_INVALID_ARG);
    clg_buf_release(dev, m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attention");
    TCase *tc = tcase_create("attention");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_shapes);
    tcase_add_test(tc, test_heads);
    tcase_add_test(tc, test_cached);
    tcase_add_test(tc, test_dropout);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
