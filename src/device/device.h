/* Device layer: platforms/devices, one context + in-order queue per device,
 * program JIT with an on-disk binary cache, buffer pool, OpenCL errors. */
#ifndef CLG_DEVICE_H
#define CLG_DEVICE_H

#define CL_TARGET_OPENCL_VERSION 120
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>

#include <pthread.h>

#include "core/core.h"
#include "core/options.h"

typedef struct clg_device clg_device;

#define CLG_MAX_DEVICES 64 /* devices one context may hold */

// ---- OpenCL errors ----

CLG_INTERNAL const char *clg_cl_errname(cl_int e);
/* Records "what failed: CL_NAME (code) at file:line" on err and returns the
 * mapped status (allocation failures -> CLG_ERR_DEVICE_OOM). */
CLG_INTERNAL clg_status clg_cl_fail(clg_err *err, cl_int e, const char *what, const char *file, int line);

/* Evaluates an OpenCL call returning cl_int; on error records it on
 * errp (clg_err *) and returns the mapped status from the function. */
#define CLG_CL_CHECK(errp, call)                                                   \
    do {                                                                           \
        cl_int clg_e_ = (call);                                                    \
        if (clg_e_ != CL_SUCCESS)                                                  \
            return clg_cl_fail((errp), clg_e_, #call, __FILE__, __LINE__);         \
    } while (0)


// ---- kernel arguments ----

/* The one way to set kernel arguments (nothing outside src/device calls
 * clSetKernelArg): sets them in order from index i and remembers the first
 * failure, so a launcher checks once: clg_kargs a = {k, 0, CL_SUCCESS};
 * clg_ka_int(&a, n); ...; CLG_TRY(CLG_KA_DONE(err, &a, "kernel args")). */
typedef struct clg_kargs {
    cl_kernel k;
    cl_uint i;
    cl_int e;
} clg_kargs;

static inline void clg_ka_arg(clg_kargs *a, size_t size, const void *v)
{
    if (a->e == CL_SUCCESS)
        a->e = clSetKernelArg(a->k, a->i, size, v);
    a->i++;
}
static inline void clg_ka_int(clg_kargs *a, int v) { clg_ka_arg(a, sizeof v, &v); }
static inline void clg_ka_float(clg_kargs *a, float v) { clg_ka_arg(a, sizeof v, &v); }
static inline void clg_ka_uint(clg_kargs *a, cl_uint v) { clg_ka_arg(a, sizeof v, &v); }
static inline void clg_ka_mem(clg_kargs *a, cl_mem v) { clg_ka_arg(a, sizeof v, &v); }
/* The next argument is the variable (lvalue) v, at its own size. */
#define CLG_KA(a, v) clg_ka_arg((a), sizeof(v), &(v))
/* CLG_OK, or the first clSetKernelArg failure of a recorded in err as
 * `what` at the caller's file and line. */
#define CLG_KA_DONE(err, a, what) \
    ((a)->e == CL_SUCCESS ? CLG_OK : clg_cl_fail((err), (a)->e, (what), __FILE__, __LINE__))

// ---- buffer pool ----

typedef struct clg_pool_block {
    cl_mem mem;
    size_t size; /* size class, bytes */
} clg_pool_block;

typedef struct clg_pool {
    clg_pool_block *free_blocks; /* released, reusable */
    int nfree, capfree;
    clg_pool_stats stats;
    long fail_after; /* fault injection: fail the allocation after this many more succeed (-1 off) */
    long huge_buffers; /* buffers made in huge-page mappings (option hugepages; tests) */
    uint64_t cache_limit; /* bytes kept cached at most */
    /* Memory account: buffers made outside the pool (parameter and optimizer
     * state arenas) charged by clg_mem_charge; the cap (option
     * device_mem_limit, 0 none) refuses a pool allocation or a charge that
     * would take in-use + charged bytes past it. */
    uint64_t direct_bytes, total_peak, limit;
} clg_pool;

/* Rounds a request up to its size class (>= 256 bytes, 4 classes per octave). */
CLG_INTERNAL size_t clg_pool_class(size_t bytes);
/* Allocates a device buffer of at least `bytes` (read-write). Served from the
 * pool when a released block of the same class exists. */
CLG_INTERNAL clg_status clg_buf_alloc(clg_device *dev, size_t bytes, cl_mem *out);
/* Charges `bytes` of a buffer made outside the pool (what: "optimizer state",
 * for the refusal) to the device's memory account; CLG_ERR_DEVICE_OOM naming
 * the device and the cap when over the device_mem_limit. */
CLG_INTERNAL clg_status clg_mem_charge(clg_device *dev, size_t bytes, const char *what);
CLG_INTERNAL void clg_mem_uncharge(clg_device *dev, size_t bytes);
/* Returns a buffer obtained from clg_buf_alloc to the pool. NULL is a no-op. */
CLG_INTERNAL void clg_buf_release(clg_device *dev, cl_mem mem);
/* buf[off .. off + n) = v (floats), by a kernel (cl/eltwise.cl `fill`)
 * rather than clEnqueueFillBuffer: same result everywhere, and oclgrind's
 * uninitialized-value check sees the stores (tests/oclgrind_check.sh). */
CLG_INTERNAL clg_status clg_buf_fill(clg_device *dev, cl_mem buf, size_t off, size_t n, float v);
/* Frees every cached (released) block. */
CLG_INTERNAL void clg_pool_trim(clg_device *dev);

// ---- programs ----

typedef struct clg_kernel_entry {
    char *name;
    cl_kernel kernel;
    size_t wg_max;      /* CL_KERNEL_WORK_GROUP_SIZE (0: not reported) */
    size_t wg_multiple; /* CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE (0: not reported) */
    size_t wg_reqd[3];  /* CL_KERNEL_COMPILE_WORK_GROUP_SIZE (zeros: none) */
} clg_kernel_entry;

typedef struct clg_program_entry {
    uint64_t key; /* hash(program name, options) */
    char *name;
    char *options;
    cl_program program;
    clg_kernel_entry *kernels;
    int nkernels, capkernels;
    uint64_t disk_key; /* on-disk cache key of an entry still to be stored (store_pending) */
    int store_pending; /* built from source; its binary is written at context destruction */
} clg_program_entry;

/* Writes the binaries of the device's programs whose on-disk cache entry was
 * deferred (PoCL: see binary_cache_on in program.c); clg_ctx_destroy calls it. */
CLG_INTERNAL void clg_program_store_pending(clg_device *dev);
/* 1 when the on-disk binary cache holds program (name, options) for dev, 0
 * when it does not, -1 when dev has no binary cache (CLGRAD_CACHE=0,
 * CLGRAD_BINARY_CACHE=0): nothing is known. */
CLG_INTERNAL int clg_program_cached(clg_device *dev, const char *name, const char *options);

/* Kernel time (ms, END - START of each launch's event) and count of the
 * launches since the last call, for profiling (dev->kprof); releases them.
 * The queue must be finished. */
CLG_INTERNAL void clg_kprof_take(clg_device *dev, double *ms, int *count);

/* Source of an embedded program ("gemm" -> cl/gemm.cl), or NULL. */
CLG_INTERNAL const char *clg_embedded_source(const char *program);
/* Names of every embedded program, NULL-terminated. */
CLG_INTERNAL const char *const *clg_embedded_names(void);

/* Builds (or fetches from memory/disk cache) the program `program` with
 * build options `options` for dev. The returned program is borrowed. */
CLG_INTERNAL clg_status clg_program_get(clg_device *dev, const char *program, const char *options,
                                        cl_program *out);
/* Kernel `kernel` of that program; borrowed, cached per device. A kernel
 * object is not thread-safe: one thread per context. */
/* An on-disk program-cache entry (magic, format, key, length, CRC-32 of
 * the binary): 1 with the binary's bytes in *bin and *blen when data[0..len)
 * is a valid entry for key, else 0. */
CLG_INTERNAL int clg_prog_cache_entry_check(const void *data, size_t len, uint64_t key, const unsigned char **bin,
                                            size_t *blen);
CLG_INTERNAL clg_status clg_kernel_get(clg_device *dev, const char *program, const char *options,
                                       const char *kernel, cl_kernel *out);

// ---- launch limits ----
/* Every launcher sizes its work-groups from these, never from constants:
 * a GPU allows 256-1024 work-items per group and 32-64 KiB of local memory,
 * a kernel may allow fewer work-items than its device (registers), and a
 * kernel compiled with reqd_work_group_size runs with that size only. */

typedef struct clg_wg_limits {
    size_t max_total;   /* work-items per group: min(device max, CL_KERNEL_WORK_GROUP_SIZE) */
    size_t max_item[3]; /* per dimension (CL_DEVICE_MAX_WORK_ITEM_SIZES, each <= max_total) */
    size_t multiple;    /* preferred multiple of the group size (1 when not reported) */
    size_t reqd[3];     /* reqd_work_group_size of the kernel (zeros: none) */
    uint64_t local_mem; /* CL_DEVICE_LOCAL_MEM_SIZE, bytes (0: not reported) */
    int canon;          /* few distinct local sizes wanted (CPU devices: see CLG_LAUNCH_PAD) */
} clg_wg_limits;

/* Limits of kernel k (obtained from clg_kernel_get on dev) on dev. */
CLG_INTERNAL clg_status clg_kernel_limits(clg_device *dev, cl_kernel k, clg_wg_limits *out);
/* Largest work-group (total work-items) kernel k can be launched with on dev. */
CLG_INTERNAL clg_status clg_kernel_wg_limit(clg_device *dev, cl_kernel k, size_t *max);
/* Largest power of two <= min(want, the device's work-group maximum) (>= 1):
 * for kernels whose fixed group size is a build option (-D ..._WG=n). */
CLG_INTERNAL size_t clg_device_wg_pow2(const clg_device *dev, size_t want);
/* Kernel `name` of program `prog` whose fixed work-group size is the macro
 * `macro` of its source (default `want`, a power of two): *wg = want, or the
 * largest power of two the device allows, built in with -D macro=wg. */
CLG_INTERNAL clg_status clg_kernel_get_wg(clg_device *dev, const char *prog, const char *name, const char *macro,
                                          size_t want, cl_kernel *k, size_t *wg);
/* Shrinks lws[0..dims) in place until it fits L (total and per dimension),
 * dividing the largest dimension by its smallest prime factor each time, so
 * a global size that was a multiple of lws stays one. */
CLG_INTERNAL void clg_wg_fit(const clg_wg_limits *L, cl_uint dims, size_t *lws);
/* Local size for a 1-/2-/3-D range of n[] items with bounds-checked kernels:
 * dimension 0 gets a power of two >= n[0] up to want0 (multiple-aligned),
 * dimension 1 fills the group up to want_total (with L->canon whenever
 * n[1] >= 16, not only up to n[1], so ranges of 16, 32 or 64 rows share one
 * local size); dimension 2 is 1; then fitted to L. gws = n rounded up to multiples of lws. */
CLG_INTERNAL void clg_wg_geom(const clg_wg_limits *L, cl_uint dims, const size_t *n, size_t want0, size_t want_total,
                              size_t *gws, size_t *lws);

/* Flags of clg_launch. */
#define CLG_LAUNCH_FIXED 0u /* lws must be used as given (reqd size, local-memory tiles, reductions) */
#define CLG_LAUNCH_FIT 1u   /* lws may shrink to fit the limits (kernels that only bound-check) */
/* With lws NULL: the kernel bound-checks dimensions 0 and 1, so the launcher
 * may pick the local size itself and round gws[0], gws[1] up to it
 * (dimension 2 keeps its size, with local size 1). On CPU devices it uses
 * one canonical local size whatever the range (CLG_WG_CANON_X x CLG_WG_CANON_Y
 * x 1, four times wider along dimension 0 for ranges of 256 or more there;
 * 64 for 1-D): CPU runtimes such as PoCL compile a kernel to machine
 * code once per distinct local size at its first launch, and leaving the
 * choice to the runtime gave a new size for nearly every new range (11 for
 * gemm_pack in one VGG-S step). Elsewhere, or with CLGRAD_WG_CANON=0, the
 * runtime picks as before. Implies CLG_LAUNCH_FIT. */
#define CLG_LAUNCH_PAD 2u
#define CLG_WG_CANON_X 16
#define CLG_WG_CANON_Y 4

/* The one enqueue point of every kernel: k on dev's queue over gws (lws
 * may be NULL: the runtime picks), after the num_wait events of wait (0 and
 * NULL: none), CLBlast's style. ev (NULL for none) receives the kernel's
 * event, which the caller releases. A range with a zero dimension launches
 * nothing: ev receives NULL, or with a wait list a marker on it, so that
 * whatever waits on ev still waits for the list. A work-group the kernel
 * cannot run on dev is shrunk (CLG_LAUNCH_FIT) or reported as
 * CLG_ERR_UNSUPPORTED naming the kernel, the group and the limits; an
 * enqueue failure names the kernel and the limits too. Inside a clg_deps
 * scope of dev the scope's wait list goes to the first launch and the
 * newest launch's event is kept for the scope. */
CLG_INTERNAL clg_status clg_enqueue(clg_device *dev, cl_kernel k, cl_uint dims, const size_t *gws, const size_t *lws,
                                    unsigned flags, cl_uint num_wait, const cl_event *wait, cl_event *ev);

/* clg_enqueue without a wait list. */
static inline clg_status clg_launch(clg_device *dev, cl_kernel k, cl_uint dims, const size_t *gws, const size_t *lws,
                                    unsigned flags, cl_event *ev)
{
    return clg_enqueue(dev, k, dims, gws, lws, flags, 0, NULL, ev);
}

/* 1-D launch of n work-items for a kernel that bound-checks its index:
 * groups of wg (a power of two), fewer where the kernel's limits require. */
static inline clg_status clg_launch_1d(clg_device *dev, cl_kernel k, size_t n, size_t wg)
{
    size_t g = (n + wg - 1) / wg * wg;
    return clg_enqueue(dev, k, 1, &g, &wg, CLG_LAUNCH_FIT, 0, NULL, NULL);
}

/* An operation of one or more launches that waits for a list of events and
 * returns one event (the primitives API) without a barrier and a marker:
 * between clg_deps_begin and clg_deps_end on dev, the first launch of the
 * device waits for the list and the newest launch's event is kept (the queue
 * is in order, so it completes after everything before it). Code that
 * enqueues on dev's queue without clg_enqueue (CLBlast, clFFT) calls
 * clg_deps_foreign first. One scope per device at a time; not nested. */
typedef struct clg_deps {
    cl_uint num_wait; /* events still to wait for (0 once a command took them) */
    const cl_event *wait; /* borrowed from the caller */
    cl_event last;    /* event of the newest launch (retained); NULL when none, or a command
                         outside clg_enqueue came after it */
} clg_deps;

CLG_INTERNAL void clg_deps_begin(clg_device *dev, clg_deps *d, cl_uint num_wait, const cl_event *wait);
/* Before a command that does not go through clg_enqueue: inside a scope,
 * the pending wait list becomes a barrier (clEnqueueBarrierWithWaitList)
 * and the scope's event is forgotten (a later launch gives it again; else
 * clg_deps_end returns a marker). No-op outside a scope. */
CLG_INTERNAL clg_status clg_deps_foreign(clg_device *dev);
/* Ends the scope. With st == CLG_OK and event not NULL, *event receives an
 * event that completes after every command of the scope (the newest
 * launch's, or a marker); a wait list no command took is enqueued as a
 * marker (barrier) so the queue still waits for it. Returns st, or the
 * failure of that marker. */
CLG_INTERNAL clg_status clg_deps_end(clg_device *dev, clg_deps *d, clg_status st, cl_event *event);

// ---- devices and context ----

struct clg_device {
    clg_ctx *ctx; /* owner (borrowed) */
    int index;    /* index in ctx->devs */
    cl_platform_id platform;
    cl_device_id id;
    cl_context cl;  /* shared by the context's devices of one platform (each holds a reference) */
    int shared_cl;  /* cl is shared with another device */
    cl_command_queue queue;
    clg_device_info info;
    char *extensions;
    size_t max_item[3]; /* CL_DEVICE_MAX_WORK_ITEM_SIZES (0: not reported) */
    clg_program_entry *progs;
    int nprogs, capprogs;
    clg_pool pool;
    /* Failures on this device. Each device is driven by at most one host
     * thread at a time (its lane), so its errors, program/kernel cache and
     * pool need no lock; clg_last_error(ctx) shows the newest failure of
     * the context and its devices. */
    clg_err err;
    /* kernels enqueued through clg_launch (launches per step in bench train;
     * written by the device's own thread only) */
    unsigned long long launches;
    clg_deps *deps; /* open clg_deps scope (borrowed), or NULL */
    /* CLGRAD_PROFILE: clg_launch keeps an event per launch (kprof set by the
     * replica); clg_kprof_take sums their kernel times */
    int kprof;
    cl_event *kev;
    int nkev, capkev;
    /* canonical local sizes for CLG_LAUNCH_PAD launches: 0 not decided yet,
     * 1 off, 2 on (see clg_launch) */
    int wg_canon;
};

typedef struct clg_program_stats {
    int built;        /* compiled from source */
    int cache_loaded; /* loaded from the on-disk binary cache */
    int cache_rejected; /* corrupt/foreign entries ignored */
    double build_seconds; /* total time in clBuildProgram (both kinds) */
} clg_program_stats;

struct clg_ctx {
    clg_err err;
    /* Guards what the devices' threads share: prog_stats and the lazily
     * created module slots below (clg_ctx_lock / clg_ctx_unlock). */
    pthread_mutex_t lock;
    clg_device *devs;
    int ndev;
    clg_opts opts; /* the settings (core/options.h), fixed at creation */
    int use_cache;
    int cache_readonly; /* CLGRAD_CACHE=ro: caches are read, never written (background helpers) */
    char cache_dir[1024];
    char kernel_dir[1024];
    clg_program_stats prog_stats;
    /* module slots, owned by their modules (freed in clg_ctx_destroy via hooks) */
    void *tune_db;
    void (*tune_db_free)(void *);
    void *conv_state; /* convolution module (FFT plans) */
    void (*conv_state_free)(void *);
};

/* Error buffer of the device (NULL: the thread-local one). */
static inline clg_err *clg_dev_err(clg_device *dev) { return dev ? &dev->err : NULL; }
static inline void clg_ctx_lock(clg_ctx *ctx) { pthread_mutex_lock(&ctx->lock); }
static inline void clg_ctx_unlock(clg_ctx *ctx) { pthread_mutex_unlock(&ctx->lock); }

/* Enumerates every device of every platform (in platform order) into infos
 * (malloc'd). Platforms that fail to answer are skipped with a warning. */
CLG_INTERNAL clg_status clg_enumerate(clg_err *err, clg_device_info **infos, cl_platform_id **plats,
                                      cl_device_id **ids, int *count);
/* Selects indices from the enumerated list by selector (see clg_ctx_params).
 * sel[] receives up to max indices; *nsel their count. */
CLG_INTERNAL clg_status clg_select_devices(clg_err *err, const char *selector, const clg_device_info *infos,
                                           int count, int *sel, int max, int *nsel);
/* A context of one device around the caller's in-order command queue (its
 * cl_context and device): both are retained here and released once by
 * clg_ctx_destroy, never more. p supplies the cache and kernel directories
 * (devices is ignored; NULL: defaults). An out-of-order queue is refused. */
CLG_INTERNAL clg_status clg_ctx_wrap_queue(cl_command_queue queue, const clg_ctx_params *p, clg_ctx **out);
/* Changes one option of a live context (tests and tools' measurement runs):
 * what a module decided once (e.g. wg_canon per device, the gemm backend)
 * stays decided. A refusal names the option. */
CLG_INTERNAL clg_status clg_ctx_option_set(clg_ctx *ctx, const char *name, const char *value);
/* 1 for a device of PoCL (platform "Portable Computing Language", or "PoCL"
 * in the device version), whatever its type: what the PoCL-specific
 * defaults test (binary cache at context end, huge pages on CPU devices). */
CLG_INTERNAL int clg_device_is_pocl(const clg_device *dev);
/* GPU vendor families the untuned defaults distinguish (from CL_DEVICE_VENDOR). */
typedef enum clg_vendor { CLG_VENDOR_OTHER = 0, CLG_VENDOR_NVIDIA, CLG_VENDOR_AMD, CLG_VENDOR_INTEL } clg_vendor;
CLG_INTERNAL clg_vendor clg_device_vendor(const clg_device *dev);
/* Identity of the device for stored measurements (tuning database,
 * convolution-algorithm cache): name, vendor, platform, driver and the
 * limits that decide which configurations can run (local memory, work-group
 * size, compute units, fp16), so an entry measured on another device, or on
 * the same simulator under other limits, is never reused. */
CLG_INTERNAL void clg_device_fingerprint(const clg_device *dev, char *buf, size_t len);
/* Milliseconds between CL_PROFILING_COMMAND_START and _END of ev. */
CLG_INTERNAL double clg_event_ms(cl_event ev);
/* Milliseconds between the start of a and the end of b. */
CLG_INTERNAL double clg_event_span_ms(cl_event a, cl_event b);

#endif
