/* longhaul inference forward: bf16 weights, fp32 activations, a KV cache per sequence slot.
 * Every weight product is lh_bf16mm (src/tensor/bf16mm*.c): weights widened in registers, no
 * fp32 copy at any batch size, and a row's result independent of the other rows in the
 * forward. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  float *xn;                  /* (R, C) normed */
  float *qkv;                 /* (R, QKV) */
  float *att;                 /* (R, H*hd) */
  float *gu;                  /* (R, 2F) */
  float *h;                   /* (R, F) */
  float *xl;                  /* (R, C) rows that want logits, normed */
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
  uint16_t *w = lh_try_malloc_aligned(src->n_params * sizeof(uint16_t), "infer: bf16 weights");
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
      {&kv->xn, lh_size_mul(R, C * sizeof(float)), "kv cache: normed rows"},
      {&kv->qkv, lh_size_mul(R, QKV * sizeof(float)), "kv cache: q/k/v rows"},
      {&kv->att, lh_size_mul(R, QD * sizeof(float)), "kv cache: attention rows"},
      {&kv->gu, lh_size_mul(R, 2 * F * sizeof(float)), "kv cache: gate/up rows"},
      {&kv->h, lh_size_mul(R, F * sizeof(float)), "kv cache: MLP rows"},
      {&kv->xl, lh_size_mul(R, C * sizeof(float)), "kv cache: head rows"},
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
  free(kv->xl);
  free(kv->scores);
  free(kv->rope_cos);
  free(kv->rope_sin);
  free(kv);
}

int lh_kv_max_seq(const lh_kv *kv) {
  return kv->max_seq;
}

/* ---------------------------------------------------------------- kernels */

/* RMSNorm of rows with a bf16 weight. */
static void rmsnorm_bf16(float *out, const float *x, const uint16_t *w, int M, int C, float eps) {
#pragma omp parallel for schedule(static) if (M > 1)
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

lh_err lh_infer_forward(const lh_infer *m, lh_kv *kv, const lh_infer_row *rows, int n,
                        float *logits) {
  const lh_config *c = &m->cfg;
  const weight_offsets *o = &m->o;
  int C = c->hidden_size, L = c->n_layers, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
  int QD = H * hd, KD = KV * hd, QKV = QD + 2 * KD, F = c->intermediate_size;
  int V = c->vocab_size, G = H / KV, S = kv->max_seq;
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
  const uint16_t *W = m->w;
  float scale = 1.0f / sqrtf((float)hd);
  long att_work = 0; /* multiply-adds of one layer's attention */
  for (int r = 0; r < n; r++)
    att_work += 2L * (rows[r].pos + 1) * QD;

  for (int r = 0; r < n; r++) {
    const uint16_t *e = W + o->embed + (size_t)rows[r].token * C;
    float *x = kv->x + (size_t)r * C;
    for (int j = 0; j < C; j++)
      x[j] = lh_bf16f(e[j]);
  }

  for (int l = 0; l < L; l++) {
    size_t lo = (size_t)l * o->layer_stride;
    float *kc = kv->k + (size_t)l * kv->n_slots * S * KD;
    float *vc = kv->v + (size_t)l * kv->n_slots * S * KD;
    rmsnorm_bf16(kv->xn, kv->x, W + o->ln1 + lo, n, C, c->rms_eps);
    lh_bf16mm(kv->qkv, kv->xn, W + o->wqkv + lo, n, C, QKV, false);
    /* bias, q/k norm, RoPE, then K and V into the slot's cache */
#pragma omp parallel for schedule(static) if (n > 1)
    for (int r = 0; r < n; r++) {
      float *q = kv->qkv + (size_t)r * QKV;
      if (o->has_bias) {
        const uint16_t *b = W + o->bqkv + lo;
        for (int j = 0; j < QKV; j++)
          q[j] += lh_bf16f(b[j]);
      }
      if (o->has_qk_norm) {
        rmsnorm_bf16(q, q, W + o->q_norm + lo, H, hd, c->rms_eps);
        rmsnorm_bf16(q + QD, q + QD, W + o->k_norm + lo, KV, hd, c->rms_eps);
      }
      lh_rope_apply(q, H + KV, hd, kv->rope_cos, kv->rope_sin, rows[r].pos, 0);
      size_t at = ((size_t)rows[r].slot * S + rows[r].pos) * KD;
      memcpy(kc + at, q + QD, (size_t)KD * sizeof(float));
      memcpy(vc + at, q + QD + KD, (size_t)KD * sizeof(float));
    }
    /* attention of each (row, head) over its slot's positions [0, pos]; scores are per thread,
     * sized for the thread count at lh_kv_create, so the team is never larger. A short one
     * (batch-1 decode early in a sequence) stays on this thread: waking the team costs more */
#pragma omp parallel for collapse(2) schedule(static)                                              \
    num_threads(kv->n_threads) if (att_work >= 65536)
    for (int r = 0; r < n; r++)
      for (int h = 0; h < H; h++) {
        const float *q = kv->qkv + (size_t)r * QKV + (size_t)h * hd;
        int g = h / G, P = rows[r].pos + 1;
        const float *ks = kc + (size_t)rows[r].slot * S * KD + (size_t)g * hd;
        const float *vs = vc + (size_t)rows[r].slot * S * KD + (size_t)g * hd;
        float *s = kv->scores + (size_t)lh_thread_id() * S, mx = -INFINITY, sum = 0.0f;
        /* s = scale * K[0:P] q and a = V[0:P]^T p: matrix-vector products over the cache
         * (single-threaded inside this loop) */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, P, hd, scale, ks, KD, q, 1, 0.0f, s, 1);
        for (int j = 0; j < P; j++)
          mx = s[j] > mx ? s[j] : mx;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < P; j++) {
          s[j] = lh_expf(s[j] - mx);
          sum += s[j];
        }
        float *a = kv->att + (size_t)r * QD + (size_t)h * hd;
        cblas_sgemv(CblasRowMajor, CblasTrans, P, hd, 1.0f / sum, vs, KD, s, 1, 0.0f, a, 1);
      }
    lh_bf16mm(kv->x, kv->att, W + o->wo + lo, n, QD, C, true);
    if (o->has_o_bias) {
      const uint16_t *b = W + o->bo + lo;
#pragma omp parallel for schedule(static) if (n > 1)
      for (int r = 0; r < n; r++) {
        float *x = kv->x + (size_t)r * C;
        for (int j = 0; j < C; j++)
          x[j] += lh_bf16f(b[j]);
      }
    }
    rmsnorm_bf16(kv->xn, kv->x, W + o->ln2 + lo, n, C, c->rms_eps);
    lh_bf16mm(kv->gu, kv->xn, W + o->wgu + lo, n, C, 2 * F, false);
    lh_swiglu_forward(kv->h, kv->gu, n, F);
    lh_bf16mm(kv->x, kv->h, W + o->wdown + lo, n, F, C, true);
  }

  /* final norm and head, only for the rows that want logits */
  int nl = 0;
  for (int r = 0; r < n; r++)
    if (rows[r].logits) {
      memcpy(kv->xn + (size_t)nl * C, kv->x + (size_t)r * C, (size_t)C * sizeof(float));
      nl++;
    }
  if (nl == 0) return LH_ERR_OK;
  rmsnorm_bf16(kv->xl, kv->xn, W + o->norm, nl, C, c->rms_eps);
  lh_bf16mm(logits, kv->xl, W + o->lm_head, nl, C, V, false);
  return LH_ERR_OK;
}
