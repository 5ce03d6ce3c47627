/* Core utilities shared by every layer of the library. No OpenCL here. */
#ifndef CLG_CORE_H
#define CLG_CORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "clgrad.h"

#define CLG_INTERNAL __attribute__((visibility("hidden")))
#define CLG_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define CLG_UNUSED(x) ((void)(x))
#define CLG_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CLG_MAX(a, b) ((a) > (b) ? (a) : (b))
#define CLG_CEIL_DIV(a, b) (((a) + (b)-1) / (b))
#define CLG_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
/* Propagates a failing clg_status. */
#define CLG_TRY(expr)                         \
    do {                                      \
        clg_status clg_s_ = (expr);           \
        if (clg_s_ != CLG_OK)                 \
            return clg_s_;                    \
    } while (0)

#define CLG_ERR_LEN 8192

/* ---- errors ----
 * An error buffer lives on each context (or thread-locally when there is
 * none). clg_err_set() formats the detail, records it, and returns st so a
 * caller can write `return clg_err_set(ctx, CLG_ERR_IO, "open %s: %s", ...)`. */
typedef struct clg_err {
    char msg[CLG_ERR_LEN];
    uint64_t seq; /* order of the failure among all buffers (clg_last_error picks the newest) */
} clg_err;

/* err may be NULL: the thread-local buffer is used. */
CLG_INTERNAL clg_status clg_err_setv(clg_err *err, clg_status st, const char *fmt, va_list ap);
CLG_INTERNAL clg_status clg_err_set(clg_err *err, clg_status st, const char *fmt, ...) CLG_PRINTF(3, 4);
/* Thread-local buffer used when no handle exists. */
CLG_INTERNAL clg_err *clg_err_tls(void);
/* Copies src's message and order into dst (a lane's failure reported on
 * the context). */
CLG_INTERNAL void clg_err_copy(clg_err *dst, const clg_err *src);

/* ---- caller-sized structs (the ABI that can grow) ----
 * Public params structs start with `size_t size`: the sizeof the caller was
 * compiled with, written by the _init macro. The library touches only the
 * bytes within that size; fields past it keep the library's defaults. */
/* The first min(size, full) bytes of defaults (a whole struct of full
 * bytes) into dst, then dst->size = size. */
CLG_INTERNAL void clg_sized_init(void *dst, size_t size, const void *defaults, size_t full);
/* dst (full bytes, holding defaults) gets the first min(src->size, full)
 * bytes of src, then dst->size = full. A size below sizeof(size_t) or
 * above 64 KiB means the struct was not initialised: CLG_ERR_INVALID_ARG
 * naming `what` (e.g. "clg_ctx_params"). */
CLG_INTERNAL clg_status clg_sized_read(clg_err *err, const char *what, void *dst, size_t full, const void *src);
/* Output structs: the first min(size, full) bytes of src (full bytes) into dst. */
CLG_INTERNAL void clg_sized_write(void *dst, size_t size, const void *src, size_t full);

/* ---- logging (stderr) ---- */
extern CLG_INTERNAL int clg_log_level; /* 0 quiet, 1 info, 2 debug */
CLG_INTERNAL void clg_log(int level, const char *fmt, ...) CLG_PRINTF(2, 3);

/* ---- hashing ---- */
/* 64-bit FNV-1a; chain by passing the previous value as seed. */
#define CLG_HASH_SEED 0xcbf29ce484222325ULL
CLG_INTERNAL uint64_t clg_hash64(const void *data, size_t len, uint64_t seed);
CLG_INTERNAL uint64_t clg_hash_str(const char *s, uint64_t seed);
/* CRC-32 (IEEE 802.3, as zlib's crc32). */
CLG_INTERNAL uint32_t clg_crc32(uint32_t crc, const void *data, size_t len);

/* ---- files ---- */
/* Reads a whole regular file into a malloc'd buffer with a trailing NUL
 * (not counted in *len). Directories, FIFOs and devices are refused (opened
 * without blocking, then checked with fstat). */
CLG_INTERNAL clg_status clg_file_read(clg_err *err, const char *path, char **out, size_t *len);
/* clg_file_read for text: an embedded NUL is CLG_ERR_FORMAT "path:offset N". */
CLG_INTERNAL clg_status clg_file_read_text(clg_err *err, const char *path, char **out, size_t *len);
/* CLG_ERR_FORMAT "source:offset N: NUL byte ..." when text[0..len) holds a NUL. */
CLG_INTERNAL clg_status clg_text_check_nul(clg_err *err, const char *source, const char *text, size_t len);
/* Writes data atomically: temp file in the same directory, fsync, rename,
 * fsync of the directory. On failure the destination is untouched. After
 * the rename, PATH.tmp.XXXXXX files older than this write (left by killed
 * writers) are removed; nothing else in the directory is touched. */
CLG_INTERNAL clg_status clg_file_write_atomic(clg_err *err, const char *path, const void *data, size_t len);
/* The same sweep on its own, for the files modified before now: how many
 * PATH.tmp.XXXXXX files were removed, the first one's path into first
 * (cap > 0: "" when none). Best effort. */
CLG_INTERNAL int clg_file_remove_stale_temps(const char *path, char *first, size_t cap);
/* mkdir -p. */
CLG_INTERNAL clg_status clg_mkdirs(clg_err *err, const char *path);
/* An advisory exclusive lock (fcntl) on PATH.lock, created when missing, for
 * read-modify-write of PATH by several processes: the fd to pass to
 * clg_file_unlock, or -1 when it could not be had within timeout_s seconds
 * (the caller goes on unlocked: its writes stay atomic, only a concurrent
 * update may then be lost). A dying process releases its lock. */
CLG_INTERNAL int clg_file_lock(const char *path, double timeout_s);
CLG_INTERNAL void clg_file_unlock(int fd);

/* ---- time ---- */
CLG_INTERNAL double clg_now_sec(void);
/* CPU seconds of the calling thread / of the whole process (0 when unknown). */
CLG_INTERNAL double clg_thread_cpu_sec(void);
CLG_INTERNAL double clg_process_cpu_sec(void);
/* 1 when s contains w, ignoring ASCII case (vendor and device names). */
CLG_INTERNAL int clg_str_icontains(const char *s, const char *w);

/* ---- random numbers (PCG32, reproducible across platforms) ---- */
typedef struct clg_rng {
    uint64_t state;
    uint64_t inc;
} clg_rng;
CLG_INTERNAL void clg_rng_seed(clg_rng *r, uint64_t seed, uint64_t stream);
CLG_INTERNAL uint32_t clg_rng_u32(clg_rng *r);
CLG_INTERNAL float clg_rng_uniform(clg_rng *r); /* [0,1) */
CLG_INTERNAL float clg_rng_normal(clg_rng *r);  /* N(0,1), Box-Muller */

/* ---- small JSON writer (appends into a growable string) ---- */
typedef struct clg_sbuf {
    char *data;
    size_t len, cap;
    int oom;
} clg_sbuf;
CLG_INTERNAL void clg_sbuf_printf(clg_sbuf *b, const char *fmt, ...) CLG_PRINTF(2, 3);
CLG_INTERNAL void clg_sbuf_json_str(clg_sbuf *b, const char *s); /* quoted + escaped */
CLG_INTERNAL void clg_sbuf_free(clg_sbuf *b);

#endif
