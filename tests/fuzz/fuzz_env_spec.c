/* libFuzzer target for the environment spec of --env ("NAME:key=value,..."): any bytes as the
 * spec. A refused spec is LH_ERR_USAGE with a message free of control bytes (the spec's text is
 * escaped). An accepted spec gives NUL-terminated fields and a known match kind, is written back
 * by lh_env_config_format as a spec that parses to the same settings, and a built-in environment
 * made from it is always created (the spec's checks are the environment's; jsonl and exec are
 * not created: they would read files or start programs named by the input). */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "longhaul/env.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4 * LH_ENV_PATH_MAX) return 0;
  char *spec = malloc(size + 1);
  CHECK(spec);
  memcpy(spec, data, size);
  spec[size] = '\0';
  lh_env_config cfg;
  lh_err e = lh_env_config_parse(spec, &cfg);
  if (e != LH_ERR_OK) {
    CHECK(e == LH_ERR_USAGE && lh_last_error()[0] != '\0');
    for (const char *m = lh_last_error(); *m; m++)
      CHECK((unsigned char)*m >= 0x20 && *m != 0x7f);
  } else {
    static char text[4 * LH_ENV_PATH_MAX];
    lh_env_config back;
    CHECK(lh_env_config_format(&cfg, text, sizeof text) == LH_ERR_OK);
    CHECK(lh_env_config_parse(text, &back) == LH_ERR_OK);
    CHECK(memcmp(&cfg, &back, sizeof cfg) == 0);
    CHECK(memchr(cfg.name, '\0', sizeof cfg.name) && cfg.name[0]);
    CHECK(memchr(cfg.ops, '\0', sizeof cfg.ops));
    CHECK(memchr(cfg.path, '\0', sizeof cfg.path) &&
          memchr(cfg.test_path, '\0', sizeof cfg.test_path));
    CHECK(cfg.match == LH_ENV_MATCH_AUTO || cfg.match == LH_ENV_MATCH_EXACT ||
          cfg.match == LH_ENV_MATCH_NUMERIC);
    CHECK(cfg.digits >= 0 && cfg.count >= 0 && cfg.max_number >= 0);
    if (!strcmp(cfg.name, "arith") || !strcmp(cfg.name, "countdown") || !strcmp(cfg.name, "sort")) {
      lh_env *env = NULL;
      CHECK(lh_env_create(&cfg, &env) == LH_ERR_OK);
      lh_env_task t;
      CHECK(lh_env_task_get(env, LH_SPLIT_TRAIN, 0, &t) == LH_ERR_OK && t.prompt && t.answer);
      lh_env_task_clear(&t);
      lh_env_free(env);
    }
  }
  free(spec);
  return 0;
}
