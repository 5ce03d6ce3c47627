/* clgrad export MODEL [--weights FILE] -o OUT.onnx: the model with its
 * weights and input normalization as ONNX (public API only). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void help(FILE *f)
{
    fprintf(f, "usage: clgrad export MODEL --weights FILE -o OUT.onnx [options]\n"
               "\n"
               "Writes the model (layers, weights, input normalization) as an ONNX file (opset 13):\n"
               "input \"input\" (N x C x H x W float), output \"output\" (N x classes; softmax\n"
               "probabilities when the model ends in [softmax]).\n"
               "\n"
               "  --weights FILE   weights or checkpoint written by train (optional for an ONNX model)\n"
               "  -o, --output F   the ONNX file to write (replaced atomically)\n"
               "  --devices SEL    device selector (the weights are read from the first)\n"
               "\n"
               "exit codes: 0 ok, 1 failure, 2 usage error\n");
}

int cmd_export(int argc, char **argv)
{
    const char *model = NULL, *weights = NULL, *out = NULL, *devices = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (cli_is_help(a)) {
            help(stdout);
            return CLI_OK;
        }
        if ((r = cli_opt_str(argc, argv, &i, "--weights", &weights)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "-o", &out)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--output", &out)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--devices", &devices)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            continue;
        }
        if ((r = cli_model_arg("export", a, &model)) != CLI_OK)
            return r;
    }
    if (!model)
        return cli_usage_error("export", "missing MODEL");
    if (!out)
        return cli_usage_error("export", "missing -o OUT.onnx");
    int rc = CLI_OK;
    clg_ctx *ctx = NULL;
    clg_model *m = cli_model_open("export", model, weights, devices, 0, &ctx, &rc);
    if (!m)
        return rc;
    if (clg_model_export_onnx(m, out) != CLG_OK)
        rc = cli_fail("export: %s", clg_last_error(ctx));
    else
        fprintf(stderr, "export: wrote %s\n", out);
    clg_model_destroy(m);
    clg_ctx_destroy(ctx);
    return rc;
}
