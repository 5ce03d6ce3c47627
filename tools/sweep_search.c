/* The search of `clgrad sweep` (sweep_search.h): space, configurations,
 * scheduler (grid, random, ASHA synchronous / asynchronous), ranking. */
#include "sweep_search.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- the search space ----

/* [net] keys a sweep may set (epochs: the sweep's own), and short names. */
static const char *const net_keys[] = {"batch",     "learning_rate", "momentum",     "nesterov",      "weight_decay",
                                       "optimizer", "beta1",         "beta2",        "epsilon",       "schedule",
                                       "step_size", "gamma",         "warmup",       "clip_norm",     "augment_flip",
                                       "augment_shift", NULL};
static const char *const aliases[][2] = {{"lr", "learning_rate"}, {"wd", "weight_decay"}, {"batch_size", "batch"}};

static int fail(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (why && cap)
        vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* A finite number spelled as a whole (no trailing text). */
static int parse_num(const char *s, double *out)
{
    if (!*s)
        return -1;
    char *end = NULL;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || *end || !isfinite(x))
        return -1;
    *out = x;
    return 0;
}

/* NAME into section and key: a [net] key or alias, or LAYER.KEY. */
static int parse_name(sw_param *p, const char *name, char *why, size_t cap)
{
    const char *dot = strchr(name, '.');
    if (dot) {
        size_t n = (size_t)(dot - name);
        if (n == 0 || n >= sizeof p->section || !dot[1] || strlen(dot + 1) >= sizeof p->key ||
            strchr(dot + 1, '.'))
            return fail(why, cap, "parameter '%s': expected LAYER.KEY such as drop1.p", name);
        memcpy(p->section, name, n);
        p->section[n] = 0;
        snprintf(p->key, sizeof p->key, "%s", dot + 1);
        if (strspn(p->key, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(p->key))
            return fail(why, cap, "parameter '%s': the key '%s' is not a model-file key", name, p->key);
        if (strcmp(p->key, "name") == 0 || strcmp(p->key, "type") == 0)
            return fail(why, cap, "parameter '%s': a layer's name cannot be searched", name);
        return 0;
    }
    const char *key = name;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(name, aliases[i][0]) == 0)
            key = aliases[i][1];
    for (int i = 0; net_keys[i]; i++)
        if (strcmp(key, net_keys[i]) == 0) {
            snprintf(p->section, sizeof p->section, "net");
            snprintf(p->key, sizeof p->key, "%s", key);
            return 0;
        }
    return fail(why, cap,
                "parameter '%s': unknown key (a [net] key: lr, batch, momentum, weight_decay, optimizer, schedule, "
                "warmup, clip_norm, beta1, beta2, epsilon, step_size, gamma, nesterov, augment_flip, augment_shift; "
                "or LAYER.KEY such as drop1.p)",
                name);
}

/* uniform:LO:HI or log:LO:HI. */
static int parse_range(sw_param *p, const char *spec, char *why, size_t cap)
{
    int is_log = strncmp(spec, "log:", 4) == 0;
    const char *a = spec + (is_log ? 4 : 8);
    const char *colon = strchr(a, ':');
    char lo[64];
    if (!colon || (size_t)(colon - a) >= sizeof lo)
        return fail(why, cap, "parameter '%s': expected %s:LO:HI, got '%s'", p->name, is_log ? "log" : "uniform",
                    spec);
    memcpy(lo, a, (size_t)(colon - a));
    lo[colon - a] = 0;
    if (parse_num(lo, &p->lo) || parse_num(colon + 1, &p->hi))
        return fail(why, cap, "parameter '%s': LO and HI of '%s' must be finite numbers", p->name, spec);
    if (!(p->lo < p->hi))
        return fail(why, cap, "parameter '%s': '%s' needs LO < HI", p->name, spec);
    if (is_log && !(p->lo > 0))
        return fail(why, cap, "parameter '%s': '%s' needs 0 < LO (a log range)", p->name, spec);
    p->kind = is_log ? SW_LOG : SW_UNIFORM;
    return 0;
}

/* a,b,c: no empty item, no blank, '=', '#', ';' or '[' (they would break the model file). */
static int parse_choices(sw_param *p, const char *spec, char *why, size_t cap)
{
    p->kind = SW_CHOICE;
    p->nchoices = 0;
    for (const char *s = spec;;) {
        size_t n = strcspn(s, ",");
        if (n == 0)
            return fail(why, cap, "parameter '%s': empty value in the list '%s'", p->name, spec);
        if (n >= SW_VAL_LEN)
            return fail(why, cap, "parameter '%s': value '%.*s' is too long", p->name, (int)n, s);
        if (p->nchoices == SW_MAX_CHOICES)
            return fail(why, cap, "parameter '%s': more than %d values", p->name, SW_MAX_CHOICES);
        for (size_t i = 0; i < n; i++)
            if (strchr(" \t\r\n=#;[]:", s[i]) || (unsigned char)s[i] < 32)
                return fail(why, cap, "parameter '%s': value '%.*s' holds a character a model file cannot take",
                            p->name, (int)n, s);
        memcpy(p->choices[p->nchoices], s, n);
        p->choices[p->nchoices][n] = 0;
        for (int k = 0; k < p->nchoices; k++)
            if (strcmp(p->choices[k], p->choices[p->nchoices]) == 0)
                return fail(why, cap, "parameter '%s': value '%s' listed twice", p->name, p->choices[k]);
        p->nchoices++;
        if (!s[n])
            return 0;
        s += n + 1;
    }
}

int sw_space_add(sw_space *s, const char *spec, char *why, size_t cap)
{
    const char *eq = strchr(spec, '=');
    if (!eq || eq == spec)
        return fail(why, cap, "--param '%s': expected NAME=VALUES (lr=log:1e-4:1e-1, batch=64,128)", spec);
    if (s->n == SW_MAX_PARAMS)
        return fail(why, cap, "--param '%s': at most %d parameters", spec, SW_MAX_PARAMS);
    sw_param *p = &s->p[s->n];
    memset(p, 0, sizeof *p);
    size_t n = (size_t)(eq - spec);
    if (n >= sizeof p->name)
        return fail(why, cap, "--param '%s': the name is too long", spec);
    memcpy(p->name, spec, n);
    p->name[n] = 0;
    if (parse_name(p, p->name, why, cap))
        return -1;
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->p[i].section, p->section) == 0 && strcmp(s->p[i].key, p->key) == 0)
            return fail(why, cap, "parameter '%s': given twice", p->name);
    const char *v = eq + 1;
    if (!*v)
        return fail(why, cap, "parameter '%s': empty list of values", p->name);
    int rc = strncmp(v, "log:", 4) == 0 || strncmp(v, "uniform:", 8) == 0 ? parse_range(p, v, why, cap)
                                                                         : parse_choices(p, v, why, cap);
    if (rc == 0)
        s->n++;
    return rc;
}

// ---- configurations ----

static void fmt_num(double x, char *out, size_t cap) { snprintf(out, cap, "%.6g", x); }

void sw_value_sample(const sw_param *p, double u, char *out, size_t cap)
{
    switch (p->kind) {
    case SW_CHOICE: {
        int k = (int)(u * p->nchoices);
        snprintf(out, cap, "%s", p->choices[k < p->nchoices ? k : p->nchoices - 1]);
        break;
    }
    case SW_UNIFORM:
        fmt_num(p->lo + u * (p->hi - p->lo), out, cap);
        break;
    case SW_LOG:
        fmt_num(exp(log(p->lo) + u * (log(p->hi) - log(p->lo))), out, cap);
        break;
    }
}

/* Point i of g of a parameter's grid. */
static void grid_value(const sw_param *p, int i, int g, char *out, size_t cap)
{
    if (p->kind == SW_CHOICE) {
        snprintf(out, cap, "%s", p->choices[i]);
        return;
    }
    double f = g > 1 ? (double)i / (g - 1) : 0.5;
    if (p->kind == SW_UNIFORM)
        fmt_num(p->lo + f * (p->hi - p->lo), out, cap);
    else
        fmt_num(exp(log(p->lo) + f * (log(p->hi) - log(p->lo))), out, cap);
}

static int grid_count(const sw_param *p, int g) { return p->kind == SW_CHOICE ? p->nchoices : g; }

long sw_grid_size(const sw_space *sp, int grid_points)
{
    long n = 1;
    for (int i = 0; i < sp->n; i++) {
        n *= grid_count(&sp->p[i], grid_points);
        if (n > SW_MAX_TRIALS)
            return 0;
    }
    return n;
}

/* splitmix64: the sample of (seed, trial, parameter) does not depend on the
 * order trials are drawn in, so a resumed sweep draws the same ones. */
static double unit(uint64_t seed, int trial, int param)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)trial * 0xBF58476D1CE4E5B9ull +
                 (uint64_t)param * 0x94D049BB133111EBull + 0x2545F4914F6CDD1Dull;
    for (int r = 0; r < 2; r++) {
        z += 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
    }
    return (double)(z >> 11) * 0x1.0p-53;
}

static int make_rungs(sw_sched *s, const sw_setup *u, char *why, size_t cap)
{
    if (u->max_epochs < 1 || (u->method == SW_ASHA && (u->min_epochs < 1 || u->min_epochs > u->max_epochs)))
        return fail(why, cap, "epochs: need 1 <= --min-epochs (%d) <= --max-epochs (%d)", u->min_epochs,
                    u->max_epochs);
    if (u->method != SW_ASHA) {
        s->nrungs = 1;
        s->epochs[0] = u->max_epochs;
        return 0;
    }
    if (u->reduction < 2)
        return fail(why, cap, "--reduction %d: must be at least 2", u->reduction);
    s->reduction = u->reduction;
    long e = u->min_epochs;
    s->nrungs = 0;
    while (e < u->max_epochs) {
        if (s->nrungs == SW_MAX_RUNGS - 1)
            return fail(why, cap, "more than %d rungs from %d to %d epochs: raise --reduction", SW_MAX_RUNGS,
                        u->min_epochs, u->max_epochs);
        s->epochs[s->nrungs++] = (int)e;
        e *= u->reduction;
    }
    s->epochs[s->nrungs++] = u->max_epochs;
    return 0;
}

int sw_sched_init(sw_sched *s, const sw_space *sp, const sw_setup *u, char *why, size_t cap)
{
    memset(s, 0, sizeof *s);
    s->method = u->method;
    s->async = u->async;
    if (make_rungs(s, u, why, cap))
        return -1;
    int g = u->grid_points > 0 ? u->grid_points : 3;
    long n = u->method == SW_GRID ? sw_grid_size(sp, g) : u->trials;
    if (n < 1 || n > SW_MAX_TRIALS)
        return fail(why, cap, "%s: %ld trials (1..%d)", u->method == SW_GRID ? "the grid" : "--trials", n,
                    SW_MAX_TRIALS);
    s->ntrials = (int)n;
    s->t = calloc((size_t)n, sizeof *s->t);
    if (!s->t)
        return fail(why, cap, "out of memory for %ld trials", n);
    for (int i = 0; i < s->ntrials; i++) {
        sw_trial *t = &s->t[i];
        t->state = SW_PENDING;
        t->rung = t->promoted = -1;
        for (int k = 0; k < SW_MAX_RUNGS; k++)
            t->score[k] = NAN;
        long rest = i;
        for (int j = sp->n - 1; j >= 0; j--) { /* grid: the first parameter varies slowest */
            if (u->method == SW_GRID) {
                int c = grid_count(&sp->p[j], g);
                grid_value(&sp->p[j], (int)(rest % c), g, t->val[j], SW_VAL_LEN);
                rest /= c;
            } else {
                sw_value_sample(&sp->p[j], unit(u->seed, i, j), t->val[j], SW_VAL_LEN);
            }
        }
    }
    return 0;
}

void sw_sched_free(sw_sched *s)
{
    free(s->t);
    s->t = NULL;
}

// ---- the scheduler ----

static sw_next_kind start(sw_sched *s, int trial, int rung, sw_job *job)
{
    sw_trial *t = &s->t[trial];
    t->state = SW_RUNNING;
    t->promoted = rung;
    s->running++;
    job->trial = trial;
    job->rung = rung;
    job->epochs = s->epochs[rung];
    return SW_JOB;
}

/* The first trial not started yet (-1: none). */
static int next_pending(sw_sched *s)
{
    while (s->cursor < s->ntrials && s->t[s->cursor].state != SW_PENDING)
        s->cursor++;
    return s->cursor < s->ntrials ? s->cursor : -1;
}

/* How many trials with a score at rung k beat trial i there (ties: the lower index wins). */
static int better_at(const sw_sched *s, int k, int i)
{
    int n = 0;
    double x = s->t[i].score[k];
    for (int j = 0; j < s->ntrials; j++) {
        double y = s->t[j].score[k];
        if (j != i && !isnan(y) && (y > x || (y == x && j < i)))
            n++;
    }
    return n;
}

/* Asynchronous: the best trial paused at rung k that is in the top
 * 1/reduction of the results at rung k so far (-1: none). */
static int promotable(const sw_sched *s, int k)
{
    int quota = s->n_at[k] / s->reduction, best = -1, best_rank = quota;
    for (int i = 0; i < s->ntrials; i++) {
        const sw_trial *t = &s->t[i];
        if (t->state != SW_PAUSED || t->rung != k)
            continue;
        int r = better_at(s, k, i);
        if (r < best_rank) {
            best_rank = r;
            best = i;
        }
    }
    return best;
}

/* Synchronous: once every trial of rung k has reported, its top
 * 1/reduction are queued for rung k + 1 and the rest stopped. */
static void decide_rung(sw_sched *s, int k)
{
    for (int i = 0; i < s->ntrials; i++) {
        const sw_trial *t = &s->t[i];
        if (t->state == SW_PENDING || ((t->state == SW_RUNNING || t->state == SW_PAUSED) && t->promoted == k))
            return; /* not started, running or queued at rung k */
    }
    s->decided[k] = 1;
    int quota = s->n_at[k] / s->reduction;
    for (int i = 0; i < s->ntrials; i++) {
        sw_trial *t = &s->t[i];
        if (t->state != SW_PAUSED || t->rung != k)
            continue;
        if (better_at(s, k, i) < quota)
            t->promoted = k + 1; /* queued */
        else
            t->state = SW_STOPPED;
    }
}

static sw_next_kind next_sync(sw_sched *s, sw_job *job)
{
    int p = next_pending(s);
    if (p >= 0)
        return start(s, p, 0, job);
    for (int k = 0; k < s->nrungs - 1; k++) {
        if (!s->decided[k])
            decide_rung(s, k);
        if (!s->decided[k])
            break;
    }
    for (int i = 0; i < s->ntrials; i++) {
        sw_trial *t = &s->t[i];
        if (t->state == SW_PAUSED && t->promoted == t->rung + 1)
            return start(s, i, t->promoted, job);
    }
    return s->running ? SW_WAIT : SW_END;
}

static sw_next_kind next_async(sw_sched *s, sw_job *job)
{
    for (int k = s->nrungs - 2; k >= 0; k--) {
        int i = promotable(s, k);
        if (i >= 0)
            return start(s, i, k + 1, job);
    }
    int p = next_pending(s);
    if (p >= 0)
        return start(s, p, 0, job);
    if (s->running)
        return SW_WAIT;
    for (int i = 0; i < s->ntrials; i++)
        if (s->t[i].state == SW_PAUSED)
            s->t[i].state = SW_STOPPED;
    return SW_END;
}

sw_next_kind sw_next(sw_sched *s, sw_job *job)
{
    if (s->method != SW_ASHA) {
        int p = next_pending(s);
        if (p >= 0)
            return start(s, p, 0, job);
        return s->running ? SW_WAIT : SW_END;
    }
    return s->async ? next_async(s, job) : next_sync(s, job);
}

static void record(sw_sched *s, int trial, int rung, double score, int failed)
{
    if (trial < 0 || trial >= s->ntrials || rung < 0 || rung >= s->nrungs)
        return;
    sw_trial *t = &s->t[trial];
    s->n_at[rung]++;
    t->promoted = -1;
    if (failed || isnan(score) || isinf(score)) {
        t->state = SW_FAILED;
        return;
    }
    t->score[rung] = score;
    t->rung = rung;
    t->state = rung == s->nrungs - 1 ? SW_DONE : SW_PAUSED;
}

void sw_report(sw_sched *s, int trial, int rung, double score, int failed)
{
    if (trial >= 0 && trial < s->ntrials && s->t[trial].state == SW_RUNNING)
        s->running--;
    record(s, trial, rung, score, failed);
}

void sw_replay(sw_sched *s, int trial, int rung, double score, int failed) { record(s, trial, rung, score, failed); }

// ---- results ----

typedef struct rank_key {
    int i, failed, rung;
    double score;
} rank_key;

static int rank_cmp(const void *a, const void *b)
{
    const rank_key *x = a, *y = b;
    if (x->failed != y->failed)
        return x->failed - y->failed;
    if (x->rung != y->rung)
        return y->rung - x->rung;
    if (x->rung >= 0 && x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->i - y->i;
}

void sw_ranking(const sw_sched *s, int *order)
{
    rank_key *k = malloc((size_t)s->ntrials * sizeof *k);
    if (!k) { /* index order rather than nothing */
        for (int i = 0; i < s->ntrials; i++)
            order[i] = i;
        return;
    }
    for (int i = 0; i < s->ntrials; i++) {
        const sw_trial *t = &s->t[i];
        k[i] = (rank_key){.i = i, .failed = t->state == SW_FAILED, .rung = t->rung,
                          .score = t->rung >= 0 ? t->score[t->rung] : 0};
    }
    qsort(k, (size_t)s->ntrials, sizeof *k, rank_cmp);
    for (int i = 0; i < s->ntrials; i++)
        order[i] = k[i].i;
    free(k);
}

long sw_budget_epochs(const sw_sched *s)
{
    long n = s->ntrials, total = 0, prev = 0;
    for (int k = 0; k < s->nrungs && n > 0; k++) {
        total += n * (s->epochs[k] - prev);
        prev = s->epochs[k];
        n = s->method == SW_ASHA ? n / s->reduction : 0;
    }
    return total;
}
