/* clgrad tune [--device SEL] [--quick]: GEMM auto-tuning per device. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

static void progress(void *user, const char *line)
{
    (void)user;
    printf("%s\n", line);
    fflush(stdout);
}

typedef struct tune_opts {
    cli_common c;
    int quick, no_clblast;
} tune_opts;

static const cli_opt opts[] = {
    {.name = "--devices", .alias = "--device", .kind = CLI_STRING, CLI_FIELD_(cli_common, devices), .arg = "SEL",
     .help = "device selector: all (default), gpu, cpu, accelerator, 0,2 or name:TEXT"},
    CLI_FLAG_OPT("--quick", tune_opts, quick, 1, "reduced search space (a few minutes per device)"),
    CLI_FLAG_OPT("--no-clblast", tune_opts, no_clblast, 1, "do not time CLBlast (auto then keeps its stored choice)"),
    {.name = "--verbose", .alias = "-v", .kind = CLI_FLAG, CLI_FIELD_(cli_common, verbose), .set = 2,
     .help = "debug logging (program builds, cache loads)"},
    CLI_END,
};

const cli_spec cli_spec_tune = {
    .name = "tune",
    .synopsis = "[--devices SEL] [--quick] [--no-clblast] [--verbose]",
    .about = "Searches the GEMM kernel parameters per shape class (the DL layer shapes and\n"
             "square products) on every selected device and stores the winners, and whether\n"
             "CLBlast is faster per class, in the tuning database under the cache directory\n"
             "(one JSON file per device name + driver version).",
    .opts = opts,
};

int cmd_tune(int argc, char **argv)
{
    tune_opts o = {0};
    CLI_PARSE(&cli_spec_tune, argc, argv, &o);
    const char *devices = o.c.devices;
    int quick = o.quick, clblast = !o.no_clblast, verbose = o.c.verbose;
    int rc = CLI_OK;
    clg_ctx *ctx = cli_ctx_open(devices, verbose ? verbose : 1, &rc);
    if (!ctx)
        return rc;
    for (int d = 0; d < clg_device_count(ctx); d++) {
        clg_status st = clg_tune_gemm(ctx, d, quick, clblast, progress, NULL);
        if (st != CLG_OK) {
            rc = cli_fail("tuning device %d failed: %s", d, clg_last_error(ctx));
            break;
        }
    }
    clg_ctx_destroy(ctx);
    return rc;
}
