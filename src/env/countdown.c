/* countdown: reach a target from given numbers with + - * / and parentheses, each number at most
 * once. Instances are generated from a random expression (so a solution exists); completions are
 * parsed by a bounded recursive-descent parser and evaluated exactly with int64 rationals. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env_impl.h"

/* ---- exact rationals: den > 0, lowest terms; every step checks for int64 overflow ---- */

typedef struct {
  int64_t n, d;
} rat;

static int64_t gcd64(int64_t a, int64_t b) {
  uint64_t x = a < 0 ? -(uint64_t)a : (uint64_t)a, y = b < 0 ? -(uint64_t)b : (uint64_t)b;
  while (y) {
    uint64_t t = x % y;
    x = y;
    y = t;
  }
  return (int64_t)(x > (uint64_t)INT64_MAX ? 1 : x);
}

static lh_err rat_norm(rat *r) {
  if (r->d < 0) {
    if (r->n == INT64_MIN || r->d == INT64_MIN) return LH_ERR_LIMIT;
    r->n = -r->n;
    r->d = -r->d;
  }
  int64_t g = gcd64(r->n, r->d);
  if (g > 1) {
    r->n /= g;
    r->d /= g;
  }
  if (r->n == 0) r->d = 1;
  return LH_ERR_OK;
}

/* op in "+-*\/"; LH_ERR_LIMIT on overflow, LH_ERR_INVAL on division by zero */
static lh_err rat_apply(rat a, char op, rat b, rat *out) {
  rat r;
  if (op == '+' || op == '-') {
    if (op == '-') {
      if (b.n == INT64_MIN) return LH_ERR_LIMIT;
      b.n = -b.n;
    }
    int64_t g = gcd64(a.d, b.d), x, y;
    if (__builtin_mul_overflow(a.n, b.d / g, &x) || __builtin_mul_overflow(b.n, a.d / g, &y) ||
        __builtin_add_overflow(x, y, &r.n) || __builtin_mul_overflow(a.d / g, b.d, &r.d))
      return LH_ERR_LIMIT;
  } else {
    if (op == '/') {
      if (b.n == 0) return LH_ERR_INVAL;
      int64_t t = b.n;
      b.n = b.d;
      b.d = t;
      if (b.d < 0) {
        if (b.d == INT64_MIN) return LH_ERR_LIMIT;
        b.n = -b.n;
        b.d = -b.d;
      }
    }
    int64_t g1 = gcd64(a.n, b.d), g2 = gcd64(b.n, a.d);
    if (g1 == 0) g1 = 1;
    if (g2 == 0) g2 = 1;
    if (__builtin_mul_overflow(a.n / g1, b.n / g2, &r.n) ||
        __builtin_mul_overflow(a.d / g2, b.d / g1, &r.d))
      return LH_ERR_LIMIT;
  }
  if (rat_norm(&r)) return LH_ERR_LIMIT;
  *out = r;
  return LH_ERR_OK;
}

/* ---- parser ---- */

typedef struct {
  const char *s;
  size_t n, i;
  int depth;
  const int64_t *nums;
  int n_nums;
  bool used[LH_COUNTDOWN_MAX_NUMS];
} parser;

static void skip_ws(parser *p) {
  while (p->i < p->n && p->s[p->i] == ' ')
    p->i++;
}

static lh_err found_err(parser *p, const char *expected) {
  if (p->i >= p->n)
    return lh_errorf(LH_ERR_FORMAT, "countdown: offset %zu: expected %s, found end of expression",
                     p->i, expected);
  unsigned char c = (unsigned char)p->s[p->i];
  if (c >= 32 && c < 127)
    return lh_errorf(LH_ERR_FORMAT, "countdown: offset %zu: expected %s, found '%c'", p->i,
                     expected, c);
  return lh_errorf(LH_ERR_FORMAT, "countdown: offset %zu: expected %s, found byte 0x%02x", p->i,
                   expected, c);
}

static lh_err arith_err(lh_err e, size_t off, char op) {
  if (e == LH_ERR_INVAL)
    return lh_errorf(LH_ERR_INVAL, "countdown: offset %zu: division by zero", off);
  return lh_errorf(LH_ERR_LIMIT, "countdown: offset %zu: '%c' overflows int64", off, op);
}

static lh_err parse_expr(parser *p, rat *out);

static lh_err parse_factor(parser *p, rat *out) {
  skip_ws(p);
  if (p->i < p->n && p->s[p->i] == '(') {
    if (++p->depth > LH_COUNTDOWN_MAX_DEPTH)
      return lh_errorf(LH_ERR_LIMIT, "countdown: offset %zu: parentheses nested deeper than %d",
                       p->i, LH_COUNTDOWN_MAX_DEPTH);
    p->i++;
    lh_err e = parse_expr(p, out);
    if (e) return e;
    skip_ws(p);
    if (p->i >= p->n || p->s[p->i] != ')') return found_err(p, "')'");
    p->i++;
    p->depth--;
    return LH_ERR_OK;
  }
  if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return found_err(p, "a number or '('");
  size_t start = p->i;
  int64_t v = 0;
  while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
    v = v * 10 + (p->s[p->i++] - '0'); /* v <= 10^9 before this step: no overflow */
    if (v > LH_COUNTDOWN_MAX_LITERAL)
      return lh_errorf(LH_ERR_LIMIT, "countdown: offset %zu: number larger than 10^9", start);
  }
  if (p->i - start > 1 && p->s[start] == '0')
    return lh_errorf(LH_ERR_FORMAT, "countdown: offset %zu: number with a leading zero", start);
  if (p->nums) {
    int k = -1;
    bool seen = false;
    for (int j = 0; j < p->n_nums && k < 0; j++) {
      if (p->nums[j] != v) continue;
      seen = true;
      if (!p->used[j]) k = j;
    }
    if (k < 0)
      return lh_errorf(LH_ERR_MISMATCH, "countdown: offset %zu: %s %" PRId64, start,
                       seen ? "number used more often than given:" : "number not given:", v);
    p->used[k] = true;
  }
  out->n = v;
  out->d = 1;
  return LH_ERR_OK;
}

static lh_err parse_term(parser *p, rat *out) {
  lh_err e = parse_factor(p, out);
  for (;;) {
    if (e) return e;
    skip_ws(p);
    if (p->i >= p->n || (p->s[p->i] != '*' && p->s[p->i] != '/')) return LH_ERR_OK;
    char op = p->s[p->i];
    size_t off = p->i++;
    rat r;
    if ((e = parse_factor(p, &r))) return e;
    if ((e = rat_apply(*out, op, r, out))) return arith_err(e, off, op);
  }
}

static lh_err parse_expr(parser *p, rat *out) {
  lh_err e = parse_term(p, out);
  for (;;) {
    if (e) return e;
    skip_ws(p);
    if (p->i >= p->n || (p->s[p->i] != '+' && p->s[p->i] != '-')) return LH_ERR_OK;
    char op = p->s[p->i];
    size_t off = p->i++;
    rat r;
    if ((e = parse_term(p, &r))) return e;
    if ((e = rat_apply(*out, op, r, out))) return arith_err(e, off, op);
  }
}

lh_err lh_countdown_eval(const char *expr, size_t len, const int64_t *nums, int n, int64_t *num,
                         int64_t *den) {
  if (len > LH_COUNTDOWN_MAX_LEN)
    return lh_errorf(LH_ERR_LIMIT, "countdown: expression of %zu bytes, at most %d allowed", len,
                     LH_COUNTDOWN_MAX_LEN);
  if (nums && (n < 0 || n > LH_COUNTDOWN_MAX_NUMS))
    return lh_errorf(LH_ERR_INVAL, "countdown: %d numbers, at most %d", n, LH_COUNTDOWN_MAX_NUMS);
  parser p = {.s = expr, .n = len, .nums = nums, .n_nums = n};
  rat r;
  lh_err e = parse_expr(&p, &r);
  if (e) return e;
  skip_ws(&p);
  if (p.i < p.n) return found_err(&p, "an operator or the end");
  *num = r.n;
  *den = r.d;
  return LH_ERR_OK;
}

/* ---- generation: combine random pairs of items until one expression remains ---- */

typedef struct {
  rat v;
  int prec; /* 3 atom, 2 product, 1 sum */
  char s[LH_COUNTDOWN_MAX_LEN];
} item;

static bool combine(const item *a, char op, const item *b, item *out) {
  int p = (op == '+' || op == '-') ? 1 : 2;
  bool pa = a->prec < p, pb = b->prec < p || (b->prec == p && (op == '-' || op == '/'));
  int w = snprintf(out->s, sizeof out->s, "%s%s%s%c%s%s%s", pa ? "(" : "", a->s, pa ? ")" : "", op,
                   pb ? "(" : "", b->s, pb ? ")" : "");
  if (w < 0 || (size_t)w >= sizeof out->s) return false;
  if (rat_apply(a->v, op, b->v, &out->v)) return false;
  if (out->v.d != 1 || out->v.n < 0) return false; /* integer, non-negative steps */
  out->prec = p;
  return true;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Combines a and b with one of the four operators, either way round, tried from a random
 * start: the first result in 0..999 if there is one, else the first valid one. Used once 1000
 * free draws have missed 1..999 (many large numbers), it keeps the values small. */
static bool combine_small(lh__env_rng *r, const item *a, const item *b, item *out) {
  int start = (int)lh__env_rng_range(r, 0, 7);
  bool any = false;
  for (int k = 0; k < 8; k++) {
    int c = (start + k) % 8;
    item t;
    if (!combine(c < 4 ? a : b, "+-*/"[c % 4], c < 4 ? b : a, &t)) continue;
    if (!any || t.v.n <= 999) *out = t;
    any = true;
    if (t.v.n <= 999) return true;
  }
  return any;
}

static lh_err countdown_gen(lh_env *env, lh__env_rng *r, lh_env_task *t) {
  int n = env->cfg.count;
  for (int tries = 0; tries < 2000; tries++) {
    item it[LH_COUNTDOWN_MAX_NUMS] = {0}; /* (gcc 12 cannot see that count >= 2 fills it[0]) */
    int64_t nums[LH_COUNTDOWN_MAX_NUMS];
    for (int i = 0; i < n; i++) {
      nums[i] = lh__env_rng_range(r, 1, env->cfg.max_number);
      it[i].v = (rat){nums[i], 1};
      it[i].prec = 3;
      snprintf(it[i].s, sizeof it[i].s, "%" PRId64, nums[i]);
    }
    int m = n;
    bool ok = true;
    while (ok && m > 1) {
      int i = (int)lh__env_rng_range(r, 0, m - 1);
      int j = (int)lh__env_rng_range(r, 0, m - 2);
      if (j >= i) j++;
      item c;
      if (tries < 1000) /* free draws: what every task that these find has always been */
        ok = combine(&it[i], "+-*/"[lh__env_rng_range(r, 0, 3)], &it[j], &c);
      else
        ok = combine_small(r, &it[i], &it[j], &c);
      it[i < j ? i : j] = c;
      it[i < j ? j : i] = it[m - 1];
      m--;
    }
    if (!ok || it[0].v.n < 1 || it[0].v.n > 999) continue;
    /* a target among the numbers is solved by writing it down (12% of draws at the defaults) */
    int64_t target = it[0].v.n;
    bool given = false;
    for (int i = 0; i < n; i++)
      given |= nums[i] == target;
    if (given) continue;
    qsort(nums, (size_t)n, sizeof nums[0], cmp_i64);
    char p[LH_COUNTDOWN_MAX_NUMS * 8 + 16];
    size_t pl = 0;
    for (int i = 0; i < n; i++)
      pl += (size_t)snprintf(p + pl, sizeof p - pl, i ? " %" PRId64 : "%" PRId64, nums[i]);
    snprintf(p + pl, sizeof p - pl, "->%" PRId64 ":", it[0].v.n);
    char ans[24];
    snprintf(ans, sizeof ans, "%" PRId64, it[0].v.n);
    t->prompt = lh_xstrdup(p);
    t->answer = lh_xstrdup(ans);
    t->solution = lh_xstrdup(it[0].s);
    t->n_nums = n;
    memcpy(t->nums, nums, sizeof nums[0] * (size_t)n);
    t->target = it[0].v.n;
    unsigned char used = 0, muldiv = 0; /* at most 8 and 7: the label fits */
    for (const char *c = it[0].s; *c; c++) {
      used += *c >= '0' && *c <= '9' && (c == it[0].s || c[-1] < '0' || c[-1] > '9');
      muldiv += *c == '*' || *c == '/';
    }
    snprintf(t->level, sizeof t->level, "uses %d, %d mul/div", used, muldiv);
    return LH_ERR_OK;
  }
  return lh_errorf(LH_ERR_LIMIT, "countdown: no instance with a target in 1..999 after 2000 draws");
}

static lh_err countdown_task(lh_env *env, lh_split split, uint64_t index, lh_env_task *task) {
  return lh__env_builtin_task(env, split, index, task, countdown_gen);
}

static lh_err countdown_score(lh_env *env, const lh_env_task *task, const char *text, size_t len,
                              lh_env_result *out) {
  const char *s;
  size_t n;
  lh__env_first_line(text, len, &s, &n);
  int64_t num = 0, den = 0;
  lh_err e = lh_countdown_eval(s, n, task->nums, task->n_nums, &num, &den);
  out->well_formed = e == LH_ERR_OK;
  out->correct = e == LH_ERR_OK && den == 1 && num == task->target;
  out->reward = out->correct ? 1.0f : out->well_formed ? 0.1f : 0.0f;
  return LH_ERR_OK;
}

static uint64_t countdown_size(const lh_env *env, lh_split split) {
  return 0;
}

static void countdown_free(lh_env *env) {}

const lh__env_ops lh__env_countdown_ops = {countdown_task, countdown_score, countdown_size,
                                           countdown_free};
