/* Convolution: shape helpers, im2col + GEMM and direct paths, dispatch. */
#include <stdlib.h>
#include <string.h>

#include "clg_config.h"
#include "conv_impl.h"

static const char *const algo_names[CLG_CONV_ALGO_COUNT] = {"auto", "im2col", "winograd", "winograd4", "direct", "fft",
                                                            "winograd-fused", "winograd4-fused"};

const char *clg_conv_algo_name(clg_conv_algo algo)
{
    return (unsigned)algo < CLG_CONV_ALGO_COUNT ? algo_names[algo] : "unknown";
}

clg_status clg_conv_algo_parse(clg_err *err, const char *name, clg_conv_algo *out)
{
    for (int i = 0; name && i < CLG_CONV_ALGO_COUNT; i++)
        if (strcmp(name, algo_names[i]) == 0) {
            *out = (clg_conv_algo)i;
            return CLG_OK;
        }
    return clg_err_set(err, CLG_ERR_INVALID_ARG,
                       "unknown convolution algorithm '%s' (auto, im2col, winograd, winograd4, direct, fft, "
                       "winograd-fused, winograd4-fused)",
                       name ? name : "(null)");
}

static int out_dim(int in, int pad, int k, int dil, int stride)
{
    if (in <= 0 || pad < 0 || k <= 0 || dil <= 0 || stride <= 0)
        return 0;
    long span = (long)in + 2L * pad - (long)dil * (k - 1) - 1;
    if (span < 0)
        return 0;
    return (int)(span / stride + 1);
}

int clg_conv_out_h(const clg_conv_shape *s) { return out_dim(s->H, s->pad_h, s->R, s->dil_h, s->stride_h); }
int clg_conv_out_w(const clg_conv_shape *s) { return out_dim(s->W, s->pad_w, s->S, s->dil_w, s->stride_w); }

clg_status clg_conv_check(clg_err *err, const clg_conv_shape *s)
{
    if (!s)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "conv: NULL shape");
#define CLG_CONV_POS(f)                                                                                  \
    if (s->f <= 0)                                                                                       \
        return clg_err_set(err, CLG_ERR_SHAPE, "conv: " #f " must be positive (got %d)", s->f);
    CLG_CONV_POS(N) CLG_CONV_POS(C) CLG_CONV_POS(H) CLG_CONV_POS(W) CLG_CONV_POS(K) CLG_CONV_POS(R)
    CLG_CONV_POS(S) CLG_CONV_POS(stride_h) CLG_CONV_POS(stride_w) CLG_CONV_POS(dil_h) CLG_CONV_POS(dil_w)
    CLG_CONV_POS(groups)
#undef CLG_CONV_POS
    if (s->pad_h < 0 || s->pad_w < 0)
        return clg_err_set(err, CLG_ERR_SHAPE, "conv: padding must be >= 0 (pad_h=%d pad_w=%d)", s->pad_h, s->pad_w);
    if (s->C % s->groups != 0)
        return clg_err_set(err, CLG_ERR_SHAPE, "conv: C=%d is not divisible by groups=%d", s->C, s->groups);
    if (s->K % s->groups != 0)
        return clg_err_set(err, CLG_ERR_SHAPE, "conv: K=%d is not divisible by groups=%d", s->K, s->groups);
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s);
    if (P <= 0)
        return clg_err_set(err, CLG_ERR_SHAPE, "conv: H=%d with pad_h=%d is smaller than the dilated window (R=%d, dil_h=%d)",
                           s->H, s->pad_h, s->R, s->dil_h);
    if (Q <= 0)
        return clg_err_set(err, CLG_ERR_SHAPE, "conv: W=%d with pad_w=%d is smaller than the dilated window (S=%d, dil_w=%d)",
                           s->W, s->pad_w, s->S, s->dil_w);
    double nx = (double)s->N * s->C * s->H * s->W, ny = (double)s->N * s->K * P * Q;
    double nw = (double)s->K * (s->C / s->groups) * s->R * s->S;
    if (nx >= INT_MAX || ny >= INT_MAX || nw >= INT_MAX)
        return clg_err_set(err, CLG_ERR_SHAPE, "conv: tensor too large for 32-bit indexing (x %.0f, y %.0f, w %.0f elements)",
                           nx, ny, nw);
    return CLG_OK;
}

int clg_conv_algo_supported(clg_conv_algo algo, const clg_conv_shape *s, clg_conv_pass pass)
{
    if (clg_conv_check(clg_err_tls(), s) != CLG_OK)
        return 0;
    int wino = s->R == 3 && s->S == 3 && s->stride_h == 1 && s->stride_w == 1 && s->dil_h == 1 && s->dil_w == 1 &&
               s->groups == 1;
    switch (algo) {
    case CLG_CONV_AUTO:
    case CLG_CONV_IM2COL:
    case CLG_CONV_DIRECT:
        return 1;
    case CLG_CONV_WINOGRAD:
        return wino && (pass != CLG_CONV_BWD_DATA || (s->pad_h <= 2 && s->pad_w <= 2));
    case CLG_CONV_WINOGRAD4:
        return wino && (pass != CLG_CONV_BWD_DATA || (s->pad_h <= 2 && s->pad_w <= 2));
    case CLG_CONV_WINOGRAD_FUSED: /* backward-filter: F(3x3, 2x2), conv_wgrad.c */
        if (pass == CLG_CONV_BWD_FILTER)
            return clg_conv_wgrad_ok(s);
        return wino && s->pad_h <= 2 && s->pad_w <= 2;
    case CLG_CONV_WINOGRAD4_FUSED: /* backward-filter: F(3x3, 4x4), conv_wgrad.c */
        if (pass == CLG_CONV_BWD_FILTER)
            return clg_conv_wgrad_ok(s);
        return wino && s->pad_h <= 2 && s->pad_w <= 2;
    case CLG_CONV_FFT:
        return pass == CLG_CONV_FWD && clg_conv_fft_available() && s->stride_h == 1 && s->stride_w == 1 &&
               s->dil_h == 1 && s->dil_w == 1 && s->groups == 1 && s->R >= 2 && s->S >= 2;
    default:
        return 0;
    }
}

static size_t mem_bytes(cl_mem m)
{
    size_t bytes = 0;
    if (clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof bytes, &bytes, NULL) != CL_SUCCESS)
        return 0;
    return bytes;
}

clg_status clg_conv_cached_filters(clg_device *dev, clg_conv_cache *cache, clg_conv_algo algo, int flip,
                                   size_t bytes, clg_conv_filter_fn build, void *ctx, cl_mem *U, int *tmp)
{
    *tmp = 0;
    *U = NULL;
    if (!cache) {
        CLG_TRY(clg_buf_alloc(dev, bytes, U));
        clg_status st = build(dev, ctx, *U);
        if (st != CLG_OK) {
            clg_buf_release(dev, *U);
            *U = NULL;
            return st;
        }
        *tmp = 1;
        return CLG_OK;
    }
    cl_mem *slot = flip ? &cache->transformed_bwd[algo] : &cache->transformed[algo];
    uint64_t *ver = flip ? &cache->built_version_bwd[algo] : &cache->built_version[algo];
    if (*slot && mem_bytes(*slot) < bytes) { /* another layout than the cached one */
        clg_buf_release(dev, *slot);
        *slot = NULL;
    }
    if (*slot && *ver == cache->weights_version) {
        *U = *slot;
        return CLG_OK;
    }
    if (!*slot)
        CLG_TRY(clg_buf_alloc(dev, bytes, slot));
    clg_status st = build(dev, ctx, *slot);
    if (st != CLG_OK) {
        clg_buf_release(dev, *slot);
        *slot = NULL;
        return st;
    }
    *ver = cache->weights_version;
    *U = *slot;
    return CLG_OK;
}

void clg_conv_cache_free(clg_device *dev, clg_conv_cache *c)
{
    if (!c)
        return;
    for (int i = 0; i < CLG_CONV_ALGO_COUNT; i++) {
        clg_buf_release(dev, c->transformed[i]);
        clg_buf_release(dev, c->transformed_bwd[i]);
    }
    memset(c, 0, sizeof *c);
}

size_t clg_conv_ws_floats(clg_device *dev)
{
    size_t lim = (size_t)64 << 20; /* 256 MiB */
    if (dev && dev->info.max_alloc_bytes > 0 && dev->info.max_alloc_bytes / 4 < lim)
        lim = (size_t)(dev->info.max_alloc_bytes / 4);
    return lim;
}

clg_status clg_conv_enqueue(clg_device *dev, cl_kernel k, cl_uint dims, const size_t *gws, const size_t *lws)
{
    return clg_launch(dev, k, dims, gws, lws, CLG_LAUNCH_FIXED, NULL);
}

void clg_conv_geom(clg_device *dev, cl_kernel k, int n0, int n1, int n2, size_t gws[3], size_t lws[3])
{
    /* up to 256 along the contiguous dim 0, groups of up to 512, within the kernel's limits */
    clg_wg_limits L;
    clg_kernel_limits(dev, k, &L);
    size_t n[3] = {(size_t)CLG_MAX(n0, 0), (size_t)CLG_MAX(n1, 0), (size_t)CLG_MAX(n2, 0)};
    clg_wg_geom(&L, 3, n, 256, 512, gws, lws);
}

void clg_conv_ka_epilogue(clg_kargs *a, cl_mem bias, size_t offb, cl_mem dummy, int relu, cl_mem y, size_t offy)
{
    clg_ka_mem(a, bias ? bias : dummy);
    clg_ka_int(a, (int)offb);
    clg_ka_int(a, bias != NULL);
    clg_ka_int(a, relu);
    clg_ka_mem(a, y);
    clg_ka_int(a, (int)offy);
}

void clg_conv_prof(clg_device *dev, const char *label)
{
    static _Thread_local double last;
    if (!dev->ctx->opts.conv_profile)
        return;
    clFinish(dev->queue);
    double now = clg_now_sec();
    if (label)
        fprintf(stderr, "[conv] %-28s %9.3f ms\n", label, (now - last) * 1e3);
    last = now;
}

/* ---- im2col + GEMM ---- */

static int is_plain_1x1(const clg_conv_shape *s)
{
    return s->R == 1 && s->S == 1 && s->stride_h == 1 && s->stride_w == 1 && s->pad_h == 0 && s->pad_w == 0;
}

/* Images per chunk so that per_image * nb floats fit the workspace limit. */
static int chunk_images(clg_device *dev, int N, size_t per_image)
{
    size_t lim = clg_conv_ws_floats(dev);
    size_t nb = per_image ? lim / per_image : (size_t)N;
    if (nb < 1)
        nb = 1;
    return nb > (size_t)N ? N : (int)nb;
}

/* CLGRAD_CONV_LEGACY=1 selects the original row-per-work-item im2col and
 * the generic col2im (for A/B timing of the element-wise kernels). */
static int legacy_kernels(const clg_device *dev) { return dev->ctx->opts.conv_legacy != 0; }

static clg_status launch_im2col(clg_device *dev, const clg_conv_shape *s, int nb, cl_mem x, size_t offx, int c0,
                                cl_mem col, int bstride, int ld)
{
    cl_kernel k;
    int Cg = s->C / s->groups, P = clg_conv_out_h(s), Q = clg_conv_out_w(s);
    /* the element kernel's float-reciprocal division is exact below 2^23 */
    int legacy = legacy_kernels(dev) || (long)nb * Cg * s->R * s->S >= (1L << 23);
    CLG_TRY(clg_kernel_get(dev, "im2col", "", legacy ? "im2col" : "im2col_w", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, x);
    clg_ka_int(&a, (int)offx);
    clg_ka_int(&a, s->C);
    clg_ka_int(&a, s->H);
    clg_ka_int(&a, s->W);
    clg_ka_int(&a, c0);
    clg_ka_int(&a, Cg);
    clg_ka_int(&a, s->R);
    clg_ka_int(&a, s->S);
    clg_ka_int(&a, P);
    clg_ka_int(&a, Q);
    clg_ka_int(&a, s->pad_h);
    clg_ka_int(&a, s->pad_w);
    clg_ka_int(&a, s->stride_h);
    clg_ka_int(&a, s->stride_w);
    clg_ka_int(&a, s->dil_h);
    clg_ka_int(&a, s->dil_w);
    clg_ka_mem(&a, col);
    clg_ka_int(&a, 0);
    clg_ka_int(&a, bstride);
    clg_ka_int(&a, ld);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "im2col args"));
    if (legacy) {
        size_t gws[3] = {(size_t)P, (size_t)Cg * s->R * s->S, (size_t)nb};
        return clg_conv_enqueue(dev, k, 3, gws, NULL);
    }
    clg_ka_int(&a, nb);
    clg_ka_int(&a, bstride < ld);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "im2col_w args"));
    size_t gws[3], lws[3];
    clg_conv_geom(dev, k, Q, P, nb * Cg * s->R * s->S, gws, lws);
    return clg_conv_enqueue(dev, k, 3, gws, lws);
}

static clg_status im2col_fwd(clg_device *dev, const clg_conv_shape *s, cl_mem x, size_t offx, cl_mem w, size_t offw,
                             cl_mem bias, size_t offb, int relu, cl_mem y, size_t offy)
{
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s), PQ = P * Q, HW = s->H * s->W;
    int Cg = s->C / s->groups, Kg = s->K / s->groups, CRS = Cg * s->R * s->S;
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.M = Kg;
    g.N = PQ;
    g.K = CRS;
    g.lda = CRS;
    g.ldb = PQ;
    g.ldc = PQ;
    g.strideA = 0;
    g.strideC = (size_t)s->K * PQ;
    g.bias = bias;
    g.bias_mode = bias ? CLG_BIAS_ROW : CLG_BIAS_NONE;
    g.relu = relu;
    if (is_plain_1x1(s)) {
        g.batch = s->N;
        g.strideB = (size_t)s->C * HW;
        for (int gr = 0; gr < s->groups; gr++) {
            g.A = w;
            g.offA = offw + (size_t)gr * Kg * CRS;
            g.B = x;
            g.offB = offx + (size_t)gr * Cg * HW;
            g.C = y;
            g.offC = offy + (size_t)gr * Kg * PQ;
            g.offBias = offb + (size_t)gr * Kg;
            CLG_TRY(clg_gemm(dev, &g, NULL));
        }
        return CLG_OK;
    }
    int nb = chunk_images(dev, s->N, (size_t)CRS * PQ);
    cl_mem col = NULL;
    CLG_TRY(clg_buf_alloc(dev, sizeof(float) * (size_t)nb * CRS * PQ, &col));
    clg_status st = CLG_OK;
    for (int n0 = 0; n0 < s->N && st == CLG_OK; n0 += nb) {
        int nbc = CLG_MIN(nb, s->N - n0);
        for (int gr = 0; gr < s->groups && st == CLG_OK; gr++) {
            clg_conv_prof(dev, NULL);
            st = launch_im2col(dev, s, nbc, x, offx + (size_t)n0 * s->C * HW, gr * Cg, col, CRS * PQ, PQ);
            if (st != CLG_OK)
                break;
            clg_conv_prof(dev, "im2col");
            g.batch = nbc;
            g.A = w;
            g.offA = offw + (size_t)gr * Kg * CRS;
            g.B = col;
            g.offB = 0;
            g.strideB = (size_t)CRS * PQ;
            g.C = y;
            g.offC = offy + ((size_t)n0 * s->K + (size_t)gr * Kg) * PQ;
            g.offBias = offb + (size_t)gr * Kg;
            st = clg_gemm(dev, &g, NULL);
            clg_conv_prof(dev, "im2col fwd gemm");
        }
    }
    clg_buf_release(dev, col);
    return st;
}

static clg_status im2col_bwd_data(clg_device *dev, const clg_conv_shape *s, cl_mem dy, size_t offdy, cl_mem w,
                                  size_t offw, cl_mem dx, size_t offdx)
{
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s), PQ = P * Q, HW = s->H * s->W;
    int Cg = s->C / s->groups, Kg = s->K / s->groups, CRS = Cg * s->R * s->S;
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.ta = 1; /* W_g stored Kg x CRS */
    g.M = CRS;
    g.N = PQ;
    g.K = Kg;
    g.lda = CRS;
    g.ldb = PQ;
    g.strideA = 0;
    g.strideB = (size_t)s->K * PQ;
    if (is_plain_1x1(s)) {
        g.batch = s->N;
        g.ldc = HW;
        g.strideC = (size_t)s->C * HW;
        for (int gr = 0; gr < s->groups; gr++) {
            g.A = w;
            g.offA = offw + (size_t)gr * Kg * CRS;
            g.B = dy;
            g.offB = offdy + (size_t)gr * Kg * PQ;
            g.C = dx;
            g.offC = offdx + (size_t)gr * Cg * HW;
            CLG_TRY(clg_gemm(dev, &g, NULL));
        }
        return CLG_OK;
    }
    int nb = chunk_images(dev, s->N, (size_t)CRS * PQ);
    /* windows up to 11x11 with dilation 1 and strides up to 4 use the
     * unrolled, row-vectorised gather (the stride fixed at compile time) */
    int s1 = !legacy_kernels(dev) && s->stride_h <= 4 && s->stride_w <= 4 && s->dil_h == 1 && s->dil_w == 1 &&
             s->R <= 11 && s->S <= 11 && (long)nb * Cg < (1L << 23);
    cl_kernel k;
    if (s1) {
        char opts[96];
        if (s->stride_h == 1 && s->stride_w == 1)
            snprintf(opts, sizeof opts, "-D CR=%d -D CS=%d", s->R, s->S);
        else
            snprintf(opts, sizeof opts, "-D CR=%d -D CS=%d -D CU=%d -D CV=%d", s->R, s->S, s->stride_h, s->stride_w);
        CLG_TRY(clg_kernel_get(dev, "im2col", opts, "col2im_s1", &k));
    } else {
        CLG_TRY(clg_kernel_get(dev, "im2col", "", "col2im", &k));
    }
    cl_mem col = NULL;
    CLG_TRY(clg_buf_alloc(dev, sizeof(float) * (size_t)nb * CRS * PQ, &col));
    clg_status st = CLG_OK;
    for (int n0 = 0; n0 < s->N && st == CLG_OK; n0 += nb) {
        int nbc = CLG_MIN(nb, s->N - n0);
        for (int gr = 0; gr < s->groups && st == CLG_OK; gr++) {
            g.batch = nbc;
            g.A = w;
            g.offA = offw + (size_t)gr * Kg * CRS;
            g.B = dy;
            g.offB = offdy + ((size_t)n0 * s->K + (size_t)gr * Kg) * PQ;
            g.C = col;
            g.offC = 0;
            g.ldc = PQ;
            g.strideC = (size_t)CRS * PQ;
            clg_conv_prof(dev, NULL);
            if ((st = clg_gemm(dev, &g, NULL)) != CLG_OK)
                break;
            clg_conv_prof(dev, "bd gemm");
            clg_kargs a = {k, 0, CL_SUCCESS};
            clg_ka_mem(&a, col);
            clg_ka_int(&a, 0);
            clg_ka_int(&a, CRS * PQ);
            clg_ka_int(&a, PQ);
            if (s1) {
                clg_ka_int(&a, s->C);
                clg_ka_int(&a, s->H);
                clg_ka_int(&a, s->W);
                clg_ka_int(&a, gr * Cg);
                clg_ka_int(&a, Cg);
                clg_ka_int(&a, P);
                clg_ka_int(&a, Q);
                clg_ka_int(&a, s->pad_h);
                clg_ka_int(&a, s->pad_w);
                clg_ka_mem(&a, dx);
                clg_ka_int(&a, (int)(offdx + (size_t)n0 * s->C * HW));
                if ((st = CLG_KA_DONE(clg_dev_err(dev), &a, "col2im_s1 args")) != CLG_OK)
                    break;
                size_t gws[3], lws[3];
                clg_conv_geom(dev, k, s->W, s->H, nbc * Cg, gws, lws);
                st = clg_conv_enqueue(dev, k, 3, gws, lws);
                clg_conv_prof(dev, "bd col2im");
                continue;
            }
            clg_ka_int(&a, s->C);
            clg_ka_int(&a, s->H);
            clg_ka_int(&a, s->W);
            clg_ka_int(&a, gr * Cg);
            clg_ka_int(&a, Cg);
            clg_ka_int(&a, s->R);
            clg_ka_int(&a, s->S);
            clg_ka_int(&a, P);
            clg_ka_int(&a, Q);
            clg_ka_int(&a, s->pad_h);
            clg_ka_int(&a, s->pad_w);
            clg_ka_int(&a, s->stride_h);
            clg_ka_int(&a, s->stride_w);
            clg_ka_int(&a, s->dil_h);
            clg_ka_int(&a, s->dil_w);
            clg_ka_mem(&a, dx);
            clg_ka_int(&a, (int)(offdx + (size_t)n0 * s->C * HW));
            if ((st = CLG_KA_DONE(clg_dev_err(dev), &a, "col2im args")) != CLG_OK)
                break;
            size_t gws[3] = {(size_t)HW, (size_t)Cg, (size_t)nbc};
            st = clg_conv_enqueue(dev, k, 3, gws, NULL);
            clg_conv_prof(dev, "bd col2im");
        }
    }
    clg_buf_release(dev, col);
    return st;
}

/* Few taps per filter (first layers): im2col, then weight and bias partial
 * sums read straight from dy (conv_bwdf.c); db may be NULL. */
static clg_status im2col_bwd_filter_small(clg_device *dev, const clg_conv_shape *s, cl_mem x, size_t offx, cl_mem dy,
                                          size_t offdy, float beta, cl_mem dw, size_t offdw, cl_mem db, size_t offdb)
{
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s), PQ = P * Q, HW = s->H * s->W;
    int J = s->C * s->R * s->S;
    int nb = chunk_images(dev, s->N, (size_t)J * PQ);
    int nper = clg_conv_bwdf_nper(s->N, s->K);
    int maxch = CLG_CEIL_DIV(s->N, nper) + CLG_CEIL_DIV(s->N, nb); /* chunks never span two im2col chunks */
    cl_mem col = NULL, part = NULL;
    clg_status st = clg_buf_alloc(dev, sizeof(float) * (size_t)nb * J * PQ, &col);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * (size_t)maxch * s->K * (J + 1), &part);
    int pch = 0;
    for (int n0 = 0; n0 < s->N && st == CLG_OK; n0 += nb) {
        int nbc = CLG_MIN(nb, s->N - n0);
        clg_conv_prof(dev, NULL);
        st = launch_im2col(dev, s, nbc, x, offx + (size_t)n0 * s->C * HW, 0, col, PQ, nbc * PQ);
        clg_conv_prof(dev, "bf im2col");
        if (st == CLG_OK)
            st = clg_conv_bwdf_small_chunk(dev, J, dy, offdy + (size_t)n0 * s->K * PQ, col, nbc * PQ, nbc, s->K, PQ,
                                           nper, pch, part);
        clg_conv_prof(dev, "bf small");
        pch += CLG_CEIL_DIV(nbc, nper);
    }
    if (st == CLG_OK)
        st = clg_conv_part_reduce_wb(dev, part, pch, s->K, J, beta, dw, offdw, db, offdb);
    clg_conv_prof(dev, "bf reduce");
    clg_buf_release(dev, col);
    clg_buf_release(dev, part);
    return st;
}

static clg_status im2col_bwd_filter(clg_device *dev, const clg_conv_shape *s, cl_mem x, size_t offx, cl_mem dy,
                                    size_t offdy, float beta, cl_mem dw, size_t offdw)
{
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s), PQ = P * Q, HW = s->H * s->W;
    int Cg = s->C / s->groups, Kg = s->K / s->groups, CRS = Cg * s->R * s->S;
    cl_kernel kp;
    CLG_TRY(clg_kernel_get(dev, "im2col", "", "pack_chw", &kp));
    int nb = chunk_images(dev, s->N, (size_t)CLG_MAX(CRS, Kg) * PQ);
    cl_mem col = NULL, dyp = NULL;
    clg_status st = clg_buf_alloc(dev, sizeof(float) * (size_t)nb * CRS * PQ, &col);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * (size_t)nb * Kg * PQ, &dyp);
    clg_gemm_args g;
    clg_gemm_args_init(&g);
    g.tb = 1; /* col stored CRS x (nb*PQ) */
    g.M = Kg;
    g.N = CRS;
    g.ldc = CRS;
    for (int n0 = 0; n0 < s->N && st == CLG_OK; n0 += nb) {
        int nbc = CLG_MIN(nb, s->N - n0), ld = nbc * PQ;
        for (int gr = 0; gr < s->groups && st == CLG_OK; gr++) {
            clg_conv_prof(dev, NULL);
            st = launch_im2col(dev, s, nbc, x, offx + (size_t)n0 * s->C * HW, gr * Cg, col, PQ, ld);
            if (st != CLG_OK)
                break;
            clg_conv_prof(dev, "bf im2col");
            clg_kargs a = {kp, 0, CL_SUCCESS};
            clg_ka_mem(&a, dy);
            clg_ka_int(&a, (int)(offdy + (size_t)n0 * s->K * PQ));
            clg_ka_int(&a, s->K);
            clg_ka_int(&a, gr * Kg);
            clg_ka_int(&a, Kg);
            clg_ka_int(&a, PQ);
            clg_ka_mem(&a, dyp);
            clg_ka_int(&a, 0);
            clg_ka_int(&a, ld);
            if ((st = CLG_KA_DONE(clg_dev_err(dev), &a, "pack_chw args")) != CLG_OK)
                break;
            size_t gws[3] = {(size_t)PQ, (size_t)Kg, (size_t)nbc};
            if ((st = clg_conv_enqueue(dev, kp, 3, gws, NULL)) != CLG_OK)
                break;
            g.K = ld;
            g.A = dyp;
            g.offA = 0;
            g.lda = ld;
            g.B = col;
            g.offB = 0;
            g.ldb = ld;
            g.C = dw;
            g.offC = offdw + (size_t)gr * Kg * CRS;
            clg_conv_prof(dev, "bf pack dy");
            g.beta = n0 == 0 ? beta : 1.0f;
            st = clg_gemm(dev, &g, NULL);
            clg_conv_prof(dev, "bf gemm");
        }
    }
    clg_buf_release(dev, col);
    clg_buf_release(dev, dyp);
    return st;
}

/* ---- direct kernels ---- */

static void ka_geometry(clg_kargs *a, const clg_conv_shape *s)
{
    clg_ka_int(a, s->C);
    clg_ka_int(a, s->H);
    clg_ka_int(a, s->W);
    clg_ka_int(a, s->K);
    clg_ka_int(a, s->R);
    clg_ka_int(a, s->S);
    clg_ka_int(a, clg_conv_out_h(s));
    clg_ka_int(a, clg_conv_out_w(s));
    clg_ka_int(a, s->pad_h);
    clg_ka_int(a, s->pad_w);
    clg_ka_int(a, s->stride_h);
    clg_ka_int(a, s->stride_w);
    clg_ka_int(a, s->dil_h);
    clg_ka_int(a, s->dil_w);
    clg_ka_int(a, s->groups);
}

static clg_status direct_fwd(clg_device *dev, const clg_conv_shape *s, cl_mem x, size_t offx, cl_mem w, size_t offw,
                             cl_mem bias, size_t offb, int relu, cl_mem y, size_t offy)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "conv", "", "direct_fwd", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, x);
    clg_ka_int(&a, (int)offx);
    ka_geometry(&a, s);
    clg_ka_mem(&a, w);
    clg_ka_int(&a, (int)offw);
    clg_conv_ka_epilogue(&a, bias, offb, w, relu, y, offy);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "direct_fwd args"));
    size_t gws[3] = {(size_t)clg_conv_out_h(s) * clg_conv_out_w(s), (size_t)s->K, (size_t)s->N};
    return clg_conv_enqueue(dev, k, 3, gws, NULL);
}

static clg_status direct_bwd_data(clg_device *dev, const clg_conv_shape *s, cl_mem dy, size_t offdy, cl_mem w,
                                  size_t offw, cl_mem dx, size_t offdx)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "conv", "", "direct_bwd_data", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, dy);
    clg_ka_int(&a, (int)offdy);
    ka_geometry(&a, s);
    clg_ka_mem(&a, w);
    clg_ka_int(&a, (int)offw);
    clg_ka_mem(&a, dx);
    clg_ka_int(&a, (int)offdx);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "direct_bwd_data args"));
    size_t gws[3] = {(size_t)s->H * s->W, (size_t)s->C, (size_t)s->N};
    return clg_conv_enqueue(dev, k, 3, gws, NULL);
}

#define CONV_WG 64 /* default of cl/conv.cl */

static clg_status direct_bwd_filter(clg_device *dev, const clg_conv_shape *s, cl_mem x, size_t offx, cl_mem dy,
                                    size_t offdy, float beta, cl_mem dw, size_t offdw)
{
    /* one reduction group per filter element: 64, or the device's largest power of two below */
    size_t wg;
    cl_kernel k;
    CLG_TRY(clg_kernel_get_wg(dev, "conv", "direct_bwd_filter", "CONV_WG", CONV_WG, &k, &wg));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, x);
    clg_ka_int(&a, (int)offx);
    clg_ka_mem(&a, dy);
    clg_ka_int(&a, (int)offdy);
    clg_ka_int(&a, s->N);
    ka_geometry(&a, s);
    clg_ka_float(&a, beta);
    clg_ka_mem(&a, dw);
    clg_ka_int(&a, (int)offdw);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "direct_bwd_filter args"));
    size_t nw = (size_t)s->K * (s->C / s->groups) * s->R * s->S;
    size_t gws[1] = {nw * wg}, lws[1] = {wg};
    return clg_conv_enqueue(dev, k, 1, gws, lws);
}

/* ---- dispatch ---- */

clg_status clg_conv_run(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo, clg_conv_pass pass,
                        clg_conv_cache *cache, const clg_conv_io *io)
{
    switch (pass) {
    case CLG_CONV_FWD:
        switch (algo) {
        case CLG_CONV_IM2COL:
            return im2col_fwd(dev, s, io->x, io->offx, io->w, io->offw, io->bias, io->offb, io->relu, io->y, io->offy);
        case CLG_CONV_DIRECT:
            if (clg_conv_djit_ok(dev, s, pass))
                return clg_conv_djit_fwd(dev, s, cache, io->x, io->offx, io->w, io->offw, io->bias, io->offb, io->relu, io->y,
                                         io->offy);
            return direct_fwd(dev, s, io->x, io->offx, io->w, io->offw, io->bias, io->offb, io->relu, io->y, io->offy);
        case CLG_CONV_WINOGRAD:
        case CLG_CONV_WINOGRAD4:
            return clg_conv_wino_fwd(dev, s, algo == CLG_CONV_WINOGRAD ? 2 : 4, cache, io->x, io->offx, io->w,
                                     io->offw, io->bias, io->offb, io->relu, io->y, io->offy);
        case CLG_CONV_WINOGRAD_FUSED:
        case CLG_CONV_WINOGRAD4_FUSED:
            return clg_conv_wfused_fwd(dev, s, algo == CLG_CONV_WINOGRAD_FUSED ? 2 : 4, cache, io->x, io->offx, io->w,
                                       io->offw, io->bias, io->offb, io->relu, io->y, io->offy);
        case CLG_CONV_FFT:
            return clg_conv_fft_fwd(dev, s, cache, io->x, io->offx, io->w, io->offw, io->bias, io->offb, io->relu, io->y,
                                    io->offy);
        default:
            break;
        }
        break;
    case CLG_CONV_BWD_DATA:
        switch (algo) {
        case CLG_CONV_IM2COL:
            return im2col_bwd_data(dev, s, io->dy, io->offdy, io->w, io->offw, io->dx, io->offdx);
        case CLG_CONV_DIRECT:
            if (clg_conv_djit_ok(dev, s, pass))
                return clg_conv_djit_bwd_data(dev, s, cache, io->dy, io->offdy, io->w, io->offw, io->dx, io->offdx);
            return direct_bwd_data(dev, s, io->dy, io->offdy, io->w, io->offw, io->dx, io->offdx);
        case CLG_CONV_WINOGRAD:
        case CLG_CONV_WINOGRAD4:
            return clg_conv_wino_bwd_data(dev, s, algo == CLG_CONV_WINOGRAD ? 2 : 4, cache, io->dy, io->offdy, io->w,
                                          io->offw, io->dx, io->offdx);
        case CLG_CONV_WINOGRAD_FUSED:
        case CLG_CONV_WINOGRAD4_FUSED:
            return clg_conv_wfused_bwd_data(dev, s, algo == CLG_CONV_WINOGRAD_FUSED ? 2 : 4, cache, io->dy, io->offdy,
                                            io->w, io->offw, io->dx, io->offdx);
        default:
            break;
        }
        break;
    case CLG_CONV_BWD_FILTER: {
        clg_status st;
        switch (algo) {
        case CLG_CONV_IM2COL:
            if (clg_conv_bwdf_small_ok(s)) /* bias gradient included */
                return im2col_bwd_filter_small(dev, s, io->x, io->offx, io->dy, io->offdy, io->beta, io->dw,
                                               io->offdw, io->db, io->offdb);
            st = im2col_bwd_filter(dev, s, io->x, io->offx, io->dy, io->offdy, io->beta, io->dw, io->offdw);
            break;
        case CLG_CONV_DIRECT:
            if (clg_conv_djit_ok(dev, s, pass)) /* bias gradient included */
                return clg_conv_djit_bwd_filter(dev, s, io->x, io->offx, io->dy, io->offdy, io->beta, io->dw,
                                                io->offdw, io->db, io->offdb);
            st = direct_bwd_filter(dev, s, io->x, io->offx, io->dy, io->offdy, io->beta, io->dw, io->offdw);
            break;
        case CLG_CONV_WINOGRAD:
        case CLG_CONV_WINOGRAD4:
            st = clg_conv_wino_bwd_filter(dev, s, algo == CLG_CONV_WINOGRAD ? 2 : 4, io->x, io->offx, io->dy,
                                          io->offdy, io->beta, io->dw, io->offdw);
            break;
        case CLG_CONV_WINOGRAD_FUSED:
        case CLG_CONV_WINOGRAD4_FUSED:
            /* bias gradient included: the dy transform's point (1, 1) is each tile's sum */
            return clg_conv_wgrad_bwd_filter(dev, s, algo == CLG_CONV_WINOGRAD_FUSED ? 2 : 4, io->x, io->offx, io->dy,
                                             io->offdy, io->beta, io->dw, io->offdw, io->db, io->offdb);
        default:
            st = CLG_ERR_UNSUPPORTED;
            break;
        }
        if (st == CLG_ERR_UNSUPPORTED)
            break;
        CLG_TRY(st);
        if (io->db) {
            clg_conv_prof(dev, NULL);
            CLG_TRY(clg_conv_bias_grad(dev, s, io->dy, io->offdy, io->beta, io->db, io->offdb));
            clg_conv_prof(dev, "bias grad");
        }
        return CLG_OK;
    }
    }
    return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED, "conv: algorithm '%s' has no %s pass",
                       clg_conv_algo_name(algo),
                       pass == CLG_CONV_FWD ? "forward" : pass == CLG_CONV_BWD_DATA ? "backward-data" : "backward-filter");
}

static const char *pass_name(clg_conv_pass p)
{
    return p == CLG_CONV_FWD ? "forward" : p == CLG_CONV_BWD_DATA ? "backward-data" : "backward-filter";
}

static clg_status check_off(clg_device *dev, const char *what, cl_mem m, size_t off, size_t numel)
{
    if (!m)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "conv: NULL %s buffer", what);
    if (off > (size_t)INT_MAX - numel)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG,
                           "conv: %s offset %zu + %zu elements exceeds 32-bit indexing", what, off, numel);
    return CLG_OK;
}

static clg_status resolve(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo, clg_conv_pass pass,
                          clg_conv_cache *cache, const clg_conv_io *io, clg_conv_algo *out)
{
    if ((unsigned)algo >= CLG_CONV_ALGO_COUNT)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "conv: bad algorithm id %d", (int)algo);
    if (algo != CLG_CONV_AUTO) {
        if (!clg_conv_algo_supported(algo, s, pass))
            return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                               "conv: algorithm '%s' cannot run the %s pass of this shape (R=%d S=%d stride %dx%d "
                               "dilation %dx%d groups %d pad %dx%d)",
                               clg_conv_algo_name(algo), pass_name(pass), s->R, s->S, s->stride_h, s->stride_w,
                               s->dil_h, s->dil_w, s->groups, s->pad_h, s->pad_w);
        *out = algo;
        return CLG_OK;
    }
    unsigned gen = clg_conv_auto_generation(); /* a checkpoint's pins since: resolve again */
    if (cache && cache->chosen_gen != gen)
        cache->chosen[0] = cache->chosen[1] = cache->chosen[2] = CLG_CONV_AUTO;
    if (cache && cache->chosen[pass] != CLG_CONV_AUTO && clg_conv_algo_supported(cache->chosen[pass], s, pass)) {
        *out = cache->chosen[pass];
        return CLG_OK;
    }
    int final = 1;
    CLG_TRY(clg_conv_auto_choose(dev, s, pass, io, out, &final));
    if (cache && final) {
        cache->chosen[pass] = *out;
        cache->chosen_gen = gen;
    }
    return CLG_OK;
}

/* Element counts of the tensors a public entry point checks. */
static size_t conv_numel_x(const clg_conv_shape *s) { return (size_t)s->N * s->C * s->H * s->W; }
static size_t conv_numel_w(const clg_conv_shape *s) { return (size_t)s->K * (s->C / s->groups) * s->R * s->S; }
static size_t conv_numel_y(const clg_conv_shape *s)
{
    return (size_t)s->N * s->K * (size_t)clg_conv_out_h(s) * (size_t)clg_conv_out_w(s);
}

clg_status clg_conv_forward(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo, clg_conv_cache *cache,
                            cl_mem x, size_t offx, cl_mem w, size_t offw, cl_mem bias, size_t offb, int relu, cl_mem y,
                            size_t offy)
{
    clg_err *err = clg_dev_err(dev);
    CLG_TRY(clg_conv_check(err, s));
    CLG_TRY(check_off(dev, "x", x, offx, conv_numel_x(s)));
    CLG_TRY(check_off(dev, "w", w, offw, conv_numel_w(s)));
    CLG_TRY(check_off(dev, "y", y, offy, conv_numel_y(s)));
    if (bias)
        CLG_TRY(check_off(dev, "bias", bias, offb, (size_t)s->K));
    clg_conv_io io;
    memset(&io, 0, sizeof io);
    io.x = x;
    io.offx = offx;
    io.w = w;
    io.offw = offw;
    io.bias = bias;
    io.offb = offb;
    io.relu = relu;
    io.y = y;
    io.offy = offy;
    clg_conv_algo a;
    CLG_TRY(resolve(dev, s, algo, CLG_CONV_FWD, cache, &io, &a));
    return clg_conv_run(dev, s, a, CLG_CONV_FWD, cache, &io);
}

clg_status clg_conv_backward_data(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo, clg_conv_cache *cache,
                                  cl_mem dy, size_t offdy, cl_mem w, size_t offw, cl_mem dx, size_t offdx)
{
    clg_err *err = clg_dev_err(dev);
    CLG_TRY(clg_conv_check(err, s));
    CLG_TRY(check_off(dev, "dy", dy, offdy, conv_numel_y(s)));
    CLG_TRY(check_off(dev, "w", w, offw, conv_numel_w(s)));
    CLG_TRY(check_off(dev, "dx", dx, offdx, conv_numel_x(s)));
    clg_conv_io io;
    memset(&io, 0, sizeof io);
    io.dy = dy;
    io.offdy = offdy;
    io.w = w;
    io.offw = offw;
    io.dx = dx;
    io.offdx = offdx;
    clg_conv_algo a;
    CLG_TRY(resolve(dev, s, algo, CLG_CONV_BWD_DATA, cache, &io, &a));
    return clg_conv_run(dev, s, a, CLG_CONV_BWD_DATA, cache, &io);
}

clg_status clg_conv_backward_filter(clg_device *dev, const clg_conv_shape *s, clg_conv_algo algo, cl_mem x,
                                    size_t offx, cl_mem dy, size_t offdy, float beta, cl_mem dw, size_t offdw,
                                    cl_mem db, size_t offdb)
{
    clg_err *err = clg_dev_err(dev);
    CLG_TRY(clg_conv_check(err, s));
    CLG_TRY(check_off(dev, "x", x, offx, conv_numel_x(s)));
    CLG_TRY(check_off(dev, "dy", dy, offdy, conv_numel_y(s)));
    CLG_TRY(check_off(dev, "dw", dw, offdw, conv_numel_w(s)));
    if (db)
        CLG_TRY(check_off(dev, "db", db, offdb, (size_t)s->K));
    clg_conv_io io;
    memset(&io, 0, sizeof io);
    io.x = x;
    io.offx = offx;
    io.dy = dy;
    io.offdy = offdy;
    io.beta = beta;
    io.dw = dw;
    io.offdw = offdw;
    io.db = db;
    io.offdb = offdb;
    clg_conv_algo a;
    CLG_TRY(resolve(dev, s, algo, CLG_CONV_BWD_FILTER, NULL, &io, &a));
    return clg_conv_run(dev, s, a, CLG_CONV_BWD_FILTER, NULL, &io);
}
