/* libFuzzer target for snapshot blobs: decode any bytes under a limit of 2^16 values. A refusal
 * leaves nothing allocated; an accepted snapshot agrees with its header (lh_sync_snapshot_info:
 * the count, and the hash the slab has), and re-encodes (level 1) into a blob that decodes to the
 * same slab. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/sync.h"

#include "fuzz_util.h"

#define MAX_VALUES ((size_t)1 << 16)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint16_t *slab = NULL, *again = NULL;
  size_t n = 0, m = 0, len = 0;
  if (lh_sync_snapshot_decode(data, size, MAX_VALUES, "fuzz", &slab, &n) != LH_ERR_OK) {
    CHECK(slab == NULL && n == 0);
    CHECK(strncmp(lh_last_error(), "fuzz: ", 6) == 0);
    return 0;
  }
  CHECK(n >= 1 && n <= MAX_VALUES);
  uint8_t declared[LH_HASH_BYTES], actual[LH_HASH_BYTES];
  CHECK(lh_sync_snapshot_info(data, size, MAX_VALUES, "fuzz", &m, declared) == LH_ERR_OK);
  CHECK(m == n);
  lh_sync_slab_hash(slab, n, actual);
  CHECK(memcmp(declared, actual, LH_HASH_BYTES) == 0);
  uint8_t *blob = NULL;
  CHECK(lh_sync_snapshot_encode(slab, n, 1, &blob, &len) == LH_ERR_OK);
  CHECK(lh_sync_snapshot_decode(blob, len, n, "re-encoded", &again, &m) == LH_ERR_OK);
  CHECK(m == n && memcmp(again, slab, 2 * n) == 0);
  CHECK(memcmp(blob + 24, data + 24, LH_HASH_BYTES) == 0); /* same slab hash in the header */
  free(again);
  free(blob);
  free(slab);
  return 0;
}
