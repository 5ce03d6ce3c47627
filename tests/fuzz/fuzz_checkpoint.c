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
