/* Internal to src/sample: the scratch layout and the steps that the sampler (sample.c) and the
 * checker (check.c) share, so that both compute the canonical kept set and CDF with the same
 * floating-point operations in the same order (docs/ALGORITHMS.md, "Verifiable sampling"). */
#ifndef LONGHAUL_SAMPLE_IMPL_H
#define LONGHAUL_SAMPLE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "longhaul/sample.h"

/* Results must not depend on the compiler: no fused multiply-add contraction (gcc does not
 * contract in ISO C mode; clang does unless told). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Sums of weights are formed per block of 64 ids by one fixed tree of additions (tree64), and
 * block totals are added in block order. The CDF before and after id i is the sum of the earlier
 * blocks plus tree64 of i's block with the entries after (or from) i set to zero, so it never
 * decreases, and the last id of a block ends exactly where the next block starts. */
#define LH__SAMPLE_BLOCK 64

/* Per-token flags of the checker. */
#define LH__IN   1u /* in the canonical kept set K */
#define LH__POSS 2u /* possibly in K on a machine whose logits differ by less than tol */
#define LH__SURE 4u /* surely in K on such a machine */
#define LH__SEEN 8u /* visited by the top-p scan */

struct lh_sample_scratch {
  int V;          /* capacity: the largest vocabulary this scratch serves */
  int idbits;     /* bits that hold any id < V in a sort key */
  float *clean;   /* (V) logits with NaN -> -inf and +inf -> FLT_MAX, when the input has them */
  double *w;      /* (V) w_i = exp((l_i - l_max) / T) */
  double *blocks; /* (V / LH__SAMPLE_BLOCK + 1) per-block sums of the kept w */
  int32_t *heap;  /* (V) top-k selection: ids, the k-th best at [0] */
  uint64_t *keys; /* (V) sort keys: rank keys (logit desc, id asc) or plain ids */
  uint64_t *tmp;  /* (V) radix-sort buffer; per-candidate results in the checker */
  uint8_t *flags; /* (V) checker: LH__IN | LH__POSS | LH__SURE | LH__SEEN */
};

/* What one pass over the logits learns. */
typedef struct lh__logits {
  const float *l; /* (V) the logits as used: the input, or the sanitised copy in scratch */
  double lmax;    /* largest logit */
  int32_t argmax; /* lowest id holding lmax */
  double S;       /* sum of w over all ids, by blocks */
  double S1;      /* sum of exp(l_i - lmax) over all ids (temperature 1), in float terms */
} lh__logits;

/* Sanitises (into s->clean if needed) and finds lmax and argmax. */
void lh__sample_scan(const float *logits, int V, lh_sample_scratch *s, lh__logits *g);
/* Fills s->w, g->S and g->S1, and s->blocks with the block sums of the w >= minp. T > 0. */
void lh__sample_weights(lh__logits *g, int V, double T, double minp, lh_sample_scratch *s);
/* sum of exp(l_i - lmax) over all ids */
double lh__sample_norm1(const lh__logits *g, int V);
/* A logit at or a little below the one whose w is t (-inf for t <= 0). */
float lh__sample_logit_floor(const lh__logits *g, double T, double t);
/* The ids whose logit is >= fl, ascending; returns how many. */
size_t lh__sample_above(const float *l, int V, float fl, int32_t *ids);
/* A logit floor keeping the fewest power-of-two buckets of w (among ids) whose mass reaches
 * target, and `extra` buckets more; never below fl0. */
float lh__sample_narrow_floor(const lh__logits *g, double T, const double *w, const int32_t *ids,
                              size_t n, double target, int extra, float fl0);
/* Selects the k best ids by (logit desc, id asc) into heap[0..k); heap[0] is the k-th best.
 * 0 < k < V. */
void lh__sample_topk(const float *l, int V, int k, int32_t *heap);
/* Sorts a ascending by its low `bits` bits (higher bits must be 0; radix sort; tmp holds n). */
void lh__sample_sort(uint64_t *a, uint64_t *tmp, size_t n, int bits);

/* The fixed tree over one block: eight lanes j add x[j], x[8+j], ..., x[56+j] pairwise, then
 * the lanes are added pairwise. */
static inline double lh__tree64(const double *x) {
  double a[8];
  for (int j = 0; j < 8; j++)
    a[j] = ((x[j] + x[8 + j]) + (x[16 + j] + x[24 + j])) +
           ((x[32 + j] + x[40 + j]) + (x[48 + j] + x[56 + j]));
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* A key whose ascending order is (logit descending, id ascending): 32 bits of logit above
 * idbits of id. */
static inline uint64_t lh__rank_key(float f, int32_t id, int idbits) {
  if (f == 0.0f) f = 0.0f; /* -0 ranks with +0 */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending in f */
  return ((uint64_t)~u << idbits) | (uint32_t)id;
}

static inline int32_t lh__key_id(uint64_t key, int idbits) {
  return (int32_t)(key & (((uint64_t)1 << idbits) - 1));
}

#endif
