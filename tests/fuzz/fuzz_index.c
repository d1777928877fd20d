/* libFuzzer target: model.safetensors.index.json (lh_safetensors_index_parse). Every accepted
 * index yields plain, distinct shard file names. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char **files = NULL;
  int n = 0;
  if (lh_safetensors_index_parse((const char *)data, size, "fuzz.index.json", &files, &n) ==
      LH_ERR_OK) {
    if (n < 1) abort();
    for (int i = 0; i < n; i++) {
      if (!files[i][0] || strchr(files[i], '/')) abort();
      for (int j = 0; j < i; j++)
        if (!strcmp(files[i], files[j])) abort();
    }
  }
  free(files);
  return 0;
}
