/* ONNX loader: wire-format walk (depth / message caps), protobuf-c decoding,
 * graph mapping, and the network built from the imported text. An import
 * that succeeds must give a text that builds and a weight for every
 * parameter with its exact shape (else abort: an importer bug). */
#include "fuzz_util.h"
#include "model/network.h"
#include "onnx/onnx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    clg_err err;
    char *text = NULL;
    clg_ckpt *w = NULL;
    (void)clg_onnx_sniff(data, size);
    if (clg_onnx_import(&err, data, size, "fuzz.onnx", &text, &w) == CLG_OK) {
        clg_net *net = NULL;
        if (clg_net_build(&err, text, "fuzz.onnx", 2, &net) == CLG_OK) {
            int params = 0;
            for (int i = 0; i < net->nlayers; i++)
                for (int p = 0; p < net->proto[i].nparams; p++) {
                    const clg_param *pr = &net->proto[i].params[p];
                    char name[160];
                    snprintf(name, sizeof name, "%s.%s", net->proto[i].name, pr->name);
                    float *buf = malloc(pr->numel * sizeof(float) + 1);
                    if (!buf)
                        continue;
                    if (clg_ckpt_get_f32(&err, w, name, pr->ndim, pr->shape, pr->numel, buf) != CLG_OK)
                        abort(); /* the imported weights do not fit the imported network */
                    free(buf);
                    params++;
                }
            if (params != w->nt)
                abort(); /* a weight no layer uses */
            clg_net_free(net);
        }
        free(text);
        clg_ckpt_free(w);
    }
    /* the file path: detection by content, any name */
    const char *path = fuzz_file(data, size, ".bin");
    if (path && clg_model_file_read(&err, path, &text, &w) == CLG_OK) {
        free(text);
        clg_ckpt_free(w);
    }
    return 0;
}
