/* `longhaul init-model`: writes a randomly initialised Qwen2/Qwen3/Llama model directory
 * (config.json + model.safetensors, and tokenizer.json with --tokenizer) from a preset, or from
 * the "tiny" preset overridden by the keys of a config.json-style file. The same flags always
 * produce the same bytes. */
#include <jansson.h>
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
    {"tokenizer", "chars|FILE", false,
     "also write DIR/tokenizer.json; vocab_size becomes its size (a --preset file's larger "
     "vocab_size is kept)"},
};

/* The "tiny" preset of cfg->arch overridden by the keys of the JSON file at path
 * (lh_config_override); *set_vocab tells whether the file gave vocab_size. */
static int apply_file(const char *path, lh_config *cfg, bool *set_vocab) {
  char *text = NULL;
  size_t len = 0;
  if (lh_file_read(path, MAX_OVERRIDE_BYTES, &text, &len) != LH_ERR_OK ||
      lh_config_override(text, len, path, cfg) != LH_ERR_OK) {
    free(text);
    return lh__cli_fail(CMD);
  }
  json_t *root = json_loadb(text, len, 0, NULL); /* parsed once already: only for the key */
  *set_vocab = json_object_get(root, "vocab_size") != NULL;
  json_decref(root);
  free(text);
  return LH__ARGS_CONTINUE;
}

/* --tokenizer: reads the built-in character tokenizer or FILE (which must load), sets
 * cfg->vocab_size to its size (*n) and, for chars, the bos/eos ids. *json gets the bytes to
 * write. */
static int use_tokenizer(const char *spec, lh_config *cfg, char **json, size_t *len, int *n) {
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
  *n = lh_tokenizer_vocab_size(t);
  lh_tokenizer_free(t);
  cfg->vocab_size = *n;
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
                         "to its size\n(a --preset file's larger vocab_size is kept: padded "
                         "embeddings, as in Qwen).",
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
  /* the tokenizer sizes the vocabulary before a preset file's ids are checked against it; the
   * file's own vocab_size may pad it (embedding rows past the tokenizer, as in Qwen) */
  const char *tok_spec = lh__args_str(&a, "tokenizer", NULL);
  char *tok_json = NULL;
  size_t tok_len = 0;
  int tok_n = 0;
  if (tok_spec &&
      (rc = use_tokenizer(tok_spec, &cfg, &tok_json, &tok_len, &tok_n)) != LH__ARGS_CONTINUE)
    return rc;
  lh_config before_file = cfg;
  bool file_set_vocab = false;
  if (from_file && (rc = apply_file(preset, &cfg, &file_set_vocab)) != LH__ARGS_CONTINUE) {
    free(tok_json);
    return rc;
  }
  if (tok_spec && file_set_vocab && cfg.vocab_size < tok_n) {
    free(tok_json);
    return lh__cli_error(CMD, LH__EXIT_FAIL,
                         "--preset sets vocab_size %d, smaller than the %d ids of --tokenizer %s",
                         cfg.vocab_size, tok_n, tok_spec);
  }
  if (tok_spec && !strcmp(tok_spec, "chars")) { /* its ids stand, whatever the file says */
    cfg.bos_token_id = before_file.bos_token_id;
    cfg.eos_token_id = before_file.eos_token_id;
    cfg.n_eos = before_file.n_eos;
    memcpy(cfg.eos_ids, before_file.eos_ids, sizeof cfg.eos_ids);
  }
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
  /* the model directory writer owns tokenizer.json and generation_config.json: one left from an
   * earlier run would not match the model, or replace the eos ids just written */
  char *tok_path = lh_path_join(out_dir, "tokenizer.json"),
       *gen_path = lh_path_join(out_dir, "generation_config.json");
  bool had_tok = !tok_json && access(tok_path, F_OK) == 0, had_gen = access(gen_path, F_OK) == 0;
  lh_model_files files = {tok_json, tok_len, NULL, 0};
  lh_err e = lh_model_dir_save(m, out_dir, dtype, &files);
  free(tok_json);
  if (e) {
    free(tok_path);
    free(gen_path);
    lh_model_free(m);
    return lh__cli_fail(CMD);
  }
  if (had_tok)
    fprintf(stderr, "longhaul %s: removed %s from an earlier run (no --tokenizer)\n", CMD,
            tok_path);
  if (had_gen) fprintf(stderr, "longhaul %s: removed %s from an earlier run\n", CMD, gen_path);
  free(tok_path);
  free(gen_path);
  fprintf(stderr, "longhaul %s: %s, %.2fM parameters (%s), seed %llu, wrote %s\n", CMD,
          arch_names[arch_i], (double)m->n_params / 1e6, dtype_names[dtype_i],
          (unsigned long long)seed, out_dir);
  lh_model_free(m);
  return LH__EXIT_OK;
}
