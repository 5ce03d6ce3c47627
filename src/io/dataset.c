/* Datasets: IDX (plain or gzip), CIFAR-10 binary batches, PGM images;
 * shuffling, normalization and batch filling. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core/options.h"
#include "io/dataset.h"

#define IDX_MAX_BYTES ((uint64_t)1 << 34) /* 16 GiB: anything larger is a corrupt header */

void clg_dataset_free(clg_dataset *ds)
{
    if (!ds)
        return;
    free(ds->u8);
    free(ds->f32);
    free(ds->labels);
    free(ds);
}

static void set_str(char *dst, size_t cap, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n >= cap)
        n = cap - 1;
    if (n)
        memcpy(dst, s, n);
    dst[n] = 0;
}

clg_status clg_dataset_create(clg_err *err, int n, int c, int h, int w, int nclasses, clg_ds_dtype dtype,
                              clg_dataset **out)
{
    *out = NULL;
    if (n < 0 || c <= 0 || h <= 0 || w <= 0 || nclasses < 0 || (dtype != CLG_DS_U8 && dtype != CLG_DS_F32))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "dataset: bad shape %d x %d x %d x %d (classes %d)", n, c, h,
                           w, nclasses);
    if (c > CLG_DS_MAX_CHANNELS)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "dataset: %d channels (at most %d supported)", c,
                           CLG_DS_MAX_CHANNELS);
    uint64_t per = (uint64_t)c * (uint64_t)h * (uint64_t)w;
    uint64_t total = per * (uint64_t)n;
    if (per > ((uint64_t)1 << 31) || total > IDX_MAX_BYTES)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "dataset: %d x %d x %d x %d is too large", n, c, h, w);
    clg_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "dataset: out of memory");
    ds->n = n;
    ds->c = c;
    ds->h = h;
    ds->w = w;
    ds->nclasses = nclasses;
    ds->dtype = dtype;
    size_t cnt = (size_t)total ? (size_t)total : 1;
    if (dtype == CLG_DS_U8)
        ds->u8 = calloc(cnt, 1);
    else
        ds->f32 = calloc(cnt, sizeof(float));
    ds->labels = calloc(n ? (size_t)n : 1, sizeof(int32_t));
    if ((dtype == CLG_DS_U8 ? (void *)ds->u8 : (void *)ds->f32) == NULL || !ds->labels) {
        clg_dataset_free(ds);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "dataset: out of memory for %d x %d x %d x %d", n, c, h, w);
    }
    set_str(ds->name, sizeof ds->name, "memory");
    set_str(ds->source, sizeof ds->source, "<memory>");
    *out = ds;
    return CLG_OK;
}

// ---- IDX ----

typedef struct idx_file {
    int ndim;
    uint32_t dims[8];
    uint64_t count; /* product of dims */
    int type;       /* element type code: 0x08 unsigned byte, 0x0D float32 (big-endian in the file) */
    uint8_t *data;  /* count elements (0x0D: converted to host-order floats in place) */
} idx_file;

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int dir_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_gzip(const uint8_t *b, size_t n) { return n >= 2 && b[0] == 0x1f && b[1] == 0x8b; }

/* Inflates a complete gzip file (one or more concatenated members, each
 * with its CRC-32/length trailer checked by zlib) into a malloc'd buffer of
 * at most max bytes. A truncated stream, a bad trailer or bytes after the
 * last member that do not start another member are errors naming path. */
static clg_status gunzip(clg_err *err, const char *path, const uint8_t *src, size_t n, uint64_t max, uint8_t **out,
                         size_t *outlen)
{
    *out = NULL;
    *outlen = 0;
    size_t cap = n < 1024 ? 4096 : n * 4, len = 0;
    if (cap > max + 1)
        cap = (size_t)max + 1;
    uint8_t *buf = malloc(cap);
    if (!buf)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "'%s': no memory to decompress", path);
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
        free(buf);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "'%s': cannot start zlib", path);
    }
    size_t pos = 0;
    clg_status st = CLG_OK;
    for (;;) {
        z.next_in = (Bytef *)(uintptr_t)(src + pos);
        size_t in_now = n - pos > (1u << 30) ? (1u << 30) : n - pos;
        z.avail_in = (uInt)in_now;
        if (len == cap) {
            if (cap > max) {
                st = clg_err_set(err, CLG_ERR_FORMAT, "'%s': decompresses to more than %llu bytes (corrupt?)", path,
                                 (unsigned long long)max);
                break;
            }
            size_t nc = cap * 2 > max + 1 ? (size_t)max + 1 : cap * 2;
            uint8_t *nb = realloc(buf, nc);
            if (!nb) {
                st = clg_err_set(err, CLG_ERR_HOST_OOM, "'%s': no memory to decompress (%zu bytes)", path, nc);
                break;
            }
            buf = nb;
            cap = nc;
        }
        size_t out_now = cap - len > (1u << 30) ? (1u << 30) : cap - len;
        z.next_out = buf + len;
        z.avail_out = (uInt)out_now;
        int r = inflate(&z, Z_NO_FLUSH);
        pos += in_now - z.avail_in;
        len += out_now - z.avail_out;
        if (r == Z_STREAM_END) {
            if (pos == n)
                break;
            if (!is_gzip(src + pos, n - pos)) {
                st = clg_err_set(err, CLG_ERR_FORMAT,
                                 "'%s': %zu bytes of trailing garbage after the gzip data (at offset %zu)", path,
                                 n - pos, pos);
                break;
            }
            inflateReset(&z); /* another member (as gzip -c a b > ab writes) */
            continue;
        }
        if (r == Z_OK && (z.avail_out == 0 || z.avail_in == 0) && pos < n)
            continue;
        if (r == Z_OK || r == Z_BUF_ERROR) {
            if (z.avail_out == 0)
                continue;
            st = clg_err_set(err, CLG_ERR_FORMAT,
                             "'%s': corrupt gzip data: truncated stream (no complete CRC-32/length trailer)", path);
            break;
        }
        st = clg_err_set(err, CLG_ERR_FORMAT, "'%s': corrupt gzip data: %s", path, z.msg ? z.msg : "zlib error");
        break;
    }
    inflateEnd(&z);
    if (st != CLG_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    *outlen = len;
    return CLG_OK;
}

/* Whole file in memory, gunzipped when it starts with the gzip magic. */
static clg_status read_maybe_gz(clg_err *err, const char *path, uint64_t max, uint8_t **out, size_t *len)
{
    char *raw = NULL;
    size_t n = 0;
    clg_status st = clg_file_read(err, path, &raw, &n);
    if (st != CLG_OK)
        return st;
    if (!is_gzip((const uint8_t *)raw, n)) {
        *out = (uint8_t *)raw;
        *len = n;
        return CLG_OK;
    }
    st = gunzip(err, path, (const uint8_t *)raw, n, max, out, len);
    free(raw);
    return st;
}

/* Parses the IDX bytes b[0..n) (malloc'd; taken over: freed, or kept as
 * out->data). */
static clg_status idx_parse(clg_err *err, const char *path, uint8_t *b, size_t n, idx_file *out)
{
    memset(out, 0, sizeof *out);
    clg_status st = CLG_OK;
    if (n < 4) {
        st = clg_err_set(err, CLG_ERR_FORMAT, "IDX file '%s' is truncated: %zu bytes, shorter than the 4-byte magic",
                         path, n);
        goto done;
    }
    if (b[0] != 0 || b[1] != 0) {
        st = clg_err_set(err, CLG_ERR_FORMAT,
                         "'%s' is not an IDX file: bad magic %02x %02x %02x %02x (expected 00 00 <type> <ndim>)",
                         path, b[0], b[1], b[2], b[3]);
        goto done;
    }
    if (b[2] != 0x08 && b[2] != 0x0D) {
        st = clg_err_set(err, CLG_ERR_UNSUPPORTED,
                         "IDX file '%s': element type 0x%02x is not supported (unsigned byte 0x08 or float32 0x0D)",
                         path, b[2]);
        goto done;
    }
    out->type = b[2];
    size_t esize = b[2] == 0x0D ? 4 : 1;
    if (b[3] < 1 || b[3] > 8) {
        st = clg_err_set(err, CLG_ERR_FORMAT, "IDX file '%s': %d dimensions (expected 1 to 8)", path, b[3]);
        goto done;
    }
    out->ndim = b[3];
    size_t hl = 4 + 4 * (size_t)out->ndim;
    if (n < hl) {
        st = clg_err_set(err, CLG_ERR_FORMAT, "IDX file '%s' is truncated inside its dimension list", path);
        goto done;
    }
    out->count = 1;
    for (int i = 0; i < out->ndim; i++) {
        const uint8_t *d = b + 4 + 4 * i;
        out->dims[i] = ((uint32_t)d[0] << 24) | ((uint32_t)d[1] << 16) | ((uint32_t)d[2] << 8) | d[3];
        if (out->dims[i] > 0 && out->count > IDX_MAX_BYTES / esize / out->dims[i]) {
            st = clg_err_set(err, CLG_ERR_FORMAT, "IDX file '%s': dimensions describe more than %llu bytes (corrupt?)",
                             path, (unsigned long long)IDX_MAX_BYTES);
            goto done;
        }
        out->count *= out->dims[i];
    }
    uint64_t bytes = out->count * esize;
    if ((uint64_t)(n - hl) < bytes) {
        st = clg_err_set(err, CLG_ERR_FORMAT, "IDX file '%s' is truncated: %llu of %llu data bytes present", path,
                         (unsigned long long)(n - hl), (unsigned long long)bytes);
        goto done;
    }
    if ((uint64_t)(n - hl) > bytes) {
        st = clg_err_set(err, CLG_ERR_FORMAT, "IDX file '%s' has data beyond the %llu bytes its header describes",
                         path, (unsigned long long)bytes);
        goto done;
    }
    memmove(b, b + hl, (size_t)bytes); /* the data keeps the file's buffer */
    if (esize == 4)
        for (uint64_t i = 0; i < out->count; i++) { /* big-endian IEEE single -> host float */
            const uint8_t *q = b + 4 * i;
            uint32_t u = ((uint32_t)q[0] << 24) | ((uint32_t)q[1] << 16) | ((uint32_t)q[2] << 8) | q[3];
            float f;
            memcpy(&f, &u, 4);
            if (!isfinite(f)) {
                st = clg_err_set(err, CLG_ERR_FORMAT, "IDX file '%s': float element %llu is not finite", path,
                                 (unsigned long long)i);
                goto done;
            }
            memcpy(b + 4 * i, &f, 4);
        }
    out->data = b;
    return CLG_OK;
done:
    free(b);
    return st;
}

static clg_status idx_read(clg_err *err, const char *path, idx_file *out)
{
    memset(out, 0, sizeof *out);
    if (!file_exists(path))
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "IDX file '%s' does not exist (or is not a regular file)", path);
    uint8_t *b = NULL;
    size_t n = 0;
    clg_status st = read_maybe_gz(err, path, IDX_MAX_BYTES + 36, &b, &n);
    return st != CLG_OK ? st : idx_parse(err, path, b, n, out);
}

static clg_status idx_images_to_dataset(clg_err *err, const char *path, idx_file *im, clg_dataset **out)
{
    int n, c, h, w;
    if (im->ndim == 3) {
        n = (int)im->dims[0];
        c = 1;
        h = (int)im->dims[1];
        w = (int)im->dims[2];
    } else if (im->ndim == 4) {
        n = (int)im->dims[0];
        c = (int)im->dims[1];
        h = (int)im->dims[2];
        w = (int)im->dims[3];
    } else if (im->ndim == 2) { /* a single image H x W */
        n = 1;
        c = 1;
        h = (int)im->dims[0];
        w = (int)im->dims[1];
    } else {
        return clg_err_set(err, CLG_ERR_FORMAT,
                           "IDX images file '%s' has %d dimensions (expected N x H x W, N x C x H x W or H x W)", path,
                           im->ndim);
    }
    for (int i = 0; i < im->ndim; i++)
        if (im->dims[i] > INT32_MAX || im->dims[i] == 0)
            return clg_err_set(err, CLG_ERR_FORMAT, "IDX images file '%s': dimension %d is %u", path, i,
                               im->dims[i]);
    clg_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    if (c > CLG_DS_MAX_CHANNELS) {
        free(ds);
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "IDX images file '%s': %d channels (at most %d)", path, c,
                           CLG_DS_MAX_CHANNELS);
    }
    ds->n = n;
    ds->c = c;
    ds->h = h;
    ds->w = w;
    if (im->type == 0x0D) {
        ds->dtype = CLG_DS_F32;
        ds->f32 = (float *)(void *)im->data; /* malloc'd: aligned for float */
    } else {
        ds->dtype = CLG_DS_U8;
        ds->u8 = im->data;
    }
    im->data = NULL;
    ds->labels = malloc(sizeof(int32_t) * (size_t)n);
    if (!ds->labels) {
        clg_dataset_free(ds);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    for (int i = 0; i < n; i++)
        ds->labels[i] = -1;
    set_str(ds->name, sizeof ds->name, "idx");
    set_str(ds->source, sizeof ds->source, path);
    *out = ds;
    return CLG_OK;
}

clg_status clg_dataset_load_idx(clg_err *err, const char *images_path, const char *labels_path, clg_dataset **out)
{
    *out = NULL;
    idx_file im, lb;
    clg_status st = idx_read(err, images_path, &im);
    if (st != CLG_OK)
        return st;
    if (im.ndim != 3 && im.ndim != 4) {
        free(im.data);
        return clg_err_set(err, CLG_ERR_FORMAT,
                           "IDX images file '%s' has %d dimensions (expected 3: N x H x W, or 4: N x C x H x W)",
                           images_path, im.ndim);
    }
    clg_dataset *ds = NULL;
    st = idx_images_to_dataset(err, images_path, &im, &ds);
    free(im.data);
    if (st != CLG_OK)
        return st;
    if (labels_path) {
        st = idx_read(err, labels_path, &lb);
        if (st != CLG_OK) {
            clg_dataset_free(ds);
            return st;
        }
        if (lb.type != 0x08) {
            st = clg_err_set(err, CLG_ERR_FORMAT, "IDX labels file '%s' holds floats (labels are unsigned bytes, 0x08)",
                             labels_path);
        } else if (lb.ndim != 1) {
            st = clg_err_set(err, CLG_ERR_FORMAT, "IDX labels file '%s' has %d dimensions (expected 1)", labels_path,
                             lb.ndim);
        } else if (lb.dims[0] != (uint32_t)ds->n) {
            st = clg_err_set(err, CLG_ERR_FORMAT, "IDX labels file '%s' holds %u labels but '%s' holds %d images",
                             labels_path, lb.dims[0], images_path, ds->n);
        } else {
            int mx = 0;
            for (int i = 0; i < ds->n; i++) {
                ds->labels[i] = lb.data[i];
                mx = CLG_MAX(mx, lb.data[i]);
            }
            ds->nclasses = CLG_MAX(10, mx + 1);
        }
        free(lb.data);
        if (st != CLG_OK) {
            clg_dataset_free(ds);
            return st;
        }
    }
    *out = ds;
    return CLG_OK;
}

clg_status clg_idx_write_u8(clg_err *err, const char *path, int gz, const int *dims, int ndim, const uint8_t *data)
{
    if (ndim < 1 || ndim > 8)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "IDX write '%s': %d dimensions (1 to 8)", path, ndim);
    uint8_t hdr[4 + 32] = {0, 0, 0x08, (uint8_t)ndim};
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (dims[i] < 0)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "IDX write '%s': negative dimension", path);
        uint32_t d = (uint32_t)dims[i];
        hdr[4 + 4 * i] = (uint8_t)(d >> 24);
        hdr[5 + 4 * i] = (uint8_t)(d >> 16);
        hdr[6 + 4 * i] = (uint8_t)(d >> 8);
        hdr[7 + 4 * i] = (uint8_t)d;
        count *= d;
    }
    size_t hl = 4 + 4 * (size_t)ndim;
    if (!gz) {
        FILE *f = fopen(path, "wb");
        if (!f)
            return clg_err_set(err, CLG_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
        int ok = fwrite(hdr, 1, hl, f) == hl && fwrite(data, 1, (size_t)count, f) == (size_t)count;
        ok = (fclose(f) == 0) && ok;
        if (!ok)
            return clg_err_set(err, CLG_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
        return CLG_OK;
    }
    gzFile f = gzopen(path, "wb");
    if (!f)
        return clg_err_set(err, CLG_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    int ok = gzwrite(f, hdr, (unsigned)hl) == (int)hl;
    uint64_t off = 0;
    while (ok && off < count) {
        unsigned chunk = count - off > (1u << 30) ? (1u << 30) : (unsigned)(count - off);
        ok = gzwrite(f, data + off, chunk) == (int)chunk;
        off += chunk;
    }
    ok = (gzclose(f) == Z_OK) && ok;
    if (!ok)
        return clg_err_set(err, CLG_ERR_IO, "cannot write gzip file '%s'", path);
    return CLG_OK;
}

// ---- CIFAR-10 ----

#define CIFAR_REC 3073

clg_status clg_dataset_load_cifar10(clg_err *err, const char *const *paths, int npaths, clg_dataset **out)
{
    *out = NULL;
    if (npaths <= 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "CIFAR-10: no batch files given");
    uint64_t total = 0;
    for (int i = 0; i < npaths; i++) {
        struct stat sb;
        if (stat(paths[i], &sb) != 0)
            return clg_err_set(err, CLG_ERR_NOT_FOUND, "CIFAR-10 batch '%s': %s", paths[i], strerror(errno));
        if (!S_ISREG(sb.st_mode))
            return clg_err_set(err, CLG_ERR_IO, "CIFAR-10 batch '%s' is not a regular file", paths[i]);
        if (sb.st_size == 0 || sb.st_size % CIFAR_REC != 0)
            return clg_err_set(err, CLG_ERR_FORMAT,
                               "CIFAR-10 batch '%s' is %lld bytes, not a positive multiple of the %d-byte record "
                               "(truncated or not a CIFAR-10 binary batch)",
                               paths[i], (long long)sb.st_size, CIFAR_REC);
        total += (uint64_t)sb.st_size / CIFAR_REC;
    }
    if (total > INT32_MAX)
        return clg_err_set(err, CLG_ERR_FORMAT, "CIFAR-10: too many records");
    clg_dataset *ds = NULL;
    clg_status st = clg_dataset_create(err, (int)total, 3, 32, 32, 10, CLG_DS_U8, &ds);
    if (st != CLG_OK)
        return st;
    uint8_t *rec = malloc(CIFAR_REC);
    if (!rec) {
        clg_dataset_free(ds);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    int idx = 0;
    for (int i = 0; i < npaths && st == CLG_OK; i++) {
        FILE *f = fopen(paths[i], "rb");
        if (!f) {
            st = clg_err_set(err, CLG_ERR_IO, "cannot open CIFAR-10 batch '%s': %s", paths[i], strerror(errno));
            break;
        }
        for (int r = 0;; r++) {
            size_t got = fread(rec, 1, CIFAR_REC, f);
            if (got == 0 && feof(f))
                break;
            if (got != CIFAR_REC || idx >= ds->n) {
                st = clg_err_set(err, CLG_ERR_FORMAT, "CIFAR-10 batch '%s': record %d is incomplete (file changed?)",
                                 paths[i], r);
                break;
            }
            if (rec[0] > 9) {
                st = clg_err_set(err, CLG_ERR_FORMAT, "CIFAR-10 batch '%s': record %d has label %d (expected 0..9)",
                                 paths[i], r, rec[0]);
                break;
            }
            ds->labels[idx] = rec[0];
            memcpy(ds->u8 + (size_t)idx * 3072, rec + 1, 3072);
            idx++;
        }
        if (st == CLG_OK && ferror(f))
            st = clg_err_set(err, CLG_ERR_IO, "read error on CIFAR-10 batch '%s'", paths[i]);
        fclose(f);
    }
    free(rec);
    if (st == CLG_OK && idx != ds->n)
        st = clg_err_set(err, CLG_ERR_FORMAT, "CIFAR-10: read %d records, expected %d (files changed?)", idx, ds->n);
    if (st != CLG_OK) {
        clg_dataset_free(ds);
        return st;
    }
    set_str(ds->name, sizeof ds->name, "cifar10");
    set_str(ds->source, sizeof ds->source, paths[0]);
    *out = ds;
    return CLG_OK;
}

// ---- PGM ----

/* Next header token of a PGM (skips whitespace and # comments). */
static int pgm_token(const char *b, size_t len, size_t *pos, long *val)
{
    size_t p = *pos;
    for (;;) {
        while (p < len && (b[p] == ' ' || b[p] == '\t' || b[p] == '\n' || b[p] == '\r'))
            p++;
        if (p < len && b[p] == '#') {
            while (p < len && b[p] != '\n')
                p++;
            continue;
        }
        break;
    }
    if (p >= len || b[p] < '0' || b[p] > '9')
        return 0;
    long v = 0;
    while (p < len && b[p] >= '0' && b[p] <= '9') {
        v = v * 10 + (b[p] - '0');
        if (v > 1000000)
            return 0;
        p++;
    }
    *pos = p;
    *val = v;
    return 1;
}

static clg_status load_pgm(clg_err *err, const char *path, const char *b, size_t len, clg_dataset **out)
{
    int binary = b[1] == '5';
    size_t pos = 2;
    long w, h, maxv;
    if (!pgm_token(b, len, &pos, &w) || !pgm_token(b, len, &pos, &h) || !pgm_token(b, len, &pos, &maxv))
        return clg_err_set(err, CLG_ERR_FORMAT, "PGM '%s': malformed header (expected width, height, maxval)", path);
    if (w <= 0 || h <= 0 || w > 65536 || h > 65536 || w * h > (1L << 28))
        return clg_err_set(err, CLG_ERR_FORMAT, "PGM '%s': bad size %ld x %ld", path, w, h);
    if (maxv <= 0 || maxv > 65535)
        return clg_err_set(err, CLG_ERR_FORMAT, "PGM '%s': bad maxval %ld (1..65535)", path, maxv);
    clg_dataset *ds = NULL;
    clg_status st = clg_dataset_create(err, 1, 1, (int)h, (int)w, 0, CLG_DS_U8, &ds);
    if (st != CLG_OK)
        return st;
    ds->labels[0] = -1;
    size_t npx = (size_t)w * (size_t)h;
    if (binary) {
        if (pos >= len || !(b[pos] == ' ' || b[pos] == '\t' || b[pos] == '\n' || b[pos] == '\r')) {
            clg_dataset_free(ds);
            return clg_err_set(err, CLG_ERR_FORMAT, "PGM '%s': missing whitespace after the header", path);
        }
        pos++;
        size_t bpp = maxv > 255 ? 2 : 1;
        if (len - pos < npx * bpp) {
            clg_dataset_free(ds);
            return clg_err_set(err, CLG_ERR_FORMAT, "PGM '%s' is truncated: %zu of %zu pixel bytes present", path,
                               len - pos, npx * bpp);
        }
        const uint8_t *px = (const uint8_t *)b + pos;
        for (size_t i = 0; i < npx; i++) {
            long v = bpp == 2 ? ((long)px[2 * i] << 8) | px[2 * i + 1] : px[i];
            if (v > maxv)
                v = maxv;
            ds->u8[i] = (uint8_t)((v * 255 + maxv / 2) / maxv);
        }
    } else {
        for (size_t i = 0; i < npx; i++) {
            long v;
            if (!pgm_token(b, len, &pos, &v)) {
                clg_dataset_free(ds);
                return clg_err_set(err, CLG_ERR_FORMAT, "PGM '%s': pixel %zu of %zu missing or malformed", path, i,
                                   npx);
            }
            if (v > maxv) {
                clg_dataset_free(ds);
                return clg_err_set(err, CLG_ERR_FORMAT, "PGM '%s': pixel %zu is %ld, above maxval %ld", path, i, v,
                                   maxv);
            }
            ds->u8[i] = (uint8_t)((v * 255 + maxv / 2) / maxv);
        }
    }
    set_str(ds->name, sizeof ds->name, "pgm");
    set_str(ds->source, sizeof ds->source, path);
    *out = ds;
    return CLG_OK;
}

clg_status clg_dataset_load_image(clg_err *err, const char *path, clg_dataset **out)
{
    *out = NULL;
    if (!file_exists(path))
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "input '%s' does not exist (or is not a regular file)", path);
    uint8_t *buf = NULL;
    size_t len = 0;
    clg_status st = read_maybe_gz(err, path, IDX_MAX_BYTES + 36, &buf, &len);
    if (st != CLG_OK)
        return st;
    if (len >= 2 && buf[0] == 'P' && (buf[1] == '5' || buf[1] == '2')) {
        st = load_pgm(err, path, (const char *)buf, len, out);
        free(buf);
        return st;
    }
    if (len >= 2 && buf[0] == 0 && buf[1] == 0) {
        idx_file im;
        st = idx_parse(err, path, buf, len, &im);
        if (st != CLG_OK)
            return st;
        st = idx_images_to_dataset(err, path, &im, out);
        free(im.data);
        return st;
    }
    free(buf);
    return clg_err_set(err, CLG_ERR_FORMAT, "input '%s' is neither an IDX file nor a PGM image (P5/P2)", path);
}

// ---- name resolution ----

static int join(char *dst, size_t cap, const char *a, const char *b)
{
    int n = snprintf(dst, cap, "%s/%s", a, b);
    return n > 0 && (size_t)n < cap;
}

/* Finds dir/<name> or dir/<name>.gz. */
static int find_idx(const char *dir, const char *name, char *out, size_t cap)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s.gz", name);
    if (join(out, cap, dir, tmp) && file_exists(out))
        return 1;
    if (join(out, cap, dir, name) && file_exists(out))
        return 1;
    return 0;
}

static clg_status open_idx_dir(clg_err *err, const char *dir, clg_ds_split split, clg_dataset **out)
{
    const char *pre = split == CLG_SPLIT_TRAIN ? "train" : "t10k";
    char img[1024], lab[1024], ni[256], nl[256];
    snprintf(ni, sizeof ni, "%s-images-idx3-ubyte", pre);
    snprintf(nl, sizeof nl, "%s-labels-idx1-ubyte", pre);
    if (!find_idx(dir, ni, img, sizeof img))
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "dataset directory '%s' has no %s[.gz]", dir, ni);
    if (!find_idx(dir, nl, lab, sizeof lab))
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "dataset directory '%s' has no %s[.gz]", dir, nl);
    return clg_dataset_load_idx(err, img, lab, out);
}

static clg_status open_cifar_dir(clg_err *err, const char *dir, clg_ds_split split, clg_dataset **out)
{
    char paths[5][1024];
    const char *pp[5];
    int np = 0;
    if (split == CLG_SPLIT_TRAIN) {
        for (int i = 1; i <= 5; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, "data_batch_%d.bin", i);
            if (!join(paths[np], sizeof paths[np], dir, nm) || !file_exists(paths[np]))
                return clg_err_set(err, CLG_ERR_NOT_FOUND, "CIFAR-10 directory '%s' has no %s", dir, nm);
            pp[np] = paths[np];
            np++;
        }
    } else {
        if (!join(paths[0], sizeof paths[0], dir, "test_batch.bin") || !file_exists(paths[0]))
            return clg_err_set(err, CLG_ERR_NOT_FOUND, "CIFAR-10 directory '%s' has no test_batch.bin", dir);
        pp[0] = paths[0];
        np = 1;
    }
    return clg_dataset_load_cifar10(err, pp, np, out);
}

static int is_cifar_dir(const char *dir)
{
    char p[1024];
    return (join(p, sizeof p, dir, "test_batch.bin") && file_exists(p)) ||
           (join(p, sizeof p, dir, "data_batch_1.bin") && file_exists(p));
}

static int is_idx_dir(const char *dir)
{
    char p[1024];
    return find_idx(dir, "train-images-idx3-ubyte", p, sizeof p) || find_idx(dir, "t10k-images-idx3-ubyte", p, sizeof p);
}

clg_status clg_dataset_open(clg_err *err, const char *spec, clg_ds_split split, clg_dataset **out)
{
    clg_opts *o = malloc(sizeof *o); /* data_dir from the environment: no context here */
    if (!o)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    clg_opts_init(o);
    clg_status st = clg_opts_read_env_one(o, CLG_OPT_ID_data_dir, err);
    if (st == CLG_OK)
        st = clg_dataset_open_in(err, o->data_dir, spec, split, out);
    free(o);
    return st;
}

clg_status clg_dataset_open_in(clg_err *err, const char *data_dir, const char *spec, clg_ds_split split,
                               clg_dataset **out)
{
    *out = NULL;
    if (!spec || !*spec)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "no dataset given");
    const char *named = NULL;
    int cifar = 0;
    if (strcmp(spec, "fashion-mnist") == 0 || strcmp(spec, "fashion_mnist") == 0)
        named = "fashion-mnist";
    else if (strcmp(spec, "mnist") == 0)
        named = "mnist";
    else if (strcmp(spec, "cifar10") == 0 || strcmp(spec, "cifar-10") == 0) {
        named = "cifar10";
        cifar = 1;
    }
    clg_status st;
    if (named) {
        const char *env = data_dir;
        char cand[6][1024];
        int nc = 0;
        const char *subs_idx[] = {named, NULL};
        const char *subs_cifar[] = {"cifar-10-batches-bin", "cifar10", "cifar-10", NULL};
        const char *const *subs = cifar ? subs_cifar : subs_idx;
        if (env && *env) {
            for (int i = 0; subs[i] && nc < 5; i++)
                if (join(cand[nc], sizeof cand[nc], env, subs[i]))
                    nc++;
            snprintf(cand[nc++], sizeof cand[0], "%s", env);
        }
        for (int i = 0; subs[i] && nc < 6; i++) {
            if (join(cand[nc], sizeof cand[nc], "/usr/share/datasets", subs[i]))
                nc++;
        }
        for (int i = 0; i < nc; i++) {
            if (!dir_exists(cand[i]))
                continue;
            if (cifar ? !is_cifar_dir(cand[i]) : !is_idx_dir(cand[i]))
                continue;
            st = cifar ? open_cifar_dir(err, cand[i], split, out) : open_idx_dir(err, cand[i], split, out);
            if (st == CLG_OK) {
                set_str((*out)->name, sizeof(*out)->name, named);
                set_str((*out)->source, sizeof(*out)->source, cand[i]);
            }
            return st;
        }
        char tried[4096];
        size_t tl = 0;
        tried[0] = 0;
        for (int i = 0; i < nc && tl < sizeof tried; i++) {
            int w = snprintf(tried + tl, sizeof tried - tl, "%s%s", i ? ", " : "", cand[i]);
            if (w < 0)
                break;
            tl += (size_t)w;
        }
        return clg_err_set(err, CLG_ERR_NOT_FOUND,
                           "dataset '%s' not found (looked in: %s); install Debian's dataset-%s package or set "
                           "CLGRAD_DATA_DIR",
                           named, tried, named);
    }
    if (dir_exists(spec)) {
        if (is_cifar_dir(spec))
            return open_cifar_dir(err, spec, split, out);
        if (is_idx_dir(spec))
            return open_idx_dir(err, spec, split, out);
        return clg_err_set(err, CLG_ERR_NOT_FOUND,
                           "directory '%s' holds neither IDX files ({train,t10k}-images-idx3-ubyte[.gz]) nor "
                           "CIFAR-10 batches (data_batch_N.bin, test_batch.bin)",
                           spec);
    }
    if (!file_exists(spec))
        return clg_err_set(err, CLG_ERR_NOT_FOUND,
                           "dataset '%s' not found (expected fashion-mnist, mnist, cifar10, a directory or a file)",
                           spec);
    size_t sl = strlen(spec);
    if (sl > 4 && strcmp(spec + sl - 4, ".bin") == 0) {
        const char *pp[1] = {spec};
        return clg_dataset_load_cifar10(err, pp, 1, out);
    }
    /* an IDX images file: derive its labels file */
    char lab[1024];
    const char *hit = strstr(spec, "images-idx3");
    const char *lp = NULL;
    if (hit && sl < sizeof lab) {
        size_t pre = (size_t)(hit - spec);
        snprintf(lab, sizeof lab, "%.*slabels-idx1%s", (int)pre, spec, hit + strlen("images-idx3"));
        if (file_exists(lab))
            lp = lab;
    }
    if (!lp)
        return clg_err_set(err, CLG_ERR_NOT_FOUND,
                           "no labels file for IDX images '%s' (expected its name with 'images-idx3' replaced by "
                           "'labels-idx1')",
                           spec);
    return clg_dataset_load_idx(err, spec, lp, out);
}

// ---- shuffling ----

void clg_dataset_perm_identity(int32_t *perm, int n)
{
    for (int i = 0; i < n; i++)
        perm[i] = i;
}

/* Uniform in [0, bound) without modulo bias. */
static uint32_t bounded(clg_rng *r, uint32_t bound)
{
    uint32_t threshold = (uint32_t)(-bound) % bound;
    for (;;) {
        uint32_t x = clg_rng_u32(r);
        if (x >= threshold)
            return x % bound;
    }
}

void clg_dataset_shuffle(int32_t *perm, int n, clg_rng *rng)
{
    for (int i = n - 1; i > 0; i--) {
        uint32_t j = bounded(rng, (uint32_t)i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void clg_dataset_epoch_perm(int32_t *perm, int n, uint64_t seed, uint64_t epoch)
{
    clg_rng r;
    clg_rng_seed(&r, seed ^ (epoch * 0x9E3779B97F4A7C15ULL), 0x5348554646ULL + epoch);
    clg_dataset_perm_identity(perm, n);
    clg_dataset_shuffle(perm, n, &r);
}

// ---- normalization ----

void clg_ds_norm_identity(clg_ds_norm *nm, int c)
{
    memset(nm, 0, sizeof *nm);
    nm->c = c;
    for (int i = 0; i < CLG_DS_MAX_CHANNELS; i++)
        nm->std[i] = 1.0f;
}

clg_status clg_dataset_norm_compute(clg_err *err, const clg_dataset *ds, clg_ds_norm *out)
{
    clg_ds_norm_identity(out, ds->c);
    if (ds->n <= 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "dataset '%s' is empty: cannot compute normalization",
                           ds->source);
    size_t plane = (size_t)ds->h * ds->w;
    for (int c = 0; c < ds->c; c++) {
        double s = 0, s2 = 0;
        for (int i = 0; i < ds->n; i++) {
            size_t base = ((size_t)i * ds->c + (size_t)c) * plane;
            double ls = 0, ls2 = 0;
            if (ds->dtype == CLG_DS_U8) {
                uint64_t a = 0, a2 = 0;
                for (size_t k = 0; k < plane; k++) {
                    unsigned v = ds->u8[base + k];
                    a += v;
                    a2 += (uint64_t)v * v;
                }
                ls = (double)a / 255.0;
                ls2 = (double)a2 / (255.0 * 255.0);
            } else {
                for (size_t k = 0; k < plane; k++) {
                    double v = ds->f32[base + k];
                    ls += v;
                    ls2 += v * v;
                }
            }
            s += ls;
            s2 += ls2;
        }
        double cnt = (double)ds->n * (double)plane;
        double mean = s / cnt;
        double var = s2 / cnt - mean * mean;
        double sd = var > 0 ? sqrt(var) : 0;
        if (!isfinite(mean) || !isfinite(sd))
            return clg_err_set(err, CLG_ERR_FORMAT, "dataset '%s': channel %d has non-finite values", ds->source, c);
        out->mean[c] = (float)mean;
        out->std[c] = sd < 1e-6 ? 1.0f : (float)sd;
    }
    return CLG_OK;
}

// ---- batches ----

static clg_status fill_batch_impl(clg_err *err, const clg_dataset *ds, const clg_ds_norm *nm, const int32_t *perm,
                                  int start, int batch, const clg_ds_augment *aug, float *tmp, float *x,
                                  int32_t *labels, int *count_out);

/* Mirrors and/or shifts one C x H x W sample in place (tmp: H*W floats);
 * fill is the per-channel value of a zero pixel. */
static void augment_sample(float *d, int C, int H, int W, int flip, int dy, int dx, const float *fill, float *tmp)
{
    size_t plane = (size_t)H * W;
    for (int c = 0; c < C; c++) {
        float *p = d + (size_t)c * plane;
        memcpy(tmp, p, plane * sizeof(float));
        for (int y = 0; y < H; y++) {
            int sy = y - dy;
            for (int xx = 0; xx < W; xx++) {
                int sx = xx - dx;
                if (flip)
                    sx = W - 1 - sx;
                p[(size_t)y * W + xx] = (sy >= 0 && sy < H && sx >= 0 && sx < W) ? tmp[(size_t)sy * W + sx] : fill[c];
            }
        }
    }
}

clg_status clg_dataset_fill_batch(clg_err *err, const clg_dataset *ds, const clg_ds_norm *nm, const int32_t *perm,
                                  int start, int batch, float *x, int32_t *labels, int *count_out)
{
    return clg_dataset_fill_batch_aug(err, ds, nm, perm, start, batch, NULL, x, labels, count_out);
}

clg_status clg_dataset_fill_batch_aug(clg_err *err, const clg_dataset *ds, const clg_ds_norm *nm,
                                      const int32_t *perm, int start, int batch, const clg_ds_augment *aug, float *x,
                                      int32_t *labels, int *count_out)
{
    *count_out = 0;
    if (aug && (aug->shift < 0 || aug->shift > CLG_DS_MAX_SHIFT))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "augmentation shift %d is outside 0..%d", aug->shift,
                           CLG_DS_MAX_SHIFT);
    float *tmp = NULL;
    if (aug && (aug->flip || aug->shift > 0)) {
        tmp = malloc((size_t)ds->h * ds->w * sizeof(float));
        if (!tmp)
            return clg_err_set(err, CLG_ERR_HOST_OOM, "fill_batch: %d x %d augmentation buffer", ds->h, ds->w);
    }
    clg_status st = fill_batch_impl(err, ds, nm, perm, start, batch, aug, tmp, x, labels, count_out);
    free(tmp);
    return st;
}

static clg_status fill_batch_impl(clg_err *err, const clg_dataset *ds, const clg_ds_norm *nm, const int32_t *perm,
                                  int start, int batch, const clg_ds_augment *aug, float *tmp, float *x,
                                  int32_t *labels, int *count_out)
{
    if (start < 0 || batch < 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "fill_batch: start %d, batch %d", start, batch);
    if (nm && nm->c != ds->c)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "fill_batch: normalization has %d channels, dataset %d", nm->c,
                           ds->c);
    int count = start >= ds->n ? 0 : CLG_MIN(batch, ds->n - start);
    size_t plane = (size_t)ds->h * ds->w;
    float a[CLG_DS_MAX_CHANNELS], b[CLG_DS_MAX_CHANNELS];
    float scale = ds->dtype == CLG_DS_U8 ? 1.0f / 255.0f : 1.0f;
    for (int c = 0; c < ds->c; c++) {
        float mean = nm ? nm->mean[c] : 0.0f, sd = nm ? nm->std[c] : 1.0f;
        a[c] = scale / sd;
        b[c] = -mean / sd;
    }
    size_t per = clg_dataset_sample_size(ds);
    for (int i = 0; i < count; i++) {
        int32_t idx = perm ? perm[start + i] : start + i;
        if (idx < 0 || idx >= ds->n)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "fill_batch: permutation entry %d is %d (dataset has %d)",
                               start + i, idx, ds->n);
        float *dst = x + (size_t)i * per;
        for (int c = 0; c < ds->c; c++) {
            size_t off = (size_t)idx * per + (size_t)c * plane;
            float *d = dst + (size_t)c * plane;
            if (ds->dtype == CLG_DS_U8) {
                const uint8_t *s = ds->u8 + off;
                for (size_t k = 0; k < plane; k++)
                    d[k] = (float)s[k] * a[c] + b[c];
            } else {
                const float *s = ds->f32 + off;
                for (size_t k = 0; k < plane; k++)
                    d[k] = s[k] * a[c] + b[c];
            }
        }
        if (tmp) {
            /* the choices depend only on (seed, epoch, position) */
            uint64_t key[3] = {aug->seed, aug->epoch, (uint64_t)(start + i)};
            uint64_t r = clg_hash64(key, sizeof key, 0x61756731u);
            int flip = aug->flip && (r & 1);
            int span = 2 * aug->shift + 1;
            int dy = aug->shift ? (int)((r >> 8) % (uint64_t)span) - aug->shift : 0;
            int dx = aug->shift ? (int)((r >> 32) % (uint64_t)span) - aug->shift : 0;
            augment_sample(dst, ds->c, ds->h, ds->w, flip, dy, dx, b, tmp);
        }
        if (labels)
            labels[i] = ds->labels[idx];
    }
    *count_out = count;
    return CLG_OK;
}
