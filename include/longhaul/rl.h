/* longhaul rl: optimisation for the trainer. AdamW with decoupled weight decay, global
 * gradient-norm clipping, and a learning-rate schedule (constant or warmup + cosine).
 * The optimiser owns its two moment slabs; parameters and gradients belong to the caller. */
#ifndef LONGHAUL_RL_H
#define LONGHAUL_RL_H

#include <stddef.h>
#include <stdint.h>

#include "longhaul/env.h"
#include "longhaul/gen.h"
#include "longhaul/model.h"
#include "longhaul/tokenizer.h"

typedef enum { LH_SCHEDULE_CONSTANT = 0, LH_SCHEDULE_COSINE = 1 } lh_schedule;

typedef struct lh_adamw_config {
  float lr;
  float beta1, beta2, eps;
  float weight_decay; /* applied to 2-D weights (matrices, embeddings) only */
  float grad_clip;    /* max global L2 norm; <= 0 disables */
  lh_schedule schedule;
  int warmup_steps; /* linear warmup: step s < W uses lr*(s+1)/W, full lr from step W-1 */
  int total_steps;  /* cosine decays to min_lr_ratio*lr at total_steps */
  float min_lr_ratio;
} lh_adamw_config;

/* lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1, clip 1.0, constant, no warmup. */
lh_adamw_config lh_adamw_defaults(void);

#define LH_ADAMW_NORM_CHUNK 65536

typedef struct lh_adamw {
  lh_adamw_config cfg;
  size_t n;
  float *m;             /* (n) first moment slab */
  float *v;             /* (n) second moment slab */
  float *decay;         /* (n) 1 where weight decay applies, else 0 */
  double *norm_partial; /* (n / LH_ADAMW_NORM_CHUNK + 1) per-chunk sums of squares */
  int64_t step;         /* steps taken */
} lh_adamw;

/* Creates the optimiser for a model's parameter slab. */
lh_err lh_adamw_create(const lh_config *model_cfg, const lh_adamw_config *cfg, lh_adamw **out);
void lh_adamw_free(lh_adamw *opt);
/* Learning rate at (0-based) step. */
float lh_adamw_lr(const lh_adamw_config *cfg, int64_t step);
/* One update of params from grads (grads are clipped in place). Returns the global gradient
 * norm before clipping. A norm that is not finite (an inf or NaN among the gradients) changes
 * nothing: parameters, moments and the step count stay as they were (clipping would have turned
 * an inf into NaN weights). */
float lh_adamw_step(lh_adamw *opt, float *params, float *grads);

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
} lh_loss_config;

/* PPO, eps 0.2 / 0.28, C 2, [lo, hi] = [0.5, 2], no M2PO, token aggregation, no KL. */
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
} lh_loss_input;

typedef struct lh_loss_stats {
  double loss;      /* pg_loss + kl_loss */
  double pg_loss;   /* the policy term */
  double kl_loss;   /* kl_beta * aggregated k3(ref, logp) */
  double clip_frac; /* kept tokens where the clipped side of the min is taken / kept tokens */
  double ratio_min, ratio_mean, ratio_max; /* pi/mu over valid tokens (unweighted) */
  double masked_frac;    /* valid tokens dropped by the IS mask or M2PO / valid tokens */
  double kl_mu_pi;       /* k3 estimate of KL(mu || pi), weighted mean over valid tokens */
  double m2po_threshold; /* M2PO: kept tokens have squared log-ratio <= this; else 0 */
  int n_valid, n_masked, n_clipped;
} lh_loss_stats;

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

/* ---------------------------------------------------------------- rollouts
 * Tasks of an environment sampled with the rollout engine and scored: the unit the RL loop
 * trains on and the evaluator counts. n_groups tasks, group_size completions each; completion j
 * of group t uses the sampler stream seq_base + t * group_size + j. */

typedef struct lh_rollout_batch {
  int n_groups, group_size; /* n = n_groups * group_size sequences, group by group */
  int64_t version;          /* policy version that generated the batch (set by the caller) */
  uint64_t *task_index;     /* (n_groups) */
  uint8_t *group_ok;        /* (n_groups) 0: the environment failed on this task (exec); the
                             * group's sequences are empty and its rewards 0 */
  int *seq_start;           /* (n+1) offsets into tokens and mu */
  int *prompt_len;          /* (n) the first prompt_len tokens of a sequence are the prompt */
  int32_t *tokens;          /* prompt then completion */
  float *mu;                /* aligned with tokens: behaviour log-prob of completion tokens
                             * (the sampling distribution's), 0 on prompt tokens */
  float *old;               /* aligned with tokens, or NULL: the trainer's fp32 log-probs of the
                             * policy that generated the batch (lh_rollout_recompute), for TIS
                             * and masked IS */
  float *reward;            /* (n) */
  uint8_t *correct, *well_formed, *finish; /* (n); finish is an lh_finish */
} lh_rollout_batch;

/* Generates and scores. Prompts are encoded recognising special tokens (as `generate` and
 * Hugging Face tokenizers do), completions are decoded without special tokens before scoring. Group
 * t is task task_index[t] of split: taken from tasks[t] when the caller fetched the tasks already
 * (an evaluation that runs several models on the same tasks; a task with a NULL prompt is one the
 * environment failed to produce), fetched here with lh_env_task_get when tasks is NULL. A task that
 * the environment fails to produce or score (exec: crash, timeout, malformed reply) marks its group
 * not ok, is logged, and the batch goes on; so does a task whose prompt leaves fewer than
 * gc->max_new tokens of the generator's max_seq (no completion is cut short by the context). Other
 * errors (encoding, a bad token) fail the call. The batch's arrays are allocated here; free them
 * with lh_rollout_batch_free. */
lh_err lh_rollout_generate(lh_generator *g, const lh_gen_config *gc, const lh_tokenizer *tok,
                           lh_env *env, lh_split split, const uint64_t *task_index,
                           const lh_env_task *tasks, int n_groups, int group_size,
                           uint64_t seq_base, lh_rollout_batch *out);
void lh_rollout_batch_free(lh_rollout_batch *b);
/* Fills b->old (allocated here) with the log-probs the training forward of `t` gives the batch's
 * tokens: called right after generation, with the weights that generated it, this is pi_old of
 * TIS and masked IS (the behaviour policy in the trainer's numerics; mu is the sampler's). */
lh_err lh_rollout_recompute(lh_train *t, lh_rollout_batch *b);

/* ---------------------------------------------------------------- training on rollouts
 * Batch assembly: a rollout batch becomes a packed training batch. Advantages are computed per
 * group from the rewards; groups whose rewards are all equal carry no signal and groups the
 * environment failed on carry nothing, so both are left out of the batch (and counted). Loss
 * weight 1 on completion tokens, 0 on the prompt; mu is the rollout's behaviour log-prob. */

typedef struct lh_rl_batch {
  int n_seqs;
  int *seq_start;  /* (n_seqs+1) */
  int32_t *tokens; /* (N) */
  float *weight;   /* (N) 1 on completion tokens */
  float *adv;      /* (N) the sequence's advantage on every token */
  float *mu;       /* (N) behaviour log-probs */
  float *old;      /* (N) the rollout's recomputed behaviour log-probs, or NULL */
  float *ref;      /* (N) reference-model log-probs for the KL penalty, or NULL (the caller
                    * fills it; lh_rl_batch_free frees it) */
  int *group;      /* (n_seqs) the rollout group each sequence came from */
  int n_groups_used, n_groups_skipped, n_groups_failed;
} lh_rl_batch;

lh_err lh_rl_batch_assemble(const lh_rollout_batch *rb, const lh_adv_config *adv, lh_rl_batch *out);
void lh_rl_batch_free(lh_rl_batch *b);

typedef struct lh_rl_step_stats {
  lh_loss_stats loss; /* losses summed over the minibatches; ratios, KL and fractions over
                       * all their tokens */
  double grad_norm;   /* mean over the minibatches' updates, before clipping */
  int n_updates;      /* optimiser steps taken (0 when the batch is empty) */
  int n_skipped;      /* minibatches whose gradient norm was not finite: no step taken */
  long tokens;        /* tokens forwarded (each minibatch once, plus the proximal forward) */
} lh_rl_step_stats;

/* One policy update from an assembled batch: the sequences are split, group by group, into
 * `minibatches` parts, each a forward, a loss, a backward and an AdamW step. The old/proximal
 * log-probs (TIS, MIS, decoupled) are those of the weights before the first minibatch; with one
 * minibatch they come from the same forward.
 * TIS and masked IS take `old` from the batch (lh_rollout_recompute) when it has one;
 * decoupled PPO always uses the proximal log-probs. t: a training state sized for the batch.
 * An empty batch changes nothing. */
lh_err lh_rl_update(lh_train *t, lh_adamw *opt, lh_model *m, const lh_loss_config *loss,
                    int minibatches, const lh_rl_batch *b, lh_rl_step_stats *stats);

/* ---------------------------------------------------------------- the single-process loop
 * `longhaul rl`: sample, score, assemble, update, repeat, with a delay queue of `staleness`
 * rollout batches between the policy that generates and the policy that trains. Update s
 * (1-based) trains on the batch generated K generations earlier; the first K + 1 batches are
 * generated before the first update, so the staleness of update s is min(s - 1, K). Generation g
 * uses train tasks g*prompts .. g*prompts + prompts - 1 and sampler streams from
 * g * prompts * group, with the run's seed: the run is a pure function of its settings. */

typedef struct lh_rl_run_config {
  const char *model_dir; /* the starting policy (with tokenizer.json) */
  const char *out_dir;   /* RUN: run.json, metrics.jsonl, checkpoints/step-NNNNNN, latest */
  const char *env_spec;  /* lh_env_config_parse syntax */
  int steps;             /* policy updates in total (a resumed run continues up to it) */
  int group, prompts;    /* completions per prompt, prompts per step */
  int max_new;           /* completion tokens at most */
  int max_prompt;        /* prompt tokens at most; tasks with longer prompts are skipped */
  int staleness;         /* K */
  int minibatches;       /* optimiser steps per batch */
  int slots;             /* concurrent sequences in the generator */
  int save_every;        /* checkpoint every N updates (and at the end); 0: only at the end */
  int keep;              /* keep the newest N checkpoints, delete older ones; 0: keep all */
  int log_every;         /* progress line on stderr every N updates */
  uint64_t seed;         /* at most INT64_MAX: run.json records it as a JSON integer */
  lh_loss_config loss;
  lh_adv_config adv;
  lh_adamw_config opt;
  bool resume; /* continue RUN from its latest checkpoint (same settings required) */
} lh_rl_run_config;

/* Group 8, 16 prompts, 32 new tokens, prompts of up to 256 tokens, no staleness, 1 minibatch, 64
 * slots, save every 50 and keep all checkpoints, log every 10, seed 0, lh_loss_defaults but TIS
 * (docs/RESULTS.md, "Staleness"), GRPO with std normalisation, AdamW lr 1e-4 (constant) without
 * weight decay. */
lh_rl_run_config lh_rl_run_defaults(void);
/* Runs (or resumes) the loop; errors name the file or setting. */
lh_err lh_rl_run(const lh_rl_run_config *cfg);

#endif
