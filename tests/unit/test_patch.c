/* Policy patches: the order-preserving image of bf16; round trips bit for bit on slabs with
 * steps of every size, sign changes through zero, infinities and NaN patterns, sections of any
 * tiling (empty ones included); an unchanged policy costs only the table; and every kind of
 * tampering refused with the weights left as they were: another parent, a flipped byte anywhere
 * in the header, the table or the payload, truncation, extra bytes, a wrong element count. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "longhaul/patch.h"
#include "longhaul/tensor.h"

static uint64_t rng = 88172645463325252ULL;
static uint64_t next(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

static void test_key_order(void **state) {
  (void)state;
  /* every non-NaN pair is ordered as floats; the map is a bijection */
  for (uint32_t b = 0; b < 65536; b++)
    assert_int_equal(lh_bf16_from_key(lh_bf16_key((uint16_t)b)), b);
  for (int t = 0; t < 200000; t++) {
    uint16_t a = (uint16_t)next(), b = (uint16_t)next();
    float fa = lh_f32_from_bf16(a), fb = lh_f32_from_bf16(b);
    if (isnan(fa) || isnan(fb) || fa == fb) continue;
    assert_int_equal(fa < fb, lh_bf16_key(a) < lh_bf16_key(b));
  }
  assert_int_equal(lh_bf16_key(0x0000), lh_bf16_key(0x8000) + 1); /* +0 just above -0 */
}

/* A parent of Gaussian-like weights and a child a few steps away where an update moved them:
 * mostly +-1, some larger, some across zero. */
static void make_pair(uint16_t *p, uint16_t *c, uint64_t n, double frac) {
  for (uint64_t i = 0; i < n; i++) {
    float w = (float)((double)(int64_t)(next() % 2000001 - 1000000) * 2e-8);
    if (i % 97 == 0) w = 0.0f;
    p[i] = lh_bf16_from_f32(w);
    c[i] = p[i];
    double u = (double)(next() % 1000000) / 1e6;
    if (u < frac) {
      int32_t k = lh_bf16_key(p[i]), step = next() % 10 ? 1 : (int32_t)(next() % 300) + 1;
      if (next() % 2) step = -step;
      if (k + step >= 0 && k + step <= 0xFFFF) c[i] = lh_bf16_from_key((uint16_t)(k + step));
    }
  }
  /* the corners of the image */
  if (n > 10) {
    p[1] = 0x7F80, c[1] = 0xFF80; /* +inf -> -inf: the whole range */
    p[2] = 0x7FC1, c[2] = 0x7FC0; /* NaN patterns */
    p[3] = 0x8000, c[3] = 0x0000; /* -0 -> +0 */
    p[4] = 0x0001, c[4] = 0x8001; /* tiny positive -> tiny negative */
  }
}

static uint8_t *make(const uint16_t *p, const uint16_t *c, uint64_t n, const lh_patch_section *s,
                     int ns, size_t *len) {
  uint8_t *out = NULL;
  lh_err e = lh_patch_make(p, c, n, s, ns, 3, 4, &out, len);
  if (e) fail_msg("lh_patch_make: %s", lh_last_error());
  return out;
}

static void test_round_trip(void **state) {
  (void)state;
  const uint64_t n = 200000;
  uint16_t *p = malloc(n * 2), *c = malloc(n * 2), *w = malloc(n * 2);
  double fracs[] = {0.0001, 0.01, 0.3, 1.0};
  for (int f = 0; f < 4; f++) {
    make_pair(p, c, n, fracs[f]);
    /* random tilings, with empty sections */
    for (int t = 0; t < 3; t++) {
      lh_patch_section s[40];
      int ns = 0;
      uint64_t at = 0;
      while (at < n && ns < 39) {
        uint64_t len = ns % 7 == 3 ? 0 : next() % (n / 8) + 1;
        if (len > n - at) len = n - at;
        s[ns++] = (lh_patch_section){at, len};
        at += len;
      }
      if (at < n) s[ns++] = (lh_patch_section){at, n - at};
      size_t len = 0;
      uint8_t *patch = make(p, c, n, s, ns, &len);
      lh_patch_info info;
      if (lh_patch_read_info(patch, len, &info)) fail_msg("read_info: %s", lh_last_error());
      uint64_t changed = 0;
      for (uint64_t i = 0; i < n; i++)
        changed += p[i] != c[i];
      assert_int_equal(info.total_changed, changed);
      assert_int_equal(info.n_sections, ns);
      assert_true(info.from_version == 3 && info.to_version == 4);
      lh_patch_info_free(&info);
      memcpy(w, p, n * 2);
      assert_int_equal(lh_patch_apply(w, n, patch, len, NULL), LH_ERR_OK);
      assert_memory_equal(w, c, n * 2);
      /* with the parent's hash given */
      uint8_t h[LH_HASH_BYTES];
      lh_patch_slab_hash(p, n, h);
      memcpy(w, p, n * 2);
      assert_int_equal(lh_patch_apply(w, n, patch, len, h), LH_ERR_OK);
      assert_memory_equal(w, c, n * 2);
      if (t == 0 && f == 1)
        printf("  %llu changes (%.2f%%): %zu bytes, %.2f bits per change\n",
               (unsigned long long)changed, 100.0 * (double)changed / (double)n, len,
               8.0 * (double)len / (double)changed);
      free(patch);
    }
  }
  /* nothing changed: the table alone */
  lh_patch_section one = {0, n};
  size_t len = 0;
  uint8_t *patch = make(p, p, n, &one, 1, &len);
  assert_int_equal(len, LH_PATCH_HEADER + LH_PATCH_SECTION);
  memcpy(w, p, n * 2);
  assert_int_equal(lh_patch_apply(w, n, patch, len, NULL), LH_ERR_OK);
  assert_memory_equal(w, p, n * 2);
  free(patch);
  free(p);
  free(c);
  free(w);
}

/* Gaps longer than one chunk of raw bits (2^18 unchanged values of one lane and exponent before
 * a change, and 2^20 after it): the bits below a gap's top bit come in chunks of 16. */
static void test_long_gaps(void **state) {
  (void)state;
  const uint64_t n = (uint64_t)1 << 22;
  uint16_t *p = malloc(n * 2), *c = malloc(n * 2), *w = malloc(n * 2);
  for (uint64_t i = 0; i < n; i++)
    p[i] = c[i] = (uint16_t)(0x3f80 + i % 128); /* one exponent */
  uint64_t at[3] = {((uint64_t)1 << 20) + 5, ((uint64_t)1 << 20) + 9, n - 3};
  for (int j = 0; j < 3; j++)
    c[at[j]] = (uint16_t)(c[at[j]] + (j == 1 ? 1000 : 1));
  lh_patch_section one = {0, n};
  size_t len = 0;
  uint8_t *patch = make(p, c, n, &one, 1, &len);
  assert_true(len < LH_PATCH_HEADER + LH_PATCH_SECTION + 40);
  memcpy(w, p, n * 2);
  assert_int_equal(lh_patch_decode_unchecked(w, n, patch, len), LH_ERR_OK);
  assert_memory_equal(w, c, n * 2);
  memcpy(w, p, n * 2);
  assert_int_equal(lh_patch_apply(w, n, patch, len, NULL), LH_ERR_OK);
  assert_memory_equal(w, c, n * 2);
  free(patch);
  free(p);
  free(c);
  free(w);
}

static void expect_refused(uint16_t *w, const uint16_t *p, uint64_t n, const uint8_t *patch,
                           size_t len, const uint8_t *hash) {
  memcpy(w, p, n * 2);
  lh_err e = lh_patch_apply(w, n, patch, len, hash);
  assert_int_not_equal(e, LH_ERR_OK);
  assert_memory_equal(w, p, n * 2); /* as it was */
}

static void test_tampering(void **state) {
  (void)state;
  const uint64_t n = 5000;
  uint16_t *p = malloc(n * 2), *c = malloc(n * 2), *w = malloc(n * 2);
  make_pair(p, c, n, 0.05);
  lh_patch_section s[3] = {{0, 1000}, {1000, 3000}, {4000, 1000}};
  size_t len = 0;
  uint8_t *patch = make(p, c, n, s, 3, &len);
  uint8_t *bad = malloc(len + 8);
  /* another parent */
  memcpy(w, p, n * 2);
  w[17] ^= 1;
  uint16_t *other = malloc(n * 2);
  memcpy(other, w, n * 2);
  assert_int_equal(lh_patch_apply(w, n, patch, len, NULL), LH_ERR_MISMATCH);
  assert_non_null(strstr(lh_last_error(), "made from version 3"));
  assert_memory_equal(w, other, n * 2);
  /* a wrong claimed parent hash */
  uint8_t h[LH_HASH_BYTES] = {1};
  expect_refused(w, p, n, patch, len, h);
  /* every byte flipped: refused (the hashes catch what the format does not), never a crash */
  int refused = 0;
  for (size_t k = 0; k < len; k++) {
    memcpy(bad, patch, len);
    bad[k] ^= (uint8_t)(1u << (k % 8));
    memcpy(w, p, n * 2);
    lh_err e = lh_patch_apply(w, n, bad, len, NULL);
    if (e == LH_ERR_OK) {
      /* only bits that do not change the result: the version labels (checked by the manifest,
       * not here) and flushed bytes of a section's coder that decoding never needs; the result
       * is then the child exactly (its hash was checked) */
      assert_memory_equal(w, c, n * 2);
      continue;
    }
    assert_memory_equal(w, p, n * 2);
    refused++;
  }
  assert_true(refused > (int)len * 9 / 10);
  /* truncated at every length, and one byte too many */
  for (size_t k = 0; k < len; k += k < LH_PATCH_HEADER + 3 * LH_PATCH_SECTION ? 1 : 7)
    expect_refused(w, p, n, patch, k, NULL);
  memcpy(bad, patch, len);
  bad[len] = 0;
  expect_refused(w, p, n, bad, len + 1, NULL);
  /* another format version: refused with both versions named */
  memcpy(bad, patch, len);
  bad[4] = 1;
  memcpy(w, p, n * 2);
  assert_int_equal(lh_patch_apply(w, n, bad, len, NULL), LH_ERR_UNSUPPORTED);
  assert_non_null(strstr(lh_last_error(), "format 1, this longhaul reads 2"));
  assert_memory_equal(w, p, n * 2);
  /* another element count */
  memcpy(w, p, n * 2);
  assert_int_equal(lh_patch_apply(w, n - 1, patch, len, NULL), LH_ERR_MISMATCH);
  /* sections that do not tile the slab are refused when making */
  lh_patch_section gap[2] = {{0, 1000}, {1001, 3999}};
  uint8_t *none = NULL;
  size_t nlen = 0;
  assert_int_equal(lh_patch_make(p, c, n, gap, 2, 0, 1, &none, &nlen), LH_ERR_FORMAT);
  assert_null(none);
  free(bad);
  free(other);
  free(patch);
  free(p);
  free(c);
  free(w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_key_order),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_long_gaps),
      cmocka_unit_test(test_tampering),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
