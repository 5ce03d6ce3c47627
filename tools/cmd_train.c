/* clgrad train (placeholder until its issue lands) */
#include <stdio.h>

#include "cli.h"

int cmd_train(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_fail("'train' is not implemented yet");
}
