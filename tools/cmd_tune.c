/* clgrad tune [--device SEL] [--quick]: GEMM auto-tuning per device. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "ops/tune_gemm.h"

static void progress(void *user, const char *line)
{
    (void)user;
    printf("%s\n", line);
    fflush(stdout);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: clgrad tune [--device SEL] [--quick] [--no-clblast] [-v]\n"
               "  Searches the GEMM kernel parameters per shape class (the DL layer shapes\n"
               "  and square products) on every selected device and stores the winners,\n"
               "  and whether CLBlast is faster per class, in the tuning database under\n"
               "  the cache directory (one JSON file per device name + driver version).\n"
               "  --device SEL   device selector (all, cpu, gpu, 0,1, name:SUBSTR); also --devices\n"
               "  --quick        reduced search space (a few minutes per device)\n"
               "  --no-clblast   do not time CLBlast (auto then keeps its stored choice)\n");
}

int cmd_tune(int argc, char **argv)
{
    const char *devices = NULL;
    int quick = 0, clblast = 1, verbose = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return CLI_OK;
        }
        if ((r = cli_opt_str(argc, argv, &i, "--device", &devices)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--devices", &devices)) != 0) {
            if (r < 0)
                return CLI_USAGE;
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--no-clblast") == 0) {
            clblast = 0;
        } else if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--verbose") == 0) {
            verbose = 2;
        } else {
            return cli_usage_error("tune", "unknown option '%s'", argv[i]);
        }
    }
    int rc = CLI_OK;
    clg_ctx *ctx = cli_ctx_open(devices, verbose ? verbose : 1, &rc);
    if (!ctx)
        return rc;
    for (int d = 0; d < ctx->ndev; d++) {
        clg_gemm_tune_opts o;
        memset(&o, 0, sizeof o);
        o.quick = quick;
        o.clblast = clblast;
        o.progress = progress;
        clg_status st = clg_gemm_tune(&ctx->devs[d], &o);
        if (st != CLG_OK) {
            rc = cli_fail("tuning device %d failed: %s", d, clg_last_error(ctx));
            break;
        }
    }
    clg_ctx_destroy(ctx);
    return rc;
}
