/* classify: an application using only the public header <clgrad.h>.
 *
 * Builds a small classifier from model text, trains it for a few hundred
 * steps on a synthetic task (which quadrant of an 8x8 image is bright),
 * saves and reloads the weights, and reports held-out accuracy.
 *
 *   usage: classify [MODEL_FILE]      (default: the built-in model text)
 *   exit status 0 when the reloaded model classifies >= 90% correctly. */
#include <clgrad.h>
#include <stdio.h>
#include <stdlib.h>

static const char *model_text =
    "[net]\n"
    "channels = 1\nheight = 8\nwidth = 8\nclasses = 4\nbatch = 32\n"
    "optimizer = sgd\nlearning_rate = 0.1\nmomentum = 0.9\n"
    "[dense]\nname = hidden\nunits = 32\nactivation = relu\n"
    "[dense]\nname = logits\nunits = 4\n"
    "[softmax]\n";

static unsigned rng_state = 12345u;
static float frand(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / 16777216.0f;
}

/* class k: quadrant k bright on noise */
static void make_batch(float *x, int32_t *y, int n)
{
    for (int i = 0; i < n; i++) {
        int k = (int)(frand() * 4) & 3;
        y[i] = k;
        for (int p = 0; p < 64; p++) {
            int q = (p / 8 >= 4) * 2 + (p % 8 >= 4);
            x[i * 64 + p] = 0.3f * frand() + (q == k ? 0.6f : 0.0f);
        }
    }
}

static int fail(clg_ctx *ctx, const char *what)
{
    fprintf(stderr, "classify: %s: %s\n", what, clg_last_error(ctx));
    return 1;
}

int main(int argc, char **argv)
{
    clg_ctx_params cp;
    clg_ctx_params_init(&cp);
    clg_ctx *ctx = NULL;
    if (clg_ctx_create(&cp, &ctx) != CLG_OK)
        return fail(NULL, "no OpenCL device");

    clg_model_params mp;
    clg_model_params_init(&mp);
    clg_model *m = NULL;
    clg_status st = argc > 1 ? clg_model_create_file(ctx, argv[1], &mp, &m)
                             : clg_model_create_string(ctx, model_text, "classify", &mp, &m);
    if (st != CLG_OK)
        return fail(ctx, "model");
    static char table[4096];
    clg_model_summary(m, table, sizeof table);
    printf("%s", table);

    float x[32 * 64];
    int32_t y[32];
    clg_metrics mt = {0};
    for (int step = 0; step < 300; step++) {
        make_batch(x, y, 32);
        if (clg_model_train_step(m, x, y, 32) != CLG_OK)
            return fail(ctx, "train step");
        clg_model_metrics(m, &mt);
        if (step % 100 == 99)
            printf("step %lld: loss %.4f accuracy %.1f%%\n", (long long)mt.step, mt.loss, 100 * mt.accuracy);
    }
    const char *path = "classify-weights.safetensors";
    if (clg_model_save_weights(m, path) != CLG_OK)
        return fail(ctx, "save");
    clg_model_destroy(m);

    /* a fresh model with other random weights, then the saved ones */
    mp.seed = 99;
    if (clg_model_create_string(ctx, model_text, "classify", &mp, &m) != CLG_OK)
        return fail(ctx, "model");
    if (clg_model_load_weights(m, path) != CLG_OK)
        return fail(ctx, "load");
    remove(path);
    int n = 200, correct = 0;
    float *xs = malloc(sizeof(float) * 64 * n), *probs = malloc(sizeof(float) * 4 * n);
    int32_t *ys = malloc(sizeof(int32_t) * n);
    make_batch(xs, ys, n);
    if (clg_model_predict(m, xs, n, probs) != CLG_OK)
        return fail(ctx, "predict");
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int k = 1; k < 4; k++)
            if (probs[i * 4 + k] > probs[i * 4 + best])
                best = k;
        correct += best == ys[i];
    }
    printf("held-out accuracy after reload: %d/%d\n", correct, n);
    free(xs);
    free(probs);
    free(ys);
    clg_model_destroy(m);
    clg_ctx_destroy(ctx);
    return correct >= n * 9 / 10 ? 0 : 1;
}
