/* Model-file (INI-like) parser: syntax only; errors name source and line. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/cfg.h"

static char *dup_range(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

void clg_cfg_free(clg_cfg *cfg)
{
    if (!cfg)
        return;
    for (int i = 0; i < cfg->nsec; i++) {
        clg_cfg_section *s = &cfg->sec[i];
        for (int k = 0; k < s->nkv; k++) {
            free(s->kv[k].key);
            free(s->kv[k].value);
        }
        free(s->kv);
        free(s->name);
    }
    free(cfg->sec);
    free(cfg->source_name);
    free(cfg);
}

/* Shortens a line for quoting in a message. */
static void quote_line(char *dst, size_t cap, const char *s, size_t n)
{
    size_t m = n < cap - 4 ? n : cap - 4;
    size_t j = 0;
    for (size_t i = 0; i < m; i++)
        dst[j++] = (unsigned char)s[i] < 0x20 ? '?' : s[i];
    if (m < n) {
        dst[j++] = '.';
        dst[j++] = '.';
        dst[j++] = '.';
    }
    dst[j] = 0;
}

static int is_key_char(int ch) { return isalnum(ch) || ch == '_' || ch == '-' || ch == '.'; }

static clg_status add_section(clg_err *err, clg_cfg *cfg, const char *name, size_t n, int line)
{
    clg_cfg_section *ns = realloc(cfg->sec, sizeof *ns * (size_t)(cfg->nsec + 1));
    if (!ns)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "%s:%d: out of memory", cfg->source_name, line);
    cfg->sec = ns;
    clg_cfg_section *s = &cfg->sec[cfg->nsec];
    memset(s, 0, sizeof *s);
    s->name = dup_range(name, n);
    if (!s->name)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "%s:%d: out of memory", cfg->source_name, line);
    for (char *p = s->name; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    s->line = line;
    cfg->nsec++;
    return CLG_OK;
}

static clg_status add_kv(clg_err *err, clg_cfg *cfg, clg_cfg_section *s, const char *k, size_t kn, const char *v,
                         size_t vn, int line)
{
    for (int i = 0; i < s->nkv; i++)
        if (strlen(s->kv[i].key) == kn && memcmp(s->kv[i].key, k, kn) == 0)
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: duplicate key '%s' in [%s] (first set on line %d)",
                               cfg->source_name, line, s->kv[i].key, s->name, s->kv[i].line);
    clg_cfg_kv *nk = realloc(s->kv, sizeof *nk * (size_t)(s->nkv + 1));
    if (!nk)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "%s:%d: out of memory", cfg->source_name, line);
    s->kv = nk;
    clg_cfg_kv *kv = &s->kv[s->nkv];
    kv->key = dup_range(k, kn);
    kv->value = dup_range(v, vn);
    kv->line = line;
    kv->used = 0;
    if (!kv->key || !kv->value) {
        free(kv->key);
        free(kv->value);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "%s:%d: out of memory", cfg->source_name, line);
    }
    s->nkv++;
    return CLG_OK;
}

static clg_status parse_line(clg_err *err, clg_cfg *cfg, const char *b, size_t n, int line)
{
    char q[128];
    /* strip comment ('#' or ';' anywhere) and surrounding blanks */
    for (size_t i = 0; i < n; i++)
        if (b[i] == '#' || b[i] == ';') {
            n = i;
            break;
        }
    while (n > 0 && isspace((unsigned char)*b)) {
        b++;
        n--;
    }
    while (n > 0 && isspace((unsigned char)b[n - 1]))
        n--;
    if (n == 0)
        return CLG_OK;
    for (size_t i = 0; i < n; i++)
        if (b[i] == 0 || ((unsigned char)b[i] < 0x20 && b[i] != '\t')) {
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: control character (code %d) in line", cfg->source_name,
                               line, (unsigned char)b[i]);
        }
    if (b[0] == '[') {
        const char *close = memchr(b, ']', n);
        quote_line(q, sizeof q, b, n);
        if (!close)
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: section header without closing ']': '%s'",
                               cfg->source_name, line, q);
        if ((size_t)(close - b) != n - 1)
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: unexpected text after section header: '%s'",
                               cfg->source_name, line, q);
        const char *nm = b + 1;
        size_t nn = (size_t)(close - nm);
        while (nn > 0 && isspace((unsigned char)*nm)) {
            nm++;
            nn--;
        }
        while (nn > 0 && isspace((unsigned char)nm[nn - 1]))
            nn--;
        if (nn == 0)
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: empty section name '[]'", cfg->source_name, line);
        for (size_t i = 0; i < nn; i++)
            if (!is_key_char((unsigned char)nm[i]))
                return clg_err_set(err, CLG_ERR_FORMAT,
                                   "%s:%d: invalid character '%c' in section name '%s' (use letters, digits, '_', "
                                   "'-', '.')",
                                   cfg->source_name, line, nm[i], q);
        return add_section(err, cfg, nm, nn, line);
    }
    const char *eq = memchr(b, '=', n);
    quote_line(q, sizeof q, b, n);
    if (!eq)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: expected 'key = value', got '%s'", cfg->source_name, line,
                           q);
    size_t kn = (size_t)(eq - b);
    while (kn > 0 && isspace((unsigned char)b[kn - 1]))
        kn--;
    if (kn == 0)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: missing key before '=' in '%s'", cfg->source_name, line, q);
    for (size_t i = 0; i < kn; i++)
        if (!is_key_char((unsigned char)b[i]))
            return clg_err_set(err, CLG_ERR_FORMAT,
                               "%s:%d: invalid character '%c' in key of '%s' (use letters, digits, '_', '-', '.')",
                               cfg->source_name, line, b[i], q);
    const char *v = eq + 1;
    size_t vn = n - (size_t)(v - b);
    while (vn > 0 && isspace((unsigned char)*v)) {
        v++;
        vn--;
    }
    char kbuf[96];
    quote_line(kbuf, sizeof kbuf, b, kn);
    if (vn == 0)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: empty value for key '%s'", cfg->source_name, line, kbuf);
    if (cfg->nsec == 0)
        return clg_err_set(err, CLG_ERR_FORMAT,
                           "%s:%d: key '%s' appears before any section header (start with e.g. '[net]')",
                           cfg->source_name, line, kbuf);
    return add_kv(err, cfg, &cfg->sec[cfg->nsec - 1], b, kn, v, vn, line);
}

clg_status clg_cfg_parse(clg_err *err, const char *text, const char *source_name, clg_cfg **out)
{
    *out = NULL;
    if (!text)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "clg_cfg_parse: text is NULL");
    clg_cfg *cfg = calloc(1, sizeof *cfg);
    if (!cfg)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    const char *src = source_name ? source_name : "<string>";
    cfg->source_name = dup_range(src, strlen(src));
    if (!cfg->source_name) {
        free(cfg);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    const char *p = text;
    int line = 1;
    /* skip a UTF-8 byte order mark */
    if ((unsigned char)p[0] == 0xEF && (unsigned char)p[1] == 0xBB && (unsigned char)p[2] == 0xBF)
        p += 3;
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0 && p[n - 1] == '\r')
            n--;
        clg_status st = parse_line(err, cfg, p, n, line);
        if (st != CLG_OK) {
            clg_cfg_free(cfg);
            return st;
        }
        if (!e)
            break;
        p = e + 1;
        line++;
    }
    if (cfg->nsec == 0) {
        clg_status st = clg_err_set(err, CLG_ERR_FORMAT, "%s: no sections (expected e.g. '[net]')", cfg->source_name);
        clg_cfg_free(cfg);
        return st;
    }
    *out = cfg;
    return CLG_OK;
}

clg_status clg_cfg_load(clg_err *err, const char *path, clg_cfg **out)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    clg_status st = clg_file_read_text(err, path, &text, &len);
    if (st != CLG_OK)
        return st;
    st = clg_cfg_parse(err, text, path, out);
    free(text);
    return st;
}

const clg_cfg_kv *clg_cfg_find(const clg_cfg_section *s, const char *key)
{
    if (!s || !key)
        return NULL;
    for (int i = 0; i < s->nkv; i++)
        if (strcmp(s->kv[i].key, key) == 0)
            return &s->kv[i];
    return NULL;
}

static clg_cfg_kv *find_mut(clg_cfg_section *s, const char *key)
{
    for (int i = 0; i < s->nkv; i++)
        if (strcmp(s->kv[i].key, key) == 0)
            return &s->kv[i];
    return NULL;
}

static const char *srcname(const clg_cfg *cfg) { return cfg && cfg->source_name ? cfg->source_name : "<cfg>"; }

clg_status clg_cfg_int(clg_err *err, const clg_cfg *cfg, clg_cfg_section *s, const char *key, long def, long lo,
                       long hi, long *out)
{
    clg_cfg_kv *kv = find_mut(s, key);
    if (!kv) {
        *out = def;
        return CLG_OK;
    }
    kv->used = 1;
    const char *v = kv->value;
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end != 0 || errno == ERANGE || isspace((unsigned char)v[0]))
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [%s] key '%s': expected an integer in [%ld, %ld], got '%s'",
                           srcname(cfg), kv->line, s->name, key, lo, hi, v);
    if (x < lo || x > hi)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [%s] key '%s': %ld is outside the accepted range [%ld, %ld]",
                           srcname(cfg), kv->line, s->name, key, x, lo, hi);
    *out = x;
    return CLG_OK;
}

clg_status clg_cfg_float(clg_err *err, const clg_cfg *cfg, clg_cfg_section *s, const char *key, double def,
                         double lo, double hi, double *out)
{
    clg_cfg_kv *kv = find_mut(s, key);
    if (!kv) {
        *out = def;
        return CLG_OK;
    }
    kv->used = 1;
    const char *v = kv->value;
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end != 0 || errno == ERANGE || !isfinite(x) || isspace((unsigned char)v[0]))
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [%s] key '%s': expected a number in [%g, %g], got '%s'",
                           srcname(cfg), kv->line, s->name, key, lo, hi, v);
    if (x < lo || x > hi)
        return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [%s] key '%s': %g is outside the accepted range [%g, %g]",
                           srcname(cfg), kv->line, s->name, key, x, lo, hi);
    *out = x;
    return CLG_OK;
}

clg_status clg_cfg_str(clg_err *err, const clg_cfg *cfg, clg_cfg_section *s, const char *key, const char *def,
                       const char **out)
{
    clg_cfg_kv *kv = find_mut(s, key);
    if (!kv) {
        if (!def)
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [%s] is missing the required key '%s'", srcname(cfg),
                               s->line, s->name, key);
        *out = def;
        return CLG_OK;
    }
    kv->used = 1;
    *out = kv->value;
    return CLG_OK;
}

clg_status clg_cfg_enum(clg_err *err, const clg_cfg *cfg, clg_cfg_section *s, const char *key, const char *def,
                        const char *const *choices, int *out)
{
    const char *v = NULL;
    clg_status st = clg_cfg_str(err, cfg, s, key, def, &v);
    if (st != CLG_OK)
        return st;
    for (int i = 0; choices[i]; i++)
        if (strcmp(choices[i], v) == 0) {
            *out = i;
            return CLG_OK;
        }
    char list[512];
    size_t n = 0;
    list[0] = 0;
    for (int i = 0; choices[i] && n < sizeof list - 1; i++) {
        int w = snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", choices[i]);
        if (w < 0)
            break;
        n += (size_t)w;
        if (n >= sizeof list)
            n = sizeof list - 1;
    }
    const clg_cfg_kv *kv = clg_cfg_find(s, key);
    if (!kv) /* the default itself is not a choice: a caller bug */
        return clg_err_set(err, CLG_ERR_INTERNAL, "[%s] key '%s': default '%s' is not one of: %s", s->name, key, v,
                           list);
    return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: [%s] key '%s': '%s' is not one of: %s", srcname(cfg), kv->line,
                       s->name, key, v, list);
}

clg_status clg_cfg_check_unused(clg_err *err, const clg_cfg *cfg, const clg_cfg_section *s)
{
    for (int i = 0; i < s->nkv; i++)
        if (!s->kv[i].used)
            return clg_err_set(err, CLG_ERR_FORMAT, "%s:%d: unknown key '%s' in [%s]", srcname(cfg), s->kv[i].line,
                               s->kv[i].key, s->name);
    return CLG_OK;
}
