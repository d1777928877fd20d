/* `longhaul serve`: the networked trainer and coordinator (lh_serve_run, node.h). Flags name
 * the run, the key, the address and the training settings (as `rl`); a run directory that holds
 * a run already is resumed with its own settings. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longhaul/node.h"

#define CMD "serve"

static const lh__flag flags[] = {
    {"run", "DIR", true, "run directory: run.json, ledger.sqlite, blobs/, checkpoints/, metrics"},
    {"model", "DIR", false, "starting policy (a model directory with tokenizer.json; new runs)"},
    {"env", "SPEC", false, "environment, as rl (new runs)"},
    {"key", "FILE", true, "the trainer's Ed25519 secret key (longhaul keygen)"},
    {"listen", "HOST:PORT", false, "address to listen on (default 127.0.0.1:0: a free port)"},
    {"port-file", "FILE", false, "write the port listened on to FILE"},
    {"steps", "N", false, "policy updates in total (default 100)"},
    {"group", "G", false, "completions per prompt (default 8)"},
    {"prompts", "P", false, "groups per update (default 16)"},
    {"max-new", "N", false, "completion tokens at most (default 32)"},
    {"max-prompt", "N", false, "prompt tokens at most (default 256)"},
    {"max-staleness", "K", false,
     "drop groups generated more than K versions before the update (default 16; VESPO, the "
     "default loss, holds up at 16: docs/RESULTS.md). It bounds what is accepted, not what is "
     "leased (docs/PROTOCOL.md, \"Leases that expire\")"},
    {"max-kept-mb", "M", false,
     "the bf16 weights of the last K + 1 versions are kept (to recompute and verify each group "
     "under its own version) in at most M MB; K is lowered to fit, with a warning (default "
     "4096: K 16 up to 120M parameters)"},
    {"loss", "KIND", false,
     "ppo | tis | mis | decoupled | m2po | seqtis | vespo | dppo | oapl | snis (default "
     "vespo; docs/ALGORITHMS.md)"},
    {"lr", "LR", false, "learning rate (default 1e-4)"},
    {"seed", "S", false,
     "the sampler seed of every group (each also gets random streams of its own; default 0)"},
    {"keyframe-every", "K", false,
     "a full snapshot every K versions (default 20; 0: by cost only)"},
    {"lease-s", "S", false, "seconds a lease lasts before its task is leased again (default 120)"},
    {"eval-every", "N", false,
     "held-out greedy pass@1 of the policy at version 0 and every N versions, on test tasks "
     "0..M-1, into metrics.jsonl and the progress line (default 0: off; new runs)"},
    {"eval-n", "M", false, "test tasks of --eval-every (default 64; new runs)"},
    {"keep", "N", false, "keep the newest N checkpoints (default 3; 0: all)"},
    {"max-wall", "S", false, "stop after S seconds (default 0: at --steps)"},
    {"linger", "S", false,
     "after the last update, keep serving S seconds for workers still syncing (default 0)"},
    {"sync", NULL, false, "synchronous mode: groups only for the current version (a baseline)"},
    {"log-every", "N", false, "progress line every N updates when stderr is not a terminal"},
    {"threads", "K", false, "training threads (default: all cores)"},
    {"logit-tol", "X", false,
     "verification: the most one logit may differ between a worker and the server (default "
     "1e-3; docs/SECURITY.md)"},
    {"logprob-tol", "X", false,
     "verification: the most a reported behaviour log-prob may differ (default 1e-2)"},
    {"borderline-min", "N", false,
     "verification: BORDERLINE tokens a completion may always hold (default 4); more are "
     "refused once implausible under honest sampling at their positions"},
    {"borderline-alpha", "A", false,
     "verification: the chance that the BORDERLINE test refuses an honest completion (default "
     "1e-9; docs/SECURITY.md)"},
    {"ban-after", "N", false,
     "a key with N rejected groups among its latest --ban-window submitted ones is banned: its "
     "requests get 403 banned, for good (the ledger keeps it across restarts). Rejections the "
     "server caused (an environment that failed to score, reason \"env: ...\") do not count "
     "(default 8; 0: never)"},
    {"ban-window", "W", false,
     "the reputation window: rejections older than the key's latest W submitted groups no "
     "longer count (default 256)"},
    {"abandon-after", "N", false,
     "selective submission: a key with N or more expired groups (leased, never submitted) among "
     "its latest --abandon-window settled ones, and more than half of them, gets no new leases "
     "(403 abandoning) until late submissions bring that down; not a ban (default 24; 0: never)"},
    {"abandon-window", "W", false, "settled (submitted or expired) groups judged (default 64)"},
    {"rate-limit", "R", false,
     "signed requests per second per key, bursts of 4 s worth, at least 8 (default 0: off)"},
    {"allow-keys", "FILE", false, "serve only the keys listed in FILE, one public-key line each"},
    {"no-verify", NULL, false,
     "testing only: train on groups without checking their tokens (load tests)"},
};

typedef struct {
  lh__progress_state bar;
} ui;

static void on_progress(const lh_serve_progress *p, void *ud) {
  ui *u = ud;
  u->bar.elapsed = p->elapsed_s;
  char text[280];
  snprintf(text, sizeof text,
           "reward %.3f accuracy %.3f groups/s %.2f staleness %.2f trained %lld dropped %lld "
           "rejected %lld shipped %.1f MB busy %.0f%%",
           p->reward, p->accuracy, p->groups_per_s, p->staleness_mean, (long long)p->groups_trained,
           (long long)p->groups_dropped, (long long)p->groups_rejected,
           (double)p->bytes_shipped / 1e6, 100.0 * p->busy);
  lh__heldout_text(p->heldout_step, p->heldout, text, sizeof text);
  lh__progress(&u->bar, p->version, text);
}

int lh__cmd_serve(int argc, char **argv) {
  lh__args a = {.cmd = CMD,
                .about = "The networked trainer: an HTTP API for workers (docs/PROTOCOL.md, \"The "
                         "networked protocol\"), a durable ledger, and the training thread. "
                         "Every version is checkpointed before workers see it; kill -9 and a "
                         "restart with the same --run lose nothing: a --run that holds a run "
                         "resumes it with the settings of its run.json (training flags given "
                         "then are not used; --steps may grow). SIGINT or SIGTERM stops after "
                         "the current update (exit 130 or 143).",
                .flags = flags,
                .n_flags = sizeof flags / sizeof flags[0]};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  lh_serve_config c = lh_serve_defaults();
  long steps, group, prompts, max_new, max_prompt, stale, kf, keep, log_every, threads, eval_every,
      eval_n;
  double lr, lease_s, max_wall, linger, rate, kept_mb;
  long ban_after, ban_window, abandon_after, abandon_window, borderline_min;
  int loss_i;
  char *model = NULL;
  if ((rc = lh__args_int(&a, "steps", 1, 1 << 24, c.rl.steps, &steps)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "group", 2, 1024, c.rl.group, &group)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "prompts", 1, 4096, c.rl.prompts, &prompts)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "max-new", 1, 1 << 16, c.rl.max_new, &max_new)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "max-prompt", 1, 16384, c.rl.max_prompt, &max_prompt)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "max-staleness", 0, 64, c.rl.staleness, &stale)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "keyframe-every", 0, 1 << 24, c.keyframe_every, &kf)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "keep", 0, 1 << 24, c.rl.keep, &keep)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "eval-every", 0, 1 << 24, c.rl.eval_every, &eval_every)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "eval-n", 1, 1 << 20, c.rl.eval_n, &eval_n)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "log-every", 1, 1 << 24, 10, &log_every)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "threads", 0, 1024, 0, &threads)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "lr", 0, 1, c.rl.opt.lr, &lr)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "lease-s", 1, 86400, c.lease_ms / 1000.0, &lease_s)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "max-wall", 0, 1e9, 0, &max_wall)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "linger", 0, 1e9, 0, &linger)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "logit-tol", 0, 0.999, c.trust.logit_tol, &c.trust.logit_tol)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "logprob-tol", 1e-9, 1e3, c.trust.logprob_tol,
                            &c.trust.logprob_tol)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "borderline-min", 0, 1 << 30, c.trust.borderline_min,
                         &borderline_min)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "borderline-alpha", 1e-300, 0.5, c.trust.borderline_alpha,
                            &c.trust.borderline_alpha)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "ban-after", 0, 1 << 30, c.ban_after, &ban_after)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "ban-window", 1, 1 << 20, c.ban_window, &ban_window)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "abandon-after", 0, 1 << 20, c.abandon_after, &abandon_after)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "abandon-window", 1, 1 << 20, c.abandon_window, &abandon_window)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "rate-limit", 0, 1e6, 0, &rate)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_double(&a, "max-kept-mb", 1, 1e9, c.kept_max_mb, &kept_mb)) !=
          LH__ARGS_CONTINUE ||
      (rc = lh__args_u64(&a, "seed", LH__SEED_MAX, c.rl.seed, &c.rl.seed)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_choice(&a, "loss", lh_loss_kind_names, (int)c.rl.loss.kind, &loss_i)) !=
          LH__ARGS_CONTINUE)
    return rc;
  c.trust.borderline_min = (int)borderline_min;
  c.ban_after = (int)ban_after;
  c.ban_window = (int)ban_window;
  c.abandon_after = (int)abandon_after;
  c.abandon_window = (int)abandon_window;
  c.rate_limit = rate;
  c.kept_max_mb = kept_mb;
  c.allow_keys = lh__args_str(&a, "allow-keys", NULL);
  c.no_verify = lh__args_has(&a, "no-verify");
  lh_set_threads((int)threads);
  if (lh__args_has(&a, "model") && !(model = lh__model_dir(CMD, lh__args_str(&a, "model", NULL))))
    return LH__EXIT_FAIL;
  c.rl.model_dir = model;
  c.rl.env_spec = lh__args_str(&a, "env", NULL);
  c.rl.out_dir = lh__args_str(&a, "run", NULL);
  c.rl.steps = (int)steps;
  c.rl.group = (int)group;
  c.rl.prompts = (int)prompts;
  c.rl.max_new = (int)max_new;
  c.rl.max_prompt = (int)max_prompt;
  c.rl.staleness = (int)stale;
  c.rl.keep = (int)keep;
  c.rl.eval_every = (int)eval_every;
  c.rl.eval_n = (int)eval_n;
  c.rl.loss.kind = (lh_loss_kind)loss_i;
  if (lh__args_has(&a, "lr")) c.rl.opt.lr = (float)lr;
  c.key_path = lh__args_str(&a, "key", NULL);
  c.listen = lh__args_str(&a, "listen", c.listen);
  c.port_file = lh__args_str(&a, "port-file", NULL);
  c.keyframe_every = (int)kf;
  c.lease_ms = (int)(lease_s * 1000.0);
  c.max_wall_s = max_wall;
  c.linger_s = linger;
  c.sync_mode = lh__args_has(&a, "sync");
  char **cmdline = lh_xcalloc((size_t)argc + 2, sizeof *cmdline);
  cmdline[0] = "longhaul";
  for (int i = 0; i < argc; i++)
    cmdline[i + 1] = argv[i];
  c.rl.argc = argc + 1;
  c.rl.argv = cmdline;
  c.rl.stop = &lh__stop;
  ui u = {{.cmd = CMD, .every = (int)log_every, .tty = -1}};
  u.bar.total = c.rl.steps;
  c.progress = on_progress;
  c.progress_ud = &u;
  lh__stop_on_signals();
  lh_err e = lh_serve_run(&c);
  lh__progress_end(&u.bar);
  free(cmdline);
  free(model);
  if (e) return lh__cli_fail_err(CMD, e);
  if (lh__stop) return lh__stop_exit_code();
  return LH__EXIT_OK;
}
