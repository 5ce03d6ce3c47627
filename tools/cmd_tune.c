/* clgrad tune (placeholder until its issue lands) */
#include <stdio.h>

#include "cli.h"

int cmd_tune(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_fail("'tune' is not implemented yet");
}
