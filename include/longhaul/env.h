/* longhaul environments: tasks with verifiable rewards. Task i of a split is a pure function of
 * (config, split, i); scoring a completion gives a reward in [0, 1]. Built in: arith, countdown,
 * sort (infinite, train and test disjoint by construction), jsonl (a user's file), exec (an
 * external program speaking JSON lines). */
#ifndef LONGHAUL_ENV_H
#define LONGHAUL_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

typedef enum { LH_SPLIT_TRAIN = 0, LH_SPLIT_TEST = 1 } lh_split;

typedef enum {
  LH_ENV_MATCH_AUTO = 0, /* numeric when the whole answer is one number (in range), else exact */
  LH_ENV_MATCH_EXACT,    /* completion == answer after trimming surrounding whitespace */
  LH_ENV_MATCH_NUMERIC,  /* the last number in the completion has the value of the last number
                          * in the answer, compared exactly (lh_env_number_equal) */
} lh_env_match;

#define LH_ENV_PATH_MAX          1024
#define LH_COUNTDOWN_MAX_NUMS    8
#define LH_COUNTDOWN_MAX_LEN     256        /* bytes of an expression */
#define LH_COUNTDOWN_MAX_DEPTH   32         /* nested parentheses */
#define LH_COUNTDOWN_MAX_LITERAL 1000000000 /* 10^9: the largest literal in an expression */
#define LH_JSONL_MAX_LINE        (1u << 20)
#define LH_JSONL_MAX_FILE        (256u << 20)
#define LH_JSONL_MAX_EXPONENT    1000000000000000LL /* 10^15: see lh_env_number_equal */
#define LH_EXEC_MAX_REPLY        (1u << 20)

/* Settings; zero means the environment's default (in brackets). */
typedef struct {
  char name[16];              /* "arith", "countdown", "sort", "jsonl", "exec" */
  uint64_t seed;              /* mixes into task generation [0] */
  int digits;                 /* arith: digits per operand [2]; sort: max digits per number [2] */
  char ops[8];                /* arith: operators drawn from, subset of "+-*" ["+-"] */
  int count;                  /* countdown: numbers given, 2..8 [4]; sort: list length 1..64 [5] */
  int max_number;             /* countdown: numbers drawn from 1..max_number [10]; the target,
                               * 1..999, combines all of them with random operators (after
                               * 1000 draws that miss, operators that keep values small) and
                               * is never one of them (then writing it down would solve it) */
  char path[LH_ENV_PATH_MAX]; /* jsonl: the file (train, or both splits); exec: command */
  char test_path[LH_ENV_PATH_MAX]; /* jsonl: optional test file; then `path` is train only */
  lh_env_match match;              /* jsonl */
  double test_fraction;            /* jsonl with one file: share of prompts in test [0.1] */
  double timeout_s;                /* exec: per request [10] */
} lh_env_config;

/* Parses "NAME" or "NAME:key=value,key=value" into *cfg (zeroed first). Each environment takes
 * its own keys (lh_env_key_at lists them):
 *   arith      digits (1..9, default 2), ops (characters of +-*, default +-), seed
 *   countdown  count (2..8, default 4), max (1..1000, default 10), seed
 *   sort       count (1..64, default 5), digits (1..18, default 2), seed
 *   jsonl      path (a file, required), test (a file of test tasks, default none: then
 *              test_fraction of path's tasks are test, by a hash of the prompt), match (exact,
 *              numeric or auto, default auto), test_fraction (in (0, 1), default 0.1)
 *   exec       path (a shell command, required), timeout (seconds in (0, 3600], default 10)
 *   seed: 0..2^64-1, default 0. Numbers are plain decimals (no sign, no spaces); a value runs
 *   to the next ',' (so none holds one).
 * Every failure is a spec error, LH_ERR_USAGE (report it as a usage error): an unknown
 * environment, a pair that is not key=value, an unknown or repeated key, an empty or
 * out-of-range value. The message names the environment, says what was expected and found
 * (text from the spec escaped with lh_escape) and lists the environment's valid keys with their
 * ranges: "arith: unknown key 'digit'; valid keys: digits (1..9, default 2), ...". A required key
 * left out is refused by lh_env_create, also with LH_ERR_USAGE. */
lh_err lh_env_config_parse(const char *spec, lh_env_config *cfg);
/* Whether two specs give the same settings (both parse, and format to the same text: key order,
 * defaults written out or left out and, for paths, the file they name do not matter). */
bool lh_env_spec_same(const char *a, const char *b);

/* One key of an environment's spec, in words, for help texts and `longhaul env show`. */
typedef struct {
  const char *key;   /* "digits" */
  const char *range; /* the values it takes: "1..9", "exact, numeric or auto" */
  const char *def;   /* the default: "2", "none"; "required" for a key that must be given */
} lh_env_key;
/* Key i (0, 1, ...) of environment `name`, in the order lh_env_config_format writes them; NULL
 * past the last one or for an unknown environment. Static storage. */
const lh_env_key *lh_env_key_at(const char *name, size_t i);
/* The prompt format of environment `name` and how completions are scored, in a sentence or
 * two; NULL for an unknown environment. Static storage. */
const char *lh_env_about(const char *name);
/* The value of `key` in cfg as a spec writes it ("" for a text key not given) into buf (cap
 * bytes, the NUL included). LH_ERR_NOTFOUND: the environment has no such key; LH_ERR_LIMIT:
 * it does not fit. */
lh_err lh_env_config_value(const lh_env_config *cfg, const char *key, char *buf, size_t cap);
/* cfg as a spec, "NAME:key=value,...", with the keys of its environment in lh_env_key_at's
 * order, less those left unset (0 or "", which stand for the default; seed and match are always
 * written); lh_env_config_parse reads it back to the same settings. Of an environment's config
 * (lh_env_config_of) it is the effective spec: every key, defaults filled in.
 * LH_ERR_USAGE: unknown environment; LH_ERR_UNSUPPORTED: a value holds ','; LH_ERR_LIMIT: the
 * spec needs more than cap bytes (the NUL included). */
lh_err lh_env_config_format(const lh_env_config *cfg, char *buf, size_t cap);

typedef struct lh_env lh_env;

/* Creates an environment (jsonl reads its file here; exec starts its program on first use).
 * Settings left zero get their defaults (lh_env_config_of shows them). A setting that is out of
 * range, a required key left out or an unknown environment is LH_ERR_USAGE, as
 * lh_env_config_parse says them (a config built in code is checked as a spec is); a jsonl file
 * that cannot be read or holds a malformed line is LH_ERR_IO, LH_ERR_LIMIT or LH_ERR_FORMAT,
 * named "FILE:LINE: ..." (text from the file escaped with lh_escape). */
lh_err lh_env_create(const lh_env_config *cfg, lh_env **out);
void lh_env_free(lh_env *env);
const lh_env_config *lh_env_config_of(const lh_env *env);
/* Number of distinct tasks in a split: 0 means unbounded for built-in envs and exec. jsonl gives
 * its item count (0: the split is empty and lh_env_task_get fails with LH_ERR_NOTFOUND); task i
 * is item i mod size. */
uint64_t lh_env_size(const lh_env *env, lh_split split);

/* One task. The pointer strings are malloc'd, NUL-terminated and owned by the task. Built-in
 * tasks use only printable ASCII and "\n" (the character tokenizer). */
typedef struct {
  char *prompt;   /* e.g. "12+34=" */
  char *answer;   /* hidden answer, e.g. "46" (countdown: the target) */
  char *solution; /* a completion that scores 1, for SFT; NULL when the env has none */
  lh_split split;
  uint64_t index;
  /* Difficulty bucket, short and human-readable; "" when the env has none (jsonl, exec):
   *  arith +: "+ C carries" (C carries of the column addition; "+ 1 carry");
   *  arith -: "- B borrows" (B borrows of the column subtraction of the smaller operand from the
   *    larger, so 3-7 counts as 7-3; "- 1 borrow");
   *  arith *: "* D digits" (D digits of the larger operand; "* 1 digit");
   *  countdown: "uses N, K mul/div" (N of the given numbers appear in the reference solution,
   *    K of its operators are * or /; the generator combines every number given, so N is the
   *    count setting and K separates the additive instances from the multiplicative ones);
   *  sort: "inversions 0-2", "inversions 3-5", "inversions 6+" (pairs out of order in the
   *    given list; equal numbers are in order). */
  char level[24];
  int n_nums;                          /* countdown: the numbers given */
  int64_t nums[LH_COUNTDOWN_MAX_NUMS]; /* countdown */
  int64_t target;                      /* countdown */
} lh_env_task;

/* The exec protocol. The command runs under /bin/sh -c, started on the first request; its stdin
 * and stdout are a socket, its stderr is the trainer's, and it inherits no other descriptor.
 *
 * Processes. The program is not the trainer's child but runs under a keeper: the trainer's own
 * executable started again from /proc/self/exe (a fresh process of a few MB, none of the
 * trainer's memory; exec.c's constructor makes it the keeper before main runs, so this needs
 * exec.c linked into the executable, as the static longhaul_core is). The keeper is a child
 * subreaper (PR_SET_CHILD_SUBREAPER), in its own process group (a terminal's ^C goes to the
 * trainer); the program is its child, in a process group of its own, with
 * PR_SET_PDEATHSIG(SIGKILL) (checked against a keeper that died first). Every process the program
 * starts, also one that calls setsid() or double-forks, stays a descendant of the keeper, which
 * kills them all (SIGKILL) and reaps them when the trainer stops or restarts the program
 * (lh_env_free waits for that: afterwards none is left), when the program exits (its helpers go
 * with it, and its exit status is reported), and when the trainer dies, by SIGKILL too (the
 * keeper holds a pipe whose write end only the trainer has, and watches getppid()): within
 * 250 ms. For the host process this means: it is not made a subreaper, and its other children
 * are untouched; it has one child per running exec program, the keeper, which it must not reap
 * itself (a waitpid(-1) loop or SIGCHLD set to SIG_IGN in the host takes the program's exit status
 * away, though the processes still end); a child the host forks without exec while a program
 * runs holds that pipe until it exits or execs, so the keeper then sees the trainer's death by
 * getppid() only. When no keeper starts (an executable that does not link exec.c, no /proc;
 * logged once) or with LONGHAUL_EXEC_NO_KEEPER=1 in the environment when the env is created, the
 * program is the trainer's child in its own process group with PR_SET_PDEATHSIG(SIGKILL): it
 * dies with the trainer thread that started it and its group is killed on stop, but a helper
 * that leaves the group survives.
 * Each request is one JSON object on one line and is answered by exactly one
 * line holding one JSON object:
 *   {"type":"generate","split":"train"|"test","index":N,"request_id":R}
 *     -> {"prompt":string,"answer":string,"solution":string (optional)}
 *   {"type":"score","prompt":string,"answer":string,"completion":string,"request_id":R}
 *     -> {"reward":number in [0, 1],"correct":bool (optional, default: the reward is 1 once
 *         stored as a float, so 0.9999999999, stored as 1, is correct),
 *         "well_formed":bool (optional, default true)}
 * R counts requests; a reply may leave it out, and if it has one it must be R. Bytes of the
 * strings sent that are not UTF-8 (a completion cut inside a character) arrive as U+FFFD, one
 * for each maximal ill-formed subpart, as Python's decode(errors="replace") gives them; the rest
 * is sent as it is. A request fails when the program crashes, says nothing within the timeout,
 * or replies with anything else: not JSON, wrong fields, another request_id, or more output
 * after the reply line. The program is then killed with everything it started (also when it
 * exited by itself: helpers it started do not outlive it) and started again on the next request.
 * Output written between requests (a banner, a log line on stdout) also restarts it before the
 * next request, so a reply is never read as the answer to another request: log to stderr. */

/* Task `index` of `split`; the same inputs always give the same task. exec may fail with
 * LH_ERR_IO (the program could not be started, crashed, closed its output or timed out),
 * LH_ERR_FORMAT (a malformed reply), LH_ERR_LIMIT (a reply line longer than LH_EXEC_MAX_REPLY
 * bytes) or LH_ERR_NOMEM (out of memory): skip that task and continue; a program left out of step
 * is restarted on the next request. On error *task is left empty. */
lh_err lh_env_task_get(lh_env *env, lh_split split, uint64_t index, lh_env_task *task);
/* Frees the strings and zeroes the task (level becomes ""); accepts a cleared task. */
void lh_env_task_clear(lh_env_task *task);

typedef struct {
  float reward;     /* in [0, 1] */
  bool well_formed; /* the completion had the expected shape */
  bool correct;
} lh_env_result;

/* Scores a completion. Built-ins read it up to the first "\n" (or its end), trimming spaces:
 *  arith, sort: reward 1 when it equals the answer exactly, else 0 (well_formed: an integer,
 *    resp. integers separated by single spaces).
 *  countdown: 1 when the expression evaluates exactly to the target using only given numbers,
 *    each at most once; 0.1 when it parses, uses allowed numbers and evaluates (no division by
 *    zero, no int64 overflow) but to another value; else 0.
 *  jsonl: the whole completion, by the configured match.
 *  exec: what the program says. Fails only for exec (as lh_env_task_get). */
lh_err lh_env_score(lh_env *env, const lh_env_task *task, const char *completion, size_t len,
                    lh_env_result *out);

/* The countdown evaluator: parses an expression of non-negative integers, + - * / and
 * parentheses (spaces allowed, no unary minus), at most LH_COUNTDOWN_MAX_LEN bytes and
 * LH_COUNTDOWN_MAX_DEPTH nesting, and evaluates it with exact int64 rationals. Each literal must
 * be one of nums[0..n), each used at most once (nums == NULL: any literal), and at most
 * LH_COUNTDOWN_MAX_LITERAL (10^9). Result num/den in lowest terms, den > 0. Errors: LH_ERR_FORMAT
 * (syntax, with the byte offset), LH_ERR_LIMIT (too long, too deep, a literal above 10^9,
 * overflow), LH_ERR_MISMATCH (a number not given or reused), LH_ERR_INVAL (division by zero). */
lh_err lh_countdown_eval(const char *expr, size_t len, const int64_t *nums, int n, int64_t *num,
                         int64_t *den);

/* Parses one jsonl line {"prompt": string, "answer": string or number} (other keys ignored). An
 * answer that is empty or only whitespace is refused (any blank completion would match it). A
 * number answer becomes text: an integer as written, a real as the shortest of %.15g, %.16g and
 * %.17g that reads back as the same double (0.1 -> "0.1"); an integer beyond int64 is refused
 * with a message naming its field (write such an answer as a string). Messages read
 * "FILE:LINE: ...". *prompt and *answer are malloc'd. A file may start with a UTF-8 byte-order
 * mark. */
lh_err lh_env_jsonl_parse_line(const char *line, size_t len, const char *file, size_t lineno,
                               char **prompt, char **answer);

/* Numbers as jsonl's numeric match reads them: an optional minus sign (not after a letter, a
 * digit or ')', so "5-3" holds 3); digits, with an optional '.' followed by digits, or a '.'
 * followed by digits alone (not after a letter, a digit or a '.'); then an optional exponent:
 * 'e' or 'E', an optional sign and at least one digit ("-1,234.5", "-.5", "2.5e-05", "1E+21";
 * "3eggs" holds 3). A comma belongs to a number only as a thousands separator: before the
 * point, after a first group of 1-3 digits or a later group of three, and followed by exactly
 * three digits (then not a digit); any other comma ends the number, so "3,4" holds 3 and 4,
 * "0.5,0.25" holds 0.5 and 0.25, "1234,567" holds 1234 and 567. The last number in text is
 * text[*start, *start + *n); false when there is none. */
bool lh_env_last_number(const char *text, size_t len, size_t *start, size_t *n);
/* Whether a and b, each exactly one number, have the same value. They are compared as exact
 * decimals, never as doubles: (sign, significant digits without leading or trailing zeros,
 * decimal exponent), so 0.5 == 0.50 == 00.5 == 5e-1, 1,000 == 1000.0 == 1e3 and -0 == 0, while
 * 1234567 != 1234568 and 9007199254740992 != 9007199254740993, at any length. A nonzero number
 * whose written exponent is above LH_JSONL_MAX_EXPONENT in magnitude is out of range and equals
 * no number, itself included (match=auto scores such an answer by exact match); zero is zero
 * whatever its exponent. false when either text is not exactly one number. */
bool lh_env_number_equal(const char *a, size_t alen, const char *b, size_t blen);

#endif
