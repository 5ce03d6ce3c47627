/* clgrad bench start --model MODEL [--warm N] [--devices SEL] [--json]:
 * time to the first training step, cold and warm. Each run is a fresh
 * process (`clgrad bench train --steps 3 --warmup 0 --json`) with the caches
 * in a new temporary directory: the first run finds them empty (cold: our
 * caches and PoCL's kernel cache), the next N find what it left (warm). */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_opts.h"

typedef struct start_opts {
    cli_common c;
    long warm;
    int keep;
} start_opts;

static const cli_opt opts[] = {
    CLI_OPT_MODEL,
    CLI_INT_OPT("--warm", start_opts, warm, 0, 100, "N", "warm runs after the cold one (default 3; the median is reported)"),
    CLI_INT_OPT("--batch", cli_common, batch, 1, CLI_BATCH_MAX, "N", "batch size (default 128)"),
    CLI_OPT_DEVICES,
    CLI_FLAG_OPT("--keep", start_opts, keep, 1, "keep the cache directory (its path is printed)"),
    CLI_FLAG_OPT("--json", cli_common, json, 1, "one JSON object"),
    CLI_END,
};

const cli_spec cli_spec_bench_start = {
    .name = "bench start",
    .synopsis = "--model MODEL [--warm N] [--batch N] [--devices SEL] [--keep] [--json]",
    .about = "Time to the first training step of a new process, cold (empty program, tuning,\n"
             "convolution-algorithm and PoCL kernel caches) and warm (what the cold run left).\n"
             "The caches live in a new directory under $TMPDIR (CLGRAD_CACHE_DIR, POCL_CACHE_DIR).",
    .opts = opts,
    .notes = "Each run is `clgrad bench train --steps 3 --warmup 0`: its second step measures the\n"
             "convolution algorithms of shapes not measured before, so warm runs find every choice.\n"
             "to_first_step: from the process start to the end of its first step (waited for);\n"
             "setup: model creation; first_step: the step itself; process: the whole process\n"
             "(with the measurements and, on PoCL, the program-binary cache writes at exit);\n"
             "CPU to step 1: CPU time of the process (all threads) by then, which other load moves less.",
};

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    double to_first_step, setup, first_step, process, cpu;
} start_run;

static int json_num(const char *s, const char *key, double *v)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(s, pat);
    if (!p)
        return 0;
    char *end = NULL;
    *v = strtod(p + strlen(pat), &end);
    return end != p + strlen(pat);
}

/* Runs one child and fills r; 0 on success. */
/* environ without CLGRAD_CACHE, CLGRAD_CACHE_DIR and POCL_CACHE_DIR, plus
 * the two directories given (caches on: that is what is measured); for the
 * children only, this process's environment is not changed. NULL: no memory. */
static char **child_env(const char *cache_dir, const char *pocl_dir)
{
    extern char **environ;
    static const char *const drop[] = {"CLGRAD_CACHE=", "CLGRAD_CACHE_DIR=", "POCL_CACHE_DIR="};
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 3, sizeof *env);
    char *a = malloc(strlen(cache_dir) + 32), *b = malloc(strlen(pocl_dir) + 32);
    if (!env || !a || !b) {
        free(env), free(a), free(b);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int dropped = 0;
        for (size_t j = 0; j < sizeof drop / sizeof drop[0]; j++)
            dropped |= strncmp(environ[i], drop[j], strlen(drop[j])) == 0;
        if (!dropped)
            env[k++] = environ[i];
    }
    sprintf(a, "CLGRAD_CACHE_DIR=%s", cache_dir);
    sprintf(b, "POCL_CACHE_DIR=%s", pocl_dir);
    env[k++] = a;
    env[k++] = b;
    env[k] = NULL;
    return env;
}

static int run_child(const char *self, const char *model, const char *batch, const char *devices, char **envp,
                     start_run *r)
{
    int fd[2];
    if (pipe(fd) != 0) {
        fprintf(stderr, "clgrad: bench start: pipe: %s\n", strerror(errno));
        return -1;
    }
    const char *argv[16];
    int a = 0;
    argv[a++] = self;
    argv[a++] = "bench";
    argv[a++] = "train";
    argv[a++] = "--model";
    argv[a++] = model;
    argv[a++] = "--batch";
    argv[a++] = batch;
    argv[a++] = "--steps"; /* the second step measures new convolution shapes (deferred), so warm runs find them */
    argv[a++] = "3";
    argv[a++] = "--warmup";
    argv[a++] = "0";
    argv[a++] = "--json";
    if (devices) {
        argv[a++] = "--devices";
        argv[a++] = devices;
    }
    argv[a] = NULL;
    fflush(NULL);
    double t0 = mono();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "clgrad: bench start: fork: %s\n", strerror(errno));
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execve(self, (char *const *)argv, envp);
        _exit(127);
    }
    close(fd[1]);
    char out[8192];
    size_t n = 0;
    for (;;) {
        ssize_t k = read(fd[0], out + n, sizeof out - 1 - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        n += (size_t)k;
        if (n == sizeof out - 1)
            break;
    }
    out[n] = 0;
    close(fd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    r->process = mono() - t0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "clgrad: bench start: the training process failed (%s %d)\n",
                WIFEXITED(status) ? "exit status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        return -1;
    }
    double end = 0;
    if (!json_num(out, "setup_s", &r->setup) || !json_num(out, "first_step_s", &r->first_step) ||
        !json_num(out, "first_step_end", &end) || !json_num(out, "first_step_cpu_s", &r->cpu)) {
        fprintf(stderr, "clgrad: bench start: no start-up fields in the training process's output\n");
        return -1;
    }
    r->to_first_step = end - t0;
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int cmp_run(const void *a, const void *b)
{
    double x = ((const start_run *)a)->to_first_step, y = ((const start_run *)b)->to_first_step;
    return x < y ? -1 : x > y;
}

static void print_run_json(const char *name, const start_run *r)
{
    printf("\"%s\": {\"to_first_step_s\": %.3f, \"setup_s\": %.3f, \"first_step_s\": %.3f, \"process_s\": %.3f, "
           "\"cpu_to_first_step_s\": %.3f}",
           name, r->to_first_step, r->setup, r->first_step, r->process, r->cpu);
}

int bench_start(int argc, char **argv)
{
    start_opts o = {.warm = 3, .c.batch = 128};
    CLI_PARSE(&cli_spec_bench_start, argc, argv, &o);
    const char *model = o.c.model, *devices = o.c.devices;
    char batch[32];
    snprintf(batch, sizeof batch, "%d", o.c.batch);
    long warm = o.warm;
    int json = o.c.json, keep = o.keep;
    if (!model)
        return cli_usage_error("bench start", "missing --model FILE");
    model = cli_model_resolve(model);
    int rc = cli_model_file_check("bench start", model);
    if (rc != CLI_OK)
        return rc;
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0)
        return cli_fail("bench start: cannot find this program (/proc/self/exe): %s", strerror(errno));
    self[sl] = 0;
    const char *tmp = getenv("TMPDIR");
    char dir[4096], pocl[4200];
    snprintf(dir, sizeof dir, "%s/clgrad-start-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return cli_fail("bench start: cannot create a cache directory %s: %s", dir, strerror(errno));
    snprintf(pocl, sizeof pocl, "%s/pocl", dir);
    char **envp = child_env(dir, pocl);
    if (!envp)
        return cli_fail("bench start: out of memory");
    start_run cold, runs[100];
    int ok = run_child(self, model, batch, devices, envp, &cold) == 0;
    for (long i = 0; ok && i < warm; i++)
        ok = run_child(self, model, batch, devices, envp, &runs[i]) == 0;
    size_t ne = 0;
    while (envp[ne])
        ne++;
    free(envp[ne - 1]); /* the two strings child_env added, last */
    free(envp[ne - 2]);
    free(envp);
    if (!keep)
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (!ok)
        return CLI_FAIL;
    start_run med = {0};
    if (warm > 0) {
        start_run sorted[100];
        memcpy(sorted, runs, (size_t)warm * sizeof *runs);
        qsort(sorted, (size_t)warm, sizeof *sorted, cmp_run);
        med = sorted[warm / 2];
    }
    if (json) {
        printf("{\"model\": ");
        cli_json_str(model);
        printf(", \"batch\": %s, ", batch);
        print_run_json("cold", &cold);
        if (warm > 0) {
            printf(", ");
            print_run_json("warm", &med);
            printf(", \"warm_to_first_step_s\": [");
            for (long i = 0; i < warm; i++)
                printf("%s%.3f", i ? ", " : "", runs[i].to_first_step);
            printf("]");
        }
        printf("}\n");
    } else {
        printf("model %s  batch %s  (time to the end of the first step, from the process start)\n", model, batch);
        printf("%-18s %10s %10s %12s %10s %12s\n", "", "to step 1", "setup", "first step", "process",
               "CPU to step 1");
        printf("%-18s %9.3fs %9.3fs %11.3fs %9.3fs %11.3fs\n", "cold", cold.to_first_step, cold.setup, cold.first_step,
               cold.process, cold.cpu);
        if (warm > 0) {
            char lab[48];
            snprintf(lab, sizeof lab, "warm (median of %ld)", warm);
            printf("%-18s %9.3fs %9.3fs %11.3fs %9.3fs %11.3fs\n", lab, med.to_first_step, med.setup, med.first_step,
                   med.process, med.cpu);
        }
        if (keep)
            printf("caches kept in %s\n", dir);
    }
    return CLI_OK;
}
