/* longhaul net: the pure parsers of the HTTP layer (http.h): Range, Content-Range, If-None-Match
 * and query strings, and percent-encoding. Outside bytes only; every read is bounded by the
 * string's NUL or the caller's cap, nothing allocates, nothing aborts (fuzz_range, fuzz_query). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "longhaul/http.h"

static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

static bool is_ows(char c) {
  return c == ' ' || c == '\t';
}

/* Reads 1 or more decimal digits at *p, saturating at UINT64_MAX; false when there are none. */
static bool read_u64(const char **p, uint64_t *v) {
  const char *s = *p;
  uint64_t x = 0;
  if (!is_digit(*s)) return false;
  for (; is_digit(*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    x = x > (UINT64_MAX - d) / 10 ? UINT64_MAX : x * 10 + d;
  }
  *p = s;
  *v = x;
  return true;
}

/* ---------------------------------------------------------------- Range */

/* One range-spec in s[0, n): 1 satisfiable (*start, *len), 0 unsatisfiable, -1 malformed. */
static int range_spec(const char *s, size_t n, uint64_t size, uint64_t *start, uint64_t *len) {
  const char *p = s, *end = s + n;
  uint64_t a, b;
  if (*p == '-') { /* suffix-range: the last N bytes */
    p++;
    if (!read_u64(&p, &b) || p != end) return -1;
    if (b == 0 || size == 0) return 0;
    *len = b < size ? b : size;
    *start = size - *len;
    return 1;
  }
  if (!read_u64(&p, &a) || p == end || *p != '-') return -1;
  p++;
  if (p == end) {
    b = UINT64_MAX;
  } else {
    if (!read_u64(&p, &b) || p != end) return -1;
    if (a > b) return -1;
  }
  if (a >= size) return 0;
  *start = a;
  *len = (b >= size - 1 ? size - 1 : b) - a + 1;
  return 1;
}

lh_http_range lh_http_parse_range(const char *value, uint64_t size, uint64_t *start,
                                  uint64_t *len) {
  *start = 0;
  *len = size;
  if (!value) return LH_HTTP_RANGE_WHOLE;
  if (strncasecmp(value, "bytes=", 6) != 0) return LH_HTTP_RANGE_MALFORMED;
  const char *p = value + 6;
  int specs = 0, satisfiable = 0;
  uint64_t s0 = 0, l0 = 0;
  while (*p) {
    while (is_ows(*p))
      p++;
    const char *e = p;
    while (*e && *e != ',' && !is_ows(*e))
      e++;
    const char *q = e;
    while (is_ows(*q))
      q++;
    if (*q && *q != ',') return LH_HTTP_RANGE_MALFORMED; /* a space inside a range-spec */
    if (e > p) {                                         /* empty list elements are skipped */
      uint64_t s = 0, l = 0;
      int r = range_spec(p, (size_t)(e - p), size, &s, &l);
      if (r < 0) return LH_HTTP_RANGE_MALFORMED;
      if (r > 0 && satisfiable++ == 0) s0 = s, l0 = l;
      specs++;
    }
    p = *q ? q + 1 : q;
  }
  if (specs == 0) return LH_HTTP_RANGE_MALFORMED;
  if (satisfiable == 0) {
    *len = 0;
    return LH_HTTP_RANGE_UNSATISFIABLE;
  }
  if (specs > 1) return LH_HTTP_RANGE_WHOLE;
  *start = s0;
  *len = l0;
  return LH_HTTP_RANGE_ONE;
}

/* ---------------------------------------------------------------- Content-Range */

/* Decimal digits at *p below UINT64_MAX (which stands for "unknown"); false on none or more. */
static bool read_u64_exact(const char **p, uint64_t *v) {
  return read_u64(p, v) && *v != UINT64_MAX;
}

lh_err lh_http_parse_content_range(const char *value, uint64_t *start, uint64_t *end,
                                   uint64_t *total) {
  const char *p = value;
  *start = *end = *total = UINT64_MAX;
  if (!p) return lh_errorf(LH_ERR_FORMAT, "Content-Range: missing");
  if (strncasecmp(p, "bytes ", 6) != 0) goto bad;
  p += 6;
  bool star = *p == '*';
  if (star) {
    p++;
  } else if (!read_u64_exact(&p, start) || *p++ != '-' || !read_u64_exact(&p, end) ||
             *start > *end) {
    goto bad;
  }
  if (*p++ != '/') goto bad;
  if (*p == '*' && !star) {
    p++;
  } else if (!read_u64_exact(&p, total) || (!star && *end >= *total)) {
    goto bad;
  }
  if (*p) goto bad;
  return LH_ERR_OK;
bad:
  *start = *end = *total = UINT64_MAX;
  char shown[96];
  lh_escape(value, strnlen(value, 256), shown, sizeof shown);
  return lh_errorf(LH_ERR_FORMAT,
                   "Content-Range: expected \"bytes START-END/TOTAL\" or \"bytes */TOTAL\", "
                   "found \"%s\"",
                   shown);
}

/* ---------------------------------------------------------------- If-None-Match */

/* An entity-tag at *p ('W/' optional, then a quoted string of etagc); its opaque part without
 * quotes in [*o, *o + *n). */
static bool read_etag(const char **p, const char **o, size_t *n) {
  const char *s = *p;
  if (s[0] == 'W' && s[1] == '/') s += 2;
  if (*s != '"') return false;
  const char *b = ++s;
  while (*s && *s != '"') {
    unsigned char c = (unsigned char)*s;
    if (c < 0x21 || c == 0x7f) return false;
    s++;
  }
  if (*s != '"') return false;
  *o = b;
  *n = (size_t)(s - b);
  *p = s + 1;
  return true;
}

bool lh_http_etag_match(const char *if_none_match, const char *etag) {
  const char *p = if_none_match, *want, *o;
  size_t wn, n;
  if (!p || !etag || !read_etag(&etag, &want, &wn)) return false;
  while (is_ows(*p))
    p++;
  if (p[0] == '*') {
    p++;
    while (is_ows(*p))
      p++;
    return *p == 0;
  }
  bool match = false;
  while (*p) {
    if (*p == ',') {
      p++;
      while (is_ows(*p))
        p++;
      continue;
    }
    if (!read_etag(&p, &o, &n)) return false;
    match |= n == wn && memcmp(o, want, n) == 0;
    while (is_ows(*p))
      p++;
    if (*p && *p != ',') return false;
  }
  return match;
}

/* ---------------------------------------------------------------- queries */

static int hex_val(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The byte that q[*i] starts (advancing *i), or -1 for a bad escape. */
static int decode_byte(const char *q, size_t *i) {
  char c = q[*i];
  if (c == '+') {
    (*i)++;
    return ' ';
  }
  if (c != '%') {
    (*i)++;
    return (unsigned char)c;
  }
  int hi = hex_val(q[*i + 1]), lo = hi < 0 ? -1 : hex_val(q[*i + 2]);
  if (lo < 0) return -1;
  *i += 3;
  return hi * 16 + lo;
}

/* Whether the key part q[i, end) decodes to `key` exactly; -1 for a bad escape. */
static int key_equals(const char *q, size_t i, size_t end, const char *key, size_t *bad_at) {
  size_t k = 0;
  bool same = true;
  while (i < end) {
    size_t at = i;
    int b = decode_byte(q, &i);
    if (b < 0 || i > end) {
      *bad_at = at;
      return -1;
    }
    if (same && (key[k] == 0 || (unsigned char)key[k] != b)) same = false;
    if (same) k++;
  }
  return same && key[k] == 0;
}

static lh_err bad_escape(size_t at) {
  return lh_errorf(LH_ERR_FORMAT,
                   "query: bad percent-escape at byte %zu (expected %%XX with two hex digits)", at);
}

lh_err lh_http_query_get(const char *query, const char *key, char *out, size_t cap) {
  char shown[64];
  lh_escape(key, strlen(key), shown, sizeof shown);
  if (cap) out[0] = 0;
  size_t i = 0, found = SIZE_MAX, vstart = 0, vend = 0;
  while (query[i]) { /* one pair [start, end) per turn; its key ends at kend */
    size_t start = i, kend = SIZE_MAX, bad = 0;
    while (query[i] && query[i] != '&') {
      if (query[i] == '=' && kend == SIZE_MAX) kend = i;
      i++;
    }
    size_t end = i;
    if (query[i] == '&') i++;
    if (end == start) continue; /* an empty pair ("a=1&&b=2") */
    size_t v0 = kend == SIZE_MAX ? end : kend + 1;
    if (kend == SIZE_MAX) kend = end;
    int same = key_equals(query, start, kend, key, &bad);
    if (same < 0) return bad_escape(bad);
    for (size_t j = v0; j < end;) { /* every value must decode, not only the one asked for */
      bad = j;
      if (decode_byte(query, &j) < 0 || j > end) return bad_escape(bad);
    }
    if (!same) continue;
    if (found != SIZE_MAX)
      return lh_errorf(LH_ERR_FORMAT, "query: key \"%s\" given twice (at bytes %zu and %zu)", shown,
                       found, start);
    found = start;
    vstart = v0;
    vend = end;
  }
  if (found == SIZE_MAX) return lh_errorf(LH_ERR_NOTFOUND, "query: no key \"%s\"", shown);
  size_t n = 0;
  for (size_t j = vstart; j < vend; n++) /* the length, and no NUL, whatever cap is */
    if (decode_byte(query, &j) == 0)
      return lh_errorf(LH_ERR_FORMAT, "query: the value of \"%s\" holds a NUL byte (%%00)", shown);
  if (n >= cap)
    return lh_errorf(LH_ERR_LIMIT, "query: the value of \"%s\" is longer than %zu bytes", shown,
                     cap ? cap - 1 : 0);
  n = 0;
  for (size_t j = vstart; j < vend;)
    out[n++] = (char)decode_byte(query, &j);
  out[n] = 0;
  return LH_ERR_OK;
}

lh_err lh_http_escape(const void *s, size_t n, char *out, size_t cap) {
  static const char hex[] = "0123456789ABCDEF";
  const unsigned char *b = s;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = b[i];
    bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '.' || c == '_' || c == '~';
    size_t need = keep ? 1 : 3;
    if (o + need >= cap) {
      if (cap) out[0] = 0;
      return lh_errorf(LH_ERR_LIMIT, "escape: %zu bytes do not fit in %zu once percent-encoded", n,
                       cap);
    }
    if (keep) {
      out[o++] = (char)c;
    } else {
      out[o++] = '%';
      out[o++] = hex[c >> 4];
      out[o++] = hex[c & 15];
    }
  }
  if (o >= cap) return lh_errorf(LH_ERR_LIMIT, "escape: nothing fits in a buffer of 0 bytes");
  out[o] = 0;
  return LH_ERR_OK;
}
