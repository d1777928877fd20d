/* The generation engine against float64 PyTorch: on the tiny bf16 models of
 * tests/fixtures/greedy (tests/ref/greedy_ref.py), greedy decoding must reproduce the reference's
 * 32-token continuations exactly, whether the four prompts share the batch (continuous
 * batching), run one at a time, or are prefilled in small chunks next to decoding slots. With
 * sampling, a request's completion must not depend on which other requests shared its batch. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "longhaul/gen.h"
#include "longhaul/infer.h"
#include "longhaul/sample.h"
#include "near.h"

#define N_PROMPTS 4
#define MAX_NEW   32
#define MAX_SEQ   64 /* longest prompt (20) + 32, within max_position_embeddings 128 */
/* |logprob_model - float64 reference|: fp32 compute on the same bf16 weights. The inference
 * forward alone (full recompute per token) is off by at most 2.7e-5 on these fixtures; ~10x. */
#define LOGPROB_TOL 3e-4

static const char *const variants[] = {"qwen2_tied_gqa", "llama_untied_gqa", "llama_tied_bias"};

typedef struct {
  char dir[1024];
  int n_prompts;
  int prompt_len[N_PROMPTS];
  int32_t prompt[N_PROMPTS][MAX_SEQ];
  int32_t greedy[N_PROMPTS][MAX_NEW];
  double logprob_model[N_PROMPTS][MAX_NEW];
  double min_margin;
} fixture;

typedef struct {
  int32_t tokens[N_PROMPTS][MAX_NEW];
  float logprobs[N_PROMPTS][MAX_NEW];
  float logprobs_model[N_PROMPTS][MAX_NEW];
  lh_gen_output outs[N_PROMPTS];
} completions;

/* Reads an array of n numbers from obj[key][i] (n == -1: any length up to cap) into ints or
 * doubles; returns the length. */
static int read_array(const fixture *f, json_t *rows, size_t i, int cap, int32_t *ints,
                      double *dbls, const char *key) {
  json_t *a = json_array_get(rows, i);
  if (!json_is_array(a) || (int)json_array_size(a) < 1 || (int)json_array_size(a) > cap)
    fail_msg("%s/expected.json: %s[%zu]: expected an array of 1..%d numbers", f->dir, key, i, cap);
  for (size_t j = 0; j < json_array_size(a); j++) {
    json_t *v = json_array_get(a, j);
    if (ints) {
      if (!json_is_integer(v))
        fail_msg("%s/expected.json: %s[%zu][%zu]: not an integer", f->dir, key, i, j);
      ints[j] = (int32_t)json_integer_value(v);
    } else {
      if (!json_is_number(v))
        fail_msg("%s/expected.json: %s[%zu][%zu]: not a number", f->dir, key, i, j);
      dbls[j] = json_number_value(v);
    }
  }
  return (int)json_array_size(a);
}

static void load_fixture(const char *variant, fixture *f) {
  memset(f, 0, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "%s/tests/fixtures/greedy/%s", LH_SOURCE_DIR, variant);
  char path[1100];
  snprintf(path, sizeof path, "%s/expected.json", f->dir);
  json_error_t jerr;
  json_t *root = json_load_file(path, 0, &jerr);
  if (!root) fail_msg("%s:%d: %s", path, jerr.line, jerr.text);
  json_t *prompts = json_object_get(root, "prompts"), *greedy = json_object_get(root, "greedy");
  json_t *lps = json_object_get(root, "logprob_model");
  assert_true(json_is_array(prompts) && json_array_size(prompts) == N_PROMPTS);
  assert_true(json_is_array(greedy) && json_array_size(greedy) == N_PROMPTS);
  assert_true(json_is_array(lps) && json_array_size(lps) == N_PROMPTS);
  assert_int_equal(json_integer_value(json_object_get(root, "new")), MAX_NEW);
  f->n_prompts = N_PROMPTS;
  for (size_t i = 0; i < N_PROMPTS; i++) {
    f->prompt_len[i] = read_array(f, prompts, i, MAX_SEQ - MAX_NEW, f->prompt[i], NULL, "prompts");
    assert_int_equal(read_array(f, greedy, i, MAX_NEW, f->greedy[i], NULL, "greedy"), MAX_NEW);
    assert_int_equal(read_array(f, lps, i, MAX_NEW, NULL, f->logprob_model[i], "logprob_model"),
                     MAX_NEW);
  }
  f->min_margin = json_number_value(json_object_get(root, "min_margin"));
  json_decref(root);
}

static lh_infer *load_model(const fixture *f) {
  lh_infer *m = NULL;
  lh_err e = lh_infer_load(f->dir, &m);
  if (e != LH_ERR_OK) fail_msg("lh_infer_load(%s): %s", f->dir, lh_last_error());
  return m;
}

/* Generates the fixture's prompts (seq_index = prompt index) with n_slots slots. */
static void generate(lh_infer *m, const fixture *f, int n_slots, int prefill_chunk,
                     const lh_gen_config *cfg, completions *c) {
  lh_generator *g = NULL;
  if (lh_generator_create(m, n_slots, MAX_SEQ, prefill_chunk, &g) != LH_ERR_OK)
    fail_msg("lh_generator_create(%d slots): %s", n_slots, lh_last_error());
  lh_gen_request reqs[N_PROMPTS];
  for (int i = 0; i < N_PROMPTS; i++) {
    reqs[i] = (lh_gen_request){f->prompt[i], f->prompt_len[i], (uint64_t)i};
    c->outs[i] = (lh_gen_output){c->tokens[i], c->logprobs[i], c->logprobs_model[i], 0, 0};
  }
  lh_gen_stats st;
  if (lh_generate(g, cfg, reqs, N_PROMPTS, c->outs, &st) != LH_ERR_OK)
    fail_msg("lh_generate(%d slots): %s", n_slots, lh_last_error());
  lh_generator_free(g);
  for (int i = 0; i < N_PROMPTS; i++) {
    /* The fixtures have no eos token: every completion runs to max_new. */
    if (c->outs[i].n != MAX_NEW || c->outs[i].finish != LH_FINISH_LENGTH)
      fail_msg("%s, %d slots: prompt %d: %d tokens, finish %s; expected %d tokens, finish "
               "length",
               f->dir, n_slots, i, c->outs[i].n, lh_finish_name(c->outs[i].finish), MAX_NEW);
  }
}

static lh_gen_config greedy_config(void) {
  lh_gen_config cfg = lh_gen_defaults();
  cfg.sample.temperature = 0.0f;
  cfg.max_new = MAX_NEW;
  cfg.n_eos = 0; /* the model's eos ids: none */
  return cfg;
}

static void check_greedy(const fixture *f, lh_infer *m, int n_slots, int prefill_chunk) {
  lh_gen_config cfg = greedy_config();
  completions c;
  generate(m, f, n_slots, prefill_chunk, &cfg, &c);
  double worst = 0;
  for (int i = 0; i < N_PROMPTS; i++) {
    for (int t = 0; t < MAX_NEW; t++) {
      if (c.tokens[i][t] != f->greedy[i][t])
        fail_msg("%s, %d slots, prefill chunk %d: prompt %d (%d tokens): first mismatch at "
                 "new token %d (position %d): got %d, float64 torch %d",
                 f->dir, n_slots, prefill_chunk, i, f->prompt_len[i], t, f->prompt_len[i] + t,
                 c.tokens[i][t], f->greedy[i][t]);
      if (c.logprobs[i][t] != 0.0f)
        fail_msg("%s: prompt %d token %d: greedy sampling log-prob %g, expected 0", f->dir, i, t,
                 (double)c.logprobs[i][t]);
      worst = near_worst(worst, fabs((double)c.logprobs_model[i][t] - f->logprob_model[i][t]));
    }
  }
  printf("%s, %d slots, prefill chunk %d: %d x %d greedy tokens equal float64 torch "
         "(min margin %.4f); worst logprob_model error %.2e\n",
         f->dir, n_slots, prefill_chunk, N_PROMPTS, MAX_NEW, f->min_margin, worst);
  assert_true(worst <= LOGPROB_TOL);
}

static void test_greedy(void **state) {
  (void)state;
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
    fixture f;
    load_fixture(variants[v], &f);
    lh_infer *m = load_model(&f);
    check_greedy(&f, m, 4, 0); /* all four prompts in one batch */
    check_greedy(&f, m, 1, 0); /* one at a time */
    check_greedy(&f, m, 3, 4); /* a slot is refilled; prompts prefilled 4 tokens a step while
                                  the other slots decode */
    lh_infer_free(m);
  }
}

/* Explains a sampled token that differs between two batchings: recomputes the logits of the
 * prefix alone and asks the checker about each choice. */
static void explain_mismatch(const lh_infer *m, const fixture *f, const lh_sample_params *p,
                             uint64_t seed, int i, int t, const int32_t *tokens, int32_t other) {
  const lh_config *cfg = lh_infer_config(m);
  int V = cfg->vocab_size, len = f->prompt_len[i] + t;
  lh_kv *kv = NULL;
  assert_int_equal(lh_kv_create(m, 1, MAX_SEQ, MAX_SEQ, &kv), LH_ERR_OK);
  lh_infer_row rows[MAX_SEQ];
  for (int k = 0; k < len; k++) {
    int32_t tok = k < f->prompt_len[i] ? f->prompt[i][k] : tokens[k - f->prompt_len[i]];
    rows[k] = (lh_infer_row){0, k, tok, k == len - 1};
  }
  float *logits = malloc((size_t)V * sizeof *logits);
  assert_int_equal(lh_infer_forward(m, kv, rows, len, logits), LH_ERR_OK);
  lh_sample_scratch *s = lh_sample_scratch_create(V);
  double u = lh_sample_uniform(seed, (uint64_t)i, (uint64_t)len);
  static const char *const names[] = {"CONSISTENT", "INCONSISTENT", "BORDERLINE"};
  lh_sample_verdict a = lh_sample_check(logits, V, p, u, tokens[t], 1e-4, s);
  lh_sample_verdict b = lh_sample_check(logits, V, p, u, other, 1e-4, s);
  printf("  u = %.9f; checker on recomputed logits: 4-slot token %d %s, 1-slot token %d %s\n", u,
         tokens[t], names[a], other, names[b]);
  lh_sample_scratch_free(s);
  free(logits);
  lh_kv_free(kv);
}

static void check_batch_independence(const fixture *f, lh_infer *m, lh_sample_params p,
                                     uint64_t seed) {
  lh_gen_config cfg = lh_gen_defaults();
  cfg.sample = p;
  cfg.seed = seed;
  cfg.max_new = MAX_NEW;
  cfg.n_eos = 0;
  static completions batched, alone;
  generate(m, f, 4, 0, &cfg, &batched);
  generate(m, f, 1, 0, &cfg, &alone);
  double worst = 0;
  int differs_from_greedy = 0;
  for (int i = 0; i < N_PROMPTS; i++) {
    for (int t = 0; t < MAX_NEW; t++) {
      if (batched.tokens[i][t] != alone.tokens[i][t]) {
        printf("%s, T=%g top_k=%d top_p=%g: prompt %d: first difference at new token %d "
               "(position %d): 4 slots %d, 1 slot %d\n",
               f->dir, (double)p.temperature, p.top_k, (double)p.top_p, i, t, f->prompt_len[i] + t,
               batched.tokens[i][t], alone.tokens[i][t]);
        explain_mismatch(m, f, &p, seed, i, t, batched.tokens[i], alone.tokens[i][t]);
        fail_msg("completion depends on batch composition");
      }
      worst = near_worst(worst, fabs((double)batched.logprobs[i][t] - alone.logprobs[i][t]));
      worst = near_worst(worst,
                         fabs((double)batched.logprobs_model[i][t] - alone.logprobs_model[i][t]));
      differs_from_greedy += batched.tokens[i][t] != f->greedy[i][t];
    }
  }
  printf("%s, T=%g top_k=%d top_p=%g seed %llu: 4-slot and 1-slot completions equal; worst "
         "log-prob difference %.2e; %d of %d tokens differ from greedy\n",
         f->dir, (double)p.temperature, p.top_k, (double)p.top_p, (unsigned long long)seed, worst,
         differs_from_greedy, N_PROMPTS * MAX_NEW);
  assert_true(worst <= LOGPROB_TOL);
  /* Sampling at these temperatures must actually sample (the test would otherwise be the
   * greedy one again). */
  assert_true(differs_from_greedy > 0);
}

static void test_batch_independence(void **state) {
  (void)state;
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
    fixture f;
    load_fixture(variants[v], &f);
    lh_infer *m = load_model(&f);
    lh_sample_params plain = lh_sample_defaults(); /* temperature 1, no filters */
    check_batch_independence(&f, m, plain, 1234);
    lh_sample_params filtered = {.temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .min_p = 0.0f};
    check_batch_independence(&f, m, filtered, 99);
    lh_infer_free(m);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy),
      cmocka_unit_test(test_batch_independence),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
