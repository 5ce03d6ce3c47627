/* Built without ONNX support (-Donnx=disabled, or protoc-c, libprotobuf-c or
 * onnx.proto missing): import and export say so. */
#include "onnx/onnx.h"
#include "onnx/export.h"

clg_status clg_onnx_import(clg_err *err, const void *data, size_t len, const char *source, char **text,
                           clg_ckpt **weights)
{
    (void)data;
    (void)len;
    *text = NULL;
    *weights = NULL;
    return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                       "%s is an ONNX model, but this clgrad was built without ONNX support (needs protobuf-c and "
                       "libonnx-dev at build time, meson option -Donnx)",
                       source ? source : "<onnx>");
}

clg_status clg_onnx_export(clg_err *err, const clg_net *net, const clg_replica *rep, const clg_ds_norm *norm,
                           const char *path)
{
    (void)net;
    (void)rep;
    (void)norm;
    return clg_err_set(err, CLG_ERR_UNSUPPORTED,
                       "cannot write %s: this clgrad was built without ONNX support (needs protobuf-c and libonnx-dev "
                       "at build time, meson option -Donnx)",
                       path);
}

clg_status clg_onnx_export_stages(clg_err *err, const clg_net *net, const clg_replica *const *reps,
                                  const clg_ds_norm *norm, const char *path)
{
    (void)reps;
    return clg_onnx_export(err, net, NULL, norm, path);
}
