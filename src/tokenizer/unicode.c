/* UTF-8 decoding and Unicode NFC for the tokenizer, over the generated tables in
 * unicode_tables.c. Decoding is strict (what Rust's str accepts); bytes that are not
 * well-formed UTF-8 pass through NFC unchanged, so normalising never loses input. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* Hangul syllable arithmetic (Unicode 3.12). */
#define S_BASE  0xAC00u
#define L_BASE  0x1100u
#define V_BASE  0x1161u
#define T_BASE  0x11A7u
#define L_COUNT 19u
#define V_COUNT 21u
#define T_COUNT 28u
#define N_COUNT (V_COUNT * T_COUNT)
#define S_COUNT (L_COUNT * N_COUNT)

size_t lh__tok_utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
  uint8_t b = s[0];
  if (b < 0x80) {
    *cp = b;
    return 1;
  }
  size_t len;
  uint32_t c, min;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2, c = b & 0x1Fu, min = 0x80;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3, c = b & 0x0Fu, min = 0x800;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4, c = b & 0x07u, min = 0x10000;
  } else {
    *cp = LH__TOK_RAW_BASE + b;
    return 1;
  }
  if (n < len) {
    *cp = LH__TOK_RAW_BASE + b;
    return 1;
  }
  for (size_t k = 1; k < len; k++) {
    if ((s[k] & 0xC0) != 0x80) {
      *cp = LH__TOK_RAW_BASE + b;
      return 1;
    }
    c = (c << 6) | (s[k] & 0x3Fu);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
    *cp = LH__TOK_RAW_BASE + b;
    return 1;
  }
  *cp = c;
  return len;
}

size_t lh__tok_utf8_put(uint32_t cp, uint8_t out[4]) {
  if (cp >= LH__TOK_RAW_BASE) {
    out[0] = (uint8_t)(cp - LH__TOK_RAW_BASE);
    return 1;
  }
  if (cp < 0x80) {
    out[0] = (uint8_t)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (uint8_t)(0xC0 | (cp >> 6));
    out[1] = (uint8_t)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (uint8_t)(0xE0 | (cp >> 12));
    out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (uint8_t)(0xF0 | (cp >> 18));
  out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (uint8_t)(0x80 | (cp & 0x3F));
  return 4;
}

static const lh__tok_decomp *find_decomp(uint32_t cp) {
  size_t lo = 0, hi = lh__tok_n_decomps;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (lh__tok_decomps[mid].cp < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < lh__tok_n_decomps && lh__tok_decomps[lo].cp == cp ? &lh__tok_decomps[lo] : NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
    return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
  if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE &&
      b < T_BASE + T_COUNT)
    return a + (b - T_BASE);
  size_t lo = 0, hi = lh__tok_n_comps;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const lh__tok_comp *c = &lh__tok_comps[mid];
    if (c->first < a || (c->first == a && c->second < b))
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < lh__tok_n_comps && lh__tok_comps[lo].first == a && lh__tok_comps[lo].second == b)
    return lh__tok_comps[lo].composite;
  return 0;
}

typedef struct cpbuf {
  uint32_t *p;
  size_t n, cap;
} cpbuf;

/* Ensures b can hold n code points (b->n is left as it is). */
static bool cp_reserve(cpbuf *b, size_t n) {
  if (n <= b->cap) return true;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < n)
    cap *= 2;
  uint32_t *p = realloc(b->p, cap * sizeof *p);
  if (!p) return false;
  b->p = p, b->cap = cap;
  return true;
}

static bool cp_push(cpbuf *b, uint32_t cp) {
  if (!cp_reserve(b, b->n + 1)) return false;
  b->p[b->n++] = cp;
  return true;
}

static bool put_bytes(char **out, size_t *cap, size_t *n, const void *src, size_t k) {
  if (*n + k + 1 > *cap) {
    size_t c = *cap ? *cap : 256;
    while (c < *n + k + 1)
      c *= 2;
    char *p = realloc(*out, c);
    if (!p) return false;
    *out = p, *cap = c;
  }
  memcpy(*out + *n, src, k);
  *n += k;
  return true;
}

/* Canonical decomposition of one code point appended to b. */
static bool decompose(uint32_t cp, cpbuf *b) {
  if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
    uint32_t s = cp - S_BASE;
    if (!cp_push(b, L_BASE + s / N_COUNT) || !cp_push(b, V_BASE + (s % N_COUNT) / T_COUNT))
      return false;
    return s % T_COUNT == 0 || cp_push(b, T_BASE + s % T_COUNT);
  }
  const lh__tok_decomp *d = (lh__tok_uprop_of(cp).flags & LH__TOK_DECOMP) ? find_decomp(cp) : NULL;
  if (!d) return cp_push(b, cp);
  for (int k = 0; k < d->len; k++)
    if (!cp_push(b, lh__tok_decomp_pool[d->off + k])) return false;
  return true;
}

/* Runs of non-starters up to this long are put in canonical order by insertion sort; longer
 * ones by counting sort on the combining class, so a run as long as the text (untrusted text
 * can make one) costs linear time, not quadratic. */
#define SHORT_RUN 32

/* Canonical ordering: a stable sort by ccc of each maximal run of non-starters in c[0..n).
 * tmp is scratch for long runs. Returns false when out of memory. */
static bool canonical_order(uint32_t *c, size_t n, cpbuf *tmp) {
  for (size_t i = 0; i < n;) {
    uint8_t cc = lh__tok_uprop_of(c[i]).ccc;
    if (cc == 0) {
      i++;
      continue;
    }
    size_t j = i + 1;
    bool sorted = true;
    for (uint8_t prev = cc; j < n && (cc = lh__tok_uprop_of(c[j]).ccc) != 0; j++) {
      sorted = sorted && prev <= cc;
      prev = cc;
    }
    if (sorted) {
      i = j;
      continue;
    }
    if (j - i <= SHORT_RUN) {
      for (size_t k = i + 1; k < j; k++) {
        uint32_t x = c[k];
        uint8_t xc = lh__tok_uprop_of(x).ccc;
        size_t m = k;
        for (; m > i && lh__tok_uprop_of(c[m - 1]).ccc > xc; m--)
          c[m] = c[m - 1];
        c[m] = x;
      }
    } else {
      size_t start[257] = {0}; /* start[k + 1]: how many have class k, then where class k goes */
      for (size_t k = i; k < j; k++)
        start[lh__tok_uprop_of(c[k]).ccc + 1]++;
      for (int k = 1; k <= 256; k++)
        start[k] += start[k - 1];
      if (!cp_reserve(tmp, j - i)) return false;
      for (size_t k = i; k < j; k++)
        tmp->p[start[lh__tok_uprop_of(c[k]).ccc]++] = c[k];
      memcpy(c + i, tmp->p, (j - i) * sizeof *c);
    }
    i = j;
  }
  return true;
}

/* NFC of the code points in b (decomposed in place, reordered, composed); b->n shrinks. tmp is
 * scratch. Returns false when out of memory. */
static bool reorder_and_compose(cpbuf *b, cpbuf *tmp) {
  uint32_t *c = b->p;
  size_t n = b->n;
  if (!canonical_order(c, n, tmp)) return false;
  if (n == 0) return true;
  size_t starter = 0, out = 1;
  int last_cc = lh__tok_uprop_of(c[0]).ccc;
  if (last_cc != 0) last_cc = 256; /* a leading non-starter blocks composition */
  for (size_t i = 1; i < n; i++) {
    uint32_t ch = c[i];
    int cc = lh__tok_uprop_of(ch).ccc;
    uint32_t comp = last_cc < 256 ? compose(c[starter], ch) : 0;
    if (comp && (last_cc < cc || last_cc == 0)) {
      c[starter] = comp;
      continue;
    }
    if (cc == 0) starter = out;
    last_cc = cc;
    c[out++] = ch;
  }
  b->n = out;
  return true;
}

bool lh__tok_nfc(const char *s, size_t n, char **out, size_t *cap, size_t *out_n) {
  const uint8_t *u = (const uint8_t *)s;
  cpbuf b = {0}, tmp = {0};
  size_t done = 0;        /* s[0..done) is already in *out */
  size_t prev = SIZE_MAX; /* start of the previous code point when it was inert */
  size_t i = 0;
  bool ok = true;
  *out_n = 0;
  while (i < n) {
    if (u[i] < 0x80) { /* ASCII is inert */
      prev = i++;
      continue;
    }
    uint32_t cp;
    size_t l = lh__tok_utf8_next(u + i, n - i, &cp);
    if (lh__tok_uprop_of(cp).flags & LH__TOK_INERT) {
      prev = i;
      i += l;
      continue;
    }
    /* A stretch of code points NFC may change, with the inert starter before it. */
    size_t seg = prev != SIZE_MAX ? prev : i;
    size_t j = i;
    b.n = 0;
    if (seg < i) {
      uint32_t first;
      lh__tok_utf8_next(u + seg, n - seg, &first);
      ok = ok && cp_push(&b, first);
    }
    while (ok && j < n) {
      size_t lj = lh__tok_utf8_next(u + j, n - j, &cp);
      if (lh__tok_uprop_of(cp).flags & LH__TOK_INERT) break;
      ok = decompose(cp, &b);
      j += lj;
    }
    if (!ok || !(ok = reorder_and_compose(&b, &tmp))) break;
    ok = put_bytes(out, cap, out_n, s + done, seg - done);
    for (size_t k = 0; ok && k < b.n; k++) {
      uint8_t enc[4];
      size_t el = lh__tok_utf8_put(b.p[k], enc);
      ok = put_bytes(out, cap, out_n, enc, el);
    }
    done = j;
    i = j;
    prev = SIZE_MAX;
  }
  ok = ok && put_bytes(out, cap, out_n, s + done, n - done);
  if (ok) (*out)[*out_n] = '\0';
  free(b.p);
  free(tmp.p);
  return ok;
}
