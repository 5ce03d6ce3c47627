/* The public API through the shared library only (no internals). */
#include <check.h>
#include <string.h>

#include <clgrad.h>

START_TEST(status_and_version)
{
    ck_assert_str_eq(clg_status_string(CLG_OK), "success");
    ck_assert_str_eq(clg_status_name(CLG_ERR_BUILD), "ERR_BUILD");
    ck_assert_uint_eq(clg_version() >> 16, CLG_VERSION_MAJOR);
    ck_assert_ptr_nonnull(clg_version_string());
}
END_TEST

START_TEST(context_lifecycle)
{
    clg_ctx_params p;
    memset(&p, 0x5a, sizeof p);
    clg_ctx_params_init(&p);
    ck_assert_ptr_null(p.devices);
    ck_assert_int_eq(p.use_cache, 1);
    clg_ctx *ctx = NULL;
    clg_status st = clg_ctx_create(&p, &ctx);
    if (st == CLG_ERR_NO_DEVICE)
        return; /* nothing more to check without a device */
    ck_assert_int_eq(st, CLG_OK);
    ck_assert_int_ge(clg_device_count(ctx), 1);
    double err = -1;
    ck_assert_int_eq(clg_selfcheck(ctx, &err), CLG_OK);
    ck_assert(err >= 0 && err < 1e-5);
    clg_pool_stats ps;
    ck_assert_int_eq(clg_pool_stats_get(ctx, 0, &ps), CLG_OK);
    ck_assert_uint_eq(ps.bytes_in_use, 0); /* the self-check gave its buffers back */
    ck_assert_uint_gt(ps.bytes_cached, 0);
    clg_ctx_destroy(ctx);
    clg_ctx_destroy(NULL);
    ck_assert_ptr_nonnull(clg_last_error(NULL));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("api");
    TCase *tc = tcase_create("api");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, status_and_version);
    tcase_add_test(tc, context_lifecycle);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
