/* Model files: clgrad text or ONNX, told apart by content (see onnx.h). */
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx.h"

int clg_onnx_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p >= end)
            return 0;
        uint8_t b = *(*p)++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return 1;
        }
    }
    return 0;
}

int clg_onnx_sniff(const void *data, size_t len)
{
    const uint8_t *p = data, *end = p + len;
    int graph = 0;
    if (!data || len < 2)
        return 0;
    while (p < end) {
        uint64_t key = 0, v = 0;
        if (!clg_onnx_varint(&p, end, &key))
            return 0;
        unsigned wt = (unsigned)(key & 7);
        uint64_t num = key >> 3;
        /* ModelProto: 1 ir_version, 5 model_version (varints); 2-4, 6 strings,
         * 7 graph, 8 opset_import, 14 metadata_props, 20 training_info, 25 functions */
        int is_varint = num == 1 || num == 5;
        int is_len = (num >= 2 && num <= 4) || (num >= 6 && num <= 8) || num == 14 || num == 20 || num == 25;
        if (is_varint && wt == 0) {
            if (!clg_onnx_varint(&p, end, &v))
                return 0;
        } else if (is_len && wt == 2) {
            if (!clg_onnx_varint(&p, end, &v) || v > (uint64_t)(end - p))
                return 0;
            p += v;
            graph |= num == 7;
        } else {
            return 0;
        }
    }
    return graph;
}

static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

clg_status clg_model_file_read(clg_err *err, const char *path, char **text, clg_ckpt **weights)
{
    *text = NULL;
    *weights = NULL;
    char *buf = NULL;
    size_t len = 0;
    CLG_TRY(clg_file_read(err, path, &buf, &len));
    clg_status st = CLG_OK;
    if (clg_onnx_sniff(buf, len) || ends_with(path, ".onnx")) {
        st = clg_onnx_import(err, buf, len, path, text, weights);
        free(buf);
        return st;
    }
    st = clg_text_check_nul(err, path, buf, len); /* NUL bytes refused with file:offset */
    if (st != CLG_OK) {
        free(buf);
        return st;
    }
    *text = buf;
    return CLG_OK;
}
