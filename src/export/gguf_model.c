/* A model directory as a GGUF file llama.cpp runs: the architecture's metadata (llama, qwen2,
 * qwen3), the tensors under llama.cpp's names (Llama's q/k rows reordered for its interleaved
 * RoPE), llama3 rope_scaling as the rope_freqs tensor, and the tokenizer embedded as a "gpt2"
 * BPE vocabulary (tokens, token types, merges, special ids, pre-tokenizer name). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "export_impl.h"
#include "longhaul/export.h"
#include "longhaul/tensor.h"

/* llama_token_type of llama.cpp's vocabulary */
enum { TOK_NORMAL = 1, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5 };
/* llama_ftype: general.file_type */
enum { FTYPE_F32 = 0, FTYPE_F16 = 1, FTYPE_Q8_0 = 7, FTYPE_BF16 = 32 };

static const char chatml_template[] =
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt "
    "%}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
static const char llama3_template[] =
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] "
    "+ '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' "
    "}}{%- endif %}";

const char *lh__export_chat_template(const lh_tokenizer *t) {
  if (lh_tokenizer_find(t, "<|im_start|>") >= 0 && lh_tokenizer_find(t, "<|im_end|>") >= 0)
    return chatml_template;
  if (lh_tokenizer_find(t, "<|start_header_id|>") >= 0 &&
      lh_tokenizer_find(t, "<|end_header_id|>") >= 0 && lh_tokenizer_find(t, "<|eot_id|>") >= 0)
    return llama3_template;
  return NULL;
}

lh_err lh__export_refuse_existing(const char *path, bool force) {
  struct stat sb;
  if (!force && lstat(path, &sb) == 0)
    return lh_errorf(LH_ERR_INVAL, "%s exists (pass --force to replace it)", path);
  return LH_ERR_OK;
}

lh_err lh__export_tokenizer(const char *dir, lh_tokenizer **out) {
  char *p = lh_path_join(dir, "tokenizer.json");
  struct stat sb;
  lh_err e = stat(p, &sb) == 0 ? lh_tokenizer_load(p, out)
                               : lh_errorf(LH_ERR_NOTFOUND,
                                           "%s: no tokenizer.json; an export needs the model's "
                                           "tokenizer (init-model --tokenizer, or copy it in)",
                                           dir);
  free(p);
  return e;
}

/* ---------------------------------------------------------------- the vocabulary */

/* The GGUF spelling of id's token: the byte-level string a "gpt2" vocabulary holds. A tokenizer
 * that is not byte-level (chars) stores plain characters: their bytes are spelled through the
 * GPT-2 byte map, so llama.cpp's BPE (which always works on that map) finds them. */
static char *token_text(const lh_tokenizer *t, int32_t id, int *type) {
  const char *s = lh_tokenizer_token(t, id);
  if (!s) {
    char pad[32];
    snprintf(pad, sizeof pad, "[PAD%d]", id);
    *type = TOK_UNUSED;
    return lh_xstrdup(pad);
  }
  if (lh_tokenizer_is_added(t, id)) {
    *type = lh_tokenizer_is_special(t, id) ? TOK_CONTROL : TOK_USER_DEFINED;
    return lh_xstrdup(s);
  }
  *type = TOK_NORMAL;
  if (lh_tokenizer_byte_level(t)) return lh_xstrdup(s);
  size_t n = strlen(s), k = 0;
  char *o = lh_xmalloc(2 * n + 1); /* each byte's code point is below U+0800 */
  for (size_t i = 0; i < n; i++) {
    uint32_t cp = lh_tokenizer_byte_char((uint8_t)s[i]);
    if (cp < 0x80) {
      o[k++] = (char)cp;
    } else {
      o[k++] = (char)(0xc0 | (cp >> 6));
      o[k++] = (char)(0x80 | (cp & 0x3f));
    }
  }
  o[k] = '\0';
  return o;
}

/* llama.cpp's tokenizer.ggml.pre for the tokenizer's split pattern. */
static const char *pre_name(const lh_tokenizer *t) {
  const char *p = lh_tokenizer_pretokenizer(t);
  if (!strcmp(p, "qwen2")) return "qwen2";
  if (!strcmp(p, "llama3")) return "llama-bpe";
  if (!strcmp(p, "gpt2")) return "gpt-2";
  return NULL;
}

static int32_t find_first(const lh_tokenizer *t, const char *const *names) {
  for (; *names; names++) {
    int32_t id = lh_tokenizer_find(t, *names);
    if (id >= 0) return id;
  }
  return -1;
}

static lh_err put_tokenizer(lh_gguf *g, const lh_tokenizer *t, const lh_config *c,
                            const char *src) {
  int V = c->vocab_size, nt = lh_tokenizer_vocab_size(t);
  if (nt > V)
    return lh_errorf(LH_ERR_UNSUPPORTED,
                     "%s: tokenizer.json has %d ids, more than the model's vocab_size %d: "
                     "llama.cpp needs one embedding row per token",
                     src, nt, V);
  size_t n_merges = lh_tokenizer_merges(t, NULL, NULL, 0);
  const char *pre = pre_name(t);
  if (!pre && n_merges > 0)
    return lh_errorf(LH_ERR_UNSUPPORTED,
                     "%s: a BPE tokenizer with merges but no pre-tokenizer pattern llama.cpp "
                     "knows (GPT-2, Llama-3, Qwen2)",
                     src);
  /* without merges every character is its own token, so any split gives the same ids */
  if (!pre) pre = "default";
  char **tok = lh_xcalloc((size_t)V, sizeof *tok);
  int32_t *type = lh_xcalloc((size_t)V, sizeof *type);
  int32_t *left = lh_xmalloc((n_merges + 1) * sizeof *left);
  int32_t *right = lh_xmalloc((n_merges + 1) * sizeof *right);
  char **merges = lh_xcalloc(n_merges + 1, sizeof *merges);
  for (int i = 0; i < V; i++) {
    int ty;
    tok[i] = token_text(t, i, &ty);
    type[i] = ty;
  }
  lh_tokenizer_merges(t, left, right, n_merges);
  for (size_t i = 0; i < n_merges; i++) {
    size_t a = strlen(tok[left[i]]), b = strlen(tok[right[i]]);
    merges[i] = lh_xmalloc(a + b + 2);
    memcpy(merges[i], tok[left[i]], a);
    merges[i][a] = ' ';
    memcpy(merges[i] + a + 1, tok[right[i]], b + 1);
  }
  static const char *const pads[] = {"<|pad|>", "<|endoftext|>", "<|finetune_right_pad_id|>", NULL};
  int32_t pad = find_first(t, pads);
  lh_err e;
  if ((e = lh_gguf_set_str(g, "tokenizer.ggml.model", "gpt2")) ||
      (e = lh_gguf_set_str(g, "tokenizer.ggml.pre", pre)) ||
      (e = lh_gguf_set_str_array(g, "tokenizer.ggml.tokens", (const char *const *)tok,
                                 (size_t)V)) ||
      (e = lh_gguf_set_i32_array(g, "tokenizer.ggml.token_type", type, (size_t)V)) ||
      (e = lh_gguf_set_str_array(g, "tokenizer.ggml.merges", (const char *const *)merges,
                                 n_merges)))
    goto out;
  if (c->bos_token_id >= 0 &&
      (e = lh_gguf_set_u32(g, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_token_id)))
    goto out;
  if (c->eos_token_id >= 0 &&
      (e = lh_gguf_set_u32(g, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_token_id)))
    goto out;
  if (pad >= 0 && (e = lh_gguf_set_u32(g, "tokenizer.ggml.padding_token_id", (uint32_t)pad)))
    goto out;
  /* longhaul never adds a bos the text does not spell (tokenizer.h): neither does the GGUF */
  if ((e = lh_gguf_set_bool(g, "tokenizer.ggml.add_bos_token", false)) ||
      (e = lh_gguf_set_bool(g, "tokenizer.ggml.add_eos_token", false)))
    goto out;
  const char *chat = lh__export_chat_template(t);
  if (chat) e = lh_gguf_set_str(g, "tokenizer.chat_template", chat);
out:
  for (int i = 0; i < V; i++)
    free(tok[i]);
  for (size_t i = 0; i < n_merges; i++)
    free(merges[i]);
  free(tok);
  free(type);
  free(left);
  free(right);
  free(merges);
  return e;
}

/* ---------------------------------------------------------------- the architecture */

static const char *arch_name(lh_arch a) {
  return a == LH_ARCH_QWEN2 ? "qwen2" : a == LH_ARCH_QWEN3 ? "qwen3" : "llama";
}

static lh_err put_arch(lh_gguf *g, const lh_config *c) {
  const char *a = arch_name(c->arch);
  char k[96];
  lh_err e = LH_ERR_OK;
#define U32(key, v)                                                                                \
  if (!e) {                                                                                        \
    snprintf(k, sizeof k, "%s." key, a);                                                           \
    e = lh_gguf_set_u32(g, k, (uint32_t)(v));                                                      \
  }
#define F32(key, v)                                                                                \
  if (!e) {                                                                                        \
    snprintf(k, sizeof k, "%s." key, a);                                                           \
    e = lh_gguf_set_f32(g, k, (float)(v));                                                         \
  }
  U32("vocab_size", c->vocab_size);
  U32("context_length", c->max_positions);
  U32("embedding_length", c->hidden_size);
  U32("block_count", c->n_layers);
  U32("feed_forward_length", c->intermediate_size);
  U32("attention.head_count", c->n_heads);
  U32("attention.head_count_kv", c->n_kv_heads);
  U32("attention.key_length", c->head_dim);
  U32("attention.value_length", c->head_dim);
  U32("rope.dimension_count", c->head_dim);
  F32("attention.layer_norm_rms_epsilon", c->rms_eps);
  F32("rope.freq_base", c->rope_theta);
#undef U32
#undef F32
  return e;
}

/* llama.cpp's name of a Hugging Face tensor, into out (cap bytes); false for an unknown one. */
static bool gguf_name(const char *hf, char *out, size_t cap) {
  static const char *const whole[][2] = {{"model.embed_tokens.weight", "token_embd.weight"},
                                         {"model.norm.weight", "output_norm.weight"},
                                         {"lm_head.weight", "output.weight"}};
  for (size_t i = 0; i < sizeof whole / sizeof whole[0]; i++)
    if (!strcmp(hf, whole[i][0])) return (size_t)snprintf(out, cap, "%s", whole[i][1]) < cap;
  static const char *const part[][2] = {
      {"input_layernorm", "attn_norm"},    {"self_attn.q_proj", "attn_q"},
      {"self_attn.k_proj", "attn_k"},      {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"}, {"self_attn.q_norm", "attn_q_norm"},
      {"self_attn.k_norm", "attn_k_norm"}, {"post_attention_layernorm", "ffn_norm"},
      {"mlp.gate_proj", "ffn_gate"},       {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}};
  int layer, used = 0;
  if (sscanf(hf, "model.layers.%d.%n", &layer, &used) != 1 || used == 0) return false;
  const char *rest = hf + used, *dot = strrchr(rest, '.');
  if (!dot) return false;
  for (size_t i = 0; i < sizeof part / sizeof part[0]; i++) {
    size_t l = strlen(part[i][0]);
    if ((size_t)(dot - rest) == l && !strncmp(rest, part[i][0], l))
      return (size_t)snprintf(out, cap, "blk.%d.%s%s", layer, part[i][1], dot) < cap;
  }
  return false;
}

/* Llama's q/k rows, head by head, from Hugging Face's rotate-half order (pairs (j, j + hd/2))
 * to the interleaved order of llama.cpp's LLAMA rope (pairs (2j, 2j + 1)): row 2j + s of a head
 * is row s * hd/2 + j. rows (n, cols), n = heads * hd. */
static void permute_rows(const float *src, float *dst, int heads, int hd, size_t cols) {
  for (int h = 0; h < heads; h++)
    for (int j = 0; j < hd / 2; j++)
      for (int s = 0; s < 2; s++)
        memcpy(dst + ((size_t)h * hd + 2 * j + s) * cols,
               src + ((size_t)h * hd + s * (hd / 2) + j) * cols, cols * sizeof *dst);
}

/* llama3 rope_scaling as llama.cpp reads it: rope_freqs (hd/2), the factor each frequency is
 * divided by, unscaled / scaled inverse frequency (lh_config_rope_inv_freq). */
static void rope_freqs(const lh_config *c, float *out) {
  int n = c->head_dim / 2;
  lh_config plain = *c;
  plain.rope_scaling = LH_ROPE_DEFAULT;
  float *scaled = lh_xmalloc((size_t)n * sizeof *scaled);
  lh_config_rope_inv_freq(&plain, out);
  lh_config_rope_inv_freq(c, scaled);
  for (int i = 0; i < n; i++)
    out[i] = out[i] / scaled[i];
  free(scaled);
}

static uint32_t file_type(lh_gguf_type t) {
  return t == LH_GGUF_F16    ? FTYPE_F16
         : t == LH_GGUF_Q8_0 ? FTYPE_Q8_0
         : t == LH_GGUF_BF16 ? FTYPE_BF16
                             : FTYPE_F32;
}

lh_err lh_export_gguf(const char *src, const char *path, lh_gguf_type type, const char *name,
                      bool force) {
  lh_err e = lh__export_refuse_existing(path, force);
  if (e) return e;
  lh_config cfg;
  uint16_t *bf = NULL;
  float *w = NULL; /* the bf16 policy's values in fp32 */
  lh_tokenizer *tok = NULL;
  lh_gguf *g = NULL;
  lh_tensor_info *info = NULL;
  float *perm = NULL, *freqs = NULL;
  /* the release is the bf16 policy (what workers and `generate` run): an f32 GGUF holds those
   * values exactly, whatever precision the checkpoint keeps */
  if ((e = lh__export_tokenizer(src, &tok)) || (e = lh_model_load_bf16(src, &cfg, &bf))) goto out;
  const lh_config *c = &cfg;
  size_t n_params = lh_config_n_params(c);
  if (!(w = lh_try_malloc_aligned(n_params * sizeof *w, "the weights in fp32"))) {
    e = LH_ERR_NOMEM;
    goto out;
  }
  lh_f32_from_bf16_n(w, bf, n_params);
  if (c->arch == LH_ARCH_QWEN3 && (c->qkv_bias || c->o_bias)) {
    e = lh_errorf(LH_ERR_UNSUPPORTED,
                  "%s: Qwen3 with attention_bias: true has attention biases that llama.cpp's "
                  "qwen3 graph does not read; it cannot run this model",
                  src);
    goto out;
  }
  if (c->arch != LH_ARCH_LLAMA && c->rope_scaling != LH_ROPE_DEFAULT) {
    e = lh_errorf(LH_ERR_UNSUPPORTED,
                  "%s: rope_scaling llama3 on a %s model: llama.cpp applies the llama3 "
                  "frequency factors (rope_freqs) to llama models only",
                  src, arch_name(c->arch));
    goto out;
  }
  g = lh_gguf_create();
  if ((e = lh_gguf_set_str(g, "general.architecture", arch_name(c->arch))) ||
      (e = lh_gguf_set_str(g, "general.name", name)) ||
      (e = lh_gguf_set_u32(g, "general.file_type", file_type(type))) ||
      (e = lh_gguf_set_u32(g, "general.quantization_version", 2)) ||
      (e = lh_gguf_set_u32(g, "general.alignment", LH_GGUF_ALIGNMENT)) || (e = put_arch(g, c)) ||
      (e = put_tokenizer(g, tok, c, src)))
    goto out;
  int n = lh_model_tensors(c, NULL, 0);
  info = lh_xcalloc((size_t)n, sizeof *info);
  lh_model_tensors(c, info, n);
  /* Llama's reordered q and k: one buffer for every layer's, in table order */
  size_t perm_len = 0;
  if (c->arch == LH_ARCH_LLAMA)
    for (int i = 0; i < n; i++)
      if (strstr(info[i].name, ".q_proj.") || strstr(info[i].name, ".k_proj."))
        perm_len += info[i].numel;
  if (perm_len && !(perm = lh_try_malloc_aligned(perm_len * sizeof *perm, "q/k reordering"))) {
    e = LH_ERR_NOMEM;
    goto out;
  }
  size_t perm_used = 0;
  for (int i = 0; i < n && !e; i++) {
    const lh_tensor_info *ti = &info[i];
    char gname[64];
    LH_CHECK(gguf_name(ti->name, gname, sizeof gname), "tensor %s has no GGUF name", ti->name);
    const float *data = w + ti->offset;
    bool q = strstr(ti->name, ".q_proj.") != NULL, k = strstr(ti->name, ".k_proj.") != NULL;
    if (perm && (q || k)) {
      size_t cols = ti->ndim == 2 ? (size_t)ti->shape[1] : 1;
      permute_rows(data, perm + perm_used, q ? c->n_heads : c->n_kv_heads, c->head_dim, cols);
      data = perm + perm_used;
      perm_used += ti->numel;
    }
    int64_t ne[2] = {ti->shape[ti->ndim - 1], ti->ndim == 2 ? ti->shape[0] : 1};
    lh_gguf_type tt = ti->ndim == 1 ? LH_GGUF_F32 : type;
    if (tt == LH_GGUF_Q8_0 && ne[0] % LH_GGUF_QK8_0) tt = LH_GGUF_F16;
    e = lh_gguf_add_tensor(g, gname, ti->ndim, ne, tt, data);
  }
  if (!e && c->rope_scaling == LH_ROPE_LLAMA3) {
    freqs = lh_xmalloc((size_t)(c->head_dim / 2) * sizeof *freqs);
    rope_freqs(c, freqs);
    int64_t ne = c->head_dim / 2;
    e = lh_gguf_add_tensor(g, "rope_freqs.weight", 1, &ne, LH_GGUF_F32, freqs);
  }
  if (!e) e = lh_gguf_write(g, path);
out:
  free(freqs);
  free(perm);
  free(info);
  lh_gguf_free(g);
  free(w);
  free(bf);
  lh_tokenizer_free(tok);
  return e;
}
