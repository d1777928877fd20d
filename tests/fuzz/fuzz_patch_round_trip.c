/* libFuzzer round trip of policy patches: the input gives a parent slab, a child made by moving
 * some of its values (by steps of the order-preserving image of bf16, of any size) and a tiling
 * into sections; making the patch and applying it to the parent must give the child bit for bit. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/patch.h"

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  /* layout: n_sections byte, then 3 bytes per value: the parent's bits and a step byte */
  int ns = data[0] % 8 + 1;
  size_t n = (size - 1) / 3;
  if (n == 0) return 0;
  uint16_t *p = malloc(n * 2), *c = malloc(n * 2), *w = malloc(n * 2);
  CHECK(p && c && w);
  for (size_t i = 0; i < n; i++) {
    const uint8_t *q = data + 1 + 3 * i;
    p[i] = (uint16_t)(q[0] | q[1] << 8);
    int8_t step = (int8_t)q[2];
    int32_t k = lh_bf16_key(p[i]) + (step % 16 == 0 ? step * 256 : step % 3 == 0 ? 0 : step);
    c[i] = k >= 0 && k <= 0xFFFF ? lh_bf16_from_key((uint16_t)k) : p[i];
  }
  lh_patch_section s[8];
  size_t at = 0;
  for (int i = 0; i < ns; i++) {
    size_t len = i == ns - 1 ? n - at : (n - at) / 2;
    s[i] = (lh_patch_section){at, len};
    at += len;
  }
  uint8_t *patch = NULL;
  size_t len = 0;
  CHECK(lh_patch_make(p, c, n, s, ns, 1, 2, &patch, &len) == LH_ERR_OK);
  memcpy(w, p, n * 2);
  CHECK(lh_patch_apply(w, n, patch, len, NULL) == LH_ERR_OK);
  CHECK(memcmp(w, c, n * 2) == 0);
  free(patch);
  free(p);
  free(c);
  free(w);
  return 0;
}
