// Scaled dot-product attention, multi-head, optionally causal.
//
// Layout (every Q, K, V, O and their gradients): a sequence (N, T, ld) row-major,
// head h of position t of sample n at  off + (n * T + t) * ld + h * HD,  HD floats
// contiguous. With ld = 3C and offsets 0, C, 2C the kernels read Q, K, V straight
// from a fused QKV projection's output (N, T, 3C); with ld = C from separate (N, T, C)
// buffers. lse: the log-sum-exp of each row's scaled scores, (N, H, T) contiguous.
//
// Quotients and remainders: q = a / b, r = a - q * b (a '/' and '%' pair of the same
// operands gets an LLVM freeze that oclgrind cannot run).
//
// Legend: N batch, H heads, T positions, HD head width, i query, j key,
// s_ij = scale * q_i . k_j (masked to -inf for j > i when causal), p = softmax_j(s),
// o_i = sum_j p_ij v_j.

#ifndef HD // head width (floats per head)
#define HD 32
#endif
#ifndef BQ // query rows per work-group (one per work-item)
#define BQ 32
#endif
#ifndef BK // key/value rows per local-memory tile
#define BK 32
#endif
#ifndef AS_WG // reduction group of attn_softmax (power of two)
#define AS_WG 64
#endif

#ifndef ATTN_DIRECT // 1: read K, V (Q, dO) rows straight from global memory, no local tiles
#define ATTN_DIRECT 0 // and no barriers (CPU devices: a work-group is a loop the compiler vectorizes)
#endif

#if ATTN_DIRECT
#define TILE_PTR __global const float *
// row r0 + rr of head h of a (N, T, ld) sequence (clamped to T - 1: masked by the caller)
#define TILE_ROW(tile, src, off, ld, r0, rr) ((src) + (off) + ((size_t)n * T + min((r0) + (rr), T - 1)) * (ld) + h * HD)
#define TILE_BARRIER()
#else
#define TILE_PTR __local const float *
#define TILE_ROW(tile, src, off, ld, r0, rr) (tile[rr])
#define TILE_BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
#endif

// Loads rows [r0, r0 + BK) of head h of a (N, T, ld) sequence into dst[BK][HD]
// (rows past T read as 0); all BQ work-items of the group take part.
#if ATTN_DIRECT
#define LOAD_TILE(dst, src, off, ld, r0)
#else
#define LOAD_TILE(dst, src, off, ld, r0)                                                    \
    for (uint e_ = get_local_id(0); e_ < BK * HD; e_ += get_local_size(0)) {              \
        const uint rr_ = e_ / HD, cc_ = e_ - rr_ * HD;                                           \
        const uint t_ = (r0) + rr_;                                                        \
        dst[rr_][cc_] = t_ < T ? src[(off) + ((size_t)n * T + t_) * (ld) + h * HD + cc_] : 0.0f; \
    }
#endif

// ---- fused forward ----
// One work-group per (BQ query rows, n * H + h); each work-item keeps its query row and
// its output accumulator in registers and streams K, V through local memory in tiles of
// BK rows with the online softmax (running max m, running sum l). The T x T scores
// never reach global memory; tiles past the last query of the group are skipped when
// causal. Writes O and lse.
__kernel __attribute__((reqd_work_group_size(BQ, 1, 1))) void
attn_fwd(const uint T, const uint H, const float scale, const int causal, __global const float *Q, const uint oq,
         const uint ldq, __global const float *K, const uint ok, const uint ldk, __global const float *V,
         const uint ov, const uint ldv, __global float *O, const uint oo, const uint ldo, __global float *L,
         const uint ol)
{
    __local float Ks[BK][HD];
    __local float Vs[BK][HD];
    const uint i0 = get_group_id(0) * BQ;
    const uint i = i0 + get_local_id(0);
    const uint nh = get_group_id(1);
    const uint n = nh / H, h = nh - n * H;
    const int live = i < T;
    float q[HD], acc[HD];
    const size_t qrow = oq + ((size_t)n * T + (live ? i : 0)) * ldq + h * HD;
    for (uint d = 0; d < HD; d++) {
        q[d] = Q[qrow + d] * scale;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const uint jend = causal ? min(T, i0 + BQ) : T;
    for (uint j0 = 0; j0 < jend; j0 += BK) {
        TILE_BARRIER();
        LOAD_TILE(Ks, K, ok, ldk, j0);
        LOAD_TILE(Vs, V, ov, ldv, j0);
        TILE_BARRIER();
        float s[BK];
        float mt = m;
        for (uint jj = 0; jj < BK; jj++) {
            TILE_PTR kr = TILE_ROW(Ks, K, ok, ldk, j0, jj);
            float dot = 0.0f;
            for (uint d = 0; d < HD; d++)
                dot += q[d] * kr[d];
            const uint j = j0 + jj;
            s[jj] = (j < T && (!causal || j <= i)) ? dot : -INFINITY;
            mt = fmax(mt, s[jj]);
        }
        // j = 0 is valid for every row, so mt is finite from the first tile on
        const float corr = exp(m - mt);
        l *= corr;
        for (uint d = 0; d < HD; d++)
            acc[d] *= corr;
        for (uint jj = 0; jj < BK; jj++) {
            TILE_PTR vr = TILE_ROW(Vs, V, ov, ldv, j0, jj);
            const float p = exp(s[jj] - mt);
            l += p;
            for (uint d = 0; d < HD; d++)
                acc[d] += p * vr[d];
        }
        m = mt;
    }
    if (live) {
        const float inv = 1.0f / l;
        const size_t orow = oo + ((size_t)n * T + i) * ldo + h * HD;
        for (uint d = 0; d < HD; d++)
            O[orow + d] = acc[d] * inv;
        L[ol + ((size_t)n * H + h) * T + i] = m + log(l);
    }
}

// ---- fused backward ----
// D_i = sum_d dO_id O_id, one work-item per (i, n * H + h < NH); D is (N, H, T).
__kernel void attn_bwd_dot(const uint T, const uint H, const uint NH, __global const float *O, const uint oo, const uint ldo,
                           __global const float *dO, const uint odo, const uint lddo, __global float *D,
                           const uint od)
{
    const uint i = get_global_id(0), nh = get_global_id(1);
    if (i >= T || nh >= NH)
        return;
    const uint n = nh / H, h = nh - n * H;
    const size_t ro = oo + ((size_t)n * T + i) * ldo + h * HD;
    const size_t rd = odo + ((size_t)n * T + i) * lddo + h * HD;
    float acc = 0.0f;
    for (uint d = 0; d < HD; d++)
        acc += O[ro + d] * dO[rd + d];
    D[od + (size_t)nh * T + i] = acc;
}

// dK, dV: one work-group per (BK key rows, n * H + h), one key row per work-item (BK =
// BQ work-items), looping over the query tiles that see it (from its own tile on when
// causal), with Q, dO, lse and D of the tile in local memory. Scores recomputed from
// Q, K and lse: p_ij = exp(s_ij - lse_i); dv_j += p dO_i; ds = p (dO_i . v_j - D_i);
// dk_j += scale ds q_i. Each output written once by its owner: deterministic.
__kernel __attribute__((reqd_work_group_size(BK, 1, 1))) void
attn_bwd_dkdv(const uint T, const uint H, const float scale, const int causal, __global const float *Q,
              const uint oq, const uint ldq, __global const float *K, const uint ok, const uint ldk,
              __global const float *V, const uint ov, const uint ldv, __global const float *dO, const uint odo,
              const uint lddo, __global const float *L, const uint ol, __global const float *D, const uint od,
              __global float *dK, const uint odk, const uint lddk, __global float *dV, const uint odv,
              const uint lddv)
{
    __local float Qs[BK][HD];
    __local float Gs[BK][HD];
    __local float Ls[BK];
    __local float Ds[BK];
    const uint j0 = get_group_id(0) * BK;
    const uint j = j0 + get_local_id(0);
    const uint nh = get_group_id(1);
    const uint n = nh / H, h = nh - n * H;
    const int live = j < T;
    float k[HD], v[HD], dk[HD], dv[HD];
    const size_t krow = ok + ((size_t)n * T + (live ? j : 0)) * ldk + h * HD;
    const size_t vrow = ov + ((size_t)n * T + (live ? j : 0)) * ldv + h * HD;
    for (uint d = 0; d < HD; d++) {
        k[d] = K[krow + d] * scale;
        v[d] = V[vrow + d];
        dk[d] = 0.0f;
        dv[d] = 0.0f;
    }
    for (uint i0 = causal ? j0 : 0; i0 < T; i0 += BK) {
        TILE_BARRIER();
        LOAD_TILE(Qs, Q, oq, ldq, i0);
        LOAD_TILE(Gs, dO, odo, lddo, i0);
#if !ATTN_DIRECT
        {
            const uint ii = get_local_id(0), ti = i0 + ii;
            Ls[ii] = ti < T ? L[ol + (size_t)nh * T + ti] : 0.0f;
            Ds[ii] = ti < T ? D[od + (size_t)nh * T + ti] : 0.0f;
        }
#endif
        TILE_BARRIER();
        for (uint ii = 0; ii < BK; ii++) {
            const uint i = i0 + ii;
            TILE_PTR qr = TILE_ROW(Qs, Q, oq, ldq, i0, ii);
            TILE_PTR gr = TILE_ROW(Gs, dO, odo, lddo, i0, ii);
#if ATTN_DIRECT
            const uint ic = min(i, T - 1);
            const float li = L[ol + (size_t)nh * T + ic], di = D[od + (size_t)nh * T + ic];
#else
            const float li = Ls[ii], di = Ds[ii];
#endif
            float s = 0.0f, dp = 0.0f;
            for (uint d = 0; d < HD; d++) {
                s += qr[d] * k[d];
                dp += gr[d] * v[d];
            }
            const float p = (i < T && (!causal || j <= i)) ? exp(s - li) : 0.0f;
            const float ds = p * (dp - di);
            for (uint d = 0; d < HD; d++) {
                dv[d] += p * gr[d];
                dk[d] += ds * qr[d];
            }
        }
    }
    if (live) {
        const size_t rk = odk + ((size_t)n * T + j) * lddk + h * HD;
        const size_t rv = odv + ((size_t)n * T + j) * lddv + h * HD;
        for (uint d = 0; d < HD; d++) {
            dK[rk + d] = dk[d] * scale;
            dV[rv + d] = dv[d];
        }
    }
}

// dQ: one work-group per (BQ query rows, n * H + h), one query row per work-item, looping
// over the key tiles it sees with K and V in local memory: dq_i = scale sum_j ds_ij k_j.
__kernel __attribute__((reqd_work_group_size(BQ, 1, 1))) void
attn_bwd_dq(const uint T, const uint H, const float scale, const int causal, __global const float *Q, const uint oq,
            const uint ldq, __global const float *K, const uint ok, const uint ldk, __global const float *V,
            const uint ov, const uint ldv, __global const float *dO, const uint odo, const uint lddo,
            __global const float *L, const uint ol, __global const float *D, const uint od, __global float *dQ,
            const uint odq, const uint lddq)
{
    __local float Ks[BK][HD];
    __local float Vs[BK][HD];
    const uint i0 = get_group_id(0) * BQ;
    const uint i = i0 + get_local_id(0);
    const uint nh = get_group_id(1);
    const uint n = nh / H, h = nh - n * H;
    const int live = i < T;
    const uint ic = live ? i : 0;
    float q[HD], g[HD], dq[HD];
    const size_t qrow = oq + ((size_t)n * T + ic) * ldq + h * HD;
    const size_t grow = odo + ((size_t)n * T + ic) * lddo + h * HD;
    for (uint d = 0; d < HD; d++) {
        q[d] = Q[qrow + d] * scale;
        g[d] = dO[grow + d];
        dq[d] = 0.0f;
    }
    const float li = L[ol + (size_t)nh * T + ic];
    const float di = D[od + (size_t)nh * T + ic];
    const uint jend = causal ? min(T, i0 + BQ) : T;
    for (uint j0 = 0; j0 < jend; j0 += BK) {
        TILE_BARRIER();
        LOAD_TILE(Ks, K, ok, ldk, j0);
        LOAD_TILE(Vs, V, ov, ldv, j0);
        TILE_BARRIER();
        for (uint jj = 0; jj < BK; jj++) {
            const uint j = j0 + jj;
            TILE_PTR kr = TILE_ROW(Ks, K, ok, ldk, j0, jj);
            TILE_PTR vr = TILE_ROW(Vs, V, ov, ldv, j0, jj);
            float s = 0.0f, dp = 0.0f;
            for (uint d = 0; d < HD; d++) {
                s += q[d] * kr[d];
                dp += g[d] * vr[d];
            }
            const float p = (j < T && (!causal || j <= i)) ? exp(s - li) : 0.0f;
            const float ds = p * (dp - di);
            for (uint d = 0; d < HD; d++)
                dq[d] += ds * kr[d];
        }
    }
    if (live) {
        const size_t r = odq + ((size_t)n * T + i) * lddq + h * HD;
        for (uint d = 0; d < HD; d++)
            dQ[r + d] = dq[d] * scale;
    }
}

// ---- GEMM path: masked softmax over the score rows ----
// S holds rows (n, h, i) of T scaled scores; one work-group per row: p_ij = softmax over
// j <= i (causal) or all j; masked entries written 0 (so P V and the softmax backward
// ignore them).
__kernel __attribute__((reqd_work_group_size(AS_WG, 1, 1))) void
attn_softmax(const uint T, const int causal, __global float *S, const uint os)
{
    __local float red[AS_WG];
    const uint row = get_group_id(0);
    const uint lid = get_local_id(0);
    const uint i = row - (row / T) * T;
    const uint jn = causal ? i + 1 : T;
    __global float *sr = S + os + (size_t)row * T;
    float m = -INFINITY;
    for (uint j = lid; j < jn; j += AS_WG)
        m = fmax(m, sr[j]);
    red[lid] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = AS_WG / 2; w > 0; w >>= 1) {
        if (lid < w)
            red[lid] = fmax(red[lid], red[lid + w]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float sum = 0.0f;
    for (uint j = lid; j < jn; j += AS_WG)
        sum += exp(sr[j] - m);
    red[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = AS_WG / 2; w > 0; w >>= 1) {
        if (lid < w)
            red[lid] += red[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float inv = 1.0f / red[0];
    for (uint j = lid; j < T; j += AS_WG)
        sr[j] = j < jn ? exp(sr[j] - m) * inv : 0.0f;
}

// ---- CPU register-tile variant of the fused kernels ----
// No local memory and no barriers; one work-item per group (reqd size 1) runs a block of
// rows with explicit vectors, like a GEMM micro-kernel: scores of a block of rows against
// KB = 16 keys (queries) at once as float16 lanes, from a transposed copy (NH, HD, Tp) of K
// (or Q), so a step of the head-width loop is one contiguous 16-float load and one
// multiply-add per row; the softmax on those lanes; then the P V-style updates along the
// head width as float8 vectors read from the untransposed rows. HD must be a multiple
// of 8. Tp = T rounded up to a multiple of 16 (the pad of the copies is 0).
#if HD % 8 == 0
#ifndef RQ // query rows per work-item (attn_fwd_cpu, attn_bwd_dq_cpu)
#define RQ 8
#endif
#ifndef RK // key rows per work-item (attn_bwd_dkdv_cpu)
#define RK 8
#endif
#define KB 16
#define HV (HD / 8)

static inline float hmax16(const float16 v)
{
    const float8 a = fmax(v.lo, v.hi);
    const float4 b = fmax(a.lo, a.hi);
    return fmax(fmax(b.x, b.y), fmax(b.z, b.w));
}

static inline float hsum16(const float16 v)
{
    const float8 a = v.lo + v.hi;
    return dot(a.lo, (float4)(1.0f)) + dot(a.hi, (float4)(1.0f));
}

#define LANES ((int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))

#ifndef DROPOUT // 1: inverted dropout on the probabilities (attn_fwd_cpu, attn_bwd_dq_cpu, attn_bwd_dkdv_cpu)
#define DROPOUT 0
#endif
#if DROPOUT
// The mask of the gemm path (clg_nn_dropout on P (N, H, T, T)): element (nh, i, j) is
// kept when the hash of (seed, step, base + (nh T + i) T + j) >= p (cl/eltwise.cl
// clg_dropout_scale, the same arithmetic), scale 0 or inv = 1 / (1 - p). The extra
// arguments every kernel of this section ends with:
#define DROPOUT_ARGS , const float dp_p, const float dp_inv, const uint dp_seed, const uint dp_step, const uint dp_base
#define DROPOUT_PASS , dp_p, dp_inv, dp_seed, dp_step, dp_base
inline uint attn_mix32(uint h)
{
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}
inline uint16 attn_mix32v(uint16 h)
{
    h ^= h >> 16;
    h *= (uint16)(0x7feb352du);
    h ^= h >> 15;
    h *= (uint16)(0x846ca68bu);
    h ^= h >> 16;
    return h;
}
// Scales of the 16 elements idx0 + lane * stride.
inline float16 attn_keep16(const uint idx0, const uint stride, const float p, const float inv, const uint seed,
                           const uint step)
{
    const uint key = attn_mix32(seed ^ attn_mix32(step + 0x9e3779b9u));
    const uint16 idx = (uint16)(idx0) + convert_uint16(LANES) * (uint16)(stride);
    const uint16 h = attn_mix32v(idx ^ (uint16)(key));
    const float16 u = convert_float16(h >> 8) * (1.0f / 16777216.0f);
    return select((float16)(0.0f), (float16)(inv), u >= (float16)(p));
}
// Row i of head nh, keys j0 .. j0 + 15; key j of head nh, queries i0 .. i0 + 15.
#define KEEP_ROW(i, j0) attn_keep16(dp_base + (nh * T + (i)) * T + (j0), 1u, dp_p, dp_inv, dp_seed, dp_step)
#define KEEP_COL(i0, j) attn_keep16(dp_base + (nh * T + (i0)) * T + (j), T, dp_p, dp_inv, dp_seed, dp_step)
#else
#define DROPOUT_ARGS
#define DROPOUT_PASS
#endif

// dst (NH, HD, Tp) = head h of src (N, T, ld) transposed per head, rows t >= T zero;
// one work-item per 8 x 8 block (t0 = 8 (t < Tp / 8), nh * HD + 8 e): eight row pieces
// of 8 floats read, eight column pieces written (one work-item per element, lanes
// along t, gathered every read from rows ld apart: 1.5-2x slower on PoCL). Scalar
// copies through a private block: the same in float8 swizzles crashed oclgrind.
__kernel void attn_transpose(const uint T, const uint H, const uint NH, const uint Tp, __global const float *src,
                             const uint os, const uint lds, __global float *dst)
{
    const uint t0 = get_global_id(0) * 8, he = get_global_id(1) * 8;
    if (t0 >= Tp || he >= NH * HD)
        return;
    const uint nh = he / HD, e = he - nh * HD;
    const uint n = nh / H, h = nh - n * H;
    __global const float *s = src + os + (size_t)n * T * lds + h * HD + e;
    float b[8][8];
    for (uint i = 0; i < 8; i++) {
        const uint t = t0 + i;
        for (uint c = 0; c < 8; c++)
            b[c][i] = t < T ? s[(size_t)t * lds + c] : 0.0f;
    }
    __global float *d = dst + (size_t)he * Tp + t0;
    for (uint c = 0; c < 8; c++)
        vstore8(vload8(0, b[c]), 0, d + (size_t)c * Tp);
}

#ifndef FWD_TP_MAX // attn_fwd_rows: the two-pass softmax up to this Tp (scores in private memory)
#define FWD_TP_MAX 256
#endif

// Pieces of both forward forms below (macros: the same code in each, no private arrays
// passed through pointers).
// q (RQ x HD) = the block's query rows times scale (rows past T repeat row T - 1), acc = 0.
#define ATTN_FWD_LOAD_Q                                                                                \
    for (uint r = 0; r < RQ; r++) {                                                                    \
        __global const float *qr = Q + oq + ((size_t)n * T + min(i0 + r, T - 1)) * ldq + h * HD;       \
        for (uint d = 0; d < HD; d++)                                                                  \
            q[r][d] = qr[d] * scale;                                                                   \
        for (uint c = 0; c < HV; c++)                                                                  \
            acc[r][c] = (float8)(0.0f);                                                                \
    }
// s[r] = scores of row r against keys j0 .. j0 + 15 (from kt), sr: the same with the masked
// keys at -INFINITY (stated by the caller's loop body).
#define ATTN_FWD_SCORES(j0)                                                                            \
    float16 s[RQ];                                                                                     \
    for (uint r = 0; r < RQ; r++)                                                                      \
        s[r] = (float16)(0.0f);                                                                        \
    for (uint d = 0; d < HD; d++) {                                                                    \
        const float16 kv = vload16(0, kt + (size_t)d * Tp + (j0));                                     \
        for (uint r = 0; r < RQ; r++)                                                                  \
            s[r] = fma((float16)(q[r][d]), kv, s[r]);                                                  \
    }                                                                                                  \
    const int16 j = (int16)((int)(j0)) + LANES;
#define ATTN_FWD_MASKED(r)                                                                             \
    select((float16)(-INFINITY), s[r],                                                                 \
           (j < (int16)((int)T)) & (causal ? (j <= (int16)((int)(i0 + (r)))) : (int16)(-1)))
// p[r] = the probabilities pr of row r (after dropout where enabled).
#if DROPOUT // the normalizer sums the probabilities before dropout; P V takes them after
#define ATTN_FWD_STORE_P(r, pr, j0) vstore16((pr) * KEEP_ROW(i0 + (r), j0), 0, p[r])
#else
#define ATTN_FWD_STORE_P(r, pr, j0) vstore16((pr), 0, p[r])
#endif
// acc += p V over keys j0 .. min(j0 + KB, jend) - 1.
#define ATTN_FWD_PV(j0)                                                                                \
    for (uint jj = 0; jj < min((uint)KB, jend - (j0)); jj++) {                                         \
        __global const float *vr = V + ov + ((size_t)n * T + (j0) + jj) * ldv + h * HD;                \
        for (uint c = 0; c < HV; c++) {                                                                \
            const float8 vv = vload8(c, vr);                                                           \
            for (uint r = 0; r < RQ; r++)                                                              \
                acc[r][c] = fma((float8)(p[r][jj]), vv, acc[r][c]);                                    \
        }                                                                                              \
    }
// O rows = acc / l, L = m + log l, for the rows below T (LR(r): row r's normalizer).
#define ATTN_FWD_OUT(LR)                                                                               \
    for (uint r = 0; r < RQ; r++) {                                                                    \
        const uint i = i0 + r;                                                                         \
        if (i >= T)                                                                                    \
            break;                                                                                     \
        __global float *orow = O + oo + ((size_t)n * T + i) * ldo + h * HD;                            \
        const float lr = (LR), inv = 1.0f / lr;                                                        \
        for (uint c = 0; c < HV; c++)                                                                  \
            vstore8(acc[r][c] * inv, c, orow);                                                         \
        L[ol + (size_t)nh * T + i] = m[r] + log(lr);                                                   \
    }

// Forward on short sequences (Tp <= FWD_TP_MAX): RQ query rows i0.. of head nh; a first
// pass keeps the block's scores and their lane-wise maxima, a second one exponentiates
// them against the row maximum and accumulates P V: no rescaling of the accumulators and
// no horizontal max, sum or scalar exp per key block (the online form's per-block work).
static inline void attn_fwd_rows_2p(const uint T, const uint H, const uint Tp, const float scale, const int causal,
                                    __global const float *Q, const uint oq, const uint ldq, __global const float *Kt,
                                    __global const float *V, const uint ov, const uint ldv, __global float *O,
                                    const uint oo, const uint ldo, __global float *L, const uint ol, const uint i0,
                                    const uint nh DROPOUT_ARGS)
{
    const uint n = nh / H, h = nh - n * H;
    float q[RQ][HD];
    float sc[RQ][FWD_TP_MAX];
    float8 acc[RQ][HV];
    float16 mv[RQ], ls[RQ];
    ATTN_FWD_LOAD_Q
    for (uint r = 0; r < RQ; r++) {
        mv[r] = (float16)(-INFINITY);
        ls[r] = (float16)(0.0f);
    }
    __global const float *kt = Kt + (size_t)nh * HD * Tp;
    const uint jend = causal ? min(T, i0 + RQ) : T;
    for (uint j0 = 0; j0 < jend; j0 += KB) {
        ATTN_FWD_SCORES(j0)
        for (uint r = 0; r < RQ; r++) {
            const float16 sr = ATTN_FWD_MASKED(r);
            mv[r] = fmax(mv[r], sr);
            vstore16(sr, 0, sc[r] + j0);
        }
    }
    float m[RQ];
    for (uint r = 0; r < RQ; r++)
        m[r] = hmax16(mv[r]); /* finite: key 0 is never masked */
    for (uint j0 = 0; j0 < jend; j0 += KB) {
        float p[RQ][KB];
        for (uint r = 0; r < RQ; r++) {
            const float16 pr = exp(vload16(0, sc[r] + j0) - (float16)(m[r]));
            ls[r] += pr;
            ATTN_FWD_STORE_P(r, pr, j0);
        }
        ATTN_FWD_PV(j0)
    }
    ATTN_FWD_OUT(hsum16(ls[r]))
}

// Forward: RQ query rows i0.. of head nh = n H + h; the online softmax per row.
static inline void attn_fwd_rows(const uint T, const uint H, const uint Tp, const float scale, const int causal,
                                 __global const float *Q, const uint oq, const uint ldq, __global const float *Kt,
                                 __global const float *V, const uint ov, const uint ldv, __global float *O,
                                 const uint oo, const uint ldo, __global float *L, const uint ol, const uint i0,
                                 const uint nh DROPOUT_ARGS)
{
    if (Tp <= FWD_TP_MAX) {
        attn_fwd_rows_2p(T, H, Tp, scale, causal, Q, oq, ldq, Kt, V, ov, ldv, O, oo, ldo, L, ol, i0, nh DROPOUT_PASS);
        return;
    }
    const uint n = nh / H, h = nh - n * H;
    float q[RQ][HD];
    float8 acc[RQ][HV];
    float m[RQ], l[RQ];
    ATTN_FWD_LOAD_Q
    for (uint r = 0; r < RQ; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    __global const float *kt = Kt + (size_t)nh * HD * Tp;
    const uint jend = causal ? min(T, i0 + RQ) : T;
    for (uint j0 = 0; j0 < jend; j0 += KB) {
        ATTN_FWD_SCORES(j0)
        float p[RQ][KB];
        for (uint r = 0; r < RQ; r++) {
            const float16 sr = ATTN_FWD_MASKED(r);
            const float mt = fmax(m[r], hmax16(sr));
            const float16 pr = exp(sr - (float16)(mt));
            const float corr = exp(m[r] - mt);
            l[r] = l[r] * corr + hsum16(pr);
            m[r] = mt;
            for (uint c = 0; c < HV; c++)
                acc[r][c] *= corr;
            ATTN_FWD_STORE_P(r, pr, j0);
        }
        ATTN_FWD_PV(j0)
    }
    ATTN_FWD_OUT(l[r])
}

// One work-item per (RQ query rows, n * H + h).
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
attn_fwd_cpu(const uint T, const uint H, const uint Tp, const float scale, const int causal, __global const float *Q,
             const uint oq, const uint ldq, __global const float *Kt, __global const float *V, const uint ov,
             const uint ldv, __global float *O, const uint oo, const uint ldo, __global float *L,
             const uint ol DROPOUT_ARGS)
{
    attn_fwd_rows(T, H, Tp, scale, causal, Q, oq, ldq, Kt, V, ov, ldv, O, oo, ldo, L, ol, get_group_id(0) * RQ,
                  get_group_id(1) DROPOUT_PASS);
}

// dst[d * Tp + t] = src[t * ld + d] for the rows t < T of one head (src: its row 0,
// element 0), zero for T <= t < Tp, in 8 x 8 blocks: eight vector loads and stores
// per block instead of 64 strided scalar stores. The block goes through private
// arrays (as in attn_transpose): the same with float8 component swizzles crashed
// oclgrind.
static inline void attn_head_transpose(const uint T, const uint Tp, __global const float *src, const uint ld,
                                       __global float *dst)
{
    for (uint t0 = 0; t0 < Tp; t0 += 8)
        for (uint d0 = 0; d0 < HD; d0 += 8) {
            float b[8][8], row[8];
            for (uint i = 0; i < 8; i++) {
                const uint t = t0 + i;
                const float8 v = vload8(0, src + (size_t)min(t, T - 1) * ld + d0); // clamped: no read past T
                vstore8(t < T ? v : (float8)(0.0f), 0, row);
                for (uint c = 0; c < 8; c++)
                    b[c][i] = row[c];
            }
            __global float *d = dst + (size_t)d0 * Tp + t0;
            for (uint c = 0; c < 8; c++)
                vstore8(vload8(0, b[c]), 0, d + (size_t)c * Tp);
        }
}

// One work-item per head n * H + h (when there are heads enough to keep the cores
// busy): writes its head of Kt (K transposed, zero past T, as attn_transpose does),
// then runs every block of RQ rows: one launch, no transpose pass.
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
attn_fwd_cpu1(const uint T, const uint H, const uint Tp, const float scale, const int causal, __global const float *Q,
              const uint oq, const uint ldq, __global const float *K, const uint ok, const uint ldk,
              __global float *Kt, __global const float *V, const uint ov, const uint ldv, __global float *O,
              const uint oo, const uint ldo, __global float *L, const uint ol DROPOUT_ARGS)
{
    const uint nh = get_group_id(1);
    const uint n = nh / H, h = nh - n * H;
    attn_head_transpose(T, Tp, K + ok + (size_t)n * T * ldk + h * HD, ldk, Kt + (size_t)nh * HD * Tp);
    for (uint i0 = 0; i0 < T; i0 += RQ)
        attn_fwd_rows(T, H, Tp, scale, causal, Q, oq, ldq, Kt, V, ov, ldv, O, oo, ldo, L, ol, i0, nh DROPOUT_PASS);
}

// D_i = sum_d dO_id O_id and a copy of lse, both (NH, Tp) with zero pad; one work-item
// per (i < Tp, nh).
__kernel void attn_bwd_dot_cpu(const uint T, const uint H, const uint NH, const uint Tp, __global const float *O,
                               const uint oo, const uint ldo, __global const float *dO, const uint odo,
                               const uint lddo, __global const float *L, const uint ol, __global float *Dp,
                               __global float *Lp)
{
    const uint i = get_global_id(0), nh = get_global_id(1);
    if (i >= Tp || nh >= NH)
        return;
    const uint n = nh / H, h = nh - n * H;
    float acc = 0.0f, lv = 0.0f;
    if (i < T) {
        const size_t ro = oo + ((size_t)n * T + i) * ldo + h * HD;
        const size_t rd = odo + ((size_t)n * T + i) * lddo + h * HD;
        for (uint d = 0; d < HD; d++)
            acc += O[ro + d] * dO[rd + d];
        lv = L[ol + (size_t)nh * T + i];
    }
    Dp[(size_t)nh * Tp + i] = acc;
    Lp[(size_t)nh * Tp + i] = lv;
}

// dQ: RQ query rows per work-item; scores and dO V^T from transposed K and V (Kt, Vt).
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
attn_bwd_dq_cpu(const uint T, const uint H, const uint Tp, const float scale, const int causal,
                __global const float *Q, const uint oq, const uint ldq, __global const float *K, const uint ok,
                const uint ldk, __global const float *Kt, __global const float *Vt, __global const float *dO,
                const uint odo, const uint lddo, __global const float *Lp, __global const float *Dp,
                __global float *dQ, const uint odq, const uint lddq DROPOUT_ARGS)
{
    const uint i0 = get_group_id(0) * RQ, nh = get_group_id(1);
    const uint n = nh / H, h = nh - n * H;
    float q[RQ][HD], g[RQ][HD], li[RQ], di[RQ];
    float8 dq[RQ][HV];
    for (uint r = 0; r < RQ; r++) {
        const uint ic = min(i0 + r, T - 1);
        __global const float *qr = Q + oq + ((size_t)n * T + ic) * ldq + h * HD;
        __global const float *gr = dO + odo + ((size_t)n * T + ic) * lddo + h * HD;
        for (uint d = 0; d < HD; d++) {
            q[r][d] = qr[d] * scale;
            g[r][d] = gr[d];
        }
        for (uint c = 0; c < HV; c++)
            dq[r][c] = (float8)(0.0f);
        li[r] = Lp[(size_t)nh * Tp + ic];
        di[r] = Dp[(size_t)nh * Tp + ic];
    }
    __global const float *kt = Kt + (size_t)nh * HD * Tp;
    __global const float *vt = Vt + (size_t)nh * HD * Tp;
    const uint jend = causal ? min(T, i0 + RQ) : T;
    for (uint j0 = 0; j0 < jend; j0 += KB) {
        float16 s[RQ], dp[RQ];
        for (uint r = 0; r < RQ; r++)
            s[r] = dp[r] = (float16)(0.0f);
        for (uint d = 0; d < HD; d++) {
            const float16 kv = vload16(0, kt + (size_t)d * Tp + j0);
            const float16 vv = vload16(0, vt + (size_t)d * Tp + j0);
            for (uint r = 0; r < RQ; r++) {
                s[r] = fma((float16)(q[r][d]), kv, s[r]);
                dp[r] = fma((float16)(g[r][d]), vv, dp[r]);
            }
        }
        const int16 j = (int16)((int)j0) + LANES;
        float ds[RQ][KB];
        for (uint r = 0; r < RQ; r++) {
            const int16 okm = (j < (int16)((int)T)) & (causal ? (j <= (int16)((int)(i0 + r))) : (int16)(-1));
            const float16 p = select((float16)(0.0f), exp(s[r] - (float16)(li[r])), okm);
#if DROPOUT // dS = P o (dP~ o Z - D): D = rowsum(dO o O) already includes the mask
            vstore16(p * (dp[r] * KEEP_ROW(i0 + r, j0) - (float16)(di[r])), 0, ds[r]);
#else
            vstore16(p * (dp[r] - (float16)(di[r])), 0, ds[r]);
#endif
        }
        const uint jn = min((uint)KB, jend - j0);
        for (uint jj = 0; jj < jn; jj++) {
            __global const float *kr = K + ok + ((size_t)n * T + j0 + jj) * ldk + h * HD;
            for (uint c = 0; c < HV; c++) {
                const float8 kv = vload8(c, kr);
                for (uint r = 0; r < RQ; r++)
                    dq[r][c] = fma((float8)(ds[r][jj]), kv, dq[r][c]);
            }
        }
    }
    for (uint r = 0; r < RQ; r++) {
        const uint i = i0 + r;
        if (i >= T)
            break;
        __global float *out = dQ + odq + ((size_t)n * T + i) * lddq + h * HD;
        for (uint c = 0; c < HV; c++)
            vstore8(dq[r][c] * scale, c, out);
    }
}

// dK, dV of the RK key rows j0.. of head nh = n H + h over the query tiles that see
// them: scores and V dO^T from Q and dO transposed per head (Qt, Gt), lse and D as
// 16-lane loads (Lp, Dp), all (NH, HD or 1, Tp). With with_dq (a constant at each
// call) also adds each tile's dS^T K into the dQ rows of the tile (dq_i += scale
// sum_j ds_ij k_j, k scaled on load). Key rows past T (clamped copies) are masked
// off and never stored.
static inline void attn_dkdv_rows(const uint T, const uint H, const uint Tp, const float scale, const int causal,
                                  __global const float *Q, const uint oq, const uint ldq, __global const float *K,
                                  const uint ok, const uint ldk, __global const float *V, const uint ov,
                                  const uint ldv, __global const float *dO, const uint odo, const uint lddo,
                                  __global const float *Qt, __global const float *Gt, __global const float *Lp,
                                  __global const float *Dp, __global float *dK, const uint odk, const uint lddk,
                                  __global float *dV, const uint odv, const uint lddv, const int with_dq,
                                  __global float *dQ, const uint odq, const uint lddq, const uint j0,
                                  const uint nh DROPOUT_ARGS)
{
    const uint n = nh / H, h = nh - n * H;
    float k[RK][HD], v[RK][HD];
    float8 dk[RK][HV], dv[RK][HV];
    for (uint r = 0; r < RK; r++) {
        const uint jc = min(j0 + r, T - 1);
        __global const float *kr = K + ok + ((size_t)n * T + jc) * ldk + h * HD;
        __global const float *vr = V + ov + ((size_t)n * T + jc) * ldv + h * HD;
        for (uint d = 0; d < HD; d++) {
            k[r][d] = kr[d] * scale;
            v[r][d] = vr[d];
        }
        for (uint c = 0; c < HV; c++)
            dk[r][c] = dv[r][c] = (float8)(0.0f);
    }
    __global const float *qt = Qt + (size_t)nh * HD * Tp;
    __global const float *gt = Gt + (size_t)nh * HD * Tp;
    __global const float *lp = Lp + (size_t)nh * Tp;
    __global const float *dp_ = Dp + (size_t)nh * Tp;
    for (uint i0 = causal ? j0 / KB * KB : 0; i0 < T; i0 += KB) {
        float16 s[RK], dp[RK];
        for (uint r = 0; r < RK; r++)
            s[r] = dp[r] = (float16)(0.0f);
        for (uint d = 0; d < HD; d++) {
            const float16 qv = vload16(0, qt + (size_t)d * Tp + i0);
            const float16 gv = vload16(0, gt + (size_t)d * Tp + i0);
            for (uint r = 0; r < RK; r++) {
                s[r] = fma((float16)(k[r][d]), qv, s[r]);
                dp[r] = fma((float16)(v[r][d]), gv, dp[r]);
            }
        }
        const int16 i = (int16)((int)i0) + LANES;
        const float16 lv = vload16(0, lp + i0), dv16 = vload16(0, dp_ + i0);
        float p[RK][KB], ds[RK][KB];
        for (uint r = 0; r < RK; r++) {
            const int16 okm = (i < (int16)((int)T)) & (int16)(j0 + r < T ? -1 : 0) &
                              (causal ? (i >= (int16)((int)(j0 + r))) : (int16)(-1));
            const float16 pr = select((float16)(0.0f), exp(s[r] - lv), okm);
#if DROPOUT // dV takes the dropped-out P, dS the mask on dP~
            const float16 z = KEEP_COL(i0, j0 + r);
            vstore16(pr * z, 0, p[r]);
            vstore16(pr * (dp[r] * z - dv16), 0, ds[r]);
#else
            vstore16(pr, 0, p[r]);
            vstore16(pr * (dp[r] - dv16), 0, ds[r]);
#endif
        }
        const uint in_ = min((uint)KB, T - i0);
        for (uint ii = 0; ii < in_; ii++) {
            __global const float *qr = Q + oq + ((size_t)n * T + i0 + ii) * ldq + h * HD;
            __global const float *gr = dO + odo + ((size_t)n * T + i0 + ii) * lddo + h * HD;
            __global float *dqr = with_dq ? dQ + odq + ((size_t)n * T + i0 + ii) * lddq + h * HD : 0;
            for (uint c = 0; c < HV; c++) {
                const float8 qv = vload8(c, qr), gv = vload8(c, gr);
                for (uint r = 0; r < RK; r++) {
                    dv[r][c] = fma((float8)(p[r][ii]), gv, dv[r][c]);
                    dk[r][c] = fma((float8)(ds[r][ii]), qv, dk[r][c]);
                }
                if (with_dq) {
                    float8 dqv = vload8(c, dqr);
                    for (uint r = 0; r < RK; r++)
                        dqv = fma((float8)(ds[r][ii]), vload8(c, k[r]), dqv);
                    vstore8(dqv, c, dqr);
                }
            }
        }
    }
    for (uint r = 0; r < RK; r++) {
        const uint j = j0 + r;
        if (j >= T)
            break;
        __global float *ko = dK + odk + ((size_t)n * T + j) * lddk + h * HD;
        __global float *vo = dV + odv + ((size_t)n * T + j) * lddv + h * HD;
        for (uint c = 0; c < HV; c++) {
            vstore8(dk[r][c] * scale, c, ko);
            vstore8(dv[r][c], c, vo);
        }
    }
}

// dK, dV: RK key rows per work-item (attn_dkdv_rows).
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
attn_bwd_dkdv_cpu(const uint T, const uint H, const uint Tp, const float scale, const int causal,
                  __global const float *Q, const uint oq, const uint ldq, __global const float *K, const uint ok,
                  const uint ldk, __global const float *V, const uint ov, const uint ldv, __global const float *dO,
                  const uint odo, const uint lddo, __global const float *Qt, __global const float *Gt,
                  __global const float *Lp, __global const float *Dp, __global float *dK, const uint odk,
                  const uint lddk, __global float *dV, const uint odv, const uint lddv DROPOUT_ARGS)
{
    attn_dkdv_rows(T, H, Tp, scale, causal, Q, oq, ldq, K, ok, ldk, V, ov, ldv, dO, odo, lddo, Qt, Gt, Lp, Dp, dK, odk,
                   lddk, dV, odv, lddv, 0, 0, 0, 0, get_group_id(0) * RK, get_group_id(1) DROPOUT_PASS);
}

// dQ, dK, dV in one pass (the CPU backward when there are heads enough to keep every
// core busy): one work-item per (n, h) first writes its head's scratch (Qt, Gt: Q and
// dO transposed as attn_transpose does; Lp, Dp: lse and D_i = dO_i . O_i as
// attn_bwd_dot_cpu does, zero past T), then runs attn_dkdv_rows over its key blocks
// of RK rows in order, which adds each block's dS^T K into the dQ rows of the query
// tile right away (with_dq), so the
// scores and dO V^T are computed once, not again by attn_bwd_dq_cpu, no transposed
// K, V are needed, and the backward is one launch. The work-item owns its head's dQ
// rows (zeroed first) and scratch: a fixed order of additions, deterministic.
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
attn_bwd_cpu1(const uint T, const uint H, const uint Tp, const float scale, const int causal,
              __global const float *Q, const uint oq, const uint ldq, __global const float *K, const uint ok,
              const uint ldk, __global const float *V, const uint ov, const uint ldv, __global const float *O,
              const uint oo, const uint ldo, __global const float *dO, const uint odo, const uint lddo,
              __global const float *L, const uint ol, __global float *Qt, __global float *Gt, __global float *Lp,
              __global float *Dp, __global float *dQ, const uint odq, const uint lddq, __global float *dK,
              const uint odk, const uint lddk, __global float *dV, const uint odv, const uint lddv DROPOUT_ARGS)
{
    const uint nh = get_group_id(1);
    const uint n = nh / H, h = nh - n * H;
    __global float *qt = Qt + (size_t)nh * HD * Tp;
    __global float *gt = Gt + (size_t)nh * HD * Tp;
    __global float *lp = Lp + (size_t)nh * Tp;
    __global float *dp_ = Dp + (size_t)nh * Tp;
    attn_head_transpose(T, Tp, Q + oq + (size_t)n * T * ldq + h * HD, ldq, qt);
    attn_head_transpose(T, Tp, dO + odo + (size_t)n * T * lddo + h * HD, lddo, gt);
    for (uint t = 0; t < Tp; t++) {
        const int live = t < T;
        const size_t row = (size_t)n * T + min(t, T - 1);
        __global const float *gr = dO + odo + row * lddo + h * HD;
        __global const float *orow = O + oo + row * ldo + h * HD;
        float acc = 0.0f;
        for (uint d = 0; d < HD; d++)
            acc += orow[d] * gr[d];
        lp[t] = live ? L[ol + (size_t)nh * T + t] : 0.0f;
        dp_[t] = live ? acc : 0.0f;
    }
    for (uint i = 0; i < T; i++) {
        __global float *out = dQ + odq + ((size_t)n * T + i) * lddq + h * HD;
        for (uint c = 0; c < HV; c++)
            vstore8((float8)(0.0f), c, out);
    }
    for (uint j0 = 0; j0 < T; j0 += RK)
        attn_dkdv_rows(T, H, Tp, scale, causal, Q, oq, ldq, K, ok, ldk, V, ov, ldv, dO, odo, lddo, Qt, Gt, Lp, Dp, dK,
                       odk, lddk, dV, odv, lddv, 1, dQ, odq, lddq, j0, nh DROPOUT_PASS);
}

#endif // HD % 8 == 0
