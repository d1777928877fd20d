/* The adversary kit of `worker --adversary` (src/node/adversary.c, testing only) does what
 * docs/SECURITY.md says each mode does: quantisation to 4 and 8 bits per block of 32, other
 * weights within [0.8, 1.2] of the right ones, the sampling parameters, and each change to a
 * generated group (truncation included). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../src/node/node_impl.h"
#include "longhaul/tensor.h"

#define N 96 /* three blocks of 32 */

static void slab_of(uint16_t *s) {
  for (int i = 0; i < N; i++)
    s[i] = lh_bf16_from_f32((float)sin(i * 0.7) * (1.0f + (float)(i / 32)));
}

static void check_quant(int bits) {
  uint16_t s[N], q[N];
  slab_of(s);
  memcpy(q, s, sizeof s);
  lh__adv_weights(bits == 4 ? LH_ADV_QUANT4 : LH_ADV_QUANT8, q, N);
  float levels = (float)((1 << (bits - 1)) - 1);
  int changed = 0;
  for (int b = 0; b < N; b += 32) {
    float amax = 0;
    for (int i = b; i < b + 32; i++)
      amax = fmaxf(amax, fabsf(lh_f32_from_bf16(s[i])));
    for (int i = b; i < b + 32; i++) {
      float x = lh_f32_from_bf16(s[i]), y = lh_f32_from_bf16(q[i]);
      /* within half a step (and bf16 rounding), and on the grid of the block's levels */
      assert_true(fabsf(x - y) <= amax / levels * 0.5f + fabsf(y) * 0x1p-7f);
      float k = y / amax * levels;
      assert_true(fabsf(k - nearbyintf(k)) <= fabsf(k) * 0x1p-8f + 1e-3f); /* bf16 rounding */
      changed += s[i] != q[i];
    }
  }
  assert_true(changed > N / 4);
}

static void test_quant(void **state) {
  (void)state;
  check_quant(4);
  check_quant(8);
}

static void test_other_model(void **state) {
  (void)state;
  uint16_t s[N], o[N];
  slab_of(s);
  memcpy(o, s, sizeof s);
  lh__adv_weights(LH_ADV_OTHER_MODEL, o, N);
  int changed = 0;
  for (int i = 0; i < N; i++) {
    float x = lh_f32_from_bf16(s[i]), y = lh_f32_from_bf16(o[i]);
    if (x == 0) continue;
    float r = y / x;
    assert_true(r >= 0.79f && r <= 1.21f);
    changed += s[i] != o[i];
  }
  assert_true(changed > N * 3 / 4);
  memcpy(o, s, sizeof s);
  lh__adv_weights(LH_ADV_TOKENS, o, N); /* other modes leave the weights alone */
  assert_memory_equal(o, s, sizeof s);
}

static void test_sampling(void **state) {
  (void)state;
  lh_sample_params p = lh_sample_defaults();
  lh__adv_sampling(LH_ADV_TEMPERATURE, &p);
  assert_true(p.temperature == 0.9f && p.top_p == 1.0f);
  p = lh_sample_defaults();
  lh__adv_sampling(LH_ADV_TOP_P, &p);
  assert_true(p.temperature == 1.0f && p.top_p == 0.95f);
}

/* A group of 3 members: prompt {5, 6}, completions of 3, 4 and 2 tokens. */
static void group(lh_rollout_batch *b) {
  static const int len[3] = {5, 6, 4};
  memset(b, 0, sizeof *b);
  b->n_groups = 1;
  b->group_size = 3;
  b->version = 7;
  b->task_index = calloc(1, sizeof *b->task_index);
  b->group_ok = calloc(1, 1);
  b->group_ok[0] = 1;
  b->seq_start = calloc(4, sizeof *b->seq_start);
  b->prompt_len = calloc(3, sizeof *b->prompt_len);
  b->tokens = calloc(15, sizeof *b->tokens);
  b->mu = calloc(15, sizeof *b->mu);
  b->reward = calloc(3, sizeof *b->reward);
  b->correct = calloc(3, 1);
  b->well_formed = calloc(3, 1);
  b->finish = calloc(3, 1);
  int n = 0;
  for (int j = 0; j < 3; j++) {
    b->prompt_len[j] = 2;
    for (int i = 0; i < len[j]; i++, n++) {
      b->tokens[n] = i < 2 ? 5 + i : 10 * j + i;
      b->mu[n] = i < 2 ? 0.0f : -0.5f;
    }
    b->seq_start[j + 1] = n;
  }
}

static void test_batch(void **state) {
  (void)state;
  lh_rollout_batch b;
  group(&b);
  lh__adv_batch(LH_ADV_PROMPT, &b, 50);
  for (int j = 0; j < 3; j++)
    assert_int_equal(b.tokens[b.seq_start[j]], 6);
  lh_rollout_batch_free(&b);
  group(&b);
  lh__adv_batch(LH_ADV_TOKENS, &b, 50); /* member 1, its third completion token */
  assert_int_equal(b.tokens[b.seq_start[1] + 2 + 2], 15);
  lh_rollout_batch_free(&b);
  group(&b);
  lh__adv_batch(LH_ADV_DROP_MEMBER, &b, 50);
  assert_int_equal(b.group_size, 2);
  lh_rollout_batch_free(&b);
  group(&b);
  lh__adv_batch(LH_ADV_DUP_MEMBER, &b, 50);
  assert_int_equal(b.seq_start[3] - b.seq_start[2], 5);
  assert_memory_equal(b.tokens + b.seq_start[2], b.tokens, 5 * sizeof *b.tokens);
  lh_rollout_batch_free(&b);
  group(&b);
  lh__adv_batch(LH_ADV_LOGPROBS, &b, 50);
  assert_true(b.mu[0] == 0.0f && fabsf(b.mu[2] + 0.4f) < 1e-6f);
  lh_rollout_batch_free(&b);
  group(&b);
  lh__adv_batch(LH_ADV_REWARD, &b, 50);
  assert_true(b.reward[2] == 1.0f && b.correct[2] == 1);
  lh_rollout_batch_free(&b);
  group(&b);
  lh__adv_batch(LH_ADV_VERSION, &b, 50);
  assert_int_equal(b.version, 8);
  lh_rollout_batch_free(&b);
  /* truncate: completions of 3, 4, 2 tokens keep 1, 2, 1, prompts whole, packed end to end */
  group(&b);
  lh__adv_batch(LH_ADV_TRUNCATE, &b, 50);
  static const int32_t cut[10] = {5, 6, 2, 5, 6, 12, 13, 5, 6, 22};
  static const int starts[4] = {0, 3, 7, 10};
  for (int j = 0; j <= 3; j++)
    assert_int_equal(b.seq_start[j], starts[j]);
  assert_memory_equal(b.tokens, cut, sizeof cut);
  assert_true(b.mu[2] == -0.5f && b.mu[3] == 0.0f && b.mu[6] == -0.5f);
  lh_rollout_batch_free(&b);
  assert_string_equal(lh_node_adversary_names[LH_ADV_SLOWLORIS], "slowloris");
  assert_string_equal(lh_node_adversary_names[LH_ADV_SELECTIVE], "selective");
  assert_string_equal(lh_node_adversary_names[LH_ADV_TRUNCATE], "truncate");
  assert_null(lh_node_adversary_names[LH_ADV__COUNT]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_quant),
      cmocka_unit_test(test_other_model),
      cmocka_unit_test(test_sampling),
      cmocka_unit_test(test_batch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
