/* longhaul patch: lossless bf16 policy patches (patch.h; the format byte by byte is in
 * docs/PROTOCOL.md, "Policy patches"). Each section (tensor) is coded on its own with an adaptive
 * binary range coder. Positions are coded as gaps within the subsequence of elements whose old
 * value has a given exponent (the exponent predicts how likely an update moves a value by a bf16
 * step), so the decoder does one table lookup per element and codes symbols only where a value
 * changed; the change is the step in the order-preserving integer image of bf16 (almost always
 * +-1), sign and magnitude with contexts per exponent. */
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
 * Binary, adaptive: a probability is P(bit = 0) in units of 2^-12, moved 1/32 of the way to the
 * bit seen. 32-bit range renormalised a byte at a time; the encoder carries into bytes already
 * written through a pending byte and a count of 0xFF bytes. */

#define PROB_BITS  12
#define PROB_ONE   (1u << PROB_BITS)
#define PROB_SHIFT 5
#define TOP        (1u << 24)

typedef uint16_t prob;

typedef struct enc {
  uint64_t (*count)[2]; /* when not NULL: count each context's bits, code nothing */
  const prob *base;     /* the model the contexts are counted in */
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

static void enc_bit(enc *e, prob *p, int bit) {
  if (e->count) {
    e->count[p - e->base][bit]++;
    return;
  }
  uint32_t bound = (e->range >> PROB_BITS) * *p;
  if (!bit) {
    e->range = bound;
    *p = (prob)(*p + ((PROB_ONE - *p) >> PROB_SHIFT));
  } else {
    e->low += bound;
    e->range -= bound;
    *p = (prob)(*p - (*p >> PROB_SHIFT));
  }
  while (e->range < TOP) {
    e->range <<= 8;
    enc_shift(e);
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
  d->range = 0xFFFFFFFFu;
  d->code = 0;
  for (int i = 0; i < 5; i++) /* the first byte is the encoder's initial cache: 0 */
    d->code = d->code << 8 | dec_byte(d);
}

static int dec_bit(dec *d, prob *p) {
  uint32_t bound = (d->range >> PROB_BITS) * *p;
  int bit;
  if (d->code < bound) {
    d->range = bound;
    *p = (prob)(*p + ((PROB_ONE - *p) >> PROB_SHIFT));
    bit = 0;
  } else {
    d->code -= bound;
    d->range -= bound;
    *p = (prob)(*p - (*p >> PROB_SHIFT));
    bit = 1;
  }
  while (d->range < TOP) {
    d->range <<= 8;
    d->code = d->code << 8 | dec_byte(d);
  }
  return bit;
}

/* ---------------------------------------------------------------- the model
 * A gap g >= 0 (unchanged elements of one exponent before the next change there) is coded as
 * x = g + 1: the bit length L of x in unary (L - 1 ones and a zero, no zero when L = 64), with
 * contexts per exponent and position, then the L - 1 bits of x below its leading one, MSB first,
 * with contexts per (L, position). A step d != 0 is its sign (context: exponent) and m = |d| coded
 * as m's bit length in unary (contexts per exponent and position) and its lower bits (contexts
 * per (length, position)). */

#define GAP_BITS  64
#define STEP_BITS 17 /* |d| <= 65535 */

typedef struct model {
  prob gap_len[N_BUCKETS][GAP_BITS];
  prob gap_bits[GAP_BITS][GAP_BITS];
  prob sign[N_BUCKETS];
  prob step_len[N_BUCKETS][STEP_BITS];
  prob step_bits[STEP_BITS][STEP_BITS];
} model;

static void model_init(model *m) {
  prob *p = (prob *)m;
  for (size_t i = 0; i < sizeof *m / sizeof *p; i++)
    p[i] = PROB_ONE / 2;
}

static int bit_length(uint64_t x) {
  return 64 - __builtin_clzll(x);
}

static void enc_gap(enc *e, model *m, int k, uint64_t g) {
  uint64_t x = g + 1; /* g < 2^63: the slab is at most that long */
  int L = bit_length(x);
  for (int j = 0; j < L - 1; j++)
    enc_bit(e, &m->gap_len[k][j], 1);
  if (L < GAP_BITS) enc_bit(e, &m->gap_len[k][L - 1], 0);
  for (int j = L - 2; j >= 0; j--)
    enc_bit(e, &m->gap_bits[L - 1][j], (int)(x >> j & 1));
}

__attribute__((noinline)) static void dec_gap(dec *d, model *m, int k, uint64_t *g) {
  int L = 1;
  while (L < GAP_BITS && dec_bit(d, &m->gap_len[k][L - 1]))
    L++;
  uint64_t x = 1;
  for (int j = L - 2; j >= 0; j--)
    x = x << 1 | (uint64_t)dec_bit(d, &m->gap_bits[L - 1][j]);
  *g = x - 1;
}

static void enc_step(enc *e, model *m, int k, int32_t step) {
  enc_bit(e, &m->sign[k], step < 0);
  uint32_t x = (uint32_t)(step < 0 ? -step : step); /* 1 .. 65535 */
  int L = bit_length(x);
  for (int j = 0; j < L - 1; j++)
    enc_bit(e, &m->step_len[k][j], 1);
  if (L < STEP_BITS) enc_bit(e, &m->step_len[k][L - 1], 0);
  for (int j = L - 2; j >= 0; j--)
    enc_bit(e, &m->step_bits[L - 1][j], (int)(x >> j & 1));
}

__attribute__((noinline)) static int32_t dec_step(dec *d, model *m, int k) {
  int neg = dec_bit(d, &m->sign[k]);
  int L = 1;
  while (L < STEP_BITS && dec_bit(d, &m->step_len[k][L - 1]))
    L++;
  uint32_t x = 1;
  for (int j = L - 2; j >= 0; j--)
    x = x << 1 | (uint32_t)dec_bit(d, &m->step_bits[L - 1][j]);
  return neg ? -(int32_t)x : (int32_t)x;
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
  uint64_t(*count)[2] = e->count;
  const prob *base = e->base;
  enc_init(e);
  e->count = count, e->base = base;
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

static lh_err undo_push(undo *u, uint64_t pos, uint16_t val) {
  if (u->n == u->cap) {
    uint64_t cap = u->cap ? 2 * u->cap : 4096;
    uint64_t *p = realloc(u->pos, (size_t)cap * sizeof *p);
    if (p) u->pos = p;
    uint16_t *v = p ? realloc(u->val, (size_t)cap * sizeof *v) : NULL;
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
    while (i < n && rem[i % LANES][bucket(s[i])]) {
      rem[i % LANES][bucket(s[i])]--;
      i++;
    }
    if (i == n) break;
    uint16_t old = s[i];
    int k = bucket(old);
    uint64_t *r = &rem[i % LANES][k];
    if (!seen[i % LANES][k]) {
      seen[i % LANES][k] = 1;
      dec_gap(&d, m, k, r);
      if (*r) {
        (*r)--;
        continue;
      }
    }
    /* a change here */
    if (got == want || d.overrun > 8)
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
    dec_gap(&d, m, k, r);
  }
  if (got != want)
    return lh_errorf(LH_ERR_FORMAT, "patch: section %d: %llu changes decoded, %llu declared", sec,
                     (unsigned long long)got, (unsigned long long)want);
  for (int k = 0; k < LANES * N_BUCKETS; k++)
    if (rem[k / N_BUCKETS][k % N_BUCKETS])
      return lh_errorf(LH_ERR_FORMAT, "patch: section %d: its gaps run past its %llu values", sec,
                       (unsigned long long)n);
  if (d.overrun > 4) /* the decoder reads up to 4 bytes past the last symbol's: the flush */
    return lh_errorf(LH_ERR_FORMAT, "patch: section %d is truncated", sec);
  return LH_ERR_OK;
}

lh_err lh_patch_apply(uint16_t *slab, uint64_t n, const uint8_t *patch, size_t len,
                      const uint8_t *parent_hash) {
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
  if (!e) {
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

double lh_patch_entropy_bits(const uint16_t *parent, const uint16_t *child, uint64_t n,
                             const lh_patch_section *sections, int n_sections) {
  if (check_sections(sections, n_sections, n, "patch")) return -1.0;
  model *m = lh_xmalloc(sizeof *m);
  size_t n_ctx = sizeof *m / sizeof(prob);
  uint64_t(*count)[2] = lh_xcalloc(n_ctx, sizeof *count);
  double bits = 0;
  for (int s = 0; s < n_sections; s++) {
    enc e = {0};
    e.count = count, e.base = (const prob *)m;
    memset(count, 0, n_ctx * sizeof *count);
    lh_err err = LH_ERR_OK;
    code_section(parent + sections[s].offset, child + sections[s].offset, sections[s].count, m, &e,
                 &err);
    for (size_t c = 0; c < n_ctx; c++) { /* each context's bits at their own frequencies */
      double z = (double)count[c][0], o = (double)count[c][1], t = z + o;
      if (z > 0 && o > 0) bits -= z * log2(z / t) + o * log2(o / t);
    }
  }
  free(count);
  free(m);
  return bits;
}
