/* Data parallelism over two devices (POCL_DEVICES="pthread pthread" in the
 * test environment): 1 vs 2 devices from the same seed and global batch,
 * replicas bitwise identical, uneven splits, speed-following shares, fp16
 * overflow on one device, resume across device counts, a failing device.
 *
 * Tolerance (1 vs 2 devices, per step from the same state): the two runs
 * differ in the order per-sample gradient contributions are summed (one
 * device sums the whole batch in its kernels, two sum their slices and the
 * host adds them) and in kernel blocking for other batch sizes: ~1e-7
 * relative. TOL = 1e-5 per tensor (relative L2 of the weights after the
 * step). A ReLU or max-pool decision that sits within rounding of its
 * threshold can flip between the two runs and move one unit's gradient by
 * a whole sample's contribution (~1e-3 seen, rarely); up to 2 of the 20
 * steps may do so, bounded by TOL_STEP = 2e-2. A wrong gradient scale
 * (1/local batch), a lost or doubled slice, or a dropout mask that depends
 * on the device count is off by 1e-2 or more on every step. The global
 * loss sum and correct count must agree on every step. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/optim_kernels.h"
#include "train_testutil.h"

#define TOL 1e-5
#define TOL_STEP 2e-2
#define STEPS 20

static clg_ctx *g_ctx;

static clg_ctx *ctx(void)
{
    if (!g_ctx)
        g_ctx = tu_ctx(NULL);
    return g_ctx;
}

/* LeNet-5 on 28x28 and a small net with dropout and a residual add. */
static const char *NET_DROP = "[net]\nchannels = 1\nheight = 8\nwidth = 8\nclasses = 4\nbatch = 32\n"
                              "learning_rate = 0.05\nmomentum = 0.9\n"
                              "[conv]\nname = c1\nfilters = 8\nsize = 3\npad = 1\nactivation = relu\n"
                              "[conv]\nname = c2\nfilters = 8\nsize = 3\npad = 1\n"
                              "[add]\nname = res\ninput = c1, c2\n"
                              "[maxpool]\nsize = 2\n"
                              "[dense]\nname = fc1\nunits = 16\nactivation = relu\n"
                              "[dropout]\np = 0.3\n"
                              "[dense]\nname = fc\nunits = 4\n"
                              "[softmax]\nname = loss\n";
static const char *NET_BN = "[net]\nchannels = 1\nheight = 8\nwidth = 8\nclasses = 4\nbatch = 32\n"
                            "learning_rate = 0.05\nmomentum = 0.9\n"
                            "[conv]\nname = c1\nfilters = 8\nsize = 3\npad = 1\nbias = 0\n"
                            "[batchnorm]\nname = bn1\n"
                            "[activation]\ntype = relu\n"
                            "[maxpool]\nsize = 2\n"
                            "[dense]\nname = fc\nunits = 4\n"
                            "[softmax]\nname = loss\n";

static int two_devices(void)
{
    if (clg_device_count(ctx()) < 2) {
        fprintf(stderr, "test_dp: needs two OpenCL devices (POCL_DEVICES=\"pthread pthread\")\n");
        return 0;
    }
    return 1;
}

static const char *g_reduce; /* reduction path of the models made (NULL: auto) */
static double g_bucket_mb = 0.004; /* small buckets: several per step, read while backward runs */

static clg_model *make(const char *text, const char *devices, const char *split, int batch, int fp16,
                       uint64_t seed)
{
    clg_dp_params dpp = {.split = split, .bucket_mb = g_bucket_mb, .reduce = g_reduce};
    clg_model *m = NULL;
    ck_assert_msg(clg_session_create(ctx(), devices, 0, text, "t", batch, seed, fp16, &dpp, &m) == CLG_OK, "%s",
                  clg_last_error(ctx()));
    return m;
}

/* One step on n fresh samples; res: the global {loss sum, correct}. */
static void step_on(clg_model *m, clg_rng *rng, int n, float *res)
{
    ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
    tt_synth_quadrants(rng, m->xhost[0], m->yhost[0], n, m->net->in_c, m->net->in_h, m->net->in_w);
    ck_assert_msg(clg_session_upload(m, 0, n, 1) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(clg_session_train_step(m, 0, m->hp.learning_rate, res) == CLG_OK, "%s", clg_last_error(ctx()));
}

/* `steps` steps of n samples; res_sum receives the summed loss of each step. */
static void train(clg_model *m, uint64_t seed, int steps, int n, double *loss_first)
{
    clg_rng rng;
    clg_rng_seed(&rng, seed, 99);
    const clg_net *net = m->net;
    for (int s = 0; s < steps; s++) {
        ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
        tt_synth_quadrants(&rng, m->xhost[0], m->yhost[0], n, net->in_c, net->in_h, net->in_w);
        ck_assert_msg(clg_session_upload(m, 0, n, 1) == CLG_OK, "%s", clg_last_error(ctx()));
        float res[2];
        ck_assert_msg(clg_session_train_step(m, 0, m->hp.learning_rate, res) == CLG_OK, "%s", clg_last_error(ctx()));
        ck_assert_msg(isfinite(res[0]), "step %d: loss %g", s, res[0]);
        if (s == 0 && loss_first)
            *loss_first = res[0];
    }
}

static float *download_param(clg_model *m, int lane, int i, size_t *numel)
{
    clg_lane *l = &m->dp->lanes[lane];
    clg_param_ref *refs = NULL;
    int n = 0;
    ck_assert(clg_replica_params(l->rep, 0, &refs, &n) == CLG_OK);
    ck_assert(i < n);
    *numel = refs[i].param->numel;
    float *h = malloc(*numel * sizeof(float));
    tu_poison(h, *numel);
    tu_download(l->dev, clg_replica_master(l->rep, &refs[i]), h, *numel);
    free(refs);
    return h;
}

static int nparams(clg_model *m)
{
    clg_param_ref *refs = NULL;
    int n = 0;
    ck_assert(clg_replica_params(clg_session_rep(m), 0, &refs, &n) == CLG_OK);
    free(refs);
    return n;
}

/* Every parameter (weights and batch-norm running statistics) of every
 * lane equals lane 0's to the bit. */
static void check_replicas_identical(clg_model *m)
{
    for (int i = 0; i < nparams(m); i++) {
        size_t n0 = 0;
        float *w0 = download_param(m, 0, i, &n0);
        for (int l = 1; l < m->dp->n; l++) {
            size_t n1 = 0;
            float *w1 = download_param(m, l, i, &n1);
            ck_assert(n1 == n0);
            ck_assert_msg(memcmp(w0, w1, n0 * sizeof(float)) == 0, "parameter %d differs between lane 0 and lane %d",
                          i, l);
            free(w1);
        }
        free(w0);
    }
}

static int g_with_state; /* max_rel_diff: the batch-norm running statistics too */

/* max over trainable tensors (and the state when g_with_state) of |a - b|_2 / |b|_2 */
static double max_rel_diff(clg_model *a, clg_model *b)
{
    double worst = 0;
    clg_param_ref *refs = NULL;
    int n = 0;
    ck_assert(clg_replica_params(clg_session_rep(a), 0, &refs, &n) == CLG_OK);
    for (int i = 0; i < n; i++) {
        if (!refs[i].param->trainable && !g_with_state)
            continue;
        size_t na = 0, nb = 0;
        float *wa = download_param(a, 0, i, &na), *wb = download_param(b, 0, i, &nb);
        ck_assert(na == nb);
        double d2 = 0, r2 = 0;
        for (size_t k = 0; k < na; k++) {
            double d = (double)wa[k] - wb[k];
            d2 += isfinite(d) ? d * d : INFINITY;
            r2 += (double)wb[k] * wb[k];
        }
        double rel = sqrt(d2) / (sqrt(r2) + 1e-30);
        if (!(rel <= worst))
            worst = rel;
        free(wa);
        free(wb);
    }
    free(refs);
    return worst;
}

/* 1 device vs 2 devices, same seed and global batches, 20 steps. Each step
 * starts both from the same state (the 1-device model's weights and
 * optimizer state, through a checkpoint), so a difference is that step's
 * alone and cannot compound. */
/* expect_close 0: the opposite check, every step but 2 differs by more than
 * TOL (the test can tell). Returns the steps within TOL. */
static int compare_1_vs_2_x(const char *text, const char *what, int batch, int n, const char *split, int expect_close)
{
    uint64_t seed = tu_seed();
    clg_model *one = make(text, "0", NULL, batch, 0, seed), *two = make(text, "0,1", split, batch, 0, seed);
    ck_assert_int_eq(two->dp->n, 2);
    if (n < 4) /* single samples with the model's rate may diverge: not what is tested here */
        one->hp.learning_rate = two->hp.learning_rate = 0.005;
    ck_assert(clg_session_ensure_optim(one) == CLG_OK && clg_session_ensure_optim(two) == CLG_OK);
    char path[256];
    snprintf(path, sizeof path, "test_dp_sync_%d.safetensors", (int)getpid());
    clg_rng r1, r2;
    clg_rng_seed(&r1, seed, 99);
    clg_rng_seed(&r2, seed, 99);
    int close = 0;
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        if (s > 0) {
            ck_assert_msg(clg_session_save(one, path, 1, 0) == CLG_OK, "%s", clg_last_error(ctx()));
            ck_assert_msg(clg_session_load(two, path, 1) == CLG_OK, "%s", clg_last_error(ctx()));
        }
        float l1[2], l2[2];
        step_on(one, &r1, n, l1);
        step_on(two, &r2, n, l2);
        ck_assert_msg(!expect_close || (fabs(l1[0] - l2[0]) <= 1e-5 * fabs(l1[0]) + 1e-6 && l1[1] == l2[1]),
                      "%s step %d: global loss sum / correct 1 device %.8g / %g, 2 devices %.8g / %g", what, s,
                      l1[0], l1[1], l2[0], l2[1]);
        double d = max_rel_diff(two, one);
        ck_assert_msg(d <= TOL_STEP || !expect_close, "%s step %d: 2-device weights differ from 1-device weights by %g", what, s, d);
        close += d <= TOL;
        worst = fmax(worst, d);
        check_replicas_identical(two);
    }
    unlink(path);
    char sh[64];
    clg_dp_shares(two->dp, sh, sizeof sh);
    fprintf(stderr, "%s (batch %d of %d, split %s -> %s): %d of %d steps within %g, worst %.2e\n", what, n, batch,
            split ? split : "auto", sh, close, STEPS, TOL, worst);
    if (expect_close)
        ck_assert_msg(close >= STEPS - 2, "%s: only %d of %d steps agree within %g", what, close, STEPS, TOL);
    else
        ck_assert_msg(close <= 2, "%s: %d of %d steps agree within %g, expected a difference", what, close, STEPS,
                      TOL);
    clg_session_free(one);
    clg_session_free(two);
    return close;
}

static void compare_1_vs_2(const char *text, const char *what, int batch, int n, const char *split)
{
    compare_1_vs_2_x(text, what, batch, n, split, 1);
}

START_TEST(lenet5_1_vs_2)
{
    if (!two_devices())
        return;
    char *text = tt_read_model("lenet5.cfg");
    compare_1_vs_2(text, "lenet5", 32, 32, NULL);
    free(text);
}
END_TEST

START_TEST(dropout_residual_1_vs_2)
{
    if (!two_devices())
        return;
    compare_1_vs_2(NET_DROP, "dropout+residual", 32, 32, NULL);
}
END_TEST

/* The device-to-device reduction (a kernel sums the lanes' arenas, each
 * lane copies the sum) adds in the same lane order as the host path: the
 * weights after 10 steps are bitwise those of the host path, for an even,
 * an uneven and a one-sided split, with a batch-norm net and a dropout one. */
/* clip > 0: gradient clipping at that norm, and the global gradient norm of
 * every step (which scales the update) must be bitwise the same on both
 * paths, with clipping active on every step; the steps are a fresh random
 * batch each. */
/* Two models reducing by paths pa and pb (clg_dp_params.reduce), the same seed, batches and split: their
 * weights after 10 steps must be bitwise the same (and with clip > 0, every step's global norm). */
static void compare_paths(const char *pa, const char *pb, const char *text, const char *split, int n,
                          int min_buckets, double clip)
{
    uint64_t seed = tu_seed();
    /* The two models step alternately: an algorithm measured between their
     * steps (a fresh cache) would give them different kernels, so different
     * gradients; this compares the reductions, with the kernels fixed. */
    ck_assert(clg_ctx_option_set(ctx(), "conv_auto_measure", "0") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "gemm_auto_measure", "0") == CLG_OK);
    g_reduce = pa;
    clg_model *h = make(text, "0,1", split, 32, 0, seed);
    g_reduce = pb;
    clg_model *d = make(text, "0,1", split, 32, 0, seed);
    g_reduce = NULL;
    if (strcmp(pb, "device") == 0)
        ck_assert(!h->dp->dev_reduce && d->dp->dev_reduce);
    else /* host (mapped arenas on CPU devices) against copy */
        ck_assert(!h->dp->dev_reduce && !d->dp->dev_reduce && !d->dp->hmap &&
                  h->dp->hmap == (h->dp->lanes[0].dev->info.type == CLG_DEVICE_CPU));
    ck_assert_int_ge(d->dp->nbuckets, min_buckets);
    h->hp.clip_norm = d->hp.clip_norm = clip;
    if (clip > 0) {
        clg_rng rh, rd;
        clg_rng_seed(&rh, seed, 99);
        clg_rng_seed(&rd, seed, 99);
        for (int s = 0; s < 10; s++) {
            float res[2];
            step_on(h, &rh, n, res);
            step_on(d, &rd, n, res);
            double nh = h->dp->job.norm, nd = d->dp->job.norm;
            ck_assert_msg(nh > clip, "step %d: norm %g does not exceed the clip %g (clipping inactive)", s, nh, clip);
            ck_assert_msg(memcmp(&nh, &nd, sizeof nh) == 0, "split %s step %d: gradient norm %s %.17g, %s %.17g",
                          split, s, pa, nh, pb, nd);
        }
    } else {
        train(h, seed, 10, n, NULL);
        train(d, seed, 10, n, NULL);
    }
    for (int i = 0; i < nparams(h); i++) {
        size_t nh = 0, nd = 0;
        float *wh = download_param(h, 0, i, &nh), *wd = download_param(d, 0, i, &nd);
        ck_assert(nh == nd);
        ck_assert_msg(memcmp(wh, wd, nh * sizeof(float)) == 0, "split %s: parameter %d differs between the %s and "
                      "the %s reduction", split, i, pa, pb);
        free(wh);
        free(wd);
    }
    check_replicas_identical(d);
    clg_session_free(h);
    clg_session_free(d);
    ck_assert(clg_ctx_option_set(ctx(), "conv_auto_measure", "1") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "gemm_auto_measure", "1") == CLG_OK);
}

static void host_vs_device(const char *text, const char *split, int n, int min_buckets, double clip)
{
    compare_paths("host", "device", text, split, n, min_buckets, clip);
}

START_TEST(device_reduction_equals_host)
{
    if (!two_devices())
        return;
    host_vs_device(NET_DROP, "even", 32, 2, 0);
    host_vs_device(NET_BN, "3,1", 30, 1, 0);
    host_vs_device(NET_DROP, "0,1", 17, 2, 0);
}
END_TEST

/* With gradient clipping the update depends on the global gradient norm:
 * both reduction paths compute it bitwise alike (the same fixed-order
 * partial sums), so the choice of path (measured per process with
 * dp_reduce = auto) cannot make a resumed run differ. */
START_TEST(device_reduction_equals_host_clipped)
{
    if (!two_devices())
        return;
    host_vs_device(NET_DROP, "even", 32, 2, 1e-3);
    host_vs_device(NET_BN, "3,1", 30, 1, 1e-3);
    /* LeNet-5's 61706 parameters in one bucket: more elements than the
     * norm's 64 x 256 work-items, so each item's grid-stride sum wraps */
    char *text = tt_read_model("lenet5.cfg");
    g_bucket_mb = 1;
    host_vs_device(text, "even", 32, 1, 1e-3);
    g_bucket_mb = 0.004;
    free(text);
}
END_TEST

/* The host path on CPU devices with one bucket sums straight from the lanes' mapped arenas (dp.h hmap)
 * instead of host copies: the same additions in the same order, so bitwise the copying path's weights and
 * (clipping every step) norms, for an even, an uneven and a one-sided split (a lane without samples maps
 * nothing), with LeNet-5 (61706 parameters: the norm's grid wraps) and a batch-norm net. */
START_TEST(mapped_equals_copied)
{
    if (!two_devices())
        return;
    char *text = tt_read_model("lenet5.cfg");
    g_bucket_mb = 25; /* one bucket: the mapped path */
    compare_paths("host", "copy", text, "even", 32, 1, 1e-3);
    compare_paths("host", "copy", text, "3,1", 30, 1, 0);
    compare_paths("host", "copy", NET_BN, "0,1", 17, 1, 1e-3);
    g_bucket_mb = 0.004;
    free(text);
}
END_TEST

START_TEST(uneven_splits)
{
    if (!two_devices())
        return;
    compare_1_vs_2(NET_DROP, "batch 7", 8, 7, "even");
    compare_1_vs_2(NET_DROP, "device 0 share 0", 8, 8, "0,1");
    compare_1_vs_2(NET_DROP, "device 1 share 0", 8, 8, "1,0");
    compare_1_vs_2(NET_DROP, "batch 1", 4, 1, "even");
    compare_1_vs_2(NET_DROP, "weights 3,1", 16, 13, "3,1");
}
END_TEST

/* With batch norm the devices normalise with their own slice's statistics
 * (as PyTorch DDP without SyncBatchNorm), so 2 devices do not match 1; the
 * replicas still stay identical (running statistics averaged). */
/* [batchnorm] sync = 1: statistics of the global batch, so 2 devices train
 * as 1 (weights and running statistics within TOL per step), an uneven
 * split and a lane with 2 samples included; without sync the per-device
 * statistics make every step differ (the comparison can tell). */
START_TEST(syncbn_1_vs_2)
{
    if (!two_devices())
        return;
    size_t len = strlen(NET_BN) + 16;
    char *text = malloc(len);
    const char *at = strstr(NET_BN, "[activation]");
    snprintf(text, len, "%.*ssync = 1\n%s", (int)(at - NET_BN), NET_BN, at);
    g_with_state = 1;
    compare_1_vs_2(text, "sync batchnorm", 32, 32, NULL);
    compare_1_vs_2(text, "sync batchnorm 3,1", 32, 30, "3,1");
    compare_1_vs_2(text, "sync batchnorm 2 samples on lane 1", 16, 10, "4,1");
    compare_1_vs_2_x(NET_BN, "per-device batchnorm", 32, 30, "3,1", 0);
    g_with_state = 0;
    free(text);
}
END_TEST

START_TEST(batchnorm_replicas_identical)
{
    if (!two_devices())
        return;
    uint64_t seed = tu_seed();
    clg_model *two = make(NET_BN, "all", NULL, 32, 0, seed);
    double l = 0;
    train(two, seed, 20, 32, &l);
    check_replicas_identical(two);
    clg_session_free(two);
}
END_TEST

/* Lane 1 posing as a device half as fast: the shares follow the speeds. */
START_TEST(shares_follow_speed)
{
    if (!two_devices())
        return;
    ck_assert_int_eq(clg_ctx_option_set(ctx(), "test_slow_lane", "1:1.0"), CLG_OK);
    uint64_t seed = tu_seed();
    char *text = tt_read_model("lenet5.cfg");
    clg_model *m = make(text, "all", NULL, 64, 0, seed);
    ck_assert_int_eq(clg_ctx_option_set(ctx(), "test_slow_lane", ""), CLG_OK);
    train(m, seed, 24, 64, NULL);
    char sh[64];
    clg_dp_shares(m->dp, sh, sizeof sh);
    fprintf(stderr, "lane 1 slowed to half speed: shares %s after 24 steps (ideal 0.67/0.33), %d re-balances\n", sh,
            m->dp->rebalances);
    /* ideal 2/3 for lane 0, but pthread devices share one worker pool: while lane 1 sleeps, lane 0 has every
     * core and looks faster than it is; timing noise of a shared machine gets a wide margin too. An even or
     * inverted split fails. */
    ck_assert_msg(m->dp->share[0] >= 0.56 && m->dp->share[0] <= 0.95, "shares %s", sh);
    check_replicas_identical(m);
    clg_session_free(m);
    free(text);
}
END_TEST

/* Unequal devices (POCL_DEVICES="basic pthread": a one-thread device beside
 * a pool of workers) finish a step together once the split has followed
 * their speeds: median compute times within 50% of each other (timing noise
 * on a shared machine; an even split of these devices is off by 2x or more). */
START_TEST(unequal_devices_finish_together)
{
    if (!two_devices())
        return;
    uint64_t seed = tu_seed();
    char *text = tt_read_model("lenet5.cfg");
    clg_model *m = make(text, "all", NULL, 64, 0, seed);
    train(m, seed, 16, 64, NULL);
    /* per-step compute times, compared as medians over 7 steps: a step in
     * which a lane meets a new batch-size class measures convolution
     * algorithms there (a one-off, tens of times a step's compute). A
     * timing test on a shared machine: one look over 50% apart (a neighbour's
     * burst while the split settled) trains 16 steps more and looks again;
     * an even split of these devices stays 2x apart in both. */
    enum { NS = 7 };
    double ts[2][NS], t[2], imb = 1;
    char sh[64];
    clg_rng rng;
    clg_rng_seed(&rng, seed, 8);
    for (int look = 0; look < 2 && imb > 0.5; look++) {
        if (look)
            train(m, seed, 16, 64, NULL);
        for (int s = 0; s < NS; s++) {
            float res[2];
            step_on(m, &rng, 64, res);
            for (int l = 0; l < 2; l++)
                ts[l][s] = m->dp->lanes[l].t_compute;
        }
        for (int l = 0; l < 2; l++) {
            for (int i = 1; i < NS; i++) /* insertion sort */
                for (int j = i; j > 0 && ts[l][j] < ts[l][j - 1]; j--) {
                    double x = ts[l][j];
                    ts[l][j] = ts[l][j - 1];
                    ts[l][j - 1] = x;
                }
            t[l] = ts[l][NS / 2];
        }
        clg_dp_shares(m->dp, sh, sizeof sh);
        imb = fabs(t[0] - t[1]) / fmax(t[0], t[1]);
        fprintf(stderr, "unequal devices (look %d): shares %s, median compute %.1f / %.1f ms per step "
                        "(imbalance %.0f%%)\n", look + 1, sh, 1e3 * t[0], 1e3 * t[1], 100 * imb);
    }
    ck_assert_msg(imb <= 0.5, "shares %s leave the devices %.0f%% apart", sh, 100 * imb);
    check_replicas_identical(m);
    clg_session_free(m);
    free(text);
}
END_TEST

/* fp16: inf in a sample of device 1's slice skips the step on both. */
START_TEST(fp16_overflow_skips_everywhere)
{
    if (!two_devices())
        return;
    uint64_t seed = tu_seed();
    clg_model *m = make(NET_DROP, "all", "even", 32, 1, seed);
    train(m, seed, 2, 32, NULL);
    ck_assert_int_eq(m->ls_skipped, 0);
    double s0 = m->loss_scale;
    int64_t t0 = m->dp->lanes[0].opt->t, t1 = m->dp->lanes[1].opt->t;
    size_t n0 = 0;
    float *before = download_param(m, 1, 0, &n0);
    clg_rng rng;
    clg_rng_seed(&rng, seed, 5);
    ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
    tt_synth_quadrants(&rng, m->xhost[0], m->yhost[0], 32, 1, 8, 8);
    m->xhost[0][30 * 64 + 7] = INFINITY; /* sample 30: device 1's half */
    ck_assert(clg_session_upload(m, 0, 32, 1) == CLG_OK);
    ck_assert_int_eq(m->dp->cnt[0][0], 16);
    ck_assert_msg(clg_session_train_step(m, 0, 0.05, NULL) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_int_eq(m->ls_skipped, 1);
    ck_assert(m->loss_scale == s0 / 2);
    ck_assert_int_eq(m->dp->lanes[0].opt->t, t0); /* no update on either device */
    ck_assert_int_eq(m->dp->lanes[1].opt->t, t1);
    size_t n1 = 0;
    float *after = download_param(m, 1, 0, &n1);
    ck_assert(memcmp(before, after, n0 * sizeof(float)) == 0);
    free(before);
    free(after);
    train(m, seed + 1, 3, 32, NULL); /* and training goes on */
    check_replicas_identical(m);
    clg_session_free(m);
}
END_TEST

/* A checkpoint written on 2 devices resumes on 1 (and says so): the
 * weights and optimizer state carry over exactly. */
START_TEST(resume_other_device_count)
{
    if (!two_devices())
        return;
    uint64_t seed = tu_seed();
    char *text = tt_read_model("lenet5.cfg");
    clg_model *two = make(text, "all", NULL, 16, 0, seed);
    train(two, seed, 5, 16, NULL);
    char path[256];
    snprintf(path, sizeof path, "test_dp_%d.safetensors", (int)getpid());
    ck_assert_msg(clg_session_save(two, path, 1, 100) == CLG_OK, "%s", clg_last_error(ctx()));
    clg_model *one = make(text, "0", NULL, 16, 0, seed + 7);
    ck_assert(clg_session_ensure_optim(one) == CLG_OK);
    ck_assert_msg(clg_session_load(one, path, 1) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(strstr(one->resumed_from, "2 device(s)") != NULL, "resumed_from '%s'", one->resumed_from);
    ck_assert_int_eq(one->step, 5);
    ck_assert(max_rel_diff(one, two) == 0);
    /* one more identical step on both: still equal within the 1-vs-2 tolerance */
    train(one, seed + 3, 1, 16, NULL);
    train(two, seed + 3, 1, 16, NULL);
    ck_assert(max_rel_diff(one, two) <= TOL);
    /* and back onto 2 devices: every lane gets the weights */
    clg_model *two_b = make(text, "all", NULL, 16, 0, seed + 9);
    ck_assert(clg_session_ensure_optim(two_b) == CLG_OK);
    ck_assert(clg_session_load(two_b, path, 1) == CLG_OK);
    ck_assert_msg(two_b->resumed_from[0] == 0, "same device count: '%s'", two_b->resumed_from);
    check_replicas_identical(two_b);
    unlink(path);
    clg_session_free(one);
    clg_session_free(two);
    clg_session_free(two_b);
    free(text);
}
END_TEST

/* Resume onto the same two devices with a fixed split is bitwise exact:
 * 10 steps straight = 5 steps, checkpoint, a new model, 5 steps. */
START_TEST(resume_same_devices_exact)
{
    if (!two_devices())
        return;
    uint64_t seed = tu_seed();
    clg_model *a = make(NET_DROP, "all", "even", 32, 0, seed), *b = make(NET_DROP, "all", "even", 32, 0, seed);
    clg_rng ra, rb;
    clg_rng_seed(&ra, seed, 11);
    clg_rng_seed(&rb, seed, 11);
    float res[2];
    for (int s = 0; s < 10; s++)
        step_on(a, &ra, 32, res);
    for (int s = 0; s < 5; s++)
        step_on(b, &rb, 32, res);
    char path[256];
    snprintf(path, sizeof path, "test_dp_exact_%d.safetensors", (int)getpid());
    ck_assert(clg_session_save(b, path, 1, 0) == CLG_OK);
    clg_session_free(b);
    b = make(NET_DROP, "all", "even", 32, 0, seed + 1);
    ck_assert(clg_session_ensure_optim(b) == CLG_OK);
    ck_assert_msg(clg_session_load(b, path, 1) == CLG_OK, "%s", clg_last_error(ctx()));
    unlink(path);
    for (int s = 0; s < 5; s++)
        step_on(b, &rb, 32, res);
    ck_assert(max_rel_diff(b, a) == 0);
    check_replicas_identical(b);
    clg_session_free(a);
    clg_session_free(b);
}
END_TEST

/* A device failing mid-step: a clear status naming it, no hang. */
/* (twice: small buckets, then one bucket summed on the host: on CPU devices the other lane's arena is
 * mapped when the step fails, and freeing the model ends the mapping) */
START_TEST(failing_device)
{
    if (!two_devices())
        return;
    for (int k = 0; k < 2; k++) {
        g_bucket_mb = k ? 25 : 0.004;
        g_reduce = k ? "host" : NULL;
        uint64_t seed = tu_seed();
        clg_model *m = make(NET_DROP, "all", NULL, 32, 0, seed);
        g_bucket_mb = 0.004;
        g_reduce = NULL;
        ck_assert(m->dp->hmap == (k && m->dp->lanes[0].dev->info.type == CLG_DEVICE_CPU));
        train(m, seed, 2, 32, NULL);
        m->dp->fault_lane = 1;
        m->dp->fault_step = m->step;
        clg_rng rng;
        clg_rng_seed(&rng, seed, 6);
        ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
        tt_synth_quadrants(&rng, m->xhost[0], m->yhost[0], 32, 1, 8, 8);
        ck_assert(clg_session_upload(m, 0, 32, 1) == CLG_OK);
        double t0 = clg_now_sec();
        clg_status st = clg_session_train_step(m, 0, 0.05, NULL);
        ck_assert_int_eq(st, CLG_ERR_OPENCL);
        const char *msg = clg_last_error(ctx());
        char want[64];
        snprintf(want, sizeof want, "device %d (", m->dp->lanes[1].dev->index);
        ck_assert_msg(strstr(msg, want) && strstr(msg, "injected fault"), "message: %s", msg);
        ck_assert(clg_now_sec() - t0 < 60);
        clg_session_free(m);
    }
}
END_TEST

/* clg_team_create_ex with caller_lane0: lane 0 runs on the calling thread
 * inside clg_team_end (after what the caller did between begin and end),
 * the other lanes on threads of their own; without it every lane has its
 * own thread. Every lane runs once per job; a failing lane's status (the
 * lowest-numbered) comes back, lane 0 on the caller's thread included. */
typedef struct {
    pthread_t self[4];
    int runs[4];
    int fail_lane;
    int began;   /* set by the caller between begin and end */
    int saw[4];  /* what each lane saw of it */
} team_probe;

static clg_status team_probe_fn(void *arg, int lane)
{
    team_probe *p = arg;
    p->self[lane] = pthread_self();
    p->runs[lane]++;
    p->saw[lane] = __atomic_load_n(&p->began, __ATOMIC_SEQ_CST);
    return lane == p->fail_lane ? CLG_ERR_INTERNAL : CLG_OK;
}

START_TEST(team_caller_lane)
{
    for (int spin = 0; spin <= 2000; spin += 2000) /* sleeping waits, and spinning ones (option dp_spin_us) */
    for (int caller = 0; caller < 2; caller++)
        for (int lanes = 2; lanes <= 4; lanes++) {
            clg_team *t = NULL;
            ck_assert_int_eq(clg_team_create_ex(&ctx()->err, lanes, caller, &t), CLG_OK);
            clg_team_set_spin(t, spin);
            for (int job = 0; job < 3; job++) {
                team_probe p;
                memset(&p, 0, sizeof p);
                p.fail_lane = job == 1 ? 0 : job == 2 ? lanes - 1 : -1;
                clg_team_begin(t, team_probe_fn, &p);
                __atomic_store_n(&p.began, 1, __ATOMIC_SEQ_CST);
                int failed = -1;
                clg_status st = clg_team_end(t, &failed);
                ck_assert_int_eq(st, p.fail_lane < 0 ? CLG_OK : CLG_ERR_INTERNAL);
                if (p.fail_lane >= 0)
                    ck_assert_int_eq(failed, p.fail_lane);
                for (int l = 0; l < lanes; l++) {
                    ck_assert_int_eq(p.runs[l], 1);
                    int here = pthread_equal(p.self[l], pthread_self());
                    ck_assert_msg(here == (caller && l == 0), "caller %d, %d lanes: lane %d on the caller's thread: %d",
                                  caller, lanes, l, here);
                    for (int k = 0; k < l; k++)
                        ck_assert(!pthread_equal(p.self[k], p.self[l]));
                }
                if (caller) /* lane 0 ran after the caller's work between begin and end */
                    ck_assert_int_eq(p.saw[0], 1);
            }
            clg_team_free(t);
        }
}
END_TEST

/* The option dp_caller_lane (lane 0 on the calling thread, the default, or
 * on a thread of its own) changes no bit of a data-parallel step: the same
 * seed and batches give bitwise the same weights either way. */
START_TEST(caller_lane_same_bits)
{
    if (!two_devices())
        return;
    uint64_t seed = tu_seed();
    ck_assert(clg_ctx_option_set(ctx(), "conv_auto_measure", "0") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "gemm_auto_measure", "0") == CLG_OK);
    clg_model *m[2];
    for (int c = 0; c < 2; c++) {
        ck_assert(clg_ctx_option_set(ctx(), "dp_caller_lane", c ? "1" : "0") == CLG_OK);
        m[c] = make(NET_DROP, "0,1", "even", 32, 0, seed);
        clg_rng r;
        clg_rng_seed(&r, seed, 7);
        for (int s = 0; s < 4; s++) {
            float res[2];
            step_on(m[c], &r, 32, res);
        }
        check_replicas_identical(m[c]);
    }
    ck_assert(clg_ctx_option_set(ctx(), "dp_caller_lane", "1") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "conv_auto_measure", "1") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "gemm_auto_measure", "1") == CLG_OK);
    double d = max_rel_diff(m[0], m[1]);
    ck_assert_msg(d == 0, "lane 0 on its own thread vs the caller's: weights differ by %g", d);
    clg_session_free(m[0]);
    clg_session_free(m[1]);
}
END_TEST

/* Spinning waits (option dp_spin_us; forced on by test_dp_spin, as the
 * test's devices are not two `basic` ones) change no bit of a data-parallel
 * step: sleeping (0), spinning long enough for every wait (1 s) and
 * spinning too briefly (1 us: the spin runs out, the lane sleeps, and the
 * back-off turns the spin off for a while), with lane 0 on the caller's
 * thread or its own and a bucket per layer (the lanes share the sums' parts),
 * give bitwise the same weights. */
START_TEST(spin_same_bits)
{
    if (!two_devices())
        return;
    uint64_t seed = tu_seed();
    ck_assert(clg_ctx_option_set(ctx(), "conv_auto_measure", "0") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "gemm_auto_measure", "0") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "test_dp_spin", "1") == CLG_OK);
    static const char *spins[] = {"0", "1000000", "1", "0", "1000000", "1"};
    for (int big = 0; big < 2; big++) { /* buckets of 4 KB (several, shared in parts), one bucket (mapped) */
        g_bucket_mb = big ? 25 : 0.004;
        clg_model *m[6];
        for (int c = 0; c < 6; c++) {
            ck_assert(clg_ctx_option_set(ctx(), "dp_spin_us", spins[c]) == CLG_OK);
            ck_assert(clg_ctx_option_set(ctx(), "dp_caller_lane", c < 3 ? "1" : "0") == CLG_OK);
            m[c] = make(NET_DROP, "0,1", "even", 32, 0, seed);
            clg_rng r;
            clg_rng_seed(&r, seed, 7);
            for (int s = 0; s < 6; s++) {
                float res[2];
                step_on(m[c], &r, 32, res);
            }
            check_replicas_identical(m[c]);
        }
        for (int c = 1; c < 6; c++) {
            double d = max_rel_diff(m[0], m[c]);
            ck_assert_msg(d == 0, "buckets %g MB, dp_spin_us %s, caller lane %d: weights differ from sleeping "
                          "waits by %g", g_bucket_mb, spins[c], c < 3, d);
        }
        for (int c = 0; c < 6; c++)
            clg_session_free(m[c]);
    }
    g_bucket_mb = 0.004;
    ck_assert(clg_ctx_option_set(ctx(), "test_dp_spin", "0") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "dp_spin_us", "200") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "dp_caller_lane", "1") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "conv_auto_measure", "1") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "gemm_auto_measure", "1") == CLG_OK);
}
END_TEST

/* Split weights: plain decimal in [0, 1e6], non-zero ones within a ratio of 1e6, one per device; anything
 * else refused naming the split (issue 26 item 5: 1e308,1e308 summed to inf and gave shares 0/0). */
START_TEST(split_refusals)
{
    const char *bad[] = {"1e308,1e308", " 1, 1", "1, 1", "+1,1", "0x10,1", "inf,1", "nan,1", "1,-1", "1e7,1",
                         "1,1e-7", "1,", ",1", "1,,1", "1", "1,1,1", "", "0,0", "1.,1 "};
    clg_dp_params dpp = {.bucket_mb = 0.004};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dpp.split = bad[i];
        clg_model *m = NULL;
        clg_status st = clg_session_create(ctx(), "0,1", 0, NET_DROP, "t", 8, 1, 0, &dpp, &m);
        ck_assert_msg(st == CLG_ERR_INVALID_ARG, "split '%s' accepted (status %d)", bad[i], (int)st);
        ck_assert_ptr_null(m);
        ck_assert_msg(strstr(clg_last_error(ctx()), "split '") != NULL, "split '%s': message '%s'", bad[i],
                      clg_last_error(ctx()));
    }
    const char *good[] = {"3,1", "0,1", "1e6,1", "0.5,2.5e-1", "even", "auto"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        dpp.split = good[i];
        clg_model *m = NULL;
        ck_assert_msg(clg_session_create(ctx(), "0,1", 0, NET_DROP, "t", 8, 1, 0, &dpp, &m) == CLG_OK, "'%s': %s",
                      good[i], clg_last_error(ctx()));
        clg_session_free(m);
    }
}
END_TEST

/* The oversubscription check on synthetic step times (fresh random each
 * run) against a plain double-precision reference: noise of +-15% and a
 * single one-off (a kernel build) are not suspect; preemption stalls of
 * 3-6x in one step of five, or a p90 past twice the median, are. */
static void spread_ref(const double *t, int n, double *med, double *p90)
{
    double v[64];
    memcpy(v, t, (size_t)n * sizeof *v);
    for (int i = 0; i < n; i++) /* selection sort: a different algorithm from the library's */
        for (int j = i + 1; j < n; j++)
            if (v[j] < v[i]) {
                double x = v[i];
                v[i] = v[j];
                v[j] = x;
            }
    *med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    *p90 = v[(int)lround(0.9 * (n - 1))];
}

START_TEST(spread_check)
{
    clg_rng rng;
    tu_rng(&rng, 26);
    for (int trial = 0; trial < 50; trial++) {
        enum { N = 24 };
        double t[N], med, p90, rmed, rp90;
        double base = 0.002 + 0.2 * clg_rng_uniform(&rng);
        for (int i = 0; i < N; i++)
            t[i] = base * (0.85 + 0.3 * clg_rng_uniform(&rng));
        ck_assert_int_eq(clg_dp_spread_suspect(t, 5, &med, &p90), 0); /* too few to judge */
        ck_assert(med == 0 && p90 == 0);
        ck_assert_msg(!clg_dp_spread_suspect(t, N, &med, &p90), "noise only: suspect (median %g p90 %g)", med, p90);
        spread_ref(t, N, &rmed, &rp90);
        ck_assert_msg(fabs(med - rmed) <= 1e-12 && fabs(p90 - rp90) <= 1e-12, "median %g / %g, p90 %g / %g", med, rmed,
                      p90, rp90);
        t[clg_rng_u32(&rng) % N] = base * 50; /* one-off */
        ck_assert_msg(!clg_dp_spread_suspect(t, N, &med, &p90), "one outlier: suspect");
        for (int i = 0; i < N; i++) /* stalls in one step of five */
            if (i % 5 == 0)
                t[i] = base * (3 + 3 * clg_rng_uniform(&rng));
        spread_ref(t, N, &rmed, &rp90);
        int stalls = 0;
        for (int i = 0; i < N; i++)
            stalls += t[i] > 4 * rmed;
        int expect = rp90 > 2 * rmed || stalls * 8 >= N;
        ck_assert_int_eq(clg_dp_spread_suspect(t, N, &med, &p90), expect);
        ck_assert_msg(expect, "trial %d: the stalls do not show (median %g, p90 %g)", trial, rmed, rp90);
    }
}
END_TEST

/* Settling (issue 24 item 3): with lane 1 posing as half as fast, the split
 * is set from the first two warm steps, and no step after the first meets
 * a batch size its lane has not run twice (kernel builds and algorithm
 * timing stay out of the steps): the first step's sizes and every size the
 * split moves to are met between steps. */
START_TEST(split_settles_early)
{
    if (!two_devices())
        return;
    ck_assert_int_eq(clg_ctx_option_set(ctx(), "test_slow_lane", "1:1.0"), CLG_OK);
    uint64_t seed = tu_seed();
    char *text = tt_read_model("lenet5.cfg");
    clg_model *m = make(text, "all", NULL, 64, 0, seed);
    ck_assert_int_eq(clg_ctx_option_set(ctx(), "test_slow_lane", ""), CLG_OK);
    clg_rng rng;
    clg_rng_seed(&rng, seed, 5);
    for (int s = 0; s < 16; s++) {
        float res[2];
        step_on(m, &rng, 64, res);
        for (int l = 0; l < 2 && s >= 1; l++) /* step 0: the first split's sizes, met after it */
            ck_assert_msg(!m->dp->lanes[l].cold, "step %d: lane %d met a new batch size (%d) inside the step", s, l,
                          m->dp->lanes[l].cnt[0]);
    }
    char sh[64];
    clg_dp_shares(m->dp, sh, sizeof sh);
    fprintf(stderr, "settling: shares %s, %d calibrations, %d re-balances, %d preparations\n", sh,
            m->dp->calibrations, m->dp->rebalances, m->dp->prepares);
    ck_assert_msg(m->dp->calibrations >= 2 && m->dp->share[0] > 0.55, "shares %s", sh);
    check_replicas_identical(m);
    clg_session_free(m);
    free(text);
}
END_TEST

/* Late moves (issue 24 item 3): once settled, lane 1 slowed to a third of
 * its speed. Frozen (bench train's timed steps), the looks keep the split
 * and meet no new batch size; unfrozen, a move to sizes not run yet waits
 * while its preparation would not pay back within 256 steps (the passes'
 * measured cost raised to 1000 s a pass), and goes ahead once it would
 * (passes made free). */
START_TEST(late_moves_held)
{
    if (!two_devices())
        return;
    uint64_t seed = tu_seed();
    char *text = tt_read_model("lenet5.cfg");
    clg_model *m = make(text, "all", NULL, 64, 0, seed);
    clg_dp *dp = m->dp;
    for (int s = 0; s < 12 && !clg_dp_settled(dp); s++)
        train(m, seed, 1, 64, NULL);
    ck_assert_msg(clg_dp_settled(dp), "12 steps: %d calibrations", dp->calibrations);
    dp->slow_lane = 1;
    dp->slow_factor = 2.0;
    int r0 = dp->rebalances, p0 = dp->prepares, h0 = dp->moves_held;
    double share0 = dp->share[0];
    dp->frozen = 1;
    train(m, seed, 17, 64, NULL); /* two looks (every 8 steps after the calibration) */
    ck_assert_msg(dp->rebalances == r0 && dp->prepares == p0 && dp->share[0] == share0,
                  "frozen: %d moves, %d preparations, share %.3f -> %.3f", dp->rebalances - r0, dp->prepares - p0,
                  share0, dp->share[0]);
    ck_assert_msg(dp->moves_held > h0, "frozen: no look wanted to move (lane 1 three times slower)");
    dp->frozen = 0;
    h0 = dp->moves_held;
    dp->prepare_s = 1000.0 * dp->prepares; /* each pass 1000 s: no gain wins that back in 256 steps */
    train(m, seed, 17, 64, NULL);
    ck_assert_msg(dp->prepares == p0, "costly passes: %d preparations", dp->prepares - p0);
    ck_assert_msg(dp->moves_held > h0, "costly passes: no move held back");
    dp->prepare_s = 0; /* free */
    train(m, seed, 17, 64, NULL);
    char sh[64];
    clg_dp_shares(dp, sh, sizeof sh);
    fprintf(stderr, "late moves: held %d, then shares %s after %d preparations\n", dp->moves_held, sh,
            dp->prepares - p0);
    ck_assert_msg(dp->prepares > p0 && dp->share[0] > share0, "free passes: %d preparations, shares %s",
                  dp->prepares - p0, sh);
    for (int l = 0; l < 2; l++)
        ck_assert(!dp->lanes[l].cold);
    check_replicas_identical(m);
    clg_session_free(m);
    free(text);
}
END_TEST

/* bench train's warm-up goes on until the split has settled (issue 24 item
 * 3): with lane 1 posing as half as fast, the split moves during the
 * calibration after the first warm steps; asked for 1 warm-up step, the
 * benchmark warms up until those moves and the passes meeting their batch
 * sizes are done, so the timed steps neither move the split nor meet new
 * per-device batch sizes. Before, both landed in the first timed steps.
 * 18 timed steps: two looks at the settled split (every 8 steps), which
 * keep it there (the timed steps freeze it). */
START_TEST(bench_warmup_settles)
{
    if (!two_devices())
        return;
    const char *uneq = getenv("CLGRAD_TEST_DP_UNEQUAL");
    int unequal = uneq && *uneq == '1';
    ck_assert_int_eq(clg_ctx_option_set(ctx(), "test_slow_lane", unequal ? "" : "1:1.0"), CLG_OK);
    char path[1024];
    snprintf(path, sizeof path, "%s/models/lenet5.cfg", CLG_SOURCE_DIR);
    clg_bench_train_params p;
    clg_bench_train_params_init(&p);
    p.model = path;
    p.batch = 64;
    p.steps = 18;
    p.warmup = 1;
    p.devices = "all";
    p.seed = tu_seed();
    clg_bench_train_report r;
    memset(&r, 0x7f, sizeof r); /* poisoned: every field must be written */
    clg_status st = clg_bench_train(ctx(), &p, &r);
    ck_assert_int_eq(clg_ctx_option_set(ctx(), "test_slow_lane", ""), CLG_OK);
    ck_assert_msg(st == CLG_OK, "%s", clg_last_error(ctx()));
    fprintf(stderr, "bench warm-up: %d steps run (asked 1), shares %s; timed: %d split moves, %d preparations "
            "(%.3f s)\n", r.warmup_run, r.shares, r.split_moves_timed, r.prepares_timed, r.prepare_timed_s);
    /* step 0 (cold; its sizes met after it), then two warm steps to calibrate on */
    ck_assert_msg(r.warmup_run >= 3 && r.warmup_run <= 1 + 16, "warm-up %d", r.warmup_run);
    ck_assert_msg(r.split_moves_timed == 0 && r.prepares_timed == 0 && r.prepare_timed_s == 0,
                  "the timed steps moved the split %d time(s), met new sizes %d time(s)", r.split_moves_timed,
                  r.prepares_timed);
    ck_assert(r.images_per_s > 0 && isfinite(r.images_per_s));
}
END_TEST

/* Devices of one kind are recognised (the calibration then ignores moves
 * of under 5%: two identical lanes differ by timing noise only); a basic
 * beside a pthread device is not of the same kind. */
START_TEST(same_kind_lanes)
{
    if (!two_devices())
        return;
    const char *uneq = getenv("CLGRAD_TEST_DP_UNEQUAL");
    int unequal = uneq && *uneq == '1';
    clg_model *m = make(NET_BN, "0,1", NULL, 32, 0, tu_seed());
    ck_assert_int_eq(m->dp->same_kind, !unequal);
    ck_assert(!clg_dp_settled(m->dp)); /* no step yet */
    /* step 0 cold (its sizes met after it), calibrations after steps 1 and 2 (a move: its sizes met after
     * it), then warm; 6 steps stay before the first look at the settled split (after 8) */
    train(m, tu_seed(), 6, 32, NULL);
    ck_assert_msg(clg_dp_settled(m->dp), "6 steps: %d calibrations, last step prepared %d", m->dp->calibrations,
                  m->dp->last_prepared);
    /* identical PoCL basic devices compute in their lanes' threads: timed by those threads' CPU time
     * (they spend nearly all of the process's); unequal devices by the wall time. (PoCL pthread
     * devices running this small net spend most of the process's CPU time enqueueing in the lanes'
     * threads too: either way is right there.) */
    int basic = 1;
    for (int i = 0; i < m->dp->n; i++)
        basic &= strncmp(m->dp->lanes[i].dev->info.name, "basic", 5) == 0;
    if (basic || unequal)
        ck_assert_msg(m->dp->cpu_timed == !unequal, "lanes timed by CPU time: %d, devices %s / %s",
                      m->dp->cpu_timed, m->dp->lanes[0].dev->info.name, m->dp->lanes[1].dev->info.name);
    clg_session_free(m);
    clg_model *one = make(NET_BN, "0", NULL, 32, 0, tu_seed());
    ck_assert_int_eq(one->dp->same_kind, 0);
    ck_assert(!clg_dp_settled(one->dp));
    train(one, tu_seed(), 2, 32, NULL); /* step 0 cold, step 1 measures (second use) */
    ck_assert(!clg_dp_settled(one->dp));
    train(one, tu_seed(), 1, 32, NULL);
    ck_assert(clg_dp_settled(one->dp));
    clg_session_free(one);
}
END_TEST

/* The first step's hook (the clgrad program stops its precompile helper there) runs once, when the lanes
 * have ended the first step and before its per-device batch sizes are met (algorithm timing) or the split
 * calibrated. */
static int g_first_calls, g_first_prepares, g_first_cal;
static void first_end_cb(void *user)
{
    clg_dp *dp = user;
    g_first_calls++;
    g_first_prepares = dp->prepares;
    g_first_cal = dp->calibrations;
}

START_TEST(first_end_hook)
{
    if (!two_devices())
        return;
    clg_model *m = make(NET_BN, "0,1", NULL, 32, 0, tu_seed());
    g_first_calls = 0;
    g_first_prepares = g_first_cal = -1;
    m->dp->first_end = first_end_cb;
    m->dp->first_end_user = m->dp;
    train(m, tu_seed(), 3, 32, NULL);
    ck_assert_int_eq(g_first_calls, 1);
    ck_assert_msg(g_first_prepares == 0 && g_first_cal == 0, "hook after %d preparations, %d calibrations",
                  g_first_prepares, g_first_cal);
    ck_assert_msg(m->dp->prepares >= 1, "the first step's sizes were not met after it");
    ck_assert(m->dp->first_end == NULL);
    clg_session_free(m);
}
END_TEST

/* Meeting new batch sizes between steps keeps every parameter, batch-norm
 * running statistics included, bitwise (the pass runs on zeros: without
 * the restore the running statistics move towards 0). */
START_TEST(prepare_keeps_state)
{
    if (!two_devices())
        return;
    uint64_t seed = tu_seed();
    clg_model *m = make(NET_BN, "0,1", "even", 32, 0, seed);
    train(m, seed, 3, 32, NULL);
    int np = nparams(m);
    float **before = calloc((size_t)np * 2, sizeof *before);
    size_t *nb = calloc((size_t)np * 2, sizeof *nb);
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < np; i++)
            before[l * np + i] = download_param(m, l, i, &nb[l * np + i]);
    m->dp->share[0] = 0.25; /* 8 / 24 samples: sizes neither lane has run */
    m->dp->share[1] = 0.75;
    ck_assert(!m->dp->lanes[0].ready[8] && !m->dp->lanes[1].ready[24]);
    int before_n = m->dp->prepares;
    ck_assert_msg(clg_dp_prepare(m->dp) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert(m->dp->lanes[0].ready[8] == 2 && m->dp->lanes[1].ready[24] == 2 && m->dp->prepares == before_n + 1);
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < np; i++) {
            size_t n = 0;
            float *w = download_param(m, l, i, &n);
            ck_assert(n == nb[l * np + i]);
            ck_assert_msg(memcmp(w, before[l * np + i], n * sizeof(float)) == 0,
                          "lane %d parameter %d changed by the preparation", l, i);
            free(w);
            free(before[l * np + i]);
        }
    free(before);
    free(nb);
    train(m, seed, 2, 32, NULL); /* the new split trains */
    check_replicas_identical(m);
    clg_session_free(m);
}
END_TEST

/* The host reduction sums a bucket in parts that several lane threads share
 * (clg_optk_sum_sq_part over work-item ranges of the norm's grid, then
 * clg_optk_sumsq_tree): for any split into parts, every lane count (0: a
 * rank without samples) and bucket sizes around the grid (one element, a
 * partial group, whole periods and a tail), the sum is bitwise the lanes'
 * values added in lane order and the norm bitwise clg_optk_sumsq_host of
 * that sum (what one thread summing the whole bucket gave); the norm is
 * also within 1e-5 (relative) of a double-precision reference. Outputs are
 * poisoned first, so an element no part writes fails. */
START_TEST(host_sum_parts)
{
    static const size_t sizes[] = {1, 255, 257, 4097, 16384, 16385, 61706, 3 * 16384 + 17};
    static const int wgs[] = {256, 64, 1};
    clg_rng r;
    tu_rng(&r, 41);
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (int na = 0; na <= 3; na++)
            for (size_t wi = 0; wi < sizeof wgs / sizeof *wgs; wi++) {
                size_t n = sizes[si];
                float *x[3], *y = malloc(n * sizeof *y), *ref = malloc(n * sizeof *ref);
                int wg = wgs[wi];
                size_t global = clg_optk_sumsq_grid(n, &wg, 64);
                float *acc = malloc(global * sizeof *acc);
                ck_assert(y && ref && acc && global % (size_t)wg == 0 && global / (size_t)wg <= 64);
                double dref = 0;
                for (int l = 0; l < na; l++) {
                    x[l] = malloc(n * sizeof *x[l]);
                    ck_assert_ptr_nonnull(x[l]);
                    tu_fill(x[l], n, -2.0f, 2.0f, &r);
                }
                for (size_t i = 0; i < n; i++) {
                    float v = na > 0 ? x[0][i] : 0.0f;
                    for (int l = 1; l < na; l++)
                        v += x[l][i];
                    ref[i] = v;
                    dref += (double)v * v;
                }
                double want = clg_optk_sumsq_host(ref, n, wgs[wi], 64);
                for (int parts = 1; parts <= 5; parts++) {
                    tu_poison(y, n);
                    tu_poison(acc, global);
                    for (int p = parts - 1; p >= 0; p--) /* any order: the parts are independent */
                        clg_optk_sum_sq_part(y, (const float *const *)x, na, n, global, global * (size_t)p / parts,
                                             global * (size_t)(p + 1) / parts, acc);
                    ck_assert_msg(memcmp(y, ref, n * sizeof *y) == 0, "n %zu, %d lanes, %d parts: sum differs", n,
                                  na, parts);
                    double got = clg_optk_sumsq_tree(acc, wg, global / (size_t)wg);
                    ck_assert_msg(got == want, "n %zu, %d lanes, wg %d, %d parts: norm %.17g, one thread %.17g", n,
                                  na, wg, parts, got, want);
                    ck_assert_msg(fabs(got - dref) <= 1e-5 * dref, "n %zu: norm %.9g, double reference %.9g", n,
                                  got, dref);
                    /* in place: the sum stored back into every lane's buffer, the same norm */
                    float *xb[3];
                    for (int l = 0; l < na; l++) {
                        xb[l] = malloc(n * sizeof *xb[l]);
                        ck_assert_ptr_nonnull(xb[l]);
                        memcpy(xb[l], x[l], n * sizeof *xb[l]);
                    }
                    tu_poison(acc, global);
                    for (int p = 0; p < parts; p++)
                        clg_optk_sum_sq_back(xb, na, n, global, global * (size_t)p / parts,
                                             global * (size_t)(p + 1) / parts, acc);
                    for (int l = 0; l < na; l++) {
                        ck_assert_msg(memcmp(xb[l], ref, n * sizeof *y) == 0, "n %zu, %d lanes, %d parts: lane %d's "
                                      "sum in place differs", n, na, parts, l);
                        free(xb[l]);
                    }
                    if (na > 0) {
                        got = clg_optk_sumsq_tree(acc, wg, global / (size_t)wg);
                        ck_assert_msg(got == want, "n %zu, %d lanes, %d parts: norm in place %.17g, one thread %.17g",
                                      n, na, parts, got, want);
                    }
                }
                for (int l = 0; l < na; l++)
                    free(x[l]);
                free(y);
                free(ref);
                free(acc);
            }
}
END_TEST

int main(void)
{
    if (!two_devices()) {
        clg_ctx_destroy(g_ctx);
        return TU_SKIP;
    }
    Suite *s = suite_create("dp");
    TCase *tc = tcase_create("dp");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, lenet5_1_vs_2);
    TCase *tq = tcase_create("split_refusals"); /* quick: CK_RUN_CASE=split_refusals runs it alone */
    tcase_add_test(tq, split_refusals);
    tcase_add_test(tq, spread_check);
    tcase_add_test(tq, team_caller_lane);
    tcase_add_test(tq, caller_lane_same_bits);
    tcase_add_test(tq, spin_same_bits);
    tcase_add_test(tq, host_sum_parts);
    suite_add_tcase(s, tq);
    tcase_add_test(tc, dropout_residual_1_vs_2);
    tcase_add_test(tc, uneven_splits);
    /* identical devices only: PoCL 3.1 deadlocks on cross-device events between
     * a basic and a pthread device (see dreduce.c) */
    if (!getenv("CLGRAD_TEST_DP_UNEQUAL")) {
        tcase_add_test(tc, device_reduction_equals_host);
        TCase *tclip = tcase_create("reduce_clip"); /* CK_RUN_CASE=reduce_clip runs it alone */
        tcase_set_timeout(tclip, 600);
        tcase_add_test(tclip, device_reduction_equals_host_clipped);
        tcase_add_test(tclip, mapped_equals_copied);
        suite_add_tcase(s, tclip);
    }
    tcase_add_test(tc, batchnorm_replicas_identical);
    tcase_add_test(tc, syncbn_1_vs_2);
    /* CLGRAD_TEST_DP_UNEQUAL=1: the devices differ (run with POCL_DEVICES="basic pthread"); the
     * slowed-lane test assumes equal devices */
    const char *uneq = getenv("CLGRAD_TEST_DP_UNEQUAL");
    if (uneq && *uneq == '1')
        tcase_add_test(tc, unequal_devices_finish_together);
    else
        tcase_add_test(tc, shares_follow_speed);
    tcase_add_test(tc, prepare_keeps_state);
    TCase *tb = tcase_create("settle"); /* CK_RUN_CASE=settle runs it alone */
    tcase_set_timeout(tb, 600);
    tcase_add_test(tb, bench_warmup_settles);
    tcase_add_test(tb, same_kind_lanes);
    tcase_add_test(tb, first_end_hook);
    suite_add_tcase(s, tb);
    if (!(uneq && *uneq == '1')) {
        tcase_add_test(tc, split_settles_early);
        tcase_add_test(tb, late_moves_held);
    }
    tcase_add_test(tc, fp16_overflow_skips_everywhere);
    tcase_add_test(tc, resume_other_device_count);
    tcase_add_test(tc, resume_same_devices_exact);
    tcase_add_test(tc, failing_device);
    suite_add_tcase(s, tc);
    int rc = tu_run(s);
    clg_ctx_destroy(g_ctx);
    return rc;
}
