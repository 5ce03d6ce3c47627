/* Fused Winograd weight gradient, F(3x3, 2x2) and F(3x3, 4x4), for 3x3
 * stride-1 convolutions (cl/winograd_wgrad.cl): the backward-filter pass of
 * algorithms `winograd-fused` (m = 2) and `winograd4-fused` (m = 4, 36
 * products per 4x4 tile). One launch transforms
 * the input patches and dy tiles chunk by chunk into a per-work-item scratch
 * that stays in the core's cache and reduces them there (16 products of
 * K x C per tile instead of the 36 multiplies per (k, c) of a direct
 * kernel); a second, small launch sums the work-items' partials and applies
 * the output transform (on a device of one compute unit, one work-item
 * whose kernel applies it at its end: one launch fewer per call). No transform-domain tensor of the whole batch is
 * written to memory, unlike the separate design (conv_wino.c). The bias
 * gradient comes with it: the dy transform's point (1, 1) is each tile's
 * sum of dy, summed per chunk beside the products (K x tiles additions
 * against 16-36 x K x C products), instead of two more launches that read
 * dy again (bias_part, part_reduce). */
#include "conv_impl.h"

/* Scratch floats per work-item: the transforms of one chunk of tiles (C + K
 * rows of 16 transform points) within about 1 MiB. The products read one
 * transform point's rows at a time, 1/16 of it (64 KiB, within a core's L2);
 * longer chunks mean fewer passes over the partial and fewer lane sums
 * (measured 5-12% faster at 16-32 channels than 256 KiB). */
#define WG_SCRATCH_FLOATS (256 * 1024)
/* F(3x3, 4x4): half of that, its partial being 2.25x larger (36 x K x C;
 * measured at least as fast as 1 MiB at 16-32 channels, 2 MiB slower), but
 * at least 8 groups (64 tiles) a chunk: shorter chunks pass over the
 * partial and sum lanes too often (64 channels: 3 groups 4.7 ms, 8 groups
 * 4.3, 16 groups 4.9) */
#define WG4_SCRATCH_FLOATS (128 * 1024)
#define WG4_MIN_GROUPS 8L

/* Largest C*K: every work-item keeps a 16 (F(2x2)) or 36 (F(4x4)) x K x C
 * partial (16 or 36 MiB at 512 x 512). */
#define WG_MAX_CK (512L * 512L)

int clg_conv_wgrad_ok(const clg_conv_shape *s)
{
    return s->R == 3 && s->S == 3 && s->stride_h == 1 && s->stride_w == 1 && s->dil_h == 1 && s->dil_w == 1 &&
           s->groups == 1 && (long)s->C * s->K <= WG_MAX_CK;
}

/* Launch plan of one weight gradient: m = 2 (wg_f2) or 4 (wg_f4). */
typedef struct {
    int P, Q, TH, TWG, VL, VR, Cp, Kp, nw, GC, xi, NTH;
    long G;
    size_t sws, msz;
} wg_plan;

static void wg_make_plan(const clg_device *dev, const clg_conv_shape *s, int m, wg_plan *p)
{
    p->P = clg_conv_out_h(s), p->Q = clg_conv_out_w(s);
    int TH = CLG_CEIL_DIV(p->P, m), TW = CLG_CEIL_DIV(p->Q, m);
    p->xi = (m + 2) * (m + 2);
    if (m == 2) {
        /* groups of VL tiles: 8 in one tile row, or (outputs of 8 columns or
         * fewer) 4 in each of VR = 2 tile rows, 4 in one where there is one */
        p->VL = TW <= 4 && TH == 1 ? 4 : 8, p->VR = TW <= 4 && TH > 1 ? 2 : 1;
        p->TH = CLG_CEIL_DIV(TH, p->VR);
        p->TWG = CLG_CEIL_DIV(TW, p->VL / p->VR);
        p->G = (long)s->N * p->TH * p->TWG;
    } else {
        /* groups of 8 tiles: VR segments of 8 / VR tiles (2 or 4 where a row
         * has that few), each in its own tile row of the batch */
        p->VL = 8, p->VR = TW <= 2 ? 4 : TW <= 4 ? 2 : 1;
        p->TH = TH;
        p->TWG = CLG_CEIL_DIV(TW, 8 / p->VR);
        p->G = CLG_CEIL_DIV((long)s->N * TH, p->VR) * p->TWG;
    }
    p->NTH = (int)CLG_MIN((long)INT_MAX, (long)s->N * TH);
    p->Cp = CLG_CEIL_DIV(s->C, 4) * 4, p->Kp = CLG_CEIL_DIV(s->K, 4) * 4;
    /* work-items: several per compute unit so that a core slowed by other
     * work does not hold up the rest, fewer when their partials (xi x K x C
     * each, written and summed) would cost more than they balance; one on a
     * device of one compute unit (PoCL's `basic`), which runs them one after
     * another: there is nothing to balance, and every further partial is a
     * fixed cost per call (2-7 of 150-600 KiB each at 32-64 channels, the
     * batch-64 lanes of two devices paying it twice per 128 images) */
    p->msz = (size_t)p->xi * p->Kp * p->Cp;
    long cu = (long)CLG_MAX(1u, dev->info.compute_units);
    p->nw = cu == 1 ? 1 : (int)CLG_MIN(p->G, CLG_MIN(8 * cu, CLG_MAX(2 * cu, (long)((1u << 18) / p->msz))));
    /* tiles per chunk: within the scratch budget, at least one group, no more than a work-item's share */
    long per_group = (long)p->xi * (p->Cp + p->Kp) * p->VL;
    long budget = m == 4 ? CLG_MAX((long)WG4_SCRATCH_FLOATS, WG4_MIN_GROUPS * per_group) : WG_SCRATCH_FLOATS;
    p->GC = (int)CLG_MAX(1L, CLG_MIN((long)CLG_CEIL_DIV(p->G, p->nw), budget / per_group));
    p->sws = (size_t)per_group * (p->GC + 1); /* + 1: the kernel's row skew */
    if (m == 4) { /* wg_f4's transform-point stride: an odd count of 16 floats */
        long TC = p->GC * 8L + 8;
        p->sws = 36 * (size_t)(((p->Cp * TC + 15) / 16 | 1) * 16 + ((p->Kp * TC + 15) / 16 | 1) * 16);
    }
}

clg_status clg_conv_wgrad_bwd_filter(clg_device *dev, const clg_conv_shape *s, int m, cl_mem x, size_t offx,
                                     cl_mem dy, size_t offdy, float beta, cl_mem dw, size_t offdw, cl_mem db,
                                     size_t offdb)
{
    clg_err *err = clg_dev_err(dev);
    const char *name = m == 4 ? "winograd4-fused" : "winograd-fused";
    if (!clg_conv_wgrad_ok(s) || (m != 2 && m != 4))
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "%s: the weight gradient needs a 3x3 stride-1 filter (groups 1, dilation 1) "
                           "with at most 512 x 512 channels", name);
    wg_plan p;
    wg_make_plan(dev, s, m, &p);
    size_t xn = (size_t)s->N * s->C * s->H * s->W, dyn = (size_t)s->N * s->K * p.P * p.Q;
    /* per work-item: the products' partial, then with db the bias's (K x VL lane sums) */
    size_t ps = p.msz + (db ? (size_t)s->K * p.VL : 0);
    if (p.G > INT_MAX || offx + xn > INT_MAX || offdy + dyn > INT_MAX || offdw + (size_t)s->K * s->C * 9 > INT_MAX ||
        (db && offdb + (size_t)s->K > INT_MAX) || p.sws * p.nw > INT_MAX || ps * p.nw > INT_MAX ||
        (long)s->N * CLG_CEIL_DIV(p.P, m) > INT_MAX)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "%s: weight gradient of %d images x %d x %d channels "
                           "exceeds 2^31 elements", name, s->N, s->C, s->K);
    char opts[64];
    if (m == 4) /* WG_PF: prefetch (CPUs) */
        snprintf(opts, sizeof opts, "-D VL=8 -D VR=1 -D VR4=%d -D WG_PF=%d", p.VR,
                 (dev->info.type & CLG_DEVICE_CPU) != 0);
    else
        snprintf(opts, sizeof opts, "-D VL=%d -D VR=%d -D WG_PF=%d", p.VL, p.VR,
                 (dev->info.type & CLG_DEVICE_CPU) != 0);
    cl_kernel k, ko;
    CLG_TRY(clg_kernel_get(dev, "winograd_wgrad", opts, m == 4 ? "wg_f4" : "wg_f2", &k));
    CLG_TRY(clg_kernel_get(dev, "winograd_wgrad", opts, m == 4 ? "wg_f4_out" : "wg_f2_out", &ko));
    cl_mem scratch = NULL, part = NULL;
    clg_status st = clg_buf_alloc(dev, sizeof(float) * p.sws * p.nw, &scratch);
    if (st == CLG_OK)
        st = clg_buf_alloc(dev, sizeof(float) * ps * p.nw, &part);
    if (st == CLG_OK) {
        clg_kargs a = {k, 0, CL_SUCCESS};
        clg_ka_mem(&a, x);
        clg_ka_int(&a, (int)offx);
        clg_ka_mem(&a, dy);
        clg_ka_int(&a, (int)offdy);
        clg_ka_int(&a, s->C);
        clg_ka_int(&a, s->H);
        clg_ka_int(&a, s->W);
        clg_ka_int(&a, s->K);
        clg_ka_int(&a, p.P);
        clg_ka_int(&a, p.Q);
        clg_ka_int(&a, s->pad_h);
        clg_ka_int(&a, s->pad_w);
        clg_ka_int(&a, p.TH);
        clg_ka_int(&a, p.TWG);
        clg_ka_int(&a, (int)p.G);
        clg_ka_int(&a, p.GC);
        clg_ka_int(&a, p.Cp);
        clg_ka_int(&a, p.Kp);
        clg_ka_mem(&a, scratch);
        clg_ka_int(&a, (int)p.sws);
        clg_ka_mem(&a, part);
        if (m == 4)
            clg_ka_int(&a, p.NTH);
        clg_ka_int(&a, (int)ps);
        clg_ka_int(&a, db != NULL);
        clg_ka_int(&a, p.nw == 1); /* one work-item: it applies the output transform itself */
        clg_ka_float(&a, beta);
        clg_ka_mem(&a, dw);
        clg_ka_int(&a, (int)offdw);
        clg_ka_mem(&a, db ? db : part);
        clg_ka_int(&a, db ? (int)offdb : 0);
        st = CLG_KA_DONE(err, &a, "wg_f args");
    }
    if (st == CLG_OK) {
        size_t gws = (size_t)p.nw, lws = 1;
        clg_conv_prof(dev, NULL);
        st = clg_conv_enqueue(dev, k, 1, &gws, &lws);
        clg_conv_prof(dev, "wgrad reduce");
    }
    if (st == CLG_OK && p.nw > 1) {
        clg_kargs a = {ko, 0, CL_SUCCESS};
        clg_ka_mem(&a, part);
        clg_ka_int(&a, p.nw);
        clg_ka_int(&a, s->K);
        clg_ka_int(&a, s->C);
        clg_ka_int(&a, p.Kp);
        clg_ka_int(&a, p.Cp);
        clg_ka_float(&a, beta);
        clg_ka_mem(&a, dw);
        clg_ka_int(&a, (int)offdw);
        clg_ka_int(&a, (int)ps);
        clg_ka_int(&a, db != NULL);
        clg_ka_mem(&a, db ? db : part);
        clg_ka_int(&a, db ? (int)offdb : 0);
        st = CLG_KA_DONE(err, &a, "wg_f_out args");
        size_t gws[2] = {(size_t)p.Cp / 4, (size_t)s->K};
        if (st == CLG_OK)
            st = clg_launch(dev, ko, 2, gws, NULL, CLG_LAUNCH_PAD, NULL);
        clg_conv_prof(dev, "wgrad output");
    }
    clg_buf_release(dev, scratch);
    clg_buf_release(dev, part);
    return st;
}
