/* clgrad eval (placeholder until its issue lands) */
#include <stdio.h>

#include "cli.h"

int cmd_eval(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_fail("'eval' is not implemented yet");
}
