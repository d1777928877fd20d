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
                          .kl_beta = 0.0f,
                          .m2_tau = 0.04f,
                          .seq_cap = 8.0f,
                          .tv_delta = 0.2f,
                          .tv_kl = 1e-3f,
                          .oapl_beta1 = 1.0f,
                          .oapl_beta2 = 1e-3f,
                          .ess_lr = 0};
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
  if ((int)cfg->kind < 0 || cfg->kind > LH_LOSS_SNIS)
    return lh_errorf(LH_ERR_INVAL, "loss: unknown kind %d", (int)cfg->kind);
  if ((cfg->kind == LH_LOSS_OAPL || cfg->kind == LH_LOSS_SNIS) && n > 0 && !in->group)
    return lh_errorf(LH_ERR_INVAL, "loss: %s needs the group of each sequence",
                     lh_loss_kind_names[cfg->kind]);
  if (cfg->kind == LH_LOSS_OAPL && n > 0 && !in->reward)
    return lh_errorf(LH_ERR_INVAL, "loss: oapl needs the reward of each sequence");
  if (cfg->kind == LH_LOSS_M2PO && !(cfg->m2_tau > 0.0f && isfinite(cfg->m2_tau)))
    return lh_errorf(LH_ERR_INVAL, "loss: m2po budget %g, expected > 0", cfg->m2_tau);
  if (cfg->kind == LH_LOSS_SEQ_TIS && !(cfg->seq_cap > 0.0f))
    return lh_errorf(LH_ERR_INVAL, "loss: sequence cap %g, expected > 0", cfg->seq_cap);
  if (cfg->kind == LH_LOSS_DPPO &&
      !(cfg->tv_delta >= 0.0f && cfg->tv_kl >= 0.0f && isfinite(cfg->tv_kl)))
    return lh_errorf(LH_ERR_INVAL, "loss: dppo delta %g and penalty %g must be >= 0", cfg->tv_delta,
                     cfg->tv_kl);
  if (cfg->kind == LH_LOSS_OAPL && !(cfg->oapl_beta1 > 0.0f && cfg->oapl_beta2 > 0.0f &&
                                     isfinite(cfg->oapl_beta1) && isfinite(cfg->oapl_beta2)))
    return lh_errorf(LH_ERR_INVAL, "loss: oapl betas %g and %g must be > 0", cfg->oapl_beta1,
                     cfg->oapl_beta2);
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

/* ---------------------------------------------------------------- M2PO's bound */

/* The behaviour log-prob of token i for the candidates' ratios: old when given, else mu. */
static double beh_of(const lh_loss_input *in, int i) {
  return in->old ? (double)in->old[i] : (double)in->mu[i];
}

/* Harmful token of M2PO: its ratio r = pi/beh moved the way its advantage pushes (A > 0 and
 * r > 1, or A < 0 and r < 1); *v is (log r)^2 as a float. */
static int m2_harmful(const lh_loss_input *in, int i, float *v) {
  if (!(in->weight[i] > 0.0f)) return 0;
  double x = (double)in->logp[i] - beh_of(in, i), A = in->adv[i];
  *v = (float)(x * x);
  return (A > 0.0 && x > 0.0) || (A < 0.0 && x < 0.0);
}

/* Sum over harmful tokens of min(v, t), and their count. */
static double m2_capped(const lh_loss_input *in, int n, float t, long *cnt) {
  double sum = 0.0;
  long c = 0;
  for (int i = 0; i < n; i++) {
    float v;
    if (!m2_harmful(in, i, &v)) continue;
    sum += v < t ? v : t;
    c++;
  }
  if (cnt) *cnt = c;
  return sum;
}

/* t^2 of M2PO's bounds: HUGE_VAL when the harmful tokens' mean (log r)^2 is <= tau already;
 * else the largest of their (log r)^2 values whose cap keeps the capped sum below tau per
 * token, or 0 when none does. The capped sum grows with the cap, so this bisects over the bits
 * of the cap (no sorting, no allocation) and then takes the largest value at or below it. */
static double m2_bound(const lh_loss_input *in, int n, double tau) {
  long cnt;
  float vmax = 0.0f;
  for (int i = 0; i < n; i++) {
    float v;
    if (m2_harmful(in, i, &v) && v > vmax) vmax = v;
  }
  double total = m2_capped(in, n, vmax, &cnt), budget = tau * (double)cnt;
  if (cnt == 0 || total <= budget) return HUGE_VAL;
  uint32_t lo = 0, hi; /* capped sum < budget at lo (cap 0: sum 0), not at hi */
  memcpy(&hi, &vmax, sizeof hi);
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (m2_capped(in, n, bits_float(mid), NULL) < budget)
      lo = mid;
    else
      hi = mid;
  }
  float t = bits_float(lo), best = 0.0f;
  for (int i = 0; i < n; i++) {
    float v;
    if (m2_harmful(in, i, &v) && v <= t && v > best) best = v;
  }
  return best;
}

/* ---------------------------------------------------------------- the loss */

/* S_i: the log sequence ratio pi/mu over sequence s's valid tokens (no gradient). */
static double seq_log_ratio(const lh_loss_input *in, int s) {
  double S = 0.0;
  for (int i = in->seq_start[s]; i < in->seq_start[s + 1]; i++)
    if (in->weight[i] > 0.0f) S += (double)in->logp[i] - (double)in->mu[i];
  return S;
}

/* The mean advantage of sequence s's valid tokens, and whether it has any. */
static int seq_adv(const lh_loss_input *in, int s, double *A) {
  double sum = 0.0;
  int cnt = 0;
  for (int i = in->seq_start[s]; i < in->seq_start[s + 1]; i++)
    if (in->weight[i] > 0.0f) sum += in->adv[i], cnt++;
  *A = cnt ? sum / cnt : 0.0;
  return cnt > 0;
}

/* VESPO's kernel, normalised to phi(1) = 1. */
static double vespo_phi(double W, double A) {
  double k = A >= 0.0 ? 2.0 : 3.0, lam = A >= 0.0 ? 3.0 : 2.0;
  double phi = exp(k * log(W) + lam * (1.0 - W));
  return isfinite(phi) ? phi : 0.0;
}

/* A group's statistics for SNIS and OAPL: the sequences [s0, s1) with valid tokens. */
typedef struct group_stats {
  int n;        /* sequences with valid tokens */
  double S_max; /* largest S_i */
  double z;     /* sum of e^(S_i - S_max) */
  double adv_w; /* sum of e^(S_i - S_max) A_i / z: the advantage's mean under pi */
  double value; /* OAPL: beta1 log mean e^(R_j / beta1) */
} group_stats;

static group_stats group_of(const lh_loss_config *cfg, const lh_loss_input *in, int s0, int s1) {
  group_stats g = {0, -HUGE_VAL, 0.0, 0.0, 0.0};
  double A, r_max = -HUGE_VAL, b1 = cfg->oapl_beta1;
  for (int s = s0; s < s1; s++) {
    if (!seq_adv(in, s, &A)) continue;
    g.n++;
    double S = seq_log_ratio(in, s);
    if (S > g.S_max) g.S_max = S;
    if (in->reward && in->reward[s] / b1 > r_max) r_max = in->reward[s] / b1;
  }
  double ez = 0.0;
  for (int s = s0; s < s1; s++) {
    if (!seq_adv(in, s, &A)) continue;
    double e = exp(seq_log_ratio(in, s) - g.S_max);
    g.z += e;
    g.adv_w += e * A;
    if (in->reward) ez += exp(in->reward[s] / b1 - r_max);
  }
  if (g.n > 0) {
    g.adv_w /= g.z;
    if (in->reward) g.value = b1 * (r_max + log(ez / g.n));
  }
  return g;
}

int lh_loss_wants_old(lh_loss_kind kind) {
  return kind == LH_LOSS_TIS || kind == LH_LOSS_MIS || kind == LH_LOSS_M2PO || kind == LH_LOSS_OAPL;
}

lh_err lh_loss_compute(const lh_loss_config *cfg, const lh_loss_input *in, float *dlogp,
                       lh_loss_stats *stats) {
  lh_err e = check(cfg, in, dlogp);
  if (e) return e;
  int n = in->seq_start[in->n_seqs];
  double lo_clip = 1.0 - cfg->eps_low, hi_clip = 1.0 + cfg->eps_high;
  double C = cfg->C, beta = cfg->kl_beta;
  lh_loss_kind kind = cfg->kind;

  /* Normalisers: total weight, sequences with weight, longest weighted sequence; and the
   * sequence ratios' effective sample size. */
  double w_total = 0.0, S_max = -HUGE_VAL;
  int n_seqs_w = 0, max_len = 0;
  for (int s = 0; s < in->n_seqs; s++) {
    double ws = 0.0;
    int len = 0;
    for (int i = in->seq_start[s]; i < in->seq_start[s + 1]; i++)
      if (in->weight[i] > 0.0f) ws += in->weight[i], len++;
    w_total += ws;
    if (len > 0) {
      n_seqs_w++;
      double S = seq_log_ratio(in, s);
      if (S > S_max) S_max = S;
    }
    if (len > max_len) max_len = len;
  }
  double ess_sum = 0.0, ess_sq = 0.0;
  for (int s = 0; s < in->n_seqs; s++) {
    double A;
    if (!seq_adv(in, s, &A)) continue;
    double w = exp(seq_log_ratio(in, s) - S_max);
    ess_sum += w, ess_sq += w * w;
  }
  double konst = cfg->constant > 0.0f ? (double)cfg->constant : (double)in->n_seqs * max_len;
  int use_m2po = cfg->m2po_tau > 0.0f && n > 0;
  float m2po_t = use_m2po ? m2po_threshold(in, n, cfg->m2po_tau) : 0.0f;
  double m2_t2 = kind == LH_LOSS_M2PO && n > 0 ? m2_bound(in, n, cfg->m2_tau) : 0.0;

  double pg = 0.0, kl = 0.0, kl_mu = 0.0, rsum = 0.0, rmin = HUGE_VAL, rmax = -HUGE_VAL;
  int n_valid = 0, n_masked = 0, n_clipped = 0;
  for (int g0 = 0; g0 < in->n_seqs;) {
    int g1 = g0 + 1; /* the group: contiguous sequences of one id (each alone without ids) */
    while (in->group && g1 < in->n_seqs && in->group[g1] == in->group[g0])
      g1++;
    group_stats gs = {0};
    if (kind == LH_LOSS_SNIS || kind == LH_LOSS_OAPL) gs = group_of(cfg, in, g0, g1);
    for (int s = g0; s < g1; s++) {
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
      /* The sequence's weight for the candidates that weight whole sequences. */
      double S = seq_log_ratio(in, s), seq_c = 1.0, adv_shift = 0.0, resid = 0.0;
      if (kind == LH_LOSS_SEQ_TIS) {
        seq_c = fmin(exp(fmin(S, 20.0)), cfg->seq_cap);
      } else if (kind == LH_LOSS_SNIS && gs.n > 0) {
        seq_c = gs.n * exp(S - gs.S_max) / gs.z;
        adv_shift = gs.adv_w;
      } else if (kind == LH_LOSS_OAPL) {
        double A;
        if (seq_adv(in, s, &A)) {
          double sum = 0.0;
          for (int i = a; i < b; i++)
            if (in->weight[i] > 0.0f) sum += in->weight[i] * ((double)in->logp[i] - beh_of(in, i));
          resid = cfg->oapl_beta2 * sum - ((double)in->reward[s] - gs.value);
          pg += resid * resid / n_seqs_w;
        }
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
        if (kind == LH_LOSS_OAPL) {
          dlogp[i] += (float)(2.0 * cfg->oapl_beta2 * w * resid / n_seqs_w);
          continue;
        }

        /* Behaviour weight c (no gradient), the log-ratio base of the ratio and its clip; or a
         * REINFORCE term -c A logp (the sequence-weighting kinds). */
        double base = in->old ? (double)in->old[i] : mu, c = 1.0, A = in->adv[i];
        double lo = lo_clip, hi = hi_clip;
        int keep = 1, reinforce = 0;
        switch (kind) {
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
        case LH_LOSS_M2PO: { /* a harmful token past the bound is clipped (decided on (log r)^2
                              * itself, so the token that sets the bound is never clipped) */
          float v;
          lo = 0.0, hi = HUGE_VAL;
          if (m2_harmful(in, i, &v) && m2_t2 != HUGE_VAL && v > m2_t2) {
            if (A > 0.0)
              hi = exp(sqrt(m2_t2));
            else
              lo = exp(-sqrt(m2_t2));
          }
          break;
        }
        case LH_LOSS_DPPO: { /* the penalty on every valid token, masked or not */
          double x = lp - mu, dp = exp(lp) - exp(mu);
          pg += cfg->tv_kl * w * x * x / norm;
          dlogp[i] += (float)(2.0 * cfg->tv_kl * w * x / norm);
          keep = A > 0.0 ? !(dp > cfg->tv_delta) : !(dp < -cfg->tv_delta);
          base = mu, lo = 0.0, hi = HUGE_VAL;
          break;
        }
        case LH_LOSS_VESPO:
          c = vespo_phi(exp(fmax(fmin(S, 20.0), -20.0)), A);
          reinforce = 1;
          break;
        case LH_LOSS_SNIS:
          A -= adv_shift;
          /* fall through */
        case LH_LOSS_SEQ_TIS:
          c = seq_c, reinforce = 1;
          break;
        case LH_LOSS_OAPL:
          break;
        }
        if (use_m2po && !(m2po_d(in, i) <= m2po_t)) keep = 0;
        if (!keep) {
          n_masked++;
          continue;
        }
        double r = exp(lp - base);
        double rc = r < lo ? lo : (r > hi ? hi : r);
        double obj, g; /* objective and its derivative in lp */
        if (reinforce) {
          obj = A * lp, g = A;
        } else if (r * A <= rc * A) {
          obj = r * A, g = r * A;
        } else {
          obj = rc * A, g = 0.0, n_clipped++;
        }
        pg += -c * w * obj / norm;
        dlogp[i] += (float)(-c * w * g / norm);
      }
    }
    g0 = g1;
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
    stats->m2po_threshold = use_m2po ? m2po_t : kind == LH_LOSS_M2PO ? m2_t2 : 0.0;
    stats->ess = ess_sq > 0.0 ? ess_sum * ess_sum / (n_seqs_w * ess_sq) : 1.0;
  }
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- names */

const char *const lh_loss_kind_names[] = {"ppo",   "tis",  "mis",  "decoupled", "m2po", "seqtis",
                                          "vespo", "dppo", "oapl", "snis",      NULL};
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
