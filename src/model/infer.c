/* longhaul inference forward: bf16 weights, fp32 activations, a KV cache per sequence slot.
 * Every weight product is lh_bf16mm (src/tensor/bf16mm*.c): weights widened in registers, no
 * fp32 copy at any batch size, and a row's result independent of the other rows in the
 * forward. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "longhaul/infer.h"
#include "longhaul/tensor.h"

/* Offsets (in elements) of layer 0's tensors in the slab; layer l adds l * layer_stride. */
typedef struct {
  size_t embed, norm, lm_head;
  size_t ln1, wqkv, bqkv, q_norm, k_norm, wo, bo, ln2, wgu, wdown;
  size_t layer_stride;
  bool has_bias, has_o_bias, has_qk_norm;
} weight_offsets;

struct lh_infer {
  lh_config cfg;
  size_t n_params;
  uint16_t *w; /* (n_params) bf16 slab in the training slab's layout */
  weight_offsets o;
};

struct lh_kv {
  const lh_infer *m;
  int n_slots, max_seq, max_rows, n_threads;
  float *k, *v;               /* (L, n_slots, max_seq, KV*hd) */
  float *x;                   /* (R, C) residual stream */
  float *xn;                  /* (n_threads, R, C) normed rows: each thread norms every row */
  float *qkv;                 /* (R, QKV) */
  float *att;                 /* (R, H*hd) */
  float *gu;                  /* (R, 2F) */
  float *h;                   /* (R, F) */
  float *scores;              /* (n_threads, max_seq): n_threads = lh_threads() at creation */
  float *rope_cos, *rope_sin; /* (max_seq, hd/2) */
};

/* ---------------------------------------------------------------- weights */

static bool find_offset(const lh_tensor_info *t, int n, const char *name, size_t *off) {
  for (int i = 0; i < n; i++)
    if (!strcmp(t[i].name, name)) {
      *off = t[i].offset;
      return true;
    }
  return false;
}

static void compute_offsets(const lh_config *c, weight_offsets *o) {
  int n = lh_model_tensors(c, NULL, 0);
  lh_tensor_info *t = lh_xmalloc((size_t)n * sizeof *t);
  lh_model_tensors(c, t, n);
  memset(o, 0, sizeof *o);
  size_t ln1_next = 0;
  LH_CHECK(find_offset(t, n, "model.embed_tokens.weight", &o->embed), "no embedding");
  LH_CHECK(find_offset(t, n, "model.norm.weight", &o->norm), "no final norm");
  if (!find_offset(t, n, "lm_head.weight", &o->lm_head)) o->lm_head = o->embed;
  LH_CHECK(find_offset(t, n, "model.layers.0.input_layernorm.weight", &o->ln1), "no ln1");
  LH_CHECK(find_offset(t, n, "model.layers.0.self_attn.q_proj.weight", &o->wqkv), "no wq");
  o->has_bias = find_offset(t, n, "model.layers.0.self_attn.q_proj.bias", &o->bqkv);
  o->has_qk_norm = find_offset(t, n, "model.layers.0.self_attn.q_norm.weight", &o->q_norm) &&
                   find_offset(t, n, "model.layers.0.self_attn.k_norm.weight", &o->k_norm);
  LH_CHECK(find_offset(t, n, "model.layers.0.self_attn.o_proj.weight", &o->wo), "no wo");
  o->has_o_bias = find_offset(t, n, "model.layers.0.self_attn.o_proj.bias", &o->bo);
  LH_CHECK(find_offset(t, n, "model.layers.0.post_attention_layernorm.weight", &o->ln2), "ln2");
  LH_CHECK(find_offset(t, n, "model.layers.0.mlp.gate_proj.weight", &o->wgu), "no gate");
  LH_CHECK(find_offset(t, n, "model.layers.0.mlp.down_proj.weight", &o->wdown), "no down");
  if (find_offset(t, n, "model.layers.1.input_layernorm.weight", &ln1_next))
    o->layer_stride = ln1_next - o->ln1;
  free(t);
}

lh_err lh_infer_from_model(const lh_model *src, lh_infer **out) {
  *out = NULL;
  uint16_t *w = lh_try_malloc_huge(src->n_params * sizeof(uint16_t), "infer: bf16 weights");
  if (!w) return LH_ERR_NOMEM;
  lh_infer *m = lh_xcalloc(1, sizeof *m);
  m->cfg = src->cfg;
  m->n_params = src->n_params;
  m->w = w;
  compute_offsets(&m->cfg, &m->o);
  lh_bf16_from_f32_n(m->w, src->params, m->n_params);
  *out = m;
  return LH_ERR_OK;
}

lh_err lh_infer_update(lh_infer *m, const lh_model *src) {
  /* the same parameter count is not enough: H=8, hd=16 has as many as H=4, hd=32 */
  char why[160];
  if (!lh_config_same_forward(&m->cfg, &src->cfg, why, sizeof why))
    return lh_errorf(LH_ERR_MISMATCH,
                     "infer: the model's configuration differs from the policy's (policy vs "
                     "model: %s)",
                     why);
  LH_CHECK(src->n_params == m->n_params, "same config, %zu vs %zu parameters", m->n_params,
           src->n_params);
  lh_bf16_from_f32_n(m->w, src->params, m->n_params);
  return LH_ERR_OK;
}

const uint16_t *lh_infer_bf16(const lh_infer *m, size_t *n) {
  if (n) *n = m->n_params;
  return m->w;
}

lh_err lh_infer_set_range(lh_infer *m, size_t offset, const uint16_t *vals, size_t n) {
  if (offset > m->n_params || n > m->n_params - offset)
    return lh_errorf(LH_ERR_INVAL,
                     "infer: values [%zu, %zu + %zu) are outside the %zu of the policy", offset,
                     offset, n, m->n_params);
  memcpy(m->w + offset, vals, n * sizeof *vals);
  return LH_ERR_OK;
}

lh_err lh_infer_load(const char *dir, lh_infer **out) {
  *out = NULL;
  lh_config c;
  uint16_t *slab = NULL;
  lh_err err = lh_model_load_bf16(dir, &c, &slab);
  if (err) return err;
  lh_infer *m = lh_xcalloc(1, sizeof *m);
  m->cfg = c;
  m->n_params = lh_config_n_params(&c);
  m->w = slab;
  compute_offsets(&c, &m->o);
  *out = m;
  return LH_ERR_OK;
}

void lh_infer_free(lh_infer *m) {
  if (!m) return;
  free(m->w);
  free(m);
}

const lh_config *lh_infer_config(const lh_infer *m) {
  return &m->cfg;
}

size_t lh_infer_weight_bytes(const lh_infer *m) {
  return m->n_params * sizeof(uint16_t);
}

/* ---------------------------------------------------------------- caches */

lh_err lh_kv_create(const lh_infer *m, int n_slots, int max_seq, int max_rows, lh_kv **out) {
  *out = NULL;
  const lh_config *c = &m->cfg;
  if (n_slots < 1 || max_seq < 1 || max_rows < 1)
    return lh_errorf(LH_ERR_INVAL,
                     "kv cache: need at least 1 slot, position and row (got %d, %d, %d)", n_slots,
                     max_seq, max_rows);
  if (max_seq > c->max_positions)
    return lh_errorf(LH_ERR_LIMIT, "kv cache: %d positions, the model allows %d", max_seq,
                     c->max_positions);
  lh_kv *kv = lh_xcalloc(1, sizeof *kv);
  kv->m = m;
  kv->n_slots = n_slots;
  kv->max_seq = max_seq;
  kv->max_rows = max_rows;
  kv->n_threads = lh_threads();
  size_t L = (size_t)c->n_layers, C = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
  size_t QD = (size_t)c->n_heads * hd, KD = (size_t)c->n_kv_heads * hd, QKV = QD + 2 * KD;
  size_t F = (size_t)c->intermediate_size, R = (size_t)max_rows, S = (size_t)max_seq;
  /* sizes come from the caller: products saturate (lh_size_mul), so an absurd one fails to
   * allocate with its size in the message instead of wrapping */
  size_t cache = lh_size_mul(lh_size_mul(L * S, (size_t)n_slots), KD * sizeof(float));
  char what[160];
  snprintf(what, sizeof what, "kv cache: keys of %d layers x %d slots x %d positions x %zu floats",
           c->n_layers, n_slots, max_seq, KD);
  struct {
    float **p;
    size_t bytes;
    const char *what;
  } parts[] = {
      {&kv->k, cache, what},
      {&kv->v, cache, "kv cache: values (as many bytes as the keys)"},
      {&kv->x, lh_size_mul(R, C * sizeof(float)), "kv cache: residual rows"},
      {&kv->xn, lh_size_mul(lh_size_mul((size_t)kv->n_threads, R), C * sizeof(float)),
       "kv cache: normed rows (one copy per thread)"},
      {&kv->qkv, lh_size_mul(R, QKV * sizeof(float)), "kv cache: q/k/v rows"},
      {&kv->att, lh_size_mul(R, QD * sizeof(float)), "kv cache: attention rows"},
      {&kv->gu, lh_size_mul(R, 2 * F * sizeof(float)), "kv cache: gate/up rows"},
      {&kv->h, lh_size_mul(R, F * sizeof(float)), "kv cache: MLP rows"},
      {&kv->scores, lh_size_mul((size_t)kv->n_threads, S * sizeof(float)), "kv cache: scores"},
      {&kv->rope_cos, S * (hd / 2) * sizeof(float), "kv cache: RoPE table"},
      {&kv->rope_sin, S * (hd / 2) * sizeof(float), "kv cache: RoPE table"},
  };
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    if (!(*parts[i].p = lh_try_malloc_aligned(parts[i].bytes, parts[i].what))) {
      lh_kv_free(kv);
      return LH_ERR_NOMEM;
    }
  lh_config_rope_tables(c, kv->rope_cos, kv->rope_sin, max_seq);
  *out = kv;
  return LH_ERR_OK;
}

void lh_kv_free(lh_kv *kv) {
  if (!kv) return;
  free(kv->k);
  free(kv->v);
  free(kv->x);
  free(kv->xn);
  free(kv->qkv);
  free(kv->att);
  free(kv->gu);
  free(kv->h);
  free(kv->scores);
  free(kv->rope_cos);
  free(kv->rope_sin);
  free(kv);
}

int lh_kv_max_seq(const lh_kv *kv) {
  return kv->max_seq;
}

/* ---------------------------------------------------------------- the forward */

/* RMSNorm of rows with a bf16 weight, on the calling thread. Never inlined nor specialised
 * (noipa): the compiler vectorises the sum of squares in another order where it knows M or C,
 * and a row's bits must not depend on the call site. */
static __attribute__((noipa)) void rmsnorm_bf16(float *out, const float *x, const uint16_t *w,
                                                int M, int C, float eps) {
  for (int i = 0; i < M; i++) {
    const float *xi = x + (size_t)i * C;
    float *oi = out + (size_t)i * C, ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < C; j++)
      ss += xi[j] * xi[j];
    float r = 1.0f / sqrtf(ss / (float)C + eps);
#pragma omp simd
    for (int j = 0; j < C; j++)
      oi[j] = xi[j] * r * lh_bf16f(w[j]);
  }
}

/* One forward, shared by a team of T threads that stays up for all of it: each weight product
 * is split by output columns (lh_bf16mm_share), and the steps in between by rows or heads; an
 * lh_barrier separates a step from the next one that reads its output (6 per layer). What a
 * thread needs whole and is cheap, the RMSNorm of every row (O(rows x C) against a product's
 * O(rows x C x N)), it computes itself into its own copy instead of waiting for it. Every value
 * is computed by one thread in an order that does not depend on T or on the other rows. */
typedef struct {
  const lh_infer *m;
  lh_kv *kv;
  const lh_infer_row *rows;
  int n;
  float *logits;
  lh_barrier bar;
} forward_job;

/* [*a, *b): thread t's chunk of n units in T static chunks */
static void chunk(int n, int t, int T, int *a, int *b) {
  int per = (n + T - 1) / T;
  *a = t * per < n ? t * per : n;
  *b = (t + 1) * per < n ? (t + 1) * per : n;
}

/* thread t's share of out (M, N) (+)= x (M, K) @ Wt^T, plus the bf16 bias of its columns unless
 * bias is NULL */
static void product_cols(float *out, const float *x, const uint16_t *Wt, const uint16_t *bias,
                         int M, int K, int N, bool accumulate, int t, int T) {
  int a, b;
  lh_bf16mm_share(M, K, N, t, T, &a, &b);
  lh_bf16mm_cols(out, N, x, Wt, M, K, a, b, accumulate);
  if (bias)
    for (int r = 0; r < M; r++)
      for (int j = a; j < b; j++)
        out[(size_t)r * N + j] += lh_bf16f(bias[j]);
}

static void forward_thread(forward_job *f, int t, int T) {
  const lh_infer *m = f->m;
  lh_kv *kv = f->kv;
  const lh_infer_row *rows = f->rows;
  int n = f->n;
  const lh_config *c = &m->cfg;
  const weight_offsets *o = &m->o;
  int C = c->hidden_size, L = c->n_layers, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
  int QD = H * hd, KD = KV * hd, QKV = QD + 2 * KD, F = c->intermediate_size;
  int V = c->vocab_size, G = H / KV, S = kv->max_seq;
  const uint16_t *W = m->w;
  float scale = 1.0f / sqrtf((float)hd), eps = c->rms_eps;
  float *xn = kv->xn + (size_t)t * kv->max_rows * C; /* this thread's normed rows */
  int a, b;

  chunk(n, t, T, &a, &b);
  for (int r = a; r < b; r++) {
    const uint16_t *e = W + o->embed + (size_t)rows[r].token * C;
    float *x = kv->x + (size_t)r * C;
    for (int j = 0; j < C; j++)
      x[j] = lh_bf16f(e[j]);
  }
  lh_barrier_wait(&f->bar, T);

  for (int l = 0; l < L; l++) {
    size_t lo = (size_t)l * o->layer_stride;
    float *kc = kv->k + (size_t)l * kv->n_slots * S * KD;
    float *vc = kv->v + (size_t)l * kv->n_slots * S * KD;
    /* q/k/v and their bias */
    rmsnorm_bf16(xn, kv->x, W + o->ln1 + lo, n, C, eps);
    product_cols(kv->qkv, xn, W + o->wqkv + lo, o->has_bias ? W + o->bqkv + lo : NULL, n, C, QKV,
                 false, t, T);
    lh_barrier_wait(&f->bar, T);
    /* per (row, q or k head): q/k norm and RoPE; a k head goes into the slot's cache with its
     * v head */
    chunk(n * (H + KV), t, T, &a, &b);
    for (int u = a; u < b; u++) {
      int r = u / (H + KV), j = u % (H + KV);
      float *row = kv->qkv + (size_t)r * QKV, *p = row + (size_t)j * hd;
      if (o->has_qk_norm) rmsnorm_bf16(p, p, W + (j < H ? o->q_norm : o->k_norm) + lo, 1, hd, eps);
      lh_rope_apply(p, 1, hd, kv->rope_cos, kv->rope_sin, rows[r].pos, 0);
      if (j >= H) {
        size_t at = ((size_t)rows[r].slot * S + rows[r].pos) * KD + (size_t)(j - H) * hd;
        memcpy(kc + at, p, (size_t)hd * sizeof(float));
        memcpy(vc + at, row + QD + KD + (size_t)(j - H) * hd, (size_t)hd * sizeof(float));
      }
    }
    lh_barrier_wait(&f->bar, T);
    /* attention of each (row, head) over its slot's positions [0, pos] */
    chunk(n * H, t, T, &a, &b);
    for (int u = a; u < b; u++) {
      int r = u / H, h = u % H;
      const float *q = kv->qkv + (size_t)r * QKV + (size_t)h * hd;
      int g = h / G, P = rows[r].pos + 1;
      const float *ks = kc + (size_t)rows[r].slot * S * KD + (size_t)g * hd;
      const float *vs = vc + (size_t)rows[r].slot * S * KD + (size_t)g * hd;
      float *s = kv->scores + (size_t)t * S, mx = -INFINITY, sum = 0.0f;
      /* s = scale * K[0:P] q and a = V[0:P]^T p: matrix-vector products over the cache
       * (single-threaded inside the team) */
      cblas_sgemv(CblasRowMajor, CblasNoTrans, P, hd, scale, ks, KD, q, 1, 0.0f, s, 1);
      for (int j = 0; j < P; j++)
        mx = s[j] > mx ? s[j] : mx;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < P; j++) {
        s[j] = lh_expf(s[j] - mx);
        sum += s[j];
      }
      float *att = kv->att + (size_t)r * QD + (size_t)h * hd;
      cblas_sgemv(CblasRowMajor, CblasTrans, P, hd, 1.0f / sum, vs, KD, s, 1, 0.0f, att, 1);
    }
    lh_barrier_wait(&f->bar, T);
    /* o and its bias, added to the residual */
    product_cols(kv->x, kv->att, W + o->wo + lo, o->has_o_bias ? W + o->bo + lo : NULL, n, QD, C,
                 true, t, T);
    lh_barrier_wait(&f->bar, T);
    /* gate and up of this thread's columns of the MLP, then their SwiGLU */
    rmsnorm_bf16(xn, kv->x, W + o->ln2 + lo, n, C, eps);
    lh_bf16mm_share(n, C, F, t, T, &a, &b);
    lh_bf16mm_cols(kv->gu, 2 * F, xn, W + o->wgu + lo, n, C, a, b, false);
    lh_bf16mm_cols(kv->gu + F, 2 * F, xn, W + o->wgu + lo + (size_t)F * C, n, C, a, b, false);
    lh_swiglu_cols(kv->h, kv->gu, n, F, a, b);
    lh_barrier_wait(&f->bar, T);
    product_cols(kv->x, kv->h, W + o->wdown + lo, NULL, n, F, C, true, t, T);
    lh_barrier_wait(&f->bar, T);
  }

  /* final norm and head, only for the rows that want logits */
  int nl = 0;
  for (int r = 0; r < n; r++)
    if (rows[r].logits) {
      rmsnorm_bf16(xn + (size_t)nl * C, kv->x + (size_t)r * C, W + o->norm, 1, C, eps);
      nl++;
    }
  product_cols(f->logits, xn, W + o->lm_head, NULL, nl, C, V, false, t, T);
}

lh_err lh_infer_forward(const lh_infer *m, lh_kv *kv, const lh_infer_row *rows, int n,
                        float *logits) {
  int V = m->cfg.vocab_size, S = kv->max_seq;
  if (kv->m != m) return lh_errorf(LH_ERR_INVAL, "infer: the cache belongs to another model");
  if (n < 1 || n > kv->max_rows)
    return lh_errorf(LH_ERR_LIMIT, "infer: %d rows, the cache was sized for 1..%d", n,
                     kv->max_rows);
  for (int r = 0; r < n; r++) {
    const lh_infer_row *row = &rows[r];
    if (row->slot < 0 || row->slot >= kv->n_slots || row->pos < 0 || row->pos >= S ||
        row->token < 0 || row->token >= V)
      return lh_errorf(LH_ERR_LIMIT,
                       "infer: row %d: slot %d of %d, position %d of %d, token %d of %d", r,
                       row->slot, kv->n_slots, row->pos, S, row->token, V);
  }
  forward_job f = {.m = m, .kv = kv, .rows = rows, .n = n, .logits = logits};
  int T = lh_threads() < kv->n_threads ? lh_threads() : kv->n_threads;
  (void)T; /* read only by the OpenMP pragma: unused in a build without OpenMP */
#pragma omp parallel num_threads(T)
  {
    int t = 0, team = 1;
#ifdef _OPENMP
    t = omp_get_thread_num();
    team = omp_get_num_threads();
#endif
    forward_thread(&f, t, team);
  }
  return LH_ERR_OK;
}
