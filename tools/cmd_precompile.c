/* clgrad precompile MODEL: builds and compiles the kernels a training step
 * of MODEL launches, so a later run starts warm; and the background helper
 * `clgrad train` / `clgrad bench train` start on a cold cache (see
 * cli_precompile_spawn). */
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "cli.h"
#include "cli_opts.h"

extern char **environ;

static const char *const orders[] = {"forward", "reverse", NULL};

typedef struct precompile_opts {
    cli_common c;
    const char *order;
    int background;
} precompile_opts;

static const cli_opt opts[] = {
    CLI_OPT_MODEL,
    CLI_INT_OPT("--batch", cli_common, batch, 1, CLI_BATCH_MAX, "N",
                "batch size (default: the model file's, as for train; bench train\n"
                "uses 128 unless given --batch)"),
    CLI_OPT_DEVICES,
    CLI_OPT_PRECISION,
    CLI_CHOICE_OPT("--order", precompile_opts, order, orders, "O",
                   "forward (default) or reverse: the layers from the last to the first"),
    CLI_FLAG_OPT("--background", precompile_opts, background, 1,
                 "the helper mode train starts itself (see below): reverse order,\n"
                 "nothing printed"),
    CLI_OPT_VERBOSE,
    CLI_END,
};

const cli_spec cli_spec_precompile = {
    .name = "precompile",
    .synopsis = "MODEL [--batch N] [--devices SEL] [--precision P] [--order O]",
    .about = "Builds and compiles every kernel a training step of MODEL launches (each layer's\n"
             "forward and backward once on zeros, then steps with learning rate 0, the second\n"
             "measuring the convolution algorithms of new shapes), so that a later `clgrad train`\n"
             "or `bench train` with the same model, batch and devices starts with warm caches.\n"
             "Nothing is trained or written besides the caches.",
    .opts = opts,
    .positional = cli_model_positional,
    .notes = "On a cold cache, `clgrad train` and `clgrad bench train` run this in a second process\n"
             "(reverse order, one PoCL thread, caches read-only, untuned convolution defaults)\n"
             "while they take their first step front to back: a PoCL process compiles one kernel\n"
             "at a time, two processes compile two, and each finds the other's in PoCL's kernel\n"
             "cache. They stop it when their first step has ended (every kernel is built then,\n"
             "and it would only compete with algorithm timing and the steps after).\n"
             "CLGRAD_PRECOMPILE=0 (--set precompile=0) turns the helper off, =1 starts it\n"
             "even on a warm cache; by default it runs on PoCL devices with at least 2 CPUs online, outside MPI jobs.",
};

int cmd_precompile(int argc, char **argv)
{
    precompile_opts o = {.order = "forward"};
    CLI_PARSE(&cli_spec_precompile, argc, argv, &o);
    const char *model = o.c.model, *devices = o.c.devices, *precision = o.c.precision;
    const char *order = o.background ? "reverse" : o.order;
    int verbose = o.c.verbose, background = o.background;
    long batch = o.c.batch;
    if (!model)
        return cli_usage_error("precompile", "missing MODEL");
#ifdef __linux__
    /* the helper ends with the trainer that started it, even a killed one */
    if (background && (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() == 1))
        return CLI_FAIL;
#endif
    model = cli_model_resolve(model);
    int rc = cli_model_file_check("precompile", model);
    if (rc != CLI_OK)
        return rc;
    double t0 = cli_now();
    clg_ctx *ctx = cli_ctx_open(devices, verbose, &rc);
    if (!ctx)
        return rc;
    clg_model_params mp;
    clg_model_params_init(&mp);
    mp.batch = (int)batch;
    mp.devices = "all";
    mp.precision = precision;
    clg_model *m = NULL;
    clg_status st = clg_model_create_file(ctx, model, &mp, &m);
    if (st == CLG_OK)
        st = clg_model_precompile(m, strcmp(order, "reverse") == 0, !background);
    /* A second step (learning rate 0) measures the convolution algorithms of
     * shapes without a stored choice, as a training run's second step would,
     * so the later run finds those too. The helper leaves that to training. */
    if (st != CLG_OK) {
        int code = background ? CLI_FAIL : cli_fail("precompile: %s", clg_last_error(ctx));
        clg_model_destroy(m);
        clg_ctx_destroy(ctx);
        return code;
    }
    clg_model_destroy(m);
    clg_ctx_destroy(ctx); /* stores the program binaries (unless the cache is read-only) */
    if (!background)
        printf("precompiled %s in %.2f s\n", model, cli_now() - t0);
    return CLI_OK;
}

/* Cold: the binary cache has no copy of a program every training step
 * builds (the element-wise kernels) for the first device. Without a binary
 * cache coldness is unknown: no helper. */
static int cache_cold(clg_ctx *ctx) { return clg_ctx_cache_warm(ctx) == 0; }

static int pocl_only(clg_ctx *ctx)
{
    int n = clg_device_count(ctx);
    for (int i = 0; i < n; i++) {
        clg_device_info d;
        if (clg_device_info_get(ctx, i, &d) != CLG_OK || !strcasestr(d.platform, "Portable Computing Language"))
            return 0;
    }
    return n > 0;
}

pid_t cli_precompile_spawn(clg_ctx *ctx, const char *model, int batch, const char *devices, const char *precision,
                           int verbose)
{
    char mode[16]; /* option precompile: auto,0,1 */
    cli_option_value(ctx, "precompile", mode, sizeof mode);
    int force = strcmp(mode, "1") == 0;
    if (strcmp(mode, "0") == 0 || !ctx || clg_mpi_size() > 1 || getenv("OMPI_COMM_WORLD_SIZE"))
        return 0;
    if (!force && (sysconf(_SC_NPROCESSORS_ONLN) < 2 || !pocl_only(ctx) || !cache_cold(ctx)))
        return 0;
    char bs[32];
    snprintf(bs, sizeof bs, "%d", batch);
    char *argv[16];
    int a = 0;
    argv[a++] = (char *)"clgrad";
    argv[a++] = (char *)"precompile";
    argv[a++] = (char *)"--background";
    argv[a++] = (char *)"--model";
    argv[a++] = (char *)model;
    if (batch > 0) {
        argv[a++] = (char *)"--batch";
        argv[a++] = bs;
    }
    if (devices) {
        argv[a++] = (char *)"--devices";
        argv[a++] = (char *)devices;
    }
    if (precision) {
        argv[a++] = (char *)"--precision";
        argv[a++] = (char *)precision;
    }
    argv[a] = NULL;
    /* the environment, with the helper's settings replacing any of the same name */
    /* CLGRAD_CONV_AUTO_MEASURE=0: the helper compiles the untuned defaults a
     * first step runs; measuring algorithms is the training process's job
     * (the helper's timings would be thrown away and would disturb those). */
    static const char *const set[] = {"CLGRAD_CACHE=ro", "CLGRAD_PRECOMPILE=0", "POCL_MAX_PTHREAD_COUNT=1",
                                      "CLGRAD_CONV_AUTO_MEASURE=0"};
    const size_t nset = sizeof set / sizeof set[0];
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + nset + 1, sizeof *env);
    if (!env)
        return 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int replaced = 0;
        for (size_t j = 0; j < nset && !replaced; j++)
            replaced = strncmp(environ[i], set[j], strchr(set[j], '=') - set[j] + 1) == 0;
        if (!replaced)
            env[k++] = environ[i];
    }
    for (size_t j = 0; j < nset; j++)
        env[k++] = (char *)set[j];
    env[k] = NULL;
    posix_spawn_file_actions_t fa;
    pid_t pid = 0;
    if (posix_spawn_file_actions_init(&fa) == 0) {
        if (posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0) == 0 &&
            posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0) == 0 &&
            posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, env) != 0)
            pid = 0;
        posix_spawn_file_actions_destroy(&fa);
    }
    free(env);
    if (pid > 0 && verbose >= 2)
        fprintf(stderr, "clgrad: started background precompile (pid %d) for %s\n", (int)pid, model);
    return pid > 0 ? pid : 0;
}

int cli_precompile_stop(pid_t pid)
{
    if (pid <= 0)
        return 0;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == 0) { /* still compiling: no longer needed */
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
        return 1;
    }
    return 0;
}

void cli_precompile_stop_cb(void *user)
{
    pid_t *pid = user;
    cli_precompile_stop(*pid);
    *pid = 0;
}
