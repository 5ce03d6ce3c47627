/* GEMM launcher: argument checks, backend choice (own kernels, CLBlast,
 * reference), parameter sets of the own kernels and their packing. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "clg_config.h"
#include "gemm.h"
#include "gemm_splitk.h"
#include "nn.h"
#include "tune.h"

#if CLG_HAVE_CLBLAST
#include <clblast_c.h>
#endif

void clg_gemm_args_init(clg_gemm_args *a)
{
    memset(a, 0, sizeof *a);
    a->alpha = 1.0f;
    a->beta = 0.0f;
    a->batch = 1;
}

static clg_status check_args(clg_device *dev, const clg_gemm_args *a)
{
    clg_err *err = clg_dev_err(dev);
    if (a->M < 0 || a->N < 0 || a->K < 0 || a->batch < 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: negative size M=%d N=%d K=%d batch=%d", a->M, a->N,
                           a->K, a->batch);
    if (!a->A || !a->B || !a->C)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: NULL buffer");
    int colsA = a->ta ? a->M : a->K;
    int colsB = a->tb ? a->K : a->N;
    if (a->lda < CLG_MAX(1, colsA) || a->ldb < CLG_MAX(1, colsB) || a->ldc < CLG_MAX(1, a->N))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: leading dimension too small (lda=%d ldb=%d ldc=%d)",
                           a->lda, a->ldb, a->ldc);
    if (a->bias_mode != CLG_BIAS_NONE && !a->bias)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: bias mode set without a bias buffer");
    if (a->gelu < 0 || a->gelu > 4)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: unknown GELU epilogue %d", a->gelu);
    if (a->gelu && (!a->pre || (a->batch > 1) || a->ldc != a->N))
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "gemm: the GELU epilogue needs a pre-activation buffer, batch 1 and ldc = N");
    if (a->bias_mode < CLG_BIAS_NONE || a->bias_mode > CLG_BIAS_COL)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: unknown bias mode %d", (int)a->bias_mode);
    /* The kernels take offsets, strides and leading dimensions as int. */
    int batch = a->batch > 0 ? a->batch : 1;
    size_t lim = (size_t)INT_MAX;
    if (a->offA > lim || a->offB > lim || a->offC > lim || a->offBias > lim || a->strideA > lim ||
        a->strideB > lim || a->strideC > lim ||
        (size_t)(a->ta ? a->K : a->M) * (size_t)a->lda > lim || (size_t)(a->tb ? a->N : a->K) * (size_t)a->ldb > lim ||
        (size_t)a->M * (size_t)a->ldc > lim || (size_t)(batch - 1) * a->strideC + a->offC > lim ||
        (size_t)(batch - 1) * a->strideA + a->offA > lim || (size_t)(batch - 1) * a->strideB + a->offB > lim)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "gemm: operands beyond 2^31 elements are not supported");
    return CLG_OK;
}

/* Events: the first enqueued kernel goes to *first (when asked), the last to
 * *last. ev_slot returns where the next kernel's event should go. */
typedef struct evs {
    cl_event *first, *last;
    cl_event tmp;
    int n;
} evs;

static clg_status enqueue(clg_device *dev, cl_kernel k, cl_uint dims, const size_t *gws, const size_t *lws,
                          unsigned flags, evs *ev)
{
    cl_event e = NULL;
    CLG_TRY(clg_launch(dev, k, dims, gws, lws, flags, &e));
    if (!e) /* empty range: nothing enqueued */
        return CLG_OK;
    if (ev->n == 0 && ev->first) {
        *ev->first = e;
        clRetainEvent(e);
    }
    ev->n++;
    if (ev->tmp)
        clReleaseEvent(ev->tmp);
    ev->tmp = e;
    return CLG_OK;
}

/* Hands the last event to the caller (or drops it). */
static void ev_finish(evs *ev, clg_status st)
{
    if (st == CLG_OK && ev->last) {
        *ev->last = ev->tmp;
        ev->tmp = NULL;
    }
    if (ev->tmp)
        clReleaseEvent(ev->tmp);
    ev->tmp = NULL;
    if (st != CLG_OK && ev->first && *ev->first) {
        clReleaseEvent(*ev->first);
        *ev->first = NULL;
    }
}

/* ---- reference backend ---- */

void clg_gemm_ka_inputs(clg_kargs *g, const clg_gemm_args *a)
{
    clg_ka_mem(g, a->A);
    clg_ka_int(g, (int)a->offA);
    clg_ka_int(g, a->lda);
    clg_ka_int(g, (int)a->strideA);
    clg_ka_mem(g, a->B);
    clg_ka_int(g, (int)a->offB);
    clg_ka_int(g, a->ldb);
    clg_ka_int(g, (int)a->strideB);
}

void clg_gemm_ka_output(clg_kargs *g, const clg_gemm_args *a)
{
    clg_ka_mem(g, a->C);
    clg_ka_int(g, (int)a->offC);
    clg_ka_int(g, a->ldc);
    clg_ka_int(g, (int)a->strideC);
    clg_ka_mem(g, a->bias ? a->bias : a->C);
    clg_ka_int(g, (int)a->offBias);
    clg_ka_int(g, (int)a->bias_mode);
    clg_ka_int(g, a->relu);
}

/* The unpacked-operand arguments shared by gemm_ref and gemm_dot. */
static void ka_operands(clg_kargs *g, const clg_gemm_args *a)
{
    clg_gemm_ka_inputs(g, a);
    clg_gemm_ka_output(g, a);
}

static clg_status gemm_ref(clg_device *dev, const clg_gemm_args *a, evs *ev)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "gemm", "", "gemm_ref", &k));
    int batch = a->batch > 0 ? a->batch : 1;
    clg_kargs g = {k, 0, CL_SUCCESS};
    clg_ka_int(&g, a->M);
    clg_ka_int(&g, a->N);
    clg_ka_int(&g, a->K);
    clg_ka_float(&g, a->alpha);
    clg_ka_float(&g, a->beta);
    clg_ka_int(&g, a->ta);
    clg_ka_int(&g, a->tb);
    ka_operands(&g, a);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &g, "arguments of gemm_ref"));
    size_t gws[3] = {(size_t)a->N, (size_t)a->M, (size_t)batch};
    return enqueue(dev, k, 3, gws, NULL, CLG_LAUNCH_PAD, ev);
}

/* ---- parameter sets ---- */

int clg_gemm_cpu_wide(const clg_device *dev)
{
    return clg_str_icontains(dev->info.name, "avx512") || clg_str_icontains(dev->info.name, "znver4") ||
           clg_str_icontains(dev->info.name, "sapphirerapids") || clg_str_icontains(dev->info.name, "icelake");
}

void clg_gemm_params_default(const clg_device *dev, clg_gemm_params *p)
{
    memset(p, 0, sizeof *p);
    if (dev->info.type & CLG_DEVICE_CPU) {
        /* AVX-512 (32 vector registers of 16 floats): 8 x 32 tile, 16
         * accumulators; otherwise an AVX2-sized 6 x 16 tile of float8. */
        int wide = clg_gemm_cpu_wide(dev);
        p->family = CLG_GEMM_FAM_CPU;
        p->MR = wide ? 8 : 6;
        p->NV = 2;
        p->VW = wide ? 16 : 8;
        p->WGS = 1;
        p->KS = 0;
        return;
    }
    /* GPUs: the tiled family, MWG x NWG per work-group of MDIMC x NDIMC,
     * the largest of these that fits the device's limits (docs/portability.md, GPU
     * portability): NVIDIA / AMD 64x64 tiles of 16x16 work-items with 4x4
     * float4 register tiles; Intel (SIMD8-32, local memory shared with L3)
     * 32x32 of 8x8; other GPUs 64x64 of 16x16 with 2-wide vectors. */
    static const int sets[][5] = {
        /* MWG(=NWG) MDIMC(=NDIMC) VW KWG PAD */
        {64, 16, 4, 16, 1}, /* 0: NVIDIA, AMD */
        {64, 16, 2, 16, 1}, /* 1: other GPUs */
        {32, 8, 2, 16, 1},  /* 2: Intel; fallback below 256 work-items or 16 KiB */
        {16, 4, 2, 16, 0},  /* 3: fallback below 64 work-items */
    };
    clg_vendor vendor = clg_device_vendor(dev);
    int first = vendor == CLG_VENDOR_INTEL ? 2 : vendor == CLG_VENDOR_NVIDIA || vendor == CLG_VENDOR_AMD ? 0 : 1;
    size_t maxwg = dev->info.max_work_group_size ? dev->info.max_work_group_size : 1;
    uint64_t lmem = dev->info.local_mem_bytes;
    for (int i = first; i < (int)CLG_ARRAY_LEN(sets); i++) {
        const int *t = sets[i];
        size_t wi = (size_t)t[1] * (size_t)t[1];
        uint64_t need = 4ull * (uint64_t)t[3] * (uint64_t)(2 * (t[0] + t[4]));
        size_t d0 = dev->max_item[0] ? dev->max_item[0] : maxwg, d1 = dev->max_item[1] ? dev->max_item[1] : maxwg;
        /* keep a quarter of local memory free for the runtime and a second group per compute unit */
        if (wi > maxwg || (size_t)t[1] > d0 || (size_t)t[1] > d1 || (lmem && need > lmem / 4 * 3))
            continue;
        p->family = CLG_GEMM_FAM_TILED;
        p->MWG = p->NWG = t[0];
        p->MDIMC = p->NDIMC = t[1];
        p->VWM = p->VWN = t[2];
        p->KWG = t[3];
        p->PADA = p->PADB = t[4];
        return;
    }
    p->family = CLG_GEMM_FAM_REF; /* a device below 16 work-items per group */
}

static int pow2_in(int v, int lo, int hi)
{
    return v >= lo && v <= hi && (v & (v - 1)) == 0;
}

clg_status clg_gemm_params_check(clg_device *dev, const clg_gemm_params *p)
{
    clg_err *err = clg_dev_err(dev);
    size_t maxwg = dev->info.max_work_group_size ? dev->info.max_work_group_size : 1;
    switch (p->family) {
    case CLG_GEMM_FAM_REF:
        return CLG_OK;
    case CLG_GEMM_FAM_CPU:
        if (p->MR < 1 || p->MR > 16 || p->NV < 1 || p->NV > 8 || !(p->VW == 4 || p->VW == 8 || p->VW == 16) ||
            p->MR * p->NV > 64 || p->WGS < 1 || (size_t)p->WGS > maxwg || p->KS < 0 || p->KS > 64)
            return clg_err_set(err, CLG_ERR_INVALID_ARG,
                               "gemm: invalid CPU kernel parameters MR=%d NV=%d VW=%d WGS=%d KS=%d", p->MR, p->NV,
                               p->VW, p->WGS, p->KS);
        return CLG_OK;
    case CLG_GEMM_FAM_TILED: {
        if (p->MDIMC < 1 || p->NDIMC < 1 || !pow2_in(p->VWM, 2, 8) || !pow2_in(p->VWN, 2, 8) || p->KWG < 1 ||
            p->MWG < 1 || p->NWG < 1 || p->MWG % (p->MDIMC * p->VWM) || p->NWG % (p->NDIMC * p->VWN) ||
            p->PADA < 0 || p->PADA > 8 || p->PADB < 0 || p->PADB > 8 || p->MWG > 256 || p->NWG > 256 ||
            p->KWG > 64 || (size_t)p->MDIMC * (size_t)p->NDIMC > maxwg ||
            (dev->max_item[0] && (size_t)p->MDIMC > dev->max_item[0]) ||
            (dev->max_item[1] && (size_t)p->NDIMC > dev->max_item[1]) ||
            (p->MWG / p->MDIMC) * (p->NWG / p->NDIMC) > 256)
            return clg_err_set(err, CLG_ERR_INVALID_ARG,
                               "gemm: invalid tiled kernel parameters MWG=%d NWG=%d KWG=%d MDIMC=%d NDIMC=%d "
                               "VWM=%d VWN=%d PADA=%d PADB=%d",
                               p->MWG, p->NWG, p->KWG, p->MDIMC, p->NDIMC, p->VWM, p->VWN, p->PADA, p->PADB);
        uint64_t lmem = 4ull * (uint64_t)p->KWG * (uint64_t)(p->MWG + p->PADA + p->NWG + p->PADB);
        if (dev->info.local_mem_bytes && lmem > dev->info.local_mem_bytes)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: tiled kernel needs %llu bytes of local memory, %s has %llu",
                               (unsigned long long)lmem, dev->info.name,
                               (unsigned long long)dev->info.local_mem_bytes);
        return CLG_OK;
    }
    default:
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm: unknown kernel family %d", p->family);
    }
}

void clg_gemm_params_options(const clg_gemm_params *p, char *buf, size_t len)
{
    if (p->family == CLG_GEMM_FAM_CPU)
        snprintf(buf, len, "-D GEMM_CPU -D MR=%d -D NV=%d -D VW=%d", p->MR, p->NV, p->VW);
    else if (p->family == CLG_GEMM_FAM_TILED)
        snprintf(buf, len,
                 "-D GEMM_TILED -D MWG=%d -D NWG=%d -D KWG=%d -D MDIMC=%d -D NDIMC=%d -D VWM=%d -D VWN=%d "
                 "-D PADA=%d -D PADB=%d",
                 p->MWG, p->NWG, p->KWG, p->MDIMC, p->NDIMC, p->VWM, p->VWN, p->PADA, p->PADB);
    else
        snprintf(buf, len, "%s", "");
}

void clg_gemm_params_str(const clg_gemm_params *p, char *buf, size_t len)
{
    if (p->family == CLG_GEMM_FAM_CPU)
        snprintf(buf, len, "cpu MR=%d NV=%d VW=%d WGS=%d KS=%d", p->MR, p->NV, p->VW, p->WGS, p->KS);
    else if (p->family == CLG_GEMM_FAM_TILED)
        snprintf(buf, len, "tiled MWG=%d NWG=%d KWG=%d MDIMC=%d NDIMC=%d VWM=%d VWN=%d PADA=%d PADB=%d", p->MWG,
                 p->NWG, p->KWG, p->MDIMC, p->NDIMC, p->VWM, p->VWN, p->PADA, p->PADB);
    else
        snprintf(buf, len, "ref");
}

#define PARAM_FIELDS(X)                                                                                     \
    X(family) X(MR) X(NV) X(VW) X(WGS) X(KS) X(MWG) X(NWG) X(KWG) X(MDIMC) X(NDIMC) X(VWM) X(VWN) X(PADA) \
        X(PADB)

void clg_gemm_params_to_entry(const clg_gemm_params *p, clg_tune_entry *e)
{
#define X(f) clg_tune_set(e, #f, p->f);
    if (p->family == CLG_GEMM_FAM_CPU) {
        X(family) X(MR) X(NV) X(VW) X(WGS) X(KS)
    } else {
        PARAM_FIELDS(X)
    }
#undef X
}

int clg_gemm_params_from_entry(const clg_tune_entry *e, clg_gemm_params *p)
{
    if (!e || clg_tune_param(e, "family", -1) < 0)
        return 0;
    memset(p, 0, sizeof *p);
#define X(f) p->f = (int)clg_tune_param(e, #f, 0);
    PARAM_FIELDS(X)
#undef X
    return 1;
}

static int bucket(int x)
{
    int b = 0;
    for (long lim = 8; x > lim && b < 5; lim *= 4)
        b++;
    return b;
}

void clg_gemm_class(int M, int N, int K, char *buf, size_t len)
{
    snprintf(buf, len, "M%dN%dK%d", bucket(M), bucket(N), bucket(K));
}

/* Own measurements (exact class, then the nearest class), then the family's
 * shipped entries (same order), then the built-in defaults. Returns where
 * the set came from (CLG_GEMM_SRC_*). */
int clg_gemm_params_src(clg_device *dev, int M, int N, int K, clg_gemm_params *p)
{
    int bm = bucket(M), bn = bucket(N), bk = bucket(K);
    const clg_tune_entry *e = clg_tune_nearest_gemm(clg_tune_dev_get(dev), bm, bn, bk);
    if (e && clg_gemm_params_from_entry(e, p) && clg_gemm_params_check(dev, p) == CLG_OK)
        return CLG_GEMM_SRC_OWN;
    clg_tune_family *f = clg_tune_family_get(dev);
    e = f ? clg_tune_nearest_gemm(&f->d, bm, bn, bk) : NULL;
    if (e && clg_gemm_params_from_entry(e, p) && clg_gemm_params_check(dev, p) == CLG_OK)
        return CLG_GEMM_SRC_FAMILY;
    clg_gemm_params_default(dev, p);
    return CLG_GEMM_SRC_DEFAULT;
}

void clg_gemm_params_for(clg_device *dev, int M, int N, int K, clg_gemm_params *p)
{
    clg_err saved = dev->err; /* a rejected stored set is not the caller's error */
    int src = clg_gemm_params_src(dev, M, N, K, p);
    dev->err = saved;
    char cls[32], key[64];
    clg_gemm_class(M, N, K, cls, sizeof cls);
    snprintf(key, sizeof key, "gemm/%s", cls);
    if (src != CLG_GEMM_SRC_OWN || !clg_tune_find(dev, key))
        clg_tune_note_pending(dev, cls, M, N, K);
}

/* ---- own backend ---- */

typedef struct scratch {
    cl_mem m[3];
} scratch;

static void scratch_release(clg_device *dev, scratch *s)
{
    for (int i = 0; i < 3; i++)
        clg_buf_release(dev, s->m[i]);
}

/* One operand to pack (its panels of P rows into D). */
typedef struct pack_op {
    int R, kmaj;
    cl_mem X;
    size_t off;
    int ld;
    size_t stride;
    int batch, P;
    cl_mem D;
    int dstride;
} pack_op;

static void ka_pack_op(clg_kargs *g, const pack_op *o)
{
    clg_ka_int(g, o->R);
    clg_ka_int(g, o->kmaj);
    clg_ka_mem(g, o->X);
    clg_ka_int(g, (int)o->off);
    clg_ka_int(g, o->ld);
    clg_ka_int(g, (int)o->stride);
    clg_ka_int(g, o->P);
    clg_ka_mem(g, o->D);
    clg_ka_int(g, o->dstride);
    clg_ka_int(g, o->batch);
}

/* Packs op(X) for one operand: R rows (M or N) x K, P rows per panel. With
 * shared (stride 0 and batch > 1) the operand is packed once. */
static clg_status pack(clg_device *dev, cl_kernel k, const pack_op *o, int K, int Kp, evs *ev)
{
    clg_kargs g = {k, 0, CL_SUCCESS};
    clg_ka_int(&g, K);
    clg_ka_int(&g, Kp);
    ka_pack_op(&g, o);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &g, "arguments of gemm_pack"));
    size_t gws[3] = {(size_t)CLG_CEIL_DIV(Kp, 16), (size_t)CLG_CEIL_DIV(o->R, o->P), (size_t)o->batch};
    return enqueue(dev, k, 3, gws, NULL, CLG_LAUNCH_PAD, ev);
}

/* Packs both operands of a product in one launch (gemm_pack2): one launch
 * fewer than two pack() calls. */
static clg_status pack2(clg_device *dev, int K, int Kp, const pack_op *a, const pack_op *b, evs *ev)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "gemm", "", "gemm_pack2", &k));
    const int pa = CLG_CEIL_DIV(a->R, a->P), pb = CLG_CEIL_DIV(b->R, b->P);
    clg_kargs g = {k, 0, CL_SUCCESS};
    clg_ka_int(&g, K);
    clg_ka_int(&g, Kp);
    clg_ka_int(&g, pa);
    ka_pack_op(&g, a);
    ka_pack_op(&g, b);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &g, "arguments of gemm_pack2"));
    size_t gws[3] = {(size_t)CLG_CEIL_DIV(Kp, 16), (size_t)pa + (size_t)pb, (size_t)CLG_MAX(a->batch, b->batch)};
    return enqueue(dev, k, 3, gws, NULL, CLG_LAUNCH_PAD, ev);
}

/* Split-K factor for the CPU family when not fixed: enough independent
 * work-items for every compute unit when the tile grid is small, and for
 * very long K chunks of about 2048 so that the work-items sharing a B chunk
 * (they run one after another) find it in cache. The partial products must
 * stay small (<= 32 MiB). */
static int auto_ks(const clg_device *dev, int tiles, int K, size_t out_elems)
{
    int cu = (int)CLG_MAX(1u, dev->info.compute_units);
    int ks = 1;
    if (tiles < 4 * cu && K >= 512)
        ks = CLG_MIN(CLG_CEIL_DIV(8 * cu, tiles), K / 256);
    if (K >= 8192 && out_elems <= ((size_t)1 << 20)) /* thin products only */
        ks = CLG_MAX(ks, CLG_CEIL_DIV(K, 2048));
    ks = CLG_MAX(1, CLG_MIN(ks, 64));
    while (ks > 1 && out_elems * (size_t)ks * sizeof(float) > ((size_t)32 << 20))
        ks--;
    return ks;
}

/* One operand of the main kernel: panel i of batch entry b at off + b *
 * stride + i * ps, depth k at k * ks. Packed: off 0, ps = Kp * P, ks = P;
 * a view in place (CPU family only) of an operand whose panel rows are
 * contiguous per k: ps = P, ks = its leading dimension. */
typedef struct panels {
    cl_mem m;
    int off, stride, ps, ks;
    int rows; /* A only: an M x K row-major operand in place (ps = MR lda, ks = 1; gemm_cpu's GEMM_AROWS) */
} panels;

static panels panels_packed(cl_mem m, int stride, int Kp, int P)
{
    panels v = {m, 0, stride, Kp * P, P, 0};
    return v;
}

/* Main kernel (+ split-K reduction) on operands in panel layout (pa, pb:
 * panels of PA/PB rows x Kp), the product's shape and epilogue come from a
 * (A/B fields unused). */
static clg_status run_packed(clg_device *dev, const clg_gemm_params *p, const clg_gemm_args *a, int Kp,
                             const panels *pa, const panels *pb, evs *ev)
{
    cl_mem Ap = pa->m;
    clg_err *err = clg_dev_err(dev);
    char opts[256];
    clg_gemm_params_options(p, opts, sizeof opts);
    cl_kernel kmain;
    int cpu = p->family == CLG_GEMM_FAM_CPU;
    if (a->gelu && !cpu)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INTERNAL, "gemm: GELU epilogue on a non-CPU family");
    if (a->gelu) { /* a variant of the kernel (its own program); the plain one is unchanged */
        size_t ol = strlen(opts);
        snprintf(opts + ol, sizeof opts - ol, " -D GEMM_GELU=%d", a->gelu);
    }
    if (cpu && pa->rows) {
        size_t ol = strlen(opts);
        snprintf(opts + ol, sizeof opts - ol, " -D GEMM_AROWS=1");
    }
    CLG_TRY(clg_kernel_get(dev, "gemm", opts, cpu ? "gemm_cpu" : "gemm_tiled", &kmain));

    const int M = a->M, N = a->N, K = a->K;
    const int batch = a->batch > 0 ? a->batch : 1;
    const int PA = cpu ? p->MR : p->MWG, PB = cpu ? p->NV * p->VW : p->NWG;
    const int Mt = CLG_CEIL_DIV(M, PA), Nt = CLG_CEIL_DIV(N, PB);
    int KS = 1, kchunk = K;
    if (cpu) {
        KS = p->KS > 0 ? p->KS : auto_ks(dev, Mt * Nt * batch, K, (size_t)batch * Mt * PA * Nt * PB);
        if (a->gelu) /* the epilogue needs whole sums */
            KS = 1;
        KS = CLG_MIN(KS, K);
        if (KS > 1) {
            kchunk = CLG_CEIL_DIV(K, KS);
            KS = CLG_CEIL_DIV(K, kchunk);
        } else {
            KS = 1;
        }
    }

    cl_mem W = NULL;
    clg_status st = CLG_OK;
    if (KS > 1 && (st = clg_buf_alloc(dev, sizeof(float) * (size_t)batch * KS * Mt * PA * Nt * PB, &W)) != CLG_OK)
        return st;
    clg_kargs g = {kmain, 0, CL_SUCCESS};
    clg_ka_int(&g, M);
    clg_ka_int(&g, N);
    clg_ka_int(&g, Kp);
    if (cpu)
        clg_ka_int(&g, Mt);
    clg_ka_float(&g, a->alpha);
    clg_ka_float(&g, a->beta);
    for (int i = 0; i < 2; i++) {
        const panels *v = i ? pb : pa;
        clg_ka_mem(&g, v->m);
        if (cpu)
            clg_ka_int(&g, v->off);
        clg_ka_int(&g, v->stride);
        if (cpu) {
            clg_ka_int(&g, v->ps);
            clg_ka_int(&g, v->ks);
        }
    }
    clg_gemm_ka_output(&g, a);
    if (cpu) {
        clg_ka_int(&g, KS);
        clg_ka_int(&g, kchunk);
        clg_ka_mem(&g, W ? W : a->gelu ? a->pre : Ap);
    }
    if ((st = CLG_KA_DONE(err, &g, "arguments of gemm main kernel")) != CLG_OK)
        goto out;
    if (cpu) {
        size_t gws[3] = {(size_t)CLG_CEIL_DIV(Mt, p->WGS) * p->WGS, (size_t)Nt, (size_t)batch * KS};
        size_t lws[3] = {(size_t)p->WGS, 1, 1}; /* no local memory: may shrink to the kernel's limit */
        if ((st = enqueue(dev, kmain, 3, gws, lws, CLG_LAUNCH_FIT, ev)) != CLG_OK)
            goto out;
    } else {
        size_t gws[3] = {(size_t)Mt * p->MDIMC, (size_t)Nt * p->NDIMC, (size_t)batch};
        size_t lws[3] = {(size_t)p->MDIMC, (size_t)p->NDIMC, 1}; /* reqd_work_group_size */
        if ((st = enqueue(dev, kmain, 3, gws, lws, CLG_LAUNCH_FIXED, ev)) != CLG_OK)
            goto out;
    }
    if (KS > 1) {
        cl_kernel kred;
        if ((st = clg_kernel_get(dev, "gemm", "", "gemm_reduce", &kred)) != CLG_OK)
            goto out;
        clg_kargs r = {kred, 0, CL_SUCCESS};
        clg_ka_int(&r, M);
        clg_ka_int(&r, N);
        clg_ka_int(&r, KS);
        clg_ka_int(&r, Mt * PA);
        clg_ka_int(&r, Nt * PB);
        clg_ka_mem(&r, W);
        clg_ka_float(&r, a->alpha);
        clg_ka_float(&r, a->beta);
        clg_gemm_ka_output(&r, a);
        if ((st = CLG_KA_DONE(err, &r, "arguments of gemm_reduce")) != CLG_OK)
            goto out;
        size_t gws[3] = {(size_t)N, (size_t)M, (size_t)batch};
        st = enqueue(dev, kred, 3, gws, NULL, CLG_LAUNCH_FIT, ev); /* hot split-K path: the runtime's size */
    }
out:
    /* In-order queue: a block handed out again is only used by commands
     * enqueued after ours. */
    clg_buf_release(dev, W);
    return st;
}

/* Which kernel the own backend runs for a product when the caller leaves
 * the parameters to it (clg_gemm, clg_gemm_run with p NULL) on CPU
 * devices (K > 0): 1 gemm_rows (op(B) = B), 2 gemm_dot (A * B^T), 0 the packed
 * kernel. Packing costs two passes over the operands and two launches:
 * more than the arithmetic of small products (a dense layer's 128 x 120 x
 * 400 ran in 60% of the packed time unpacked), and for long, thin products
 * (a weight gradient's 32 x 288 x 100352: K >= 32 x max(M, N)) the packing
 * copies more than the product reads. Wide products (N in the thousands)
 * stay packed at any size, where the register tile pays (docs/benchmarks.md, GEMM).
 * CLGRAD_GEMM_UNPACKED=0 never runs them unpacked, =1 wherever the kernels
 * apply. Explicit parameters (tuner, tests) always get the packed kernel. */
#define UNPACKED_SMALL_MNK (1 << 23)
static int unpacked_kind(const clg_device *dev, const clg_gemm_args *a)
{
    if (!(dev->info.type & CLG_DEVICE_CPU) || a->K <= 0 || (a->ta && a->tb))
        return 0;
    int mode = (int)dev->ctx->opts.gemm_unpacked - 1; /* auto,0,1 -> -1,0,1 */
    if (mode == 0)
        return 0;
    int kind = a->tb ? 2 : 1;
    if (mode == 1)
        return kind;
    double mnk = (double)a->M * a->N * a->K;
    if (mnk <= UNPACKED_SMALL_MNK)
        return kind;
    int mn = CLG_MAX(a->M, a->N);
    if (kind == 2 && (long)a->K >= 32L * mn && mn <= 1024 && (long)a->M * a->N <= 65536)
        return kind;
    return 0;
}

/* Whether an operand of K rows, leading dimension ld, in n batch entries is
 * small enough to read in place (see gemm_own): at most 256 KiB. */
#define VIEW_MAX_FLOATS (1 << 16)
static int view_small(int K, int ld, int n)
{
    return (double)K * ld * n <= VIEW_MAX_FLOATS;
}

/* Whether the CPU kernel reads op(A) = A (M x K row-major) in place, its
 * MR rows as MR streams (gemm_cpu's GEMM_AROWS) instead of packing it:
 * the activations of the transformer's projections (K = C or 4C, M = N T
 * rows). The row streams cost more per pass over A than the packed
 * panels, and the kernel passes over A once per tile column (N / PB), the
 * packing once: rows for at most ROWS_MAX_NT tile columns (gpt-mini: the
 * input gradients and the projections to width C, 4C -> C), packed for
 * wider products (its MLP's C -> 4C; docs/benchmarks.md, gpt-mini). Rows a
 * leading dimension of 1024 floats or more apart share a few cache sets. */
#define ROWS_MAX_LD 1024
#define ROWS_MAX_NT 12
/* Large products (M, N, K all >= the family parameter gemm_rows_large, 0
 * off: data/tune-families.json) read A in place at any width and leading
 * dimension. Set for Intel AVX-512 CPUs (pocl-cpu-avx512-intel, 1024): on
 * a Xeon (2 vCPUs, PoCL 3.1, 6 x 64 tile) at 2048^3 the packing pass cost
 * more than the row streams: CPU time per product 212 against 253 ms
 * (medians of 5 alternating rounds, load average 6), the kernel alone
 * faster too (193 against 226 ms). Not measured on AMD (Zen 4 keeps the
 * packed panels: off). */
static int rows_large(clg_device *dev, const clg_gemm_args *a)
{
    double t = clg_tune_family_param(dev, "gemm_rows_large", 0);
    return t > 0 && a->M >= t && a->N >= t && a->K >= t;
}

static int rows_a(clg_device *dev, int mode, const clg_gemm_args *a, int PA, int PB)
{
    if (!(dev->info.type & CLG_DEVICE_CPU) || mode == 0 || a->ta || a->K < 1 || (long long)PA * a->lda > INT_MAX)
        return 0;
    return mode == 1 || (a->lda < ROWS_MAX_LD && a->M >= 4 * PA && CLG_CEIL_DIV(a->N, PB) <= ROWS_MAX_NT) ||
           rows_large(dev, a);
}

static clg_status gemm_own(clg_device *dev, const clg_gemm_args *a, const clg_gemm_params *p, evs *ev)
{
    if (p->family == CLG_GEMM_FAM_REF)
        return gemm_ref(dev, a, ev);
    CLG_TRY(clg_gemm_params_check(dev, p));
    clg_err *err = clg_dev_err(dev);
    cl_kernel kpack;
    CLG_TRY(clg_kernel_get(dev, "gemm", "", "gemm_pack", &kpack));
    int cpu = p->family == CLG_GEMM_FAM_CPU;

    const int M = a->M, N = a->N, K = a->K;
    const int batch = a->batch > 0 ? a->batch : 1;
    const int PA = cpu ? p->MR : p->MWG, PB = cpu ? p->NV * p->VW : p->NWG;
    const int Kp = cpu ? K : CLG_CEIL_DIV(K, p->KWG) * p->KWG;
    const int Mt = CLG_CEIL_DIV(M, PA), Nt = CLG_CEIL_DIV(N, PB);
    const int shareA = batch > 1 && a->strideA == 0, shareB = batch > 1 && a->strideB == 0;
    const size_t panA = (size_t)Mt * PA * Kp, panB = (size_t)Nt * PB * Kp;
    if (panA > INT_MAX || panB > INT_MAX)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "gemm: packed operand beyond 2^31 elements (M=%d N=%d K=%d)",
                           M, N, K);
    const int bA = shareA ? 1 : batch, bB = shareB ? 1 : batch;
    const int apStride = shareA ? 0 : (int)panA, bpStride = shareB ? 0 : (int)panB;

    /* op(A) = A^T and op(B) = B: each panel's rows at a depth k are already
     * contiguous (a row of the operand), so the CPU kernel can read them in
     * place when the panels tile the operand exactly (no padding needed).
     * By default only when that saves the packing launch (both operands)
     * and both are small: read in place, a panel spans K rows a leading
     * dimension apart (often a power of two: few cache sets), and the main
     * kernel lost more than the packing cost (gpt-mini's weight gradients,
     * K = 4096, in place: gemm_cpu +15-20%, packing -33%, the sum higher).
     * CLGRAD_GEMM_UNPACKED=1: wherever it applies, =0 never. */
    const int mode = cpu ? (int)dev->ctx->opts.gemm_unpacked - 1 : 0; /* auto,0,1 -> -1,0,1 */
    const int canA = mode != 0 && a->ta && M % PA == 0, canB = mode != 0 && !a->tb && N % PB == 0;
    const int both = canA && canB && view_small(K, a->lda, bA) && view_small(K, a->ldb, bB);
    const int viewA = (mode == 1 ? canA : both) || rows_a(dev, mode, a, PA, PB), viewB = mode == 1 ? canB : both;
    panels pa = {a->A, (int)a->offA, (int)a->strideA, PA, a->lda, 0};
    panels pb = {a->B, (int)a->offB, (int)a->strideB, PB, a->ldb, 0};
    if (rows_a(dev, mode, a, PA, PB)) { /* A = op(A) row-major: its rows read in place */
        pa.ps = PA * a->lda;
        pa.ks = 1;
        pa.rows = 1;
    }
    scratch s = {{NULL, NULL, NULL}};
    clg_status st = CLG_OK;
    if ((!viewA && (st = clg_buf_alloc(dev, sizeof(float) * CLG_MAX((size_t)1, panA * bA), &s.m[0])) != CLG_OK) ||
        (!viewB && (st = clg_buf_alloc(dev, sizeof(float) * CLG_MAX((size_t)1, panB * bB), &s.m[1])) != CLG_OK))
        goto out;
    pack_op oa = {M, a->ta, a->A, a->offA, a->lda, a->strideA, bA, PA, s.m[0], apStride};
    pack_op ob = {N, !a->tb, a->B, a->offB, a->ldb, a->strideB, bB, PB, s.m[1], bpStride};
    if (!viewA)
        pa = panels_packed(s.m[0], apStride, Kp, PA);
    if (!viewB)
        pb = panels_packed(s.m[1], bpStride, Kp, PB);
    if (Kp > 0 && !viewA && !viewB) /* both in one launch */
        st = pack2(dev, K, Kp, &oa, &ob, ev);
    else if (Kp > 0 && !viewA)
        st = pack(dev, kpack, &oa, K, Kp, ev);
    else if (Kp > 0 && !viewB)
        st = pack(dev, kpack, &ob, K, Kp, ev);
    if (st != CLG_OK)
        goto out;
    st = run_packed(dev, p, a, Kp, &pa, &pb, ev);
out:
    scratch_release(dev, &s);
    return st;
}

/* ---- products on pre-packed operands ---- */

clg_status clg_gemm_pack_layout(clg_device *dev, int M, int N, int K, const clg_gemm_params *p, clg_gemm_layout *L)
{
    memset(L, 0, sizeof *L);
    if (p)
        L->p = *p;
    else
        clg_gemm_params_for(dev, CLG_MAX(M, 1), CLG_MAX(N, 1), CLG_MAX(K, 1), &L->p);
    if (L->p.family == CLG_GEMM_FAM_REF)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED,
                           "gemm: the reference kernel family reads unpacked operands (no panel layout)");
    CLG_TRY(clg_gemm_params_check(dev, &L->p));
    int cpu = L->p.family == CLG_GEMM_FAM_CPU;
    L->PA = cpu ? L->p.MR : L->p.MWG;
    L->PB = cpu ? L->p.NV * L->p.VW : L->p.NWG;
    L->kalign = cpu ? 1 : L->p.KWG;
    return CLG_OK;
}

int clg_gemm_layout_kp(const clg_gemm_layout *L, int K)
{
    int ka = L->kalign > 0 ? L->kalign : 1;
    return CLG_CEIL_DIV(K, ka) * ka;
}

size_t clg_gemm_layout_floats_a(const clg_gemm_layout *L, int M, int K)
{
    return (size_t)CLG_CEIL_DIV(M, L->PA) * L->PA * (size_t)clg_gemm_layout_kp(L, K);
}

size_t clg_gemm_layout_floats_b(const clg_gemm_layout *L, int N, int K)
{
    return (size_t)CLG_CEIL_DIV(N, L->PB) * L->PB * (size_t)clg_gemm_layout_kp(L, K);
}

/* Fails unless buffer m holds at least `floats` floats. */
static clg_status check_size(clg_device *dev, cl_mem m, size_t floats, const char *what)
{
    size_t bytes = 0;
    cl_int rc = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof bytes, &bytes, NULL);
    if (rc != CL_SUCCESS)
        return clg_cl_fail(clg_dev_err(dev), rc, "clGetMemObjectInfo(CL_MEM_SIZE)", __FILE__, __LINE__);
    if (bytes / sizeof(float) < floats)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG,
                           "gemm_packed: %s buffer holds %zu floats, the packed operands need %zu", what,
                           bytes / sizeof(float), floats);
    return CLG_OK;
}

clg_status clg_gemm_packed(clg_device *dev, const clg_gemm_layout *L, const clg_gemm_args *a, cl_mem Ap,
                           size_t apStride, cl_mem Bp, size_t bpStride, cl_event *ev)
{
    clg_err *err = clg_dev_err(dev);
    if (ev)
        *ev = NULL;
    if (L->p.family != CLG_GEMM_FAM_CPU && L->p.family != CLG_GEMM_FAM_TILED)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm_packed: layout of kernel family %d has no panels",
                           L->p.family);
    CLG_TRY(clg_gemm_params_check(dev, &L->p));
    int cpu = L->p.family == CLG_GEMM_FAM_CPU;
    if (L->PA != (cpu ? L->p.MR : L->p.MWG) || L->PB != (cpu ? L->p.NV * L->p.VW : L->p.NWG) ||
        L->kalign != (cpu ? 1 : L->p.KWG))
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "gemm_packed: layout PA=%d PB=%d kalign=%d does not match its parameters (from "
                           "clg_gemm_pack_layout?)",
                           L->PA, L->PB, L->kalign);
    if (a->M < 0 || a->N < 0 || a->K < 0 || a->batch < 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm_packed: negative size M=%d N=%d K=%d batch=%d", a->M,
                           a->N, a->K, a->batch);
    if (!Ap || !Bp || !a->C)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm_packed: NULL buffer (packed A, packed B or C)");
    if (a->ldc < CLG_MAX(1, a->N))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm_packed: ldc=%d smaller than N=%d", a->ldc, a->N);
    if (a->bias_mode != CLG_BIAS_NONE && !a->bias)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm_packed: bias mode set without a bias buffer");
    if (a->bias_mode < CLG_BIAS_NONE || a->bias_mode > CLG_BIAS_COL)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm_packed: unknown bias mode %d", (int)a->bias_mode);
    if (a->gelu)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "gemm_packed: no GELU epilogue (clg_gemm has it)");
    if (a->M == 0 || a->N == 0)
        return CLG_OK;
    const int batch = a->batch > 0 ? a->batch : 1;
    const size_t panA = clg_gemm_layout_floats_a(L, a->M, a->K), panB = clg_gemm_layout_floats_b(L, a->N, a->K);
    if (batch > 1 && ((apStride && apStride < panA) || (bpStride && bpStride < panB)))
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "gemm_packed: packed strides %zu / %zu smaller than one packed operand (%zu / %zu floats)",
                           apStride, bpStride, panA, panB);
    size_t lim = (size_t)INT_MAX;
    size_t needA = (size_t)(batch - 1) * apStride + panA, needB = (size_t)(batch - 1) * bpStride + panB;
    if (needA > lim || needB > lim || apStride > lim || bpStride > lim || a->offC > lim || a->offBias > lim ||
        a->strideC > lim || (size_t)a->M * (size_t)a->ldc > lim || (size_t)(batch - 1) * a->strideC + a->offC > lim)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "gemm_packed: operands beyond 2^31 elements are not supported");
    CLG_TRY(check_size(dev, Ap, needA, "packed A"));
    CLG_TRY(check_size(dev, Bp, needB, "packed B"));
    evs e = {NULL, ev, NULL, 0};
    const int Kp = clg_gemm_layout_kp(L, a->K);
    panels pa = panels_packed(Ap, (int)apStride, Kp, L->PA), pb = panels_packed(Bp, (int)bpStride, Kp, L->PB);
    clg_status st = run_packed(dev, &L->p, a, Kp, &pa, &pb, &e);
    ev_finish(&e, st);
    return st;
}

/* ---- dot-product kernel (unpacked, C = A * B^T) ---- */

#define DOT_DR 4
#define DOT_DC 4
#define ROWS_RR 8 /* rows per work-item of gemm_rows (4 was slower on PoCL for the LeNet-5 gradients) */

static clg_status dot_launch(clg_device *dev, const clg_gemm_args *a, evs *e)
{
    clg_err *err = clg_dev_err(dev);
    cl_kernel k;
    char opts[64];
    snprintf(opts, sizeof opts, "-D GEMM_DOT -D DR=%d -D DC=%d", DOT_DR, DOT_DC);
    CLG_TRY(clg_kernel_get(dev, "gemm", opts, "gemm_dot", &k));
    clg_kargs g = {k, 0, CL_SUCCESS};
    clg_ka_int(&g, a->M);
    clg_ka_int(&g, a->N);
    clg_ka_int(&g, a->K);
    clg_ka_float(&g, a->alpha);
    clg_ka_float(&g, a->beta);
    ka_operands(&g, a);
    CLG_TRY(CLG_KA_DONE(err, &g, "arguments of gemm_dot"));
    size_t gws[3] = {(size_t)CLG_CEIL_DIV(a->M, DOT_DR), (size_t)CLG_CEIL_DIV(a->N, DOT_DC),
                     (size_t)(a->batch > 0 ? a->batch : 1)};
    return enqueue(dev, k, 3, gws, NULL, CLG_LAUNCH_PAD, e);
}

clg_status clg_gemm_dot(clg_device *dev, const clg_gemm_args *a, cl_event *ev)
{
    clg_err *err = clg_dev_err(dev);
    if (ev)
        *ev = NULL;
    if (a->ta || !a->tb)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm_dot: computes A * B^T only (ta=%d tb=%d, need 0 and 1)",
                           a->ta, a->tb);
    CLG_TRY(check_args(dev, a));
    if (a->gelu)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "gemm_dot: no GELU epilogue (clg_gemm has it)");
    if (a->M == 0 || a->N == 0)
        return CLG_OK;
    evs e = {NULL, ev, NULL, 0};
    clg_status st = dot_launch(dev, a, &e);
    ev_finish(&e, st);
    return st;
}

/* ---- row kernel (unpacked, C = op(A) * B, B not transposed) ---- */

/* gemm_rows' order (ROWS_MI): row blocks innermost when op(A) is the small
 * operand (at most 64 Ki floats: it stays in L2 while every 16-column strip
 * of B is read once), B the larger one and C has few rows (<= 64: a strip
 * of C is written a few rows apart, not all over a tall output); otherwise
 * column blocks innermost (a block of op(A) stays in L1 while B streams
 * past once per row block). E.g. a dense layer's data gradient at batch 32,
 * 32 x 3136 x 256: B (the 3.2 MB weight) read once instead of 4 times. CPU
 * devices only (on a GPU the order is the coalescing of neighbouring
 * work-items). */
#define ROWS_MI_MAX_A (1 << 16)
static int rows_m_inner(const clg_device *dev, const clg_gemm_args *a)
{
    double asz = (double)a->M * a->K, bsz = (double)a->K * a->N;
    return (dev->info.type & CLG_DEVICE_CPU) && a->M > ROWS_RR && a->M <= 64 && asz <= ROWS_MI_MAX_A && bsz > asz;
}

static clg_status rows_launch(clg_device *dev, const clg_gemm_args *a, evs *e)
{
    clg_err *err = clg_dev_err(dev);
    cl_kernel k;
    char opts[64];
    const int mi = rows_m_inner(dev, a);
    snprintf(opts, sizeof opts, "-D GEMM_ROWS -D RR=%d -D TA=%d -D ROWS_MI=%d", ROWS_RR, a->ta ? 1 : 0, mi);
    CLG_TRY(clg_kernel_get(dev, "gemm", opts, "gemm_rows", &k));
    clg_kargs g = {k, 0, CL_SUCCESS};
    clg_ka_int(&g, a->M);
    clg_ka_int(&g, a->N);
    clg_ka_int(&g, a->K);
    clg_ka_float(&g, a->alpha);
    clg_ka_float(&g, a->beta);
    ka_operands(&g, a);
    CLG_TRY(CLG_KA_DONE(err, &g, "arguments of gemm_rows"));
    size_t nb = (size_t)CLG_CEIL_DIV(a->N, 16), mb = (size_t)CLG_CEIL_DIV(a->M, ROWS_RR);
    size_t gws[3] = {mi ? mb : nb, mi ? nb : mb, (size_t)(a->batch > 0 ? a->batch : 1)};
    return enqueue(dev, k, 3, gws, NULL, CLG_LAUNCH_FIT, e);
}

clg_status clg_gemm_rows(clg_device *dev, const clg_gemm_args *a, cl_event *ev)
{
    clg_err *err = clg_dev_err(dev);
    if (ev)
        *ev = NULL;
    if (a->tb)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm_rows: computes op(A) * B only (tb=%d, need 0)", a->tb);
    CLG_TRY(check_args(dev, a));
    if (a->gelu)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "gemm_rows: no GELU epilogue (clg_gemm has it)");
    if (a->M == 0 || a->N == 0)
        return CLG_OK;
    evs e = {NULL, ev, NULL, 0};
    clg_status st = rows_launch(dev, a, &e);
    ev_finish(&e, st);
    return st;
}

void clg_gemm_own_describe(clg_device *dev, const clg_gemm_args *a, char *buf, size_t len)
{
    int uk = unpacked_kind(dev, a);
    if (clg_gemm_splitk_wanted(dev, a)) {
        clg_splitk_plan pl;
        clg_gemm_splitk_plan_for(dev, a, 0, &pl);
        if (pl.dot)
            snprintf(buf, len, "split-K dot S=%d", pl.S);
        else
            snprintf(buf, len, "split-K S=%d TS=%d RT=%d", pl.S, pl.TS, pl.RT);
    } else if (uk == 1) {
        snprintf(buf, len, "unpacked rows RR=%d", ROWS_RR);
    } else if (uk == 2) {
        snprintf(buf, len, "unpacked dot DR=%d DC=%d", DOT_DR, DOT_DC);
    } else {
        clg_gemm_params p;
        clg_gemm_params_for(dev, a->M, a->N, a->K, &p);
        clg_gemm_params_str(&p, buf, len);
    }
}

/* ---- CLBlast backend ---- */

int clg_gemm_have_clblast(void) { return CLG_HAVE_CLBLAST; }

#if CLG_HAVE_CLBLAST
/* bias + ReLU after a backend without a fused epilogue */
static clg_status gemm_epilogue(clg_device *dev, const clg_gemm_args *a, evs *ev)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "gemm", "", "gemm_epilogue", &k));
    clg_kargs g = {k, 0, CL_SUCCESS};
    clg_ka_int(&g, a->M);
    clg_ka_int(&g, a->N);
    clg_gemm_ka_output(&g, a);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &g, "arguments of gemm_epilogue"));
    size_t gws[3] = {(size_t)a->N, (size_t)a->M, (size_t)(a->batch > 0 ? a->batch : 1)};
    return enqueue(dev, k, 3, gws, NULL, CLG_LAUNCH_PAD, ev);
}

#endif

static clg_status gemm_clblast(clg_device *dev, const clg_gemm_args *a, evs *ev)
{
#if CLG_HAVE_CLBLAST
    clg_err *err = clg_dev_err(dev);
    int batch = a->batch > 0 ? a->batch : 1;
    CLG_TRY(clg_deps_foreign(dev)); /* CLBlast enqueues outside clg_enqueue */
    cl_event marker = NULL, e = NULL;
    if (ev->first) {
        cl_int rc = clEnqueueMarkerWithWaitList(dev->queue, 0, NULL, &marker);
        if (rc != CL_SUCCESS)
            return clg_cl_fail(err, rc, "clEnqueueMarkerWithWaitList", __FILE__, __LINE__);
        *ev->first = marker;
        ev->n++;
    }
    CLBlastTranspose ta = a->ta ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastTranspose tb = a->tb ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastStatusCode s;
    if (batch > 1)
        s = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, ta, tb, (size_t)a->M, (size_t)a->N, (size_t)a->K,
                                       a->alpha, a->A, a->offA, (size_t)a->lda, a->strideA, a->B, a->offB,
                                       (size_t)a->ldb, a->strideB, a->beta, a->C, a->offC, (size_t)a->ldc, a->strideC,
                                       (size_t)batch, &dev->queue, &e);
    else
        s = CLBlastSgemm(CLBlastLayoutRowMajor, ta, tb, (size_t)a->M, (size_t)a->N, (size_t)a->K, a->alpha, a->A,
                         a->offA, (size_t)a->lda, a->B, a->offB, (size_t)a->ldb, a->beta, a->C, a->offC,
                         (size_t)a->ldc, &dev->queue, &e);
    if (s != CLBlastSuccess)
        return clg_err_set(err, s == CLBlastOpenCLOutOfResources || s == (CLBlastStatusCode)CL_MEM_OBJECT_ALLOCATION_FAILURE
                                    ? CLG_ERR_DEVICE_OOM
                                    : CLG_ERR_OPENCL,
                           "CLBlast sgemm%s failed with status %d on %s (M=%d N=%d K=%d)",
                           batch > 1 ? "StridedBatched" : "", (int)s, dev->info.name, a->M, a->N, a->K);
    if (ev->tmp)
        clReleaseEvent(ev->tmp);
    ev->tmp = e;
    ev->n++;
    if (a->bias_mode != CLG_BIAS_NONE || a->relu)
        CLG_TRY(gemm_epilogue(dev, a, ev));
    return CLG_OK;
#else
    (void)ev;
    return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED, "gemm: clgrad was built without CLBlast (M=%d N=%d K=%d)",
                       a->M, a->N, a->K);
#endif
}

/* ---- backend choice ---- */

int clg_gemm_backend_parse(const char *s)
{
    if (!s)
        return -1;
    if (strcmp(s, "auto") == 0)
        return CLG_GEMM_AUTO;
    if (strcmp(s, "own") == 0)
        return CLG_GEMM_OWN;
    if (strcmp(s, "clblast") == 0)
        return CLG_GEMM_CLBLAST;
    if (strcmp(s, "ref") == 0)
        return CLG_GEMM_REF;
    return -1;
}

const char *clg_gemm_backend_name(clg_gemm_backend b)
{
    switch (b) {
    case CLG_GEMM_AUTO: return "auto";
    case CLG_GEMM_OWN: return "own";
    case CLG_GEMM_CLBLAST: return "clblast";
    case CLG_GEMM_REF: return "ref";
    }
    return "?";
}

clg_status clg_gemm_set_backend(clg_ctx *ctx, clg_gemm_backend b)
{
    if ((int)b < CLG_GEMM_AUTO || (int)b > CLG_GEMM_REF)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "gemm: unknown backend %d", (int)b);
    if (b == CLG_GEMM_CLBLAST && !CLG_HAVE_CLBLAST)
        return clg_err_set(&ctx->err, CLG_ERR_UNSUPPORTED, "gemm backend 'clblast': clgrad was built without CLBlast");
    clg_tune_db *db = clg_tune_db_get(ctx);
    if (!db)
        return clg_err_set(&ctx->err, CLG_ERR_HOST_OOM, "out of memory");
    db->gemm_backend = (int)b + 1;
    return CLG_OK;
}

clg_gemm_backend clg_gemm_get_backend(clg_ctx *ctx)
{
    clg_tune_db *db = clg_tune_db_get(ctx);
    if (!db)
        return CLG_GEMM_AUTO;
    if (db->gemm_backend == 0) { /* not set yet: environment */
        char name[16];
        clg_opts_format(&ctx->opts, CLG_OPT_ID_gemm_backend, name, sizeof name);
        int b = clg_gemm_backend_parse(name);
        if (b == CLG_GEMM_CLBLAST && !CLG_HAVE_CLBLAST) {
            clg_log(1, "gemm_backend=clblast but clgrad was built without CLBlast; using own");
            b = CLG_GEMM_OWN;
        }
        db->gemm_backend = (b < 0 ? CLG_GEMM_AUTO : b) + 1;
        if (!ctx->opts.gemm_auto_measure)
            db->auto_measure = 0;
    }
    return (clg_gemm_backend)(db->gemm_backend - 1);
}

static clg_status run_backend(clg_device *dev, const clg_gemm_args *a, clg_gemm_backend b, const clg_gemm_params *p,
                              evs *ev);

/* The product with a GELU epilogue (clg_gemm_args.gelu): in the own CPU
 * family's packed kernel, else the product into pre, then the activation
 * pass (not among the events: the in-order queue orders it). */
static clg_status run_gelu(clg_device *dev, const clg_gemm_args *a, clg_gemm_backend b, const clg_gemm_params *p,
                           evs *ev)
{
    clg_gemm_params q;
    if (b == CLG_GEMM_OWN && !p && a->K > 0 && !unpacked_kind(dev, a)) {
        clg_gemm_params_for(dev, a->M, a->N, a->K, &q);
        p = &q;
    }
    if (b == CLG_GEMM_OWN && p && p->family == CLG_GEMM_FAM_CPU)
        return gemm_own(dev, a, p, ev);
    clg_gemm_args g = *a;
    g.gelu = 0;
    g.pre = NULL;
    g.C = a->pre;
    g.offC = 0;
    CLG_TRY(run_backend(dev, &g, b, p, ev));
    clg_act act = a->gelu % 2 ? CLG_ACT_GELU : CLG_ACT_GELU_TANH;
    if (a->gelu >= 3) /* pre receives the derivative */
        return clg_nn_act_forward_d(dev, act, (size_t)a->M * a->N, a->pre, 0, a->C, a->offC);
    return clg_nn_act_forward(dev, act, 0.0f, (size_t)a->M * a->N, a->pre, 0, a->C, a->offC);
}

/* Split-K (gemm_splitk.c), its events taken into ev. */
static clg_status splitk_run(clg_device *dev, const clg_gemm_args *a, evs *ev)
{
    cl_event f = NULL, l = NULL;
    CLG_TRY(clg_gemm_splitk(dev, a, 0, ev->first && ev->n == 0 ? &f : NULL, &l));
    if (f) {
        *ev->first = f;
        ev->n++;
    }
    if (l) {
        if (ev->tmp)
            clReleaseEvent(ev->tmp);
        ev->tmp = l;
        ev->n++;
    }
    return CLG_OK;
}

static clg_status run_backend(clg_device *dev, const clg_gemm_args *a, clg_gemm_backend b, const clg_gemm_params *p,
                              evs *ev)
{
    if (a->gelu)
        return run_gelu(dev, a, b, p, ev);
    if (b == CLG_GEMM_REF)
        return gemm_ref(dev, a, ev);
    if (b == CLG_GEMM_CLBLAST && a->K > 0)
        return gemm_clblast(dev, a, ev);
    if (!p && clg_gemm_splitk_wanted(dev, a))
        return splitk_run(dev, a, ev);
    clg_gemm_params q;
    if (!p) {
        int uk = unpacked_kind(dev, a);
        if (uk)
            return uk == 1 ? rows_launch(dev, a, ev) : dot_launch(dev, a, ev);
        clg_gemm_params_for(dev, a->M, a->N, a->K, &q);
        p = &q;
    }
    return gemm_own(dev, a, p, ev);
}

clg_status clg_gemm_time(clg_device *dev, const clg_gemm_args *shape, clg_gemm_backend b, const clg_gemm_params *p,
                         int reps, double *ms)
{
    clg_err *err = clg_dev_err(dev);
    clg_gemm_args a = *shape;
    int batch = a.batch > 0 ? a.batch : 1;
    a.lda = a.ta ? a.M : a.K;
    a.ldb = a.tb ? a.K : a.N;
    a.ldc = a.N;
    a.offA = a.offB = a.offC = a.offBias = 0;
    a.strideA = (size_t)a.M * a.K;
    a.strideB = (size_t)a.K * a.N;
    a.strideC = (size_t)a.M * a.N;
    a.lda = CLG_MAX(a.lda, 1);
    a.ldb = CLG_MAX(a.ldb, 1);
    a.ldc = CLG_MAX(a.ldc, 1);
    scratch s = {{NULL, NULL, NULL}};
    cl_mem bias = NULL;
    clg_status st;
    size_t n[3] = {a.strideA * batch, a.strideB * batch, a.strideC * batch};
    for (int i = 0; i < 3; i++) {
        if ((st = clg_buf_alloc(dev, sizeof(float) * CLG_MAX(n[i], (size_t)1), &s.m[i])) != CLG_OK ||
            (st = clg_buf_fill(dev, s.m[i], 0, n[i], 0.0f)) != CLG_OK)
            goto out;
    }
    if (a.bias_mode != CLG_BIAS_NONE) {
        size_t nb = (size_t)CLG_MAX(a.M, a.N);
        if ((st = clg_buf_alloc(dev, sizeof(float) * nb, &bias)) != CLG_OK ||
            (st = clg_buf_fill(dev, bias, 0, nb, 0.0f)) != CLG_OK)
            goto out;
    }
    a.A = s.m[0];
    a.B = s.m[1];
    a.C = s.m[2];
    a.bias = bias;
    reps = CLG_MAX(1, CLG_MIN(reps, 64));
    double t[64];
    for (int r = -1; r < reps; r++) {
        cl_event e0 = NULL, e1 = NULL;
        evs ev = {&e0, &e1, NULL, 0};
        st = run_backend(dev, &a, b, p, &ev);
        ev_finish(&ev, st);
        if (st != CLG_OK)
            goto out;
        cl_int rc = clFinish(dev->queue);
        double dt = (e0 && e1) ? clg_event_span_ms(e0, e1) : 0.0;
        if (e0)
            clReleaseEvent(e0);
        if (e1)
            clReleaseEvent(e1);
        if (rc != CL_SUCCESS) {
            st = clg_cl_fail(err, rc, "clFinish", __FILE__, __LINE__);
            goto out;
        }
        if (r >= 0)
            t[r] = dt;
    }
    for (int i = 1; i < reps; i++) /* insertion sort for the median */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    *ms = t[reps / 2];
out:
    scratch_release(dev, &s);
    clg_buf_release(dev, bias);
    return st;
}

/* AUTO decisions of this process per device kind (fingerprint hash) and
 * shape class: identical devices (data-parallel lanes) take the first one's
 * measured choice rather than each measuring its own, which could differ
 * (and a later process, reading the one stored in the tuning database,
 * would then compute differently on some lane). Under g_auto_mu, which also
 * serialises the measurement itself. */
#define AUTO_MAX 128
static pthread_mutex_t g_auto_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t kind;
    char cls[32];
    int clblast;
} g_auto[AUTO_MAX];
static int g_nauto;

static int auto_known(uint64_t kind, const char *cls)
{
    for (int i = 0; i < g_nauto; i++)
        if (g_auto[i].kind == kind && strcmp(g_auto[i].cls, cls) == 0)
            return g_auto[i].clblast;
    return -1;
}

static void auto_note(uint64_t kind, const char *cls, int clblast)
{
    if (g_nauto == AUTO_MAX)
        return;
    g_auto[g_nauto].kind = kind;
    snprintf(g_auto[g_nauto].cls, sizeof g_auto[g_nauto].cls, "%s", cls);
    g_auto[g_nauto++].clblast = clblast;
}

/* Stores the class's choice in dev's database and saves it, so the next
 * process on this machine and cache makes the same one (also an adopted
 * choice: the measurement may have been another context's, on another cache). */
static void auto_store(clg_device *dev, const char *key, int cb, const double *t_own, const double *t_cb)
{
    clg_err saved = dev->err;
    clg_tune_entry ne;
    memset(&ne, 0, sizeof ne);
    snprintf(ne.key, sizeof ne.key, "%s", key);
    snprintf(ne.backend, sizeof ne.backend, "%s", cb ? "clblast" : "own");
    if (t_own)
        clg_tune_set(&ne, "own_ms", *t_own);
    if (t_cb)
        clg_tune_set(&ne, "clblast_ms", *t_cb);
    if (clg_tune_put(dev, &ne) == CLG_OK && clg_tune_save(dev) != CLG_OK)
        clg_log(1, "could not save the tuning database: %s", dev->err.msg);
    dev->err = saved;
}

/* Measures own vs CLBlast on a (errors kept out of the caller's way); 1: CLBlast. */
static int auto_measure_cb(clg_device *dev, const clg_gemm_args *a, const char *cls, const char *key)
{
    clg_err saved = dev->err;
    double t_own = 0, t_cb = 0;
    clg_status s1 = clg_gemm_time(dev, a, CLG_GEMM_OWN, NULL, 3, &t_own);
    clg_status s2 = s1 == CLG_OK ? clg_gemm_time(dev, a, CLG_GEMM_CLBLAST, NULL, 3, &t_cb) : s1;
    dev->err = saved;
    if (s1 != CLG_OK)
        return 0;
    int cb = s2 == CLG_OK && t_cb > 0 && t_cb < t_own;
    clg_log(1, "gemm auto %s on %s: own %.3f ms, clblast %.3f ms -> %s", cls, dev->info.name, t_own, t_cb,
            cb ? "clblast" : "own");
    auto_store(dev, key, cb, &t_own, s2 == CLG_OK ? &t_cb : NULL);
    return cb;
}

/* AUTO: the context default, else the faster of own/CLBlast for the shape
 * class (stored in the tuning db; measured once for large enough shapes). */
static clg_gemm_backend resolve(clg_device *dev, const clg_gemm_args *a, clg_gemm_backend b)
{
    if (b == CLG_GEMM_AUTO)
        b = clg_gemm_get_backend(dev->ctx);
    if (b != CLG_GEMM_AUTO)
        return b;
    if (!CLG_HAVE_CLBLAST)
        return CLG_GEMM_OWN;
    char cls[32], key[64];
    clg_gemm_class(a->M, a->N, a->K, cls, sizeof cls);
    snprintf(key, sizeof key, "gemm-auto/%s", cls);
    const clg_tune_entry *e = clg_tune_find(dev, key);
    if (e)
        return strcmp(e->backend, "clblast") == 0 ? CLG_GEMM_CLBLAST : CLG_GEMM_OWN;
    clg_tune_db *db = clg_tune_db_get(dev->ctx);
    double flops = 2.0 * a->M * a->N * a->K * (a->batch > 0 ? a->batch : 1);
    if (!db || !db->auto_measure || flops < 1e9 || flops > 2e11)
        return CLG_GEMM_OWN;
    char fp[700];
    clg_device_fingerprint(dev, fp, sizeof fp);
    uint64_t kind = clg_hash_str(fp, CLG_HASH_SEED);
    pthread_mutex_lock(&g_auto_mu);
    int cb = auto_known(kind, cls);
    if (cb >= 0) /* an identical device measured it: the same choice, without measuring */
        auto_store(dev, key, cb, NULL, NULL);
    else
        auto_note(kind, cls, cb = auto_measure_cb(dev, a, cls, key));
    pthread_mutex_unlock(&g_auto_mu);
    return cb ? CLG_GEMM_CLBLAST : CLG_GEMM_OWN;
}

clg_status clg_gemm_run(clg_device *dev, const clg_gemm_args *a, clg_gemm_backend backend, const clg_gemm_params *p,
                        cl_event *first, cl_event *last)
{
    if (first)
        *first = NULL;
    if (last)
        *last = NULL;
    CLG_TRY(check_args(dev, a));
    if (a->M == 0 || a->N == 0)
        return CLG_OK;
    clg_gemm_backend b = resolve(dev, a, backend);
    evs ev = {first, last, NULL, 0};
    clg_status st = run_backend(dev, a, b, p, &ev);
    ev_finish(&ev, st);
    return st;
}

clg_status clg_gemm(clg_device *dev, const clg_gemm_args *a, cl_event *ev)
{
    return clg_gemm_run(dev, a, a->backend, NULL, NULL, ev);
}
