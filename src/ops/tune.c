/* Tuning database: storage, lookup and a small tolerant JSON reader/writer.
 *
 * File format (one file per device, <cache_dir>/tune/<hash of the device
 * fingerprint>.json; "device" holds the fingerprint, clg_device_fingerprint:
 * name, vendor, platform, driver and the limits, so a file from another
 * device, or from the same simulator under other limits, is ignored):
 *   {"format": "clgrad-tune", "version": 1, "device": "...", "driver": "...",
 *    "entries": {"gemm/M3N4K2": {"backend": "own", "MR": 8, ...}, ...}}
 * Unknown keys are skipped; entries with bad values are dropped. */
#include <stdlib.h>
#include <string.h>

#include "tune.h"

/* ---- database in the context ---- */

static void db_free(void *p)
{
    clg_tune_db *db = p;
    if (!db)
        return;
    for (int i = 0; i < db->ndev; i++)
        clg_tune_dev_clear(&db->devs[i]);
    free(db->devs);
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
        if (!db->devs) {
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
    /* merge what another context or device of the same kind saved since we
     * loaded (our entries win) */
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
    if (b.oom) {
        clg_sbuf_free(&b);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "tuning database: out of memory");
    }
    clg_status st = clg_file_write_atomic(err, path, b.data, b.len);
    clg_sbuf_free(&b);
    if (st == CLG_OK)
        d->dirty = 0;
    return st;
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

/* ---- JSON reader (only what the format needs; anything else is skipped) ---- */

typedef struct jp {
    const char *s;
    int depth;
    int bad;
} jp;

static void ws(jp *p)
{
    while (*p->s == ' ' || *p->s == '\n' || *p->s == '\r' || *p->s == '\t')
        p->s++;
}

static int eat(jp *p, char c)
{
    ws(p);
    if (*p->s == c) {
        p->s++;
        return 1;
    }
    return 0;
}

/* Reads a string into buf (truncated to len-1; \uXXXX kept only for ASCII). */
static int jstr(jp *p, char *buf, size_t len)
{
    ws(p);
    if (*p->s != '"')
        return 0;
    p->s++;
    size_t n = 0;
    while (*p->s && *p->s != '"') {
        char c = *p->s++;
        if (c == '\\') {
            c = *p->s++;
            switch (c) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    char h = *p->s++;
                    v <<= 4;
                    if (h >= '0' && h <= '9')
                        v |= (unsigned)(h - '0');
                    else if (h >= 'a' && h <= 'f')
                        v |= (unsigned)(h - 'a' + 10);
                    else if (h >= 'A' && h <= 'F')
                        v |= (unsigned)(h - 'A' + 10);
                    else
                        return 0;
                }
                c = v < 128 ? (char)v : '?';
                break;
            }
            case 0: return 0;
            default: break; /* \" \\ \/ */
            }
        }
        if (n + 1 < len)
            buf[n++] = c;
    }
    if (*p->s != '"')
        return 0;
    p->s++;
    if (len)
        buf[n] = 0;
    return 1;
}

static int jnum(jp *p, double *v)
{
    ws(p);
    char *end = NULL;
    *v = strtod(p->s, &end);
    if (end == p->s)
        return 0;
    p->s = end;
    return 1;
}

static int jskip(jp *p)
{
    ws(p);
    if (++p->depth > 64)
        return 0;
    int ok = 1;
    char c = *p->s;
    if (c == '"') {
        char tmp[2];
        ok = jstr(p, tmp, sizeof tmp);
    } else if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        p->s++;
        if (!eat(p, close)) {
            do {
                if (c == '{') {
                    char k[2];
                    if (!jstr(p, k, sizeof k) || !eat(p, ':')) {
                        ok = 0;
                        break;
                    }
                }
                if (!jskip(p)) {
                    ok = 0;
                    break;
                }
            } while (eat(p, ','));
            ok = ok && eat(p, close);
        }
    } else if (strncmp(p->s, "true", 4) == 0 || strncmp(p->s, "null", 4) == 0) {
        p->s += 4;
    } else if (strncmp(p->s, "false", 5) == 0) {
        p->s += 5;
    } else {
        double v;
        ok = jnum(p, &v);
    }
    p->depth--;
    return ok;
}

static int parse_entry(jp *p, clg_tune_entry *e)
{
    if (!eat(p, '{'))
        return 0;
    if (eat(p, '}'))
        return 1;
    do {
        char name[64];
        if (!jstr(p, name, sizeof name) || !eat(p, ':'))
            return 0;
        ws(p);
        if (strcmp(name, "backend") == 0 && *p->s == '"') {
            if (!jstr(p, e->backend, sizeof e->backend))
                return 0;
        } else if (*p->s == '-' || (*p->s >= '0' && *p->s <= '9')) {
            double v;
            if (!jnum(p, &v))
                return 0;
            clg_tune_set(e, name, v);
        } else if (!jskip(p)) {
            return 0;
        }
    } while (eat(p, ','));
    return eat(p, '}');
}

clg_status clg_tune_parse(clg_err *err, const char *text, const char *devname, const char *driver, clg_tune_dev *d)
{
    jp p = {text, 0, 0};
    clg_tune_dev tmp = {0};
    char fmt[32] = "", dname[256] = "", drv[128] = "";
    int have_entries = 0;
    if (!eat(&p, '{'))
        goto bad;
    if (!eat(&p, '}')) {
        do {
            char key[64];
            if (!jstr(&p, key, sizeof key) || !eat(&p, ':'))
                goto bad;
            if (strcmp(key, "format") == 0) {
                if (!jstr(&p, fmt, sizeof fmt))
                    goto bad;
            } else if (strcmp(key, "device") == 0) {
                if (!jstr(&p, dname, sizeof dname))
                    goto bad;
            } else if (strcmp(key, "driver") == 0) {
                if (!jstr(&p, drv, sizeof drv))
                    goto bad;
            } else if (strcmp(key, "entries") == 0) {
                have_entries = 1;
                if (!eat(&p, '{'))
                    goto bad;
                if (!eat(&p, '}')) {
                    do {
                        clg_tune_entry e;
                        memset(&e, 0, sizeof e);
                        if (!jstr(&p, e.key, sizeof e.key) || !eat(&p, ':') || !parse_entry(&p, &e))
                            goto bad;
                        if (e.key[0] && dev_put(err, &tmp, &e) != CLG_OK)
                            goto bad;
                    } while (eat(&p, ','));
                    if (!eat(&p, '}'))
                        goto bad;
                }
            } else if (!jskip(&p)) {
                goto bad;
            }
        } while (eat(&p, ','));
        if (!eat(&p, '}'))
            goto bad;
    }
    ws(&p);
    if (*p.s)
        goto bad;
    if (strcmp(fmt, "clgrad-tune") != 0 || !have_entries) {
        clg_tune_dev_clear(&tmp);
        return clg_err_set(err, CLG_ERR_FORMAT, "not a clgrad tuning database");
    }
    if (strcmp(dname, devname) != 0 || strcmp(drv, driver) != 0) {
        clg_tune_dev_clear(&tmp);
        return clg_err_set(err, CLG_ERR_FORMAT, "tuning database is for '%s' driver '%s'", dname, drv);
    }
    for (int i = 0; i < tmp.n; i++)
        if (dev_put(err, d, &tmp.e[i]) != CLG_OK)
            break;
    d->dirty = 0;
    clg_tune_dev_clear(&tmp);
    return CLG_OK;
bad:
    clg_tune_dev_clear(&tmp);
    return clg_err_set(err, CLG_ERR_FORMAT, "malformed JSON near offset %ld", (long)(p.s - text));
}
