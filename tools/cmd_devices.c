/* clgrad devices [--json] [--devices SEL]; clgrad selfcheck [--devices SEL] */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

static const char *type_name(clg_device_type t)
{
    switch (t) {
    case CLG_DEVICE_CPU:
        return "cpu";
    case CLG_DEVICE_GPU:
        return "gpu";
    case CLG_DEVICE_ACCELERATOR:
        return "accelerator";
    default:
        return "other";
    }
}

static const char *const tuning_src[] = {"defaults", "family", "own"};

/* One line on where the device's GEMM parameters come from and, when both
 * are known, how far the built-in defaults are from the tuned figure. */
static void print_tuning(const clg_gemm_tuning *t)
{
    printf("  GEMM tuning     ");
    if (t->source == 2)
        printf("own measurements (%d shape classes); ", t->own_classes);
    if (t->family[0])
        printf("shipped family %s (%s)", t->family, t->family_measured ? "measured" : "estimated");
    else
        printf("built-in defaults (no shipped family matches)");
    printf("%s\n", t->source == 2 ? "" : "; not tuned here");
    if (t->ref_class[0] && t->tuned_gflops > 0) {
        printf("                  %s %dx%dx%d: tuned %.1f GFLOP/s%s", t->ref_class, t->ref_m, t->ref_n, t->ref_k,
               t->tuned_gflops, t->source == 2 ? "" : " (on the family's reference machine)");
        if (t->default_gflops > 0)
            printf(", defaults %.1f (%.2fx)", t->default_gflops, t->default_gflops / t->tuned_gflops);
        if (t->family_gflops > 0)
            printf(", family %.1f (%.2fx)", t->family_gflops, t->family_gflops / t->tuned_gflops);
        printf("\n");
    }
}

static void json_tuning(const clg_gemm_tuning *t)
{
    printf(",\"gemm_tuning\":{\"source\":\"%s\",\"own_classes\":%d,\"family\":", tuning_src[t->source], t->own_classes);
    cli_json_str(t->family);
    printf(",\"family_status\":\"%s\",\"class\":", t->family[0] ? (t->family_measured ? "measured" : "estimated") : "");
    cli_json_str(t->ref_class);
    printf(",\"m\":%d,\"n\":%d,\"k\":%d,\"tuned_gflops\":%.1f,\"default_gflops\":%.1f,\"family_gflops\":%.1f}",
           t->ref_m, t->ref_n, t->ref_k, t->tuned_gflops, t->default_gflops, t->family_gflops);
}

static const cli_opt devices_opts[] = {CLI_OPT_JSON, CLI_OPT_DEVICES, CLI_END};

const cli_spec cli_spec_devices = {
    .name = "devices",
    .synopsis = "[--json] [--devices SEL]",
    .about = "Lists every OpenCL device of every platform with its capabilities and the index\n"
             "that --devices selects it by.",
    .opts = devices_opts,
};

int cmd_devices(int argc, char **argv)
{
    cli_common o = {.devices = "all"};
    CLI_PARSE(&cli_spec_devices, argc, argv, &o);
    int json = o.json;
    const char *sel = o.devices;
    int rc = CLI_OK;
    clg_ctx *ctx = cli_ctx_open(sel, 0, &rc);
    if (!ctx)
        return rc;
    int n = clg_device_count(ctx);
    if (json)
        printf("[");
    for (int i = 0; i < n; i++) {
        clg_device_info d;
        if (clg_device_info_get(ctx, i, &d) != CLG_OK)
            continue;
        clg_gemm_tuning t;
        int have_tuning = clg_gemm_tuning_get(ctx, i, &t) == CLG_OK;
        if (json) {
            printf("%s{\"index\":%d,\"name\":", i ? "," : "", i);
            cli_json_str(d.name);
            printf(",\"vendor\":");
            cli_json_str(d.vendor);
            printf(",\"platform\":");
            cli_json_str(d.platform);
            printf(",\"platform_index\":%d,\"type\":\"%s\",\"compute_units\":%u,\"max_clock_mhz\":%u,"
                   "\"global_mem_bytes\":%llu,\"local_mem_bytes\":%llu,\"max_alloc_bytes\":%llu,"
                   "\"max_work_group_size\":%zu,\"fp16\":%s,\"fp64\":%s,\"opencl_c_version\":",
                   d.platform_index, type_name(d.type), d.compute_units, d.max_clock_mhz,
                   (unsigned long long)d.global_mem_bytes, (unsigned long long)d.local_mem_bytes,
                   (unsigned long long)d.max_alloc_bytes, d.max_work_group_size, d.has_fp16 ? "true" : "false",
                   d.has_fp64 ? "true" : "false");
            cli_json_str(d.opencl_c_version);
            printf(",\"device_version\":");
            cli_json_str(d.device_version);
            printf(",\"driver_version\":");
            cli_json_str(d.driver_version);
            if (have_tuning)
                json_tuning(&t);
            printf("}");
        } else {
            printf("device %d: %s\n", i, d.name);
            printf("  platform        %s (#%d)\n", d.platform, d.platform_index);
            printf("  vendor          %s\n", d.vendor);
            printf("  type            %s\n", type_name(d.type));
            printf("  compute units   %u @ %u MHz\n", d.compute_units, d.max_clock_mhz);
            printf("  global memory   %.1f MiB (max alloc %.1f MiB)\n", d.global_mem_bytes / 1048576.0,
                   d.max_alloc_bytes / 1048576.0);
            printf("  local memory    %.1f KiB\n", d.local_mem_bytes / 1024.0);
            printf("  max work-group  %zu\n", d.max_work_group_size);
            printf("  fp16 / fp64     %s / %s\n", d.has_fp16 ? "yes" : "no", d.has_fp64 ? "yes" : "no");
            printf("  OpenCL C        %s\n", d.opencl_c_version);
            printf("  device version  %s\n", d.device_version);
            printf("  driver          %s\n", d.driver_version);
            if (have_tuning)
                print_tuning(&t);
        }
    }
    if (json)
        printf("]\n");
    clg_ctx_destroy(ctx);
    return CLI_OK;
}

static const cli_opt selfcheck_opts[] = {CLI_OPT_DEVICES, CLI_END};

const cli_spec cli_spec_selfcheck = {
    .name = "selfcheck",
    .synopsis = "[--devices SEL]",
    .about = "Runs a GEMM on every selected device and compares it with a double-precision\n"
             "host reference. Exit 0 when every device agrees.",
    .opts = selfcheck_opts,
};

int cmd_selfcheck(int argc, char **argv)
{
    cli_common o = {.devices = "all"};
    CLI_PARSE(&cli_spec_selfcheck, argc, argv, &o);
    const char *sel = o.devices;
    int rc = CLI_OK;
    clg_ctx *ctx = cli_ctx_open(sel, 0, &rc);
    if (!ctx)
        return rc;
    double worst = 0;
    clg_status st = clg_selfcheck(ctx, &worst);
    if (st != CLG_OK) {
        rc = cli_fail("self-check: %s", clg_last_error(ctx));
        clg_ctx_destroy(ctx);
        return rc;
    }
    printf("self-check passed on %d device(s): GEMM max relative error %.2e (tolerance 1e-5)\n",
           clg_device_count(ctx), worst);
    clg_ctx_destroy(ctx);
    return CLI_OK;
}
