/* Unit tests of the export module's number formats and GGUF writer: fp16 rounding against
 * IEEE 754 values worked out by hand (ties to even, subnormals, overflow), Q8_0 blocks against
 * the definition (scale max|x|/127 as fp16, round half away from zero), the file layout read
 * back field by field from the bytes (magic, version, counts, key/values, tensor infos, 32-byte
 * aligned data), and the writer's refusals (nothing is left at the path). The files are also
 * read by llama.cpp and @huggingface/gguf in tests/integration/export.sh. */
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

#include "longhaul/export.h"

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void test_f16(void **state) {
  (void)state;
  assert_int_equal(lh_gguf_f16_from_f32(0.0f), 0x0000);
  assert_int_equal(lh_gguf_f16_from_f32(-0.0f), 0x8000);
  assert_int_equal(lh_gguf_f16_from_f32(1.0f), 0x3c00);
  assert_int_equal(lh_gguf_f16_from_f32(-2.0f), 0xc000);
  assert_int_equal(lh_gguf_f16_from_f32(65504.0f), 0x7bff); /* largest half */
  assert_int_equal(lh_gguf_f16_from_f32(65519.0f), 0x7bff); /* below the midpoint */
  assert_int_equal(lh_gguf_f16_from_f32(65520.0f), 0x7c00); /* the midpoint: to inf */
  assert_int_equal(lh_gguf_f16_from_f32(1.0e6f), 0x7c00);
  assert_int_equal(lh_gguf_f16_from_f32(0x1p-14f), 0x0400);        /* smallest normal */
  assert_int_equal(lh_gguf_f16_from_f32(0x1p-24f), 0x0001);        /* smallest subnormal */
  assert_int_equal(lh_gguf_f16_from_f32(0x1p-25f), 0x0000);        /* tie: to even (0) */
  assert_int_equal(lh_gguf_f16_from_f32(0x1.8p-24f), 0x0002);      /* tie: to even (2) */
  assert_int_equal(lh_gguf_f16_from_f32(1.0f + 0x1p-11f), 0x3c00); /* tie: to even */
  assert_int_equal(lh_gguf_f16_from_f32(1.0f + 0x3p-11f), 0x3c02); /* tie: to even (up) */
  assert_int_equal(lh_gguf_f16_from_f32(1.0f + 0x1p-10f), 0x3c01);
  assert_int_equal(lh_gguf_f16_from_f32(0x1.ffcp-15f), 0x0400); /* rounds up into the normals */
  assert_int_equal(lh_gguf_f16_from_f32(bits_f32(0x7f800000u)), 0x7c00);
  assert_true((lh_gguf_f16_from_f32(NAN) & 0x7c00) == 0x7c00 &&
              (lh_gguf_f16_from_f32(NAN) & 0x3ff) != 0);
  /* every half round-trips through fp32 */
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* nan */
    float f = lh_gguf_f32_from_f16((uint16_t)h);
    assert_int_equal(lh_gguf_f16_from_f32(f), h);
  }
  assert_true(lh_gguf_f32_from_f16(0x3555) == 0x1.554p-2f);
}

static void test_q8_0(void **state) {
  (void)state;
  float x[64];
  for (int i = 0; i < 32; i++)
    x[i] = (float)(i - 16) * 0.25f; /* max |x| = 4 */
  for (int i = 32; i < 64; i++)
    x[i] = 0; /* an all-zero block: scale 0, all q 0 */
  uint8_t out[2 * 34];
  lh_gguf_quantize_q8_0(x, 64, out);
  float d = lh_gguf_f32_from_f16(lh_get_le16(out));
  assert_int_equal(lh_get_le16(out), lh_gguf_f16_from_f32(4.0f / 127.0f));
  for (int i = 0; i < 32; i++) {
    int q = (int8_t)out[2 + i];
    float id = 1.0f / (4.0f / 127.0f), p = x[i] * id;
    assert_int_equal(q, (int)roundf(p));
    assert_true(fabsf(q * d - x[i]) <= d * 0.5f + 1e-3f);
  }
  assert_int_equal((int8_t)out[2], -127); /* -4 */
  assert_int_equal(lh_get_le16(out + 34), 0);
  for (int i = 0; i < 32; i++)
    assert_int_equal(out[36 + i], 0);
  /* half away from zero: x/d = -2.5 gives -3 */
  float y[32] = {0};
  y[0] = 127.0f;
  y[1] = -2.5f;
  lh_gguf_quantize_q8_0(y, 32, out);
  assert_int_equal((int8_t)out[3], -3);
}

/* A little reader of what the test wrote: advances *p and checks bounds. */
typedef struct {
  const uint8_t *b;
  size_t n, p;
} rd;
static uint64_t r64(rd *r) {
  assert_true(r->p + 8 <= r->n);
  uint64_t v = lh_get_le64(r->b + r->p);
  r->p += 8;
  return v;
}
static uint32_t r32(rd *r) {
  assert_true(r->p + 4 <= r->n);
  uint32_t v = lh_get_le32(r->b + r->p);
  r->p += 4;
  return v;
}
static void rstr(rd *r, const char *want) {
  uint64_t n = r64(r);
  assert_true(r->p + n <= r->n);
  assert_int_equal(n, strlen(want));
  assert_memory_equal(r->b + r->p, want, n);
  r->p += n;
}

static char *tmp_path(const char *name) {
  static char dir[256];
  if (!dir[0]) {
    snprintf(dir, sizeof dir, "%s/lh-test-export.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(dir));
  }
  return lh_path_join(dir, name);
}

static void test_layout(void **state) {
  (void)state;
  lh_gguf *g = lh_gguf_create();
  assert_int_equal(lh_gguf_set_str(g, "general.architecture", "llama"), LH_ERR_OK);
  assert_int_equal(lh_gguf_set_u32(g, "llama.block_count", 2), LH_ERR_OK);
  const char *toks[] = {"a", "\xc4\xa0"
                             "b"};
  assert_int_equal(lh_gguf_set_str_array(g, "tokenizer.ggml.tokens", toks, 2), LH_ERR_OK);
  int32_t types[] = {1, 3};
  assert_int_equal(lh_gguf_set_i32_array(g, "tokenizer.ggml.token_type", types, 2), LH_ERR_OK);
  assert_int_equal(lh_gguf_set_f32(g, "x.eps", 1e-5f), LH_ERR_OK);
  assert_int_equal(lh_gguf_set_bool(g, "x.flag", true), LH_ERR_OK);
  float v[3] = {1.0f, -2.0f, 0.5f}, m[64];
  for (int i = 0; i < 64; i++)
    m[i] = (float)i / 64.0f;
  int64_t ne1[1] = {3}, ne2[2] = {32, 2};
  assert_int_equal(lh_gguf_add_tensor(g, "norm.weight", 1, ne1, LH_GGUF_F32, v), LH_ERR_OK);
  assert_int_equal(lh_gguf_add_tensor(g, "w.weight", 2, ne2, LH_GGUF_Q8_0, m), LH_ERR_OK);
  assert_int_equal(lh_gguf_add_tensor(g, "h.weight", 2, ne2, LH_GGUF_F16, m), LH_ERR_OK);
  assert_int_equal(lh_gguf_add_tensor(g, "b.weight", 1, ne1, LH_GGUF_BF16, v), LH_ERR_OK);
  char *path = tmp_path("t.gguf");
  assert_int_equal(lh_gguf_write(g, path), LH_ERR_OK);
  lh_gguf_free(g);
  char *buf = NULL;
  size_t len = 0;
  assert_int_equal(lh_file_read(path, 1 << 20, &buf, &len), LH_ERR_OK);
  rd r = {(const uint8_t *)buf, len, 0};
  assert_memory_equal(buf, "GGUF", 4);
  r.p = 4;
  assert_int_equal(r32(&r), 3);
  assert_int_equal(r64(&r), 4); /* tensors */
  assert_int_equal(r64(&r), 6); /* key/values */
  rstr(&r, "general.architecture");
  assert_int_equal(r32(&r), 8);
  rstr(&r, "llama");
  rstr(&r, "llama.block_count");
  assert_int_equal(r32(&r), 4);
  assert_int_equal(r32(&r), 2);
  rstr(&r, "tokenizer.ggml.tokens");
  assert_int_equal(r32(&r), 9);
  assert_int_equal(r32(&r), 8);
  assert_int_equal(r64(&r), 2);
  rstr(&r, "a");
  rstr(&r, "\xc4\xa0"
           "b");
  rstr(&r, "tokenizer.ggml.token_type");
  assert_int_equal(r32(&r), 9);
  assert_int_equal(r32(&r), 5);
  assert_int_equal(r64(&r), 2);
  assert_int_equal(r32(&r), 1);
  assert_int_equal(r32(&r), 3);
  rstr(&r, "x.eps");
  assert_int_equal(r32(&r), 6);
  uint32_t e = r32(&r);
  float ef;
  memcpy(&ef, &e, 4);
  assert_true(ef == 1e-5f);
  rstr(&r, "x.flag");
  assert_int_equal(r32(&r), 7);
  assert_int_equal(r.b[r.p++], 1);
  /* tensor infos: offsets aligned to 32 */
  const char *names[] = {"norm.weight", "w.weight", "h.weight", "b.weight"};
  uint32_t tt[] = {0, 8, 1, 30};
  uint64_t want_off[] = {0, 32, 32 + 96, 32 + 96 + 128}, offs[4];
  for (int i = 0; i < 4; i++) {
    rstr(&r, names[i]);
    uint32_t nd = r32(&r);
    assert_int_equal(nd, i == 0 || i == 3 ? 1 : 2);
    for (uint32_t d = 0; d < nd; d++)
      assert_int_equal(r64(&r), nd == 1 ? 3 : (d == 0 ? 32 : 2));
    assert_int_equal(r32(&r), tt[i]);
    offs[i] = r64(&r);
    assert_int_equal(offs[i], want_off[i]);
  }
  size_t data = (r.p + 31) / 32 * 32;
  for (size_t i = r.p; i < data; i++)
    assert_int_equal(r.b[i], 0);
  assert_int_equal(len, data + want_off[3] + 32);
  const uint8_t *d0 = r.b + data;
  assert_int_equal(lh_get_le32(d0 + 4), 0xc0000000u); /* -2.0f */
  const uint8_t *q = d0 + 32;                         /* block 1 of w: values 32..63 / 64 */
  float s = lh_gguf_f32_from_f16(lh_get_le16(q + 34));
  assert_true(fabsf(s - (63.0f / 64.0f) / 127.0f) < 1e-5f);
  assert_int_equal((int8_t)q[34 + 2 + 31], 127);
  const uint8_t *h = d0 + 128;
  assert_int_equal(lh_get_le16(h + 2 * 32), lh_gguf_f16_from_f32(0.5f)); /* m[32] */
  const uint8_t *bf = d0 + 256;
  assert_int_equal(lh_get_le16(bf), 0x3f80);
  assert_int_equal(lh_get_le16(bf + 4), 0x3f00);
  free(buf);
  unlink(path);
  free(path);
}

static void test_refusals(void **state) {
  (void)state;
  lh_gguf *g = lh_gguf_create();
  assert_int_equal(lh_gguf_set_u32(g, "a", 1), LH_ERR_OK);
  assert_int_equal(lh_gguf_set_u32(g, "a", 2), LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "key a set twice"));
  assert_int_equal(lh_gguf_set_str(g, "b", "\xff"), LH_ERR_INVAL);
  assert_int_equal(lh_gguf_set_str(g, "", "x"), LH_ERR_INVAL);
  const char *bad[] = {"ok", "\xc0\x80"}; /* an overlong NUL */
  assert_int_equal(lh_gguf_set_str_array(g, "c", bad, 2), LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "element 1"));
  float m[48] = {0};
  int64_t ne[2] = {48, 1}, ne0[2] = {0, 1};
  assert_int_equal(lh_gguf_add_tensor(g, "q", 2, ne, LH_GGUF_Q8_0, m), LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "multiple of 32"));
  assert_int_equal(lh_gguf_add_tensor(g, "z", 2, ne0, LH_GGUF_F32, m), LH_ERR_INVAL);
  assert_int_equal(lh_gguf_add_tensor(g, "t", 2, ne, LH_GGUF_F16, m), LH_ERR_OK);
  assert_int_equal(lh_gguf_add_tensor(g, "t", 2, ne, LH_GGUF_F16, m), LH_ERR_INVAL);
  char *path = tmp_path("bad.gguf");
  m[7] = 70000.0f; /* past fp16 */
  assert_int_equal(lh_gguf_write(g, path), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "tensor t: element 7"));
  struct stat sb;
  assert_int_not_equal(stat(path, &sb), 0);
  m[7] = NAN;
  assert_int_equal(lh_gguf_write(g, path), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "not finite"));
  assert_int_not_equal(stat(path, &sb), 0);
  lh_gguf_free(g);
  free(path);
  lh_gguf_type t;
  assert_int_equal(lh_gguf_type_parse("q8_0", &t), LH_ERR_OK);
  assert_int_equal(t, LH_GGUF_Q8_0);
  assert_int_equal(lh_gguf_type_parse("q4_k", &t), LH_ERR_USAGE);
  assert_string_equal(lh_gguf_type_name(LH_GGUF_BF16), "bf16");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f16),
      cmocka_unit_test(test_q8_0),
      cmocka_unit_test(test_layout),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
