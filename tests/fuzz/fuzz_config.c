/* libFuzzer target for config.json: parse any bytes; an accepted config must validate, imply a
 * positive parameter count, and survive save -> load unchanged. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/model.h"

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz_config: invariant failed: %s (line %d)\n", #cond, __LINE__);           \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

static const char *scratch_path(void) {
  static char path[64];
  static int init;
  if (!init) {
    struct stat sb;
    init = 1;
    if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode))
      snprintf(path, sizeof path, "/dev/shm/lh_fuzz_cfg_%d.json", (int)getpid());
  }
  return path[0] ? path : NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_config c;
  memset(&c, 0, sizeof c);
  lh_err err = lh_config_parse((const char *)data, size, "fuzz", &c);
  if (err != LH_ERR_OK) {
    CHECK(strncmp(lh_last_error(), "fuzz", 4) == 0); /* messages name the source */
    return 0;
  }
  CHECK(lh_config_validate(&c) == LH_ERR_OK);
  CHECK(lh_config_n_params(&c) > 0);
  const char *path = scratch_path();
  if (!path) return 0;
  CHECK(lh_config_save(path, &c) == LH_ERR_OK);
  lh_config back;
  memset(&back, 0, sizeof back);
  CHECK(lh_config_load(path, &back) == LH_ERR_OK);
  unlink(path);
  CHECK(back.arch == c.arch && back.vocab_size == c.vocab_size);
  CHECK(back.hidden_size == c.hidden_size && back.n_layers == c.n_layers);
  CHECK(back.n_heads == c.n_heads && back.n_kv_heads == c.n_kv_heads);
  CHECK(back.head_dim == c.head_dim && back.intermediate_size == c.intermediate_size);
  CHECK(back.max_positions == c.max_positions);
  CHECK(back.rope_theta == c.rope_theta && back.rms_eps == c.rms_eps);
  CHECK(back.tie_embeddings == c.tie_embeddings && back.qkv_bias == c.qkv_bias);
  CHECK(back.bos_token_id == c.bos_token_id && back.eos_token_id == c.eos_token_id);
  return 0;
}
