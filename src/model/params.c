/* longhaul model parameters: the slab layout, its named views, the Hugging Face tensor table
 * and deterministic random initialisation. The layout is the one thing that checkpoints,
 * hashes, patches and gradients agree on: change it and every slab changes meaning. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/model.h"

/* One tensor of the slab: `layered` ones repeat per layer, inside each layer's block. */
typedef struct {
  const char *hf; /* printf pattern of the Hugging Face name (%d = layer) */
  int layered;
  int rows, cols; /* cols == 0 for 1-D */
  size_t view;    /* offsetof(lh_params, field) */
} param_spec;

/* Fills specs in slab order (the embedding, one layer's block, the tail); returns the count.
 * wq/wk/wv, bq/bk/bv and wgate/wup must stay adjacent: the trainer relies on it. */
static int param_specs(const lh_config *c, param_spec *s) {
  int C = c->hidden_size, hd = c->head_dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd;
  int F = c->intermediate_size, V = c->vocab_size, n = 0;
#define SPEC(name, lay, r, cl, field)                                                              \
  s[n++] = (param_spec){name, lay, r, cl, offsetof(lh_params, field)}
  SPEC("model.embed_tokens.weight", 0, V, C, embed);
  SPEC("model.layers.%d.input_layernorm.weight", 1, C, 0, ln1);
  SPEC("model.layers.%d.self_attn.q_proj.weight", 1, q, C, wq);
  SPEC("model.layers.%d.self_attn.k_proj.weight", 1, kv, C, wk);
  SPEC("model.layers.%d.self_attn.v_proj.weight", 1, kv, C, wv);
  if (c->qkv_bias) {
    SPEC("model.layers.%d.self_attn.q_proj.bias", 1, q, 0, bq);
    SPEC("model.layers.%d.self_attn.k_proj.bias", 1, kv, 0, bk);
    SPEC("model.layers.%d.self_attn.v_proj.bias", 1, kv, 0, bv);
  }
  if (c->qk_norm) {
    SPEC("model.layers.%d.self_attn.q_norm.weight", 1, hd, 0, q_norm);
    SPEC("model.layers.%d.self_attn.k_norm.weight", 1, hd, 0, k_norm);
  }
  SPEC("model.layers.%d.self_attn.o_proj.weight", 1, C, q, wo);
  if (c->o_bias) SPEC("model.layers.%d.self_attn.o_proj.bias", 1, C, 0, bo);
  SPEC("model.layers.%d.post_attention_layernorm.weight", 1, C, 0, ln2);
  SPEC("model.layers.%d.mlp.gate_proj.weight", 1, F, C, wgate);
  SPEC("model.layers.%d.mlp.up_proj.weight", 1, F, C, wup);
  SPEC("model.layers.%d.mlp.down_proj.weight", 1, C, F, wdown);
  SPEC("model.norm.weight", 0, C, 0, norm);
  if (!c->tie_embeddings) SPEC("lm_head.weight", 0, V, C, lm_head);
#undef SPEC
  return n;
}

#define MAX_SPECS 20

static size_t spec_numel(const param_spec *p) {
  return (size_t)p->rows * (size_t)(p->cols ? p->cols : 1);
}

/* Walks the slab in order, calling visit(spec, layer, offset) for every tensor. */
typedef void (*visit_fn)(const param_spec *p, int layer, size_t offset, void *ctx);

static void walk(const lh_config *c, visit_fn visit, void *ctx) {
  param_spec specs[MAX_SPECS];
  int n = param_specs(c, specs), first_layered = 1, end_layered = 1;
  while (end_layered < n && specs[end_layered].layered)
    end_layered++;
  size_t off = 0;
  visit(&specs[0], -1, off, ctx);
  off += spec_numel(&specs[0]);
  for (int l = 0; l < c->n_layers; l++)
    for (int i = first_layered; i < end_layered; i++) {
      visit(&specs[i], l, off, ctx);
      off += spec_numel(&specs[i]);
    }
  for (int i = end_layered; i < n; i++) {
    visit(&specs[i], -1, off, ctx);
    off += spec_numel(&specs[i]);
  }
}

typedef struct {
  float *slab;
  lh_params *out;
} point_ctx;

static void point_visit(const param_spec *p, int layer, size_t offset, void *ctx) {
  point_ctx *pc = ctx;
  if (layer > 0) return;
  *(float **)((char *)pc->out + p->view) = pc->slab + offset;
}

void lh_params_point(const lh_config *c, float *slab, lh_params *out) {
  memset(out, 0, sizeof *out);
  point_ctx pc = {slab, out};
  walk(c, point_visit, &pc);
  param_spec specs[MAX_SPECS];
  int n = param_specs(c, specs);
  for (int i = 0; i < n; i++)
    if (specs[i].layered) out->layer_stride += spec_numel(&specs[i]);
  if (c->tie_embeddings) out->lm_head = out->embed;
}

typedef struct {
  lh_tensor_info *out;
  int cap, count;
} table_ctx;

static void table_visit(const param_spec *p, int layer, size_t offset, void *ctx) {
  table_ctx *tc = ctx;
  if (tc->out && tc->count < tc->cap) {
    lh_tensor_info *t = &tc->out[tc->count];
    snprintf(t->name, sizeof t->name, p->hf, layer);
    t->ndim = p->cols ? 2 : 1;
    t->shape[0] = p->rows;
    t->shape[1] = p->cols;
    t->offset = offset;
    t->numel = spec_numel(p);
  }
  tc->count++;
}

int lh_model_tensors(const lh_config *c, lh_tensor_info *out, int cap) {
  table_ctx tc = {out, cap, 0};
  walk(c, table_visit, &tc);
  return tc.count;
}

lh_err lh_model_create(const lh_config *c, lh_model **out) {
  *out = NULL;
  lh_err err = lh_config_validate(c);
  if (err) return err;
  size_t n = lh_config_n_params(c);
  char what[96];
  snprintf(what, sizeof what, "model: parameter slab of %zu floats", n);
  float *params = lh_try_malloc_aligned(lh_size_mul(n, sizeof(float)), what);
  if (!params) return LH_ERR_NOMEM;
  memset(params, 0, n * sizeof(float));
  lh_model *m = lh_xcalloc(1, sizeof *m);
  m->cfg = *c;
  m->n_params = n;
  m->params = params;
  lh_params_point(c, m->params, &m->w);
  *out = m;
  return LH_ERR_OK;
}

void lh_model_free(lh_model *m) {
  if (!m) return;
  free(m->params);
  free(m);
}

void lh_model_init_random(lh_model *m, uint64_t seed) {
  int n = lh_model_tensors(&m->cfg, NULL, 0);
  lh_tensor_info *t = lh_xmalloc((size_t)n * sizeof *t);
  lh_model_tensors(&m->cfg, t, n);
  for (int i = 0; i < n; i++) {
    float *p = m->params + t[i].offset;
    int is_norm = strstr(t[i].name, "norm") != NULL;
    if (t[i].ndim == 1) {
      for (size_t j = 0; j < t[i].numel; j++)
        p[j] = is_norm ? 1.0f : 0.0f;
      continue;
    }
    /* stream = tensor index, position = element pair: independent of thread count */
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < t[i].numel; j += 2) {
      float z[2];
      lh_philox_normal2(seed, (uint64_t)i, j / 2, z);
      p[j] = 0.02f * z[0];
      if (j + 1 < t[i].numel) p[j + 1] = 0.02f * z[1];
    }
  }
  free(t);
}
