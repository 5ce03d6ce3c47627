/* Shipped tuning families (data/tune-families.json, src/ops/tune_family.c):
 * the embedded file parses; device descriptions of each class pick the
 * intended family (and an unknown GPU none); every entry of a family is a
 * valid parameter set under that family's published limits; malformed text
 * is refused; and on the test device the lookup order holds: own
 * measurements > family entry > built-in defaults, with a GEMM run on the
 * family's parameters matching a double-precision reference; the tuner
 * records the defaults' and the family's figures (clg_gemm_tuning_get). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/gemm.h"
#include "ops/tune.h"
#include "testutil.h"

typedef struct fake {
    const char *name, *vendor, *platform;
    clg_device_type type;
    unsigned long long lmem;
    size_t maxwg;
    const char *want; /* family, "" none */
} fake;

static const fake fakes[] = {
    {"pthread-skylake-avx512-Intel(R) Xeon(R) Gold 6338", "GenuineIntel", "Portable Computing Language",
     CLG_DEVICE_CPU, 4 << 20, 4096, "pocl-cpu-avx512-intel"},
    {"pthread-sapphirerapids-Intel(R) Xeon(R) Processor", "GenuineIntel", "Portable Computing Language",
     CLG_DEVICE_CPU, 4 << 20, 4096, "pocl-cpu-avx512-intel"},
    {"cpu-znver4-AMD EPYC 9654", "AuthenticAMD", "Portable Computing Language", CLG_DEVICE_CPU, 1 << 20, 4096,
     "pocl-cpu-avx512"},
    {"pthread-haswell-Intel(R) Core(TM) i7-4770", "GenuineIntel", "Portable Computing Language", CLG_DEVICE_CPU,
     1 << 20, 4096, "pocl-cpu-avx2"},
    {"cpu-znver3-AMD Ryzen 9 5950X", "AuthenticAMD", "Portable Computing Language", CLG_DEVICE_CPU, 1 << 20, 4096,
     "pocl-cpu-avx2"},
    {"NVIDIA H100 80GB HBM3", "NVIDIA Corporation", "NVIDIA CUDA", CLG_DEVICE_GPU, 48 << 10, 1024, "nvidia-sm90"},
    {"NVIDIA A100-SXM4-40GB", "NVIDIA Corporation", "NVIDIA CUDA", CLG_DEVICE_GPU, 48 << 10, 1024, "nvidia-sm80"},
    {"NVIDIA GeForce RTX 3090", "NVIDIA Corporation", "NVIDIA CUDA", CLG_DEVICE_GPU, 48 << 10, 1024, "nvidia-sm80"},
    {"gfx90a:sramecc+:xnack-", "Advanced Micro Devices, Inc.", "AMD Accelerated Parallel Processing",
     CLG_DEVICE_GPU, 64 << 10, 256, "amd-gfx9"},
    {"gfx1030", "Advanced Micro Devices, Inc.", "AMD Accelerated Parallel Processing", CLG_DEVICE_GPU, 64 << 10,
     1024, "amd-gfx10"},
    {"gfx1100", "Advanced Micro Devices, Inc.", "AMD Accelerated Parallel Processing", CLG_DEVICE_GPU, 64 << 10,
     1024, "amd-gfx11"},
    {"Intel(R) Arc(TM) A770 Graphics", "Intel(R) Corporation", "Intel(R) OpenCL Graphics", CLG_DEVICE_GPU, 64 << 10,
     1024, "intel-xe"},
    {"Intel(R) Iris(R) Xe Graphics", "Intel(R) Corporation", "Intel(R) OpenCL Graphics", CLG_DEVICE_GPU, 64 << 10,
     512, "intel-xe"},
    {"Mali-G78", "ARM", "ARM Platform", CLG_DEVICE_GPU, 32 << 10, 512, ""},
    {"cpu-generic-ARM Neoverse", "ARM", "Portable Computing Language", CLG_DEVICE_CPU, 1 << 20, 4096, ""},
};

static void fake_dev(clg_device *d, const fake *f)
{
    memset(d, 0, sizeof *d);
    snprintf(d->info.name, sizeof d->info.name, "%s", f->name);
    snprintf(d->info.vendor, sizeof d->info.vendor, "%s", f->vendor);
    snprintf(d->info.platform, sizeof d->info.platform, "%s", f->platform);
    d->info.type = f->type;
    d->info.local_mem_bytes = f->lmem;
    d->info.max_work_group_size = f->maxwg;
    d->info.compute_units = 8;
    d->max_item[0] = d->max_item[1] = d->max_item[2] = f->maxwg;
}

START_TEST(families_match)
{
    const char *text = clg_embedded_source("tune-families");
    ck_assert_ptr_nonnull(text);
    for (size_t i = 0; i < sizeof fakes / sizeof fakes[0]; i++) {
        clg_device d;
        fake_dev(&d, &fakes[i]);
        clg_tune_family f;
        memset(&f, 0, sizeof f);
        int idx = -2;
        clg_err err = {0};
        ck_assert_msg(clg_tune_family_match(&err, text, &d, &f, &idx) == CLG_OK, "%s", err.msg);
        ck_assert_msg(strcmp(f.name, fakes[i].want) == 0, "%s: family '%s', expected '%s'", fakes[i].name, f.name,
                      fakes[i].want);
        ck_assert(fakes[i].want[0] ? idx >= 0 && f.d.n > 0 : idx == -1 && f.d.n == 0);
        /* every entry runs under the family's limits */
        for (int e = 0; e < f.d.n; e++) {
            clg_gemm_params p;
            ck_assert_msg(clg_gemm_params_from_entry(&f.d.e[e], &p), "%s %s: no parameters", f.name, f.d.e[e].key);
            ck_assert_msg(clg_gemm_params_check(&d, &p) == CLG_OK, "%s %s on %s: %s", f.name, f.d.e[e].key,
                          fakes[i].name, d.err.msg);
            int m, n, k;
            ck_assert_msg(sscanf(f.d.e[e].key, "gemm/M%dN%dK%d", &m, &n, &k) == 3, "key %s", f.d.e[e].key);
        }
        if (fakes[i].want[0])
            ck_assert(f.measured ==
                      (strcmp(f.name, "pocl-cpu-avx512") == 0 || strcmp(f.name, "pocl-cpu-avx512-intel") == 0));
        clg_tune_dev_clear(&f.d);
    }
    /* malformed text and a wrong format are refused, leaving no family */
    static const char *const bad[] = {"{", "[]", "{\"format\": \"clgrad-tune\", \"families\": []}",
                                      "{\"format\": \"clgrad-tune-families\", \"families\": [{\"name\": \"x\", "
                                      "\"match\": {}, \"entries\": {\"gemm/M1N1K1\": 3}}]}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        clg_device d;
        fake_dev(&d, &fakes[0]);
        clg_tune_family f;
        memset(&f, 0, sizeof f);
        int idx;
        clg_err err = {0};
        ck_assert_msg(clg_tune_family_match(&err, bad[i], &d, &f, &idx) != CLG_OK, "accepted: %s", bad[i]);
        ck_assert(f.name[0] == 0 && f.d.n == 0 && idx == -1);
        clg_tune_dev_clear(&f.d);
    }
}
END_TEST

static void match_text(const char *text, const fake *fk, clg_tune_family *f, int *idx, clg_err *err, clg_status *st)
{
    clg_device d;
    fake_dev(&d, fk);
    memset(f, 0, sizeof *f);
    memset(err, 0, sizeof *err);
    *idx = -2;
    *st = clg_tune_family_match(err, text, &d, f, idx);
}

/* The shipped file resolves for AMD and Intel AVX-512 CPUs what it listed
 * before inheritance: the Intel family (base pocl-cpu-avx512) has the AMD
 * family's entries, in the same order, except the large square class; and
 * the parameters that replaced the vendor checks in gemm.c (rows_large:
 * Intel from 1024, AMD off) and layer_dense.c (dx by gemm_rows up to 64
 * rows on AMD, off on Intel). Other families set none of them. */
START_TEST(families_inherit_shipped)
{
    const char *text = clg_embedded_source("tune-families");
    ck_assert_ptr_nonnull(text);
    clg_tune_family amd, intel, spr, avx2;
    int idx;
    clg_err err;
    clg_status st;
    match_text(text, &fakes[2], &amd, &idx, &err, &st);
    ck_assert_msg(st == CLG_OK && strcmp(amd.name, "pocl-cpu-avx512") == 0, "%s", err.msg);
    match_text(text, &fakes[0], &intel, &idx, &err, &st);
    ck_assert_msg(st == CLG_OK && strcmp(intel.name, "pocl-cpu-avx512-intel") == 0, "%s", err.msg);
    match_text(text, &fakes[1], &spr, &idx, &err, &st);
    ck_assert_msg(st == CLG_OK && strcmp(spr.name, "pocl-cpu-avx512-intel") == 0, "%s", err.msg);
    match_text(text, &fakes[3], &avx2, &idx, &err, &st);
    ck_assert_msg(st == CLG_OK && strcmp(avx2.name, "pocl-cpu-avx2") == 0, "%s", err.msg);
    ck_assert_int_eq(amd.d.n, 24);
    ck_assert_int_eq(intel.d.n, amd.d.n);
    ck_assert_int_eq(spr.d.n, amd.d.n);
    ck_assert(intel.measured && amd.measured);
    for (int i = 0; i < amd.d.n; i++) {
        const clg_tune_entry *a = &amd.d.e[i], *e = &intel.d.e[i];
        ck_assert_str_eq(a->key, e->key);
        ck_assert(memcmp(e, &spr.d.e[i], sizeof *e) == 0);
        if (strcmp(a->key, "gemm/M4N4K4") != 0) {
            ck_assert_msg(memcmp(a, e, sizeof *a) == 0, "%s differs between the AMD and Intel families", a->key);
            continue;
        }
        clg_gemm_params p;
        ck_assert(clg_gemm_params_from_entry(e, &p));
        ck_assert(p.family == CLG_GEMM_FAM_CPU && p.MR == 6 && p.NV == 4 && p.VW == 16 && p.WGS == 1 && p.KS == 0);
        ck_assert(clg_gemm_params_from_entry(a, &p));
        ck_assert(p.family == CLG_GEMM_FAM_CPU && p.MR == 8 && p.NV == 2 && p.VW == 16 && p.WGS == 1 && p.KS == 0);
    }
    ck_assert(clg_tune_family_pget(&intel, "gemm_rows_large", -1) == 1024);
    ck_assert(clg_tune_family_pget(&spr, "gemm_rows_large", -1) == 1024);
    ck_assert(clg_tune_family_pget(&amd, "gemm_rows_large", -1) == 0);
    ck_assert(clg_tune_family_pget(&intel, "dense_dx_rows", -1) == 0);
    ck_assert(clg_tune_family_pget(&amd, "dense_dx_rows", -1) == 64);
    ck_assert(clg_tune_family_pget(&avx2, "gemm_rows_large", -1) == -1);
    ck_assert(clg_tune_family_pget(&avx2, "dense_dx_rows", -1) == -1);
    ck_assert(clg_tune_family_pget(NULL, "dense_dx_rows", -3) == -3);
    clg_tune_dev_clear(&amd.d);
    clg_tune_dev_clear(&intel.d);
    clg_tune_dev_clear(&spr.d);
    clg_tune_dev_clear(&avx2.d);
}
END_TEST

/* Inheritance over two levels on a file of random values: the matching
 * family "a" (base "b", whose base "c" matches no device) has c's entries,
 * then b's, then its own, each replacing the earlier one of its key in
 * place; params likewise by name. Then malformed families anywhere in the
 * file (not only the matching one) are refused with a message naming the
 * fault, leaving no family. */
START_TEST(families_inherit_errors)
{
    clg_rng r;
    tu_rng(&r, 11);
    int v[6];
    for (int i = 0; i < 6; i++)
        v[i] = 1 + (int)(clg_rng_u32(&r) % 1000);
    char text[2048];
    snprintf(text, sizeof text,
             "{\"format\": \"clgrad-tune-families\", \"families\": ["
             "{\"name\": \"a\", \"base\": \"b\", \"match\": {\"type\": \"cpu\"}, "
             " \"params\": {\"gemm_rows_large\": %d}, \"entries\": {\"gemm/M2N2K2\": {\"MR\": %d}}},"
             "{\"name\": \"b\", \"base\": \"c\", \"match\": {\"type\": \"gpu\"}, "
             " \"entries\": {\"gemm/M2N2K2\": {\"MR\": 99, \"NV\": 3}, \"gemm/M1N1K1\": {\"MR\": %d}}},"
             "{\"name\": \"c\", \"params\": {\"gemm_rows_large\": 5, \"dense_dx_rows\": %d}, "
             " \"entries\": {\"gemm/M4N4K4\": {\"MR\": %d}, \"gemm/M1N1K1\": {\"MR\": %d, \"VW\": 4}}}]}",
             v[0], v[1], v[2], v[3], v[4], v[5]);
    clg_tune_family f;
    int idx;
    clg_err err;
    clg_status st;
    match_text(text, &fakes[0], &f, &idx, &err, &st);
    ck_assert_msg(st == CLG_OK, "%s", err.msg);
    ck_assert_str_eq(f.name, "a");
    ck_assert_int_eq(idx, 0);
    ck_assert(!f.measured);
    ck_assert_int_eq(f.d.n, 3);
    ck_assert_str_eq(f.d.e[0].key, "gemm/M4N4K4");
    ck_assert_str_eq(f.d.e[1].key, "gemm/M1N1K1");
    ck_assert_str_eq(f.d.e[2].key, "gemm/M2N2K2");
    ck_assert(clg_tune_param(&f.d.e[0], "MR", -1) == v[4]);
    ck_assert(clg_tune_param(&f.d.e[1], "MR", -1) == v[2]);
    ck_assert(clg_tune_param(&f.d.e[1], "VW", -1) == -1); /* replaced whole, not merged */
    ck_assert(clg_tune_param(&f.d.e[2], "MR", -1) == v[1]);
    ck_assert(clg_tune_param(&f.d.e[2], "NV", -1) == -1);
    ck_assert(clg_tune_family_pget(&f, "gemm_rows_large", -1) == v[0]);
    ck_assert(clg_tune_family_pget(&f, "dense_dx_rows", -1) == v[3]);
    clg_tune_dev_clear(&f.d);
    /* a GPU matches "b": c's entries under b's, none of a's */
    fake gpu = fakes[5];
    match_text(text, &gpu, &f, &idx, &err, &st);
    ck_assert_msg(st == CLG_OK, "%s", err.msg);
    ck_assert_str_eq(f.name, "b");
    ck_assert_int_eq(f.d.n, 3);
    ck_assert(clg_tune_param(&f.d.e[2], "MR", -1) == 99);
    ck_assert(clg_tune_family_pget(&f, "gemm_rows_large", -1) == 5);
    clg_tune_dev_clear(&f.d);

#define FAM(body) "{\"format\": \"clgrad-tune-families\", \"families\": [" body "]}"
#define CPU_A "{\"name\": \"a\", \"match\": {\"type\": \"cpu\"}, \"entries\": {\"gemm/M1N1K1\": {\"MR\": 4}}}"
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {FAM("{\"name\": \"x\", \"base\": \"nope\", \"match\": {\"type\": \"cpu\"}, \"entries\": {}}"),
         "base 'nope' is not a family"},
        {FAM("{\"name\": \"x\", \"base\": \"x\", \"match\": {\"type\": \"cpu\"}, \"entries\": {}}"), "cycle"},
        {FAM("{\"name\": \"x\", \"base\": \"y\", \"match\": {\"type\": \"cpu\"}, \"entries\": {}},"
             "{\"name\": \"y\", \"base\": \"x\", \"entries\": {}}"),
         "cycle"},
        /* faults in families this device does not match */
        {FAM(CPU_A ", {\"name\": \"p\", \"base\": \"q\"}, {\"name\": \"q\", \"base\": \"r\"},"
                   "{\"name\": \"r\", \"base\": \"q\"}"),
         "cycle"},
        {FAM(CPU_A ", {\"name\": \"g\", \"base\": \"gone\", \"match\": {\"type\": \"gpu\"}}"), "base 'gone'"},
        {FAM(CPU_A ", {\"name\": \"g\", \"base\": 3}"), "\"base\" is not a family name"},
        {FAM(CPU_A ", {\"name\": \"g\", \"params\": [1], \"entries\": {}}"), "\"params\" is not an object"},
        {FAM(CPU_A ", {\"name\": \"g\", \"params\": {\"dense_dx_rows\": \"64\"}, \"entries\": {}}"),
         "'dense_dx_rows' is not a number"},
        {FAM(CPU_A ", {\"name\": \"g\", \"params\": {\"gemm_rows_larg\": 1024}, \"entries\": {}}"),
         "unknown parameter 'gemm_rows_larg'"},
        {FAM(CPU_A ", {\"base\": \"a\"}"), "family 2 is not an object with a \"name\""},
        {FAM("{\"name\": \"x\", \"match\": {\"type\": \"cpu\"}, \"params\": {\"dense_dx_rows\": 1}}"),
         "neither \"entries\" nor a \"base\""},
    };
#undef FAM
#undef CPU_A
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        match_text(bad[i].text, &fakes[0], &f, &idx, &err, &st);
        ck_assert_msg(st == CLG_ERR_FORMAT, "accepted: %s", bad[i].text);
        ck_assert_msg(strstr(err.msg, bad[i].msg) != NULL, "message '%s' lacks '%s'", err.msg, bad[i].msg);
        ck_assert(f.name[0] == 0 && f.d.n == 0 && f.nparams == 0 && idx == -1);
        clg_tune_dev_clear(&f.d);
    }
}
END_TEST

/* C = op(A) * op(B) on the device with parameter set p against a double
 * reference (ta: A stored K x M, tb: B stored N x K); C starts as NaN. The
 * worst error relative to the sum of the products' magnitudes. */
static double gemm_err_t(clg_device *dev, const clg_gemm_params *p, int M, int N, int K, int ta, int tb)
{
    clg_rng r;
    tu_rng(&r, 7 + 2 * ta + tb);
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N), *C = malloc(sizeof(float) * M * N);
    tu_fill(A, (size_t)M * K, -1, 1, &r);
    tu_fill(B, (size_t)K * N, -1, 1, &r);
    for (size_t i = 0; i < (size_t)M * N; i++)
        C[i] = NAN;
    clg_gemm_args a;
    clg_gemm_args_init(&a);
    a.M = M, a.N = N, a.K = K, a.ta = ta, a.tb = tb, a.lda = ta ? M : K, a.ldb = tb ? K : N, a.ldc = N;
    a.A = tu_upload(dev, A, (size_t)M * K);
    a.B = tu_upload(dev, B, (size_t)K * N);
    a.C = tu_upload(dev, C, (size_t)M * N);
    ck_assert_msg(clg_gemm_run(dev, &a, CLG_GEMM_OWN, p, NULL, NULL) == CLG_OK, "%s", dev->err.msg);
    tu_download(dev, a.C, C, (size_t)M * N);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                double x = ta ? A[k * M + i] : A[i * K + k], y = tb ? B[j * K + k] : B[k * N + j];
                s += x * y;
                sa += fabs(x * y);
            }
            double e = fabs(C[i * N + j] - s) / (sa + 1e-30);
            worst = isfinite(C[i * N + j]) ? fmax(worst, e) : INFINITY;
        }
    clg_buf_release(dev, a.A);
    clg_buf_release(dev, a.B);
    clg_buf_release(dev, a.C);
    free(A);
    free(B);
    free(C);
    return worst;
}

static double gemm_err(clg_device *dev, const clg_gemm_params *p, int M, int N, int K)
{
    return gemm_err_t(dev, p, M, N, K, 0, 0);
}

START_TEST(lookup_order)
{
    char dir[512];
    snprintf(dir, sizeof dir, "/tmp/clgrad-tune-family-%d", (int)getpid());
    clg_ctx *ctx = tu_ctx_cache("0", dir);
    clg_device *dev = &ctx->devs[0];
    clg_gemm_params p, dp, own;
    clg_gemm_params_default(dev, &dp);
    clg_tune_family *f = clg_tune_family_get(dev);
    ck_assert_ptr_nonnull(f);
    int src = clg_gemm_params_src(dev, 600, 700, 500, &p);
    /* the device's family parameters through the accessor */
    ck_assert(clg_tune_family_param(dev, "gemm_rows_large", -5) == clg_tune_family_pget(f, "gemm_rows_large", -5));
    ck_assert(clg_tune_family_param(dev, "dense_dx_rows", -5) == clg_tune_family_pget(f, "dense_dx_rows", -5));
    ck_assert(f->name[0] || clg_tune_family_param(dev, "dense_dx_rows", -5) == -5);
    if (f->name[0]) {
        ck_assert_int_eq(src, CLG_GEMM_SRC_FAMILY);
        ck_assert_msg(gemm_err(dev, &p, 200, 300, 250) < 1e-5, "family parameters give a wrong product");
        /* the large square class's entry (pocl-cpu-avx512-intel: a 6 x 64 tile) on
         * odd sizes (partial row tiles and vectors) in each transpose */
        clg_gemm_params_src(dev, 2048, 2048, 2048, &p);
        for (int t = 0; t < 4; t++)
            ck_assert_msg(gemm_err_t(dev, &p, 203, 301, 259, t & 1, t >> 1) < 1e-5,
                          "large-class family parameters give a wrong product (ta %d tb %d)", t & 1, t >> 1);
        /* M, N, K >= 1024 on an Intel AVX-512 CPU: A read in place (gemm.c, rows_large), odd sizes */
        for (int tb = 0; tb < 2; tb++)
            ck_assert_msg(gemm_err_t(dev, &p, 1031, 1029, 1027, 0, tb) < 1e-5,
                          "large product with the family parameters wrong (tb %d)", tb);
    } else {
        ck_assert_int_eq(src, CLG_GEMM_SRC_DEFAULT);
        ck_assert(memcmp(&p, &dp, sizeof p) == 0);
    }
    /* no family: the built-in defaults */
    clg_tune_dev saved = f->d;
    memset(&f->d, 0, sizeof f->d);
    ck_assert_int_eq(clg_gemm_params_src(dev, 600, 700, 500, &p), CLG_GEMM_SRC_DEFAULT);
    ck_assert(memcmp(&p, &dp, sizeof p) == 0);
    f->d = saved;
    /* an own measurement wins over the family */
    memset(&own, 0, sizeof own);
    own.family = CLG_GEMM_FAM_CPU;
    own.MR = 4, own.NV = 1, own.VW = 4, own.WGS = 1;
    if (!(dev->info.type & CLG_DEVICE_CPU)) {
        own.family = CLG_GEMM_FAM_TILED;
        own.MWG = own.NWG = 16, own.KWG = 16, own.MDIMC = own.NDIMC = 4, own.VWM = own.VWN = 2;
    }
    clg_tune_entry e;
    memset(&e, 0, sizeof e);
    char cls[32];
    clg_gemm_class(600, 700, 500, cls, sizeof cls);
    snprintf(e.key, sizeof e.key, "gemm/%s", cls);
    clg_gemm_params_to_entry(&own, &e);
    ck_assert(clg_tune_put(dev, &e) == CLG_OK);
    ck_assert_int_eq(clg_gemm_params_src(dev, 600, 700, 500, &p), CLG_GEMM_SRC_OWN);
    ck_assert(p.MR == own.MR && p.family == own.family && p.MWG == own.MWG);
    /* pending shapes: the class above is measured now, another one is not */
    clg_gemm_params_for(dev, 600, 700, 500, &p);
    clg_gemm_params_for(dev, 3000, 20, 40, &p);
    int sh[4][3];
    int n = clg_tune_gemm_pending(ctx, 0, sh, 4);
    int found = 0;
    for (int i = 0; i < n && i < 4; i++) {
        ck_assert_msg(!(sh[i][0] == 600 && sh[i][1] == 700), "a measured class is pending");
        found |= sh[i][0] == 3000 && sh[i][1] == 20 && sh[i][2] == 40;
    }
    ck_assert_msg(found, "the untuned shape is not pending (%d pending)", n);
    /* the tuner stores the defaults' and the family's figures beside its own,
     * and clg_gemm_tuning_get reports them */
    static const int tiny[1][3] = {{96, 80, 64}};
    ck_assert_msg(clg_tune_gemm_shapes(ctx, 0, tiny, 1, 1, NULL, NULL) == CLG_OK, "%s", clg_last_error(ctx));
    clg_gemm_class(96, 80, 64, cls, sizeof cls);
    snprintf(e.key, sizeof e.key, "gemm/%s", cls);
    const clg_tune_entry *te = clg_tune_find(dev, e.key);
    ck_assert_ptr_nonnull(te);
    ck_assert(clg_tune_param(te, "gflops", 0) > 0 && clg_tune_param(te, "def_gflops", 0) > 0);
    ck_assert(!f->name[0] || clg_tune_param(te, "fam_gflops", 0) > 0);
    clg_gemm_tuning t;
    ck_assert(clg_gemm_tuning_get(ctx, 0, &t) == CLG_OK);
    ck_assert_int_eq(t.source, 2);
    ck_assert_int_eq(t.own_classes, 2);
    ck_assert_str_eq(t.ref_class, cls);
    ck_assert(t.ref_m == 96 && t.ref_n == 80 && t.ref_k == 64);
    ck_assert(t.tuned_gflops > 0 && t.default_gflops > 0);
    ck_assert_str_eq(t.family, f->name);
    ck_assert(clg_gemm_tuning_get(ctx, 5, &t) != CLG_OK);
    clg_ctx_destroy(ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* The GEMM stamp (what convolution choices record): 0 untuned, changed by
 * a class's parameters and by the backend choice of a tuned class, not by
 * figures, by the order of the entries or by the backend choice of an
 * untuned class. */
static clg_tune_entry stamp_entry(const char *key, double mr, double gflops, const char *backend)
{
    clg_tune_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.key, sizeof e.key, "%s", key);
    snprintf(e.backend, sizeof e.backend, "%s", backend);
    if (strncmp(key, "gemm/", 5) == 0) {
        clg_tune_set(&e, "family", CLG_GEMM_FAM_CPU);
        clg_tune_set(&e, "MR", mr);
    }
    clg_tune_set(&e, "gflops", gflops);
    return e;
}

static uint32_t stamp_of(clg_device *dev, const clg_tune_entry *es, int n)
{
    clg_tune_dev *d = clg_tune_dev_get(dev);
    ck_assert_ptr_nonnull(d);
    d->n = 0;
    for (int i = 0; i < n; i++)
        ck_assert(clg_tune_put(dev, &es[i]) == CLG_OK);
    return clg_tune_gemm_stamp(dev);
}

START_TEST(gemm_stamp)
{
    char dir[512];
    snprintf(dir, sizeof dir, "/tmp/clgrad-tune-stamp-%d", (int)getpid());
    clg_ctx *ctx = tu_ctx_cache("0", dir);
    clg_device *dev = &ctx->devs[0];
    clg_rng r;
    tu_rng(&r, 5);
    double mr = 1 + clg_rng_u32(&r) % 16, g = clg_rng_uniform(&r) * 100;
    clg_tune_entry a = stamp_entry("gemm/M1N2K3", mr, g, ""), b = stamp_entry("gemm/M4N4K4", 8, 50, ""),
                   ab = stamp_entry("gemm-auto/M4N4K4", 0, 0, "own"), au = stamp_entry("gemm-auto/M0N0K0", 0, 0, "own");
    clg_tune_entry e[4] = {a, b};
    uint32_t s0 = stamp_of(dev, e, 0);
    ck_assert_uint_eq(s0, 0);
    uint32_t s2 = stamp_of(dev, e, 2);
    ck_assert_uint_ne(s2, 0);
    clg_tune_entry rev[2] = {b, a};
    ck_assert_uint_eq(stamp_of(dev, rev, 2), s2);
    e[0] = stamp_entry("gemm/M1N2K3", mr, g * 2 + 1, ""); /* another figure: the same kernels */
    ck_assert_uint_eq(stamp_of(dev, e, 2), s2);
    e[0] = stamp_entry("gemm/M1N2K3", mr + 1, g, ""); /* another parameter */
    ck_assert_uint_ne(stamp_of(dev, e, 2), s2);
    e[0] = a;
    e[2] = au; /* the backend choice of an untuned class: recorded lazily, not counted */
    ck_assert_uint_eq(stamp_of(dev, e, 3), s2);
    e[2] = ab; /* ... of a tuned class: counted, and by its value */
    uint32_t s3 = stamp_of(dev, e, 3);
    ck_assert_uint_ne(s3, s2);
    e[2] = stamp_entry("gemm-auto/M4N4K4", 0, 0, "clblast");
    ck_assert_uint_ne(stamp_of(dev, e, 3), s3);
    clg_tune_dev_get(dev)->dirty = 0;
    clg_ctx_destroy(ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tune-family");
    TCase *tc = tcase_create("tune-family");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, families_match);
    tcase_add_test(tc, families_inherit_shipped);
    tcase_add_test(tc, families_inherit_errors);
    tcase_add_test(tc, lookup_order);
    tcase_add_test(tc, gemm_stamp);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
