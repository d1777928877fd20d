/* Flag parser shared by every longhaul subcommand: long flags `--name value` / `--name=value`,
 * switches, typed getters with range checks. Usage errors are one line on stderr and exit
 * code 2; --help prints a usage text generated from the same flag table, so the two agree. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longhaul/base.h"

int lh__cli_error(const char *cmd, int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "longhaul %s: %s\n", cmd, msg);
  return code;
}

int lh__cli_fail(const char *cmd) {
  return lh__cli_error(cmd, LH__EXIT_FAIL, "%s", lh_last_error());
}

int lh__cli_fail_err(const char *cmd, lh_err e) {
  return lh__cli_error(cmd, e == LH_ERR_USAGE ? LH__EXIT_USAGE : LH__EXIT_FAIL, "%s",
                       lh_last_error());
}

int lh__cli_flush_stdout(const char *cmd) {
  errno = 0;
  int e = fflush(stdout) != 0 ? errno : 0;
  if (e == 0 && !ferror(stdout)) return LH__EXIT_OK;
  /* an earlier write failed and the flush had nothing left to write: its errno is gone */
  return lh__cli_error(cmd, LH__EXIT_FAIL, "cannot write the output: %s",
                       e ? strerror(e) : "an earlier write failed");
}

static int find_flag(const lh__args *a, const char *name, size_t len) {
  for (int i = 0; i < a->n_flags; i++)
    if (strlen(a->flags[i].name) == len && !strncmp(a->flags[i].name, name, len)) return i;
  return -1;
}

static int flag_index(const lh__args *a, const char *name) {
  int i = find_flag(a, name, strlen(name));
  LH_CHECK(i >= 0, "flag --%s is not in the table of '%s'", name, a->cmd);
  return i;
}

static void print_flag_synopsis(const lh__flag *f) {
  if (!f->required) fputc('[', stdout);
  printf("--%s", f->name);
  if (f->metavar) printf(" %s", f->metavar);
  if (!f->required) fputc(']', stdout);
}

void lh__args_usage(const lh__args *a) {
  printf("usage: longhaul %s", a->cmd);
  for (int i = 0; i < a->n_flags; i++) {
    fputc(' ', stdout);
    print_flag_synopsis(&a->flags[i]);
  }
  printf("\n\n%s\n\nflags:\n", a->about);
  for (int i = 0; i < a->n_flags; i++) {
    const lh__flag *f = &a->flags[i];
    char left[96];
    snprintf(left, sizeof left, "--%s%s%s", f->name, f->metavar ? " " : "",
             f->metavar ? f->metavar : "");
    printf("  %-30s %s%s\n", left, f->help, f->required ? " (required)" : "");
  }
  printf("  %-30s %s\n", "-h, --help", "show this help and exit");
}

int lh__args_parse(lh__args *a, int argc, char **argv) {
  LH_CHECK(a->n_flags <= LH__MAX_FLAGS, "'%s' has %d flags, more than %d", a->cmd, a->n_flags,
           LH__MAX_FLAGS);
  for (int i = 0; i < LH__MAX_FLAGS; i++)
    a->values[i] = NULL;
  char err[512] = "";
  bool help = false;
  /* The first error is kept, but the scan goes on so that --help anywhere still wins. */
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      help = true;
      continue;
    }
    if (err[0]) continue;
    if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
      snprintf(err, sizeof err, "unexpected argument \"%s\" (see longhaul %s --help)", arg, a->cmd);
      continue;
    }
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
    int idx = find_flag(a, name, name_len);
    if (idx < 0) {
      snprintf(err, sizeof err, "unknown flag --%.*s (see longhaul %s --help)", (int)name_len, name,
               a->cmd);
      continue;
    }
    const lh__flag *f = &a->flags[idx];
    const char *value;
    bool given = true; /* a value was written, perhaps empty ("--prompt=" or --prompt "") */
    if (!f->metavar) {
      if (eq) {
        snprintf(err, sizeof err, "--%s: takes no value, got \"%s\"", f->name, eq + 1);
        continue;
      }
      value = "";
    } else if (eq) {
      value = eq + 1;
    } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0 && strcmp(argv[i + 1], "-h")) {
      value = argv[++i];
    } else {
      value = "";
      given = false;
    }
    if (f->metavar && value[0] == '\0') {
      snprintf(err, sizeof err, "--%s: %s value (expected %s)", f->name,
               given ? "empty" : "missing", f->metavar);
      continue;
    }
    if (a->values[idx]) {
      snprintf(err, sizeof err, "--%s: given more than once", f->name);
      continue;
    }
    a->values[idx] = value;
  }
  if (help) {
    lh__args_usage(a);
    return LH__EXIT_OK;
  }
  if (err[0]) return lh__cli_error(a->cmd, LH__EXIT_USAGE, "%s", err);
  for (int i = 0; i < a->n_flags; i++)
    if (a->flags[i].required && !a->values[i])
      return lh__cli_error(a->cmd, LH__EXIT_USAGE,
                           "missing required flag --%s%s%s (see longhaul %s --help)",
                           a->flags[i].name, a->flags[i].metavar ? " " : "",
                           a->flags[i].metavar ? a->flags[i].metavar : "", a->cmd);
  return LH__ARGS_CONTINUE;
}

bool lh__args_has(const lh__args *a, const char *name) {
  return a->values[flag_index(a, name)] != NULL;
}

const char *lh__args_str(const lh__args *a, const char *name, const char *def) {
  const char *v = a->values[flag_index(a, name)];
  return v ? v : def;
}

static void describe_range(char *buf, size_t n, long lo, long hi) {
  if (lo == 0 && hi == LONG_MAX)
    snprintf(buf, n, "a non-negative integer");
  else if (lo == 1 && hi == LONG_MAX)
    snprintf(buf, n, "a positive integer");
  else
    snprintf(buf, n, "an integer in [%ld, %ld]", lo, hi);
}

int lh__args_int(const lh__args *a, const char *name, long lo, long hi, long def, long *out) {
  const char *v = a->values[flag_index(a, name)];
  if (!v) {
    *out = def;
    return LH__ARGS_CONTINUE;
  }
  char *end = NULL;
  errno = 0;
  long x = 0;
  bool ok = (v[0] == '-' || (v[0] >= '0' && v[0] <= '9'));
  if (ok) {
    x = strtol(v, &end, 10);
    ok = errno == 0 && end != v && *end == '\0' && x >= lo && x <= hi;
  }
  if (!ok) {
    char want[96];
    describe_range(want, sizeof want, lo, hi);
    return lh__cli_error(a->cmd, LH__EXIT_USAGE, "--%s: expected %s, got \"%s\"", name, want, v);
  }
  *out = x;
  return LH__ARGS_CONTINUE;
}

int lh__args_u64(const lh__args *a, const char *name, uint64_t hi, uint64_t def, uint64_t *out) {
  const char *v = a->values[flag_index(a, name)];
  if (!v) {
    *out = def;
    return LH__ARGS_CONTINUE;
  }
  char *end = NULL;
  errno = 0;
  unsigned long long x = 0;
  bool ok = v[0] >= '0' && v[0] <= '9';
  if (ok) {
    x = strtoull(v, &end, 10);
    ok = *end == '\0';
  }
  if (!ok)
    return lh__cli_error(a->cmd, LH__EXIT_USAGE,
                         "--%s: expected a non-negative integer, got \"%s\"", name, v);
  if (errno == ERANGE || x > hi)
    return lh__cli_error(a->cmd, LH__EXIT_USAGE,
                         "--%s: expected an integer in [0, %llu], got \"%s\"", name,
                         (unsigned long long)hi, v);
  *out = (uint64_t)x;
  return LH__ARGS_CONTINUE;
}

int lh__args_double(const lh__args *a, const char *name, double lo, double hi, double def,
                    double *out) {
  const char *v = a->values[flag_index(a, name)];
  if (!v) {
    *out = def;
    return LH__ARGS_CONTINUE;
  }
  /* decimal only, as the integer flags: strtod alone would also take leading whitespace, hex
   * ("0x1p-1"), "inf" and "nan" */
  size_t len = strspn(v, "0123456789.eE+-");
  char *end = NULL;
  errno = 0;
  double x = v[len] == '\0' ? strtod(v, &end) : 0.0;
  bool ok = end && end != v && *end == '\0';
  /* ERANGE on underflow is no error: a subnormal result is the nearest double. But a nonzero
   * number read as 0 would silently change its meaning (--temperature 0 is greedy), and the
   * values are used as floats: 1e-50 is 0 there. */
  bool nonzero = strcspn(v, "123456789") < strcspn(v, "eE");
  if (ok && nonzero && (float)x == 0.0f)
    return lh__cli_error(a->cmd, LH__EXIT_USAGE,
                         "--%s: \"%s\" is too small to represent (it would read as 0); expected a "
                         "number in [%g, %g]",
                         name, v, lo, hi);
  if (!ok || (errno == ERANGE && isinf(x)) || !(x >= lo && x <= hi))
    return lh__cli_error(a->cmd, LH__EXIT_USAGE, "--%s: expected a number in [%g, %g], got \"%s\"",
                         name, lo, hi, v);
  *out = x;
  return LH__ARGS_CONTINUE;
}

int lh__args_choice(const lh__args *a, const char *name, const char *const *choices, int def,
                    int *out) {
  const char *v = a->values[flag_index(a, name)];
  if (!v) {
    *out = def;
    return LH__ARGS_CONTINUE;
  }
  for (int i = 0; choices[i]; i++)
    if (!strcmp(v, choices[i])) {
      *out = i;
      return LH__ARGS_CONTINUE;
    }
  char want[256] = "";
  size_t used = 0;
  for (int i = 0; choices[i] && used < sizeof want; i++)
    used += (size_t)snprintf(want + used, sizeof want - used, "%s%s", i ? "|" : "", choices[i]);
  return lh__cli_error(a->cmd, LH__EXIT_USAGE, "--%s: expected one of %s, got \"%s\"", name, want,
                       v);
}

int lh__parse_ids(const char *cmd, const char *flag, const char *s, int32_t **ids, size_t *n) {
  size_t cap = 16, k = 0;
  int32_t *v = lh_xmalloc(cap * sizeof *v);
  const char *p = s;
  while (*p == ' ')
    p++;
  bool bracket = *p == '[';
  if (bracket) p++;
  for (;;) {
    while (*p == ' ')
      p++;
    if (bracket && *p == ']' && k == 0) break;
    char *end = NULL;
    errno = 0;
    long x = (*p >= '0' && *p <= '9') || *p == '-' ? strtol(p, &end, 10) : 0;
    if (!end || end == p || errno || x < 0 || x > INT32_MAX) goto bad;
    if (k == cap) { /* the list is one argument: its length is bounded by the system's */
      v = realloc(v, (cap *= 2) * sizeof *v);
      LH_CHECK(v, "out of memory holding %zu token ids", cap);
    }
    v[k++] = (int32_t)x;
    p = end;
    while (*p == ' ')
      p++;
    if (*p != ',') break;
    p++;
  }
  if (bracket && *p++ != ']') goto bad; /* "[1,2" lacks its ']' */
  while (*p == ' ')
    p++;
  if (*p) goto bad;
  *ids = v;
  *n = k;
  return LH__ARGS_CONTINUE;
bad:
  free(v);
  return lh__cli_error(cmd, LH__EXIT_USAGE, "--%s: expected comma-separated token ids, got \"%s\"",
                       flag, s);
}

int lh__parse_id_array(const char *cmd, const char *where, const char *text, size_t len, int vocab,
                       int max_len, int32_t **ids, size_t *n) {
  *ids = NULL;
  *n = 0;
  while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r'))
    len--;
  if (len == 0)
    return lh__cli_error(cmd, LH__EXIT_FAIL, "%s: empty line, expected a JSON array of token ids",
                         where);
  json_error_t jerr;
  json_t *arr = json_loadb(text, len, JSON_DECODE_ANY, &jerr);
  if (!arr)
    return lh__cli_error(cmd, LH__EXIT_FAIL, "%s: invalid JSON at column %d: %s", where,
                         jerr.column, jerr.text);
  size_t k = json_is_array(arr) ? json_array_size(arr) : 0;
  int32_t *v = NULL;
  int rc = LH__ARGS_CONTINUE;
  if (!json_is_array(arr))
    rc = lh__cli_error(cmd, LH__EXIT_FAIL, "%s: expected a JSON array of token ids", where);
  else if (k == 0)
    rc = lh__cli_error(cmd, LH__EXIT_FAIL, "%s: empty array, need at least 1 token", where);
  else if (k > (size_t)max_len)
    rc = lh__cli_error(cmd, LH__EXIT_FAIL,
                       "%s: %zu tokens, more than the model's max_position_embeddings %d", where, k,
                       max_len);
  else
    v = lh_xmalloc(k * sizeof *v);
  for (size_t i = 0; rc == LH__ARGS_CONTINUE && i < k; i++) {
    const json_t *x = json_array_get(arr, i);
    if (!json_is_integer(x))
      rc =
          lh__cli_error(cmd, LH__EXIT_FAIL, "%s: element %zu is not an integer token id", where, i);
    else if (json_integer_value(x) < 0 || json_integer_value(x) >= vocab)
      rc = lh__cli_error(cmd, LH__EXIT_FAIL,
                         "%s: element %zu is token %lld, outside the vocabulary [0, %d)", where, i,
                         (long long)json_integer_value(x), vocab);
    else
      v[i] = (int32_t)json_integer_value(x);
  }
  json_decref(arr);
  if (rc != LH__ARGS_CONTINUE) {
    free(v);
    return rc;
  }
  *ids = v;
  *n = k;
  return rc;
}

int lh__subcommands(const char *cmd, const lh__subcommand *subs, int n, int argc, char **argv) {
  char names[256] = "";
  for (int i = 0; i < n; i++) {
    size_t used = strlen(names);
    snprintf(names + used, sizeof names - used, "%s%s",
             i == 0       ? ""
             : i == n - 1 ? " or "
                          : ", ",
             subs[i].name);
  }
  if (argc < 2)
    return lh__cli_error(cmd, LH__EXIT_USAGE,
                         "missing subcommand (expected: %s; see longhaul %s --help)", names, cmd);
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h")) {
    printf("usage: longhaul %s SUBCOMMAND [flags]   (longhaul %s SUBCOMMAND --help)\n\n"
           "subcommands:\n",
           cmd, cmd);
    for (int i = 0; i < n; i++)
      printf("  %-10s %s\n", subs[i].name, subs[i].summary);
    return LH__EXIT_OK;
  }
  for (int i = 0; i < n; i++)
    if (!strcmp(sub, subs[i].name)) return subs[i].run(argc - 1, argv + 1);
  return lh__cli_error(cmd, LH__EXIT_USAGE,
                       "unknown subcommand \"%s\" (expected: %s; see longhaul %s --help)", sub,
                       names, cmd);
}
