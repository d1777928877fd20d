/* Internal to src/tensor: the register-blocked panel of lh_bf16mm, written once for every SIMD
 * path. The including file defines its vector type and operations, then includes this:
 *   VF, LANES, MR, NR, PANEL, vzero(), vload_x(p), vload_w(p) (LANES bf16 widened to fp32),
 *   vload_x_tail(p, n), vload_w_tail(p, n) (first n lanes, the rest 0), vfma(a, b, c) = a*b+c,
 *   vsum(v) (a fixed horizontal sum).
 * A tile is MR activation rows x NR weight rows: each weight vector is widened once and used by
 * MR rows, each activation vector loaded once and used by NR weight rows; the MR * NR sums stay
 * in registers for a whole K block. Remainder tiles (fewer rows or columns) are the same code
 * with smaller constant bounds, so every output element sums in the same order. */

/* out[i * N + j] (+)= sum over k < kc of x[i * K + k] * w[j * K + k], i < mr, j < nr */
static inline __attribute__((always_inline)) void tile(int mr, int nr, float *out, int N,
                                                       const float *x, int K, const uint16_t *w,
                                                       int kc, bool add) {
  VF acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++)
      acc[i][j] = vzero();
  int k = 0;
  for (; k + LANES <= kc; k += LANES) {
    VF wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++)
      wv[j] = vload_w(w + (size_t)j * K + k);
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
      VF xv = vload_x(x + (size_t)i * K + k);
#pragma GCC unroll 8
      for (int j = 0; j < nr; j++)
        acc[i][j] = vfma(xv, wv[j], acc[i][j]);
    }
  }
  if (k < kc) {
    int n = kc - k;
    VF wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++)
      wv[j] = vload_w_tail(w + (size_t)j * K + k, n);
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
      VF xv = vload_x_tail(x + (size_t)i * K + k, n);
#pragma GCC unroll 8
      for (int j = 0; j < nr; j++)
        acc[i][j] = vfma(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++) {
      float s = vsum(acc[i][j]), *o = out + (size_t)i * N + j;
      *o = add ? *o + s : s;
    }
}

typedef void (*tile_fn)(float *out, int N, const float *x, int K, const uint16_t *w, int kc,
                        bool add);
#define TILE(mr, nr)                                                                               \
  static void tile_##mr##_##nr(float *out, int N, const float *x, int K, const uint16_t *w,        \
                               int kc, bool add) {                                                 \
    tile(mr, nr, out, N, x, K, w, kc, add);                                                        \
  }
#define TILE_ROW(mr) TILE(mr, 1) TILE(mr, 2) TILE(mr, 3)
#define TILE_ENTRIES(mr)                                                                           \
  { tile_##mr##_1, tile_##mr##_2, tile_##mr##_3 }
_Static_assert(NR == 3, "the tile table below is written for 3 weight rows per tile");
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

void PANEL(float *out, const float *x, const uint16_t *W, int M, int K, int N, int n0, int n1,
           bool accumulate) {
  /* weight rows per chunk: a chunk's K block (NC x KC bf16, 192 KiB) stays in L2 while every
   * row tile passes over it, and a row tile's K block (MR x KC fp32) stays in L1 */
  enum { NC = NR * 32 };
  for (int k0 = 0; k0 < K; k0 += LH__BF16MM_KC) {
    int kc = K - k0 < LH__BF16MM_KC ? K - k0 : LH__BF16MM_KC;
    bool add = accumulate || k0 > 0;
    for (int c0 = n0; c0 < n1; c0 += NC) {
      int c1 = n1 - c0 < NC ? n1 : c0 + NC;
      for (int m = 0; m < M; m += MR) {
        int mr = M - m < MR ? M - m : MR;
        for (int n = c0; n < c1; n += NR) {
          int nr = c1 - n < NR ? c1 - n : NR;
          tiles[mr - 1][nr - 1](out + (size_t)m * N + n, N, x + (size_t)m * K + k0, K,
                                W + (size_t)n * K + k0, kc, add);
        }
      }
    }
  }
}
