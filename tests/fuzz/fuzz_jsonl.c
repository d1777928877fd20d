/* libFuzzer target for the jsonl line parser and the number reader: any bytes as one line, and
 * the bytes before and after the first newline as a completion and an answer. An accepted line
 * gives a prompt and an answer that is not blank (a real answer reads back as the same double,
 * and a number answer is one number); errors carry a "FILE:LINE:" message without a control
 * byte (text of the line in it is escaped). A number found reads
 * wholly with strtod once its commas are dropped, equals itself unless it has an exponent (one out
 * of range equals nothing), and two numbers that compare equal (either way round) are the same
 * double. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/env.h"

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz_jsonl: invariant failed: %s (line %d)\n", #cond, __LINE__);            \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

/* The number s[0, n) as a double; strtod must read all of it but its commas. */
static double number_value(const char *s, size_t n) {
  char *buf = malloc(n + 1), *end;
  CHECK(buf != NULL);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] != ',') buf[k++] = s[i];
  buf[k] = '\0';
  double v = strtod(buf, &end);
  CHECK(end == buf + k);
  free(buf);
  return v;
}

/* The last number of s, or NULL; checks what holds for any number alone. */
static const char *last_number(const char *s, size_t len, size_t *n) {
  size_t at;
  if (!lh_env_last_number(s, len, &at, n)) return NULL;
  CHECK(at < len && 0 < *n && *n <= len - at);
  (void)number_value(s + at, *n);
  if (!memchr(s + at, 'e', *n) && !memchr(s + at, 'E', *n))
    CHECK(lh_env_number_equal(s + at, *n, s + at, *n));
  return s + at;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *text = (const char *)data;
  char *prompt = NULL, *answer = NULL;
  lh_err e = lh_env_jsonl_parse_line(text, size, "in.jsonl", 42, &prompt, &answer);
  size_t n, m;
  if (e == LH_ERR_OK) {
    CHECK(prompt != NULL && answer != NULL);
    CHECK(answer[strspn(answer, " \t\n\v\f\r")] != '\0'); /* not blank */
    const char *x = last_number(answer, strlen(answer), &n);
    json_t *root = json_loadb(text, size, JSON_REJECT_DUPLICATES, NULL);
    json_t *a = json_object_get(root, "answer");
    if (json_is_real(a)) CHECK(strtod(answer, NULL) == json_real_value(a));
    if (json_is_number(a)) CHECK(x == answer && n == strlen(answer));
    json_decref(root);
  } else {
    CHECK(prompt == NULL && answer == NULL);
    CHECK(strncmp(lh_last_error(), "in.jsonl:42: ", 13) == 0);
    for (const char *c = lh_last_error(); *c; c++) /* the line's text escaped in it */
      CHECK((unsigned char)*c >= 0x20 && *c != 0x7f);
  }
  free(prompt);
  free(answer);
  (void)last_number(text, size, &n);
  const char *nl = memchr(text, '\n', size);
  size_t cl = nl ? (size_t)(nl - text) : size;
  const char *x = last_number(text, cl, &n);
  const char *y = nl ? last_number(nl + 1, size - cl - 1, &m) : NULL;
  if (x && y) {
    bool eq = lh_env_number_equal(x, n, y, m);
    CHECK(eq == lh_env_number_equal(y, m, x, n));
    if (eq) CHECK(number_value(x, n) == number_value(y, m));
  }
  return 0;
}
