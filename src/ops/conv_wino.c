/* Winograd convolution (3x3, stride 1), separate-transform design:
 * transform kernels in cl/winograd.cl + one batched GEMM over the
 * alpha*alpha transform points, per chunk of images sized so the
 * transform-domain workspaces stay cache-resident. F(2x2,3x3) (m = 2) and
 * F(4x4,3x3) (m = 4) for forward and backward-data, F(3x3,2x2) / F(3x3,4x4)
 * for backward-filter. Forward and backward-data: the filter and input
 * transforms write U and V straight into the own GEMM kernel's panel layout
 * and the product runs with clg_gemm_packed (no packing passes; the layer
 * cache keeps the packed U). Backward-filter keeps plain row-major
 * transforms (the tiles are the GEMM depth) and on CPUs reduces them with
 * clg_gemm_dot, also without packing passes. Measured alternative (not
 * kept): bwd-filter transforms writing the panels of clg_gemm_packed
 * (strided stores, lanes over tiles) were 7-14% faster than clg_gemm_dot
 * on four of the eight VGG-S layer/algorithm pairs, 6-22% slower on two
 * and 2-3.4x slower with one input channel (C padded to a 32-wide panel);
 * 22% more in total.
 * Measured alternative (removed): own one-launch transform-domain product
 * kernels instead of clg_gemm were 1.3-1.7x slower on the VGG-S layers. */
#include <stdlib.h>
#include <string.h>

#include "conv_impl.h"

/* Tiles per work-item along a tile row (VL in cl/winograd.cl): 8, or 4
 * when a tile row has at most 4 tiles (narrow images) so fewer lanes idle. */
static int wino_vl(int TW) { return TW <= 4 ? 4 : 8; }

/* Images per chunk: the transform-domain workspaces of one chunk
 * (per_image floats each image) stay within a cache-sized budget so the
 * transform -> GEMM -> transform chain reuses them from the last-level
 * cache instead of memory (CLGRAD_CONV_CHUNK_FLOATS overrides the budget).
 * wino_chunk_max: the budget's image count, whatever the batch. */
static int wino_chunk_max(clg_device *dev, size_t per_image)
{
    size_t budget; /* 4 MiB: two cores' L2 (measured: 1-2 MiB slower, >= 16 MiB much slower) */
    budget = (size_t)dev->ctx->opts.conv_chunk_floats; /* default 1 << 20 */
    size_t lim = CLG_MIN(budget, clg_conv_ws_floats(dev));
    return (int)CLG_MIN((size_t)INT_MAX, CLG_MAX((size_t)1, lim / CLG_MAX(per_image, (size_t)1)));
}

static int wino_chunk(clg_device *dev, int N, size_t per_image)
{
    int nb = CLG_MIN(N, wino_chunk_max(dev, per_image));
    int chunks = CLG_CEIL_DIV(N, nb);
    return CLG_CEIL_DIV(N, chunks);
}

static const char *wino_opts_vl(int m, int vl)
{
    if (vl == 4)
        return m == 4 ? "-D WM=4 -D VL=4" : "-D WM=2 -D VL=4";
    return m == 4 ? "-D WM=4" : "-D WM=2";
}
static const char *wino_opts(int m) { return wino_opts_vl(m, 8); }

/* Layout of the transform-domain product M[xi] (R x T) = U[xi] (R x D) *
 * V[xi] (D x T): with `packed` U and V are written by the transform kernels
 * in the own GEMM backend's panel layout (clg_gemm_pack_layout) and the
 * product runs with clg_gemm_packed; otherwise (CLBlast or the reference
 * backend chosen for the context, or GEMM parameters without panels) plain
 * row-major U[xi][r][d], V[xi][d][t] and clg_gemm. The packed layout comes
 * from the GEMM parameters for a full chunk (device, tuning database, R, D,
 * tiles per image), never from the batch size, so the packed filters a
 * layer cache keeps match every later product of the layer; plain filters
 * are never cached (a backend switch cannot meet a cache of the other
 * layout). A tuning database changed while a layer cache lives (`clgrad
 * tune` in the same process) could change the panel height: rebuild the
 * caches (bump weights_version) after tuning. */
typedef struct wino_lay {
    int packed;
    clg_gemm_layout L;
    int PA, Kp, Mp; /* U: rows per panel (1 plain), depth, rows rounded up to PA */
    size_t sxU;     /* floats per transform point of U */
} wino_lay;

static void wino_layout(clg_device *dev, int A2, int R, int D, int TI, wino_lay *w)
{
    memset(w, 0, sizeof *w);
    clg_gemm_backend b = clg_gemm_get_backend(dev->ctx);
    if (b == CLG_GEMM_AUTO || b == CLG_GEMM_OWN) {
        /* parameters for the product of a full chunk (batch-independent) */
        int Tref = wino_chunk_max(dev, (size_t)A2 * TI * ((size_t)R + D)) * TI;
        clg_err saved = dev->err;
        if (clg_gemm_pack_layout(dev, R, Tref, D, NULL, &w->L) == CLG_OK)
            w->packed = 1;
        dev->err = saved; /* a family without panels is no error here */
    }
    w->PA = w->packed ? w->L.PA : 1;
    w->Kp = w->packed ? clg_gemm_layout_kp(&w->L, D) : D;
    w->Mp = CLG_CEIL_DIV(R, w->PA) * w->PA;
    w->sxU = (size_t)w->Mp * w->Kp;
}

/* Floats per transform point of V for T tiles (panel width PB; plain: T). */
static size_t wino_sxv(const wino_lay *w, int T, int *PB)
{
    *PB = w->packed ? w->L.PB : CLG_MAX(T, 1);
    return (size_t)CLG_CEIL_DIV(T, *PB) * *PB * w->Kp;
}

static clg_status filter_transform(clg_device *dev, int m, cl_mem w, size_t offw, int Kout, int Cin, int flip,
                                   const wino_lay *lay, cl_mem U)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "winograd", wino_opts(m), "wino_filter", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, w);
    clg_ka_int(&a, (int)offw);
    clg_ka_int(&a, Kout);
    clg_ka_int(&a, Cin);
    clg_ka_int(&a, flip);
    clg_ka_mem(&a, U);
    clg_ka_int(&a, 0);
    clg_ka_int(&a, lay->PA);
    clg_ka_int(&a, lay->Kp);
    clg_ka_int(&a, lay->Mp);
    clg_ka_int(&a, (int)lay->sxU);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "wino_filter args"));
    size_t gws[2] = {(size_t)lay->Kp, (size_t)lay->Mp};
    return clg_launch(dev, k, 2, gws, NULL, CLG_LAUNCH_PAD, NULL);
}

typedef struct filter_job {
    int m, Kout, Cin, flip;
    cl_mem w;
    size_t offw;
    const wino_lay *lay;
} filter_job;

static clg_status filter_build(clg_device *dev, void *ctx, cl_mem dst)
{
    const filter_job *j = ctx;
    return filter_transform(dev, j->m, j->w, j->offw, j->Kout, j->Cin, j->flip, j->lay, dst);
}

/* Transformed filters for (m, flip) in lay's layout: with a packed layout
 * from the layer cache when current, else rebuilt there; plain layouts and
 * calls without a cache use a temporary (*tmp set). */
static clg_status filters_get(clg_device *dev, int m, clg_conv_cache *cache, clg_conv_algo algo, cl_mem w,
                              size_t offw, int Kout, int Cin, int flip, const wino_lay *lay, cl_mem *U, int *tmp)
{
    int A = m + 2;
    size_t floats = (size_t)A * A * lay->sxU;
    if (floats > INT_MAX)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                           "winograd: transformed filters of %d x %d channels exceed 2^31 elements", Kout, Cin);
    filter_job job = {m, Kout, Cin, flip, w, offw, lay};
    return clg_conv_cached_filters(dev, lay->packed ? cache : NULL, algo, flip, sizeof(float) * floats, filter_build,
                                   &job, U, tmp);
}

/* V for nb images (T = nb*TH*TW tiles): panels of PB tiles with Kp (>= C)
 * channel rows, sxV floats per transform point. */
static clg_status launch_input(clg_device *dev, int m, cl_mem x, size_t offx, int C, int H, int W, int pad_h,
                               int pad_w, int TH, int TW, int nb, int Kp, int PB, size_t sxV, cl_mem V)
{
    cl_kernel k;
    int vl = wino_vl(TW);
    CLG_TRY(clg_kernel_get(dev, "winograd", wino_opts_vl(m, vl), "wino_input", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, x);
    clg_ka_int(&a, (int)offx);
    clg_ka_int(&a, C);
    clg_ka_int(&a, H);
    clg_ka_int(&a, W);
    clg_ka_int(&a, pad_h);
    clg_ka_int(&a, pad_w);
    clg_ka_int(&a, TH);
    clg_ka_int(&a, TW);
    clg_ka_int(&a, CLG_CEIL_DIV(TW, vl));
    clg_ka_float(&a, 1.0f / (float)CLG_CEIL_DIV(TW, vl));
    clg_ka_mem(&a, V);
    clg_ka_int(&a, nb * TH * TW);
    clg_ka_int(&a, PB);
    clg_ka_float(&a, 1.0f / (float)PB);
    clg_ka_int(&a, Kp);
    clg_ka_int(&a, (int)sxV);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "wino_input args"));
    size_t gws[3], lws[3];
    clg_conv_geom(dev, k, TH * CLG_CEIL_DIV(TW, vl), Kp, nb, gws, lws);
    return clg_conv_enqueue(dev, k, 3, gws, lws);
}

/* y (N, Kout, P, Q) = conv3x3(x (N, Cin, H, W), U) with padding pad, P = H + 2 pad - 2. */
static clg_status wino_conv(clg_device *dev, int m, int N, int Cin, int H, int W, int Kout, int pad_h, int pad_w,
                            const wino_lay *lay, cl_mem U, cl_mem x, size_t offx, cl_mem bias, size_t offb, int relu,
                            cl_mem y, size_t offy)
{
    int A = m + 2, A2 = A * A;
    int P = H + 2 * pad_h - 2, Q = W + 2 * pad_w - 2;
    int TH = CLG_CEIL_DIV(P, m), TW = CLG_CEIL_DIV(Q, m), TI = TH * TW;
    int nb = wino_chunk(dev, N, (size_t)A2 * TI * ((size_t)Cin + Kout));
    cl_kernel ko;
    int vl = wino_vl(TW);
    CLG_TRY(clg_kernel_get(dev, "winograd", wino_opts_vl(m, vl), "wino_output", &ko));
    int PBmax;
    size_t vfloats = (size_t)A2 * wino_sxv(lay, nb * TI, &PBmax);
    if (vfloats > INT_MAX || (size_t)nb * A2 * TI * Kout > INT_MAX)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                           "winograd: transform-domain workspace of %d images exceeds 2^31 elements", nb);
    cl_mem V = NULL, M = NULL;
    clg_status st = clg_buf_alloc(dev, sizeof(float) * vfloats, &V);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * (size_t)nb * A2 * TI * Kout, &M);
    for (int n0 = 0; n0 < N && st == CLG_OK; n0 += nb) {
        int nbc = CLG_MIN(nb, N - n0), T = nbc * TI, PB;
        size_t sxV = wino_sxv(lay, T, &PB);
        clg_conv_prof(dev, NULL);
        st = launch_input(dev, m, x, offx + (size_t)n0 * Cin * H * W, Cin, H, W, pad_h, pad_w, TH, TW, nbc, lay->Kp,
                          PB, sxV, V);
        if (st != CLG_OK)
            break;
        clg_conv_prof(dev, "wino input");
        clg_gemm_args g;
        clg_gemm_args_init(&g);
        g.M = Kout;
        g.N = T;
        g.K = Cin;
        g.C = M;
        g.ldc = T;
        g.strideC = (size_t)Kout * T;
        g.batch = A2;
        if (lay->packed) {
            st = clg_gemm_packed(dev, &lay->L, &g, U, lay->sxU, V, sxV, NULL);
        } else {
            g.A = U;
            g.lda = Cin;
            g.strideA = lay->sxU;
            g.B = V;
            g.ldb = T;
            g.strideB = sxV;
            st = clg_gemm(dev, &g, NULL);
        }
        if (st != CLG_OK)
            break;
        clg_conv_prof(dev, "wino gemm");
        clg_kargs a = {ko, 0, CL_SUCCESS};
        clg_ka_mem(&a, M);
        clg_ka_int(&a, T);
        clg_ka_int(&a, Kout);
        clg_ka_int(&a, P);
        clg_ka_int(&a, Q);
        clg_ka_int(&a, TH);
        clg_ka_int(&a, TW);
        clg_ka_int(&a, CLG_CEIL_DIV(TW, vl));
        clg_ka_float(&a, 1.0f / (float)CLG_CEIL_DIV(TW, vl));
        clg_ka_mem(&a, bias ? bias : M);
        clg_ka_int(&a, (int)offb);
        clg_ka_int(&a, bias != NULL);
        clg_ka_int(&a, relu);
        clg_ka_mem(&a, y);
        clg_ka_int(&a, (int)(offy + (size_t)n0 * Kout * P * Q));
        if ((st = CLG_KA_DONE(clg_dev_err(dev), &a, "wino_output args")) != CLG_OK)
            break;
        size_t gws[3], lws[3];
        clg_conv_geom(dev, ko, TH * CLG_CEIL_DIV(TW, vl), Kout, nbc, gws, lws);
        st = clg_conv_enqueue(dev, ko, 3, gws, lws);
        clg_conv_prof(dev, "wino output");
    }
    clg_buf_release(dev, V);
    clg_buf_release(dev, M);
    return st;
}

clg_status clg_conv_wino_fwd(clg_device *dev, const clg_conv_shape *s, int m, clg_conv_cache *cache, cl_mem x,
                             size_t offx, cl_mem w, size_t offw, cl_mem bias, size_t offb, int relu, cl_mem y,
                             size_t offy)
{
    clg_conv_algo algo = m == 4 ? CLG_CONV_WINOGRAD4 : CLG_CONV_WINOGRAD;
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s);
    wino_lay lay;
    wino_layout(dev, (m + 2) * (m + 2), s->K, s->C, CLG_CEIL_DIV(P, m) * CLG_CEIL_DIV(Q, m), &lay);
    cl_mem U = NULL;
    int tmp = 0;
    CLG_TRY(filters_get(dev, m, cache, algo, w, offw, s->K, s->C, 0, &lay, &U, &tmp));
    clg_status st = wino_conv(dev, m, s->N, s->C, s->H, s->W, s->K, s->pad_h, s->pad_w, &lay, U, x, offx, bias, offb,
                              relu, y, offy);
    if (tmp)
        clg_buf_release(dev, U);
    return st;
}

clg_status clg_conv_wino_bwd_data(clg_device *dev, const clg_conv_shape *s, int m, clg_conv_cache *cache, cl_mem dy,
                                  size_t offdy, cl_mem w, size_t offw, cl_mem dx, size_t offdx)
{
    /* dx = conv3x3(dy, rot180(w)^T) with padding 2 - pad. */
    clg_conv_algo algo = m == 4 ? CLG_CONV_WINOGRAD4 : CLG_CONV_WINOGRAD;
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s);
    wino_lay lay;
    wino_layout(dev, (m + 2) * (m + 2), s->C, s->K, CLG_CEIL_DIV(s->H, m) * CLG_CEIL_DIV(s->W, m), &lay);
    cl_mem U = NULL;
    int tmp = 0;
    CLG_TRY(filters_get(dev, m, cache, algo, w, offw, s->C, s->K, 1, &lay, &U, &tmp));
    clg_status st = wino_conv(dev, m, s->N, s->K, P, Q, s->C, 2 - s->pad_h, 2 - s->pad_w, &lay, U, dy, offdy, NULL, 0,
                              0, dx, offdx);
    if (tmp)
        clg_buf_release(dev, U);
    return st;
}

clg_status clg_conv_wino_bwd_filter(clg_device *dev, const clg_conv_shape *s, int m, cl_mem x, size_t offx,
                                    cl_mem dy, size_t offdy, float beta, cl_mem dw, size_t offdw)
{
    /* F(3x3, mxm): dy in m x m tiles, x in the matching (m+2) x (m+2) patches. */
    int A2 = (m + 2) * (m + 2);
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s);
    int C = s->C, K = s->K, H = s->H, W = s->W;
    int TH = CLG_CEIL_DIV(P, m), TW = CLG_CEIL_DIV(Q, m), TI = TH * TW;
    int nb = wino_chunk(dev, s->N, (size_t)A2 * TI * ((size_t)C + K));
    cl_kernel kd, ko;
    int vl = wino_vl(TW);
    CLG_TRY(clg_kernel_get(dev, "winograd", wino_opts_vl(m, vl), "wino_bf_dy", &kd));
    CLG_TRY(clg_kernel_get(dev, "winograd", wino_opts(m), "wino_bf_out", &ko));
    /* the product reduces over the T tiles (K x C per point, T >> K, C): on
     * CPUs dot products on the plain transforms, no packing passes */
    clg_gemm_backend gb = clg_gemm_get_backend(dev->ctx);
    int use_dot = (dev->info.type & CLG_DEVICE_CPU) && (gb == CLG_GEMM_AUTO || gb == CLG_GEMM_OWN);
    cl_mem V = NULL, Ud = NULL, Mf = NULL;
    clg_status st = clg_buf_alloc(dev, sizeof(float) * (size_t)nb * A2 * TI * C, &V);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * (size_t)nb * A2 * TI * K, &Ud);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * (size_t)A2 * K * C, &Mf);
    for (int n0 = 0; n0 < s->N && st == CLG_OK; n0 += nb) {
        int nbc = CLG_MIN(nb, s->N - n0), T = nbc * TI;
        clg_conv_prof(dev, NULL);
        /* plain V[xi][c][t]: one panel of T tiles */
        st = launch_input(dev, m, x, offx + (size_t)n0 * C * H * W, C, H, W, s->pad_h, s->pad_w, TH, TW, nbc, C, T,
                          (size_t)C * T, V);
        if (st != CLG_OK)
            break;
        clg_kargs a = {kd, 0, CL_SUCCESS};
        clg_ka_mem(&a, dy);
        clg_ka_int(&a, (int)(offdy + (size_t)n0 * K * P * Q));
        clg_ka_int(&a, K);
        clg_ka_int(&a, P);
        clg_ka_int(&a, Q);
        clg_ka_int(&a, TH);
        clg_ka_int(&a, TW);
        clg_ka_int(&a, CLG_CEIL_DIV(TW, vl));
        clg_ka_float(&a, 1.0f / (float)CLG_CEIL_DIV(TW, vl));
        clg_ka_mem(&a, Ud);
        clg_ka_int(&a, T);
        if ((st = CLG_KA_DONE(clg_dev_err(dev), &a, "wino_bf_dy args")) != CLG_OK)
            break;
        size_t gws[3], lws[3];
        clg_conv_geom(dev, kd, TH * CLG_CEIL_DIV(TW, vl), K, nbc, gws, lws);
        if ((st = clg_conv_enqueue(dev, kd, 3, gws, lws)) != CLG_OK)
            break;
        clg_conv_prof(dev, "wino bf input+dy");
        clg_gemm_args g;
        clg_gemm_args_init(&g);
        g.tb = 1;
        g.M = K;
        g.N = C;
        g.K = T;
        g.A = Ud;
        g.lda = T;
        g.strideA = (size_t)K * T;
        g.B = V;
        g.ldb = T;
        g.strideB = (size_t)C * T;
        g.C = Mf;
        g.ldc = C;
        g.strideC = (size_t)K * C;
        g.batch = A2;
        g.beta = n0 == 0 ? 0.0f : 1.0f;
        st = use_dot ? clg_gemm_dot(dev, &g, NULL) : clg_gemm(dev, &g, NULL);
        clg_conv_prof(dev, "wino bf gemm");
    }
    if (st == CLG_OK) {
        clg_kargs a = {ko, 0, CL_SUCCESS};
        clg_ka_mem(&a, Mf);
        clg_ka_int(&a, K);
        clg_ka_int(&a, C);
        clg_ka_float(&a, beta);
        clg_ka_mem(&a, dw);
        clg_ka_int(&a, (int)offdw);
        st = CLG_KA_DONE(clg_dev_err(dev), &a, "wino_bf_out args");
        size_t gws[2] = {(size_t)C, (size_t)K};
        if (st == CLG_OK)
            st = clg_launch(dev, ko, 2, gws, NULL, CLG_LAUNCH_PAD, NULL);
    }
    clg_buf_release(dev, V);
    clg_buf_release(dev, Ud);
    clg_buf_release(dev, Mf);
    return st;
}
