/* libFuzzer target for the safetensors readers: parse any bytes; lh_safetensors_open_buffer
 * (its own copy) must agree with lh_safetensors_parse; on success every tensor must lie inside
 * the input and be found by name, every metadata pair by key, small float tensors are converted
 * to fp32, and small images are re-encoded in memory and to a file (the same bytes), re-read
 * (from memory, from the file and lazily) and compared (decode -> encode -> decode). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/model.h"

#include "fuzz_util.h"

/* b holds every tensor of a with the same name, dtype, shape and bytes, and every metadata
 * pair of a; when b was written from a, the writer adds "format":"pt" if a has no format. */
static void same(const lh_safetensors *a, const lh_safetensors *b, int written) {
  CHECK(b->n == a->n);
  for (int i = 0; i < a->n; i++) {
    const lh_st_tensor *x = &a->tensors[i], *y = lh_safetensors_find(b, x->name);
    CHECK(y);
    CHECK(x->dtype == y->dtype && x->ndim == y->ndim && x->nbytes == y->nbytes);
    CHECK(memcmp(x->shape, y->shape, sizeof x->shape) == 0);
    if (x->nbytes == 0) continue;
    uint8_t *got = malloc(x->nbytes);
    CHECK(got);
    CHECK(lh_safetensors_read(b, y, 0, got, y->nbytes) == LH_ERR_OK);
    CHECK(memcmp(got, x->data, x->nbytes) == 0);
    free(got);
  }
  for (int i = 0; i < a->n_meta; i++) {
    const char *v = lh_safetensors_meta(b, a->meta_kv[2 * i]);
    CHECK(v && strcmp(v, a->meta_kv[2 * i + 1]) == 0);
  }
  CHECK(b->n_meta == a->n_meta + (written && !lh_safetensors_meta(a, "format")));
}

static void reencode(const lh_safetensors *st) {
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
  const char *const *kv = (const char *const *)st->meta_kv;
  char *buf = NULL;
  size_t len = 0;
  CHECK(lh_safetensors_write_buffer(e, st->n, kv, st->n_meta, &buf, &len) == LH_ERR_OK);
  lh_safetensors *back = NULL;
  CHECK(lh_safetensors_parse((const uint8_t *)buf, len, "fuzz", &back) == LH_ERR_OK);
  same(st, back, 1);
  lh_safetensors_close(back);
  const char *path = fuzz_scratch_path("st", ".safetensors");
  if (path) {
    CHECK(lh_safetensors_write_meta(path, e, st->n, kv, st->n_meta) == LH_ERR_OK);
    char *file = NULL;
    size_t flen = 0;
    CHECK(lh_file_read(path, len + 1, &file, &flen) == LH_ERR_OK);
    CHECK(flen == len && memcmp(file, buf, len) == 0);
    free(file);
    CHECK(lh_safetensors_open(path, &back) == LH_ERR_OK);
    same(st, back, 1);
    lh_safetensors_close(back);
    CHECK(lh_safetensors_open_lazy(path, &back) == LH_ERR_OK);
    same(st, back, 1);
    lh_safetensors_close(back);
    unlink(path);
  }
  free(buf);
  free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_safetensors *st = NULL, *copy = NULL;
  lh_err err = lh_safetensors_parse(data, size, "fuzz", &st);
  lh_err err2 = lh_safetensors_open_buffer(data, size, "fuzz", &copy);
  CHECK(err == err2);
  if (err != LH_ERR_OK) {
    CHECK(st == NULL && copy == NULL);
    CHECK(strncmp(lh_last_error(), "fuzz", 4) == 0); /* messages name the source */
    return 0;
  }
  same(st, copy, 0);
  lh_safetensors_close(copy);
  for (int i = 0; i < st->n_meta; i++)
    CHECK(strcmp(lh_safetensors_meta(st, st->meta_kv[2 * i]), st->meta_kv[2 * i + 1]) == 0);
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
