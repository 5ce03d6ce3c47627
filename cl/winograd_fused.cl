// Fused Winograd convolution for 3x3 filters, stride 1: ONE launch does the
// input transform, the transform-domain products and the output transform
// with bias + ReLU. -D WM=2 selects F(2x2,3x3) (alpha 4), -D WM=4 F(4x4,3x3)
// (alpha 6). Backward-data runs the same kernel on dy with the rotated,
// transposed filters (wf_filter with flip = 1) and padding 2 - pad.
//
// Work decomposition (CPU-first, valid OpenCL C 1.2 everywhere):
//   * a work-item owns TB = 8*NT output tiles, numbered across the whole
//     batch (tile t -> image t / TI, tile row, tile column), one lane of a
//     float8 per tile, and a range of output-channel blocks (KB channels
//     each) given by get_global_id(1);
//   * phase 1 transforms its tiles for a chunk of CB input channels into
//     its private slice of the __local scratch: Vs[xi][c][TB]. A float8 of
//     tiles that covers 8 consecutive tiles of one tile row (or, F(4x4) with
//     4 tiles per row, two whole tile rows) is a "row group": each input row
//     is read as float16s and split into the tiles' columns with shuffle2,
//     and phase 3 stores whole output rows the same way; other tiles are
//     gathered one by one;
//   * phase 2, per block of KB output channels and transform point xi, runs
//     a KB x TB register-blocked product over the channel chunk (broadcast
//     filter value times a float8 of tiles), accumulating in Ms[g][xi][KB][TB];
//   * phase 3 output-transforms Ms, adds bias, applies ReLU and stores.
//   When the whole channel range fits the scratch (CB == C) the input
//   transform runs once and each channel block is finished (phases 2+3)
//   before the next, so Ms holds one block (KGB = 1). Otherwise the host
//   picks KGB blocks per group and the channel chunks are re-transformed per
//   group. Work-items of a work-group (WGS of them) use disjoint scratch
//   slices: no barriers, no sharing.
//
// Filter layout (wf_filter): U[((xi*Kb + kb)*C + c)*KB + i] holds output
// channel k = kb*KB + i (zero for k >= K), so the product reads KB
// consecutive floats per channel.

#ifndef WM
#define WM 4
#endif
#define WA (WM + 2)
#define A2 (WA * WA)
#ifndef NT
#define NT 2
#endif
#define TB (8 * NT)
#ifndef KB
#define KB 8
#endif
#ifndef WF_ROWS // 0: no row groups (the host's choice when no tile row can hold one)
#define WF_ROWS 1
#endif
#ifndef WGS
#define WGS 1
#endif
#ifndef WF_DIRECT_C // largest input-channel count taking the direct path (phase 3 forms the products)
#define WF_DIRECT_C 4
#endif

#if WM != 2 && WM != 4
#error "WM must be 2 or 4"
#endif

// ---- 1-D transforms (Lavin & Gray points 0, +-1, +-2, inf for WM = 4) ----

// input: o = B^T d (d, o: WA values)
#if WM == 2
#define WF_IN(o, d)                                                                                    \
    do {                                                                                               \
        o[0] = d[0] - d[2];                                                                            \
        o[1] = d[1] + d[2];                                                                            \
        o[2] = d[2] - d[1];                                                                            \
        o[3] = d[1] - d[3];                                                                            \
    } while (0)
// output: o = A^T m (m: WA values, o: WM values)
#define WF_OUT(o, m)                                                                                   \
    do {                                                                                               \
        o[0] = m[0] + m[1] + m[2];                                                                     \
        o[1] = m[1] - m[2] - m[3];                                                                     \
    } while (0)
#else
#define WF_IN(o, d)                                                                                    \
    do {                                                                                               \
        o[0] = fma(4.0f, d[0], d[4]) - 5.0f * d[2];                                                    \
        o[1] = (d[3] + d[4]) - 4.0f * (d[1] + d[2]);                                                   \
        o[2] = (d[4] - d[3]) + 4.0f * (d[1] - d[2]);                                                   \
        o[3] = (d[4] - d[2]) + 2.0f * (d[3] - d[1]);                                                   \
        o[4] = (d[4] - d[2]) - 2.0f * (d[3] - d[1]);                                                   \
        o[5] = fma(4.0f, d[1], d[5]) - 5.0f * d[3];                                                    \
    } while (0)
#define WF_OUT(o, m)                                                                                   \
    do {                                                                                               \
        const float8 s12_ = m[1] + m[2], d12_ = m[1] - m[2];                                           \
        const float8 s34_ = m[3] + m[4], d34_ = m[3] - m[4];                                           \
        o[0] = m[0] + s12_ + s34_;                                                                     \
        o[1] = fma(2.0f, d34_, d12_);                                                                  \
        o[2] = fma(4.0f, s34_, s12_);                                                                  \
        o[3] = fma(8.0f, d34_, d12_) + m[5];                                                           \
    } while (0)
#endif

// G row a applied to (g0, g1, g2), fp32, on scalars or vectors (a constant
// after unrolling: the selection folds away). 1/6 and 1/24 as products by
// the reciprocals, not divisions.
#if WM == 2
#define WF_G(a, g0, g1, g2)                                                                            \
    ((a) == 0 ? (g0) : (a) == 1 ? 0.5f * ((g0) + (g1) + (g2)) : (a) == 2 ? 0.5f * ((g0) - (g1) + (g2)) : (g2))
#else
#define WF_G(a, g0, g1, g2)                                                                            \
    ((a) == 0   ? 0.25f * (g0)                                                                         \
     : (a) == 1 ? ((g0) + (g1) + (g2)) * (-1.0f / 6.0f)                                                \
     : (a) == 2 ? ((g0) - (g1) + (g2)) * (-1.0f / 6.0f)                                                \
     : (a) == 3 ? ((g0) + 2.0f * (g1) + 4.0f * (g2)) * (1.0f / 24.0f)                                  \
     : (a) == 4 ? ((g0) - 2.0f * (g1) + 4.0f * (g2)) * (1.0f / 24.0f)                                  \
                : (g2))
#endif

// The KB output channels of a block as one vector (KB = 1: a scalar).
#define WF_CAT_(a, b) a##b
#define WF_CAT(a, b) WF_CAT_(a, b)
#if KB == 1
#define WF_KV float
#define WF_KLOAD(p) (*(p))
#define WF_KSTORE(v, p) (*(p) = (v))
#else
#define WF_KV WF_CAT(float, KB)
#define WF_KLOAD(p) WF_CAT(vload, KB)(0, p)
#define WF_KSTORE(v, p) WF_CAT(vstore, KB)(v, 0, p)
#endif

// U = G g G^T for every (k, c): gws = (>= C, >= Kb), one work-item per input
// channel c and block kb of KB output channels, computed as KB-wide vectors:
// neighbouring work-items (c, c+1) write adjacent KB-float runs of every
// transform point's plane. flip = 0: g = w[k][c] with w (K, C, 3, 3); flip =
// 1 (backward-data): g = rot180(w[c][k]) with w stored (C, K, 3, 3).
// Channels k >= K of the last block are zero.
__kernel void wf_filter(__global const float *w, const int offw, const int K, const int C, const int flip,
                        const int Kb, __global float *U)
{
    const int c = get_global_id(0);
    const int kb = get_global_id(1);
    if (c >= C || kb >= Kb)
        return;
    float gs[9][KB]; // tap rs of output channel kb*KB + i
    #pragma unroll
    for (int i = 0; i < KB; i++) {
        const int k = kb * KB + i;
        // padding channels k >= K of the last block read channel K-1 (inside w) and use 0
        const int kin = k < K, kk = min(k, K - 1);
        __global const float *wp = w + offw + (flip ? (c * K + kk) * 9 : (kk * C + c) * 9);
        #pragma unroll
        for (int rs = 0; rs < 9; rs++) {
            const float v = flip ? wp[8 - rs] : wp[rs];
            gs[rs][i] = kin ? v : 0.0f;
        }
    }
    WF_KV g[3][3];
    #pragma unroll
    for (int r = 0; r < 3; r++)
        #pragma unroll
        for (int s = 0; s < 3; s++)
            g[r][s] = WF_KLOAD(gs[r * 3 + s]);
    WF_KV t[WA][3];
    #pragma unroll
    for (int a = 0; a < WA; a++)
        #pragma unroll
        for (int s = 0; s < 3; s++)
            t[a][s] = WF_G(a, g[0][s], g[1][s], g[2][s]);
    #pragma unroll
    for (int a = 0; a < WA; a++)
        #pragma unroll
        for (int b = 0; b < WA; b++)
            WF_KSTORE(WF_G(b, t[a][0], t[a][1], t[a][2]), U + (((size_t)(a * WA + b) * Kb + kb) * C + c) * KB);
}

// Lanes over 8 consecutive tiles of one tile row ("row groups"): tile l's
// column j sits at WM*l + j of the row, so a row of the group is WF_SPAN
// contiguous floats, loaded as float16s and split into the WA columns by
// shuffle2 (no scalar transposition); outputs are interleaved back the same way.
#if WM == 4
#define WF_SPAN 36 // a, b: columns 0..31; a4, b4: columns 4..35
#else
#define WF_SPAN 32
#endif
#define WF_LANES(m) ((uint8)(0, m, 2 * (m), 3 * (m), 4 * (m), 5 * (m), 6 * (m), 7 * (m)))

// d[j] (lane l) = x[idx + WM*l + j], the group's input row h (column w0 + WM*l
// + j), zero outside the image (ina: row inside, columns checked here). The
// caller keeps the loads inside x's data. Half groups (WM = 4, 4 tiles per
// tile row): lanes 4..7 are the next tile row's 4 tiles, their row starting
// boff = WM*W floats later (inb: that row inside; bcol = 0), else boff = bcol
// = 16 and inb = ina.
static inline void wf_row(__global const float *x, const int idx, const int w0, const int W, const int ina,
                          const int inb, const int boff, const int bcol, float8 *d)
{
    const int16 col = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) + w0;
    float16 a = (float16)(0.0f), b = (float16)(0.0f);
    if (ina)
        a = select((float16)(0.0f), vload16(0, x + idx), col >= 0 && col < W);
    if (inb)
        b = select((float16)(0.0f), vload16(0, x + idx + boff), col + bcol >= 0 && col + bcol < W);
    #pragma unroll
    for (int j = 0; j < WA && j < 4; j++)
        d[j] = shuffle2(a, b, WF_LANES(WM) + (uint8)(j));
#if WM == 4
    if (ina)
        a = select((float16)(0.0f), vload16(0, x + idx + 4), col + 4 >= 0 && col + 4 < W);
    if (inb)
        b = select((float16)(0.0f), vload16(0, x + idx + boff + 4), col + bcol + 4 >= 0 && col + bcol + 4 < W);
    d[4] = shuffle2(a, b, WF_LANES(4));
    d[5] = shuffle2(a, b, WF_LANES(4) + (uint8)(1));
#endif
}

// Output row of a row group: p[WM*l + s] = o[s] (lane l), lanes 4..7 (WM = 4)
// at p2 + WM*(l-4) + s (p2 = p + 16, or the next tile row's for a half group).
static inline void wf_store_row(const float8 *o, __global float *p, __global float *p2)
{
    const uint16 zip = (uint16)(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
#if WM == 4
    const float16 ab = shuffle2(o[0], o[1], zip), cd = shuffle2(o[2], o[3], zip);
    vstore16(shuffle2(ab, cd, (uint16)(0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23)), 0, p);
    vstore16(shuffle2(ab, cd, (uint16)(8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31)), 0, p2);
#else
    vstore16(shuffle2(o[0], o[1], zip), 0, p);
#endif
}

// y (N, K, P, Q) = conv3x3(x (N, C, H, W), U) + bias, ReLU; P = H + 2 pad_h - 2.
// TI = TH*TW tiles per image, T = N*TI tiles. gws = (>= ceil(T/TB) rounded
// to WGS, ceil(Kb/kbper)), lws = (WGS, 1); scratch: WGS * A2*TB*(CB + KGB*KB) floats.
__kernel void wf_conv(__global const float *x, const int offx, const int C, const int H, const int W,
                      const int pad_h, const int pad_w, const int P, const int Q, const int TW, const int TI,
                      const int T, __global const float *U, const int K, const int Kb, const int kbper,
                      const int CB, const int KGB, __global const float *bias, const int offb, const int has_bias,
                      const int relu, __global float *y, const int offy, __local float *scratch)
{
    const int blk = get_global_id(0);
    const int kb_lo = get_global_id(1) * kbper;
    const int kb_hi = min(Kb, kb_lo + kbper);
    if (blk * TB >= T || kb_lo >= kb_hi)
        return;
    __local float *Vs = scratch + get_local_id(0) * (A2 * TB * (CB + KGB * KB));
    __local float *Ms = Vs + A2 * TB * CB;
    const int HW = H * W, PQ = P * Q;

    // Lane geometry, computed once per work-item. Tile l's input patch starts
    // at row h0s[l], column w0 of image n; each (tile, row) is gathered as one
    // float8 by a vload8 at the row's first column (it may run into the
    // neighbouring rows, or start in the previous one when w0 < 0: a select
    // zeroes the columns outside the image, cm[l], and rows outside it). Only
    // a load that would leave x's data [offx, xend) takes an element-wise
    // path with clamped indices. xb[l]: x index of (row 0, column w0) of
    // the tile's image in channel 0.
    // yo[l]: y index of the tile's first output in channel 0; pr[l] x qc[l]:
    // the part of the WM x WM tile inside the output (0 rows past the last tile).
    int xb[TB], h0s[TB], yo[TB], pr[TB], qc[TB];
    int8 cm[TB];
    const int xend = offx + (T / TI) * C * HW;
    for (int l = 0; l < TB; l++) {
        const int t = blk * TB + l;
        const int in = t < T;
        const int n = in ? t / TI : 0, r = in ? t - n * TI : 0;
        const int th = r / TW, tw = r - th * TW;
        const int h0 = th * WM - pad_h, w0 = tw * WM - pad_w;
        const int8 col = (int8)(0, 1, 2, 3, 4, 5, 6, 7) + w0;
        xb[l] = offx + n * C * HW + w0;
        h0s[l] = in ? h0 : -WA; // rows of a tile past the end are all outside
        cm[l] = col >= 0 && col < W;
        yo[l] = offy + n * K * PQ + th * WM * Q + tw * WM;
        pr[l] = in ? min(WM, P - th * WM) : 0;
        qc[l] = min(WM, Q - tw * WM);
    }
    // Row groups: lanes v*8 .. v*8+7 are 8 consecutive tiles of one tile row
    // (rowg; wcol: input column of lane 0's first column), or (WM = 4, 4 tiles
    // per tile row) a half group: tile rows th and th + 1 of one image
    // (brow = WM: lanes 4..7 read WM rows lower); fullg: all whole output tiles.
    int rowg[NT], fullg[NT], wcol[NT], brow[NT];
    #pragma unroll
    for (int v = 0; v < NT; v++) {
        const int t = blk * TB + v * 8;
        const int n = t / TI, r = t - n * TI;
        const int th = r / TW, tw = r - th * TW;
        const int row = t + 7 < T && tw + 7 < TW;
#if WM == 4
        const int hgrp = t + 7 < T && TW == 4 && tw == 0 && (th + 2) * TW <= TI;
#else
        const int hgrp = 0;
#endif
        brow[v] = hgrp ? WM : 0;
        // every row load of the group inside x's data (else the gather path, which clamps)
        const int hlo = max(th * WM - pad_h, 0), hnd = min(th * WM - pad_h + WA + brow[v], H);
        const int lo = offx + n * C * HW + hlo * W + tw * WM - pad_w;
        const int hi = offx + n * C * HW + (C - 1) * HW + hnd * W + tw * WM - pad_w + WF_SPAN;
        rowg[v] = WF_ROWS && (row | hgrp) && lo >= offx && hi <= xend;
        fullg[v] = rowg[v] && (th * WM + WM + brow[v] <= P) && (tw + (hgrp ? 4 : 8)) * WM <= Q;
        wcol[v] = tw * WM - pad_w;
    }
    int anyrow = 0;
    #pragma unroll
    for (int v = 0; v < NT; v++)
        anyrow |= rowg[v];
    const int single = CB >= C; // one channel chunk: transform once, keep nothing across blocks
    // Few input channels (C = 1 layers): the products are cheaper than their
    // round trip through the scratch, so phase 3 computes each transform-domain
    // value from Vs and U as it needs it (amortising the input transform over
    // all output channels without storing products).
    const int direct = single && C <= WF_DIRECT_C;
    for (int kg = kb_lo; kg < kb_hi; kg += KGB) {
        const int kg_end = min(kb_hi, kg + KGB);
        for (int c0 = 0; c0 < C; c0 += CB) {
            const int cb = min(CB, C - c0);
            if (!single || kg == kb_lo) {
                // ---- phase 1: input transform of channels c0 .. c0+cb-1 ----
                if (anyrow) {
                    for (int cc = 0; cc < cb; cc++) {
                        const int coff = (c0 + cc) * HW;
                        #pragma unroll 1
                        for (int v = 0; v < NT; v++) {
                            float8 t1[WA][WA]; // t1[i][b] = (d B)[i][b]: input rows transformed along the columns
                            if (rowg[v]) {
                                #pragma unroll
                                for (int i = 0; i < WA; i++) {
                                    const int h = h0s[v * 8] + i;
                                    float8 d[WA], o[WA];
                                    const int hb = h + brow[v];
                                    wf_row(x, xb[v * 8] + coff + h * W, wcol[v], W, h >= 0 && h < H, hb >= 0 && hb < H,
                                           brow[v] ? brow[v] * W : 16, brow[v] ? 0 : 16, d);
                                    WF_IN(o, d);
                                    #pragma unroll
                                    for (int b = 0; b < WA; b++)
                                        t1[i][b] = o[b];
                                }
                            } else {
                                // (rare: the first or last group of the batch, a group
                                // across tile rows) element by element
                                float dd[WA][WA][8];
                                for (int l = 0; l < 8; l++) {
                                    const int L = v * 8 + l;
                                    int cin[8];
                                    vstore8(cm[L], 0, cin);
                                    #pragma unroll
                                    for (int i = 0; i < WA; i++) {
                                        const int h = h0s[L] + i, hin = h >= 0 && h < H;
                                        #pragma unroll
                                        for (int j = 0; j < WA; j++) {
                                            const int q = clamp(xb[L] + coff + h * W + j, offx, xend - 1);
                                            dd[i][j][l] = hin && cin[j] ? x[q] : 0.0f;
                                        }
                                    }
                                }
                                #pragma unroll
                                for (int i = 0; i < WA; i++) {
                                    float8 d[WA], o[WA];
                                    #pragma unroll
                                    for (int j = 0; j < WA; j++)
                                        d[j] = vload8(0, dd[i][j]);
                                    WF_IN(o, d);
                                    #pragma unroll
                                    for (int b = 0; b < WA; b++)
                                        t1[i][b] = o[b];
                                }
                            }
                            #pragma unroll
                            for (int b = 0; b < WA; b++) {
                                float8 col[WA], o[WA];
                                #pragma unroll
                                for (int i = 0; i < WA; i++)
                                    col[i] = t1[i][b];
                                WF_IN(o, col);
                                #pragma unroll
                                for (int a = 0; a < WA; a++)
                                    vstore8(o[a], v, Vs + ((a * WA + b) * CB + cc) * TB);
                            }
                        }
                    }
                } else {
                    for (int cc = 0; cc < cb; cc++) {
                        const int coff = (c0 + cc) * HW;
                        float dd[WA][WA][TB];
                        for (int l = 0; l < TB; l++) {
                            #pragma unroll
                            for (int i = 0; i < WA; i++) {
                                const int h = h0s[l] + i;
                                const int idx = xb[l] + coff + h * W;
                                float8 row;
                                if (idx >= offx && idx + 8 <= xend) {
                                    row = vload8(0, x + idx);
                                } else {
                                    float e[8];
                                    #pragma unroll
                                    for (int j = 0; j < 8; j++)
                                        e[j] = x[clamp(idx + j, offx, xend - 1)]; // masked below
                                    row = vload8(0, e);
                                }
                                row = select((float8)(0.0f), row, cm[l] & (int8)(h >= 0 && h < H ? -1 : 0));
                                float rr[8];
                                vstore8(row, 0, rr);
                                #pragma unroll
                                for (int j = 0; j < WA; j++)
                                    dd[i][j][l] = rr[j];
                            }
                        }
                        #pragma unroll
                        for (int v = 0; v < NT; v++) {
                            float8 t1[WA][WA]; // t1[a][j] = (B^T d)[a][j]
                            #pragma unroll
                            for (int j = 0; j < WA; j++) {
                                float8 col[WA], o[WA];
                                #pragma unroll
                                for (int i = 0; i < WA; i++)
                                    col[i] = vload8(v, dd[i][j]);
                                WF_IN(o, col);
                                #pragma unroll
                                for (int a = 0; a < WA; a++)
                                    t1[a][j] = o[a];
                            }
                            #pragma unroll
                            for (int a = 0; a < WA; a++) {
                                float8 o[WA];
                                WF_IN(o, t1[a]);
                                #pragma unroll
                                for (int b = 0; b < WA; b++)
                                    vstore8(o[b], v, Vs + ((a * WA + b) * CB + cc) * TB);
                            }
                        }
                    }
                }
            }
            // ---- phase 2: products, KB channels x TB tiles per transform point ----
            // (few input channels, one chunk: phase 3 forms them itself)
            for (int kb = direct ? kg_end : kg; kb < kg_end; kb++) {
                __local float *mg = Ms + (kb - kg) * (A2 * KB * TB);
                for (int xi = 0; xi < A2; xi++) {
                    float8 acc[KB][NT];
                    __local float *mp = mg + xi * KB * TB;
                    if (c0 == 0) {
                        #pragma unroll
                        for (int i = 0; i < KB; i++)
                            #pragma unroll
                            for (int v = 0; v < NT; v++)
                                acc[i][v] = (float8)(0.0f);
                    } else {
                        #pragma unroll
                        for (int i = 0; i < KB; i++)
                            #pragma unroll
                            for (int v = 0; v < NT; v++)
                                acc[i][v] = vload8(v, mp + i * TB);
                    }
                    __local const float *vp = Vs + xi * CB * TB;
                    __global const float *up = U + ((size_t)(xi * Kb + kb) * C + c0) * KB;
                    for (int cc = 0; cc < cb; cc++) {
                        float8 vv[NT];
                        #pragma unroll
                        for (int v = 0; v < NT; v++)
                            vv[v] = vload8(v, vp);
                        #pragma unroll
                        for (int i = 0; i < KB; i++) {
                            const float8 a = (float8)(up[i]);
                            #pragma unroll
                            for (int v = 0; v < NT; v++)
                                acc[i][v] = fma(a, vv[v], acc[i][v]);
                        }
                        vp += TB;
                        up += KB;
                    }
                    #pragma unroll
                    for (int i = 0; i < KB; i++)
                        #pragma unroll
                        for (int v = 0; v < NT; v++)
                            vstore8(acc[i][v], v, mp + i * TB);
                }
            }
        }
        // ---- phase 3: output transform + bias + ReLU of blocks kg .. kg_end-1 ----
        for (int kb = kg; kb < kg_end; kb++) {
            __local const float *mg = Ms + (kb - kg) * (A2 * KB * TB);
            for (int i = 0; i < KB; i++) {
                const int k = kb * KB + i;
                if (k >= K)
                    break;
                const float bv = has_bias ? bias[offb + k] : 0.0f;
                #pragma unroll
                for (int v = 0; v < NT; v++) {
                    float8 t1[WM][WA]; // t1[r][b] = (A^T m)[r][b]
                    #pragma unroll
                    for (int b = 0; b < WA; b++) {
                        float8 col[WA], o[WM];
                        #pragma unroll
                        for (int a = 0; a < WA; a++) {
                            if (direct) {
                                const int xi = a * WA + b;
                                __local const float *vp = Vs + xi * CB * TB;
                                __global const float *up = U + ((size_t)(xi * Kb + kb) * C) * KB + i;
                                float8 m = (float8)(0.0f);
                                for (int cc = 0; cc < C; cc++)
                                    m = fma((float8)(up[cc * KB]), vload8(v, vp + cc * TB), m);
                                col[a] = m;
                            } else {
                                col[a] = vload8(v, mg + ((a * WA + b) * KB + i) * TB);
                            }
                        }
                        WF_OUT(o, col);
                        #pragma unroll
                        for (int r = 0; r < WM; r++)
                            t1[r][b] = o[r];
                    }
                    float ob[WM][WM][8];
                    #pragma unroll
                    for (int r = 0; r < WM; r++) {
                        float8 o[WM];
                        WF_OUT(o, t1[r]);
                        #pragma unroll
                        for (int s = 0; s < WM; s++) {
                            o[s] += bv;
                            if (relu)
                                o[s] = fmax(o[s], 0.0f);
                        }
                        if (fullg[v]) {
                            __global float *yr = y + yo[v * 8] + k * PQ + r * Q;
                            wf_store_row(o, yr, yr + (brow[v] ? brow[v] * Q : 16));
                        } else {
                            #pragma unroll
                            for (int s = 0; s < WM; s++)
                                vstore8(o[s], 0, ob[r][s]);
                        }
                    }
                    if (fullg[v])
                        continue;
                    #pragma unroll
                    for (int l = 0; l < 8; l++) {
                        const int L = v * 8 + l;
                        __global float *yp = y + yo[L] + k * PQ;
                        if (pr[L] == WM && qc[L] == WM) {
                            // whole tile: each of its WM rows is WM contiguous outputs
                            #pragma unroll
                            for (int r = 0; r < WM; r++)
#if WM == 4
                                vstore4((float4)(ob[r][0][l], ob[r][1][l], ob[r][2][l], ob[r][3][l]), 0, yp + r * Q);
#else // scalar: a vstore2 of this float2 crashes oclgrind 21.10's --uninitialized
                                for (int s = 0; s < WM; s++)
                                    yp[r * Q + s] = ob[r][s][l];
#endif
                        } else {
                            #pragma unroll
                            for (int r = 0; r < WM; r++)
                                #pragma unroll
                                for (int s = 0; s < WM; s++)
                                    if (r < pr[L] && s < qc[L])
                                        yp[r * Q + s] = ob[r][s][l];
                        }
                    }
                }
            }
        }
    }
}
