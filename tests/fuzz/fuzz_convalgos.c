/* Conv-algorithm cache file (one entry per line, device hash per entry). */
#include "fuzz_util.h"
#include "ops/conv_impl.h"

static void put(void *user, uint64_t devhash, const char *key, const clg_conv_algo_rec *r)
{
    (void)devhash;
    if (!key[0] || r->algo == CLG_CONV_AUTO || !(r->ms >= 0) || (r->conf != 0 && r->conf != 1) || r->tries < 0)
        abort();
    ++*(int *)user;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    if (!text)
        return 0;
    int n = 0;
    if (clg_conv_algos_parse(text, 0x0123456789abcdefull, put, &n) != n)
        abort();
    free(text);
    return 0;
}
