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

/* lh_sample_check's answer. "Every machine" means every worker whose logits differ from the
 * verifier's by at most logit_tol each (and that runs lh_sample on them). */
typedef enum {
  LH_SAMPLE_CONSISTENT = 0,   /* every machine chooses the token, the verifier's own lh_sample
                                 included */
  LH_SAMPLE_INCONSISTENT = 1, /* no machine chooses it: u selects another token, or a filter
                                 drops it, or its weight is 0 */
  LH_SAMPLE_BORDERLINE = 2,   /* some machines may choose it and others not: u lies near a
                                 boundary of its CDF interval, or it sits near a filter threshold,
                                 within what logit_tol can move */
} lh_sample_verdict;

/* The verifier's check: given the logits it recomputed, the parameters, the uniform number and
 * the submitted token, is the token the one that had to be chosen? logit_tol, in [0, 1), is the
 * most any one logit may differ between the worker's machine and the verifier's, in logit units
 * (1e-4 covers BLAS blocking and thread-count noise comfortably); every bound of the check is
 * derived from it (docs/ALGORITHMS.md, "The check"). u must be in [0, 1), as for lh_sample
 * (else it aborts). O(V) plus a sort of the top-k / top-p candidates; does not allocate. */
lh_sample_verdict lh_sample_check(const float *logits, int V, const lh_sample_params *p, double u,
                                  int32_t token, double logit_tol, lh_sample_scratch *s);

/* lh_sample_check, and the position's honest BORDERLINE chance in *chance: the probability, over
 * u uniform in [0, 1), that the token an honest machine picks at this position is BORDERLINE.
 * That happens exactly where the verifier's own pick at u is not CONSISTENT (a machine's token
 * differs from it only there, and is then BORDERLINE), so the chance is 1 minus the measure of
 * the u at which it is, computed from the same bounds as the verdict (docs/ALGORITHMS.md, "The
 * honest BORDERLINE chance"), raised by 4 (V + 2048) 2^-50 (5e-10 at V = 151936) for the rounding
 * in which its sums differ from the sampler's: an upper bound, that close to the exact value.
 * Greedy and cold sampling give 0 or 1. For an INCONSISTENT token *chance is 1 and not computed.
 * chance may be NULL (then this is lh_sample_check). Two O(V) passes more than lh_sample_check,
 * most blocks of 64 ids passed over in the second; does not allocate. */
lh_sample_verdict lh_sample_check_chance(const float *logits, int V, const lh_sample_params *p,
                                         double u, int32_t token, double logit_tol,
                                         lh_sample_scratch *s, double *chance);

#endif
