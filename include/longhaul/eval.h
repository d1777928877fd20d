/* longhaul eval: evaluation. The statistics are pure functions of plain arrays (no I/O, no
 * allocation, any thread): the unbiased pass@k estimator of Chen et al. 2021, the mean of
 * per-task values with a 95% interval, and the paired difference of two models on the same tasks
 * with its 95% interval (formulas in docs/ALGORITHMS.md, "Evaluation"). The driver (lh_eval_*
 * below) samples every task of a split K times with the rollout engine and scores it, for a
 * model directory or for a policy in memory (a trainer evaluating its checkpoint in-process):
 * `longhaul eval` is flags and printing over it.
 *
 * Ownership: lh_eval_free and lh_eval_result_free accept NULL; an lh_eval borrows the
 * environment it was created with, which must outlive it. Thread safety: an lh_eval is read-only
 * after creation, but the environment it borrows is not thread-safe (exec), so evaluate on one
 * thread at a time. */
#ifndef LONGHAUL_EVAL_H
#define LONGHAUL_EVAL_H

#include <stdint.h>

#include "longhaul/env.h"
#include "longhaul/gen.h"
#include "longhaul/infer.h"
#include "longhaul/tokenizer.h"

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

/* ---------------------------------------------------------------- the driver */

typedef struct lh_eval_config {
  lh_split split;
  int n;            /* tasks 0..n-1 (a jsonl split holds at most its size: n is cut to it) */
  int samples;      /* K >= 1 per task; sample j of task i uses sampler stream i*K + j */
  int batch;        /* sequences generated at once */
  lh_gen_config gc; /* temperature, top-p, seed, max_new (eos ids: each model's own) */
} lh_eval_config;

typedef struct lh_eval lh_eval;

/* Fetches tasks 0..n-1 of the split once (every model is evaluated on these, so the environment
 * is asked for each task once; a task it fails on is logged and skipped for every model) and
 * collects their difficulty labels. An empty jsonl split is LH_ERR_NOTFOUND. */
lh_err lh_eval_create(lh_env *env, const lh_eval_config *cfg, lh_eval **out);
void lh_eval_free(lh_eval *ev);
const lh_eval_config *lh_eval_config_of(const lh_eval *ev);
/* The tasks (n of them: the config's n, cut to a jsonl split's size); a skipped task has a NULL
 * prompt. */
const lh_env_task *lh_eval_task(const lh_eval *ev, int i);
/* Distinct non-empty difficulty labels, sorted. */
int lh_eval_n_levels(const lh_eval *ev);
const char *lh_eval_level(const lh_eval *ev, int i);

/* Checks a model directory before anything generates: config.json, every tensor's presence,
 * dtype and shape, tokenizer.json, and that every prompt leaves room for max_new tokens in the
 * model's context (an error naming the task otherwise); *max_prompt (may be NULL) is the longest
 * prompt in the model's tokens (at least 1). */
lh_err lh_eval_check_model(const lh_eval *ev, const char *dir, int *max_prompt);

/* One model's results, per task. */
typedef struct lh_eval_result {
  uint8_t *ok;    /* (n) the environment produced and scored the task */
  int *correct;   /* (n) correct samples of K */
  double *reward; /* (n) mean reward of the K samples */
  int n_ok;
  double seconds;
  long tokens; /* generated */
} lh_eval_result;
void lh_eval_result_free(lh_eval_result *r);

/* Called after every chunk of tasks: tasks done, of n, and the mean pass@1 so far. */
typedef void (*lh_eval_progress_fn)(int done, int n, double pass1, double elapsed_s, void *ud);

/* Samples and scores every task with a policy and its tokenizer (max_prompt as
 * lh_eval_check_model gives it: it sizes the KV cache). An environment that fails on every task
 * is LH_ERR_IO. `progress` may be NULL. */
lh_err lh_eval_run(const lh_eval *ev, lh_infer *policy, const lh_tokenizer *tok, int max_prompt,
                   lh_eval_progress_fn progress, void *ud, lh_eval_result *out);
/* lh_eval_check_model, then lh_eval_run on the model in dir. */
lh_err lh_eval_run_dir(const lh_eval *ev, const char *dir, lh_eval_progress_fn progress, void *ud,
                       lh_eval_result *out);

/* The mean of pass@k (k >= 1) or of the mean reward (k = 0) over the tasks with `label` (NULL:
 * all) that a scored (and b, when not NULL, too), with its interval (lh_eval_mean); with b, the
 * paired difference a - b (lh_eval_paired). */
lh_eval_ci lh_eval_stat(const lh_eval *ev, const lh_eval_result *a, const lh_eval_result *b,
                        const char *label, int k);

/* ---------------------------------------------------------------- held-out pass@1 in training */

/* What `rl --eval-every` and `serve --eval-every` record: greedy pass@1 (one sample per task,
 * temperature 0) of a policy in memory on test tasks 0..n-1 of env, each given max_new tokens,
 * with its Wilson interval. The KV cache is sized by the longest of those prompts in tok's
 * tokens; a prompt that leaves no room for max_new in the policy's context is LH_ERR_LIMIT
 * naming the task. Allocates what it needs and frees it before returning; the policy is only
 * read, and the sampler's streams are its own, so a training loop that calls it between
 * updates trains exactly as without it. */
typedef struct lh_eval_heldout {
  lh_eval_ci pass1; /* over the tasks the environment produced (pass1.n of them) */
  double seconds;
  long tokens; /* generated */
} lh_eval_heldout;
lh_err lh_eval_heldout_run(lh_env *env, lh_infer *policy, const lh_tokenizer *tok, int n,
                           int max_new, lh_eval_heldout *out);

#endif
