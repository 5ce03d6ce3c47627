/* A small GPT (tests/train/gpt-tiny.cfg: gpt-mini's architecture and recipe
 * with 2 blocks, width 32, 2 heads, context 32: embedding, learned
 * positions, layer norms, causal attention, GELU MLP, a head tied to the
 * embedding, token loss) on 1 vs 2 devices and in fp16 storage (issue 23
 * item 7).
 *
 * 1 vs 2 devices, each step from the same state (the 1-device model's
 * weights and AdamW moments through a checkpoint, as tests/train/test_dp.c
 * does for CNNs), both attention algorithms (fused, gemm): the runs differ
 * only in the order the per-position gradient contributions are summed (one
 * device sums N*T rows in its GEMMs and the embedding's scatter-add, two sum
 * their halves and the reduction adds them): ~1e-7 relative in the
 * gradients. Nothing in the model has a threshold (GELU, layer norm and
 * softmax are smooth; no ReLU, max-pool or dropout), so no step may differ
 * by a whole contribution: every step must agree within TOL = 1e-4 (relative
 * L2 of each tensor after the step) and the global loss sum within 1e-5
 * relative. Most tensors agree to ~1e-7; AdamW divides each element's step
 * by its own gradient's magnitude, so an element whose gradient is a
 * near-cancelling sum (small against AdamW's epsilon 1e-8 plus its terms'
 * rounding) takes a step that rounding moves by a fraction of lr: up to
 * 1.0e-5 seen over 6 seeds (pos.weight, step 0). A lost or doubled half (wrong 1/local
 * batch, targets of the wrong lane, a position table indexed by the lane's
 * sample) is off by 1e-3 or more: the `broken` test checks that the
 * comparison sees a wrong gradient scale.
 *
 * fp16 storage: the same model with --precision fp16 trains on a learnable
 * pattern: every loss finite, the loss falls (mean of the last 5 of 40
 * steps below 0.75x the first step's: ln 256 = 5.55 -> ~4 measured); the
 * first step's loss within 1e-3 and the last 5 steps' within 1% of the fp32
 * run from the same seed and batches (fp16 activations round at ~5e-4
 * relative; <= 6e-4 relative apart measured over 5 seeds), but not equal on every
 * step (the half storage is in effect). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "train/session.h"

#define TOL 1e-4
#define TOL_QKV_BIAS 1e-3 /* the attention's qkv_bias, see max_rel_diff */
#define STEPS 8

static clg_ctx *g_ctx;

static clg_ctx *ctx(void)
{
    if (!g_ctx)
        g_ctx = tu_ctx(NULL);
    return g_ctx;
}

/* gpt-tiny.cfg with `algo = auto` replaced by algo */
static char *model_text(const char *algo)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/train/gpt-tiny.cfg", CLG_SOURCE_DIR);
    char *text = NULL;
    size_t len = 0;
    clg_err err = {0};
    ck_assert_msg(clg_file_read(&err, path, &text, &len) == CLG_OK, "%s", err.msg);
    char *out = malloc(len + 64 * 8);
    ck_assert(out);
    out[0] = 0;
    const char *p = text, *q;
    while ((q = strstr(p, "algo = auto"))) {
        strncat(out, p, (size_t)(q - p));
        strcat(out, "algo = ");
        strcat(out, algo);
        p = q + strlen("algo = auto");
    }
    strcat(out, p);
    free(text);
    return out;
}

static clg_model *make(const char *text, const char *devices, int fp16, uint64_t seed)
{
    clg_dp_params dpp = {.split = devices[0] == '0' && devices[1] == ',' ? "even" : NULL, .bucket_mb = 0.004};
    clg_model *m = NULL;
    ck_assert_msg(clg_session_create(ctx(), devices, 0, text, "gpt-tiny.cfg", 0, seed, fp16, &dpp, &m) == CLG_OK,
                  "%s", clg_last_error(ctx()));
    return m;
}

/* n sequences of a learnable pattern: x[t] = (a + k t) mod 64 (a, k random),
 * some positions noise; the target at t is x[t + 1] (the last one: its next
 * in the pattern). */
static void synth(clg_rng *r, clg_model *m, int n)
{
    int T = m->net->in_h;
    for (int i = 0; i < n; i++) {
        int a = (int)(clg_rng_u32(r) % 64u), k = 1 + (int)(clg_rng_u32(r) % 3u);
        for (int t = 0; t <= T; t++) {
            int v = (a + k * t) % 64;
            if (t < T)
                m->xhost[0][(size_t)i * T + t] = (float)(clg_rng_u32(r) % 16u == 0 ? clg_rng_u32(r) % 256u : (unsigned)v);
            if (t > 0)
                m->yhost[0][(size_t)i * T + t - 1] = v;
        }
    }
}

static void step_on(clg_model *m, clg_rng *r, float *res)
{
    ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
    synth(r, m, m->net->batch);
    ck_assert_msg(clg_session_upload(m, 0, m->net->batch, 1) == CLG_OK, "%s", clg_last_error(ctx()));
    ck_assert_msg(clg_session_train_step(m, 0, m->hp.learning_rate, res) == CLG_OK, "%s", clg_last_error(ctx()));
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

/* max over trainable tensors of |a - b|_2 / |b|_2 (inf where a is not finite).
 * The key third of each attention's qkv_bias is left out: its gradient is
 * zero in exact arithmetic (a constant added to every score of a query's
 * row cancels in the softmax), so what the runs compute for it is rounding
 * alone (~1e-9), which AdamW divides by its own magnitude into a step of
 * +-lr in either run whatever its sign (the same happens in PyTorch). The
 * query third's gradient is small at initialization too (second order in
 * the small initial spread of the keys), some elements near AdamW's
 * epsilon 1e-8 where g / (|g| + eps) is not scale-free, so rounding moves
 * their steps by a fraction of lr: 5.4e-5 relative seen (seed 33); the
 * rest of qkv_bias is held to TOL_QKV_BIAS, scaled into the returned
 * figure as TOL / TOL_QKV_BIAS. */
static double max_rel_diff(clg_model *a, clg_model *b, char *worst_name, size_t wn)
{
    double worst = 0;
    clg_param_ref *refs = NULL;
    int n = 0;
    ck_assert(clg_replica_params(clg_session_rep(a), 0, &refs, &n) == CLG_OK);
    ck_assert_msg(n >= 20, "gpt-tiny has %d parameter tensors", n);
    for (int i = 0; i < n; i++) {
        if (!refs[i].param->trainable)
            continue;
        size_t na = 0, nb = 0;
        float *wa = download_param(a, 0, i, &na), *wb = download_param(b, 0, i, &nb);
        ck_assert(na == nb);
        double d2 = 0, r2 = 0;
        int qkv_bias = strcmp(refs[i].param->name, "qkv_bias") == 0;
        for (size_t k = 0; k < na; k++) {
            if (qkv_bias && k >= na / 3 && k < 2 * na / 3)
                continue;
            double d = (double)wa[k] - wb[k];
            d2 += isfinite(d) ? d * d : INFINITY;
            r2 += (double)wb[k] * wb[k];
        }
        double rel = sqrt(d2) / (sqrt(r2) + 1e-30) * (qkv_bias ? TOL / TOL_QKV_BIAS : 1.0);
        if (!(rel <= worst)) {
            worst = rel;
            snprintf(worst_name, wn, "%s.%s", refs[i].layer->name, refs[i].param->name);
        }
        free(wa);
        free(wb);
    }
    free(refs);
    return worst;
}

/* Returns the worst per-step difference; scale2: the 2-device model's rate
 * is multiplied by it (1: the real comparison). */
static double one_vs_two(const char *algo, double scale2)
{
    char *text = model_text(algo);
    uint64_t seed = tu_seed();
    clg_model *one = make(text, "0", 0, seed), *two = make(text, "0,1", 0, seed);
    ck_assert_int_eq(two->dp->n, 2);
    ck_assert(clg_session_ensure_optim(one) == CLG_OK && clg_session_ensure_optim(two) == CLG_OK);
    char path[256];
    snprintf(path, sizeof path, "test_gpt_sync_%d.safetensors", (int)getpid());
    clg_rng r1, r2;
    clg_rng_seed(&r1, seed, 99);
    clg_rng_seed(&r2, seed, 99);
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        if (s > 0) {
            ck_assert_msg(clg_session_save(one, path, 1, 0) == CLG_OK, "%s", clg_last_error(ctx()));
            ck_assert_msg(clg_session_load(two, path, 1) == CLG_OK, "%s", clg_last_error(ctx()));
        }
        float l1[2], l2[2];
        double lr = one->hp.learning_rate;
        two->hp.learning_rate = lr * scale2;
        step_on(one, &r1, l1);
        step_on(two, &r2, l2);
        ck_assert_msg(isfinite(l1[0]) && fabs(l1[0] - l2[0]) <= 1e-5 * fabs(l1[0]) + 1e-6,
                      "algo %s step %d: global loss sum 1 device %.8g, 2 devices %.8g", algo, s, l1[0], l2[0]);
        char wname[160] = "";
        double d = max_rel_diff(two, one, wname, sizeof wname);
        if (scale2 == 1.0)
            ck_assert_msg(d <= TOL, "algo %s step %d: 2-device weights differ from 1-device weights by %g (%s)", algo,
                          s, d, wname);
        worst = fmax(worst, d);
    }
    unlink(path);
    fprintf(stderr, "gpt-tiny algo %s, 1 vs 2 devices, %d steps%s: worst relative L2 difference %.2e\n", algo,
            STEPS, scale2 == 1.0 ? "" : " (2-device rate scaled)", worst);
    clg_session_free(one);
    clg_session_free(two);
    free(text);
    return worst;
}

static int two_devices(void)
{
    if (clg_device_count(ctx()) < 2) {
        fprintf(stderr, "test_gpt: needs two OpenCL devices (POCL_DEVICES=\"pthread pthread\")\n");
        return 0;
    }
    return 1;
}

START_TEST(gpt_1_vs_2_devices)
{
    if (!two_devices())
        return;
    one_vs_two("fused", 1.0);
    one_vs_two("gemm", 1.0);
}
END_TEST

/* The comparison can fail: a 2-device run whose step is off by 1% (as a
 * gradient scaled by a wrong batch share would be) is far outside TOL. */
START_TEST(gpt_1_vs_2_broken)
{
    if (!two_devices())
        return;
    double d = one_vs_two("fused", 1.01);
    ck_assert_msg(d > 10 * TOL, "a 1%% larger step on 2 devices differs by only %g", d);
}
END_TEST

/* `steps` steps; loss[s]: the mean loss per position of step s */
static void train(clg_model *m, uint64_t seed, int steps, double *loss)
{
    clg_rng r;
    clg_rng_seed(&r, seed, 4242);
    for (int s = 0; s < steps; s++) {
        float res[2];
        step_on(m, &r, res);
        loss[s] = res[0] / m->net->batch; /* res[0]: the sum over samples of their mean over positions */
        ck_assert_msg(isfinite(loss[s]), "%s step %d: loss %g", clg_session_rep(m)->fp16 ? "fp16" : "fp32", s,
                      loss[s]);
    }
}

#define FP16_STEPS 40

START_TEST(gpt_fp16_trains)
{
    char *text = model_text("auto");
    uint64_t seed = tu_seed();
    double l32[FP16_STEPS], l16[FP16_STEPS];
    clg_model *m32 = make(text, "0", 0, seed);
    train(m32, seed, FP16_STEPS, l32);
    clg_session_free(m32);
    clg_model *m16 = make(text, "0", 1, seed);
    ck_assert(clg_session_rep(m16)->fp16);
    train(m16, seed, FP16_STEPS, l16);
    double e32 = 0, e16 = 0;
    for (int s = FP16_STEPS - 5; s < FP16_STEPS; s++) {
        e32 += l32[s] / 5;
        e16 += l16[s] / 5;
    }
    fprintf(stderr, "gpt-tiny: loss step 0 fp32 %.5f fp16 %.5f; mean of the last 5 of %d steps fp32 %.5f fp16 %.5f\n",
            l32[0], l16[0], FP16_STEPS, e32, e16);
    /* training works: from ln 256 = 5.55 the byte statistics alone bring the mean of the last 5 steps to
     * about 0.75 of it (4.1-4.2, fp32 and fp16 alike, varying with the seed); a broken step stays near 5.5 */
    ck_assert_msg(e16 < 0.8 * l16[0], "fp16: the loss did not fall: %.4f -> %.4f", l16[0], e16);
    ck_assert_msg(e32 < 0.8 * l32[0], "fp32: the loss did not fall: %.4f -> %.4f", l32[0], e32);
    int differ = 0; /* half storage rounds the activations: some step's loss differs from fp32's */
    for (int s = 0; s < FP16_STEPS; s++)
        differ += l16[s] != l32[s];
    ck_assert_msg(differ > 0, "fp16 losses equal the fp32 ones on every step: half storage not in effect?");
    ck_assert_msg(fabs(l16[0] - l32[0]) <= 1e-3 * l32[0], "step 0: fp16 loss %.5f vs fp32 %.5f", l16[0], l32[0]);
    ck_assert_msg(fabs(e16 - e32) <= 0.01 * e32, "fp16 loss %.4f vs fp32 %.4f", e16, e32);
    /* the fp32 master weights of the fp16 run: finite */
    clg_param_ref *refs = NULL;
    int n = 0;
    ck_assert(clg_replica_params(clg_session_rep(m16), 0, &refs, &n) == CLG_OK);
    for (int i = 0; i < n; i++) {
        size_t k = 0;
        float *w = download_param(m16, 0, i, &k);
        for (size_t j = 0; j < k; j++)
            ck_assert_msg(isfinite(w[j]), "fp16 run: parameter %d element %zu is %g", i, j, w[j]);
        free(w);
    }
    free(refs);
    clg_session_free(m16);
    free(text);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {gpt_1_vs_2_devices, gpt_1_vs_2_broken, gpt_fp16_trains};
    int rc = tu_run_tests("train_gpt", 300, tests, 3);
    return rc;
}
