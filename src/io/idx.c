/* IDX files (MNIST / Fashion-MNIST layout): parsing, image and label
 * pairs, and the u8 writer used by tests and tools. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "io/dataset_impl.h"

/* Parses the IDX bytes b[0..n) (malloc'd; taken over: freed, or kept as
 * out->data). */
clg_status clg_idx_parse(clg_err *err, const char *path, uint8_t *b, size_t n, clg_idx_file *out)
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
        if (out->dims[i] > 0 && out->count > CLG_IDX_MAX_BYTES / esize / out->dims[i]) {
            st = clg_err_set(err, CLG_ERR_FORMAT, "IDX file '%s': dimensions describe more than %llu bytes (corrupt?)",
                             path, (unsigned long long)CLG_IDX_MAX_BYTES);
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

static clg_status idx_read(clg_err *err, const char *path, clg_idx_file *out)
{
    memset(out, 0, sizeof *out);
    if (!clg_ds_file_exists(path))
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "IDX file '%s' does not exist (or is not a regular file)", path);
    uint8_t *b = NULL;
    size_t n = 0;
    clg_status st = clg_ds_read_maybe_gz(err, path, CLG_IDX_MAX_BYTES + 36, &b, &n);
    return st != CLG_OK ? st : clg_idx_parse(err, path, b, n, out);
}

clg_status clg_idx_images_to_dataset(clg_err *err, const char *path, clg_idx_file *im, clg_dataset **out)
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
    clg_ds_set_str(ds->name, sizeof ds->name, "idx");
    clg_ds_set_str(ds->source, sizeof ds->source, path);
    *out = ds;
    return CLG_OK;
}

clg_status clg_dataset_load_idx(clg_err *err, const char *images_path, const char *labels_path, clg_dataset **out)
{
    *out = NULL;
    clg_idx_file im, lb;
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
    st = clg_idx_images_to_dataset(err, images_path, &im, &ds);
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
