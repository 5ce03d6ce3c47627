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

typedef struct clg_tune_db {
    int ndev;
    clg_tune_dev *devs;
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

#endif
