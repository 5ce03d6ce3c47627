/* The search of `clgrad sweep` on a fake objective, without devices: the
 * grid enumerates every point once; random search is reproducible from its
 * seed and stays in its ranges; ASHA promotes exactly the top 1/reduction at
 * each rung and stops the rest; asynchronous promotion ranks like the
 * synchronous one on a deterministic objective; a replayed (resumed) search
 * reruns no recorded job and ends as an uninterrupted one; bad specs are
 * refused naming the parameter. Jobs run on W fake workers with random
 * durations, so completions arrive in a fresh order every run. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/dataset.h"
#include "sweep_search.h"
#include "testutil.h"

static uint64_t fresh_seed(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
}

static void add(sw_space *sp, const char *spec)
{
    char why[512];
    ck_assert_msg(sw_space_add(sp, spec, why, sizeof why) == 0, "%s: %s", spec, why);
}

/* The fake objective: the trial's lr (parameter 0) close to 10^-2 is best,
 * more epochs a little better; deterministic. */
static double objective(const sw_sched *s, int trial, int rung)
{
    double lr = strtod(s->t[trial].val[0], NULL);
    double d = log10(lr) + 2;
    return -d * d + 1e-3 * s->epochs[rung];
}

typedef struct sim_log {
    int n;
    int trial[4096], rung[4096];
} sim_log;

/* Runs the search to the end on `workers` fake workers with random job
 * durations (uniform in [1, 2) x epochs). fail_trial >= 0 fails that trial's
 * first job. stop_after > 0: returns after that many results (a kill). */
static void simulate(sw_sched *s, int workers, unsigned seed, int fail_trial, int stop_after, sim_log *log)
{
    srand(seed);
    sw_job run[64];
    double end[64];
    int nrun = 0, results = 0;
    double now = 0;
    log->n = 0;
    for (;;) {
        sw_job j;
        sw_next_kind k = SW_WAIT;
        while (nrun < workers && (k = sw_next(s, &j)) == SW_JOB) {
            run[nrun] = j;
            end[nrun++] = now + (1 + rand() / (RAND_MAX + 1.0)) * j.epochs;
            ck_assert_int_lt(log->n, 4096);
            log->trial[log->n] = j.trial;
            log->rung[log->n++] = j.rung;
        }
        if (nrun == 0) {
            ck_assert_int_eq(sw_next(s, &j), SW_END);
            return;
        }
        int first = 0;
        for (int i = 1; i < nrun; i++)
            if (end[i] < end[first])
                first = i;
        now = end[first];
        j = run[first];
        run[first] = run[--nrun];
        end[first] = end[nrun];
        int failed = j.trial == fail_trial && j.rung == 0;
        sw_report(s, j.trial, j.rung, failed ? NAN : objective(s, j.trial, j.rung), failed);
        if (stop_after > 0 && ++results == stop_after)
            return;
    }
}

START_TEST(test_grid_once)
{
    sw_space sp = {0};
    add(&sp, "lr=0.1,0.01,0.001");
    add(&sp, "batch=32,64");
    add(&sp, "momentum=uniform:0.5:0.9");
    add(&sp, "drop1.p=log:0.01:0.1");
    sw_setup u = {.method = SW_GRID, .grid_points = 3, .max_epochs = 2};
    sw_sched s;
    char why[256];
    ck_assert_int_eq(sw_sched_init(&s, &sp, &u, why, sizeof why), 0);
    ck_assert_int_eq(s.ntrials, 3 * 2 * 3 * 3);
    sim_log log;
    simulate(&s, 3, (unsigned)fresh_seed(), -1, 0, &log);
    ck_assert_int_eq(log.n, s.ntrials);
    int seen[54] = {0};
    for (int i = 0; i < log.n; i++) {
        ck_assert_int_eq(log.rung[i], 0);
        seen[log.trial[i]]++;
    }
    /* every point of the product exactly once */
    const char *lr[] = {"0.1", "0.01", "0.001"}, *b[] = {"32", "64"}, *m[] = {"0.5", "0.7", "0.9"},
               *p[] = {"0.01", "0.0316228", "0.1"};
    int hit[54] = {0};
    for (int i = 0; i < s.ntrials; i++) {
        ck_assert_int_eq(seen[i], 1);
        ck_assert_int_eq(s.t[i].state, SW_DONE);
        int a = -1, c = -1, d = -1, e = -1;
        for (int k = 0; k < 3; k++) {
            a = strcmp(s.t[i].val[0], lr[k]) == 0 ? k : a;
            d = strcmp(s.t[i].val[2], m[k]) == 0 ? k : d;
            e = strcmp(s.t[i].val[3], p[k]) == 0 ? k : e;
        }
        for (int k = 0; k < 2; k++)
            c = strcmp(s.t[i].val[1], b[k]) == 0 ? k : c;
        ck_assert_msg(a >= 0 && c >= 0 && d >= 0 && e >= 0, "trial %d: %s %s %s %s", i, s.t[i].val[0],
                      s.t[i].val[1], s.t[i].val[2], s.t[i].val[3]);
        hit[((a * 2 + c) * 3 + d) * 3 + e]++;
    }
    for (int i = 0; i < 54; i++)
        ck_assert_int_eq(hit[i], 1);
    ck_assert_int_eq(sw_budget_epochs(&s), 54 * 2);
    sw_sched_free(&s);
}
END_TEST

START_TEST(test_random_seeded)
{
    sw_space sp = {0};
    add(&sp, "lr=log:1e-4:1e-1");
    add(&sp, "optimizer=sgd,adamw");
    add(&sp, "momentum=uniform:0.8:0.99");
    uint64_t seed = fresh_seed();
    sw_setup u = {.method = SW_RANDOM, .trials = 200, .max_epochs = 1, .seed = seed};
    sw_sched a, b, c;
    char why[256];
    ck_assert_int_eq(sw_sched_init(&a, &sp, &u, why, sizeof why), 0);
    ck_assert_int_eq(sw_sched_init(&b, &sp, &u, why, sizeof why), 0);
    u.seed = seed + 1;
    ck_assert_int_eq(sw_sched_init(&c, &sp, &u, why, sizeof why), 0);
    int differ = 0, sgd = 0, low_decade = 0;
    for (int i = 0; i < a.ntrials; i++) {
        for (int j = 0; j < sp.n; j++) {
            ck_assert_str_eq(a.t[i].val[j], b.t[i].val[j]);
            differ += strcmp(a.t[i].val[j], c.t[i].val[j]) != 0;
        }
        double lr = strtod(a.t[i].val[0], NULL), mom = strtod(a.t[i].val[2], NULL);
        ck_assert(lr >= 1e-4 * (1 - 1e-5) && lr <= 1e-1 * (1 + 1e-5));
        ck_assert(mom >= 0.8 && mom <= 0.99);
        low_decade += lr < 1e-3;
        sgd += strcmp(a.t[i].val[1], "sgd") == 0;
        ck_assert(strcmp(a.t[i].val[1], "sgd") == 0 || strcmp(a.t[i].val[1], "adamw") == 0);
    }
    ck_assert_int_gt(differ, a.ntrials); /* another seed, other samples */
    /* log-uniform: a third of the samples in the lowest decade (binomial, 200 draws: 5 sigma ~ 33) */
    ck_assert_msg(low_decade > 67 - 33 && low_decade < 67 + 33, "lowest decade: %d of 200", low_decade);
    ck_assert_msg(sgd > 100 - 36 && sgd < 100 + 36, "sgd: %d of 200", sgd);
    sw_sched_free(&a);
    sw_sched_free(&b);
    sw_sched_free(&c);
}
END_TEST

/* Checks the synchronous ASHA run s against the rule: at each rung the top
 * floor(n / r) of its results, by score, ran the next rung; nobody else. */
static void check_promotions(const sw_sched *s, const sim_log *log)
{
    int n = s->ntrials;
    for (int k = 0; k + 1 < s->nrungs; k++) {
        int at_k = 0, at_next = 0;
        for (int i = 0; i < log->n; i++) {
            at_k += log->rung[i] == k;
            at_next += log->rung[i] == k + 1;
        }
        ck_assert_int_eq(at_k, n);
        ck_assert_int_eq(at_next, n / s->reduction);
        for (int i = 0; i < log->n; i++) {
            if (log->rung[i] != k)
                continue;
            int t = log->trial[i], better = 0, ran_next = 0;
            for (int j = 0; j < log->n; j++) {
                int u = log->trial[j];
                if (log->rung[j] == k && u != t && !isnan(s->t[u].score[k]) &&
                    (s->t[u].score[k] > s->t[t].score[k] || isnan(s->t[t].score[k])))
                    better++;
                ran_next += log->rung[j] == k + 1 && u == t;
            }
            int want = !isnan(s->t[t].score[k]) && better < n / s->reduction;
            ck_assert_msg(ran_next == want, "rung %d trial %d: ran the next rung %d times, expected %d", k, t,
                          ran_next, want);
        }
        n /= s->reduction;
    }
    for (int i = 0; i < s->ntrials; i++)
        ck_assert(s->t[i].state == SW_DONE || s->t[i].state == SW_STOPPED || s->t[i].state == SW_FAILED);
}

START_TEST(test_asha_sync)
{
    sw_space sp = {0};
    add(&sp, "lr=log:1e-4:1");
    sw_setup u = {.method = SW_ASHA, .trials = 27, .min_epochs = 1, .max_epochs = 9, .reduction = 3,
                  .seed = fresh_seed()};
    sw_sched s;
    char why[256];
    ck_assert_int_eq(sw_sched_init(&s, &sp, &u, why, sizeof why), 0);
    ck_assert_int_eq(s.nrungs, 3);
    ck_assert_int_eq(s.epochs[0], 1);
    ck_assert_int_eq(s.epochs[1], 3);
    ck_assert_int_eq(s.epochs[2], 9);
    sim_log log;
    int bad = (int)(fresh_seed() % 27);
    simulate(&s, 4, (unsigned)fresh_seed(), bad, 0, &log);
    ck_assert_int_eq(log.n, 27 + 9 + 3);
    ck_assert_int_eq(s.t[bad].state, SW_FAILED);
    check_promotions(&s, &log);
    /* budget: 27 x 1 + 9 x 2 + 3 x 6 epochs, 63 / 243 of the grid's (27 x 9) */
    ck_assert_int_eq(sw_budget_epochs(&s), 27 + 18 + 18);
    int order[27];
    sw_ranking(&s, order);
    ck_assert_int_eq(order[26], bad);
    ck_assert_int_eq(s.t[order[0]].rung, 2);
    for (int i = 1; i < 3; i++)
        ck_assert(s.t[order[i]].score[2] <= s.t[order[i - 1]].score[2]);
    sw_sched_free(&s);
}
END_TEST

START_TEST(test_asha_async_same_ranking)
{
    sw_space sp = {0};
    add(&sp, "lr=log:1e-4:1");
    add(&sp, "batch=32,64");
    uint64_t seed = fresh_seed();
    sw_setup u = {.method = SW_ASHA, .trials = 27, .min_epochs = 1, .max_epochs = 9, .reduction = 3, .seed = seed};
    sw_sched a, b;
    char why[256];
    ck_assert_int_eq(sw_sched_init(&a, &sp, &u, why, sizeof why), 0);
    u.async = 1;
    ck_assert_int_eq(sw_sched_init(&b, &sp, &u, why, sizeof why), 0);
    sim_log la, lb;
    simulate(&a, 3, (unsigned)seed, -1, 0, &la);
    simulate(&b, 3, (unsigned)seed + 7, -1, 0, &lb);
    int oa[27], ob[27];
    sw_ranking(&a, oa);
    sw_ranking(&b, ob);
    /* the synchronous top (the trials that reached the last rung) leads the asynchronous ranking in the
     * same order; asynchronous promotion may have run a few more trials further, never fewer */
    int top = 0;
    while (top < 27 && a.t[oa[top]].rung == a.nrungs - 1)
        top++;
    ck_assert_int_eq(top, 3);
    for (int i = 0; i < top; i++)
        ck_assert_int_eq(oa[i], ob[i]);
    ck_assert_int_ge(lb.n, la.n);
    /* no device waited for a whole rung: some rung-1 job started before the last rung-0 job */
    int first1 = -1, last0 = -1;
    for (int i = 0; i < lb.n; i++) {
        if (lb.rung[i] == 1 && first1 < 0)
            first1 = i;
        if (lb.rung[i] == 0)
            last0 = i;
    }
    ck_assert_int_ge(first1, 0);
    ck_assert_int_lt(first1, last0);
    sw_sched_free(&a);
    sw_sched_free(&b);
}
END_TEST

/* A search killed after some results and replayed from them continues
 * without rerunning a recorded job and ends as the uninterrupted one. */
START_TEST(test_replay)
{
    sw_space sp = {0};
    add(&sp, "lr=log:1e-4:1");
    sw_setup u = {.method = SW_ASHA, .trials = 12, .min_epochs = 1, .max_epochs = 4, .reduction = 2,
                  .seed = fresh_seed()};
    sw_sched full, part, res;
    char why[256];
    ck_assert_int_eq(sw_sched_init(&full, &sp, &u, why, sizeof why), 0);
    ck_assert_int_eq(sw_sched_init(&part, &sp, &u, why, sizeof why), 0);
    ck_assert_int_eq(sw_sched_init(&res, &sp, &u, why, sizeof why), 0);
    sim_log lf, lp, lr;
    unsigned seed = (unsigned)fresh_seed();
    simulate(&full, 2, seed, -1, 0, &lf);
    int stop = 5 + (int)(seed % 10);
    simulate(&part, 2, seed, -1, stop, &lp);
    /* what a results table holds: the jobs that reported */
    for (int i = 0; i < part.ntrials; i++)
        for (int k = 0; k < part.nrungs; k++)
            if (!isnan(part.t[i].score[k]))
                sw_replay(&res, i, k, part.t[i].score[k], 0);
    simulate(&res, 2, seed + 1, -1, 0, &lr);
    for (int i = 0; i < lr.n; i++)
        ck_assert_msg(isnan(part.t[lr.trial[i]].score[lr.rung[i]]), "trial %d rung %d ran again", lr.trial[i],
                      lr.rung[i]);
    int of[12], orr[12];
    sw_ranking(&full, of);
    sw_ranking(&res, orr);
    for (int i = 0; i < 12; i++) {
        ck_assert_int_eq(of[i], orr[i]);
        ck_assert_int_eq(full.t[i].state, res.t[i].state);
    }
    sw_sched_free(&full);
    sw_sched_free(&part);
    sw_sched_free(&res);
}
END_TEST

static void refused(const char *spec, const char *naming)
{
    sw_space sp = {0};
    char why[512] = "";
    ck_assert_msg(sw_space_add(&sp, spec, why, sizeof why) != 0, "%s accepted", spec);
    ck_assert_msg(strstr(why, naming), "%s: '%s' does not name %s", spec, why, naming);
    ck_assert_int_eq(sp.n, 0);
}

START_TEST(test_bad_specs)
{
    refused("lr=log:0:1", "'lr'");
    refused("lr=log:-1:1", "'lr'");
    refused("lr=uniform:1:1", "'lr'");
    refused("lr=uniform:a:1", "'lr'");
    refused("momentum=log:1e-3", "'momentum'");
    refused("colour=1,2", "'colour'");
    refused("epochs=1,2", "'epochs'");
    refused("batch=", "'batch'");
    refused("batch=64,,128", "'batch'");
    refused("batch=64,", "'batch'");
    refused("optimizer=sgd,sgd", "'optimizer'");
    refused("drop1.=0.1", "'drop1.'");
    refused(".p=0.1", "'.p'");
    refused("drop1.name=a", "'drop1.name'");
    refused("noequals", "noequals");
    refused("=1,2", "=1,2");
    refused("lr=0.1 0.2", "'lr'");
    sw_space sp = {0};
    add(&sp, "lr=0.1");
    char why[256];
    ck_assert_int_ne(sw_space_add(&sp, "learning_rate=0.2", why, sizeof why), 0);
    ck_assert_ptr_nonnull(strstr(why, "twice"));
    /* a grid too large, epochs out of order */
    sw_space big = {0};
    add(&big, "momentum=uniform:0:0.9");
    add(&big, "lr=log:1e-4:1");
    sw_setup u = {.method = SW_GRID, .grid_points = 1000, .max_epochs = 1};
    sw_sched s;
    ck_assert_int_ne(sw_sched_init(&s, &big, &u, why, sizeof why), 0);
    sw_setup v = {.method = SW_ASHA, .trials = 9, .min_epochs = 4, .max_epochs = 2, .reduction = 3};
    ck_assert_int_ne(sw_sched_init(&s, &sp, &v, why, sizeof why), 0);
    v.min_epochs = 1;
    v.reduction = 1;
    ck_assert_int_ne(sw_sched_init(&s, &sp, &v, why, sizeof why), 0);
}
END_TEST

/* The validation split of clgrad train --val-fraction (what a sweep ranks
 * on): every sample in exactly one part, in the data's order, the count
 * rounded, the same split for the same seed and another for another. */
START_TEST(test_holdout)
{
    uint64_t seed = fresh_seed();
    srand((unsigned)seed);
    int n = 500 + rand() % 500;
    clg_dataset *ds = NULL, *tr[3] = {NULL}, *va[3] = {NULL};
    ck_assert_int_eq(clg_dataset_create(NULL, n, 1, 3, 2, 10, CLG_DS_U8, &ds), CLG_OK);
    for (int i = 0; i < n; i++) { /* sample i: its index in the pixels, a random label */
        ds->labels[i] = rand() % 10;
        for (int k = 0; k < 6; k++)
            ds->u8[i * 6 + k] = (uint8_t)(k < 2 ? i >> (8 * k) : rand());
    }
    double f = 0.05 + 0.3 * (rand() / (RAND_MAX + 1.0));
    uint64_t seeds[3] = {seed | 1, seed | 1, (seed | 1) + 2};
    for (int r = 0; r < 3; r++)
        ck_assert_int_eq(clg_dataset_holdout(NULL, ds, f, seeds[r], &tr[r], &va[r]), CLG_OK);
    ck_assert_int_eq(va[0]->n, (int)lround(n * f));
    ck_assert_int_eq(tr[0]->n + va[0]->n, n);
    int *seen = calloc((size_t)n, sizeof *seen);
    for (int part = 0; part < 2; part++) {
        clg_dataset *d = part ? va[0] : tr[0];
        int prev = -1;
        for (int j = 0; j < d->n; j++) {
            int i = d->u8[j * 6] | d->u8[j * 6 + 1] << 8;
            ck_assert_int_gt(i, prev); /* the data's order */
            prev = i;
            seen[i]++;
            ck_assert_int_eq(d->labels[j], ds->labels[i]);
            ck_assert_mem_eq(d->u8 + j * 6, ds->u8 + i * 6, 6);
        }
    }
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(seen[i], 1);
    ck_assert_mem_eq(va[0]->u8, va[1]->u8, (size_t)va[0]->n * 6);
    ck_assert(memcmp(va[0]->u8, va[2]->u8, (size_t)va[0]->n * 6) != 0);
    clg_dataset *a = NULL, *b = NULL;
    ck_assert_int_ne(clg_dataset_holdout(NULL, ds, 0.0001, 1, &a, &b), CLG_OK); /* nothing held out */
    ck_assert_int_ne(clg_dataset_holdout(NULL, ds, 1.0, 1, &a, &b), CLG_OK);
    ck_assert_ptr_null(a);
    free(seen);
    for (int r = 0; r < 3; r++) {
        clg_dataset_free(tr[r]);
        clg_dataset_free(va[r]);
    }
    clg_dataset_free(ds);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_grid_once,      test_random_seeded, test_asha_sync, test_asha_async_same_ranking,
                            test_replay,         test_bad_specs,     test_holdout};
    return tu_run_tests("sweep", 60, tests, (int)(sizeof tests / sizeof *tests));
}
