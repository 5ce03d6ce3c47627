/* ONNX export of a model (onnx_export.c; onnx_none.c without protobuf-c). */
#ifndef CLG_ONNX_EXPORT_H
#define CLG_ONNX_EXPORT_H

#include "train/session.h"

/* Writes m's layers, weights (lane 0's authoritative fp32 values) and input
 * normalization (Sub / Div nodes before the first layer) as an ONNX model
 * (opset CLG_ONNX_EXPORT_OPSET, input "input" of shape (N, C, H, W) with a
 * symbolic N, output "output"), atomically. Layers without an ONNX
 * equivalent (mse) are refused. */
CLG_INTERNAL clg_status clg_onnx_export(clg_model *m, const char *path);

#endif
