/* The global gradient norm of the data-parallel reduction: the host path's
 * copy of lane_add's partial sums (clg_optk_sumsq_host) equals what the
 * kernel computes on the device to the bit, for every device of the
 * context, over sizes below, at and above one work-group, an exact multiple
 * of the 64 groups' work-items, and several times that (grid-stride sums
 * wrapping), with values spanning 1e-18 to 1e3 (squares from near the
 * denormal range to 1e6). The kernel's sum of a + b goes to a poisoned
 * buffer and must be the host's float sum; the norm must also lie within
 * 1e-5 relative of a double-precision reference (a wrong grouping or a lost
 * element is off by far more). Fresh random inputs each run (seed printed). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/optim_kernels.h"
#include "testutil.h"

#define GROUPS 64 /* the reduction's partial slots per bucket (dreduce.c RED_GROUPS) */

static void one_case(clg_device *dev, size_t n, clg_rng *r)
{
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *s = malloc(n * sizeof *s);
    float *got = malloc(n * sizeof *got), part[GROUPS];
    ck_assert(a && b && s && got);
    for (size_t i = 0; i < n; i++) {
        double mag = pow(10.0, -18.0 + 21.0 * clg_rng_uniform(r)); /* 1e-18 .. 1e3 */
        a[i] = (float)(clg_rng_uniform(r) < 0.5 ? -mag : mag);
        b[i] = (float)(mag * (clg_rng_uniform(r) - 0.5));
        s[i] = a[i] + b[i];
    }
    cl_mem da = tu_upload(dev, a, n), db = tu_upload(dev, b, n), dd = tu_upload(dev, NULL, n),
           dp = tu_upload(dev, NULL, GROUPS);
    ck_assert_msg(clg_optk_lane_add(dev, dd, da, db, 0, n, 1, dp, 0, GROUPS, NULL) == CLG_OK, "%s",
                  clg_dev_err(dev)->msg);
    tu_poison(got, n);
    tu_poison(part, GROUPS);
    tu_download(dev, dd, got, n);
    tu_download(dev, dp, part, GROUPS);
    ck_assert_msg(memcmp(got, s, n * sizeof *s) == 0, "n %zu: the lane sum differs from the host's float sum", n);
    double dev_sq = 0, ref = 0;
    for (int g = 0; g < GROUPS; g++) /* as clg_dp_dev_sumsq adds a bucket's partials */
        dev_sq += part[g];
    for (size_t i = 0; i < n; i++)
        ref += (double)s[i] * s[i];
    int wg = 0;
    ck_assert(clg_optk_red_wg(dev, &wg) == CLG_OK);
    double host_sq = clg_optk_sumsq_host(s, n, wg, GROUPS);
    ck_assert_msg(memcmp(&dev_sq, &host_sq, sizeof host_sq) == 0,
                  "%s, n %zu, group %d: device norm^2 %.17g, host copy %.17g", dev->info.name, n, wg, dev_sq, host_sq);
    ck_assert_msg(fabs(host_sq - ref) <= 1e-5 * ref, "n %zu: norm^2 %.17g, double reference %.17g", n, host_sq, ref);
    clg_buf_release(dev, da);
    clg_buf_release(dev, db);
    clg_buf_release(dev, dd);
    clg_buf_release(dev, dp);
    free(a);
    free(b);
    free(s);
    free(got);
}

START_TEST(host_copy_equals_kernel)
{
    clg_ctx *ctx = tu_ctx(NULL);
    clg_rng r;
    tu_rng(&r, 1);
    static const size_t sizes[] = {1, 7, 255, 256, 1000, 16384, 16391, 100003};
    for (int d = 0; d < ctx->ndev; d++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
            one_case(&ctx->devs[d], sizes[i], &r);
    clg_ctx_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("norm_partials");
    TCase *tc = tcase_create("norm_partials");
    tcase_add_test(tc, host_copy_equals_kernel);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
