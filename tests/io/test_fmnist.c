/* The real Fashion-MNIST files (Debian's dataset-fashion-mnist package, or
 * $CLGRAD_DATA_DIR/fashion-mnist): counts, shapes, label range, and
 * normalization statistics recomputed here in double. Skips (77) when the
 * package is absent. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/dataset.h"
#include "testutil.h"

START_TEST(test_fashion_mnist)
{
    const int want_n[2] = {60000, 10000};
    for (int s = 0; s < 2; s++) {
        clg_err err = {0};
        clg_dataset *ds = NULL;
        double t0 = clg_now_sec();
        clg_status st = clg_dataset_open(&err, "fashion-mnist", s ? CLG_SPLIT_TEST : CLG_SPLIT_TRAIN, &ds);
        ck_assert_msg(st == CLG_OK, "%s", err.msg);
        fprintf(stderr, "%s: %d images from %s in %.2f s\n", s ? "test" : "train", ds->n, ds->source,
                clg_now_sec() - t0);
        ck_assert_int_eq(ds->n, want_n[s]);
        ck_assert_int_eq(ds->c, 1);
        ck_assert_int_eq(ds->h, 28);
        ck_assert_int_eq(ds->w, 28);
        ck_assert_int_eq(ds->nclasses, 10);
        int hist[10] = {0};
        for (int i = 0; i < ds->n; i++) {
            ck_assert_msg(ds->labels[i] >= 0 && ds->labels[i] <= 9, "label %d of image %d", ds->labels[i], i);
            hist[ds->labels[i]]++;
        }
        for (int k = 0; k < 10; k++)
            ck_assert_msg(hist[k] > 0, "class %d never appears", k);
        /* statistics: recompute in double and compare */
        double sum = 0, sum2 = 0;
        size_t tot = (size_t)ds->n * 784;
        for (size_t i = 0; i < tot; i++) {
            double v = ds->u8[i] / 255.0;
            sum += v;
            sum2 += v * v;
        }
        double mean = sum / (double)tot, sd = sqrt(sum2 / (double)tot - mean * mean);
        clg_ds_norm nm;
        ck_assert_int_eq(clg_dataset_norm_compute(&err, ds, &nm), CLG_OK);
        fprintf(stderr, "mean %.4f std %.4f\n", nm.mean[0], nm.std[0]);
        ck_assert(fabs(nm.mean[0] - mean) < 1e-5 && fabs(nm.std[0] - sd) < 1e-5);
        ck_assert(mean > 0.05 && mean < 0.95 && sd > 0.05); /* not blank / constant images */
        clg_dataset_free(ds);
    }
}
END_TEST

int main(void)
{
    const char *env = getenv("CLGRAD_DATA_DIR");
    char p[1024];
    struct stat sb;
    int have = stat("/usr/share/datasets/fashion-mnist", &sb) == 0;
    if (env && *env) {
        snprintf(p, sizeof p, "%s/fashion-mnist", env);
        have = have || stat(p, &sb) == 0;
    }
    if (!have) {
        fprintf(stderr, "skip: Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)\n");
        return TU_SKIP;
    }
    Suite *s = suite_create("fmnist");
    TCase *tc = tcase_create("fmnist");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fashion_mnist);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
