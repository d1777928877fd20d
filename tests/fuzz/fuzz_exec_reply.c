/* libFuzzer target for what the exec environment reads from its program and from the model:
 * any bytes as a reply line (the fields of a "generate" and of a "score" reply) and as a
 * completion put into a request (lh_json_text). An accepted task has its prompt and
 * answer; an accepted score has a reward in [0, 1], and is correct as the reply says or, when
 * it says nothing, exactly when the reward is 1; a completion always becomes a JSON string,
 * unchanged when it is valid UTF-8, with only U+FFFD added otherwise. */
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "../../src/env/env_impl.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > LH_EXEC_MAX_REPLY) return 0;
  lh_env env = {0};
  strcpy(env.cfg.name, "exec");
  strcpy(env.cfg.path, "fuzz");

  json_t *reply = json_loadb((const char *)data, size, 0, NULL);
  if (reply && json_is_object(reply)) {
    lh_env_task t = {0};
    lh_err e = lh__exec_take_task(&env, "generate train 0", reply, &t);
    if (e == LH_ERR_OK) {
      CHECK(t.prompt && t.answer);
      CHECK(!strcmp(t.prompt, json_string_value(json_object_get(reply, "prompt"))));
      CHECK(!strcmp(t.answer, json_string_value(json_object_get(reply, "answer"))));
      lh_env_task_clear(&t);
    } else {
      CHECK(e == LH_ERR_FORMAT && !t.prompt && !t.answer && !t.solution);
    }
    lh_env_result r;
    e = lh__exec_take_result(&env, "score train 0", reply, &r);
    if (e == LH_ERR_OK) {
      json_t *c = json_object_get(reply, "correct");
      CHECK(r.reward >= 0.0f && r.reward <= 1.0f);
      CHECK(r.correct == (c ? json_is_true(c) : r.reward == 1.0f));
    } else {
      CHECK(e == LH_ERR_FORMAT);
    }
  }
  json_decref(reply);

  json_t *s = lh_json_text((const char *)data, size);
  CHECK(s && json_is_string(s));
  const char *out = json_string_value(s);
  size_t n = json_string_length(s);
  json_t *direct = json_stringn((const char *)data, size);
  if (direct) { /* valid UTF-8 goes through unchanged */
    CHECK(n == size && memcmp(out, data, size) == 0);
    json_decref(direct);
  } else { /* every input byte is kept or replaced: at most 3 output bytes for each */
    CHECK(n <= 3 * size && n >= 3);
  }
  json_decref(s);
  return 0;
}
