/* assert_float_equal that fails on NaN. cmocka 1.1.5 (Debian 12) passes
 * assert_float_equal(NAN, 1, eps): every comparison inside it is false, so it falls through to
 * "equal". This header replaces it with a check written as !(|a - b| <= eps), in double, that
 * prints both values; include it after <cmocka.h>. */
#ifndef LONGHAUL_TEST_NEAR_H
#define LONGHAUL_TEST_NEAR_H

#include <math.h>

#undef assert_float_equal
#define assert_float_equal(a, b, eps)                                                              \
  do {                                                                                             \
    double a_ = (a), b_ = (b), eps_ = (eps);                                                       \
    if (!(fabs(a_ - b_) <= eps_))                                                                  \
      fail_msg("%s = %.9g, expected %s = %.9g within %g", #a, a_, #b, b_, eps_);                   \
  } while (0)

/* The larger of a running worst error and a new one; a NaN error sticks (fmax would drop it), so
 * a final `worst <= tol` check fails. */
static inline double near_worst(double worst, double err) {
  return isnan(worst) || err <= worst ? worst : err;
}

#endif
