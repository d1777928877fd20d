/* RL on rollouts: generation (prompts encoded with special tokens; a prompt that leaves no
 * room for max_new tokens skips its group, not the batch), batch assembly (advantages per group,
 * skipped and failed groups left out, loss weights on completions only) and the policy update
 * (a positive advantage raises the completion's log-prob, a negative one lowers it; minibatches
 * split at group boundaries). */
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

#include "longhaul/infer.h"
#include "longhaul/rl.h"

/* Three train tasks: a short prompt, one longer than the generator leaves room for, and one
 * that spells the chars tokenizer's <|eos|> (id 2). Generator: 20 positions, 4 new tokens, so
 * prompts of up to 16 tokens. */
static void test_rollout_prompts(void **state) {
  (void)state;
  char train[] = "/tmp/longhaul-test-rl-XXXXXX", test[] = "/tmp/longhaul-test-rl-XXXXXX";
  int fd = mkstemp(train), fd2 = mkstemp(test);
  assert_true(fd >= 0 && fd2 >= 0);
  const char *rows =
      "{\"prompt\": \"ab\", \"answer\": \"x\"}\n"
      "{\"prompt\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\", \"answer\": \"x\"}\n"
      "{\"prompt\": \"a<|eos|>b\", \"answer\": \"x\"}\n";
  assert_int_equal(write(fd, rows, strlen(rows)), (ssize_t)strlen(rows));
  const char *test_rows = "{\"prompt\": \"ba\", \"answer\": \"y\"}\n";
  assert_int_equal(write(fd2, test_rows, strlen(test_rows)), (ssize_t)strlen(test_rows));
  close(fd);
  close(fd2);
  char spec[200];
  snprintf(spec, sizeof spec, "jsonl:path=%s,test=%s", train, test);
  lh_env_config ec;
  lh_env *env = NULL;
  assert_int_equal(lh_env_config_parse(spec, &ec), LH_ERR_OK);
  assert_int_equal(lh_env_create(&ec, &env), LH_ERR_OK);

  lh_tokenizer *tok = NULL;
  char *json = lh_tokenizer_chars_json();
  assert_int_equal(lh_tokenizer_parse(json, strlen(json), "chars", &tok), LH_ERR_OK);
  free(json);
  lh_config c;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_QWEN2, &c), LH_ERR_OK);
  c.vocab_size = lh_tokenizer_vocab_size(tok);
  c.eos_token_id = -1;
  lh_model *m = NULL;
  lh_infer *inf = NULL;
  lh_generator *g = NULL;
  assert_int_equal(lh_model_create(&c, &m), LH_ERR_OK);
  lh_model_init_random(m, 5);
  assert_int_equal(lh_infer_from_model(m, &inf), LH_ERR_OK);
  assert_int_equal(lh_generator_create(inf, 2, 20, 0, &g), LH_ERR_OK);
  lh_gen_config gc = lh_gen_defaults();
  gc.max_new = 4;
  gc.tok = tok;

  uint64_t tasks[3] = {0, 1, 2};
  lh_rollout_batch b;
  assert_int_equal(lh_rollout_generate(g, &gc, tok, env, LH_SPLIT_TRAIN, tasks, NULL, 3, 2, 0, &b),
                   LH_ERR_OK);
  assert_int_equal(b.group_ok[0], 1);
  assert_int_equal(b.group_ok[1], 0); /* 40 tokens: skipped, the batch goes on */
  assert_int_equal(b.group_ok[2], 1);
  assert_int_equal(b.seq_start[2], b.seq_start[4]); /* the skipped group holds no tokens */
  static const int kept[4] = {0, 1, 4, 5};
  for (int i = 0; i < 4; i++) { /* every completion got its 4 tokens */
    int s = kept[i];
    assert_int_equal(b.seq_start[s + 1] - b.seq_start[s], b.prompt_len[s] + 4);
  }
  const int32_t *p = b.tokens + b.seq_start[4];
  assert_int_equal(b.prompt_len[4], 3); /* a <|eos|> b */
  assert_int_equal(p[0], lh_tokenizer_find(tok, "a"));
  assert_int_equal(p[1], 2);
  assert_int_equal(p[2], lh_tokenizer_find(tok, "b"));
  lh_rollout_batch_free(&b);
  lh_generator_free(g);
  lh_infer_free(inf);
  lh_model_free(m);
  lh_tokenizer_free(tok);
  lh_env_free(env);
  unlink(train);
  unlink(test);
}

/* 3 groups of 2: group 0 rewards (1, 0), group 1 (0, 0), group 2 failed; prompts of 2 tokens,
 * completions of 3 and 1 tokens. */
static void make_rollouts(lh_rollout_batch *b) {
  static uint64_t task_index[3] = {7, 8, 9};
  static uint8_t group_ok[3] = {1, 1, 0};
  static int seq_start[7] = {0, 5, 8, 10, 13, 13, 13};
  static int prompt_len[6] = {2, 2, 2, 2, 0, 0};
  static int32_t tokens[13] = {10, 11, 20, 21, 2, 10, 11, 22, 12, 13, 30, 12, 13};
  static float mu[13] = {0, 0, -0.5f, -0.25f, -0.125f, 0, 0, -1, 0, 0, -2, 0, 0};
  static float reward[6] = {1, 0, 0, 0, 0, 0};
  static uint8_t flags[6] = {0};
  memset(b, 0, sizeof *b);
  b->n_groups = 3;
  b->group_size = 2;
  b->task_index = task_index;
  b->group_ok = group_ok;
  b->seq_start = seq_start;
  b->prompt_len = prompt_len;
  b->tokens = tokens;
  b->mu = mu;
  b->reward = reward;
  b->correct = b->well_formed = b->finish = flags;
}

static void test_assemble(void **state) {
  (void)state;
  lh_rollout_batch rb;
  make_rollouts(&rb);
  lh_adv_config ac = {LH_ADV_GRPO, 1, 0.0f};
  lh_rl_batch b;
  assert_int_equal(lh_rl_batch_assemble(&rb, &ac, &b), LH_ERR_OK);
  assert_int_equal(b.n_seqs, 2);
  assert_int_equal(b.n_groups_used, 1);
  assert_int_equal(b.n_groups_skipped, 1);
  assert_int_equal(b.n_groups_failed, 1);
  assert_int_equal(b.seq_start[0], 0);
  assert_int_equal(b.seq_start[1], 5);
  assert_int_equal(b.seq_start[2], 8);
  static const float want_w[8] = {0, 0, 1, 1, 1, 0, 0, 1};
  /* rewards (1, 0): mean 0.5, sample std sqrt(0.5); A = +-0.5 / sqrt(0.5) = +-sqrt(0.5) */
  double a = sqrt(0.5);
  for (int i = 0; i < 8; i++) {
    assert_true(b.weight[i] == want_w[i]);
    assert_int_equal(b.tokens[i], rb.tokens[i]);
    assert_true(b.mu[i] == rb.mu[i]);
    assert_true(fabs(b.adv[i] - (i < 5 ? a : -a)) < 1e-6);
  }
  assert_int_equal(b.group[0], 0);
  assert_int_equal(b.group[1], 0);
  lh_rl_batch_free(&b);
}

/* Log-probs of a batch under the model's current weights. */
static void logprobs(lh_train *t, const lh_rl_batch *b, float *out) {
  lh_batch tb = {b->n_seqs, b->seq_start, b->tokens, b->weight};
  lh_train_forward(t, &tb, out);
}

static double completion_logp(const lh_rl_batch *b, const float *lp, int s) {
  double sum = 0.0;
  for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i++)
    if (b->weight[i] > 0) sum += lp[i];
  return sum;
}

/* Two groups (rewards (1, 0) each): the rewarded completion of each group gains log-prob, the
 * other loses it, for PPO with one minibatch and decoupled PPO with two. */
static void run_update(lh_loss_kind kind, int minibatches, int want_updates) {
  lh_config c;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_QWEN2, &c), LH_ERR_OK);
  lh_model *m;
  assert_int_equal(lh_model_create(&c, &m), LH_ERR_OK);
  lh_model_init_random(m, 3);
  lh_train *t;
  assert_int_equal(lh_train_create(m, 64, 16, &t), LH_ERR_OK);
  lh_adamw_config oc = lh_adamw_defaults();
  oc.lr = 1e-2f;
  oc.weight_decay = 0.0f;
  lh_adamw *opt;
  assert_int_equal(lh_adamw_create(&c, &oc, &opt), LH_ERR_OK);

  static int seq_start[5] = {0, 5, 9, 14, 18};
  static int prompt_len[4] = {2, 2, 2, 2};
  static int32_t tokens[18] = {5, 6, 40, 41, 42, 5, 6, 50, 51, 7, 8, 60, 61, 62, 7, 8, 70, 71};
  static float reward[4] = {1, 0, 1, 0};
  static uint8_t ok[2] = {1, 1}, flags[4] = {0};
  static uint64_t task_index[2] = {0, 1};
  float mu[18] = {0};
  lh_rollout_batch rb = {.n_groups = 2,
                         .group_size = 2,
                         .task_index = task_index,
                         .group_ok = ok,
                         .seq_start = seq_start,
                         .prompt_len = prompt_len,
                         .tokens = tokens,
                         .mu = mu,
                         .reward = reward,
                         .correct = flags,
                         .well_formed = flags,
                         .finish = flags};
  lh_adv_config ac = {LH_ADV_GRPO, 1, 1e-6f};
  lh_rl_batch b;
  assert_int_equal(lh_rl_batch_assemble(&rb, &ac, &b), LH_ERR_OK);
  float before[18], after[18];
  logprobs(t, &b, before);
  memcpy(b.mu, before, sizeof before); /* on-policy: mu is the current policy */
  lh_loss_config lc = lh_loss_defaults();
  lc.kind = kind;
  lh_rl_step_stats st;
  assert_int_equal(lh_rl_update(t, opt, m, &lc, minibatches, &b, &st), LH_ERR_OK);
  assert_int_equal(st.n_updates, want_updates);
  /* One minibatch is on-policy (pi = mu); with two, the second sees the first one's update. */
  if (want_updates == 1)
    assert_true(fabs(st.loss.ratio_mean - 1.0) < 1e-6);
  else
    assert_true(fabs(st.loss.ratio_mean - 1.0) > 1e-4);
  logprobs(t, &b, after);
  for (int s = 0; s < 4; s++) {
    double d = completion_logp(&b, after, s) - completion_logp(&b, before, s);
    if (s % 2 == 0)
      assert_true(d > 0.01);
    else
      assert_true(d < -0.01);
  }
  lh_rl_batch_free(&b);
  lh_adamw_free(opt);
  lh_train_free(t);
  lh_model_free(m);
}

static void test_update_ppo(void **state) {
  (void)state;
  run_update(LH_LOSS_PPO, 1, 1);
}

static void test_update_decoupled_minibatches(void **state) {
  (void)state;
  run_update(LH_LOSS_DECOUPLED, 2, 2);
  run_update(LH_LOSS_TIS, 5, 2); /* at most one minibatch per group */
}

static void test_update_empty(void **state) {
  (void)state;
  lh_rl_batch b = {0};
  lh_rl_step_stats st;
  lh_loss_config lc = lh_loss_defaults();
  assert_int_equal(lh_rl_update(NULL, NULL, NULL, &lc, 1, &b, &st), LH_ERR_OK);
  assert_int_equal(st.n_updates, 0);
}

/* A seed above INT64_MAX cannot be recorded in run.json (signed 64-bit JSON integers): refused
 * before the run directory is created. */
static void test_run_seed_limit(void **state) {
  (void)state;
  char out[64];
  snprintf(out, sizeof out, "/tmp/longhaul-test-rl-seed.%d", (int)getpid());
  lh_rl_run_config c = lh_rl_run_defaults();
  c.model_dir = "/nonexistent-model";
  c.env_spec = "arith";
  c.out_dir = out;
  c.seed = (uint64_t)INT64_MAX + 1;
  lh_err e = lh_rl_run(&c, NULL);
  bool created = access(out, F_OK) == 0;
  if (created) {
    char path[128];
    snprintf(path, sizeof path, "%s/run.json", out);
    remove(path);
    rmdir(out);
  }
  assert_int_equal(e, LH_ERR_LIMIT);
  assert_false(created);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rollout_prompts), cmocka_unit_test(test_assemble),
      cmocka_unit_test(test_update_ppo),      cmocka_unit_test(test_update_decoupled_minibatches),
      cmocka_unit_test(test_update_empty),    cmocka_unit_test(test_run_seed_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
