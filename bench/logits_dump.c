/* logits_dump: the logits longhaul's inference computes for a fixed sequence of T tokens (ids
 * 7919 * i mod V), one prefill forward, under every kernel path this CPU runs, each written as
 * raw fp32 (T, V) to PREFIX-PATH.f32; bench/logit_diff.py compares them with PyTorch in fp32 and
 * fp64 on the same bf16 weights.   logits_dump MODEL_DIR PREFIX [T] */
#include <stdio.h>
#include <stdlib.h>

#include "longhaul/infer.h"
#include "longhaul/tensor.h"

int main(int argc, char **argv) {
  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: logits_dump MODEL_DIR PREFIX [T]\n");
    return 2;
  }
  int T = argc == 4 ? atoi(argv[3]) : 32;
  lh_infer *m;
  if (lh_infer_load(argv[1], &m)) {
    fprintf(stderr, "logits_dump: %s\n", lh_last_error());
    return 1;
  }
  const lh_config *c = lh_infer_config(m);
  if (T < 1 || T > c->max_positions) {
    fprintf(stderr, "logits_dump: T must be in [1, %d]\n", c->max_positions);
    return 2;
  }
  int V = c->vocab_size;
  lh_kv *kv;
  if (lh_kv_create(m, 1, T, T, &kv)) {
    fprintf(stderr, "logits_dump: %s\n", lh_last_error());
    return 1;
  }
  lh_infer_row *rows = lh_xmalloc((size_t)T * sizeof *rows);
  for (int i = 0; i < T; i++)
    rows[i] = (lh_infer_row){0, i, (int32_t)((7919L * i) % V), true};
  float *logits = lh_xmalloc((size_t)T * V * sizeof *logits);
  for (int k = 0; k < LH_KERNEL_COUNT; k++) {
    if (lh_kernel_set((lh_kernel)k)) continue;
    if (lh_infer_forward(m, kv, rows, T, logits)) {
      fprintf(stderr, "logits_dump: %s\n", lh_last_error());
      return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s-%s.f32", argv[2], lh_kernel_name((lh_kernel)k));
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(logits, sizeof *logits, (size_t)T * V, f) != (size_t)T * V || fclose(f)) {
      fprintf(stderr, "logits_dump: cannot write %s\n", path);
      return 1;
    }
    printf("%s\n", path);
  }
  free(logits);
  free(rows);
  lh_kv_free(kv);
  lh_infer_free(m);
  return 0;
}
