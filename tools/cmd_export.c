/* clgrad export MODEL [--weights FILE] -o OUT.onnx: the model with its
 * weights and input normalization as ONNX (public API only). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

typedef struct export_opts {
    cli_common c;
    const char *out;
    clg_model_params p; /* the pipeline fields only: each layer's weights read from its stage */
} export_opts;

static const cli_opt opts[] = {
    CLI_OPT_WEIGHTS,
    {.name = "--output", .alias = "-o", .kind = CLI_STRING, CLI_FIELD_(export_opts, out), .arg = "FILE",
     .help = "the ONNX file to write (replaced atomically)"},
    CLI_OPT_DEVICES,
    CLI_OPTS_PIPELINE(export_opts),
    CLI_END,
};

const cli_spec cli_spec_export = {
    .name = "export",
    .synopsis = "MODEL --weights FILE -o OUT.onnx [options]",
    .about = "Writes the model (layers, weights, input normalization) as an ONNX file (opset 13):\n"
             "input \"input\" (N x C x H x W float), output \"output\" (N x classes; softmax\n"
             "probabilities when the model ends in [softmax]). The weights are read from the\n"
             "first selected device.",
    .opts = opts,
    .positional = cli_model_positional,
};

int cmd_export(int argc, char **argv)
{
    export_opts o = {0};
    CLI_PARSE(&cli_spec_export, argc, argv, &o);
    const char *model = o.c.model, *out = o.out;
    if (!model)
        return cli_usage_error("export", "missing MODEL");
    if (!out)
        return cli_usage_error("export", "missing -o OUT.onnx");
    int rc = CLI_OK;
    clg_ctx *ctx = NULL;
    clg_model *m = cli_model_open_pipe("export", model, o.c.weights, o.c.devices, 0, &o.p, &ctx, &rc);
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
