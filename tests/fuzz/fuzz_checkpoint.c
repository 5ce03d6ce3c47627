/* Checkpoint loader: header, metadata, tensors, CRCs, and the range-checked
 * getters a resuming session calls. */
#include <float.h>

#include "fuzz_util.h"
#include "io/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    clg_err err;
    clg_ckpt *ck = NULL;
    if (clg_ckpt_parse(&err, data, size, "fuzz.safetensors", &ck) != CLG_OK)
        return 0;
    int64_t v;
    double d;
    clg_rng r;
    (void)clg_ckpt_get_meta_i64_range(&err, ck, CLG_CKPT_KEY_STEP, 0, INT64_MAX, &v);
    (void)clg_ckpt_get_meta_i64_range(&err, ck, CLG_CKPT_KEY_EPOCH, 0, INT32_MAX, &v);
    (void)clg_ckpt_get_meta_f64_range(&err, ck, "norm.std.0", DBL_MIN, 1e30, &d);
    (void)clg_ckpt_get_rng(&err, ck, CLG_CKPT_KEY_RNG, &r);
    /* the training-state keys a resume reads (issue 26 item 8), with its ranges: a value is returned
     * only within its range */
    static const struct { const char *key; int64_t lo, hi; } ints[] = {
        {"norm.channels", 0, 4096},   {"batch_in_epoch", 0, INT32_MAX}, {"seed", 0, INT64_MAX},
        {"total_steps", 0, INT64_MAX / 2}, {"batch", 1, 1 << 20},        {"fp16.good_steps", 0, INT64_MAX},
        {"fp16.skipped", 0, INT64_MAX}, {"devices.count", 1, 64},         {"ranks", 1, 1 << 20},
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (clg_ckpt_get_meta_i64_range(&err, ck, ints[i].key, ints[i].lo, ints[i].hi, &v) == CLG_OK &&
            (v < ints[i].lo || v > ints[i].hi))
            abort();
    static const struct { const char *key; double lo, hi; } reals[] = {
        {"optimizer.lr", 0, 1e6}, {"fp16.loss_scale", 1, 16777216.0}, {"norm.mean.0", -1e5, 1e5},
    };
    for (size_t i = 0; i < sizeof reals / sizeof *reals; i++)
        if (clg_ckpt_get_meta_f64_range(&err, ck, reals[i].key, reals[i].lo, reals[i].hi, &d) == CLG_OK &&
            !(d >= reals[i].lo && d <= reals[i].hi))
            abort();
    for (int i = 0; i < ck->nt; i++) {
        const clg_ckpt_tensor *t = clg_ckpt_find(ck, ck->t[i].name);
        if (t != &ck->t[i])
            abort(); /* names are unique and found */
        if (t->dtype == CLG_CKPT_F32 && t->numel < (1u << 20)) {
            float *dst = malloc(t->nbytes + 4);
            (void)clg_ckpt_get_f32(&err, ck, t->name, 0, NULL, t->numel, dst);
            free(dst);
        }
    }
    /* what loaded serializes and loads again to the same tensors */
    void *buf = NULL;
    size_t len = 0;
    if (clg_ckpt_serialize(&err, ck, &buf, &len) == CLG_OK) {
        clg_ckpt *again = NULL;
        if (clg_ckpt_parse(&err, buf, len, "again", &again) != CLG_OK || again->nt != ck->nt)
            abort();
        clg_ckpt_free(again);
        free(buf);
    }
    clg_ckpt_free(ck);
    return 0;
}
