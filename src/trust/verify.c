/* Verification of one rollout group from the verifier's recomputed logits (trust.h): every
 * completion token is checked with lh_sample_check under the group's seed, stream and sampling
 * parameters, its reported behaviour log-prob against the recomputed one, its member's BORDERLINE
 * count against what honest sampling gives at those very positions (a test whose false-rejection
 * probability is at most borderline_alpha per member, docs/SECURITY.md), and the stop tokens.
 * Pure: no state, no allocation. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "longhaul/trust.h"

lh_trust_config lh_trust_defaults(void) {
  lh_trust_config c;
  memset(&c, 0, sizeof c);
  c.logit_tol = 1e-3;
  c.logprob_tol = 1e-2;
  c.borderline_min = 4;
  c.borderline_alpha = 1e-9;
  return c;
}

lh_err lh_trust_config_validate(const lh_trust_config *c) {
  if (!(c->logit_tol >= 0.0 && c->logit_tol < 1.0))
    return lh_errorf(LH_ERR_USAGE, "trust: logit_tol %g, expected in [0, 1)", c->logit_tol);
  if (!(c->logprob_tol > 0.0 && isfinite(c->logprob_tol)))
    return lh_errorf(LH_ERR_USAGE, "trust: logprob_tol %g, expected finite and > 0",
                     c->logprob_tol);
  if (c->borderline_min < 0)
    return lh_errorf(LH_ERR_USAGE, "trust: borderline_min %d, expected >= 0", c->borderline_min);
  if (!(c->borderline_alpha > 0.0 && c->borderline_alpha < 1.0))
    return lh_errorf(LH_ERR_USAGE, "trust: borderline_alpha %g, expected in (0, 1)",
                     c->borderline_alpha);
  if (c->n_stop < 0 || c->n_stop > (int)(sizeof c->stop_ids / sizeof c->stop_ids[0]))
    return lh_errorf(LH_ERR_USAGE, "trust: %d stop ids, expected 0 .. 8", c->n_stop);
  return LH_ERR_OK;
}

const char *lh_trust_check_name(lh_trust_check c) {
  switch (c) {
  case LH_TRUST_OK:
    return "ok";
  case LH_TRUST_MEMBERS:
    return "members";
  case LH_TRUST_TOKEN:
    return "token";
  case LH_TRUST_BORDERLINE:
    return "borderline";
  case LH_TRUST_LOGPROB:
    return "logprob";
  case LH_TRUST_STOP:
    return "stop";
  }
  return "unknown";
}

/* Records the failure: check, where, and the reason "check: member j position p: ...". */
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
static void
fail(lh_trust_verdict *v, lh_trust_check c, int member, int position, const char *fmt, ...) {
  v->failed = c;
  v->member = member;
  v->position = position;
  int n = snprintf(v->reason, sizeof v->reason,
                   "%s: member %d position %d: ", lh_trust_check_name(c), member, position);
  if (n < 0 || n >= (int)sizeof v->reason) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v->reason + n, sizeof v->reason - (size_t)n, fmt, ap);
  va_end(ap);
}

static bool is_stop(const lh_trust_config *c, int32_t tok) {
  for (int i = 0; i < c->n_stop; i++)
    if (c->stop_ids[i] == tok) return true;
  return false;
}

static bool filters_off(const lh_sample_params *p) {
  return p->top_k == 0 && p->top_p >= 1.0f && p->min_p <= 0.0f;
}

/* The log-prob of `tok` under the sampling distribution of `logits` without filters: the
 * temperature-scaled log-softmax, in double. */
static double scaled_logprob(const float *l, int V, float T, int32_t tok) {
  float mx = -INFINITY;
  for (int i = 0; i < V; i++)
    if (l[i] > mx) mx = l[i];
  double inv = 1.0 / (double)T, sum = 0.0;
  for (int i = 0; i < V; i++)
    sum += exp(((double)l[i] - mx) * inv);
  return ((double)l[tok] - mx) * inv - log(sum);
}

/* The BORDERLINE test (docs/SECURITY.md, "The BORDERLINE bound"). An honest member's BORDERLINE
 * indicators b_i have, given the tokens before position i, the probability p_i that
 * lh_sample_check_chance computes from the verifier's logits (the uniform u_i is independent of
 * them), so for each lambda > 0
 *   Z(lambda) = exp(lambda X_n - sum_{i <= n} log(1 + p_i (e^lambda - 1))),   X_n = sum b_i,
 * is a martingale from 1, and so is the mean of Z over a grid of lambda. By Ville's inequality the
 * mean ever reaching 1 / alpha, at any position, has probability at most alpha: that is the
 * rejection rule, with a floor of borderline_min that never rejects. The grid: lambda_j =
 * 2^((j - 10) / 2), j = 0 .. 16 (1/32 to 8), from many positions of middling p_i to few of small
 * p_i. */
#define BL_GRID 17

typedef struct {
  double em1[BL_GRID]; /* e^lambda_j - 1 */
  double psi[BL_GRID]; /* sum of log(1 + p_i (e^lambda_j - 1)) over the member's positions */
  double mu;           /* sum of p_i */
  int64_t count;       /* BORDERLINE positions */
} bl_test;

static double bl_lambda(int j) {
  return ldexp(j % 2 ? 1.4142135623730951 : 1.0, (j - j % 2) / 2 - 5);
}

static void bl_start(bl_test *t) {
  memset(t, 0, sizeof *t);
  for (int j = 0; j < BL_GRID; j++)
    t->em1[j] = expm1(bl_lambda(j));
}

static void bl_add(bl_test *t, double p) {
  for (int j = 0; j < BL_GRID; j++)
    t->psi[j] += log1p(p * t->em1[j]);
  t->mu += p;
}

/* log of the mean of Z(lambda_j) at a count of x */
static double bl_log_mean(const bl_test *t, double x) {
  double a[BL_GRID], mx = -INFINITY, sum = 0.0;
  for (int j = 0; j < BL_GRID; j++) {
    a[j] = bl_lambda(j) * x - t->psi[j];
    mx = a[j] > mx ? a[j] : mx;
  }
  for (int j = 0; j < BL_GRID; j++)
    sum += exp(a[j] - mx);
  return mx + log(sum / BL_GRID);
}

/* The most BORDERLINE positions the member's positions so far allow, at most n: the floor, or
 * the largest count whose mean Z stays below 1 / alpha. */
static int64_t bl_bound(const bl_test *t, int64_t floor_, double alpha, int64_t n) {
  double L = -log(alpha);
  if (bl_log_mean(t, (double)n) < L) return n;
  int64_t lo = 0, hi = n; /* the mean reaches 1 / alpha at hi, not at lo - 1 */
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (bl_log_mean(t, (double)mid) >= L)
      hi = mid;
    else
      lo = mid + 1;
  }
  return hi - 1 > floor_ ? hi - 1 : floor_;
}

lh_err lh_trust_verify_group(const lh_rollout_batch *b, int t, const float *logits, int V,
                             const lh_trust_config *c, lh_sample_scratch *s,
                             lh_trust_verdict *out) {
  memset(out, 0, sizeof *out);
  out->member = out->position = -1;
  out->borderline_headroom = INT32_MAX;
  if (t < 0 || t >= b->n_groups || !b->group_ok[t])
    return lh_errorf(LH_ERR_INVAL, "trust: group %d of a batch of %d is not an ok group", t,
                     b->n_groups);
  const lh_sample_params *p = &b->sample;
  int G = b->group_size;
  if (lh_sample_params_validate(p)) return LH_ERR_INVAL; /* its message names the parameter */
  for (int j = 0; j < G; j++)
    if (b->prompt_len[t * G + j] < 1) /* the first completion token needs a row before it */
      return lh_errorf(LH_ERR_INVAL, "trust: group %d member %d has no prompt token", t, j);
  for (int j = 0; j < G; j++) {
    int sq = t * G + j;
    out->tokens += b->seq_start[sq + 1] - b->seq_start[sq] - b->prompt_len[sq];
  }
  /* members: each with a completion. A member copying another is not refused as such: an
   * honest group can hold two equal sequences (a confident policy), and a copy under another
   * member's stream is caught token by token like any other forged token. */
  for (int j = 0; j < G; j++) {
    int sq = t * G + j;
    if (b->seq_start[sq + 1] - b->seq_start[sq] - b->prompt_len[sq] < 1) {
      fail(out, LH_TRUST_MEMBERS, j, 0, "no completion tokens");
      return LH_ERR_OK;
    }
  }
  for (int j = 0; j < G; j++) {
    int sq = t * G + j, start = b->seq_start[sq], first = start + b->prompt_len[sq];
    int end = b->seq_start[sq + 1], n = end - first;
    uint64_t stream = b->stream_base + (uint64_t)sq;
    bl_test bt;
    bl_start(&bt);
    for (int i = first; i < end; i++) {
      int pos = i - first;
      int32_t tok = b->tokens[i];
      const float *row = logits + (size_t)(i - 1) * (size_t)V;
      out->tokens_checked++;
      if (c->n_stop > 0 && i < end - 1 && is_stop(c, tok)) {
        fail(out, LH_TRUST_STOP, j, pos, "token %d is a stop token, yet %d tokens follow", tok,
             end - 1 - i);
        return LH_ERR_OK;
      }
      double u = lh_sample_uniform(b->seed, stream, (uint64_t)(i - start));
      double chance;
      lh_sample_verdict sv = lh_sample_check_chance(row, V, p, u, tok, c->logit_tol, s, &chance);
      if (sv == LH_SAMPLE_INCONSISTENT) {
        fail(out, LH_TRUST_TOKEN, j, pos,
             "token %d is not the one the seed selects from the recomputed logits", tok);
        return LH_ERR_OK;
      }
      bl_add(&bt, chance);
      out->borderline_expected += chance;
      if (sv == LH_SAMPLE_BORDERLINE) {
        out->borderline++;
        if (++bt.count > out->borderline_member_max) out->borderline_member_max = (int)bt.count;
        if (bt.count > c->borderline_min &&
            bl_log_mean(&bt, (double)bt.count) >= -log(c->borderline_alpha)) {
          fail(out, LH_TRUST_BORDERLINE, j, pos,
               "%lld of %d tokens BORDERLINE where honest sampling gives %.2f on average: at "
               "most %lld at these positions (false-rejection chance %g)",
               (long long)bt.count, pos + 1, bt.mu,
               (long long)bl_bound(&bt, c->borderline_min, c->borderline_alpha, pos + 1),
               c->borderline_alpha);
          return LH_ERR_OK;
        }
      }
      /* the behaviour log-prob: 0 for greedy; else the sampling distribution's */
      double want = NAN;
      if (p->temperature == 0.0f) {
        want = 0.0;
      } else {
        lh_sample_result r = lh_sample(row, V, p, u, s);
        if (r.token == tok)
          want = r.logprob;
        else if (filters_off(p)) /* a BORDERLINE token the verifier would not pick */
          want = scaled_logprob(row, V, p->temperature, tok);
      }
      if (!isnan(want)) {
        double err = fabs((double)b->mu[i] - want);
        if (err > out->max_logprob_err) out->max_logprob_err = err;
        if (!(err <= c->logprob_tol)) {
          fail(out, LH_TRUST_LOGPROB, j, pos, "reported log-prob %.6g, recomputed %.6g",
               (double)b->mu[i], want);
          return LH_ERR_OK;
        }
      }
    }
    int64_t room = bl_bound(&bt, c->borderline_min, c->borderline_alpha, n) - bt.count;
    if (room < out->borderline_headroom) out->borderline_headroom = (int)room;
    /* truncation: only a stop token ends a completion before max_new (a model without one
     * always runs to max_new) */
    if (n < b->max_new && (c->n_stop == 0 || !is_stop(c, b->tokens[end - 1]))) {
      fail(out, LH_TRUST_STOP, j, n - 1, "%d tokens of at most %d, and %s", n, b->max_new,
           c->n_stop ? "no stop token at the end" : "the model has no stop tokens");
      return LH_ERR_OK;
    }
  }
  return LH_ERR_OK;
}
