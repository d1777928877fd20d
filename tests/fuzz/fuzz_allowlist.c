/* libFuzzer target for serve's key allowlist (lh_node_allowlist_parse): any bytes. An accepted
 * file yields one key per line that is neither blank nor a comment, each printing back as that
 * line; a refusal leaves no keys and names the file and the line. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/node.h"

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_sync_public_key *keys = NULL;
  int n = -1;
  if (lh_node_allowlist_parse(data, size, "fuzz", &keys, &n) == LH_ERR_OK) {
    const char *p = (const char *)data, *end = p + size;
    int k = 0;
    while (p < end) {
      const char *nl = memchr(p, '\n', (size_t)(end - p));
      size_t l = (size_t)((nl ? nl : end) - p);
      if (l > 0 && p[l - 1] == '\r') l--;
      if (l > 0 && p[0] != '#') {
        CHECK(k < n);
        char line[LH_SYNC_KEY_TEXT_BYTES];
        lh_sync_public_key_text(&keys[k++], line);
        CHECK(strlen(line) == l && memcmp(line, p, l) == 0);
      }
      p = nl ? nl + 1 : end;
    }
    CHECK(k == n);
  } else {
    CHECK(keys == NULL && n == 0);
    CHECK(strncmp(lh_last_error(), "fuzz: ", 6) == 0);
  }
  free(keys);
  return 0;
}
