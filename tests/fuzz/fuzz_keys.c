/* libFuzzer target for the key-file parsers: any bytes, read as a public and as a secret key. An
 * accepted line is exactly the documented one: printing the parsed key gives the input back
 * (without its optional final newline), a public key is a valid point, and a secret key's public
 * half verifies what it signs. A refusal leaves the key zeroed and names its source. */
#include <sodium.h>
#include <stdint.h>
#include <string.h>

#include "longhaul/sync.h"

#include "fuzz_util.h"

static int all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

static void same_text(const char *line, const uint8_t *data, size_t size) {
  size_t n = strlen(line);
  CHECK(size == n || (size == n + 1 && data[n] == '\n'));
  CHECK(memcmp(line, data, n) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *text = (const char *)data;
  char line[LH_SYNC_KEY_TEXT_BYTES];
  lh_sync_public_key pk;
  if (lh_sync_public_key_parse(text, size, "fuzz", &pk) == LH_ERR_OK) {
    lh_sync_public_key_text(&pk, line);
    same_text(line, data, size);
    CHECK(crypto_core_ed25519_is_valid_point(pk.bytes));
  } else {
    CHECK(all_zero(pk.bytes, sizeof pk.bytes));
    CHECK(strncmp(lh_last_error(), "fuzz: ", 6) == 0);
  }
  lh_sync_secret_key sk;
  if (lh_sync_secret_key_parse(text, size, "fuzz", &sk) == LH_ERR_OK) {
    lh_sync_secret_key_text(&sk, line);
    same_text(line, data, size);
    lh_sync_key_public(&sk, &pk);
    uint8_t sig[LH_SYNC_SIGNATURE_BYTES];
    crypto_sign_detached(sig, NULL, data, size, sk.sk);
    CHECK(crypto_sign_verify_detached(sig, data, size, pk.bytes) == 0);
  } else {
    CHECK(all_zero(sk.sk, sizeof sk.sk));
    CHECK(strncmp(lh_last_error(), "fuzz: ", 6) == 0);
  }
  return 0;
}
