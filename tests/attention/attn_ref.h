/* Double-precision reference of multi-head causal/full attention for the
 * attention tests: qkv (N, T, 3C) rows [q | k | v], heads side by side. */
#ifndef CLG_TEST_ATTN_REF_H
#define CLG_TEST_ATTN_REF_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int N, T, H, d, causal;
} acase;

/* Reference: o, lse; with g (dO) also dqkv (N, T, 3C) as the layout of qkv. */
static inline void ref_attention(const acase *c, const double *qkv, const double *g, double *o, double *lse, double *dqkv)
{
    int T = c->T, C = c->H * c->d, ld = 3 * C;
    double scale = 1.0 / sqrt((double)c->d);
    double *p = malloc(sizeof(double) * T), *dp = malloc(sizeof(double) * T);
    if (dqkv)
        memset(dqkv, 0, sizeof(double) * c->N * T * ld);
    for (int n = 0; n < c->N; n++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < T; i++) {
                const double *q = qkv + ((size_t)n * T + i) * ld + h * c->d;
                int jn = c->causal ? i + 1 : T;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j < jn; j++) {
                    const double *k = qkv + ((size_t)n * T + j) * ld + C + h * c->d;
                    double s = 0;
                    for (int e = 0; e < c->d; e++)
                        s += q[e] * k[e];
                    p[j] = s * scale;
                    m = fmax(m, p[j]);
                }
                for (int j = 0; j < jn; j++)
                    sum += (p[j] = exp(p[j] - m));
                lse[((size_t)n * c->H + h) * T + i] = m + log(sum);
                double *oi = o + ((size_t)n * T + i) * C + h * c->d;
                for (int e = 0; e < c->d; e++)
                    oi[e] = 0;
                for (int j = 0; j < jn; j++) {
                    p[j] /= sum;
                    const double *v = qkv + ((size_t)n * T + j) * ld + 2 * C + h * c->d;
                    for (int e = 0; e < c->d; e++)
                        oi[e] += p[j] * v[e];
                }
                if (!dqkv)
                    continue;
                const double *gi = g + ((size_t)n * T + i) * C + h * c->d;
                double D = 0;
                for (int j = 0; j < jn; j++) {
                    const double *v = qkv + ((size_t)n * T + j) * ld + 2 * C + h * c->d;
                    dp[j] = 0;
                    for (int e = 0; e < c->d; e++)
                        dp[j] += gi[e] * v[e];
                    D += p[j] * dp[j];
                }
                double *dq = dqkv + ((size_t)n * T + i) * ld + h * c->d;
                for (int j = 0; j < jn; j++) {
                    double ds = p[j] * (dp[j] - D) * scale;
                    const double *k = qkv + ((size_t)n * T + j) * ld + C + h * c->d;
                    double *dk = dqkv + ((size_t)n * T + j) * ld + C + h * c->d;
                    double *dv = dqkv + ((size_t)n * T + j) * ld + 2 * C + h * c->d;
                    for (int e = 0; e < c->d; e++) {
                        dq[e] += ds * k[e];
                        dk[e] += ds * q[e];
                        dv[e] += p[j] * gi[e];
                    }
                }
            }
    free(p);
    free(dp);
}

#endif
