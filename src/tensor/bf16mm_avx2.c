/* lh_bf16mm's AVX2 + FMA path: 8 lanes, 16 k per step, tiles of 4 activation rows x 3 weight
 * rows (12 accumulators in the 16 ymm registers). Compiled with -march=haswell (CMakeLists.txt), so
 * no AVX-512 instruction can appear in it even when the rest of the build targets this machine;
 * bf16mm.c calls it only when cpuid says the CPU has AVX2 and FMA. */
#include <string.h>

#include "bf16mm.h"

#ifdef LH__BF16MM_X86
#include <immintrin.h>

#define VF    __m256
#define LANES 8
#define MR    4
#define NR    LH__BF16MM_NR_AVX2
#define PANEL lh__bf16mm_panel_avx2

static inline __m256 vzero(void) {
  return _mm256_setzero_ps();
}
/* a 32-bit lane holding two bf16: the even-indexed one shifted into the high half, the
 * odd-indexed one with the low half cleared (by two shifts, not an and: the and's constant
 * would take a sixteenth register from the tile) */
static inline __m256 widen(__m256i v, int odd) {
  return _mm256_castsi256_ps(odd ? _mm256_slli_epi32(_mm256_srli_epi32(v, 16), 16)
                                 : _mm256_slli_epi32(v, 16));
}
static inline __m256 vload_w(const uint16_t *p, int odd) {
  return widen(_mm256_loadu_si256((const __m256i *)p), odd);
}
static inline __m256 vload_w_tail(const uint16_t *p, int n, int odd) {
  uint16_t b[2 * LANES] = {0};
  memcpy(b, p, (size_t)n * sizeof *p);
  return vload_w(b, odd);
}
static inline __m256 vload_x(const float *p) {
  return _mm256_load_ps(p);
}
/* within each 128-bit half a shuffle picks 2 + 2, then the 64-bit quarters are put in order */
static inline void vpermute(float *dst, const float *src) {
  __m256 lo = _mm256_loadu_ps(src), hi = _mm256_loadu_ps(src + LANES);
  __m256 even = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
  __m256 odd = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  _mm256_store_ps(dst, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xD8)));
  _mm256_store_ps(dst + LANES,
                  _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), 0xD8)));
}
/* with 16 registers, 12 sums and 3 weight vectors, the activation is better read by each FMA
 * from L1 than held (measured: holding it spills sums) */
static inline __m256 vkeep(__m256 v) {
  return v;
}
static inline __m256 vfma(__m256 a, __m256 b, __m256 c) {
  return _mm256_fmadd_ps(a, b, c);
}
/* halves, then quarters, then pairs: the scalar path's order */
static inline float vsum(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

#include "bf16mm_panel.h"
#endif
