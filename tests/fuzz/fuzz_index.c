/* libFuzzer target: model.safetensors.index.json (lh_safetensors_index_parse). Every accepted
 * index yields plain, distinct shard file names, each holding some tensor, and tensor names in
 * strictly increasing order, each found again by lh_safetensors_index_find in its shard. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_st_index *ix = NULL;
  if (lh_safetensors_index_parse((const char *)data, size, "fuzz.index.json", &ix) == LH_ERR_OK) {
    int nf = ix->n_files;
    if (nf < 1 || ix->n < nf) abort();
    char *used = calloc((size_t)nf, 1);
    if (!used) abort();
    for (int i = 0; i < nf; i++) {
      if (!ix->files[i][0] || strchr(ix->files[i], '/')) abort();
      for (int j = 0; j < i; j++)
        if (!strcmp(ix->files[i], ix->files[j])) abort();
    }
    for (int i = 0; i < ix->n; i++) {
      if (ix->file[i] < 0 || ix->file[i] >= nf) abort();
      if (i && strcmp(ix->names[i - 1], ix->names[i]) >= 0) abort();
      if (lh_safetensors_index_find(ix, ix->names[i]) != ix->file[i]) abort();
      used[ix->file[i]] = 1;
    }
    for (int i = 0; i < nf; i++)
      if (!used[i]) abort();
    free(used);
  }
  free(ix);
  return 0;
}
