/* `longhaul rl`: the single-process RL loop (lh_rl_run): sample a group of completions per
 * prompt, score them, compute group-relative advantages, update with an off-policy-corrected
 * policy loss, repeat; --staleness K puts K batches between generation and training. With
 * --resume the settings come from RUN/run.json; flags that would change them are refused,
 * all of them listed at once. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "longhaul/rl.h"

#define CMD "rl"

static const lh__flag flags[] = {
    {"model", "DIR", false,
     "starting policy: a model directory with a tokenizer.json, or a run directory (required "
     "unless --resume)"},
    {"env", "SPEC", false,
     "environment: NAME or NAME:key=value,... (arith, countdown, sort, jsonl, exec; required "
     "unless --resume)"},
    {"out", "RUN", true, "run directory: run.json, metrics.jsonl, checkpoints/step-NNNNNN, latest"},
    {"steps", "N", false, "policy updates in total (default 100)"},
    {"group", "G", false, "completions per prompt (default 8)"},
    {"prompts", "P", false, "prompts per step (default 16)"},
    {"max-new", "N", false, "completion tokens at most (default 32)"},
    {"max-prompt", "N", false,
     "prompt tokens at most; tasks with longer prompts are skipped (default 256)"},
    {"staleness", "K", false, "train on rollouts of the policy K versions back (default 0)"},
    {"staleness-mix", "K", false,
     "instead, generate each group with a version drawn uniformly from the last K + 1, as a "
     "fleet of workers at different distances does (default 0: off)"},
    {"loss", "KIND", false,
     "ppo | tis | mis | decoupled | m2po | seqtis | vespo | dppo | oapl | snis (default "
     "vespo; docs/ALGORITHMS.md)"},
    {"eps-low", "E", false, "PPO clip below 1 (default 0.2)"},
    {"eps-high", "E", false, "PPO clip above 1 (default 0.28)"},
    {"is-cap", "C", false, "tis, decoupled: truncation of the behaviour weight (default 2)"},
    {"ess-lr", NULL, false,
     "scale each step's learning rate by the square root of the effective sample size of the "
     "sequence ratios pi/mu (VCPO)"},
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
    {"eval-every", "N", false,
     "held-out greedy pass@1 of the policy before the first step and every N steps, on test "
     "tasks 0..M-1, into metrics.jsonl and the progress line (default 0: off)"},
    {"eval-n", "M", false, "test tasks of --eval-every (default 64)"},
    {"save-every", "N", false, "checkpoint every N steps and at the end (default 50; 0: end)"},
    {"keep", "N", false, "keep the newest N checkpoints, delete older ones (default 0: keep all)"},
    {"log-every", "N", false,
     "progress line every N steps when stderr is not a terminal (default 10)"},
    {"resume", NULL, false,
     "continue RUN from its latest checkpoint with the settings in RUN/run.json"},
    {"threads", "K", false, "threads (default: all cores)"},
};

/* Flags that may differ on resume: they do not change the run's results. */
static bool free_on_resume(const char *name) {
  static const char *const names[] = {"out",    "steps",     "save-every", "keep",
                                      "resume", "log-every", "threads"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(names[i], name)) return true;
  return false;
}

/* What the run holds for a setting flag, as text: for the message on a mismatch. */
static void run_value(const lh_rl_run_config *r, const char *flag, char *buf, size_t cap) {
#define I(name, v)                                                                                 \
  if (!strcmp(flag, name)) {                                                                       \
    snprintf(buf, cap, "%lld", (long long)(v));                                                    \
    return;                                                                                        \
  }
#define F(name, v)                                                                                 \
  if (!strcmp(flag, name)) {                                                                       \
    snprintf(buf, cap, "%g", (double)(v));                                                         \
    return;                                                                                        \
  }
#define S(name, v)                                                                                 \
  if (!strcmp(flag, name)) {                                                                       \
    snprintf(buf, cap, "%s", v);                                                                   \
    return;                                                                                        \
  }
  S("model", r->model_dir) S("env", r->env_spec) I("group", r->group) I("prompts", r->prompts);
  I("max-new", r->max_new) I("max-prompt", r->max_prompt) I("staleness", r->staleness);
  I("staleness-mix", r->staleness_mix);
  S("loss", lh_loss_kind_names[r->loss.kind]) F("eps-low", r->loss.eps_low);
  F("eps-high", r->loss.eps_high) F("is-cap", r->loss.C);
  S("adv", lh_adv_flag_names[lh_adv_flag_index(&r->adv)]) S("agg", lh_loss_agg_names[r->loss.agg]);
  F("kl-beta", r->loss.kl_beta) I("minibatches", r->minibatches) F("lr", r->opt.lr);
  I("ess-lr", r->loss.ess_lr);
  I("warmup", r->opt.warmup_steps) I("seed", r->seed) I("slots", r->slots);
  I("eval-every", r->eval_every) I("eval-n", r->eval_n);
#undef I
#undef F
#undef S
  snprintf(buf, cap, "?");
}

/* Whether text the user gave is what run.json recorded, which holds bytes that are not UTF-8 as
 * U+FFFD (lh_json_text). */
static bool same_text(const char *user, const char *recorded) {
  json_t *j = lh_json_text(user, strlen(user));
  bool same = j && !strcmp(json_string_value(j), recorded);
  json_decref(j);
  return same;
}

/* Whether a setting flag gives the value the run holds. */
static bool same_setting(const char *flag, const lh_rl_run_config *u, const lh_rl_run_config *r) {
  if (!strcmp(flag, "model"))
    return lh_path_same(u->model_dir, r->model_dir) || same_text(u->model_dir, r->model_dir);
  if (!strcmp(flag, "env"))
    return same_text(u->env_spec, r->env_spec) || lh_env_spec_same(u->env_spec, r->env_spec);
  /* floats are compared as the floats stored, not as text */
  if (!strcmp(flag, "eps-low")) return u->loss.eps_low == r->loss.eps_low;
  if (!strcmp(flag, "eps-high")) return u->loss.eps_high == r->loss.eps_high;
  if (!strcmp(flag, "is-cap")) return u->loss.C == r->loss.C;
  if (!strcmp(flag, "kl-beta")) return u->loss.kl_beta == r->loss.kl_beta;
  if (!strcmp(flag, "lr")) return u->opt.lr == r->opt.lr;
  char a[256], b[256];
  run_value(u, flag, a, sizeof a);
  run_value(r, flag, b, sizeof b);
  return !strcmp(a, b);
}

typedef struct {
  lh__progress_state bar;
} ui;

static void on_progress(const lh_rl_progress *p, void *ud) {
  ui *u = ud;
  u->bar.first = p->first_step; /* the rate counts this process's steps */
  u->bar.elapsed = p->elapsed_s;
  char text[240];
  snprintf(text, sizeof text,
           "reward %.3f accuracy %.3f len %.1f clip %.3f stale %.1f skipped %d/%d",
           p->gen.reward_mean, p->gen.accuracy, p->gen.response_len,
           isfinite(p->train.update.loss.clip_frac) ? p->train.update.loss.clip_frac : 0.0,
           p->staleness_mean, p->train.groups_skipped,
           p->train.groups_used + p->train.groups_skipped + p->train.groups_failed);
  lh__heldout_text(p->heldout_step, p->heldout.pass1.mean, text, sizeof text);
  lh__progress(&u->bar, p->step, text);
}

int lh__cmd_rl(int argc, char **argv) {
  lh__args a = {.cmd = CMD,
                .about = "Reinforcement learning with verifiable rewards in one process. Writes "
                         "one JSON line per step (and one per --eval-every evaluation) to "
                         "RUN/metrics.jsonl and Hugging Face "
                         "checkpoints to RUN/checkpoints (docs/ALGORITHMS.md, \"The RL loop\"). "
                         "SIGINT or SIGTERM stops after the current step with a checkpoint "
                         "(exit 130 or 143); `--out RUN --resume` continues.",
                .flags = flags,
                .n_flags = sizeof flags / sizeof flags[0]};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  bool resume = lh__args_has(&a, "resume");
  const char *out_dir = lh__args_str(&a, "out", NULL);
  lh_rl_run_config base = lh_rl_run_defaults(); /* what flags not given mean */
  json_t *settings = NULL;
  char *model = NULL;
  lh_rl_result res = {0};
  if (resume) {
    lh_rundir *rd = NULL;
    if (lh_rundir_open(out_dir, LH_RUNDIR_RESUME, &rd) || lh_rundir_read_settings(rd, &settings)) {
      lh_rundir_close(rd, false);
      return lh__cli_fail(CMD);
    }
    lh_rundir_close(rd, false);
    char *path = lh_path_join(out_dir, "run.json");
    lh_err e = lh_rl_settings_read(settings, path, &base);
    free(path);
    if (e) {
      json_decref(settings);
      return lh__cli_fail(CMD);
    }
  } else if (!lh__args_has(&a, "model") || !lh__args_has(&a, "env")) {
    return lh__cli_error(CMD, LH__EXIT_USAGE, "--model and --env are required (unless --resume)");
  }
  lh_rl_run_config c = base;
  long steps, group, prompts, max_new, max_prompt, stale, stale_mix, mb, warmup, slots, save_every,
      keep, log_every, threads, eval_every, eval_n;
  double eps_low, eps_high, cap, lr, kl_beta;
  int loss_i, adv_i, agg_i;
  if ((rc = lh__args_int(&a, "steps", 1, 1 << 24, c.steps, &steps)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "group", 2, 1024, c.group, &group)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "prompts", 1, 4096, c.prompts, &prompts)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "max-new", 1, 1 << 16, c.max_new, &max_new)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "max-prompt", 1, 1 << 20, c.max_prompt, &max_prompt)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "staleness", 0, 64, c.staleness, &stale)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "staleness-mix", 0, 64, c.staleness_mix, &stale_mix)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "minibatches", 1, 1024, c.minibatches, &mb)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "warmup", 0, 1 << 24, c.opt.warmup_steps, &warmup)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "slots", 1, 4096, c.slots, &slots)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "save-every", 0, 1 << 24, c.save_every, &save_every)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "keep", 0, 1 << 24, c.keep, &keep)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "eval-every", 0, 1 << 24, c.eval_every, &eval_every)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "eval-n", 1, 1 << 20, c.eval_n, &eval_n)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "log-every", 1, 1 << 24, 10, &log_every)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "threads", 0, 1024, 0, &threads)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "eps-low", 0, 0.999, c.loss.eps_low, &eps_low)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "eps-high", 0, 100, c.loss.eps_high, &eps_high)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "is-cap", 1e-6, 1e6, c.loss.C, &cap)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "lr", 0, 1, c.opt.lr, &lr)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "kl-beta", 0, 1e3, c.loss.kl_beta, &kl_beta)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_u64(&a, "seed", LH__SEED_MAX, c.seed, &c.seed)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_choice(&a, "loss", lh_loss_kind_names, (int)c.loss.kind, &loss_i)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_choice(&a, "adv", lh_adv_flag_names, lh_adv_flag_index(&c.adv), &adv_i)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_choice(&a, "agg", lh_loss_agg_names, (int)c.loss.agg, &agg_i)) !=
          LH__ARGS_CONTINUE)
    goto done;
  lh_set_threads((int)threads);
  if (lh__args_has(&a, "model") && !(model = lh__model_dir(CMD, lh__args_str(&a, "model", NULL)))) {
    rc = LH__EXIT_FAIL;
    goto done;
  }
  if (model) c.model_dir = model;
  c.env_spec = lh__args_str(&a, "env", c.env_spec);
  c.out_dir = out_dir;
  c.steps = (int)steps;
  c.group = (int)group;
  c.prompts = (int)prompts;
  c.max_new = (int)max_new;
  c.max_prompt = (int)max_prompt;
  c.staleness = (int)stale;
  c.staleness_mix = (int)stale_mix;
  if (c.staleness > 0 && c.staleness_mix > 0) {
    rc = lh__cli_error(CMD, LH__EXIT_USAGE,
                       "--staleness and --staleness-mix are two modes of lag: give one of them");
    goto done;
  }
  c.minibatches = (int)mb;
  c.slots = (int)slots;
  c.save_every = (int)save_every;
  c.keep = (int)keep;
  c.eval_every = (int)eval_every;
  c.eval_n = (int)eval_n;
  c.heldout = lh_eval_heldout_run;
  c.resume = resume;
  c.loss.kind = (lh_loss_kind)loss_i;
  /* a flag not given keeps the run's float as stored: no round trip through double text */
  if (lh__args_has(&a, "eps-low")) c.loss.eps_low = (float)eps_low;
  if (lh__args_has(&a, "eps-high")) c.loss.eps_high = (float)eps_high;
  if (lh__args_has(&a, "is-cap")) c.loss.C = (float)cap;
  if (lh__args_has(&a, "kl-beta")) c.loss.kl_beta = (float)kl_beta;
  if (lh__args_has(&a, "lr")) c.opt.lr = (float)lr;
  c.loss.agg = (lh_loss_agg)agg_i;
  if (lh__args_has(&a, "ess-lr")) c.loss.ess_lr = 1;
  lh_adv_from_flag(adv_i, &c.adv);
  c.opt.warmup_steps = (int)warmup;
  if (resume) { /* every setting flag given must say what the run has */
    char diff[2048] = "";
    for (int i = 0; i < a.n_flags; i++) {
      const char *name = flags[i].name;
      if (free_on_resume(name) || !lh__args_has(&a, name) || same_setting(name, &c, &base))
        continue;
      char was[256];
      run_value(&base, name, was, sizeof was);
      size_t used = strlen(diff);
      snprintf(diff + used, sizeof diff - used, "%s--%s %s (the run has %s)", used ? ", " : "",
               name, lh__args_str(&a, name, ""), was);
    }
    if (diff[0]) {
      rc = lh__cli_error(CMD, LH__EXIT_USAGE,
                         "--resume: %s/run.json was started with other settings: %s; leave "
                         "these flags out to resume, or start a new run with another --out",
                         out_dir, diff);
      goto done;
    }
  }
  ui u = {{.cmd = CMD, .every = (int)log_every, .tty = -1}};
  /* run.json records the command as typed: "longhaul rl ..." */
  char **cmdline = lh_xcalloc((size_t)argc + 2, sizeof *cmdline);
  cmdline[0] = "longhaul";
  for (int i = 0; i < argc; i++)
    cmdline[i + 1] = argv[i];
  c.argc = argc + 1;
  c.argv = cmdline;
  c.stop = &lh__stop;
  c.progress = on_progress;
  c.progress_ud = &u;
  lh__stop_on_signals();
  if (resume) {
    int64_t at = 0;
    char *latest = NULL;
    if (lh_rundir_latest(out_dir, &at, &latest) == LH_ERR_OK)
      fprintf(stderr, "rl: resuming %s from step %lld\n", out_dir, (long long)at);
    else
      fprintf(stderr, "rl: resuming %s from the start (no checkpoint yet)\n", out_dir);
    free(latest);
  }
  u.bar.total = c.steps;
  lh_err e = lh_rl_run(&c, &res);
  free(cmdline);
  lh__progress_end(&u.bar);
  if (e) {
    rc = lh__cli_fail_err(CMD, e);
    goto done;
  }
  char wall[32];
  lh__format_duration(res.wall_s, wall, sizeof wall);
  int64_t n = res.last_step - res.first_step;
  if (res.stopped)
    fprintf(stderr, "rl: stopped by %s after step %lld of %d\n", lh__stop_name(),
            (long long)res.last_step, c.steps);
  fprintf(stderr, "rl: %lld steps in %s (steps %lld..%lld of %d)\n", (long long)n, wall,
          (long long)(n > 0 ? res.first_step + 1 : res.first_step), (long long)res.last_step,
          c.steps);
  if (n > 0) {
    fprintf(stderr,
            "  reward %.3f -> %.3f, accuracy %.3f -> %.3f (mean of the first and the last 10%% "
            "of these steps)\n",
            res.reward_first, res.reward_last, res.accuracy_first, res.accuracy_last);
    fprintf(stderr, "  groups without signal (equal rewards): %ld of %ld (%.0f%%)",
            res.groups_skipped, res.groups_total,
            res.groups_total > 0 ? 100.0 * (double)res.groups_skipped / (double)res.groups_total
                                 : 0.0);
    if (res.groups_failed) fprintf(stderr, "; failed tasks: %ld", res.groups_failed);
    fputc('\n', stderr);
  }
  if (res.policy_dir) {
    fprintf(stderr, "  policy: %s (also: --model %s)\n", res.policy_dir, out_dir);
    fprintf(stderr, "  next: longhaul eval --model %s --env %s --compare %s\n", out_dir, c.env_spec,
            c.model_dir);
  }
  if (res.stopped) {
    fprintf(stderr, "  continue with: longhaul rl --out %s --resume\n", out_dir);
    rc = lh__stop_exit_code();
  } else {
    rc = LH__EXIT_OK;
  }
done:
  lh_rl_result_free(&res);
  free(model);
  json_decref(settings);
  return rc;
}
