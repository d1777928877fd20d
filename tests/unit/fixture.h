/* Reading the PyTorch reference fixtures (tests/fixtures/, written by tests/ref) in the parity
 * tests: a copy of one tensor, checked for dtype and element count. Include after <cmocka.h>
 * and longhaul/model.h. */
#ifndef LONGHAUL_TEST_FIXTURE_H
#define LONGHAUL_TEST_FIXTURE_H

#include <stdlib.h>
#include <string.h>

#include "longhaul/model.h"

/* A malloc'd copy of tensor `name`, checked for dtype and element count (numel < 0: any count,
 * returned in *count when count is not NULL). Element size 4 except U8. */
static inline void *fixture_tensor(const lh_safetensors *st, const char *name, lh_dtype dtype,
                                   long numel, long *count) {
  const lh_st_tensor *t = lh_safetensors_find(st, name);
  if (!t) fail_msg("fixture: no tensor %s", name);
  if (t->dtype != dtype)
    fail_msg("fixture: tensor %s: dtype %d, expected %d", name, (int)t->dtype, (int)dtype);
  size_t esize = dtype == LH_DTYPE_U8 ? 1 : 4;
  if (numel >= 0 && t->nbytes != (size_t)numel * esize)
    fail_msg("fixture: tensor %s: %zu bytes, expected %ld elements", name, t->nbytes, numel);
  if (count) *count = (long)(t->nbytes / esize);
  void *p = malloc(t->nbytes > 0 ? t->nbytes : 1);
  memcpy(p, t->data, t->nbytes);
  return p;
}

#endif
