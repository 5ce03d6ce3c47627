/* Generation with the key/value cache in half (cl/decode.cl): the fp16
 * counterparts of clg_attn_cache_append and clg_attn_forward_cached
 * (attention.h). The caches hold IEEE half values (offsets and pitches in
 * halves); queries, new keys and values and the output are fp32. Core
 * OpenCL 1.2 (vload_half / vstore_half_rte): no cl_khr_fp16 needed. */
#ifndef CLG_OPS_ATTN_CACHE_H
#define CLG_OPS_ATTN_CACHE_H

#include "ops/attention.h"

/* Rows past .. past + a->T - 1 of each sample's Tc cache rows = half of
 * the a->T new keys and values of that sample. */
CLG_INTERNAL clg_status clg_attn_cache_append_half(clg_device *dev, const clg_attn_desc *a, int Tc, int past,
                                                   const clg_attn_seq *k_new, const clg_attn_seq *v_new,
                                                   const clg_attn_seq *kc, const clg_attn_seq *vc);
/* o = attention of the a->T queries at positions past .. over the cached
 * positions 0 .. past + a->T - 1 (causal when a->causal). */
CLG_INTERNAL clg_status clg_attn_forward_cached_half(clg_device *dev, const clg_attn_desc *a, int Tc, int past,
                                                     const clg_attn_seq *q, const clg_attn_seq *kc,
                                                     const clg_attn_seq *vc, const clg_attn_seq *o);

#endif
