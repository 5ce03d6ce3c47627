/* clgrad generate (issue 23): the decoder (src/model/decode.c) against the
 * network's full forward, position by position; clg_model_generate with
 * the key/value cache gives the same bytes as recomputing the window
 * (greedy and sampled, across the slides of a small context); a seed gives
 * the same bytes; bad input is refused. A small gpt-like model (2 pre-norm
 * blocks, width 32, 2 heads, context 32, tied head), randomly initialised
 * from a fresh seed. fp16 storage (generate --precision fp16): the decoder
 * against the fp32 forward, and the half key/value cache's operations
 * against a double reference over half-rounded keys and values. */
#include <math.h>
#include <string.h>

#include "model/decode.h"
#include "ops/attn_cache.h"
#include "testutil.h"
#include "train/session.h"

#define CTX 32
#define V 256

static char model_text[4096];

static const char *gpt_algo = "auto"; /* [attention] algo of gpt_text's model */

static const char *gpt_text(int classes)
{
    int n = snprintf(model_text, sizeof model_text,
                     "[net]\nchannels = 1\nheight = %d\nwidth = 1\ninput = tokens\nclasses = %d\nbatch = 2\n"
                     "[embedding]\nname = tok\nvocab = %d\ndim = 32\n"
                     "[posembed]\nname = pos\ncontext = %d\n",
                     CTX, classes, classes, CTX);
    const char *prev = "pos";
    char names[2][16];
    for (int b = 1; b <= 2; b++) {
        n += snprintf(model_text + n, sizeof model_text - (size_t)n,
                      "[layernorm]\nname = b%d_ln1\n[attention]\nname = b%d_attn\nalgo = %s\nheads = 2\n"
                      "[add]\nname = b%d_res1\ninput = %s, b%d_attn\n"
                      "[layernorm]\nname = b%d_ln2\n[dense]\nname = b%d_fc\nunits = 64\nactivation = gelu\n"
                      "[dense]\nname = b%d_proj\nunits = 32\n[add]\nname = b%d_res2\ninput = b%d_res1, b%d_proj\n",
                      b, b, gpt_algo, b, prev, b, b, b, b, b, b, b);
        snprintf(names[b - 1], sizeof names[0], "b%d_res2", b);
        prev = names[b - 1];
    }
    snprintf(model_text + n, sizeof model_text - (size_t)n,
             "[layernorm]\nname = ln_f\n[dense]\nname = head\nunits = %d\ntie = tok\nbias = 0\n[softmax]\n", classes);
    return model_text;
}

static clg_model *make(clg_ctx *c, const char *text, int batch, uint64_t seed)
{
    clg_model_params mp;
    clg_model_params_init(&mp);
    mp.batch = batch;
    mp.seed = seed;
    clg_model *m = NULL;
    ck_assert_msg(clg_model_create_string(c, text, "gen", &mp, &m) == CLG_OK, "%s", clg_last_error(c));
    return m;
}

/* The decoder's logits match the full forward of the same window at every
 * position: fed 5 at once, then one by one, then the whole window again.
 * half: the decoder in fp16 storage (weights, activations and key/value
 * cache in half) against the fp32 forward, within HALF_TOL. */
/* |err| / (1 + |ref|): half rounds each stored value by up to 2^-11 relative (4.9e-4); about ten
 * roundings lie between the embedding and the logits (measured: 6e-4 at random init) */
#define HALF_TOL 5e-3
static void decoder_check(const char *algo, int half)
{
    gpt_algo = algo;
    clg_ctx *c = tu_ctx(NULL);
    clg_rng r;
    tu_rng(&r, 1);
    clg_model *m = make(c, gpt_text(V), 1, tu_seed());
    clg_replica *rep = clg_session_rep(m);
    clg_device *dev = rep->dev;
    float ids[CTX], zeros[CTX] = {0};
    int iid[CTX];
    for (int i = 0; i < CTX; i++) {
        iid[i] = (int)(clg_rng_u32(&r) % V);
        ids[i] = (float)iid[i];
    }
    cl_mem x = tu_upload(dev, ids, CTX), y = tu_upload(dev, zeros, CTX); /* int32 zero labels */
    clg_replica_set_input(rep, x, 0);
    clg_replica_set_labels(rep, y, 0, 1.0f);
    ck_assert_msg(clg_replica_forward(rep, 1, 0) == CLG_OK, "%s", clg_last_error(c));
    int L = rep->layers[rep->loss_index].inputs[0];
    float *ref = malloc((size_t)CTX * V * sizeof(float));
    ck_assert_ptr_nonnull(ref);
    tu_poison(ref, (size_t)CTX * V);
    ck_assert_int_eq(clEnqueueReadBuffer(dev->queue, rep->act[L].mem, CL_TRUE, rep->act[L].off * sizeof(float),
                                         (size_t)CTX * V * sizeof(float), ref, 0, NULL, NULL),
                     CL_SUCCESS);
    clg_decoder *d = NULL;
    ck_assert_msg(clg_decoder_create(rep, half, &d) == CLG_OK, "%s", clg_last_error(c));
    const double tol = half ? HALF_TOL : 1e-4;
    ck_assert_int_eq(clg_decoder_context(d), CTX);
    ck_assert_int_eq(clg_decoder_vocab(d), V);
    /* 2 attention layers, keys and values of CTX positions of width 32, in half or float */
    ck_assert_uint_eq(clg_decoder_cache_bytes(d), 2u * 2u * CTX * 32u * (half ? 2u : 4u));
    float got[V];
    double worst = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int t = 4; t < CTX; t++) {
            if (pass == 1 && t != CTX - 1)
                continue;
            for (int v = 0; v < V; v++)
                got[v] = NAN;
            clg_status st = pass == 1  ? clg_decoder_step(d, iid, CTX, 0, got)
                            : t == 4 ? clg_decoder_step(d, iid, 5, 0, got)
                                     : clg_decoder_step(d, iid + t, 1, t, got);
            ck_assert_msg(st == CLG_OK, "%s", clg_last_error(c));
            for (int v = 0; v < V; v++) {
                double e = fabs((double)got[v] - ref[(size_t)t * V + v]);
                ck_assert_msg(e <= tol * (1 + fabs(ref[(size_t)t * V + v])),
                              "pass %d position %d class %d: decoder %g, forward %g", pass, t, v, got[v],
                              ref[(size_t)t * V + v]);
                worst = fmax(worst, e);
            }
        }
    /* a position that does not follow the cache is refused */
    ck_assert_int_eq(clg_decoder_step(d, iid, 1, 7, got), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(clg_decoder_step(d, iid, 2, CTX - 1, got), CLG_ERR_INVALID_ARG);
    printf("decoder (%s) vs forward (attention algo %s): max |err| %.3g\n", half ? "fp16" : "fp32", gpt_algo, worst);
    gpt_algo = "auto";
    clg_decoder_free(d);
    free(ref);
    clg_buf_release(dev, x);
    clg_buf_release(dev, y);
    clg_model_destroy(m);
    clg_ctx_destroy(c);
}

/* against both attention paths of the full forward */
START_TEST(decoder_matches_forward)
{
    decoder_check("fused", 0);
    decoder_check("gemm", 0);
    decoder_check("fused", 1);
}
END_TEST

static int gen(clg_model *m, const char *prompt, int tokens, double temp, int top_k, uint64_t seed, int no_cache,
               unsigned char *out, clg_generate_report *rep)
{
    clg_generate_params p;
    clg_generate_params_init(&p);
    p.prompt = prompt;
    p.tokens = tokens;
    p.temperature = temp;
    p.top_k = top_k;
    p.seed = seed;
    p.no_cache = no_cache;
    p.out = out;
    p.out_cap = (size_t)tokens;
    memset(out, 0, (size_t)tokens);
    return clg_model_generate(m, &p, rep);
}

/* Cache vs recomputing the window: greedy and sampled (with and without
 * top-k), 100 bytes across the slides of context 32, with and without a
 * prompt (one longer than the context); seeds reproduce. */
START_TEST(cache_equals_recompute)
{
    clg_ctx *c = tu_ctx(NULL);
    clg_model *m = make(c, gpt_text(V), 2, tu_seed());
    enum { N = 100 };
    static const char *prompts[] = {NULL, "The quick brown fox jumps over the lazy dog, twice: the quick brown fox."};
    const struct { double temp; int k; } modes[] = {{0.0, 0}, {1.0, 0}, {0.8, 10}};
    unsigned char a[N], b[N], e[N];
    for (int pi = 0; pi < 2; pi++)
        for (int mi = 0; mi < 3; mi++) {
            clg_generate_report ra, rb;
            uint64_t seed = tu_seed() + (uint64_t)mi;
            ck_assert_msg(gen(m, prompts[pi], N, modes[mi].temp, modes[mi].k, seed, 0, a, &ra) == CLG_OK, "%s",
                          clg_last_error(c));
            ck_assert_msg(gen(m, prompts[pi], N, modes[mi].temp, modes[mi].k, seed, 1, b, &rb) == CLG_OK, "%s",
                          clg_last_error(c));
            ck_assert_int_eq(ra.generated, N);
            ck_assert_int_eq(rb.generated, N);
            int first = -1;
            for (int i = 0; i < N && first < 0; i++)
                if (a[i] != b[i])
                    first = i;
            ck_assert_msg(first < 0, "prompt %d, temperature %g, top-k %d: cache and recompute differ from byte %d",
                          pi, modes[mi].temp, modes[mi].k, first);
            ck_assert_int_eq(rb.recomputes, N);
            ck_assert_msg(ra.recomputes >= 2 && ra.recomputes <= 1 + N / (CTX / 2) + 1, "cache: %d recomputes",
                          ra.recomputes);
            ck_assert_int_eq(ra.prompt_used, pi ? CTX - 1 : 0);
            ck_assert_msg(gen(m, prompts[pi], N, modes[mi].temp, modes[mi].k, seed, 0, e, &ra) == CLG_OK, "%s",
                          clg_last_error(c));
            ck_assert_msg(memcmp(a, e, N) == 0, "the same seed gave other bytes");
            if (modes[mi].temp > 0) { /* another seed: other bytes (100 draws of a near-uniform byte) */
                ck_assert_int_eq(gen(m, prompts[pi], N, modes[mi].temp, modes[mi].k, seed + 1000, 0, e, &ra), CLG_OK);
                ck_assert_msg(memcmp(a, e, N) != 0, "seeds %llu and +1000 gave the same bytes",
                              (unsigned long long)seed);
            }
        }
    /* top-k 1 at any temperature is greedy */
    for (int pi = 0; pi < 2; pi++) {
        clg_generate_report ra;
        ck_assert_int_eq(gen(m, prompts[pi], N, 0.0, 0, 5, 0, a, &ra), CLG_OK);
        ck_assert_int_eq(gen(m, prompts[pi], N, 1.5, 1, 6, 0, b, &ra), CLG_OK);
        ck_assert_msg(memcmp(a, b, N) == 0, "top-k 1 differs from greedy");
    }
    clg_model_destroy(m);
    clg_ctx_destroy(c);
}
END_TEST

static int stop_after(void *user, unsigned char byte)
{
    (void)byte;
    int *n = user;
    return ++*n >= 5;
}

START_TEST(refusals)
{
    clg_ctx *c = tu_ctx(NULL);
    clg_model *m = make(c, gpt_text(V), 2, 3);
    unsigned char out[8];
    clg_generate_report r;
    ck_assert_int_eq(gen(m, NULL, 0, 1.0, 0, 1, 0, out, &r), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(c), "tokens"));
    ck_assert_int_eq(gen(m, NULL, 4, -1.0, 0, 1, 0, out, &r), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(gen(m, NULL, 4, NAN, 0, 1, 0, out, &r), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(gen(m, NULL, 4, 1.0, 257, 1, 0, out, &r), CLG_ERR_INVALID_ARG);
    ck_assert_int_eq(clg_model_generate(m, NULL, &r), CLG_ERR_INVALID_ARG);
    clg_generate_params p;
    memset(&p, 0, sizeof p); /* not initialised: size 0 */
    ck_assert_int_eq(clg_model_generate(m, &p, &r), CLG_ERR_INVALID_ARG);
    clg_generate_params_init(&p);
    p.fp16 = 2;
    ck_assert_int_eq(clg_model_generate(m, &p, &r), CLG_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(clg_last_error(c), "fp16"));
    /* the callback stops it */
    int seen = 0;
    clg_generate_params_init(&p);
    p.tokens = 50;
    p.on_byte = stop_after;
    p.user = &seen;
    ck_assert_int_eq(clg_model_generate(m, &p, &r), CLG_OK);
    ck_assert_int_eq(r.generated, 5);
    ck_assert_int_eq(seen, 5);
    clg_model_destroy(m);
    /* not a token model */
    m = make(c, "[net]\nchannels = 1\nheight = 8\nwidth = 1\nclasses = 4\nbatch = 2\n[dense]\nunits = 4\n[softmax]\n",
             2, 1);
    ck_assert_int_eq(gen(m, NULL, 4, 1.0, 0, 1, 0, out, &r), CLG_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(clg_last_error(c), "not a token model"));
    clg_model_destroy(m);
    /* tokens, but 16 classes, not bytes */
    m = make(c, gpt_text(16), 2, 1);
    ck_assert_int_eq(gen(m, NULL, 4, 1.0, 0, 1, 0, out, &r), CLG_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(clg_last_error(c), "16 classes"));
    clg_model_destroy(m);
    /* attention that is not causal */
    const char *t = gpt_text(V), *h = strstr(t, "heads = 2\n");
    ck_assert_ptr_nonnull(h);
    char nc[sizeof model_text + 16];
    snprintf(nc, sizeof nc, "%.*scausal = 0\n%s", (int)(h - t), t, h); /* the first [attention] */
    m = make(c, nc, 2, 1);
    ck_assert_int_eq(gen(m, NULL, 4, 1.0, 0, 1, 0, out, &r), CLG_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(clg_last_error(c), "causal"));
    clg_model_destroy(m);
    /* a layer that mixes positions without a decode step */
    m = make(c,
             "[net]\nchannels = 1\nheight = 8\nwidth = 1\ninput = tokens\nclasses = 256\nbatch = 2\n"
             "[dense]\nunits = 256\n[softmax]\n",
             2, 1);
    ck_assert_int_eq(gen(m, NULL, 4, 1.0, 0, 1, 0, out, &r), CLG_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(clg_last_error(c), "position by position"));
    clg_model_destroy(m);
    clg_ctx_destroy(c);
}
END_TEST

/* ---- the half key/value cache (src/ops/attn_cache.c, cl/decode.cl) ---- */

/* x rounded to the nearest IEEE half (ties to even; no overflow for |x| < 65504). */
static double to_half(double x)
{
    if (x == 0.0)
        return x;
    int e;
    frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
    int q = e - 11 < -24 ? -24 : e - 11; /* the quantum's exponent: 11 significant bits, subnormals below 2^-14 */
    return ldexp(nearbyint(ldexp(x, -q)), q);
}

static double half_bits(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}

/* Appending N samples' keys and values chunk by chunk (5 positions, then 1
 * at a time, then 3) and attending from the new positions: the cache holds
 * exactly the half-rounded keys and values, and the output equals a double
 * reference over them (the queries and arithmetic stay fp32). */
START_TEST(half_cache_ops)
{
    enum { N = 2, H = 2, D = 16, C = H * D, TC = 12, LD = 3 * C };
    clg_ctx *c = tu_ctx(NULL);
    clg_device *dev = &c->devs[0];
    clg_rng r;
    tu_rng(&r, 7);
    float *x = malloc(sizeof(float) * N * TC * LD); /* q | k | v rows, as the layer's fused projection */
    ck_assert_ptr_nonnull(x);
    tu_fill(x, (size_t)N * TC * LD, -2, 2, &r);
    cl_mem kc = tu_upload(dev, NULL, N * TC * C / 2), vc = tu_upload(dev, NULL, N * TC * C / 2); /* halves */
    const int chunks[] = {5, 1, 1, 1, 1, 3};
    double worst = 0;
    for (int ci = 0, past = 0; ci < 6; past += chunks[ci++]) {
        int T = chunks[ci];
        float *xs = malloc(sizeof(float) * N * T * LD);
        ck_assert_ptr_nonnull(xs);
        for (int n = 0; n < N; n++) /* the chunk's rows of each sample: N samples of T new positions */
            memcpy(xs + (size_t)n * T * LD, x + ((size_t)n * TC + past) * LD, sizeof(float) * T * LD);
        cl_mem dx = tu_upload(dev, xs, (size_t)N * T * LD), o = tu_upload(dev, NULL, (size_t)N * T * C);
        clg_attn_desc a = {N, T, H, D, 1, 0.25f, 0, 0, 0, 0.0f, 0, 0, 0, 0};
        clg_attn_seq q = {dx, 0, LD}, k = {dx, C, LD}, v = {dx, 2 * C, LD}, skc = {kc, 0, C}, svc = {vc, 0, C};
        clg_attn_seq so = {o, 0, C};
        ck_assert_msg(clg_attn_cache_append_prec(dev, &a, 1, TC, past, &k, &v, &skc, &svc) == CLG_OK, "%s",
                      clg_last_error(c));
        ck_assert_msg(clg_attn_forward_cached_prec(dev, &a, 1, TC, past, &q, &skc, &svc, &so) == CLG_OK, "%s",
                      clg_last_error(c));
        float *got = malloc(sizeof(float) * N * T * C);
        double *ref = malloc(sizeof(double) * N * T * C);
        ck_assert(got && ref);
        tu_download(dev, o, got, (size_t)N * T * C);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < T; i++)
                for (int h = 0; h < H; h++) {
                    const float *qr = x + ((size_t)n * TC + past + i) * LD + h * D;
                    double s[TC], m = -INFINITY, l = 0;
                    for (int j = 0; j <= past + i; j++) {
                        const float *kr = x + ((size_t)n * TC + j) * LD + C + h * D;
                        s[j] = 0;
                        for (int d = 0; d < D; d++)
                            s[j] += (double)(qr[d] * 0.25f) * to_half(kr[d]);
                        m = fmax(m, s[j]);
                    }
                    for (int j = 0; j <= past + i; j++)
                        l += exp(s[j] - m);
                    for (int d = 0; d < D; d++) {
                        double acc = 0;
                        for (int j = 0; j <= past + i; j++)
                            acc += exp(s[j] - m) / l * to_half(x[((size_t)n * TC + j) * LD + 2 * C + h * D + d]);
                        ref[((size_t)n * T + i) * C + h * D + d] = acc;
                    }
                }
        worst = fmax(worst, tu_max_err(got, ref, (size_t)N * T * C, 1.0));
        clg_buf_release(dev, dx);
        clg_buf_release(dev, o);
        free(xs), free(got), free(ref);
    }
    ck_assert_msg(worst <= 1e-5, "cached attention over half keys and values: error %g", worst);
    uint16_t hk[N * TC * C], hv[N * TC * C];
    ck_assert_int_eq(clEnqueueReadBuffer(dev->queue, kc, CL_TRUE, 0, sizeof hk, hk, 0, NULL, NULL), CL_SUCCESS);
    ck_assert_int_eq(clEnqueueReadBuffer(dev->queue, vc, CL_TRUE, 0, sizeof hv, hv, 0, NULL, NULL), CL_SUCCESS);
    for (size_t i = 0; i < (size_t)N * TC * C; i++) { /* row n TC + j, column c */
        const float *row = x + i / C * LD + i % C;
        ck_assert_msg(half_bits(hk[i]) == to_half(row[C]) && half_bits(hv[i]) == to_half(row[2 * C]),
                      "cache element %zu: %g, %g; keys and values %g, %g", i, half_bits(hk[i]), half_bits(hv[i]),
                      (double)row[C], (double)row[2 * C]);
    }
    printf("half key/value cache: exact half rounding; cached attention error %.3g\n", worst);
    clg_buf_release(dev, kc);
    clg_buf_release(dev, vc);
    free(x);
    clg_ctx_destroy(c);
}
END_TEST

int main(void)
{
    /* two cases: CK_RUN_CASE=half-cache runs the kernel check alone (oclgrind-generate-half) */
    Suite *s = suite_create("generate");
    TCase *tc = tcase_create("generate"), *th = tcase_create("half-cache");
    tcase_set_timeout(tc, 120);
    tcase_set_timeout(th, 120);
    tcase_add_test(tc, decoder_matches_forward);
    tcase_add_test(tc, cache_equals_recompute);
    tcase_add_test(tc, refusals);
    tcase_add_test(th, half_cache_ops);
    suite_add_tcase(s, tc);
    suite_add_tcase(s, th);
    return tu_run(s);
}
