/* Policy losses: PPO-clip (both sides, both signs), TIS, masked IS, decoupled PPO (clamp and
 * mask), the M2PO mask, the three aggregations and the k3 KL term, each against arithmetic done
 * by hand; every analytic gradient against a central finite difference of the loss. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "longhaul/rl.h"

#define NMAX 64
#define TOL  1e-5

static void near(double got, double want, double tol, const char *what, int i) {
  if (!(fabs(got - want) <= tol)) {
    print_error("%s[%d]: got %.9g, want %.9g (tol %g)\n", what, i, got, want, tol);
    fail();
  }
}

static lh_loss_config cfg_of(lh_loss_kind kind) {
  lh_loss_config c = lh_loss_defaults();
  c.kind = kind; /* eps 0.2 / 0.28, C 2, [0.5, 2] */
  return c;
}

static double loss_of(const lh_loss_config *c, const lh_loss_input *in, float *dlogp,
                      lh_loss_stats *st) {
  lh_loss_stats s;
  assert_int_equal(lh_loss_compute(c, in, dlogp, &s), LH_ERR_OK);
  if (st) *st = s;
  return s.loss;
}

/* Central finite difference of the loss in each weighted token's logp, h = 2^-12 (exact in float
 * for |logp| < 8), against the analytic dlogp. Invalid tokens must have dlogp = 0. */
static void check_grad(const lh_loss_config *c, const lh_loss_input *in0) {
  int n = in0->seq_start[in0->n_seqs];
  float logp[NMAX], d[NMAX], scratch[NMAX];
  memcpy(logp, in0->logp, (size_t)n * sizeof *logp);
  lh_loss_input in = *in0;
  in.logp = logp;
  loss_of(c, &in, d, NULL);
  const float h = 1.0f / 4096.0f;
  for (int i = 0; i < n; i++) {
    if (!(in.weight[i] > 0.0f)) {
      near(d[i], 0.0, 0.0, "dlogp of an invalid token", i);
      continue;
    }
    float x = logp[i];
    logp[i] = x + h;
    double lp = loss_of(c, &in, scratch, NULL);
    logp[i] = x - h;
    double lm = loss_of(c, &in, scratch, NULL);
    logp[i] = x;
    double fd = (lp - lm) / (2.0 * h);
    near(d[i], fd, 1e-5 + 1e-4 * fabs(fd), "dlogp vs finite difference", i);
  }
}

static float lnf(double x) {
  return (float)log(x);
}

/* PPO-clip on r = pi/mu, eps_low 0.2, eps_high 0.28, token mean over 5 weighted tokens.
 *   t0 r 1.1, A +1: min(1.1, 1.1)            = 1.1  unclipped, d obj = r A = 1.1
 *   t1 r 1.5, A +1: min(1.5, 1.28)           = 1.28 clipped (high), d obj = 0
 *   t2 r 0.5, A -1: min(-0.5, -0.8)          = -0.8 clipped (low), d obj = 0
 *   t3 r 0.5, A +1: min(0.5, 0.8)            = 0.5  unclipped, d obj = 0.5
 *   t4 r 1.5, A -1: min(-1.5, -1.28)         = -1.5 unclipped, d obj = -1.5
 *   t5 weight 0 (prompt): ignored.
 * loss = -(1.1 + 1.28 - 0.8 + 0.5 - 1.5) / 5 = -0.58 / 5 = -0.116
 * dlogp = -d obj / 5 = -0.22, 0, 0, -0.1, 0.3, 0. clip fraction 2/5.
 * ratio min 0.5, max 1.5, mean 5.1 / 5 = 1.02.
 * KL(mu||pi) k3 = r - 1 - ln r: 1.1 -> 0.0046898, 1.5 -> 0.0945349, 0.5 -> 0.1931472;
 *   mean = (0.0046898 + 2 * 0.0945349 + 2 * 0.1931472) / 5 = 0.5800540 / 5 = 0.1160108. */
static void test_ppo_clip(void **state) {
  (void)state;
  int ss[2] = {0, 6};
  float w[6] = {1, 1, 1, 1, 1, 0};
  float A[6] = {1, 1, -1, 1, -1, 1};
  float mu[6] = {0, -1, 0.5f, 0, -2, 0};
  float lp[6] = {lnf(1.1), -1 + lnf(1.5), 0.5f + lnf(0.5), lnf(0.5), -2 + lnf(1.5), lnf(3)};
  lh_loss_input in = {1, ss, w, A, lp, mu, NULL, NULL, NULL, NULL};
  lh_loss_config c = cfg_of(LH_LOSS_PPO);
  float d[6];
  lh_loss_stats st;
  near(loss_of(&c, &in, d, &st), -0.116, TOL, "loss", 0);
  const double want[6] = {-0.22, 0, 0, -0.1, 0.3, 0};
  for (int i = 0; i < 6; i++)
    near(d[i], want[i], TOL, "dlogp", i);
  near(st.clip_frac, 0.4, 1e-12, "clip_frac", 0);
  assert_int_equal(st.n_clipped, 2);
  assert_int_equal(st.n_valid, 5);
  assert_int_equal(st.n_masked, 0);
  near(st.ratio_min, 0.5, TOL, "ratio_min", 0);
  near(st.ratio_max, 1.5, TOL, "ratio_max", 0);
  near(st.ratio_mean, 1.02, TOL, "ratio_mean", 0);
  near(st.kl_mu_pi, 0.1160108, TOL, "kl_mu_pi", 0);
  near(st.kl_loss, 0.0, 0.0, "kl_loss", 0);
  check_grad(&c, &in);
  /* Symmetric clipping (eps_high = eps_low = 0.2): t1 now clips at 1.2 -> loss -(0.5)/5 = -0.1 */
  c.eps_high = 0.2f;
  near(loss_of(&c, &in, d, &st), -0.1, TOL, "loss with eps_high 0.2", 0);
  check_grad(&c, &in);
}

/* TIS, C = 2: weight c = min(pi_old/mu, 2), PPO-clip on r = pi/pi_old.
 *   t0 q 3 -> c 2,   r 1.1, A +1: obj 1.1 unclipped;   c obj 2.2,  d = 2.2
 *   t1 q 0.5 -> 0.5, r 0.5, A -1: obj -0.8 clipped;    c obj -0.4, d = 0
 *   t2 q 1 -> 1,     r 1.5, A -1: obj -1.5 unclipped;  c obj -1.5, d = -1.5
 * loss = -(2.2 - 0.4 - 1.5) / 3 = -0.1; dlogp = -2.2/3, 0, 1.5/3 = -0.7333333, 0, 0.5.
 * pi/mu: 3.3, 0.25, 1.5. */
static void test_tis(void **state) {
  (void)state;
  int ss[2] = {0, 3};
  float w[3] = {1, 1, 1}, A[3] = {1, -1, -1}, mu[3] = {0, 0, 0.3f};
  float old[3] = {lnf(3), lnf(0.5), 0.3f};
  float lp[3] = {lnf(3.3), lnf(0.25), 0.3f + lnf(1.5)};
  lh_loss_input in = {1, ss, w, A, lp, mu, old, NULL, NULL, NULL};
  lh_loss_config c = cfg_of(LH_LOSS_TIS);
  float d[3];
  lh_loss_stats st;
  near(loss_of(&c, &in, d, &st), -0.1, TOL, "loss", 0);
  near(d[0], -2.2 / 3, TOL, "dlogp", 0);
  near(d[1], 0, TOL, "dlogp", 1);
  near(d[2], 0.5, TOL, "dlogp", 2);
  near(st.ratio_min, 0.25, TOL, "ratio_min", 0);
  near(st.ratio_max, 3.3, TOL, "ratio_max", 0);
  near(st.clip_frac, 1.0 / 3, 1e-12, "clip_frac", 0);
  check_grad(&c, &in);
  /* C = 4 no longer truncates t0: c 3, loss = -(3.3 - 0.4 - 1.5) / 3 = -1.4/3 */
  c.C = 4.0f;
  near(loss_of(&c, &in, d, &st), -1.4 / 3, TOL, "loss with C 4", 0);
  check_grad(&c, &in);
  /* TIS without old log-probs is refused. */
  in.old = NULL;
  assert_int_equal(lh_loss_compute(&c, &in, d, &st), LH_ERR_INVAL);
}

/* Masked IS, [lo, hi] = [0.5, 2], q = pi_old/mu; PPO-clip on r = pi/pi_old.
 *   t0 q 3   -> masked        t1 q 0.4 -> masked
 *   t2 q 1.2 -> kept, r 1.1, A +1: obj 1.1, d 1.1
 *   t3 q 0.6 -> kept, r 1.0, A +2: obj 2,   d 2
 * token mean over all 4 valid tokens: loss = -(1.1 + 2) / 4 = -0.775;
 * dlogp = 0, 0, -0.275, -0.5; masked fraction 2/4.
 * Without old, q = r = pi/mu: t0 r 2.5 (masked), t1 r 0.9, A +1 (obj 0.9, d 0.9):
 *   loss = -0.9 / 2 = -0.45, dlogp = 0, -0.45. */
static void test_masked_is(void **state) {
  (void)state;
  int ss[2] = {0, 4};
  float w[4] = {1, 1, 1, 1}, A[4] = {1, 1, 1, 2}, mu[4] = {0, 0, 0, -1};
  float old[4] = {lnf(3), lnf(0.4), lnf(1.2), -1 + lnf(0.6)};
  float lp[4] = {old[0] + 0.1f, old[1] - 0.1f, old[2] + lnf(1.1), old[3]};
  lh_loss_input in = {1, ss, w, A, lp, mu, old, NULL, NULL, NULL};
  lh_loss_config c = cfg_of(LH_LOSS_MIS);
  float d[4];
  lh_loss_stats st;
  near(loss_of(&c, &in, d, &st), -0.775, TOL, "loss", 0);
  const double want[4] = {0, 0, -0.275, -0.5};
  for (int i = 0; i < 4; i++)
    near(d[i], want[i], TOL, "dlogp", i);
  assert_int_equal(st.n_masked, 2);
  near(st.masked_frac, 0.5, 1e-12, "masked_frac", 0);
  near(st.clip_frac, 0.0, 0.0, "clip_frac", 0);
  check_grad(&c, &in);

  int ss2[2] = {0, 2};
  float w2[2] = {1, 1}, A2[2] = {1, 1}, mu2[2] = {0, 0}, lp2[2] = {lnf(2.5), lnf(0.9)};
  lh_loss_input in2 = {1, ss2, w2, A2, lp2, mu2, NULL, NULL, NULL, NULL};
  near(loss_of(&c, &in2, d, &st), -0.45, TOL, "loss without old", 0);
  near(d[0], 0, 0, "dlogp without old", 0);
  near(d[1], -0.45, TOL, "dlogp without old", 1);
  assert_int_equal(st.n_masked, 1);
  check_grad(&c, &in2);
}

/* Decoupled PPO, r = pi/pi_prox, q = pi_prox/mu.
 *   t0 q 2.5, r 0.7, A +1: obj min(0.7, 0.8) = 0.7 unclipped, d 0.7
 *   t1 q 1.5, r 1.2, A -1: obj min(-1.2, -1.2) = -1.2 unclipped, d -1.2
 * clamp (C = 2): c = 2, 1.5: loss = -(1.4 - 1.8) / 2 = 0.2; dlogp = -0.7, 0.9.
 * mask [0.5, 2]: t0 masked, t1 weight 1: loss = 1.2 / 2 = 0.6; dlogp = 0, 0.6. */
static void test_decoupled(void **state) {
  (void)state;
  int ss[2] = {0, 2};
  float w[2] = {1, 1}, A[2] = {1, -1}, mu[2] = {-1, -2};
  float prox[2] = {-1 + lnf(2.5), -2 + lnf(1.5)};
  float lp[2] = {prox[0] + lnf(0.7), prox[1] + lnf(1.2)};
  lh_loss_input in = {1, ss, w, A, lp, mu, prox, NULL, NULL, NULL};
  lh_loss_config c = cfg_of(LH_LOSS_DECOUPLED);
  float d[2];
  lh_loss_stats st;
  near(loss_of(&c, &in, d, &st), 0.2, TOL, "loss (clamp)", 0);
  near(d[0], -0.7, TOL, "dlogp (clamp)", 0);
  near(d[1], 0.9, TOL, "dlogp (clamp)", 1);
  assert_int_equal(st.n_masked, 0);
  check_grad(&c, &in);
  c.prox_mask = 1;
  near(loss_of(&c, &in, d, &st), 0.6, TOL, "loss (mask)", 0);
  near(d[0], 0, 0, "dlogp (mask)", 0);
  near(d[1], 0.6, TOL, "dlogp (mask)", 1);
  assert_int_equal(st.n_masked, 1);
  check_grad(&c, &in);
}

/* Aggregations, PPO with r = 1 (obj = A, d obj = A). seq0: prompt + 2 tokens, A 1, 2;
 * seq1: prompt + 3 tokens, A -1, 0.5, 3. Sum of A = 5.5 over 5 tokens.
 *   TOKEN: loss = -5.5 / 5 = -1.1, dlogp = -A / 5
 *   SEQ:   seq means 1.5 and 2.5/3; loss = -(1.5 + 0.8333333) / 2 = -1.1666667;
 *          dlogp = -A / (2 * 2) on seq0, -A / (3 * 2) on seq1
 *   CONST 0 (n_seqs * max_len = 2 * 3 = 6): loss = -5.5 / 6 = -0.9166667, dlogp = -A / 6
 *   CONST 10: loss = -0.55, dlogp = -A / 10 */
static void test_aggregation(void **state) {
  (void)state;
  int ss[3] = {0, 3, 7};
  float w[7] = {0, 1, 1, 0, 1, 1, 1};
  float A[7] = {9, 1, 2, 9, -1, 0.5f, 3};
  float mu[7] = {0, -0.5f, -1, 0, -2, -0.25f, -3};
  float lp[7];
  memcpy(lp, mu, sizeof lp);
  lh_loss_input in = {2, ss, w, A, lp, mu, NULL, NULL, NULL, NULL};
  lh_loss_config c = cfg_of(LH_LOSS_PPO);
  float d[7];
  struct {
    lh_loss_agg agg;
    float constant;
    double loss;
    double div[7];
  } cases[] = {
      {LH_AGG_TOKEN, 0, -1.1, {1, 5, 5, 1, 5, 5, 5}},
      {LH_AGG_SEQ, 0, -(1.5 + 2.5 / 3) / 2, {1, 4, 4, 1, 6, 6, 6}},
      {LH_AGG_CONST, 0, -5.5 / 6, {1, 6, 6, 1, 6, 6, 6}},
      {LH_AGG_CONST, 10, -0.55, {1, 10, 10, 1, 10, 10, 10}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    c.agg = cases[k].agg;
    c.constant = cases[k].constant;
    near(loss_of(&c, &in, d, NULL), cases[k].loss, TOL, "loss", (int)k);
    for (int i = 0; i < 7; i++)
      near(d[i], w[i] > 0 ? -A[i] / cases[k].div[i] : 0.0, TOL, "dlogp", i);
    check_grad(&c, &in);
  }
  /* A loss weight of 2 on seq1's last token, TOKEN: loss = -(1 + 2 - 1 + 0.5 + 2 * 3) / (4 + 2)
   * = -8.5 / 6 = -1.4166667; its dlogp = -2 * 3 / 6 = -1 */
  w[6] = 2;
  c.agg = LH_AGG_TOKEN;
  near(loss_of(&c, &in, d, NULL), -8.5 / 6, TOL, "loss with weight 2", 0);
  near(d[6], -1.0, TOL, "dlogp with weight 2", 6);
  check_grad(&c, &in);
}

/* M2PO on d = (old - mu)^2 = 0.01, 0.04, 0.25, 1.0 (log-ratios 0.1, 0.2, 0.5, 1.0), r = 1, A = 1.
 *   tau 0.12: mean of all 1.3/4 = 0.325 > tau; drop 1.0 -> 0.3/3 = 0.1 <= tau: 3 kept,
 *             threshold 0.25, loss = -3/4 = -0.75
 *   tau 0.05: drop 1.0 -> 0.1 > tau; drop 0.25 -> 0.05/2 = 0.025 <= tau: 2 kept, loss -0.5
 *   tau 1:    0.325 <= tau: all kept, threshold 1, loss -1
 *   tau 0.001: 0.01 alone > tau: nothing kept, loss 0. */
static void test_m2po(void **state) {
  (void)state;
  int ss[2] = {0, 4};
  float w[4] = {1, 1, 1, 1}, A[4] = {1, 1, 1, 1}, mu[4] = {0, 0, 0, 0};
  float old[4] = {0.1f, -0.2f, 0.5f, 1.0f}, lp[4] = {0, 0, 0, 0};
  lh_loss_input in = {1, ss, w, A, lp, mu, old, NULL, NULL, NULL};
  lh_loss_config c = cfg_of(LH_LOSS_PPO);
  float d[4];
  lh_loss_stats st;
  struct {
    float tau;
    double loss;
    int masked;
    double threshold;
  } cases[] = {{0.12f, -0.75, 1, 0.25}, {0.05f, -0.5, 2, 0.04}, {1, -1, 0, 1}, {0.001f, 0, 4, 0}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    c.m2po_tau = cases[k].tau;
    near(loss_of(&c, &in, d, &st), cases[k].loss, TOL, "loss", (int)k);
    assert_int_equal(st.n_masked, cases[k].masked);
    near(st.m2po_threshold, cases[k].threshold, 1e-6, "threshold", (int)k);
    /* Kept tokens are the ones with the smallest d: tokens 0..3 - masked. */
    for (int i = 0; i < 4; i++)
      near(d[i], i < 4 - cases[k].masked ? -0.25 : 0.0, TOL, "dlogp", i);
    check_grad(&c, &in);
  }
}

/* k3 KL to the reference, beta 0.1, A = 0 so the policy term is 0; x = ref - logp.
 *   x = 0.5:  k3 = e^0.5 - 0.5 - 1 = 0.1487213, d = 1 - e^0.5 = -0.6487213
 *   x = -0.5: k3 = e^-0.5 + 0.5 - 1 = 0.1065307, d = 1 - e^-0.5 = 0.3934693
 * loss = 0.1 * (0.1487213 + 0.1065307) / 2 = 0.0127626
 * dlogp = 0.1 * d / 2 = -0.0324361, 0.0196735. */
static void test_kl(void **state) {
  (void)state;
  int ss[2] = {0, 2};
  float w[2] = {1, 1}, A[2] = {0, 0}, mu[2] = {-1, -1}, lp[2] = {-1, -1};
  float ref[2] = {-0.5f, -1.5f};
  lh_loss_input in = {1, ss, w, A, lp, mu, NULL, ref, NULL, NULL};
  lh_loss_config c = cfg_of(LH_LOSS_PPO);
  c.kl_beta = 0.1f;
  float d[2];
  lh_loss_stats st;
  near(loss_of(&c, &in, d, &st), 0.0127626, TOL, "loss", 0);
  near(st.kl_loss, 0.0127626, TOL, "kl_loss", 0);
  near(st.pg_loss, 0.0, 1e-12, "pg_loss", 0);
  near(d[0], -0.0324361, TOL, "dlogp", 0);
  near(d[1], 0.0196735, TOL, "dlogp", 1);
  check_grad(&c, &in);
  in.ref = NULL;
  assert_int_equal(lh_loss_compute(&c, &in, d, &st), LH_ERR_INVAL);
}

/* Every kind x aggregation x (KL on/off) x (M2PO on/off) on a pseudo-random batch: analytic
 * gradient against the finite difference. Values are multiples of 1/64, away from clip edges. */
static void test_grad_sweep(void **state) {
  (void)state;
  enum { N = 24 };
  int ss[5] = {0, 5, 11, 18, N};
  float w[N], A[N], mu[N], old[N], lp[N], ref[N];
  uint32_t x = 12345;
  for (int i = 0; i < N; i++) {
    x = x * 1664525u + 1013904223u;
    w[i] = (i % 5 == 0) ? 0.0f : 0.5f + (float)((x >> 8) % 4) * 0.5f;
    x = x * 1664525u + 1013904223u;
    A[i] = (float)((int)((x >> 8) % 129) - 64) / 32.0f;
    x = x * 1664525u + 1013904223u;
    mu[i] = -(float)((x >> 8) % 192) / 64.0f;
    x = x * 1664525u + 1013904223u;
    old[i] = mu[i] + (float)((int)((x >> 8) % 65) - 32) / 64.0f;
    x = x * 1664525u + 1013904223u;
    lp[i] = old[i] + (float)((int)((x >> 8) % 49) - 24) / 64.0f;
    x = x * 1664525u + 1013904223u;
    ref[i] = lp[i] + (float)((int)((x >> 8) % 65) - 32) / 64.0f;
  }
  lh_loss_input in = {4, ss, w, A, lp, mu, old, ref, NULL, NULL};
  int seen_clip = 0, seen_mask = 0;
  for (int kind = 0; kind <= LH_LOSS_DECOUPLED; kind++)
    for (int pm = 0; pm < (kind == LH_LOSS_DECOUPLED ? 2 : 1); pm++)
      for (int agg = 0; agg <= LH_AGG_CONST; agg++)
        for (int kl = 0; kl < 2; kl++)
          for (int m2 = 0; m2 < 2; m2++) {
            lh_loss_config c = cfg_of((lh_loss_kind)kind);
            c.prox_mask = pm;
            c.agg = (lh_loss_agg)agg;
            c.kl_beta = kl ? 0.05f : 0.0f;
            c.m2po_tau = m2 ? 0.02f : 0.0f;
            c.C = 1.5f;
            c.lo = 0.7f;
            c.hi = 1.4f;
            float d[N];
            lh_loss_stats st;
            loss_of(&c, &in, d, &st);
            seen_clip |= st.n_clipped > 0;
            seen_mask |= st.n_masked > 0;
            check_grad(&c, &in);
          }
  /* The sweep exercises clipped and masked tokens, not only the smooth part. */
  assert_true(seen_clip);
  assert_true(seen_mask);
}

/* The off-policy candidates. Their sequence weights (SEQ_TIS, VESPO, SNIS) are constants of
 * the step, functions of logp - mu: the finite difference moves mu with logp, which keeps them
 * fixed and leaves the gradient of the term they weight. M2PO's bound is a constant of the step
 * too: the token whose (log r)^2 sets it is left out. */
static void check_grad_candidate(const lh_loss_config *c, const lh_loss_input *in0) {
  int n = in0->seq_start[in0->n_seqs];
  float logp[NMAX], mu[NMAX], d[NMAX], scratch[NMAX];
  memcpy(logp, in0->logp, (size_t)n * sizeof *logp);
  memcpy(mu, in0->mu, (size_t)n * sizeof *mu);
  lh_loss_input in = *in0;
  in.logp = logp, in.mu = mu;
  lh_loss_stats st;
  loss_of(c, &in, d, &st);
  int shift = c->kind == LH_LOSS_SEQ_TIS || c->kind == LH_LOSS_VESPO || c->kind == LH_LOSS_SNIS;
  const float h = 1.0f / 4096.0f;
  int checked = 0;
  for (int i = 0; i < n; i++) {
    if (!(in.weight[i] > 0.0f)) {
      near(d[i], 0.0, 0.0, "dlogp of an invalid token", i);
      continue;
    }
    if (c->kind == LH_LOSS_M2PO) {
      double x = (double)logp[i] - (in.old ? in.old[i] : mu[i]);
      if ((double)(float)(x * x) == st.m2po_threshold) continue;
    }
    float x = logp[i], m = mu[i];
    logp[i] = x + h, mu[i] = shift ? m + h : m;
    double lp = loss_of(c, &in, scratch, NULL);
    logp[i] = x - h, mu[i] = shift ? m - h : m;
    double lm = loss_of(c, &in, scratch, NULL);
    logp[i] = x, mu[i] = m;
    double fd = (lp - lm) / (2.0 * h);
    near(d[i], fd, 1e-5 + 1e-4 * fabs(fd), "dlogp vs finite difference", i);
    checked++;
  }
  assert_true(checked > 0);
}

static void test_candidates_grad(void **state) {
  (void)state;
  enum { N = 30 };
  int ss[7] = {0, 5, 9, 14, 20, 25, N}, group[6] = {0, 0, 0, 1, 1, 2};
  float w[N], A[N], mu[N], old[N], lp[N], ref[N], R[6] = {1, 0, 0.5f, 1, 0, 1};
  uint32_t x = 777;
  for (int s = 0; s < 6; s++) {
    x = x * 1664525u + 1013904223u;
    float As = (float)((int)((x >> 8) % 129) - 64) / 32.0f;
    for (int i = ss[s]; i < ss[s + 1]; i++) {
      x = x * 1664525u + 1013904223u;
      w[i] = (i == ss[s]) ? 0.0f : 0.5f + (float)((x >> 8) % 4) * 0.5f;
      A[i] = As; /* one advantage per sequence, as batches have it */
      x = x * 1664525u + 1013904223u;
      mu[i] = -(float)((x >> 8) % 192) / 64.0f;
      x = x * 1664525u + 1013904223u;
      old[i] = mu[i] + (float)((int)((x >> 8) % 33) - 16) / 64.0f;
      x = x * 1664525u + 1013904223u;
      lp[i] = old[i] + (float)((int)((x >> 8) % 65) - 32) / 64.0f;
      x = x * 1664525u + 1013904223u;
      ref[i] = lp[i] + (float)((int)((x >> 8) % 65) - 32) / 64.0f;
    }
  }
  lh_loss_input in = {6, ss, w, A, lp, mu, old, ref, group, R};
  int clipped = 0, masked = 0;
  for (int kind = LH_LOSS_M2PO; kind <= LH_LOSS_SNIS; kind++)
    for (int agg = 0; agg <= LH_AGG_CONST; agg++)
      for (int kl = 0; kl < 2; kl++)
        for (int with_old = 0; with_old < 2; with_old++) {
          lh_loss_config c = cfg_of((lh_loss_kind)kind);
          c.agg = (lh_loss_agg)agg;
          c.kl_beta = kl ? 0.05f : 0.0f;
          c.m2_tau = 0.01f;   /* bounds some of these tokens */
          c.seq_cap = 1.5f;   /* truncates some sequences */
          c.tv_delta = 0.05f; /* masks some tokens */
          c.oapl_beta2 = 0.1f;
          lh_loss_input i2 = in;
          i2.old = with_old ? old : NULL;
          float d[N];
          lh_loss_stats st;
          loss_of(&c, &i2, d, &st);
          clipped += st.n_clipped, masked += st.n_masked;
          check_grad_candidate(&c, &i2);
        }
  assert_true(clipped > 0 && masked > 0);
}

/* On-policy (logp = old = mu) every candidate but OAPL and DPPO's penalty-free part is the plain
 * policy gradient -A w / norm: M2PO bounds nothing, the sequence weights are 1, SNIS's
 * re-centring removes nothing from advantages that have mean 0 in their group, and the ESS
 * is 1. OAPL's gradient is its regression residual, -2 beta2 (R - V) w / n_seqs. */
static void test_candidates_on_policy(void **state) {
  (void)state;
  int ss[5] = {0, 3, 6, 9, 12}, group[4] = {0, 0, 1, 1};
  float w[12] = {0, 1, 1, 0, 1, 1, 0, 1, 2, 0, 1, 1};
  float A[12] = {1, 1, 1, -1, -1, -1, .5f, .5f, .5f, -.5f, -.5f, -.5f};
  float lp[12] = {-1, -.5f, -2, -1, -.25f, -3, -1, -.75f, -1.5f, -1, -2, -.5f};
  float R[4] = {1, 0, 1, 0};
  lh_loss_input in = {4, ss, w, A, lp, lp, lp, NULL, group, R};
  for (int kind = LH_LOSS_M2PO; kind <= LH_LOSS_SNIS; kind++) {
    lh_loss_config c = cfg_of((lh_loss_kind)kind);
    float d[12];
    lh_loss_stats st;
    loss_of(&c, &in, d, &st);
    near(st.ess, 1.0, 1e-12, "ess on-policy", kind);
    assert_int_equal(st.n_clipped, 0);
    assert_int_equal(st.n_masked, 0);
    double V0 = log((exp(1.0) + 1.0) / 2.0); /* both groups hold rewards 1 and 0 */
    for (int i = 0; i < 12; i++) {
      int s = i / 3;
      double want = kind == LH_LOSS_OAPL ? 2.0 * c.oapl_beta2 * w[i] * -(R[s] - V0) / 4.0
                                         : -(double)A[i] * w[i] / 9.0;
      near(d[i], want, 1e-7, lh_loss_kind_names[kind], i);
    }
  }
}

static void test_bad_input(void **state) {
  (void)state;
  int ss[3] = {0, 2, 1};
  float v[2] = {0, 0}, d[2];
  lh_loss_input in = {2, ss, v, v, v, v, NULL, NULL, NULL, NULL};
  lh_loss_config c = cfg_of(LH_LOSS_PPO);
  assert_int_equal(lh_loss_compute(&c, &in, d, NULL), LH_ERR_INVAL); /* decreasing seq_start */
  in.n_seqs = 1;
  assert_int_equal(lh_loss_compute(&c, &in, d, NULL), LH_ERR_OK);
  c.kind = LH_LOSS_DECOUPLED;
  assert_int_equal(lh_loss_compute(&c, &in, d, NULL), LH_ERR_INVAL); /* needs prox */
  c.kind = LH_LOSS_PPO;
  c.eps_low = 1.5f;
  assert_int_equal(lh_loss_compute(&c, &in, d, NULL), LH_ERR_INVAL);
  /* a NaN or infinite KL weight is refused, not read as "no KL" (NaN > 0 is false) */
  c = cfg_of(LH_LOSS_PPO);
  c.kl_beta = NAN;
  assert_int_equal(lh_loss_compute(&c, &in, d, NULL), LH_ERR_INVAL);
  c.kl_beta = INFINITY;
  assert_int_equal(lh_loss_compute(&c, &in, d, NULL), LH_ERR_INVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ppo_clip),
      cmocka_unit_test(test_tis),
      cmocka_unit_test(test_masked_is),
      cmocka_unit_test(test_decoupled),
      cmocka_unit_test(test_aggregation),
      cmocka_unit_test(test_m2po),
      cmocka_unit_test(test_kl),
      cmocka_unit_test(test_grad_sweep),
      cmocka_unit_test(test_candidates_grad),
      cmocka_unit_test(test_candidates_on_policy),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
