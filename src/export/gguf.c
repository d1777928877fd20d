/* The GGUF writer, to ggml's docs/gguf.md (version 3): "GGUF", version, tensor and key/value
 * counts, the key/values, the tensor infos (name, dims in ggml order, type, offset), padding to
 * general.alignment, then each tensor's data at an aligned offset. Metadata is serialised as it
 * is set; tensor data is converted from the caller's fp32 while the file is streamed out. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/export.h"

/* gguf_metadata_value_type */
enum {
  GGUF_U32 = 4,
  GGUF_I32 = 5,
  GGUF_F32 = 6,
  GGUF_BOOL = 7,
  GGUF_STRING = 8,
  GGUF_ARRAY = 9,
};

#define MAX_DIMS 4

typedef struct {
  char *name;
  int ndim;
  int64_t ne[MAX_DIMS];
  lh_gguf_type type;
  const float *data;
  size_t numel;
} gtensor;

struct lh_gguf {
  uint8_t *kv; /* serialised key/values */
  size_t kv_len, kv_cap;
  char **keys;
  size_t n_kv, keys_cap;
  gtensor *t;
  size_t n_t, t_cap;
};

static const char *const type_names[] = {
    [LH_GGUF_F32] = "f32", [LH_GGUF_F16] = "f16", [LH_GGUF_Q8_0] = "q8_0", [LH_GGUF_BF16] = "bf16"};

lh_err lh_gguf_type_parse(const char *s, lh_gguf_type *out) {
  static const lh_gguf_type all[] = {LH_GGUF_F32, LH_GGUF_F16, LH_GGUF_BF16, LH_GGUF_Q8_0};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (s && !strcmp(s, type_names[all[i]])) {
      *out = all[i];
      return LH_ERR_OK;
    }
  return lh_errorf(LH_ERR_USAGE, "GGUF type: expected f32, f16, bf16 or q8_0, found \"%s\"",
                   s ? s : "");
}

const char *lh_gguf_type_name(lh_gguf_type t) {
  switch (t) {
  case LH_GGUF_F32:
  case LH_GGUF_F16:
  case LH_GGUF_Q8_0:
  case LH_GGUF_BF16:
    return type_names[t];
  }
  return "?";
}

/* ---------------------------------------------------------------- number formats */

uint16_t lh_gguf_f16_from_f32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t ax = u & 0x7fffffffu;
  if (ax >= 0x7f800000u) /* inf or nan */
    return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
  if (ax < 0x38800000u) {                                   /* below 2^-14: subnormal half */
    /* ax as a float times 2^24 is the subnormal's integer; rint rounds to nearest even */
    float f;
    memcpy(&f, &ax, 4);
    return (uint16_t)(sign | (uint16_t)lrintf(f * 16777216.0f));
  }
  uint32_t mant = ax & 0x7fffffu, exp = (ax >> 23) - 112; /* rebias 127 -> 15 */
  uint32_t h = (exp << 10) | (mant >> 13), rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++; /* a carry into the exponent is right */
  return (uint16_t)(sign | h);
}

float lh_gguf_f32_from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31, m = h & 0x3ffu, u;
  if (e == 0) {
    float f = ldexpf((float)m, -24);
    return sign ? -f : f;
  }
  if (e == 31)
    u = sign | 0x7f800000u | (m << 13);
  else
    u = sign | ((e + 112) << 23) | (m << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

void lh_gguf_quantize_q8_0(const float *x, size_t n, uint8_t *out) {
  for (size_t b = 0; b < n / LH_GGUF_QK8_0; b++, x += LH_GGUF_QK8_0, out += 2 + LH_GGUF_QK8_0) {
    float amax = 0;
    for (int j = 0; j < LH_GGUF_QK8_0; j++)
      amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    lh_put_le16(out, lh_gguf_f16_from_f32(d));
    for (int j = 0; j < LH_GGUF_QK8_0; j++)
      out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
  }
}

/* ---------------------------------------------------------------- building */

lh_gguf *lh_gguf_create(void) {
  return lh_xcalloc(1, sizeof(lh_gguf));
}

void lh_gguf_free(lh_gguf *g) {
  if (!g) return;
  for (size_t i = 0; i < g->n_kv; i++)
    free(g->keys[i]);
  for (size_t i = 0; i < g->n_t; i++)
    free(g->t[i].name);
  free(g->keys);
  free(g->t);
  free(g->kv);
  free(g);
}

static void put(lh_gguf *g, const void *p, size_t n) {
  if (g->kv_len + n > g->kv_cap) {
    g->kv_cap = (g->kv_len + n) * 2 + 256;
    g->kv = lh_xrealloc(g->kv, g->kv_cap);
  }
  memcpy(g->kv + g->kv_len, p, n);
  g->kv_len += n;
}

static void put_u32(lh_gguf *g, uint32_t v) {
  uint8_t b[4];
  lh_put_le32(b, v);
  put(g, b, 4);
}

static void put_u64(lh_gguf *g, uint64_t v) {
  uint8_t b[8];
  lh_put_le64(b, v);
  put(g, b, 8);
}

static void put_str(lh_gguf *g, const char *s) {
  size_t n = strlen(s);
  put_u64(g, n);
  put(g, s, n);
}

/* Valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static bool utf8_ok(const char *s) {
  const uint8_t *p = (const uint8_t *)s;
  while (*p) {
    uint32_t c = *p;
    int k = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (k < 0) return false;
    uint32_t cp = k == 0 ? c : c & (0x3fu >> k);
    for (int i = 1; i <= k; i++) {
      if ((p[i] & 0xc0) != 0x80) return false;
      cp = cp << 6 | (p[i] & 0x3fu);
    }
    static const uint32_t min[] = {0, 0x80, 0x800, 0x10000};
    if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    p += k + 1;
  }
  return true;
}

/* Starts key/value `key` of `type`: checks the key and writes it and the type. */
static lh_err begin_kv(lh_gguf *g, const char *key, uint32_t type) {
  if (!key || !key[0] || !utf8_ok(key))
    return lh_errorf(LH_ERR_INVAL, "GGUF: a metadata key must be non-empty UTF-8 text");
  for (size_t i = 0; i < g->n_kv; i++)
    if (!strcmp(g->keys[i], key)) return lh_errorf(LH_ERR_INVAL, "GGUF: key %s set twice", key);
  if (g->n_kv == g->keys_cap) {
    g->keys_cap = g->keys_cap * 2 + 16;
    g->keys = lh_xrealloc(g->keys, g->keys_cap * sizeof *g->keys);
  }
  g->keys[g->n_kv++] = lh_xstrdup(key);
  put_str(g, key);
  put_u32(g, type);
  return LH_ERR_OK;
}

lh_err lh_gguf_set_str(lh_gguf *g, const char *key, const char *value) {
  if (!value || !utf8_ok(value))
    return lh_errorf(LH_ERR_INVAL, "GGUF: key %s: the value is not UTF-8 text", key ? key : "");
  lh_err e = begin_kv(g, key, GGUF_STRING);
  if (!e) put_str(g, value);
  return e;
}

lh_err lh_gguf_set_u32(lh_gguf *g, const char *key, uint32_t value) {
  lh_err e = begin_kv(g, key, GGUF_U32);
  if (!e) put_u32(g, value);
  return e;
}

lh_err lh_gguf_set_f32(lh_gguf *g, const char *key, float value) {
  lh_err e = begin_kv(g, key, GGUF_F32);
  uint32_t u;
  memcpy(&u, &value, 4);
  if (!e) put_u32(g, u);
  return e;
}

lh_err lh_gguf_set_bool(lh_gguf *g, const char *key, bool value) {
  lh_err e = begin_kv(g, key, GGUF_BOOL);
  uint8_t b = value;
  if (!e) put(g, &b, 1);
  return e;
}

lh_err lh_gguf_set_str_array(lh_gguf *g, const char *key, const char *const *values, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!values[i] || !utf8_ok(values[i]))
      return lh_errorf(LH_ERR_INVAL, "GGUF: key %s: element %zu is not UTF-8 text", key ? key : "",
                       i);
  lh_err e = begin_kv(g, key, GGUF_ARRAY);
  if (e) return e;
  put_u32(g, GGUF_STRING);
  put_u64(g, n);
  for (size_t i = 0; i < n; i++)
    put_str(g, values[i]);
  return LH_ERR_OK;
}

lh_err lh_gguf_set_i32_array(lh_gguf *g, const char *key, const int32_t *values, size_t n) {
  lh_err e = begin_kv(g, key, GGUF_ARRAY);
  if (e) return e;
  put_u32(g, GGUF_I32);
  put_u64(g, n);
  for (size_t i = 0; i < n; i++)
    put_u32(g, (uint32_t)values[i]);
  return LH_ERR_OK;
}

lh_err lh_gguf_add_tensor(lh_gguf *g, const char *name, int ndim, const int64_t *ne,
                          lh_gguf_type type, const float *data) {
  if (!name || !name[0] || strlen(name) >= 64 || !utf8_ok(name))
    return lh_errorf(LH_ERR_INVAL, "GGUF: tensor names are 1 to 63 bytes of UTF-8 (ggml's limit)");
  if (ndim < 1 || ndim > MAX_DIMS)
    return lh_errorf(LH_ERR_INVAL, "GGUF: tensor %s: %d dimensions, expected 1 to %d", name, ndim,
                     MAX_DIMS);
  if (!strcmp(lh_gguf_type_name(type), "?"))
    return lh_errorf(LH_ERR_INVAL, "GGUF: tensor %s: unknown type %d", name, (int)type);
  size_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (ne[d] < 1 || ne[d] > ((int64_t)1 << 40))
      return lh_errorf(LH_ERR_INVAL, "GGUF: tensor %s: dimension %d is %lld", name, d,
                       (long long)ne[d]);
    numel = lh_size_mul(numel, (size_t)ne[d]);
  }
  if (type == LH_GGUF_Q8_0 && ne[0] % LH_GGUF_QK8_0)
    return lh_errorf(LH_ERR_INVAL,
                     "GGUF: tensor %s: q8_0 needs rows of a multiple of %d values, "
                     "found %lld",
                     name, LH_GGUF_QK8_0, (long long)ne[0]);
  for (size_t i = 0; i < g->n_t; i++)
    if (!strcmp(g->t[i].name, name)) return lh_errorf(LH_ERR_INVAL, "GGUF: tensor %s twice", name);
  if (g->n_t == g->t_cap) {
    g->t_cap = g->t_cap * 2 + 16;
    g->t = lh_xrealloc(g->t, g->t_cap * sizeof *g->t);
  }
  gtensor *t = &g->t[g->n_t++];
  *t =
      (gtensor){.name = lh_xstrdup(name), .ndim = ndim, .type = type, .data = data, .numel = numel};
  memcpy(t->ne, ne, (size_t)ndim * sizeof *ne);
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- writing */

static size_t tensor_bytes(const gtensor *t) {
  switch (t->type) {
  case LH_GGUF_F32:
    return t->numel * 4;
  case LH_GGUF_F16:
  case LH_GGUF_BF16:
    return t->numel * 2;
  case LH_GGUF_Q8_0:
    return t->numel / LH_GGUF_QK8_0 * (2 + LH_GGUF_QK8_0);
  }
  return 0;
}

static size_t align_up(size_t x) {
  return (x + LH_GGUF_ALIGNMENT - 1) / LH_GGUF_ALIGNMENT * LH_GGUF_ALIGNMENT;
}

/* Converts t's data into buf (tensor_bytes(t) bytes), checking every value. */
static lh_err convert(const gtensor *t, uint8_t *buf) {
  for (size_t i = 0; i < t->numel; i++)
    if (!isfinite(t->data[i]))
      return lh_errorf(LH_ERR_FORMAT, "GGUF: tensor %s: element %zu is not finite", t->name, i);
  switch (t->type) {
  case LH_GGUF_F32:
    for (size_t i = 0; i < t->numel; i++) {
      uint32_t u;
      memcpy(&u, &t->data[i], 4);
      lh_put_le32(buf + 4 * i, u);
    }
    break;
  case LH_GGUF_BF16:
    for (size_t i = 0; i < t->numel; i++) {
      uint32_t u;
      memcpy(&u, &t->data[i], 4);
      u += 0x7fffu + ((u >> 16) & 1); /* round to nearest even; finite values only here */
      lh_put_le16(buf + 2 * i, (uint16_t)(u >> 16));
      if (((u >> 16) & 0x7fffu) == 0x7f80u)
        return lh_errorf(LH_ERR_FORMAT, "GGUF: tensor %s: element %zu (%g) overflows bf16", t->name,
                         i, (double)t->data[i]);
    }
    break;
  case LH_GGUF_F16:
    for (size_t i = 0; i < t->numel; i++) {
      uint16_t h = lh_gguf_f16_from_f32(t->data[i]);
      if ((h & 0x7fffu) == 0x7c00u)
        return lh_errorf(LH_ERR_FORMAT,
                         "GGUF: tensor %s: element %zu (%g) is past fp16's range (65504); "
                         "export bf16 or q8_0",
                         t->name, i, (double)t->data[i]);
      lh_put_le16(buf + 2 * i, h);
    }
    break;
  case LH_GGUF_Q8_0:
    lh_gguf_quantize_q8_0(t->data, t->numel, buf);
    for (size_t b = 0; b < t->numel / LH_GGUF_QK8_0; b++)
      if ((lh_get_le16(buf + b * (2 + LH_GGUF_QK8_0)) & 0x7fffu) == 0x7c00u)
        return lh_errorf(LH_ERR_FORMAT,
                         "GGUF: tensor %s: block %zu's q8_0 scale is past fp16's "
                         "range",
                         t->name, b);
    break;
  }
  return LH_ERR_OK;
}

lh_err lh_gguf_write(const lh_gguf *g, const char *path) {
  /* the header and tensor infos, in memory */
  lh_gguf h = {0};
  put(&h, "GGUF", 4);
  put_u32(&h, LH_GGUF_VERSION);
  put_u64(&h, g->n_t);
  put_u64(&h, g->n_kv);
  put(&h, g->kv, g->kv_len);
  size_t off = 0, max_bytes = 0;
  for (size_t i = 0; i < g->n_t; i++) {
    const gtensor *t = &g->t[i];
    put_str(&h, t->name);
    put_u32(&h, (uint32_t)t->ndim);
    for (int d = 0; d < t->ndim; d++)
      put_u64(&h, (uint64_t)t->ne[d]);
    put_u32(&h, (uint32_t)t->type);
    put_u64(&h, off);
    size_t b = tensor_bytes(t);
    if (b > max_bytes) max_bytes = b;
    off = align_up(off + b);
  }
  static const uint8_t zeros[LH_GGUF_ALIGNMENT] = {0};
  put(&h, zeros, align_up(h.kv_len) - h.kv_len);
  uint8_t *buf = lh_try_malloc_aligned(max_bytes + LH_GGUF_ALIGNMENT, "GGUF tensor buffer");
  lh_file_out *o = NULL;
  lh_err e = buf ? LH_ERR_OK : LH_ERR_NOMEM;
  if (!e) e = lh_file_out_open(path, &o);
  if (!e) e = lh_file_out_write(o, h.kv, h.kv_len);
  for (size_t i = 0; i < g->n_t && !e; i++) {
    const gtensor *t = &g->t[i];
    size_t b = tensor_bytes(t);
    if ((e = convert(t, buf))) break;
    memset(buf + b, 0, align_up(b) - b);
    e = lh_file_out_write(o, buf, align_up(b));
  }
  if (!e) e = lh_file_out_commit(o);
  if (e && e != LH_ERR_NOMEM && strncmp(lh_last_error(), path, strlen(path))) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lh_last_error());
    e = lh_errorf(e, "%s: %s", path, msg);
  }
  lh_file_out_free(o);
  free(buf);
  free(h.kv);
  return e;
}
