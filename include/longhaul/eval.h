/* longhaul eval: the statistics of an evaluation. Pure functions of plain arrays (no I/O, no
 * allocation): the unbiased pass@k estimator of Chen et al. 2021, the mean of per-task values
 * with a 95% interval, and the paired difference of two models on the same tasks with its 95%
 * interval. Formulas in docs/ALGORITHMS.md, "Evaluation". */
#ifndef LONGHAUL_EVAL_H
#define LONGHAUL_EVAL_H

/* z of a two-sided 95% normal interval, rounded as it is usually quoted */
#define LH_EVAL_Z95 1.96

/* A point estimate and its 95% interval, lo <= mean <= hi. */
typedef struct lh_eval_ci {
  double mean, lo, hi;
  int n; /* values it was computed from */
} lh_eval_ci;

/* Unbiased pass@k of one task from n samples of which c are correct: the probability that k
 * samples drawn without replacement from the n include a correct one,
 *   1 - C(n-c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i),
 * computed as that product (no binomials, stable for any n). 1 when n - c < k, 0 when c = 0.
 * NAN unless 0 <= c <= n and 1 <= k <= n. */
double lh_eval_pass_at_k(int n, int c, int k);

/* Wilson score interval of a proportion: `successes` of n trials, n >= 1; mean = successes / n
 * and, with p = mean, z = LH_EVAL_Z95,
 *   lo, hi = (p + z^2/(2n) -+ z sqrt(p(1-p)/n + z^2/(4n^2))) / (1 + z^2/n).
 * n = 0 gives {0, 0, 1, 0}. */
lh_eval_ci lh_eval_wilson(double successes, int n);

/* Mean of per-task values v[0..n) in [0, 1] (pass@k or mean reward of each task) with a 95%
 * interval:
 *  - when every value is exactly 0 or 1 (a proportion: pass@1 with one sample per task), the
 *    Wilson score interval of sum(v) successes in n;
 *  - otherwise the normal interval mean -+ z s / sqrt(n), s the sample standard deviation (n - 1
 *    denominator), clamped to [0, 1]; with n = 1 the interval is [0, 1]. It has zero width (up
 *    to rounding) when n >= 2 and every value is the same number in (0, 1): s = 0 says the
 *    values do not vary, not that the mean is exact (docs/ALGORITHMS.md, "Evaluation").
 * n = 0 gives {0, 0, 1, 0}. */
lh_eval_ci lh_eval_mean(const double *v, int n);

/* Paired difference of two models on the same n tasks: d_i = a[i] - b[i], mean d with
 * mean -+ z s_d / sqrt(n), s_d the sample standard deviation of d (n - 1 denominator), clamped
 * to [-1, 1] (values are in [0, 1]). n = 1 gives {d_0, -1, 1, 1}: one difference says nothing
 * about the spread, so even identical arrays give {0, -1, 1, 1}; for n >= 2 identical arrays
 * give exactly {0, 0, 0, n}. n = 0 gives {0, -1, 1, 0}. For n >= 2 the interval collapses to
 * the point mean d (up to rounding) whenever every d_i is the same, whether or not a and b come
 * from the same model: two models that both fail (or both solve) every task, or one that solves
 * every task the other fails. That is s_d = 0, not certainty (docs/ALGORITHMS.md, "The paired
 * difference"). */
lh_eval_ci lh_eval_paired(const double *a, const double *b, int n);

#endif
