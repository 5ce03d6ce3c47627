/* gzip: whole files inflated in memory (one or more members, trailers
 * checked), for the IDX and PGM readers. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "io/dataset_impl.h"

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
clg_status clg_ds_read_maybe_gz(clg_err *err, const char *path, uint64_t max, uint8_t **out, size_t *len)
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
