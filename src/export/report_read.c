/* longhaul report: the readers of outside bytes the report draws from, metrics.jsonl and
 * `eval --json` output (report.h). Every line and field is checked; an error names the file,
 * the line or field, what was expected and what was found. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/report.h"

const char *const lh_report_key_names[LH_REPORT__COUNT] = {
    "reward_mean", "accuracy", "entropy", "kl_mu_pi", "kl_loss", "clip_frac", "staleness", "loss"};
/* serve's names where they differ from rl's */
static const char *const alt_names[LH_REPORT__COUNT] = {"reward"};

/* ---------------------------------------------------------------- metrics.jsonl */

void lh_report_metrics_free(lh_report_metrics *m) {
  if (!m) return;
  free(m->step);
  for (int k = 0; k < LH_REPORT__COUNT; k++)
    free(m->v[k]);
  free(m->eval_step);
  free(m->eval_pass1);
  free(m->eval_lo);
  free(m->eval_hi);
  free(m->eval_tasks);
  memset(m, 0, sizeof *m);
}

/* Room for one more update line (cap doubles). */
static void grow_updates(lh_report_metrics *m, int *cap) {
  if (m->n < *cap) return;
  *cap = *cap ? 2 * *cap : 64;
  m->step = lh_xrealloc(m->step, (size_t)*cap * sizeof *m->step);
  for (int k = 0; k < LH_REPORT__COUNT; k++)
    m->v[k] = lh_xrealloc(m->v[k], (size_t)*cap * sizeof *m->v[k]);
}

static void grow_evals(lh_report_metrics *m, int *cap) {
  if (m->n_eval < *cap) return;
  *cap = *cap ? 2 * *cap : 16;
  m->eval_step = lh_xrealloc(m->eval_step, (size_t)*cap * sizeof *m->eval_step);
  m->eval_pass1 = lh_xrealloc(m->eval_pass1, (size_t)*cap * sizeof *m->eval_pass1);
  m->eval_lo = lh_xrealloc(m->eval_lo, (size_t)*cap * sizeof *m->eval_lo);
  m->eval_hi = lh_xrealloc(m->eval_hi, (size_t)*cap * sizeof *m->eval_hi);
  m->eval_tasks = lh_xrealloc(m->eval_tasks, (size_t)*cap * sizeof *m->eval_tasks);
}

/* A number in [lo, hi] under key (NAN for null when null_ok); *bad set on anything else. */
static double number(const json_t *o, const char *key, bool null_ok, double lo, double hi,
                     const char *name, long line, lh_err *bad) {
  json_t *v = json_object_get(o, key);
  if (*bad) return NAN;
  if (!v) {
    *bad = lh_errorf(LH_ERR_FORMAT, "%s:%ld: \"%s\" is missing", name, line, key);
    return NAN;
  }
  if (json_is_null(v) && null_ok) return NAN;
  double x = json_is_number(v) ? json_number_value(v) : NAN;
  if (!json_is_number(v) || !(x >= lo && x <= hi))
    *bad = json_is_number(v)
               ? lh_errorf(LH_ERR_FORMAT, "%s:%ld: \"%s\": expected a number in [%g, %g], found %g",
                           name, line, key, lo, hi, x)
               : lh_errorf(LH_ERR_FORMAT, "%s:%ld: \"%s\": expected a number%s, found %s", name,
                           line, key, null_ok ? " or null" : "", lh_json_type_name(v));
  return x;
}

/* "step" of a line: an integer >= min. */
static int64_t step_of(const json_t *o, int64_t min, const char *name, long line, lh_err *bad) {
  json_t *v = json_object_get(o, "step");
  if (!json_is_integer(v) || json_integer_value(v) < min) {
    char found[64];
    if (json_is_integer(v))
      snprintf(found, sizeof found, "%lld", (long long)json_integer_value(v));
    else
      snprintf(found, sizeof found, "%s", v ? lh_json_type_name(v) : "nothing");
    *bad = lh_errorf(LH_ERR_FORMAT, "%s:%ld: \"step\": expected an integer >= %lld, found %s", name,
                     line, (long long)min, found);
    return -1;
  }
  return json_integer_value(v);
}

static lh_err eval_line(lh_report_metrics *m, int *cap, const json_t *o, const char *name,
                        long line) {
  lh_err e = LH_ERR_OK;
  int64_t step = step_of(o, 0, name, line, &e);
  double p = number(o, "eval_pass1", false, 0, 1, name, line, &e);
  double lo = number(o, "eval_lo", false, 0, 1, name, line, &e);
  double hi = number(o, "eval_hi", false, 0, 1, name, line, &e);
  double tasks = number(o, "eval_tasks", false, 1, 1e9, name, line, &e);
  if (e) return e;
  if (!(lo <= p && p <= hi))
    return lh_errorf(LH_ERR_FORMAT,
                     "%s:%ld: expected eval_lo <= eval_pass1 <= eval_hi, found %g, %g, %g", name,
                     line, lo, p, hi);
  if (tasks != floor(tasks))
    return lh_errorf(LH_ERR_FORMAT, "%s:%ld: \"eval_tasks\": expected an integer, found %g", name,
                     line, tasks);
  if (m->n_eval > 0 && (double)step < m->eval_step[m->n_eval - 1])
    return lh_errorf(LH_ERR_FORMAT,
                     "%s:%ld: eval at step %lld after one at step %.0f: expected "
                     "steps in order",
                     name, line, (long long)step, m->eval_step[m->n_eval - 1]);
  grow_evals(m, cap);
  m->eval_step[m->n_eval] = (double)step;
  m->eval_pass1[m->n_eval] = p;
  m->eval_lo[m->n_eval] = lo;
  m->eval_hi[m->n_eval] = hi;
  m->eval_tasks[m->n_eval] = (int)tasks;
  m->n_eval++;
  return LH_ERR_OK;
}

static lh_err update_line(lh_report_metrics *m, int *cap, const json_t *o, const char *name,
                          long line) {
  lh_err e = LH_ERR_OK;
  int64_t step = step_of(o, 1, name, line, &e);
  if (e) return e;
  if (m->n > 0 && (double)step <= m->step[m->n - 1])
    return lh_errorf(LH_ERR_FORMAT, "%s:%ld: step %lld after step %.0f: expected increasing steps",
                     name, line, (long long)step, m->step[m->n - 1]);
  double v[LH_REPORT__COUNT];
  for (int k = 0; k < LH_REPORT__COUNT; k++) {
    const char *key = lh_report_key_names[k];
    if (!json_object_get(o, key) && alt_names[k]) key = alt_names[k];
    v[k] =
        json_object_get(o, key) ? number(o, key, true, -INFINITY, INFINITY, name, line, &e) : NAN;
  }
  if (e) return e;
  grow_updates(m, cap);
  m->step[m->n] = (double)step;
  for (int k = 0; k < LH_REPORT__COUNT; k++) {
    m->v[k][m->n] = v[k];
    m->present[k] += isfinite(v[k]) != 0;
  }
  m->n++;
  return LH_ERR_OK;
}

lh_err lh_report_metrics_parse(const char *text, size_t len, const char *name,
                               lh_report_metrics *m) {
  memset(m, 0, sizeof *m);
  if (len > LH_REPORT_MAX_FILE)
    return lh_errorf(LH_ERR_LIMIT, "%s: %zu bytes, at most %zu", name, len, LH_REPORT_MAX_FILE);
  int cap = 0, ecap = 0;
  lh_err e = LH_ERR_OK;
  long line = 0;
  for (size_t at = 0; !e && at < len;) {
    line++;
    const char *nl = memchr(text + at, '\n', len - at);
    size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
    const char *s = text + at;
    at += n + (nl != NULL);
    if (n == 0) {
      if (at < len)
        e = lh_errorf(LH_ERR_FORMAT, "%s:%ld: an empty line: expected a JSON object", name, line);
      continue;
    }
    if (n > LH_REPORT_MAX_LINE) {
      e = lh_errorf(LH_ERR_LIMIT, "%s:%ld: %zu bytes, a line holds at most %d", name, line, n,
                    LH_REPORT_MAX_LINE);
      break;
    }
    json_error_t je;
    json_t *o = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
    if (!o && !nl) { /* a run still writing: its last line may be half there */
      lh_log(LH_LOG_WARN, "%s:%ld: the last line is incomplete (a write in progress?): left out",
             name, line);
      break;
    }
    if (!o) {
      e = lh_errorf(LH_ERR_FORMAT, "%s:%ld: column %d: expected a JSON object: %s", name, line,
                    je.column, je.text);
      break;
    }
    json_t *kind = json_object_get(o, "kind");
    if (!json_is_object(o))
      e = lh_errorf(LH_ERR_FORMAT, "%s:%ld: expected a JSON object, found %s", name, line,
                    lh_json_type_name(o));
    else if (!kind)
      e = update_line(m, &cap, o, name, line);
    else if (json_is_string(kind) && !strcmp(json_string_value(kind), "eval"))
      e = eval_line(m, &ecap, o, name, line);
    else
      e = lh_errorf(LH_ERR_FORMAT,
                    "%s:%ld: \"kind\": expected \"eval\" (or no kind: an update), found %s%s%s",
                    name, line, json_is_string(kind) ? "\"" : "",
                    json_is_string(kind) ? json_string_value(kind) : lh_json_type_name(kind),
                    json_is_string(kind) ? "\"" : "");
    json_decref(o);
  }
  if (e) lh_report_metrics_free(m);
  return e;
}

/* ---------------------------------------------------------------- eval --json */

void lh_report_eval_free(lh_report_eval *ev) {
  if (!ev) return;
  free(ev->env);
  free(ev->split);
  free(ev->model.dir);
  free(ev->compare.dir);
  free(ev->paired.dir);
  memset(ev, 0, sizeof *ev);
}

static lh_err ci_of(const json_t *o, double lo_bound, const char *name, const char *where,
                    lh_report_ci *out) {
  static const char *const keys[3] = {"mean", "lo", "hi"};
  double v[3];
  if (!json_is_object(o))
    return lh_errorf(LH_ERR_FORMAT, "%s: %s: expected an object {mean, lo, hi, tasks}, found %s",
                     name, where, o ? lh_json_type_name(o) : "nothing");
  for (int i = 0; i < 3; i++) {
    json_t *x = json_object_get(o, keys[i]);
    v[i] = json_is_number(x) ? json_number_value(x) : NAN;
    if (!(v[i] >= lo_bound && v[i] <= 1.0)) {
      char found[40];
      snprintf(found, sizeof found, "%g", v[i]);
      return lh_errorf(LH_ERR_FORMAT, "%s: %s.%s: expected a number in [%g, 1], found %s", name,
                       where, keys[i], lo_bound,
                       json_is_number(x) ? found
                       : x               ? lh_json_type_name(x)
                                         : "nothing");
    }
  }
  /* eval writes the three rounded alike; allow that rounding, no more */
  if (v[1] > v[0] + 1e-9 || v[0] > v[2] + 1e-9)
    return lh_errorf(LH_ERR_FORMAT, "%s: %s: expected lo <= mean <= hi, found %g, %g, %g", name,
                     where, v[1], v[0], v[2]);
  json_t *t = json_object_get(o, "tasks");
  if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
    return lh_errorf(LH_ERR_FORMAT, "%s: %s.tasks: expected an integer >= 0, found %s", name, where,
                     t ? lh_json_type_name(t) : "nothing");
  *out = (lh_report_ci){v[0], v[1], v[2], (int)json_integer_value(t)};
  return LH_ERR_OK;
}

static int by_k(const void *a, const void *b) {
  return *(const int *)a - *(const int *)b;
}

static lh_err block_of(const json_t *root, const char *key, const char *name,
                       lh_report_eval_block *b) {
  json_t *o = json_object_get(root, key);
  if (!o) return LH_ERR_OK;
  bool paired = !strcmp(key, "paired");
  char where[96];
  if (!json_is_object(o))
    return lh_errorf(LH_ERR_FORMAT, "%s: %s: expected an object, found %s", name, key,
                     lh_json_type_name(o));
  json_t *dir = json_object_get(o, "dir");
  if (!paired && !json_is_string(dir))
    return lh_errorf(LH_ERR_FORMAT, "%s: %s.dir: expected a string, found %s", name, key,
                     dir ? lh_json_type_name(dir) : "nothing");
  json_t *pk = json_object_get(o, "pass_at_k");
  if (!json_is_object(pk) || json_object_size(pk) < 1 || json_object_size(pk) > LH_REPORT_MAX_K)
    return lh_errorf(LH_ERR_FORMAT, "%s: %s.pass_at_k: expected an object of 1 .. %d entries", name,
                     key, LH_REPORT_MAX_K);
  /* k in increasing order, whatever the order of the keys */
  int ks[LH_REPORT_MAX_K], n = 0;
  const char *kname;
  json_t *v;
  json_object_foreach(pk, kname, v) {
    char *end;
    long k = strtol(kname, &end, 10);
    if (!kname[0] || *end || k < 1 || k > 1000000 || kname[0] == '0')
      return lh_errorf(LH_ERR_FORMAT, "%s: %s.pass_at_k: key \"%.32s\": expected k, 1 .. 1000000",
                       name, key, kname);
    ks[n++] = (int)k;
  }
  qsort(ks, (size_t)n, sizeof *ks, by_k);
  lh_err e = LH_ERR_OK;
  for (int i = 0; !e && i < n; i++) {
    char kt[16];
    snprintf(kt, sizeof kt, "%d", ks[i]);
    snprintf(where, sizeof where, "%s.pass_at_k.%s", key, kt);
    b->k[i] = ks[i];
    e = ci_of(json_object_get(pk, kt), paired ? -1.0 : 0.0, name, where, &b->pass[i]);
  }
  b->n_k = n;
  snprintf(where, sizeof where, "%s.mean_reward", key);
  if (!e)
    e = ci_of(json_object_get(o, "mean_reward"), paired ? -1.0 : 0.0, name, where, &b->mean_reward);
  if (e) return e;
  if (!paired) b->dir = lh_xstrdup(json_string_value(dir));
  b->present = 1;
  return LH_ERR_OK;
}

lh_err lh_report_eval_parse(const char *text, size_t len, const char *name, lh_report_eval *ev) {
  memset(ev, 0, sizeof *ev);
  if (len > LH_REPORT_MAX_FILE)
    return lh_errorf(LH_ERR_LIMIT, "%s: %zu bytes, at most %zu", name, len, LH_REPORT_MAX_FILE);
  /* per_task arrays make the file large; bound jansson's tree before building it */
  lh_err e = lh_json_check_cost(text, len, (size_t)1 << 20, (size_t)1 << 23, name);
  if (e) return e;
  json_error_t je;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!root)
    return lh_errorf(LH_ERR_FORMAT, "%s: line %d, column %d: expected JSON: %s", name, je.line,
                     je.column, je.text);
  json_t *cmd = json_object_get(root, "command"), *env = json_object_get(root, "env"),
         *split = json_object_get(root, "split"), *tasks = json_object_get(root, "tasks"),
         *samples = json_object_get(root, "samples");
  if (!json_is_object(root))
    e = lh_errorf(LH_ERR_FORMAT, "%s: expected a JSON object, found %s", name,
                  lh_json_type_name(root));
  else if (!json_is_string(cmd) || strcmp(json_string_value(cmd), "eval"))
    e = lh_errorf(LH_ERR_FORMAT,
                  "%s: \"command\": expected \"eval\" (the output of longhaul "
                  "eval --json)",
                  name);
  else if (!json_is_string(env) || !json_is_string(split))
    e = lh_errorf(LH_ERR_FORMAT, "%s: \"env\" and \"split\": expected strings", name);
  else if (!json_is_integer(tasks) || json_integer_value(tasks) < 1 ||
           json_integer_value(tasks) > INT32_MAX || !json_is_integer(samples) ||
           json_integer_value(samples) < 1 || json_integer_value(samples) > INT32_MAX)
    e = lh_errorf(LH_ERR_FORMAT, "%s: \"tasks\" and \"samples\": expected integers >= 1", name);
  else if (!json_object_get(root, "model"))
    e = lh_errorf(LH_ERR_FORMAT, "%s: \"model\" is missing", name);
  json_t *max_new = json_object_get(root, "max_new"), *temp = json_object_get(root, "temperature"),
         *seed = json_object_get(root, "seed");
  if (!e && (max_new || temp || seed)) {
    if (!json_is_integer(max_new) || json_integer_value(max_new) < 1 ||
        json_integer_value(max_new) > INT32_MAX || !json_is_number(temp) ||
        !(json_number_value(temp) >= 0) || !json_is_integer(seed))
      e = lh_errorf(LH_ERR_FORMAT,
                    "%s: \"max_new\", \"temperature\" and \"seed\": expected an integer >= 1, a "
                    "number >= 0 and an integer, all three or none",
                    name);
    else {
      ev->has_sampling = true;
      ev->max_new = (int)json_integer_value(max_new);
      ev->temperature = json_number_value(temp);
      ev->seed = (long long)json_integer_value(seed);
    }
  }
  if (!e) {
    ev->env = lh_xstrdup(json_string_value(env));
    ev->split = lh_xstrdup(json_string_value(split));
    ev->tasks = (int)json_integer_value(tasks);
    ev->samples = (int)json_integer_value(samples);
    if (!(e = block_of(root, "model", name, &ev->model)) &&
        !(e = block_of(root, "compare", name, &ev->compare)))
      e = block_of(root, "paired", name, &ev->paired);
  }
  json_decref(root);
  if (e) lh_report_eval_free(ev);
  return e;
}
