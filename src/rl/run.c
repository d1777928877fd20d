/* longhaul rl: the single-process loop (rl.h), a driver over the trainer (trainer.h), the rollout
 * engine (rollout.h) and the run directory (rundir.h): generate with the trainer's policy, submit,
 * step, log, checkpoint. Everything here is sequencing and bookkeeping; the work is done by the
 * library pieces, which `serve` shares. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/infer.h"
#include "longhaul/rl.h"

#define SETTINGS_FORMAT 1
/* the no-signal warning: most groups without signal over this many steps */
#define QUIET_WINDOW 20
#define QUIET_SHARE  0.9

lh_rl_run_config lh_rl_run_defaults(void) {
  lh_rl_run_config c = {0};
  lh_trainer_config t = lh_trainer_defaults();
  c.steps = 100;
  c.group = 8;
  c.prompts = 16;
  c.max_new = 32;
  c.max_prompt = 256;
  c.staleness = 0;
  c.minibatches = 1;
  c.slots = 64;
  c.save_every = 50;
  c.eval_n = 64;
  c.loss = t.loss;
  c.adv = t.adv;
  c.opt = t.opt;
  return c;
}

/* ---------------------------------------------------------------- settings (run.json) */

static json_t *settings_object(const lh_rl_run_config *c);

/* Text that is not UTF-8 is recorded with U+FFFD (lh_json_text), which is not a path any more:
 * such a setting also goes in as "KEY_bytes", its bytes in hex, which lh_rl_settings_read
 * prefers. */
static void add_raw_bytes(json_t *o, const char *key, const char *text) {
  json_t *j = lh_json_text(text, strlen(text));
  if (j && strcmp(json_string_value(j), text)) {
    size_t n = strlen(text);
    char *hex = lh_xmalloc(2 * n + 1), name[32];
    for (size_t i = 0; i < n; i++)
      snprintf(hex + 2 * i, 3, "%02x", (unsigned char)text[i]);
    snprintf(name, sizeof name, "%s_bytes", key);
    json_object_set_new(o, name, json_string(hex));
    free(hex);
  }
  json_decref(j);
}

/* The string of "KEY_bytes" (hex) put back into o as "KEY_raw" (any bytes), or NULL. */
static const char *raw_bytes(json_t *o, const char *key) {
  char name[32], raw_name[32];
  snprintf(name, sizeof name, "%s_bytes", key);
  snprintf(raw_name, sizeof raw_name, "%s_raw", key);
  json_t *h = json_object_get(o, name);
  if (!json_is_string(h)) return NULL;
  const char *hex = json_string_value(h);
  size_t n = strlen(hex) / 2;
  char *raw = lh_xmalloc(n + 1);
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1 || v == 0) {
      free(raw);
      return NULL;
    }
    raw[i] = (char)v;
  }
  raw[n] = '\0';
  json_object_set_new(o, raw_name, json_stringn_nocheck(raw, n));
  free(raw);
  return json_string_value(json_object_get(o, raw_name));
}

json_t *lh_rl_settings_json(const lh_rl_run_config *c) {
  json_t *o = settings_object(c);
  if (o) {
    json_object_set_new(o, "staleness_mix", json_integer(c->staleness_mix));
    json_object_set_new(o, "eval_every", json_integer(c->eval_every));
    json_object_set_new(o, "eval_n", json_integer(c->eval_n));
    json_t *l = json_object_get(o, "loss");
    json_object_set_new(l, "m2_tau", json_real(c->loss.m2_tau));
    json_object_set_new(l, "seq_cap", json_real(c->loss.seq_cap));
    json_object_set_new(l, "tv_delta", json_real(c->loss.tv_delta));
    json_object_set_new(l, "tv_kl", json_real(c->loss.tv_kl));
    json_object_set_new(l, "oapl_beta1", json_real(c->loss.oapl_beta1));
    json_object_set_new(l, "oapl_beta2", json_real(c->loss.oapl_beta2));
    json_object_set_new(l, "ess_lr", json_boolean(c->loss.ess_lr));
    add_raw_bytes(o, "model", c->model_dir);
    add_raw_bytes(o, "env", c->env_spec);
  }
  return o;
}

static json_t *settings_object(const lh_rl_run_config *c) {
  const lh_loss_config *l = &c->loss;
  const lh_adamw_config *o = &c->opt;
  return json_pack(
      "{s:i, s:o, s:o, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I,"
      " s:{s:s, s:f, s:f, s:f, s:f, s:f, s:b, s:f, s:s, s:f},"
      " s:{s:s, s:b, s:f},"
      " s:{s:f, s:f, s:f, s:f, s:f, s:f, s:i}}",
      "format", SETTINGS_FORMAT, "model", lh_json_text(c->model_dir, strlen(c->model_dir)), "env",
      lh_json_text(c->env_spec, strlen(c->env_spec)), "group", c->group, "prompts", c->prompts,
      "max_new", c->max_new, "max_prompt", c->max_prompt, "staleness", c->staleness, "minibatches",
      c->minibatches, "slots", c->slots, "seed", (json_int_t)c->seed, "loss", "kind",
      lh_loss_kind_names[l->kind], "eps_low", (double)l->eps_low, "eps_high", (double)l->eps_high,
      "C", (double)l->C, "lo", (double)l->lo, "hi", (double)l->hi, "prox_mask", l->prox_mask,
      "m2po_tau", (double)l->m2po_tau, "agg", lh_loss_agg_names[l->agg], "kl_beta",
      (double)l->kl_beta, "adv", "kind", lh_adv_kind_names[c->adv.kind], "std_norm",
      c->adv.std_norm, "eps", (double)c->adv.eps, "opt", "lr", (double)o->lr, "beta1",
      (double)o->beta1, "beta2", (double)o->beta2, "eps", (double)o->eps, "weight_decay",
      (double)o->weight_decay, "grad_clip", (double)o->grad_clip, "warmup_steps", o->warmup_steps);
}

/* Field readers for lh_rl_settings_read: each sets *e (once) on a missing or mistyped field. */
typedef struct reader {
  const char *what;
  lh_err e;
} reader;

static json_t *field(reader *r, const json_t *o, const char *key, const char *section) {
  json_t *v = o ? json_object_get(o, key) : NULL;
  if (!v && !r->e)
    r->e = lh_errorf(LH_ERR_FORMAT, "%s: %s%s%s is missing", r->what, section ? section : "",
                     section ? "." : "", key);
  return v;
}

static int get_int(reader *r, const json_t *o, const char *key, const char *section) {
  json_t *v = field(r, o, key, section);
  if (v && (!json_is_integer(v) || json_integer_value(v) < INT32_MIN ||
            json_integer_value(v) > INT32_MAX)) {
    if (!r->e)
      r->e = lh_errorf(LH_ERR_FORMAT, "%s: %s%s%s: expected an integer, found %s", r->what,
                       section ? section : "", section ? "." : "", key, lh_json_type_name(v));
    return 0;
  }
  return v ? (int)json_integer_value(v) : 0;
}

static float get_float(reader *r, const json_t *o, const char *key, const char *section) {
  json_t *v = field(r, o, key, section);
  if (v && !json_is_number(v)) {
    if (!r->e)
      r->e = lh_errorf(LH_ERR_FORMAT, "%s: %s.%s: expected a number, found %s", r->what, section,
                       key, lh_json_type_name(v));
    return 0;
  }
  return v ? (float)json_number_value(v) : 0;
}

static int get_name(reader *r, const json_t *o, const char *key, const char *section,
                    const char *const *names) {
  json_t *v = field(r, o, key, section);
  if (!v) return 0;
  int i = json_is_string(v) ? lh_name_index(names, json_string_value(v), key) : -1;
  if (i < 0 && !r->e)
    r->e = lh_errorf(LH_ERR_FORMAT, "%s: %s.%s: expected one of the names of %s", r->what, section,
                     key, key);
  return i < 0 ? 0 : i;
}

lh_err lh_rl_settings_read(json_t *s, const char *what, lh_rl_run_config *c) {
  reader r = {what, LH_ERR_OK};
  if (get_int(&r, s, "format", NULL) != SETTINGS_FORMAT && !r.e)
    r.e = lh_errorf(LH_ERR_UNSUPPORTED, "%s: settings format %d, this longhaul reads %d", what,
                    get_int(&r, s, "format", NULL), SETTINGS_FORMAT);
  json_t *model = field(&r, s, "model", NULL), *env = field(&r, s, "env", NULL);
  if (!r.e && (!json_is_string(model) || !json_is_string(env)))
    r.e = lh_errorf(LH_ERR_FORMAT, "%s: model and env must be strings", what);
  if (r.e) return r.e;
  c->model_dir = json_string_value(model);
  c->env_spec = json_string_value(env);
  const char *raw_model = raw_bytes(s, "model"), *raw_env = raw_bytes(s, "env");
  if (raw_model) c->model_dir = raw_model;
  if (raw_env) c->env_spec = raw_env;
  c->group = get_int(&r, s, "group", NULL);
  c->prompts = get_int(&r, s, "prompts", NULL);
  c->max_new = get_int(&r, s, "max_new", NULL);
  /* runs started before --max-prompt existed had a fixed 256 */
  c->max_prompt = json_object_get(s, "max_prompt") ? get_int(&r, s, "max_prompt", NULL) : 256;
  c->staleness = get_int(&r, s, "staleness", NULL);
  /* runs started before --staleness-mix existed had none */
  c->staleness_mix =
      json_object_get(s, "staleness_mix") ? get_int(&r, s, "staleness_mix", NULL) : 0;
  /* runs started before --eval-every existed had none */
  if (json_object_get(s, "eval_every")) c->eval_every = get_int(&r, s, "eval_every", NULL);
  if (json_object_get(s, "eval_n")) c->eval_n = get_int(&r, s, "eval_n", NULL);
  c->minibatches = get_int(&r, s, "minibatches", NULL);
  c->slots = get_int(&r, s, "slots", NULL);
  json_t *seed = field(&r, s, "seed", NULL);
  if (seed && (!json_is_integer(seed) || json_integer_value(seed) < 0) && !r.e)
    r.e = lh_errorf(LH_ERR_FORMAT, "%s: seed: expected an integer >= 0", what);
  if (seed && json_is_integer(seed)) c->seed = (uint64_t)json_integer_value(seed);
  const json_t *l = field(&r, s, "loss", NULL), *a = field(&r, s, "adv", NULL),
               *o = field(&r, s, "opt", NULL);
  if (r.e) return r.e;
  c->loss.kind = (lh_loss_kind)get_name(&r, l, "kind", "loss", lh_loss_kind_names);
  c->loss.eps_low = get_float(&r, l, "eps_low", "loss");
  c->loss.eps_high = get_float(&r, l, "eps_high", "loss");
  c->loss.C = get_float(&r, l, "C", "loss");
  c->loss.lo = get_float(&r, l, "lo", "loss");
  c->loss.hi = get_float(&r, l, "hi", "loss");
  json_t *pm = field(&r, l, "prox_mask", "loss");
  c->loss.prox_mask = pm && json_is_true(pm);
  c->loss.m2po_tau = get_float(&r, l, "m2po_tau", "loss");
  c->loss.agg = (lh_loss_agg)get_name(&r, l, "agg", "loss", lh_loss_agg_names);
  c->loss.kl_beta = get_float(&r, l, "kl_beta", "loss");
  { /* runs started before the off-policy candidates existed have their defaults */
    lh_loss_config d = lh_loss_defaults();
#define OPT(key, field)                                                                            \
  c->loss.field = json_object_get(l, key) ? get_float(&r, l, key, "loss") : d.field;
    OPT("m2_tau", m2_tau) OPT("seq_cap", seq_cap) OPT("tv_delta", tv_delta);
    OPT("tv_kl", tv_kl) OPT("oapl_beta1", oapl_beta1) OPT("oapl_beta2", oapl_beta2);
#undef OPT
    c->loss.ess_lr = json_is_true(json_object_get(l, "ess_lr"));
  }
  c->adv.kind = (lh_adv_kind)get_name(&r, a, "kind", "adv", lh_adv_kind_names);
  json_t *sn = field(&r, a, "std_norm", "adv");
  c->adv.std_norm = sn && json_is_true(sn);
  c->adv.eps = get_float(&r, a, "eps", "adv");
  c->opt.lr = get_float(&r, o, "lr", "opt");
  c->opt.beta1 = get_float(&r, o, "beta1", "opt");
  c->opt.beta2 = get_float(&r, o, "beta2", "opt");
  c->opt.eps = get_float(&r, o, "eps", "opt");
  c->opt.weight_decay = get_float(&r, o, "weight_decay", "opt");
  c->opt.grad_clip = get_float(&r, o, "grad_clip", "opt");
  c->opt.warmup_steps = get_int(&r, o, "warmup_steps", "opt");
  return r.e;
}

/* A run's settings as this longhaul records them: a run from before --staleness-mix and the
 * off-policy candidates lacks their fields, which then hold their defaults (as
 * lh_rl_settings_read reads them). */
static json_t *with_new_defaults(const json_t *was) {
  json_t *w = json_deep_copy(was), *wl = json_object_get(w, "loss");
  lh_rl_run_config d = lh_rl_run_defaults();
  d.model_dir = d.env_spec = "";
  json_t *def = lh_rl_settings_json(&d);
  const char *key;
  json_t *v;
  if (json_is_object(wl) && def) json_object_foreach(json_object_get(def, "loss"), key, v) {
      if (!json_object_get(wl, key)) json_object_set(wl, key, v);
    }
  static const char *const added[] = {"staleness_mix", "eval_every", "eval_n"};
  for (size_t i = 0; w && def && i < sizeof added / sizeof added[0]; i++)
    if (!json_object_get(w, added[i])) json_object_set(w, added[i], json_object_get(def, added[i]));
  json_decref(def);
  return w;
}

/* On resume: every setting of this invocation must be the run's. Lists all that differ. */
static lh_err settings_check(const json_t *was0, const lh_rl_run_config *c, const char *path) {
  json_t *now = lh_rl_settings_json(c), *was = with_new_defaults(was0);
  if (!now) return lh_errorf(LH_ERR_NOMEM, "cannot encode the run settings");
  char diff[2048] = "";
  const char *key;
  json_t *v;
  json_object_foreach(now, key, v) {
    json_t *w = json_object_get(was, key);
    if (!strcmp(key, "max_prompt") && !w) continue; /* older runs: 256, checked by the reader */
    if (!strcmp(key, "model") && w && json_is_string(w) &&
        lh_path_same(json_string_value(w), c->model_dir))
      continue;
    json_t *we = json_object_get(was, "env");
    if ((!strcmp(key, "env") || !strcmp(key, "env_bytes")) && json_is_string(we) &&
        lh_env_spec_same(json_string_value(we), c->env_spec))
      continue;
    if (w && json_equal(v, w)) continue;
    size_t used = strlen(diff);
    snprintf(diff + used, sizeof diff - used, "%s%s", used ? ", " : "", key);
  }
  json_decref(now);
  json_decref(was);
  if (diff[0])
    return lh_errorf(LH_ERR_MISMATCH, "%s: cannot resume with different settings (%s)", path, diff);
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- metrics */

static void set_num(json_t *o, const char *key, double v) {
  json_object_set_new(o, key, isfinite(v) ? json_real(v) : json_null());
}

static json_t *metrics_line(const lh_rl_progress *p, long gen_tokens, double lr) {
  const lh_rollout_summary *gs = &p->gen;
  const lh_trainer_step_stats *ts = &p->train;
  const lh_rl_step_stats *ss = &ts->update;
  json_t *o = json_object();
  json_object_set_new(o, "step", json_integer(p->step));
  json_object_set_new(o, "staleness", json_integer(ts->staleness));
  set_num(o, "staleness_mean", p->staleness_mean);
  set_num(o, "reward_mean", gs->reward_mean);
  set_num(o, "reward_std", gs->reward_std);
  set_num(o, "accuracy", gs->accuracy);
  set_num(o, "well_formed", gs->well_formed);
  set_num(o, "response_len", gs->response_len);
  set_num(o, "entropy", gs->entropy);
  set_num(o, "loss", ss->loss.loss);
  set_num(o, "kl_loss", ss->loss.kl_loss);
  set_num(o, "kl_mu_pi", ss->loss.kl_mu_pi);
  set_num(o, "clip_frac", ss->loss.clip_frac);
  set_num(o, "masked_frac", ss->loss.masked_frac);
  set_num(o, "ess", ss->loss.ess);
  set_num(o, "ratio_min", ss->loss.ratio_min);
  set_num(o, "ratio_mean", ss->loss.ratio_mean);
  set_num(o, "ratio_max", ss->loss.ratio_max);
  set_num(o, "grad_norm", ss->grad_norm);
  set_num(o, "lr", lr);
  json_object_set_new(o, "updates", json_integer(ss->n_updates));
  json_object_set_new(o, "nonfinite_updates", json_integer(ss->n_skipped));
  json_object_set_new(o, "groups_used", json_integer(ts->groups_used));
  json_object_set_new(o, "skipped_groups", json_integer(ts->groups_skipped));
  json_object_set_new(o, "failed_groups", json_integer(ts->groups_failed));
  json_object_set_new(o, "dropped_batches", json_integer(ts->batches_dropped));
  set_num(o, "gen_s", p->gen_s);
  set_num(o, "train_s", p->train_s);
  set_num(o, "gen_tokens_per_s", p->gen_s > 0 ? gen_tokens / p->gen_s : 0.0);
  set_num(o, "train_tokens_per_s", p->train_s > 0 ? ss->tokens / p->train_s : 0.0);
  return o;
}

json_t *lh_rl_eval_line(int64_t step, const lh_eval_heldout *h) {
  json_t *o = json_object();
  if (!o) return NULL;
  json_object_set_new(o, "kind", json_string("eval"));
  json_object_set_new(o, "step", json_integer(step));
  set_num(o, "eval_pass1", h->pass1.mean);
  set_num(o, "eval_lo", h->pass1.lo);
  set_num(o, "eval_hi", h->pass1.hi);
  json_object_set_new(o, "eval_tasks", json_integer(h->pass1.n));
  set_num(o, "eval_s", h->seconds);
  return o;
}

/* The held-out evaluation after update `step` (0: before the first), into p. */
static lh_err heldout(const lh_rl_run_config *c, lh_env *env, lh_trainer *tr,
                      const lh_tokenizer *tok, int64_t step, lh_rl_progress *p, json_t **line) {
  lh_err e = c->heldout(env, lh_trainer_policy(tr), tok, c->eval_n, c->max_new, &p->heldout);
  if (e) {
    char *why = lh_xstrdup(lh_last_error()); /* lh_errorf formats into what this returns */
    e = lh_errorf(e, "held-out evaluation at step %lld: %s", (long long)step, why);
    free(why);
    return e;
  }
  p->heldout_step = step;
  *line = lh_rl_eval_line(step, &p->heldout);
  return *line ? LH_ERR_OK
               : lh_errorf(LH_ERR_NOMEM, "step %lld: cannot encode its eval line", (long long)step);
}

/* ---------------------------------------------------------------- mixed staleness */

/* The bf16 slabs of the last K + 1 versions (version v in slot v % (K + 1)), and a scratch
 * policy with its own generator that the older ones are loaded into for generating. */
typedef struct mix {
  int K;
  size_t n;         /* parameters */
  uint16_t **slab;  /* (K + 1) */
  int64_t *version; /* (K + 1) the version in each slot, -1: none */
  int64_t first;    /* the oldest version kept since this process started */
  lh_infer *scratch;
  lh_generator *gen;
} mix;

static void mix_free(mix *x) {
  if (!x->slab) return;
  for (int i = 0; i <= x->K; i++)
    free(x->slab[i]);
  free(x->slab);
  free(x->version);
  lh_generator_free(x->gen);
  lh_infer_free(x->scratch);
  memset(x, 0, sizeof *x);
}

/* Keeps the trainer's current policy as its version. */
static void mix_keep(mix *x, lh_trainer *tr) {
  size_t n;
  const uint16_t *w = lh_infer_bf16(lh_trainer_policy(tr), &n);
  int64_t v = lh_trainer_version(tr);
  int slot = (int)(v % (x->K + 1));
  memcpy(x->slab[slot], w, n * sizeof *w);
  x->version[slot] = v;
}

static lh_err mix_create(mix *x, int K, lh_trainer *tr, int slots, int max_seq) {
  memset(x, 0, sizeof *x);
  x->K = K;
  lh_infer_bf16(lh_trainer_policy(tr), &x->n);
  x->slab = lh_xcalloc((size_t)K + 1, sizeof *x->slab);
  x->version = lh_xmalloc(((size_t)K + 1) * sizeof *x->version);
  for (int i = 0; i <= K; i++) {
    x->slab[i] = lh_xmalloc(x->n * sizeof **x->slab);
    x->version[i] = -1;
  }
  x->first = lh_trainer_version(tr);
  mix_keep(x, tr);
  lh_err e = lh_infer_from_model(lh_trainer_model(tr), &x->scratch);
  if (!e) e = lh_generator_create(x->scratch, slots, max_seq, 0, &x->gen);
  return e;
}

static int by_value(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Generation g of a mixed run: each of the P groups draws a version from the kept ones, the
 * draws are sorted, and each version generates its contiguous run of tasks and streams; every
 * part gets its behaviour log-probs under its own weights (when the loss uses them), then the
 * parts become one batch
 * (whose version is the oldest part's). *stale: the mean over groups of version - drawn. */
static lh_err mix_generate(mix *x, lh_trainer *tr, lh_generator *gen, const lh_gen_config *gc,
                           const lh_tokenizer *tok, lh_env *env, int64_t g, int P, int G,
                           uint64_t *tasks, lh_rollout_batch *out, double *stale) {
  int64_t v = lh_trainer_version(tr), lo = v - x->K > x->first ? v - x->K : x->first;
  int64_t *draw = lh_xmalloc((size_t)P * sizeof *draw);
  double sum = 0;
  for (int i = 0; i < P; i++) {
    uint32_t w[4];
    lh_philox(gc->seed, 0x6d6978ULL << 40 | (uint64_t)g, (uint64_t)i, w); /* "mix" streams */
    draw[i] = lo + (int64_t)(w[0] % (uint32_t)(v - lo + 1));
    sum += (double)(v - draw[i]);
  }
  qsort(draw, (size_t)P, sizeof *draw, by_value);
  lh_rollout_batch *parts = lh_xcalloc((size_t)P, sizeof *parts);
  const lh_rollout_batch **pp = lh_xmalloc((size_t)P * sizeof *pp);
  int n_parts = 0;
  lh_err e = LH_ERR_OK;
  for (int a = 0; !e && a < P;) {
    int b = a;
    while (b < P && draw[b] == draw[a])
      b++;
    const uint16_t *w = x->slab[draw[a] % (x->K + 1)];
    if (x->version[draw[a] % (x->K + 1)] != draw[a])
      e = lh_errorf(LH_ERR_NOTFOUND, "rl: version %lld is not kept", (long long)draw[a]);
    lh_generator *use = gen;
    if (!e && draw[a] != v) {
      use = x->gen;
      e = lh_infer_set_range(x->scratch, 0, w, x->n);
    }
    for (int i = a; i < b; i++)
      tasks[i - a] = (uint64_t)(g * P + i);
    lh_rollout_batch *part = &parts[n_parts];
    if (!e)
      e = lh_rollout_generate(use, gc, tok, env, LH_SPLIT_TRAIN, tasks, NULL, b - a, G,
                              (uint64_t)g * P * G + (uint64_t)a * G, part);
    if (!e) {
      part->version = draw[a];
      pp[n_parts++] = part;
      if (lh_loss_wants_old(lh_trainer_config_of(tr)->loss.kind))
        e = lh_trainer_recompute(tr, w, x->n, part);
    }
    a = b;
  }
  if (!e) e = lh_rollout_concat(pp, n_parts, out);
  for (int i = 0; i < P; i++)
    lh_rollout_batch_free(&parts[i]);
  free(parts);
  free(pp);
  free(draw);
  *stale = sum / P;
  return e;
}

/* ---------------------------------------------------------------- the loop */

/* A run without `latest` starts again from its model only when it has no checkpoint: otherwise
 * `latest` was lost, and which one to continue from is the user's call. */
static lh_err has_checkpoints(const lh_rundir *rd) {
  char *dir = lh_rundir_file(rd, "checkpoints"), *latest = lh_rundir_file(rd, "latest");
  DIR *d = opendir(dir);
  lh_err e = LH_ERR_OK;
  struct dirent *ent;
  while (d && !e && (ent = readdir(d))) {
    unsigned long long v;
    int used = 0;
    if (sscanf(ent->d_name, "step-%llu%n", &v, &used) == 1 && ent->d_name[used] == '\0')
      e = lh_errorf(LH_ERR_NOTFOUND,
                    "cannot resume: %s is missing, but %s holds checkpoints (%s, ...): write "
                    "the name of the one to continue from into it (echo %s > %s)",
                    latest, dir, ent->d_name, ent->d_name, latest);
  }
  if (d) closedir(d);
  free(dir);
  free(latest);
  return e;
}

/* Mean of v over [a, b), or NAN when empty. */
static double mean_of(const double *v, int64_t a, int64_t b) {
  double s = 0;
  for (int64_t i = a; i < b; i++)
    s += v[i];
  return b > a ? s / (double)(b - a) : NAN;
}

void lh_rl_result_free(lh_rl_result *r) {
  if (!r) return;
  free(r->policy_dir);
  r->policy_dir = NULL;
}

lh_err lh_rl_run(const lh_rl_run_config *c, lh_rl_result *result) {
  lh_rl_result res_local, *res = result ? result : &res_local;
  memset(res, 0, sizeof *res);
  if (c->steps < 1 || c->group < 2 || c->prompts < 1 || c->max_new < 1 || c->max_prompt < 1 ||
      c->staleness < 0 || c->staleness_mix < 0 || c->minibatches < 1 || c->slots < 1 ||
      c->save_every < 0 || c->keep < 0 || c->eval_every < 0 || (c->eval_every > 0 && c->eval_n < 1))
    return lh_errorf(LH_ERR_INVAL, "steps, prompts, max_new, max_prompt, minibatches, slots >= 1, "
                                   "group >= 2, staleness, save_every, keep, eval_every >= 0, "
                                   "eval_n >= 1 required");
  if (c->eval_every > 0 && !c->heldout)
    return lh_errorf(LH_ERR_USAGE, "eval_every %d needs the evaluator (lh_rl_run_config.heldout)",
                     c->eval_every);
  if (c->staleness > 64 || c->staleness_mix > 64)
    return lh_errorf(LH_ERR_LIMIT, "staleness %d, at most 64",
                     c->staleness > c->staleness_mix ? c->staleness : c->staleness_mix);
  if (c->staleness > 0 && c->staleness_mix > 0)
    return lh_errorf(LH_ERR_USAGE, "staleness %d and staleness_mix %d: choose one of the two modes",
                     c->staleness, c->staleness_mix);
  if (c->seed > (uint64_t)INT64_MAX) /* run.json's integers are signed 64-bit */
    return lh_errorf(LH_ERR_LIMIT, "seed %llu, at most %lld", (unsigned long long)c->seed,
                     (long long)INT64_MAX);
  lh_env_config ecfg;
  lh_env *env = NULL;
  lh_rundir *rd = NULL;
  lh_model *m = NULL;
  lh_tokenizer *tok = NULL;
  lh_trainer *tr = NULL;
  lh_generator *gen = NULL;
  mix x = {0};
  json_t *was = NULL, *eval0 = NULL;
  char *src = NULL, *tokpath = NULL;
  lh_model_files files = {0};
  double *rewards = NULL, *accs = NULL;
  uint64_t *tasks = NULL;
  int64_t step0 = 0;
  lh_err e;
  if ((e = lh_env_config_parse(c->env_spec, &ecfg)) || (e = lh_env_create(&ecfg, &env)) ||
      (e = lh_rundir_open(c->out_dir, c->resume ? LH_RUNDIR_RESUME : LH_RUNDIR_CREATE, &rd)))
    goto out;
  { /* an empty train split (a jsonl whose items all fall in test) would run every step on
     * nothing and write the model unchanged */
    lh_env_task probe;
    if (lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &probe) == LH_ERR_NOTFOUND) {
      e = lh_errorf(LH_ERR_INVAL, "--env %s has no train tasks", c->env_spec);
      goto out;
    }
    lh_env_task_clear(&probe);
  }
  if (c->resume) {
    char *path = lh_rundir_file(rd, "run.json");
    if (!(e = lh_rundir_read_settings(rd, &was))) e = settings_check(was, c, path);
    free(path);
    if (e) goto out;
    e = lh_rundir_latest(c->out_dir, &step0, &src);
    if (e == LH_ERR_NOTFOUND) { /* stopped before its first checkpoint: start it again */
      step0 = 0;
      e = has_checkpoints(rd);
    }
    if (e) goto out;
  } else {
    json_t *now = lh_rl_settings_json(c);
    e = now ? lh_rundir_write_settings(rd, now, c->argc, c->argv)
            : lh_errorf(LH_ERR_NOMEM, "cannot encode the run settings");
    json_decref(now);
    if (e) goto out;
  }
  if (!src) src = lh_xstrdup(c->model_dir);
  tokpath = lh_path_join(src, "tokenizer.json");
  if ((e = lh_model_load(src, &m)) || (e = lh_tokenizer_load(tokpath, &tok)) ||
      (e = lh_model_files_read(src, &files)))
    goto out;
  const lh_config *mc = &m->cfg;
  /* room for max_prompt prompt tokens and max_new completion tokens, within the context */
  if ((long)c->max_prompt + c->max_new > mc->max_positions) {
    e = lh_errorf(LH_ERR_LIMIT,
                  "--max-prompt %d and --max-new %d exceed the model's context of %d tokens "
                  "(%s/config.json max_position_embeddings)",
                  c->max_prompt, c->max_new, mc->max_positions, src);
    goto out;
  }
  lh_trainer_config tc = lh_trainer_defaults();
  tc.loss = c->loss;
  tc.adv = c->adv;
  tc.opt = c->opt;
  tc.minibatches = c->minibatches;
  tc.max_staleness = c->staleness > c->staleness_mix ? c->staleness : c->staleness_mix;
  tc.max_seq = c->max_prompt + c->max_new;
  tc.ref_dir = c->loss.kl_beta > 0.0f ? c->model_dir : NULL;
  e = lh_trainer_create(m, &tc, &tr);
  m = NULL; /* the trainer's now */
  if (e) goto out;
  if (step0 > 0) {
    char *state = lh_path_join(src, "trainer_state.safetensors");
    e = lh_trainer_load(tr, state, step0);
    if (!e && (lh_trainer_pending(tr) != c->staleness ||
               lh_trainer_submitted(tr) != step0 + c->staleness))
      e = lh_errorf(LH_ERR_FORMAT,
                    "%s: %d batches pending and %lld submitted at step %lld; "
                    "staleness %d needs %d and %lld",
                    state, lh_trainer_pending(tr), (long long)lh_trainer_submitted(tr),
                    (long long)step0, c->staleness, c->staleness,
                    (long long)(step0 + c->staleness));
    free(state);
    if (e) goto out;
  }
  if ((e = lh_rundir_metrics_open(rd, step0))) goto out;
  int n_seq = c->prompts * c->group, slots = c->slots < n_seq ? c->slots : n_seq;
  if ((e = lh_generator_create(lh_trainer_policy(tr), slots, tc.max_seq, 0, &gen))) goto out;
  if (c->staleness_mix > 0 && (e = mix_create(&x, c->staleness_mix, tr, slots, tc.max_seq)))
    goto out;
  lh_gen_config gc = lh_gen_defaults();
  gc.max_new = c->max_new;
  gc.seed = c->seed;
  gc.tok = tok;
  tasks = lh_xmalloc((size_t)c->prompts * sizeof *tasks);
  int64_t todo = c->steps > step0 ? c->steps - step0 : 0;
  rewards = lh_xcalloc((size_t)todo + 1, sizeof *rewards);
  accs = lh_xcalloc((size_t)todo + 1, sizeof *accs);
  res->first_step = res->last_step = step0;
  double t_start = lh_time_now();
  int quiet_steps = 0, warned = 0;
  int64_t heldout_step = -1;
  lh_eval_heldout last_heldout = {0};
  /* the starting policy of a new run: its line goes in after the first update's, so a start that
   * fails before then still leaves nothing durable */
  if (c->eval_every > 0 && step0 == 0 && step0 < c->steps) {
    lh_rl_progress p0 = {0};
    if ((e = heldout(c, env, tr, tok, 0, &p0, &eval0))) goto out;
    heldout_step = 0;
    last_heldout = p0.heldout;
  }
  long window_skipped = 0, window_total = 0;
  if (step0 >= c->steps)
    lh_log(LH_LOG_INFO, "%s is already at step %lld (--steps %d)", c->out_dir, (long long)step0,
           c->steps);
  while (lh_trainer_version(tr) < c->steps) {
    /* Generate until K batches wait beyond the one to train on now. */
    double t0 = lh_time_now();
    lh_rl_progress p = {0};
    long gen_tokens = 0; /* completion tokens of every batch generated for this step */
    while (lh_trainer_pending(tr) <= c->staleness) {
      int64_t g = lh_trainer_submitted(tr);
      for (int i = 0; i < c->prompts; i++)
        tasks[i] = (uint64_t)(g * c->prompts + i);
      lh_rollout_batch b;
      if (c->staleness_mix > 0) {
        e = mix_generate(&x, tr, gen, &gc, tok, env, g, c->prompts, c->group, tasks, &b,
                         &p.staleness_mean);
      } else {
        e = lh_rollout_generate(gen, &gc, tok, env, LH_SPLIT_TRAIN, tasks, NULL, c->prompts,
                                c->group, (uint64_t)g * n_seq, &b);
        b.version = lh_trainer_version(tr);
      }
      if (e) goto out;
      p.gen = lh_rollout_summarise(&b);
      gen_tokens += p.gen.completion_tokens;
      if (p.gen.groups_ok == 0) {
        lh_rollout_batch_free(&b);
        e = lh_errorf(LH_ERR_IO,
                      "the environment failed on all %d tasks of batch %lld (tasks %llu..%llu; "
                      "see the warnings above)",
                      c->prompts, (long long)g, (unsigned long long)tasks[0],
                      (unsigned long long)tasks[c->prompts - 1]);
        goto out;
      }
      res->groups_failed += p.gen.groups_failed;
      e = lh_trainer_submit(tr, &b);
      lh_rollout_batch_free(&b);
      if (e) goto out;
    }
    double t1 = lh_time_now();
    if ((e = lh_trainer_step(tr, &p.train))) goto out;
    if (c->staleness_mix > 0)
      mix_keep(&x, tr);
    else
      p.staleness_mean = (double)p.train.staleness;
    double t2 = lh_time_now();
    p.step = lh_trainer_version(tr);
    p.steps = c->steps;
    p.first_step = step0;
    p.elapsed_s = t2 - t_start;
    p.gen_s = t1 - t0;
    p.train_s = t2 - t1;
    res->last_step = p.step;
    rewards[p.step - step0 - 1] = p.gen.reward_mean;
    accs[p.step - step0 - 1] = p.gen.accuracy;
    res->groups_skipped += p.train.groups_skipped;
    res->groups_total += p.train.groups_used + p.train.groups_skipped;
    res->batches_dropped += p.train.batches_dropped;
    json_t *line = metrics_line(&p, gen_tokens, p.train.lr);
    if (eval0) {
      e = lh_rundir_metrics_append(rd, eval0);
      json_decref(eval0);
      eval0 = NULL;
      if (e) {
        json_decref(line);
        goto out;
      }
    }
    e = line ? lh_rundir_metrics_append(rd, line)
             : lh_errorf(LH_ERR_NOMEM, "step %lld: cannot encode its metrics", (long long)p.step);
    json_decref(line);
    if (e) goto out;
    p.heldout_step = heldout_step;
    p.heldout = last_heldout;
    if (c->eval_every > 0 && p.step % c->eval_every == 0) {
      if ((e = heldout(c, env, tr, tok, p.step, &p, &line))) goto out;
      e = lh_rundir_metrics_append(rd, line);
      json_decref(line);
      if (e) goto out;
      heldout_step = p.step;
      last_heldout = p.heldout;
    }
    if (c->progress) c->progress(&p, c->progress_ud);
    /* most groups without signal for QUIET_WINDOW steps: say so once */
    window_skipped += p.train.groups_skipped;
    window_total += p.train.groups_used + p.train.groups_skipped;
    if (++quiet_steps == QUIET_WINDOW) {
      if (!warned && window_total > 0 && window_skipped >= QUIET_SHARE * window_total) {
        lh_log(LH_LOG_WARN,
               "%ld of the %ld groups of steps %lld..%lld had equal rewards (all right or all "
               "wrong), so they taught nothing: the policy is barely learning. An easier "
               "environment, a larger --group, or sft first may help",
               window_skipped, window_total, (long long)(p.step - QUIET_WINDOW + 1),
               (long long)p.step);
        warned = 1;
      }
      quiet_steps = 0;
      window_skipped = window_total = 0;
    }
    bool stop = c->stop && *c->stop;
    if ((c->save_every > 0 && p.step % c->save_every == 0) || p.step == c->steps || stop)
      if ((e = lh_trainer_checkpoint(tr, rd, &files, c->keep, &res->policy_dir))) goto out;
    if (stop) {
      res->stopped = true;
      break;
    }
  }
  res->wall_s = lh_time_now() - t_start;
  {
    int64_t n = res->last_step - step0, k = n / 10 > 0 ? n / 10 : 1;
    if (k > n) k = n;
    res->reward_first = mean_of(rewards, 0, k);
    res->reward_last = mean_of(rewards, n - k, n);
    res->accuracy_first = mean_of(accs, 0, k);
    res->accuracy_last = mean_of(accs, n - k, n);
  }
  if (!res->policy_dir && step0 > 0 && src) res->policy_dir = lh_xstrdup(src);
out:
  free(tasks);
  free(rewards);
  free(accs);
  mix_free(&x);
  lh_generator_free(gen);
  lh_trainer_free(tr);
  lh_model_free(m);
  lh_tokenizer_free(tok);
  lh_model_files_free(&files);
  free(tokpath);
  free(src);
  json_decref(was);
  json_decref(eval0);
  lh_rundir_close(rd, e != LH_ERR_OK); /* discards only a run that wrote nothing durable */
  if (res == &res_local) lh_rl_result_free(res);
  lh_env_free(env);
  return e;
}
