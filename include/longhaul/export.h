/* longhaul export: what a finished run ships. The Hugging Face directory (bf16 weights, sharded
 * past a size, with the tokenizer and generation files a loader expects), the GGUF file that
 * llama.cpp and everything built on it runs (written to ggml's docs/gguf.md, version 3), and the
 * model card (README.md) with the run's recipe, provenance and evaluation. The HTML report of a
 * run lives here too (its own section below).
 *
 * Ownership: every _free accepts NULL; strings returned are malloc'd for the caller. Thread
 * safety: nothing here keeps global state; one object is used by one thread at a time. */
#ifndef LONGHAUL_EXPORT_H
#define LONGHAUL_EXPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"
#include "longhaul/model.h"

/* ================================================================ export and model card */

/* ---------------------------------------------------------------- GGUF files */

/* Tensor types of ggml (their numbers are the file's). */
typedef enum {
  LH_GGUF_F32 = 0,
  LH_GGUF_F16 = 1,
  LH_GGUF_Q8_0 = 8, /* blocks of 32 values: an fp16 scale d, then 32 int8 q; value = q * d */
  LH_GGUF_BF16 = 30,
} lh_gguf_type;

#define LH_GGUF_VERSION   3
#define LH_GGUF_ALIGNMENT 32 /* general.alignment, written explicitly */
#define LH_GGUF_QK8_0     32 /* values per Q8_0 block */

/* "f32", "f16", "bf16" or "q8_0" (LH_ERR_USAGE naming the choices otherwise). */
lh_err lh_gguf_type_parse(const char *s, lh_gguf_type *out);
const char *lh_gguf_type_name(lh_gguf_type t);

/* fp32 -> IEEE half, round to nearest even; a finite value past the half range is +-inf. */
uint16_t lh_gguf_f16_from_f32(float x);
float lh_gguf_f32_from_f16(uint16_t h);
/* Quantizes n values (a multiple of LH_GGUF_QK8_0) to Q8_0 blocks (34 bytes each) as ggml's
 * reference does: d = max|x| / 127, q = round-half-away(x / d) (x * (1/d) in fp32), d stored as
 * fp16. */
void lh_gguf_quantize_q8_0(const float *x, size_t n, uint8_t *out);

/* A GGUF file being built: metadata key/values, then tensors that point at fp32 data the caller
 * keeps alive until lh_gguf_write returns. Converted to each tensor's type while writing. */
typedef struct lh_gguf lh_gguf;
lh_gguf *lh_gguf_create(void);
void lh_gguf_free(lh_gguf *g);
/* Metadata. A key given twice, or an empty key or string that is not UTF-8 text, is
 * LH_ERR_INVAL naming the key. */
lh_err lh_gguf_set_str(lh_gguf *g, const char *key, const char *value);
lh_err lh_gguf_set_u32(lh_gguf *g, const char *key, uint32_t value);
lh_err lh_gguf_set_f32(lh_gguf *g, const char *key, float value);
lh_err lh_gguf_set_bool(lh_gguf *g, const char *key, bool value);
lh_err lh_gguf_set_str_array(lh_gguf *g, const char *key, const char *const *values, size_t n);
lh_err lh_gguf_set_i32_array(lh_gguf *g, const char *key, const int32_t *values, size_t n);
/* A tensor of ndim (1..4) dimensions in ggml order: ne[0] is the fastest-varying (a PyTorch
 * (rows, cols) matrix is ne = {cols, rows}). Q8_0 needs ne[0] % 32 == 0 (LH_ERR_INVAL
 * otherwise). Non-finite data, or an fp16 value or Q8_0 scale past the half range, is refused
 * when the file is written (LH_ERR_FORMAT naming the tensor and the element). */
lh_err lh_gguf_add_tensor(lh_gguf *g, const char *name, int ndim, const int64_t *ne,
                          lh_gguf_type type, const float *data);
/* Writes the file atomically (lh_file_out_*): header, metadata, tensor infos, aligned data. */
lh_err lh_gguf_write(const lh_gguf *g, const char *path);

/* ---------------------------------------------------------------- exporting a model */

/* Shards of the Hugging Face export hold at most this many bytes of weights each unless the
 * caller says otherwise (Hugging Face's save_pretrained uses 5 GB; this stays under the 4 GB
 * that 32-bit readers and some file systems still trip on). */
#define LH_EXPORT_SHARD_BYTES ((size_t)2 << 30)

/* Writes the Hugging Face directory OUT from the model directory SRC: model.safetensors in
 * bf16 (or model-0000k-of-0000n.safetensors with model.safetensors.index.json when the weights
 * pass shard_bytes; 0 takes LH_EXPORT_SHARD_BYTES), config.json, generation_config.json (SRC's,
 * else one from config.json's ids), tokenizer.json and tokenizer_config.json (the special tokens
 * and, for a chat tokenizer, a chat_template that loaders expect). SRC must hold a
 * tokenizer.json. Files OUT already holds are replaced only with `force` (LH_ERR_INVAL names the
 * first otherwise). */
lh_err lh_export_hf(const char *src, const char *out, size_t shard_bytes, bool force);

/* Writes SRC (a model directory with tokenizer.json) as one GGUF file at PATH with 2-D weights
 * in `type` (1-D norms, biases and rope_freqs stay F32, as llama.cpp's converter keeps them;
 * a Q8_0 matrix whose rows are not a multiple of 32 is written F16). `name` goes into
 * general.name. Refuses what llama.cpp cannot run (Qwen3 with attention biases, a tokenizer
 * with more ids than the model's vocabulary) with LH_ERR_UNSUPPORTED and the reason. */
lh_err lh_export_gguf(const char *src, const char *path, lh_gguf_type type, const char *name,
                      bool force);

/* ---------------------------------------------------------------- the model card */

/* What the card is made from. */
typedef struct lh_card_opts {
  const char *model_arg; /* what --model named: a run directory (RUN, RUN/latest, a checkpoint
                          * under RUN/checkpoints) gives the recipe and provenance */
  const char *model_dir; /* the model directory exported */
  const char *out_dir;   /* the export directory (named in "how to reproduce") */
  const char *eval_json; /* an `eval --json` file, or NULL */
  const char *eval_spec; /* or an environment to evaluate on here (greedy pass@1, test split,
                          * eval_n tasks) against the run's base model; NULL: neither */
  int eval_n;
  int argc; /* the export command line (argv[0] is "export"), for "how to reproduce" */
  char **argv;
} lh_card_opts;

typedef struct lh_card lh_card;
/* Reads everything the card says before anything is written: RUN/run.json (its base model,
 * environment and recipe), RUN/metrics.jsonl (updates and rollouts trained), for a serve run
 * RUN/ledger.db (workers, groups trained, rejections by reason, the last manifest hash) and the
 * trainer's public key, and the evaluation (the eval file, or the eval run now). Errors name the
 * file and the field ("RUN/run.json: field env: expected a string, found integer"). */
lh_err lh_card_gather(const lh_card_opts *o, lh_card **out);
/* The model's name for general.name and the card's title: the run directory's name, else the
 * model directory's. */
const char *lh_card_name(const lh_card *c);
/* Writes README.md (Hugging Face model-card front matter, then the sections) atomically;
 * gguf_file names the GGUF file beside it, or NULL. */
lh_err lh_card_write(const lh_card *c, const char *gguf_file, const char *path);
void lh_card_free(lh_card *c);
/* Reads the text of an `eval --json` file as the card does (every field it shows, of its type;
 * each interval lo <= mean <= hi; the JSON's cost bounded before parsing) and frees it: *rows
 * (may be NULL) is the table's row count (pass@k for each k, then the mean reward). Errors name
 * `what` and the field. For fuzzing and tools. */
lh_err lh_card_eval_check(const char *json, size_t len, const char *what, int *rows);

#endif
