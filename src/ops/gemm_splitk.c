/* Split-K GEMM launcher (cl/gemm_splitk.cl): plan (tile, chunks), the
 * automatic choice, the partial and reduction launches. */
#include <limits.h>
#include <string.h>

#include "gemm_splitk.h"

#define SPLITK_TK 16         /* TK of the kernel (its default) */
#define SPLITK_MIN_CHUNK 256      /* shortest chunk of K the auto plan cuts */
#define SPLITK_MIN_CHUNK_CPU 2048 /* the same for gemm_splitk_dot */
#define DOT_R 4                   /* DR = DC of gemm_splitk_dot (its default) */

/* Work-group tile: 32 x 32 of 8 x 8 work-items (4 x 4 each) where the
 * device allows 64 work-items per group, else 16 x 16 of 4 x 4. */
static void plan_tile(const clg_device *dev, clg_splitk_plan *pl)
{
    size_t maxwg = dev->info.max_work_group_size ? dev->info.max_work_group_size : 1;
    if (maxwg >= 64) {
        pl->TS = 32;
        pl->RT = 4;
    } else if (maxwg >= 16) {
        pl->TS = 16;
        pl->RT = 4;
    } else {
        pl->TS = 4;
        pl->RT = 4; /* one work-item */
    }
}

/* Work-groups of the launch before splitting: tiles of gemm_splitk_part,
 * or for gemm_splitk_dot the groups of DOT_R x DOT_R work-item blocks a CPU
 * runtime runs (the canonical local size of CLG_LAUNCH_PAD). */
static long plan_groups(const clg_gemm_args *a, const clg_splitk_plan *pl)
{
    long batch = a->batch > 0 ? a->batch : 1;
    if (pl->dot)
        return (long)CLG_CEIL_DIV(CLG_CEIL_DIV(a->M, DOT_R), CLG_WG_CANON_X) *
               CLG_CEIL_DIV(CLG_CEIL_DIV(a->N, DOT_R), CLG_WG_CANON_Y) * batch;
    return (long)CLG_CEIL_DIV(a->M, pl->TS) * CLG_CEIL_DIV(a->N, pl->TS) * batch;
}

void clg_gemm_splitk_plan_for(const clg_device *dev, const clg_gemm_args *a, int S, clg_splitk_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    plan_tile(dev, pl);
    pl->dot = (dev->info.type & CLG_DEVICE_CPU) && !a->ta && a->tb;
    int batch = a->batch > 0 ? a->batch : 1;
    int K = CLG_MAX(a->K, 0);
    if (S <= 0) {
        /* enough work-groups for every compute unit four times over, chunks
         * of at least SPLITK_MIN_CHUNK; on CPUs also chunks of at most
         * twice SPLITK_MIN_CHUNK_CPU (one chunk's rows stay in cache while
         * the work-items sharing them run) */
        long cu = (long)CLG_MAX(1u, dev->info.compute_units);
        long want = CLG_CEIL_DIV(4 * cu, CLG_MAX(plan_groups(a, pl), 1L));
        if (pl->dot)
            want = CLG_MAX(want, (long)CLG_CEIL_DIV(K, 2 * SPLITK_MIN_CHUNK_CPU));
        int minchunk = pl->dot ? SPLITK_MIN_CHUNK_CPU : SPLITK_MIN_CHUNK;
        S = (int)CLG_MIN(want, (long)CLG_MAX(1, K / minchunk));
    }
    S = CLG_MAX(1, CLG_MIN(S, CLG_SPLITK_MAX_S));
    size_t part = (size_t)a->M * a->N * batch * sizeof(float);
    while (S > 1 && part * (size_t)S > CLG_SPLITK_MAX_WS_BYTES)
        S--;
    if (S == 1) {
        pl->S = 1;
        pl->kchunk = K;
        return;
    }
    /* chunks of whole TK stages; S may exceed the chunks K holds (the
     * chunks past K are empty and add zeros) */
    pl->kchunk = CLG_MAX(SPLITK_TK, CLG_CEIL_DIV(CLG_CEIL_DIV(K, S), SPLITK_TK) * SPLITK_TK);
    pl->S = S;
}

/* The auto rule.
 * - GPUs: the default tiled kernel's 64 x 64 work-group tiles leave
 *   compute units idle while few work-groups walk the whole of K:
 *   vgg.conv1.bwd-weight (32 x 9 x 100352) ran in one work-group at 5.8
 *   GFLOP/s on an H100 (docs/benchmarks.md). Split where the tiles are
 *   fewer than twice the compute units and K is long (>= 1024).
 * - CPUs (PoCL): only the long, thin A * B^T products that otherwise run
 *   as gemm_dot (unpacked_kind in gemm.c; conv weight gradients) with K
 *   >= 16384 and an output of 4096 to 65536 elements, where gemm_dot reads
 *   each operand row M/4 or N/4 times over the whole of K and chunks of
 *   2048-4096 keep them in cache. On 2 cores (loaded machine, alternating
 *   runs of the own backend) gemm_splitk_dot was 1.5-2.3x gemm_dot for
 *   32 x 288 x 100352 and 1.1-1.3x for 64 x 576 x 25088; for the smallest
 *   outputs (6 x 25, 32 x 9, K 100352) it was 0.5-2x from run to run, so
 *   they keep gemm_dot. The packed kernel keeps its own split-K (auto_ks in
 *   gemm.c). */
int clg_gemm_splitk_wanted(clg_device *dev, const clg_gemm_args *a)
{
    if (a->gelu || a->K <= 0 || a->M <= 0 || a->N <= 0)
        return 0;
    int mode = (int)dev->ctx->opts.gemm_splitk - 1; /* auto,0,1 -> -1,0,1 */
    if (mode >= 0)
        return mode;
    if (dev->info.type & CLG_DEVICE_CPU) {
        int mn = CLG_MAX(a->M, a->N);
        long mn2 = (long)a->M * a->N;
        if (a->ta || !a->tb || a->K < 16384 || (long)a->K < 32L * mn || mn2 > 65536 || mn2 < 4096)
            return 0;
        clg_splitk_plan pl;
        clg_gemm_splitk_plan_for(dev, a, 0, &pl);
        return pl.S >= 2;
    }
    /* GPUs: the default tiled kernel's 64 x 64 tiles against the compute units */
    int batch = a->batch > 0 ? a->batch : 1;
    long tiles64 = (long)CLG_CEIL_DIV(a->M, 64) * CLG_CEIL_DIV(a->N, 64) * batch;
    long cu = (long)CLG_MAX(1u, dev->info.compute_units);
    if (tiles64 >= 2 * cu || a->K < 4 * SPLITK_MIN_CHUNK)
        return 0;
    clg_splitk_plan pl;
    clg_gemm_splitk_plan_for(dev, a, 0, &pl);
    return pl.S >= 4;
}

/* ---- launch ---- */

static clg_status check(clg_device *dev, const clg_gemm_args *a)
{
    clg_err *err = clg_dev_err(dev);
    if (a->M < 0 || a->N < 0 || a->K < 0 || a->batch < 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm_splitk: negative size M=%d N=%d K=%d batch=%d", a->M,
                           a->N, a->K, a->batch);
    if (!a->A || !a->B || !a->C)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm_splitk: NULL buffer");
    if (a->lda < CLG_MAX(1, a->ta ? a->M : a->K) || a->ldb < CLG_MAX(1, a->tb ? a->K : a->N) ||
        a->ldc < CLG_MAX(1, a->N))
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "gemm_splitk: leading dimension too small (lda=%d ldb=%d ldc=%d)", a->lda, a->ldb, a->ldc);
    if (a->bias_mode < CLG_BIAS_NONE || a->bias_mode > CLG_BIAS_COL || (a->bias_mode != CLG_BIAS_NONE && !a->bias))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "gemm_splitk: bias mode %d without a bias buffer or unknown",
                           (int)a->bias_mode);
    if (a->gelu)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "gemm_splitk: no GELU epilogue (clg_gemm has it)");
    int batch = a->batch > 0 ? a->batch : 1;
    size_t lim = (size_t)INT_MAX;
    if (a->offA > lim || a->offB > lim || a->offC > lim || a->offBias > lim || a->strideA > lim ||
        a->strideB > lim || a->strideC > lim || (size_t)(a->ta ? a->K : a->M) * (size_t)a->lda > lim ||
        (size_t)(a->tb ? a->N : a->K) * (size_t)a->ldb > lim || (size_t)a->M * (size_t)a->ldc > lim ||
        (size_t)(batch - 1) * a->strideA + a->offA > lim || (size_t)(batch - 1) * a->strideB + a->offB > lim ||
        (size_t)(batch - 1) * a->strideC + a->offC > lim)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "gemm_splitk: operands beyond 2^31 elements are not supported");
    return CLG_OK;
}

/* The epilogue arguments both kernels end with: alpha, beta, then
 * clg_gemm_ka_output's. */
static void ka_epilogue(clg_kargs *g, const clg_gemm_args *a)
{
    clg_ka_float(g, a->alpha);
    clg_ka_float(g, a->beta);
    clg_gemm_ka_output(g, a);
}

/* gemm_splitk_part for pl's tile, or a smaller one where the compiled
 * kernel allows fewer work-items per group than the tile needs (registers);
 * pl->TS / pl->RT are updated. */
static clg_status get_part(clg_device *dev, const clg_gemm_args *a, clg_splitk_plan *pl, cl_kernel *k)
{
    static const int tiles[][2] = {{32, 4}, {16, 4}, {4, 4}}; /* TS, RT: 64, 16, 1 work-items */
    for (size_t i = 0; i < CLG_ARRAY_LEN(tiles); i++) {
        if (tiles[i][0] > pl->TS)
            continue;
        char opts[64];
        snprintf(opts, sizeof opts, "-D TS=%d -D RT=%d -D TA=%d -D TB=%d", tiles[i][0], tiles[i][1],
                 a->ta ? 1 : 0, a->tb ? 1 : 0);
        CLG_TRY(clg_kernel_get(dev, "gemm_splitk", opts, "gemm_splitk_part", k));
        clg_wg_limits L;
        CLG_TRY(clg_kernel_limits(dev, *k, &L));
        size_t wd = (size_t)(tiles[i][0] / tiles[i][1]);
        int fits = wd * wd <= L.max_total && (!L.max_item[0] || wd <= L.max_item[0]) &&
                   (!L.max_item[1] || wd <= L.max_item[1]);
        if (fits) {
            pl->TS = tiles[i][0];
            pl->RT = tiles[i][1];
            return CLG_OK;
        }
    }
    return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED, "gemm_splitk: no work-group tile fits %s",
                       dev->info.name);
}

static clg_status launch_part(clg_device *dev, const clg_gemm_args *a, const clg_splitk_plan *plan, cl_mem W,
                              cl_event *ev)
{
    clg_err *err = clg_dev_err(dev);
    clg_splitk_plan tile = *plan, *pl = &tile;
    cl_kernel k;
    if (pl->dot)
        CLG_TRY(clg_kernel_get(dev, "gemm_splitk", "", "gemm_splitk_dot", &k));
    else
        CLG_TRY(get_part(dev, a, pl, &k));
    clg_kargs g = {k, 0, CL_SUCCESS};
    clg_ka_int(&g, a->M);
    clg_ka_int(&g, a->N);
    clg_ka_int(&g, a->K);
    clg_ka_int(&g, pl->kchunk);
    clg_ka_int(&g, pl->S);
    clg_gemm_ka_inputs(&g, a);
    clg_ka_mem(&g, W ? W : a->C);
    clg_ka_int(&g, W ? 0 : 1);
    ka_epilogue(&g, a);
    CLG_TRY(CLG_KA_DONE(err, &g, "arguments of gemm_splitk_part"));
    int batch = a->batch > 0 ? a->batch : 1;
    if (pl->dot) {
        size_t gws[3] = {(size_t)CLG_CEIL_DIV(a->M, DOT_R), (size_t)CLG_CEIL_DIV(a->N, DOT_R),
                         (size_t)batch * (size_t)pl->S};
        return clg_launch(dev, k, 3, gws, NULL, CLG_LAUNCH_PAD, ev);
    }
    size_t wd = (size_t)(pl->TS / pl->RT);
    size_t gws[3] = {(size_t)CLG_CEIL_DIV(a->N, pl->TS) * wd, (size_t)CLG_CEIL_DIV(a->M, pl->TS) * wd,
                     (size_t)batch * (size_t)pl->S};
    size_t lws[3] = {wd, wd, 1}; /* reqd_work_group_size */
    return clg_launch(dev, k, 3, gws, lws, CLG_LAUNCH_FIXED, ev);
}

static clg_status launch_reduce(clg_device *dev, const clg_gemm_args *a, const clg_splitk_plan *pl, cl_mem W,
                                cl_event *ev)
{
    cl_kernel k;
    CLG_TRY(clg_kernel_get(dev, "gemm_splitk", "", "gemm_splitk_reduce", &k));
    clg_kargs g = {k, 0, CL_SUCCESS};
    clg_ka_int(&g, a->M);
    clg_ka_int(&g, a->N);
    clg_ka_int(&g, pl->S);
    clg_ka_mem(&g, W);
    ka_epilogue(&g, a);
    CLG_TRY(CLG_KA_DONE(clg_dev_err(dev), &g, "arguments of gemm_splitk_reduce"));
    size_t gws[3] = {(size_t)a->N, (size_t)a->M, (size_t)(a->batch > 0 ? a->batch : 1)};
    return clg_launch(dev, k, 3, gws, NULL, CLG_LAUNCH_PAD, ev);
}

clg_status clg_gemm_splitk(clg_device *dev, const clg_gemm_args *a, int S, cl_event *first, cl_event *last)
{
    clg_splitk_plan pl;
    clg_gemm_splitk_plan_for(dev, a, S, &pl);
    return clg_gemm_splitk_plan_run(dev, a, &pl, first, last);
}

clg_status clg_gemm_splitk_plan_run(clg_device *dev, const clg_gemm_args *a, const clg_splitk_plan *plan,
                                    cl_event *first, cl_event *last)
{
    if (first)
        *first = NULL;
    if (last)
        *last = NULL;
    CLG_TRY(check(dev, a));
    clg_splitk_plan pl = *plan;
    if (pl.dot && (a->ta || !a->tb))
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG,
                           "gemm_splitk: the dot kernel computes A * B^T only (ta=%d tb=%d)", a->ta, a->tb);
    if (pl.S < 1 || pl.kchunk < 0 || (pl.S > 1 && (long)pl.S * pl.kchunk < a->K) ||
        (pl.S == 1 && pl.kchunk < a->K) || (!pl.dot && (pl.TS < pl.RT || pl.RT < 1 || pl.TS % pl.RT)))
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG,
                           "gemm_splitk: plan S=%d kchunk=%d TS=%d RT=%d does not cover K=%d", pl.S, pl.kchunk,
                           pl.TS, pl.RT, a->K);
    if (a->M == 0 || a->N == 0)
        return CLG_OK;
    cl_mem W = NULL;
    int batch = a->batch > 0 ? a->batch : 1;
    if (pl.S > 1)
        CLG_TRY(clg_buf_alloc(dev, sizeof(float) * (size_t)a->M * a->N * batch * pl.S, &W));
    cl_event e0 = NULL, e1 = NULL;
    clg_status st = launch_part(dev, a, &pl, W, &e0);
    if (st == CLG_OK && W)
        st = launch_reduce(dev, a, &pl, W, &e1);
    /* in-order queue: a block handed out again is only used after ours */
    clg_buf_release(dev, W);
    if (st == CLG_OK && !e1 && e0) {
        e1 = e0;
        clRetainEvent(e0);
    }
    if (st == CLG_OK && first) {
        *first = e0;
        e0 = NULL;
    }
    if (st == CLG_OK && last) {
        *last = e1;
        e1 = NULL;
    }
    if (e0)
        clReleaseEvent(e0);
    if (e1)
        clReleaseEvent(e1);
    return st;
}
