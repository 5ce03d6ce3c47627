/* CIFAR-10 binary batches. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/dataset_impl.h"

#define CIFAR_REC 3073

clg_status clg_dataset_load_cifar10(clg_err *err, const char *const *paths, int npaths, clg_dataset **out)
{
    *out = NULL;
    if (npaths <= 0)
        return clg_err_set(err, CLG_ERR_INVALID_ARG, "CIFAR-10: no batch files given");
    uint64_t total = 0;
    for (int i = 0; i < npaths; i++) {
        struct stat sb;
        if (stat(paths[i], &sb) != 0)
            return clg_err_set(err, CLG_ERR_NOT_FOUND, "CIFAR-10 batch '%s': %s", paths[i], strerror(errno));
        if (!S_ISREG(sb.st_mode))
            return clg_err_set(err, CLG_ERR_IO, "CIFAR-10 batch '%s' is not a regular file", paths[i]);
        if (sb.st_size == 0 || sb.st_size % CIFAR_REC != 0)
            return clg_err_set(err, CLG_ERR_FORMAT,
                               "CIFAR-10 batch '%s' is %lld bytes, not a positive multiple of the %d-byte record "
                               "(truncated or not a CIFAR-10 binary batch)",
                               paths[i], (long long)sb.st_size, CIFAR_REC);
        total += (uint64_t)sb.st_size / CIFAR_REC;
    }
    if (total > INT32_MAX)
        return clg_err_set(err, CLG_ERR_FORMAT, "CIFAR-10: too many records");
    clg_dataset *ds = NULL;
    clg_status st = clg_dataset_create(err, (int)total, 3, 32, 32, 10, CLG_DS_U8, &ds);
    if (st != CLG_OK)
        return st;
    uint8_t *rec = malloc(CIFAR_REC);
    if (!rec) {
        clg_dataset_free(ds);
        return clg_err_set(err, CLG_ERR_HOST_OOM, "out of memory");
    }
    int idx = 0;
    for (int i = 0; i < npaths && st == CLG_OK; i++) {
        FILE *f = fopen(paths[i], "rb");
        if (!f) {
            st = clg_err_set(err, CLG_ERR_IO, "cannot open CIFAR-10 batch '%s': %s", paths[i], strerror(errno));
            break;
        }
        for (int r = 0;; r++) {
            size_t got = fread(rec, 1, CIFAR_REC, f);
            if (got == 0 && feof(f))
                break;
            if (got != CIFAR_REC || idx >= ds->n) {
                st = clg_err_set(err, CLG_ERR_FORMAT, "CIFAR-10 batch '%s': record %d is incomplete (file changed?)",
                                 paths[i], r);
                break;
            }
            if (rec[0] > 9) {
                st = clg_err_set(err, CLG_ERR_FORMAT, "CIFAR-10 batch '%s': record %d has label %d (expected 0..9)",
                                 paths[i], r, rec[0]);
                break;
            }
            ds->labels[idx] = rec[0];
            memcpy(ds->u8 + (size_t)idx * 3072, rec + 1, 3072);
            idx++;
        }
        if (st == CLG_OK && ferror(f))
            st = clg_err_set(err, CLG_ERR_IO, "read error on CIFAR-10 batch '%s'", paths[i]);
        fclose(f);
    }
    free(rec);
    if (st == CLG_OK && idx != ds->n)
        st = clg_err_set(err, CLG_ERR_FORMAT, "CIFAR-10: read %d records, expected %d (files changed?)", idx, ds->n);
    if (st != CLG_OK) {
        clg_dataset_free(ds);
        return st;
    }
    clg_ds_set_str(ds->name, sizeof ds->name, "cifar10");
    clg_ds_set_str(ds->source, sizeof ds->source, paths[0]);
    *out = ds;
    return CLG_OK;
}
