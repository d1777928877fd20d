/* Model configuration: presets, validation, and Hugging Face config.json (Qwen2ForCausalLM,
 * Qwen3ForCausalLM, LlamaForCausalLM) in both directions, plus generation_config.json's eos
 * list. Every field read from a file is type- and range-checked and errors name the file and the
 * field; anything the model cannot run (rope_scaling other than llama3, other activations,
 * sliding windows, MLP biases) is refused with LH_ERR_UNSUPPORTED. */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/model.h"
#include "longhaul/tensor.h"

/* Also used by io.c: writes config.json with torch_dtype naming the weights' dtype. */
lh_err lh__config_save_dtype(const char *path, const lh_config *c, const char *torch_dtype);

#define MAX_CONFIG_BYTES (16u << 20)
/* objects and arrays, and brackets and separators in all, in a config.json (real ones: tens):
 * parsing one costs at most ~60 MB whatever it holds (lh_json_check_cost) */
#define MAX_CONFIG_OPEN   (1u << 16)
#define MAX_CONFIG_TOKENS (1u << 20)
#define MAX_INTERMEDIATE  (8 * LH_MAX_HIDDEN)
#define MAX_HEAD_DIM      4096

lh_err lh_config_preset(const char *name, lh_arch arch, lh_config *out) {
  if (!out) return lh_errorf(LH_ERR_INVAL, "lh_config_preset: NULL output");
  if (arch != LH_ARCH_LLAMA && arch != LH_ARCH_QWEN2 && arch != LH_ARCH_QWEN3)
    return lh_errorf(LH_ERR_INVAL, "preset: unknown architecture %d", (int)arch);
  lh_config c = {0};
  c.arch = arch;
  if (name && strcmp(name, "tiny") == 0) {
    c.vocab_size = 256;
    c.hidden_size = 128;
    c.n_layers = 4;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.intermediate_size = 384;
  } else if (name && strcmp(name, "small") == 0) {
    c.vocab_size = 4096;
    c.hidden_size = 512;
    c.n_layers = 8;
    c.n_heads = 8;
    c.n_kv_heads = 4;
    c.intermediate_size = 1408;
  } else {
    return lh_errorf(LH_ERR_INVAL, "unknown model preset \"%s\" (expected tiny or small)",
                     name ? name : "(null)");
  }
  c.head_dim = c.hidden_size / c.n_heads;
  c.max_positions = 2048;
  c.rope_theta = 10000.0f;
  c.rms_eps = 1e-6f;
  c.tie_embeddings = true;
  c.qkv_bias = arch == LH_ARCH_QWEN2;
  c.o_bias = false;
  c.qk_norm = arch == LH_ARCH_QWEN3;
  c.bos_token_id = -1;
  c.eos_token_id = -1;
  *out = c;
  return LH_ERR_OK;
}

/* Below lo is malformed; above hi exceeds a limit (LH_ERR_LIMIT) or, when hi is a relation to
 * another field, is malformed too. */
static lh_err check_range(const char *field, long long v, long long lo, long long hi,
                          lh_err above) {
  if (v < lo || v > hi)
    return lh_errorf(v < lo ? LH_ERR_FORMAT : above, "config: %s is %lld, must be in [%lld, %lld]",
                     field, v, lo, hi);
  return LH_ERR_OK;
}

lh_err lh_config_validate(const lh_config *c) {
  if (!c) return lh_errorf(LH_ERR_INVAL, "config: NULL");
  lh_err e;
  if (c->arch != LH_ARCH_LLAMA && c->arch != LH_ARCH_QWEN2 && c->arch != LH_ARCH_QWEN3)
    return lh_errorf(LH_ERR_INVAL, "config: unknown architecture %d", (int)c->arch);
  if ((e = check_range("vocab_size", c->vocab_size, 1, LH_MAX_VOCAB, LH_ERR_LIMIT))) return e;
  if ((e = check_range("hidden_size", c->hidden_size, 1, LH_MAX_HIDDEN, LH_ERR_LIMIT))) return e;
  if ((e = check_range("num_hidden_layers", c->n_layers, 1, LH_MAX_LAYERS, LH_ERR_LIMIT))) return e;
  if ((e = check_range("num_attention_heads", c->n_heads, 1, LH_MAX_HEADS, LH_ERR_LIMIT))) return e;
  if ((e = check_range("num_key_value_heads", c->n_kv_heads, 1, c->n_heads, LH_ERR_FORMAT)))
    return e;
  if (c->n_heads % c->n_kv_heads != 0)
    return lh_errorf(LH_ERR_FORMAT,
                     "config: num_attention_heads (%d) is not a multiple of num_key_value_heads "
                     "(%d)",
                     c->n_heads, c->n_kv_heads);
  if ((e = check_range("head_dim", c->head_dim, 2, MAX_HEAD_DIM, LH_ERR_LIMIT))) return e;
  if (c->head_dim % 2 != 0)
    return lh_errorf(LH_ERR_FORMAT, "config: head_dim is %d, must be even (rotary embedding)",
                     c->head_dim);
  if ((e = check_range("intermediate_size", c->intermediate_size, 1, MAX_INTERMEDIATE,
                       LH_ERR_LIMIT)))
    return e;
  if ((e = check_range("max_position_embeddings", c->max_positions, 1, LH_MAX_POSITIONS,
                       LH_ERR_LIMIT)))
    return e;
  if (!(isfinite(c->rope_theta) && c->rope_theta > 0))
    return lh_errorf(LH_ERR_FORMAT, "config: rope_theta is %g, must be a positive number",
                     (double)c->rope_theta);
  if (!(isfinite(c->rms_eps) && c->rms_eps > 0))
    return lh_errorf(LH_ERR_FORMAT, "config: rms_norm_eps is %g, must be a positive number",
                     (double)c->rms_eps);
  if ((e = check_range("bos_token_id", c->bos_token_id, -1, c->vocab_size - 1, LH_ERR_FORMAT)))
    return e;
  if ((e = check_range("eos_token_id", c->eos_token_id, -1, c->vocab_size - 1, LH_ERR_FORMAT)))
    return e;
  if ((e = check_range("the number of eos_token_id entries", c->n_eos, 0, LH_MAX_EOS,
                       LH_ERR_LIMIT)))
    return e;
  for (int i = 0; i < c->n_eos; i++) {
    char field[32];
    snprintf(field, sizeof field, "eos_token_id[%d]", i);
    if ((e = check_range(field, c->eos_ids[i], 0, c->vocab_size - 1, LH_ERR_FORMAT))) return e;
  }
  if (c->n_eos > 0 && c->eos_token_id != c->eos_ids[0])
    return lh_errorf(LH_ERR_INVAL, "config: eos_token_id is %d but the eos list starts with %d",
                     c->eos_token_id, c->eos_ids[0]);
  if (c->arch == LH_ARCH_QWEN2 && !c->qkv_bias)
    return lh_errorf(LH_ERR_FORMAT, "config: Qwen2 models always have q/k/v biases");
  if (c->arch == LH_ARCH_QWEN2 && c->o_bias)
    return lh_errorf(LH_ERR_FORMAT, "config: Qwen2 models have no o_proj bias");
  if (c->arch != LH_ARCH_QWEN2 && c->o_bias != c->qkv_bias)
    return lh_errorf(LH_ERR_FORMAT,
                     "config: %s models have q/k/v and o_proj biases together (attention_bias); "
                     "found q/k/v bias %s, o_proj bias %s",
                     c->arch == LH_ARCH_LLAMA ? "Llama" : "Qwen3", c->qkv_bias ? "on" : "off",
                     c->o_bias ? "on" : "off");
  if (c->qk_norm != (c->arch == LH_ARCH_QWEN3))
    return lh_errorf(LH_ERR_FORMAT, c->qk_norm ? "config: only Qwen3 models have q/k norms"
                                               : "config: Qwen3 models always have q/k norms");
  if (c->rope_scaling == LH_ROPE_LLAMA3) {
    if (!(isfinite(c->rope_factor) && c->rope_factor >= 1.0f))
      return lh_errorf(LH_ERR_FORMAT, "config: rope_scaling.factor is %g, must be at least 1",
                       (double)c->rope_factor);
    if (!(isfinite(c->rope_low_freq_factor) && c->rope_low_freq_factor > 0.0f &&
          isfinite(c->rope_high_freq_factor) && c->rope_high_freq_factor > c->rope_low_freq_factor))
      return lh_errorf(LH_ERR_FORMAT,
                       "config: rope_scaling: low_freq_factor %g and high_freq_factor %g, need "
                       "0 < low_freq_factor < high_freq_factor",
                       (double)c->rope_low_freq_factor, (double)c->rope_high_freq_factor);
    if ((e = check_range("rope_scaling.original_max_position_embeddings",
                         c->rope_original_max_positions, 1, LH_MAX_POSITIONS, LH_ERR_LIMIT)))
      return e;
  } else if (c->rope_scaling != LH_ROPE_DEFAULT) {
    return lh_errorf(LH_ERR_INVAL, "config: unknown rope_scaling %d", (int)c->rope_scaling);
  }
  /* every field is within its limit, so the count fits in 64 bits (at most ~5e14) */
  size_t n = lh_config_n_params(c);
  if (n > LH_MAX_PARAMS)
    return lh_errorf(LH_ERR_LIMIT,
                     "config: the sizes imply %zu parameters (%.3g), more than the limit of %zu "
                     "(LH_MAX_PARAMS)",
                     n, (double)n, (size_t)LH_MAX_PARAMS);
  return LH_ERR_OK;
}

_Static_assert(sizeof(lh_arch) == sizeof(int) && sizeof(lh_rope_scaling) == sizeof(int),
               "lh_config_same_forward reads the enums as ints");

/* The fields of lh_config that shape the forward, by config.json name, for
 * lh_config_same_forward (enums are read as ints: see the assertion above). */
typedef struct {
  const char *name;
  size_t off;
} config_field;
static const config_field int_fields[] = {
    {"architectures", offsetof(lh_config, arch)},
    {"vocab_size", offsetof(lh_config, vocab_size)},
    {"hidden_size", offsetof(lh_config, hidden_size)},
    {"num_hidden_layers", offsetof(lh_config, n_layers)},
    {"num_attention_heads", offsetof(lh_config, n_heads)},
    {"num_key_value_heads", offsetof(lh_config, n_kv_heads)},
    {"head_dim", offsetof(lh_config, head_dim)},
    {"intermediate_size", offsetof(lh_config, intermediate_size)},
    {"max_position_embeddings", offsetof(lh_config, max_positions)},
    {"rope_scaling", offsetof(lh_config, rope_scaling)},
};
static const config_field flag_fields[] = {
    {"tie_word_embeddings", offsetof(lh_config, tie_embeddings)},
    {"attention_bias (q/k/v)", offsetof(lh_config, qkv_bias)},
    {"attention_bias (o_proj)", offsetof(lh_config, o_bias)},
    {"q/k norms", offsetof(lh_config, qk_norm)},
};
/* the last three count only when both configs use llama3 rope_scaling */
static const config_field float_fields[] = {
    {"rope_theta", offsetof(lh_config, rope_theta)},
    {"rms_norm_eps", offsetof(lh_config, rms_eps)},
    {"rope_scaling.factor", offsetof(lh_config, rope_factor)},
    {"rope_scaling.low_freq_factor", offsetof(lh_config, rope_low_freq_factor)},
    {"rope_scaling.high_freq_factor", offsetof(lh_config, rope_high_freq_factor)},
};

bool lh_config_same_forward(const lh_config *a, const lh_config *b, char *why, size_t cap) {
  const char *pa = (const char *)a, *pb = (const char *)b;
  bool scaled = a->rope_scaling == LH_ROPE_LLAMA3 && b->rope_scaling == LH_ROPE_LLAMA3;
  for (size_t i = 0; i < sizeof int_fields / sizeof int_fields[0]; i++) {
    int x, y;
    memcpy(&x, pa + int_fields[i].off, sizeof x);
    memcpy(&y, pb + int_fields[i].off, sizeof y);
    if (x != y) {
      if (why) snprintf(why, cap, "%s: %d vs %d", int_fields[i].name, x, y);
      return false;
    }
  }
  for (size_t i = 0; i < sizeof flag_fields / sizeof flag_fields[0]; i++) {
    bool x = *(const bool *)(pa + flag_fields[i].off), y = *(const bool *)(pb + flag_fields[i].off);
    if (x != y) {
      if (why)
        snprintf(why, cap, "%s: %s vs %s", flag_fields[i].name, x ? "yes" : "no", y ? "yes" : "no");
      return false;
    }
  }
  for (size_t i = 0; i < (scaled ? 5u : 2u); i++) {
    float x, y;
    memcpy(&x, pa + float_fields[i].off, sizeof x);
    memcpy(&y, pb + float_fields[i].off, sizeof y);
    if (x != y) {
      if (why) snprintf(why, cap, "%s: %.9g vs %.9g", float_fields[i].name, (double)x, (double)y);
      return false;
    }
  }
  if (scaled && a->rope_original_max_positions != b->rope_original_max_positions) {
    if (why)
      snprintf(why, cap, "rope_scaling.original_max_position_embeddings: %d vs %d",
               a->rope_original_max_positions, b->rope_original_max_positions);
    return false;
  }
  return true;
}

size_t lh_config_n_params(const lh_config *c) {
  size_t V = (size_t)c->vocab_size, C = (size_t)c->hidden_size, L = (size_t)c->n_layers;
  size_t H = (size_t)c->n_heads, KV = (size_t)c->n_kv_heads, hd = (size_t)c->head_dim;
  size_t F = (size_t)c->intermediate_size;
  size_t layer = 2 * C + H * hd * C + 2 * KV * hd * C + C * H * hd + 3 * F * C;
  if (c->qkv_bias) layer += H * hd + 2 * KV * hd;
  if (c->o_bias) layer += C;
  if (c->qk_norm) layer += 2 * hd;
  size_t n = V * C + L * layer + C;
  if (!c->tie_embeddings) n += V * C;
  return n;
}

void lh_config_rope_inv_freq(const lh_config *c, float *inv_freq) {
  int half = c->head_dim / 2;
  for (int i = 0; i < half; i++)
    inv_freq[i] = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)c->head_dim);
  if (c->rope_scaling != LH_ROPE_LLAMA3) return;
  /* transformers' _compute_llama3_parameters, op for op in fp32: wavelengths above
   * original/low_freq_factor are stretched by factor, those below original/high_freq_factor
   * kept, and the band between interpolated smoothly. */
  float factor = c->rope_factor, low = c->rope_low_freq_factor, high = c->rope_high_freq_factor;
  float old_len = (float)c->rope_original_max_positions;
  float low_wavelen = (float)((double)c->rope_original_max_positions / low);
  float high_wavelen = (float)((double)c->rope_original_max_positions / high);
  float band = (float)((double)high - (double)low);
  for (int i = 0; i < half; i++) {
    float inv = inv_freq[i];
    float wavelen = (1.0f / inv) * (float)(2.0 * 3.14159265358979323846);
    float scaled = wavelen > low_wavelen ? inv / factor : inv;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
      float smooth = (old_len * (1.0f / wavelen) - low) / band;
      scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
    inv_freq[i] = scaled;
  }
}

void lh_config_rope_tables(const lh_config *c, float *cos_t, float *sin_t, int max_pos) {
  float *inv_freq = lh_xmalloc((size_t)(c->head_dim / 2) * sizeof *inv_freq);
  lh_config_rope_inv_freq(c, inv_freq);
  lh_rope_tables(cos_t, sin_t, max_pos, c->head_dim, inv_freq);
  free(inv_freq);
}

/* ---------------------------------------------------------------- config.json */

/* Field getters: a missing field (or JSON null) keeps *out and returns OK unless `required`. */
static lh_err get_int(const json_t *root, const char *what, const char *field, int required,
                      int *out) {
  const json_t *v = json_object_get(root, field);
  if (!v || json_is_null(v)) {
    if (required) return lh_errorf(LH_ERR_FORMAT, "%s: field %s is missing", what, field);
    return LH_ERR_OK;
  }
  if (!json_is_integer(v))
    return lh_errorf(LH_ERR_FORMAT, "%s: field %s: expected an integer, found %s", what, field,
                     lh_json_type_name(v));
  json_int_t x = json_integer_value(v);
  if (x < -2147483647 || x > 2147483647)
    return lh_errorf(LH_ERR_LIMIT, "%s: field %s: %lld is out of range", what, field, (long long)x);
  *out = (int)x;
  return LH_ERR_OK;
}

static lh_err get_num(const json_t *root, const char *what, const char *field, float *out) {
  const json_t *v = json_object_get(root, field);
  if (!v || json_is_null(v)) return LH_ERR_OK;
  if (!json_is_number(v))
    return lh_errorf(LH_ERR_FORMAT, "%s: field %s: expected a number, found %s", what, field,
                     lh_json_type_name(v));
  double d = json_number_value(v);
  if (!isfinite(d) || fabs(d) > 3.0e38)
    return lh_errorf(LH_ERR_LIMIT, "%s: field %s: %g is out of range", what, field, d);
  *out = (float)d;
  return LH_ERR_OK;
}

static lh_err get_bool(const json_t *root, const char *what, const char *field, bool *out) {
  const json_t *v = json_object_get(root, field);
  if (!v || json_is_null(v)) return LH_ERR_OK;
  if (!json_is_boolean(v))
    return lh_errorf(LH_ERR_FORMAT, "%s: field %s: expected a boolean, found %s", what, field,
                     lh_json_type_name(v));
  *out = json_is_true(v);
  return LH_ERR_OK;
}

/* bos/eos: an integer, a list whose first element is used, or null (-1). */
static lh_err get_token(const json_t *root, const char *what, const char *field, int *out) {
  const json_t *v = json_object_get(root, field);
  *out = -1;
  if (!v || json_is_null(v)) return LH_ERR_OK;
  if (json_is_array(v)) {
    if (json_array_size(v) == 0) return LH_ERR_OK;
    v = json_array_get(v, 0);
  }
  if (!json_is_integer(v))
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: field %s: expected an integer or a list of integers, "
                     "found %s",
                     what, field, lh_json_type_name(v));
  json_int_t x = json_integer_value(v);
  if (x < -1 || x > 2147483647)
    return lh_errorf(LH_ERR_LIMIT, "%s: field %s: %lld is out of range", what, field, (long long)x);
  *out = (int)x;
  return LH_ERR_OK;
}

/* eos_token_id: an integer, a list of at most LH_MAX_EOS integers, or null. Sets the list and
 * eos_token_id (its first entry, or -1). */
static lh_err get_eos(const json_t *root, const char *what, lh_config *c) {
  const json_t *v = json_object_get(root, "eos_token_id");
  int ids[LH_MAX_EOS], n = 0;
  if (v && json_is_array(v)) {
    if (json_array_size(v) > LH_MAX_EOS)
      return lh_errorf(LH_ERR_LIMIT, "%s: field eos_token_id: %zu ids, more than the limit of %d",
                       what, json_array_size(v), LH_MAX_EOS);
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x) {
      if (!json_is_integer(x))
        return lh_errorf(LH_ERR_FORMAT,
                         "%s: field eos_token_id[%zu]: expected an integer, found %s", what, i,
                         lh_json_type_name(x));
      json_int_t id = json_integer_value(x);
      if (id < 0 || id > 2147483647)
        return lh_errorf(LH_ERR_LIMIT, "%s: field eos_token_id[%zu]: %lld is out of range", what, i,
                         (long long)id);
      ids[n++] = (int)id;
    }
  } else if (v && !json_is_null(v)) {
    if (!json_is_integer(v))
      return lh_errorf(LH_ERR_FORMAT,
                       "%s: field eos_token_id: expected an integer or a list of integers, "
                       "found %s",
                       what, lh_json_type_name(v));
    json_int_t id = json_integer_value(v);
    if (id < -1 || id > 2147483647)
      return lh_errorf(LH_ERR_LIMIT, "%s: field eos_token_id: %lld is out of range", what,
                       (long long)id);
    if (id >= 0) ids[n++] = (int)id;
  }
  memcpy(c->eos_ids, ids, (size_t)n * sizeof ids[0]);
  c->n_eos = n;
  c->eos_token_id = n ? ids[0] : -1;
  return LH_ERR_OK;
}

/* The first of "architectures" that longhaul knows; when the list names only others, the model
 * is one we cannot run whatever model_type says. Without a list, model_type decides. */
static lh_err get_arch(const json_t *root, const char *what, lh_arch *out) {
  const json_t *archs = json_object_get(root, "architectures");
  const char *first = NULL;
  if (archs && !json_is_null(archs)) {
    if (!json_is_array(archs))
      return lh_errorf(LH_ERR_FORMAT,
                       "%s: field architectures: expected a list of strings, "
                       "found %s",
                       what, lh_json_type_name(archs));
    size_t i;
    const json_t *a;
    json_array_foreach(archs, i, a) {
      if (!json_is_string(a))
        return lh_errorf(LH_ERR_FORMAT,
                         "%s: field architectures[%zu]: expected a string, "
                         "found %s",
                         what, i, lh_json_type_name(a));
      const char *s = json_string_value(a);
      if (!first) first = s;
      if (strcmp(s, "Qwen2ForCausalLM") == 0) {
        *out = LH_ARCH_QWEN2;
        return LH_ERR_OK;
      }
      if (strcmp(s, "Qwen3ForCausalLM") == 0) {
        *out = LH_ARCH_QWEN3;
        return LH_ERR_OK;
      }
      if (strcmp(s, "LlamaForCausalLM") == 0) {
        *out = LH_ARCH_LLAMA;
        return LH_ERR_OK;
      }
    }
  }
  const json_t *mt = json_object_get(root, "model_type");
  if (!first && mt && !json_is_null(mt)) {
    if (!json_is_string(mt))
      return lh_errorf(LH_ERR_FORMAT, "%s: field model_type: expected a string, found %s", what,
                       lh_json_type_name(mt));
    const char *s = json_string_value(mt);
    if (strcmp(s, "qwen2") == 0) {
      *out = LH_ARCH_QWEN2;
      return LH_ERR_OK;
    }
    if (strcmp(s, "qwen3") == 0) {
      *out = LH_ARCH_QWEN3;
      return LH_ERR_OK;
    }
    if (strcmp(s, "llama") == 0) {
      *out = LH_ARCH_LLAMA;
      return LH_ERR_OK;
    }
    if (!first) first = s;
  }
  if (!first)
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: neither architectures nor model_type says what the "
                     "model is",
                     what);
  return lh_errorf(LH_ERR_UNSUPPORTED,
                   "%s: architecture %.100s is not supported (expected Qwen2ForCausalLM, "
                   "Qwen3ForCausalLM or LlamaForCausalLM)",
                   what, first);
}

/* Fields that must be absent, null or a harmless value, since the model does not implement
 * the alternative. */
static lh_err check_unsupported(const json_t *root, const char *what) {
  const json_t *v = json_object_get(root, "hidden_act");
  if (v && !json_is_null(v)) {
    if (!json_is_string(v))
      return lh_errorf(LH_ERR_FORMAT, "%s: field hidden_act: expected a string, found %s", what,
                       lh_json_type_name(v));
    if (strcmp(json_string_value(v), "silu") != 0)
      return lh_errorf(LH_ERR_UNSUPPORTED, "%s: hidden_act %.60s is not supported (only silu)",
                       what, json_string_value(v));
  }
  bool flag = false;
  lh_err e = get_bool(root, what, "use_sliding_window", &flag);
  if (e) return e;
  if (flag)
    return lh_errorf(LH_ERR_UNSUPPORTED,
                     "%s: use_sliding_window is true; sliding-window "
                     "attention is not supported",
                     what);
  flag = false;
  if ((e = get_bool(root, what, "mlp_bias", &flag))) return e;
  if (flag)
    return lh_errorf(LH_ERR_UNSUPPORTED, "%s: mlp_bias is true; MLP biases are not supported",
                     what);
  /* RoPE on part of each head (transformers reads it at the top level, or in v5's
   * rope_parameters) */
  const json_t *params = json_object_get(root, "rope_parameters");
  const json_t *where[2] = {root, json_is_object(params) ? params : NULL};
  for (int i = 0; i < 2; i++) {
    float partial = 1.0f;
    if (where[i] && (e = get_num(where[i], what, "partial_rotary_factor", &partial))) return e;
    if (partial != 1.0f)
      return lh_errorf(LH_ERR_UNSUPPORTED,
                       "%s: partial_rotary_factor %g; RoPE on part of each head is not supported",
                       what, (double)partial);
  }
  return LH_ERR_OK;
}

/* rope_scaling: null, {"rope_type" (or "type"): "default"}, or llama3 with its four fields,
 * all required as transformers requires them. transformers v5 writes rope_parameters instead,
 * the same object with rope_theta in it, and no top-level rope_theta or rope_scaling; it is
 * read the same way (parameters per layer type, as Gemma's, have no rope_type and are refused).
 * Sets c->rope_scaling, its factors, and c->rope_theta when rope_parameters gives it. */
static lh_err get_rope_scaling(const json_t *root, const char *what, lh_config *c) {
  c->rope_scaling = LH_ROPE_DEFAULT;
  const char *field = "rope_scaling";
  const json_t *v = json_object_get(root, field),
               *params = json_object_get(root, "rope_parameters");
  if (params && !json_is_null(params)) {
    if (v && !json_is_null(v))
      return lh_errorf(LH_ERR_FORMAT,
                       "%s: both rope_scaling and rope_parameters (transformers v5's name for "
                       "it): give one",
                       what);
    field = "rope_parameters";
    v = params;
  }
  if (!v || json_is_null(v)) return LH_ERR_OK;
  if (!json_is_object(v))
    return lh_errorf(LH_ERR_FORMAT, "%s: field %s: expected an object or null, found %s", what,
                     field, lh_json_type_name(v));
  if (v == params) {
    if (json_object_get(root, "rope_theta"))
      return lh_errorf(LH_ERR_FORMAT, "%s: both rope_theta and rope_parameters: give one", what);
    char theta_what[600];
    snprintf(theta_what, sizeof theta_what, "%s: rope_parameters", what);
    lh_err e = get_num(v, theta_what, "rope_theta", &c->rope_theta);
    if (e) return e;
  }
  const json_t *t = json_object_get(v, "rope_type");
  if (!json_is_string(t)) t = json_object_get(v, "type");
  const char *type = json_is_string(t) ? json_string_value(t) : "(unnamed)";
  /* "default" is plain RoPE, written by some exporters. */
  if (strcmp(type, "default") == 0) return LH_ERR_OK;
  if (strcmp(type, "llama3") != 0)
    return lh_errorf(LH_ERR_UNSUPPORTED,
                     "%s: %s type %.60s is not supported (only llama3 and default)", what, field,
                     type);
  static const char *const fields[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
  double x[4];
  for (int i = 0; i < 4; i++) {
    const json_t *f = json_object_get(v, fields[i]);
    if (!f || !json_is_number(f) || (i == 3 && !json_is_integer(f)))
      return lh_errorf(LH_ERR_FORMAT, "%s: field %s.%s: expected %s, found %s", what, field,
                       fields[i], i == 3 ? "an integer" : "a number",
                       f ? lh_json_type_name(f) : "nothing");
    x[i] = json_number_value(f);
    if (!isfinite(x[i]) || fabs(x[i]) > (i == 3 ? (double)LH_MAX_POSITIONS : 3.0e38))
      return lh_errorf(LH_ERR_LIMIT, "%s: field %s.%s: %g is out of range", what, field, fields[i],
                       x[i]);
  }
  c->rope_factor = (float)x[0];
  c->rope_low_freq_factor = (float)x[1];
  c->rope_high_freq_factor = (float)x[2];
  c->rope_original_max_positions = (int)x[3];
  c->rope_scaling = LH_ROPE_LLAMA3;
  return LH_ERR_OK;
}

/* Parses outside JSON text that must be an object, within MAX_CONFIG_BYTES. */
static lh_err parse_object(const char *json, size_t len, const char *what, json_t **root) {
  *root = NULL;
  if (!json && len) return lh_errorf(LH_ERR_INVAL, "%s: NULL argument", what);
  if (len > MAX_CONFIG_BYTES)
    return lh_errorf(LH_ERR_LIMIT, "%s: %zu bytes, more than the limit of %u", what, len,
                     MAX_CONFIG_BYTES);
  lh_err cost = lh_json_check_cost(json, len, MAX_CONFIG_OPEN, MAX_CONFIG_TOKENS, what);
  if (cost) return cost;
  json_error_t jerr;
  json_t *r = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &jerr);
  if (!r && json_error_code(&jerr) == json_error_out_of_memory)
    return lh_errorf(LH_ERR_NOMEM, "%s: out of memory while parsing", what);
  if (!r)
    return lh_errorf(LH_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", what, jerr.text,
                     jerr.line, jerr.column);
  if (!json_is_object(r)) {
    lh_err e = lh_errorf(LH_ERR_FORMAT, "%s: expected a JSON object, found %s", what,
                         lh_json_type_name(r));
    json_decref(r);
    return e;
  }
  *root = r;
  return LH_ERR_OK;
}

lh_err lh_config_parse(const char *json, size_t len, const char *what, lh_config *out) {
  if (!what) what = "config.json";
  if (!out) return lh_errorf(LH_ERR_INVAL, "%s: NULL argument", what);
  json_t *root = NULL;
  lh_err e = parse_object(json, len, what, &root);
  if (e) return e;
  lh_config c = {0};
  if ((e = get_arch(root, what, &c.arch))) goto out;
  if ((e = check_unsupported(root, what))) goto out;
  c.rope_theta = 10000.0f; /* rope_parameters (below) or rope_theta (later) may say otherwise */
  if ((e = get_rope_scaling(root, what, &c))) goto out;
  if ((e = get_int(root, what, "vocab_size", 1, &c.vocab_size))) goto out;
  if ((e = get_int(root, what, "hidden_size", 1, &c.hidden_size))) goto out;
  if ((e = get_int(root, what, "intermediate_size", 1, &c.intermediate_size))) goto out;
  if ((e = get_int(root, what, "num_hidden_layers", 1, &c.n_layers))) goto out;
  if ((e = get_int(root, what, "num_attention_heads", 1, &c.n_heads))) goto out;
  c.n_kv_heads = c.n_heads;
  if ((e = get_int(root, what, "num_key_value_heads", 0, &c.n_kv_heads))) goto out;
  c.head_dim = c.n_heads > 0 ? c.hidden_size / c.n_heads : 0;
  if ((e = get_int(root, what, "head_dim", 0, &c.head_dim))) goto out;
  /* transformers defaults: LlamaConfig 2048, Qwen2Config and Qwen3Config 32768 */
  c.max_positions = c.arch == LH_ARCH_LLAMA ? 2048 : 32768;
  if ((e = get_int(root, what, "max_position_embeddings", 0, &c.max_positions))) goto out;
  if ((e = get_num(root, what, "rope_theta", &c.rope_theta))) goto out;
  c.rms_eps = 1e-6f;
  if ((e = get_num(root, what, "rms_norm_eps", &c.rms_eps))) goto out;
  c.tie_embeddings = false;
  if ((e = get_bool(root, what, "tie_word_embeddings", &c.tie_embeddings))) goto out;
  c.qkv_bias = false;
  if ((e = get_bool(root, what, "attention_bias", &c.qkv_bias))) goto out;
  /* transformers: Qwen2Attention has q/k/v biases and no o_proj bias whatever attention_bias
   * says; LlamaAttention and Qwen3Attention give all four projections bias=attention_bias */
  if (c.arch == LH_ARCH_QWEN2) c.qkv_bias = true;
  c.o_bias = c.arch != LH_ARCH_QWEN2 && c.qkv_bias;
  c.qk_norm = c.arch == LH_ARCH_QWEN3;
  if ((e = get_token(root, what, "bos_token_id", &c.bos_token_id))) goto out;
  if ((e = get_eos(root, what, &c))) goto out;
  if (c.hidden_size > 0 && c.n_heads > 0 && !json_is_integer(json_object_get(root, "head_dim")) &&
      c.hidden_size % c.n_heads != 0) {
    e = lh_errorf(LH_ERR_FORMAT,
                  "%s: hidden_size %d is not a multiple of num_attention_heads %d and no head_dim "
                  "is given",
                  what, c.hidden_size, c.n_heads);
    goto out;
  }
  if ((e = lh_config_validate(&c))) {
    /* validate's message starts with "config: "; name the file instead */
    char msg[1024];
    const char *m = lh_last_error();
    if (strncmp(m, "config: ", 8) == 0) m += 8;
    snprintf(msg, sizeof msg, "%s", m);
    e = lh_errorf(e, "%s: %s", what, msg);
    goto out;
  }
  *out = c;
out:
  json_decref(root);
  return e;
}

lh_err lh_config_load(const char *path, lh_config *out) {
  if (!path || !out) return lh_errorf(LH_ERR_INVAL, "lh_config_load: NULL argument");
  char *buf = NULL;
  size_t len = 0;
  lh_err e = lh_file_read(path, MAX_CONFIG_BYTES, &buf, &len);
  if (e) return e;
  e = lh_config_parse(buf, len, path, out);
  free(buf);
  return e;
}

/* The shortest decimal that reads back as the same float, as a double, so that config.json
 * says 1e-06 rather than 9.9999999747524271e-07. */
static double float_to_short_double(float f) {
  char buf[32];
  for (int prec = 1; prec <= 9; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
    if (strtof(buf, NULL) == f) break;
  }
  return strtod(buf, NULL);
}

/* architectures[0] and model_type of each family */
static const char *const arch_names[][2] = {
    [LH_ARCH_LLAMA] = {"LlamaForCausalLM", "llama"},
    [LH_ARCH_QWEN2] = {"Qwen2ForCausalLM", "qwen2"},
    [LH_ARCH_QWEN3] = {"Qwen3ForCausalLM", "qwen3"},
};

/* c as a config.json object (NULL when out of memory); c must be valid. */
static json_t *config_to_json(const lh_config *c, const char *torch_dtype) {
  int qwen = c->arch != LH_ARCH_LLAMA;
  json_t *root = json_object();
  if (!root) return NULL;
  int bad = 0;
  bad |= json_object_set_new(root, "architectures", json_pack("[s]", arch_names[c->arch][0]));
  bad |= json_object_set_new(root, "model_type", json_string(arch_names[c->arch][1]));
  bad |= json_object_set_new(root, "vocab_size", json_integer(c->vocab_size));
  bad |= json_object_set_new(root, "hidden_size", json_integer(c->hidden_size));
  bad |= json_object_set_new(root, "intermediate_size", json_integer(c->intermediate_size));
  bad |= json_object_set_new(root, "num_hidden_layers", json_integer(c->n_layers));
  bad |= json_object_set_new(root, "num_attention_heads", json_integer(c->n_heads));
  bad |= json_object_set_new(root, "num_key_value_heads", json_integer(c->n_kv_heads));
  bad |= json_object_set_new(root, "head_dim", json_integer(c->head_dim));
  bad |= json_object_set_new(root, "max_position_embeddings", json_integer(c->max_positions));
  bad |= json_object_set_new(root, "rope_theta", json_real(float_to_short_double(c->rope_theta)));
  bad |= json_object_set_new(root, "rms_norm_eps", json_real(float_to_short_double(c->rms_eps)));
  bad |= json_object_set_new(root, "tie_word_embeddings", json_boolean(c->tie_embeddings));
  if (c->arch != LH_ARCH_QWEN2)
    bad |= json_object_set_new(root, "attention_bias", json_boolean(c->qkv_bias));
  if (qwen) bad |= json_object_set_new(root, "use_sliding_window", json_false());
  bad |= json_object_set_new(root, "bos_token_id",
                             c->bos_token_id >= 0 ? json_integer(c->bos_token_id) : json_null());
  /* one id as an integer, several as a list (as transformers writes them) */
  json_t *eos = c->eos_token_id >= 0 ? json_integer(c->eos_token_id) : json_null();
  if (c->n_eos > 1) {
    json_decref(eos);
    eos = json_array();
    for (int i = 0; i < c->n_eos; i++)
      bad |= json_array_append_new(eos, json_integer(c->eos_ids[i]));
  }
  bad |= json_object_set_new(root, "eos_token_id", eos);
  bad |= json_object_set_new(root, "hidden_act", json_string("silu"));
  json_t *scaling = json_null();
  if (c->rope_scaling == LH_ROPE_LLAMA3)
    scaling = json_pack(
        "{s:f, s:f, s:f, s:i, s:s}", "factor", float_to_short_double(c->rope_factor),
        "low_freq_factor", float_to_short_double(c->rope_low_freq_factor), "high_freq_factor",
        float_to_short_double(c->rope_high_freq_factor), "original_max_position_embeddings",
        c->rope_original_max_positions, "rope_type", "llama3");
  bad |= json_object_set_new(root, "rope_scaling", scaling);
  bad |= json_object_set_new(root, "torch_dtype", json_string(torch_dtype));
  bad |= json_object_set_new(root, "use_cache", json_true());
  if (bad) {
    json_decref(root);
    return NULL;
  }
  return root;
}

lh_err lh__config_save_dtype(const char *path, const lh_config *c, const char *torch_dtype) {
  if (!path || !c) return lh_errorf(LH_ERR_INVAL, "lh_config_save: NULL argument");
  lh_err e = lh_config_validate(c);
  if (e) return e;
  json_t *root = config_to_json(c, torch_dtype);
  char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) : NULL;
  json_decref(root);
  if (!text) return lh_errorf(LH_ERR_NOMEM, "%s: out of memory while writing JSON", path);
  size_t n = strlen(text);
  char *withnl = realloc(text, n + 2);
  if (!withnl) {
    free(text);
    return lh_errorf(LH_ERR_NOMEM, "%s: out of memory", path);
  }
  withnl[n] = '\n';
  withnl[n + 1] = '\0';
  e = lh_file_write_atomic(path, withnl, n + 1);
  free(withnl);
  return e;
}

lh_err lh_config_save(const char *path, const lh_config *c) {
  return lh__config_save_dtype(path, c, "float32");
}

/* ---------------------------------------------------------------- overrides */

/* The keys lh_config_parse reads, then keys of Hugging Face config.json files that do not change
 * the model longhaul builds. An override file may hold only these, so a misspelt key is an
 * error rather than silently ignored. */
static const char *const override_keys[] = {
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "max_position_embeddings", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
    "attention_bias", "bos_token_id", "eos_token_id", "rope_scaling", "rope_parameters",
    "partial_rotary_factor", "hidden_act", "use_sliding_window", "mlp_bias", NULL,
    /* inert */
    "torch_dtype", "dtype", "transformers_version", "use_cache", "initializer_range",
    "attention_dropout", "sliding_window", "max_window_layers", "pretraining_tp", "layer_types",
    "pad_token_id", NULL};

static bool override_key_known(const char *key) {
  for (int i = 0, nulls = 0; nulls < 2; i++)
    if (!override_keys[i])
      nulls++;
    else if (!strcmp(override_keys[i], key))
      return true;
  return false;
}

lh_err lh_config_override(const char *json, size_t len, const char *what, lh_config *c) {
  if (!what) what = "config override";
  if (!c) return lh_errorf(LH_ERR_INVAL, "%s: NULL argument", what);
  lh_err e = lh_config_validate(c);
  if (e) return e;
  json_t *over = NULL, *root = NULL;
  char *text = NULL;
  if ((e = parse_object(json, len, what, &over))) return e;
  const char *key;
  json_t *v;
  json_object_foreach(over, key, v) {
    if (override_key_known(key)) continue;
    char known[1024] = "";
    for (int i = 0; override_keys[i]; i++)
      snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
               override_keys[i]);
    e = lh_errorf(LH_ERR_FORMAT, "%s: unknown key \"%.100s\" (known: %s)", what, key, known);
    goto out;
  }
  if (!(root = config_to_json(c, "float32"))) {
    e = lh_errorf(LH_ERR_NOMEM, "%s: out of memory", what);
    goto out;
  }
  /* As in Hugging Face, head_dim follows hidden_size / num_attention_heads unless given. */
  if ((json_object_get(over, "hidden_size") || json_object_get(over, "num_attention_heads")) &&
      !json_object_get(over, "head_dim"))
    json_object_del(root, "head_dim");
  /* a family named in the file is checked against c's below: c's architectures, which
   * lh_config_parse reads before model_type, must not hide the file's model_type */
  if (json_object_get(over, "model_type") && !json_object_get(over, "architectures"))
    json_object_del(root, "architectures");
  /* c's config.json is written as transformers 4 writes it; a file in version 5's form replaces
   * both of its RoPE keys */
  if (json_object_get(over, "rope_parameters")) {
    json_object_del(root, "rope_theta");
    json_object_del(root, "rope_scaling");
  }
  lh_config out;
  if (json_object_update(root, over) || !(text = json_dumps(root, JSON_COMPACT))) {
    e = lh_errorf(LH_ERR_NOMEM, "%s: out of memory", what);
    goto out;
  }
  if ((e = lh_config_parse(text, strlen(text), what, &out))) goto out;
  if (out.arch != c->arch) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: architectures/model_type name %s, not %s", what,
                  arch_names[out.arch][0], arch_names[c->arch][0]);
    goto out;
  }
  *c = out;
out:
  free(text);
  json_decref(root);
  json_decref(over);
  return e;
}

/* ---------------------------------------------------------------- generation_config.json */

lh_err lh_config_parse_generation(const char *json, size_t len, const char *what, lh_config *c) {
  if (!what) what = "generation_config.json";
  if (!c) return lh_errorf(LH_ERR_INVAL, "%s: NULL argument", what);
  json_t *root = NULL;
  lh_err e = parse_object(json, len, what, &root);
  if (e) return e;
  lh_config g = *c;
  /* absent or null: config.json's list stands */
  const json_t *v = json_object_get(root, "eos_token_id");
  if (!v || json_is_null(v)) goto out;
  if ((e = get_eos(root, what, &g))) goto out;
  for (int i = 0; i < g.n_eos; i++)
    if (g.eos_ids[i] >= g.vocab_size) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: field eos_token_id: %d is outside the vocabulary (%d)",
                    what, g.eos_ids[i], g.vocab_size);
      goto out;
    }
  *c = g;
out:
  json_decref(root);
  return e;
}
