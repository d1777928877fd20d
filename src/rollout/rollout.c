/* longhaul rollout: generation and scoring. Tasks of an environment are encoded, sampled group by
 * group with the rollout engine (one lh_generate call for the whole batch, so continuous batching
 * keeps every slot busy), decoded and scored; scoring alone recomputes rewards from tokens. */
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/rollout.h"

void lh_rollout_batch_free(lh_rollout_batch *b) {
  if (!b) return;
  free(b->task_index);
  free(b->group_ok);
  free(b->seq_start);
  free(b->prompt_len);
  free(b->tokens);
  free(b->mu);
  free(b->old);
  free(b->reward);
  free(b->correct);
  free(b->well_formed);
  free(b->finish);
  memset(b, 0, sizeof *b);
}

/* Scores every ok group of a packed batch from its tokens (task[t] is group t's task, or NULL
 * to fetch it), then repacks the batch without the groups the environment failed on. */
static lh_err score_groups(const lh_tokenizer *tok, lh_env *env, const lh_env_task *task,
                           lh_rollout_batch *b) {
  int G = b->group_size, n = b->n_groups * G;
  lh_err e = LH_ERR_OK;
  for (int t = 0; t < b->n_groups; t++) {
    if (!b->group_ok[t]) continue;
    lh_env_task own = {0};
    const lh_env_task *tk = task ? &task[t] : &own;
    if (!task && lh_env_task_get(env, b->split, b->task_index[t], &own)) {
      lh_log(LH_LOG_WARN, "rollout: task %llu skipped: %s", (unsigned long long)b->task_index[t],
             lh_last_error());
      b->group_ok[t] = 0;
      continue;
    }
    for (int j = 0; j < G; j++) {
      int s = t * G + j, at = b->seq_start[s] + b->prompt_len[s];
      char *text = NULL;
      size_t len = 0;
      if ((e = lh_tokenizer_decode(tok, b->tokens + at, (size_t)(b->seq_start[s + 1] - at), true,
                                   &text, &len))) {
        lh_env_task_clear(&own);
        return e;
      }
      lh_env_result r;
      lh_err se = lh_env_score(env, tk, text, len, &r);
      free(text);
      if (se) {
        lh_log(LH_LOG_WARN, "rollout: task %llu skipped, scoring failed: %s",
               (unsigned long long)b->task_index[t], lh_last_error());
        b->group_ok[t] = 0;
        break;
      }
      b->reward[s] = r.reward;
      b->correct[s] = r.correct;
      b->well_formed[s] = r.well_formed;
    }
    lh_env_task_clear(&own);
  }
  /* A group whose scoring failed keeps no tokens: repack without it. */
  int at = 0;
  for (int s = 0; s < n; s++) {
    int a = b->seq_start[s], end = b->seq_start[s + 1];
    b->seq_start[s] = at;
    if (!b->group_ok[s / G]) {
      b->prompt_len[s] = 0;
      b->reward[s] = 0.0f;
      b->correct[s] = b->well_formed[s] = 0;
      b->finish[s] = 0;
      continue;
    }
    memmove(b->tokens + at, b->tokens + a, (size_t)(end - a) * sizeof *b->tokens);
    memmove(b->mu + at, b->mu + a, (size_t)(end - a) * sizeof *b->mu);
    if (b->old) memmove(b->old + at, b->old + a, (size_t)(end - a) * sizeof *b->old);
    at += end - a;
  }
  b->seq_start[n] = at;
  return e;
}

lh_err lh_rollout_score(const lh_tokenizer *tok, lh_env *env, const lh_env_task *tasks,
                        lh_rollout_batch *b) {
  int G = b->group_size;
  lh_env_task *own = tasks ? NULL : lh_xcalloc((size_t)b->n_groups, sizeof *own);
  const lh_env_task *task = own ? own : tasks;
  lh_err e = LH_ERR_OK;
  /* every sequence must start with its task's prompt, encoded as generation encodes it: the
   * reward of another prompt's completion says nothing about this task */
  for (int t = 0; t < b->n_groups && !e; t++) {
    if (!b->group_ok[t]) continue;
    if (own && lh_env_task_get(env, b->split, b->task_index[t], &own[t])) {
      lh_log(LH_LOG_WARN, "rollout: task %llu skipped: %s", (unsigned long long)b->task_index[t],
             lh_last_error());
      b->group_ok[t] = 0;
      continue;
    }
    if (!task[t].prompt) {
      b->group_ok[t] = 0;
      continue;
    }
    int32_t *p = NULL;
    size_t np = 0;
    if ((e = lh_tokenizer_encode(tok, task[t].prompt, strlen(task[t].prompt), true, &p, &np)))
      break;
    for (int j = 0; j < G; j++) {
      int s = t * G + j;
      if ((size_t)b->prompt_len[s] != np ||
          memcmp(b->tokens + b->seq_start[s], p, np * sizeof *p) != 0) {
        lh_log(LH_LOG_WARN,
               "rollout: task %llu skipped: sequence %d does not start with its "
               "prompt (%zu tokens)",
               (unsigned long long)b->task_index[t], s, np);
        b->group_ok[t] = 0;
        break;
      }
    }
    free(p);
  }
  if (!e) e = score_groups(tok, env, task, b);
  if (own)
    for (int t = 0; t < b->n_groups; t++)
      lh_env_task_clear(&own[t]);
  free(own);
  return e;
}

/* The batch's arrays and provenance for n_groups groups of group_size (version 0). */
static void batch_alloc(const lh_gen_config *gc, int n_groups, int group_size, uint64_t seq_base,
                        lh_split split, lh_rollout_batch *out) {
  int n = n_groups * group_size;
  out->n_groups = n_groups;
  out->group_size = group_size;
  out->split = split;
  out->seed = gc->seed;
  out->stream_base = seq_base;
  out->sample = gc->sample;
  out->max_new = gc->max_new;
  out->task_index = lh_xcalloc((size_t)n_groups, sizeof *out->task_index);
  out->group_ok = lh_xcalloc((size_t)n_groups, 1);
  out->seq_start = lh_xcalloc((size_t)n + 1, sizeof *out->seq_start);
  out->prompt_len = lh_xcalloc((size_t)n, sizeof *out->prompt_len);
  out->reward = lh_xcalloc((size_t)n, sizeof *out->reward);
  out->correct = lh_xcalloc((size_t)n, 1);
  out->well_formed = lh_xcalloc((size_t)n, 1);
  out->finish = lh_xcalloc((size_t)n, 1);
}

/* Generates the completions of the groups marked ok in out->group_ok from their prompts
 * (prompts[t], plen[t] tokens) and packs prompt + completion per sequence into out (allocated by
 * batch_alloc). Completion j of group t uses stream bases[t] + j, or without bases
 * out->stream_base + t * group_size + j. */
static lh_err generate_groups(lh_generator *g, const lh_gen_config *gc,
                              const int32_t *const *prompts, const size_t *plen,
                              const uint64_t *bases, lh_rollout_batch *out) {
  int n_groups = out->n_groups, group_size = out->group_size, max_new = gc->max_new;
  int n = n_groups * group_size;
  lh_gen_request *reqs = lh_xcalloc((size_t)n, sizeof *reqs);
  lh_gen_output *outs = lh_xcalloc((size_t)n, sizeof *outs);
  int32_t *gtok = lh_xmalloc((size_t)n * max_new * sizeof *gtok);
  float *glp = lh_xmalloc((size_t)n * max_new * sizeof *glp);
  float *glpm = lh_xmalloc((size_t)n * max_new * sizeof *glpm);
  lh_err e = LH_ERR_OK;
  int n_req = 0;
  for (int t = 0; t < n_groups; t++) {
    if (!out->group_ok[t]) continue;
    for (int j = 0; j < group_size; j++) {
      lh_gen_request *r = &reqs[n_req];
      r->prompt = prompts[t];
      r->prompt_len = (int)plen[t];
      r->seq_index = bases ? bases[t] + (uint64_t)j
                           : out->stream_base + (uint64_t)t * group_size + (uint64_t)j;
      lh_gen_output *o = &outs[t * group_size + j];
      o->tokens = gtok + (size_t)(t * group_size + j) * max_new;
      o->logprobs = glp + (size_t)(t * group_size + j) * max_new;
      o->logprobs_model = glpm + (size_t)(t * group_size + j) * max_new;
      n_req++;
    }
  }
  /* lh_generate fills outs in request order: compact the ok groups' outputs for it. */
  lh_gen_output *gouts = lh_xmalloc((size_t)(n_req > 0 ? n_req : 1) * sizeof *gouts);
  for (int t = 0, k = 0; t < n_groups; t++)
    for (int j = 0; j < group_size && out->group_ok[t]; j++)
      gouts[k++] = outs[t * group_size + j];
  if (n_req > 0 && (e = lh_generate(g, gc, reqs, n_req, gouts, NULL))) {
    free(gouts);
    goto done;
  }
  for (int t = 0, k = 0; t < n_groups; t++)
    for (int j = 0; j < group_size && out->group_ok[t]; j++)
      outs[t * group_size + j] = gouts[k++];
  free(gouts);

  /* Pack prompt + completion per sequence. */
  size_t total = 0;
  for (int t = 0; t < n_groups; t++)
    if (out->group_ok[t])
      for (int j = 0; j < group_size; j++)
        total += plen[t] + (size_t)outs[t * group_size + j].n;
  out->tokens = lh_xmalloc((total ? total : 1) * sizeof *out->tokens);
  out->mu = lh_xmalloc((total ? total : 1) * sizeof *out->mu);
  int at = 0;
  for (int t = 0; t < n_groups; t++) {
    for (int j = 0; j < group_size; j++) {
      int s = t * group_size + j;
      out->seq_start[s] = at;
      if (!out->group_ok[t]) continue;
      const lh_gen_output *o = &outs[s];
      out->prompt_len[s] = (int)plen[t];
      memcpy(out->tokens + at, prompts[t], plen[t] * sizeof *out->tokens);
      memset(out->mu + at, 0, plen[t] * sizeof *out->mu);
      at += (int)plen[t];
      memcpy(out->tokens + at, o->tokens, (size_t)o->n * sizeof *out->tokens);
      memcpy(out->mu + at, o->logprobs, (size_t)o->n * sizeof *out->mu);
      at += o->n;
      out->finish[s] = (uint8_t)o->finish;
    }
  }
  out->seq_start[n] = at;
done:
  free(reqs);
  free(outs);
  free(gtok);
  free(glp);
  free(glpm);
  return e;
}

lh_err lh_rollout_generate(lh_generator *g, const lh_gen_config *gc, const lh_tokenizer *tok,
                           lh_env *env, lh_split split, const uint64_t *task_index,
                           const lh_env_task *tasks, int n_groups, int group_size,
                           uint64_t seq_base, lh_rollout_batch *out) {
  memset(out, 0, sizeof *out);
  if (n_groups < 1 || group_size < 1 || gc->max_new < 1)
    return lh_errorf(LH_ERR_INVAL, "rollout: %d groups of %d, max_new %d: all must be >= 1",
                     n_groups, group_size, gc->max_new);
  int room = lh_generator_max_seq(g) - gc->max_new; /* prompt tokens at most */
  /* the tasks fetched here when the caller passed none; group t's task is task[t] */
  lh_env_task *own = tasks ? NULL : lh_xcalloc((size_t)n_groups, sizeof *own);
  const lh_env_task *task = own ? own : tasks;
  int32_t **prompts = lh_xcalloc((size_t)n_groups, sizeof *prompts);
  size_t *plen = lh_xcalloc((size_t)n_groups, sizeof *plen);
  batch_alloc(gc, n_groups, group_size, seq_base, split, out);
  lh_err e = LH_ERR_OK;

  /* Tasks and prompts; failed tasks are left out of the generation. */
  for (int t = 0; t < n_groups; t++) {
    out->task_index[t] = task_index[t];
    if (own && lh_env_task_get(env, split, task_index[t], &own[t])) {
      lh_log(LH_LOG_WARN, "rollout: task %llu skipped: %s", (unsigned long long)task_index[t],
             lh_last_error());
      continue;
    }
    const char *p = task[t].prompt;
    if (!p) continue; /* the caller's fetch failed (and was logged there) */
    if ((e = lh_tokenizer_encode(tok, p, strlen(p), true, &prompts[t], &plen[t]))) goto done;
    if (plen[t] > (size_t)room) {
      lh_log(LH_LOG_WARN,
             "rollout: task %llu skipped: its prompt has %zu tokens, more than the %d that "
             "leave room for %d new tokens",
             (unsigned long long)task_index[t], plen[t], room, gc->max_new);
      continue;
    }
    out->group_ok[t] = 1;
  }
  e = generate_groups(g, gc, (const int32_t *const *)prompts, plen, NULL, out);
  if (!e) e = score_groups(tok, env, task, out);

done:
  for (int t = 0; t < n_groups; t++) {
    if (own) lh_env_task_clear(&own[t]);
    free(prompts[t]);
  }
  free(own);
  free(prompts);
  free(plen);
  if (e) lh_rollout_batch_free(out);
  return e;
}

/* Group t of `all` as a batch of its own (copies), with its stream base. */
static void take_group(const lh_rollout_batch *all, int t, uint64_t stream_base,
                       lh_rollout_batch *one) {
  int G = all->group_size, s0 = t * G, a = all->seq_start[s0], N = all->seq_start[s0 + G] - a;
  memset(one, 0, sizeof *one);
  one->n_groups = 1;
  one->group_size = G;
  one->version = all->version;
  one->split = all->split;
  one->seed = all->seed;
  one->stream_base = stream_base;
  one->sample = all->sample;
  one->max_new = all->max_new;
  one->task_index = lh_xmalloc(sizeof *one->task_index);
  one->task_index[0] = all->task_index[t];
  one->group_ok = lh_xmalloc(1);
  one->group_ok[0] = all->group_ok[t];
  one->seq_start = lh_xmalloc(((size_t)G + 1) * sizeof *one->seq_start);
  for (int j = 0; j <= G; j++)
    one->seq_start[j] = all->seq_start[s0 + j] - a;
  one->prompt_len = lh_xmalloc((size_t)G * sizeof *one->prompt_len);
  memcpy(one->prompt_len, all->prompt_len + s0, (size_t)G * sizeof *one->prompt_len);
  one->tokens = lh_xmalloc((size_t)(N ? N : 1) * sizeof *one->tokens);
  memcpy(one->tokens, all->tokens + a, (size_t)N * sizeof *one->tokens);
  one->mu = lh_xmalloc((size_t)(N ? N : 1) * sizeof *one->mu);
  memcpy(one->mu, all->mu + a, (size_t)N * sizeof *one->mu);
  one->reward = lh_xcalloc((size_t)G, sizeof *one->reward);
  one->correct = lh_xcalloc((size_t)G, 1);
  one->well_formed = lh_xcalloc((size_t)G, 1);
  one->finish = lh_xmalloc((size_t)G);
  memcpy(one->finish, all->finish + s0, (size_t)G);
}

lh_err lh_rollout_generate_ids(lh_generator *g, const lh_gen_config *gc, lh_split split,
                               const uint64_t *task_index, const int32_t *const *prompts,
                               const int *prompt_len, const uint64_t *stream_base, int n_groups,
                               int group_size, lh_rollout_batch *out) {
  for (int t = 0; t < n_groups; t++)
    memset(&out[t], 0, sizeof out[t]);
  if (n_groups < 1 || group_size < 1 || gc->max_new < 1)
    return lh_errorf(LH_ERR_INVAL, "rollout: %d groups of %d, max_new %d: all must be >= 1",
                     n_groups, group_size, gc->max_new);
  int room = lh_generator_max_seq(g) - gc->max_new;
  for (int t = 0; t < n_groups; t++)
    if (prompt_len[t] < 1 || prompt_len[t] > room)
      return lh_errorf(LH_ERR_LIMIT,
                       "rollout: group %d: a prompt of %d tokens; 1 .. %d leave room for %d new "
                       "tokens",
                       t, prompt_len[t], room, gc->max_new);
  size_t *plen = lh_xmalloc((size_t)n_groups * sizeof *plen);
  lh_rollout_batch all;
  memset(&all, 0, sizeof all);
  batch_alloc(gc, n_groups, group_size, 0, split, &all);
  for (int t = 0; t < n_groups; t++) {
    all.task_index[t] = task_index[t];
    all.group_ok[t] = 1;
    plen[t] = (size_t)prompt_len[t];
  }
  lh_err e = generate_groups(g, gc, prompts, plen, stream_base, &all);
  free(plen);
  for (int t = 0; !e && t < n_groups; t++)
    take_group(&all, t, stream_base[t], &out[t]);
  lh_rollout_batch_free(&all);
  return e;
}

lh_err lh_rollout_recompute(lh_train *t, lh_rollout_batch *b) {
  int n = b->n_groups * b->group_size, N = b->seq_start[n];
  free(b->old);
  b->old = lh_xcalloc((size_t)(N > 0 ? N : 1), sizeof *b->old);
  /* The non-empty sequences (failed groups have none) as one training batch. */
  int *starts = lh_xmalloc(((size_t)n + 1) * sizeof *starts);
  float *w = lh_xcalloc((size_t)(N > 0 ? N : 1), sizeof *w);
  int k = 0;
  starts[0] = 0;
  for (int s = 0; s < n; s++)
    if (b->seq_start[s + 1] > b->seq_start[s]) starts[++k] = b->seq_start[s + 1];
  lh_err e = LH_ERR_OK;
  if (k > 0) {
    lh_batch tb = {k, starts, b->tokens, w};
    if (!(e = lh_batch_validate(t, &tb))) lh_train_forward(t, &tb, b->old);
  }
  free(starts);
  free(w);
  return e;
}

lh_rollout_summary lh_rollout_summarise(const lh_rollout_batch *b) {
  lh_rollout_summary g = {0};
  int n = b->n_groups * b->group_size, cnt = 0;
  double r2 = 0.0, lp = 0.0;
  for (int t = 0; t < b->n_groups; t++)
    b->group_ok[t] ? g.groups_ok++ : g.groups_failed++;
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

lh_err lh_rollout_concat(const lh_rollout_batch *const *parts, int n_parts, lh_rollout_batch *out) {
  memset(out, 0, sizeof *out);
  if (n_parts < 1) return lh_errorf(LH_ERR_INVAL, "rollout: concat of no batches");
  const lh_rollout_batch *p0 = parts[0];
  int groups = 0, gs = p0->group_size;
  size_t N = 0;
  bool old = true;
  int64_t version = p0->version;
  for (int i = 0; i < n_parts; i++) {
    const lh_rollout_batch *p = parts[i];
    if (p->group_size != gs)
      return lh_errorf(LH_ERR_MISMATCH, "rollout: concat: groups of %d and of %d", gs,
                       p->group_size);
    if (groups > INT_MAX / gs - p->n_groups)
      return lh_errorf(LH_ERR_LIMIT, "rollout: concat: too many groups");
    groups += p->n_groups;
    N += (size_t)p->seq_start[p->n_groups * gs];
    old = old && p->old;
    if (p->version < version) version = p->version;
  }
  if (N > (size_t)INT_MAX) return lh_errorf(LH_ERR_LIMIT, "rollout: concat: %zu tokens", N);
  int n = groups * gs;
  *out = *p0; /* provenance of the first */
  out->n_groups = groups;
  out->version = version;
  out->task_index = lh_xmalloc((size_t)groups * sizeof *out->task_index);
  out->group_ok = lh_xmalloc((size_t)groups);
  out->seq_start = lh_xmalloc(((size_t)n + 1) * sizeof *out->seq_start);
  out->prompt_len = lh_xmalloc((size_t)n * sizeof *out->prompt_len);
  out->tokens = lh_xmalloc((N ? N : 1) * sizeof *out->tokens);
  out->mu = lh_xmalloc((N ? N : 1) * sizeof *out->mu);
  out->old = old ? lh_xmalloc((N ? N : 1) * sizeof *out->old) : NULL;
  out->reward = lh_xmalloc((size_t)n * sizeof *out->reward);
  out->correct = lh_xmalloc((size_t)n);
  out->well_formed = lh_xmalloc((size_t)n);
  out->finish = lh_xmalloc((size_t)n);
  int g = 0, s = 0, at = 0;
  for (int i = 0; i < n_parts; i++) {
    const lh_rollout_batch *p = parts[i];
    int pn = p->n_groups * gs, pN = p->seq_start[pn];
    memcpy(out->task_index + g, p->task_index, (size_t)p->n_groups * sizeof *p->task_index);
    memcpy(out->group_ok + g, p->group_ok, (size_t)p->n_groups);
    for (int k = 0; k < pn; k++)
      out->seq_start[s + k] = at + p->seq_start[k];
    memcpy(out->prompt_len + s, p->prompt_len, (size_t)pn * sizeof *p->prompt_len);
    memcpy(out->tokens + at, p->tokens, (size_t)pN * sizeof *p->tokens);
    memcpy(out->mu + at, p->mu, (size_t)pN * sizeof *p->mu);
    if (old) memcpy(out->old + at, p->old, (size_t)pN * sizeof *p->old);
    memcpy(out->reward + s, p->reward, (size_t)pn * sizeof *p->reward);
    memcpy(out->correct + s, p->correct, (size_t)pn);
    memcpy(out->well_formed + s, p->well_formed, (size_t)pn);
    memcpy(out->finish + s, p->finish, (size_t)pn);
    g += p->n_groups, s += pn, at += pN;
  }
  out->seq_start[n] = at;
  return LH_ERR_OK;
}
