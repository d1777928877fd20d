/* longhaul sample: the verifiable sampler and its checker. The uniform number used for a token
 * comes from Philox4x32-10 keyed by (seed, sequence index, position), so it does not depend on
 * batch composition, thread count or timing; the token is chosen by inverse CDF over the
 * filtered, temperature-scaled distribution in a canonical order (docs/ALGORITHMS.md), so
 * anyone holding the logits, the parameters and the seed can recompute which token had to be
 * chosen. */
#ifndef LONGHAUL_SAMPLE_H
#define LONGHAUL_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

typedef struct lh_sample_params {
  float temperature; /* 0 = greedy (argmax, ties to the lowest id) */
  int top_k;         /* 0 = off */
  float top_p;       /* 1 = off */
  float min_p;       /* 0 = off */
} lh_sample_params;

/* temperature 1, no filters */
lh_sample_params lh_sample_defaults(void);
/* Checks ranges: temperature >= 0 and finite, top_k >= 0, 0 < top_p <= 1, 0 <= min_p < 1. */
lh_err lh_sample_params_validate(const lh_sample_params *p);

/* The uniform number in [0, 1) for a token: 53 bits from Philox (seed, seq, pos), where seq is
 * the sample's index (its stream) and pos the token's position in the full sequence (prompt
 * included). */
double lh_sample_uniform(uint64_t seed, uint64_t seq, uint64_t pos);

typedef struct lh_sample_result {
  int32_t token;
  float logprob;       /* log-prob under the sampling distribution (filtered, scaled);
                          0 for greedy */
  float logprob_model; /* log-prob under the unmodified model: log_softmax(logits)[token] */
} lh_sample_result;

/* Scratch for one sampler call over a vocabulary of V: reused across calls, never shared
 * between threads. */
typedef struct lh_sample_scratch lh_sample_scratch;
lh_sample_scratch *lh_sample_scratch_create(int V);
void lh_sample_scratch_free(lh_sample_scratch *s);

/* Chooses a token from logits (V) with uniform u in [0, 1) (lh_sample_uniform); a u outside
 * [0, 1) or NaN is a caller's bug and aborts with a message, as do missing arguments, invalid
 * parameters and V beyond the scratch. Does not allocate. */
lh_sample_result lh_sample(const float *logits, int V, const lh_sample_params *p, double u,
                           lh_sample_scratch *s);

typedef enum {
  LH_SAMPLE_CONSISTENT = 0,   /* the token is the one u selects, with margin > tol */
  LH_SAMPLE_INCONSISTENT = 1, /* u selects another token (or the token was filtered out) */
  LH_SAMPLE_BORDERLINE = 2,   /* u lies within tol of a boundary of the token's CDF interval (or
                                 the token sits within tol of a filter threshold): floating-point
                                 noise between machines could flip the choice */
} lh_sample_verdict;

/* The verifier's check: given the logits it recomputed, the parameters, the uniform number and
 * the submitted token, is the token the one that had to be chosen? tol is an absolute
 * tolerance on the CDF (e.g. 1e-4). u must be in [0, 1), as for lh_sample (else it aborts). */
lh_sample_verdict lh_sample_check(const float *logits, int V, const lh_sample_params *p, double u,
                                  int32_t token, double tol, lh_sample_scratch *s);

#endif
