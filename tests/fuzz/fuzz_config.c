/* libFuzzer target for config.json: parse any bytes; an accepted config must validate, imply a
 * positive parameter count, and survive save -> load unchanged. The same bytes as an override
 * of the tiny preset (init-model --preset FILE.json) must give a valid config or an error that
 * names the source and leaves the preset untouched. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/model.h"

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_config preset, over;
  CHECK(lh_config_preset("tiny", LH_ARCH_QWEN3, &preset) == LH_ERR_OK);
  over = preset;
  if (lh_config_override((const char *)data, size, "fuzz", &over) == LH_ERR_OK) {
    CHECK(lh_config_validate(&over) == LH_ERR_OK && over.arch == LH_ARCH_QWEN3);
  } else {
    CHECK(strncmp(lh_last_error(), "fuzz", 4) == 0);
    CHECK(memcmp(&over, &preset, sizeof over) == 0);
  }
  lh_config c;
  memset(&c, 0, sizeof c);
  lh_err err = lh_config_parse((const char *)data, size, "fuzz", &c);
  if (err != LH_ERR_OK) {
    CHECK(strncmp(lh_last_error(), "fuzz", 4) == 0); /* messages name the source */
    return 0;
  }
  CHECK(lh_config_validate(&c) == LH_ERR_OK);
  CHECK(lh_config_n_params(&c) > 0);
  const char *path = fuzz_scratch_path("cfg", ".json");
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
  CHECK(back.o_bias == c.o_bias);
  CHECK(back.bos_token_id == c.bos_token_id && back.eos_token_id == c.eos_token_id);
  return 0;
}
