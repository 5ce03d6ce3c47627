/* The primitives API (include/clgrad_prim.h): clgrad's launchers on the
 * caller's queue and buffers. A handle is a one-device clg_ctx wrapped
 * around the caller's queue (clg_ctx_wrap_queue), so the launchers, their
 * program and tuning caches and the buffer pool work unchanged. Each call:
 * check the arguments (sizes against CL_MEM_SIZE, context of every buffer),
 * then the internal launcher(s) in a clg_deps scope: the first launch takes
 * the wait list, the last one returns the event. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/conv_impl.h"
#include "ops/gemm.h"
#include "ops/nn.h"
#include "ops/seq.h"

#include "clgrad_prim.h"

struct clg_prim {
    clg_ctx *ctx; /* one device: the caller's queue, retained */
};

/* The public algorithm ids are the internal ones. */
_Static_assert((int)CLG_PRIM_CONV_IM2COL == (int)CLG_CONV_IM2COL, "conv algo ids");
_Static_assert((int)CLG_PRIM_CONV_WINOGRAD == (int)CLG_CONV_WINOGRAD, "conv algo ids");
_Static_assert((int)CLG_PRIM_CONV_WINOGRAD4 == (int)CLG_CONV_WINOGRAD4, "conv algo ids");
_Static_assert((int)CLG_PRIM_CONV_DIRECT == (int)CLG_CONV_DIRECT, "conv algo ids");
_Static_assert((int)CLG_PRIM_CONV_FFT == (int)CLG_CONV_FFT, "conv algo ids");
_Static_assert((int)CLG_PRIM_CONV_WINOGRAD_FUSED == (int)CLG_CONV_WINOGRAD_FUSED, "conv algo ids");
_Static_assert((int)CLG_PRIM_CONV_WINOGRAD4_FUSED == (int)CLG_CONV_WINOGRAD4_FUSED, "conv algo ids");
_Static_assert((int)CLG_PRIM_CONV_ALGO_COUNT == (int)CLG_CONV_ALGO_COUNT, "conv algo ids");
_Static_assert((int)CLG_PRIM_CONV_BACKWARD_FILTER == (int)CLG_CONV_BWD_FILTER, "conv pass ids");

static clg_device *hdev(clg_prim *h) { return &h->ctx->devs[0]; }
static clg_err *herr(clg_prim *h) { return &h->ctx->devs[0].err; }

// ---- handle ----

static void prim_defaults(clg_prim_params *p)
{
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    p->use_cache = 1;
}

void clg_prim_params_init_size(clg_prim_params *p, size_t size)
{
    clg_prim_params d;
    prim_defaults(&d);
    clg_sized_init(p, size, &d, sizeof d);
}

clg_status clg_prim_create(cl_command_queue queue, const clg_prim_params *params, clg_prim **out)
{
    if (!out)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_prim_create: out is NULL");
    *out = NULL;
    clg_prim_params p;
    prim_defaults(&p);
    if (params)
        CLG_TRY(clg_sized_read(NULL, "clg_prim_params", &p, sizeof p, params));
    int backend = CLG_GEMM_AUTO;
    if (p.gemm_backend && *p.gemm_backend) {
        backend = clg_gemm_backend_parse(p.gemm_backend);
        if (backend < 0 || backend == CLG_GEMM_REF)
            return clg_err_set(NULL, CLG_ERR_INVALID_ARG,
                               "clg_prim_create: gemm_backend '%s' is not auto, own or clblast", p.gemm_backend);
        if (backend == CLG_GEMM_CLBLAST && !clg_gemm_have_clblast())
            return clg_err_set(NULL, CLG_ERR_UNSUPPORTED,
                               "clg_prim_create: gemm_backend 'clblast' asked for, but clgrad was built without CLBlast");
    }
    if (p.verbose > clg_log_level)
        clg_log_level = p.verbose;
    clg_ctx_params cp;
    clg_ctx_params_init(&cp);
    cp.use_cache = p.use_cache;
    cp.cache_dir = p.cache_dir;
    cp.kernel_dir = p.kernel_dir;
    clg_prim *h = calloc(1, sizeof *h);
    if (!h)
        return clg_err_set(NULL, CLG_ERR_HOST_OOM, "clg_prim_create: no memory");
    clg_status st = clg_ctx_wrap_queue(queue, &cp, &h->ctx);
    if (st == CLG_OK && backend != CLG_GEMM_AUTO && (st = clg_gemm_set_backend(h->ctx, (clg_gemm_backend)backend)) != CLG_OK)
        clg_err_copy(clg_err_tls(), &h->ctx->err);
    if (st != CLG_OK) {
        clg_ctx_destroy(h->ctx);
        free(h);
        return st;
    }
    *out = h;
    return CLG_OK;
}

void clg_prim_destroy(clg_prim *h)
{
    if (!h)
        return;
    clg_ctx_destroy(h->ctx);
    free(h);
}

const char *clg_prim_last_error(const clg_prim *h)
{
    return h ? clg_last_error(h->ctx) : clg_last_error(NULL);
}

// ---- argument checks ----

/* buf must exist, belong to h's context and hold [off, off + n) floats. */
static clg_status check_buf(clg_prim *h, const char *op, const char *name, cl_mem buf, size_t off, size_t n)
{
    if (!buf)
        return clg_err_set(herr(h), CLG_ERR_INVALID_ARG, "%s: buffer '%s' is NULL", op, name);
    size_t bytes = 0;
    cl_context c = NULL;
    cl_int e = clGetMemObjectInfo(buf, CL_MEM_SIZE, sizeof bytes, &bytes, NULL);
    if (e == CL_SUCCESS)
        e = clGetMemObjectInfo(buf, CL_MEM_CONTEXT, sizeof c, &c, NULL);
    if (e != CL_SUCCESS)
        return clg_err_set(herr(h), CLG_ERR_INVALID_ARG, "%s: buffer '%s' is not a valid cl_mem (%s)", op, name,
                           clg_cl_errname(e));
    if (c != hdev(h)->cl)
        return clg_err_set(herr(h), CLG_ERR_INVALID_ARG,
                           "%s: buffer '%s' belongs to another cl_context than the handle's queue", op, name);
    size_t have = bytes / sizeof(float);
    if (off > have || n > have - off)
        return clg_err_set(herr(h), CLG_ERR_INVALID_ARG,
                           "%s: buffer '%s' holds %zu floats (%zu bytes); offset %zu + %zu elements needed", op, name,
                           have, bytes, off, n);
    return CLG_OK;
}

static clg_status check_events(clg_prim *h, const char *op, cl_uint num_wait, const cl_event *wait)
{
    if ((num_wait > 0) != (wait != NULL))
        return clg_err_set(herr(h), CLG_ERR_INVALID_ARG,
                           "%s: num_wait is %u but the wait list is %s (both or neither)", op, num_wait,
                           wait ? "not NULL" : "NULL");
    for (cl_uint i = 0; i < num_wait; i++)
        if (!wait[i])
            return clg_err_set(herr(h), CLG_ERR_INVALID_ARG, "%s: wait[%u] is NULL", op, i);
    return CLG_OK;
}

/* Start of an operation: h valid, event out cleared, wait list checked. */
static clg_status begin_check(clg_prim *h, const char *op, cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    if (event)
        *event = NULL;
    if (!h)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "%s: handle is NULL", op);
    return check_events(h, op, num_wait, wait);
}

/* After the checks: the op's launches run inside a clg_deps scope, so the
 * first waits for the list and the last one's event is returned (the queue
 * is in order); clg_deps_end also covers an op that launched nothing. */
static void begin_enqueue(clg_prim *h, clg_deps *d, cl_uint num_wait, const cl_event *wait)
{
    clg_deps_begin(hdev(h), d, num_wait, wait);
}

/* End of an operation: on success *event completes after everything the
 * op enqueued. */
static clg_status finish(clg_prim *h, clg_deps *d, clg_status st, cl_event *event)
{
    return clg_deps_end(hdev(h), d, st, event);
}

static clg_status as_int(clg_prim *h, const char *op, const char *name, size_t v, int *out)
{
    if (v > (size_t)INT_MAX)
        return clg_err_set(herr(h), CLG_ERR_UNSUPPORTED, "%s: %s = %zu exceeds the 2^31 limit", op, name, v);
    *out = (int)v;
    return CLG_OK;
}

// ---- GEMM ----

void clg_prim_gemm_epilogue_init_size(clg_prim_gemm_epilogue *e, size_t size)
{
    clg_prim_gemm_epilogue d;
    memset(&d, 0, sizeof d);
    d.size = sizeof d;
    clg_sized_init(e, size, &d, sizeof d);
}

/* Floats spanned by a rows x cols row-major matrix of pitch ld. */
static size_t extent(size_t rows, size_t cols, size_t ld) { return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols; }

clg_status clg_prim_sgemm(clg_prim *h, clg_prim_transpose ta, clg_prim_transpose tb, size_t m, size_t n, size_t k,
                          float alpha, cl_mem a, size_t a_offset, size_t lda, cl_mem b, size_t b_offset, size_t ldb,
                          float beta, cl_mem c, size_t c_offset, size_t ldc, const clg_prim_gemm_epilogue *epi,
                          cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    const char *op = "clg_prim_sgemm";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    clg_err *err = herr(h);
    clg_prim_gemm_epilogue e;
    clg_prim_gemm_epilogue_init_size(&e, sizeof e);
    if (epi)
        CLG_TRY(clg_sized_read(err, "clg_prim_gemm_epilogue", &e, sizeof e, epi));
    if ((ta != CLG_PRIM_NO_TRANS && ta != CLG_PRIM_TRANS) || (tb != CLG_PRIM_NO_TRANS && tb != CLG_PRIM_TRANS))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%s: transpose flags must be CLG_PRIM_NO_TRANS or CLG_PRIM_TRANS (got %d, %d)",
                           op, (int)ta, (int)tb);
    if (e.bias_mode < CLG_PRIM_BIAS_NONE || e.bias_mode > CLG_PRIM_BIAS_COL)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%s: unknown bias_mode %d", op, (int)e.bias_mode);
    if ((e.bias_mode != CLG_PRIM_BIAS_NONE) != (e.bias != NULL))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%s: %s", op,
                           e.bias ? "a bias buffer is given but bias_mode is CLG_PRIM_BIAS_NONE"
                                  : "bias_mode is set but the bias buffer is NULL");
    if (e.relu != 0 && e.relu != 1)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%s: relu must be 0 or 1 (got %d)", op, e.relu);
    size_t ra = ta ? k : m, ca = ta ? m : k; /* stored A: ra x ca */
    size_t rb = tb ? n : k, cb = tb ? k : n;
    if (lda < (ca ? ca : 1))
        return clg_err_set(err, CLG_ERR_SHAPE, "%s: lda = %zu is less than the %zu columns of the stored A (%s)", op,
                           lda, ca, ta ? "k x m, transposed" : "m x k");
    if (ldb < (cb ? cb : 1))
        return clg_err_set(err, CLG_ERR_SHAPE, "%s: ldb = %zu is less than the %zu columns of the stored B (%s)", op,
                           ldb, cb, tb ? "n x k, transposed" : "k x n");
    if (ldc < (n ? n : 1))
        return clg_err_set(err, CLG_ERR_SHAPE, "%s: ldc = %zu is less than n = %zu", op, ldc, n);
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    CLG_TRY(as_int(h, op, "m", m, &g.M));
    CLG_TRY(as_int(h, op, "n", n, &g.N));
    CLG_TRY(as_int(h, op, "k", k, &g.K));
    CLG_TRY(as_int(h, op, "lda", lda, &g.lda));
    CLG_TRY(as_int(h, op, "ldb", ldb, &g.ldb));
    CLG_TRY(as_int(h, op, "ldc", ldc, &g.ldc));
    CLG_TRY(check_buf(h, op, "a", a, a_offset, extent(ra, ca, lda)));
    CLG_TRY(check_buf(h, op, "b", b, b_offset, extent(rb, cb, ldb)));
    CLG_TRY(check_buf(h, op, "c", c, c_offset, extent(m, n, ldc)));
    if (e.bias)
        CLG_TRY(check_buf(h, op, "bias", e.bias, e.bias_offset, e.bias_mode == CLG_PRIM_BIAS_ROW ? m : n));
    g.ta = ta == CLG_PRIM_TRANS;
    g.tb = tb == CLG_PRIM_TRANS;
    g.alpha = alpha;
    g.beta = beta;
    g.A = a;
    g.offA = a_offset;
    g.B = b;
    g.offB = b_offset;
    g.C = c;
    g.offC = c_offset;
    g.bias = e.bias;
    g.offBias = e.bias_offset;
    g.bias_mode = (clg_bias_mode)e.bias_mode;
    g.relu = e.relu;
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    clg_status st = m == 0 || n == 0 ? CLG_OK : clg_gemm(hdev(h), &g, NULL);
    return finish(h, &deps, st, event);
}

// ---- convolution ----

void clg_prim_conv_desc_init_size(clg_prim_conv_desc *d, size_t size)
{
    clg_prim_conv_desc x;
    memset(&x, 0, sizeof x);
    x.size = sizeof x;
    x.stride_h = x.stride_w = 1;
    x.dil_h = x.dil_w = 1;
    x.groups = 1;
    x.algo = CLG_PRIM_CONV_AUTO;
    clg_sized_init(d, size, &x, sizeof x);
}

/* The caller's descriptor read (within its size) into an internal shape. */
static clg_status conv_shape(clg_err *err, const clg_prim_conv_desc *d, clg_conv_shape *s, clg_conv_algo *algo)
{
    if (!d)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "convolution: descriptor is NULL");
    clg_prim_conv_desc x;
    clg_prim_conv_desc_init_size(&x, sizeof x);
    CLG_TRY(clg_sized_read(err, "clg_prim_conv_desc", &x, sizeof x, d));
    if ((unsigned)x.algo >= CLG_PRIM_CONV_ALGO_COUNT)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "convolution: unknown algorithm id %d", (int)x.algo);
    *s = (clg_conv_shape){x.n, x.c, x.h, x.w, x.k, x.r, x.s, x.pad_h, x.pad_w, x.stride_h, x.stride_w, x.dil_h, x.dil_w,
                          x.groups};
    if (algo)
        *algo = (clg_conv_algo)x.algo;
    return clg_conv_check(err, s);
}

clg_status clg_prim_conv_output_size(clg_prim *h, const clg_prim_conv_desc *d, int *p, int *q)
{
    clg_conv_shape s;
    CLG_TRY(conv_shape(h ? herr(h) : NULL, d, &s, NULL));
    if (p)
        *p = clg_conv_out_h(&s);
    if (q)
        *q = clg_conv_out_w(&s);
    return CLG_OK;
}

int clg_prim_conv_algo_supported(const clg_prim_conv_desc *d, clg_prim_conv_algo algo, clg_prim_conv_pass pass)
{
    clg_err scratch;
    clg_conv_shape s;
    if ((unsigned)algo >= CLG_PRIM_CONV_ALGO_COUNT || (unsigned)pass > CLG_PRIM_CONV_BACKWARD_FILTER ||
        conv_shape(&scratch, d, &s, NULL) != CLG_OK)
        return 0;
    if (algo == CLG_PRIM_CONV_AUTO)
        return 1;
    return clg_conv_algo_supported((clg_conv_algo)algo, &s, (clg_conv_pass)pass);
}

const char *clg_prim_conv_algo_name(clg_prim_conv_algo algo)
{
    return (unsigned)algo < CLG_PRIM_CONV_ALGO_COUNT ? clg_conv_algo_name((clg_conv_algo)algo) : NULL;
}

static size_t numel_x(const clg_conv_shape *s) { return (size_t)s->N * s->C * s->H * s->W; }
static size_t numel_w(const clg_conv_shape *s) { return (size_t)s->K * (s->C / s->groups) * s->R * s->S; }
static size_t numel_y(const clg_conv_shape *s) { return (size_t)s->N * s->K * clg_conv_out_h(s) * clg_conv_out_w(s); }

clg_status clg_prim_conv_algo_get(clg_prim *h, const clg_prim_conv_desc *d, clg_prim_conv_pass pass,
                                  clg_prim_conv_algo *out)
{
    const char *op = "clg_prim_conv_algo_get";
    if (!h || !out)
        return clg_err_set(h ? herr(h) : NULL, CLG_ERR_INVALID_ARG, "%s: NULL argument", op);
    if ((unsigned)pass > CLG_PRIM_CONV_BACKWARD_FILTER)
        return clg_err_set(herr(h), CLG_ERR_INVALID_ARG, "%s: unknown pass %d", op, (int)pass);
    clg_conv_shape s;
    clg_conv_algo a;
    CLG_TRY(conv_shape(herr(h), d, &s, &a));
    if (a != CLG_CONV_AUTO) {
        if (!clg_conv_algo_supported(a, &s, (clg_conv_pass)pass))
            return clg_err_set(herr(h), CLG_ERR_UNSUPPORTED, "%s: algorithm '%s' cannot run this pass of the shape", op,
                               clg_conv_algo_name(a));
        *out = (clg_prim_conv_algo)a;
        return CLG_OK;
    }
    /* measurement inputs: scratch tensors (zeros) of the pass's shapes */
    clg_device *dev = hdev(h);
    cl_mem in1 = NULL, in2 = NULL;
    size_t n1 = pass == CLG_PRIM_CONV_BACKWARD_DATA ? numel_y(&s) : numel_x(&s);
    size_t n2 = pass == CLG_PRIM_CONV_BACKWARD_FILTER ? numel_y(&s) : numel_w(&s);
    clg_status st = clg_buf_alloc(dev, n1 * sizeof(float), &in1);
    if (st == CLG_OK)
        st = clg_buf_fill(dev, in1, 0, n1, 0.0f);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, n2 * sizeof(float), &in2);
    if (st == CLG_OK)
        st = clg_buf_fill(dev, in2, 0, n2, 0.0f);
    if (st == CLG_OK) {
        clg_conv_io io;
        memset(&io, 0, sizeof io);
        if (pass == CLG_PRIM_CONV_FORWARD) {
            io.x = in1;
            io.w = in2;
        } else if (pass == CLG_PRIM_CONV_BACKWARD_DATA) {
            io.dy = in1;
            io.w = in2;
        } else {
            io.x = in1;
            io.dy = in2;
        }
        clg_conv_algo pick = CLG_CONV_AUTO;
        st = clg_conv_auto_pick(dev, &s, (clg_conv_pass)pass, &io, &pick);
        if (st == CLG_OK)
            *out = (clg_prim_conv_algo)pick;
    }
    clg_buf_release(dev, in1);
    clg_buf_release(dev, in2);
    return st;
}

/* clFFT enqueues its transforms itself, not through clg_enqueue: the FFT
 * algorithm waits with a barrier and returns a marker. */
static clg_status conv_foreign(clg_prim *h, clg_conv_algo algo)
{
    return algo == CLG_CONV_FFT ? clg_deps_foreign(hdev(h)) : CLG_OK;
}

/* CLG_PRIM_CONV_AUTO resolved before anything of the call is enqueued: the
 * first use of a shape class times the candidates (reading the inputs as they
 * are, writing scratch outputs, finishing the queue), which must not sit
 * behind the call's wait list (a user event the caller sets after the call
 * returns would never let it finish). Later calls find the choice in the table. */
static clg_status resolve_auto(clg_prim *h, const clg_conv_shape *s, clg_conv_pass pass, cl_mem in1, size_t off1,
                               cl_mem in2, size_t off2, clg_conv_algo *algo)
{
    if (*algo != CLG_CONV_AUTO)
        return CLG_OK;
    clg_conv_io io;
    memset(&io, 0, sizeof io);
    if (pass == CLG_CONV_FWD)
        io.x = in1, io.offx = off1, io.w = in2, io.offw = off2;
    else if (pass == CLG_CONV_BWD_DATA)
        io.dy = in1, io.offdy = off1, io.w = in2, io.offw = off2;
    else
        io.x = in1, io.offx = off1, io.dy = in2, io.offdy = off2;
    return clg_conv_auto_pick(hdev(h), s, pass, &io, algo);
}

clg_status clg_prim_conv_forward(clg_prim *h, const clg_prim_conv_desc *d, cl_mem x, size_t x_offset, cl_mem w,
                                 size_t w_offset, cl_mem bias, size_t bias_offset, int relu, cl_mem y, size_t y_offset,
                                 cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    const char *op = "clg_prim_conv_forward";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    clg_conv_shape s;
    clg_conv_algo algo;
    CLG_TRY(conv_shape(herr(h), d, &s, &algo));
    if (relu != 0 && relu != 1)
        return clg_err_set(herr(h), CLG_ERR_INVALID_ARG, "%s: relu must be 0 or 1 (got %d)", op, relu);
    CLG_TRY(check_buf(h, op, "x", x, x_offset, numel_x(&s)));
    CLG_TRY(check_buf(h, op, "w", w, w_offset, numel_w(&s)));
    CLG_TRY(check_buf(h, op, "y", y, y_offset, numel_y(&s)));
    if (bias)
        CLG_TRY(check_buf(h, op, "bias", bias, bias_offset, (size_t)s.K));
    if (algo != CLG_CONV_AUTO && !clg_conv_algo_supported(algo, &s, CLG_CONV_FWD))
        return clg_err_set(herr(h), CLG_ERR_UNSUPPORTED, "%s: algorithm '%s' cannot run this shape", op,
                           clg_conv_algo_name(algo));
    CLG_TRY(resolve_auto(h, &s, CLG_CONV_FWD, x, x_offset, w, w_offset, &algo));
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    clg_status st = conv_foreign(h, algo);
    if (st == CLG_OK)
        st = clg_conv_forward(hdev(h), &s, algo, NULL, x, x_offset, w, w_offset, bias, bias_offset, relu, y, y_offset);
    return finish(h, &deps, st, event);
}

clg_status clg_prim_conv_backward_data(clg_prim *h, const clg_prim_conv_desc *d, cl_mem dy, size_t dy_offset,
                                       cl_mem w, size_t w_offset, cl_mem dx, size_t dx_offset, cl_uint num_wait,
                                       const cl_event *wait, cl_event *event)
{
    const char *op = "clg_prim_conv_backward_data";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    clg_conv_shape s;
    clg_conv_algo algo;
    CLG_TRY(conv_shape(herr(h), d, &s, &algo));
    CLG_TRY(check_buf(h, op, "dy", dy, dy_offset, numel_y(&s)));
    CLG_TRY(check_buf(h, op, "w", w, w_offset, numel_w(&s)));
    CLG_TRY(check_buf(h, op, "dx", dx, dx_offset, numel_x(&s)));
    if (algo != CLG_CONV_AUTO && !clg_conv_algo_supported(algo, &s, CLG_CONV_BWD_DATA))
        return clg_err_set(herr(h), CLG_ERR_UNSUPPORTED, "%s: algorithm '%s' cannot run this shape", op,
                           clg_conv_algo_name(algo));
    CLG_TRY(resolve_auto(h, &s, CLG_CONV_BWD_DATA, dy, dy_offset, w, w_offset, &algo));
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    clg_status st = conv_foreign(h, algo);
    if (st == CLG_OK)
        st = clg_conv_backward_data(hdev(h), &s, algo, NULL, dy, dy_offset, w, w_offset, dx, dx_offset);
    return finish(h, &deps, st, event);
}

clg_status clg_prim_conv_backward_filter(clg_prim *h, const clg_prim_conv_desc *d, cl_mem x, size_t x_offset,
                                         cl_mem dy, size_t dy_offset, float beta, cl_mem dw, size_t dw_offset,
                                         cl_mem db, size_t db_offset, cl_uint num_wait, const cl_event *wait,
                                         cl_event *event)
{
    const char *op = "clg_prim_conv_backward_filter";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    clg_conv_shape s;
    clg_conv_algo algo;
    CLG_TRY(conv_shape(herr(h), d, &s, &algo));
    if (beta != 0.0f && beta != 1.0f)
        return clg_err_set(herr(h), CLG_ERR_INVALID_ARG, "%s: beta must be 0 or 1 (got %g)", op, (double)beta);
    CLG_TRY(check_buf(h, op, "x", x, x_offset, numel_x(&s)));
    CLG_TRY(check_buf(h, op, "dy", dy, dy_offset, numel_y(&s)));
    CLG_TRY(check_buf(h, op, "dw", dw, dw_offset, numel_w(&s)));
    if (db)
        CLG_TRY(check_buf(h, op, "db", db, db_offset, (size_t)s.K));
    if (algo != CLG_CONV_AUTO && !clg_conv_algo_supported(algo, &s, CLG_CONV_BWD_FILTER))
        return clg_err_set(herr(h), CLG_ERR_UNSUPPORTED, "%s: algorithm '%s' has no backward-filter pass for this shape",
                           op, clg_conv_algo_name(algo));
    CLG_TRY(resolve_auto(h, &s, CLG_CONV_BWD_FILTER, x, x_offset, dy, dy_offset, &algo));
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    clg_status st = conv_foreign(h, algo);
    if (st == CLG_OK)
        st = clg_conv_backward_filter(hdev(h), &s, algo, x, x_offset, dy, dy_offset, beta, dw, dw_offset, db,
                                      db_offset);
    return finish(h, &deps, st, event);
}

// ---- pooling ----

void clg_prim_pool_desc_init_size(clg_prim_pool_desc *d, size_t size)
{
    clg_prim_pool_desc x;
    memset(&x, 0, sizeof x);
    x.size = sizeof x;
    x.mode = CLG_PRIM_POOL_MAX;
    x.win_h = x.win_w = 2;
    x.stride_h = x.stride_w = 2;
    clg_sized_init(d, size, &x, sizeof x);
}

static clg_status pool_shape(clg_err *err, const clg_prim_pool_desc *d, clg_pool_shape *s, int *is_max)
{
    if (!d)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "pooling: descriptor is NULL");
    clg_prim_pool_desc x;
    clg_prim_pool_desc_init_size(&x, sizeof x);
    CLG_TRY(clg_sized_read(err, "clg_prim_pool_desc", &x, sizeof x, d));
    if (x.mode != CLG_PRIM_POOL_MAX && x.mode != CLG_PRIM_POOL_AVG)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "pooling: mode must be CLG_PRIM_POOL_MAX or _AVG (got %d)",
                           (int)x.mode);
    if (x.n <= 0 || x.c <= 0 || x.h <= 0 || x.w <= 0)
        return clg_err_set(err, CLG_ERR_SHAPE, "pooling: input n=%d c=%d h=%d w=%d must be positive", x.n, x.c, x.h, x.w);
    if (x.win_h <= 0 || x.win_w <= 0 || x.stride_h <= 0 || x.stride_w <= 0 || x.pad_h < 0 || x.pad_w < 0)
        return clg_err_set(err, CLG_ERR_SHAPE, "pooling: window %dx%d and stride %dx%d must be positive, padding %dx%d >= 0",
                           x.win_h, x.win_w, x.stride_h, x.stride_w, x.pad_h, x.pad_w);
    *s = (clg_pool_shape){x.n, x.c, x.h, x.w, x.win_h, x.win_w, x.stride_h, x.stride_w, x.pad_h, x.pad_w};
    if (clg_pool_out_h(s) <= 0 || clg_pool_out_w(s) <= 0 || 2 * x.pad_h > x.win_h || 2 * x.pad_w > x.win_w)
        return clg_err_set(err, CLG_ERR_SHAPE,
                           "pooling: window %dx%d stride %dx%d pad %dx%d does not fit input %dx%d (padding must be at "
                           "most half the window)",
                           x.win_h, x.win_w, x.stride_h, x.stride_w, x.pad_h, x.pad_w, x.h, x.w);
    if ((double)x.n * x.c * x.h * x.w >= 4294967295.0)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "pooling: input beyond 2^32 elements");
    *is_max = x.mode == CLG_PRIM_POOL_MAX;
    return CLG_OK;
}

clg_status clg_prim_pool_output_size(clg_prim *h, const clg_prim_pool_desc *d, int *p, int *q)
{
    clg_pool_shape s;
    int is_max;
    CLG_TRY(pool_shape(h ? herr(h) : NULL, d, &s, &is_max));
    if (p)
        *p = clg_pool_out_h(&s);
    if (q)
        *q = clg_pool_out_w(&s);
    return CLG_OK;
}

static size_t pool_in(const clg_pool_shape *s) { return (size_t)s->N * s->C * s->H * s->W; }
static size_t pool_out(const clg_pool_shape *s) { return (size_t)s->N * s->C * clg_pool_out_h(s) * clg_pool_out_w(s); }

clg_status clg_prim_pool_forward(clg_prim *h, const clg_prim_pool_desc *d, cl_mem x, size_t x_offset, cl_mem y,
                                 size_t y_offset, cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    const char *op = "clg_prim_pool_forward";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    clg_pool_shape s;
    int is_max;
    CLG_TRY(pool_shape(herr(h), d, &s, &is_max));
    CLG_TRY(check_buf(h, op, "x", x, x_offset, pool_in(&s)));
    CLG_TRY(check_buf(h, op, "y", y, y_offset, pool_out(&s)));
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    return finish(h, &deps, clg_nn_pool_forward(hdev(h), is_max, &s, x, x_offset, y, y_offset), event);
}

clg_status clg_prim_pool_backward(clg_prim *h, const clg_prim_pool_desc *d, cl_mem x, size_t x_offset, cl_mem dy,
                                  size_t dy_offset, cl_mem dx, size_t dx_offset, cl_uint num_wait, const cl_event *wait,
                                  cl_event *event)
{
    const char *op = "clg_prim_pool_backward";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    clg_pool_shape s;
    int is_max;
    CLG_TRY(pool_shape(herr(h), d, &s, &is_max));
    if (is_max || x)
        CLG_TRY(check_buf(h, op, "x", x, x_offset, pool_in(&s)));
    CLG_TRY(check_buf(h, op, "dy", dy, dy_offset, pool_out(&s)));
    CLG_TRY(check_buf(h, op, "dx", dx, dx_offset, pool_in(&s)));
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    /* average pooling never reads x; the launcher wants a buffer */
    cl_mem xin = x ? x : dx;
    clg_status st = clg_nn_pool_backward(hdev(h), is_max, &s, xin, x ? x_offset : 0, dy, dy_offset, dx, dx_offset, 0);
    return finish(h, &deps, st, event);
}

// ---- softmax ----

static clg_status softmax_shape(clg_prim *h, const char *op, size_t rows, size_t cols, int *r, int *c)
{
    if (cols == 0)
        return clg_err_set(herr(h), CLG_ERR_SHAPE, "%s: cols must be positive", op);
    if (rows > (size_t)INT_MAX || cols > (size_t)INT_MAX || (double)rows * (double)cols >= 4294967295.0)
        return clg_err_set(herr(h), CLG_ERR_UNSUPPORTED, "%s: %zu x %zu exceeds 2^32 elements", op, rows, cols);
    *r = (int)rows;
    *c = (int)cols;
    return CLG_OK;
}

clg_status clg_prim_softmax_forward(clg_prim *h, size_t rows, size_t cols, cl_mem x, size_t x_offset, cl_mem y,
                                    size_t y_offset, cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    const char *op = "clg_prim_softmax_forward";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    int r = 0, c = 0;
    CLG_TRY(softmax_shape(h, op, rows, cols, &r, &c));
    CLG_TRY(check_buf(h, op, "x", x, x_offset, rows * cols));
    CLG_TRY(check_buf(h, op, "y", y, y_offset, rows * cols));
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    return finish(h, &deps, rows ? clg_nn_softmax_forward(hdev(h), r, c, x, x_offset, y, y_offset) : CLG_OK, event);
}

clg_status clg_prim_softmax_backward(clg_prim *h, size_t rows, size_t cols, cl_mem y, size_t y_offset, cl_mem dy,
                                     size_t dy_offset, cl_mem dx, size_t dx_offset, cl_uint num_wait,
                                     const cl_event *wait, cl_event *event)
{
    const char *op = "clg_prim_softmax_backward";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    int r = 0, c = 0;
    CLG_TRY(softmax_shape(h, op, rows, cols, &r, &c));
    CLG_TRY(check_buf(h, op, "y", y, y_offset, rows * cols));
    CLG_TRY(check_buf(h, op, "dy", dy, dy_offset, rows * cols));
    CLG_TRY(check_buf(h, op, "dx", dx, dx_offset, rows * cols));
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    clg_status st = rows ? clg_nn_softmax_backward(hdev(h), r, c, y, y_offset, dy, dy_offset, dx, dx_offset) : CLG_OK;
    return finish(h, &deps, st, event);
}

// ---- layer normalization ----

static clg_status ln_shape(clg_prim *h, const char *op, size_t rows, size_t cols)
{
    if (cols == 0)
        return clg_err_set(herr(h), CLG_ERR_SHAPE, "%s: cols must be positive", op);
    if (cols > (size_t)INT_MAX || (double)rows * (double)cols >= 4294967295.0)
        return clg_err_set(herr(h), CLG_ERR_UNSUPPORTED, "%s: %zu x %zu exceeds 2^32 elements", op, rows, cols);
    return CLG_OK;
}

clg_status clg_prim_layernorm_forward(clg_prim *h, size_t rows, size_t cols, float eps, cl_mem x, size_t x_offset,
                                      cl_mem gamma, cl_mem beta, cl_mem y, size_t y_offset, cl_mem mean, cl_mem rstd,
                                      cl_uint num_wait, const cl_event *wait, cl_event *event)
{
    const char *op = "clg_prim_layernorm_forward";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    CLG_TRY(ln_shape(h, op, rows, cols));
    if (!(eps > 0.0f) || isinf(eps))
        return clg_err_set(herr(h), CLG_ERR_INVALID_ARG, "%s: eps %g is not a positive number", op, (double)eps);
    if ((gamma == NULL) != (beta == NULL))
        return clg_err_set(herr(h), CLG_ERR_INVALID_ARG, "%s: gamma and beta go together (both or neither)", op);
    CLG_TRY(check_buf(h, op, "x", x, x_offset, rows * cols));
    CLG_TRY(check_buf(h, op, "y", y, y_offset, rows * cols));
    CLG_TRY(check_buf(h, op, "mean", mean, 0, rows));
    CLG_TRY(check_buf(h, op, "rstd", rstd, 0, rows));
    if (gamma) {
        CLG_TRY(check_buf(h, op, "gamma", gamma, 0, cols));
        CLG_TRY(check_buf(h, op, "beta", beta, 0, cols));
    }
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    clg_status st = clg_seq_layernorm_forward(hdev(h), rows, (int)cols, eps, x, x_offset, gamma, beta, y, y_offset,
                                              mean, rstd);
    return finish(h, &deps, st, event);
}

clg_status clg_prim_layernorm_backward(clg_prim *h, size_t rows, size_t cols, cl_mem x, size_t x_offset, cl_mem dy,
                                       size_t dy_offset, cl_mem gamma, cl_mem mean, cl_mem rstd, cl_mem dx,
                                       size_t dx_offset, cl_mem dgamma, cl_mem dbeta, cl_uint num_wait,
                                       const cl_event *wait, cl_event *event)
{
    const char *op = "clg_prim_layernorm_backward";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    CLG_TRY(ln_shape(h, op, rows, cols));
    if ((dgamma == NULL) != (dbeta == NULL))
        return clg_err_set(herr(h), CLG_ERR_INVALID_ARG, "%s: dgamma and dbeta go together (both or neither)", op);
    CLG_TRY(check_buf(h, op, "x", x, x_offset, rows * cols));
    CLG_TRY(check_buf(h, op, "dy", dy, dy_offset, rows * cols));
    CLG_TRY(check_buf(h, op, "mean", mean, 0, rows));
    CLG_TRY(check_buf(h, op, "rstd", rstd, 0, rows));
    if (gamma)
        CLG_TRY(check_buf(h, op, "gamma", gamma, 0, cols));
    if (dx)
        CLG_TRY(check_buf(h, op, "dx", dx, dx_offset, rows * cols));
    if (dgamma) {
        CLG_TRY(check_buf(h, op, "dgamma", dgamma, 0, cols));
        CLG_TRY(check_buf(h, op, "dbeta", dbeta, 0, cols));
    }
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    clg_status st = clg_seq_layernorm_backward(hdev(h), rows, (int)cols, x, x_offset, dy, dy_offset, gamma, mean,
                                               rstd, dgamma, dbeta, dx, dx_offset);
    return finish(h, &deps, st, event);
}

// ---- attention ----

_Static_assert((int)CLG_PRIM_ATTENTION_FUSED == (int)CLG_ATTN_FUSED, "attention algo ids");
_Static_assert((int)CLG_PRIM_ATTENTION_GEMM == (int)CLG_ATTN_GEMM, "attention algo ids");

void clg_prim_attention_desc_init_size(clg_prim_attention_desc *d, size_t size)
{
    clg_prim_attention_desc x;
    memset(&x, 0, sizeof x);
    x.size = sizeof x;
    x.causal = 1;
    clg_sized_init(d, size, &x, sizeof x);
}

/* The internal descriptor, algorithm and the four row pitches of d. */
typedef struct attn_args {
    clg_attn_desc a;
    clg_attn_algo algo;
    int ld[4]; /* q, k, v, o */
} attn_args;

static clg_status attn_args_get(clg_err *err, const char *op, const clg_prim_attention_desc *d, attn_args *out)
{
    if (!d)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%s: descriptor is NULL", op);
    clg_prim_attention_desc x;
    clg_prim_attention_desc_init_size(&x, sizeof x);
    CLG_TRY(clg_sized_read(err, "clg_prim_attention_desc", &x, sizeof x, d));
    if (x.n <= 0 || x.t <= 0 || x.heads <= 0 || x.head_dim <= 0 || x.head_dim > CLG_ATTN_MAX_D)
        return clg_err_set(err, CLG_ERR_SHAPE, "%s: bad shape n=%d t=%d heads=%d head_dim=%d (head_dim 1..%d)", op,
                           x.n, x.t, x.heads, x.head_dim, CLG_ATTN_MAX_D);
    if ((long long)x.heads * x.head_dim > INT_MAX / 4)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "%s: heads x head_dim too large", op);
    if (x.algo < CLG_PRIM_ATTENTION_AUTO || x.algo > CLG_PRIM_ATTENTION_GEMM)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%s: unknown algo %d", op, (int)x.algo);
    if (!(x.scale >= 0.0f) || isinf(x.scale))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%s: scale must be finite and >= 0 (0: 1/sqrt(head_dim))", op);
    int C = x.heads * x.head_dim;
    size_t lds[4] = {x.ld_q, x.ld_k, x.ld_v, x.ld_o};
    static const char *const ldn[4] = {"ld_q", "ld_k", "ld_v", "ld_o"};
    for (int i = 0; i < 4; i++) {
        size_t ld = lds[i] ? lds[i] : (size_t)C;
        if (ld < (size_t)C || ld > (size_t)INT_MAX)
            return clg_err_set(err, CLG_ERR_SHAPE, "%s: %s = %zu is below heads x head_dim = %d or too large", op,
                               ldn[i], lds[i], C);
        out->ld[i] = (int)ld;
    }
    out->a = (clg_attn_desc){x.n, x.t, x.heads, x.head_dim, x.causal ? 1 : 0,
                             x.scale > 0.0f ? x.scale : (float)(1.0 / sqrt((double)x.head_dim)), 0, 0, 0, 0.0f, 0, 0, 0, 0};
    out->algo = x.algo == CLG_PRIM_ATTENTION_GEMM ? CLG_ATTN_GEMM : CLG_ATTN_FUSED;
    return CLG_OK;
}

size_t clg_prim_attention_saved_size(const clg_prim_attention_desc *d)
{
    attn_args x;
    clg_err e;
    memset(&e, 0, sizeof e);
    if (attn_args_get(&e, "clg_prim_attention_saved_size", d, &x) != CLG_OK)
        return 0;
    return clg_attn_saved_floats(&x.a, x.algo);
}

/* Checks a sequence operand (n, t, ld) and makes its internal descriptor. */
static clg_status attn_seq(clg_prim *h, const char *op, const char *name, const attn_args *x, int which, cl_mem m,
                           size_t off, clg_attn_seq *out)
{
    size_t need = ((size_t)x->a.N * x->a.T - 1) * (size_t)x->ld[which] + (size_t)x->a.heads * x->a.d;
    CLG_TRY(check_buf(h, op, name, m, off, need));
    *out = (clg_attn_seq){m, off, x->ld[which]};
    return CLG_OK;
}

clg_status clg_prim_attention_forward(clg_prim *h, const clg_prim_attention_desc *d, cl_mem q, size_t q_offset,
                                      cl_mem k, size_t k_offset, cl_mem v, size_t v_offset, cl_mem o,
                                      size_t o_offset, cl_mem saved, size_t saved_offset, cl_uint num_wait,
                                      const cl_event *wait, cl_event *event)
{
    const char *op = "clg_prim_attention_forward";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    attn_args x;
    CLG_TRY(attn_args_get(herr(h), op, d, &x));
    clg_attn_seq sq, sk, sv, so;
    CLG_TRY(attn_seq(h, op, "q", &x, 0, q, q_offset, &sq));
    CLG_TRY(attn_seq(h, op, "k", &x, 1, k, k_offset, &sk));
    CLG_TRY(attn_seq(h, op, "v", &x, 2, v, v_offset, &sv));
    CLG_TRY(attn_seq(h, op, "o", &x, 3, o, o_offset, &so));
    CLG_TRY(check_buf(h, op, "saved", saved, saved_offset, clg_attn_saved_floats(&x.a, x.algo)));
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    return finish(h, &deps, clg_attn_forward(hdev(h), &x.a, x.algo, &sq, &sk, &sv, &so, saved, saved_offset), event);
}

clg_status clg_prim_attention_backward(clg_prim *h, const clg_prim_attention_desc *d, cl_mem q, size_t q_offset,
                                       cl_mem k, size_t k_offset, cl_mem v, size_t v_offset, cl_mem o,
                                       size_t o_offset, cl_mem saved, size_t saved_offset, cl_mem dout,
                                       size_t dout_offset, cl_mem dq, size_t dq_offset, cl_mem dk, size_t dk_offset,
                                       cl_mem dv, size_t dv_offset, cl_uint num_wait, const cl_event *wait,
                                       cl_event *event)
{
    const char *op = "clg_prim_attention_backward";
    CLG_TRY(begin_check(h, op, num_wait, wait, event));
    attn_args x;
    CLG_TRY(attn_args_get(herr(h), op, d, &x));
    clg_attn_seq sq, sk, sv, so = {NULL, 0, x.ld[3]}, sg, sdq, sdk, sdv;
    CLG_TRY(attn_seq(h, op, "q", &x, 0, q, q_offset, &sq));
    CLG_TRY(attn_seq(h, op, "k", &x, 1, k, k_offset, &sk));
    CLG_TRY(attn_seq(h, op, "v", &x, 2, v, v_offset, &sv));
    if (x.algo == CLG_ATTN_FUSED || o)
        CLG_TRY(attn_seq(h, op, "o", &x, 3, o, o_offset, &so));
    CLG_TRY(check_buf(h, op, "saved", saved, saved_offset, clg_attn_saved_floats(&x.a, x.algo)));
    CLG_TRY(attn_seq(h, op, "dout", &x, 3, dout, dout_offset, &sg));
    CLG_TRY(attn_seq(h, op, "dq", &x, 0, dq, dq_offset, &sdq));
    CLG_TRY(attn_seq(h, op, "dk", &x, 1, dk, dk_offset, &sdk));
    CLG_TRY(attn_seq(h, op, "dv", &x, 2, dv, dv_offset, &sdv));
    clg_deps deps;
    begin_enqueue(h, &deps, num_wait, wait);
    clg_status st = clg_attn_backward(hdev(h), &x.a, x.algo, &sq, &sk, &sv, &so, saved, saved_offset, &sg, &sdq,
                                      &sdk, &sdv);
    return finish(h, &deps, st, event);
}
