/* What the long-running commands (sft, rl) share on the terminal: stopping cleanly on SIGINT and
 * SIGTERM, a live progress line with rate and ETA on a terminal (plain lines otherwise), and the
 * --model argument that may name a run directory. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "cli.h"
#include "longhaul/rundir.h"

volatile sig_atomic_t lh__stop = 0;

static void on_signal(int sig) {
  if (lh__stop) _exit(128 + sig); /* the second signal: at once */
  lh__stop = sig;
  static const char msg[] = "\nlonghaul: stopping after the current step (signal again to quit "
                            "at once)\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
}

void lh__stop_on_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

int lh__stop_exit_code(void) {
  return lh__stop ? 128 + (int)lh__stop : LH__EXIT_OK;
}

const char *lh__stop_name(void) {
  return lh__stop == SIGINT ? "SIGINT" : lh__stop == SIGTERM ? "SIGTERM" : "a signal";
}

void lh__format_duration(double s, char *buf, size_t cap) {
  if (!(s >= 0) || s > 1e8) {
    snprintf(buf, cap, "?");
    return;
  }
  long t = (long)(s + 0.5);
  if (t < 60)
    snprintf(buf, cap, "%lds", t);
  else if (t < 3600)
    snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
  else
    snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
}

void lh__progress(lh__progress_state *p, int64_t done, const char *text) {
  if (p->tty < 0) p->tty = isatty(2);
  double rate = p->elapsed > 0 ? (double)(done - p->first) / p->elapsed : 0;
  char eta[32], el[32];
  lh__format_duration(rate > 0 ? (double)(p->total - done) / rate : -1, eta, sizeof eta);
  lh__format_duration(p->elapsed, el, sizeof el);
  bool last = done >= p->total;
  if (p->tty) {
    /* one terminal line: cut to the terminal's width, or a wrapped line is never redrawn */
    char line[512];
    snprintf(line, sizeof line, "%s: step %lld/%lld %s | %.2f steps/s, %s, ETA %s", p->cmd,
             (long long)done, (long long)p->total, text, rate, el, last ? "0s" : eta);
    struct winsize ws;
    if (ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && ws.ws_col <= sizeof line)
      line[ws.ws_col - 1] = '\0';
    fprintf(stderr, "\r%s\033[K%s", line, last ? "\n" : "");
    p->open = !last;
  } else if (done % p->every == 0 || last) {
    fprintf(stderr, "%s: step %lld/%lld %s (%.2f steps/s, %s, ETA %s)\n", p->cmd, (long long)done,
            (long long)p->total, text, rate, el, last ? "0s" : eta);
  }
  fflush(stderr);
}

void lh__progress_end(lh__progress_state *p) {
  if (p->tty > 0 && p->open) fputc('\n', stderr);
  p->open = 0;
}

void lh__heldout_text(int64_t step, double pass1, char *buf, size_t cap) {
  size_t used = strlen(buf);
  if (step >= 0 && used < cap)
    snprintf(buf + used, cap - used, " heldout %.3f@%lld", pass1, (long long)step);
}

/* Resolved --model values, freed at exit. */
static char *resolved[8];
static int n_resolved;

static void free_resolved(void) {
  for (int i = 0; i < n_resolved; i++)
    free(resolved[i]);
  n_resolved = 0;
}

int lh__args_model(lh__args *a, const char *name) {
  for (int i = 0; i < a->n_flags; i++) {
    if (strcmp(a->flags[i].name, name) || !a->values[i]) continue;
    char *dir = lh__model_dir(a->cmd, a->values[i]);
    if (!dir) return LH__EXIT_FAIL;
    LH_CHECK(n_resolved < 8, "too many model flags");
    if (n_resolved == 0) atexit(free_resolved);
    resolved[n_resolved++] = dir;
    a->values[i] = dir;
  }
  return LH__ARGS_CONTINUE;
}

char *lh__model_dir(const char *cmd, const char *arg) {
  char *dir = NULL;
  if (lh_rundir_resolve_model(arg, &dir)) {
    lh__cli_fail(cmd);
    return NULL;
  }
  return dir;
}
