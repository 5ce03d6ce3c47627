/* clgrad eval MODEL --weights FILE --data SPEC: accuracy, loss and the
 * confusion matrix on the test split (public API only). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

typedef struct eval_opts {
    cli_common c;
    long limit;
    clg_model_params p; /* the pipeline fields only */
} eval_opts;

static const cli_opt opts[] = {
    CLI_OPT_WEIGHTS,
    CLI_OPT_DATA,
    CLI_OPT_BATCH,
    CLI_INT_OPT("--limit", eval_opts, limit, 1, INT32_MAX, "N", "evaluate only the first N samples"),
    CLI_OPT_DEVICES,
    CLI_OPTS_PIPELINE(eval_opts),
    CLI_END,
};

const cli_spec cli_spec_eval = {
    .name = "eval",
    .synopsis = "MODEL --weights FILE --data fashion-mnist|mnist|cifar10|PATH|text:FILE [options]",
    .about = "Evaluates trained weights on the test split: loss, accuracy and the confusion matrix.\n"
             "With text:FILE (a model reading token ids): loss and bits per byte (loss / ln 2) on the\n"
             "file's held-out last 10%, in consecutive windows of the model's context.\n"
             "The batches are split over the selected devices (default: the model file's batch).\n"
             "From a checkpoint, eval reads the weights and the input normalization only: the\n"
             "training state (step, epoch, seed, rng, optimizer.*) is ignored by design, and\n"
             "checked only by 'clgrad train --resume'.",
    .opts = opts,
    .positional = cli_model_positional,
};

int cmd_eval(int argc, char **argv)
{
    eval_opts o = {0};
    CLI_PARSE(&cli_spec_eval, argc, argv, &o);
    const char *model = o.c.model, *data = o.c.data;
    long limit = o.limit;
    if (!model)
        return cli_usage_error("eval", "missing MODEL");
    if (!data)
        return cli_usage_error("eval", "missing --data");
    int rc = CLI_OK;
    clg_ctx *ctx = NULL;
    clg_model *m = cli_model_open_pipe("eval", model, o.c.weights, o.c.devices, o.c.batch, &o.p, &ctx, &rc);
    if (!m)
        return rc;
    clg_eval_report rep = {0};
    if (clg_model_evaluate(m, data, limit, &rep) != CLG_OK) {
        int code = cli_fail("eval: %s", clg_last_error(ctx));
        clg_model_destroy(m);
        clg_ctx_destroy(ctx);
        return code;
    }
    int text = strncmp(data, "text:", 5) == 0;
    if (clg_mpi_rank() != 0) /* MPI: every rank evaluated its slices; rank 0 prints the sums once */
        rep.classes = 0;
    else if (text) /* the held-out tail of the file */
        printf("windows %d\nloss %.4f\nbits per byte %.4f\n", rep.samples, rep.loss, rep.bits_per_byte);
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
