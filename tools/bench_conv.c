/* clgrad bench conv (placeholder until its issue lands) */
#include <stdio.h>

#include "cli.h"

int bench_conv(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_fail("'bench conv' is not implemented yet");
}
