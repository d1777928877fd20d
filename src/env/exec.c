/* exec: an environment served by an external program (any language) speaking one JSON object per
 * line on stdin/stdout (the protocol is in env.h). Each request has a deadline; a crash, a timeout,
 * a malformed reply (bad JSON, wrong fields, another request's request_id, more output after the
 * reply) or one longer than LH_EXEC_MAX_REPLY bytes is reported as an error for that request only,
 * and the program is restarted on the next one. Output the program writes between requests is
 * discarded and the program restarted, so a reply is only ever read as the answer to the request
 * just sent. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "env_impl.h"

typedef struct {
  pthread_mutex_t mu;
  pid_t pid; /* 0: not running */
  int fd;    /* our end of the socket pair that is the child's stdin and stdout */
  char *buf;
  size_t len, cap;
  uint64_t next_id; /* request_id of the next request */
} ex;

/* Kills the child and everything left in its process group, reaps the child, closes the socket.
 * Every way a child ends goes through here, so no helper it started outlives it. */
static void stop_child(ex *x) {
  if (x->pid <= 0) return;
  kill(-x->pid, SIGKILL); /* the child leads its own process group */
  kill(x->pid, SIGKILL);
  int st;
  while (waitpid(x->pid, &st, 0) < 0 && errno == EINTR) {
  }
  close(x->fd);
  x->pid = 0;
  x->fd = -1;
  x->len = 0;
}

static lh_err start_child(lh_env *env, ex *x) {
  int sv[2];
  /* a socket pair rather than pipes: send(MSG_NOSIGNAL) to a dead child fails with EPIPE
   * instead of raising SIGPIPE in the whole process */
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return lh_errorf(LH_ERR_IO, "exec '%s': socketpair: %s", env->cfg.path, strerror(errno));
  /* the child keeps stdin, stdout and stderr only; computed here, as the child may only make
   * async-signal-safe calls */
  struct rlimit rl;
  int max_fd = 65536;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)INT_MAX)
    max_fd = (int)rl.rlim_cur;
  pid_t pid = fork();
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    return lh_errorf(LH_ERR_IO, "exec '%s': fork: %s", env->cfg.path, strerror(errno));
  }
  if (pid == 0) {
    setpgid(0, 0);
    dup2(sv[1], 0);
    dup2(sv[1], 1);
    /* descriptors the trainer opened without close-on-exec (a run's metrics.jsonl, a ledger)
     * must not reach the program; close_range needs Linux 5.9, else close them one by one */
    if (close_range(3, ~0u, 0) != 0)
      for (int fd = 3; fd < max_fd; fd++)
        close(fd);
    execl("/bin/sh", "sh", "-c", env->cfg.path, (char *)NULL);
    _exit(127);
  }
  setpgid(pid, pid);
  close(sv[1]);
  x->pid = pid;
  x->fd = sv[0];
  x->len = 0;
  return LH_ERR_OK;
}

static int remaining_ms(double deadline) {
  double left = deadline - lh_time_now();
  return left <= 0 ? 0 : (int)(left * 1000) + 1;
}

/* Why the child stopped talking. Waits briefly for it to exit without reaping it, so its pid
 * (which is also its process group's id) cannot be reused before stop_child kills what is left
 * of the group (helpers it started) and reaps it. */
static lh_err child_gone(lh_env *env, ex *x, const char *what) {
  siginfo_t si;
  double until = lh_time_now() + 0.5;
  for (;;) {
    memset(&si, 0, sizeof si);
    int r = waitid(P_PID, (id_t)x->pid, &si, WEXITED | WNOHANG | WNOWAIT);
    if ((r == 0 && si.si_pid == x->pid) || (r < 0 && errno != EINTR) || lh_time_now() >= until)
      break;
    usleep(2000);
  }
  char why[64] = "closed its output";
  if (si.si_pid == x->pid && si.si_code == CLD_EXITED)
    snprintf(why, sizeof why, "exited with status %d", si.si_status);
  else if (si.si_pid == x->pid && (si.si_code == CLD_KILLED || si.si_code == CLD_DUMPED))
    snprintf(why, sizeof why, "killed by signal %d", si.si_status);
  stop_child(x);
  return lh_errorf(LH_ERR_IO, "exec '%s': %s: the program %s", env->cfg.path, what, why);
}

/* Before a request: anything the program wrote since its last reply (a banner, a log line, a
 * reply sent twice) or its end of output means it is out of step, so it is restarted. */
static void drain(lh_env *env, ex *x, const char *what) {
  if (x->pid == 0) return;
  bool stale = x->len > 0;
  char tmp[256];
  ssize_t r;
  do
    r = recv(x->fd, tmp, sizeof tmp, MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  if (r > 0) stale = true;
  if (!stale && r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
  lh_log(LH_LOG_WARN, "exec '%s': %s: the program %s since its last reply; restarting it",
         env->cfg.path, what,
         stale    ? "wrote output"
         : r == 0 ? "closed its output"
                  : "broke its connection");
  stop_child(x);
}

/* Sends one request line (with a fresh request_id) and reads one reply object; on any failure
 * the child is stopped. The caller holds x->mu. */
static lh_err exchange(lh_env *env, ex *x, json_t *req, const char *what, json_t **reply) {
  *reply = NULL;
  lh_err e;
  drain(env, x, what);
  if (x->pid == 0 && (e = start_child(env, x))) return e;
  double deadline = lh_time_now() + env->cfg.timeout_s;
  json_int_t id = (json_int_t)(x->next_id++ & INT64_MAX);
  if (json_object_set_new(req, "request_id", json_integer(id)))
    return lh_errorf(LH_ERR_NOMEM, "exec: cannot encode the request");
  char *line = json_dumps(req, JSON_COMPACT);
  if (!line) return lh_errorf(LH_ERR_NOMEM, "exec: cannot encode the request");
  size_t ll = strlen(line), off = 0;
  line[ll] = '\n'; /* json_dumps allocates ll + 1 bytes: the NUL becomes the newline */
  ll++;
  while (off < ll) {
    struct pollfd pf = {x->fd, POLLOUT, 0};
    int pr = poll(&pf, 1, remaining_ms(deadline));
    if (pr == 0) {
      free(line);
      stop_child(x);
      return lh_errorf(LH_ERR_IO, "exec '%s': %s: timed out after %g s writing the request",
                       env->cfg.path, what, env->cfg.timeout_s);
    }
    ssize_t w = pr > 0 ? send(x->fd, line + off, ll - off, MSG_NOSIGNAL | MSG_DONTWAIT) : -1;
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w < 0) {
      free(line);
      return child_gone(env, x, what);
    }
    off += (size_t)w;
  }
  free(line);
  for (;;) {
    char *nl = x->len ? memchr(x->buf, '\n', x->len) : NULL;
    if (nl) {
      size_t n = (size_t)(nl - x->buf);
      json_error_t jerr;
      json_t *v = json_loadb(x->buf, n, 0, &jerr);
      memmove(x->buf, nl + 1, x->len - n - 1);
      x->len -= n + 1;
      json_t *rid = v && json_is_object(v) ? json_object_get(v, "request_id") : NULL;
      if (!v || !json_is_object(v)) {
        e = lh_errorf(LH_ERR_FORMAT, "exec '%s': %s: malformed reply: %s", env->cfg.path, what,
                      v ? "expected a JSON object" : jerr.text);
      } else if (rid && !(json_is_integer(rid) && json_integer_value(rid) == id)) {
        char found[32] = "a non-integer";
        if (json_is_integer(rid))
          snprintf(found, sizeof found, "%" JSON_INTEGER_FORMAT, json_integer_value(rid));
        e = lh_errorf(
            LH_ERR_FORMAT,
            "exec '%s': %s: malformed reply: request_id %s, the request's is %" JSON_INTEGER_FORMAT
            " (a reply to an earlier request?)",
            env->cfg.path, what, found, id);
      } else if (x->len) {
        e = lh_errorf(LH_ERR_FORMAT,
                      "exec '%s': %s: malformed reply: more output after the reply line (write "
                      "exactly one line per request)",
                      env->cfg.path, what);
      } else {
        *reply = v;
        return LH_ERR_OK;
      }
      json_decref(v);
      stop_child(x);
      return e;
    }
    if (x->len >= LH_EXEC_MAX_REPLY) {
      stop_child(x);
      return lh_errorf(LH_ERR_LIMIT, "exec '%s': %s: reply longer than %u bytes", env->cfg.path,
                       what, LH_EXEC_MAX_REPLY);
    }
    if (x->cap - x->len < 4096) {
      size_t nc = x->cap ? x->cap * 2 : 8192;
      if (nc > LH_EXEC_MAX_REPLY + 4096) nc = LH_EXEC_MAX_REPLY + 4096;
      char *nb = realloc(x->buf, nc);
      if (!nb) return lh_errorf(LH_ERR_NOMEM, "exec: out of memory");
      x->buf = nb;
      x->cap = nc;
    }
    struct pollfd pf = {x->fd, POLLIN, 0};
    int pr = poll(&pf, 1, remaining_ms(deadline));
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) {
      stop_child(x);
      return lh_errorf(LH_ERR_IO, "exec '%s': %s: no reply within %g s", env->cfg.path, what,
                       env->cfg.timeout_s);
    }
    ssize_t r = recv(x->fd, x->buf + x->len, x->cap - x->len, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return child_gone(env, x, what);
    x->len += (size_t)r;
  }
}

/* Reads the fields of a reply into out; LH_ERR_FORMAT when they are wrong. */
typedef lh_err (*take_fn)(lh_env *env, const char *what, json_t *reply, void *out);

/* One request under the program's lock; takes ownership of req. A reply whose fields are wrong
 * stops the program like any other malformed reply. */
static lh_err request(lh_env *env, ex *x, json_t *req, const char *what, take_fn take, void *out) {
  json_t *rep = NULL;
  pthread_mutex_lock(&x->mu);
  lh_err e = exchange(env, x, req, what, &rep);
  if (!e && (e = take(env, what, rep, out)) == LH_ERR_FORMAT) stop_child(x);
  pthread_mutex_unlock(&x->mu);
  json_decref(rep);
  json_decref(req);
  return e;
}

lh_err lh__exec_take_task(lh_env *env, const char *what, json_t *rep, void *out) {
  lh_env_task *task = out;
  lh_err e = LH_ERR_OK;
  json_t *p = json_object_get(rep, "prompt"), *a = json_object_get(rep, "answer");
  json_t *s = json_object_get(rep, "solution");
  if (!json_is_string(p) || !json_is_string(a) || (s && !json_is_string(s))) {
    e = lh_errorf(LH_ERR_FORMAT,
                  "exec '%s': %s: malformed reply: expected string fields prompt and answer "
                  "(and optional solution)",
                  env->cfg.path, what);
  } else {
    task->prompt = lh__env_strndup(json_string_value(p), json_string_length(p));
    task->answer = lh__env_strndup(json_string_value(a), json_string_length(a));
    if (s) task->solution = lh__env_strndup(json_string_value(s), json_string_length(s));
    if (!task->prompt || !task->answer || (s && !task->solution)) {
      lh_env_task_clear(task);
      e = lh_errorf(LH_ERR_NOMEM, "exec: out of memory");
    }
  }
  return e;
}

static lh_err exec_task(lh_env *env, lh_split split, uint64_t index, lh_env_task *task) {
  ex *x = env->impl;
  char what[64];
  snprintf(what, sizeof what, "generate %s %llu", split == LH_SPLIT_TEST ? "test" : "train",
           (unsigned long long)index);
  json_t *req = json_pack("{s:s, s:s, s:I}", "type", "generate", "split",
                          split == LH_SPLIT_TEST ? "test" : "train", "index", (json_int_t)index);
  if (!req) return lh_errorf(LH_ERR_NOMEM, "exec: cannot encode the request");
  lh_err e = request(env, x, req, what, lh__exec_take_task, task);
  if (!e) {
    task->split = split;
    task->index = index;
  }
  return e;
}

lh_err lh__exec_take_result(lh_env *env, const char *what, json_t *rep, void *out_) {
  lh_env_result *out = out_;
  lh_err e = LH_ERR_OK;
  json_t *r = json_object_get(rep, "reward"), *c = json_object_get(rep, "correct");
  json_t *w = json_object_get(rep, "well_formed");
  double v = json_is_number(r) ? json_number_value(r) : -1;
  if (!(v >= 0 && v <= 1) || (c && !json_is_boolean(c)) || (w && !json_is_boolean(w))) {
    e = lh_errorf(LH_ERR_FORMAT,
                  "exec '%s': %s: malformed reply: expected reward in [0, 1] (and optional "
                  "booleans correct, well_formed)",
                  env->cfg.path, what);
  } else {
    out->reward = (float)v;
    /* from the reward as stored: 0.9999999999 becomes 1 and so is correct */
    out->correct = c ? json_is_true(c) : out->reward >= 1.0f;
    out->well_formed = w ? json_is_true(w) : true;
  }
  return e;
}

static lh_err exec_score(lh_env *env, const lh_env_task *task, const char *text, size_t len,
                         lh_env_result *out) {
  ex *x = env->impl;
  char what[64];
  snprintf(what, sizeof what, "score %s %llu", task->split == LH_SPLIT_TEST ? "test" : "train",
           (unsigned long long)task->index);
  json_t *req = json_pack("{s:s, s:o, s:o, s:o}", "type", "score", "prompt",
                          lh_json_text(task->prompt, strlen(task->prompt)), "answer",
                          lh_json_text(task->answer, strlen(task->answer)), "completion",
                          lh_json_text(text, len));
  if (!req) return lh_errorf(LH_ERR_NOMEM, "exec: cannot encode the request");
  return request(env, x, req, what, lh__exec_take_result, out);
}

static uint64_t exec_size(const lh_env *env, lh_split split) {
  return 0;
}

static void exec_free(lh_env *env) {
  ex *x = env->impl;
  if (!x) return;
  stop_child(x);
  pthread_mutex_destroy(&x->mu);
  free(x->buf);
  free(x);
  env->impl = NULL;
}

lh_err lh__env_exec_init(lh_env *env) {
  /* settled: a command given, timeout in (0, 3600] */
  ex *x = lh_xcalloc(1, sizeof *x);
  pthread_mutex_init(&x->mu, NULL);
  x->fd = -1;
  env->impl = x;
  return LH_ERR_OK;
}

const lh__env_ops lh__env_exec_ops = {exec_task, exec_score, exec_size, exec_free};
