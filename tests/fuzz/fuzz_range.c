/* libFuzzer target for the header values of byte ranges and caching (http.h): the first 8 bytes
 * are a content size (little-endian; shorter inputs use 1000), the rest up to a '\n' a Range
 * value, and what follows it an entity tag. lh_http_parse_range's result always describes a
 * range inside the content (or the documented whole / empty one); a single range formatted back
 * as "bytes=A-B" (and "bytes=-N" when it ends the content) parses to itself, and as the 206's
 * Content-Range parses back to the same numbers. lh_http_parse_content_range and
 * lh_http_etag_match take the same bytes: an accepted Content-Range formats back to itself, and
 * a well-formed tag matches itself, weak or strong. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "longhaul/http.h"

#include "fuzz_util.h"

static void check_range(const char *value, uint64_t size) {
  uint64_t start = 1, len = 1;
  lh_http_range r = lh_http_parse_range(value, size, &start, &len);
  CHECK(r >= LH_HTTP_RANGE_WHOLE && r <= LH_HTTP_RANGE_MALFORMED);
  if (strncasecmp(value, "bytes=", 6) != 0) CHECK(r == LH_HTTP_RANGE_MALFORMED);
  if (r == LH_HTTP_RANGE_WHOLE || r == LH_HTTP_RANGE_MALFORMED) CHECK(start == 0 && len == size);
  if (r == LH_HTTP_RANGE_UNSATISFIABLE) CHECK(start == 0 && len == 0);
  if (r != LH_HTTP_RANGE_ONE) return;
  CHECK(len >= 1 && start < size && len <= size - start);
  char again[96];
  uint64_t s2, l2;
  snprintf(again, sizeof again, "bytes=%llu-%llu", (unsigned long long)start,
           (unsigned long long)(start + len - 1));
  CHECK(lh_http_parse_range(again, size, &s2, &l2) == LH_HTTP_RANGE_ONE && s2 == start &&
        l2 == len);
  if (start + len == size) {
    snprintf(again, sizeof again, "bytes=-%llu", (unsigned long long)len);
    CHECK(lh_http_parse_range(again, size, &s2, &l2) == LH_HTTP_RANGE_ONE && s2 == start &&
          l2 == len);
  }
  if (size < UINT64_MAX) {
    uint64_t a, b, t;
    snprintf(again, sizeof again, "bytes %llu-%llu/%llu", (unsigned long long)start,
             (unsigned long long)(start + len - 1), (unsigned long long)size);
    CHECK(lh_http_parse_content_range(again, &a, &b, &t) == LH_ERR_OK);
    CHECK(a == start && b == start + len - 1 && t == size);
  }
}

static void check_content_range(const char *value) {
  uint64_t a, b, t, a2, b2, t2;
  if (lh_http_parse_content_range(value, &a, &b, &t) != LH_ERR_OK) {
    CHECK(a == UINT64_MAX && b == UINT64_MAX && t == UINT64_MAX);
    CHECK(strncmp(lh_last_error(), "Content-Range: ", 15) == 0);
    return;
  }
  char again[80];
  if (a == UINT64_MAX) {
    CHECK(b == UINT64_MAX && t != UINT64_MAX);
    snprintf(again, sizeof again, "bytes */%llu", (unsigned long long)t);
  } else if (t == UINT64_MAX) {
    CHECK(a <= b);
    snprintf(again, sizeof again, "bytes %llu-%llu/*", (unsigned long long)a,
             (unsigned long long)b);
  } else {
    CHECK(a <= b && b < t);
    snprintf(again, sizeof again, "bytes %llu-%llu/%llu", (unsigned long long)a,
             (unsigned long long)b, (unsigned long long)t);
  }
  CHECK(lh_http_parse_content_range(again, &a2, &b2, &t2) == LH_ERR_OK);
  CHECK(a2 == a && b2 == b && t2 == t);
}

static void check_etag(const char *inm, const char *tag) {
  (void)lh_http_etag_match(inm, tag);
  (void)lh_http_etag_match(tag, inm);
  size_t n = strlen(tag);
  bool quoted = n >= 2 && tag[0] == '"' && tag[n - 1] == '"';
  for (size_t i = 1; quoted && i + 1 < n; i++)
    quoted = (unsigned char)tag[i] > 0x20 && tag[i] != 0x7f && tag[i] != '"';
  if (!quoted) return;
  char *weak = malloc(n + 3);
  CHECK(weak);
  snprintf(weak, n + 3, "W/%s", tag);
  CHECK(lh_http_etag_match(tag, tag));
  CHECK(lh_http_etag_match(weak, tag));
  CHECK(lh_http_etag_match("*", tag));
  free(weak);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint64_t content = 1000;
  if (size >= 8) {
    content = lh_get_le64(data);
    data += 8;
    size -= 8;
  }
  char *text = malloc(size + 1);
  CHECK(text);
  memcpy(text, data, size);
  text[size] = 0; /* the header value ends at its first NUL, as a C string does */
  char *nl = strchr(text, '\n');
  const char *tag = "";
  if (nl) {
    *nl = 0;
    tag = nl + 1;
  }
  check_range(text, content);
  check_range(text, 0);
  check_range(text, UINT64_MAX);
  check_content_range(text);
  check_etag(text, tag);
  free(text);
  return 0;
}
