/* Sharded optimizer state (ZeRO-1, clg_dp_params.shard_optimizer) on two
 * devices (POCL_DEVICES="pthread pthread"), against the unsharded step on
 * the same two devices with the same even split:
 *  - SGD with momentum (Nesterov, weight decay), Adam and AdamW, fp32 and
 *    fp16 storage, gradient clipping by the global norm active on most
 *    steps: after 20 steps every weight (both lanes) and every optimizer
 *    state element equal to the bit. The update kernels are element-wise
 *    over the arena and see the same reduced gradient, the same clip factor
 *    and the same hyper-parameters, so a slice update is bitwise the same
 *    arithmetic; nothing justifies a tolerance.
 *  - each device's optimizer-state bytes <= (1/2 + 5%) of the unsharded.
 *  - checkpoints: sharded -> unsharded -> sharded, the state bitwise the
 *    same, and 5 more steps on all three bitwise equal.
 *  - the shipped resnet-mini (batch norm, residuals), Adam, 5 steps: bitwise.
 *  - the memory cap (option device_mem_limit): an Adam MLP whose peak on
 *    one device is above the cap is refused with a status naming the device
 *    and the cap, and trains on two devices with sharded state (not without).
 * Both sides use the host reduction (and one case the device-to-device one),
 * the even split, and contexts without timing-dependent kernel choices.
 * Inputs are fresh random images (seed from tu_seed); host copies are
 * poisoned (NaN) before every download. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train_testutil.h"

#define STEPS 20

static clg_ctx *g_ctx;

static clg_ctx *ctx(void)
{
    if (!g_ctx)
        g_ctx = tu_ctx_fixed(0);
    return g_ctx;
}

static int two_devices(void)
{
    if (clg_device_count(ctx()) < 2) {
        fprintf(stderr, "test_shard: needs two OpenCL devices (POCL_DEVICES=\"pthread pthread\")\n");
        return 0;
    }
    return 1;
}

/* Convolution, residual add, dense layers: parameters of many sizes, so the
 * shard boundary falls inside a tensor. */
static const char *NET = "[net]\nchannels = 1\nheight = 8\nwidth = 8\nclasses = 4\nbatch = 16\n"
                         "[conv]\nname = c1\nfilters = 8\nsize = 3\npad = 1\nactivation = relu\n"
                         "[conv]\nname = c2\nfilters = 8\nsize = 3\npad = 1\n"
                         "[add]\nname = res\ninput = c1, c2\n"
                         "[maxpool]\nsize = 2\n"
                         "[dense]\nname = fc1\nunits = 40\nactivation = relu\n"
                         "[dense]\nname = fc2\nunits = 24\nactivation = relu\n"
                         "[dense]\nname = fc\nunits = 4\n"
                         "[softmax]\nname = loss\n";

/* 1024-512-512-4: 3 MiB of weights, Adam state 6 MiB unsharded. */
static const char *MLP = "[net]\nchannels = 1\nheight = 32\nwidth = 32\nclasses = 4\nbatch = 8\n"
                         "optimizer = adam\nlearning_rate = 0.001\n"
                         "[dense]\nname = fc1\nunits = 512\nactivation = relu\n"
                         "[dense]\nname = fc2\nunits = 512\nactivation = relu\n"
                         "[dense]\nname = fc\nunits = 4\n"
                         "[softmax]\nname = loss\n";

/* The reduction path of the models made: fixed, as the start-up timing
 * could pick the host path for one model and the device path for the next,
 * whose clip norms differ in rounding (float partial sums on the device,
 * double on the host). */
static const char *g_reduce = "host";
static const char *g_split = "even"; /* the batch split of the models made */

static clg_status make_in(clg_ctx *c, const char *text, const char *devices, int fp16, int shard, int opt,
                          uint64_t seed, clg_model **m)
{
    clg_dp_params dpp = {.split = g_split, .bucket_mb = 0.004, .shard_optimizer = shard, .reduce = g_reduce};
    int batch = 0;
    CLG_TRY(clg_session_create(c, devices, 0, text, "t", batch, seed, fp16, &dpp, m));
    clg_hparams *hp = &(*m)->hp;
    if (opt >= 0) {
        hp->optimizer = opt;
        hp->learning_rate = opt == CLG_OPT_SGD ? 0.05 : 0.01;
        hp->momentum = 0.9;
        hp->nesterov = 1;
        hp->weight_decay = 1e-3;
        hp->clip_norm = 0.2; /* the norm of these gradients is ~0.3..2: most steps clip */
    }
    return CLG_OK;
}

static clg_model *make(const char *text, int fp16, int shard, int opt, uint64_t seed)
{
    clg_model *m = NULL;
    ck_assert_msg(make_in(ctx(), text, "all", fp16, shard, opt, seed, &m) == CLG_OK, "%s", clg_last_error(ctx()));
    return m;
}

/* `steps` steps on fresh samples from rng; returns the steps that clipped
 * (global norm above clip_norm); *st the first failure (NULL: must pass). */
static int train(clg_model *m, clg_rng *rng, int steps, clg_status *st)
{
    int clipped = 0, n = m->net->batch;
    for (int s = 0; s < steps; s++) {
        ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
        tt_synth_quadrants(rng, m->xhost[0], m->yhost[0], n, m->net->in_c, m->net->in_h, m->net->in_w);
        ck_assert_msg(clg_session_upload(m, 0, n, 1) == CLG_OK, "%s", clg_last_error(m->ctx));
        float res[2];
        clg_status r = clg_session_train_step(m, 0, m->hp.learning_rate, res);
        if (st && r != CLG_OK) {
            *st = r;
            return clipped;
        }
        ck_assert_msg(r == CLG_OK, "%s", clg_last_error(m->ctx));
        ck_assert_msg(isfinite(res[0]), "step %d: loss %g", s, res[0]);
        clipped += m->dp->job.norm > m->hp.clip_norm && m->hp.clip_norm > 0;
    }
    return clipped;
}

/* Every parameter (master copies, batch-norm state) of lane `la` of a and
 * lane `lb` of b equal to the bit. */
static void same_weights(clg_model *a, int la, clg_model *b, int lb, const char *what)
{
    clg_param_ref *ra = NULL, *rb = NULL;
    int na = 0, nb = 0;
    ck_assert(clg_replica_params(a->dp->lanes[la].rep, 0, &ra, &na) == CLG_OK);
    ck_assert(clg_replica_params(b->dp->lanes[lb].rep, 0, &rb, &nb) == CLG_OK);
    ck_assert_int_eq(na, nb);
    for (int i = 0; i < na; i++) {
        size_t n = ra[i].param->numel;
        float *ha = malloc(n * sizeof(float)), *hb = malloc(n * sizeof(float));
        tu_poison(ha, n);
        tu_poison(hb, n);
        tu_download(a->dp->lanes[la].dev, clg_replica_master(a->dp->lanes[la].rep, &ra[i]), ha, n);
        tu_download(b->dp->lanes[lb].dev, clg_replica_master(b->dp->lanes[lb].rep, &rb[i]), hb, n);
        size_t k = 0;
        while (k < n && memcmp(&ha[k], &hb[k], sizeof(float)) == 0)
            k++;
        ck_assert_msg(k == n, "%s: %s.%s element %zu: %.9g vs %.9g", what, ra[i].layer->name, ra[i].param->name, k,
                      (double)ha[k], (double)hb[k]);
        free(ha);
        free(hb);
    }
    free(ra);
    free(rb);
}

/* n floats of buffer m from float off (the host copy poisoned first). */
static float *read_at(clg_device *dev, cl_mem m, size_t n, size_t off)
{
    float *h = malloc((n + 1) * sizeof(float));
    ck_assert_ptr_nonnull(h);
    tu_poison(h, n + 1);
    ck_assert_int_eq(clEnqueueReadBuffer(dev->queue, m, CL_TRUE, off * sizeof(float), n * sizeof(float), h, 0, NULL,
                                         NULL),
                     CL_SUCCESS);
    return h;
}

/* The optimizer-state arenas of sharded model s, lane by lane, against the
 * same floats of unsharded model u's lane 0 (read straight from the arenas,
 * not through the checkpoint path). */
static void same_state(clg_model *u, clg_model *s, const char *what)
{
    const clg_optim *ou = u->dp->lanes[0].opt;
    ck_assert(!ou->shard && ou->arena);
    int ns = clg_optim_nstate(ou);
    ck_assert_int_ge(ns, 1);
    for (int l = 0; l < s->dp->n; l++) {
        const clg_optim *os = s->dp->lanes[l].opt;
        ck_assert(os->shard);
        size_t n = os->k1 - os->k0;
        for (int k = 0; k < ns && n > 0; k++) {
            cl_mem mu = k ? ou->varena : ou->marena, ms = k ? os->varena : os->marena;
            float *hu = read_at(u->dp->lanes[0].dev, mu, n, os->k0);
            float *hs = read_at(s->dp->lanes[l].dev, ms, n, 0);
            size_t i = 0;
            while (i < n && memcmp(&hu[i], &hs[i], sizeof(float)) == 0)
                i++;
            ck_assert_msg(i == n, "%s: lane %d state %d float %zu of its slice: %.9g vs %.9g", what, l, k, i,
                          (double)hu[i], (double)hs[i]);
            free(hu);
            free(hs);
        }
    }
}

static void equivalence_of(const char *text, int steps, int opt, int fp16);

static void equivalence(int opt, int fp16) { equivalence_of(NET, STEPS, opt, fp16); }

static void equivalence_of(const char *text, int steps, int opt, int fp16)
{
    uint64_t seed = tu_seed();
    char what[64];
    snprintf(what, sizeof what, "%s %s", clg_optim_name(opt), fp16 ? "fp16" : "fp32");
    clg_model *u = make(text, fp16, 0, opt, seed), *s = make(text, fp16, 1, opt, seed);
    ck_assert(s->dp->shard && !u->dp->shard);
    clg_rng ru, rs;
    clg_rng_seed(&ru, seed, 5);
    clg_rng_seed(&rs, seed, 5);
    int cu = train(u, &ru, steps, NULL), cs = train(s, &rs, steps, NULL);
    ck_assert_int_eq(cu, cs);
    ck_assert_msg(cu >= steps / 2, "%s: clipping active on %d of %d steps only", what, cu, steps);
    same_weights(u, 0, s, 0, what);
    same_weights(s, 0, s, 1, what); /* the gather reached every replica */
    same_state(u, s, what);
    /* optimizer-state bytes per device: the library's account */
    uint64_t full = clg_optim_state_bytes(u->dp->lanes[0].opt);
    ck_assert(full > 0);
    for (int l = 0; l < s->dp->n; l++) {
        clg_dp_mem mem;
        clg_dp_memory(s->dp, l, &mem);
        ck_assert_msg((double)mem.optim <= (1.0 / s->dp->n + 0.05) * (double)full,
                      "%s: lane %d keeps %llu bytes of optimizer state, unsharded %llu", what, l,
                      (unsigned long long)mem.optim, (unsigned long long)full);
        ck_assert(mem.optim > 0 && mem.params > 0 && mem.peak >= mem.params + mem.optim);
    }
    clg_session_free(u);
    clg_session_free(s);
}

START_TEST(sgd_fp32) { if (two_devices()) equivalence(CLG_OPT_SGD, 0); }
END_TEST
START_TEST(adam_fp32) { if (two_devices()) equivalence(CLG_OPT_ADAM, 0); }
END_TEST
START_TEST(adamw_fp32) { if (two_devices()) equivalence(CLG_OPT_ADAMW, 0); }
END_TEST
START_TEST(sgd_fp16) { if (two_devices()) equivalence(CLG_OPT_SGD, 1); }
END_TEST
START_TEST(adam_fp16) { if (two_devices()) equivalence(CLG_OPT_ADAM, 1); }
END_TEST
START_TEST(adamw_fp16) { if (two_devices()) equivalence(CLG_OPT_ADAMW, 1); }
END_TEST
/* The shipped resnet-mini (batch norm, residual adds, projections), batch
 * 16, 5 steps: the running statistics are averaged over the lanes as
 * unsharded (compared too: same_weights covers every parameter). */
START_TEST(resnet_mini_adam)
{
    if (!two_devices())
        return;
    char path[1024];
    snprintf(path, sizeof path, "%s/models/resnet-mini.cfg", CLG_SOURCE_DIR);
    char *text = NULL;
    size_t len = 0;
    clg_err err = {0};
    ck_assert_msg(clg_file_read(&err, path, &text, &len) == CLG_OK, "%s", err.msg);
    char *small = malloc(len + 64), *b = strstr(text, "batch = 128");
    ck_assert(small && b);
    snprintf(small, len + 64, "%.*sbatch = 16%s", (int)(b - text), text, b + strlen("batch = 128"));
    equivalence_of(small, 5, CLG_OPT_ADAM, 0);
    free(small);
    free(text);
}
END_TEST
/* a lane without samples still updates its slice and joins the gather */
START_TEST(sgd_idle_lane)
{
    if (!two_devices())
        return;
    g_split = "1,0";
    equivalence(CLG_OPT_SGD, 0);
    g_split = "even";
}
END_TEST
/* per-tensor updates (option optim_per_tensor) have no arena to slice: refused clearly */
START_TEST(per_tensor_refused)
{
    if (!two_devices())
        return;
    clg_options *o = NULL;
    ck_assert(clg_options_create(&o) == CLG_OK);
    ck_assert(clg_options_set(o, "optim_per_tensor", "1") == CLG_OK);
    clg_ctx_params p;
    clg_ctx_params_init(&p);
    p.options = o;
    clg_ctx *c = NULL;
    ck_assert(clg_ctx_create(&p, &c) == CLG_OK);
    clg_options_destroy(o);
    clg_model *m = NULL;
    ck_assert(make_in(c, NET, "all", 0, 1, CLG_OPT_ADAM, tu_seed(), &m) == CLG_OK);
    ck_assert_int_eq(clg_session_ensure_optim(m), CLG_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(clg_last_error(c), "sharded optimizer state") && strstr(clg_last_error(c), "device 0"),
                  "%s", clg_last_error(c));
    clg_session_free(m);
    clg_ctx_destroy(c);
}
END_TEST
/* the device-to-device reduction's write-back of a shard's part */
START_TEST(adam_device_reduction)
{
    if (!two_devices())
        return;
    g_reduce = "device";
    equivalence(CLG_OPT_ADAM, 0);
    g_reduce = "host";
}
END_TEST

/* Checkpoints keep one format: sharded -> unsharded -> sharded. */
START_TEST(checkpoint_round_trip)
{
    if (!two_devices())
        return;
    uint64_t seed = tu_seed();
    clg_rng r;
    clg_rng_seed(&r, seed, 9);
    clg_model *s = make(NET, 0, 1, CLG_OPT_ADAM, seed);
    train(s, &r, 5, NULL);
    char p1[256], p2[256];
    snprintf(p1, sizeof p1, "test_shard_a_%d.safetensors", (int)getpid());
    snprintf(p2, sizeof p2, "test_shard_b_%d.safetensors", (int)getpid());
    ck_assert_msg(clg_session_save(s, p1, 1, 0) == CLG_OK, "%s", clg_last_error(ctx()));
    clg_model *u = make(NET, 0, 0, CLG_OPT_ADAM, seed + 1);
    ck_assert(clg_session_ensure_optim(u) == CLG_OK);
    ck_assert_msg(clg_session_load(u, p1, 1) == CLG_OK, "%s", clg_last_error(ctx()));
    same_weights(s, 0, u, 0, "resumed unsharded");
    same_weights(s, 0, u, 1, "resumed unsharded, lane 1");
    same_state(u, s, "resumed unsharded");
    ck_assert_msg(clg_session_save(u, p2, 1, 0) == CLG_OK, "%s", clg_last_error(ctx()));
    clg_model *s2 = make(NET, 0, 1, CLG_OPT_ADAM, seed + 2);
    ck_assert(clg_session_ensure_optim(s2) == CLG_OK);
    ck_assert_msg(clg_session_load(s2, p2, 1) == CLG_OK, "%s", clg_last_error(ctx()));
    same_state(u, s2, "resumed sharded");
    /* the same 5 steps on all three */
    clg_rng a, b, c;
    clg_rng_seed(&a, seed, 10);
    clg_rng_seed(&b, seed, 10);
    clg_rng_seed(&c, seed, 10);
    train(s, &a, 5, NULL);
    train(u, &b, 5, NULL);
    train(s2, &c, 5, NULL);
    same_weights(u, 0, s, 0, "continued sharded");
    same_weights(u, 0, s2, 1, "continued resumed sharded");
    same_state(u, s, "continued sharded");
    same_state(u, s2, "continued resumed sharded");
    unlink(p1);
    unlink(p2);
    clg_session_free(s);
    clg_session_free(u);
    clg_session_free(s2);
}
END_TEST

/* Peak of the device account (max over the lanes) after 2 steps; the
 * status of the run (a model refused at creation or in a step). */
static clg_status mlp_peak(clg_ctx *c, const char *devices, int shard, uint64_t seed, double *mib)
{
    clg_model *m = NULL;
    clg_status st = make_in(c, MLP, devices, 0, shard, -1, seed, &m);
    *mib = 0;
    if (st != CLG_OK)
        return st;
    clg_rng r;
    clg_rng_seed(&r, seed, 3);
    train(m, &r, 2, &st);
    for (int l = 0; l < m->dp->n; l++) {
        clg_dp_mem mem;
        clg_dp_memory(m->dp, l, &mem);
        *mib = fmax(*mib, mem.peak / 1048576.0);
        fprintf(stderr, "lane %d: params %.2f optim %.2f act %.2f work %.2f peak %.2f MiB\n", l, mem.params / 1048576.0,
                mem.optim / 1048576.0, mem.activations / 1048576.0, mem.workspace / 1048576.0, mem.peak / 1048576.0);
    }
    clg_session_free(m);
    return st;
}

START_TEST(memory_cap)
{
    if (!two_devices())
        return;
    uint64_t seed = tu_seed();
    double one = 0, two = 0, two_plain = 0;
    ck_assert(mlp_peak(ctx(), "0", 0, seed, &one) == CLG_OK);
    ck_assert(mlp_peak(ctx(), "all", 1, seed, &two) == CLG_OK);
    ck_assert(mlp_peak(ctx(), "all", 0, seed, &two_plain) == CLG_OK);
    fprintf(stderr, "test_shard: MLP peak per device: 1 device %.2f MiB, 2 devices %.2f MiB, 2 sharded %.2f MiB\n",
            one, two_plain, two);
    /* Adam state: 6 MiB on one device, 3 MiB per device sharded */
    ck_assert_msg(two < one - 2.5, "sharded peak %.2f MiB vs %.2f MiB on one device", two, one);
    double cap = (one + two) / 2;
    clg_ctx *c = tu_ctx_fixed(cap);
    double got = 0;
    clg_status st = mlp_peak(c, "0", 0, seed, &got);
    ck_assert_msg(st == CLG_ERR_DEVICE_OOM, "one capped device: status %d (%s)", st, clg_last_error(c));
    const char *msg = clg_last_error(c);
    ck_assert_msg(strstr(msg, "device 0") && strstr(msg, "memory limit of") && strstr(msg, "device_mem_limit"), "%s",
                  msg);
    st = mlp_peak(c, "all", 0, seed, &got);
    ck_assert_msg(st == CLG_ERR_DEVICE_OOM, "two capped devices, unsharded: status %d", st);
    st = mlp_peak(c, "all", 1, seed, &got);
    ck_assert_msg(st == CLG_OK, "two capped devices, sharded: %s", clg_last_error(c));
    ck_assert(got <= cap);
    clg_ctx_destroy(c);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("shard");
    TCase *tc = tcase_create("shard");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, sgd_fp32);
    tcase_add_test(tc, adam_fp32);
    tcase_add_test(tc, adamw_fp32);
    tcase_add_test(tc, sgd_fp16);
    tcase_add_test(tc, adam_fp16);
    tcase_add_test(tc, adamw_fp16);
    tcase_add_test(tc, adam_device_reduction);
    tcase_add_test(tc, sgd_idle_lane);
    tcase_add_test(tc, resnet_mini_adam);
    tcase_add_test(tc, per_tensor_refused);
    tcase_add_test(tc, checkpoint_round_trip);
    tcase_add_test(tc, memory_cap);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int rc = tu_run(suite());
    if (g_ctx)
        clg_ctx_destroy(g_ctx);
    return rc;
}
