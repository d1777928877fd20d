/* libFuzzer target for the networked protocol's parsers (node.h): any bytes as a lease request
 * (server side), a lease reply and a ledger group spec (worker and server side), and as the four
 * signed-request headers (split at the first three NUL bytes). A reply that parses re-encodes
 * (lh_node_lease_json) into one that parses to the same groups; a lease request that parses has
 * its fields in range; parsed headers never verify a signature they were not made with. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/node.h"

#include "fuzz_util.h"

#define VOCAB 99

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_node_lease_request lr;
  if (lh_node_lease_request_parse(data, size, &lr) == LH_ERR_OK)
    CHECK(lr.groups >= 1 && lr.groups <= LH_NODE_MAX_LEASE_GROUPS && lr.version >= -1);
  lh_node_lease l;
  if (lh_node_lease_parse(data, size, VOCAB, &l) == LH_ERR_OK) {
    size_t len = 0;
    char *text = lh_node_lease_json(&l, &len);
    CHECK(text);
    lh_node_lease b;
    CHECK(lh_node_lease_parse(text, len, VOCAB, &b) == LH_ERR_OK);
    CHECK(b.lease == l.lease && b.expires_ms == l.expires_ms && b.n_groups == l.n_groups);
    for (int i = 0; i < l.n_groups; i++) {
      const lh_node_group *x = &l.groups[i], *y = &b.groups[i];
      CHECK(x->group == y->group && x->task == y->task && x->seed == y->seed);
      CHECK(x->prompt_len == y->prompt_len && x->group_size == y->group_size);
      CHECK(!memcmp(x->prompt, y->prompt, (size_t)x->prompt_len * sizeof *x->prompt));
      CHECK(x->prompt_len >= 1 && x->prompt_len <= LH_NODE_MAX_PROMPT);
    }
    lh_node_lease_clear(&b);
    free(text);
    lh_node_lease_clear(&l);
  }
  lh_node_group g;
  if (lh_node_group_parse(data, size, VOCAB, "fuzz", &g) == LH_ERR_OK) lh_node_group_clear(&g);
  /* headers: NUL-separated fields */
  char *copy = malloc(size + 1);
  memcpy(copy, data, size);
  copy[size] = '\0';
  const char *f[4] = {NULL, NULL, NULL, NULL};
  char *p = copy;
  for (int i = 0; i < 4 && p <= copy + size; i++) {
    f[i] = p;
    p += strlen(p) + 1;
  }
  lh_node_auth a;
  if (lh_node_auth_parse(f[0], f[1], f[2], f[3], &a) == LH_ERR_OK)
    CHECK(lh_node_auth_verify(&a, "POST", "/v1/leases", data, size) == LH_ERR_SIGNATURE ||
          a.time_ms >= 0);
  free(copy);
  return 0;
}
