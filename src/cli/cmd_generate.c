/* `longhaul generate`: sample completions of one prompt with the rollout engine (continuous
 * batching, verifiable sampler), as text or one JSON object per sample; and `longhaul bench
 * generate`: prefill and decode tokens per second on random prompts. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "longhaul/gen.h"
#include "longhaul/tensor.h"

#define CMD       "generate"
#define MAX_SLOTS 32

static const lh__flag flags[] = {
    {"model", "DIR", true,
     "model directory (config.json, model.safetensors, tokenizer.json), or a run directory: its "
     "latest checkpoint"},
    {"prompt", "TEXT", false, "prompt text (needs DIR/tokenizer.json)"},
    {"prompt-tokens", "IDS", false, "prompt as comma-separated token ids, e.g. 1,2,3"},
    {"max-new", "N", false, "tokens to generate at most per sample (default 64)"},
    {"temperature", "T", false, "sampling temperature; 0 = greedy (default 1)"},
    {"top-p", "P", false, "nucleus sampling threshold in (0, 1] (default 1 = off)"},
    {"top-k", "K", false, "keep the K most likely tokens (default 0 = off)"},
    {"min-p", "P", false, "keep tokens with p >= P * max p (default 0 = off)"},
    {"stop", "STR", false,
     "also stop a sample at the token that completes STR in its text; the token's bytes after STR "
     "stay (needs tokenizer.json)"},
    {"seed", "S", false, "sampling seed (default 0)"},
    {"n", "K", false, "number of samples of the prompt (default 1)"},
    {"threads", "K", false, "threads (default: all cores)"},
    {"json", NULL, false,
     "one JSON object per sample: tokens, logprobs, logprobs_model, text, finish"},
};

static lh_err load_tokenizer_if_present(const char *dir, lh_tokenizer **tok) {
  *tok = NULL;
  char *path = lh_path_join(dir, "tokenizer.json");
  struct stat sb;
  lh_err e = stat(path, &sb) == 0 ? lh_tokenizer_load(path, tok) : LH_ERR_OK;
  free(path);
  return e;
}

/* JSON has no NaN or infinity: such a value is written as null, so the array keeps one entry per
 * token (json_real refuses them, and the entry used to be dropped). */
static json_t *float_array(const float *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++)
    json_array_append_new(a, isfinite(v[i]) ? json_real(v[i]) : json_null());
  return a;
}

int lh__cmd_generate(int argc, char **argv) {
  lh__args a = {.cmd = CMD,
                .about = "Samples completions of a prompt with the rollout engine. Every token "
                         "is chosen by the verifiable sampler from (seed, sample index, "
                         "position). Stops at the model's eos token, after --max-new tokens, "
                         "or when the context is full.",
                .flags = flags,
                .n_flags = sizeof flags / sizeof flags[0]};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_model(&a, "model")) != LH__ARGS_CONTINUE) return rc;
  long max_new, top_k, n, threads;
  double temperature, top_p, min_p;
  uint64_t seed;
  if ((rc = lh__args_int(&a, "max-new", 1, 1 << 20, 64, &max_new)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "temperature", 0, 1e6, 1.0, &temperature)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "top-p", 1e-9, 1, 1.0, &top_p)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "top-k", 0, 1 << 30, 0, &top_k)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "min-p", 0, 0.999999, 0.0, &min_p)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_u64(&a, "seed", LH__SEED_MAX, 0, &seed)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "n", 1, 1 << 20, 1, &n)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "threads", 0, 1024, 0, &threads)) != LH__ARGS_CONTINUE)
    return rc;
  bool has_text = lh__args_has(&a, "prompt"), has_ids = lh__args_has(&a, "prompt-tokens");
  if (has_text == has_ids)
    return lh__cli_error(CMD, LH__EXIT_USAGE, "give exactly one of --prompt and --prompt-tokens");
  lh_set_threads((int)threads);
  const char *dir = lh__args_str(&a, "model", NULL);

  lh_infer *m = NULL;
  lh_tokenizer *tok = NULL;
  lh_generator *g = NULL;
  int32_t *prompt = NULL, *tokens = NULL;
  float *lps = NULL, *lpm = NULL;
  lh_gen_request *reqs = NULL;
  lh_gen_output *outs = NULL;
  int np = 0;
  rc = LH__EXIT_FAIL;
  if (lh_infer_load(dir, &m) || load_tokenizer_if_present(dir, &tok)) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  const lh_config *c = lh_infer_config(m);
  if (has_text) {
    if (!tok) {
      rc = lh__cli_error(CMD, LH__EXIT_FAIL, "%s has no tokenizer.json: use --prompt-tokens", dir);
      goto out;
    }
    const char *text = lh__args_str(&a, "prompt", "");
    size_t cnt = 0;
    if (lh_tokenizer_encode(tok, text, strlen(text), true, &prompt, &cnt)) {
      rc = lh__cli_fail(CMD);
      goto out;
    }
    np = (int)cnt;
  } else {
    size_t cnt = 0;
    const char *ids = lh__args_str(&a, "prompt-tokens", "");
    rc = lh__parse_ids(CMD, "prompt-tokens", ids, &prompt, &cnt);
    if (rc != LH__ARGS_CONTINUE) goto out;
    if (cnt == 0) { /* "[]": an empty prompt on the command line, as --prompt "" */
      rc =
          lh__cli_error(CMD, LH__EXIT_USAGE,
                        "--prompt-tokens: empty list \"%s\" (expected at least one token id)", ids);
      goto out;
    }
    np = (int)cnt;
  }
  if (np < 1) { /* a --prompt text that encodes to no token */
    rc = lh__cli_error(CMD, LH__EXIT_FAIL, "the prompt is empty");
    goto out;
  }
  if (np >= c->max_positions) {
    rc = lh__cli_error(CMD, LH__EXIT_FAIL,
                       "the prompt has %d tokens; the model's context is %d tokens, so no room is "
                       "left to generate",
                       np, c->max_positions);
    goto out;
  }
  int max_seq = np + (int)max_new < c->max_positions ? np + (int)max_new : c->max_positions;
  int slots = n < MAX_SLOTS ? (int)n : MAX_SLOTS;
  if (lh_generator_create(m, slots, max_seq, 0, &g)) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  lh_gen_config cfg = lh_gen_defaults();
  cfg.sample.temperature = (float)temperature;
  cfg.sample.top_p = (float)top_p;
  cfg.sample.top_k = (int)top_k;
  cfg.sample.min_p = (float)min_p;
  cfg.seed = seed;
  cfg.max_new = (int)max_new;
  if (lh__args_has(&a, "stop")) {
    if (!tok) {
      rc = lh__cli_error(CMD, LH__EXIT_FAIL, "--stop needs %s/tokenizer.json", dir);
      goto out;
    }
    cfg.stop[0] = lh__args_str(&a, "stop", "");
    cfg.n_stop = 1;
    cfg.tok = tok;
  }
  /* a sample holds at most max_new tokens and at most what the context leaves */
  size_t per = (size_t)(max_seq - np) < (size_t)max_new ? (size_t)(max_seq - np) : (size_t)max_new;
  size_t bytes = lh_size_mul((size_t)n, per * 4); /* int32 tokens, float log-probs */
  reqs = lh_xcalloc((size_t)n, sizeof *reqs);
  outs = lh_xcalloc((size_t)n, sizeof *outs);
  if (!(tokens = lh_try_malloc_aligned(bytes, "sampled tokens")) ||
      !(lps = lh_try_malloc_aligned(bytes, "log-probs")) ||
      !(lpm = lh_try_malloc_aligned(bytes, "model log-probs"))) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  for (long i = 0; i < n; i++) {
    reqs[i] = (lh_gen_request){prompt, np, (uint64_t)i};
    outs[i].tokens = tokens + i * per;
    outs[i].logprobs = lps + i * per;
    outs[i].logprobs_model = lpm + i * per;
  }
  if (lh_generate(g, &cfg, reqs, (int)n, outs, NULL)) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  bool json = lh__args_has(&a, "json");
  for (long i = 0; i < n; i++) {
    char *text = NULL;
    size_t len = 0;
    if (tok && lh_tokenizer_decode(tok, outs[i].tokens, (size_t)outs[i].n, true, &text, &len)) {
      rc = lh__cli_fail(CMD);
      goto out;
    }
    if (json) {
      json_t *o = json_object(), *ids = json_array();
      for (int j = 0; j < outs[i].n; j++)
        json_array_append_new(ids, json_integer(outs[i].tokens[j]));
      json_object_set_new(o, "tokens", ids);
      json_object_set_new(o, "logprobs", float_array(outs[i].logprobs, outs[i].n));
      json_object_set_new(o, "logprobs_model", float_array(outs[i].logprobs_model, outs[i].n));
      json_object_set_new(o, "text", text ? lh_json_text(text, len) : json_null());
      json_object_set_new(o, "finish", json_string(lh_finish_name(outs[i].finish)));
      char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
      json_decref(o);
      if (!line) {
        free(text);
        rc = lh__cli_error(CMD, LH__EXIT_FAIL, "sample %ld: cannot encode it as JSON", i);
        goto out;
      }
      puts(line);
      free(line);
    } else if (text) {
      if (n > 1) printf("=== sample %ld (%s) ===\n", i, lh_finish_name(outs[i].finish));
      fwrite(text, 1, len, stdout);
      putchar('\n');
    } else {
      if (n > 1) printf("=== sample %ld (%s) ===\n", i, lh_finish_name(outs[i].finish));
      for (int j = 0; j < outs[i].n; j++)
        printf(j ? ",%d" : "%d", outs[i].tokens[j]);
      putchar('\n');
    }
    free(text);
  }
  rc = lh__cli_flush_stdout(CMD);
out:
  free(tokens);
  free(lps);
  free(lpm);
  free(reqs);
  free(outs);
  free(prompt);
  lh_generator_free(g);
  lh_tokenizer_free(tok);
  lh_infer_free(m);
  return rc;
}

/* ---------------------------------------------------------------- bench generate */

static const lh__flag bench_flags[] = {
    {"model", "DIR", true, "model directory, or a run directory: its latest checkpoint"},
    {"batch", "B", true, "sequences generated at once"},
    {"prompt-len", "P", true, "prompt tokens per sequence (random ids)"},
    {"new", "N", true, "tokens generated per sequence (no early stop)"},
    {"threads", "K", false, "threads (default: all cores)"},
    {"json", NULL, false, "print one JSON line"},
};

int lh__bench_generate(int argc, char **argv) {
  lh__args a = {.cmd = "bench generate",
                .about =
                    "Prefill and decode throughput of the rollout engine: B random prompts of P "
                    "tokens, prefilled\nin forwards of up to 256 tokens, then N tokens each "
                    "sampled at temperature 1 with no stop\ntoken (N >= 2: the first comes "
                    "from the prefill, so N - 1 decode forwards). Decode time is\nthose "
                    "forwards plus all the sampling; decode tokens/s is the B x (N - 1) tokens "
                    "they make over\nthat time, and s/step that time over N - 1. Weights stay bf16 "
                    "at every batch size; the\nkernel path is the CPU's best (LH_KERNEL=avx2, "
                    "avx512 or scalar forces one).",
                .flags = bench_flags,
                .n_flags = sizeof bench_flags / sizeof bench_flags[0]};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_model(&a, "model")) != LH__ARGS_CONTINUE) return rc;
  long B, P, N, threads;
  if ((rc = lh__args_int(&a, "batch", 1, 4096, 1, &B)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "prompt-len", 1, 1 << 20, 1, &P)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "new", 2, 1 << 20, 2, &N)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "threads", 0, 1024, 0, &threads)) != LH__ARGS_CONTINUE)
    return rc;
  lh_set_threads((int)threads);
  lh_infer *m = NULL;
  lh_generator *g = NULL;
  int32_t *prompts = NULL, *tokens = NULL;
  float *lps = NULL, *lpm = NULL;
  lh_gen_request *reqs = NULL;
  lh_gen_output *outs = NULL;
  rc = LH__EXIT_FAIL;
  if (lh_infer_load(lh__args_str(&a, "model", NULL), &m)) {
    rc = lh__cli_fail(a.cmd);
    goto out;
  }
  const lh_config *c = lh_infer_config(m);
  if (P + N > c->max_positions) {
    rc =
        lh__cli_error(a.cmd, LH__EXIT_USAGE, "--prompt-len + --new = %ld exceeds the context of %d",
                      P + N, c->max_positions);
    goto out;
  }
  /* 256 rows keep the products compute-bound; scratch grows with the chunk (77 KB a row on
   * the 0.5B shape) and counts against the memory target (bf16 weights + KV cache + 10%) */
  long chunk = B * P < 256 ? B * P : 256;
  if (lh_generator_create(m, (int)B, (int)(P + N), (int)chunk, &g)) {
    rc = lh__cli_fail(a.cmd);
    goto out;
  }
  prompts = lh_xmalloc((size_t)(B * P) * sizeof *prompts);
  for (long i = 0; i < B * P; i++) {
    uint32_t r[4];
    lh_philox(1234, 7, (uint64_t)i, r);
    prompts[i] = (int32_t)(r[0] % (uint32_t)c->vocab_size);
  }
  reqs = lh_xcalloc((size_t)B, sizeof *reqs);
  outs = lh_xcalloc((size_t)B, sizeof *outs);
  tokens = lh_xmalloc((size_t)(B * N) * sizeof *tokens);
  lps = lh_xmalloc((size_t)(B * N) * sizeof *lps);
  lpm = lh_xmalloc((size_t)(B * N) * sizeof *lpm);
  for (long i = 0; i < B; i++) {
    reqs[i] = (lh_gen_request){prompts + i * P, (int)P, (uint64_t)i};
    outs[i] = (lh_gen_output){tokens + i * N, lps + i * N, lpm + i * N, 0, LH_FINISH_LENGTH};
  }
  lh_gen_config cfg = lh_gen_defaults();
  cfg.max_new = (int)N;
  cfg.n_eos = 1;
  cfg.eos_ids[0] = -1; /* no stop token: exactly N tokens each */
  lh_gen_stats st;
  /* warmup: one short pass touches every page of the weights and caches */
  cfg.max_new = 2;
  if (lh_generate(g, &cfg, reqs, (int)B, outs, &st)) {
    rc = lh__cli_fail(a.cmd);
    goto out;
  }
  cfg.max_new = (int)N;
  if (lh_generate(g, &cfg, reqs, (int)B, outs, &st)) {
    rc = lh__cli_fail(a.cmd);
    goto out;
  }
  /* decode_s: the N - 1 decode forwards and all N samplings; the tokens counted are the
   * B x (N - 1) those forwards make (the first token of each sequence comes from the prefill) */
  double decode_s = st.decode_s + st.sample_s, step_s = decode_s / (double)(N - 1);
  size_t weight_bytes = lh_infer_weight_bytes(m); /* what each decode forward reads */
  double prefill_tps = st.prefill_tokens / st.prefill_s,
         decode_tps = (double)(B * (N - 1)) / decode_s;
  if (lh__args_has(&a, "json")) {
    printf("{\"command\":\"bench generate\",\"batch\":%ld,\"prompt_len\":%ld,\"new\":%ld,"
           "\"threads\":%d,\"prefill_tokens_per_s\":%.6g,\"decode_tokens_per_s\":%.6g,"
           "\"decode_step_s\":%.6g,\"sample_s\":%.6g,\"prefill_s\":%.6g,\"decode_s\":%.6g,"
           "\"weight_bytes\":%zu,\"params\":%zu,\"kernel\":\"%s\"}\n",
           B, P, N, lh_threads(), prefill_tps, decode_tps, step_s, st.sample_s, st.prefill_s,
           decode_s, weight_bytes, lh_config_n_params(c), lh_kernel_name(lh_kernel_get()));
  } else {
    printf("bench generate: prefill %.0f tokens/s, decode %.0f tokens/s (%.4g s/step; sampling "
           "%.3g s) (batch %ld, prompt %ld, new %ld, %d threads, %.1f MB of bf16 weights per "
           "decode step, %s kernels)\n",
           prefill_tps, decode_tps, step_s, st.sample_s, B, P, N, lh_threads(),
           (double)weight_bytes / 1e6, lh_kernel_name(lh_kernel_get()));
  }
  rc = lh__cli_flush_stdout(a.cmd);
out:
  free(prompts);
  free(tokens);
  free(lps);
  free(lpm);
  free(reqs);
  free(outs);
  lh_generator_free(g);
  lh_infer_free(m);
  return rc;
}
