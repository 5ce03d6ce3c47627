/* Shipped models by name (clg_model_find): "lenet5" -> .../share/clgrad/models/lenet5.cfg.
 * Looked up, in order, in $CLGRAD_MODEL_DIR, next to the loaded library
 * (LIBDIR/<relative path to DATADIR>/clgrad/models, so an installed tree
 * can be moved or staged with DESTDIR), the configured install directory,
 * and the source tree's models/ (a build run uninstalled). */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clg_config_paths.h"
#include "core/core.h"
#include "core/options.h"

static int is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Candidate directories, in order; returns how many (each cap bytes). */
static int model_dirs(char dirs[][1024], int max)
{
    int n = 0;
    clg_opts *o = malloc(sizeof *o); /* model_dir from the environment: clg_model_find has no context */
    if (o) {
        clg_opts_init(o);
        if (clg_opts_read_env_one(o, CLG_OPT_ID_model_dir, NULL) == CLG_OK && o->model_dir[0] && n < max)
            snprintf(dirs[n++], 1024, "%s", o->model_dir);
        free(o);
    }
    Dl_info info;
    /* the module holding this code: libclgrad.so in LIBDIR, or the clgrad
     * program (linked statically) in BINDIR */
    static const char self = 0; /* an address inside this module */
    if (dladdr(&self, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
        char mod[1024];
        snprintf(mod, sizeof mod, "%s", info.dli_fname);
        *strrchr(mod, '/') = 0;
        const char *rel[] = {CLG_LIB_TO_DATA, CLG_BIN_TO_DATA};
        for (int i = 0; i < 2 && n < max; i++) {
            char cand[1100], *real;
            int w = snprintf(cand, sizeof cand, "%s/%s/clgrad/models", mod, rel[i]);
            if (w > 0 && (size_t)w < sizeof cand && (real = realpath(cand, NULL)) != NULL) {
                if (strlen(real) < 1024 && is_dir(real))
                    snprintf(dirs[n++], 1024, "%s", real);
                free(real);
            }
        }
    }
    if (n < max)
        snprintf(dirs[n++], 1024, "%s", CLG_MODELS_DIR);
    if (n < max)
        snprintf(dirs[n++], 1024, "%s", CLG_SOURCE_MODELS_DIR);
    return n;
}

clg_status clg_model_find(const char *name, char *out, size_t cap)
{
    if (!name || !*name || !out || cap == 0)
        return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_model_find: name and out are required");
    out[0] = 0;
    if (is_file(name) || strchr(name, '/')) {
        if (!is_file(name))
            return clg_err_set(NULL, CLG_ERR_NOT_FOUND, "model file '%s' not found", name);
        if (strlen(name) >= cap)
            return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_model_find: path longer than %zu bytes", cap - 1);
        snprintf(out, cap, "%s", name);
        return CLG_OK;
    }
    char dirs[5][1024];
    int nd = model_dirs(dirs, 5);
    const char *suffix[] = {"", ".cfg", ".onnx"};
    for (int d = 0; d < nd; d++)
        for (int s = 0; s < 3; s++) {
            char p[2100];
            int w = snprintf(p, sizeof p, "%s/%s%s", dirs[d], name, suffix[s]);
            if (w <= 0 || (size_t)w >= sizeof p || !is_file(p))
                continue;
            if (strlen(p) >= cap)
                return clg_err_set(NULL, CLG_ERR_INVALID_ARG, "clg_model_find: path longer than %zu bytes", cap - 1);
            snprintf(out, cap, "%s", p);
            return CLG_OK;
        }
    /* not found: name the places and what they hold */
    char where[5500] = "", have[1024] = "";
    for (int d = 0; d < nd; d++) {
        size_t l = strlen(where);
        snprintf(where + l, sizeof where - l, "%s%s", d ? ", " : "", dirs[d]);
        DIR *dir = have[0] ? NULL : opendir(dirs[d]);
        if (!dir)
            continue;
        for (struct dirent *de; (de = readdir(dir)) != NULL;) {
            size_t nl = strlen(de->d_name);
            if (nl > 4 && strcmp(de->d_name + nl - 4, ".cfg") == 0) {
                size_t hl = strlen(have);
                snprintf(have + hl, sizeof have - hl, "%s%.*s", hl ? ", " : "", (int)(nl - 4), de->d_name);
            }
        }
        closedir(dir);
    }
    return clg_err_set(NULL, CLG_ERR_NOT_FOUND, "model '%s' is not a file, nor a shipped model in %s%s%s%s", name, where,
                       have[0] ? " (shipped: " : "", have, have[0] ? ")" : "");
}
