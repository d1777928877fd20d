/* `longhaul eval`: held-out accuracy of a model on an environment. Every task of the split is
 * sampled K times through the rollout engine (lh_rollout_generate) and scored; prints pass@1,
 * pass@k (unbiased estimator), mean reward, 95% intervals and a per-difficulty table, and with
 * --compare the paired difference against a second model on the same tasks and sampler
 * streams (sample j of task i uses stream i*K + j, whatever the chunking). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "longhaul/eval.h"
#include "longhaul/model.h"
#include "longhaul/rl.h"

#define CMD       "eval"
#define MAX_KS    16 /* pass@k columns: 1, powers of two below K, K */
#define BAR_WIDTH 28 /* characters of the progress bar */
/* a paired interval narrower than this has collapsed: every task's difference is the same (up to
 * rounding), docs/ALGORITHMS.md "The paired difference" */
#define ZERO_WIDTH 1e-9

static const lh__flag flags[] = {
    {"model", "DIR", true, "model directory with a tokenizer.json"},
    {"env", "SPEC", true,
     "environment: NAME or NAME:key=value,... (arith, countdown, sort, jsonl, exec)"},
    {"split", "NAME", false, "train or test (default test)"},
    {"n", "N", false, "tasks 0..N-1 of the split (default 500; jsonl: at most the split's size)"},
    {"samples", "K", false, "samples per task (default 1); pass@k for k = 1, 2, 4, ... and K"},
    {"temperature", "T", false,
     "sampling temperature (default 0 = greedy with K = 1, else 1; 0 needs K = 1)"},
    {"top-p", "P", false, "nucleus sampling threshold in (0, 1] (default 1 = off)"},
    {"max-new", "N", false, "tokens generated at most per sample (default 64)"},
    {"seed", "S", false, "sampling seed (default 0)"},
    {"batch", "B", false,
     "sequences generated at once (default 64; above 8, weights are also kept in fp32)"},
    {"threads", "K", false, "threads (default: all cores)"},
    {"compare", "DIR", false,
     "a second model evaluated on the same tasks and seeds; prints the paired difference"},
    {"json", "FILE", false, "also write every number and the per-task results to FILE as JSON"},
};

/* What every model is evaluated on: the same tasks, settings and sampler streams. */
typedef struct {
  lh_env *env;
  const char *env_spec;
  lh_split split;
  int n, K;          /* tasks, samples per task */
  int chunk;         /* tasks per lh_rollout_generate call */
  int batch;         /* generator slots */
  lh_gen_config gc;  /* sampling settings (eos ids: the model's) */
  lh_env_task *task; /* (n) fetched once, for every model; prompt NULL where the env failed */
  int ks[MAX_KS], n_ks;
  const char **levels; /* distinct non-empty labels, sorted */
  int n_levels;
  bool tty;
} setup;

/* One model's results. */
typedef struct {
  const char *dir;
  uint8_t *ok;    /* (n) the environment produced and scored the task */
  int *correct;   /* (n) correct samples of K */
  double *reward; /* (n) mean reward of the K samples */
  int n_ok;
  double seconds;
  long tokens; /* generated */
} run;

static void run_free(run *r) {
  free(r->ok);
  free(r->correct);
  free(r->reward);
}

/* ---------------------------------------------------------------- progress */

static void progress(const setup *s, const run *r, int done, double t0, double pass1_sum,
                     int ok_done) {
  double el = lh_time_now() - t0, p1 = ok_done ? pass1_sum / ok_done : 0;
  if (s->tty) {
    int fill = (int)((long)BAR_WIDTH * done / s->n);
    char bar[BAR_WIDTH + 1];
    for (int i = 0; i < BAR_WIDTH; i++)
      bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    fprintf(stderr, "\reval %s [%s] %d/%d tasks %.1f s pass@1 %.3f\033[K", r->dir, bar, done, s->n,
            el, p1);
    if (done == s->n) fputc('\n', stderr);
  } else if (done == s->n) {
    fprintf(stderr, "eval: %s: %d tasks in %.1f s (%.0f tokens/s), pass@1 %.3f\n", r->dir, done, el,
            el > 0 ? (double)r->tokens / el : 0.0, p1);
  }
  fflush(stderr);
}

/* ---------------------------------------------------------------- one model */

static lh_err load_tokenizer(const char *dir, lh_tokenizer **tok) {
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  return lh_tokenizer_load(path, tok);
}

/* Fails early, before the tasks are fetched and any model generates, on a model directory that
 * cannot be loaded: config, weights (every tensor present with its dtype and shape) and
 * tokenizer. */
static lh_err check_model_dir(const char *dir) {
  lh_config c;
  lh_tokenizer *tok = NULL;
  lh_err e = lh_model_check(dir, &c);
  if (!e) e = load_tokenizer(dir, &tok);
  lh_tokenizer_free(tok);
  return e;
}

/* Checks, before any model generates, that every prompt leaves room for --max-new tokens in the
 * context of the model in dir, so no sample is cut short; sets *max_prompt to the longest prompt
 * in its tokens (at least 1: it sizes the KV cache). Returns an exit code. */
static int fit_prompts(const setup *s, const char *dir, int *max_prompt) {
  char path[4096];
  lh_config c;
  lh_tokenizer *tok = NULL;
  int rc = LH__EXIT_OK;
  *max_prompt = 1;
  snprintf(path, sizeof path, "%s/config.json", dir);
  if (lh_config_load(path, &c) || load_tokenizer(dir, &tok)) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  for (int i = 0; i < s->n; i++) {
    const char *p = s->task[i].prompt;
    if (!p) continue;
    int32_t *ids = NULL;
    size_t len = 0;
    if (lh_tokenizer_encode(tok, p, strlen(p), true, &ids, &len)) {
      rc = lh__cli_fail(CMD);
      goto out;
    }
    free(ids);
    if ((long)len + s->gc.max_new > c.max_positions) {
      rc = lh__cli_error(CMD, LH__EXIT_FAIL,
                         "%s: task %d: the prompt has %zu tokens and --max-new is %d; the "
                         "model's context is %d tokens",
                         dir, i, len, s->gc.max_new, c.max_positions);
      goto out;
    }
    if ((int)len > *max_prompt) *max_prompt = (int)len;
  }
out:
  lh_tokenizer_free(tok);
  return rc;
}

/* Fails early on a --json path whose directory cannot be written. */
static bool json_dir_writable(const char *path) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) return access(".", W_OK | X_OK) == 0;
  if (slash == dir)
    slash[1] = '\0';
  else
    *slash = '\0';
  return access(dir, W_OK | X_OK) == 0;
}

/* Generates and scores every task with the model in dir, whose longest prompt has max_prompt
 * tokens (fit_prompts); fills r. Returns an exit code. */
static int run_model(const setup *s, const char *dir, int max_prompt, run *r) {
  memset(r, 0, sizeof *r);
  r->dir = dir;
  r->ok = lh_xcalloc((size_t)s->n, 1);
  r->correct = lh_xcalloc((size_t)s->n, sizeof *r->correct);
  r->reward = lh_xcalloc((size_t)s->n, sizeof *r->reward);
  lh_infer *m = NULL;
  lh_tokenizer *tok = NULL;
  lh_generator *g = NULL;
  uint64_t *idx = lh_xmalloc((size_t)s->chunk * sizeof *idx);
  int rc = LH__EXIT_FAIL;
  if (lh_infer_load(dir, &m) || load_tokenizer(dir, &tok)) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  int max_seq = max_prompt + s->gc.max_new;
  long want = (long)s->n * s->K;
  int slots = want < s->batch ? (int)want : s->batch;
  if (lh_generator_create(m, slots, max_seq, 0, &g)) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  double t0 = lh_time_now(), pass1_sum = 0;
  progress(s, r, 0, t0, 0, 0);
  for (int first = 0; first < s->n; first += s->chunk) {
    int cn = s->n - first < s->chunk ? s->n - first : s->chunk;
    for (int t = 0; t < cn; t++)
      idx[t] = (uint64_t)(first + t);
    lh_rollout_batch b;
    /* task first+t, sample j: stream (first+t)*K + j */
    if (lh_rollout_generate(g, &s->gc, tok, s->env, s->split, idx, s->task + first, cn, s->K,
                            (uint64_t)first * (uint64_t)s->K, &b)) {
      rc = lh__cli_fail(CMD);
      goto out;
    }
    for (int t = 0; t < cn; t++) {
      int i = first + t;
      if (!b.group_ok[t]) continue;
      r->ok[i] = 1;
      r->n_ok++;
      double rw = 0;
      for (int j = 0; j < s->K; j++) {
        int q = t * s->K + j;
        r->correct[i] += b.correct[q];
        rw += b.reward[q];
        r->tokens += b.seq_start[q + 1] - b.seq_start[q] - b.prompt_len[q];
      }
      r->reward[i] = rw / s->K;
      pass1_sum += (double)r->correct[i] / s->K;
    }
    lh_rollout_batch_free(&b);
    progress(s, r, first + cn, t0, pass1_sum, r->n_ok);
  }
  r->seconds = lh_time_now() - t0;
  if (r->n_ok == 0) {
    rc = lh__cli_error(CMD, LH__EXIT_FAIL, "%s: the environment failed on all %d tasks", dir, s->n);
    goto out;
  }
  rc = LH__EXIT_OK;
out:
  free(idx);
  lh_generator_free(g);
  lh_tokenizer_free(tok);
  lh_infer_free(m);
  return rc;
}

/* ---------------------------------------------------------------- statistics */

/* What is averaged over tasks: pass@k (k >= 1) or the mean reward (k = 0). */
static double task_value(const setup *s, const run *r, int i, int k) {
  return k > 0 ? lh_eval_pass_at_k(s->K, r->correct[i], k) : r->reward[i];
}

/* Tasks with the label (NULL: all) that every run in rs[0..nr) scored; writes their indices. */
static int select_tasks(const setup *s, const run *const *rs, int nr, const char *label, int *out) {
  int m = 0;
  for (int i = 0; i < s->n; i++) {
    bool in = !label || !strcmp(s->task[i].level, label);
    for (int j = 0; j < nr && in; j++)
      in = rs[j]->ok[i];
    if (in) out[m++] = i;
  }
  return m;
}

/* The mean of a quantity over tasks with its interval; with b, the paired difference a - b. */
static lh_eval_ci stat(const setup *s, const run *a, const run *b, const int *tasks, int m, int k,
                       double *va, double *vb) {
  for (int t = 0; t < m; t++) {
    va[t] = task_value(s, a, tasks[t], k);
    if (b) vb[t] = task_value(s, b, tasks[t], k);
  }
  return b ? lh_eval_paired(va, vb, m) : lh_eval_mean(va, m);
}

typedef struct {
  int *tasks; /* (n) scratch */
  double *va, *vb;
  char zero[1024]; /* paired rows whose interval has zero width, comma-separated */
  bool json_bad;   /* a JSON value could not be built or added (out of memory) */
} scratch;

/* Sets o[key] = v (v is taken; NULL or a NULL o count as a failure) and records a failure. */
static void set_json(scratch *w, json_t *o, const char *key, json_t *v) {
  if (json_object_set_new(o, key, v)) w->json_bad = true;
}

static void append_json(scratch *w, json_t *a, json_t *v) {
  if (json_array_append_new(a, v)) w->json_bad = true;
}

/* A JSON string of a user's text (a path, an environment spec, a label): bytes that are not
 * UTF-8 become U+FFFD. */
static json_t *text_json(const char *t) {
  return lh_json_text(t, strlen(t));
}

/* Adds the row to w->zero when c, a paired interval over two or more tasks, has zero width. */
static void note_zero_width(scratch *w, const char *row, lh_eval_ci c) {
  if (c.n < 2 || c.hi - c.lo >= ZERO_WIDTH) return;
  size_t used = strlen(w->zero);
  if (used + 1 < sizeof w->zero)
    snprintf(w->zero + used, sizeof w->zero - used, "%s%s", used ? ", " : "", row);
}

static json_t *ci_json(lh_eval_ci c) {
  return json_pack("{s:f, s:f, s:f, s:i}", "mean", c.mean, "lo", c.lo, "hi", c.hi, "tasks", c.n);
}

static void print_row(const char *name, lh_eval_ci c, bool diff) {
  printf("  %-23s ", name);
  if (diff)
    printf("%+.3f  [%+.3f, %+.3f]\n", c.mean, c.lo, c.hi);
  else
    printf("%.3f  [%.3f, %.3f]\n", c.mean, c.lo, c.hi);
}

/* Prints the rows of a block and sets the same numbers in o: pass@k for every k, the mean
 * reward, and pass@1 by difficulty, of model a alone (b NULL) or of the paired difference a - b
 * over the tasks both scored. Returns the number of tasks. */
static int report_rows(const setup *s, const run *a, const run *b, scratch *w, json_t *o) {
  const run *rs[2] = {a, b};
  int nr = b ? 2 : 1, m = select_tasks(s, rs, nr, NULL, w->tasks);
  json_t *pk = json_object();
  for (int j = 0; j < s->n_ks; j++) {
    lh_eval_ci c = stat(s, a, b, w->tasks, m, s->ks[j], w->va, w->vb);
    char name[32];
    snprintf(name, sizeof name, "pass@%d", s->ks[j]);
    print_row(name, c, b);
    if (b) note_zero_width(w, name, c);
    snprintf(name, sizeof name, "%d", s->ks[j]);
    set_json(w, pk, name, ci_json(c));
    if (s->ks[j] == 1) set_json(w, o, "pass_at_1", ci_json(c));
  }
  set_json(w, o, "pass_at_k", pk);
  lh_eval_ci rw = stat(s, a, b, w->tasks, m, 0, w->va, w->vb);
  print_row("mean reward", rw, b);
  if (b) note_zero_width(w, "mean reward", rw);
  set_json(w, o, "mean_reward", ci_json(rw));
  json_t *by = json_array();
  if (s->n_levels > 0)
    printf("  %-23s %6s  %s\n", "difficulty", "tasks", b ? "pass@1 difference" : "pass@1");
  for (int l = 0; l < s->n_levels; l++) {
    int ml = select_tasks(s, rs, nr, s->levels[l], w->tasks);
    lh_eval_ci c = stat(s, a, b, w->tasks, ml, 1, w->va, w->vb);
    lh_eval_ci cr = stat(s, a, b, w->tasks, ml, 0, w->va, w->vb);
    char name[48];
    snprintf(name, sizeof name, "%-23s %6d ", s->levels[l], ml);
    print_row(name, c, b);
    if (b) {
      char row[96];
      snprintf(row, sizeof row, "pass@1 of %s", s->levels[l]);
      note_zero_width(w, row, c);
    }
    append_json(w, by,
                json_pack("{s:o, s:i, s:o, s:o}", "level", text_json(s->levels[l]), "tasks", ml,
                          "pass_at_1", ci_json(c), "mean_reward", ci_json(cr)));
  }
  set_json(w, o, "by_level", by);
  return m;
}

/* Prints one model's block and returns its JSON object, with the per-task results. */
static json_t *report_model(const setup *s, const run *r, const char *role, scratch *w) {
  int m = 0;
  for (int i = 0; i < s->n; i++)
    m += r->ok[i];
  printf("%s %s: %d tasks scored", role, r->dir, m);
  if (m < s->n) printf(", %d skipped (the environment failed on them)", s->n - m);
  printf(", %.1f s, %.0f tokens/s\n", r->seconds, r->seconds > 0 ? r->tokens / r->seconds : 0.0);
  json_t *o = json_pack("{s:o, s:i, s:i, s:f, s:I}", "dir", text_json(r->dir), "tasks_scored", m,
                        "tasks_skipped", s->n - m, "seconds", r->seconds, "generated_tokens",
                        (json_int_t)r->tokens);
  report_rows(s, r, NULL, w, o);
  json_t *per = json_array();
  for (int i = 0; i < s->n; i++)
    append_json(w, per,
                json_pack("{s:i, s:o, s:b, s:i, s:f}", "index", i, "level",
                          text_json(s->task[i].level), "ok", r->ok[i], "correct", r->correct[i],
                          "reward", r->reward[i]));
  set_json(w, o, "per_task", per);
  return o;
}

/* Prints the paired difference a - b and returns its JSON object. `same`: a and b are one model
 * directory, whose zero-width intervals need no note. */
static json_t *report_paired(const setup *s, const run *a, const run *b, bool same, scratch *w) {
  const run *rs[2] = {a, b};
  int m = select_tasks(s, rs, 2, NULL, w->tasks);
  printf("paired difference (model - compare) on the %d tasks both scored, same sampler "
         "streams:\n",
         m);
  json_t *o = json_pack("{s:i}", "tasks", m);
  w->zero[0] = '\0';
  report_rows(s, a, b, w, o);
  if (!same && w->zero[0])
    printf("  note: zero width for %s: the two models' difference is the same on every task "
           "there, so the normal interval has no spread to measure; it is not certainty that "
           "they differ by exactly that (docs/ALGORITHMS.md, \"The paired difference\")\n",
           w->zero);
  return o;
}

/* ---------------------------------------------------------------- the command */

/* Whether two paths name one directory. */
static bool same_dir(const char *x, const char *y) {
  char *rx = realpath(x, NULL), *ry = realpath(y, NULL);
  bool same = rx && ry ? !strcmp(rx, ry) : !strcmp(x, y);
  free(rx);
  free(ry);
  return same;
}

static int cmp_str(const void *x, const void *y) {
  return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* Fetches every task once (every model is evaluated on these, so an environment is asked for
 * each task once) and collects the difficulty labels. */
static void fetch_tasks(setup *s) {
  s->task = lh_xcalloc((size_t)s->n, sizeof *s->task);
  s->levels = lh_xcalloc((size_t)s->n, sizeof *s->levels);
  for (int i = 0; i < s->n; i++) {
    if (lh_env_task_get(s->env, s->split, (uint64_t)i, &s->task[i])) {
      lh_log(LH_LOG_WARN, "eval: task %d skipped: %s", i, lh_last_error());
      continue;
    }
    if (s->task[i].level[0]) s->levels[s->n_levels++] = s->task[i].level;
  }
  qsort(s->levels, (size_t)s->n_levels, sizeof *s->levels, cmp_str);
  int u = 0;
  for (int l = 0; l < s->n_levels; l++)
    if (u == 0 || strcmp(s->levels[u - 1], s->levels[l])) s->levels[u++] = s->levels[l];
  s->n_levels = u;
}

int lh__cmd_eval(int argc, char **argv) {
  lh__args a = {.cmd = CMD,
                .about =
                    "Evaluates a model on tasks 0..N-1 of an environment's split: K samples per "
                    "task from the\nrollout engine (sample j of task i uses sampler stream "
                    "i*K + j), each scored by the environment.\nPrints pass@1, pass@k for "
                    "k = 2, 4, ... and K (the unbiased estimator), the mean reward, with\n"
                    "95% intervals (Wilson for 0/1 values, else normal), and pass@1 by "
                    "difficulty. With --compare,\nthe second model runs on the same tasks "
                    "and streams, and the paired difference (model - compare)\nis printed "
                    "with its 95% interval. Tasks the environment fails on are skipped and "
                    "counted.\nA progress bar is drawn on stderr when it is a terminal.",
                .flags = flags,
                .n_flags = sizeof flags / sizeof flags[0]};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  long n, K, max_new, batch, threads;
  double temperature, top_p;
  uint64_t seed;
  int split;
  static const char *const splits[] = {"train", "test", NULL};
  if ((rc = lh__args_int(&a, "n", 1, 1 << 24, 500, &n)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "samples", 1, 4096, 1, &K)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "temperature", 0, 1e6, K == 1 ? 0.0 : 1.0, &temperature)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "top-p", 1e-9, 1, 1.0, &top_p)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "max-new", 1, 1 << 20, 64, &max_new)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_u64(&a, "seed", LH__SEED_MAX, 0, &seed)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "batch", 1, 4096, 64, &batch)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "threads", 0, 1024, 0, &threads)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_choice(&a, "split", splits, LH_SPLIT_TEST, &split)) != LH__ARGS_CONTINUE)
    return rc;
  if (K > 1 && temperature == 0)
    return lh__cli_error(CMD, LH__EXIT_USAGE,
                         "--samples %ld with --temperature 0: greedy decoding gives the same "
                         "sample every time; use --samples 1, or a temperature above 0",
                         K);
  lh_set_threads((int)threads);
  const char *dir = lh__args_str(&a, "model", NULL), *dir2 = lh__args_str(&a, "compare", NULL);
  const char *json_path = lh__args_str(&a, "json", NULL);

  setup s = {.env_spec = lh__args_str(&a, "env", ""),
             .split = (lh_split)split,
             .K = (int)K,
             .batch = (int)batch,
             .tty = isatty(2)};
  run ra = {0}, rb = {0};
  scratch w = {0};
  json_t *root = NULL;
  rc = LH__EXIT_FAIL;
  lh_env_config ecfg;
  if (lh_env_config_parse(s.env_spec, &ecfg) || lh_env_create(&ecfg, &s.env)) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  if (check_model_dir(dir) || (dir2 && check_model_dir(dir2))) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  if (json_path && !json_dir_writable(json_path)) {
    rc = lh__cli_error(CMD, LH__EXIT_FAIL, "--json %s: cannot write to its directory: %s",
                       json_path, strerror(errno));
    goto out;
  }
  if (!strcmp(ecfg.name, "jsonl")) {
    uint64_t size = lh_env_size(s.env, s.split);
    if (size == 0) {
      rc =
          lh__cli_error(CMD, LH__EXIT_FAIL, "%s: the %s split is empty", s.env_spec, splits[split]);
      goto out;
    }
    if ((uint64_t)n > size) n = (long)size;
  }
  s.n = (int)n;
  /* about two rounds of the generator's slots per call: slots refill while a chunk drains */
  s.chunk = (int)(2 * batch / K);
  if (s.chunk < 1) s.chunk = 1;
  if (s.chunk > s.n) s.chunk = s.n;
  s.gc = lh_gen_defaults();
  s.gc.sample.temperature = (float)temperature;
  s.gc.sample.top_p = (float)top_p;
  s.gc.seed = seed;
  s.gc.max_new = (int)max_new;
  s.ks[s.n_ks++] = 1;
  for (int k = 2; k < K && s.n_ks < MAX_KS - 1; k *= 2)
    s.ks[s.n_ks++] = k;
  if (K > 1) s.ks[s.n_ks++] = (int)K;
  fetch_tasks(&s);

  /* every model is checked before any generates */
  int max_prompt = 1, max_prompt2 = 1;
  if ((rc = fit_prompts(&s, dir, &max_prompt)) != LH__EXIT_OK ||
      (dir2 && (rc = fit_prompts(&s, dir2, &max_prompt2)) != LH__EXIT_OK))
    goto out;
  if ((rc = run_model(&s, dir, max_prompt, &ra)) != LH__EXIT_OK) goto out;
  if (dir2 && (rc = run_model(&s, dir2, max_prompt2, &rb)) != LH__EXIT_OK) goto out;

  w.tasks = lh_xmalloc((size_t)s.n * sizeof *w.tasks);
  w.va = lh_xmalloc((size_t)s.n * sizeof *w.va);
  w.vb = lh_xmalloc((size_t)s.n * sizeof *w.vb);
  char sampling[64];
  if (temperature == 0)
    snprintf(sampling, sizeof sampling, "greedy");
  else
    snprintf(sampling, sizeof sampling, "temperature %g, top-p %g", temperature, top_p);
  printf("eval %s, %s split: %d tasks x %ld sample%s (%s), max-new %ld, seed %llu\n", s.env_spec,
         splits[split], s.n, K, K == 1 ? "" : "s", sampling, max_new, (unsigned long long)seed);
  root = json_pack("{s:s, s:o, s:s, s:i, s:i, s:f, s:f, s:i, s:I}", "command", "eval", "env",
                   text_json(s.env_spec), "split", splits[split], "tasks", s.n, "samples", (int)K,
                   "temperature", temperature, "top_p", top_p, "max_new", (int)max_new, "seed",
                   (json_int_t)seed);
  set_json(&w, root, "model", report_model(&s, &ra, "model", &w));
  if (dir2) {
    set_json(&w, root, "compare", report_model(&s, &rb, "compare", &w));
    set_json(&w, root, "paired", report_paired(&s, &ra, &rb, same_dir(dir, dir2), &w));
  }
  /* the report could not be written: the --json file is still written (the run is not lost),
   * and the exit code is still 1 */
  int out_rc = lh__cli_flush_stdout(CMD);
  if (json_path) {
    char *text = w.json_bad ? NULL : json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(10));
    if (!text) {
      rc = lh__cli_error(CMD, LH__EXIT_FAIL, "--json %s: cannot encode the results as JSON",
                         json_path);
      goto out;
    }
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps allocates len + 1 bytes: the NUL becomes the newline */
    lh_err e = lh_file_write_atomic(json_path, text, len + 1);
    free(text);
    if (e) {
      rc = lh__cli_fail(CMD);
      goto out;
    }
  }
  rc = out_rc;
out:
  json_decref(root);
  free(w.tasks);
  free(w.va);
  free(w.vb);
  run_free(&ra);
  run_free(&rb);
  if (s.task)
    for (int i = 0; i < s.n; i++)
      lh_env_task_clear(&s.task[i]);
  free(s.task);
  free(s.levels);
  lh_env_free(s.env);
  return rc;
}
