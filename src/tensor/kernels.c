/* longhaul CPU kernels: bf16 conversion, matmul wrappers over cblas_sgemm, RMSNorm, RoPE,
 * SwiGLU and causal GQA attention, each with its backward. Row loops use OpenMP; every
 * reduction written here runs in a fixed order and does not depend on the thread count. The
 * cblas_sgemm products, threaded inside OpenBLAS, do in their last bits. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "longhaul/tensor.h"

uint16_t lh_bf16_from_f32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

float lh_f32_from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

void lh_bf16_from_f32_n(uint16_t *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++)
    dst[i] = lh_bf16_from_f32(src[i]);
}

void lh_f32_from_bf16_n(float *dst, const uint16_t *src, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++)
    dst[i] = lh_f32_from_bf16(src[i]);
}

void lh_matmul_xwt(float *out, const float *x, const float *w, int M, int K, int N, float beta) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, beta, out, N);
}

void lh_matmul_dx(float *dx, const float *dout, const float *w, int M, int K, int N, float beta) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dout, N, w, K, beta, dx, K);
}

void lh_matmul_dw(float *dw, const float *dout, const float *x, int M, int K, int N) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dout, N, x, K, 1.0f, dw, K);
}

void lh_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int M, int C,
                        float eps) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < M; i++) {
    const float *xi = x + (size_t)i * C;
    float *oi = out + (size_t)i * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < C; j++)
      ss += xi[j] * xi[j];
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (rstd) rstd[i] = r;
#pragma omp simd
    for (int j = 0; j < C; j++)
      oi[j] = xi[j] * r * w[j];
  }
}

void lh_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                         const float *rstd, int M, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < M; i++) {
    const float *xi = x + (size_t)i * C, *gi = dout + (size_t)i * C;
    float *dxi = dx + (size_t)i * C;
    float r = rstd[i], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j < C; j++)
      dot += gi[j] * w[j] * xi[j];
    float c = dot * r * r * r / (float)C;
#pragma omp simd
    for (int j = 0; j < C; j++)
      dxi[j] += r * gi[j] * w[j] - c * xi[j];
  }
  /* dw: rows in order, so the sum is the same on any thread count */
  for (int i = 0; i < M; i++) {
    const float *xi = x + (size_t)i * C, *gi = dout + (size_t)i * C;
    float r = rstd[i];
#pragma omp simd
    for (int j = 0; j < C; j++)
      dw[j] += gi[j] * xi[j] * r;
  }
}

void lh_rope_tables(float *cos_t, float *sin_t, int max_pos, int hd, const float *inv_freq) {
  int half = hd / 2;
  for (int i = 0; i < half; i++) {
    /* as Hugging Face: angle = fp32 product */
    float inv = inv_freq[i];
    for (int p = 0; p < max_pos; p++) {
      float a = (float)p * inv;
      cos_t[(size_t)p * half + i] = cosf(a);
      sin_t[(size_t)p * half + i] = sinf(a);
    }
  }
}

void lh_rope_apply(float *x, int n_heads, int hd, const float *cos_t, const float *sin_t, int pos,
                   int inverse) {
  int half = hd / 2;
  const float *c = cos_t + (size_t)pos * half, *s = sin_t + (size_t)pos * half;
  float sign = inverse ? -1.0f : 1.0f;
  for (int h = 0; h < n_heads; h++) {
    float *a = x + (size_t)h * hd, *b = a + half;
#pragma omp simd
    for (int i = 0; i < half; i++) {
      float a0 = a[i], b0 = b[i], si = sign * s[i];
      a[i] = a0 * c[i] - b0 * si;
      b[i] = b0 * c[i] + a0 * si;
    }
  }
}

/* h[j] = silu(gate[j]) * up[j], j in [j0, j1): one element's value whatever the range */
static inline void swiglu_span(float *h, const float *gate, const float *up, int j0, int j1) {
#pragma omp simd
  for (int j = j0; j < j1; j++)
    h[j] = gate[j] / (1.0f + lh_expf(-gate[j])) * up[j];
}

void lh_swiglu_forward(float *h, const float *gu, int M, int F) {
#pragma omp parallel for schedule(static) if ((size_t)M * F >= 32768)
  for (int i = 0; i < M; i++) {
    const float *gate = gu + (size_t)i * 2 * F;
    swiglu_span(h + (size_t)i * F, gate, gate + F, 0, F);
  }
}

void lh_swiglu_cols(float *h, const float *gu, int M, int F, int j0, int j1) {
  for (int i = 0; i < M; i++) {
    const float *gate = gu + (size_t)i * 2 * F;
    swiglu_span(h + (size_t)i * F, gate, gate + F, j0, j1);
  }
}

void lh_swiglu_backward(float *dgu, const float *dh, const float *gu, int M, int F) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < M; i++) {
    const float *gate = gu + (size_t)i * 2 * F, *up = gate + F, *d = dh + (size_t)i * F;
    float *dgate = dgu + (size_t)i * 2 * F, *dup = dgate + F;
#pragma omp simd
    for (int j = 0; j < F; j++) {
      float g = gate[j], sg = 1.0f / (1.0f + lh_expf(-g));
      dup[j] = d[j] * g * sg;
      dgate[j] = d[j] * up[j] * sg * (1.0f + g * (1.0f - sg));
    }
  }
}

/* Attention works in query blocks of ATT_BLOCK rows: block b only needs keys [0, end of b), so
 * the sgemms skip the masked upper triangle except inside diagonal blocks. */
#define ATT_BLOCK 64

static inline int imin(int a, int b) {
  return a < b ? a : b;
}

/* Softmax of row i over columns [0, i]; columns (i, end) of the row's block are set to 0. */
static void causal_softmax(float *P, int T) {
  for (int i = 0; i < T; i++) {
    float *row = P + (size_t)i * T, mx = row[0], sum = 0.0f;
    int end = imin(T, (i / ATT_BLOCK + 1) * ATT_BLOCK);
    for (int j = 1; j <= i; j++)
      mx = row[j] > mx ? row[j] : mx;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j <= i; j++) {
      row[j] = lh_expf(row[j] - mx);
      sum += row[j];
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j <= i; j++)
      row[j] *= inv;
    for (int j = i + 1; j < end; j++)
      row[j] = 0.0f;
  }
}

void lh_attention_forward(float *out, float *probs, const float *q, const float *k, const float *v,
                          int ld, int T, int H, int KV, int hd, int g) {
  int G = H / KV, os = H * hd;
  float scale = 1.0f / sqrtf((float)hd);
  const float *kg = k + g * hd, *vg = v + g * hd;
  for (int h = g * G; h < (g + 1) * G; h++) {
    float *P = probs + (size_t)h * T * T;
    for (int b0 = 0; b0 < T; b0 += ATT_BLOCK) {
      int rows = imin(ATT_BLOCK, T - b0), cols = b0 + rows;
      /* S[b0:b0+rows, 0:cols] = scale * Q_h K_g^T */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hd, scale,
                  q + (size_t)b0 * ld + h * hd, ld, kg, ld, 0.0f, P + (size_t)b0 * T, T);
    }
    causal_softmax(P, T);
    for (int b0 = 0; b0 < T; b0 += ATT_BLOCK) {
      int rows = imin(ATT_BLOCK, T - b0), cols = b0 + rows;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, cols, 1.0f,
                  P + (size_t)b0 * T, T, vg, ld, 0.0f, out + (size_t)b0 * os + h * hd, os);
    }
  }
}

void lh_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                           const float *q, const float *k, const float *v, int ld, int T, int H,
                           int KV, int hd, int g, float *scratch) {
  int G = H / KV, os = H * hd;
  float scale = 1.0f / sqrtf((float)hd);
  const float *kg = k + g * hd, *vg = v + g * hd;
  float *dkg = dk + g * hd, *dvg = dv + g * hd;
  for (int h = g * G; h < (g + 1) * G; h++) {
    const float *P = probs + (size_t)h * T * T;
    const float *dO = dout + h * hd;
    float beta = h == g * G ? 0.0f : 1.0f; /* first head of the group overwrites dk, dv */
    float *dS = scratch;
    for (int b0 = 0; b0 < T; b0 += ATT_BLOCK) {
      int n = imin(ATT_BLOCK, T - b0), cols = b0 + n;
      /* key block [b0, b0+n) is seen by query rows [b0, T): dV_g += P^T dO */
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, T - b0, 1.0f,
                  P + (size_t)b0 * T + b0, T, dO + (size_t)b0 * os, os, beta, dvg + (size_t)b0 * ld,
                  ld);
      /* query block: dP = dO V^T over keys [0, cols) */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, cols, hd, 1.0f, dO + (size_t)b0 * os,
                  os, vg, ld, 0.0f, dS + (size_t)b0 * T, T);
    }
    /* dS = P * (dP - rowsum(P * dP)) * scale on the causal triangle, 0 above it */
    for (int i = 0; i < T; i++) {
      const float *p = P + (size_t)i * T;
      float *d = dS + (size_t)i * T, dot = 0.0f;
      int end = imin(T, (i / ATT_BLOCK + 1) * ATT_BLOCK);
#pragma omp simd reduction(+ : dot)
      for (int j = 0; j <= i; j++)
        dot += p[j] * d[j];
#pragma omp simd
      for (int j = 0; j <= i; j++)
        d[j] = p[j] * (d[j] - dot) * scale;
      for (int j = i + 1; j < end; j++)
        d[j] = 0.0f;
    }
    for (int b0 = 0; b0 < T; b0 += ATT_BLOCK) {
      int n = imin(ATT_BLOCK, T - b0), cols = b0 + n;
      /* dQ_h = dS K_g over keys [0, cols); dK_g += dS^T Q_h over query rows [b0, T) */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, cols, 1.0f, dS + (size_t)b0 * T,
                  T, kg, ld, 0.0f, dq + (size_t)b0 * ld + h * hd, ld);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, T - b0, 1.0f,
                  dS + (size_t)b0 * T + b0, T, q + (size_t)b0 * ld + h * hd, ld, beta,
                  dkg + (size_t)b0 * ld, ld);
    }
  }
}
