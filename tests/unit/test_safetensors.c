/* safetensors and model directories: write -> parse round trips (F32, BF16, F16, ints), every
 * malformed-header case with its error code and a message naming the tensor, and
 * lh_model_save/lh_model_load (Qwen2, Qwen3, Llama; tied, untied, sharded with weight_map
 * naming each tensor's shard, missing and misshapen tensors; generation_config.json's eos
 * list). */
#include <dirent.h>
#include <fcntl.h>
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

#include "longhaul/model.h"
#include "longhaul/tensor.h"

/* ---------------------------------------------------------------- helpers */

static char tmpdir[64];

static int setup_dir(void **state) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/lh_test_st_XXXXXX");
  assert_non_null(mkdtemp(tmpdir));
  return 0;
}

static int teardown_dir(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  assert_int_equal(system(cmd), 0);
  return 0;
}

static char *path_in(const char *name) {
  static char buf[256];
  snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
  return buf;
}

/* A safetensors image: 8-byte length, header text, data. */
static uint8_t *image(const char *header, const void *data, size_t dlen, size_t *len) {
  size_t h = strlen(header);
  uint8_t *b = malloc(8 + h + dlen + 1);
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)((uint64_t)h >> (8 * i));
  memcpy(b + 8, header, h);
  if (dlen) memcpy(b + 8 + h, data, dlen);
  *len = 8 + h + dlen;
  return b;
}

/* Parses header+data and expects `code` with a message containing each of the given strings. */
static void expect_parse_error(const char *header, size_t dlen, lh_err code, const char *needle1,
                               const char *needle2) {
  uint8_t zeros[256] = {0};
  assert_true(dlen <= sizeof zeros);
  size_t len;
  uint8_t *b = image(header, zeros, dlen, &len);
  lh_safetensors *st = (lh_safetensors *)0x1;
  lh_err e = lh_safetensors_parse(b, len, "test.safetensors", &st);
  const char *msg = lh_last_error();
  if (e != code || !strstr(msg, needle1) || (needle2 && !strstr(msg, needle2)))
    fail_msg("header %s: got %s \"%s\", expected %s containing \"%s\"", header, lh_err_name(e), msg,
             lh_err_name(code), needle1);
  assert_null(st);
  assert_non_null(strstr(msg, "test.safetensors"));
  free(b);
}

/* ---------------------------------------------------------------- round trips */

static void test_round_trip_all_dtypes(void **state) {
  float a[6] = {1.5f, -2.25f, 3.0e-8f, 1e30f, -0.0f, 7.0f};
  float src_b[5] = {1.0f, -2.5f, 0.1f, 3.14159265f, -1e-20f};
  uint16_t b[5];
  lh_bf16_from_f32_n(b, src_b, 5);
  /* F16: 1, -2, 65504 (max), 2^-24 (smallest subnormal), 2^-15 (subnormal), +inf */
  uint16_t h[6] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0200, 0x7C00};
  int32_t ints[2] = {-7, 123456};
  float scalar = 42.0f;
  lh_st_entry e[] = {
      {"model.embed_tokens.weight", LH_DTYPE_F32, 2, {2, 3}, a},
      {"b", LH_DTYPE_BF16, 1, {5}, b},
      {"h", LH_DTYPE_F16, 2, {3, 2}, h},
      {"ints", LH_DTYPE_I32, 1, {2}, ints},
      {"empty", LH_DTYPE_U8, 2, {0, 4}, NULL},
      {"scalar", LH_DTYPE_F32, 0, {0}, &scalar},
  };
  const char *p = path_in("rt.safetensors");
  assert_int_equal(lh_safetensors_write(p, e, 6), LH_ERR_OK);

  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_open(p, &st), LH_ERR_OK);
  assert_int_equal(st->n, 6);
  for (int i = 0; i < 6; i++) {
    /* file order is kept */
    assert_string_equal(st->tensors[i].name, e[i].name);
    const lh_st_tensor *t = lh_safetensors_find(st, e[i].name);
    assert_ptr_equal(t, &st->tensors[i]);
    assert_int_equal(t->dtype, e[i].dtype);
    assert_int_equal(t->ndim, e[i].ndim);
    for (int d = 0; d < t->ndim; d++)
      assert_int_equal(t->shape[d], e[i].shape[d]);
    if (t->nbytes) assert_memory_equal(t->data, e[i].data, t->nbytes);
  }
  assert_int_equal(lh_safetensors_find(st, "b")->nbytes, 10);
  assert_null(lh_safetensors_find(st, "missing"));
  assert_null(lh_safetensors_find(st, ""));
  assert_non_null(st->metadata_json);
  assert_string_equal(st->metadata_json, "{\"format\":\"pt\"}");

  float out[6];
  assert_int_equal(lh_safetensors_read_f32(st, &st->tensors[0], out, 6), LH_ERR_OK);
  assert_memory_equal(out, a, sizeof a);
  assert_int_equal(lh_safetensors_read_f32(st, &st->tensors[1], out, 5), LH_ERR_OK);
  for (int i = 0; i < 5; i++)
    assert_true(out[i] == lh_f32_from_bf16(b[i]));
  assert_true(out[0] == 1.0f && out[1] == -2.5f);
  assert_int_equal(lh_safetensors_read_f32(st, &st->tensors[2], out, 6), LH_ERR_OK);
  assert_true(out[0] == 1.0f);
  assert_true(out[1] == -2.0f);
  assert_true(out[2] == 65504.0f);
  assert_true(out[3] == 0x1p-24f);
  assert_true(out[4] == 0x1p-15f);
  assert_true(out[5] > 3e38f && out[5] == out[5] + 1.0f); /* inf */
  assert_int_equal(lh_safetensors_read_f32(st, &st->tensors[5], out, 1), LH_ERR_OK);
  assert_true(out[0] == 42.0f);

  /* wrong count and non-float dtype */
  assert_int_equal(lh_safetensors_read_f32(st, &st->tensors[0], out, 5), LH_ERR_MISMATCH);
  assert_non_null(strstr(lh_last_error(), "model.embed_tokens.weight"));
  assert_int_equal(lh_safetensors_read_f32(st, &st->tensors[3], out, 2), LH_ERR_UNSUPPORTED);
  assert_non_null(strstr(lh_last_error(), "ints"));
  assert_non_null(strstr(lh_last_error(), "I32"));

  /* the header is padded to 8 bytes, so the data section is aligned */
  char *raw = NULL;
  size_t len = 0;
  assert_int_equal(lh_file_read(p, 1 << 20, &raw, &len), LH_ERR_OK);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--)
    hlen = (hlen << 8) | (uint8_t)raw[i];
  assert_int_equal(hlen % 8, 0);
  assert_int_equal(len, 8 + hlen + 24 + 10 + 12 + 8 + 0 + 4);
  assert_int_equal(raw[8], '{');

  /* the in-memory parser agrees with open(), and rewriting gives the same bytes */
  lh_safetensors *st2 = NULL;
  assert_int_equal(lh_safetensors_parse((const uint8_t *)raw, len, "mem", &st2), LH_ERR_OK);
  assert_int_equal(st2->n, 6);
  lh_st_entry e2[6];
  for (int i = 0; i < 6; i++) {
    const lh_st_tensor *t = &st2->tensors[i];
    e2[i] = (lh_st_entry){t->name, t->dtype, t->ndim, {0}, t->data};
    memcpy(e2[i].shape, t->shape, sizeof t->shape);
  }
  const char *p2 = path_in("rt2.safetensors");
  assert_int_equal(lh_safetensors_write(p2, e2, 6), LH_ERR_OK);
  char *raw2 = NULL;
  size_t len2 = 0;
  assert_int_equal(lh_file_read(p2, 1 << 20, &raw2, &len2), LH_ERR_OK);
  assert_int_equal(len2, len);
  assert_memory_equal(raw2, raw, len);
  DIR *d = opendir(tmpdir); /* no temporary file left behind, whatever its name */
  assert_non_null(d);
  for (struct dirent *ent; (ent = readdir(d));)
    if (strstr(ent->d_name, ".tmp")) fail_msg("left behind: %s", ent->d_name);
  closedir(d);

  free(raw);
  free(raw2);
  lh_safetensors_close(st2);
  lh_safetensors_close(st);
  lh_safetensors_close(NULL);
}

static void test_round_trip_bf16_weights(void **state) {
  /* A model-sized matrix through BF16: what is read back is exactly the rounded bits. */
  enum { R = 64, C = 96 };
  float *w = malloc(R * C * sizeof *w), *back = malloc(R * C * sizeof *back);
  uint16_t *bf = malloc(R * C * sizeof *bf);
  for (int i = 0; i < R * C; i++)
    w[i] = (float)(i % 97) * 0.013f - 0.6f;
  lh_bf16_from_f32_n(bf, w, R * C);
  lh_st_entry e = {"model.layers.0.mlp.up_proj.weight", LH_DTYPE_BF16, 2, {R, C}, bf};
  const char *p = path_in("bf16.safetensors");
  assert_int_equal(lh_safetensors_write(p, &e, 1), LH_ERR_OK);
  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_open(p, &st), LH_ERR_OK);
  const lh_st_tensor *t = lh_safetensors_find(st, e.name);
  assert_non_null(t);
  assert_int_equal(t->nbytes, R * C * 2);
  assert_int_equal(lh_safetensors_read_f32(st, t, back, R * C), LH_ERR_OK);
  for (int i = 0; i < R * C; i++) {
    assert_true(back[i] == lh_f32_from_bf16(bf[i]));
    assert_true(back[i] - w[i] < 0.005f && w[i] - back[i] < 0.005f);
  }
  lh_safetensors_close(st);
  free(w);
  free(back);
  free(bf);
}

static void test_unaligned_bf16(void **state) {
  /* A 9-byte header puts the data at an odd address: conversion must not assume alignment. */
  const char *hdr = "{\"x\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}}";
  uint16_t v[3] = {0x3F80, 0xC020, 0x4040}; /* 1, -2.5, 3 */
  size_t len;
  uint8_t *b = image(hdr, v, sizeof v, &len);
  uint8_t *buf = malloc(len + 1);
  size_t shift = (8 + strlen(hdr)) % 2 == 0 ? 1 : 0; /* malloc'd memory is even */
  memcpy(buf + shift, b, len);
  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_parse(buf + shift, len, "odd", &st), LH_ERR_OK);
  assert_int_equal((uintptr_t)st->tensors[0].data & 1u, 1);
  float out[3];
  assert_int_equal(lh_safetensors_read_f32(st, &st->tensors[0], out, 3), LH_ERR_OK);
  assert_true(out[0] == 1.0f && out[1] == -2.5f && out[2] == 3.0f);
  assert_null(st->metadata_json);
  lh_safetensors_close(st);
  free(buf);
  free(b);
}

static void test_zero_length_and_metadata(void **state) {
  /* Empty tensors may share an offset; metadata is kept; holes between tensors are allowed. */
  const char *hdr = "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                    "\"b\":{\"dtype\":\"I64\",\"shape\":[0,3],\"data_offsets\":[0,0]},"
                    "\"c\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]}}";
  uint8_t data[16] = {0};
  data[8] = 5;
  size_t len;
  uint8_t *b = image(hdr, data, sizeof data, &len);
  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_parse(b, len, "meta", &st), LH_ERR_OK);
  assert_int_equal(st->n, 3);
  assert_non_null(strstr(st->metadata_json, "\"note\":\"x\""));
  const lh_st_tensor *c = lh_safetensors_find(st, "c");
  assert_non_null(c);
  int64_t v;
  memcpy(&v, c->data, 8);
  assert_int_equal(v, 5);
  assert_int_equal(lh_safetensors_find(st, "b")->nbytes, 0);
  lh_safetensors_close(st);
  free(b);
}

/* ---------------------------------------------------------------- malformed input */

static void test_truncated(void **state) {
  uint8_t five[5] = {1, 0, 0, 0, 0};
  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_parse(five, 5, "short.safetensors", &st), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "short.safetensors"));
  assert_non_null(strstr(lh_last_error(), "too short"));
  assert_int_equal(lh_safetensors_parse(five, 0, "short.safetensors", &st), LH_ERR_FORMAT);

  /* header cut off in the middle: the length says more than the file holds */
  const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  size_t len;
  uint8_t *b = image(hdr, "abcd", 4, &len);
  for (size_t cut = 8; cut < 8 + strlen(hdr); cut += 7) {
    assert_int_equal(lh_safetensors_parse(b, cut, "cut.safetensors", &st), LH_ERR_FORMAT);
    assert_non_null(strstr(lh_last_error(), "header length"));
    assert_null(st);
  }
  /* data cut off: the tensor's offsets leave the data section */
  assert_int_equal(lh_safetensors_parse(b, len - 1, "cut.safetensors", &st), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "tensor w"));
  assert_int_equal(lh_safetensors_parse(b, len, "ok", &st), LH_ERR_OK);
  lh_safetensors_close(st);
  free(b);
}

static void test_header_length_limits(void **state) {
  uint8_t b[16] = {0};
  /* larger than the file */
  b[0] = 0xe8, b[1] = 0x03; /* 1000 */
  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_parse(b, sizeof b, "big.safetensors", &st), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "header length 1000"));
  /* larger than the configured maximum: refused before anything else */
  memset(b, 0xff, 8);
  assert_int_equal(lh_safetensors_parse(b, sizeof b, "huge.safetensors", &st), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "huge.safetensors"));
  uint64_t h = (uint64_t)LH_ST_MAX_HEADER + 1;
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)(h >> (8 * i));
  assert_int_equal(lh_safetensors_parse(b, sizeof b, "huge.safetensors", &st), LH_ERR_LIMIT);
}

/* A header of many small values is refused before it is parsed (its JSON tree took ~80 bytes of
 * memory per byte of text: 8 GiB for 100 MiB); brackets inside strings do not count. */
static void test_header_values(void **state) {
  const char *head = "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1],\"shape\":[";
  size_t n_objs = 3 * (size_t)LH_ST_MAX_TENSORS + 3, cap = strlen(head) + 3 * n_objs + 8;
  char *h = malloc(cap), *p = h;
  p += sprintf(p, "%s", head);
  for (size_t i = 0; i < n_objs; i++)
    p += sprintf(p, i ? ",{}" : "{}");
  sprintf(p, "]}}");
  size_t len;
  uint8_t *b = image(h, "x", 1, &len);
  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_parse(b, len, "objs.safetensors", &st), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "objs.safetensors: "));
  assert_non_null(strstr(lh_last_error(), "opening an object or array"));
  free(b);
  /* the same count of brackets in a tensor's name is text, not values */
  p = h + sprintf(h, "{\"");
  for (size_t i = 0; i < n_objs; i++)
    p += sprintf(p, "{},");
  sprintf(p, "\\\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
  b = image(h, "x", 1, &len);
  assert_int_equal(lh_safetensors_parse(b, len, "name.safetensors", &st), LH_ERR_OK);
  assert_int_equal(st->n, 1);
  assert_int_equal(strlen(st->tensors[0].name), 3 * n_objs + 1); /* ends with the escaped " */
  lh_safetensors_close(st);
  free(b);
  free(h);
  /* nor does the writer make a file whose header the reader refuses: two names of 60 MB */
  size_t name_len = 60u << 20;
  char *names[2] = {malloc(name_len + 1), malloc(name_len + 1)};
  lh_st_entry e[2];
  for (int i = 0; i < 2; i++) {
    memset(names[i], 'a' + i, name_len);
    names[i][name_len] = '\0';
    e[i] = (lh_st_entry){names[i], LH_DTYPE_U8, 1, {0}, ""};
  }
  assert_int_equal(lh_safetensors_write(path_in("long.safetensors"), e, 2), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "more than the limit of"));
  assert_int_equal(access(path_in("long.safetensors"), F_OK), -1);
  free(names[0]);
  free(names[1]);
}

static void test_bad_json(void **state) {
  expect_parse_error("{\"w\": {\"dtype\": \"F32\",", 0, LH_ERR_FORMAT, "not valid JSON", NULL);
  expect_parse_error("[1, 2, 3]", 0, LH_ERR_FORMAT, "expected a JSON object", "array");
  expect_parse_error("{\"w\": [1]}", 0, LH_ERR_FORMAT, "tensor w:", "expected an object");
  expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                     8, LH_ERR_FORMAT, "duplicate", NULL);
  expect_parse_error("{\"__metadata__\": {\"format\": 1}}", 0, LH_ERR_FORMAT, "__metadata__",
                     "format");
  expect_parse_error("{\"__metadata__\": [], \"w\": 1}", 0, LH_ERR_FORMAT, "__metadata__", NULL);
  expect_parse_error("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                     LH_ERR_FORMAT, "empty name", NULL);
  expect_parse_error("{\"w.nodtype\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, LH_ERR_FORMAT,
                     "tensor w.nodtype", "missing field dtype");
  expect_parse_error("{\"w.nooff\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, LH_ERR_FORMAT,
                     "tensor w.nooff", "data_offsets");
  expect_parse_error("{\"w.off\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
                     LH_ERR_FORMAT, "tensor w.off", "data_offsets");
  expect_parse_error("{\"w.off\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4,
                     LH_ERR_FORMAT, "tensor w.off", "data_offsets");
}

static void test_unknown_dtype(void **state) {
  expect_parse_error("{\"w.bad\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                     LH_ERR_FORMAT, "tensor w.bad", "unknown dtype \"Q7\"");
  expect_parse_error("{\"w.f64\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                     LH_ERR_UNSUPPORTED, "tensor w.f64", "F64");
  expect_parse_error("{\"w.num\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                     LH_ERR_FORMAT, "tensor w.num", "dtype");
}

static void test_shape_offset_mismatch(void **state) {
  uint8_t zeros[16] = {0};
  size_t len;
  uint8_t *b = image("{\"model.layers.3.mlp.up_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
                     "\"data_offsets\":[0,12]}}",
                     zeros, 16, &len);
  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_parse(b, len, "model.safetensors", &st), LH_ERR_FORMAT);
  assert_string_equal(lh_last_error(),
                      "model.safetensors: tensor model.layers.3.mlp.up_proj.weight: data_offsets "
                      "[0, 12] but dtype F32 shape [2, 2] needs 16 bytes");
  free(b);
  expect_parse_error("{\"w.bf\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                     LH_ERR_FORMAT, "tensor w.bf", "needs 6 bytes");
  /* element count overflowing size_t */
  expect_parse_error("{\"w.ovf\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                     "\"data_offsets\":[0,0]}}",
                     0, LH_ERR_FORMAT, "tensor w.ovf", "overflows");
  /* 2^32 * 2^32 wraps to 0 modulo 2^64, which the offsets [0, 0] would match: still refused */
  expect_parse_error("{\"w.wrap\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
                     "\"data_offsets\":[0,0]}}",
                     0, LH_ERR_FORMAT, "tensor w.wrap", "overflows");
}

static void test_overlap(void **state) {
  expect_parse_error("{\"first\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"second\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                     12, LH_ERR_FORMAT, "overlap", "first");
  expect_parse_error("{\"first\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"second\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                     8, LH_ERR_FORMAT, "overlap", "second");
  /* declared in reverse file order */
  expect_parse_error("{\"late\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]},"
                     "\"early\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}",
                     10, LH_ERR_FORMAT, "tensor late", "overlap tensor early");
}

static void test_offsets_outside_data(void **state) {
  expect_parse_error("{\"w.out\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
                     LH_ERR_FORMAT, "tensor w.out", "outside the data section of 8 bytes");
  expect_parse_error("{\"w.rev\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8,
                     LH_ERR_FORMAT, "tensor w.rev", "begin > end");
  expect_parse_error("{\"w.neg\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[-4,0]}}", 8,
                     LH_ERR_FORMAT, "tensor w.neg", "data_offsets");
  expect_parse_error("{\"w.far\":{\"dtype\":\"U8\",\"shape\":[1],"
                     "\"data_offsets\":[9223372036854775806,9223372036854775807]}}",
                     8, LH_ERR_FORMAT, "tensor w.far", "outside");
}

static void test_negative_shape(void **state) {
  expect_parse_error("{\"w.negshape\":{\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,8]}}",
                     8, LH_ERR_FORMAT, "tensor w.negshape", "negative");
  expect_parse_error(
      "{\"w.strshape\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
      LH_ERR_FORMAT, "tensor w.strshape", "expected an integer, found string");
  expect_parse_error("{\"w.realshape\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}",
                     8, LH_ERR_FORMAT, "tensor w.realshape", "found real");
  expect_parse_error("{\"w.objshape\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,8]}}", 8,
                     LH_ERR_FORMAT, "tensor w.objshape", "shape");
}

static void test_too_many_dims(void **state) {
  expect_parse_error("{\"w.dims\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                     "\"data_offsets\":[0,1]}}",
                     1, LH_ERR_LIMIT, "tensor w.dims", "9 dimensions");
  /* exactly the limit is fine */
  size_t len;
  uint8_t one = 7;
  uint8_t *b =
      image("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", &one,
            1, &len);
  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_parse(b, len, "ok", &st), LH_ERR_OK);
  assert_int_equal(st->tensors[0].ndim, LH_ST_MAX_DIMS);
  assert_int_equal(st->tensors[0].data[0], 7);
  lh_safetensors_close(st);
  free(b);
}

static void test_open_errors(void **state) {
  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_open(path_in("does-not-exist"), &st), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "does-not-exist"));
  assert_int_equal(lh_file_write_atomic(path_in("empty.safetensors"), "", 0), LH_ERR_OK);
  assert_int_equal(lh_safetensors_open(path_in("empty.safetensors"), &st), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "empty"));
  assert_int_equal(lh_file_write_atomic(path_in("short.safetensors"), "\x10\0\0", 3), LH_ERR_OK);
  assert_int_equal(lh_safetensors_open(path_in("short.safetensors"), &st), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "short.safetensors"));
  assert_int_equal(lh_safetensors_open(tmpdir, &st), LH_ERR_IO); /* a directory */
  assert_null(st);
}

static void test_write_rejects_bad_entries(void **state) {
  float x[2] = {1, 2};
  lh_st_entry dup[2] = {{"a", LH_DTYPE_F32, 1, {1}, x}, {"a", LH_DTYPE_F32, 1, {1}, x + 1}};
  assert_int_equal(lh_safetensors_write(path_in("bad.safetensors"), dup, 2), LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "a"));
  lh_st_entry neg = {"neg", LH_DTYPE_F32, 1, {-1}, x};
  assert_int_equal(lh_safetensors_write(path_in("bad.safetensors"), &neg, 1), LH_ERR_INVAL);
  lh_st_entry meta = {"__metadata__", LH_DTYPE_F32, 1, {1}, x};
  assert_int_equal(lh_safetensors_write(path_in("bad.safetensors"), &meta, 1), LH_ERR_INVAL);
  assert_int_equal(access(path_in("bad.safetensors"), F_OK), -1);
  /* a directory that does not exist: IO error, nothing written */
  lh_st_entry ok = {"ok", LH_DTYPE_F32, 1, {2}, x};
  assert_int_equal(lh_safetensors_write("/nonexistent-dir-lh/x.safetensors", &ok, 1), LH_ERR_IO);
  /* zero tensors is a valid file */
  assert_int_equal(lh_safetensors_write(path_in("none.safetensors"), NULL, 0), LH_ERR_OK);
  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_open(path_in("none.safetensors"), &st), LH_ERR_OK);
  assert_int_equal(st->n, 0);
  assert_null(lh_safetensors_find(st, "ok"));
  lh_safetensors_close(st);
}

/* ---------------------------------------------------------------- reading files: truncation */

/* Three tensors (F32, BF16, F16) of 1000 elements each, in that order, written to path. */
static void write_three(const char *path, float *f, uint16_t *b, uint16_t *h) {
  for (int i = 0; i < 1000; i++) {
    f[i] = (float)i * 0.5f - 100.0f;
    b[i] = lh_bf16_from_f32((float)i * -0.25f);
    h[i] = (uint16_t)(0x3C00 + (i % 512)); /* 1.0 and up */
  }
  lh_st_entry e[] = {{"f", LH_DTYPE_F32, 2, {10, 100}, f},
                     {"b", LH_DTYPE_BF16, 1, {1000}, b},
                     {"h", LH_DTYPE_F16, 1, {1000}, h}};
  assert_int_equal(lh_safetensors_write(path, e, 3), LH_ERR_OK);
}

static off_t file_size(const char *path) {
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  return sb.st_size;
}

/* A file whose header promises more bytes than it holds (cut after the header was written) is
 * "truncated: expected N bytes of tensor data, found M" from every reader. */
static void test_truncated_file(void **state) {
  static float f[1000];
  static uint16_t b[1000], h[1000];
  const char *p = path_in("cut.safetensors");
  write_three(p, f, b, h);
  off_t full = file_size(p), data_start = full - 8000;
  char want[160];
  lh_safetensors *st = NULL;
  for (int cut = 1; cut <= 8000; cut += 2999) {
    assert_int_equal(truncate(p, full - cut), 0);
    snprintf(want, sizeof want,
             "cut.safetensors: truncated: expected 8000 bytes of tensor data, "
             "found %d",
             8000 - cut);
    assert_int_equal(lh_safetensors_open(p, &st), LH_ERR_FORMAT);
    assert_non_null(strstr(lh_last_error(), want));
    assert_null(st);
    assert_int_equal(lh_safetensors_open_lazy(p, &st), LH_ERR_FORMAT);
    assert_non_null(strstr(lh_last_error(), want));
    assert_null(st);
    /* the same bytes from memory */
    char *img = NULL;
    size_t len = 0;
    assert_int_equal(lh_file_read(p, 1 << 20, &img, &len), LH_ERR_OK);
    assert_int_equal(lh_safetensors_open_buffer(img, len, "mem", &st), LH_ERR_FORMAT);
    snprintf(want, sizeof want, "mem: truncated: expected 8000 bytes of tensor data, found %d",
             8000 - cut);
    assert_non_null(strstr(lh_last_error(), want));
    free(img);
    write_three(p, f, b, h);
  }
  /* cut inside the header */
  assert_int_equal(truncate(p, data_start - 5), 0);
  assert_int_equal(lh_safetensors_open(p, &st), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "header length"));
  unlink(p);
}

/* A file cut short while it is open cannot kill the process (it was mapped: reading the lost
 * pages raised SIGBUS). lh_safetensors_open holds its data in memory, so the values stay;
 * lh_safetensors_open_lazy reads from the file, so its reads report the truncation. */
static void test_truncated_while_open(void **state) {
  static float f[1000], out[1000];
  static uint16_t b[1000], h[1000];
  const char *p = path_in("shrink.safetensors");
  write_three(p, f, b, h);
  off_t full = file_size(p);
  lh_safetensors *st = NULL, *lazy = NULL;
  assert_int_equal(lh_safetensors_open(p, &st), LH_ERR_OK);
  assert_int_equal(lh_safetensors_open_lazy(p, &lazy), LH_ERR_OK);
  const lh_st_tensor *t = lh_safetensors_find(lazy, "h");
  assert_null(t->data);
  assert_int_equal(t->offset, 6000);
  /* before: every reader gives the written values, whole or in ranges */
  assert_int_equal(lh_safetensors_read_f32(lazy, lh_safetensors_find(lazy, "f"), out, 1000), 0);
  assert_memory_equal(out, f, sizeof f);
  for (int k = 0; k < 2; k++) {
    const lh_safetensors *s = k ? lazy : st;
    float ref[1000];
    assert_int_equal(lh_safetensors_read_f32(st, lh_safetensors_find(st, "b"), ref, 1000), 0);
    for (int i = 0; i < 1000; i++)
      assert_true(ref[i] == lh_f32_from_bf16(b[i]));
    assert_int_equal(lh_safetensors_read_f32_range(s, lh_safetensors_find(s, "b"), 7, out, 993),
                     LH_ERR_OK);
    assert_memory_equal(out, ref + 7, 993 * sizeof(float));
    assert_int_equal(lh_safetensors_read_f32_range(s, lh_safetensors_find(s, "h"), 0, out, 3), 0);
    assert_true(out[0] == 1.0f && out[2] == 1.0f + 2.0f / 1024);
    assert_int_equal(lh_safetensors_read_f32_range(s, lh_safetensors_find(s, "h"), 999, out, 2),
                     LH_ERR_MISMATCH);
    uint16_t raw[4];
    assert_int_equal(lh_safetensors_read(s, lh_safetensors_find(s, "b"), 2 * 996, raw, 8), 0);
    assert_memory_equal(raw, b + 996, 8);
    assert_int_equal(lh_safetensors_read(s, lh_safetensors_find(s, "b"), 2 * 997, raw, 8),
                     LH_ERR_INVAL);
  }
  assert_int_equal(truncate(p, full - 7000), 0); /* keeps 1000 bytes of data: f's first 250 */
  /* the data read at open is still there */
  assert_memory_equal(lh_safetensors_find(st, "f")->data, f, sizeof f);
  assert_memory_equal(lh_safetensors_find(st, "h")->data, h, sizeof h);
  assert_int_equal(lh_safetensors_read_f32(st, lh_safetensors_find(st, "h"), out, 1000), 0);
  /* from the file: the bytes still there read, the rest is an error, never a signal */
  assert_int_equal(lh_safetensors_read_f32_range(lazy, lh_safetensors_find(lazy, "f"), 0, out, 250),
                   LH_ERR_OK);
  assert_memory_equal(out, f, 250 * sizeof(float));
  assert_int_equal(lh_safetensors_read_f32(lazy, lh_safetensors_find(lazy, "f"), out, 1000),
                   LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "shrink.safetensors: truncated: expected 8000 bytes of "
                                          "tensor data, found 1000 (while reading tensor f)"));
  assert_int_equal(lh_safetensors_read_f32(lazy, t, out, 1000), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "found 6000 (while reading tensor h)"));
  assert_int_equal(lh_safetensors_read(lazy, t, 0, out, 2), LH_ERR_FORMAT);
  lh_safetensors_close(lazy);
  lh_safetensors_close(st);
  unlink(p);
}

/* Opening a FIFO as a safetensors file is refused at once (open waited for a writer). */
static void test_open_fifo(void **state) {
  const char *p = path_in("fifo.safetensors");
  assert_int_equal(mkfifo(p, 0644), 0);
  lh_safetensors *st = NULL;
  alarm(20); /* a hang fails the test instead of stalling the suite */
  assert_int_equal(lh_safetensors_open(p, &st), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "fifo.safetensors: not a regular file (a FIFO)"));
  assert_int_equal(lh_safetensors_open_lazy(p, &st), LH_ERR_IO);
  alarm(0);
  assert_null(st);
  /* and a model directory whose weights are a FIFO */
  char dir[256];
  snprintf(dir, sizeof dir, "%s/fifomodel", tmpdir);
  lh_config c;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_QWEN2, &c), LH_ERR_OK);
  assert_int_equal(mkdir(dir, 0755), 0);
  char q[300];
  snprintf(q, sizeof q, "%s/config.json", dir);
  assert_int_equal(lh_config_save(q, &c), LH_ERR_OK);
  snprintf(q, sizeof q, "%s/model.safetensors", dir);
  assert_int_equal(mkfifo(q, 0644), 0);
  lh_model *m = NULL;
  alarm(20);
  assert_int_equal(lh_model_load(dir, &m), LH_ERR_IO);
  alarm(0);
  assert_non_null(strstr(lh_last_error(), "not a regular file (a FIFO)"));
  unlink(q);
  unlink(p);
}

/* ---------------------------------------------------------------- metadata and buffers */

/* Metadata pairs go into __metadata__ in order, "format":"pt" first unless a pair sets format;
 * lh_safetensors_meta reads them back; the buffer writer makes the same bytes as the file
 * writer, and lh_safetensors_open_buffer reads them (from its own copy). */
static void test_metadata_and_buffers(void **state) {
  float a[3] = {1, 2, 3};
  int64_t step = 42;
  lh_st_entry e[] = {{"adam.m", LH_DTYPE_F32, 1, {3}, a}, {"step", LH_DTYPE_I64, 1, {1}, &step}};
  const char *kv[] = {"format", "longhaul.trainer_state", "version", "2"};
  const char *p = path_in("meta.safetensors");
  assert_int_equal(lh_safetensors_write_meta(p, e, 2, kv, 2), LH_ERR_OK);
  lh_safetensors *st = NULL;
  assert_int_equal(lh_safetensors_open(p, &st), LH_ERR_OK);
  assert_string_equal(st->metadata_json,
                      "{\"format\":\"longhaul.trainer_state\",\"version\":\"2\"}");
  assert_int_equal(st->n_meta, 2);
  assert_string_equal(st->meta_kv[2], "version");
  assert_string_equal(lh_safetensors_meta(st, "format"), "longhaul.trainer_state");
  assert_string_equal(lh_safetensors_meta(st, "version"), "2");
  assert_null(lh_safetensors_meta(st, "missing"));
  assert_null(lh_safetensors_meta(NULL, "format"));
  lh_safetensors_close(st);

  /* the buffer: byte for byte the file */
  char *buf = NULL, *file = NULL;
  size_t len = 0, flen = 0;
  assert_int_equal(lh_safetensors_write_buffer(e, 2, kv, 2, &buf, &len), LH_ERR_OK);
  assert_int_equal(lh_file_read(p, 1 << 20, &file, &flen), LH_ERR_OK);
  assert_int_equal(len, flen);
  assert_memory_equal(buf, file, len);
  free(file);
  assert_int_equal(lh_safetensors_open_buffer(buf, len, "state", &st), LH_ERR_OK);
  memset(buf, 0, len); /* the result holds its own copy */
  free(buf);
  assert_string_equal(lh_safetensors_meta(st, "version"), "2");
  const lh_st_tensor *t = lh_safetensors_find(st, "step");
  assert_non_null(t);
  int64_t back;
  assert_int_equal(lh_safetensors_read(st, t, 0, &back, 8), LH_ERR_OK);
  assert_int_equal(back, 42);
  float fa[3];
  assert_int_equal(lh_safetensors_read_f32(st, lh_safetensors_find(st, "adam.m"), fa, 3), 0);
  assert_memory_equal(fa, a, sizeof a);
  lh_safetensors_close(st);

  /* no metadata: today's {"format":"pt"}; pairs without format keep it first */
  assert_int_equal(lh_safetensors_write_buffer(e, 2, NULL, 0, &buf, &len), LH_ERR_OK);
  assert_int_equal(lh_safetensors_parse((const uint8_t *)buf, len, "b", &st), LH_ERR_OK);
  assert_string_equal(st->metadata_json, "{\"format\":\"pt\"}");
  lh_safetensors_close(st);
  free(buf);
  const char *kv2[] = {"note", "caf\xc3\xa9", "empty", ""};
  assert_int_equal(lh_safetensors_write_buffer(NULL, 0, kv2, 2, &buf, &len), LH_ERR_OK);
  assert_int_equal(lh_safetensors_parse((const uint8_t *)buf, len, "b", &st), LH_ERR_OK);
  assert_string_equal(st->metadata_json,
                      "{\"format\":\"pt\",\"note\":\"caf\xc3\xa9\",\"empty\":\"\"}");
  lh_safetensors_close(st);
  free(buf);

  /* bad pairs: nothing written, *out NULL */
  const char *dup[] = {"a", "1", "a", "2"};
  const char *nul[] = {"a", NULL};
  const char *bad[] = {"a", "\xff"};
  const char *badk[] = {"\xc3", "x"};
  buf = (char *)1;
  assert_int_equal(lh_safetensors_write_buffer(e, 2, dup, 2, &buf, &len), LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "given twice"));
  assert_null(buf);
  assert_int_equal(lh_safetensors_write_buffer(e, 2, nul, 1, &buf, &len), LH_ERR_INVAL);
  assert_int_equal(lh_safetensors_write_buffer(e, 2, bad, 1, &buf, &len), LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "UTF-8"));
  assert_int_equal(lh_safetensors_write_buffer(e, 2, badk, 1, &buf, &len), LH_ERR_INVAL);
  assert_int_equal(lh_safetensors_write_buffer(e, 2, NULL, 1, &buf, &len), LH_ERR_INVAL);
  assert_int_equal(lh_safetensors_write_buffer(e, 2, kv, -1, &buf, &len), LH_ERR_INVAL);
  assert_int_equal(lh_safetensors_write_meta(path_in("bad-meta.safetensors"), e, 2, dup, 2),
                   LH_ERR_INVAL);
  assert_int_equal(access(path_in("bad-meta.safetensors"), F_OK), -1);
  /* a buffer with a non-string metadata value is refused as a file is */
  const char *hdr = "{\"__metadata__\":{\"v\":2}}";
  size_t ilen;
  uint8_t *img = image(hdr, NULL, 0, &ilen);
  assert_int_equal(lh_safetensors_open_buffer(img, ilen, "img", &st), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "img: __metadata__: key v: expected a string"));
  free(img);
  unlink(p);
}

/* ---------------------------------------------------------------- model directories */

static lh_model *tiny_model(lh_arch arch, bool tied, uint64_t seed) {
  lh_config c;
  assert_int_equal(lh_config_preset("tiny", arch, &c), LH_ERR_OK);
  c.tie_embeddings = tied;
  c.n_layers = 2;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  lh_model *m = NULL;
  assert_int_equal(lh_model_create(&c, &m), LH_ERR_OK);
  lh_model_init_random(m, seed);
  /* make norms and biases non-trivial so that a swapped tensor would show */
  for (size_t i = 0; i < m->n_params; i++)
    if (m->params[i] == 0.0f || m->params[i] == 1.0f) m->params[i] += (float)(i % 13) * 0.01f;
  return m;
}

static void test_model_save_load_f32(void **state) {
  for (int arch = 0; arch < 3; arch++)
    for (int tied = 0; tied < 2; tied++) {
      lh_model *m = tiny_model((lh_arch)arch, tied, 7 + (uint64_t)arch);
      char dir[256];
      snprintf(dir, sizeof dir, "%s/model/nested/f32", tmpdir);
      assert_int_equal(lh_model_save(m, dir, LH_SAVE_F32), LH_ERR_OK);
      lh_model *back = NULL;
      assert_int_equal(lh_model_load(dir, &back), LH_ERR_OK);
      assert_int_equal(back->cfg.arch, arch);
      assert_int_equal(back->cfg.tie_embeddings, tied);
      assert_int_equal(back->cfg.qkv_bias, arch == LH_ARCH_QWEN2);
      assert_int_equal(back->cfg.n_layers, 2);
      assert_int_equal(back->cfg.eos_token_id, 2);
      assert_int_equal(back->n_params, m->n_params);
      assert_memory_equal(back->params, m->params, m->n_params * sizeof(float));
      /* the file holds exactly the model's tensors, with HF names */
      lh_safetensors *st = NULL;
      assert_int_equal(lh_safetensors_open(path_in("model/nested/f32/model.safetensors"), &st),
                       LH_ERR_OK);
      assert_int_equal(st->n, lh_model_tensors(&m->cfg, NULL, 0));
      assert_int_equal(lh_safetensors_find(st, "lm_head.weight") != NULL, !tied);
      const lh_st_tensor *q = lh_safetensors_find(st, "model.layers.1.self_attn.q_proj.weight");
      assert_non_null(q);
      assert_int_equal(q->shape[0], 128);
      assert_int_equal(q->shape[1], 128);
      assert_memory_equal(q->data, m->w.wq + m->w.layer_stride, 128 * 128 * sizeof(float));
      assert_int_equal(lh_safetensors_find(st, "model.layers.0.self_attn.k_proj.bias") != NULL,
                       arch == LH_ARCH_QWEN2);
      /* Qwen3's per-head norms: (head_dim), in the slab where the views say */
      const lh_st_tensor *kn = lh_safetensors_find(st, "model.layers.1.self_attn.k_norm.weight");
      assert_int_equal(kn != NULL, arch == LH_ARCH_QWEN3);
      assert_int_equal(back->cfg.qk_norm, arch == LH_ARCH_QWEN3);
      if (kn) {
        assert_int_equal(kn->ndim, 1);
        assert_int_equal(kn->shape[0], 32);
        assert_memory_equal(kn->data, m->w.k_norm + m->w.layer_stride, 32 * sizeof(float));
        assert_true(m->w.q_norm + 32 == m->w.k_norm);
      } else {
        assert_null(m->w.q_norm);
        assert_null(m->w.k_norm);
      }
      lh_safetensors_close(st);
      lh_model_free(back);
      lh_model_free(m);
    }
}

static void test_model_save_load_bf16(void **state) {
  lh_model *m = tiny_model(LH_ARCH_QWEN2, true, 11);
  char *dir = strdup(path_in("bf16model"));
  assert_int_equal(lh_model_save(m, dir, LH_SAVE_BF16), LH_ERR_OK);
  char *cfg = NULL;
  size_t len;
  assert_int_equal(lh_file_read(path_in("bf16model/config.json"), 1 << 20, &cfg, &len), LH_ERR_OK);
  assert_non_null(strstr(cfg, "\"torch_dtype\": \"bfloat16\""));
  free(cfg);
  lh_model *back = NULL;
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_OK);
  for (size_t i = 0; i < m->n_params; i++)
    assert_true(back->params[i] == lh_f32_from_bf16(lh_bf16_from_f32(m->params[i])));
  /* saving the loaded bf16 model again is lossless */
  assert_int_equal(lh_model_save(back, path_in("bf16model2"), LH_SAVE_BF16), LH_ERR_OK);
  char *a = NULL, *b = NULL;
  size_t la, lb;
  assert_int_equal(lh_file_read(path_in("bf16model/model.safetensors"), 64 << 20, &a, &la), 0);
  assert_int_equal(lh_file_read(path_in("bf16model2/model.safetensors"), 64 << 20, &b, &lb), 0);
  assert_int_equal(la, lb);
  assert_memory_equal(a, b, la);
  free(a);
  free(b);
  free(dir);
  lh_model_free(back);
  lh_model_free(m);
}

/* A NaN or infinite weight is refused by both loaders (fp32 for training, bf16 for inference),
 * saved as F32 or BF16, with the file, the tensor and the element in the message (it loaded
 * silently: generate sampled uniformly, sft trained on "loss nan" and wrote the model). A finite
 * F32 weight too large for bf16 loads as fp32 but not as bf16. */
static void test_model_load_nonfinite(void **state) {
  lh_model *m = tiny_model(LH_ARCH_QWEN2, false, 5);
  char dir[256], want[256];
  snprintf(dir, sizeof dir, "%s/nanmodel", tmpdir);
  lh_tensor_info info[64];
  int n = lh_model_tensors(&m->cfg, info, 64);
  struct {
    const char *tensor;
    size_t element;
    float value;
    const char *word;
  } cases[] = {
      {"model.layers.1.mlp.up_proj.weight", 17, NAN, "nan"},
      {"model.layers.0.self_attn.q_proj.bias", 0, INFINITY, "inf"},
      {"model.embed_tokens.weight", 20000, -INFINITY, "-inf"},
      {"lm_head.weight", 0, NAN, "nan"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int k = 0;
    while (k < n && strcmp(info[k].name, cases[c].tensor) != 0)
      k++;
    assert_true(k < n && cases[c].element < info[k].numel);
    float *x = m->params + info[k].offset + cases[c].element, keep = *x;
    snprintf(want, sizeof want, "nanmodel/model.safetensors: tensor %s: element %zu is %s",
             cases[c].tensor, cases[c].element, cases[c].word);
    for (int dt = 0; dt < 2; dt++) {
      *x = cases[c].value;
      assert_int_equal(lh_model_save(m, dir, dt ? LH_SAVE_BF16 : LH_SAVE_F32), LH_ERR_OK);
      *x = keep;
      lh_model *back = NULL;
      assert_int_equal(lh_model_load(dir, &back), LH_ERR_FORMAT);
      if (!strstr(lh_last_error(), want))
        fail_msg("got \"%s\", want \"%s\"", lh_last_error(), want);
      assert_null(back);
      lh_config cfg;
      uint16_t *slab = (uint16_t *)1;
      assert_int_equal(lh_model_load_bf16(dir, &cfg, &slab), LH_ERR_FORMAT);
      if (!strstr(lh_last_error(), want))
        fail_msg("got \"%s\", want \"%s\"", lh_last_error(), want);
      assert_null(slab);
    }
  }
  /* finite in fp32, infinite in bf16 */
  m->params[info[1].offset + 3] = 3.4e38f;
  assert_int_equal(lh_model_save(m, dir, LH_SAVE_F32), LH_ERR_OK);
  lh_model *back = NULL;
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_OK);
  lh_model_free(back);
  lh_config cfg;
  uint16_t *slab = NULL;
  assert_int_equal(lh_model_load_bf16(dir, &cfg, &slab), LH_ERR_FORMAT);
  snprintf(want, sizeof want, "tensor %s: element 3 is 3.4e+38, which rounds to inf in bf16",
           info[1].name);
  if (!strstr(lh_last_error(), want)) fail_msg("got \"%s\", want \"%s\"", lh_last_error(), want);
  /* and a clean model loads both ways */
  m->params[info[1].offset + 3] = 0.5f;
  assert_int_equal(lh_model_save(m, dir, LH_SAVE_F32), LH_ERR_OK);
  assert_int_equal(lh_model_load_bf16(dir, &cfg, &slab), LH_ERR_OK);
  free(slab);
  lh_model_free(m);
}

/* Rewrites DIR/model.safetensors from the model's tensors, letting `edit` change entries. */
static void write_weights(const lh_model *m, const char *file, int drop, int transpose,
                          const char *extra) {
  int n = lh_model_tensors(&m->cfg, NULL, 0);
  lh_tensor_info *info = calloc((size_t)n + 1, sizeof *info);
  lh_st_entry *e = calloc((size_t)n + 1, sizeof *e);
  lh_model_tensors(&m->cfg, info, n);
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (i == drop) continue;
    e[k] = (lh_st_entry){info[i].name, LH_DTYPE_F32, info[i].ndim, {0}, m->params + info[i].offset};
    e[k].shape[0] = info[i].shape[0];
    e[k].shape[1] = info[i].shape[1];
    if (i == transpose) {
      e[k].shape[0] = info[i].shape[1];
      e[k].shape[1] = info[i].shape[0];
    }
    k++;
  }
  if (extra) {
    e[k] = (lh_st_entry){extra, LH_DTYPE_F32, 2, {0}, m->params};
    e[k].shape[0] = m->cfg.vocab_size;
    e[k].shape[1] = m->cfg.hidden_size;
    k++;
  }
  assert_int_equal(lh_safetensors_write(file, e, k), LH_ERR_OK);
  free(e);
  free(info);
}

static int tensor_index(const lh_config *c, const char *name) {
  int n = lh_model_tensors(c, NULL, 0);
  lh_tensor_info *info = calloc((size_t)n, sizeof *info);
  lh_model_tensors(c, info, n);
  int found = -1;
  for (int i = 0; i < n; i++)
    if (strcmp(info[i].name, name) == 0) found = i;
  free(info);
  assert_true(found >= 0);
  return found;
}

static void test_model_load_errors(void **state) {
  lh_model *m = tiny_model(LH_ARCH_LLAMA, true, 3);
  char *dir = strdup(path_in("errmodel"));
  char st_path[256];
  snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
  assert_int_equal(lh_model_save(m, dir, LH_SAVE_F32), LH_ERR_OK);
  lh_model *back = (lh_model *)0x1;

  /* tied model with an lm_head present: accepted, lm_head ignored */
  write_weights(m, st_path, -1, -1, "lm_head.weight");
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_OK);
  assert_memory_equal(back->params, m->params, m->n_params * sizeof(float));
  lh_model_free(back);
  /* lh_model_check agrees with lh_model_load on every case below, without loading */
  lh_config checked;
  assert_int_equal(lh_model_check(dir, &checked), LH_ERR_OK);
  assert_int_equal(checked.hidden_size, m->cfg.hidden_size);
  assert_int_equal(checked.max_positions, m->cfg.max_positions);

  /* missing tensor: named */
  int up = tensor_index(&m->cfg, "model.layers.1.mlp.up_proj.weight");
  write_weights(m, st_path, up, -1, NULL);
  back = (lh_model *)0x1;
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_NOTFOUND);
  assert_null(back);
  assert_non_null(strstr(lh_last_error(), "model.layers.1.mlp.up_proj.weight"));
  assert_non_null(strstr(lh_last_error(), "missing"));
  assert_int_equal(lh_model_check(dir, &checked), LH_ERR_NOTFOUND);
  assert_non_null(strstr(lh_last_error(), "model.layers.1.mlp.up_proj.weight"));

  /* transposed tensor: both shapes in the message */
  write_weights(m, st_path, -1, up, NULL);
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_MISMATCH);
  char want[256];
  snprintf(want, sizeof want,
           "model.safetensors: tensor model.layers.1.mlp.up_proj.weight: shape [128, 384], "
           "config.json says [384, 128]");
  assert_non_null(strstr(lh_last_error(), want));
  assert_int_equal(lh_model_check(dir, &checked), LH_ERR_MISMATCH);
  assert_non_null(strstr(lh_last_error(), want));

  /* untied config needs lm_head */
  lh_config untied = m->cfg;
  untied.tie_embeddings = false;
  char cfgp[256];
  snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
  assert_int_equal(lh_config_save(cfgp, &untied), LH_ERR_OK);
  write_weights(m, st_path, -1, -1, NULL);
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_NOTFOUND);
  assert_non_null(strstr(lh_last_error(), "lm_head.weight"));
  write_weights(m, st_path, -1, -1, "lm_head.weight");
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_OK);
  assert_false(back->cfg.tie_embeddings);
  assert_memory_equal(back->w.lm_head, m->params, (size_t)256 * 128 * sizeof(float));
  lh_model_free(back);

  /* no weights at all; no config */
  unlink(st_path);
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "model.safetensors"));
  assert_int_equal(lh_model_check(dir, &checked), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "model.safetensors"));
  unlink(cfgp);
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "config.json"));
  free(dir);
  lh_model_free(m);
}

/* generation_config.json beside config.json: its eos list is what the loaded model stops on. */
static void test_model_load_generation_config(void **state) {
  lh_model *m = tiny_model(LH_ARCH_QWEN3, true, 9);
  char *dir = strdup(path_in("genmodel"));
  assert_int_equal(lh_model_save(m, dir, LH_SAVE_BF16), LH_ERR_OK);
  char gen[256];
  snprintf(gen, sizeof gen, "%s/generation_config.json", dir);
  lh_model *back = NULL;

  /* no generation_config.json: config.json's single eos */
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_OK);
  assert_int_equal(back->cfg.eos_token_id, 2);
  assert_int_equal(back->cfg.n_eos, 1);
  lh_model_free(back);

  /* a list, as Qwen3 ships it: replaces config.json's */
  const char *list = "{\"bos_token_id\": 1, \"do_sample\": true, \"eos_token_id\": [7, 2],\n"
                     " \"pad_token_id\": 1, \"temperature\": 0.6, \"top_k\": 20, "
                     "\"top_p\": 0.95}\n";
  assert_int_equal(lh_file_write_atomic(gen, list, strlen(list)), LH_ERR_OK);
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_OK);
  assert_int_equal(back->cfg.n_eos, 2);
  assert_int_equal(back->cfg.eos_ids[0], 7);
  assert_int_equal(back->cfg.eos_ids[1], 2);
  assert_int_equal(back->cfg.eos_token_id, 7);
  /* saving keeps the list (in config.json) */
  assert_int_equal(lh_model_save(back, path_in("genmodel2"), LH_SAVE_BF16), LH_ERR_OK);
  lh_model_free(back);
  assert_int_equal(lh_model_load(path_in("genmodel2"), &back), LH_ERR_OK);
  assert_int_equal(back->cfg.n_eos, 2);
  assert_int_equal(back->cfg.eos_ids[1], 2);
  lh_model_free(back);

  /* without eos_token_id it changes nothing */
  const char *none = "{\"temperature\": 0.7}";
  assert_int_equal(lh_file_write_atomic(gen, none, strlen(none)), LH_ERR_OK);
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_OK);
  assert_int_equal(back->cfg.n_eos, 1);
  assert_int_equal(back->cfg.eos_token_id, 2);
  lh_model_free(back);

  /* malformed: the load fails, naming the file and the field */
  const char *bad[] = {"{\"eos_token_id\": [7, \"</s>\"]}", "{\"eos_token_id\": 256}",
                       "{\"eos_token_id\": 7,", "{\"eos_token_id\": {\"id\": 7}}"};
  const char *needle[] = {"field eos_token_id[1]", "field eos_token_id", "not valid JSON",
                          "field eos_token_id"};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(lh_file_write_atomic(gen, bad[i], strlen(bad[i])), LH_ERR_OK);
    back = (lh_model *)0x1;
    assert_int_equal(lh_model_load(dir, &back), LH_ERR_FORMAT);
    assert_null(back);
    if (!strstr(lh_last_error(), "generation_config.json") || !strstr(lh_last_error(), needle[i]))
      fail_msg("%s: error \"%s\" should name generation_config.json and %s", bad[i],
               lh_last_error(), needle[i]);
  }
  free(dir);
  lh_model_free(m);
}

/* An index of n tensors "t<i>" spread round-robin over nf shards whose names share a prefix of
 * plen bytes. */
static char *index_text(int n, int nf, int plen, size_t *len) {
  size_t cap = (size_t)n * ((size_t)plen + 48) + 32, used = 0;
  char *b = malloc(cap), *pre = malloc((size_t)plen + 1);
  memset(pre, 'x', (size_t)plen);
  pre[plen] = 0;
  used += (size_t)snprintf(b, cap, "{\"weight_map\": {");
  for (int i = 0; i < n; i++)
    used += (size_t)snprintf(b + used, cap - used, "%s\"t%d\": \"%s-%05d.safetensors\"",
                             i ? ", " : "", i, pre, i % nf);
  used += (size_t)snprintf(b + used, cap - used, "}}");
  free(pre);
  *len = used;
  return b;
}

static void test_index_parse(void **state) {
  const char *json = "{\"metadata\": {\"total_size\": 8}, \"weight_map\": {\"z\": \"b.st\", "
                     "\"m\": \"a.st\", \"a\": \"b.st\", \"q\": \"c.st\", \"m.1\": \"a.st\"}}";
  lh_st_index *ix = NULL;
  assert_int_equal(lh_safetensors_index_parse(json, strlen(json), "t.json", &ix), LH_ERR_OK);
  /* shards in first-seen order, names sorted, each with its shard */
  assert_int_equal(ix->n_files, 3);
  assert_string_equal(ix->files[0], "b.st");
  assert_string_equal(ix->files[1], "a.st");
  assert_string_equal(ix->files[2], "c.st");
  assert_int_equal(ix->n, 5);
  const char *names[] = {"a", "m", "m.1", "q", "z"};
  const int file[] = {0, 1, 1, 2, 0};
  for (int i = 0; i < 5; i++) {
    assert_string_equal(ix->names[i], names[i]);
    assert_int_equal(ix->file[i], file[i]);
    assert_int_equal(lh_safetensors_index_find(ix, names[i]), file[i]);
  }
  assert_int_equal(lh_safetensors_index_find(ix, "m.0"), -1);
  assert_int_equal(lh_safetensors_index_find(ix, ""), -1);
  free(ix);

  /* at most 4096 distinct shards, however often each is named */
  size_t len;
  char *text = index_text(3 * 4096, 4096, 8, &len);
  assert_int_equal(lh_safetensors_index_parse(text, len, "t.json", &ix), LH_ERR_OK);
  assert_int_equal(ix->n_files, 4096);
  assert_int_equal(ix->n, 3 * 4096);
  for (int i = 0; i < 4096; i++) {
    char want[64];
    snprintf(want, sizeof want, "xxxxxxxx-%05d.safetensors", i);
    assert_string_equal(ix->files[i], want);
  }
  char t[16];
  snprintf(t, sizeof t, "t%d", 2 * 4096 + 17);
  assert_string_equal(ix->files[lh_safetensors_index_find(ix, t)], "xxxxxxxx-00017.safetensors");
  free(ix);
  free(text);
  text = index_text(4097, 4097, 8, &len);
  ix = (lh_st_index *)0x1;
  assert_int_equal(lh_safetensors_index_parse(text, len, "t.json", &ix), LH_ERR_LIMIT);
  assert_null(ix);
  assert_non_null(strstr(lh_last_error(), "more than 4096 shards"));
  free(text);
  /* what parsing costs is bounded first: 1025 empty objects */
  text = malloc(4 * 1025 + 64);
  char *p = text + sprintf(text, "{\"weight_map\": {}, \"x\": [");
  for (int i = 0; i < 1025; i++)
    p += sprintf(p, i ? ",{}" : "{}");
  p += sprintf(p, "]}");
  assert_int_equal(lh_safetensors_index_parse(text, (size_t)(p - text), "t.json", &ix),
                   LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "t.json: "));
  assert_non_null(strstr(lh_last_error(), "opening an object or array"));
  free(text);
}

static int saved_stderr = -1;

/* Sends stderr (where lh_log writes) to `path` until stderr_restore(). */
static void stderr_to_file(const char *path) {
  fflush(stderr);
  saved_stderr = dup(2);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_true(saved_stderr >= 0 && fd >= 0);
  assert_int_equal(dup2(fd, 2), 2);
  close(fd);
}

static void stderr_restore(void) {
  fflush(stderr);
  assert_int_equal(dup2(saved_stderr, 2), 2);
  close(saved_stderr);
}

/* Writes DIR/model.safetensors.index.json mapping the first n/2 tensors to
 * model-00001-of-00002.safetensors and the rest to model-00002-of-00002.safetensors, except
 * that tensor `skip` is left out and tensor `moved` is mapped to shard `to` (-1: none). */
static void write_index(const char *dir, const lh_tensor_info *info, int n, int skip, int moved,
                        int to) {
  size_t cap = 64 + (size_t)n * 160, used = 0;
  char *idx = malloc(cap);
  used += (size_t)snprintf(idx, cap, "{\"metadata\": {}, \"weight_map\": {");
  const char *sep = "";
  for (int i = 0; i < n; i++) {
    if (i == skip) continue;
    int shard = i == moved ? to : i < n / 2 ? 1 : 2;
    used +=
        (size_t)snprintf(idx + used, cap - used, "%s\"%s\": \"model-%05d-of-00002.safetensors\"",
                         sep, info[i].name, shard);
    sep = ", ";
  }
  snprintf(idx + used, cap - used, "}}");
  char p[256];
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  assert_int_equal(lh_file_write_atomic(p, idx, strlen(idx)), LH_ERR_OK);
  free(idx);
}

static void test_model_load_sharded(void **state) {
  lh_model *m = tiny_model(LH_ARCH_QWEN2, false, 5);
  char *dir = strdup(path_in("sharded"));
  assert_int_equal(lh_model_save(m, dir, LH_SAVE_F32), LH_ERR_OK);
  char p[256];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  unlink(p);
  /* split the tensors over two shards in BF16 and F32 */
  int n = lh_model_tensors(&m->cfg, NULL, 0);
  lh_tensor_info *info = calloc((size_t)n, sizeof *info);
  lh_st_entry *e = calloc((size_t)n, sizeof *e);
  uint16_t *bf = malloc(m->n_params * sizeof *bf);
  lh_bf16_from_f32_n(bf, m->params, m->n_params);
  lh_model_tensors(&m->cfg, info, n);
  for (int i = 0; i < n; i++) {
    int first = i < n / 2;
    e[i] = (lh_st_entry){info[i].name,
                         first ? LH_DTYPE_BF16 : LH_DTYPE_F32,
                         info[i].ndim,
                         {info[i].shape[0], info[i].shape[1]},
                         first ? (const void *)(bf + info[i].offset)
                               : (const void *)(m->params + info[i].offset)};
  }
  snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
  assert_int_equal(lh_safetensors_write(p, e, n / 2), LH_ERR_OK);
  snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
  assert_int_equal(lh_safetensors_write(p, e + n / 2, n - n / 2), LH_ERR_OK);
  write_index(dir, info, n, -1, -1, 0);

  lh_model *back = NULL;
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_OK);
  for (int i = 0; i < n; i++)
    for (size_t j = 0; j < info[i].numel; j++) {
      float want = m->params[info[i].offset + j];
      if (i < n / 2) want = lh_f32_from_bf16(bf[info[i].offset + j]);
      assert_true(back->params[info[i].offset + j] == want);
    }
  lh_model_free(back);

  /* weight_map decides which shard a tensor is read from: a second copy of the last tensor
   * (mapped to shard 2) in shard 1, with other values, is ignored with a warning naming it */
  int last = n - 1;
  float *other = malloc(info[last].numel * sizeof *other);
  for (size_t j = 0; j < info[last].numel; j++)
    other[j] = 7.0f;
  e[n / 2] = e[last];
  e[n / 2].dtype = LH_DTYPE_F32;
  e[n / 2].data = other;
  snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
  assert_int_equal(lh_safetensors_write(p, e, n / 2 + 1), LH_ERR_OK);
  char *log = NULL;
  stderr_to_file(path_in("load.log"));
  lh_err le = lh_model_load(dir, &back);
  stderr_restore();
  assert_int_equal(le, LH_ERR_OK);
  for (size_t j = 0; j < info[last].numel; j++)
    assert_true(back->params[info[last].offset + j] == m->params[info[last].offset + j]);
  lh_model_free(back);
  size_t log_len = 0;
  assert_int_equal(lh_file_read(path_in("load.log"), 1 << 20, &log, &log_len), LH_ERR_OK);
  if (!strstr(log, "ignored") || !strstr(log, info[last].name) ||
      !strstr(log, "model-00001-of-00002.safetensors") ||
      !strstr(log, "model.safetensors.index.json"))
    fail_msg("warning should name the index, the tensor and its unmapped shard: \"%s\"", log);
  free(log);
  /* ... and mapped to shard 1, the copy there is the one read */
  write_index(dir, info, n, -1, last, 1);
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_OK);
  for (size_t j = 0; j < info[last].numel; j++)
    assert_true(back->params[info[last].offset + j] == 7.0f);
  lh_model_free(back);

  /* a tensor the model needs that weight_map does not list, or maps to a shard that does not
   * hold it, is an error naming the index and the tensor, though another shard holds it */
  write_index(dir, info, n, 1, -1, 0);
  back = (lh_model *)0x1;
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_NOTFOUND);
  assert_null(back);
  if (!strstr(lh_last_error(), "model.safetensors.index.json") ||
      !strstr(lh_last_error(), info[1].name) ||
      !strstr(lh_last_error(), "not listed in weight_map"))
    fail_msg("unlisted tensor: error \"%s\"", lh_last_error());
  write_index(dir, info, n, -1, 0, 2);
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_NOTFOUND);
  if (!strstr(lh_last_error(), "model.safetensors.index.json") ||
      !strstr(lh_last_error(), info[0].name) ||
      !strstr(lh_last_error(), "model-00002-of-00002.safetensors"))
    fail_msg("tensor mapped to a shard without it: error \"%s\"", lh_last_error());
  free(other);

  /* a shard name that leaves the directory is refused */
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  const char *evil = "{\"weight_map\": {\"model.embed_tokens.weight\": \"../x.safetensors\"}}";
  assert_int_equal(lh_file_write_atomic(p, evil, strlen(evil)), LH_ERR_OK);
  assert_int_equal(lh_model_load(dir, &back), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "../x.safetensors"));

  free(bf);
  free(e);
  free(info);
  free(dir);
  lh_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_all_dtypes),
      cmocka_unit_test(test_round_trip_bf16_weights),
      cmocka_unit_test(test_unaligned_bf16),
      cmocka_unit_test(test_zero_length_and_metadata),
      cmocka_unit_test(test_truncated),
      cmocka_unit_test(test_header_length_limits),
      cmocka_unit_test(test_bad_json),
      cmocka_unit_test(test_header_values),
      cmocka_unit_test(test_unknown_dtype),
      cmocka_unit_test(test_shape_offset_mismatch),
      cmocka_unit_test(test_overlap),
      cmocka_unit_test(test_offsets_outside_data),
      cmocka_unit_test(test_negative_shape),
      cmocka_unit_test(test_too_many_dims),
      cmocka_unit_test(test_open_errors),
      cmocka_unit_test(test_write_rejects_bad_entries),
      cmocka_unit_test(test_truncated_file),
      cmocka_unit_test(test_truncated_while_open),
      cmocka_unit_test(test_open_fifo),
      cmocka_unit_test(test_metadata_and_buffers),
      cmocka_unit_test(test_model_save_load_f32),
      cmocka_unit_test(test_model_save_load_bf16),
      cmocka_unit_test(test_model_load_nonfinite),
      cmocka_unit_test(test_model_load_errors),
      cmocka_unit_test(test_model_load_generation_config),
      cmocka_unit_test(test_model_load_sharded),
      cmocka_unit_test(test_index_parse),
  };
  return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
