/* Parsing and --help from the option tables (cli_opts.h). */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

const char *const cli_precisions[] = {"fp32", "fp16", NULL};
const char *const cli_gemm_backends[] = {"auto", "own", "clblast", NULL};
const char *const cli_pipe_schedules[] = {"1f1b", "gpipe", NULL};

// ---- values ----

static void print_indented(FILE *f, const char *text, int indent);

/* Plain decimal: an optional '-', digits (and for a number a fraction and
 * an exponent); no spaces, no '+', no hex, no inf or nan. */
static int plain_decimal(const char *v, int real)
{
    const char *s = v + (*v == '-');
    int digits = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        digits++;
    if (real && *s == '.')
        for (s++; *s >= '0' && *s <= '9'; s++)
            digits++;
    if (!digits)
        return 0;
    if (real && (*s == 'e' || *s == 'E')) {
        s++;
        s += *s == '-' || *s == '+';
        if (*s < '0' || *s > '9')
            return 0;
        while (*s >= '0' && *s <= '9')
            s++;
    }
    return *s == 0;
}

int cli_mem_limit(double mib)
{
    char v[64];
    if (!(mib > 0))
        return CLI_OK;
    snprintf(v, sizeof v, "%.17g", mib);
    return cli_option_set("--device-mem-limit", "device_mem_limit", v);
}

const char *cli_check_split(const char *value)
{
    static const char want[] = "auto, even, or weights per device separated by commas, each a plain decimal "
                               "number in [0, 1e6], the non-zero ones at most 1e6 apart in ratio";
    if (strcmp(value, "auto") == 0 || strcmp(value, "even") == 0)
        return NULL;
    double lo = 0, hi = 0, sum = 0;
    for (const char *p = value; *p;) {
        size_t n = strcspn(p, ",");
        char item[64];
        if (n == 0 || n >= sizeof item || *p == '-')
            return want;
        memcpy(item, p, n);
        item[n] = 0;
        if (!plain_decimal(item, 1))
            return want;
        double x = strtod(item, NULL);
        if (!isfinite(x) || x < 0 || x > 1e6)
            return want;
        sum += x;
        if (x > 0) {
            lo = lo > 0 && lo < x ? lo : x;
            hi = hi > x ? hi : x;
        }
        p += n + (p[n] == ',');
    }
    return sum > 0 && hi <= lo * 1e6 ? NULL : want;
}

static int bad_value(const cli_spec *sp, const cli_opt *o, const char *v)
{
    fprintf(stderr, "clgrad %s: option %s wants ", sp->name, o->name);
    switch (o->kind) {
    case CLI_INT:
        fprintf(stderr, "an integer in [%lld, %lld] (plain decimal)", o->ilo, o->ihi);
        break;
    case CLI_DOUBLE:
        if (o->hi == DBL_MAX) /* no upper bound */
            fprintf(stderr, "a finite number %s %g (plain decimal)", o->open & CLI_LO_OPEN ? ">" : ">=", o->lo);
        else
            fprintf(stderr, "a finite number in %c%g, %g%c (plain decimal)", o->open & CLI_LO_OPEN ? '(' : '[',
                    o->lo, o->hi, o->open & CLI_HI_OPEN ? ')' : ']');
        break;
    case CLI_CHOICE:
        fprintf(stderr, "one of");
        for (int k = 0; o->choices[k]; k++)
            fprintf(stderr, "%s %s", k ? "," : "", o->choices[k]);
        break;
    case CLI_LIST:
        if (o->check && o->check(v))
            fprintf(stderr, "%s", o->check(v));
        else
            fprintf(stderr, "a comma-separated list without empty items");
        break;
    default:
        fprintf(stderr, "a value");
    }
    fprintf(stderr, "; got '%s'\n  %s %s: ", v, o->name, o->arg);
    print_indented(stderr, o->help, 4);
    fprintf(stderr, "\n(see 'clgrad %s --help')\n", sp->name);
    return CLI_USAGE;
}

static int store_int(const cli_opt *o, const char *v, char *field)
{
    if (!plain_decimal(v, 0))
        return -1;
    errno = 0;
    long long x = strtoll(v, NULL, 10);
    if (errno || x < o->ilo || x > o->ihi)
        return -1;
    if (o->size == sizeof(int32_t)) {
        int32_t y = (int32_t)x;
        memcpy(field, &y, sizeof y);
    } else {
        int64_t y = x;
        memcpy(field, &y, sizeof y);
    }
    return 0;
}

static int store_double(const cli_opt *o, const char *v, char *field)
{
    if (!plain_decimal(v, 1))
        return -1;
    errno = 0;
    double x = strtod(v, NULL);
    if (errno || !isfinite(x) || x < o->lo || x > o->hi || ((o->open & CLI_LO_OPEN) && x == o->lo) ||
        ((o->open & CLI_HI_OPEN) && x == o->hi))
        return -1;
    memcpy(field, &x, sizeof x);
    return 0;
}

/* Checks v against o and stores it; CLI_OK or a usage error. */
static int store(const cli_spec *sp, const cli_opt *o, const char *v, void *opts)
{
    char *field = (char *)opts + o->off;
    int bad = 0;
    switch (o->kind) {
    case CLI_INT:
        bad = store_int(o, v, field);
        break;
    case CLI_DOUBLE:
        bad = store_double(o, v, field);
        break;
    case CLI_CHOICE:
        bad = -1;
        for (int k = 0; o->choices[k]; k++)
            if (strcmp(v, o->choices[k]) == 0)
                bad = 0;
        break;
    case CLI_LIST:
        bad = !*v || v[0] == ',' || v[strlen(v) - 1] == ',' || strstr(v, ",,") || (o->check && o->check(v)) ? -1 : 0;
        break;
    default:
        break;
    }
    if (bad)
        return bad_value(sp, o, v);
    if (o->kind != CLI_INT && o->kind != CLI_DOUBLE)
        memcpy(field, &v, sizeof v);
    return CLI_OK;
}

// ---- parsing ----

/* The entry whose name or alias arg is (before any '='); NULL: none. */
static const cli_opt *find(const cli_opt *opts, const char *arg, const char **eq)
{
    const char *e = strchr(arg, '=');
    size_t n = e ? (size_t)(e - arg) : strlen(arg);
    for (const cli_opt *o = opts; o->name; o++) {
        const char *names[2] = {o->name, o->alias};
        for (int k = 0; k < 2; k++)
            if (names[k] && strlen(names[k]) == n && strncmp(arg, names[k], n) == 0) {
                *eq = e;
                return o;
            }
    }
    return NULL;
}

int cli_parse(const cli_spec *sp, int argc, char **argv, void *opts)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = NULL;
        if (cli_is_help(a)) {
            cli_help(stdout, sp);
            return CLI_HELP;
        }
        const cli_opt *o = a[0] == '-' && a[1] ? find(sp->opts, a, &eq) : NULL;
        if (!o) {
            if (a[0] == '-' && a[1])
                return cli_usage_error(sp->name, "unknown option '%s'", a);
            if (!sp->positional)
                return cli_usage_error(sp->name, "unexpected argument '%s'", a);
            int rc = sp->positional(sp->name, a, opts);
            if (rc != CLI_OK)
                return rc;
            continue;
        }
        if (o->kind == CLI_FLAG) {
            if (eq)
                return cli_usage_error(sp->name, "option %s takes no value", o->name);
            memcpy((char *)opts + o->off, &o->set, sizeof o->set);
            continue;
        }
        if (!eq && i + 1 >= argc)
            return cli_usage_error(sp->name, "option %s needs a value (%s)", o->name, o->arg);
        int rc = store(sp, o, eq ? eq + 1 : argv[++i], opts);
        if (rc != CLI_OK)
            return rc;
    }
    return CLI_OK;
}

int cli_model_positional(const char *cmd, const char *arg, void *opts)
{
    return cli_model_arg(cmd, arg, &((cli_common *)opts)->model);
}

// ---- help ----

/* text with every line after the first indented by indent columns */
static void print_indented(FILE *f, const char *text, int indent)
{
    for (const char *s = text; *s; s++) {
        fputc(*s, f);
        if (*s == '\n' && s[1])
            fprintf(f, "%*s", indent, "");
    }
}

void cli_help(FILE *f, const cli_spec *sp)
{
    fprintf(f, "usage: clgrad %s %s\n\n", sp->name, sp->synopsis);
    print_indented(f, sp->about, 0);
    fprintf(f, "\n\n");
    for (const cli_opt *o = sp->opts; o->name; o++) {
        char head[64];
        snprintf(head, sizeof head, "%s%s%s%s%s", o->alias ? o->alias : "", o->alias ? ", " : "", o->name,
                 o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(f, "  %-22s ", head);
        if (strlen(head) > 22)
            fprintf(f, "\n  %-22s ", "");
        print_indented(f, o->help, 25);
        if (o->kind == CLI_INT)
            fprintf(f, " [%lld..%lld]", o->ilo, o->ihi);
        fputc('\n', f);
    }
    fprintf(f, "  %-22s this help\n", "-h, --help");
    if (sp->notes) {
        fputc('\n', f);
        print_indented(f, sp->notes, 0);
        fputc('\n', f);
    }
    fprintf(f, "\nexit codes: 0 ok, 1 failure, 2 usage error\n");
}
