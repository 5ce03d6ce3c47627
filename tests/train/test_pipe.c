/* Pipeline parallelism (issue #22) on two PoCL devices: K = 2 stages with
 * M = 4 micro-batches, both schedules, against one device.
 *
 * References: one device running the same global batch as the same M
 * micro-batches with gradient accumulation: the pipeline's one-stage layout
 * (K = 1, the whole network on one device), itself checked against a
 * session's plain step (K = 1, M = 1: bitwise). Both schedules accumulate
 * the micro-batches in the same order (0 .. M-1) as the one-device run, so
 * the weights after STEPS = 20 steps agree to the bit (measured 0); the
 * tolerance TOL = 1e-5 (relative L2 per tensor, batch-norm running
 * statistics included) only leaves room for kernels that block differently
 * on the two devices. LeNet-5 (no batch norm) is also compared with the
 * plain one-device step over the whole batch: the same gradient summed in
 * another order (~1e-7 per step). That comparison runs STEPS_PLAIN = 5 steps:
 * over 20 steps a ReLU or max-pool decision within rounding of its threshold
 * can flip and the runs drift apart (seen: 2e-3 at learning rate 0.01),
 * which says nothing about the pipeline. resnet-mini (batch norm: per
 * micro-batch statistics, so its plain global-batch step differs by design)
 * is cut after b1_conv2: the residual edge stem_relu -> b1_add crosses the
 * cut beside b1_conv2's output (two tensors carried, one gradient summed
 * from both stages on stage 0).
 *
 * What the tolerance catches: a lost or doubled micro-batch, a wrong scale
 * (1/M or 1/micro-batch), a gradient not carried back over the residual
 * edge, or running statistics advanced twice by the re-run forward are off
 * by 1e-2 or more. The loss sums of every step must agree to 1e-4 relative. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/layers.h"
#include "parallel/pipe.h"
#include "parallel/pipe_cost.h"
#include "parallel/pipe_wdefer.h"
#include "train_testutil.h"

#define TOL 1e-5
#define STEPS 20
#define STEPS_PLAIN 5
#define BATCH 16
#define LR 0.01

static clg_ctx *ctx(void) { return tt_ctx(0); }

static int two_devices(void)
{
    if (clg_device_count(ctx()) < 2) {
        fprintf(stderr, "test_pipe: needs two OpenCL devices (POCL_DEVICES=\"pthread pthread\")\n");
        return 0;
    }
    return 1;
}

/* A run's trainable weights and running statistics in layer order (host). */
typedef struct weights {
    int n, steps;
    int skipped;  /* fp16 sessions: steps skipped for inf / NaN gradients */
    double scale; /* and the loss scale at the end */
    float *v[64];
    size_t numel[64];
    double loss[STEPS];
} weights;

static void weights_free(weights *w)
{
    for (int i = 0; i < w->n; i++)
        free(w->v[i]);
}

static uint64_t g_data = 99; /* run_pipe / run_session: the synthetic data's stream */
static int g_trainable_only; /* grab: only trainable tensors (not batch-norm running statistics) */

static void grab(weights *w, clg_replica *const *reps, const int *stage_of, const clg_net *net)
{
    for (int i = 0; i < net->nlayers; i++) {
        clg_replica *r = reps[stage_of ? stage_of[i] : 0];
        clg_layer *l = &r->layers[i];
        for (int p = 0; p < l->nparams; p++) {
            if (g_trainable_only && !l->params[p].trainable)
                continue;
            ck_assert(w->n < 64);
            size_t n = l->params[p].numel;
            clg_param_ref ref = {l, &l->params[p]}; /* fp16: the fp32 master copy */
            float *h = tt_fetch(r->dev, clg_replica_master(r, &ref), n);
            w->v[w->n] = h;
            w->numel[w->n++] = n;
        }
    }
}

/* STEPS steps of a plain one-device session over BATCH samples. */
static void run_session(const char *text, int steps, weights *w)
{
    clg_model *m = NULL;
    ck_assert_msg(clg_session_create(ctx(), NULL, 0, text, "t", BATCH, 7, 0, NULL, &m) == CLG_OK, "%s",
                  clg_last_error(ctx()));
    clg_rng rng;
    clg_rng_seed(&rng, 5, g_data);
    for (int s = 0; s < steps; s++) {
        ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
        tt_synth_quadrants(&rng, m->xhost[0], m->yhost[0], BATCH, m->net->in_c, m->net->in_h, m->net->in_w);
        ck_assert(clg_session_upload(m, 0, BATCH, 1) == CLG_OK);
        float res[2];
        ck_assert_msg(clg_session_train_step(m, 0, LR, res) == CLG_OK, "%s",
                      clg_last_error(ctx()));
        w->loss[s] = res[0];
    }
    ck_assert(clg_dp_finish(m->dp) == CLG_OK);
    w->steps = steps;
    clg_replica *r = clg_session_rep(m);
    grab(w, &r, NULL, m->net);
    clg_session_free(m);
}

static int g_xfer;     /* CLG_PIPE_XFER_* of the pipelines made */
static int g_fp16;     /* run_pipe: fp16 storage */
static int g_replicas = 1; /* dp=D of the pipelines made */
static int g_recompute;    /* clg_pipe_params.recompute of the pipelines made */
static int g_wdefer = -1;  /* clg_pipe_params.wdefer of the pipelines made (-1 off) */
static int g_nwd;          /* run_pipe: deferred weight gradients over the stages (wdefer on) */
static int g_wlate;        /* clg_pipe_params.wlate of the pipelines made (0: the option, on) */
static int g_nwl;          /* run_pipe: layers whose weight gradients follow the sends, over the stages */

static clg_pipe *make_pipe(clg_net *net, int K, int M, int schedule, const char *cuts)
{
    int devs[4] = {0, 1, 2, 3};
    clg_pipe_params pp = {.stages = K, .cuts = cuts, .micro = M, .schedule = schedule, .transfer = g_xfer,
                          .replicas = g_replicas, .recompute = g_recompute, .whole_layers = 1, .wdefer = g_wdefer,
                          .wlate = g_wlate};
    clg_pipe *p = NULL;
    ck_assert_msg(clg_pipe_create(ctx(), net, devs, K * g_replicas, 7, BATCH, &pp, &p) == CLG_OK, "%s",
                  clg_last_error(ctx()));
    return p;
}

/* Deferred weight gradients: their operand buffers and the accumulated gradients hold NaN before the first step,
 * so a row the backwards do not write or an arena range left out of the accumulation shows; counted in g_nwd. */
static void poison_deferred(clg_pipe *p)
{
    g_nwd = g_nwl = 0;
    for (int s = 0; s < p->L; s++) {
        clg_pipe_stage *st = &p->st[s];
        for (int i = 0; i < st->nwl; i++) { /* late weight gradients: one micro-batch's operands */
            const clg_pipe_wl *w = &st->wl[i];
            size_t in = 0, out = 0;
            int per, inf, un;
            if (clg_dense_dims(&st->rep->layers[w->layer], &per, &inf, &un)) {
                in = (size_t)per * (size_t)inf;
                out = (size_t)per * (size_t)un;
            } else {
                ck_assert(clg_conv_defer_dims(&st->rep->layers[w->layer], &in, &out));
            }
            ck_assert(clg_buf_fill(st->dev, w->x, 0, (size_t)p->mb * in, NAN) == CLG_OK);
            ck_assert(clg_buf_fill(st->dev, w->dz, 0, (size_t)p->mb * out, NAN) == CLG_OK);
        }
        g_nwl += st->nwl;
        size_t rows = (size_t)p->mb * (size_t)p->M;
        for (int i = 0; i < st->nwd; i++) {
            const clg_pipe_wd *w = &st->wd[i];
            ck_assert(clg_buf_fill(st->dev, w->x, 0, rows * w->per * w->in, NAN) == CLG_OK);
            ck_assert(clg_buf_fill(st->dev, w->dz, 0, rows * w->per * w->units, NAN) == CLG_OK);
        }
        if (st->nwd || st->nwl)
            ck_assert(clg_buf_fill(st->dev, st->gacc, 0, st->rep->arena_bytes / sizeof(float), NAN) == CLG_OK);
        g_nwd += st->nwd;
    }
}

/* STEPS pipeline steps on the same data as run_session. */
static void run_pipe(const char *text, int steps, int K, int M, int schedule, const char *cuts, weights *w, int *peak)
{
    clg_err err = {0};
    clg_net *net = NULL;
    ck_assert_msg(clg_net_build(&err, text, "t", BATCH, &net) == CLG_OK, "%s", err.msg);
    net->fp16 = g_fp16;
    clg_pipe *p = make_pipe(net, K, M, schedule, cuts);
    poison_deferred(p);
    size_t sample = (size_t)net->in_c * net->in_h * net->in_w;
    float *x = malloc(BATCH * sample * sizeof(float));
    int32_t *y = malloc(BATCH * sizeof(int32_t));
    clg_rng rng;
    clg_rng_seed(&rng, 5, g_data);
    for (int s = 0; s < steps; s++) {
        tt_synth_quadrants(&rng, x, y, BATCH, net->in_c, net->in_h, net->in_w);
        float res[2];
        ck_assert_msg(clg_pipe_train_step(p, &net->hp, x, y, BATCH, LR, 1.0f / BATCH,
                                          net->hp.clip_norm, 7, (uint32_t)s, res) == CLG_OK,
                      "%s", clg_last_error(ctx()));
        w->loss[s] = res[0];
    }
    clg_replica *reps[CLG_PIPE_MAX_STAGES];
    for (int s = 0; s < K; s++) {
        reps[s] = p->st[s].rep;
        if (peak)
            peak[s] = clg_pipe_peak(p, s);
    }
    grab(w, reps, p->stage_of, net);
    w->steps = steps;
    for (int d = 1; d < p->D; d++) { /* every replica holds the same bits */
        weights o = {0};
        for (int s = 0; s < K; s++)
            reps[s] = p->st[d * K + s].rep;
        grab(&o, reps, p->stage_of, net);
        for (int i = 0; i < w->n; i++)
            ck_assert_msg(memcmp(o.v[i], w->v[i], w->numel[i] * sizeof(float)) == 0,
                          "replica %d differs from replica 0 in tensor %d", d, i);
        weights_free(&o);
    }
    free(x);
    free(y);
    clg_pipe_free(p);
    clg_net_free(net);
}

static double g_t0;

static void compare(const weights *a, const weights *b, const char *what)
{
    ck_assert_int_eq(a->n, b->n);
    ck_assert_int_eq(a->steps, b->steps);
    double worst = 0;
    for (int i = 0; i < a->n; i++) {
        ck_assert(a->numel[i] == b->numel[i]);
        double rel = tt_rel_l2(a->v[i], b->v[i], a->numel[i]);
        if (!(rel <= worst))
            worst = rel;
    }
    fprintf(stderr, "%s: max relative difference %.3g over %d tensors (%.1f s)\n", what, worst, a->n,
            clg_now_sec() - g_t0);
    ck_assert_msg(worst <= TOL, "%s: weights differ by %g (> %g)", what, worst, TOL);
    tt_compare_loss(a->loss, b->loss, a->steps, 1e-4, what);
}

/* pp=2 with both schedules against one device accumulating the same
 * micro-batches (STEPS steps; peaks of micro-batches in flight). */
static void pipeline_vs_accumulated(const char *text, const char *model, const char *cuts)
{
    weights acc = {0};
    run_pipe(text, STEPS, 1, 4, CLG_PIPE_1F1B, NULL, &acc, NULL);
    /* 1F1B with transfers through the host and device to device (PoCL's devices share a context: the receiver
     * reads the transfer buffers in place), GPipe as measured faster; both again re-running forwards from stashed
     * stage inputs (recompute; 1F1B device to device: the gradients in place) */
    static const int sched[5] = {CLG_PIPE_1F1B, CLG_PIPE_1F1B, CLG_PIPE_GPIPE, CLG_PIPE_1F1B, CLG_PIPE_GPIPE};
    static const int xfer[5] = {CLG_PIPE_XFER_HOST, CLG_PIPE_XFER_DEVICE, CLG_PIPE_XFER_AUTO, CLG_PIPE_XFER_DEVICE,
                                CLG_PIPE_XFER_AUTO};
    static const char *const xname[5] = {"through the host", "device to device", "auto",
                                         "device to device, recompute", "auto, recompute"};
    for (int c = 0; c < 5; c++) {
        int sch = sched[c];
        weights w = {0};
        int peak[4];
        char what[192];
        snprintf(what, sizeof what, "%s pp=2 M=4 %s (transfers %s) vs one device, 4 micro-batches accumulated, "
                 "%d steps", model, sch == CLG_PIPE_GPIPE ? "gpipe" : "1f1b", xname[c], STEPS);
        g_xfer = xfer[c];
        g_recompute = c >= 3;
        run_pipe(text, STEPS, 2, 4, sch, cuts, &w, peak);
        g_xfer = CLG_PIPE_XFER_AUTO;
        g_recompute = 0;
        compare(&w, &acc, what);
        fprintf(stderr, "  peak micro-batches in flight: stage 0 %d, stage 1 %d\n", peak[0], peak[1]);
        if (sch == CLG_PIPE_1F1B) { /* at most K - s micro-batches in flight on stage s */
            ck_assert_int_eq(peak[0], 2);
            ck_assert_int_eq(peak[1], 1);
        } else { /* all M */
            ck_assert_int_eq(peak[0], 4);
            ck_assert_int_eq(peak[1], 4);
        }
        weights_free(&w);
    }
    weights_free(&acc);
}

/* The default partition's layer costs and transfer times are the least of this and earlier runs' (the device's
 * tuning database): a lower figure replaces the remembered one, a higher one does not; another micro-batch or
 * network keeps its own; the second stage's measured extra cost is averaged over runs; option
 * pipe_cost_memory=0 leaves the figures as measured and remembers none. */
START_TEST(cost_memory)
{
    clg_ctx *c = ctx();
    clg_device *dev = &c->devs[0];
    if (!c->use_cache) {
        fprintf(stderr, "cost_memory: the cache is off (CLGRAD_CACHE=0): nothing remembered\n");
        return;
    }
    clg_err err = {0};
    clg_net *net = NULL;
    char *text = tt_read_model("lenet5.cfg");
    ck_assert_msg(clg_net_build(&err, text, "t", BATCH, &net) == CLG_OK, "%s", err.msg);
    int L = net->nlayers, mb = 1000 + (int)(clg_now_sec() * 1000) % 100000; /* a key no earlier run used */
    double a[64], b[64], want[64];
    ck_assert(L <= 64);
    for (int i = 0; i < L; i++) {
        a[i] = 1.0 + i;
        b[i] = i % 2 ? 0.5 + i : 2.0 + i; /* odd layers lower */
        want[i] = i % 2 ? 0.5 + i : 1.0 + i;
    }
    clg_pipe_cost_remember(dev, net, mb, 0, a); /* nothing remembered yet: unchanged */
    for (int i = 0; i < L; i++)
        ck_assert_double_eq(a[i], 1.0 + i);
    clg_pipe_cost_remember(dev, net, mb, 0, b);
    for (int i = 0; i < L; i++)
        ck_assert_msg(b[i] == want[i], "layer %d: %g, expected the least %g", i, b[i], want[i]);
    double c2[64], c3[64];
    for (int i = 0; i < L; i++)
        c2[i] = c3[i] = 9.0;
    clg_pipe_cost_remember(dev, net, mb + 1, 0, c2); /* another micro-batch: its own */
    clg_pipe_cost_remember(dev, net, mb, 1, c3);     /* dense weight products left out: its own */
    for (int i = 0; i < L; i++)
        ck_assert(c2[i] == 9.0 && c3[i] == 9.0);
    double t_dev = 3.0, t_host = 1.0;
    clg_pipe_xfer_remember(dev, (size_t)mb, &t_dev, &t_host);
    t_dev = 2.0;
    t_host = 4.0;
    clg_pipe_xfer_remember(dev, (size_t)mb, &t_dev, &t_host);
    ck_assert(t_dev == 2.0 && t_host == 1.0);
    /* the second stage's measured extra cost: none remembered, then the runs' figures averaged (and the last cut) */
    int cut = -1;
    ck_assert(clg_pipe_bias_get(dev, net, mb, 0, &cut) == 0.0);
    clg_pipe_bias_put(dev, net, mb, 0, 2.0, 3 * 65536 + 8);
    ck_assert(clg_pipe_bias_get(dev, net, mb, 0, &cut) == 2.0);
    clg_pipe_bias_put(dev, net, mb, 0, 4.0, 3 * 65536 + 16);
    ck_assert(clg_pipe_bias_get(dev, net, mb, 0, &cut) == 3.0 && cut == 3 * 65536 + 16);
    ck_assert(clg_pipe_bias_get(dev, net, mb, 4, &cut) == 0.0); /* another weight-gradient mode: its own */
    long was = c->opts.pipe_cost_memory;
    c->opts.pipe_cost_memory = 0;
    for (int i = 0; i < L; i++)
        a[i] = 100.0;
    clg_pipe_cost_remember(dev, net, mb, 0, a);
    for (int i = 0; i < L; i++)
        ck_assert(a[i] == 100.0);
    ck_assert(clg_pipe_bias_get(dev, net, mb, 0, &cut) == 0.0);
    c->opts.pipe_cost_memory = was;
    clg_net_free(net);
    free(text);
}
END_TEST

START_TEST(lenet_vs_one_device)
{
    if (!two_devices())
        return;
    g_t0 = clg_now_sec();
    char *text = tt_read_model("lenet5.cfg");
    pipeline_vs_accumulated(text, "lenet5", NULL);
    /* and the plain step over the global batch (no batch norm: the same gradient) */
    weights ref = {0}, w = {0};
    run_session(text, STEPS_PLAIN, &ref);
    run_pipe(text, STEPS_PLAIN, 2, 4, CLG_PIPE_1F1B, NULL, &w, NULL);
    compare(&w, &ref, "lenet5 pp=2 M=4 1f1b vs a plain one-device step");
    weights_free(&ref);
    weights_free(&w);
    free(text);
}
END_TEST

START_TEST(resnet_residual_cut)
{
    if (!two_devices())
        return;
    g_t0 = clg_now_sec();
    char *text = tt_read_model("resnet-mini.cfg");
    weights plain = {0}, one = {0};
    run_session(text, STEPS, &plain);
    run_pipe(text, STEPS, 1, 1, CLG_PIPE_1F1B, NULL, &one, NULL);
    compare(&one, &plain, "resnet-mini pp=1 M=1 vs a plain one-device step");
    weights_free(&plain);
    weights_free(&one);
    pipeline_vs_accumulated(text, "resnet-mini (cut after b1_conv2)", "b1_conv2");
    free(text);
}
END_TEST

/* STEPS_PLAIN steps of a session over BATCH samples (fp16 storage, dynamic
 * loss scaling; pipe: NULL one device, else that pipeline). */
static void run_session_fp16(const char *text, const clg_pipe_params *pipe, int grow, weights *w)
{
    clg_dp_params dpp = {.pipe = pipe};
    clg_model *m = NULL;
    ck_assert_msg(clg_session_create(ctx(), pipe ? "all" : NULL, 0, text, "t", BATCH, 7, 1, pipe ? &dpp : NULL, &m) ==
                      CLG_OK, "%s", clg_last_error(ctx()));
    int steps = grow ? 12 : STEPS_PLAIN;
    if (grow) /* the loss scale doubles after every good step: it overflows within a few steps */
        m->ls_interval = 1;
    clg_rng rng;
    clg_rng_seed(&rng, 5, g_data);
    for (int s = 0; s < steps; s++) {
        ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
        tt_synth_quadrants(&rng, m->xhost[0], m->yhost[0], BATCH, m->net->in_c, m->net->in_h, m->net->in_w);
        ck_assert(clg_session_upload(m, 0, BATCH, 1) == CLG_OK);
        float res[2];
        ck_assert_msg(clg_session_train_step(m, 0, LR, res) == CLG_OK, "%s", clg_last_error(ctx()));
        w->loss[s] = res[0];
    }
    ck_assert(clg_dp_finish(m->dp) == CLG_OK);
    if (!grow)
        ck_assert_msg(m->loss_scale == 4096.0 && m->ls_skipped == 0, "loss scale %g, %d steps skipped",
                      m->loss_scale, (int)m->ls_skipped);
    w->skipped = (int)m->ls_skipped;
    w->scale = m->loss_scale;
    w->steps = steps;
    clg_replica *reps[CLG_PIPE_MAX_STAGES];
    for (int s = 0; m->pipe && s < m->pipe->K; s++)
        reps[s] = m->pipe->st[s].rep;
    if (!m->pipe)
        reps[0] = clg_session_rep(m);
    grab(w, reps, m->pipe ? m->pipe->stage_of : NULL, m->net);
    clg_session_free(m);
}

/* A pp=2 fp16 session against a one-device fp16 session (grow: the loss
 * scale doubled after every good step, so steps overflow and are skipped:
 * the same steps on both, as the same half gradients overflow). */
static void fp16_sessions(const char *text, const clg_pipe_params *pipe, int grow)
{
    weights one = {0}, two = {0};
    run_session_fp16(text, NULL, grow, &one);
    run_session_fp16(text, pipe, grow, &two);
    double worst = 0;
    for (int i = 0; i < one.n; i++) {
        double rel = tt_rel_l2(two.v[i], one.v[i], one.numel[i]);
        if (!(rel <= worst))
            worst = rel;
    }
    fprintf(stderr, "lenet5 fp16 sessions%s, pp=2 M=4 vs one device, %d steps: max relative difference %.3g; "
                    "skipped %d vs %d, loss scale %g vs %g\n", grow ? " (loss scale growing every step)" : "",
            one.steps, worst, two.skipped, one.skipped, two.scale, one.scale);
    ck_assert_msg(two.skipped == one.skipped && two.scale == one.scale, "skipped %d vs %d, scale %g vs %g",
                  two.skipped, one.skipped, two.scale, one.scale);
    ck_assert_msg(!grow || one.skipped > 0, "the growing loss scale never overflowed");
    double tol = grow ? 1e-2 : 1e-4; /* 12 steps: room for a flipped ReLU / max-pool decision (see above) */
    ck_assert_msg(worst <= tol, "fp16 pp=2 vs one device: weights differ by %g", worst);
    for (int s = 0; s < one.steps; s++)
        ck_assert_msg(fabs(one.loss[s] - two.loss[s]) <= tol * fabs(one.loss[s]), "step %d loss %g vs %g", s,
                      two.loss[s], one.loss[s]);
    weights_free(&one);
    weights_free(&two);
}

/* Item 2: fp16 storage with pp=2 (activations and their gradients carried
 * across the cut in half; the optimizer on the fp32 masters; the loss scale
 * unscaled and checked for inf / NaN per stage, an overflow skipping the
 * step on every stage). LeNet-5: (a) pp=2 M=4 (both schedules) against the
 * one-stage layout accumulating the same 4 micro-batches in fp16, STEPS
 * steps: the same arithmetic, so TOL (measured 0) on the fp32 masters; (b)
 * a pp=2 session against a one-device fp16 session over the whole batch,
 * both with dynamic loss scaling (4096), STEPS_PLAIN steps: the summation
 * order of the weight gradients differs (4 micro-batches vs one batch, fp32
 * sums, ~1e-7 per step), and a master weight that moves by that much can
 * round to the neighbouring half for the forward (a step of 2^-11 = 4.9e-4
 * in that one weight, diluted in its tensor's L2 norm), so the tolerance is
 * 1e-4 relative L2 per tensor (measured 3.9e-6; a lost micro-batch, a wrong
 * loss scale or half data read as float are off by 1e-2 or more); the loss
 * sums agree to 1e-4. (c) the same with the loss scale doubled after every
 * good step over 12 steps: both skip the same steps (the same half gradients
 * overflow; measured 2 of 12) and end at the same scale; weights within 1e-2
 * (measured 1.6e-3: over 12 steps a ReLU or max-pool decision within
 * rounding of its threshold can flip, as in the fp32 20-step case above). */
START_TEST(fp16_two_stages)
{
    if (!two_devices())
        return;
    g_t0 = clg_now_sec();
    /* The sessions compare layouts, not convolution algorithms: a measured
     * choice that differs between the one-device batch (16) and the
     * micro-batch (4) shapes (FFT against direct for conv2, as a loaded
     * measurement can pick) rounds some half activations the other way and
     * moved the weights by 5e-3 in 5 steps. The per-device defaults fix the
     * kernels whatever the cache holds. */
    ck_assert(clg_ctx_option_set(ctx(), "conv_auto_measure", "0") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "gemm_auto_measure", "0") == CLG_OK);
    char *text = tt_read_model("lenet5.cfg");
    g_fp16 = 1;
    weights acc = {0};
    run_pipe(text, STEPS, 1, 4, CLG_PIPE_1F1B, NULL, &acc, NULL);
    for (int sch = 0; sch < 2; sch++) {
        weights w = {0};
        char what[160];
        snprintf(what, sizeof what, "lenet5 fp16 pp=2 M=4 %s vs one device fp16, 4 micro-batches accumulated",
                 sch == CLG_PIPE_GPIPE ? "gpipe" : "1f1b");
        run_pipe(text, STEPS, 2, 4, sch, NULL, &w, NULL);
        compare(&w, &acc, what);
        weights_free(&w);
    }
    weights_free(&acc);
    g_fp16 = 0;
    clg_pipe_params pipe = {.stages = 2, .micro = 4, .schedule = CLG_PIPE_1F1B};
    for (int grow = 0; grow < 2; grow++)
        fp16_sessions(text, &pipe, grow);
    free(text);
    ck_assert(clg_ctx_option_set(ctx(), "conv_auto_measure", "1") == CLG_OK);
    ck_assert(clg_ctx_option_set(ctx(), "gemm_auto_measure", "1") == CLG_OK);
}
END_TEST


/* Item 3: evaluation and predict of a pp=2 session run the stages' forwards
 * in order (no whole-network replica is made: the lane stays a stub), and a
 * save runs its forward check that way. resnet-mini cut after b1_conv2 (the
 * residual edge crosses the cut; batch norm on its running statistics)
 * after 3 training steps, on a partial batch of BATCH - 3 = 13 samples
 * (micro-batch chunks of 4, 4, 4, 1) against one device loaded from the
 * pp=2 checkpoint running the same 13 samples at once. Tolerance 1e-5
 * (absolute, on softmax probabilities; relative on the loss sum): the same
 * kernels on the same weights, only the launches' sample counts differ
 * (measured 0). A lost or shifted chunk, a carried tensor not carried, or
 * training-mode batch norm are off by 1e-2 or more. */
START_TEST(forward_stages)
{
    if (!two_devices())
        return;
    char *text = tt_read_model("resnet-mini.cfg");
    clg_pipe_params pipe = {.stages = 2, .cuts = "b1_conv2", .micro = 4, .schedule = CLG_PIPE_1F1B};
    clg_dp_params dpp = {.pipe = &pipe};
    clg_model *m = NULL, *one = NULL;
    ck_assert_msg(clg_session_create(ctx(), "all", 0, text, "t", BATCH, 7, 0, &dpp, &m) == CLG_OK, "%s",
                  clg_last_error(ctx()));
    clg_rng rng;
    clg_rng_seed(&rng, 5, 99);
    for (int s = 0; s < 3; s++) {
        ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
        tt_synth_quadrants(&rng, m->xhost[0], m->yhost[0], BATCH, m->net->in_c, m->net->in_h, m->net->in_w);
        ck_assert(clg_session_upload(m, 0, BATCH, 1) == CLG_OK);
        ck_assert_msg(clg_session_train_step(m, 0, LR, NULL) == CLG_OK, "%s", clg_last_error(ctx()));
    }
    int n = BATCH - 3;
    size_t sample = (size_t)m->net->in_c * m->net->in_h * m->net->in_w;
    const clg_tensor *o = clg_replica_output(clg_session_rep(m));
    size_t ow = (size_t)o->c * o->h * o->w;
    float *x = malloc((size_t)n * sample * sizeof(float)), *pa = malloc((size_t)BATCH * ow * sizeof(float)),
          *pb = malloc((size_t)BATCH * ow * sizeof(float)), *pc = malloc((size_t)BATCH * ow * sizeof(float));
    int32_t y[BATCH];
    tt_synth_quadrants(&rng, x, y, n, m->net->in_c, m->net->in_h, m->net->in_w);
    ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
    memcpy(m->xhost[0], x, (size_t)n * sample * sizeof(float));
    memcpy(m->yhost[0], y, (size_t)n * sizeof(int32_t));
    ck_assert(clg_session_upload(m, 0, n, 1) == CLG_OK);
    tu_poison(pa, (size_t)BATCH * ow);
    tu_poison(pc, (size_t)BATCH * ow);
    float ra[2] = {-1, -1}, rb[2] = {-1, -1};
    ck_assert_msg(clg_session_forward(m, 0, 1, ra, pa) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(clg_session_forward(m, 0, 0, NULL, pc) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(!m->lane_whole, "an evaluation made the whole network on the first device");
    char path[256];
    snprintf(path, sizeof path, "test_pipe_fwd_%d.safetensors", (int)getpid());
    ck_assert_msg(clg_session_save(m, path, 0, 3) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert(!m->lane_whole);
    ck_assert_msg(clg_session_create(ctx(), NULL, 0, text, "t", BATCH, 7, 0, NULL, &one) == CLG_OK, "%s",
                  clg_last_error(ctx()));
    ck_assert_msg(clg_session_load(one, path, 0) == CLG_OK, "%s", clg_last_error(ctx()));
    unlink(path);
    /* ONNX export from the stages (each layer's weights from its stage) = from one device, byte for byte */
    char oa[256], ob[256];
    snprintf(oa, sizeof oa, "test_pipe_fwd_%d_a.onnx", (int)getpid());
    snprintf(ob, sizeof ob, "test_pipe_fwd_%d_b.onnx", (int)getpid());
    clg_status ea = clg_model_export_onnx(m, oa);
    if (ea != CLG_ERR_UNSUPPORTED) { /* built without ONNX support: nothing to compare */
        ck_assert_msg(ea == CLG_OK, "%s", clg_last_error(ctx()));
        ck_assert_msg(!m->lane_whole, "an ONNX export made the whole network on the first device");
        ck_assert_msg(clg_model_export_onnx(one, ob) == CLG_OK, "%s", clg_last_error(ctx()));
        char *ta = NULL, *tb = NULL;
        size_t la = 0, lb = 0;
        clg_err fe = {0};
        ck_assert(clg_file_read(&fe, oa, &ta, &la) == CLG_OK && clg_file_read(&fe, ob, &tb, &lb) == CLG_OK);
        ck_assert_msg(la == lb && memcmp(ta, tb, la) == 0, "ONNX from the stages (%zu bytes) differs from one "
                      "device's (%zu bytes)", la, lb);
        free(ta);
        free(tb);
    }
    unlink(oa);
    unlink(ob);
    memcpy(one->xhost[0], x, (size_t)n * sample * sizeof(float));
    memcpy(one->yhost[0], y, (size_t)n * sizeof(int32_t));
    ck_assert(clg_session_upload(one, 0, n, 1) == CLG_OK);
    ck_assert_msg(clg_session_forward(one, 0, 1, rb, pb) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert(clg_dp_finish(one->dp) == CLG_OK);
    double worst = 0;
    for (size_t k = 0; k < (size_t)n * ow; k++) {
        double d = fabs((double)pa[k] - pb[k]);
        if (!(d <= worst))
            worst = d;
        ck_assert_msg(memcmp(&pa[k], &pc[k], sizeof(float)) == 0, "predict (no labels) differs at %zu", k);
    }
    fprintf(stderr, "resnet-mini pp=2 forward of %d samples vs one device: max |dp| %.3g, loss %.6g vs %.6g, "
                    "correct %g vs %g\n", n, worst, ra[0], rb[0], ra[1], rb[1]);
    ck_assert_msg(worst <= 1e-5, "pp=2 forward differs from one device by %g", worst);
    ck_assert_msg(fabs(ra[0] - rb[0]) <= 1e-5 * fabs(rb[0]) && ra[1] == rb[1], "loss %g vs %g, correct %g vs %g",
                  ra[0], rb[0], ra[1], rb[1]);
    clg_session_free(one);
    clg_session_free(m);
    free(x);
    free(pa);
    free(pb);
    free(pc);
    free(text);
}
END_TEST

/* Four stages (POCL_DEVICES with four devices: test train-pipe-4): cuts
 * after stem_relu, b1_conv1 and b1_bn2, so stem_relu feeds stage 1 (b1_conv1)
 * and, over two cuts, stage 3 (b1_add): its gradient comes back from both and
 * is summed on stage 0. 1F1B holds at most K - s micro-batches on stage s. */
START_TEST(four_stages)
{
    if (!tt_four_devices(ctx(), "four_stages", "train-pipe-4"))
        return;
    g_t0 = clg_now_sec();
    char *text = tt_read_model("resnet-mini.cfg");
    weights acc = {0};
    run_pipe(text, STEPS, 1, 8, CLG_PIPE_1F1B, NULL, &acc, NULL);
    for (int sch = 0; sch < 2; sch++) {
        weights w = {0};
        int peak[4];
        char what[160];
        snprintf(what, sizeof what, "resnet-mini pp=4 M=8 %s vs one device, 8 micro-batches accumulated, %d steps",
                 sch == CLG_PIPE_GPIPE ? "gpipe" : "1f1b", STEPS);
        run_pipe(text, STEPS, 4, 8, sch, "stem_relu,b1_conv1,b1_bn2", &w, peak);
        compare(&w, &acc, what);
        fprintf(stderr, "  peaks: %d %d %d %d\n", peak[0], peak[1], peak[2], peak[3]);
        for (int s = 0; s < 4; s++)
            ck_assert_int_eq(peak[s], sch == CLG_PIPE_GPIPE ? 8 : 4 - s);
        weights_free(&w);
    }
    weights_free(&acc);
    /* dp=2 x pp=2 (each replica half of the batch, in 2 micro-batches of 4): against dp=2 x pp=1 (the same sums:
     * each replica's micro-batches accumulated, then the replicas' sums added per stage in replica order)
     * over STEPS_PLAIN steps, running statistics (averaged over the replicas, weighted by slice) included; and one
     * step against one device accumulating the same 4 micro-batches (another summation order: ~1e-7; running
     * statistics advanced 4 times instead of averaged, not compared). Over more steps the summation order alone
     * moves this model (batch norm over 4 samples) apart: 1e-7 after one step, 1e-3 after five were seen. */
    weights ref = {0}, hyb = {0}, one = {0}, hyb1 = {0};
    g_replicas = 2;
    run_pipe(text, STEPS_PLAIN, 1, 2, CLG_PIPE_1F1B, NULL, &ref, NULL);
    run_pipe(text, STEPS_PLAIN, 2, 2, CLG_PIPE_1F1B, "b1_conv2", &hyb, NULL);
    compare(&hyb, &ref, "resnet-mini dp=2 x pp=2 M=2 1f1b vs dp=2 x pp=1");
    weights hwd = {0}; /* deferred dense weight gradients per replica (its rows of the batch): the same bits */
    g_wdefer = 1;
    run_pipe(text, STEPS_PLAIN, 2, 2, CLG_PIPE_1F1B, "b1_conv2", &hwd, NULL);
    g_wdefer = -1;
    ck_assert_int_gt(g_nwd, 0);
    compare(&hwd, &hyb, "resnet-mini dp=2 x pp=2 M=2 1f1b, weight gradients deferred, vs not deferred");
    for (int i = 0; i < hwd.n; i++)
        ck_assert_msg(memcmp(hwd.v[i], hyb.v[i], hwd.numel[i] * sizeof(float)) == 0, "deferred: tensor %d differs", i);
    weights_free(&hwd);
    g_trainable_only = 1;
    run_pipe(text, 1, 2, 2, CLG_PIPE_GPIPE, "b1_conv2", &hyb1, NULL);
    g_replicas = 1;
    run_pipe(text, 1, 1, 4, CLG_PIPE_1F1B, NULL, &one, NULL);
    g_trainable_only = 0;
    compare(&hyb1, &one, "resnet-mini dp=2 x pp=2 M=2 gpipe vs one device, 4 micro-batches accumulated, 1 step");
    weights_free(&ref);
    weights_free(&hyb);
    weights_free(&one);
    weights_free(&hyb1);
    /* a device of replica 1 failing: the other replica's stages, waiting in the gradient sum, stop too */
    clg_err err = {0};
    clg_net *net = NULL;
    ck_assert(clg_net_build(&err, text, "t", BATCH, &net) == CLG_OK);
    size_t sample = (size_t)net->in_c * net->in_h * net->in_w;
    float *x = calloc(BATCH * sample, sizeof(float));
    int32_t *y = calloc(BATCH, sizeof(int32_t));
    g_replicas = 2;
    clg_pipe *p = make_pipe(net, 2, 2, CLG_PIPE_1F1B, NULL);
    g_replicas = 1;
    p->fault_stage = 3;
    p->fault_mb = 1;
    p->fault_step = 0;
    ck_assert_int_eq(clg_pipe_train_step(p, &net->hp, x, y, BATCH, 0.01, 1.0f / BATCH, 0, 7, 0, NULL), CLG_ERR_OPENCL);
    ck_assert_msg(strstr(clg_last_error(ctx()), "pipeline stage 1 of replica 1 (layers"), "%s", clg_last_error(ctx()));
    ck_assert(clg_pipe_train_step(p, &net->hp, x, y, BATCH, 0.01, 1.0f / BATCH, 0, 7, 1, NULL) == CLG_OK);
    clg_pipe_free(p);
    clg_net_free(net);
    free(x);
    free(y);
    free(text);
}
END_TEST

/* One pipeline of the weight-gradient cases (pp=K, M=4) against acc, one device accumulating: within TOL, and
 * bitwise when `bitwise`. */
static void wgrad_case(const char *text, const weights *acc, int K, int sch, const char *cuts, int bitwise,
                       const char *what)
{
    weights w = {0};
    char name[192];
    snprintf(name, sizeof name, "%s vs one device accumulating, %d steps", what, STEPS_PLAIN);
    run_pipe(text, STEPS_PLAIN, K, 4, sch, cuts, &w, NULL);
    compare(&w, acc, name);
    for (int i = 0; i < w.n && bitwise; i++)
        ck_assert_msg(memcmp(w.v[i], acc->v[i], w.numel[i] * sizeof(float)) == 0, "%s: tensor %d differs", name, i);
    weights_free(&w);
}

/* Deferred weight gradients (clg_pipe_params.wdefer): each dense layer's weight gradient computed after the
 * stage's schedule from operands kept per micro-batch, the rest of the arena accumulated per micro-batch. LeNet-5
 * (fc1, fc2, fc3) on fresh random data against one device accumulating the same micro-batches without deferral,
 * STEPS_PLAIN steps. wdefer 1 (products per micro-batch added in order by the GEMM epilogue) must give the same
 * bits (cut after fc1: a deferred layer on each stage; a difference means a wrong row, range or order); wdefer 2
 * (one product over the step's samples: another summation order, measured ~1e-7) within TOL. A lost or doubled
 * micro-batch's rows or an arena range left out of the accumulation is >= 1e-2 off, and the poisoned buffers
 * (NaN) make any unwritten row show. Both schedules; GPipe with re-run forwards; one device deferring too;
 * micro-batches of unequal size. */
START_TEST(deferred_wgrad)
{
    if (!two_devices())
        return;
    g_t0 = clg_now_sec();
    g_data = (uint64_t)time(NULL);
    char *text = tt_read_model("lenet5.cfg");
    weights acc = {0};
    run_pipe(text, STEPS_PLAIN, 1, 4, CLG_PIPE_1F1B, NULL, &acc, NULL);
    ck_assert_int_eq(g_nwd, 0);
    static const struct { int K, sch, recompute, wdefer; const char *cuts, *what; } c[4] = {
        {2, CLG_PIPE_1F1B, 0, 1, "fc1", "lenet5 pp=2 M=4 1f1b, cut after fc1, wdefer 1"},
        {2, CLG_PIPE_GPIPE, 1, 1, NULL, "lenet5 pp=2 M=4 gpipe recompute, measured partition, wdefer 1"},
        {2, CLG_PIPE_1F1B, 0, 2, "fc1", "lenet5 pp=2 M=4 1f1b, cut after fc1, wdefer 2 (one product)"},
        {1, CLG_PIPE_1F1B, 0, 2, NULL, "lenet5 pp=1 M=4, wdefer 2"},
    };
    for (int k = 0; k < 4; k++) {
        g_recompute = c[k].recompute;
        g_wdefer = c[k].wdefer;
        wgrad_case(text, &acc, c[k].K, c[k].sch, c[k].cuts, c[k].wdefer == 1, c[k].what);
        ck_assert_int_eq(g_nwd, 3);
    }
    /* micro-batches of unequal size (16 samples in 3: rows 0, 6, 11) */
    weights acc3 = {0}, w3 = {0};
    g_wdefer = -1;
    g_recompute = 0;
    run_pipe(text, STEPS_PLAIN, 1, 3, CLG_PIPE_1F1B, NULL, &acc3, NULL);
    g_wdefer = 1;
    run_pipe(text, STEPS_PLAIN, 2, 3, CLG_PIPE_1F1B, "fc1", &w3, NULL);
    compare(&w3, &acc3, "lenet5 pp=2 M=3 (6, 5, 5 samples) 1f1b, wdefer 1, vs one device accumulating");
    for (int i = 0; i < w3.n; i++)
        ck_assert_msg(memcmp(w3.v[i], acc3.v[i], w3.numel[i] * sizeof(float)) == 0, "M=3: tensor %d differs", i);
    weights_free(&acc3);
    weights_free(&w3);
    g_wdefer = -1;
    g_data = 99;
    weights_free(&acc);
    free(text);
}
END_TEST

/* Weight gradients after the sends (wlate): a stage that sends gradients back computes its input gradients, sends
 * them, then its layers' weight gradients from kept operands with the backward's kernels: the same bits as one
 * device accumulating (LeNet-5 cut after pool1: conv2 and three dense layers on the second stage), fresh random
 * data, the kept operands poisoned with NaN first; both schedules, with re-run forwards, with the dense layers
 * deferred to the step's end (wdefer 1: conv2 alone late), and off. A gradient taken from another micro-batch's
 * operands or a stale one is >= 1e-3 off. */
START_TEST(late_wgrad)
{
    if (!two_devices())
        return;
    g_t0 = clg_now_sec();
    g_data = (uint64_t)time(NULL) ^ 0x5a5a;
    char *text = tt_read_model("lenet5.cfg");
    weights acc = {0};
    g_wdefer = -1;
    run_pipe(text, STEPS_PLAIN, 1, 4, CLG_PIPE_1F1B, NULL, &acc, NULL);
    ck_assert_int_eq(g_nwl, 0); /* one stage sends nothing */
    static const struct { int sch, recompute, wdefer, wlate, nwl; const char *what; } c[4] = {
        {CLG_PIPE_1F1B, 0, -1, 1, 4, "lenet5 pp=2 M=4 1f1b, cut after pool1, wlate"},
        {CLG_PIPE_GPIPE, 1, -1, 1, 4, "lenet5 pp=2 M=4 gpipe recompute, cut after pool1, wlate"},
        {CLG_PIPE_1F1B, 0, 1, 1, 1, "lenet5 pp=2 M=4 1f1b, cut after pool1, wlate + wdefer 1"},
        {CLG_PIPE_1F1B, 0, -1, -1, 0, "lenet5 pp=2 M=4 1f1b, cut after pool1, wlate off"},
    };
    for (int k = 0; k < 4; k++) {
        g_recompute = c[k].recompute;
        g_wdefer = c[k].wdefer;
        g_wlate = c[k].wlate;
        wgrad_case(text, &acc, 2, c[k].sch, "pool1", 1, c[k].what);
        ck_assert_int_eq(g_nwl, c[k].nwl);
    }
    g_wdefer = -1;
    g_wlate = 0;
    g_recompute = 0;
    g_data = 99;
    weights_free(&acc);
    free(text);
}
END_TEST

static clg_status try_pipe(const char *text, int K, int ndev, int M, const char *cuts)
{
    clg_err err = {0};
    clg_net *net = NULL;
    ck_assert(clg_net_build(&err, text, "t", BATCH, &net) == CLG_OK);
    int devs[2] = {0, 1};
    clg_pipe_params pp = {.stages = K, .cuts = cuts, .micro = M, .schedule = CLG_PIPE_1F1B};
    clg_pipe *p = NULL;
    clg_status st = clg_pipe_create(ctx(), net, devs, ndev, 7, BATCH, &pp, &p);
    clg_pipe_free(p);
    clg_net_free(net);
    return st;
}

START_TEST(bad_layouts)
{
    const char *tiny = "[net]\nchannels = 1\nheight = 4\nwidth = 4\nclasses = 2\n"
                       "[dense]\nname = fc\nunits = 2\n[softmax]\nname = loss\n";
    char *text = tt_read_model("lenet5.cfg");
    ck_assert_int_eq(try_pipe(tiny, 3, 3, 2, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_msg(strstr(clg_last_error(ctx()), "3 stages but t has only 2 layers"), "%s", clg_last_error(ctx()));
    ck_assert_int_eq(try_pipe(text, 2, 1, 4, NULL), CLG_ERR_INVALID_ARG);
    ck_assert_msg(strstr(clg_last_error(ctx()), "needs 2 devices, 1 selected"), "%s", clg_last_error(ctx()));
    ck_assert_int_eq(try_pipe(text, 2, 2, 4, "conv9"), CLG_ERR_NOT_FOUND);
    ck_assert_msg(strstr(clg_last_error(ctx()), "'conv9' is not a layer"), "%s", clg_last_error(ctx()));
    ck_assert_int_eq(try_pipe(text, 2, 2, 4, "conv2,fc1"), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(try_pipe(text, 2, 2, 4, "loss"), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(try_pipe(text, 2, 2, 64, NULL), CLG_ERR_INVALID_ARG);
    clg_err err = {0};
    int K = 0, D = 0;
    ck_assert_int_eq(clg_pipe_parse_layout(&err, "pp=2", &K, &D), CLG_OK);
    ck_assert_int_eq(K, 2);
    ck_assert_int_eq(D, 1);
    ck_assert_int_eq(clg_pipe_parse_layout(&err, "dp=1,pp=3", &K, &D), CLG_OK);
    ck_assert_int_eq(K, 3);
    ck_assert_int_eq(clg_pipe_parse_layout(&err, "dp=2,pp=2", &K, &D), CLG_OK);
    ck_assert_int_eq(K * 10 + D, 22);
    ck_assert_int_eq(clg_pipe_parse_layout(&err, "dp=2,pp=2", &K, NULL), CLG_ERR_UNSUPPORTED);
    ck_assert_int_eq(clg_pipe_parse_layout(&err, "dp=2", &K, &D), CLG_ERR_UNSUPPORTED);
    ck_assert_int_eq(clg_pipe_parse_layout(&err, "tp=2", &K, &D), CLG_ERR_UNSUPPORTED);
    ck_assert_int_eq(clg_pipe_parse_layout(&err, "pp=x", &K, &D), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(clg_pipe_parse_layout(&err, "pq=2", &K, &D), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(clg_pipe_parse_layout(&err, "dp=4,pp=8", &K, &D), CLG_ERR_INVALID_ARG);
    free(text);
}
END_TEST

/* A stage's device failing in the middle of a step: the step ends (no
 * stage waits forever for the failed one's activations or gradients) with
 * a status naming the stage and the device. */
START_TEST(stage_fault)
{
    if (!two_devices())
        return;
    char *text = tt_read_model("lenet5.cfg");
    clg_err err = {0};
    clg_net *net = NULL;
    ck_assert(clg_net_build(&err, text, "t", BATCH, &net) == CLG_OK);
    size_t sample = (size_t)net->in_c * net->in_h * net->in_w;
    float *x = calloc(BATCH * sample, sizeof(float));
    int32_t *y = calloc(BATCH, sizeof(int32_t));
    /* micro-batch 1, or the last on stage 0: stage 1's schedule has ended by then, and its update (in the step's
     * job without clipping) must not run: no weight changes in a failed step */
    for (int sch = 0; sch < 2; sch++)
        for (int fs = 0; fs < 3; fs++) {
            clg_pipe *p = make_pipe(net, 2, 4, sch, NULL);
            ck_assert(clg_pipe_train_step(p, &net->hp, x, y, BATCH, 0.01, 1.0f / BATCH, 0, 7, 0, NULL) == CLG_OK);
            clg_replica *reps[2] = {p->st[0].rep, p->st[1].rep};
            weights before = {0}, after = {0};
            grab(&before, reps, p->stage_of, net);
            p->fault_stage = fs % 2;
            p->fault_mb = fs < 2 ? 1 : 3;
            p->fault_step = 1;
            double t0 = clg_now_sec();
            clg_status st = clg_pipe_train_step(p, &net->hp, x, y, BATCH, 0.01, 1.0f / BATCH, 0, 7, 1, NULL);
            ck_assert_int_eq(st, CLG_ERR_OPENCL);
            const char *msg = clg_last_error(ctx());
            char want[64];
            snprintf(want, sizeof want, "pipeline stage %d (layers", fs % 2);
            ck_assert_msg(strstr(msg, want) && strstr(msg, "on device") && strstr(msg, "injected fault"), "%s", msg);
            ck_assert(clg_now_sec() - t0 < 30);
            grab(&after, reps, p->stage_of, net);
            for (int i = 0; i < before.n; i++)
                ck_assert_msg(memcmp(before.v[i], after.v[i], before.numel[i] * sizeof(float)) == 0,
                              "a failed step (fault on stage %d, micro-batch %d) changed tensor %d", fs % 2,
                              p->fault_mb, i);
            weights_free(&before);
            weights_free(&after);
            /* the pipeline steps again afterwards */
            ck_assert(clg_pipe_train_step(p, &net->hp, x, y, BATCH, 0.01, 1.0f / BATCH, 0, 7, 2, NULL) == CLG_OK);
            clg_pipe_free(p);
        }
    free(x);
    free(y);
    clg_net_free(net);
    free(text);
}
END_TEST

// ---- memory (issue #22 item 6) ----

#define MEM_BATCH 32

/* `steps` steps of VGG-S at MEM_BATCH on one device (pp 1) or as a 2-stage
 * pipeline of 4 micro-batches (pp 2), Adam when adam; *mib: the largest
 * device peak of the model's memory table (clg_model_memory, a row per
 * stage), rows checked; ckpt (may be NULL): a checkpoint written after the
 * steps, then one more step (the whole-network replica it needs is freed
 * again: the peak of that step is checked against the training peak). The
 * status of the run: a refusal at creation or in a step. */
static clg_status vgg_peak(clg_ctx *c, int pp, int adam, int steps, const char *ckpt, double *mib)
{
    char *text = tt_read_model("vgg-s.cfg");
    clg_pipe_params pipe = {.stages = 2, .micro = 4, .schedule = CLG_PIPE_1F1B, .whole_layers = 1};
    clg_dp_params dpp = {.pipe = pp == 2 ? &pipe : NULL};
    clg_model *m = NULL;
    *mib = 0;
    clg_status st = clg_session_create(c, pp == 2 ? "all" : "0", 0, text, "t", MEM_BATCH, 7, 0, &dpp, &m);
    free(text);
    if (st != CLG_OK)
        return st;
    if (adam)
        m->hp.optimizer = CLG_OPT_ADAM;
    clg_rng rng;
    clg_rng_seed(&rng, 5, 99);
    for (int s = 0; s < steps && st == CLG_OK; s++) {
        st = clg_session_stage_wait(m, 0);
        tt_synth_quadrants(&rng, m->xhost[0], m->yhost[0], MEM_BATCH, m->net->in_c, m->net->in_h, m->net->in_w);
        if (st == CLG_OK)
            st = clg_session_upload(m, 0, MEM_BATCH, 1);
        if (st == CLG_OK)
            st = clg_session_train_step(m, 0, LR, NULL);
    }
    clg_device_memory r[3];
    for (int i = 0; i < pp && st == CLG_OK; i++) {
        ck_assert(clg_model_memory(m, i, &r[i]) == CLG_OK);
        ck_assert_int_eq(r[i].devices, pp);
        ck_assert_int_eq(r[i].device, i);
        ck_assert_msg(r[i].parameters > 0 && r[i].optimizer > 0 && r[i].activations > 0, "row %d", i);
        fprintf(stderr, "vgg-s pp=%d %s device %d: params %.2f optim %.2f act %.2f work %.2f peak %.2f MiB\n", pp,
                adam ? "adam" : "sgd", i, r[i].parameters / 1048576.0, r[i].optimizer / 1048576.0,
                r[i].activations / 1048576.0, r[i].workspace / 1048576.0, r[i].peak / 1048576.0);
        *mib = fmax(*mib, r[i].peak / 1048576.0);
    }
    if (st == CLG_OK)
        ck_assert(clg_model_memory(m, pp, &r[2]) == CLG_ERR_INVALID_ARG);
    if (st == CLG_OK && ckpt) { /* written and read straight from the stages: no device memory more */
        float res[2] = {0, 0}; /* and an evaluation (item 3): the stages' forwards, no whole network */
        ck_assert_msg(clg_session_forward(m, 0, 1, res, NULL) == CLG_OK, "%s", clg_last_error(c));
        ck_assert(isfinite(res[0]) && res[0] > 0);
        ck_assert_msg(clg_session_save(m, ckpt, 1, steps) == CLG_OK, "%s", clg_last_error(c));
        /* and read back straight into the stages (a resume), again without the whole network */
        ck_assert_msg(clg_session_load(m, ckpt, 1) == CLG_OK, "%s", clg_last_error(c));
        for (int i = 0; i < pp; i++) {
            clg_device_memory a;
            ck_assert(clg_model_memory(m, i, &a) == CLG_OK);
            ck_assert_msg(a.parameters == r[i].parameters && a.optimizer == r[i].optimizer &&
                              a.activations == r[i].activations && a.peak == r[i].peak,
                          "after an evaluation and a checkpoint, device %d: params %.2f -> %.2f MiB, optimizer %.2f -> %.2f MiB, "
                          "peak %.2f -> %.2f MiB",
                          i, r[i].parameters / 1048576.0, a.parameters / 1048576.0, r[i].optimizer / 1048576.0,
                          a.optimizer / 1048576.0, r[i].peak / 1048576.0, a.peak / 1048576.0);
        }
        clg_ckpt *ck = NULL; /* the one-device format: every tensor, Adam's two moments */
        ck_assert_msg(clg_ckpt_load(&c->err, ckpt, &ck) == CLG_OK, "%s", c->err.msg);
        ck_assert(clg_ckpt_get_meta(ck, "optimizer.t") != NULL);
        ck_assert_msg(clg_ckpt_find(ck, "fc1.weight") && clg_ckpt_find(ck, "conv1.weight") &&
                          clg_ckpt_find(ck, "opt.m.fc1.weight") && (!adam || clg_ckpt_find(ck, "opt.v.conv1.bias")),
                      "tensors missing from %s", ckpt);
        clg_ckpt_free(ck);
    }
    clg_session_free(m);
    return st;
}

/* Item 6: with pp=2 each device's peak is at most 0.6x the one-device peak
 * (VGG-S, batch 32: the first stage's device holds no whole-network
 * replica while training); a checkpoint's whole network is freed again. */
START_TEST(memory_per_stage)
{
    clg_ctx *c = tu_ctx_fixed(0);
    double one = 0, two = 0;
    ck_assert(vgg_peak(c, 1, 0, 2, NULL, &one) == CLG_OK);
    char path[256];
    snprintf(path, sizeof path, "test_pipe_mem_%d.safetensors", (int)getpid());
    ck_assert(vgg_peak(c, 2, 0, 2, path, &two) == CLG_OK);
    unlink(path);
    fprintf(stderr, "test_pipe: VGG-S batch %d peak per device: 1 device %.2f MiB, pp=2 %.2f MiB (%.2fx)\n",
            MEM_BATCH, one, two, two / one);
    ck_assert_msg(two <= 0.6 * one, "pp=2 peak %.2f MiB > 0.6 x %.2f MiB", two, one);
    clg_ctx_destroy(c);
}
END_TEST

/* Item 6: Adam training refused on one device capped between the pp=2 and
 * the one-device peaks trains as a 2-stage pipeline on two devices capped
 * the same. */
START_TEST(memory_cap_pipe)
{
    clg_ctx *c = tu_ctx_fixed(0);
    double one = 0, two = 0;
    ck_assert(vgg_peak(c, 1, 1, 2, NULL, &one) == CLG_OK);
    ck_assert(vgg_peak(c, 2, 1, 2, NULL, &two) == CLG_OK);
    clg_ctx_destroy(c);
    fprintf(stderr, "test_pipe: VGG-S Adam peak per device: 1 device %.2f MiB, pp=2 %.2f MiB\n", one, two);
    ck_assert(two < one - 2);
    double cap = (one + two) / 2, got = 0;
    c = tu_ctx_fixed(cap);
    clg_status st = vgg_peak(c, 1, 1, 2, NULL, &got);
    ck_assert_msg(st == CLG_ERR_DEVICE_OOM, "one capped device: status %d (%s)", st, clg_last_error(c));
    const char *msg = clg_last_error(c);
    ck_assert_msg(strstr(msg, "device 0") && strstr(msg, "memory limit of"), "%s", msg);
    char path[256]; /* a checkpoint too: from the stages, under the cap */
    snprintf(path, sizeof path, "test_pipe_cap_%d.safetensors", (int)getpid());
    st = vgg_peak(c, 2, 1, 2, path, &got);
    unlink(path);
    ck_assert_msg(st == CLG_OK, "two capped devices, pp=2: %s", clg_last_error(c));
    ck_assert(got <= cap);
    clg_ctx_destroy(c);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("pipe");
    TCase *tc = tcase_create("pipe");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, bad_layouts);
    tcase_add_test(tc, cost_memory);
    tcase_add_test(tc, lenet_vs_one_device);
    tcase_add_test(tc, resnet_residual_cut);
    tcase_add_test(tc, stage_fault);
    tcase_add_test(tc, forward_stages);
    tcase_add_test(tc, fp16_two_stages);
    suite_add_tcase(s, tc);
    TCase *tw = tcase_create("pipedefer"); /* CK_RUN_CASE=pipedefer runs it alone */
    tcase_set_timeout(tw, 120);
    tcase_add_test(tw, deferred_wgrad);
    tcase_add_test(tw, late_wgrad);
    suite_add_tcase(s, tw);
    TCase *tm = tcase_create("pipemem"); /* CK_RUN_CASE=pipemem runs it alone */
    tcase_set_timeout(tm, 240);
    tcase_add_test(tm, memory_per_stage);
    tcase_add_test(tm, memory_cap_pipe);
    suite_add_tcase(s, tm);
    TCase *t4 = tcase_create("pipe4"); /* CK_RUN_CASE=pipe4 (test train-pipe-4) runs it alone */
    tcase_set_timeout(t4, 120);
    tcase_add_test(t4, four_stages);
    suite_add_tcase(s, t4);
    return s;
}

int main(void)
{
    if (!tt_two_devices("test_pipe"))
        return TU_SKIP;
    return tt_run_suite(suite());
}
