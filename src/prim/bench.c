/* Benchmarks of the convolution launchers and of the primitives API against
 * them (include/clgrad.h, "Front ends": clg_bench_conv_*, clg_bench_prim_*),
 * for `clgrad bench conv` and `clgrad bench prim`: the program times through
 * these calls and prints; the launchers stay internal. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clgrad_prim.h"
#include "device/device.h"
#include "ops/conv.h"
#include "ops/conv_impl.h"
#include "ops/gemm.h"

static clg_conv_shape conv_shape(const clg_bench_conv_shape *b)
{
    return (clg_conv_shape){.N = b->n, .C = b->c, .H = b->h, .W = b->w, .K = b->k, .R = b->r, .S = b->s,
                            .pad_h = b->pad_h, .pad_w = b->pad_w, .stride_h = b->stride_h, .stride_w = b->stride_w,
                            .dil_h = b->dil_h, .dil_w = b->dil_w, .groups = b->groups};
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// ---- one convolution: operands and the host reference ----

/* The operands of one shape: x (N,C,H,W), w (K,C/g,R,S), y and dy (N,K,P,Q),
 * dx like x, dw like w, bias and its gradient (K); host copies of x, w, dy. */
typedef struct conv_buffers {
    size_t nx, nw, ny;
    float *hx, *hw, *hdy;
    cl_mem x, w, y, dy, dx, dw, b, db;
} conv_buffers;

static void conv_buffers_free(clg_device *dev, conv_buffers *cb)
{
    cl_mem *m[] = {&cb->x, &cb->w, &cb->y, &cb->dy, &cb->dx, &cb->dw, &cb->b, &cb->db};
    for (size_t i = 0; i < CLG_ARRAY_LEN(m); i++) {
        clg_buf_release(dev, *m[i]);
        *m[i] = NULL;
    }
    free(cb->hx), free(cb->hw), free(cb->hdy);
    cb->hx = cb->hw = cb->hdy = NULL;
}

static clg_status upload(clg_device *dev, cl_mem m, const float *h, size_t n)
{
    cl_int e = clEnqueueWriteBuffer(dev->queue, m, CL_TRUE, 0, n * sizeof(float), h, 0, NULL, NULL);
    return e == CL_SUCCESS ? CLG_OK : clg_err_set(clg_dev_err(dev), CLG_ERR_OPENCL, "bench: upload: OpenCL error %d", e);
}

/* N(0,1) inputs, filters and output gradients (seed 42: the same every
 * call), a zero bias; all on the device. */
static clg_status conv_buffers_make(clg_device *dev, const clg_conv_shape *s, conv_buffers *cb)
{
    memset(cb, 0, sizeof *cb);
    cb->nx = (size_t)s->N * s->C * s->H * s->W;
    cb->nw = (size_t)s->K * (s->C / s->groups) * s->R * s->S;
    cb->ny = (size_t)s->N * s->K * clg_conv_out_h(s) * clg_conv_out_w(s);
    cb->hx = malloc(cb->nx * sizeof(float)), cb->hw = malloc(cb->nw * sizeof(float));
    cb->hdy = malloc(cb->ny * sizeof(float));
    float *hb = calloc((size_t)s->K, sizeof(float));
    if (!cb->hx || !cb->hw || !cb->hdy || !hb) {
        free(hb);
        return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "out of host memory");
    }
    clg_rng r;
    clg_rng_seed(&r, 42, 0);
    for (size_t i = 0; i < cb->nx; i++)
        cb->hx[i] = clg_rng_normal(&r);
    for (size_t i = 0; i < cb->nw; i++)
        cb->hw[i] = clg_rng_normal(&r);
    for (size_t i = 0; i < cb->ny; i++)
        cb->hdy[i] = clg_rng_normal(&r);
    size_t k4 = (size_t)s->K * 4;
    clg_status st = CLG_OK;
    if (clg_buf_alloc(dev, cb->nx * 4, &cb->x) || clg_buf_alloc(dev, cb->nw * 4, &cb->w) ||
        clg_buf_alloc(dev, cb->ny * 4, &cb->y) || clg_buf_alloc(dev, cb->ny * 4, &cb->dy) ||
        clg_buf_alloc(dev, cb->nx * 4, &cb->dx) || clg_buf_alloc(dev, cb->nw * 4, &cb->dw) ||
        clg_buf_alloc(dev, k4, &cb->b) || clg_buf_alloc(dev, k4, &cb->db))
        st = CLG_ERR_DEVICE_OOM; /* detail recorded by clg_buf_alloc */
    if (st == CLG_OK)
        st = upload(dev, cb->x, cb->hx, cb->nx);
    if (st == CLG_OK)
        st = upload(dev, cb->w, cb->hw, cb->nw);
    if (st == CLG_OK)
        st = upload(dev, cb->dy, cb->hdy, cb->ny);
    if (st == CLG_OK)
        st = upload(dev, cb->b, hb, (size_t)s->K);
    free(hb);
    return st;
}

/* The double-precision reference of one pass, accumulated into ref. */
static void conv_reference(const clg_conv_shape *s, int pass, const conv_buffers *cb, double *ref)
{
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s), Cg = s->C / s->groups, Kg = s->K / s->groups;
    const float *x = cb->hx, *w = cb->hw, *dy = cb->hdy;
    for (int b = 0; b < s->N; b++)
        for (int k = 0; k < s->K; k++)
            for (int cc = 0; cc < Cg; cc++)
                for (int r = 0; r < s->R; r++)
                    for (int t = 0; t < s->S; t++) {
                        int c = (k / Kg) * Cg + cc;
                        size_t iw = (((size_t)k * Cg + cc) * s->R + r) * s->S + t;
                        for (int p = 0; p < P; p++) {
                            int h = p * s->stride_h - s->pad_h + r * s->dil_h;
                            if (h < 0 || h >= s->H)
                                continue;
                            for (int q = 0; q < Q; q++) {
                                int ww = q * s->stride_w - s->pad_w + t * s->dil_w;
                                if (ww < 0 || ww >= s->W)
                                    continue;
                                size_t ix = (((size_t)b * s->C + c) * s->H + h) * s->W + ww;
                                size_t iy = (((size_t)b * s->K + k) * P + p) * Q + q;
                                if (pass == 0)
                                    ref[iy] += (double)x[ix] * w[iw];
                                else if (pass == 1)
                                    ref[ix] += (double)dy[iy] * w[iw];
                                else
                                    ref[iw] += (double)x[ix] * dy[iy];
                            }
                        }
                    }
}

/* max|got-ref| / max|ref| of the pass's device result (NaN: out of memory). */
static double conv_error(clg_device *dev, const clg_conv_shape *s, int pass, const conv_buffers *cb)
{
    size_t n = pass == 0 ? cb->ny : pass == 1 ? cb->nx : cb->nw;
    cl_mem out = pass == 0 ? cb->y : pass == 1 ? cb->dx : cb->dw;
    double *ref = calloc(n, sizeof(double));
    float *got = malloc(n * sizeof(float));
    if (!ref || !got) {
        free(ref);
        free(got);
        return NAN;
    }
    clEnqueueReadBuffer(dev->queue, out, CL_TRUE, 0, n * sizeof(float), got, 0, NULL, NULL);
    conv_reference(s, pass, cb, ref);
    double emax = 0, rmax = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]);
        if (isnan(got[i]))
            e = INFINITY;
        emax = e > emax ? e : emax;
        rmax = fabs(ref[i]) > rmax ? fabs(ref[i]) : rmax;
    }
    free(ref);
    free(got);
    return rmax > 0 ? emax / rmax : emax;
}

// ---- clg_bench_conv_* ----

clg_status clg_bench_conv_check(clg_ctx *ctx, const clg_bench_conv_shape *s)
{
    if (!ctx || !s)
        return clg_err_set(ctx ? &ctx->err : NULL, CLG_ERR_INVALID_ARG, "clg_bench_conv_check: ctx and s are required");
    clg_conv_shape cs = conv_shape(s);
    return clg_conv_check(&ctx->err, &cs);
}

int clg_bench_conv_supported(const clg_bench_conv_shape *s, int pass, int algo)
{
    if (!s || pass < 0 || pass > 2 || algo < 0 || algo >= CLG_CONV_ALGO_COUNT)
        return 0;
    clg_conv_shape cs = conv_shape(s);
    return clg_conv_algo_supported((clg_conv_algo)algo, &cs, (clg_conv_pass)pass);
}

/* One run of the pass, the queue finished. */
static clg_status conv_run(clg_device *dev, const clg_conv_shape *s, int pass, clg_conv_algo a, clg_conv_cache *cache,
                           const conv_buffers *cb)
{
    clg_status st;
    if (pass == 0)
        st = clg_conv_forward(dev, s, a, cache, cb->x, 0, cb->w, 0, cb->b, 0, 0, cb->y, 0);
    else if (pass == 1)
        st = clg_conv_backward_data(dev, s, a, cache, cb->dy, 0, cb->w, 0, cb->dx, 0);
    else
        st = clg_conv_backward_filter(dev, s, a, cb->x, 0, cb->dy, 0, 0.0f, cb->dw, 0, cb->db, 0);
    if (st == CLG_OK && clFinish(dev->queue) != CL_SUCCESS)
        st = clg_err_set(clg_dev_err(dev), CLG_ERR_OPENCL, "conv: clFinish failed");
    return st;
}

/* What the automatic choice ran for the pass. */
static int conv_chosen(clg_device *dev, const clg_conv_shape *s, int pass, const clg_conv_cache *cache,
                       const conv_buffers *cb)
{
    clg_conv_algo pick = cache->chosen[pass];
    if (pass == CLG_CONV_BWD_FILTER) {
        /* backward-filter has no layer cache: read the choice back from the measurement table */
        clg_conv_io io;
        memset(&io, 0, sizeof io);
        io.x = cb->x;
        io.dy = cb->dy;
        io.dw = cb->dw;
        if (clg_conv_auto_pick(dev, s, CLG_CONV_BWD_FILTER, &io, &pick) != CLG_OK)
            pick = CLG_CONV_AUTO;
    }
    return (int)pick;
}

clg_status clg_bench_conv_time(clg_ctx *ctx, int device, const clg_bench_conv_shape *s, int pass, int algo, int reps,
                               int check, clg_bench_conv_result *out)
{
    if (!ctx || !s || !out || reps < 1 || pass < 0 || pass > 2 || algo < 0 || algo >= CLG_CONV_ALGO_COUNT)
        return clg_err_set(ctx ? &ctx->err : NULL, CLG_ERR_INVALID_ARG,
                           "clg_bench_conv_time: ctx, s and out are required, reps >= 1, pass 0..2, algo 0..%d",
                           CLG_CONV_ALGO_COUNT - 1);
    if (device < 0 || device >= ctx->ndev)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "clg_bench_conv_time: device %d out of range (%d)", device,
                           ctx->ndev);
    clg_device *dev = &ctx->devs[device];
    clg_conv_shape cs = conv_shape(s);
    CLG_TRY(clg_conv_check(&ctx->err, &cs));
    double *t = malloc(sizeof(double) * (size_t)(reps + 1));
    conv_buffers cb;
    clg_status st = conv_buffers_make(dev, &cs, &cb);
    if (st == CLG_OK && !t)
        st = clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of host memory");
    clg_conv_cache cache;
    memset(&cache, 0, sizeof cache);
    for (int i = 0; i <= reps && st == CLG_OK; i++) { /* i == 0: warm-up (builds, auto measurement) */
        double t0 = clg_now_sec();
        st = conv_run(dev, &cs, pass, (clg_conv_algo)algo, &cache, &cb);
        t[i] = (clg_now_sec() - t0) * 1e3;
        cache.weights_version++; /* training: transforms are rebuilt every step */
    }
    if (st == CLG_OK) {
        qsort(t + 1, (size_t)reps, sizeof(double), cmp_double);
        out->ms = t[1 + reps / 2];
        out->rel_err = check ? conv_error(dev, &cs, pass, &cb) : NAN;
        out->chosen = algo == CLG_CONV_AUTO ? conv_chosen(dev, &cs, pass, &cache, &cb) : algo;
    }
    clg_conv_cache_free(dev, &cache);
    conv_buffers_free(dev, &cb);
    free(t);
    return st;
}

// ---- clg_bench_prim_*: the public primitives against the internal launchers ----

/* A sample repeats a call until it spans this long. */
#define SAMPLE_MS 5.0

struct clg_bench_prim {
    clg_ctx *ctx;
    clg_device *dev;
    clg_prim *h;
    unsigned seed; /* operands: one stream over the handle's life */
    /* the case being measured */
    int conv, pass;
    int failed_pub; /* the path whose call failed */
    int m, n, k, ta, tb;
    cl_mem A, B, C;
    clg_conv_shape s;
    clg_prim_conv_desc d;
    clg_conv_cache cache;
    cl_mem x, w, y, dy, dx, dw, db;
};

clg_status clg_bench_prim_create(clg_ctx *ctx, const char *gemm_backend, clg_bench_prim **out)
{
    if (!ctx || !out || ctx->ndev < 1)
        return clg_err_set(ctx ? &ctx->err : NULL, CLG_ERR_INVALID_ARG,
                           "clg_bench_prim_create: a context with a device and out are required");
    *out = NULL;
    const char *backend = gemm_backend ? gemm_backend : "own";
    int gb = clg_gemm_backend_parse(backend);
    if (gb != CLG_GEMM_OWN && gb != CLG_GEMM_CLBLAST)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "clg_bench_prim_create: gemm backend '%s' (own or clblast)",
                           backend);
    clg_bench_prim *b = calloc(1, sizeof *b);
    if (!b)
        return clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "clg_bench_prim_create: out of host memory");
    b->ctx = ctx;
    b->dev = &ctx->devs[0];
    b->seed = 7;
    clg_prim_params pp;
    clg_prim_params_init(&pp);
    pp.gemm_backend = backend;
    clg_status st = clg_gemm_set_backend(ctx, (clg_gemm_backend)gb);
    if (st == CLG_OK && (st = clg_prim_create(b->dev->queue, &pp, &b->h)) != CLG_OK)
        clg_err_set(&ctx->err, st, "%s", clg_last_error(NULL));
    if (st != CLG_OK) {
        free(b);
        return st;
    }
    *out = b;
    return CLG_OK;
}

void clg_bench_prim_destroy(clg_bench_prim *b)
{
    if (!b)
        return;
    clg_prim_destroy(b->h);
    free(b);
}

/* One call of a path (0 internal, 1 public), not waited for. */
static clg_status prim_once(clg_bench_prim *b, int pub)
{
    if (!b->conv) {
        int lda = b->ta ? b->m : b->k, ldb = b->tb ? b->k : b->n;
        if (pub)
            return clg_prim_sgemm(b->h, b->ta ? CLG_PRIM_TRANS : CLG_PRIM_NO_TRANS,
                                  b->tb ? CLG_PRIM_TRANS : CLG_PRIM_NO_TRANS, (size_t)b->m, (size_t)b->n, (size_t)b->k,
                                  1.0f, b->A, 0, (size_t)lda, b->B, 0, (size_t)ldb, 0.0f, b->C, 0, (size_t)b->n, NULL,
                                  0, NULL, NULL);
        clg_gemm_args a;
        clg_gemm_args_init(&a);
        a.ta = b->ta, a.tb = b->tb, a.M = b->m, a.N = b->n, a.K = b->k;
        a.A = b->A, a.lda = lda, a.B = b->B, a.ldb = ldb, a.C = b->C, a.ldc = b->n;
        return clg_gemm(b->dev, &a, NULL);
    }
    if (pub) {
        if (b->pass == 0)
            return clg_prim_conv_forward(b->h, &b->d, b->x, 0, b->w, 0, NULL, 0, 0, b->y, 0, 0, NULL, NULL);
        if (b->pass == 1)
            return clg_prim_conv_backward_data(b->h, &b->d, b->dy, 0, b->w, 0, b->dx, 0, 0, NULL, NULL);
        return clg_prim_conv_backward_filter(b->h, &b->d, b->x, 0, b->dy, 0, 0.0f, b->dw, 0, b->db, 0, 0, NULL, NULL);
    }
    clg_status st;
    if (b->pass == 0)
        st = clg_conv_forward(b->dev, &b->s, CLG_CONV_AUTO, &b->cache, b->x, 0, b->w, 0, NULL, 0, 0, b->y, 0);
    else if (b->pass == 1)
        st = clg_conv_backward_data(b->dev, &b->s, CLG_CONV_AUTO, &b->cache, b->dy, 0, b->w, 0, b->dx, 0);
    else
        st = clg_conv_backward_filter(b->dev, &b->s, CLG_CONV_AUTO, b->x, 0, b->dy, 0, 0.0f, b->dw, 0, b->db, 0);
    b->cache.weights_version++; /* as `bench conv`: transforms rebuilt every call (the public path keeps none) */
    return st;
}

/* ms per call over `inner` calls, the queue finished. */
static double prim_sample(clg_bench_prim *b, int pub, int inner, clg_status *st)
{
    double t0 = clg_now_sec();
    for (int i = 0; i < inner && *st == CLG_OK; i++)
        if ((*st = prim_once(b, pub)) != CLG_OK)
            b->failed_pub = pub;
    if (*st == CLG_OK && clFinish(b->dev->queue) != CL_SUCCESS)
        *st = clg_err_set(clg_dev_err(b->dev), CLG_ERR_OPENCL, "bench prim: clFinish failed");
    return (clg_now_sec() - t0) * 1e3 / inner;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The medians of both paths and of the per-round ratio; the error of a
 * failed call is left where it was recorded (or named here). */
static clg_status prim_measure(clg_bench_prim *b, int rounds, clg_bench_prim_result *out)
{
    clg_status st = CLG_OK;
    b->failed_pub = 0;
    /* warm-up: kernel builds, automatic choices, pool sizes */
    prim_sample(b, 0, 1, &st);
    prim_sample(b, 1, 1, &st);
    double est = prim_sample(b, 0, 1, &st);
    int inner = est >= SAMPLE_MS ? 1 : (int)ceil(SAMPLE_MS / fmax(est, 0.01));
    if (inner > 2000)
        inner = 2000;
    double *t[2] = {malloc(sizeof(double) * (size_t)rounds), malloc(sizeof(double) * (size_t)rounds)};
    double *q = malloc(sizeof(double) * (size_t)rounds);
    if (st == CLG_OK && (!t[0] || !t[1] || !q))
        st = clg_err_set(&b->ctx->err, CLG_ERR_HOST_OOM, "out of host memory");
    for (int r = 0; r < rounds && st == CLG_OK; r++)
        for (int k = 0; k < 2; k++) {
            int pub = (r + k) % 2; /* flips the order every round */
            t[pub][r] = prim_sample(b, pub, inner, &st);
        }
    if (st == CLG_OK) {
        for (int r = 0; r < rounds; r++)
            q[r] = t[1][r] / t[0][r];
        out->internal_ms = median(t[0], rounds);
        out->public_ms = median(t[1], rounds);
        out->ratio = median(q, rounds);
    } else if (b->failed_pub) {
        /* a public call records its error on the handle */
        const char *pe = clg_prim_last_error(b->h);
        if (pe && *pe)
            clg_err_set(&b->ctx->err, st, "%s", pe);
    }
    free(t[0]), free(t[1]), free(q);
    return st;
}

static cl_mem alloc_rand(clg_bench_prim *b, size_t n)
{
    cl_mem m = NULL;
    if (clg_buf_alloc(b->dev, (n ? n : 1) * sizeof(float), &m) != CLG_OK)
        return NULL;
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (!h) {
        clg_buf_release(b->dev, m);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        b->seed = b->seed * 1664525u + 1013904223u;
        h[i] = (float)(b->seed >> 8) / 16777216.0f - 0.5f;
    }
    cl_int e = clEnqueueWriteBuffer(b->dev->queue, m, CL_TRUE, 0, n * sizeof(float), h, 0, NULL, NULL);
    free(h);
    if (e != CL_SUCCESS) {
        clg_buf_release(b->dev, m);
        return NULL;
    }
    return m;
}

static void release_all(clg_bench_prim *b, cl_mem *const *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        clg_buf_release(b->dev, *m[i]);
        *m[i] = NULL;
    }
}

clg_status clg_bench_prim_gemm(clg_bench_prim *b, int m, int n, int k, int ta, int tb, int rounds,
                               clg_bench_prim_result *out)
{
    if (!b || !out || m < 1 || n < 1 || k < 1 || rounds < 2)
        return clg_err_set(b ? &b->ctx->err : NULL, CLG_ERR_INVALID_ARG,
                           "clg_bench_prim_gemm: b and out are required, m, n, k >= 1, rounds >= 2");
    memset(out, 0, sizeof *out);
    b->conv = 0, b->m = m, b->n = n, b->k = k, b->ta = ta, b->tb = tb;
    b->A = alloc_rand(b, (size_t)m * k);
    b->B = alloc_rand(b, (size_t)k * n);
    b->C = alloc_rand(b, (size_t)m * n);
    clg_status st = b->A && b->B && b->C ? prim_measure(b, rounds, out)
                                         : clg_err_set(&b->ctx->err, CLG_ERR_DEVICE_OOM, "out of device memory");
    cl_mem *const bufs[] = {&b->A, &b->B, &b->C};
    release_all(b, bufs, CLG_ARRAY_LEN(bufs));
    return st;
}

clg_status clg_bench_prim_conv(clg_bench_prim *b, const clg_bench_conv_shape *s, int pass, int rounds,
                               clg_bench_prim_result *out)
{
    if (!b || !s || !out || pass < 0 || pass > 2 || rounds < 2)
        return clg_err_set(b ? &b->ctx->err : NULL, CLG_ERR_INVALID_ARG,
                           "clg_bench_prim_conv: b, s and out are required, pass 0..2, rounds >= 2");
    memset(out, 0, sizeof *out);
    b->s = conv_shape(s);
    CLG_TRY(clg_conv_check(&b->ctx->err, &b->s));
    b->conv = 1, b->pass = pass;
    clg_prim_conv_desc_init(&b->d);
    b->d.n = s->n, b->d.c = s->c, b->d.h = s->h, b->d.w = s->w, b->d.k = s->k, b->d.r = s->r, b->d.s = s->s;
    b->d.pad_h = s->pad_h, b->d.pad_w = s->pad_w, b->d.stride_h = s->stride_h, b->d.stride_w = s->stride_w;
    b->d.dil_h = s->dil_h, b->d.dil_w = s->dil_w, b->d.groups = s->groups;
    size_t nx = (size_t)s->n * s->c * s->h * s->w, nw = (size_t)s->k * (s->c / s->groups) * s->r * s->s;
    size_t ny = (size_t)s->n * s->k * clg_conv_out_h(&b->s) * clg_conv_out_w(&b->s);
    b->x = alloc_rand(b, nx), b->w = alloc_rand(b, nw), b->y = alloc_rand(b, ny);
    b->dy = alloc_rand(b, ny), b->dx = alloc_rand(b, nx), b->dw = alloc_rand(b, nw);
    b->db = alloc_rand(b, (size_t)s->k);
    memset(&b->cache, 0, sizeof b->cache);
    clg_status st = b->x && b->w && b->y && b->dy && b->dx && b->dw && b->db
                        ? prim_measure(b, rounds, out)
                        : clg_err_set(&b->ctx->err, CLG_ERR_DEVICE_OOM, "out of device memory");
    if (st == CLG_OK) {
        clg_prim_conv_algo a = CLG_PRIM_CONV_AUTO;
        clg_prim_conv_algo_get(b->h, &b->d, (clg_prim_conv_pass)pass, &a);
        out->algo = (int)a;
    }
    clg_conv_cache_free(b->dev, &b->cache);
    cl_mem *const bufs[] = {&b->x, &b->w, &b->y, &b->dy, &b->dx, &b->dw, &b->db};
    release_all(b, bufs, CLG_ARRAY_LEN(bufs));
    return st;
}
