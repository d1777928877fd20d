/* libFuzzer target for the model card's use of the one reader of `eval --json` files
 * (lh_card_eval_check over lh_report_eval_parse): any bytes either give a table of at least one row
 * (pass@k rows, then the mean reward) or an error; never a crash, a leak or an unbounded parse. */
#include <stdint.h>

#include "fuzz_util.h"
#include "longhaul/export.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 20) return 0;
  int rows = -1;
  lh_err e = lh_card_eval_check((const char *)data, size, "fuzz", &rows);
  CHECK(e ? rows == 0 : rows >= 1);
  return 0;
}
