/* longhaul report: one self-contained HTML page about a training run (`longhaul report`), with
 * SVG plots drawn here: reward, accuracy, entropy, KL and clip fraction over steps (raw and
 * smoothed), held-out pass@1 over training (rl/serve --eval-every), the staleness histogram,
 * bytes per published version against a snapshot and each worker's contribution (serve runs,
 * from the ledger), and an evaluation with its intervals (an `eval --json` file). The page loads
 * nothing: no scripts, fonts or images from anywhere.
 *
 * metrics.jsonl, the ledger and the eval JSON are outside bytes: their readers return
 * LH_ERR_FORMAT (or LH_ERR_LIMIT) with the file, the line and what was expected, and never
 * abort. Ownership: the _free functions accept NULL and zero what they free. Thread safety:
 * none needed (no globals). */
#ifndef LONGHAUL_REPORT_H
#define LONGHAUL_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

#define LH_REPORT_MAX_FILE      ((size_t)256 << 20) /* bytes of metrics.jsonl or eval JSON */
#define LH_REPORT_MAX_LINE      65536               /* bytes of one metrics line */
#define LH_REPORT_MAX_K         32                  /* pass@k entries of an eval JSON block */
#define LH_REPORT_MAX_VERSIONS  100000              /* versions of a ledger drawn */
#define LH_REPORT_MAX_WORKERS   256                 /* workers of a ledger drawn */
#define LH_REPORT_MAX_STALENESS 64                  /* histogram bins: 0 .. 64 (64: or more) */

/* The series of an update line, by the key rl writes (serve's first key where it differs). */
typedef enum {
  LH_REPORT_REWARD,    /* "reward_mean" (rl), "reward" (serve) */
  LH_REPORT_ACCURACY,  /* "accuracy" */
  LH_REPORT_ENTROPY,   /* "entropy" */
  LH_REPORT_KL_MU_PI,  /* "kl_mu_pi": behaviour policy to the policy trained */
  LH_REPORT_KL_REF,    /* "kl_loss": the penalty to the starting model */
  LH_REPORT_CLIP,      /* "clip_frac" */
  LH_REPORT_STALENESS, /* "staleness" (rl: of the batch; serve: the mean of its groups) */
  LH_REPORT_LOSS,      /* "loss" */
  LH_REPORT__COUNT
} lh_report_key;
extern const char *const lh_report_key_names[LH_REPORT__COUNT]; /* "reward_mean", ... */

/* metrics.jsonl as read. */
typedef struct lh_report_metrics {
  int n;                                  /* update lines (no "kind") */
  double *step;                           /* (n) strictly increasing */
  double *v[LH_REPORT__COUNT];            /* (n) each; NAN where absent or null */
  int present[LH_REPORT__COUNT];          /* lines holding a number for the key */
  int n_eval;                             /* "kind": "eval" lines */
  double *eval_step;                      /* (n_eval) non-decreasing */
  double *eval_pass1, *eval_lo, *eval_hi; /* (n_eval) in [0, 1], lo <= pass1 <= hi */
  int *eval_tasks;                        /* (n_eval) */
} lh_report_metrics;

/* Reads metrics.jsonl text (len bytes, at most LH_REPORT_MAX_FILE). Every non-empty line must
 * be a JSON object of at most LH_REPORT_MAX_LINE bytes: an update line (no "kind") with an
 * integer "step" >= 1 above the previous update's, whose keys above are numbers or null; or an
 * eval line ("kind": "eval", docs/ARCHITECTURE.md, "Run directories") with "step" >= 0 and
 * "eval_pass1", "eval_lo", "eval_hi" in [0, 1] in that order and "eval_tasks" >= 1. Only a
 * final line may be empty; a last line without its newline that is not JSON is a write in
 * progress (the run is still going): it is left out with a warning. Anything else is LH_ERR_FORMAT
 * "NAME:LINE: ..." saying what was expected and found. *out is cleared first and holds nothing on
 * failure. */
lh_err lh_report_metrics_parse(const char *text, size_t len, const char *name,
                               lh_report_metrics *out);
void lh_report_metrics_free(lh_report_metrics *m);

/* A point estimate with its 95% interval, as `eval --json` writes it. */
typedef struct lh_report_ci {
  double mean, lo, hi;
  int tasks;
} lh_report_ci;

/* One block of an eval JSON ("model", "compare" or "paired"). */
typedef struct lh_report_eval_block {
  int present;
  int n_k;
  int k[LH_REPORT_MAX_K]; /* increasing */
  lh_report_ci pass[LH_REPORT_MAX_K];
  lh_report_ci mean_reward;
  char *dir; /* "model" and "compare": the model directory (malloc'd), else NULL */
} lh_report_eval_block;

/* `longhaul eval --json` output as read. */
typedef struct lh_report_eval {
  char *env, *split; /* malloc'd */
  int tasks, samples;
  bool has_sampling; /* max_new, temperature and seed were given (eval --json writes them) */
  int max_new;
  double temperature;
  long long seed;
  lh_report_eval_block model, compare, paired; /* model always present */
} lh_report_eval;

/* Reads an eval JSON (at most LH_REPORT_MAX_FILE bytes): an object with "command": "eval",
 * "env" and "split" strings, "tasks" and "samples" integers >= 1, a "model" block and optional
 * "compare" and "paired" blocks, each with "pass_at_k" (an object of 1 .. LH_REPORT_MAX_K
 * entries keyed by k as decimal text, each {"mean", "lo", "hi", "tasks"}) and "mean_reward";
 * lo <= mean <= hi, finite, within [0, 1] ([-1, 1] for "paired"); "max_new" (integer >= 1),
 * "temperature" (number >= 0) and "seed" (integer) are optional, all three or none. Other keys
 * are ignored. The one reader of eval files: the report and the model card both use it.
 * Errors are LH_ERR_FORMAT naming NAME and the field. */
lh_err lh_report_eval_parse(const char *text, size_t len, const char *name, lh_report_eval *out);
void lh_report_eval_free(lh_report_eval *e);

typedef struct lh_report_config {
  const char *run_dir;   /* RUN: run.json, metrics.jsonl, [ledger.sqlite] */
  const char *out_path;  /* FILE.html, written atomically */
  const char *eval_json; /* an `eval --json` file, or NULL */
} lh_report_config;

/* What was drawn, for the command's summary and tests. */
typedef struct lh_report_summary {
  int plots;    /* charts drawn with data */
  int absent;   /* charts whose data the run lacks (each says so on the page) */
  int updates;  /* update lines read */
  int evals;    /* held-out evaluations read */
  int versions; /* published versions (serve runs) */
  int workers;  /* workers (serve runs) */
  size_t bytes; /* of the page */
} lh_report_summary;

/* Reads RUN (run.json and metrics.jsonl must be there; ledger.sqlite when the run was served,
 * opened only if it exists) and the eval JSON, and writes the page. summary may be NULL. */
lh_err lh_report_write(const lh_report_config *c, lh_report_summary *summary);

#endif
