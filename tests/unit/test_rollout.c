/* The rollout module: the byte codec (round trip bit for bit, re-encoding gives the same bytes,
 * every kind of bad input refused with a clear error and never a crash: truncation at every
 * length, a flipped byte anywhere, bad magic, an unknown version, counts above the limits, bad
 * values), a byte-for-byte match with an encoder written from docs/ARCHITECTURE.md alone
 * (tests/ref/rollout_seed.py wrote the corpus file), and scoring from tokens (lh_rollout_score:
 * claimed rewards are overwritten by the environment's), and generation from prompt token ids
 * (lh_rollout_generate_ids, a worker's) against generation from the tasks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "longhaul/infer.h"
#include "longhaul/rollout.h"

#ifndef LH_SOURCE_DIR
#define LH_SOURCE_DIR "."
#endif

/* 2 groups of 2; group 1 failed (empty). Prompts of 2 tokens, completions of 3 and 1. */
typedef struct {
  uint64_t task_index[2];
  uint8_t group_ok[2];
  int seq_start[5];
  int prompt_len[4];
  int32_t tokens[9];
  float mu[9], old[9], reward[4];
  uint8_t correct[4], well_formed[4], finish[4];
} arrays;

static void make_batch(lh_rollout_batch *b, arrays *a, int with_old) {
  *a = (arrays){{7, (uint64_t)1 << 40},
                {1, 0},
                {0, 5, 8, 8, 8},
                {2, 2, 0, 0},
                {10, 11, 20, 21, 2, 10, 11, 22, 0},
                {0, 0, -0.5f, -0.25f, -0.125f, 0, 0, -1.0f, 0},
                {0, 0, -0.4f, -0.3f, -0.1f, 0, 0, -1.5f, 0},
                {1.0f, 0.25f, 0, 0},
                {1, 0, 0, 0},
                {1, 1, 0, 0},
                {LH_FINISH_EOS, LH_FINISH_LENGTH, 0, 0}};
  memset(b, 0, sizeof *b);
  b->n_groups = 2;
  b->group_size = 2;
  b->version = 41;
  b->split = LH_SPLIT_TRAIN;
  b->seed = 0x0123456789abcdefULL;
  b->stream_base = 1000;
  b->sample = (lh_sample_params){0.7f, 5, 0.9f, 0.05f};
  b->max_new = 3;
  b->task_index = a->task_index;
  b->group_ok = a->group_ok;
  b->seq_start = a->seq_start;
  b->prompt_len = a->prompt_len;
  b->tokens = a->tokens;
  b->mu = a->mu;
  b->old = with_old ? a->old : NULL;
  b->reward = a->reward;
  b->correct = a->correct;
  b->well_formed = a->well_formed;
  b->finish = a->finish;
}

static lh_rollout_limits limits(void) {
  lh_rollout_limits l = lh_rollout_default_limits();
  l.vocab = 32;
  return l;
}

static void assert_same(const lh_rollout_batch *a, const lh_rollout_batch *b) {
  assert_int_equal(a->n_groups, b->n_groups);
  assert_int_equal(a->group_size, b->group_size);
  assert_int_equal(a->version, b->version);
  assert_int_equal(a->split, b->split);
  assert_true(a->seed == b->seed && a->stream_base == b->stream_base);
  assert_memory_equal(&a->sample, &b->sample, sizeof a->sample);
  assert_int_equal(a->max_new, b->max_new);
  int n = a->n_groups * a->group_size, N = a->seq_start[n];
  assert_memory_equal(a->task_index, b->task_index, (size_t)a->n_groups * 8);
  assert_memory_equal(a->group_ok, b->group_ok, (size_t)a->n_groups);
  assert_memory_equal(a->seq_start, b->seq_start, (size_t)(n + 1) * sizeof(int));
  assert_memory_equal(a->prompt_len, b->prompt_len, (size_t)n * sizeof(int));
  assert_memory_equal(a->tokens, b->tokens, (size_t)N * 4);
  assert_memory_equal(a->mu, b->mu, (size_t)N * 4);
  assert_int_equal(!a->old, !b->old);
  if (a->old) assert_memory_equal(a->old, b->old, (size_t)N * 4);
  assert_memory_equal(a->reward, b->reward, (size_t)n * 4);
  assert_memory_equal(a->correct, b->correct, (size_t)n);
  assert_memory_equal(a->well_formed, b->well_formed, (size_t)n);
  assert_memory_equal(a->finish, b->finish, (size_t)n);
}

static void test_round_trip(void **state) {
  (void)state;
  for (int with_old = 0; with_old < 2; with_old++) {
    arrays ar;
    lh_rollout_batch b, d;
    make_batch(&b, &ar, with_old);
    uint8_t *buf = NULL, *again = NULL;
    size_t len = 0, len2 = 0;
    assert_int_equal(lh_rollout_encode(&b, &buf, &len), LH_ERR_OK);
    assert_int_equal(len, lh_rollout_encoded_size(&b));
    assert_int_equal(len, 96 + 2 * 9 + 4 * 15 + 8 * (with_old ? 12 : 8));
    lh_rollout_limits lim = limits();
    assert_int_equal(lh_rollout_decode(buf, len, &lim, "t", &d), LH_ERR_OK);
    assert_same(&b, &d);
    assert_int_equal(lh_rollout_encode(&d, &again, &len2), LH_ERR_OK);
    assert_int_equal(len, len2);
    assert_memory_equal(buf, again, len);
    lh_rollout_batch_free(&d);
    free(buf);
    free(again);
  }
}

/* The committed seed of the fuzz corpus was written by tests/ref/rollout_seed.py from the format
 * description alone: it decodes to this batch, and this batch encodes to exactly its bytes. */
static void test_independent_encoder(void **state) {
  (void)state;
  const char *path = LH_SOURCE_DIR "/tests/fuzz/corpus/rollout/seed-old.bin";
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  uint8_t file[4096];
  size_t n = fread(file, 1, sizeof file, f);
  fclose(f);
  arrays ar;
  lh_rollout_batch b, d;
  make_batch(&b, &ar, 1);
  uint8_t *buf = NULL;
  size_t len = 0;
  assert_int_equal(lh_rollout_encode(&b, &buf, &len), LH_ERR_OK);
  assert_int_equal(n, len);
  assert_memory_equal(file, buf, len);
  lh_rollout_limits lim = limits();
  assert_int_equal(lh_rollout_decode(file, n, &lim, "seed", &d), LH_ERR_OK);
  assert_same(&b, &d);
  lh_rollout_batch_free(&d);
  free(buf);
}

/* Decodes and expects `code` with `needle` in the message. */
static void expect_bad(const uint8_t *buf, size_t len, lh_err code, const char *needle) {
  lh_rollout_limits lim = limits();
  lh_rollout_batch d;
  lh_err e = lh_rollout_decode(buf, len, &lim, "wire", &d);
  if (e != code || !strstr(lh_last_error(), needle))
    fail_msg("expected %s with \"%s\", got %s: %s", lh_err_name(code), needle, lh_err_name(e),
             lh_last_error());
  assert_null(d.tokens);
}

static void test_refusals(void **state) {
  (void)state;
  arrays ar;
  lh_rollout_batch b;
  make_batch(&b, &ar, 1);
  uint8_t *buf = NULL;
  size_t len = 0;
  assert_int_equal(lh_rollout_encode(&b, &buf, &len), LH_ERR_OK);
  uint8_t *c = malloc(len);
  /* every truncation */
  for (size_t k = 0; k < len; k++) {
    lh_rollout_limits lim = limits();
    lh_rollout_batch d;
    assert_int_not_equal(lh_rollout_decode(buf, k, &lim, "wire", &d), LH_ERR_OK);
  }
  expect_bad(buf, 50, LH_ERR_FORMAT, "shorter than the 96-byte header");
  memcpy(c, buf, len);
  c[0] = 'X';
  expect_bad(c, len, LH_ERR_FORMAT, "magic");
  memcpy(c, buf, len);
  c[4] = 2;
  expect_bad(c, len, LH_ERR_UNSUPPORTED, "rollout format 2, this longhaul reads 1");
  memcpy(c, buf, len);
  c[90] = 1;
  expect_bad(c, len, LH_ERR_FORMAT, "reserved header byte 90");
  memcpy(c, buf, len);
  c[6] = 0x80;
  expect_bad(c, len, LH_ERR_UNSUPPORTED, "unknown flags");
  /* a token count far above the limit is refused before any allocation */
  memcpy(c, buf, len);
  c[16 + 3] = 0x40;
  expect_bad(c, len, LH_ERR_LIMIT, "tokens, more than the limit");
  memcpy(c, buf, len);
  c[8] = 0xff, c[9] = 0xff, c[10] = 0xff;
  expect_bad(c, len, LH_ERR_LIMIT, "groups, expected 1..");
  /* one byte more than the counts say */
  uint8_t *longer = calloc(len + 1, 1);
  memcpy(longer, buf, len);
  expect_bad(longer, len + 1, LH_ERR_FORMAT, "take");
  free(longer);
  /* values: the first completion token (sequence 0, token 2) is at 96 + 18 + 60 + 8 */
  size_t tok = 96 + 2 * 9 + 4 * 15, mu = tok + 8 * 4, reward = 96 + 18 + 32;
  memcpy(c, buf, len);
  c[tok + 2 * 4] = 40; /* vocab 32 */
  expect_bad(c, len, LH_ERR_FORMAT, "sequence 0: token 2 is 40, outside [0, 32)");
  memcpy(c, buf, len);
  float nan = NAN;
  memcpy(c + mu + 3 * 4, &nan, 4);
  expect_bad(c, len, LH_ERR_FORMAT, "sequence 0: token 3: behaviour log-prob nan");
  memcpy(c, buf, len);
  float two = 2.0f;
  memcpy(c + reward, &two, 4);
  expect_bad(c, len, LH_ERR_FORMAT, "sequence 0: reward 2, expected [0, 1]");
  /* a failed group that carries tokens: group 0's ok flag (after the task indices) cleared */
  memcpy(c, buf, len);
  c[96 + 16] = 0;
  expect_bad(c, len, LH_ERR_FORMAT, "sequence 0: its group 0 failed, but it is not empty");
  /* every single flipped byte: an error or a valid batch, never a crash (ASan watches) */
  for (size_t k = 0; k < len; k++)
    for (int bit = 0; bit < 8; bit++) {
      memcpy(c, buf, len);
      c[k] ^= (uint8_t)(1u << bit);
      lh_rollout_limits lim = limits();
      lh_rollout_batch d;
      if (lh_rollout_decode(c, len, &lim, "wire", &d) == LH_ERR_OK) {
        assert_int_equal(lh_rollout_validate(&d, &lim, "again"), LH_ERR_OK);
        lh_rollout_batch_free(&d);
      }
    }
  /* an inconsistent batch is not encoded */
  ar.prompt_len[0] = 5;
  uint8_t *none = NULL;
  size_t nlen = 0;
  assert_int_equal(lh_rollout_encode(&b, &none, &nlen), LH_ERR_INVAL);
  assert_null(none);
  free(c);
  free(buf);
}

/* lh_rollout_score recomputes rewards from the tokens: a claimed reward is replaced. */
static void test_score(void **state) {
  (void)state;
  lh_env_config ec;
  lh_env *env = NULL;
  assert_int_equal(lh_env_config_parse("arith:digits=1", &ec), LH_ERR_OK);
  assert_int_equal(lh_env_create(&ec, &env), LH_ERR_OK);
  lh_tokenizer *tok = NULL;
  char *json = lh_tokenizer_chars_json();
  assert_int_equal(lh_tokenizer_parse(json, strlen(json), "chars", &tok), LH_ERR_OK);
  free(json);
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 3, &t), LH_ERR_OK);
  int32_t *p = NULL, *right = NULL;
  size_t np = 0, nr = 0;
  assert_int_equal(lh_tokenizer_encode(tok, t.prompt, strlen(t.prompt), true, &p, &np), LH_ERR_OK);
  assert_int_equal(lh_tokenizer_encode(tok, t.answer, strlen(t.answer), true, &right, &nr),
                   LH_ERR_OK);
  /* sequence 0 answers right, sequence 1 answers "x" but claims reward 1 */
  int N = (int)(2 * np + nr + 1);
  int32_t *tokens = calloc((size_t)N, 4);
  float *mu = calloc((size_t)N, 4), reward[2] = {0.0f, 1.0f};
  memcpy(tokens, p, np * 4);
  memcpy(tokens + np, right, nr * 4);
  memcpy(tokens + np + nr, p, np * 4);
  tokens[N - 1] = lh_tokenizer_find(tok, "x");
  int seq_start[3] = {0, (int)(np + nr), N}, prompt_len[2] = {(int)np, (int)np};
  uint64_t task_index = 3;
  uint8_t ok = 1, correct[2] = {0, 1}, wf[2] = {0, 1}, finish[2] = {0, 0};
  lh_rollout_batch b = {.n_groups = 1,
                        .group_size = 2,
                        .split = LH_SPLIT_TRAIN,
                        .task_index = &task_index,
                        .group_ok = &ok,
                        .seq_start = seq_start,
                        .prompt_len = prompt_len,
                        .tokens = tokens,
                        .mu = mu,
                        .reward = reward,
                        .correct = correct,
                        .well_formed = wf,
                        .finish = finish};
  assert_int_equal(lh_rollout_score(tok, env, NULL, &b), LH_ERR_OK);
  assert_true(reward[0] == 1.0f && correct[0] == 1 && wf[0] == 1);
  assert_true(reward[1] == 0.0f && correct[1] == 0 && wf[1] == 0);
  lh_rollout_summary s = lh_rollout_summarise(&b);
  assert_true(s.reward_mean == 0.5 && s.groups_ok == 1 && s.groups_failed == 0);
  assert_int_equal(s.completion_tokens, (long)nr + 1);
  /* a completion of another prompt is not scored as this task's: the group is refused */
  tokens[np + nr] = lh_tokenizer_find(tok, "9") == tokens[np + nr] ? lh_tokenizer_find(tok, "8")
                                                                   : lh_tokenizer_find(tok, "9");
  assert_int_equal(lh_rollout_score(tok, env, NULL, &b), LH_ERR_OK);
  assert_int_equal(ok, 0);
  assert_int_equal(seq_start[2], 0); /* emptied */
  assert_true(reward[0] == 0.0f && reward[1] == 0.0f);
  lh_env_task_clear(&t);
  free(p);
  free(right);
  free(tokens);
  free(mu);
  lh_tokenizer_free(tok);
  lh_env_free(env);
}

/* lh_rollout_generate_ids gives the tokens lh_rollout_generate gives for the same prompts and
 * streams (a worker's group equals the single-process loop's), rewards 0, and refuses prompts that
 * do not fit. */
static void test_generate_ids(void **state) {
  (void)state;
  lh_env_config ec;
  lh_env *env = NULL;
  assert_int_equal(lh_env_config_parse("arith:digits=1", &ec), LH_ERR_OK);
  assert_int_equal(lh_env_create(&ec, &env), LH_ERR_OK);
  lh_tokenizer *tok = NULL;
  char *json = lh_tokenizer_chars_json();
  assert_int_equal(lh_tokenizer_parse(json, strlen(json), "chars", &tok), LH_ERR_OK);
  free(json);
  lh_config cfg;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_QWEN2, &cfg), LH_ERR_OK);
  cfg.vocab_size = lh_tokenizer_vocab_size(tok);
  lh_model *m = NULL;
  assert_int_equal(lh_model_create(&cfg, &m), LH_ERR_OK);
  lh_model_init_random(m, 5);
  lh_infer *inf = NULL;
  assert_int_equal(lh_infer_from_model(m, &inf), LH_ERR_OK);
  lh_generator *g = NULL;
  assert_int_equal(lh_generator_create(inf, 4, 48, 0, &g), LH_ERR_OK);
  lh_gen_config gc = {.sample = lh_sample_defaults(), .seed = 9, .max_new = 6};
  uint64_t tasks[2] = {4, 11};
  lh_rollout_batch a;
  assert_int_equal(lh_rollout_generate(g, &gc, tok, env, LH_SPLIT_TRAIN, tasks, NULL, 2, 3, 60, &a),
                   LH_ERR_OK);
  int32_t *prompts[2];
  int plen[2];
  uint64_t bases[2] = {60, 63}; /* the streams lh_rollout_generate gave each group */
  for (int t = 0; t < 2; t++) {
    plen[t] = a.prompt_len[t * 3];
    prompts[t] = a.tokens + a.seq_start[t * 3];
  }
  lh_rollout_batch b[2];
  assert_int_equal(lh_rollout_generate_ids(g, &gc, LH_SPLIT_TRAIN, tasks,
                                           (const int32_t *const *)prompts, plen, bases, 2, 3, b),
                   LH_ERR_OK);
  for (int t = 0; t < 2; t++) {
    const lh_rollout_batch *o = &b[t];
    assert_true(o->n_groups == 1 && o->group_size == 3 && o->task_index[0] == tasks[t]);
    assert_true(o->seed == a.seed && o->stream_base == bases[t] && o->max_new == a.max_new);
    int off = a.seq_start[3 * t], N = a.seq_start[3 * t + 3] - off;
    for (int s = 0; s <= 3; s++)
      assert_int_equal(o->seq_start[s], a.seq_start[3 * t + s] - off);
    assert_memory_equal(o->tokens, a.tokens + off, (size_t)N * sizeof *o->tokens);
    assert_memory_equal(o->mu, a.mu + off, (size_t)N * sizeof *o->mu);
    for (int s = 0; s < 3; s++)
      assert_true(o->reward[s] == 0.0f && o->finish[s] == a.finish[3 * t + s]);
    lh_rollout_limits lim = limits();
    lim.vocab = lh_tokenizer_vocab_size(tok);
    assert_int_equal(lh_rollout_validate(o, &lim, "one group"), LH_ERR_OK);
    lh_rollout_batch_free(&b[t]);
  }
  /* prompts that leave no room, or are empty, are refused before anything runs */
  int too_long[2] = {plen[0], 48 - 6 + 1}, empty[2] = {0, plen[1]};
  assert_int_equal(lh_rollout_generate_ids(g, &gc, LH_SPLIT_TRAIN, tasks,
                                           (const int32_t *const *)prompts, too_long, bases, 2, 3,
                                           b),
                   LH_ERR_LIMIT);
  assert_int_equal(lh_rollout_generate_ids(g, &gc, LH_SPLIT_TRAIN, tasks,
                                           (const int32_t *const *)prompts, empty, bases, 2, 3, b),
                   LH_ERR_LIMIT);
  lh_rollout_batch_free(&a);
  lh_generator_free(g);
  lh_infer_free(inf);
  lh_model_free(m);
  lh_tokenizer_free(tok);
  lh_env_free(env);
}

/* lh_rollout_concat: groups in order, offsets shifted, the oldest version, old kept only when
 * every part has it, group sizes must agree. */
static void test_concat(void **state) {
  (void)state;
  arrays x, y;
  lh_rollout_batch a, b, c;
  make_batch(&a, &x, 1);
  make_batch(&b, &y, 1);
  b.version = 39;
  const lh_rollout_batch *parts[2] = {&a, &b};
  assert_int_equal(lh_rollout_concat(parts, 2, &c), LH_ERR_OK);
  assert_int_equal(c.n_groups, 4);
  assert_int_equal(c.version, 39);
  int N = a.seq_start[4];
  for (int s = 0; s <= 4; s++)
    assert_int_equal(c.seq_start[4 + s], N + a.seq_start[s]);
  assert_memory_equal(c.tokens + N, a.tokens, (size_t)N * sizeof *c.tokens);
  assert_memory_equal(c.old + N, a.old, (size_t)N * sizeof *c.old);
  assert_true(c.task_index[2] == a.task_index[0] && c.group_ok[3] == a.group_ok[1]);
  assert_true(c.reward[4] == a.reward[0] && c.finish[5] == a.finish[1]);
  lh_rollout_limits lim = limits();
  assert_int_equal(lh_rollout_validate(&c, &lim, "concat"), LH_ERR_OK);
  lh_rollout_batch_free(&c);
  b.old = NULL;
  assert_int_equal(lh_rollout_concat(parts, 2, &c), LH_ERR_OK);
  assert_null(c.old);
  lh_rollout_batch_free(&c);
  b.group_size = 4;
  b.n_groups = 1;
  assert_int_equal(lh_rollout_concat(parts, 2, &c), LH_ERR_MISMATCH);
  assert_int_equal(lh_rollout_concat(parts, 0, &c), LH_ERR_INVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),   cmocka_unit_test(test_independent_encoder),
      cmocka_unit_test(test_refusals),     cmocka_unit_test(test_score),
      cmocka_unit_test(test_generate_ids), cmocka_unit_test(test_concat),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
