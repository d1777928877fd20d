/* libFuzzer target: generation_config.json (lh_config_parse_generation) applied to a valid
 * config; whatever it accepts leaves a config that still validates. */
#include <stdint.h>
#include <stdlib.h>

#include "longhaul/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_config c;
  if (lh_config_preset("tiny", LH_ARCH_QWEN2, &c) != LH_ERR_OK) abort();
  if (lh_config_parse_generation((const char *)data, size, "fuzz.generation_config.json", &c) ==
      LH_ERR_OK) {
    if (lh_config_validate(&c) != LH_ERR_OK) abort();
    if (c.n_eos < 0 || c.n_eos > LH_MAX_EOS) abort();
  }
  return 0;
}
