/* libFuzzer target for query strings (http.h): the first byte is an output capacity, the rest up
 * to a '\n' a key and what follows it a raw query. lh_http_query_get's result does not depend on
 * the capacity except through LH_ERR_LIMIT, which a larger buffer turns into the value; a value
 * found fits exactly in strlen + 1 bytes and not in fewer, and escaped again (lh_http_escape)
 * under its key it decodes to itself. The whole input escaped decodes to itself too. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/http.h"

#include "fuzz_util.h"

#define BIG 4096

static void check_get(const char *query, const char *key, size_t cap) {
  char *out = malloc(cap ? cap : 1), *big = malloc(BIG);
  CHECK(out && big);
  lh_err e = lh_http_query_get(query, key, out, cap);
  CHECK(e == LH_ERR_OK || e == LH_ERR_NOTFOUND || e == LH_ERR_FORMAT || e == LH_ERR_LIMIT);
  if (e != LH_ERR_OK) CHECK(strncmp(lh_last_error(), "query: ", 7) == 0);
  if (e != LH_ERR_OK && cap) CHECK(out[0] == 0);
  lh_err eb = lh_http_query_get(query, key, big, BIG);
  if (e == LH_ERR_LIMIT) {
    CHECK(eb == LH_ERR_OK || eb == LH_ERR_LIMIT);
    if (eb == LH_ERR_OK) CHECK(strlen(big) + 1 > cap);
  } else {
    CHECK(eb == e);
  }
  if (e == LH_ERR_OK) {
    size_t n = strlen(out);
    CHECK(n < cap && strcmp(out, big) == 0);
    CHECK(lh_http_query_get(query, key, out, n + 1) == LH_ERR_OK && strlen(out) == n);
    CHECK(lh_http_query_get(query, key, out, n) == LH_ERR_LIMIT);
  }
  if (eb == LH_ERR_OK) { /* KEY=VALUE escaped again reads back the same */
    size_t kn = strlen(key), vn = strlen(big), qcap = 3 * (kn + vn) + 2;
    char *q = malloc(qcap), *back = malloc(vn + 1);
    CHECK(q && back);
    CHECK(lh_http_escape(key, kn, q, qcap) == LH_ERR_OK);
    size_t at = strlen(q);
    q[at++] = '=';
    CHECK(lh_http_escape(big, vn, q + at, qcap - at) == LH_ERR_OK);
    CHECK(lh_http_query_get(q, key, back, vn + 1) == LH_ERR_OK && strcmp(back, big) == 0);
    free(q);
    free(back);
  }
  free(out);
  free(big);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t cap = data[0];
  char *text = malloc(size);
  CHECK(text);
  memcpy(text, data + 1, size - 1);
  text[size - 1] = 0; /* both strings end at the first NUL, as C strings do */
  char *nl = strchr(text, '\n');
  const char *query = "";
  if (nl) {
    *nl = 0;
    query = nl + 1;
  }
  check_get(query, text, cap);
  check_get(text, "a", cap);
  /* any bytes escape into a query value that decodes to them (no NUL: C strings) */
  size_t n = strlen(text), ecap = 3 * n + 3;
  char *enc = malloc(ecap), *dec = malloc(n + 1);
  CHECK(enc && dec);
  enc[0] = 'v';
  enc[1] = '=';
  CHECK(lh_http_escape(text, n, enc + 2, ecap - 2) == LH_ERR_OK);
  size_t m = strlen(enc + 2);
  CHECK(m >= n && m <= 3 * n);
  CHECK(strspn(enc + 2, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~%") ==
        m);
  CHECK(lh_http_query_get(enc, "v", dec, n + 1) == LH_ERR_OK && strcmp(dec, text) == 0);
  /* it needs exactly m + 1 bytes */
  CHECK(lh_http_escape(text, n, enc, m + 1) == LH_ERR_OK && strlen(enc) == m);
  CHECK(lh_http_escape(text, n, enc, m) == LH_ERR_LIMIT && (m == 0 || enc[0] == 0));
  free(enc);
  free(dec);
  free(text);
  return 0;
}
