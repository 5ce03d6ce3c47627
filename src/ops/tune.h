/* Tuning database: per device (name + driver version) a set of entries
 * "family/class" -> numeric parameters and an optional backend name, kept in
 * ctx->tune_db and stored as JSON under <cache_dir>/tune/. Reading is
 * tolerant: a missing or corrupt file is ignored (with a log line) and the
 * shipped defaults are used. */
#ifndef CLG_OPS_TUNE_H
#define CLG_OPS_TUNE_H

#include "device/device.h"

#define CLG_TUNE_MAXP 24

typedef struct clg_tune_entry {
    char key[64];     /* e.g. "gemm/M3N4K2" */
    char backend[16]; /* "" when not set */
    int n;
    char names[CLG_TUNE_MAXP][12];
    double vals[CLG_TUNE_MAXP];
} clg_tune_entry;

typedef struct clg_tune_dev {
    int loaded;
    int dirty;
    clg_tune_entry *e;
    int n, cap;
} clg_tune_dev;

/* Shipped starting points for the device's family (data/tune-families.json,
 * embedded; tune_family.c), and the GEMM shapes this process ran without an
 * own measurement of their class (what background tuning fills). */
#define CLG_TUNE_MAX_PENDING 32
#define CLG_TUNE_FAMILY_MAXP 8
typedef struct clg_tune_family {
    int loaded;
    char name[48];    /* "" when no family matches */
    int measured;     /* 1 "measured", 0 "estimated" */
    clg_tune_dev d;   /* its entries (its bases' ones first, then its own by key) */
    int nparams;      /* its "params" (after its bases'): choices that are not GEMM tiles */
    char pnames[CLG_TUNE_FAMILY_MAXP][24];
    double pvals[CLG_TUNE_FAMILY_MAXP];
    int npending;
    int pending[CLG_TUNE_MAX_PENDING][3]; /* M, N, K, one per class */
    char pending_cls[CLG_TUNE_MAX_PENDING][16];
} clg_tune_family;

typedef struct clg_tune_db {
    int ndev;
    clg_tune_dev *devs;
    clg_tune_family *fams; /* per device, like devs */
    int gemm_backend; /* 0 unset, else clg_gemm_backend + 1: default for AUTO args */
    int auto_measure; /* measure own vs CLBlast lazily for AUTO (1 default) */
} clg_tune_db;

/* The context's database (created on first use; NULL only without memory). */
CLG_INTERNAL clg_tune_db *clg_tune_db_get(clg_ctx *ctx);
/* Entries of one device, loaded from disk on first use. */
CLG_INTERNAL clg_tune_dev *clg_tune_dev_get(clg_device *dev);
CLG_INTERNAL const clg_tune_entry *clg_tune_find(clg_device *dev, const char *key);
/* Adds or replaces (by key); marks the device dirty. */
CLG_INTERNAL clg_status clg_tune_put(clg_device *dev, const clg_tune_entry *e);
/* Parameter lookup in an entry; returns def when absent. */
CLG_INTERNAL double clg_tune_param(const clg_tune_entry *e, const char *name, double def);
CLG_INTERNAL void clg_tune_set(clg_tune_entry *e, const char *name, double v);
/* File of the device's database. */
CLG_INTERNAL void clg_tune_path(clg_device *dev, char *buf, size_t len);
/* Writes the device's entries (atomically). */
CLG_INTERNAL clg_status clg_tune_save(clg_device *dev);
/* Parses a database text into d (entries appended). Returns CLG_ERR_FORMAT
 * for malformed text or a different device/driver (d unchanged then). */
CLG_INTERNAL clg_status clg_tune_parse(clg_err *err, const char *text, const char *devname, const char *driver,
                                       clg_tune_dev *d);
/* Serialises d as JSON (caller frees out->data). */
CLG_INTERNAL void clg_tune_format(const clg_tune_dev *d, const char *devname, const char *driver, clg_sbuf *out);
CLG_INTERNAL void clg_tune_dev_clear(clg_tune_dev *d);

/* The device's family entry set (matched and parsed on first use; a family
 * file that does not parse is logged and treated as no family). NULL only
 * without memory. */
CLG_INTERNAL clg_tune_family *clg_tune_family_get(clg_device *dev);
/* Family matching over a families text (tests): index of the first family of
 * text that matches dev, its name, status and entries into f; -1 when none
 * (CLG_ERR_FORMAT for malformed text, f then empty). */
CLG_INTERNAL clg_status clg_tune_family_match(clg_err *err, const char *text, clg_device *dev, clg_tune_family *f,
                                              int *index);
/* A family parameter ("params" in data/tune-families.json, names listed in
 * tune_family.c): its value in f, or def when f does not set it. */
CLG_INTERNAL double clg_tune_family_pget(const clg_tune_family *f, const char *name, double def);
/* The same for the device's family (def when no family matches). */
CLG_INTERNAL double clg_tune_family_param(clg_device *dev, const char *name, double def);
/* Nearest entry to class (bm, bn, bk) among d's "gemm/M?N?K?" keys (exact first). */
CLG_INTERNAL const clg_tune_entry *clg_tune_nearest_gemm(const clg_tune_dev *d, int bm, int bn, int bk);
/* A stamp of the device's own GEMM choices: the kernel parameters of every
 * "gemm/<class>" entry and the backend of the "gemm-auto/<class>" entries
 * of those classes (not their figures), independent of entry order; 0 when
 * there are none (untuned: the family's entries or the defaults).
 * Measurements that ran own GEMM kernels (the convolution algorithm choice)
 * record it, and are measured again when it changes (conv_auto.c). */
CLG_INTERNAL uint32_t clg_tune_gemm_stamp(clg_device *dev);
/* Remembers a GEMM shape whose class has no own measurement (once per class). */
CLG_INTERNAL void clg_tune_note_pending(clg_device *dev, const char *cls, int M, int N, int K);

#endif
