/* Public calls for front ends (include/clgrad.h, "Front ends"): MPI jobs,
 * program statistics, tuning and precompiling, over the internal layers. */
#include <limits.h>
#include <string.h>

#include "device/device.h"
#include "ops/conv_impl.h"
#include "ops/gemm.h"
#include "ops/tune.h"
#include "ops/tune_gemm.h"
#include "parallel/comm.h"
#include "train/session.h"

// ---- files ----

clg_status clg_write_file_atomic(const char *path, const void *data, size_t len)
{
    if (!path || (!data && len))
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_write_file_atomic: path or data is NULL");
    return clg_file_write_atomic(NULL, path, data, len);
}

// ---- MPI ----

clg_status clg_mpi_init(const clg_options *opts) { return clg_comm_init(opts, clg_err_tls()); }

void clg_mpi_finalize(int exit_code) { clg_comm_finalize(exit_code); }

int clg_mpi_rank(void) { return clg_comm_rank(); }

int clg_mpi_size(void) { return clg_comm_size(); }

void clg_mpi_configure(double timeout_s, int deterministic) { clg_comm_configure(timeout_s, deterministic); }

const char *clg_mpi_algorithm(void) { return clg_comm_algorithm(); }

clg_status clg_mpi_barrier(void) { return clg_comm_barrier(NULL, "barrier"); }

clg_status clg_mpi_allreduce_f32(float *buf, size_t n)
{
    if (!buf && n)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_mpi_allreduce_f32: buf is NULL");
    return clg_comm_allreduce_f32(NULL, buf, n, "all-reduce");
}

clg_status clg_mpi_allreduce_f64(double *buf, size_t n)
{
    if ((!buf && n) || n > INT_MAX)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_mpi_allreduce_f64: buf is NULL or n (%zu) too large", n);
    return clg_comm_allreduce_f64(NULL, buf, (int)n, "all-reduce");
}

clg_status clg_mpi_pingpong(void *buf, size_t bytes, int reps, double *gbs)
{
    if (!buf || !gbs || reps < 1)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_mpi_pingpong: buf and gbs are required, reps >= 1");
    return clg_comm_pingpong(NULL, buf, bytes, reps, gbs);
}

// ---- programs ----

void clg_ctx_program_counts(const clg_ctx *ctx, int *built, int *cache_loaded)
{
    if (built)
        *built = ctx ? ctx->prog_stats.built : 0;
    if (cache_loaded)
        *cache_loaded = ctx ? ctx->prog_stats.cache_loaded : 0;
}

int clg_ctx_cache_warm(clg_ctx *ctx)
{
    if (!ctx || ctx->ndev < 1)
        return -1;
    return clg_program_cached(&ctx->devs[0], "eltwise", "");
}

// ---- tuning ----

clg_status clg_tune_gemm(clg_ctx *ctx, int device, int quick, int clblast, clg_progress_fn progress, void *user)
{
    if (!ctx)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_tune_gemm: context is NULL");
    if (device < 0 || device >= ctx->ndev)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "clg_tune_gemm: device %d out of range (the context has %d)",
                           device, ctx->ndev);
    clg_gemm_tune_opts o = {.quick = quick, .clblast = clblast, .progress = progress, .user = user};
    return clg_gemm_tune(&ctx->devs[device], &o);
}

static clg_status tune_dev_check(clg_ctx *ctx, int device, const char *what)
{
    if (!ctx)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "%s: context is NULL", what);
    if (device < 0 || device >= ctx->ndev)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "%s: device %d out of range (the context has %d)", what,
                           device, ctx->ndev);
    return CLG_OK;
}

clg_status clg_tune_gemm_shapes(clg_ctx *ctx, int device, const int (*shapes)[3], int n, int quick,
                                clg_progress_fn progress, void *user)
{
    CLG_TRY(tune_dev_check(ctx, device, "clg_tune_gemm_shapes"));
    if (!shapes || n < 1)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "clg_tune_gemm_shapes: no shapes given");
    for (int i = 0; i < n; i++)
        if (shapes[i][0] < 1 || shapes[i][1] < 1 || shapes[i][2] < 1)
            return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG,
                               "clg_tune_gemm_shapes: shape %d is %dx%dx%d (sizes >= 1)", i, shapes[i][0],
                               shapes[i][1], shapes[i][2]);
    clg_gemm_tune_opts o = {
        .quick = quick, .clblast = -1, .shapes = shapes, .nshapes = n, .progress = progress, .user = user};
    return clg_gemm_tune(&ctx->devs[device], &o);
}

int clg_conv_refresh_choices(clg_ctx *ctx, int device, int (*stop)(void *user), void *user)
{
    if (!ctx || device < 0 || device >= ctx->ndev)
        return 0;
    return clg_conv_auto_refresh(&ctx->devs[device], stop, user);
}

int clg_tune_gemm_pending(clg_ctx *ctx, int device, int (*shapes)[3], int max)
{
    if (!ctx || device < 0 || device >= ctx->ndev)
        return 0;
    clg_tune_family *f = clg_tune_family_get(&ctx->devs[device]);
    if (!f)
        return 0;
    for (int i = 0; shapes && i < CLG_MIN(max, f->npending); i++)
        memcpy(shapes[i], f->pending[i], sizeof shapes[i]);
    return f->npending;
}

/* The "gemm/" entry with a figure whose product is largest in its smallest
 * dimension (then in volume): the most GEMM-bound tuned class. */
static const clg_tune_entry *largest(const clg_tune_dev *d)
{
    const clg_tune_entry *be = NULL;
    double bmin = 0, bvol = 0;
    for (int i = 0; d && i < d->n; i++) {
        const clg_tune_entry *e = &d->e[i];
        double m = clg_tune_param(e, "M", 0), n = clg_tune_param(e, "N", 0), k = clg_tune_param(e, "K", 0);
        double mn = CLG_MIN(m, CLG_MIN(n, k)), vol = m * n * k;
        if (strncmp(e->key, "gemm/", 5) == 0 && clg_tune_param(e, "gflops", 0) > 0 &&
            (mn > bmin || (mn == bmin && vol > bvol))) {
            bmin = mn;
            bvol = vol;
            be = e;
        }
    }
    return be;
}

clg_status clg_gemm_tuning_get_size(clg_ctx *ctx, int device, clg_gemm_tuning *out, size_t size)
{
    CLG_TRY(tune_dev_check(ctx, device, "clg_gemm_tuning_get"));
    if (!out)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "clg_gemm_tuning_get: out is NULL");
    clg_device *dev = &ctx->devs[device];
    clg_gemm_tuning t;
    memset(&t, 0, sizeof t);
    clg_tune_dev *own = clg_tune_dev_get(dev);
    for (int i = 0; own && i < own->n; i++)
        t.own_classes += strncmp(own->e[i].key, "gemm/", 5) == 0;
    clg_tune_family *f = clg_tune_family_get(dev);
    if (f && f->name[0]) {
        snprintf(t.family, sizeof t.family, "%s", f->name);
        t.family_measured = f->measured;
    }
    t.source = t.own_classes ? 2 : t.family[0] ? 1 : 0;
    const clg_tune_entry *e = t.own_classes ? largest(own) : f ? largest(&f->d) : NULL;
    if (e) {
        snprintf(t.ref_class, sizeof t.ref_class, "%s", e->key + 5);
        t.ref_m = (int)clg_tune_param(e, "M", 0);
        t.ref_n = (int)clg_tune_param(e, "N", 0);
        t.ref_k = (int)clg_tune_param(e, "K", 0);
        t.tuned_gflops = clg_tune_param(e, "gflops", 0);
        t.default_gflops = clg_tune_param(e, "def_gflops", 0);
        t.family_gflops = t.own_classes ? clg_tune_param(e, "fam_gflops", 0) : 0;
    }
    clg_sized_write(out, size, &t, sizeof t);
    return CLG_OK;
}

// ---- precompiling ----

clg_status clg_model_precompile(clg_model *m, int reverse, int measure)
{
    if (!m)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_model_precompile: model is NULL");
    clg_status st = clg_session_precompile(m, reverse);
    if (st == CLG_OK && measure && clg_session_rep(m)->loss_index >= 0)
        st = clg_session_train_step(m, 0, 0.0, NULL);
    return st;
}

// ---- GEMM benchmarks ----

int clg_bench_gemm_dl_shapes(int batch, clg_bench_gemm_shape *out, int max)
{
    clg_gemm_shape list[64];
    int n = clg_gemm_dl_shapes(batch, list, (int)CLG_ARRAY_LEN(list));
    for (int i = 0; out && i < CLG_MIN(CLG_MIN(n, max), (int)CLG_ARRAY_LEN(list)); i++)
        out[i] = (clg_bench_gemm_shape){list[i].label, list[i].M, list[i].N, list[i].K, list[i].ta, list[i].tb,
                                        list[i].batch};
    return n;
}

int clg_have_clblast(void) { return clg_gemm_have_clblast(); }

static void gemm_args(const clg_bench_gemm_shape *s, clg_gemm_args *a)
{
    clg_gemm_args_init(a);
    a->M = s->m;
    a->N = s->n;
    a->K = s->k;
    a->ta = s->ta;
    a->tb = s->tb;
    a->batch = s->batch;
}

clg_status clg_bench_gemm_time(clg_ctx *ctx, int device, const clg_bench_gemm_shape *s, const char *backend,
                               int reps, double *ms)
{
    if (!ctx || !s || !backend || !ms || reps < 1)
        return clg_err_set(ctx ? &ctx->err : NULL, CLG_ERR_INVALID_ARG,
                           "clg_bench_gemm_time: context, shape, backend and ms are required, reps >= 1");
    if (device < 0 || device >= ctx->ndev)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "clg_bench_gemm_time: device %d out of range (%d)", device,
                           ctx->ndev);
    int b = clg_gemm_backend_parse(backend);
    if (b != CLG_GEMM_OWN && b != CLG_GEMM_CLBLAST)
        return clg_err_set(&ctx->err, CLG_ERR_INVALID_ARG, "clg_bench_gemm_time: backend '%s' (own or clblast)",
                           backend);
    clg_gemm_args a;
    gemm_args(s, &a);
    return clg_gemm_time(&ctx->devs[device], &a, (clg_gemm_backend)b, NULL, reps, ms);
}

void clg_bench_gemm_describe(clg_ctx *ctx, int device, const clg_bench_gemm_shape *s, char *buf, size_t len)
{
    if (!buf || !len)
        return;
    buf[0] = 0;
    if (!ctx || !s || device < 0 || device >= ctx->ndev)
        return;
    clg_gemm_args a;
    gemm_args(s, &a);
    clg_gemm_own_describe(&ctx->devs[device], &a, buf, len);
}
