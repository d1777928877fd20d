/* libFuzzer target for the countdown expression parser: any bytes, with the first byte choosing
 * how many of the next bytes are the given numbers. An accepted expression must give a reduced
 * fraction with a positive denominator, literals of at most 10^9, the same value without the
 * number check, and reward 1 when scored against its own value. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/env.h"

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz_countdown: invariant failed: %s (line %d)\n", #cond, __LINE__);        \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

static int64_t gcd(int64_t a, int64_t b) {
  uint64_t x = a < 0 ? -(uint64_t)a : (uint64_t)a, y = (uint64_t)b;
  while (y) {
    uint64_t t = x % y;
    x = y;
    y = t;
  }
  return (int64_t)x;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int n = data[0] % (LH_COUNTDOWN_MAX_NUMS + 1);
  if (size < 1 + (size_t)n) return 0;
  int64_t nums[LH_COUNTDOWN_MAX_NUMS];
  for (int i = 0; i < n; i++)
    nums[i] = data[1 + i];
  const char *expr = (const char *)data + 1 + n;
  size_t len = size - 1 - (size_t)n;
  int64_t num = 0, den = 0, num2 = 0, den2 = 0;
  lh_err e = lh_countdown_eval(expr, len, nums, n, &num, &den);
  if (e != LH_ERR_OK) {
    CHECK(lh_last_error() != NULL && lh_last_error()[0] != '\0');
    return 0;
  }
  CHECK(den > 0);
  CHECK(gcd(num, den) == 1 || (num == 0 && den == 1));
  for (size_t i = 0; i < len;) { /* every literal is at most 10^9 */
    int64_t lit = 0;
    size_t j = i;
    for (; j < len && expr[j] >= '0' && expr[j] <= '9' && lit <= LH_COUNTDOWN_MAX_LITERAL; j++)
      lit = lit * 10 + (expr[j] - '0');
    CHECK(lit <= LH_COUNTDOWN_MAX_LITERAL);
    i = j > i ? j : i + 1;
  }
  CHECK(lh_countdown_eval(expr, len, NULL, 0, &num2, &den2) == LH_ERR_OK);
  CHECK(num == num2 && den == den2);
  if (den == 1 && n > 0 && memchr(expr, '\n', len) == NULL) {
    static lh_env *env;
    if (!env) {
      lh_env_config cfg;
      CHECK(lh_env_config_parse("countdown", &cfg) == LH_ERR_OK);
      CHECK(lh_env_create(&cfg, &env) == LH_ERR_OK);
    }
    lh_env_task t = {.prompt = "", .answer = "", .n_nums = n, .target = num};
    memcpy(t.nums, nums, sizeof nums[0] * (size_t)n);
    lh_env_result r;
    CHECK(lh_env_score(env, &t, expr, len, &r) == LH_ERR_OK);
    CHECK(r.correct && r.reward == 1.0f);
  }
  return 0;
}
