/* libFuzzer target for the rollout batch codec: decode any bytes under small limits; an accepted
 * batch validates, re-encodes to exactly the input (the format has one encoding of each batch),
 * and decodes again to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/rollout.h"

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_rollout_limits lim = {64, 16, 4096, 64};
  lh_rollout_batch b;
  if (lh_rollout_decode(data, size, &lim, "fuzz", &b) != LH_ERR_OK) {
    CHECK(b.tokens == NULL && b.seq_start == NULL);
    return 0;
  }
  CHECK(lh_rollout_validate(&b, &lim, "fuzz") == LH_ERR_OK);
  uint8_t *out = NULL;
  size_t len = 0;
  CHECK(lh_rollout_encode(&b, &out, &len) == LH_ERR_OK);
  CHECK(len == size && memcmp(out, data, size) == 0);
  lh_rollout_batch again;
  CHECK(lh_rollout_decode(out, len, &lim, "fuzz", &again) == LH_ERR_OK);
  lh_rollout_batch_free(&again);
  free(out);
  lh_rollout_batch_free(&b);
  return 0;
}
