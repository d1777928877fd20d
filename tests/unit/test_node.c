/* The networked protocol's codecs (node.h): a signed request verifies, and changing any signed
 * part (method, path, query, body, key, time, nonce) makes it fail; malformed headers are named;
 * an Ed25519 signature made with libsodium directly over the documented bytes verifies (the
 * format, not just our own round trip); lease requests and replies round-trip and their bounds
 * are refused with the field named. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include "longhaul/node.h"

static lh_sync_secret_key key(uint8_t b) {
  uint8_t seed[LH_SYNC_SEED_BYTES];
  memset(seed, b, sizeof seed);
  lh_sync_secret_key sk;
  lh_sync_key_from_seed(seed, &sk);
  return sk;
}

static lh_err verify_text(const lh_node_auth_text *t, const char *method, const char *path,
                          const void *body, size_t len) {
  lh_node_auth a;
  lh_err e = lh_node_auth_parse(t->key, t->time, t->nonce, t->signature, &a);
  return e ? e : lh_node_auth_verify(&a, method, path, body, len);
}

static void test_sign_verify(void **state) {
  (void)state;
  lh_sync_secret_key sk = key(7);
  const char body[] = "{\"groups\":2,\"version\":5}";
  lh_node_auth_text t;
  lh_node_sign(&sk, "POST", "/v1/leases", body, strlen(body), 1764612345678, &t);
  assert_int_equal(verify_text(&t, "POST", "/v1/leases", body, strlen(body)), LH_ERR_OK);
  assert_string_equal(t.time, "1764612345678");
  /* every signed part matters */
  assert_int_equal(verify_text(&t, "GET", "/v1/leases", body, strlen(body)), LH_ERR_SIGNATURE);
  assert_int_equal(verify_text(&t, "POST", "/v1/leases?x=1", body, strlen(body)), LH_ERR_SIGNATURE);
  assert_int_equal(verify_text(&t, "POST", "/v1/leases", body, strlen(body) - 1), LH_ERR_SIGNATURE);
  lh_node_auth_text u = t;
  u.time[0] = u.time[0] == '1' ? '2' : '1';
  assert_int_equal(verify_text(&u, "POST", "/v1/leases", body, strlen(body)), LH_ERR_SIGNATURE);
  u = t;
  u.nonce[0] = u.nonce[0] == 'a' ? 'b' : 'a';
  assert_int_equal(verify_text(&u, "POST", "/v1/leases", body, strlen(body)), LH_ERR_SIGNATURE);
  lh_sync_secret_key other = key(8);
  lh_sync_public_key opk;
  lh_sync_key_public(&other, &opk);
  u = t;
  for (int i = 0; i < LH_SYNC_PUBLIC_KEY_BYTES; i++)
    snprintf(u.key + 2 * i, 3, "%02x", opk.bytes[i]);
  assert_int_equal(verify_text(&u, "POST", "/v1/leases", body, strlen(body)), LH_ERR_SIGNATURE);
  /* two signatures of one request differ in their nonce */
  lh_node_auth_text t2;
  lh_node_sign(&sk, "POST", "/v1/leases", body, strlen(body), 1764612345678, &t2);
  assert_string_not_equal(t.nonce, t2.nonce);
}

/* The bytes of docs/PROTOCOL.md, "Signed requests", signed with libsodium directly. */
static void test_documented_bytes(void **state) {
  (void)state;
  assert_true(sodium_init() >= 0);
  lh_sync_secret_key sk = key(9);
  lh_sync_public_key pk;
  lh_sync_key_public(&sk, &pk);
  const char *body = "abc";
  uint8_t h[32];
  crypto_generichash(h, sizeof h, (const unsigned char *)body, 3, NULL, 0);
  char hh[65], kh[65], msg[512];
  for (int i = 0; i < 32; i++) {
    snprintf(hh + 2 * i, 3, "%02x", h[i]);
    snprintf(kh + 2 * i, 3, "%02x", pk.bytes[i]);
  }
  const char *nonce = "00112233445566778899aabbccddeeff";
  int n = snprintf(msg, sizeof msg,
                   "longhaul-request-v1\nPOST\n/v1/rollouts?lease=3&group=17\n%s\n%s\n42\n%s\n", hh,
                   kh, nonce);
  uint8_t sig[64];
  crypto_sign_detached(sig, NULL, (const unsigned char *)msg, (unsigned long long)n, sk.sk);
  char sh[129];
  for (int i = 0; i < 64; i++)
    snprintf(sh + 2 * i, 3, "%02x", sig[i]);
  lh_node_auth a;
  assert_int_equal(lh_node_auth_parse(kh, "42", nonce, sh, &a), LH_ERR_OK);
  assert_int_equal(lh_node_auth_verify(&a, "POST", "/v1/rollouts?lease=3&group=17", body, 3),
                   LH_ERR_OK);
}

static void test_auth_refusals(void **state) {
  (void)state;
  lh_sync_secret_key sk = key(7);
  lh_node_auth_text t;
  lh_node_sign(&sk, "POST", "/v1/workers", "", 0, 5, &t);
  lh_node_auth a;
#define BAD(k, tm, n, s, header)                                                                   \
  do {                                                                                             \
    assert_int_equal(lh_node_auth_parse(k, tm, n, s, &a), LH_ERR_FORMAT);                          \
    assert_non_null(strstr(lh_last_error(), header));                                              \
  } while (0)
  BAD(NULL, t.time, t.nonce, t.signature, LH_NODE_HDR_KEY);
  BAD(t.key, NULL, t.nonce, t.signature, LH_NODE_HDR_TIME);
  BAD(t.key, t.time, NULL, t.signature, LH_NODE_HDR_NONCE);
  BAD(t.key, t.time, t.nonce, NULL, LH_NODE_HDR_SIGNATURE);
  char upper[sizeof t.key];
  memcpy(upper, t.key, sizeof upper);
  for (char *p = upper; *p; p++)
    if (*p >= 'a' && *p <= 'f') *p = (char)(*p - 32);
  if (strcmp(upper, t.key)) BAD(upper, t.time, t.nonce, t.signature, LH_NODE_HDR_KEY);
  BAD("abc", t.time, t.nonce, t.signature, LH_NODE_HDR_KEY);
  BAD(t.key, "-5", t.nonce, t.signature, LH_NODE_HDR_TIME);
  BAD(t.key, "05", t.nonce, t.signature, LH_NODE_HDR_TIME);
  BAD(t.key, "12x", t.nonce, t.signature, LH_NODE_HDR_TIME);
  BAD(t.key, "99999999999999999", t.nonce, t.signature, LH_NODE_HDR_TIME);
  BAD(t.key, "", t.nonce, t.signature, LH_NODE_HDR_TIME);
#undef BAD
  assert_int_equal(lh_node_auth_parse(t.key, t.time, t.nonce, t.signature, &a), LH_ERR_OK);
  assert_int_equal(a.time_ms, 5);
}

static void test_lease_codecs(void **state) {
  (void)state;
  lh_node_lease_request lr;
  const char *ok = "{\"groups\":3,\"version\":-1}";
  assert_int_equal(lh_node_lease_request_parse(ok, strlen(ok), &lr), LH_ERR_OK);
  assert_true(lr.groups == 3 && lr.version == -1);
  const char *bad[] = {"{\"groups\":0,\"version\":1}",
                       "{\"groups\":65,\"version\":1}",
                       "{\"groups\":1}",
                       "{\"groups\":1,\"version\":1,\"x\":1}",
                       "[1]",
                       "{",
                       "{\"groups\":1.5,\"version\":1}",
                       "{\"groups\":1,\"version\":-2}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal(lh_node_lease_request_parse(bad[i], strlen(bad[i]), &lr), LH_ERR_FORMAT);
  char big[LH_NODE_LEASE_REQUEST_MAX + 2];
  memset(big, ' ', sizeof big);
  assert_int_equal(lh_node_lease_request_parse(big, sizeof big, &lr), LH_ERR_LIMIT);

  int32_t prompt[3] = {1, 20, 31};
  lh_node_group g = {
      17, 42, prompt, 3, 8, ((uint64_t)1 << 53) - 1, 12345, 32, {0.75f, 5, 0.5f, 0.25f}, 12};
  lh_node_lease l = {3, 1764612345678, 1, &g};
  size_t len = 0;
  char *text = lh_node_lease_json(&l, &len);
  lh_node_lease back;
  assert_int_equal(lh_node_lease_parse(text, len, 99, &back), LH_ERR_OK);
  assert_true(back.lease == 3 && back.expires_ms == 1764612345678 && back.n_groups == 1);
  const lh_node_group *b = &back.groups[0];
  assert_true(b->group == 17 && b->task == 42 && b->prompt_len == 3 && b->group_size == 8);
  assert_true(b->seed == g.seed && b->stream_base == 12345 && b->max_new == 32);
  assert_true(b->min_version == 12 && b->sample.top_k == 5);
  assert_true(b->sample.temperature == 0.75f && b->sample.top_p == 0.5f &&
              b->sample.min_p == 0.25f);
  assert_memory_equal(b->prompt, prompt, sizeof prompt);
  lh_node_lease_clear(&back);
  /* a token outside the vocabulary, and an empty group list, are refused by name */
  assert_int_equal(lh_node_lease_parse(text, len, 31, &back), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "prompt token 2"));
  free(text);
  const char *none = "{\"lease\":1,\"expires_ms\":1,\"groups\":[]}";
  assert_int_equal(lh_node_lease_parse(none, strlen(none), 99, &back), LH_ERR_FORMAT);
  lh_node_lease_clear(&back);
  lh_node_lease_clear(NULL);
}

/* The worker's submission round trips: quantiles are the upper edges of quarter-octave
 * buckets (10 ms lands in [9.6, 10.3), 1000 ms in [860, 1023)). */
static void test_rtt_quantiles(void **state) {
  (void)state;
  lh_worker_result r;
  memset(&r, 0, sizeof r);
  assert_true(lh_worker_rtt_quantile(&r, 0.5) == -1);
  r.submit_rtt[13] = 9; /* 10 ms: 4 log2(11) = 13.8 */
  r.submit_rtt[39] = 1; /* 1000 ms: 4 log2(1001) = 39.9 */
  assert_true(fabs(lh_worker_rtt_quantile(&r, 0.5) - (exp2(3.5) - 1)) < 1e-9);
  assert_true(fabs(lh_worker_rtt_quantile(&r, 0.9) - (exp2(3.5) - 1)) < 1e-9);
  assert_true(fabs(lh_worker_rtt_quantile(&r, 1.0) - 1023) < 1e-9);
}

/* serve's lease window follows what keeps the trainer fed, not the staleness bound: two updates'
 * worth queued, and the updates a lease's time out covers. */
static void test_lease_window(void **state) {
  (void)state;
  assert_int_equal(lh_serve_lease_window(16, 0, 0.25), 64);    /* not measured yet: 4 updates */
  assert_int_equal(lh_serve_lease_window(16, 0.8, 0), 64);     /* nor here */
  assert_int_equal(lh_serve_lease_window(16, 0.05, 0.25), 48); /* a near worker: 2 + 1 */
  assert_int_equal(lh_serve_lease_window(16, 0.75, 0.25), 80); /* 3 updates while out: 2 + 3 */
  assert_int_equal(lh_serve_lease_window(16, 0.76, 0.25), 96); /* rounded up: 2 + 4 */
  assert_int_equal(lh_serve_lease_window(16, 2.0, 30.0), 48);  /* a slow trainer: 2 + 1 */
  /* a lease out for minutes against a fast trainer: at most LH_SERVE_WINDOW_UPDATES' worth */
  assert_int_equal(lh_serve_lease_window(4, 600, 0.1), 4 * LH_SERVE_WINDOW_UPDATES);
}

/* A lease is refused at two updates' worth queued, or at the lease window queued and out. */
static void test_lease_full(void **state) {
  (void)state;
  /* lease 0.5 s, update 0.25 s: a window of 16 x (2 + 2) = 64 */
  assert_false(lh_serve_lease_full(0, 0, 16, 0.5, 0.25));
  assert_false(lh_serve_lease_full(16, 0, 16, 0.5, 0.25)); /* one update queued: lease more */
  assert_false(lh_serve_lease_full(31, 0, 16, 0.5, 0.25));
  assert_true(lh_serve_lease_full(32, 0, 16, 0.5, 0.25)); /* two updates queued */
  assert_false(lh_serve_lease_full(31, 32, 16, 0.5, 0.25));
  assert_true(lh_serve_lease_full(0, 64, 16, 0.5, 0.25)); /* the window, all of it out */
  assert_true(lh_serve_lease_full(16, 48, 16, 0.5, 0.25));
  assert_false(lh_serve_lease_full(16, 47, 16, 0.5, 0.25));
}

/* The staleness bound is what --max-kept-mb holds: K + 1 versions of 2-byte weights. */
static void test_staleness_bound(void **state) {
  (void)state;
  assert_int_equal(lh_serve_staleness_bound(16, 800000, 4096), 16); /* the tiny model: 1.6 MB */
  /* Qwen2.5-0.5B (494M parameters, 988 MB a version): 4 versions fit in 4096 MB */
  assert_int_equal(lh_serve_staleness_bound(16, 494032768, 4096), 3);
  assert_int_equal(lh_serve_staleness_bound(16, 494032768, 17 * 988.1), 16);
  assert_int_equal(lh_serve_staleness_bound(16, 494032768, 989), 0);  /* the newest only */
  assert_int_equal(lh_serve_staleness_bound(16, 494032768, 900), -1); /* not even that */
  assert_int_equal(lh_serve_staleness_bound(2, 1000000, 1000), 2); /* never above the bound asked */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sign_verify),   cmocka_unit_test(test_documented_bytes),
      cmocka_unit_test(test_auth_refusals), cmocka_unit_test(test_lease_codecs),
      cmocka_unit_test(test_rtt_quantiles), cmocka_unit_test(test_lease_window),
      cmocka_unit_test(test_lease_full),    cmocka_unit_test(test_staleness_bound),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
