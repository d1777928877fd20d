/* longhaul JSON helpers shared by every parser of outside JSON (config.json, safetensors
 * headers, API bodies): names for jansson value types, used in error messages, JSON strings
 * from bytes that may not be UTF-8 (model output), and a bound on what parsing text will cost. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/base.h"

const char *lh_json_type_name(const struct json_t *v) {
  if (!v) return "nothing";
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    return "object";
  case JSON_ARRAY:
    return "array";
  case JSON_STRING:
    return "string";
  case JSON_INTEGER:
    return "integer";
  case JSON_REAL:
    return "real";
  case JSON_TRUE:
  case JSON_FALSE:
    return "boolean";
  case JSON_NULL:
    return "null";
  }
  return "unknown";
}

/* Length of the well-formed UTF-8 sequence that starts s[0..n), or 0 when there is none; then
 * *bad is the length of its maximal ill-formed subpart (1..3 bytes: a lead byte and the
 * continuation bytes that could still have completed it, as Unicode's "U+FFFD substitution of
 * maximal subparts" and Python's decode(errors="replace") count them). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
  unsigned char c = s[0], lo = 0x80, hi = 0xBF; /* the range of the second byte */
  size_t len;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF)
    len = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF; /* overlong, surrogate */
  else if (c >= 0xF0 && c <= 0xF4)
    len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF; /* overlong, > U+10FFFF */
  else {
    *bad = 1;
    return 0;
  }
  size_t i = 1;
  for (; i < len && i < n; i++)
    if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF)) break;
  if (i == len) return len;
  *bad = i;
  return 0;
}

/* A JSON string from bytes. Bytes that are not valid UTF-8 (a completion cut inside a character,
 * a model's stray byte) become U+FFFD, one for each maximal ill-formed subpart; valid characters
 * around them are kept. */
json_t *lh_json_text(const char *s, size_t n) {
  json_t *v = json_stringn(s, n);
  if (v) return v;
  if (n > (SIZE_MAX - 1) / 3) return NULL;
  char *c = malloc(3 * n + 1); /* each bad byte grows to at most 3 */
  if (!c) return NULL;
  const unsigned char *u = (const unsigned char *)s;
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    size_t bad = 0, m = utf8_seq(u + i, n - i, &bad);
    if (m) {
      memcpy(c + k, s + i, m);
      k += m;
      i += m;
    } else {
      memcpy(c + k, "\xEF\xBF\xBD", 3);
      k += 3;
      i += bad;
    }
  }
  v = json_stringn(c, k);
  free(c);
  return v;
}

lh_err lh_json_check_cost(const char *text, size_t len, size_t max_open, size_t max_tokens,
                          const char *what) {
  size_t open = 0, tokens = 0;
  for (size_t i = 0; i < len; i++) {
    if (text[i] == '"') { /* a string: skip to its closing quote */
      for (i++; i < len && text[i] != '"'; i++)
        if (text[i] == '\\') i++;
    } else if (text[i] == '{' || text[i] == '[') {
      open++;
      tokens++;
    } else if (text[i] == ',' || text[i] == ':') {
      tokens++;
    }
  }
  if (open > max_open || tokens > max_tokens)
    return lh_errorf(LH_ERR_LIMIT,
                     "%s: %zu JSON brackets and separators, %zu of them opening an object or "
                     "array: more than the %zu and %zu allowed",
                     what, tokens, open, max_tokens, max_open);
  return LH_ERR_OK;
}
