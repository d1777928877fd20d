/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
 * Counter = (position lo, position hi, stream lo, stream hi), key = seed. Pure function. */
#include <math.h>

#include "longhaul/base.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void lh_philox(uint64_t seed, uint64_t stream, uint64_t position, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)position, c1 = (uint32_t)(position >> 32);
  uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

float lh_uniform_from_u32(uint32_t w) {
  return (float)(w >> 8) * (1.0f / 16777216.0f);
}

void lh_philox_normal2(uint64_t seed, uint64_t stream, uint64_t position, float out[2]) {
  uint32_t r[4];
  lh_philox(seed, stream, position, r);
  /* u1 in (0, 1] so the log is finite */
  double u1 = ((double)(r[0] >> 8) + 1.0) / 16777216.0;
  double u2 = (double)(r[1] >> 8) / 16777216.0;
  double rad = sqrt(-2.0 * log(u1));
  out[0] = (float)(rad * cos(2.0 * M_PI * u2));
  out[1] = (float)(rad * sin(2.0 * M_PI * u2));
}
