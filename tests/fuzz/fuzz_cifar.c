/* CIFAR-10 binary batches (label byte + 3x32x32 pixels per record), one
 * file or the same file twice. */
#include "fuzz_util.h"
#include "io/dataset.h"

static int g_twice;

static void load(const char *path)
{
    clg_err err;
    clg_dataset *ds = NULL;
    const char *paths[2] = {path, path};
    if (clg_dataset_load_cifar10(&err, paths, 1 + g_twice, &ds) == CLG_OK)
        clg_dataset_free(ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g_twice = (int)(size & 1);
    return fuzz_with_file(data, size, ".bin", load);
}
