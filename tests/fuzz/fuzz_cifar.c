/* CIFAR-10 binary batches (label byte + 3x32x32 pixels per record). */
#include "fuzz_util.h"
#include "io/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size, ".bin");
    if (!path)
        return 0;
    clg_err err;
    clg_dataset *ds = NULL;
    const char *paths[2] = {path, path};
    if (clg_dataset_load_cifar10(&err, paths, 1 + (int)(size & 1), &ds) == CLG_OK)
        clg_dataset_free(ds);
    return 0;
}
