/* clg_model_generate: autoregressive byte sampling through the decoder of
 * src/model/decode.h (include/clgrad.h describes the window and sampling). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/decode.h"
#include "train/session.h"

#define GEN_VOCAB 256
#define GEN_RNG_STREAM 0x67656e65726174ULL /* "generat" */

static void generate_defaults(clg_generate_params *p)
{
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    p->tokens = 256;
    p->temperature = 1.0;
    p->seed = 1;
}

void clg_generate_params_init_size(clg_generate_params *p, size_t size)
{
    clg_generate_params d;
    generate_defaults(&d);
    clg_sized_init(p, size, &d, sizeof d);
}

/* Larger logit first, then the lower byte: a strict order, so top-k and
 * greedy choices do not depend on the sort. */
static int before(const float *l, int i, int j) { return l[i] > l[j] || (l[i] == l[j] && i < j); }

/* The next byte from logits (V floats, all finite). */
static int sample(const float *logits, int V, double temperature, int top_k, clg_rng *rng)
{
    int order[GEN_VOCAB];
    for (int i = 0; i < V; i++) { /* insertion sort: V is 256, once per byte */
        int j = i;
        for (; j > 0 && before(logits, i, order[j - 1]); j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    if (temperature <= 0.0)
        return order[0];
    int k = top_k > 0 && top_k < V ? top_k : V;
    double w[GEN_VOCAB], sum = 0.0, top = logits[order[0]];
    for (int i = 0; i < k; i++) {
        w[i] = exp(((double)logits[order[i]] - top) / temperature);
        sum += w[i];
    }
    /* a 53-bit uniform in [0, 1) from two PCG32 outputs */
    uint64_t hi = clg_rng_u32(rng) >> 5, lo = clg_rng_u32(rng) >> 6;
    double u = ((double)hi * 67108864.0 + (double)lo) / 9007199254740992.0;
    double target = u * sum, acc = 0.0;
    for (int i = 0; i < k; i++) {
        acc += w[i];
        if (target < acc)
            return order[i];
    }
    return order[k - 1];
}

static clg_status check_params(clg_err *err, const clg_generate_params *p)
{
    if (p->tokens < 1)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "generate: tokens = %d: generate at least 1 byte", p->tokens);
    if (!isfinite(p->temperature) || p->temperature < 0.0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "generate: temperature %g: must be finite and >= 0 (0: greedy)",
                           p->temperature);
    if (p->fp16 != 0 && p->fp16 != 1)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "generate: fp16 = %d: 0 (fp32) or 1 (fp16 storage)", p->fp16);
    if (p->top_k < 0 || p->top_k > GEN_VOCAB)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "generate: top_k = %d outside [0, %d] (0: all)", p->top_k,
                           GEN_VOCAB);
    return CLG_OK;
}

typedef struct {
    clg_decoder *dec;
    int ctx;            /* context */
    unsigned char *hist; /* the window's bytes, at most ctx */
    int len;            /* bytes in the window */
    int fed;            /* window bytes in the decoder's cache (0: recompute) */
    float logits[GEN_VOCAB];
} gen_state;

/* Logits after the window's last byte: one new position with the cache,
 * else the whole window. */
static clg_status gen_logits(clg_err *err, gen_state *g, int no_cache, int *recomputes)
{
    int *ids = malloc((size_t)g->len * sizeof *ids);
    if (!ids)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of host memory");
    for (int i = 0; i < g->len; i++)
        ids[i] = g->hist[i];
    int from = no_cache ? 0 : g->fed;
    if (from == 0)
        (*recomputes)++;
    clg_status st = clg_decoder_step(g->dec, ids + from, g->len - from, from, g->logits);
    free(ids);
    if (st == CLG_OK)
        g->fed = g->len;
    return st;
}

static clg_status gen_run(clg_model *m, gen_state *g, const clg_generate_params *p, clg_generate_report *r)
{
    clg_err *err = &m->ctx->err;
    clg_rng rng;
    clg_rng_seed(&rng, p->seed, GEN_RNG_STREAM);
    size_t plen = p->prompt ? (p->prompt_len ? p->prompt_len : strlen(p->prompt)) : 0;
    if (plen == 0) {
        g->hist[0] = '\n';
        g->len = 1;
    } else {
        size_t keep = plen < (size_t)g->ctx - 1 ? plen : (size_t)g->ctx - 1;
        if (keep == 0) /* context 1 */
            keep = 1;
        memcpy(g->hist, p->prompt + plen - keep, keep);
        g->len = (int)keep;
        r->prompt_used = (int)keep;
    }
    double t0 = clg_now_sec();
    for (int k = 0; k < p->tokens; k++) {
        CLG_TRY(gen_logits(err, g, p->no_cache, &r->recomputes));
        for (int i = 0; i < GEN_VOCAB; i++)
            if (!isfinite(g->logits[i]))
                return clg_err_set(err, CLG_ERR_FORMAT,
                                   "generate: the model's output for byte %d is not finite (logit of %d is %g)", k, i,
                                   (double)g->logits[i]);
        int b = sample(g->logits, GEN_VOCAB, p->temperature, p->top_k, &rng);
        if (p->out && (size_t)k < p->out_cap)
            p->out[k] = (unsigned char)b;
        r->generated = k + 1;
        if (p->on_byte && p->on_byte(p->user, (unsigned char)b))
            break;
        if (g->len == g->ctx) { /* slide: keep the last ctx / 2 bytes and recompute them */
            int keep = g->ctx / 2 > 0 ? g->ctx / 2 : 1;
            memmove(g->hist, g->hist + g->len - (keep - 1), (size_t)(keep - 1));
            g->len = keep - 1;
            g->fed = 0;
        }
        g->hist[g->len++] = (unsigned char)b;
    }
    r->seconds = clg_now_sec() - t0;
    return CLG_OK;
}

static clg_status model_generate(clg_model *m, const clg_generate_params *p, clg_generate_report *r)
{
    clg_err *err = &m->ctx->err;
    clg_generate_params def;
    generate_defaults(&def);
    if (!p)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "generate: params are required (clg_generate_params_init)");
    CLG_TRY(clg_sized_read(err, "clg_generate_params", &def, sizeof def, p));
    CLG_TRY(check_params(err, &def));
    gen_state g;
    memset(&g, 0, sizeof g);
    CLG_TRY(clg_decoder_create(clg_session_rep(m), def.fp16, &g.dec));
    clg_status st = CLG_OK;
    g.ctx = clg_decoder_context(g.dec);
    r->cache_bytes = clg_decoder_cache_bytes(g.dec);
    if (clg_decoder_vocab(g.dec) != GEN_VOCAB)
        st = clg_err_set(err, CLG_ERR_UNSUPPORTED,
                         "generate: the model predicts %d classes per position, not the %d byte values",
                         clg_decoder_vocab(g.dec), GEN_VOCAB);
    if (st == CLG_OK && !(g.hist = malloc((size_t)g.ctx)))
        st = clg_err_set(err, CLG_ERR_HOST_OOM, "out of host memory");
    if (st == CLG_OK)
        st = gen_run(m, &g, &def, r);
    free(g.hist);
    clg_decoder_free(g.dec);
    return st;
}

clg_status clg_model_generate_size(clg_model *m, const clg_generate_params *p, clg_generate_report *out, size_t size)
{
    if (!m)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "generate: model is required");
    clg_generate_report r;
    memset(&r, 0, sizeof r);
    clg_status st = model_generate(m, p, &r);
    if (out)
        clg_sized_write(out, size, &r, sizeof r);
    return st;
}
