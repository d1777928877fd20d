/* The model card: README.md of an export. */
#include <stdlib.h>

#include "longhaul/export.h"

struct lh_card {
  char *name;
};
lh_err lh_card_gather(const lh_card_opts *o, lh_card **out) {
  (void)o;
  *out = lh_xcalloc(1, sizeof **out);
  (*out)->name = lh_xstrdup("model");
  return LH_ERR_OK;
}
const char *lh_card_name(const lh_card *c) {
  return c->name;
}
lh_err lh_card_write(const lh_card *c, const char *gguf_file, const char *path) {
  (void)c;
  (void)gguf_file;
  return lh_file_write_atomic(path, "# model\n", 8);
}
void lh_card_free(lh_card *c) {
  if (!c) return;
  free(c->name);
  free(c);
}
