/* clgrad sweep's files and reports (sweep_out.c), shared with the command
 * (cmd_sweep.c): a trial's model text, the results table (results.csv, one
 * row per finished job, written atomically after each), the ranking on
 * stdout (or --json), best.cfg and the SVG. */
#ifndef CLG_SWEEP_H
#define CLG_SWEEP_H

#include <stddef.h>

#include "sweep_search.h"

/* One finished job (a trial's rung): a row of results.csv. */
typedef struct sweep_row {
    int trial, rung, epochs;
    int failed;
    double val_loss, val_acc, train_loss, train_acc; /* NAN: none */
    double start, end;                               /* wall-clock seconds (Unix time) */
    long long step;                                  /* steps done; a failure: the step it failed at (-1: unknown) */
    char devices[48];                                /* the device indices it ran on: "0", "0+1"; mpirun: "r1:0" */
    char note[160];                                  /* why it failed, a retry */
} sweep_row;

typedef struct sweep_run {
    const char *dir;
    const sw_space *space;
    sw_sched *sched;
    int maximize;       /* val_acc: higher is better; val_loss: lower */
    const char *metric; /* "val_acc" or "val_loss" */
    const char *model_text;
    sweep_row *rows;
    int nrows, caprows;
} sweep_run;

/* The row's metric and its score (higher is better). */
double sweep_metric(const sweep_run *r, const sweep_row *row);
double sweep_score(const sweep_run *r, const sweep_row *row);
/* Appends a row (0, or -1 out of memory). */
int sweep_row_add(sweep_run *r, const sweep_row *row);

/* 0 when every LAYER of a LAYER.KEY parameter names a layer of the model
 * text (a `name = LAYER` line); else -1 with the parameter named in why. */
int sweep_check_layers(const char *text, const sw_space *sp, char *why, size_t cap);
/* The model text with trial's values put in (replacing a key's line, or
 * added after its section's header), under a comment naming the trial.
 * malloc'd; NULL when out of memory. */
char *sweep_model_text(const char *text, const sw_space *sp, const sw_trial *t, int trial);

/* results.csv, atomically. 0 or -1 (message printed). */
int sweep_results_write(const sweep_run *r);
/* Reads DIR/results.csv into r->rows (none: 0 rows); checks each row's
 * parameter values against the trial's. 0, or -1 with why. */
int sweep_results_read(sweep_run *r, char *why, size_t cap);

/* The ranking on stdout (a table, or JSON), best.cfg and sweep.svg in the
 * directory. Returns the number of trials that have a result. */
int sweep_finish(const sweep_run *r, int json, double seconds);
/* DIR/sweep.svg (sweep_svg.c): the trials' curves, order: the ranking. */
void sweep_svg(const sweep_run *r, const int *order);

/* Under mpirun (sweep_ranks.c): rank 0 runs the search and hands jobs to
 * the other ranks through files in DIR/ranks/, written atomically. Each
 * returns 0, or -1 with a message printed; the takers 1 when a file was
 * there (read and removed), 0 when not. */
/* Empties (makes) DIR/ranks/: rank 0, before the ranks meet. */
int sweep_ranks_reset(const char *dir);
/* A rank's host name and its device groups (--devices of a trial each). */
int sweep_ranks_hello(const char *dir, int rank, const char *host, int ngroups, const char (*groups)[32]);
int sweep_ranks_read_hello(const char *dir, int rank, char *host, size_t hcap, int *ngroups, char (*groups)[32],
                           int maxg);
/* Rank 0 posts a job to slot `slot` of rank `rank`; that rank takes it. */
int sweep_ranks_post(const char *dir, int rank, int slot, const sw_job *job);
int sweep_ranks_take(const char *dir, int rank, int slot, sw_job *job);
/* The job's process ended with wait status `status`; rank 0 collects it. */
int sweep_ranks_done(const char *dir, int rank, int slot, int status);
int sweep_ranks_collect(const char *dir, int rank, int slot, int *status);
/* Rank 0: the search is over, the other ranks may leave. */
int sweep_ranks_end(const char *dir);
int sweep_ranks_ended(const char *dir);

#endif
