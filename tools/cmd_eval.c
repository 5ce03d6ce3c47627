/* clgrad eval MODEL --weights FILE --data SPEC: accuracy, loss and the
 * confusion matrix on the test split (public API only). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "parallel/comm.h"

static void help(FILE *f)
{
    fprintf(f, "usage: clgrad eval MODEL --weights FILE --data fashion-mnist|mnist|cifar10|PATH [options]\n"
               "\n"
               "Evaluates trained weights on the test split: loss, accuracy and the confusion matrix.\n"
               "\n"
               "  --weights FILE   checkpoint or weights file (safetensors layout) written by train\n"
               "                   (optional for an ONNX model: its weights come with it)\n"
               "  --data SPEC      dataset (fashion-mnist, mnist, cifar10, a directory or an IDX file)\n"
               "  --batch N        batch size (default: the model file's)\n"
               "  --limit N        evaluate only the first N samples\n"
               "  --devices SEL    device selector; runs on the first selected device\n"
               "\n"
               "exit codes: 0 ok, 1 failure, 2 usage error\n");
}

int cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *weights = NULL, *data = NULL, *devices = NULL;
    long batch = 0, limit = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (cli_is_help(a)) {
            help(stdout);
            return CLI_OK;
        }
        if ((r = cli_opt_str(argc, argv, &i, "--weights", &weights)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--data", &data)) != 0 ||
            (r = cli_opt_str(argc, argv, &i, "--devices", &devices)) != 0 ||
            (r = cli_opt_int(argc, argv, &i, "--batch", 1, 1 << 20, &batch)) != 0 ||
            (r = cli_opt_int(argc, argv, &i, "--limit", 1, 0x7fffffff, &limit)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            continue;
        }
        if ((r = cli_model_arg("eval", a, &model)) != CLI_OK)
            return r;
    }
    if (!model)
        return cli_usage_error("eval", "missing MODEL");
    if (!data)
        return cli_usage_error("eval", "missing --data");
    int rc = CLI_OK;
    clg_ctx *ctx = NULL;
    clg_model *m = cli_model_open("eval", model, weights, devices, (int)batch, &ctx, &rc);
    if (!m)
        return rc;
    clg_eval_report rep = {0};
    if (clg_model_evaluate(m, data, limit, &rep) != CLG_OK) {
        int code = cli_fail("eval: %s", clg_last_error(ctx));
        clg_model_destroy(m);
        clg_ctx_destroy(ctx);
        return code;
    }
    if (clg_comm_rank() != 0) /* MPI: every rank evaluated its slices; rank 0 prints the sums once */
        rep.classes = 0;
    else
        printf("samples %d\nloss %.4f\naccuracy %.2f%%\n\nconfusion matrix (rows: true class, columns: predicted)\n",
               rep.samples, rep.loss, 100 * rep.accuracy);
    for (int c = 0; c < rep.classes; c++)
        printf("%s%6d", c ? "" : "      ", c);
    if (rep.classes)
        printf("\n");
    for (int t = 0; t < rep.classes; t++) {
        printf("%6d", t);
        for (int c = 0; c < rep.classes; c++)
            printf("%6lld", (long long)rep.confusion[(size_t)t * rep.classes + c]);
        printf("\n");
    }
    clg_eval_report_free(&rep);
    clg_model_destroy(m);
    clg_ctx_destroy(ctx);
    return CLI_OK;
}
