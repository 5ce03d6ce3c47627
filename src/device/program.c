/* Kernel JIT: embedded (or overridden) sources, in-memory program/kernel
 * cache per device, and an on-disk program binary cache.
 *
 * Cache file: <cache_dir>/<key:016x>.clbin
 *   "CLGBIN\0\0" | u32 format | u32 reserved | u64 key | u64 payload_len |
 *   u32 crc32(payload) | u32 reserved | payload (program binary)
 * key = hash(format, source, options, device name, driver version,
 *            platform version). Anything that fails to check is ignored and
 * rebuilt from source; writes are atomic (temp file + rename). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "device.h"

#define CACHE_FORMAT 1u
#define CACHE_MAGIC "CLGBIN\0\0"
#define HEADER_BYTES 40

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t cache_key(clg_device *dev, const char *src, const char *options)
{
    char plat_ver[256] = {0};
    clGetPlatformInfo(dev->platform, CL_PLATFORM_VERSION, sizeof plat_ver - 1, plat_ver, NULL);
    uint32_t fmt = CACHE_FORMAT;
    uint64_t h = clg_hash64(&fmt, sizeof fmt, CLG_HASH_SEED);
    h = clg_hash_str(src, h);
    h = clg_hash_str(options, h);
    h = clg_hash_str(dev->info.name, h);
    h = clg_hash_str(dev->info.driver_version, h);
    h = clg_hash_str(plat_ver, h);
    return h;
}

static void cache_path(clg_device *dev, uint64_t key, char *dst, size_t n)
{
    snprintf(dst, n, "%s/%016llx.clbin", dev->ctx->cache_dir, (unsigned long long)key);
}

/* Every device after the first builds its programs with one extra empty
 * kernel naming it, so no two devices share a program binary. PoCL 3.1
 * keeps one loaded-kernel cache for all devices of a kind, keyed by the
 * binary; two host threads launching the same new kernel on two devices at
 * once (data parallelism) both miss it, insert the entry twice and then
 * release one entry twice ("pocl_release_dlhandle_cache: Assertion
 * `found->ref_count > 0' failed"). Distinct binaries never share an entry. */
static clg_status device_source(clg_device *dev, const char **src, char **owned)
{
    if (dev->index == 0)
        return CLG_OK;
    size_t n = strlen(*src) + 96;
    char *s = malloc(n);
    if (!s)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "no memory");
    snprintf(s, n, "%s\n__kernel void clg_device_slot_%d(void) {}\n", *src, dev->index);
    free(*owned);
    *owned = s;
    *src = s;
    return CLG_OK;
}

/* Replaces each line `#include "NAME"` of the CLGRAD_KERNEL_DIR source *text
 * (owned) by the text of dir/NAME, one level, as tools/embed_cl.py does for
 * the embedded copies (shared snippets such as cl/gelu.h): the build sees one
 * source, and the program cache key covers the snippet. */
static clg_status splice_includes(clg_device *dev, const char *dir, char **text)
{
    const char *tag = "#include \"";
    char *at = strstr(*text, tag);
    while (at) {
        char *name = at + strlen(tag), *q = strchr(name, '"');
        if (!q)
            break;
        if (at != *text && at[-1] != '\n') { /* not a directive at the start of a line */
            at = strstr(name, tag);
            continue;
        }
        char path[1200], *inc = NULL;
        snprintf(path, sizeof path, "%s/%.*s", dir, (int)(q - name), name);
        clg_status st = clg_file_read(clg_dev_err(dev), path, &inc, NULL);
        if (st == CLG_ERR_NOT_FOUND) /* not a fall-back to the embedded program: the .cl was found */
            st = clg_err_set(clg_dev_err(dev), CLG_ERR_IO, "%s: included by a program of %s, not found", path, dir);
        CLG_TRY(st);
        size_t head = (size_t)(at - *text), ni = strlen(inc);
        const char *tail = q + 1 + strcspn(q + 1, "\n");
        char *s = malloc(head + ni + strlen(tail) + 1);
        if (!s) {
            free(inc);
            return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "no memory");
        }
        memcpy(s, *text, head);
        memcpy(s + head, inc, ni);
        strcpy(s + head + ni, tail);
        free(inc);
        free(*text);
        *text = s;
        at = strstr(s + head + ni, tag);
    }
    return CLG_OK;
}

/* Fetches a program's source as this device builds it:
 * CLGRAD_KERNEL_DIR/<name>.cl when set, else the embedded copy, with the
 * device's slot kernel (device_source). *owned is set when the caller must
 * free it (also on failure: free(*owned) is always right). */
static clg_status load_source(clg_device *dev, const char *name, const char **src, char **owned)
{
    *owned = NULL;
    *src = NULL;
    if (dev->ctx->kernel_dir[0]) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s.cl", dev->ctx->kernel_dir, name);
        clg_status st = clg_file_read(clg_dev_err(dev), path, owned, NULL);
        if (st == CLG_OK)
            st = splice_includes(dev, dev->ctx->kernel_dir, owned);
        if (st == CLG_OK) {
            *src = *owned;
            return device_source(dev, src, owned);
        }
        if (st != CLG_ERR_NOT_FOUND)
            return st;
    }
    *src = clg_embedded_source(name);
    if (!*src)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_NOT_FOUND, "no kernel program named '%s'", name);
    return device_source(dev, src, owned);
}

/* Program statistics are shared by the devices' threads. */
static void stats_add(clg_ctx *ctx, int built, int loaded, int rejected, double seconds)
{
    clg_ctx_lock(ctx);
    ctx->prog_stats.built += built;
    ctx->prog_stats.cache_loaded += loaded;
    ctx->prog_stats.cache_rejected += rejected;
    ctx->prog_stats.build_seconds += seconds;
    clg_ctx_unlock(ctx);
}

static char *build_log(clg_device *dev, cl_program prog)
{
    size_t n = 0;
    if (clGetProgramBuildInfo(prog, dev->id, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) != CL_SUCCESS)
        return NULL;
    char *log = calloc(n + 1, 1);
    if (log && clGetProgramBuildInfo(prog, dev->id, CL_PROGRAM_BUILD_LOG, n, log, NULL) != CL_SUCCESS) {
        free(log);
        return NULL;
    }
    return log;
}

int clg_prog_cache_entry_check(const void *data, size_t len, uint64_t key, const unsigned char **bin, size_t *blen)
{
    const unsigned char *u = data;
    if (len < HEADER_BYTES || memcmp(u, CACHE_MAGIC, 8) != 0 || get_u32(u + 8) != CACHE_FORMAT ||
        get_u64(u + 16) != key || get_u64(u + 24) != len - HEADER_BYTES ||
        get_u32(u + 32) != clg_crc32(0, u + HEADER_BYTES, len - HEADER_BYTES))
        return 0;
    *bin = u + HEADER_BYTES;
    *blen = len - HEADER_BYTES;
    return 1;
}

/* Tries the on-disk cache; returns a built program or NULL. */
static cl_program cache_load(clg_device *dev, uint64_t key, const char *options)
{
    clg_ctx *ctx = dev->ctx;
    char path[1200];
    cache_path(dev, key, path, sizeof path);
    char *data = NULL;
    size_t len = 0;
    clg_err scratch;
    if (clg_file_read(&scratch, path, &data, &len) != CLG_OK)
        return NULL;
    cl_program prog = NULL;
    const unsigned char *bin = NULL;
    size_t blen = 0;
    if (!clg_prog_cache_entry_check(data, len, key, &bin, &blen)) {
        clg_log(1, "program cache: ignoring corrupt or foreign entry %s", path);
        stats_add(ctx, 0, 0, 1, 0);
        goto done;
    }
    cl_int bstatus = CL_SUCCESS, e = CL_SUCCESS;
    prog = clCreateProgramWithBinary(dev->cl, 1, &dev->id, &blen, &bin, &bstatus, &e);
    if (e != CL_SUCCESS || bstatus != CL_SUCCESS) {
        if (prog)
            clReleaseProgram(prog);
        prog = NULL;
        stats_add(ctx, 0, 0, 1, 0);
        goto done;
    }
    double t0 = clg_now_sec();
    e = clBuildProgram(prog, 1, &dev->id, options, NULL, NULL);
    stats_add(ctx, 0, 0, 0, clg_now_sec() - t0);
    if (e != CL_SUCCESS) {
        clReleaseProgram(prog);
        prog = NULL;
        stats_add(ctx, 0, 0, 1, 0);
        goto done;
    }
    stats_add(ctx, 0, 1, 0, 0);
done:
    free(data);
    return prog;
}

static void cache_store(clg_device *dev, uint64_t key, cl_program prog)
{
    /* The program belongs to every device of a shared context. */
    cl_uint nd = 0;
    if (clGetProgramInfo(prog, CL_PROGRAM_NUM_DEVICES, sizeof nd, &nd, NULL) != CL_SUCCESS || nd == 0 ||
        nd > CLG_MAX_DEVICES)
        return;
    cl_device_id ids[CLG_MAX_DEVICES] = {0};
    size_t sizes[CLG_MAX_DEVICES] = {0}, ret = 0;
    if (clGetProgramInfo(prog, CL_PROGRAM_DEVICES, nd * sizeof *ids, ids, NULL) != CL_SUCCESS ||
        clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, nd * sizeof *sizes, sizes, &ret) != CL_SUCCESS)
        return;
    /* PoCL 3.1 lists binaries only for the devices the program was built
     * for (here one), while CL_PROGRAM_DEVICES lists the whole context:
     * then the one entry is this device's (it is built for dev alone). */
    cl_uint nb = (cl_uint)(ret / sizeof *sizes), me = 0;
    if (nb == nd) {
        while (me < nd && ids[me] != dev->id)
            me++;
    } else if (nb != 1) {
        return;
    }
    if (me == nb || sizes[me] == 0)
        return;
    size_t blen = sizes[me];
    unsigned char *buf = malloc(HEADER_BYTES + blen);
    if (!buf)
        return;
    /* room for every binary listed: a runtime may copy each one it has */
    unsigned char *bins[CLG_MAX_DEVICES] = {0};
    int ok = 1;
    for (cl_uint i = 0; i < nb; i++)
        if (i != me && sizes[i] > 0 && !(bins[i] = malloc(sizes[i])))
            ok = 0;
    bins[me] = buf + HEADER_BYTES;
    unsigned char *bin = bins[me];
    ok = ok && clGetProgramInfo(prog, CL_PROGRAM_BINARIES, nb * sizeof *bins, bins, NULL) == CL_SUCCESS;
    for (cl_uint i = 0; i < nb; i++)
        if (i != me)
            free(bins[i]);
    if (!ok) {
        free(buf);
        return;
    }
    memset(buf, 0, HEADER_BYTES);
    memcpy(buf, CACHE_MAGIC, 8);
    put_u32(buf + 8, CACHE_FORMAT);
    put_u64(buf + 16, key);
    put_u64(buf + 24, blen);
    put_u32(buf + 32, clg_crc32(0, bin, blen));
    char path[1200];
    cache_path(dev, key, path, sizeof path);
    clg_err scratch;
    if (clg_mkdirs(&scratch, dev->ctx->cache_dir) != CLG_OK ||
        clg_file_write_atomic(&scratch, path, buf, HEADER_BYTES + blen) != CLG_OK)
        clg_log(1, "program cache disabled for this entry: %s", scratch.msg);
    free(buf);
}

static clg_status build_from_source(clg_device *dev, const char *name, const char *src, const char *options,
                                    cl_program *out)
{
    cl_int e = CL_SUCCESS;
    cl_program prog = clCreateProgramWithSource(dev->cl, 1, &src, NULL, &e);
    if (e != CL_SUCCESS)
        return clg_cl_fail(clg_dev_err(dev), e, "clCreateProgramWithSource", __FILE__, __LINE__);
    double t0 = clg_now_sec();
    e = clBuildProgram(prog, 1, &dev->id, options, NULL, NULL);
    double dt = clg_now_sec() - t0;
    stats_add(dev->ctx, 0, 0, 0, dt);
    if (e != CL_SUCCESS) {
        char *log = build_log(dev, prog);
        clg_status st = clg_err_set(clg_dev_err(dev), CLG_ERR_BUILD,
                                    "building kernel program '%s' (options '%s') on %s failed: %s\n%s", name,
                                    options ? options : "", dev->info.name, clg_cl_errname(e),
                                    log ? log : "(no build log)");
        free(log);
        clReleaseProgram(prog);
        return st;
    }
    stats_add(dev->ctx, 1, 0, 0, 0);
    clg_log(2, "built program '%s' [%s] in %.2f s", name, options ? options : "", dt);
    *out = prog;
    return CLG_OK;
}

/* The binary is taken from a fresh build of the same source and options
 * (served by PoCL's own cache), never launched: PoCL 3.1 crashed in
 * CL_PROGRAM_BINARIES (memcpy past its buffer) for a program whose kernels
 * had run on the second of two devices. */
void clg_program_store_pending(clg_device *dev)
{
    if (!dev)
        return;
    for (int i = 0; i < dev->nprogs; i++) {
        clg_program_entry *pe = &dev->progs[i];
        if (!pe->store_pending)
            continue;
        pe->store_pending = 0;
        double t0 = clg_now_sec();
        const char *src = NULL;
        char *owned = NULL;
        cl_program fresh = NULL;
        char saved[CLG_ERR_LEN];
        snprintf(saved, sizeof saved, "%s", clg_dev_err(dev)->msg);
        if (load_source(dev, pe->name, &src, &owned) == CLG_OK && cache_key(dev, src, pe->options) == pe->disk_key &&
            build_from_source(dev, pe->name, src, pe->options, &fresh) == CLG_OK) {
            cache_store(dev, pe->disk_key, fresh);
            clReleaseProgram(fresh);
            clg_log(2, "stored program '%s' [%s] in the binary cache in %.2f s", pe->name, pe->options,
                    clg_now_sec() - t0);
        }
        snprintf(clg_dev_err(dev)->msg, sizeof clg_dev_err(dev)->msg, "%s", saved); /* a failed store is no error */
        free(owned);
    }
}

/* Some drivers crash on malformed options (PoCL 3.1 on a bare "-D"):
 * catch the common mistakes before the driver sees them. */
static clg_status check_options(clg_device *dev, const char *name, const char *opts)
{
    const char *p = opts;
    while (*p) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        const char *tok = p;
        while (*p && *p != ' ' && *p != '\t')
            p++;
        size_t len = (size_t)(p - tok);
        if ((len == 2 && (strncmp(tok, "-D", 2) == 0 || strncmp(tok, "-I", 2) == 0))) {
            while (*p == ' ' || *p == '\t')
                p++;
            if (!*p || *p == '-')
                return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG,
                                   "build options for program '%s' ('%s'): '%.2s' without an argument", name, opts,
                                   tok);
        }
    }
    return CLG_OK;
}

/* How this device uses our on-disk binary cache: 0 not at all, 1 load and
 * store at build, 2 load, and store at context destruction. PoCL keeps its
 * own kernel cache (POCL_KERNEL_CACHE, on unless 0), but a build from
 * source still costs 50-150 ms per program when that cache hits, against a
 * few ms for our binary. Asking PoCL for a program binary
 * (CL_PROGRAM_BINARIES), however, makes it compile every kernel of the
 * program for a dynamic work-group size first, used or not: storing at
 * build time put 127 kernel compiles instead of 48 into a cold VGG-S start
 * (30 s instead of 17 s to the first step). So on PoCL the store waits for
 * the end of the context, off the path to the first step.
 * CLGRAD_BINARY_CACHE=1 stores at build time (tests), =0 turns it off;
 * 3: load only (a read-only cache, CLGRAD_CACHE=ro). */
static int binary_cache_mode(clg_device *dev)
{
    if (!dev->ctx->use_cache)
        return 0;
    if (dev->ctx->cache_readonly)
        return 3;
    long mode = dev->ctx->opts.binary_cache; /* auto,0,1 */
    if (mode)
        return mode == 2;
    if (clg_device_is_pocl(dev))
        return 2;
    return 1;
}


int clg_program_cached(clg_device *dev, const char *name, const char *options)
{
    if (!dev || !binary_cache_mode(dev))
        return -1;
    const char *src = NULL;
    char *owned = NULL;
    int have = 0;
    if (load_source(dev, name, &src, &owned) == CLG_OK) {
        char path[1200];
        cache_path(dev, cache_key(dev, src, options ? options : ""), path, sizeof path);
        FILE *f = fopen(path, "rb");
        if (f) {
            have = 1;
            fclose(f);
        }
    }
    free(owned);
    return have;
}

/* The device's entry for (name, options), built on first use. The pointer
 * is valid until the next entry is added. */
static clg_status program_entry(clg_device *dev, const char *name, const char *options, clg_program_entry **out)
{
    const char *opts = options ? options : "";
    uint64_t mkey = clg_hash_str(opts, clg_hash_str(name, CLG_HASH_SEED));
    for (int i = 0; i < dev->nprogs; i++) {
        clg_program_entry *pe = &dev->progs[i];
        if (pe->key == mkey && strcmp(pe->name, name) == 0 && strcmp(pe->options, opts) == 0) {
            *out = pe;
            return CLG_OK;
        }
    }
    if (dev->nprogs == dev->capprogs) {
        int nc = dev->capprogs ? dev->capprogs * 2 : 16;
        clg_program_entry *np = realloc(dev->progs, (size_t)nc * sizeof *np);
        if (!np)
            return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "no memory");
        dev->progs = np;
        dev->capprogs = nc;
    }
    CLG_TRY(check_options(dev, name, opts));
    const char *src = NULL;
    char *owned = NULL;
    clg_status sst = load_source(dev, name, &src, &owned);
    if (sst != CLG_OK) {
        free(owned);
        return sst;
    }
    uint64_t dkey = cache_key(dev, src, opts);
    int own_cache = binary_cache_mode(dev), pending = 0;
    cl_program prog = own_cache ? cache_load(dev, dkey, opts) : NULL;
    if (!prog) {
        clg_status st = build_from_source(dev, name, src, opts, &prog);
        if (st != CLG_OK) {
            free(owned);
            return st;
        }
        if (own_cache == 1)
            cache_store(dev, dkey, prog);
        pending = own_cache == 2;
    }
    free(owned);
    clg_program_entry *pe = &dev->progs[dev->nprogs];
    memset(pe, 0, sizeof *pe);
    pe->key = mkey;
    pe->name = xstrdup(name);
    pe->options = xstrdup(opts);
    pe->program = prog;
    pe->disk_key = dkey;
    pe->store_pending = pending;
    if (!pe->name || !pe->options) {
        free(pe->name);
        free(pe->options);
        clReleaseProgram(prog);
        return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "no memory");
    }
    dev->nprogs++;
    *out = pe;
    return CLG_OK;
}

clg_status clg_program_get(clg_device *dev, const char *name, const char *options, cl_program *out)
{
    if (!dev || !name || !out)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "clg_program_get: NULL argument");
    *out = NULL;
    clg_program_entry *pe = NULL;
    CLG_TRY(program_entry(dev, name, options, &pe));
    *out = pe->program;
    return CLG_OK;
}

clg_status clg_kernel_get(clg_device *dev, const char *program, const char *options, const char *kernel,
                          cl_kernel *out)
{
    if (!dev || !program || !kernel || !out)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_INVALID_ARG, "clg_kernel_get: NULL argument");
    clg_program_entry *pe = NULL;
    CLG_TRY(program_entry(dev, program, options, &pe));
    for (int j = 0; j < pe->nkernels; j++)
        if (strcmp(pe->kernels[j].name, kernel) == 0) {
            *out = pe->kernels[j].kernel;
            return CLG_OK;
        }
    if (pe->nkernels == pe->capkernels) {
        int nc = pe->capkernels ? pe->capkernels * 2 : 8;
        clg_kernel_entry *nk = realloc(pe->kernels, (size_t)nc * sizeof *nk);
        if (!nk)
            return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "no memory");
        pe->kernels = nk;
        pe->capkernels = nc;
    }
    cl_int e = CL_SUCCESS;
    cl_kernel k = clCreateKernel(pe->program, kernel, &e);
    if (e != CL_SUCCESS)
        return clg_err_set(clg_dev_err(dev), e == CL_INVALID_KERNEL_NAME ? CLG_ERR_NOT_FOUND : CLG_ERR_OPENCL,
                           "clCreateKernel('%s' in program '%s') failed: %s", kernel, program, clg_cl_errname(e));
    char *nm = xstrdup(kernel);
    if (!nm) {
        clReleaseKernel(k);
        return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "no memory");
    }
    clg_kernel_entry *ke = &pe->kernels[pe->nkernels];
    memset(ke, 0, sizeof *ke);
    ke->name = nm;
    ke->kernel = k;
    /* launch limits (clg_kernel_limits); a runtime that does not answer leaves 0 = the device's */
    if (clGetKernelWorkGroupInfo(k, dev->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof ke->wg_max, &ke->wg_max, NULL) !=
        CL_SUCCESS)
        ke->wg_max = 0;
    if (clGetKernelWorkGroupInfo(k, dev->id, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, sizeof ke->wg_multiple,
                                 &ke->wg_multiple, NULL) != CL_SUCCESS)
        ke->wg_multiple = 0;
    if (clGetKernelWorkGroupInfo(k, dev->id, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, sizeof ke->wg_reqd, ke->wg_reqd,
                                 NULL) != CL_SUCCESS)
        memset(ke->wg_reqd, 0, sizeof ke->wg_reqd);
    pe->nkernels++;
    *out = k;
    return CLG_OK;
}
