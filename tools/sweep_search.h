/* The search of `clgrad sweep`, apart from devices and processes: the
 * search space (--param NAME=SPEC), the trials' configurations (grid,
 * seeded random samples), the scheduler that says which trial runs next
 * and for how many epochs (grid / random: each trial once; ASHA: rungs of
 * min_epochs * reduction^k epochs with the top 1/reduction promoted, either
 * synchronously, a rung at a time, or asynchronously, whenever a device
 * frees up), and the final ranking. Plain C: no clgrad calls, so the suite
 * tests/sweep/ drives it with a fake objective (cmd_sweep.c runs the real
 * trials as `clgrad train` processes). */
#ifndef CLG_SWEEP_SEARCH_H
#define CLG_SWEEP_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#define SW_MAX_PARAMS 16
#define SW_MAX_CHOICES 64
#define SW_MAX_RUNGS 16
#define SW_MAX_TRIALS 100000
#define SW_VAL_LEN 48

typedef enum sw_kind {
    SW_CHOICE,  /* a,b,c: the values as text */
    SW_UNIFORM, /* uniform:LO:HI */
    SW_LOG,     /* log:LO:HI (0 < LO < HI): uniform in log space */
} sw_kind;

typedef struct sw_param {
    char name[64];    /* as given: "lr", "drop1.p" */
    char section[64]; /* "net" or the layer's name */
    char key[64];     /* the model-file key: "learning_rate", "p" */
    sw_kind kind;
    double lo, hi;
    int nchoices;
    char choices[SW_MAX_CHOICES][SW_VAL_LEN];
} sw_param;

typedef struct sw_space {
    int n;
    sw_param p[SW_MAX_PARAMS];
} sw_space;

/* Parses "NAME=SPEC" into the space. NAME: a [net] key (or an alias: lr,
 * wd, batch_size) or LAYER.KEY. SPEC: a comma-separated list of values,
 * uniform:LO:HI or log:LO:HI. On a bad spec returns -1 with a message that
 * names the parameter in why. Layer names are checked by the caller. */
int sw_space_add(sw_space *s, const char *spec, char *why, size_t cap);

typedef enum sw_method { SW_GRID, SW_RANDOM, SW_ASHA } sw_method;

/* A trial's state. */
typedef enum sw_state {
    SW_PENDING, /* not started */
    SW_RUNNING, /* a rung is running */
    SW_PAUSED,  /* a rung completed, waiting for a promotion decision */
    SW_STOPPED, /* ASHA stopped it early (not promoted) */
    SW_DONE,    /* ran its last rung */
    SW_FAILED,  /* diverged, or its process failed (twice) */
} sw_state;

typedef struct sw_trial {
    char val[SW_MAX_PARAMS][SW_VAL_LEN]; /* the value of each parameter, as model-file text */
    sw_state state;
    int rung;                   /* highest rung completed (-1: none) */
    int promoted;               /* the rung it is promoted to / running (-1: none) */
    double score[SW_MAX_RUNGS]; /* higher is better (val_loss: its negative); NAN: not run */
} sw_trial;

typedef struct sw_sched {
    sw_method method;
    int async;      /* ASHA: promote asynchronously */
    int ntrials;
    int nrungs;
    int epochs[SW_MAX_RUNGS]; /* epochs in total at the end of each rung */
    int reduction;
    int cursor;     /* no trial before it is still pending */
    int running;    /* jobs running */
    int n_at[SW_MAX_RUNGS];    /* results (scores and failures) reported at each rung */
    int decided[SW_MAX_RUNGS]; /* synchronous: the rung's promotions are decided */
    sw_trial *t;
} sw_sched;

typedef struct sw_setup {
    sw_method method;
    int async;
    int trials;      /* random, asha: the number of trials (grid: the grid's size) */
    int grid_points; /* grid: points of a uniform / log parameter (default 3) */
    int min_epochs, max_epochs, reduction;
    uint64_t seed;
} sw_setup;

/* The trials' configurations and the rungs. -1 with why set on a bad
 * setup (a grid too large, epochs out of order). */
int sw_sched_init(sw_sched *s, const sw_space *sp, const sw_setup *u, char *why, size_t cap);
void sw_sched_free(sw_sched *s);
/* The number of points of the grid over sp (0 when over SW_MAX_TRIALS). */
long sw_grid_size(const sw_space *sp, int grid_points);

typedef enum sw_next_kind { SW_JOB, SW_WAIT, SW_END } sw_next_kind;
typedef struct sw_job {
    int trial, rung, epochs;
} sw_job;
/* The next job for a free device: SW_JOB (job filled, the trial now
 * running), SW_WAIT (nothing to start until a running job reports) or
 * SW_END (every trial finished, stopped or failed). */
sw_next_kind sw_next(sw_sched *s, sw_job *job);
/* A job's result: its score (higher is better) or failed. */
void sw_report(sw_sched *s, int trial, int rung, double score, int failed);
/* Replays a result recorded by an earlier run (resume): the trial ran rung
 * with that outcome. Call before any sw_next, in the recorded order. */
void sw_replay(sw_sched *s, int trial, int rung, double score, int failed);
/* The trials ranked: highest rung reached first, then score, then trial
 * index; failed trials last. order receives ntrials indices. */
void sw_ranking(const sw_sched *s, int *order);
/* Epochs of every job of the schedule when each rung runs its quota
 * (grid / random: trials x epochs), the budget for the ETA. */
long sw_budget_epochs(const sw_sched *s);

/* The parameter's value as text ("0.001", "sgd"): random sample u in [0, 1). */
void sw_value_sample(const sw_param *p, double u, char *out, size_t cap);

#endif
