/* longhaul rollout: the unit of RL data. A rollout batch is n_groups tasks of an environment
 * with group_size sampled completions each, their behaviour log-probs and rewards, and the
 * provenance a verifier needs to recompute every token: the policy version, the sampler seed,
 * the stream of each completion and the sampling parameters. This module generates batches (a
 * worker, the single-process loop, the evaluator), scores them from their tokens alone (the
 * server recomputes rewards), and owns the one byte format in which a batch is checkpointed,
 * logged and sent (lh_rollout_encode / lh_rollout_decode, docs/ARCHITECTURE.md).
 *
 * Ownership: a batch owns its arrays; lh_rollout_batch_free frees them (and accepts NULL or a
 * zeroed batch). Thread safety: none of these functions keeps state; two threads may work on
 * two batches at once, but not on one. lh_rollout_generate uses the generator it is given,
 * which is not thread-safe. */
#ifndef LONGHAUL_ROLLOUT_H
#define LONGHAUL_ROLLOUT_H

#include <stddef.h>
#include <stdint.h>

#include "longhaul/env.h"
#include "longhaul/gen.h"
#include "longhaul/model.h"
#include "longhaul/sample.h"
#include "longhaul/tokenizer.h"

/* Completion j of group t uses the sampler stream stream_base + t * group_size + j. */
typedef struct lh_rollout_batch {
  int n_groups, group_size; /* n = n_groups * group_size sequences, group by group */
  /* provenance */
  int64_t version;         /* policy version that generated the batch (set by the caller) */
  lh_split split;          /* where the tasks come from */
  uint64_t seed;           /* the sampler's seed */
  uint64_t stream_base;    /* stream of completion 0 of group 0 */
  lh_sample_params sample; /* temperature, top-k, top-p, min-p */
  int max_new;             /* completion tokens at most */
  /* data */
  uint64_t *task_index; /* (n_groups) */
  uint8_t *group_ok;    /* (n_groups) 0: the environment failed on this task (exec) or its prompt
                         * did not fit; the group's sequences are empty and its rewards 0 */
  int *seq_start;       /* (n+1) offsets into tokens and mu */
  int *prompt_len;      /* (n) the first prompt_len tokens of a sequence are the prompt */
  int32_t *tokens;      /* prompt then completion */
  float *mu;            /* aligned with tokens: behaviour log-prob of completion tokens
                         * (the sampling distribution's), 0 on prompt tokens */
  float *old;           /* aligned with tokens, or NULL: the trainer's fp32 log-probs of the
                         * policy that generated the batch (lh_rollout_recompute), for TIS
                         * and masked IS */
  float *reward;        /* (n) */
  uint8_t *correct, *well_formed, *finish; /* (n); finish is an lh_finish */
} lh_rollout_batch;

/* Generates and scores. Prompts are encoded recognising special tokens (as `generate` and
 * Hugging Face tokenizers do), completions are decoded without special tokens before scoring.
 * Group t is task task_index[t] of split: taken from tasks[t] when the caller fetched the tasks
 * already (an evaluation that runs several models on the same tasks; a task with a NULL prompt
 * is one the environment failed to produce), fetched here with lh_env_task_get when tasks is
 * NULL. A task that the environment fails to produce or score (exec: crash, timeout, malformed
 * reply) marks its group not ok, is logged, and the batch goes on; so does a task whose prompt
 * leaves fewer than gc->max_new tokens of the generator's max_seq (no completion is cut short by
 * the context). Other errors (encoding, a bad token) fail the call. Completion j of group t uses
 * stream seq_base + t * group_size + j. The provenance is filled in (version 0: the caller sets
 * it). The batch's arrays are allocated here; free them with lh_rollout_batch_free. */
lh_err lh_rollout_generate(lh_generator *g, const lh_gen_config *gc, const lh_tokenizer *tok,
                           lh_env *env, lh_split split, const uint64_t *task_index,
                           const lh_env_task *tasks, int n_groups, int group_size,
                           uint64_t seq_base, lh_rollout_batch *out);
/* Generates from prompts given as token ids, without scoring (a worker: the server leases the
 * prompt tokens and recomputes the rewards itself). Group t is task task_index[t] of split with
 * the prompt prompts[t][0 .. prompt_len[t]); completion j of group t uses sampler stream
 * stream_base[t] + j under gc->seed. All groups are generated together (sharing the generator's
 * slots), and out[0 .. n_groups) receives one batch of one group each, ok, rewards 0, with its
 * own stream_base and the provenance of gc (version 0: the caller sets it). A prompt of no
 * tokens, or of more than leave room for gc->max_new (lh_generator_max_seq), is LH_ERR_LIMIT
 * before anything is generated. */
lh_err lh_rollout_generate_ids(lh_generator *g, const lh_gen_config *gc, lh_split split,
                               const uint64_t *task_index, const int32_t *const *prompts,
                               const int *prompt_len, const uint64_t *stream_base, int n_groups,
                               int group_size, lh_rollout_batch *out);
/* Recomputes the rewards of a batch from its tokens: each ok group's task (tasks[t], or task
 * task_index[t] of b->split fetched here when tasks is NULL) scores the decoded completions, as
 * lh_rollout_generate does. A group whose sequences do not start with their task's prompt (as
 * lh_rollout_generate encodes it), or whose task the environment fails to produce or score, is
 * marked not ok and emptied (logged); other errors (encoding, decoding) fail the call. Rewards,
 * correct and well_formed of every sequence are overwritten. */
lh_err lh_rollout_score(const lh_tokenizer *tok, lh_env *env, const lh_env_task *tasks,
                        lh_rollout_batch *b);
void lh_rollout_batch_free(lh_rollout_batch *b);
/* One batch of the groups of parts[0..n_parts), in order (copies; the parts stay the caller's):
 * the networked trainer trains on groups that workers generated with different versions, seeds
 * and streams. The result's version is the oldest part's (what the staleness bound must see);
 * its other provenance is the first part's and describes no group in particular. `old` is kept
 * when every part has it. Parts of different group sizes are LH_ERR_MISMATCH. */
lh_err lh_rollout_concat(const lh_rollout_batch *const *parts, int n_parts, lh_rollout_batch *out);
/* Fills b->old (allocated here) with the log-probs the training forward of `t` gives the batch's
 * tokens: called right after generation, with the weights that generated it, this is pi_old of
 * TIS and masked IS (the behaviour policy in the trainer's numerics; mu is the sampler's). */
lh_err lh_rollout_recompute(lh_train *t, lh_rollout_batch *b);

/* What a batch says about the policy that generated it, over the sequences of ok groups. */
typedef struct lh_rollout_summary {
  double reward_mean, reward_std, accuracy, well_formed, response_len;
  double entropy;         /* mean -mu over completion tokens: an estimate of the entropy */
  long completion_tokens; /* of ok groups */
  int groups_ok, groups_failed;
} lh_rollout_summary;
lh_rollout_summary lh_rollout_summarise(const lh_rollout_batch *b);

/* ---------------------------------------------------------------- the byte format
 * One batch as bytes, little-endian: a 96-byte header (magic "LHRB", format version, sizes and
 * provenance; docs/ARCHITECTURE.md, "Rollout batches") followed by the arrays in the order of
 * the struct. Encoding is exact: decode(encode(b)) has the same values bit for bit, and encoding
 * that again gives the same bytes. */

#define LH_ROLLOUT_FORMAT 1

/* What a decoder accepts; every count is checked against these before anything is allocated. */
typedef struct lh_rollout_limits {
  int max_groups;     /* n_groups */
  int max_group_size; /* group_size */
  int64_t max_tokens; /* tokens of the whole batch */
  int vocab;          /* every token id in [0, vocab) */
} lh_rollout_limits;

/* 65536 groups, groups of 4096, 2^28 tokens, vocabulary LH_MAX_VOCAB. */
lh_rollout_limits lh_rollout_default_limits(void);

/* The encoded size of b, and the encoding into a malloc'd buffer (*out, *len). b must be
 * consistent (as lh_rollout_validate checks); LH_ERR_INVAL otherwise. */
size_t lh_rollout_encoded_size(const lh_rollout_batch *b);
lh_err lh_rollout_encode(const lh_rollout_batch *b, uint8_t **out, size_t *len);
/* Parses bytes into *out (zeroed first; arrays allocated here). Never aborts on bad bytes: a bad
 * magic, an unknown format version, a count above a limit, a length that does not match the
 * counts, or arrays that are inconsistent (lh_rollout_validate) are LH_ERR_FORMAT,
 * LH_ERR_UNSUPPORTED or LH_ERR_LIMIT with a message naming `what` and the field or byte offset;
 * *out is then empty. */
lh_err lh_rollout_decode(const uint8_t *buf, size_t len, const lh_rollout_limits *lim,
                         const char *what, lh_rollout_batch *out);
/* Checks that a batch is consistent: counts within the limits, seq_start from 0 non-decreasing to
 * the token count, each prompt within its sequence, failed groups empty, tokens in [0, vocab),
 * mu and old finite and mu 0 on prompt tokens, rewards in [0, 1], flags 0 or 1, finish an
 * lh_finish. LH_ERR_FORMAT (or LH_ERR_LIMIT) naming `what` and the first thing wrong. */
lh_err lh_rollout_validate(const lh_rollout_batch *b, const lh_rollout_limits *lim,
                           const char *what);

#endif
