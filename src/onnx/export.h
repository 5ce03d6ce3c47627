/* ONNX export of a network with one replica's weights (onnx_export.c;
 * onnx_none.c without protobuf-c). */
#ifndef CLG_ONNX_EXPORT_H
#define CLG_ONNX_EXPORT_H

#include "io/dataset.h"
#include "model/network.h"

/* Writes net's layers (options read back from net's model text), rep's
 * weights (their authoritative fp32 values, read on rep's device; rep must
 * be a replica of net) and, when norm is not NULL, the input normalization
 * (Sub / Div nodes before the first layer) as an ONNX model (opset
 * CLG_ONNX_EXPORT_OPSET, CLG_ONNX_EXPORT_OPSET_SEQ with sequence layers;
 * input "input" of shape (N, C, H, W) with a symbolic N, output "output"),
 * atomically. Layers without an ONNX equivalent (mse) are refused. Failures are described in err. */
/* clg_onnx_export with each layer's weights read from reps[layer] (a
 * pipeline's stage replicas: no whole network needed). */
CLG_INTERNAL clg_status clg_onnx_export_stages(clg_err *err, const clg_net *net, const clg_replica *const *reps,
                                               const clg_ds_norm *norm, const char *path);
CLG_INTERNAL clg_status clg_onnx_export(clg_err *err, const clg_net *net, const clg_replica *rep,
                                        const clg_ds_norm *norm, const char *path);

#endif
