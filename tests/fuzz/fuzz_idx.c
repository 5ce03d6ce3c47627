/* IDX images and labels, plain or gzip-compressed. */
#include "fuzz_util.h"
#include "io/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size, ".idx");
    if (!path)
        return 0;
    clg_err err;
    clg_dataset *ds = NULL;
    if (clg_dataset_load_image(&err, path, &ds) == CLG_OK)
        clg_dataset_free(ds);
    /* the same bytes as images and as labels of a pair */
    ds = NULL;
    if (clg_dataset_load_idx(&err, path, path, &ds) == CLG_OK)
        clg_dataset_free(ds);
    return 0;
}
