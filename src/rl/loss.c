/* longhaul policy losses: PPO-clip (clip-higher), TIS, masked IS, decoupled PPO and the M2PO
 * mask, with token / sequence / constant aggregation and a k3 KL penalty. Computed in double over
 * caller-owned arrays; gradients are analytic (docs/ALGORITHMS.md, "Policy losses"). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "longhaul/loss.h"

lh_loss_config lh_loss_defaults(void) {
  return (lh_loss_config){.kind = LH_LOSS_PPO,
                          .eps_low = 0.2f,
                          .eps_high = 0.28f,
                          .C = 2.0f,
                          .lo = 0.5f,
                          .hi = 2.0f,
                          .prox_mask = 0,
                          .m2po_tau = 0.0f,
                          .agg = LH_AGG_TOKEN,
                          .constant = 0.0f,
                          .kl_beta = 0.0f};
}

static lh_err check(const lh_loss_config *cfg, const lh_loss_input *in, const float *dlogp) {
  if (!cfg || !in || !dlogp || in->n_seqs < 0 || !in->seq_start)
    return lh_errorf(LH_ERR_INVAL, "loss: NULL config, input, dlogp or seq_start");
  if (in->seq_start[0] != 0)
    return lh_errorf(LH_ERR_INVAL, "loss: seq_start[0] is %d, expected 0", in->seq_start[0]);
  for (int s = 0; s < in->n_seqs; s++)
    if (in->seq_start[s + 1] < in->seq_start[s])
      return lh_errorf(LH_ERR_INVAL, "loss: seq_start[%d] = %d < seq_start[%d] = %d", s + 1,
                       in->seq_start[s + 1], s, in->seq_start[s]);
  int n = in->seq_start[in->n_seqs];
  if (n > 0 && (!in->weight || !in->adv || !in->logp || !in->mu))
    return lh_errorf(LH_ERR_INVAL, "loss: weight, adv, logp and mu are required");
  if ((int)cfg->kind < 0 || cfg->kind > LH_LOSS_DECOUPLED)
    return lh_errorf(LH_ERR_INVAL, "loss: unknown kind %d", (int)cfg->kind);
  if ((cfg->kind == LH_LOSS_TIS || cfg->kind == LH_LOSS_DECOUPLED) && n > 0 && !in->old)
    return lh_errorf(LH_ERR_INVAL, "loss: %s needs old (proximal) log-probs",
                     cfg->kind == LH_LOSS_TIS ? "TIS" : "decoupled PPO");
  if (!(cfg->eps_low >= 0.0f && cfg->eps_low < 1.0f && cfg->eps_high >= 0.0f))
    return lh_errorf(LH_ERR_INVAL, "loss: eps_low %g must be in [0, 1), eps_high %g >= 0",
                     cfg->eps_low, cfg->eps_high);
  if ((cfg->kind == LH_LOSS_TIS || (cfg->kind == LH_LOSS_DECOUPLED && !cfg->prox_mask)) &&
      !(cfg->C > 0.0f))
    return lh_errorf(LH_ERR_INVAL, "loss: truncation C is %g, expected > 0", cfg->C);
  if ((cfg->kind == LH_LOSS_MIS || (cfg->kind == LH_LOSS_DECOUPLED && cfg->prox_mask)) &&
      !(cfg->lo >= 0.0f && cfg->lo <= cfg->hi))
    return lh_errorf(LH_ERR_INVAL, "loss: mask range [%g, %g] is empty", cfg->lo, cfg->hi);
  if ((int)cfg->agg < 0 || cfg->agg > LH_AGG_CONST)
    return lh_errorf(LH_ERR_INVAL, "loss: unknown aggregation %d", (int)cfg->agg);
  if (!(cfg->kl_beta >= 0.0f && isfinite(cfg->kl_beta)) ||
      (cfg->kl_beta > 0.0f && n > 0 && !in->ref))
    return lh_errorf(LH_ERR_INVAL, "loss: kl_beta %g needs ref log-probs and must be >= 0",
                     cfg->kl_beta);
  return LH_ERR_OK;
}

/* Squared log-ratio M2PO ranks tokens by: (old - mu)^2, or (logp - mu)^2 without old. */
static float m2po_d(const lh_loss_input *in, int i) {
  double a = in->old ? in->old[i] : in->logp[i];
  double x = a - (double)in->mu[i];
  return (float)(x * x);
}

/* Mean of d over valid tokens with d <= t is <= tau (an empty set passes). */
static int m2po_ok(const lh_loss_input *in, int n, float t, double tau) {
  double sum = 0.0;
  long cnt = 0;
  for (int i = 0; i < n; i++) {
    if (!(in->weight[i] > 0.0f)) continue;
    float d = m2po_d(in, i);
    if (d <= t) sum += d, cnt++;
  }
  return cnt == 0 || sum / (double)cnt <= tau;
}

static float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Largest threshold t such that the valid tokens with d <= t have mean d <= tau, returned as the
 * largest kept d (0 when none is kept). Non-negative floats order like their bit patterns, so
 * this bisects over the bits: about 32 passes over the tokens, no sorting, no allocation. */
static float m2po_threshold(const lh_loss_input *in, int n, double tau) {
  float dmax = 0.0f;
  for (int i = 0; i < n; i++)
    if (in->weight[i] > 0.0f && m2po_d(in, i) > dmax) dmax = m2po_d(in, i);
  if (m2po_ok(in, n, dmax, tau)) return dmax;
  uint32_t lo = 0, hi; /* m2po_ok at lo (t = 0 keeps only d = 0, mean 0), not at hi */
  memcpy(&hi, &dmax, sizeof hi);
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (m2po_ok(in, n, bits_float(mid), tau))
      lo = mid;
    else
      hi = mid;
  }
  float t = bits_float(lo), kept_max = 0.0f; /* report the largest kept d itself */
  for (int i = 0; i < n; i++)
    if (in->weight[i] > 0.0f && m2po_d(in, i) <= t && m2po_d(in, i) > kept_max)
      kept_max = m2po_d(in, i);
  return kept_max;
}

lh_err lh_loss_compute(const lh_loss_config *cfg, const lh_loss_input *in, float *dlogp,
                       lh_loss_stats *stats) {
  lh_err e = check(cfg, in, dlogp);
  if (e) return e;
  int n = in->seq_start[in->n_seqs];
  double lo_clip = 1.0 - cfg->eps_low, hi_clip = 1.0 + cfg->eps_high;
  double C = cfg->C, beta = cfg->kl_beta;

  /* Normalisers: total weight, sequences with weight, longest weighted sequence. */
  double w_total = 0.0;
  int n_seqs_w = 0, max_len = 0;
  for (int s = 0; s < in->n_seqs; s++) {
    double ws = 0.0;
    int len = 0;
    for (int i = in->seq_start[s]; i < in->seq_start[s + 1]; i++)
      if (in->weight[i] > 0.0f) ws += in->weight[i], len++;
    w_total += ws;
    if (ws > 0.0) n_seqs_w++;
    if (len > max_len) max_len = len;
  }
  double konst = cfg->constant > 0.0f ? (double)cfg->constant : (double)in->n_seqs * max_len;
  int use_m2po = cfg->m2po_tau > 0.0f && n > 0;
  float m2po_t = use_m2po ? m2po_threshold(in, n, cfg->m2po_tau) : 0.0f;

  double pg = 0.0, kl = 0.0, kl_mu = 0.0, rsum = 0.0, rmin = HUGE_VAL, rmax = -HUGE_VAL;
  int n_valid = 0, n_masked = 0, n_clipped = 0;
  for (int s = 0; s < in->n_seqs; s++) {
    int a = in->seq_start[s], b = in->seq_start[s + 1];
    double norm;
    if (cfg->agg == LH_AGG_TOKEN) {
      norm = w_total;
    } else if (cfg->agg == LH_AGG_SEQ) {
      double ws = 0.0;
      for (int i = a; i < b; i++)
        if (in->weight[i] > 0.0f) ws += in->weight[i];
      norm = ws * n_seqs_w;
    } else {
      norm = konst;
    }
    for (int i = a; i < b; i++) {
      dlogp[i] = 0.0f;
      double w = in->weight[i];
      if (!(w > 0.0)) continue;
      n_valid++;
      double lp = in->logp[i], mu = in->mu[i];
      double rho = exp(lp - mu); /* pi / mu, for the statistics */
      rsum += rho;
      if (rho < rmin) rmin = rho;
      if (rho > rmax) rmax = rho;
      kl_mu += w * (rho - 1.0 - (lp - mu));

      if (beta > 0.0) { /* k3 = exp(ref - lp) - (ref - lp) - 1; dk3/dlp = 1 - exp(ref - lp) */
        double x = (double)in->ref[i] - lp, ex = exp(x);
        kl += beta * w * (ex - x - 1.0) / norm;
        dlogp[i] += (float)(beta * w * (1.0 - ex) / norm);
      }

      /* Behaviour weight c (no gradient) and the log-ratio base of the PPO ratio. */
      double base = in->old ? (double)in->old[i] : mu, c = 1.0;
      int keep = 1;
      switch (cfg->kind) {
      case LH_LOSS_PPO:
        base = mu;
        break;
      case LH_LOSS_TIS:
        c = fmin(exp(base - mu), C);
        break;
      case LH_LOSS_MIS: {
        double q = in->old ? exp(base - mu) : rho;
        keep = q >= cfg->lo && q <= cfg->hi;
        break;
      }
      case LH_LOSS_DECOUPLED: {
        double q = exp(base - mu);
        if (cfg->prox_mask)
          keep = q >= cfg->lo && q <= cfg->hi;
        else
          c = fmin(q, C);
        break;
      }
      }
      if (use_m2po && !(m2po_d(in, i) <= m2po_t)) keep = 0;
      if (!keep) {
        n_masked++;
        continue;
      }
      double A = in->adv[i], r = exp(lp - base);
      double rc = r < lo_clip ? lo_clip : (r > hi_clip ? hi_clip : r);
      double obj, g; /* objective and its derivative in lp */
      if (r * A <= rc * A) {
        obj = r * A, g = r * A;
      } else {
        obj = rc * A, g = 0.0, n_clipped++;
      }
      pg += -c * w * obj / norm;
      dlogp[i] += (float)(-c * w * g / norm);
    }
  }
  if (stats) {
    memset(stats, 0, sizeof *stats);
    stats->pg_loss = pg;
    stats->kl_loss = kl;
    stats->loss = pg + kl;
    stats->n_valid = n_valid;
    stats->n_masked = n_masked;
    stats->n_clipped = n_clipped;
    int kept = n_valid - n_masked;
    stats->clip_frac = kept > 0 ? (double)n_clipped / kept : 0.0;
    stats->masked_frac = n_valid > 0 ? (double)n_masked / n_valid : 0.0;
    stats->ratio_min = n_valid > 0 ? rmin : 0.0;
    stats->ratio_max = n_valid > 0 ? rmax : 0.0;
    stats->ratio_mean = n_valid > 0 ? rsum / n_valid : 0.0;
    stats->kl_mu_pi = w_total > 0.0 ? kl_mu / w_total : 0.0;
    stats->m2po_threshold = use_m2po ? m2po_t : 0.0;
  }
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- names */

const char *const lh_loss_kind_names[] = {"ppo", "tis", "mis", "decoupled", NULL};
const char *const lh_loss_agg_names[] = {"token", "seq", "const", NULL};
const char *const lh_adv_kind_names[] = {"grpo", "rloo", NULL};
const char *const lh_adv_flag_names[] = {"grpo", "drgrpo", "rloo", NULL};

int lh_name_index(const char *const *names, const char *name, const char *what) {
  char list[256] = "";
  for (int i = 0; names[i]; i++) {
    if (!strcmp(names[i], name)) return i;
    size_t used = strlen(list);
    snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
  }
  lh_errorf(LH_ERR_INVAL, "%s: unknown value \"%s\"; expected one of %s", what, name, list);
  return -1;
}

void lh_adv_from_flag(int index, lh_adv_config *a) {
  a->kind = index == 2 ? LH_ADV_RLOO : LH_ADV_GRPO;
  a->std_norm = index == 0;
}

int lh_adv_flag_index(const lh_adv_config *a) {
  return a->kind == LH_ADV_RLOO ? 2 : a->std_norm ? 0 : 1;
}
