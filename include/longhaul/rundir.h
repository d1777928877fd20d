/* longhaul rundir: the run directory every training driver writes (`rl`, and next `serve`).
 *
 *   RUN/run.json            the settings (the driver's JSON), with the command line, longhaul's
 *                           version and the start time
 *   RUN/metrics.jsonl       one JSON object per step, each with a wall-clock "time"
 *   RUN/checkpoints/step-NNNNNN/   Hugging Face model directories plus the trainer's state
 *   RUN/latest              "step-NNNNNN\n": the newest complete checkpoint
 *   RUN/.lock               held (flock) by the one process that writes the run
 *
 * A checkpoint is written into step-NNNNNN.tmp, renamed, and only then named by `latest`, so a
 * kill at any moment leaves the previous checkpoint in force. Ownership: lh_rundir_close frees
 * the handle, releases the lock and accepts NULL; strings returned are malloc'd for the caller.
 * Thread safety: a handle is used by one thread at a time; two processes cannot hold one run. */
#ifndef LONGHAUL_RUNDIR_H
#define LONGHAUL_RUNDIR_H

#include <stdbool.h>
#include <stdint.h>

#include "longhaul/base.h"

struct json_t;
typedef struct lh_rundir lh_rundir;

typedef enum {
  LH_RUNDIR_CREATE = 0, /* a new run: the directory may exist but hold no run */
  LH_RUNDIR_RESUME = 1, /* an existing run: run.json must be there */
} lh_rundir_mode;

/* Opens (creating it and its parents with CREATE) and locks the run directory. A directory
 * another process holds is LH_ERR_IO naming it; CREATE on a directory that holds a run (run.json
 * or latest) is LH_ERR_INVAL ("resume it with --resume or choose another --out"); RESUME of a
 * directory without run.json is LH_ERR_NOTFOUND. Temporary files of writes a killed process left
 * behind are removed. */
lh_err lh_rundir_open(const char *path, lh_rundir_mode mode, lh_rundir **out);
/* Releases the lock. A run that failed to start (no checkpoint and no metrics line was written)
 * is removed first when `discard` is true: what this handle created goes (the files it wrote,
 * and the directory when CREATE made it); nothing else is touched. */
void lh_rundir_close(lh_rundir *r, bool discard);
const char *lh_rundir_path(const lh_rundir *r);
/* PATH/name, malloc'd. */
char *lh_rundir_file(const lh_rundir *r, const char *name);

/* Writes run.json: `settings` (an object, not taken) with "command" (argv joined), "version"
 * and "started" (UTC, ISO 8601) added. */
lh_err lh_rundir_write_settings(lh_rundir *r, const struct json_t *settings, int argc,
                                char *const *argv);
/* Reads run.json (a new reference for the caller). */
lh_err lh_rundir_read_settings(const lh_rundir *r, struct json_t **out);

/* The newest complete checkpoint of the run at `path` (RUN/latest): its step and directory
 * (*dir malloc'd, may be NULL). No lock is needed. LH_ERR_NOTFOUND when there is none yet. */
lh_err lh_rundir_latest(const char *path, int64_t *step, char **dir);
/* What a --model argument names: a run directory (its latest checkpoint), RUN/latest (the same),
 * or a model directory (itself). *dir is malloc'd. */
lh_err lh_rundir_resolve_model(const char *arg, char **dir);

/* Starts checkpoint `step`: an empty RUN/checkpoints/step-NNNNNN.tmp (whatever a killed write
 * left there is removed); *tmp is its path. */
lh_err lh_rundir_checkpoint_begin(lh_rundir *r, int64_t step, char **tmp);
/* Completes it: renames the directory into place (replacing an older one of the same step),
 * points `latest` at it, then deletes all but the newest `keep` checkpoints of steps <= step (0
 * keeps all; a directory that cannot be removed is reported and left). *dir (may be NULL) is the
 * checkpoint's path. */
lh_err lh_rundir_checkpoint_commit(lh_rundir *r, int64_t step, int keep, char **dir);

/* Opens metrics.jsonl for appending, keeping the lines of steps <= keep_step (a resumed run
 * rewrites what followed; keep_step 0 on a new run empties it). */
lh_err lh_rundir_metrics_open(lh_rundir *r, int64_t keep_step);
/* Appends one line: `line` (an object, not taken) with "time" (UTC, ISO 8601 with milliseconds)
 * added, flushed. A full disk is LH_ERR_IO. */
lh_err lh_rundir_metrics_append(lh_rundir *r, struct json_t *line);

#endif
