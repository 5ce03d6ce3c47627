/* Winograd convolution (3x3, stride 1), fused design: one launch of
 * wf_conv (cl/winograd_fused.cl) does the input transform, the
 * transform-domain products in per-work-item __local scratch and the output
 * transform with bias + ReLU. F(2x2,3x3) (m = 2, "winograd-fused") and
 * F(4x4,3x3) (m = 4, "winograd4-fused"), forward and backward-data (same
 * kernel on dy with the rotated, transposed filters and padding 2 - pad).
 * The transformed filters live in the layer's clg_conv_cache slots of the
 * algorithm, rebuilt when weights_version changes.
 *
 * Knobs (measurement only): CLGRAD_WFUSED_NT (float8 tile vectors per
 * work-item, 1..4), CLGRAD_WFUSED_KB (output channels per register block,
 * 1/2/4/8/16; default 8, fewer for layers with fewer output channels), CLGRAD_WFUSED_WGS (work-group size), CLGRAD_WFUSED_SCRATCH_KB
 * (scratch budget per work-item), CLGRAD_WFUSED_XOPTS (extra build options). */
#include <stdio.h>
#include <stdlib.h>

#include "conv_impl.h"

typedef struct wf_cfg {
    int nt, kb, wgs;
    size_t scratch_bytes; /* per work-item budget */
    const char *xopts;    /* extra build options (experiments; borrowed from the context's options) */
} wf_cfg;

/* Output channels per register block by default: 8, fewer when the layer
 * has fewer output channels (backward-data of a C = 1 layer has one), so
 * the product does not run on zero-padded channels. */
static int wf_kb_auto(int Kout) { return Kout <= 1 ? 1 : Kout <= 2 ? 2 : Kout <= 4 ? 4 : 8; }

static wf_cfg wf_config(const clg_device *dev, int Kout)
{
    wf_cfg c;
    int kb_def = wf_kb_auto(Kout);
    const clg_opts *o = &dev->ctx->opts;
    c.nt = (int)o->wfused_nt; /* 1..4, default 2 */
    c.kb = o->wfused_kb ? 1 << (o->wfused_kb - 1) : kb_def; /* auto,1,2,4,8,16 */
    c.wgs = (int)o->wfused_wgs; /* 1..256, default 1 */
    if (dev->info.max_work_group_size && (size_t)c.wgs > dev->info.max_work_group_size)
        c.wgs = (int)dev->info.max_work_group_size;
    /* 256 KiB: Vs of 64 channels x 16 tiles (F(4x4)) plus one block of
     * products, leaving room in a 1 MiB L2 for the streamed filters */
    c.scratch_bytes = (size_t)o->wfused_scratch_kb * 1024; /* 8..1 << 20, default 256 */
    c.xopts = o->wfused_xopts;
    return c;
}

/* Cin: input channels of the convolution the program serves. Above
 * WF_DIRECT_C (4, cl/winograd_fused.cl) the kernel's direct path cannot run
 * and is compiled out: it was about 40% of PoCL's compile time for wf_conv
 * (paid at every cold start), with no effect on what runs. */
static void wf_opts(char *buf, size_t n, int m, const wf_cfg *c, int Cin)
{
    const char *x = c->xopts[0] ? c->xopts : NULL;
    snprintf(buf, n, "-D WM=%d -D NT=%d -D KB=%d -D WGS=%d%s%s%s", m, c->nt, c->kb, c->wgs,
             Cin > 4 ? " -D WF_DIRECT_C=0" : "", x ? " " : "", x ? x : "");
}

static clg_conv_algo wf_algo(int m) { return m == 4 ? CLG_CONV_WINOGRAD4_FUSED : CLG_CONV_WINOGRAD_FUSED; }

static clg_status wf_filter(clg_device *dev, int m, const wf_cfg *c, cl_mem w, size_t offw, int Kout, int Cin,
                            int flip, cl_mem U)
{
    char opts[256];
    wf_opts(opts, sizeof opts, m, c, Cin); /* Cin: the input channels of the convolution it serves */
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "winograd_fused", opts, "wf_filter", &k));
    int Kb = CLG_CEIL_DIV(Kout, c->kb);
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, w);
    clg_ka_int(&a, (int)offw);
    clg_ka_int(&a, Kout);
    clg_ka_int(&a, Cin);
    clg_ka_int(&a, flip);
    clg_ka_int(&a, Kb);
    clg_ka_mem(&a, U);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "wf_filter args"));
    size_t gws[2] = {(size_t)Cin, (size_t)Kb};
    return clg_launch(dev, k, 2, gws, NULL, CLG_LAUNCH_PAD, NULL);
}

typedef struct wf_filter_job {
    int m, Kout, Cin, flip;
    const wf_cfg *c;
    cl_mem w;
    size_t offw;
} wf_filter_job;

static clg_status wf_filter_build(clg_device *dev, void *ctx, cl_mem dst)
{
    const wf_filter_job *j = ctx;
    return wf_filter(dev, j->m, j->c, j->w, j->offw, j->Kout, j->Cin, j->flip, dst);
}

/* Transformed filters from the layer cache when current, else rebuilt there;
 * without a cache into a temporary (*tmp set). The cached layout is that of
 * the layer's default block size: other KB (a measurement knob) use a
 * temporary. */
static clg_status wf_filters_get(clg_device *dev, int m, const wf_cfg *c, clg_conv_cache *cache, cl_mem w,
                                 size_t offw, int Kout, int Cin, int flip, cl_mem *U, int *tmp)
{
    int A = m + 2;
    size_t kp = (size_t)CLG_CEIL_DIV(Kout, c->kb) * c->kb;
    size_t bytes = sizeof(float) * (size_t)A * A * kp * (size_t)Cin;
    wf_filter_job job = {m, Kout, Cin, flip, c, w, offw};
    return clg_conv_cached_filters(dev, c->kb == wf_kb_auto(Kout) ? cache : NULL, wf_algo(m), flip, bytes,
                                   wf_filter_build, &job, U, tmp);
}

/* y (N, Kout, P, Q) = conv3x3(x (N, Cin, H, W), U) + bias, ReLU; P = H + 2 pad_h - 2. */
static clg_status wf_conv(clg_device *dev, int m, const wf_cfg *c, int N, int Cin, int H, int W, int Kout,
                          int pad_h, int pad_w, cl_mem U, cl_mem x, size_t offx, cl_mem bias, size_t offb, int relu,
                          cl_mem y, size_t offy)
{
    clg_err *err = clg_dev_err(dev);
    int A2 = (m + 2) * (m + 2), TB = 8 * c->nt;
    int P = H + 2 * pad_h - 2, Q = W + 2 * pad_w - 2;
    int TH = CLG_CEIL_DIV(P, m), TW = CLG_CEIL_DIV(Q, m), TI = TH * TW;
    if ((double)N * TI + TB >= INT_MAX || (double)A2 * (Kout + c->kb) * Cin >= INT_MAX)
        return clg_err_set(err, CLG_ERR_SHAPE, "winograd-fused: %d images of %dx%d tiles with %d->%d channels exceed "
                           "32-bit indexing", N, TH, TW, Cin, Kout);
    int T = N * TI, nblk = CLG_CEIL_DIV(T, TB), Kb = CLG_CEIL_DIV(Kout, c->kb);
    /* Split the output channels over a second grid dimension when there are
     * too few tile blocks to keep every compute unit busy (costs one extra
     * input transform per split). */
    int target = 4 * (int)CLG_MAX(1u, dev->info.compute_units);
    int ksplit = CLG_MIN(Kb, CLG_MAX(1, CLG_CEIL_DIV(target, nblk)));
    int kbper = CLG_CEIL_DIV(Kb, ksplit);
    ksplit = CLG_CEIL_DIV(Kb, kbper);
    /* Scratch per work-item: A2*TB floats per channel slot, CB input channels + KGB*KB products. */
    size_t budget = c->scratch_bytes;
    if (dev->info.local_mem_bytes > 0) {
        size_t lim = (size_t)dev->info.local_mem_bytes / (size_t)c->wgs;
        lim = lim > 1024 ? lim - 1024 : 0; /* leave room for the runtime's own local data */
        budget = CLG_MIN(budget, lim);
    }
    size_t slots = budget / (sizeof(float) * (size_t)A2 * TB);
    int CB, KGB;
    if (slots >= (size_t)Cin + c->kb) {
        CB = Cin;
        KGB = 1;
    } else if (slots >= (size_t)1 + c->kb) {
        /* half for input channels, the rest for KGB >= 1 blocks of products */
        size_t cb = CLG_MIN((size_t)Cin, CLG_MAX((size_t)1, slots / 2));
        if (cb + c->kb > slots)
            cb = slots - c->kb;
        CB = (int)cb;
        KGB = (int)CLG_MAX((size_t)1, CLG_MIN((size_t)kbper, (slots - CB) / c->kb));
    } else {
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "winograd-fused: device local memory (%llu bytes for %d work-items) cannot hold the %zu-byte "
                           "scratch of one channel and one %d-channel block of %d tiles",
                           (unsigned long long)dev->info.local_mem_bytes, c->wgs,
                           sizeof(float) * (size_t)A2 * TB * (1 + c->kb), c->kb, TB);
    }
    size_t lbytes = sizeof(float) * (size_t)c->wgs * A2 * TB * ((size_t)CB + (size_t)KGB * c->kb);
    char opts[256];
    wf_opts(opts, sizeof opts, m, c, Cin);
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "winograd_fused", opts, "wf_conv", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, x);
    clg_ka_int(&a, (int)offx);
    clg_ka_int(&a, Cin);
    clg_ka_int(&a, H);
    clg_ka_int(&a, W);
    clg_ka_int(&a, pad_h);
    clg_ka_int(&a, pad_w);
    clg_ka_int(&a, P);
    clg_ka_int(&a, Q);
    clg_ka_int(&a, TW);
    clg_ka_int(&a, TI);
    clg_ka_int(&a, T);
    clg_ka_mem(&a, U);
    clg_ka_int(&a, Kout);
    clg_ka_int(&a, Kb);
    clg_ka_int(&a, kbper);
    clg_ka_int(&a, CB);
    clg_ka_int(&a, KGB);
    clg_conv_ka_epilogue(&a, bias, offb, U, relu, y, offy);
    clg_ka_arg(&a, lbytes, NULL);
    CLG_TRY(CLG_KA_DONE(err, &a, "wf_conv args"));
    size_t gws[2] = {(size_t)CLG_CEIL_DIV(nblk, c->wgs) * c->wgs, (size_t)ksplit};
    size_t lws[2] = {(size_t)c->wgs, 1};
    clg_conv_prof(dev, NULL);
    clg_status st = clg_conv_enqueue(dev, k, 2, gws, lws);
    clg_conv_prof(dev, "wfused conv");
    return st;
}

clg_status clg_conv_wfused_fwd(clg_device *dev, const clg_conv_shape *s, int m, clg_conv_cache *cache, cl_mem x,
                               size_t offx, cl_mem w, size_t offw, cl_mem bias, size_t offb, int relu, cl_mem y,
                               size_t offy)
{
    wf_cfg c = wf_config(dev, s->K);
    cl_mem U = NULL;
    int tmp = 0;
    clg_conv_prof(dev, NULL);
    CLG_TRY(wf_filters_get(dev, m, &c, cache, w, offw, s->K, s->C, 0, &U, &tmp));
    clg_conv_prof(dev, "wfused filters");
    clg_status st = wf_conv(dev, m, &c, s->N, s->C, s->H, s->W, s->K, s->pad_h, s->pad_w, U, x, offx, bias, offb,
                            relu, y, offy);
    if (tmp)
        clg_buf_release(dev, U);
    return st;
}

clg_status clg_conv_wfused_bwd_data(clg_device *dev, const clg_conv_shape *s, int m, clg_conv_cache *cache, cl_mem dy,
                                    size_t offdy, cl_mem w, size_t offw, cl_mem dx, size_t offdx)
{
    /* dx = conv3x3(dy, rot180(w)^T) with padding 2 - pad (pad <= 2). */
    if (s->pad_h > 2 || s->pad_w > 2)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                           "winograd-fused: backward-data needs padding <= 2 (got %dx%d)", s->pad_h, s->pad_w);
    wf_cfg c = wf_config(dev, s->C);
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s);
    cl_mem U = NULL;
    int tmp = 0;
    clg_conv_prof(dev, NULL);
    CLG_TRY(wf_filters_get(dev, m, &c, cache, w, offw, s->C, s->K, 1, &U, &tmp));
    clg_conv_prof(dev, "wfused filters");
    clg_status st =
        wf_conv(dev, m, &c, s->N, s->K, P, Q, s->C, 2 - s->pad_h, 2 - s->pad_w, U, dy, offdy, NULL, 0, 0, dx, offdx);
    if (tmp)
        clg_buf_release(dev, U);
    return st;
}
