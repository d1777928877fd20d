/* longhaul inference: the model's forward with a KV cache, on bf16 weights computed in fp32.
 * An lh_infer holds the published policy's bf16 weights (immutable, shareable between threads);
 * an lh_kv holds the caches of a fixed number of sequence slots and all scratch, sized at
 * creation, so a forward allocates nothing. Weight products are lh_bf16mm at every batch size:
 * the weights exist only in bf16 (2 bytes per parameter), and a row's logits do not depend on
 * the other rows of its forward. One forward can mix prefill rows of one slot and decode rows of
 * others (continuous batching). */
#ifndef LONGHAUL_INFER_H
#define LONGHAUL_INFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/model.h"

typedef struct lh_infer lh_infer;

/* Loads DIR (config.json, safetensors, generation_config.json) and keeps the weights as one bf16
 * slab (F32 files are rounded to nearest even). RAM: 2 bytes per parameter. */
lh_err lh_infer_load(const char *dir, lh_infer **out);
/* The bf16 policy of a training model (its fp32 master weights rounded to nearest even);
 * LH_ERR_NOMEM when the slab cannot be allocated. */
lh_err lh_infer_from_model(const lh_model *m, lh_infer **out);
/* Re-rounds a training model's weights into an existing policy of the same configuration: the
 * next version of the policy without reallocating. Not while a
 * forward runs. A model whose config gives another forward (lh_config_same_forward: any size,
 * head layout, RoPE, norm or bias field) is LH_ERR_MISMATCH naming the field. */
lh_err lh_infer_update(lh_infer *m, const lh_model *src);
void lh_infer_free(lh_infer *m);
/* The policy's bf16 slab, *n values in the training slab's layout (lh_model_tensors gives each
 * tensor's offset): what a policy version is, for hashing and diffing. Valid until
 * lh_infer_free; lh_infer_update and lh_infer_set_range change it in place. */
const uint16_t *lh_infer_bf16(const lh_infer *m, size_t *n);
/* Writes vals[0..n) at slab positions [offset, offset + n) (applying a patch), so every
 * forward sees the new bits. A range
 * outside the slab is LH_ERR_INVAL and changes nothing. Not while a forward runs. */
lh_err lh_infer_set_range(lh_infer *m, size_t offset, const uint16_t *vals, size_t n);
const lh_config *lh_infer_config(const lh_infer *m);
/* Bytes of weights one forward reads, at any number of rows: the bf16 slab (2 bytes per
 * parameter). */
size_t lh_infer_weight_bytes(const lh_infer *m);

typedef struct lh_kv lh_kv;

/* Caches for n_slots sequences of up to max_seq tokens, and scratch for forwards of up to
 * max_rows rows. max_seq must not exceed the model's max_positions. RAM: 8 * L * KV*hd bytes
 * per cached token, times n_slots * max_seq; when that (or any scratch) cannot be allocated,
 * LH_ERR_NOMEM names the buffer and its size. Per-thread scratch is sized for lh_threads() now:
 * the attention of later forwards runs on at most that many threads, even if lh_set_threads
 * raises the count (make the cache after setting it). */
lh_err lh_kv_create(const lh_infer *m, int n_slots, int max_seq, int max_rows, lh_kv **out);
void lh_kv_free(lh_kv *kv);
int lh_kv_max_seq(const lh_kv *kv);

/* One row of a forward: `token` at position `pos` of the sequence in `slot`. */
typedef struct lh_infer_row {
  int slot;
  int pos;
  int32_t token;
  bool logits; /* whether to compute this row's next-token logits */
} lh_infer_row;

/* Runs the rows: each row's K and V are written to its slot at pos, then the row attends to
 * positions [0, pos] of its slot. Positions below pos must have been written by earlier rows
 * (in this forward or a previous one); rows of one slot come in increasing pos. Writes the
 * logits of the rows that ask for them, in row order, to logits (n_wanted, V). Checks the
 * rows against the sizes given at creation (LH_ERR_INVAL / LH_ERR_LIMIT, nothing computed). */
lh_err lh_infer_forward(const lh_infer *m, lh_kv *kv, const lh_infer_row *rows, int n,
                        float *logits);

#endif
