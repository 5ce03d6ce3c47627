/* ONNX import and export.
 *
 * Import (onnx_import.c) turns an ONNX ModelProto into what a clgrad model
 * file would hold (the model text, src/model/network.h) plus a weight set in
 * checkpoint form (tensors "<layer>.<param>" and the input normalization as
 * norm.* metadata, src/io/checkpoint.h), so an imported model is built,
 * trained, checkpointed and evaluated like a native one. Export
 * (onnx_export.c) writes a model's layers, weights and input normalization
 * as an ONNX graph (opset 13; 17 with sequence layers).
 *
 * Without protobuf-c (-Donnx=disabled) onnx_none.c refuses both; detection
 * (clg_onnx_sniff) and the model-file reader (onnx_model.c) always exist. */
#ifndef CLG_ONNX_ONNX_H
#define CLG_ONNX_ONNX_H

#include "io/checkpoint.h"
#include "io/dataset.h"

#define CLG_ONNX_MAX_BYTES ((size_t)1 << 30) /* larger files are refused before parsing */
#define CLG_ONNX_MAX_DEPTH 24                /* nesting of messages (ModelProto = 1) */
#define CLG_ONNX_MAX_MESSAGES (1u << 20)     /* messages in one file */
#define CLG_ONNX_MAX_NODES 65536
#define CLG_ONNX_MAX_TENSOR ((size_t)1 << 28) /* elements of one tensor */
#define CLG_ONNX_OPSET_MIN 7
#define CLG_ONNX_OPSET_MAX 21
#define CLG_ONNX_EXPORT_OPSET 13     /* CNNs */
#define CLG_ONNX_EXPORT_OPSET_SEQ 17 /* networks with sequence layers (LayerNormalization) */

/* 1 when data[0..len) parses as the top level of an ONNX ModelProto (every
 * field a ModelProto field with its wire type, lengths in bounds, a graph
 * present). Linear, no allocation; a clgrad model text never passes. */
CLG_INTERNAL int clg_onnx_sniff(const void *data, size_t len);
/* Reads a protobuf base-128 varint at *p (before end) into v and moves *p past it; 0 where it is cut short or
 * longer than 64 bits. */
CLG_INTERNAL int clg_onnx_varint(const uint8_t **p, const uint8_t *end, uint64_t *v);

/* data[0..len) -> model text (malloc'd) + weights. source names the file in
 * messages. Unsupported nodes are refused naming the node, op type and
 * opset; external tensor data is refused. */
CLG_INTERNAL clg_status clg_onnx_import(clg_err *err, const void *data, size_t len, const char *source, char **text,
                                        clg_ckpt **weights);

/* Reads a model file: ONNX (by content) -> text + weights, else the model
 * text itself (NUL bytes refused) and *weights = NULL. */
CLG_INTERNAL clg_status clg_model_file_read(clg_err *err, const char *path, char **text, clg_ckpt **weights);

#endif
