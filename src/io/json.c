/* Compact recursive-descent JSON reader. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"

typedef struct jp {
    const char *s;
    size_t len, pos;
    const char *what;
    clg_err *err;
    int depth;
} jp;

static clg_status jerr(jp *p, const char *msg)
{
    return clg_err_set(p->err, CLG_ERR_FORMAT, "%s: JSON error at byte %zu: %s", p->what, p->pos, msg);
}

static void skip_ws(jp *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            p->pos++;
        else
            break;
    }
}

static void free_inner(clg_json *v)
{
    if (!v)
        return;
    free(v->str);
    if (v->items) {
        for (int i = 0; i < v->n; i++)
            free_inner(&v->items[i]);
        free(v->items);
    }
    if (v->keys) {
        for (int i = 0; i < v->n; i++)
            free(v->keys[i]);
        free(v->keys);
    }
    free(v->key_lens);
    memset(v, 0, sizeof *v);
}

void clg_json_free(clg_json *v)
{
    if (!v)
        return;
    free_inner(v);
    free(v);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int read_hex4(jp *p, unsigned *out)
{
    if (p->len - p->pos < 4)
        return 0;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->s[p->pos + (size_t)i]);
        if (h < 0)
            return 0;
        v = v * 16 + (unsigned)h;
    }
    p->pos += 4;
    *out = v;
    return 1;
}

static size_t put_utf8(char *d, unsigned cp)
{
    if (cp < 0x80) {
        d[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | (cp >> 6));
        d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12));
        d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18));
    d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* p->pos at the opening quote. Decoded output is never longer than input. */
static clg_status parse_string(jp *p, char **out, size_t *outlen)
{
    p->pos++; /* '"' */
    size_t start = p->pos;
    /* find the closing quote to size the buffer */
    size_t q = start;
    while (q < p->len && p->s[q] != '"') {
        if (p->s[q] == '\\')
            q++;
        q++;
    }
    if (q >= p->len)
        return jerr(p, "unterminated string");
    char *d = malloc(q - start + 1);
    if (!d)
        return clg_err_set(p->err, CLG_ERR_HOST_OOM, "%s: out of memory parsing JSON", p->what);
    size_t n = 0;
    while (p->s[p->pos] != '"') {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) {
            free(d);
            return jerr(p, "control character in string (must be escaped)");
        }
        if (c != '\\') {
            d[n++] = (char)c;
            p->pos++;
            continue;
        }
        p->pos++;
        char e = p->s[p->pos++];
        switch (e) {
        case '"': d[n++] = '"'; break;
        case '\\': d[n++] = '\\'; break;
        case '/': d[n++] = '/'; break;
        case 'b': d[n++] = '\b'; break;
        case 'f': d[n++] = '\f'; break;
        case 'n': d[n++] = '\n'; break;
        case 'r': d[n++] = '\r'; break;
        case 't': d[n++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (!read_hex4(p, &cp)) {
                free(d);
                return jerr(p, "bad \\u escape (expected 4 hex digits)");
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (p->len - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                    free(d);
                    return jerr(p, "unpaired UTF-16 surrogate in \\u escape");
                }
                p->pos += 2;
                if (!read_hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    free(d);
                    return jerr(p, "unpaired UTF-16 surrogate in \\u escape");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(d);
                return jerr(p, "unpaired UTF-16 surrogate in \\u escape");
            }
            /* \uXXXX is 6 input bytes, at most 3 output bytes; a pair is
             * 12 input bytes for 4 output bytes */
            n += put_utf8(d + n, cp);
            break;
        }
        default:
            p->pos--;
            free(d);
            return jerr(p, "unknown escape in string");
        }
    }
    p->pos++; /* closing quote */
    d[n] = 0;
    *out = d;
    *outlen = n;
    return CLG_OK;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static clg_status parse_number(jp *p, clg_json *v)
{
    size_t start = p->pos;
    if (p->pos < p->len && p->s[p->pos] == '-')
        p->pos++;
    if (p->pos >= p->len || !is_digit(p->s[p->pos]))
        return jerr(p, "invalid number");
    if (p->s[p->pos] == '0') {
        p->pos++;
    } else {
        while (p->pos < p->len && is_digit(p->s[p->pos]))
            p->pos++;
    }
    if (p->pos < p->len && p->s[p->pos] == '.') {
        p->pos++;
        if (p->pos >= p->len || !is_digit(p->s[p->pos]))
            return jerr(p, "invalid number (digit expected after '.')");
        while (p->pos < p->len && is_digit(p->s[p->pos]))
            p->pos++;
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
            p->pos++;
        if (p->pos >= p->len || !is_digit(p->s[p->pos]))
            return jerr(p, "invalid number (digit expected in exponent)");
        while (p->pos < p->len && is_digit(p->s[p->pos]))
            p->pos++;
    }
    size_t n = p->pos - start;
    v->str = malloc(n + 1);
    if (!v->str)
        return clg_err_set(p->err, CLG_ERR_HOST_OOM, "%s: out of memory parsing JSON", p->what);
    memcpy(v->str, p->s + start, n);
    v->str[n] = 0;
    v->len = n;
    v->num = strtod(v->str, NULL);
    v->type = CLG_JSON_NUM;
    return CLG_OK;
}

static clg_status parse_value(jp *p, clg_json *v);

static clg_status parse_array(jp *p, clg_json *v)
{
    p->pos++; /* '[' */
    v->type = CLG_JSON_ARR;
    int cap = 0;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
        return CLG_OK;
    }
    for (;;) {
        if (v->n == cap) {
            int nc = cap ? cap * 2 : 4;
            clg_json *ni = realloc(v->items, sizeof *ni * (size_t)nc);
            if (!ni)
                return clg_err_set(p->err, CLG_ERR_HOST_OOM, "%s: out of memory parsing JSON", p->what);
            v->items = ni;
            cap = nc;
        }
        memset(&v->items[v->n], 0, sizeof v->items[0]);
        v->n++;
        clg_status st = parse_value(p, &v->items[v->n - 1]);
        if (st != CLG_OK)
            return st;
        skip_ws(p);
        if (p->pos >= p->len)
            return jerr(p, "unterminated array");
        char c = p->s[p->pos++];
        if (c == ']')
            return CLG_OK;
        if (c != ',') {
            p->pos--;
            return jerr(p, "expected ',' or ']' in array");
        }
    }
}

static clg_status parse_object(jp *p, clg_json *v)
{
    p->pos++; /* '{' */
    v->type = CLG_JSON_OBJ;
    int cap = 0;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
        return CLG_OK;
    }
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != '"')
            return jerr(p, "expected a string key in object");
        if (v->n == cap) {
            int nc = cap ? cap * 2 : 4;
            clg_json *ni = realloc(v->items, sizeof *ni * (size_t)nc);
            if (ni)
                v->items = ni;
            char **nk = realloc(v->keys, sizeof *nk * (size_t)nc);
            if (nk)
                v->keys = nk;
            size_t *nl = realloc(v->key_lens, sizeof *nl * (size_t)nc);
            if (nl)
                v->key_lens = nl;
            if (!ni || !nk || !nl)
                return clg_err_set(p->err, CLG_ERR_HOST_OOM, "%s: out of memory parsing JSON", p->what);
            cap = nc;
        }
        char *key = NULL;
        size_t klen = 0;
        clg_status st = parse_string(p, &key, &klen);
        if (st != CLG_OK)
            return st;
        memset(&v->items[v->n], 0, sizeof v->items[0]);
        v->keys[v->n] = key;
        v->key_lens[v->n] = klen;
        v->n++;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':')
            return jerr(p, "expected ':' after object key");
        p->pos++;
        st = parse_value(p, &v->items[v->n - 1]);
        if (st != CLG_OK)
            return st;
        skip_ws(p);
        if (p->pos >= p->len)
            return jerr(p, "unterminated object");
        char c = p->s[p->pos++];
        if (c == '}')
            return CLG_OK;
        if (c != ',') {
            p->pos--;
            return jerr(p, "expected ',' or '}' in object");
        }
    }
}

static int match_lit(jp *p, const char *lit)
{
    size_t n = strlen(lit);
    if (p->len - p->pos >= n && memcmp(p->s + p->pos, lit, n) == 0) {
        p->pos += n;
        return 1;
    }
    return 0;
}

static clg_status parse_value(jp *p, clg_json *v)
{
    skip_ws(p);
    if (p->pos >= p->len)
        return jerr(p, "unexpected end of input (value expected)");
    v->offset = p->pos;
    char c = p->s[p->pos];
    clg_status st;
    switch (c) {
    case '{':
    case '[':
        if (++p->depth > CLG_JSON_MAX_DEPTH)
            return jerr(p, "nesting too deep");
        st = c == '{' ? parse_object(p, v) : parse_array(p, v);
        p->depth--;
        return st;
    case '"':
        v->type = CLG_JSON_STR;
        return parse_string(p, &v->str, &v->len);
    case 't':
        if (match_lit(p, "true")) {
            v->type = CLG_JSON_BOOL;
            v->boolean = 1;
            return CLG_OK;
        }
        break;
    case 'f':
        if (match_lit(p, "false")) {
            v->type = CLG_JSON_BOOL;
            return CLG_OK;
        }
        break;
    case 'n':
        if (match_lit(p, "null")) {
            v->type = CLG_JSON_NULL;
            return CLG_OK;
        }
        break;
    default:
        if (c == '-' || is_digit(c))
            return parse_number(p, v);
        break;
    }
    return jerr(p, "unexpected character (value expected)");
}

clg_status clg_json_parse(clg_err *err, const char *text, size_t len, const char *what, clg_json **out)
{
    *out = NULL;
    jp p = {text, len, 0, what ? what : "JSON", err, 0};
    clg_json *v = calloc(1, sizeof *v);
    if (!v)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    clg_status st = parse_value(&p, v);
    if (st == CLG_OK) {
        skip_ws(&p);
        if (p.pos != p.len)
            st = jerr(&p, "unexpected text after the JSON value");
    }
    if (st != CLG_OK) {
        clg_json_free(v);
        return st;
    }
    *out = v;
    return CLG_OK;
}

const clg_json *clg_json_get(const clg_json *v, const char *key)
{
    if (!v || v->type != CLG_JSON_OBJ)
        return NULL;
    size_t kl = strlen(key);
    for (int i = 0; i < v->n; i++)
        if (v->key_lens[i] == kl && memcmp(v->keys[i], key, kl) == 0)
            return &v->items[i];
    return NULL;
}

int clg_json_u64(const clg_json *v, uint64_t *out)
{
    if (!v || v->type != CLG_JSON_NUM || !v->str)
        return 0;
    uint64_t x = 0;
    for (size_t i = 0; i < v->len; i++) {
        char c = v->str[i];
        if (!is_digit(c))
            return 0;
        unsigned d = (unsigned)(c - '0');
        if (x > (UINT64_MAX - d) / 10)
            return 0;
        x = x * 10 + d;
    }
    *out = x;
    return 1;
}

const char *clg_json_type_name(clg_json_type t)
{
    switch (t) {
    case CLG_JSON_NULL: return "null";
    case CLG_JSON_BOOL: return "boolean";
    case CLG_JSON_NUM: return "number";
    case CLG_JSON_STR: return "string";
    case CLG_JSON_ARR: return "array";
    case CLG_JSON_OBJ: return "object";
    }
    return "?";
}
