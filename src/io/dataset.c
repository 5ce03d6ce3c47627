/* Datasets: the dataset object, opening by name or path (format
 * discovery), shuffling, normalization, augmentation and batch filling.
 * The format readers are in gz.c, idx.c, cifar.c and pgm.c. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/options.h"
#include "io/dataset_impl.h"

// ---- the dataset object ----

void clg_dataset_free(clg_dataset *ds)
{
    if (!ds)
        return;
    free(ds->u8);
    free(ds->f32);
    free(ds->labels);
    free(ds->text);
    free(ds);
}

void clg_ds_set_str(char *dst, size_t cap, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n >= cap)
        n = cap - 1;
    if (n)
        memcpy(dst, s, n);
    dst[n] = 0;
}

clg_status clg_dataset_create(clg_err *err, int n, int c, int h, int w, int nclasses, clg_ds_dtype dtype,
                              clg_dataset **out)
{
    *out = NULL;
    if (n < 0 || c <= 0 || h <= 0 || w <= 0 || nclasses < 0 || (dtype != CLG_DS_U8 && dtype != CLG_DS_F32))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "dataset: bad shape %d x %d x %d x %d (classes %d)", n, c, h,
                           w, nclasses);
    if (c > CLG_DS_MAX_CHANNELS)
        return clg_err_set(err, CLG_ERR_UNSUPPORTED, "dataset: %d channels (at most %d supported)", c,
                           CLG_DS_MAX_CHANNELS);
    uint64_t per = (uint64_t)c * (uint64_t)h * (uint64_t)w;
    uint64_t total = per * (uint64_t)n;
    if (per > ((uint64_t)1 << 31) || total > CLG_IDX_MAX_BYTES)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "dataset: %d x %d x %d x %d is too large", n, c, h, w);
    clg_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "dataset: out of memory");
    ds->n = n;
    ds->c = c;
    ds->h = h;
    ds->w = w;
    ds->nclasses = nclasses;
    ds->dtype = dtype;
    size_t cnt = (size_t)total ? (size_t)total : 1;
    if (dtype == CLG_DS_U8)
        ds->u8 = calloc(cnt, 1);
    else
        ds->f32 = calloc(cnt, sizeof(float));
    ds->labels = calloc(n ? (size_t)n : 1, sizeof(int32_t));
    if ((dtype == CLG_DS_U8 ? (void *)ds->u8 : (void *)ds->f32) == NULL || !ds->labels) {
        clg_dataset_free(ds);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "dataset: out of memory for %d x %d x %d x %d", n, c, h, w);
    }
    clg_ds_set_str(ds->name, sizeof ds->name, "memory");
    clg_ds_set_str(ds->source, sizeof ds->source, "<memory>");
    *out = ds;
    return CLG_OK;
}

// ---- single images (predict): PGM or IDX, by content ----

clg_status clg_dataset_load_image(clg_err *err, const char *path, clg_dataset **out)
{
    *out = NULL;
    if (!clg_ds_file_exists(path))
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "input '%s' does not exist (or is not a regular file)", path);
    uint8_t *buf = NULL;
    size_t len = 0;
    clg_status st = clg_ds_read_maybe_gz(err, path, CLG_IDX_MAX_BYTES + 36, &buf, &len);
    if (st != CLG_OK)
        return st;
    if (len >= 2 && buf[0] == 'P' && (buf[1] == '5' || buf[1] == '2')) {
        st = clg_pgm_load(err, path, (const char *)buf, len, out);
        free(buf);
        return st;
    }
    if (len >= 2 && buf[0] == 0 && buf[1] == 0) {
        clg_idx_file im;
        st = clg_idx_parse(err, path, buf, len, &im);
        if (st != CLG_OK)
            return st;
        st = clg_idx_images_to_dataset(err, path, &im, out);
        free(im.data);
        return st;
    }
    free(buf);
    return clg_err_set(err, CLG_ERR_FORMAT, "input '%s' is neither an IDX file nor a PGM image (P5/P2)", path);
}

// ---- name resolution ----

int clg_ds_file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int dir_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int join(char *dst, size_t cap, const char *a, const char *b)
{
    int n = snprintf(dst, cap, "%s/%s", a, b);
    return n > 0 && (size_t)n < cap;
}

/* Finds dir/<name> or dir/<name>.gz. */
static int find_idx(const char *dir, const char *name, char *out, size_t cap)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s.gz", name);
    if (join(out, cap, dir, tmp) && clg_ds_file_exists(out))
        return 1;
    if (join(out, cap, dir, name) && clg_ds_file_exists(out))
        return 1;
    return 0;
}

static clg_status open_idx_dir(clg_err *err, const char *dir, clg_ds_split split, clg_dataset **out)
{
    const char *pre = split == CLG_SPLIT_TRAIN ? "train" : "t10k";
    char img[1024], lab[1024], ni[256], nl[256];
    snprintf(ni, sizeof ni, "%s-images-idx3-ubyte", pre);
    snprintf(nl, sizeof nl, "%s-labels-idx1-ubyte", pre);
    if (!find_idx(dir, ni, img, sizeof img))
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "dataset directory '%s' has no %s[.gz]", dir, ni);
    if (!find_idx(dir, nl, lab, sizeof lab))
        return clg_err_set(err, CLG_ERR_NOT_FOUND, "dataset directory '%s' has no %s[.gz]", dir, nl);
    return clg_dataset_load_idx(err, img, lab, out);
}

static clg_status open_cifar_dir(clg_err *err, const char *dir, clg_ds_split split, clg_dataset **out)
{
    char paths[5][1024];
    const char *pp[5];
    int np = 0;
    if (split == CLG_SPLIT_TRAIN) {
        for (int i = 1; i <= 5; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, "data_batch_%d.bin", i);
            if (!join(paths[np], sizeof paths[np], dir, nm) || !clg_ds_file_exists(paths[np]))
                return clg_err_set(err, CLG_ERR_NOT_FOUND, "CIFAR-10 directory '%s' has no %s", dir, nm);
            pp[np] = paths[np];
            np++;
        }
    } else {
        if (!join(paths[0], sizeof paths[0], dir, "test_batch.bin") || !clg_ds_file_exists(paths[0]))
            return clg_err_set(err, CLG_ERR_NOT_FOUND, "CIFAR-10 directory '%s' has no test_batch.bin", dir);
        pp[0] = paths[0];
        np = 1;
    }
    return clg_dataset_load_cifar10(err, pp, np, out);
}

static int is_cifar_dir(const char *dir)
{
    char p[1024];
    return (join(p, sizeof p, dir, "test_batch.bin") && clg_ds_file_exists(p)) ||
           (join(p, sizeof p, dir, "data_batch_1.bin") && clg_ds_file_exists(p));
}

static int is_idx_dir(const char *dir)
{
    char p[1024];
    return find_idx(dir, "train-images-idx3-ubyte", p, sizeof p) || find_idx(dir, "t10k-images-idx3-ubyte", p, sizeof p);
}

clg_status clg_dataset_open(clg_err *err, const char *spec, clg_ds_split split, clg_dataset **out)
{
    clg_opts *o = malloc(sizeof *o); /* data_dir from the environment: no context here */
    if (!o)
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    clg_opts_init(o);
    clg_status st = clg_opts_read_env_one(o, CLG_OPT_ID_data_dir, err);
    if (st == CLG_OK)
        st = clg_dataset_open_in(err, o->data_dir, spec, split, out);
    free(o);
    return st;
}

clg_status clg_dataset_open_in(clg_err *err, const char *data_dir, const char *spec, clg_ds_split split,
                               clg_dataset **out)
{
    *out = NULL;
    if (!spec || !*spec)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "no dataset given");
    if (clg_text_spec_path(spec))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "dataset '%s': text data needs a model that reads token ids", spec);
    const char *named = NULL;
    int cifar = 0;
    if (strcmp(spec, "fashion-mnist") == 0 || strcmp(spec, "fashion_mnist") == 0)
        named = "fashion-mnist";
    else if (strcmp(spec, "mnist") == 0)
        named = "mnist";
    else if (strcmp(spec, "cifar10") == 0 || strcmp(spec, "cifar-10") == 0) {
        named = "cifar10";
        cifar = 1;
    }
    clg_status st;
    if (named) {
        const char *env = data_dir;
        char cand[6][1024];
        int nc = 0;
        const char *subs_idx[] = {named, NULL};
        const char *subs_cifar[] = {"cifar-10-batches-bin", "cifar10", "cifar-10", NULL};
        const char *const *subs = cifar ? subs_cifar : subs_idx;
        if (env && *env) {
            for (int i = 0; subs[i] && nc < 5; i++)
                if (join(cand[nc], sizeof cand[nc], env, subs[i]))
                    nc++;
            snprintf(cand[nc++], sizeof cand[0], "%s", env);
        }
        for (int i = 0; subs[i] && nc < 6; i++) {
            if (join(cand[nc], sizeof cand[nc], "/usr/share/datasets", subs[i]))
                nc++;
        }
        for (int i = 0; i < nc; i++) {
            if (!dir_exists(cand[i]))
                continue;
            if (cifar ? !is_cifar_dir(cand[i]) : !is_idx_dir(cand[i]))
                continue;
            st = cifar ? open_cifar_dir(err, cand[i], split, out) : open_idx_dir(err, cand[i], split, out);
            if (st == CLG_OK) {
                clg_ds_set_str((*out)->name, sizeof(*out)->name, named);
                clg_ds_set_str((*out)->source, sizeof(*out)->source, cand[i]);
            }
            return st;
        }
        char tried[4096];
        size_t tl = 0;
        tried[0] = 0;
        for (int i = 0; i < nc && tl < sizeof tried; i++) {
            int w = snprintf(tried + tl, sizeof tried - tl, "%s%s", i ? ", " : "", cand[i]);
            if (w < 0)
                break;
            tl += (size_t)w;
        }
        return clg_err_set(err, CLG_ERR_NOT_FOUND,
                           "dataset '%s' not found (looked in: %s); install Debian's dataset-%s package or set "
                           "CLGRAD_DATA_DIR",
                           named, tried, named);
    }
    if (dir_exists(spec)) {
        if (is_cifar_dir(spec))
            return open_cifar_dir(err, spec, split, out);
        if (is_idx_dir(spec))
            return open_idx_dir(err, spec, split, out);
        return clg_err_set(err, CLG_ERR_NOT_FOUND,
                           "directory '%s' holds neither IDX files ({train,t10k}-images-idx3-ubyte[.gz]) nor "
                           "CIFAR-10 batches (data_batch_N.bin, test_batch.bin)",
                           spec);
    }
    if (!clg_ds_file_exists(spec))
        return clg_err_set(err, CLG_ERR_NOT_FOUND,
                           "dataset '%s' not found (expected fashion-mnist, mnist, cifar10, a directory or a file)",
                           spec);
    size_t sl = strlen(spec);
    if (sl > 4 && strcmp(spec + sl - 4, ".bin") == 0) {
        const char *pp[1] = {spec};
        return clg_dataset_load_cifar10(err, pp, 1, out);
    }
    /* an IDX images file: derive its labels file */
    char lab[1024];
    const char *hit = strstr(spec, "images-idx3");
    const char *lp = NULL;
    if (hit && sl < sizeof lab) {
        size_t pre = (size_t)(hit - spec);
        snprintf(lab, sizeof lab, "%.*slabels-idx1%s", (int)pre, spec, hit + strlen("images-idx3"));
        if (clg_ds_file_exists(lab))
            lp = lab;
    }
    if (!lp)
        return clg_err_set(err, CLG_ERR_NOT_FOUND,
                           "no labels file for IDX images '%s' (expected its name with 'images-idx3' replaced by "
                           "'labels-idx1')",
                           spec);
    return clg_dataset_load_idx(err, spec, lp, out);
}

clg_status clg_dataset_open_for(clg_err *err, const char *data_dir, const char *spec, clg_ds_split split,
                                int context, clg_dataset **out)
{
    const char *text = clg_text_spec_path(spec);
    if (!text)
        return clg_dataset_open_in(err, data_dir, spec, split, out);
    *out = NULL;
    if (context < 1)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "dataset '%s': text data needs a model that reads token ids", spec);
    return clg_text_open(err, text, context, split, out);
}

// ---- shuffling ----

void clg_dataset_perm_identity(int32_t *perm, int n)
{
    for (int i = 0; i < n; i++)
        perm[i] = i;
}

/* Uniform in [0, bound) without modulo bias. */
static uint32_t bounded(clg_rng *r, uint32_t bound)
{
    uint32_t threshold = (uint32_t)(-bound) % bound;
    for (;;) {
        uint32_t x = clg_rng_u32(r);
        if (x >= threshold)
            return x % bound;
    }
}

void clg_dataset_shuffle(int32_t *perm, int n, clg_rng *rng)
{
    for (int i = n - 1; i > 0; i--) {
        uint32_t j = bounded(rng, (uint32_t)i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void clg_dataset_epoch_perm(int32_t *perm, int n, uint64_t seed, uint64_t epoch)
{
    clg_rng r;
    clg_rng_seed(&r, seed ^ (epoch * 0x9E3779B97F4A7C15ULL), 0x5348554646ULL + epoch);
    clg_dataset_perm_identity(perm, n);
    clg_dataset_shuffle(perm, n, &r);
}

/* Sample i of src into slot j of dst (same shape and dtype). */
static void copy_sample(clg_dataset *dst, int j, const clg_dataset *src, int i)
{
    size_t per = (size_t)src->c * src->h * src->w;
    if (src->dtype == CLG_DS_U8)
        memcpy(dst->u8 + (size_t)j * per, src->u8 + (size_t)i * per, per);
    else
        memcpy(dst->f32 + (size_t)j * per, src->f32 + (size_t)i * per, per * sizeof(float));
    dst->labels[j] = src->labels[i];
}

clg_status clg_dataset_holdout(clg_err *err, const clg_dataset *ds, double fraction, uint64_t seed,
                               clg_dataset **train, clg_dataset **val)
{
    *train = *val = NULL;
    long nv = fraction > 0 && fraction < 1 ? lround(ds->n * fraction) : 0;
    if (nv < 1 || nv >= ds->n)
        return clg_err_set(err, CLG_ERR_INVALID_ARG,
                           "validation fraction %g of the %d training samples of '%s' leaves %ld for validation "
                           "(need at least 1, and 1 for training)",
                           fraction, ds->n, ds->source, nv);
    int32_t *perm = malloc((size_t)ds->n * sizeof *perm);
    uint8_t *is_val = calloc((size_t)ds->n, 1);
    clg_status st = perm && is_val ? CLG_OK : clg_err_set(err, CLG_ERR_HOST_OOM, "validation split: out of memory");
    if (st == CLG_OK) {
        clg_dataset_epoch_perm(perm, ds->n, seed, 0x76616CULL); /* its own stream, apart from the epochs' */
        for (long k = 0; k < nv; k++)
            is_val[perm[k]] = 1;
        st = clg_dataset_create(err, ds->n - (int)nv, ds->c, ds->h, ds->w, ds->nclasses, ds->dtype, train);
    }
    if (st == CLG_OK)
        st = clg_dataset_create(err, (int)nv, ds->c, ds->h, ds->w, ds->nclasses, ds->dtype, val);
    if (st == CLG_OK) {
        int a = 0, b = 0;
        for (int i = 0; i < ds->n; i++) {
            if (is_val[i])
                copy_sample(*val, b++, ds, i);
            else
                copy_sample(*train, a++, ds, i);
        }
        const char *names[2] = {"train", "validation"};
        clg_dataset *parts[2] = {*train, *val};
        for (int k = 0; k < 2; k++) {
            clg_ds_set_str(parts[k]->name, sizeof parts[k]->name, ds->name);
            snprintf(parts[k]->source, sizeof parts[k]->source, "%.480s (%s part)", ds->source, names[k]);
        }
    } else {
        clg_dataset_free(*train);
        clg_dataset_free(*val);
        *train = *val = NULL;
    }
    free(perm);
    free(is_val);
    return st;
}

// ---- normalization ----

void clg_ds_norm_identity(clg_ds_norm *nm, int c)
{
    memset(nm, 0, sizeof *nm);
    nm->c = c;
    for (int i = 0; i < CLG_DS_MAX_CHANNELS; i++)
        nm->std[i] = 1.0f;
}

clg_status clg_dataset_norm_compute(clg_err *err, const clg_dataset *ds, clg_ds_norm *out)
{
    clg_ds_norm_identity(out, ds->c);
    if (ds->text)
        return CLG_OK; /* token ids are used as they are */
    if (ds->n <= 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "dataset '%s' is empty: cannot compute normalization",
                           ds->source);
    size_t plane = (size_t)ds->h * ds->w;
    for (int c = 0; c < ds->c; c++) {
        double s = 0, s2 = 0;
        for (int i = 0; i < ds->n; i++) {
            size_t base = ((size_t)i * ds->c + (size_t)c) * plane;
            double ls = 0, ls2 = 0;
            if (ds->dtype == CLG_DS_U8) {
                uint64_t a = 0, a2 = 0;
                for (size_t k = 0; k < plane; k++) {
                    unsigned v = ds->u8[base + k];
                    a += v;
                    a2 += (uint64_t)v * v;
                }
                ls = (double)a / 255.0;
                ls2 = (double)a2 / (255.0 * 255.0);
            } else {
                for (size_t k = 0; k < plane; k++) {
                    double v = ds->f32[base + k];
                    ls += v;
                    ls2 += v * v;
                }
            }
            s += ls;
            s2 += ls2;
        }
        double cnt = (double)ds->n * (double)plane;
        double mean = s / cnt;
        double var = s2 / cnt - mean * mean;
        double sd = var > 0 ? sqrt(var) : 0;
        if (!isfinite(mean) || !isfinite(sd))
            return clg_err_set(err, CLG_ERR_FORMAT, "dataset '%s': channel %d has non-finite values", ds->source, c);
        out->mean[c] = (float)mean;
        out->std[c] = sd < 1e-6 ? 1.0f : (float)sd;
    }
    return CLG_OK;
}

// ---- batches ----

static clg_status fill_batch_impl(clg_err *err, const clg_dataset *ds, const clg_ds_norm *nm, const int32_t *perm,
                                  int start, int batch, const clg_ds_augment *aug, float *tmp, float *x,
                                  int32_t *labels, int *count_out);

/* Mirrors and/or shifts one C x H x W sample in place (tmp: H*W floats);
 * fill is the per-channel value of a zero pixel. */
static void augment_sample(float *d, int C, int H, int W, int flip, int dy, int dx, const float *fill, float *tmp)
{
    size_t plane = (size_t)H * W;
    for (int c = 0; c < C; c++) {
        float *p = d + (size_t)c * plane;
        memcpy(tmp, p, plane * sizeof(float));
        for (int y = 0; y < H; y++) {
            int sy = y - dy;
            for (int xx = 0; xx < W; xx++) {
                int sx = xx - dx;
                if (flip)
                    sx = W - 1 - sx;
                p[(size_t)y * W + xx] = (sy >= 0 && sy < H && sx >= 0 && sx < W) ? tmp[(size_t)sy * W + sx] : fill[c];
            }
        }
    }
}

clg_status clg_dataset_fill_batch(clg_err *err, const clg_dataset *ds, const clg_ds_norm *nm, const int32_t *perm,
                                  int start, int batch, float *x, int32_t *labels, int *count_out)
{
    return clg_dataset_fill_batch_aug(err, ds, nm, perm, start, batch, NULL, x, labels, count_out);
}

clg_status clg_dataset_fill_batch_aug(clg_err *err, const clg_dataset *ds, const clg_ds_norm *nm,
                                      const int32_t *perm, int start, int batch, const clg_ds_augment *aug, float *x,
                                      int32_t *labels, int *count_out)
{
    *count_out = 0;
    if (ds->text) { /* windows from (seed, epoch, position); never normalized nor augmented */
        if (start < 0 || batch < 0)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "fill_batch: start %d, batch %d", start, batch);
        int count = start >= ds->n ? 0 : CLG_MIN(batch, ds->n - start);
        CLG_TRY(clg_text_fill(err, ds, aug ? aug->seed : 0, aug ? aug->epoch : 0, start, count, x, labels));
        *count_out = count;
        return CLG_OK;
    }
    if (aug && (aug->shift < 0 || aug->shift > CLG_DS_MAX_SHIFT))
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "augmentation shift %d is outside 0..%d", aug->shift,
                           CLG_DS_MAX_SHIFT);
    float *tmp = NULL;
    if (aug && (aug->flip || aug->shift > 0)) {
        tmp = malloc((size_t)ds->h * ds->w * sizeof(float));
        if (!tmp)
            return clg_err_set(err, CLG_ERR_HOST_OOM, "fill_batch: %d x %d augmentation buffer", ds->h, ds->w);
    }
    clg_status st = fill_batch_impl(err, ds, nm, perm, start, batch, aug, tmp, x, labels, count_out);
    free(tmp);
    return st;
}

static clg_status fill_batch_impl(clg_err *err, const clg_dataset *ds, const clg_ds_norm *nm, const int32_t *perm,
                                  int start, int batch, const clg_ds_augment *aug, float *tmp, float *x,
                                  int32_t *labels, int *count_out)
{
    if (start < 0 || batch < 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "fill_batch: start %d, batch %d", start, batch);
    if (nm && nm->c != ds->c)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "fill_batch: normalization has %d channels, dataset %d", nm->c,
                           ds->c);
    int count = start >= ds->n ? 0 : CLG_MIN(batch, ds->n - start);
    size_t plane = (size_t)ds->h * ds->w;
    float a[CLG_DS_MAX_CHANNELS], b[CLG_DS_MAX_CHANNELS];
    float scale = ds->dtype == CLG_DS_U8 ? 1.0f / 255.0f : 1.0f;
    for (int c = 0; c < ds->c; c++) {
        float mean = nm ? nm->mean[c] : 0.0f, sd = nm ? nm->std[c] : 1.0f;
        a[c] = scale / sd;
        b[c] = -mean / sd;
    }
    size_t per = clg_dataset_sample_size(ds);
    for (int i = 0; i < count; i++) {
        int32_t idx = perm ? perm[start + i] : start + i;
        if (idx < 0 || idx >= ds->n)
            return clg_err_set(err, CLG_ERR_INVALID_ARG, "fill_batch: permutation entry %d is %d (dataset has %d)",
                               start + i, idx, ds->n);
        float *dst = x + (size_t)i * per;
        for (int c = 0; c < ds->c; c++) {
            size_t off = (size_t)idx * per + (size_t)c * plane;
            float *d = dst + (size_t)c * plane;
            if (ds->dtype == CLG_DS_U8) {
                const uint8_t *s = ds->u8 + off;
                for (size_t k = 0; k < plane; k++)
                    d[k] = (float)s[k] * a[c] + b[c];
            } else {
                const float *s = ds->f32 + off;
                for (size_t k = 0; k < plane; k++)
                    d[k] = s[k] * a[c] + b[c];
            }
        }
        if (tmp) {
            /* the choices depend only on (seed, epoch, position) */
            uint64_t key[3] = {aug->seed, aug->epoch, (uint64_t)(start + i)};
            uint64_t r = clg_hash64(key, sizeof key, 0x61756731u);
            int flip = aug->flip && (r & 1);
            int span = 2 * aug->shift + 1;
            int dy = aug->shift ? (int)((r >> 8) % (uint64_t)span) - aug->shift : 0;
            int dx = aug->shift ? (int)((r >> 32) % (uint64_t)span) - aug->shift : 0;
            augment_sample(dst, ds->c, ds->h, ds->w, flip, dy, dx, b, tmp);
        }
        if (labels)
            labels[i] = ds->labels[idx];
    }
    *count_out = count;
    return CLG_OK;
}
