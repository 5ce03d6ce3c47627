/* Platform/device enumeration, selection, and the context that owns them. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <strings.h>

#include "device.h"

// ---- enumeration ----

static void info_str(cl_device_id d, cl_device_info what, char *dst, size_t n)
{
    /* query the full string, then truncate: a short buffer is an error */
    dst[0] = 0;
    size_t len = 0;
    if (clGetDeviceInfo(d, what, 0, NULL, &len) != CL_SUCCESS || len == 0)
        return;
    char *tmp = malloc(len + 1);
    if (!tmp)
        return;
    if (clGetDeviceInfo(d, what, len, tmp, NULL) == CL_SUCCESS) {
        tmp[len] = 0;
        snprintf(dst, n, "%s", tmp);
    }
    free(tmp);
    size_t l = strlen(dst); /* trim padding some drivers add */
    while (l > 0 && isspace((unsigned char)dst[l - 1]))
        dst[--l] = 0;
}

/* A numeric device property of bytes bytes (cl_uint, cl_ulong or size_t); 0 where the query fails. */
static cl_ulong info_num(cl_device_id d, cl_device_info what, size_t bytes)
{
    union {
        cl_uint u;
        cl_ulong ul;
        size_t z;
    } v;
    memset(&v, 0, sizeof v);
    if (clGetDeviceInfo(d, what, bytes, &v, NULL) != CL_SUCCESS)
        return 0;
    return bytes == sizeof(cl_uint) ? v.u : bytes == sizeof(cl_ulong) ? v.ul : (cl_ulong)v.z;
}

static void fill_info(cl_platform_id p, cl_device_id d, int pi, int di, clg_device_info *o)
{
    memset(o, 0, sizeof *o);
    info_str(d, CL_DEVICE_NAME, o->name, sizeof o->name);
    info_str(d, CL_DEVICE_VENDOR, o->vendor, sizeof o->vendor);
    info_str(d, CL_DRIVER_VERSION, o->driver_version, sizeof o->driver_version);
    info_str(d, CL_DEVICE_VERSION, o->device_version, sizeof o->device_version);
    info_str(d, CL_DEVICE_OPENCL_C_VERSION, o->opencl_c_version, sizeof o->opencl_c_version);
    if (clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof o->platform, o->platform, NULL) != CL_SUCCESS)
        o->platform[0] = 0;
    o->platform[sizeof o->platform - 1] = 0;
    cl_device_type t = 0;
    clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof t, &t, NULL);
    o->type = (t & CL_DEVICE_TYPE_GPU)           ? CLG_DEVICE_GPU
              : (t & CL_DEVICE_TYPE_CPU)         ? CLG_DEVICE_CPU
              : (t & CL_DEVICE_TYPE_ACCELERATOR) ? CLG_DEVICE_ACCELERATOR
                                                 : CLG_DEVICE_OTHER;
    o->platform_index = pi;
    o->device_index = di;
    o->compute_units = (cl_uint)info_num(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(cl_uint));
    o->max_clock_mhz = (cl_uint)info_num(d, CL_DEVICE_MAX_CLOCK_FREQUENCY, sizeof(cl_uint));
    o->global_mem_bytes = info_num(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(cl_ulong));
    o->local_mem_bytes = info_num(d, CL_DEVICE_LOCAL_MEM_SIZE, sizeof(cl_ulong));
    o->max_alloc_bytes = info_num(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(cl_ulong));
    o->max_work_group_size = (size_t)info_num(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof(size_t));
    size_t elen = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, 0, NULL, &elen) == CL_SUCCESS && elen > 0) {
        char *ext = malloc(elen + 1);
        if (ext && clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, elen, ext, NULL) == CL_SUCCESS) {
            ext[elen] = 0;
            o->has_fp16 = strstr(ext, "cl_khr_fp16") != NULL;
            o->has_fp64 = strstr(ext, "cl_khr_fp64") != NULL;
        }
        free(ext);
    }
}

clg_status clg_enumerate(clg_err *err, clg_device_info **infos_out, cl_platform_id **plats_out,
                         cl_device_id **ids_out, int *count)
{
    *infos_out = NULL;
    *plats_out = NULL;
    *ids_out = NULL;
    *count = 0;
    cl_uint np = 0;
    cl_int e = clGetPlatformIDs(0, NULL, &np);
    if (e == -1001 /* CL_PLATFORM_NOT_FOUND_KHR */ || (e == CL_SUCCESS && np == 0))
        return clg_err_set(err, CLG_ERR_NO_DEVICE,
                           "no OpenCL platform found: install an OpenCL driver (ICD), e.g. "
                           "'apt-get install pocl-opencl-icd' for CPUs");
    if (e != CL_SUCCESS)
        return clg_cl_fail(err, e, "clGetPlatformIDs", __FILE__, __LINE__);
    cl_platform_id *plats = calloc(np, sizeof *plats);
    if (!plats)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "no memory");
    e = clGetPlatformIDs(np, plats, NULL);
    if (e != CL_SUCCESS) {
        free(plats);
        return clg_cl_fail(err, e, "clGetPlatformIDs", __FILE__, __LINE__);
    }
    clg_device_info *infos = NULL;
    cl_platform_id *dplats = NULL;
    cl_device_id *ids = NULL;
    int n = 0;
    for (cl_uint pi = 0; pi < np; pi++) {
        cl_uint nd = 0;
        e = clGetDeviceIDs(plats[pi], CL_DEVICE_TYPE_ALL, 0, NULL, &nd);
        if (e == CL_DEVICE_NOT_FOUND || nd == 0)
            continue;
        if (e != CL_SUCCESS) {
            clg_log(1, "warning: platform %u does not answer (%s); skipped", pi, clg_cl_errname(e));
            continue;
        }
        cl_device_id *d = calloc(nd, sizeof *d);
        clg_device_info *ni = realloc(infos, (size_t)(n + (int)nd) * sizeof *ni);
        if (ni)
            infos = ni;
        cl_device_id *nids = realloc(ids, (size_t)(n + (int)nd) * sizeof *nids);
        if (nids)
            ids = nids;
        cl_platform_id *npl = realloc(dplats, (size_t)(n + (int)nd) * sizeof *npl);
        if (npl)
            dplats = npl;
        if (!d || !ni || !nids || !npl) {
            free(d);
            free(infos);
            free(ids);
            free(dplats);
            free(plats);
            return clg_err_set(err, CLG_ERR_HOST_OOM, "no memory");
        }
        e = clGetDeviceIDs(plats[pi], CL_DEVICE_TYPE_ALL, nd, d, NULL);
        if (e != CL_SUCCESS) {
            clg_log(1, "warning: platform %u does not list its devices (%s); skipped", pi, clg_cl_errname(e));
            free(d);
            continue;
        }
        for (cl_uint di = 0; di < nd; di++) {
            fill_info(plats[pi], d[di], (int)pi, (int)di, &infos[n]);
            ids[n] = d[di];
            dplats[n] = plats[pi];
            n++;
        }
        free(d);
    }
    free(plats);
    if (n == 0) {
        free(infos);
        free(ids);
        free(dplats);
        return clg_err_set(err, CLG_ERR_NO_DEVICE, "no OpenCL device found on %u platform(s)", np);
    }
    *infos_out = infos;
    *plats_out = dplats;
    *ids_out = ids;
    *count = n;
    return CLG_OK;
}

// ---- selection ----

static int ci_contains(const char *hay, const char *needle)
{
    size_t nl = strlen(needle);
    for (const char *h = hay; *h; h++)
        if (strncasecmp(h, needle, nl) == 0)
            return 1;
    return nl == 0;
}

clg_status clg_select_devices(clg_err *err, const char *selector, const clg_device_info *infos, int count,
                              int *sel, int max, int *nsel)
{
    *nsel = 0;
    const char *s = selector ? selector : "all";
    if (!*s)
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "empty device selector: expected all|gpu|cpu|accelerator, an index list like 0,1, or "
                           "name:SUBSTRING");
    int type_mask = 0;
    if (strcasecmp(s, "all") == 0)
        type_mask = ~0;
    else if (strcasecmp(s, "gpu") == 0)
        type_mask = CLG_DEVICE_GPU;
    else if (strcasecmp(s, "cpu") == 0)
        type_mask = CLG_DEVICE_CPU;
    else if (strcasecmp(s, "accelerator") == 0)
        type_mask = CLG_DEVICE_ACCELERATOR;
    if (type_mask) {
        for (int i = 0; i < count && *nsel < max; i++)
            if (infos[i].type & type_mask)
                sel[(*nsel)++] = i;
        if (*nsel == 0)
            return clg_err_set(err, CLG_ERR_NO_DEVICE, "device selector '%s' matches none of the %d device(s)", s,
                               count);
        return CLG_OK;
    }
    if (isdigit((unsigned char)s[0]) || s[0] == ',') { /* an index list: digits only, no empty entry */
        if (strspn(s, "0123456789,") != strlen(s))
            return clg_err_set(err, CLG_ERR_INVALID_ARG,
                               "bad device selector '%s': expected all|gpu|cpu|accelerator, an index list like 0,1, "
                               "or name:SUBSTRING",
                               s);
        const char *p = s;
        for (;;) {
            char *end = NULL;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || (*end == ',' && end[1] == 0))
                return clg_err_set(err, CLG_ERR_INVALID_ARG,
                                   "bad device selector '%s': empty or out-of-range entry in the index list "
                                   "(expected indexes separated by single commas, like 0,1)",
                                   s);
            if (v < 0 || v >= count)
                return clg_err_set(err, CLG_ERR_NO_DEVICE, "device index %ld out of range (%d device(s): 0..%d)", v,
                                   count, count - 1);
            for (int k = 0; k < *nsel; k++)
                if (sel[k] == (int)v)
                    return clg_err_set(err, CLG_ERR_INVALID_ARG, "device index %ld listed twice in '%s'", v, s);
            if (*nsel >= max)
                return clg_err_set(err, CLG_ERR_INVALID_ARG, "too many devices in '%s'", s);
            sel[(*nsel)++] = (int)v;
            if (!*end)
                return CLG_OK;
            p = end + 1;
        }
    }
    const char *sub = strncasecmp(s, "name:", 5) == 0 ? s + 5 : s;
    if (!*sub)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "bad device selector '%s': empty name after 'name:'", s);
    if (sub == s && strchr(s, ':'))
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "bad device selector '%s': expected all|gpu|cpu|accelerator, an index list like 0,1, "
                           "or name:SUBSTRING",
                           s);
    for (int i = 0; i < count && *nsel < max; i++)
        if (ci_contains(infos[i].name, sub) || ci_contains(infos[i].vendor, sub))
            sel[(*nsel)++] = i;
    if (*nsel == 0)
        return clg_err_set(err, CLG_ERR_NO_DEVICE, "no device name matches '%s' (%d device(s) present)", sub, count);
    return CLG_OK;
}

// ---- context ----

static void ctx_params_defaults(clg_ctx_params *p)
{
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    p->devices = NULL;
    p->use_cache = 1;
}

void clg_ctx_params_init_size(clg_ctx_params *p, size_t size)
{
    clg_ctx_params d;
    ctx_params_defaults(&d);
    clg_sized_init(p, size, &d, sizeof d);
}

/* The options of a new context: p->options (or the defaults), then the
 * environment for those left at their default. */
static clg_status ctx_options(const clg_ctx_params *p, clg_opts *o)
{
    if (p->options) {
        if (p->options->size != sizeof *o)
            return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_ctx_params.options: not made by clg_options_create");
        memcpy(o, p->options, sizeof *o);
    } else {
        clg_opts_init(o);
    }
    return clg_opts_read_env(o, NULL);
}

/* Options, lock, cache and kernel directories of a new context from p and o. */
static void ctx_settings(clg_ctx *ctx, const clg_ctx_params *p, const clg_opts *o)
{
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->opts = *o;
    ctx->use_cache = p->use_cache && o->cache != 1; /* cache: 1,0,ro */
    ctx->cache_readonly = o->cache == 2;
    if (p->cache_dir && *p->cache_dir)
        snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s", p->cache_dir);
    else if (o->cache_dir[0])
        snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s", o->cache_dir);
    else
        clg_opts_default_cache_dir(ctx->cache_dir, sizeof ctx->cache_dir);
    const char *kd = p->kernel_dir ? p->kernel_dir : o->kernel_dir;
    if (kd && *kd)
        snprintf(ctx->kernel_dir, sizeof ctx->kernel_dir, "%s", kd);
}

/* fp16 = 0 treats the device as without cl_khr_fp16 (fp16 storage through
 * vload_half/vstore_half_rte only), 1 as with it (the kernels' `half` path;
 * for testing that path on a runtime whose compiler accepts half arithmetic
 * without reporting the extension, e.g. oclgrind). */
static void apply_fp16(clg_device_info *info, const clg_opts *o)
{
    if (o->fp16 != 0) /* auto,0,1 */
        info->has_fp16 = o->fp16 == 2;
}

clg_status clg_ctx_option_set(clg_ctx *ctx, const char *name, const char *value)
{
    if (!ctx)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_ctx_option_set: no context");
    return clg_opts_set(&ctx->opts, name, value, CLG_OPTION_SET, &ctx->err);
}

const clg_options *clg_ctx_options(const clg_ctx *ctx) { return ctx ? &ctx->opts : NULL; }

/* d->extensions (NULL where unknown) and d->max_item (zeros) of the device d->id. */
static void query_caps(clg_device *d)
{
    size_t elen = 0;
    if (clGetDeviceInfo(d->id, CL_DEVICE_EXTENSIONS, 0, NULL, &elen) == CL_SUCCESS &&
        (d->extensions = calloc(elen + 1, 1)) != NULL)
        clGetDeviceInfo(d->id, CL_DEVICE_EXTENSIONS, elen, d->extensions, NULL);
    if (clGetDeviceInfo(d->id, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof d->max_item, d->max_item, NULL) != CL_SUCCESS)
        memset(d->max_item, 0, sizeof d->max_item);
}

clg_status clg_ctx_create(const clg_ctx_params *params, clg_ctx **out)
{
    if (!out)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_ctx_create: out is NULL");
    *out = NULL;
    clg_ctx_params defaults;
    ctx_params_defaults(&defaults);
    if (params)
        CLG_TRY(clg_sized_read(NULL, "clg_ctx_params", &defaults, sizeof defaults, params));
    const clg_ctx_params *p = &defaults;
    if (p->verbose > clg_log_level)
        clg_log_level = p->verbose;
    clg_opts *opts = malloc(sizeof *opts);
    if (!opts)
        return clg_err_set(NULL, CLG_ERR_HOST_OOM, "no memory for context");
    clg_status st = ctx_options(p, opts);
    if (st != CLG_OK) {
        free(opts);
        return st;
    }

    clg_device_info *infos = NULL;
    cl_platform_id *plats = NULL;
    cl_device_id *ids = NULL;
    int count = 0;
    st = clg_enumerate(NULL, &infos, &plats, &ids, &count);
    if (st != CLG_OK) {
        free(opts);
        return st;
    }
    for (int i = 0; i < count; i++)
        apply_fp16(&infos[i], opts);
    const char *selector = p->devices ? p->devices : opts->devices[0] ? opts->devices : "all";
    int sel[CLG_MAX_DEVICES], nsel = 0;
    st = clg_select_devices(NULL, selector, infos, count, sel, CLG_MAX_DEVICES, &nsel);
    if (st != CLG_OK)
        goto out_free;

    clg_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx || !(ctx->devs = calloc((size_t)nsel, sizeof *ctx->devs))) {
        free(ctx);
        st = clg_err_set(NULL, CLG_ERR_HOST_OOM, "no memory for context");
        goto out_free;
    }
    ctx_settings(ctx, p, opts);

    int shared = ctx->opts.shared_context != 0;
    for (int k = 0; k < nsel; k++) {
        clg_device *d = &ctx->devs[k];
        int i = sel[k];
        d->ctx = ctx;
        d->index = k;
        d->platform = plats[i];
        d->id = ids[i];
        d->info = infos[i];
        d->pool.fail_after = -1;
        d->pool.cache_limit = (uint64_t)1 << 40;
        d->pool.limit = (uint64_t)(ctx->opts.device_mem_limit * 1048576.0); /* test aid: 0 none */
        ctx->ndev = k + 1;
        cl_int e = CL_SUCCESS;
        /* Devices of one platform share a cl_context (buffers are usable on
         * every queue of it: device-to-device reduction); each device holds
         * its own reference. CLGRAD_SHARED_CONTEXT=0: one context per device. */
        for (int j = 0; j < k && shared; j++)
            if (ctx->devs[j].platform == d->platform && ctx->devs[j].cl) {
                d->cl = ctx->devs[j].cl;
                d->shared_cl = 1;
                ctx->devs[j].shared_cl = 1;
                clRetainContext(d->cl);
                break;
            }
        if (!d->cl) {
            cl_device_id grp[CLG_MAX_DEVICES];
            cl_uint ng = 0;
            for (int j = k; j < nsel; j++)
                if ((j == k || shared) && plats[sel[j]] == plats[i])
                    grp[ng++] = ids[sel[j]];
            cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plats[i], 0};
            d->cl = clCreateContext(props, ng, grp, NULL, NULL, &e);
        }
        if (e != CL_SUCCESS) {
            st = clg_cl_fail(NULL, e, "clCreateContext", __FILE__, __LINE__);
            clg_ctx_destroy(ctx);
            goto out_free;
        }
        d->queue = clCreateCommandQueue(d->cl, d->id, CL_QUEUE_PROFILING_ENABLE, &e);
        if (e != CL_SUCCESS) {
            st = clg_cl_fail(NULL, e, "clCreateCommandQueue", __FILE__, __LINE__);
            clg_ctx_destroy(ctx);
            goto out_free;
        }
        query_caps(d);
        clg_log(1, "device %d: %s (%s, %s)", k, d->info.name, d->info.platform, d->info.driver_version);
    }
    *out = ctx;
    st = CLG_OK;
out_free:
    free(opts);
    free(infos);
    free(plats);
    free(ids);
    return st;
}

clg_status clg_ctx_wrap_queue(cl_command_queue queue, const clg_ctx_params *p, clg_ctx **out)
{
    *out = NULL;
    if (!queue)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "command queue is NULL");
    cl_context clctx = NULL;
    cl_device_id id = NULL;
    cl_command_queue_properties qp = 0;
    cl_int e = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof clctx, &clctx, NULL);
    if (e == CL_SUCCESS)
        e = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof id, &id, NULL);
    if (e == CL_SUCCESS)
        e = clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof qp, &qp, NULL);
    if (e != CL_SUCCESS)
        return clg_cl_fail(NULL, e, "clGetCommandQueueInfo (is the queue valid?)", __FILE__, __LINE__);
    if (qp & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
        return clg_err_set(NULL, CLG_ERR_UNSUPPORTED,
                           "the command queue is out-of-order; clgrad's operations are sequences of kernels "
                           "that need an in-order queue (create it without CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)");
    cl_platform_id plat = NULL;
    e = clGetDeviceInfo(id, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL);
    if (e != CL_SUCCESS)
        return clg_cl_fail(NULL, e, "clGetDeviceInfo(CL_DEVICE_PLATFORM)", __FILE__, __LINE__);
    /* indices as clg_enumerate numbers them (for messages and the fingerprint only) */
    int pi = 0, di = 0;
    cl_uint np = 0;
    cl_platform_id plats[64];
    if (clGetPlatformIDs(64, plats, &np) == CL_SUCCESS)
        for (cl_uint i = 0; i < np && i < 64; i++)
            if (plats[i] == plat)
                pi = (int)i;
    cl_uint nd = 0;
    cl_device_id ids[64];
    if (clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 64, ids, &nd) == CL_SUCCESS)
        for (cl_uint i = 0; i < nd && i < 64; i++)
            if (ids[i] == id)
                di = (int)i;

    clg_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx || !(ctx->devs = calloc(1, sizeof *ctx->devs))) {
        free(ctx);
        return clg_err_set(NULL, CLG_ERR_HOST_OOM, "no memory for context");
    }
    clg_ctx_params defaults;
    ctx_params_defaults(&defaults);
    clg_opts *opts = malloc(sizeof *opts);
    clg_status st = opts ? ctx_options(p ? p : &defaults, opts) : clg_err_set(NULL, CLG_ERR_HOST_OOM, "no memory");
    if (st != CLG_OK) {
        free(opts);
        free(ctx->devs);
        free(ctx);
        return st;
    }
    ctx_settings(ctx, p ? p : &defaults, opts);
    free(opts);
    clg_device *d = &ctx->devs[0];
    d->ctx = ctx;
    d->platform = plat;
    d->id = id;
    fill_info(plat, id, pi, di, &d->info);
    apply_fp16(&d->info, &ctx->opts);
    d->pool.fail_after = -1;
    d->pool.cache_limit = (uint64_t)1 << 40;
    d->pool.limit = (uint64_t)(ctx->opts.device_mem_limit * 1048576.0);
    ctx->ndev = 1; /* from here clg_ctx_destroy releases what was retained */
    /* the caller's objects, retained here and released once by clg_ctx_destroy */
    e = clRetainContext(clctx);
    if (e != CL_SUCCESS) {
        clg_ctx_destroy(ctx);
        return clg_cl_fail(NULL, e, "clRetainContext", __FILE__, __LINE__);
    }
    d->cl = clctx;
    e = clRetainCommandQueue(queue);
    if (e != CL_SUCCESS) {
        clg_ctx_destroy(ctx);
        return clg_cl_fail(NULL, e, "clRetainCommandQueue", __FILE__, __LINE__);
    }
    d->queue = queue;
    query_caps(d);
    clg_log(1, "wrapped queue on %s (%s, %s)", d->info.name, d->info.platform, d->info.driver_version);
    *out = ctx;
    return CLG_OK;
}

void clg_ctx_destroy(clg_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->tune_db && ctx->tune_db_free)
        ctx->tune_db_free(ctx->tune_db);
    if (ctx->conv_state && ctx->conv_state_free)
        ctx->conv_state_free(ctx->conv_state);
    for (int k = 0; k < ctx->ndev; k++) {
        clg_device *d = &ctx->devs[k];
        if (d->queue)
            clFinish(d->queue);
        clg_program_store_pending(d);
        clg_kprof_take(d, NULL, NULL);
        free(d->kev);
        for (int i = 0; i < d->nprogs; i++) {
            clg_program_entry *pe = &d->progs[i];
            for (int j = 0; j < pe->nkernels; j++) {
                clReleaseKernel(pe->kernels[j].kernel);
                free(pe->kernels[j].name);
            }
            free(pe->kernels);
            if (pe->program)
                clReleaseProgram(pe->program);
            free(pe->name);
            free(pe->options);
        }
        free(d->progs);
        clg_pool_trim(d);
        free(d->pool.free_blocks);
        if (d->queue)
            clReleaseCommandQueue(d->queue);
        if (d->cl)
            clReleaseContext(d->cl);
        free(d->extensions);
    }
    free(ctx->devs);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

const char *clg_last_error(const clg_ctx *ctx)
{
    if (!ctx)
        return clg_err_tls()->msg;
    const clg_err *e = &ctx->err;
    for (int i = 0; i < ctx->ndev; i++)
        if (ctx->devs[i].err.seq > e->seq)
            e = &ctx->devs[i].err;
    return e->msg;
}

int clg_device_count(const clg_ctx *ctx) { return ctx ? ctx->ndev : 0; }

int clg_device_is_pocl(const clg_device *dev)
{
    return clg_str_icontains(dev->info.platform, "Portable Computing Language") ||
           clg_str_icontains(dev->info.device_version, "PoCL");
}

clg_status clg_device_info_get_size(const clg_ctx *ctx, int index, clg_device_info *out, size_t size)
{
    if (!ctx || !out)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_device_info_get: NULL argument");
    if (index < 0 || index >= ctx->ndev)
        return clg_err_set((clg_err *)&ctx->err, CLG_ERR_INVALID_ARG, "device index %d out of range (0..%d)", index,
                           ctx->ndev - 1);
    clg_sized_write(out, size, &ctx->devs[index].info, sizeof(clg_device_info)); /* the caller's sizeof */
    return CLG_OK;
}

clg_status clg_pool_stats_get_size(const clg_ctx *ctx, int device, clg_pool_stats *out, size_t size)
{
    if (!ctx || !out)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_pool_stats_get: NULL argument");
    if (device < 0 || device >= ctx->ndev)
        return clg_err_set((clg_err *)&ctx->err, CLG_ERR_INVALID_ARG, "device index %d out of range (0..%d)",
                           device, ctx->ndev - 1);
    clg_sized_write(out, size, &ctx->devs[device].pool.stats, sizeof(clg_pool_stats));
    return CLG_OK;
}

// ---- events ----

double clg_event_ms(cl_event ev)
{
    cl_ulong a = 0, b = 0;
    if (clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof a, &a, NULL) != CL_SUCCESS ||
        clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL) != CL_SUCCESS)
        return -1.0;
    return (double)(b - a) * 1e-6;
}

double clg_event_span_ms(cl_event first, cl_event last)
{
    cl_ulong a = 0, b = 0;
    if (clGetEventProfilingInfo(first, CL_PROFILING_COMMAND_START, sizeof a, &a, NULL) != CL_SUCCESS ||
        clGetEventProfilingInfo(last, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL) != CL_SUCCESS)
        return -1.0;
    return (double)(b - a) * 1e-6;
}
