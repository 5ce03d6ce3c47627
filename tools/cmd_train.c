/* clgrad train MODEL --data SPEC [options]: trains a model (public API only). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "parallel/comm.h"

static void help(FILE *f)
{
    fprintf(f,
            "usage: clgrad train MODEL --data fashion-mnist|mnist|cifar10|PATH [options]\n"
            "\n"
            "Trains MODEL (a model file, e.g. models/vgg-s.cfg, or a shipped model by name:\n"
            "lenet5, vgg-s, resnet-mini) and evaluates it on the test\n"
            "split after every epoch. Defaults come from the model file's [net] section.\n"
            "\n"
            "  --data SPEC          dataset: fashion-mnist, mnist, cifar10, a directory or an IDX file\n"
            "  --epochs N           epochs to train\n"
            "  --batch N            batch size\n"
            "  --lr X               learning rate\n"
            "  --optimizer NAME     sgd, adam or adamw\n"
            "  --momentum X         SGD momentum\n"
            "  --weight-decay X     weight decay (L2 for sgd/adam, decoupled for adamw)\n"
            "  --schedule NAME      none, step or cosine\n"
            "  --warmup N           linear learning-rate warm-up over N steps\n"
            "  --clip-norm X        clip gradients to global L2 norm X (0: off)\n"
            "  --augment SPEC       training-image augmentation: none, flip (random left-right\n"
            "                       mirror), shift:N (random translation by up to N pixels) or\n"
            "                       flip,shift:N (default: the model's [net] augment_* keys)\n"
            "  --gemm-backend B     auto, own or clblast (option gemm_backend)\n"
            "  --devices SEL        device selector (all, gpu, cpu, 0,2, name:TEXT; default all): one\n"
            "                       replica per device, each batch split between them (data parallel)\n"
            "  --split S            batch split: auto (by measured speed, re-balanced; default), even,\n"
            "                       or weights per device such as 3,1\n"
            "  --bucket-mb X        gradient reduction bucket size in MiB (default 25)\n"
            "  --trace FILE.json    Chrome-trace timeline of the first 20 steps (per device: layers,\n"
            "                       uploads, gradient bucket transfers, reduction, waits)\n"
            "  --deterministic      MPI: sum the gradients over the ranks in rank order (two runs are\n"
            "                       bitwise equal) and split each rank's slice evenly over its devices\n"
            "  --comm-timeout SEC   MPI: a rank that died or hangs fails the others after SEC seconds\n"
            "                       (default 60; 10x until the first all-reduce completes)\n"
            "  --precision P        fp32 (default) or fp16: activations and weights stored in half,\n"
            "                       fp32 master weights, dynamic loss scaling (layers compute in fp32)\n"
            "  --checkpoint DIR     save DIR/last.safetensors after every epoch and at the end\n"
            "  --resume             continue from DIR/last.safetensors (same batch and --epochs)\n"
            "  --seed N             seed for weights and shuffling (default 1)\n"
            "  --log FILE.csv       per-epoch CSV log; an SVG plot is written next to it\n"
            "  --steps N            stop after N optimizer steps in total (checkpoint saved)\n"
            "  --limit-train N      use only the first N training samples\n"
            "  --limit-test N       evaluate on only the first N test samples\n"
            "  --no-eval            skip the per-epoch test evaluation\n"
            "  --save FILE          write the final weights to FILE (safetensors layout)\n"
            "  --quiet              no layer table and no progress\n"
            "  --verbose            debug logging\n"
            "\n"
            "exit codes: 0 ok, 1 failure (bad model file, missing data, ...), 2 usage error\n");
}

int cmd_train(int argc, char **argv)
{
    clg_train_params p;
    clg_train_params_init(&p);
    p.progress = 1;
    const char *devices = NULL;
    int verbose = 0, deterministic = 0;
    double comm_timeout = 0;
    long v;
    double d;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (cli_is_help(a)) {
            help(stdout);
            return CLI_OK;
        }
#define OPT(call)                   \
    if ((r = (call)) != 0) {        \
        if (r < 0)                  \
            return CLI_USAGE;       \
        continue;                   \
    }
        OPT(cli_opt_str(argc, argv, &i, "--data", &p.data));
        if ((r = cli_opt_int(argc, argv, &i, "--epochs", 1, 1000000, &v)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            p.epochs = (int)v;
            continue;
        }
        if ((r = cli_opt_int(argc, argv, &i, "--batch", 1, 1 << 20, &v)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            p.batch = (int)v;
            continue;
        }
        if ((r = cli_opt_double(argc, argv, &i, "--lr", &d)) != 0) {
            if (r < 0 || d < 0)
                return r < 0 ? CLI_USAGE : cli_usage_error("train", "--lr must be >= 0");
            p.learning_rate = d;
            continue;
        }
        OPT(cli_opt_str(argc, argv, &i, "--optimizer", &p.optimizer));
        if ((r = cli_opt_double(argc, argv, &i, "--momentum", &d)) != 0) {
            if (r < 0 || d < 0 || d >= 1)
                return r < 0 ? CLI_USAGE : cli_usage_error("train", "--momentum must be in [0, 1)");
            p.momentum = d;
            continue;
        }
        if ((r = cli_opt_double(argc, argv, &i, "--weight-decay", &d)) != 0) {
            if (r < 0 || d < 0)
                return r < 0 ? CLI_USAGE : cli_usage_error("train", "--weight-decay must be >= 0");
            p.weight_decay = d;
            continue;
        }
        OPT(cli_opt_str(argc, argv, &i, "--schedule", &p.schedule));
        if ((r = cli_opt_int(argc, argv, &i, "--warmup", 0, 1L << 40, &v)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            p.warmup = v;
            continue;
        }
        if ((r = cli_opt_double(argc, argv, &i, "--clip-norm", &d)) != 0) {
            if (r < 0 || d < 0)
                return r < 0 ? CLI_USAGE : cli_usage_error("train", "--clip-norm must be >= 0");
            p.clip_norm = d;
            continue;
        }
        OPT(cli_opt_str(argc, argv, &i, "--augment", &p.augment));
        OPT(cli_opt_str(argc, argv, &i, "--devices", &devices));
        OPT(cli_opt_str(argc, argv, &i, "--split", &p.split));
        OPT(cli_opt_str(argc, argv, &i, "--trace", &p.trace));
        if ((r = cli_opt_double(argc, argv, &i, "--bucket-mb", &d)) != 0) {
            if (r < 0 || !(d > 0 && d <= 65536))
                return r < 0 ? CLI_USAGE : cli_usage_error("train", "--bucket-mb must be in (0, 65536]");
            p.bucket_mb = d;
            continue;
        }
        const char *gb = NULL;
        static const char *const gemm_backends[] = {"auto", "own", "clblast", NULL};
        if ((r = cli_opt_choice(argc, argv, &i, "--gemm-backend", gemm_backends, &gb)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            if (cli_option_set("--gemm-backend", "gemm_backend", gb) != CLI_OK)
                return CLI_USAGE;
            continue;
        }
        OPT(cli_opt_str(argc, argv, &i, "--precision", &p.precision));
        OPT(cli_opt_str(argc, argv, &i, "--checkpoint", &p.checkpoint_dir));
        if (strcmp(a, "--deterministic") == 0) {
            deterministic = 1;
            continue;
        }
        if ((r = cli_opt_double(argc, argv, &i, "--comm-timeout", &d)) != 0) {
            if (r < 0 || !(d > 0 && d <= 86400))
                return r < 0 ? CLI_USAGE : cli_usage_error("train", "--comm-timeout must be in (0, 86400] seconds");
            comm_timeout = d;
            continue;
        }
        if (strcmp(a, "--resume") == 0) {
            p.resume = 1;
            continue;
        }
        if ((r = cli_opt_int(argc, argv, &i, "--seed", 0, 0x7fffffffffffffffL, &v)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            p.seed = (uint64_t)v;
            continue;
        }
        OPT(cli_opt_str(argc, argv, &i, "--log", &p.log_csv));
        if ((r = cli_opt_int(argc, argv, &i, "--steps", 1, 0x7fffffffffffffffL, &v)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            p.max_steps = v;
            continue;
        }
        if ((r = cli_opt_int(argc, argv, &i, "--limit-train", 1, 0x7fffffff, &v)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            p.limit_train = v;
            continue;
        }
        if ((r = cli_opt_int(argc, argv, &i, "--limit-test", 1, 0x7fffffff, &v)) != 0) {
            if (r < 0)
                return CLI_USAGE;
            p.limit_test = v;
            continue;
        }
        if (strcmp(a, "--no-eval") == 0) {
            p.limit_test = -1;
            continue;
        }
        OPT(cli_opt_str(argc, argv, &i, "--save", &p.save_weights));
        if (strcmp(a, "--quiet") == 0) {
            p.progress = 0;
            continue;
        }
        if (strcmp(a, "--verbose") == 0) {
            verbose = 2;
            continue;
        }
#undef OPT
        if ((r = cli_model_arg("train", a, &p.model)) != CLI_OK)
            return r;
    }
    if (!p.model)
        return cli_usage_error("train", "missing MODEL (a model file such as models/lenet5.cfg)");
    if (!p.data)
        return cli_usage_error("train", "missing --data (fashion-mnist, mnist, cifar10 or a path)");
    if (p.precision && strcmp(p.precision, "fp32") != 0 && strcmp(p.precision, "fp16") != 0)
        return cli_usage_error("train", "--precision must be fp32 or fp16, got '%s'", p.precision);
    clg_comm_configure(comm_timeout, deterministic);
    int rc = CLI_OK;
    clg_ctx *ctx = cli_ctx_open(devices, verbose, &rc);
    if (!ctx)
        return rc;
    p.devices = "all"; /* every device of the context (selected by --devices) */
    pid_t helper = cli_precompile_spawn(ctx, p.model, p.batch, devices, p.precision);
    clg_train_report rep;
    clg_status st = clg_train_run(ctx, &p, &rep);
    cli_precompile_stop(helper);
    if (st != CLG_OK) {
        int code = cli_fail("train: %s", clg_last_error(ctx));
        clg_ctx_destroy(ctx);
        return code;
    }
    if (clg_comm_rank() != 0) { /* MPI: rank 0 reports */
        clg_ctx_destroy(ctx);
        return CLI_OK;
    }
    printf("trained %d epoch(s), %lld steps in %.1f s (%.0f images/s)\n", rep.epochs_done, (long long)rep.steps,
           rep.seconds, rep.images_per_s);
    printf("train loss %.4f accuracy %.2f%%\n", rep.train_loss, 100 * rep.train_accuracy);
    if (rep.devices > 1)
        printf("devices %d, batch split %s\n", rep.devices, rep.shares);
    if (clg_comm_size() > 1)
        printf("MPI ranks %d x %d device(s)\n", clg_comm_size(), rep.devices);
    if (rep.test_accuracy >= 0)
        printf("test loss %.4f accuracy %.2f%%\n", rep.test_loss, 100 * rep.test_accuracy);
    clg_ctx_destroy(ctx);
    return CLI_OK;
}
