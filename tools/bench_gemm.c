/* clgrad bench gemm (placeholder until its issue lands) */
#include <stdio.h>

#include "cli.h"

int bench_gemm(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_fail("'bench gemm' is not implemented yet");
}
