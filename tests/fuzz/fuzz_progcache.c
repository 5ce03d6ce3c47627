/* Program-cache entry reader: magic, format, key, length, CRC-32. */
#include "device/device.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const unsigned char *bin = NULL;
    size_t blen = 0;
    /* the key as stored (so the later checks are reached) and a fixed one */
    uint64_t key = 0;
    for (int i = 0; i < 8 && 16 + (size_t)i < size; i++)
        key |= (uint64_t)data[16 + i] << (8 * i);
    if (clg_prog_cache_entry_check(data, size, key, &bin, &blen) &&
        (bin < data || blen > size || bin + blen != data + size))
        abort();
    (void)clg_prog_cache_entry_check(data, size, 42, &bin, &blen);
    return 0;
}
