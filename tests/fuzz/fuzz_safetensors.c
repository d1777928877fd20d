/* libFuzzer target for the safetensors parser: parse any bytes; on success every tensor must lie
 * inside the input and be found by name, small float tensors are converted to fp32, and small
 * files are re-encoded, re-parsed and compared (decode -> encode -> decode). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/model.h"

#include "fuzz_util.h"

static void reencode(const lh_safetensors *st) {
  const char *path = fuzz_scratch_path("st", ".safetensors");
  if (!path) return;
  lh_st_entry *e = calloc((size_t)st->n + 1, sizeof *e);
  CHECK(e);
  for (int i = 0; i < st->n; i++) {
    const lh_st_tensor *t = &st->tensors[i];
    e[i].name = t->name;
    e[i].dtype = t->dtype;
    e[i].ndim = t->ndim;
    memcpy(e[i].shape, t->shape, sizeof t->shape);
    e[i].data = t->data;
  }
  CHECK(lh_safetensors_write(path, e, st->n) == LH_ERR_OK);
  lh_safetensors *back = NULL;
  CHECK(lh_safetensors_open(path, &back) == LH_ERR_OK);
  CHECK(back->n == st->n);
  for (int i = 0; i < st->n; i++) {
    const lh_st_tensor *a = &st->tensors[i], *b = &back->tensors[i];
    CHECK(strcmp(a->name, b->name) == 0);
    CHECK(a->dtype == b->dtype && a->ndim == b->ndim && a->nbytes == b->nbytes);
    CHECK(memcmp(a->shape, b->shape, sizeof a->shape) == 0);
    CHECK(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
  }
  lh_safetensors_close(back);
  unlink(path);
  free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_safetensors *st = NULL;
  lh_err err = lh_safetensors_parse(data, size, "fuzz", &st);
  if (err != LH_ERR_OK) {
    CHECK(st == NULL);
    CHECK(strncmp(lh_last_error(), "fuzz", 4) == 0); /* messages name the source */
    return 0;
  }
  size_t total = 0;
  for (int i = 0; i < st->n; i++) {
    const lh_st_tensor *t = &st->tensors[i];
    CHECK(t->name && t->name[0]);
    CHECK(lh_safetensors_find(st, t->name) == t);
    CHECK(t->nbytes == 0 || (t->data >= data + 8 && t->data + t->nbytes <= data + size));
    CHECK(t->ndim >= 0 && t->ndim <= LH_ST_MAX_DIMS);
    total += t->nbytes;
    if (t->dtype != LH_DTYPE_F32 && t->dtype != LH_DTYPE_BF16 && t->dtype != LH_DTYPE_F16) {
      float dummy;
      CHECK(lh_safetensors_read_f32(st, t, &dummy, 1) != LH_ERR_OK);
      continue;
    }
    size_t esz = t->dtype == LH_DTYPE_F32 ? 4 : 2;
    size_t n = t->nbytes / esz;
    if (n > (1u << 16)) continue;
    float *dst = malloc(n * sizeof *dst + 1);
    CHECK(dst);
    CHECK(lh_safetensors_read_f32(st, t, dst, n) == LH_ERR_OK);
    if (t->dtype == LH_DTYPE_F32) CHECK(n == 0 || memcmp(dst, t->data, t->nbytes) == 0);
    if (n > 0) CHECK(lh_safetensors_read_f32(st, t, dst, n - 1) == LH_ERR_MISMATCH);
    free(dst);
  }
  CHECK(total <= size);
  if (total <= (1u << 16) && st->n <= 256) reencode(st);
  lh_safetensors_close(st);
  return 0;
}
