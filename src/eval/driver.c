/* longhaul eval: the evaluation driver (eval.h, "the driver"). Tasks are fetched once; each model
 * samples them in chunks through the rollout engine (task i, sample j: stream i*K + j, whatever
 * the chunking), and the statistics are taken over the tasks every compared model scored. */
#include <stdlib.h>
#include <string.h>

#include "longhaul/eval.h"
#include "longhaul/rollout.h"

struct lh_eval {
  lh_eval_config cfg;
  lh_env *env;
  lh_env_task *task; /* (n) prompt NULL where the env failed */
  const char **levels;
  int n_levels;
};

static int cmp_str(const void *x, const void *y) {
  return strcmp(*(const char *const *)x, *(const char *const *)y);
}

lh_err lh_eval_create(lh_env *env, const lh_eval_config *cfg, lh_eval **out) {
  *out = NULL;
  if (cfg->n < 1 || cfg->samples < 1 || cfg->batch < 1 || cfg->gc.max_new < 1)
    return lh_errorf(LH_ERR_INVAL, "eval: n %d, samples %d, batch %d, max_new %d: all must be >= 1",
                     cfg->n, cfg->samples, cfg->batch, cfg->gc.max_new);
  lh_eval *ev = lh_xcalloc(1, sizeof *ev);
  ev->cfg = *cfg;
  ev->env = env;
  if (!strcmp(lh_env_config_of(env)->name, "jsonl")) {
    uint64_t size = lh_env_size(env, cfg->split);
    if (size == 0) {
      free(ev);
      return lh_errorf(LH_ERR_NOTFOUND, "the %s split is empty",
                       cfg->split == LH_SPLIT_TEST ? "test" : "train");
    }
    if ((uint64_t)ev->cfg.n > size) ev->cfg.n = (int)size;
  }
  int n = ev->cfg.n;
  ev->task = lh_xcalloc((size_t)n, sizeof *ev->task);
  ev->levels = lh_xcalloc((size_t)n, sizeof *ev->levels);
  for (int i = 0; i < n; i++) {
    if (lh_env_task_get(env, cfg->split, (uint64_t)i, &ev->task[i])) {
      lh_log(LH_LOG_WARN, "eval: task %d skipped: %s", i, lh_last_error());
      continue;
    }
    if (ev->task[i].level[0]) ev->levels[ev->n_levels++] = ev->task[i].level;
  }
  qsort(ev->levels, (size_t)ev->n_levels, sizeof *ev->levels, cmp_str);
  int u = 0;
  for (int l = 0; l < ev->n_levels; l++)
    if (u == 0 || strcmp(ev->levels[u - 1], ev->levels[l])) ev->levels[u++] = ev->levels[l];
  ev->n_levels = u;
  *out = ev;
  return LH_ERR_OK;
}

void lh_eval_free(lh_eval *ev) {
  if (!ev) return;
  for (int i = 0; i < ev->cfg.n; i++)
    lh_env_task_clear(&ev->task[i]);
  free(ev->task);
  free(ev->levels);
  free(ev);
}

const lh_eval_config *lh_eval_config_of(const lh_eval *ev) {
  return &ev->cfg;
}
const lh_env_task *lh_eval_task(const lh_eval *ev, int i) {
  return &ev->task[i];
}
int lh_eval_n_levels(const lh_eval *ev) {
  return ev->n_levels;
}
const char *lh_eval_level(const lh_eval *ev, int i) {
  return ev->levels[i];
}

static lh_err load_tokenizer(const char *dir, lh_tokenizer **tok) {
  char *path = lh_path_join(dir, "tokenizer.json");
  lh_err e = lh_tokenizer_load(path, tok);
  free(path);
  return e;
}

/* The longest prompt of the tasks in tok's tokens (at least 1), checking that each leaves room
 * for max_new tokens in a context of `context` tokens; `where` names the model in messages. */
static lh_err longest_prompt(const lh_eval *ev, const lh_tokenizer *tok, int context,
                             const char *where, int *longest) {
  lh_err e = LH_ERR_OK;
  *longest = 1;
  for (int i = 0; !e && i < ev->cfg.n; i++) {
    const char *p = ev->task[i].prompt;
    if (!p) continue;
    int32_t *ids = NULL;
    size_t len = 0;
    if ((e = lh_tokenizer_encode(tok, p, strlen(p), true, &ids, &len))) break;
    free(ids);
    if ((long)len + ev->cfg.gc.max_new > context)
      e = lh_errorf(LH_ERR_LIMIT,
                    "%s: task %d: the prompt has %zu tokens and --max-new is %d; the model's "
                    "context is %d tokens",
                    where, i, len, ev->cfg.gc.max_new, context);
    else if ((int)len > *longest)
      *longest = (int)len;
  }
  return e;
}

lh_err lh_eval_check_model(const lh_eval *ev, const char *dir, int *max_prompt) {
  lh_config c;
  lh_tokenizer *tok = NULL;
  int longest = 1;
  lh_err e = lh_model_check(dir, &c);
  if (!e) e = load_tokenizer(dir, &tok);
  if (!e) e = longest_prompt(ev, tok, c.max_positions, dir, &longest);
  lh_tokenizer_free(tok);
  if (max_prompt) *max_prompt = longest;
  return e;
}

void lh_eval_result_free(lh_eval_result *r) {
  if (!r) return;
  free(r->ok);
  free(r->correct);
  free(r->reward);
  memset(r, 0, sizeof *r);
}

lh_err lh_eval_run(const lh_eval *ev, lh_infer *policy, const lh_tokenizer *tok, int max_prompt,
                   lh_eval_progress_fn progress, void *ud, lh_eval_result *r) {
  const lh_eval_config *c = &ev->cfg;
  int n = c->n, K = c->samples;
  memset(r, 0, sizeof *r);
  r->ok = lh_xcalloc((size_t)n, 1);
  r->correct = lh_xcalloc((size_t)n, sizeof *r->correct);
  r->reward = lh_xcalloc((size_t)n, sizeof *r->reward);
  /* about two rounds of the generator's slots per call: slots refill while a chunk drains */
  int chunk = 2 * c->batch / K;
  if (chunk < 1) chunk = 1;
  if (chunk > n) chunk = n;
  uint64_t *idx = lh_xmalloc((size_t)chunk * sizeof *idx);
  lh_generator *g = NULL;
  long want = (long)n * K;
  int slots = want < c->batch ? (int)want : c->batch;
  lh_err e = lh_generator_create(policy, slots, max_prompt + c->gc.max_new, 0, &g);
  if (e) goto out;
  double t0 = lh_time_now(), pass1_sum = 0;
  if (progress) progress(0, n, 0.0, 0.0, ud);
  for (int first = 0; first < n; first += chunk) {
    int cn = n - first < chunk ? n - first : chunk;
    for (int t = 0; t < cn; t++)
      idx[t] = (uint64_t)(first + t);
    lh_rollout_batch b;
    /* task first+t, sample j: stream (first+t)*K + j */
    if ((e = lh_rollout_generate(g, &c->gc, tok, ev->env, c->split, idx, ev->task + first, cn, K,
                                 (uint64_t)first * (uint64_t)K, &b)))
      goto out;
    for (int t = 0; t < cn; t++) {
      int i = first + t;
      if (!b.group_ok[t]) continue;
      r->ok[i] = 1;
      r->n_ok++;
      double rw = 0;
      for (int j = 0; j < K; j++) {
        int q = t * K + j;
        r->correct[i] += b.correct[q];
        rw += b.reward[q];
        r->tokens += b.seq_start[q + 1] - b.seq_start[q] - b.prompt_len[q];
      }
      r->reward[i] = rw / K;
      pass1_sum += (double)r->correct[i] / K;
    }
    lh_rollout_batch_free(&b);
    if (progress)
      progress(first + cn, n, r->n_ok ? pass1_sum / r->n_ok : 0.0, lh_time_now() - t0, ud);
  }
  r->seconds = lh_time_now() - t0;
  if (r->n_ok == 0) e = lh_errorf(LH_ERR_IO, "the environment failed on all %d tasks", n);
out:
  free(idx);
  lh_generator_free(g);
  if (e) lh_eval_result_free(r);
  return e;
}

lh_err lh_eval_run_dir(const lh_eval *ev, const char *dir, lh_eval_progress_fn progress, void *ud,
                       lh_eval_result *out) {
  memset(out, 0, sizeof *out);
  lh_infer *m = NULL;
  lh_tokenizer *tok = NULL;
  int max_prompt = 1;
  lh_err e;
  if (!(e = lh_eval_check_model(ev, dir, &max_prompt)) && !(e = lh_infer_load(dir, &m)) &&
      !(e = load_tokenizer(dir, &tok)) &&
      (e = lh_eval_run(ev, m, tok, max_prompt, progress, ud, out))) {
    char *why = lh_xstrdup(lh_last_error()); /* lh_errorf formats into what this returns */
    e = lh_errorf(e, "%s: %s", dir, why);
    free(why);
  }
  lh_tokenizer_free(tok);
  lh_infer_free(m);
  return e;
}

/* What is averaged over tasks: pass@k (k >= 1) or the mean reward (k = 0). */
static double task_value(const lh_eval *ev, const lh_eval_result *r, int i, int k) {
  return k > 0 ? lh_eval_pass_at_k(ev->cfg.samples, r->correct[i], k) : r->reward[i];
}

lh_eval_ci lh_eval_stat(const lh_eval *ev, const lh_eval_result *a, const lh_eval_result *b,
                        const char *label, int k) {
  int n = ev->cfg.n, m = 0;
  double *va = lh_xmalloc((size_t)n * sizeof *va), *vb = lh_xmalloc((size_t)n * sizeof *vb);
  for (int i = 0; i < n; i++) {
    if (label && strcmp(ev->task[i].level, label)) continue;
    if (!a->ok[i] || (b && !b->ok[i])) continue;
    va[m] = task_value(ev, a, i, k);
    if (b) vb[m] = task_value(ev, b, i, k);
    m++;
  }
  lh_eval_ci c = b ? lh_eval_paired(va, vb, m) : lh_eval_mean(va, m);
  free(va);
  free(vb);
  return c;
}

/* ---------------------------------------------------------------- held-out pass@1 in training */

lh_err lh_eval_heldout_run(lh_env *env, lh_infer *policy, const lh_tokenizer *tok, int n,
                           int max_new, lh_eval_heldout *out) {
  memset(out, 0, sizeof *out);
  lh_eval_config cfg = {.split = LH_SPLIT_TEST, .n = n, .samples = 1, .batch = 64};
  cfg.gc = lh_gen_defaults();
  cfg.gc.sample.temperature = 0.0f; /* greedy */
  cfg.gc.max_new = max_new;
  cfg.gc.tok = tok;
  lh_eval *ev = NULL;
  lh_eval_result r = {0};
  int max_prompt = 1;
  lh_err e = lh_eval_create(env, &cfg, &ev);
  if (!e)
    e = longest_prompt(ev, tok, lh_infer_config(policy)->max_positions, "held-out eval",
                       &max_prompt);
  if (!e) e = lh_eval_run(ev, policy, tok, max_prompt, NULL, NULL, &r);
  if (!e) {
    out->pass1 = lh_eval_stat(ev, &r, NULL, NULL, 1);
    out->seconds = r.seconds;
    out->tokens = r.tokens;
  }
  lh_eval_result_free(&r);
  lh_eval_free(ev);
  return e;
}
