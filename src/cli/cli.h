/* longhaul command-line front end: the shared flag parser and the subcommand entry points.
 * Exit codes: 0 success (and --help), 1 a failure while running (message from the library),
 * 2 a usage error (unknown flag, missing value, bad number, an environment spec refused with
 * LH_ERR_USAGE); every error is one line on stderr. */
#ifndef LONGHAUL_CLI_H
#define LONGHAUL_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

#define LH__EXIT_OK    0
#define LH__EXIT_FAIL  1
#define LH__EXIT_USAGE 2
/* lh__args_parse: keep going (any other value is the exit code to return at once). */
#define LH__ARGS_CONTINUE (-1)

#define LH__MAX_FLAGS 48

/* One long flag `--name VALUE` / `--name=VALUE`, or a switch `--name` when metavar is NULL. */
typedef struct lh__flag {
  const char *name;    /* without the leading "--" */
  const char *metavar; /* shown in usage, e.g. "N"; NULL for a switch */
  bool required;
  const char *help; /* one line */
} lh__flag;

typedef struct lh__args {
  const char *cmd;   /* "init-model", "bench train": prefixes every message */
  const char *about; /* a sentence or two printed under the usage line */
  const lh__flag *flags;
  int n_flags;
  const char *values[LH__MAX_FLAGS]; /* per flag: its value, "" for a switch given, or NULL */
} lh__args;

/* Parses argv[1..argc) (argv[0] is the command name) against a->flags. Prints usage to stdout
 * and returns 0 on --help/-h anywhere; prints one line to stderr and returns 2 on an unknown
 * flag, a missing or unexpected value, a flag given twice, a positional argument or a missing
 * required flag; otherwise returns LH__ARGS_CONTINUE. */
int lh__args_parse(lh__args *a, int argc, char **argv);
/* Writes the usage text to stdout: the usage line (built from the flags, so it always matches
 * them), `about`, and one line per flag. */
void lh__args_usage(const lh__args *a);

/* Typed getters. Each returns LH__ARGS_CONTINUE with *out set (to `def` when the flag is
 * absent), or prints a one-line error and returns 2. */
bool lh__args_has(const lh__args *a, const char *name);
const char *lh__args_str(const lh__args *a, const char *name, const char *def);
int lh__args_int(const lh__args *a, const char *name, long lo, long hi, long def, long *out);
/* An integer in [0, hi]. */
int lh__args_u64(const lh__args *a, const char *name, uint64_t hi, uint64_t def, uint64_t *out);
/* Seeds are recorded as JSON integers (eval --json, rl's run.json), which are signed 64-bit:
 * every command's --seed is at most this. */
#define LH__SEED_MAX ((uint64_t)INT64_MAX)
/* A decimal number in [lo, hi], as strtod reads it but without leading whitespace, hex, inf or
 * nan; a subnormal is accepted, a nonzero number that would read as 0 (1e-400) is refused. */
int lh__args_double(const lh__args *a, const char *name, double lo, double hi, double def,
                    double *out);
/* `choices` is NULL-terminated; *out is the index of the match. */
int lh__args_choice(const lh__args *a, const char *name, const char *const *choices, int def,
                    int *out);

/* Parses a token-id list "1,2, 3" (optionally inside [ ]) given to --flag into a malloc'd array;
 * returns LH__ARGS_CONTINUE, or prints a one-line error and returns 2. */
int lh__parse_ids(const char *cmd, const char *flag, const char *s, int32_t **ids, size_t *n);
/* Parses one JSON array of token ids (a line of `score --input`, trailing newline allowed):
 * 1..max_len integers in [0, vocab). Returns LH__ARGS_CONTINUE with *ids malloc'd, or prints
 * "longhaul CMD: WHERE: ..." (WHERE names the source, e.g. FILE:LINE) and returns 1. */
int lh__parse_id_array(const char *cmd, const char *where, const char *text, size_t len, int vocab,
                       int max_len, int32_t **ids, size_t *n);
/* "longhaul CMD: message" on stderr; returns `code`. */
int lh__cli_error(const char *cmd, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "longhaul CMD: <lh_last_error()>" on stderr; returns 1. Library messages do not name the
 * command (lh_generate's say "request 0: ...", not "generate: request 0: ..."), so nothing is
 * said twice, and a message that starts with a file named as the command keeps it. */
int lh__cli_fail(const char *cmd);
/* The same for the error code e: LH_ERR_USAGE (a bad environment spec) returns 2, any other 1. */
int lh__cli_fail_err(const char *cmd, lh_err e);
/* Flushes stdout and checks that nothing written to it failed (a full disk, a closed pipe):
 * returns 0, or prints "longhaul CMD: cannot write the output: REASON" and returns 1. A command
 * that prints its result calls it last, so its exit code says whether the result was written. */
int lh__cli_flush_stdout(const char *cmd);

/* ---------------------------------------------------------------- long-running commands (ui.c) */
#include <signal.h>
/* The signal that asked a command to stop (0: none). lh__stop_on_signals makes SIGINT and
 * SIGTERM set it, so the command finishes its step, writes a checkpoint and exits
 * lh__stop_exit_code() (130 or 143); a second signal exits at once. */
extern volatile sig_atomic_t lh__stop;
void lh__stop_on_signals(void);
int lh__stop_exit_code(void);
const char *lh__stop_name(void);
/* "42s", "3m07s", "2h05m"; "?" for a negative or absurd time. */
void lh__format_duration(double s, char *buf, size_t cap);
/* A progress line on stderr: redrawn in place on a terminal after every step, with the rate and
 * ETA; a plain line every `every` steps (and at the last) otherwise. */
typedef struct lh__progress_state {
  const char *cmd;
  int64_t first, total; /* steps done before this process started, and in all */
  int every;
  double elapsed; /* seconds since this process started, set by the caller */
  int tty;        /* -1: not yet known */
  int open;       /* a terminal line is waiting for its newline */
} lh__progress_state;
void lh__progress(lh__progress_state *p, int64_t done, const char *text);
/* Ends an unfinished terminal line (a run stopped early). */
void lh__progress_end(lh__progress_state *p);
/* Appends " heldout 0.412@40" (the latest --eval-every pass@1 and its step) to the text in buf
 * (cap bytes), nothing when step < 0 (none yet). */
void lh__heldout_text(int64_t step, double pass1, char *buf, size_t cap);
/* What --model names (a model directory, a run directory or RUN/latest: lh_rundir_resolve_model),
 * malloc'd; NULL after printing the error. */
char *lh__model_dir(const char *cmd, const char *arg);
/* Replaces the value of flag `name` (when given) by what it names as a model directory
 * (lh__model_dir; the string lives until exit). Returns LH__ARGS_CONTINUE, or 1 after printing
 * the error. */
int lh__args_model(lh__args *a, const char *name);

/* Commands with subcommands (bench, patch, manifest, snapshot): argv[1] names one of subs, which
 * runs with argv shifted by one; none, --help, or an unknown name is handled here (usage on
 * stdout and 0, or a one-line error listing the names and 2). */
typedef struct lh__subcommand {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} lh__subcommand;
int lh__subcommands(const char *cmd, const lh__subcommand *subs, int n, int argc, char **argv);

int lh__cmd_init_model(int argc, char **argv);
int lh__cmd_score(int argc, char **argv);
int lh__cmd_bench(int argc, char **argv);
int lh__cmd_generate(int argc, char **argv);
int lh__cmd_sft(int argc, char **argv);
int lh__cmd_rl(int argc, char **argv);
int lh__cmd_tokenize(int argc, char **argv);
int lh__cmd_eval(int argc, char **argv);
int lh__cmd_patch(int argc, char **argv);
/* `env show SPEC`: a spec that lh_env_config_parse or lh_env_create refuses with LH_ERR_USAGE is a
 * usage error (exit code 2); any other failure exits 1. */
int lh__cmd_env(int argc, char **argv);
int lh__cmd_keygen(int argc, char **argv);
int lh__cmd_manifest(int argc, char **argv);
int lh__cmd_snapshot(int argc, char **argv);
/* `netem`: a setting lh_netem_start refuses (LH_ERR_INVAL: a host that is not loopback, a value
 * out of range) is a usage error (exit code 2); SIGINT or SIGTERM stops it with exit code 0. */
int lh__cmd_netem(int argc, char **argv);
int lh__cmd_serve(int argc, char **argv);
int lh__cmd_worker(int argc, char **argv);
int lh__cmd_report(int argc, char **argv);
int lh__cmd_export(int argc, char **argv);
/* `bench generate`, in cmd_generate.c next to the command it measures */
int lh__bench_generate(int argc, char **argv);

#endif
