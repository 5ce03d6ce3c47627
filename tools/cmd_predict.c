/* clgrad predict MODEL [--weights FILE] --input FILE [--json]: class
 * probabilities for every image of an IDX file (uint8 or float32) or a PGM
 * image (public API only). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

typedef struct predict_opts {
    cli_common c;
    const char *input;
    long limit;
    clg_model_params p; /* the pipeline fields only */
} predict_opts;

static const cli_opt opts[] = {
    CLI_OPT_WEIGHTS,
    CLI_STRING_OPT("--input", predict_opts, input, "FILE",
                   "IDX (unsigned byte 0x08: pixel / 255; float32 0x0D: values as\n"
                   "they are) or PGM image(s) with the model's input shape"),
    CLI_FLAG_OPT("--json", cli_common, json, 1,
                 "one JSON object per line and image:\n"
                 "{\"index\": i, \"class\": c, \"probs\": [...]}"),
    CLI_INT_OPT("--limit", predict_opts, limit, 1, INT32_MAX, "N", "print only the first N images"),
    CLI_OPT_DEVICES,
    CLI_OPTS_PIPELINE(predict_opts),
    CLI_END,
};

const cli_spec cli_spec_predict = {
    .name = "predict",
    .synopsis = "MODEL [--weights FILE] --input FILE [--json] [options]",
    .about = "Prints the class probabilities of every image in FILE (an IDX images file, plain or\n"
             ".gz, or a PGM image) and the most likely class.",
    .opts = opts,
    .positional = cli_model_positional,
    .notes = "A model reading token ids ([net] input = tokens, e.g. gpt-mini) is refused: continue a\n"
             "text with clgrad generate, or measure its loss with clgrad eval --data text:FILE.",
};

int cmd_predict(int argc, char **argv)
{
    predict_opts o = {0};
    CLI_PARSE(&cli_spec_predict, argc, argv, &o);
    const char *model = o.c.model, *input = o.input;
    long limit = o.limit;
    int json = o.c.json;
    if (!model)
        return cli_usage_error("predict", "missing MODEL");
    if (!input)
        return cli_usage_error("predict", "missing --input FILE");
    int rc = CLI_OK;
    clg_ctx *ctx = NULL;
    clg_model *m = cli_model_open_pipe("predict", model, o.c.weights, o.c.devices, 0, &o.p, &ctx, &rc);
    if (!m)
        return rc;
    float *probs = NULL;
    int n = 0, classes = 0;
    if (clg_model_predict_file(m, input, &probs, &n) != CLG_OK) {
        int code = cli_fail("predict: %s", clg_last_error(ctx));
        clg_model_destroy(m);
        clg_ctx_destroy(ctx);
        return code;
    }
    clg_model_shape(m, NULL, NULL, NULL, &classes, NULL);
    if (limit > 0 && limit < n)
        n = (int)limit;
    for (int i = 0; i < n; i++) {
        const float *p = probs + (size_t)i * classes;
        int best = 0;
        for (int c = 1; c < classes; c++)
            if (p[c] > p[best])
                best = c;
        if (json) { /* %.9g: a float read back is the same float */
            printf("{\"index\": %d, \"class\": %d, \"probs\": [", i, best);
            for (int c = 0; c < classes; c++)
                printf("%s%.9g", c ? ", " : "", p[c]);
            printf("]}\n");
            continue;
        }
        printf("image %d: class %d (p=%.4f) |", i, best, p[best]);
        for (int c = 0; c < classes; c++)
            printf(" %.4f", p[c]);
        printf("\n");
    }
    clg_free(probs);
    clg_model_destroy(m);
    clg_ctx_destroy(ctx);
    return CLI_OK;
}
