/* The generation loop: continuous batching gives every request the completion it gets alone,
 * stop tokens, stop strings (also one starting 257 bytes before the end of the token that
 * completes it), length and context limits end sequences as documented, bad
 * requests are refused up front, and the recorded model log-probs are those of the full
 * training forward over prompt + completion. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "longhaul/gen.h"
#include "longhaul/tensor.h"
#include "near.h"

#define MAXNEW 24
#define NREQ   7

typedef struct {
  lh_model *m;
  lh_infer *inf;
  lh_tokenizer *tok;
  int32_t prompts[NREQ][11];
  int plen[NREQ];
  lh_gen_request reqs[NREQ];
  int32_t tokens[NREQ][MAXNEW];
  float lp[NREQ][MAXNEW], lpm[NREQ][MAXNEW];
  lh_gen_output outs[NREQ];
} fixture;

static void setup_model(fixture *f) {
  memset(f, 0, sizeof *f);
  char *json = lh_tokenizer_chars_json();
  assert_int_equal(lh_tokenizer_parse(json, strlen(json), "chars", &f->tok), LH_ERR_OK);
  free(json);
  lh_config c;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_QWEN2, &c), LH_ERR_OK);
  c.vocab_size = lh_tokenizer_vocab_size(f->tok);
  c.hidden_size = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 96;
  c.max_positions = 64;
  c.eos_token_id = -1;
  assert_int_equal(lh_model_create(&c, &f->m), LH_ERR_OK);
  lh_model_init_random(f->m, 21);
  /* peaked, bf16-exact weights: one model for the engine and the training forward */
  for (size_t i = 0; i < f->m->n_params; i++)
    f->m->params[i] = lh_f32_from_bf16(lh_bf16_from_f32(f->m->params[i] * 8.0f + 0.01f));
  assert_int_equal(lh_infer_from_model(f->m, &f->inf), LH_ERR_OK);
  for (int r = 0; r < NREQ; r++) {
    f->plen[r] = 3 + (r * 7) % 10; /* 3 to 11 tokens */
    for (int i = 0; i < f->plen[r]; i++) {
      uint32_t w[4];
      lh_philox(3, (uint64_t)r, (uint64_t)i, w);
      f->prompts[r][i] = (int32_t)(3 + w[0] % (uint32_t)(c.vocab_size - 3));
    }
    f->reqs[r] = (lh_gen_request){f->prompts[r], f->plen[r], (uint64_t)(100 + r)};
  }
}

static void reset_outputs(fixture *f) {
  for (int r = 0; r < NREQ; r++)
    f->outs[r] = (lh_gen_output){f->tokens[r], f->lp[r], f->lpm[r], 0, LH_FINISH_LENGTH};
}

static void free_fixture(fixture *f) {
  lh_infer_free(f->inf);
  lh_model_free(f->m);
  lh_tokenizer_free(f->tok);
}

static void run(fixture *f, int slots, int max_seq, const lh_gen_config *cfg, lh_err want) {
  lh_generator *g;
  assert_int_equal(lh_generator_create(f->inf, slots, max_seq, 4, &g), LH_ERR_OK);
  reset_outputs(f);
  assert_int_equal(lh_generate(g, cfg, f->reqs, NREQ, f->outs, NULL), want);
  lh_generator_free(g);
}

static void test_batching_is_invisible(void **state) {
  fixture *f = malloc(sizeof *f), *alone = malloc(sizeof *alone);
  setup_model(f);
  lh_gen_config cfg = lh_gen_defaults();
  cfg.max_new = MAXNEW;
  cfg.seed = 5;
  run(f, 1, 64, &cfg, LH_ERR_OK); /* one request at a time */
  memcpy(alone, f, sizeof *f);
  run(f, 3, 64, &cfg, LH_ERR_OK); /* three slots, refilled as requests finish */
  int differ = 0;
  for (int r = 0; r < NREQ; r++) {
    assert_int_equal(f->outs[r].n, MAXNEW);
    assert_int_equal(f->outs[r].finish, LH_FINISH_LENGTH);
    assert_memory_equal(f->tokens[r], alone->tokens[r], MAXNEW * sizeof(int32_t));
    for (int i = 0; i < MAXNEW; i++)
      differ += f->tokens[r][i] != f->tokens[0][i];
  }
  assert_true(differ > 0); /* different prompts and streams give different completions */
  /* another seed changes the samples */
  cfg.seed = 6;
  run(f, 3, 64, &cfg, LH_ERR_OK);
  assert_memory_not_equal(f->tokens[0], alone->tokens[0], MAXNEW * sizeof(int32_t));
  free_fixture(f);
  free(f);
  free(alone);
}

/* logprob_model of every generated token equals the training forward's log-prob */
static void test_logprobs_match_training_forward(void **state) {
  fixture *f = malloc(sizeof *f);
  setup_model(f);
  lh_gen_config cfg = lh_gen_defaults();
  cfg.max_new = MAXNEW;
  cfg.sample.temperature = 0.7f;
  run(f, 4, 64, &cfg, LH_ERR_OK);
  lh_train *t;
  assert_int_equal(lh_train_create(f->m, 64, 64, &t), LH_ERR_OK);
  for (int r = 0; r < NREQ; r++) {
    int32_t seq[64];
    float w[64] = {0}, lp[64];
    int n = f->plen[r] + f->outs[r].n;
    memcpy(seq, f->prompts[r], f->plen[r] * sizeof(int32_t));
    memcpy(seq + f->plen[r], f->tokens[r], f->outs[r].n * sizeof(int32_t));
    int ss[2] = {0, n};
    lh_batch b = {1, ss, seq, w};
    lh_train_forward(t, &b, lp);
    for (int i = 0; i < f->outs[r].n; i++) {
      /* two fp32 paths (engine vs training forward: other summation orders, other exp) over
       * peaked logits differ by up to ~3e-4 (seen under the ASan build's -O2); a wrong
       * position or token differs by far more than 1e-3 */
      assert_float_equal(f->lpm[r][i], lp[f->plen[r] + i], 1e-3);
      /* sampling at T < 1 sharpens: the sampled token's sampling log-prob is finite and <= 0 */
      assert_true(f->lp[r][i] <= 1e-6f && isfinite(f->lp[r][i]));
    }
  }
  lh_train_free(t);
  free_fixture(f);
  free(f);
}

static void test_stops(void **state) {
  fixture *f = malloc(sizeof *f);
  setup_model(f);
  lh_gen_config cfg = lh_gen_defaults();
  cfg.max_new = MAXNEW;
  cfg.sample.temperature = 0.0f;
  run(f, 2, 64, &cfg, LH_ERR_OK);
  int32_t base[MAXNEW];
  memcpy(base, f->tokens[1], sizeof base);
  /* stop token: the 6th token of request 1's greedy completion (first occurrence at k) */
  int32_t eos = base[5];
  int k = 0;
  while (base[k] != eos)
    k++;
  cfg.n_eos = 1;
  cfg.eos_ids[0] = eos;
  run(f, 2, 64, &cfg, LH_ERR_OK);
  assert_int_equal(f->outs[1].finish, LH_FINISH_EOS);
  assert_int_equal(f->outs[1].n, k + 1);
  assert_memory_equal(f->tokens[1], base, (k + 1) * sizeof(int32_t));
  /* stop string: the text of tokens 3..4 of the greedy completion */
  cfg.n_eos = 1;
  cfg.eos_ids[0] = -1;
  char *text;
  size_t len;
  assert_int_equal(lh_tokenizer_decode(f->tok, base + 3, 2, true, &text, &len), LH_ERR_OK);
  cfg.stop[0] = text;
  cfg.n_stop = 1;
  cfg.tok = f->tok;
  run(f, 2, 64, &cfg, LH_ERR_OK);
  assert_int_equal(f->outs[1].finish, LH_FINISH_STOP);
  assert_true(f->outs[1].n <= 5);
  char *got;
  assert_int_equal(lh_tokenizer_decode(f->tok, f->tokens[1], f->outs[1].n, true, &got, &len),
                   LH_ERR_OK);
  assert_non_null(strstr(got, text));
  free(got);
  free(text);
  /* the context: prompts of up to 11 tokens in 16 positions */
  cfg = lh_gen_defaults();
  cfg.max_new = MAXNEW;
  run(f, 2, 16, &cfg, LH_ERR_OK);
  for (int r = 0; r < NREQ; r++) {
    assert_int_equal(f->outs[r].finish, LH_FINISH_CONTEXT);
    assert_int_equal(f->plen[r] + f->outs[r].n, 16);
  }
  free_fixture(f);
  free(f);
}

/* A stop string that starts more than STOP_TAIL - (token length) bytes before the token that
 * completes it. A model that can only say "y" and then a token of 200 x's (every layer zero, so
 * the logits depend on the current token alone: after "a" comes "y", after "y" or the x token
 * comes the x token) writes y x^200 x^200 ...; the stop string y x^255 ends 55 bytes into the
 * second x token, so the "y" lies 257 bytes before that token's end. */
static void test_stop_string_before_long_token(void **state) {
  (void)state;
  char *chars = lh_tokenizer_chars_json();
  json_error_t je;
  json_t *root = json_loads(chars, 0, &je);
  free(chars);
  assert_non_null(root);
  char xs[201];
  memset(xs, 'x', 200);
  xs[200] = '\0';
  json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
  int X = (int)json_object_size(vocab);
  json_object_set_new(vocab, xs, json_integer(X));
  char *text = json_dumps(root, 0);
  json_decref(root);
  lh_tokenizer *tok;
  assert_int_equal(lh_tokenizer_parse(text, strlen(text), "chars+x200", &tok), LH_ERR_OK);
  free(text);
  int32_t a = lh_tokenizer_find(tok, "a"), y = lh_tokenizer_find(tok, "y");
  assert_true(a > 0 && y > 0);

  lh_config c;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_LLAMA, &c), LH_ERR_OK);
  c.vocab_size = X + 1;
  c.tie_embeddings = false;
  c.eos_token_id = -1;
  lh_model *m;
  assert_int_equal(lh_model_create(&c, &m), LH_ERR_OK); /* all zero: layers add nothing */
  int C = c.hidden_size;
  for (int j = 0; j < C; j++)
    m->w.norm[j] = 1.0f;
  for (int v = 0; v < c.vocab_size; v++)
    m->w.embed[(size_t)v * C + 0] = 1.0f; /* e0 for every token but y and x */
  m->w.embed[(size_t)y * C + 0] = 0.0f, m->w.embed[(size_t)y * C + 1] = 1.0f; /* e1 */
  m->w.embed[(size_t)X * C + 0] = 0.0f, m->w.embed[(size_t)X * C + 2] = 1.0f; /* e2 */
  m->w.lm_head[(size_t)y * C + 0] = 8.0f;                                     /* e0 -> y */
  m->w.lm_head[(size_t)X * C + 1] = m->w.lm_head[(size_t)X * C + 2] = 8.0f;   /* e1, e2 -> x */
  lh_infer *inf;
  assert_int_equal(lh_infer_from_model(m, &inf), LH_ERR_OK);
  lh_generator *g;
  assert_int_equal(lh_generator_create(inf, 1, 16, 0, &g), LH_ERR_OK);

  char stop[257];
  stop[0] = 'y';
  memset(stop + 1, 'x', 255);
  stop[256] = '\0';
  lh_gen_config cfg = lh_gen_defaults();
  cfg.max_new = 6;
  cfg.sample.temperature = 0.0f;
  cfg.tok = tok;
  cfg.stop[0] = stop;
  cfg.n_stop = 1;
  int32_t prompt[1] = {a}, out[6];
  float lp[6], lpm[6];
  lh_gen_request req = {prompt, 1, 0};
  lh_gen_output o = {out, lp, lpm, 0, LH_FINISH_LENGTH};
  assert_int_equal(lh_generate(g, &cfg, &req, 1, &o, NULL), LH_ERR_OK);
  assert_true(o.n >= 2 && out[0] == y && out[1] == X); /* the model says what it was built to */
  assert_int_equal(o.finish, LH_FINISH_STOP);
  assert_int_equal(o.n, 3); /* y, x^200, x^200: the stop string ends in the third token */
  lh_generator_free(g);
  lh_infer_free(inf);
  lh_model_free(m);
  lh_tokenizer_free(tok);
}

static void test_refusals(void **state) {
  fixture *f = malloc(sizeof *f);
  setup_model(f);
  lh_gen_config cfg = lh_gen_defaults();
  run(f, 2, 11, &cfg, LH_ERR_LIMIT); /* an 11-token prompt in an 11-token context */
  assert_non_null(strstr(lh_last_error(), "no room"));
  f->prompts[2][1] = 10000;
  run(f, 2, 64, &cfg, LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "request 2"));
  f->prompts[2][1] = 5;
  cfg.sample.top_p = 0.0f;
  run(f, 2, 64, &cfg, LH_ERR_INVAL);
  cfg = lh_gen_defaults();
  cfg.n_stop = 1;
  cfg.stop[0] = "x";
  run(f, 2, 64, &cfg, LH_ERR_INVAL); /* stop strings without a tokenizer */
  free_fixture(f);
  free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batching_is_invisible),
      cmocka_unit_test(test_logprobs_match_training_forward),
      cmocka_unit_test(test_stops),
      cmocka_unit_test(test_stop_string_before_long_token),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
