/* Shipped tuning starting points per device family.
 *
 * data/tune-families.json (embedded into the library with the kernels,
 * cl/meson.build) lists families in order of preference:
 *   {"format": "clgrad-tune-families", "version": 1, "families": [
 *     {"name": "pocl-cpu-avx512", "status": "measured" | "estimated",
 *      "match": {"type": "cpu"|"gpu"|"accelerator", "vendor": "nvidia"|"amd"|"intel",
 *                "platform": TEXT, "name_any": [TEXT, ...],
 *                "local_mem_min": BYTES, "compute_units_min": N},
 *      "base": "another family's name",
 *      "entries": {"gemm/M4N4K4": {...parameters as in the tuning database...}},
 *      "params": {"gemm_rows_large": 1024, ...}}]}
 * A family with a "base" starts from the base's entries and params (the
 * base's base first, and so on) and lists only what differs: its own entries
 * replace the base's of the same key, its params the base's of the same
 * name. "match", "status" and "name" are the family's own. params are
 * choices that are not GEMM tiles (known_params below), read through
 * clg_tune_family_param with the built-in default when absent. The whole
 * file is checked whichever family matches: an unknown base, a cycle of
 * bases, params that are not numbers or not known are format errors.
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

/* The family parameters this version reads ("params"; a name not listed
 * here is refused, so that a misspelt one does not pass unnoticed):
 *   gemm_rows_large  CPU GEMM: A read in place (no packing pass) when M, N
 *                    and K are all at least this; 0 off (gemm.c, rows_large)
 *   dense_dx_rows    dense layer backward: dx = dz W by clg_gemm_rows for
 *                    batches of at most this many rows on CPU devices, by
 *                    the packed clg_gemm above; 0 off (layer_dense.c) */
static const char *const known_params[] = {"gemm_rows_large", "dense_dx_rows"};

static const clg_json *family_named(const clg_json *fams, const char *name)
{
    for (int i = 0; i < fams->n; i++) {
        const clg_json *n = clg_json_get(&fams->items[i], "name");
        if (fams->items[i].type == CLG_JSON_OBJ && n && n->type == CLG_JSON_STR && strcmp(n->str, name) == 0)
            return &fams->items[i];
    }
    return NULL;
}

/* Every family of the file, matching this device or not: a name; a "base"
 * that names another family of the file, its chain of bases ending (no
 * cycle); "params" an object of numbers with known names. */
static clg_status check_families(clg_err *err, const clg_json *fams)
{
    for (int i = 0; i < fams->n; i++) {
        const clg_json *fam = &fams->items[i];
        const clg_json *name = clg_json_get(fam, "name");
        if (fam->type != CLG_JSON_OBJ || !name || name->type != CLG_JSON_STR || !name->str[0])
            return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: family %d is not an object with a \"name\"",
                               i + 1);
        const char *nm = name->str;
        const clg_json *base = clg_json_get(fam, "base");
        for (int depth = 0; base; depth++) {
            if (base->type != CLG_JSON_STR)
                return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: %s: \"base\" is not a family name", nm);
            const clg_json *b = family_named(fams, base->str);
            if (!b)
                return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: %s: base '%s' is not a family of the file",
                                   nm, base->str);
            if (b == fam || depth >= fams->n)
                return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: %s: its bases form a cycle (through '%s')",
                                   nm, base->str);
            base = clg_json_get(b, "base");
        }
        const clg_json *params = clg_json_get(fam, "params");
        if (params && params->type != CLG_JSON_OBJ)
            return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: %s: \"params\" is not an object", nm);
        if (params && params->n > CLG_TUNE_FAMILY_MAXP)
            return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: %s: more than %d params", nm,
                               CLG_TUNE_FAMILY_MAXP);
        for (int j = 0; params && j < params->n; j++) {
            int known = 0;
            for (size_t k = 0; k < sizeof known_params / sizeof known_params[0]; k++)
                known |= strcmp(params->keys[j], known_params[k]) == 0;
            if (!known)
                return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: %s: unknown parameter '%s' in \"params\"",
                                   nm, params->keys[j]);
            if (params->items[j].type != CLG_JSON_NUM)
                return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: %s: parameter '%s' is not a number", nm,
                                   params->keys[j]);
        }
    }
    return CLG_OK;
}

static void put_param(clg_tune_family *f, const char *name, double v)
{
    for (int i = 0; i < f->nparams; i++)
        if (strcmp(f->pnames[i], name) == 0) {
            f->pvals[i] = v;
            return;
        }
    if (f->nparams < CLG_TUNE_FAMILY_MAXP) { /* known names only (check_families): fewer than the cap */
        snprintf(f->pnames[f->nparams], sizeof f->pnames[0], "%s", name);
        f->pvals[f->nparams++] = v;
    }
}

/* The entries and params of one family object into f, its base's first
 * (recursively; check_families has ruled out cycles and unknown bases), its
 * own replacing them by key. Numeric members; "backend" kept. */
static clg_status read_family(clg_err *err, const clg_json *fams, const clg_json *fam, clg_tune_family *f)
{
    const clg_json *name = clg_json_get(fam, "name"), *base = clg_json_get(fam, "base");
    const clg_json *entries = clg_json_get(fam, "entries"), *params = clg_json_get(fam, "params");
    if (base)
        CLG_TRY(read_family(err, fams, family_named(fams, base->str), f));
    else if (!entries)
        return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: %s has neither \"entries\" nor a \"base\"",
                           name->str);
    if (entries && entries->type != CLG_JSON_OBJ)
        return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: %s: \"entries\" is not an object", name->str);
    for (int i = 0; entries && i < entries->n; i++) {
        const clg_json *v = &entries->items[i];
        if (v->type != CLG_JSON_OBJ)
            return clg_err_set(err, CLG_ERR_FORMAT, "tuning families: %s: entry '%s' is not an object", name->str,
                               entries->keys[i]);
        clg_tune_entry e;
        memset(&e, 0, sizeof e);
        snprintf(e.key, sizeof e.key, "%s", entries->keys[i]);
        for (int j = 0; j < v->n; j++)
            if (v->items[j].type == CLG_JSON_NUM)
                clg_tune_set(&e, v->keys[j], v->items[j].num);
            else if (v->items[j].type == CLG_JSON_STR && strcmp(v->keys[j], "backend") == 0)
                snprintf(e.backend, sizeof e.backend, "%s", v->items[j].str);
        int at = f->d.n;
        for (int k = 0; k < f->d.n && at == f->d.n; k++)
            if (strcmp(f->d.e[k].key, e.key) == 0)
                at = k; /* the base's entry of this key: replaced in its place */
        if (at == f->d.n && f->d.n == f->d.cap) {
            int cap = f->d.cap ? f->d.cap * 2 : 16;
            clg_tune_entry *ne = realloc(f->d.e, sizeof *ne * (size_t)cap);
            if (!ne)
                return clg_err_set(err, CLG_ERR_HOST_OOM, "tuning families: out of memory");
            f->d.e = ne;
            f->d.cap = cap;
        }
        f->d.e[at] = e;
        if (at == f->d.n)
            f->d.n++;
    }
    for (int i = 0; params && i < params->n; i++)
        put_param(f, params->keys[i], params->items[i].num);
    return CLG_OK;
}

clg_status clg_tune_family_match(clg_err *err, const char *text, clg_device *dev, clg_tune_family *f, int *index)
{
    *index = -1;
    f->name[0] = 0;
    f->measured = 0;
    f->nparams = 0;
    clg_tune_dev_clear(&f->d);
    clg_json *j = NULL;
    CLG_TRY(clg_json_parse(err, text, strlen(text), "tuning families", &j));
    const clg_json *fmt = clg_json_get(j, "format"), *fams = clg_json_get(j, "families");
    clg_status st = CLG_OK;
    if (!fmt || fmt->type != CLG_JSON_STR || strcmp(fmt->str, "clgrad-tune-families") != 0 || !fams ||
        fams->type != CLG_JSON_ARR)
        st = clg_err_set(err, CLG_ERR_FORMAT, "not a clgrad tuning families file");
    else
        st = check_families(err, fams);
    for (int i = 0; st == CLG_OK && i < fams->n; i++) {
        const clg_json *fam = &fams->items[i];
        if (!family_matches(clg_json_get(fam, "match"), dev))
            continue;
        st = read_family(err, fams, fam, f);
        if (st == CLG_OK) {
            const clg_json *status = clg_json_get(fam, "status");
            snprintf(f->name, sizeof f->name, "%s", clg_json_get(fam, "name")->str);
            f->measured = status && status->type == CLG_JSON_STR && strcmp(status->str, "measured") == 0;
            *index = i;
        }
        break;
    }
    if (st != CLG_OK) {
        clg_tune_dev_clear(&f->d);
        f->name[0] = 0;
        f->nparams = 0;
    }
    clg_json_free(j);
    return st;
}

double clg_tune_family_pget(const clg_tune_family *f, const char *name, double def)
{
    for (int i = 0; f && i < f->nparams; i++)
        if (strcmp(f->pnames[i], name) == 0)
            return f->pvals[i];
    return def;
}

double clg_tune_family_param(clg_device *dev, const char *name, double def)
{
    return clg_tune_family_pget(clg_tune_family_get(dev), name, def);
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
