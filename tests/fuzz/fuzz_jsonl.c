/* libFuzzer target for the jsonl line parser and the last-number scanner: any bytes as one line.
 * An accepted line gives a prompt and an answer (a real answer reads back as the same double);
 * errors carry a "FILE:LINE:" message. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/env.h"

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz_jsonl: invariant failed: %s (line %d)\n", #cond, __LINE__);            \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *prompt = NULL, *answer = NULL;
  lh_err e = lh_env_jsonl_parse_line((const char *)data, size, "in.jsonl", 42, &prompt, &answer);
  if (e == LH_ERR_OK) {
    CHECK(prompt != NULL && answer != NULL);
    double v;
    (void)lh_env_last_number(answer, strlen(answer), &v);
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    json_t *a = json_object_get(root, "answer");
    if (json_is_real(a)) CHECK(strtod(answer, NULL) == json_real_value(a));
    json_decref(root);
  } else {
    CHECK(prompt == NULL && answer == NULL);
    CHECK(strncmp(lh_last_error(), "in.jsonl:42: ", 13) == 0);
  }
  free(prompt);
  free(answer);
  double v;
  (void)lh_env_last_number((const char *)data, size, &v);
  return 0;
}
