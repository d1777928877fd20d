/* `longhaul export --model DIR|RUN --out DIR [--gguf TYPE] [--eval-json FILE | --eval SPEC]`:
 * the release of a model or a run's latest checkpoint: the Hugging Face directory, optionally a
 * GGUF file for llama.cpp, and the model card (README.md). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longhaul/export.h"

#define CMD "export"

static const lh__flag flags[] = {
    {"model", "DIR|RUN", true,
     "model directory (with tokenizer.json), or a run directory: its latest checkpoint"},
    {"out", "DIR", true, "export directory to write (created if missing)"},
    {"gguf", "TYPE", false,
     "also write OUT/model-TYPE.gguf for llama.cpp: f32, f16, bf16 or q8_0 (norms and biases "
     "stay f32)"},
    {"eval-json", "FILE", false,
     "the model card's evaluation: the JSON file `longhaul eval` writes (evaluated with a "
     "base to compare: the paired table)"},
    {"eval", "SPEC", false,
     "run the evaluation here: greedy pass@1 on the test split of SPEC, against the run's base "
     "model"},
    {"eval-n", "N", false, "tasks for --eval (default 200)"},
    {"shard-bytes", "N", false,
     "shard the safetensors past N bytes of weights (default 2147483648 = 2 GiB)"},
    {"force", NULL, false, "write into an --out directory that is not empty, replacing files"},
};

/* Whether dir exists and holds anything. */
static bool nonempty_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return false;
  struct dirent *ent;
  bool any = false;
  while (!any && (ent = readdir(d)))
    any = strcmp(ent->d_name, ".") && strcmp(ent->d_name, "..");
  closedir(d);
  return any;
}

int lh__cmd_export(int argc, char **argv) {
  lh__args a = {
      .cmd = CMD,
      .about = "Writes a release of a model: OUT holds the Hugging Face directory (bf16 "
               "model.safetensors, sharded\nwith model.safetensors.index.json past "
               "--shard-bytes; config.json, generation_config.json,\ntokenizer.json, "
               "tokenizer_config.json), with --gguf a GGUF file that llama.cpp runs\n"
               "(llama-cli -m OUT/model-q8_0.gguf), and the model card OUT/README.md: the base, "
               "the recipe\nfrom run.json, the training provenance (for serve runs from the "
               "ledger), the evaluation against\nthe base with 95% intervals, how to reproduce "
               "it, and the limitations.",
      .flags = flags,
      .n_flags = (int)(sizeof flags / sizeof flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  long eval_n;
  uint64_t shard;
  if ((rc = lh__args_int(&a, "eval-n", 1, 1 << 20, 200, &eval_n)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_u64(&a, "shard-bytes", UINT64_MAX, LH_EXPORT_SHARD_BYTES, &shard)) !=
          LH__ARGS_CONTINUE)
    return rc;
  if (shard == 0) return lh__cli_error(CMD, LH__EXIT_USAGE, "--shard-bytes must be at least 1");
  if (lh__args_has(&a, "eval") && lh__args_has(&a, "eval-json"))
    return lh__cli_error(CMD, LH__EXIT_USAGE, "give --eval-json FILE or --eval SPEC, not both");
  lh_gguf_type type = LH_GGUF_F32;
  const char *gguf = lh__args_str(&a, "gguf", NULL);
  if (gguf && lh_gguf_type_parse(gguf, &type)) return lh__cli_fail_err(CMD, LH_ERR_USAGE);
  const char *arg = lh__args_str(&a, "model", NULL), *out = lh__args_str(&a, "out", NULL);
  bool force = lh__args_has(&a, "force");
  if (!force && nonempty_dir(out))
    return lh__cli_error(CMD, LH__EXIT_FAIL,
                         "%s is not empty (pass --force to write into it, replacing files)", out);
  char *dir = lh__model_dir(CMD, arg);
  if (!dir) return LH__EXIT_FAIL;
  char gguf_name[64] = "";
  rc = LH__EXIT_FAIL;
  lh_card_opts co = {.model_arg = arg,
                     .model_dir = dir,
                     .out_dir = out,
                     .eval_json = lh__args_str(&a, "eval-json", NULL),
                     .eval_spec = lh__args_str(&a, "eval", NULL),
                     .eval_n = (int)eval_n,
                     .argc = argc,
                     .argv = argv};
  lh_card *card = NULL;
  /* the card's inputs first: a bad run.json, ledger or eval file fails before anything is
   * written */
  if (lh_card_gather(&co, &card)) goto fail;
  fprintf(stderr, "export: %s -> %s\n", dir, out);
  if (lh_export_hf(dir, out, (size_t)shard, true)) goto fail;
  printf("wrote %s (Hugging Face directory, bf16)\n", out);
  if (gguf) {
    snprintf(gguf_name, sizeof gguf_name, "model-%s.gguf", lh_gguf_type_name(type));
    char *path = lh_path_join(out, gguf_name);
    lh_err e = lh_export_gguf(dir, path, type, lh_card_name(card), true);
    if (!e) printf("wrote %s\n", path);
    free(path);
    if (e) goto fail;
  }
  char *readme = lh_path_join(out, "README.md");
  lh_err e = lh_card_write(card, gguf ? gguf_name : NULL, readme);
  if (!e) printf("wrote %s (model card)\n", readme);
  free(readme);
  if (e) goto fail;
  rc = lh__cli_flush_stdout(CMD);
  goto out;
fail:
  rc = lh__cli_fail(CMD);
out:
  lh_card_free(card);
  free(dir);
  return rc;
}
