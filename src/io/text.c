/* Text data for byte-level language models (`--data text:PATH`): any file,
 * read once into memory, bytes as token ids (vocabulary 256, no tokenizer).
 *
 *   file:  [ training head: len - len/10 bytes ][ held-out tail: len/10 bytes ]
 *
 * A sample is a window of T + 1 bytes (T: the model's context): the ids
 * window[0..T) as floats (exact) and the targets window[1..T] as int32, one
 * per position. Training windows start at random offsets within the head,
 * chosen from (seed, epoch, position in the epoch) alone, so a resumed run
 * sees the same windows without saving any state; an epoch is head / T
 * windows (about one pass over the head's bytes: head / (batch T) steps).
 * The tail gives (tail - 1) / T consecutive windows, in order, for the
 * validation loss and bits per byte. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/dataset_impl.h"

const char *clg_text_spec_path(const char *spec)
{
    return spec && strncmp(spec, "text:", 5) == 0 ? spec + 5 : NULL;
}

/* The held-out tail's length for a file of len bytes. */
static size_t tail_len(size_t len) { return len / CLG_TEXT_HELDOUT_DIV; }

clg_status clg_text_open(clg_err *err, const char *path, int context, clg_ds_split split, clg_dataset **out)
{
    *out = NULL;
    if (!path || !*path)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "text data: no file given (--data text:PATH)");
    if (context < 1 || context > CLG_TEXT_MAX_CONTEXT)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "text data '%s': context %d is outside 1..%d", path, context,
                           CLG_TEXT_MAX_CONTEXT);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "text data '%s' does not exist", path);
    if (S_ISDIR(sb.st_mode))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "text data '%s' is a directory; give a file (text:FILE)", path);
    if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > CLG_TEXT_MAX_BYTES)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                           "text data '%s' has %lld bytes; at most %llu (1 GiB) are read into memory",
                           path, (long long)sb.st_size, (unsigned long long)CLG_TEXT_MAX_BYTES);
    char *buf = NULL;
    size_t len = 0;
    CLG_TRY(clg_file_read(err, path, &buf, &len)); /* regular files only: FIFOs and devices are refused */
    uint64_t need = (uint64_t)CLG_TEXT_HELDOUT_DIV * ((uint64_t)context + 1);
    if (len == 0 || len < need) {
        free(buf);
        if (len == 0)
            return clg_err_set(err, CLG_ERR_FORMAT, "text data '%s' is empty", path);
        return clg_err_set(err, CLG_ERR_FORMAT,
                           "text data '%s' has %zu bytes: a context of %d needs windows of %d bytes in the training "
                           "head and in the held-out tail (the last 1/%d), so at least %llu bytes",
                           path, len, context, context + 1, CLG_TEXT_HELDOUT_DIV, (unsigned long long)need);
    }
    size_t tail = tail_len(len), head = len - tail;
    size_t part = split == CLG_SPLIT_TRAIN ? head : tail;
    size_t n = split == CLG_SPLIT_TRAIN ? head / (size_t)context : (tail - 1) / (size_t)context;
    if (n > INT32_MAX) {
        free(buf);
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "text data '%s': %zu windows of %d bytes are too many", path, n,
                           context);
    }
    clg_dataset *ds = calloc(1, sizeof *ds);
    uint8_t *bytes = malloc(part);
    if (!ds || !bytes) {
        free(ds);
        free(bytes);
        free(buf);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "text data '%s': out of memory for %zu bytes", path, part);
    }
    memcpy(bytes, buf + (split == CLG_SPLIT_TRAIN ? 0 : head), part);
    free(buf);
    ds->n = (int)n;
    ds->c = 1;
    ds->h = context;
    ds->w = 1;
    ds->nclasses = CLG_TEXT_VOCAB;
    ds->dtype = CLG_DS_U8;
    ds->text = bytes;
    ds->text_len = part;
    ds->text_random = split == CLG_SPLIT_TRAIN;
    ds->file_len = len;
    clg_ds_set_str(ds->name, sizeof ds->name, "text");
    clg_ds_set_str(ds->source, sizeof ds->source, path);
    *out = ds;
    return CLG_OK;
}

size_t clg_text_window(const clg_dataset *ds, uint64_t seed, uint64_t epoch, int64_t pos)
{
    size_t T = (size_t)ds->h;
    if (!ds->text_random)
        return (size_t)pos * T;
    uint64_t key[3] = {seed, epoch, (uint64_t)pos};
    uint64_t r = clg_hash64(key, sizeof key, 0x74657874u); /* "text" */
    /* FNV-1a's low bits depend only on the low bits of the key's bytes: mixed by murmur3's finalizer */
    r ^= r >> 33;
    r *= 0xff51afd7ed558ccdULL;
    r ^= r >> 33;
    r *= 0xc4ceb9fe1a85ec53ULL;
    r ^= r >> 33;
    return (size_t)(r % (uint64_t)(ds->text_len - T)); /* text_len >= T + 1: the window fits */
}

clg_status clg_text_fill(clg_err *err, const clg_dataset *ds, uint64_t seed, uint64_t epoch, int start, int count,
                         float *x, int32_t *labels)
{
    size_t T = (size_t)ds->h;
    for (int i = 0; i < count; i++) {
        int64_t pos = (int64_t)start + i;
        if (pos >= ds->n)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "text data '%s': window %lld of %d", ds->source,
                               (long long)pos, ds->n);
        size_t off = clg_text_window(ds, seed, epoch, pos);
        const uint8_t *w = ds->text + off;
        float *xs = x + (size_t)i * T;
        for (size_t t = 0; t < T; t++)
            xs[t] = (float)w[t];
        if (labels) {
            int32_t *ys = labels + (size_t)i * T;
            for (size_t t = 0; t < T; t++)
                ys[t] = w[t + 1];
        }
    }
    return CLG_OK;
}
