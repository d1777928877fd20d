/* The verifiable sampler: parameters, the per-token uniform from Philox, scratch, and the
 * canonical choice (docs/ALGORITHMS.md, "Verifiable sampling"). O(V) without top-k/top-p; with
 * them, a heap selection or a bounded candidate set sorted by radix. Never allocates. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "sample_impl.h"

lh_sample_params lh_sample_defaults(void) {
  return (lh_sample_params){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f};
}

lh_err lh_sample_params_validate(const lh_sample_params *p) {
  if (!p) return lh_errorf(LH_ERR_INVAL, "sampling parameters: expected a pointer, found NULL");
  if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
    return lh_errorf(LH_ERR_INVAL,
                     "sampling parameter temperature: expected a finite number >= 0 (0 = greedy), "
                     "found %g",
                     (double)p->temperature);
  if (p->top_k < 0)
    return lh_errorf(LH_ERR_INVAL,
                     "sampling parameter top_k: expected an integer >= 0 (0 = off), found %d",
                     p->top_k);
  if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
    return lh_errorf(LH_ERR_INVAL,
                     "sampling parameter top_p: expected a number in (0, 1] (1 = off), found %g",
                     (double)p->top_p);
  if (!(p->min_p >= 0.0f && p->min_p < 1.0f))
    return lh_errorf(LH_ERR_INVAL,
                     "sampling parameter min_p: expected a number in [0, 1) (0 = off), found %g",
                     (double)p->min_p);
  return LH_ERR_OK;
}

double lh_sample_uniform(uint64_t seed, uint64_t seq, uint64_t pos) {
  uint32_t r[4];
  lh_philox(seed, seq, pos, r);
  uint64_t hi = r[0] >> 5, lo = r[1] >> 6; /* 27 + 26 bits */
  return (double)((hi << 26) | lo) * 0x1.0p-53;
}

lh_sample_scratch *lh_sample_scratch_create(int V) {
  if (V <= 0) return NULL;
  lh_sample_scratch *s = lh_xcalloc(1, sizeof *s);
  size_t n = (size_t)V;
  s->V = V;
  s->idbits = 1;
  while (s->idbits < 31 && ((int64_t)1 << s->idbits) < V)
    s->idbits++;
  s->clean = lh_xmalloc_aligned(n * sizeof *s->clean);
  s->w = lh_xmalloc_aligned(n * sizeof *s->w);
  s->blocks = lh_xmalloc_aligned((n / LH__SAMPLE_BLOCK + 1) * sizeof *s->blocks);
  s->heap = lh_xmalloc_aligned(n * sizeof *s->heap);
  s->keys = lh_xmalloc_aligned(n * sizeof *s->keys);
  s->tmp = lh_xmalloc_aligned(n * sizeof *s->tmp);
  s->flags = lh_xmalloc_aligned(n * sizeof *s->flags);
  return s;
}

void lh_sample_scratch_free(lh_sample_scratch *s) {
  if (!s) return;
  free(s->clean);
  free(s->w);
  free(s->blocks);
  free(s->heap);
  free(s->keys);
  free(s->tmp);
  free(s->flags);
  free(s);
}

/* ---- exp from IEEE additions and multiplications only ----
 * Both give the same bits on every machine (no libm, no fused multiply-add: the build is ISO C,
 * so the compiler does not contract) and vectorise. Arguments are <= 0. */

static const double exp2_64[64] = {
    /* 2^(j/64), correctly rounded */
    0x1.0000000000000p+0, 0x1.02c9a3e778061p+0, 0x1.059b0d3158574p+0, 0x1.0874518759bc8p+0,
    0x1.0b5586cf9890fp+0, 0x1.0e3ec32d3d1a2p+0, 0x1.11301d0125b51p+0, 0x1.1429aaea92de0p+0,
    0x1.172b83c7d517bp+0, 0x1.1a35beb6fcb75p+0, 0x1.1d4873168b9aap+0, 0x1.2063b88628cd6p+0,
    0x1.2387a6e756238p+0, 0x1.26b4565e27cddp+0, 0x1.29e9df51fdee1p+0, 0x1.2d285a6e4030bp+0,
    0x1.306fe0a31b715p+0, 0x1.33c08b26416ffp+0, 0x1.371a7373aa9cbp+0, 0x1.3a7db34e59ff7p+0,
    0x1.3dea64c123422p+0, 0x1.4160a21f72e2ap+0, 0x1.44e086061892dp+0, 0x1.486a2b5c13cd0p+0,
    0x1.4bfdad5362a27p+0, 0x1.4f9b2769d2ca7p+0, 0x1.5342b569d4f82p+0, 0x1.56f4736b527dap+0,
    0x1.5ab07dd485429p+0, 0x1.5e76f15ad2148p+0, 0x1.6247eb03a5585p+0, 0x1.6623882552225p+0,
    0x1.6a09e667f3bcdp+0, 0x1.6dfb23c651a2fp+0, 0x1.71f75e8ec5f74p+0, 0x1.75feb564267c9p+0,
    0x1.7a11473eb0187p+0, 0x1.7e2f336cf4e62p+0, 0x1.82589994cce13p+0, 0x1.868d99b4492edp+0,
    0x1.8ace5422aa0dbp+0, 0x1.8f1ae99157736p+0, 0x1.93737b0cdc5e5p+0, 0x1.97d829fde4e50p+0,
    0x1.9c49182a3f090p+0, 0x1.a0c667b5de565p+0, 0x1.a5503b23e255dp+0, 0x1.a9e6b5579fdbfp+0,
    0x1.ae89f995ad3adp+0, 0x1.b33a2b84f15fbp+0, 0x1.b7f76f2fb5e47p+0, 0x1.bcc1e904bc1d2p+0,
    0x1.c199bdd85529cp+0, 0x1.c67f12e57d14bp+0, 0x1.cb720dcef9069p+0, 0x1.d072d4a07897cp+0,
    0x1.d5818dcfba487p+0, 0x1.da9e603db3285p+0, 0x1.dfc97337b9b5fp+0, 0x1.e502ee78b3ff6p+0,
    0x1.ea4afa2a490dap+0, 0x1.efa1bee615a27p+0, 0x1.f50765b6e4540p+0, 0x1.fa7c1819e90d8p+0,
};

/* exp(x) = 2^k * 2^(j/64) * e^r with |r| <= ln2/128 and a degree-5 polynomial: within 2.3 ulp;
 * exp(0) = 1 exactly, and 0 below -708. */
static inline double det_exp(double x) {
  const double shift = 0x1.8p52; /* adding it rounds to an integer held in the low bits */
  double t = x * 0x1.71547652b82fep+6 + shift; /* x * 64/ln2 */
  double nd = t - shift;
  double r = (x - nd * 0x1.62e42fee00000p-7) - nd * 0x1.a39ef35793c76p-39;
  uint64_t tb;
  memcpy(&tb, &t, sizeof tb);
  uint64_t n = tb - 0x4338000000000000ull + 64u * 1023u; /* n + 64 * bias, >= 0 above -708 */
  double q = 1.0 / 120.0;
  q = q * r + 1.0 / 24.0;
  q = q * r + 1.0 / 6.0;
  q = q * r + 0.5;
  q = q * r + 1.0;
  q = q * r + 1.0;
  uint64_t sb = (n >> 6) << 52;
  double scale;
  memcpy(&scale, &sb, sizeof scale);
  double e = (exp2_64[n & 63] * q) * scale;
  return x < -708.0 ? 0.0 : e;
}

/* The float version, for the temperature-1 normaliser behind logprob_model: degree-7
 * polynomial on |r| <= ln2/2; 0 below -87. */
static inline float det_expf(float x) {
  const float shift = 0x1.8p23f;
  float t = x * 0x1.715476p+0f + shift;
  float kf = t - shift;
  float r = (x - kf * 0x1.62e400p-1f) - kf * 0x1.7f7d1cp-20f;
  uint32_t tb;
  memcpy(&tb, &t, sizeof tb);
  float q = 1.0f / 5040.0f;
  q = q * r + 1.0f / 720.0f;
  q = q * r + 1.0f / 120.0f;
  q = q * r + 1.0f / 24.0f;
  q = q * r + 1.0f / 6.0f;
  q = q * r + 0.5f;
  q = q * r + 1.0f;
  q = q * r + 1.0f;
  uint32_t sb = (tb - 0x4b400000u + 127u) << 23;
  float scale;
  memcpy(&scale, &sb, sizeof scale);
  float e = q * scale;
  return x < -87.0f ? 0.0f : e;
}

/* ---- steps shared with the checker ---- */

/* First id in [from, V) whose logit equals x, looking 16 at a time. */
static int32_t first_equal(const float *l, int V, int from, float x) {
  int i = from;
  for (; i + 16 <= V; i += 16) {
    int any = 0;
    for (int j = 0; j < 16; j++)
      any |= l[i + j] == x;
    if (any) break;
  }
  while (i < V - 1 && l[i] != x)
    i++;
  return i;
}

void lh__sample_scan(const float *logits, int V, lh_sample_scratch *s, lh__logits *g) {
  float mx[16];
  int bad = 0;
  for (int j = 0; j < 16; j++)
    mx[j] = -INFINITY;
  int V16 = V & ~(16 - 1);
  for (int i = 0; i < V16; i += 16)
    for (int j = 0; j < 16; j++) {
      float x = logits[i + j];
      bad |= !(x <= FLT_MAX); /* NaN or +inf */
      mx[j] = x > mx[j] ? x : mx[j];
    }
  for (int i = V16; i < V; i++) {
    float x = logits[i];
    bad |= !(x <= FLT_MAX);
    mx[0] = x > mx[0] ? x : mx[0];
  }
  float m = mx[0];
  for (int j = 1; j < 16; j++)
    m = mx[j] > m ? mx[j] : m;
  const float *l = logits;
  if (bad || m == -INFINITY) {
    float *c = s->clean;
    m = -INFINITY;
    for (int i = 0; i < V; i++) {
      float x = logits[i];
      if (isnan(x))
        x = -INFINITY;
      else if (x > FLT_MAX)
        x = FLT_MAX;
      c[i] = x;
      m = x > m ? x : m;
    }
    if (m == -INFINITY) { /* nothing finite: every token counts as logit 0 */
      for (int i = 0; i < V; i++)
        c[i] = 0.0f;
      m = 0.0f;
    }
    l = c;
  }
  g->l = l;
  g->lmax = m;
  g->argmax = first_equal(l, V, 0, m);
  g->S = g->S1 = 0.0;
}

double lh__sample_norm1(const lh__logits *g, int V) {
  enum { B = LH__SAMPLE_BLOCK };
  const float *l = g->l;
  float m = (float)g->lmax, e[B];
  double x[B], S1 = 0.0;
  for (int b0 = 0; b0 < V; b0 += B) {
    if (b0 + B <= V) {
      for (int o = 0; o < B; o++)
        e[o] = det_expf(l[b0 + o] - m);
    } else {
      for (int o = 0; o < B; o++)
        e[o] = b0 + o < V ? det_expf(l[b0 + o] - m) : 0.0f;
    }
    for (int o = 0; o < B; o++)
      x[o] = e[o];
    S1 += lh__tree64(x);
  }
  return S1;
}

void lh__sample_weights(lh__logits *g, int V, double T, double minp, lh_sample_scratch *s) {
  enum { B = LH__SAMPLE_BLOCK };
  const float *l = g->l;
  double m = g->lmax, inv = 1.0 / T, S = 0.0;
  double *w = s->w, *bs = s->blocks;
  double x[B];
  for (int b0 = 0; b0 < V; b0 += B) {
    double all, *wb = w + b0;
    if (b0 + B <= V) {
      for (int o = 0; o < B; o++)
        wb[o] = det_exp(((double)l[b0 + o] - m) * inv);
      all = lh__tree64(wb);
    } else { /* the last, short block counts as padded with zeros */
      for (int o = 0; o < B; o++)
        x[o] = b0 + o < V ? det_exp(((double)l[b0 + o] - m) * inv) : 0.0;
      for (int o = 0; b0 + o < V; o++)
        wb[o] = x[o];
      all = lh__tree64(x);
      wb = x;
    }
    S += all;
    if (minp > 0.0) {
      double y[B];
      for (int o = 0; o < B; o++)
        y[o] = wb[o] >= minp ? wb[o] : 0.0;
      bs[b0 / B] = lh__tree64(y);
    } else {
      bs[b0 / B] = all;
    }
  }
  g->S = S;
  g->S1 = T == 1.0 ? S : lh__sample_norm1(g, V);
}

float lh__sample_logit_floor(const lh__logits *g, double T, double t) {
  if (!(t > 0.0)) return -INFINITY;
  /* w >= t  <=>  l >= lmax + T log t; a little below it, so rounding never loses a token */
  return (float)(g->lmax + T * (log(t) - 1e-6) - 1e-6 * fabs(g->lmax));
}

/* a ranks below b: smaller logit, or the same logit and a larger id */
static inline bool ranks_below(const float *l, int32_t a, int32_t b) {
  return l[a] < l[b] || (l[a] == l[b] && a > b);
}

static void sift_down(const float *l, int32_t *h, int k, int i) {
  int32_t x = h[i];
  for (;;) {
    int c = 2 * i + 1;
    if (c >= k) break;
    if (c + 1 < k && ranks_below(l, h[c + 1], h[c])) c++;
    if (!ranks_below(l, h[c], x)) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = x;
}

void lh__sample_topk(const float *l, int V, int k, int32_t *heap) {
  for (int i = 0; i < k; i++)
    heap[i] = i;
  for (int i = k / 2 - 1; i >= 0; i--)
    sift_down(l, heap, k, i);
  /* ids arrive in ascending order, so a later id with the root's logit never displaces it */
  float root = l[heap[0]];
  int i = k;
  for (; i + 16 <= V; i += 16) {
    int any = 0; /* most chunks hold nothing above the k-th best: test 16 at once */
    for (int j = 0; j < 16; j++)
      any |= l[i + j] > root;
    if (!any) continue;
    for (int j = i; j < i + 16; j++)
      if (l[j] > root) {
        heap[0] = j;
        sift_down(l, heap, k, 0);
        root = l[heap[0]];
      }
  }
  for (; i < V; i++)
    if (l[i] > root) {
      heap[0] = i;
      sift_down(l, heap, k, 0);
      root = l[heap[0]];
    }
}

void lh__sample_sort(uint64_t *a, uint64_t *tmp, size_t n, int bits) {
  if (n <= 64) {
    for (size_t i = 1; i < n; i++) {
      uint64_t x = a[i];
      size_t j = i;
      while (j > 0 && a[j - 1] > x)
        a[j] = a[j - 1], j--;
      a[j] = x;
    }
    return;
  }
  /* LSD radix: 8-bit digits for short arrays (small histograms), 11-bit digits for long ones */
  int D = n < 4096 ? 8 : 11, nd = (bits + D - 1) / D, R = 1 << D;
  uint32_t cnt[6 * 2048];
  memset(cnt, 0, (size_t)nd * (size_t)R * sizeof cnt[0]);
  uint64_t mask = (uint64_t)R - 1;
  for (size_t i = 0; i < n; i++) {
    uint64_t x = a[i];
    for (int d = 0; d < nd; d++)
      cnt[d * R + ((x >> (D * d)) & mask)]++;
  }
  uint64_t *src = a, *dst = tmp;
  for (int d = 0; d < nd; d++) {
    uint32_t *c = cnt + d * R;
    if (c[(a[0] >> (D * d)) & mask] == n) continue; /* every key has this digit */
    uint32_t sum = 0;
    for (int v = 0; v < R; v++) {
      uint32_t t = c[v];
      c[v] = sum;
      sum += t;
    }
    for (size_t i = 0; i < n; i++) {
      uint64_t x = src[i];
      dst[c[(x >> (D * d)) & mask]++] = x;
    }
    uint64_t *t = src;
    src = dst;
    dst = t;
  }
  if (src != a) memcpy(a, src, n * sizeof *a);
}

/* ---- the sampler ---- */

/* The CDF walk over blocks: bs[0..nb) are block sums; block b holds the ids of ids[lo[b]..]
 * (or, with ids NULL, the ids 64b..64b+63). Returns the first id whose cumulative weight exceeds
 * u * total, or the last id with weight if rounding leaves none. */
typedef struct {
  const double *w;
  const uint64_t *ids; /* NULL: every id in [0, V) */
  const int32_t *lo;   /* with ids: start of each block's run in ids (nb + 1 entries) */
  int V;
  double minp;
} walk_src;

/* the block's weights (kept ones, at offsets <= upto) into x */
static void block_weights(const walk_src *src, int b, int upto, double *x) {
  enum { B = LH__SAMPLE_BLOCK };
  for (int o = 0; o < B; o++)
    x[o] = 0.0;
  if (!src->ids) {
    int b0 = b * B;
    for (int o = 0; o <= upto && b0 + o < src->V; o++) {
      double v = src->w[b0 + o];
      x[o] = v >= src->minp ? v : 0.0;
    }
  } else {
    for (int32_t j = src->lo[b]; j < src->lo[b + 1]; j++) {
      int o = (int)(src->ids[j] % B);
      if (o <= upto) x[o] = src->w[src->ids[j]];
    }
  }
}

static int32_t block_id(const walk_src *src, int b, int o) {
  if (!src->ids) return b * LH__SAMPLE_BLOCK + o;
  for (int32_t j = src->lo[b]; j < src->lo[b + 1]; j++)
    if ((int)(src->ids[j] % LH__SAMPLE_BLOCK) == o) return (int32_t)src->ids[j];
  return -1;
}

static int32_t walk(const walk_src *src, const double *bs, int nb, double u, double *total) {
  enum { B = LH__SAMPLE_BLOCK };
  double t = 0.0;
  for (int b = 0; b < nb; b++)
    t += bs[b];
  *total = t;
  double thr = u * t, P = 0.0, x[B];
  for (int b = 0; b < nb; b++) {
    if (!(P + bs[b] > thr)) {
      P += bs[b];
      continue;
    }
    int lo = 0, hi = B - 1; /* the first offset whose prefix crosses: the prefix grows with it */
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      block_weights(src, b, mid, x);
      if (P + lh__tree64(x) > thr)
        hi = mid;
      else
        lo = mid + 1;
    }
    return block_id(src, b, lo);
  }
  for (int b = nb - 1; b >= 0; b--) { /* u * total at or above the end: u >= 1 or NaN */
    block_weights(src, b, B - 1, x);
    for (int o = B - 1; o >= 0; o--)
      if (x[o] > 0.0) return block_id(src, b, o);
  }
  return 0;
}

/* Inverse CDF over all ids with w >= minp (block sums from lh__sample_weights). */
static int32_t walk_all(const double *w, int V, double minp, double u, const double *bs,
                        double *total) {
  walk_src src = {.w = w, .ids = NULL, .lo = NULL, .V = V, .minp = minp};
  return walk(&src, bs, (V + LH__SAMPLE_BLOCK - 1) / LH__SAMPLE_BLOCK, u, total);
}

/* The same over the ids[0..n) (ascending): the blocks they touch, in order. */
static int32_t walk_ids(const double *w, const uint64_t *ids, size_t n, double u,
                        lh_sample_scratch *s, double *total) {
  enum { B = LH__SAMPLE_BLOCK };
  int32_t *lo = s->heap; /* free again once the kept ids are known */
  double *bs = s->blocks, x[B];
  int nb = 0;
  for (size_t j = 0; j < n; j++)
    if (j == 0 || ids[j] / B != ids[j - 1] / B) lo[nb++] = (int32_t)j;
  lo[nb] = (int32_t)n;
  walk_src src = {.w = w, .ids = ids, .lo = lo, .V = 0, .minp = 0.0};
  for (int b = 0; b < nb; b++) {
    block_weights(&src, b, B - 1, x);
    bs[b] = lh__tree64(x);
  }
  return walk(&src, bs, nb, u, total);
}

/* Length of the top-p prefix of keys[0..n) (rank order), or 0 if it never reaches target. */
static size_t topp_prefix(const uint64_t *keys, size_t n, const double *w, double target, int ib) {
  double cum = 0.0;
  for (size_t q = 0; q < n; q++) {
    cum += w[lh__key_id(keys[q], ib)];
    if (cum >= target) return q + 1;
  }
  return 0;
}

size_t lh__sample_above(const float *l, int V, float fl, int32_t *ids) {
  size_t n = 0;
  int i = 0;
  for (; i + 16 <= V; i += 16) {
    int any = 0; /* most chunks hold none: test 16 at once */
    for (int j = 0; j < 16; j++)
      any |= l[i + j] >= fl;
    if (!any) continue;
    for (int j = i; j < i + 16; j++) { /* without branches: hits are unpredictable */
      ids[n] = j;
      n += l[j] >= fl;
    }
  }
  for (; i < V; i++)
    if (l[i] >= fl) ids[n++] = i;
  return n;
}

static inline int bucket_of(double w) {
  uint64_t bits;
  memcpy(&bits, &w, sizeof bits);
  int b = 1022 - (int)((bits >> 52) & 0x7ff);
  return b < 0 ? 0 : b > 63 ? 63 : b;
}

float lh__sample_narrow_floor(const lh__logits *g, double T, const double *w, const int32_t *ids,
                              size_t n, double target, int extra, float fl0) {
  double bucket[64] = {0}, cum = 0.0;
  for (size_t j = 0; j < n; j++)
    bucket[bucket_of(w[ids[j]])] += w[ids[j]];
  int b = 0;
  while (b < 63 && (cum += bucket[b]) < target)
    b++;
  b += extra;
  if (b >= 62) return fl0;
  float fl = lh__sample_logit_floor(g, T, ldexp(1.0, -(b + 1)));
  return fl > fl0 ? fl : fl0;
}

/* Top-p without top-k: the rank-ordered prefix of all ids that reaches target, in keys.
 * Tokens with w < t0 = (1 - top_p) S / (2V) hold less than (1 - top_p) S / 2 together, so the
 * ids above t0 always suffice; among them a power-of-two histogram of w narrows the set that
 * is sorted to about what the prefix needs. */
static size_t topp_alone(const lh__logits *g, int V, double T, double top_p, lh_sample_scratch *s) {
  const float *l = g->l;
  const double *w = s->w;
  int32_t *cand = s->heap;
  uint64_t *keys = s->keys;
  double target = top_p * g->S;
  int ib = s->idbits;
  float fl0 = lh__sample_logit_floor(g, T, (1.0 - top_p) * g->S / (2.0 * V));
  size_t nc = lh__sample_above(l, V, fl0, cand);
  float fl1 = lh__sample_narrow_floor(g, T, w, cand, nc, target, 0, fl0);
  for (int tries = 0;; tries++) {
    /* 0: the histogram's choice; 1: every candidate; 2: every id (rounding; never seen) */
    float fl = tries == 0 ? fl1 : fl0;
    size_t n = 0;
    if (tries < 2) {
      for (size_t j = 0; j < nc; j++)
        if (l[cand[j]] >= fl) keys[n++] = lh__rank_key(l[cand[j]], cand[j], ib);
    } else {
      for (int id = 0; id < V; id++)
        keys[n++] = lh__rank_key(l[id], id, ib);
    }
    lh__sample_sort(keys, s->tmp, n, 32 + ib);
    size_t m = topp_prefix(keys, n, w, target, ib);
    if (m) return m;
    if (tries == 2) return n;
  }
}

/* Fills s->keys with the ids of K in ascending order; returns |K|. */
static size_t kept_ids(const lh__logits *g, int V, const lh_sample_params *p, bool topk,
                       lh_sample_scratch *s) {
  const float *l = g->l;
  const double *w = s->w;
  uint64_t *keys = s->keys;
  bool topp = p->top_p < 1.0f;
  int ib = s->idbits;
  size_t n;
  if (topk) {
    int k = p->top_k;
    lh__sample_topk(l, V, k, s->heap);
    n = (size_t)k;
    if (topp) {
      for (int j = 0; j < k; j++)
        keys[j] = lh__rank_key(l[s->heap[j]], s->heap[j], ib);
      lh__sample_sort(keys, s->tmp, n, 32 + ib);
      size_t m = topp_prefix(keys, n, w, (double)p->top_p * g->S, ib);
      if (m) n = m;
    } else {
      for (int j = 0; j < k; j++)
        keys[j] = (uint64_t)s->heap[j];
    }
  } else {
    n = topp_alone(g, V, p->temperature, p->top_p, s);
  }
  if (topp)
    for (size_t j = 0; j < n; j++)
      keys[j] = (uint64_t)lh__key_id(keys[j], ib);
  if (p->min_p > 0.0f) {
    double minp = p->min_p;
    size_t m = 0;
    for (size_t j = 0; j < n; j++)
      if (w[keys[j]] >= minp) keys[m++] = keys[j];
    n = m;
  }
  lh__sample_sort(keys, s->tmp, n, ib);
  return n;
}

lh_sample_result lh_sample(const float *logits, int V, const lh_sample_params *p, double u,
                           lh_sample_scratch *s) {
  LH_CHECK(logits && p && s, "lh_sample: logits, params and scratch are required");
  LH_CHECK(V > 0 && V <= s->V, "lh_sample: V = %d, scratch was created for %d", V, s->V);
  LH_CHECK(lh_sample_params_validate(p) == LH_ERR_OK, "lh_sample: %s", lh_last_error());
  LH_CHECK(u >= 0.0 && u < 1.0, "lh_sample: u = %.17g, expected [0, 1) (lh_sample_uniform)", u);
  lh__logits g;
  lh__sample_scan(logits, V, s, &g);
  lh_sample_result r;
  if (p->temperature == 0.0f) {
    r.token = g.argmax;
    r.logprob = 0.0f;
    r.logprob_model = (float)-log(lh__sample_norm1(&g, V));
    return r;
  }
  double T = p->temperature;
  bool topk = p->top_k > 0 && p->top_k < V;
  bool topp = p->top_p < 1.0f;
  bool plain = !topk && !topp;
  lh__sample_weights(&g, V, T, plain ? p->min_p : 0.0, s);
  double total;
  if (plain) {
    r.token = walk_all(s->w, V, p->min_p, u, s->blocks, &total);
  } else {
    size_t n = kept_ids(&g, V, p, topk, s);
    r.token = walk_ids(s->w, s->keys, n, u, s, &total);
  }
  double d = (double)g.l[r.token] - g.lmax;
  r.logprob = (float)(d / T - log(total));
  r.logprob_model = (float)(d - log(g.S1));
  return r;
}
