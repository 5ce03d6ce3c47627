/* Multi-head scaled dot-product attention (kernels in cl/attention.cl).
 *
 * Legend: N batch, T positions, H heads, d head width, C = H d.
 * Layout: Q, K, V, O and the gradients are sequences (N, T, ld) row-major
 * (clg_attn_seq): head h of position t of sample n is the d floats at
 * off + (n T + t) ld + h d. With ld = 3C and offsets 0, C, 2C they are read
 * straight from a fused QKV projection's output (N, T, 3C), no transposes;
 * with ld = C from separate (N, T, C) buffers.
 *
 * Two algorithms, same results within rounding:
 *   fused: FlashAttention-style kernels; the T x T scores never reach global
 *     memory. Forward streams K, V through local memory with the online
 *     softmax and saves the log-sum-exp of each row (N H T floats);
 *     backward recomputes the scores tile by tile: one kernel for dK, dV
 *     (each work-item owns a key row and loops over query tiles) and one
 *     for dQ (owns a query row, loops over key tiles), D = rowsum(dO o O)
 *     first. No atomics: deterministic.
 *   gemm: the reference: batched GEMMs (src/ops/gemm.c) for S = scale Q K^T,
 *     a masked softmax in place, O = P V; saves P (N H T T floats; with
 *     dropout also the dropped-out P, twice that).
 * Dropout on the probabilities (clg_attn_desc.dropout): gemm, and fused in
 * its CPU variant 3 with the same mask (hashed from the element's index, as
 * the dropout layer; CLG_ERR_UNSUPPORTED in the other fused variants).
 * Every launcher only enqueues on dev->queue. */
#ifndef CLG_OPS_ATTENTION_H
#define CLG_OPS_ATTENTION_H

#include "device/device.h"

typedef enum clg_attn_algo {
    CLG_ATTN_AUTO = 0,  /* resolved by the caller (the layer measures); the launchers take fused */
    CLG_ATTN_FUSED = 1,
    CLG_ATTN_GEMM = 2,
    CLG_ATTN_ALGO_COUNT
} clg_attn_algo;

/* Largest head width the fused kernels are built for. */
#define CLG_ATTN_MAX_D 128

typedef struct clg_attn_desc {
    int N, T, heads, d; /* d: head width, 1..CLG_ATTN_MAX_D */
    int causal;         /* 1: position i attends to j <= i only */
    float scale;        /* usually 1 / sqrt(d) */
    int variant;        /* fused kernels: 1 K/V tiles in local memory (GPUs); 2 rows read
                           straight from global memory, no barriers (the compiler vectorizes
                           across work-items); 3 CPU register tiles: one work-item per block of
                           rows, explicit float16/float8 vectors over transposed copies of K, V
                           (Q, dO for dK/dV), head width a multiple of 8 (else 2);
                           0 by device: 3 (or 2) on CPUs, 1 elsewhere */
    int rq, rk;         /* variant 3: query / key rows per work-item (0: defaults, 8 and 8) */
    /* Inverted dropout on the probabilities (gemm algorithm and fused variant 3; the
     * other fused variants refuse dropout > 0): element (n, h, i, j) kept when hash(seed, step, base + ((n H + h) T + i) T
     * + j) >= dropout, as the dropout layer's mask (clg_nn_dropout), scaled by 1/(1 - dropout). */
    float dropout;
    uint32_t seed, step, base;
    int per_head; /* variant 3: 1 one work-item per head (forward: K transposed by the work-item, then
                     every row block, attn_fwd_cpu1; backward: dQ, dK, dV in one pass, attn_bwd_cpu1);
                     2 blocks of rows per work-item (transposes, separate dQ and dK/dV kernels); 0 by
                     heads: 1 when N heads >= 4 x the device's compute units (they keep them busy) */
} clg_attn_desc;

/* One operand: a sequence (N, T, ld) at element offset off of mem. */
typedef struct clg_attn_seq {
    cl_mem mem;
    size_t off;
    int ld; /* >= heads * d */
} clg_attn_seq;

/* "auto", "fused", "gemm" (NULL-terminated, indexed by clg_attn_algo). */
CLG_INTERNAL const char *const *clg_attn_algo_names(void);
/* CLG_OK when desc is valid (sizes positive, d in range, offsets within
 * 32 bits), else CLG_ERR_SHAPE naming the field on dev's error. */
CLG_INTERNAL clg_status clg_attn_check(clg_device *dev, const clg_attn_desc *a);
/* s holds rows rows of a->heads * a->d values at pitch s->ld from s->off,
 * within 32-bit offsets; errors name the operation op and the buffer name. */
CLG_INTERNAL clg_status clg_attn_check_rows(clg_device *dev, const clg_attn_desc *a, const char *op,
                                            const char *name, const clg_attn_seq *s, double rows);
/* Floats forward saves for backward: N H T (fused: lse) or N H T T (gemm: P;
 * 2 N H T T with dropout). */
CLG_INTERNAL size_t clg_attn_saved_floats(const clg_attn_desc *a, clg_attn_algo algo);

/* o = attention(q, k, v); saved (clg_attn_saved_floats(a, algo) floats at
 * saved_off, overwritten) keeps what backward needs. algo AUTO: fused. */
CLG_INTERNAL clg_status clg_attn_forward(clg_device *dev, const clg_attn_desc *a, clg_attn_algo algo,
                                         const clg_attn_seq *q, const clg_attn_seq *k, const clg_attn_seq *v,
                                         const clg_attn_seq *o, cl_mem saved, size_t saved_off);
/* dq, dk, dv (overwritten) from do_ and the forward's q, k, v, o and saved
 * (same algo). o is read by the fused path only (may have mem NULL for gemm). */
CLG_INTERNAL clg_status clg_attn_backward(clg_device *dev, const clg_attn_desc *a, clg_attn_algo algo,
                                          const clg_attn_seq *q, const clg_attn_seq *k, const clg_attn_seq *v,
                                          const clg_attn_seq *o, cl_mem saved, size_t saved_off,
                                          const clg_attn_seq *do_, const clg_attn_seq *dq, const clg_attn_seq *dk,
                                          const clg_attn_seq *dv);

/* ---- generation with a key/value cache (attn_cache.c, cl/decode.cl; half caches: attn_cache.h) ----
 * A cache holds the keys or values of up to Tc positions per sample:
 * (N, Tc, ld) rows, position j of sample n at row n Tc + j (cache.off,
 * cache.ld as in clg_attn_seq; rows counted with Tc, not a->T).
 * clg_attn_cache_append copies the a->T new positions of k_new and v_new
 * (sequences (N, a->T, ld)) into rows past .. past + a->T - 1 of kc, vc.
 * clg_attn_forward_cached: o (N, a->T, ld) = attention of the a->T new
 * queries q (positions past + i) against cached positions 0 .. past + a->T - 1
 * (causal: j <= past + i), the same values as clg_attn_forward over the whole
 * prefix for those rows; no lse saved (inference). past + a->T <= Tc. */
CLG_INTERNAL clg_status clg_attn_cache_append(clg_device *dev, const clg_attn_desc *a, int Tc, int past,
                                              const clg_attn_seq *k_new, const clg_attn_seq *v_new,
                                              const clg_attn_seq *kc, const clg_attn_seq *vc);
CLG_INTERNAL clg_status clg_attn_forward_cached(clg_device *dev, const clg_attn_desc *a, int Tc, int past,
                                                const clg_attn_seq *q, const clg_attn_seq *kc,
                                                const clg_attn_seq *vc, const clg_attn_seq *o);

#endif
