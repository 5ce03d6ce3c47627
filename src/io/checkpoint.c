/* Checkpoints in the safetensors layout, with CRC-32 per tensor. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/json.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [CLG_CKPT_F32] = {"F32", 4}, [CLG_CKPT_F16] = {"F16", 2}, [CLG_CKPT_I32] = {"I32", 4},
    [CLG_CKPT_I64] = {"I64", 8}, [CLG_CKPT_U8] = {"U8", 1},
};
#define N_DTYPES ((int)CLG_ARRAY_LEN(dtypes))

const char *clg_ckpt_dtype_name(clg_ckpt_dtype dt)
{
    return (int)dt >= 0 && (int)dt < N_DTYPES ? dtypes[dt].name : "?";
}

size_t clg_ckpt_dtype_size(clg_ckpt_dtype dt) { return (int)dt >= 0 && (int)dt < N_DTYPES ? dtypes[dt].size : 0; }

static int host_is_le(void)
{
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

clg_status clg_ckpt_create(clg_err *err, clg_ckpt **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "checkpoint: out of memory");
    return CLG_OK;
}

void clg_ckpt_free(clg_ckpt *ck)
{
    if (!ck)
        return;
    for (int i = 0; i < ck->nt; i++) {
        free(ck->t[i].name);
        free(ck->t[i].data);
    }
    for (int i = 0; i < ck->nmeta; i++) {
        free(ck->meta[i].key);
        free(ck->meta[i].value);
    }
    free(ck->t);
    free(ck->meta);
    free(ck->index[0]);
    free(ck->index[1]);
    free(ck);
}

/* numel and nbytes with overflow checks: 0 on overflow. */
static int shape_size(int ndim, const int64_t *shape, size_t esize, size_t *numel, size_t *nbytes)
{
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return 0;
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / d)
            return 0;
        n *= d;
    }
    if (esize && n > UINT64_MAX / esize)
        return 0;
    if (n * esize > (uint64_t)SIZE_MAX)
        return 0;
    *numel = (size_t)n;
    *nbytes = (size_t)(n * esize);
    return 1;
}

// ---- name index (open addressing, so a header with many entries parses in linear time) ----

enum { IX_TENSOR = 0, IX_META = 1 };

static const char *ix_name(const clg_ckpt *ck, int kind, int i) { return kind == IX_TENSOR ? ck->t[i].name : ck->meta[i].key; }
static int ix_count(const clg_ckpt *ck, int kind) { return kind == IX_TENSOR ? ck->nt : ck->nmeta; }

/* Entry index of name, or -1. */
static int ix_find(const clg_ckpt *ck, int kind, const char *name)
{
    int cap = ck->index_cap[kind];
    if (!cap)
        return -1;
    const int *slot = ck->index[kind];
    for (size_t h = (size_t)clg_hash_str(name, CLG_HASH_SEED) & (size_t)(cap - 1);; h = (h + 1) & (size_t)(cap - 1)) {
        if (!slot[h])
            return -1;
        if (strcmp(ix_name(ck, kind, slot[h] - 1), name) == 0)
            return slot[h] - 1;
    }
}

static void ix_put(int *slot, int cap, const char *name, int entry)
{
    size_t h = (size_t)clg_hash_str(name, CLG_HASH_SEED) & (size_t)(cap - 1);
    while (slot[h])
        h = (h + 1) & (size_t)(cap - 1);
    slot[h] = entry + 1;
}

/* Indexes entry `entry` (already stored); 0 when out of memory. */
static int ix_add(clg_ckpt *ck, int kind, int entry)
{
    int n = ix_count(ck, kind);
    if (2 * n > ck->index_cap[kind]) { /* keep the load under 1/2 */
        int cap = 64;
        while (cap < 4 * n)
            cap *= 2;
        int *slot = calloc((size_t)cap, sizeof *slot);
        if (!slot)
            return 0;
        for (int i = 0; i < n; i++)
            if (i != entry)
                ix_put(slot, cap, ix_name(ck, kind, i), i);
        free(ck->index[kind]);
        ck->index[kind] = slot;
        ck->index_cap[kind] = cap;
    }
    ix_put(ck->index[kind], ck->index_cap[kind], ix_name(ck, kind, entry), entry);
    return 1;
}

const clg_ckpt_tensor *clg_ckpt_find(const clg_ckpt *ck, const char *name)
{
    int i = ix_find(ck, IX_TENSOR, name);
    return i < 0 ? NULL : &ck->t[i];
}

clg_status clg_ckpt_add(clg_err *err, clg_ckpt *ck, const char *name, clg_ckpt_dtype dtype, int ndim,
                        const int64_t *shape, const void *data, void **out_data)
{
    if (out_data)
        *out_data = NULL;
    if (!name || !*name || strcmp(name, "__metadata__") == 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "checkpoint: invalid tensor name '%s'", name ? name : "(null)");
    if ((int)dtype < 0 || (int)dtype >= N_DTYPES)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "checkpoint: tensor '%s': unknown dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > CLG_CKPT_MAX_DIMS)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "checkpoint: tensor '%s': %d dimensions (0 to %d)", name, ndim,
                           CLG_CKPT_MAX_DIMS);
    if (clg_ckpt_find(ck, name))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "checkpoint: duplicate tensor name '%s'", name);
    size_t numel, nbytes;
    if (!shape_size(ndim, shape, dtypes[dtype].size, &numel, &nbytes))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "checkpoint: tensor '%s': bad or overflowing shape", name);
    if (ck->nt == ck->cap_t) {
        int nc = ck->cap_t ? ck->cap_t * 2 : 16;
        clg_ckpt_tensor *nt = realloc(ck->t, sizeof *nt * (size_t)nc);
        if (!nt)
            return clg_err_set(err, CLG_ERR_HOST_OOM, "checkpoint: out of memory");
        ck->t = nt;
        ck->cap_t = nc;
    }
    clg_ckpt_tensor *t = &ck->t[ck->nt];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    t->data = data ? malloc(nbytes ? nbytes : 1) : calloc(nbytes ? nbytes : 1, 1);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "checkpoint: no memory for tensor '%s' (%zu bytes)", name, nbytes);
    }
    if (data && nbytes)
        memcpy(t->data, data, nbytes);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->numel = numel;
    t->nbytes = nbytes;
    ck->nt++;
    if (!ix_add(ck, IX_TENSOR, ck->nt - 1)) {
        ck->nt--;
        free(t->name);
        free(t->data);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "checkpoint: out of memory");
    }
    if (out_data)
        *out_data = t->data;
    return CLG_OK;
}

clg_status clg_ckpt_add_f32(clg_err *err, clg_ckpt *ck, const char *name, int ndim, const int *shape,
                            const float *data)
{
    int64_t s[CLG_CKPT_MAX_DIMS];
    if (ndim < 0 || ndim > CLG_CKPT_MAX_DIMS)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "checkpoint: tensor '%s': %d dimensions (0 to %d)", name, ndim,
                           CLG_CKPT_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        s[i] = shape[i];
    return clg_ckpt_add(err, ck, name, CLG_CKPT_F32, ndim, s, data, NULL);
}

// ---- metadata ----

static clg_ckpt_meta *meta_find(const clg_ckpt *ck, const char *key)
{
    int i = ix_find(ck, IX_META, key);
    return i < 0 ? NULL : &ck->meta[i];
}

clg_status clg_ckpt_set_meta(clg_err *err, clg_ckpt *ck, const char *key, const char *value)
{
    if (!key || !*key || !value)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "checkpoint: metadata key/value missing");
    char *v = xstrdup(value);
    if (!v)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "checkpoint: out of memory");
    clg_ckpt_meta *m = meta_find(ck, key);
    if (m) {
        free(m->value);
        m->value = v;
        return CLG_OK;
    }
    if (ck->nmeta == ck->cap_meta) {
        int nc = ck->cap_meta ? ck->cap_meta * 2 : 16;
        clg_ckpt_meta *nm = realloc(ck->meta, sizeof *nm * (size_t)nc);
        if (!nm) {
            free(v);
            return clg_err_set(err, CLG_ERR_HOST_OOM, "checkpoint: out of memory");
        }
        ck->meta = nm;
        ck->cap_meta = nc;
    }
    char *k = xstrdup(key);
    if (!k) {
        free(v);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "checkpoint: out of memory");
    }
    ck->meta[ck->nmeta].key = k;
    ck->meta[ck->nmeta].value = v;
    ck->nmeta++;
    if (!ix_add(ck, IX_META, ck->nmeta - 1)) {
        ck->nmeta--;
        free(k);
        free(v);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "checkpoint: out of memory");
    }
    return CLG_OK;
}

clg_status clg_ckpt_set_meta_i64(clg_err *err, clg_ckpt *ck, const char *key, int64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%" PRId64, v);
    return clg_ckpt_set_meta(err, ck, key, b);
}

clg_status clg_ckpt_set_meta_f64(clg_err *err, clg_ckpt *ck, const char *key, double v)
{
    char b[40];
    snprintf(b, sizeof b, "%.17g", v);
    return clg_ckpt_set_meta(err, ck, key, b);
}

clg_status clg_ckpt_set_rng(clg_err *err, clg_ckpt *ck, const char *key, const clg_rng *r)
{
    char b[40];
    snprintf(b, sizeof b, "%016" PRIx64 ":%016" PRIx64, r->state, r->inc);
    return clg_ckpt_set_meta(err, ck, key, b);
}

const char *clg_ckpt_get_meta(const clg_ckpt *ck, const char *key)
{
    const clg_ckpt_meta *m = meta_find(ck, key);
    return m ? m->value : NULL;
}

clg_status clg_ckpt_get_meta_i64(clg_err *err, const clg_ckpt *ck, const char *key, int64_t *out)
{
    const char *v = clg_ckpt_get_meta(ck, key);
    if (!v)
        return clg_err_set(err, CLG_ERR_FORMAT, "checkpoint has no metadata '%s'", key);
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno == ERANGE)
        return clg_err_set(err, CLG_ERR_FORMAT, "checkpoint metadata '%s' = '%s' is not an integer", key, v);
    *out = x;
    return CLG_OK;
}

clg_status clg_ckpt_get_meta_f64(clg_err *err, const clg_ckpt *ck, const char *key, double *out)
{
    const char *v = clg_ckpt_get_meta(ck, key);
    if (!v)
        return clg_err_set(err, CLG_ERR_FORMAT, "checkpoint has no metadata '%s'", key);
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end)
        return clg_err_set(err, CLG_ERR_FORMAT, "checkpoint metadata '%s' = '%s' is not a number", key, v);
    *out = x;
    return CLG_OK;
}

/* CLG_ERR_FORMAT naming the key, its value and the allowed range. */
static clg_status range_error(clg_err *err, const clg_ckpt *ck, const char *key, const char *range)
{
    return clg_err_set(err, CLG_ERR_FORMAT, "checkpoint metadata '%s' = '%s' is outside %s (corrupt or edited?)", key,
                       clg_ckpt_get_meta(ck, key), range);
}

clg_status clg_ckpt_get_meta_i64_range(clg_err *err, const clg_ckpt *ck, const char *key, int64_t lo, int64_t hi,
                                       int64_t *out)
{
    int64_t v = 0;
    clg_status st = clg_ckpt_get_meta_i64(err, ck, key, &v);
    if (st == CLG_OK && (v < lo || v > hi)) {
        char r[64];
        snprintf(r, sizeof r, "[%" PRId64 ", %" PRId64 "]", lo, hi);
        st = range_error(err, ck, key, r);
    }
    if (st == CLG_OK)
        *out = v;
    return st;
}

clg_status clg_ckpt_get_meta_f64_range(clg_err *err, const clg_ckpt *ck, const char *key, double lo, double hi,
                                       double *out)
{
    double v = 0;
    clg_status st = clg_ckpt_get_meta_f64(err, ck, key, &v);
    if (st != CLG_OK)
        return st;
    if (isfinite(v) && v >= lo && v <= hi) {
        *out = v;
        return CLG_OK;
    }
    char r[96];
    snprintf(r, sizeof r, "the finite range [%g, %g]", lo, hi);
    return range_error(err, ck, key, r);
}

static int parse_hex64(const char *s, size_t n, uint64_t *out)
{
    if (n != 16)
        return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return 0;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return 1;
}

clg_status clg_ckpt_get_rng(clg_err *err, const clg_ckpt *ck, const char *key, clg_rng *out)
{
    const char *v = clg_ckpt_get_meta(ck, key);
    if (!v)
        return clg_err_set(err, CLG_ERR_FORMAT, "checkpoint has no metadata '%s'", key);
    const char *colon = strchr(v, ':');
    clg_rng r;
    if (!colon || !parse_hex64(v, (size_t)(colon - v), &r.state) || !parse_hex64(colon + 1, strlen(colon + 1), &r.inc) ||
        !(r.inc & 1))
        return clg_err_set(err, CLG_ERR_FORMAT, "checkpoint metadata '%s' = '%s' is not an rng state (hex:hex)", key,
                           v);
    *out = r;
    return CLG_OK;
}

static void fmt_shape(char *b, size_t cap, int ndim, const int64_t *s64, const int *s32)
{
    size_t n = 0;
    n += (size_t)snprintf(b + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(b + n, cap - n, "%s%lld", i ? "," : "", s64 ? (long long)s64[i] : (long long)s32[i]);
    if (n < cap)
        snprintf(b + n, cap - n, "]");
}

clg_status clg_ckpt_get_f32(clg_err *err, const clg_ckpt *ck, const char *name, int ndim, const int *shape,
                            size_t numel, float *dst)
{
    const clg_ckpt_tensor *t = clg_ckpt_find(ck, name);
    if (!t)
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "checkpoint has no tensor '%s' (from another model?)", name);
    if (t->dtype != CLG_CKPT_F32)
        return clg_err_set(err, CLG_ERR_SHAPE, "checkpoint tensor '%s' has dtype %s, expected F32", name,
                           clg_ckpt_dtype_name(t->dtype));
    int same = t->numel == numel;
    if (same && ndim > 0) {
        same = t->ndim == ndim;
        for (int i = 0; same && i < ndim; i++)
            same = t->shape[i] == shape[i];
    }
    if (!same) {
        char a[160], b[160];
        fmt_shape(a, sizeof a, t->ndim, t->shape, NULL);
        if (ndim > 0)
            fmt_shape(b, sizeof b, ndim, NULL, shape);
        else
            snprintf(b, sizeof b, "%zu elements", numel);
        return clg_err_set(err, CLG_ERR_SHAPE,
                           "checkpoint tensor '%s' has shape %s, the model expects %s (checkpoint from another model?)",
                           name, a, b);
    }
    memcpy(dst, t->data, t->nbytes);
    return CLG_OK;
}

// ---- serialization ----

clg_status clg_ckpt_serialize(clg_err *err, clg_ckpt *ck, void **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    if (!host_is_le())
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "checkpoints need a little-endian host");
    clg_status st = clg_ckpt_set_meta(err, ck, CLG_CKPT_KEY_FORMAT, CLG_CKPT_FORMAT);
    if (st != CLG_OK)
        return st;
    for (int i = 0; i < ck->nt; i++) {
        char key[512], val[16];
        const clg_ckpt_tensor *t = &ck->t[i];
        if (snprintf(key, sizeof key, "crc32.%s", t->name) >= (int)sizeof key)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "checkpoint: tensor name '%.64s...' too long", t->name);
        snprintf(val, sizeof val, "%08" PRIx32, clg_crc32(0, t->data, t->nbytes));
        st = clg_ckpt_set_meta(err, ck, key, val);
        if (st != CLG_OK)
            return st;
    }
    clg_sbuf h = {0};
    /* header.crc32 first, as zeros; patched once the header is complete */
    clg_sbuf_printf(&h, "{\"__metadata__\":{\"" CLG_CKPT_KEY_HEADER_CRC "\":\"");
    size_t crc_at = h.len;
    clg_sbuf_printf(&h, "00000000\"");
    for (int i = 0; i < ck->nmeta; i++) {
        if (strcmp(ck->meta[i].key, CLG_CKPT_KEY_HEADER_CRC) == 0)
            continue; /* from a loaded checkpoint: rewritten above */
        clg_sbuf_printf(&h, ",");
        clg_sbuf_json_str(&h, ck->meta[i].key);
        clg_sbuf_printf(&h, ":");
        clg_sbuf_json_str(&h, ck->meta[i].value);
    }
    clg_sbuf_printf(&h, "}");
    uint64_t off = 0;
    for (int i = 0; i < ck->nt; i++) {
        const clg_ckpt_tensor *t = &ck->t[i];
        clg_sbuf_printf(&h, ",");
        clg_sbuf_json_str(&h, t->name);
        clg_sbuf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", dtypes[t->dtype].name);
        for (int d = 0; d < t->ndim; d++)
            clg_sbuf_printf(&h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        clg_sbuf_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + t->nbytes);
        off += t->nbytes;
    }
    clg_sbuf_printf(&h, "}");
    while (!h.oom && h.len % 8 != 0)
        clg_sbuf_printf(&h, " ");
    if (h.oom) {
        clg_sbuf_free(&h);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "checkpoint: out of memory building the header");
    }
    char crc[9];
    snprintf(crc, sizeof crc, "%08" PRIx32, clg_crc32(0, h.data, h.len));
    memcpy(h.data + crc_at, crc, 8);
    clg_status cst = clg_ckpt_set_meta(err, ck, CLG_CKPT_KEY_HEADER_CRC, crc); /* ck shows what was written */
    if (cst != CLG_OK) {
        clg_sbuf_free(&h);
        return cst;
    }
    size_t total = 8 + h.len + (size_t)off;
    uint8_t *b = malloc(total);
    if (!b) {
        clg_sbuf_free(&h);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "checkpoint: no memory for %zu bytes", total);
    }
    uint64_t hl = h.len;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(hl >> (8 * i));
    memcpy(b + 8, h.data, h.len);
    uint8_t *p = b + 8 + h.len;
    for (int i = 0; i < ck->nt; i++) {
        const clg_ckpt_tensor *t = &ck->t[i];
        if (t->nbytes)
            memcpy(p, t->data, t->nbytes);
        p += t->nbytes;
    }
    clg_sbuf_free(&h);
    *buf = b;
    *len = total;
    return CLG_OK;
}

clg_status clg_ckpt_save(clg_err *err, clg_ckpt *ck, const char *path)
{
    void *buf = NULL;
    size_t len = 0;
    clg_status st = clg_ckpt_serialize(err, ck, &buf, &len);
    if (st != CLG_OK)
        return st;
    st = clg_file_write_atomic(err, path, buf, len);
    free(buf);
    return st;
}

// ---- parsing: one row per field of a tensor's header entry ----

typedef struct span {
    uint64_t b, e;
    int idx;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->b != y->b)
        return x->b < y->b ? -1 : 1;
    if (x->e != y->e)
        return x->e < y->e ? -1 : 1;
    return x->idx - y->idx;
}

#define PERR(st, ...) (clg_err_set(err, st, __VA_ARGS__), st)

/* What a tensor's header entry says, filled field by field. */
typedef struct tensor_hdr {
    clg_ckpt_dtype dtype;
    int ndim;
    int64_t shape[CLG_CKPT_MAX_DIMS];
    size_t numel, nbytes; /* from shape x dtype size */
    uint64_t off[2];      /* data_offsets: [begin, end) in the data section */
} tensor_hdr;

/* Where an entry is checked: for messages, and the data section's size. */
typedef struct field_env {
    clg_err *err;
    const char *src, *name;
    uint64_t dlen;
} field_env;

struct field_row;
/* Range checks of one field's value (of the row's JSON type); stores it into t. */
typedef clg_status (*field_check)(const field_env *e, const struct field_row *row, const clg_json *v, tensor_hdr *t);

typedef struct field_row {
    const char *key;
    clg_json_type type; /* the value's JSON type */
    int required;
    int max_items;      /* arrays: most elements */
    uint64_t max;       /* integers: largest value */
    field_check check;  /* range, then the destination in tensor_hdr */
    const char *bad;    /* message when absent (if required) or of another type */
} field_row;

#define FERR(e, ...) clg_err_set((e)->err, CLG_ERR_FORMAT, __VA_ARGS__)

static clg_status check_dtype(const field_env *e, const field_row *row, const clg_json *v, tensor_hdr *t)
{
    (void)row;
    for (int i = 0; i < N_DTYPES; i++)
        if (strcmp(v->str, dtypes[i].name) == 0) {
            t->dtype = (clg_ckpt_dtype)i;
            return CLG_OK;
        }
    return FERR(e, "checkpoint '%s': tensor '%s': unsupported dtype '%s' (F32, F16, I32, I64, U8)", e->src, e->name,
                v->str);
}

/* after dtype: the shape's element and byte counts */
static clg_status check_shape(const field_env *e, const field_row *row, const clg_json *v, tensor_hdr *t)
{
    if (v->n > row->max_items)
        return FERR(e, "checkpoint '%s': tensor '%s': %d dimensions (at most %d)", e->src, e->name, v->n,
                    row->max_items);
    for (int d = 0; d < v->n; d++) {
        uint64_t x;
        if (!clg_json_u64(&v->items[d], &x) || x > row->max)
            return FERR(e, "checkpoint '%s': tensor '%s': shape entry %d is not a non-negative 64-bit integer", e->src,
                        e->name, d);
        t->shape[d] = (int64_t)x;
    }
    t->ndim = v->n;
    if (!shape_size(t->ndim, t->shape, dtypes[t->dtype].size, &t->numel, &t->nbytes))
        return FERR(e, "checkpoint '%s': tensor '%s': shape x dtype size overflows", e->src, e->name);
    return CLG_OK;
}

/* after shape: [begin, end] within the data section, spanning the tensor's bytes */
static clg_status check_offsets(const field_env *e, const field_row *row, const clg_json *v, tensor_hdr *t)
{
    uint64_t *o = t->off;
    if (v->n != row->max_items || !clg_json_u64(&v->items[0], &o[0]) || !clg_json_u64(&v->items[1], &o[1]))
        return FERR(e, "checkpoint '%s': tensor '%s': %s", e->src, e->name, row->bad);
    if (o[0] > o[1] || o[1] > e->dlen)
        return FERR(e,
                    "checkpoint '%s': tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                    "] out of range (data section is %" PRIu64 " bytes)",
                    e->src, e->name, o[0], o[1], e->dlen);
    if (o[1] - o[0] != (uint64_t)t->nbytes)
        return FERR(e, "checkpoint '%s': tensor '%s': data_offsets span %" PRIu64 " bytes but shape x %s needs %zu",
                    e->src, e->name, o[1] - o[0], dtypes[t->dtype].name, t->nbytes);
    return CLG_OK;
}

/* Checked in this order (each row may use what the rows above stored);
 * other keys of an entry are ignored. */
static const field_row tensor_fields[] = {
    {"dtype", CLG_JSON_STR, 1, 0, 0, check_dtype, "missing or non-string \"dtype\""},
    {"shape", CLG_JSON_ARR, 1, CLG_CKPT_MAX_DIMS, (uint64_t)INT64_MAX, check_shape, "missing or non-array \"shape\""},
    {"data_offsets", CLG_JSON_ARR, 1, 2, UINT64_MAX, check_offsets,
     "\"data_offsets\" must be [begin, end] of non-negative integers"},
};

static clg_status parse_tensor_entry(const field_env *e, const clg_json *v, tensor_hdr *t)
{
    if (v->type != CLG_JSON_OBJ)
        return FERR(e, "checkpoint '%s': tensor '%s': entry is a %s, expected an object", e->src, e->name,
                    clg_json_type_name(v->type));
    memset(t, 0, sizeof *t);
    for (size_t r = 0; r < CLG_ARRAY_LEN(tensor_fields); r++) {
        const field_row *row = &tensor_fields[r];
        const clg_json *f = clg_json_get(v, row->key);
        if (!f && !row->required)
            continue;
        if (!f || f->type != row->type)
            return FERR(e, "checkpoint '%s': tensor '%s': %s", e->src, e->name, row->bad);
        CLG_TRY(row->check(e, row, f, t));
    }
    return CLG_OK;
}

/* The __metadata__ object: plain strings, each key once. */
static clg_status parse_meta(clg_err *err, const char *src, const clg_json *v, clg_ckpt *ck)
{
    if (v->type == CLG_JSON_OBJ && v->n > CLG_CKPT_MAX_META)
        return PERR(CLG_ERR_FORMAT, "checkpoint '%s': %d metadata entries, more than the %d allowed (corrupt?)", src,
                    v->n, CLG_CKPT_MAX_META);
    if (v->type != CLG_JSON_OBJ)
        return PERR(CLG_ERR_FORMAT, "checkpoint '%s': __metadata__ is a %s, expected an object", src,
                    clg_json_type_name(v->type));
    for (int m = 0; m < v->n; m++) {
        if (v->items[m].type != CLG_JSON_STR || strlen(v->items[m].str) != v->items[m].len ||
            strlen(v->keys[m]) != v->key_lens[m])
            return PERR(CLG_ERR_FORMAT, "checkpoint '%s': metadata '%s' is not a plain string", src, v->keys[m]);
        if (meta_find(ck, v->keys[m]))
            return PERR(CLG_ERR_FORMAT, "checkpoint '%s': metadata key '%s' appears twice", src, v->keys[m]);
        CLG_TRY(clg_ckpt_set_meta(err, ck, v->keys[m], v->items[m].str));
    }
    return CLG_OK;
}

/* The header object's entries: __metadata__ (*jmeta) and the tensors, with
 * their byte spans (spans: j->n entries). */
static clg_status parse_entries(clg_err *err, const char *src, const clg_json *j, uint64_t dlen, const uint8_t *dbase,
                                clg_ckpt *ck, span *spans, int *nspans, const clg_json **jmeta)
{
    for (int i = 0; i < j->n; i++) {
        const char *name = j->keys[i];
        const clg_json *v = &j->items[i];
        if (strlen(name) != j->key_lens[i])
            return PERR(CLG_ERR_FORMAT, "checkpoint '%s': header key with an embedded NUL", src);
        int is_meta = strcmp(name, "__metadata__") == 0;
        if (is_meta ? *jmeta != NULL : clg_ckpt_find(ck, name) != NULL)
            return PERR(CLG_ERR_FORMAT, "checkpoint '%s': header has key '%s' twice", src, name);
        if (is_meta) {
            *jmeta = v;
            CLG_TRY(parse_meta(err, src, v, ck));
            continue;
        }
        field_env env = {err, src, name, dlen};
        tensor_hdr t;
        CLG_TRY(parse_tensor_entry(&env, v, &t));
        void *dst = NULL;
        CLG_TRY(clg_ckpt_add(err, ck, name, t.dtype, t.ndim, t.shape, dbase + t.off[0], &dst));
        spans[*nspans] = (span){t.off[0], t.off[1], ck->nt - 1};
        ++*nspans;
    }
    return CLG_OK;
}

/* Tensors contiguous, non-overlapping, covering the data section; every
 * crc32.* entry names a tensor. Sorts spans. */
static clg_status check_layout(clg_err *err, const char *src, const clg_ckpt *ck, span *spans, int ns, uint64_t dlen)
{
    qsort(spans, (size_t)ns, sizeof *spans, span_cmp);
    uint64_t pos = 0;
    for (int i = 0; i < ns; i++) {
        if (spans[i].b < pos)
            return PERR(CLG_ERR_FORMAT, "checkpoint '%s': tensor '%s' overlaps tensor '%s'", src,
                        ck->t[spans[i].idx].name, ck->t[spans[i - 1].idx].name);
        if (spans[i].b > pos)
            return PERR(CLG_ERR_FORMAT, "checkpoint '%s': gap of %" PRIu64 " bytes before tensor '%s'", src,
                        spans[i].b - pos, ck->t[spans[i].idx].name);
        pos = spans[i].e;
    }
    if (pos != dlen)
        return PERR(CLG_ERR_FORMAT,
                    "checkpoint '%s': %" PRIu64 " bytes after the last tensor (data section %" PRIu64
                    " bytes, tensors cover %" PRIu64 ")",
                    src, dlen - pos, dlen, pos);
    for (int i = 0; i < ck->nmeta; i++) {
        const char *k = ck->meta[i].key;
        if (strncmp(k, "crc32.", 6) == 0 && !clg_ckpt_find(ck, k + 6))
            return PERR(CLG_ERR_FORMAT, "checkpoint '%s': metadata '%s' names a tensor that is not in the file", src,
                        k);
    }
    return CLG_OK;
}

/* header.crc32 of the current format: CRC-32 of the header text with the
 * value's 8 digits read as zeros. jmeta: the __metadata__ object. */
static clg_status check_header_crc(clg_err *err, const char *src, const char *htext, size_t hl, const clg_json *jmeta)
{
    const clg_json *v = clg_json_get(jmeta, CLG_CKPT_KEY_HEADER_CRC);
    if (!v)
        return PERR(CLG_ERR_FORMAT, "checkpoint '%s' has no '" CLG_CKPT_KEY_HEADER_CRC "' (required by format "
                    CLG_CKPT_FORMAT "): its header was edited or damaged", src);
    size_t at = v->offset; /* the opening quote */
    unsigned long want = 0;
    char *end = NULL, canon[16];
    /* the digits as the writer prints them (lowercase): the value is not
     * covered by the CRC, so a damaged digit that reads the same ('f' -> 'F')
     * must not pass either */
    if (v->type != CLG_JSON_STR || v->len != 8 || at + 10 > hl || htext[at] != '"' || htext[at + 9] != '"' ||
        memcmp(htext + at + 1, v->str, 8) != 0 || (want = strtoul(v->str, &end, 16), end != v->str + 8) ||
        (snprintf(canon, sizeof canon, "%08lx", want), memcmp(canon, v->str, 8) != 0))
        return PERR(CLG_ERR_FORMAT, "checkpoint '%s': '" CLG_CKPT_KEY_HEADER_CRC "' is not 8 lowercase hex digits",
                    src);
    uint32_t got = clg_crc32(0, htext, at + 1);
    got = clg_crc32(got, "00000000", 8);
    got = clg_crc32(got, htext + at + 9, hl - at - 9);
    if (got != (uint32_t)want)
        return PERR(CLG_ERR_CHECKSUM,
                    "checkpoint '%s': header is corrupted or edited: CRC-32 %08" PRIx32 ", " CLG_CKPT_KEY_HEADER_CRC
                    " says %08lx", src, got, want);
    return CLG_OK;
}

/* The format is required; the current one protects the header itself. */
static clg_status check_format(clg_err *err, const char *src, const clg_ckpt *ck, const char *htext, size_t hl,
                               const clg_json *jmeta)
{
    const char *format = clg_ckpt_get_meta(ck, CLG_CKPT_KEY_FORMAT);
    if (!format)
        return PERR(CLG_ERR_FORMAT,
                    "checkpoint '%s' has no '" CLG_CKPT_KEY_FORMAT "' metadata: not a clgrad checkpoint, or its "
                    "header was edited", src);
    int current = strcmp(format, CLG_CKPT_FORMAT) == 0;
    if (!current && strcmp(format, CLG_CKPT_FORMAT_V1) != 0)
        return PERR(CLG_ERR_UNSUPPORTED,
                    "checkpoint '%s' has format '%s'; this clgrad reads " CLG_CKPT_FORMAT " and " CLG_CKPT_FORMAT_V1,
                    src, format);
    /* a header checksum is checked wherever present (a current file whose
     * format was edited to the old one keeps it) */
    if (current || clg_json_get(jmeta, CLG_CKPT_KEY_HEADER_CRC))
        return check_header_crc(err, src, htext, hl, jmeta);
    return CLG_OK;
}

/* CRC per tensor */
static clg_status check_tensor_crcs(clg_err *err, const char *src, const clg_ckpt *ck)
{
    for (int i = 0; i < ck->nt; i++) {
        const clg_ckpt_tensor *t = &ck->t[i];
        char key[512];
        snprintf(key, sizeof key, "crc32.%s", t->name);
        const char *want = clg_ckpt_get_meta(ck, key);
        if (!want)
            return PERR(CLG_ERR_FORMAT, "checkpoint '%s': tensor '%s' has no CRC-32 entry '%s'", src, t->name, key);
        char *end;
        errno = 0;
        unsigned long w = strtoul(want, &end, 16);
        if (end == want || *end || errno == ERANGE || w > 0xffffffffUL)
            return PERR(CLG_ERR_FORMAT, "checkpoint '%s': metadata '%s' = '%s' is not a hex CRC-32", src, key, want);
        uint32_t got = clg_crc32(0, t->data, t->nbytes);
        if (got != (uint32_t)w)
            return PERR(CLG_ERR_CHECKSUM,
                        "checkpoint '%s': tensor '%s' is corrupted: CRC-32 %08" PRIx32 ", header says %08lx", src,
                        t->name, got, w);
    }
    return CLG_OK;
}

/* The 8-byte little-endian header length, checked against the file size. */
static clg_status header_length(clg_err *err, const char *src, const uint8_t *b, size_t len, uint64_t *hl_out)
{
    if (len < 8)
        return clg_err_set(err, CLG_ERR_FORMAT,
                           "checkpoint '%s' is truncated: %zu bytes, less than the 8-byte header length", src, len);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)b[i] << (8 * i);
    if (hl > CLG_CKPT_MAX_HEADER)
        return clg_err_set(err, CLG_ERR_FORMAT,
                           "checkpoint '%s': header length %" PRIu64 " exceeds the %u-byte limit (corrupt file?)", src,
                           hl, CLG_CKPT_MAX_HEADER);
    if (hl > len - 8)
        return clg_err_set(err, CLG_ERR_FORMAT,
                           "checkpoint '%s' is truncated: header length %" PRIu64 " but only %zu bytes follow", src,
                           hl, len - 8);
    if (hl < 2)
        return clg_err_set(err, CLG_ERR_FORMAT, "checkpoint '%s': header length %" PRIu64 " is too small", src, hl);
    *hl_out = hl;
    return CLG_OK;
}

/* Checks of the parsed header object j, in order; fills ck. */
static clg_status parse_header(clg_err *err, const char *src, const clg_json *j, const char *htext, uint64_t hl,
                               uint64_t dlen, clg_ckpt *ck)
{
    if (j->type != CLG_JSON_OBJ)
        return PERR(CLG_ERR_FORMAT, "checkpoint '%s': header is a JSON %s, expected an object", src,
                    clg_json_type_name(j->type));
    if (j->n > CLG_CKPT_MAX_TENSORS + 1)
        return PERR(CLG_ERR_FORMAT,
                    "checkpoint '%s': header has %d entries, more than the %d tensors allowed (corrupt?)", src, j->n,
                    CLG_CKPT_MAX_TENSORS);
    span *spans = calloc((size_t)j->n + 1, sizeof *spans);
    if (!spans)
        return PERR(CLG_ERR_HOST_OOM, "checkpoint '%s': out of memory", src);
    int ns = 0;
    const clg_json *jmeta = NULL;
    const uint8_t *dbase = (const uint8_t *)htext + hl;
    clg_status st = parse_entries(err, src, j, dlen, dbase, ck, spans, &ns, &jmeta);
    if (st == CLG_OK)
        st = check_layout(err, src, ck, spans, ns, dlen);
    free(spans);
    if (st == CLG_OK)
        st = check_format(err, src, ck, htext, (size_t)hl, jmeta);
    if (st == CLG_OK)
        st = check_tensor_crcs(err, src, ck);
    return st;
}

clg_status clg_ckpt_parse(clg_err *err, const void *data, size_t len, const char *source, clg_ckpt **out)
{
    *out = NULL;
    const char *src = source ? source : "<memory>";
    const uint8_t *b = data;
    if (!host_is_le())
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "checkpoints need a little-endian host");
    uint64_t hl = 0;
    CLG_TRY(header_length(err, src, b, len, &hl));
    const char *htext = (const char *)b + 8;
    char what[600];
    snprintf(what, sizeof what, "checkpoint '%s' header", src);
    clg_json *j = NULL;
    CLG_TRY(clg_json_parse(err, htext, (size_t)hl, what, &j));
    clg_ckpt *ck = NULL;
    clg_status st = clg_ckpt_create(err, &ck);
    if (st == CLG_OK)
        st = parse_header(err, src, j, htext, hl, len - 8 - hl, ck);
    clg_json_free(j);
    if (st != CLG_OK) {
        clg_ckpt_free(ck);
        return st;
    }
    *out = ck;
    return CLG_OK;
}

clg_status clg_ckpt_load(clg_err *err, const char *path, clg_ckpt **out)
{
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    clg_status st = clg_file_read(err, path, &buf, &len);
    if (st != CLG_OK)
        return st;
    st = clg_ckpt_parse(err, buf, len, path, out);
    free(buf);
    return st;
}
