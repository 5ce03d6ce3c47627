/* clgrad bench gemm|conv|train ... */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cmd_bench(int argc, char **argv)
{
    if (argc < 2 || cli_is_help(argv[1])) {
        printf("usage: clgrad bench gemm|conv|train|prim|allreduce|start|attention [OPTIONS]   (clgrad bench TARGET --help)\n");
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    if (strcmp(argv[1], "gemm") == 0)
        return bench_gemm(argc - 1, argv + 1);
    if (strcmp(argv[1], "conv") == 0)
        return bench_conv(argc - 1, argv + 1);
    if (strcmp(argv[1], "train") == 0)
        return bench_train(argc - 1, argv + 1);
    if (strcmp(argv[1], "prim") == 0)
        return bench_prim(argc - 1, argv + 1);
    if (strcmp(argv[1], "allreduce") == 0)
        return bench_allreduce(argc - 1, argv + 1);
    if (strcmp(argv[1], "start") == 0)
        return bench_start(argc - 1, argv + 1);
    if (strcmp(argv[1], "attention") == 0)
        return bench_attention(argc - 1, argv + 1);
    return cli_usage_error("bench", "unknown target '%s' (gemm, conv, train, prim, allreduce, start or attention)", argv[1]);
}
