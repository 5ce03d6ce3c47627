/* clgrad predict MODEL [--weights FILE] --input FILE [--json]: class
 * probabilities for every image of an IDX file (uint8 or float32) or a PGM
 * image (public API only). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void help(FILE *f)
{
    fprintf(f, "usage: clgrad predict MODEL [--weights FILE] --input FILE [--json] [options]\n"
               "\n"
               "Prints the class probabilities of every image in FILE (an IDX images file, plain or\n"
               ".gz, or a PGM image) and the most likely class.\n"
               "\n"
               "  --weights FILE   weights written by train (safetensors layout); optional for an\n"
               "                   ONNX model, whose weights come with it\n"
               "  --input FILE     IDX (unsigned byte 0x08: pixel / 255; float32 0x0D: values as\n"
               "                   they are) or PGM image(s) with the model's input shape\n"
               "  --json           one JSON object per line and image:\n"
               "                   {\"index\": i, \"class\": c, \"probs\": [...]}\n"
               "  --limit N        print only the first N images\n"
               "  --devices SEL    device selector; runs on the first selected device\n"
               "\n"
               "exit codes: 0 ok, 1 failure, 2 usage error\n");
}

int cmd_predict(int argc, char **argv)
{
    const char *model = NULL, *weights = NULL, *input = NULL, *devices = NULL;
    long limit = 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (cli_is_help(a)) {
            help(stdout);
            return CLI_OK;
        }
        if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        }
        if ((r = cli_opt_str(argc, argv, &i, "--weights", &weights)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--input", &input)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--devices", &devices)) != 0 ||
            (r = cli_opt_int(argc, argv, &i, "--limit", 1, 0x7fffffff, &limit)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            continue;
        }
        if ((r = cli_model_arg("predict", a, &model)) != CLI_OK)
            return r;
    }
    if (!model)
        return cli_usage_error("predict", "missing MODEL");
    if (!input)
        return cli_usage_error("predict", "missing --input FILE");
    int rc = CLI_OK;
    clg_ctx *ctx = NULL;
    clg_model *m = cli_model_open("predict", model, weights, devices, 0, &ctx, &rc);
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
