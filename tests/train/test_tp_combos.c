/* Tensor parallelism combined (issue #22): fp16 storage under tp=2 and dp=2 x tp=2, against one device with fp16
 * storage running the same global batch; sharded optimizer state (--shard-optimizer) under dp=2 x tp=2 against
 * the unsharded dp=2 x tp=2 run.
 *
 * fp16 tolerance: the lanes run the same half-storage arithmetic as one device except that each split product
 * is two half-length fp32 dot products summed on the host before the one rounding to half (one device: one
 * GEMM, then the rounding; dp x tp also sums the weight gradients of two half batches). The fp32 sums differ in
 * their last bits (delta ~1e-7 relative), and where such a sum lies near the midpoint of two halves the rounding
 * goes the other way: that element moves by half an ulp of half, eps = 2^-11 = 4.9e-4 relative. A fraction
 * ~delta / eps of the elements does, which is an L2 change of sqrt(delta eps) ~ 7e-6 per pass, far more than
 * delta: fp16 storage turns a perturbation delta into sqrt(delta eps), so the step after grows it again, and
 * after some ten steps the two runs differ at the level of fp16 rounding noise itself (1e-4 .. 1e-2 relative, the
 * small biases most). Plain data parallelism with fp16 storage (dp=2 against one device) does the same:
 * measured 6e-9 .. 2.9e-2 over learning rates and seeds, tp=2 and dp=2 x tp=2 1e-7 .. 6e-3. So the test checks
 * one clean step tightly, TOL16_1 = 2e-4 (measured 1e-8 for the MLP, whose reduced outputs hold 8k elements;
 * 3e-5 for the CNN, where conv2's 200k output elements are rounded after the all-reduce and the biases sum the
 * gradients of 25k of them each: a few flipped roundings show there; plain dp=2 measures 1e-7 on the same CNN,
 * its per-sample arithmetic being one device's; a lost all-reduce, a wrong slice or a dropout mask drawn
 * elsewhere is off by 1e-2 or more), and the 20 steps at TOL16 = 5e-2 with the
 * losses within 1% (at LR16 = 0.005; measured 1e-7 and 2e-5 for the MLP under tp=2 and dp=2 x tp=2, 6e-3 for
 * the CNN), where what matters is the loss scaling: the scale is
 * then started at its maximum with a short growth interval, so that many steps overflow (their output gradient
 * is beyond half's range): the steps skipped must be the same steps as on one device (the loss scale equal after
 * every step), and an inf in one lane's gradients alone must skip the step on every lane.
 *
 * Sharded optimizer state: each tp slice's state is split over its dp replicas (the slice's gradient summed over
 * the replicas as unsharded, each replica updating 1/D of the arena, the slices gathered), which is the same
 * arithmetic per element as the unsharded update: weights bitwise equal after 20 steps (SGD with momentum and
 * weight decay, and Adam), and the optimizer state per device <= 1/D + 5% of the unsharded. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/tensor.h"
#include "train_testutil.h"

#define TOL16_1 2e-4
#define TOL16 5e-2
#define STEPS 20
#define BATCH 32
#define LR 0.02
#define LR16 0.005

static clg_ctx *ctx(void) { return tt_ctx(1); }

static clg_status make(const char *text, const char *layout, const char *devices, int fp16, int shard,
                       clg_model **m)
{
    clg_pipe_params pp;
    clg_err *err = &ctx()->err;
    *m = NULL;
    const char *cut = layout && strstr(layout, "pp=") ? "drop1" : NULL; /* not by measured time: the same cut */
    CLG_TRY(clg_session_pipe_params(err, layout, cut, 0, NULL, 0, &pp));
    clg_dp_params dpp = {.pipe = &pp, .shard_optimizer = shard};
    CLG_TRY(clg_session_create(ctx(), devices, 0, text, "t", BATCH, 7, fp16, &dpp, m));
    return CLG_OK;
}

static double g_lr = LR;

/* steps more steps on the data stream rng; per step its loss and the loss scale after it (may be NULL). */
static void train(clg_model *m, clg_rng *rng, int steps, double *loss, double *scale)
{
    tt_train(m, rng, steps, BATCH, g_lr, loss, scale);
}

// ---- fp16 storage ----

static void fp16_vs_one(const char *text, const char *layout, int L)
{
    clg_model *one = NULL, *tp = NULL;
    ck_assert_msg(make(text, NULL, "0", 1, 0, &one) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(make(text, layout, "all", 1, 0, &tp) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert(tp->tp && tp->tp->L == L && tp->tp->fp16 && tp->tp->ln[0].rep->fp16);
    double la[STEPS], lb[STEPS], sa[STEPS], sb[STEPS];
    clg_rng r1, r2;
    clg_rng_seed(&r1, 5, 99);
    clg_rng_seed(&r2, 5, 99);
    g_lr = LR16;
    char msg[160];
    tt_weights wa = {0}, wb = {0};
    train(one, &r1, 1, la, sa); /* one clean step: before rounding differences have compounded */
    train(tp, &r2, 1, lb, sb);
    tt_grab_session(one, &wa);
    tt_grab_session(tp, &wb);
    snprintf(msg, sizeof msg, "fp16 %s vs one device (fp16), 1 step (%s)", layout, tp->net->proto[0].name);
    tt_compare(&wb, &wa, TOL16_1, msg);
    tt_weights_free(&wa);
    tt_weights_free(&wb);
    for (int i = 0; i < 2; i++) { /* many overflows: the largest scale, grown again after 3 clean steps */
        clg_model *m = i ? tp : one;
        m->loss_scale = CLG_LS_MAX;
        m->ls_interval = 3;
    }
    train(one, &r1, STEPS - 1, la + 1, sa + 1);
    train(tp, &r2, STEPS - 1, lb + 1, sb + 1);
    g_lr = LR;
    snprintf(msg, sizeof msg, "fp16 %s vs one device (fp16), %d steps (%s)", layout, STEPS, tp->net->proto[0].name);
    for (int s = 0; s < STEPS; s++)
        ck_assert_msg(sa[s] == sb[s], "%s: loss scale after step %d: %g vs %g (a step skipped on one side only)",
                      msg, s, sb[s], sa[s]);
    ck_assert_int_eq(tp->ls_skipped, one->ls_skipped);
    ck_assert_msg(one->ls_skipped >= 3 && one->ls_skipped <= STEPS - 5, "%lld steps skipped: the test needs a few",
                  (long long)one->ls_skipped);
    fprintf(stderr, "%s: %lld steps skipped on both, final loss scale %g\n", msg, (long long)one->ls_skipped,
            one->loss_scale);
    tt_grab_session(one, &wa);
    tt_grab_session(tp, &wb);
    tt_compare(&wb, &wa, TOL16, msg);
    tt_compare_loss(lb, la, STEPS, 1e-2, msg); /* the skipped steps' too (computed before the overflow check) */
    tt_weights_free(&wa);
    tt_weights_free(&wb);
    clg_session_free(one);
    clg_session_free(tp);
}

START_TEST(fp16_tp2)
{
    fp16_vs_one(tt_mlp_text(0), "tp=2", 2);
    fp16_vs_one(tt_cnn_text, "tp=2", 2); /* convolutions split by channels */
}
END_TEST

/* Lane l's master weights, every parameter one after the other (*n floats). */
static float *lane_masters(const clg_tp *p, int l, size_t *n)
{
    clg_replica *r = p->ln[l].rep;
    size_t total = 0;
    for (int i = 0; i < r->nlayers; i++)
        for (int k = 0; k < r->layers[i].nparams; k++)
            total += r->layers[i].params[k].numel;
    float *v = malloc(total * sizeof(float));
    tu_poison(v, total);
    size_t o = 0;
    for (int i = 0; i < r->nlayers; i++)
        for (int k = 0; k < r->layers[i].nparams; k++) {
            clg_param_ref ref = {&r->layers[i], &r->layers[i].params[k]};
            tu_download(r->dev, clg_replica_master(r, &ref), v + o, ref.param->numel);
            o += ref.param->numel;
        }
    *n = total;
    return v;
}

/* An inf in one lane's gradients alone skips the step on every lane: no lane's weights change, no lane's
 * optimizer steps, the loss scale halves; the next step trains on every lane. */
START_TEST(fp16_one_lane_overflow)
{
    for (int bad = 0; bad < 2; bad++) {
        clg_model *m = NULL;
        ck_assert_msg(make(tt_mlp_text(1), "tp=2", "all", 1, 0, &m) == CLG_OK, "%s", clg_last_error(ctx()));
        clg_rng rng;
        clg_rng_seed(&rng, 5, 99);
        train(m, &rng, 2, NULL, NULL);
        ck_assert_int_eq(m->ls_skipped, 0);
        double scale = m->loss_scale;
        float *before[2];
        size_t n[2];
        int64_t t[2];
        for (int l = 0; l < 2; l++) {
            before[l] = lane_masters(m->tp, l, &n[l]);
            t[l] = m->tp->ln[l].opt->t;
        }
        m->tp->inf_lane = bad;
        m->tp->fault_step = m->step;
        train(m, &rng, 1, NULL, NULL);
        ck_assert_msg(m->ls_skipped == 1 && m->loss_scale == scale / 2, "lane %d's inf: skipped %lld, scale %g", bad,
                      (long long)m->ls_skipped, m->loss_scale);
        for (int l = 0; l < 2; l++) {
            size_t k;
            float *after = lane_masters(m->tp, l, &k);
            ck_assert_msg(k == n[l] && memcmp(after, before[l], k * sizeof(float)) == 0,
                          "lane %d's inf: lane %d's weights changed in the skipped step", bad, l);
            ck_assert_msg(m->tp->ln[l].opt->t == t[l], "lane %d's inf: lane %d's optimizer stepped", bad, l);
            free(after);
        }
        m->tp->inf_lane = -1;
        train(m, &rng, 1, NULL, NULL);
        ck_assert_int_eq(m->ls_skipped, 1);
        for (int l = 0; l < 2; l++) {
            size_t k;
            float *after = lane_masters(m->tp, l, &k);
            ck_assert_msg(memcmp(after, before[l], k * sizeof(float)) != 0, "lane %d did not train after", l);
            ck_assert(m->tp->ln[l].opt->t == t[l] + 1);
            free(after);
            free(before[l]);
        }
        fprintf(stderr, "an inf in lane %d's gradients alone: the step skipped on both lanes, scale %g -> %g\n",
                bad, scale, scale / 2);
        clg_session_free(m);
    }
}
END_TEST

/* A checkpoint written under tp=2 with fp16 storage resumes on one device with fp16 storage: the loss scale and
 * its counters carried, 5 more steps within TOL16 of the tp run that went on. */
START_TEST(fp16_resume)
{
    char path[256];
    snprintf(path, sizeof path, "test_tp_combos_%d.safetensors", (int)getpid());
    clg_model *m = NULL, *n = NULL;
    ck_assert_msg(make(tt_mlp_text(1), "tp=2", "all", 1, 0, &m) == CLG_OK, "%s", clg_last_error(ctx()));
    clg_rng r1;
    clg_rng_seed(&r1, 5, 99);
    train(m, &r1, 8, NULL, NULL);
    m->loss_scale = 8192; /* the counters carried: not the defaults */
    m->ls_skipped = 3;
    m->ls_good = 1;
    ck_assert_msg(clg_session_save(m, path, 1, 100) == CLG_OK, "%s", clg_last_error(ctx()));
    tt_weights w0 = {0};
    tt_grab_session(m, &w0);
    clg_rng r2 = r1;
    double la[5], lb[5], sa[5], sb[5];
    double scale = m->loss_scale;
    int64_t skipped = m->ls_skipped;
    train(m, &r1, 5, la, sa);
    ck_assert_msg(make(tt_mlp_text(1), NULL, "0", 1, 0, &n) == CLG_OK, "%s", clg_last_error(ctx()));
    n->loss_scale = CLG_LS_INIT; /* must come from the checkpoint */
    ck_assert_msg(clg_session_load(n, path, 1) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_int_eq(n->step, 8);
    ck_assert(n->loss_scale == scale && n->ls_skipped == skipped && n->ls_good == 1);
    train(n, &r2, 5, lb, sb);
    for (int s = 0; s < 5; s++)
        ck_assert_msg(sa[s] == sb[s], "loss scale after resumed step %d: %g vs %g", s, sb[s], sa[s]);
    tt_weights wa = {0}, wb = {0};
    tt_grab_session(m, &wa);
    tt_grab_session(n, &wb);
    tt_compare(&wb, &wa, TOL16, "fp16 checkpoint of tp=2 resumed on one device, 5 more steps");
    ck_assert_msg(m->ls_skipped == 3, "a resumed step was skipped");
    double moved = 0; /* the 5 steps trained (the comparison could fail) */
    for (size_t k = 0; k < wa.numel[0]; k++)
        moved += ((double)wa.v[0][k] - w0.v[0][k]) * ((double)wa.v[0][k] - w0.v[0][k]);
    ck_assert_msg(sqrt(moved) > 1e-3, "5 steps moved %s by %g only", wa.name[0], sqrt(moved));
    tt_weights_free(&w0);
    tt_compare_loss(lb, la, 5, 2e-3, "fp16 resume");
    unlink(path);
    tt_weights_free(&wa);
    tt_weights_free(&wb);
    clg_session_free(m);
    clg_session_free(n);
}
END_TEST

// ---- sharded optimizer state ----

/* Every tensor of two checkpoint files bitwise equal (weights and optimizer state); the count of "opt." ones. */
static int same_ckpt(const char *pa, const char *pb, const char *what)
{
    clg_ckpt *a = NULL, *b = NULL;
    ck_assert_msg(clg_ckpt_load(&ctx()->err, pa, &a) == CLG_OK, "%s", ctx()->err.msg);
    ck_assert_msg(clg_ckpt_load(&ctx()->err, pb, &b) == CLG_OK, "%s", ctx()->err.msg);
    ck_assert_int_eq(a->nt, b->nt);
    int nopt = 0;
    for (int i = 0; i < a->nt; i++) {
        const clg_ckpt_tensor *t = &a->t[i], *u = clg_ckpt_find(b, t->name);
        ck_assert_msg(u && u->nbytes == t->nbytes && memcmp(u->data, t->data, t->nbytes) == 0,
                      "%s: checkpoint tensor %s differs", what, t->name);
        nopt += !strncmp(t->name, "opt.", 4);
    }
    clg_ckpt_free(a);
    clg_ckpt_free(b);
    return nopt;
}

/* dp=2 x tp=2 with --shard-optimizer against the unsharded run: bitwise equal weights after 20 steps and
 * checkpoints (weights and the whole optimizer state, gathered from the parts) after 10; the sharded checkpoint
 * resumed sharded goes on bitwise; optimizer state per device <= 1/2 + 5% of the unsharded. */
static int is_sharded(const clg_model *m)
{
    return m->tp ? m->tp->shard : m->pipe ? m->pipe->zero != NULL : -1;
}

static void shard_vs_unsharded(const char *text, const char *layout, int fp16, double clip, const char *what)
{
    char pu[256], ps[256];
    snprintf(pu, sizeof pu, "test_tp_combos_u_%d.safetensors", (int)getpid());
    snprintf(ps, sizeof ps, "test_tp_combos_s_%d.safetensors", (int)getpid());
    clg_model *u = NULL, *sh = NULL, *re = NULL;
    ck_assert_msg(make(text, layout, "all", fp16, 0, &u) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(make(text, layout, "all", fp16, 1, &sh) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert(is_sharded(sh) == 1 && is_sharded(u) == 0);
    u->hp.clip_norm = sh->hp.clip_norm = clip;
    fprintf(stderr, "%s, %s:\n", layout, what);
    clg_rng r1, r2;
    clg_rng_seed(&r1, 5, 99);
    clg_rng_seed(&r2, 5, 99);
    train(u, &r1, STEPS / 2, NULL, NULL);
    train(sh, &r2, STEPS / 2, NULL, NULL);
    for (int l = 0; l < 4; l++) {
        clg_device_memory mu, ms;
        ck_assert(clg_model_memory(u, l, &mu) == CLG_OK && clg_model_memory(sh, l, &ms) == CLG_OK);
        ck_assert_msg(mu.optimizer > 0 && ms.optimizer <= (0.5 + 0.05) * mu.optimizer,
                      "device %d: sharded optimizer state %llu bytes, unsharded %llu", l,
                      (unsigned long long)ms.optimizer, (unsigned long long)mu.optimizer);
        fprintf(stderr, "  device %d: optimizer state %.1f KiB sharded, %.1f KiB unsharded (%.3f)\n", l,
                ms.optimizer / 1024.0, mu.optimizer / 1024.0, (double)ms.optimizer / (double)mu.optimizer);
    }
    ck_assert_msg(clg_session_save(u, pu, 1, 100) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(clg_session_save(sh, ps, 1, 100) == CLG_OK, "%s", clg_last_error(ctx()));
    double tol = clip > 0 ? 1e-6 : -1; /* clipping: the global norm summed in another order (its last bits) */
    if (tol < 0)
        ck_assert_msg(same_ckpt(ps, pu, what) >= 6, "%s: too few optimizer tensors in the checkpoint", what);
    clg_rng r3 = r2;
    ck_assert_msg(make(text, layout, "all", fp16, 1, &re) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(clg_session_load(re, ps, 1) == CLG_OK, "%s", clg_last_error(ctx()));
    re->hp.clip_norm = clip;
    train(u, &r1, STEPS / 2, NULL, NULL);
    train(sh, &r2, STEPS / 2, NULL, NULL);
    train(re, &r3, STEPS / 2, NULL, NULL);
    tt_weights wu = {0}, ws = {0}, wr = {0};
    tt_grab_session(u, &wu);
    tt_grab_session(sh, &ws);
    tt_grab_session(re, &wr);
    char msg[200];
    snprintf(msg, sizeof msg, "%s: sharded %s vs unsharded, %d steps (%s)", what, layout, STEPS,
             tol < 0 ? "bitwise" : "1e-6");
    tt_compare(&ws, &wu, tol, msg);
    snprintf(msg, sizeof msg, "%s: sharded checkpoint resumed sharded, %d more steps", what, STEPS / 2);
    tt_compare(&wr, &ws, tol < 0 ? -1 : 1e-6, msg);
    double moved = 0; /* the steps trained: the weights are not the first ones */
    for (size_t k = 0; k < wu.numel[0]; k++)
        moved += fabs((double)wu.v[0][k]);
    ck_assert(moved > 0);
    unlink(pu);
    unlink(ps);
    tt_weights_free(&wu);
    tt_weights_free(&ws);
    tt_weights_free(&wr);
    clg_session_free(u);
    clg_session_free(sh);
    clg_session_free(re);
}

// ---- four devices ----

START_TEST(fp16_dp2_tp2)
{
    if (!tt_four_devices(ctx(), "fp16_dp2_tp2", "train-tp-combos-4"))
        return;
    fp16_vs_one(tt_mlp_text(0), "dp=2,tp=2", 4);
}
END_TEST

START_TEST(shard_dp2_tp2)
{
    if (!tt_four_devices(ctx(), "shard_dp2_tp2", "train-tp-combos-4"))
        return;
    shard_vs_unsharded(tt_mlp_text(0), "dp=2,tp=2", 0, 0, "sgd");
    shard_vs_unsharded(tt_mlp_text(1), "dp=2,tp=2", 0, 0, "adam");
    shard_vs_unsharded(tt_mlp_text(1), "dp=2,tp=2", 1, 0, "adam, fp16 storage");
    shard_vs_unsharded(tt_mlp_text(0), "dp=2,tp=2", 0, 0.5, "sgd clipped at 0.5");
}
END_TEST

/* The same with a pipeline: dp=2 x pp=2, each stage's state over its two replicas. */
START_TEST(shard_dp2_pp2)
{
    if (!tt_four_devices(ctx(), "shard_dp2_pp2", "train-tp-combos-4"))
        return;
    shard_vs_unsharded(tt_mlp_text(0), "dp=2,pp=2", 0, 0, "sgd");
    shard_vs_unsharded(tt_mlp_text(1), "dp=2,pp=2", 0, 0, "adam");
    shard_vs_unsharded(tt_mlp_text(1), "dp=2,pp=2", 1, 0, "adam, fp16 storage");
    shard_vs_unsharded(tt_mlp_text(0), "dp=2,pp=2", 0, 0.5, "sgd clipped at 0.5");
}
END_TEST

int main(void)
{
    if (!tt_two_devices("test_tp_combos")) /* a probe: tu_ctx_fixed asserts, only inside a test */
        return TU_SKIP;
    Suite *s = suite_create("tp_combos");
    TCase *tc = tcase_create("tp2");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, fp16_tp2);
    tcase_add_test(tc, fp16_one_lane_overflow);
    tcase_add_test(tc, fp16_resume);
    suite_add_tcase(s, tc);
    TCase *t4 = tcase_create("tp4"); /* CK_RUN_CASE=tp4 (test train-tp-combos-4) runs it alone */
    tcase_set_timeout(t4, 240);
    tcase_add_test(t4, fp16_dp2_tp2);
    tcase_add_test(t4, shard_dp2_tp2);
    tcase_add_test(t4, shard_dp2_pp2);
    suite_add_tcase(s, t4);
    return tt_run_suite(s);
}
