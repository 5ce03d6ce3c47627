/* Double-precision convolution references: see conv_ref.h. */
#include "conv_ref.h"

#include <stdio.h>
#include <string.h>

size_t cr_nx(const clg_conv_shape *s) { return (size_t)s->N * s->C * s->H * s->W; }
size_t cr_nw(const clg_conv_shape *s) { return (size_t)s->K * (s->C / s->groups) * s->R * s->S; }
size_t cr_ny(const clg_conv_shape *s) { return (size_t)s->N * s->K * clg_conv_out_h(s) * clg_conv_out_w(s); }

/* Calls f(n, k, c, p, q, h, w, r, s) for every tap that reads inside the image. */
#define FOR_TAPS(s, BODY)                                                                              \
    do {                                                                                               \
        int P_ = clg_conv_out_h(s), Q_ = clg_conv_out_w(s), Cg_ = (s)->C / (s)->groups,                \
            Kg_ = (s)->K / (s)->groups;                                                                \
        for (int n = 0; n < (s)->N; n++)                                                               \
            for (int k = 0; k < (s)->K; k++)                                                           \
                for (int p = 0; p < P_; p++)                                                           \
                    for (int q = 0; q < Q_; q++)                                                       \
                        for (int cc = 0; cc < Cg_; cc++)                                               \
                            for (int r = 0; r < (s)->R; r++)                                           \
                                for (int ss = 0; ss < (s)->S; ss++) {                                  \
                                    int c = (k / Kg_) * Cg_ + cc;                                      \
                                    int h = p * (s)->stride_h - (s)->pad_h + r * (s)->dil_h;           \
                                    int w = q * (s)->stride_w - (s)->pad_w + ss * (s)->dil_w;          \
                                    if (h < 0 || h >= (s)->H || w < 0 || w >= (s)->W)                  \
                                        continue;                                                      \
                                    size_t ix = (((size_t)n * (s)->C + c) * (s)->H + h) * (s)->W + w;  \
                                    size_t iw = (((size_t)k * Cg_ + cc) * (s)->R + r) * (s)->S + ss;   \
                                    size_t iy = (((size_t)n * (s)->K + k) * P_ + p) * Q_ + q;          \
                                    BODY;                                                              \
                                }                                                                      \
    } while (0)

void cr_fwd(const clg_conv_shape *s, const float *x, const float *wt, const float *bias, int relu, double *y)
{
    size_t ny = cr_ny(s), PQ = (size_t)clg_conv_out_h(s) * clg_conv_out_w(s);
    for (size_t i = 0; i < ny; i++)
        y[i] = bias ? bias[(i / PQ) % (size_t)s->K] : 0.0;
    FOR_TAPS(s, y[iy] += (double)x[ix] * wt[iw]);
    if (relu)
        for (size_t i = 0; i < ny; i++)
            y[i] = y[i] > 0 ? y[i] : 0;
}

void cr_bwd_data(const clg_conv_shape *s, const float *dy, const float *wt, double *dx)
{
    memset(dx, 0, sizeof(double) * cr_nx(s));
    FOR_TAPS(s, dx[ix] += (double)dy[iy] * wt[iw]);
}

void cr_bwd_filter(const clg_conv_shape *s, const float *x, const float *dy, float beta, const float *dw0,
                           double *dw, double *db, const float *db0)
{
    size_t nw = cr_nw(s), PQ = (size_t)clg_conv_out_h(s) * clg_conv_out_w(s);
    for (size_t i = 0; i < nw; i++)
        dw[i] = beta != 0 ? (double)beta * dw0[i] : 0.0;
    FOR_TAPS(s, dw[iw] += (double)x[ix] * dy[iy]);
    for (int k = 0; k < s->K; k++) {
        double acc = beta != 0 ? (double)beta * db0[k] : 0.0;
        for (int n = 0; n < s->N; n++)
            for (size_t i = 0; i < PQ; i++)
                acc += dy[((size_t)n * s->K + k) * PQ + i];
        db[k] = acc;
    }
}

void cr_shape_str(const clg_conv_shape *s, char *b, size_t n)
{
    snprintf(b, n, "N%d C%d H%d W%d K%d R%d S%d pad %d,%d stride %d,%d dil %d,%d groups %d", s->N, s->C, s->H, s->W,
             s->K, s->R, s->S, s->pad_h, s->pad_w, s->stride_h, s->stride_w, s->dil_h, s->dil_w, s->groups);
}
