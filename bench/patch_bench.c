/* patch_bench: one pair of bf16 policies (raw little-endian slabs, as bench/patch_trajectories.sh
 * writes them) through longhaul's patch codec and through the coding of published systems
 * (PULSE, TRL's delta sync, slime: changed positions as gap varints plus the new 16-bit values
 * verbatim, zstd), measured in one run. Prints one JSON object: values, changes, bytes of each
 * coding and their ratio, bits per change, the static entropy of longhaul's symbols (how close
 * the adaptive coder gets), and make/apply throughput on one thread in GB/s of bf16 weights
 * (apply: with the parent's hash computed, with it given as a worker that checked it on arrival
 * does, and the decode alone, checking neither hash: lh_patch_decode_unchecked), next to
 * BLAKE2b's and memcpy's speed in the same process; best of 3 runs (of 1 above 100M values),
 * timed in the thread's CPU time.
 * Usage: patch_bench CONFIG.json PARENT.bf16 CHILD.bf16 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

#include "longhaul/patch.h"

static uint16_t *read_slab(const char *path, uint64_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint16_t *s = malloc((size_t)len);
  if (!s || fread(s, 1, (size_t)len, f) != (size_t)len) {
    fprintf(stderr, "%s: cannot read\n", path);
    exit(1);
  }
  fclose(f);
  *n = (uint64_t)len / 2;
  return s;
}

/* This thread's CPU time: on a machine shared with other jobs the figures count only the time
 * the thread ran (its caches and memory bandwidth are still shared). */
static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static size_t zstd_size(const void *buf, size_t len, int level) {
  size_t cap = ZSTD_compressBound(len);
  void *out = malloc(cap);
  size_t z = ZSTD_compress(out, cap, buf, len, level);
  free(out);
  if (ZSTD_isError(z)) {
    fprintf(stderr, "zstd: %s\n", ZSTD_getErrorName(z));
    exit(1);
  }
  return z;
}

static size_t put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  do {
    uint8_t b = v & 0x7f;
    v >>= 7;
    p[n++] = (uint8_t)(b | (v ? 0x80 : 0));
  } while (v);
  return n;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: patch_bench CONFIG.json PARENT.bf16 CHILD.bf16\n");
    return 2;
  }
  lh_set_threads(1);
  char *cfg_text = NULL;
  size_t cfg_len = 0;
  lh_config cfg;
  if (lh_file_read(argv[1], 1 << 20, &cfg_text, &cfg_len) ||
      lh_config_parse(cfg_text, cfg_len, argv[1], &cfg)) {
    fprintf(stderr, "%s\n", lh_last_error());
    return 1;
  }
  uint64_t n, n2;
  uint16_t *p = read_slab(argv[2], &n), *c = read_slab(argv[3], &n2);
  if (n != n2 || n != lh_config_n_params(&cfg)) {
    fprintf(stderr, "slabs of %llu and %llu values, the config has %zu\n", (unsigned long long)n,
            (unsigned long long)n2, lh_config_n_params(&cfg));
    return 1;
  }
  int ns = lh_patch_sections(&cfg, NULL, 0);
  lh_patch_section *sec = calloc((size_t)ns, sizeof *sec);
  lh_patch_sections(&cfg, sec, ns);

  /* longhaul: make (best of 3), apply (best of 3, from a fresh copy each time) */
  uint8_t *patch = NULL;
  size_t len = 0;
  double make_s = 1e30, apply_s = 1e30, apply_known_s = 1e30, hash_s = 1e30, copy_s = 1e30,
         decode_s = 1e30;
  uint16_t *w = malloc(n * 2);
  uint8_t h[LH_HASH_BYTES];
  /* best of 3 runs (1 for slabs over 100M values, whose runs last seconds each) */
  int repeats = n > 100000000 ? 1 : 3;
  for (int r = 0; r < repeats; r++) {
    free(patch);
    double t0 = cpu_now();
    if (lh_patch_make(p, c, n, sec, ns, 0, 1, &patch, &len)) {
      fprintf(stderr, "make: %s\n", lh_last_error());
      return 1;
    }
    double t1 = cpu_now();
    memcpy(w, p, n * 2);
    double t2 = cpu_now();
    if (lh_patch_apply(w, n, patch, len, NULL) || memcmp(w, c, n * 2)) {
      fprintf(stderr, "apply: %s\n", lh_last_error());
      return 1;
    }
    double t3 = cpu_now();
    lh_patch_slab_hash(p, n, h);
    double t4 = cpu_now();
    memcpy(w, p, n * 2);
    double t5 = cpu_now();
    if (lh_patch_apply(w, n, patch, len, h) || memcmp(w, c, n * 2)) return 1;
    double t6 = cpu_now();
    memcpy(w, p, n * 2);
    double t7 = cpu_now();
    if (lh_patch_decode_unchecked(w, n, patch, len) || memcmp(w, c, n * 2)) return 1;
    double t8 = cpu_now();
    if (t8 - t7 < decode_s) decode_s = t8 - t7;
    if (t1 - t0 < make_s) make_s = t1 - t0;
    if (t3 - t2 < apply_s) apply_s = t3 - t2;
    if (t4 - t3 < hash_s) hash_s = t4 - t3;
    if (t2 - t1 < copy_s) copy_s = t2 - t1;
    if (t6 - t5 < apply_known_s) apply_known_s = t6 - t5;
  }
  double ent = lh_patch_entropy_bits(p, c, n, sec, ns);

  /* the published systems' coding: gap varints of changed positions + new values, zstd */
  uint64_t changed = 0;
  for (uint64_t i = 0; i < n; i++)
    changed += p[i] != c[i];
  uint8_t *gaps = malloc((size_t)changed * 10 + 1), *vals = malloc((size_t)changed * 2 + 1),
          *steps = malloc((size_t)changed * 3 + 1);
  size_t ng = 0, nv = 0, nst = 0;
  uint64_t last = 0;
  for (uint64_t i = 0; i < n; i++)
    if (p[i] != c[i]) {
      ng += put_varint(gaps + ng, i - last);
      last = i;
      vals[nv++] = (uint8_t)c[i], vals[nv++] = (uint8_t)(c[i] >> 8);
      int32_t d = (int32_t)lh_bf16_key(c[i]) - (int32_t)lh_bf16_key(p[i]);
      nst += put_varint(steps + nst, d < 0 ? (uint64_t)(-2 * (int64_t)d - 1) : (uint64_t)(2 * d));
    }
  uint8_t *both = malloc(ng + nv + 1);
  memcpy(both, gaps, ng);
  memcpy(both + ng, vals, nv);
  size_t base3 = zstd_size(gaps, ng, 3) + zstd_size(vals, nv, 3);
  size_t base3_cat = zstd_size(both, ng + nv, 3);
  if (base3_cat < base3) base3 = base3_cat;
  size_t base19 = zstd_size(gaps, ng, 19) + zstd_size(vals, nv, 19);
  size_t base19_cat = zstd_size(both, ng + nv, 19);
  if (base19_cat < base19) base19 = base19_cat;
  /* option 2 of the issue: gaps and steps (zigzag varints) as separate zstd streams */
  size_t steps19 = zstd_size(gaps, ng, 19) + zstd_size(steps, nst, 19);

  double gb = 2.0 * (double)n / 1e9, ch = changed ? (double)changed : 1.0;
  printf("{\"values\":%llu,\"changed\":%llu,\"frac\":%.6f,\"longhaul_bytes\":%zu,"
         "\"longhaul_bits_per_change\":%.4f,\"entropy_bits_per_change\":%.4f,"
         "\"baseline_zstd3_bytes\":%zu,\"baseline_zstd19_bytes\":%zu,\"steps_zstd19_bytes\":%zu,"
         "\"ratio_vs_zstd3\":%.3f,\"ratio_vs_zstd19\":%.3f,\"bf16_bytes\":%llu,"
         "\"ratio_vs_bf16\":%.1f,\"make_gbps\":%.3f,\"apply_gbps\":%.3f,\"apply_known_parent_"
         "gbps\":%.3f,"
         "\"decode_gbps\":%.3f,\"blake2b_gbps\":%.3f,\"memcpy_gbps\":%.3f}\n",
         (unsigned long long)n, (unsigned long long)changed, (double)changed / (double)n, len,
         8.0 * (double)len / ch, ent / ch, base3, base19, steps19, (double)base3 / (double)len,
         (double)base19 / (double)len, (unsigned long long)(2 * n), (double)(2 * n) / (double)len,
         gb / make_s, gb / apply_s, gb / apply_known_s, gb / decode_s, gb / hash_s, gb / copy_s);
  free(both);
  free(gaps);
  free(vals);
  free(steps);
  free(patch);
  free(w);
  free(p);
  free(c);
  free(sec);
  free(cfg_text);
  return 0;
}
