/* longhaul base: content hashes. BLAKE2b-256 from libsodium (crypto_generichash), the one hash
 * longhaul uses for weights, trainer states and, later, policy versions and blobs. */
#include <sodium.h>
#include <stdio.h>

#include "longhaul/base.h"

_Static_assert(LH_HASH_BYTES == crypto_generichash_BYTES, "BLAKE2b-256");

void lh_hash256(const void *data, size_t len, uint8_t out[LH_HASH_BYTES]) {
  /* sodium_init only picks implementations; crypto_generichash works before it, but call it so
   * the fastest one is used (it is idempotent and thread-safe) */
  if (sodium_init() < 0) lh__fatal(__FILE__, __LINE__, "sodium_init", "libsodium cannot start");
  crypto_generichash(out, LH_HASH_BYTES, data, len, NULL, 0);
}

void lh_hash_hex(const uint8_t h[LH_HASH_BYTES], char hex[2 * LH_HASH_BYTES + 1]) {
  for (int i = 0; i < LH_HASH_BYTES; i++)
    snprintf(hex + 2 * i, 3, "%02x", h[i]);
}
