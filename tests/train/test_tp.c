/* Tensor parallelism (issue #22 item 3) on two PoCL devices: --parallel
 * tp=2 against one device running the same steps.
 *
 * Models: an MLP 784-256-256-10 written with separate [activation] and
 * [dropout] layers (fc1 column-split, relu and dropout p = 0.25 on each
 * device's half of the features, fc2 row-split, fc3 replicated), trained
 * with SGD (momentum, weight decay) and with Adam; and LeNet-5 as shipped
 * (fc1 and fc2 carry a fused relu, so fc2 is column-split and fc3, linear,
 * row-split; the convolutions and fc1 are replicated).
 *
 * Tolerance: tp=2 computes each split product as two half-length dot
 * products added on the host (fc2's output and, in backward, the gradient of
 * fc1's output), where one device runs one GEMM over the whole length: the
 * same terms summed in another order, ~1e-7 relative per step; everything
 * else is the same arithmetic. Over STEPS = 20 steps that stays near 1e-6
 * (relative L2 per tensor, measured: see the test's output); TOL = 1e-5
 * leaves room for a ReLU or max-pool decision at its threshold, and a
 * dropout mask drawn at another position, a bias added twice, a lost
 * all-reduce or a slice of the wrong rows is off by 1e-2 or more (the mask
 * alone changes the loss by more than 1e-4 in the first step). The loss of
 * every step must agree to 1e-4 relative.
 *
 * Also: replicated layers hold the same bits on both devices and the
 * row-split bias stays zero on device 1 (the lanes need no gradient
 * reduction); a checkpoint written under tp=2 resumes on one device and one
 * written on one device resumes under tp=2 (5 more steps within TOL of the
 * uninterrupted run); refusals with clear messages. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/tensor.h"
#include "train_testutil.h"

#define TOL 1e-5
#define STEPS 20
#define BATCH 32
#define LR 0.02
#define LR_ADAM 0.001
#define CLIP 0.5

static double g_lr = LR; /* the runs' learning rate (Adam's smaller) */
static double g_clip;     /* > 0: the sessions clip the gradient norm to this */
static double g_mem_ratio; /* > 0: each device's parameter (and optimizer) memory at most this x one device's */

static clg_ctx *ctx(void) { return tt_ctx(1); }

static clg_status make(const char *text, const char *layout, const char *devices, clg_model **m)
{
    clg_pipe_params pp;
    clg_err *err = &ctx()->err;
    *m = NULL;
    CLG_TRY(clg_session_pipe_params(err, layout, NULL, 0, NULL, 0, &pp));
    clg_dp_params dpp = {.pipe = &pp};
    return clg_session_create(ctx(), devices, 0, text, "t", BATCH, 7, 0, &dpp, m);
}

/* steps more steps on the data stream rng; loss of each into loss (may be NULL). */
static void train(clg_model *m, clg_rng *rng, int steps, double *loss)
{
    tt_train(m, rng, steps, BATCH, g_lr, loss, NULL);
}

/* Lanes la and lb of a group (lb: not its first): replicated parameters bitwise equal on both, the row-split
 * bias zero on lb. */
static void check_lanes(const clg_tp *p, int la, int lb)
{
    int repl = tt_check_lanes(p->ln[la].rep, p->ln[lb].rep, p->role, 0, p->ln[la].rep->nlayers - 1);
    fprintf(stderr, "  lanes %d and %d: %d replicated tensors bitwise equal\n", la, lb, repl);
}

/* Lanes la and lb hold the same bits in every parameter (the same slice in two data-parallel groups). */
static void check_same(const clg_tp *p, int la, int lb)
{
    clg_replica *a = p->ln[la].rep, *b = p->ln[lb].rep;
    for (int i = 0; i < a->nlayers; i++)
        for (int k = 0; k < a->layers[i].nparams; k++) {
            clg_param *qa = &a->layers[i].params[k], *qb = &b->layers[i].params[k];
            float *ha = malloc(qa->numel * sizeof(float)), *hb = malloc(qa->numel * sizeof(float));
            tu_poison(hb, qa->numel);
            tu_download(a->dev, qa->value, ha, qa->numel);
            tu_download(b->dev, qb->value, hb, qb->numel);
            ck_assert_msg(memcmp(ha, hb, qa->numel * sizeof(float)) == 0, "%s.%s: lanes %d and %d differ",
                          a->layers[i].name, qa->name, la, lb);
            free(ha);
            free(hb);
        }
}

static void tp_vs_one_layout(const char *text, const char *what, int expect_pairs, const char *layout, int T, int D)
{
    clg_model *one = NULL, *tp = NULL;
    ck_assert_msg(make(text, NULL, "0", &one) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(make(text, layout, "all", &tp) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert(tp->tp && tp->tp->T == T && tp->tp->D == D);
    one->hp.clip_norm = tp->hp.clip_norm = g_clip;
    ck_assert_int_eq(tp->tp->npairs, expect_pairs);
    clg_tp_print(tp->tp, stderr);
    double la[STEPS], lb[STEPS];
    clg_rng r1, r2;
    clg_rng_seed(&r1, 5, 99);
    clg_rng_seed(&r2, 5, 99);
    train(one, &r1, STEPS, la);
    train(tp, &r2, STEPS, lb);
    clg_device_memory mem[CLG_TP_MAX]; /* a row per device (before grab makes the first's whole replica again) */
    for (int l = 0; l < T * D; l++) {
        ck_assert(clg_model_memory(tp, l, &mem[l]) == CLG_OK);
        ck_assert_int_eq(mem[l].devices, T * D);
        ck_assert_int_eq(mem[l].device, l);
        ck_assert_msg(mem[l].parameters > 0 && mem[l].optimizer > 0 && mem[l].activations > 0, "row %d", l);
        ck_assert(l == 0 || mem[l].parameters <= mem[0].parameters);
    }
    clg_device_memory m1;
    ck_assert(clg_model_memory(one, 0, &m1) == CLG_OK);
    fprintf(stderr, "  memory: one device params %.3f optimizer %.3f MiB; tp device 0: %.3f %.3f MiB\n",
            m1.parameters / 1048576.0, m1.optimizer / 1048576.0, mem[0].parameters / 1048576.0,
            mem[0].optimizer / 1048576.0);
    for (int l = 0; l < T * D && g_mem_ratio > 0; l++)
        ck_assert_msg(mem[l].parameters <= g_mem_ratio * m1.parameters &&
                          mem[l].optimizer <= g_mem_ratio * m1.optimizer,
                      "device %d: parameters %.3f MiB, optimizer %.3f MiB; one device %.3f, %.3f MiB (limit %.2fx)", l,
                      mem[l].parameters / 1048576.0, mem[l].optimizer / 1048576.0, m1.parameters / 1048576.0,
                      m1.optimizer / 1048576.0, g_mem_ratio);
    ck_assert(clg_model_memory(tp, T * D, &mem[0]) == CLG_ERR_INVALID_ARG);
    tt_weights wa = {0}, wb = {0};
    tt_grab_session(one, &wa);
    tt_grab_session(tp, &wb);
    char msg[160];
    snprintf(msg, sizeof msg, "%s %s vs one device, %d steps", what, layout, STEPS);
    tt_compare(&wb, &wa, TOL, msg);
    tt_compare_loss(lb, la, STEPS, 1e-4, msg);
    for (int d = 0; d < D; d++)
        for (int t = 1; t < T; t++)
            check_lanes(tp->tp, d * T, d * T + t);
    for (int d = 1; d < D; d++) /* every group holds the same bits (each slice's lanes: the same update) */
        for (int t = 0; t < T; t++)
            check_same(tp->tp, t, d * T + t);
    tt_weights_free(&wa);
    tt_weights_free(&wb);
    clg_session_free(one);
    clg_session_free(tp);
}

static void tp_vs_one(const char *text, const char *what, int expect_pairs)
{
    tp_vs_one_layout(text, what, expect_pairs, "tp=2", 2, 1);
}

START_TEST(mlp_sgd)
{
    g_mem_ratio = 0.6; /* fc1 and fc2 halved, fc3 (1%) whole: 0.51 (the device pools, shared with the one-device
                          session of the same context, are not compared) */
    tp_vs_one(tt_mlp_text(0), "mlp 784-256-256-10 (dropout in the split, sgd)", 1);
    g_mem_ratio = 0;
}
END_TEST

START_TEST(mlp_adam)
{
    g_lr = LR_ADAM;
    tp_vs_one(tt_mlp_text(1), "mlp 784-256-256-10 (dropout in the split, adam)", 1);
    g_lr = LR;
}
END_TEST

/* Clipping by the global norm (every slice counted once): tp=2 equals one device clipping at 0.5; clipping is
 * active (one device without it ends 1e-3 or more away). */
START_TEST(clipping)
{
    g_clip = CLIP;
    tp_vs_one(tt_mlp_text(0), "mlp 784-256-256-10 clipped at 0.5", 1);
    g_clip = 0;
    clg_model *a = NULL, *b = NULL;
    ck_assert_msg(make(tt_mlp_text(0), NULL, "0", &a) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(make(tt_mlp_text(0), NULL, "0", &b) == CLG_OK, "%s", clg_last_error(ctx()));
    b->hp.clip_norm = CLIP;
    clg_rng r1, r2;
    clg_rng_seed(&r1, 5, 99);
    clg_rng_seed(&r2, 5, 99);
    train(a, &r1, 3, NULL);
    train(b, &r2, 3, NULL);
    tt_weights wa = {0}, wb = {0};
    tt_grab_session(a, &wa);
    tt_grab_session(b, &wb);
    double moved = tt_rel_l2(wb.v[0], wa.v[0], wa.numel[0]); /* fc1.weight */
    fprintf(stderr, "clipping at %g moves fc1.weight by %.3g (relative) in 3 steps\n", CLIP, moved);
    ck_assert_msg(moved > 1e-3, "clipping at %g changed nothing (%g)", CLIP, moved);
    tt_weights_free(&wa);
    tt_weights_free(&wb);
    clg_session_free(a);
    clg_session_free(b);
}
END_TEST

START_TEST(cnn)
{
    tp_vs_one(tt_cnn_text, "cnn (convolutions split by channels, dropout in the split)", 2);
}
END_TEST

START_TEST(lenet)
{
    char *text = tt_read_model("lenet5.cfg");
    tp_vs_one(text, "lenet5", 1);
    free(text);
}
END_TEST

/* A checkpoint written in layout `a` resumes in layout `b`: 5 more steps equal (within TOL) those of the run
 * that went on in `a`. */
static void resume_across(const char *text, const char *a, const char *da, const char *b, const char *db)
{
    char path[256];
    snprintf(path, sizeof path, "test_tp_%d.safetensors", (int)getpid());
    clg_model *m = NULL, *n = NULL;
    ck_assert_msg(make(text, a, da, &m) == CLG_OK, "%s", clg_last_error(ctx()));
    clg_rng r1;
    clg_rng_seed(&r1, 5, 99);
    train(m, &r1, 5, NULL);
    ck_assert_msg(clg_session_save(m, path, 1, 100) == CLG_OK, "%s", clg_last_error(ctx()));
    clg_rng r2 = r1;
    double la[5], lb[5];
    train(m, &r1, 5, la);
    ck_assert_msg(make(text, b, db, &n) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(clg_session_load(n, path, 1) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_int_eq(n->step, 5);
    train(n, &r2, 5, lb);
    tt_weights wa = {0}, wb = {0};
    tt_grab_session(m, &wa);
    tt_grab_session(n, &wb);
    char msg[160];
    snprintf(msg, sizeof msg, "checkpoint of %s resumed as %s, 5 more steps", a ? a : "one device",
             b ? b : "one device");
    tt_compare(&wb, &wa, TOL, msg);
    tt_compare_loss(lb, la, 5, 1e-4, msg);
    clg_ckpt *ck = NULL; /* the one-device format: whole tensors */
    ck_assert_msg(clg_ckpt_load(&ctx()->err, path, &ck) == CLG_OK, "%s", ctx()->err.msg);
    const clg_ckpt_tensor *t = clg_ckpt_find(ck, "fc1.weight"), *o = clg_ckpt_find(ck, "opt.v.fc2.weight");
    ck_assert_msg(t && t->shape[0] == 256 && t->shape[1] == 784, "fc1.weight missing or not whole");
    ck_assert_msg(o && o->shape[0] == 256 && o->shape[1] == 256, "opt.v.fc2.weight missing or not whole");
    clg_ckpt_free(ck);
    unlink(path);
    tt_weights_free(&wa);
    tt_weights_free(&wb);
    clg_session_free(m);
    clg_session_free(n);
}

START_TEST(checkpoints)
{
    g_lr = LR_ADAM;
    resume_across(tt_mlp_text(1), "tp=2", "all", NULL, "0");
    resume_across(tt_mlp_text(1), NULL, "0", "tp=2", "all");
    g_lr = LR;
}
END_TEST

static void refused(const char *text, const char *layout, const char *devices, clg_status want, const char *msg)
{
    clg_model *m = NULL;
    clg_status st = make(text, layout, devices, &m);
    clg_session_free(m);
    char what[128];
    snprintf(what, sizeof what, "%s on %s", layout, devices);
    tt_refused(ctx(), st, want, what, msg);
}

START_TEST(refusals)
{
    char *lenet = tt_read_model("lenet5.cfg");
    const char *one_dense = "[net]\nchannels = 1\nheight = 4\nwidth = 4\nclasses = 2\n"
                            "[dense]\nname = fc\nunits = 2\n[softmax]\nname = loss\n";
    /* fc2 has a fused relu: the sum of the partial products must come first; nothing else pairs */
    const char *no_pair = "[net]\nchannels = 1\nheight = 4\nwidth = 4\nclasses = 2\n"
                          "[dense]\nunits = 8\nactivation = relu\n[dense]\nunits = 2\nactivation = relu\n"
                          "[softmax]\nname = loss\n";
    const char *odd = "[net]\nchannels = 1\nheight = 4\nwidth = 4\nclasses = 2\n"
                      "[dense]\nname = wide\nunits = 9\n[activation]\ntype = relu\n[dense]\nunits = 2\n"
                      "[softmax]\nname = loss\n";
    refused(one_dense, "tp=2", "all", CLG_ERR_UNSUPPORTED, "has no layer tensor parallelism can split");
    refused(no_pair, "tp=2", "all", CLG_ERR_UNSUPPORTED, "has no layer tensor parallelism can split");
    refused(odd, "tp=2", "all", CLG_ERR_INVALID_ARG, "layer 'wide' (t:6) has 9 outputs, which 2 devices cannot split");
    refused(lenet, "tp=2", "0", CLG_ERR_INVALID_ARG, "tp=2 needs 2 devices, 1 selected");
    refused(lenet, "dp=2,tp=2", "all", CLG_ERR_INVALID_ARG, "dp x tp=2 needs 4 devices, 2 selected");
    refused(lenet, "pp=2,tp=2", "all", CLG_ERR_INVALID_ARG, "pp=2,tp=2 needs 4 devices, 2 selected");
    refused(lenet, "dp=3,tp=3", "all", CLG_ERR_INVALID_ARG, "dp=D with tp=3 takes 1 to 2");
    refused(lenet, "tp=x", "all", CLG_ERR_INVALID_ARG, "tp=T takes a whole number");
    refused(lenet, "tp=0", "all", CLG_ERR_INVALID_ARG, "tp=T takes a whole number");
    clg_model *m = NULL; /* tp=1 is no tensor parallelism */
    ck_assert_msg(make(lenet, "tp=1", "0", &m) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert(!m->tp);
    clg_session_free(m);
    free(lenet);
}
END_TEST

/* A device failing in the middle of a step (after its partial product, before the all-reduce the other waits
 * in): the step ends with a status naming the lane and device, nothing hangs, and the next step trains. */
START_TEST(lane_fault)
{
    for (int lane = 0; lane < 2; lane++) {
        clg_model *m = NULL;
        ck_assert_msg(make(tt_mlp_text(0), "tp=2", "all", &m) == CLG_OK, "%s", clg_last_error(ctx()));
        clg_rng rng;
        clg_rng_seed(&rng, 5, 99);
        train(m, &rng, 1, NULL);
        m->tp->fault_lane = lane;
        m->tp->fault_step = m->step;
        ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
        tt_synth_bands(&rng, m->xhost[0], m->yhost[0], BATCH, 784);
        ck_assert(clg_session_upload(m, 0, BATCH, 1) == CLG_OK);
        ck_assert_int_eq(clg_session_train_step(m, 0, LR, NULL), CLG_ERR_OPENCL);
        char want[64];
        snprintf(want, sizeof want, "tensor-parallel lane %d on device %d (", lane, lane);
        ck_assert_msg(strstr(clg_last_error(ctx()), want) && strstr(clg_last_error(ctx()), "injected fault after fc2"),
                      "%s", clg_last_error(ctx()));
        fprintf(stderr, "lane %d failing: %s\n", lane, clg_last_error(ctx()));
        m->tp->fault_lane = -1;
        double loss[2];
        train(m, &rng, 2, loss);
        ck_assert(isfinite(loss[0]) && isfinite(loss[1]));
        clg_session_free(m);
    }
}
END_TEST

/* Four devices (test train-tp-4): dp=2 x tp=2 and tp=4 against one device; batch norm refused under dp x tp. */
START_TEST(four_devices)
{
    if (!tt_four_devices(ctx(), "four_devices", "train-tp-4"))
        return;
    char *lenet = tt_read_model("lenet5.cfg"), *resnet = tt_read_model("resnet-mini.cfg");
    tp_vs_one_layout(tt_mlp_text(0), "mlp 784-256-256-10 (dropout in the split, sgd)", 1, "dp=2,tp=2", 2, 2);
    tp_vs_one_layout(tt_mlp_text(0), "mlp 784-256-256-10 (dropout in the split, sgd)", 1, "tp=4", 4, 1);
    tp_vs_one_layout(lenet, "lenet5", 1, "dp=2,tp=2", 2, 2);
    refused(resnet, "dp=2,tp=2", "all", CLG_ERR_UNSUPPORTED, "keeps running statistics");
    free(lenet);
    free(resnet);
}
END_TEST

int main(void)
{
    if (!tt_two_devices("test_tp")) /* a probe: tu_ctx_fixed asserts, only inside a test */
        return TU_SKIP;
    Suite *s = suite_create("tp");
    TCase *tc = tcase_create("tp");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, mlp_sgd);
    tcase_add_test(tc, mlp_adam);
    tcase_add_test(tc, lenet);
    tcase_add_test(tc, cnn);
    tcase_add_test(tc, clipping);
    tcase_add_test(tc, checkpoints);
    tcase_add_test(tc, lane_fault);
    suite_add_tcase(s, tc);
    TCase *t4 = tcase_create("tp4"); /* CK_RUN_CASE=tp4 (test train-tp-4) runs it alone */
    tcase_set_timeout(t4, 240);
    tcase_add_test(t4, four_devices);
    suite_add_tcase(s, t4);
    return tt_run_suite(s);
}
