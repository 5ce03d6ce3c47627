/* clgrad train MODEL --data SPEC [options]: trains a model (public API only). */
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

static const char *const optimizers[] = {"sgd", "adam", "adamw", NULL};
static const char *const schedules[] = {"none", "step", "cosine", NULL};

typedef struct train_opts {
    cli_common c;
    clg_train_params p;
    int no_eval;
    double mem_limit;
} train_opts;

#define T train_opts
static const cli_opt opts[] = {
    CLI_OPT_DATA,
    CLI_INT_OPT("--epochs", T, p.epochs, 1, 1000000, "N", "epochs to train"),
    CLI_OPT_BATCH,
    CLI_DOUBLE_OPT("--lr", T, p.learning_rate, 0, DBL_MAX, 0, "X", "learning rate"),
    CLI_CHOICE_OPT("--optimizer", T, p.optimizer, optimizers, "NAME", "sgd, adam or adamw"),
    CLI_DOUBLE_OPT("--momentum", T, p.momentum, 0, 1, CLI_HI_OPEN, "X", "SGD momentum, in [0, 1)"),
    CLI_DOUBLE_OPT("--weight-decay", T, p.weight_decay, 0, DBL_MAX, 0, "X",
                   "weight decay (L2 for sgd/adam, decoupled for adamw)"),
    CLI_CHOICE_OPT("--schedule", T, p.schedule, schedules, "NAME", "learning-rate schedule: none, step or cosine"),
    CLI_INT_OPT("--warmup", T, p.warmup, 0, 1LL << 40, "N", "linear learning-rate warm-up over N steps"),
    CLI_DOUBLE_OPT("--clip-norm", T, p.clip_norm, 0, DBL_MAX, 0, "X", "clip gradients to global L2 norm X (0: off)"),
    CLI_LIST_OPT("--augment", T, p.augment, "SPEC",
                 "training-image augmentation: none, flip (random left-right\n"
                 "mirror), shift:N (random translation by up to N pixels) or\n"
                 "flip,shift:N (default: the model's [net] augment_* keys)"),
    CLI_OPT_GEMM_BACKEND,
    CLI_OPT_DEVICES,
    CLI_SPLIT_OPT(T, p.split,
                 "batch split over the devices: auto (by measured speed,\n"
                 "re-balanced; default), even, or weights per device such as 3,1"),
    CLI_DOUBLE_OPT("--bucket-mb", T, p.bucket_mb, 0, 65536, CLI_LO_OPEN, "X",
                   "gradient reduction bucket size in MiB (default 25)"),
    CLI_OPTS_PIPELINE(T),
    CLI_SHARD_OPT(T, p.shard_optimizer),
    CLI_MEM_LIMIT_OPT(T, mem_limit),
    CLI_STRING_OPT("--trace", T, p.trace, "FILE",
                   "Chrome-trace timeline (JSON) of the first 20 steps (per device:\n"
                   "layers, uploads, gradient bucket transfers, reduction, waits)"),
    CLI_OPT_MPI,
    CLI_OPT_PRECISION,
    CLI_STRING_OPT("--checkpoint", T, p.checkpoint_dir, "DIR",
                   "save DIR/last.safetensors after every epoch and at the end"),
    CLI_FLAG_OPT("--resume", T, p.resume, 1,
                 "continue from DIR/last.safetensors (same model, batch and --epochs;\n"
                 "the model is checked by a hash of its normalized text)"),
    CLI_FLAG_OPT("--resume-weights-only", T, p.resume, 2,
                 "load only the weights of DIR/last.safetensors and train from step 0\n"
                 "(deliberate fine-tuning of a changed model with the same tensors)"),
    CLI_INT_OPT("--seed", T, p.seed, 0, INT64_MAX, "N", "seed for weights and shuffling (default 1)"),
    CLI_STRING_OPT("--log", T, p.log_csv, "FILE", "per-epoch CSV log; an SVG plot is written next to it"),
    CLI_INT_OPT("--steps", T, p.max_steps, 1, INT64_MAX, "N",
                "stop after N optimizer steps in total (checkpoint saved)"),
    CLI_INT_OPT("--limit-train", T, p.limit_train, 1, INT32_MAX, "N", "use only the first N training samples"),
    CLI_INT_OPT("--limit-test", T, p.limit_test, 1, INT32_MAX, "N", "evaluate on only the first N test samples"),
    CLI_FLAG_OPT("--no-eval", T, no_eval, 1, "skip the per-epoch test evaluation"),
    CLI_DOUBLE_OPT("--val-fraction", T, p.val_fraction, 0, 1, CLI_HI_OPEN, "X",
                   "hold out this fraction of the training set and evaluate on it\n"
                   "instead of the test set (0: the test set; the log's test columns\n"
                   "are then the validation split's)"),
    CLI_INT_OPT("--val-seed", T, p.val_seed, 1, INT64_MAX, "N",
                "seed of the --val-fraction hold-out (default 1; not --seed, so runs\n"
                "with other seeds are compared on the same samples)"),
    CLI_STRING_OPT("--save", T, p.save_weights, "FILE", "write the final weights to FILE (safetensors layout)"),
    CLI_FLAG_OPT("--quiet", T, p.progress, 0, "no layer table and no progress"),
    CLI_OPT_VERBOSE,
    CLI_END,
};
#undef T

const cli_spec cli_spec_train = {
    .name = "train",
    .synopsis = "MODEL --data fashion-mnist|mnist|cifar10|PATH|text:FILE [options]",
    .about = "Trains MODEL (a model file, e.g. models/vgg-s.cfg, or a shipped model by name:\n"
             "lenet5, vgg-s, resnet-mini) and evaluates it on the test split after every\n"
             "epoch. Defaults come from the model file's [net] section. With several devices\n"
             "(--devices) each holds a replica and every batch is split between them.\n"
             "--data text:FILE trains a model reading token ids (e.g. gpt-mini) on any file, bytes\n"
             "as tokens: windows of context + 1 bytes at random offsets drawn from (seed, epoch,\n"
             "step), an epoch being (training bytes) / context windows; the last 10% of the file\n"
             "is held out for the loss and bits per byte after every epoch.",
    .opts = opts,
    .positional = cli_model_positional,
};

/* Prints the results of a finished run (rank 0); text: bits per byte instead of accuracy. */
static void print_report(const clg_train_report *rep, int val, int text)
{
    if (rep->tokens_per_sample > 0) /* a token model: a sample is a window of tokens */
        printf("trained %d epoch(s), %lld steps in %.1f s (%.0f tokens/s)\n", rep->epochs_done, (long long)rep->steps,
               rep->seconds, rep->tokens_per_s);
    else
        printf("trained %d epoch(s), %lld steps in %.1f s (%.0f images/s)\n", rep->epochs_done,
               (long long)rep->steps, rep->seconds, rep->images_per_s);
    printf("train loss %.4f accuracy %.2f%%\n", rep->train_loss, 100 * rep->train_accuracy);
    if (rep->devices > 1)
        printf("devices %d, batch split %s\n", rep->devices, rep->shares);
    if (clg_mpi_size() > 1)
        printf("MPI ranks %d x %d device(s)\n", clg_mpi_size(), rep->devices);
    if (rep->test_accuracy >= 0 && text)
        printf("held-out loss %.4f, %.4f bits per byte\n", rep->test_loss, rep->test_loss / 0.69314718055994531);
    else if (rep->test_accuracy >= 0)
        printf("%s loss %.4f accuracy %.2f%%\n", val ? "validation" : "test", rep->test_loss, 100 * rep->test_accuracy);
}

int cmd_train(int argc, char **argv)
{
    train_opts o = {0};
    clg_train_params_init(&o.p);
    o.p.progress = 1;
    CLI_PARSE(&cli_spec_train, argc, argv, &o);
    clg_train_params p = o.p;
    p.model = o.c.model;
    p.data = o.c.data;
    p.batch = o.c.batch;
    p.precision = o.c.precision;
    if (o.no_eval)
        p.limit_test = -1;
    if (!p.model)
        return cli_usage_error("train", "missing MODEL (a model file such as models/lenet5.cfg)");
    if (!p.data)
        return cli_usage_error("train", "missing --data (fashion-mnist, mnist, cifar10 or a path)");
    if (o.c.gemm_backend && cli_option_set("--gemm-backend", "gemm_backend", o.c.gemm_backend) != CLI_OK)
        return CLI_USAGE;
    if (cli_mem_limit(o.mem_limit) != CLI_OK)
        return CLI_USAGE;
    if (cli_mpi_setup(o.c.comm_timeout, o.c.deterministic) != CLI_OK)
        return CLI_USAGE;
    int rc = CLI_OK;
    clg_ctx *ctx = cli_ctx_open(o.c.devices, o.c.verbose, &rc);
    if (!ctx)
        return rc;
    p.devices = "all"; /* every device of the context (selected by --devices) */
    pid_t helper = cli_precompile_spawn(ctx, p.model, p.batch, o.c.devices, p.precision, o.c.verbose);
    p.first_step_done = cli_precompile_stop_cb; /* its work is done once the first step built every kernel */
    p.first_step_done_user = &helper;
    clg_train_report rep;
    clg_status st = clg_train_run(ctx, &p, &rep);
    cli_precompile_stop(helper);
    if (st == CLG_OK)
        cli_tune_spawn(ctx, o.c.devices, o.c.verbose);
    if (st != CLG_OK) {
        int code = cli_fail("train: %s", clg_last_error(ctx));
        clg_ctx_destroy(ctx);
        return code;
    }
    if (clg_mpi_rank() == 0) /* MPI: rank 0 reports */
        print_report(&rep, p.val_fraction > 0, strncmp(p.data, "text:", 5) == 0);
    clg_ctx_destroy(ctx);
    return CLI_OK;
}
