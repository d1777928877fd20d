/* The Hugging Face export: the model module's directory writer (bf16 weights, sharded past a
 * size) plus the files loaders look for next to them, tokenizer_config.json (special tokens,
 * added tokens, chat template) and generation_config.json. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "export_impl.h"
#include "longhaul/export.h"

/* The files this writes; one that OUT holds is replaced only with force. */
static const char *const written[] = {"config.json",
                                      "generation_config.json",
                                      "model.safetensors",
                                      "model.safetensors.index.json",
                                      "tokenizer.json",
                                      "tokenizer_config.json",
                                      NULL};

static json_t *token_or_null(const lh_tokenizer *t, int id) {
  const char *s = id >= 0 ? lh_tokenizer_token(t, id) : NULL;
  return s ? json_string(s) : json_null();
}

static lh_err write_json(const char *dir, const char *name, json_t *root) {
  char *text = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
  json_decref(root);
  if (!text) return lh_errorf(LH_ERR_NOMEM, "%s/%s: cannot encode the JSON", dir, name);
  size_t len = strlen(text);
  text = lh_xrealloc(text, len + 2);
  text[len] = '\n';
  char *p = lh_path_join(dir, name);
  lh_err e = lh_file_write_atomic(p, text, len + 1);
  free(p);
  free(text);
  return e;
}

/* tokenizer_config.json: what transformers' AutoTokenizer and the chat tools read. */
static json_t *tokenizer_config(const lh_tokenizer *t, const lh_config *c) {
  static const char *const pads[] = {"<|pad|>", "<|endoftext|>", "<|finetune_right_pad_id|>"};
  int pad = -1;
  for (size_t i = 0; i < sizeof pads / sizeof pads[0] && pad < 0; i++)
    pad = lh_tokenizer_find(t, pads[i]);
  json_t *added = json_object();
  int n = lh_tokenizer_vocab_size(t);
  for (int id = 0; id < n; id++) {
    if (!lh_tokenizer_is_added(t, id)) continue;
    char key[16];
    snprintf(key, sizeof key, "%d", id);
    json_object_set_new(added, key,
                        json_pack("{s:s, s:b, s:b, s:b, s:b, s:b}", "content",
                                  lh_tokenizer_token(t, id), "lstrip", 0, "normalized", 0, "rstrip",
                                  0, "single_word", 0, "special", lh_tokenizer_is_special(t, id)));
  }
  json_t *o = json_pack("{s:b, s:b, s:o, s:o, s:o, s:o, s:b, s:I, s:s}", "add_bos_token", 0,
                        "add_eos_token", 0, "added_tokens_decoder", added, "bos_token",
                        token_or_null(t, c->bos_token_id), "eos_token",
                        token_or_null(t, c->eos_token_id), "pad_token", token_or_null(t, pad),
                        "clean_up_tokenization_spaces", 0, "model_max_length",
                        (json_int_t)c->max_positions, "tokenizer_class", "PreTrainedTokenizerFast");
  const char *chat = lh__export_chat_template(t);
  if (o && chat) json_object_set_new(o, "chat_template", json_string(chat));
  return o;
}

/* generation_config.json from config.json's ids, when the source has none. */
static json_t *generation_config(const lh_config *c) {
  json_t *o = json_object();
  if (c->bos_token_id >= 0) json_object_set_new(o, "bos_token_id", json_integer(c->bos_token_id));
  if (c->n_eos > 1) {
    json_t *a = json_array();
    for (int i = 0; i < c->n_eos; i++)
      json_array_append_new(a, json_integer(c->eos_ids[i]));
    json_object_set_new(o, "eos_token_id", a);
  } else if (c->eos_token_id >= 0) {
    json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_id));
  }
  return o;
}

lh_err lh_export_hf(const char *src, const char *out, size_t shard_bytes, bool force) {
  lh_err e = LH_ERR_OK;
  for (int i = 0; written[i] && !e; i++) {
    char *p = lh_path_join(out, written[i]);
    e = lh__export_refuse_existing(p, force);
    free(p);
  }
  if (e) return e;
  lh_tokenizer *tok = NULL;
  lh_model_files files = {0};
  lh_config cfg;
  uint16_t *slab = NULL;
  char *gen = NULL;
  if ((e = lh__export_tokenizer(src, &tok)) || (e = lh_model_files_read(src, &files)) ||
      (e = lh_model_load_bf16(src, &cfg, &slab)))
    goto out;
  if (!files.generation_config) {
    json_t *g = generation_config(&cfg);
    gen = json_dumps(g, JSON_INDENT(2));
    json_decref(g);
    files.generation_config = gen;
    files.generation_len = strlen(gen);
  }
  if ((e = lh_model_dir_save_bf16_shards(&cfg, slab, out, &files,
                                         shard_bytes ? shard_bytes : LH_EXPORT_SHARD_BYTES)))
    goto out;
  e = write_json(out, "tokenizer_config.json", tokenizer_config(tok, &cfg));
out:
  if (gen) files.generation_config = NULL;
  free(gen);
  lh_model_files_free(&files);
  free(slab);
  lh_tokenizer_free(tok);
  return e;
}
