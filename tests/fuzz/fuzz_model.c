/* Model-file parser and network build (shape inference, input lists,
 * layer settings) without a device. */
#include "fuzz_util.h"
#include "io/cfg.h"
#include "model/network.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    if (!text)
        return 0;
    clg_err err;
    clg_cfg *cfg = NULL;
    if (clg_cfg_parse(&err, text, "fuzz.cfg", &cfg) == CLG_OK)
        clg_cfg_free(cfg);
    clg_net *net = NULL;
    if (clg_net_build(&err, text, "fuzz.cfg", 0, &net) == CLG_OK)
        clg_net_free(net);
    /* the file path: NUL bytes must be refused, not truncate the text */
    const char *path = fuzz_file(data, size, ".cfg");
    if (path && clg_cfg_load(&err, path, &cfg) == CLG_OK) {
        if (memchr(data, 0, size))
            abort(); /* a NUL byte was accepted */
        clg_cfg_free(cfg);
    }
    free(text);
    return 0;
}
