/* libFuzzer target for a chain of signed manifests (lh_sync_chain_parse: the worker's reading of
 * GET /v1/policy?chain=1): the first byte is the version held (-1 .. 254), the rest the reply,
 * pinned to the fixture key of tests/fixtures/sync (as fuzz_manifest, so the corpus holds lines
 * that verify). An accepted chain has 1 .. 4 manifests, one per line, consecutive versions, the
 * newest beyond the one held; a refused one leaves nothing allocated. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/sync.h"

#include "fuzz_util.h"

#define MAX 4

static const char seed_hex[] = "d4169fd6b22116b3cce91787040406dd6efec77dd3ea4845f1f01958ff704b2c";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static lh_sync_public_key pk;
  static int init;
  if (!init) {
    uint8_t seed[LH_SYNC_SEED_BYTES];
    lh_sync_secret_key sk;
    CHECK(lh_sync_hash_parse(seed_hex, 64, "seed", seed) == LH_ERR_OK);
    lh_sync_key_from_seed(seed, &sk);
    lh_sync_key_public(&sk, &pk);
    init = 1;
  }
  if (size < 1) return 0;
  int64_t after = (int64_t)data[0] - 1;
  lh_sync_manifest *ms = (lh_sync_manifest *)&pk; /* must be reset */
  int n = -1;
  lh_err e = lh_sync_chain_parse(data + 1, size - 1, &pk, MAX, after, "fuzz", &ms, &n);
  if (e != LH_ERR_OK) {
    CHECK(ms == NULL && n == 0);
    CHECK(strncmp(lh_last_error(), "fuzz", 4) == 0);
    return 0;
  }
  CHECK(n >= 1 && n <= MAX && ms[n - 1].version > after);
  size_t lines = 0;
  for (size_t i = 1; i < size; i++)
    lines += data[i] == '\n';
  CHECK(lines == (size_t)n && data[size - 1] == '\n');
  for (int i = 1; i < n; i++)
    CHECK(ms[i].version == ms[i - 1].version + 1);
  free(ms);
  return 0;
}
