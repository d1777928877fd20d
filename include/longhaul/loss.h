/* longhaul loss: policy losses with off-policy corrections and group-relative advantages
 * (docs/ALGORITHMS.md, "Policy losses and advantages"), and the names by which users and run
 * files spell their kinds. Pure functions of plain arrays: the caller owns every buffer, nothing
 * is allocated or kept, and any thread may call them. */
#ifndef LONGHAUL_LOSS_H
#define LONGHAUL_LOSS_H

#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

/* ---------------------------------------------------------------- policy losses
 * Per-token policy-gradient losses with off-policy corrections (docs/ALGORITHMS.md, "Policy
 * losses and advantages"). Plain arrays: the caller owns every buffer; nothing is allocated.
 * The loss is computed in double; dlogp is dL/dlogprob per token, ready for lh_train_backward. */

typedef enum {
  LH_LOSS_PPO = 0,       /* PPO-clip on r = pi/mu */
  LH_LOSS_TIS = 1,       /* min(pi_old/mu, C) (no grad) x PPO-clip on pi/pi_old; needs old */
  LH_LOSS_MIS = 2,       /* masked IS (IcePop): drop tokens with q = pi_old/mu (pi/mu without
                          * old) outside [lo, hi]; PPO-clip on pi/pi_old (pi/mu without old) */
  LH_LOSS_DECOUPLED = 3, /* AReaL: PPO-clip on pi/pi_prox, weight pi_prox/mu clamped to <= C,
                          * or masked outside [lo, hi] with prox_mask; needs old (= prox) */
  /* The off-policy candidates of docs/RESULTS.md, "Learning from stale rollouts"; `beh` is old
   * when given, else mu (the behaviour policy), and S_i = sum over sequence i's valid tokens
   * of (logp - mu), without gradient, its log sequence ratio pi/mu. */
  LH_LOSS_M2PO = 4,    /* M2PO (official code): PPO-clip on r = pi/beh with bounds [e^-t, e^t],
                        * t from the second moment of the harmful tokens (A > 0 and r > 1, or
                        * A < 0 and r < 1): the largest of their (log r)^2 whose cap keeps
                        * their mean <= m2_tau; no bound when their mean is <= m2_tau already */
  LH_LOSS_SEQ_TIS = 5, /* sequence-level truncated IS (VCPO): -min(e^S_i, seq_cap) A logp
                        * (its weight, like VESPO's and SNIS's, without gradient) */
  LH_LOSS_VESPO = 6,   /* VESPO: -phi(e^S_i) A logp, phi(W) = W^k e^(lambda (1 - W)) with
                        * (k, lambda) = (2, 3) for A >= 0 and (3, 2) for A < 0 */
  LH_LOSS_DPPO = 7,    /* prime-rl's default: -r A on r = pi/mu, tokens masked whose probability
                        * moved more than tv_delta in the advantage's direction, plus
                        * tv_kl (log r)^2 on every valid token */
  LH_LOSS_OAPL = 8,    /* OAPL: per sequence (oapl_beta2 sum (logp - beh) - (R_i - V))^2, V =
                        * oapl_beta1 log mean_j exp(R_j / oapl_beta1) over the group; needs
                        * reward and group; mean over sequences (agg is not used) */
  LH_LOSS_SNIS = 9,    /* group self-normalised sequence IS: w_i = G e^S_i / sum_j e^S_j over
                        * the group's G sequences, advantage re-centred under the weights,
                        * A'_i = A_i - sum_j w_j A_j / G; -w_i A'_i logp; needs group */
} lh_loss_kind;

typedef enum {
  LH_AGG_TOKEN = 0, /* sum over the batch / sum of loss weights of the batch (DAPO) */
  LH_AGG_SEQ = 1,   /* per-sequence weighted mean, then mean over sequences with weight > 0 */
  LH_AGG_CONST = 2, /* sum / constant, or sum / (n_seqs * max weighted tokens in a sequence)
                     * when constant <= 0 (Dr. GRPO) */
} lh_loss_agg;

typedef struct lh_loss_config {
  lh_loss_kind kind;
  float eps_low, eps_high; /* clip r to [1 - eps_low, 1 + eps_high] */
  float C;                 /* TIS / DECOUPLED truncation of the behaviour weight */
  float lo, hi;            /* MIS (and DECOUPLED with prox_mask) kept range of the ratio */
  int prox_mask;           /* DECOUPLED: mask outside [lo, hi] instead of clamping to C */
  float m2po_tau;          /* > 0: M2PO mask on the squared log-ratio, any kind; <= 0: off */
  lh_loss_agg agg;
  float constant; /* LH_AGG_CONST normaliser; <= 0 means n_seqs * max_len */
  float kl_beta;  /* > 0: beta * k3 KL to the reference (needs ref); 0: off */
  float m2_tau;   /* M2PO: the second-moment budget */
  float seq_cap;  /* SEQ_TIS: truncation of the sequence weight */
  float tv_delta; /* DPPO: mask threshold on the change of a token's probability */
  float tv_kl;    /* DPPO: weight of the (log r)^2 penalty */
  float oapl_beta1, oapl_beta2;
  int ess_lr; /* scale the minibatch's learning rate by sqrt(min(1, ess)) (VCPO; lh_rl_update) */
} lh_loss_config;

/* PPO, eps 0.2 / 0.28, C 2, [lo, hi] = [0.5, 2], no M2PO mask, token aggregation, no KL; m2_tau
 * 0.04, seq_cap 8, tv_delta 0.2, tv_kl 1e-3, oapl_beta1 1, oapl_beta2 1e-3 (each method's
 * published default), no ESS learning-rate scaling. */
lh_loss_config lh_loss_defaults(void);

typedef struct lh_loss_input {
  int n_seqs;
  const int *seq_start; /* (n_seqs+1) token offsets, seq_start[0] = 0, non-decreasing */
  const float *weight;  /* (N) loss weight; tokens with weight <= 0 are not trained ("invalid") */
  const float *adv;     /* (N) advantage */
  const float *logp;    /* (N) current log-prob log pi_theta */
  const float *mu;      /* (N) behaviour log-prob (the sampler's) */
  const float *old;     /* (N) old / proximal log-prob, or NULL (PPO, MIS may omit it) */
  const float *ref;     /* (N) reference log-prob, or NULL (needed when kl_beta > 0) */
  const int *group;     /* (n_seqs) group of each sequence, equal for a group's contiguous
                         * sequences, or NULL (needed by OAPL and SNIS) */
  const float *reward;  /* (n_seqs) reward of each sequence, or NULL (needed by OAPL) */
} lh_loss_input;

typedef struct lh_loss_stats {
  double loss;      /* pg_loss + kl_loss */
  double pg_loss;   /* the policy term */
  double kl_loss;   /* kl_beta * aggregated k3(ref, logp) */
  double clip_frac; /* kept tokens where the clipped side of the min is taken / kept tokens */
  double ratio_min, ratio_mean, ratio_max; /* pi/mu over valid tokens (unweighted) */
  double masked_frac;    /* valid tokens dropped by the IS mask or M2PO / valid tokens */
  double kl_mu_pi;       /* k3 estimate of KL(mu || pi), weighted mean over valid tokens */
  double m2po_threshold; /* M2PO mask: kept tokens have squared log-ratio <= this; else 0.
                          * Kind M2PO: t^2 of its bounds (HUGE_VAL: unbounded) */
  double ess;            /* effective sample size of the sequence ratios e^S_i over sequences
                          * with weight, (sum w)^2 / (n sum w^2), in (0, 1]; 1 when none */
  int n_valid, n_masked, n_clipped;
} lh_loss_stats;

/* Whether a kind takes `old` as the trainer's log-probs of the policy that generated the batch
 * (lh_rollout_recompute): TIS, MIS, M2PO and OAPL. Decoupled PPO's old is the proximal policy;
 * the other kinds use mu only. */
int lh_loss_wants_old(lh_loss_kind kind);

/* Computes the loss, writes dlogp (N) (0 on invalid and masked tokens) and fills stats (may be
 * NULL). Returns LH_ERR_INVAL, with a message, for a bad config or missing arrays. */
lh_err lh_loss_compute(const lh_loss_config *cfg, const lh_loss_input *in, float *dlogp,
                       lh_loss_stats *stats);

/* ---------------------------------------------------------------- advantages
 * Group-relative advantages: rewards come in n_groups contiguous groups of group_size
 * completions of one prompt. */

typedef enum {
  LH_ADV_GRPO = 0, /* (r - mean) / (std + eps), std optional (Dr. GRPO: none) */
  LH_ADV_RLOO = 1, /* r_i - mean of the other G - 1 rewards */
} lh_adv_kind;

typedef struct lh_adv_config {
  lh_adv_kind kind;
  int std_norm; /* GRPO: divide by the sample std (G - 1 denominator) + eps */
  float eps;    /* GRPO with std_norm: finite, >= 0 */
} lh_adv_config;

/* Writes adv (n_groups * group_size). Groups whose rewards are all equal get advantage 0 and
 * are counted; returns that count, or -1 (with a message) for bad arguments. */
int lh_adv_compute(const lh_adv_config *cfg, const float *rewards, int n_groups, int group_size,
                   float *adv);
/* Spreads one advantage per sequence over its tokens: tok_adv[i] = seq_adv[s] for
 * seq_start[s] <= i < seq_start[s+1]. */
void lh_adv_to_tokens(int n_seqs, const int *seq_start, const float *seq_adv, float *tok_adv);

/* ---------------------------------------------------------------- names
 * How flags and run.json spell the kinds. Each array is indexed by the enum and ends with NULL. */
/* "ppo", "tis", "mis", "decoupled", "m2po", "seqtis", "vespo", "dppo", "oapl", "snis" */
extern const char *const lh_loss_kind_names[];
extern const char *const lh_loss_agg_names[]; /* "token", "seq", "const" */
extern const char *const lh_adv_kind_names[]; /* "grpo", "rloo" */
/* The name's index in a NULL-terminated list, or -1 (with a message listing the names, `what`
 * naming the setting) when it is none of them. */
int lh_name_index(const char *const *names, const char *name, const char *what);
/* The advantage estimators as `rl --adv` names them: "grpo" (std-normalised), "drgrpo" (GRPO
 * without std normalisation, Dr. GRPO) and "rloo"; NULL-terminated. */
extern const char *const lh_adv_flag_names[];
/* Sets kind and std_norm from an lh_adv_flag_names index (eps is left as it is). */
void lh_adv_from_flag(int index, lh_adv_config *a);
/* The lh_adv_flag_names index of a configuration. */
int lh_adv_flag_index(const lh_adv_config *a);

#endif
