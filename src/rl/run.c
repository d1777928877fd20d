/* longhaul rl: the single-process loop (include/longhaul/rl.h, "the single-process loop").
 * One training model (fp32 master weights), one bf16 policy refreshed in place after every
 * update, a generator, and a ring of `staleness` rollout batches waiting to be trained on.
 * Checkpoints are Hugging Face directories plus trainer_state.safetensors (AdamW moments, step
 * counters and the waiting rollout batches), so a resumed run continues exactly. */
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

#define STATE_FILE   "trainer_state.safetensors"
#define STATE_FORMAT 1

lh_rl_run_config lh_rl_run_defaults(void) {
  lh_rl_run_config c = {0};
  c.steps = 100;
  c.group = 8;
  c.prompts = 16;
  c.max_new = 32;
  c.max_prompt = 256;
  c.staleness = 0;
  c.minibatches = 1;
  c.slots = 64;
  c.save_every = 50;
  c.log_every = 10;
  c.loss = lh_loss_defaults();
  c.loss.kind = LH_LOSS_TIS; /* docs/RESULTS.md, "Staleness" */
  c.adv = (lh_adv_config){LH_ADV_GRPO, 1, 1e-6f};
  c.opt = lh_adamw_defaults();
  c.opt.lr = 1e-4f;
  c.opt.weight_decay = 0.0f;
  return c;
}

static const char *const loss_names[] = {"ppo", "tis", "mis", "decoupled"};
static const char *const agg_names[] = {"token", "seq", "const"};
static const char *const adv_names[] = {"grpo", "rloo"};

/* ---------------------------------------------------------------- settings (run.json) */

/* The settings a run's results depend on; --steps, logging and checkpoint cadence may change
 * on resume. Paths that are not UTF-8 are recorded with U+FFFD for the bad bytes. NULL when out
 * of memory. */
static json_t *settings_json(const lh_rl_run_config *c) {
  const lh_loss_config *l = &c->loss;
  const lh_adamw_config *o = &c->opt;
  return json_pack(
      "{s:i, s:o, s:o, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I,"
      " s:{s:s, s:f, s:f, s:f, s:f, s:f, s:b, s:f, s:s, s:f},"
      " s:{s:s, s:b, s:f},"
      " s:{s:f, s:f, s:f, s:f, s:f, s:f, s:i}}",
      "format", STATE_FORMAT, "model", lh_json_text(c->model_dir, strlen(c->model_dir)), "env",
      lh_json_text(c->env_spec, strlen(c->env_spec)), "group", c->group, "prompts", c->prompts,
      "max_new", c->max_new, "max_prompt", c->max_prompt, "staleness", c->staleness, "minibatches",
      c->minibatches, "slots", c->slots, "seed", (json_int_t)c->seed, "loss", "kind",
      loss_names[l->kind], "eps_low", (double)l->eps_low, "eps_high", (double)l->eps_high, "C",
      (double)l->C, "lo", (double)l->lo, "hi", (double)l->hi, "prox_mask", l->prox_mask, "m2po_tau",
      (double)l->m2po_tau, "agg", agg_names[l->agg], "kl_beta", (double)l->kl_beta, "adv", "kind",
      adv_names[c->adv.kind], "std_norm", c->adv.std_norm, "eps", (double)c->adv.eps, "opt", "lr",
      (double)o->lr, "beta1", (double)o->beta1, "beta2", (double)o->beta2, "eps", (double)o->eps,
      "weight_decay", (double)o->weight_decay, "grad_clip", (double)o->grad_clip, "warmup_steps",
      o->warmup_steps);
}

/* Writes RUN/run.json, or on resume checks that it holds the same settings. */
static lh_err settings_check(const lh_rl_run_config *c) {
  char path[4096];
  snprintf(path, sizeof path, "%s/run.json", c->out_dir);
  json_t *now = settings_json(c);
  if (!now) return lh_errorf(LH_ERR_INVAL, "cannot encode the run settings");
  lh_err e = LH_ERR_OK;
  if (!c->resume) {
    char *text = json_dumps(now, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!text) {
      json_decref(now);
      return lh_errorf(LH_ERR_NOMEM, "cannot encode the run settings");
    }
    size_t len = strlen(text);
    text[len] = '\n';
    e = lh_file_write_atomic(path, text, len + 1);
    free(text);
    json_decref(now);
    return e;
  }
  json_error_t je;
  json_t *was = json_load_file(path, 0, &je);
  if (!was) {
    json_decref(now);
    return lh_errorf(LH_ERR_FORMAT, "%s: cannot resume: %s (line %d)", path, je.text, je.line);
  }
  /* runs started before --max-prompt existed had a fixed 256 */
  if (json_is_object(was) && !json_object_get(was, "max_prompt"))
    json_object_set_new(was, "max_prompt", json_integer(256));
  const char *key;
  json_t *v;
  json_object_foreach(now, key, v) {
    json_t *w = json_object_get(was, key);
    if (!w || !json_equal(v, w)) {
      char *a = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS),
           *b = w ? json_dumps(w, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS) : NULL;
      e = lh_errorf(LH_ERR_MISMATCH, "%s: cannot resume with different settings: %s was %s, now %s",
                    path, key, b ? b : "(missing)", a ? a : "?");
      free(a);
      free(b);
      break;
    }
  }
  json_decref(was);
  json_decref(now);
  return e;
}

/* ---------------------------------------------------------------- trainer state */

typedef struct queue {
  lh_rollout_batch *b; /* ring of cap batches */
  int cap, head, len;
} queue;

static void queue_push(queue *q, lh_rollout_batch *b) {
  q->b[(q->head + q->len++) % q->cap] = *b;
  memset(b, 0, sizeof *b);
}

static lh_rollout_batch *queue_at(queue *q, int i) {
  return &q->b[(q->head + i) % q->cap];
}

static void queue_pop(queue *q, lh_rollout_batch *out) {
  *out = q->b[q->head];
  memset(&q->b[q->head], 0, sizeof q->b[q->head]);
  q->head = (q->head + 1) % q->cap;
  q->len--;
}

typedef struct entries {
  lh_st_entry e[12 * 64 + 8];
  char names[12 * 64 + 8][48];
  int n;
} entries;

static void put(entries *es, const char *name, lh_dtype dt, int64_t count, const void *data) {
  lh_st_entry *e = &es->e[es->n];
  snprintf(es->names[es->n], sizeof es->names[0], "%s", name);
  e->name = es->names[es->n];
  e->dtype = dt;
  e->ndim = 1;
  e->shape[0] = count;
  e->data = data;
  es->n++;
}

static lh_err state_write(const char *path, const lh_adamw *opt, const int64_t counters[3],
                          queue *q) {
  entries *es = lh_xcalloc(1, sizeof *es);
  put(es, "rl.counters", LH_DTYPE_I64, 3, counters);
  put(es, "adam.m", LH_DTYPE_F32, (int64_t)opt->n, opt->m);
  put(es, "adam.v", LH_DTYPE_F32, (int64_t)opt->n, opt->v);
  for (int i = 0; i < q->len; i++) {
    lh_rollout_batch *b = queue_at(q, i);
    int n = b->n_groups * b->group_size, N = b->seq_start[n];
    char name[48];
#define PUT(field, dt, count)                                                                      \
  snprintf(name, sizeof name, "queue.%d." #field, i), put(es, name, dt, count, b->field)
    PUT(task_index, LH_DTYPE_I64, b->n_groups);
    PUT(group_ok, LH_DTYPE_U8, b->n_groups);
    PUT(seq_start, LH_DTYPE_I32, n + 1);
    PUT(prompt_len, LH_DTYPE_I32, n);
    PUT(tokens, LH_DTYPE_I32, N);
    PUT(mu, LH_DTYPE_F32, N);
    PUT(reward, LH_DTYPE_F32, n);
    PUT(correct, LH_DTYPE_U8, n);
    PUT(well_formed, LH_DTYPE_U8, n);
    PUT(finish, LH_DTYPE_U8, n);
#undef PUT
    if (b->old) {
      snprintf(name, sizeof name, "queue.%d.old", i);
      put(es, name, LH_DTYPE_F32, N, b->old);
    }
    snprintf(name, sizeof name, "queue.%d.version", i);
    put(es, name, LH_DTYPE_I64, 1, &b->version);
  }
  lh_err e = lh_safetensors_write(path, es->e, es->n);
  free(es);
  return e;
}

/* Copies tensor `name` (dtype dt, `count` elements; count < 0: any, returned) into a new
 * buffer. */
static lh_err get(const lh_safetensors *st, const char *path, const char *name, lh_dtype dt,
                  int64_t *count, void **out) {
  const lh_st_tensor *t = lh_safetensors_find(st, name);
  if (!t) return lh_errorf(LH_ERR_FORMAT, "%s: tensor %s is missing", path, name);
  int64_t n = t->ndim == 1 ? t->shape[0] : -1;
  if (t->dtype != dt || n < 0 || (*count >= 0 && n != *count))
    return lh_errorf(LH_ERR_FORMAT, "%s: tensor %s: expected a 1-D tensor of %lld entries", path,
                     name, (long long)*count);
  *count = n;
  *out = lh_xmalloc(t->nbytes > 0 ? t->nbytes : 1); /* the parser checked nbytes = shape x dtype */
  memcpy(*out, t->data, t->nbytes);
  return LH_ERR_OK;
}

/* Reads one queued batch and checks it is consistent. */
static lh_err state_read_batch(const lh_safetensors *st, const char *path, int i,
                               const lh_rl_run_config *c, int vocab, lh_rollout_batch *b) {
  memset(b, 0, sizeof *b);
  b->n_groups = c->prompts;
  b->group_size = c->group;
  int64_t G = c->prompts, n = (int64_t)c->prompts * c->group, n1 = n + 1, N = -1, one = 1;
  int64_t *version = NULL;
  char name[48];
  lh_err e;
#define GET(field, dt, count)                                                                      \
  (snprintf(name, sizeof name, "queue.%d." #field, i),                                             \
   get(st, path, name, dt, &count, (void **)&b->field))
  if ((e = GET(task_index, LH_DTYPE_I64, G)) || (e = GET(group_ok, LH_DTYPE_U8, G)) ||
      (e = GET(seq_start, LH_DTYPE_I32, n1)) || (e = GET(prompt_len, LH_DTYPE_I32, n)) ||
      (e = GET(tokens, LH_DTYPE_I32, N)) || (e = GET(mu, LH_DTYPE_F32, N)) ||
      (e = GET(reward, LH_DTYPE_F32, n)) || (e = GET(correct, LH_DTYPE_U8, n)) ||
      (e = GET(well_formed, LH_DTYPE_U8, n)) || (e = GET(finish, LH_DTYPE_U8, n)))
    return e;
#undef GET
  snprintf(name, sizeof name, "queue.%d.old", i);
  if (lh_safetensors_find(st, name) &&
      (e = get(st, path, name, LH_DTYPE_F32, &N, (void **)&b->old)))
    return e;
  snprintf(name, sizeof name, "queue.%d.version", i);
  if ((e = get(st, path, name, LH_DTYPE_I64, &one, (void **)&version))) return e;
  b->version = *version;
  free(version);
  if (b->seq_start[0] != 0 || b->seq_start[n] != N)
    return lh_errorf(LH_ERR_FORMAT, "%s: queue.%d.seq_start does not cover its tokens", path, i);
  for (int64_t s = 0; s < n; s++) {
    int len = b->seq_start[s + 1] - b->seq_start[s];
    if (len < 0 || b->prompt_len[s] < 0 || b->prompt_len[s] > len || b->finish[s] > 3 ||
        !(b->reward[s] >= 0.0f && b->reward[s] <= 1.0f))
      return lh_errorf(LH_ERR_FORMAT, "%s: queue.%d: sequence %lld is inconsistent", path, i,
                       (long long)s);
  }
  for (int64_t k = 0; k < N; k++)
    if (b->tokens[k] < 0 || b->tokens[k] >= vocab || !isfinite(b->mu[k]) ||
        (b->old && !isfinite(b->old[k])))
      return lh_errorf(LH_ERR_FORMAT, "%s: queue.%d: token %lld is invalid", path, i, (long long)k);
  return LH_ERR_OK;
}

static lh_err state_read(const char *path, const lh_rl_run_config *c, int vocab, lh_adamw *opt,
                         int64_t counters[3], queue *q) {
  lh_safetensors *st = NULL;
  lh_err e = lh_safetensors_open(path, &st);
  if (e) return e;
  int64_t three = 3, np = (int64_t)opt->n;
  int64_t *cnt = NULL;
  float *m = NULL, *v = NULL;
  if ((e = get(st, path, "rl.counters", LH_DTYPE_I64, &three, (void **)&cnt)) ||
      (e = get(st, path, "adam.m", LH_DTYPE_F32, &np, (void **)&m)) ||
      (e = get(st, path, "adam.v", LH_DTYPE_F32, &np, (void **)&v)))
    goto out;
  memcpy(counters, cnt, 3 * sizeof *cnt);
  if (counters[0] < 0 || counters[1] != counters[0] + c->staleness || counters[2] < 0) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: rl.counters (%lld, %lld, %lld) do not fit staleness %d", path,
                  (long long)counters[0], (long long)counters[1], (long long)counters[2],
                  c->staleness);
    goto out;
  }
  for (size_t i = 0; i < opt->n; i++) { /* a NaN moment would turn every later step to NaN */
    const char *bad = !isfinite(m[i]) ? "m" : !(v[i] >= 0.0f && isfinite(v[i])) ? "v" : NULL;
    if (bad) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: adam.%s[%zu] is %g, expected a finite number%s", path, bad,
                    i, (double)(*bad == 'm' ? m[i] : v[i]), *bad == 'v' ? " >= 0" : "");
      goto out;
    }
  }
  memcpy(opt->m, m, opt->n * sizeof *m);
  memcpy(opt->v, v, opt->n * sizeof *v);
  opt->step = counters[2];
  for (int i = 0; i < c->staleness; i++) {
    lh_rollout_batch b;
    if ((e = state_read_batch(st, path, i, c, vocab, &b))) {
      lh_rollout_batch_free(&b);
      goto out;
    }
    /* queued batch i was generated by the policy of an update in [step - K, step] */
    if (b.version < counters[0] - c->staleness || b.version > counters[0]) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: queue.%d.version %lld, expected %lld..%lld", path, i,
                    (long long)b.version, (long long)(counters[0] - c->staleness),
                    (long long)counters[0]);
      lh_rollout_batch_free(&b);
      goto out;
    }
    queue_push(q, &b);
  }
out:
  free(cnt);
  free(m);
  free(v);
  lh_safetensors_close(st);
  return e;
}

/* ---------------------------------------------------------------- checkpoints */

typedef struct blob {
  char *data;
  size_t len;
} blob;

/* Removes every file in a checkpoint directory `dir` (its five files, and the FILE.tmp.PID.N left
 * by a run killed while writing one), then `dir` itself. A subdirectory is not longhaul's, so
 * rmdir then fails and the caller decides whether that matters. A missing `dir` is success. */
static int remove_checkpoint_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : -1;
  struct dirent *ent;
  char path[4400];
  while ((ent = readdir(d)))
    if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, "..")) {
      snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
      unlink(path);
    }
  closedir(d);
  return rmdir(dir);
}

static int cmp_desc_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x < y) - (x > y);
}

/* --keep N: deletes the checkpoints of steps <= `step` but the newest `keep` of them (0: keeps
 * all), and the step-N.tmp directories of steps <= `step` that a killed run left. Directories
 * of later steps (left by a run that stopped before `latest` named them) are replaced when the
 * run reaches them, so they are not touched here. A directory that cannot be removed is
 * reported and left: losing an old checkpoint never stops training. */
static void prune_checkpoints(const char *run, int keep, int64_t step) {
  if (keep <= 0) return;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/checkpoints", run);
  DIR *d = opendir(dir);
  if (!d) return;
  int64_t *steps = NULL;
  size_t n = 0, cap = 0;
  struct dirent *ent;
  while ((ent = readdir(d))) {
    unsigned long long v;
    char name[64];
    if (sscanf(ent->d_name, "step-%llu", &v) != 1 || v > (unsigned long long)step) continue;
    snprintf(name, sizeof name, "step-%06llu.tmp", v);
    if (!strcmp(name, ent->d_name)) { /* a write a killed run did not finish */
      char path[4200];
      snprintf(path, sizeof path, "%s/%s", dir, name);
      if (remove_checkpoint_dir(path) != 0)
        lh_log(LH_LOG_WARN, "rl: --keep: cannot remove %s: %s", path, strerror(errno));
      continue;
    }
    name[strlen(name) - 4] = '\0';
    if (strcmp(name, ent->d_name) != 0) continue; /* other names */
    if (n == cap) {
      int64_t *more = realloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *steps);
      if (!more) { /* out of memory: prune nothing this time */
        n = 0;
        break;
      }
      steps = more;
    }
    steps[n++] = (int64_t)v;
  }
  closedir(d);
  if (n > 1) qsort(steps, n, sizeof *steps, cmp_desc_i64);
  for (size_t i = (size_t)keep; i < n; i++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/step-%06lld", dir, (long long)steps[i]);
    if (remove_checkpoint_dir(path) != 0)
      lh_log(LH_LOG_WARN, "rl: --keep: cannot remove %s: %s", path, strerror(errno));
  }
  free(steps);
}

static lh_err write_checkpoint(const lh_rl_run_config *c, const lh_model *m, const lh_adamw *opt,
                               const int64_t counters[3], queue *q, const blob *tok,
                               const blob *gencfg) {
  char dir[4096], tmp[4200], path[4300];
  snprintf(dir, sizeof dir, "%s/checkpoints/step-%06lld", c->out_dir, (long long)counters[0]);
  snprintf(tmp, sizeof tmp, "%s.tmp", dir);
  lh_err e;
  /* A run killed while writing this step left step-N.tmp, perhaps with partial FILE.tmp.PID.N
   * files: start from an empty directory, so they are not renamed into the checkpoint. */
  if (remove_checkpoint_dir(tmp) != 0)
    return lh_errorf(LH_ERR_IO, "%s: cannot remove the unfinished checkpoint: %s", tmp,
                     strerror(errno));
  if ((e = lh_model_save(m, tmp, LH_SAVE_F32))) return e;
  snprintf(path, sizeof path, "%s/tokenizer.json", tmp);
  if ((e = lh_file_write_atomic(path, tok->data, tok->len))) return e;
  if (gencfg->data) {
    snprintf(path, sizeof path, "%s/generation_config.json", tmp);
    if ((e = lh_file_write_atomic(path, gencfg->data, gencfg->len))) return e;
  }
  snprintf(path, sizeof path, "%s/" STATE_FILE, tmp);
  if ((e = state_write(path, opt, counters, q))) return e;
  /* An older directory of the same step (from a run that stopped before `latest` named it)
   * is replaced. */
  remove_checkpoint_dir(dir);
  if ((e = lh_file_commit(tmp, dir))) return e; /* renamed and on disk before `latest` names it */
  snprintf(path, sizeof path, "%s/latest", c->out_dir);
  char line[64];
  int len = snprintf(line, sizeof line, "step-%06lld\n", (long long)counters[0]);
  if ((e = lh_file_write_atomic(path, line, (size_t)len))) return e;
  prune_checkpoints(c->out_dir, c->keep, counters[0]);
  return LH_ERR_OK;
}

/* Reads RUN/latest: the checkpoint directory to resume from. */
static lh_err latest_checkpoint(const char *run, char *dir, size_t cap) {
  char path[4096], *text = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/latest", run);
  lh_err e = lh_file_read(path, 64, &text, &len);
  if (e) {
    char why[512]; /* lh_errorf formats into the buffer lh_last_error returns */
    snprintf(why, sizeof why, "%s", lh_last_error());
    return lh_errorf(e, "%s: cannot resume, no checkpoint: %s", run, why);
  }
  while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' '))
    text[--len] = '\0';
  unsigned long long step;
  char rest;
  if (sscanf(text, "step-%llu%c", &step, &rest) != 1) {
    free(text);
    return lh_errorf(LH_ERR_FORMAT, "%s: expected \"step-NNNNNN\"", path);
  }
  snprintf(dir, cap, "%s/checkpoints/%s", run, text);
  free(text);
  return LH_ERR_OK;
}

/* Keeps the metrics lines of steps <= step (a resumed run rewrites what followed): reads the
 * file a line at a time, whatever its size, and cuts it after the last line to keep. A line
 * that is not a metrics object of such a step, or longer than any metrics line, ends the
 * kept part (a line cut short by a kill included). */
static lh_err metrics_truncate(const char *path, int64_t step) {
  FILE *f = fopen(path, "rbe");
  if (!f) {
    if (errno == ENOENT) return LH_ERR_OK; /* no metrics yet */
    return lh_errorf(LH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  }
  enum { LINE_MAX_BYTES = 1 << 16 };
  char *line = lh_xmalloc(LINE_MAX_BYTES);
  off_t keep = 0;
  while (fgets(line, LINE_MAX_BYTES, f)) {
    size_t n = strlen(line);
    if (n == 0 || line[n - 1] != '\n') break; /* too long, a NUL byte, or cut short */
    json_t *o = json_loadb(line, n, 0, NULL);
    json_t *s = o ? json_object_get(o, "step") : NULL;
    int ok = s && json_is_integer(s) && json_integer_value(s) <= step;
    json_decref(o);
    if (!ok) break;
    keep += (off_t)n;
  }
  int bad = ferror(f);
  free(line);
  fclose(f);
  if (bad) return lh_errorf(LH_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
  if (truncate(path, keep) != 0)
    return lh_errorf(LH_ERR_IO, "%s: cannot truncate: %s", path, strerror(errno));
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- metrics */

static void set_num(json_t *o, const char *key, double v) {
  json_object_set_new(o, key, isfinite(v) ? json_real(v) : json_null());
}

typedef struct gen_summary {
  double reward_mean, reward_std, accuracy, well_formed, response_len, entropy;
  long completion_tokens;
} gen_summary;

static gen_summary summarise(const lh_rollout_batch *b) {
  gen_summary g = {0};
  int n = b->n_groups * b->group_size, cnt = 0;
  double r2 = 0.0, lp = 0.0;
  for (int s = 0; s < n; s++) {
    if (!b->group_ok[s / b->group_size]) continue;
    cnt++;
    g.reward_mean += b->reward[s];
    r2 += (double)b->reward[s] * b->reward[s];
    g.accuracy += b->correct[s];
    g.well_formed += b->well_formed[s];
    for (int i = b->seq_start[s] + b->prompt_len[s]; i < b->seq_start[s + 1]; i++)
      lp -= b->mu[i], g.completion_tokens++;
  }
  if (cnt > 0) {
    g.reward_mean /= cnt;
    g.reward_std = sqrt(fmax(0.0, r2 / cnt - g.reward_mean * g.reward_mean));
    g.accuracy /= cnt;
    g.well_formed /= cnt;
    g.response_len = (double)g.completion_tokens / cnt;
  }
  g.entropy = g.completion_tokens > 0 ? lp / g.completion_tokens : 0.0;
  return g;
}

/* ---------------------------------------------------------------- the loop */

/* Grows the training state to hold n tokens. */
static lh_err ensure_train(lh_model *m, int n, int max_seq, lh_train **t, int *cap) {
  if (*t && n <= *cap) return LH_ERR_OK;
  lh_train_free(*t);
  *t = NULL;
  *cap = n + n / 4 > max_seq ? n + n / 4 : max_seq;
  return lh_train_create(m, *cap, max_seq, t);
}

static lh_err read_optional(const char *dir, const char *file, size_t max, blob *b) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  if (access(path, F_OK) != 0) return LH_ERR_OK;
  return lh_file_read(path, max, &b->data, &b->len);
}

lh_err lh_rl_run(const lh_rl_run_config *c) {
  if (c->steps < 1 || c->group < 2 || c->prompts < 1 || c->max_new < 1 || c->max_prompt < 1 ||
      c->staleness < 0 || c->minibatches < 1 || c->slots < 1 || c->save_every < 0 || c->keep < 0 ||
      c->log_every < 1)
    return lh_errorf(LH_ERR_INVAL, "steps, prompts, max_new, max_prompt, minibatches, slots >= 1, "
                                   "group >= 2, staleness, save_every, keep >= 0 required");
  if (c->staleness > 64) return lh_errorf(LH_ERR_LIMIT, "staleness %d, at most 64", c->staleness);
  if (c->seed > (uint64_t)INT64_MAX) /* run.json's integers are signed 64-bit */
    return lh_errorf(LH_ERR_LIMIT, "seed %llu, at most %lld", (unsigned long long)c->seed,
                     (long long)INT64_MAX);
  lh_env_config ecfg;
  lh_env *env = NULL;
  lh_model *m = NULL;
  lh_tokenizer *tok = NULL;
  lh_infer *policy = NULL;
  lh_generator *gen = NULL;
  lh_train *train = NULL, *ref_train = NULL;
  lh_model *ref = NULL; /* the starting policy, for the KL penalty */
  lh_adamw *opt = NULL;
  FILE *metrics = NULL;
  blob tokjson = {0}, gencfg = {0};
  queue q = {lh_xcalloc((size_t)c->staleness + 1, sizeof(lh_rollout_batch)), c->staleness + 1, 0,
             0};
  int64_t counters[3] = {0, 0, 0}; /* updates done, batches generated, AdamW steps */
  char src[4096], path[4300];
  lh_err e;
  snprintf(path, sizeof path, "%s/latest", c->out_dir);
  if (!c->resume && access(path, F_OK) == 0) {
    e = lh_errorf(LH_ERR_INVAL,
                  "%s already holds a run (see %s): resume it with --resume or "
                  "choose another --out",
                  c->out_dir, path);
    goto out;
  }
  if ((e = lh_env_config_parse(c->env_spec, &ecfg)) || (e = lh_env_create(&ecfg, &env)) ||
      (e = lh_mkdir_p(c->out_dir)) || (e = settings_check(c)))
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
    if ((e = latest_checkpoint(c->out_dir, src, sizeof src))) goto out;
  } else {
    snprintf(src, sizeof src, "%s", c->model_dir);
  }
  snprintf(path, sizeof path, "%s/tokenizer.json", src);
  if ((e = lh_model_load(src, &m)) || (e = lh_tokenizer_load(path, &tok)) ||
      (e = lh_file_read(path, LH_TOKENIZER_MAX_FILE, &tokjson.data, &tokjson.len)) ||
      (e = read_optional(src, "generation_config.json", 1 << 20, &gencfg)) ||
      (e = lh_adamw_create(&m->cfg, &c->opt, &opt)) ||
      (c->loss.kl_beta > 0.0f && (e = lh_model_load(c->model_dir, &ref))))
    goto out;
  if (c->resume) {
    snprintf(path, sizeof path, "%s/" STATE_FILE, src);
    if ((e = state_read(path, c, m->cfg.vocab_size, opt, counters, &q))) goto out;
  }
  snprintf(path, sizeof path, "%s/metrics.jsonl", c->out_dir);
  if (c->resume) {
    if ((e = metrics_truncate(path, counters[0]))) goto out;
  } else {
    unlink(path);
  }
  if (!(metrics = fopen(path, "ae"))) {
    e = lh_errorf(LH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    goto out;
  }
  const lh_config *mc = &m->cfg;
  /* room for max_prompt prompt tokens and max_new completion tokens, within the context */
  if ((long)c->max_prompt + c->max_new > mc->max_positions) {
    e = lh_errorf(LH_ERR_LIMIT,
                  "--max-prompt %d and --max-new %d exceed the model's context of %d tokens "
                  "(%s/config.json max_position_embeddings)",
                  c->max_prompt, c->max_new, mc->max_positions, src);
    goto out;
  }
  int max_seq = c->max_prompt + c->max_new;
  int n_seq = c->prompts * c->group, slots = c->slots < n_seq ? c->slots : n_seq;
  if ((e = lh_infer_from_model(m, &policy)) || (slots > 8 && (e = lh_infer_keep_fp32(policy))) ||
      (e = lh_generator_create(policy, slots, max_seq, 0, &gen)))
    goto out;
  lh_gen_config gc = lh_gen_defaults();
  gc.max_new = c->max_new;
  gc.seed = c->seed;
  gc.tok = tok;
  int train_cap = 0, ref_cap = 0;
  /* TIS and masked IS compare the trainer's log-probs of the generating policy with mu. */
  int recompute = c->loss.kind == LH_LOSS_TIS || c->loss.kind == LH_LOSS_MIS;
  uint64_t *tasks = lh_xmalloc((size_t)c->prompts * sizeof *tasks);
  double t_start = lh_time_now();
  if (counters[0] >= c->steps)
    lh_log(LH_LOG_INFO, "rl: %s is already at step %lld (--steps %d)", c->out_dir,
           (long long)counters[0], c->steps);
  while (counters[0] < c->steps) {
    int64_t step = counters[0] + 1;
    /* Generate until K batches wait beyond the one to train on now. */
    double t0 = lh_time_now();
    gen_summary gs = {0};
    long gen_tokens = 0; /* completion tokens of every batch generated for this step */
    while (q.len <= c->staleness) {
      int64_t g = counters[1];
      for (int p = 0; p < c->prompts; p++)
        tasks[p] = (uint64_t)(g * c->prompts + p);
      lh_rollout_batch b;
      if ((e = lh_rollout_generate(gen, &gc, tok, env, LH_SPLIT_TRAIN, tasks, NULL, c->prompts,
                                   c->group, (uint64_t)g * n_seq, &b)))
        break;
      b.version = counters[0];
      if (recompute && ((e = ensure_train(m, b.seq_start[n_seq], max_seq, &train, &train_cap)) ||
                        (e = lh_rollout_recompute(train, &b)))) {
        lh_rollout_batch_free(&b);
        break;
      }
      counters[1]++;
      gs = summarise(&b);
      gen_tokens += gs.completion_tokens;
      queue_push(&q, &b);
    }
    if (e) break;
    double t1 = lh_time_now();
    lh_rollout_batch rb;
    queue_pop(&q, &rb);
    lh_rl_batch tb;
    if ((e = lh_rl_batch_assemble(&rb, &c->adv, &tb))) {
      lh_rollout_batch_free(&rb);
      break;
    }
    if ((e = ensure_train(m, tb.seq_start[tb.n_seqs], max_seq, &train, &train_cap))) {
      lh_rl_batch_free(&tb);
      lh_rollout_batch_free(&rb);
      break;
    }
    if (ref && tb.n_seqs > 0) { /* reference log-probs for the KL penalty */
      int N = tb.seq_start[tb.n_seqs];
      lh_batch full = {tb.n_seqs, tb.seq_start, tb.tokens, tb.weight};
      tb.ref = lh_xmalloc((size_t)N * sizeof *tb.ref);
      if ((e = ensure_train(ref, N, max_seq, &ref_train, &ref_cap)) ||
          (e = lh_batch_validate(ref_train, &full))) {
        lh_rl_batch_free(&tb);
        lh_rollout_batch_free(&rb);
        break;
      }
      lh_train_forward(ref_train, &full, tb.ref);
    }
    lh_rl_step_stats ss;
    e = lh_rl_update(train, opt, m, &c->loss, c->minibatches, &tb, &ss);
    int64_t staleness = counters[0] - rb.version;
    int used = tb.n_groups_used, skipped = tb.n_groups_skipped, failed = tb.n_groups_failed;
    lh_rl_batch_free(&tb);
    lh_rollout_batch_free(&rb);
    if (e || (e = lh_infer_update(policy, m))) break;
    counters[0]++;
    counters[2] = opt->step;
    double t2 = lh_time_now();

    if (ss.loss.n_valid == 0) { /* nothing trained: no loss or ratio to report (null, not 0) */
      lh_loss_stats *l = &ss.loss;
      l->loss = l->pg_loss = l->kl_loss = l->kl_mu_pi = l->clip_frac = l->masked_frac = NAN;
      l->ratio_min = l->ratio_mean = l->ratio_max = NAN;
    }
    if (ss.n_updates == 0) ss.grad_norm = NAN;
    json_t *o = json_object();
    json_object_set_new(o, "step", json_integer(step));
    json_object_set_new(o, "staleness", json_integer(staleness));
    set_num(o, "reward_mean", gs.reward_mean);
    set_num(o, "reward_std", gs.reward_std);
    set_num(o, "accuracy", gs.accuracy);
    set_num(o, "well_formed", gs.well_formed);
    set_num(o, "response_len", gs.response_len);
    set_num(o, "entropy", gs.entropy);
    set_num(o, "loss", ss.loss.loss);
    set_num(o, "kl_loss", ss.loss.kl_loss);
    set_num(o, "kl_mu_pi", ss.loss.kl_mu_pi);
    set_num(o, "clip_frac", ss.loss.clip_frac);
    set_num(o, "masked_frac", ss.loss.masked_frac);
    set_num(o, "ratio_min", ss.loss.ratio_min);
    set_num(o, "ratio_mean", ss.loss.ratio_mean);
    set_num(o, "ratio_max", ss.loss.ratio_max);
    set_num(o, "grad_norm", ss.grad_norm);
    set_num(o, "lr", lh_adamw_lr(&c->opt, opt->step > 0 ? opt->step - 1 : 0));
    json_object_set_new(o, "updates", json_integer(ss.n_updates));
    json_object_set_new(o, "nonfinite_updates", json_integer(ss.n_skipped));
    json_object_set_new(o, "groups_used", json_integer(used));
    json_object_set_new(o, "skipped_groups", json_integer(skipped));
    json_object_set_new(o, "failed_groups", json_integer(failed));
    set_num(o, "gen_s", t1 - t0);
    set_num(o, "train_s", t2 - t1);
    set_num(o, "gen_tokens_per_s", t1 > t0 ? gen_tokens / (t1 - t0) : 0.0);
    set_num(o, "train_tokens_per_s", t2 > t1 ? ss.tokens / (t2 - t1) : 0.0);
    char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (!line) {
      e = lh_errorf(LH_ERR_NOMEM, "step %lld: cannot encode its metrics", (long long)step);
      break;
    }
    int wrote = fprintf(metrics, "%s\n", line) >= 0 && fflush(metrics) == 0;
    free(line);
    if (!wrote) { /* a full disk: stop before steps go unrecorded */
      e = lh_errorf(LH_ERR_IO, "%s/metrics.jsonl: cannot write: %s", c->out_dir, strerror(errno));
      break;
    }
    if (step % c->log_every == 0 || step == c->steps)
      fprintf(stderr,
              "rl: step %lld/%d reward %.3f accuracy %.3f len %.1f clip %.3f stale %lld "
              "skipped %d/%d gen %.2fs train %.2fs (%.0fs)\n",
              (long long)step, c->steps, gs.reward_mean, gs.accuracy, gs.response_len,
              ss.loss.clip_frac, (long long)staleness, skipped, c->prompts, t1 - t0, t2 - t1,
              lh_time_now() - t_start);
    if ((c->save_every > 0 && step % c->save_every == 0) || step == c->steps)
      if ((e = write_checkpoint(c, m, opt, counters, &q, &tokjson, &gencfg))) break;
  }
  free(tasks);
out:
  if (metrics && fclose(metrics) != 0 && !e)
    e = lh_errorf(LH_ERR_IO, "%s/metrics.jsonl: cannot write: %s", c->out_dir, strerror(errno));
  while (q.len > 0) {
    lh_rollout_batch b;
    queue_pop(&q, &b);
    lh_rollout_batch_free(&b);
  }
  free(q.b);
  free(tokjson.data);
  free(gencfg.data);
  lh_generator_free(gen);
  lh_infer_free(policy);
  lh_train_free(train);
  lh_train_free(ref_train);
  lh_model_free(ref);
  lh_adamw_free(opt);
  lh_tokenizer_free(tok);
  lh_model_free(m);
  lh_env_free(env);
  return e;
}
