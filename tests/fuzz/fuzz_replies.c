/* libFuzzer target for the small JSON messages of the networked protocol that have no other
 * target (node.h): any bytes as a worker's registration body (server side) and as an error
 * reply of the server (worker side: the code and server_time_ms it reads). A registration that
 * parses gives a NUL-free name and a hardware object that parses again to the same text; an
 * error reply gives a code that fits its buffer and a clock of -1 or more. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/node.h"

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *name = NULL, *hw = NULL;
  if (lh_node_register_parse(data, size, &name, &hw) == LH_ERR_OK) {
    CHECK(name && strlen(name) < size + 1);
    if (hw) {
      json_t *o = json_loads(hw, 0, NULL);
      CHECK(json_is_object(o));
      char *again = json_dumps(o, JSON_COMPACT);
      CHECK(again && !strcmp(again, hw));
      free(again);
      json_decref(o);
    }
  } else {
    CHECK(!name && !hw);
  }
  free(name);
  free(hw);
  char code[16];
  memset(code, 'x', sizeof code);
  int64_t t = -2;
  lh_node_error_parse(data, size, code, sizeof code, &t);
  CHECK(memchr(code, '\0', sizeof code) != NULL);
  CHECK(t >= -1);
  lh_node_error_parse(data, size, code, 1, &t);
  CHECK(code[0] == '\0');
  return 0;
}
