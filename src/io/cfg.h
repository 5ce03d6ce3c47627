/* Model file syntax (INI-like, in the spirit of darknet's .cfg):
 *
 *   # comment
 *   [net]                 section header; one section per layer after [net]
 *   key = value           values are strings; typed accessors below
 *
 * The parser only knows syntax: sections, keys, values and their line
 * numbers. What a section means belongs to src/model. */
#ifndef CLG_IO_CFG_H
#define CLG_IO_CFG_H

#include "core/core.h"

typedef struct clg_cfg_kv {
    char *key;
    char *value;
    int line;
    int used; /* set by the accessors: unknown keys can be reported */
} clg_cfg_kv;

typedef struct clg_cfg_section {
    char *name; /* "net", "convolutional", ... (lower-case as written) */
    int line;
    clg_cfg_kv *kv;
    int nkv;
} clg_cfg_section;

typedef struct clg_cfg {
    char *source_name; /* file name or "<string>", for messages */
    clg_cfg_section *sec;
    int nsec;
} clg_cfg;

/* Parses text (NUL-terminated). Syntax errors name the line:
 * "model.cfg:12: expected 'key = value', got '...'". */
CLG_INTERNAL clg_status clg_cfg_parse(clg_err *err, const char *text, const char *source_name, clg_cfg **out);
CLG_INTERNAL clg_status clg_cfg_load(clg_err *err, const char *path, clg_cfg **out);
CLG_INTERNAL void clg_cfg_free(clg_cfg *cfg);

/* Typed accessors. A missing key yields the default (or an error when
 * required, i.e. def == NULL for strings). A malformed value or one outside
 * [lo, hi] is an error naming the file, line, key and the accepted range. */
CLG_INTERNAL const clg_cfg_kv *clg_cfg_find(const clg_cfg_section *s, const char *key);
CLG_INTERNAL clg_status clg_cfg_int(clg_err *err, const clg_cfg *cfg, clg_cfg_section *s, const char *key, long def,
                                    long lo, long hi, long *out);
CLG_INTERNAL clg_status clg_cfg_float(clg_err *err, const clg_cfg *cfg, clg_cfg_section *s, const char *key,
                                      double def, double lo, double hi, double *out);
/* def NULL: required. The returned string is borrowed from the section. */
CLG_INTERNAL clg_status clg_cfg_str(clg_err *err, const clg_cfg *cfg, clg_cfg_section *s, const char *key,
                                    const char *def, const char **out);
/* Value must be one of choices (NULL-terminated); *out gets its index. */
CLG_INTERNAL clg_status clg_cfg_enum(clg_err *err, const clg_cfg *cfg, clg_cfg_section *s, const char *key,
                                     const char *def, const char *const *choices, int *out);
/* Error for the first key of s no accessor asked for ("unknown key"). */
CLG_INTERNAL clg_status clg_cfg_check_unused(clg_err *err, const clg_cfg *cfg, const clg_cfg_section *s);

#endif
