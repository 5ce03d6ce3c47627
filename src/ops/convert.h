/* Launchers for the precision conversion kernels of --precision fp16
 * (cl/convert.cl): storage is IEEE half, layers compute in fp32. Offsets and
 * counts are in elements, each below 2^31 (checked: CLG_ERR_UNSUPPORTED).
 * x, y: device buffers; "half" buffers hold 2 bytes per element. Every
 * launcher only enqueues on dev->queue; n = 0 enqueues nothing. */
#ifndef CLG_OPS_CONVERT_H
#define CLG_OPS_CONVERT_H

#include "device/device.h"

/* y[yoff + i] = half(x[xoff + i])          x: float, y: half */
CLG_INTERNAL clg_status clg_cvt_f32_to_f16(clg_device *dev, cl_mem x, size_t xoff, cl_mem y, size_t yoff, size_t n);
/* y[yoff + i] = half(x[xoff + i]), x[xoff + i] = float(y[yoff + i]): stored
 * in half and kept in fp32 with exactly the stored values. x: float, y: half */
CLG_INTERNAL clg_status clg_cvt_f32_to_f16_keep(clg_device *dev, cl_mem x, size_t xoff, cl_mem y, size_t yoff,
                                                size_t n);
/* y[yoff + i] = float(x[xoff + i])         x: half, y: float */
CLG_INTERNAL clg_status clg_cvt_f16_to_f32(clg_device *dev, cl_mem x, size_t xoff, cl_mem y, size_t yoff, size_t n);
/* y[yoff + i] = float(half(x[xoff + i]))   x, y: float (x == y allowed) */
CLG_INTERNAL clg_status clg_cvt_f32_round_f16(clg_device *dev, cl_mem x, size_t xoff, cl_mem y, size_t yoff, size_t n);
/* y[yoff + i] = half(float(y[yoff + i]) + x[xoff + i])   y: half, x: float
 * (gradient summation: the sum formed in fp32, rounded once) */
CLG_INTERNAL clg_status clg_cvt_f16_add_f32(clg_device *dev, cl_mem y, size_t yoff, cl_mem x, size_t xoff, size_t n);
/* Weights after an update, i < n: w16[i] = half(master[i]) and
 * w32[i] = float(w16[i]) (what the layers read).
 * master, w32: float; w16: half; all from element 0. */
CLG_INTERNAL clg_status clg_cvt_round_weights(clg_device *dev, cl_mem master, cl_mem w16, cl_mem w32, size_t n);

#endif
