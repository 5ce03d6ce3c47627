/* Shared helpers for the clgrad command-line program. */
#ifndef CLG_CLI_H
#define CLG_CLI_H

#include <stdio.h>
#include <sys/types.h>

#include "clgrad.h"

/* Exit codes. */
#define CLI_OK 0
#define CLI_FAIL 1
#define CLI_USAGE 2

typedef int (*cli_cmd_fn)(int argc, char **argv);

/* A subcommand: argv[0] is the subcommand's name. */
typedef struct cli_cmd {
    const char *name;
    cli_cmd_fn fn;
    const char *summary;
} cli_cmd;

/* Prints "clgrad CMD: message" and a hint to stderr; returns CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "clgrad: message" to stderr; returns CLI_FAIL. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints s to stdout as a JSON string, quotes included (\" \\ and control
 * characters escaped). */
void cli_json_str(const char *s);

/* Options are declared in tables and parsed by cli_parse (cli_opts.h). */
int cli_is_help(const char *arg);
/* Monotonic seconds. */
double cli_now(void);

/* Creates a context for a --devices selector (NULL: default); prints the
 * error and returns NULL on failure, with *rc (may be NULL) set to the exit
 * code: CLI_USAGE for a malformed selector, else CLI_FAIL. */
clg_ctx *cli_ctx_open(const char *devices, int verbose, int *rc);

/* Options of the contexts cli_ctx_open creates (clg_options; `clgrad options`
 * lists them). cli_option_set: `flag` (e.g. "--set", "--gemm-backend") gave
 * name=value; a refusal is printed naming the flag and the option, and
 * returns CLI_USAGE. cli_option_default: value for name unless a flag or
 * the environment set it. */
int cli_option_set(const char *flag, const char *name, const char *value);
void cli_option_default(const char *name, const char *value);
/* --comm-timeout and --deterministic of train and bench train: the MPI
 * settings, and with deterministic the convolutions' default algorithms
 * (measured choices can differ between runs and ranks: a choice re-measured
 * at a later run, each rank timing its own). CLI_USAGE on a refusal. */
int cli_mpi_setup(double timeout_s, int deterministic);
/* The options given so far (NULL: none; borrowed). */
clg_options *cli_options(void);
/* The value of option name in the context as text ("" when unknown). */
const char *cli_option_value(const clg_ctx *ctx, const char *name, char *buf, size_t n);
/* `clgrad options` (cmd_options.c). */
int cmd_options(int argc, char **argv);

/* A positional argument of a MODEL-taking command: an unknown option or a
 * second model is a usage error (returns CLI_USAGE), else *model = arg and
 * returns cli_model_file_check's result. */
int cli_model_arg(const char *cmd, const char *arg, const char **model);
/* The context (cli_ctx_open) and the model file with trained weights, for
 * eval and predict: on failure prints the error, releases what was opened,
 * returns NULL with *rc set. batch 0: the model file's. weights may be NULL
 * for an ONNX model (its weights come with it); else a usage error. */
/* cli_model_open with pipe's parallel, stages, microbatches, pipe_schedule
 * and pipe_recompute (NULL: none): a pipeline evaluates and predicts through
 * its stages in order, no device holding the whole network. */
clg_model *cli_model_open_pipe(const char *cmd, const char *model, const char *weights, const char *devices,
                               int batch, const clg_model_params *pipe, clg_ctx **ctx, int *rc);
clg_model *cli_model_open(const char *cmd, const char *model, const char *weights, const char *devices, int batch,
                          clg_ctx **ctx, int *rc);

/* Background precompile (cmd_precompile.c): on a cold cache of PoCL devices
 * starts `clgrad precompile --background` for the model and returns its pid
 * (0: not started; option precompile 0/1 turns it off / forces it); verbose
 * 2 says so on stderr. */
pid_t cli_precompile_spawn(clg_ctx *ctx, const char *model, int batch, const char *devices, const char *precision,
                           int verbose);
/* Ends the helper (if still running: returns 1) and reaps it; 0 is a no-op. */
int cli_precompile_stop(pid_t pid);
/* cli_precompile_stop as a callback (clg_train_params.first_step_done): user is the pid_t, set to 0 */
void cli_precompile_stop_cb(void *user);
/* After a training run: a detached `clgrad tune --background` for the GEMM
 * shapes ctx ran without measurements of their own (option background_tune
 * auto; never with the cache off or read-only, or under MPI). */
void cli_tune_spawn(clg_ctx *ctx, const char *devices, int verbose);

/* Subcommands (each in its own file). */
int cmd_devices(int argc, char **argv);
int cmd_selfcheck(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_train(int argc, char **argv);
int bench_allreduce(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_predict(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_precompile(int argc, char **argv);
int cmd_sweep(int argc, char **argv);
/* bench targets (cmd_bench dispatches) */
int bench_gemm(int argc, char **argv);
int bench_conv(int argc, char **argv);
int bench_train(int argc, char **argv);
int bench_prim(int argc, char **argv);
int bench_attention(int argc, char **argv);
int bench_start(int argc, char **argv);

/* A model argument as a path: itself when it is a file, else the shipped
 * model of that name (clg_model_find), else itself (the library reports it). */
const char *cli_model_resolve(const char *arg);
/* Exit 1 with a message when a model file is a directory/FIFO/device;
 * CLI_OK otherwise (a missing file, and the content: text without NUL bytes
 * or ONNX, are left to the library to report). */
int cli_model_file_check(const char *cmd, const char *path);

#endif
