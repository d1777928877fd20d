/* Environments: determinism, train/test disjointness over many instances, hand-checked scores for
 * arith, sort and countdown, the exact countdown evaluator (division, overflow, limits, misuse of
 * numbers), difficulty labels, jsonl errors with line numbers, and exec with a good, crashing,
 * hanging and lying program. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "longhaul/env.h"

static lh_env *make(const char *spec) {
  lh_env_config cfg;
  assert_int_equal(lh_env_config_parse(spec, &cfg), LH_ERR_OK);
  lh_env *env = NULL;
  lh_err e = lh_env_create(&cfg, &env);
  if (e) fail_msg("%s: %s", spec, lh_last_error());
  return env;
}

static lh_env_result score(lh_env *env, const lh_env_task *t, const char *text) {
  lh_env_result r;
  assert_int_equal(lh_env_score(env, t, text, strlen(text), &r), LH_ERR_OK);
  return r;
}

static void assert_chars_ok(const char *s) {
  for (; *s; s++)
    assert_true((*s >= 32 && *s < 127) || *s == '\n');
}

/* same index -> same task; different configs or splits -> different keys; prompts disjoint
 * between splits; the reference solution scores 1. */
static void check_env(const char *spec, int n) {
  lh_env *env = make(spec), *again = make(spec);
  size_t cap = (size_t)n * 2;
  char **train = calloc(cap, sizeof *train);
  for (int i = 0; i < n; i++) {
    lh_env_task a, b;
    assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, (uint64_t)i, &a), LH_ERR_OK);
    assert_int_equal(lh_env_task_get(again, LH_SPLIT_TRAIN, (uint64_t)i, &b), LH_ERR_OK);
    assert_string_equal(a.prompt, b.prompt);
    assert_string_equal(a.answer, b.answer);
    assert_chars_ok(a.prompt);
    assert_chars_ok(a.answer);
    assert_non_null(a.solution);
    assert_chars_ok(a.solution);
    lh_env_result r = score(env, &a, a.solution);
    assert_true(r.correct && r.well_formed && r.reward == 1.0f);
    train[i] = strdup(a.prompt);
    lh_env_task_clear(&a);
    lh_env_task_clear(&b);
  }
  int distinct_from_train = 0;
  for (int i = 0; i < n; i++) {
    lh_env_task t;
    assert_int_equal(lh_env_task_get(env, LH_SPLIT_TEST, (uint64_t)i, &t), LH_ERR_OK);
    assert_int_equal(t.split, LH_SPLIT_TEST);
    for (int j = 0; j < n; j++)
      if (!strcmp(train[j], t.prompt))
        fail_msg("%s: test prompt %s is also in train", spec, t.prompt);
    distinct_from_train += strcmp(train[i], t.prompt) != 0;
    lh_env_result r = score(env, &t, t.solution);
    assert_true(r.correct);
    lh_env_task_clear(&t);
  }
  assert_int_equal(distinct_from_train, n);
  for (int i = 0; i < n; i++)
    free(train[i]);
  free(train);
  lh_env_free(env);
  lh_env_free(again);
}

static void test_builtin_determinism_and_splits(void **state) {
  check_env("arith:digits=2,ops=+-*", 2000);
  check_env("arith:digits=1,ops=+", 300); /* 100 instances only: still disjoint */
  check_env("sort:count=4,digits=2", 2000);
  check_env("countdown:count=4,max=10", 2000);
  check_env("countdown:count=3,max=25,seed=7", 500);
  check_env("countdown:count=8,max=1000", 200); /* most free draws miss 1..999 here */
}

static void test_seed_changes_tasks(void **state) {
  lh_env *a = make("arith:digits=3"), *b = make("arith:digits=3,seed=1");
  int same = 0;
  for (int i = 0; i < 50; i++) {
    lh_env_task x, y;
    assert_int_equal(lh_env_task_get(a, LH_SPLIT_TRAIN, (uint64_t)i, &x), LH_ERR_OK);
    assert_int_equal(lh_env_task_get(b, LH_SPLIT_TRAIN, (uint64_t)i, &y), LH_ERR_OK);
    same += !strcmp(x.prompt, y.prompt);
    lh_env_task_clear(&x);
    lh_env_task_clear(&y);
  }
  assert_true(same < 5);
  lh_env_free(a);
  lh_env_free(b);
}

/* lh_escape (base), which every env message uses for text from outside: printable UTF-8 kept,
 * control bytes, C1 controls, bidi overrides and ill-formed UTF-8 as \xNN, truncation at a unit
 * boundary with "...". */
static void test_escape(void **state) {
  char buf[64];
  static const char *const in_out[][2] = {
      {"plain text", "plain text"},
      {"a\nb\tc\rd\\e", "a\\nb\\tc\\rd\\\\e"},
      {"\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"},
      {"nul\x01\x7f", "nul\\x01\\x7f"},
      {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
      {"\xc2\x9b"
       "2J",
       "\\xc2\\x9b2J"}, /* C1 CSI */
      {"\xe2\x80\xae"
       "evil",
       "\\xe2\\x80\\xaeevil"},             /* right-to-left override */
      {"\xe2\x80\xa8", "\\xe2\\x80\\xa8"}, /* line separator */
      {"\xff\xfe", "\\xff\\xfe"},
      {"\xc0\xaf", "\\xc0\\xaf"},                   /* overlong '/' */
      {"\xed\xa0\x80", "\\xed\\xa0\\x80"},          /* surrogate */
      {"\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"}, /* above U+10FFFF */
      {"cut \xe2\x82", "cut \\xe2\\x82"},
  };
  for (size_t i = 0; i < sizeof in_out / sizeof in_out[0]; i++)
    assert_string_equal(lh_escape(in_out[i][0], strlen(in_out[i][0]), buf, sizeof buf),
                        in_out[i][1]);
  assert_string_equal(lh_escape("a\0b", 3, buf, sizeof buf), "a\\x00b");
  assert_string_equal(lh_escape(NULL, 0, buf, sizeof buf), "");
  assert_string_equal(lh_escape("x", 1, buf, 0), "");
  /* truncation: at most cap bytes with the NUL, "..." at the end, no unit cut */
  assert_string_equal(lh_escape("abcdefghij", 10, buf, 11), "abcdefghij");
  assert_string_equal(lh_escape("abcdefghij", 10, buf, 10), "abcdef...");
  assert_string_equal(lh_escape("abcd\x1b", 5, buf, 8), "abcd...");
  assert_string_equal(lh_escape("ab\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac", 11, buf, 9),
                      "ab\xe2\x82\xac...");
  assert_string_equal(lh_escape("abcdef", 6, buf, 3), "..");
  char big[300];
  memset(big, '\x1b', sizeof big);
  const char *e = lh_escape(big, sizeof big, buf, sizeof buf);
  assert_true(strlen(e) < sizeof buf && strlen(e) >= sizeof buf - 4);
  assert_string_equal(e + strlen(e) - 7, "\\x1b...");
}

/* the message of the last error holds `want` */
static void assert_message(const char *want) {
  if (!strstr(lh_last_error(), want)) fail_msg("message '%s' lacks '%s'", lh_last_error(), want);
}

static void assert_spec_error(const char *spec, const char *want) {
  lh_env_config cfg;
  lh_err e = lh_env_config_parse(spec, &cfg);
  if (e != LH_ERR_USAGE) fail_msg("%s: %s, want USAGE (%s)", spec, lh_err_name(e), lh_last_error());
  assert_message(want);
}

#define ARITH_KEYS                                                                                 \
  "valid keys: digits (1..9, default 2), ops (characters of +-*, default +-), seed "               \
  "(0..18446744073709551615, default 0)"

/* Every bad spec is LH_ERR_USAGE, with a message that says what was expected and found and lists
 * the environment's keys with their ranges. */
static void test_config_errors(void **state) {
  lh_env_config cfg;
  lh_env *env = NULL;
  assert_spec_error("arith:digit=3", "arith: unknown key 'digit'; " ARITH_KEYS);
  assert_spec_error("arith:digits=0", "arith: digits: expected 1..9, found '0'; " ARITH_KEYS);
  assert_spec_error("arith:digits=10", "digits: expected 1..9, found '10'");
  assert_spec_error("arith:digits=x", "digits: expected 1..9, found 'x'");
  assert_spec_error("arith:digits= 2", "found ' 2'");
  assert_spec_error("arith:digits=+2", "found '+2'");
  assert_spec_error("arith:digits=2,ops=+,digits=3",
                    "arith: key 'digits' given twice; " ARITH_KEYS);
  assert_spec_error("arith:colour=3", "unknown key 'colour'");
  assert_spec_error("arith:seed=-1", "arith: seed: expected 0..18446744073709551615, found '-1'");
  assert_spec_error("arith:seed=18446744073709551616", "seed: expected");
  assert_spec_error("arith:ops=+/", "arith: ops: expected characters of +-*, found '+/'");
  assert_spec_error("arith:ops=", "arith: ops: expected characters of +-*, found nothing");
  assert_spec_error("arith:digits", "arith: expected key=value, found 'digits'");
  assert_spec_error("arith:,", "arith: expected key=value, found ''");
  assert_spec_error("countdown:count=9",
                    "countdown: count: expected 2..8, found '9'; valid keys: "
                    "count (2..8, default 4), max (1..1000, default 10), seed");
  assert_spec_error("countdown:max=1001", "max: expected 1..1000");
  assert_spec_error("countdown:digits=2", "countdown: unknown key 'digits'");
  assert_spec_error("sort:count=65", "sort: count: expected 1..64, found '65'; valid keys: count "
                                     "(1..64, default 5), digits (1..18, default 2), seed");
  assert_spec_error("sort:digits=19", "digits: expected 1..18");
  assert_spec_error("sort:ops=+", "sort: unknown key 'ops'");
  assert_spec_error("jsonl:path=x,seed=1",
                    "jsonl: unknown key 'seed'; valid keys: path (a file, required), test (a file "
                    "of test tasks, default none: test_fraction of path's tasks), match (exact, "
                    "numeric or auto, default auto), test_fraction (a number in (0, 1), default "
                    "0.1)");
  assert_spec_error("jsonl:path=x,test_fraction=0", "test_fraction: expected a number in (0, 1)");
  assert_spec_error("jsonl:path=x,test_fraction=1", "found '1'");
  assert_spec_error("jsonl:path=x,test_fraction=nan", "found 'nan'");
  assert_spec_error("jsonl:path=x,match=fuzzy", "match: expected exact, numeric or auto");
  assert_spec_error("jsonl:path=x,path=y", "key 'path' given twice");
  assert_spec_error("exec:path=x,timeout=3601", "exec: timeout: expected seconds in (0, 3600]");
  assert_spec_error("exec:path=x,timeout=0", "found '0'");
  assert_spec_error("exec:path=x,digits=1",
                    "valid keys: path (a shell command, required), timeout (seconds in (0, "
                    "3600], default 10)");
  assert_spec_error("nosuch", "unknown environment 'nosuch' (expected arith, countdown, sort, "
                              "jsonl or exec)");
  assert_spec_error(":digits=1", "expected NAME or NAME:key=value");
  /* spec text in a message is escaped: no terminal control reaches the user's screen */
  assert_spec_error("arith:\x1b[2J=1", "unknown key '\\x1b[2J'");
  assert_spec_error("arith:digits=\x1b]0;owned\x07", "found '\\x1b]0;owned\\x07'");
  assert_spec_error("nosuch\x1b[31m", "unknown environment 'nosuch\\x1b[31m'");
  assert_null(strchr(lh_last_error(), '\x1b'));
  /* good specs */
  assert_int_equal(lh_env_config_parse("arith:seed=18446744073709551615", &cfg), LH_ERR_OK);
  assert_true(cfg.seed == UINT64_MAX);
  assert_int_equal(lh_env_config_parse("arith:", &cfg), LH_ERR_OK);
  assert_int_equal(lh_env_config_parse("arith:digits=09,", &cfg), LH_ERR_OK);
  assert_int_equal(cfg.digits, 9);
  assert_int_equal(lh_env_config_parse("exec:path=sh -c 'a=b; echo $a'", &cfg), LH_ERR_OK);
  assert_string_equal(cfg.path, "sh -c 'a=b; echo $a'");
  /* a config built in code is checked as a spec is, defaults filled in first */
  memset(&cfg, 0, sizeof cfg);
  strcpy(cfg.name, "nosuch");
  assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_USAGE);
  assert_null(env);
  strcpy(cfg.name, "arith");
  strcpy(cfg.ops, "+/");
  assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_USAGE);
  assert_message("arith: ops: expected characters of +-*, found '+/'; " ARITH_KEYS);
  memset(&cfg, 0, sizeof cfg);
  strcpy(cfg.name, "countdown");
  cfg.count = 9;
  assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_USAGE);
  assert_message("countdown: count: expected 2..8, found 9");
  assert_int_equal(lh_env_config_parse("jsonl", &cfg), LH_ERR_OK);
  assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_USAGE);
  assert_message("jsonl: missing key path; valid keys: path (a file, required)");
  assert_int_equal(lh_env_config_parse("exec", &cfg), LH_ERR_OK);
  cfg.timeout_s = -1;
  strcpy(cfg.path, "cat");
  assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_USAGE);
  assert_message("exec: timeout: expected seconds in (0, 3600], found -1");
}

/* The effective spec of an environment (defaults filled in) reads back to the same settings, and
 * the key table lists each environment's keys. */
static void test_config_format(void **state) {
  static const char *const specs[][2] = {
      {"arith", "arith:digits=2,ops=+-,seed=0"},
      {"arith:seed=7,ops=*,digits=3", "arith:digits=3,ops=*,seed=7"},
      {"countdown:count=3,max=25,seed=7", "countdown:count=3,max=25,seed=7"},
      {"sort", "sort:count=5,digits=2,seed=0"},
      {"jsonl:path=" LH_SOURCE_DIR "/tests/fixtures/env/gsm.jsonl,match=numeric",
       "jsonl:path=" LH_SOURCE_DIR "/tests/fixtures/env/gsm.jsonl,match=numeric,test_fraction=0.1"},
      {"exec:timeout=0.25,path=cat", "exec:path=cat,timeout=0.25"},
  };
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    lh_env *env = make(specs[i][0]);
    char spec[2048], again[2048];
    assert_int_equal(lh_env_config_format(lh_env_config_of(env), spec, sizeof spec), LH_ERR_OK);
    assert_string_equal(spec, specs[i][1]);
    lh_env *env2 = make(spec);
    assert_int_equal(lh_env_config_format(lh_env_config_of(env2), again, sizeof again), LH_ERR_OK);
    assert_string_equal(again, spec);
    assert_memory_equal(lh_env_config_of(env), lh_env_config_of(env2), sizeof(lh_env_config));
    assert_int_equal(lh_env_config_format(lh_env_config_of(env), spec, 8), LH_ERR_LIMIT);
    lh_env_free(env);
    lh_env_free(env2);
  }
  lh_env *env = make("countdown:max=25");
  char v[16];
  assert_int_equal(lh_env_config_value(lh_env_config_of(env), "max", v, sizeof v), LH_ERR_OK);
  assert_string_equal(v, "25");
  assert_int_equal(lh_env_config_value(lh_env_config_of(env), "count", v, sizeof v), LH_ERR_OK);
  assert_string_equal(v, "4");
  assert_int_equal(lh_env_config_value(lh_env_config_of(env), "digits", v, sizeof v),
                   LH_ERR_NOTFOUND);
  lh_env_free(env);
  static const char *const arith_keys[] = {"digits", "ops", "seed"};
  for (size_t i = 0; i < 3; i++)
    assert_string_equal(lh_env_key_at("arith", i)->key, arith_keys[i]);
  assert_null(lh_env_key_at("arith", 3));
  assert_null(lh_env_key_at("nosuch", 0));
  assert_string_equal(lh_env_key_at("jsonl", 0)->def, "required");
  assert_non_null(strstr(lh_env_about("countdown"), "->T:"));
  assert_null(lh_env_about("nosuch"));
}

static void test_arith_scoring(void **state) {
  lh_env *env = make("arith");
  lh_env_task t = {.prompt = "12+34=", .answer = "46"};
  lh_env_result r = score(env, &t, "46");
  assert_true(r.correct && r.well_formed && r.reward == 1.0f);
  r = score(env, &t, " 46 \nwhatever follows");
  assert_true(r.correct);
  r = score(env, &t, "47");
  assert_true(!r.correct && r.well_formed && r.reward == 0.0f);
  r = score(env, &t, "046");
  assert_true(!r.correct && r.well_formed);
  r = score(env, &t, "4 6");
  assert_true(!r.correct && !r.well_formed && r.reward == 0.0f);
  r = score(env, &t, "");
  assert_true(!r.correct && !r.well_formed);
  lh_env_task n = {.prompt = "12-34=", .answer = "-22"};
  assert_true(score(env, &n, "-22").correct);
  assert_false(score(env, &n, "22").correct);
  /* generated tasks compute the right value */
  lh_env *m = make("arith:digits=3,ops=*");
  for (int i = 0; i < 100; i++) {
    lh_env_task g;
    assert_int_equal(lh_env_task_get(m, LH_SPLIT_TRAIN, (uint64_t)i, &g), LH_ERR_OK);
    long a, b;
    assert_int_equal(sscanf(g.prompt, "%ld*%ld=", &a, &b), 2);
    assert_true(a >= 100 && a <= 999 && b >= 100 && b <= 999);
    char want[32];
    snprintf(want, sizeof want, "%ld", a * b);
    assert_string_equal(g.answer, want);
    lh_env_task_clear(&g);
  }
  lh_env_free(m);
  lh_env_free(env);
}

static void test_sort_scoring(void **state) {
  lh_env *env = make("sort");
  lh_env_task t = {.prompt = "sort 31 7 12=", .answer = "7 12 31"};
  assert_true(score(env, &t, "7 12 31").reward == 1.0f);
  lh_env_result r = score(env, &t, "7 31 12");
  assert_true(!r.correct && r.well_formed && r.reward == 0.0f);
  r = score(env, &t, "7  12 31");
  assert_true(!r.correct && !r.well_formed);
  r = score(env, &t, "7,12,31");
  assert_true(!r.correct && !r.well_formed);
  lh_env_task g;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TEST, 3, &g), LH_ERR_OK);
  assert_true(!strncmp(g.prompt, "sort ", 5));
  lh_env_task_clear(&g);
  lh_env_free(env);
}

static lh_err ev(const char *s, const int64_t *nums, int n, int64_t *num, int64_t *den) {
  return lh_countdown_eval(s, strlen(s), nums, n, num, den);
}

static void test_countdown_evaluator(void **state) {
  int64_t n, d;
  const int64_t four[] = {1, 3, 3, 8};
  assert_int_equal(ev("8/(3-8/3)", (int64_t[]){8, 3, 8, 3}, 4, &n, &d), LH_ERR_OK);
  assert_true(n == 24 && d == 1); /* 8 / (1/3) */
  assert_int_equal(ev("1/3*3", four, 4, &n, &d), LH_ERR_OK);
  assert_true(n == 1 && d == 1);
  assert_int_equal(ev("8/3", four, 4, &n, &d), LH_ERR_OK);
  assert_true(n == 8 && d == 3);
  assert_int_equal(ev("1 - 8", four, 4, &n, &d), LH_ERR_OK);
  assert_true(n == -7 && d == 1);
  assert_int_equal(ev("8-3-1", four, 4, &n, &d), LH_ERR_OK); /* left associative */
  assert_true(n == 4);
  assert_int_equal(ev("8-(3-1)", four, 4, &n, &d), LH_ERR_OK);
  assert_true(n == 6);
  assert_int_equal(ev("1+3*8", four, 4, &n, &d), LH_ERR_OK); /* precedence */
  assert_true(n == 25);
  assert_int_equal(ev("(1+3)*8", four, 4, &n, &d), LH_ERR_OK);
  assert_true(n == 32);
  assert_int_equal(ev("3*3", four, 4, &n, &d), LH_ERR_OK); /* 3 is given twice */
  assert_int_equal(ev("3*3*3", four, 4, &n, &d), LH_ERR_MISMATCH);
  assert_non_null(strstr(lh_last_error(), "more often"));
  assert_int_equal(ev("8+5", four, 4, &n, &d), LH_ERR_MISMATCH);
  assert_non_null(strstr(lh_last_error(), "not given: 5"));
  assert_int_equal(ev("8/(3-3)", four, 4, &n, &d), LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "division by zero"));
  assert_int_equal(ev("8+", four, 4, &n, &d), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "end of expression"));
  assert_int_equal(ev("(8+1", four, 4, &n, &d), LH_ERR_FORMAT);
  assert_int_equal(ev("8+1)", four, 4, &n, &d), LH_ERR_FORMAT);
  assert_int_equal(ev("8 x 1", four, 4, &n, &d), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "offset 2"));
  assert_int_equal(ev("-8", four, 4, &n, &d), LH_ERR_FORMAT);
  assert_int_equal(ev("", four, 4, &n, &d), LH_ERR_FORMAT);
  assert_int_equal(ev("08", (int64_t[]){8}, 1, &n, &d), LH_ERR_FORMAT);
  assert_int_equal(ev("8\x01", four, 4, &n, &d), LH_ERR_FORMAT);
  /* nesting: 32 levels are fine, 33 are refused */
  char deep[128];
  memset(deep, '(', 32);
  deep[32] = '8';
  memset(deep + 33, ')', 32);
  deep[65] = '\0';
  assert_int_equal(ev(deep, four, 4, &n, &d), LH_ERR_OK);
  memset(deep, '(', 33);
  deep[33] = '8';
  memset(deep + 34, ')', 33);
  deep[67] = '\0';
  assert_int_equal(ev(deep, four, 4, &n, &d), LH_ERR_LIMIT);
  char longe[LH_COUNTDOWN_MAX_LEN + 2];
  memset(longe, ' ', sizeof longe - 1);
  longe[0] = '8';
  longe[sizeof longe - 1] = '\0';
  assert_int_equal(ev(longe, four, 4, &n, &d), LH_ERR_LIMIT);
  /* overflow is reported, not wrapped */
  assert_int_equal(ev("1000000000*1000000000*10", NULL, 0, &n, &d), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "overflow"));
  assert_int_equal(ev("1/999999999-1/999999998+1/999999997", NULL, 0, &n, &d), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "overflow"));
  /* literals up to 10^9 (env.h), also without given numbers */
  assert_int_equal(ev("1000000000", NULL, 0, &n, &d), LH_ERR_OK);
  assert_true(n == 1000000000 && d == 1);
  assert_int_equal(ev("1000000001", NULL, 0, &n, &d), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "offset 0: number larger than 10^9"));
  assert_int_equal(ev("1+9999999999", NULL, 0, &n, &d), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "offset 2"));
  assert_int_equal(ev("12345678901234567890123", NULL, 0, &n, &d), LH_ERR_LIMIT);
}

static void test_countdown_scoring(void **state) {
  lh_env *env = make("countdown");
  lh_env_task t = {
      .prompt = "1 3 3 8->24:", .answer = "24", .n_nums = 4, .nums = {1, 3, 3, 8}, .target = 24};
  lh_env_result r = score(env, &t, "(1+3)*3+8+4");
  assert_true(!r.correct && !r.well_formed && r.reward == 0.0f); /* 4 not given */
  r = score(env, &t, "8*3*1");
  assert_true(r.correct && r.reward == 1.0f); /* not all numbers need be used */
  r = score(env, &t, "8*3*1\nmore text");
  assert_true(r.correct);
  r = score(env, &t, "8*3+1");
  assert_true(!r.correct && r.well_formed && r.reward == 0.1f);
  r = score(env, &t, "8/3*9");
  assert_true(!r.correct && !r.well_formed);
  r = score(env, &t, "24");
  assert_true(!r.correct && !r.well_formed);
  r = score(env, &t, "8/(3-3)");
  assert_true(!r.correct && !r.well_formed && r.reward == 0.0f);
  /* generated instances: the reference solution uses the given numbers and hits the target,
   * which is never one of the numbers (writing it down would solve the task: 12% of them did) */
  lh_env_task g;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &g), LH_ERR_OK);
  assert_int_equal(g.n_nums, 4);
  assert_true(g.target >= 1 && g.target <= 999);
  assert_non_null(strstr(g.prompt, "->"));
  lh_env_task_clear(&g);
  for (int count = 2; count <= 4; count++) {
    char spec[32];
    snprintf(spec, sizeof spec, "countdown:count=%d", count);
    lh_env *e = make(spec);
    for (uint64_t i = 0; i < 300; i++) {
      assert_int_equal(lh_env_task_get(e, i % 2 ? LH_SPLIT_TEST : LH_SPLIT_TRAIN, i, &g),
                       LH_ERR_OK);
      for (int k = 0; k < g.n_nums; k++)
        assert_true(g.nums[k] != g.target);
      assert_true(score(e, &g, g.solution).correct);
      lh_env_task_clear(&g);
    }
    lh_env_free(e);
  }
  lh_env_free(env);
}

static void expect_level(const char *spec, uint64_t index, const char *prompt, const char *level) {
  lh_env *env = make(spec);
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TEST, index, &t), LH_ERR_OK);
  assert_string_equal(t.prompt, prompt);
  assert_string_equal(t.level, level);
  lh_env_task_clear(&t);
  assert_string_equal(t.level, "");
  lh_env_free(env);
}

static int digit_sum(long v) {
  int s = 0;
  for (; v > 0; v /= 10)
    s += (int)(v % 10);
  return s;
}

/* Difficulty labels. Hand-checked instances (test split), then every arith instance against
 * the digit-sum identity: adding x + y makes (s(x) + s(y) - s(x + y)) / 9 carries (each carry
 * turns a 10 in one column into a 1 in the next), and the borrows of a - b (a >= b) are the
 * carries of (a - b) + b. */
static void test_levels(void **state) {
  /* 2+8 = 10 carries, 6+7+1 = 14 carries */
  expect_level("arith:digits=2,ops=+-*", 0, "62+78=", "+ 2 carries");
  expect_level("arith:digits=2,ops=+-*", 1, "52*24=", "* 2 digits");
  expect_level("arith:digits=2,ops=+-*", 4, "24+27=", "+ 1 carry");
  /* 12-79 is -(79-12): 9-2 and 7-1 borrow nothing */
  expect_level("arith:digits=2,ops=+-*", 11, "12-79=", "- 0 borrows");
  /* 616-528: 6-8 borrows, 1-2-1 borrows, 6-5-1 = 0 */
  expect_level("arith:digits=3", 2, "528-616=", "- 2 borrows");
  expect_level("arith:digits=3", 0, "716-451=", "- 1 borrow");
  /* 58 48 84 25 1: 3 + 2 + 2 + 1 = 8 pairs out of order */
  expect_level("sort", 0, "sort 58 48 84 25 1=", "inversions 6+");
  expect_level("sort", 1, "sort 40 21 50 42 70=", "inversions 0-2"); /* 40>21, 50>42 */
  expect_level("sort", 2, "sort 12 83 7 9 88=", "inversions 3-5");   /* 12, 83 > 7, 9 */
  /* 79 81 79 22 15: the two 79s are in order; 2 + 3 + 2 + 1 = 8 */
  expect_level("sort", 6, "sort 79 81 79 22 15=", "inversions 6+");
  /* reference 6/(8*1/8): all four numbers, three of the three operators * or / */
  expect_level("countdown", 2, "1 4 9 10->2:", "uses 4, 2 mul/div"); /* was 1 6 8 8->6 */
  expect_level("countdown:count=2", 2, "8 9->72:", "uses 2, 1 mul/div");
  expect_level("arith:digits=1,ops=*", 0, "6*5=", "* 1 digit");
  lh_env *env = make("arith:digits=3,ops=+-");
  int seen_carry[4] = {0}, seen_borrow[4] = {0};
  for (uint64_t i = 0; i < 500; i++) {
    lh_env_task t;
    assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, i, &t), LH_ERR_OK);
    long a, b;
    char op;
    assert_int_equal(sscanf(t.prompt, "%ld%c%ld=", &a, &op, &b), 3);
    if (op == '-' && a < b) {
      long x = a;
      a = b;
      b = x;
    }
    long x = op == '+' ? a : a - b, y = b;
    int n = (digit_sum(x) + digit_sum(y) - digit_sum(x + y)) / 9;
    char want[24];
    if (op == '+')
      snprintf(want, sizeof want, "+ %d %s", n, n == 1 ? "carry" : "carries");
    else
      snprintf(want, sizeof want, "- %d %s", n, n == 1 ? "borrow" : "borrows");
    if (strcmp(t.level, want)) fail_msg("%s: level \"%s\", want \"%s\"", t.prompt, t.level, want);
    (op == '+' ? seen_carry : seen_borrow)[n]++;
    lh_env_task_clear(&t);
  }
  for (int n = 0; n < 4; n++) /* 3-digit operands: 0..3 carries, 0..2 borrows all occur */
    assert_true(seen_carry[n] > 0 && (n == 3 || seen_borrow[n] > 0));
  lh_env_free(env);
  /* a jsonl item has no level */
  env = make("jsonl:path=" LH_SOURCE_DIR "/tests/fixtures/env/gsm.jsonl");
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &t), LH_ERR_OK);
  assert_string_equal(t.level, "");
  lh_env_task_clear(&t);
  lh_env_free(env);
}

#define FIX LH_SOURCE_DIR "/tests/fixtures/env/"

static lh_err try_jsonl(const char *file, lh_env **env) {
  lh_env_config cfg;
  assert_int_equal(lh_env_config_parse("jsonl", &cfg), LH_ERR_OK);
  snprintf(cfg.path, sizeof cfg.path, "%s%s", FIX, file);
  *env = NULL;
  return lh_env_create(&cfg, env);
}

static void test_jsonl_gsm_numeric(void **state) {
  lh_env *env = make("jsonl:path=" FIX "gsm.jsonl,match=numeric");
  uint64_t ntr = lh_env_size(env, LH_SPLIT_TRAIN), nte = lh_env_size(env, LH_SPLIT_TEST);
  assert_int_equal(ntr + nte, 200);
  assert_true(nte >= 5 && nte <= 50); /* about 10% */
  /* disjoint: no test prompt is a train prompt */
  for (uint64_t i = 0; i < nte; i++) {
    lh_env_task t;
    assert_int_equal(lh_env_task_get(env, LH_SPLIT_TEST, i, &t), LH_ERR_OK);
    for (uint64_t k = 0; k < ntr; k++) {
      lh_env_task u;
      assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, k, &u), LH_ERR_OK);
      assert_string_not_equal(t.prompt, u.prompt);
      lh_env_task_clear(&u);
    }
    lh_env_task_clear(&t);
  }
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, ntr + 1, &t), LH_ERR_OK); /* wraps */
  int a = -1;
  assert_int_equal(sscanf(t.prompt, "Tom has %d", &a), 1);
  char good[64], bad[64];
  snprintf(good, sizeof good, "Let me think: %d+%d... so the answer is %d.", a, a + 3, 2 * a + 3);
  snprintf(bad, sizeof bad, "The answer is %d, then %d", 2 * a + 3, 2 * a + 4);
  lh_env_result r = score(env, &t, good);
  assert_true(r.correct && r.well_formed && r.reward == 1.0f);
  r = score(env, &t, bad); /* the last number counts */
  assert_true(!r.correct && r.well_formed && r.reward == 0.0f);
  r = score(env, &t, "no idea");
  assert_true(!r.correct && !r.well_formed);
  lh_env_task_clear(&t);
  lh_env_free(env);

  size_t at, n;
  assert_true(lh_env_last_number("costs $1,234.50.", 16, &at, &n) && at == 7 && n == 8);
  assert_true(lh_env_last_number("x = -7", 6, &at, &n) && at == 4 && n == 2);
  assert_true(lh_env_last_number("5-3", 3, &at, &n) && at == 2 && n == 1);
  assert_false(lh_env_last_number("none", 4, &at, &n));
}

/* The reward of a completion for an answer given as JSON text (1e-7, "\"3,4\""), scored by a
 * jsonl environment (its own items are not used); fails the test when it is not want. */
static void expect_reward(lh_env *env, const char *answer_json, const char *completion,
                          float want) {
  char line[2048];
  snprintf(line, sizeof line, "{\"prompt\":\"x\",\"answer\":%s}", answer_json);
  lh_env_task t = {0};
  if (lh_env_jsonl_parse_line(line, strlen(line), "t", 1, &t.prompt, &t.answer))
    fail_msg("answer %s: %s", answer_json, lh_last_error());
  float got = score(env, &t, completion).reward;
  if (got != want)
    fail_msg("answer %s (text \"%s\"), completion \"%s\": reward %g, want %g", answer_json,
             t.answer, completion, got, want);
  lh_env_task_clear(&t);
}

/* match=numeric compares the values exactly as decimals: no tolerance, no rounding to doubles */
static void test_jsonl_numeric_exact(void **state) {
  lh_env *env = make("jsonl:path=" FIX "exact.jsonl,match=numeric");
  expect_reward(env, "1234567", "1234567", 1);
  expect_reward(env, "1234567", "it is 1,234,567.000", 1);
  expect_reward(env, "1234567", "1234566", 0); /* within a relative 1e-6 */
  expect_reward(env, "1234567", "1234568", 0);
  expect_reward(env, "123456789012", "123456700000", 0);
  expect_reward(env, "\"9007199254740993\"", "9007199254740992", 0); /* one double */
  expect_reward(env, "\"9007199254740993\"", "9007199254740993", 1);
  expect_reward(env, "0.5", "0.50", 1);
  expect_reward(env, "0.5", "00.5000", 1);
  expect_reward(env, "0.5", "0.05", 0);
  expect_reward(env, "100", "100.0", 1);
  expect_reward(env, "100", "1", 0);
  expect_reward(env, "\"-0\"", "0", 1);
  expect_reward(env, "0", "-0.000", 1);
  expect_reward(env, "-7", "7", 0);
  expect_reward(env, "-2.5", "so -2.50", 1);
  /* 400 digits: beyond any double, still compared digit by digit */
  char big[420], json[424], other[420];
  memset(big, '7', 400);
  big[400] = '\0';
  snprintf(json, sizeof json, "\"%s\"", big);
  expect_reward(env, json, big, 1);
  memcpy(other, big, sizeof big);
  other[399] = '8';
  expect_reward(env, json, other, 0);
  lh_env_free(env);
  assert_true(lh_env_number_equal("1,000", 5, "1000.00", 7));
  assert_false(lh_env_number_equal("1000", 4, "1000 ", 5)); /* not exactly one number */
  assert_false(lh_env_number_equal("5-3", 3, "3", 1));
}

static bool equal(const char *a, const char *b) {
  return lh_env_number_equal(a, strlen(a), b, strlen(b));
}

/* A real answer is %.15g text, which has an exponent below 1e-4 and from about 1e15; numbers
 * with an exponent are read and compared at their value, by match=numeric and match=auto. */
static void test_jsonl_numeric_exponent(void **state) {
  static const char *const specs[] = {"jsonl:path=" FIX "exact.jsonl,match=numeric",
                                      "jsonl:path=" FIX "exact.jsonl"};
  for (int k = 0; k < 2; k++) {
    lh_env *env = make(specs[k]);
    expect_reward(env, "1e-7", "0.0000001", 1); /* the answer is "1e-07" */
    expect_reward(env, "1e-7", "7", 0);
    expect_reward(env, "1e-7", "so 10E-8", 1);
    expect_reward(env, "1e21", "1000000000000000000000", 1); /* "1e+21" */
    expect_reward(env, "1e21", "21", 0);
    expect_reward(env, "2.5e-5", "0.000025", 1); /* "2.5e-05" */
    expect_reward(env, "2.5e-5", "5", 0);
    expect_reward(env, "1234.5", "1.2345e3", 1);
    expect_reward(env, "3", "3eggs", 1);
    /* out of range: equals nothing, so auto falls back to exact */
    expect_reward(env, "\"1e9999999999999999999\"", "1e9999999999999999999", (float)k);
    lh_env_free(env);
  }
  size_t at, n;
  assert_true(lh_env_last_number("x 1e+", 5, &at, &n) && at == 2 && n == 1);
  assert_true(lh_env_last_number("it is 5E3.", 10, &at, &n) && at == 6 && n == 3);
  assert_true(equal("1e3", "1,000"));
  assert_true(equal("-0.00125", "-1.25e-3"));
  assert_true(equal("0.1e1", "1"));
  assert_false(equal("1e3", "1e4"));
  /* exponents at the limit compare exactly; beyond it nothing overflows and nothing matches */
  assert_true(equal("1e1000000000000000", "10e999999999999999"));
  assert_true(equal("1e-1000000000000000", "0.1e-999999999999999"));
  assert_false(equal("1e1000000000000000", "1e999999999999999"));
  assert_false(equal("1e1000000000000001", "1e1000000000000001"));
  assert_false(equal("5e-99999999999999999999999999999", "5e-99999999999999999999999999999"));
  assert_true(equal("0e99999999999999999999999", "-0"));
}

/* A number may start at its point (".5", "-.5"), and a comma is only a thousands separator
 * (before the point, after a first group of 1-3 digits, followed by exactly three digits):
 * other commas end the number, so lists read as lists. */
static void test_jsonl_numeric_point_and_commas(void **state) {
  lh_env *env = make("jsonl:path=" FIX "exact.jsonl,match=numeric");
  expect_reward(env, "0.5", ".5", 1);
  expect_reward(env, "0.5", "5", 0);
  expect_reward(env, "-0.5", "-.5", 1);
  expect_reward(env, "-0.5", "so x = -.50", 1);
  expect_reward(env, "0.25", "0.5,0.25", 1);
  expect_reward(env, "25", "0.5,0.25", 0);
  expect_reward(env, "4", "3,4", 1);
  expect_reward(env, "34", "3,4", 0);
  expect_reward(env, "3", "1,2,3", 1);
  expect_reward(env, "1234567.5", "1,234,567.5", 1);
  expect_reward(env, "567", "1234,567", 1);
  expect_reward(env, "456", "0.123,456", 1);
  lh_env_free(env);
  env = make("jsonl:path=" FIX "exact.jsonl"); /* auto */
  expect_reward(env, "\"3,4\"", "34", 0);      /* a list: exact */
  expect_reward(env, "\"3,4\"", "3,4", 1);
  expect_reward(env, "\"1,2,3\"", "123", 0);
  expect_reward(env, "\"1,2,3\"", " 1,2,3\n", 1);
  expect_reward(env, "\"1,000\"", "so 1000", 1); /* one number: numeric */
  expect_reward(env, "\".5\"", "0.50", 1);
  lh_env_free(env);
  size_t at, n;
  assert_true(lh_env_last_number("1.2.3", 5, &at, &n) && at == 4 && n == 1);
  assert_true(lh_env_last_number("wait...5", 8, &at, &n) && at == 7 && n == 1);
  assert_true(lh_env_last_number("1,000,00", 8, &at, &n) && at == 6 && n == 2);
  assert_true(lh_env_last_number("-1,234.5e2", 10, &at, &n) && at == 0 && n == 10);
  assert_true(lh_env_last_number("5-.5", 4, &at, &n) && at == 2 && n == 2);
  assert_true(equal("-.5e1", "-5"));
  assert_false(equal("3,4", "34"));
  assert_false(equal("1,23", "123"));
  /* three digits after the comma, then one more digit: not a separator, two numbers */
  assert_true(lh_env_last_number("1,2345", 6, &at, &n) && at == 2 && n == 4);
  assert_true(lh_env_last_number("x 1,234,5678.", 13, &at, &n) && at == 8 && n == 4);
  assert_false(equal("1,2345", "12345"));
  assert_true(equal("1,234", "1234")); /* then the end: a separator */
}

static void test_jsonl_exact_and_auto(void **state) {
  lh_env *env = make("jsonl:path=" FIX "exact.jsonl,test=" FIX "test_only.jsonl");
  assert_int_equal(lh_env_size(env, LH_SPLIT_TRAIN), 3);
  assert_int_equal(lh_env_size(env, LH_SPLIT_TEST), 2);
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &t), LH_ERR_OK);
  assert_string_equal(t.answer, "Paris");
  assert_true(score(env, &t, "  Paris\n").correct); /* auto: exact for text answers */
  assert_false(score(env, &t, "paris").correct);
  assert_false(score(env, &t, "Paris is the capital").correct);
  lh_env_task_clear(&t);
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 1, &t), LH_ERR_OK);
  assert_string_equal(t.answer, "4");               /* numbers become text */
  assert_true(score(env, &t, "it is 4.0").correct); /* auto: numeric for number answers */
  lh_env_task_clear(&t);
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TEST, 1, &t), LH_ERR_OK);
  assert_string_equal(t.prompt, "t2");
  lh_env_task_clear(&t);
  lh_env_free(env);
}

/* A real answer becomes the shortest text that reads back as the same double, so "0.1" is the
 * answer and the SFT target, not "0.10000000000000001". */
static void test_jsonl_real_answers(void **state) {
  lh_env *env = make("jsonl:path=" FIX "real.jsonl,test=" FIX "test_only.jsonl");
  static const char *const want[] = {"0.1",
                                     "3.14",
                                     "0.30000000000000004",
                                     "100",
                                     "-0.0025",
                                     "1.7976931348623157e+308",
                                     "123456789012.345"};
  assert_int_equal(lh_env_size(env, LH_SPLIT_TRAIN), 7);
  for (uint64_t i = 0; i < 7; i++) {
    lh_env_task t;
    assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, i, &t), LH_ERR_OK);
    assert_string_equal(t.answer, want[i]);
    assert_string_equal(t.solution, want[i]);
    lh_env_task_clear(&t);
  }
  lh_env_free(env);
  env = make("jsonl:path=" FIX "real.jsonl,test=" FIX "test_only.jsonl,match=exact");
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &t), LH_ERR_OK);
  assert_true(score(env, &t, "0.1").correct);
  lh_env_task_clear(&t);
  lh_env_free(env);
}

static void test_jsonl_errors(void **state) {
  lh_env *env;
  assert_int_equal(try_jsonl("bad_json.jsonl", &env), LH_ERR_FORMAT);
  assert_null(env);
  assert_non_null(strstr(lh_last_error(), "bad_json.jsonl:4: "));
  assert_int_equal(try_jsonl("bad_field.jsonl", &env), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "bad_field.jsonl:2: field prompt: expected a string"));
  assert_int_equal(try_jsonl("bad_answer.jsonl", &env), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "bad_answer.jsonl:1: field answer"));
  assert_int_equal(try_jsonl("not_object.jsonl", &env), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "not_object.jsonl:2: expected a JSON object"));
  assert_int_equal(try_jsonl("missing.jsonl", &env), LH_ERR_IO);
  /* an integer beyond int64: the message names the line and the field, and says what to do */
  assert_int_equal(try_jsonl("bigint.jsonl", &env), LH_ERR_FORMAT);
  if (!strstr(lh_last_error(), "bigint.jsonl:2: field answer: an integer beyond the int64 range") ||
      !strstr(lh_last_error(), "write it as a string"))
    fail_msg("message '%s'", lh_last_error());
  const char *other = "{\"prompt\":\"x\",\"answer\":\"1\",\"id\":-99999999999999999999}";
  char *p, *a;
  assert_int_equal(lh_env_jsonl_parse_line(other, strlen(other), "f", 5, &p, &a), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "f:5: field id: an integer beyond the int64 range"));
  /* a UTF-8 byte-order mark at the start of a file is skipped */
  if (try_jsonl("bom.jsonl", &env)) fail_msg("bom.jsonl: %s", lh_last_error());
  lh_env_free(env);
  env = make("jsonl:path=" FIX "bom.jsonl,test=" FIX "test_only.jsonl");
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &t), LH_ERR_OK);
  assert_string_equal(t.prompt, "bom first");
  lh_env_task_clear(&t);
  lh_env_free(env);
  assert_int_equal(lh_env_jsonl_parse_line("{\"prompt\":\"x\"}", 14, "f", 9, &p, &a),
                   LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "f:9: field answer"));
  assert_null(p);
  /* a blank answer would reward an empty completion: refused with the file and line */
  static const char *const blank[] = {"{\"prompt\":\"x\",\"answer\":\"\"}",
                                      "{\"prompt\":\"x\",\"answer\":\" \\t\\n \"}"};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(lh_env_jsonl_parse_line(blank[i], strlen(blank[i]), "f", 8, &p, &a),
                     LH_ERR_FORMAT);
    assert_non_null(strstr(lh_last_error(), "f:8: field answer: expected a non-blank answer"));
    assert_null(p);
  }
  char blank_path[64];
  snprintf(blank_path, sizeof blank_path, "/tmp/lh_test_env_blank_%ld.jsonl", (long)getpid());
  FILE *f = fopen(blank_path, "w");
  assert_non_null(f);
  fprintf(f, "{\"prompt\":\"a\",\"answer\":\"1\"}\n%s\n", blank[1]);
  fclose(f);
  lh_env_config cfg;
  assert_int_equal(lh_env_config_parse("jsonl", &cfg), LH_ERR_OK);
  snprintf(cfg.path, sizeof cfg.path, "%s", blank_path);
  lh_err e = lh_env_create(&cfg, &env);
  remove(blank_path);
  assert_int_equal(e, LH_ERR_FORMAT);
  assert_null(env);
  char want[160];
  snprintf(want, sizeof want, "%s:2: field answer: expected a non-blank answer", blank_path);
  if (!strstr(lh_last_error(), want)) fail_msg("message '%s'", lh_last_error());
  char *big = malloc(LH_JSONL_MAX_LINE + 2);
  memset(big, ' ', LH_JSONL_MAX_LINE + 1);
  assert_int_equal(lh_env_jsonl_parse_line(big, LH_JSONL_MAX_LINE + 1, "f", 3, &p, &a),
                   LH_ERR_LIMIT);
  free(big);
}

/* Text from a data file in a message is escaped (an ESC sequence there would recolour or clear the
 * user's terminal), and the message names FILE:LINE, the file name escaped too. */
static void test_jsonl_escapes(void **state) {
  lh_env *env;
  assert_int_equal(try_jsonl("esc_raw.jsonl", &env), LH_ERR_FORMAT);
  assert_message("esc_raw.jsonl:2: column 24: invalid token near '\\x1b'");
  assert_null(strchr(lh_last_error(), '\x1b'));
  assert_int_equal(try_jsonl("esc_field.jsonl", &env), LH_ERR_FORMAT);
  assert_message("esc_field.jsonl:3: field \\x1b]0;title\\x07: an integer beyond the int64 range");
  assert_null(strchr(lh_last_error(), '\x1b'));
  assert_null(strchr(lh_last_error(), '\x07'));
  /* a file whose name holds an ESC sequence */
  char path[128], spec[160], want[160];
  snprintf(path, sizeof path, "/tmp/lh_test_env_\x1b[7m_%ld.jsonl", (long)getpid());
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "{\"prompt\":\"a\",\"answer\":\"1\"}\n{\"prompt\":2,\"answer\":\"1\"}\n");
  fclose(f);
  snprintf(spec, sizeof spec, "jsonl:path=%s", path);
  lh_env_config cfg;
  assert_int_equal(lh_env_config_parse(spec, &cfg), LH_ERR_OK);
  lh_err e = lh_env_create(&cfg, &env);
  remove(path);
  assert_int_equal(e, LH_ERR_FORMAT);
  snprintf(want, sizeof want, "/tmp/lh_test_env_\\x1b[7m_%ld.jsonl:2: field prompt",
           (long)getpid());
  assert_message(want);
  assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_IO); /* removed: cannot open */
  snprintf(want, sizeof want, "/tmp/lh_test_env_\\x1b[7m_%ld.jsonl: cannot open", (long)getpid());
  assert_message(want);
  assert_null(strchr(lh_last_error(), '\x1b'));
}

static lh_env *make_exec(const char *mode, double timeout) {
  lh_env_config cfg;
  assert_int_equal(lh_env_config_parse("exec", &cfg), LH_ERR_OK);
  snprintf(cfg.path, sizeof cfg.path, "/usr/bin/python3 %sexec_env.py %s", FIX, mode);
  cfg.timeout_s = timeout;
  lh_env *env = NULL;
  assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_OK);
  return env;
}

static void test_exec_happy_path(void **state) {
  lh_env *env = make_exec("good", 10);
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 7, &t), LH_ERR_OK);
  assert_string_equal(t.prompt, "7+7=");
  assert_string_equal(t.answer, "14");
  assert_string_equal(t.solution, "14");
  lh_env_result r = score(env, &t, "14\n");
  assert_true(r.correct && r.well_formed && r.reward == 1.0f);
  r = score(env, &t, "15");
  assert_true(!r.correct && r.reward == 0.0f);
  lh_env_task_clear(&t);
  /* bytes that are not UTF-8 reach the program as U+FFFD, one per maximal ill-formed subpart
   * (as Python decodes them with errors="replace"); the valid characters around them are kept.
   * The fixture says correct when completion == answer. */
  static const char *const sent_got[][2] = {
      {"caf\xc3\xa9 \xe2\x82", "caf\xc3\xa9 \xef\xbf\xbd"}, /* cut inside the euro sign */
      {"\xff\xfe 14", "\xef\xbf\xbd\xef\xbf\xbd 14"},
      {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                 /* overlong '/' */
      {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate */
      {"\xf0\x9f\x98", "\xef\xbf\xbd"},                         /* cut emoji */
      {"a\xe2\x82\xac\xf0\x9f\x98\x80"
       "b\xe2",
       "a\xe2\x82\xac\xf0\x9f\x98\x80"
       "b\xef\xbf\xbd"},
  };
  for (size_t i = 0; i < sizeof sent_got / sizeof sent_got[0]; i++) {
    lh_env_task u = {.prompt = "x", .answer = (char *)sent_got[i][1]};
    r = score(env, &u, sent_got[i][0]);
    if (!r.correct) fail_msg("completion %zu did not reach the program as expected", i);
  }
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TEST, 7, &t), LH_ERR_OK);
  assert_string_equal(t.prompt, "1007+1007=");
  lh_env_task_clear(&t);
  lh_env_free(env);
}

/* index 2 misbehaves; the error names the request, the task is skipped, and index 3 works on a
 * restarted program */
static void exec_failure(const char *mode, lh_err want, const char *msg, double timeout) {
  lh_env *env = make_exec(mode, timeout);
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 1, &t), LH_ERR_OK);
  lh_env_task_clear(&t);
  double t0 = lh_time_now();
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 2, &t), want);
  assert_true(lh_time_now() - t0 < timeout + 2);
  if (!strstr(lh_last_error(), msg)) fail_msg("%s: message '%s'", mode, lh_last_error());
  assert_non_null(strstr(lh_last_error(), "generate train 2"));
  assert_null(t.prompt);
  if (lh_env_task_get(env, LH_SPLIT_TRAIN, 3, &t)) fail_msg("%s: %s", mode, lh_last_error());
  assert_string_equal(t.prompt, "3+3=");
  lh_env_task_clear(&t);
  lh_env_free(env);
}

static void test_exec_failures(void **state) {
  exec_failure("crash", LH_ERR_IO, "exited with status 3", 10);
  exec_failure("hang", LH_ERR_IO, "no reply within 1 s", 1);
  exec_failure("garbage", LH_ERR_FORMAT, "malformed reply", 10);
  /* a JSON line without the fields, then the real reply: the program is restarted, so index 3
   * does not get index 2's reply */
  exec_failure("nofields", LH_ERR_FORMAT, "expected string fields prompt and answer", 10);
  lh_env *env = make_exec("badreward", 10);
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &t), LH_ERR_OK);
  lh_env_result r;
  assert_int_equal(lh_env_score(env, &t, "0", 1, &r), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "reward in [0, 1]"));
  lh_env_task_clear(&t);
  lh_env_free(env);
  env = make_exec("good", 10);
  lh_env_free(env); /* never started: nothing to stop */
  lh_env_config cfg;
  assert_int_equal(lh_env_config_parse("exec:path=/nonexistent/program", &cfg), LH_ERR_OK);
  assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_OK);
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &t), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "exited with status 127"));
  lh_env_free(env);
  /* a reply line longer than LH_EXEC_MAX_REPLY is LH_ERR_LIMIT, as env.h says */
  assert_int_equal(lh_env_config_parse("exec", &cfg), LH_ERR_OK);
  snprintf(cfg.path, sizeof cfg.path, "read -r l; head -c %u /dev/zero | tr '\\0' x; echo",
           LH_EXEC_MAX_REPLY + 10);
  assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_OK);
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &t), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "reply longer than 1048576 bytes"));
  assert_null(t.prompt);
  lh_env_free(env);
}

/* Without "correct", a score is correct when the reward, as stored (a float), is 1: a program's
 * 0.9999999999 is stored as 1 and must not come back as reward 1 but incorrect. */
static void test_exec_correct_default(void **state) {
  static const char *const reward[] = {"0.9999999999", "0.99999", "1"};
  static const bool want[] = {true, false, true};
  for (int i = 0; i < 3; i++) {
    lh_env_config cfg;
    assert_int_equal(lh_env_config_parse("exec", &cfg), LH_ERR_OK);
    snprintf(cfg.path, sizeof cfg.path, "while read -r l; do echo '{\"reward\":%s}'; done",
             reward[i]);
    lh_env *env = NULL;
    assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_OK);
    lh_env_task t = {.prompt = "x", .answer = "y"};
    lh_env_result r = score(env, &t, "z");
    if (r.correct != want[i] || (r.reward == 1.0f) != want[i])
      fail_msg("reward %s: stored %.9g, correct %d, want %d", reward[i], r.reward, r.correct,
               want[i]);
    lh_env_free(env);
  }
}

/* A reply with an ESC sequence: the message names the request (its task index) and escapes the
 * program's text; so is the command, which came from the spec. */
static void test_exec_escapes(void **state) {
  lh_env_config cfg;
  assert_int_equal(lh_env_config_parse("exec", &cfg), LH_ERR_OK);
  snprintf(cfg.path, sizeof cfg.path,
           "while read -r l; do printf '\\033[2J\\033[31mnot json\\n'; done # \033[7m");
  lh_env *env = NULL;
  assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_OK);
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TEST, 5, &t), LH_ERR_FORMAT);
  assert_message("generate test 5: malformed reply: '[' or '{' expected near '\\x1b'");
  assert_message("# \\x1b[7m': ");
  assert_null(strchr(lh_last_error(), '\x1b'));
  lh_env_task u = {.prompt = "p", .answer = "a", .split = LH_SPLIT_TRAIN, .index = 9};
  lh_env_result r;
  assert_int_equal(lh_env_score(env, &u, "x", 1, &r), LH_ERR_FORMAT);
  assert_message("score train 9: malformed reply");
  assert_null(strchr(lh_last_error(), '\x1b'));
  lh_env_free(env);
}

/* Task `index` from env: either an error or the task that index asked for, never another one. */
static lh_err get_in_step(lh_env *env, const char *mode, uint64_t index) {
  lh_env_task t;
  lh_err e = lh_env_task_get(env, LH_SPLIT_TRAIN, index, &t);
  if (e) return e;
  char want[32];
  snprintf(want, sizeof want, "%llu+%llu=", (unsigned long long)index, (unsigned long long)index);
  if (strcmp(t.prompt, want))
    fail_msg("%s: index %llu got prompt \"%s\", want \"%s\"", mode, (unsigned long long)index,
             t.prompt, want);
  lh_env_task_clear(&t);
  return LH_ERR_OK;
}

/* Programs that write lines no request asked for: every reply lands on its own request or the
 * request fails, and the program is restarted, so later requests are answered in step. */
static void test_exec_extra_output(void **state) {
  /* a line before the first request: the program is out of step from the start */
  lh_env *env = make_exec("banner", 10);
  for (uint64_t i = 0; i < 4; i++) {
    assert_int_equal(get_in_step(env, "banner", i), LH_ERR_FORMAT);
    assert_non_null(strstr(lh_last_error(), "malformed reply"));
  }
  lh_env_free(env);
  /* asked for index 2, the program first repeats its reply to index 1 (request_id 1) */
  env = make_exec("extra", 10);
  assert_int_equal(get_in_step(env, "extra", 0), LH_ERR_OK);
  assert_int_equal(get_in_step(env, "extra", 1), LH_ERR_OK);
  assert_int_equal(get_in_step(env, "extra", 2), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "request_id"));
  assert_int_equal(get_in_step(env, "extra", 3), LH_ERR_OK);
  assert_int_equal(get_in_step(env, "extra", 4), LH_ERR_OK);
  lh_env_free(env);
  /* the reply to index 1 written again once it has been read (the program waits for the file
   * LOG.go); index 2 is asked once the copy is surely there (the program logs "late" after
   * writing it): the copy is discarded and the program restarted */
  char log[64], go[80];
  snprintf(log, sizeof log, "/tmp/lh_test_env_late_%ld.log", (long)getpid());
  snprintf(go, sizeof go, "%s.go", log);
  remove(log);
  remove(go);
  setenv("EXEC_ENV_LOG", log, 1);
  env = make_exec("late", 10);
  assert_int_equal(get_in_step(env, "late", 0), LH_ERR_OK);
  assert_int_equal(get_in_step(env, "late", 1), LH_ERR_OK);
  FILE *g = fopen(go, "w");
  assert_non_null(g);
  fclose(g);
  bool written = false;
  for (int i = 0; i < 500 && !written; i++) {
    char text[256] = "";
    FILE *f = fopen(log, "r");
    if (f) {
      text[fread(text, 1, sizeof text - 1, f)] = '\0';
      fclose(f);
    }
    written = strstr(text, "late\n") != NULL;
    if (!written) usleep(10000);
  }
  unsetenv("EXEC_ENV_LOG");
  remove(log);
  remove(go);
  assert_true(written);
  assert_int_equal(get_in_step(env, "late", 2), LH_ERR_OK);
  assert_int_equal(get_in_step(env, "late", 3), LH_ERR_OK);
  lh_env_free(env);
  /* a reply and another line in one write, without request_id: the reply is refused */
  env = make_exec("extra-noid", 10);
  assert_int_equal(get_in_step(env, "extra-noid", 0), LH_ERR_OK);
  if (get_in_step(env, "extra-noid", 1)) assert_non_null(strstr(lh_last_error(), "more output"));
  assert_int_equal(get_in_step(env, "extra-noid", 2), LH_ERR_OK);
  assert_int_equal(get_in_step(env, "extra-noid", 3), LH_ERR_OK);
  lh_env_free(env);
}

static bool pid_alive(long pid) {
  char path[64], stat[256] = "";
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t n = fread(stat, 1, sizeof stat - 1, f);
  fclose(f);
  stat[n] = '\0';
  const char *paren = strrchr(stat, ')'); /* "PID (COMM) STATE ..." */
  return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

/* A program that starts a helper in its process group and then exits by itself: the helper is
 * killed with it, not left running after each restart. */
static void test_exec_exit_kills_group(void **state) {
  char pidfile[64], spec[512];
  snprintf(pidfile, sizeof pidfile, "/tmp/lh_test_env_helper_%ld.pid", (long)getpid());
  remove(pidfile);
  lh_env_config cfg;
  assert_int_equal(lh_env_config_parse("exec", &cfg), LH_ERR_OK);
  snprintf(spec, sizeof spec,
           "sh -c 'echo $$ > %s; exec sleep 30' </dev/null >/dev/null 2>&1 & "
           "while [ ! -s %s ]; do sleep 0.01; done; read line; exit 3",
           pidfile, pidfile);
  snprintf(cfg.path, sizeof cfg.path, "%s", spec);
  cfg.timeout_s = 10;
  lh_env *env = NULL;
  assert_int_equal(lh_env_create(&cfg, &env), LH_ERR_OK);
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &t), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "exited with status 3"));
  long helper = 0;
  for (int i = 0; i < 200 && helper <= 0; i++) { /* written before the program exits */
    FILE *f = fopen(pidfile, "r");
    if (f && fscanf(f, "%ld", &helper) != 1) helper = 0;
    if (f) fclose(f);
    if (helper <= 0) usleep(10000);
  }
  remove(pidfile);
  assert_true(helper > 0);
  bool alive = true;
  for (int i = 0; i < 200 && alive; i++) {
    alive = pid_alive(helper);
    if (alive) usleep(10000);
  }
  if (alive) kill((pid_t)helper, SIGKILL); /* the one process this test started */
  assert_false(alive);
  lh_env_free(env);
}

/* The pids a "spawn" program reports: the program, its parent (the shell that runs it), a child,
 * a child in a new session and a double-forked daemon whose parent is gone. */
typedef struct {
  long prog, parent, child, session, daemon;
} tree;

static tree parse_tree(const char *prompt) {
  tree t;
  if (sscanf(prompt, "pids %ld %ld %ld %ld %ld", &t.prog, &t.parent, &t.child, &t.session,
             &t.daemon) != 5)
    fail_msg("not a pids line: '%s'", prompt);
  return t;
}

static int tree_alive(const tree *t) {
  return pid_alive(t->prog) + pid_alive(t->child) + pid_alive(t->session) + pid_alive(t->daemon);
}

/* waits up to `seconds` for every process of t to be gone; kills what is left (processes this
 * test started) before failing */
static void assert_tree_gone(const tree *t, double seconds, const char *when) {
  double until = lh_time_now() + seconds;
  while (tree_alive(t) && lh_time_now() < until)
    usleep(10000);
  if (!tree_alive(t)) return;
  long left[4] = {t->prog, t->child, t->session, t->daemon};
  char names[128] = "";
  for (int i = 0; i < 4; i++)
    if (pid_alive(left[i])) {
      snprintf(names + strlen(names), sizeof names - strlen(names), " %ld", left[i]);
      kill((pid_t)left[i], SIGKILL);
    }
  fail_msg("%s: still running:%s", when, names);
}

static tree get_tree(lh_env *env, uint64_t index) {
  lh_env_task t;
  if (lh_env_task_get(env, LH_SPLIT_TRAIN, index, &t)) fail_msg("%s", lh_last_error());
  tree tr = parse_tree(t.prompt);
  lh_env_task_clear(&t);
  assert_int_equal(tree_alive(&tr), 4);
  return tr;
}

/* No process an exec program started outlives lh_env_free or a restart, also one that left the
 * program's process group (setsid) or whose parent exited (a daemon): the program runs under a
 * keeper, a subreaper that kills the whole tree. */
static void test_exec_no_descendant_survives(void **state) {
  lh_env *env = make_exec("spawn", 10);
  tree a = get_tree(env, 0);
  lh_env_free(env);
  assert_tree_gone(&a, 0, "after lh_env_free"); /* at once: lh_env_free waits for them */
  assert_false(pid_alive(a.parent));
  /* a restart: the program exits on index 2 (status 3, reported), its helpers go with it, and the
   * program started again for index 3 starts its own */
  env = make_exec("spawn", 10);
  a = get_tree(env, 0);
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 2, &t), LH_ERR_IO);
  assert_message("exited with status 3");
  assert_tree_gone(&a, 0, "after the program exited");
  tree b = get_tree(env, 3);
  assert_true(b.prog != a.prog);
  /* a restart the trainer decides on (no reply in time) */
  lh_env_free(env);
  assert_tree_gone(&b, 0, "after lh_env_free of a restarted program");
  env = make_exec("spawn-hang", 1);
  a = get_tree(env, 0);
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 1, &t), LH_ERR_IO);
  assert_message("no reply within 1 s");
  assert_tree_gone(&a, 0, "after a timeout");
  lh_env_free(env);
}

/* The trainer killed with SIGKILL: the keeper sees its lifeline close and kills the tree. */
static void test_exec_trainer_killed(void **state) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t trainer = fork();
  assert_true(trainer >= 0);
  if (trainer == 0) { /* the "trainer": starts the program, reports its tree, waits to be killed */
    close(p[0]);
    lh_env_config cfg;
    lh_env_config_parse("exec", &cfg);
    snprintf(cfg.path, sizeof cfg.path, "/usr/bin/python3 %sexec_env.py spawn", FIX);
    lh_env *env = NULL;
    lh_env_task t;
    if (lh_env_create(&cfg, &env) || lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &t)) _exit(1);
    if (write(p[1], t.prompt, strlen(t.prompt) + 1) < 0) _exit(1);
    for (;;)
      pause();
  }
  close(p[1]);
  char line[256] = "";
  size_t n = 0;
  ssize_t r;
  while (n < sizeof line - 1 && (r = read(p[0], line + n, sizeof line - 1 - n)) > 0)
    if (memchr(line + n, '\0', (size_t)r))
      break;
    else
      n += (size_t)r;
  close(p[0]);
  kill(trainer, SIGKILL);
  int st;
  waitpid(trainer, &st, 0);
  tree tr = parse_tree(line);
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  assert_tree_gone(&tr, 2, "2 s after the trainer was killed");
}

/* LONGHAUL_EXEC_NO_KEEPER=1: the program is the trainer's child, in its own process group; the
 * helpers that stay in the group go with it, one that left it (setsid) does not (the reason for
 * the keeper). */
static void test_exec_without_keeper(void **state) {
  setenv("LONGHAUL_EXEC_NO_KEEPER", "1", 1);
  lh_env *env = make_exec("spawn", 10);
  unsetenv("LONGHAUL_EXEC_NO_KEEPER");
  tree a = get_tree(env, 0);
  lh_env_free(env);
  double until = lh_time_now() + 2;
  while ((pid_alive(a.prog) || pid_alive(a.child)) && lh_time_now() < until)
    usleep(10000);
  bool left = pid_alive(a.prog) || pid_alive(a.child), escaped = pid_alive(a.session);
  kill((pid_t)a.session, SIGKILL); /* processes this test started */
  kill((pid_t)a.daemon, SIGKILL);
  assert_false(left);
  assert_true(escaped);
}

/* The program inherits stdin, stdout and stderr only, not descriptors the trainer opened without
 * close-on-exec (a run's metrics.jsonl). */
static void test_exec_closes_descriptors(void **state) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/lh_test_env_fd_%ld", (long)getpid());
  FILE *f = fopen(path, "w"); /* no "e": the descriptor survives exec unless closed */
  assert_non_null(f);
  lh_env *env = make_exec("fds", 10);
  lh_env_task t;
  assert_int_equal(lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &t), LH_ERR_OK);
  fclose(f);
  remove(path);
  if (strstr(t.prompt, path)) fail_msg("the program holds %s: %s", path, t.prompt);
  assert_non_null(strstr(t.prompt, "0:socket:")); /* the listing works */
  assert_non_null(strstr(t.prompt, "1:socket:"));
  lh_env_task_clear(&t);
  lh_env_free(env);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_builtin_determinism_and_splits),
      cmocka_unit_test(test_seed_changes_tasks),
      cmocka_unit_test(test_escape),
      cmocka_unit_test(test_config_errors),
      cmocka_unit_test(test_config_format),
      cmocka_unit_test(test_arith_scoring),
      cmocka_unit_test(test_sort_scoring),
      cmocka_unit_test(test_countdown_evaluator),
      cmocka_unit_test(test_countdown_scoring),
      cmocka_unit_test(test_levels),
      cmocka_unit_test(test_jsonl_gsm_numeric),
      cmocka_unit_test(test_jsonl_numeric_exact),
      cmocka_unit_test(test_jsonl_numeric_exponent),
      cmocka_unit_test(test_jsonl_numeric_point_and_commas),
      cmocka_unit_test(test_jsonl_exact_and_auto),
      cmocka_unit_test(test_jsonl_real_answers),
      cmocka_unit_test(test_jsonl_errors),
      cmocka_unit_test(test_jsonl_escapes),
      cmocka_unit_test(test_exec_happy_path),
      cmocka_unit_test(test_exec_failures),
      cmocka_unit_test(test_exec_correct_default),
      cmocka_unit_test(test_exec_escapes),
      cmocka_unit_test(test_exec_extra_output),
      cmocka_unit_test(test_exec_exit_kills_group),
      cmocka_unit_test(test_exec_closes_descriptors),
      cmocka_unit_test(test_exec_no_descendant_survives),
      cmocka_unit_test(test_exec_trainer_killed),
      cmocka_unit_test(test_exec_without_keeper),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
