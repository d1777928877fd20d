/* longhaul patch: lossless bf16 policy patches (patch.h; the format byte by byte is in
 * docs/PROTOCOL.md, "Policy patches"). Each section (tensor) is coded on its own with an adaptive
 * multi-symbol range coder (about three symbols per changed value). Positions are coded as gaps
 * within the subsequence of elements whose old value has a given exponent (the exponent predicts
 * how likely an update moves a value by a bf16 step), so the decoder does one table lookup per
 * element and codes symbols only where a value changed; the change is the step in the
 * order-preserving integer image of bf16 (almost always +-1), one symbol with contexts per
 * exponent. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/patch.h"

#define MAGIC     "LHPA"
#define N_BUCKETS 256 /* the old value's exponent */
/* Element i belongs to lane i % LANES; each lane counts its own gaps per exponent, so that
 * consecutive elements of one exponent do not wait on one counter when decoding. */
#define LANES        4
#define CODING_NONE  0
#define CODING_RANGE 1

/* ---------------------------------------------------------------- the range coder
 * Multi-symbol, adaptive: a symbol s of an alphabet of n has frequency f[s] >= 1 out of a total
 * T = sum f <= 2^16; coding it narrows the range to r * f[s] at r * (f[0] + .. + f[s-1]) with
 * r = range / T (the decoder: one division, then a scan of the cumulative frequencies). Raw
 * bits (b <= 16 of them, equally likely) use r = range >> b. 32-bit range renormalised a byte at
 * a time; the encoder carries into bytes already written through a pending byte and a count of
 * 0xFF bytes. */

#define TOP       (1u << 24)
#define FREQ_INC  32
#define FREQ_MAX  (1u << 16)
#define RAW_CHUNK 16

typedef struct enc {
  uint64_t *count;      /* when not NULL: count each symbol of each table, code nothing */
  const uint16_t *base; /* the model the tables are counted in */
  uint64_t raw_bits;    /* counted raw bits */
  uint64_t low;
  uint32_t range;
  uint8_t cache;
  uint64_t pending; /* bytes waiting for a carry: the cache and pending - 1 0xFF bytes */
  uint8_t *buf;
  size_t len, cap;
} enc;

static void enc_byte(enc *e, uint8_t b) {
  if (e->len == e->cap) {
    e->cap = e->cap ? 2 * e->cap : 4096;
    e->buf = realloc(e->buf, e->cap);
    LH_CHECK(e->buf, "patch: out of memory for %zu bytes", e->cap);
  }
  e->buf[e->len++] = b;
}

static void enc_shift(enc *e) {
  if ((uint32_t)e->low < 0xFF000000u || (e->low >> 32) != 0) {
    uint8_t carry = (uint8_t)(e->low >> 32);
    uint8_t b = e->cache;
    do {
      enc_byte(e, (uint8_t)(b + carry));
      b = 0xFF;
    } while (--e->pending != 0);
    e->cache = (uint8_t)(e->low >> 24);
  }
  e->pending++;
  e->low = (e->low & 0x00FFFFFFu) << 8;
}

static void enc_init(enc *e) {
  memset(e, 0, sizeof *e);
  e->range = 0xFFFFFFFFu;
  e->pending = 1;
}

/* the interval [c, c + f) of r-sized units */
static void enc_put(enc *e, uint32_t r, uint32_t c, uint32_t f) {
  e->low += (uint64_t)r * c;
  e->range = r * f;
  while (e->range < TOP) {
    e->range <<= 8;
    enc_shift(e);
  }
}

/* After coding s: its frequency grows; all are halved (rounding up, so none reaches 0) when the
 * total would pass FREQ_MAX. */
static inline void adapt(uint16_t *f, int n, int s) {
  f[s] = (uint16_t)(f[s] + FREQ_INC);
  f[n] = (uint16_t)(f[n] + FREQ_INC); /* f[n] holds the total - 1 (<= 2^16 - 1) */
  if ((uint32_t)f[n] + 1 > FREQ_MAX - FREQ_INC) {
    uint32_t t = 0;
    for (int i = 0; i < n; i++)
      t += f[i] = (uint16_t)((f[i] + 1) >> 1);
    f[n] = (uint16_t)(t - 1);
  }
}

/* Codes symbol s of the adaptive table f (n symbols, then the total - 1 in f[n]). */
static void enc_sym(enc *e, uint16_t *f, int n, int s) {
  if (e->count) {
    e->count[f + s - e->base]++;
    return;
  }
  uint32_t c = 0;
  for (int i = 0; i < s; i++)
    c += f[i];
  enc_put(e, e->range / ((uint32_t)f[n] + 1), c, f[s]);
  adapt(f, n, s);
}

/* Codes the low b bits of v as raw bits, RAW_CHUNK at a time, the highest first. */
static void enc_raw(enc *e, uint64_t v, int b) {
  if (e->count) {
    e->raw_bits += (uint64_t)b;
    return;
  }
  while (b > 0) {
    int w = b > RAW_CHUNK ? RAW_CHUNK : b;
    b -= w;
    enc_put(e, e->range >> w, (uint32_t)(v >> b) & ((1u << w) - 1), 1);
  }
}

static void enc_finish(enc *e) {
  for (int i = 0; i < 5; i++)
    enc_shift(e);
}

typedef struct dec {
  uint32_t range, code;
  const uint8_t *p, *end;
  int overrun; /* bytes asked for past the end */
  int bad;     /* a code outside the range: not a stream an encoder wrote */
} dec;

static uint8_t dec_byte(dec *d) {
  if (d->p < d->end) return *d->p++;
  d->overrun++;
  return 0;
}

static void dec_init(dec *d, const uint8_t *buf, size_t len) {
  d->p = buf;
  d->end = buf + len;
  d->overrun = 0;
  d->bad = 0;
  d->range = 0xFFFFFFFFu;
  d->code = 0;
  for (int i = 0; i < 5; i++) /* the first byte is the encoder's initial cache: 0 */
    d->code = d->code << 8 | dec_byte(d);
}

static inline void dec_take(dec *d, uint32_t r, uint32_t c, uint32_t f) {
  d->code -= r * c;
  d->range = r * f;
  while (d->range < TOP) {
    d->range <<= 8;
    d->code = d->code << 8 | dec_byte(d);
  }
}

/* The value in [0, T) that code points at, in units of r = range / T (clamped, and the stream
 * marked bad, when a corrupted stream points past the end). */
static inline uint32_t dec_point(dec *d, uint32_t T, uint32_t *r) {
  *r = d->range / T;
  uint32_t v = d->code / *r;
  if (v >= T) {
    d->bad = 1;
    v = T - 1;
    d->code = *r * v; /* a valid state again: code < range */
  }
  return v;
}

/* One division per symbol: the symbol is the first whose interval ends past the code. */
static inline int dec_sym(dec *d, uint16_t *f, int n) {
  uint32_t r = d->range / ((uint32_t)f[n] + 1), c = 0;
  int s = 0;
  while (s < n - 1 && r * (c + f[s]) <= d->code)
    c += f[s++];
  if (r * (c + f[s]) <= d->code) { /* past the total: a corrupted stream */
    d->bad = 1;
    d->code = r * c;
  }
  dec_take(d, r, c, f[s]);
  adapt(f, n, s);
  return s;
}

static uint64_t dec_raw(dec *d, int b) {
  uint64_t v = 0;
  while (b > 0) {
    int w = b > RAW_CHUNK ? RAW_CHUNK : b;
    b -= w;
    uint32_t r, x = dec_point(d, 1u << w, &r);
    dec_take(d, r, x, 1);
    v = v << w | x;
  }
  return v;
}

/* ---------------------------------------------------------------- the model
 * A gap g >= 0 (unchanged elements of one exponent before the next change there) is coded as
 * x = g + 1: its bit length L (1..64) as symbol L - 1 of gap_len[exponent], then the bits of x
 * below its leading one: the top one of them (when L >= 2) as a symbol of gap_top[L] and the
 * rest raw. A step d != 0 is one symbol of step[exponent], 2c + (d < 0), where c is the class
 * of |d|: |d| - 1 for |d| <= 8, else 8 + (bit length of |d|) - 4, followed by the bits of |d|
 * below its leading one, raw. */

#define GAP_SYMS   64
#define TOP_BITS   1
#define STEP_EXACT 8
#define STEP_SYMS  (2 * (STEP_EXACT + 13)) /* sign x (8 exact magnitudes, 13 bit lengths) */

typedef struct model {
  uint16_t gap_len[N_BUCKETS][GAP_SYMS + 1];
  uint16_t gap_top[GAP_SYMS + 1][(1 << TOP_BITS) + 1];
  uint16_t step[N_BUCKETS][STEP_SYMS + 1];
} model;

static void table_init(uint16_t *f, int n) {
  for (int i = 0; i < n; i++)
    f[i] = 1;
  f[n] = (uint16_t)(n - 1);
}

static int top_bits(int L) {
  return L - 1 < TOP_BITS ? L - 1 : TOP_BITS;
}

static void model_init(model *m) {
  for (int k = 0; k < N_BUCKETS; k++) {
    table_init(m->gap_len[k], GAP_SYMS);
    table_init(m->step[k], STEP_SYMS);
  }
  for (int L = 1; L <= GAP_SYMS; L++)
    table_init(m->gap_top[L], 1 << top_bits(L));
}

static int bit_length(uint64_t x) {
  return 64 - __builtin_clzll(x);
}

static void enc_gap(enc *e, model *m, int k, uint64_t g) {
  uint64_t x = g + 1; /* g < 2^63: the slab is at most that long */
  int L = bit_length(x), t = top_bits(L), rest = L - 1 - t;
  enc_sym(e, m->gap_len[k], GAP_SYMS, L - 1);
  if (t) enc_sym(e, m->gap_top[L], 1 << t, (int)(x >> rest) & ((1 << t) - 1));
  enc_raw(e, x, rest);
}

static inline uint64_t dec_gap(dec *d, model *m, int k) {
  int L = dec_sym(d, m->gap_len[k], GAP_SYMS) + 1, t = top_bits(L), rest = L - 1 - t;
  uint64_t x = (uint64_t)1 << t;
  if (t) x |= (uint64_t)dec_sym(d, m->gap_top[L], 1 << t);
  if (rest) x = x << rest | dec_raw(d, rest);
  return x - 1;
}

/* The class of a step's magnitude a (1 .. 65535): a - 1 for a <= STEP_EXACT, else one class per
 * bit length L (4 .. 16) of a, whose L - 1 lower bits follow raw. */
static int step_class(uint32_t a) {
  return a <= STEP_EXACT ? (int)a - 1 : STEP_EXACT + bit_length(a) - 4;
}

static void enc_step(enc *e, model *m, int k, int32_t step) {
  uint32_t a = (uint32_t)(step < 0 ? -step : step);
  int c = step_class(a);
  enc_sym(e, m->step[k], STEP_SYMS, 2 * c + (step < 0));
  if (c >= STEP_EXACT) enc_raw(e, a, c - STEP_EXACT + 3);
}

static inline int32_t dec_step(dec *d, model *m, int k) {
  int s = dec_sym(d, m->step[k], STEP_SYMS), c = s >> 1;
  int32_t a = c + 1;
  if (c >= STEP_EXACT) {
    int low = c - STEP_EXACT + 3; /* the bits below the leading one */
    a = (int32_t)((1u << low) | (uint32_t)dec_raw(d, low));
    if (a <= STEP_EXACT) d->bad = 1; /* not how an encoder codes it */
  }
  return s & 1 ? -a : a;
}

static int bucket(uint16_t b) {
  return (b >> 7) & 0xFF;
}

/* ---------------------------------------------------------------- sections */

int lh_patch_sections(const lh_config *c, lh_patch_section *out, int cap) {
  int n = lh_model_tensors(c, NULL, 0);
  if (!out) return n;
  lh_tensor_info *info = lh_xcalloc((size_t)n, sizeof *info);
  lh_model_tensors(c, info, n);
  /* the slab is the tensors end to end in this order: each section starts where the last ended */
  for (int i = 0; i < n && i < cap; i++)
    out[i] = (lh_patch_section){info[i].offset, info[i].numel};
  free(info);
  return n;
}

static lh_err check_sections(const lh_patch_section *s, int n_sections, uint64_t n,
                             const char *what) {
  if (n_sections < 1 || n_sections > LH_PATCH_MAX_SECTIONS)
    return lh_errorf(LH_ERR_LIMIT, "%s: %d sections, expected 1..%d", what, n_sections,
                     LH_PATCH_MAX_SECTIONS);
  uint64_t at = 0;
  for (int i = 0; i < n_sections; i++) {
    if (s[i].offset != at || s[i].count > n - at)
      return lh_errorf(LH_ERR_FORMAT,
                       "%s: section %d covers [%llu, +%llu), expected to start at %llu within "
                       "the %llu values",
                       what, i, (unsigned long long)s[i].offset, (unsigned long long)s[i].count,
                       (unsigned long long)at, (unsigned long long)n);
    at += s[i].count;
  }
  if (at != n)
    return lh_errorf(LH_ERR_FORMAT, "%s: the sections cover %llu of %llu values", what,
                     (unsigned long long)at, (unsigned long long)n);
  return LH_ERR_OK;
}

void lh_patch_slab_hash(const uint16_t *slab, uint64_t n, uint8_t out[LH_HASH_BYTES]) {
  /* x86-64 is little-endian: the slab's bytes are the format's bytes */
  lh_hash256(slab, (size_t)n * sizeof *slab, out);
}

/* ---------------------------------------------------------------- make */

/* Codes one section of n values; returns the number of changes. */
static uint64_t code_section(const uint16_t *p, const uint16_t *c, uint64_t n, model *m, enc *e,
                             lh_err *err) {
  uint64_t changed = 0;
  for (uint64_t i = 0; i < n; i++)
    changed += p[i] != c[i];
  if (changed == 0) return 0;
  /* after[j]: unchanged elements of change j's lane and exponent between it and the next change
   * there (or the end); first[l][k]: those before the first change of lane l, exponent k */
  uint64_t *after = malloc((size_t)changed * sizeof *after), first[LANES][N_BUCKETS];
  if (!after) {
    *err = lh_errorf(LH_ERR_NOMEM, "patch: cannot allocate %llu gaps", (unsigned long long)changed);
    return 0;
  }
  memset(first, 0, sizeof first);
  uint64_t j = changed;
  for (uint64_t i = n; i-- > 0;) {
    uint64_t *f = &first[i % LANES][bucket(p[i])];
    if (p[i] != c[i])
      after[--j] = *f, *f = 0;
    else
      (*f)++;
  }
  model_init(m);
  uint64_t *count = e->count, raw = e->raw_bits;
  const uint16_t *base = e->base;
  enc_init(e);
  e->count = count, e->base = base, e->raw_bits = raw;
  uint8_t seen[LANES][N_BUCKETS];
  memset(seen, 0, sizeof seen);
  for (uint64_t i = 0; i < n; i++) {
    int k = bucket(p[i]), l = (int)(i % LANES);
    if (!seen[l][k]) {
      enc_gap(e, m, k, first[l][k]);
      seen[l][k] = 1;
    }
    if (p[i] != c[i]) {
      int32_t step = (int32_t)lh_bf16_key(c[i]) - (int32_t)lh_bf16_key(p[i]);
      enc_step(e, m, k, step);
      enc_gap(e, m, k, after[j++]);
    }
  }
  if (!e->count) enc_finish(e);
  free(after);
  return changed;
}

lh_err lh_patch_make(const uint16_t *parent, const uint16_t *child, uint64_t n,
                     const lh_patch_section *sections, int n_sections, int64_t from_version,
                     int64_t to_version, uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  lh_err e = check_sections(sections, n_sections, n, "patch");
  if (e) return e;
  size_t head = LH_PATCH_HEADER + (size_t)n_sections * LH_PATCH_SECTION;
  uint8_t *buf = calloc(1, head);
  if (!buf) return lh_errorf(LH_ERR_NOMEM, "patch: cannot allocate %zu bytes", head);
  size_t cap = head, used = head;
  memcpy(buf, MAGIC, 4);
  lh_put_le16(buf + 4, LH_PATCH_FORMAT);
  lh_put_le32(buf + 8, (uint32_t)n_sections);
  lh_put_le64(buf + 16, n);
  lh_put_le64(buf + 24, (uint64_t)from_version);
  lh_put_le64(buf + 32, (uint64_t)to_version);
  lh_patch_slab_hash(parent, n, buf + 40);
  lh_patch_slab_hash(child, n, buf + 72);
  model *m = lh_xmalloc(sizeof *m);
  for (int s = 0; s < n_sections && !e; s++) {
    enc en = {0};
    uint64_t off = sections[s].offset, cnt = sections[s].count;
    uint64_t changed = code_section(parent + off, child + off, cnt, m, &en, &e);
    if (e) break;
    uint8_t *t = buf + LH_PATCH_HEADER + (size_t)s * LH_PATCH_SECTION;
    lh_put_le64(t, off);
    lh_put_le64(t + 8, cnt);
    lh_put_le64(t + 16, changed);
    lh_put_le64(t + 24, changed ? en.len : 0);
    t[32] = changed ? CODING_RANGE : CODING_NONE;
    if (changed) {
      if (used + en.len > cap) {
        size_t grown = cap * 2 > used + en.len ? cap * 2 : used + en.len;
        uint8_t *b2 = realloc(buf, grown);
        if (!b2) {
          free(en.buf);
          e = lh_errorf(LH_ERR_NOMEM, "patch: cannot allocate %zu bytes", grown);
          break;
        }
        buf = b2, cap = grown;
      }
      memcpy(buf + used, en.buf, en.len);
      used += en.len;
    }
    free(en.buf);
  }
  free(m);
  if (e) {
    free(buf);
    return e;
  }
  *out = buf;
  *len = used;
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- read */

void lh_patch_info_free(lh_patch_info *info) {
  if (!info) return;
  free(info->offset);
  free(info->count);
  free(info->changed);
  free(info->bytes);
  free(info->coding);
  memset(info, 0, sizeof *info);
}

lh_err lh_patch_read_info(const uint8_t *b, size_t len, lh_patch_info *info) {
  memset(info, 0, sizeof *info);
  if (len < LH_PATCH_HEADER)
    return lh_errorf(LH_ERR_FORMAT, "patch: %zu bytes, shorter than the %d-byte header", len,
                     LH_PATCH_HEADER);
  if (memcmp(b, MAGIC, 4) != 0)
    return lh_errorf(LH_ERR_FORMAT, "patch: not a policy patch (magic bytes are not \"LHPA\")");
  unsigned version = lh_get_le16(b + 4), flags = lh_get_le16(b + 6);
  if (version != LH_PATCH_FORMAT)
    return lh_errorf(LH_ERR_UNSUPPORTED, "patch: format %u, this longhaul reads %d", version,
                     LH_PATCH_FORMAT);
  if (flags || lh_get_le32(b + 12))
    return lh_errorf(LH_ERR_UNSUPPORTED, "patch: unknown flags 0x%x or reserved word set", flags);
  for (int i = 104; i < LH_PATCH_HEADER; i++)
    if (b[i]) return lh_errorf(LH_ERR_FORMAT, "patch: reserved header byte %d is not 0", i);
  uint32_t S = lh_get_le32(b + 8);
  if (S < 1 || S > LH_PATCH_MAX_SECTIONS)
    return lh_errorf(LH_ERR_LIMIT, "patch: %u sections, expected 1..%d", S, LH_PATCH_MAX_SECTIONS);
  size_t head = LH_PATCH_HEADER + (size_t)S * LH_PATCH_SECTION;
  if (len < head)
    return lh_errorf(LH_ERR_FORMAT, "patch: %zu bytes, shorter than its %u section entries", len,
                     S);
  info->n_elements = lh_get_le64(b + 16);
  info->from_version = (int64_t)lh_get_le64(b + 24);
  info->to_version = (int64_t)lh_get_le64(b + 32);
  memcpy(info->parent_hash, b + 40, LH_HASH_BYTES);
  memcpy(info->child_hash, b + 72, LH_HASH_BYTES);
  info->n_sections = (int)S;
  info->offset = lh_xcalloc(S, sizeof *info->offset);
  info->count = lh_xcalloc(S, sizeof *info->count);
  info->changed = lh_xcalloc(S, sizeof *info->changed);
  info->bytes = lh_xcalloc(S, sizeof *info->bytes);
  info->coding = lh_xcalloc(S, 1);
  uint64_t at = 0, payload = 0;
  lh_err e = LH_ERR_OK;
  for (uint32_t s = 0; s < S && !e; s++) {
    const uint8_t *t = b + LH_PATCH_HEADER + (size_t)s * LH_PATCH_SECTION;
    info->offset[s] = lh_get_le64(t);
    info->count[s] = lh_get_le64(t + 8);
    info->changed[s] = lh_get_le64(t + 16);
    info->bytes[s] = lh_get_le64(t + 24);
    info->coding[s] = t[32];
    for (int r = 33; r < LH_PATCH_SECTION && !e; r++)
      if (t[r]) e = lh_errorf(LH_ERR_FORMAT, "patch: section %u: reserved byte %d is not 0", s, r);
    if (e) break;
    if (info->offset[s] != at || info->count[s] > info->n_elements - at)
      e = lh_errorf(LH_ERR_FORMAT,
                    "patch: section %u starts at %llu, expected %llu, or runs past "
                    "the %llu values",
                    s, (unsigned long long)info->offset[s], (unsigned long long)at,
                    (unsigned long long)info->n_elements);
    else if (info->changed[s] > info->count[s])
      e = lh_errorf(LH_ERR_FORMAT, "patch: section %u: %llu changes in %llu values", s,
                    (unsigned long long)info->changed[s], (unsigned long long)info->count[s]);
    else if (info->coding[s] > CODING_RANGE ||
             (info->coding[s] == CODING_NONE) != (info->changed[s] == 0) ||
             (info->coding[s] == CODING_NONE && info->bytes[s] != 0))
      e = lh_errorf(LH_ERR_FORMAT, "patch: section %u: coding %u with %llu changes and %llu bytes",
                    s, info->coding[s], (unsigned long long)info->changed[s],
                    (unsigned long long)info->bytes[s]);
    else if (info->bytes[s] > len - head - payload)
      e = lh_errorf(LH_ERR_FORMAT, "patch: section %u: %llu coded bytes, past the end of the patch",
                    s, (unsigned long long)info->bytes[s]);
    if (e) break;
    at += info->count[s];
    payload += info->bytes[s];
    info->total_changed += info->changed[s];
  }
  if (!e && at != info->n_elements)
    e = lh_errorf(LH_ERR_FORMAT, "patch: the sections cover %llu of %llu values",
                  (unsigned long long)at, (unsigned long long)info->n_elements);
  if (!e && head + payload != len)
    e = lh_errorf(LH_ERR_FORMAT, "patch: %zu bytes, but its header and sections account for %llu",
                  len, (unsigned long long)(head + payload));
  if (e) lh_patch_info_free(info);
  return e;
}

/* ---------------------------------------------------------------- apply */

/* The old values of the changes made so far, grown as changes are decoded: what a patch
 * declares is not allocated before its stream shows it. */
typedef struct undo {
  uint64_t *pos;
  uint16_t *val;
  uint64_t n, cap;
} undo;

/* A buffer of bytes, grown from used bytes: from 2 MiB on in huge pages where the kernel gives
 * them (one page fault per 2 MiB instead of per 4 KiB: a fresh undo record is touched once). */
static void *grow(void *old, size_t used, size_t bytes) {
  if (bytes < ((size_t)2 << 20)) return realloc(old, bytes);
  void *p = lh_try_malloc_huge(bytes, "patch: an undo record");
  if (!p) return NULL;
  memcpy(p, old, used);
  free(old);
  return p;
}

static lh_err undo_push(undo *u, uint64_t pos, uint16_t val) {
  if (u->n == u->cap) {
    uint64_t cap = u->cap ? 2 * u->cap : 4096;
    uint64_t *p = grow(u->pos, (size_t)u->n * sizeof *p, (size_t)cap * sizeof *p);
    if (p) u->pos = p;
    uint16_t *v = p ? grow(u->val, (size_t)u->n * sizeof *v, (size_t)cap * sizeof *v) : NULL;
    if (v) u->val = v;
    if (!p || !v)
      return lh_errorf(LH_ERR_NOMEM, "patch: cannot allocate the undo record of %llu changes",
                       (unsigned long long)cap);
    u->cap = cap;
  }
  u->pos[u->n] = pos;
  u->val[u->n++] = val;
  return LH_ERR_OK;
}

/* Decodes one section into s (n values, in place), recording each change's position and old
 * value; returns an error naming the section on a bad stream. */
__attribute__((noinline)) static lh_err decode_section(uint16_t *s, uint64_t n, uint64_t base,
                                                       const uint8_t *buf, size_t len,
                                                       uint64_t want, model *m, undo *u, int sec) {
  dec d;
  dec_init(&d, buf, len);
  model_init(m);
  uint64_t rem[LANES][N_BUCKETS];
  uint8_t seen[LANES][N_BUCKETS];
  memset(rem, 0, sizeof rem);
  memset(seen, 0, sizeof seen);
  uint64_t got = 0;
  for (uint64_t i = 0; i < n; i++) {
    /* the hot loop: values whose lane and exponent have their next change further on, four at
     * a time (one per lane) while none of the four changes */
    if (i % LANES == 0)
      while (i + LANES <= n) {
        uint64_t *r0 = &rem[0][bucket(s[i])], *r1 = &rem[1][bucket(s[i + 1])],
                 *r2 = &rem[2][bucket(s[i + 2])], *r3 = &rem[3][bucket(s[i + 3])];
        if (!*r0 || !*r1 || !*r2 || !*r3) break;
        (*r0)--, (*r1)--, (*r2)--, (*r3)--;
        i += LANES;
      }
    if (i == n) break;
    uint16_t old = s[i];
    int k = bucket(old);
    uint64_t *r = &rem[i % LANES][k];
    if (*r) { /* one at a time up to the next multiple of four, or the change among them */
      (*r)--;
      continue;
    }
    if (!seen[i % LANES][k]) {
      seen[i % LANES][k] = 1;
      *r = dec_gap(&d, m, k);
      if (*r) {
        (*r)--;
        continue;
      }
    }
    /* a change here */
    if (got == want || d.overrun > 8 || d.bad)
      return lh_errorf(LH_ERR_FORMAT, "patch: section %d: more changes than the %llu it declares",
                       sec, (unsigned long long)want);
    int32_t key = (int32_t)lh_bf16_key(old) + dec_step(&d, m, k);
    if (key < 0 || key > 0xFFFF)
      return lh_errorf(LH_ERR_FORMAT, "patch: section %d: value %llu steps outside bf16", sec,
                       (unsigned long long)i);
    lh_err ue = undo_push(u, base + i, old);
    if (ue) return ue;
    s[i] = lh_bf16_from_key((uint16_t)key);
    got++;
    *r = dec_gap(&d, m, k);
  }
  if (got != want)
    return lh_errorf(LH_ERR_FORMAT, "patch: section %d: %llu changes decoded, %llu declared", sec,
                     (unsigned long long)got, (unsigned long long)want);
  for (int k = 0; k < LANES * N_BUCKETS; k++)
    if (rem[k / N_BUCKETS][k % N_BUCKETS])
      return lh_errorf(LH_ERR_FORMAT, "patch: section %d: its gaps run past its %llu values", sec,
                       (unsigned long long)n);
  if (d.bad) return lh_errorf(LH_ERR_FORMAT, "patch: section %d: a corrupted stream", sec);
  if (d.overrun > 4) /* the decoder reads up to 4 bytes past the last symbol's: the flush */
    return lh_errorf(LH_ERR_FORMAT, "patch: section %d is truncated", sec);
  return LH_ERR_OK;
}

/* Applies the patch; checks the hashes unless unchecked (the benchmark's decode alone). */
static lh_err apply(uint16_t *slab, uint64_t n, const uint8_t *patch, size_t len,
                    const uint8_t *parent_hash, int unchecked) {
  lh_patch_info info;
  lh_err e = lh_patch_read_info(patch, len, &info);
  if (e) return e;
  uint8_t h[LH_HASH_BYTES];
  char want[2 * LH_HASH_BYTES + 1], got[2 * LH_HASH_BYTES + 1];
  undo u = {0};
  model *m = NULL;
  if (info.n_elements != n) {
    e = lh_errorf(LH_ERR_MISMATCH, "patch: for a policy of %llu values, this one has %llu",
                  (unsigned long long)info.n_elements, (unsigned long long)n);
    goto out;
  }
  if (parent_hash)
    memcpy(h, parent_hash, sizeof h);
  else if (unchecked)
    memcpy(h, info.parent_hash, sizeof h);
  else
    lh_patch_slab_hash(slab, n, h);
  if (memcmp(h, info.parent_hash, LH_HASH_BYTES) != 0) {
    lh_hash_hex(info.parent_hash, want);
    lh_hash_hex(h, got);
    e = lh_errorf(LH_ERR_MISMATCH,
                  "patch: made from version %lld (BLAKE2b %.16s...), but these weights hash to "
                  "%.16s...",
                  (long long)info.from_version, want, got);
    goto out;
  }
  if (!(m = malloc(sizeof *m))) {
    e = lh_errorf(LH_ERR_NOMEM, "patch: cannot allocate the decoder's model");
    goto out;
  }
  size_t at = LH_PATCH_HEADER + (size_t)info.n_sections * LH_PATCH_SECTION;
  for (int s = 0; s < info.n_sections && !e; s++) {
    if (info.coding[s] == CODING_RANGE)
      e = decode_section(slab + info.offset[s], info.count[s], info.offset[s], patch + at,
                         (size_t)info.bytes[s], info.changed[s], m, &u, s);
    at += (size_t)info.bytes[s];
  }
  if (!e && !unchecked) {
    lh_patch_slab_hash(slab, n, h);
    if (memcmp(h, info.child_hash, LH_HASH_BYTES) != 0) {
      lh_hash_hex(info.child_hash, want);
      lh_hash_hex(h, got);
      e = lh_errorf(LH_ERR_MISMATCH,
                    "patch: the result hashes to %.16s..., not to version %lld's %.16s... (a "
                    "corrupted patch)",
                    got, (long long)info.to_version, want);
    }
  }
  if (e) /* the weights as they were */
    for (uint64_t i = u.n; i-- > 0;)
      slab[u.pos[i]] = u.val[i];
out:
  free(u.pos);
  free(u.val);
  free(m);
  lh_patch_info_free(&info);
  return e;
}

lh_err lh_patch_apply(uint16_t *slab, uint64_t n, const uint8_t *patch, size_t len,
                      const uint8_t *parent_hash) {
  return apply(slab, n, patch, len, parent_hash, 0);
}

lh_err lh_patch_decode_unchecked(uint16_t *slab, uint64_t n, const uint8_t *patch, size_t len) {
  return apply(slab, n, patch, len, NULL, 1);
}

/* The static entropy of the symbols counted for table f (n symbols) of the model at base. */
static double table_bits(const uint64_t *count, const uint16_t *base, const uint16_t *f, int n) {
  const uint64_t *c = count + (f - base);
  double t = 0, bits = 0;
  for (int s = 0; s < n; s++)
    t += (double)c[s];
  for (int s = 0; s < n; s++)
    if (c[s]) bits -= (double)c[s] * log2((double)c[s] / t);
  return bits;
}

double lh_patch_entropy_bits(const uint16_t *parent, const uint16_t *child, uint64_t n,
                             const lh_patch_section *sections, int n_sections) {
  if (check_sections(sections, n_sections, n, "patch")) return -1.0;
  model *m = lh_xmalloc(sizeof *m);
  const uint16_t *base = (const uint16_t *)m;
  size_t n_slots = sizeof *m / sizeof *base;
  uint64_t *count = lh_xcalloc(n_slots, sizeof *count);
  double bits = 0;
  for (int s = 0; s < n_sections; s++) {
    enc e = {0};
    e.count = count, e.base = base;
    memset(count, 0, n_slots * sizeof *count);
    lh_err err = LH_ERR_OK;
    code_section(parent + sections[s].offset, child + sections[s].offset, sections[s].count, m, &e,
                 &err);
    /* each table's symbols at their own frequencies in this section; raw bits at 1 bit */
    bits += (double)e.raw_bits;
    for (int k = 0; k < N_BUCKETS; k++)
      bits += table_bits(count, base, m->gap_len[k], GAP_SYMS) +
              table_bits(count, base, m->step[k], STEP_SYMS);
    for (int L = 2; L <= GAP_SYMS; L++)
      bits += table_bits(count, base, m->gap_top[L], 1 << top_bits(L));
  }
  free(count);
  free(m);
  return bits;
}
