/* PGM images (P5 binary, P2 ASCII) for prediction. */
#include <stdlib.h>
#include <string.h>

#include "io/dataset_impl.h"

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

clg_status clg_pgm_load(clg_err *err, const char *path, const char *b, size_t len, clg_dataset **out)
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
    clg_ds_set_str(ds->name, sizeof ds->name, "pgm");
    clg_ds_set_str(ds->source, sizeof ds->source, path);
    *out = ds;
    return CLG_OK;
}
