/* models/resnet20.cfg (the He et al. 2016 CIFAR-10 ResNet-20, option B
 * shortcuts): stage shapes and the parameter count against the paper's
 * layout computed here, then training steps on one fresh random batch: the
 * loss is finite and falls, and predictions (poisoned beforehand) are finite
 * probabilities. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Parameters of ResNet-20 with option B shortcuts: conv weights (no bias),
 * BN scale + shift, 1x1 projections where the channel count changes, dense 10. */
static long resnet20_params(void)
{
    long p = 3 * 9 * 16 + 2 * 16; /* stem conv + BN */
    int cin = 16;
    static const int ch[3] = {16, 32, 64};
    for (int s = 0; s < 3; s++)
        for (int b = 0; b < 3; b++) {
            int c = ch[s];
            p += (long)cin * 9 * c + 2L * c + (long)c * 9 * c + 2L * c;
            if (cin != c)
                p += (long)cin * c + 2L * c;
            cin = c;
        }
    return p + 64 * 10 + 10;
}

START_TEST(resnet20)
{
    clg_ctx *ctx = tu_ctx("0");
    char path[512];
    snprintf(path, sizeof path, "%s/models/resnet20.cfg", CLG_SOURCE_DIR);
    enum { B = 8 };
    clg_model_params mp;
    clg_model_params_init(&mp);
    mp.batch = B;
    mp.learning_rate = 0.02;
    mp.weight_decay = 0;
    clg_model *m = NULL;
    ck_assert_msg(clg_model_create_file(ctx, path, &mp, &m) == CLG_OK, "%s", clg_last_error(ctx));
    int c, h, w, classes, batch;
    clg_model_shape(m, &c, &h, &w, &classes, &batch);
    ck_assert(c == 3 && h == 32 && w == 32 && classes == 10 && batch == B);

    /* the layer table: every stage's output shape, 20 weighted layers + 2 projections */
    size_t need = clg_model_summary(m, NULL, 0) + 1;
    char *sum = malloc(need);
    clg_model_summary(m, sum, need);
    static const char *const shapes[] = {"16x32x32", "32x16x16", "64x8x8", "64x1x1"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        ck_assert_msg(strstr(sum, shapes[i]) != NULL, "summary lacks %s:\n%s", shapes[i], sum);
    int convs = 0;
    for (const char *q = sum; (q = strstr(q, "_conv")) != NULL; q++)
        convs++;
    ck_assert_msg(convs == 18, "%d block convolutions (expected 18)", convs);
    char want[64];
    snprintf(want, sizeof want, "%.1fk trainable parameters", resnet20_params() / 1000.0);
    ck_assert_msg(strstr(sum, want) != NULL, "summary lacks '%s':\n%s", want, sum);
    free(sum);

    /* fresh random batch; the loss of a few steps on it falls */
    clg_rng r;
    tu_rng(&r, 20);
    size_t n = (size_t)B * 3 * 32 * 32;
    float *x = malloc(n * sizeof *x), *probs = malloc((size_t)B * 10 * sizeof *probs);
    int32_t y[B];
    tu_fill(x, n, -1.f, 1.f, &r);
    for (int i = 0; i < B; i++)
        y[i] = (int32_t)(clg_rng_u32(&r) % 10);
    clg_metrics met;
    double first = 0, last = 0;
    for (int s = 0; s < 6; s++) {
        ck_assert_msg(clg_model_train_step(m, x, y, B) == CLG_OK, "step %d: %s", s, clg_last_error(ctx));
        ck_assert(clg_model_metrics(m, &met) == CLG_OK);
        ck_assert_msg(isfinite(met.loss) && met.loss > 0, "step %d: loss %g", s, met.loss);
        if (s == 0)
            first = met.loss;
        last = met.loss;
    }
    ck_assert_int_eq(met.step, 6);
    ck_assert_msg(last < first * 0.9, "loss %g after 6 steps on one batch, %g at the first", last, first);
    tu_poison(probs, (size_t)B * 10);
    ck_assert_msg(clg_model_predict(m, x, B, probs) == CLG_OK, "%s", clg_last_error(ctx));
    for (int i = 0; i < B; i++) {
        double s = 0;
        for (int k = 0; k < 10; k++) {
            ck_assert_msg(isfinite(probs[i * 10 + k]) && probs[i * 10 + k] >= 0, "prob %d,%d = %g", i, k,
                          probs[i * 10 + k]);
            s += probs[i * 10 + k];
        }
        ck_assert_msg(fabs(s - 1) < 1e-4, "sample %d: probabilities sum to %g", i, s);
    }
    fprintf(stderr, "resnet20: loss %.4f -> %.4f over 6 steps on one batch of %d\n", first, last, B);
    free(x);
    free(probs);
    clg_model_destroy(m);
    clg_ctx_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("resnet20");
    TCase *tc = tcase_create("resnet20");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, resnet20);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
