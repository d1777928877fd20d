/* longhaul trainer: training on rollout batches. The pieces (batch assembly, one policy update)
 * and lh_trainer, which every driver (`rl`, and next `serve`) trains with: it owns the model
 * (fp32 master weights), the optimiser, the training state, the optional reference model for the
 * KL penalty and the bf16 policy of the current version; it takes any number of pending rollout
 * batches of any shape, checks a staleness bound when it takes one, and checkpoints itself.
 *
 * Ownership: lh_trainer_create takes the model; lh_trainer_free frees everything the trainer
 * holds, pending batches included, and accepts NULL, as does lh_rl_batch_free. Thread safety:
 * a trainer is used by one thread at a time (the training thread); its kernels parallelise
 * themselves with OpenMP. The policy it returns must not be read by another thread while
 * lh_trainer_step runs (the step refreshes it in place). */
#ifndef LONGHAUL_TRAINER_H
#define LONGHAUL_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "longhaul/infer.h"
#include "longhaul/loss.h"
#include "longhaul/model.h"
#include "longhaul/optim.h"
#include "longhaul/rollout.h"

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
  float *reward;   /* (n_seqs) each sequence's reward */
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

/* ---------------------------------------------------------------- the trainer */

typedef struct lh_trainer_config {
  lh_loss_config loss;
  lh_adv_config adv;
  lh_adamw_config opt;
  int minibatches;     /* optimiser steps per batch, >= 1 */
  int max_staleness;   /* K >= 0: a batch generated more than K versions before the update that
                        * takes it is dropped, not trained on */
  int max_seq;         /* tokens of one sequence at most (prompt and completion) */
  const char *ref_dir; /* the reference model of the KL penalty (needed when loss.kl_beta > 0),
                        * or NULL */
} lh_trainer_config;

/* Loss lh_loss_defaults but VESPO (docs/RESULTS.md, "Learning from stale rollouts"), GRPO with
 * std normalisation,
 * AdamW lr 1e-4 (constant) without weight decay, 1 minibatch, staleness 0, max_seq 0 (set it). */
lh_trainer_config lh_trainer_defaults(void);

typedef struct lh_trainer lh_trainer;

/* Creates a trainer that owns m (also on failure: m is freed then). Loads ref_dir when the KL
 * penalty is on. The policy starts as m rounded to bf16, at version 0. */
lh_err lh_trainer_create(lh_model *m, const lh_trainer_config *cfg, lh_trainer **out);
void lh_trainer_free(lh_trainer *t);
const lh_trainer_config *lh_trainer_config_of(const lh_trainer *t);
lh_model *lh_trainer_model(lh_trainer *t);
/* The bf16 policy of the current version, refreshed in place after every update. */
lh_infer *lh_trainer_policy(lh_trainer *t);
/* Updates taken so far: the version of the current policy. */
int64_t lh_trainer_version(const lh_trainer *t);
/* Batches waiting to be trained on, and batches submitted since the start (restored on load). */
int lh_trainer_pending(const lh_trainer *t);
int64_t lh_trainer_submitted(const lh_trainer *t);

/* Queues a batch and takes its arrays (*b is zeroed). Its version must not be newer than the
 * trainer's (LH_ERR_INVAL), it must be consistent (lh_rollout_validate with the model's
 * vocabulary) and no sequence may exceed max_seq (LH_ERR_LIMIT); a refused batch stays the
 * caller's. When the loss compares with the generating policy (TIS, masked IS)
 * and the batch comes from the current version, its old log-probs are computed now, with the
 * weights that generated it, unless the batch has them already (lh_trainer_recompute). */
lh_err lh_trainer_submit(lh_trainer *t, lh_rollout_batch *b);
/* Fills b->old with the log-probs of b's tokens under the bf16 policy `slab` (n values in the
 * model's layout, lh_infer_bf16): the behaviour policy of an older version that the caller
 * kept (the networked trainer receives rollouts after newer versions exist). The forward runs in
 * fp32 on a scratch model (4 bytes per parameter, allocated on first use and kept). n other
 * than the model's parameter count is LH_ERR_MISMATCH; a sequence longer than max_seq
 * LH_ERR_LIMIT. */
lh_err lh_trainer_recompute(lh_trainer *t, const uint16_t *slab, size_t n, lh_rollout_batch *b);
/* The logits of the last lh_trainer_recompute, (N, V) for its batch's N tokens, row i for token
 * i + 1 of the same sequence (the batch's non-empty sequences packed end to end): what the
 * verifier checks a worker's tokens against (trust.h), from the same forward. Valid until the
 * next lh_trainer_recompute; NULL before the first. */
const float *lh_trainer_recompute_logits(const lh_trainer *t);

typedef struct lh_trainer_step_stats {
  lh_rl_step_stats update; /* loss figures are NAN when no token was trained on, grad_norm
                            * when no optimiser step was taken */
  int64_t version;         /* the version after the step */
  int64_t batch_version;   /* the version that generated the batch trained on */
  int64_t staleness;       /* version before the step - batch_version */
  int groups_used, groups_skipped, groups_failed;
  int batches_dropped; /* older than the staleness bound, dropped before this one */
  double lr;           /* the learning rate of the last optimiser step taken */
} lh_trainer_step_stats;

/* Takes the oldest pending batch, dropping (and counting) those more than max_staleness versions
 * old, and trains on it: advantages, reference log-probs when the KL penalty is on, the update,
 * and the policy refresh. Every step advances the version, even one whose batch had no signal.
 * LH_ERR_NOTFOUND when no batch is pending (after drops). A loss that is not finite is
 * LH_ERR_NONFINITE, and the trainer is then unusable: its weights may have moved (write nothing).
 */
lh_err lh_trainer_step(lh_trainer *t, lh_trainer_step_stats *st);

/* Trainer state as a safetensors file: format name and version, the step and a BLAKE2b-256 hash
 * of the fp32 weights it belongs to, the AdamW moments and counters, and the pending batches
 * within the staleness bound (lh_rollout_encode; older ones, which the next step would drop,
 * are left out). Written atomically. */
lh_err lh_trainer_save(const lh_trainer *t, const char *path);
/* Restores what lh_trainer_save wrote into a trainer created from the weights of the same
 * checkpoint: the file's step must be `step` and its weights hash the trainer's model's, so a
 * state copied into another checkpoint is refused. Every pending batch is decoded and checked
 * (lh_rollout_decode, the model's vocabulary) and must lie within the staleness bound; a tensor
 * the format does not have, or a gap in queue.0, queue.1, ..., is an error. On error the trainer
 * is as it was. */
lh_err lh_trainer_load(lh_trainer *t, const char *path, int64_t step);
/* Writes checkpoint step-<version> of the run directory (rundir.h): the model directory (fp32
 * weights, config.json and the files given: tokenizer.json, generation_config.json) and
 * trainer_state.safetensors, then commits it (`latest`, keeping the newest `keep`; 0: all). *dir,
 * when dir is not NULL, is replaced (freed) by the checkpoint's path. */
struct lh_rundir;
lh_err lh_trainer_checkpoint(lh_trainer *t, struct lh_rundir *rd, const lh_model_files *files,
                             int keep, char **dir);

#endif
