/* Evaluation statistics: pass@k against hand-worked binomials and a brute-force count over every
 * k-subset, the Wilson interval, the mean interval of non-binary values (with clamping) and the
 * paired difference. Expected numbers were worked by hand or with /usr/bin/python3 (math.comb,
 * statistics.stdev, z = 1.96); each says how. */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "longhaul/eval.h"

static void near(double got, double want, double tol, const char *what) {
  if (!(fabs(got - want) <= tol)) {
    print_error("%s: got %.12g, want %.12g\n", what, got, want);
    fail();
  }
}

static void near_ci(lh_eval_ci got, double mean, double lo, double hi, int n, const char *what) {
  near(got.mean, mean, 1e-10, what);
  near(got.lo, lo, 1e-10, what);
  near(got.hi, hi, 1e-10, what);
  assert_int_equal(got.n, n);
}

static void test_pass_at_k_by_hand(void **state) {
  (void)state;
  /* 1 - C(3,2)/C(5,2) = 1 - 3/10 */
  near(lh_eval_pass_at_k(5, 2, 2), 0.7, 1e-15, "n5 c2 k2");
  /* 1 - C(7,4)/C(10,4) = 1 - 35/210 = 5/6 */
  near(lh_eval_pass_at_k(10, 3, 4), 5.0 / 6.0, 1e-15, "n10 c3 k4");
  /* python3: 1 - comb(193, 50) / comb(200, 50) */
  near(lh_eval_pass_at_k(200, 7, 50), 0.8712245647066278, 1e-13, "n200 c7 k50");
  /* k = 1 is the fraction correct; no correct sample gives 0; n - c < k gives 1 */
  near(lh_eval_pass_at_k(8, 3, 1), 3.0 / 8.0, 1e-15, "k1");
  assert_true(lh_eval_pass_at_k(16, 0, 4) == 0.0);
  assert_true(lh_eval_pass_at_k(5, 3, 3) == 1.0);
  assert_true(lh_eval_pass_at_k(4, 1, 4) == 1.0);
  assert_true(lh_eval_pass_at_k(1, 1, 1) == 1.0 && lh_eval_pass_at_k(1, 0, 1) == 0.0);
  /* large n: the product form neither overflows nor loses the answer (C(1000, 500) would) */
  double big = lh_eval_pass_at_k(1000, 1, 500); /* = 500/1000 exactly */
  near(big, 0.5, 1e-15, "n1000 c1 k500");
  /* n = INT_MAX: the product's counter reaches n without overflowing (undefined behaviour that
   * UBSan reports, make asan). python3: 1 - comb(n - c, k) / comb(n, k) with fractions.Fraction;
   * the product form is exact to about 1e-16 absolute (1 - (1 - 1/n) rounds) */
  near(lh_eval_pass_at_k(INT_MAX, 1, 1), 4.656612875245797e-10, 1e-15, "n INT_MAX c1 k1");
  near(lh_eval_pass_at_k(INT_MAX, 3, 2), 2.7939677238464355e-09, 1e-15, "n INT_MAX c3 k2");
  assert_true(lh_eval_pass_at_k(INT_MAX, INT_MAX, 1) == 1.0);
  /* outside the domain */
  assert_true(isnan(lh_eval_pass_at_k(5, 6, 1)));
  assert_true(isnan(lh_eval_pass_at_k(5, -1, 1)));
  assert_true(isnan(lh_eval_pass_at_k(5, 2, 0)));
  assert_true(isnan(lh_eval_pass_at_k(5, 2, 6)));
}

/* Samples 0..c-1 are the correct ones; count the k-subsets (bit masks of n bits with k set)
 * that hold at least one of them. */
static void test_pass_at_k_brute_force(void **state) {
  (void)state;
  for (int n = 1; n <= 12; n++)
    for (int c = 0; c <= n; c++)
      for (int k = 1; k <= n; k++) {
        long hit = 0, all = 0;
        for (uint32_t m = 0; m < (1u << n); m++) {
          if (__builtin_popcount(m) != k) continue;
          all++;
          hit += (m & ((1u << c) - 1)) != 0;
        }
        double got = lh_eval_pass_at_k(n, c, k), want = (double)hit / (double)all;
        if (!(fabs(got - want) <= 1e-12)) {
          print_error("pass@%d of n %d c %d: got %.15g, brute force %ld/%ld = %.15g\n", k, n, c,
                      got, hit, all, want);
          fail();
        }
      }
}

static void test_wilson(void **state) {
  (void)state;
  /* python3, z = 1.96: p = 0.8, centre (p + z^2/20) / (1 + z^2/10) = 0.716736,
   * half z / (1 + z^2/10) * sqrt(p (1-p) / 10 + z^2 / 400) = 0.226583 */
  lh_eval_ci w = lh_eval_wilson(8, 10);
  near(w.lo, 0.4902, 5e-5, "wilson 8/10 lo (4 places)");
  near(w.hi, 0.9433, 5e-5, "wilson 8/10 hi (4 places)");
  near_ci(w, 0.8, 0.49015684672072335, 0.9433190520193067, 10, "wilson 8/10");
  near_ci(lh_eval_wilson(37, 50), 0.74, 0.6044657801100008, 0.8412862034863262, 50, "wilson 37/50");
  /* 0 and all successes: the interval is one-sided, never a single point */
  near_ci(lh_eval_wilson(0, 10), 0, 0, 0.2775401687666166, 10, "wilson 0/10");
  near_ci(lh_eval_wilson(10, 10), 1, 0.7224598312333834, 1, 10, "wilson 10/10");
  near_ci(lh_eval_wilson(1, 1), 1, 0.2065432914738929, 1, 1, "wilson 1/1");
  lh_eval_ci e = lh_eval_wilson(0, 0);
  assert_true(e.mean == 0 && e.lo == 0 && e.hi == 1 && e.n == 0);
}

static void test_mean(void **state) {
  (void)state;
  /* 0/1 values are a proportion: the Wilson interval */
  const double bin[10] = {1, 1, 0, 1, 1, 1, 1, 0, 1, 1};
  near_ci(lh_eval_mean(bin, 10), 0.8, 0.49015684672072335, 0.9433190520193067, 10, "binary");
  /* python3: statistics.stdev([.5, .25, 1, 0, .75]) = 0.3952847; 0.5 -+ 1.96 * s / sqrt(5) */
  const double v[5] = {0.5, 0.25, 1.0, 0.0, 0.75};
  near_ci(lh_eval_mean(v, 5), 0.5, 0.15351767721859172, 0.8464823227814082, 5, "normal");
  /* mean 0.975, s = 0.05, 0.975 + 1.96 * 0.05 / 2 = 1.024 is clamped to 1 */
  const double hi[4] = {1, 1, 1, 0.9};
  near_ci(lh_eval_mean(hi, 4), 0.975, 0.926, 1.0, 4, "clamped");
  /* one non-binary value says nothing about the spread */
  near_ci(lh_eval_mean(v, 1), 0.5, 0, 1, 1, "one value");
  lh_eval_ci e = lh_eval_mean(v, 0);
  assert_true(e.mean == 0 && e.lo == 0 && e.hi == 1 && e.n == 0);
}

static void test_paired(void **state) {
  (void)state;
  /* d = 1, 0, 0, 0, 0.5, 0.25: mean 0.2916667; python3: statistics.stdev(d) = 0.4031129,
   * 0.2916667 -+ 1.96 * s / sqrt(6) */
  const double a[6] = {1, 0.5, 1, 0, 1, 0.25}, b[6] = {0, 0.5, 1, 0, 0.5, 0};
  near_ci(lh_eval_paired(a, b, 6), 0.2916666666666667, -0.028816475549026832, 0.6121498088823603, 6,
          "a - b");
  near_ci(lh_eval_paired(b, a, 6), -0.2916666666666667, -0.6121498088823603, 0.028816475549026832,
          6, "b - a");
  /* a model against itself: exactly zero, a zero-width interval */
  lh_eval_ci s = lh_eval_paired(a, a, 6);
  assert_true(s.mean == 0.0 && s.lo == 0.0 && s.hi == 0.0 && s.n == 6);
  /* every task flips from 0 to 1: d = 1 everywhere, sd 0 */
  const double ones[3] = {1, 1, 1}, zeros[3] = {0, 0, 0};
  lh_eval_ci f = lh_eval_paired(ones, zeros, 3);
  assert_true(f.mean == 1.0 && f.lo == 1.0 && f.hi == 1.0);
  /* large spread is clamped to [-1, 1] */
  const double x[2] = {1, 0}, y[2] = {0, 1};
  near_ci(lh_eval_paired(x, y, 2), 0, -1, 1, 2, "clamped");
  near_ci(lh_eval_paired(a, b, 1), 1, -1, 1, 1, "one pair");
  /* one pair of identical values: still [-1, 1] (eval.h), not the zero width of n >= 2 */
  lh_eval_ci one = lh_eval_paired(a, a, 1);
  assert_true(one.mean == 0.0 && one.lo == -1.0 && one.hi == 1.0 && one.n == 1);
  lh_eval_ci e = lh_eval_paired(a, b, 0);
  assert_true(e.mean == 0 && e.lo == -1 && e.hi == 1 && e.n == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pass_at_k_by_hand),
      cmocka_unit_test(test_pass_at_k_brute_force),
      cmocka_unit_test(test_wilson),
      cmocka_unit_test(test_mean),
      cmocka_unit_test(test_paired),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
