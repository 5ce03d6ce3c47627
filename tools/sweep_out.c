/* clgrad sweep's files and reports (sweep.h). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sweep.h"

double sweep_metric(const sweep_run *r, const sweep_row *row)
{
    return strcmp(r->metric, "val_loss") == 0 ? row->val_loss : row->val_acc;
}

double sweep_score(const sweep_run *r, const sweep_row *row)
{
    double m = sweep_metric(r, row);
    return r->maximize ? m : -m;
}

int sweep_row_add(sweep_run *r, const sweep_row *row)
{
    if (r->nrows == r->caprows) {
        int cap = r->caprows ? 2 * r->caprows : 64;
        sweep_row *p = realloc(r->rows, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        r->rows = p;
        r->caprows = cap;
    }
    r->rows[r->nrows++] = *row;
    return 0;
}

// ---- model text ----

/* One line of a model file: a section header, a key or neither. */
typedef struct cfg_line {
    const char *start;
    size_t len;
    int section; /* index of the section it belongs to (-1: before any) */
    int header;  /* 1: "[type]" */
    char key[64], value[128];
} cfg_line;

typedef struct cfg_lines {
    cfg_line *l;
    int n, nsec;
} cfg_lines;

/* Splits text into lines and reads each one's header or key = value. */
static int cfg_split(const char *text, cfg_lines *out)
{
    int cap = 1;
    for (const char *s = text; *s; s++)
        cap += *s == '\n';
    out->l = calloc((size_t)cap, sizeof *out->l);
    out->n = out->nsec = 0;
    if (!out->l)
        return -1;
    for (const char *s = text; *s;) {
        const char *e = strchr(s, '\n');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        cfg_line *c = &out->l[out->n++];
        c->start = s;
        c->len = len;
        size_t body = strcspn(s, "#;\n");
        body = body < len ? body : len;
        while (body && isspace((unsigned char)s[body - 1]))
            body--;
        size_t lead = 0;
        while (lead < body && isspace((unsigned char)s[lead]))
            lead++;
        const char *b = s + lead;
        size_t bl = body - lead;
        if (bl >= 2 && b[0] == '[' && b[bl - 1] == ']') {
            c->header = 1;
            out->nsec++;
            snprintf(c->key, sizeof c->key, "%.*s", (int)(bl - 2), b + 1);
        } else if (bl && memchr(b, '=', bl)) {
            size_t k = (size_t)((const char *)memchr(b, '=', bl) - b), v = k + 1;
            size_t kl = k;
            while (kl && isspace((unsigned char)b[kl - 1]))
                kl--;
            while (v < bl && isspace((unsigned char)b[v]))
                v++;
            snprintf(c->key, sizeof c->key, "%.*s", (int)kl, b);
            snprintf(c->value, sizeof c->value, "%.*s", (int)(bl - v), b + v);
        }
        c->section = out->nsec - 1;
        s += len + (e != NULL);
    }
    return 0;
}

/* The section a parameter sets: [net], or the one with `name = LAYER` (-1: none). */
static int param_section(const cfg_lines *c, const sw_param *p)
{
    for (int i = 0; i < c->n; i++) {
        const cfg_line *l = &c->l[i];
        if (strcmp(p->section, "net") == 0 ? l->header && strcmp(l->key, "net") == 0
                                           : !l->header && strcmp(l->key, "name") == 0 &&
                                                 strcmp(l->value, p->section) == 0)
            return l->section;
    }
    return -1;
}

int sweep_check_layers(const char *text, const sw_space *sp, char *why, size_t cap)
{
    cfg_lines c;
    if (cfg_split(text, &c))
        return snprintf(why, cap, "out of memory"), -1;
    int rc = 0;
    for (int i = 0; i < sp->n && rc == 0; i++)
        if (param_section(&c, &sp->p[i]) < 0) {
            snprintf(why, cap, "parameter '%s': the model has no %s", sp->p[i].name,
                     strcmp(sp->p[i].section, "net") == 0 ? "[net] section" : "layer of that name");
            rc = -1;
        }
    free(c.l);
    return rc;
}

char *sweep_model_text(const char *text, const sw_space *sp, const sw_trial *t, int trial)
{
    cfg_lines c;
    if (cfg_split(text, &c))
        return NULL;
    int at[SW_MAX_PARAMS], replace[SW_MAX_PARAMS]; /* the line to replace, or the header to add after */
    size_t need = strlen(text) + 256;
    for (int i = 0; i < sp->n; i++) {
        int sec = param_section(&c, &sp->p[i]);
        at[i] = -1;
        replace[i] = 0;
        for (int k = 0; k < c.n && sec >= 0; k++) {
            if (c.l[k].section != sec)
                continue;
            if (c.l[k].header && at[i] < 0)
                at[i] = k;
            if (!c.l[k].header && strcmp(c.l[k].key, sp->p[i].key) == 0) {
                at[i] = k;
                replace[i] = 1;
            }
        }
        need += strlen(sp->p[i].name) + strlen(sp->p[i].key) + 2 * SW_VAL_LEN + 16;
    }
    char *out = malloc(need), *o = out;
    if (!out) {
        free(c.l);
        return NULL;
    }
    o += sprintf(o, "# clgrad sweep trial %d:", trial);
    for (int i = 0; i < sp->n; i++)
        o += sprintf(o, " %s=%s", sp->p[i].name, t->val[i]);
    o += sprintf(o, "\n");
    for (int k = 0; k < c.n; k++) {
        int replaced = 0;
        for (int i = 0; i < sp->n; i++)
            if (at[i] == k && replace[i]) {
                o += sprintf(o, "%s = %s\n", sp->p[i].key, t->val[i]);
                replaced = 1;
            }
        if (!replaced)
            o += sprintf(o, "%.*s\n", (int)c.l[k].len, c.l[k].start);
        for (int i = 0; i < sp->n; i++)
            if (at[i] == k && !replace[i])
                o += sprintf(o, "%s = %s\n", sp->p[i].key, t->val[i]);
    }
    free(c.l);
    return out;
}

// ---- results.csv ----

static const char *const row_cols =
    "trial,rung,epochs,state,val_loss,val_acc,train_loss,train_acc,start,end,seconds,step,devices";

int sweep_results_write(const sweep_run *r)
{
    size_t cap = 512 + (size_t)r->nrows * (400 + (size_t)r->space->n * (SW_VAL_LEN + 1)), len = 0;
    char *b = malloc(cap), path[4200];
    if (!b)
        return cli_fail("sweep: out of memory for the results table"), -1;
    len += (size_t)snprintf(b + len, cap - len, "%s", row_cols);
    for (int i = 0; i < r->space->n; i++)
        len += (size_t)snprintf(b + len, cap - len, ",%s", r->space->p[i].name);
    len += (size_t)snprintf(b + len, cap - len, ",note\n");
    for (int k = 0; k < r->nrows; k++) {
        const sweep_row *w = &r->rows[k];
        len += (size_t)snprintf(b + len, cap - len, "%d,%d,%d,%s,%.9g,%.9g,%.9g,%.9g,%.3f,%.3f,%.3f,%lld,%s",
                                w->trial, w->rung, w->epochs, w->failed ? "failed" : "ok", w->val_loss, w->val_acc,
                                w->train_loss, w->train_acc, w->start, w->end, w->end - w->start, w->step,
                                w->devices);
        for (int i = 0; i < r->space->n; i++)
            len += (size_t)snprintf(b + len, cap - len, ",%s", r->sched->t[w->trial].val[i]);
        len += (size_t)snprintf(b + len, cap - len, ",%s\n", w->note);
    }
    snprintf(path, sizeof path, "%s/results.csv", r->dir);
    int rc = clg_write_file_atomic(path, b, len) == CLG_OK ? 0 : -1;
    if (rc)
        cli_fail("sweep: %s", clg_last_error(NULL));
    free(b);
    return rc;
}

/* Splits a line at commas in place (at most max fields); returns the count. */
static int split_fields(char *line, char **f, int max)
{
    int n = 0;
    for (char *s = line; n < max;) {
        f[n++] = s;
        char *c = strchr(s, ',');
        if (!c)
            break;
        *c = 0;
        s = c + 1;
    }
    return n;
}

/* One line of results.csv into row; -1 with why when malformed. */
static int parse_row(const sweep_run *r, char *line, int lineno, sweep_row *w, char *why, size_t cap)
{
    char *f[13 + SW_MAX_PARAMS + 1];
    int want = 13 + r->space->n + 1;
    memset(w, 0, sizeof *w);
    if (split_fields(line, f, want) != want)
        return snprintf(why, cap, "results.csv:%d: expected %d fields", lineno, want), -1;
    char *end;
    w->trial = (int)strtol(f[0], &end, 10);
    w->rung = (int)strtol(f[1], NULL, 10);
    w->epochs = (int)strtol(f[2], NULL, 10);
    if (*end || w->trial < 0 || w->trial >= r->sched->ntrials || w->rung < 0 || w->rung >= r->sched->nrungs ||
        w->epochs != r->sched->epochs[w->rung])
        return snprintf(why, cap, "results.csv:%d: trial %s rung %s (%s epochs) is not one of this search's jobs",
                        lineno, f[0], f[1], f[2]), -1;
    w->failed = strcmp(f[3], "failed") == 0;
    double *d[] = {&w->val_loss, &w->val_acc, &w->train_loss, &w->train_acc, &w->start, &w->end};
    for (int i = 0; i < 6; i++)
        *d[i] = strtod(f[4 + i], NULL);
    w->step = strtoll(f[11], NULL, 10);
    snprintf(w->devices, sizeof w->devices, "%s", f[12]);
    for (int i = 0; i < r->space->n; i++)
        if (strcmp(f[13 + i], r->sched->t[w->trial].val[i]) != 0)
            return snprintf(why, cap,
                            "results.csv:%d: trial %d has %s=%s, this search gives it %s (another search space "
                            "or seed?)",
                            lineno, w->trial, r->space->p[i].name, f[13 + i], r->sched->t[w->trial].val[i]), -1;
    snprintf(w->note, sizeof w->note, "%s", f[13 + r->space->n]);
    w->note[strcspn(w->note, "\r\n")] = 0;
    return 0;
}

int sweep_results_read(sweep_run *r, char *why, size_t cap)
{
    char path[4200], line[4096];
    snprintf(path, sizeof path, "%s/results.csv", r->dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0; /* killed before the first result */
    int rc = 0, lineno = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        if (++lineno == 1)
            continue; /* the header */
        sweep_row w;
        rc = parse_row(r, line, lineno, &w, why, cap);
        if (rc == 0 && sweep_row_add(r, &w)) {
            snprintf(why, cap, "out of memory");
            rc = -1;
        }
    }
    fclose(f);
    return rc;
}

// ---- the end: ranking, best.cfg, plot ----

/* The row of trial's highest completed rung (NULL: none). */
static const sweep_row *final_row(const sweep_run *r, int trial)
{
    const sweep_row *best = NULL;
    for (int k = 0; k < r->nrows; k++) {
        const sweep_row *w = &r->rows[k];
        if (w->trial == trial && (!best || w->rung > best->rung || (w->rung == best->rung && w->failed < best->failed)))
            best = w;
    }
    return best;
}

static const char *state_name(sw_state s)
{
    static const char *const names[] = {"pending", "running", "paused", "stopped", "done", "failed"};
    return names[s];
}

static void print_table(const sweep_run *r, const int *order, double seconds)
{
    printf("%-5s %-6s %-8s %-7s %-10s %s\n", "rank", "trial", "state", "epochs", r->metric, "parameters");
    for (int k = 0; k < r->sched->ntrials; k++) {
        int i = order[k];
        const sw_trial *t = &r->sched->t[i];
        const sweep_row *w = final_row(r, i);
        char m[32] = "-";
        if (w && !w->failed)
            snprintf(m, sizeof m, "%.4f", sweep_metric(r, w));
        printf("%-5d %-6d %-8s %-7d %-10s", k + 1, i, state_name(t->state), w ? w->epochs : 0, m);
        for (int p = 0; p < r->space->n; p++)
            printf(" %s=%s", r->space->p[p].name, t->val[p]);
        if (t->state == SW_FAILED && w)
            printf("  (%s)", w->note);
        printf("\n");
    }
    printf("%d trials in %.1f s; results %s/results.csv, best model %s/best.cfg, plot %s/sweep.svg\n",
           r->sched->ntrials, seconds, r->dir, r->dir, r->dir);
}

static void print_json(const sweep_run *r, const int *order, double seconds)
{
    printf("{\"metric\": \"%s\", \"seconds\": %.3f, \"dir\": ", r->metric, seconds);
    cli_json_str(r->dir);
    printf(", \"budget_epochs\": %ld, \"trials\": [", sw_budget_epochs(r->sched));
    for (int k = 0; k < r->sched->ntrials; k++) {
        int i = order[k];
        const sw_trial *t = &r->sched->t[i];
        const sweep_row *w = final_row(r, i);
        printf("%s\n  {\"rank\": %d, \"trial\": %d, \"state\": \"%s\", \"epochs\": %d, \"metric\": ", k ? "," : "",
               k + 1, i, state_name(t->state), w ? w->epochs : 0);
        if (w && !w->failed && isfinite(sweep_metric(r, w)))
            printf("%.9g", sweep_metric(r, w));
        else
            printf("null");
        printf(", \"params\": {");
        for (int p = 0; p < r->space->n; p++) {
            printf("%s", p ? ", " : "");
            cli_json_str(r->space->p[p].name);
            printf(": ");
            cli_json_str(t->val[p]);
        }
        printf("}");
        if (t->state == SW_FAILED && w) {
            printf(", \"failed_step\": %lld, \"why\": ", w->step);
            cli_json_str(w->note);
        }
        printf("}");
    }
    printf("\n]}\n");
}

/* best.cfg: the best trial's model text, atomically. */
static void write_best(const sweep_run *r, int best)
{
    const sweep_row *w = final_row(r, best);
    char *text = sweep_model_text(r->model_text, r->space, &r->sched->t[best], best);
    char path[4200];
    snprintf(path, sizeof path, "%s/best.cfg", r->dir);
    if (!text || !w) {
        free(text);
        return;
    }
    size_t n = strlen(text) + 256;
    char *out = malloc(n);
    if (out) {
        int len = snprintf(out, n, "# the best of clgrad sweep %s: %s %.6g after %d epochs\n%s", r->dir, r->metric,
                           sweep_metric(r, w), w->epochs, text);
        if (clg_write_file_atomic(path, out, (size_t)len) != CLG_OK)
            cli_fail("sweep: %s", clg_last_error(NULL));
    }
    free(out);
    free(text);
}

int sweep_finish(const sweep_run *r, int json, double seconds)
{
    int n = r->sched->ntrials, with = 0;
    int *order = malloc((size_t)n * sizeof *order);
    if (!order) {
        cli_fail("sweep: out of memory");
        return 0;
    }
    sw_ranking(r->sched, order);
    for (int i = 0; i < n; i++)
        with += r->sched->t[i].rung >= 0;
    if (with > 0 && r->sched->t[order[0]].state != SW_FAILED)
        write_best(r, order[0]);
    sweep_svg(r, order);
    if (json)
        print_json(r, order, seconds);
    else
        print_table(r, order, seconds);
    free(order);
    return with;
}
