/* longhaul sync, internal: helpers shared by the module's files (hex digits, libsodium start). */
#ifndef LONGHAUL_SYNC_IMPL_H
#define LONGHAUL_SYNC_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

/* Lowercase hex of n bytes into out (2n digits and a NUL). */
void lh__sync_hex(const uint8_t *bytes, size_t n, char *out);
/* Decodes exactly 2n lowercase hex digits of text[0..len) into out. On a wrong length or a
 * character that is not a lowercase hex digit returns LH_ERR_FORMAT with "WHAT: ..." saying
 * which (the offset is counted from `base`, the offset of text in a larger input). */
lh_err lh__sync_unhex(const char *text, size_t len, uint8_t *out, size_t n, const char *what,
                      const char *field, size_t base);
/* sodium_init, or abort: libsodium cannot fail to start on a supported system. */
void lh__sync_sodium(void);

#endif
