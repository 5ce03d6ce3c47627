/* Device-to-device gradient reduction: when every lane's device is in one
 * shared cl_context, a bucket is summed by a kernel on the device of the
 * last lane to finish it, reading the other lanes' arenas directly, and
 * every lane copies the sum into its own arena (clEnqueueCopyBuffer), with
 * no host copy of the gradients at all. The host path (dp.c) reads every
 * bucket to the host, sums there and writes it back. Which one is faster
 * depends on the devices and the link between them: clg_dp_create measures
 * both on the real arenas and keeps the faster (CLGRAD_DP_REDUCE or the
 * `reduce` parameter force one). Both compute the global gradient norm to
 * the bit alike (the host path copies lane_add's partial sums:
 * clg_optk_sumsq_host), so the measured choice, which may differ between a
 * run and its resumption, never changes a clipped update. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/optim_kernels.h"
#include "parallel/dp.h"

#define RED_GROUPS 64 /* partial sums of squares per bucket */

static clg_status lane_add(clg_dp *dp, clg_lane *r, cl_mem a, cl_mem b, size_t k0, size_t n, int sq, int bucket,
                           cl_event *ev)
{
    return clg_optk_lane_add(r->dev, dp->gred, a, b, k0, n, sq, dp->gpart, bucket * RED_GROUPS, RED_GROUPS, ev);
}

clg_status clg_dp_dev_sum(clg_dp *dp, clg_lane *r, int b, const int *act, int na)
{
    clg_err *err = clg_dev_err(r->dev);
    size_t k0 = dp->b_off[b] / sizeof(float), n = dp->b_bytes[b] / sizeof(float);
    cl_event last = NULL;
    /* gred = a0 (+ a1); gred += a2; ... in lane order; squares on the last pass */
    CLG_TRY(lane_add(dp, r, dp->lanes[act[0]].arena, na > 1 ? dp->lanes[act[1]].arena : NULL, k0, n, na <= 2, b,
                     na <= 2 ? &last : NULL));
    for (int i = 2; i < na; i++)
        CLG_TRY(lane_add(dp, r, dp->gred, dp->lanes[act[i]].arena, k0, n, i == na - 1, b, i == na - 1 ? &last : NULL));
    clg_release_event(&dp->sev[b]);
    dp->sev[b] = last;
    clg_release_event(&dp->pev[b]);
    CLG_CL_CHECK(err, clEnqueueReadBuffer(r->dev->queue, dp->gpart, CL_FALSE, (size_t)b * RED_GROUPS * sizeof(float),
                                          RED_GROUPS * sizeof(float), dp->hpart + (size_t)b * RED_GROUPS, 0, NULL,
                                          &dp->pev[b]));
    CLG_CL_CHECK(err, clFlush(r->dev->queue));
    return CLG_OK;
}

clg_status clg_dp_dev_writeback(clg_dp *dp, clg_lane *l, int b, size_t off, size_t bytes, cl_event *ev)
{
    CLG_CL_CHECK(clg_dev_err(l->dev),
                 clEnqueueCopyBuffer(l->dev->queue, dp->gred, l->arena, off, off, bytes, 1, &dp->sev[b], ev));
    return CLG_OK;
}

clg_status clg_dp_dev_sumsq(clg_dp *dp, clg_lane *l, double *sq)
{
    *sq = 0;
    if (dp->nbuckets > 0)
        CLG_CL_CHECK(clg_dev_err(l->dev), clWaitForEvents((cl_uint)dp->nbuckets, dp->pev));
    /* fixed order, every lane the same norm, and the host path's: each
     * bucket's partials in double, then the buckets (as dp.c adds b_sumsq) */
    for (int b = 0; b < dp->nbuckets; b++) {
        double bs = 0;
        for (int g = 0; g < RED_GROUPS; g++)
            bs += dp->hpart[(size_t)b * RED_GROUPS + g];
        *sq += bs;
    }
    return CLG_OK;
}

double clg_dp_bucket_sumsq(const clg_dp *dp, const float *x, size_t n)
{
    return clg_optk_sumsq_host(x, n, dp->red_wg, RED_GROUPS);
}

/* The norm grid of bucket b (work-items; *wg its group size). */
static size_t bucket_grid(const clg_dp *dp, int b, int *wg)
{
    *wg = dp->red_wg;
    return clg_optk_sumsq_grid(dp->b_bytes[b] / sizeof(float), wg, RED_GROUPS);
}

size_t clg_dp_bucket_items(const clg_dp *dp) { return (size_t)RED_GROUPS * (size_t)CLG_MAX(dp->red_wg, 1); }

void clg_dp_bucket_part(clg_dp *dp, int b, int p, const int *act, int na)
{
    int wg;
    size_t global = bucket_grid(dp, b, &wg), k0 = dp->b_off[b] / sizeof(float), n = dp->b_bytes[b] / sizeof(float);
    size_t t0 = global * (size_t)p / (size_t)dp->nparts, t1 = global * (size_t)(p + 1) / (size_t)dp->nparts;
    float *acc = dp->b_items + (size_t)b * dp->b_grid;
    if (dp->inplace) { /* every lane's mapped arena (the only bucket, at offset 0) gets the sum */
        float *buf[CLG_DP_MAX_LANES];
        for (int i = 0; i < na; i++)
            buf[i] = dp->bmap[act[i]];
        clg_optk_sum_sq_back(buf, na, n, global, t0, t1, acc);
        return;
    }
    const float *src[CLG_DP_MAX_LANES];
    for (int i = 0; i < na; i++) /* mapped: the lane's arena itself (the only bucket, at offset 0) */
        src[i] = dp->hmap ? (const float *)dp->bmap[act[i]] : dp->lanes[act[i]].ghost + k0;
    clg_optk_sum_sq_part(dp->gsum + k0, src, na, n, global, t0, t1, acc);
}

double clg_dp_bucket_tree(const clg_dp *dp, int b)
{
    int wg;
    size_t global = bucket_grid(dp, b, &wg);
    return clg_optk_sumsq_tree(dp->b_items + (size_t)b * dp->b_grid, wg, global / (size_t)wg);
}

int clg_dp_host_maps(const clg_dp *dp, const char *mode)
{
    const clg_opts *o = &dp->lanes[0].dev->ctx->opts;
    if (dp->dev_reduce || dp->nbuckets != 1 || (mode && strcmp(mode, "copy") == 0 &&
                                                 o->source[CLG_OPT_ID_dp_reduce] == CLG_OPTION_DEFAULT))
        return 0;
    for (int l = 0; l < dp->n; l++) { /* CPU devices whose memory is the host's: a map is the storage itself */
        cl_bool unified = CL_FALSE;
        if (dp->lanes[l].dev->info.type != CLG_DEVICE_CPU ||
            clGetDeviceInfo(dp->lanes[l].dev->id, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, NULL) !=
                CL_SUCCESS ||
            !unified)
            return 0;
    }
    return 1;
}

void clg_dp_dev_free(clg_dp *dp)
{
    for (int b = 0; dp->sev && b < dp->nbuckets; b++) {
        if (dp->pev[b]) /* a failed step may leave the read into hpart in flight: not into freed memory */
            clWaitForEvents(1, &dp->pev[b]);
        clg_release_event(&dp->sev[b]);
        clg_release_event(&dp->pev[b]);
    }
    free(dp->sev);
    free(dp->pev);
    free(dp->hpart);
    if (dp->gred)
        clReleaseMemObject(dp->gred);
    if (dp->gpart)
        clReleaseMemObject(dp->gpart);
    dp->sev = dp->pev = NULL;
    dp->hpart = NULL;
    dp->gred = dp->gpart = NULL;
}

/* The first buckets, up to MEASURE_BYTES: what the two paths are timed on
 * (a large model's arena need not be reduced 8 times at start-up). */
#define MEASURE_BYTES ((size_t)64 << 20)

static int measured_buckets(const clg_dp *dp, size_t *bytes)
{
    int m = 1;
    while (m < dp->nbuckets && dp->b_off[m] + dp->b_bytes[m] <= MEASURE_BYTES)
        m++;
    *bytes = dp->b_off[m - 1] + dp->b_bytes[m - 1];
    return m;
}

/* One host-path reduction of the measured buckets over every lane (blocking). */
static clg_status time_host(clg_dp *dp, double *t)
{
    size_t bytes = 0;
    measured_buckets(dp, &bytes);
    double t0 = clg_now_sec();
    for (int l = 0; l < dp->n; l++) {
        clg_lane *ln = &dp->lanes[l];
        CLG_CL_CHECK(clg_dev_err(ln->dev), clEnqueueReadBuffer(ln->dev->queue, ln->arena, CL_TRUE, 0, bytes,
                                                               ln->ghost, 0, NULL, NULL));
    }
    size_t floats = bytes / sizeof(float);
    for (size_t k = 0; k < floats; k++) {
        float acc = dp->lanes[0].ghost[k];
        for (int l = 1; l < dp->n; l++)
            acc += dp->lanes[l].ghost[k];
        dp->gsum[k] = acc;
    }
    double sq = clg_dp_bucket_sumsq(dp, dp->gsum, floats); /* its cost is part of the path's */
    for (int l = 0; l < dp->n; l++) {
        clg_lane *ln = &dp->lanes[l];
        CLG_CL_CHECK(clg_dev_err(ln->dev), clEnqueueWriteBuffer(ln->dev->queue, ln->arena, CL_TRUE, 0, bytes,
                                                                dp->gsum, 0, NULL, NULL));
    }
    dp->b_sumsq[0] = sq; /* keeps the squares, as the real path needs them */
    *t = clg_now_sec() - t0;
    return CLG_OK;
}

/* One device-path reduction of the measured buckets over every lane
 * (blocking), summed on lane 0's device. */
static clg_status time_dev(clg_dp *dp, double *t)
{
    size_t bytes = 0;
    int nb = measured_buckets(dp, &bytes);
    int act[CLG_DP_MAX_LANES];
    for (int l = 0; l < dp->n; l++)
        act[l] = l;
    double t0 = clg_now_sec();
    for (int b = 0; b < nb; b++) {
        CLG_TRY(clg_dp_dev_sum(dp, &dp->lanes[0], b, act, dp->n));
        for (int l = 0; l < dp->n; l++)
            CLG_TRY(clg_dp_dev_writeback(dp, &dp->lanes[l], b, dp->b_off[b], dp->b_bytes[b], NULL));
    }
    for (int l = 0; l < dp->n; l++)
        CLG_CL_CHECK(clg_dev_err(dp->lanes[l].dev), clFinish(dp->lanes[l].dev->queue));
    CLG_CL_CHECK(clg_dev_err(dp->lanes[0].dev), clWaitForEvents((cl_uint)nb, dp->pev));
    *t = clg_now_sec() - t0;
    return CLG_OK;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

clg_status clg_dp_dev_setup(clg_dp *dp, const char *mode, clg_err *err)
{
    dp->dev_reduce = 0;
    CLG_TRY(clg_optk_red_wg(dp->lanes[0].dev, &dp->red_wg)); /* both paths' norm partials */
    static const char *const modes[] = {"auto", "host", "device"}; /* option dp_reduce's choices */
    const clg_opts *o = &dp->lanes[0].dev->ctx->opts;
    if (o->source[CLG_OPT_ID_dp_reduce] != CLG_OPTION_DEFAULT)
        mode = modes[o->dp_reduce];
    if (!mode || !*mode)
        mode = "auto";
    if (strcmp(mode, "copy") == 0) /* the host path (copying: clg_dp_host_maps) */
        mode = "host";
    if (strcmp(mode, "auto") != 0 && strcmp(mode, "host") != 0 && strcmp(mode, "device") != 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "reduction '%s': expected auto, host or device", mode);
    cl_context cl = dp->lanes[0].dev->cl;
    const clg_device_info *i0 = &dp->lanes[0].dev->info;
    int shared = 1, same = 1;
    for (int l = 1; l < dp->n; l++) {
        const clg_device_info *il = &dp->lanes[l].dev->info;
        shared &= dp->lanes[l].dev->cl == cl;
        same &= strcmp(il->name, i0->name) == 0 && strcmp(il->driver_version, i0->driver_version) == 0;
    }
    /* auto: devices of one kind only. Across kinds, events of one device's
     * queue gate commands on another's, and PoCL 3.1 deadlocks when a
     * `basic` and a `pthread` device do that (a lock-order inversion inside
     * PoCL: one thread in pocl_update_event_running, the waiters in
     * clWaitForEvents); "device" still forces it. */
    if (strcmp(mode, "host") == 0 || dp->nbuckets == 0 || (strcmp(mode, "auto") == 0 && !same))
        return CLG_OK;
    if (!shared) {
        if (strcmp(mode, "device") == 0)
            return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                               "device-to-device reduction needs every device in one cl_context (one platform; "
                               "CLGRAD_SHARED_CONTEXT not 0)");
        return CLG_OK;
    }
    cl_int e = CL_SUCCESS;
    dp->gred = clCreateBuffer(cl, CL_MEM_READ_WRITE, dp->lay.bytes, NULL, &e);
    if (e == CL_SUCCESS)
        dp->gpart = clCreateBuffer(cl, CL_MEM_READ_WRITE, (size_t)dp->nbuckets * RED_GROUPS * sizeof(float), NULL, &e);
    if (e != CL_SUCCESS) {
        clg_dp_dev_free(dp);
        return clg_cl_fail(err, e, "clCreateBuffer (device-to-device reduction)", __FILE__, __LINE__);
    }
    dp->sev = calloc((size_t)dp->nbuckets, sizeof *dp->sev);
    dp->pev = calloc((size_t)dp->nbuckets, sizeof *dp->pev);
    dp->hpart = calloc((size_t)dp->nbuckets * RED_GROUPS, sizeof *dp->hpart);
    if (!dp->sev || !dp->pev || !dp->hpart) {
        clg_dp_dev_free(dp);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory for the gradient reduction");
    }
    if (strcmp(mode, "device") == 0) {
        dp->dev_reduce = 1;
        return CLG_OK;
    }
    /* auto: both paths on the real arenas, alternating, after one warm-up
     * each (kernel build); the median of 3 decides */
    double th[4], td[4];
    for (int r = 0; r < 4; r++) {
        clg_status st = time_host(dp, &th[r]);
        if (st == CLG_OK)
            st = time_dev(dp, &td[r]);
        if (st != CLG_OK) { /* the device path does not work here: the host one */
            clg_log(1, "device-to-device reduction unavailable: %s", clg_dev_err(dp->lanes[0].dev)->msg);
            clg_dp_dev_free(dp);
            return CLG_OK;
        }
    }
    qsort(th + 1, 3, sizeof *th, cmp_d);
    qsort(td + 1, 3, sizeof *td, cmp_d);
    dp->t_red_host = th[2];
    dp->t_red_dev = td[2];
    dp->dev_reduce = td[2] < th[2];
    size_t bytes = 0;
    measured_buckets(dp, &bytes);
    clg_log(1, "gradient reduction of %.1f MiB over %d devices: host %.2f ms, device-to-device %.2f ms: %s",
            bytes / 1048576.0, dp->n, th[2] * 1e3, td[2] * 1e3, dp->dev_reduce ? "device" : "host");
    if (!dp->dev_reduce)
        clg_dp_dev_free(dp);
    return CLG_OK;
}
