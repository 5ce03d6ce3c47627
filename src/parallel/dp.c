/* Data parallelism over lanes (see dp.h). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/layers.h"
#include "ops/optim_kernels.h"
#include "parallel/comm.h"
#include "parallel/dp.h"

#define DEFAULT_BUCKET_MB 25.0

static clg_status after_layer(void *user, int layer, int backward);
static clg_status gather(void *user, int layer, int phase, const double *mine, size_t n, const double *const **all,
                         int *nall);
static clg_status lane_train_fn(void *arg, int lane);
static clg_status arrive_bucket(clg_dp *dp, clg_lane *l, int b);

/* Gradients are reduced: over several lanes and / or several MPI ranks. */
static int reducing(const clg_dp *dp) { return dp->n > 1 || dp->ranks > 1; }

/* st with the device's own detail, on the context, naming the device. */
static clg_status device_failed(clg_dp *dp, clg_status st, const clg_device *dev)
{
    return clg_err_set(&dp->ctx->err, st, "device %d (%s): %s", dev->index, dev->info.name, dev->err.msg);
}

// ---- device selection ----

clg_status clg_dp_select(clg_ctx *ctx, const char *sel, int device, int *devs, int *ndev)
{
    *ndev = 0;
    if (!sel) { /* checked against the context by clg_dp_create */
        devs[0] = device;
        *ndev = 1;
        return CLG_OK;
    }
    clg_device_info infos[CLG_DP_MAX_LANES];
    int n = CLG_MIN(ctx->ndev, CLG_DP_MAX_LANES);
    for (int i = 0; i < n; i++)
        infos[i] = ctx->devs[i].info;
    return clg_select_devices(&ctx->err, sel, infos, n, devs, CLG_DP_MAX_LANES, ndev);
}

// ---- creation ----

#define SPLIT_MAX_WEIGHT 1e6 /* a weight's upper bound and the largest ratio of two non-zero weights */

/* One split weight: plain decimal (digits, an optional fraction and exponent;
 * no sign, spaces, hex, inf or nan) in [0, SPLIT_MAX_WEIGHT]. Returns the end or NULL. */
static const char *split_weight(const char *p, double *v)
{
    const char *s = p;
    int digits = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        digits++;
    if (*s == '.')
        for (s++; *s >= '0' && *s <= '9'; s++)
            digits++;
    if (!digits)
        return NULL;
    if (*s == 'e' || *s == 'E') {
        s++;
        s += *s == '-' || *s == '+';
        if (*s < '0' || *s > '9')
            return NULL;
        while (*s >= '0' && *s <= '9')
            s++;
    }
    if (*s != ',' && *s != 0)
        return NULL;
    char *end = NULL;
    *v = strtod(p, &end);
    if (end != s || !isfinite(*v) || *v < 0 || *v > SPLIT_MAX_WEIGHT)
        return NULL;
    return s;
}

clg_status clg_dp_parse_split(clg_err *err, const char *spec, int n, double *w, int *fixed)
{
    *fixed = 0;
    for (int i = 0; i < n; i++)
        w[i] = 1.0 / n;
    if (!spec || strcmp(spec, "auto") == 0)
        return CLG_OK;
    *fixed = 1;
    if (strcmp(spec, "even") == 0)
        return CLG_OK;
    double sum = 0, lo = 0, hi = 0;
    const char *p = spec;
    for (int i = 0; i < n; i++) {
        const char *end = split_weight(p, &w[i]);
        if (!end || (*end == 0 && i != n - 1) || (*end == ',' && i == n - 1))
            return clg_err_set(err, CLG_ERR_INVALID_ARG,
                               "split '%s': expected auto, even or %d weights separated by commas, each a plain "
                               "decimal number in [0, %g] (no spaces, signs, hex, inf or nan)",
                               spec, n, SPLIT_MAX_WEIGHT);
        sum += w[i];
        if (w[i] > 0) {
            lo = lo > 0 && lo < w[i] ? lo : w[i];
            hi = hi > w[i] ? hi : w[i];
        }
        p = end + 1;
    }
    if (!(sum > 0))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "split '%s': the weights must not all be 0", spec);
    if (hi > lo * SPLIT_MAX_WEIGHT)
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "split '%s': the non-zero weights are more than %g apart in ratio (%g / %g)", spec,
                           SPLIT_MAX_WEIGHT, hi, lo);
    for (int i = 0; i < n; i++)
        w[i] /= sum;
    return CLG_OK;
}

/* Arena layout: trainable parameters in reverse layer order (the order
 * backward finishes them), each aligned for a sub-buffer on every device. */
static clg_status make_layout(clg_dp *dp, clg_err *err)
{
    clg_param_ref *refs = NULL;
    int n = 0;
    CLG_TRY(clg_replica_params(dp->lanes[0].rep, 1, &refs, &n));
    size_t align = 128;
    for (int l = 0; l < dp->n; l++) {
        cl_uint bits = 0;
        if (clGetDeviceInfo(dp->lanes[l].dev->id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL) ==
                CL_SUCCESS &&
            bits / 8 > align)
            align = bits / 8;
    }
    dp->align = align;
    clg_grad_layout *lay = &dp->lay;
    lay->n = n;
    lay->off = calloc((size_t)CLG_MAX(n, 1), sizeof *lay->off);
    dp->b_off = calloc((size_t)CLG_MAX(n, 1), sizeof *dp->b_off);
    dp->b_bytes = calloc((size_t)CLG_MAX(n, 1), sizeof *dp->b_bytes);
    dp->b_layer = calloc((size_t)CLG_MAX(n, 1), sizeof *dp->b_layer);
    if (!lay->off || !dp->b_off || !dp->b_bytes || !dp->b_layer) {
        free(refs);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    size_t pos = 0;
    dp->nbuckets = 0;
    size_t bstart = 0;
    for (int i = n - 1; i >= 0; i--) {
        lay->off[i] = pos;
        pos += (refs[i].param->numel * sizeof(float) + align - 1) / align * align;
        int layer = refs[i].layer->index;
        /* a bucket closes when full, and only between layers (a layer's
         * parameters are finished together) */
        int last = i == 0 || refs[i - 1].layer->index != layer;
        if (last && (pos - bstart >= dp->bucket_bytes || i == 0)) {
            dp->b_off[dp->nbuckets] = bstart;
            dp->b_bytes[dp->nbuckets] = pos - bstart;
            dp->b_layer[dp->nbuckets] = layer;
            dp->nbuckets++;
            bstart = pos;
        }
    }
    lay->bytes = pos;
    free(refs);
    return CLG_OK;
}

/* Sharded optimizer state: lane l owns floats [k0, k1) of the arena, an
 * even split in units of the arena's alignment (sub-buffer origins); the
 * last lane also takes the tail shorter than a unit. */
static clg_status make_shards(clg_dp *dp, clg_err *err)
{
    /* in whole update work-groups too, so a slice's launch groups the elements as the whole arena's
     * does and a compiler's per-group code paths (vectorised, partial group) match */
    size_t ub = CLG_MAX(dp->align, (size_t)CLG_OPTK_STEP_WG * sizeof(float));
    size_t unit = ub / sizeof(float), units = dp->lay.bytes / ub;
    for (int l = 0; l < dp->n; l++) {
        dp->sh_k0[l] = units * (size_t)l / (size_t)dp->n * unit;
        dp->sh_k1[l] = units * (size_t)(l + 1) / (size_t)dp->n * unit;
    }
    dp->sh_k1[dp->n - 1] = dp->lay.bytes / sizeof(float);
    if (!(dp->phost = calloc(CLG_MAX(dp->lay.bytes / sizeof(float), 1), sizeof(float))))
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory for the parameter gather");
    return CLG_OK;
}

static clg_status make_reduction(clg_dp *dp, const char *mode, clg_err *err)
{
    CLG_TRY(make_layout(dp, err));
    if (dp->shard)
        CLG_TRY(make_shards(dp, err));
    size_t floats = dp->lay.bytes / sizeof(float);
    dp->gsum = calloc(CLG_MAX(floats, 1), sizeof(float));
    dp->b_sumsq = calloc((size_t)CLG_MAX(dp->nbuckets, 1), sizeof(double));
    dp->arrived = calloc((size_t)CLG_MAX(dp->nbuckets, 1), sizeof(int));
    dp->summed = calloc((size_t)CLG_MAX(dp->nbuckets, 1), sizeof(int));
    if (!dp->gsum || !dp->b_sumsq || !dp->arrived || !dp->summed)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory for the gradient reduction");
    /* non-trainable state (batch-norm running statistics) */
    clg_param_ref *all = NULL;
    int na = 0;
    CLG_TRY(clg_replica_params(dp->lanes[0].rep, 0, &all, &na));
    dp->srefs = calloc((size_t)CLG_MAX(na, 1), sizeof *dp->srefs);
    if (!dp->srefs) {
        free(all);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    for (int i = 0; i < na; i++)
        if (!all[i].param->trainable) {
            dp->srefs[dp->nstate++] = all[i];
            dp->state_floats += all[i].param->numel;
        }
    free(all);
    dp->ssum = calloc(CLG_MAX(dp->state_floats, 1), sizeof(float));
    if (!dp->ssum)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    /* across ranks: a channel per bucket and one for the state (comm.h; none with one rank) */
    if (dp->ranks > 1) {
        if (!(dp->b_op = calloc((size_t)CLG_MAX(dp->nbuckets, 1), sizeof *dp->b_op)))
            return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
        for (int b = 0; b < dp->nbuckets; b++)
            CLG_TRY(clg_comm_op_create(err, "gradient all-reduce", &dp->b_op[b]));
        if (dp->nstate > 0)
            CLG_TRY(clg_comm_op_create(err, "batch-norm statistics all-reduce", &dp->s_op));
    }
    for (int l = 0; l < dp->n; l++) {
        clg_lane *ln = &dp->lanes[l];
        CLG_TRY(clg_lane_grad_arena(ln, &dp->lay));
        ln->ghost = calloc(CLG_MAX(floats, 1), sizeof(float));
        ln->shost = calloc(CLG_MAX(dp->state_floats, 1), sizeof(float));
        ln->bev = calloc((size_t)CLG_MAX(dp->nbuckets, 1), sizeof(cl_event));
        if (!ln->ghost || !ln->shost || !ln->bev)
            return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory for the gradient reduction");
    }
    /* across ranks the all-reduce starts from the host sum */
    CLG_TRY(clg_dp_dev_setup(dp, dp->ranks > 1 && (!mode || strcmp(mode, "copy") != 0) ? "host" : mode, err));
    dp->hmap = clg_dp_host_maps(dp, mode);
    if (dp->hmap && !(dp->bmap = calloc((size_t)dp->n, sizeof *dp->bmap)))
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory for the gradient reduction");
    dp->nparts = dp->n > 1 ? 2 * dp->n : 1; /* finer than the lanes: a lane woken late finds the rest taken */
    dp->b_grid = clg_dp_bucket_items(dp);
    dp->p_next = calloc((size_t)CLG_MAX(dp->nbuckets, 1), sizeof(int));
    dp->p_fin = calloc((size_t)CLG_MAX(dp->nbuckets, 1), sizeof(int));
    dp->b_items = calloc((size_t)CLG_MAX(dp->nbuckets, 1) * dp->b_grid, sizeof(float));
    if (!dp->p_next || !dp->p_fin || !dp->b_items)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory for the gradient reduction");
    if (dp->ranks > 1 && dp->dev_reduce)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "device-to-device reduction (CLGRAD_DP_REDUCE=device) with %d MPI ranks: the all-reduce "
                           "across ranks needs the host sum (use host or auto)",
                           dp->ranks);
    return CLG_OK;
}

/* Every lane's device of one kind (same fingerprint: vendor, name, driver, compute units, ...). */
static int same_kind(const clg_dp *dp)
{
    char fp0[700], fp[700];
    clg_device_fingerprint(dp->lanes[0].dev, fp0, sizeof fp0);
    for (int i = 1; i < dp->n; i++) {
        clg_device_fingerprint(dp->lanes[i].dev, fp, sizeof fp);
        if (strcmp(fp, fp0) != 0)
            return 0;
    }
    return 1;
}

clg_status clg_dp_create(clg_ctx *ctx, clg_net *net, const int *devs, int ndev, uint64_t seed,
                         const clg_dp_params *p, clg_dp **out)
{
    *out = NULL;
    clg_err *err = &ctx->err;
    if (ndev < 1 || ndev > CLG_DP_MAX_LANES)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "%d devices selected (1 to %d supported)", ndev,
                           CLG_DP_MAX_LANES);
    for (int i = 0; i < ndev; i++) {
        if (devs[i] < 0 || devs[i] >= ctx->ndev)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "device index %d outside the context's %d devices", devs[i],
                               ctx->ndev);
        for (int j = 0; j < i; j++)
            if (devs[j] == devs[i])
                return clg_err_set(err, CLG_ERR_INVALID_ARG, "device %d selected twice", devs[i]);
    }
    clg_dp *dp = calloc(1, sizeof *dp);
    if (!dp)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    pthread_mutex_init(&dp->mu, NULL);
    pthread_cond_init(&dp->cv, NULL);
    dp->ctx = ctx;
    dp->net = net;
    dp->n = ndev;
    dp->sample = (size_t)net->in_c * net->in_h * net->in_w;
    dp->fail_lane = -1;
    dp->slow_lane = -1;
    dp->min_slice = 1;
    for (int i = 0; i < net->nlayers; i++)
        if (strcmp(net->proto[i].ops->type, "batchnorm") == 0)
            dp->min_slice = 2;
    dp->fault_lane = -1;
    dp->ranks = clg_comm_size();
    dp->shard = p && p->shard_optimizer && ndev > 1; /* one lane: its state is the whole anyway */
    double mb = p && p->bucket_mb > 0 ? p->bucket_mb : DEFAULT_BUCKET_MB;
    dp->bucket_bytes = (size_t)(mb * 1048576.0);
    if (dp->bucket_bytes < 4096)
        dp->bucket_bytes = 4096;
    const char *slow = ctx->opts.test_slow_lane; /* test aid, see dp.h */
    if (slow[0] && sscanf(slow, "%d:%lf", &dp->slow_lane, &dp->slow_factor) != 2)
        dp->slow_lane = -1;
    const char *sp = p ? p->split : NULL;
    if (clg_comm_deterministic() && (!sp || strcmp(sp, "auto") == 0))
        sp = "even"; /* --deterministic: no split by measured (timing-dependent) speed */
    clg_status st = clg_dp_parse_split(err, sp, ndev, dp->share, &dp->split_fixed);
    if (st == CLG_OK && (!(dp->lanes = calloc((size_t)ndev, sizeof *dp->lanes)) ||
                         !(dp->hooks = calloc((size_t)ndev, sizeof *dp->hooks))))
        st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    for (int i = 0; i < ndev && st == CLG_OK; i++) {
        clg_device *dev = &ctx->devs[devs[i]];
        dev->pool.total_peak = dev->pool.stats.bytes_in_use + dev->pool.direct_bytes; /* this model's peak */
        /* the lane's own batch is at most the global batch */
        st = clg_lane_init(&dp->lanes[i], i, net, dev, seed, net->batch, p && p->stub_lanes);
        dp->hooks[i] = (clg_dp_hook){dp, i, {gather, &dp->hooks[i]}};
        if (st == CLG_OK) {
            clg_replica *r = dp->lanes[i].rep;
            r->after_layer = after_layer;
            r->after_layer_user = &dp->hooks[i];
            for (int k = 0; k < r->nlayers && ndev > 1; k++)
                r->layers[k].sync = &dp->hooks[i].sync;
        }
        if (st != CLG_OK)
            st = device_failed(dp, st, dev);
    }
    dp->same_kind = st == CLG_OK && ndev > 1 && same_kind(dp);
    if (st == CLG_OK && reducing(dp))
        st = make_reduction(dp, p ? p->reduce : NULL, err);
    if (st == CLG_OK && ndev > 1 && !(dp->gathers = calloc(2 * (size_t)net->nlayers, sizeof *dp->gathers)))
        st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    if (st == CLG_OK)
        st = clg_team_create_ex(err, ndev, (int)ctx->opts.dp_caller_lane, &dp->team); /* spin: set_spin */
    dp->spin_us = (int)ctx->opts.dp_spin_us;
    dp->ncpu = (int)CLG_MAX(1, sysconf(_SC_NPROCESSORS_ONLN));
    if (st != CLG_OK) {
        clg_dp_free(dp);
        return st;
    }
    *out = dp;
    return CLG_OK;
}

/* Lane l's arena mapping (host path, hmap) ended: enqueued on its queue. */
static clg_status unmap_arena(clg_dp *dp, clg_lane *l)
{
    void **m = dp->bmap ? &dp->bmap[l->index] : NULL;
    if (!m || !*m)
        return CLG_OK;
    cl_int e = clEnqueueUnmapMemObject(l->dev->queue, l->arena, *m, 0, NULL, NULL);
    *m = NULL;
    if (e != CL_SUCCESS)
        return clg_cl_fail(clg_dev_err(l->dev), e, "clEnqueueUnmapMemObject (gradient arena)", __FILE__, __LINE__);
    return CLG_OK;
}

void clg_dp_free(clg_dp *dp)
{
    if (!dp)
        return;
    clg_team_free(dp->team);
    for (int i = 0; dp->bmap && i < dp->n; i++) /* a mapping left by a failed step */
        if (dp->bmap[i] && unmap_arena(dp, &dp->lanes[i]) == CLG_OK)
            clFinish(dp->lanes[i].dev->queue);
    free(dp->bmap);
    for (int i = 0; dp->lanes && i < dp->n; i++) {
        for (int b = 0; dp->lanes[i].bev && b < dp->nbuckets; b++) /* reads left by a failed step */
            clg_release_event(&dp->lanes[i].bev[b]);
        clg_lane_release(&dp->lanes[i]);
    }
    free(dp->lanes);
    free(dp->hooks);
    free(dp->lay.off);
    free(dp->b_off);
    free(dp->b_bytes);
    free(dp->b_layer);
    free(dp->gsum);
    free(dp->phost);
    free(dp->b_sumsq);
    free(dp->arrived);
    free(dp->summed);
    free(dp->p_next);
    free(dp->p_fin);
    free(dp->b_items);
    clg_dp_dev_free(dp);
    for (int i = 0; dp->gathers && i < 2 * dp->net->nlayers; i++) {
        free(dp->gathers[i].buf);
        free(dp->gathers[i].all);
    }
    free(dp->gathers);
    free(dp->srefs);
    free(dp->ssum);
    for (int b = 0; dp->b_op && b < dp->nbuckets; b++)
        clg_comm_op_free(dp->b_op[b]);
    free(dp->b_op);
    clg_comm_op_free(dp->s_op);
    pthread_mutex_destroy(&dp->mu);
    pthread_cond_destroy(&dp->cv);
    free(dp);
}

// ---- feed ----

clg_status clg_dp_stage_wait(clg_dp *dp, int s)
{
    for (int i = 0; i < dp->n; i++)
        CLG_TRY(clg_lane_stage_wait(&dp->lanes[i], s));
    return CLG_OK;
}

/* Split of n samples by the shares, in granules of g samples (largest
 * remainder first; the n mod g samples left go to the largest share):
 * small moves of the measured speeds then leave the per-device batch sizes
 * alone, and every new size costs kernel specialisation and algorithm
 * timing on some devices. g = n / (8 * lanes), between 1 and 8. */
static void split(const clg_dp *dp, int n, int *cnt)
{
    int g = CLG_MAX(1, CLG_MIN(8, n / (8 * dp->n)));
    int units = n / g;
    double rem[CLG_DP_MAX_LANES];
    int given = 0, big = 0;
    for (int i = 0; i < dp->n; i++) {
        double want = dp->share[i] * units;
        cnt[i] = (int)floor(want);
        rem[i] = want - cnt[i];
        given += cnt[i];
        if (dp->share[i] > dp->share[big])
            big = i;
    }
    while (given < units) { /* the largest remainder first; ties to the lower lane */
        int best = 0;
        for (int i = 1; i < dp->n; i++)
            if (rem[i] > rem[best])
                best = i;
        cnt[best]++;
        rem[best] = -1;
        given++;
    }
    for (int i = 0; i < dp->n; i++)
        cnt[i] *= g;
    cnt[big] += n - units * g;
    for (int i = 0; i < dp->n; i++) /* too small a slice joins the largest */
        if (i != big && cnt[i] > 0 && cnt[i] < dp->min_slice) {
            cnt[big] += cnt[i];
            cnt[i] = 0;
        }
}

clg_status clg_dp_upload(clg_dp *dp, int s, const float *x, const int32_t *y, int n)
{
    int off = 0, mine = n; /* this rank's slice of the global batch (all of it with one rank) */
    clg_comm_slice(n, &off, &mine);
    split(dp, mine, dp->cnt[s]);
    dp->total[s] = n;
    for (int i = 0; i < dp->n; i++) {
        clg_status st = clg_lane_upload(&dp->lanes[i], s, x, y, dp->sample, off, dp->cnt[s][i]);
        if (st == CLG_OK && dp->lanes[i].up_ev[s] && clg_trace_on(dp->trace, dp->job.step))
            clg_trace_cl(dp->trace, i, CLG_TR_TRANSFER, "upload", NULL, dp->lanes[i].up_ev[s]);
        if (st != CLG_OK)
            return device_failed(dp, st, dp->lanes[i].dev);
        off += dp->cnt[s][i];
    }
    return CLG_OK;
}

void clg_dp_shares(const clg_dp *dp, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < dp->n && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%.2f", i ? "/" : "", dp->share[i]);
}

// ---- reduction ----

static void fail(clg_dp *dp, int lane, clg_status st)
{
    pthread_mutex_lock(&dp->mu);
    if (dp->fail_lane < 0) {
        dp->fail_lane = lane;
        dp->fail_status = st;
    }
    __atomic_store_n(&dp->abort, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&dp->cv);
    pthread_mutex_unlock(&dp->mu);
}

static int ld(const int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static void set1(int *p) { __atomic_store_n(p, 1, __ATOMIC_RELEASE); }

typedef struct {
    const clg_dp *dp;
    const int *flag;
} flag_wait;

static int flag_pred(const void *p)
{
    const flag_wait *f = p;
    return ld(f->flag) || ld(&f->dp->abort);
}

static void spin_count(clg_dp *dp, int met)
{
    __atomic_add_fetch(met ? &dp->spin_hit : &dp->spin_miss, 1, __ATOMIC_RELAXED);
}

/* Waits until *flag is set (spinning first: dp->spin_now); CLG_ERR_INTERNAL when another lane failed. */
static clg_status wait_flag(clg_dp *dp, clg_lane *l, const int *flag)
{
    flag_wait fw = {dp, flag};
    if (dp->spin_now > 0 && !flag_pred(&fw))
        spin_count(dp, clg_spin_until(flag_pred, &fw, dp->spin_now));
    pthread_mutex_lock(&dp->mu);
    while (!*flag && !dp->abort)
        pthread_cond_wait(&dp->cv, &dp->mu);
    int ok = *flag;
    pthread_mutex_unlock(&dp->mu);
    if (!ok)
        return clg_err_set(clg_dev_err(l->dev), CLG_ERR_INTERNAL, "step abandoned: another device failed");
    return CLG_OK;
}

static int active(const clg_dp *dp, int lane) { return dp->cnt[dp->job.stage][lane] > 0; }

/* The active lanes in lane order (none: this rank has no samples in the batch). */
static int active_lanes(const clg_dp *dp, int *act)
{
    int na = 0;
    for (int l = 0; l < dp->n; l++)
        if (active(dp, l))
            act[na++] = l;
    return na;
}

/* Device to device: sums bucket b over the active lanes in lane order on
 * the device of r, the last lane to finish it (called once). */
static clg_status sum_bucket(clg_dp *dp, clg_lane *r, int b)
{
    int act[CLG_DP_MAX_LANES], na = active_lanes(dp, act);
    return clg_dp_dev_sum(dp, r, b, act, na);
}

/* Host path, with dp->mu held (released while summing): takes and sums
 * parts of buckets every lane's copy of which has arrived (only bucket
 * `want`; -1: any) until none is left to take. The lane finishing a
 * bucket's last part adds up its norm, starts its all-reduce across ranks
 * (b_sumsq: the global norm when that completes) and marks it summed. */
static void help_sums(clg_dp *dp, clg_lane *l, int want, double *t_end)
{
    for (int first = want >= 0;; first = 0) {
        int b = -1;
        for (int k = want < 0 ? 0 : want; k < dp->nbuckets && (want < 0 || k == want) && b < 0; k++)
            if (dp->arrived[k] == dp->n && dp->p_next[k] < dp->nparts)
                b = k;
        if (b < 0)
            return;
        int p = __atomic_fetch_add(&dp->p_next[b], 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&dp->mu);
        double t0 = clg_now_sec();
        int act[CLG_DP_MAX_LANES], na = active_lanes(dp, act);
        clg_dp_bucket_part(dp, b, p, act, na);
        pthread_mutex_lock(&dp->mu);
        int last = ++dp->p_fin[b] == dp->nparts;
        pthread_mutex_unlock(&dp->mu);
        if (last) {
            size_t k0 = dp->b_off[b] / sizeof(float);
            dp->b_sumsq[b] = clg_dp_bucket_tree(dp, b);
            if (dp->b_op)
                clg_comm_op_start(dp->b_op[b], dp->gsum + k0, dp->b_bytes[b] / sizeof(float), &dp->b_sumsq[b]);
        }
        *t_end = clg_now_sec();
        if (clg_trace_on(dp->trace, dp->job.step)) {
            char name[48];
            snprintf(name, sizeof name, "sum bucket %d%s", b, first ? "" : " (part)"); /* plain: once per step */
            clg_trace_host(dp->trace, l->index, name, t0, *t_end);
        }
        pthread_mutex_lock(&dp->mu);
        if (last) {
            set1(&dp->summed[b]);
            pthread_cond_broadcast(&dp->cv);
        }
    }
}

/* Host path: lane l's copy of bucket b has arrived; the last lane to
 * arrive opens the bucket's parts to every lane and takes the first ones. */
static void arrive_host(clg_dp *dp, clg_lane *l, int b)
{
    double t = 0;
    pthread_mutex_lock(&dp->mu);
    if (__atomic_add_fetch(&dp->arrived[b], 1, __ATOMIC_RELEASE) == dp->n) {
        pthread_cond_broadcast(&dp->cv);
        help_sums(dp, l, b, &t);
    }
    pthread_mutex_unlock(&dp->mu);
}

typedef struct {
    const clg_dp *dp;
    int b;
} sum_wait;

/* Bucket b summed, a failure, or a part of an arrived bucket to take. */
static int sum_pred(const void *p)
{
    const sum_wait *w = p;
    const clg_dp *dp = w->dp;
    if (ld(&dp->summed[w->b]) || ld(&dp->abort))
        return 1;
    for (int k = 0; k < dp->nbuckets; k++)
        if (ld(&dp->arrived[k]) == dp->n && ld(&dp->p_next[k]) < dp->nparts)
            return 1;
    return 0;
}

/* Waits until bucket b is summed (host path: summing parts of open
 * buckets meanwhile; *w0 the end of the last part summed here, if any);
 * spins first (option dp_spin_us), then sleeps. */
static clg_status wait_summed(clg_dp *dp, clg_lane *l, int b, double *w0)
{
    if (dp->dev_reduce)
        return wait_flag(dp, l, &dp->summed[b]);
    double spin_end = dp->spin_now > 0 ? clg_now_sec() + dp->spin_now * 1e-6 : 0;
    pthread_mutex_lock(&dp->mu);
    for (;;) {
        help_sums(dp, l, -1, w0);
        if (dp->summed[b] || dp->abort)
            break;
        int left = (int)((spin_end - clg_now_sec()) * 1e6);
        if (left > 0) { /* the other lanes' copies or parts usually come within microseconds */
            sum_wait sw = {dp, b};
            pthread_mutex_unlock(&dp->mu);
            int met = clg_spin_until(sum_pred, &sw, left);
            spin_count(dp, met);
            pthread_mutex_lock(&dp->mu);
            if (!met)
                spin_end = 0; /* checked once more under the lock, then sleeps */
            continue;
        }
        pthread_cond_wait(&dp->cv, &dp->mu);
    }
    int ok = dp->summed[b];
    pthread_mutex_unlock(&dp->mu);
    if (!ok)
        return clg_err_set(clg_dev_err(l->dev), CLG_ERR_INTERNAL, "step abandoned: another device failed");
    return CLG_OK;
}

/* Weighted average of the non-trainable state over the active lanes. */
static void average_state(clg_dp *dp)
{
    int s = dp->job.stage;
    double inv = 1.0 / dp->total[s];
    for (size_t k = 0; k < dp->state_floats; k++) {
        double acc = 0;
        for (int l = 0; l < dp->n; l++)
            if (active(dp, l))
                acc += dp->lanes[l].shost[k] * (dp->cnt[s][l] * inv);
        dp->ssum[k] = (float)acc;
    }
}

/* Registers lane l's arrival at a reduction point; the last lane runs fn
 * (*ran = 1 then) and marks the point done, or fails the step. */
static clg_status arrive(clg_dp *dp, clg_lane *l, int *arrived, int *done,
                         clg_status (*fn)(clg_dp *, clg_lane *, int), int b, int *ran)
{
    pthread_mutex_lock(&dp->mu);
    int last = __atomic_add_fetch(arrived, 1, __ATOMIC_RELEASE) == dp->n;
    pthread_mutex_unlock(&dp->mu);
    if (ran)
        *ran = last;
    if (!last)
        return CLG_OK;
    CLG_TRY(fn(dp, l, b));
    pthread_mutex_lock(&dp->mu);
    set1(done);
    pthread_cond_broadcast(&dp->cv);
    pthread_mutex_unlock(&dp->mu);
    return CLG_OK;
}

/* Layer exchange (clg_layer_sync.gather): deposits this lane's vector,
 * waits for every active lane's, hands them all back in lane order. */
static clg_status gather(void *user, int layer, int phase, const double *mine, size_t n, const double *const **all,
                         int *nall)
{
    clg_dp_hook *h = user;
    clg_dp *dp = h->dp;
    clg_lane *l = &dp->lanes[h->lane];
    clg_dp_gather *g = &dp->gathers[2 * layer + phase];
    int nact = 0;
    for (int i = 0; i < dp->n; i++)
        nact += active(dp, i);
    clg_status st = CLG_OK;
    pthread_mutex_lock(&dp->mu);
    if (!g->buf) { /* first use: the size of this point's vectors */
        g->buf = malloc((size_t)dp->n * n * sizeof(double));
        g->all = malloc((size_t)dp->n * sizeof *g->all);
        g->n = n;
        if (!g->buf || !g->all) {
            free(g->buf);
            g->buf = NULL;
            st = clg_err_set(clg_dev_err(l->dev), CLG_ERR_HOST_OOM, "out of memory");
        }
    } else if (g->n != n) {
        st = clg_err_set(clg_dev_err(l->dev), CLG_ERR_INTERNAL, "layer %d exchanges %zu values, another device %zu",
                         layer, n, g->n);
    }
    if (st == CLG_OK) {
        memcpy(g->buf + (size_t)h->lane * n, mine, n * sizeof(double));
        if (++g->arrived == nact) {
            int k = 0;
            for (int i = 0; i < dp->n; i++)
                if (active(dp, i))
                    g->all[k++] = g->buf + (size_t)i * n;
            set1(&g->done);
            pthread_cond_broadcast(&dp->cv);
        }
    }
    pthread_mutex_unlock(&dp->mu);
    CLG_TRY(st);
    CLG_TRY(wait_flag(dp, l, &g->done));
    *all = g->all;
    *nall = nact;
    return CLG_OK;
}

static clg_status state_fn(clg_dp *dp, clg_lane *l, int b)
{
    CLG_UNUSED(l);
    CLG_UNUSED(b);
    average_state(dp);
    clg_comm_op_start(dp->s_op, dp->ssum, dp->state_floats, NULL); /* weights: slice / global batch */
    return CLG_OK;
}

/* Trace: a marker on the compute queue; the span since the previous one
 * is `name` (the first marker of a step only starts the span). */
static clg_status mark(clg_dp *dp, clg_lane *l, const char *name)
{
    if (!clg_trace_on(dp->trace, dp->job.step))
        return CLG_OK;
    cl_event m = NULL;
    CLG_CL_CHECK(clg_dev_err(l->dev), clEnqueueMarkerWithWaitList(l->dev->queue, 0, NULL, &m));
    if (name && l->mark)
        clg_trace_cl(dp->trace, l->index, CLG_TR_COMPUTE, name, l->mark, m);
    clg_release_event(&l->mark);
    l->mark = m;
    return CLG_OK;
}

/* Host path with mapped arenas (hmap: one bucket, the whole arena): lane l's arena mapped for reading once
 * the commands before it (backward) are done; *ev that completion. */
static clg_status map_arena(clg_dp *dp, clg_lane *l, cl_event *ev)
{
    CLG_TRY(unmap_arena(dp, l)); /* left by a failed step */
    cl_int e = CL_SUCCESS;
    cl_map_flags fl = CL_MAP_READ | (dp->inplace ? CL_MAP_WRITE : 0);
    void *m = clEnqueueMapBuffer(l->dev->queue, l->arena, CL_FALSE, fl, 0, dp->b_bytes[0], 0, NULL, ev, &e);
    if (e != CL_SUCCESS)
        return clg_cl_fail(clg_dev_err(l->dev), e, "clEnqueueMapBuffer (gradient arena)", __FILE__, __LINE__);
    dp->bmap[l->index] = m;
    return CLG_OK;
}

/* After each layer: trace marker; after a backward, the read of every
 * bucket the layer finished. */
static clg_status after_layer(void *user, int layer, int backward)
{
    clg_dp_hook *h = user;
    clg_dp *dp = h->dp;
    clg_lane *l = &dp->lanes[h->lane];
    if (dp->trace) {
        char name[80];
        snprintf(name, sizeof name, "%s %s", backward ? "bwd" : "fwd", l->rep->layers[layer].name);
        CLG_TRY(mark(dp, l, name));
    }
    if (!backward || !reducing(dp) || dp->job.training < 1)
        return CLG_OK;
    for (int b = 0; b < dp->nbuckets; b++)
        if (dp->b_layer[b] == layer) {
            clg_release_event(&l->bev[b]);
            if (dp->dev_reduce) /* the bucket stays on the device: its completion only */
                CLG_CL_CHECK(clg_dev_err(l->dev), clEnqueueMarkerWithWaitList(l->dev->queue, 0, NULL, &l->bev[b]));
            else if (dp->hmap) /* the arena's own storage (CPU device), read by the sums where it is */
                CLG_TRY(map_arena(dp, l, &l->bev[b]));
            else
                CLG_CL_CHECK(clg_dev_err(l->dev),
                             clEnqueueReadBuffer(l->dev->queue, l->arena, CL_FALSE, dp->b_off[b], dp->b_bytes[b],
                                                 (char *)l->ghost + dp->b_off[b], 0, NULL, &l->bev[b]));
            CLG_CL_CHECK(clg_dev_err(l->dev), clFlush(l->dev->queue));
            if (clg_trace_on(dp->trace, dp->job.step)) {
                char name[48];
                snprintf(name, sizeof name, "%s bucket %d%s", dp->dev_reduce ? "grads ready" : "grad read", b,
                         dp->hmap ? " (mapped)" : "");
                clg_trace_cl(dp->trace, l->index, CLG_TR_TRANSFER, name, NULL, l->bev[b]);
            }
        }
    if (dp->ranks > 1) { /* across ranks: buckets already on the host arrive now (the last lane sums and
                            starts the all-reduce, overlapping the rest of backward); never blocks */
        for (int b = 0; b < dp->nbuckets; b++) {
            cl_int es = CL_QUEUED;
            if (!l->bev[b])
                continue; /* arrived, or not read yet this step */
            if (clGetEventInfo(l->bev[b], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof es, &es, NULL) != CL_SUCCESS ||
                es != CL_COMPLETE)
                break;
            CLG_TRY(arrive_bucket(dp, l, b));
        }
        clg_comm_progress();
    }
    return CLG_OK;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The lane's non-trainable state (batch-norm running statistics) to host
 * (its own shost) or from host (the averaged ssum) in srefs order. */
static clg_status state_transfer(clg_dp *dp, clg_lane *l, int to_device)
{
    size_t pos = 0;
    for (int i = 0; i < dp->nstate; i++) {
        clg_param *p = clg_replica_param_of(l->rep, &dp->srefs[i]);
        size_t bytes = p->numel * sizeof(float);
        cl_int e = to_device ? clEnqueueWriteBuffer(l->dev->queue, p->value, CL_FALSE, 0, bytes, dp->ssum + pos, 0,
                                                    NULL, NULL)
                             : clEnqueueReadBuffer(l->dev->queue, p->value, CL_TRUE, 0, bytes, l->shost + pos, 0,
                                                   NULL, NULL);
        if (e != CL_SUCCESS)
            return clg_cl_fail(clg_dev_err(l->dev), e, to_device ? "write averaged state" : "read state", __FILE__,
                               __LINE__);
        pos += p->numel;
    }
    return CLG_OK;
}

/* The lane's bucket b ready (active lanes wait for its read or marker), then
 * its arrival: the last lane sums it (and starts the all-reduce across ranks). */
static clg_status arrive_bucket(clg_dp *dp, clg_lane *l, int b)
{
    double w0 = clg_now_sec();
    if (active(dp, l->index)) {
        CLG_CL_CHECK(clg_dev_err(l->dev), clWaitForEvents(1, &l->bev[b]));
        clg_release_event(&l->bev[b]);
    }
    double w1 = clg_now_sec();
    int summed = 0;
    if (dp->dev_reduce)
        CLG_TRY(arrive(dp, l, &dp->arrived[b], &dp->summed[b], sum_bucket, b, &summed));
    else
        arrive_host(dp, l, b);
    if (clg_trace_on(dp->trace, dp->job.step)) {
        char name[48];
        snprintf(name, sizeof name, "wait own bucket %d", b);
        clg_trace_host(dp->trace, l->index, name, w0, w1);
        if (summed) {
            snprintf(name, sizeof name, "sum bucket %d", b);
            clg_trace_host(dp->trace, l->index, name, w1, clg_now_sec());
        }
    }
    return CLG_OK;
}

/* The lane's part of the reduction: its buckets to the host (arrival), the
 * sums back to the device. */
static clg_status reduce(clg_dp *dp, clg_lane *l, double t0)
{
    clg_err *err = clg_dev_err(l->dev);
    int on = active(dp, l->index);
    if (!on && l->wev) { /* the host sums may be overwritten once our last write-back is done */
        CLG_CL_CHECK(err, clWaitForEvents(1, &l->wev));
    }
    for (int b = 0; b < dp->nbuckets; b++)
        if (!on || l->bev[b]) /* (with ranks, an active lane's bucket may have arrived from after_layer) */
            CLG_TRY(arrive_bucket(dp, l, b));
    if (dp->nstate > 0) {
        if (on)
            CLG_TRY(state_transfer(dp, l, 0));
        CLG_TRY(arrive(dp, l, &dp->s_arrived, &dp->s_done, state_fn, 0, NULL));
    }
    l->t_compute = clg_now_sec() - t0;
    l->t_cpu = clg_thread_cpu_sec() - l->t_cpu0;
    l->t_pcpu = clg_process_cpu_sec() - l->t_pcpu0;
    if (l->index == dp->slow_lane && on) { /* test aid: pose as a slower device */
        sleep_s(l->t_compute * dp->slow_factor);
        l->t_compute *= 1 + dp->slow_factor;
        l->t_cpu *= 1 + dp->slow_factor;
    }
    int tr = clg_trace_on(dp->trace, dp->job.step);
    for (int b = 0; b < dp->nbuckets; b++) {
        double w0 = clg_now_sec();
        CLG_TRY(wait_summed(dp, l, b, &w0));
        if (dp->b_op) { /* and across ranks */
            CLG_TRY(clg_comm_op_wait(err, dp->b_op[b]));
            if (tr && l->index == 0) {
                char name[48];
                double a0, a1;
                clg_comm_op_times(dp->b_op[b], &a0, &a1);
                snprintf(name, sizeof name, "all-reduce bucket %d (%.2f MiB)", b, dp->b_bytes[b] / 1048576.0);
                clg_trace_mpi(dp->trace, name, a0, a1);
            }
        }
        if (dp->hmap) /* summed: no lane reads this arena any more, and the write-back must not meet a mapping */
            CLG_TRY(unmap_arena(dp, l));
        cl_event wv = NULL;
        size_t o0 = dp->b_off[b], o1 = o0 + dp->b_bytes[b];
        if (dp->shard) { /* reduce-scatter: the lane's own slice of the sum only */
            o0 = CLG_MAX(o0, dp->sh_k0[l->index] * sizeof(float));
            o1 = CLG_MIN(o1, dp->sh_k1[l->index] * sizeof(float));
        }
        if (dp->inplace) /* the parts stored the sum in this lane's arena already */
            o1 = o0;
        if (o1 > o0 && dp->dev_reduce)
            CLG_TRY(clg_dp_dev_writeback(dp, l, b, o0, o1 - o0, tr ? &wv : NULL));
        else if (o1 > o0)
            CLG_CL_CHECK(err, clEnqueueWriteBuffer(l->dev->queue, l->arena, CL_FALSE, o0, o1 - o0,
                                                   (char *)dp->gsum + o0, 0, NULL, tr ? &wv : NULL));
        if (tr) {
            char name[48];
            snprintf(name, sizeof name, "wait sum bucket %d", b);
            clg_trace_host(dp->trace, l->index, name, w0, clg_now_sec());
            if (wv) {
                snprintf(name, sizeof name, "grad %s bucket %d", dp->dev_reduce ? "copy" : "write", b);
                clg_trace_cl(dp->trace, l->index, CLG_TR_TRANSFER, name, NULL, wv);
                clReleaseEvent(wv);
            }
        }
    }
    if (dp->nstate > 0) {
        CLG_TRY(wait_flag(dp, l, &dp->s_done));
        CLG_TRY(clg_comm_op_wait(err, dp->s_op));
        CLG_TRY(state_transfer(dp, l, 1));
    }
    clg_release_event(&l->wev);
    CLG_CL_CHECK(err, clEnqueueMarkerWithWaitList(l->dev->queue, 0, NULL, &l->wev));
    return CLG_OK;
}

// ---- steps ----

/* The lane's {loss sum, correct} into job->res (2 floats per lane), read
 * without blocking when job->res_ev asks for an event; a lane without
 * samples contributes zeros. Nothing is read when nobody asked. */
static clg_status read_loss(clg_dp *dp, clg_lane *l, int n)
{
    clg_dp_job *j = &dp->job;
    if (!j->res)
        return CLG_OK;
    float *res = j->res + 2 * l->index;
    if (n <= 0 || l->rep->loss_index < 0) {
        res[0] = res[1] = 0;
        return CLG_OK;
    }
    cl_event *ev = j->res_ev ? &j->res_ev[l->index] : NULL;
    CLG_CL_CHECK(clg_dev_err(l->dev),
                 clEnqueueReadBuffer(l->dev->queue, l->rep->layers[l->rep->loss_index].loss.result,
                                     ev ? CL_FALSE : CL_TRUE, 0, 2 * sizeof(float), res, 0, NULL, ev));
    return CLG_OK;
}

static clg_status params_ready(clg_dp *dp, clg_lane *l, int b)
{
    CLG_UNUSED(dp);
    CLG_UNUSED(l);
    CLG_UNUSED(b);
    return CLG_OK;
}

/* Sharded optimizer state, after the lanes' slice updates (all-gather):
 * the lane's updated slice to the host, then every other lane's slice
 * from there; the fp16 copies of the whole arena follow. */
static clg_status gather_params(clg_dp *dp, clg_lane *l)
{
    clg_err *err = clg_dev_err(l->dev);
    cl_mem pa = l->rep->parena;
    size_t k0 = dp->sh_k0[l->index], k1 = dp->sh_k1[l->index], nf = dp->lay.bytes / sizeof(float);
    double w0 = clg_now_sec();
    if (k1 > k0)
        CLG_CL_CHECK(err, clEnqueueReadBuffer(l->dev->queue, pa, CL_TRUE, k0 * sizeof(float), (k1 - k0) * sizeof(float),
                                              dp->phost + k0, 0, NULL, NULL));
    CLG_TRY(arrive(dp, l, &dp->p_arrived, &dp->p_done, params_ready, 0, NULL));
    CLG_TRY(wait_flag(dp, l, &dp->p_done));
    if (k0 > 0) /* (the host copy outlives these writes: the step ends with clFinish) */
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(l->dev->queue, pa, CL_FALSE, 0, k0 * sizeof(float), dp->phost, 0, NULL,
                                               NULL));
    if (k1 < nf)
        CLG_CL_CHECK(err, clEnqueueWriteBuffer(l->dev->queue, pa, CL_FALSE, k1 * sizeof(float),
                                               (nf - k1) * sizeof(float), dp->phost + k1, 0, NULL, NULL));
    if (clg_trace_on(dp->trace, dp->job.step))
        clg_trace_host(dp->trace, l->index, "parameter gather", w0, clg_now_sec());
    return clg_replica_weights_updated(l->rep); /* fp16: half copies and views; tells the layers */
}

static clg_status lane_train(clg_dp *dp, clg_lane *l)
{
    clg_dp_job *j = &dp->job;
    clg_err *err = clg_dev_err(l->dev);
    double t0 = clg_now_sec();
    l->t_cpu0 = clg_thread_cpu_sec();
    l->t_pcpu0 = clg_process_cpu_sec();
    int s = j->stage, n = l->cnt[s];
    if (l->index == dp->fault_lane && j->step == dp->fault_step)
        return clg_cl_fail(err, CL_INVALID_COMMAND_QUEUE, "clEnqueueNDRangeKernel (injected fault)", __FILE__, __LINE__);
    CLG_TRY(unmap_arena(dp, l)); /* a mapping left by a failed step ends before backward writes the arena */
    if (n > 0) {
        CLG_TRY(clg_lane_use_stage(l, s, 1, j->grad_scale));
        CLG_TRY(mark(dp, l, NULL));
        for (int i = 0; i < l->rep->nlayers; i++)
            clg_layer_set_rng(&l->rep->layers[i], j->seed, j->step, (uint32_t)l->off[s]);
        CLG_TRY(clg_replica_forward(l->rep, n, 1));
        CLG_TRY(read_loss(dp, l, n));
        CLG_TRY(clg_replica_backward(l->rep, n));
    } else {
        CLG_TRY(read_loss(dp, l, 0));
    }
    CLG_TRY(clg_lane_stage_release(l, s));
    /* global gradient: reduced (N > 1) or this lane's own (N = 1) */
    int overflow = 0;
    double norm = 0;
    float gscale = 1.0f;
    if (reducing(dp)) {
        CLG_TRY(reduce(dp, l, t0));
        double sq = 0;
        if (dp->dev_reduce)
            CLG_TRY(clg_dp_dev_sumsq(dp, l, &sq));
        else
            for (int b = 0; b < dp->nbuckets; b++)
                sq += dp->b_sumsq[b];
        norm = sqrt(sq) * j->inv_loss_scale;
        overflow = !isfinite(norm);
        gscale = j->inv_loss_scale;
    } else {
        if (l->index == dp->slow_lane && n > 0) { /* test aid, as in reduce() */
            CLG_CL_CHECK(err, clFinish(l->dev->queue));
            sleep_s((clg_now_sec() - t0) * dp->slow_factor);
        }
        if (j->fp16)
            CLG_TRY(clg_optim_unscale_check(l->opt, j->inv_loss_scale, &overflow));
        if (!overflow && j->clip_norm > 0)
            CLG_TRY(clg_optim_grad_norm(l->opt, 1.0f, &norm));
    }
    if (l->index == 0) {
        j->overflow = overflow && j->fp16;
        j->norm = norm;
    }
    if (overflow && j->fp16)
        return CLG_OK; /* skipped on every lane alike */
    if (!isfinite(norm)) { /* lane 0 fails the step naming the first non-finite layer; the others stop */
        char why[512];
        if (l->index > 0)
            return CLG_OK;
        clg_replica_explain_nonfinite(l->rep, n, why, sizeof why);
        return clg_err_set(err, CLG_ERR_INTERNAL,
                           "gradient norm is not finite at step %u (diverged: lower the learning rate); %s", j->step,
                           why);
    }
    if (j->clip_norm > 0 && norm > j->clip_norm)
        gscale *= (float)(j->clip_norm / norm);
    CLG_TRY(mark(dp, l, NULL));
    CLG_TRY(clg_optim_step(l->opt, j->lr, gscale));
    CLG_TRY(mark(dp, l, "optimizer"));
    if (dp->shard)
        CLG_TRY(gather_params(dp, l));
    if (dp->n > 1) /* the step is synchronous anyway: run the update in this lane's thread (PoCL basic) */
        CLG_CL_CHECK(err, clFinish(l->dev->queue));
    else
        CLG_CL_CHECK(err, clFlush(l->dev->queue));
    return CLG_OK;
}


clg_status clg_dp_ensure_optim(clg_dp *dp, const clg_hparams *hp)
{
    for (int i = 0; i < dp->n; i++) {
        clg_lane *l = &dp->lanes[i];
        if (l->opt)
            continue;
        clg_status st = dp->shard ? clg_optim_create_shard(l->rep, hp, dp->sh_k0[i], dp->sh_k1[i], &l->opt)
                                  : clg_optim_create(l->rep, hp, &l->opt);
        if (st != CLG_OK)
            return device_failed(dp, st, l->dev);
    }
    return CLG_OK;
}

/* Parameter i's floats [a, a + n) of the arena against lane l's shard:
 * the overlap [*x0, *x1) (empty when *x1 <= *x0). */
static void shard_overlap(const clg_dp *dp, int l, size_t a, size_t n, size_t *x0, size_t *x1)
{
    *x0 = CLG_MAX(a, dp->sh_k0[l]);
    *x1 = CLG_MIN(a + n, dp->sh_k1[l]);
}

clg_status clg_dp_optim_state(clg_dp *dp, int i, int which, float *host, int write)
{
    for (int l = 0; l < dp->n; l++) {
        clg_lane *ln = &dp->lanes[l];
        clg_optim *o = ln->opt;
        clg_err *err = clg_dev_err(ln->dev);
        if (!o || i < 0 || i >= o->n)
            return clg_err_set(err, CLG_ERR_INTERNAL, "optimizer state %d of device %d: no such state", i, l);
        size_t n = o->refs[i].param->numel, a = 0, x0 = 0, x1 = n, boff = 0;
        cl_mem buf = which == 1 ? (o->shard ? o->marena : o->m[i]) : (o->shard ? o->varena : o->v[i]);
        if (o->shard) {
            a = ln->rep->arena_off[i] / sizeof(float);
            shard_overlap(dp, l, a, n, &x0, &x1);
            boff = x0 - o->k0;
        }
        if (x1 <= x0)
            continue;
        if (!buf)
            return clg_err_set(err, CLG_ERR_INTERNAL, "optimizer state %d of device %d: no buffer", i, l);
        float *h = host + (x0 - a);
        size_t off = boff * sizeof(float), bytes = (x1 - x0) * sizeof(float);
        cl_int e = write ? clEnqueueWriteBuffer(ln->dev->queue, buf, CL_TRUE, off, bytes, h, 0, NULL, NULL)
                         : clEnqueueReadBuffer(ln->dev->queue, buf, CL_TRUE, off, bytes, h, 0, NULL, NULL);
        if (e != CL_SUCCESS)
            return clg_cl_fail(err, e, write ? "write optimizer state" : "read optimizer state", __FILE__, __LINE__);
        if (!write && !o->shard)
            break; /* every lane holds the same */
    }
    return CLG_OK;
}

void clg_dp_memory(const clg_dp *dp, int l, clg_dp_mem *out)
{
    const clg_lane *ln = &dp->lanes[l];
    const clg_replica *r = ln->rep;
    const clg_pool *p = &ln->dev->pool;
    memset(out, 0, sizeof *out);
    out->params = r->arena_charged;
    out->optim = clg_optim_state_bytes(ln->opt);
    out->activations = r->planned_bytes;
    uint64_t total = p->stats.bytes_in_use + p->direct_bytes, known = out->params + out->optim + out->activations;
    out->workspace = total > known ? total - known : 0;
    out->peak = p->total_peak;
    out->limit = p->limit;
}

static void reset_reduction(clg_dp *dp)
{
    for (int b = 0; b < dp->nbuckets; b++)
        dp->arrived[b] = dp->summed[b] = dp->p_next[b] = dp->p_fin[b] = 0;
    dp->s_arrived = dp->s_done = 0;
    dp->p_arrived = dp->p_done = 0;
    for (int i = 0; dp->gathers && i < 2 * dp->net->nlayers; i++)
        dp->gathers[i].arrived = dp->gathers[i].done = 0;
    dp->abort = 0;
    dp->fail_lane = -1;
}

/* This step's spin (dp->spin_now; see clg_dp.spin_us): where the lanes compute in their own threads (PoCL
 * basic: cpu_timed, seen from the second warm step on) with a core each, and unless the waits of a recent step
 * mostly outlasted their spin. */
#define SPIN_BACKOFF 32
static void set_spin(clg_dp *dp)
{
    int hit = 0, miss = 0;
    clg_team_spin_take(dp->team, &hit, &miss);
    hit += dp->spin_hit;
    miss += dp->spin_miss;
    dp->spin_hit = dp->spin_miss = 0;
    if (dp->spin_now > 0 && miss > hit)
        dp->spin_off = SPIN_BACKOFF;
    else if (dp->spin_off > 0)
        dp->spin_off--;
    int on = dp->spin_us > 0 && dp->n > 1 && dp->spin_off == 0 &&
             ((dp->cpu_timed && dp->n <= dp->ncpu) || dp->ctx->opts.test_dp_spin);
    dp->spin_now = on ? dp->spin_us : 0;
    clg_team_set_spin(dp->team, dp->spin_now);
}

void clg_dp_train_begin(clg_dp *dp, const clg_dp_job *job)
{
    dp->job = *job;
    reset_reduction(dp);
    dp->inplace = dp->hmap && dp->ranks == 1;
    for (int i = 0; i < dp->n; i++)
        dp->inplace &= dp->cnt[job->stage][i] > 0;
    for (int i = 0; i < dp->n; i++) { /* a batch size met for the first or second time: kernels built,
                                         algorithms timed (at their second use: option conv_auto_defer) */
        clg_lane *l = &dp->lanes[i];
        int n = dp->cnt[job->stage][i];
        l->cold = n > 0 && l->ready[n] < 2;
        if (l->cold)
            l->ready[n]++;
    }
    set_spin(dp);
    dp->t_begin = clg_now_sec();
    clg_team_begin(dp->team, lane_train_fn, dp);
}

/* One warm measurement of lane l: n samples in t seconds. */
static void observe(clg_lane *l, int n, double t)
{
    l->obs_n[l->nobs % CLG_LANE_OBS] = n;
    l->obs_t[l->nobs % CLG_LANE_OBS] = t;
    l->nobs++;
}

/* Median of the lane's recorded times at batch size n (0: none). */
static double obs_median(const clg_lane *l, int n)
{
    double v[CLG_LANE_OBS];
    int k = 0;
    for (int i = 0; i < CLG_MIN(l->nobs, CLG_LANE_OBS); i++)
        if (l->obs_n[i] == n) {
            int j = k++;
            for (; j > 0 && v[j - 1] > l->obs_t[i]; j--)
                v[j] = v[j - 1];
            v[j] = l->obs_t[i];
        }
    return k == 0 ? 0 : k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

/* Recorded times of the lane at batch size n. */
static int obs_count(const clg_lane *l, int n)
{
    int k = 0;
    for (int i = 0; i < CLG_MIN(l->nobs, CLG_LANE_OBS); i++)
        k += l->obs_n[i] == n;
    return k;
}

/* The lane's step time as t(n) = a + b n (fixed overhead + per-sample
 * cost) through the median time at its newest batch size; a from a second
 * size among the recorded steps, kept within [0, 0.3 t] (timing noise
 * between two sizes must not make a lane look free or sample-less; the
 * sizes must be 25% apart); 0 when unknown. Medians: on a loaded machine
 * single steps stall by whole scheduler slices. */
static int lane_model(const clg_lane *l, double *a, double *b)
{
    if (l->nobs == 0)
        return 0;
    int n = l->obs_n[(l->nobs - 1) % CLG_LANE_OBS], m = 0;
    double t = obs_median(l, n);
    if (n <= 0 || !(t > 0))
        return 0;
    for (int i = l->nobs - 2; i >= 0 && i > l->nobs - 1 - CLG_LANE_OBS && !m; i--) {
        int c = l->obs_n[i % CLG_LANE_OBS];
        if (c > 0 && abs(c - n) * 4 >= CLG_MAX(c, n))
            m = c;
    }
    *a = 0;
    double tm = m ? obs_median(l, m) : 0;
    if (tm > 0) {
        double slope = (t - tm) / (n - m);
        *a = slope > 0 ? fmin(fmax(t - slope * n, 0.0), 0.3 * t) : 0.0;
    }
    *b = (t - *a) / n;
    return 1;
}

/* The slowest lane's modelled time with cnt[i] samples each (an idle lane takes 0). */
static double plan_time(const double *a, const double *b, int nl, const int *cnt)
{
    double worst = 0;
    for (int i = 0; i < nl; i++)
        if (cnt[i] > 0)
            worst = fmax(worst, a[i] + b[i] * cnt[i]);
    return worst;
}

/* The batch slice of this rank (the split's n, as clg_dp_upload computes it). */
static int slice_batch(const clg_dp *dp)
{
    int off = 0, mine = dp->net->batch;
    clg_comm_slice(dp->net->batch, &off, &mine);
    return mine;
}

/* Shares from the lanes' models: one granule each (every lane stays
 * measured), then granule by granule (as split() hands them out) to the
 * lane that would finish it first; returns 0 when a lane is not measured
 * yet. */
static int model_shares(const clg_dp *dp, const double *a, const double *b, double *w)
{
    int n = slice_batch(dp);
    int g = CLG_MAX(1, CLG_MIN(8, n / (8 * dp->n))), units = n / g, u[CLG_DP_MAX_LANES] = {0};
    if (units <= 0)
        return 0;
    if (units >= dp->n) /* a granule each: a lane without samples would never be measured again */
        for (int i = 0; i < dp->n; i++)
            u[i] = 1;
    for (int k = units >= dp->n ? dp->n : 0; k < units; k++) {
        int best = 0;
        double tb = INFINITY;
        for (int i = 0; i < dp->n; i++) {
            double t = a[i] + b[i] * (u[i] + 1) * g;
            if (t < tb) {
                tb = t;
                best = i;
            }
        }
        u[best]++;
    }
    for (int i = 0; i < dp->n; i++)
        w[i] = (double)u[i] / units;
    return 1;
}

/* Steps over which a move to batch sizes not run yet must win back its preparation (rebalance). */
#define CLG_DP_PAYBACK_STEPS 256

/* 1 when a modelled saving of `gain` seconds per step wins back, within
 * CLG_DP_PAYBACK_STEPS steps, the mean time the passes meeting new batch
 * sizes took so far (the first step's sizes are always met: an estimate
 * exists by the first look). On a fresh cache a pass builds kernels and
 * times algorithms: for LeNet-5 on two basic lanes 1.0-2.4 s, some 300 of
 * its steps, which a move of two granules between identical lanes never
 * wins back; a pass that finds kernels built and algorithms measured costs
 * little, and a really slower device gains far more per step. */
static int pays_back(const clg_dp *dp, double gain)
{
    if (dp->prepares <= 0)
        return 1;
    return gain * CLG_DP_PAYBACK_STEPS >= dp->prepare_s / dp->prepares;
}

/* Re-weights the shares by the lanes' modelled step times. Only warm steps
 * count (not the first, nor one in which a lane met a new batch size: it
 * built kernels and measured algorithms there). The split is set after the
 * first two warm steps (calibration, normally within a benchmark's
 * warm-up), then looked at every 8 steps and moved only when the model
 * predicts a step 5% shorter (12% when a lane would meet a batch size it
 * has not run yet, and only when the previous look pointed the same way;
 * devices of one kind: 15%, and only when the previous look pointed the
 * same way, calibrating too), by two granules at most: every new
 * per-device batch size costs kernel specialisation and algorithm timing
 * once, and timing noise must not keep creating them. After settling, a
 * move to sizes not run yet also waits until its modelled saving would win
 * back the passes' measured cost within CLG_DP_PAYBACK_STEPS steps; a
 * frozen split (bench train's timed steps) never moves. Returns 1 when the
 * shares changed. */
static int rebalance(clg_dp *dp)
{
    int s = dp->job.stage, warm = dp->measured > 0;
    for (int i = 0; i < dp->n; i++)
        warm &= dp->cnt[s][i] <= 0 || (!dp->lanes[i].cold && dp->lanes[i].t_compute > 0);
    dp->measured++;
    if (!warm)
        return 0;
    /* Devices of one kind that compute in their lane's own thread are timed by that thread's CPU time: its
     * wall time counts whatever else ran on the core meanwhile (another process, the other lane's thread
     * moved there for a while), which the scheduler spreads over both lanes alike in the long run but not
     * within a step. Such lanes (PoCL basic) spend nearly all of the process's CPU time over the step, at
     * least 0.6 / lanes each; a driver with worker threads (PoCL pthread on a large net) leaves the lanes'
     * threads a few percent. CPU time against CPU time: other processes' load cannot tip it (a share of
     * the wall time fell below its mark once a dozen threads shared 2 cores). */
    int cpu = dp->same_kind, nact = 0;
    for (int i = 0; i < dp->n; i++)
        nact += dp->cnt[s][i] > 0;
    for (int i = 0; i < dp->n; i++) {
        const clg_lane *l = &dp->lanes[i];
        cpu &= dp->cnt[s][i] <= 0 ||
               (l->t_pcpu > 0 ? l->t_cpu * nact >= 0.6 * l->t_pcpu : l->t_cpu >= 0.1 * l->t_compute);
    }
    dp->cpu_timed = cpu;
    for (int i = 0; i < dp->n; i++)
        if (dp->cnt[s][i] > 0)
            observe(&dp->lanes[i], dp->cnt[s][i], cpu ? dp->lanes[i].t_cpu : dp->lanes[i].t_compute);
    if (dp->split_fixed || dp->n < 2)
        return 0;
    int calibrating = dp->calibrations < 2;
    if (!calibrating && (dp->measured - dp->settled_at) % 8 != 0) /* every 8 steps after the calibration */
        return 0;
    /* devices of one kind calibrate from the median of 3 warm steps at the current sizes: a single step
     * of two identical lanes shows which one the scheduler or another process delayed, not their speed */
    for (int i = 0; i < dp->n && calibrating && dp->same_kind; i++)
        if (dp->cnt[s][i] > 0 && obs_count(&dp->lanes[i], dp->cnt[s][i]) < 3)
            return 0;
    double a[CLG_DP_MAX_LANES], b[CLG_DP_MAX_LANES], w[CLG_DP_MAX_LANES];
    for (int i = 0; i < dp->n; i++)
        if (!lane_model(&dp->lanes[i], &a[i], &b[i]))
            return 0; /* a lane without samples so far: keep its share */
    if (!model_shares(dp, a, b, w))
        return 0;
    /* the first move and one against the previous move go half way: on a
     * loaded machine the faster lane changes from step to step (the
     * scheduler moves threads), and chasing that costs more than an even
     * split; unequal devices keep pointing the same way and get there */
    double dot = 0, d[CLG_DP_MAX_LANES];
    for (int i = 0; i < dp->n; i++) {
        d[i] = w[i] - dp->share[i];
        dot += d[i] * dp->last_move[i];
    }
    double f = dp->calibrations > 0 && dot > 0 ? 1.0 : 0.5, sum = 0;
    int n = slice_batch(dp), now[CLG_DP_MAX_LANES], next[CLG_DP_MAX_LANES], fresh = 0;
    double cap = 2.0 * CLG_MAX(1, CLG_MIN(8, n / (8 * dp->n))) / CLG_MAX(n, 1); /* two granules */
    for (int i = 0; i < dp->n; i++) {
        double mv = f * d[i];
        if (!calibrating) /* settled: two granules per look at most (noise cannot swing the split) */
            mv = fmax(-cap, fmin(cap, mv));
        w[i] = fmax(0.0, dp->share[i] + mv);
        sum += w[i];
        dp->last_move[i] = d[i];
    }
    for (int i = 0; i < dp->n && sum > 0; i++)
        w[i] /= sum;
    if (++dp->calibrations == 2)
        dp->settled_at = dp->measured;
    double keep[CLG_DP_MAX_LANES];
    memcpy(keep, dp->share, sizeof keep);
    split(dp, n, now);
    for (int i = 0; i < dp->n; i++)
        dp->share[i] = w[i];
    split(dp, n, next);
    for (int i = 0; i < dp->n; i++)
        fresh |= next[i] > 0 && dp->lanes[i].ready[next[i]] < 2;
    double t_now = plan_time(a, b, dp->n, now), t_next = plan_time(a, b, dp->n, next);
    int same = memcmp(now, next, (size_t)dp->n * sizeof *now) == 0;
    /* after settling, a batch size not run yet only when two checks in a row point that way. Devices of
     * one kind move, calibrating or not, only for a modelled step 15% shorter and only when the previous
     * look pointed the same way (so never at the first look): two identical lanes differ by timing noise
     * (a third busy thread, a core shared with another process for a while, a compile), noise flips the
     * faster lane from look to look, and every move away from the even split costs new per-device batch
     * sizes on a first run; a lane really slowed (a busy core, test_slow_lane) is slower by far more than
     * that, and stays so from look to look */
    int noise = dp->same_kind && (t_next > t_now * 0.85 || !(dot > 0));
    if (same || noise || (!calibrating && (t_next > t_now * (fresh ? 0.88 : 0.95) || (fresh && !(dot > 0))))) {
        memcpy(dp->share, keep, sizeof keep);
        return 0;
    }
    if (dp->frozen || (!calibrating && fresh && !pays_back(dp, t_now - t_next))) {
        memcpy(dp->share, keep, sizeof keep);
        dp->moves_held++;
        clg_log(2, "data parallel: split kept after step %" PRId64 " (modelled step %.2f -> %.2f ms; %s)",
                dp->measured, 1e3 * t_now, 1e3 * t_next,
                dp->frozen ? "frozen" : "the new batch sizes' preparation would not pay back");
        return 0;
    }
    dp->rebalances++;
    char sh[128];
    clg_dp_shares(dp, sh, sizeof sh);
    clg_log(2, "data parallel: split %s after step %" PRId64 " (modelled step %.1f -> %.1f ms%s)", sh, dp->measured,
            1e3 * t_now, 1e3 * t_next, fresh ? "; meeting the new batch sizes now" : "");
    return fresh;
}

static clg_status report(clg_dp *dp, clg_status st, int failed)
{
    if (st == CLG_OK)
        return CLG_OK;
    int f = failed;
    if (dp->fail_lane >= 0) {
        f = dp->fail_lane;
        st = dp->fail_status;
    }
    return device_failed(dp, st, dp->lanes[f].dev);
}

/* Meets the batch size the next split gives lane l, if new to it, outside
 * any step: forward and backward on meaningless values build its kernels
 * and measure its algorithms (clg_replica_precompile; twice for a size
 * not run yet: algorithms are timed at their second use). Weights
 * and optimizer state are untouched; the batch-norm running statistics
 * are saved and put back; the layers' hooks (bucket reads, cross-device
 * exchanges) are off meanwhile. */
static clg_status lane_prepare(clg_dp *dp, clg_lane *l)
{
    int next[CLG_DP_MAX_LANES];
    split(dp, slice_batch(dp), next);
    int n = next[l->index];
    if (n <= 0 || l->ready[n] >= 2)
        return CLG_OK;
    clg_err *err = clg_dev_err(l->dev);
    clg_replica *r = l->rep;
    if (dp->nstate > 0)
        CLG_TRY(state_transfer(dp, l, 0)); /* into l->shost (blocking) */
    clg_status (*hook)(void *, int, int) = r->after_layer;
    const clg_layer_sync *sync = r->nlayers > 0 ? r->layers[0].sync : NULL; /* every layer's (clg_dp_create) */
    r->after_layer = NULL;
    for (int k = 0; k < r->nlayers; k++)
        r->layers[k].sync = NULL;
    clg_status st = CLG_OK;
    if (!l->dummy_x) { /* zeros: the feed buffers may hold garbage (NaN is no token id) or the next batch */
        size_t numel = (size_t)r->batch * r->net->in_c * r->net->in_h * r->net->in_w;
        st = clg_buf_alloc(l->dev, numel * sizeof(float), &l->dummy_x);
        if (st == CLG_OK)
            st = clg_buf_fill(l->dev, l->dummy_x, 0, numel, 0.0f);
    }
    clg_replica_set_input(r, l->dummy_x, 0);
    clg_replica_set_labels(r, l->dummy_labels, 0, 1.0f);
    for (int k = l->ready[n]; k < 2 && st == CLG_OK; k++)
        st = clg_replica_precompile(r, n, 0);
    r->after_layer = hook;
    for (int k = 0; k < r->nlayers; k++)
        r->layers[k].sync = sync;
    size_t pos = 0;
    for (int i = 0; st == CLG_OK && i < dp->nstate; i++) { /* the running statistics back */
        clg_param *p = clg_replica_param_of(r, &dp->srefs[i]);
        cl_int e = clEnqueueWriteBuffer(l->dev->queue, p->value, CL_TRUE, 0, p->numel * sizeof(float),
                                        l->shost + pos, 0, NULL, NULL);
        if (e != CL_SUCCESS)
            st = clg_cl_fail(err, e, "restore the batch-norm statistics", __FILE__, __LINE__);
        pos += p->numel;
    }
    CLG_TRY(st);
    CLG_CL_CHECK(err, clFinish(l->dev->queue));
    l->ready[n] = 2;
    return CLG_OK;
}

static clg_status lane_prepare_fn(void *arg, int lane);

/* Records a warm step's wall time; once a full window suggests
 * oversubscription, keeps the warning (once per run). */
static void spread_note(clg_dp *dp, double t)
{
    dp->steps_t[dp->nsteps_t++ % CLG_DP_SPREAD_WIN] = t;
    if (dp->oversub[0] || dp->nsteps_t < CLG_DP_SPREAD_WIN || dp->nsteps_t % 4 != 0)
        return;
    double med = 0, p90 = 0;
    if (!clg_dp_spread_suspect(dp->steps_t, CLG_DP_SPREAD_WIN, &med, &p90))
        return;
    snprintf(dp->oversub, sizeof dp->oversub,
             "step times vary widely (median %.1f ms, 90th percentile %.1f ms over %d steps): likely more busy "
             "threads than free cores (%d device threads here on %d online CPUs; is another process busy?)",
             1e3 * med, 1e3 * p90, CLG_DP_SPREAD_WIN, dp->n, dp->ncpu);
    clg_log(2, "%s", dp->oversub);
}

clg_status clg_dp_train_end(clg_dp *dp, clg_dp_job *job)
{
    int failed = 0;
    clg_status st = clg_team_end(dp->team, &failed);
    double t = clg_now_sec() - dp->t_begin;
    if (dp->first_end) { /* every kernel of a step is built: nothing else may compete with what follows */
        void (*fn)(void *) = dp->first_end;
        dp->first_end = NULL;
        fn(dp->first_end_user);
    }
    job->overflow = dp->job.overflow;
    job->norm = dp->job.norm;
    int cold = 0;
    for (int i = 0; i < dp->n; i++)
        cold |= dp->lanes[i].cold;
    if (st == CLG_OK && dp->steps_seen++ > 0 && !cold) /* not the first step (builds, set-up) */
        spread_note(dp, t);
    st = report(dp, st, failed);
    if (st == CLG_OK && dp->n > 1) { /* the first step's sizes, or the new split's, met now */
        rebalance(dp);
        st = clg_dp_prepare(dp);
    }
    return st;
}

int clg_dp_settled(const clg_dp *dp)
{
    if (!dp || dp->steps_seen < 2 || dp->last_prepared)
        return 0;
    for (int i = 0; i < dp->n; i++)
        if (dp->lanes[i].cold)
            return 0;
    return dp->n < 2 || dp->split_fixed || dp->calibrations >= 2;
}

clg_status clg_dp_prepare(clg_dp *dp)
{
    int next[CLG_DP_MAX_LANES], need = 0, failed = 0;
    dp->last_prepared = 0;
    split(dp, slice_batch(dp), next);
    for (int i = 0; i < dp->n; i++)
        need |= next[i] > 0 && dp->lanes[i].ready[next[i]] < 2;
    if (!need)
        return CLG_OK;
    dp->prepares++;
    dp->last_prepared = 1;
    reset_reduction(dp);
    double t0 = clg_now_sec();
    clg_status st = CLG_OK;
    /* lane by lane: the first lane of a kind to meet a size measures its convolution algorithms alone, as a
     * one-device run (or a cache filled by one) would, not beside another lane's compiles and kernels, whose
     * load changes while it measures; identical devices after it find them measured */
    for (int i = 0; i < dp->n && st == CLG_OK; i++) {
        if (next[i] <= 0 || dp->lanes[i].ready[next[i]] >= 2)
            continue;
        dp->prep_lane = i;
        st = report(dp, clg_team_run(dp->team, lane_prepare_fn, dp, &failed), failed);
    }
    double t1 = clg_now_sec();
    dp->prepare_s += t1 - t0;
    if (clg_trace_on(dp->trace, dp->job.step)) /* inside the traced steps: it delays the next one */
        for (int i = 0; i < dp->n; i++)
            clg_trace_host(dp->trace, i, "prepare new batch sizes", t0, t1);
    clg_log(2, "data parallel: new per-device batch sizes met between steps in %.3f s", t1 - t0);
    return st;
}

int clg_dp_spread_suspect(const double *t, int n, double *med, double *p90)
{
    *med = *p90 = 0;
    if (n < 8)
        return 0;
    double *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return 0;
    memcpy(v, t, (size_t)n * sizeof *v);
    for (int i = 1; i < n; i++) /* insertion sort: a window of a few dozen */
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    *med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    *p90 = v[(int)(0.9 * (n - 1) + 0.5)];
    int stalls = 0;
    for (int i = 0; i < n; i++)
        stalls += v[i] > 4 * *med;
    free(v);
    return *med > 0 && (*p90 > 2 * *med || stalls * 8 >= n);
}

const char *clg_dp_take_warning(clg_dp *dp)
{
    if (!dp || !dp->oversub[0] || dp->oversub_shown)
        return NULL;
    dp->oversub_shown = 1;
    return dp->oversub;
}

static clg_status lane_forward(clg_dp *dp, clg_lane *l)
{
    clg_dp_job *j = &dp->job;
    clg_err *err = clg_dev_err(l->dev);
    int s = j->stage, n = l->cnt[s];
    if (n <= 0)
        return read_loss(dp, l, 0);
    CLG_TRY(clg_lane_use_stage(l, s, j->training, 1.0f));
    CLG_TRY(clg_replica_forward(l->rep, n, 0));
    CLG_TRY(read_loss(dp, l, n));
    if (j->out) {
        const clg_tensor *o = clg_replica_output(l->rep);
        CLG_CL_CHECK(err, clEnqueueReadBuffer(l->dev->queue, o->mem, CL_TRUE, o->off * sizeof(float),
                                              (size_t)n * j->out_w * sizeof(float),
                                              j->out + (size_t)l->off[s] * j->out_w, 0, NULL, NULL));
    }
    CLG_TRY(clg_lane_stage_release(l, s));
    if (dp->n > 1) /* this thread runs the device (PoCL basic): finish here, side by side */
        CLG_CL_CHECK(err, clFinish(l->dev->queue));
    return CLG_OK;
}

/* A lane's part of a job; a failure aborts the other lanes' waits. */
static clg_status lane_job(clg_dp *dp, int lane, clg_status (*fn)(clg_dp *, clg_lane *))
{
    clg_status st = fn(dp, &dp->lanes[lane]);
    if (st != CLG_OK)
        fail(dp, lane, st);
    return st;
}

static clg_status lane_train_fn(void *arg, int lane) { return lane_job(arg, lane, lane_train); }
static clg_status lane_forward_fn(void *arg, int lane) { return lane_job(arg, lane, lane_forward); }
static clg_status lane_prepare_fn(void *arg, int lane)
{
    clg_dp *dp = arg;
    return lane == dp->prep_lane ? lane_job(dp, lane, lane_prepare) : CLG_OK; /* one lane at a time */
}

clg_status clg_dp_forward(clg_dp *dp, clg_dp_job *job)
{
    dp->job = *job;
    reset_reduction(dp);
    int failed = 0;
    clg_status st = clg_team_run(dp->team, lane_forward_fn, dp, &failed);
    return report(dp, st, failed);
}

clg_status clg_dp_finish(clg_dp *dp)
{
    for (int i = 0; i < dp->n; i++) {
        cl_int e = clFinish(dp->lanes[i].dev->queue);
        if (e != CL_SUCCESS)
            return clg_cl_fail(&dp->ctx->err, e, "clFinish", __FILE__, __LINE__);
    }
    return CLG_OK;
}
