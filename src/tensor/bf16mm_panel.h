/* Internal to src/tensor: the register-blocked panel of lh_bf16mm, written once for every SIMD
 * path. The including file defines its vector type and operations, then includes this:
 *   VF, LANES, MR, NR, PANEL, vzero(), vload_x(p) (aligned LANES fp32),
 *   vload_w(p, odd) (of 2 * LANES bf16, the even-indexed (odd = 0) or the odd-indexed ones
 *   widened to fp32), vload_w_tail(p, n, odd) (the same of the first n, the rest 0),
 *   vkeep(v) (v, held in a register where that pays: compilers otherwise fold the activation
 *   load into each of the NR FMAs, and the tile is bound by loads, not FMAs),
 *   vfma(a, b, c) = a*b+c, vsum(v) (a fixed horizontal sum),
 *   vpermute(dst, src) (2 * LANES fp32: the even-indexed ones, then the odd-indexed ones).
 * Widening: a 32-bit lane holding two bf16 is the odd one as an fp32 once its low half is
 * cleared, and the even one shifted left by 16: two or three integer operations widen 2 * LANES
 * weights, no shuffle. The activations are permuted to match once per K block (permute(),
 * below), so lane l of a group of 2 * LANES k sums k = 2l, then 2l + 1. A tile is MR activation
 * rows x NR weight rows: each weight vector is widened once and used by MR rows, each activation
 * vector loaded once and used by NR weight rows; the MR * NR sums stay in registers for a whole K
 * block. Remainder tiles (fewer rows or columns) and the wider tiles of a lone row are the same
 * code with other constant bounds, so every output element sums in the same order whatever the
 * batch. */

#define GROUP   (2 * LANES) /* k per step */
#define PF      4096        /* bf16 weights (8 KiB) ahead of the 1-row tiles' loads */
#define PF_WALK 32768       /* bytes ahead of a lone row's walk over rows longer than a K block */
#define ROW_NR  6 /* weight rows per tile of a lone activation row: independent sums in flight */
/* the permuted activations: MR rows of one K block, or one row of up to XP_BLOCKS K blocks */
#define XP_BLOCKS 8
#define XS        (LH__BF16MM_KC + GROUP) /* floats between rows (or blocks) of xp */
_Static_assert(XP_BLOCKS >= MR, "the buffer holds MR rows of a block");

/* xp (mr rows, XS apart) = the K block x[i * K + k], k < kc, each group of GROUP k laid
 * out as its even-indexed then its odd-indexed values, zero past kc up to a whole group */
static void permute(float *restrict xp, const float *restrict x, int mr, int K, int kc) {
  int kp = (kc + GROUP - 1) / GROUP * GROUP;
  for (int i = 0; i < mr; i++) {
    const float *xi = x + (size_t)i * K;
    float *pi = xp + (size_t)i * XS;
    int k = 0;
    for (; k + GROUP <= kc; k += GROUP)
      vpermute(pi + k, xi + k);
    for (; k < kp; k += GROUP)
      for (int l = 0; l < LANES; l++) {
        pi[k + l] = k + 2 * l < kc ? xi[k + 2 * l] : 0.0f;
        pi[k + LANES + l] = k + 2 * l + 1 < kc ? xi[k + 2 * l + 1] : 0.0f;
      }
  }
}

/* acc[i][j] += the products of one half of a group: the even k (odd = 0) or the odd k (odd = 1)
 * of n < GROUP weights (n = GROUP: a whole group) times the permuted activations. The halves are
 * widened one at a time, so MR * NR sums, NR weight vectors and one activation vector fit in the
 * registers and each activation vector is loaded once. */
static inline __attribute__((always_inline)) void half(int mr, int nr, VF acc[MR][ROW_NR],
                                                       const uint16_t *w, int K, int n, int odd,
                                                       const float *xp) {
  VF wv[ROW_NR];
#pragma GCC unroll 8
  for (int j = 0; j < nr; j++)
    wv[j] = n == GROUP ? vload_w(w + (size_t)j * K, odd) : vload_w_tail(w + (size_t)j * K, n, odd);
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++) {
    VF xv = vkeep(vload_x(xp + (size_t)i * XS + odd * LANES));
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++)
      acc[i][j] = vfma(xv, wv[j], acc[i][j]);
  }
}

/* out[i * N + j] (+)= sum over k < kc of x[i * K + k] * w[j * K + k], i < mr, j < nr, with the
 * activations permuted in xp (rows XS apart) */
static inline __attribute__((always_inline)) void tile(int mr, int nr, float *out, int N,
                                                       const float *xp, int K, const uint16_t *w,
                                                       int kc, bool add, const char *walk) {
  VF acc[MR][ROW_NR]; /* NR <= ROW_NR */
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++)
      acc[i][j] = vzero();
  int k = 0;
  for (; k + GROUP <= kc; k += GROUP) {
    /* Ask for weights ahead, so that more lines are in flight than the hardware prefetcher
     * keeps. A lone row over whole rows (kc == K: the rows are contiguous) streams in address
     * order: PF further on, in the next tiles' rows. A lone row over longer rows (panel_row)
     * reads its tile's rows block by block, nr streams a row apart: `walk` runs through the
     * weights in address order as fast as the tile consumes them (nr rows x GROUP bf16 a step:
     * nr lines on AVX-512, half as much on AVX2, which asks for some lines twice), PF_WALK
     * bytes ahead, so the next tile's rows arrive while this one is read (measured: 1.09-1.19x
     * on the down product's shape, K = 4864). Otherwise the next tile's rows at this k, which
     * the next call reads (with many rows, from L2 after the first row tile: cheap). */
    if (mr == 1) {
      if (kc == K) {
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
          __builtin_prefetch(w + (size_t)j * K + k + PF, 0, 3);
      } else if (walk) {
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
          __builtin_prefetch(walk + (size_t)k * 2 * nr + (size_t)j * 64, 0, 3);
      }
    } else {
#pragma GCC unroll 8
      for (int j = 0; j < nr; j++)
        __builtin_prefetch(w + (size_t)(NR + j) * K + k, 0, 3);
    }
    half(mr, nr, acc, w + k, K, GROUP, 0, xp + k);
    half(mr, nr, acc, w + k, K, GROUP, 1, xp + k);
  }
  if (k < kc) {
    half(mr, nr, acc, w + k, K, kc - k, 0, xp + k);
    half(mr, nr, acc, w + k, K, kc - k, 1, xp + k);
  }
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++) {
      float s = vsum(acc[i][j]), *o = out + (size_t)i * N + j;
      *o = add ? *o + s : s;
    }
}

typedef void (*tile_fn)(float *out, int N, const float *xp, int K, const uint16_t *w, int kc,
                        bool add);
#define TILE(mr, nr)                                                                               \
  static void tile_##mr##_##nr(float *out, int N, const float *xp, int K, const uint16_t *w,       \
                               int kc, bool add) {                                                 \
    tile(mr, nr, out, N, xp, K, w, kc, add, NULL);                                                 \
  }
#define TILE_ROW(mr) TILE(mr, 1) TILE(mr, 2) TILE(mr, 3)
#define TILE_ENTRIES(mr)                                                                           \
  { tile_##mr##_1, tile_##mr##_2, tile_##mr##_3 }
_Static_assert(NR == 3, "the tile table below is written for 3 weight rows per tile");
_Static_assert(LH__BF16MM_KC % GROUP == 0, "a K block is a whole number of groups");
TILE_ROW(1)
TILE_ROW(2)
TILE_ROW(3)
TILE_ROW(4)
#if MR == 8
TILE_ROW(5)
TILE_ROW(6)
TILE_ROW(7)
TILE_ROW(8)
static const tile_fn tiles[MR][NR] = {TILE_ENTRIES(1), TILE_ENTRIES(2), TILE_ENTRIES(3),
                                      TILE_ENTRIES(4), TILE_ENTRIES(5), TILE_ENTRIES(6),
                                      TILE_ENTRIES(7), TILE_ENTRIES(8)};
#elif MR == 4
static const tile_fn tiles[MR][NR] = {TILE_ENTRIES(1), TILE_ENTRIES(2), TILE_ENTRIES(3),
                                      TILE_ENTRIES(4)};
#else
#error "MR must be 4 or 8"
#endif

#define ROW_TILE(nr)                                                                               \
  static void row_tile_##nr(float *out, const float *xp, int K, const uint16_t *w, int kc,         \
                            bool add, const char *walk) {                                          \
    tile(1, nr, out, 0, xp, K, w, kc, add, walk);                                                  \
  }
ROW_TILE(1)
ROW_TILE(2)
ROW_TILE(3)
ROW_TILE(4)
ROW_TILE(5)
ROW_TILE(6)
typedef void (*row_tile_fn)(float *out, const float *xp, int K, const uint16_t *w, int kc, bool add,
                            const char *walk);
static const row_tile_fn row_tiles[ROW_NR] = {row_tile_1, row_tile_2, row_tile_3,
                                              row_tile_4, row_tile_5, row_tile_6};
_Static_assert(ROW_NR == 6 && NR <= ROW_NR, "the row tile table is written for 6 weight rows");

/* M == 1 and K <= XP_BLOCKS * LH__BF16MM_KC: the row's K blocks permuted once, then every tile
 * takes its weight rows whole, block after block, so the weights stream in address order (a
 * product with K > LH__BF16MM_KC otherwise passes over each row once per block). Each block's
 * sums are the blocked order's, added to the output in the same order: the same bits. */
static void panel_row(float *out, const float *x, const uint16_t *W, int K, int n0, int n1,
                      bool accumulate, float *xp) {
  int blocks = (K + LH__BF16MM_KC - 1) / LH__BF16MM_KC;
  for (int b = 0; b < blocks; b++) {
    int k0 = b * LH__BF16MM_KC, kc = K - k0 < LH__BF16MM_KC ? K - k0 : LH__BF16MM_KC;
    permute(xp + (size_t)b * XS, x + k0, 1, K, kc);
  }
  for (int n = n0; n < n1; n += ROW_NR) {
    int nr = n1 - n < ROW_NR ? n1 - n : ROW_NR;
    for (int b = 0; b < blocks; b++) {
      int k0 = b * LH__BF16MM_KC, kc = K - k0 < LH__BF16MM_KC ? K - k0 : LH__BF16MM_KC;
      /* the tile's first k0 columns of nr rows are behind: as many bytes of the walk */
      const char *walk = (const char *)(W + (size_t)n * K) + PF_WALK + (size_t)k0 * 2 * nr;
      row_tiles[nr - 1](out + n, xp + (size_t)b * XS, K, W + (size_t)n * K + k0, kc,
                        accumulate || b > 0, walk);
    }
  }
}

void PANEL(float *out, const float *x, const uint16_t *W, int M, int K, int N, int n0, int n1,
           bool accumulate) {
  /* weight rows per chunk: a chunk's K block (NC x KC bf16, 192 KiB) stays in L2 while every
   * row tile passes over it, and a row tile's permuted K block (MR x KC fp32) stays in L1 */
  enum { NC = NR * 32 };
  _Alignas(64) float xp[XP_BLOCKS * XS];
  if (M == 1 && K <= XP_BLOCKS * LH__BF16MM_KC) {
    panel_row(out, x, W, K, n0, n1, accumulate, xp);
    return;
  }
  for (int k0 = 0; k0 < K; k0 += LH__BF16MM_KC) {
    int kc = K - k0 < LH__BF16MM_KC ? K - k0 : LH__BF16MM_KC;
    bool add = accumulate || k0 > 0;
    int held = -1; /* the row tile whose block xp holds: with M <= MR, one permute per block */
    for (int c0 = n0; c0 < n1; c0 += NC) {
      int c1 = n1 - c0 < NC ? n1 : c0 + NC;
      for (int m = 0; m < M; m += MR) {
        int mr = M - m < MR ? M - m : MR;
        if (held != m) permute(xp, x + (size_t)m * K + k0, mr, K, kc);
        held = m;
        for (int n = c0; n < c1; n += NR) {
          int nr = c1 - n < NR ? c1 - n : NR;
          tiles[mr - 1][nr - 1](out + (size_t)m * N + n, N, xp, K, W + (size_t)n * K + k0, kc, add);
        }
      }
    }
  }
}
