/* libFuzzer target for lh_escape, which every environment message uses for text from outside: the
 * first byte picks the buffer size, the rest is the text. The result fits the buffer, holds no
 * control byte, is valid UTF-8 without C1 controls, and, when nothing was cut, reads back (\n,
 * \r, \t, \\ and \xNN undone) to the input exactly; when cut it ends with "..." and what precedes
 * that reads back to a prefix of the input. */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "longhaul/base.h"

/* Undoes lh_escape on s (whose escapes are complete) into out; returns the length. */
static size_t unescape(const char *s, size_t n, unsigned char *out) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '\\') {
      out[k++] = (unsigned char)s[i];
      continue;
    }
    CHECK(i + 1 < n);
    char c = s[++i];
    if (c == 'n' || c == 'r' || c == 't' || c == '\\') {
      out[k++] = c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : '\\';
      continue;
    }
    CHECK(c == 'x' && i + 2 < n);
    unsigned v = 0;
    for (int d = 1; d <= 2; d++) {
      char h = s[i + d];
      CHECK((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f'));
      v = v * 16 + (unsigned)(h <= '9' ? h - '0' : h - 'a' + 10);
    }
    out[k++] = (unsigned char)v;
    i += 2;
  }
  return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0 || size > 4096) return 0;
  size_t cap = data[0] < 200 ? data[0] : 8 * (size_t)data[0]; /* 0..199, or up to 2040 */
  const char *text = (const char *)data + 1;
  size_t n = size - 1;
  char *buf = malloc(cap ? cap : 1);
  CHECK(buf);
  const char *out = lh_escape(text, n, buf, cap);
  if (cap == 0) {
    CHECK(out[0] == '\0');
    free(buf);
    return 0;
  }
  CHECK(out == buf);
  size_t len = strlen(out);
  CHECK(len < cap);
  for (size_t i = 0; i < len; i++)
    CHECK((unsigned char)out[i] >= 0x20 && out[i] != 0x7f);
  json_t *s = json_stringn(out, len); /* valid UTF-8 */
  CHECK(s);
  json_decref(s);
  for (size_t i = 0; i + 1 < len; i++) /* no C1 control encoded as UTF-8 */
    CHECK(!((unsigned char)out[i] == 0xc2 && (unsigned char)out[i + 1] < 0xa0));
  unsigned char *back = malloc(len + 1);
  CHECK(back);
  size_t whole = unescape(out, len, back);
  if (!(whole == n && (n == 0 || !memcmp(back, text, n)))) { /* cut: a prefix, then "..." */
    CHECK((len >= 3 && !strcmp(out + len - 3, "...")) ||
          (len < 3 && strspn(out, ".") == len && cap <= 4));
    size_t keep = len >= 3 ? len - 3 : 0, k = unescape(out, keep, back);
    CHECK(k < n && (k == 0 || memcmp(back, text, k) == 0));
  }
  free(back);
  free(buf);
  return 0;
}
