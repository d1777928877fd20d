/* longhaul patch: lossless bf16 policy patches (docs/PROTOCOL.md, "Policy patches"). A policy
 * version is the bf16 slab in the Hugging Face tensor order of the model's table; its identity is
 * the BLAKE2b-256 hash of the slab's bytes. A patch from version u to v codes, tensor by tensor,
 * which values changed and by how many steps of the order-preserving integer image of bf16.
 * Ownership: buffers returned are malloc'd for the caller. Thread safety: no state is kept; any
 * thread may make or apply patches on its own buffers. */
#ifndef LONGHAUL_PATCH_H
#define LONGHAUL_PATCH_H

#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

/* The order-preserving integer image of a bf16 value: a < b as floats (with -0 just below +0,
 * NaN above everything of its sign) exactly when lh_bf16_key(a) < lh_bf16_key(b). */
static inline uint16_t lh_bf16_key(uint16_t b) {
  return (uint16_t)(b & 0x8000 ? ~b : b | 0x8000);
}
static inline uint16_t lh_bf16_from_key(uint16_t k) {
  return (uint16_t)(k & 0x8000 ? k & 0x7fff : ~k);
}

#endif
