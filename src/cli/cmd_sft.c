/* `longhaul sft`: supervised fine-tuning on an environment's reference solutions, with the loss
 * on the response only (the bootstrap that gives RL a partly competent base policy). Each step
 * takes the next `batch` train tasks: prompt solution [eos] (the prompt's tokens exactly as
 * `generate` encodes them, no bos), loss weight 1 on the solution and eos. AdamW with linear warmup
 * and cosine decay; writes a Hugging Face directory. */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "longhaul/env.h"
#include "longhaul/model.h"
#include "longhaul/optim.h"
#include "longhaul/tokenizer.h"

#define CMD "sft"

static const lh__flag flags[] = {
    {"model", "DIR", true,
     "model directory with a tokenizer.json (init-model can write one), or a run directory: its "
     "latest checkpoint"},
    {"env", "SPEC", true,
     "environment: NAME or NAME:key=value,... (arith, countdown, sort, jsonl)"},
    {"out", "DIR", true,
     "where to write the trained model (config.json, model.safetensors, tokenizer.json)"},
    {"steps", "N", false, "optimiser steps (default 200)"},
    {"batch", "B", false, "sequences per step (default 32)"},
    {"lr", "LR", false, "peak learning rate (default 3e-3; 10% warmup, cosine to 10%)"},
    {"max-seq", "N", false,
     "tokens of prompt, solution and eos at most (default 512, at most the model's context)"},
    {"log-every", "N", false,
     "progress line every N steps when stderr is not a terminal (default 20)"},
    {"force", NULL, false, "write into --out even when it is a non-empty directory"},
    {"threads", "K", false, "threads (default: all cores)"},
};

/* Appends prompt solution [eos] of train task `index` to the packed batch; returns the new
 * token count, or -1 with a message: no solution, longer than max_seq, a token the model's
 * vocabulary does not have (a tokenizer.json larger than vocab_size), or nothing to learn (no
 * weighted token once the first token's weight is dropped). */
static int append_example(const lh_tokenizer *tok, const lh_config *c, const lh_env_task *t,
                          uint64_t index, int32_t *tokens, float *weight, int at, int max_seq) {
  if (!t->solution) {
    lh_errorf(LH_ERR_INVAL, "train task %llu has no reference solution", (unsigned long long)index);
    return -1;
  }
  int32_t *p = NULL, *s = NULL;
  size_t np = 0, ns = 0;
  int n = -1;
  if (lh_tokenizer_encode(tok, t->prompt, strlen(t->prompt), true, &p, &np) ||
      lh_tokenizer_encode(tok, t->solution, strlen(t->solution), true, &s, &ns))
    goto out;
  size_t len = np + ns + (c->eos_token_id >= 0);
  if (len > (size_t)max_seq) {
    lh_errorf(LH_ERR_LIMIT,
              "train task %llu: %zu tokens of prompt, solution%s; --max-seq allows %d",
              (unsigned long long)index, len, c->eos_token_id >= 0 ? " and eos" : "", max_seq);
    goto out;
  }
  n = at;
  for (size_t i = 0; i < np; i++)
    tokens[n] = p[i], weight[n++] = 0.0f;
  for (size_t i = 0; i < ns; i++)
    tokens[n] = s[i], weight[n++] = 1.0f;
  if (c->eos_token_id >= 0) tokens[n] = c->eos_token_id, weight[n++] = 1.0f;
  weight[at] = 0.0f; /* the first token of a sequence has no log-prob */
  int learned = 0;
  for (int i = at; i < n; i++)
    learned += weight[i] > 0.0f;
  if (!learned) {
    lh_errorf(LH_ERR_INVAL,
              "train task %llu: nothing to learn (%zu prompt and %zu solution tokens%s)",
              (unsigned long long)index, np, ns, c->eos_token_id >= 0 ? "" : ", no eos");
    n = -1;
    goto out;
  }
  for (int i = at; i < n; i++)
    if (tokens[i] >= c->vocab_size) {
      lh_errorf(LH_ERR_INVAL,
                "train task %llu: token %d is outside the model's vocabulary [0, %d) "
                "(tokenizer.json has more tokens than config.json's vocab_size)",
                (unsigned long long)index, tokens[i], c->vocab_size);
      n = -1;
      goto out;
    }
out:
  free(p);
  free(s);
  return n;
}

int lh__cmd_sft(int argc, char **argv) {
  lh__args a = {.cmd = CMD,
                .about = "Supervised training on an environment's reference solutions (loss on "
                         "the response only). Shows the mean loss and token accuracy of the "
                         "response (a live line on a terminal, else every --log-every steps). "
                         "SIGINT or SIGTERM stops after the current step and writes the model "
                         "trained so far (exit 130 or 143); a loss that is not finite stops it "
                         "with nothing written.",
                .flags = flags,
                .n_flags = sizeof flags / sizeof flags[0]};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_model(&a, "model")) != LH__ARGS_CONTINUE) return rc;
  long steps, batch, max_seq_arg, log_every, threads;
  double lr;
  if ((rc = lh__args_int(&a, "steps", 1, 1 << 24, 200, &steps)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "batch", 1, 4096, 32, &batch)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "max-seq", 2, 1 << 20, 512, &max_seq_arg)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "log-every", 1, 1 << 24, 20, &log_every)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "threads", 0, 1024, 0, &threads)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "lr", 0, 1, 3e-3, &lr)) != LH__ARGS_CONTINUE)
    return rc;
  lh_set_threads((int)threads);
  const char *dir = lh__args_str(&a, "model", NULL), *out_dir = lh__args_str(&a, "out", NULL);
  lh_model *m = NULL;
  lh_tokenizer *tok = NULL;
  lh_env *env = NULL;
  lh_train *t = NULL;
  lh_adamw *opt = NULL;
  int32_t *tokens = NULL;
  float *weight = NULL, *logprob = NULL;
  int *seq_start = NULL;
  char *path = lh_path_join(dir, "tokenizer.json");
  rc = LH__EXIT_FAIL;
  lh_env_config ecfg;
  lh_model_files files = {0};
  struct stat osb;
  if (stat(out_dir, &osb) == 0 && !S_ISDIR(osb.st_mode)) { /* found before training, not after */
    rc = lh__cli_error(CMD, LH__EXIT_USAGE, "--out %s exists and is not a directory", out_dir);
    goto out;
  }
  if (!lh__args_has(&a, "force")) { /* a directory of something else is not overwritten */
    DIR *d = opendir(out_dir);
    struct dirent *ent;
    int n_ent = 0;
    while (d && (ent = readdir(d)))
      n_ent += strcmp(ent->d_name, ".") && strcmp(ent->d_name, "..");
    if (d) closedir(d);
    if (n_ent > 0) {
      rc = lh__cli_error(CMD, LH__EXIT_USAGE,
                         "--out %s is not empty: choose another directory, or give --force to "
                         "write the model into it",
                         out_dir);
      goto out;
    }
  }
  lh_err ee = LH_ERR_OK;
  if (lh_model_load(dir, &m) || lh_tokenizer_load(path, &tok) || lh_model_files_read(dir, &files) ||
      (ee = lh_env_config_parse(lh__args_str(&a, "env", ""), &ecfg)) ||
      (ee = lh_env_create(&ecfg, &env))) {
    rc = lh__cli_fail_err(CMD, ee);
    goto out;
  }
  const lh_config *c = &m->cfg;
  int max_seq = c->max_positions < max_seq_arg ? c->max_positions : (int)max_seq_arg;
  if (batch * (long)max_seq > INT_MAX) {
    rc = lh__cli_error(CMD, LH__EXIT_USAGE, "--batch %ld x --max-seq %d is more than %d tokens",
                       batch, max_seq, INT_MAX);
    goto out;
  }
  int max_tokens = (int)batch * max_seq;
  if (lh_train_create(m, max_tokens, max_seq, &t)) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  lh_adamw_config ac = lh_adamw_defaults();
  ac.lr = (float)lr;
  ac.weight_decay = 0.0f;
  ac.schedule = LH_SCHEDULE_COSINE;
  ac.warmup_steps = (int)(steps / 10);
  ac.total_steps = (int)steps;
  ac.min_lr_ratio = 0.1f;
  if (lh_adamw_create(c, &ac, &opt)) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  tokens = lh_xmalloc((size_t)max_tokens * sizeof *tokens);
  weight = lh_xmalloc((size_t)max_tokens * sizeof *weight);
  logprob = lh_xmalloc((size_t)max_tokens * sizeof *logprob);
  seq_start = lh_xmalloc(((size_t)batch + 1) * sizeof *seq_start);
  /* A finite environment (jsonl) is checked whole before step 1, so a bad example late in the
   * file does not end the run after hours of training with nothing written. */
  uint64_t n_train = lh_env_size(env, LH_SPLIT_TRAIN), used = (uint64_t)steps * (uint64_t)batch;
  for (uint64_t i = 0; i < n_train && i < used; i++) {
    lh_env_task task;
    if (lh_env_task_get(env, LH_SPLIT_TRAIN, i, &task)) {
      rc = lh__cli_fail(CMD);
      goto out;
    }
    int got = append_example(tok, c, &task, i, tokens, weight, 0, max_seq);
    lh_env_task_clear(&task);
    if (got < 0) {
      rc = lh__cli_fail(CMD);
      goto out;
    }
  }
  uint64_t next = 0;
  double loss_sum = 0, correct = 0, counted = 0, t0 = lh_time_now();
  lh__progress_state bar = {.cmd = CMD, .total = steps, .every = (int)log_every, .tty = -1};
  lh__stop_on_signals();
  long step = 0;
  for (; step < steps && !lh__stop; step++) {
    int n = 0, s = 0;
    seq_start[0] = 0;
    while (s < batch) {
      lh_env_task task;
      if (lh_env_task_get(env, LH_SPLIT_TRAIN, next++, &task)) {
        rc = lh__cli_fail(CMD);
        goto out;
      }
      int got = append_example(tok, c, &task, next - 1, tokens, weight, n, max_seq);
      lh_env_task_clear(&task);
      if (got < 0) {
        rc = lh__cli_fail(CMD);
        goto out;
      }
      n = got;
      seq_start[++s] = n;
    }
    lh_batch b = {(int)batch, seq_start, tokens, weight};
    if (lh_batch_validate(t, &b)) {
      rc = lh__cli_fail(CMD);
      goto out;
    }
    float loss = lh_train_ce_step(t, &b, logprob);
    if (!isfinite(loss)) {
      lh__progress_end(&bar);
      rc = lh__cli_error(CMD, LH__EXIT_FAIL,
                         "step %ld: the loss is %g (a weight or log-prob is not finite); "
                         "stopped, nothing written to %s",
                         step + 1, (double)loss, out_dir);
      goto out;
    }
    lh_adamw_step(opt, m->params, lh_train_grads(t));
    /* a response token counts as right when the model gave it more than half the mass */
    for (int i = 0; i < n; i++)
      if (weight[i] > 0) correct += logprob[i] > -0.6931f, counted += 1;
    loss_sum += loss;
    long k = (step + 1) % log_every ? (step + 1) % log_every : log_every;
    char text[160];
    snprintf(text, sizeof text, "loss %.4f response-token accuracy %.3f lr %.2e", loss_sum / k,
             correct / (counted > 0 ? counted : 1), (double)lh_adamw_lr(&ac, step));
    bar.elapsed = lh_time_now() - t0;
    lh__progress(&bar, step + 1, text);
    if ((step + 1) % log_every == 0) loss_sum = correct = counted = 0;
  }
  lh__progress_end(&bar);
  if (lh_model_dir_save(m, out_dir, LH_SAVE_F32, &files)) {
    rc = lh__cli_fail(CMD);
    goto out;
  }
  if (lh__stop) {
    fprintf(stderr,
            "sft: stopped by %s after step %ld of %ld; wrote the model trained so far to %s\n",
            lh__stop_name(), step, steps, out_dir);
    rc = lh__stop_exit_code();
    goto out;
  }
  fprintf(stderr, "sft: wrote %s\n", out_dir);
  rc = LH__EXIT_OK;
out:
  free(path);
  lh_model_files_free(&files);
  free(tokens);
  free(weight);
  free(logprob);
  free(seq_start);
  lh_adamw_free(opt);
  lh_train_free(t);
  lh_env_free(env);
  lh_tokenizer_free(tok);
  lh_model_free(m);
  return rc;
}
