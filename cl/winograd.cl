// Winograd convolution for 3x3 filters, stride 1, separate-transform design:
// filter / input transforms here, the alpha*alpha transform-domain products
// run as one batched GEMM (src/ops/gemm.h), then the output transform adds
// bias and ReLU. Build option -D WM=2 selects F(2x2,3x3) (alpha 4),
// -D WM=4 selects F(4x4,3x3) (alpha 6). The backward-filter kernels always
// use F(3x3,2x2) (the transposed F(2,3) algorithm: dy tiles of 2x2, 3x3 result).
//
// Transform-domain layouts (xi = a*WA + b indexes the alpha x alpha point):
//   U[xi][ko][ci]  filters       V[xi][c][t]  input tiles      M[xi][k][t] products
// with t = (b*TH + th)*TW + tw over the images of one batch chunk.

// Quotients unsigned, remainders signed: see the note in im2col.cl.
#define UDIV(a, b) ((int)((uint)(a) / (uint)(b)))

#ifndef WM
#define WM 2
#endif
#define WR 3
#define WA (WM + WR - 1)

// Transform matrices as function-local constants (a program-scope
// __constant table reads as uninitialized memory under oclgrind).
#if WM == 2
#define WINO_BT const float BT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}}
#define WINO_G const float GM[4][3] = {{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0, 0, 1}}
#define WINO_AT const float AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}}
#elif WM == 4
#define WINO_BT                                                                                        \
    const float BT[6][6] = {{4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},        \
                            {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}}
#define WINO_G                                                                                         \
    const float GM[6][3] = {{1.0f / 4, 0, 0},                                                          \
                            {-1.0f / 6, -1.0f / 6, -1.0f / 6},                                         \
                            {-1.0f / 6, 1.0f / 6, -1.0f / 6},                                          \
                            {1.0f / 24, 1.0f / 12, 1.0f / 6},                                          \
                            {1.0f / 24, -1.0f / 12, 1.0f / 6},                                         \
                            {0, 0, 1}}
#define WINO_AT                                                                                        \
    const float AT[4][6] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}}
#else
#error "WM must be 2 or 4"
#endif

// F(2,3) matrices, used transposed by the backward-filter kernels.
#define F23_GM const float F23_G[4][3] = {{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0, 0, 1}}
#define F23_ATM const float F23_AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}}

// U = G g G^T for every (ko, ci): gws = (Cin, Kout). With flip the filter is
// the rotated transpose used by backward-data: g = rot180(w[ci][ko]) where w
// is stored (Cin, Kout, 3, 3); otherwise g = w[ko][ci] with w (Kout, Cin, 3, 3).
__kernel void wino_filter(__global const float *w, const int offw, const int Kout, const int Cin, const int flip,
                          __global float *U, const int offU)
{
    WINO_G;
    const int ci = get_global_id(0);
    const int ko = get_global_id(1);
    if (ci >= Cin || ko >= Kout)
        return;
    float g[3][3];
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < 3; s++)
            g[r][s] = flip ? w[offw + (ci * Kout + ko) * 9 + (2 - r) * 3 + (2 - s)]
                           : w[offw + (ko * Cin + ci) * 9 + r * 3 + s];
    float t[WA][3];
    for (int a = 0; a < WA; a++)
        for (int s = 0; s < 3; s++)
            t[a][s] = GM[a][0] * g[0][s] + GM[a][1] * g[1][s] + GM[a][2] * g[2][s];
    for (int a = 0; a < WA; a++)
        for (int b = 0; b < WA; b++)
            U[offU + ((a * WA + b) * Kout + ko) * Cin + ci] = t[a][0] * GM[b][0] + t[a][1] * GM[b][1] + t[a][2] * GM[b][2];
}

// V = B^T d B for every input tile and channel: gws = (ntiles, C). Tile
// (b, th, tw) reads the WA x WA patch at (th*WM - pad_h, tw*WM - pad_w) of
// image b (zero outside).
__kernel void wino_input(__global const float *x, const int offx, const int C, const int H, const int W,
                         const int pad_h, const int pad_w, const int TH, const int TW, const int ntiles,
                         __global float *V, const int ldv)
{
    WINO_BT;
    const int t = get_global_id(0);
    const int c = get_global_id(1);
    if (t >= ntiles || c >= C)
        return;
    const int tw = t % TW, th = UDIV(t, TW) % TH, b = UDIV(t, TH * TW);
    const int h0 = th * WM - pad_h, w0 = tw * WM - pad_w;
    __global const float *xc = x + offx + (b * C + c) * H * W;
    float d[WA][WA];
    for (int i = 0; i < WA; i++)
        for (int j = 0; j < WA; j++) {
            const int h = h0 + i, ww = w0 + j;
            d[i][j] = 0.0f;
            if (h >= 0 && h < H && ww >= 0 && ww < W)
                d[i][j] = xc[h * W + ww];
        }
    float tmp[WA][WA];
    for (int a = 0; a < WA; a++)
        for (int j = 0; j < WA; j++) {
            float acc = 0.0f;
            for (int i = 0; i < WA; i++)
                acc += BT[a][i] * d[i][j];
            tmp[a][j] = acc;
        }
    for (int a = 0; a < WA; a++)
        for (int b2 = 0; b2 < WA; b2++) {
            float acc = 0.0f;
            for (int j = 0; j < WA; j++)
                acc += tmp[a][j] * BT[b2][j];
            V[((a * WA + b2) * C + c) * ldv + t] = acc;
        }
}

// Y = A^T M A (+ bias, ReLU) written to the WM x WM output tile: gws = (ntiles, K).
__kernel void wino_output(__global const float *M, const int ldm, const int K, const int P, const int Q,
                          const int TH, const int TW, const int ntiles, __global const float *bias, const int offb,
                          const int has_bias, const int relu, __global float *y, const int offy)
{
    WINO_AT;
    const int t = get_global_id(0);
    const int k = get_global_id(1);
    if (t >= ntiles || k >= K)
        return;
    const int tw = t % TW, th = UDIV(t, TW) % TH, b = UDIV(t, TH * TW);
    float m[WA][WA];
    for (int a = 0; a < WA; a++)
        for (int c = 0; c < WA; c++)
            m[a][c] = M[((a * WA + c) * K + k) * ldm + t];
    float tmp[WM][WA];
    for (int i = 0; i < WM; i++)
        for (int c = 0; c < WA; c++) {
            float acc = 0.0f;
            for (int a = 0; a < WA; a++)
                acc += AT[i][a] * m[a][c];
            tmp[i][c] = acc;
        }
    const float bv = has_bias ? bias[offb + k] : 0.0f;
    __global float *yk = y + offy + (b * K + k) * P * Q;
    for (int i = 0; i < WM; i++) {
        const int p = th * WM + i;
        if (p >= P)
            continue;
        for (int j = 0; j < WM; j++) {
            const int q = tw * WM + j;
            if (q >= Q)
                continue;
            float acc = bv;
            for (int c = 0; c < WA; c++)
                acc += tmp[i][c] * AT[j][c];
            yk[p * Q + q] = relu ? fmax(acc, 0.0f) : acc;
        }
    }
}

// Backward filter, step 1: E = A e A^T for every 2x2 tile e of dy (zero past
// the edge): gws = (ntiles, K); Ud[xi][k][t].
__kernel void wino_bf_dy(__global const float *dy, const int offdy, const int K, const int P, const int Q,
                         const int TH, const int TW, const int ntiles, __global float *Ud, const int ldu)
{
    F23_ATM;
    const int t = get_global_id(0);
    const int k = get_global_id(1);
    if (t >= ntiles || k >= K)
        return;
    const int tw = t % TW, th = UDIV(t, TW) % TH, b = UDIV(t, TH * TW);
    __global const float *dk = dy + offdy + (b * K + k) * P * Q;
    float e[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            const int p = th * 2 + i, q = tw * 2 + j;
            e[i][j] = 0.0f;
            if (p < P && q < Q)
                e[i][j] = dk[p * Q + q];
        }
    for (int a = 0; a < 4; a++) {
        const float r0 = F23_AT[0][a] * e[0][0] + F23_AT[1][a] * e[1][0];
        const float r1 = F23_AT[0][a] * e[0][1] + F23_AT[1][a] * e[1][1];
        for (int b2 = 0; b2 < 4; b2++)
            Ud[((a * 4 + b2) * K + k) * ldu + t] = r0 * F23_AT[0][b2] + r1 * F23_AT[1][b2];
    }
}

// Backward filter, step 3: dw = beta*dw + G^T Mf G (3x3) from the summed
// products Mf[xi][k][c] (K x C per xi): gws = (C, K).
__kernel void wino_bf_out(__global const float *Mf, const int K, const int C, const float beta,
                          __global float *dw, const int offdw)
{
    F23_GM;
    const int c = get_global_id(0);
    const int k = get_global_id(1);
    if (c >= C || k >= K)
        return;
    float m[4][4];
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            m[a][b] = Mf[((a * 4 + b) * K + k) * C + c];
    float tmp[3][4];
    for (int r = 0; r < 3; r++)
        for (int b = 0; b < 4; b++)
            tmp[r][b] = F23_G[0][r] * m[0][b] + F23_G[1][r] * m[1][b] + F23_G[2][r] * m[2][b] + F23_G[3][r] * m[3][b];
    __global float *d = dw + offdw + (k * C + c) * 9;
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < 3; s++) {
            const float v = tmp[r][0] * F23_G[0][s] + tmp[r][1] * F23_G[1][s] + tmp[r][2] * F23_G[2][s] +
                            tmp[r][3] * F23_G[3][s];
            if (beta == 0.0f)
                d[r * 3 + s] = v;
            else
                d[r * 3 + s] = fma(beta, d[r * 3 + s], v);
        }
}
