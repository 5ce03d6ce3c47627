/* Double-precision convolution references by the definition (any shape:
 * stride, padding, dilation, groups) and shape helpers, shared by the conv
 * test programs. */
#ifndef CLG_TESTS_CONV_REF_H
#define CLG_TESTS_CONV_REF_H

#include <stddef.h>

#include "ops/conv.h"

/* Elements of x (N, C, H, W), w (K, C/groups, R, S) and y (N, K, P, Q). */
size_t cr_nx(const clg_conv_shape *s);
size_t cr_nw(const clg_conv_shape *s);
size_t cr_ny(const clg_conv_shape *s);
/* y = act(conv(x, w) + bias) (bias may be NULL; relu: max(0, .)). */
void cr_fwd(const clg_conv_shape *s, const float *x, const float *w, const float *bias, int relu, double *y);
/* dx = gradient of the convolution w.r.t. x for output gradient dy. */
void cr_bwd_data(const clg_conv_shape *s, const float *dy, const float *w, double *dx);
/* dw = beta*dw0 + gradient w.r.t. w; db = beta*db0 + sum of dy per channel
 * (dw0, db0 read only when beta != 0). */
void cr_bwd_filter(const clg_conv_shape *s, const float *x, const float *dy, float beta, const float *dw0, double *dw,
                   double *db, const float *db0);
/* "N.. C.. H.. W.. K.. R.. S.. pad .. stride .. dil .. groups .." */
void cr_shape_str(const clg_conv_shape *s, char *b, size_t n);

#endif
