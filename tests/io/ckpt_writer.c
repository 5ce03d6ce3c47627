/* Writes a random checkpoint (argv[1]) and, independently, a JSON manifest
 * (argv[2]) listing every tensor's dtype, shape and values and every
 * metadata entry, for tests/io/read_checkpoint.py to compare against its
 * own numpy reading of the checkpoint. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "testutil.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s OUT.safetensors MANIFEST.json\n", argv[0]);
        return 2;
    }
    clg_rng r;
    tu_rng(&r, 41);
    clg_err err = {0};
    clg_ckpt *ck = NULL;
    if (clg_ckpt_create(&err, &ck) != CLG_OK)
        return 1;
    clg_sbuf m = {0};
    clg_sbuf_printf(&m, "{\"tensors\": {");
    const char *names[] = {"conv1.weight", "conv1.bias", "bn.running_var", "opt.m.conv1.weight", "step_count",
                           "labels", "half", "scalar", "empty"};
    const clg_ckpt_dtype dts[] = {CLG_CKPT_F32, CLG_CKPT_F32, CLG_CKPT_F32, CLG_CKPT_F32, CLG_CKPT_I64,
                                  CLG_CKPT_I32, CLG_CKPT_F16, CLG_CKPT_F32, CLG_CKPT_U8};
    for (size_t i = 0; i < CLG_ARRAY_LEN(names); i++) {
        int ndim = strcmp(names[i], "scalar") == 0 ? 0 : 1 + (int)(clg_rng_u32(&r) % 4);
        int64_t shape[8];
        for (int d = 0; d < ndim; d++)
            shape[d] = 1 + clg_rng_u32(&r) % 5;
        if (strcmp(names[i], "empty") == 0)
            shape[0] = 0;
        void *p = NULL;
        if (clg_ckpt_add(&err, ck, names[i], dts[i], ndim, shape, NULL, &p) != CLG_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        const clg_ckpt_tensor *t = &ck->t[ck->nt - 1];
        clg_sbuf_printf(&m, "%s\n  ", i ? "," : "");
        clg_sbuf_json_str(&m, names[i]);
        clg_sbuf_printf(&m, ": {\"dtype\": \"%s\", \"shape\": [", clg_ckpt_dtype_name(dts[i]));
        for (int d = 0; d < ndim; d++)
            clg_sbuf_printf(&m, "%s%" PRId64, d ? ", " : "", shape[d]);
        clg_sbuf_printf(&m, "], \"values\": [");
        for (size_t k = 0; k < t->numel; k++) {
            const char *sep = k ? ", " : "";
            switch (dts[i]) {
            case CLG_CKPT_F32: {
                float v = clg_rng_normal(&r) * 0.1f;
                ((float *)p)[k] = v;
                clg_sbuf_printf(&m, "%s%.9g", sep, (double)v);
                break;
            }
            case CLG_CKPT_F16: { /* manifest holds the raw bits */
                uint16_t v = (uint16_t)(clg_rng_u32(&r) & 0x7bff);
                ((uint16_t *)p)[k] = v;
                clg_sbuf_printf(&m, "%s%u", sep, v);
                break;
            }
            case CLG_CKPT_I32: {
                int32_t v = (int32_t)clg_rng_u32(&r);
                ((int32_t *)p)[k] = v;
                clg_sbuf_printf(&m, "%s%" PRId32, sep, v);
                break;
            }
            case CLG_CKPT_I64: {
                int64_t v = (int64_t)(((uint64_t)clg_rng_u32(&r) << 32) | clg_rng_u32(&r));
                ((int64_t *)p)[k] = v;
                clg_sbuf_printf(&m, "%s%" PRId64, sep, v);
                break;
            }
            case CLG_CKPT_U8: {
                uint8_t v = (uint8_t)clg_rng_u32(&r);
                ((uint8_t *)p)[k] = v;
                clg_sbuf_printf(&m, "%s%u", sep, v);
                break;
            }
            }
        }
        clg_sbuf_printf(&m, "]}");
    }
    clg_rng saved = r;
    if (clg_ckpt_set_meta(&err, ck, CLG_CKPT_KEY_MODEL, "[net]\nwidth = 28 # \"q\" caf\xc3\xa9\n\n[dense]\nunits=10\n") ||
        clg_ckpt_set_meta_i64(&err, ck, CLG_CKPT_KEY_STEP, clg_rng_u32(&r)) ||
        clg_ckpt_set_meta_i64(&err, ck, CLG_CKPT_KEY_EPOCH, clg_rng_u32(&r) % 10) ||
        clg_ckpt_set_rng(&err, ck, CLG_CKPT_KEY_RNG, &saved) ||
        clg_ckpt_set_meta(&err, ck, CLG_CKPT_KEY_OPTIMIZER, "sgd") ||
        clg_ckpt_set_meta_f64(&err, ck, "optimizer.lr", clg_rng_uniform(&r) * 0.1)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (clg_ckpt_save(&err, ck, argv[1]) != CLG_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    /* metadata as saved, crc32 entries included */
    clg_sbuf_printf(&m, "},\n\"metadata\": {");
    for (int i = 0; i < ck->nmeta; i++) {
        clg_sbuf_printf(&m, "%s\n  ", i ? "," : "");
        clg_sbuf_json_str(&m, ck->meta[i].key);
        clg_sbuf_printf(&m, ": ");
        clg_sbuf_json_str(&m, ck->meta[i].value);
    }
    clg_sbuf_printf(&m, "}}\n");
    FILE *f = fopen(argv[2], "w");
    if (!f || m.oom || fwrite(m.data, 1, m.len, f) != m.len || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 1;
    }
    clg_sbuf_free(&m);
    clg_ckpt_free(ck);
    return 0;
}
