/* `longhaul init-model`: writes a randomly initialised Qwen2/Qwen3/Llama model directory
 * (config.json + model.safetensors, and tokenizer.json with --tokenizer) from a preset, or from
 * the "tiny" preset overridden by the keys of a config.json-style file. The same flags always
 * produce the same bytes. */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "longhaul/model.h"
#include "longhaul/tokenizer.h"

#define CMD                "init-model"
#define MAX_OVERRIDE_BYTES (1u << 20)

static const lh__flag flags[] = {
    {"arch", "qwen2|qwen3|llama", true, "model family"},
    {"preset", "tiny|small|FILE.json", true, "preset, or a config.json overriding the tiny one"},
    {"seed", "N", true, "random seed for the initial weights"},
    {"out", "DIR", true, "model directory to write (created if missing)"},
    {"dtype", "f32|bf16", false, "dtype of model.safetensors (default f32)"},
    {"tokenizer", "chars|FILE", false, "also write DIR/tokenizer.json; vocab_size follows it"},
};

/* config.json keys that map onto an int field of lh_config (positive values). */
static const struct {
  const char *key;
  size_t offset;
} int_keys[] = {
    {"vocab_size", offsetof(lh_config, vocab_size)},
    {"hidden_size", offsetof(lh_config, hidden_size)},
    {"intermediate_size", offsetof(lh_config, intermediate_size)},
    {"num_hidden_layers", offsetof(lh_config, n_layers)},
    {"num_attention_heads", offsetof(lh_config, n_heads)},
    {"num_key_value_heads", offsetof(lh_config, n_kv_heads)},
    {"head_dim", offsetof(lh_config, head_dim)},
    {"max_position_embeddings", offsetof(lh_config, max_positions)},
};

/* Keys of Hugging Face config.json files that do not change the model longhaul builds. */
static const char *const inert_keys[] = {
    "torch_dtype",       "transformers_version", "use_cache",
    "initializer_range", "attention_dropout",    "sliding_window",
    "max_window_layers", "pretraining_tp",       NULL,
};

static bool in_list(const char *const *list, const char *s) {
  for (int i = 0; list[i]; i++)
    if (!strcmp(list[i], s)) return true;
  return false;
}

static int bad_key(const char *path, const char *key, const char *want, const json_t *v) {
  char *got = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
  int rc = lh__cli_error(CMD, LH__EXIT_FAIL, "%s: %s: expected %s, got %s", path, key, want,
                         got ? got : lh_json_type_name(v));
  free(got);
  return rc;
}

/* Applies one key of the override file to cfg; returns LH__ARGS_CONTINUE or an exit code. */
static int apply_key(const char *path, const char *key, const json_t *v, lh_config *cfg) {
  bool qwen2 = cfg->arch == LH_ARCH_QWEN2;
  static const char *const hf_names[][2] = {[LH_ARCH_LLAMA] = {"llama", "LlamaForCausalLM"},
                                            [LH_ARCH_QWEN2] = {"qwen2", "Qwen2ForCausalLM"},
                                            [LH_ARCH_QWEN3] = {"qwen3", "Qwen3ForCausalLM"}};
  for (size_t i = 0; i < sizeof int_keys / sizeof int_keys[0]; i++) {
    if (strcmp(key, int_keys[i].key)) continue;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT_MAX)
      return bad_key(path, key, "a positive integer", v);
    *(int *)((char *)cfg + int_keys[i].offset) = (int)json_integer_value(v);
    return LH__ARGS_CONTINUE;
  }
  if (!strcmp(key, "rope_theta") || !strcmp(key, "rms_norm_eps")) {
    double x = json_is_number(v) ? json_number_value(v) : -1.0;
    if (!(x > 0.0) || !isfinite(x)) return bad_key(path, key, "a positive number", v);
    if (!strcmp(key, "rope_theta"))
      cfg->rope_theta = (float)x;
    else
      cfg->rms_eps = (float)x;
    return LH__ARGS_CONTINUE;
  }
  if (!strcmp(key, "tie_word_embeddings")) {
    if (!json_is_boolean(v)) return bad_key(path, key, "true or false", v);
    cfg->tie_embeddings = json_is_true(v);
    return LH__ARGS_CONTINUE;
  }
  if (!strcmp(key, "attention_bias")) {
    if (!json_is_boolean(v)) return bad_key(path, key, "true or false", v);
    if (qwen2 && !json_is_true(v))
      return bad_key(path, key, "true (qwen2 always has q/k/v biases)", v);
    cfg->qkv_bias = qwen2 || json_is_true(v);
    cfg->o_bias = !qwen2 && json_is_true(v); /* Llama and Qwen3: o_proj too */
    return LH__ARGS_CONTINUE;
  }
  if (!strcmp(key, "bos_token_id") || !strcmp(key, "eos_token_id")) {
    int id = -1;
    if (!json_is_null(v)) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
        return bad_key(path, key, "a token id or null", v);
      id = (int)json_integer_value(v);
    }
    if (key[0] == 'b') {
      cfg->bos_token_id = id;
    } else {
      cfg->eos_token_id = cfg->eos_ids[0] = id;
      cfg->n_eos = id >= 0;
    }
    return LH__ARGS_CONTINUE;
  }
  if (!strcmp(key, "model_type")) {
    const char *want = hf_names[cfg->arch][0];
    if (!json_is_string(v) || strcmp(json_string_value(v), want)) {
      char what[64];
      snprintf(what, sizeof what, "\"%s\" (as --arch says)", want);
      return bad_key(path, key, what, v);
    }
    return LH__ARGS_CONTINUE;
  }
  if (!strcmp(key, "architectures")) {
    const char *want = hf_names[cfg->arch][1];
    if (!json_is_array(v) || json_array_size(v) != 1 || !json_is_string(json_array_get(v, 0)) ||
        strcmp(json_string_value(json_array_get(v, 0)), want)) {
      char what[64];
      snprintf(what, sizeof what, "[\"%s\"] (as --arch says)", want);
      return bad_key(path, key, what, v);
    }
    return LH__ARGS_CONTINUE;
  }
  if (!strcmp(key, "hidden_act")) {
    if (!json_is_string(v) || strcmp(json_string_value(v), "silu"))
      return bad_key(path, key, "\"silu\"", v);
    return LH__ARGS_CONTINUE;
  }
  if (!strcmp(key, "rope_scaling")) {
    cfg->rope_scaling = LH_ROPE_DEFAULT;
    if (json_is_null(v)) return LH__ARGS_CONTINUE;
    const json_t *type = json_object_get(v, "rope_type");
    if (!type) type = json_object_get(v, "type");
    const json_t *f = json_object_get(v, "factor"), *lo = json_object_get(v, "low_freq_factor");
    const json_t *hi = json_object_get(v, "high_freq_factor");
    const json_t *orig = json_object_get(v, "original_max_position_embeddings");
    if (!json_is_string(type) || strcmp(json_string_value(type), "llama3") || !json_is_number(f) ||
        !json_is_number(lo) || !json_is_number(hi) || !json_is_integer(orig) ||
        json_integer_value(orig) < 1 || json_integer_value(orig) > INT_MAX)
      return bad_key(path, key,
                     "null or {\"rope_type\": \"llama3\", \"factor\", \"low_freq_factor\", "
                     "\"high_freq_factor\", \"original_max_position_embeddings\"}",
                     v);
    cfg->rope_scaling = LH_ROPE_LLAMA3;
    cfg->rope_factor = (float)json_number_value(f);
    cfg->rope_low_freq_factor = (float)json_number_value(lo);
    cfg->rope_high_freq_factor = (float)json_number_value(hi);
    cfg->rope_original_max_positions = (int)json_integer_value(orig);
    return LH__ARGS_CONTINUE;
  }
  if (!strcmp(key, "use_sliding_window") || !strcmp(key, "mlp_bias")) {
    if (!json_is_false(v)) return bad_key(path, key, "false (not supported)", v);
    return LH__ARGS_CONTINUE;
  }
  if (in_list(inert_keys, key)) return LH__ARGS_CONTINUE;
  return lh__cli_error(CMD, LH__EXIT_FAIL,
                       "%s: unknown key \"%s\" (known: vocab_size, hidden_size, "
                       "intermediate_size, num_hidden_layers, num_attention_heads, "
                       "num_key_value_heads, head_dim, max_position_embeddings, rope_theta, "
                       "rms_norm_eps, tie_word_embeddings, attention_bias, bos_token_id, "
                       "eos_token_id)",
                       path, key);
}

/* The "tiny" preset of cfg->arch overridden by the keys present in the JSON file at path;
 * *set_vocab tells whether the file gave vocab_size. */
static int apply_file(const char *path, lh_config *cfg, bool *set_vocab) {
  char *text = NULL;
  size_t len = 0;
  if (lh_file_read(path, MAX_OVERRIDE_BYTES, &text, &len) != LH_ERR_OK) return lh__cli_fail(CMD);
  json_error_t jerr;
  json_t *root = json_loadb(text, len, 0, &jerr);
  free(text);
  if (!root)
    return lh__cli_error(CMD, LH__EXIT_FAIL, "%s:%d:%d: invalid JSON: %s", path, jerr.line,
                         jerr.column, jerr.text);
  int rc = LH__ARGS_CONTINUE;
  if (!json_is_object(root)) {
    rc = lh__cli_error(CMD, LH__EXIT_FAIL, "%s: expected a JSON object, got %s", path,
                       lh_json_type_name(root));
    goto out;
  }
  const char *key;
  json_t *v;
  *set_vocab = json_object_get(root, "vocab_size") != NULL;
  json_object_foreach(root, key, v) {
    rc = apply_key(path, key, v, cfg);
    if (rc != LH__ARGS_CONTINUE) goto out;
  }
  /* As in Hugging Face, head_dim follows hidden_size / num_attention_heads unless given. */
  bool shape_changed =
      json_object_get(root, "hidden_size") || json_object_get(root, "num_attention_heads");
  if (shape_changed && !json_object_get(root, "head_dim")) {
    if (cfg->hidden_size % cfg->n_heads != 0) {
      rc = lh__cli_error(CMD, LH__EXIT_FAIL,
                         "%s: hidden_size %d is not a multiple of num_attention_heads %d; "
                         "give head_dim",
                         path, cfg->hidden_size, cfg->n_heads);
      goto out;
    }
    cfg->head_dim = cfg->hidden_size / cfg->n_heads;
  }
out:
  json_decref(root);
  return rc;
}

/* --tokenizer: reads the built-in character tokenizer or FILE (which must load), sets
 * cfg->vocab_size to its size (a preset file's larger vocab_size is kept: padded embeddings,
 * as in Qwen) and, for chars, the bos/eos ids. *json gets the bytes to write. */
static int use_tokenizer(const char *spec, bool file_set_vocab, lh_config *cfg, char **json,
                         size_t *len) {
  bool chars = !strcmp(spec, "chars");
  lh_tokenizer *t = NULL;
  if (chars) {
    *json = lh_tokenizer_chars_json();
    *len = strlen(*json);
  } else if (lh_file_read(spec, LH_TOKENIZER_MAX_FILE, json, len) != LH_ERR_OK) {
    return lh__cli_fail(CMD);
  }
  if (lh_tokenizer_parse(*json, *len, chars ? "chars tokenizer" : spec, &t) != LH_ERR_OK) {
    free(*json);
    *json = NULL;
    return lh__cli_fail(CMD);
  }
  int n = lh_tokenizer_vocab_size(t);
  lh_tokenizer_free(t);
  if (file_set_vocab && cfg->vocab_size < n) {
    free(*json);
    *json = NULL;
    return lh__cli_error(CMD, LH__EXIT_FAIL,
                         "--preset sets vocab_size %d, smaller than the %d ids of --tokenizer %s",
                         cfg->vocab_size, n, spec);
  }
  if (!file_set_vocab) cfg->vocab_size = n;
  if (chars) { /* <|bos|> = 1, <|eos|> = 2 (see lh_tokenizer_chars_json) */
    cfg->bos_token_id = 1;
    cfg->eos_token_id = cfg->eos_ids[0] = 2;
    cfg->n_eos = 1;
  }
  return LH__ARGS_CONTINUE;
}

static bool is_file_preset(const char *preset) {
  size_t n = strlen(preset);
  struct stat st;
  return (n > 5 && !strcmp(preset + n - 5, ".json")) ||
         (stat(preset, &st) == 0 && S_ISREG(st.st_mode));
}

int lh__cmd_init_model(int argc, char **argv) {
  lh__args a = {.cmd = CMD,
                .about = "Creates a randomly initialised Qwen2-, Qwen3- or Llama-family model and "
                         "writes it as a Hugging Face\ndirectory: DIR/config.json and "
                         "DIR/model.safetensors. The same flags give the same bytes.\n"
                         "--tokenizer chars writes the built-in character tokenizer (99 ids: "
                         "<|pad|> 0, <|bos|> 1,\n<|eos|> 2, printable ASCII, \\n) as "
                         "DIR/tokenizer.json and sets vocab_size 99, bos 1, eos 2;\n"
                         "--tokenizer FILE copies a tokenizer.json that loads and sets vocab_size "
                         "to its size.",
                .flags = flags,
                .n_flags = (int)(sizeof flags / sizeof flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;

  static const char *const arch_names[] = {"qwen2", "qwen3", "llama", NULL};
  static const char *const dtype_names[] = {"f32", "bf16", NULL};
  int arch_i = 0, dtype_i = 0;
  uint64_t seed = 0;
  if ((rc = lh__args_choice(&a, "arch", arch_names, 0, &arch_i)) != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_u64(&a, "seed", LH__SEED_MAX, 0, &seed)) != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_choice(&a, "dtype", dtype_names, 0, &dtype_i)) != LH__ARGS_CONTINUE) return rc;
  const char *preset = lh__args_str(&a, "preset", NULL);
  const char *out_dir = lh__args_str(&a, "out", NULL);
  static const lh_arch archs[] = {LH_ARCH_QWEN2, LH_ARCH_QWEN3, LH_ARCH_LLAMA};
  lh_arch arch = archs[arch_i];
  lh_save_dtype dtype = dtype_i == 0 ? LH_SAVE_F32 : LH_SAVE_BF16;

  bool from_file = strcmp(preset, "tiny") && strcmp(preset, "small");
  if (from_file && !is_file_preset(preset))
    return lh__cli_error(CMD, LH__EXIT_USAGE,
                         "--preset: expected tiny, small or a FILE.json, got \"%s\"", preset);
  lh_config cfg;
  if (lh_config_preset(from_file ? "tiny" : preset, arch, &cfg) != LH_ERR_OK)
    return lh__cli_fail(CMD);
  bool file_set_vocab = false;
  if (from_file && (rc = apply_file(preset, &cfg, &file_set_vocab)) != LH__ARGS_CONTINUE) return rc;
  const char *tok_spec = lh__args_str(&a, "tokenizer", NULL);
  char *tok_json = NULL;
  size_t tok_len = 0;
  if (tok_spec && (rc = use_tokenizer(tok_spec, file_set_vocab, &cfg, &tok_json, &tok_len)) !=
                      LH__ARGS_CONTINUE)
    return rc;
  if (lh_config_validate(&cfg) != LH_ERR_OK) {
    free(tok_json);
    return lh__cli_fail(CMD);
  }

  lh_model *m = NULL;
  if (lh_model_create(&cfg, &m) != LH_ERR_OK) {
    free(tok_json);
    return lh__cli_fail(CMD);
  }
  lh_model_init_random(m, seed);
  char tok_path[4096];
  snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", out_dir);
  if (lh_model_save(m, out_dir, dtype) != LH_ERR_OK ||
      (tok_json && lh_file_write_atomic(tok_path, tok_json, tok_len) != LH_ERR_OK)) {
    rc = lh__cli_fail(CMD);
    free(tok_json);
    lh_model_free(m);
    return rc;
  }
  free(tok_json);
  /* without --tokenizer, a tokenizer.json left from an earlier run would not match the model */
  if (!tok_spec && unlink(tok_path) == 0)
    fprintf(stderr, "longhaul %s: removed %s from an earlier run (no --tokenizer)\n", CMD,
            tok_path);
  fprintf(stderr, "longhaul %s: %s, %.2fM parameters (%s), seed %llu, wrote %s\n", CMD,
          arch_names[arch_i], (double)m->n_params / 1e6, dtype_names[dtype_i],
          (unsigned long long)seed, out_dir);
  lh_model_free(m);
  return LH__EXIT_OK;
}
