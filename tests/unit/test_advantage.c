/* Group advantages: GRPO with and without std normalisation (Dr. GRPO) and RLOO, worked by hand,
 * including groups of equal rewards (skipped and counted), groups of one, bad arguments, and
 * spreading sequence advantages over tokens. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "longhaul/rl.h"

static void near_all(const float *got, const double *want, int n, const char *what) {
  for (int i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= 1e-6)) {
      print_error("%s[%d]: got %.9g, want %.9g\n", what, i, got[i], want[i]);
      fail();
    }
}

/* Three groups of G = 4:
 *   g0 = 1 0 0 1: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.5773503
 *   g1 = 0.5 x 4: all equal -> skipped, advantages 0
 *   g2 = 1 0 0 0: mean 0.25, sample std sqrt((0.5625 + 3 * 0.0625) / 3) = sqrt(0.25) = 0.5 */
static const float rewards[12] = {1, 0, 0, 1, 0.5f, 0.5f, 0.5f, 0.5f, 1, 0, 0, 0};

/* GRPO with std (eps 0): g0 +-0.5 / 0.5773503 = +-0.8660254; g2 0.75 / 0.5 = 1.5, -0.25 / 0.5 =
 * -0.5. With eps 0.1: g2 0.75 / 0.6 = 1.25, -0.25 / 0.6 = -0.4166667. */
static void test_grpo_std(void **state) {
  (void)state;
  lh_adv_config c = {LH_ADV_GRPO, 1, 0.0f};
  float a[12];
  assert_int_equal(lh_adv_compute(&c, rewards, 3, 4, a), 1);
  const double want[12] = {0.8660254, -0.8660254, -0.8660254, 0.8660254, 0,    0,
                           0,         0,          1.5,        -0.5,      -0.5, -0.5};
  near_all(a, want, 12, "grpo std");
  c.eps = 0.1f;
  assert_int_equal(lh_adv_compute(&c, rewards + 8, 1, 4, a), 0);
  const double want2[4] = {1.25, -0.25 / 0.6, -0.25 / 0.6, -0.25 / 0.6};
  near_all(a, want2, 4, "grpo std eps 0.1");
}

/* Dr. GRPO (no std): r - mean: g0 +-0.5; g2 0.75, -0.25. */
static void test_dr_grpo(void **state) {
  (void)state;
  lh_adv_config c = {LH_ADV_GRPO, 0, 1e-6f};
  float a[12];
  assert_int_equal(lh_adv_compute(&c, rewards, 3, 4, a), 1);
  const double want[12] = {0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0.75, -0.25, -0.25, -0.25};
  near_all(a, want, 12, "dr grpo");
}

/* RLOO: r_i - (sum - r_i) / 3. g0 (sum 2): 1 - 1/3 = 0.6666667, 0 - 2/3 = -0.6666667;
 * g2 (sum 1): 1 - 0 = 1, 0 - 1/3 = -0.3333333. */
static void test_rloo(void **state) {
  (void)state;
  lh_adv_config c = {LH_ADV_RLOO, 0, 0.0f};
  float a[12];
  assert_int_equal(lh_adv_compute(&c, rewards, 3, 4, a), 1);
  const double want[12] = {2.0 / 3, -2.0 / 3, -2.0 / 3, 2.0 / 3,  0,        0,
                           0,       0,        1,        -1.0 / 3, -1.0 / 3, -1.0 / 3};
  near_all(a, want, 12, "rloo");
}

/* Every group all-equal (0s, 1s) and groups of one are skipped; arguments are checked. */
static void test_skipped_and_bad(void **state) {
  (void)state;
  lh_adv_config c = {LH_ADV_GRPO, 1, 1e-6f};
  const float r[6] = {0, 0, 0, 1, 1, 1};
  float a[6] = {9, 9, 9, 9, 9, 9};
  assert_int_equal(lh_adv_compute(&c, r, 2, 3, a), 2);
  const double zero[6] = {0, 0, 0, 0, 0, 0};
  near_all(a, zero, 6, "all equal");
  for (int i = 0; i < 6; i++)
    a[i] = 9;
  c.kind = LH_ADV_RLOO;
  assert_int_equal(lh_adv_compute(&c, r, 6, 1, a), 6);
  near_all(a, zero, 6, "groups of one");
  assert_int_equal(lh_adv_compute(&c, r, 2, 0, a), -1);
  assert_int_equal(lh_adv_compute(&c, NULL, 2, 3, a), -1);
  c.kind = (lh_adv_kind)7;
  assert_int_equal(lh_adv_compute(&c, r, 2, 3, a), -1);
  /* a negative eps can flip the sign of every advantage ((0 - 0.5) / (0.707 - 1.2) > 0): refused,
   * as are NaN and inf */
  c.kind = LH_ADV_GRPO;
  const float eps_bad[3] = {-0.5f, NAN, INFINITY};
  for (int i = 0; i < 3; i++) {
    c.eps = eps_bad[i];
    assert_int_equal(lh_adv_compute(&c, r, 2, 3, a), -1);
  }
  c.eps = 0.0f;
  assert_int_equal(lh_adv_compute(&c, r, 2, 3, a), 2);
}

static void test_to_tokens(void **state) {
  (void)state;
  const int ss[4] = {0, 2, 2, 5};
  const float sa[3] = {1.5f, -2, 0.25f};
  float t[5] = {0};
  lh_adv_to_tokens(3, ss, sa, t);
  const double want[5] = {1.5, 1.5, 0.25, 0.25, 0.25};
  near_all(t, want, 5, "tokens");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grpo_std),  cmocka_unit_test(test_dr_grpo),
      cmocka_unit_test(test_rloo),      cmocka_unit_test(test_skipped_and_bad),
      cmocka_unit_test(test_to_tokens),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
