/* IDX images and labels, plain or gzip-compressed. */
#include "fuzz_util.h"
#include "io/dataset.h"

static void load(const char *path)
{
    clg_err err;
    clg_dataset *ds = NULL;
    if (clg_dataset_load_image(&err, path, &ds) == CLG_OK)
        clg_dataset_free(ds);
    /* the same bytes as images and as labels of a pair */
    ds = NULL;
    if (clg_dataset_load_idx(&err, path, path, &ds) == CLG_OK)
        clg_dataset_free(ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_with_file(data, size, ".idx", load); }
