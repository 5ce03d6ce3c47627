/* clgrad: command-line trainer and benchmark driver. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

static const cli_cmd commands[] = {
    {"devices", cmd_devices, "list OpenCL platforms and devices"},
    {"selfcheck", cmd_selfcheck, "run a GEMM self-check on every selected device"},
    {"train", cmd_train, "train a model on a dataset"},
    {"eval", cmd_eval, "evaluate trained weights on a dataset"},
    {"predict", cmd_predict, "classify an image or IDX file"},
    {"generate", cmd_generate, "sample text from a trained token model"},
    {"export", cmd_export, "write a model with its weights as ONNX"},
    {"bench", cmd_bench, "benchmark gemm, conv or training"},
    {"tune", cmd_tune, "auto-tune kernels for a device"},
    {"precompile", cmd_precompile, "compile a model's kernels ahead of training"},
    {"options", cmd_options, "list the library's options with their values and sources"},
    {"sweep", cmd_sweep, "search hyperparameters: trials side by side, one per device"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: clgrad COMMAND [OPTIONS]   (clgrad COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n  --version  print the library version\n  help --man the man page (roff)\n"
               "  --set NAME=VALUE  set a library option (repeatable, before or after COMMAND; clgrad options)\n"
               "\nexit codes: 0 ok, 1 failure, 2 usage error\n");
}

/* Takes every `--set NAME=VALUE` (or --set=NAME=VALUE) out of argv, wherever
 * it is, into the options of the contexts the command opens. */
static int take_settings(int *argc, char **argv)
{
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *kv = NULL;
        if (strcmp(argv[i], "--set") == 0) {
            if (i + 1 >= *argc) {
                fprintf(stderr, "clgrad: --set needs NAME=VALUE\n");
                return CLI_USAGE;
            }
            kv = argv[++i];
        } else if (strncmp(argv[i], "--set=", 6) == 0) {
            kv = argv[i] + 6;
        } else {
            argv[out++] = argv[i];
            continue;
        }
        const char *eq = strchr(kv, '=');
        if (!eq || eq == kv) {
            fprintf(stderr, "clgrad: --set '%s': expected NAME=VALUE (clgrad options lists the names)\n", kv);
            return CLI_USAGE;
        }
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - kv), kv);
        int rc = cli_option_set("--set", name, eq + 1);
        if (rc != CLI_OK)
            return rc;
    }
    argv[out] = NULL;
    *argc = out;
    return CLI_OK;
}

int main(int argc, char **argv)
{
    int src = take_settings(&argc, argv);
    if (src != CLI_OK)
        return src;
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    if (strcmp(argv[1], "help") == 0 && argc > 2 && strcmp(argv[2], "--man") == 0) {
        cli_man(stdout); /* docs/clgrad.1 */
        return CLI_OK;
    }
    if (cli_is_help(argv[1]) || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return CLI_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("clgrad %s\n", clg_version_string());
        return CLI_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) {
            /* under mpirun: MPI for the job's ranks (a plain run never loads it) */
            if (clg_mpi_init(cli_options()) != CLG_OK)
                return cli_fail("%s", clg_last_error(NULL));
            int rc = commands[i].fn(argc - 1, argv + 1);
            clg_mpi_finalize(rc); /* a failing rank ends the whole job (MPI_Abort) */
            return rc;
        }
    fprintf(stderr, "clgrad: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
