/*
 * clgrad — a portable OpenCL deep-learning runtime.
 *
 * Overview
 *   A context (clg_ctx) owns one or more OpenCL devices, each with its own
 *   cl_context and in-order command queue. Kernels are JIT-compiled from the
 *   sources embedded in the library and their binaries cached on disk.
 *   Every fallible call returns a clg_status (CLG_OK == 0, errors < 0); the
 *   detail of the last failure is kept on the handle: clg_last_error(ctx).
 *   The library never exits or aborts on bad input.
 *
 * Thread safety
 *   A context is used by one thread at a time. clg_status_string() and
 *   clg_version*() are safe from any thread.
 *
 * Example (built and run by tests/test_example_header.c):
 *
 *   #include <clgrad.h>
 *   #include <stdio.h>
 *   int main(void) {
 *       clg_ctx_params p;
 *       clg_ctx_params_init(&p);
 *       p.devices = "all";
 *       clg_ctx *ctx = NULL;
 *       clg_status st = clg_ctx_create(&p, &ctx);
 *       if (st != CLG_OK) {
 *           fprintf(stderr, "clgrad: %s\n", clg_last_error(NULL));
 *           return 1;
 *       }
 *       for (int i = 0; i < clg_device_count(ctx); i++) {
 *           clg_device_info info;
 *           if (clg_device_info_get(ctx, i, &info) == CLG_OK)
 *               printf("%d: %s (%s)\n", i, info.name, info.vendor);
 *       }
 *       clg_ctx_destroy(ctx);
 *       return 0;
 *   }
 */
#ifndef CLGRAD_H
#define CLGRAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CLG_API __declspec(dllexport)
#elif defined(__GNUC__)
#define CLG_API __attribute__((visibility("default")))
#else
#define CLG_API
#endif

/* ---- version ---- */
#define CLG_VERSION_MAJOR 0
#define CLG_VERSION_MINOR 1
#define CLG_VERSION_PATCH 0
#define CLG_VERSION_HEX ((CLG_VERSION_MAJOR << 16) | (CLG_VERSION_MINOR << 8) | CLG_VERSION_PATCH)

/* (major << 16) | (minor << 8) | patch of the library actually loaded. */
CLG_API unsigned clg_version(void);
/* "major.minor.patch" of the library actually loaded. */
CLG_API const char *clg_version_string(void);

/* ---- status codes: one table, so codes and messages cannot drift ---- */
#define CLG_STATUS_MAP(X)                                                   \
    X(OK, 0, "success")                                                     \
    X(ERR_INVALID_ARG, -1, "invalid argument")                              \
    X(ERR_NO_DEVICE, -2, "no matching OpenCL device")                       \
    X(ERR_OPENCL, -3, "OpenCL call failed")                                 \
    X(ERR_BUILD, -4, "kernel build failed")                                 \
    X(ERR_HOST_OOM, -5, "out of host memory")                               \
    X(ERR_DEVICE_OOM, -6, "out of device memory")                           \
    X(ERR_IO, -7, "file I/O failed")                                        \
    X(ERR_FORMAT, -8, "malformed input")                                    \
    X(ERR_UNSUPPORTED, -9, "unsupported operation")                         \
    X(ERR_SHAPE, -10, "incompatible shapes")                                \
    X(ERR_NOT_FOUND, -11, "not found")                                      \
    X(ERR_CHECKSUM, -12, "checksum mismatch")                               \
    X(ERR_MPI, -13, "MPI call failed")                                      \
    X(ERR_INTERNAL, -14, "internal error")

typedef enum clg_status {
#define CLG_X_ENUM(name, code, msg) CLG_##name = code,
    CLG_STATUS_MAP(CLG_X_ENUM)
#undef CLG_X_ENUM
} clg_status;

/* Static message for a status code ("unknown status" for foreign values). */
CLG_API const char *clg_status_string(clg_status st);
/* Symbolic name without prefix, e.g. "ERR_IO". */
CLG_API const char *clg_status_name(clg_status st);

/* ---- context ---- */
typedef struct clg_ctx clg_ctx;

typedef struct clg_ctx_params {
    /* Device selector (borrowed): "all" (default), "gpu", "cpu",
     * an index list "0,2", or "name:SUBSTRING". Overridden by the
     * CLGRAD_DEVICES environment variable when NULL. */
    const char *devices;
    /* Program binary cache: 1 on (default), 0 off. CLGRAD_CACHE=0 also
     * turns it off. */
    int use_cache;
    /* Cache directory (borrowed); NULL: $CLGRAD_CACHE_DIR, else
     * $XDG_CACHE_HOME/clgrad, else $HOME/.cache/clgrad. */
    const char *cache_dir;
    /* Directory with .cl sources to use instead of the embedded ones
     * (borrowed); NULL: $CLGRAD_KERNEL_DIR when set. */
    const char *kernel_dir;
    /* 0 quiet, 1 info, 2 debug (to stderr). */
    int verbose;
} clg_ctx_params;

CLG_API void clg_ctx_params_init(clg_ctx_params *p);
/* Creates a context on the selected devices. On failure *out is NULL and
 * clg_last_error(NULL) tells why. */
CLG_API clg_status clg_ctx_create(const clg_ctx_params *p, clg_ctx **out);
/* NULL is a no-op. */
CLG_API void clg_ctx_destroy(clg_ctx *ctx);

/* Detail of the last failure on ctx; with ctx == NULL, of the last failure
 * in this thread that had no context (e.g. clg_ctx_create). Never NULL. */
CLG_API const char *clg_last_error(const clg_ctx *ctx);

/* ---- devices ---- */
typedef enum clg_device_type {
    CLG_DEVICE_CPU = 1,
    CLG_DEVICE_GPU = 2,
    CLG_DEVICE_ACCELERATOR = 4,
    CLG_DEVICE_OTHER = 8
} clg_device_type;

typedef struct clg_device_info {
    char name[128];
    char vendor[128];
    char platform[128];
    char driver_version[64];
    char device_version[64];   /* "OpenCL 3.0 PoCL ..." */
    char opencl_c_version[64]; /* "OpenCL C 1.2 ..." */
    clg_device_type type;
    int platform_index;        /* index among all platforms */
    int device_index;          /* index within its platform */
    unsigned compute_units;
    unsigned max_clock_mhz;
    uint64_t global_mem_bytes;
    uint64_t local_mem_bytes;
    uint64_t max_alloc_bytes;
    size_t max_work_group_size;
    int has_fp16;
    int has_fp64;
} clg_device_info;

/* Number of devices in the context (>= 1 for a created context). */
CLG_API int clg_device_count(const clg_ctx *ctx);
CLG_API clg_status clg_device_info_get(const clg_ctx *ctx, int index, clg_device_info *out);

/* Buffer pool statistics of one device. */
typedef struct clg_pool_stats {
    uint64_t bytes_in_use;   /* handed out and not yet released */
    uint64_t bytes_cached;   /* released, kept for reuse */
    uint64_t peak_bytes;     /* max of bytes_in_use */
    uint64_t hits;           /* allocations served from the cache */
    uint64_t misses;         /* allocations that went to clCreateBuffer */
    uint64_t failures;       /* allocations that failed */
} clg_pool_stats;

CLG_API clg_status clg_pool_stats_get(const clg_ctx *ctx, int device, clg_pool_stats *out);

/* Runs a small GEMM on every device against a host reference in double.
 * Returns CLG_OK when every device agrees within tolerance; max_rel_err
 * (may be NULL) receives the worst relative error seen. */
CLG_API clg_status clg_selfcheck(clg_ctx *ctx, double *max_rel_err);

#ifdef __cplusplus
}
#endif
#endif /* CLGRAD_H */
