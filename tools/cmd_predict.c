/* clgrad predict MODEL [--weights FILE] --input FILE [--json]: class
 * probabilities for every image of an IDX file (uint8 or float32) or a PGM
 * image; for a token model (--data text:FILE or --prompt TEXT) the
 * next-byte distribution at every position of the text, its loss and bits
 * per byte (public API only). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "cli_opts.h"

typedef struct predict_opts {
    cli_common c;
    const char *input;
    const char *prompt;
    long limit;
    int top_k;
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
    CLI_INT_OPT("--limit", predict_opts, limit, 1, INT32_MAX, "N",
                "print only the first N images (text: positions; the loss covers them all)"),
    CLI_OPT_DATA,
    CLI_STRING_OPT("--prompt", predict_opts, prompt, "TEXT", "token model: the text to predict (instead of --data)"),
    CLI_INT_OPT("--top-k", predict_opts, top_k, 1, 256, "K",
                "token model: the K most likely next bytes per position (default 5)"),
    CLI_OPT_DEVICES,
    CLI_OPTS_PIPELINE(predict_opts),
    CLI_END,
};

const cli_spec cli_spec_predict = {
    .name = "predict",
    .synopsis = "MODEL [--weights FILE] (--input FILE | --data text:FILE | --prompt TEXT) [--json] [options]",
    .about = "Prints the class probabilities of every image in FILE (an IDX images file, plain or\n"
             ".gz, or a PGM image) and the most likely class. For a model reading token ids\n"
             "([net] input = tokens, e.g. gpt-mini) and a text (--data text:FILE or --prompt TEXT):\n"
             "at every position the K most likely next bytes with their probabilities and the\n"
             "probability of the byte that does follow, then the text's loss per byte and bits per\n"
             "byte over its predicted bytes (all but the first).",
    .opts = opts,
    .positional = cli_model_positional,
    .notes = "Text: the model sees consecutive windows of its context, each from its first byte, as\n"
             "clgrad eval --data text:FILE does on the file's held-out tail (the last 10%): predict on\n"
             "that tail gives eval's loss when the tail is a multiple of the context plus one byte.\n"
             "Text output per position: `position i 'b': next 'c' (p=P) | top 'x' P 'y' P ...`, the\n"
             "last position `next ?`; then `text N bytes, M predicted: loss L per byte, B bits per\n"
             "byte`. --json: {\"position\": i, \"byte\": b, \"next\": c or null, \"p_next\": P or null,\n"
             "\"top\": [[byte, p], ...]} per position, then {\"bytes\": N, \"predicted\": M, \"loss\": L,\n"
             "\"bits_per_byte\": B}. Memory: 1 KiB of probabilities per byte of text (256 classes).",
};

/* The whole of a text file (regular, 1 byte or more) into *buf. */
static int read_text(const char *path, unsigned char **buf, size_t *len)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return cli_fail("predict: cannot open text file '%s'", path);
    if (!S_ISREG(sb.st_mode))
        return cli_fail("predict: text data '%s' is not a regular file (a directory?)", path);
    if (sb.st_size < 1)
        return cli_fail("predict: text data '%s' is empty: nothing to predict", path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return cli_fail("predict: cannot open text file '%s'", path);
    *len = (size_t)sb.st_size;
    *buf = malloc(*len);
    size_t got = *buf ? fread(*buf, 1, *len, f) : 0;
    fclose(f);
    if (!*buf || got != *len) {
        free(*buf);
        *buf = NULL;
        return cli_fail("predict: cannot read text file '%s' (%zu of %zu bytes)", path, got, *len);
    }
    return CLI_OK;
}

static void put_byte_name(unsigned char b)
{
    if (b == '\n')
        printf("'\\n'");
    else if (b == '\t')
        printf("'\\t'");
    else if (b == '\'' || b == '\\')
        printf("'\\%c'", b);
    else if (b >= 32 && b < 127)
        printf("'%c'", b);
    else
        printf("'\\x%02x'", b);
}

/* The k most likely classes of p[0..V): larger p first, then the lower class. */
static void top_classes(const float *p, int V, int k, int *top)
{
    for (int i = 0; i < k; i++)
        top[i] = -1;
    for (int c = 0; c < V; c++) {
        int j = k;
        while (j > 0 && (top[j - 1] < 0 || p[c] > p[top[j - 1]]))
            j--;
        if (j == k)
            continue;
        memmove(top + j + 1, top + j, (size_t)(k - 1 - j) * sizeof *top);
        top[j] = c;
    }
}

static void print_position(const unsigned char *text, size_t len, size_t i, const float *p, int V, int k, int json)
{
    int top[256];
    top_classes(p, V, k, top);
    int has_next = i + 1 < len;
    int next = has_next ? text[i + 1] : -1;
    if (json) { /* %.9g: a float read back is the same float */
        printf("{\"position\": %zu, \"byte\": %d, ", i, text[i]);
        if (has_next)
            printf("\"next\": %d, \"p_next\": %.9g, \"top\": [", next, p[next]);
        else
            printf("\"next\": null, \"p_next\": null, \"top\": [");
        for (int j = 0; j < k; j++)
            printf("%s[%d, %.9g]", j ? ", " : "", top[j], p[top[j]]);
        printf("]}\n");
        return;
    }
    printf("position %zu ", i);
    put_byte_name(text[i]);
    printf(": next ");
    if (has_next) {
        put_byte_name((unsigned char)next);
        printf(" (p=%.4f) | top", p[next]);
    } else
        printf("? | top");
    for (int j = 0; j < k; j++) {
        printf(" ");
        put_byte_name((unsigned char)top[j]);
        printf(" %.4f", p[top[j]]);
    }
    printf("\n");
}

/* Per-position lines, then the loss of the predicted bytes. */
static int predict_text(clg_model *m, clg_ctx *ctx, const unsigned char *text, size_t len, const predict_opts *o)
{
    float *probs = NULL;
    if (clg_model_predict_text(m, text, len, &probs) != CLG_OK)
        return cli_fail("predict: %s", clg_last_error(ctx));
    int V = 0;
    clg_model_shape(m, NULL, NULL, NULL, &V, NULL);
    int k = o->top_k > 0 ? o->top_k : 5;
    if (k > V)
        k = V;
    double sum = 0.0;
    for (size_t i = 0; i < len; i++) {
        const float *p = probs + i * (size_t)V;
        if (i + 1 < len) /* a probability that underflowed to 0 counts as the smallest float */
            sum -= log(p[text[i + 1]] > 0.0f ? (double)p[text[i + 1]] : 1.401298464e-45);
        if (o->limit <= 0 || i < (size_t)o->limit)
            print_position(text, len, i, p, V, k, o->c.json);
    }
    clg_free(probs);
    size_t pred = len - 1;
    double loss = pred ? sum / (double)pred : 0.0;
    if (o->c.json)
        printf("{\"bytes\": %zu, \"predicted\": %zu, \"loss\": %.9g, \"bits_per_byte\": %.9g}\n", len, pred, loss,
               loss / M_LN2);
    else
        printf("text %zu bytes, %zu predicted: loss %.6f per byte, %.6f bits per byte\n", len, pred, loss,
               loss / M_LN2);
    return CLI_OK;
}

/* --data text:FILE or --prompt TEXT: the text into *buf (1 byte or more). */
static int text_input(const predict_opts *o, unsigned char **buf, size_t *len)
{
    if (o->input)
        return cli_usage_error("predict", "--input FILE (images) and a text (--data / --prompt) exclude each other");
    if (o->prompt && o->c.data)
        return cli_usage_error("predict", "give the text as --data text:FILE or as --prompt TEXT, not both");
    if (o->c.data && strncmp(o->c.data, "text:", 5) != 0)
        return cli_usage_error("predict", "--data takes text:FILE (a token model's text); images go with --input FILE");
    if (o->prompt) {
        *len = strlen(o->prompt);
        if (*len == 0)
            return cli_usage_error("predict", "--prompt is empty: nothing to predict");
        *buf = malloc(*len);
        if (!*buf)
            return cli_fail("predict: out of host memory");
        memcpy(*buf, o->prompt, *len);
        return CLI_OK;
    }
    return read_text(o->c.data + 5, buf, len);
}

int cmd_predict(int argc, char **argv)
{
    predict_opts o = {0};
    CLI_PARSE(&cli_spec_predict, argc, argv, &o);
    const char *model = o.c.model, *input = o.input;
    long limit = o.limit;
    int json = o.c.json;
    if (!model)
        return cli_usage_error("predict", "missing MODEL");
    unsigned char *text = NULL;
    size_t tlen = 0;
    if (o.c.data || o.prompt) {
        int trc = text_input(&o, &text, &tlen);
        if (trc != CLI_OK)
            return trc;
    } else if (!input)
        return cli_usage_error("predict", "missing --input FILE (images) or a text (--data text:FILE, --prompt TEXT)");
    int rc = CLI_OK;
    clg_ctx *ctx = NULL;
    clg_model *m = cli_model_open_pipe("predict", model, o.c.weights, o.c.devices, 0, &o.p, &ctx, &rc);
    if (!m) {
        free(text);
        return rc;
    }
    if (text) {
        rc = predict_text(m, ctx, text, tlen, &o);
        free(text);
        clg_model_destroy(m);
        clg_ctx_destroy(ctx);
        return rc;
    }
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
