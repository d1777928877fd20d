/* The model card: README.md of an export, with Hugging Face's front matter. Everything it says
 * is gathered first (run.json, metrics.jsonl, a serve run's ledger and manifest, the evaluation)
 * so that a bad input fails before anything is written; every outside file is size-limited and
 * every field type-checked, with messages naming the file and the field. */
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "export_impl.h"
#include "longhaul/env.h"
#include "longhaul/eval.h"
#include "longhaul/export.h"
#include "longhaul/gen.h"
#include "longhaul/ledger.h"
#include "longhaul/report.h"
#include "longhaul/sync.h"
#include "report_impl.h"

#define MAX_RUN_JSON  (1u << 20)
#define MAX_EVAL_JSON LH_REPORT_MAX_FILE
#define MAX_METRICS   ((size_t)1 << 30)
#define MAX_ROWS      16
#define PATH_MAX_TEXT 4200 /* a path and a field's name, in messages */

typedef struct {
  char name[32];
  lh_eval_ci model, base, diff;
} erow;

typedef struct {
  bool present, has_base;
  char *source; /* the eval file, or "longhaul export --eval" */
  char *env, *split, *model_dir, *base_dir;
  int tasks, samples, max_new;
  double temperature;
  long long seed;
  int n_rows;
  erow rows[MAX_ROWS];
} card_eval;

typedef struct {
  bool present;
  int64_t workers, versions, latest_version, rewinds;
  int64_t groups[LH_GROUP__COUNT];
  int n_reasons;
  lh_ledger_reason_count rejected[LH_LEDGER_TOP_REASONS];
  char manifest_hash[2 * LH_HASH_BYTES + 1];
  char trainer_key[LH_SYNC_KEY_TEXT_BYTES];
  int n_named;
  char named[8][LH_LEDGER_NAME_MAX + 64]; /* "name: T trained, R rejected" of up to 8 workers */
} card_ledger;

struct lh_card {
  char *name, *model_dir, *out_dir, *run_dir; /* run_dir NULL: a plain model directory */
  char *base_dir;                             /* run.json's base found beside the run */
  json_t *run;                                /* run.json */
  char *export_cmd;
  lh_config cfg;
  size_t n_params;
  char tokenizer[32];
  int64_t step; /* the checkpoint's step, -1 unknown */
  int64_t metric_lines, updates, groups_trained, groups_skipped;
  char first_time[40], last_time[40];
  card_ledger ledger;
  card_eval eval;
};

/* ---------------------------------------------------------------- small helpers */

static bool is_file(const char *dir, const char *name) {
  char *p = lh_path_join(dir, name);
  struct stat sb;
  bool ok = stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
  free(p);
  return ok;
}

static char *dir_name(const char *p) {
  char *c = lh_xstrdup(p), *d = lh_xstrdup(dirname(c));
  free(c);
  return d;
}

static char *base_name(const char *p) {
  size_t n = strlen(p);
  while (n > 1 && p[n - 1] == '/')
    n--;
  char *c = lh_xmalloc(n + 1);
  memcpy(c, p, n);
  c[n] = '\0';
  char *b = lh_xstrdup(basename(c));
  free(c);
  return b;
}

/* The run directory what --model named belongs to: RUN, RUN/latest, RUN/checkpoints/step-N. */
static char *find_run(const char *arg, const char *model_dir) {
  if (is_file(arg, "run.json")) return lh_xstrdup(arg);
  char *up = dir_name(arg);
  if (is_file(up, "run.json")) return up; /* RUN/latest */
  free(up);
  char *a = dir_name(model_dir), *b = dir_name(a);
  free(a);
  if (is_file(b, "run.json")) return b; /* RUN/checkpoints/step-N */
  free(b);
  return NULL;
}

static lh_err load_json(const char *path, size_t max, json_t **out) {
  char *text = NULL;
  size_t len = 0;
  lh_err e = lh_file_read(path, max, &text, &len);
  if (e) return e;
  json_error_t err;
  *out = json_loadb(text, len, 0, &err);
  free(text);
  if (!*out)
    return lh_errorf(LH_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", path, err.text, err.line);
  return LH_ERR_OK;
}

/* o[key] of the wanted type; NULL with the error set when it is missing or of another type
 * (`optional`: missing is fine, NULL with no error). */
static json_t *field(const char *what, json_t *o, const char *key, json_type type, bool optional,
                     lh_err *e) {
  static const char *const names[] = {[JSON_OBJECT] = "an object",
                                      [JSON_ARRAY] = "an array",
                                      [JSON_STRING] = "a string",
                                      [JSON_INTEGER] = "an integer",
                                      [JSON_REAL] = "a number"};
  json_t *v = json_is_object(o) ? json_object_get(o, key) : NULL;
  bool ok = v && (json_typeof(v) == type || (type == JSON_REAL && json_is_number(v)));
  if (ok || (!v && optional)) return ok ? v : NULL;
  if (!*e)
    *e = lh_errorf(LH_ERR_FORMAT, "%s: field %s: expected %s, found %s", what, key, names[type],
                   v ? lh_json_type_name(v) : "nothing");
  return NULL;
}

/* ---------------------------------------------------------------- run, metrics, ledger */

static lh_err read_metrics(lh_card *c) {
  char *path = lh_path_join(c->run_dir, "metrics.jsonl");
  FILE *f = fopen(path, "r");
  lh_err e = LH_ERR_OK;
  if (!f) goto out; /* a run stopped before its first step */
  char *buf = NULL;
  size_t cap = 0, len = 0, total = 0;
  int64_t line = 0;
  while (!e && (e = lh_file_getline(f, 1 << 20, &buf, &cap, &len)) == LH_ERR_OK && len > 0) {
    line++;
    total += len;
    if (total > MAX_METRICS) {
      e = lh_errorf(LH_ERR_LIMIT, "%s: more than %zu bytes", path, MAX_METRICS);
      break;
    }
    json_error_t err;
    json_t *o = json_loadb(buf, len, 0, &err);
    if (!json_is_object(o)) {
      e = lh_errorf(LH_ERR_FORMAT, "%s:%lld: expected a JSON object per line", path,
                    (long long)line);
      json_decref(o);
      break;
    }
    if (json_object_get(o, "kind")) { /* not an update: an eval line ("kind": "eval") */
      json_decref(o);
      continue;
    }
    c->metric_lines++;
    json_t *step = json_object_get(o, "step"), *t = json_object_get(o, "time");
    if (json_is_integer(step) && c->step < 0) c->step = json_integer_value(step);
    if (json_is_string(t)) {
      snprintf(c->last_time, sizeof c->last_time, "%s", json_string_value(t));
      if (!c->first_time[0]) snprintf(c->first_time, sizeof c->first_time, "%s", c->last_time);
    }
    /* rl lines: updates, groups_used and skipped_groups; serve lines: one update (a published
     * version) each, groups (the ledger's trained ones) of which groups_skipped had no signal */
    json_t *u = json_object_get(o, "updates"), *g = json_object_get(o, "groups_used"),
           *sk = json_object_get(o, "skipped_groups");
    if (json_is_integer(u)) {
      c->updates += json_integer_value(u);
    } else {
      c->updates++;
      g = json_object_get(o, "groups");
      sk = json_object_get(o, "groups_skipped");
    }
    if (json_is_integer(g)) c->groups_trained += json_integer_value(g);
    if (json_is_integer(sk)) c->groups_skipped += json_integer_value(sk);
    json_decref(o);
  }
  if (e == LH_ERR_LIMIT || e == LH_ERR_IO) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", lh_last_error());
    e = lh_errorf(e, "%s:%lld: %s", path, (long long)line + 1, msg);
  }
  free(buf);
  fclose(f);
out:
  free(path);
  return e;
}

static lh_err read_ledger(lh_card *c) {
  if (!is_file(c->run_dir, "ledger.sqlite")) return LH_ERR_OK;
  char *path = lh_path_join(c->run_dir, "ledger.sqlite");
  card_ledger *L = &c->ledger;
  lh_ledger *l = NULL;
  lh_ledger_stats_result st;
  lh_ledger_worker *w = NULL;
  char *man = NULL;
  size_t man_len = 0;
  int nw = 0;
  lh_err e;
  if ((e = lh_ledger_open(path, &l)) || (e = lh_ledger_stats(l, &st)) ||
      (e = lh_ledger_workers(l, &w, &nw)))
    goto out;
  L->present = true;
  L->workers = st.workers;
  L->versions = st.versions;
  L->latest_version = st.latest_version;
  L->rewinds = st.rewinds;
  memcpy(L->groups, st.groups, sizeof L->groups);
  L->n_reasons = st.n_reasons;
  memcpy(L->rejected, st.rejected, sizeof L->rejected);
  for (int i = 0; i < nw && L->n_named < 8; i++)
    snprintf(L->named[L->n_named++], sizeof L->named[0],
             "%s: %lld groups trained, %lld rejected, %lld dropped as stale", w[i].name,
             (long long)w[i].groups[LH_GROUP_TRAINED], (long long)w[i].groups[LH_GROUP_REJECTED],
             (long long)w[i].groups[LH_GROUP_DROPPED]);
  if (st.latest_version >= 0) {
    if ((e = lh_ledger_version_get(l, st.latest_version, &man, &man_len))) goto out;
    uint8_t h[LH_HASH_BYTES];
    lh_hash256(man, man_len, h);
    lh_hash_hex(h, L->manifest_hash);
    /* the trainer's key is the manifest's signer, and the signature must hold under it */
    lh_sync_manifest m;
    char what[64];
    snprintf(what, sizeof what, "ledger manifest of version %lld", (long long)st.latest_version);
    if ((e = lh_sync_manifest_parse(man, man_len, what, &m)) ||
        (e = lh_sync_manifest_verify(man, man_len, &m.key, what, &m)))
      goto out;
    lh_sync_public_key_text(&m.key, L->trainer_key);
  }
out:
  free(man);
  free(w);
  lh_ledger_close(l);
  free(path);
  return e;
}

/* ---------------------------------------------------------------- evaluation */

static lh_eval_ci ci_from(lh_report_ci c) {
  return (lh_eval_ci){c.mean, c.lo, c.hi, c.tasks};
}

/* Reads an `eval --json` file's text into ev (what the table shows) through the report's reader,
 * the one reader of eval files; `path` names it. The card also needs the sampling settings, and a
 * "compare" block needs its "paired" one with the same k. */
static lh_err parse_eval(const char *text, size_t len, const char *path, card_eval *ev) {
  lh_report_eval r;
  lh_err e = lh_report_eval_parse(text, len, path, &r);
  if (e) return e;
  const lh_report_eval_block *m = &r.model, *cb = &r.compare, *pb = &r.paired;
  if (!r.has_sampling)
    e = lh_errorf(LH_ERR_FORMAT,
                  "%s: \"max_new\", \"temperature\" and \"seed\" are missing "
                  "(an `eval --json` file has them)",
                  path);
  else if (cb->present && !pb->present)
    e = lh_errorf(LH_ERR_FORMAT, "%s: \"compare\" without \"paired\"", path);
  for (int i = 0; !e && cb->present && i < m->n_k; i++)
    if (cb->n_k != m->n_k || pb->n_k != m->n_k || cb->k[i] != m->k[i] || pb->k[i] != m->k[i])
      e = lh_errorf(LH_ERR_FORMAT,
                    "%s: \"model\", \"compare\" and \"paired\": expected the same k in "
                    "pass_at_k",
                    path);
  if (e) goto out;
  ev->present = true;
  ev->source = lh_xstrdup(path);
  ev->env = lh_xstrdup(r.env);
  ev->split = lh_xstrdup(r.split);
  ev->model_dir = lh_xstrdup(m->dir);
  ev->tasks = r.tasks;
  ev->samples = r.samples;
  ev->max_new = r.max_new;
  ev->temperature = r.temperature;
  ev->seed = r.seed;
  ev->has_base = cb->present;
  if (cb->present) ev->base_dir = lh_xstrdup(cb->dir);
  /* pass@k rows in increasing k (as read), then the mean reward */
  int nk = m->n_k < MAX_ROWS - 1 ? m->n_k : MAX_ROWS - 1;
  for (int i = 0; i <= nk; i++) {
    erow *row = &ev->rows[ev->n_rows++];
    bool reward = i == nk;
    if (reward)
      snprintf(row->name, sizeof row->name, "mean reward");
    else
      snprintf(row->name, sizeof row->name, "pass@%d", m->k[i]);
    row->model = ci_from(reward ? m->mean_reward : m->pass[i]);
    if (cb->present) {
      row->base = ci_from(reward ? cb->mean_reward : cb->pass[i]);
      row->diff = ci_from(reward ? pb->mean_reward : pb->pass[i]);
    }
  }
out:
  lh_report_eval_free(&r);
  return e;
}

static void eval_clear(card_eval *ev) {
  free(ev->source);
  free(ev->env);
  free(ev->split);
  free(ev->model_dir);
  free(ev->base_dir);
  memset(ev, 0, sizeof *ev);
}

static lh_err read_eval_json(const char *path, card_eval *ev) {
  char *text = NULL;
  size_t len = 0;
  lh_err e = lh_file_read(path, MAX_EVAL_JSON, &text, &len);
  if (!e) e = parse_eval(text, len, path, ev);
  free(text);
  return e;
}

lh_err lh_card_eval_check(const char *json, size_t len, const char *what, int *rows) {
  card_eval ev = {0};
  lh_err e = parse_eval(json, len, what, &ev);
  if (rows) *rows = e ? 0 : ev.n_rows;
  eval_clear(&ev);
  return e;
}

/* --eval SPEC: greedy pass@1 of the model and of the base on the same tasks. */
static lh_err run_eval(lh_card *c, const char *spec, int n, const char *base) {
  card_eval *ev = &c->eval;
  lh_env_config ecfg;
  lh_env *env = NULL;
  lh_eval *e_ = NULL;
  lh_eval_result ra = {0}, rb = {0};
  lh_err e;
  if ((e = lh_env_config_parse(spec, &ecfg)) || (e = lh_env_create(&ecfg, &env))) goto out;
  json_t *mn = c->run ? json_object_get(c->run, "max_new") : NULL;
  lh_eval_config cfg = {
      .split = LH_SPLIT_TEST, .n = n, .samples = 1, .batch = 64, .gc = lh_gen_defaults()};
  cfg.gc.sample.temperature = 0;
  cfg.gc.max_new = json_is_integer(mn) ? (int)json_integer_value(mn) : 64;
  if ((e = lh_eval_create(env, &cfg, &e_))) goto out;
  fprintf(stderr, "export: evaluating %s on %s (%d tasks, greedy)\n", c->model_dir, spec,
          lh_eval_config_of(e_)->n);
  if ((e = lh_eval_run_dir(e_, c->model_dir, NULL, NULL, &ra))) goto out;
  if (base) {
    fprintf(stderr, "export: evaluating the base %s\n", base);
    if ((e = lh_eval_run_dir(e_, base, NULL, NULL, &rb))) goto out;
  }
  ev->present = true;
  ev->has_base = base != NULL;
  ev->source = lh_xstrdup("longhaul export --eval");
  ev->env = lh_xstrdup(spec);
  ev->split = lh_xstrdup("test");
  ev->model_dir = lh_xstrdup(c->model_dir);
  ev->base_dir = base ? lh_xstrdup(base) : NULL;
  ev->tasks = lh_eval_config_of(e_)->n;
  ev->samples = 1;
  ev->max_new = cfg.gc.max_new;
  for (int i = 0; i < 2; i++) {
    erow *r = &ev->rows[ev->n_rows++];
    int k = i == 0 ? 1 : 0;
    snprintf(r->name, sizeof r->name, "%s", k ? "pass@1" : "mean reward");
    r->model = lh_eval_stat(e_, &ra, NULL, NULL, k);
    if (base) {
      r->base = lh_eval_stat(e_, &rb, NULL, NULL, k);
      r->diff = lh_eval_stat(e_, &ra, &rb, NULL, k);
    }
  }
out:
  lh_eval_result_free(&ra);
  lh_eval_result_free(&rb);
  lh_eval_free(e_);
  lh_env_free(env);
  return e;
}

/* ---------------------------------------------------------------- gathering */

static char *join_argv(int argc, char **argv) {
  size_t n = strlen("longhaul") + 1;
  for (int i = 0; i < argc; i++)
    n += strlen(argv[i]) + 3;
  char *s = lh_xmalloc(n + 1), *p = s;
  p += sprintf(p, "longhaul");
  for (int i = 0; i < argc; i++)
    p += sprintf(p, strpbrk(argv[i], " \t'\"$") ? " '%s'" : " %s", argv[i]);
  return s;
}

lh_err lh_card_gather(const lh_card_opts *o, lh_card **out) {
  *out = NULL;
  lh_card *c = lh_xcalloc(1, sizeof *c);
  c->step = -1;
  c->model_dir = lh_xstrdup(o->model_dir);
  c->out_dir = lh_xstrdup(o->out_dir);
  c->run_dir = find_run(o->model_arg, o->model_dir);
  c->export_cmd = join_argv(o->argc, o->argv);
  c->name = base_name(c->run_dir ? c->run_dir : o->model_dir);
  lh_err e = lh_model_check(o->model_dir, &c->cfg);
  if (e) goto out;
  c->n_params = lh_config_n_params(&c->cfg);
  lh_tokenizer *tok = NULL;
  if ((e = lh__export_tokenizer(o->model_dir, &tok))) goto out;
  snprintf(c->tokenizer, sizeof c->tokenizer, "%s",
           !lh_tokenizer_byte_level(tok) ? "the built-in characters"
                                         : lh_tokenizer_pretokenizer(tok));
  lh_tokenizer_free(tok);
  char *b = base_name(o->model_dir);
  long long step;
  if (sscanf(b, "step-%lld", &step) == 1) c->step = step;
  free(b);
  const char *base = NULL;
  if (c->run_dir) {
    char *rj = lh_path_join(c->run_dir, "run.json");
    e = load_json(rj, MAX_RUN_JSON, &c->run);
    json_t *m = e ? NULL : field(rj, c->run, "model", JSON_STRING, false, &e);
    if (!e) field(rj, c->run, "env", JSON_STRING, false, &e);
    if (!e) field(rj, c->run, "command", JSON_STRING, true, &e);
    free(rj);
    if (e) goto out;
    base = json_string_value(m);
    /* a relative base was named from where the run started; try beside the run too */
    struct stat sb;
    if (base[0] != '/' && stat(base, &sb) != 0) {
      char *up = dir_name(c->run_dir);
      c->base_dir = lh_path_join(up, base);
      free(up);
      if (stat(c->base_dir, &sb) == 0) base = c->base_dir;
    }
    int64_t step_dir = c->step;
    c->step = -1;
    if ((e = read_metrics(c)) || (e = read_ledger(c))) goto out;
    c->step = step_dir;
  }
  if (o->eval_json)
    e = read_eval_json(o->eval_json, &c->eval);
  else if (o->eval_spec)
    e = run_eval(c, o->eval_spec, o->eval_n, base);
out:
  if (e) {
    lh_card_free(c);
    return e;
  }
  *out = c;
  return LH_ERR_OK;
}

const char *lh_card_name(const lh_card *c) {
  return c->name;
}

void lh_card_free(lh_card *c) {
  if (!c) return;
  eval_clear(&c->eval);
  json_decref(c->run);
  free(c->name);
  free(c->model_dir);
  free(c->out_dir);
  free(c->run_dir);
  free(c->base_dir);
  free(c->export_cmd);
  free(c);
}

/* ---------------------------------------------------------------- writing */

static const char *str_of(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

/* A run.json value as text ("-" when absent). */
static void run_value(lh__sb *b, json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (json_is_string(v))
    lh__sb_printf(b, "`%s`", json_string_value(v));
  else if (json_is_integer(v))
    lh__sb_printf(b, "%lld", (long long)json_integer_value(v));
  else if (json_is_real(v))
    lh__sb_printf(b, "%.6g", json_real_value(v));
  else if (json_is_boolean(v))
    lh__sb_printf(b, "%s", json_is_true(v) ? "true" : "false");
  else
    lh__sb_printf(b, "-");
}

static void ci_cell(lh__sb *b, lh_eval_ci c, bool diff) {
  lh__sb_printf(b, diff ? "%+.3f [%+.3f, %+.3f]" : "%.3f [%.3f, %.3f]", c.mean, c.lo, c.hi);
}

static const char *arch_label(lh_arch a) {
  return a == LH_ARCH_QWEN2 ? "Qwen2" : a == LH_ARCH_QWEN3 ? "Qwen3" : "Llama";
}

lh_err lh_card_write(const lh_card *c, const char *gguf_file, const char *path) {
  lh__sb b = {0};
  json_t *run = c->run, *loss = run ? json_object_get(run, "loss") : NULL,
         *adv = run ? json_object_get(run, "adv") : NULL,
         *opt = run ? json_object_get(run, "opt") : NULL;
  const char *base = run ? str_of(run, "model") : NULL, *env = run ? str_of(run, "env") : NULL;
  char env_name[64] = "";
  if (env) sscanf(env, "%63[^:]", env_name);
  const char *loss_kind = loss ? str_of(loss, "kind") : NULL;
  bool serve = c->ledger.present;
  /* front matter */
  lh__sb_printf(
      &b, "---\nlicense: other\nlicense_name: same-as-base-model\nlibrary_name: transformers\n"
          "pipeline_tag: text-generation\n");
  if (base) lh__sb_printf(&b, "base_model: \"%s\"\n", base);
  lh__sb_printf(&b, "tags:\n- longhaul\n- reinforcement-learning\n- %s\n", arch_label(c->cfg.arch));
  if (env_name[0]) lh__sb_printf(&b, "- %s\n", env_name);
  if (loss_kind) lh__sb_printf(&b, "- %s\n", loss_kind);
  if (gguf_file) lh__sb_printf(&b, "- gguf\n");
  lh__sb_printf(&b, "---\n\n# %s\n\n", c->name);
  if (run)
    lh__sb_printf(
        &b,
        "A %s model post-trained with reinforcement learning by longhaul (`%s`) on the `%s` "
        "environment, from the base model `%s`%s.\n\n",
        arch_label(c->cfg.arch), serve ? "longhaul serve" : "longhaul rl", env, base,
        c->step >= 0 ? "" : "");
  else
    lh__sb_printf(&b,
                  "A %s model exported by longhaul from the model directory `%s` (not a run "
                  "directory, so no recipe or training provenance is known).\n\n",
                  arch_label(c->cfg.arch), c->model_dir);

  lh__sb_printf(
      &b,
      "## Files\n\n| file | what |\n|---|---|\n"
      "| `config.json`, `model.safetensors` (or shards with `model.safetensors.index.json`)"
      " | the weights in bf16, Hugging Face layout (`%sForCausalLM`) |\n"
      "| `tokenizer.json`, `tokenizer_config.json` | the tokenizer (%s), special tokens%s |\n"
      "| `generation_config.json` | bos/eos ids |\n",
      arch_label(c->cfg.arch), c->tokenizer, "");
  if (gguf_file) lh__sb_printf(&b, "| `%s` | the same model as GGUF, for llama.cpp |\n", gguf_file);
  lh__sb_printf(&b,
                "\n## Model\n\n| | |\n|---|---|\n| architecture | %s |\n| parameters | %.2fM |\n"
                "| layers | %d |\n| hidden size | %d |\n| attention heads (kv) | %d (%d) |\n"
                "| context | %d |\n| vocabulary | %d |\n| exported from | `%s`%s |\n\n",
                arch_label(c->cfg.arch), (double)c->n_params / 1e6, c->cfg.n_layers,
                c->cfg.hidden_size, c->cfg.n_heads, c->cfg.n_kv_heads, c->cfg.max_positions,
                c->cfg.vocab_size, c->model_dir, c->step >= 0 ? " (checkpoint step)" : "");

  if (run) {
    lh__sb_printf(
        &b, "## Environment and recipe\n\nFrom `%s/run.json`:\n\n| setting | value |\n|---|---|\n",
        c->run_dir);
    static const char *const top[] = {
        "model",     "env",         "group", "prompts",          "max_new", "max_prompt",
        "staleness", "minibatches", "seed",  "longhaul_version", "started"};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
      if (json_object_get(run, top[i])) {
        lh__sb_printf(&b, "| %s | ", top[i]);
        run_value(&b, run, top[i]);
        lh__sb_printf(&b, " |\n");
      }
    json_t *groups[3] = {loss, adv, opt};
    const char *gname[3] = {"loss", "adv", "opt"};
    for (int g = 0; g < 3; g++) {
      const char *key;
      json_t *v;
      if (json_is_object(groups[g])) json_object_foreach(groups[g], key, v) {
          lh__sb_printf(&b, "| %s.%s | ", gname[g], key);
          run_value(&b, groups[g], key);
          lh__sb_printf(&b, " |\n");
        }
    }
    lh__sb_printf(&b, "\n## Training provenance\n\n");
    lh__sb_printf(&b, "- updates: %lld (%lld metrics lines", (long long)c->updates,
                  (long long)c->metric_lines);
    if (c->first_time[0]) lh__sb_printf(&b, ", %s to %s", c->first_time, c->last_time);
    lh__sb_printf(&b, ")\n");
    json_t *group = json_object_get(run, "group");
    long long per = json_is_integer(group) ? json_integer_value(group) : 0;
    lh__sb_printf(&b, "- prompt groups trained: %lld", (long long)c->groups_trained);
    if (per > 0)
      lh__sb_printf(&b, " (%lld rollouts of %lld per group)", c->groups_trained * per, per);
    if (c->groups_skipped > 0)
      lh__sb_printf(&b,
                    serve ? "; %lld of them had equal rewards (no learning signal)"
                          : "; %lld more had equal rewards (no learning signal) and were skipped",
                    (long long)c->groups_skipped);
    lh__sb_printf(&b, "\n");
    if (c->step >= 0) lh__sb_printf(&b, "- exported checkpoint: step %lld\n", (long long)c->step);
    if (serve) {
      const card_ledger *L = &c->ledger;
      lh__sb_printf(&b, "- networked run (`longhaul serve`), from the ledger `%s/ledger.sqlite`:\n",
                    c->run_dir);
      lh__sb_printf(&b, "  - workers: %lld\n", (long long)L->workers);
      for (int i = 0; i < L->n_named; i++)
        lh__sb_printf(&b, "    - %s\n", L->named[i]);
      lh__sb_printf(
          &b,
          "  - groups: %lld trained, %lld rejected, %lld dropped as too stale, %lld expired, "
          "%lld waiting\n",
          (long long)L->groups[LH_GROUP_TRAINED], (long long)L->groups[LH_GROUP_REJECTED],
          (long long)L->groups[LH_GROUP_DROPPED], (long long)L->groups[LH_GROUP_EXPIRED],
          (long long)(L->groups[LH_GROUP_ACCEPTED] + L->groups[LH_GROUP_LEASED]));
      if (L->n_reasons) {
        lh__sb_printf(&b, "  - rejected groups by reason:\n");
        for (int i = 0; i < L->n_reasons; i++)
          lh__sb_printf(&b, "    - `%s`: %lld\n", L->rejected[i].reason,
                        (long long)L->rejected[i].count);
      }
      lh__sb_printf(
          &b,
          "  - published versions: %lld (latest %lld); server starts: %lld (each resumes from the "
          "newest checkpoint)\n",
          (long long)L->versions, (long long)L->latest_version, (long long)L->rewinds);
      if (L->manifest_hash[0])
        lh__sb_printf(
            &b,
            "  - last manifest (version %lld): BLAKE2b-256 `%s`\n  - trainer's public key "
            "(the manifest's signer; its signature verifies): `%s`\n",
            (long long)L->latest_version, L->manifest_hash, L->trainer_key);
    }
    lh__sb_printf(&b, "\n");
  }

  lh__sb_printf(&b, "## Evaluation\n\n");
  const card_eval *ev = &c->eval;
  if (!ev->present) {
    lh__sb_printf(
        &b, "No evaluation was given to the export (`--eval-json FILE` or `--eval SPEC`).\n\n");
  } else {
    lh__sb_printf(
        &b, "`%s`, %s split, %d tasks x %d sample%s (%s), max-new %d, seed %lld; from %s.\n\n",
        ev->env, ev->split, ev->tasks, ev->samples, ev->samples == 1 ? "" : "s",
        ev->temperature == 0 ? "greedy" : "sampled", ev->max_new, ev->seed, ev->source);
    if (ev->has_base) {
      lh__sb_printf(&b,
                    "| metric | base `%s` | this model | difference (paired, 95%% interval) |\n"
                    "|---|---|---|---|\n",
                    ev->base_dir);
      for (int i = 0; i < ev->n_rows; i++) {
        lh__sb_printf(&b, "| %s | ", ev->rows[i].name);
        ci_cell(&b, ev->rows[i].base, false);
        lh__sb_printf(&b, " | ");
        ci_cell(&b, ev->rows[i].model, false);
        lh__sb_printf(&b, " | ");
        ci_cell(&b, ev->rows[i].diff, true);
        lh__sb_printf(&b, " |\n");
      }
      lh__sb_printf(&b,
                    "\nEach cell is the mean with its 95%% interval (Wilson for 0/1 values, else "
                    "normal); the difference is paired over the same tasks and sampler streams "
                    "(longhaul docs/ALGORITHMS.md, \"Evaluation\").\n\n");
    } else {
      lh__sb_printf(&b, "| metric | this model |\n|---|---|\n");
      for (int i = 0; i < ev->n_rows; i++) {
        lh__sb_printf(&b, "| %s | ", ev->rows[i].name);
        ci_cell(&b, ev->rows[i].model, false);
        lh__sb_printf(&b, " |\n");
      }
      lh__sb_printf(
          &b, "\nNo base model was evaluated beside it (`eval --compare BASE`), so there is no "
              "paired difference.\n\n");
    }
    if (strcmp(ev->model_dir, c->model_dir))
      lh__sb_printf(&b, "The evaluated model was `%s`; the exported one is `%s`.\n\n",
                    ev->model_dir, c->model_dir);
  }

  lh__sb_printf(&b, "## How to reproduce\n\n```\n");
  if (run && str_of(run, "command")) lh__sb_printf(&b, "%s\n", str_of(run, "command"));
  if (ev->present && strcmp(ev->source, "longhaul export --eval"))
    lh__sb_printf(&b,
                  "longhaul eval --model %s --env '%s' --split %s --n %d --samples %d --max-new %d "
                  "--seed %lld%s%s --json %s\n",
                  ev->model_dir, ev->env, ev->split, ev->tasks, ev->samples, ev->max_new, ev->seed,
                  ev->has_base ? " --compare " : "", ev->has_base ? ev->base_dir : "", ev->source);
  lh__sb_printf(&b, "%s\n```\n\n", c->export_cmd);

  lh__sb_printf(&b, "## How to run\n\n");
  if (gguf_file)
    lh__sb_printf(&b,
                  "llama.cpp:\n\n```\nllama-cli -m %s -p \"...\" -n 64 --temp 0\n```\n\n"
                  "node-llama-cpp (the build longhaul's tests load it with):\n\n```\n"
                  "npx -y node-llama-cpp@3.21.1 chat --model %s\n```\n\n",
                  gguf_file, gguf_file);
  lh__sb_printf(&b,
                "transformers:\n\n```python\nfrom transformers import AutoModelForCausalLM, "
                "AutoTokenizer\ntok = AutoTokenizer.from_pretrained(\"%s\")\nmodel = "
                "AutoModelForCausalLM.from_pretrained(\"%s\")\n```\n\nlonghaul:\n\n```\nlonghaul "
                "generate --model %s --prompt \"...\" --temperature 0\n```\n\n",
                c->out_dir, c->out_dir, c->out_dir);

  lh__sb_printf(&b, "## Limitations\n\n");
  if (run)
    lh__sb_printf(
        &b,
        "- Trained on one environment (`%s`) with a verifiable reward; nothing here says how "
        "it does elsewhere, and it may have learned the reward's blind spots.\n",
        env);
  lh__sb_printf(&b,
                "- The evaluation above is on %s; its intervals are statistical (95%%), not a "
                "guarantee, and a different split, sampling or prompt format can change it.\n",
                ev->present ? "the tasks it names" : "nothing (none was given)");
  lh__sb_printf(
      &b, "- The weights are the bf16 policy. A q8_0 or f16 GGUF rounds them further, and "
          "llama.cpp rounds activations to the weights' type (f16, bf16), so only an f32 GGUF "
          "continues prompts exactly as longhaul does.\n"
          "- llama.cpp applies no Unicode normalizer: with a tokenizer that NFC-normalizes "
          "(Qwen's), text that is not NFC tokenizes differently in the GGUF.\n"
          "- The GGUF does not add a bos token (as longhaul and this tokenizer_config.json do "
          "not): prompts spell any they need.\n");
  if (c->n_params < 100000000)
    lh__sb_printf(&b,
                  "- A small model (%.2fM parameters): a demonstration of the pipeline, not a "
                  "general-purpose assistant.\n",
                  (double)c->n_params / 1e6);
  lh_err e = lh_file_write_atomic(path, b.s, b.len);
  lh__sb_free(&b);
  return e;
}
