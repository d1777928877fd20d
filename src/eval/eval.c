/* longhaul eval: pass@k, intervals of a mean and of a paired difference, as declared in
 * include/longhaul/eval.h. Sums in double, in index order, so results do not depend on anything
 * but the inputs. */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/eval.h"

double lh_eval_pass_at_k(int n, int c, int k) {
  if (c < 0 || c > n || k < 1 || k > n) return NAN;
  if (n - c < k) return 1.0;
  /* C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i): each factor in [0, 1) */
  double miss = 1.0;
  for (int64_t i = (int64_t)n - c + 1; i <= n; i++) /* 64-bit: i reaches n + 1 = INT_MAX + 1 */
    miss *= 1.0 - (double)k / (double)i;
  return 1.0 - miss;
}

static double clamp(double x, double lo, double hi) {
  return x < lo ? lo : x > hi ? hi : x;
}

lh_eval_ci lh_eval_wilson(double successes, int n) {
  if (n < 1) return (lh_eval_ci){0, 0, 1, 0};
  double p = successes / n, z = LH_EVAL_Z95, z2n = z * z / n;
  double center = (p + z2n / 2) / (1 + z2n);
  double half = z * sqrt(p * (1 - p) / n + z2n / (4.0 * n)) / (1 + z2n);
  /* rounding can leave p a hair outside [center - half, center + half] at p = 0 or 1 */
  return (lh_eval_ci){p, fmin(p, clamp(center - half, 0, 1)), fmax(p, clamp(center + half, 0, 1)),
                      n};
}

/* Mean and sample standard deviation (n - 1 denominator; 0 for n < 2) of a[i] - b[i], or of
 * a[i] when b is NULL; n >= 1. */
static void mean_sd(const double *a, const double *b, int n, double *mean, double *sd) {
  double s = 0;
  for (int i = 0; i < n; i++)
    s += a[i] - (b ? b[i] : 0.0);
  *mean = s / n;
  double ss = 0;
  for (int i = 0; i < n; i++) {
    double d = a[i] - (b ? b[i] : 0.0) - *mean;
    ss += d * d;
  }
  *sd = n > 1 ? sqrt(ss / (n - 1)) : 0;
}

lh_eval_ci lh_eval_mean(const double *v, int n) {
  if (n < 1) return (lh_eval_ci){0, 0, 1, 0};
  bool binary = true;
  double successes = 0;
  for (int i = 0; i < n && binary; i++) {
    binary = v[i] == 0.0 || v[i] == 1.0;
    successes += v[i];
  }
  if (binary) return lh_eval_wilson(successes, n);
  double m, sd;
  mean_sd(v, NULL, n, &m, &sd);
  if (n == 1) return (lh_eval_ci){m, 0, 1, 1};
  double half = LH_EVAL_Z95 * sd / sqrt(n);
  return (lh_eval_ci){m, clamp(m - half, 0, 1), clamp(m + half, 0, 1), n};
}

lh_eval_ci lh_eval_paired(const double *a, const double *b, int n) {
  if (n < 1) return (lh_eval_ci){0, -1, 1, 0};
  double m, sd;
  mean_sd(a, b, n, &m, &sd);
  if (n == 1) return (lh_eval_ci){m, -1, 1, 1};
  double half = LH_EVAL_Z95 * sd / sqrt(n);
  return (lh_eval_ci){m, clamp(m - half, -1, 1), clamp(m + half, -1, 1), n};
}
