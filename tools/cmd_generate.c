/* clgrad generate MODEL --weights FILE [--prompt TEXT] [--tokens N]
 * [--temperature T] [--top-k K] [--seed S] [--no-cache]: samples bytes from
 * a token model (clg_model_generate, public API only), streaming them to
 * stdout. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

typedef struct generate_opts {
    cli_common c;
    const char *prompt;
    int tokens;
    double temperature;
    int top_k;
    long long seed;
    int no_cache;
    int stats;
} generate_opts;

static const cli_opt opts[] = {
    CLI_OPT_WEIGHTS,
    CLI_STRING_OPT("--prompt", generate_opts, prompt, "TEXT",
                   "text the model continues (not printed; its last context - 1 bytes\n"
                   "when longer; default: a newline)"),
    CLI_INT_OPT("--tokens", generate_opts, tokens, 1, 1 << 24, "N", "bytes to generate (default 256)"),
    CLI_DOUBLE_OPT("--temperature", generate_opts, temperature, 0, 100, 0, "T",
                   "softmax temperature (default 1; 0: always the most likely byte)"),
    CLI_INT_OPT("--top-k", generate_opts, top_k, 0, 256, "K", "sample among the K most likely bytes (default 0: all)"),
    CLI_INT_OPT("--seed", generate_opts, seed, 0, INT64_MAX, "S", "sampling seed (default 1): same seed, same bytes"),
    CLI_FLAG_OPT("--no-cache", generate_opts, no_cache, 1,
                 "recompute the whole window for every byte instead of using the\n"
                 "key/value cache (same bytes, slower: for tests and benchmarks)"),
    CLI_FLAG_OPT("--stats", generate_opts, stats, 1, "print bytes, seconds and bytes/s to stderr at the end"),
    CLI_CHOICE_OPT("--precision", cli_common, precision, cli_precisions, "P",
                   "fp32 (default) or fp16: the decoder stores its weights (rounded to half),\n"
                   "the activations and the key/value cache in half (half the cache's\n"
                   "memory; fp32 arithmetic); weights of either precision load"),
    CLI_OPT_DEVICES,
    CLI_END,
};

const cli_spec cli_spec_generate = {
    .name = "generate",
    .synopsis = "MODEL --weights FILE [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]",
    .about = "Samples bytes from a trained token model (e.g. gpt-mini) one at a time and writes them\n"
             "to stdout as they come. Each new byte costs one position: the attention layers keep\n"
             "the keys and values of the text so far. When the text fills the model's context, the\n"
             "window slides: the model recomputes its last context / 2 bytes and goes on.",
    .opts = opts,
    .positional = cli_model_positional,
    .notes = "The model must read token ids ([net] input = tokens) and predict the 256 byte values\n"
             "at every position; --weights must come from the same model file.",
};

static int put_byte(void *user, unsigned char b)
{
    (void)user;
    putchar(b);
    fflush(stdout);
    return 0;
}

int cmd_generate(int argc, char **argv)
{
    generate_opts o = {0};
    o.tokens = 256;
    o.temperature = 1.0;
    o.seed = 1;
    CLI_PARSE(&cli_spec_generate, argc, argv, &o);
    if (!o.c.model)
        return cli_usage_error("generate", "missing MODEL");
    if (!o.c.weights)
        return cli_usage_error("generate", "missing --weights FILE (a trained model's weights)");
    int rc = CLI_OK;
    clg_ctx *ctx = NULL;
    clg_model *m = cli_model_open("generate", o.c.model, o.c.weights, o.c.devices, 1, &ctx, &rc);
    if (!m)
        return rc;
    clg_generate_params p;
    clg_generate_params_init(&p);
    p.prompt = o.prompt;
    p.tokens = o.tokens;
    p.temperature = o.temperature;
    p.top_k = o.top_k;
    p.seed = (uint64_t)o.seed;
    p.no_cache = o.no_cache;
    p.fp16 = o.c.precision && strcmp(o.c.precision, "fp16") == 0;
    p.on_byte = put_byte;
    clg_generate_report r;
    if (clg_model_generate(m, &p, &r) != CLG_OK) {
        fflush(stdout);
        rc = cli_fail("generate: %s", clg_last_error(ctx));
    } else if (o.stats) {
        fflush(stdout);
        fprintf(stderr,
                "generate: %d bytes in %.3f s (%.1f bytes/s), %d window recomputes, %s, %s, cache %llu bytes\n",
                r.generated, r.seconds, r.seconds > 0 ? r.generated / r.seconds : 0.0, r.recomputes,
                o.no_cache ? "no cache" : "key/value cache", p.fp16 ? "fp16" : "fp32",
                (unsigned long long)r.cache_bytes);
    }
    clg_model_destroy(m);
    clg_ctx_destroy(ctx);
    return rc;
}
