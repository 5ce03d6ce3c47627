/* Tuning database (JSON per device and driver). */
#include "fuzz_util.h"
#include "ops/tune.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    if (!text)
        return 0;
    clg_err err;
    clg_tune_dev d = {0};
    if (clg_tune_parse(&err, text, "fuzz device", "fuzz driver", &d) == CLG_OK) {
        /* what parsed formats and parses back */
        clg_sbuf b = {0};
        clg_tune_format(&d, "fuzz device", "fuzz driver", &b);
        clg_tune_dev d2 = {0};
        if (!b.oom && clg_tune_parse(&err, b.data, "fuzz device", "fuzz driver", &d2) != CLG_OK)
            abort();
        clg_tune_dev_clear(&d2);
        clg_sbuf_free(&b);
    }
    clg_tune_dev_clear(&d);
    free(text);
    return 0;
}
