/* longhaul rl: batch assembly from rollouts and the policy update (forward, policy loss,
 * backward, AdamW), split into minibatches by group. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/trainer.h"

void lh_rl_batch_free(lh_rl_batch *b) {
  if (!b) return;
  free(b->seq_start);
  free(b->tokens);
  free(b->weight);
  free(b->adv);
  free(b->mu);
  free(b->old);
  free(b->ref);
  free(b->group);
  free(b->reward);
  memset(b, 0, sizeof *b);
}

lh_err lh_rl_batch_assemble(const lh_rollout_batch *rb, const lh_adv_config *adv,
                            lh_rl_batch *out) {
  memset(out, 0, sizeof *out);
  int G = rb->group_size, n = rb->n_groups * G;
  float *seq_adv = lh_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *seq_adv);
  if (lh_adv_compute(adv, rb->reward, rb->n_groups, G, seq_adv) < 0) {
    free(seq_adv);
    return LH_ERR_INVAL;
  }
  /* A group is used when the environment scored it and its rewards differ. */
  uint8_t *used = lh_xcalloc((size_t)(rb->n_groups > 0 ? rb->n_groups : 1), 1);
  int N = 0, n_seqs = 0;
  for (int t = 0; t < rb->n_groups; t++) {
    int equal = 1;
    for (int j = 1; j < G; j++)
      if (rb->reward[t * G + j] != rb->reward[t * G]) equal = 0;
    if (!rb->group_ok[t]) {
      out->n_groups_failed++;
    } else if (equal) {
      out->n_groups_skipped++;
    } else {
      out->n_groups_used++;
      used[t] = 1;
      n_seqs += G;
      N += rb->seq_start[(t + 1) * G] - rb->seq_start[t * G];
    }
  }
  out->n_seqs = n_seqs;
  out->seq_start = lh_xmalloc(((size_t)n_seqs + 1) * sizeof *out->seq_start);
  out->group = lh_xmalloc(((size_t)n_seqs + 1) * sizeof *out->group);
  out->reward = lh_xmalloc(((size_t)n_seqs + 1) * sizeof *out->reward);
  size_t cap = (size_t)(N > 0 ? N : 1);
  out->tokens = lh_xmalloc(cap * sizeof *out->tokens);
  out->weight = lh_xmalloc(cap * sizeof *out->weight);
  out->adv = lh_xmalloc(cap * sizeof *out->adv);
  out->mu = lh_xmalloc(cap * sizeof *out->mu);
  out->old = rb->old ? lh_xmalloc(cap * sizeof *out->old) : NULL;
  int at = 0, s = 0;
  out->seq_start[0] = 0;
  for (int t = 0; t < rb->n_groups; t++) {
    if (!used[t]) continue;
    for (int j = 0; j < G; j++) {
      int r = t * G + j, a = rb->seq_start[r], len = rb->seq_start[r + 1] - a;
      memcpy(out->tokens + at, rb->tokens + a, (size_t)len * sizeof *out->tokens);
      memcpy(out->mu + at, rb->mu + a, (size_t)len * sizeof *out->mu);
      if (rb->old) memcpy(out->old + at, rb->old + a, (size_t)len * sizeof *out->old);
      for (int i = 0; i < len; i++) {
        out->weight[at + i] = i >= rb->prompt_len[r] && i > 0 ? 1.0f : 0.0f;
        out->adv[at + i] = seq_adv[r];
      }
      at += len;
      out->group[s] = t;
      out->reward[s] = rb->reward[r];
      out->seq_start[++s] = at;
    }
  }
  free(seq_adv);
  free(used);
  return LH_ERR_OK;
}

/* Folds one minibatch's loss statistics into the running totals. */
static void stats_add(lh_loss_stats *acc, const lh_loss_stats *s, int first) {
  if (first) {
    *acc = *s;
    return;
  }
  int nv = acc->n_valid + s->n_valid;
  if (nv > 0) {
    acc->ratio_mean = (acc->ratio_mean * acc->n_valid + s->ratio_mean * s->n_valid) / nv;
    acc->kl_mu_pi = (acc->kl_mu_pi * acc->n_valid + s->kl_mu_pi * s->n_valid) / nv;
    acc->ess = (acc->ess * acc->n_valid + s->ess * s->n_valid) / nv;
  }
  if (s->n_valid > 0) {
    acc->ratio_min = acc->n_valid > 0 ? fmin(acc->ratio_min, s->ratio_min) : s->ratio_min;
    acc->ratio_max = acc->n_valid > 0 ? fmax(acc->ratio_max, s->ratio_max) : s->ratio_max;
  }
  acc->loss += s->loss;
  acc->pg_loss += s->pg_loss;
  acc->kl_loss += s->kl_loss;
  acc->n_valid = nv;
  acc->n_masked += s->n_masked;
  acc->n_clipped += s->n_clipped;
  int kept = acc->n_valid - acc->n_masked;
  acc->clip_frac = kept > 0 ? (double)acc->n_clipped / kept : 0.0;
  acc->masked_frac = nv > 0 ? (double)acc->n_masked / nv : 0.0;
}

lh_err lh_rl_update(lh_train *t, lh_adamw *opt, lh_model *m, const lh_loss_config *loss,
                    int minibatches, const lh_rl_batch *b, lh_rl_step_stats *stats) {
  memset(stats, 0, sizeof *stats);
  if (b->n_seqs == 0) return LH_ERR_OK;
  if (minibatches < 1)
    return lh_errorf(LH_ERR_INVAL, "rl update: minibatches %d, expected >= 1", minibatches);
  /* Split points at group boundaries, as even in sequences as the groups allow. */
  int n_groups = 1;
  for (int s = 1; s < b->n_seqs; s++)
    n_groups += b->group[s] != b->group[s - 1];
  if (minibatches > n_groups) minibatches = n_groups;
  int N = b->seq_start[b->n_seqs];
  float *logp = lh_xmalloc((size_t)N * sizeof *logp);
  float *old = NULL;
  float *dlogp = lh_xmalloc((size_t)N * sizeof *dlogp);
  lh_err e = LH_ERR_OK;
  lh_batch full = {b->n_seqs, b->seq_start, b->tokens, b->weight};
  if ((e = lh_batch_validate(t, &full))) goto out;
  int need_old = loss->kind == LH_LOSS_DECOUPLED || lh_loss_wants_old(loss->kind);
  /* The rollout's recomputed behaviour log-probs when it has them. */
  const float *given = b->old && lh_loss_wants_old(loss->kind) ? b->old : NULL;
  /* Otherwise, with several minibatches: proximal log-probs of the weights before updating. */
  if (need_old && !given && minibatches > 1) {
    old = lh_xmalloc((size_t)N * sizeof *old);
    lh_train_forward(t, &full, old);
    stats->tokens += N;
  }
  int *starts = lh_xmalloc(((size_t)b->n_seqs + 1) * sizeof *starts);
  double gn = 0.0;
  int s0 = 0;
  for (int k = 0; k < minibatches; k++) {
    /* Sequences [s0, s1): the groups up to the k+1-th share of the sequences. */
    int s1 = k + 1 == minibatches ? b->n_seqs : (int)((long)b->n_seqs * (k + 1) / minibatches);
    while (s1 < b->n_seqs && s1 > s0 && b->group[s1] == b->group[s1 - 1])
      s1++;
    if (s1 <= s0) continue;
    int a = b->seq_start[s0], ns = s1 - s0;
    for (int s = 0; s <= ns; s++)
      starts[s] = b->seq_start[s0 + s] - a;
    lh_batch mb = {ns, starts, b->tokens + a, b->weight + a};
    lh_train_zero_grad(t);
    lh_train_forward(t, &mb, logp + a);
    stats->tokens += starts[ns];
    const float *o = NULL;
    if (need_old) o = given ? given + a : old ? old + a : logp + a;
    lh_loss_input in = {ns,
                        starts,
                        b->weight + a,
                        b->adv + a,
                        logp + a,
                        b->mu + a,
                        o,
                        b->ref ? b->ref + a : NULL,
                        b->group + s0,
                        b->reward ? b->reward + s0 : NULL};
    lh_loss_stats ls;
    if ((e = lh_loss_compute(loss, &in, dlogp + a, &ls))) break;
    stats_add(&stats->loss, &ls, stats->n_updates + stats->n_skipped == 0);
    lh_train_backward(t, &mb, dlogp + a);
    /* VCPO: the step shrinks with the effective sample size of the sequence ratios */
    float scale = loss->ess_lr ? (float)sqrt(fmin(1.0, ls.ess)) : 1.0f;
    float norm = lh_adamw_step_scaled(opt, m->params, lh_train_grads(t), scale);
    s0 = s1;
    if (!isfinite(norm)) {
      lh_log(LH_LOG_WARN, "rl: minibatch %d: the gradient norm is %g; update skipped", k + 1,
             (double)norm);
      stats->n_skipped++;
      continue;
    }
    gn += norm;
    stats->n_updates++;
  }
  stats->grad_norm = stats->n_updates > 0 ? gn / stats->n_updates : 0.0;
  free(starts);
out:
  free(logp);
  free(old);
  free(dlogp);
  return e;
}
