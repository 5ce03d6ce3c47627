/* `clgrad help --man`: the man page (roff). SYNOPSIS and COMMANDS come from
 * the option tables; docs/clgrad.1 is this output with its ENVIRONMENT
 * section (the library options table's) kept: tests/cli_man.py checks. */
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

static const cli_spec *const specs[] = {
    &cli_spec_devices,     &cli_spec_selfcheck,  &cli_spec_train,       &cli_spec_eval,
    &cli_spec_predict,     &cli_spec_export,     &cli_spec_tune,        &cli_spec_precompile,
    &cli_spec_bench_gemm,  &cli_spec_bench_conv, &cli_spec_bench_train, &cli_spec_bench_prim,
    &cli_spec_bench_allreduce, &cli_spec_bench_start, &cli_spec_options, &cli_spec_sweep,
    &cli_spec_bench_attention, &cli_spec_generate,
};

static const char head[] =
    ".SH DESCRIPTION\n"
    ".B clgrad\n"
    "is the command-line program of the clgrad runtime. It JIT-compiles its own\n"
    "OpenCL kernels (tiled GEMM, Winograd and im2col convolution, pooling,\n"
    "normalisation, optimizers), caches their binaries on disk, and trains\n"
    "convolutional networks described by plain-text model files on any OpenCL\n"
    "1.2 device: GPUs of any vendor, and CPUs through PoCL.\n"
    "Several devices train one model together (data parallel,\n"
    ".BR \\-\\-devices ),\n"
    "and several processes on one or more machines under\n"
    ".BR mpirun (1)\n"
    "(each rank takes its slice of every global batch; gradients are summed\n"
    "across the ranks).\n"
    ".PP\n"
    "Every command takes\n"
    ".B \\-\\-help\n"
    "and lists its options there; they are the same as under COMMANDS below.\n"
    "Progress goes to standard error, results to standard output.\n";

static const char middle[] =
    ".SH MODELS\n"
    ".I MODEL\n"
    "is a model file (INI-like text:\n"
    ".B [net]\n"
    "followed by one section per layer; see\n"
    ".I share/clgrad/models/README.md\n"
    "of the installation), or the name of a shipped model:\n"
    ".BR lenet5 \", \" vgg-s \", \" resnet-mini .\n"
    "A name that is not a file is looked up, as\n"
    ".IR NAME ,\n"
    ".IR NAME .cfg\n"
    "or\n"
    ".IR NAME .onnx,\n"
    "in\n"
    ".BR $CLGRAD_MODEL_DIR ,\n"
    "in\n"
    ".I share/clgrad/models\n"
    "of the installation the program belongs to, in the configured installation\n"
    "directory, and in the source tree of an uninstalled build.\n"
    "So, after installation, from any directory:\n"
    ".PP\n"
    ".RS\n"
    ".B clgrad train lenet5 \\-\\-data fashion\\-mnist\n"
    ".RE\n"
    ".SH DATA\n"
    ".I DATA\n"
    "is\n"
    ".BR fashion\\-mnist ,\n"
    ".B mnist\n"
    "or\n"
    ".B cifar10\n"
    "(looked up in\n"
    ".B $CLGRAD_DATA_DIR\n"
    "and then\n"
    ".IR /usr/share/datasets/NAME ),\n"
    "a directory holding such files, or an IDX file. IDX files and PGM images may be\n"
    "gzip-compressed.\n"
    ".SH DEVICE SELECTORS\n"
    ".BR all \" (default), \" gpu \", \" cpu \", \" accelerator ,\n"
    "an index list such as\n"
    ".BR 0,2 ,\n"
    "or\n"
    ".BI name: SUBSTRING\\fR.\n";

static const char tail[] =
    ".SH EXIT STATUS\n"
    "0 success, 1 failure (bad model file, missing data, device error), 2 usage error.\n"
    ".SH FILES\n"
    ".TP\n"
    ".I share/clgrad/models/\n"
    "The shipped model files.\n"
    ".TP\n"
    ".I include/clgrad.h, include/clgrad_prim.h\n"
    "The C library's headers (models and training; primitives on the caller's\n"
    "OpenCL queue and buffers);\n"
    ".B pkg\\-config clgrad\n"
    "gives the flags.\n"
    ".SH EXAMPLES\n"
    ".nf\n"
    "clgrad devices\n"
    "clgrad train lenet5 \\-\\-data fashion\\-mnist \\-\\-epochs 3 \\-\\-save lenet5.safetensors\n"
    "clgrad eval lenet5 \\-\\-weights lenet5.safetensors \\-\\-data fashion\\-mnist\n"
    "clgrad bench conv \\-\\-n 8 \\-\\-c 64 \\-\\-k 64 \\-\\-h 28 \\-\\-w 28\n"
    "mpirun \\-np 2 \\-\\-host a,b clgrad train lenet5 \\-\\-data fashion\\-mnist \\-\\-checkpoint ck\n"
    ".fi\n"
    ".SH SEE ALSO\n"
    ".BR clinfo (1),\n"
    ".BR mpirun (1),\n"
    ".BR pkg\\-config (1)\n";

/* text as roff: '-' and '\' escaped, a line starting with '.' or '\'' guarded */
static void roff_text(FILE *f, const char *s)
{
    int line_start = 1;
    for (; *s; s++) {
        if (line_start && (*s == '.' || *s == '\''))
            fputs("\\&", f);
        line_start = *s == '\n';
        if (*s == '-')
            fputs("\\-", f);
        else if (*s == '\\')
            fputs("\\e", f);
        else
            fputc(*s, f);
    }
}

static void synopsis(FILE *f)
{
    fputs(".SH SYNOPSIS\n", f);
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        fprintf(f, "%s.B clgrad %s\n", i ? ".br\n" : "", specs[i]->name);
        for (const char *s = specs[i]->synopsis; *s; s++) { /* one line: a break and its indent are a space */
            if (*s == '\n') {
                while (s[1] == ' ')
                    s++;
                fputc(' ', f);
            } else if (*s == '-') {
                fputs("\\-", f);
            } else {
                fputc(*s, f);
            }
        }
        fputc('\n', f);
    }
}

static void command(FILE *f, const cli_spec *sp)
{
    fprintf(f, ".TP\n.B %s\n", sp->name);
    roff_text(f, sp->about);
    fputs("\n.RS\n", f);
    for (const cli_opt *o = sp->opts; o->name; o++) {
        fputs(".TP\n", f);
        if (o->alias) {
            fputs("\\fB", f);
            roff_text(f, o->alias);
            fputs("\\fR, ", f);
        }
        fputs("\\fB", f);
        roff_text(f, o->name);
        fputs("\\fR", f);
        if (o->arg)
            fprintf(f, " \\fI%s\\fR", o->arg);
        fputc('\n', f);
        roff_text(f, o->help);
        if (o->kind == CLI_INT)
            fprintf(f, " [%lld..%lld]", o->ilo, o->ihi);
        fputc('\n', f);
    }
    fputs(".RE\n", f);
    if (sp->notes) {
        fputs(".IP\n", f);
        roff_text(f, sp->notes);
        fputc('\n', f);
    }
}

void cli_man(FILE *f)
{
    fprintf(f, ".TH CLGRAD 1 \"2026-11-26\" \"clgrad %s\" \"User Commands\"\n", clg_version_string());
    fputs(".SH NAME\nclgrad \\- train and run convolutional networks on any OpenCL device\n", f);
    synopsis(f);
    fputs(head, f);
    fputs(".SH COMMANDS\n", f);
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        command(f, specs[i]);
    fputs(middle, f);
    fputs(".SH ENVIRONMENT\n"
          ".\\\" generated from the library's options table; tests/cli_man.py keeps docs/clgrad.1's\n",
          f);
    fputs(tail, f);
}
