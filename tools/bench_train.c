/* clgrad bench train --model MODEL --batch B --steps S [--devices SEL] [--json]:
 * training throughput on synthetic data, warm-up steps excluded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "device/device.h"
#include "parallel/comm.h"

static void help(FILE *f)
{
    fprintf(f, "usage: clgrad bench train --model MODEL [--batch B] [--steps S] [--warmup W] [--devices SEL] [--json]\n"
               "\n"
               "Measures training throughput (forward + backward + SGD step) on synthetic data.\n"
               "\n"
               "  --model FILE    model file (e.g. models/vgg-s.cfg)\n"
               "  --batch B       batch size (default 128)\n"
               "  --steps S       timed steps (default 20)\n"
               "  --warmup W      untimed warm-up steps first (default 3)\n"
               "  --gemm-backend B  auto, own or clblast (option gemm_backend)\n"
               "  --devices SEL   device selector (default all): one replica per device, batch split\n"
               "  --split S       auto (by measured speed; default), even, or weights such as 3,1\n"
               "  --bucket-mb X   gradient reduction bucket size in MiB (default 25)\n"
               "  --trace FILE    Chrome-trace timeline of the timed steps (JSON)\n"
               "  --seed N        seed (default 1)\n"
               "  --precision P   fp32 (default) or fp16 (half storage, fp32 master weights)\n"
               "  --deterministic MPI: rank-ordered gradient sum (see clgrad train --help)\n"
               "  --comm-timeout SEC  MPI: fail after SEC s without an answer from a rank (default 60)\n"
               "  --json          one JSON object: model, batch, devices, images_per_s, ...\n"
               "  --verbose       debug logging (program builds, cache loads)\n"
               "\n"
               "exit codes: 0 ok, 1 failure, 2 usage error\n");
}

int bench_train(int argc, char **argv)
{
    clg_bench_train_params p;
    clg_bench_train_params_init(&p);
    const char *devices = NULL;
    int json = 0, deterministic = 0, verbose = 0;
    double comm_timeout = 0;
    long v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (cli_is_help(a)) {
            help(stdout);
            return CLI_OK;
        }
        if ((r = cli_opt_str(argc, argv, &i, "--model", &p.model)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--precision", &p.precision)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--split", &p.split)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--trace", &p.trace)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--devices", &devices)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            continue;
        }
        if ((r = cli_opt_int(argc, argv, &i, "--batch", 1, 1 << 20, &v)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            p.batch = (int)v;
            continue;
        }
        if ((r = cli_opt_int(argc, argv, &i, "--steps", 1, 1000000, &v)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            p.steps = (int)v;
            continue;
        }
        if ((r = cli_opt_int(argc, argv, &i, "--warmup", 0, 1000000, &v)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            p.warmup = (int)v;
            continue;
        }
        double d;
        if ((r = cli_opt_double(argc, argv, &i, "--bucket-mb", &d)) != 0) {
            if (r < 0 || !(d > 0 && d <= 65536))
                return r < 0 ? CLI_USAGE : cli_usage_error("bench train", "--bucket-mb must be in (0, 65536]");
            p.bucket_mb = d;
            continue;
        }
        if ((r = cli_opt_int(argc, argv, &i, "--seed", 0, 0x7fffffffffffffffL, &v)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            p.seed = (uint64_t)v;
            continue;
        }
        const char *gb = NULL;
        if ((r = cli_opt_str(argc, argv, &i, "--gemm-backend", &gb)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            if (cli_option_set("--gemm-backend", "gemm_backend", gb) != CLI_OK)
                return CLI_USAGE;
            continue;
        }
        if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        }
        if (strcmp(a, "--verbose") == 0) {
            verbose = 2;
            continue;
        }
        if (strcmp(a, "--deterministic") == 0) {
            deterministic = 1;
            continue;
        }
        if ((r = cli_opt_double(argc, argv, &i, "--comm-timeout", &d)) != 0) {
            if (r < 0 || !(d > 0 && d <= 86400))
                return r < 0 ? CLI_USAGE : cli_usage_error("bench train", "--comm-timeout must be in (0, 86400] seconds");
            comm_timeout = d;
            continue;
        }
        return cli_usage_error("bench train", "unknown argument '%s'", a);
    }
    if (!p.model)
        return cli_usage_error("bench train", "missing --model FILE");
    p.model = cli_model_resolve(p.model);
    int rc = cli_model_file_check("bench train", p.model);
    if (rc != CLI_OK)
        return rc;
    clg_comm_configure(comm_timeout, deterministic);
    clg_ctx *ctx = cli_ctx_open(devices, verbose, &rc);
    if (!ctx)
        return rc;
    clg_device_info info;
    clg_device_info_get(ctx, 0, &info);
    p.devices = "all"; /* every device of the context (selected by --devices) */
    pid_t helper = cli_precompile_spawn(ctx, p.model, p.batch, devices, p.precision);
    clg_bench_train_report rep;
    clg_status st = clg_bench_train(ctx, &p, &rep);
    cli_precompile_stop(helper);
    if (st != CLG_OK) {
        int code = cli_fail("bench train: %s", clg_last_error(ctx));
        clg_ctx_destroy(ctx);
        return code;
    }
    if (clg_comm_rank() != 0) { /* MPI: every rank timed the same global steps; rank 0 reports once */
        clg_ctx_destroy(ctx);
        return CLI_OK;
    }
    int ranks = clg_comm_size();
    if (json) {
        printf("{\"model\": \"");
        for (const char *c = p.model; *c; c++) {
            if (*c == '"' || *c == '\\')
                putchar('\\');
            putchar(*c);
        }
        printf("\", \"precision\": \"%s\", \"batch\": %d, \"devices\": %d, \"steps\": %d, \"warmup\": %d, \"images_per_s\": %.1f, "
               "\"ms_per_step\": %.3f, \"ms_per_step_median\": %.3f, \"device\": \"",
               p.precision ? p.precision : "fp32", p.batch, rep.devices, p.steps, p.warmup, rep.images_per_s, rep.ms_per_step, rep.ms_per_step_median);
        for (const char *c = info.name; *c; c++) {
            if (*c == '"' || *c == '\\')
                putchar('\\');
            if ((unsigned char)*c >= 0x20)
                putchar(*c);
        }
        printf("\", \"shares\": \"%s\", \"ranks\": %d, \"setup_s\": %.4f, \"first_step_s\": %.4f, \"first_step_end\": %.6f, "
               "\"first_step_cpu_s\": %.3f, \"launches_per_step\": %.1f, \"programs_built\": %d, \"programs_cached\": %d}\n",
               rep.shares, ranks, rep.setup_s, rep.first_step_s, rep.first_step_end, rep.first_step_cpu_s,
               rep.launches_per_step, ctx->prog_stats.built, ctx->prog_stats.cache_loaded);
    } else {
        printf("model %s  batch %d  devices %d (%s)  precision %s  split %s\n", p.model, p.batch, rep.devices,
               info.name, p.precision ? p.precision : "fp32", rep.shares);
        if (ranks > 1)
            printf("MPI ranks %d x %d device(s): global batch %d, images/s of the whole job\n", ranks, rep.devices,
                   p.batch);
        printf("%d timed steps after %d warm-up: %.1f images/s, %.2f ms/step (median %.2f)\n", p.steps, p.warmup,
               rep.images_per_s, rep.ms_per_step, rep.ms_per_step_median);
        printf("start-up: model setup %.3f s, first step %.3f s; %.1f kernel launches per step\n", rep.setup_s,
               rep.first_step_s, rep.launches_per_step);
    }
    clg_ctx_destroy(ctx);
    return CLI_OK;
}
