/* The verifiable sampler and its checker: the Philox uniform, every filter worked by hand on
 * small logit vectors (ties included), log-probs, a chi-square test, agreement with a plain
 * full-sort reference at large V, and the checker on honest, perturbed and forged tokens. */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longhaul/sample.h"
#include "near.h"

#define VMAX 40000

static lh_sample_scratch *scratch; /* created for VMAX, used with every smaller V */

static int setup(void **state) {
  scratch = lh_sample_scratch_create(VMAX);
  return scratch ? 0 : -1;
}

static int teardown(void **state) {
  lh_sample_scratch_free(scratch);
  return 0;
}

static lh_sample_params params(float t, int k, float top_p, float min_p) {
  return (lh_sample_params){.temperature = t, .top_k = k, .top_p = top_p, .min_p = min_p};
}

/* logits whose softmax at temperature 1 is proportional to w */
static void logits_of(const double *w, int V, float *out) {
  for (int i = 0; i < V; i++)
    out[i] = w[i] > 0 ? (float)log(w[i]) : -INFINITY;
}

static int32_t pick(const float *l, int V, lh_sample_params p, double u) {
  return lh_sample(l, V, &p, u, scratch).token;
}

static lh_sample_verdict check(const float *l, int V, lh_sample_params p, double u, int32_t tok,
                               double tol) {
  return lh_sample_check(l, V, &p, u, tok, tol, scratch);
}

/* the worker's logits w are within tol of l */
static bool within(const float *l, const float *w, int V, double tol) {
  for (int i = 0; i < V; i++)
    if (!(fabs((double)w[i] - (double)l[i]) <= tol)) return false;
  return true;
}

/* deterministic test randomness from Philox (a stream apart from any sampler stream) */
static uint64_t rng_pos;
static double rnd(void) {
  return lh_sample_uniform(0x7e57, 0xffffu, rng_pos++);
}
static double rnd_normal(void) {
  double u1 = rnd(), u2 = rnd();
  return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

/* ---- parameters and the uniform ---- */

static void test_params_validate(void **state) {
  lh_sample_params d = lh_sample_defaults();
  assert_true(d.temperature == 1.0f && d.top_k == 0 && d.top_p == 1.0f && d.min_p == 0.0f);
  assert_int_equal(lh_sample_params_validate(&d), LH_ERR_OK);
  lh_sample_params ok[] = {params(0, 0, 1, 0), params(0.7f, 50, 0.9f, 0.05f),
                           params(2, 1, 1e-6f, 0.999f)};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    assert_int_equal(lh_sample_params_validate(&ok[i]), LH_ERR_OK);
  struct {
    lh_sample_params p;
    const char *field;
  } bad[] = {
      {params(-0.1f, 0, 1, 0), "temperature"},
      {params(NAN, 0, 1, 0), "temperature"},
      {params(INFINITY, 0, 1, 0), "temperature"},
      {params(1, -1, 1, 0), "top_k"},
      {params(1, 0, 0, 0), "top_p"},
      {params(1, 0, 1.5f, 0), "top_p"},
      {params(1, 0, NAN, 0), "top_p"},
      {params(1, 0, -0.5f, 0), "top_p"},
      {params(1, 0, 1, -0.1f), "min_p"},
      {params(1, 0, 1, 1.0f), "min_p"},
      {params(1, 0, 1, NAN), "min_p"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(lh_sample_params_validate(&bad[i].p), LH_ERR_INVAL);
    assert_non_null(strstr(lh_last_error(), bad[i].field));
  }
  assert_int_equal(lh_sample_params_validate(NULL), LH_ERR_INVAL);
}

static void test_uniform_from_philox(void **state) {
  /* Random123 philox4x32-10 at zero key and counter gives words 0x6627e8d5, 0xe169c58d:
   * ((0x6627e8d5 >> 5) * 2^26 + (0xe169c58d >> 6)) / 2^53 */
  assert_true(lh_sample_uniform(0, 0, 0) == 0.39904647231489565);
  for (uint64_t i = 0; i < 64; i++) {
    uint64_t seed = 1234567 + i * 977, seq = i % 7, pos = i * i;
    uint32_t r[4];
    lh_philox(seed, seq, pos, r);
    double want = ((double)(r[0] >> 5) * 67108864.0 + (double)(r[1] >> 6)) / 9007199254740992.0;
    assert_true(lh_sample_uniform(seed, seq, pos) == want);
  }
  /* range, mean, and 53 bits used (some values have a low bit set below 2^-32) */
  double sum = 0;
  int fine = 0;
  for (uint64_t i = 0; i < 100000; i++) {
    double u = lh_sample_uniform(42, 3, i);
    assert_true(u >= 0.0 && u < 1.0);
    sum += u;
    double scaled = ldexp(u, 32);
    fine += scaled != floor(scaled);
  }
  assert_true(fabs(sum / 100000 - 0.5) < 0.005);
  assert_true(fine > 90000);
}

static void test_uniform_depends_only_on_its_key(void **state) {
  enum { N = 256 };
  static double fwd[N], back[N];
  for (int i = 0; i < N; i++)
    fwd[i] = lh_sample_uniform(99, (uint64_t)i % 4, (uint64_t)i / 4);
  /* a different order, interleaved with unrelated draws, gives the same numbers */
  for (int i = N - 1; i >= 0; i--) {
    (void)lh_sample_uniform(7, 1, (uint64_t)i);
    back[i] = lh_sample_uniform(99, (uint64_t)i % 4, (uint64_t)i / 4);
  }
  assert_memory_equal(fwd, back, sizeof fwd);
  /* each of seed, seq and pos changes the number */
  double base = lh_sample_uniform(99, 2, 10);
  assert_true(lh_sample_uniform(100, 2, 10) != base);
  assert_true(lh_sample_uniform(99, 3, 10) != base);
  assert_true(lh_sample_uniform(99, 2, 11) != base);
  assert_true(lh_sample_uniform(99 + (1ull << 32), 2, 10) != base);
  assert_true(lh_sample_uniform(99, 2 + (1ull << 32), 10) != base);
  assert_true(lh_sample_uniform(99, 2, 10 + (1ull << 32)) != base);
}

/* Runs f(u) in a child process; true if the child aborted (an LH_CHECK) and wrote `want` to
 * stderr. */
static bool aborts_with(void (*f)(double), double u, const char *want) {
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  fflush(NULL);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    dup2(fd[1], 2);
    close(fd[0]);
    f(u);
    _exit(0);
  }
  close(fd[1]);
  char msg[1024];
  size_t n = 0;
  ssize_t got;
  while (n < sizeof msg - 1 && (got = read(fd[0], msg + n, sizeof msg - 1 - n)) > 0)
    n += (size_t)got;
  msg[n] = 0;
  close(fd[0]);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strstr(msg, want);
}

static void sample_top2(double u) {
  float l[] = {-INFINITY, 0.0f, 1.0f, 0.5f};
  lh_sample_params k2 = params(1, 2, 1, 0);
  (void)lh_sample(l, 4, &k2, u, scratch);
}

static void sample_plain(double u) {
  float l[] = {-INFINITY, 0.0f, 1.0f, 0.5f};
  (void)lh_sample(l, 4, &(lh_sample_params){1, 0, 1, 0}, u, scratch);
}

static void check_plain(double u) {
  float l[] = {-INFINITY, 0.0f, 1.0f, 0.5f};
  (void)lh_sample_check(l, 4, &(lh_sample_params){1, 0, 1, 0}, u, 2, 1e-4, scratch);
}

/* u outside [0, 1) is a caller's bug: it once gave token -1 (and read logits[-1]) under top-k
 * and a masked token without filters. Both functions refuse it by name. */
static void test_uniform_out_of_range(void **state) {
  double bad[] = {-0.1, -1e-300, 1.0, 1.5, NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_true(aborts_with(sample_top2, bad[i], "lh_sample: u = "));
    assert_true(aborts_with(sample_plain, bad[i], "expected [0, 1)"));
    assert_true(aborts_with(check_plain, bad[i], "lh_sample_check: u = "));
  }
  /* the ends of the range are fine */
  float l[] = {-INFINITY, 0.0f, 1.0f, 0.5f};
  lh_sample_params k2 = params(1, 2, 1, 0), p = lh_sample_defaults();
  assert_int_equal(pick(l, 4, k2, 0.0), 2);
  assert_int_equal(pick(l, 4, k2, -0.0), 2);
  assert_int_equal(pick(l, 4, k2, nextafter(1.0, 0.0)), 3);
  assert_int_equal(pick(l, 4, p, 0.0), 1);
  assert_int_equal(pick(l, 4, p, nextafter(1.0, 0.0)), 3);
  assert_int_not_equal(check(l, 4, p, 0.0, 1, 1e-4), LH_SAMPLE_INCONSISTENT);
}

/* ---- greedy ---- */

static void test_greedy(void **state) {
  float l[] = {1.0f, 3.0f, 3.0f, 2.0f};
  lh_sample_params g = params(0, 0, 1, 0);
  for (double u = 0; u < 1; u += 0.125) {
    lh_sample_result r = lh_sample(l, 4, &g, u, scratch);
    assert_int_equal(r.token, 1); /* tie between 1 and 2: the lower id */
    assert_true(r.logprob == 0.0f);
    double z = exp(1.0) + 2 * exp(3.0) + exp(2.0);
    assert_float_equal(r.logprob_model, 3.0 - log(z), 1e-6);
  }
  /* filters do not change the argmax */
  lh_sample_params gf = params(0, 2, 0.5f, 0.5f);
  assert_int_equal(lh_sample(l, 4, &gf, 0.9, scratch).token, 1);
  float m[] = {-5.0f, -1.0f, -7.0f, -1.5f, -0.5f};
  assert_int_equal(pick(m, 5, g, 0.3), 4);

  assert_int_equal(check(l, 4, g, 0.5, 1, 1e-4), LH_SAMPLE_BORDERLINE); /* exact tie */
  assert_int_equal(check(l, 4, g, 0.5, 2, 1e-4), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 4, g, 0.5, 3, 1e-4), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(m, 5, g, 0.5, 4, 1e-4), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(m, 5, g, 0.5, 1, 1e-4), LH_SAMPLE_INCONSISTENT);
  float n[] = {0.0f, 1.0f, 1.0f + 5e-5f};
  assert_int_equal(check(n, 3, g, 0.5, 2, 1e-4), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(n, 3, g, 0.5, 1, 1e-4), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(n, 3, g, 0.5, 2, 1e-5), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(n, 3, g, 0.5, 1, 1e-5), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(n, 3, g, 0.5, 3, 1e-5), LH_SAMPLE_INCONSISTENT); /* out of range */
  assert_int_equal(check(n, 3, g, 0.5, -1, 1e-5), LH_SAMPLE_INCONSISTENT);
}

/* ---- temperature alone ---- */

static void test_temperature_one(void **state) {
  /* p = 0.1 0.2 0.3 0.4: intervals [0,.1) [.1,.3) [.3,.6) [.6,1) */
  double w[] = {1, 2, 3, 4};
  float l[4];
  logits_of(w, 4, l);
  lh_sample_params p = lh_sample_defaults();
  struct {
    double u;
    int tok;
  } cases[] = {{0.0, 0},  {0.05, 0}, {0.099, 0}, {0.101, 1},   {0.29, 1},
               {0.31, 2}, {0.59, 2}, {0.61, 3},  {0.999999, 3}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    assert_int_equal(pick(l, 4, p, cases[i].u), cases[i].tok);
  lh_sample_result r = lh_sample(l, 4, &p, 0.4, scratch);
  assert_int_equal(r.token, 2);
  assert_float_equal(r.logprob, log(0.3), 1e-6);
  assert_float_equal(r.logprob_model, log(0.3), 1e-6);
  /* the chosen token is the first whose cumulative weight exceeds u * total: on an exact
   * boundary the next token; zero-weight tokens are never chosen */
  float even[] = {0.0f, 0.0f}, masked[] = {-INFINITY, 0.0f, -INFINITY, 0.0f};
  assert_int_equal(pick(even, 2, p, 0.5), 1);
  assert_int_equal(pick(even, 2, p, 0.0), 0);
  assert_int_equal(pick(masked, 4, p, 0.0), 1);
  assert_int_equal(pick(masked, 4, p, 0.5), 3);
  /* shifting every logit changes nothing */
  float s[4];
  for (int i = 0; i < 4; i++)
    s[i] = l[i] + 100.0f;
  assert_int_equal(pick(s, 4, p, 0.31), 2);
  assert_int_equal(pick(s, 4, p, 0.29), 1);
}

static void test_temperature_scaling(void **state) {
  double w[] = {1, 2, 3, 4};
  float l[4];
  logits_of(w, 4, l);
  /* T = 0.5 squares the weights: 1 4 9 16 over 30 */
  lh_sample_params half = params(0.5f, 0, 1, 0);
  assert_int_equal(pick(l, 4, half, 0.02), 0);  /* [0, 1/30) */
  assert_int_equal(pick(l, 4, half, 0.035), 1); /* [1/30, 5/30) */
  assert_int_equal(pick(l, 4, half, 0.16), 1);
  assert_int_equal(pick(l, 4, half, 0.17), 2); /* [5/30, 14/30) */
  assert_int_equal(pick(l, 4, half, 0.46), 2);
  assert_int_equal(pick(l, 4, half, 0.47), 3); /* [14/30, 1) */
  lh_sample_result r = lh_sample(l, 4, &half, 0.1, scratch);
  assert_int_equal(r.token, 1);
  assert_float_equal(r.logprob, log(4.0 / 30), 1e-6);
  assert_float_equal(r.logprob_model, log(0.2), 1e-6); /* the model at temperature 1 */
  /* T = 2 takes square roots: cumulative 0.16270 0.39279 0.67460 1 */
  lh_sample_params two = params(2, 0, 1, 0);
  double z = 1 + sqrt(2) + sqrt(3) + 2;
  assert_int_equal(pick(l, 4, two, 0.1626), 0);
  assert_int_equal(pick(l, 4, two, 0.1628), 1);
  assert_int_equal(pick(l, 4, two, 0.3927), 1);
  assert_int_equal(pick(l, 4, two, 0.3929), 2);
  assert_int_equal(pick(l, 4, two, 0.6745), 2);
  assert_int_equal(pick(l, 4, two, 0.6747), 3);
  r = lh_sample(l, 4, &two, 0.5, scratch);
  assert_int_equal(r.token, 2);
  assert_float_equal(r.logprob, log(sqrt(3) / z), 1e-6);
  assert_float_equal(r.logprob_model, log(0.3), 1e-6);
}

/* ---- filters on V = 8: weights 5 1 8 2 8 3 1 2 (sum 30) at T = 1 ----
 * rank order (logit desc, id asc): 2 4 0 5 3 7 1 6 */
static const double w8[8] = {5, 1, 8, 2, 8, 3, 1, 2};

static void test_top_k(void **state) {
  float l[8];
  logits_of(w8, 8, l);
  /* top-k 3 keeps {2, 4, 0}; by id: 0 [0, 5/21) 2 [5/21, 13/21) 4 [13/21, 1) */
  lh_sample_params k3 = params(1, 3, 1, 0);
  assert_int_equal(pick(l, 8, k3, 0.0), 0);
  assert_int_equal(pick(l, 8, k3, 0.23), 0);
  assert_int_equal(pick(l, 8, k3, 0.25), 2);
  assert_int_equal(pick(l, 8, k3, 0.61), 2);
  assert_int_equal(pick(l, 8, k3, 0.63), 4);
  lh_sample_result r = lh_sample(l, 8, &k3, 0.3, scratch);
  assert_float_equal(r.logprob, log(8.0 / 21), 1e-6);
  assert_float_equal(r.logprob_model, log(8.0 / 30), 1e-6);
  /* top-k 1: of the tied 2 and 4, the lower id; the distribution is a point mass */
  lh_sample_params k1 = params(1, 1, 1, 0);
  for (double u = 0; u < 1; u += 0.0625) {
    r = lh_sample(l, 8, &k1, u, scratch);
    assert_int_equal(r.token, 2);
    assert_float_equal(r.logprob, 0.0, 1e-7);
  }
  /* top-k 2 keeps both eights: [0, .5) [.5, 1) */
  lh_sample_params k2 = params(1, 2, 1, 0);
  assert_int_equal(pick(l, 8, k2, 0.49), 2);
  assert_int_equal(pick(l, 8, k2, 0.51), 4);
  /* top-k 5 keeps {2,4,0,5,3}: token 3 wins the tie with 7; total 26, cumulative by id
   * 0:5 2:13 3:15 4:23 5:26 */
  lh_sample_params k5 = params(1, 5, 1, 0);
  assert_int_equal(pick(l, 8, k5, 0.49), 2);
  assert_int_equal(pick(l, 8, k5, 0.51), 3);
  assert_int_equal(pick(l, 8, k5, 0.57), 3);
  assert_int_equal(pick(l, 8, k5, 0.58), 4);
  assert_int_equal(pick(l, 8, k5, 0.99), 5);
  r = lh_sample(l, 8, &k5, 0.55, scratch);
  assert_float_equal(r.logprob, log(2.0 / 26), 1e-6);
  /* top-k 6 adds 7: total 28, 7 holds [26/28, 1) */
  lh_sample_params k6 = params(1, 6, 1, 0);
  assert_int_equal(pick(l, 8, k6, 0.92), 5);
  assert_int_equal(pick(l, 8, k6, 0.93), 7);
  /* k >= V is off */
  lh_sample_params k8 = params(1, 8, 1, 0), k9 = params(1, 9, 1, 0);
  for (double u = 0.01; u < 1; u += 0.03) {
    assert_int_equal(pick(l, 8, k8, u), pick(l, 8, lh_sample_defaults(), u));
    assert_int_equal(pick(l, 8, k9, u), pick(l, 8, lh_sample_defaults(), u));
  }
}

static void test_top_p(void **state) {
  float l[8];
  logits_of(w8, 8, l);
  /* cumulative in rank order: 2:.2667 4:.5333 0:.7 5:.8 3:.8667 7:.9333 1:.9667 6:1 */
  lh_sample_params p5 = params(1, 0, 0.5f, 0);
  assert_int_equal(pick(l, 8, p5, 0.0), 2); /* {2, 4}: [0, .5) [.5, 1) */
  assert_int_equal(pick(l, 8, p5, 0.49), 2);
  assert_int_equal(pick(l, 8, p5, 0.51), 4);
  lh_sample_result r = lh_sample(l, 8, &p5, 0.7, scratch);
  assert_float_equal(r.logprob, log(0.5), 1e-6);
  assert_float_equal(r.logprob_model, log(8.0 / 30), 1e-6);
  /* 0.75 is crossed by token 5: {0, 2, 4, 5}, total 24, by id 0:5 2:13 4:21 5:24 */
  lh_sample_params p75 = params(1, 0, 0.75f, 0);
  assert_int_equal(pick(l, 8, p75, 0.20), 0);
  assert_int_equal(pick(l, 8, p75, 0.21), 2);
  assert_int_equal(pick(l, 8, p75, 0.54), 2);
  assert_int_equal(pick(l, 8, p75, 0.55), 4);
  assert_int_equal(pick(l, 8, p75, 0.87), 4);
  assert_int_equal(pick(l, 8, p75, 0.88), 5);
  r = lh_sample(l, 8, &p75, 0.9, scratch);
  assert_float_equal(r.logprob, log(3.0 / 24), 1e-6);
  /* 0.85 is crossed by token 3, which precedes the tied 7: {0,2,3,4,5} as top-k 5 */
  lh_sample_params p85 = params(1, 0, 0.85f, 0), k5 = params(1, 5, 1, 0);
  for (double u = 0.005; u < 1; u += 0.01)
    assert_int_equal(pick(l, 8, p85, u), pick(l, 8, k5, u));
  /* a tiny top-p keeps only the most likely token (the lower id of a tie) */
  lh_sample_params tiny = params(1, 0, 0.01f, 0);
  r = lh_sample(l, 8, &tiny, 0.99, scratch);
  assert_int_equal(r.token, 2);
  assert_float_equal(r.logprob, 0.0, 1e-7);
  /* ties inside the order: weights 2 1 2 1, rank order 0 2 1 3; top-p 0.7 keeps {0, 2, 1}:
   * by id 0 [0, .4) 1 [.4, .6) 2 [.6, 1) */
  double wt[] = {2, 1, 2, 1};
  float lt[4];
  logits_of(wt, 4, lt);
  lh_sample_params p7 = params(1, 0, 0.7f, 0), p3 = params(1, 0, 0.3f, 0);
  assert_int_equal(pick(lt, 4, p7, 0.39), 0);
  assert_int_equal(pick(lt, 4, p7, 0.41), 1);
  assert_int_equal(pick(lt, 4, p7, 0.61), 2);
  assert_int_equal(pick(lt, 4, p7, 0.99), 2);
  assert_int_equal(pick(lt, 4, p3, 0.99), 0);
  /* the token whose p makes the sum reach top_p exactly is kept, and the next one is not:
   * flat weights, top-p 0.5 sums .25 .5 and keeps {0, 1}, so u = 0.9 picks 1 (a rule that
   * needs the sum to exceed top_p would keep 2 as well and pick it) */
  float flat[] = {0.0f, 0.0f, 0.0f, 0.0f};
  lh_sample_params p5f = params(1, 0, 0.5f, 0);
  assert_int_equal(pick(flat, 4, p5f, 0.9), 1);
  assert_int_equal(pick(flat, 4, p5f, 0.4), 0);
  /* -0 and +0 are one logit: they tie and the lower id ranks first, so top-p 0.5 keeps only
   * id 0 whichever sign it carries */
  float z[] = {-0.0f, +0.0f}, zr[] = {+0.0f, -0.0f};
  for (double u = 0.05; u < 1; u += 0.1) {
    assert_int_equal(pick(z, 2, p5f, u), 0);
    assert_int_equal(pick(zr, 2, p5f, u), 0);
  }
}

static void test_top_k_then_top_p_uses_original_p(void **state) {
  float l[8];
  logits_of(w8, 8, l);
  /* top-k 3 keeps {2, 4, 0}; top-p 0.65 sums the original p in rank order .2667 .5333 .7, so
   * it keeps all three (renormalised p .381 .762 would drop 0) */
  lh_sample_params kp = params(1, 3, 0.65f, 0), k3 = params(1, 3, 1, 0);
  for (double u = 0.005; u < 1; u += 0.01)
    assert_int_equal(pick(l, 8, kp, u), pick(l, 8, k3, u));
  assert_int_equal(pick(l, 8, kp, 0.1), 0);
  /* top-k 4 and top-p 0.5: {2, 4} */
  lh_sample_params kp2 = params(1, 4, 0.5f, 0);
  assert_int_equal(pick(l, 8, kp2, 0.1), 2);
  assert_int_equal(pick(l, 8, kp2, 0.6), 4);
}

static void test_min_p(void **state) {
  float l[8];
  logits_of(w8, 8, l);
  /* min-p 0.5 keeps p >= 0.5 * 8/30, i.e. weights >= 4: {0, 2, 4} as top-k 3 */
  lh_sample_params m5 = params(1, 0, 1, 0.5f), k3 = params(1, 3, 1, 0);
  for (double u = 0.005; u < 1; u += 0.01)
    assert_int_equal(pick(l, 8, m5, u), pick(l, 8, k3, u));
  lh_sample_result r = lh_sample(l, 8, &m5, 0.9, scratch);
  assert_int_equal(r.token, 4);
  assert_float_equal(r.logprob, log(8.0 / 21), 1e-6);
  /* min-p 0.3: weights >= 2.4: {0, 2, 4, 5}, total 24, 5 holds [21/24, 1) */
  lh_sample_params m3 = params(1, 0, 1, 0.3f);
  assert_int_equal(pick(l, 8, m3, 0.87), 4);
  assert_int_equal(pick(l, 8, m3, 0.88), 5);
  /* min-p 0.2: weights >= 1.6: {0,2,3,4,5,7}, total 28, 7 holds [26/28, 1) */
  lh_sample_params m2 = params(1, 0, 1, 0.2f);
  assert_int_equal(pick(l, 8, m2, 0.17), 0);
  assert_int_equal(pick(l, 8, m2, 0.18), 2); /* 1 is dropped: 2 follows 0 at 5/28 */
  assert_int_equal(pick(l, 8, m2, 0.93), 7);
  r = lh_sample(l, 8, &m2, 0.95, scratch);
  assert_float_equal(r.logprob, log(2.0 / 28), 1e-6);
  /* at T = 0.5 the weights square (25 1 64 4 64 9 1 4): min-p 0.3 keeps >= 19.2: {0, 2, 4} */
  lh_sample_params m3h = params(0.5f, 0, 1, 0.3f);
  r = lh_sample(l, 8, &m3h, 0.1, scratch);
  assert_int_equal(r.token, 0);
  assert_float_equal(r.logprob, log(25.0 / 153), 1e-6);
  assert_float_equal(r.logprob_model, log(5.0 / 30), 1e-6);
}

static void test_filter_combinations(void **state) {
  float l[8];
  logits_of(w8, 8, l);
  /* top-k 4 {2,4,0,5}, top-p 0.6 {2,4,0}, min-p 0.7 (weights >= 5.6) {2,4} */
  lh_sample_params all = params(1, 4, 0.6f, 0.7f);
  assert_int_equal(pick(l, 8, all, 0.01), 2);
  assert_int_equal(pick(l, 8, all, 0.49), 2);
  assert_int_equal(pick(l, 8, all, 0.51), 4);
  lh_sample_result r = lh_sample(l, 8, &all, 0.8, scratch);
  assert_float_equal(r.logprob, log(0.5), 1e-6);
  /* T = 0.5 (weights 25 1 64 4 64 9 1 4, sum 172) with top-p 0.8: rank cumulative .372 .744
   * .890 keeps {2, 4, 0}, total 153: 0 [0, 25/153) 2 [25/153, 89/153) 4 [89/153, 1) */
  lh_sample_params tp = params(0.5f, 0, 0.8f, 0);
  assert_int_equal(pick(l, 8, tp, 0.16), 0);
  assert_int_equal(pick(l, 8, tp, 0.17), 2);
  assert_int_equal(pick(l, 8, tp, 0.58), 2);
  assert_int_equal(pick(l, 8, tp, 0.59), 4);
  r = lh_sample(l, 8, &tp, 0.7, scratch);
  assert_float_equal(r.logprob, log(64.0 / 153), 1e-6);
  assert_float_equal(r.logprob_model, log(8.0 / 30), 1e-6);
  /* top-k 6 {2,4,0,5,3,7} and min-p 0.2 (>= 1.6, drops 1 and 6): both keep the same set */
  lh_sample_params km = params(1, 6, 1, 0.2f), k6 = params(1, 6, 1, 0);
  for (double u = 0.005; u < 1; u += 0.01)
    assert_int_equal(pick(l, 8, km, u), pick(l, 8, k6, u));
  /* top-k 2 and min-p 0.9 both keep the tied eights */
  lh_sample_params k2m = params(1, 2, 1, 0.9f);
  assert_int_equal(pick(l, 8, k2m, 0.49), 2);
  assert_int_equal(pick(l, 8, k2m, 0.51), 4);
}

static void test_non_finite_logits(void **state) {
  float l[] = {NAN, -INFINITY, 0.0f, logf(3.0f), -INFINITY};
  lh_sample_params p = lh_sample_defaults();
  /* NaN and -inf weigh nothing: 2 [0, .25) 3 [.25, 1) */
  assert_int_equal(pick(l, 5, p, 0.0), 2);
  assert_int_equal(pick(l, 5, p, 0.24), 2);
  assert_int_equal(pick(l, 5, p, 0.26), 3);
  lh_sample_result r = lh_sample(l, 5, &p, 0.5, scratch);
  assert_float_equal(r.logprob_model, log(0.75), 1e-6);
  lh_sample_params top = params(1, 0, 1, 0.5f);
  assert_int_equal(pick(l, 5, top, 0.01), 3);
  /* +inf counts as the largest float and takes all the mass */
  float h[] = {1.0f, INFINITY, 2.0f};
  assert_int_equal(pick(h, 3, p, 0.0), 1);
  assert_int_equal(pick(h, 3, p, 0.999), 1);
  /* nothing finite: uniform over all */
  float n[] = {-INFINITY, NAN, -INFINITY, -INFINITY};
  assert_int_equal(pick(n, 4, p, 0.3), 1);
  assert_int_equal(pick(n, 4, p, 0.8), 3);
  assert_int_equal(check(l, 5, p, 0.5, 0, 1e-4), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 5, p, 0.5, 3, 1e-4), LH_SAMPLE_CONSISTENT);
  /* a token of weight 0 (logit -inf or NaN) is never chosen, on any machine: INCONSISTENT
   * even where u sits on the boundary between its neighbours (0 0 -inf 0: 2/3) */
  float z[] = {0.0f, 0.0f, -INFINITY, 0.0f}, zn[] = {0.0f, 0.0f, NAN, 0.0f};
  float m[] = {-INFINITY, 1.0f, 2.0f};
  lh_sample_params k3 = params(1, 3, 1, 0), p9 = params(1, 0, 0.99f, 0),
                   mp = params(1, 0, 1, 0.01f);
  for (int i = -3; i <= 3; i++) {
    double u = 2.0 / 3 + i * 2e-5;
    assert_int_equal(check(z, 4, p, u, 2, 1e-4), LH_SAMPLE_INCONSISTENT);
    assert_int_equal(check(zn, 4, p, u, 2, 1e-4), LH_SAMPLE_INCONSISTENT);
    assert_int_equal(check(z, 4, k3, u, 2, 1e-4), LH_SAMPLE_INCONSISTENT);
    assert_int_equal(check(z, 4, p9, u, 2, 1e-4), LH_SAMPLE_INCONSISTENT);
    assert_int_equal(check(z, 4, mp, u, 2, 1e-4), LH_SAMPLE_INCONSISTENT);
    assert_int_not_equal(check(z, 4, p, u, pick(z, 4, p, u), 1e-4), LH_SAMPLE_INCONSISTENT);
  }
  assert_int_equal(check(m, 3, p, 0.0, 0, 1e-4), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(m, 3, p, 5e-5, 0, 1e-4), LH_SAMPLE_INCONSISTENT);
  /* a finite logit just below where exp gives 0 (708 below the maximum at T = 1) weighs 0 here
   * and about 1e-308 on a machine whose logit is an ulp (6e-5) higher; u = 0 then picks it
   * there and the next token here, so neither is decided; u = 0.5 never picks it */
  float f[] = {nextafterf(-708.0f, -INFINITY), 0.0f}, f2[] = {-708.0f, 0.0f};
  assert_int_equal(pick(f, 2, p, 0.0), 1);
  assert_int_equal(pick(f2, 2, p, 0.0), 0);
  assert_int_equal(check(f, 2, p, 0.0, 0, 1e-4), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(f, 2, p, 0.0, 1, 1e-4), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(f, 2, p, 0.5, 0, 1e-4), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(f, 2, p, 0.5, 1, 1e-4), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(f, 2, p, 0.0, 0, 1e-5), LH_SAMPLE_INCONSISTENT); /* 2 tol short */
  assert_int_equal(check(f, 2, p, 0.0, 1, 1e-5), LH_SAMPLE_CONSISTENT);
  /* the mirror case: a weight about 1e-308 here (logit -708) that is 0 on a machine whose logit
   * is an ulp lower; u = 0 picks it here and the next token there */
  assert_int_equal(check(f2, 2, p, 0.0, 0, 1e-4), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(f2, 2, p, 0.0, 1, 1e-4), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(f2, 2, p, 0.5, 1, 1e-4), LH_SAMPLE_CONSISTENT);
  float f3[] = {-707.99f, 0.0f}; /* 2 tol short: positive on every machine */
  assert_int_equal(check(f3, 2, p, 0.0, 0, 1e-4), LH_SAMPLE_CONSISTENT);
  /* the same at T = 0.05, where exp gives 0 at 35.4 below the maximum */
  lh_sample_params c5 = params(0.05f, 0, 1, 0);
  float g[] = {-35.399f, 0.0f, -1.0f}, gw[] = {-35.399f - 0.00099f, 0.00099f, -1.0f};
  assert_int_equal(pick(g, 3, c5, 0.0), 0);
  assert_true(within(g, gw, 3, 1e-3));
  assert_int_equal(pick(gw, 3, c5, 0.0), 1);
  assert_int_equal(check(g, 3, c5, 0.0, 0, 1e-3), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(g, 3, c5, 0.0, 1, 1e-3), LH_SAMPLE_BORDERLINE);
}

/* 2 tol / T large (here 100 to 2000): a weight 0 here may be e^-609 or even 1 on another
 * machine, and a ratio of weights moves by more than any double factor. */
static void test_check_cold(void **state) {
  /* (A) T = 5e-7, tol = 1e-4: the verifier picks 0, a machine with logits {-1e-4, -5e-5} picks
   * 1; (B) T = 1e-7: token 1 weighs 0 here and as much as token 0 there; (C) T = 1e-3, tol 0.5 */
  float a[] = {0.0f, -1.5e-4f}, aw[] = {-1e-4f, -5.00000097e-5f};
  float b[] = {0.0f, -1e-4f}, bw[] = {-0.5e-4f, -0.4e-4f};
  float c[] = {0.0f, -0.6f}, cw[] = {-0.5f, -0.2f};
  lh_sample_params pa = params(5e-7f, 0, 1, 0), pb = params(1e-7f, 0, 1, 0),
                   pc = params(1e-3f, 0, 1, 0);
  assert_true(within(a, aw, 2, 1e-4) && within(b, bw, 2, 1e-4) && within(c, cw, 2, 0.5));
  assert_int_equal(pick(a, 2, pa, 0.5), 0);
  assert_int_equal(pick(aw, 2, pa, 0.5), 1);
  assert_int_equal(pick(b, 2, pb, 0.5), 0);
  assert_int_equal(pick(bw, 2, pb, 0.5), 1);
  assert_int_equal(pick(c, 2, pc, 0.5), 0);
  assert_int_equal(pick(cw, 2, pc, 0.5), 1);
  for (int t = 0; t < 2; t++) {
    assert_int_equal(check(a, 2, pa, 0.5, t, 1e-4), LH_SAMPLE_BORDERLINE);
    assert_int_equal(check(b, 2, pb, 0.5, t, 1e-4), LH_SAMPLE_BORDERLINE);
    assert_int_equal(check(c, 2, pc, 0.5, t, 0.5), LH_SAMPLE_BORDERLINE);
  }
  /* what the logits alone decide: every other weight 0 on every machine, or the token's */
  float d[] = {0.0f, -3e-4f, -1.0f};
  lh_sample_params k1 = params(1e-7f, 1, 1, 0), pp = params(1e-7f, 0, 0.5f, 0.5f);
  assert_int_equal(check(d, 3, pb, 0.5, 0, 1e-4), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(d, 3, pb, 0.5, 1, 1e-4), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(d, 3, pp, 0.0, 0, 1e-4), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(b, 2, k1, 0.5, 1, 1e-4), LH_SAMPLE_BORDERLINE);
  float e[] = {0.0f, -2.5e-4f, -2.5e-4f}; /* token 2 dropped by top-k 1 everywhere, weight e^-500 */
  assert_int_equal(check(e, 3, k1, 0.5, 2, 1e-4), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(e, 3, pb, 0.5, 2, 1e-4), LH_SAMPLE_BORDERLINE);
  /* 2 tol / T = 100 at T = 1e-3, tol 0.05: token 0 weighs 0 here (709 T below) and e^-609 on a
   * machine with logits {-0.66, -0.049}, which picks it at u = 2^-890 */
  lh_sample_params pf = params(1e-3f, 0, 1, 0);
  float f[] = {-0.709f, 0.0f}, fw[] = {-0.66f, -0.049f};
  assert_int_equal(pick(f, 2, pf, 0x1p-890), 1);
  assert_true(within(f, fw, 2, 0.05));
  assert_int_equal(pick(fw, 2, pf, 0x1p-890), 0);
  assert_int_equal(check(f, 2, pf, 0x1p-890, 0, 0.05), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(f, 2, pf, 0x1p-890, 1, 0.05), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(f, 2, pf, 0x1p-400, 1, 0.05), LH_SAMPLE_CONSISTENT);
}

/* ---- distribution ---- */

static double chi_square(const long *count, const double *p, int n, long N) {
  double chi = 0;
  for (int i = 0; i < n; i++) {
    double e = p[i] * (double)N, d = (double)count[i] - e;
    chi += d * d / e;
  }
  return chi;
}

static void test_chi_square(void **state) {
  enum { N = 200000 };
  double w[] = {0.1, 0.2, 0.3, 0.25, 0.15};
  float l[5];
  logits_of(w, 5, l);
  long count[5] = {0};
  lh_sample_params p = lh_sample_defaults();
  for (long i = 0; i < N; i++)
    count[pick(l, 5, p, lh_sample_uniform(2024, (uint64_t)i, 17))]++;
  double chi = chi_square(count, w, 5, N);
  assert_true(chi < 18.47); /* 4 degrees of freedom, p = 0.001 */
  double flat[] = {0.2, 0.2, 0.2, 0.2, 0.2};
  assert_true(chi_square(count, flat, 5, N) > 1000); /* the statistic does detect a mismatch */
  /* top-k 3 over the same logits: {1, 2, 3} renormalised by 0.75 */
  memset(count, 0, sizeof count);
  lh_sample_params k3 = params(1, 3, 1, 0);
  for (long i = 0; i < N; i++)
    count[pick(l, 5, k3, lh_sample_uniform(2025, 0, (uint64_t)i))]++;
  assert_int_equal(count[0] + count[4], 0);
  double kept[] = {0.2 / 0.75, 0.3 / 0.75, 0.25 / 0.75};
  assert_true(chi_square(count + 1, kept, 3, N) < 13.82); /* 2 degrees of freedom, p = 0.001 */
}

/* ---- agreement with a plain full-sort reference ---- */

static const float *ref_l;
static int rank_cmp(const void *a, const void *b) {
  int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
  if (ref_l[i] != ref_l[j]) return ref_l[i] > ref_l[j] ? -1 : 1;
  return i < j ? -1 : 1;
}

/* The canonical definition written plainly: full sort, keep flags, walk by id. */
static int32_t ref_sample(const float *l, int V, lh_sample_params p, double u, double *logprob) {
  static double w[VMAX];
  static int32_t order[VMAX];
  static unsigned char keep[VMAX];
  int32_t am = 0;
  for (int i = 1; i < V; i++)
    if (l[i] > l[am]) am = i;
  double lmax = l[am], T = p.temperature, S = 0;
  if (T == 0) return am;
  for (int i = 0; i < V; i++)
    S += w[i] = exp(((double)l[i] - lmax) / T);
  for (int i = 0; i < V; i++)
    order[i] = i, keep[i] = 1;
  ref_l = l;
  qsort(order, (size_t)V, sizeof order[0], rank_cmp);
  if (p.top_k > 0)
    for (int r = p.top_k; r < V; r++)
      keep[order[r]] = 0;
  if (p.top_p < 1) {
    double cum = 0;
    int crossed = 0;
    for (int r = 0; r < V; r++) {
      int32_t i = order[r];
      if (!keep[i]) continue;
      if (crossed)
        keep[i] = 0;
      else
        crossed = (cum += w[i]) >= (double)p.top_p * S;
    }
  }
  if (p.min_p > 0)
    for (int i = 0; i < V; i++)
      keep[i] &= w[i] >= (double)p.min_p;
  double total = 0, c = 0;
  for (int i = 0; i < V; i++)
    if (keep[i]) total += w[i];
  int32_t tok = -1, last = -1;
  for (int i = 0; i < V && tok < 0; i++) {
    if (!keep[i] || w[i] == 0) continue;
    c += w[i];
    last = i;
    if (c > u * total) tok = i;
  }
  if (tok < 0) tok = last; /* rounding left nothing chosen */
  assert_true(tok >= 0);
  *logprob = ((double)l[tok] - lmax) / T - log(total);
  return tok;
}

/* Logits shaped like a language model's: a few large values, a long tail, optional ties and
 * -inf (masked tokens). */
static void random_logits(float *l, int V, int style) {
  double scale = 1.0 + 4.0 * rnd();
  for (int i = 0; i < V; i++) {
    double x = scale * rnd_normal();
    if (style == 1) x = floor(x * 2) / 2; /* many ties */
    if (style == 2 && rnd() < 0.3) x = -INFINITY;
    if (style == 3 && rnd() < 0.002) x += 15; /* a few dominant tokens */
    l[i] = (float)x;
  }
  if (style == 2 && l[V - 1] == -INFINITY) l[V - 1] = 0.0f; /* something finite */
}

static lh_sample_params random_params(int V) {
  lh_sample_params p = lh_sample_defaults();
  double r = rnd();
  p.temperature = r < 0.1 ? 0.0f : (float)(0.2 + 1.6 * rnd());
  if (rnd() < 0.5) p.top_k = 1 + (int)(rnd() * (rnd() < 0.5 ? 60 : V));
  if (rnd() < 0.5) p.top_p = (float)(0.05 + 0.95 * rnd());
  if (rnd() < 0.4) p.min_p = (float)(0.3 * rnd());
  return p;
}

static void test_matches_reference(void **state) {
  static float l[VMAX];
  int sizes[] = {1, 2, 7, 64, 1000, 5000, VMAX};
  int n = 0;
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    int V = sizes[si];
    int cases = V >= 5000 ? 40 : 300;
    for (int c = 0; c < cases; c++, n++) {
      random_logits(l, V, c % 4);
      lh_sample_params p = random_params(V);
      double u = rnd(), ref_lp = 0;
      int32_t want = ref_sample(l, V, p, u, &ref_lp);
      lh_sample_result r = lh_sample(l, V, &p, u, scratch);
      if (r.token != want)
        fail_msg("V=%d case %d (T=%g k=%d p=%g min_p=%g u=%.17g): token %d, reference %d", V, c,
                 (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p, u, r.token,
                 want);
      if (p.temperature > 0) assert_float_equal(r.logprob, ref_lp, 1e-5 * (1 + fabs(ref_lp)));
      assert_int_not_equal(check(l, V, p, u, r.token, 1e-6), LH_SAMPLE_INCONSISTENT);
    }
  }
  assert_true(n > 1000);
}

static void test_scratch(void **state) {
  assert_null(lh_sample_scratch_create(0));
  assert_null(lh_sample_scratch_create(-3));
  lh_sample_scratch_free(NULL);
  /* a fresh, exactly sized scratch gives what the shared, used one gives */
  float l[8];
  logits_of(w8, 8, l);
  lh_sample_scratch *own = lh_sample_scratch_create(8);
  lh_sample_params ps[] = {params(1, 0, 1, 0), params(0.7f, 3, 1, 0), params(1.3f, 0, 0.8f, 0),
                           params(1, 5, 0.9f, 0.1f)};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
    for (double u = 0.01; u < 1; u += 0.07) {
      lh_sample_result a = lh_sample(l, 8, &ps[i], u, own);
      lh_sample_result b = lh_sample(l, 8, &ps[i], u, scratch);
      assert_int_equal(a.token, b.token);
      assert_true(a.logprob == b.logprob && a.logprob_model == b.logprob_model);
    }
  lh_sample_scratch_free(own);
}

/* ---- the checker ---- */

static void test_check_honest(void **state) {
  static float l[VMAX];
  int borderline = 0, total = 0;
  for (int c = 0; c < 3000; c++) {
    int V = c < 2500 ? 2 + (int)(rnd() * 60) : 2000;
    random_logits(l, V, c % 4);
    lh_sample_params p = random_params(V);
    double u = lh_sample_uniform(77, (uint64_t)c, 5);
    int32_t tok = lh_sample(l, V, &p, u, scratch).token;
    lh_sample_verdict v = check(l, V, p, u, tok, 1e-4);
    if (v == LH_SAMPLE_INCONSISTENT)
      fail_msg("case %d V=%d: honest token %d judged INCONSISTENT", c, V, tok);
    borderline += v == LH_SAMPLE_BORDERLINE;
    total++;
    /* no other token may be CONSISTENT (greedy ties aside, all are INCONSISTENT or BORDERLINE) */
    for (int j = 0; j < V && j < 64; j++)
      if (j != tok) assert_int_not_equal(check(l, V, p, u, j, 1e-4), LH_SAMPLE_CONSISTENT);
  }
  /* style 1 draws many exact ties, so greedy ties and top-k boundary ties are common there */
  assert_true(borderline < total / 20);
}

static void test_check_adversarial(void **state) {
  double w[] = {1, 2, 3, 4};
  float l[4];
  logits_of(w, 4, l);
  lh_sample_params p = lh_sample_defaults();
  double tol = 1e-4;
  /* u = 0.05 picks 0; the most likely token 3 is a forgery */
  assert_int_equal(check(l, 4, p, 0.05, 0, tol), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l, 4, p, 0.05, 3, tol), LH_SAMPLE_INCONSISTENT);
  /* u = 0.7 picks the most likely (3); the second most likely (2) is a forgery */
  assert_int_equal(check(l, 4, p, 0.7, 3, tol), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l, 4, p, 0.7, 2, tol), LH_SAMPLE_INCONSISTENT);
  /* Logits within tol = 1e-4 of these move a boundary c of the CDF by at most
   * c (1 - c) (exp(2 tol / T) - 1), about 2 tol c (1 - c) / T: the weight before it one way, the
   * weight after it the other. The boundary at 0.3 between 1 and 2 moves within 4.2e-5 */
  assert_int_equal(check(l, 4, p, 0.3 + 3e-5, 2, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 4, p, 0.3 + 3e-5, 1, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 4, p, 0.3 - 3e-5, 2, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 4, p, 0.3 + 3e-5, 3, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 4, p, 0.3 + 4.1e-5, 2, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 4, p, 0.3 + 4.3e-5, 2, tol), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l, 4, p, 0.3 + 4.3e-5, 1, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 4, p, 0.3 - 4.1e-5, 2, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 4, p, 0.3 - 4.3e-5, 2, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 4, p, 0.3 - 4.3e-5, 1, tol), LH_SAMPLE_CONSISTENT);
  /* the boundary at 0.6 between 2 and 3 moves within 4.8e-5 */
  assert_int_equal(check(l, 4, p, 0.6 + 4.7e-5, 2, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 4, p, 0.6 + 4.9e-5, 2, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 4, p, 0.6 - 4.7e-5, 3, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 4, p, 0.6 - 4.9e-5, 3, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 4, p, 0.3 + 3e-4, 2, tol), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l, 4, p, 0.3 + 3e-4, 1, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 4, p, 0.3 - 1.5e-4, 2, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 4, p, 0.6 + 1.5e-4, 2, tol), LH_SAMPLE_INCONSISTENT);
  /* the band scales with tol */
  assert_int_equal(check(l, 4, p, 0.3 + 4.3e-5, 2, 1.1e-4), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 4, p, 0.3 + 4.3e-6, 2, 1e-5), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l, 4, p, 0.3 + 4.1e-6, 2, 1e-5), LH_SAMPLE_BORDERLINE);
  /* the ends of the CDF are not boundaries */
  assert_int_equal(check(l, 4, p, 0.0, 0, tol), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l, 4, p, 1.0 - 1e-9, 3, tol), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l, 4, p, nextafter(1.0, 0.0), 3, tol), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l, 4, p, nextafter(1.0, 0.0), 3, 0.0), LH_SAMPLE_CONSISTENT);
  /* at temperature 0.5 the same logits move the weights twice as much: token 1 holds
   * [1/30, 5/30), and 5/30 moves within 4 tol (1/6) (5/6) = 5.56e-5 */
  lh_sample_params h = params(0.5f, 0, 1, 0);
  assert_int_equal(check(l, 4, h, 0.1, 1, tol), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l, 4, h, 0.2, 1, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 4, h, 5.0 / 30 - 1e-5, 1, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 4, h, 5.0 / 30 - 5.4e-5, 1, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 4, h, 5.0 / 30 - 5.7e-5, 1, tol), LH_SAMPLE_CONSISTENT);
}

static void test_check_filtered_tokens(void **state) {
  float l[8];
  logits_of(w8, 8, l);
  double tol = 1e-4;
  lh_sample_params k3 = params(1, 3, 1, 0), p5 = params(1, 0, 0.5f, 0), m5 = params(1, 0, 1, 0.5f);
  for (double u = 0; u < 1; u += 0.01) {
    /* top-k 3 drops 5 (weight 3, well below the third best 5) whatever u is */
    assert_int_equal(check(l, 8, k3, u, 5, tol), LH_SAMPLE_INCONSISTENT);
    assert_int_equal(check(l, 8, k3, u, 1, tol), LH_SAMPLE_INCONSISTENT);
    /* top-p 0.5 stops at .5333 (2 and 4): 0 (the next) is dropped */
    assert_int_equal(check(l, 8, p5, u, 0, tol), LH_SAMPLE_INCONSISTENT);
    /* min-p 0.5 needs weight >= 4: 5 (weight 3) is dropped */
    assert_int_equal(check(l, 8, m5, u, 5, tol), LH_SAMPLE_INCONSISTENT);
  }
  /* well beyond the interval of 2 under top-k 3, [5/21, 13/21) */
  assert_int_equal(check(l, 8, k3, 5.0 / 21 - 1.5e-4, 2, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 8, k3, 13.0 / 21 + 1.5e-4, 2, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 8, k3, 5.0 / 21 + 1.5e-4, 2, tol), LH_SAMPLE_CONSISTENT);
  /* 13/21 moves within 2 tol (13/21) (8/21) = 4.72e-5 */
  assert_int_equal(check(l, 8, k3, 13.0 / 21 - 4.6e-5, 2, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 8, k3, 13.0 / 21 - 4.8e-5, 2, tol), LH_SAMPLE_CONSISTENT);
  /* the same tokens are fine without the filter when u selects them */
  lh_sample_params none = lh_sample_defaults();
  assert_int_equal(check(l, 8, none, 0.85, 5, tol), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l, 8, none, 0.1, 0, tol), LH_SAMPLE_CONSISTENT);
}

static void test_check_near_thresholds(void **state) {
  float l[8];
  logits_of(w8, 8, l);
  double tol = 1e-4;
  /* top-k 5: tokens 3 and 7 tie (weight 2) at the boundary and 3 is kept by id. On a machine
   * whose logit 7 is one ulp higher, 7 is kept instead: K = {0, 2, 4, 5, 7}, total 26, 4 holds
   * [13/26, 21/26) and 7 [24/26, 1). So 7 is BORDERLINE where u would pick it, and 3 (where
   * kept, [13/26, 15/26)) is never CONSISTENT: u = 0.52 picks 3 here and 4 there */
  lh_sample_params k5 = params(1, 5, 1, 0);
  float l7[8];
  memcpy(l7, l, sizeof l7);
  l7[7] = nextafterf(l[7], 1.0f);
  assert_int_equal(pick(l, 8, k5, 0.52), 3);
  assert_int_equal(pick(l7, 8, k5, 0.52), 4);
  assert_int_equal(check(l, 8, k5, 0.95, 7, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 8, k5, 0.30, 7, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l, 8, k5, 0.52, 3, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 8, k5, 0.52, 4, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 8, k5, 0.55, 3, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l, 8, k5, 0.40, 3, tol), LH_SAMPLE_INCONSISTENT);

  /* top-p 0.8 over p = .5 .3 .2: the cumulative .8 meets the threshold, and logits within tol
   * move it either way, so 2 may or may not be kept: 0 holds [0, .5) or [0, .625) */
  double w3[] = {5, 3, 2};
  float l3[3];
  logits_of(w3, 3, l3);
  lh_sample_params p8 = params(1, 0, 0.8f, 0);
  assert_int_equal(check(l3, 3, p8, 0.3, 0, tol), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l3, 3, p8, 0.55, 0, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l3, 3, p8, 0.55, 1, tol), LH_SAMPLE_BORDERLINE);
  assert_int_not_equal(check(l3, 3, p8, 0.9, 2, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l3, 3, p8, 0.3, 2, tol), LH_SAMPLE_INCONSISTENT);
  /* with top-p 0.9 the boundary is far: 2 is kept for sure and 0 holds [0, .5) */
  lh_sample_params p9 = params(1, 0, 0.9f, 0);
  assert_int_equal(check(l3, 3, p9, 0.55, 1, tol), LH_SAMPLE_CONSISTENT);
  assert_int_equal(check(l3, 3, p9, 0.55, 0, tol), LH_SAMPLE_INCONSISTENT);

  /* top-k 3 then top-p: 1 is kept by top-k but may drop out (its logit is 1.9e-4 above 3's),
   * and 4 dropped but may come in (1e-4 below 2's). Wherever 4 survives top-k, 1 does too: it
   * ranks 2.5e-4 above 4 on every machine. The top-p sum before 4 then holds 0 and 1, about
   * e^2 + 1 out of S = e^2 + 4, past top_p = (e^2 + 0.5) / S: 4 is dropped on every machine */
  float c5[] = {2.0f, 1.5e-4f, 0.0f, -0.4e-4f, -1e-4f};
  double S5 = 0;
  for (int i = 0; i < 5; i++)
    S5 += exp(c5[i]);
  lh_sample_params kp = params(1, 3, (float)((exp(2.0) + 0.5) / S5), 0);
  assert_int_equal(pick(c5, 5, kp, 0.95), 1);
  assert_int_equal(check(c5, 5, kp, 0.95, 4, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_not_equal(check(c5, 5, kp, 0.95, 1, tol), LH_SAMPLE_INCONSISTENT);

  /* min-p 0.5 over weights 8 4 2 1: token 1 sits on the bound */
  double w4[] = {8, 4, 2, 1};
  float l4[4];
  logits_of(w4, 4, l4);
  lh_sample_params m5 = params(1, 0, 1, 0.5f);
  assert_int_not_equal(check(l4, 4, m5, 0.8, 1, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l4, 4, m5, 0.5, 0, tol), LH_SAMPLE_CONSISTENT); /* [0, 2/3) or all */
  assert_int_equal(check(l4, 4, m5, 0.8, 0, tol), LH_SAMPLE_BORDERLINE);
  assert_int_equal(check(l4, 4, m5, 0.5, 1, tol), LH_SAMPLE_INCONSISTENT);
  assert_int_equal(check(l4, 4, m5, 0.95, 2, tol), LH_SAMPLE_INCONSISTENT); /* far below */
}

/* l + d as a float no further than tol from l (-inf and NaN stay: noise does not move them) */
static float nudge(float l, double d, double tol) {
  if (!isfinite(l)) return l;
  float x = (float)((double)l + d);
  while (fabs((double)x - (double)l) > tol)
    x = nextafterf(x, l);
  return x;
}

/* Another machine's logits: each within tol of l, in one of the shapes that move a choice the
 * most (every weight below a pivot id one way and the rest the other, which slides the CDF;
 * every logit above a pivot logit one way, which slides the filter thresholds) or at random. */
static void perturb(const float *l, int V, double tol, int shape, float *out) {
  int32_t m = (int32_t)(rnd() * V);
  float pivot = l[(int32_t)(rnd() * V)];
  double sign = rnd() < 0.5 ? -tol : tol;
  for (int i = 0; i < V; i++) {
    double d = l[i] >= pivot ? sign : -sign; /* shape 3 */
    if (shape % 4 == 0) d = (2 * rnd() - 1) * tol;
    if (shape % 4 == 1) d = rnd() < 0.5 ? -tol : tol;
    if (shape % 4 == 2) d = i < m ? sign : -sign;
    out[i] = nudge(l[i], d, tol);
  }
}

/* The noise model, both ways. (a) A worker whose logits differ from the verifier's by at most
 * tol each, and that samples honestly, is never INCONSISTENT, thresholds placed exactly on a
 * token included, down to T = 0.05 where tol moves the weights the most. (b) A CONSISTENT
 * token is the verifier's own choice and the choice of every such worker. Forged tokens are
 * still INCONSISTENT. */
static void test_check_perturbed(void **state) {
  static float l[VMAX], lp[VMAX];
  static double w[VMAX];
  static const double tols[] = {1e-4, 1e-4, 1e-3, 1e-6, 0.0};
  int inconsistent_forged = 0, forged = 0, consistent = 0, n = 0, moved = 0;
  for (int c = 0; c < 6000; c++) {
    int V = c % 10 == 9 ? 3000 : 2 + (int)(rnd() * 40);
    double tol = tols[c % 5];
    random_logits(l, V, c % 4);
    lh_sample_params p = random_params(V);
    if (p.temperature == 0 && c % 3) p.temperature = (float)(0.05 + 0.25 * rnd());
    /* place min-p or top-p exactly on a token's threshold in half of the cases */
    if (c % 2 && p.temperature > 0) {
      int32_t am = 0;
      for (int i = 1; i < V; i++)
        if (l[i] > l[am]) am = i;
      for (int i = 0; i < V; i++)
        w[i] = exp(((double)l[i] - l[am]) / p.temperature);
      int32_t j = (int32_t)(rnd() * V);
      if (p.min_p > 0 && w[j] < 1 && w[j] > 0) p.min_p = (float)w[j];
      if (p.top_p < 1 && p.top_k == 0) {
        double S = 0, above = 0;
        for (int i = 0; i < V; i++)
          S += w[i];
        for (int i = 0; i < V; i++)
          if (l[i] > l[j] || (l[i] == l[j] && i <= j)) above += w[i];
        if (above / S < 1 && above > 0) p.top_p = (float)(above / S);
      }
    }
    double u = lh_sample_uniform(31337, (uint64_t)c, 0);
    int32_t tok = lh_sample(l, V, &p, u, scratch).token;
    lh_sample_verdict v = check(l, V, p, u, tok, tol);
    assert_int_not_equal(v, LH_SAMPLE_INCONSISTENT);
    consistent += v == LH_SAMPLE_CONSISTENT;
    n++;
    for (int shape = 0; shape < 8; shape++) {
      perturb(l, V, tol, shape, lp);
      int32_t t2 = lh_sample(lp, V, &p, u, scratch).token;
      moved += t2 != tok;
      /* the worker on lp, checked by the verifier on l, and the other way round */
      lh_sample_verdict a = check(l, V, p, u, t2, tol), b = check(lp, V, p, u, tok, tol);
      if (a == LH_SAMPLE_INCONSISTENT || b == LH_SAMPLE_INCONSISTENT)
        fail_msg("case %d V=%d shape %d tol %g (T=%g k=%d p=%.9g min_p=%.9g u=%.17g): honest "
                 "tokens %d (verifier) and %d (worker) judged %d and %d",
                 c, V, shape, tol, (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p,
                 u, tok, t2, b, a);
      if (v == LH_SAMPLE_CONSISTENT && t2 != tok)
        fail_msg("case %d V=%d shape %d tol %g: token %d CONSISTENT, but a worker within tol "
                 "picks %d",
                 c, V, shape, tol, tok, t2);
      if (t2 != tok) assert_int_not_equal(a, LH_SAMPLE_CONSISTENT);
    }
    /* a forgery: the most likely token other than the one chosen */
    int32_t f = tok == 0 ? 1 : 0;
    for (int i = 0; i < V; i++)
      if (i != tok && l[i] > l[f]) f = i;
    if (f < V) {
      forged++;
      inconsistent_forged += check(l, V, p, u, f, tol) == LH_SAMPLE_INCONSISTENT;
    }
  }
  assert_true(consistent > n * 9 / 10);
  assert_true(moved > 0); /* the perturbations do move some choices */
  assert_true(forged > 2000);
  assert_true(inconsistent_forged > forged * 95 / 100);
}

/* Logits within tol of l that make lh_sample pick j, if the shape that slides j's interval
 * finds them: the logits before j moved by s, j's by +tol, those after by -s. At s = -tol the
 * interval starts lowest, at s = tol it ends highest, and it slides monotonically in between,
 * so bisection on s meets every u the interval can cover. */
static bool realised(const float *l, int V, lh_sample_params p, double u, int32_t j, double tol,
                     float *lp) {
  double lo = -tol, hi = tol;
  for (int it = 0; it < 80; it++) {
    double sft = it == 0 ? -tol : it == 1 ? tol : (lo + hi) / 2;
    for (int i = 0; i < V; i++)
      lp[i] = nudge(l[i], i < j ? sft : i == j ? tol : -sft, tol);
    int32_t t = pick(lp, V, p, u);
    if (t == j) return true;
    if (it == 0 && t < j) return false; /* j's lowest start lies above u */
    if (it == 1 && t > j) return false; /* its highest end lies at or below u */
    if (it >= 2) *(t > j ? &lo : &hi) = sft;
  }
  return false;
}

/* BORDERLINE is no wider than the noise model makes it: without filters, every token the check
 * does not call INCONSISTENT is one that lh_sample picks on some logits within tol of the
 * verifier's, and the nearest ones it calls INCONSISTENT are not. (Tokens of p well above the
 * float spacing of the logits, so that such logits exist as floats.) */
static void test_check_tight(void **state) {
  static float l[2000], lp[2000];
  int others = 0;
  for (int c = 0; c < 40; c++) {
    int V = c % 2 ? 2000 : 300;
    for (int i = 0; i < V; i++)
      l[i] = (float)(3 * rnd());
    double tol = c % 4 < 2 ? 1e-3 : 1e-4;
    lh_sample_params p = params((float)(0.5 + rnd()), 0, 1, 0);
    /* u near the boundary after a random token k, within about the band of the noise */
    double S = 0, ck = 0, T = p.temperature;
    int32_t k = (int32_t)(rnd() * (V - 1));
    for (int i = 0; i < V; i++) {
      S += exp(l[i] / T);
      ck += i <= k ? exp(l[i] / T) : 0;
    }
    ck /= S;
    double u = ck + (2 * rnd() - 1) * 3 * tol / T * ck * (1 - ck);
    int32_t tok = pick(l, V, p, u);
    assert_true(realised(l, V, p, u, tok, tol, lp));
    for (int dir = -1; dir <= 1; dir += 2)
      for (int32_t j = tok + dir; j >= 0 && j < V; j += dir) {
        lh_sample_verdict v = check(l, V, p, u, j, tol);
        if (v == LH_SAMPLE_INCONSISTENT) {
          assert_false(realised(l, V, p, u, j, tol, lp)); /* and the first one out is not */
          break;
        }
        if (!realised(l, V, p, u, j, tol, lp))
          fail_msg("case %d V=%d tol %g T=%g u=%.17g: token %d judged %d, but no logits within "
                   "tol pick it (honest %d)",
                   c, V, tol, (double)p.temperature, u, j, v, tok);
        others++;
      }
  }
  printf("test_check_tight: %d tokens besides the honest ones, each picked within tol\n", others);
  assert_true(others > 20); /* the bands did hold other tokens */
}

/* The reviewer's tail: a vocabulary of bulk logits N(0, 2.5^2) and 20 tokens near the top, no
 * filters, T = 1. At a position where the honest token is BORDERLINE, counts the other tokens
 * around it that are not INCONSISTENT. */
static void tail_counts(const float *l, int V, double tol, int N, int *borderline, double *mean,
                        int *max) {
  lh_sample_params p = lh_sample_defaults();
  long others = 0;
  *borderline = *max = 0;
  for (int c = 0; c < N; c++) {
    double u = lh_sample_uniform(5, 0, (uint64_t)c);
    int32_t t = pick(l, V, p, u);
    lh_sample_verdict v = check(l, V, p, u, t, tol);
    assert_int_not_equal(v, LH_SAMPLE_INCONSISTENT);
    if (v != LH_SAMPLE_BORDERLINE) continue;
    ++*borderline;
    int f = 0;
    for (int32_t j = t - 1; j >= 0 && check(l, V, p, u, j, tol) != LH_SAMPLE_INCONSISTENT; j--)
      f++;
    for (int32_t j = t + 1; j < V && check(l, V, p, u, j, tol) != LH_SAMPLE_INCONSISTENT; j++)
      f++;
    others += f;
    *max = f > *max ? f : *max;
  }
  *mean = *borderline ? (double)others / *borderline : 0;
}

/* How selective BORDERLINE is on a language model's shape. The band of a boundary c is about
 * 2 tol c (1 - c) / T wide on each side (test_check_tight: no narrower is sound), so the tail
 * tokens inside it, each of p ~ 1e-5 here, are BORDERLINE with the honest one: a handful at
 * tol = 1e-6 and 1e-5, more at 1e-4. */
static void test_check_tail(void **state) {
  static float l[VMAX];
  int V = VMAX, N = 200;
  for (int i = 0; i < V; i++)
    l[i] = (float)(2.5 * rnd_normal());
  for (int j = 0; j < 20; j++)
    l[(int)(rnd() * V)] = (float)(14 - 0.7 * j);
  static const double tols[] = {1e-6, 1e-5, 1e-4};
  int bl[3], mx[3];
  double mean[3];
  for (int k = 0; k < 3; k++) {
    tail_counts(l, V, tols[k], N, &bl[k], &mean[k], &mx[k]);
    printf("test_check_tail: V=%d tol %g: honest BORDERLINE %d/%d; other tokens not INCONSISTENT "
           "there: mean %.1f, max %d\n",
           V, tols[k], bl[k], N, mean[k], mx[k]);
  }
  assert_true(bl[0] <= N / 20 && mean[0] <= 4 && mx[0] <= 6);
  assert_true(bl[1] <= N / 10 && mean[1] <= 10 && mx[1] <= 30);
  assert_true(bl[2] <= N / 5 && mean[2] <= 30 && mx[2] <= 80);
}

/* ---- the honest BORDERLINE chance ---- */

static double chance(const float *l, int V, lh_sample_params p, double tol) {
  double c = -1.0;
  int32_t t = pick(l, V, p, 0.5); /* any token that is not INCONSISTENT */
  assert_int_not_equal(lh_sample_check_chance(l, V, &p, 0.5, t, tol, scratch, &c),
                       LH_SAMPLE_INCONSISTENT);
  return c;
}

/* V equal logits at T = 1 and no filter: token k has B = k before it and A = V - 1 - k after,
 * weight 1, so (docs/ALGORITHMS.md, "The check") lo_max = k r / (k r + V - k) and
 * hi_min = (k + 1) / (k + 1 + (V - 1 - k) r), r = exp(2 tol). Its pick interval is
 * [k / V, (k + 1) / V), CONSISTENT inside [lo_max, hi_min), and the chance is 1 minus the sum of
 * those parts. Where the bands do not meet, that is the sum over the V - 1 inner boundaries
 * c = k / V of the band on either side, k r / (k r + V - k) - k / (k + (V - k) r), about
 * 4 tol c (1 - c) each, so about 4 tol (V^2 - 1) / (6 V) in all. */
static double uniform_chance(int V, double tol) {
  double r = exp(2.0 * tol), mass = 0.0;
  for (int k = 0; k < V; k++) {
    double lo = k ? k * r / (k * r + V - k) : 0.0;
    double hi = k < V - 1 ? (k + 1) / (k + 1 + (V - 1 - k) * r) : 1.0;
    lo = fmax(lo, (double)k / V);
    hi = fmin(hi, (double)(k + 1) / V);
    mass += hi > lo ? hi - lo : 0.0;
  }
  return 1.0 - mass;
}

static void test_chance_uniform(void **state) {
  (void)state;
  static float l[4096];
  lh_sample_params p = lh_sample_defaults();
  /* V = 64, tol 1e-3: bands of about 2e-3 c (1 - c) a side against intervals of 1/64 */
  for (int i = 0; i < 64; i++)
    l[i] = 0.0f;
  double c = chance(l, 64, p, 1e-3), sum = 0.0, r = exp(2e-3);
  for (int k = 1; k < 64; k++)
    sum += k * r / (k * r + 64 - k) - k / (k + (64 - k) * r);
  printf("test_chance_uniform: V 64: chance %.9f, sum over boundaries %.9f, first order %.9f\n", c,
         sum, 4e-3 * (64.0 * 64 - 1) / (6 * 64));
  assert_true(fabs(c - sum) < 1e-9);
  assert_true(fabs(sum - uniform_chance(64, 1e-3)) < 1e-12);
  assert_true(fabs(c - 4e-3 * (64.0 * 64 - 1) / (6 * 64)) < 1e-4); /* 0.0427 */
  /* V = 4096: a band (about 4e-3 c (1 - c) wide) covers the whole interval (1/4096) unless
   * c (1 - c) < 1 / (2 tol 2 V) = 0.061; in the continuum, the CONSISTENT share is
   * 2 (c* - 2 tol V c*^2 + 4/3 tol V c*^3) with c* (1 - c*) = 0.061, c* = 0.0653: the chance is
   * 0.9362 */
  for (int i = 0; i < 4096; i++)
    l[i] = 0.0f;
  c = chance(l, 4096, p, 1e-3);
  double a = 1.0 / (4e-3 * 4096), cs = (1.0 - sqrt(1.0 - 4.0 * a)) / 2.0, dv = 2e-3 * 4096;
  double cont = 1.0 - 2.0 * (cs - dv * cs * cs + 2.0 / 3.0 * dv * cs * cs * cs);
  printf("test_chance_uniform: V 4096: chance %.10f, sum %.10f, continuum %.6f\n", c,
         uniform_chance(4096, 1e-3), cont);
  /* the check's rounding allowance widens each of the 4096 bands by about 5e-12 */
  assert_true(fabs(c - uniform_chance(4096, 1e-3)) < 1e-7);
  assert_true(fabs(c - 0.9362) < 1e-3 && fabs(c - cont) < 1e-3);
  /* tol 0: CONSISTENT but within the rounding allowance of a boundary */
  assert_true(chance(l, 4096, p, 0.0) < 1e-7);
}

/* Greedy and cold sampling: the argmax is CONSISTENT at every u or at none. */
static void test_chance_greedy_cold(void **state) {
  (void)state;
  float l[4] = {0.0f, 0.5f, 0.5f - 3e-3f, -1.0f};
  assert_true(chance(l, 4, params(0, 0, 1, 0), 1e-3) == 0.0); /* gap 3e-3 > 2 tol */
  l[2] = 0.5f - 1.5e-3f;
  assert_true(chance(l, 4, params(0, 0, 1, 0), 1e-3) == 1.0); /* gap 1.5e-3 < 2 tol */
  float c2[2] = {0.0f, -1.0f};                                /* T 1e-6: 2 tol / T = 2000 */
  assert_true(chance(c2, 2, params(1e-6f, 0, 1, 0), 1e-3) == 0.0);
  c2[1] = -1e-3f;
  assert_true(chance(c2, 2, params(1e-6f, 0, 1, 0), 1e-3) == 1.0);
  /* every token of logits with near ties: the chance is whether the argmax (found here) is
   * CONSISTENT, 1 for an INCONSISTENT token (not computed) */
  uint32_t x = 99;
  const lh_sample_params ps[] = {params(0, 0, 1, 0), params(1e-6f, 0, 1, 0),
                                 params(1e-6f, 3, 1, 0)};
  for (int trial = 0; trial < 600; trial++) {
    float z[6];
    int am = 0;
    for (int i = 0; i < 6; i++) {
      x = x * 1103515245u + 12345u;
      z[i] = (float)((x >> 16) % 6) * 1e-3f; /* steps of 1e-3: gaps below, at and above 2 tol */
      if (z[i] > z[am]) am = i;
    }
    const lh_sample_params *p = &ps[trial % 3];
    double want = lh_sample_check(z, 6, p, 0.5, am, 1e-3, scratch) == LH_SAMPLE_CONSISTENT;
    for (int t = 0; t < 6; t++) {
      double c = -1.0;
      lh_sample_verdict v = lh_sample_check_chance(z, 6, p, 0.5, t, 1e-3, scratch, &c);
      assert_true(c == (v == LH_SAMPLE_INCONSISTENT || !want ? 1.0 : 0.0));
    }
  }
}

/* An honest machine's token is BORDERLINE exactly where the verifier's own pick is not
 * CONSISTENT (a machine differs from the verifier only there), so over u the frequency of its
 * BORDERLINE tokens is the chance: checked draw by draw (the two events coincide) and in
 * frequency (within 5 standard deviations), for a worker whose logits are moved by up to tol,
 * with and without filters. */
static void test_chance_frequency(void **state) {
  (void)state;
  enum { V = 2000, N = 3000 }; /* 31 blocks of 64 and a short one */
  static float l[V], w[V];
  double tol = 1e-3;
  const lh_sample_params ps[] = {params(1, 0, 1, 0), params(0.5f, 0, 1, 0), params(1, 0, 1, 0.01f),
                                 params(1, 0, 0.9f, 0), params(1, 50, 0.95f, 0)};
  for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
    lh_sample_params p = ps[k];
    for (int i = 0; i < V; i++)
      l[i] = (float)(2.0 * rnd_normal());
    perturb(l, V, tol, (int)k, w);
    assert_true(within(l, w, V, tol));
    double c = -1.0;
    int borderline = 0;
    for (int n = 0; n < N; n++) {
      double u = lh_sample_uniform(11, k, (uint64_t)n), cn;
      int32_t t = pick(w, V, p, u), own = pick(l, V, p, u);
      lh_sample_verdict v = lh_sample_check_chance(l, V, &p, u, t, tol, scratch, &cn);
      assert_int_not_equal(v, LH_SAMPLE_INCONSISTENT);
      assert_true(c < 0.0 || cn == c); /* a property of the position, not of u or the token */
      c = cn;
      bool not_consistent = check(l, V, p, u, own, tol) != LH_SAMPLE_CONSISTENT;
      assert_int_equal(v == LH_SAMPLE_BORDERLINE, not_consistent);
      borderline += v == LH_SAMPLE_BORDERLINE;
    }
    double f = (double)borderline / N, sd = sqrt(c * (1.0 - c) / N);
    printf("test_chance_frequency: T %g top-k %d top-p %g min-p %g: chance %.4f, frequency "
           "%.4f (sd %.4f)\n",
           (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p, c, f, sd);
    assert_true(fabs(f - c) <= 5.0 * sd + 1e-9);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_params_validate),
      cmocka_unit_test(test_uniform_from_philox),
      cmocka_unit_test(test_uniform_depends_only_on_its_key),
      cmocka_unit_test(test_uniform_out_of_range),
      cmocka_unit_test(test_greedy),
      cmocka_unit_test(test_temperature_one),
      cmocka_unit_test(test_temperature_scaling),
      cmocka_unit_test(test_top_k),
      cmocka_unit_test(test_top_p),
      cmocka_unit_test(test_top_k_then_top_p_uses_original_p),
      cmocka_unit_test(test_min_p),
      cmocka_unit_test(test_filter_combinations),
      cmocka_unit_test(test_non_finite_logits),
      cmocka_unit_test(test_check_cold),
      cmocka_unit_test(test_chi_square),
      cmocka_unit_test(test_matches_reference),
      cmocka_unit_test(test_scratch),
      cmocka_unit_test(test_check_honest),
      cmocka_unit_test(test_check_adversarial),
      cmocka_unit_test(test_check_filtered_tokens),
      cmocka_unit_test(test_check_near_thresholds),
      cmocka_unit_test(test_check_perturbed),
      cmocka_unit_test(test_check_tight),
      cmocka_unit_test(test_check_tail),
      cmocka_unit_test(test_chance_uniform),
      cmocka_unit_test(test_chance_greedy_cold),
      cmocka_unit_test(test_chance_frequency),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
