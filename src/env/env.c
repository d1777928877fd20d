/* Environment front end: config parsing, per-split keys, the generic built-in task loop that keeps
 * train and test disjoint, and the two simplest environments, arith and sort. Everything here
 * is deterministic in (config, split, index). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env_impl.h"

#define MAX_ATTEMPTS 4096

/* ---- hashing and draws ---- */

uint64_t lh__env_hash(const void *data, size_t len, uint64_t h) {
  const unsigned char *p = data;
  if (h == 0) h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t lh__env_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void lh__env_rng_init(lh__env_rng *r, uint64_t key, uint64_t stream, uint64_t attempt) {
  r->key = key;
  r->stream = stream;
  r->pos = attempt << 32;
  r->used = 4;
}

static uint32_t rng_u32(lh__env_rng *r) {
  if (r->used == 4) {
    lh_philox(r->key, r->stream, r->pos++, r->buf);
    r->used = 0;
  }
  return r->buf[r->used++];
}

int64_t lh__env_rng_range(lh__env_rng *r, int64_t lo, int64_t hi) {
  uint64_t span = (uint64_t)(hi - lo) + 1;
  uint64_t x = ((uint64_t)rng_u32(r) << 32) | rng_u32(r);
  return lo + (int64_t)(span ? x % span : x);
}

lh_split lh__env_instance_split(const char *name, const char *prompt) {
  uint64_t h = lh__env_hash(name, strlen(name) + 1, 0);
  h = lh__env_hash(prompt, strlen(prompt), h);
  return (lh__env_mix(h) & 7) == 0 ? LH_SPLIT_TEST : LH_SPLIT_TRAIN;
}

void lh__env_first_line(const char *text, size_t len, const char **start, size_t *n) {
  size_t e = 0;
  while (e < len && text[e] != '\n')
    e++;
  size_t b = 0;
  while (b < e && (text[b] == ' ' || text[b] == '\t' || text[b] == '\r'))
    b++;
  while (e > b && (text[e - 1] == ' ' || text[e - 1] == '\t' || text[e - 1] == '\r'))
    e--;
  *start = text + b;
  *n = e - b;
}

char *lh__env_strndup(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

void lh_env_task_clear(lh_env_task *task) {
  if (!task) return;
  free(task->prompt);
  free(task->answer);
  free(task->solution);
  memset(task, 0, sizeof *task);
}

lh_err lh__env_builtin_task(lh_env *env, lh_split split, uint64_t index, lh_env_task *task,
                            lh__env_gen_fn gen) {
  memset(task, 0, sizeof *task);
  for (uint64_t a = 0; a < MAX_ATTEMPTS; a++) {
    lh__env_rng r;
    lh__env_rng_init(&r, env->key[split], index, a);
    lh_err e = gen(env, &r, task);
    if (e) {
      lh_env_task_clear(task);
      return e;
    }
    if (lh__env_instance_split(env->cfg.name, task->prompt) == split) {
      task->split = split;
      task->index = index;
      return LH_ERR_OK;
    }
    lh_env_task_clear(task);
  }
  return lh_errorf(LH_ERR_LIMIT, "%s: no %s instance after %d draws (settings too narrow)",
                   env->cfg.name, split == LH_SPLIT_TEST ? "test" : "train", MAX_ATTEMPTS);
}

/* ---- arith ---- */

static int64_t pow10i(int d) {
  int64_t p = 1;
  while (d-- > 0)
    p *= 10;
  return p;
}

/* Carries of the column addition a + b, or borrows of the column subtraction a - b (a >= b),
 * of non-negative operands. */
static int column_carries(int64_t a, int64_t b, bool subtract) {
  int n = 0, carry = 0;
  for (; a > 0 || b > 0; a /= 10, b /= 10) {
    int x = (int)(a % 10), y = (int)(b % 10);
    carry = subtract ? x - y - carry < 0 : x + y + carry > 9;
    n += carry;
  }
  return n;
}

static int decimal_digits(int64_t v) {
  int d = 1;
  while (v >= 10)
    v /= 10, d++;
  return d;
}

/* The difficulty bucket of an arith instance (see lh_env_task.level). */
static void arith_level(char op, int64_t a, int64_t b, char *out, size_t cap) {
  if (op == '*') {
    int d = decimal_digits(a > b ? a : b);
    snprintf(out, cap, "* %d digit%s", d, d == 1 ? "" : "s");
  } else if (op == '+') {
    int c = column_carries(a, b, false);
    snprintf(out, cap, "+ %d carr%s", c, c == 1 ? "y" : "ies");
  } else {
    int c = a >= b ? column_carries(a, b, true) : column_carries(b, a, true);
    snprintf(out, cap, "- %d borrow%s", c, c == 1 ? "" : "s");
  }
}

static lh_err arith_gen(lh_env *env, lh__env_rng *r, lh_env_task *t) {
  const char *ops = env->cfg.ops;
  size_t nops = strlen(ops);
  char op = ops[lh__env_rng_range(r, 0, (int64_t)nops - 1)];
  int64_t hi = pow10i(env->cfg.digits) - 1,
          lo = env->cfg.digits > 1 ? pow10i(env->cfg.digits - 1) : 0;
  int64_t a = lh__env_rng_range(r, lo, hi), b = lh__env_rng_range(r, lo, hi);
  int64_t v = op == '+' ? a + b : op == '-' ? a - b : a * b;
  char p[64], ans[32];
  snprintf(p, sizeof p, "%" PRId64 "%c%" PRId64 "=", a, op, b);
  snprintf(ans, sizeof ans, "%" PRId64, v);
  t->prompt = lh_xstrdup(p);
  t->answer = lh_xstrdup(ans);
  t->solution = lh_xstrdup(ans);
  arith_level(op, a, b, t->level, sizeof t->level);
  return LH_ERR_OK;
}

static lh_err arith_task(lh_env *env, lh_split split, uint64_t index, lh_env_task *task) {
  return lh__env_builtin_task(env, split, index, task, arith_gen);
}

static bool is_integer(const char *s, size_t n) {
  size_t i = 0;
  if (i < n && s[i] == '-') i++;
  if (i == n) return false;
  for (; i < n; i++)
    if (!isdigit((unsigned char)s[i])) return false;
  return true;
}

static lh_err arith_score(lh_env *env, const lh_env_task *task, const char *text, size_t len,
                          lh_env_result *out) {
  const char *s;
  size_t n;
  lh__env_first_line(text, len, &s, &n);
  out->well_formed = is_integer(s, n);
  out->correct = n == strlen(task->answer) && memcmp(s, task->answer, n) == 0;
  out->reward = out->correct ? 1.0f : 0.0f;
  return LH_ERR_OK;
}

static uint64_t unbounded(const lh_env *env, lh_split split) {
  return 0;
}

static void no_free(lh_env *env) {}

static const lh__env_ops arith_ops = {arith_task, arith_score, unbounded, no_free};

/* ---- sort ---- */

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static lh_err sort_gen(lh_env *env, lh__env_rng *r, lh_env_task *t) {
  int n = env->cfg.count;
  int64_t v[64];
  int64_t hi = pow10i(env->cfg.digits) - 1;
  char p[64 * 24], ans[64 * 24];
  size_t pl = 0, al = 0;
  pl += (size_t)snprintf(p + pl, sizeof p - pl, "sort");
  for (int i = 0; i < n; i++) {
    v[i] = lh__env_rng_range(r, 0, hi);
    pl += (size_t)snprintf(p + pl, sizeof p - pl, " %" PRId64, v[i]);
  }
  snprintf(p + pl, sizeof p - pl, "=");
  int inv = 0;
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      inv += v[i] > v[j];
  snprintf(t->level, sizeof t->level, "inversions %s", inv <= 2 ? "0-2" : inv <= 5 ? "3-5" : "6+");
  qsort(v, (size_t)n, sizeof v[0], cmp_i64);
  for (int i = 0; i < n; i++)
    al += (size_t)snprintf(ans + al, sizeof ans - al, i ? " %" PRId64 : "%" PRId64, v[i]);
  t->prompt = lh_xstrdup(p);
  t->answer = lh_xstrdup(ans);
  t->solution = lh_xstrdup(ans);
  return LH_ERR_OK;
}

static lh_err sort_task(lh_env *env, lh_split split, uint64_t index, lh_env_task *task) {
  return lh__env_builtin_task(env, split, index, task, sort_gen);
}

static lh_err sort_score(lh_env *env, const lh_env_task *task, const char *text, size_t len,
                         lh_env_result *out) {
  const char *s;
  size_t n;
  lh__env_first_line(text, len, &s, &n);
  bool ok = n > 0;
  for (size_t i = 0; ok && i < n; i++) {
    if (s[i] == ' ')
      ok = i > 0 && s[i - 1] != ' ';
    else
      ok = isdigit((unsigned char)s[i]);
  }
  out->well_formed = ok;
  out->correct = n == strlen(task->answer) && memcmp(s, task->answer, n) == 0;
  out->reward = out->correct ? 1.0f : 0.0f;
  return LH_ERR_OK;
}

static const lh__env_ops sort_ops = {sort_task, sort_score, unbounded, no_free};

/* ---- specs: one table of every environment's keys drives parsing, defaults, range checks,
 * the spec an environment's settings are written back as, and the key lists of messages ---- */

typedef enum { KEY_U64, KEY_INT, KEY_REAL, KEY_OPS, KEY_TEXT, KEY_MATCH } key_kind;

typedef struct {
  lh_env_key pub; /* first: lh_env_key_at returns a pointer to it */
  key_kind kind;
  size_t off;       /* of the field in lh_env_config */
  double lo, hi;    /* KEY_INT: [lo, hi]; KEY_REAL: (lo, hi), or (lo, hi] with hi_closed */
  bool hi_closed;   /* KEY_REAL */
  double def;       /* KEY_INT, KEY_REAL: the value 0 stands for */
  const char *defs; /* KEY_OPS: the value "" stands for */
  bool required;    /* KEY_TEXT: "" is refused */
} env_key;

#define STR_(x)  #x
#define STR(x)   STR_(x)
#define F(field) offsetof(lh_env_config, field)
#define SEED_KEY                                                                                   \
  { {"seed", "0..18446744073709551615", "0"}, KEY_U64, F(seed), 0, 0, false, 0, NULL, false }

static const env_key arith_keys[] = {
    {{"digits", "1..9", "2"}, KEY_INT, F(digits), 1, 9, false, 2, NULL, false},
    {{"ops", "characters of +-*", "+-"}, KEY_OPS, F(ops), 0, 0, false, 0, "+-", false},
    SEED_KEY,
};
static const env_key sort_keys[] = {
    {{"count", "1..64", "5"}, KEY_INT, F(count), 1, 64, false, 5, NULL, false},
    {{"digits", "1..18", "2"}, KEY_INT, F(digits), 1, 18, false, 2, NULL, false},
    SEED_KEY,
};
static const env_key countdown_keys[] = {
    {{"count", "2.." STR(LH_COUNTDOWN_MAX_NUMS), "4"},
     KEY_INT,
     F(count),
     2,
     LH_COUNTDOWN_MAX_NUMS,
     false,
     4,
     NULL,
     false},
    {{"max", "1..1000", "10"}, KEY_INT, F(max_number), 1, 1000, false, 10, NULL, false},
    SEED_KEY,
};
static const env_key jsonl_keys[] = {
    {{"path", "a file", "required"}, KEY_TEXT, F(path), 0, 0, false, 0, NULL, true},
    {{"test", "a file of test tasks", "none: test_fraction of path's tasks"},
     KEY_TEXT,
     F(test_path),
     0,
     0,
     false,
     0,
     NULL,
     false},
    {{"match", "exact, numeric or auto", "auto"}, KEY_MATCH, F(match), 0, 0, false, 0, NULL, false},
    {{"test_fraction", "a number in (0, 1)", "0.1"},
     KEY_REAL,
     F(test_fraction),
     0,
     1,
     false,
     0.1,
     NULL,
     false},
};
static const env_key exec_keys[] = {
    {{"path", "a shell command", "required"}, KEY_TEXT, F(path), 0, 0, false, 0, NULL, true},
    {{"timeout", "seconds in (0, 3600]", "10"},
     KEY_REAL,
     F(timeout_s),
     0,
     3600,
     true,
     10,
     NULL,
     false},
};

typedef struct {
  const char *name;
  const env_key *keys;
  size_t n_keys;
  const char *about;
} env_def;

#define KEYS(k) k, sizeof k / sizeof k[0]
static const env_def env_defs[] = {
    {"arith", KEYS(arith_keys),
     "prompt \"A+B=\" (or -, * as ops allows) with operands of `digits` digits; the answer is "
     "the result, an integer; a completion scores 1 when its first line is exactly the answer"},
    {"countdown", KEYS(countdown_keys),
     "prompt \"N1 N2 ... ->T:\": `count` numbers from 1..max and a target T; the answer is T; "
     "a completion is an expression of the numbers (each at most once) with + - * / and "
     "parentheses on its first line, scoring 1 when it equals T exactly, 0.1 when it is valid "
     "but misses"},
    {"sort", KEYS(sort_keys),
     "prompt \"sort N1 N2 ...=\": `count` numbers of up to `digits` digits; the answer is them "
     "in ascending order, separated by single spaces; a completion scores 1 when its first "
     "line is exactly the answer"},
    {"jsonl", KEYS(jsonl_keys),
     "prompts and answers from the file's lines {\"prompt\": string, \"answer\": string or "
     "number}; a completion scores 1 when it matches the answer (match=exact: the whole text, "
     "trimmed; numeric: its last number; auto: numeric for a one-number answer, else exact)"},
    {"exec", KEYS(exec_keys),
     "prompts, answers and scores from the program, one JSON line per request (the exec "
     "protocol in include/longhaul/env.h)"},
};

static const env_def *find_env(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof env_defs / sizeof env_defs[0]; i++)
    if (strlen(env_defs[i].name) == len && !memcmp(env_defs[i].name, name, len))
      return &env_defs[i];
  return NULL;
}

const lh_env_key *lh_env_key_at(const char *name, size_t i) {
  const env_def *d = name ? find_env(name, strlen(name)) : NULL;
  return d && i < d->n_keys ? &d->keys[i].pub : NULL;
}

const char *lh_env_about(const char *name) {
  const env_def *d = name ? find_env(name, strlen(name)) : NULL;
  return d ? d->about : NULL;
}

/* "digits (1..9, default 2), ops (...), seed (...)" */
static const char *keys_text(const env_def *d, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < d->n_keys && used < cap; i++) {
    const lh_env_key *k = &d->keys[i].pub;
    bool req = !strcmp(k->def, "required");
    used += (size_t)snprintf(buf + used, cap - used, "%s%s (%s, %s%s)", i ? ", " : "", k->key,
                             k->range, req ? "" : "default ", k->def);
  }
  return buf;
}

/* A spec error: "NAME: MESSAGE; valid keys: ..." */
static lh_err spec_error(const env_def *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static lh_err spec_error(const env_def *d, const char *fmt, ...) {
  char msg[512], keys[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return lh_errorf(LH_ERR_USAGE, "%s: %s; valid keys: %s", d->name, msg,
                   keys_text(d, keys, sizeof keys));
}

/* An unsigned decimal integer, digits only (strtoull alone would take spaces, '+' and "-1" as
 * 2^64 - 1). */
static bool read_u64(const char *v, size_t n, uint64_t *out) {
  if (n == 0 || n > 20) return false;
  uint64_t x = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '9') return false;
    if (x > (UINT64_MAX - (uint64_t)(v[i] - '0')) / 10) return false;
    x = x * 10 + (uint64_t)(v[i] - '0');
  }
  *out = x;
  return true;
}

/* A decimal number as strtod reads it, without spaces, hex, inf or nan. */
static bool read_real(const char *v, size_t n, double *out) {
  char tmp[64];
  if (n == 0 || n >= sizeof tmp || strspn(v, "0123456789.eE+-") < n) return false;
  memcpy(tmp, v, n);
  tmp[n] = '\0';
  char *e = NULL;
  errno = 0;
  double x = strtod(tmp, &e);
  if (e != tmp + n || (errno == ERANGE && x != 0) || !isfinite(x)) return false;
  *out = x;
  return true;
}

static bool real_in_range(const env_key *k, double v) {
  return v > k->lo && (k->hi_closed ? v <= k->hi : v < k->hi);
}

static bool ops_valid(const char *o) {
  return o[0] && strspn(o, "+-*") == strlen(o);
}

/* Stores value v[0, n) of key k into cfg; false when it is not one of the key's values. */
static bool set_value(const env_key *k, const char *v, size_t n, lh_env_config *cfg) {
  char *field = (char *)cfg + k->off;
  uint64_t u;
  double x;
  switch (k->kind) {
  case KEY_U64:
    if (!read_u64(v, n, &u)) return false;
    memcpy(field, &u, sizeof u);
    return true;
  case KEY_INT:
    if (!read_u64(v, n, &u) || (double)u < k->lo || (double)u > k->hi) return false;
    *(int *)(void *)field = (int)u;
    return true;
  case KEY_REAL:
    if (!read_real(v, n, &x) || !real_in_range(k, x)) return false;
    memcpy(field, &x, sizeof x);
    return true;
  case KEY_OPS:
    if (n >= sizeof cfg->ops || strspn(v, "+-*") < n) return false;
    memcpy(field, v, n);
    field[n] = '\0';
    return true;
  case KEY_TEXT: /* both text fields hold LH_ENV_PATH_MAX bytes */
    if (n >= LH_ENV_PATH_MAX || memchr(v, '\0', n)) return false;
    memcpy(field, v, n);
    field[n] = '\0';
    return true;
  case KEY_MATCH: {
    static const char *const names[] = {"auto", "exact", "numeric"};
    static const lh_env_match kinds[] = {LH_ENV_MATCH_AUTO, LH_ENV_MATCH_EXACT,
                                         LH_ENV_MATCH_NUMERIC};
    for (int i = 0; i < 3; i++)
      if (strlen(names[i]) == n && !memcmp(v, names[i], n)) {
        *(lh_env_match *)(void *)field = kinds[i];
        return true;
      }
    return false;
  }
  }
  return false;
}

#define ESC_CAP   96
#define ESC(s, n) lh_escape((s), (n), (char[ESC_CAP]){0}, ESC_CAP)

lh_err lh_env_config_parse(const char *spec, lh_env_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  size_t sl = strlen(spec);
  const char *colon = memchr(spec, ':', sl);
  size_t nl = colon ? (size_t)(colon - spec) : sl;
  if (nl == 0)
    return lh_errorf(LH_ERR_USAGE,
                     "env spec '%s': expected NAME or NAME:key=value,... (NAME: arith, countdown, "
                     "sort, jsonl or exec)",
                     ESC(spec, sl));
  const env_def *d = find_env(spec, nl);
  if (!d)
    return lh_errorf(LH_ERR_USAGE,
                     "unknown environment '%s' (expected arith, countdown, sort, jsonl or exec)",
                     ESC(spec, nl));
  memcpy(cfg->name, spec, nl);
  bool seen[8] = {false};
  for (const char *p = colon ? colon + 1 : spec + nl; *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    const char *eq = memchr(p, '=', len);
    if (!eq) return spec_error(d, "expected key=value, found '%s'", ESC(p, len));
    size_t kl = (size_t)(eq - p), vl = len - kl - 1;
    const char *v = eq + 1;
    size_t ki = 0;
    while (ki < d->n_keys &&
           !(strlen(d->keys[ki].pub.key) == kl && !memcmp(d->keys[ki].pub.key, p, kl)))
      ki++;
    if (ki == d->n_keys) return spec_error(d, "unknown key '%s'", ESC(p, kl));
    const env_key *k = &d->keys[ki];
    if (seen[ki]) return spec_error(d, "key '%s' given twice", k->pub.key);
    seen[ki] = true;
    if (vl == 0) return spec_error(d, "%s: expected %s, found nothing", k->pub.key, k->pub.range);
    if (k->kind == KEY_TEXT && vl >= LH_ENV_PATH_MAX)
      return spec_error(d, "%s: expected at most %d bytes, found %zu", k->pub.key,
                        LH_ENV_PATH_MAX - 1, vl);
    if (!set_value(k, v, vl, cfg))
      return spec_error(d, "%s: expected %s, found '%s'", k->pub.key, k->pub.range, ESC(v, vl));
    p += len;
    if (*p == ',') p++;
  }
  return LH_ERR_OK;
}

/* Fills in the defaults of cfg's environment (zero: the default) and checks every setting, as a
 * spec's are checked, for configs built in code. */
static lh_err settle(const env_def *d, lh_env_config *c) {
  for (size_t i = 0; i < d->n_keys; i++) {
    const env_key *k = &d->keys[i];
    char *field = (char *)c + k->off;
    if (k->kind == KEY_INT) {
      int *v = (int *)(void *)field;
      if (*v == 0) *v = (int)k->def;
      if (*v < k->lo || *v > k->hi)
        return spec_error(d, "%s: expected %s, found %d", k->pub.key, k->pub.range, *v);
    } else if (k->kind == KEY_REAL) {
      double *v = (double *)(void *)field;
      if (*v == 0) *v = k->def;
      if (!real_in_range(k, *v))
        return spec_error(d, "%s: expected %s, found %g", k->pub.key, k->pub.range, *v);
    } else if (k->kind == KEY_OPS) {
      field[sizeof c->ops - 1] = '\0';
      if (!field[0]) strcpy(field, k->defs);
      if (!ops_valid(field))
        return spec_error(d, "%s: expected %s, found '%s'", k->pub.key, k->pub.range,
                          ESC(field, strlen(field)));
    } else if (k->kind == KEY_TEXT) {
      field[LH_ENV_PATH_MAX - 1] = '\0';
      if (k->required && !field[0]) return spec_error(d, "missing key %s", k->pub.key);
    } else if (k->kind == KEY_MATCH) {
      lh_env_match m = *(lh_env_match *)(void *)field;
      if (m != LH_ENV_MATCH_AUTO && m != LH_ENV_MATCH_EXACT && m != LH_ENV_MATCH_NUMERIC)
        return spec_error(d, "%s: expected %s, found %d", k->pub.key, k->pub.range, (int)m);
    }
  }
  /* countdown has no digits key, but its task keys have always hashed the digits default in
   * (its tasks must not change) */
  if (!strcmp(d->name, "countdown") && c->digits == 0) c->digits = 2;
  return LH_ERR_OK;
}

/* The shortest of %.15g, %.16g and %.17g that reads back as v. */
static void real_text(double v, char *buf, size_t cap) {
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(buf, cap, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
}

static void value_text(const env_key *k, const lh_env_config *cfg, char *buf, size_t cap) {
  const char *field = (const char *)cfg + k->off;
  uint64_t u;
  double x;
  switch (k->kind) {
  case KEY_U64:
    memcpy(&u, field, sizeof u);
    snprintf(buf, cap, "%" PRIu64, u);
    break;
  case KEY_INT:
    snprintf(buf, cap, "%d", *(const int *)(const void *)field);
    break;
  case KEY_REAL:
    memcpy(&x, field, sizeof x);
    real_text(x, buf, cap);
    break;
  case KEY_OPS:
  case KEY_TEXT:
    snprintf(buf, cap, "%s", field);
    break;
  case KEY_MATCH: {
    lh_env_match m = *(const lh_env_match *)(const void *)field;
    snprintf(buf, cap, "%s",
             m == LH_ENV_MATCH_EXACT     ? "exact"
             : m == LH_ENV_MATCH_NUMERIC ? "numeric"
                                         : "auto");
    break;
  }
  }
}

lh_err lh_env_config_value(const lh_env_config *cfg, const char *key, char *buf, size_t cap) {
  const env_def *d = find_env(cfg->name, strnlen(cfg->name, sizeof cfg->name));
  for (size_t i = 0; d && i < d->n_keys; i++)
    if (!strcmp(d->keys[i].pub.key, key)) {
      char v[LH_ENV_PATH_MAX];
      value_text(&d->keys[i], cfg, v, sizeof v);
      if (strlen(v) >= cap)
        return lh_errorf(LH_ERR_LIMIT, "%s: %s: the value needs %zu bytes, %zu given", d->name, key,
                         strlen(v) + 1, cap);
      memcpy(buf, v, strlen(v) + 1);
      return LH_ERR_OK;
    }
  size_t nl = strnlen(cfg->name, sizeof cfg->name);
  return lh_errorf(LH_ERR_NOTFOUND, "%s: no key '%s'", ESC(cfg->name, nl), ESC(key, strlen(key)));
}

/* A key's value with the default filled in for 0 and "". */
static void value_or_default(const env_key *k, const lh_env_config *cfg, char *buf, size_t cap) {
  value_text(k, cfg, buf, cap);
  if ((k->kind == KEY_INT || k->kind == KEY_REAL) && !strcmp(buf, "0"))
    real_text(k->def, buf, cap);
  else if (k->kind == KEY_OPS && !buf[0] && k->defs)
    snprintf(buf, cap, "%s", k->defs);
}

bool lh_env_spec_same(const char *a, const char *b) {
  lh_env_config ca, cb;
  if (lh_env_config_parse(a, &ca) || lh_env_config_parse(b, &cb) || strcmp(ca.name, cb.name))
    return false;
  const env_def *d = find_env(ca.name, strnlen(ca.name, sizeof ca.name));
  if (!d) return false;
  for (size_t i = 0; i < d->n_keys; i++) {
    const env_key *k = &d->keys[i];
    char va[LH_ENV_PATH_MAX], vb[LH_ENV_PATH_MAX];
    value_or_default(k, &ca, va, sizeof va);
    value_or_default(k, &cb, vb, sizeof vb);
    bool file = k->kind == KEY_TEXT && strcmp(ca.name, "exec"); /* exec's is a command */
    if (strcmp(va, vb) && !(file && va[0] && vb[0] && lh_path_same(va, vb))) return false;
  }
  return true;
}

lh_err lh_env_config_format(const lh_env_config *cfg, char *buf, size_t cap) {
  size_t nl = strnlen(cfg->name, sizeof cfg->name);
  const env_def *d = find_env(cfg->name, nl);
  if (!d) return lh_errorf(LH_ERR_USAGE, "unknown environment '%s'", ESC(cfg->name, nl));
  size_t used = 0;
  bool first = true;
  int w = snprintf(buf, cap, "%s", d->name);
  used = (size_t)w;
  for (size_t i = 0; i < d->n_keys && used < cap; i++) {
    const env_key *k = &d->keys[i];
    char v[LH_ENV_PATH_MAX];
    value_text(k, cfg, v, sizeof v);
    if (!strcmp(v, "0") && (k->kind == KEY_INT || k->kind == KEY_REAL)) continue; /* unset */
    if (!v[0]) continue; /* text or ops not given */
    if (strchr(v, ','))
      return lh_errorf(LH_ERR_UNSUPPORTED, "%s: %s: '%s' holds a ',', which a spec cannot", d->name,
                       k->pub.key, ESC(v, strlen(v)));
    w = snprintf(buf + used, cap - used, "%s%s=%s", first ? ":" : ",", k->pub.key, v);
    used += (size_t)w;
    first = false;
  }
  if (used >= cap)
    return lh_errorf(LH_ERR_LIMIT, "%s: the spec needs more than %zu bytes", d->name, cap);
  return LH_ERR_OK;
}

lh_err lh_env_create(const lh_env_config *cfg, lh_env **out) {
  *out = NULL;
  lh_env *env = lh_xcalloc(1, sizeof *env);
  env->cfg = *cfg;
  env->cfg.name[sizeof env->cfg.name - 1] = '\0';
  lh_env_config *c = &env->cfg;
  lh_err e = LH_ERR_OK;
  if (!strcmp(c->name, "arith"))
    env->ops = &arith_ops;
  else if (!strcmp(c->name, "sort"))
    env->ops = &sort_ops;
  else if (!strcmp(c->name, "countdown"))
    env->ops = &lh__env_countdown_ops;
  else if (!strcmp(c->name, "jsonl"))
    env->ops = &lh__env_jsonl_ops;
  else if (!strcmp(c->name, "exec"))
    env->ops = &lh__env_exec_ops;
  else {
    e = lh_errorf(LH_ERR_USAGE,
                  "unknown environment '%s' (expected arith, countdown, sort, jsonl or exec)",
                  ESC(c->name, strlen(c->name)));
    goto fail;
  }
  if ((e = settle(find_env(c->name, strlen(c->name)), c))) goto fail;
  /* keys: a hash of the settings that shape tasks, then of the split */
  char canon[2 * LH_ENV_PATH_MAX + 128];
  int cl = snprintf(canon, sizeof canon, "%s|%" PRIu64 "|%d|%s|%d|%d|%s|%s|%d|%.9g", c->name,
                    c->seed, c->digits, c->ops, c->count, c->max_number, c->path, c->test_path,
                    (int)c->match, c->test_fraction);
  uint64_t h = lh__env_hash(canon, (size_t)cl < sizeof canon ? (size_t)cl : sizeof canon - 1, 0);
  env->key[0] = lh__env_mix(h ^ 0x7472616eull);
  env->key[1] = lh__env_mix(h ^ 0x74657374ull);
  if (env->ops == &lh__env_jsonl_ops && (e = lh__env_jsonl_init(env))) goto fail;
  if (env->ops == &lh__env_exec_ops && (e = lh__env_exec_init(env))) goto fail;
  *out = env;
  return LH_ERR_OK;
fail:
  free(env);
  return e;
}

void lh_env_free(lh_env *env) {
  if (!env) return;
  env->ops->free(env);
  free(env);
}

const lh_env_config *lh_env_config_of(const lh_env *env) {
  return &env->cfg;
}

uint64_t lh_env_size(const lh_env *env, lh_split split) {
  return env->ops->size(env, split);
}

lh_err lh_env_task_get(lh_env *env, lh_split split, uint64_t index, lh_env_task *task) {
  memset(task, 0, sizeof *task);
  if (split != LH_SPLIT_TRAIN && split != LH_SPLIT_TEST)
    return lh_errorf(LH_ERR_INVAL, "%s: split: expected train or test, found %d", env->cfg.name,
                     (int)split);
  return env->ops->task(env, split, index, task);
}

lh_err lh_env_score(lh_env *env, const lh_env_task *task, const char *completion, size_t len,
                    lh_env_result *out) {
  memset(out, 0, sizeof *out);
  return env->ops->score(env, task, completion, len, out);
}
