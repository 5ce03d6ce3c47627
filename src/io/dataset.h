/* Datasets in host memory: IDX (MNIST / Fashion-MNIST, plain or .gz),
 * CIFAR-10 binary batches, single images (IDX or PGM) for prediction;
 * seeded shuffling, per-channel normalization and batch filling.
 *
 * Images are N x C x H x W (NCHW), stored as uint8 (raw pixels, scaled by
 * 1/255 when read) or float (used as is). Labels are int32 in
 * [0, nclasses), or -1 when the dataset has no labels (prediction input).
 * No OpenCL here: the trainer uploads what clg_dataset_fill_batch writes. */
#ifndef CLG_IO_DATASET_H
#define CLG_IO_DATASET_H

#include "core/core.h"

#define CLG_DS_MAX_CHANNELS 16

typedef enum clg_ds_dtype {
    CLG_DS_U8 = 0,  /* pixels in u8; value = pixel / 255 */
    CLG_DS_F32 = 1, /* pixels in f32; value = pixel */
} clg_ds_dtype;

typedef enum clg_ds_split {
    CLG_SPLIT_TRAIN = 0,
    CLG_SPLIT_TEST = 1,
} clg_ds_split;

typedef struct clg_dataset {
    int n, c, h, w;       /* images and their shape */
    int nclasses;         /* 10 for MNIST-like and CIFAR-10; 0 when unlabeled */
    clg_ds_dtype dtype;
    uint8_t *u8;          /* n*c*h*w pixels when dtype == CLG_DS_U8 (else NULL) */
    float *f32;           /* n*c*h*w values when dtype == CLG_DS_F32 (else NULL) */
    int32_t *labels;      /* n labels (-1 = unlabeled) */
    char name[64];        /* "fashion-mnist", "mnist", "cifar10", "idx", "pgm", "text" */
    char source[512];     /* the file or directory it came from, for messages */
    /* text data (io/text.c; u8 and labels NULL): c = 1, h = T (context), w = 1; a sample is T ids and the T
     * next bytes as its labels (clg_dataset_labels_per_sample = T) */
    uint8_t *text;        /* this split's bytes: the training head or the held-out tail */
    size_t text_len;
    int text_random;      /* windows at seeded random offsets (training) or consecutive (held-out) */
    size_t file_len;      /* the whole file's bytes, for messages */
} clg_dataset;

/* Per-channel normalization: x' = (x - mean[c]) / std[c], where x is the
 * pixel value after the dtype's scaling (u8: pixel / 255). */
typedef struct clg_ds_norm {
    int c;
    float mean[CLG_DS_MAX_CHANNELS];
    float std[CLG_DS_MAX_CHANNELS];
} clg_ds_norm;

/* ---- creation / loading ---- */

/* Empty dataset with zeroed pixels and labels (= 0), for tests and
 * programs that build data in memory. */
CLG_INTERNAL clg_status clg_dataset_create(clg_err *err, int n, int c, int h, int w, int nclasses,
                                           clg_ds_dtype dtype, clg_dataset **out);
/* NULL is a no-op. */
CLG_INTERNAL void clg_dataset_free(clg_dataset *ds);

/* spec is one of:
 *   "fashion-mnist" / "mnist": looked up in $CLGRAD_DATA_DIR/<name>/, then
 *       $CLGRAD_DATA_DIR itself, then /usr/share/datasets/<name>/ (Debian's
 *       dataset-fashion-mnist);
 *   "cifar10" / "cifar-10": $CLGRAD_DATA_DIR/cifar-10-batches-bin/ etc.;
 *   a directory holding {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
 *       (IDX) or data_batch_{1..5}.bin + test_batch.bin (CIFAR-10);
 *   an IDX images file (its labels file is derived by replacing
 *       "images-idx3" by "labels-idx1" in the name when that exists).
 * split picks the train or test files. Errors name the missing files. */
CLG_INTERNAL clg_status clg_dataset_open(clg_err *err, const char *spec, clg_ds_split split, clg_dataset **out);
/* The same with the named datasets searched first in data_dir (a context's
 * option data_dir; NULL or empty: not); clg_dataset_open takes it from
 * CLGRAD_DATA_DIR. */
CLG_INTERNAL clg_status clg_dataset_open_in(clg_err *err, const char *data_dir, const char *spec, clg_ds_split split,
                                            clg_dataset **out);

/* IDX pair (either file may end in .gz; zlib reads both kinds). images: u8
 * (type 0x08, value = pixel / 255) or float32 (0x0D, big-endian, taken as
 * they are, finite), 3 dims (N,H,W -> C=1) or 4 dims (N,C,H,W); labels: u8, 1 dim, same N.
 * labels_path may be NULL (labels = -1, nclasses = 0). nclasses is
 * max label + 1, at least 10 when labels are present. Checks the magic,
 * dtype, dims, sizes and truncation. */
CLG_INTERNAL clg_status clg_dataset_load_idx(clg_err *err, const char *images_path, const char *labels_path,
                                             clg_dataset **out);
/* CIFAR-10 binary batches (records of 1 label byte + 3x32x32 pixels,
 * 3073 bytes), concatenated in the order given. */
CLG_INTERNAL clg_status clg_dataset_load_cifar10(clg_err *err, const char *const *paths, int npaths,
                                                 clg_dataset **out);
/* One or more images for `predict`: an IDX images file (u8 or f32) or a PGM
 * (P5 binary or P2 ASCII, maxval <= 255; a PGM gives n = 1, c = 1). */
CLG_INTERNAL clg_status clg_dataset_load_image(clg_err *err, const char *path, clg_dataset **out);

/* ---- writers (tests, tools) ---- */

/* Writes an IDX u8 file: dims[0..ndim) big-endian after the magic
 * 0x00 0x00 0x08 ndim. gz != 0 writes gzip (zlib). */
CLG_INTERNAL clg_status clg_idx_write_u8(clg_err *err, const char *path, int gz, const int *dims, int ndim,
                                         const uint8_t *data);

/* ---- shuffling ----
 * The permutation depends only on (n, rng state): saving the rng state in
 * a checkpoint before shuffling restores the same order on resume. */

/* perm[i] = i. */
CLG_INTERNAL void clg_dataset_perm_identity(int32_t *perm, int n);
/* Fisher-Yates shuffle of perm[0..n) driven by rng (advances rng). */
CLG_INTERNAL void clg_dataset_shuffle(int32_t *perm, int n, clg_rng *rng);
/* Identity then shuffled with an rng derived only from (seed, epoch):
 * epoch e's order is reproducible without any saved state. */
CLG_INTERNAL void clg_dataset_epoch_perm(int32_t *perm, int n, uint64_t seed, uint64_t epoch);
/* A validation split held out of ds: round(n * fraction) samples picked by a
 * permutation seeded with seed (the same for every run with that seed and
 * data) go to *val, the rest to *train, each in ds's order. fraction in
 * (0, 1); both parts must be non-empty. ds is unchanged. */
CLG_INTERNAL clg_status clg_dataset_holdout(clg_err *err, const clg_dataset *ds, double fraction, uint64_t seed,
                                            clg_dataset **train, clg_dataset **val);

/* ---- normalization ---- */

/* Mean and (population) standard deviation per channel over the whole
 * dataset, computed in double. A channel with std < 1e-6 gets std = 1. */
CLG_INTERNAL clg_status clg_dataset_norm_compute(clg_err *err, const clg_dataset *ds, clg_ds_norm *out);
/* mean 0, std 1 for c channels (no normalization beyond the dtype scale). */
CLG_INTERNAL void clg_ds_norm_identity(clg_ds_norm *nm, int c);

/* ---- batches ----
 * Fills x (count x C x H x W floats, normalized with nm; nm NULL = scale
 * only) and labels (count int32; may be NULL) for samples perm[start ..
 * start + count) (perm NULL = identity), count = min(batch, n - start).
 * Returns count through *count_out (0 when start >= n). */
CLG_INTERNAL clg_status clg_dataset_fill_batch(clg_err *err, const clg_dataset *ds, const clg_ds_norm *nm,
                                               const int32_t *perm, int start, int batch, float *x,
                                               int32_t *labels, int *count_out);

/* Training-time augmentation, applied per sample after normalization:
 * flip mirrors the image left-right with probability 1/2; shift moves it by
 * (dy, dx), each uniform in [-shift, shift], filling the uncovered border
 * with the normalized value of a zero pixel. The choices for the sample at
 * permutation position i depend only on (seed, epoch, i), so a resumed run
 * sees the same images. */
typedef struct clg_ds_augment {
    int flip;
    int shift;
    uint64_t seed, epoch;
} clg_ds_augment;
#define CLG_DS_MAX_SHIFT 8
/* clg_dataset_fill_batch with augmentation (aug NULL or all off: none). */
CLG_INTERNAL clg_status clg_dataset_fill_batch_aug(clg_err *err, const clg_dataset *ds, const clg_ds_norm *nm,
                                                   const int32_t *perm, int start, int batch,
                                                   const clg_ds_augment *aug, float *x, int32_t *labels,
                                                   int *count_out);

/* ---- text data (io/text.c) ----
 * `--data text:PATH`: any file, byte-level (vocabulary 256). The last
 * 1/CLG_TEXT_HELDOUT_DIV of the file is held out (split test), the rest
 * trains. A sample is a window of T + 1 bytes: ids window[0..T) as floats,
 * targets window[1..T] as int32 (T labels per sample). Training windows
 * start at offsets drawn from (seed, epoch, position) only; an epoch is
 * head / T windows. Held-out windows are consecutive: window i starts at
 * byte i T of the tail, (tail - 1) / T of them. */
#define CLG_TEXT_VOCAB 256
#define CLG_TEXT_HELDOUT_DIV 10
#define CLG_TEXT_MAX_BYTES ((uint64_t)1 << 30) /* read into memory whole: larger files are refused */
#define CLG_TEXT_MAX_CONTEXT (1 << 20)

/* "text:PATH" -> PATH; NULL for any other spec. */
CLG_INTERNAL const char *clg_text_spec_path(const char *spec);
/* Reads path whole (regular files up to CLG_TEXT_MAX_BYTES) and keeps the
 * split's part. Refuses, naming the file and the sizes: a missing file, a
 * directory, an empty file, a file shorter than CLG_TEXT_HELDOUT_DIV (T + 1)
 * bytes (a window in the head and in the tail). */
CLG_INTERNAL clg_status clg_text_open(clg_err *err, const char *path, int context, clg_ds_split split,
                                      clg_dataset **out);
/* Byte offset of the window at position pos of epoch `epoch`. */
CLG_INTERNAL size_t clg_text_window(const clg_dataset *ds, uint64_t seed, uint64_t epoch, int64_t pos);
/* Windows start .. start + count: x (count T floats), labels (count T int32, may be NULL). */
CLG_INTERNAL clg_status clg_text_fill(clg_err *err, const clg_dataset *ds, uint64_t seed, uint64_t epoch, int start,
                                      int count, float *x, int32_t *labels);

/* clg_dataset_open_in, and "text:PATH" for a model whose input is `context`
 * token ids (0: the model takes no text; refused). */
CLG_INTERNAL clg_status clg_dataset_open_for(clg_err *err, const char *data_dir, const char *spec, clg_ds_split split,
                                             int context, clg_dataset **out);

/* Labels per sample: T for text, 1 otherwise. */
static inline int clg_dataset_labels_per_sample(const clg_dataset *ds) { return ds->text ? ds->h : 1; }

/* Floats per sample (C*H*W). */
static inline size_t clg_dataset_sample_size(const clg_dataset *ds) { return (size_t)ds->c * ds->h * ds->w; }

#endif
