/* device: enumeration, selectors, per-device context/queue, info queries. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static clg_device_info *infos;
static cl_platform_id *plats;
static cl_device_id *ids;
static int count;

static void setup(void)
{
    clg_err e;
    clg_status st = clg_enumerate(&e, &infos, &plats, &ids, &count);
    if (st == CLG_ERR_NO_DEVICE) {
        fprintf(stderr, "skip: %s\n", e.msg);
        exit(TU_SKIP);
    }
    ck_assert_int_eq(st, CLG_OK);
}

static void teardown(void)
{
    free(infos);
    free(plats);
    free(ids);
}

START_TEST(enumerate_fills_info)
{
    ck_assert_int_ge(count, 1);
    for (int i = 0; i < count; i++) {
        ck_assert_uint_gt(strlen(infos[i].name), 0);
        ck_assert_uint_gt(strlen(infos[i].platform), 0);
        ck_assert_uint_gt(infos[i].compute_units, 0);
        ck_assert_uint_gt(infos[i].global_mem_bytes, 0);
        ck_assert_uint_gt(infos[i].max_work_group_size, 0);
        ck_assert_ptr_nonnull(strstr(infos[i].opencl_c_version, "OpenCL C"));
        ck_assert_ptr_nonnull(strstr(infos[i].device_version, "OpenCL"));
    }
}
END_TEST

START_TEST(selectors)
{
    clg_err e;
    int sel[16], n = 0;
    ck_assert_int_eq(clg_select_devices(&e, "all", infos, count, sel, 16, &n), CLG_OK);
    ck_assert_int_eq(n, count);
    ck_assert_int_eq(clg_select_devices(&e, NULL, infos, count, sel, 16, &n), CLG_OK);
    ck_assert_int_eq(n, count);
    ck_assert_int_eq(clg_select_devices(&e, "0", infos, count, sel, 16, &n), CLG_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(sel[0], 0);
    /* by type: every device of that type, nothing else */
    int ncpu = 0;
    for (int i = 0; i < count; i++)
        ncpu += infos[i].type == CLG_DEVICE_CPU;
    clg_status st = clg_select_devices(&e, "cpu", infos, count, sel, 16, &n);
    if (ncpu) {
        ck_assert_int_eq(st, CLG_OK);
        ck_assert_int_eq(n, ncpu);
    } else {
        ck_assert_int_eq(st, CLG_ERR_NO_DEVICE);
    }
    /* by name substring, case-insensitive */
    char sub[8] = {0};
    for (int i = 0; i < 4 && infos[0].name[i]; i++)
        sub[i] = (char)((infos[0].name[i] >= 'a' && infos[0].name[i] <= 'z') ? infos[0].name[i] - 32 : infos[0].name[i]);
    char byname[32];
    snprintf(byname, sizeof byname, "name:%s", sub);
    ck_assert_int_eq(clg_select_devices(&e, byname, infos, count, sel, 16, &n), CLG_OK);
    ck_assert_int_ge(n, 1);
    /* errors say what is wrong */
    ck_assert_int_eq(clg_select_devices(&e, "name:no-such-device-xyz", infos, count, sel, 16, &n),
                     CLG_ERR_NO_DEVICE);
    ck_assert_ptr_nonnull(strstr(e.msg, "no-such-device-xyz"));
    ck_assert_int_eq(clg_select_devices(&e, "99", infos, count, sel, 16, &n), CLG_ERR_NO_DEVICE);
    ck_assert_ptr_nonnull(strstr(e.msg, "out of range"));
    ck_assert_int_eq(clg_select_devices(&e, "0,x", infos, count, sel, 16, &n), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.msg, "0,x"));
    ck_assert_int_eq(clg_select_devices(&e, "0,0", infos, count, sel, 16, &n), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(clg_select_devices(&e, "bogus:1", infos, count, sel, 16, &n), CLG_ERR_INVALID_ARG);
    /* empty or malformed selectors are refused, never "all" or a name match (issue 26 item 4) */
    const char *bad[] = {"", "0,", ",0", "0,,1", ",", "name:", "99999999999999999999,0"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        n = -1;
        ck_assert_msg(clg_select_devices(&e, bad[i], infos, count, sel, 16, &n) == CLG_ERR_INVALID_ARG,
                      "selector '%s' not refused as invalid (%d device(s) selected)", bad[i], n);
        ck_assert_msg(strstr(e.msg, "selector") != NULL, "'%s': message '%s'", bad[i], e.msg);
    }
}
END_TEST

START_TEST(two_devices)
{
    if (count < 2) {
        fprintf(stderr, "skip two_devices: %d device(s); run with POCL_DEVICES=\"pthread pthread\"\n", count);
        return;
    }
    clg_ctx *ctx = tu_ctx("0,1");
    ck_assert_int_eq(clg_device_count(ctx), 2);
    for (int i = 0; i < 2; i++) {
        clg_device *d = &ctx->devs[i];
        ck_assert_ptr_nonnull(d->cl);
        ck_assert_ptr_nonnull(d->queue);
        cl_command_queue_properties props = 0;
        ck_assert_int_eq(clGetCommandQueueInfo(d->queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL), CL_SUCCESS);
        ck_assert(props & CL_QUEUE_PROFILING_ENABLE);
        ck_assert(!(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE));
    }
    if (ctx->devs[0].platform != ctx->devs[1].platform) {
        /* devices 0 and 1 on different platforms (a GPU machine whose first two devices are the GPU and
         * PoCL's CPU): each has its own cl_context, the shared-context checks below do not apply */
        ck_assert_ptr_ne(ctx->devs[0].cl, ctx->devs[1].cl);
        ck_assert(!ctx->devs[0].shared_cl && !ctx->devs[1].shared_cl);
        fprintf(stderr, "two_devices: devices 0 and 1 on different platforms, separate contexts checked\n");
        clg_ctx_destroy(ctx);
        return;
    }
    /* devices of one platform share one cl_context holding both */
    ck_assert_ptr_eq(ctx->devs[0].cl, ctx->devs[1].cl);
    ck_assert(ctx->devs[0].shared_cl && ctx->devs[1].shared_cl);
    cl_uint nd = 0;
    ck_assert_int_eq(clGetContextInfo(ctx->devs[0].cl, CL_CONTEXT_NUM_DEVICES, sizeof nd, &nd, NULL), CL_SUCCESS);
    ck_assert_uint_eq(nd, 2);
    /* a buffer written on device 0's queue is copied on device 1's */
    enum { N = 1000 };
    float src[N], dst[N];
    for (int i = 0; i < N; i++) {
        src[i] = (float)rand() / RAND_MAX - 0.5f;
        dst[i] = NAN;
    }
    cl_int e = CL_SUCCESS;
    cl_mem a = clCreateBuffer(ctx->devs[0].cl, CL_MEM_READ_WRITE, sizeof src, NULL, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    cl_mem b = clCreateBuffer(ctx->devs[0].cl, CL_MEM_READ_WRITE, sizeof src, NULL, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    cl_event w = NULL;
    ck_assert_int_eq(clEnqueueWriteBuffer(ctx->devs[0].queue, a, CL_FALSE, 0, sizeof src, src, 0, NULL, &w), CL_SUCCESS);
    ck_assert_int_eq(clFlush(ctx->devs[0].queue), CL_SUCCESS);
    ck_assert_int_eq(clEnqueueCopyBuffer(ctx->devs[1].queue, a, b, 0, 0, sizeof src, 1, &w, NULL), CL_SUCCESS);
    ck_assert_int_eq(clEnqueueReadBuffer(ctx->devs[1].queue, b, CL_TRUE, 0, sizeof dst, dst, 0, NULL, NULL), CL_SUCCESS);
    ck_assert_int_eq(memcmp(src, dst, sizeof src), 0);
    clReleaseEvent(w);
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    /* the self-check runs a GEMM on each device against a double reference */
    double worst = -1;
    ck_assert_int_eq(clg_selfcheck(ctx, &worst), CLG_OK);
    ck_assert(worst >= 0 && worst < 1e-5);
    clg_ctx_destroy(ctx);
    /* CLGRAD_SHARED_CONTEXT=0: a context per device */
    setenv("CLGRAD_SHARED_CONTEXT", "0", 1);
    ctx = tu_ctx("0,1");
    unsetenv("CLGRAD_SHARED_CONTEXT");
    ck_assert_ptr_ne(ctx->devs[0].cl, ctx->devs[1].cl);
    ck_assert(!ctx->devs[0].shared_cl && !ctx->devs[1].shared_cl);
    ck_assert_int_eq(clg_selfcheck(ctx, &worst), CLG_OK);
    clg_ctx_destroy(ctx);
}
END_TEST

START_TEST(public_info_api)
{
    clg_ctx *ctx = tu_ctx("all");
    clg_device_info info;
    ck_assert_int_eq(clg_device_info_get(ctx, 0, &info), CLG_OK);
    ck_assert_str_eq(info.name, infos[0].name);
    ck_assert_int_eq(clg_device_info_get(ctx, clg_device_count(ctx), &info), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "out of range"));
    ck_assert_int_eq(clg_device_info_get(NULL, 0, &info), CLG_ERR_INVALID_ARG);
    clg_pool_stats ps;
    ck_assert_int_eq(clg_pool_stats_get(ctx, 0, &ps), CLG_OK);
    ck_assert_int_eq(clg_pool_stats_get(ctx, -1, &ps), CLG_ERR_INVALID_ARG);
    clg_ctx_destroy(ctx);
    clg_ctx_destroy(NULL); /* no-op */
    ck_assert_int_eq(clg_device_count(NULL), 0);
}
END_TEST

/* One PoCL test for every PoCL-specific default (clg_device_is_pocl): the
 * platform name in any case, or "PoCL" in the device version; not other
 * platforms, and not "pocl" in the device name alone. */
START_TEST(pocl_detection)
{
    static const struct {
        const char *platform, *version, *name;
        int want;
    } cases[] = {
        {"Portable Computing Language", "OpenCL 3.0 PoCL HSTR: pthread-x86_64", "pthread-skylake-avx512", 1},
        {"portable computing language", "OpenCL 1.2", "cpu", 1},
        {"Some Vendor Platform", "OpenCL 3.0 PoCL 5.0 CUDA", "NVIDIA H100", 1},
        {"NVIDIA CUDA", "OpenCL 3.0 CUDA", "NVIDIA H100 80GB HBM3", 0},
        {"Intel(R) OpenCL", "OpenCL 3.0 (Build 0)", "pocl-like name", 0},
        {"", "", "", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        clg_device d;
        memset(&d, 0, sizeof d);
        snprintf(d.info.platform, sizeof d.info.platform, "%s", cases[i].platform);
        snprintf(d.info.device_version, sizeof d.info.device_version, "%s", cases[i].version);
        snprintf(d.info.name, sizeof d.info.name, "%s", cases[i].name);
        ck_assert_msg(clg_device_is_pocl(&d) == cases[i].want, "%s / %s: %d", cases[i].platform, cases[i].version,
                      !cases[i].want);
    }
    /* the test device: as its platform says */
    clg_ctx *ctx = tu_ctx("all");
    ck_assert_int_eq(clg_device_is_pocl(&ctx->devs[0]),
                     strstr(ctx->devs[0].info.platform, "Portable Computing Language") != NULL ||
                         strstr(ctx->devs[0].info.device_version, "PoCL") != NULL);
    clg_ctx_destroy(ctx);
}
END_TEST

START_TEST(bad_selector_context)
{
    clg_ctx_params p;
    clg_ctx_params_init(&p);
    p.devices = "name:definitely-not-a-device";
    clg_ctx *ctx = (clg_ctx *)0x1;
    ck_assert_int_eq(clg_ctx_create(&p, &ctx), CLG_ERR_NO_DEVICE);
    ck_assert_ptr_null(ctx);
    ck_assert_ptr_nonnull(strstr(clg_last_error(NULL), "definitely-not-a-device"));
    ck_assert_int_eq(clg_ctx_create(&p, NULL), CLG_ERR_INVALID_ARG);
    /* an empty selector, given or from CLGRAD_DEVICES, is refused rather than taken as "all" */
    p.devices = "";
    ctx = (clg_ctx *)0x1;
    ck_assert_int_eq(clg_ctx_create(&p, &ctx), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_null(ctx);
    p.devices = NULL;
    setenv("CLGRAD_DEVICES", "", 1);
    ctx = (clg_ctx *)0x1;
    clg_status st = clg_ctx_create(&p, &ctx);
    unsetenv("CLGRAD_DEVICES");
    ck_assert_msg(st == CLG_ERR_INVALID_ARG, "CLGRAD_DEVICES=\"\" accepted (status %d)", (int)st);
    ck_assert_ptr_null(ctx);
    ck_assert_ptr_nonnull(strstr(clg_last_error(NULL), "CLGRAD_DEVICES"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("device");
    TCase *tc = tcase_create("device");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, enumerate_fills_info);
    tcase_add_test(tc, selectors);
    tcase_add_test(tc, two_devices);
    tcase_add_test(tc, public_info_api);
    tcase_add_test(tc, bad_selector_context);
    tcase_add_test(tc, pocl_detection);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
