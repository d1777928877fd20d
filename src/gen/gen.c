/* longhaul generation loop: continuous batching over KV-cache slots with chunked prefill, the
 * verifiable sampler on every token, and stop tokens / stop strings. Buffers are sized when the
 * generator is created; a generate call allocates only per-call bookkeeping for its requests. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/gen.h"

#define STOP_TAIL 256 /* bytes of decoded completion kept per slot for stop-string matching */

typedef struct {
  int req;       /* request index, -1 when free */
  int len;       /* tokens of the sequence in the cache or queued: prompt + generated */
  int prefilled; /* prompt tokens already run through the model */
  int32_t last;  /* last sampled token (fed at position len-1 next step) */
  char tail[STOP_TAIL + 1];
  int tail_len;
} slot_state;

struct lh_generator {
  const lh_infer *m;
  lh_kv *kv;
  int n_slots, max_seq, chunk, max_rows, n_threads;
  lh_infer_row *rows;          /* (max_rows) */
  int *row_slot;               /* (max_rows) slot of each logits row */
  float *logits;               /* (max_rows, V) */
  lh_sample_scratch **scratch; /* (n_threads) n_threads = lh_threads() at creation */
  lh_sample_result *res;       /* (max_rows) */
  slot_state *slots;           /* (n_slots) */
};

lh_gen_config lh_gen_defaults(void) {
  lh_gen_config c;
  memset(&c, 0, sizeof c);
  c.sample = lh_sample_defaults();
  c.max_new = 64;
  return c;
}

const char *lh_finish_name(lh_finish f) {
  static const char *const names[] = {"length", "eos", "stop", "context"};
  return (unsigned)f < 4 ? names[f] : "unknown";
}

lh_err lh_generator_create(lh_infer *m, int n_slots, int max_seq, int prefill_chunk,
                           lh_generator **out) {
  *out = NULL;
  if (prefill_chunk <= 0) prefill_chunk = 256;
  if (n_slots > INT_MAX - prefill_chunk)
    return lh_errorf(LH_ERR_LIMIT,
                     "generator: %d slots and a prefill chunk of %d rows, more than %d rows",
                     n_slots, prefill_chunk, INT_MAX);
  lh_generator *g = lh_xcalloc(1, sizeof *g);
  g->m = m;
  g->n_slots = n_slots;
  g->max_seq = max_seq;
  g->chunk = prefill_chunk;
  g->max_rows = n_slots + prefill_chunk;
  lh_err err = lh_kv_create(m, n_slots, max_seq, g->max_rows, &g->kv);
  if (err) {
    free(g);
    return err;
  }
  int V = lh_infer_config(m)->vocab_size;
  size_t R = (size_t)g->max_rows;
  g->n_threads = lh_threads();
  g->scratch = lh_xcalloc((size_t)g->n_threads, sizeof *g->scratch);
  /* sized by the caller's slots and chunk: a failure is an error, not an abort */
  char what[96];
  snprintf(what, sizeof what, "generator: logits of %d rows x %d", g->max_rows, V);
  if (!(g->rows = lh_try_malloc_aligned(lh_size_mul(R, sizeof *g->rows), "generator: rows")) ||
      !(g->row_slot =
            lh_try_malloc_aligned(lh_size_mul(R, sizeof *g->row_slot), "generator: rows")) ||
      !(g->res = lh_try_malloc_aligned(lh_size_mul(R, sizeof *g->res), "generator: results")) ||
      !(g->slots = lh_try_malloc_aligned(lh_size_mul((size_t)n_slots, sizeof *g->slots),
                                         "generator: slots")) ||
      !(g->logits = lh_try_malloc_aligned(lh_size_mul(R, (size_t)V * sizeof(float)), what))) {
    lh_generator_free(g);
    return LH_ERR_NOMEM;
  }
  memset(g->slots, 0, (size_t)n_slots * sizeof *g->slots);
  for (int i = 0; i < g->n_threads; i++)
    g->scratch[i] = lh_sample_scratch_create(V);
  *out = g;
  return LH_ERR_OK;
}

void lh_generator_free(lh_generator *g) {
  if (!g) return;
  lh_kv_free(g->kv);
  free(g->rows);
  free(g->row_slot);
  free(g->logits);
  for (int i = 0; i < g->n_threads; i++)
    lh_sample_scratch_free(g->scratch[i]);
  free(g->scratch);
  free(g->slots);
  free(g->res);
  free(g);
}

int lh_generator_max_seq(const lh_generator *g) {
  return g->max_seq;
}

/* Whether a stop string ends inside the bytes this token adds to the completion. The window
 * searched is the slot's tail (the completion's last STOP_TAIL bytes before the token: enough
 * for any stop string, at most STOP_TAIL bytes, to start there) followed by all of the token's
 * bytes; the tail then becomes the window's last STOP_TAIL bytes. */
static bool hits_stop_string(const lh_gen_config *cfg, slot_state *s, int32_t token) {
  if (cfg->n_stop == 0) return false;
  char buf[5 * STOP_TAIL], *win = buf, *heap = NULL;
  size_t old = (size_t)s->tail_len, len;
  memcpy(buf, s->tail, old);
  long got = lh_tokenizer_token_bytes(cfg->tok, token, true, buf + old, sizeof buf - old);
  if (got >= 0) {
    len = (size_t)got;
  } else { /* a token longer than buf: decode it */
    char *text = NULL;
    if (lh_tokenizer_decode(cfg->tok, &token, 1, true, &text, &len) != LH_ERR_OK) return false;
    heap = lh_xmalloc(old + len);
    memcpy(heap, s->tail, old);
    memcpy(heap + old, text, len);
    free(text);
    win = heap;
  }
  size_t wlen = old + len;
  bool hit = false;
  for (int i = 0; i < cfg->n_stop && !hit; i++) {
    size_t n = strlen(cfg->stop[i]);
    /* a match must end after the first new byte: start at or after old + 1 - n */
    for (size_t at = old + 1 >= n ? old + 1 - n : 0; !hit && at + n <= wlen; at++)
      hit = memcmp(win + at, cfg->stop[i], n) == 0;
  }
  size_t keep = wlen < STOP_TAIL ? wlen : STOP_TAIL;
  memcpy(s->tail, win + wlen - keep, keep);
  s->tail_len = (int)keep;
  free(heap);
  return hit;
}

lh_err lh_generate(lh_generator *g, const lh_gen_config *cfg, const lh_gen_request *reqs, int n,
                   lh_gen_output *outs, lh_gen_stats *stats) {
  const lh_config *c = lh_infer_config(g->m);
  int V = c->vocab_size;
  lh_gen_stats st = {0};
  lh_err err = lh_sample_params_validate(&cfg->sample);
  if (err) return err;
  if (cfg->max_new < 1) return lh_errorf(LH_ERR_INVAL, "max_new must be at least 1");
  if (cfg->n_eos < 0 || cfg->n_eos > LH_GEN_MAX_STOP || cfg->n_stop < 0 ||
      cfg->n_stop > LH_GEN_MAX_STOP)
    return lh_errorf(LH_ERR_LIMIT, "at most %d stop tokens and %d stop strings", LH_GEN_MAX_STOP,
                     LH_GEN_MAX_STOP);
  if (cfg->n_stop > 0 && !cfg->tok) return lh_errorf(LH_ERR_INVAL, "stop strings need a tokenizer");
  for (int i = 0; i < cfg->n_stop; i++)
    if (!cfg->stop[i] || !cfg->stop[i][0] || strlen(cfg->stop[i]) > STOP_TAIL)
      return lh_errorf(LH_ERR_INVAL, "stop string %d is empty or longer than %d bytes", i,
                       STOP_TAIL);
  for (int r = 0; r < n; r++) {
    if (reqs[r].prompt_len < 1) return lh_errorf(LH_ERR_INVAL, "request %d has an empty prompt", r);
    if (reqs[r].prompt_len >= g->max_seq)
      return lh_errorf(LH_ERR_LIMIT,
                       "request %d: prompt of %d tokens leaves no room in a context of "
                       "%d tokens",
                       r, reqs[r].prompt_len, g->max_seq);
    for (int i = 0; i < reqs[r].prompt_len; i++)
      if (reqs[r].prompt[i] < 0 || reqs[r].prompt[i] >= V)
        return lh_errorf(LH_ERR_INVAL,
                         "request %d: prompt token %d is %d, outside the vocabulary "
                         "[0, %d)",
                         r, i, reqs[r].prompt[i], V);
  }
  int32_t eos[LH_GEN_MAX_STOP];
  int n_eos = cfg->n_eos;
  if (n_eos > 0) {
    memcpy(eos, cfg->eos_ids, (size_t)n_eos * sizeof *eos);
  } else if (c->n_eos > 0) {
    n_eos = c->n_eos < LH_GEN_MAX_STOP ? c->n_eos : LH_GEN_MAX_STOP;
    memcpy(eos, c->eos_ids, (size_t)n_eos * sizeof *eos);
  } else if (c->eos_token_id >= 0) {
    eos[0] = c->eos_token_id;
    n_eos = 1;
  }

  for (int s = 0; s < g->n_slots; s++)
    g->slots[s].req = -1;
  int next = 0, done = 0;
  for (int r = 0; r < n; r++)
    outs[r].n = 0;

  while (done < n) {
    /* refill free slots */
    for (int s = 0; s < g->n_slots && next < n; s++)
      if (g->slots[s].req < 0) {
        slot_state *ss = &g->slots[s];
        memset(ss, 0, sizeof *ss);
        ss->req = next++;
        ss->len = reqs[ss->req].prompt_len;
      }
    /* rows: decode rows of slots past their prompt, then one chunk of one slot's prompt */
    int nr = 0, nl = 0, budget = g->chunk;
    long prefill_rows = 0, decode_rows = 0;
    for (int s = 0; s < g->n_slots; s++) {
      slot_state *ss = &g->slots[s];
      if (ss->req < 0 || ss->prefilled < reqs[ss->req].prompt_len) continue;
      g->rows[nr++] = (lh_infer_row){s, ss->len - 1, ss->last, true};
      g->row_slot[nl++] = s;
      decode_rows++;
    }
    for (int s = 0; s < g->n_slots && budget > 0; s++) {
      slot_state *ss = &g->slots[s];
      if (ss->req < 0) continue;
      const lh_gen_request *rq = &reqs[ss->req];
      if (ss->prefilled >= rq->prompt_len) continue;
      int take = rq->prompt_len - ss->prefilled;
      take = take < budget ? take : budget;
      for (int i = 0; i < take; i++) {
        int pos = ss->prefilled + i;
        bool last = pos == rq->prompt_len - 1;
        g->rows[nr++] = (lh_infer_row){s, pos, rq->prompt[pos], last};
        if (last) g->row_slot[nl++] = s;
      }
      ss->prefilled += take;
      budget -= take;
      prefill_rows += take;
    }
    double t0 = lh_time_now();
    err = lh_infer_forward(g->m, g->kv, g->rows, nr, g->logits);
    if (err) return err;
    double t1 = lh_time_now();
    /* the forward's time is split between prefill and decode by rows */
    st.prefill_s += (t1 - t0) * (double)prefill_rows / nr;
    st.decode_s += (t1 - t0) * (double)decode_rows / nr;
    st.prefill_tokens += prefill_rows;
    st.forwards++;

    /* logits rows are in row order; with prefill rows mixed in, map each to its slot. The
     * sampler scratch is per thread, made for the thread count at creation: the team is never
     * larger, whatever lh_set_threads said since. */
    lh_sample_result *res = g->res;
#pragma omp parallel for schedule(static) if (nl > 1) num_threads(g->n_threads)
    for (int i = 0; i < nl; i++) {
      slot_state *ss = &g->slots[g->row_slot[i]];
      const lh_gen_request *rq = &reqs[ss->req];
      double u = lh_sample_uniform(cfg->seed, rq->seq_index, (uint64_t)ss->len);
      res[i] = lh_sample(g->logits + (size_t)i * V, V, &cfg->sample, u, g->scratch[lh_thread_id()]);
    }
    st.sample_s += lh_time_now() - t1;
    for (int i = 0; i < nl; i++) {
      int s = g->row_slot[i];
      slot_state *ss = &g->slots[s];
      lh_gen_output *o = &outs[ss->req];
      o->tokens[o->n] = res[i].token;
      o->logprobs[o->n] = res[i].logprob;
      o->logprobs_model[o->n] = res[i].logprob_model;
      o->n++;
      ss->last = res[i].token;
      ss->len++;
      st.decode_tokens++;
      bool finished = true;
      bool is_eos = false;
      for (int e = 0; e < n_eos; e++)
        is_eos |= res[i].token == eos[e];
      if (is_eos)
        o->finish = LH_FINISH_EOS;
      else if (hits_stop_string(cfg, ss, res[i].token))
        o->finish = LH_FINISH_STOP;
      else if (o->n >= cfg->max_new)
        o->finish = LH_FINISH_LENGTH;
      else if (ss->len >= g->max_seq)
        o->finish = LH_FINISH_CONTEXT;
      else
        finished = false;
      if (finished) {
        ss->req = -1;
        done++;
      }
    }
  }
  if (stats) *stats = st;
  return LH_ERR_OK;
}
