/* longhaul rl: the single-process RL loop, `longhaul rl`, a thin driver over the library pieces:
 * rollouts (rollout.h) generated with the trainer's current policy, the trainer (trainer.h) and
 * the run directory (rundir.h). Sample, score, submit, step, repeat, with a delay queue of
 * `staleness` rollout batches between the policy that generates and the policy that trains.
 * Update s (1-based) trains on the batch generated K generations earlier; the first K + 1
 * batches are generated before the first update, so the staleness of update s is min(s - 1, K).
 * Generation g uses train tasks g*prompts .. g*prompts + prompts - 1 and sampler streams from
 * g * prompts * group, with the run's seed: the run is a pure function of its settings.
 * Thread safety: lh_rl_run runs on the calling thread; `stop` may be set from a signal handler. */
#ifndef LONGHAUL_RL_H
#define LONGHAUL_RL_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "longhaul/loss.h"
#include "longhaul/optim.h"
#include "longhaul/rollout.h"
#include "longhaul/rundir.h"
#include "longhaul/trainer.h"

struct json_t;

/* What the driver reports after every update. */
typedef struct lh_rl_progress {
  int64_t step, steps;    /* updates done, and in total */
  int64_t first_step;     /* the step this process started from (resume) */
  double elapsed_s;       /* since this process started the loop */
  lh_rollout_summary gen; /* the batch generated last */
  lh_trainer_step_stats train;
  double gen_s, train_s; /* this step's generation and training time */
} lh_rl_progress;

typedef struct lh_rl_run_config {
  const char *model_dir; /* the starting policy (with tokenizer.json) */
  const char *out_dir;   /* RUN: run.json, metrics.jsonl, checkpoints/step-NNNNNN, latest */
  const char *env_spec;  /* lh_env_config_parse syntax */
  int steps;             /* policy updates in total (a resumed run continues up to it) */
  int group, prompts;    /* completions per prompt, prompts per step */
  int max_new;           /* completion tokens at most */
  int max_prompt;        /* prompt tokens at most; tasks with longer prompts are skipped */
  int staleness;         /* K */
  int minibatches;       /* optimiser steps per batch */
  int slots;             /* concurrent sequences in the generator */
  int save_every;        /* checkpoint every N updates (and at the end); 0: only at the end */
  int keep;              /* keep the newest N checkpoints, delete older ones; 0: keep all */
  uint64_t seed;         /* at most INT64_MAX: run.json records it as a JSON integer */
  lh_loss_config loss;
  lh_adv_config adv;
  lh_adamw_config opt;
  bool resume; /* continue RUN from its latest checkpoint (same settings required) */
  /* the command line, recorded in run.json (argc 0: none) */
  int argc;
  char *const *argv;
  /* set (to nonzero, e.g. by a SIGINT handler) to stop after the current step: a checkpoint is
   * written and lh_rl_run returns LH_ERR_OK with result->stopped set; NULL: never */
  volatile sig_atomic_t *stop;
  /* called after every update (NULL: nothing), from the calling thread */
  void (*progress)(const lh_rl_progress *p, void *ud);
  void *progress_ud;
} lh_rl_run_config;

/* Group 8, 16 prompts, 32 new tokens, prompts of up to 256 tokens, no staleness, 1 minibatch, 64
 * slots, save every 50 and keep all checkpoints, seed 0, and lh_trainer_defaults' loss, advantage
 * and optimiser. */
lh_rl_run_config lh_rl_run_defaults(void);

/* The settings of run.json that results depend on (a new object; NULL when out of memory), and
 * back: lh_rl_settings_read fills those fields of *c from run.json's object, leaving the rest
 * (paths of this invocation, cadence, callbacks) as they are; an object that lacks a field or
 * holds a wrong type is LH_ERR_FORMAT naming it. A model path or env spec that is not UTF-8 is
 * recorded twice, with U+FFFD for the bad bytes and as "model_bytes"/"env_bytes" in hex; the
 * reader takes the bytes (it adds them to the object, whose strings *c then points into). */
struct json_t *lh_rl_settings_json(const lh_rl_run_config *c);
lh_err lh_rl_settings_read(struct json_t *settings, const char *what, lh_rl_run_config *c);

/* How a run went, for the summary a driver prints. */
typedef struct lh_rl_result {
  int64_t first_step, last_step; /* this process trained steps first_step+1 .. last_step */
  double wall_s;
  double reward_first, reward_last;     /* mean reward over the first and last 10% of those steps */
  double accuracy_first, accuracy_last; /* (at least one step each) */
  long groups_skipped, groups_total;    /* groups without signal, of those trained on */
  long groups_failed;                   /* groups the environment failed on */
  long batches_dropped;
  bool stopped;     /* ended early by *stop */
  char *policy_dir; /* the last checkpoint (malloc'd), NULL when none */
} lh_rl_result;
/* Frees what a result holds (accepts NULL). */
void lh_rl_result_free(lh_rl_result *r);

/* Runs (or resumes) the loop; errors name the file or setting. A start that fails (missing
 * model, bad environment, settings that do not match on resume) leaves no run directory behind
 * that it created. An environment that fails every task of a step ends the run with an error.
 * When most groups carry no signal for many steps, one warning is logged. result may be NULL. */
lh_err lh_rl_run(const lh_rl_run_config *cfg, lh_rl_result *result);

#endif
