/* `longhaul rl`: the single-process RL loop (lh_rl_run): sample a group of completions per
 * prompt, score them, compute group-relative advantages, update with an off-policy-corrected
 * policy loss, repeat; --staleness K puts K batches between generation and training. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "longhaul/rl.h"

#define CMD "rl"

static const lh__flag flags[] = {
    {"model", "DIR", true, "starting policy: a model directory with a tokenizer.json"},
    {"env", "SPEC", true,
     "environment: NAME or NAME:key=value,... (arith, countdown, sort, "
     "jsonl, exec)"},
    {"out", "RUN", true, "run directory: run.json, metrics.jsonl, checkpoints/step-NNNNNN, latest"},
    {"steps", "N", false, "policy updates in total (default 100)"},
    {"group", "G", false, "completions per prompt (default 8)"},
    {"prompts", "P", false, "prompts per step (default 16)"},
    {"max-new", "N", false, "completion tokens at most (default 32)"},
    {"max-prompt", "N", false,
     "prompt tokens at most; tasks with longer prompts are skipped "
     "(default 256)"},
    {"staleness", "K", false, "train on rollouts of the policy K versions back (default 0)"},
    {"loss", "KIND", false, "ppo | tis | mis | decoupled (default tis)"},
    {"eps-low", "E", false, "PPO clip below 1 (default 0.2)"},
    {"eps-high", "E", false, "PPO clip above 1 (default 0.28)"},
    {"is-cap", "C", false, "tis, decoupled: truncation of the behaviour weight (default 2)"},
    {"adv", "KIND", false, "grpo | drgrpo (no std normalisation) | rloo (default grpo)"},
    {"agg", "KIND", false, "loss aggregation: token | seq | const (default token)"},
    {"kl-beta", "B", false, "k3 KL penalty to the starting model, weight B (default 0: off)"},
    {"minibatches", "M", false, "optimiser steps per batch, split by group (default 1)"},
    {"lr", "LR", false, "learning rate (default 1e-4, constant)"},
    {"warmup", "N", false,
     "linear learning-rate warmup, in optimiser steps: --minibatches of them per update (default "
     "0)"},
    {"seed", "S", false, "sampling seed (default 0)"},
    {"slots", "N", false, "sequences generated concurrently (default 64)"},
    {"save-every", "N", false, "checkpoint every N steps and at the end (default 50; 0: end)"},
    {"keep", "N", false, "keep the newest N checkpoints, delete older ones (default 0: keep all)"},
    {"log-every", "N", false, "progress line every N steps (default 10)"},
    {"resume", NULL, false, "continue RUN from its latest checkpoint (same settings)"},
    {"threads", "K", false, "threads (default: all cores)"},
};

int lh__cmd_rl(int argc, char **argv) {
  lh__args a = {.cmd = CMD,
                .about = "Reinforcement learning with verifiable rewards in one process. Writes "
                         "one JSON line per step to RUN/metrics.jsonl and Hugging Face "
                         "checkpoints to RUN/checkpoints (docs/ALGORITHMS.md, \"The RL loop\").",
                .flags = flags,
                .n_flags = sizeof flags / sizeof flags[0]};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  static const char *const loss_names[] = {"ppo", "tis", "mis", "decoupled", NULL};
  static const char *const adv_names[] = {"grpo", "drgrpo", "rloo", NULL};
  static const char *const agg_names[] = {"token", "seq", "const", NULL};
  lh_rl_run_config c = lh_rl_run_defaults();
  long steps, group, prompts, max_new, max_prompt, stale, mb, warmup, slots, save_every, keep,
      log_every, threads;
  double eps_low, eps_high, cap, lr, kl_beta;
  int loss_i, adv_i, agg_i;
  if ((rc = lh__args_int(&a, "steps", 1, 1 << 24, c.steps, &steps)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "group", 2, 1024, c.group, &group)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "prompts", 1, 4096, c.prompts, &prompts)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "max-new", 1, 1 << 16, c.max_new, &max_new)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "max-prompt", 1, 1 << 20, c.max_prompt, &max_prompt)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "staleness", 0, 64, 0, &stale)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "minibatches", 1, 1024, 1, &mb)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "warmup", 0, 1 << 24, 0, &warmup)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "slots", 1, 4096, c.slots, &slots)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "save-every", 0, 1 << 24, c.save_every, &save_every)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "keep", 0, 1 << 24, c.keep, &keep)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "log-every", 1, 1 << 24, c.log_every, &log_every)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "threads", 0, 1024, 0, &threads)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "eps-low", 0, 0.999, c.loss.eps_low, &eps_low)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "eps-high", 0, 100, c.loss.eps_high, &eps_high)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "is-cap", 1e-6, 1e6, c.loss.C, &cap)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "lr", 0, 1, c.opt.lr, &lr)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "kl-beta", 0, 1e3, 0, &kl_beta)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_u64(&a, "seed", LH__SEED_MAX, 0, &c.seed)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_choice(&a, "loss", loss_names, (int)c.loss.kind, &loss_i)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_choice(&a, "adv", adv_names, 0, &adv_i)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_choice(&a, "agg", agg_names, 0, &agg_i)) != LH__ARGS_CONTINUE)
    return rc;
  lh_set_threads((int)threads);
  c.model_dir = lh__args_str(&a, "model", NULL);
  c.env_spec = lh__args_str(&a, "env", NULL);
  c.out_dir = lh__args_str(&a, "out", NULL);
  c.steps = (int)steps;
  c.group = (int)group;
  c.prompts = (int)prompts;
  c.max_new = (int)max_new;
  c.max_prompt = (int)max_prompt;
  c.staleness = (int)stale;
  c.minibatches = (int)mb;
  c.slots = (int)slots;
  c.save_every = (int)save_every;
  c.keep = (int)keep;
  c.log_every = (int)log_every;
  c.resume = lh__args_has(&a, "resume");
  c.loss.kind = (lh_loss_kind)loss_i;
  c.loss.eps_low = (float)eps_low;
  c.loss.eps_high = (float)eps_high;
  c.loss.C = (float)cap;
  c.loss.agg = (lh_loss_agg)agg_i;
  c.loss.kl_beta = (float)kl_beta;
  c.adv.kind = adv_i == 2 ? LH_ADV_RLOO : LH_ADV_GRPO;
  c.adv.std_norm = adv_i == 0;
  c.opt.lr = (float)lr;
  c.opt.warmup_steps = (int)warmup;
  if (lh_rl_run(&c)) return lh__cli_fail(CMD);
  fprintf(stderr, "rl: finished %d steps; metrics in %s/metrics.jsonl, policy in %s/latest\n",
          c.steps, c.out_dir, c.out_dir);
  return LH__EXIT_OK;
}
