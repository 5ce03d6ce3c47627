/* Numerical faults (issue #11): clg_replica_explain_nonfinite names the
 * layer where a non-finite value first appears -- a weight made NaN in
 * each trainable layer in turn, a layer whose finite weights overflow its
 * output, an input holding inf, a gradient that overflows in backward
 * while forward is finite -- and says so when nothing is non-finite. The
 * device's last error is left as it was. */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/lane.h"
#include "testutil.h"
#include "train/session.h"

static const char *CNN = "[net]\nchannels = 1\nheight = 8\nwidth = 8\nclasses = 4\nbatch = 16\n"
                         "[conv]\nname = c1\nfilters = 4\nsize = 3\npad = 1\nactivation = relu\n"
                         "[maxpool]\nname = p1\nsize = 2\n"
                         "[dense]\nname = fc1\nunits = 8\nactivation = relu\n"
                         "[dense]\nname = fc2\nunits = 4\n"
                         "[softmax]\nname = loss\n";
#define N 16

static clg_ctx *g_ctx;
static clg_model *m;
static clg_replica *rep;

static void setup(void)
{
    g_ctx = tu_ctx("0");
    ck_assert_msg(clg_session_create(g_ctx, NULL, 0, CNN, "cnn.cfg", 0, tu_seed(), 0, NULL, &m) == CLG_OK, "%s",
                  clg_last_error(g_ctx));
    rep = clg_session_rep(m);
}

static void teardown(void)
{
    clg_session_free(m);
    clg_ctx_destroy(g_ctx);
}

/* Fresh random images in [0, 1) (inf at element `bad` when >= 0) staged on lane 0 as a training step would. */
static void stage(long bad)
{
    clg_rng r;
    tu_rng(&r, 5);
    ck_assert(clg_session_stage_wait(m, 0) == CLG_OK);
    tu_fill(m->xhost[0], (size_t)N * 64, 0.0f, 1.0f, &r);
    if (bad >= 0)
        m->xhost[0][bad] = INFINITY;
    for (int i = 0; i < N; i++)
        m->yhost[0][i] = (int32_t)(clg_rng_u32(&r) % 4);
    ck_assert(clg_session_upload(m, 0, N, 1) == CLG_OK);
    ck_assert(clg_lane_use_stage(&m->dp->lanes[0], 0, 1, 1.0f / N) == CLG_OK);
}

static clg_param *weight(const char *layer)
{
    int i = clg_net_find(m->net, layer);
    ck_assert_int_ge(i, 0);
    return &rep->layers[i].params[0];
}

static float *get(clg_param *p)
{
    float *h = malloc(p->numel * sizeof(float));
    tu_poison(h, p->numel);
    tu_download(clg_session_dev(m), p->value, h, p->numel);
    return h;
}

static void put(clg_param *p, const float *h)
{
    ck_assert(clEnqueueWriteBuffer(clg_session_dev(m)->queue, p->value, CL_TRUE, 0, p->numel * sizeof(float), h, 0,
                                   NULL, NULL) == CL_SUCCESS);
    clg_replica_params_changed(rep);
}

static void explain(char *buf, size_t cap)
{
    clg_err_set(clg_dev_err(clg_session_dev(m)), CLG_ERR_INTERNAL, "the caller's failure");
    clg_replica_explain_nonfinite(rep, N, buf, cap);
    ck_assert_str_eq(clg_dev_err(clg_session_dev(m))->msg, "the caller's failure");
    fprintf(stderr, "  %s\n", buf);
}

START_TEST(clean_batch)
{
    char buf[512];
    stage(-1);
    explain(buf, sizeof buf);
    ck_assert_msg(strstr(buf, "every layer's output, gradient and parameter is finite"), "%s", buf);
}
END_TEST

START_TEST(nan_weight_each_layer)
{
    const char *layers[3] = {"c1", "fc1", "fc2"};
    clg_rng r;
    tu_rng(&r, 9);
    for (int t = 0; t < 3; t++) {
        clg_param *w = weight(layers[t]);
        float *orig = get(w), *bad = malloc(w->numel * sizeof(float));
        memcpy(bad, orig, w->numel * sizeof(float));
        for (size_t k = 0; k < w->numel; k++) /* every weight NaN: no ReLU or pooling can hide it */
            bad[k] = NAN;
        put(w, bad);
        stage(-1);
        char buf[512], want[128];
        explain(buf, sizeof buf);
        /* named by its output, or (a ReLU maps NaN to 0) by the parameter scan that follows */
        snprintf(want, sizeof want, "layer '%s'", layers[t]);
        ck_assert_msg(strstr(buf, want), "NaN weights of %s: %s", layers[t], buf);
        ck_assert_msg(strstr(buf, "parameter 'weight' is non-finite already") ||
                          strstr(buf, "holds a non-finite parameter 'weight'"),
                      "%s", buf);
        put(w, orig);
        free(orig);
        free(bad);
    }
}
END_TEST

START_TEST(overflow_in_a_layer)
{
    clg_param *w = weight("fc1");
    float *h = get(w);
    for (size_t k = 0; k < w->numel; k++)
        h[k] = FLT_MAX; /* finite, but any input sum above ~1 overflows (3e37 needed a sum above 11: seed-dependent) */
    put(w, h);
    stage(-1);
    char buf[512];
    explain(buf, sizeof buf);
    ck_assert_msg(strstr(buf, "forward: layer 'fc1' (dense, cnn.cfg:"), "%s", buf);
    ck_assert_msg(strstr(buf, "its parameters are finite"), "%s", buf);
    free(h);
}
END_TEST

START_TEST(inf_input)
{
    stage(77);
    char buf[512];
    explain(buf, sizeof buf);
    ck_assert_msg(strstr(buf, "the input batch holds a non-finite value (inf at element 77)"), "%s", buf);
}
END_TEST

START_TEST(overflow_in_backward)
{
    stage(-1);
    /* the loss gradient scaled so that it stays finite but fc2's weight gradient (a sum over the batch) does not */
    rep->layers[rep->loss_index].loss.grad_scale = 3e38f;
    char buf[512];
    explain(buf, sizeof buf);
    ck_assert_msg(strstr(buf, "backward: layer '"), "%s", buf);
    ck_assert_msg(strstr(buf, "backward: layer 'fc2'") || strstr(buf, "backward: layer 'loss'"), "%s", buf);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("nonfinite");
    TCase *tc = tcase_create("nonfinite");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, clean_batch);
    tcase_add_test(tc, nan_weight_each_layer);
    tcase_add_test(tc, overflow_in_a_layer);
    tcase_add_test(tc, inf_input);
    tcase_add_test(tc, overflow_in_backward);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
