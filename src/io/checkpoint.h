/* Checkpoints in the safetensors layout:
 *
 *   u64 little-endian N | N bytes of JSON header (space-padded to a
 *   multiple of 8) | raw little-endian tensor bytes
 *
 *   header = {"__metadata__": {"key": "value", ...},
 *             "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
 *             ...}
 *
 * data_offsets are relative to the first byte after the header; tensors are
 * contiguous and non-overlapping, covering the data section exactly.
 * Metadata values are strings. clg_ckpt_save adds "crc32.<tensor>" (8 hex
 * digits, CRC-32 of the tensor bytes) for every tensor, "format" =
 * CLG_CKPT_FORMAT and, as the first metadata entry, "header.crc32": the
 * CRC-32 of the whole padded header text with that value's 8 digits read
 * as "00000000". clg_ckpt_load requires the format key (a file without it
 * is not a clgrad checkpoint), requires and checks header.crc32 for
 * CLG_CKPT_FORMAT and a CRC per tensor for every format it reads; files
 * of CLG_CKPT_FORMAT_V1 (no header checksum, older clgrad) still load
 * (a header.crc32 found in one is checked too).
 * Parsing is linear in the header size; tensor and metadata counts and
 * the header size are capped.
 *
 * A checkpoint object is an in-memory list of named tensors plus string
 * metadata. The trainer decides what goes in; the conventional keys are
 * below. */
#ifndef CLG_IO_CHECKPOINT_H
#define CLG_IO_CHECKPOINT_H

#include "core/core.h"

#define CLG_CKPT_FORMAT "clgrad-ckpt-2"
#define CLG_CKPT_FORMAT_V1 "clgrad-ckpt-1" /* read only: no header checksum */
#define CLG_CKPT_MAX_DIMS 8
/* Larger headers / more entries are rejected as corrupt. */
#define CLG_CKPT_MAX_HEADER (64u * 1024u * 1024u)
#define CLG_CKPT_MAX_TENSORS 65536
#define CLG_CKPT_MAX_META (CLG_CKPT_MAX_TENSORS + 4096) /* one crc32.* per tensor plus the rest */

/* Conventional metadata keys. */
#define CLG_CKPT_KEY_FORMAT "format"       /* CLG_CKPT_FORMAT */
#define CLG_CKPT_KEY_HEADER_CRC "header.crc32" /* written and checked by save/load */
#define CLG_CKPT_KEY_MODEL "model"         /* model file text */
#define CLG_CKPT_KEY_STEP "step"           /* decimal */
#define CLG_CKPT_KEY_EPOCH "epoch"         /* decimal */
#define CLG_CKPT_KEY_RNG "rng"             /* clg_ckpt_set_rng format */
#define CLG_CKPT_KEY_OPTIMIZER "optimizer" /* "sgd", "adam", ... */
/* Optimizer hyper-parameters: "optimizer.lr", "optimizer.momentum", ...
 * Optimizer state tensors: e.g. "opt.m.<param>", "opt.v.<param>". */

typedef enum clg_ckpt_dtype {
    CLG_CKPT_F32 = 0,
    CLG_CKPT_F16 = 1,
    CLG_CKPT_I32 = 2,
    CLG_CKPT_I64 = 3,
    CLG_CKPT_U8 = 4,
} clg_ckpt_dtype;

typedef struct clg_ckpt_tensor {
    char *name;
    clg_ckpt_dtype dtype;
    int ndim;                           /* 0 (scalar) .. CLG_CKPT_MAX_DIMS */
    int64_t shape[CLG_CKPT_MAX_DIMS];
    size_t numel;
    size_t nbytes;                      /* numel * dtype size */
    void *data;                         /* owned, nbytes (little-endian; big-endian hosts are rejected) */
} clg_ckpt_tensor;

typedef struct clg_ckpt_meta {
    char *key;
    char *value;
} clg_ckpt_meta;

typedef struct clg_ckpt {
    clg_ckpt_tensor *t;  /* in insertion (or file) order */
    int nt, cap_t;
    clg_ckpt_meta *meta; /* in insertion (or file) order */
    int nmeta, cap_meta;
    int *index[2];       /* private: hash tables of tensor / metadata names (slot: entry + 1, 0 empty) */
    int index_cap[2];
} clg_ckpt;

/* "F32", ... ; element size in bytes. */
CLG_INTERNAL const char *clg_ckpt_dtype_name(clg_ckpt_dtype dt);
CLG_INTERNAL size_t clg_ckpt_dtype_size(clg_ckpt_dtype dt);

/* ---- building ---- */
CLG_INTERNAL clg_status clg_ckpt_create(clg_err *err, clg_ckpt **out);
/* NULL is a no-op. */
CLG_INTERNAL void clg_ckpt_free(clg_ckpt *ck);

/* Adds a tensor, copying nbytes = prod(shape) * size(dtype) from data
 * (data NULL: zero-filled). Names must be unique, non-empty and not
 * "__metadata__". *out_data (may be NULL) receives the owned buffer, so a
 * caller can fill it in place (e.g. clEnqueueReadBuffer into it). */
CLG_INTERNAL clg_status clg_ckpt_add(clg_err *err, clg_ckpt *ck, const char *name, clg_ckpt_dtype dtype, int ndim,
                                     const int64_t *shape, const void *data, void **out_data);
/* Convenience: f32 tensor with int dims. */
CLG_INTERNAL clg_status clg_ckpt_add_f32(clg_err *err, clg_ckpt *ck, const char *name, int ndim, const int *shape,
                                         const float *data);

/* Sets (or replaces) a metadata string. */
CLG_INTERNAL clg_status clg_ckpt_set_meta(clg_err *err, clg_ckpt *ck, const char *key, const char *value);
CLG_INTERNAL clg_status clg_ckpt_set_meta_i64(clg_err *err, clg_ckpt *ck, const char *key, int64_t v);
/* Doubles are written with %.17g so they read back bitwise. */
CLG_INTERNAL clg_status clg_ckpt_set_meta_f64(clg_err *err, clg_ckpt *ck, const char *key, double v);
/* rng as "<state hex>:<inc hex>" (16 hex digits each). */
CLG_INTERNAL clg_status clg_ckpt_set_rng(clg_err *err, clg_ckpt *ck, const char *key, const clg_rng *r);

/* ---- reading ---- */
/* NULL when absent. */
CLG_INTERNAL const char *clg_ckpt_get_meta(const clg_ckpt *ck, const char *key);
/* Missing key or malformed value: CLG_ERR_FORMAT naming the key. */
CLG_INTERNAL clg_status clg_ckpt_get_meta_i64(clg_err *err, const clg_ckpt *ck, const char *key, int64_t *out);
CLG_INTERNAL clg_status clg_ckpt_get_meta_f64(clg_err *err, const clg_ckpt *ck, const char *key, double *out);
/* Range-checked forms for values a resumed run trusts (sizes, indices,
 * divisors): missing, malformed, out of [lo, hi] (inclusive) or, for f64,
 * not finite -> CLG_ERR_FORMAT "checkpoint metadata 'KEY' = 'VALUE' is
 * outside [lo, hi]". For a strictly positive f64 pass lo = DBL_MIN.
 *
 * Ranges for the keys the training session writes (what a resume should
 * enforce; S = steps per epoch of the run being resumed, B = its batch):
 *   step                   i64 [0, INT64_MAX]
 *   epoch                  i64 [0, INT32_MAX]     (stored in an int)
 *   batch_in_epoch         i64 [0, S]
 *   batch                  i64 [1, 1 << 20], and == B
 *   norm.channels          i64 [0, CLG_DS_MAX_CHANNELS (16)], and (resume: required) the run's
 *                          normalized channels: the model's input channels, 0 only without one
 *   seed                   i64 [0, INT64_MAX] (the --seed range)
 *   total_steps            i64 [0, INT64_MAX / 2], and 0 or at least step
 *   rng                    hex:hex, and (resume) the stream clg_rng_seed(seed, epoch) gives
 *   epoch                  also at most the resumed run's epochs (batch_in_epoch 0 when equal)
 *   norm.mean.<c>          f64 finite [-1e5, 1e5]
 *   norm.std.<c>           f64 finite [1e-6, 1e5] (the writer stores 1 below 1e-6)
 *   optimizer.t            i64 [0, step]
 *   optimizer.nesterov     i64 [0, 1]
 *   optimizer.lr           f64 finite [0, DBL_MAX];  optimizer.weight_decay f64 finite [0, DBL_MAX]
 *                          (the command line's ranges)
 *   optimizer.momentum, optimizer.beta1, optimizer.beta2   f64 finite [0, 1)
 *                          (pass hi = nextafter(1, 0))
 *   optimizer.epsilon      f64 finite [0, 1] (the model file's range)
 *   fp16.loss_scale        f64 finite [CLG_LS_MIN, CLG_LS_MAX]
 *   fp16.good_steps, fp16.skipped   i64 [0, INT64_MAX]
 */
CLG_INTERNAL clg_status clg_ckpt_get_meta_i64_range(clg_err *err, const clg_ckpt *ck, const char *key, int64_t lo,
                                                    int64_t hi, int64_t *out);
CLG_INTERNAL clg_status clg_ckpt_get_meta_f64_range(clg_err *err, const clg_ckpt *ck, const char *key, double lo,
                                                    double hi, double *out);
CLG_INTERNAL clg_status clg_ckpt_get_rng(clg_err *err, const clg_ckpt *ck, const char *key, clg_rng *out);

/* NULL when absent. */
CLG_INTERNAL const clg_ckpt_tensor *clg_ckpt_find(const clg_ckpt *ck, const char *name);
/* Copies tensor `name` into dst after checking it exists, is F32 and has
 * exactly the expected numel (and, when ndim > 0, the expected shape):
 * CLG_ERR_NOT_FOUND / CLG_ERR_SHAPE with a message naming the tensor and
 * both shapes ("checkpoint tensor 'conv1.weight' has shape [32,1,3,3],
 * the model expects [64,1,3,3]"). ndim 0: only numel is checked. */
CLG_INTERNAL clg_status clg_ckpt_get_f32(clg_err *err, const clg_ckpt *ck, const char *name, int ndim,
                                         const int *shape, size_t numel, float *dst);

/* ---- files ---- */
/* Serializes (adding format + crc32.* metadata to ck) and writes path
 * atomically (temp file in the same directory, fsync, rename): on failure
 * an earlier file at path is left untouched. */
CLG_INTERNAL clg_status clg_ckpt_save(clg_err *err, clg_ckpt *ck, const char *path);
/* Reads and validates path: header length vs file size, header size cap,
 * JSON syntax, known dtypes, shape * dtype overflow, offsets in range,
 * contiguous and non-overlapping, CRC per tensor. Errors name the file and
 * the tensor. */
CLG_INTERNAL clg_status clg_ckpt_load(clg_err *err, const char *path, clg_ckpt **out);

/* In-memory forms of save/load (save's metadata additions included).
 * *buf is malloc'd. source names the data in messages. */
CLG_INTERNAL clg_status clg_ckpt_serialize(clg_err *err, clg_ckpt *ck, void **buf, size_t *len);
CLG_INTERNAL clg_status clg_ckpt_parse(clg_err *err, const void *buf, size_t len, const char *source,
                                       clg_ckpt **out);

#endif
