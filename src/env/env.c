/* Environment front end: config parsing, per-split keys, the generic built-in task loop that keeps
 * train and test disjoint, and the two simplest environments, arith and sort. Everything here
 * is deterministic in (config, split, index). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
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

/* ---- front end ---- */

lh_err lh_env_config_parse(const char *spec, lh_env_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  const char *colon = strchr(spec, ':');
  size_t nl = colon ? (size_t)(colon - spec) : strlen(spec);
  if (nl == 0 || nl >= sizeof cfg->name)
    return lh_errorf(LH_ERR_INVAL, "env spec '%s': expected NAME or NAME:key=value,...", spec);
  memcpy(cfg->name, spec, nl);
  const char *p = colon ? colon + 1 : spec + nl;
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *eq = memchr(p, '=', len);
    if (!eq)
      return lh_errorf(LH_ERR_INVAL, "env spec '%s': expected key=value, found '%.*s'", spec,
                       (int)len, p);
    size_t kl = (size_t)(eq - p), vl = len - kl - 1;
    char key[32], val[LH_ENV_PATH_MAX];
    if (kl >= sizeof key || vl >= sizeof val)
      return lh_errorf(LH_ERR_LIMIT, "env spec '%s': key or value too long", spec);
    memcpy(key, p, kl);
    key[kl] = '\0';
    memcpy(val, eq + 1, vl);
    val[vl] = '\0';
    char *e = NULL;
    errno = 0;
    if (!strcmp(key, "seed")) {
      if (val[0] >= '0' && val[0] <= '9')
        cfg->seed = strtoull(val, &e, 10);
      else
        e = val; /* a sign: strtoull would take "-1" as 2^64 - 1 */
    } else if (!strcmp(key, "digits") || !strcmp(key, "count") || !strcmp(key, "max")) {
      long v = strtol(val, &e, 10);
      if (v < 0 || v > 1000000) errno = ERANGE;
      int *dst = key[0] == 'd' ? &cfg->digits : key[0] == 'c' ? &cfg->count : &cfg->max_number;
      *dst = (int)v;
    } else if (!strcmp(key, "test_fraction") || !strcmp(key, "timeout")) {
      double v = strtod(val, &e);
      *(key[0] == 't' && key[1] == 'e' ? &cfg->test_fraction : &cfg->timeout_s) = v;
    } else if (!strcmp(key, "ops")) {
      if (vl >= sizeof cfg->ops) return lh_errorf(LH_ERR_INVAL, "env spec: ops '%s' too long", val);
      strcpy(cfg->ops, val);
      e = val + vl;
    } else if (!strcmp(key, "path") || !strcmp(key, "test")) {
      strcpy(key[0] == 'p' ? cfg->path : cfg->test_path, val);
      e = val + vl;
    } else if (!strcmp(key, "match")) {
      if (!strcmp(val, "exact"))
        cfg->match = LH_ENV_MATCH_EXACT;
      else if (!strcmp(val, "numeric"))
        cfg->match = LH_ENV_MATCH_NUMERIC;
      else if (!strcmp(val, "auto"))
        cfg->match = LH_ENV_MATCH_AUTO;
      else
        return lh_errorf(LH_ERR_INVAL,
                         "env spec: match: expected exact, numeric or auto, found '%s'", val);
      e = val + vl;
    } else {
      return lh_errorf(LH_ERR_INVAL, "env spec '%s': unknown key '%s'", spec, key);
    }
    if (errno || e == val || *e)
      return lh_errorf(LH_ERR_INVAL, "env spec '%s': %s: bad value '%s'", spec, key, val);
    p += len;
    if (*p == ',') p++;
  }
  return LH_ERR_OK;
}

static lh_err check_builtin(lh_env_config *c) {
  bool ar = !strcmp(c->name, "arith"), so = !strcmp(c->name, "sort");
  if (c->digits == 0) c->digits = 2;
  if (c->digits < 1 || c->digits > (ar ? 9 : 18))
    return lh_errorf(LH_ERR_INVAL, "%s: digits: expected 1..%d, found %d", c->name, ar ? 9 : 18,
                     c->digits);
  if (ar) {
    if (!c->ops[0]) strcpy(c->ops, "+-");
    for (const char *o = c->ops; *o; o++)
      if (!strchr("+-*", *o))
        return lh_errorf(LH_ERR_INVAL, "arith: ops: expected characters of \"+-*\", found '%s'",
                         c->ops);
  }
  if (so) {
    if (c->count == 0) c->count = 5;
    if (c->count < 1 || c->count > 64)
      return lh_errorf(LH_ERR_INVAL, "sort: count: expected 1..64, found %d", c->count);
  }
  if (!strcmp(c->name, "countdown")) {
    if (c->count == 0) c->count = 4;
    if (c->max_number == 0) c->max_number = 10;
    if (c->count < 2 || c->count > LH_COUNTDOWN_MAX_NUMS)
      return lh_errorf(LH_ERR_INVAL, "countdown: count: expected 2..%d, found %d",
                       LH_COUNTDOWN_MAX_NUMS, c->count);
    if (c->max_number < 1 || c->max_number > 1000)
      return lh_errorf(LH_ERR_INVAL, "countdown: max: expected 1..1000, found %d", c->max_number);
  }
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
    e = lh_errorf(LH_ERR_NOTFOUND,
                  "env: unknown environment '%s' (expected arith, countdown, sort, jsonl, exec)",
                  c->name);
    goto fail;
  }
  if (env->ops == &arith_ops || env->ops == &sort_ops || env->ops == &lh__env_countdown_ops) {
    if ((e = check_builtin(c))) goto fail;
  }
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
