/* longhaul model: Llama/Qwen2/Qwen3-family decoder configuration, the parameter slab with named
 * views, Hugging Face files (config.json, model.safetensors), and the training forward/backward.
 * The model owns its parameter slab; a training state owns activations and the gradient slab,
 * both sized once at creation: no allocation happens inside a step. */
#ifndef LONGHAUL_MODEL_H
#define LONGHAUL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"
#include "longhaul/safetensors.h"

/* ---------------------------------------------------------------- configuration */

typedef enum { LH_ARCH_LLAMA = 0, LH_ARCH_QWEN2 = 1, LH_ARCH_QWEN3 = 2 } lh_arch;

/* config.json rope_scaling: none ("default" or null), or Llama 3.1's frequency-dependent
 * stretch ("llama3"); other types are refused. */
typedef enum { LH_ROPE_DEFAULT = 0, LH_ROPE_LLAMA3 = 1 } lh_rope_scaling;

#define LH_MAX_EOS 8 /* end-of-sequence ids a config may list */

typedef struct lh_config {
  lh_arch arch;
  int vocab_size;        /* V */
  int hidden_size;       /* C */
  int n_layers;          /* L */
  int n_heads;           /* H */
  int n_kv_heads;        /* KV, divides H (GQA) */
  int head_dim;          /* hd; hidden_size / n_heads unless config.json says otherwise */
  int intermediate_size; /* F */
  int max_positions;
  float rope_theta;
  float rms_eps;
  bool tie_embeddings;
  bool qkv_bias; /* q/k/v biases: Qwen2 always; Llama and Qwen3 when attention_bias is true */
  bool o_bias;   /* o_proj bias: Llama and Qwen3 when attention_bias is true (then equal to
                  * qkv_bias, as Hugging Face's LlamaAttention and Qwen3Attention build it);
                  * never Qwen2 */
  bool qk_norm;  /* per-head RMSNorm of q and k before RoPE (Qwen3) */
  lh_rope_scaling rope_scaling;
  float rope_factor;          /* llama3: factor, low_freq_factor, high_freq_factor, */
  float rope_low_freq_factor; /* original_max_position_embeddings; unused otherwise */
  float rope_high_freq_factor;
  int rope_original_max_positions;
  int bos_token_id;        /* -1 when absent */
  int eos_token_id;        /* eos_ids[0], or -1 when there is none */
  int eos_ids[LH_MAX_EOS]; /* every id that ends a generation (generation_config.json's list
                            * when the model directory has one) */
  int n_eos;               /* 0 with eos_token_id >= 0 means that single id */
} lh_config;

/* Limits on what a config may declare (checked before anything is allocated). */
#define LH_MAX_VOCAB     (1 << 22)
#define LH_MAX_HIDDEN    65536
#define LH_MAX_LAYERS    512
#define LH_MAX_HEADS     1024
#define LH_MAX_POSITIONS (1 << 20)
/* Parameters a config may imply: 10^12, above every dense Llama/Qwen model (the largest,
 * Llama 3.1 405B, has 4.1e11). Each field within its limit still allows ~5e14. */
#define LH_MAX_PARAMS ((size_t)1000000000000)

/* Presets: "tiny" and "small" (see README). */
lh_err lh_config_preset(const char *name, lh_arch arch, lh_config *out);
/* Checks every field against the limits and the relations between them, and the parameter
 * count against LH_MAX_PARAMS (LH_ERR_LIMIT). */
lh_err lh_config_validate(const lh_config *c);
/* Reads a Hugging Face config.json (Qwen2ForCausalLM, Qwen3ForCausalLM or LlamaForCausalLM),
 * as transformers 4 writes it (rope_theta, rope_scaling) or 5 (rope_parameters). Missing
 * optional fields take the Hugging Face defaults. Errors name the file and the field. */
lh_err lh_config_load(const char *path, lh_config *out);
/* Parses config.json text; `what` names the source in error messages. */
lh_err lh_config_parse(const char *json, size_t len, const char *what, lh_config *out);
/* Writes config.json atomically. */
lh_err lh_config_save(const char *path, const lh_config *c);
/* Replaces fields of c (a valid config) by the keys of a config.json-style object: c becomes
 * what lh_config_parse reads from c's own config.json with those keys put in. head_dim follows
 * hidden_size / num_attention_heads when either is given without it, as in Hugging Face. Keys
 * that config.json files hold but that do not shape the model (torch_dtype, use_cache, ...) are
 * ignored; any other unknown key, or an architecture other than c's, is an error naming `what`.
 * c is unchanged on error. */
lh_err lh_config_override(const char *json, size_t len, const char *what, lh_config *c);
/* Whether a and b give the same forward: every field that shapes or changes it (architecture,
 * sizes, head layout, RoPE and its scaling, rms_norm_eps, tied embeddings, biases, q/k norms,
 * max_position_embeddings) is equal; bos/eos ids are not compared. When they differ and why is
 * not NULL, writes "FIELD: A vs B" (config.json's name for the first field that differs). */
bool lh_config_same_forward(const lh_config *a, const lh_config *b, char *why, size_t cap);
/* Parameters the config implies (tied head counted once). */
size_t lh_config_n_params(const lh_config *c);
/* RoPE inverse frequencies (hd/2), as Hugging Face computes them in fp32: theta^(-2i/hd), with
 * the llama3 rope_scaling adjustment applied when the config has one. */
void lh_config_rope_inv_freq(const lh_config *c, float *inv_freq);
/* The model's RoPE tables cos/sin (max_pos, head_dim/2) from those frequencies. */
void lh_config_rope_tables(const lh_config *c, float *cos_t, float *sin_t, int max_pos);
/* Reads a Hugging Face generation_config.json: when it has eos_token_id (an integer or a list),
 * that list replaces c's eos ids. Other fields (sampling defaults) are ignored. Errors name
 * `what` and the field; c is unchanged on error. */
lh_err lh_config_parse_generation(const char *json, size_t len, const char *what, lh_config *c);

/* ---------------------------------------------------------------- parameters */

/* Named views into a parameter-shaped slab (parameters, gradients, or Adam moments).
 * The slab holds the embedding, then each layer's tensors contiguously (layer by layer, so a
 * range of layers is a contiguous range of the slab), then the final norm and the head.
 * Per-layer fields point into layer 0: layer l of wq is at wq + l * layer_stride. Within a
 * layer wq, wk, wv are adjacent (one (H*hd + 2*KV*hd, C) matrix), so are bq, bk, bv, and
 * so are wgate and wup (one (2F, C) matrix): the trainer multiplies each group at once. bo,
 * when present, follows wo. */
typedef struct lh_params {
  float *embed;        /* (V, C) */
  float *ln1;          /* (C) input_layernorm */
  float *wq;           /* (H*hd, C) */
  float *wk;           /* (KV*hd, C) */
  float *wv;           /* (KV*hd, C) */
  float *bq;           /* (H*hd), NULL without qkv bias */
  float *bk;           /* (KV*hd), NULL without qkv bias */
  float *bv;           /* (KV*hd), NULL without qkv bias */
  float *q_norm;       /* (hd), NULL without qk_norm */
  float *k_norm;       /* (hd), NULL without qk_norm */
  float *wo;           /* (C, H*hd) */
  float *bo;           /* (C), NULL without o_proj bias */
  float *ln2;          /* (C) post_attention_layernorm */
  float *wgate;        /* (F, C) */
  float *wup;          /* (F, C) */
  float *wdown;        /* (C, F) */
  size_t layer_stride; /* floats from one layer's tensors to the next's */
  float *norm;         /* (C) */
  float *lm_head;      /* (V, C); equals embed when embeddings are tied */
} lh_params;

/* Points the views into `slab` (lh_config_n_params floats). */
void lh_params_point(const lh_config *c, float *slab, lh_params *out);

/* One Hugging Face tensor of the model: its name, shape and place in the slab. */
typedef struct lh_tensor_info {
  char name[96];
  int ndim; /* 1 or 2 */
  int64_t shape[2];
  size_t offset; /* in floats from the start of the slab */
  size_t numel;
} lh_tensor_info;

/* Lists the model's tensors in a fixed order (lm_head only when untied). Returns the count;
 * writes at most `cap` entries (call with out=NULL to count). */
int lh_model_tensors(const lh_config *c, lh_tensor_info *out, int cap);

typedef struct lh_model {
  lh_config cfg;
  size_t n_params;
  float *params; /* (n_params) slab, 64-byte aligned, owned */
  lh_params w;   /* views into params */
} lh_model;

/* Allocates a zeroed model for a config (validated here). A slab that cannot be allocated is
 * LH_ERR_NOMEM with its size in the message, never an abort. */
lh_err lh_model_create(const lh_config *c, lh_model **out);
void lh_model_free(lh_model *m);
/* Deterministic random init: normal(0, 0.02) matrices and embeddings (Philox stream by seed),
 * ones for norms, zeros for biases. */
void lh_model_init_random(lh_model *m, uint64_t seed);

/* Loads DIR/config.json, DIR/generation_config.json when present (its eos list replaces
 * config.json's) and DIR/model.safetensors (F32, BF16 or F16; or the shards its index names),
 * read straight into the slab (lh_safetensors_open_lazy). Every weight must be a finite
 * number: a NaN or an infinity is LH_ERR_FORMAT "FILE: tensor NAME: element I is nan" (I
 * counts from 0 in row-major order). */
lh_err lh_model_load(const char *dir, lh_model **out);
/* Loads DIR as one bf16 slab in the model's layout (malloc'd, 64-byte aligned; free() it) and
 * its config: BF16 tensors are copied bit for bit, F32/F16 ones rounded to nearest even. The
 * same checks and messages as lh_model_load (and a finite F32 value that rounds to infinity in
 * bf16 is refused too); no fp32 copy and no copy of the file is ever held. */
lh_err lh_model_load_bf16(const char *dir, lh_config *cfg, uint16_t **slab);
/* Checks DIR as lh_model_load does (config.json, generation_config.json, every tensor's presence,
 * dtype and shape in the safetensors headers) without reading or allocating the weights, and
 * fills *cfg: a directory that passes loads unless memory runs out. */
lh_err lh_model_check(const char *dir, lh_config *cfg);
/* Writes DIR/config.json and DIR/model.safetensors (creating DIR), each atomically. */
typedef enum { LH_SAVE_F32 = 0, LH_SAVE_BF16 = 1 } lh_save_dtype;
lh_err lh_model_save(const lh_model *m, const char *dir, lh_save_dtype dtype);

/* The files of a model directory besides config.json and the weights. */
typedef struct lh_model_files {
  const char *tokenizer_json; /* tokenizer.json's bytes, or NULL: none */
  size_t tokenizer_len;
  const char *generation_config; /* generation_config.json's bytes, or NULL: none */
  size_t generation_len;
} lh_model_files;
/* Writes a whole model directory (creating DIR): config.json and model.safetensors
 * (lh_model_save), and tokenizer.json and generation_config.json when files has them (files may
 * be NULL: neither). The writer owns these names: a generation_config.json or tokenizer.json it
 * was not given, and a model.safetensors.index.json, are removed, so nothing left in DIR
 * overrides what was written (a stale generation_config.json would replace the eos ids). Other
 * files are left alone. Each file is replaced atomically. */
lh_err lh_model_dir_save(const lh_model *m, const char *dir, lh_save_dtype dtype,
                         const lh_model_files *files);
/* Reads DIR's tokenizer.json and generation_config.json, each when present (NULL otherwise),
 * into files (malloc'd: lh_model_files_free, which accepts NULL). */
lh_err lh_model_files_read(const char *dir, lh_model_files *files);
void lh_model_files_free(lh_model_files *files);
/* The same for a bf16 slab in the model's layout (lh_model_load_bf16's, a policy): the bf16
 * weights are written bit for bit. */
lh_err lh_model_dir_save_bf16(const lh_config *cfg, const uint16_t *slab, const char *dir,
                              const lh_model_files *files);
/* The same, sharded when the weights pass shard_bytes (0: never): model-0000k-of-0000n
 * .safetensors files, each at most shard_bytes (a larger tensor alone), in the tensor table's
 * order, and model.safetensors.index.json (metadata.total_size, weight_map), as Hugging Face's
 * save_pretrained writes them. The layout not written (model.safetensors, or the index) is
 * removed. */
lh_err lh_model_dir_save_bf16_shards(const lh_config *cfg, const uint16_t *slab, const char *dir,
                                     const lh_model_files *files, size_t shard_bytes);

/* ---------------------------------------------------------------- training */

/* A batch of variable-length sequences packed end to end (no padding).
 * For token i that is not the first of its sequence, logprob[i] = log p(tokens[i] | earlier
 * tokens of the same sequence); loss_weight[i] weighs it (0 = not in the loss). The first
 * token of each sequence has no log-prob and its weight must be 0. */
typedef struct lh_batch {
  int n_seqs;
  const int *seq_start;     /* (n_seqs+1) offsets into tokens; seq_start[0] = 0 */
  const int32_t *tokens;    /* (N) N = seq_start[n_seqs] */
  const float *loss_weight; /* (N) */
} lh_batch;

typedef struct lh_train lh_train;

/* Sizes activations for up to max_tokens tokens per batch and max_seq tokens per sequence.
 * The model must outlive the training state. Slabs that cannot be allocated are LH_ERR_NOMEM
 * with their size in the message. The attention backward's per-thread scratch is sized for
 * lh_threads() now; that loop never runs on more threads, even after lh_set_threads raises it. */
lh_err lh_train_create(lh_model *m, int max_tokens, int max_seq, lh_train **out);
void lh_train_free(lh_train *t);
/* Checks a batch against the model and the sizes given at creation. */
lh_err lh_batch_validate(const lh_train *t, const lh_batch *b);

/* Forward pass. Writes logprob (N) (0 at sequence starts) and returns the weighted mean
 * cross-entropy sum(w*-logprob)/sum(w) (0 if all weights are 0). */
float lh_train_forward(lh_train *t, const lh_batch *b, float *logprob);
/* Logits of the last forward, (N, V): row i predicts token i+1. Valid until backward. */
const float *lh_train_logits(const lh_train *t);
/* Backward from dL/dlogprob (N) after a forward on the same batch; accumulates into the
 * gradient slab. For the cross-entropy of lh_train_forward, dlogprob = -w/sum(w). */
void lh_train_backward(lh_train *t, const lh_batch *b, const float *dlogprob);
/* Gradient slab (n_params floats) with named views. */
float *lh_train_grads(lh_train *t);
const lh_params *lh_train_grad_views(const lh_train *t);
void lh_train_zero_grad(lh_train *t);
/* Forward + backward of the weighted mean cross-entropy (zeroes gradients first). */
float lh_train_ce_step(lh_train *t, const lh_batch *b, float *logprob);

/* Floating-point operations of one training step (forward + backward) on a batch, counted as
 * 6 * matmul parameters * tokens plus causal attention (docs/PERFORMANCE.md). */
double lh_train_flops(const lh_config *c, const lh_batch *b);

#endif
