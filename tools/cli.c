/* Shared helpers for the clgrad command-line program. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "clgrad %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'clgrad %s --help')\n", cmd);
    va_end(ap);
    return CLI_USAGE;
}

int cli_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "clgrad: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return CLI_FAIL;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_is_help(const char *arg) { return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0; }

static clg_options *g_options; /* --set and the flags that map onto options */

clg_options *cli_options(void) { return g_options; }

static int option_index(const char *name)
{
    clg_option_info info;
    for (int i = 0; i < clg_options_count(); i++)
        if (clg_option_info_get(NULL, i, &info) == CLG_OK && strcmp(info.name, name) == 0)
            return i;
    return -1;
}

int cli_option_set(const char *flag, const char *name, const char *value)
{
    if (!g_options && clg_options_create(&g_options) != CLG_OK)
        return cli_fail("%s", clg_last_error(NULL));
    if (clg_options_set(g_options, name, value) != CLG_OK) {
        fprintf(stderr, "clgrad: %s: %s\n", flag, clg_last_error(NULL));
        return CLI_USAGE;
    }
    return CLI_OK;
}

int cli_mpi_setup(double timeout_s, int deterministic)
{
    clg_mpi_configure(timeout_s, deterministic);
    return deterministic ? cli_option_set("--deterministic", "conv_auto_measure", "0") : CLI_OK;
}

void cli_option_default(const char *name, const char *value)
{
    clg_options *env = NULL;
    clg_option_info info;
    int i = option_index(name);
    if (i < 0 || clg_options_create(&env) != CLG_OK)
        return;
    clg_options_read_env(env); /* a bad value is reported by clg_ctx_create */
    int free_ = clg_option_info_get(env, i, &info) == CLG_OK && info.source == CLG_OPTION_DEFAULT;
    clg_options_destroy(env);
    if (free_ && g_options && clg_option_info_get(g_options, i, &info) == CLG_OK)
        free_ = info.source == CLG_OPTION_DEFAULT;
    if (free_)
        cli_option_set("default", name, value);
}

const char *cli_option_value(const clg_ctx *ctx, const char *name, char *buf, size_t n)
{
    clg_option_info info;
    int i = option_index(name);
    snprintf(buf, n, "%s", i >= 0 && clg_option_info_get(clg_ctx_options(ctx), i, &info) == CLG_OK ? info.value : "");
    return buf;
}

clg_ctx *cli_ctx_open(const char *devices, int verbose, int *rc)
{
    if (rc)
        *rc = CLI_OK;
    /* one model per process: a new convolution shape runs the untuned default
     * at its first use and is measured at its second (shorter cold start;
     * src/ops/conv_impl.h, clg_conv_auto_choose), unless the caller set it */
    cli_option_default("conv_auto_defer", "1");
    clg_ctx_params p;
    clg_ctx_params_init(&p);
    p.devices = devices;
    p.verbose = verbose;
    p.options = g_options;
    clg_ctx *ctx = NULL;
    clg_status st = clg_ctx_create(&p, &ctx);
    if (st != CLG_OK) {
        fprintf(stderr, "clgrad: %s: %s\n", clg_status_string(st), clg_last_error(NULL));
        if (rc)
            *rc = st == CLG_ERR_INVALID_ARG ? CLI_USAGE : CLI_FAIL;
        return NULL;
    }
    return ctx;
}

int cli_model_arg(const char *cmd, const char *arg, const char **model)
{
    if (arg[0] == '-' && arg[1])
        return cli_usage_error(cmd, "unknown option '%s'", arg);
    if (*model)
        return cli_usage_error(cmd, "more than one model file ('%s' and '%s')", *model, arg);
    *model = cli_model_resolve(arg);
    if (*model == arg && !strchr(arg, '/') && access(arg, F_OK) != 0) /* neither a file nor a shipped model */
        return cli_fail("%s: %s", cmd, clg_last_error(NULL));
    return cli_model_file_check(cmd, *model);
}

const char *cli_model_resolve(const char *arg)
{
    /* a shipped model by name: `clgrad train lenet5` from any directory */
    static char found[4][4096];
    static int nfound;
    if (nfound < 4 && clg_model_find(arg, found[nfound], sizeof found[0]) == CLG_OK)
        return found[nfound++];
    return arg; /* a missing file is reported by the library */
}

int cli_model_file_check(const char *cmd, const char *path)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return CLI_OK; /* a missing file is reported by the library */
    struct stat sb;
    int rc = CLI_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = cli_fail("%s: model file '%s' is %s, not a regular file", cmd, path,
                      S_ISDIR(sb.st_mode) ? "a directory" : S_ISFIFO(sb.st_mode) ? "a FIFO" : "not readable");
        close(fd);
        return rc;
    }
    /* content (text with no NUL byte, or ONNX) is checked by the library, which
     * names the offset of a NUL byte in a text model file */
    close(fd);
    return rc;
}

clg_model *cli_model_open(const char *cmd, const char *model, const char *weights, const char *devices, int batch,
                          clg_ctx **ctx, int *rc)
{
    return cli_model_open_pipe(cmd, model, weights, devices, batch, NULL, ctx, rc);
}

clg_model *cli_model_open_pipe(const char *cmd, const char *model, const char *weights, const char *devices,
                               int batch, const clg_model_params *pipe, clg_ctx **ctx, int *rc)
{
    *ctx = cli_ctx_open(devices, 0, rc);
    if (!*ctx)
        return NULL;
    clg_model_params mp;
    clg_model_params_init(&mp);
    mp.batch = batch;
    mp.devices = "all"; /* eval / predict split their batches over the selected devices */
    if (pipe) { /* or run them through a pipeline's stages in order */
        mp.parallel = pipe->parallel;
        mp.stages = pipe->stages;
        mp.microbatches = pipe->microbatches;
        mp.pipe_schedule = pipe->pipe_schedule;
        mp.pipe_recompute = pipe->pipe_recompute;
    }
    clg_model *m = NULL;
    clg_status st = clg_model_create_file(*ctx, model, &mp, &m);
    if (st == CLG_OK && !weights && !clg_model_has_file_weights(m)) {
        *rc = cli_usage_error(cmd, "missing --weights FILE (only an ONNX model file carries its weights)");
        clg_model_destroy(m);
        clg_ctx_destroy(*ctx);
        *ctx = NULL;
        return NULL;
    }
    if (st == CLG_OK && weights) /* a weights file replaces those an ONNX model came with */
        st = clg_model_load_weights(m, weights);
    if (st != CLG_OK) {
        *rc = cli_fail("%s: %s", cmd, clg_last_error(*ctx));
        clg_model_destroy(m);
        clg_ctx_destroy(*ctx);
        *ctx = NULL;
        return NULL;
    }
    return m;
}

void cli_json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", (unsigned char)*s);
        else
            putchar(*s);
    }
    putchar('"');
}
