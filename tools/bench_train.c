/* clgrad bench train (placeholder until its issue lands) */
#include <stdio.h>

#include "cli.h"

int bench_train(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_fail("'bench train' is not implemented yet");
}
