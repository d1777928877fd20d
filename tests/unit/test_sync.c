/* The sync module: key files (round trip, every kind of bad line refused by name, modes on disk,
 * no key replaced without force), signed manifests (round trip, deterministic bytes equal to an
 * independent Python signer's fixture, every one-byte change refused, each refusal with its own
 * code and words), snapshots (round trip, the documented byte planes, a Python-made fixture
 * decoded, truncation and every flipped byte refused), the blob store (verified reads, missing,
 * corrupted, oversized, repaired by put) and planning (hand-built graphs and a brute-force check
 * of optimality on random ones) with the keyframe rule, and rebuilding a range of versions from a
 * blob store in one pass (no blob read twice). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <dirent.h>
#include <zstd.h>

#include "longhaul/patch.h"
#include "longhaul/sync.h"

#ifndef LH_SOURCE_DIR
#define LH_SOURCE_DIR "."
#endif
#define FIXTURES LH_SOURCE_DIR "/tests/fixtures/sync"

static void expect_err(lh_err e, lh_err code, const char *needle) {
  if (e != code || !strstr(lh_last_error(), needle))
    fail_msg("expected %s with \"%s\", got %s: %s", lh_err_name(code), needle, lh_err_name(e),
             lh_last_error());
}

static char *read_all(const char *path, size_t *len) {
  char *buf = NULL;
  lh_err e = lh_file_read(path, 1 << 24, &buf, len);
  if (e) fail_msg("%s", lh_last_error());
  return buf;
}

static void make_tmpdir(char *dir, size_t cap) {
  snprintf(dir, cap, "%s/lh_test_sync.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  assert_non_null(mkdtemp(dir));
}

static void rm_rf(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char *p = lh_path_join(dir, e->d_name);
    unlink(p);
    free(p);
  }
  closedir(d);
  rmdir(dir);
}

static int count_files(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

static void seed_key(uint8_t tag, lh_sync_secret_key *sk) {
  uint8_t seed[LH_SYNC_SEED_BYTES];
  for (int i = 0; i < LH_SYNC_SEED_BYTES; i++)
    seed[i] = (uint8_t)(tag * 31 + i);
  lh_sync_key_from_seed(seed, sk);
}

/* ---------------------------------------------------------------- keys */

static void test_key_text(void **state) {
  (void)state;
  lh_sync_secret_key sk, back;
  lh_sync_public_key pk, pback;
  seed_key(1, &sk);
  lh_sync_key_public(&sk, &pk);
  char line[LH_SYNC_KEY_TEXT_BYTES + 1];
  lh_sync_secret_key_text(&sk, line);
  assert_int_equal(strlen(line), LH_SYNC_KEY_TEXT_BYTES - 1);
  assert_int_equal(strncmp(line, LH_SYNC_SECRET_KEY_PREFIX, 27), 0);
  /* the secret line is the seed's hex: bytes 1*31+0 = 0x1f, 0x20, ... */
  assert_int_equal(strncmp(line + 27, "1f2021", 6), 0);
  assert_int_equal(lh_sync_secret_key_parse(line, strlen(line), "k", &back), LH_ERR_OK);
  assert_memory_equal(back.sk, sk.sk, sizeof sk.sk);
  strcat(line, "\n"); /* one final newline is allowed */
  assert_int_equal(lh_sync_secret_key_parse(line, strlen(line), "k", &back), LH_ERR_OK);
  assert_memory_equal(back.sk, sk.sk, sizeof sk.sk);
  lh_sync_public_key_text(&pk, line);
  assert_int_equal(lh_sync_public_key_parse(line, strlen(line), "p", &pback), LH_ERR_OK);
  assert_memory_equal(pback.bytes, pk.bytes, sizeof pk.bytes);
  /* two seeds, two keys; keygen gives a fresh one each time */
  lh_sync_secret_key other, r1, r2;
  seed_key(2, &other);
  assert_memory_not_equal(other.sk, sk.sk, sizeof sk.sk);
  assert_int_equal(lh_sync_keygen(&r1), LH_ERR_OK);
  assert_int_equal(lh_sync_keygen(&r2), LH_ERR_OK);
  assert_memory_not_equal(r1.sk, r2.sk, sizeof r1.sk);
  lh_sync_secret_key_wipe(&r1);
  uint8_t zero[sizeof r1.sk] = {0};
  assert_memory_equal(r1.sk, zero, sizeof zero);
}

static void test_key_refusals(void **state) {
  (void)state;
  lh_sync_secret_key sk;
  lh_sync_public_key pk;
  seed_key(1, &sk);
  lh_sync_key_public(&sk, &pk);
  char pub[LH_SYNC_KEY_TEXT_BYTES + 8], sec[LH_SYNC_KEY_TEXT_BYTES + 8], t[200];
  lh_sync_public_key_text(&pk, pub);
  lh_sync_secret_key_text(&sk, sec);
  expect_err(lh_sync_public_key_parse("", 0, "p.pub", &pk), LH_ERR_FORMAT, "p.pub: empty");
  /* the wrong kind of key, both ways */
  expect_err(lh_sync_public_key_parse(sec, strlen(sec), "p", &pk), LH_ERR_FORMAT,
             "this is a secret key");
  expect_err(lh_sync_secret_key_parse(pub, strlen(pub), "s", &sk), LH_ERR_FORMAT,
             "this is a public key");
  expect_err(lh_sync_public_key_parse("ssh-ed25519 AAAA", 16, "p", &pk), LH_ERR_FORMAT,
             "expected a line starting \"longhaul-ed25519-public-v1 \", found \"ssh-ed25519");
  /* uppercase hex, at its byte offset */
  snprintf(t, sizeof t, "%s", pub);
  t[30] = (char)(t[30] >= 'a' ? t[30] - 32 : 'G');
  expect_err(lh_sync_public_key_parse(t, strlen(t), "p", &pk), LH_ERR_FORMAT, "byte 30 is \"");
  /* one digit short, one too many */
  expect_err(lh_sync_public_key_parse(pub, strlen(pub) - 1, "p", &pk), LH_ERR_FORMAT,
             "expected 64 lowercase hex digits, found 63 bytes");
  snprintf(t, sizeof t, "%s0", pub);
  expect_err(lh_sync_public_key_parse(t, strlen(t), "p", &pk), LH_ERR_FORMAT, "found 65 bytes");
  snprintf(t, sizeof t, "%s\r\n", pub);
  expect_err(lh_sync_public_key_parse(t, strlen(t), "p", &pk), LH_ERR_FORMAT, "\\r\\n");
  snprintf(t, sizeof t, "%s\n%s\n", pub, pub);
  expect_err(lh_sync_public_key_parse(t, strlen(t), "p", &pk), LH_ERR_FORMAT, "more than one line");
  snprintf(t, sizeof t, "%s\n\n", pub);
  expect_err(lh_sync_public_key_parse(t, strlen(t), "p", &pk), LH_ERR_FORMAT, "more than one line");
  snprintf(t, sizeof t, " %s", pub);
  expect_err(lh_sync_public_key_parse(t, strlen(t), "p", &pk), LH_ERR_FORMAT, "expected a line");
  /* the identity point (y = 1) is a well-formed line but not a usable public key */
  snprintf(t, sizeof t, "%s01%062d", LH_SYNC_PUBLIC_KEY_PREFIX, 0);
  expect_err(lh_sync_public_key_parse(t, strlen(t), "p", &pk), LH_ERR_FORMAT,
             "not a valid Ed25519 public key");
}

static void test_key_files(void **state) {
  (void)state;
  char dir[256];
  make_tmpdir(dir, sizeof dir);
  char *path = lh_path_join(dir, "trainer.key"), *pub = lh_path_join(dir, "trainer.key.pub");
  lh_sync_secret_key sk, other, back;
  lh_sync_public_key pk, pback;
  seed_key(3, &sk);
  seed_key(4, &other);
  lh_sync_key_public(&sk, &pk);
  assert_int_equal(lh_sync_keys_write(path, &sk, false), LH_ERR_OK);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(stat(pub, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0644);
  assert_int_equal(count_files(dir), 2); /* no temporary file left */
  size_t len = 0;
  char *text = read_all(pub, &len);
  char line[LH_SYNC_KEY_TEXT_BYTES];
  lh_sync_public_key_text(&pk, line);
  assert_int_equal(len, strlen(line) + 1);
  assert_memory_equal(text, line, strlen(line));
  assert_int_equal(text[len - 1], '\n');
  free(text);
  assert_int_equal(lh_sync_secret_key_load(path, &back), LH_ERR_OK);
  assert_memory_equal(back.sk, sk.sk, sizeof sk.sk);
  assert_int_equal(lh_sync_public_key_load(pub, &pback), LH_ERR_OK);
  assert_memory_equal(pback.bytes, pk.bytes, sizeof pk.bytes);
  /* never replaced without force: both files keep the first key */
  expect_err(lh_sync_keys_write(path, &other, false), LH_ERR_INVAL, "exists; not replacing");
  unlink(path);
  expect_err(lh_sync_keys_write(path, &other, false), LH_ERR_INVAL, "trainer.key.pub exists");
  assert_int_equal(access(path, F_OK), -1); /* nothing written when the .pub is in the way */
  assert_int_equal(lh_sync_keys_write(path, &sk, true), LH_ERR_OK);
  assert_int_equal(lh_sync_keys_write(path, &other, true), LH_ERR_OK);
  assert_int_equal(lh_sync_secret_key_load(path, &back), LH_ERR_OK);
  assert_memory_equal(back.sk, other.sk, sizeof other.sk);
  /* a secret key others may read is refused, as ssh refuses one */
  assert_int_equal(chmod(path, 0640), 0);
  expect_err(lh_sync_secret_key_load(path, &back), LH_ERR_INVAL, "mode 0640");
  expect_err(lh_sync_public_key_load(path, &pback), LH_ERR_FORMAT, "this is a secret key");
  char *missing = lh_path_join(dir, "nope.pub");
  expect_err(lh_sync_public_key_load(missing, &pback), LH_ERR_IO, "nope.pub");
  free(missing);
  unlink(path);
  unlink(pub);
  rmdir(dir);
  free(path);
  free(pub);
}

/* ---------------------------------------------------------------- manifests */

static void fill_hash(uint8_t h[LH_HASH_BYTES], const char *s) {
  lh_hash256(s, strlen(s), h);
}

static lh_sync_manifest sample_manifest(void) {
  lh_sync_manifest m;
  memset(&m, 0, sizeof m);
  m.version = 12;
  m.parent = 11;
  m.elements = 123456;
  fill_hash(m.slab, "slab 12");
  fill_hash(m.config, "config");
  fill_hash(m.tokenizer, "tokenizer");
  m.has_tokenizer = true;
  fill_hash(m.generation, "generation");
  m.has_generation = true;
  m.n_blobs = 3;
  m.blobs[0] = (lh_sync_blob_ref){LH_SYNC_PATCH, 11, 500, {0}};
  fill_hash(m.blobs[0].hash, "patch 11-12");
  m.blobs[1] = (lh_sync_blob_ref){LH_SYNC_SNAPSHOT, LH_SYNC_NONE, 200000, {0}};
  fill_hash(m.blobs[1].hash, "snapshot 12");
  m.blobs[2] = (lh_sync_blob_ref){LH_SYNC_PATCH, 4, 2000, {0}};
  fill_hash(m.blobs[2].hash, "patch 4-12");
  return m;
}

static void test_manifest_round_trip(void **state) {
  (void)state;
  lh_sync_secret_key sk;
  lh_sync_public_key pk;
  seed_key(5, &sk);
  lh_sync_key_public(&sk, &pk);
  lh_sync_manifest m = sample_manifest(), got;
  char *a = NULL, *b = NULL;
  size_t alen = 0, blen = 0;
  assert_int_equal(lh_sync_manifest_sign(&m, &sk, &a, &alen), LH_ERR_OK);
  assert_int_equal(lh_sync_manifest_sign(&m, &sk, &b, &blen), LH_ERR_OK);
  assert_int_equal(alen, blen); /* Ed25519 is deterministic: one manifest, one byte string */
  assert_memory_equal(a, b, alen);
  assert_int_equal(lh_sync_manifest_verify(a, alen, &pk, "m", &got), LH_ERR_OK);
  assert_int_equal(got.version, 12);
  assert_int_equal(got.parent, 11);
  assert_int_equal(got.elements, 123456);
  assert_memory_equal(got.slab, m.slab, LH_HASH_BYTES);
  assert_memory_equal(got.config, m.config, LH_HASH_BYTES);
  assert_true(got.has_tokenizer);
  assert_memory_equal(got.tokenizer, m.tokenizer, LH_HASH_BYTES);
  assert_memory_equal(got.key.bytes, pk.bytes, sizeof pk.bytes);
  assert_int_equal(got.n_blobs, 3);
  for (int i = 1; i < got.n_blobs; i++) /* canonical order: by hash */
    assert_true(memcmp(got.blobs[i - 1].hash, got.blobs[i].hash, LH_HASH_BYTES) < 0);
  for (int i = 0; i < m.n_blobs; i++) {
    int found = 0;
    for (int j = 0; j < got.n_blobs; j++)
      if (!memcmp(got.blobs[j].hash, m.blobs[i].hash, LH_HASH_BYTES)) {
        assert_int_equal(got.blobs[j].kind, m.blobs[i].kind);
        assert_int_equal(got.blobs[j].from, m.blobs[i].from);
        assert_int_equal(got.blobs[j].size, m.blobs[i].size);
        found++;
      }
    assert_int_equal(found, 1);
  }
  /* re-signing what was read gives the same bytes; so does signing with the blobs reordered */
  free(b);
  assert_int_equal(lh_sync_manifest_sign(&got, &sk, &b, &blen), LH_ERR_OK);
  assert_int_equal(blen, alen);
  assert_memory_equal(a, b, alen);
  free(b);
  lh_sync_manifest r = m;
  r.blobs[0] = m.blobs[2], r.blobs[2] = m.blobs[0];
  assert_int_equal(lh_sync_manifest_sign(&r, &sk, &b, &blen), LH_ERR_OK);
  assert_int_equal(blen, alen);
  assert_memory_equal(a, b, alen);
  free(b);
  /* no tokenizer and no parent are JSON nulls */
  m.has_tokenizer = false;
  m.parent = LH_SYNC_NONE;
  assert_int_equal(lh_sync_manifest_sign(&m, &sk, &b, &blen), LH_ERR_OK);
  assert_non_null(strstr(b, "\"parent\":null") ? b : NULL);
  assert_int_equal(lh_sync_manifest_verify(b, blen, &pk, "m", &got), LH_ERR_OK);
  assert_false(got.has_tokenizer);
  assert_int_equal(got.parent, LH_SYNC_NONE);
  free(b);
  free(a);
}

/* The committed fixtures were written by tests/ref/sync_ref.py, an implementation of
 * docs/PROTOCOL.md in Python with its own Ed25519: longhaul verifies them and, signing the same
 * fields with the same key, writes the same bytes. */
static void test_manifest_fixtures(void **state) {
  (void)state;
  lh_sync_public_key pk;
  lh_sync_secret_key sk;
  size_t len = 0, slen = 0;
  char *ktext = read_all(FIXTURES "/trainer.key", &len);
  assert_int_equal(lh_sync_secret_key_parse(ktext, len, "trainer.key", &sk), LH_ERR_OK);
  free(ktext);
  assert_int_equal(lh_sync_public_key_load(FIXTURES "/trainer.pub", &pk), LH_ERR_OK);
  lh_sync_public_key derived;
  lh_sync_key_public(&sk, &derived);
  assert_memory_equal(derived.bytes, pk.bytes, sizeof pk.bytes);
  const char *names[] = {FIXTURES "/manifest7.json", FIXTURES "/manifest0.json"};
  for (int f = 0; f < 2; f++) {
    char *text = read_all(names[f], &len), *again = NULL;
    lh_sync_manifest m;
    assert_int_equal(lh_sync_manifest_load(names[f], &pk, &m), LH_ERR_OK);
    assert_int_equal(lh_sync_manifest_sign(&m, &sk, &again, &slen), LH_ERR_OK);
    assert_int_equal(slen, len);
    assert_memory_equal(again, text, len);
    if (f == 0) {
      assert_int_equal(m.version, 7);
      assert_int_equal(m.parent, 6);
      assert_int_equal(m.elements, 4099);
      assert_int_equal(m.n_blobs, 3);
      uint8_t h[LH_HASH_BYTES];
      fill_hash(h, "{}");
      assert_memory_equal(m.config, h, LH_HASH_BYTES);
    } else {
      assert_int_equal(m.version, 0);
      assert_int_equal(m.parent, LH_SYNC_NONE);
      assert_false(m.has_tokenizer);
    }
    free(again);
    free(text);
  }
}

static void verify_expect(const char *text, size_t len, const lh_sync_public_key *pk, lh_err code,
                          const char *needle) {
  lh_sync_manifest m;
  memset(&m, 0x55, sizeof m);
  expect_err(lh_sync_manifest_verify(text, len, pk, "wire", &m), code, needle);
  lh_sync_manifest zero;
  memset(&zero, 0, sizeof zero);
  assert_memory_equal(&m, &zero, sizeof m); /* nothing of a refused manifest is left */
}

/* text with the first `from` replaced by `to` (which must occur) */
static char *replaced(const char *text, const char *from, const char *to) {
  const char *at = strstr(text, from);
  if (!at) fail_msg("\"%s\" not in the manifest", from);
  size_t n = strlen(text) + strlen(to) + 1;
  char *out = malloc(n);
  snprintf(out, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
  return out;
}

static void test_manifest_refusals(void **state) {
  (void)state;
  lh_sync_secret_key sk, other;
  lh_sync_public_key pk, other_pk;
  seed_key(5, &sk);
  seed_key(6, &other);
  lh_sync_key_public(&sk, &pk);
  lh_sync_key_public(&other, &other_pk);
  lh_sync_manifest m = sample_manifest();
  char *good = NULL, *t;
  size_t len = 0;
  assert_int_equal(lh_sync_manifest_sign(&m, &sk, &good, &len), LH_ERR_OK);
  char *s = malloc(len + 1);
  memcpy(s, good, len);
  s[len] = '\0';
  /* a wrong key: signed by another key than the pinned one */
  verify_expect(s, len, &other_pk, LH_ERR_MISMATCH, "not by the pinned trainer key");
  /* a manifest signed by another key that claims to be the pinned one */
  char *forged = NULL;
  size_t flen = 0;
  assert_int_equal(lh_sync_manifest_sign(&m, &other, &forged, &flen), LH_ERR_OK);
  char khex[65], ohex[65];
  lh_hash_hex(pk.bytes, khex);
  lh_hash_hex(other_pk.bytes, ohex);
  forged[flen - 1] = '\0'; /* the final '}', put back below */
  t = replaced(forged, ohex, khex);
  strcat(t, "}");
  verify_expect(t, strlen(t), &pk, LH_ERR_SIGNATURE, "signature does not verify");
  free(t);
  free(forged);
  /* a bad signature, and tampered fields that stay well-formed and canonical */
  const char *sig = strstr(s, "\"signature\":\"") + 13;
  t = strdup(s);
  t[sig - s] = sig[0] == '0' ? '1' : '0';
  verify_expect(t, len, &pk, LH_ERR_SIGNATURE, "signature does not verify");
  free(t);
  const char *tamper[][2] = {
      {"\"version\":12", "\"version\":13"},
      {"\"parent\":11", "\"parent\":10"},
      {"\"elements\":123456", "\"elements\":1"},
      {"\"size\":500", "\"size\":5"},
      {"\"from\":4,", "\"from\":5,"},
  };
  for (size_t i = 0; i < sizeof tamper / sizeof tamper[0]; i++) {
    t = replaced(s, tamper[i][0], tamper[i][1]);
    verify_expect(t, strlen(t), &pk, LH_ERR_SIGNATURE, "changed after signing");
    free(t);
  }
  /* non-canonical: whitespace, a reordered member, an escape, a leading zero, -0 */
  t = replaced(s, ",\"config\"", ", \"config\"");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "not in canonical form");
  free(t);
  size_t n = strlen(s) + 2;
  t = malloc(n);
  snprintf(t, n, "%s\n", s);
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "the canonical encoding ends there");
  free(t);
  t = replaced(s, "\"kind\":\"snapshot\"", "\"kind\":\"snapsho\\u0074\"");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "not in canonical form");
  free(t);
  t = replaced(s, "\"version\":12", "\"version\":12.0");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "field version: expected an integer, found real");
  free(t);
  t = replaced(s, "\"format\":1", "\"format\":01");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "not JSON");
  free(t);
  {
    /* members in another order: move "version" to the front */
    char *body = replaced(s, ",\"version\":12}", "}");
    n = strlen(body) + 16;
    t = malloc(n);
    snprintf(t, n, "{\"version\":12,%s", body + 1);
    verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "at byte 2 found \"v\"");
    free(t);
    free(body);
  }
  /* blobs out of order (swap the first two) */
  {
    lh_sync_manifest c;
    assert_int_equal(lh_sync_manifest_parse(s, len, "m", &c), LH_ERR_OK);
    char a[65], b[65];
    lh_hash_hex(c.blobs[0].hash, a);
    lh_hash_hex(c.blobs[1].hash, b);
    char *x = replaced(s, a, "@@@@"), *y = replaced(x, b, a);
    t = replaced(y, "@@@@", b);
    verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "not in canonical form");
    free(t);
    free(x);
    free(y);
  }
  /* an unknown version of the format; a format that is not an integer; none */
  t = replaced(s, "\"format\":1", "\"format\":2");
  verify_expect(t, strlen(t), &pk, LH_ERR_UNSUPPORTED, "manifest format 2; this longhaul reads");
  free(t);
  t = replaced(s, "\"format\":1", "\"format\":\"1\"");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "field format: expected an integer");
  free(t);
  t = replaced(s, "\"format\":1,", "");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "no \"format\" field");
  free(t);
  /* fields: missing, unknown, wrong type, out of range, bad hex, bad kind, duplicate */
  t = replaced(s, ",\"elements\":123456", "");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "missing field \"elements\"");
  free(t);
  t = replaced(s, "\"format\":1", "\"format\":1,\"extra\":0");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "unknown field \"extra\"");
  free(t);
  t = replaced(s, "\"version\":12", "\"version\":9007199254740992");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT,
                "field version: 9007199254740992 is out of range");
  free(t);
  t = replaced(s, "\"parent\":11", "\"parent\":12");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "parent 12 of version 12");
  free(t);
  t = replaced(s, "\"parent\":11", "\"parent\":-1");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "field parent: -1 is out of range");
  free(t);
  {
    char hex[65];
    lh_hash_hex(m.slab, hex);
    char up[65];
    memcpy(up, hex, 65);
    for (int i = 0; i < 64; i++)
      if (up[i] >= 'a') {
        up[i] = (char)(up[i] - 32);
        break;
      }
    t = replaced(s, hex, up);
    verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "field slab: byte");
    free(t);
  }
  t = replaced(s, "\"kind\":\"snapshot\"", "\"kind\":\"full\"");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT,
                "expected \"snapshot\" or \"patch\", found \"full\"");
  free(t);
  t = replaced(s, "\"kind\":\"snapshot\"", "\"kind\":\"patch\"");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "a patch needs \"from\"");
  free(t);
  t = replaced(s, "\"from\":4,", "\"from\":12,");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "a patch from version 12 to 12");
  free(t);
  t = replaced(s, "\"from\":4,", "\"from\":11,");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "both patches from version 11");
  free(t);
  t = replaced(s, "\"format\":1", "\"format\":1,\"format\":1");
  verify_expect(t, strlen(t), &pk, LH_ERR_FORMAT, "not JSON: duplicate object key");
  free(t);
  verify_expect("[1,2]", 5, &pk, LH_ERR_FORMAT, "expected an object, found array");
  verify_expect("{\"format\":1", 11, &pk, LH_ERR_FORMAT, "not JSON");
  /* oversized input and input too costly to parse, refused before jansson builds a tree */
  char *big = malloc(LH_SYNC_MANIFEST_MAX_BYTES + 2);
  memset(big, ' ', LH_SYNC_MANIFEST_MAX_BYTES + 1);
  memcpy(big, s, len);
  verify_expect(big, LH_SYNC_MANIFEST_MAX_BYTES + 1, &pk, LH_ERR_LIMIT,
                "more than a manifest's limit");
  for (int i = 0; i < 2000; i++)
    memcpy(big + 2 * i, "[]", 2);
  big[0] = '[';
  verify_expect(big, 4000, &pk, LH_ERR_LIMIT, "wire");
  free(big);
  /* every one-byte change of a signed manifest is refused, whichever check catches it */
  t = malloc(len);
  for (size_t i = 0; i < len; i++) {
    const char subs[] = {'0', '1', 'a', 'f', '"', ' ', '}', 'x'};
    for (size_t k = 0; k < sizeof subs; k++) {
      if (s[i] == subs[k]) continue;
      memcpy(t, s, len);
      t[i] = subs[k];
      lh_sync_manifest c;
      if (lh_sync_manifest_verify(t, len, &pk, "m", &c) == LH_ERR_OK)
        fail_msg("byte %zu changed to '%c' was accepted", i, subs[k]);
    }
  }
  free(t);
  free(s);
  free(good);
}

static void test_manifest_checks(void **state) {
  (void)state;
  lh_sync_secret_key sk;
  seed_key(5, &sk);
  char *out = NULL;
  size_t len = 0;
  lh_sync_manifest m = sample_manifest();
  assert_int_equal(lh_sync_manifest_check(&m, "m"), LH_ERR_OK);
#define BAD(stmt, needle)                                                                          \
  do {                                                                                             \
    lh_sync_manifest c = sample_manifest();                                                        \
    stmt;                                                                                          \
    expect_err(lh_sync_manifest_sign(&c, &sk, &out, &len), LH_ERR_INVAL, needle);                  \
    assert_null(out);                                                                              \
  } while (0)
  BAD(c.n_blobs = 0, "0 blobs");
  BAD(c.n_blobs = LH_SYNC_MAX_BLOBS + 1, "65 blobs");
  BAD(c.blobs[0].kind = LH_SYNC_SNAPSHOT; c.blobs[0].from = LH_SYNC_NONE, "second snapshot");
  BAD(c.blobs[1].from = 3, "a snapshot with a from version");
  BAD(c.blobs[0].from = 12, "patch from version 12 to 12");
  BAD(c.blobs[2].from = 11, "both patches from version 11");
  BAD(memcpy(c.blobs[2].hash, c.blobs[0].hash, LH_HASH_BYTES), "the same hash");
  BAD(c.blobs[0].size = 0, "size 0");
  BAD(c.parent = 12, "parent 12");
  BAD(c.version = -2, "version -2");
  BAD(c.elements = 0, "elements 0");
  BAD(c.blobs[0].kind = (lh_sync_blob_kind)7, "kind 7");
#undef BAD
}

static void test_manifest_unsigned(void **state) {
  (void)state;
  const char *json =
      "{ \"format\": 1, \"version\": 3, \"parent\": null, \"elements\": 10,\n"
      "  \"slab\": \"%s\", \"config\": \"%s\", \"tokenizer\": null, \"generation\": null,\n"
      "  \"blobs\": [ {\"size\": 9, \"kind\": \"snapshot\", \"hash\": \"%s\"} ] }";
  char h[65], text[1024];
  uint8_t b[LH_HASH_BYTES];
  fill_hash(b, "x");
  lh_hash_hex(b, h);
  snprintf(text, sizeof text, json, h, h, h);
  lh_sync_manifest m;
  assert_int_equal(lh_sync_manifest_from_json(text, strlen(text), "in", &m), LH_ERR_OK);
  assert_int_equal(m.version, 3);
  assert_int_equal(m.parent, LH_SYNC_NONE);
  assert_int_equal(m.n_blobs, 1);
  assert_int_equal(m.blobs[0].size, 9);
  /* the same text is not a signed manifest (layout, and no key or signature) */
  expect_err(lh_sync_manifest_parse(text, strlen(text), "in", &m), LH_ERR_FORMAT,
             "missing field \"key\"");
  /* a signed manifest is not an unsigned one */
  lh_sync_secret_key sk;
  seed_key(5, &sk);
  lh_sync_manifest s = sample_manifest();
  char *out = NULL;
  size_t len = 0;
  assert_int_equal(lh_sync_manifest_sign(&s, &sk, &out, &len), LH_ERR_OK);
  expect_err(lh_sync_manifest_from_json(out, len, "in", &m), LH_ERR_FORMAT,
             "an unsigned manifest has none");
  free(out);
  /* model hashes: config.json required, tokenizer.json optional */
  char dir[256];
  make_tmpdir(dir, sizeof dir);
  char *cfg = lh_path_join(dir, "config.json"), *tok = lh_path_join(dir, "tokenizer.json");
  expect_err(lh_sync_model_hashes(dir, &m), LH_ERR_IO, "config.json");
  assert_int_equal(lh_file_write_atomic(cfg, "{\"a\":1}", 7), LH_ERR_OK);
  memset(&m, 0xaa, sizeof m);
  assert_int_equal(lh_sync_model_hashes(dir, &m), LH_ERR_OK);
  fill_hash(b, "{\"a\":1}");
  assert_memory_equal(m.config, b, LH_HASH_BYTES);
  assert_false(m.has_tokenizer);
  assert_int_equal(lh_file_write_atomic(tok, "tok", 3), LH_ERR_OK);
  assert_int_equal(lh_sync_model_hashes(dir, &m), LH_ERR_OK);
  fill_hash(b, "tok");
  assert_true(m.has_tokenizer);
  assert_memory_equal(m.tokenizer, b, LH_HASH_BYTES);
  unlink(cfg);
  unlink(tok);
  rmdir(dir);
  free(cfg);
  free(tok);
}

/* ---------------------------------------------------------------- snapshots */

static uint16_t fixture_value(size_t i) {
  return (uint16_t)((uint32_t)(i * 2654435761u) >> 16);
}

/* bf16-like weights: a few exponents, random mantissas */
static uint16_t *weights(size_t n, uint32_t seed) {
  uint16_t *w = malloc(2 * n);
  uint32_t x = seed;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    w[i] = (uint16_t)((x >> 31) << 15 | (0x78 + ((x >> 20) & 3)) << 7 | ((x >> 8) & 0x7f));
  }
  return w;
}

static void test_snapshot_round_trip(void **state) {
  (void)state;
  const size_t sizes[] = {1, 2, 1000, 65536, 65537, 300001};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s];
    uint16_t *w = weights(n, (uint32_t)s + 1), *back = NULL;
    uint8_t *blob = NULL, h[LH_HASH_BYTES], hh[LH_HASH_BYTES];
    size_t len = 0, m = 0;
    int level = s == 2 ? 19 : LH_SYNC_SNAPSHOT_LEVEL;
    assert_int_equal(lh_sync_snapshot_encode(w, n, level, &blob, &len), LH_ERR_OK);
    assert_int_equal(lh_sync_snapshot_info(blob, len, n, "s", &m, h), LH_ERR_OK);
    assert_int_equal(m, n);
    lh_sync_slab_hash(w, n, hh);
    assert_memory_equal(h, hh, LH_HASH_BYTES);
    assert_int_equal(lh_sync_snapshot_decode(blob, len, n, "s", &back, &m), LH_ERR_OK);
    assert_int_equal(m, n);
    assert_memory_equal(back, w, 2 * n);
    if (n >= 65536) assert_true(len < 2 * n); /* few exponents: the high plane compresses */
    /* the payload is one zstd frame of the high bytes, then the low bytes (PROTOCOL.md) */
    uint8_t *planes = malloc(2 * n);
    assert_int_equal(ZSTD_decompress(planes, 2 * n, blob + 64, len - 64), 2 * n);
    for (size_t i = 0; i < n; i++) {
      assert_int_equal(planes[i], w[i] >> 8);
      assert_int_equal(planes[n + i], w[i] & 0xff);
    }
    free(planes);
    free(back);
    free(blob);
    free(w);
  }
  uint8_t *blob = NULL;
  size_t len = 0;
  uint16_t one = 1;
  expect_err(lh_sync_snapshot_encode(&one, 0, 3, &blob, &len), LH_ERR_INVAL, "0 values");
  expect_err(lh_sync_snapshot_encode(&one, 1, 20, &blob, &len), LH_ERR_INVAL, "level 20");
}

/* written by tests/ref/sync_ref.py (its own header code, planes made in Python, the zstd
 * command's frame), named by manifest7.json */
static void test_snapshot_fixture(void **state) {
  (void)state;
  size_t len = 0, n = 0;
  char *blob = read_all(FIXTURES "/snapshot.lhsn", &len);
  uint16_t *slab = NULL;
  assert_int_equal(lh_sync_snapshot_decode((uint8_t *)blob, len, 4099, "fixture", &slab, &n),
                   LH_ERR_OK);
  assert_int_equal(n, 4099);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(slab[i], fixture_value(i));
  lh_sync_public_key pk;
  lh_sync_manifest m;
  assert_int_equal(lh_sync_public_key_load(FIXTURES "/trainer.pub", &pk), LH_ERR_OK);
  assert_int_equal(lh_sync_manifest_load(FIXTURES "/manifest7.json", &pk, &m), LH_ERR_OK);
  uint8_t h[LH_HASH_BYTES];
  lh_sync_slab_hash(slab, n, h);
  assert_memory_equal(h, m.slab, LH_HASH_BYTES);
  lh_hash256(blob, len, h);
  int found = 0;
  for (int i = 0; i < m.n_blobs; i++)
    if (m.blobs[i].kind == LH_SYNC_SNAPSHOT) {
      assert_memory_equal(m.blobs[i].hash, h, LH_HASH_BYTES);
      assert_int_equal(m.blobs[i].size, len);
      found++;
    }
  assert_int_equal(found, 1);
  free(slab);
  expect_err(lh_sync_snapshot_decode((uint8_t *)blob, len, 4098, "fixture", &slab, &n),
             LH_ERR_LIMIT, "4099 values, expected 1 .. 4098");
  assert_null(slab);
  free(blob);
}

static void snap_expect(const uint8_t *b, size_t len, size_t max, lh_err code, const char *needle) {
  uint16_t *slab = (uint16_t *)1;
  size_t n = 7;
  expect_err(lh_sync_snapshot_decode(b, len, max, "blob", &slab, &n), code, needle);
  assert_null(slab);
  assert_int_equal(n, 0);
}

static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static void test_snapshot_refusals(void **state) {
  (void)state;
  size_t n = 300, len = 0;
  uint16_t *w = weights(n, 9);
  uint8_t *blob = NULL;
  assert_int_equal(lh_sync_snapshot_encode(w, n, 3, &blob, &len), LH_ERR_OK);
  uint8_t *c = malloc(len + 64);
  for (size_t k = 0; k < len; k++) { /* every truncation */
    uint16_t *slab = NULL;
    size_t m = 0;
    assert_int_not_equal(lh_sync_snapshot_decode(blob, k, n, "blob", &slab, &m), LH_ERR_OK);
    assert_null(slab);
  }
  /* every flipped bit is refused, or (a bit zstd ignores: the frame header's unused bit 4 at
   * byte 68, a few in the entropy tables) decodes to the very same slab: never a different one.
   * The blob's own hash, which the manifest names, tells such copies apart. */
  size_t same = 0;
  for (size_t i = 0; i < 8 * len; i++) {
    memcpy(c, blob, len);
    c[i / 8] ^= (uint8_t)(1u << (i % 8));
    uint16_t *slab = NULL;
    size_t m = 0;
    if (lh_sync_snapshot_decode(c, len, n, "blob", &slab, &m) == LH_ERR_OK) {
      if (m != n || memcmp(slab, w, 2 * n)) fail_msg("bit %zu flipped decoded to another slab", i);
      same++;
    }
    free(slab);
  }
  assert_true(100 * same < 8 * len); /* 5 of 15624 bits here */
  snap_expect(blob, 10, n, LH_ERR_FORMAT, "shorter than the 64-byte snapshot header");
  memcpy(c, blob, len);
  c[0] = 'X';
  snap_expect(c, len, n, LH_ERR_FORMAT, "magic \"XHSN\"");
  memcpy(c, blob, len);
  c[4] = 2;
  snap_expect(c, len, n, LH_ERR_UNSUPPORTED, "snapshot format 2");
  memcpy(c, blob, len);
  c[7] = 1;
  snap_expect(c, len, n, LH_ERR_FORMAT, "reserved header byte 7");
  memcpy(c, blob, len);
  c[60] = 1;
  snap_expect(c, len, n, LH_ERR_FORMAT, "reserved header byte 60");
  snap_expect(blob, len, n - 1, LH_ERR_LIMIT, "300 values, expected 1 .. 299");
  memcpy(c, blob, len);
  put64(c + 8, 0);
  snap_expect(c, len, n, LH_ERR_LIMIT, "0 values");
  memcpy(c, blob, len);
  put64(c + 8, 301);
  snap_expect(c, len, 1000, LH_ERR_FORMAT, "the header's 301 values need 602");
  memcpy(c, blob, len);
  c[24] ^= 1;
  snap_expect(c, len, n, LH_ERR_MISMATCH, "the header says");
  /* bytes after the frame, with the payload length adjusted to cover them */
  memcpy(c, blob, len);
  c[len] = 0;
  put64(c + 16, len - 64 + 1);
  snap_expect(c, len + 1, n, LH_ERR_FORMAT, "after the zstd frame's end");
  snap_expect(c, len, n, LH_ERR_FORMAT, "truncated or padded");
  /* a second frame appended */
  memcpy(c, blob, len);
  memcpy(c + len, blob + 64, len - 64 < 64 ? len - 64 : 64);
  size_t extra = len - 64 < 64 ? len - 64 : 64;
  put64(c + 16, len - 64 + extra);
  snap_expect(c, len + extra, n, LH_ERR_FORMAT, "after the zstd frame");
  /* a frame that does not declare its size */
  {
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
    uint8_t *planes = malloc(2 * n), *d = malloc(64 + ZSTD_compressBound(2 * n));
    for (size_t i = 0; i < n; i++)
      planes[i] = (uint8_t)(w[i] >> 8), planes[n + i] = (uint8_t)w[i];
    size_t fl = ZSTD_compress2(cc, d + 64, ZSTD_compressBound(2 * n), planes, 2 * n);
    assert_false(ZSTD_isError(fl));
    memcpy(d, blob, 64);
    put64(d + 16, fl);
    snap_expect(d, 64 + fl, n, LH_ERR_FORMAT, "does not declare its size");
    ZSTD_freeCCtx(cc);
    free(planes);
    free(d);
  }
  memcpy(c, blob, len);
  memset(c + 64, 0, 4);
  snap_expect(c, len, n, LH_ERR_FORMAT, "not a zstd frame");
  free(c);
  free(blob);
  free(w);
}

/* ---------------------------------------------------------------- blob store */

static void test_blob_store(void **state) {
  (void)state;
  char dir[256];
  make_tmpdir(dir, sizeof dir);
  char *store = lh_path_join(dir, "run/blobs"); /* created by the first put */
  const char *data = "a policy blob";
  size_t len = strlen(data);
  uint8_t h[LH_HASH_BYTES], want[LH_HASH_BYTES];
  lh_hash256(data, len, want);
  assert_false(lh_sync_blob_has(store, want));
  uint8_t *got = NULL;
  size_t glen = 0;
  expect_err(lh_sync_blob_get(store, want, 1 << 20, &got, &glen), LH_ERR_NOTFOUND, "no such blob");
  assert_int_equal(lh_sync_blob_put(store, data, len, h), LH_ERR_OK);
  assert_memory_equal(h, want, LH_HASH_BYTES);
  assert_true(lh_sync_blob_has(store, h));
  char hex[65];
  lh_hash_hex(h, hex);
  char *path = lh_sync_blob_path(store, h), *expect = lh_path_join(store, hex);
  assert_string_equal(path, expect);
  assert_int_equal(count_files(store), 1); /* the blob, no temporary file */
  size_t flen = 0;
  char *file = read_all(path, &flen);
  assert_int_equal(flen, len);
  assert_memory_equal(file, data, len);
  free(file);
  assert_int_equal(lh_sync_blob_get(store, h, len, &got, &glen), LH_ERR_OK);
  assert_int_equal(glen, len);
  assert_memory_equal(got, data, len);
  free(got);
  expect_err(lh_sync_blob_get(store, h, len - 1, &got, &glen), LH_ERR_LIMIT, "limit");
  assert_null(got);
  /* a second put of an intact blob leaves the file alone (same inode) */
  struct stat a, b;
  assert_int_equal(stat(path, &a), 0);
  assert_int_equal(lh_sync_blob_put(store, data, len, h), LH_ERR_OK);
  assert_int_equal(stat(path, &b), 0);
  assert_int_equal(a.st_ino, b.st_ino);
  /* corrupted on disk: get refuses it and keeps it; put replaces it */
  assert_int_equal(lh_file_write_atomic(path, "a policy blub", len), LH_ERR_OK);
  expect_err(lh_sync_blob_get(store, h, 1 << 20, &got, &glen), LH_ERR_MISMATCH, "corrupted");
  assert_null(got);
  assert_true(lh_sync_blob_has(store, h));
  assert_int_equal(lh_sync_blob_put(store, data, len, h), LH_ERR_OK);
  assert_int_equal(lh_sync_blob_get(store, h, len, &got, &glen), LH_ERR_OK);
  assert_memory_equal(got, data, len);
  free(got);
  /* truncated on disk (another size): refused too */
  assert_int_equal(truncate(path, 3), 0);
  expect_err(lh_sync_blob_get(store, h, 1 << 20, &got, &glen), LH_ERR_MISMATCH, "3 bytes hash");
  /* an empty blob is a blob */
  assert_int_equal(lh_sync_blob_put(store, "", 0, h), LH_ERR_OK);
  assert_int_equal(lh_sync_blob_get(store, h, 0, &got, &glen), LH_ERR_OK);
  assert_int_equal(glen, 0);
  free(got);
  rm_rf(store);
  char *run = lh_path_join(dir, "run");
  rmdir(run);
  rmdir(dir);
  free(run);
  free(path);
  free(expect);
  free(store);
}

/* ---------------------------------------------------------------- planning */

typedef struct edge {
  int64_t to, from; /* from LH_SYNC_NONE: a snapshot */
  uint64_t size;
} edge;

/* Manifests for the versions of `edges` (each edge a blob of its `to`), in the given order of
 * first appearance; blob hashes are made distinct. */
static int build(const edge *edges, int n_edges, lh_sync_manifest *out) {
  int n = 0;
  for (int i = 0; i < n_edges; i++) {
    int k = 0;
    while (k < n && out[k].version != edges[i].to)
      k++;
    if (k == n) {
      memset(&out[n], 0, sizeof out[n]);
      out[n].version = edges[i].to;
      out[n].parent = LH_SYNC_NONE;
      out[n].elements = 1;
      n++;
    }
    lh_sync_blob_ref *b = &out[k].blobs[out[k].n_blobs++];
    b->kind = edges[i].from == LH_SYNC_NONE ? LH_SYNC_SNAPSHOT : LH_SYNC_PATCH;
    b->from = edges[i].from;
    b->size = edges[i].size;
    memset(b->hash, 0, sizeof b->hash);
    memcpy(b->hash, &i, sizeof i);
  }
  return n;
}

/* Checks route r's steps: each step's (to, from) in order. */
static void expect_steps(const lh_sync_manifest *v, const lh_sync_route *r,
                         const int64_t (*steps)[2], int n_steps) {
  assert_int_equal(r->n, n_steps);
  for (int i = 0; i < n_steps; i++) {
    const lh_sync_manifest *m = &v[r->steps[i].manifest];
    const lh_sync_blob_ref *b = &m->blobs[r->steps[i].blob];
    if (m->version != steps[i][0] || b->from != steps[i][1])
      fail_msg("step %d: %lld from %lld, expected %lld from %lld", i, (long long)m->version,
               (long long)b->from, (long long)steps[i][0], (long long)steps[i][1]);
  }
}

/* Plans and checks the route: total bytes, and each step's (to, from) in order. */
static void expect_route(const edge *edges, int n_edges, int64_t from, int64_t to, uint64_t bytes,
                         const int64_t (*steps)[2], int n_steps) {
  lh_sync_manifest *v = calloc((size_t)n_edges + 1, sizeof *v);
  int n = build(edges, n_edges, v);
  lh_sync_route r;
  lh_err e = lh_sync_plan(v, n, from, to, &r);
  if (e) fail_msg("plan %lld -> %lld: %s", (long long)from, (long long)to, lh_last_error());
  assert_int_equal(r.bytes, bytes);
  expect_steps(v, &r, steps, n_steps);
  lh_sync_route_free(&r);
  lh_sync_route_free(&r); /* idempotent */
  free(v);
}

static void expect_no_route(const edge *edges, int n_edges, int64_t from, int64_t to, lh_err code,
                            const char *needle) {
  lh_sync_manifest *v = calloc((size_t)n_edges + 1, sizeof *v);
  int n = build(edges, n_edges, v);
  lh_sync_route r;
  expect_err(lh_sync_plan(v, n, from, to, &r), code, needle);
  assert_int_equal(r.n, 0);
  assert_null(r.steps);
  free(v);
}

#define N        LH_SYNC_NONE
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void test_plan_graphs(void **state) {
  (void)state;
  /* a chain: snapshot at 0, patches 0->1->2->3 */
  const edge chain[] = {{0, N, 1000}, {1, 0, 10}, {2, 1, 20}, {3, 2, 30}};
  const int64_t s_0_3[][2] = {{1, 0}, {2, 1}, {3, 2}};
  expect_route(chain, COUNT(chain), 0, 3, 60, s_0_3, 3);
  const int64_t s_none_3[][2] = {{0, N}, {1, 0}, {2, 1}, {3, 2}};
  expect_route(chain, COUNT(chain), N, 3, 1060, s_none_3, 4);
  const int64_t s_1_2[][2] = {{2, 1}};
  expect_route(chain, COUNT(chain), 1, 2, 20, s_1_2, 1);
  /* from == to: nothing to fetch */
  expect_route(chain, COUNT(chain), 2, 2, 0, NULL, 0);
  /* from newer than to: only a snapshot route (0 then patches to 2) */
  const int64_t s_3_2[][2] = {{0, N}, {1, 0}, {2, 1}};
  expect_route(chain, COUNT(chain), 3, 2, 1030, s_3_2, 3);
  /* the order of the manifests does not matter */
  const edge shuffled[] = {{3, 2, 30}, {1, 0, 10}, {0, N, 1000}, {2, 1, 20}};
  expect_route(shuffled, COUNT(shuffled), 0, 3, 60, s_0_3, 3);
  /* a cheaper snapshot than a long chain */
  const edge keyframe[] = {{0, N, 1000}, {1, 0, 300},  {2, 1, 300}, {3, 2, 300},
                           {4, 3, 300},  {4, N, 1000}, {5, 4, 10}};
  const int64_t s_k[][2] = {{4, N}, {5, 4}};
  expect_route(keyframe, COUNT(keyframe), 0, 5, 1010, s_k, 2);
  const int64_t s_k2[][2] = {{4, 3}, {5, 4}};
  expect_route(keyframe, COUNT(keyframe), 3, 5, 310, s_k2, 2);
  /* a patch spanning several versions beats the chain it skips */
  const edge span[] = {{0, N, 900}, {1, 0, 5}, {2, 1, 5}, {3, 2, 5}, {4, 3, 5}, {4, 0, 15}};
  const int64_t s_span[][2] = {{4, 0}};
  expect_route(span, COUNT(span), 0, 4, 15, s_span, 1);
  /* a worker older than any patch (and than any manifest): snapshot 6, then patches */
  const edge late[] = {{5, N, 800}, {6, N, 700}, {6, 5, 40}, {7, 6, 30}, {8, 7, 20}};
  const int64_t s_late[][2] = {{6, N}, {7, 6}, {8, 7}};
  expect_route(late, COUNT(late), 2, 8, 750, s_late, 3);
  /* a worker at a version with no manifest of its own, but a patch from it */
  const edge held[] = {{4, 3, 7}, {4, N, 100}};
  const int64_t s_held[][2] = {{4, 3}};
  expect_route(held, COUNT(held), 3, 4, 7, s_held, 1);
  /* ties: equal bytes, fewer steps */
  const edge tie_steps[] = {{0, N, 100}, {1, 0, 50}, {2, 1, 50}, {2, 0, 100}};
  const int64_t s_ts[][2] = {{2, 0}};
  expect_route(tie_steps, COUNT(tie_steps), 0, 2, 100, s_ts, 1);
  /* ties: equal bytes and steps, a snapshot over a patch */
  const edge tie_kind[] = {{0, N, 100}, {1, 0, 50}, {1, N, 50}};
  const int64_t s_tk[][2] = {{1, N}};
  expect_route(tie_kind, COUNT(tie_kind), 0, 1, 50, s_tk, 1);
  /* ties: equal bytes and steps, the patch from the newer version */
  const edge tie_from[] = {{0, N, 100}, {1, N, 100}, {2, 0, 10}, {2, 1, 10}};
  const int64_t s_tf[][2] = {{1, N}, {2, 1}};
  expect_route(tie_from, COUNT(tie_from), N, 2, 110, s_tf, 2);
  /* no route: no snapshot, and the patches do not start from what is held */
  const edge patches[] = {{4, 3, 10}, {5, 4, 10}};
  expect_no_route(patches, COUNT(patches), 2, 5, LH_ERR_NOTFOUND, "no published blobs lead");
  expect_no_route(patches, COUNT(patches), N, 5, LH_ERR_NOTFOUND, "from no weights to version 5");
  expect_no_route(patches, COUNT(patches), 6, 5, LH_ERR_NOTFOUND, "from version 6 to version 5");
  expect_no_route(chain, COUNT(chain), 0, 9, LH_ERR_NOTFOUND, "version 9 is not published");
  const edge dup[] = {{1, N, 10}, {2, 1, 5}};
  lh_sync_manifest v[3];
  build(dup, 2, v);
  v[2] = v[0];
  lh_sync_route r;
  expect_err(lh_sync_plan(v, 3, N, 2, &r), LH_ERR_INVAL, "version 1 is listed twice");
  v[1].blobs[0].from = 2;
  expect_err(lh_sync_plan(v, 2, N, 2, &r), LH_ERR_INVAL, "blob 0 is neither");
  expect_err(lh_sync_plan(v, 2, -2, 2, &r), LH_ERR_INVAL, "from version -2");
}

/* Every route from `at` (N: nothing) to `to` of at most 9 blobs, by exhaustive search: visit(ud,
 * bytes, blobs) for each. */
typedef void (*route_visit)(void *ud, uint64_t bytes, int steps);
static void each_route(const edge *e, int ne, int64_t at, int64_t to, uint64_t bytes, int steps,
                       route_visit visit, void *ud) {
  if (at == to && at != N) {
    visit(ud, bytes, steps);
    return;
  }
  if (steps > 8) return;
  for (int i = 0; i < ne; i++) {
    if (e[i].from != N && e[i].from != at) continue;
    if (e[i].from == N && e[i].to == at) continue;
    if (e[i].from != N && e[i].to <= at) continue;
    each_route(e, ne, e[i].to, to, bytes + e[i].size, steps + 1, visit, ud);
  }
}

/* The cheapest (bytes, then blobs) of the routes visited. */
typedef struct fewest_bytes {
  uint64_t bytes;
  int steps;
} fewest_bytes;
static void visit_bytes(void *ud, uint64_t bytes, int steps) {
  fewest_bytes *b = ud;
  if (bytes < b->bytes || (bytes == b->bytes && steps < b->steps))
    b->bytes = bytes, b->steps = steps;
}

/* The next of a small linear congruential sequence (0..32767). */
static uint32_t lcg(uint32_t *x) {
  *x = *x * 1103515245u + 12345u;
  return (*x >> 16) & 0x7fff;
}

/* Random blob graphs of 2..7 versions: snapshots and patches from any earlier version; the
 * number of edges (0: none this time). */
static int random_edges(uint32_t *x, edge e[40], int *nv) {
#define RND() lcg(x)
  int ne = 0;
  *nv = 2 + (int)(RND() % 6);
  for (int v = 0; v < *nv; v++) {
    if (RND() % 3 == 0) e[ne++] = (edge){v, N, 50 + RND() % 100};
    for (int u = 0; u < v; u++)
      if (RND() % 3 == 0) e[ne++] = (edge){v, u, 1 + RND() % 60};
  }
  return ne;
#undef RND
}

/* Checks that route r applies from `from` (each patch starts where the previous blob left) and
 * ends at `to`; returns its bytes. */
static uint64_t route_walk(const lh_sync_manifest *v, const lh_sync_route *r, int64_t from,
                           int64_t to) {
  int64_t have = from;
  uint64_t sum = 0;
  for (int i = 0; i < r->n; i++) {
    const lh_sync_blob_ref *b = &v[r->steps[i].manifest].blobs[r->steps[i].blob];
    if (b->kind == LH_SYNC_PATCH) assert_int_equal(b->from, have);
    have = v[r->steps[i].manifest].version;
    sum += b->size;
  }
  assert_int_equal(have, to);
  return sum;
}

static void test_plan_random(void **state) {
  (void)state;
  uint32_t x = 12345;
  for (int round = 0; round < 400; round++) {
    edge e[40];
    int nv, ne = random_edges(&x, e, &nv);
    if (ne == 0) continue;
    lh_sync_manifest v[8];
    int n = build(e, ne, v);
    for (int q = 0; q < 6; q++) {
      int64_t from = (int64_t)(lcg(&x) % (unsigned)(nv + 1)) - 1;
      int64_t to = v[lcg(&x) % (unsigned)n].version;
      fewest_bytes best = {UINT64_MAX, 0};
      if (from == to)
        best.bytes = 0;
      else
        each_route(e, ne, from, to, 0, 0, visit_bytes, &best);
      lh_sync_route r;
      lh_err err = lh_sync_plan(v, n, from, to, &r);
      if (best.bytes == UINT64_MAX) {
        assert_int_equal(err, LH_ERR_NOTFOUND);
        continue;
      }
      assert_int_equal(err, LH_ERR_OK);
      assert_int_equal(r.bytes, best.bytes);
      if (from != to) assert_int_equal(r.n, best.steps);
      assert_int_equal(route_walk(v, &r, from, to), r.bytes);
      lh_sync_route_free(&r);
    }
  }
}

/* Plans by time and checks the route's steps (to, from) and its estimate. */
static void expect_timed(const edge *edges, int n_edges, int64_t from, int64_t to, lh_sync_cost c,
                         double seconds, const int64_t (*steps)[2], int n_steps) {
  lh_sync_manifest *v = calloc((size_t)n_edges + 1, sizeof *v);
  int n = build(edges, n_edges, v);
  lh_sync_route r;
  lh_err e = lh_sync_plan_time(v, n, from, to, &c, &r);
  if (e) fail_msg("plan %lld -> %lld: %s", (long long)from, (long long)to, lh_last_error());
  if (fabs(r.seconds - seconds) > 1e-9)
    fail_msg("plan %lld -> %lld: %.6f s, expected %.6f", (long long)from, (long long)to, r.seconds,
             seconds);
  expect_steps(v, &r, steps, n_steps);
  lh_sync_route_free(&r);
  free(v);
}

static void test_plan_time(void **state) {
  (void)state;
  /* the demo's shape: a keyframe of 1140 kB every 7 versions, patches of 180 kB between */
  const edge kf[] = {{0, N, 1140}, {1, 0, 180}, {2, 1, 180}, {3, 2, 180},
                     {4, 3, 180},  {5, 4, 180}, {6, 5, 180}, {6, N, 1140}};
  const int64_t chain6[][2] = {{1, 0}, {2, 1}, {3, 2}, {4, 3}, {5, 4}, {6, 5}};
  const int64_t snap6[][2] = {{6, N}};
  const int64_t one[][2] = {{6, 5}};
  /* kB and kB/s: 300 ms round trips at 1000 kB/s */
  lh_sync_cost serial = {0.3, 1000, 1}, wide = {0.3, 1000, 8}, near = {0, 1000, 1};
  /* 6 behind, one blob at a time: the chain's 6 round trips lose to one snapshot (fewer bytes
   * notwithstanding: lh_sync_plan takes the chain) */
  expect_timed(kf, COUNT(kf), 0, 6, serial, 1.14 + 0.3, snap6, 1);
  expect_route(kf, COUNT(kf), 0, 6, 1080, chain6, 6);
  /* 8 blobs at once: the chain costs one round trip, and its fewer bytes win */
  expect_timed(kf, COUNT(kf), 0, 6, wide, 1.08 + 0.3, chain6, 6);
  /* no round trip to speak of: the fewest bytes */
  expect_timed(kf, COUNT(kf), 0, 6, near, 1.08, chain6, 6);
  /* one behind: the patch, however the link */
  expect_timed(kf, COUNT(kf), 5, 6, serial, 0.18 + 0.3, one, 1);
  /* nothing held: the newest snapshot */
  expect_timed(kf, COUNT(kf), N, 6, wide, 1.14 + 0.3, snap6, 1);
  /* a held version with no manifest of its own, a patch from it */
  const edge held[] = {{4, 3, 7}, {4, N, 100}};
  const int64_t s_held[][2] = {{4, 3}};
  expect_timed(held, COUNT(held), 3, 4, serial, 0.007 + 0.3, s_held, 1);
  /* ties of time: fewer bytes (3 blobs, 2 round trips against 2 blobs of more bytes, 1 round
   * trip, 2 at once) */
  const edge tie[] = {{0, N, 100}, {1, 0, 10}, {2, 1, 10}, {3, 2, 10}, {3, 1, 30}};
  const int64_t s_tie[][2] = {{1, 0}, {2, 1}, {3, 2}};
  lh_sync_cost two = {1.0, 10, 2};
  expect_timed(tie, COUNT(tie), 0, 3, two, 3.0 + 2.0, s_tie, 3);
  expect_timed(tie, COUNT(tie), 0, 3, serial, 0.04 + 0.6, (const int64_t[][2]){{1, 0}, {3, 1}}, 2);
  /* errors: a bad cost, and what lh_sync_plan refuses */
  lh_sync_manifest v[COUNT(kf)];
  int n = build(kf, COUNT(kf), v);
  lh_sync_route r;
  lh_sync_cost bad[] = {{-1, 1, 1}, {0, 0, 1}, {0, 1, 0}, {NAN, 1, 1}, {0, INFINITY, 1}};
  for (int i = 0; i < COUNT(bad); i++) {
    expect_err(lh_sync_plan_time(v, n, 0, 6, &bad[i], &r), LH_ERR_INVAL, "expected a round trip");
    assert_null(r.steps);
  }
  expect_err(lh_sync_plan_time(v, n, 0, 9, &serial, &r), LH_ERR_NOTFOUND, "not published");
  const edge patches[] = {{4, 3, 10}, {5, 4, 10}};
  n = build(patches, COUNT(patches), v);
  expect_err(lh_sync_plan_time(v, n, 2, 5, &serial, &r), LH_ERR_NOTFOUND, "no published blobs");
  v[1] = v[0];
  expect_err(lh_sync_plan_time(v, 2, N, 4, &serial, &r), LH_ERR_INVAL, "listed twice");
  /* from == to: nothing to fetch */
  n = build(kf, COUNT(kf), v);
  assert_int_equal(lh_sync_plan_time(v, n, 3, 3, &serial, &r), LH_ERR_OK);
  assert_int_equal(r.n, 0);
}

/* The fastest of the routes visited, in the cost's seconds. */
typedef struct fastest {
  const lh_sync_cost *c;
  double seconds;
} fastest;
static void visit_time(void *ud, uint64_t bytes, int steps) {
  fastest *f = ud;
  double x = lh_sync_route_seconds(f->c, bytes, steps);
  if (x < f->seconds) f->seconds = x;
}

static void test_plan_time_random(void **state) {
  (void)state;
  uint32_t x = 777;
  for (int round = 0; round < 400; round++) {
    edge e[40];
    int nv, ne = random_edges(&x, e, &nv);
    if (ne == 0) continue;
    lh_sync_manifest v[8];
    int n = build(e, ne, v);
    lh_sync_cost c = {0};
    c.rtt_s = lcg(&x) % 50;
    c.bytes_per_s = 1.0 + lcg(&x) % 4;
    c.parallel = 1 + (int)(lcg(&x) % 3);
    for (int q = 0; q < 6; q++) {
      int64_t from = (int64_t)(lcg(&x) % (unsigned)(nv + 1)) - 1;
      int64_t to = v[lcg(&x) % (unsigned)n].version;
      fastest best = {&c, INFINITY};
      if (from == to)
        best.seconds = 0;
      else
        each_route(e, ne, from, to, 0, 0, visit_time, &best);
      lh_sync_route r;
      lh_err err = lh_sync_plan_time(v, n, from, to, &c, &r);
      if (best.seconds == INFINITY) {
        assert_int_equal(err, LH_ERR_NOTFOUND);
        continue;
      }
      assert_int_equal(err, LH_ERR_OK);
      if (fabs(r.seconds - best.seconds) > 1e-9)
        fail_msg("%.6f s, the fastest %.6f", r.seconds, best.seconds);
      /* the route is applicable and its estimate is its own */
      assert_int_equal(route_walk(v, &r, from, to), r.bytes);
      if (r.n) assert_true(fabs(lh_sync_route_seconds(&c, r.bytes, r.n) - r.seconds) < 1e-12);
      lh_sync_route_free(&r);
    }
  }
}

static void test_keyframe_rule(void **state) {
  (void)state;
  assert_true(lh_sync_keyframe_due(4, 0, N, 0, 1000));      /* no keyframe yet */
  assert_false(lh_sync_keyframe_due(4, 3, 0, 300, 1000));   /* 3 versions, cheap chain */
  assert_true(lh_sync_keyframe_due(4, 4, 0, 300, 1000));    /* every 4 versions */
  assert_true(lh_sync_keyframe_due(4, 2, 0, 1001, 1000));   /* the chain costs more */
  assert_false(lh_sync_keyframe_due(4, 2, 0, 1000, 1000));  /* as much is not more */
  assert_false(lh_sync_keyframe_due(0, 100, 0, 999, 1000)); /* every 0: the cost rule alone */
  assert_true(lh_sync_keyframe_due(0, 100, 0, 1001, 1000));
  assert_true(lh_sync_keyframe_due(4, 5, 5, 0, 1000)); /* not newer than the keyframe */
  /* a publisher over 20 versions, patches of 100 bytes and a 350-byte snapshot, K = 8: keyframes
   * at 0 and wherever a fourth patch would be due (every 4 versions, before K) */
  int64_t last = N;
  uint64_t chain = 0;
  char got[64] = "";
  for (int64_t v = 0; v < 20; v++) {
    uint64_t patch = 100;
    if (lh_sync_keyframe_due(8, v, last, chain + patch, 350)) {
      last = v, chain = 0;
      snprintf(got + strlen(got), sizeof got - strlen(got), "%lld ", (long long)v);
    } else {
      chain += patch;
    }
  }
  assert_string_equal(got, "0 4 8 12 16 ");
  /* with big snapshots, K decides */
  last = N, chain = 0, got[0] = '\0';
  for (int64_t v = 0; v < 20; v++) {
    if (lh_sync_keyframe_due(8, v, last, chain + 100, 1000000)) {
      last = v, chain = 0;
      snprintf(got + strlen(got), sizeof got - strlen(got), "%lld ", (long long)v);
    } else {
      chain += 100;
    }
  }
  assert_string_equal(got, "0 8 16 ");
}

/* ---------------------------------------------------------------- rebuilding */

#define RB_VALUES   4096
#define RB_VERSIONS 12

typedef struct rebuilt {
  const char *dir;
  uint16_t (*want)[RB_VALUES]; /* (RB_VERSIONS, RB_VALUES) the slabs the test made */
  lh_sync_manifest *ms;
  int64_t next;    /* the version expected next */
  int64_t stop_at; /* the callback fails here (-1: never) */
} rebuilt;

/* Checks the version given against the test's own slab, then deletes that version's blobs: a
 * rebuild in one pass never reads them again. */
static lh_err rebuilt_check(void *ctx, int64_t v, const uint16_t *slab) {
  rebuilt *r = ctx;
  assert_int_equal(v, r->next);
  r->next++;
  assert_memory_equal(slab, r->want[v], sizeof r->want[v]);
  for (int i = 0; i < r->ms[v].n_blobs; i++) {
    char *path = lh_sync_blob_path(r->dir, r->ms[v].blobs[i].hash);
    unlink(path);
    free(path);
  }
  return v == r->stop_at ? lh_errorf(LH_ERR_IO, "stopped at %lld", (long long)v) : LH_ERR_OK;
}

/* Versions 0 .. 11 of a slab, each changing a few values of the one before: patches from each
 * version to the next, snapshots at 0 and 6 (a keyframe), all in a blob store. */
static void rebuild_fixture(const char *dir, uint16_t (*want)[RB_VALUES], lh_sync_manifest *ms) {
  uint32_t x = 777;
#define RND() lcg(&x)
  for (int i = 0; i < RB_VALUES; i++)
    want[0][i] = (uint16_t)(0x3c00 + RND() % 512);
  lh_patch_section sec = {0, RB_VALUES};
  for (int v = 0; v < RB_VERSIONS; v++) {
    lh_sync_manifest *m = &ms[v];
    memset(m, 0, sizeof *m);
    m->version = v;
    m->parent = v ? v - 1 : LH_SYNC_NONE;
    m->elements = RB_VALUES;
    if (v) {
      memcpy(want[v], want[v - 1], sizeof want[v]);
      for (int k = 0; k < 40; k++) {
        uint32_t at = RND() % RB_VALUES;
        want[v][at] ^= (uint16_t)(1 + RND() % 7);
      }
    }
    lh_sync_slab_hash(want[v], RB_VALUES, m->slab);
    uint8_t *blob = NULL;
    size_t len = 0;
    if (v) {
      if (lh_patch_make(want[v - 1], want[v], RB_VALUES, &sec, 1, v - 1, v, &blob, &len))
        fail_msg("%s", lh_last_error());
      m->blobs[m->n_blobs] = (lh_sync_blob_ref){LH_SYNC_PATCH, v - 1, len, {0}};
      if (lh_sync_blob_put(dir, blob, len, m->blobs[m->n_blobs++].hash))
        fail_msg("%s", lh_last_error());
      free(blob);
    }
    if (v == 0 || v == 6) {
      if (lh_sync_snapshot_encode(want[v], RB_VALUES, 3, &blob, &len))
        fail_msg("%s", lh_last_error());
      m->blobs[m->n_blobs] = (lh_sync_blob_ref){LH_SYNC_SNAPSHOT, LH_SYNC_NONE, len, {0}};
      if (lh_sync_blob_put(dir, blob, len, m->blobs[m->n_blobs++].hash))
        fail_msg("%s", lh_last_error());
      free(blob);
    }
  }
#undef RND
}

/* A fresh blob store of the fixture in dir, and a check expecting versions from `first` on that
 * fails at stop_at. */
static rebuilt rebuild_setup(char *dir, size_t cap, uint16_t (*want)[RB_VALUES],
                             lh_sync_manifest *ms, int64_t first, int64_t stop_at) {
  make_tmpdir(dir, cap);
  rebuild_fixture(dir, want, ms);
  return (rebuilt){dir, want, ms, first, stop_at};
}

static void test_rebuild(void **state) {
  (void)state;
  char dir[256];
  uint16_t(*want)[RB_VALUES] = malloc(RB_VERSIONS * sizeof *want);
  lh_sync_manifest *ms = malloc(RB_VERSIONS * sizeof *ms);
  assert_true(want && ms);
  /* across the keyframe at 6 (from the snapshot at 0), and after it (from the keyframe) */
  const int64_t ranges[][2] = {{2, 9}, {7, 11}, {0, 0}, {11, 11}};
  for (int t = 0; t < COUNT(ranges); t++) {
    int64_t lo = ranges[t][0], hi = ranges[t][1];
    rebuilt r = rebuild_setup(dir, sizeof dir, want, ms, lo, -1);
    if (lh_sync_rebuild(ms, RB_VERSIONS, dir, lo, hi, rebuilt_check, &r))
      fail_msg("versions %lld .. %lld: %s", (long long)lo, (long long)hi, lh_last_error());
    assert_int_equal(r.next, hi + 1);
    rm_rf(dir);
  }
  /* the callback's error stops the rebuild */
  rebuilt r = rebuild_setup(dir, sizeof dir, want, ms, 3, 5);
  expect_err(lh_sync_rebuild(ms, RB_VERSIONS, dir, 3, 9, rebuilt_check, &r), LH_ERR_IO,
             "stopped at 5");
  assert_int_equal(r.next, 6);
  rm_rf(dir);
  /* a manifest whose slab hash is not what its blobs make */
  r = rebuild_setup(dir, sizeof dir, want, ms, 7, -1);
  ms[8].slab[0] ^= 1;
  expect_err(lh_sync_rebuild(ms, RB_VERSIONS, dir, 7, 9, rebuilt_check, &r), LH_ERR_MISMATCH,
             "version 8: the weights do not hash to the manifest's");
  assert_int_equal(r.next, 8);
  rm_rf(dir);
  /* a blob missing from the store; a range that is not one */
  r = rebuild_setup(dir, sizeof dir, want, ms, 7, -1);
  char *path = lh_sync_blob_path(dir, ms[9].blobs[0].hash);
  unlink(path);
  free(path);
  assert_int_equal(lh_sync_rebuild(ms, RB_VERSIONS, dir, 7, 10, rebuilt_check, &r),
                   LH_ERR_NOTFOUND);
  assert_int_equal(r.next, 9);
  expect_err(lh_sync_rebuild(ms, RB_VERSIONS, dir, 5, 4, rebuilt_check, &r), LH_ERR_INVAL,
             "versions 5 .. 4");
  rm_rf(dir);
  free(want);
  free(ms);
}

/* One blob at a time, as a worker applies them: the snapshot, then patches; a patch with no slab,
 * one whose parent is not the slab (when its hash is known), and a damaged snapshot refused. */
static void test_apply_blob(void **state) {
  (void)state;
  char dir[256];
  uint16_t(*want)[RB_VALUES] = malloc(RB_VERSIONS * sizeof *want);
  lh_sync_manifest *ms = malloc(RB_VERSIONS * sizeof *ms);
  assert_true(want && ms);
  make_tmpdir(dir, sizeof dir);
  rebuild_fixture(dir, want, ms);
  uint16_t *slab = NULL;
  uint8_t hash[LH_HASH_BYTES], *data = NULL;
  bool known = false;
  size_t len = 0;
  const lh_sync_blob_ref *b = &ms[6].blobs[0]; /* version 6's patch, before any snapshot */
  if (lh_sync_blob_get(dir, b->hash, b->size, &data, &len)) fail_msg("%s", lh_last_error());
  expect_err(lh_sync_apply_blob(b, 6, data, len, RB_VALUES, &slab, hash, &known), LH_ERR_FORMAT,
             "version 6: a patch before any snapshot");
  assert_false(known);
  free(data);
  b = &ms[0].blobs[0]; /* a snapshot of fewer values than the slab: refused, not a short slab */
  if (lh_sync_blob_get(dir, b->hash, b->size, &data, &len)) fail_msg("%s", lh_last_error());
  expect_err(lh_sync_apply_blob(b, 0, data, len, RB_VALUES + 1, &slab, hash, &known),
             LH_ERR_MISMATCH, "the snapshot holds 4096 values, the manifest 4097");
  assert_null(slab);
  free(data);
  for (int v = 0; v < 4; v++) { /* 0's snapshot, then the patches to 1, 2, 3 */
    b = &ms[v].blobs[0];
    if (lh_sync_blob_get(dir, b->hash, b->size, &data, &len)) fail_msg("%s", lh_last_error());
    if (lh_sync_apply_blob(b, v, data, len, RB_VALUES, &slab, hash, &known))
      fail_msg("version %d: %s", v, lh_last_error());
    free(data);
    assert_true(known);
    assert_memory_equal(hash, ms[v].slab, LH_HASH_BYTES);
    assert_memory_equal(slab, want[v], sizeof want[v]);
  }
  b = &ms[5].blobs[0]; /* from 4, applied to 3: its parent hash is not the slab's */
  if (lh_sync_blob_get(dir, b->hash, b->size, &data, &len)) fail_msg("%s", lh_last_error());
  assert_int_equal(lh_sync_apply_blob(b, 5, data, len, RB_VALUES, &slab, hash, &known),
                   LH_ERR_MISMATCH);
  free(data);
  b = &ms[6].blobs[1]; /* the keyframe, one byte of its payload changed */
  if (lh_sync_blob_get(dir, b->hash, b->size, &data, &len)) fail_msg("%s", lh_last_error());
  data[len - 1] ^= 0x40;
  assert_int_not_equal(lh_sync_apply_blob(b, 6, data, len, RB_VALUES, &slab, hash, &known),
                       LH_ERR_OK);
  data[len - 1] ^= 0x40;
  if (lh_sync_apply_blob(b, 6, data, len, RB_VALUES, &slab, hash, &known)) /* intact: it replaces */
    fail_msg("%s", lh_last_error());
  free(data);
  assert_memory_equal(hash, ms[6].slab, LH_HASH_BYTES);
  assert_memory_equal(slab, want[6], sizeof want[6]);
  free(slab);
  rm_rf(dir);
  free(want);
  free(ms);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_key_text),
      cmocka_unit_test(test_key_refusals),
      cmocka_unit_test(test_key_files),
      cmocka_unit_test(test_manifest_round_trip),
      cmocka_unit_test(test_manifest_fixtures),
      cmocka_unit_test(test_manifest_refusals),
      cmocka_unit_test(test_manifest_checks),
      cmocka_unit_test(test_manifest_unsigned),
      cmocka_unit_test(test_snapshot_round_trip),
      cmocka_unit_test(test_snapshot_fixture),
      cmocka_unit_test(test_snapshot_refusals),
      cmocka_unit_test(test_blob_store),
      cmocka_unit_test(test_plan_graphs),
      cmocka_unit_test(test_plan_random),
      cmocka_unit_test(test_plan_time),
      cmocka_unit_test(test_plan_time_random),
      cmocka_unit_test(test_keyframe_rule),
      cmocka_unit_test(test_rebuild),
      cmocka_unit_test(test_apply_blob),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
