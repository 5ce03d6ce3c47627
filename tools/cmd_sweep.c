/* clgrad sweep MODEL --data SPEC --dir DIR [--param NAME=SPEC ...]: a
 * hyperparameter search. The search (sweep_search.c) says which trial runs
 * next and for how many epochs; each job is a `clgrad train` process on
 * its own device (or group of devices), with its checkpoint, log and
 * output in DIR/trial-NNNN, so a crashing or diverging trial cannot take
 * the sweep down, and an ASHA rung is a resume with more epochs. DIR holds
 * everything needed to resume a killed sweep (sweep.args, model.cfg,
 * results.csv). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "cli.h"
#include "cli_opts.h"
#include "sweep.h"

static const char *const methods[] = {"grid", "random", "asha", NULL};
static const char *const promotions[] = {"async", "sync", NULL};
static const char *const metrics[] = {"val_acc", "val_loss", NULL};

typedef struct sweep_opts {
    cli_common c;
    const char *dir, *param, *space, *method, *promotion, *metric;
    int resume, trials, grid_points, min_epochs, max_epochs, reduction, per_trial;
    double val_fraction;
    int64_t seed, limit_train;
} sweep_opts;

#define S sweep_opts
static const cli_opt opts[] = {
    CLI_OPT_DATA,
    CLI_STRING_OPT("--dir", S, dir, "DIR",
                   "the sweep's directory: trial-NNNN/ (checkpoint, log.csv, train.log),\n"
                   "results.csv, best.cfg, sweep.svg, sweep.args, model.cfg"),
    CLI_FLAG_OPT("--resume", S, resume, 1,
                 "continue the sweep in --dir (its saved options; --devices and\n"
                 "--devices-per-trial may change): no finished job runs again"),
    CLI_STRING_OPT("--param", S, param, "NAME=SPEC",
                   "a searched parameter (repeatable): a [net] key (lr, batch, momentum,\n"
                   "weight_decay, optimizer, schedule, ...) or LAYER.KEY (drop1.p);\n"
                   "SPEC: values a,b,c, uniform:LO:HI or log:LO:HI"),
    CLI_STRING_OPT("--space", S, space, "FILE", "more parameters, one NAME=SPEC a line (# comments)"),
    CLI_CHOICE_OPT("--method", S, method, methods, "M",
                   "grid (every point once), random (--trials samples) or asha\n"
                   "(successive halving over rungs of --min-epochs x --reduction^k)"),
    CLI_INT_OPT("--trials", S, trials, 1, SW_MAX_TRIALS, "N", "trials of random and asha (default 8)"),
    CLI_INT_OPT("--grid-points", S, grid_points, 1, 1000, "N",
                "grid: points of a uniform or log range (default 3)"),
    CLI_INT_OPT("--min-epochs", S, min_epochs, 1, 1000000, "N", "asha: epochs of the first rung (default 1)"),
    {.name = "--max-epochs", .alias = "--epochs", .kind = CLI_INT, CLI_FIELD_(S, max_epochs), .ilo = 1,
     .ihi = 1000000, .arg = "N", .help = "epochs of a trial (asha: of the last rung; default 1)"},
    CLI_INT_OPT("--reduction", S, reduction, 2, 1000, "N",
                "asha: the top 1/N of a rung go on to the next (default 3)"),
    CLI_CHOICE_OPT("--promotion", S, promotion, promotions, "P",
                   "asha: async (a free device promotes a trial as soon as it is in its\n"
                   "rung's top 1/N so far; default) or sync (a rung at a time)"),
    CLI_CHOICE_OPT("--metric", S, metric, metrics, "M", "val_acc (default; higher is better) or val_loss"),
    CLI_DOUBLE_OPT("--val-fraction", S, val_fraction, 0, 1, CLI_LO_OPEN | CLI_HI_OPEN, "X",
                   "the validation split held out of the training set (default 0.1);\n"
                   "the test set is never used"),
    CLI_INT_OPT("--seed", S, seed, 0, INT64_MAX, "N", "seed of the random samples (default 1)"),
    CLI_INT_OPT("--limit-train", S, limit_train, 1, INT32_MAX, "N",
                "each trial trains on only the first N training samples"),
    CLI_OPT_DEVICES,
    CLI_INT_OPT("--devices-per-trial", S, per_trial, 1, 64, "K",
                "devices of one trial (data parallel inside it; default 1)"),
    CLI_OPT_PRECISION,
    CLI_OPT_JSON,
    CLI_OPT_VERBOSE,
    CLI_END,
};
#undef S

const cli_spec cli_spec_sweep = {
    .name = "sweep",
    .synopsis = "MODEL --data SPEC --dir DIR --param NAME=SPEC... [options] | --dir DIR --resume",
    .about = "Searches hyperparameters of MODEL: trials run side by side, each a `clgrad train`\n"
             "process on its own device (or --devices-per-trial devices), ranked by a\n"
             "validation split held out of the training set. A trial that diverges is\n"
             "recorded as failed; one whose process dies is retried once. The live table\n"
             "and an ETA go to stderr; the ranking to stdout (--json for tools), with\n"
             "DIR/results.csv, DIR/best.cfg (the best configuration as a model file) and\n"
             "DIR/sweep.svg (validation curves, parameter vs metric). Under mpirun, rank 0\n"
             "runs the search and every rank runs trials on its host's devices (DIR shared).",
    .opts = opts,
    .positional = cli_model_positional,
    .notes = "example: clgrad sweep lenet5 --data fashion-mnist --dir sw --method asha --trials 27\n"
             "  --max-epochs 9 --param lr=log:1e-3:0.3 --param batch=64,128",
};

// ---- options, saved and resumed ----

#define MAX_ARGS 256

typedef struct sweep_cfg {
    sweep_opts o;
    const char *specs[SW_MAX_PARAMS * 2];
    int nspecs;
    char *saved;             /* sweep.args text (resume), owned */
    char *argv[MAX_ARGS];    /* the argument vector parsed */
    char model_path[4200];   /* DIR/model.cfg on resume */
    char data_abs[PATH_MAX]; /* --data as an absolute path, when it is one */
} sweep_cfg;

/* Moves every --param VALUE (--param=VALUE) of argv into cfg->specs. */
static int take_params(sweep_cfg *cfg, int *argc, char **argv)
{
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--param") == 0) {
            if (i + 1 >= *argc)
                return cli_usage_error("sweep", "option --param needs a value (NAME=SPEC)");
            v = argv[++i];
        } else if (strncmp(argv[i], "--param=", 8) == 0) {
            v = argv[i] + 8;
        } else {
            argv[out++] = argv[i];
            continue;
        }
        if (cfg->nspecs == SW_MAX_PARAMS * 2)
            return cli_usage_error("sweep", "too many --param options (at most %d parameters)", SW_MAX_PARAMS);
        cfg->specs[cfg->nspecs++] = v;
    }
    *argc = out;
    return CLI_OK;
}

/* --resume: the options saved in DIR/sweep.args first, then the ones given now. */
static int resume_args(sweep_cfg *cfg, int *argc, char **argv)
{
    const char *dir = NULL;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--dir") == 0 && i + 1 < *argc)
            dir = argv[++i];
        else if (strncmp(argv[i], "--dir=", 6) == 0)
            dir = argv[i] + 6;
        else if (strcmp(argv[i], "--devices") == 0 || strcmp(argv[i], "--devices-per-trial") == 0)
            i++;
        else if (strcmp(argv[i], "--resume") && strcmp(argv[i], "--json") && strcmp(argv[i], "--verbose") &&
                 strncmp(argv[i], "--devices=", 10) && strncmp(argv[i], "--devices-per-trial=", 20))
            return cli_usage_error("sweep", "'%s' with --resume: a resumed sweep keeps its search; only --devices, "
                                            "--devices-per-trial, --json and --verbose may be given", argv[i]);
    }
    if (!dir)
        return cli_usage_error("sweep", "--resume needs --dir DIR");
    char path[4200];
    snprintf(path, sizeof path, "%s/sweep.args", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return cli_fail("sweep: --resume: %s: %s (no sweep was started in %s)", path, strerror(errno), dir);
    cfg->saved = calloc(1, 1 << 16);
    size_t n = cfg->saved ? fread(cfg->saved, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (!cfg->saved)
        return cli_fail("sweep: out of memory");
    int k = 0;
    cfg->argv[k++] = argv[0];
    for (char *s = cfg->saved; s < cfg->saved + n && k < MAX_ARGS - 1 - *argc;) {
        char *e = strchr(s, '\n');
        if (!e)
            break;
        *e = 0;
        cfg->argv[k++] = s;
        s = e + 1;
    }
    snprintf(cfg->model_path, sizeof cfg->model_path, "%s/model.cfg", dir);
    cfg->argv[k++] = cfg->model_path;
    for (int i = 1; i < *argc; i++)
        cfg->argv[k++] = argv[i];
    *argc = k;
    return CLI_OK;
}

/* DIR/sweep.args: the search's options, one argument a line, for --resume
 * (the space as parsed, --param and --space file alike). */
static int save_args(const sweep_cfg *cfg, const sw_space *sp)
{
    const sweep_opts *o = &cfg->o;
    char b[1 << 16], path[4200];
    size_t len = 0;
#define ARG(...) len += (size_t)snprintf(b + (len < sizeof b ? len : 0), len < sizeof b ? sizeof b - len : 0, __VA_ARGS__)
    ARG("--dir\n%s\n--data\n%s\n", o->dir, cfg->data_abs[0] ? cfg->data_abs : o->c.data);
    for (int i = 0; i < sp->n; i++) {
        const sw_param *p = &sp->p[i];
        ARG("--param\n%s=", p->name);
        if (p->kind == SW_CHOICE)
            for (int k = 0; k < p->nchoices; k++)
                ARG("%s%s", k ? "," : "", p->choices[k]);
        else
            ARG("%s:%.17g:%.17g", p->kind == SW_LOG ? "log" : "uniform", p->lo, p->hi);
        ARG("\n");
    }
    ARG("--method\n%s\n--grid-points\n%d\n--max-epochs\n%d\n", o->method, o->grid_points, o->max_epochs);
    if (strcmp(o->method, "grid") != 0)
        ARG("--trials\n%d\n", o->trials);
    if (strcmp(o->method, "asha") == 0)
        ARG("--min-epochs\n%d\n", o->min_epochs);
    ARG("--reduction\n%d\n--promotion\n%s\n--metric\n%s\n--val-fraction\n%.17g\n--seed\n%lld\n", o->reduction,
        o->promotion, o->metric, o->val_fraction, (long long)o->seed);
    if (o->limit_train)
        ARG("--limit-train\n%lld\n", (long long)o->limit_train);
    if (o->c.precision)
        ARG("--precision\n%s\n", o->c.precision);
#undef ARG
    if (len >= sizeof b || strchr(o->c.data, '\n') || strchr(o->dir, '\n'))
        return cli_fail("sweep: the options are too long to save for --resume");
    snprintf(path, sizeof path, "%s/sweep.args", o->dir);
    if (clg_write_file_atomic(path, b, len) != CLG_OK)
        return cli_fail("sweep: %s", clg_last_error(NULL));
    return CLI_OK;
}

/* The options: parsed, defaults filled, checked. */
static int parse_options(sweep_cfg *cfg, int argc, char **argv)
{
    sweep_opts *o = &cfg->o;
    *o = (sweep_opts){.method = "grid", .promotion = "async", .metric = "val_acc", .trials = 0, .grid_points = 3,
                      .min_epochs = 1, .max_epochs = 1, .reduction = 3, .per_trial = 1, .val_fraction = 0.1,
                      .seed = 1};
    int rc = take_params(cfg, &argc, argv);
    if (rc != CLI_OK)
        return rc;
    int resume = 0;
    for (int i = 1; i < argc; i++)
        resume |= strcmp(argv[i], "--resume") == 0;
    if (resume && cfg->nspecs)
        return cli_usage_error("sweep", "--param with --resume: a resumed sweep keeps its search space");
    if (resume && ((rc = resume_args(cfg, &argc, argv)) != CLI_OK || (rc = take_params(cfg, &argc, cfg->argv)) != CLI_OK))
        return rc;
    rc = cli_parse(&cli_spec_sweep, argc, resume ? cfg->argv : argv, o);
    if (rc != CLI_OK)
        return rc == CLI_HELP ? CLI_HELP : rc;
    if (!o->dir)
        return cli_usage_error("sweep", "missing --dir DIR (where the trials and results go)");
    if (!o->c.model)
        return cli_usage_error("sweep", "missing MODEL (a model file such as models/lenet5.cfg)");
    if (!o->c.data)
        return cli_usage_error("sweep", "missing --data (fashion-mnist, mnist, cifar10 or a path)");
    if (!cfg->nspecs && !o->space)
        return cli_usage_error("sweep", "nothing to search: give --param NAME=SPEC (e.g. lr=log:1e-4:1e-1)");
    if (strcmp(o->method, "grid") == 0 && o->trials)
        return cli_usage_error("sweep", "--trials applies to random and asha (a grid runs each of its points)");
    if (strcmp(o->method, "asha") != 0 && o->min_epochs != 1)
        return cli_usage_error("sweep", "--min-epochs applies to asha (use --max-epochs for every trial)");
    if (!o->trials)
        o->trials = 8;
    if (!realpath(o->c.data, cfg->data_abs))
        cfg->data_abs[0] = 0; /* a dataset name */
    return CLI_OK;
}

/* --space FILE: more NAME=SPEC lines. */
static int read_space_file(const char *path, sw_space *sp)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return cli_usage_error("sweep", "--space %s: %s", path, strerror(errno));
    char line[1024], why[512];
    int lineno = 0, rc = CLI_OK;
    while (rc == CLI_OK && fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "#\r\n")] = 0;
        char *s = line, *e = line + strlen(line);
        while (*s == ' ' || *s == '\t')
            s++;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
            *--e = 0;
        if (*s && sw_space_add(sp, s, why, sizeof why))
            rc = cli_usage_error("sweep", "%s:%d: %s", path, lineno, why);
    }
    fclose(f);
    return rc;
}

// ---- the run ----

typedef struct slot {
    pid_t pid;    /* the trial's process; -1: running on another rank */
    int rank;     /* the rank that runs the slot's jobs (mpirun; else 0) */
    int rslot;    /* the slot's index on that rank */
    sw_job job;
    double start; /* Unix time */
    int retries;
    char devices[32]; /* "--devices" of the trial: "0" or "0,1" */
} slot;

typedef struct sweep_state {
    sweep_cfg *cfg;
    sweep_run run;
    sw_space space;
    sw_sched sched;
    char *model_text;
    char self[PATH_MAX];
    slot *slots;
    int nslots;
    double t0;          /* monotonic start of this process's work */
    long epochs_done;   /* epochs of the jobs finished so far (all runs) */
    long epochs_here;   /* of those finished by this process */
    int jobs_done;
    int rank, nranks; /* under mpirun: this process's rank and the ranks */
} sweep_state;

/* Unix time in whole milliseconds (what results.csv holds, so a resumed
 * sweep writes back the same figures). */
static double wall_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-3 * (double)(tv.tv_usec / 1000);
}

static void trial_path(const sweep_state *s, int trial, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/trial-%04d%s%s", s->cfg->o.dir, trial, name ? "/" : "", name ? name : "");
}

/* The epochs a job adds to its trial. */
static long job_epochs(const sw_sched *s, int rung) { return s->epochs[rung] - (rung ? s->epochs[rung - 1] : 0); }

/* The row of epoch `epochs` of the trial's log (last one written), into w; 0 found. */
static int read_log_row(const sweep_state *s, int trial, int epochs, sweep_row *w)
{
    char path[4200], line[512];
    trial_path(s, trial, "log.csv", path, sizeof path);
    FILE *f = fopen(path, "r");
    int found = 0;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        int e;
        long long step;
        double tl, ta, vl, va;
        if (sscanf(line, "%d,%lld,%lf,%lf,%lf,%lf", &e, &step, &tl, &ta, &vl, &va) == 6 && e == epochs) {
            w->step = step;
            w->train_loss = tl;
            w->train_acc = ta;
            w->val_loss = vl;
            w->val_acc = va;
            found = 1;
        }
    }
    fclose(f);
    return found ? 0 : -1;
}

/* Why a job failed, from the end of its train.log: the last error line
 * (commas made ';' for the table) and the step of a divergence. */
static void failure_note(const sweep_state *s, int trial, sweep_row *w)
{
    char path[4200], tail[8192];
    trial_path(s, trial, "train.log", path, sizeof path);
    w->step = -1;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > (long)sizeof tail - 1 ? size - (long)sizeof tail + 1 : 0, SEEK_SET);
    size_t n = fread(tail, 1, sizeof tail - 1, f);
    fclose(f);
    tail[n] = 0;
    char *line = NULL;
    for (char *p = tail; (p = strstr(p, "clgrad")) != NULL; p++)
        if (p == tail || p[-1] == '\n')
            line = p;
    if (line) {
        snprintf(w->note, sizeof w->note, "%.*s", (int)strcspn(line, "\n"), line);
        for (char *c = w->note; *c; c++)
            *c = *c == ',' || *c == '"' ? ';' : *c;
    }
    const char *d = line ? strstr(line, "diverged at step ") : NULL;
    if (d)
        w->step = strtoll(d + strlen("diverged at step "), NULL, 10);
}

/* The environment of a trial's process: this one's without an MPI
 * launcher's variables, so that under mpirun a trial is a process of its
 * own, not one more rank. malloc'd (the strings are environ's). */
static char **child_env(void)
{
    extern char **environ;
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = malloc((n + 1) * sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "OMPI_", 5) && strncmp(environ[i], "PMIX_", 5) && strncmp(environ[i], "PMI_", 4))
            env[k++] = environ[i];
    env[k] = NULL;
    return env;
}

/* Starts `clgrad train` for a job on this process's devices: output to
 * trial-NNNN/train.log; dies with the sweep (Linux: parent-death signal),
 * so a killed sweep leaves no trial running beside the one that resumes it. */
static int spawn_local(sweep_state *s, slot *sl)
{
    const sweep_opts *o = &s->cfg->o;
    int trial = sl->job.trial;
    char model[4200], ck[4200], log[4200], out[4200], last[4400], epochs[16], vf[32], lim[32];
    trial_path(s, trial, "model.cfg", model, sizeof model);
    trial_path(s, trial, "ck", ck, sizeof ck);
    trial_path(s, trial, "log.csv", log, sizeof log);
    trial_path(s, trial, "train.log", out, sizeof out);
    snprintf(last, sizeof last, "%s/last.safetensors", ck);
    snprintf(epochs, sizeof epochs, "%d", sl->job.epochs);
    snprintf(vf, sizeof vf, "%.17g", o->val_fraction);
    snprintf(lim, sizeof lim, "%lld", (long long)o->limit_train);
    char *args[40];
    int k = 0;
    const char *fixed[] = {s->self, "train", model, "--data", s->cfg->data_abs[0] ? s->cfg->data_abs : o->c.data,
                           "--devices", sl->devices, "--epochs", epochs, "--checkpoint", ck, "--log", log,
                           "--val-fraction", vf, "--quiet", "--set", "precompile=0"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        args[k++] = (char *)fixed[i];
    if (access(last, F_OK) == 0)
        args[k++] = "--resume";
    if (o->limit_train) {
        args[k++] = "--limit-train";
        args[k++] = lim;
    }
    if (o->c.precision) {
        args[k++] = "--precision";
        args[k++] = (char *)o->c.precision;
    }
    args[k] = NULL;
    int fd = open(out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return cli_fail("sweep: %s: %s", out, strerror(errno)), -1;
    char where[48] = "";
    if (s->nranks > 1)
        snprintf(where, sizeof where, " of rank %d", s->rank);
    dprintf(fd, "---- clgrad sweep: trial %d rung %d (%d epochs) on device(s) %s%s%s\n", trial, sl->job.rung,
            sl->job.epochs, sl->devices, where, access(last, F_OK) == 0 ? ", resumed" : "");
    char **env = child_env();
    long maxfd = sysconf(_SC_OPEN_MAX);
    maxfd = maxfd < 0 || maxfd > 65536 ? 65536 : maxfd;
    if (!env) {
        close(fd);
        return cli_fail("sweep: out of memory"), -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
        if (getppid() != parent)
            _exit(127);
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0)
            dup2(in, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        for (long i = 3; i < maxfd; i++) /* an MPI rank's sockets and shared memory stay with it */
            close((int)i);
        execve(s->self, args, env);
        _exit(127);
    }
    free(env);
    close(fd);
    if (pid < 0)
        return cli_fail("sweep: cannot start a trial: %s", strerror(errno)), -1;
    sl->pid = pid;
    return 0;
}

/* Starts a slot's job: here, or (mpirun) posted to the slot's rank. */
static int spawn(sweep_state *s, slot *sl)
{
    if (sl->rank == s->rank)
        return spawn_local(s, sl);
    if (sweep_ranks_post(s->cfg->o.dir, sl->rank, sl->rslot, &sl->job))
        return -1;
    sl->pid = -1;
    return 0;
}

/* The progress line: jobs, epochs of the budget, elapsed and ETA. */
static void progress(const sweep_state *s)
{
    long budget = sw_budget_epochs(&s->sched);
    double el = cli_now() - s->t0;
    char eta[32] = "?";
    if (s->epochs_here > 0 && budget > s->epochs_done) {
        double left = (double)(budget - s->epochs_done) * el / (double)s->epochs_here;
        snprintf(eta, sizeof eta, "%d:%02d", (int)left / 60, (int)left % 60);
    } else if (budget <= s->epochs_done) {
        snprintf(eta, sizeof eta, "0:00");
    }
    fprintf(stderr, "[sweep] %d jobs done, %d running, %ld/%ld epochs, elapsed %d:%02d, ETA %s\n", s->jobs_done,
            s->sched.running, s->epochs_done, budget, (int)el / 60, (int)el % 60, eta);
}

/* One line of the live table (stderr). */
static void table_line(const sweep_state *s, const sweep_row *w, const char *what)
{
    fprintf(stderr, "  trial %4d rung %d (%3d ep) %-8s", w->trial, w->rung, w->epochs, what);
    if (!strcmp(what, "ok"))
        fprintf(stderr, " %s %.4f", s->run.metric, sweep_metric(&s->run, w));
    fprintf(stderr, " [");
    for (int i = 0; i < s->space.n; i++)
        fprintf(stderr, "%s%s=%s", i ? " " : "", s->space.p[i].name, s->sched.t[w->trial].val[i]);
    fprintf(stderr, "]");
    if (w->failed)
        fprintf(stderr, " %s", w->note);
    fprintf(stderr, "\n");
}

/* A job's outcome into the search and the table. */
static int record(sweep_state *s, sweep_row *w)
{
    sw_report(&s->sched, w->trial, w->rung, w->failed ? NAN : sweep_score(&s->run, w), w->failed);
    if (sweep_row_add(&s->run, w))
        return cli_fail("sweep: out of memory");
    s->jobs_done++;
    s->epochs_done += job_epochs(&s->sched, w->rung);
    s->epochs_here += job_epochs(&s->sched, w->rung);
    table_line(s, w, w->failed ? "failed" : "ok");
    if (sweep_results_write(&s->run))
        return CLI_FAIL;
    progress(s);
    return CLI_OK;
}

/* A process ended: its result, a retry (died once) or a failure. */
static int job_ended(sweep_state *s, slot *sl, int status)
{
    sweep_row w = {.trial = sl->job.trial, .rung = sl->job.rung, .epochs = sl->job.epochs, .start = sl->start,
                   .end = wall_now(), .val_loss = NAN, .val_acc = NAN, .train_loss = NAN, .train_acc = NAN};
    if (s->nranks > 1)
        snprintf(w.devices, sizeof w.devices, "r%d:%s", sl->rank, sl->devices);
    else
        snprintf(w.devices, sizeof w.devices, "%s", sl->devices);
    for (char *c = w.devices; *c; c++)
        *c = *c == ',' ? '+' : *c;
    sl->pid = 0;
    int exited = WIFEXITED(status), code = exited ? WEXITSTATUS(status) : -1;
    int ok = exited && code == 0 && read_log_row(s, w.trial, w.epochs, &w) == 0 && isfinite(sweep_metric(&s->run, &w));
    if (!ok && !(exited && (code == 1 || code == 2)) && sl->retries == 0) { /* the process died: once more */
        sl->retries++;
        fprintf(stderr, "  trial %4d rung %d: the process %s %d; retrying once\n", w.trial, w.rung,
                exited ? "exited with" : "was killed by signal", exited ? code : WTERMSIG(status));
        return spawn(s, sl) ? CLI_FAIL : CLI_OK;
    }
    if (!ok) {
        w.failed = 1;
        failure_note(s, w.trial, &w);
        if (!w.note[0])
            snprintf(w.note, sizeof w.note, "the process %s %d%s", exited ? "exited with" : "was killed by signal",
                     exited ? code : WTERMSIG(status), sl->retries ? " (retried once)" : "");
    } else if (sl->retries) {
        snprintf(w.note, sizeof w.note, "retried once after its process died");
    }
    sl->retries = 0;
    return record(s, &w);
}

/* Starts a job on a free slot; a job whose epoch is already in the
 * trial's log (finished just before a kill) is recorded without a run. */
static int start_job(sweep_state *s, slot *sl, const sw_job *job)
{
    char dir[4200], model[4200];
    sl->job = *job;
    sl->start = wall_now();
    sl->retries = 0;
    trial_path(s, job->trial, NULL, dir, sizeof dir);
    trial_path(s, job->trial, "model.cfg", model, sizeof model);
    if (mkdir(dir, 0755) && errno != EEXIST)
        return cli_fail("sweep: %s: %s", dir, strerror(errno));
    if (access(model, F_OK) != 0) {
        char *text = sweep_model_text(s->model_text, &s->space, &s->sched.t[job->trial], job->trial);
        int bad = !text || clg_write_file_atomic(model, text, strlen(text)) != CLG_OK;
        free(text);
        if (bad)
            return cli_fail("sweep: %s: %s", model, text ? clg_last_error(NULL) : "out of memory");
    }
    sweep_row w = {.trial = job->trial, .rung = job->rung, .epochs = job->epochs, .start = sl->start,
                   .end = sl->start};
    if (read_log_row(s, job->trial, job->epochs, &w) == 0 && isfinite(sweep_metric(&s->run, &w))) {
        snprintf(w.devices, sizeof w.devices, "-");
        snprintf(w.note, sizeof w.note, "finished before the sweep was interrupted");
        return record(s, &w);
    }
    char where[48] = "";
    if (s->nranks > 1)
        snprintf(where, sizeof where, " of rank %d", sl->rank);
    if (s->cfg->o.c.verbose)
        fprintf(stderr, "  trial %4d rung %d (%3d ep) started on device(s) %s%s\n", job->trial, job->rung,
                job->epochs, sl->devices, where);
    return spawn(s, sl) ? CLI_FAIL : CLI_OK;
}

/* Waits for a trial's process to end (one process, no other ranks). */
static int wait_ended(sweep_state *s)
{
    int status;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0)
        return errno == EINTR ? CLI_OK : cli_fail("sweep: waitpid: %s", strerror(errno));
    for (int i = 0; i < s->nslots; i++)
        if (s->slots[i].pid == pid)
            return job_ended(s, &s->slots[i], status);
    return CLI_OK;
}

/* mpirun: polls this rank's processes and the other ranks' mailboxes
 * until some job ends (every 50 ms). */
static int poll_ended(sweep_state *s)
{
    for (;;) {
        int status, ended = 0;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
            for (int i = 0; i < s->nslots; i++)
                if (s->slots[i].pid == pid) {
                    int rc = job_ended(s, &s->slots[i], status);
                    if (rc != CLI_OK)
                        return rc;
                    ended++;
                }
        if (pid < 0 && errno != ECHILD && errno != EINTR)
            return cli_fail("sweep: waitpid: %s", strerror(errno));
        for (int i = 0; i < s->nslots; i++) {
            slot *sl = &s->slots[i];
            int got = sl->pid == -1 ? sweep_ranks_collect(s->cfg->o.dir, sl->rank, sl->rslot, &status) : 0;
            if (got < 0)
                return CLI_FAIL;
            if (got) {
                int rc = job_ended(s, sl, status);
                if (rc != CLI_OK)
                    return rc;
                ended++;
            }
        }
        if (ended)
            return CLI_OK;
        usleep(50000);
    }
}

/* Runs jobs on the free slots until the search ends. */
static int run_loop(sweep_state *s)
{
    for (;;) {
        int running = 0;
        for (int i = 0; i < s->nslots; i++) {
            sw_job job;
            while (s->slots[i].pid == 0 && sw_next(&s->sched, &job) == SW_JOB) {
                int rc = start_job(s, &s->slots[i], &job);
                if (rc != CLI_OK)
                    return rc;
            }
            running += s->slots[i].pid != 0;
        }
        if (!running) /* nothing runs, so the search has nothing left to hand out */
            return CLI_OK;
        int rc = s->nranks > 1 ? poll_ended(s) : wait_ended(s);
        if (rc != CLI_OK)
            return rc;
    }
}

/* mpirun, a rank other than 0: runs the jobs rank 0 posts to its slots and
 * posts back how their processes ended, until rank 0 says the end. */
static int worker_loop(sweep_state *s)
{
    const char *dir = s->cfg->o.dir;
    for (;;) {
        int busy = 0;
        for (int i = 0; i < s->nslots; i++) {
            slot *sl = &s->slots[i];
            int got = sl->pid == 0 ? sweep_ranks_take(dir, s->rank, i, &sl->job) : 0;
            if (got < 0 || (got && spawn_local(s, sl)))
                return CLI_FAIL;
            busy += sl->pid != 0;
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
            for (int i = 0; i < s->nslots; i++)
                if (s->slots[i].pid == pid) {
                    s->slots[i].pid = 0;
                    if (sweep_ranks_done(dir, s->rank, i, status))
                        return CLI_FAIL;
                }
        if (!busy && sweep_ranks_ended(dir))
            return CLI_OK;
        usleep(50000);
    }
}

// ---- set-up ----

/* The search space, the model text (DIR/model.cfg on resume) and the schedule. */
static int setup_search(sweep_state *s)
{
    const sweep_opts *o = &s->cfg->o;
    char why[1024];
    for (int i = 0; i < s->cfg->nspecs; i++)
        if (sw_space_add(&s->space, s->cfg->specs[i], why, sizeof why))
            return cli_usage_error("sweep", "%s", why);
    if (o->space && read_space_file(o->space, &s->space) != CLI_OK)
        return CLI_USAGE;
    FILE *f = fopen(o->c.model, "rb");
    if (!f)
        return cli_fail("sweep: %s: %s", o->c.model, strerror(errno));
    s->model_text = calloc(1, 1 << 20);
    size_t n = s->model_text ? fread(s->model_text, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!s->model_text)
        return cli_fail("sweep: out of memory");
    if (memchr(s->model_text, 0, n) || n == (1 << 20) - 1)
        return cli_fail("sweep: %s: not a model file (text under 1 MiB; an ONNX model cannot be searched)",
                        o->c.model);
    if (sweep_check_layers(s->model_text, &s->space, why, sizeof why))
        return cli_usage_error("sweep", "%s (in %s)", why, o->c.model);
    sw_setup u = {.method = !strcmp(o->method, "grid") ? SW_GRID : !strcmp(o->method, "random") ? SW_RANDOM : SW_ASHA,
                  .async = strcmp(o->promotion, "async") == 0, .trials = o->trials, .grid_points = o->grid_points,
                  .min_epochs = o->min_epochs, .max_epochs = o->max_epochs, .reduction = o->reduction,
                  .seed = (uint64_t)o->seed};
    if (sw_sched_init(&s->sched, &s->space, &u, why, sizeof why))
        return cli_usage_error("sweep", "%s", why);
    s->run = (sweep_run){.dir = o->dir, .space = &s->space, .sched = &s->sched, .model_text = s->model_text,
                         .metric = o->metric, .maximize = strcmp(o->metric, "val_acc") == 0};
    return CLI_OK;
}

static int mkdir_p(const char *path)
{
    char p[4200];
    snprintf(p, sizeof p, "%s", path);
    for (char *c = p + 1; *c; c++)
        if (*c == '/') {
            *c = 0;
            if (mkdir(p, 0755) && errno != EEXIST)
                return -1;
            *c = '/';
        }
    return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

/* A new sweep: DIR made, the model and options saved. A resumed one: its
 * results replayed into the search. */
static int prepare_dir(sweep_state *s)
{
    const sweep_opts *o = &s->cfg->o;
    char path[4200], why[1024];
    snprintf(path, sizeof path, "%s/sweep.args", o->dir);
    if (!o->resume) {
        if (access(path, F_OK) == 0)
            return cli_usage_error("sweep", "%s already holds a sweep: --resume continues it, another --dir "
                                            "starts a new one", o->dir);
        if (mkdir_p(o->dir))
            return cli_fail("sweep: %s: %s", o->dir, strerror(errno));
        snprintf(path, sizeof path, "%s/model.cfg", o->dir);
        if (clg_write_file_atomic(path, s->model_text, strlen(s->model_text)) != CLG_OK)
            return cli_fail("sweep: %s", clg_last_error(NULL));
        return save_args(s->cfg, &s->space);
    }
    if (sweep_results_read(&s->run, why, sizeof why))
        return cli_fail("sweep: --resume: %s", why);
    for (int k = 0; k < s->run.nrows; k++) {
        const sweep_row *w = &s->run.rows[k];
        sw_replay(&s->sched, w->trial, w->rung, w->failed ? NAN : sweep_score(&s->run, w), w->failed);
        s->epochs_done += job_epochs(&s->sched, w->rung);
    }
    fprintf(stderr, "sweep: resuming %s: %d finished job(s) kept\n", o->dir, s->run.nrows);
    return CLI_OK;
}

/* The selected devices as indexes over every device (what a trial's
 * --devices takes), in groups of --devices-per-trial; and the first trial's
 * model built once, so a bad key is refused before any trial starts. */
static int make_slots(sweep_state *s)
{
    const sweep_opts *o = &s->cfg->o;
    int rc = CLI_OK;
    clg_ctx *all = cli_ctx_open("all", o->c.verbose, &rc);
    clg_ctx *sel = all && o->c.devices ? cli_ctx_open(o->c.devices, o->c.verbose, &rc) : all;
    if (!sel) {
        clg_ctx_destroy(all);
        return rc;
    }
    int n = clg_device_count(sel), na = clg_device_count(all), idx[64], k = 0;
    for (int i = 0; i < n && k < 64; i++) {
        clg_device_info a, b;
        clg_device_info_get(sel, i, &a);
        for (int j = 0; j < na; j++)
            if (clg_device_info_get(all, j, &b) == CLG_OK && a.platform_index == b.platform_index &&
                a.device_index == b.device_index)
                idx[k++] = j;
    }
    char *text = sweep_model_text(s->model_text, &s->space, &s->sched.t[0], 0);
    clg_model_params mp;
    clg_model_params_init(&mp);
    clg_model *m = NULL;
    if (!text)
        rc = cli_fail("sweep: out of memory");
    else if (clg_model_create_string(sel, text, "trial 0", &mp, &m) != CLG_OK) {
        char names[512] = "";
        for (int i = 0; i < s->space.n; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s=%s", i ? " " : "",
                     s->space.p[i].name, s->sched.t[0].val[i]);
        rc = cli_usage_error("sweep", "the model with the first trial's parameters (%s) is refused: %s", names,
                             clg_last_error(sel));
    }
    clg_model_destroy(m);
    free(text);
    if (sel != all)
        clg_ctx_destroy(sel);
    clg_ctx_destroy(all);
    if (rc != CLI_OK)
        return rc;
    if (o->per_trial > k)
        return cli_usage_error("sweep", "--devices-per-trial %d: only %d device(s) selected", o->per_trial, k);
    s->nslots = k / o->per_trial;
    s->slots = calloc((size_t)s->nslots, sizeof *s->slots);
    if (!s->slots)
        return cli_fail("sweep: out of memory");
    for (int i = 0; i < s->nslots; i++)
        for (int d = 0; d < o->per_trial; d++) {
            size_t len = strlen(s->slots[i].devices);
            snprintf(s->slots[i].devices + len, sizeof s->slots[i].devices - len, "%s%d", d ? "," : "",
                     idx[i * o->per_trial + d]);
        }
    return CLI_OK;
}

typedef struct rank_hello {
    char host[256];
    int n;
    char groups[64][32];
} rank_hello;

/* mpirun: the ranks meet (rank 0 has made the directory and emptied
 * DIR/ranks/). Each says its host and device groups; the ranks on one
 * host share its groups out (the l-th of L ranks there takes groups l,
 * l + L, ...), so ranks beside each other never run two trials on one
 * device. Rank 0 gets a slot for every rank's groups, the others their own. */
static int meet_ranks(sweep_state *s)
{
    const char *dir = s->cfg->o.dir;
    char host[256] = "";
    if (clg_mpi_barrier() != CLG_OK)
        return cli_fail("sweep: %s", clg_last_error(NULL));
    if (gethostname(host, sizeof host - 1))
        snprintf(host, sizeof host, "?");
    rank_hello *h = calloc((size_t)s->nranks, sizeof *h);
    slot *ns = calloc((size_t)s->nranks * 64, sizeof *ns);
    if (!h || !ns) {
        free(h);
        free(ns);
        return cli_fail("sweep: out of memory");
    }
    for (int i = 0; i < s->nslots; i++)
        snprintf(h[0].groups[i], sizeof h[0].groups[i], "%s", s->slots[i].devices);
    int rc = sweep_ranks_hello(dir, s->rank, host, s->nslots, (const char(*)[32])h[0].groups) ? CLI_FAIL : CLI_OK;
    if (rc == CLI_OK && clg_mpi_barrier() != CLG_OK)
        rc = cli_fail("sweep: %s", clg_last_error(NULL));
    for (int r = 0; r < s->nranks && rc == CLI_OK; r++)
        if (sweep_ranks_read_hello(dir, r, h[r].host, sizeof h[r].host, &h[r].n, h[r].groups, 64))
            rc = CLI_FAIL;
    int k = 0;
    for (int r = 0; r < s->nranks && rc == CLI_OK; r++) {
        if (s->rank != 0 && r != s->rank)
            continue;
        int l = 0, L = 0, idx = 0;
        for (int q = 0; q < s->nranks; q++)
            if (strcmp(h[q].host, h[r].host) == 0) {
                L++;
                l += q < r;
            }
        for (int g = l; g < h[r].n; g += L, k++) {
            ns[k].rank = r;
            ns[k].rslot = idx++;
            snprintf(ns[k].devices, sizeof ns[k].devices, "%s", h[r].groups[g]);
        }
    }
    free(h);
    if (rc != CLI_OK) {
        free(ns);
        return rc;
    }
    free(s->slots);
    s->slots = ns;
    s->nslots = k;
    if (k == 0 && s->rank != 0)
        fprintf(stderr, "sweep: rank %d: no device group left to it on its host; it runs no trial\n", s->rank);
    return CLI_OK;
}

/* The sweep's line on stderr, then the run; under mpirun, rank 0 ends the
 * other ranks' loops when the search is over. */
static int run_sweep(sweep_state *s)
{
    const sweep_opts *o = &s->cfg->o;
    if (s->rank != 0)
        return worker_loop(s);
    fprintf(stderr, "sweep: %d trial(s), %s%s, %d job(s) at a time on device(s)", s->sched.ntrials, o->method,
            strcmp(o->method, "asha") ? "" : !strcmp(o->promotion, "sync") ? " (sync)" : " (async)", s->nslots);
    for (int i = 0; i < s->nslots; i++) {
        if (s->nranks > 1)
            fprintf(stderr, " r%d:%s%s", s->slots[i].rank, s->slots[i].devices, i + 1 < s->nslots ? "," : "");
        else
            fprintf(stderr, " %s%s", s->slots[i].devices, i + 1 < s->nslots ? "," : "");
    }
    fprintf(stderr, "; budget %ld epochs%s\n", sw_budget_epochs(&s->sched),
            s->nranks > 1 ? " (under mpirun: rank 0 hands out the jobs)" : "");
    s->t0 = cli_now();
    int rc = run_loop(s);
    if (s->nranks > 1 && sweep_ranks_end(o->dir) && rc == CLI_OK)
        rc = CLI_FAIL;
    if (rc == CLI_OK && sweep_finish(&s->run, o->c.json, cli_now() - s->t0) == 0)
        rc = cli_fail("sweep: every trial failed (see %s/results.csv and the trials' train.log)", o->dir);
    return rc;
}

int cmd_sweep(int argc, char **argv)
{
    sweep_cfg *cfg = calloc(1, sizeof *cfg);
    sweep_state *s = calloc(1, sizeof *s);
    int rc = cfg && s ? parse_options(cfg, argc, argv) : cli_fail("sweep: out of memory");
    if (rc == CLI_OK) {
        s->cfg = cfg;
        s->rank = clg_mpi_rank();
        s->nranks = clg_mpi_size();
        rc = setup_search(s);
    }
    if (rc == CLI_OK) {
        ssize_t n = readlink("/proc/self/exe", s->self, sizeof s->self - 1);
        if (n <= 0)
            rc = cli_fail("sweep: cannot find the clgrad program (/proc/self/exe) to run the trials");
        else
            s->self[n] = 0;
    }
    if (rc == CLI_OK)
        rc = make_slots(s);
    if (rc == CLI_OK && s->rank == 0)
        rc = prepare_dir(s);
    if (rc == CLI_OK && s->rank == 0 && s->nranks > 1 && sweep_ranks_reset(cfg->o.dir))
        rc = CLI_FAIL;
    if (rc == CLI_OK && s->nranks > 1)
        rc = meet_ranks(s);
    if (rc == CLI_OK)
        rc = run_sweep(s);
    if (s) {
        sw_sched_free(&s->sched);
        free(s->run.rows);
        free(s->model_text);
        free(s->slots);
    }
    if (cfg)
        free(cfg->saved);
    free(cfg);
    free(s);
    return rc == CLI_HELP ? CLI_OK : rc;
}
