/* Incremental inference of a token model (clgrad generate): a decoder
 * holds the model's layers set up a second time for T = 1 (clg_net_build_shape)
 * with a copy of a replica's weights, on that replica's device. A step feeds
 * n new positions pos0 .. pos0 + n - 1 of one sequence as n samples of
 * T = 1: per-position layers run their forward, [posembed] and [attention]
 * their forward_step (layer.h); each attention layer keeps the keys and
 * values of the positions fed so far (its cache, `context` positions), so a
 * step costs the new positions only. pos0 = 0 starts a new sequence (the
 * whole window recomputed: the no-cache mode and the sliding window of
 * src/train/generate.c). */
#ifndef CLG_MODEL_DECODE_H
#define CLG_MODEL_DECODE_H

#include "model/network.h"

typedef struct clg_decoder clg_decoder;

/* A decoder of src's network with src's current weights; half = 1: fp16
 * storage (weights rounded to half, activations stored in half, the
 * attention layers' key/value caches in half; fp32 arithmetic, as
 * --precision fp16 training). Refused (errors on
 * src's device) for a model that does not read token ids, whose output is
 * not a sequence of class scores, or with a layer that is not per position
 * and has no forward_step. */
CLG_INTERNAL clg_status clg_decoder_create(clg_replica *src, int half, clg_decoder **out);
CLG_INTERNAL void clg_decoder_free(clg_decoder *d);
/* Positions the model takes (its T) and classes per position. */
CLG_INTERNAL int clg_decoder_context(const clg_decoder *d);
CLG_INTERNAL int clg_decoder_vocab(const clg_decoder *d);
/* Device bytes of the attention layers' key/value caches (context
 * positions each; half as many in fp16). */
CLG_INTERNAL uint64_t clg_decoder_cache_bytes(const clg_decoder *d);
/* Feeds ids[0..n) at positions pos0 .. pos0 + n - 1 (pos0 0 or the number of
 * positions fed so far; pos0 + n <= context) and writes the vocab logits of
 * the last of them into logits. */
CLG_INTERNAL clg_status clg_decoder_step(clg_decoder *d, const int *ids, int n, int pos0, float *logits);

#endif
