/* longhaul advantages: group-relative (GRPO, with or without std normalisation as in Dr. GRPO)
 * and leave-one-out (RLOO), computed per group of completions of one prompt in double. Groups
 * whose rewards are all equal carry no signal: their advantages are 0 and they are counted. */
#include <math.h>

#include "longhaul/loss.h"

int lh_adv_compute(const lh_adv_config *cfg, const float *rewards, int n_groups, int group_size,
                   float *adv) {
  if (!cfg || n_groups < 0 || group_size < 1 || (n_groups > 0 && (!rewards || !adv))) {
    lh_errorf(LH_ERR_INVAL, "advantages: bad arguments (n_groups %d, group_size %d)", n_groups,
              group_size);
    return -1;
  }
  if ((int)cfg->kind < 0 || cfg->kind > LH_ADV_RLOO) {
    lh_errorf(LH_ERR_INVAL, "advantages: unknown kind %d", (int)cfg->kind);
    return -1;
  }
  if (cfg->kind == LH_ADV_GRPO && cfg->std_norm && !(cfg->eps >= 0.0f && isfinite(cfg->eps))) {
    lh_errorf(LH_ERR_INVAL, "advantages: eps %g, expected finite and >= 0", cfg->eps);
    return -1;
  }
  int skipped = 0, G = group_size;
  for (int g = 0; g < n_groups; g++) {
    const float *r = rewards + (size_t)g * G;
    float *a = adv + (size_t)g * G;
    int equal = 1;
    double sum = 0.0;
    for (int i = 0; i < G; i++) {
      sum += r[i];
      if (r[i] != r[0]) equal = 0;
    }
    if (equal) {
      for (int i = 0; i < G; i++)
        a[i] = 0.0f;
      skipped++;
      continue;
    }
    double mean = sum / G; /* G >= 2 here: one reward is always "all equal" */
    if (cfg->kind == LH_ADV_RLOO) {
      for (int i = 0; i < G; i++)
        a[i] = (float)(r[i] - (sum - r[i]) / (G - 1));
      continue;
    }
    double scale = 1.0;
    if (cfg->std_norm) {
      double ss = 0.0;
      for (int i = 0; i < G; i++)
        ss += (r[i] - mean) * (r[i] - mean);
      scale = 1.0 / (sqrt(ss / (G - 1)) + cfg->eps);
    }
    for (int i = 0; i < G; i++)
      a[i] = (float)((r[i] - mean) * scale);
  }
  return skipped;
}

void lh_adv_to_tokens(int n_seqs, const int *seq_start, const float *seq_adv, float *tok_adv) {
  for (int s = 0; s < n_seqs; s++)
    for (int i = seq_start[s]; i < seq_start[s + 1]; i++)
      tok_adv[i] = seq_adv[s];
}
