/* PGM images (P5 binary, P2 ASCII), plain or gzip-compressed, as predict
 * reads them. */
#include "fuzz_util.h"
#include "io/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size, ".pgm");
    if (!path)
        return 0;
    clg_err err;
    clg_dataset *ds = NULL;
    if (clg_dataset_load_image(&err, path, &ds) == CLG_OK) {
        if (ds->n < 1 || ds->c < 1 || ds->h < 1 || ds->w < 1)
            abort();
        clg_dataset_free(ds);
    }
    return 0;
}
