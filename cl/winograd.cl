// Winograd convolution for 3x3 filters, stride 1, separate-transform design:
// filter / input transforms here, the alpha*alpha transform-domain products
// run as one batched GEMM (src/ops/gemm.h), then the output transform adds
// bias and ReLU. Build option -D WM=2 selects F(2x2,3x3) (alpha 4),
// -D WM=4 selects F(4x4,3x3) (alpha 6). The backward-filter kernels use the
// transposed algorithm F(3x3, WMxWM): dy in WM x WM tiles, x in the matching
// alpha x alpha patches, 3x3 result.
//
// Transform-domain layouts (xi = a*WA + b indexes the alpha x alpha point):
//   U[xi][ko][ci]  filters       V[xi][c][t]  input tiles      M[xi][k][t] products
// with t = (b*TH + th)*TW + tw over the images of one batch chunk.
// U and V are written in the GEMM's panel layout (src/ops/gemm.h,
// clg_gemm_pack_layout) so the product runs on them without packing:
//   U: point xi at xi*sxU, (ko, ci) at ((ko/PA)*Kp + ci)*PA + ko%PA
//   V: point xi at xi*sxV, (c, t)   at ((t/PB)*Kp + c)*PB + t%PB
// with zeros in the padding (ko >= Kout, ci/c >= C up to Kp, t >= T up to
// the panel end). PA = 1, Kp = Cin gives the plain row-major U[xi][ko][ci];
// PB = ldv (one panel), Kp = C the plain V[xi][c][t].

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

// The backward-filter kernels use the same matrices transposed: F(3x3, WMxWM).

// U = G g G^T for every (ko, ci): gws = (>= Kp, >= Mp), Mp = Kout rounded
// up to PA; zeros in the padding. With flip the filter is the rotated
// transpose used by backward-data: g = rot180(w[ci][ko]) where w is stored
// (Cin, Kout, 3, 3); otherwise g = w[ko][ci] with w (Kout, Cin, 3, 3).
__kernel void wino_filter(__global const float *w, const int offw, const int Kout, const int Cin, const int flip,
                          __global float *U, const int offU, const int PA, const int Kp, const int Mp,
                          const int sxU)
{
    WINO_G;
    const int ci = get_global_id(0);
    const int ko = get_global_id(1);
    if (ci >= Kp || ko >= Mp)
        return;
    const int pa = ko / PA;
    const int ia = ko - pa * PA; // (not %: its expansion upsets oclgrind)
    __global float *u = U + offU + (pa * Kp + ci) * PA + ia;
    if (ci >= Cin || ko >= Kout) {
        for (int xi = 0; xi < WA * WA; xi++)
            u[xi * sxU] = 0.0f;
        return;
    }
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
            u[(a * WA + b) * sxU] = t[a][0] * GM[b][0] + t[a][1] * GM[b][1] + t[a][2] * GM[b][2];
}

// a / b and a % b for 0 <= a < 2^24, 0 < b, without an integer division
// (vectorises on CPUs): float estimate, then one correction step.
#define DIVMOD(a, b, inv, q, r)                                                                        \
    do {                                                                                               \
        q = (int)(((float)(a) + 0.5f) * (inv));                                                        \
        r = (a) - q * (b);                                                                             \
        if (r < 0) {                                                                                   \
            q--;                                                                                       \
            r += (b);                                                                                  \
        } else if (r >= (b)) {                                                                         \
            q++;                                                                                       \
            r -= (b);                                                                                  \
        }                                                                                              \
    } while (0)

// The tile kernels below give each work-item VL (8, or 4 with -D VL=4 for
// narrow images) consecutive tiles of one tile row (explicit vector
// arithmetic, one lane per tile), so they run as
// SIMD code on CPU devices without relying on implicit vectorisation.
// Work-item id0 = th*TWG + g covers tiles tw = g*VL .. g*VL+VL-1 of tile row th,
// TWG = ceil(TW / VL).
#ifndef VL
#define VL 8
#endif
#if VL == 8
#define vecf float8
#define VLOADV vload8
#define VSTOREV vstore8
#define GATHERV GATHER8
#elif VL == 4
#define vecf float4
#define VLOADV vload4
#define VSTOREV vstore4
#define GATHERV GATHER4
#else
#error "VL must be 4 or 8"
#endif
// floats read per input row by the vector path of wino_input
#define WIN_SPAN (VL == 8 ? (WM == 2 ? 18 : 40) : (WM == 2 ? 10 : 20))
#define GATHER8(r, j, st)                                                                              \
    (float8)((r)[(j)], (r)[(j) + (st)], (r)[(j) + 2 * (st)], (r)[(j) + 3 * (st)], (r)[(j) + 4 * (st)],   \
             (r)[(j) + 5 * (st)], (r)[(j) + 6 * (st)], (r)[(j) + 7 * (st)])
#define GATHER4(r, j, st) (float4)((r)[(j)], (r)[(j) + (st)], (r)[(j) + 2 * (st)], (r)[(j) + 3 * (st)])

// 1-D transforms on vector lanes: B^T (input), A^T (output).
#if WM == 2
#define IN1D(o, d0, d1, d2, d3, d4, d5)                                                                \
    do {                                                                                               \
        o[0] = d0 - d2;                                                                                \
        o[1] = d1 + d2;                                                                                \
        o[2] = d2 - d1;                                                                                \
        o[3] = d1 - d3;                                                                                \
    } while (0)
#define OUT1D(o, m0, m1, m2, m3, m4, m5)                                                               \
    do {                                                                                               \
        o[0] = m0 + m1 + m2;                                                                           \
        o[1] = m1 - m2 - m3;                                                                           \
    } while (0)
#else
#define IN1D(o, d0, d1, d2, d3, d4, d5)                                                                \
    do {                                                                                               \
        o[0] = 4.0f * d0 - 5.0f * d2 + d4;                                                             \
        o[1] = d3 + d4 - 4.0f * (d1 + d2);                                                             \
        o[2] = d4 - d3 + 4.0f * (d1 - d2);                                                             \
        o[3] = d4 - d2 + 2.0f * (d3 - d1);                                                             \
        o[4] = d4 - d2 + 2.0f * (d1 - d3);                                                             \
        o[5] = 4.0f * d1 - 5.0f * d3 + d5;                                                             \
    } while (0)
#define OUT1D(o, m0, m1, m2, m3, m4, m5)                                                               \
    do {                                                                                               \
        o[0] = m0 + m1 + m2 + m3 + m4;                                                                 \
        o[1] = (m1 - m2) + 2.0f * (m3 - m4);                                                           \
        o[2] = (m1 + m2) + 4.0f * (m3 + m4);                                                           \
        o[3] = (m1 - m2) + 8.0f * (m3 - m4) + m5;                                                      \
    } while (0)
#endif
// (for WM == 2 the macros drop their last two arguments unexpanded, so
// callers may name elements 4 and 5 of WA-arrays that only exist for WM == 4)

// Stores the first n lanes (n <= VL) of v at p.
static inline void store_lanes(__global float *p, const vecf v, const int n)
{
    if (n >= VL) {
        VSTOREV(v, 0, p);
        return;
    }
    float t[VL];
    VSTOREV(v, 0, t);
    for (int l = 0; l < n; l++)
        p[l] = t[l];
}

// Loads n lanes (n <= VL) from p, zero past n.
static inline vecf load_lanes(__global const float *p, const int n)
{
    if (n >= VL)
        return VLOADV(0, p);
    float t[VL];
    for (int l = 0; l < VL; l++)
        t[l] = l < n ? p[l] : 0.0f;
    return VLOADV(0, t);
}

// Stores lanes 0..n-1 of v (n <= VL) at tiles t0 .. t0+n-1 of a panel
// layout with PB tiles per panel: base points at channel row c of panel 0
// (dst + c*PB), panels are KpPB = Kp*PB floats apart, t0 = p0*PB + j0.
static inline void store_tiles(__global float *base, const vecf v, const int n, const int p0, const int j0,
                               const int PB, const int KpPB)
{
    if (j0 + n <= PB) {
        store_lanes(base + p0 * KpPB + j0, v, n);
        return;
    }
    float t[VL];
    VSTOREV(v, 0, t);
    int p = p0, j = j0;
    for (int l = 0; l < n; l++) {
        base[p * KpPB + j] = t[l];
        if (++j == PB) {
            j = 0;
            p++;
        }
    }
}

// V = B^T d B for every input tile and channel: gws = (>= TH*TWG, >= Kp, images).
// Tile (th, tw) of image b reads the WA x WA patch at (th*WM - pad_h,
// tw*WM - pad_w) (zero outside) and is tile t = b*TH*TW + th*TW + tw of V in
// the panel layout above (T = images*TH*TW tiles; channels C..Kp-1 and the
// last panel past T are written as zeros).
__kernel void wino_input(__global const float *x, const int offx, const int C, const int H, const int W,
                         const int pad_h, const int pad_w, const int TH, const int TW, const int TWG,
                         const float invTWG, __global float *V, const int T, const int PB, const float invPB,
                         const int Kp, const int sxV)
{
    const int id = get_global_id(0);
    const int c0 = get_global_id(1);
    const int b = get_global_id(2);
    if (id >= TH * TWG || c0 >= Kp)
        return;
    const int zero = c0 >= C; // padding channel: transform of zeros
    const int c = zero ? 0 : c0;
    int th, g;
    DIVMOD(id, TWG, invTWG, th, g);
    const int tw0 = g * VL;
    const int h0 = th * WM - pad_h, w0 = tw0 * WM - pad_w;
    __global const float *xc = x + offx + (b * C + c) * H * W;
    vecf t1[WA][WA]; // t1[a][j] = sum_i BT[a][i] d[i][j]
    vecf d[WA][WA];
    const int8 iota8 = (int8)(0, 1, 2, 3, 4, 5, 6, 7);
    for (int i = 0; i < WA; i++) {
        const int h = h0 + i;
        float r[WM * VL + WR - 1];
        if (h < 0 || h >= H || zero) {
            for (int j = 0; j < WA; j++)
                d[i][j] = (vecf)(0.0f);
            continue;
        }
        if (h * W + w0 >= 0 && h * W + w0 + WIN_SPAN <= H * W) {
            // vector loads inside this (b, c) plane; lanes outside the row are masked to 0
            __global const float *xr = xc + h * W + w0;
            // (float8 pieces only: 16-wide vloads/selects trip oclgrind's uninitialized-value tracking)
#define LDM8(off) select((float8)(0.0f), vload8(0, xr + (off)), (w0 + (off) + iota8 >= 0) & (w0 + (off) + iota8 < W))
#if VL == 4 && WM == 2
            const float8 A = LDM8(0), B = LDM8(2);
            d[i][0] = A.even;
            d[i][1] = A.odd;
            d[i][2] = B.even;
            d[i][3] = B.odd;
#elif VL == 4
            const float8 A0 = LDM8(0), A1 = LDM8(8), C0 = LDM8(4), C1 = LDM8(12);
            d[i][0] = (float4)(A0.s04, A1.s04);
            d[i][1] = (float4)(A0.s15, A1.s15);
            d[i][2] = (float4)(A0.s26, A1.s26);
            d[i][3] = (float4)(A0.s37, A1.s37);
            d[i][4] = (float4)(C0.s04, C1.s04);
            d[i][5] = (float4)(C0.s15, C1.s15);
#elif WM == 2
            const float8 A0 = LDM8(0), A1 = LDM8(8), B0 = LDM8(2), B1 = LDM8(10);
            d[i][0] = (float8)(A0.even, A1.even);
            d[i][1] = (float8)(A0.odd, A1.odd);
            d[i][2] = (float8)(B0.even, B1.even);
            d[i][3] = (float8)(B0.odd, B1.odd);
#else
            // (stride-4 lanes gathered from a private copy: shuffling four float8
            // loads into stride-4 lanes crashes oclgrind's uninitialized checker)
            float rr[40];
            for (int u = 0; u < 40; u += 8)
                vstore8(LDM8(u), 0, rr + u);
            for (int j = 0; j < WA; j++)
                d[i][j] = GATHER8(rr, j, 4);
#endif
#undef LDM8
            continue;
        }
        {
            for (int j = 0; j < WM * VL + WR - 1; j++) {
                const int ww = w0 + j;
                r[j] = (h >= 0 && h < H && ww >= 0 && ww < W) ? xc[h * W + ww] : 0.0f;
            }
        }
        for (int j = 0; j < WA; j++)
            d[i][j] = GATHERV(r, j, WM);
    }
    for (int j = 0; j < WA; j++) {
        vecf o[WA];
        IN1D(o, d[0][j], d[1][j], d[2][j], d[3][j], d[4][j], d[5][j]);
        for (int a = 0; a < WA; a++)
            t1[a][j] = o[a];
    }
    const int n = min(VL, TW - tw0);
    const int t0 = b * TH * TW + th * TW + tw0;
    int p0, j0;
    DIVMOD(t0, PB, invPB, p0, j0);
    const int KpPB = Kp * PB;
    __global float *v = V + c0 * PB;
    for (int a = 0; a < WA; a++) {
        vecf o[WA];
        IN1D(o, t1[a][0], t1[a][1], t1[a][2], t1[a][3], t1[a][4], t1[a][5]);
        for (int b2 = 0; b2 < WA; b2++)
            store_tiles(v + (a * WA + b2) * sxV, o[b2], n, p0, j0, PB, KpPB);
    }
    if (t0 + n == T) { // last tile: zero the rest of its panel
        const int pl = (T - 1) / PB, jl = T - pl * PB;
        for (int xi = 0; xi < WA * WA; xi++)
            for (int j = jl; j < PB; j++)
                v[xi * sxV + pl * KpPB + j] = 0.0f;
    }
}

// Y = A^T M A (+ bias, ReLU) written to the WM x WM output tiles:
// gws = (>= TH*TWG, >= K, images); M[(xi*K + k)*ldm + b*TH*TW + t].
__kernel void wino_output(__global const float *M, const int ldm, const int K, const int P, const int Q,
                          const int TH, const int TW, const int TWG, const float invTWG, __global const float *bias,
                          const int offb, const int has_bias, const int relu, __global float *y, const int offy)
{
    const int id = get_global_id(0);
    const int k = get_global_id(1);
    const int b = get_global_id(2);
    if (id >= TH * TWG || k >= K)
        return;
    int th, g;
    DIVMOD(id, TWG, invTWG, th, g);
    const int tw0 = g * VL;
    const int n = TW - tw0;
    __global const float *mp = M + k * ldm + b * TH * TW + th * TW + tw0;
    vecf m[WA][WA];
    for (int a = 0; a < WA; a++)
        for (int c = 0; c < WA; c++)
            m[a][c] = load_lanes(mp + (a * WA + c) * K * ldm, n);
    vecf t1[WM][WA];
    for (int c = 0; c < WA; c++) {
        vecf o[WM];
        OUT1D(o, m[0][c], m[1][c], m[2][c], m[3][c], m[4][c], m[5][c]);
        for (int i = 0; i < WM; i++)
            t1[i][c] = o[i];
    }
    const float bv = has_bias ? bias[offb + k] : 0.0f;
    __global float *yk = y + offy + (b * K + k) * P * Q;
    const int q0 = tw0 * WM;
    for (int i = 0; i < WM; i++) {
        const int p = th * WM + i;
        if (p >= P)
            break;
        vecf o[WM];
        OUT1D(o, t1[i][0], t1[i][1], t1[i][2], t1[i][3], t1[i][4], t1[i][5]);
        float lane[WM][VL];
        for (int j = 0; j < WM; j++) {
            vecf v = o[j] + bv;
            if (relu)
                v = fmax(v, 0.0f);
            VSTOREV(v, 0, lane[j]);
        }
        float row[WM * VL];
        for (int l = 0; l < VL; l++)
            for (int j = 0; j < WM; j++)
                row[l * WM + j] = lane[j][l];
        __global float *yr = yk + p * Q + q0;
        if (q0 + WM * VL <= Q) {
            for (int u = 0; u < WM * VL; u += 8)
                vstore8(vload8(0, row + u), 0, yr + u);
        } else {
            for (int u = 0; u < WM * VL && q0 + u < Q; u++)
                yr[u] = row[u];
        }
    }
}

// Backward filter, step 1: E = A e A^T (A = AT^T, alpha x WM) for every
// WM x WM tile e of dy (zero past the edge): the transposed F(WM,3) algorithm
// computes the 3x3 correlation of x with dy as F(3x3, WMxWM).
// gws = (>= TH*TWG, >= K, images); Ud[(xi*K + k)*ldu + b*TH*TW + t].
#if WM == 2
#define BF1D(o, e0, e1, e2, e3)                                                                        \
    do {                                                                                               \
        o[0] = e0;                                                                                     \
        o[1] = e0 + e1;                                                                                \
        o[2] = e0 - e1;                                                                                \
        o[3] = -e1;                                                                                    \
    } while (0)
#else
#define BF1D(o, e0, e1, e2, e3)                                                                        \
    do {                                                                                               \
        o[0] = e0;                                                                                     \
        o[1] = (e0 + e2) + (e1 + e3);                                                                  \
        o[2] = (e0 + e2) - (e1 + e3);                                                                  \
        o[3] = (e0 + 4.0f * e2) + 2.0f * (e1 + 4.0f * e3);                                             \
        o[4] = (e0 + 4.0f * e2) - 2.0f * (e1 + 4.0f * e3);                                             \
        o[5] = e3;                                                                                     \
    } while (0)
#endif

__kernel void wino_bf_dy(__global const float *dy, const int offdy, const int K, const int P, const int Q,
                         const int TH, const int TW, const int TWG, const float invTWG, __global float *Ud,
                         const int ldu)
{
    const int id = get_global_id(0);
    const int k = get_global_id(1);
    const int b = get_global_id(2);
    if (id >= TH * TWG || k >= K)
        return;
    int th, g;
    DIVMOD(id, TWG, invTWG, th, g);
    const int tw0 = g * VL;
    const int q0 = tw0 * WM;
    __global const float *dk = dy + offdy + (b * K + k) * P * Q;
    vecf e[WM][WM];
    for (int i = 0; i < WM; i++) {
        const int p = th * WM + i;
        float r[WM * VL];
        if (p < P && q0 + WM * VL <= Q) {
            for (int j = 0; j < WM * VL; j++)
                r[j] = dk[p * Q + q0 + j];
        } else {
            for (int j = 0; j < WM * VL; j++)
                r[j] = (p < P && q0 + j < Q) ? dk[p * Q + q0 + j] : 0.0f;
        }
        for (int j = 0; j < WM; j++)
            e[i][j] = GATHERV(r, j, WM);
    }
    // columns: t1[a][j] = sum_i A[a][i] e[i][j]; then rows
    vecf t1[WA][WM];
    for (int j = 0; j < WM; j++) {
        vecf o[WA];
        BF1D(o, e[0][j], e[1][j], e[WM > 2 ? 2 : 0][j], e[WM > 2 ? 3 : 0][j]);
        for (int a = 0; a < WA; a++)
            t1[a][j] = o[a];
    }
    const int n = TW - tw0;
    __global float *u = Ud + k * ldu + b * TH * TW + th * TW + tw0;
    for (int a = 0; a < WA; a++) {
        vecf o[WA];
        BF1D(o, t1[a][0], t1[a][1], t1[a][WM > 2 ? 2 : 0], t1[a][WM > 2 ? 3 : 0]);
        for (int b2 = 0; b2 < WA; b2++)
            store_lanes(u + (a * WA + b2) * K * ldu, o[b2], n);
    }
}

// Backward filter, step 3: dw = beta*dw + G^T Mf G (3x3) from the summed
// products Mf[xi][k][c] (K x C per xi): gws = (C, K).
__kernel void wino_bf_out(__global const float *Mf, const int K, const int C, const float beta,
                          __global float *dw, const int offdw)
{
    WINO_G;
    const int c = get_global_id(0);
    const int k = get_global_id(1);
    if (c >= C || k >= K)
        return;
    float m[WA][WA];
    for (int a = 0; a < WA; a++)
        for (int b = 0; b < WA; b++)
            m[a][b] = Mf[((a * WA + b) * K + k) * C + c];
    float tmp[3][WA];
    for (int r = 0; r < 3; r++)
        for (int b = 0; b < WA; b++) {
            float acc = 0.0f;
            for (int a = 0; a < WA; a++)
                acc += GM[a][r] * m[a][b];
            tmp[r][b] = acc;
        }
    __global float *d = dw + offdw + (k * C + c) * 9;
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < 3; s++) {
            float v = 0.0f;
            for (int b = 0; b < WA; b++)
                v += tmp[r][b] * GM[b][s];
            if (beta == 0.0f)
                d[r * 3 + s] = v;
            else
                d[r * 3 + s] = fma(beta, d[r * 3 + s], v);
        }
}
