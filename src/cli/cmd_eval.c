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
    {"model", "DIR", true,
     "model directory with a tokenizer.json, or a run directory (RUN or RUN/latest: its latest "
     "checkpoint)"},
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
    {"batch", "B", false, "sequences generated at once (default 64)"},
    {"threads", "K", false, "threads (default: all cores)"},
    {"compare", "DIR", false,
     "a second model (directory or run directory) evaluated on the same tasks and seeds; prints "
     "the paired difference"},
    {"json", "FILE", false, "also write every number and the per-task results to FILE as JSON"},
};

/* What every model is evaluated on (the driver's tasks and settings), and how it is reported. */
typedef struct {
  lh_eval *ev;
  int n, K;
  int ks[MAX_KS], n_ks;
  bool tty;
} setup;

/* One model's results. */
typedef struct {
  const char *dir;
  lh_eval_result r;
} run;

/* ---------------------------------------------------------------- progress */

typedef struct {
  const char *dir;
  bool tty;
  long tokens;
} bar;

static void progress(int done, int n, double p1, double el, void *ud) {
  bar *b = ud;
  if (b->tty) {
    int fill = (int)((long)BAR_WIDTH * done / n);
    char line[BAR_WIDTH + 1];
    for (int i = 0; i < BAR_WIDTH; i++)
      line[i] = i < fill ? '#' : '.';
    line[BAR_WIDTH] = '\0';
    fprintf(stderr, "\reval %s [%s] %d/%d tasks %.1f s pass@1 %.3f\033[K", b->dir, line, done, n,
            el, p1);
    if (done == n) fputc('\n', stderr);
    fflush(stderr);
  }
}

/* Evaluates the model in dir; fills r. Returns an exit code. */
static int run_model(const setup *s, const char *dir, run *r) {
  r->dir = dir;
  bar b = {dir, s->tty, 0};
  if (lh_eval_run_dir(s->ev, dir, progress, &b, &r->r)) return lh__cli_fail(CMD);
  if (!s->tty)
    fprintf(stderr, "eval: %s: %d tasks in %.1f s (%.0f tokens/s), pass@1 %.3f\n", dir, s->n,
            r->r.seconds, r->r.seconds > 0 ? (double)r->r.tokens / r->r.seconds : 0.0,
            lh_eval_stat(s->ev, &r->r, NULL, NULL, 1).mean);
  return LH__EXIT_OK;
}

/* ---------------------------------------------------------------- statistics */

/* Tasks that every run in rs[0..nr) scored (with the label, or all for NULL). */
static int count_tasks(const setup *s, const run *const *rs, int nr, const char *label) {
  int m = 0;
  for (int i = 0; i < s->n; i++) {
    bool in = !label || !strcmp(lh_eval_task(s->ev, i)->level, label);
    for (int j = 0; j < nr && in; j++)
      in = rs[j]->r.ok[i];
    m += in;
  }
  return m;
}

/* The mean of a quantity over tasks with its interval; with b, the paired difference a - b. */
static lh_eval_ci stat(const setup *s, const run *a, const run *b, const char *label, int k) {
  return lh_eval_stat(s->ev, &a->r, b ? &b->r : NULL, label, k);
}

typedef struct {
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
  int nr = b ? 2 : 1, m = count_tasks(s, rs, nr, NULL);
  json_t *pk = json_object();
  for (int j = 0; j < s->n_ks; j++) {
    lh_eval_ci c = stat(s, a, b, NULL, s->ks[j]);
    char name[32];
    snprintf(name, sizeof name, "pass@%d", s->ks[j]);
    print_row(name, c, b);
    if (b) note_zero_width(w, name, c);
    snprintf(name, sizeof name, "%d", s->ks[j]);
    set_json(w, pk, name, ci_json(c));
    if (s->ks[j] == 1) set_json(w, o, "pass_at_1", ci_json(c));
  }
  set_json(w, o, "pass_at_k", pk);
  lh_eval_ci rw = stat(s, a, b, NULL, 0);
  print_row("mean reward", rw, b);
  if (b) note_zero_width(w, "mean reward", rw);
  set_json(w, o, "mean_reward", ci_json(rw));
  json_t *by = json_array();
  int n_levels = lh_eval_n_levels(s->ev);
  if (n_levels > 0)
    printf("  %-23s %6s  %s\n", "difficulty", "tasks", b ? "pass@1 difference" : "pass@1");
  for (int l = 0; l < n_levels; l++) {
    const char *level = lh_eval_level(s->ev, l);
    int ml = count_tasks(s, rs, nr, level);
    lh_eval_ci c = stat(s, a, b, level, 1);
    lh_eval_ci cr = stat(s, a, b, level, 0);
    char name[48];
    snprintf(name, sizeof name, "%-23s %6d ", level, ml);
    print_row(name, c, b);
    if (b) {
      char row[96];
      snprintf(row, sizeof row, "pass@1 of %s", level);
      note_zero_width(w, row, c);
    }
    append_json(w, by,
                json_pack("{s:o, s:i, s:o, s:o}", "level", text_json(level), "tasks", ml,
                          "pass_at_1", ci_json(c), "mean_reward", ci_json(cr)));
  }
  set_json(w, o, "by_level", by);
  return m;
}

/* Prints one model's block and returns its JSON object, with the per-task results. */
static json_t *report_model(const setup *s, const run *r, const char *role, scratch *w) {
  int m = 0;
  for (int i = 0; i < s->n; i++)
    m += r->r.ok[i];
  printf("%s %s: %d tasks scored", role, r->dir, m);
  if (m < s->n) printf(", %d skipped (the environment failed on them)", s->n - m);
  printf(", %.1f s, %.0f tokens/s\n", r->r.seconds,
         r->r.seconds > 0 ? (double)r->r.tokens / r->r.seconds : 0.0);
  json_t *o = json_pack("{s:o, s:i, s:i, s:f, s:I}", "dir", text_json(r->dir), "tasks_scored", m,
                        "tasks_skipped", s->n - m, "seconds", r->r.seconds, "generated_tokens",
                        (json_int_t)r->r.tokens);
  report_rows(s, r, NULL, w, o);
  json_t *per = json_array();
  for (int i = 0; i < s->n; i++)
    append_json(w, per,
                json_pack("{s:i, s:o, s:b, s:i, s:f}", "index", i, "level",
                          text_json(lh_eval_task(s->ev, i)->level), "ok", r->r.ok[i], "correct",
                          r->r.correct[i], "reward", r->r.reward[i]));
  set_json(w, o, "per_task", per);
  return o;
}

/* Prints the paired difference a - b and returns its JSON object. `same`: a and b are one model
 * directory, whose zero-width intervals need no note. */
static json_t *report_paired(const setup *s, const run *a, const run *b, bool same, scratch *w) {
  const run *rs[2] = {a, b};
  int m = count_tasks(s, rs, 2, NULL);
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

  const char *env_spec = lh__args_str(&a, "env", "");
  setup s = {.K = (int)K, .tty = isatty(2)};
  run ra = {0}, rb = {0};
  scratch w = {0};
  json_t *root = NULL;
  lh_env *env = NULL;
  char *mdir = NULL, *mdir2 = NULL;
  rc = LH__EXIT_FAIL;
  lh_env_config ecfg;
  if (!(mdir = lh__model_dir(CMD, dir)) || (dir2 && !(mdir2 = lh__model_dir(CMD, dir2)))) goto out;
  dir = mdir;
  if (dir2) dir2 = mdir2;
  lh_err ee = lh_env_config_parse(env_spec, &ecfg);
  if (ee || (ee = lh_env_create(&ecfg, &env))) {
    rc = lh__cli_fail_err(CMD, ee);
    goto out;
  }
  lh_config mc;
  if (lh_model_check(dir, &mc) || (dir2 && lh_model_check(dir2, &mc))) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  /* fails early, before the run, on a --json path that cannot be written */
  if (json_path && lh_file_out_check(json_path) != LH_ERR_OK) {
    rc = lh__cli_error(CMD, LH__EXIT_FAIL, "--json %s", lh_last_error());
    goto out;
  }
  lh_eval_config ec = {.split = (lh_split)split,
                       .n = (int)n,
                       .samples = (int)K,
                       .batch = (int)batch,
                       .gc = lh_gen_defaults()};
  ec.gc.sample.temperature = (float)temperature;
  ec.gc.sample.top_p = (float)top_p;
  ec.gc.seed = seed;
  ec.gc.max_new = (int)max_new;
  if (lh_eval_create(env, &ec, &s.ev)) {
    rc = lh__cli_error(CMD, LH__EXIT_FAIL, "%s: %s", env_spec, lh_last_error());
    goto out;
  }
  s.n = lh_eval_config_of(s.ev)->n;
  s.ks[s.n_ks++] = 1;
  for (int k = 2; k < K && s.n_ks < MAX_KS - 1; k *= 2)
    s.ks[s.n_ks++] = k;
  if (K > 1) s.ks[s.n_ks++] = (int)K;

  /* every model is checked before any generates */
  if (lh_eval_check_model(s.ev, dir, NULL) || (dir2 && lh_eval_check_model(s.ev, dir2, NULL))) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  if ((rc = run_model(&s, dir, &ra)) != LH__EXIT_OK) goto out;
  if (dir2 && (rc = run_model(&s, dir2, &rb)) != LH__EXIT_OK) goto out;
  rc = LH__EXIT_FAIL;

  char sampling[64];
  if (temperature == 0)
    snprintf(sampling, sizeof sampling, "greedy");
  else
    snprintf(sampling, sizeof sampling, "temperature %g, top-p %g", temperature, top_p);
  printf("eval %s, %s split: %d tasks x %ld sample%s (%s), max-new %ld, seed %llu\n", env_spec,
         splits[split], s.n, K, K == 1 ? "" : "s", sampling, max_new, (unsigned long long)seed);
  root = json_pack("{s:s, s:o, s:s, s:i, s:i, s:f, s:f, s:i, s:I}", "command", "eval", "env",
                   text_json(env_spec), "split", splits[split], "tasks", s.n, "samples", (int)K,
                   "temperature", temperature, "top_p", top_p, "max_new", (int)max_new, "seed",
                   (json_int_t)seed);
  set_json(&w, root, "model", report_model(&s, &ra, "model", &w));
  if (dir2) {
    set_json(&w, root, "compare", report_model(&s, &rb, "compare", &w));
    set_json(&w, root, "paired", report_paired(&s, &ra, &rb, lh_path_same(dir, dir2), &w));
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
  lh_eval_result_free(&ra.r);
  lh_eval_result_free(&rb.r);
  lh_eval_free(s.ev);
  lh_env_free(env);
  free(mdir);
  free(mdir2);
  return rc;
}
