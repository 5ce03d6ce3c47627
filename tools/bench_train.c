/* clgrad bench train --model MODEL --batch B --steps S [--devices SEL] [--json]:
 * training throughput on synthetic data, warm-up steps excluded. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

typedef struct bench_train_opts {
    cli_common c;
    clg_bench_train_params p;
    double mem_limit;
} bench_train_opts;

#define T bench_train_opts
static const cli_opt opts[] = {
    CLI_OPT_MODEL,
    CLI_INT_OPT("--batch", cli_common, batch, 1, CLI_BATCH_MAX, "N", "batch size (default 128)"),
    CLI_INT_OPT("--steps", T, p.steps, 1, 1000000, "S", "timed steps (default 20)"),
    CLI_INT_OPT("--warmup", T, p.warmup, 0, 1000000, "W",
                "untimed warm-up steps first (default 3; several devices: more, up to\n"
                "16, until the split has settled and every per-device batch size ran)"),
    CLI_OPT_GEMM_BACKEND,
    CLI_OPT_DEVICES,
    CLI_SPLIT_OPT(T, p.split, "auto (by measured speed; default), even, or weights such as 3,1"),
    CLI_DOUBLE_OPT("--bucket-mb", T, p.bucket_mb, 0, 65536, CLI_LO_OPEN, "X",
                   "gradient reduction bucket size in MiB (default 25)"),
    CLI_OPTS_PIPELINE(T),
    CLI_SHARD_OPT(T, p.shard_optimizer),
    CLI_MEM_LIMIT_OPT(T, mem_limit),
    CLI_STRING_OPT("--trace", T, p.trace, "FILE", "Chrome-trace timeline of the timed steps (JSON)"),
    CLI_INT_OPT("--seed", T, p.seed, 0, INT64_MAX, "N", "seed (default 1)"),
    CLI_OPT_PRECISION,
    CLI_OPT_MPI,
    CLI_FLAG_OPT("--json", cli_common, json, 1,
                 "one JSON object: model, batch, devices, images_per_s (token models:\n"
                 "tokens_per_s too), ..."),
    CLI_OPT_VERBOSE,
    CLI_END,
};
#undef T

const cli_spec cli_spec_bench_train = {
    .name = "bench train",
    .synopsis = "--model MODEL [--batch N] [--steps S] [--warmup W] [--devices SEL] [--json]",
    .about = "Measures training throughput (forward + backward + SGD step) on synthetic data.",
    .opts = opts,
};

static void print_report(const bench_train_opts *o, const clg_bench_train_params *p, const clg_bench_train_report *rep,
                         const clg_device_info *info, clg_ctx *ctx)
{
    int ranks = clg_mpi_size(), built = 0, cached = 0;
    clg_ctx_program_counts(ctx, &built, &cached);
    if (o->c.json) {
        printf("{\"model\": ");
        cli_json_str(p->model);
        printf(", \"precision\": \"%s\", \"batch\": %d, \"devices\": %d, \"steps\": %d, \"warmup\": %d, \"images_per_s\": %.1f, "
               "\"ms_per_step\": %.3f, \"ms_per_step_median\": %.3f, \"device\": ",
               p->precision ? p->precision : "fp32", p->batch, rep->devices, p->steps, p->warmup, rep->images_per_s, rep->ms_per_step, rep->ms_per_step_median);
        cli_json_str(info->name);
        printf(", \"shares\": \"%s\", \"ranks\": %d, \"setup_s\": %.4f, \"first_step_s\": %.4f, \"first_step_end\": %.6f, "
               "\"first_step_cpu_s\": %.3f, \"launches_per_step\": %.1f, \"programs_built\": %d, \"programs_cached\": %d, "
               "\"pipe_bubble\": %.4f",
               rep->shares, ranks, rep->setup_s, rep->first_step_s, rep->first_step_end, rep->first_step_cpu_s,
               rep->launches_per_step, built, cached, rep->pipe_bubble);
        if (rep->tokens_per_sample)
            printf(", \"tokens_per_sample\": %d, \"tokens_per_s\": %.1f", rep->tokens_per_sample, rep->tokens_per_s);
        printf(", \"warmup_run\": %d, \"split_moves_timed\": %d, \"prepares_timed\": %d, \"prepare_timed_s\": %.3f, "
               "\"cpu_ms_per_step\": %.3f",
               rep->warmup_run, rep->split_moves_timed, rep->prepares_timed, rep->prepare_timed_s,
               rep->cpu_ms_per_step);
        printf(", \"mem_peak_mib\": %.3f, \"mem_optim_mib\": %.3f, \"warning\": ", rep->mem_peak_mib, rep->mem_optim_mib);
        cli_json_str(rep->warning);
        printf("}\n");
        return;
    }
    printf("model %s  batch %d  devices %d (%s)  precision %s  split %s\n", p->model, p->batch, rep->devices,
           info->name, p->precision ? p->precision : "fp32", rep->shares);
    if (ranks > 1)
        printf("MPI ranks %d x %d device(s): global batch %d, images/s of the whole job\n", ranks, rep->devices,
               p->batch);
    if (rep->tokens_per_sample)
        printf("%d timed steps after %d warm-up: %.1f images/s (%.0f tokens/s, %d per sample), %.2f ms/step "
               "(median %.2f)\n",
               p->steps, rep->warmup_run, rep->images_per_s, rep->tokens_per_s, rep->tokens_per_sample, rep->ms_per_step,
               rep->ms_per_step_median);
    else
        printf("%d timed steps after %d warm-up: %.1f images/s, %.2f ms/step (median %.2f)\n", p->steps,
               rep->warmup_run, rep->images_per_s, rep->ms_per_step, rep->ms_per_step_median);
    if (rep->split_moves_timed || rep->prepares_timed)
        printf("split: moved %d time(s) within the timed steps; new per-device batch sizes met %d time(s) there "
               "(%.3f s)\n", rep->split_moves_timed, rep->prepares_timed, rep->prepare_timed_s);
    printf("start-up: model setup %.3f s, first step %.3f s; %.1f kernel launches per step\n", rep->setup_s,
           rep->first_step_s, rep->launches_per_step);
    if (rep->pipe_bubble >= 0)
        printf("pipeline bubble: the stages were idle %.1f%% of the timed steps (waiting for another stage)\n",
               100 * rep->pipe_bubble);
    printf("device memory (largest device): peak %.2f MiB, optimizer state %.2f MiB\n", rep->mem_peak_mib,
           rep->mem_optim_mib);
    if (rep->warning[0])
        printf("warning: %s\n", rep->warning);
}

/* The first step has ended (its kernels are built): a background precompile helper still compiling
 * would take a core from the algorithm timing, the split's calibration and the timed steps (two basic
 * devices compute on both cores of a 2-core machine). */
typedef struct helper_ref {
    pid_t pid;
    int verbose;
} helper_ref;

static void stop_helper(void *user)
{
    helper_ref *h = user;
    if (cli_precompile_stop(h->pid) && h->verbose)
        fprintf(stderr, "clgrad: background precompile still running after the first step: stopped\n");
    h->pid = 0;
}

int bench_train(int argc, char **argv)
{
    bench_train_opts o = {0};
    clg_bench_train_params_init(&o.p);
    CLI_PARSE(&cli_spec_bench_train, argc, argv, &o);
    clg_bench_train_params p = o.p;
    const char *devices = o.c.devices;
    p.model = o.c.model;
    p.precision = o.c.precision;
    if (o.c.batch)
        p.batch = o.c.batch;
    if (o.c.gemm_backend && cli_option_set("--gemm-backend", "gemm_backend", o.c.gemm_backend) != CLI_OK)
        return CLI_USAGE;
    if (cli_mem_limit(o.mem_limit) != CLI_OK)
        return CLI_USAGE;
    if (!p.model)
        return cli_usage_error("bench train", "missing --model FILE");
    p.model = cli_model_resolve(p.model);
    int rc = cli_model_file_check("bench train", p.model);
    if (rc != CLI_OK)
        return rc;
    if (cli_mpi_setup(o.c.comm_timeout, o.c.deterministic) != CLI_OK)
        return CLI_USAGE;
    clg_ctx *ctx = cli_ctx_open(devices, o.c.verbose, &rc);
    if (!ctx)
        return rc;
    clg_device_info info;
    clg_device_info_get(ctx, 0, &info);
    p.devices = "all"; /* every device of the context (selected by --devices) */
    helper_ref helper = {cli_precompile_spawn(ctx, p.model, p.batch, devices, p.precision, o.c.verbose),
                         o.c.verbose};
    p.warm_done = stop_helper;
    p.warm_done_user = &helper;
    clg_bench_train_report rep;
    clg_status st = clg_bench_train(ctx, &p, &rep);
    cli_precompile_stop(helper.pid);
    if (st != CLG_OK) {
        int code = cli_fail("bench train: %s", clg_last_error(ctx));
        clg_ctx_destroy(ctx);
        return code;
    }
    if (clg_mpi_rank() != 0) { /* MPI: every rank timed the same global steps; rank 0 reports once */
        clg_ctx_destroy(ctx);
        return CLI_OK;
    }
    print_report(&o, &p, &rep, &info, ctx);
    clg_ctx_destroy(ctx);
    return CLI_OK;
}
