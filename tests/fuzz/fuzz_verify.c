/* libFuzzer target for rollout verification on hostile batches: any bytes decoded as a rollout
 * batch (small limits), then every ok group verified against fixed logits. Verification never
 * crashes or reads outside the batch or the logits; it accepts or rejects with a check in
 * range, or refuses an unusable group (bad sampling parameters, a member without a prompt) with
 * LH_ERR_INVAL. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/trust.h"

#include "fuzz_util.h"

#define V 128

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_rollout_limits lim = {8, 16, 4096, V};
  lh_rollout_batch b;
  if (lh_rollout_decode(data, size, &lim, "fuzz", &b) != LH_ERR_OK) return 0;
  int N = b.seq_start[b.n_groups * b.group_size];
  float *logits = malloc(((size_t)N + 1) * V * sizeof *logits);
  for (int i = 0; i < N; i++)
    for (int v = 0; v < V; v++)
      logits[(size_t)i * V + v] = (float)((i * 31 + v * 17 + b.tokens[i]) % 23) * 0.25f - 2.0f;
  lh_sample_scratch *s = lh_sample_scratch_create(V);
  lh_trust_config c = lh_trust_defaults();
  c.stop_ids[0] = 2;
  c.n_stop = 1;
  for (int t = 0; t < b.n_groups; t++) {
    if (!b.group_ok[t]) continue;
    lh_trust_verdict v;
    lh_err e = lh_trust_verify_group(&b, t, logits, V, &c, s, &v);
    CHECK(e == LH_ERR_OK || e == LH_ERR_INVAL);
    if (e) continue;
    CHECK(v.failed >= LH_TRUST_OK && v.failed <= LH_TRUST_STOP);
    CHECK(v.tokens_checked <= v.tokens);
    CHECK((v.failed == LH_TRUST_OK) == (v.reason[0] == '\0'));
    CHECK(v.failed == LH_TRUST_OK || (v.member >= 0 && v.member < b.group_size));
    /* each checked position's honest BORDERLINE chance is in [0, 1] */
    CHECK(v.borderline_expected >= 0.0 && v.borderline_expected <= (double)v.tokens_checked);
    CHECK(v.failed != LH_TRUST_OK || v.borderline_headroom >= 0);
  }
  lh_sample_scratch_free(s);
  free(logits);
  lh_rollout_batch_free(&b);
  return 0;
}
