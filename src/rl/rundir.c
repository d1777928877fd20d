/* longhaul rundir: the run directory (rundir.h). Locking with flock on RUN/.lock, run.json,
 * checkpoints written beside their final name and renamed, `latest`, pruning, and metrics.jsonl
 * with its truncation on resume. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/rundir.h"

#define SETTINGS_MAX (1u << 20) /* bytes of run.json */
#define METRICS_LINE (1 << 16)  /* bytes of one metrics line at most */

struct lh_rundir {
  char *path;
  char *created_from; /* the directory this open made first (path or one of its parents), or
                       * NULL: removed, from path up to it, when a failed start is discarded */
  int lock_fd;
  bool created_dir;   /* this open made the directory */
  bool wrote_durable; /* a checkpoint or a metrics line exists: never discard */
  bool wrote_settings;
  bool resumed;
  bool opened_metrics; /* metrics.jsonl is this handle's (it emptied or created it) */
  FILE *metrics;
};

const char *lh_rundir_path(const lh_rundir *r) {
  return r->path;
}

char *lh_rundir_file(const lh_rundir *r, const char *name) {
  return lh_path_join(r->path, name);
}

static bool exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* ---------------------------------------------------------------- open and close */

static lh_err lock(lh_rundir *r) {
  char *p = lh_rundir_file(r, ".lock");
  lh_err e = LH_ERR_OK;
  int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    e = lh_errorf(LH_ERR_IO, "%s: cannot open: %s", p, strerror(errno));
    goto out;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    char pid[32] = "";
    ssize_t got = pread(fd, pid, sizeof pid - 1, 0);
    pid[got > 0 ? got : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    close(fd);
    if (err == EWOULDBLOCK)
      e = lh_errorf(LH_ERR_IO,
                    "%s is in use by another longhaul process%s%s%s: wait for it to end, or "
                    "choose another directory",
                    r->path, pid[0] ? " (pid " : "", pid, pid[0] ? ")" : "");
    else
      e = lh_errorf(LH_ERR_IO, "%s: cannot lock: %s", p, strerror(err));
    goto out;
  }
  char line[32];
  int n = snprintf(line, sizeof line, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n) {
    /* the pid is only a hint for the message above; the lock itself is held */
  }
  r->lock_fd = fd;
out:
  free(p);
  return e;
}

lh_err lh_rundir_open(const char *path, lh_rundir_mode mode, lh_rundir **out) {
  *out = NULL;
  if (!path || !path[0]) return lh_errorf(LH_ERR_INVAL, "run directory: empty path");
  lh_rundir *r = lh_xcalloc(1, sizeof *r);
  r->path = lh_xstrdup(path);
  r->lock_fd = -1;
  r->resumed = mode == LH_RUNDIR_RESUME;
  lh_err e = LH_ERR_OK;
  struct stat sb;
  if (stat(path, &sb) != 0) {
    if (errno != ENOENT || mode == LH_RUNDIR_RESUME) {
      e = lh_errorf(mode == LH_RUNDIR_RESUME && errno == ENOENT ? LH_ERR_NOTFOUND : LH_ERR_IO,
                    "%s: cannot %s: %s", path, mode == LH_RUNDIR_RESUME ? "resume" : "open",
                    strerror(errno));
      goto fail;
    }
    /* the outermost directory that does not exist yet is the first that mkdir -p makes */
    char *p = lh_xstrdup(path), *top = NULL;
    for (;;) {
      size_t len = strlen(p);
      while (len > 1 && p[len - 1] == '/')
        p[--len] = '\0';
      if (stat(p, &sb) == 0) break;
      free(top);
      top = lh_xstrdup(p);
      char *slash = strrchr(p, '/');
      if (!slash || slash == p) break;
      *slash = '\0';
    }
    free(p);
    r->created_from = top;
    if ((e = lh_mkdir_p(path))) goto fail;
    r->created_dir = true;
  } else if (!S_ISDIR(sb.st_mode)) {
    e = lh_errorf(LH_ERR_INVAL, "%s: not a directory", path);
    goto fail;
  }
  if ((e = lock(r))) goto fail;
  { /* temporary files that killed writes left (a checkpoint being written keeps its own, inside
     * step-N.tmp, which checkpoint_begin removes) */
    char *ck = lh_rundir_file(r, "checkpoints");
    lh_file_clean_stale_tmp(r->path);
    struct stat cs;
    if (stat(ck, &cs) == 0 && S_ISDIR(cs.st_mode)) lh_file_clean_stale_tmp(ck);
    free(ck);
  }
  char *settings = lh_rundir_file(r, "run.json"), *latest = lh_rundir_file(r, "latest"),
       *metrics = lh_rundir_file(r, "metrics.jsonl"), *ck = lh_rundir_file(r, "checkpoints");
  bool has_settings = exists(settings), has_latest = exists(latest);
  const char *seen = has_latest        ? latest
                     : has_settings    ? settings
                     : exists(metrics) ? metrics
                     : exists(ck)      ? ck
                                       : NULL;
  if (mode == LH_RUNDIR_CREATE && seen)
    e = lh_errorf(LH_ERR_INVAL,
                  "%s already holds a run (see %s): resume it with --resume or choose another "
                  "--out",
                  path, seen);
  else if (mode == LH_RUNDIR_RESUME && !has_settings)
    e = lh_errorf(LH_ERR_NOTFOUND, "%s: cannot resume: no run.json (not a run directory?)", path);
  free(settings);
  free(latest);
  free(metrics);
  free(ck);
  if (e) goto fail;
  *out = r;
  return LH_ERR_OK;
fail:
  lh_rundir_close(r, r->created_dir);
  return e;
}

/* Whether `name` is a file a checkpoint directory holds: its model files, the trainer's state,
 * or a temporary file of one of them (NAME.tmp.PID.N) that a killed write left. */
static bool checkpoint_file(const char *name) {
  static const char *const files[] = {"config.json",
                                      "model.safetensors",
                                      "tokenizer.json",
                                      "generation_config.json",
                                      "model.safetensors.index.json",
                                      "trainer_state.safetensors"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    size_t n = strlen(files[i]);
    if (!strncmp(name, files[i], n) && (name[n] == '\0' || !strncmp(name + n, ".tmp.", 5)))
      return true;
  }
  return false;
}

/* Removes a checkpoint directory: its own files (checkpoint_file), then `dir` itself. Any other
 * file is not longhaul's: it stays, rmdir fails (ENOTEMPTY) and the caller reports it. A missing
 * `dir` is success. */
static int remove_flat_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : -1;
  struct dirent *ent;
  while ((ent = readdir(d)))
    if (checkpoint_file(ent->d_name)) {
      char *p = lh_path_join(dir, ent->d_name);
      unlink(p);
      free(p);
    }
  closedir(d);
  return rmdir(dir);
}

void lh_rundir_close(lh_rundir *r, bool discard) {
  if (!r) return;
  if (r->metrics) fclose(r->metrics);
  if (discard && !r->resumed && !r->wrote_durable && r->lock_fd >= 0) {
    /* what this start wrote: run.json, an empty metrics.jsonl, the checkpoints directory with
     * at most an unfinished step-N.tmp, the lock */
    const char *names[] = {"run.json", "metrics.jsonl"};
    bool ours[] = {r->wrote_settings, r->opened_metrics};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      char *p = lh_rundir_file(r, names[i]);
      if (ours[i]) unlink(p);
      free(p);
    }
    char *ck = lh_rundir_file(r, "checkpoints");
    DIR *d = opendir(ck);
    if (d) {
      struct dirent *ent;
      while ((ent = readdir(d))) {
        size_t n = strlen(ent->d_name);
        if (n > 4 && !strcmp(ent->d_name + n - 4, ".tmp")) {
          char *p = lh_path_join(ck, ent->d_name);
          remove_flat_dir(p);
          free(p);
        }
      }
      closedir(d);
      rmdir(ck); /* only when empty */
    }
    free(ck);
    char *lk = lh_rundir_file(r, ".lock");
    unlink(lk);
    free(lk);
    if (r->created_dir) { /* only when empty: nothing of anyone else's goes */
      char *p = lh_xstrdup(r->path);
      for (;;) {
        size_t len = strlen(p);
        while (len > 1 && p[len - 1] == '/')
          p[--len] = '\0';
        if (rmdir(p) != 0 || !r->created_from || !strcmp(p, r->created_from)) break;
        char *slash = strrchr(p, '/');
        if (!slash || slash == p) break;
        *slash = '\0';
      }
      free(p);
    }
  }
  if (r->lock_fd >= 0) close(r->lock_fd); /* releases the flock */
  free(r->created_from);
  free(r->path);
  free(r);
}

/* ---------------------------------------------------------------- run.json */

lh_err lh_rundir_write_settings(lh_rundir *r, const json_t *settings, int argc, char *const *argv) {
  json_t *o = json_deep_copy(settings);
  if (!o || !json_is_object(o)) {
    json_decref(o);
    return lh_errorf(LH_ERR_NOMEM, "cannot encode the run settings");
  }
  size_t cap = 1;
  for (int i = 0; i < argc; i++)
    cap += strlen(argv[i]) + 1;
  char *cmd = lh_xmalloc(cap), started[32];
  cmd[0] = '\0';
  for (int i = 0, at = 0; i < argc; i++)
    at += snprintf(cmd + at, cap - (size_t)at, "%s%s", i ? " " : "", argv[i]);
  lh_time_utc(started, sizeof started, 0);
  json_object_set_new(o, "command", lh_json_text(cmd, strlen(cmd)));
  json_object_set_new(o, "longhaul_version", json_string(LH_VERSION));
  json_object_set_new(o, "started", json_string(started));
  free(cmd);
  char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
  json_decref(o);
  if (!text) return lh_errorf(LH_ERR_NOMEM, "cannot encode the run settings");
  size_t len = strlen(text);
  text[len] = '\n'; /* json_dumps allocates len + 1 bytes: the NUL becomes the newline */
  char *p = lh_rundir_file(r, "run.json");
  lh_err e = lh_file_write_atomic(p, text, len + 1);
  free(p);
  free(text);
  if (!e) r->wrote_settings = true;
  return e;
}

lh_err lh_rundir_read_settings(const lh_rundir *r, json_t **out) {
  *out = NULL;
  char *p = lh_rundir_file(r, "run.json"), *text = NULL;
  size_t len = 0;
  lh_err e = lh_file_read(p, SETTINGS_MAX, &text, &len);
  if (!e) {
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je);
    if (!o || !json_is_object(o)) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: %s (line %d)", p, o ? "expected an object" : je.text,
                    je.line);
      json_decref(o);
    } else {
      *out = o;
    }
  }
  free(text);
  free(p);
  return e;
}

/* ---------------------------------------------------------------- latest and --model */

lh_err lh_rundir_latest(const char *path, int64_t *step, char **dir) {
  if (dir) *dir = NULL;
  char *p = lh_path_join(path, "latest"), *text = NULL;
  size_t len = 0;
  lh_err e;
  if (!exists(p)) {
    e = lh_errorf(LH_ERR_NOTFOUND, "%s: no checkpoint yet (no %s)", path, p);
    goto out;
  }
  if ((e = lh_file_read(p, 64, &text, &len))) goto out;
  while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' '))
    text[--len] = '\0';
  unsigned long long v;
  int used = 0;
  if (sscanf(text, "step-%llu%n", &v, &used) != 1 || (size_t)used != len ||
      v > (unsigned long long)INT64_MAX) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: expected \"step-NNNNNN\"", p);
    goto out;
  }
  *step = (int64_t)v;
  if (dir) {
    char *ck = lh_path_join(path, "checkpoints");
    *dir = lh_path_join(ck, text);
    free(ck);
  }
out:
  free(text);
  free(p);
  return e;
}

lh_err lh_rundir_resolve_model(const char *arg, char **dir) {
  *dir = NULL;
  struct stat sb;
  if (stat(arg, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    char *cfg = lh_path_join(arg, "config.json"), *latest = lh_path_join(arg, "latest");
    bool model = exists(cfg), run = exists(latest);
    free(cfg);
    free(latest);
    if (!model && run) { /* a run directory: its newest checkpoint */
      int64_t step;
      return lh_rundir_latest(arg, &step, dir);
    }
    if (!model && !run) {
      char *settings = lh_path_join(arg, "run.json");
      bool is_run = exists(settings);
      free(settings);
      if (is_run)
        return lh_errorf(LH_ERR_NOTFOUND,
                         "%s is a run directory without a checkpoint yet (no %s/latest)", arg, arg);
    }
  } else if (stat(arg, &sb) == 0 && S_ISREG(sb.st_mode)) {
    size_t n = strlen(arg);
    if (n >= 6 && !strcmp(arg + n - 6, "latest") && (n == 6 || arg[n - 7] == '/')) {
      char *parent = lh_xstrdup(arg); /* RUN/latest: RUN's newest checkpoint */
      parent[n - 6] = '\0';
      if (!parent[0]) strcpy(parent, ".");
      int64_t step;
      lh_err e = lh_rundir_latest(parent, &step, dir);
      free(parent);
      return e;
    }
  }
  *dir = lh_xstrdup(arg); /* a model directory, or what the loader will explain */
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- checkpoints */

static char *step_dir(const lh_rundir *r, int64_t step, const char *suffix) {
  char name[64];
  snprintf(name, sizeof name, "checkpoints/step-%06lld%s", (long long)step, suffix);
  return lh_rundir_file(r, name);
}

lh_err lh_rundir_checkpoint_begin(lh_rundir *r, int64_t step, char **tmp) {
  *tmp = step_dir(r, step, ".tmp");
  /* A run killed while writing this step left step-N.tmp, perhaps with partial FILE.tmp.PID.N
   * files: start from an empty directory, so they are not renamed into the checkpoint. */
  if (remove_flat_dir(*tmp) != 0) {
    lh_err e = lh_errorf(LH_ERR_IO, "%s: cannot remove the unfinished checkpoint: %s", *tmp,
                         strerror(errno));
    free(*tmp);
    *tmp = NULL;
    return e;
  }
  lh_err e = lh_mkdir_p(*tmp);
  if (e) {
    free(*tmp);
    *tmp = NULL;
  }
  return e;
}

static int cmp_desc_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x < y) - (x > y);
}

/* Deletes the checkpoints of steps <= `step` but the newest `keep` of them (0: keeps all), and
 * the step-N.tmp directories of steps <= `step` that a killed run left. Directories of later
 * steps (left by a run that stopped before `latest` named them) are replaced when the run
 * reaches them, so they are not touched here. A directory that cannot be removed is reported
 * and left: losing an old checkpoint never stops training. */
static void prune(const lh_rundir *r, int keep, int64_t step) {
  if (keep <= 0) return;
  char *dir = lh_rundir_file(r, "checkpoints");
  DIR *d = opendir(dir);
  if (!d) {
    free(dir);
    return;
  }
  int64_t *steps = NULL;
  size_t n = 0, cap = 0;
  struct dirent *ent;
  while ((ent = readdir(d))) {
    unsigned long long v;
    char name[64];
    if (sscanf(ent->d_name, "step-%llu", &v) != 1 || v > (unsigned long long)step) continue;
    snprintf(name, sizeof name, "step-%06llu.tmp", v);
    if (!strcmp(name, ent->d_name)) { /* a write a killed run did not finish */
      char *p = lh_path_join(dir, name);
      if (remove_flat_dir(p) != 0)
        lh_log(LH_LOG_WARN, "--keep: cannot remove %s: %s", p, strerror(errno));
      free(p);
      continue;
    }
    name[strlen(name) - 4] = '\0';
    if (strcmp(name, ent->d_name) != 0) continue; /* other names */
    if (n == cap) {
      int64_t *more = realloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *steps);
      if (!more) { /* out of memory: prune nothing this time */
        n = 0;
        break;
      }
      steps = more;
    }
    steps[n++] = (int64_t)v;
  }
  closedir(d);
  if (n > 1) qsort(steps, n, sizeof *steps, cmp_desc_i64);
  for (size_t i = (size_t)keep; i < n; i++) {
    char *p = step_dir(r, steps[i], "");
    if (remove_flat_dir(p) != 0)
      lh_log(LH_LOG_WARN, "--keep: cannot remove %s: %s", p, strerror(errno));
    free(p);
  }
  free(steps);
  free(dir);
}

lh_err lh_rundir_checkpoint_commit(lh_rundir *r, int64_t step, int keep, char **out) {
  if (out) *out = NULL;
  char *tmp = step_dir(r, step, ".tmp"), *dir = step_dir(r, step, ""),
       *latest = lh_rundir_file(r, "latest");
  /* An older directory of the same step (from a run that stopped before `latest` named it) is
   * replaced. */
  remove_flat_dir(dir);
  lh_err e = lh_file_commit(tmp, dir); /* renamed and on disk before `latest` names it */
  if (!e) {
    char line[64];
    int len = snprintf(line, sizeof line, "step-%06lld\n", (long long)step);
    e = lh_file_write_atomic(latest, line, (size_t)len);
  }
  if (!e) {
    r->wrote_durable = true;
    prune(r, keep, step);
    if (out) *out = dir, dir = NULL;
  }
  free(tmp);
  free(dir);
  free(latest);
  return e;
}

/* ---------------------------------------------------------------- metrics.jsonl */

/* Keeps the metrics lines of steps <= step: reads the file a line at a time, whatever its size,
 * and cuts it after the last line to keep. A line that is not a metrics object of such a step,
 * or longer than any metrics line, ends the kept part (a line cut short by a kill included). */
static lh_err metrics_truncate(const char *path, int64_t step) {
  FILE *f = fopen(path, "rbe");
  if (!f) {
    if (errno == ENOENT) return LH_ERR_OK; /* no metrics yet */
    return lh_errorf(LH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  }
  char *line = lh_xmalloc(METRICS_LINE);
  off_t keep = 0;
  while (fgets(line, METRICS_LINE, f)) {
    size_t n = strlen(line);
    if (n == 0 || line[n - 1] != '\n') break; /* too long, a NUL byte, or cut short */
    json_t *o = json_loadb(line, n, 0, NULL);
    json_t *s = o ? json_object_get(o, "step") : NULL;
    int ok = s && json_is_integer(s) && json_integer_value(s) <= step;
    json_decref(o);
    if (!ok) break;
    keep += (off_t)n;
  }
  int bad = ferror(f);
  free(line);
  fclose(f);
  if (bad) return lh_errorf(LH_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
  if (truncate(path, keep) != 0)
    return lh_errorf(LH_ERR_IO, "%s: cannot truncate: %s", path, strerror(errno));
  return LH_ERR_OK;
}

lh_err lh_rundir_metrics_open(lh_rundir *r, int64_t keep_step) {
  char *p = lh_rundir_file(r, "metrics.jsonl");
  lh_err e = LH_ERR_OK;
  if (keep_step > 0) {
    e = metrics_truncate(p, keep_step);
  } else if (unlink(p) != 0 && errno != ENOENT) {
    e = lh_errorf(LH_ERR_IO, "%s: cannot remove: %s", p, strerror(errno));
  }
  if (!e && !(r->metrics = fopen(p, "ae")))
    e = lh_errorf(LH_ERR_IO, "%s: cannot open: %s", p, strerror(errno));
  if (!e) r->opened_metrics = true;
  free(p);
  return e;
}

lh_err lh_rundir_metrics_append(lh_rundir *r, json_t *line) {
  LH_CHECK(r->metrics, "lh_rundir_metrics_append before lh_rundir_metrics_open");
  char now[40];
  lh_time_utc(now, sizeof now, 1);
  json_t *o = json_deep_copy(line);
  char *text = NULL;
  if (o && !json_object_set_new(o, "time", json_string(now)))
    text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
  json_decref(o);
  if (!text) return lh_errorf(LH_ERR_NOMEM, "cannot encode a metrics line");
  int wrote = fprintf(r->metrics, "%s\n", text) >= 0 && fflush(r->metrics) == 0;
  free(text);
  if (!wrote) /* a full disk: stop before steps go unrecorded */
    return lh_errorf(LH_ERR_IO, "%s/metrics.jsonl: cannot write: %s", r->path, strerror(errno));
  r->wrote_durable = true;
  return LH_ERR_OK;
}
