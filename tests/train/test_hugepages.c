/* Option hugepages (src/device/pool.c, huge_buffer): buffers of 2 MiB or
 * more in 2 MiB-aligned huge-page mappings on CPU devices must not change
 * what training computes. models/resnet-mini.cfg at batch 48 (its 16-channel
 * 28x28 activations are 2.4 MiB) trains a few steps on fresh synthetic data
 * with hugepages=0 and with hugepages=1, each in its own context on the same
 * cache (untuned convolution and GEMM choices, tu_ctx_fixed_opt, so both
 * runs take the same algorithms): the losses and every parameter after the steps must be
 * bitwise equal, and the run with hugepages=1 must have made huge-page
 * buffers (the one with 0 none). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_testutil.h"

#define STEPS 3
#define BATCH 48

/* STEPS steps of resnet-mini with option hugepages = huge: losses, the
 * parameters after them and the number of huge-page buffers made. */
static long run(const char *huge, uint64_t seed, double *loss, tt_weights *w)
{
    clg_ctx *ctx = tu_ctx_fixed_opt(0, "hugepages", huge);
    char *text = tt_read_model("resnet-mini.cfg");
    clg_dp_params dpp = {0};
    clg_model *m = NULL;
    ck_assert_msg(clg_session_create(ctx, "0", 0, text, "resnet-mini.cfg", BATCH, seed, 0, &dpp, &m) == CLG_OK, "%s",
                  clg_last_error(ctx));
    free(text);
    clg_rng rng;
    clg_rng_seed(&rng, seed, 5);
    tt_train(m, &rng, STEPS, BATCH, m->hp.learning_rate, loss, NULL);
    tt_grab_session(m, w);
    long made = ctx->devs[0].pool.huge_buffers;
    clg_session_free(m);
    clg_ctx_destroy(ctx);
    return made;
}

START_TEST(hugepages_same_bits)
{
    clg_ctx *probe = tu_ctx_fixed_opt(0, "hugepages", "0");
    int cpu = (probe->devs[0].info.type & CLG_DEVICE_CPU) != 0;
    clg_ctx_destroy(probe);
    if (!cpu) { /* the option applies to CPU devices only */
        fprintf(stderr, "skip: device 0 is not a CPU device\n");
        exit(TU_SKIP);
    }
    uint64_t seed = tu_seed();
    double loss0[STEPS], loss1[STEPS];
    for (int s = 0; s < STEPS; s++)
        loss0[s] = loss1[s] = NAN;
    tt_weights w0 = {0}, w1 = {0};
    long made0 = run("0", seed, loss0, &w0);
    long made1 = run("1", seed, loss1, &w1);
    fprintf(stderr, "huge-page buffers: %ld with hugepages=1, %ld with 0\n", made1, made0);
    ck_assert_int_eq(made0, 0);
#if defined(__linux__)
    ck_assert_msg(made1 > 0, "hugepages=1 made no huge-page buffer: the comparison would prove nothing");
#endif
    for (int s = 0; s < STEPS; s++)
        ck_assert_msg(isfinite(loss0[s]) && memcmp(&loss0[s], &loss1[s], sizeof loss0[s]) == 0,
                      "step %d: loss %.9g with hugepages=1, %.9g with 0", s, loss1[s], loss0[s]);
    ck_assert_int_gt(w0.n, 10);
    tt_compare(&w1, &w0, -1, "hugepages 1 vs 0");
    tt_weights_free(&w0);
    tt_weights_free(&w1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("train-hugepages");
    TCase *tc = tcase_create("train-hugepages");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, hugepages_same_bits);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
