/* The options table (options.h): parsing, defaults, the environment (the
 * only getenv calls of the library) and the public clg_options calls. */
#include "core/options.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const clg_opt_desc g_desc[CLG_OPT_COUNT] = {
#define CLG_X_DESC(name, env, type, def, lo, hi, choices, kind, doc) \
    {#name, env, CLG_OPT_##type, def, lo, hi, choices, CLG_OPT_##kind, doc},
    CLG_OPTIONS(CLG_X_DESC)
#undef CLG_X_DESC
};

/* Where each option's field lives in clg_opts. */
static const size_t g_off[CLG_OPT_COUNT] = {
#define CLG_X_OFF(name, env, type, def, lo, hi, choices, kind, doc) offsetof(clg_opts, name),
    CLG_OPTIONS(CLG_X_OFF)
#undef CLG_X_OFF
};

const clg_opt_desc *clg_opt_desc_of(int id) { return id >= 0 && id < CLG_OPT_COUNT ? &g_desc[id] : NULL; }

int clg_opt_find(const char *name)
{
    for (int i = 0; name && i < CLG_OPT_COUNT; i++)
        if (strcmp(g_desc[i].name, name) == 0)
            return i;
    return -1;
}

const char *clg_opt_type_name(clg_opt_type t)
{
    static const char *const n[] = {"bool", "int", "real", "string", "choice"};
    return (unsigned)t < CLG_ARRAY_LEN(n) ? n[t] : "?";
}

const char *clg_opt_kind_name(clg_opt_kind k)
{
    static const char *const n[] = {"user", "tuning", "test"};
    return (unsigned)k < CLG_ARRAY_LEN(n) ? n[k] : "?";
}

// ---- parsing ----

/* Index of value among the comma-separated choices, or -1. */
static int choice_index(const char *choices, const char *value)
{
    size_t vl = strlen(value);
    int i = 0;
    for (const char *c = choices; *c; i++) {
        const char *e = strchr(c, ',');
        size_t l = e ? (size_t)(e - c) : strlen(c);
        if (l == vl && strncmp(c, value, l) == 0)
            return i;
        if (!e)
            break;
        c = e + 1;
    }
    return -1;
}

/* What option d accepts, as text for messages and clg_option_info.accepts:
 * "auto, own, clblast, ref", "0 or 1", "1..4", "0..1e+06" or "text". */
static void accepts_text(const clg_opt_desc *d, char *buf, size_t n)
{
    switch (d->type) {
    case CLG_OPT_CHOICE: {
        size_t j = 0;
        for (const char *c = d->choices; *c && j + 3 < n; c++) {
            if (*c == ',') {
                buf[j++] = ',';
                buf[j++] = ' ';
            } else {
                buf[j++] = *c;
            }
        }
        buf[j] = 0;
        break;
    }
    case CLG_OPT_BOOL:
        snprintf(buf, n, "0 or 1");
        break;
    case CLG_OPT_INT:
        snprintf(buf, n, "%.0f..%.0f", d->lo, d->hi);
        break;
    case CLG_OPT_DOUBLE:
        snprintf(buf, n, "%g..%g", d->lo, d->hi);
        break;
    default:
        snprintf(buf, n, "text");
    }
}

static int parse_bool(const char *v)
{
    static const char *const no[] = {"0", "no", "off", "false"}, *const yes[] = {"1", "yes", "on", "true"};
    for (size_t i = 0; i < CLG_ARRAY_LEN(no); i++) {
        if (strcasecmp(v, no[i]) == 0)
            return 0;
        if (strcasecmp(v, yes[i]) == 0)
            return 1;
    }
    return -1;
}

static clg_status refuse(clg_err *err, const clg_opt_desc *d, const char *value, const char *why)
{
    return clg_err_set(err, CLG_ERR_INVALID_ARG, "option %s: '%s' %s", d->name, value, why);
}

clg_status clg_opts_set_id(clg_opts *o, int id, const char *value, clg_option_source src, clg_err *err)
{
    const clg_opt_desc *d = clg_opt_desc_of(id);
    if (!o || !d)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "option: no options or no option %d", id);
    if (!value)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "option %s: no value", d->name);
    char *field = (char *)o + g_off[id];
    char why[256];
    switch (d->type) {
    case CLG_OPT_BOOL: {
        int b = parse_bool(value);
        if (b < 0)
            return refuse(err, d, value, "is not a boolean (0 or 1, no or yes, off or on, false or true)");
        *(long *)(void *)field = b;
        break;
    }
    case CLG_OPT_INT: {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (!*value || *end || errno)
            return refuse(err, d, value, "is not an integer");
        if ((double)v < d->lo || (double)v > d->hi) {
            char range[64];
            accepts_text(d, range, sizeof range);
            snprintf(why, sizeof why, "is out of range %s", range);
            return refuse(err, d, value, why);
        }
        *(long *)(void *)field = (long)v;
        break;
    }
    case CLG_OPT_DOUBLE: {
        char *end = NULL;
        errno = 0;
        double v = strtod(value, &end);
        if (!*value || *end || errno || !isfinite(v))
            return refuse(err, d, value, "is not a number");
        if (v < d->lo || v > d->hi) {
            char range[64];
            accepts_text(d, range, sizeof range);
            snprintf(why, sizeof why, "is out of range %s", range);
            return refuse(err, d, value, why);
        }
        *(double *)(void *)field = v;
        break;
    }
    case CLG_OPT_STR:
        if (d->lo >= 1 && !*value)
            return refuse(err, d, value, "is empty (unset it for the default)");
        if (strlen(value) >= CLG_OPT_STR_MAX) {
            snprintf(why, sizeof why, "is longer than %d bytes", CLG_OPT_STR_MAX - 1);
            return refuse(err, d, value, why);
        }
        snprintf(field, CLG_OPT_STR_MAX, "%s", value);
        break;
    case CLG_OPT_CHOICE: {
        int i = choice_index(d->choices, value);
        if (i < 0) {
            char list[200];
            accepts_text(d, list, sizeof list);
            snprintf(why, sizeof why, "is not one of %s", list);
            return refuse(err, d, value, why);
        }
        *(long *)(void *)field = i;
        break;
    }
    }
    o->source[id] = (unsigned char)src;
    return CLG_OK;
}

clg_status clg_opts_set(clg_opts *o, const char *name, const char *value, clg_option_source src, clg_err *err)
{
    int id = clg_opt_find(name);
    if (id < 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "unknown option '%s' (clgrad options lists them)",
                           name ? name : "(null)");
    return clg_opts_set_id(o, id, value, src, err);
}

void clg_opts_init(clg_opts *o)
{
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    for (int i = 0; i < CLG_OPT_COUNT; i++)
        clg_opts_set_id(o, i, g_desc[i].def, CLG_OPTION_DEFAULT, NULL); /* the table's defaults parse (test_options) */
}

// ---- the environment ----

clg_status clg_opts_read_env_one(clg_opts *o, int i, clg_err *err)
{
    if (i < 0 || i >= CLG_OPT_COUNT || g_desc[i].kind == CLG_OPT_TEST || o->source[i] != CLG_OPTION_DEFAULT)
        return CLG_OK;
    const char *e = getenv(g_desc[i].env);
    if (!e || (!*e && !(g_desc[i].type == CLG_OPT_STR && g_desc[i].lo >= 1))) /* empty: unset, unless refused */
        return CLG_OK;
    clg_status st = clg_opts_set_id(o, i, e, CLG_OPTION_ENV, err);
    if (st != CLG_OK) {
        clg_err *eb = err ? err : clg_err_tls();
        char *detail = malloc(CLG_ERR_LEN);
        if (!detail)
            return st;
        snprintf(detail, CLG_ERR_LEN, "%s", eb->msg);
        clg_err_set(err, st, "environment variable %s: %s", g_desc[i].env, detail);
        free(detail);
    }
    return st;
}

clg_status clg_opts_read_env(clg_opts *o, clg_err *err)
{
    for (int i = 0; i < CLG_OPT_COUNT; i++) {
        clg_status st = clg_opts_read_env_one(o, i, err);
        if (st != CLG_OK)
            return st;
    }
    return CLG_OK;
}

void clg_opts_default_cache_dir(char *dst, size_t n)
{
    const char *e = getenv("XDG_CACHE_HOME");
    if (e && *e) {
        snprintf(dst, n, "%s/clgrad", e);
        return;
    }
    e = getenv("HOME");
    snprintf(dst, n, "%s/.cache/clgrad", e && *e ? e : "/tmp");
}

int clg_opts_mpi_launcher(int *size)
{
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");
    if (size)
        *size = n ? atoi(n) : 0;
    return n || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

// ---- text ----

void clg_opts_format(const clg_opts *o, int id, char *buf, size_t n)
{
    const clg_opt_desc *d = clg_opt_desc_of(id);
    if (!d || n == 0) {
        if (n)
            buf[0] = 0;
        return;
    }
    const char *field = (const char *)o + g_off[id];
    switch (d->type) {
    case CLG_OPT_BOOL:
    case CLG_OPT_INT:
        snprintf(buf, n, "%ld", *(const long *)(const void *)field);
        break;
    case CLG_OPT_DOUBLE:
        snprintf(buf, n, "%g", *(const double *)(const void *)field);
        break;
    case CLG_OPT_STR:
        snprintf(buf, n, "%s", field);
        break;
    case CLG_OPT_CHOICE: {
        long k = *(const long *)(const void *)field;
        const char *c = d->choices;
        for (long i = 0; i < k && c; i++)
            c = strchr(c, ',') ? strchr(c, ',') + 1 : NULL;
        size_t l = c ? (strchr(c, ',') ? (size_t)(strchr(c, ',') - c) : strlen(c)) : 0;
        snprintf(buf, n, "%.*s", (int)l, c ? c : "");
        break;
    }
    }
}

// ---- public API ----

clg_status clg_options_create(clg_options **out)
{
    if (!out)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_options_create: out is NULL");
    *out = malloc(sizeof **out);
    if (!*out)
        return clg_err_set(NULL, CLG_ERR_HOST_OOM, "out of memory");
    clg_opts_init(*out);
    return CLG_OK;
}

void clg_options_destroy(clg_options *o) { free(o); }

clg_status clg_options_set(clg_options *o, const char *name, const char *value)
{
    if (!o)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_options_set: options are NULL");
    return clg_opts_set(o, name, value, CLG_OPTION_SET, NULL);
}

clg_status clg_options_read_env(clg_options *o)
{
    if (!o)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_options_read_env: options are NULL");
    return clg_opts_read_env(o, NULL);
}

int clg_options_count(void) { return CLG_OPT_COUNT; }

clg_status clg_option_info_get_size(const clg_options *o, int index, clg_option_info *out, size_t size)
{
    if (!out)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_option_info_get: out is NULL");
    if (index < 0 || index >= CLG_OPT_COUNT)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "option index %d out of range 0..%d", index,
                           CLG_OPT_COUNT - 1);
    clg_opts defaults;
    if (!o) {
        clg_opts_init(&defaults);
        o = &defaults;
    }
    const clg_opt_desc *d = &g_desc[index];
    clg_option_info info;
    memset(&info, 0, sizeof info);
    info.size = sizeof info;
    info.name = d->name;
    info.env = d->kind == CLG_OPT_TEST ? "" : d->env;
    info.type = clg_opt_type_name(d->type);
    info.kind = clg_opt_kind_name(d->kind);
    info.default_value = d->def;
    info.choices = d->choices;
    info.min = d->type == CLG_OPT_INT || d->type == CLG_OPT_DOUBLE || d->type == CLG_OPT_BOOL ? d->lo : 0;
    info.max = d->type == CLG_OPT_INT || d->type == CLG_OPT_DOUBLE || d->type == CLG_OPT_BOOL ? d->hi : 0;
    info.doc = d->doc;
    clg_opts_format(o, index, info.value, sizeof info.value);
    accepts_text(d, info.accepts, sizeof info.accepts);
    info.source = (clg_option_source)o->source[index];
    info.size = size < sizeof info ? size : sizeof info;
    clg_sized_write(out, size, &info, sizeof info);
    return CLG_OK;
}
