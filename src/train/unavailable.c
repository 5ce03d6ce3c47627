/* Built instead of the trainer while the layer modules are not in the
 * build yet: every model/training entry point reports that clearly. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#define NOT_BUILT(err) clg_err_set((err), CLG_ERR_UNSUPPORTED, "models and training are not built into this library yet")

void clg_model_params_init_size(clg_model_params *p, size_t size) { memset(p, 0, size); p->size = size; }
clg_status clg_model_create_file(clg_ctx *ctx, const char *path, const clg_model_params *p, clg_model **out)
{
    (void)ctx, (void)path, (void)p;
    if (out)
        *out = NULL;
    return NOT_BUILT(NULL);
}
clg_status clg_model_create_string(clg_ctx *ctx, const char *text, const char *source_name, const clg_model_params *p,
                                   clg_model **out)
{
    (void)ctx, (void)text, (void)source_name, (void)p;
    if (out)
        *out = NULL;
    return NOT_BUILT(NULL);
}
void clg_model_destroy(clg_model *m) { (void)m; }
void clg_model_shape(const clg_model *m, int *c, int *h, int *w, int *classes, int *batch)
{
    (void)m, (void)c, (void)h, (void)w, (void)classes, (void)batch;
}
size_t clg_model_summary(const clg_model *m, char *buf, size_t cap)
{
    (void)m;
    if (buf && cap)
        buf[0] = 0;
    return 0;
}
clg_status clg_model_load_weights(clg_model *m, const char *path) { (void)m, (void)path; return NOT_BUILT(NULL); }
clg_status clg_model_save_weights(clg_model *m, const char *path) { (void)m, (void)path; return NOT_BUILT(NULL); }
clg_status clg_model_predict(clg_model *m, const float *x, int n, float *probs)
{
    (void)m, (void)x, (void)n, (void)probs;
    return NOT_BUILT(NULL);
}
clg_status clg_model_train_step(clg_model *m, const float *x, const int32_t *labels, int n)
{
    (void)m, (void)x, (void)labels, (void)n;
    return NOT_BUILT(NULL);
}
clg_status clg_model_metrics_size(const clg_model *m, clg_metrics *out, size_t size) { (void)m, (void)out, (void)size; return NOT_BUILT(NULL); }
void clg_train_params_init_size(clg_train_params *p, size_t size) { memset(p, 0, size); p->size = size; }
clg_status clg_train_run_size(clg_ctx *ctx, const clg_train_params *p, clg_train_report *out, size_t size)
{
    (void)p, (void)out;
    return NOT_BUILT(ctx ? &ctx->err : NULL);
}
clg_status clg_model_evaluate_size(clg_model *m, const char *data, long limit, clg_eval_report *out, size_t size)
{
    (void)m, (void)data, (void)limit, (void)out;
    return NOT_BUILT(NULL);
}
void clg_eval_report_free(clg_eval_report *r) { (void)r; }
clg_status clg_model_predict_file(clg_model *m, const char *path, float **probs, int *n)
{
    (void)m, (void)path, (void)probs, (void)n;
    return NOT_BUILT(NULL);
}
void clg_free(void *p) { free(p); }
void clg_bench_train_params_init_size(clg_bench_train_params *p, size_t size) { memset(p, 0, size); p->size = size; }
clg_status clg_bench_train_size(clg_ctx *ctx, const clg_bench_train_params *p, clg_bench_train_report *out, size_t size)
{
    (void)p, (void)out;
    return NOT_BUILT(ctx ? &ctx->err : NULL);
}
