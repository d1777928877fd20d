/* `longhaul bench SUBCOMMAND`: throughput measurements. `bench train` times full training steps
 * (forward + backward + AdamW) on fixed pseudo-random tokens and reports tokens/s, seconds per
 * step and GFLOP/s, as a line for people or one JSON object (--json) for scripts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longhaul/model.h"
#include "longhaul/rl.h"

#define BENCH_SEED 0x6c6f6e67ull /* "long": the same tokens on every run */

static const lh__flag train_flags[] = {
    {"model", "DIR", true,
     "model directory (config.json + model.safetensors), or a run directory: its latest "
     "checkpoint"},
    {"batch", "B", true, "sequences per step"},
    {"seq", "T", true, "tokens per sequence (2 to max_position_embeddings)"},
    {"steps", "N", true, "timed steps (after one untimed warmup step)"},
    {"threads", "K", false, "threads (default: all cores)"},
    {"json", NULL, false, "print one JSON object instead of a sentence"},
};

static int bench_train(int argc, char **argv) {
  const char *cmd = "bench train";
  lh__args a = {.cmd = cmd,
                .about = "Times N training steps (forward, backward, AdamW update) on B random "
                         "sequences of T tokens\nand reports tokens/s, seconds per step and "
                         "GFLOP/s.",
                .flags = train_flags,
                .n_flags = (int)(sizeof train_flags / sizeof train_flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_model(&a, "model")) != LH__ARGS_CONTINUE) return rc;
  long batch = 0, seq = 0, steps = 0, threads = 0;
  if ((rc = lh__args_int(&a, "batch", 1, 1 << 20, 0, &batch)) != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_int(&a, "seq", 2, LH_MAX_POSITIONS, 0, &seq)) != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_int(&a, "steps", 1, 1000000, 0, &steps)) != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_int(&a, "threads", 0, 4096, 0, &threads)) != LH__ARGS_CONTINUE) return rc;
  if (batch * seq > (1L << 30))
    return lh__cli_error(cmd, LH__EXIT_USAGE, "--batch %ld x --seq %ld is more than 2^30 tokens",
                         batch, seq);
  bool json = lh__args_has(&a, "json");
  lh_set_threads((int)threads);

  lh_model *m = NULL;
  if (lh_model_load(lh__args_str(&a, "model", NULL), &m) != LH_ERR_OK) return lh__cli_fail(cmd);
  if (seq > m->cfg.max_positions) {
    rc = lh__cli_error(cmd, LH__EXIT_USAGE,
                       "--seq: %ld is more than the model's max_position_embeddings %d", seq,
                       m->cfg.max_positions);
    lh_model_free(m);
    return rc;
  }

  int B = (int)batch, T = (int)seq, N = B * T;
  lh_train *t = NULL;
  lh_adamw *opt = NULL;
  /* the training state first: it refuses sizes no machine holds, which the batch's own arrays
   * (a few bytes per token, far less than the state) then fit beside */
  if (lh_train_create(m, N, T, &t) != LH_ERR_OK) {
    rc = lh__cli_fail(cmd);
    lh_model_free(m);
    return rc;
  }
  int32_t *tokens = lh_xmalloc((size_t)N * sizeof *tokens);
  float *weight = lh_xmalloc((size_t)N * sizeof *weight);
  float *logprob = lh_xmalloc((size_t)N * sizeof *logprob);
  int *seq_start = lh_xmalloc(((size_t)B + 1) * sizeof *seq_start);
  for (int i = 0; i < N; i++) {
    uint32_t w[4];
    lh_philox(BENCH_SEED, 0, (uint64_t)i, w);
    tokens[i] = (int32_t)(w[0] % (uint32_t)m->cfg.vocab_size);
    weight[i] = i % T == 0 ? 0.0f : 1.0f;
  }
  for (int s = 0; s <= B; s++)
    seq_start[s] = s * T;
  lh_batch b = {.n_seqs = B, .seq_start = seq_start, .tokens = tokens, .loss_weight = weight};

  lh_adamw_config ocfg = lh_adamw_defaults();
  if (lh_batch_validate(t, &b) != LH_ERR_OK || lh_adamw_create(&m->cfg, &ocfg, &opt) != LH_ERR_OK) {
    rc = lh__cli_fail(cmd);
    goto out;
  }
  float loss = lh_train_ce_step(t, &b, logprob); /* warmup: caches, thread pool, pages */
  lh_adamw_step(opt, m->params, lh_train_grads(t));
  double t0 = lh_time_now();
  for (long step = 0; step < steps; step++) {
    loss = lh_train_ce_step(t, &b, logprob);
    lh_adamw_step(opt, m->params, lh_train_grads(t));
  }
  double elapsed = lh_time_now() - t0;
  if (elapsed <= 0) elapsed = 1e-9;
  double tokens_per_s = (double)N * (double)steps / elapsed;
  double step_s = elapsed / (double)steps;
  double gflops = lh_train_flops(&m->cfg, &b) * (double)steps / elapsed / 1e9;
  int nthreads = lh_threads();
  if (json) {
    printf("{\"command\":\"bench train\",\"tokens_per_s\":%.6g,\"step_s\":%.6g,\"gflops\":%.6g,"
           "\"threads\":%d,\"batch\":%d,\"seq\":%d,\"params\":%zu,\"steps\":%ld,\"loss\":",
           tokens_per_s, step_s, gflops, nthreads, B, T, m->n_params, steps);
    if (isfinite(loss))
      printf("%.6g}\n", (double)loss);
    else
      printf("null}\n");
  } else {
    printf("bench train: %.0f tokens/s, %.4g s/step, %.3g GFLOP/s (batch %d x seq %d, %ld steps, "
           "%d threads, %.2fM params, loss %.4g)\n",
           tokens_per_s, step_s, gflops, B, T, steps, nthreads, (double)m->n_params / 1e6,
           (double)loss);
  }
  rc = lh__cli_flush_stdout(cmd);
out:
  lh_adamw_free(opt);
  lh_train_free(t);
  free(tokens);
  free(weight);
  free(logprob);
  free(seq_start);
  lh_model_free(m);
  return rc;
}

static const lh__subcommand subcommands[] = {
    {"train", bench_train, "training steps per second (forward + backward + AdamW)"},
    {"generate", lh__bench_generate, "prefill and decode tokens per second of the rollout engine"},
};

int lh__cmd_bench(int argc, char **argv) {
  return lh__subcommands("bench", subcommands, (int)(sizeof subcommands / sizeof subcommands[0]),
                         argc, argv);
}
