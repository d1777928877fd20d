/* lh_trainer: pending batches of any shape in any number, the staleness bound checked when a
 * batch is taken (older batches dropped and counted), a batch from a newer version refused, a
 * non-finite loss stopping the trainer, and the state file: a round trip restores the counters,
 * moments and pending batches, and a state of another step or of other weights is refused; and
 * the behaviour log-probs of a kept older policy (lh_trainer_recompute). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "longhaul/tensor.h"
#include "longhaul/trainer.h"

/* A batch of `groups` groups of 2 whose rewards differ (1, 0): every group carries signal.
 * Prompts of 2 tokens, completions of 1 + (t % 3) tokens, so batches differ in shape. */
static void make_batch(lh_rollout_batch *b, int groups, int64_t version) {
  int n = 2 * groups;
  memset(b, 0, sizeof *b);
  b->n_groups = groups;
  b->group_size = 2;
  b->version = version;
  b->sample = (lh_sample_params){1.0f, 0, 1.0f, 0.0f};
  b->max_new = 4;
  b->task_index = calloc((size_t)groups, 8);
  b->group_ok = calloc((size_t)groups, 1);
  b->seq_start = calloc((size_t)n + 1, sizeof(int));
  b->prompt_len = calloc((size_t)n, sizeof(int));
  b->reward = calloc((size_t)n, 4);
  b->correct = calloc((size_t)n, 1);
  b->well_formed = calloc((size_t)n, 1);
  b->finish = calloc((size_t)n, 1);
  b->tokens = calloc((size_t)n * 6, 4);
  b->mu = calloc((size_t)n * 6, 4);
  int at = 0;
  for (int s = 0; s < n; s++) {
    int t = s / 2, len = 2 + 1 + t % 3;
    b->group_ok[t] = 1;
    b->task_index[t] = (uint64_t)t;
    b->prompt_len[s] = 2;
    b->reward[s] = s % 2 ? 0.0f : 1.0f;
    b->correct[s] = s % 2 == 0;
    for (int i = 0; i < len; i++) {
      b->tokens[at + i] = 3 + (s * 7 + i * 5) % 200;
      b->mu[at + i] = i < 2 ? 0.0f : -1.5f;
    }
    at += len;
    b->seq_start[s + 1] = at;
  }
}

static lh_trainer *make_trainer(int staleness, uint64_t seed) {
  lh_config c;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_QWEN2, &c), LH_ERR_OK);
  lh_model *m = NULL;
  assert_int_equal(lh_model_create(&c, &m), LH_ERR_OK);
  lh_model_init_random(m, seed);
  lh_trainer_config tc = lh_trainer_defaults();
  tc.max_staleness = staleness;
  tc.max_seq = 16;
  lh_trainer *t = NULL;
  assert_int_equal(lh_trainer_create(m, &tc, &t), LH_ERR_OK);
  return t;
}

static void submit(lh_trainer *t, int groups, int64_t version) {
  lh_rollout_batch b;
  make_batch(&b, groups, version);
  assert_int_equal(lh_trainer_submit(t, &b), LH_ERR_OK);
  assert_null(b.tokens); /* taken */
  lh_rollout_batch_free(&b);
}

static void test_staleness_bound(void **state) {
  (void)state;
  lh_trainer *t = make_trainer(1, 3);
  lh_trainer_step_stats st;
  assert_int_equal(lh_trainer_step(t, &st), LH_ERR_NOTFOUND); /* nothing pending */
  /* batches of three shapes, all from version 0 */
  submit(t, 1, 0);
  submit(t, 3, 0);
  submit(t, 2, 0);
  assert_int_equal(lh_trainer_pending(t), 3);
  assert_int_equal(lh_trainer_step(t, &st), LH_ERR_OK);
  assert_int_equal(st.staleness, 0);
  assert_int_equal(st.groups_used, 1);
  assert_int_equal(st.batches_dropped, 0);
  assert_true(st.update.n_updates == 1 && isfinite(st.update.loss.loss));
  assert_int_equal(lh_trainer_step(t, &st), LH_ERR_OK); /* 1 version old: within the bound */
  assert_int_equal(st.staleness, 1);
  assert_int_equal(st.groups_used, 3);
  /* 2 versions old now: dropped, counted, and nothing is left */
  assert_int_equal(lh_trainer_step(t, &st), LH_ERR_NOTFOUND);
  assert_int_equal(st.batches_dropped, 1);
  assert_int_equal(lh_trainer_pending(t), 0);
  assert_int_equal(lh_trainer_version(t), 2);
  /* a batch claiming a version the trainer has not reached is refused */
  lh_rollout_batch b;
  make_batch(&b, 1, 3);
  assert_int_equal(lh_trainer_submit(t, &b), LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "version 3, the policy is at 2"));
  lh_rollout_batch_free(&b);
  assert_int_equal(lh_trainer_submitted(t), 3);
  lh_trainer_free(t);
  lh_trainer_free(NULL);
}

static void test_nonfinite_loss(void **state) {
  (void)state;
  lh_trainer *t = make_trainer(0, 4);
  submit(t, 2, 0);
  lh_trainer_model(t)->params[5] = NAN; /* an embedding weight */
  lh_trainer_step_stats st;
  assert_int_equal(lh_trainer_step(t, &st), LH_ERR_NONFINITE);
  assert_non_null(strstr(lh_last_error(), "update 1: the loss is nan"));
  assert_int_equal(lh_trainer_version(t), 0);
  lh_trainer_free(t);
}

static void test_state_round_trip(void **state) {
  (void)state;
  char path[64];
  snprintf(path, sizeof path, "/tmp/longhaul-test-trainer.%d.safetensors", (int)getpid());
  lh_trainer *a = make_trainer(2, 5);
  submit(a, 2, 0);
  submit(a, 1, 0);
  lh_trainer_step_stats st;
  assert_int_equal(lh_trainer_step(a, &st), LH_ERR_OK);
  submit(a, 3, 1);
  assert_int_equal(lh_trainer_save(a, path), LH_ERR_OK);
  size_t np = lh_trainer_model(a)->n_params;
  float *saved = malloc(np * sizeof *saved);
  memcpy(saved, lh_trainer_model(a)->params, np * sizeof *saved);

  /* a trainer on the same weights restores everything */
  lh_trainer *b = make_trainer(2, 5);
  lh_model *ma = lh_trainer_model(a), *mb = lh_trainer_model(b);
  memcpy(mb->params, ma->params, ma->n_params * sizeof(float));
  assert_int_equal(lh_trainer_load(b, path, 2), LH_ERR_MISMATCH); /* the state is of step 1 */
  assert_non_null(strstr(lh_last_error(), "the trainer state is of step 1"));
  assert_int_equal(lh_trainer_pending(b), 0); /* unchanged on error */
  assert_int_equal(lh_trainer_load(b, path, 1), LH_ERR_OK);
  assert_int_equal(lh_trainer_version(b), 1);
  assert_int_equal(lh_trainer_submitted(b), 3);
  assert_int_equal(lh_trainer_pending(b), 2);
  /* both continue identically */
  lh_trainer_step_stats sa, sb;
  assert_int_equal(lh_trainer_step(a, &sa), LH_ERR_OK);
  assert_int_equal(lh_trainer_step(b, &sb), LH_ERR_OK);
  assert_int_equal(sa.groups_used, 1);
  assert_true(sa.update.loss.loss == sb.update.loss.loss);
  assert_memory_equal(ma->params, mb->params, ma->n_params * sizeof(float));

  /* other weights: refused by the hash */
  lh_trainer *c = make_trainer(2, 6);
  assert_int_equal(lh_trainer_load(c, path, 1), LH_ERR_MISMATCH);
  assert_non_null(strstr(lh_last_error(), "belongs to weights with BLAKE2b"));
  /* a tighter staleness bound than the pending batches allow: the version-0 batch is 1 old */
  lh_trainer *d = make_trainer(0, 5);
  memcpy(lh_trainer_model(d)->params, saved, np * sizeof *saved);
  assert_int_equal(lh_trainer_load(d, path, 1), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "queue.0: version 0, expected 1..1"));
  lh_trainer_free(d);
  free(saved);
  unlink(path);
  lh_trainer_free(a);
  lh_trainer_free(b);
  lh_trainer_free(c);
}

/* Two workers' batches of version 0 with no staleness allowed: after one step the second is too
 * old. The saved state leaves it out, so a trainer on the same weights loads it back (the state
 * held a batch load refused). A sequence longer than max_seq is refused at submit. */
static void test_save_skips_stale(void **state) {
  (void)state;
  char path[64];
  snprintf(path, sizeof path, "/tmp/longhaul-test-trainer-st.%d.safetensors", (int)getpid());
  lh_trainer *a = make_trainer(0, 8);
  submit(a, 1, 0);
  submit(a, 2, 0);
  lh_trainer_step_stats st;
  assert_int_equal(lh_trainer_step(a, &st), LH_ERR_OK);
  assert_int_equal(lh_trainer_pending(a), 1);
  assert_int_equal(lh_trainer_save(a, path), LH_ERR_OK);
  lh_trainer *b = make_trainer(0, 8);
  lh_model *ma = lh_trainer_model(a);
  memcpy(lh_trainer_model(b)->params, ma->params, ma->n_params * sizeof(float));
  assert_int_equal(lh_trainer_load(b, path, 1), LH_ERR_OK);
  assert_int_equal(lh_trainer_pending(b), 0);
  /* too long for max_seq 16: refused, and the batch stays the caller's */
  lh_rollout_batch big;
  make_batch(&big, 1, 1);
  big.max_new = 20;
  int extra = 14, N = big.seq_start[2];
  int32_t *tok = calloc((size_t)(N + extra), 4);
  float *mu = calloc((size_t)(N + extra), 4);
  memcpy(tok, big.tokens, (size_t)N * 4);
  memcpy(mu, big.mu, (size_t)N * 4);
  for (int i = N; i < N + extra; i++)
    tok[i] = 5, mu[i] = -1.0f;
  free(big.tokens);
  free(big.mu);
  big.tokens = tok;
  big.mu = mu;
  big.seq_start[2] += extra;
  assert_int_equal(lh_trainer_submit(b, &big), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "sequence 1 has 17 tokens, more than 16"));
  assert_non_null(big.tokens);
  big.tokens[0] = 9999; /* outside the vocabulary: the batch is checked */
  big.seq_start[2] -= extra;
  assert_int_equal(lh_trainer_submit(b, &big), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "token 0 is 9999"));
  lh_rollout_batch_free(&big);
  unlink(path);
  lh_trainer_free(a);
  lh_trainer_free(b);
}

/* lh_trainer_recompute: the log-probs under a kept bf16 policy. With weights that are exactly
 * bf16 values, the log-probs of version 0 computed from its slab equal those of a training
 * forward on the fp32 master weights, and still do after an update moved the weights; a batch
 * that has them is submitted without recomputing. */
static void test_recompute_older_version(void **state) {
  (void)state;
  lh_trainer *t = make_trainer(2, 6);
  lh_model *m = lh_trainer_model(t);
  for (size_t i = 0; i < m->n_params; i++)
    m->params[i] = lh_f32_from_bf16(lh_bf16_from_f32(m->params[i]));
  assert_int_equal(lh_infer_update(lh_trainer_policy(t), m), LH_ERR_OK);
  size_t n = 0;
  const uint16_t *p = lh_infer_bf16(lh_trainer_policy(t), &n);
  uint16_t *v0 = malloc(n * sizeof *v0);
  memcpy(v0, p, n * sizeof *v0);
  /* the masters' forward, before any update */
  lh_rollout_batch ref, a, c;
  make_batch(&ref, 2, 0);
  int N = ref.seq_start[4];
  lh_train *tr = NULL;
  assert_int_equal(lh_train_create(m, 16, 16, &tr), LH_ERR_OK);
  assert_int_equal(lh_rollout_recompute(tr, &ref), LH_ERR_OK);
  lh_train_free(tr);
  make_batch(&a, 2, 0);
  assert_int_equal(lh_trainer_recompute(t, v0, n, &a), LH_ERR_OK);
  assert_memory_equal(a.old, ref.old, (size_t)N * sizeof *a.old);
  assert_int_equal(lh_trainer_submit(t, &a), LH_ERR_OK);
  lh_trainer_step_stats st;
  assert_int_equal(lh_trainer_step(t, &st), LH_ERR_OK); /* the weights move */
  assert_true(st.update.n_updates == 1);
  make_batch(&c, 2, 0);
  assert_int_equal(lh_trainer_recompute(t, v0, n, &c), LH_ERR_OK);
  assert_memory_equal(c.old, ref.old, (size_t)N * sizeof *c.old);
  assert_int_equal(lh_trainer_recompute(t, v0, n - 1, &c), LH_ERR_MISMATCH);
  lh_rollout_batch_free(&c);
  lh_rollout_batch_free(&ref);
  free(v0);
  lh_trainer_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_staleness_bound),  cmocka_unit_test(test_recompute_older_version),
      cmocka_unit_test(test_nonfinite_loss),   cmocka_unit_test(test_state_round_trip),
      cmocka_unit_test(test_save_skips_stale),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
