/* clgrad predict (placeholder until its issue lands) */
#include <stdio.h>

#include "cli.h"

int cmd_predict(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_fail("'predict' is not implemented yet");
}
