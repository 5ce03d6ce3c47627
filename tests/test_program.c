/* program: JIT build, in-memory reuse, on-disk binary cache (hit, corrupt
 * entry, disabled, unwritable dir), build failures with their log. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static char cache_dir[64];

static int count_entries(const char *dir, char *first, size_t n)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int c = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".clbin") && !strstr(e->d_name, ".tmp")) {
            if (c == 0 && first)
                snprintf(first, n, "%s/%s", dir, e->d_name);
            c++;
        }
    closedir(d);
    return c;
}

/* A uniquely-optioned program so no earlier run of any test shares it. */
static void unique_opts(char *buf, size_t n)
{
    snprintf(buf, n, "-D CLG_TEST_SALT=%llu", (unsigned long long)tu_seed());
}

static double build_once_on(const char *dir, int use_cache, const char *opts, clg_program_stats *stats,
                            const char *devices, int dev);

static double build_once(const char *dir, int use_cache, const char *opts, clg_program_stats *stats)
{
    return build_once_on(dir, use_cache, opts, stats, "0", 0);
}

/* The program built (or loaded) for device dev of a context on `devices`. */
static double build_once_on(const char *dir, int use_cache, const char *opts, clg_program_stats *stats,
                            const char *devices, int dev)
{
    clg_ctx_params p;
    clg_ctx_params_init(&p);
    p.devices = devices;
    p.cache_dir = dir;
    p.use_cache = use_cache;
    clg_ctx *ctx = NULL;
    clg_status st = clg_ctx_create(&p, &ctx);
    if (st == CLG_ERR_NO_DEVICE)
        exit(TU_SKIP);
    ck_assert_int_eq(st, CLG_OK);
    if (dev >= ctx->ndev) {
        fprintf(stderr, "one device only: the shared-context case is not run\n");
        clg_ctx_destroy(ctx);
        memset(stats, 0, sizeof *stats);
        return -1;
    }
    cl_kernel k = NULL;
    double t0 = clg_now_sec();
    ck_assert_int_eq(clg_kernel_get(&ctx->devs[dev], "gemm", opts, "gemm_ref", &k), CLG_OK);
    double dt = clg_now_sec() - t0;
    ck_assert_ptr_nonnull(k);
    /* second request is served from memory */
    cl_kernel k2 = NULL;
    ck_assert_int_eq(clg_kernel_get(&ctx->devs[dev], "gemm", opts, "gemm_ref", &k2), CLG_OK);
    ck_assert_ptr_eq(k, k2);
    /* a binary-loaded program is executable: query its kernel's work-group size */
    size_t wg = 0;
    ck_assert_int_eq(clGetKernelWorkGroupInfo(k, ctx->devs[dev].id, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL),
                     CL_SUCCESS);
    ck_assert_uint_gt(wg, 0);
    *stats = ctx->prog_stats;
    clg_ctx_destroy(ctx);
    return dt;
}

START_TEST(cache_hit_on_second_run)
{
    char opts[64];
    unique_opts(opts, sizeof opts);
    clg_program_stats s1, s2;
    double cold = build_once(cache_dir, 1, opts, &s1);
    ck_assert_int_ge(s1.built, 1);
    ck_assert_int_eq(s1.cache_loaded, 0);
    ck_assert_int_ge(count_entries(cache_dir, NULL, 0), 1);
    double warm = build_once(cache_dir, 1, opts, &s2);
    ck_assert_int_eq(s2.built, 0); /* no compilation at all on the second run */
    ck_assert_int_ge(s2.cache_loaded, 1);
    fprintf(stderr, "program 'gemm' build: cold %.1f ms, warm (binary cache) %.1f ms\n", cold * 1e3, warm * 1e3);
}
END_TEST

/* The second device of a shared context (PoCL 3.1 lists a program's binary
 * sizes for the built device only, the devices for the whole context):
 * its entry is written, and loaded by the next run. */
START_TEST(cache_hit_on_second_device)
{
    char opts[80];
    unique_opts(opts, sizeof opts);
    strncat(opts, " -D CLG_TEST_DEV=1", sizeof opts - strlen(opts) - 1);
    clg_program_stats s1, s2;
    if (build_once_on(cache_dir, 1, opts, &s1, "all", 1) < 0)
        return;
    ck_assert_int_ge(s1.built, 1);
    ck_assert_int_eq(s1.cache_loaded, 0);
    build_once_on(cache_dir, 1, opts, &s2, "all", 1);
    ck_assert_int_eq(s2.built, 0);
    ck_assert_int_ge(s2.cache_loaded, 1);
}
END_TEST

START_TEST(corrupt_entry_is_rebuilt)
{
    char dir[] = "/tmp/clg_cache_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char opts[64];
    unique_opts(opts, sizeof opts);
    clg_program_stats s;
    build_once(dir, 1, opts, &s);
    char path[512];
    ck_assert_int_eq(count_entries(dir, path, sizeof path), 1);
    /* flip one byte in the payload */
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 100, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 100, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
    build_once(dir, 1, opts, &s);
    ck_assert_int_eq(s.cache_rejected, 1);
    ck_assert_int_eq(s.built, 1);
    /* the rebuilt entry replaced the corrupt one and loads again */
    build_once(dir, 1, opts, &s);
    ck_assert_int_eq(s.built, 0);
    ck_assert_int_eq(s.cache_loaded, 1);
    /* truncated to a few bytes: ignored too */
    ck_assert_int_eq(truncate(path, 10), 0);
    build_once(dir, 1, opts, &s);
    ck_assert_int_eq(s.cache_rejected, 1);
    ck_assert_int_eq(s.built, 1);
    unlink(path);
    rmdir(dir);
}
END_TEST

START_TEST(cache_off_and_unwritable)
{
    char opts[64];
    unique_opts(opts, sizeof opts);
    clg_program_stats s;
    char dir[] = "/tmp/clg_cache_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    build_once(dir, 0, opts, &s);
    ck_assert_int_eq(s.built, 1);
    ck_assert_int_eq(count_entries(dir, NULL, 0), 0);
    /* CLGRAD_CACHE=0 turns it off as well */
    setenv("CLGRAD_CACHE", "0", 1);
    build_once(dir, 1, opts, &s);
    unsetenv("CLGRAD_CACHE");
    ck_assert_int_eq(s.built, 1);
    ck_assert_int_eq(count_entries(dir, NULL, 0), 0);
    rmdir(dir);
    /* a cache directory that cannot exist (under a regular file): the run
     * still works, it just does not cache */
    build_once("/dev/null/clgrad-cache", 1, opts, &s);
    ck_assert_int_eq(s.built, 1);
}
END_TEST

START_TEST(options_are_part_of_the_key)
{
    char dir[] = "/tmp/clg_cache_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char o1[64], o2[80];
    unique_opts(o1, sizeof o1);
    snprintf(o2, sizeof o2, "%s -D OTHER=1", o1);
    clg_program_stats s;
    build_once(dir, 1, o1, &s);
    build_once(dir, 1, o2, &s);
    ck_assert_int_eq(s.built, 1);
    ck_assert_int_eq(count_entries(dir, NULL, 0), 2);
    char path[512];
    while (count_entries(dir, path, sizeof path) > 0)
        unlink(path);
    rmdir(dir);
}
END_TEST

/* The policy of src/device/program.c binary_cache_mode: CLGRAD_BINARY_CACHE=0
 * writes no entry; by default PoCL's entry is written at context destruction
 * (not at build, where PoCL would compile every kernel of the program first),
 * other drivers' at build. */
START_TEST(binary_cache_policy)
{
    char dir[] = "/tmp/clg_cache_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char opts[64];
    unique_opts(opts, sizeof opts);
    clg_program_stats s;
    setenv("CLGRAD_BINARY_CACHE", "0", 1);
    build_once(dir, 1, opts, &s);
    ck_assert_int_eq(s.built, 1);
    ck_assert_int_eq(count_entries(dir, NULL, 0), 0);
    unsetenv("CLGRAD_BINARY_CACHE");
    clg_ctx_params p;
    clg_ctx_params_init(&p);
    p.devices = "0";
    p.cache_dir = dir;
    clg_ctx *ctx = NULL;
    ck_assert_int_eq(clg_ctx_create(&p, &ctx), CLG_OK);
    int pocl = strstr(ctx->devs[0].info.platform, "Portable Computing Language") != NULL ||
               strstr(ctx->devs[0].info.device_version, "PoCL") != NULL;
    cl_kernel k = NULL;
    ck_assert_int_eq(clg_kernel_get(&ctx->devs[0], "gemm", opts, "gemm_ref", &k), CLG_OK);
    ck_assert_int_eq(count_entries(dir, NULL, 0), pocl ? 0 : 1); /* PoCL: not yet */
    clg_ctx_destroy(ctx);
    ck_assert_int_eq(count_entries(dir, NULL, 0), 1);
    /* and the next context loads it */
    setenv("CLGRAD_BINARY_CACHE", "", 1);
    build_once(dir, 1, opts, &s);
    ck_assert_int_eq(s.built, 0);
    ck_assert_int_eq(s.cache_loaded, 1);
    setenv("CLGRAD_BINARY_CACHE", "1", 1);
    char path[512];
    while (count_entries(dir, path, sizeof path) > 0)
        unlink(path);
    rmdir(dir);
}
END_TEST

/* A one-device context that reads kernel sources from kdir, no binary cache. */
static clg_ctx *kernel_dir_ctx(const char *kdir)
{
    clg_ctx_params p;
    clg_ctx_params_init(&p);
    p.devices = "0";
    p.kernel_dir = kdir;
    p.use_cache = 0;
    clg_ctx *ctx = NULL;
    ck_assert_int_eq(clg_ctx_create(&p, &ctx), CLG_OK);
    return ctx;
}

START_TEST(build_failure_reports_log)
{
    char kdir[] = "/tmp/clg_kdir_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(kdir));
    char path[256];
    snprintf(path, sizeof path, "%s/broken.cl", kdir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("__kernel void k(__global float *x) { x[0] = undefined_symbol_42; }\n", f);
    fclose(f);
    clg_ctx *ctx = kernel_dir_ctx(kdir);
    cl_program prog = NULL;
    ck_assert_int_eq(clg_program_get(&ctx->devs[0], "broken", "", &prog), CLG_ERR_BUILD);
    ck_assert_ptr_null(prog);
    const char *msg = clg_last_error(ctx);
    ck_assert_ptr_nonnull(strstr(msg, "broken"));
    ck_assert_ptr_nonnull(strstr(msg, "undefined_symbol_42")); /* the compiler's log reached us */
    /* the override dir falls back to embedded sources for other programs */
    ck_assert_int_eq(clg_program_get(&ctx->devs[0], "gemm", "", &prog), CLG_OK);
    /* unknown program and unknown kernel */
    ck_assert_int_eq(clg_program_get(&ctx->devs[0], "no_such_program", "", &prog), CLG_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "no_such_program"));
    cl_kernel k = NULL;
    ck_assert_int_eq(clg_kernel_get(&ctx->devs[0], "gemm", "", "no_such_kernel", &k), CLG_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "no_such_kernel"));
    /* bad build options are a build error, not a crash */
    ck_assert_int_eq(clg_program_get(&ctx->devs[0], "gemm", "-D", &prog), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "without an argument"));
    ck_assert_int_eq(clg_program_get(&ctx->devs[0], "gemm", "-cl-no-such-option", &prog) == CLG_OK, 0);
    clg_ctx_destroy(ctx);
    unlink(path);
    rmdir(kdir);
}
END_TEST

/* A CLGRAD_KERNEL_DIR program's `#include "NAME"` lines take NAME from the same
 * folder (as tools/embed_cl.py splices cl/gelu.h into the embedded copies); a
 * missing one is an error naming it, not a silent fall-back to the embedded copy. */
START_TEST(kernel_dir_includes)
{
    char kdir[] = "/tmp/clg_kdir_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(kdir));
    char p1[256], p2[256], p3[256];
    snprintf(p1, sizeof p1, "%s/snip.h", kdir);
    snprintf(p2, sizeof p2, "%s/uses.cl", kdir);
    snprintf(p3, sizeof p3, "%s/lacks.cl", kdir);
    FILE *f = fopen(p1, "w");
    ck_assert_ptr_nonnull(f);
    fputs("#define SNIP_VALUE 42.5f\n", f);
    fclose(f);
    f = fopen(p2, "w");
    ck_assert_ptr_nonnull(f);
    fputs("// a comment naming #include \"snip.h\" is left alone\n#include \"snip.h\"\n"
          "__kernel void k(__global float *x) { x[0] = SNIP_VALUE; }\n", f);
    fclose(f);
    f = fopen(p3, "w");
    ck_assert_ptr_nonnull(f);
    fputs("#include \"absent.h\"\n__kernel void k(__global float *x) { x[0] = 1.0f; }\n", f);
    fclose(f);
    clg_ctx *ctx = kernel_dir_ctx(kdir);
    clg_device *dev = &ctx->devs[0];
    cl_kernel k = NULL;
    ck_assert_int_eq(clg_kernel_get(dev, "uses", "", "k", &k), CLG_OK);
    cl_int e;
    cl_mem buf = clCreateBuffer(dev->cl, CL_MEM_READ_WRITE, sizeof(float), NULL, &e);
    ck_assert_int_eq(e, CL_SUCCESS);
    ck_assert_int_eq(clSetKernelArg(k, 0, sizeof buf, &buf), CL_SUCCESS);
    size_t g = 1;
    ck_assert_int_eq(clEnqueueNDRangeKernel(dev->queue, k, 1, NULL, &g, NULL, 0, NULL, NULL), CL_SUCCESS);
    float v = 0.0f;
    ck_assert_int_eq(clEnqueueReadBuffer(dev->queue, buf, CL_TRUE, 0, sizeof v, &v, 0, NULL, NULL), CL_SUCCESS);
    ck_assert(v == 42.5f);
    clReleaseMemObject(buf);
    cl_program prog = NULL;
    ck_assert_int_eq(clg_program_get(dev, "lacks", "", &prog), CLG_ERR_IO);
    ck_assert_ptr_nonnull(strstr(clg_last_error(ctx), "absent.h"));
    clg_ctx_destroy(ctx);
    unlink(p1);
    unlink(p2);
    unlink(p3);
    rmdir(kdir);
}
END_TEST

int main(void)
{
    snprintf(cache_dir, sizeof cache_dir, "/tmp/clg_cache_main_XXXXXX");
    if (!mkdtemp(cache_dir))
        return 1;
    /* the binary-cache tests need our cache on, also on PoCL where it is off
     * by default (binary_cache_on in src/device/program.c) */
    setenv("CLGRAD_BINARY_CACHE", "1", 1);
    Suite *s = suite_create("program");
    TCase *tc = tcase_create("program");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, cache_hit_on_second_run);
    tcase_add_test(tc, cache_hit_on_second_device);
    tcase_add_test(tc, corrupt_entry_is_rebuilt);
    tcase_add_test(tc, cache_off_and_unwritable);
    tcase_add_test(tc, options_are_part_of_the_key);
    tcase_add_test(tc, binary_cache_policy);
    tcase_add_test(tc, build_failure_reports_log);
    tcase_add_test(tc, kernel_dir_includes);
    suite_add_tcase(s, tc);
    int rc = tu_run(s);
    char path[512];
    while (count_entries(cache_dir, path, sizeof path) > 0)
        unlink(path);
    rmdir(cache_dir);
    return rc;
}
