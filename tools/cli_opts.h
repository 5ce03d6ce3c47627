/* The command line's option tables: every command declares its options in
 * one table (name, kind, range or choices, target field, help); parsing,
 * `--help`, usage errors and the man page (clgrad help --man) come from it.
 * Options several commands take are shared entries (CLI_OPT_DEVICES, ...)
 * that fill a cli_common at the start of every command's options struct,
 * so they are spelled, validated and documented the same way everywhere. */
#ifndef CLG_CLI_OPTS_H
#define CLG_CLI_OPTS_H

#include <stddef.h>
#include <stdio.h>

typedef enum cli_kind {
    CLI_FLAG,   /* no value: stores .set in an int */
    CLI_INT,    /* plain decimal integer in [ilo, ihi] (an int or 8-byte field) */
    CLI_DOUBLE, /* plain decimal number in the range [lo, hi], ends open per .open */
    CLI_STRING, /* any text */
    CLI_CHOICE, /* one of .choices */
    CLI_LIST,   /* comma-separated items, none empty */
} cli_kind;

/* .open bits for a CLI_DOUBLE range */
#define CLI_LO_OPEN 1u
#define CLI_HI_OPEN 2u

typedef struct cli_opt {
    const char *name;  /* "--batch"; NULL ends a table */
    const char *alias; /* another accepted spelling ("-o", "--device") or NULL */
    cli_kind kind;
    size_t off;  /* the field in the command's options struct */
    size_t size; /* its size: CLI_INT stores 4 or 8 bytes */
    long long ilo, ihi;
    double lo, hi;
    unsigned open;
    const char *const *choices; /* CLI_CHOICE: NULL-terminated */
    int set;                    /* CLI_FLAG: the value stored */
    const char *arg;            /* the value's name in help: N, FILE, SEL */
    const char *help;           /* one line; '\n' continues it on the next */
    /* CLI_LIST: a further check of the value; returns NULL or what is expected (for the usage error) */
    const char *(*check)(const char *value);
} cli_opt;

/* What several commands take; the first member of every command's options
 * struct, so the shared entries below fill it whatever the command. */
typedef struct cli_common {
    const char *model;     /* MODEL (positional, or --model for bench targets) */
    const char *devices;   /* --devices SEL */
    const char *data;      /* --data SPEC */
    int batch;             /* --batch N (0: not given) */
    const char *precision; /* --precision fp32|fp16 (NULL: not given) */
    const char *gemm_backend;
    const char *weights;
    int json, verbose, deterministic;
    double comm_timeout; /* 0: not given */
} cli_common;

#define CLI_FIELD_(T, f) .off = offsetof(T, f), .size = sizeof(((T *)0)->f)
#define CLI_FLAG_OPT(nm, T, f, value, hlp) {.name = nm, .kind = CLI_FLAG, CLI_FIELD_(T, f), .set = value, .help = hlp}
#define CLI_INT_OPT(nm, T, f, lo_, hi_, meta, hlp) \
    {.name = nm, .kind = CLI_INT, CLI_FIELD_(T, f), .ilo = lo_, .ihi = hi_, .arg = meta, .help = hlp}
#define CLI_DOUBLE_OPT(nm, T, f, lo_, hi_, open_, meta, hlp) \
    {.name = nm, .kind = CLI_DOUBLE, CLI_FIELD_(T, f), .lo = lo_, .hi = hi_, .open = open_, .arg = meta, .help = hlp}
#define CLI_STRING_OPT(nm, T, f, meta, hlp) {.name = nm, .kind = CLI_STRING, CLI_FIELD_(T, f), .arg = meta, .help = hlp}
#define CLI_LIST_OPT(nm, T, f, meta, hlp) {.name = nm, .kind = CLI_LIST, CLI_FIELD_(T, f), .arg = meta, .help = hlp}
#define CLI_CHOICE_OPT(nm, T, f, list, meta, hlp) \
    {.name = nm, .kind = CLI_CHOICE, CLI_FIELD_(T, f), .choices = list, .arg = meta, .help = hlp}
#define CLI_END {.name = NULL}

/* --split: auto, even, or weights each a plain decimal in [0, 1e6], non-zero ones within a ratio of 1e6
 * (the library checks the count against the devices) */
const char *cli_check_split(const char *value);
#define CLI_SPLIT_OPT(T, f, hlp) \
    {.name = "--split", .kind = CLI_LIST, CLI_FIELD_(T, f), .arg = "S", .help = hlp, .check = cli_check_split}

extern const char *const cli_precisions[];    /* fp32, fp16 */
extern const char *const cli_gemm_backends[]; /* auto, own, clblast */
extern const char *const cli_pipe_schedules[]; /* 1f1b, gpipe */

/* Pipeline parallelism (train, bench train): T's p.parallel, p.stages, p.microbatches, p.pipe_schedule. */
#define CLI_OPTS_PIPELINE(T)                                                                                     \
    CLI_STRING_OPT("--parallel", T, p.parallel, "LAYOUT",                                                       \
                   "pp=K: a pipeline of K stages, one per device (--devices must\n"                             \
                   "select K), each holding only its layers; tp=T: tensor\n"                                      \
                   "parallelism, dense pairs split over T devices; pp=K,tp=T:\n"                                 \
                   "each stage over T devices (K x T); dp=D,...: D copies, each\n"                               \
                   "1/D of the batch"),                                                                           \
        CLI_LIST_OPT("--stages", T, p.stages, "NAMES",                                                           \
                     "pipeline cuts: after these layers (K-1 names; NAME:F cuts inside\n"                       \
                     "a conv or dense layer after the fraction F of its output\n"                                 \
                     "channels; default: balanced by measured layer times, within\n"                             \
                     "each device's memory limit, inside a layer when that balances\n"                           \
                     "2 stages better)"),                                                                          \
        CLI_INT_OPT("--microbatches", T, p.microbatches, 1, 1024, "M",                                           \
                    "pipeline micro-batches per step (default 4 x K)"),                                           \
        CLI_CHOICE_OPT("--pipe-schedule", T, p.pipe_schedule, cli_pipe_schedules, "NAME",                        \
                       "pipeline schedule: 1f1b (default) or gpipe"),                                             \
        CLI_FLAG_OPT("--pipe-recompute", T, p.pipe_recompute, 1,                                                 \
                     "pipeline: keep only each stage's entering activations per\n"                               \
                     "micro-batch and run its forward again before the backward")

/* ---- shared entries (one definition each: same name, range, help) ---- */
#define CLI_BATCH_MAX (1 << 20)
#define CLI_OPT_DEVICES                                                                                         \
    CLI_LIST_OPT("--devices", cli_common, devices, "SEL",                                                       \
                 "device selector: all (default), gpu, cpu, accelerator, 0,2 or name:TEXT")
#define CLI_OPT_JSON CLI_FLAG_OPT("--json", cli_common, json, 1, "machine-readable JSON on stdout")
#define CLI_OPT_VERBOSE CLI_FLAG_OPT("--verbose", cli_common, verbose, 2, "debug logging (program builds, cache loads)")
#define CLI_OPT_DATA                                                                                            \
    CLI_STRING_OPT("--data", cli_common, data, "SPEC",                                                          \
                   "dataset: fashion-mnist, mnist, cifar10, a directory, an IDX file, or text:FILE (bytes as "   \
                   "tokens, for a model reading token ids)")
#define CLI_OPT_BATCH CLI_INT_OPT("--batch", cli_common, batch, 1, CLI_BATCH_MAX, "N", "batch size")
#define CLI_OPT_MODEL CLI_STRING_OPT("--model", cli_common, model, "MODEL", "model file or shipped model name")
#define CLI_OPT_WEIGHTS                                                                                         \
    CLI_STRING_OPT("--weights", cli_common, weights, "FILE",                                                    \
                   "weights or checkpoint written by train (safetensors layout);\n"                             \
                   "optional for an ONNX model, whose weights come with it")
#define CLI_OPT_PRECISION                                                                                       \
    CLI_CHOICE_OPT("--precision", cli_common, precision, cli_precisions, "P",                                   \
                   "fp32 or fp16 (default fp32); fp16: half storage, fp32 master weights,\n"  \
                   "dynamic loss scaling (layers compute in fp32)")
#define CLI_OPT_GEMM_BACKEND                                                                                    \
    CLI_CHOICE_OPT("--gemm-backend", cli_common, gemm_backend, cli_gemm_backends, "B",                          \
                   "GEMM backend: auto, own or clblast")
#define CLI_OPT_MPI                                                                                             \
    CLI_FLAG_OPT("--deterministic", cli_common, deterministic, 1,                                               \
                 "MPI: sum the gradients over the ranks in rank order and split each\n"                         \
                 "rank's slice evenly over its devices; convolutions run their default\n"                       \
                 "algorithms, not measured choices (two runs are bitwise equal)"),                              \
        CLI_DOUBLE_OPT("--comm-timeout", cli_common, comm_timeout, 0, 86400, CLI_LO_OPEN, "SEC",                \
                       "MPI: a rank that died or hangs fails the others after SEC seconds\n"                    \
                       "(default 60; 10x until the first all-reduce completes)")

/* Sharded optimizer state and the device memory cap (train, bench train). */
#define CLI_SHARD_OPT(T, f)                                                                                     \
    CLI_FLAG_OPT("--shard-optimizer", T, f, 1,                                                                  \
                 "with several devices: each keeps the optimizer state of 1/N of the\n"                         \
                 "parameters and updates that part; the parts are gathered (ZeRO-1)")
#define CLI_MEM_LIMIT_OPT(T, f)                                                                                 \
    CLI_DOUBLE_OPT("--device-mem-limit", T, f, 0, 1e9, CLI_LO_OPEN, "MIB",                                     \
                   "test aid: cap each device's memory (buffer pool and arenas) at MIB MiB;\n"                  \
                   "allocations past it are refused, naming the device (option device_mem_limit)")
/* --device-mem-limit given (mib > 0): sets the option device_mem_limit; CLI_OK or CLI_USAGE. */
int cli_mem_limit(double mib);

/* A command: its table and texts. */
typedef struct cli_spec {
    const char *name;     /* "train", "bench train" */
    const char *synopsis; /* after the name: "MODEL --data SPEC [options]" */
    const char *about;    /* what it does (paragraphs; plain text) */
    const cli_opt *opts;  /* ends with CLI_END */
    /* a non-option argument: NULL refuses any; returns CLI_OK or an exit code */
    int (*positional)(const char *cmd, const char *arg, void *opts);
    const char *notes; /* after the options (may be NULL) */
} cli_spec;

/* Returned by cli_parse after printing --help: the command returns CLI_OK. */
#define CLI_HELP (-1)

/* Parses argv[1..] into opts (whose fields keep their values unless given).
 * Returns CLI_OK, CLI_HELP (help printed on stdout) or CLI_USAGE (message
 * naming the option printed on stderr). Accepts --name value and --name=value. */
int cli_parse(const cli_spec *spec, int argc, char **argv, void *opts);
/* cli_parse for a command's options, returning from the command on help or error. */
#define CLI_PARSE(spec, argc, argv, opts)                         \
    do {                                                         \
        int cli_rc_ = cli_parse((spec), (argc), (argv), (opts)); \
        if (cli_rc_ != 0)                                        \
            return cli_rc_ == CLI_HELP ? 0 : cli_rc_;            \
    } while (0)

/* A positional MODEL argument (cli_model_arg into cli_common.model). */
int cli_model_positional(const char *cmd, const char *arg, void *opts);

/* The command's --help: usage line, about, options, notes. */
void cli_help(FILE *f, const cli_spec *spec);

/* Every command's spec, for `clgrad help --man` (cli_man.c). */
extern const cli_spec cli_spec_devices, cli_spec_selfcheck, cli_spec_train, cli_spec_eval, cli_spec_predict,
    cli_spec_export, cli_spec_tune, cli_spec_precompile, cli_spec_bench_gemm, cli_spec_bench_conv,
    cli_spec_bench_train, cli_spec_bench_prim, cli_spec_bench_allreduce, cli_spec_bench_start, cli_spec_options,
    cli_spec_sweep, cli_spec_bench_attention, cli_spec_generate;
/* Prints the man page (roff) to f; the ENVIRONMENT section is a marker line
 * that tests/cli_man.py fills in from docs/clgrad.1 (the options table's). */
void cli_man(FILE *f);

#endif
