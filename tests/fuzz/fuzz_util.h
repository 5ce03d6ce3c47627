/* Shared by the libFuzzer targets: inputs that the library reads from a
 * path go through one private temporary file per process. */
#ifndef CLG_FUZZ_UTIL_H
#define CLG_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes data to this process's temporary file (suffix picks the name's
 * ending, e.g. ".gz"); returns its path, or NULL. */
static inline const char *fuzz_file(const uint8_t *data, size_t size, const char *suffix)
{
    static char path[256];
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/clgrad-fuzz-%ld%s", dir, (long)getpid(), suffix);
    FILE *f = fopen(path, "wb");
    if (!f)
        return NULL;
    int ok = fwrite(data, 1, size, f) == size;
    ok = fclose(f) == 0 && ok;
    return ok ? path : NULL;
}

/* Runs use(path) on the input written to the temporary file. */
static inline int fuzz_with_file(const uint8_t *data, size_t size, const char *suffix, void (*use)(const char *path))
{
    const char *path = fuzz_file(data, size, suffix);
    if (path)
        use(path);
    return 0;
}

/* NUL-terminated copy of the input (text parsers); caller frees. */
static inline char *fuzz_text(const uint8_t *data, size_t size)
{
    char *t = malloc(size + 1);
    if (t) {
        memcpy(t, data, size);
        t[size] = 0;
    }
    return t;
}

#endif
