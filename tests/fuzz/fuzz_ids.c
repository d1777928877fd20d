/* libFuzzer target for the command line's parsers of token ids in outside text: a
 * --prompt-tokens / --decode list (lh__parse_ids) and a line of `score --input`
 * (lh__parse_id_array), both fed any bytes. What they accept is in range, and an accepted list
 * written back as "[a,b,c]" parses to the same ids. Rejections print one line on stderr. */
#include <stdint.h>
#include <string.h>

#include "cli.h"
#include "fuzz_util.h"

#define VOCAB   1000
#define MAX_LEN 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  char *s = malloc(size + 1);
  CHECK(s);
  memcpy(s, data, size);
  s[size] = '\0';
  int32_t *ids = NULL;
  size_t n = 0;
  if (lh__parse_ids("fuzz", "ids", s, &ids, &n) == LH__ARGS_CONTINUE) {
    char *back = malloc(n * 12 + 3), *p = back;
    CHECK(back);
    *p++ = '[';
    for (size_t i = 0; i < n; i++) {
      CHECK(ids[i] >= 0);
      p += sprintf(p, "%s%d", i ? "," : "", ids[i]);
    }
    *p++ = ']';
    *p = '\0';
    int32_t *again = NULL;
    size_t m = 0;
    CHECK(lh__parse_ids("fuzz", "ids", back, &again, &m) == LH__ARGS_CONTINUE);
    CHECK(m == n && (n == 0 || memcmp(again, ids, n * sizeof *ids) == 0));
    free(again);
    free(back);
    free(ids);
  }
  if (lh__parse_id_array("fuzz", "fuzz:1", (const char *)data, size, VOCAB, MAX_LEN, &ids, &n) ==
      LH__ARGS_CONTINUE) {
    CHECK(n >= 1 && n <= MAX_LEN);
    for (size_t i = 0; i < n; i++)
      CHECK(ids[i] >= 0 && ids[i] < VOCAB);
    free(ids);
  } else {
    CHECK(ids == NULL && n == 0);
  }
  free(s);
  return 0;
}
