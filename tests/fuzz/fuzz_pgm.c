/* PGM images (P5 binary, P2 ASCII), plain or gzip-compressed, as predict
 * reads them. */
#include "fuzz_util.h"
#include "io/dataset.h"

static void load(const char *path)
{
    clg_err err;
    clg_dataset *ds = NULL;
    if (clg_dataset_load_image(&err, path, &ds) != CLG_OK)
        return;
    if (ds->n < 1 || ds->c < 1 || ds->h < 1 || ds->w < 1)
        abort(); /* an image without pixels was accepted */
    clg_dataset_free(ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_with_file(data, size, ".pgm", load); }
