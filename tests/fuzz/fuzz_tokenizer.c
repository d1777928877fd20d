/* libFuzzer target for tokenizer.json and encoding: the input is a tokenizer.json, a NUL byte,
 * then text. Errors must name the source; an accepted tokenizer encodes the text to ids inside
 * its vocabulary, decodes them (each of the first ids alone also through lh_tokenizer_token_bytes
 * into a buffer of exactly its size plus one), and a byte-level tokenizer gives back exactly the
 * text (its NFC form, stable under a second round trip, when it normalizes). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/tokenizer/tok_internal.h"

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz_tokenizer: invariant failed: %s (line %d)\n", #cond, __LINE__);        \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

/* decode(encode(text)); NULL when encoding is refused (an unknown character without unk). */
static char *round_trip(const lh_tokenizer *t, const char *text, size_t len, bool special,
                        size_t *out_len, bool *used_unk) {
  int32_t *ids = NULL;
  size_t n = 0;
  lh_err e = lh_tokenizer_encode(t, text, len, special, &ids, &n);
  if (e != LH_ERR_OK) {
    CHECK(e == LH_ERR_NOTFOUND && !t->byte_level && t->unk_id < 0);
    CHECK(strncmp(lh_last_error(), "fuzz", 4) == 0);
    CHECK(ids == NULL);
    return NULL;
  }
  *used_unk = false;
  for (size_t i = 0; i < n; i++) {
    CHECK(ids[i] >= 0 && ids[i] < lh_tokenizer_vocab_size(t));
    CHECK(lh_tokenizer_token(t, ids[i]) != NULL);
    *used_unk |= ids[i] == t->unk_id;
  }
  /* the first tokens' bytes, alone, fit in exactly one byte more than they take */
  for (size_t i = 0; i < n && i < 16; i++) {
    char *one = NULL;
    size_t one_len = 0;
    CHECK(lh_tokenizer_decode(t, &ids[i], 1, false, &one, &one_len) == LH_ERR_OK);
    char *buf = malloc(one_len + 1);
    CHECK(buf);
    CHECK(lh_tokenizer_token_bytes(t, ids[i], false, buf, one_len + 1) == (long)one_len);
    CHECK(memcmp(buf, one, one_len) == 0);
    CHECK(one_len == 0 || lh_tokenizer_token_bytes(t, ids[i], false, buf, one_len) == -1);
    free(buf);
    free(one);
  }
  char *back = NULL;
  CHECK(lh_tokenizer_decode(t, ids, n, false, &back, out_len) == LH_ERR_OK);
  CHECK(back[*out_len] == '\0');
  char *skipped = NULL;
  size_t skipped_len = 0;
  CHECK(lh_tokenizer_decode(t, ids, n, true, &skipped, &skipped_len) == LH_ERR_OK);
  CHECK(skipped_len <= *out_len || t->dec == LH__TOK_DEC_JOIN);
  free(skipped);
  free(ids);
  return back;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  size_t json_len = nul ? (size_t)(nul - data) : size;
  const char *text = nul ? (const char *)nul + 1 : "";
  size_t text_len = nul ? size - json_len - 1 : 0;

  lh_tokenizer *t = NULL;
  lh_err err = lh_tokenizer_parse((const char *)data, json_len, "fuzz", &t);
  if (err != LH_ERR_OK) {
    CHECK(t == NULL);
    CHECK(strncmp(lh_last_error(), "fuzz: ", 6) == 0);
    return 0;
  }
  CHECK(lh_tokenizer_vocab_size(t) > 0);
  for (int special = 0; special < 2; special++) {
    size_t n1 = 0;
    bool unk = false;
    char *once = round_trip(t, text, text_len, special, &n1, &unk);
    if (!once) continue;
    bool exact =
        t->byte_level ? t->dec == LH__TOK_DEC_BYTELEVEL : t->dec == LH__TOK_DEC_FUSE && !unk;
    if (exact && !t->nfc) {
      CHECK(n1 == text_len && memcmp(once, text, n1) == 0);
    } else if (exact) {
      size_t n2 = 0;
      char *twice = round_trip(t, once, n1, special, &n2, &unk);
      CHECK(twice && n2 == n1 && memcmp(once, twice, n1) == 0);
      free(twice);
    }
    free(once);
  }
  lh_tokenizer_free(t);
  return 0;
}
