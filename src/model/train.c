/* longhaul training forward and backward for packed variable-length batches.
 * All activations live in one slab sized at lh_train_create for (max_tokens, max_seq); a step
 * allocates nothing. Backward accumulates into the gradient slab, which mirrors the parameter
 * slab's layout (lh_params views into both). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/model.h"
#include "longhaul/tensor.h"

struct lh_train {
  lh_model *m;
  int max_tokens, max_seq, n_threads;
  float *grads; /* (n_params) */
  lh_params g;
  float *acts; /* one slab for everything below */
  /* saved for backward, per layer l (stacked on a leading L axis) */
  float *x;      /* (L+1, N, C) residual stream entering layer l; x[L] enters the final norm */
  float *xmid;   /* (L, N, C) residual after attention */
  float *ln1;    /* (L, N, C) */
  float *ln2;    /* (L, N, C) */
  float *rstd1;  /* (L, N) */
  float *rstd2;  /* (L, N) */
  float *qkv;    /* (L, N, QKV) q | k | v per row, QKV = (H + 2*KV)*hd; q and k after RoPE */
  float *qk_x;   /* (L, N, (H+KV)*hd) q | k heads before their per-head norm (qk_norm only) */
  float *rstdq;  /* (L, N, H+KV) reciprocal RMS of each q and k head (qk_norm only) */
  float *att;    /* (L, N, H*hd) attention output, before o_proj */
  float *probs;  /* (L, H * max_tokens * max_seq) softmax rows, per sequence H*T*T */
  float *gu;     /* (L, N, 2F) gate | up per row */
  float *hmlp;   /* (L, N, F) silu(gate) * up */
  float *lnf;    /* (N, C) */
  float *rstdf;  /* (N) */
  float *logits; /* (N, V); backward turns it into dlogits in place */
  float *lse;    /* (N) log-sum-exp of each logits row */
  float *dlp;    /* (N) dloss/dlogprob for lh_train_ce_step */
  /* backward scratch */
  float *dx;   /* (N, C) gradient of the residual stream */
  float *dn;   /* (N, C) gradient of a norm output */
  float *dqkv; /* (N, QKV) */
  float *datt; /* (N, H*hd) */
  float *dgu;  /* (N, 2F) */
  float *dh;   /* (N, F) */
  float *dS;   /* (n_threads, max_seq, max_seq), n_threads = lh_threads() at creation */
  float *rope_cos, *rope_sin; /* (max_seq, hd/2) */
  int *pos;                   /* (max_tokens) position of each token in its sequence */
  size_t *probs_off;          /* (max_tokens+1) offset of each sequence's probs within a layer */
  int n_tokens;               /* of the last forward */
};

lh_err lh_train_create(lh_model *m, int max_tokens, int max_seq, lh_train **out) {
  *out = NULL;
  const lh_config *c = &m->cfg;
  if (max_tokens < 1 || max_seq < 1 || max_seq > max_tokens)
    return lh_errorf(LH_ERR_INVAL, "lh_train_create: need 1 <= max_seq (%d) <= max_tokens (%d)",
                     max_seq, max_tokens);
  if (max_seq > c->max_positions)
    return lh_errorf(LH_ERR_LIMIT, "lh_train_create: max_seq %d exceeds max_positions %d", max_seq,
                     c->max_positions);
  lh_train *t = lh_xcalloc(1, sizeof *t);
  t->m = m;
  t->max_tokens = max_tokens;
  t->max_seq = max_seq;
  t->n_threads = lh_threads();

  /* Sizes come from the config and the caller: products saturate at SIZE_MAX (lh_size_mul),
   * which no allocation satisfies, so an absurd size is an LH_ERR_NOMEM, not a wrap. */
#define MUL lh_size_mul
  size_t N = (size_t)max_tokens, L = (size_t)c->n_layers, C = (size_t)c->hidden_size;
  size_t QD = (size_t)c->n_heads * c->head_dim, KD = (size_t)c->n_kv_heads * c->head_dim;
  size_t QKV = QD + 2 * KD, F = (size_t)c->intermediate_size, V = (size_t)c->vocab_size;
  size_t S = (size_t)max_seq, P = MUL(MUL((size_t)c->n_heads, N), S);
  size_t half = (size_t)c->head_dim / 2, LN = L * N;
  size_t NH = c->qk_norm ? (size_t)(c->n_heads + c->n_kv_heads) : 0; /* normed heads per row */
  struct {
    float **p;
    size_t n;
  } parts[] = {
      {&t->x, MUL(LN + N, C)},
      {&t->xmid, MUL(LN, C)},
      {&t->ln1, MUL(LN, C)},
      {&t->ln2, MUL(LN, C)},
      {&t->rstd1, LN},
      {&t->rstd2, LN},
      {&t->qkv, MUL(LN, QKV)},
      {&t->att, MUL(LN, QD)},
      {&t->probs, MUL(L, P)},
      {&t->qk_x, MUL(LN, NH * c->head_dim)},
      {&t->rstdq, MUL(LN, NH)},
      {&t->gu, MUL(LN, 2 * F)},
      {&t->hmlp, MUL(LN, F)},
      {&t->lnf, MUL(N, C)},
      {&t->rstdf, N},
      {&t->logits, MUL(N, V)},
      {&t->lse, N},
      {&t->dlp, N},
      {&t->dx, MUL(N, C)},
      {&t->dn, MUL(N, C)},
      {&t->dqkv, MUL(N, QKV)},
      {&t->datt, MUL(N, QD)},
      {&t->dgu, MUL(N, 2 * F)},
      {&t->dh, MUL(N, F)},
      {&t->dS, MUL((size_t)t->n_threads, MUL(S, S))},
      {&t->rope_cos, MUL(S, half)},
      {&t->rope_sin, MUL(S, half)},
  };
  size_t total = 0, nparts = sizeof parts / sizeof parts[0];
  for (size_t i = 0; i < nparts; i++) {
    size_t n = parts[i].n > SIZE_MAX - 15 ? SIZE_MAX : (parts[i].n + 15) & ~(size_t)15;
    total = total > SIZE_MAX - n ? SIZE_MAX : total + n;
  }
  char what[160];
  snprintf(what, sizeof what,
           "training state: activations for %d tokens per batch and %d per sequence", max_tokens,
           max_seq);
  t->acts = lh_try_malloc_aligned(MUL(total, sizeof(float)), what);
#undef MUL
  t->grads =
      t->acts ? lh_try_malloc_aligned(m->n_params * sizeof(float), "training state: gradient slab")
              : NULL;
  if (!t->grads) {
    lh_train_free(t);
    return LH_ERR_NOMEM;
  }
  memset(t->grads, 0, m->n_params * sizeof(float));
  lh_params_point(c, t->grads, &t->g);
  size_t off = 0;
  for (size_t i = 0; i < nparts; i++) {
    *parts[i].p = t->acts + off;
    off += (parts[i].n + 15) & ~(size_t)15;
  }
  t->pos = lh_try_malloc_aligned(N * sizeof *t->pos, "training state: positions");
  t->probs_off = lh_try_malloc_aligned((N + 1) * sizeof *t->probs_off, "training state: offsets");
  if (!t->pos || !t->probs_off) {
    lh_train_free(t);
    return LH_ERR_NOMEM;
  }
  if (!NH) t->qk_x = t->rstdq = NULL;
  lh_config_rope_tables(c, t->rope_cos, t->rope_sin, max_seq);
  *out = t;
  return LH_ERR_OK;
}

void lh_train_free(lh_train *t) {
  if (!t) return;
  free(t->grads);
  free(t->acts);
  free(t->pos);
  free(t->probs_off);
  free(t);
}

float *lh_train_grads(lh_train *t) {
  return t->grads;
}

const lh_params *lh_train_grad_views(const lh_train *t) {
  return &t->g;
}

void lh_train_zero_grad(lh_train *t) {
  memset(t->grads, 0, t->m->n_params * sizeof(float));
}

const float *lh_train_logits(const lh_train *t) {
  return t->logits;
}

lh_err lh_batch_validate(const lh_train *t, const lh_batch *b) {
  if (b->n_seqs < 1) return lh_errorf(LH_ERR_INVAL, "batch: no sequences");
  if (b->seq_start[0] != 0) return lh_errorf(LH_ERR_INVAL, "batch: seq_start[0] must be 0");
  for (int s = 0; s < b->n_seqs; s++) {
    int T = b->seq_start[s + 1] - b->seq_start[s];
    if (T < 1 || T > t->max_seq)
      return lh_errorf(LH_ERR_LIMIT, "batch: sequence %d has %d tokens, allowed 1..%d", s, T,
                       t->max_seq);
    if (b->seq_start[s + 1] > t->max_tokens)
      return lh_errorf(LH_ERR_LIMIT, "batch: more than %d tokens", t->max_tokens);
    if (b->loss_weight[b->seq_start[s]] != 0.0f)
      return lh_errorf(LH_ERR_INVAL, "batch: sequence %d: first token has a loss weight", s);
  }
  int N = b->seq_start[b->n_seqs], V = t->m->cfg.vocab_size;
  for (int i = 0; i < N; i++)
    if (b->tokens[i] < 0 || b->tokens[i] >= V)
      return lh_errorf(LH_ERR_INVAL, "batch: token %d at %d outside the vocabulary [0, %d)",
                       b->tokens[i], i, V);
  return LH_ERR_OK;
}

/* Adds a bias row to every row of x (N, D). */
static void add_bias(float *x, const float *bias, int N, int D) {
  if (!bias) return;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    float *xi = x + (size_t)i * D;
#pragma omp simd
    for (int j = 0; j < D; j++)
      xi[j] += bias[j];
  }
}

/* db (D) += column sums of dx (N, D), rows in order. */
static void bias_grad(float *db, const float *dx, int N, int D) {
  if (!db) return;
  for (int i = 0; i < N; i++) {
    const float *r = dx + (size_t)i * D;
#pragma omp simd
    for (int j = 0; j < D; j++)
      db[j] += r[j];
  }
}

/* Rotates the q and k heads of every row of a fused (N, QKV) buffer (inverse for backward). */
static void rope_rows(lh_train *t, float *qkv, int N, int inverse) {
  const lh_config *c = &t->m->cfg;
  int hd = c->head_dim, QKV = (c->n_heads + 2 * c->n_kv_heads) * hd;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++)
    lh_rope_apply(qkv + (size_t)i * QKV, c->n_heads + c->n_kv_heads, hd, t->rope_cos, t->rope_sin,
                  t->pos[i], inverse);
}

/* Qwen3's per-head RMSNorm, in place on the q and k heads of every row of a fused (N, QKV)
 * buffer: q_norm weights wq on the H query heads, k_norm weights wk on the KV key heads. The
 * inputs go to pre (N, (H+KV)*hd) and each head's reciprocal RMS to rstd (N, H+KV). */
static void qk_norm_forward(const lh_config *c, float *qkv, float *pre, float *rstd,
                            const float *wq, const float *wk, int N) {
  int hd = c->head_dim, H = c->n_heads, NH = H + c->n_kv_heads, QKV = (NH + c->n_kv_heads) * hd;
  float eps = c->rms_eps;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    float *row = qkv + (size_t)i * QKV, *p = pre + (size_t)i * NH * hd;
    memcpy(p, row, (size_t)NH * hd * sizeof(float));
    for (int h = 0; h < NH; h++) {
      const float *x = p + (size_t)h * hd, *w = h < H ? wq : wk;
      float *o = row + (size_t)h * hd, ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int j = 0; j < hd; j++)
        ss += x[j] * x[j];
      float r = 1.0f / sqrtf(ss / (float)hd + eps);
      rstd[(size_t)i * NH + h] = r;
#pragma omp simd
      for (int j = 0; j < hd; j++)
        o[j] = x[j] * r * w[j];
    }
  }
}

/* Backward of qk_norm_forward, in place on the q and k columns of dqkv (N, QKV): gradients of
 * the normed heads in, of the projections out. dwq, dwk (hd) += the weight gradients, summed
 * over rows in order so the result does not depend on the thread count. */
static void qk_norm_backward(const lh_config *c, float *dqkv, const float *pre, const float *rstd,
                             const float *wq, const float *wk, float *dwq, float *dwk, int N) {
  int hd = c->head_dim, H = c->n_heads, NH = H + c->n_kv_heads, QKV = (NH + c->n_kv_heads) * hd;
  for (int i = 0; i < N; i++)
    for (int h = 0; h < NH; h++) {
      const float *g = dqkv + (size_t)i * QKV + (size_t)h * hd;
      const float *x = pre + ((size_t)i * NH + h) * hd;
      float r = rstd[(size_t)i * NH + h], *dw = h < H ? dwq : dwk;
#pragma omp simd
      for (int j = 0; j < hd; j++)
        dw[j] += g[j] * x[j] * r;
    }
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++)
    for (int h = 0; h < NH; h++) {
      float *g = dqkv + (size_t)i * QKV + (size_t)h * hd;
      const float *x = pre + ((size_t)i * NH + h) * hd, *w = h < H ? wq : wk;
      float r = rstd[(size_t)i * NH + h], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int j = 0; j < hd; j++)
        dot += g[j] * w[j] * x[j];
      float k = dot * r * r * r / (float)hd;
#pragma omp simd
      for (int j = 0; j < hd; j++)
        g[j] = r * g[j] * w[j] - k * x[j];
    }
}

float lh_train_forward(lh_train *t, const lh_batch *b, float *logprob) {
  const lh_config *c = &t->m->cfg;
  const lh_params *w = &t->m->w;
  int N = b->seq_start[b->n_seqs], C = c->hidden_size, L = c->n_layers, H = c->n_heads;
  int KV = c->n_kv_heads, hd = c->head_dim, QD = H * hd, KD = KV * hd, QKV = QD + 2 * KD;
  int F = c->intermediate_size, V = c->vocab_size;
  size_t NC = (size_t)N * C, P = (size_t)H * t->max_tokens * t->max_seq;
  LH_CHECK(N <= t->max_tokens, "batch of %d tokens, state sized for %d", N, t->max_tokens);
  t->n_tokens = N;

  t->probs_off[0] = 0;
  for (int s = 0; s < b->n_seqs; s++) {
    int s0 = b->seq_start[s], T = b->seq_start[s + 1] - s0;
    for (int i = 0; i < T; i++)
      t->pos[s0 + i] = i;
    t->probs_off[s + 1] = t->probs_off[s] + (size_t)H * T * T;
  }

  for (int i = 0; i < N; i++)
    memcpy(t->x + (size_t)i * C, w->embed + (size_t)b->tokens[i] * C, C * sizeof(float));

  for (int l = 0; l < L; l++) {
    size_t lo = (size_t)l * w->layer_stride;
    float *x = t->x + l * NC, *xmid = t->xmid + l * NC, *xnext = t->x + (l + 1) * NC;
    float *ln1 = t->ln1 + l * NC, *ln2 = t->ln2 + l * NC;
    float *qkv = t->qkv + (size_t)l * N * QKV, *att = t->att + (size_t)l * N * QD;
    float *probs = t->probs + l * P;
    float *gu = t->gu + (size_t)l * N * 2 * F, *hm = t->hmlp + (size_t)l * N * F;

    lh_rmsnorm_forward(ln1, t->rstd1 + (size_t)l * N, x, w->ln1 + lo, N, C, c->rms_eps);
    lh_matmul_xwt(qkv, ln1, w->wq + lo, N, C, QKV, 0.0f); /* wq, wk, wv are adjacent */
    if (c->qkv_bias) add_bias(qkv, w->bq + lo, N, QKV);   /* and so are bq, bk, bv */
    if (c->qk_norm)
      qk_norm_forward(c, qkv, t->qk_x + (size_t)l * N * (H + KV) * hd,
                      t->rstdq + (size_t)l * N * (H + KV), w->q_norm + lo, w->k_norm + lo, N);
    rope_rows(t, qkv, N, 0);

    int pairs = b->n_seqs * KV;
#pragma omp parallel for schedule(dynamic, 1)
    for (int pi = 0; pi < pairs; pi++) {
      int s = pi / KV, g = pi % KV, s0 = b->seq_start[s], T = b->seq_start[s + 1] - s0;
      const float *q = qkv + (size_t)s0 * QKV;
      lh_attention_forward(att + (size_t)s0 * QD, probs + t->probs_off[s], q, q + QD, q + QD + KD,
                           QKV, T, H, KV, hd, g);
    }

    memcpy(xmid, x, NC * sizeof(float));
    lh_matmul_xwt(xmid, att, w->wo + lo, N, QD, C, 1.0f);
    if (c->o_bias) add_bias(xmid, w->bo + lo, N, C);
    lh_rmsnorm_forward(ln2, t->rstd2 + (size_t)l * N, xmid, w->ln2 + lo, N, C, c->rms_eps);
    lh_matmul_xwt(gu, ln2, w->wgate + lo, N, C, 2 * F, 0.0f); /* wgate, wup are adjacent */
    lh_swiglu_forward(hm, gu, N, F);
    memcpy(xnext, xmid, NC * sizeof(float));
    lh_matmul_xwt(xnext, hm, w->wdown + lo, N, F, C, 1.0f);
  }

  lh_rmsnorm_forward(t->lnf, t->rstdf, t->x + (size_t)L * NC, w->norm, N, C, c->rms_eps);
  lh_matmul_xwt(t->logits, t->lnf, w->lm_head, N, C, V, 0.0f);

  /* log-softmax of row i-1 at token i; fixed-order sums per row */
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float *row = t->logits + (size_t)i * V;
    float mx = row[0];
    for (int j = 1; j < V; j++)
      mx = row[j] > mx ? row[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; j++)
      sum += lh_expf(row[j] - mx);
    t->lse[i] = mx + logf(sum);
  }
  double loss = 0.0, wsum = 0.0;
  for (int s = 0; s < b->n_seqs; s++) {
    int s0 = b->seq_start[s], s1 = b->seq_start[s + 1];
    logprob[s0] = 0.0f;
    for (int i = s0 + 1; i < s1; i++) {
      logprob[i] = t->logits[(size_t)(i - 1) * V + b->tokens[i]] - t->lse[i - 1];
      loss -= (double)b->loss_weight[i] * logprob[i];
      wsum += b->loss_weight[i];
    }
  }
  return wsum > 0.0 ? (float)(loss / wsum) : 0.0f;
}

void lh_train_backward(lh_train *t, const lh_batch *b, const float *dlogprob) {
  const lh_config *c = &t->m->cfg;
  const lh_params *w = &t->m->w;
  lh_params *g = &t->g;
  int N = b->seq_start[b->n_seqs], C = c->hidden_size, L = c->n_layers, H = c->n_heads;
  int KV = c->n_kv_heads, hd = c->head_dim, QD = H * hd, KD = KV * hd, QKV = QD + 2 * KD;
  int F = c->intermediate_size, V = c->vocab_size;
  size_t NC = (size_t)N * C, P = (size_t)H * t->max_tokens * t->max_seq;
  LH_CHECK(N == t->n_tokens, "backward on a batch of %d tokens after a forward of %d", N,
           t->n_tokens);

  /* dlogits row r (predicting token r+1) = dlogprob[r+1] * (onehot - softmax); rows that end
   * a sequence predict nothing */
#pragma omp parallel for schedule(static)
  for (int r = 0; r < N; r++) {
    float *row = t->logits + (size_t)r * V;
    int last = r == N - 1 || t->pos[r + 1] == 0; /* row r ends its sequence */
    float d = last ? 0.0f : dlogprob[r + 1];
    if (d == 0.0f) {
      memset(row, 0, (size_t)V * sizeof(float));
      continue;
    }
    float lse = t->lse[r];
#pragma omp simd
    for (int j = 0; j < V; j++)
      row[j] = -d * lh_expf(row[j] - lse);
    row[b->tokens[r + 1]] += d;
  }
  float *dlogits = t->logits;

  /* head and final norm */
  lh_matmul_dx(t->dn, dlogits, w->lm_head, N, C, V, 0.0f);
  lh_matmul_dw(g->lm_head, dlogits, t->lnf, N, C, V);
  memset(t->dx, 0, NC * sizeof(float));
  lh_rmsnorm_backward(t->dx, g->norm, t->dn, t->x + (size_t)L * NC, w->norm, t->rstdf, N, C);

  for (int l = L - 1; l >= 0; l--) {
    size_t lo = (size_t)l * w->layer_stride;
    const float *x = t->x + l * NC, *xmid = t->xmid + l * NC;
    const float *ln1 = t->ln1 + l * NC, *ln2 = t->ln2 + l * NC;
    const float *qkv = t->qkv + (size_t)l * N * QKV, *att = t->att + (size_t)l * N * QD;
    const float *probs = t->probs + l * P;
    const float *gu = t->gu + (size_t)l * N * 2 * F, *hm = t->hmlp + (size_t)l * N * F;

    /* MLP: x_next = xmid + down(h) */
    lh_matmul_dx(t->dh, t->dx, w->wdown + lo, N, F, C, 0.0f);
    lh_matmul_dw(g->wdown + lo, t->dx, hm, N, F, C);
    lh_swiglu_backward(t->dgu, t->dh, gu, N, F);
    lh_matmul_dx(t->dn, t->dgu, w->wgate + lo, N, C, 2 * F, 0.0f);
    lh_matmul_dw(g->wgate + lo, t->dgu, ln2, N, C, 2 * F);
    lh_rmsnorm_backward(t->dx, g->ln2 + lo, t->dn, xmid, w->ln2 + lo, t->rstd2 + (size_t)l * N, N,
                        C);

    /* attention: xmid = x + o(att) + bo */
    lh_matmul_dx(t->datt, t->dx, w->wo + lo, N, QD, C, 0.0f);
    lh_matmul_dw(g->wo + lo, t->dx, att, N, QD, C);
    if (c->o_bias) bias_grad(g->bo + lo, t->dx, N, C);
    int pairs = b->n_seqs * KV;
    /* dS is per thread, sized for the thread count at lh_train_create: never a larger team */
#pragma omp parallel for schedule(dynamic, 1) num_threads(t->n_threads)
    for (int pi = 0; pi < pairs; pi++) {
      int s = pi / KV, gi = pi % KV, s0 = b->seq_start[s], T = b->seq_start[s + 1] - s0;
      float *scratch = t->dS + (size_t)lh_thread_id() * t->max_seq * t->max_seq;
      const float *q = qkv + (size_t)s0 * QKV;
      float *dq = t->dqkv + (size_t)s0 * QKV;
      lh_attention_backward(dq, dq + QD, dq + QD + KD, t->datt + (size_t)s0 * QD,
                            probs + t->probs_off[s], q, q + QD, q + QD + KD, QKV, T, H, KV, hd, gi,
                            scratch);
    }
    rope_rows(t, t->dqkv, N, 1);
    if (c->qk_norm)
      qk_norm_backward(c, t->dqkv, t->qk_x + (size_t)l * N * (H + KV) * hd,
                       t->rstdq + (size_t)l * N * (H + KV), w->q_norm + lo, w->k_norm + lo,
                       g->q_norm + lo, g->k_norm + lo, N);
    if (c->qkv_bias) bias_grad(g->bq + lo, t->dqkv, N, QKV);
    lh_matmul_dx(t->dn, t->dqkv, w->wq + lo, N, C, QKV, 0.0f);
    lh_matmul_dw(g->wq + lo, t->dqkv, ln1, N, C, QKV);
    lh_rmsnorm_backward(t->dx, g->ln1 + lo, t->dn, x, w->ln1 + lo, t->rstd1 + (size_t)l * N, N, C);
  }

  /* embedding rows, tokens in order */
  for (int i = 0; i < N; i++) {
    float *dst = g->embed + (size_t)b->tokens[i] * C;
    const float *src = t->dx + (size_t)i * C;
#pragma omp simd
    for (int j = 0; j < C; j++)
      dst[j] += src[j];
  }
}

float lh_train_ce_step(lh_train *t, const lh_batch *b, float *logprob) {
  int N = b->seq_start[b->n_seqs];
  lh_train_zero_grad(t);
  float loss = lh_train_forward(t, b, logprob);
  double wsum = 0.0;
  for (int i = 0; i < N; i++)
    wsum += b->loss_weight[i];
  for (int i = 0; i < N; i++)
    t->dlp[i] = wsum > 0.0 ? (float)(-b->loss_weight[i] / wsum) : 0.0f;
  lh_train_backward(t, b, t->dlp);
  return loss;
}

double lh_train_flops(const lh_config *c, const lh_batch *b) {
  size_t n = lh_config_n_params(c);
  /* matmul parameters: all but norms (q/k norms too), biases and (untied) the embedding lookup */
  double mm = (double)n - (double)c->hidden_size * (2.0 * c->n_layers + 1.0);
  if (c->qkv_bias) mm -= (double)c->n_layers * (c->n_heads + 2.0 * c->n_kv_heads) * c->head_dim;
  if (c->o_bias) mm -= (double)c->n_layers * c->hidden_size;
  if (c->qk_norm) mm -= (double)c->n_layers * 2.0 * c->head_dim;
  if (!c->tie_embeddings) mm -= (double)c->vocab_size * c->hidden_size;
  int N = b->seq_start[b->n_seqs];
  double flops = 6.0 * mm * N;
  for (int s = 0; s < b->n_seqs; s++) {
    double T = b->seq_start[s + 1] - b->seq_start[s];
    /* forward: QK^T and PV over the causal triangle; backward twice that */
    flops += 3.0 * c->n_layers * 2.0 * 2.0 * c->n_heads * c->head_dim * T * (T + 1) / 2.0;
  }
  return flops;
}
