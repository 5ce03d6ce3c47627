/* Internals shared by the dataset pipeline (dataset.c) and the format
 * readers (gz.c, idx.c, cifar.c, pgm.c); not part of the module's interface
 * (io/dataset.h). */
#ifndef CLG_IO_DATASET_IMPL_H
#define CLG_IO_DATASET_IMPL_H

#include "io/dataset.h"

#define CLG_IDX_MAX_BYTES ((uint64_t)1 << 34) /* 16 GiB: anything larger is a corrupt header */

/* An IDX file in memory. */
typedef struct clg_idx_file {
    int ndim;
    uint32_t dims[8];
    uint64_t count; /* product of dims */
    int type;       /* element type code: 0x08 unsigned byte, 0x0D float32 (big-endian in the file) */
    uint8_t *data;  /* count elements (0x0D: converted to host-order floats in place) */
} clg_idx_file;

/* ---- dataset.c ---- */

/* Copies s (NULL = "") into dst[cap], truncated. */
CLG_INTERNAL void clg_ds_set_str(char *dst, size_t cap, const char *s);
/* 1 when path is a regular file. */
CLG_INTERNAL int clg_ds_file_exists(const char *path);

/* ---- gz.c ---- */

/* Whole file in memory (malloc'd), gunzipped when it starts with the gzip
 * magic (at most max bytes after inflation). */
CLG_INTERNAL clg_status clg_ds_read_maybe_gz(clg_err *err, const char *path, uint64_t max, uint8_t **out,
                                             size_t *len);

/* ---- idx.c ---- */

/* Parses the IDX bytes b[0..n) (malloc'd; taken over: freed, or kept as
 * out->data). */
CLG_INTERNAL clg_status clg_idx_parse(clg_err *err, const char *path, uint8_t *b, size_t n, clg_idx_file *out);
/* An images file (2, 3 or 4 dims) as an unlabeled dataset; takes over im->data. */
CLG_INTERNAL clg_status clg_idx_images_to_dataset(clg_err *err, const char *path, clg_idx_file *im,
                                                  clg_dataset **out);

/* ---- pgm.c ---- */

/* A PGM image b[0..len) (starts with "P5" or "P2") as a one-image dataset. */
CLG_INTERNAL clg_status clg_pgm_load(clg_err *err, const char *path, const char *b, size_t len, clg_dataset **out);

#endif
