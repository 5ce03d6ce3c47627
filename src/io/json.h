/* A compact JSON reader (RFC 8259): objects, arrays, strings with escapes
 * (\uXXXX incl. surrogate pairs, to UTF-8), numbers, true/false/null.
 * Builds a small tree; numbers keep their source text so 64-bit integers
 * are read exactly. Nesting is capped (CLG_JSON_MAX_DEPTH). */
#ifndef CLG_IO_JSON_H
#define CLG_IO_JSON_H

#include "core/core.h"

#define CLG_JSON_MAX_DEPTH 64

typedef enum clg_json_type {
    CLG_JSON_NULL = 0,
    CLG_JSON_BOOL,
    CLG_JSON_NUM,
    CLG_JSON_STR,
    CLG_JSON_ARR,
    CLG_JSON_OBJ,
} clg_json_type;

typedef struct clg_json {
    clg_json_type type;
    int boolean;            /* BOOL */
    double num;             /* NUM */
    char *str;              /* STR: decoded (NUL-terminated; len excludes it). NUM: source text */
    size_t len;
    struct clg_json *items; /* ARR elements / OBJ values */
    char **keys;            /* OBJ keys (decoded) */
    size_t *key_lens;
    int n;
    size_t offset;          /* byte offset of the value in the text */
} clg_json;

/* Parses text[0..len) as exactly one JSON value (surrounding whitespace
 * allowed). Errors say "<what>: JSON error at byte N: ...". */
CLG_INTERNAL clg_status clg_json_parse(clg_err *err, const char *text, size_t len, const char *what,
                                       clg_json **out);
CLG_INTERNAL void clg_json_free(clg_json *v);
/* Member of an object by key (first match); NULL if absent or v not an object. */
CLG_INTERNAL const clg_json *clg_json_get(const clg_json *v, const char *key);
/* Exact non-negative integer (no fraction/exponent/sign) that fits uint64: 1, else 0. */
CLG_INTERNAL int clg_json_u64(const clg_json *v, uint64_t *out);
CLG_INTERNAL const char *clg_json_type_name(clg_json_type t);

#endif
