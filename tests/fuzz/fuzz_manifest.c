/* libFuzzer target for manifests: any bytes through lh_sync_manifest_parse, _verify (pinned: the
 * fixture key of tests/fixtures/sync, whose seed is below, so the corpus holds manifests that
 * verify) and _from_json. Verify accepts only what parse accepts, and refuses that only for the
 * key or the signature; an accepted manifest is canonical (re-signing it with the fixture key
 * gives the input back exactly); whatever parses is signed again and verifies with the same
 * fields; an unsigned manifest that reads signs into one that verifies. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/sync.h"

#include "fuzz_util.h"

static const char seed_hex[] = "d4169fd6b22116b3cce91787040406dd6efec77dd3ea4845f1f01958ff704b2c";

static void same_fields(const lh_sync_manifest *a, const lh_sync_manifest *b) {
  CHECK(a->version == b->version && a->parent == b->parent && a->elements == b->elements);
  CHECK(!memcmp(a->slab, b->slab, LH_HASH_BYTES) && !memcmp(a->config, b->config, LH_HASH_BYTES));
  CHECK(a->has_tokenizer == b->has_tokenizer);
  CHECK(!a->has_tokenizer || !memcmp(a->tokenizer, b->tokenizer, LH_HASH_BYTES));
  CHECK(a->n_blobs == b->n_blobs);
  for (int i = 0; i < a->n_blobs; i++) {
    CHECK(a->blobs[i].kind == b->blobs[i].kind && a->blobs[i].from == b->blobs[i].from);
    CHECK(a->blobs[i].size == b->blobs[i].size);
    CHECK(!memcmp(a->blobs[i].hash, b->blobs[i].hash, LH_HASH_BYTES));
  }
}

/* Signs m with sk; the result verifies under pk with m's fields. */
static void resign(const lh_sync_manifest *m, const lh_sync_secret_key *sk,
                   const lh_sync_public_key *pk, char **out, size_t *len) {
  CHECK(lh_sync_manifest_sign(m, sk, out, len) == LH_ERR_OK);
  lh_sync_manifest back;
  CHECK(lh_sync_manifest_verify(*out, *len, pk, "resigned", &back) == LH_ERR_OK);
  same_fields(m, &back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static lh_sync_secret_key sk;
  static lh_sync_public_key pk;
  static int init;
  if (!init) {
    uint8_t seed[LH_SYNC_SEED_BYTES];
    CHECK(lh_sync_hash_parse(seed_hex, 64, "seed", seed) == LH_ERR_OK);
    lh_sync_key_from_seed(seed, &sk);
    lh_sync_key_public(&sk, &pk);
    init = 1;
  }
  lh_sync_manifest parsed, verified, loose;
  lh_err pe = lh_sync_manifest_parse(data, size, "fuzz", &parsed);
  lh_err ve = lh_sync_manifest_verify(data, size, &pk, "fuzz", &verified);
  char *out = NULL;
  size_t len = 0;
  if (pe != LH_ERR_OK) {
    CHECK(ve == pe);
    CHECK(strncmp(lh_last_error(), "fuzz: ", 6) == 0);
  } else {
    CHECK(parsed.n_blobs >= 1 && parsed.n_blobs <= LH_SYNC_MAX_BLOBS);
    CHECK(lh_sync_manifest_check(&parsed, "parsed") == LH_ERR_OK);
    CHECK(ve == LH_ERR_OK || ve == LH_ERR_MISMATCH || ve == LH_ERR_SIGNATURE);
    if (ve == LH_ERR_MISMATCH) CHECK(memcmp(parsed.key.bytes, pk.bytes, sizeof pk.bytes) != 0);
    resign(&parsed, &sk, &pk, &out, &len);
    if (ve == LH_ERR_OK) {
      same_fields(&parsed, &verified);
      CHECK(len == size && memcmp(out, data, size) == 0); /* one encoding, one signature */
    }
    free(out);
    out = NULL;
  }
  if (lh_sync_manifest_from_json((const char *)data, size, "fuzz", &loose) == LH_ERR_OK) {
    resign(&loose, &sk, &pk, &out, &len);
    free(out);
  }
  return 0;
}
