/* libFuzzer target for applying policy patches: any bytes as a patch to a fixed slab of 300
 * values. Applying either succeeds, and then the slab hashes to the patch's child hash, or fails
 * and leaves the slab exactly as it was. The seeds are real patches of this slab. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/patch.h"

#include "fuzz_util.h"

#define N 300

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint16_t slab[N], orig[N];
  for (int i = 0; i < N; i++)
    slab[i] = (uint16_t)(0x3c00 + (i * 37) % 512 - 256); /* values near 1 and their neighbours */
  memcpy(orig, slab, sizeof slab);
  lh_patch_info info;
  int parsed = lh_patch_read_info(data, size, &info) == LH_ERR_OK;
  lh_err e = lh_patch_apply(slab, N, data, size, NULL);
  if (e == LH_ERR_OK) {
    CHECK(parsed);
    uint8_t h[LH_HASH_BYTES];
    lh_patch_slab_hash(slab, N, h);
    CHECK(memcmp(h, info.child_hash, LH_HASH_BYTES) == 0);
  } else {
    CHECK(memcmp(slab, orig, sizeof slab) == 0);
  }
  if (parsed) lh_patch_info_free(&info);
  return 0;
}
