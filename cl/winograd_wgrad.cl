// Fused Winograd weight gradient for 3x3 filters, stride 1 (F(3x3, 2x2),
// alpha 4): dw = G^T [ sum over tiles (A dy A^T) .* (B^T d B) ] G, where d
// is the 4x4 input patch under a 2x2 tile of dy (Lavin & Gray's transforms
// for F(2x2,3x3) used the other way round). See src/ops/conv_wgrad.c.
//
// wg_f2: one work-item (local size 1) owns a contiguous range of tile
// groups, a group being VL tiles side by side in one tile row of one image
// (one lane of a float8 / float4 per tile). Per chunk of at most GC groups
// it transforms its input patches (all C channels) and dy tiles (all K
// channels) into its own slice of the scratch buffer, Vs[xi][c][t] and
// Us[xi][k][t] (t: GC*VL tiles, contiguous), then forms the 16 products
// M[xi] (K x C) += Us[xi] Vs[xi]^T over the chunk with 4x4 register blocks of
// vectors, and adds them to its partial M (16 x Kp x Cp floats). Nothing is
// shared between work-items: no barriers. wg_f2_out sums the partials and
// applies the output transform.
//
// Input and dy rows are read as float8 pieces whose even / odd elements are
// the tile columns (wg_phases), so any padding works.
//
// VR 2 (with VL 8), for outputs of at most 8 columns (4 tiles a row): a
// group is 4 tiles side by side in each of 2 tile rows (lanes 0-3 the first,
// 4-7 the second), so the products run on float8 rather than half-empty
// float4. A second row past the last tile row reads dy as zero and adds nothing.

#ifndef VL
#define VL 8 // tiles per group (vector lanes)
#endif
#ifndef VR
#define VR 1 // tile rows per group
#endif
#ifndef WG_PF
#define WG_PF 0 // 1: prefetch the next channel's rows (CPUs; clang's __builtin_prefetch)
#endif
#if VR != 1 && !(VR == 2 && VL == 8)
#error "VR 2 needs VL 8"
#endif

#if VL == 8
#define VF float8
#define VLOAD vload8
#define VSTORE vstore8
#elif VL == 4
#define VF float4
#define VLOAD vload4
#define VSTORE vstore4
#else
#error "VL must be 4 or 8"
#endif

#if VL == 8
// (a.s0 + a.s1, a.s2 + a.s3, b.s0 + b.s1, b.s2 + b.s3, then the same of lanes
// 4-7): AVX's in-lane horizontal add, one instruction on x86 CPUs. shuffle2
// rather than lane constructors such as (float8)(a.s0, a.s2, b.s0, ...):
// LLVM builds those from shuffles with undefined lanes, which oclgrind 21.10
// reports as uninitialised values (or crashes on).
static inline __attribute__((always_inline)) float8 wg_hadd(const float8 a, const float8 b)
{
    return shuffle2(a, b, (uint8)(0, 2, 8, 10, 4, 6, 12, 14)) + shuffle2(a, b, (uint8)(1, 3, 9, 11, 5, 7, 13, 15));
}

// The lane sums of a0..a3 (to sa) and of b0..b3 (to sb): 6 horizontal adds
// and two adds of 128-bit halves, 8 sums (an even + odd tree per 4 sums took
// about 12 operations, and the lane sums a sixth of the kernel at 64 channels).
static inline __attribute__((always_inline)) void wg_sum8(const float8 a0, const float8 a1, const float8 a2,
                                                         const float8 a3, const float8 b0, const float8 b1,
                                                         const float8 b2, const float8 b3, float4 *sa, float4 *sb)
{
    const float8 qa = wg_hadd(wg_hadd(a0, a1), wg_hadd(a2, a3)); // s0-s3: lanes 0-3 of a0..a3, s4-s7: lanes 4-7
    const float8 qb = wg_hadd(wg_hadd(b0, b1), wg_hadd(b2, b3));
    *sa = qa.lo + qa.hi;
    *sb = qb.lo + qb.hi;
}
#else
// (sum of a's lanes, of b's, of c's, of d's): even + odd lane additions.
// Every shuffle uses all its lanes (see wg_hadd).
static inline __attribute__((always_inline)) float4 wg_sum4(const float4 a, const float4 b, const float4 c, const float4 d)
{
    const float8 u = (float8)(a.even, b.even, c.even, d.even) + (float8)(a.odd, b.odd, c.odd, d.odd);
    return u.even + u.odd;
}
#endif

// Row r of a plane (rows x n floats at p) read from column w0 as the two
// column phases of nl = 4 or 8 tiles, d0[l] = row[w0 + 2l], d1[l] = row[w0 + 2l + 1]
// (the phases at w0 + 2 come from a second call), zero outside the row or
// for an invalid row. Inside the plane: float8 loads (they may run into the
// neighbouring rows) masked to the row (16-wide loads and selects trip
// oclgrind's uninitialised-value tracking); at the plane's edges element by
// element. Lanes past nl are left unset.
static inline __attribute__((always_inline)) void wg_row(__global const float *p, const int rows, const int n,
                                                         const int r, const int w0, const int nl, float8 *d0,
                                                         float8 *d1)
{
    if (r < 0 || r >= rows) {
        *d0 = *d1 = (float8)(0.0f);
        return;
    }
    const int base = r * n + w0;
    if (base >= 0 && base + 2 * nl <= rows * n) {
        const int8 iota8 = (int8)(0, 1, 2, 3, 4, 5, 6, 7);
#define LDM8(off) select((float8)(0.0f), vload8(0, p + base + (off)), (w0 + (off) + iota8 >= 0) & (w0 + (off) + iota8 < n))
        const float8 A0 = LDM8(0);
        if (nl == 8) {
            const float8 A1 = LDM8(8);
            *d0 = (float8)(A0.even, A1.even);
            *d1 = (float8)(A0.odd, A1.odd);
        } else {
            *d0 = (float8)(A0.even, A0.even);
            *d1 = (float8)(A0.odd, A0.odd);
        }
#undef LDM8
        return;
    }
    float e[8], o[8];
    for (int l = 0; l < 8; l++) {
        const int c0 = w0 + 2 * l, c1 = c0 + 1;
        e[l] = l < nl && c0 >= 0 && c0 < n ? p[r * n + c0] : 0.0f;
        o[l] = l < nl && c1 >= 0 && c1 < n ? p[r * n + c1] : 0.0f;
    }
    *d0 = vload8(0, e);
    *d1 = vload8(0, o);
}

// The two column phases of a group's row r (VR 2: row r of the first tile
// row in lanes 0-3, row r + 2 of the second in lanes 4-7).
static inline __attribute__((always_inline)) void wg_phases(__global const float *p, const int rows, const int n,
                                                            const int r, const int w0, VF *d0, VF *d1)
{
#if VR == 2
    // (shuffle2: joined as (float8)(a.lo, b.lo), every transform written
    // from them was "uninitialized" to oclgrind 21.10; through private
    // arrays, two 16-byte stores fed one 32-byte load, which store
    // forwarding does not serve)
    float8 a0, a1, b0, b1;
    wg_row(p, rows, n, r, w0, 4, &a0, &a1);
    wg_row(p, rows, n, r + 2, w0, 4, &b0, &b1);
    const uint8 lo2 = (uint8)(0, 1, 2, 3, 8, 9, 10, 11);
    *d0 = shuffle2(a0, b0, lo2);
    *d1 = shuffle2(a1, b1, lo2);
#else
    float8 a0, a1;
    wg_row(p, rows, n, r, w0, VL, &a0, &a1);
#if VL == 8
    *d0 = a0;
    *d1 = a1;
#else
    *d0 = a0.lo;
    *d1 = a1.lo;
#endif
#endif
}

// Input patch rows of one channel for a group: o[a][b] = (B^T d B)[a][b] per lane.
// x: the channel's plane (H x W), r0: first patch row (may be < 0), w0: first
// patch column of the group's first tile (2*tw0 - pad_w).
static inline __attribute__((always_inline)) void wg_input(__global const float *x, const int H, const int W,
                                                           const int r0, const int w0, VF o[4][4])
{
    VF t[4][4]; // t[i][b]: row i of the patch, B^T applied along the columns
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        VF d0, d1, d2, d3; // patch columns 0..3 of each lane's tile
        wg_phases(x, H, W, r0 + i, w0, &d0, &d1);
        wg_phases(x, H, W, r0 + i, w0 + 2, &d2, &d3);
        t[i][0] = d0 - d2;
        t[i][1] = d1 + d2;
        t[i][2] = d2 - d1;
        t[i][3] = d1 - d3;
    }
    #pragma unroll
    for (int b = 0; b < 4; b++) {
        o[0][b] = t[0][b] - t[2][b];
        o[1][b] = t[1][b] + t[2][b];
        o[2][b] = t[2][b] - t[1][b];
        o[3][b] = t[1][b] - t[3][b];
    }
}

// dy tile of one channel for a group: o = A' dy A'^T, A' rows (1,0), (1,1),
// (1,-1), (0,1) (A's last row with its sign flipped; wg_f2_out flips it back).
static inline __attribute__((always_inline)) void wg_dy(__global const float *d, const int P, const int Q, const int r0, const int c0, VF o[4][4])
{
    VF t[2][4];
    #pragma unroll
    for (int i = 0; i < 2; i++) {
        VF E, O;
        wg_phases(d, P, Q, r0 + i, c0, &E, &O);
        t[i][0] = E;
        t[i][1] = E + O;
        t[i][2] = E - O;
        t[i][3] = O;
    }
    #pragma unroll
    for (int b = 0; b < 4; b++) {
        o[0][b] = t[0][b];
        o[1][b] = t[0][b] + t[1][b];
        o[2][b] = t[0][b] - t[1][b];
        o[3][b] = t[1][b];
    }
}

// Zeroes the scratch's padding rows (channels C .. Cp - 1 of Vs, K .. Kp - 1
// of Us, transform points XV / XU floats apart), which then stay zero, and
// the partial M (nm floats: nxi x Kp x Cp, then Kp of the bias) only where
// the work-item has no tiles (the first chunk's products store rather than
// add: no pass over a zeroed M).
static inline void wg_zero(__global float *M, __global float *Vs, __global float *Us, const size_t XV,
                           const size_t XU, const int TC, const int nxi, const int C, const int K, const int Cp,
                           const int Kp, const int nm, const int empty)
{
    if (empty)
        for (int i = 0; i < nm; i++)
            M[i] = 0.0f;
    for (int xi = 0; xi < nxi; xi++) {
        for (int c = C; c < Cp; c++)
            for (int t = 0; t < TC; t++)
                Vs[xi * XV + (size_t)c * TC + t] = 0.0f;
        for (int k = K; k < Kp; k++)
            for (int t = 0; t < TC; t++)
                Us[xi * XU + (size_t)k * TC + t] = 0.0f;
    }
}

// The bias gradient's share of a chunk: Mb[k] (+)= the sum over its nt
// tiles of the dy transform's point (1, 1), which is each tile's sum of dy
// (A's row (1, 1, ..) on both sides; tiles past the edges or the batch read
// dy as zero), kept as VL lane sums (Mb: K x VL floats; the output stage
// adds the lanes: no horizontal sum here, where oclgrind 21.10 crashed on
// the one LLVM made of it). Ub: that point's rows, TC floats apart.
static inline __attribute__((always_inline)) void wg_bias(__global const float *Ub, const int TC, const int nt,
                                                          const int K, __global float *Mb, const int first)
{
    for (int k = 0; k < K; k++) {
        __global const float *u = Ub + (size_t)k * TC;
        VF a = first ? (VF)(0.0f) : VLOAD(0, Mb + (size_t)k * VL);
        for (int t = 0; t < nt; t += VL)
            a += VLOAD(0, u + t);
        VSTORE(a, 0, Mb + (size_t)k * VL);
    }
}

// The chunk's products: M[xi] (K x C) += Us[xi] Vs[xi]^T over its nt tiles
// for nxi transform points (XU, XV floats apart; rows TC floats apart),
// 4x4 register blocks of vectors, lane sums added to the partial M (stored
// into it for the work-item's first chunk, first != 0).
static inline __attribute__((always_inline)) void wg_products(__global const float *Us, __global const float *Vs,
                                                              const size_t XU, const size_t XV, const int TC,
                                                              const int nt, __global float *M, const int nxi,
                                                              const int Kp, const int Cp, const int first)
{
    for (int xi = 0; xi < nxi; xi++)
        for (int kb = 0; kb < Kp; kb += 4) {
            __global const float *u = Us + xi * XU + (size_t)kb * TC;
            for (int cb = 0; cb < Cp; cb += 4) {
                __global const float *v = Vs + xi * XV + (size_t)cb * TC;
                VF acc[4][4];
                #pragma unroll
                for (int i = 0; i < 4; i++)
                    #pragma unroll
                    for (int j = 0; j < 4; j++)
                        acc[i][j] = (VF)(0.0f);
                for (int t = 0; t < nt; t += VL) {
                    VF uv[4], vv[4];
                    #pragma unroll
                    for (int i = 0; i < 4; i++) {
                        uv[i] = VLOAD(0, u + (size_t)i * TC + t);
                        vv[i] = VLOAD(0, v + (size_t)i * TC + t);
                    }
                    #pragma unroll
                    for (int i = 0; i < 4; i++)
                        #pragma unroll
                        for (int j = 0; j < 4; j++)
                            acc[i][j] = fma(uv[i], vv[j], acc[i][j]);
                }
                __global float *m = M + ((size_t)xi * Kp + kb) * Cp + cb;
#if VL == 8
                #pragma unroll
                for (int i = 0; i < 4; i += 2) {
                    float4 sa, sb;
                    wg_sum8(acc[i][0], acc[i][1], acc[i][2], acc[i][3], acc[i + 1][0], acc[i + 1][1],
                            acc[i + 1][2], acc[i + 1][3], &sa, &sb);
                    if (first) {
                        vstore4(sa, 0, m + i * Cp);
                        vstore4(sb, 0, m + (i + 1) * Cp);
                    } else {
                        vstore4(vload4(0, m + i * Cp) + sa, 0, m + i * Cp);
                        vstore4(vload4(0, m + (i + 1) * Cp) + sb, 0, m + (i + 1) * Cp);
                    }
                }
#else
                #pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float4 sum = wg_sum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
                    vstore4(first ? sum : vload4(0, m + i * Cp) + sum, 0, m + i * Cp);
                }
#endif
            }
        }
}

// The output stage's shared ends: db[k] (+)= the sum over the work-items'
// partials (PS floats each) of their `lanes` bias lane sums of channel k, `at`
// floats in; dw[k][c4 + l] (+)= v[.][l] for the work-item's 4 channels. Both
// as beta == 0 ? sum : beta*old + sum (beta 0: the old contents not read).
static inline void wg_out_bias(__global const float *part, const int nw, const int PS, const size_t at,
                               const int lanes, const int k, const float beta, __global float *db, const int offdb)
{
    float sb = 0.0f;
    for (int w = 0; w < nw; w++)
        for (int l = 0; l < lanes; l++)
            sb += part[(size_t)w * PS + at + (size_t)k * lanes + l];
    db[offdb + k] = beta == 0.0f ? sb : fma(beta, db[offdb + k], sb);
}

static inline __attribute__((always_inline)) void wg_out_store(float v[9][4], const int C, const int c4,
                                                               const int k, const float beta, __global float *dw,
                                                               const int offdw)
{
    for (int l = 0; l < 4 && c4 + l < C; l++) {
        __global float *d = dw + offdw + ((size_t)k * C + c4 + l) * 9;
        #pragma unroll
        for (int e = 0; e < 9; e++)
            d[e] = beta == 0.0f ? v[e][l] : fma(beta, d[e], v[e][l]);
    }
}

// dw[k][c] = beta*dw + G'^T (sum_w part[w][xi][k][c]) G' (3x3), G' = G with
// its last row negated (see wg_dy), for 4 channels c = 4*i .. 4*i + 3 per
// work-item (float4 loads; the 16 sums over the work-items' partials are
// independent chains); work-items of channels 0..3 also sum the bias
// partials (BIAS: K x VL lane sums after each partial's products, PS floats
// per work-item) into db[k]. gws = (Cp / 4, K).
static inline __attribute__((always_inline)) void wg2_out_at(__global const float *part, const int nw,
                                                             const int K, const int C, const int Kp, const int Cp,
                                                             const float beta, __global float *dw, const int offdw,
                                                             const int PS, const int BIAS, __global float *db,
                                                             const int offdb, const int c4, const int k)
{
    if (BIAS && c4 == 0)
        wg_out_bias(part, nw, PS, (size_t)16 * Kp * Cp, VL, k, beta, db, offdb);
    float4 m[4][4];
    #pragma unroll
    for (int a = 0; a < 4; a++)
        #pragma unroll
        for (int b = 0; b < 4; b++)
            m[a][b] = (float4)(0.0f);
    for (int w = 0; w < nw; w++) {
        __global const float *p = part + (size_t)w * PS + (size_t)k * Cp + c4;
        #pragma unroll
        for (int a = 0; a < 4; a++)
            #pragma unroll
            for (int b = 0; b < 4; b++)
                m[a][b] += vload4(0, p + (size_t)(a * 4 + b) * Kp * Cp);
    }
    float4 t[3][4]; // G'^T m
    #pragma unroll
    for (int b = 0; b < 4; b++) {
        t[0][b] = m[0][b] + 0.5f * (m[1][b] + m[2][b]);
        t[1][b] = 0.5f * (m[1][b] - m[2][b]);
        t[2][b] = 0.5f * (m[1][b] + m[2][b]) - m[3][b];
    }
    float v[9][4]; // v[r * 3 + s][lane]
    #pragma unroll
    for (int r = 0; r < 3; r++) {
        vstore4(t[r][0] + 0.5f * (t[r][1] + t[r][2]), 0, v[r * 3]);
        vstore4(0.5f * (t[r][1] - t[r][2]), 0, v[r * 3 + 1]);
        vstore4(0.5f * (t[r][1] + t[r][2]) - t[r][3], 0, v[r * 3 + 2]);
    }
    wg_out_store(v, C, c4, k, beta, dw, offdw);
}

// x: N x C x H x W (from offx), dy: N x K x P x Q (from offdy); TH rows of
// groups per image (tile rows / VR), TWG groups per row, G groups in all, split evenly over the
// work-items; scratch: sws floats per work-item (16*(Cp+Kp)*GC*VL), part:
// PS floats per work-item (16*Kp*Cp, then K*VL of the bias with BIAS). Cp, Kp:
// C, K rounded up to 4. OUTF (one work-item only): also writes dw (and db)
// as wg_f2_out would.
__kernel void wg_f2(__global const float *x, const int offx, __global const float *dy, const int offdy, const int C,
                    const int H, const int W, const int K, const int P, const int Q, const int pad_h, const int pad_w, const int TH,
                    const int TWG, const int G, const int GC, const int Cp, const int Kp, __global float *scratch,
                    const int sws, __global float *part, const int PS, const int BIAS, const int OUTF,
                    const float beta, __global float *dw, const int offdw, __global float *db, const int offdb)
{
    const int w = get_global_id(0), nw = get_global_size(0);
    const int g0 = (int)((long)G * w / nw), g1 = (int)((long)G * (w + 1) / nw);
    const int TC = GC * VL + VL; // floats per scratch row: GC*VL tiles, skewed so rows of a transform point do not
                                 // fall 4 KiB apart (cache-set conflicts)
    __global float *Vs = scratch + (size_t)w * sws;
    __global float *Us = Vs + (size_t)16 * Cp * TC;
    __global float *M = part + (size_t)w * PS;
    wg_zero(M, Vs, Us, (size_t)Cp * TC, (size_t)Kp * TC, TC, 16, C, K, Cp, Kp, 16 * Kp * Cp + (BIAS ? K * VL : 0),
            g0 >= g1);
    const int PQ = P * Q, HW = H * W;
    for (int gs = g0; gs < g1; gs += GC) {
        const int gc = min(GC, g1 - gs);
        // channel by channel, each over the chunk's groups: the rows of one
        // plane are read in order (one stream for the prefetcher)
        const int n0 = gs / (TH * TWG), r0 = gs - n0 * (TH * TWG), th0 = r0 / TWG, tw0 = r0 - th0 * TWG;
        VF o[4][4];
        for (int c = 0; c < C + K; c++) {
            int n = n0, th = th0, twg = tw0;
            const int isx = c < C;
            __global float *dst = isx ? Vs + (size_t)c * TC : Us + (size_t)(c - C) * TC;
            const size_t xs = isx ? (size_t)Cp * TC : (size_t)Kp * TC; // floats between transform points
            for (int gl = 0; gl < gc; gl++) {
#if WG_PF && defined(__clang__)
                // at each tile row, the next channel's rows under it: from
                // memory while this channel is transformed (the hardware
                // prefetcher misses the start of each plane's short stream)
                if (twg == 0 && c + 1 < C + K) {
                    const int nx = c + 1 < C;
                    __global const float *q = nx ? x + offx + ((size_t)n * C + c + 1) * HW
                                                 : dy + offdy + ((size_t)n * K + c + 1 - C) * PQ;
                    const int rw = nx ? W : Q, f0 = (nx ? max(2 * VR * th - pad_h, 0) : 2 * VR * th) * rw;
                    const int f1 = min(f0 + (2 * VR + 2) * rw, nx ? HW : PQ);
                    for (int f = f0; f < f1; f += 16)
                        __builtin_prefetch(q + f, 0, 3);
                }
#endif
                if (isx)
                    wg_input(x + offx + ((size_t)n * C + c) * HW, H, W, 2 * VR * th - pad_h, twg * 2 * (VL / VR) - pad_w, o);
                else
                    wg_dy(dy + offdy + ((size_t)n * K + c - C) * PQ, P, Q, 2 * VR * th, twg * 2 * (VL / VR), o);
                #pragma unroll
                for (int a = 0; a < 4; a++)
                    #pragma unroll
                    for (int b = 0; b < 4; b++)
                        VSTORE(o[a][b], 0, dst + (a * 4 + b) * xs + gl * VL);
                if (++twg == TWG) {
                    twg = 0;
                    if (++th == TH) {
                        th = 0;
                        n++;
                    }
                }
            }
        }
        if (BIAS) // point (1, 1): 1 * 4 + 1
            wg_bias(Us + (size_t)5 * Kp * TC, TC, gc * VL, K, M + (size_t)16 * Kp * Cp, gs == g0);
        wg_products(Us, Vs, (size_t)Kp * TC, (size_t)Cp * TC, TC, gc * VL, M, 16, Kp, Cp, gs == g0);
    }
    if (OUTF) // one work-item (nw 1): its partial is the sum; wg_f2_out's work here, one launch fewer
        for (int k = 0; k < K; k++)
            for (int c4 = 0; c4 < C; c4 += 4)
                wg2_out_at(part, 1, K, C, Kp, Cp, beta, dw, offdw, PS, BIAS, db, offdb, c4, k);
}

__kernel void wg_f2_out(__global const float *part, const int nw, const int K, const int C, const int Kp,
                        const int Cp, const float beta, __global float *dw, const int offdw, const int PS,
                        const int BIAS, __global float *db, const int offdb)
{
    const int c4 = 4 * get_global_id(0), k = get_global_id(1);
    if (c4 < C && k < K)
        wg2_out_at(part, nw, K, C, Kp, Cp, beta, dw, offdw, PS, BIAS, db, offdb, c4, k);
}

// ---- F(3x3, 4x4), alpha 6 ----
// dw = G^T [ sum over tiles (A dy A^T) .* (B^T d B) ] G with F(4x4,3x3)'s
// matrices (points 0, +-1, +-2, inf) used the other way round: A (6x4, the
// forward's output transform transposed) on the 4x4 dy tiles, B^T on the 6x6
// input patches, G^T (3x6) on the summed products. 36 products per 4x4 tile
// (2.25 per output position against 4 for F(3x3, 2x2)).
//
// wg_f4: the structure of wg_f2 (per-work-item chunks, scratch, partials
// of 36 x Kp x Cp, no barriers) with groups of 8 tiles (float8 lanes) made of
// VR4 segments of S4 = 8 / VR4 tiles side by side; segment s covers tile row
// gtr = grp * VR4 + s counted over the whole batch (n = gtr / TH), so outputs
// of 8 or 16 columns (2 or 4 tiles a row) still fill the lanes, across
// images where an image has fewer tile rows. Segments past the batch read
// as zero. wg_f4_out sums the partials and applies G^T . G.
// Compiled where the host defines VR4 (segments, i.e. tile rows, per
// group: 1, 2 or 4), with VL 8.
#ifdef VR4
#define S4 (8 / VR4) // tiles per segment

#if (VR4 != 1 && VR4 != 2 && VR4 != 4) || VL != 8
#error "VR4 must be 1, 2 or 4, with VL 8"
#endif

// Row r of a plane (rows x n floats at p) from column w0 as the np (4 or 6)
// column phases of S4 tiles 4 columns apart: ph[j][l] = row[w0 + 4l + j]
// for lanes l < S4 (the other lanes hold other values), zero outside the
// row or for an invalid row. Phases 4 and 5 are phases 0 and 1 one lane on,
// the last lane's from one more load. As wg_row: masked float8 loads inside
// the plane, element by element for a piece across its first or last
// element, no load for a piece past the row; deinterleaved with shuffle2.
static inline __attribute__((always_inline)) void wg4_row(__global const float *p, const int rows, const int n,
                                                          const int r, const int w0, const int np, float8 ph[6])
{
    if (r < 0 || r >= rows) {
        ph[0] = ph[1] = ph[2] = ph[3] = ph[4] = ph[5] = (float8)(0.0f);
        return;
    }
    const int base = r * n + w0, nl = np == 6 ? S4 / 2 + 1 : S4 / 2; // float8 pieces
    const int8 iota8 = (int8)(0, 1, 2, 3, 4, 5, 6, 7);
    float8 A[S4 / 2 + 1];
    #pragma unroll
    for (int i = 0; i < S4 / 2 + 1; i++) {
        if (i >= nl)
            continue;
        const int c0 = w0 + 8 * i;
        if (c0 >= n || c0 + 8 <= 0) {
            A[i] = (float8)(0.0f);
        } else if (base + 8 * i >= 0 && base + 8 * i + 8 <= rows * n) {
            A[i] = select((float8)(0.0f), vload8(0, p + base + 8 * i), (c0 + iota8 >= 0) & (c0 + iota8 < n));
        } else { // at the plane's first or last columns: element by element
            float e[8];
            for (int l = 0; l < 8; l++)
                e[l] = c0 + l >= 0 && c0 + l < n ? p[r * n + c0 + l] : 0.0f;
            A[i] = vload8(0, e);
        }
    }
#if S4 == 2
    ph[0] = shuffle(A[0], (uint8)(0, 4, 0, 4, 0, 4, 0, 4));
    ph[1] = shuffle(A[0], (uint8)(1, 5, 1, 5, 1, 5, 1, 5));
    ph[2] = shuffle(A[0], (uint8)(2, 6, 2, 6, 2, 6, 2, 6));
    ph[3] = shuffle(A[0], (uint8)(3, 7, 3, 7, 3, 7, 3, 7));
#else
    const uint8 m01 = (uint8)(0, 4, 8, 12, 1, 5, 9, 13), m23 = (uint8)(2, 6, 10, 14, 3, 7, 11, 15);
    const float8 x01 = shuffle2(A[0], A[1], m01), x23 = shuffle2(A[0], A[1], m23);
#if S4 == 4
    const uint8 hi = (uint8)(4, 5, 6, 7, 4, 5, 6, 7);
    ph[0] = x01;
    ph[1] = shuffle(x01, hi);
    ph[2] = x23;
    ph[3] = shuffle(x23, hi);
#else
    const float8 y01 = shuffle2(A[2], A[3], m01), y23 = shuffle2(A[2], A[3], m23);
    const uint8 lo2 = (uint8)(0, 1, 2, 3, 8, 9, 10, 11), hi2 = (uint8)(4, 5, 6, 7, 12, 13, 14, 15);
    ph[0] = shuffle2(x01, y01, lo2);
    ph[1] = shuffle2(x01, y01, hi2);
    ph[2] = shuffle2(x23, y23, lo2);
    ph[3] = shuffle2(x23, y23, hi2);
#endif
#endif
    if (np == 6) { // lane l: phase 0 / 1 of lane l + 1; the last lane's from columns 4 * S4, 4 * S4 + 1
#if S4 == 8
        ph[4] = shuffle2(ph[0], A[S4 / 2], (uint8)(1, 2, 3, 4, 5, 6, 7, 8));
        ph[5] = shuffle2(ph[1], A[S4 / 2], (uint8)(1, 2, 3, 4, 5, 6, 7, 9));
#elif S4 == 4
        ph[4] = shuffle2(ph[0], A[S4 / 2], (uint8)(1, 2, 3, 8, 1, 2, 3, 8));
        ph[5] = shuffle2(ph[1], A[S4 / 2], (uint8)(1, 2, 3, 9, 1, 2, 3, 9));
#else
        ph[4] = shuffle2(ph[0], A[S4 / 2], (uint8)(1, 8, 1, 8, 1, 8, 1, 8));
        ph[5] = shuffle2(ph[1], A[S4 / 2], (uint8)(1, 9, 1, 9, 1, 9, 1, 9));
#endif
    }
}

// The np column phases of a group's row i: segment s reads row r0[s] + i
// of its plane pl[s] (lanes s*S4 .. s*S4 + S4 - 1).
static inline __attribute__((always_inline)) void wg4_phases(__global const float *const pl[VR4], const int rows,
                                                             const int n, const int r0[VR4], const int i,
                                                             const int w0, const int np, float8 ph[6])
{
#if VR4 == 1
    wg4_row(pl[0], rows, n, r0[0] + i, w0, np, ph);
#else
    float8 a[6], b[6];
    wg4_row(pl[0], rows, n, r0[0] + i, w0, np, a);
    wg4_row(pl[1], rows, n, r0[1] + i, w0, np, b);
#if VR4 == 2
    const uint8 lo2 = (uint8)(0, 1, 2, 3, 8, 9, 10, 11);
    #pragma unroll
    for (int j = 0; j < 6; j++)
        if (j < np)
            ph[j] = shuffle2(a[j], b[j], lo2);
#else
    float8 c[6], d[6];
    wg4_row(pl[2], rows, n, r0[2] + i, w0, np, c);
    wg4_row(pl[3], rows, n, r0[3] + i, w0, np, d);
    const uint8 m2 = (uint8)(0, 1, 8, 9, 2, 3, 10, 11), lo2 = (uint8)(0, 1, 2, 3, 8, 9, 10, 11);
    #pragma unroll
    for (int j = 0; j < 6; j++)
        if (j < np)
            ph[j] = shuffle2(shuffle2(a[j], b[j], m2), shuffle2(c[j], d[j], m2), lo2);
#endif
#endif
}

// o[0..5] = B^T d for one line of 6 values (F(4x4,3x3)'s input transform).
#define WG4_BT(d0, d1, d2, d3, d4, d5, o)                                                                    \
    do {                                                                                                       \
        const float8 p_ = fma(-4.0f, d2, d4), q_ = fma(-4.0f, d1, d3), r_ = d4 - d2, u_ = 2.0f * (d3 - d1); \
        o[0] = fma(4.0f, d0, fma(-5.0f, d2, d4));                                                            \
        o[1] = p_ + q_;                                                                                        \
        o[2] = p_ - q_;                                                                                        \
        o[3] = r_ + u_;                                                                                        \
        o[4] = r_ - u_;                                                                                        \
        o[5] = fma(4.0f, d1, fma(-5.0f, d3, d5));                                                            \
    } while (0)

// o[0..5] = A e for one line of 4 values (A: rows (1,0,0,0), (1,1,1,1),
// (1,-1,1,-1), (1,2,4,8), (1,-2,4,-8), (0,0,0,1)).
#define WG4_A(e0, e1, e2, e3, o)                                                                             \
    do {                                                                                                       \
        const float8 a_ = e0 + e2, b_ = e1 + e3, c_ = fma(4.0f, e2, e0), d_ = 2.0f * fma(4.0f, e3, e1);     \
        o[0] = e0;                                                                                             \
        o[1] = a_ + b_;                                                                                        \
        o[2] = a_ - b_;                                                                                        \
        o[3] = c_ + d_;                                                                                        \
        o[4] = c_ - d_;                                                                                        \
        o[5] = e3;                                                                                             \
    } while (0)

// Transform of one channel for a group, stored to dst (36 points xs floats
// apart): the input patch B^T d B (isx) or the dy tile A dy A^T.
static inline __attribute__((always_inline)) void wg4_transform(__global const float *const pl[VR4], const int rows,
                                                                const int n, const int r0[VR4], const int w0,
                                                                const int isx, __global float *dst, const size_t xs)
{
    float8 t[6][6]; // t[i][b]: row i, transformed along the columns
    if (isx) {
        #pragma unroll
        for (int i = 0; i < 6; i++) {
            float8 d[6];
            wg4_phases(pl, rows, n, r0, i, w0, 6, d);
            WG4_BT(d[0], d[1], d[2], d[3], d[4], d[5], t[i]);
        }
        #pragma unroll
        for (int b = 0; b < 6; b++) {
            float8 o[6];
            WG4_BT(t[0][b], t[1][b], t[2][b], t[3][b], t[4][b], t[5][b], o);
            #pragma unroll
            for (int a = 0; a < 6; a++)
                vstore8(o[a], 0, dst + (a * 6 + b) * xs);
        }
    } else {
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            float8 e[6];
            wg4_phases(pl, rows, n, r0, i, w0, 4, e);
            WG4_A(e[0], e[1], e[2], e[3], t[i]);
        }
        #pragma unroll
        for (int b = 0; b < 6; b++) {
            float8 o[6];
            WG4_A(t[0][b], t[1][b], t[2][b], t[3][b], o);
            #pragma unroll
            for (int a = 0; a < 6; a++)
                vstore8(o[a], 0, dst + (a * 6 + b) * xs);
        }
    }
}

// The transforms of channel c of plane set src (CH channels of rows x n,
// the input when isx, else dy) for the chunk's groups gs .. gs + gc - 1 (a
// compile-time isx after inlining: no per-row tests of it).
static inline __attribute__((always_inline)) void wg4_chan(const int isx, __global const float *src, const int CH,
                                                           const int c, const int rows, const int n, const int ph,
                                                           const int pw, const int TH, const int TWG, const int NTH,
                                                           const int gs, const int gc, __global float *dst,
                                                           const size_t xs)
{
    for (int gl = 0; gl < gc; gl++) {
        const int g = gs + gl, grp = g / TWG, twg = g - grp * TWG;
        __global const float *pl[VR4];
        int r0[VR4];
        #pragma unroll
        for (int s = 0; s < VR4; s++) {
            const int gtr = grp * VR4 + s, im = gtr / TH, th = gtr - im * TH, ok = gtr < NTH;
            pl[s] = src + ((size_t)(ok ? im : 0) * CH + c) * rows * n;
            r0[s] = ok ? 4 * th - ph : -(1 << 20);
        }
#if WG_PF && defined(__clang__)
        // the next channel's rows under the group, from memory while this
        // one is transformed (the transforms otherwise wait on these loads)
        if (c + 1 < CH) {
            const int w0 = twg * 4 * S4 - pw, a = max(w0, 0), e = min(w0 + 4 * S4 + (isx ? 2 : 0), n);
            #pragma unroll
            for (int s = 0; s < VR4; s++)
                for (int i = 0; i < (isx ? 6 : 4); i++) {
                    const int r = r0[s] + i;
                    if (r >= 0 && r < rows && a < e) {
                        __global const float *q = pl[s] + (size_t)rows * n + (size_t)r * n;
                        for (int f = a; f < e; f += 16)
                            __builtin_prefetch(q + f, 0, 3);
                        __builtin_prefetch(q + e - 1, 0, 3);
                    }
                }
        }
#endif
        wg4_transform(pl, rows, n, r0, twg * 4 * S4 - pw, isx, dst + gl * 8, xs);
    }
}

// o[0..2] = G^T m for one line of 6 values (G^T rows (1/4, -1/6, -1/6,
// 1/24, 1/24, 0), (0, -1/6, 1/6, 1/12, -1/12, 0), (0, -1/6, -1/6, 1/6, 1/6, 1)).
#define WG4_GT(m0, m1, m2, m3, m4, m5, o)                                                                    \
    do {                                                                                                       \
        const float4 s12_ = m1 + m2, d12_ = m1 - m2, s34_ = m3 + m4, d34_ = m3 - m4;                         \
        o[0] = 0.25f * m0 - (1.0f / 6.0f) * s12_ + (1.0f / 24.0f) * s34_;                                   \
        o[1] = (1.0f / 12.0f) * d34_ - (1.0f / 6.0f) * d12_;                                                 \
        o[2] = (1.0f / 6.0f) * (s34_ - s12_) + m5;                                                           \
    } while (0)

// dw[k][c] = beta*dw + G^T (sum_w part[w][xi][k][c]) G (3x3) for 4 channels
// c = 4*i .. 4*i + 3 per work-item, and the bias as wg_f2_out. gws = (Cp / 4, K).
static inline __attribute__((always_inline)) void wg4_out_at(__global const float *part, const int nw,
                                                             const int K, const int C, const int Kp, const int Cp,
                                                             const float beta, __global float *dw, const int offdw,
                                                             const int PS, const int BIAS, __global float *db,
                                                             const int offdb, const int c4, const int k)
{
    if (BIAS && c4 == 0)
        wg_out_bias(part, nw, PS, (size_t)36 * Kp * Cp, 8, k, beta, db, offdb);
    float4 t[3][6]; // G^T m, column by column
    #pragma unroll
    for (int b = 0; b < 6; b++) {
        float4 m[6];
        #pragma unroll
        for (int a = 0; a < 6; a++)
            m[a] = (float4)(0.0f);
        for (int w = 0; w < nw; w++) {
            __global const float *p = part + (size_t)w * PS + (size_t)k * Cp + c4;
            #pragma unroll
            for (int a = 0; a < 6; a++)
                m[a] += vload4(0, p + (size_t)(a * 6 + b) * Kp * Cp);
        }
        float4 o[3];
        WG4_GT(m[0], m[1], m[2], m[3], m[4], m[5], o);
        #pragma unroll
        for (int r = 0; r < 3; r++)
            t[r][b] = o[r];
    }
    float v[9][4]; // v[r * 3 + s][lane]
    #pragma unroll
    for (int r = 0; r < 3; r++) {
        float4 o[3];
        WG4_GT(t[r][0], t[r][1], t[r][2], t[r][3], t[r][4], t[r][5], o);
        #pragma unroll
        for (int s = 0; s < 3; s++)
            vstore4(o[s], 0, v[r * 3 + s]);
    }
    wg_out_store(v, C, c4, k, beta, dw, offdw);
}

// x: N x C x H x W (from offx), dy: N x K x P x Q (from offdy); TH tile rows
// per image, NTH = N * TH in all, TWG groups per group row, G groups in all,
// split evenly over the work-items; scratch: sws floats per work-item
// (36 * (XV + XU), see below), part: PS floats per work-item (36*Kp*Cp, then
// K*8 of the bias with BIAS); OUTF as wg_f2.
__kernel void wg_f4(__global const float *x, const int offx, __global const float *dy, const int offdy, const int C,
                    const int H, const int W, const int K, const int P, const int Q, const int pad_h, const int pad_w,
                    const int TH, const int TWG, const int G, const int GC, const int Cp, const int Kp,
                    __global float *scratch, const int sws, __global float *part, const int NTH, const int PS,
                    const int BIAS, const int OUTF, const float beta, __global float *dw, const int offdw,
                    __global float *db, const int offdb)
{
    const int w = get_global_id(0), nw = get_global_size(0);
    const int g0 = (int)((long)G * w / nw), g1 = (int)((long)G * (w + 1) / nw);
    const int TC = GC * 8 + 8; // floats per scratch row (skewed as in wg_f2)
    // floats between transform points: an odd count of 64-byte lines, so the
    // 36 rows one transform writes fall into different cache sets
    const int XV = ((Cp * TC + 15) / 16 | 1) * 16, XU = ((Kp * TC + 15) / 16 | 1) * 16;
    __global float *Vs = scratch + (size_t)w * sws;
    __global float *Us = Vs + (size_t)36 * XV;
    __global float *M = part + (size_t)w * PS;
    wg_zero(M, Vs, Us, XV, XU, TC, 36, C, K, Cp, Kp, 36 * Kp * Cp + (BIAS ? K * 8 : 0), g0 >= g1);
    for (int gs = g0; gs < g1; gs += GC) {
        const int gc = min(GC, g1 - gs);
        for (int c = 0; c < C; c++)
            wg4_chan(1, x + offx, C, c, H, W, pad_h, pad_w, TH, TWG, NTH, gs, gc, Vs + (size_t)c * TC, XV);
        for (int k = 0; k < K; k++)
            wg4_chan(0, dy + offdy, K, k, P, Q, 0, 0, TH, TWG, NTH, gs, gc, Us + (size_t)k * TC, XU);
        if (BIAS) // point (1, 1): 1 * 6 + 1
            wg_bias(Us + (size_t)7 * XU, TC, gc * 8, K, M + (size_t)36 * Kp * Cp, gs == g0);
        wg_products(Us, Vs, XU, XV, TC, gc * 8, M, 36, Kp, Cp, gs == g0);
    }
    if (OUTF) // as wg_f2
        for (int k = 0; k < K; k++)
            for (int c4 = 0; c4 < C; c4 += 4)
                wg4_out_at(part, 1, K, C, Kp, Cp, beta, dw, offdw, PS, BIAS, db, offdb, c4, k);
}

__kernel void wg_f4_out(__global const float *part, const int nw, const int K, const int C, const int Kp,
                        const int Cp, const float beta, __global float *dw, const int offdw, const int PS,
                        const int BIAS, __global float *db, const int offdb)
{
    const int c4 = 4 * get_global_id(0), k = get_global_id(1);
    if (c4 < C && k < K)
        wg4_out_at(part, nw, K, C, Kp, Cp, beta, dw, offdw, PS, BIAS, db, offdb, c4, k);
}
#endif // VR4
