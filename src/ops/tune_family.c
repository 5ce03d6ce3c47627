/* Shipped tuning starting points per device family.
 *
 * data/tune-families.json (embedded into the library with the kernels,
 * cl/meson.build) lists families in order of preference:
 *   {"format": "clgrad-tune-families", "version": 1, "families": [
 *     {"name": "pocl-cpu-avx512", "status": "measured" | "estimated",
 *      "match": {"type": "cpu"|"gpu"|"accelerator", "vendor": "nvidia"|"amd"|"intel",
 *                "platform": TEXT, "name_any": [TEXT, ...],
 *                "local_mem_min": BYTES, "compute_units_min": N},
 *      "entries": {"gemm/M4N4K4": {...parameters as in the tuning database...}}}]}
 * A family matches when every "match" member holds: type equal, vendor as
 * clg_device_vendor classifies the device, platform a case-insensitive
 * substring of the platform name, one of name_any a case-insensitive
 * substring of the device name (which for PoCL carries the LLVM CPU name,
 * e.g. "pthread-skylake-avx512-..."; for AMD the gfx architecture), and the
 * limits at least the given values. The first matching family is used.
 * Lookup order (gemm.c, clg_gemm_params_for): the device's own measurements,
 * then the family's entries, then the built-in defaults. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "tune.h"

static const char *type_name(clg_device_type t)
{
    return (t & CLG_DEVICE_GPU) ? "gpu" : (t & CLG_DEVICE_CPU) ? "cpu" : (t & CLG_DEVICE_ACCELERATOR) ? "accelerator"
                                                                                                         : "other";
}

static const char *vendor_name(clg_vendor v)
{
    static const char *const names[] = {"other", "nvidia", "amd", "intel"};
    return (unsigned)v < 4 ? names[v] : "other";
}

/* 1 when every member of the "match" object m holds for dev. */
static int family_matches(const clg_json *m, clg_device *dev)
{
    if (!m || m->type != CLG_JSON_OBJ)
        return 0;
    for (int i = 0; i < m->n; i++) {
        const char *k = m->keys[i];
        const clg_json *v = &m->items[i];
        if (v->type == CLG_JSON_STR && strcmp(k, "type") == 0) {
            if (strcmp(v->str, type_name(dev->info.type)) != 0)
                return 0;
        } else if (v->type == CLG_JSON_STR && strcmp(k, "vendor") == 0) {
            if (strcmp(v->str, vendor_name(clg_device_vendor(dev))) != 0)
                return 0;
        } else if (v->type == CLG_JSON_STR && strcmp(k, "platform") == 0) {
            if (!clg_str_icontains(dev->info.platform, v->str))
                return 0;
        } else if (v->type == CLG_JSON_ARR && strcmp(k, "name_any") == 0) {
            int any = 0;
            for (int j = 0; j < v->n && !any; j++)
                any = v->items[j].type == CLG_JSON_STR && v->items[j].str[0] &&
                      clg_str_icontains(dev->info.name, v->items[j].str);
            if (!any)
                return 0;
        } else if (v->type == CLG_JSON_NUM && strcmp(k, "local_mem_min") == 0) {
            if ((double)dev->info.local_mem_bytes < v->num)
                return 0;
        } else if (v->type == CLG_JSON_NUM && strcmp(k, "compute_units_min") == 0) {
            if ((double)dev->info.compute_units < v->num)
                return 0;
        } else {
            return 0; /* a condition this reader does not know: not this device */
        }
    }
    return 1;
}

/* The entries of one family object into f (numeric members; "backend" kept). */
static clg_status read_family(clg_err *err, const clg_json *fam, clg_tune_family *f)
{
    const clg_json *name = clg_json_get(fam, "name"), *status = clg_json_get(fam, "status");
    const clg_json *entries = clg_json_get(fam, "entries");
    if (!name || name->type != CLG_JSON_STR || !entries || entries->type != CLG_JSON_OBJ)
        return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: a family lacks \"name\" or \"entries\"");
    snprintf(f->name, sizeof f->name, "%s", name->str);
    f->measured = status && status->type == CLG_JSON_STR && strcmp(status->str, "measured") == 0;
    for (int i = 0; i < entries->n; i++) {
        const clg_json *v = &entries->items[i];
        if (v->type != CLG_JSON_OBJ)
            return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: %s: entry '%s' is not an object", f->name,
                               entries->keys[i]);
        clg_tune_entry e;
        memset(&e, 0, sizeof e);
        snprintf(e.key, sizeof e.key, "%s", entries->keys[i]);
        for (int j = 0; j < v->n; j++)
            if (v->items[j].type == CLG_JSON_NUM)
                clg_tune_set(&e, v->keys[j], v->items[j].num);
            else if (v->items[j].type == CLG_JSON_STR && strcmp(v->keys[j], "backend") == 0)
                snprintf(e.backend, sizeof e.backend, "%s", v->items[j].str);
        if (f->d.n == f->d.cap) {
            int cap = f->d.cap ? f->d.cap * 2 : 16;
            clg_tune_entry *ne = realloc(f->d.e, sizeof *ne * (size_t)cap);
            if (!ne)
                return clg_err_set(err, CLG_ERR_HOST_OOM, "tuning families: out of memory");
            f->d.e = ne;
            f->d.cap = cap;
        }
        f->d.e[f->d.n++] = e;
    }
    return CLG_OK;
}

clg_status clg_tune_family_match(clg_err *err, const char *text, clg_device *dev, clg_tune_family *f, int *index)
{
    *index = -1;
    f->name[0] = 0;
    f->measured = 0;
    clg_tune_dev_clear(&f->d);
    clg_json *j = NULL;
    CLG_TRY(clg_json_parse(err, text, strlen(text), "tuning families", &j));
    const clg_json *fmt = clg_json_get(j, "format"), *fams = clg_json_get(j, "families");
    clg_status st = CLG_OK;
    if (!fmt || fmt->type != CLG_JSON_STR || strcmp(fmt->str, "clgrad-tune-families") != 0 || !fams ||
        fams->type != CLG_JSON_ARR)
        st = clg_err_set(err, CLG_ERR_FORMAT, "not a clgrad tuning families file");
    for (int i = 0; st == CLG_OK && fams && i < fams->n; i++) {
        const clg_json *fam = &fams->items[i];
        if (fam->type != CLG_JSON_OBJ || !family_matches(clg_json_get(fam, "match"), dev))
            continue;
        st = read_family(err, fam, f);
        if (st == CLG_OK)
            *index = i;
        break;
    }
    if (st != CLG_OK) {
        clg_tune_dev_clear(&f->d);
        f->name[0] = 0;
    }
    clg_json_free(j);
    return st;
}

clg_tune_family *clg_tune_family_get(clg_device *dev)
{
    clg_tune_db *db = clg_tune_db_get(dev->ctx);
    if (!db || !db->fams || dev->index < 0 || dev->index >= db->ndev)
        return NULL;
    clg_tune_family *f = &db->fams[dev->index];
    if (f->loaded)
        return f;
    f->loaded = 1;
    const char *text = clg_embedded_source("tune-families");
    int idx = -1;
    clg_err tmp = {0};
    if (!text)
        return f;
    if (clg_tune_family_match(&tmp, text, dev, f, &idx) != CLG_OK)
        clg_log(1, "shipped tuning families ignored (%s); using built-in defaults", tmp.msg);
    else if (idx >= 0)
        clg_log(2, "%s: tuning family '%s' (%s, %d entries)", dev->info.name, f->name,
                f->measured ? "measured" : "estimated", f->d.n);
    return f;
}

const clg_tune_entry *clg_tune_nearest_gemm(const clg_tune_dev *d, int bm, int bn, int bk)
{
    int best = 1 << 30;
    const clg_tune_entry *be = NULL;
    for (int i = 0; d && i < d->n; i++) {
        int m, n, k;
        if (sscanf(d->e[i].key, "gemm/M%dN%dK%d", &m, &n, &k) != 3)
            continue;
        int dist = abs(m - bm) + abs(n - bn) + abs(k - bk);
        if (dist < best) {
            best = dist;
            be = &d->e[i];
        }
    }
    return be;
}

void clg_tune_note_pending(clg_device *dev, const char *cls, int M, int N, int K)
{
    clg_tune_family *f = clg_tune_family_get(dev);
    if (!f || f->npending >= CLG_TUNE_MAX_PENDING)
        return;
    for (int i = 0; i < f->npending; i++)
        if (strcmp(f->pending_cls[i], cls) == 0)
            return;
    snprintf(f->pending_cls[f->npending], sizeof f->pending_cls[0], "%s", cls);
    f->pending[f->npending][0] = M;
    f->pending[f->npending][1] = N;
    f->pending[f->npending][2] = K;
    f->npending++;
}
