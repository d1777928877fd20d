/* exec: an environment served by an external program (any language) speaking one JSON object per
 * line on stdin/stdout (the protocol is in env.h). Each request has a deadline; a crash, a timeout,
 * a malformed reply (bad JSON, wrong fields, another request's request_id, more output after the
 * reply) or one longer than LH_EXEC_MAX_REPLY bytes is reported as an error for that request only,
 * and the program is restarted on the next one. Output the program writes between requests is
 * discarded and the program restarted, so a reply is only ever read as the answer to the request
 * just sent. The program runs under a keeper process (below), so nothing it starts outlives it,
 * a restart, lh_env_free or the trainer's death. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "env_impl.h"

/* the command (from the spec) and the program's text in messages */
#define ESC(s) LH__ENV_ESC_PATH((s), strlen(s))

static int remaining_ms(double deadline) {
  double left = deadline - lh_time_now();
  return left <= 0 ? 0 : (int)(left * 1000) + 1;
}

typedef struct {
  pthread_mutex_t mu;
  pid_t pid;      /* 0: not running; the keeper, or without one the program itself */
  bool keeper;    /* pid is a keeper (see below) */
  bool no_keeper; /* a keeper could not be started: programs run without one from now on */
  int fd;         /* our end of the socket pair that is the program's stdin and stdout */
  int life;       /* the write end of the keeper's lifeline; -1 without a keeper */
  char *buf;
  size_t len, cap;
  uint64_t next_id; /* request_id of the next request */
} ex;

/* ---- the keeper ----
 *
 * The program does not run as the trainer's child but as the child of a keeper: the trainer's
 * executable again (/proc/self/exe, run afresh, so it holds none of the trainer's memory), which
 * the constructor below turns into keeper_main before main() runs. The keeper is a child
 * subreaper (PR_SET_CHILD_SUBREAPER), so every process the program starts, also one that called
 * setsid() or double-forked, stays its descendant; the program runs in its own process group with
 * PR_SET_PDEATHSIG(SIGKILL). The keeper ends everything once
 *   - its lifeline, a pipe whose only write end the trainer holds, reads end of file: the trainer
 *     closed it (stop_child) or died, SIGKILL included; it also checks getppid() every 250 ms,
 *     for a lifeline a forked copy of the trainer might still hold;
 *   - it gets SIGTERM, SIGINT or SIGHUP;
 *   - the program exits: its helpers do not outlive it, and the keeper exits as the program did
 *     (the same status, or killed by the same signal), which the trainer reports.
 * Ending everything: SIGKILL to the program's group and to every child of the keeper (and the
 * group it leads), reaping them, again until the keeper has no child left; orphans of killed
 * processes come back to the keeper as it is their subreaper. So no descendant survives
 * stop_child, a restart or the trainer's death. Descriptors: 0 and 1 the socket, 2 stderr, 3 the
 * lifeline, 4 the start-up report ('K': the program runs; 'F': it could not be started). */

#define KEEPER_ENV     "LONGHAUL_EXEC_KEEPER"         /* the trainer's pid */
#define KEEPER_CMD_ENV "LONGHAUL_EXEC_KEEPER_COMMAND" /* the program's command */
#define KEEPER_ARGV0   "longhaul-exec-keeper"

static volatile sig_atomic_t keeper_stop;
static int keeper_wake = -1; /* write end of the keeper's self-pipe */

static void keeper_signal(int sig) {
  int saved = errno;
  if (sig != SIGCHLD) keeper_stop = 1;
  if (write(keeper_wake, "", 1) < 0) {
  } /* full: a wake-up is pending anyway */
  errno = saved;
}

/* The parent of process pid, from /proc/PID/stat ("PID (COMM) STATE PPID ..."; COMM may hold
 * spaces and parentheses, so the last ')' ends it); -1 when it is gone. */
static pid_t parent_of(const char *pid) {
  char path[64], st[512];
  snprintf(path, sizeof path, "/proc/%s/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, st, sizeof st - 1);
  close(fd);
  if (n <= 0) return -1;
  st[n] = '\0';
  char *paren = strrchr(st, ')');
  int ppid;
  if (!paren || sscanf(paren + 1, " %*c %d", &ppid) != 1) return -1;
  return (pid_t)ppid;
}

/* SIGKILL to every child of the keeper and to the process group each leads (a child that
 * called setsid()); false when there was none. A child's pid cannot be reused while it is
 * unreaped, nor can a group's id while the group has members, so no other process is hit. */
static bool kill_children(void) {
  pid_t self = getpid();
  bool any = false;
  DIR *d = opendir("/proc");
  if (!d) return false;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] < '0' || de->d_name[0] > '9' || parent_of(de->d_name) != self) continue;
    pid_t pid = (pid_t)atol(de->d_name);
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    any = true;
  }
  closedir(d);
  return any;
}

/* Kills the program's group (prog > 0: the program, not yet reaped) and every descendant, and
 * reaps them all; returns the program's wait status (when prog > 0). */
static int kill_tree(pid_t prog) {
  int prog_status = 0;
  if (prog > 0) kill(-prog, SIGKILL);
  for (;;) {
    kill_children();
    for (;;) {
      int st;
      pid_t w = waitpid(-1, &st, WNOHANG);
      if (w == prog && prog > 0) prog_status = st;
      if (w <= 0) {
        if (w < 0 && errno == ECHILD) return prog_status;
        break;
      }
    }
    usleep(1000);
  }
}

static int keeper_main(const char *cmd, pid_t trainer) {
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  fcntl(3, F_SETFD, FD_CLOEXEC);
  fcntl(4, F_SETFD, FD_CLOEXEC);
  int sp[2];
  if (pipe2(sp, O_CLOEXEC | O_NONBLOCK) != 0) {
    if (write(4, "F", 1) < 0) {
    }
    return 127;
  }
  keeper_wake = sp[1];
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = keeper_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_NOCLDSTOP;
  int sigs[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    sigaction(sigs[i], &sa, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL); /* the program starts with no signal blocked */
  pid_t self = getpid();
  pid_t prog = fork();
  if (prog == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != self) _exit(127); /* the keeper died before prctl took effect */
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  if (prog < 0) {
    fprintf(stderr, "longhaul: exec keeper: fork: %s\n", strerror(errno));
    if (write(4, "F", 1) < 0) {
    }
    return 127;
  }
  setpgid(prog, prog);
  /* the socket stays with the program: it must read end of file once the program is gone */
  int dn = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (dn >= 0) {
    dup2(dn, 0);
    dup2(dn, 1);
    close(dn);
  }
  if (write(4, "K", 1) < 0) {
  }
  close(4);
  for (;;) {
    struct pollfd pf[2] = {{3, POLLIN, 0}, {sp[0], POLLIN, 0}};
    int r = poll(pf, 2, 250);
    char tmp[64];
    if (r > 0 && pf[1].revents)
      while (read(sp[0], tmp, sizeof tmp) > 0) {
      }
    if (keeper_stop || getppid() != trainer ||
        (r > 0 && (pf[0].revents & (POLLIN | POLLHUP | POLLERR)))) {
      kill_tree(prog);
      return 0;
    }
    /* reap what ended: the program (then everything goes), or an adopted orphan */
    for (;;) {
      siginfo_t si;
      memset(&si, 0, sizeof si);
      if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0) break;
      if (si.si_pid == prog) {
        int st = kill_tree(prog);
        if (WIFEXITED(st)) return WEXITSTATUS(st);
        int sig = WIFSIGNALED(st) ? WTERMSIG(st) : SIGKILL;
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        signal(sig, SIG_DFL);
        raise(sig);
        return 128 + sig;
      }
      waitpid(si.si_pid, NULL, 0);
    }
  }
}

/* Runs before main() in every executable that links this file: the trainer started it as a
 * keeper when KEEPER_ENV holds the trainer's pid (its parent) and descriptor 4 is open. A
 * leftover KEEPER_ENV of another process is removed and otherwise ignored. */
__attribute__((constructor)) static void keeper_entry(void) {
  const char *v = getenv(KEEPER_ENV), *cmd = getenv(KEEPER_CMD_ENV);
  if (!v) return;
  char ppid[24];
  snprintf(ppid, sizeof ppid, "%ld", (long)getppid());
  bool mine = cmd && !strcmp(v, ppid) && fcntl(3, F_GETFD) >= 0 && fcntl(4, F_GETFD) >= 0;
  char *command = mine ? strdup(cmd) : NULL;
  unsetenv(KEEPER_ENV); /* the program must not see them */
  unsetenv(KEEPER_CMD_ENV);
  if (mine) _exit(command ? keeper_main(command, getppid()) : 127);
}

/* ---- the trainer's side ---- */

static int max_fd(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)INT_MAX) return (int)rl.rlim_cur;
  return 65536;
}

/* In a forked child: closes every descriptor from `from` on (close_range needs Linux 5.9). */
static void close_from(int from, int limit) {
  if (close_range((unsigned)from, ~0u, 0) != 0)
    for (int fd = from; fd < limit; fd++)
      close(fd);
}

/* Waits up to `seconds` for pid to end and reaps it; false when it is still running. */
static bool reap_within(pid_t pid, double seconds) {
  double until = lh_time_now() + seconds;
  useconds_t nap = 200;
  for (;;) {
    int st;
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) return true; /* ECHILD: reaped elsewhere */
    if (lh_time_now() >= until) return false;
    usleep(nap);
    if (nap < 20000) nap *= 2;
  }
}

/* Stops the program with everything it started, reaps it, closes the socket. Every way a program
 * ends goes through here, so no helper it started outlives it. With a keeper: closing the
 * lifeline makes it kill and reap the whole tree before it exits (a keeper that does not exit
 * within 10 s is killed). Without one: SIGKILL to the program's process group. */
static void stop_child(ex *x) {
  if (x->pid <= 0) return;
  close(x->fd);
  if (x->keeper) {
    close(x->life);
    if (!reap_within(x->pid, 10)) {
      kill(x->pid, SIGKILL);
      reap_within(x->pid, 10);
    }
  } else {
    kill(-x->pid, SIGKILL); /* the program leads its own process group */
    kill(x->pid, SIGKILL);
    reap_within(x->pid, 10);
  }
  x->pid = 0;
  x->keeper = false;
  x->fd = x->life = -1;
  x->len = 0;
}

/* The environment with the keeper's two settings added (and any inherited copies left out). */
static char **keeper_environ(char *pid_var, char *cmd_var) {
  extern char **environ;
  size_t n = 0;
  while (environ[n])
    n++;
  char **envp = malloc((n + 3) * sizeof *envp);
  if (!envp) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], KEEPER_ENV "=", sizeof KEEPER_ENV) &&
        strncmp(environ[i], KEEPER_CMD_ENV "=", sizeof KEEPER_CMD_ENV))
      envp[k++] = environ[i];
  envp[k++] = pid_var;
  envp[k++] = cmd_var;
  envp[k] = NULL;
  return envp;
}

/* Starts the program under a keeper. LH_ERR_UNSUPPORTED: no keeper could run (this executable
 * cannot be started again, or it is not one that links this file), so the caller runs the
 * program without one; other errors are the program's. */
static lh_err start_keeper(lh_env *env, ex *x, const char *cmd) {
  int sv[2], life[2], rep[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return lh_errorf(LH_ERR_IO, "exec '%s': socketpair: %s", cmd, strerror(errno));
  if (pipe2(life, O_CLOEXEC) != 0) {
    close(sv[0]);
    close(sv[1]);
    return lh_errorf(LH_ERR_IO, "exec '%s': pipe: %s", cmd, strerror(errno));
  }
  if (pipe2(rep, O_CLOEXEC) != 0) {
    close(sv[0]), close(sv[1]), close(life[0]), close(life[1]);
    return lh_errorf(LH_ERR_IO, "exec '%s': pipe: %s", cmd, strerror(errno));
  }
  char pid_var[64], *cmd_var = malloc(sizeof KEEPER_CMD_ENV + strlen(env->cfg.path) + 1);
  snprintf(pid_var, sizeof pid_var, KEEPER_ENV "=%ld", (long)getpid());
  if (cmd_var) sprintf(cmd_var, KEEPER_CMD_ENV "=%s", env->cfg.path);
  char **envp = cmd_var ? keeper_environ(pid_var, cmd_var) : NULL;
  char *argv[] = {KEEPER_ARGV0, env->cfg.path, NULL};
  int limit = max_fd(); /* computed here: the child may only make async-signal-safe calls */
  pid_t pid = envp ? fork() : -1;
  if (pid == 0) {
    setpgid(0, 0); /* a terminal's ^C reaches the trainer, whose death the keeper sees */
    /* above 4 first, so that no dup2 below overwrites another of the three */
    int s = fcntl(sv[1], F_DUPFD, 5), l = fcntl(life[0], F_DUPFD, 5), r = fcntl(rep[1], F_DUPFD, 5);
    if (s < 0 || l < 0 || r < 0 || dup2(s, 0) < 0 || dup2(s, 1) < 0 || dup2(l, 3) < 0 ||
        dup2(r, 4) < 0)
      _exit(127);
    close_from(5, limit);
    execve("/proc/self/exe", argv, envp);
    _exit(126); /* nothing written to 4: no keeper */
  }
  int fork_errno = errno;
  free(envp);
  free(cmd_var);
  close(sv[1]);
  close(life[0]);
  close(rep[1]);
  if (pid < 0) {
    close(sv[0]), close(life[1]), close(rep[0]);
    return lh_errorf(LH_ERR_IO, "exec '%s': fork: %s", cmd, strerror(fork_errno));
  }
  setpgid(pid, pid);
  /* the keeper's report: 'K' once the program runs */
  char got = 0;
  double until = lh_time_now() + (env->cfg.timeout_s > 10 ? env->cfg.timeout_s : 10);
  for (;;) {
    struct pollfd pf = {rep[0], POLLIN, 0};
    int pr = poll(&pf, 1, remaining_ms(until));
    if (pr < 0 && errno == EINTR) continue;
    if (pr > 0 && read(rep[0], &got, 1) < 0 && errno == EINTR) continue;
    break;
  }
  close(rep[0]);
  x->pid = pid;
  x->keeper = true;
  x->fd = sv[0];
  x->life = life[1];
  x->len = 0;
  if (got == 'K') return LH_ERR_OK;
  x->keeper = got == 'F'; /* else whatever runs there ignores the lifeline: kill its group */
  stop_child(x);
  if (got == 'F') return lh_errorf(LH_ERR_IO, "exec '%s': the program could not be started", cmd);
  return lh_errorf(LH_ERR_UNSUPPORTED, "no keeper process started from /proc/self/exe");
}

/* Starts the program as the trainer's own child, in its own process group, with
 * PR_SET_PDEATHSIG(SIGKILL): it dies with the trainer's thread that started it, and helpers it
 * started are killed with its group, but one that left the group can outlive it. */
static lh_err start_direct(lh_env *env, ex *x, const char *cmd) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return lh_errorf(LH_ERR_IO, "exec '%s': socketpair: %s", cmd, strerror(errno));
  int limit = max_fd();
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(sv[0]);
    close(sv[1]);
    return lh_errorf(LH_ERR_IO, "exec '%s': fork: %s", cmd, strerror(err));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127); /* the trainer died before prctl took effect */
    dup2(sv[1], 0);
    dup2(sv[1], 1);
    /* descriptors the trainer opened without close-on-exec (a run's metrics.jsonl, a ledger)
     * must not reach the program */
    close_from(3, limit);
    execl("/bin/sh", "sh", "-c", env->cfg.path, (char *)NULL);
    _exit(127);
  }
  setpgid(pid, pid);
  close(sv[1]);
  x->pid = pid;
  x->keeper = false;
  x->fd = sv[0];
  x->life = -1;
  x->len = 0;
  return LH_ERR_OK;
}

static lh_err start_child(lh_env *env, ex *x) {
  const char *cmd = ESC(env->cfg.path);
  if (!x->no_keeper) {
    lh_err e = start_keeper(env, x, cmd);
    if (e != LH_ERR_UNSUPPORTED) return e;
    lh_log(LH_LOG_WARN,
           "exec '%s': %s; programs run without one, so a helper that leaves their process "
           "group can outlive them",
           cmd, lh_last_error());
    x->no_keeper = true;
  }
  return start_direct(env, x, cmd);
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
  return lh_errorf(LH_ERR_IO, "exec '%s': %s: the program %s", ESC(env->cfg.path), what, why);
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
  char said[128] = "";
  if (stale) { /* the start of what it wrote, escaped: it goes to a terminal */
    const char *text = x->len ? x->buf : tmp;
    size_t n = x->len ? x->len : (size_t)r;
    char esc[96];
    snprintf(said, sizeof said, " ('%s')", lh_escape(text, n, esc, sizeof esc));
  }
  lh_log(LH_LOG_WARN, "exec '%s': %s: the program %s%s since its last reply; restarting it",
         ESC(env->cfg.path), what,
         stale    ? "wrote output"
         : r == 0 ? "closed its output"
                  : "broke its connection",
         said);
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
    return lh_errorf(LH_ERR_NOMEM, "exec: %s: cannot encode the request", what);
  char *line = json_dumps(req, JSON_COMPACT);
  if (!line) return lh_errorf(LH_ERR_NOMEM, "exec: %s: cannot encode the request", what);
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
                       ESC(env->cfg.path), what, env->cfg.timeout_s);
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
        e = lh_errorf(LH_ERR_FORMAT, "exec '%s': %s: malformed reply: %s", ESC(env->cfg.path), what,
                      v ? "expected a JSON object" : LH__ENV_ESC(jerr.text, strlen(jerr.text)));
      } else if (rid && !(json_is_integer(rid) && json_integer_value(rid) == id)) {
        char found[32] = "a non-integer";
        if (json_is_integer(rid))
          snprintf(found, sizeof found, "%" JSON_INTEGER_FORMAT, json_integer_value(rid));
        e = lh_errorf(
            LH_ERR_FORMAT,
            "exec '%s': %s: malformed reply: request_id %s, the request's is %" JSON_INTEGER_FORMAT
            " (a reply to an earlier request?)",
            ESC(env->cfg.path), what, found, id);
      } else if (x->len) {
        e = lh_errorf(LH_ERR_FORMAT,
                      "exec '%s': %s: malformed reply: more output after the reply line (write "
                      "exactly one line per request)",
                      ESC(env->cfg.path), what);
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
      return lh_errorf(LH_ERR_LIMIT, "exec '%s': %s: reply longer than %u bytes",
                       ESC(env->cfg.path), what, LH_EXEC_MAX_REPLY);
    }
    if (x->cap - x->len < 4096) {
      size_t nc = x->cap ? x->cap * 2 : 8192;
      if (nc > LH_EXEC_MAX_REPLY + 4096) nc = LH_EXEC_MAX_REPLY + 4096;
      char *nb = realloc(x->buf, nc);
      if (!nb) return lh_errorf(LH_ERR_NOMEM, "exec: %s: out of memory", what);
      x->buf = nb;
      x->cap = nc;
    }
    struct pollfd pf = {x->fd, POLLIN, 0};
    int pr = poll(&pf, 1, remaining_ms(deadline));
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) {
      stop_child(x);
      return lh_errorf(LH_ERR_IO, "exec '%s': %s: no reply within %g s", ESC(env->cfg.path), what,
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
                  ESC(env->cfg.path), what);
  } else {
    task->prompt = lh__env_strndup(json_string_value(p), json_string_length(p));
    task->answer = lh__env_strndup(json_string_value(a), json_string_length(a));
    if (s) task->solution = lh__env_strndup(json_string_value(s), json_string_length(s));
    if (!task->prompt || !task->answer || (s && !task->solution)) {
      lh_env_task_clear(task);
      e = lh_errorf(LH_ERR_NOMEM, "exec: %s: out of memory", what);
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
  if (!req) return lh_errorf(LH_ERR_NOMEM, "exec: %s: cannot encode the request", what);
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
                  ESC(env->cfg.path), what);
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
  if (!req) return lh_errorf(LH_ERR_NOMEM, "exec: %s: cannot encode the request", what);
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
  x->fd = x->life = -1;
  const char *nk = getenv("LONGHAUL_EXEC_NO_KEEPER"); /* read once: see env.h */
  x->no_keeper = nk && !strcmp(nk, "1");
  env->impl = x;
  return LH_ERR_OK;
}

const lh__env_ops lh__env_exec_ops = {exec_task, exec_score, exec_size, exec_free};
