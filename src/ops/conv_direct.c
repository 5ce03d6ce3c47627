/* Shape-specialised direct convolution (cl/conv_direct.cl): the `direct`
 * algorithm for groups 1, dilation 1 and windows up to 11x11 builds one
 * program per layer shape with every size a compile-time constant (window
 * loops unrolled, the stride phases of backward-data resolved by the
 * compiler). Meant for what Winograd does not cover or covers badly: few
 * channels (first layers, LeNet-sized models) and strided windows, where
 * im2col spends more time moving columns than multiplying. Depthwise and
 * dilated shapes keep the generic kernels of cl/conv.cl.
 *
 * Blocking: row vectors hold QT = VW*NV outputs of one row in NV vectors of
 * VW floats (VW = the CPU's vector width; 1 on GPUs, where the vector is the
 * work-group) for a block of channels; channel vectors hold VK output
 * channels of one pixel. Either way the accumulators are sized to fit the
 * 16-32 vector registers of a CPU core. */
#include <stdio.h>
#include <stdlib.h>

#include "conv_impl.h"

/* Floats per vector register on this device (1: GPUs, one output per work-item). */
static int djit_vw(const clg_device *dev)
{
    if (!(dev->info.type & CLG_DEVICE_CPU))
        return 1;
    return clg_gemm_cpu_wide(dev) ? 16 : 8;
}

/* Vectors per row run: the whole row up to 4 vectors. */
static int djit_nv(int len, int vw) { return CLG_MAX(1, CLG_MIN(4, CLG_CEIL_DIV(len, vw))); }

/* Channels per work-item: about `budget` accumulator vectors, at least 1,
 * then evened out over the blocks (7 channels in one block of 7, not 4+3). */
static int djit_block(int n, int budget)
{
    int b = CLG_MAX(1, CLG_MIN(n, budget));
    int blocks = CLG_CEIL_DIV(n, b);
    return CLG_CEIL_DIV(n, blocks);
}

int clg_conv_djit_ok(const clg_device *dev, const clg_conv_shape *s, clg_conv_pass pass)
{
    if (s->groups != 1 || s->dil_h != 1 || s->dil_w != 1 || s->R > 11 || s->S > 11 || s->stride_h > 4 ||
        s->stride_w > 2)
        return 0;
    (void)dev;
    if (pass == CLG_CONV_BWD_FILTER) /* one accumulator per tap */
        return s->R * s->S <= 25;
    return 1;
}

static int shape_opts(char *o, size_t n, const clg_conv_shape *s, int vw, int nv, const char *blk, int b)
{
    return snprintf(o, n,
                    "-D DC=%d -D DK=%d -D DR=%d -D DS=%d -D DSH=%d -D DSW=%d -D DPH=%d -D DPW=%d -D DH=%d -D DW=%d "
                    "-D DP=%d -D DQ=%d -D VW=%d -D NV=%d -D %s=%d",
                    s->C, s->K, s->R, s->S, s->stride_h, s->stride_w, s->pad_h, s->pad_w, s->H, s->W,
                    clg_conv_out_h(s), clg_conv_out_w(s), vw, nv, blk, b);
}

/* Channel-vector width for K output channels: 4, 8 or 16 (at most the device's). */
static int djit_vk(const clg_device *dev, int K) { return K <= 4 ? 4 : K <= 8 || djit_vw(dev) < 16 ? 8 : 16; }

/* dconv_fwdk's accumulators: KVB channel vectors times QB pixels of a row
 * strip, at most DJIT_FWDK_ACC vectors so they stay in registers with the
 * filter vectors and the broadcast beside them (half of AVX-512's 32; 28,
 * the earlier bound, spilled: batch 128 on PoCL, Xeon AVX-512, 16->32
 * channels 3x3 stride 2 at 28x28 ran 3.5 ms of CPU with KVB 2 x QB 14
 * against 1.75 with 2 x 7). The row's Q pixels are split into even strips. */
#define DJIT_FWDK_ACC 16

static void djit_fwdk_blocks(int nkv, int Q, int *kvb, int *strips, int *qb)
{
    *kvb = nkv % 2 == 0 ? 2 : 1;
    *strips = CLG_CEIL_DIV(Q, DJIT_FWDK_ACC / *kvb);
    *qb = CLG_CEIL_DIV(Q, *strips);
}

typedef struct wt_ctx {
    const clg_conv_shape *fs;
    cl_mem w;
    size_t offw;
    int flip;
    const char *opts;
    int KP;
} wt_ctx;

static clg_status build_wt(clg_device *dev, void *vctx, cl_mem dst)
{
    const wt_ctx *c = vctx;
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "conv_direct", c->opts, "dconv_wt", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, c->w);
    clg_ka_int(&a, (int)c->offw);
    clg_ka_int(&a, c->flip);
    clg_ka_mem(&a, dst);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "dconv_wt args"));
    size_t gws[2] = {(size_t)c->KP, (size_t)c->fs->C * c->fs->R * c->fs->S};
    return clg_conv_enqueue(dev, k, 2, gws, NULL);
}

/* Forward of shape fs vectorised over output channels (dconv_fwdk); with
 * flip, fs is the forward form of a stride-1 backward-data pass (x = dy,
 * w = the layer's filters, flipped and transposed on the way in). */
static clg_status djit_fwdk(clg_device *dev, const clg_conv_shape *fs, int flip, const char *extra,
                            clg_conv_cache *cache, cl_mem x, size_t offx, cl_mem w, size_t offw, cl_mem bias,
                            size_t offb, int relu, cl_mem y, size_t offy)
{
    int P = clg_conv_out_h(fs), Q = clg_conv_out_w(fs);
    int vk = djit_vk(dev, fs->K), KP = CLG_CEIL_DIV(fs->K, vk) * vk, nkv = KP / vk;
    int kvb, strips, qb;
    djit_fwdk_blocks(nkv, Q, &kvb, &strips, &qb);
    char opts[480];
    int n = shape_opts(opts, sizeof opts, fs, djit_vw(dev), 1, "VK", vk);
    snprintf(opts + n, sizeof opts - (size_t)n, " -D KVB=%d -D QB=%d%s", kvb, qb, extra);
    /* the weight vectors depend only on the shape's C, K, R, S: one layout per layer and pass */
    wt_ctx wc = {fs, w, offw, flip, opts, KP};
    cl_mem U = NULL;
    int tmp = 0;
    CLG_TRY(clg_conv_cached_filters(dev, cache, CLG_CONV_DIRECT, flip,
                                    sizeof(float) * (size_t)KP * fs->C * fs->R * fs->S, build_wt, &wc, &U, &tmp));
    cl_kernel k;
    clg_status st = clg_kernel_get(dev, "conv_direct", opts, "dconv_fwdk", &k);
    if (st == CLG_OK) {
        clg_kargs a = {k, 0, CL_SUCCESS};
        clg_ka_int(&a, fs->N);
        clg_ka_mem(&a, x);
        clg_ka_int(&a, (int)offx);
        clg_ka_mem(&a, U);
        clg_conv_ka_epilogue(&a, bias, offb, U, relu, y, offy);
        st = CLG_KA_DONE(clg_dev_err(dev), &a, "dconv_fwdk args");
    }
    if (st == CLG_OK) {
        size_t gws[3], lws[3];
        clg_conv_geom(dev, k, strips, P, fs->N * nkv / kvb, gws, lws);
        st = clg_conv_enqueue(dev, k, 3, gws, lws);
    }
    if (tmp)
        clg_buf_release(dev, U);
    return st;
}

/* Which forward design: vectors over output channels need enough of them
 * to fill a vector, and enough taps per output (C*R*S) to pay for
 * scattering the channel vectors back into rows at the end (measured on
 * PoCL, AVX-512: 1.2-1.4x faster than row vectors at K = 16-32 with C*R*S
 * of 144-150; 2-3x slower with one input channel, K = 6 or 1x1 windows).
 * CLGRAD_DJIT_FWD=q|k forces one (measurement, tests). */
static int use_fwdk(const clg_device *dev, const clg_conv_shape *fs)
{
    long mode = dev->ctx->opts.djit_fwd; /* auto,q,k */
    if (mode)
        return mode == 2;
    return fs->K >= 16 && fs->R * fs->S >= 4 && fs->C * fs->R * fs->S >= 64;
}

clg_status clg_conv_djit_fwd(clg_device *dev, const clg_conv_shape *s, clg_conv_cache *cache, cl_mem x, size_t offx,
                             cl_mem w, size_t offw, cl_mem bias, size_t offb, int relu, cl_mem y, size_t offy)
{
    if (use_fwdk(dev, s))
        return djit_fwdk(dev, s, 0, "", cache, x, offx, w, offw, bias, offb, relu, y, offy);
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s);
    int vw = djit_vw(dev), nv = djit_nv(Q, vw);
    int kb = djit_block(s->K, vw == 1 ? 8 : 16 / nv);
    char opts[320];
    shape_opts(opts, sizeof opts, s, vw, nv, "KB", kb);
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "conv_direct", opts, "dconv_fwd", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_int(&a, s->N);
    clg_ka_mem(&a, x);
    clg_ka_int(&a, (int)offx);
    clg_ka_mem(&a, w);
    clg_ka_int(&a, (int)offw);
    clg_conv_ka_epilogue(&a, bias, offb, w, relu, y, offy);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "dconv_fwd args"));
    size_t gws[3], lws[3];
    clg_conv_geom(dev, k, CLG_CEIL_DIV(Q, vw * nv), P, s->N * CLG_CEIL_DIV(s->K, kb), gws, lws);
    return clg_conv_enqueue(dev, k, 3, gws, lws);
}

/* ---- strided backward-data by phases ----
 * dx's positions of one stride phase (rows a + stride_h*i, columns
 * b + stride_w*j) receive a fixed subset of the taps from consecutive dy
 * positions: a stride-1 forward convolution of dy with a sub-window, run by
 * dconv_fwdk straight into those positions of dx (cl/conv_direct.cl,
 * dconv_wt_phases). Every tap is used by exactly one phase, so no multiply
 * lands on the zeros a transposed convolution would insert between dy's
 * values. Needs every phase to have a tap (R >= stride_h, S >= stride_w). */
static int ph_taps(int a, int R, int S, int P) { return (a + P) % S < R ? (R - 1 - (a + P) % S) / S + 1 : 0; }

/* The phase's smallest dy offset: input i reads dy from i + mo on. */
static int ph_minoff(int a, int R, int S, int P)
{
    int rmax = (a + P) % S + S * (ph_taps(a, R, S, P) - 1);
    return (a + P - rmax) / S;
}

static int ph_ok(const clg_conv_shape *s)
{
    return (s->stride_h > 1 || s->stride_w > 1) && s->R >= s->stride_h && s->S >= s->stride_w && s->pad_h < s->R &&
           s->pad_w < s->S;
}

/* Phases or dconv_bwdd's row vectors (fs: the pass's forward form): the
 * phases pay four launches and scattered stores, and are taken on CPUs
 * wherever dconv_fwdk serves the forward form (PoCL, AVX-512, 3x3 stride 2,
 * batch 128 unless stated; wall minima under load: 32->64 channels at 16x16
 * 3.4 against 12.9 ms, half the row lanes idle; 16->32 at 28x28 3.4 against
 * 6.1; with every row lane busy, process CPU per call, medians of
 * alternating rounds: 16->32 at 32x32 4.9 against 6.6 ms, 32->64 at 32x32
 * 14.0 against 27.3, 16->32 at 64x64 batch 32 3.1 against 5.2).
 * djit_fwd=k forces the phases (tests), q never. */
static int use_phases(const clg_device *dev, const clg_conv_shape *s, const clg_conv_shape *fs)
{
    long mode = dev->ctx->opts.djit_fwd; /* auto,q,k */
    if (!ph_ok(s) || mode == 1)
        return 0;
    if (mode == 2)
        return 1;
    return djit_vw(dev) > 1 && use_fwdk(dev, fs); /* (GPUs: one lane per work-item, not measured) */
}

typedef struct ph_ctx {
    const clg_conv_shape *s;
    cl_mem w;
    size_t offw;
    const char *opts;
    int KP;
} ph_ctx;

/* The phase of tap r (stride S, padding P): a = (r - P) mod S. */
static int ph_of(int r, int S, int P) { return ((r - P) % S + S) % S; }

/* Build options of dconv_wt_phases: the layer's shape, KP and the tables
 * PHO (where tap t's filters start) and PHK (their stride per output channel). */
static void ph_wt_opts(char *o, size_t n, const clg_device *dev, const clg_conv_shape *s, int KP)
{
    int base[16] = {0}, nb = s->stride_h * s->stride_w, acc = 0; /* stride_h <= 4, stride_w <= 2 */
    for (int ab = 0; ab < nb; ab++) {
        base[ab] = acc;
        acc += ph_taps(ab / s->stride_w, s->R, s->stride_h, s->pad_h) *
               ph_taps(ab % s->stride_w, s->S, s->stride_w, s->pad_w);
    }
    int m = shape_opts(o, n, s, djit_vw(dev), 1, "PHWT", KP);
    for (int pass = 0; pass < 2; pass++) {
        m += snprintf(o + m, n - (size_t)m, pass ? " -D PHK=" : " -D PHO=");
        for (int t = 0; t < s->R * s->S && (size_t)m < n; t++) {
            int r = t / s->S, c = t % s->S, a = ph_of(r, s->stride_h, s->pad_h), b = ph_of(c, s->stride_w, s->pad_w);
            int rt = ph_taps(a, s->R, s->stride_h, s->pad_h), st = ph_taps(b, s->S, s->stride_w, s->pad_w);
            int rmax = (a + s->pad_h) % s->stride_h + s->stride_h * (rt - 1);
            int cmax = (b + s->pad_w) % s->stride_w + s->stride_w * (st - 1);
            int tt = (rmax - r) / s->stride_h * st + (cmax - c) / s->stride_w;
            int v = pass ? rt * st * KP : (base[a * s->stride_w + b] * s->K + tt) * KP;
            m += snprintf(o + m, n - (size_t)m, "%s%d", t ? "," : "", v);
        }
    }
}

static clg_status build_wt_phases(clg_device *dev, void *vctx, cl_mem dst)
{
    const ph_ctx *c = vctx;
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "conv_direct", c->opts, "dconv_wt_phases", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_mem(&a, c->w);
    clg_ka_int(&a, (int)c->offw);
    clg_ka_mem(&a, dst);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "dconv_wt_phases args"));
    size_t gws[3] = {(size_t)c->KP, (size_t)c->s->R * c->s->S, (size_t)c->s->K};
    return clg_conv_enqueue(dev, k, 3, gws, NULL);
}

/* One phase (a, b) with rt x st taps whose filters start at float woff of U. */
static clg_status ph_launch(clg_device *dev, const clg_conv_shape *s, int a, int b, int woff, cl_mem dy, size_t offdy,
                            cl_mem U, cl_mem dx, size_t offdx)
{
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s);
    int rt = ph_taps(a, s->R, s->stride_h, s->pad_h), st = ph_taps(b, s->S, s->stride_w, s->pad_w);
    int Hp = CLG_CEIL_DIV(s->H - a, s->stride_h), Wp = CLG_CEIL_DIV(s->W - b, s->stride_w);
    if (Hp <= 0 || Wp <= 0)
        return CLG_OK;
    int vk = djit_vk(dev, s->C), KP = CLG_CEIL_DIV(s->C, vk) * vk, nkv = KP / vk;
    int kvb, strips, qb;
    djit_fwdk_blocks(nkv, Wp, &kvb, &strips, &qb);
    char opts[480];
    snprintf(opts, sizeof opts,
             "-D DC=%d -D DK=%d -D DR=%d -D DS=%d -D DSH=1 -D DSW=1 -D DPH=%d -D DPW=%d -D DH=%d -D DW=%d -D DP=%d "
             "-D DQ=%d -D VW=%d -D NV=1 -D VK=%d -D KVB=%d -D QB=%d -D WOFF=%d -D OSH=%d -D OSW=%d -D OPH=%d "
             "-D OPW=%d -D OH=%d -D OW=%d",
             s->K, s->C, rt, st, -ph_minoff(a, s->R, s->stride_h, s->pad_h),
             -ph_minoff(b, s->S, s->stride_w, s->pad_w), P, Q, Hp, Wp, djit_vw(dev), vk, kvb, qb, woff,
             s->stride_h, s->stride_w, a, b, s->H, s->W);
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "conv_direct", opts, "dconv_fwdk", &k));
    clg_kargs ka = {k, 0, CL_SUCCESS};
    clg_ka_int(&ka, s->N);
    clg_ka_mem(&ka, dy);
    clg_ka_int(&ka, (int)offdy);
    clg_ka_mem(&ka, U);
    clg_conv_ka_epilogue(&ka, NULL, 0, U, 0, dx, offdx);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &ka, "dconv_fwdk (phase) args"));
    size_t gws[3], lws[3];
    clg_conv_geom(dev, k, strips, Hp, s->N * nkv / kvb, gws, lws);
    return clg_conv_enqueue(dev, k, 3, gws, lws);
}

static clg_status djit_bwdd_phases(clg_device *dev, const clg_conv_shape *s, clg_conv_cache *cache, cl_mem dy,
                                   size_t offdy, cl_mem w, size_t offw, cl_mem dx, size_t offdx)
{
    int vk = djit_vk(dev, s->C), KP = CLG_CEIL_DIV(s->C, vk) * vk;
    char lopts[2400];
    ph_wt_opts(lopts, sizeof lopts, dev, s, KP);
    ph_ctx pc = {s, w, offw, lopts, KP};
    cl_mem U = NULL;
    int tmp = 0;
    /* the flipped slot: a strided layer never takes the stride-1 flipped layout */
    CLG_TRY(clg_conv_cached_filters(dev, cache, CLG_CONV_DIRECT, 1, sizeof(float) * (size_t)KP * s->K * s->R * s->S,
                                    build_wt_phases, &pc, &U, &tmp));
    clg_status st = CLG_OK;
    int taps = 0;
    for (int a = 0; a < s->stride_h && st == CLG_OK; a++)
        for (int b = 0; b < s->stride_w && st == CLG_OK; b++) {
            st = ph_launch(dev, s, a, b, taps * KP * s->K, dy, offdy, U, dx, offdx);
            taps += ph_taps(a, s->R, s->stride_h, s->pad_h) * ph_taps(b, s->S, s->stride_w, s->pad_w);
        }
    if (tmp)
        clg_buf_release(dev, U);
    return st;
}

/* A strided 1x1 window without padding (ResNet's projections): its
 * backward-data is a 1x1 stride-1 forward convolution of dy (a GEMM over
 * the channels) stored at every stride-th position of dx, zeros between
 * (dconv_fwdk with ZFILL: one pass over dx, none of dconv_bwdd's row
 * vectors spent on positions no tap reaches). */
int clg_conv_s1x1(const clg_conv_shape *s)
{
    return s->R == 1 && s->S == 1 && s->pad_h == 0 && s->pad_w == 0 && (s->stride_h > 1 || s->stride_w > 1);
}

clg_status clg_conv_djit_bwd_data(clg_device *dev, const clg_conv_shape *s, clg_conv_cache *cache, cl_mem dy,
                                  size_t offdy, cl_mem w, size_t offw, cl_mem dx, size_t offdx)
{
    /* stride 1: a forward convolution of dy with the flipped, transposed filters */
    clg_conv_shape fs = *s;
    fs.C = s->K;
    fs.K = s->C;
    fs.H = clg_conv_out_h(s);
    fs.W = clg_conv_out_w(s);
    fs.pad_h = s->R - 1 - s->pad_h;
    fs.pad_w = s->S - 1 - s->pad_w;
    if (s->stride_h == 1 && s->stride_w == 1 && s->pad_h < s->R && s->pad_w < s->S && use_fwdk(dev, &fs))
        return djit_fwdk(dev, &fs, 1, "", cache, dy, offdy, w, offw, NULL, 0, 0, dx, offdx);
    if (clg_conv_s1x1(s)) { /* dy's products land on phase (0, 0) of dx; the same work-items zero the rest */
        char extra[120];
        snprintf(extra, sizeof extra, " -D ZFILL -D OSH=%d -D OSW=%d -D OPH=0 -D OPW=0 -D OH=%d -D OW=%d",
                 s->stride_h, s->stride_w, s->H, s->W);
        fs.stride_h = fs.stride_w = 1;
        return djit_fwdk(dev, &fs, 1, extra, cache, dy, offdy, w, offw, NULL, 0, 0, dx, offdx);
    }
    if (use_phases(dev, s, &fs))
        return djit_bwdd_phases(dev, s, cache, dy, offdy, w, offw, dx, offdx);
    int vw = djit_vw(dev);
    /* a run covers stride_w phases of QT columns each */
    int nv = djit_nv(CLG_CEIL_DIV(s->W, s->stride_w), vw);
    int cb = djit_block(s->C, vw == 1 ? 8 : CLG_MAX(1, 16 / (nv * s->stride_w)));
    char opts[320];
    shape_opts(opts, sizeof opts, s, vw, nv, "CB", cb);
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "conv_direct", opts, "dconv_bwdd", &k));
    clg_kargs a = {k, 0, CL_SUCCESS};
    clg_ka_int(&a, s->N);
    clg_ka_mem(&a, dy);
    clg_ka_int(&a, (int)offdy);
    clg_ka_mem(&a, w);
    clg_ka_int(&a, (int)offw);
    clg_ka_mem(&a, dx);
    clg_ka_int(&a, (int)offdx);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &a, "dconv_bwdd args"));
    size_t gws[3], lws[3];
    clg_conv_geom(dev, k, CLG_CEIL_DIV(s->W, s->stride_w * vw * nv), s->H, s->N * CLG_CEIL_DIV(s->C, cb), gws, lws);
    return clg_conv_enqueue(dev, k, 3, gws, lws);
}

clg_status clg_conv_djit_bwd_filter(clg_device *dev, const clg_conv_shape *s, cl_mem x, size_t offx, cl_mem dy,
                                    size_t offdy, float beta, cl_mem dw, size_t offdw, cl_mem db, size_t offdb)
{
    int P = clg_conv_out_h(s), Q = clg_conv_out_w(s), RS = s->R * s->S, CRS = s->C * RS;
    int vw = djit_vw(dev);
    /* channel vectors of 4, 8 or 16 (at most the device's width) */
    int vk = djit_vk(dev, s->K);
    int KP = CLG_CEIL_DIV(s->K, vk) * vk;
    /* channel vectors per work-item: reuse each input value for up to 4
     * vectors while the accumulators stay within ~28 registers */
    int kvb = 1;
    for (int b = 4; b > 1; b--)
        if ((KP / vk) % b == 0 && b * RS <= 28) {
            kvb = b;
            break;
        }
    /* input channels per work-item: each dy vector serves several channels'
     * taps where few taps leave registers over (1x1 windows: a dy load per
     * FMA, and every channel's work-item read the chunk's dy again) */
    int bcb = 1;
    for (int b = 4; b > 1; b /= 2)
        if (s->C % b == 0 && kvb * RS * b <= 16) {
            bcb = b;
            break;
        }
    /* chunks of images: the transposed gradient of a chunk stays in the
     * last-level cache (4 MiB) while the work-items of every input channel
     * read it, and at least ~64 work-items keep every core busy (measured:
     * 256 KiB chunks were 5-15% slower in total, the partial sums costing
     * more than the cache saved); on a device of one compute unit (PoCL's
     * `basic`) the work-items run one after another, so only the cache
     * budget splits the batch: every further chunk is a partial to write
     * and sum */
    int blocks = KP / vk / kvb * (s->C / bcb);
    size_t budget = (size_t)4 << 20;
    int nper = (int)CLG_MAX(1, CLG_MIN((size_t)s->N, budget / ((size_t)P * Q * KP * sizeof(float))));
    if (dev->info.compute_units != 1)
        nper = CLG_MIN(nper, CLG_MAX(1, s->N / CLG_CEIL_DIV(64, blocks)));
    int chunks = CLG_CEIL_DIV(s->N, nper);
    /* one chunk: the sums go straight to dw and db (no partials, no reduction launches) */
    int direct = chunks == 1;
    char opts[320];
    int n = shape_opts(opts, sizeof opts, s, vw, 1, "VK", vk);
    snprintf(opts + n, sizeof opts - (size_t)n, " -D KVB=%d -D BCB=%d%s%s", kvb, bcb, direct ? " -D WDIRECT" : "",
             direct && db ? " -D HASDB" : "");
    cl_kernel kt, k;
    CLG_TRY(clg_kernel_get(dev, "conv_direct", opts, "dconv_dyt", &kt));
    CLG_TRY(clg_kernel_get(dev, "conv_direct", opts, "dconv_bwdf", &k));
    cl_mem part = NULL, dyt = NULL;
    if (!direct)
        CLG_TRY(clg_buf_alloc(dev, sizeof(float) * (size_t)chunks * s->K * (CRS + 1), &part));
    clg_status st = clg_buf_alloc(dev, sizeof(float) * (size_t)s->N * P * Q * KP, &dyt);
    if (st == CLG_OK) {
        clg_kargs a = {kt, 0, CL_SUCCESS};
        clg_ka_mem(&a, dy);
        clg_ka_int(&a, (int)offdy);
        clg_ka_int(&a, s->N);
        clg_ka_mem(&a, dyt);
        st = CLG_KA_DONE(clg_dev_err(dev), &a, "dconv_dyt args");
    }
    if (st == CLG_OK) {
        size_t gws[3], lws[3];
        clg_conv_geom(dev, kt, P * Q, s->N, 1, gws, lws);
        clg_conv_prof(dev, NULL);
        st = clg_conv_enqueue(dev, kt, 2, gws, lws);
        clg_conv_prof(dev, "djit dy transpose");
    }
    if (st == CLG_OK) {
        clg_kargs a = {k, 0, CL_SUCCESS};
        clg_ka_mem(&a, x);
        clg_ka_int(&a, (int)offx);
        clg_ka_mem(&a, dyt);
        clg_ka_int(&a, s->N);
        clg_ka_int(&a, nper);
        clg_ka_mem(&a, direct ? dw : part);
        if (direct) {
            clg_ka_int(&a, (int)offdw);
            clg_ka_mem(&a, db ? db : dw); /* (not read without HASDB) */
            clg_ka_int(&a, (int)offdb);
            clg_ka_float(&a, beta);
        }
        st = CLG_KA_DONE(clg_dev_err(dev), &a, "dconv_bwdf args");
    }
    if (st == CLG_OK) {
        size_t gws[3] = {(size_t)(KP / vk / kvb), (size_t)(s->C / bcb), (size_t)chunks};
        st = clg_conv_enqueue(dev, k, 3, gws, NULL);
        clg_conv_prof(dev, "djit bwdf");
    }
    if (st == CLG_OK && !direct) {
        st = clg_conv_part_reduce_wb(dev, part, chunks, s->K, CRS, beta, dw, offdw, db, offdb);
        clg_conv_prof(dev, "djit bwdf reduce");
    }
    clg_buf_release(dev, dyt);
    clg_buf_release(dev, part);
    return st;
}
