/* longhaul JSON helpers shared by every parser of outside JSON (config.json, safetensors
 * headers, API bodies): names for jansson value types, used in error messages. */
#include <jansson.h>

#include "longhaul/base.h"

const char *lh_json_type_name(const struct json_t *v) {
  if (!v) return "nothing";
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    return "object";
  case JSON_ARRAY:
    return "array";
  case JSON_STRING:
    return "string";
  case JSON_INTEGER:
    return "integer";
  case JSON_REAL:
    return "real";
  case JSON_TRUE:
  case JSON_FALSE:
    return "boolean";
  case JSON_NULL:
    return "null";
  }
  return "unknown";
}
