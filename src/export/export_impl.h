/* Internals shared by the files of src/export (not visible outside the module). */
#ifndef LONGHAUL_EXPORT_IMPL_H
#define LONGHAUL_EXPORT_IMPL_H

#include <stdbool.h>

#include "longhaul/base.h"
#include "longhaul/tokenizer.h"

/* The Jinja chat template of the tokenizer's chat format: ChatML (<|im_start|>, <|im_end|>:
 * Qwen) or Llama-3's header tokens; NULL for a tokenizer without one (chars). Static text. */
const char *lh__export_chat_template(const lh_tokenizer *t);
/* LH_ERR_INVAL "PATH exists (pass --force to replace it)" when path exists and !force. */
lh_err lh__export_refuse_existing(const char *path, bool force);
/* Loads DIR/tokenizer.json (required: "DIR: no tokenizer.json; an export needs the model's
 * tokenizer"). */
lh_err lh__export_tokenizer(const char *dir, lh_tokenizer **out);

#endif
