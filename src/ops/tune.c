/* Tuning database: storage, lookup, JSON writer and reader.
 *
 * File format (one file per device, <cache_dir>/tune/<hash of the device
 * fingerprint>.json; "device" holds the fingerprint, clg_device_fingerprint:
 * name, vendor, platform, driver and the limits, so a file from another
 * device, or from the same simulator under other limits, is ignored):
 *   {"format": "clgrad-tune", "version": 1, "device": "...", "driver": "...",
 *    "entries": {"gemm/M3N4K2": {"backend": "own", "MR": 8, ...}, ...}}
 * Unknown keys and values of other types are skipped; entries that are not
 * objects make the file malformed. Read with io/json.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "tune.h"

/* ---- database in the context ---- */

static void db_free(void *p)
{
    clg_tune_db *db = p;
    if (!db)
        return;
    for (int i = 0; i < db->ndev; i++) {
        clg_tune_dev_clear(&db->devs[i]);
        if (db->fams)
            clg_tune_dev_clear(&db->fams[i].d);
    }
    free(db->devs);
    free(db->fams);
    free(db);
}

/* Created once under the context lock; each device then touches only its
 * own entry (devs[dev->index]) from its own thread. */
clg_tune_db *clg_tune_db_get(clg_ctx *ctx)
{
    clg_ctx_lock(ctx);
    clg_tune_db *db = ctx->tune_db;
    if (!db && (db = calloc(1, sizeof *db)) != NULL) {
        db->devs = calloc((size_t)CLG_MAX(ctx->ndev, 1), sizeof *db->devs);
        db->fams = calloc((size_t)CLG_MAX(ctx->ndev, 1), sizeof *db->fams);
        if (!db->devs || !db->fams) {
            free(db->devs);
            free(db->fams);
            free(db);
            db = NULL;
        } else {
            db->ndev = ctx->ndev;
            db->auto_measure = 1;
            ctx->tune_db = db;
            ctx->tune_db_free = db_free;
        }
    }
    clg_ctx_unlock(ctx);
    return db;
}

void clg_tune_dev_clear(clg_tune_dev *d)
{
    free(d->e);
    d->e = NULL;
    d->n = d->cap = 0;
}

void clg_tune_path(clg_device *dev, char *buf, size_t len)
{
    char fp[700];
    clg_device_fingerprint(dev, fp, sizeof fp);
    uint64_t h = clg_hash_str(fp, CLG_HASH_SEED);
    snprintf(buf, len, "%s/tune/%016llx.json", dev->ctx->cache_dir, (unsigned long long)h);
}

clg_tune_dev *clg_tune_dev_get(clg_device *dev)
{
    clg_tune_db *db = clg_tune_db_get(dev->ctx);
    if (!db || dev->index < 0 || dev->index >= db->ndev)
        return NULL;
    clg_tune_dev *d = &db->devs[dev->index];
    if (d->loaded)
        return d;
    d->loaded = 1;
    if (!dev->ctx->cache_dir[0])
        return d;
    char path[1200];
    clg_tune_path(dev, path, sizeof path);
    char *text = NULL;
    size_t len = 0;
    clg_err tmp;
    if (clg_file_read(&tmp, path, &text, &len) != CLG_OK)
        return d; /* nothing tuned yet */
    char fp[700];
    clg_device_fingerprint(dev, fp, sizeof fp);
    if (clg_tune_parse(&tmp, text, fp, dev->info.driver_version, d) != CLG_OK)
        clg_log(1, "tuning database %s ignored (%s); using defaults", path, tmp.msg);
    else
        clg_log(2, "tuning database %s: %d entries", path, d->n);
    free(text);
    return d;
}

const clg_tune_entry *clg_tune_find(clg_device *dev, const char *key)
{
    clg_tune_dev *d = clg_tune_dev_get(dev);
    if (!d)
        return NULL;
    for (int i = 0; i < d->n; i++)
        if (strcmp(d->e[i].key, key) == 0)
            return &d->e[i];
    return NULL;
}

static clg_status dev_put(clg_err *err, clg_tune_dev *d, const clg_tune_entry *e)
{
    for (int i = 0; i < d->n; i++)
        if (strcmp(d->e[i].key, e->key) == 0) {
            d->e[i] = *e;
            d->dirty = 1;
            return CLG_OK;
        }
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 16;
        clg_tune_entry *ne = realloc(d->e, sizeof *ne * (size_t)cap);
        if (!ne)
            return clg_err_set(err, CLG_ERR_HOST_OOM, "tuning database: out of memory");
        d->e = ne;
        d->cap = cap;
    }
    d->e[d->n++] = *e;
    d->dirty = 1;
    return CLG_OK;
}

clg_status clg_tune_put(clg_device *dev, const clg_tune_entry *e)
{
    clg_tune_dev *d = clg_tune_dev_get(dev);
    if (!d)
        return clg_err_set(clg_dev_err(dev), CLG_ERR_HOST_OOM, "tuning database: out of memory");
    return dev_put(clg_dev_err(dev), d, e);
}

double clg_tune_param(const clg_tune_entry *e, const char *name, double def)
{
    if (!e)
        return def;
    for (int i = 0; i < e->n; i++)
        if (strcmp(e->names[i], name) == 0)
            return e->vals[i];
    return def;
}

void clg_tune_set(clg_tune_entry *e, const char *name, double v)
{
    for (int i = 0; i < e->n; i++)
        if (strcmp(e->names[i], name) == 0) {
            e->vals[i] = v;
            return;
        }
    if (e->n < CLG_TUNE_MAXP && strlen(name) < sizeof e->names[0]) {
        snprintf(e->names[e->n], sizeof e->names[0], "%s", name);
        e->vals[e->n++] = v;
    }
}

clg_status clg_tune_save(clg_device *dev)
{
    clg_err *err = clg_dev_err(dev);
    if (dev->ctx->cache_readonly) /* CLGRAD_CACHE=ro */
        return CLG_OK;
    clg_tune_dev *d = clg_tune_dev_get(dev);
    if (!d)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "tuning database: out of memory");
    char path[1200], dir[1200], fp[700];
    clg_tune_path(dev, path, sizeof path);
    clg_device_fingerprint(dev, fp, sizeof fp);
    snprintf(dir, sizeof dir, "%s/tune", dev->ctx->cache_dir);
    CLG_TRY(clg_mkdirs(err, dir));
    /* Several processes (a sweep's trials, background tuning beside a
     * training run) save into the same file: under its lock (<path>.lock),
     * merge what another context or process saved since we loaded (our
     * entries win), then replace the file atomically, so no writer puts back
     * an older copy over another's update. Without the lock (not had within
     * 10 s) the write stays atomic; only a concurrent update may be lost. */
    int lk = clg_file_lock(path, 10.0);
    char *text = NULL;
    size_t len = 0;
    clg_err tmp;
    if (clg_file_read(&tmp, path, &text, &len) == CLG_OK) {
        clg_tune_dev disk = {0};
        if (clg_tune_parse(&tmp, text, fp, dev->info.driver_version, &disk) == CLG_OK)
            for (int i = 0; i < disk.n; i++) {
                int have = 0;
                for (int j = 0; j < d->n && !have; j++)
                    have = strcmp(d->e[j].key, disk.e[i].key) == 0;
                if (!have && dev_put(err, d, &disk.e[i]) != CLG_OK)
                    break;
            }
        clg_tune_dev_clear(&disk);
        free(text);
    }
    clg_sbuf b = {0};
    clg_tune_format(d, fp, dev->info.driver_version, &b);
    clg_status st = b.oom ? clg_err_set(err, CLG_ERR_HOST_OOM, "tuning database: out of memory")
                          : clg_file_write_atomic(err, path, b.data, b.len);
    clg_file_unlock(lk);
    clg_sbuf_free(&b);
    if (st == CLG_OK)
        d->dirty = 0;
    return st;
}

/* Figures an entry records beside its parameters: not part of the stamp. */
static int is_figure(const char *name)
{
    static const char *const figs[] = {"gflops", "def_gflops", "fam_gflops", "M", "N", "K", "own_ms", "clblast_ms"};
    for (size_t i = 0; i < CLG_ARRAY_LEN(figs); i++)
        if (strcmp(name, figs[i]) == 0)
            return 1;
    return 0;
}

uint32_t clg_tune_gemm_stamp(clg_device *dev)
{
    const clg_tune_dev *d = clg_tune_dev_get(dev);
    uint64_t sum = 0;
    int n = 0;
    for (int i = 0; d && i < d->n; i++) {
        const clg_tune_entry *e = &d->e[i];
        if (strncmp(e->key, "gemm-auto/", 10) == 0) {
            /* a backend choice counts beside its class's own parameters: the
             * ones a run records lazily on an untuned device leave it 0 */
            char pk[sizeof e->key];
            snprintf(pk, sizeof pk, "gemm/%s", e->key + 10);
            int tuned = 0;
            for (int j = 0; j < d->n && !tuned; j++)
                tuned = strcmp(d->e[j].key, pk) == 0;
            if (!tuned)
                continue;
        } else if (strncmp(e->key, "gemm/", 5) != 0)
            continue;
        uint64_t h = clg_hash_str(e->key, CLG_HASH_SEED);
        h = clg_hash_str(e->backend, h);
        for (int j = 0; j < e->n; j++)
            if (!is_figure(e->names[j])) {
                h = clg_hash_str(e->names[j], h);
                h = clg_hash64(&e->vals[j], sizeof e->vals[j], h);
            }
        sum += h; /* a sum: the entries' order in the file does not matter */
        n++;
    }
    uint32_t st = (uint32_t)(sum ^ (sum >> 32));
    return n && !st ? 1 : st;
}

/* ---- JSON writer ---- */

void clg_tune_format(const clg_tune_dev *d, const char *devname, const char *driver, clg_sbuf *out)
{
    clg_sbuf_printf(out, "{\"format\": \"clgrad-tune\", \"version\": 1,\n \"device\": ");
    clg_sbuf_json_str(out, devname);
    clg_sbuf_printf(out, ", \"driver\": ");
    clg_sbuf_json_str(out, driver);
    clg_sbuf_printf(out, ",\n \"entries\": {");
    for (int i = 0; i < d->n; i++) {
        const clg_tune_entry *e = &d->e[i];
        clg_sbuf_printf(out, "%s\n  ", i ? "," : "");
        clg_sbuf_json_str(out, e->key);
        clg_sbuf_printf(out, ": {");
        int first = 1;
        if (e->backend[0]) {
            clg_sbuf_printf(out, "\"backend\": ");
            clg_sbuf_json_str(out, e->backend);
            first = 0;
        }
        for (int j = 0; j < e->n; j++) {
            clg_sbuf_printf(out, "%s", first ? "" : ", ");
            clg_sbuf_json_str(out, e->names[j]);
            clg_sbuf_printf(out, ": %.6g", e->vals[j]);
            first = 0;
        }
        clg_sbuf_printf(out, "}");
    }
    clg_sbuf_printf(out, "\n }\n}\n");
}

/* ---- reading (io/json.c's reader; what the format does not use is skipped) ---- */

/* A decoded JSON string into buf[len]: truncated, and cut at an embedded NUL. */
static void copy_str(char *buf, size_t len, const clg_json *v) { snprintf(buf, len, "%s", v->str); }

/* One entry's members: "backend" (a string) and numeric parameters; other
 * values, and numbers that are not finite, are skipped. */
static void read_entry(const clg_json *v, clg_tune_entry *e)
{
    for (int i = 0; i < v->n; i++) {
        const char *name = v->keys[i];
        const clg_json *x = &v->items[i];
        if (strcmp(name, "backend") == 0 && x->type == CLG_JSON_STR)
            copy_str(e->backend, sizeof e->backend, x);
        else if (x->type == CLG_JSON_NUM && isfinite(x->num))
            clg_tune_set(e, name, x->num);
    }
}

/* The "entries" object into tmp (entries with an empty key are dropped). */
static clg_status read_entries(clg_err *err, const clg_json *v, clg_tune_dev *tmp)
{
    if (v->type != CLG_JSON_OBJ)
        return clg_err_set(err, CLG_ERR_FORMAT, "tuning database: \"entries\" is a %s, expected an object",
                           clg_json_type_name(v->type));
    for (int i = 0; i < v->n; i++) {
        if (v->items[i].type != CLG_JSON_OBJ)
            return clg_err_set(err, CLG_ERR_FORMAT, "tuning database: entry '%s' is a %s, expected an object",
                               v->keys[i], clg_json_type_name(v->items[i].type));
        clg_tune_entry e;
        memset(&e, 0, sizeof e);
        snprintf(e.key, sizeof e.key, "%s", v->keys[i]);
        read_entry(&v->items[i], &e);
        if (e.key[0])
            CLG_TRY(dev_put(err, tmp, &e));
    }
    return CLG_OK;
}

/* The top-level object: format, device, driver and the entries (members in
 * file order; a repeated key: the last one counts, entries accumulate). */
static clg_status read_db(clg_err *err, const clg_json *j, char (*fields)[256], int *have_entries, clg_tune_dev *tmp)
{
    static const char *const names[3] = {"format", "device", "driver"};
    if (j->type != CLG_JSON_OBJ)
        return clg_err_set(err, CLG_ERR_FORMAT, "tuning database is a JSON %s, expected an object",
                           clg_json_type_name(j->type));
    for (int i = 0; i < j->n; i++) {
        const clg_json *v = &j->items[i];
        if (strcmp(j->keys[i], "entries") == 0) {
            *have_entries = 1;
            CLG_TRY(read_entries(err, v, tmp));
            continue;
        }
        for (int f = 0; f < 3; f++) {
            if (strcmp(j->keys[i], names[f]) != 0)
                continue;
            if (v->type != CLG_JSON_STR)
                return clg_err_set(err, CLG_ERR_FORMAT, "tuning database: \"%s\" is a %s, expected a string",
                                   names[f], clg_json_type_name(v->type));
            copy_str(fields[f], sizeof fields[f], v);
        }
    }
    return CLG_OK;
}

clg_status clg_tune_parse(clg_err *err, const char *text, const char *devname, const char *driver, clg_tune_dev *d)
{
    clg_json *j = NULL;
    CLG_TRY(clg_json_parse(err, text, strlen(text), "tuning database", &j));
    clg_tune_dev tmp = {0};
    char fields[3][256] = {"", "", ""}; /* format, device, driver */
    int have_entries = 0;
    clg_status st = read_db(err, j, fields, &have_entries, &tmp);
    clg_json_free(j);
    if (st == CLG_OK && (strcmp(fields[0], "clgrad-tune") != 0 || !have_entries))
        st = clg_err_set(err, CLG_ERR_FORMAT, "not a clgrad tuning database");
    else if (st == CLG_OK && (strcmp(fields[1], devname) != 0 || strcmp(fields[2], driver) != 0))
        st = clg_err_set(err, CLG_ERR_FORMAT, "tuning database is for '%s' driver '%s'", fields[1], fields[2]);
    if (st == CLG_OK) {
        for (int i = 0; i < tmp.n; i++)
            if (dev_put(err, d, &tmp.e[i]) != CLG_OK)
                break;
        d->dirty = 0;
    }
    clg_tune_dev_clear(&tmp);
    return st;
}
