// Shape-specialised direct convolution (groups 1, dilation 1), NCHW fp32:
// every shape constant is a build option, so window loops unroll, index
// arithmetic folds and the stride phases of backward-data resolve at
// compile time. Two designs:
// - row vectors (dconv_fwd, dconv_bwdd): a work-item owns a run of QT =
//   VW*NV outputs along a row held in NV vectors of VW floats (VW 1 on GPUs:
//   one output per work-item) and a block of channels; every tap loads its
//   input vector straight from the image row (masked at the edges), or from
//   a zero-filled private copy of the row where the span leaves the plane;
// - output-channel vectors (dconv_fwdk, dconv_bwdf): a work-item holds
//   vectors of VK output channels, each input value a broadcast.
// Host side and launch geometry: src/ops/conv_direct.c.
//
// Build options: DC DK DR DS (channels in/out, window) DSH DSW (stride)
// DPH DPW (padding) DH DW (input) DP DQ (output) VW NV, and per kernel
// KB (output channels per work-item, dconv_fwd) or CB (input channels per
// work-item, dconv_bwdd), or VK (channel-vector width) with KVB (vectors
// per work-item) and, for dconv_fwdk, QB (pixels per strip).

#if VW == 1
typedef float vecf;
#define VLD(p) (*(p))
#define VST(v, p) (*(p) = (v))
#elif VW == 4
typedef float4 vecf;
#define VLD(p) vload4(0, p)
#define VST(v, p) vstore4(v, 0, p)
#elif VW == 8
typedef float8 vecf;
#define VLD(p) vload8(0, p)
#define VST(v, p) vstore8(v, 0, p)
#elif VW == 16
typedef float16 vecf;
#define VLD(p) vload16(0, p)
#define VST(v, p) vstore16(v, 0, p)
#else
#error "VW must be 1, 4, 8 or 16"
#endif

#define QT (VW * NV)
#define RS (DR * DS)

#if VW == 1
#define IOTA 0
#define MASKV(v, ok) ((ok) ? (v) : 0.0f)
#else
#define IOTA_4 (int4)(0, 1, 2, 3)
#define IOTA_8 (int8)(0, 1, 2, 3, 4, 5, 6, 7)
#define IOTA_16 (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define IOTA_(w) IOTA_##w
#define IOTA__(w) IOTA_(w)
#define IOTA IOTA__(VW)
#define MASKV(v, ok) select((vecf)(0.0f), (v), (ok))
#endif

// Lanes col + l*STEP (l < VW) of a row: GVEC from the image row at g
// (zero outside columns [0, COLS); the caller made sure the whole span is
// inside the buffer), PVEC from a private copy that is zero-filled already.
#define ROWVEC_LOAD_(step, p) ROWVEC_LOAD##step(p)
#define ROWVEC_LOAD(step, p) ROWVEC_LOAD_(step, p)
#define ROWVEC_LOAD1(p) VLD(p)
#if VW == 1
#define ROWVEC_LOAD2(p) (*(p))
#elif VW == 4
#define ROWVEC_LOAD2(p) vload8(0, p).even
#elif VW == 8
#define ROWVEC_LOAD2(p) vload16(0, p).even
#else
#define ROWVEC_LOAD2(p) ((float16)(vload16(0, p).even, vload16(0, (p) + 16).even))
#endif
#define GVEC(g, col, STEP, COLS)                                                                       \
    MASKV(ROWVEC_LOAD(STEP, (g) + (col)), ((col) + IOTA * (STEP) >= 0) & ((col) + IOTA * (STEP) < (COLS)))
#define PVEC(pr, col, STEP) ROWVEC_LOAD(STEP, (pr) + (col))

// Copies columns lo .. lo+L-1 of the row at g into pr, zero outside [0, COLS).
#define ROW_COPY(pr, g, lo, L, COLS)                                                                   \
    for (int j_ = 0; j_ < (L); j_++) {                                                                 \
        const int c_ = (lo) + j_;                                                                      \
        (pr)[j_] = (c_ >= 0 && c_ < (COLS)) ? (g)[c_] : 0.0f;                                          \
    }

#ifdef KB
// Input columns a run of outputs reads (vector loads included).
#define XS (DS - 1 + DSW * QT)
#define FWD_TAPS(XV)                                                                                   \
    _Pragma("unroll") for (int s = 0; s < DS; s++) _Pragma("unroll") for (int v = 0; v < NV; v++)    \
    {                                                                                                  \
        const vecf xv = XV;                                                                            \
        _Pragma("unroll") for (int i = 0; i < KB; i++)                                                 \
        {                                                                                              \
            acc[i][v] = fma(xv, (vecf)((wr + kofs[i])[s]), acc[i][v]);                                  \
        }                                                                                              \
    }

// Forward: y = act(conv(x, w) + bias). gws = (runs per row, P, N * ceil(K/KB)).
__kernel void dconv_fwd(const int N, __global const float *x, const int offx, __global const float *w, const int offw,
                        __global const float *bias, const int offb, const int has_bias, const int relu,
                        __global float *y, const int offy)
{
    const int run = get_global_id(0);
    const int p = get_global_id(1);
    const int z = get_global_id(2);
    const int NKB = (DK + KB - 1) / KB;
    if (run * QT >= DQ || p >= DP)
        return;
    const int n = z / NKB, k0 = (z - n * NKB) * KB;
    if (n >= N)
        return;
    const int q0 = run * QT, w0 = q0 * DSW - DPW;
    vecf acc[KB][NV];
#pragma unroll
    for (int i = 0; i < KB; i++)
#pragma unroll
        for (int v = 0; v < NV; v++)
            acc[i][v] = (vecf)(0.0f);
    /* the block's filter offsets: each tap's weight is then a pointer plus a
     * constant (PoCL's code for an index sum per tap spent three integer
     * operations beside every fma) */
    int kofs[KB];
#pragma unroll
    for (int i = 0; i < KB; i++)
        kofs[i] = min(k0 + i, DK - 1) * DC * RS;
    float pr[XS];
    for (int c = 0; c < DC; c++) {
        __global const float *xc = x + offx + (n * DC + c) * DH * DW;
        __global const float *wc = w + offw + c * RS;
#pragma unroll 1
        for (int rr = 0; rr < DR; rr++) {
            const int h = p * DSH - DPH + rr;
            if (h < 0 || h >= DH)
                continue;
            __global const float *xg = xc + h * DW;
            __global const float *wr = wc + rr * DS;
            /* a span reaching into the neighbouring planes (masked) reads in place; only one beyond
             * the batch's first or last plane goes through a private copy */
            const int at = ((n * DC + c) * DH + h) * DW + w0;
            if (at >= 0 && at + XS <= N * DC * DH * DW) {
                FWD_TAPS(GVEC(xg, w0 + s + v * VW * DSW, DSW, DW));
            } else {
                ROW_COPY(pr, xg, w0, XS, DW);
                FWD_TAPS(PVEC(pr, s + v * VW * DSW, DSW));
            }
        }
    }
#pragma unroll
    for (int i = 0; i < KB; i++) {
        const int k = k0 + i;
        if (k >= DK)
            break;
        const float b = has_bias ? bias[offb + k] : 0.0f;
        __global float *yr = y + offy + ((n * DK + k) * DP + p) * DQ + q0;
#pragma unroll
        for (int v = 0; v < NV; v++) {
            vecf o = acc[i][v] + b;
            if (relu)
                o = fmax(o, 0.0f);
            if (q0 + (v + 1) * VW <= DQ) {
                VST(o, yr + v * VW);
            } else {
                float t[VW];
                VST(o, t);
                for (int l = 0; l < VW && q0 + v * VW + l < DQ; l++)
                    yr[v * VW + l] = t[l];
            }
        }
    }
}

#endif // KB

#ifdef VK
// Backward-filter, vectorised over output channels: dy transposed to
// dyT[((n*DP + p)*DQ + q)*KP + k] (KP = K rounded up to VK, zeros past K)
// so one load gives VK channels of one output pixel, and every tap of the
// window multiplies it by one input value (a broadcast).
#if VK == 4
typedef float4 veck;
#define KLD(p) vload4(0, p)
#define KST(v, p) vstore4(v, 0, p)
#elif VK == 8
typedef float8 veck;
#define KLD(p) vload8(0, p)
#define KST(v, p) vstore8(v, 0, p)
#else
typedef float16 veck;
#define KLD(p) vload16(0, p)
#define KST(v, p) vstore16(v, 0, p)
#endif
#define KP ((DK + VK - 1) / VK * VK)

// dyT from dy: gws = (P*Q, N).
__kernel void dconv_dyt(__global const float *dy, const int offdy, const int N, __global float *dyt)
{
    const int pq = get_global_id(0);
    const int n = get_global_id(1);
    if (pq >= DP * DQ || n >= N)
        return;
    __global const float *d = dy + offdy + n * DK * DP * DQ + pq;
    float t[KP];
#pragma unroll
    for (int k = 0; k < KP; k++)
        t[k] = k < DK ? d[k * DP * DQ] : 0.0f;
    __global float *o = dyt + (n * DP * DQ + pq) * KP;
#pragma unroll
    for (int k = 0; k < KP; k += VK)
        KST(KLD(t + k), o + k);
}

// Output columns q (rows p) whose whole window row (column) lies inside the image.
#define QLO ((DPW + DSW - 1) / DSW)
#define QHI_ (DW - DS + DPW >= 0 ? (DW - DS + DPW) / DSW + 1 : 0)
#define QHI (QHI_ < DQ ? QHI_ : DQ)
#define PLO ((DPH + DSH - 1) / DSH)
#define PHI_ (DH - DR + DPH >= 0 ? (DH - DR + DPH) / DSH + 1 : 0)
#define PHI (PHI_ < DP ? PHI_ : DP)
#ifndef KVB
#define KVB 1 // channel vectors per work-item (divides KP / VK)
#endif
#ifndef BCB
#define BCB 1 // dconv_bwdf: input channels per work-item (divides DC)
#endif

// One output pixel's contribution to every tap of BCB input channels: xr
// points at input row p*DSH - DPH, column -DPW of the first channel's image
// plane; rows / columns outside the image are skipped when checked (CR / CC).
// Each dy vector serves BCB * RS taps.
#define BWDF_PIXEL(q, CR, CC)                                                                          \
    do {                                                                                               \
        veck d_[KVB];                                                                                  \
        _Pragma("unroll") for (int j_ = 0; j_ < KVB; j_++) d_[j_] = KLD(dp + (q)*KP + j_ * VK);        \
        _Pragma("unroll") for (int r_ = 0; r_ < DR; r_++)                                              \
        {                                                                                              \
            const int h_ = p * DSH - DPH + r_;                                                         \
            if (CR && (h_ < 0 || h_ >= DH))                                                            \
                continue;                                                                              \
            _Pragma("unroll") for (int s_ = 0; s_ < DS; s_++)                                          \
            {                                                                                          \
                const int w_ = (q)*DSW - DPW + s_;                                                     \
                if (CC && (w_ < 0 || w_ >= DW))                                                        \
                    continue;                                                                          \
                _Pragma("unroll") for (int b_ = 0; b_ < BCB; b_++)                                     \
                {                                                                                      \
                    const veck xv_ = (veck)(xr[b_ * DH * DW + r_ * DW + (q)*DSW + s_]);                \
                    _Pragma("unroll") for (int j_ = 0; j_ < KVB; j_++) acc[j_][b_ * RS + r_ * DS + s_] = \
                        fma(d_[j_], xv_, acc[j_][b_ * RS + r_ * DS + s_]);                             \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    } while (0)

// Work-item (channel vectors kv*KVB.., channels c..c+BCB-1, chunk) sums over
// the images of its chunk into part[(chunk*DK + k)*(DC*RS + 1) + c*RS + r*DS + s];
// the work-items of c == 0 also sum dy into column DC*RS (bias gradient).
// With WDIRECT (one chunk) the sums go straight to the gradients instead:
// dw[offw + k*DC*RS + c*RS + r*DS + s] and, with HASDB, db[offdb + k], each
// as beta == 0 ? sum : beta*old + sum (part_reduce's rule).
// gws = (KP/(VK*KVB), C/BCB, chunks).
#ifdef WDIRECT
#define BWDF_ARGS , const int offw, __global float *db, const int offdb, const float beta
#define BWDF_PUT(o, v) (*(o) = beta == 0.0f ? (v) : fma(beta, *(o), (v)))
#define BWDF_W(k, i, v) BWDF_PUT(part + offw + (k) * DC * RS + (i), v)
#ifdef HASDB
#define BWDF_B(k, v) BWDF_PUT(db + offdb + (k), v)
#else
#define BWDF_B(k, v) ((void)0)
#endif
#else
#define BWDF_ARGS
#define BWDF_W(k, i, v) (part[(ch * DK + (k)) * (DC * RS + 1) + (i)] = (v))
#define BWDF_B(k, v) (part[(ch * DK + (k)) * (DC * RS + 1) + DC * RS] = (v))
#endif
__kernel void dconv_bwdf(__global const float *x, const int offx, __global const float *dyt, const int N,
                         const int nper, __global float *part BWDF_ARGS)
{
    const int kv = get_global_id(0) * KVB;
    const int c = get_global_id(1) * BCB;
    const int ch = get_global_id(2);
    if (kv * VK >= DK || c >= DC || ch * nper >= N)
        return;
    const int n1 = min(N, (ch + 1) * nper);
    veck acc[KVB][BCB * RS];
    veck accb[KVB];
#pragma unroll
    for (int j = 0; j < KVB; j++) {
        accb[j] = (veck)(0.0f);
#pragma unroll
        for (int t = 0; t < BCB * RS; t++)
            acc[j][t] = (veck)(0.0f);
    }
    for (int n = ch * nper; n < n1; n++) {
        __global const float *xc = x + offx + (n * DC + c) * DH * DW;
        for (int p = 0; p < DP; p++) {
            __global const float *dp = dyt + (n * DP + p) * DQ * KP + kv * VK;
            __global const float *xr = xc + (p * DSH - DPH) * DW - DPW;
            if (c == 0)
                for (int q = 0; q < DQ; q++)
#pragma unroll
                    for (int j = 0; j < KVB; j++)
                        accb[j] += KLD(dp + q * KP + j * VK);
            if (p >= PLO && p < PHI) {
                for (int q = 0; q < min(QLO, DQ); q++)
                    BWDF_PIXEL(q, 0, 1);
                for (int q = QLO; q < QHI; q++)
                    BWDF_PIXEL(q, 0, 0);
                for (int q = max(QHI, QLO); q < DQ; q++)
                    BWDF_PIXEL(q, 0, 1);
            } else { // rows of the window outside the image: skipped as a whole
                for (int q = 0; q < min(QLO, DQ); q++)
                    BWDF_PIXEL(q, 1, 1);
                for (int q = QLO; q < QHI; q++)
                    BWDF_PIXEL(q, 1, 0);
                for (int q = max(QHI, QLO); q < DQ; q++)
                    BWDF_PIXEL(q, 1, 1);
            }
        }
    }
    float t[VK];
#pragma unroll
    for (int j = 0; j < KVB; j++) {
        const int k0 = (kv + j) * VK;
#pragma unroll
        for (int u = 0; u < BCB * RS; u++) {
            KST(acc[j][u], t);
            for (int l = 0; l < VK && k0 + l < DK; l++)
                BWDF_W(k0 + l, c * RS + u, t[l]);
        }
        if (c == 0) {
            KST(accb[j], t);
            for (int l = 0; l < VK && k0 + l < DK; l++)
                BWDF_B(k0 + l, t[l]);
        }
    }
}

#ifdef QB
// Weights as channel vectors: wt[(c*RS + t)*KP + k] = w[k][c][t] (zeros
// past DK), or with flip the forward weights of a stride-1 backward-data
// pass run as a forward convolution over dy (this shape's DC is the layer's
// K and DK its C): w[c][k][RS-1-t]. gws = (KP, DC*RS).
__kernel void dconv_wt(__global const float *w, const int offw, const int flip, __global float *wt)
{
    const int k = get_global_id(0);
    const int ct = get_global_id(1);
    if (k >= KP || ct >= DC * RS)
        return;
    const int c = ct / RS, t = ct - c * RS;
    float v = 0.0f;
    if (k < DK)
        v = flip ? w[offw + (c * DK + k) * RS + (RS - 1 - t)] : w[offw + (k * DC + c) * RS + t];
    wt[ct * KP + k] = v;
}

// Forward vectorised over output channels: a work-item holds QB output
// pixels of one row (a strip) for KVB channel vectors; every input value it
// reads multiplies KVB weight vectors. gws = (strips, P, N * KP/(VK*KVB)).
// A phase of a strided backward-data pass (dconv_wt_phases) also sets WOFF
// (its filters' offset in wt) and places output (p, q) at row p*OSH + OPH,
// column q*OSW + OPW of an OH x OW plane.
#ifndef WOFF
#define WOFF 0
#endif
#ifndef OSH
#define OSH 1
#define OSW 1
#define OPH 0
#define OPW 0
#define OH DP
#define OW DQ
#endif
// ZFILL (a 1x1 window's strided backward-data, OPH = OPW = 0): the dx
// positions no tap reaches are zeros, written by the work-item of the
// phase-0 values beside them: the other columns of its row, then the other
// OSH - 1 rows, over this strip's columns [q0*OSW, (q0+QB)*OSW) within OW
// (ZFILL_STORE: the values and the zeros of channel l's rows).
#define ZFILL_STORE(yr, l)                                                                             \
    {                                                                                                  \
        const int c1_ = (q0 + QB) * OSW < OW ? (q0 + QB) * OSW : OW;                                   \
        if (c1_ == (q0 + QB) * OSW) { /* the whole strip inside dx: unconditional (vector) stores */ \
            _Pragma("unroll") for (int jq = 0; jq < QB; jq++)                                          \
            {                                                                                          \
                (yr)[jq * OSW] = t[jq * VK + (l)];                                                     \
                _Pragma("unroll") for (int b = 1; b < OSW; b++)(yr)[jq * OSW + b] = 0.0f;              \
            }                                                                                          \
            for (int a = 1; a < OSH && p * OSH + a < OH; a++)                                          \
                _Pragma("unroll") for (int col = 0; col < QB * OSW; col++)(yr)[a * OW + col] = 0.0f;   \
        } else {                                                                                       \
            _Pragma("unroll") for (int jq = 0; jq < QB; jq++)                                          \
            {                                                                                          \
                if (q0 + jq < DQ)                                                                      \
                    (yr)[jq * OSW] = t[jq * VK + (l)];                                                 \
                _Pragma("unroll") for (int b = 1; b < OSW; b++)                                        \
                {                                                                                      \
                    if ((q0 + jq) * OSW + b < c1_)                                                     \
                        (yr)[jq * OSW + b] = 0.0f;                                                     \
                }                                                                                      \
            }                                                                                          \
            for (int a = 1; a < OSH && p * OSH + a < OH; a++)                                          \
                for (int col = q0 * OSW; col < c1_; col++)                                             \
                    (yr)[a * OW + col - q0 * OSW] = 0.0f;                                              \
        }                                                                                              \
    }
// CC: check the columns against the plane; Q0: the strip's first output
// column (a literal 0 for the first strip: its checks fold at compile time).
#define FWDK_TAPS(CC, Q0)                                                                              \
    _Pragma("unroll") for (int s = 0; s < DS; s++)                                                     \
    {                                                                                                  \
        veck wv_[KVB];                                                                                 \
        _Pragma("unroll") for (int j = 0; j < KVB; j++) wv_[j] = KLD(wc + (rr * DS + s) * KP + j * VK); \
        _Pragma("unroll") for (int jq = 0; jq < QB; jq++)                                              \
        {                                                                                              \
            const int col_ = ((Q0) + jq) * DSW - DPW + s;                                              \
            if (CC && (col_ < 0 || col_ >= DW))                                                        \
                continue;                                                                              \
            const veck xv_ = (veck)(xr[col_]);                                                         \
            _Pragma("unroll") for (int j = 0; j < KVB; j++) acc[j][jq] = fma(wv_[j], xv_, acc[j][jq]); \
        }                                                                                              \
    }

__kernel void dconv_fwdk(const int N, __global const float *x, const int offx, __global const float *wt,
                         __global const float *bias, const int offb, const int has_bias, const int relu,
                         __global float *y, const int offy)
{
    const int strip = get_global_id(0);
    const int p = get_global_id(1);
    const int z = get_global_id(2);
    const int NKB = KP / (VK * KVB);
    const int q0 = strip * QB;
    if (q0 >= DQ || p >= DP)
        return;
    const int n = z / NKB, kv = (z - n * NKB) * KVB;
    if (n >= N)
        return;
    const int inner = q0 * DSW - DPW >= 0 && (q0 + QB - 1) * DSW - DPW + DS <= DW && q0 + QB <= DQ;
    /* the first strip with only its left edge in the padding */
    const int first = q0 == 0 && (QB - 1) * DSW - DPW + DS <= DW && QB <= DQ;
    veck acc[KVB][QB];
#pragma unroll
    for (int j = 0; j < KVB; j++)
#pragma unroll
        for (int jq = 0; jq < QB; jq++)
            acc[j][jq] = (veck)(0.0f);
    for (int c = 0; c < DC; c++) {
        __global const float *xc = x + offx + (n * DC + c) * DH * DW;
        __global const float *wc = wt + WOFF + c * RS * KP + kv * VK;
#pragma unroll 1
        for (int rr = 0; rr < DR; rr++) {
            const int h = p * DSH - DPH + rr;
            if (h < 0 || h >= DH)
                continue;
            __global const float *xr = xc + h * DW;
            if (inner) {
                FWDK_TAPS(0, q0);
            } else if (first) {
                FWDK_TAPS(1, 0);
            } else {
                FWDK_TAPS(1, q0);
            }
        }
    }
    float t[QB * VK];
#pragma unroll
    for (int j = 0; j < KVB; j++) {
        const int k0 = (kv + j) * VK;
        float bt[VK];
        for (int l = 0; l < VK; l++)
            bt[l] = has_bias && k0 + l < DK ? bias[offb + k0 + l] : 0.0f;
        const veck bv = KLD(bt);
#pragma unroll
        for (int jq = 0; jq < QB; jq++) {
            veck o = acc[j][jq] + bv;
            if (relu)
                o = fmax(o, 0.0f);
            KST(o, t + jq * VK);
        }
        for (int l = 0; l < VK && k0 + l < DK; l++) {
            __global float *yr = y + offy + ((n * DK + k0 + l) * OH + p * OSH + OPH) * OW + q0 * OSW + OPW;
#ifdef ZFILL
            ZFILL_STORE(yr, l);
#else
#pragma unroll
            for (int jq = 0; jq < QB; jq++)
                if (q0 + jq < DQ)
                    yr[jq * OSW] = t[jq * VK + l];
#endif
        }
    }
}
#endif // QB
#endif // VK

#ifdef PHWT
// Strided backward-data by phases (src/ops/conv_direct.c, djit_bwdd_phases):
// the input positions h = a + DSH*i of one phase a (a < DSH; likewise
// columns, phase b) receive the taps r = a + DPH (mod DSH) only, from output
// rows i + (rmax - r)/DSH + mo (rmax the phase's largest tap, mo =
// (a + DPH - rmax) / DSH), so each phase is a stride-1 forward convolution of
// dy with a sub-window and padding -mo. This kernel lays every phase's
// filters out as dconv_wt does (channel vectors, KP = PHWT), phases one after
// the other: tap t = r*DS + s of output channel k goes to PHO[t] + k*PHK[t]
// (tables from the host, so no division here: a signed '/' and '%' pair
// gets an LLVM freeze, which oclgrind 21.10 cannot run).
// Built with the layer's shape; gws = (PHWT, DR*DS, DK).
__constant int pho[DR * DS] = {PHO};
__constant int phk[DR * DS] = {PHK};
__kernel void dconv_wt_phases(__global const float *w, const int offw, __global float *wt)
{
    const int kf = get_global_id(0); // the phase forms' output channel: the layer's input channel
    const int t = get_global_id(1);  // the tap r*DS + s
    const int k = get_global_id(2);  // the layer's output channel
    if (kf >= PHWT || t >= DR * DS || k >= DK)
        return;
    wt[pho[t] + k * phk[t] + kf] = kf < DC ? w[offw + (k * DC + kf) * RS + t] : 0.0f;
}
#endif // PHWT

#ifdef CB
#define FLOORDIV(a, b) ((a) >= 0 ? (a) / (b) : -((-(a) + (b)-1) / (b)))
#define EMIN FLOORDIV(DPW - DS + 1, DSW)      // smallest tap offset e / DSW
#define EMAX FLOORDIV(DSW - 1 + DPW, DSW)     // largest
#define DSPAN (EMAX - EMIN + QT)              // output columns a run reads
// (e = f + DPW - s is a multiple of DSW for the taps that reach phase f)
#define BWDD_TAPS(DV)                                                                                  \
    _Pragma("unroll") for (int f = 0; f < DSW; f++) _Pragma("unroll") for (int s = 0; s < DS; s++)   \
    {                                                                                                  \
        const int e = f + DPW - s;                                                                     \
        if ((e % DSW + DSW) % DSW != 0)                                                                \
            continue;                                                                                  \
        _Pragma("unroll") for (int v = 0; v < NV; v++)                                                 \
        {                                                                                              \
            const vecf dv = DV;                                                                        \
            _Pragma("unroll") for (int i = 0; i < CB; i++)                                             \
                acc[i][f][v] = fma(dv, (vecf)((wr + cofs[i])[s]), acc[i][f][v]);                       \
        }                                                                                              \
    }
// Backward-data: dx[n,c,h,w] = sum over k, r, s with h = p*DSH - DPH + r and
// w = q*DSW - DPW + s of dy[n,k,p,q] * w[k,c,r,s]. A work-item owns a run of
// DSW*QT input columns starting at w0 (a multiple of DSW*QT) split into DSW
// phases: phase f holds columns w0 + f + DSW*j, j < QT, and for those the
// taps s with (f + DPW - s) divisible by DSW reach output column
// q = w0/DSW + (f + DPW - s)/DSW + j; all of it fixed at compile time.
// gws = (runs per row, H, N * ceil(C/CB)).
__kernel void dconv_bwdd(const int N, __global const float *dy, const int offdy, __global const float *w, const int offw,
                         __global float *dx, const int offdx)
{
    const int run = get_global_id(0);
    const int h = get_global_id(1);
    const int z = get_global_id(2);
    const int NCB = (DC + CB - 1) / CB;
    const int WR = DSW * QT; // input columns per run
    if (run * WR >= DW || h >= DH)
        return;
    const int n = z / NCB, c0 = (z - n * NCB) * CB;
    if (n >= N)
        return;
    const int w0 = run * WR;
    const int qa = w0 / DSW; // output column of phase lane 0 before the tap offset (e / DSW)
    vecf acc[CB][DSW][NV];
#pragma unroll
    for (int i = 0; i < CB; i++)
#pragma unroll
        for (int f = 0; f < DSW; f++)
#pragma unroll
            for (int v = 0; v < NV; v++)
                acc[i][f][v] = (vecf)(0.0f);
    int cofs[CB]; /* as dconv_fwd's kofs */
#pragma unroll
    for (int i = 0; i < CB; i++)
        cofs[i] = min(c0 + i, DC - 1) * RS;
    float pr[DSPAN];
    const int lo = qa + EMIN;
    for (int k = 0; k < DK; k++) {
        __global const float *dk = dy + offdy + (n * DK + k) * DP * DQ;
        __global const float *wk = w + offw + k * DC * RS;
#pragma unroll 1
        for (int rr = 0; rr < DR; rr++) {
            const int hp = h + DPH - rr;
            if (hp < 0 || hp % DSH != 0)
                continue;
            const int p = hp / DSH;
            if (p >= DP)
                continue;
            __global const float *dg = dk + p * DQ;
            __global const float *wr = wk + rr * DS;
            const int at = ((n * DK + k) * DP + p) * DQ + lo; /* as in dconv_fwd */
            if (at >= 0 && at + DSPAN <= N * DK * DP * DQ) {
                BWDD_TAPS(GVEC(dg, qa + e / DSW + v * VW, 1, DQ));
            } else {
                ROW_COPY(pr, dg, lo, DSPAN, DQ);
                BWDD_TAPS(PVEC(pr, e / DSW - EMIN + v * VW, 1));
            }
        }
    }
#pragma unroll
    for (int i = 0; i < CB; i++) {
        const int c = c0 + i;
        if (c >= DC)
            break;
        __global float *xr = dx + offdx + ((n * DC + c) * DH + h) * DW + w0;
#if DSW == 1
#pragma unroll
        for (int v = 0; v < NV; v++) {
            if (w0 + (v + 1) * VW <= DW) {
                VST(acc[i][0][v], xr + v * VW);
            } else {
                float t[VW];
                VST(acc[i][0][v], t);
                for (int l = 0; l < VW && w0 + v * VW + l < DW; l++)
                    xr[v * VW + l] = t[l];
            }
        }
#else
        float t[DSW][QT];
#pragma unroll
        for (int f = 0; f < DSW; f++)
#pragma unroll
            for (int v = 0; v < NV; v++)
                VST(acc[i][f][v], t[f] + v * VW);
        for (int j = 0; j < QT; j++)
#pragma unroll
            for (int f = 0; f < DSW; f++)
                if (w0 + j * DSW + f < DW)
                    xr[j * DSW + f] = t[f][j];
#endif
    }
}
#endif // CB
