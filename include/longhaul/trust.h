/* longhaul trust: verification of rollouts from untrusted workers (docs/SECURITY.md). Given the
 * logits the verifier recomputed under the version a worker claims (the same forward that
 * recomputes the behaviour log-probs for the loss), every completion token of every member of a
 * group is checked with lh_sample_check under the group's server-chosen seed and the lease's
 * sampling parameters, the reported behaviour log-probs are compared with the recomputed ones,
 * and the group is accepted or rejected whole, with the check that failed and where. Also: a
 * per-key rate limiter for the server, and its table of the signed requests seen (replays).
 *
 * Ownership: the caller's batch and logits are read only; a verdict is a plain value.
 * Thread safety: lh_trust_verify_group keeps no state (a scratch per thread); a limiter is
 * thread-safe (one mutex inside), and so is a replay table (striped locks). */
#ifndef LONGHAUL_TRUST_H
#define LONGHAUL_TRUST_H

#include <stdbool.h>
#include <stdint.h>

#include "longhaul/base.h"
#include "longhaul/rollout.h"
#include "longhaul/sample.h"

/* The tolerances of the check, set from the honest noise measured between the workers' engine
 * and the verifier's (docs/SECURITY.md, "Calibration"). */
typedef struct lh_trust_config {
  double logit_tol;        /* lh_sample_check's: the most one logit may differ, in logit units */
  double logprob_tol;      /* |reported - recomputed| behaviour log-prob of a token at most this */
  int borderline_min;      /* a member may always hold this many BORDERLINE positions; */
  double borderline_alpha; /* more reject it once their count is implausible under honest
                            * sampling at its positions: the count an honest member would show
                            * has, position by position, the chances lh_sample_check_chance
                            * gives, and the test (a Chernoff bound, time-uniform) rejects an
                            * honest member with probability at most borderline_alpha
                            * (docs/SECURITY.md, "The BORDERLINE bound") */
  int32_t stop_ids[8];     /* the tokens that end a completion (the model's eos ids): a completion
                            * holds one only as its last token, and one shorter than max_new ends
                            * with one; with n_stop 0 (a model without eos) every completion
                            * must run to max_new */
  int n_stop;
} lh_trust_config;

/* The calibrated defaults (docs/SECURITY.md), no stop ids. */
lh_trust_config lh_trust_defaults(void);
/* logit_tol in [0, 1), logprob_tol > 0 and finite, borderline_min >= 0, borderline_alpha in
 * (0, 1), n_stop in [0, 8]: LH_ERR_USAGE naming the field otherwise. */
lh_err lh_trust_config_validate(const lh_trust_config *c);

/* Which check decided. */
typedef enum {
  LH_TRUST_OK = 0,     /* accepted */
  LH_TRUST_MEMBERS,    /* a member without completion tokens */
  LH_TRUST_TOKEN,      /* a token that no honest machine chooses (INCONSISTENT) */
  LH_TRUST_BORDERLINE, /* more BORDERLINE positions in one member than honest sampling gives */
  LH_TRUST_LOGPROB,    /* a reported behaviour log-prob far from the recomputed one */
  LH_TRUST_STOP,       /* a completion going on past a stop token, or cut short without one */
} lh_trust_check;

#define LH_TRUST_REASON_MAX 200

typedef struct lh_trust_verdict {
  lh_trust_check failed;            /* LH_TRUST_OK when accepted */
  int member;                       /* the failing member (0 .. group_size-1), -1 when accepted */
  int position;                     /* the failing completion position (0 = its first token), -1 */
  int64_t tokens_checked;           /* completion tokens checked, members in order, the failing one
                                     * included: the tokens until detection */
  int64_t tokens;                   /* completion tokens of the group */
  int64_t borderline;               /* BORDERLINE positions seen */
  int borderline_member_max;        /* the most BORDERLINE positions seen in one member */
  double borderline_expected;       /* the sum of the checked positions' honest BORDERLINE
                                     * chances: what an honest group shows on average */
  int borderline_headroom;          /* the least, over the members checked to their end, of the
                                     * most BORDERLINE positions the test allows the member minus
                                     * its count (INT32_MAX when none was) */
  double max_logprob_err;           /* the largest |reported - recomputed| log-prob seen */
  char reason[LH_TRUST_REASON_MAX]; /* "token: member 2 position 5: ..." ("" when accepted) */
} lh_trust_verdict;

/* "ok", "members", "token", "borderline", "logprob", "stop". */
const char *lh_trust_check_name(lh_trust_check c);

/* Verifies group t of batch b (its provenance: seed, stream_base, sampling parameters, max_new)
 * against logits, (N, V) for the batch's N tokens, row i the verifier's logits for token i + 1
 * of the same sequence: the layout of lh_train_logits after a forward of the batch's sequences
 * packed end to end (lh_rollout_recompute, when no sequence is empty). Member j uses sampler
 * stream stream_base + t * group_size + j and position = its index in the sequence, as the
 * generator does. Stops at the first failure. The group must be ok (group_ok), its sampling
 * parameters valid, every member must have a prompt token, and the batch must be consistent
 * (lh_rollout_validate); otherwise LH_ERR_INVAL. Never allocates; O(tokens * V). */
lh_err lh_trust_verify_group(const lh_rollout_batch *b, int t, const float *logits, int V,
                             const lh_trust_config *c, lh_sample_scratch *s, lh_trust_verdict *out);

/* ---------------------------------------------------------------- per-key rate limits
 * A token bucket per key: `rate` requests per second on average, bursts of `burst`. Keys are
 * 32 bytes (Ed25519 public keys); the table holds `cap` keys and forgets the least recently
 * seen one when full (a forgotten key starts again with a full bucket). */
typedef struct lh_trust_limiter lh_trust_limiter;
/* rate > 0, burst >= 1, cap >= 1; aborts otherwise (a caller's bug). */
lh_trust_limiter *lh_trust_limiter_create(double rate, double burst, int cap);
void lh_trust_limiter_free(lh_trust_limiter *l);
/* Takes one request from key's bucket at time now_s (seconds, non-decreasing per key): true
 * when allowed; false when the bucket is empty, with *retry_s (may be NULL) the seconds until
 * the next request would be allowed. */
bool lh_trust_limiter_take(lh_trust_limiter *l, const uint8_t key[32], double now_s,
                           double *retry_s);

/* ---------------------------------------------------------------- replayed requests
 * Which signed requests were seen (docs/SECURITY.md, "Replays"): a table of `slots` entries,
 * fixed at create, holding the (key, nonce) of each request let through with its signed time.
 * A request is
 *   LH_REPLAY_STALE      when its time is more than window_ms before or after now;
 *   LH_REPLAY_SEEN       when its (key, nonce) is in the table (a replay);
 *   LH_REPLAY_FORGOTTEN  when its time is at or before the floor of its part of the table: the
 *                        latest time of an entry forgotten there to make room (so a request
 *                        that was forgotten can never pass again);
 *   LH_REPLAY_FRESH      otherwise, and it is remembered.
 * The table forgets the oldest entries of a part only when that part is full: at the rates it
 * is sized for (entries > requests per second x window, with a margin), every floor stays below
 * the window and no honest request is refused; above them, or under a flood, memory stays the
 * same and the floors rise: a request delayed past its floor is refused as stale and signed
 * again by its sender, never answered "busy". Thread-safe (striped locks). */
typedef struct lh_trust_replay lh_trust_replay;
typedef enum {
  LH_REPLAY_FRESH,
  LH_REPLAY_SEEN,
  LH_REPLAY_STALE,
  LH_REPLAY_FORGOTTEN
} lh_trust_replay_verdict;
#define LH_REPLAY__COUNT 4
/* window_ms >= 1; slots a power of two, 16 .. 2^32 (16 bytes each); aborts otherwise (a caller's
 * bug). */
lh_trust_replay *lh_trust_replay_create(int64_t window_ms, int64_t slots);
void lh_trust_replay_free(lh_trust_replay *r);
/* The verdict on a request of `key` with `nonce` (at most 64 bytes, else aborts) signed at
 * time_ms, checked at now_ms (both Unix ms). */
lh_trust_replay_verdict lh_trust_replay_check(lh_trust_replay *r, const uint8_t key[32],
                                              const uint8_t *nonce, size_t nonce_len,
                                              int64_t time_ms, int64_t now_ms);
/* The verdicts given so far, by verdict, and how many entries were forgotten while their time
 * was still within the window (each raised a floor above a time the window allows). */
void lh_trust_replay_stats(lh_trust_replay *r, int64_t counts[LH_REPLAY__COUNT],
                           int64_t *forgot_live);

#endif
