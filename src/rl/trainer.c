/* longhaul trainer: the training thread's object (trainer.h). Pending rollout batches wait in a
 * FIFO of any length; a step takes the oldest within the staleness bound, assembles it, adds
 * reference log-probs for the KL penalty, updates the model and re-rounds the bf16 policy. The
 * state file holds everything a resumed trainer needs to continue exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/rundir.h"
#include "longhaul/tensor.h"
#include "longhaul/trainer.h"

#define STATE_FORMAT     2 /* 1: queued batches as separate tensors, no step or weights hash */
#define STATE_FORMAT_STR "2"
#define STATE_KIND       "longhaul.trainer_state" /* the file's __metadata__ "format" */

struct lh_trainer {
  lh_trainer_config cfg;
  lh_model *m;
  lh_adamw *opt;
  lh_train *train; /* sized for the largest batch so far */
  int train_cap;
  lh_model *ref; /* the KL penalty's reference, or NULL */
  lh_train *ref_train;
  int ref_cap;
  lh_infer *policy;
  lh_model *beh; /* the weights of an older version, for lh_trainer_recompute, or NULL */
  lh_train *beh_train;
  int beh_cap;
  int64_t version, submitted;
  lh_rollout_batch *q; /* ring of q_cap: q_len pending batches from q_head */
  int q_cap, q_head, q_len;
};

lh_trainer_config lh_trainer_defaults(void) {
  lh_trainer_config c = {0};
  c.loss = lh_loss_defaults();
  c.loss.kind = LH_LOSS_VESPO; /* docs/RESULTS.md, "Learning from stale rollouts" */
  c.adv = (lh_adv_config){LH_ADV_GRPO, 1, 1e-6f};
  c.opt = lh_adamw_defaults();
  c.opt.lr = 1e-4f;
  c.opt.weight_decay = 0.0f;
  c.minibatches = 1;
  return c;
}

/* Grows a training state to hold n tokens. */
static lh_err ensure_train(lh_model *m, int n, int max_seq, lh_train **t, int *cap) {
  if (*t && n <= *cap) return LH_ERR_OK;
  lh_train_free(*t);
  *t = NULL;
  *cap = n + n / 4 > max_seq ? n + n / 4 : max_seq;
  return lh_train_create(m, *cap, max_seq, t);
}

lh_err lh_trainer_create(lh_model *m, const lh_trainer_config *cfg, lh_trainer **out) {
  *out = NULL;
  if (cfg->minibatches < 1 || cfg->max_staleness < 0 || cfg->max_seq < 2) {
    lh_model_free(m);
    return lh_errorf(LH_ERR_INVAL,
                     "trainer: minibatches %d, staleness %d, max_seq %d: need >= 1, "
                     ">= 0, >= 2",
                     cfg->minibatches, cfg->max_staleness, cfg->max_seq);
  }
  if (cfg->loss.kl_beta > 0.0f && !cfg->ref_dir) {
    lh_model_free(m);
    return lh_errorf(LH_ERR_INVAL, "trainer: the KL penalty needs a reference model");
  }
  lh_trainer *t = lh_xcalloc(1, sizeof *t);
  t->cfg = *cfg;
  t->m = m;
  lh_err e;
  if ((e = lh_adamw_create(&m->cfg, &cfg->opt, &t->opt)) ||
      (cfg->loss.kl_beta > 0.0f && (e = lh_model_load(cfg->ref_dir, &t->ref))) ||
      (e = lh_infer_from_model(m, &t->policy))) {
    lh_trainer_free(t);
    return e;
  }
  t->cfg.ref_dir = NULL; /* not kept: the caller's string */
  *out = t;
  return LH_ERR_OK;
}

static void queue_push(lh_trainer *t, lh_rollout_batch *b) {
  if (t->q_len == t->q_cap) { /* grow, keeping the order */
    int cap = t->q_cap ? 2 * t->q_cap : 8;
    lh_rollout_batch *q = lh_xcalloc((size_t)cap, sizeof *q);
    for (int i = 0; i < t->q_len; i++)
      q[i] = t->q[(t->q_head + i) % t->q_cap];
    free(t->q);
    t->q = q, t->q_cap = cap, t->q_head = 0;
  }
  t->q[(t->q_head + t->q_len++) % t->q_cap] = *b;
  memset(b, 0, sizeof *b);
}

static lh_rollout_batch *queue_at(const lh_trainer *t, int i) {
  return &t->q[(t->q_head + i) % t->q_cap];
}

static void queue_pop(lh_trainer *t, lh_rollout_batch *out) {
  *out = t->q[t->q_head];
  memset(&t->q[t->q_head], 0, sizeof *out);
  t->q_head = (t->q_head + 1) % t->q_cap;
  t->q_len--;
}

void lh_trainer_free(lh_trainer *t) {
  if (!t) return;
  while (t->q_len > 0) {
    lh_rollout_batch b;
    queue_pop(t, &b);
    lh_rollout_batch_free(&b);
  }
  free(t->q);
  lh_infer_free(t->policy);
  lh_train_free(t->train);
  lh_train_free(t->ref_train);
  lh_model_free(t->ref);
  lh_train_free(t->beh_train);
  lh_model_free(t->beh);
  lh_adamw_free(t->opt);
  lh_model_free(t->m);
  free(t);
}

const lh_trainer_config *lh_trainer_config_of(const lh_trainer *t) {
  return &t->cfg;
}
lh_model *lh_trainer_model(lh_trainer *t) {
  return t->m;
}
lh_infer *lh_trainer_policy(lh_trainer *t) {
  return t->policy;
}
int64_t lh_trainer_version(const lh_trainer *t) {
  return t->version;
}
int lh_trainer_pending(const lh_trainer *t) {
  return t->q_len;
}
int64_t lh_trainer_submitted(const lh_trainer *t) {
  return t->submitted;
}

lh_err lh_trainer_submit(lh_trainer *t, lh_rollout_batch *b) {
  if (b->version > t->version || b->version < 0)
    return lh_errorf(LH_ERR_INVAL, "trainer: a batch of version %lld, the policy is at %lld",
                     (long long)b->version, (long long)t->version);
  lh_rollout_limits lim = lh_rollout_default_limits();
  lim.vocab = t->m->cfg.vocab_size;
  lh_err ve = lh_rollout_validate(b, &lim, "trainer: batch");
  if (ve) return ve;
  for (int s = 0; s < b->n_groups * b->group_size; s++)
    if (b->seq_start[s + 1] - b->seq_start[s] > t->cfg.max_seq)
      return lh_errorf(LH_ERR_LIMIT, "trainer: batch: sequence %d has %d tokens, more than %d", s,
                       b->seq_start[s + 1] - b->seq_start[s], t->cfg.max_seq);
  /* Losses that compare with the trainer's log-probs of the generating policy. */
  if (lh_loss_wants_old(t->cfg.loss.kind) && b->version == t->version && !b->old) {
    int n = b->n_groups * b->group_size;
    lh_err e = ensure_train(t->m, b->seq_start[n], t->cfg.max_seq, &t->train, &t->train_cap);
    if (e || (e = lh_rollout_recompute(t->train, b))) return e;
  }
  queue_push(t, b);
  t->submitted++;
  return LH_ERR_OK;
}

lh_err lh_trainer_recompute(lh_trainer *t, const uint16_t *slab, size_t n, lh_rollout_batch *b) {
  if (n != t->m->n_params)
    return lh_errorf(LH_ERR_MISMATCH, "trainer: a policy of %zu values for a model of %zu", n,
                     t->m->n_params);
  int N = b->seq_start[b->n_groups * b->group_size];
  for (int s = 0; s < b->n_groups * b->group_size; s++)
    if (b->seq_start[s + 1] - b->seq_start[s] > t->cfg.max_seq)
      return lh_errorf(LH_ERR_LIMIT, "trainer: batch: sequence %d has %d tokens, more than %d", s,
                       b->seq_start[s + 1] - b->seq_start[s], t->cfg.max_seq);
  lh_err e;
  if (!t->beh && (e = lh_model_create(&t->m->cfg, &t->beh))) return e;
  lh_f32_from_bf16_n(t->beh->params, slab, n);
  if ((e = ensure_train(t->beh, N, t->cfg.max_seq, &t->beh_train, &t->beh_cap))) return e;
  return lh_rollout_recompute(t->beh_train, b);
}

const float *lh_trainer_recompute_logits(const lh_trainer *t) {
  return t->beh_train ? lh_train_logits(t->beh_train) : NULL;
}

lh_err lh_trainer_step(lh_trainer *t, lh_trainer_step_stats *st) {
  memset(st, 0, sizeof *st);
  while (t->q_len > 0 && t->version - queue_at(t, 0)->version > t->cfg.max_staleness) {
    lh_rollout_batch old;
    queue_pop(t, &old);
    lh_log(LH_LOG_WARN,
           "trainer: dropped a batch of version %lld at version %lld (staleness "
           "bound %d)",
           (long long)old.version, (long long)t->version, t->cfg.max_staleness);
    lh_rollout_batch_free(&old);
    st->batches_dropped++;
  }
  if (t->q_len == 0) return lh_errorf(LH_ERR_NOTFOUND, "trainer: no batch is pending");
  lh_rollout_batch rb;
  queue_pop(t, &rb);
  lh_rl_batch tb;
  lh_err e = lh_rl_batch_assemble(&rb, &t->cfg.adv, &tb);
  if (e) {
    lh_rollout_batch_free(&rb);
    return e;
  }
  int max_seq = t->cfg.max_seq;
  if ((e = ensure_train(t->m, tb.seq_start[tb.n_seqs], max_seq, &t->train, &t->train_cap)))
    goto out;
  if (t->ref && tb.n_seqs > 0) { /* reference log-probs for the KL penalty */
    int N = tb.seq_start[tb.n_seqs];
    lh_batch full = {tb.n_seqs, tb.seq_start, tb.tokens, tb.weight};
    tb.ref = lh_xmalloc((size_t)N * sizeof *tb.ref);
    if ((e = ensure_train(t->ref, N, max_seq, &t->ref_train, &t->ref_cap)) ||
        (e = lh_batch_validate(t->ref_train, &full)))
      goto out;
    lh_train_forward(t->ref_train, &full, tb.ref);
  }
  lh_rl_step_stats *ss = &st->update;
  if ((e = lh_rl_update(t->train, t->opt, t->m, &t->cfg.loss, t->cfg.minibatches, &tb, ss)))
    goto out;
  st->batch_version = rb.version;
  st->staleness = t->version - rb.version;
  st->groups_used = tb.n_groups_used;
  st->groups_skipped = tb.n_groups_skipped;
  st->groups_failed = tb.n_groups_failed;
  if (ss->loss.n_valid > 0 && !isfinite(ss->loss.loss)) {
    e = lh_errorf(LH_ERR_NONFINITE,
                  "update %lld: the loss is %g (a weight, log-prob or advantage is not finite); "
                  "nothing more is trained or written",
                  (long long)t->version + 1, ss->loss.loss);
    goto out;
  }
  if ((e = lh_infer_update(t->policy, t->m))) goto out;
  t->version++;
  st->version = t->version;
  if (ss->loss.n_valid == 0) { /* nothing trained: no loss or ratio to report (null, not 0) */
    lh_loss_stats *l = &ss->loss;
    l->loss = l->pg_loss = l->kl_loss = l->kl_mu_pi = l->clip_frac = l->masked_frac = NAN;
    l->ratio_min = l->ratio_mean = l->ratio_max = NAN;
  }
  if (ss->n_updates == 0) ss->grad_norm = NAN;
  st->lr = lh_adamw_lr(&t->opt->cfg, t->opt->step > 0 ? t->opt->step - 1 : 0);
out:
  lh_rl_batch_free(&tb);
  lh_rollout_batch_free(&rb);
  return e;
}

/* ---------------------------------------------------------------- state file */

typedef struct entries {
  lh_st_entry *e;
  char (*names)[32];
  uint8_t **blobs; /* encoded batches, freed with the entries */
  int n, cap;
} entries;

static void put(entries *es, const char *name, lh_dtype dt, int64_t count, const void *data) {
  LH_CHECK(es->n < es->cap, "trainer state: %d entries", es->n);
  lh_st_entry *e = &es->e[es->n];
  memset(e, 0, sizeof *e);
  snprintf(es->names[es->n], sizeof es->names[0], "%s", name);
  e->name = es->names[es->n];
  e->dtype = dt;
  e->ndim = 1;
  e->shape[0] = count;
  e->data = data;
  es->n++;
}

static void weights_hash(const lh_model *m, uint8_t h[LH_HASH_BYTES]) {
  lh_hash256(m->params, m->n_params * sizeof *m->params, h);
}

lh_err lh_trainer_save(const lh_trainer *t, const char *path) {
  entries es = {0};
  es.cap = 8 + t->q_len;
  es.e = lh_xcalloc((size_t)es.cap, sizeof *es.e);
  es.names = lh_xcalloc((size_t)es.cap, sizeof *es.names);
  es.blobs = lh_xcalloc((size_t)t->q_len + 1, sizeof *es.blobs);
  int64_t format = STATE_FORMAT, counters[3] = {t->version, t->submitted, t->opt->step};
  uint8_t hash[LH_HASH_BYTES];
  weights_hash(t->m, hash);
  lh_err e = LH_ERR_OK;
  put(&es, "trainer.format", LH_DTYPE_I64, 1, &format);
  put(&es, "trainer.weights_blake2b", LH_DTYPE_U8, LH_HASH_BYTES, hash);
  put(&es, "rl.counters", LH_DTYPE_I64, 3, counters);
  put(&es, "adam.m", LH_DTYPE_F32, (int64_t)t->opt->n, t->opt->m);
  put(&es, "adam.v", LH_DTYPE_F32, (int64_t)t->opt->n, t->opt->v);
  /* a batch past the staleness bound would be dropped by the next step: it is not saved (a
   * state holds only batches lh_trainer_load takes back) */
  for (int i = 0, k = 0; i < t->q_len; i++) {
    const lh_rollout_batch *b = queue_at(t, i);
    if (t->version - b->version > t->cfg.max_staleness) continue;
    size_t len = 0;
    if ((e = lh_rollout_encode(b, &es.blobs[k], &len))) goto out;
    char name[32];
    snprintf(name, sizeof name, "queue.%d", k);
    put(&es, name, LH_DTYPE_U8, (int64_t)len, es.blobs[k]);
    k++;
  }
  static const char *const meta[] = {"format", STATE_KIND, "version", STATE_FORMAT_STR};
  e = lh_safetensors_write_meta(path, es.e, es.n, meta, 2);
out:
  for (int i = 0; i < t->q_len; i++)
    free(es.blobs[i]);
  free(es.blobs);
  free(es.names);
  free(es.e);
  return e;
}

/* The 1-D tensor `name` of dtype dt with `count` elements (count < 0: any, returned). */
static lh_err find(const lh_safetensors *st, const char *path, const char *name, lh_dtype dt,
                   int64_t *count, const lh_st_tensor **out) {
  const lh_st_tensor *t = lh_safetensors_find(st, name);
  if (!t) return lh_errorf(LH_ERR_FORMAT, "%s: tensor %s is missing", path, name);
  int64_t n = t->ndim == 1 ? t->shape[0] : -1;
  static const char *const dtypes[] = {"F32", "BF16", "F16", "I32", "I64", "U8"};
  if (t->dtype != dt || n < 0 || (*count >= 0 && n != *count)) {
    if (*count >= 0)
      return lh_errorf(LH_ERR_FORMAT, "%s: tensor %s: expected a 1-D %s tensor of %lld entries",
                       path, name, dtypes[dt], (long long)*count);
    return lh_errorf(LH_ERR_FORMAT, "%s: tensor %s: expected a 1-D %s tensor", path, name,
                     dtypes[dt]);
  }
  *count = n;
  *out = t;
  return LH_ERR_OK;
}

static int64_t get_i64(const lh_st_tensor *t, int i) {
  int64_t v;
  memcpy(&v, t->data + 8 * (size_t)i, 8);
  return v;
}

lh_err lh_trainer_load(lh_trainer *t, const char *path, int64_t step) {
  lh_safetensors *st = NULL;
  lh_err e = lh_safetensors_open(path, &st);
  if (e) return e;
  lh_rollout_batch *q = NULL;
  int nq = 0;
  const lh_st_tensor *tf = NULL, *th = NULL, *tc = NULL, *tm = NULL, *tv = NULL;
  int64_t one = 1, three = 3, hb = LH_HASH_BYTES, np = (int64_t)t->opt->n;
  const char *kind = lh_safetensors_meta(st, "format"),
             *meta_version = lh_safetensors_meta(st, "version");
  if (kind && strcmp(kind, STATE_KIND) && strcmp(kind, "pt")) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: a safetensors file of format \"%s\", not a trainer state",
                  path, kind);
    goto out;
  }
  if (kind && !strcmp(kind, STATE_KIND) &&
      (!meta_version || strcmp(meta_version, STATE_FORMAT_STR))) {
    e = lh_errorf(LH_ERR_UNSUPPORTED, "%s: trainer state version %s, this longhaul reads %s", path,
                  meta_version ? meta_version : "(none)", STATE_FORMAT_STR);
    goto out;
  }
  for (int i = 0; i < st->n; i++) { /* every tensor is one this reader knows */
    const char *nm = st->tensors[i].name;
    int qi = -1, used = 0;
    bool known =
        !strcmp(nm, "trainer.format") || !strcmp(nm, "trainer.weights_blake2b") ||
        !strcmp(nm, "rl.counters") || !strcmp(nm, "adam.m") || !strcmp(nm, "adam.v") ||
        (sscanf(nm, "queue.%d%n", &qi, &used) == 1 && nm[used] == '\0' && qi >= 0 && qi < st->n);
    if (!known) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: unexpected tensor %s", path, nm);
      goto out;
    }
  }
  if (!lh_safetensors_find(st, "trainer.format")) {
    e = lh_errorf(LH_ERR_UNSUPPORTED,
                  "%s: a trainer state of format 1 (an older longhaul), without the step and "
                  "weights hash this one checks; this longhaul writes format %d",
                  path, STATE_FORMAT);
    goto out;
  }
  if ((e = find(st, path, "trainer.format", LH_DTYPE_I64, &one, &tf))) goto out;
  if (get_i64(tf, 0) != STATE_FORMAT) {
    e = lh_errorf(LH_ERR_UNSUPPORTED, "%s: trainer state format %lld, this longhaul reads %d", path,
                  (long long)get_i64(tf, 0), STATE_FORMAT);
    goto out;
  }
  if ((e = find(st, path, "trainer.weights_blake2b", LH_DTYPE_U8, &hb, &th)) ||
      (e = find(st, path, "rl.counters", LH_DTYPE_I64, &three, &tc)) ||
      (e = find(st, path, "adam.m", LH_DTYPE_F32, &np, &tm)) ||
      (e = find(st, path, "adam.v", LH_DTYPE_F32, &np, &tv)))
    goto out;
  int64_t version = get_i64(tc, 0), submitted = get_i64(tc, 1), adam_step = get_i64(tc, 2);
  if (version != step) {
    e = lh_errorf(LH_ERR_MISMATCH,
                  "%s: the trainer state is of step %lld, but it is in the checkpoint of step "
                  "%lld (copied from another checkpoint?)",
                  path, (long long)version, (long long)step);
    goto out;
  }
  uint8_t hash[LH_HASH_BYTES];
  weights_hash(t->m, hash);
  if (memcmp(hash, th->data, LH_HASH_BYTES) != 0) {
    char want[2 * LH_HASH_BYTES + 1], got[2 * LH_HASH_BYTES + 1];
    lh_hash_hex(th->data, want);
    lh_hash_hex(hash, got);
    e = lh_errorf(LH_ERR_MISMATCH,
                  "%s: the trainer state belongs to weights with BLAKE2b %.16s..., the "
                  "checkpoint's weights hash to %.16s... (a state copied from another "
                  "checkpoint?)",
                  path, want, got);
    goto out;
  }
  if (submitted < version || adam_step < 0) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: rl.counters (%lld, %lld, %lld) are inconsistent", path,
                  (long long)version, (long long)submitted, (long long)adam_step);
    goto out;
  }
  const float *m = (const float *)tm->data, *v = (const float *)tv->data;
  for (size_t i = 0; i < t->opt->n; i++) { /* a NaN moment would turn every later step to NaN */
    float mi, vi;
    memcpy(&mi, m + i, 4);
    memcpy(&vi, v + i, 4);
    const char *bad = !isfinite(mi) ? "m" : !(vi >= 0.0f && isfinite(vi)) ? "v" : NULL;
    if (bad) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: adam.%s[%zu] is %g, expected a finite number%s", path, bad,
                    i, (double)(*bad == 'm' ? mi : vi), *bad == 'v' ? " >= 0" : "");
      goto out;
    }
  }
  lh_rollout_limits lim = lh_rollout_default_limits();
  lim.vocab = t->m->cfg.vocab_size;
  for (;; nq++) {
    char name[32];
    snprintf(name, sizeof name, "queue.%d", nq);
    if (!lh_safetensors_find(st, name)) {
      for (int later = nq + 1; later < st->n; later++) { /* queue.N must be 0, 1, 2, ... */
        snprintf(name, sizeof name, "queue.%d", later);
        if (lh_safetensors_find(st, name)) {
          e = lh_errorf(LH_ERR_FORMAT, "%s: tensor %s without queue.%d", path, name, nq);
          goto out;
        }
      }
      break;
    }
    int64_t any = -1;
    const lh_st_tensor *tq = NULL;
    if ((e = find(st, path, name, LH_DTYPE_U8, &any, &tq))) goto out;
    q = realloc(q, (size_t)(nq + 1) * sizeof *q);
    LH_CHECK(q, "out of memory");
    size_t wcap = strlen(path) + strlen(name) + 3;
    char *what = lh_xmalloc(wcap);
    snprintf(what, wcap, "%s: %s", path, name);
    e = lh_rollout_decode(tq->data, tq->nbytes, &lim, what, &q[nq]);
    if (e) {
      free(what);
      goto out;
    }
    if (q[nq].version > version || version - q[nq].version > t->cfg.max_staleness) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: version %lld, expected %lld..%lld", what,
                    (long long)q[nq].version, (long long)(version - t->cfg.max_staleness),
                    (long long)version);
      nq++;
      free(what);
      goto out;
    }
    free(what);
  }
  /* everything checked: apply */
  memcpy(t->opt->m, tm->data, t->opt->n * sizeof(float));
  memcpy(t->opt->v, tv->data, t->opt->n * sizeof(float));
  t->opt->step = adam_step;
  t->version = version;
  t->submitted = submitted;
  while (t->q_len > 0) {
    lh_rollout_batch b;
    queue_pop(t, &b);
    lh_rollout_batch_free(&b);
  }
  for (int i = 0; i < nq; i++)
    queue_push(t, &q[i]);
  nq = 0;
out:
  for (int i = 0; i < nq; i++)
    lh_rollout_batch_free(&q[i]);
  free(q);
  lh_safetensors_close(st);
  return e;
}

lh_err lh_trainer_checkpoint(lh_trainer *t, lh_rundir *rd, const lh_model_files *files, int keep,
                             char **dir) {
  char *tmp = NULL, *state = NULL, *made = NULL;
  lh_err e;
  if ((e = lh_rundir_checkpoint_begin(rd, t->version, &tmp))) return e;
  state = lh_path_join(tmp, "trainer_state.safetensors");
  if (!(e = lh_model_dir_save(t->m, tmp, LH_SAVE_F32, files)) && !(e = lh_trainer_save(t, state)) &&
      !(e = lh_rundir_checkpoint_commit(rd, t->version, keep, &made)) && dir) {
    free(*dir);
    *dir = made;
    made = NULL;
  }
  free(made);
  free(tmp);
  free(state);
  return e;
}
