/* pool: size classes, reuse, statistics, allocation failures as statuses. */
#include <string.h>

#include "testutil.h"

START_TEST(size_classes)
{
    ck_assert_uint_eq(clg_pool_class(1), 256);
    ck_assert_uint_eq(clg_pool_class(256), 256);
    clg_rng r;
    tu_rng(&r, 3);
    for (int i = 0; i < 10000; i++) {
        size_t b = 1 + (clg_rng_u32(&r) % (64u << 20));
        size_t c = clg_pool_class(b);
        ck_assert_uint_ge(c, b);
        ck_assert_uint_le(c, b + b / 4 + 256); /* at most 25% waste above the minimum */
        ck_assert_uint_eq(clg_pool_class(c), c); /* classes are fixed points */
    }
}
END_TEST

START_TEST(reuse_and_stats)
{
    clg_ctx *ctx = tu_ctx("0");
    clg_device *dev = &ctx->devs[0];
    cl_mem a = NULL, b = NULL, c = NULL;
    ck_assert_int_eq(clg_buf_alloc(dev, 1000000, &a), CLG_OK);
    ck_assert_int_eq(clg_buf_alloc(dev, 5000, &b), CLG_OK);
    clg_pool_stats s;
    ck_assert_int_eq(clg_pool_stats_get(ctx, 0, &s), CLG_OK);
    ck_assert_uint_eq(s.misses, 2);
    ck_assert_uint_eq(s.hits, 0);
    ck_assert_uint_eq(s.bytes_in_use, clg_pool_class(1000000) + clg_pool_class(5000));
    uint64_t peak = s.peak_bytes;
    clg_buf_release(dev, a);
    ck_assert_int_eq(clg_pool_stats_get(ctx, 0, &s), CLG_OK);
    ck_assert_uint_eq(s.bytes_cached, clg_pool_class(1000000));
    /* a request of the same class gets the same block back */
    ck_assert_int_eq(clg_buf_alloc(dev, 990000, &c), CLG_OK);
    ck_assert_ptr_eq(c, a);
    ck_assert_int_eq(clg_pool_stats_get(ctx, 0, &s), CLG_OK);
    ck_assert_uint_eq(s.hits, 1);
    ck_assert_uint_eq(s.bytes_cached, 0);
    ck_assert_uint_eq(s.peak_bytes, peak);
    /* the reused block holds data like a fresh one */
    float host[64], back[64];
    clg_rng r;
    tu_rng(&r, 4);
    tu_fill(host, 64, -1, 1, &r);
    tu_poison(back, 64);
    ck_assert_int_eq(clEnqueueWriteBuffer(dev->queue, c, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL), CL_SUCCESS);
    tu_download(dev, c, back, 64);
    ck_assert_int_eq(memcmp(host, back, sizeof host), 0);
    clg_buf_release(dev, b);
    clg_buf_release(dev, c);
    clg_buf_release(dev, NULL);
    clg_pool_trim(dev);
    ck_assert_int_eq(clg_pool_stats_get(ctx, 0, &s), CLG_OK);
    ck_assert_uint_eq(s.bytes_in_use, 0);
    ck_assert_uint_eq(s.bytes_cached, 0);
    clg_ctx_destroy(ctx);
}
END_TEST

START_TEST(allocation_failures_are_statuses)
{
    clg_ctx *ctx = tu_ctx("0");
    clg_device *dev = &ctx->devs[0];
    cl_mem m = (cl_mem)0x1;
    /* larger than the device can ever give */
    size_t huge = (size_t)dev->info.max_alloc_bytes * 2 + 1;
    ck_assert_int_eq(clg_buf_alloc(dev, huge, &m), CLG_ERR_DEVICE_OOM);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "cannot allocate"));
    /* injected driver failure after two successful allocations */
    dev->pool.fail_after = 2;
    cl_mem a = NULL, b = NULL;
    ck_assert_int_eq(clg_buf_alloc(dev, 4096, &a), CLG_OK);
    ck_assert_int_eq(clg_buf_alloc(dev, 8192, &b), CLG_OK);
    ck_assert_int_eq(clg_buf_alloc(dev, 16384, &m), CLG_ERR_DEVICE_OOM);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "CL_MEM_OBJECT_ALLOCATION_FAILURE"));
    clg_pool_stats s;
    ck_assert_int_eq(clg_pool_stats_get(ctx, 0, &s), CLG_OK);
    ck_assert_uint_eq(s.failures, 2);
    /* cached blocks are still served while the driver refuses new ones */
    clg_buf_release(dev, a);
    ck_assert_int_eq(clg_buf_alloc(dev, 4096, &m), CLG_OK);
    ck_assert_ptr_eq(m, a);
    dev->pool.fail_after = -1;
    clg_buf_release(dev, m);
    clg_buf_release(dev, b);
    clg_ctx_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("pool");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, size_classes);
    tcase_add_test(tc, reuse_and_stats);
    tcase_add_test(tc, allocation_failures_are_statuses);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
