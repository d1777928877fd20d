/* longhaul patch: lossless bf16 policy patches (docs/PROTOCOL.md, "Policy patches"). A policy
 * version is the bf16 slab in the Hugging Face tensor order of the model's table; its identity is
 * the BLAKE2b-256 hash of the slab's bytes (little-endian uint16). A patch from version u to v
 * holds the two hashes and, tensor by tensor (one section each, so a pipeline stage can take only
 * its layers), which values changed and by how many steps of the order-preserving integer image
 * of bf16, coded with an adaptive multi-symbol range coder whose contexts are the old value's
 * exponent.
 * Applying checks the parent's hash first and the child's last; any failure leaves the weights
 * as they were.
 * Ownership: buffers returned are malloc'd for the caller; lh_patch_info_free accepts NULL.
 * Thread safety: no state is kept; any thread may make or apply patches on its own buffers. */
#ifndef LONGHAUL_PATCH_H
#define LONGHAUL_PATCH_H

#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"
#include "longhaul/model.h"

/* The order-preserving integer image of a bf16 value: a < b as floats (with -0 just below +0,
 * NaN above everything of its sign) exactly when lh_bf16_key(a) < lh_bf16_key(b). */
static inline uint16_t lh_bf16_key(uint16_t b) {
  return (uint16_t)(b & 0x8000 ? ~b : b | 0x8000);
}
static inline uint16_t lh_bf16_from_key(uint16_t k) {
  return (uint16_t)(k & 0x8000 ? k & 0x7fff : ~k);
}

#define LH_PATCH_FORMAT       2
#define LH_PATCH_HEADER       128
#define LH_PATCH_SECTION      40
#define LH_PATCH_MAX_SECTIONS 65536

/* A range of the slab coded as one section: a tensor. Sections tile [0, n) in order. */
typedef struct lh_patch_section {
  uint64_t offset, count;
} lh_patch_section;

/* One section per tensor of the model's table (lh_model_tensors), in its order; returns the
 * count (at most cap written; out may be NULL to count). */
int lh_patch_sections(const lh_config *c, lh_patch_section *out, int cap);

/* What a patch's header and section table say (checked: magic, version, reserved bytes,
 * sections that tile the slab, lengths that add up to the patch's size). */
typedef struct lh_patch_info {
  int64_t from_version, to_version;
  uint64_t n_elements;
  uint8_t parent_hash[LH_HASH_BYTES], child_hash[LH_HASH_BYTES];
  int n_sections;
  uint64_t *offset, *count, *changed; /* (n_sections) */
  uint64_t *bytes;                    /* (n_sections) coded bytes of each section */
  uint8_t *coding;                    /* (n_sections) 0: no change, 1: range coded */
  uint64_t total_changed;
} lh_patch_info;

lh_err lh_patch_read_info(const uint8_t *patch, size_t len, lh_patch_info *info);
void lh_patch_info_free(lh_patch_info *info);

/* Makes the patch from parent to child (n values each, in the sections given). */
lh_err lh_patch_make(const uint16_t *parent, const uint16_t *child, uint64_t n,
                     const lh_patch_section *sections, int n_sections, int64_t from_version,
                     int64_t to_version, uint8_t **out, size_t *len);

/* Applies a patch to slab (n values) in place. The slab's hash must be the patch's parent hash:
 * it is computed here, unless parent_hash (the slab's hash as the caller verified it before) is
 * given, which must equal the patch's. The result must hash to the child hash. Any error (a bad
 * or truncated patch, another parent, a result with the wrong hash) restores the slab and says
 * which. */
lh_err lh_patch_apply(uint16_t *slab, uint64_t n, const uint8_t *patch, size_t len,
                      const uint8_t *parent_hash);

/* For benchmarks: applies the patch as lh_patch_apply does but checks neither hash (the stream
 * is still bounded and checked, and a bad one restores the slab): the decode's own speed. A
 * worker never uses this. */
lh_err lh_patch_decode_unchecked(uint16_t *slab, uint64_t n, const uint8_t *patch, size_t len);

/* For benchmarks: the bits an ideal coder needs for the symbols this format codes, each symbol
 * at its own table's empirical frequency in its section and each raw bit at 1 bit (the static
 * entropy of the model, a bound the adaptive coder approaches); -1 for sections that do not tile
 * the slab. */
double lh_patch_entropy_bits(const uint16_t *parent, const uint16_t *child, uint64_t n,
                             const lh_patch_section *sections, int n_sections);

/* The hash of a slab (BLAKE2b-256 of its little-endian bytes). */
void lh_patch_slab_hash(const uint16_t *slab, uint64_t n, uint8_t out[LH_HASH_BYTES]);

#endif
