/* jsonl: tasks from a user's file of {"prompt": ..., "answer": ...} lines, scored by exact or
 * numeric match (numeric: the last number in the completion against the last number in the
 * answer, as exact decimals, so GSM8K files work as they are). A UTF-8 byte-order mark at the start
 * is skipped. Malformed lines are refused as "FILE:LINE: ...". */
#include <ctype.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env_impl.h"

typedef struct {
  char *prompt, *answer;
} jl_item;

typedef struct {
  jl_item *items[2];
  size_t n[2], cap[2];
} jl;

/* A real answer as text: the shortest of %.15g, %.16g and %.17g that reads back as the same
 * double, so 0.1 is "0.1" (not "0.10000000000000001") and every double still round-trips. */
/* s[0, *n) without the whitespace at both ends: *s and *n move inward. */
static void trim(const char **s, size_t *n) {
  while (*n && isspace((unsigned char)**s))
    ++*s, --*n;
  while (*n && isspace((unsigned char)(*s)[*n - 1]))
    --*n;
}

static size_t real_text(double v, char *buf, size_t cap) {
  int n = 0;
  for (int prec = 15; prec <= 17; prec++) {
    n = snprintf(buf, cap, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  return (size_t)n;
}

/* The line failed with "too big integer": names the field that holds it, found by parsing
 * again with integers read as reals. `file` is escaped already. */
static lh_err big_integer_err(const char *line, size_t len, const char *file, size_t lineno,
                              const json_error_t *jerr) {
  json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, NULL);
  const char *key, *field = NULL;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (json_is_real(v) && fabs(json_real_value(v)) >= 0x1p63 && (!field || !strcmp(key, "answer")))
      field = key;
  }
  lh_err e;
  if (field && !strcmp(field, "answer"))
    e = lh_errorf(LH_ERR_FORMAT,
                  "%s:%zu: field answer: an integer beyond the int64 range; write it as a string "
                  "(\"answer\": \"123...\") to keep its digits",
                  file, lineno);
  else if (field)
    e = lh_errorf(LH_ERR_FORMAT,
                  "%s:%zu: field %s: an integer beyond the int64 range (the field is not used: "
                  "write it as a string or leave it out)",
                  file, lineno, LH__ENV_ESC(field, strlen(field)));
  else
    e = lh_errorf(LH_ERR_FORMAT,
                  "%s:%zu: column %d: an integer beyond the int64 range; write it as a string",
                  file, lineno, jerr->column);
  json_decref(root);
  return e;
}

lh_err lh_env_jsonl_parse_line(const char *line, size_t len, const char *file, size_t lineno,
                               char **prompt, char **answer) {
  *prompt = *answer = NULL;
  const char *fname = file; /* messages name the file escaped: it came from a spec */
  file = LH__ENV_ESC_PATH(fname, strlen(fname));
  if (len > LH_JSONL_MAX_LINE)
    return lh_errorf(LH_ERR_LIMIT, "%s:%zu: line of %zu bytes, at most %u allowed", file, lineno,
                     len, LH_JSONL_MAX_LINE);
  json_error_t jerr;
  json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root && json_error_code(&jerr) == json_error_numeric_overflow &&
      strstr(jerr.text, "integer"))
    return big_integer_err(line, len, file, lineno, &jerr);
  if (!root)
    return lh_errorf(LH_ERR_FORMAT, "%s:%zu: column %d: %s", file, lineno, jerr.column,
                     LH__ENV_ESC(jerr.text, strlen(jerr.text)));
  lh_err e = LH_ERR_OK;
  if (!json_is_object(root)) {
    e = lh_errorf(LH_ERR_FORMAT, "%s:%zu: expected a JSON object, found %s", file, lineno,
                  lh_json_type_name(root));
    goto out;
  }
  json_t *p = json_object_get(root, "prompt"), *a = json_object_get(root, "answer");
  if (!p || !json_is_string(p)) {
    e = lh_errorf(LH_ERR_FORMAT, "%s:%zu: field prompt: expected a string, found %s", file, lineno,
                  p ? lh_json_type_name(p) : "nothing");
    goto out;
  }
  char num[64];
  const char *at = NULL;
  size_t al = 0;
  if (a && json_is_string(a)) {
    at = json_string_value(a);
    al = json_string_length(a);
    const char *t = at;
    size_t tl = al;
    trim(&t, &tl);
    if (tl == 0) { /* exact match trims the completion: an empty one would score 1 */
      e = lh_errorf(LH_ERR_FORMAT,
                    "%s:%zu: field answer: expected a non-blank answer, found %s (any empty "
                    "completion would score 1)",
                    file, lineno, al ? "only whitespace" : "an empty string");
      goto out;
    }
  } else if (a && json_is_integer(a)) {
    al = (size_t)snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(a));
    at = num;
  } else if (a && json_is_real(a)) {
    al = real_text(json_real_value(a), num, sizeof num);
    at = num;
  } else {
    e = lh_errorf(LH_ERR_FORMAT, "%s:%zu: field answer: expected a string or a number, found %s",
                  file, lineno, a ? lh_json_type_name(a) : "nothing");
    goto out;
  }
  *prompt = lh__env_strndup(json_string_value(p), json_string_length(p));
  *answer = lh__env_strndup(at, al);
  if (!*prompt || !*answer) {
    free(*prompt);
    free(*answer);
    *prompt = *answer = NULL;
    e = lh_errorf(LH_ERR_NOMEM, "%s:%zu: out of memory", file, lineno);
  }
out:
  json_decref(root);
  return e;
}

/* A number in text as an exact decimal: (neg ? -1 : 1) * 0.D * 10^exp, where D, its significant
 * digits, are the ndig digits from text[first] on (skipping ',' and '.'): leading and trailing
 * zeros are not in D, so 0.5, 0.50, 00.5 and 5e-1 read the same. Zero has ndig 0, exp 0, neg
 * false. huge: a nonzero number whose written exponent is beyond LH_JSONL_MAX_EXPONENT; exp is
 * then unknown and the number equals none. */
typedef struct {
  size_t start, end;  /* the number is text[start, end) */
  size_t first, ndig; /* D */
  int64_t exp;
  bool neg, huge;
} jl_num;

/* s[i] is a comma followed by exactly three digits */
static bool thousands(const char *s, size_t len, size_t i) {
  return s[i] == ',' && i + 3 < len && isdigit((unsigned char)s[i + 1]) &&
         isdigit((unsigned char)s[i + 2]) && isdigit((unsigned char)s[i + 3]) &&
         (i + 4 == len || !isdigit((unsigned char)s[i + 4]));
}

/* A number may start at s[i] == '.': a digit follows and no letter, digit or '.' comes before
 * (so "1.2.3" and "wait...5" end in 3 and 5, not .3 and .5). */
static bool point_starts(const char *s, size_t len, size_t i) {
  return s[i] == '.' && i + 1 < len && isdigit((unsigned char)s[i + 1]) &&
         (i == 0 || !(isalnum((unsigned char)s[i - 1]) || s[i - 1] == '.'));
}

/* Reads the number whose first digit or point is s[at]; start is at, or at - 1 for a minus. */
static void read_number(const char *s, size_t len, size_t start, size_t at, jl_num *n) {
  *n = (jl_num){.start = start, .neg = start < at};
  size_t i = at, int_digits = 0, zeros = 0, sig = 0; /* sig: digits from the first nonzero one */
  size_t group = 0; /* digits since the start or the last thousands separator */
  bool point = false;
  for (; i < len; i++) {
    if (isdigit((unsigned char)s[i])) {
      int_digits += !point;
      group += !point;
      if (sig == 0 && s[i] == '0') {
        zeros++;
        continue;
      }
      if (sig++ == 0) n->first = i;
      if (s[i] != '0') n->ndig = sig;
    } else if (!point && group >= 1 && group <= 3 && thousands(s, len, i)) {
      group = 0; /* 1,234,567: a first group of 1-3 digits, then groups of three */
    } else if (s[i] == '.' && !point && i + 1 < len && isdigit((unsigned char)s[i + 1])) {
      point = true;
    } else {
      break;
    }
  }
  /* an exponent: e or E, an optional sign, at least one digit ("3eggs" is 3) */
  int64_t e = 0;
  bool eneg = false;
  size_t j = i + 1;
  if (i < len && (s[i] == 'e' || s[i] == 'E')) {
    if (j < len && (s[j] == '+' || s[j] == '-')) eneg = s[j++] == '-';
    if (j < len && isdigit((unsigned char)s[j])) {
      for (i = j; i < len && isdigit((unsigned char)s[i]); i++)
        if (e <= LH_JSONL_MAX_EXPONENT) e = e * 10 + (s[i] - '0'); /* stops above the limit */
      n->huge = e > LH_JSONL_MAX_EXPONENT;
    }
  }
  n->end = i;
  if (!n->ndig) {
    n->neg = n->huge = false;
    return;
  }
  /* the digits before the point, less the leading zeros, place the point in 0.D; the count is
   * at most len and |e| at most 10^15, so only an absurd len could overflow: huge then */
  int64_t base = (int64_t)int_digits - (int64_t)zeros;
  if (eneg) e = -e;
  if ((e > 0 && base > INT64_MAX - e) || (e < 0 && base < INT64_MIN - e)) n->huge = true;
  if (!n->huge) n->exp = base + e;
}

/* The last number in s; false when there is none. */
static bool last_num(const char *s, size_t len, jl_num *out) {
  bool found = false;
  for (size_t i = 0; i < len;) {
    size_t at = i; /* a minus sign counts unless it follows a letter, digit or ')': 5-3 is 3 */
    if (s[i] == '-' && (i == 0 || !(isalnum((unsigned char)s[i - 1]) || s[i - 1] == ')')))
      at = i + 1;
    if (at < len && (isdigit((unsigned char)s[at]) || point_starts(s, len, at))) {
      read_number(s, len, i, at, out);
      found = true;
      i = out->end;
    } else {
      i++;
    }
  }
  return found;
}

static bool num_equal(const char *a, const jl_num *x, const char *b, const jl_num *y) {
  if (x->huge || y->huge || x->ndig != y->ndig || x->neg != y->neg || x->exp != y->exp)
    return false;
  for (size_t i = x->first, j = y->first, k = 0; k < x->ndig; i++, j++, k++) {
    while (!isdigit((unsigned char)a[i]))
      i++;
    while (!isdigit((unsigned char)b[j]))
      j++;
    if (a[i] != b[j]) return false;
  }
  return true;
}

/* s is one number and nothing else */
static bool one_number(const char *s, size_t len, jl_num *n) {
  return last_num(s, len, n) && n->start == 0 && n->end == len;
}

bool lh_env_last_number(const char *text, size_t len, size_t *start, size_t *n) {
  jl_num x;
  if (!last_num(text, len, &x)) return false;
  *start = x.start;
  *n = x.end - x.start;
  return true;
}

bool lh_env_number_equal(const char *a, size_t alen, const char *b, size_t blen) {
  jl_num x, y;
  return one_number(a, alen, &x) && one_number(b, blen, &y) && num_equal(a, &x, b, &y);
}

/* match=auto: the answer, trimmed, is one number and in range */
static bool is_whole_number(const char *s, size_t n) {
  trim(&s, &n);
  jl_num x;
  return one_number(s, n, &x) && !x.huge;
}

static lh_err add_item(jl *j, int split, char *prompt, char *answer) {
  if (j->n[split] == j->cap[split]) {
    size_t nc = j->cap[split] ? j->cap[split] * 2 : 64;
    jl_item *ni = realloc(j->items[split], nc * sizeof *ni);
    if (!ni) return lh_errorf(LH_ERR_NOMEM, "jsonl: out of memory");
    j->items[split] = ni;
    j->cap[split] = nc;
  }
  j->items[split][j->n[split]++] = (jl_item){prompt, answer};
  return LH_ERR_OK;
}

/* split < 0: decide per prompt by hash and test_fraction */
static lh_err load_file(jl *j, const char *path, int split, double test_fraction) {
  char *data = NULL;
  size_t len = 0;
  lh_err e = lh_file_read(path, LH_JSONL_MAX_FILE, &data, &len);
  if (e) { /* its message holds the path as it is */
    const char *m = lh_last_error();
    return lh_errorf(e, "%s", LH__ENV_ESC_PATH(m, strlen(m)));
  }
  size_t lineno = 0, start = len >= 3 && !memcmp(data, "\xEF\xBB\xBF", 3) ? 3 : 0; /* a BOM */
  for (size_t pos = start; pos < len;) {
    const char *nl = memchr(data + pos, '\n', len - pos);
    size_t ll = nl ? (size_t)(nl - (data + pos)) : len - pos;
    const char *line = data + pos;
    pos += ll + (nl ? 1 : 0);
    lineno++;
    const char *t = line;
    size_t tl = ll;
    trim(&t, &tl);
    if (tl == 0) continue; /* blank line */
    char *prompt, *answer;
    if ((e = lh_env_jsonl_parse_line(line, ll, path, lineno, &prompt, &answer))) break;
    int s = split;
    if (s < 0) {
      uint64_t h = lh__env_mix(lh__env_hash(prompt, strlen(prompt), 0));
      s = (double)(h >> 11) * 0x1p-53 < test_fraction ? LH_SPLIT_TEST : LH_SPLIT_TRAIN;
    }
    if ((e = add_item(j, s, prompt, answer))) {
      free(prompt);
      free(answer);
      break;
    }
  }
  free(data);
  return e;
}

static void jsonl_free(lh_env *env) {
  jl *j = env->impl;
  if (!j) return;
  for (int s = 0; s < 2; s++) {
    for (size_t i = 0; i < j->n[s]; i++) {
      free(j->items[s][i].prompt);
      free(j->items[s][i].answer);
    }
    free(j->items[s]);
  }
  free(j);
  env->impl = NULL;
}

lh_err lh__env_jsonl_init(lh_env *env) {
  lh_env_config *c = &env->cfg; /* settled: path given, test_fraction in (0, 1) */
  jl *j = lh_xcalloc(1, sizeof *j);
  env->impl = j;
  lh_err e;
  if (c->test_path[0]) {
    if (!(e = load_file(j, c->path, LH_SPLIT_TRAIN, 0))) e = load_file(j, c->test_path, 1, 0);
  } else {
    e = load_file(j, c->path, -1, c->test_fraction);
  }
  if (!e && j->n[0] + j->n[1] == 0)
    e = lh_errorf(LH_ERR_FORMAT, "%s: no tasks in the file",
                  LH__ENV_ESC_PATH(c->path, strlen(c->path)));
  if (e) jsonl_free(env);
  return e;
}

static lh_err jsonl_task(lh_env *env, lh_split split, uint64_t index, lh_env_task *task) {
  jl *j = env->impl;
  if (j->n[split] == 0)
    return lh_errorf(LH_ERR_NOTFOUND, "%s: the %s split is empty",
                     LH__ENV_ESC_PATH(env->cfg.path, strlen(env->cfg.path)),
                     split == LH_SPLIT_TEST ? "test" : "train");
  const jl_item *it = &j->items[split][index % j->n[split]];
  task->prompt = lh_xstrdup(it->prompt);
  task->answer = lh_xstrdup(it->answer);
  task->solution = lh_xstrdup(it->answer);
  task->split = split;
  task->index = index;
  return LH_ERR_OK;
}

static lh_err jsonl_score(lh_env *env, const lh_env_task *task, const char *text, size_t len,
                          lh_env_result *out) {
  lh_env_match m = env->cfg.match;
  size_t al = strlen(task->answer);
  if (m == LH_ENV_MATCH_AUTO)
    m = is_whole_number(task->answer, al) ? LH_ENV_MATCH_NUMERIC : LH_ENV_MATCH_EXACT;
  if (m == LH_ENV_MATCH_NUMERIC) {
    jl_num got, want;
    out->well_formed = last_num(text, len, &got);
    out->correct = out->well_formed && last_num(task->answer, al, &want) &&
                   num_equal(text, &got, task->answer, &want);
  } else {
    const char *s = text, *a = task->answer;
    size_t n = len;
    trim(&s, &n);
    trim(&a, &al);
    out->well_formed = n > 0;
    out->correct = n == al && memcmp(s, a, n) == 0;
  }
  out->reward = out->correct ? 1.0f : 0.0f;
  return LH_ERR_OK;
}

static uint64_t jsonl_size(const lh_env *env, lh_split split) {
  const jl *j = env->impl;
  return j->n[split];
}

const lh__env_ops lh__env_jsonl_ops = {jsonl_task, jsonl_score, jsonl_size, jsonl_free};
