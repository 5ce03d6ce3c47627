/* Layers against PyTorch: replays the dumps written by gen_torch_dumps.py
 * (committed under tests/model/torch_dumps; regenerate with
 * /usr/bin/python3 tests/model/gen_torch_dumps.py tests/model/torch_dumps).
 * Each dump holds the inputs, initial parameters and output gradient of one
 * layer, and PyTorch's (float64) outputs, input and parameter gradients,
 * running statistics and loss. Loss layers run with grad_scale = 1/N
 * (PyTorch's mean reduction). Tolerance: |got - ref| / (|ref| + 1e-3) <= 2e-3.
 * Skips (77) when no dump is found. Usage: test_model_torch [DUMP_DIR]. */
#include <dirent.h>
#include <stdio.h>

#include "layer_harness.h"

#ifndef TORCH_DUMPS_DIR
#define TORCH_DUMPS_DIR "tests/model/torch_dumps"
#endif

#define TT_TOL 2e-3
#define TT_ATOL 1e-3
#define MAX_T 32

typedef struct {
    char name[64];
    int ndim, dims[4];
    size_t n;
    float *data;
} ttensor;

typedef struct {
    char type[64], keys[256];
    int nin;
    int shp[CLG_MAX_INPUTS][4];
    ttensor t[MAX_T];
    int nt;
} tdump;

static const char *g_dir = TORCH_DUMPS_DIR;
static char **g_files;
static int g_nfiles;

static int rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

static int rdstr(FILE *f, char *buf, size_t cap)
{
    uint32_t len;
    if (!rd(f, &len, 4) || len >= cap)
        return 0;
    if (!rd(f, buf, len))
        return 0;
    buf[len] = 0;
    return 1;
}

static void load_dump(const char *path, tdump *d)
{
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char magic[4];
    uint32_t ver, nin, nt;
    ck_assert(rd(f, magic, 4) && memcmp(magic, "CLGT", 4) == 0);
    ck_assert(rd(f, &ver, 4) && ver == 1);
    ck_assert(rdstr(f, d->type, sizeof d->type) && rdstr(f, d->keys, sizeof d->keys));
    ck_assert(rd(f, &nin, 4) && nin >= 1 && nin <= CLG_MAX_INPUTS);
    d->nin = (int)nin;
    for (int i = 0; i < d->nin; i++)
        ck_assert(rd(f, d->shp[i], sizeof d->shp[i]));
    ck_assert(rd(f, &nt, 4) && nt <= MAX_T);
    d->nt = (int)nt;
    for (int i = 0; i < d->nt; i++) {
        ttensor *t = &d->t[i];
        uint32_t nd;
        ck_assert(rdstr(f, t->name, sizeof t->name));
        ck_assert(rd(f, &nd, 4) && nd <= 4);
        t->ndim = (int)nd;
        t->n = 1;
        for (int k = 0; k < t->ndim; k++) {
            ck_assert(rd(f, &t->dims[k], 4) && t->dims[k] > 0);
            t->n *= (size_t)t->dims[k];
        }
        t->data = lh_alloc(t->n);
        ck_assert_msg(rd(f, t->data, t->n * sizeof(float)), "%s: truncated tensor %s", path, t->name);
    }
    fclose(f);
}

static ttensor *find(tdump *d, const char *name)
{
    for (int i = 0; i < d->nt; i++)
        if (strcmp(d->t[i].name, name) == 0)
            return &d->t[i];
    return NULL;
}

static void compare(const char *file, const char *what, const float *got, const ttensor *ref)
{
    double *r = lh_dalloc(ref->n);
    for (size_t i = 0; i < ref->n; i++)
        r[i] = ref->data[i];
    double e = tu_max_err(got, r, ref->n, TT_ATOL);
    free(r);
    ck_assert_msg(e <= TT_TOL, "%s: %s differs from PyTorch: max error %.3g > %.3g", file, what, e, TT_TOL);
}

START_TEST(torch_case)
{
    const char *file = g_files[_i];
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", g_dir, file);
    tdump d;
    load_dump(path, &d);
    lh_case c;
    lh_ctx(&c, NULL);
    int N = d.shp[0][0];
    lh_make(&c, d.type, d.keys, d.nin, (const int(*)[4])d.shp, N, 0, 1, 3000);
    /* inputs and parameters from the dump */
    for (int i = 0; i < d.nin; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "x%d", i);
        ttensor *t = find(&d, nm);
        ck_assert_msg(t && t->n == c.nx[i], "%s: input %s missing or mis-sized", file, nm);
        memcpy(c.x[i], t->data, t->n * sizeof(float));
    }
    lh_reupload(&c);
    for (int j = 0; j < c.l.nparams; j++) {
        char nm[48];
        snprintf(nm, sizeof nm, "p:%s", c.l.params[j].name);
        ttensor *t = find(&d, nm);
        ck_assert_msg(t && t->n == c.l.params[j].numel, "%s: param %s missing or mis-sized (layer has %zu)", file,
                      nm, c.l.params[j].numel);
        memcpy(c.p[j], t->data, t->n * sizeof(float));
    }
    lh_set_params(&c);
    ttensor *lab = find(&d, "labels"), *tgt = find(&d, "targets");
    if (lab) {
        int *li = malloc(lab->n * sizeof(int));
        for (size_t i = 0; i < lab->n; i++)
            li[i] = (int)lab->data[i];
        ck_assert_int_eq(clg_buf_alloc(c.dev, lab->n * sizeof(int), &c.labels), CLG_OK);
        clEnqueueWriteBuffer(c.dev->queue, c.labels, CL_TRUE, 0, lab->n * sizeof(int), li, 0, NULL, NULL);
        free(li);
    }
    if (tgt)
        c.labels = tu_upload(c.dev, tgt->data, tgt->n);
    if (c.l.is_loss) {
        ck_assert_msg(c.labels != NULL, "%s: loss layer without labels/targets", file);
        c.l.loss.labels = c.labels;
        c.l.loss.grad_scale = 1.0f / (float)N;
    }
    int checked = 0;
    ttensor *yi = find(&d, "y_infer");
    if (yi) {
        lh_forward(&c, 0);
        compare(file, "inference output", c.y, yi);
        checked++;
    }
    ttensor *y = find(&d, "y");
    if (y) {
        lh_forward(&c, 1);
        ck_assert_uint_eq(y->n, c.ny);
        compare(file, "output", c.y, y);
        checked++;
        ttensor *loss = find(&d, "loss");
        if (loss) {
            float res[2];
            tu_download(c.dev, c.l.loss.result, res, 2);
            float mean = res[0] / (float)N;
            compare(file, "loss (mean over the batch)", &mean, loss);
        }
        for (int j = 0; j < c.l.nparams; j++) {
            char nm[48];
            snprintf(nm, sizeof nm, "s:%s", c.l.params[j].name);
            ttensor *s = find(&d, nm);
            if (!s)
                continue;
            float *v = lh_alloc(s->n);
            tu_download(c.dev, c.l.params[j].value, v, s->n);
            compare(file, nm, v, s);
            free(v);
        }
        ttensor *dout = find(&d, "dout");
        if (dout || c.l.is_loss) {
            float *dy = lh_alloc(c.ny);
            if (dout)
                memcpy(dy, dout->data, c.ny * sizeof(float));
            else
                tu_poison(dy, c.ny); /* loss layers ignore dout */
            lh_backward(&c, dy, 0);
            free(dy);
            for (int i = 0; i < d.nin; i++) {
                char nm[16];
                snprintf(nm, sizeof nm, "dx%d", i);
                ttensor *t = find(&d, nm);
                if (t) {
                    compare(file, nm, c.dx[i], t);
                    checked++;
                }
            }
            for (int j = 0; j < c.l.nparams; j++) {
                char nm[48];
                snprintf(nm, sizeof nm, "g:%s", c.l.params[j].name);
                ttensor *t = find(&d, nm);
                if (c.l.params[j].trainable) {
                    ck_assert_msg(t != NULL, "%s: no PyTorch gradient for %s", file, c.l.params[j].name);
                    compare(file, nm, c.g[j], t);
                    checked++;
                }
            }
        }
    }
    ck_assert_msg(checked > 0, "%s: nothing compared", file);
    for (int i = 0; i < d.nt; i++)
        free(d.t[i].data);
    lh_free(&c);
}
END_TEST

static int cmpstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv)
{
    if (argc > 1)
        g_dir = argv[1];
    DIR *dir = opendir(g_dir);
    if (dir) {
        struct dirent *e;
        while ((e = readdir(dir))) {
            size_t n = strlen(e->d_name);
            if (n > 4 && strcmp(e->d_name + n - 4, ".bin") == 0) {
                g_files = realloc(g_files, sizeof(char *) * (size_t)(g_nfiles + 1));
                g_files[g_nfiles++] = strdup(e->d_name);
            }
        }
        closedir(dir);
    }
    if (g_nfiles == 0) {
        fprintf(stderr, "skip: no PyTorch dumps in %s (generate them with gen_torch_dumps.py)\n", g_dir);
        return TU_SKIP;
    }
    qsort(g_files, (size_t)g_nfiles, sizeof(char *), cmpstr);
    Suite *s = suite_create("torch");
    TCase *tc = tcase_create("torch");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, torch_case, 0, g_nfiles);
    suite_add_tcase(s, tc);
    int rc = tu_run(s);
    for (int i = 0; i < g_nfiles; i++)
        free(g_files[i]);
    free(g_files);
    return rc;
}
