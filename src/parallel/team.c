/* Host threads for the lanes (see team.h). */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "parallel/team.h"

typedef struct worker {
    clg_team *team;
    int lane;
    pthread_t thread;
    int started;
} worker;

struct clg_team {
    int n;
    worker *w;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;      /* job generation: a worker runs each generation once */
    int pending;       /* lanes still running the current job */
    int quit;
    int caller0;       /* lane 0 runs on the caller's thread, in clg_team_end */
    int inline0;       /* lane 0 of the current job still to run there */
    int spin_us;       /* a wait spins (yielding the core) this long before it sleeps */
    int spin_hit, spin_miss; /* waits that ended within their spin, or slept (clg_team_spin_take) */
    clg_team_fn fn;
    void *arg;
    clg_status *st;    /* per lane */
};

int clg_spin_until(int (*pred)(const void *), const void *arg, int spin_us)
{
    if (pred(arg))
        return 1;
    if (spin_us <= 0)
        return 0;
    double t0 = clg_now_sec(), lim = spin_us * 1e-6;
    for (;;) {
        sched_yield(); /* returns at once on a free core; lets another thread run on a busy one */
        if (pred(arg))
            return 1;
        if (clg_now_sec() - t0 > lim)
            return 0;
    }
}

typedef struct {
    const clg_team *t;
    uint64_t seen;
} go_wait;

static int go_pred(const void *p)
{
    const go_wait *g = p;
    return __atomic_load_n(&g->t->gen, __ATOMIC_ACQUIRE) != g->seen || __atomic_load_n(&g->t->quit, __ATOMIC_ACQUIRE);
}

static int done_pred(const void *p)
{
    const clg_team *t = p;
    return __atomic_load_n(&t->pending, __ATOMIC_ACQUIRE) == 0;
}

static void *worker_main(void *p)
{
    worker *w = p;
    clg_team *t = w->team;
    uint64_t seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        if (!t->quit && t->gen == seen) { /* the next job usually comes within microseconds: spin first */
            go_wait g = {t, seen};
            pthread_mutex_unlock(&t->mu);
            int us = __atomic_load_n(&t->spin_us, __ATOMIC_RELAXED);
            if (us > 0)
                __atomic_add_fetch(clg_spin_until(go_pred, &g, us) ? &t->spin_hit : &t->spin_miss, 1,
                                   __ATOMIC_RELAXED);
            pthread_mutex_lock(&t->mu);
        }
        while (!t->quit && t->gen == seen)
            pthread_cond_wait(&t->go, &t->mu);
        if (t->quit)
            break;
        seen = t->gen;
        clg_team_fn fn = t->fn;
        void *arg = t->arg;
        pthread_mutex_unlock(&t->mu);
        clg_status st = fn(arg, w->lane);
        pthread_mutex_lock(&t->mu);
        t->st[w->lane] = st;
        if (__atomic_sub_fetch(&t->pending, 1, __ATOMIC_RELEASE) == 0)
            pthread_cond_broadcast(&t->done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

clg_status clg_team_create(clg_err *err, int lanes, clg_team **out)
{
    return clg_team_create_ex(err, lanes, 0, out);
}

clg_status clg_team_create_ex(clg_err *err, int lanes, int caller_lane0, clg_team **out)
{
    *out = NULL;
    clg_team *t = calloc(1, sizeof *t);
    if (!t || !(t->st = calloc((size_t)CLG_MAX(lanes, 1), sizeof *t->st))) {
        free(t);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory creating the lane threads");
    }
    t->n = lanes;
    t->caller0 = caller_lane0 != 0;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    if (lanes > 1) {
        t->w = calloc((size_t)lanes, sizeof *t->w);
        if (!t->w) {
            clg_team_free(t);
            return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory creating the lane threads");
        }
        for (int i = t->caller0; i < lanes; i++) {
            t->w[i].team = t;
            t->w[i].lane = i;
            if (pthread_create(&t->w[i].thread, NULL, worker_main, &t->w[i]) != 0) {
                clg_team_free(t);
                return clg_err_set(err, CLG_ERR_INTERNAL, "cannot start the host thread of lane %d", i);
            }
            t->w[i].started = 1;
        }
    }
    *out = t;
    return CLG_OK;
}

void clg_team_free(clg_team *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    __atomic_store_n(&t->quit, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; t->w && i < t->n; i++)
        if (t->w[i].started)
            pthread_join(t->w[i].thread, NULL);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->done);
    free(t->w);
    free(t->st);
    free(t);
}

void clg_team_begin(clg_team *t, clg_team_fn fn, void *arg)
{
    if (t->n <= 1) { /* inline: the caller's thread is lane 0's */
        t->st[0] = fn(arg, 0);
        return;
    }
    pthread_mutex_lock(&t->mu);
    t->fn = fn;
    t->arg = arg;
    t->pending = t->n - t->caller0;
    t->inline0 = t->caller0;
    __atomic_store_n(&t->gen, t->gen + 1, __ATOMIC_RELEASE); /* after fn, arg and pending: a spinning worker goes */
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
}

clg_status clg_team_end(clg_team *t, int *failed)
{
    if (t->n > 1) {
        if (t->inline0) { /* lane 0 here: no hand-off to a thread of its own and back */
            t->inline0 = 0;
            t->st[0] = t->fn(t->arg, 0);
        }
        /* the other lanes usually end within microseconds */
        int us = __atomic_load_n(&t->spin_us, __ATOMIC_RELAXED);
        if (us > 0 && !done_pred(t))
            __atomic_add_fetch(clg_spin_until(done_pred, t, us) ? &t->spin_hit : &t->spin_miss, 1, __ATOMIC_RELAXED);
        pthread_mutex_lock(&t->mu);
        while (t->pending > 0)
            pthread_cond_wait(&t->done, &t->mu);
        pthread_mutex_unlock(&t->mu);
    }
    for (int i = 0; i < t->n; i++)
        if (t->st[i] != CLG_OK) {
            if (failed)
                *failed = i;
            return t->st[i];
        }
    return CLG_OK;
}

void clg_team_set_spin(clg_team *t, int spin_us) { __atomic_store_n(&t->spin_us, spin_us, __ATOMIC_RELAXED); }

void clg_team_spin_take(clg_team *t, int *hit, int *miss)
{
    *hit = __atomic_exchange_n(&t->spin_hit, 0, __ATOMIC_RELAXED);
    *miss = __atomic_exchange_n(&t->spin_miss, 0, __ATOMIC_RELAXED);
}

clg_status clg_team_run(clg_team *t, clg_team_fn fn, void *arg, int *failed)
{
    clg_team_begin(t, fn, arg);
    return clg_team_end(t, failed);
}
