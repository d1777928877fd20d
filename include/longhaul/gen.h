/* longhaul gen: the rollout engine's generation loop. Many sequences at once, each in its own
 * KV-cache slot; prompts are prefilled in chunks alongside the decoding of other slots, and a
 * finished slot is refilled with the next waiting prompt so the batch stays full (continuous
 * batching). Every token is chosen by the verifiable sampler with the uniform number of
 * (seed, request's seq_index, position), so a request's completion does not depend on which
 * other requests shared its batch (up to floating-point noise, see lh_sample_check). */
#ifndef LONGHAUL_GEN_H
#define LONGHAUL_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/infer.h"
#include "longhaul/sample.h"
#include "longhaul/tokenizer.h"

#define LH_GEN_MAX_STOP 8

typedef struct lh_gen_config {
  lh_sample_params sample;
  uint64_t seed;
  int max_new; /* tokens to generate at most, per request */
  /* Stop tokens: when n_eos is 0, the model's eos ids (config.json / generation_config.json). */
  int32_t eos_ids[LH_GEN_MAX_STOP];
  int n_eos;
  /* Stop strings, matched in the decoded completion (needs tok). The completion ends with the
   * token that completes the string; that token is kept. */
  const char *stop[LH_GEN_MAX_STOP];
  int n_stop;
  const lh_tokenizer *tok;
} lh_gen_config;

/* max_new 64, temperature 1, seed 0, the model's eos ids, no stop strings. */
lh_gen_config lh_gen_defaults(void);

typedef struct lh_gen_request {
  const int32_t *prompt;
  int prompt_len;
  uint64_t seq_index; /* this sample's Philox stream */
} lh_gen_request;

typedef enum {
  LH_FINISH_LENGTH = 0, /* max_new tokens */
  LH_FINISH_EOS = 1,    /* a stop token (kept as the last token) */
  LH_FINISH_STOP = 2,   /* a stop string */
  LH_FINISH_CONTEXT = 3 /* the sequence filled the context */
} lh_finish;

const char *lh_finish_name(lh_finish f);

/* One completion. The caller provides the three arrays with room for max_new entries (or for
 * max_seq - prompt_len, when that is fewer: no more fit in the context). */
typedef struct lh_gen_output {
  int32_t *tokens;
  float *logprobs;       /* under the sampling distribution (the behaviour log-probs) */
  float *logprobs_model; /* under the unmodified model (temperature 1, no filters) */
  int n;
  lh_finish finish;
} lh_gen_output;

typedef struct lh_generator lh_generator;

/* A generator with n_slots concurrent sequences of up to max_seq tokens (prompt included).
 * Prefill runs in chunks of up to prefill_chunk tokens per step (0: 256). Buffers that cannot
 * be allocated are LH_ERR_NOMEM with their size in the message (see lh_kv_create). Sampling
 * and attention run on at most lh_threads() threads as it is now (see lh_kv_create). The policy is
 * only read: generators on one policy may run at the same time. */
lh_err lh_generator_create(lh_infer *m, int n_slots, int max_seq, int prefill_chunk,
                           lh_generator **out);
void lh_generator_free(lh_generator *g);
/* The max_seq it was created with: prompt and completion tokens of one sequence, at most. */
int lh_generator_max_seq(const lh_generator *g);

/* Statistics of the last lh_generate call. */
typedef struct lh_gen_stats {
  double prefill_s, decode_s, sample_s;
  long prefill_tokens, decode_tokens;
  int forwards;
} lh_gen_stats;

/* Generates a completion for each request, n_slots at a time. A prompt that leaves no room in
 * max_seq (prompt_len >= max_seq), an empty prompt or a token outside the vocabulary is refused
 * before anything runs, with a message naming the request. */
lh_err lh_generate(lh_generator *g, const lh_gen_config *cfg, const lh_gen_request *reqs, int n,
                   lh_gen_output *outs, lh_gen_stats *stats);

#endif
