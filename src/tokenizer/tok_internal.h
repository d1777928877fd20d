/* Tokenizer internals shared by the files of src/tokenizer: the loaded tokenizer's layout, the
 * generated Unicode tables (unicode_tables.c), UTF-8 decoding, NFC and the pre-tokenizer
 * matchers. Nothing here is visible outside the module. */
#ifndef LONGHAUL_TOK_INTERNAL_H
#define LONGHAUL_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/tokenizer.h"

/* ---------------------------------------------------------------- Unicode properties */

/* Flags of a code point (the generator script writes the same values). */
#define LH__TOK_LETTER 1  /* General_Category L* */
#define LH__TOK_NUMBER 2  /* General_Category N* */
#define LH__TOK_SPACE  4  /* White_Space */
#define LH__TOK_DECOMP 8  /* has a canonical decomposition (Hangul syllables too) */
#define LH__TOK_INERT  16 /* ccc 0, no decomposition, never the second of a composition */

/* Bytes of invalid UTF-8 decode to LH__TOK_RAW_BASE + byte: no class, inert for NFC. */
#define LH__TOK_RAW_BASE 0x110000u

typedef struct lh__tok_uprop {
  uint8_t ccc;   /* canonical combining class */
  uint8_t flags; /* LH__TOK_* */
} lh__tok_uprop;

typedef struct lh__tok_decomp {
  uint32_t cp;
  uint16_t off; /* into lh__tok_decomp_pool */
  uint8_t len;  /* 1..4 code points, fully expanded */
} lh__tok_decomp;

typedef struct lh__tok_comp {
  uint32_t first, second, composite;
} lh__tok_comp;

extern const char lh__tok_unicode_version[];
extern const lh__tok_uprop lh__tok_uprops[];
extern const uint16_t lh__tok_ustage1[]; /* (0x110000 / 256) block of each 256 code points */
extern const uint8_t lh__tok_ustage2[];  /* (blocks, 256) index into lh__tok_uprops */
extern const lh__tok_decomp lh__tok_decomps[];
extern const size_t lh__tok_n_decomps;
extern const uint32_t lh__tok_decomp_pool[];
extern const lh__tok_comp lh__tok_comps[]; /* sorted by (first, second) */
extern const size_t lh__tok_n_comps;

static inline lh__tok_uprop lh__tok_uprop_of(uint32_t cp) {
  if (cp >= 0x110000u) return (lh__tok_uprop){0, LH__TOK_INERT};
  return lh__tok_uprops[lh__tok_ustage2[(size_t)lh__tok_ustage1[cp >> 8] * 256 + (cp & 255)]];
}

/* Decodes one code point at s[0..n) (n >= 1) and returns its length in bytes. Anything that is
 * not well-formed UTF-8 (overlong, surrogate, > U+10FFFF, truncated) yields one byte as
 * LH__TOK_RAW_BASE + byte. */
size_t lh__tok_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
/* Writes cp as UTF-8 (a raw pseudo code point as its byte); returns the length (1..4). */
size_t lh__tok_utf8_put(uint32_t cp, uint8_t out[4]);

/* NFC of s[0..n) into *out (malloc'd, grown as needed; *cap is its size), *out_n bytes.
 * Invalid UTF-8 bytes pass through unchanged. Returns false when out of memory. */
bool lh__tok_nfc(const char *s, size_t n, char **out, size_t *cap, size_t *out_n);

/* ---------------------------------------------------------------- pre-tokenizer patterns */

typedef enum {
  LH__TOK_PRE_NONE = 0, /* the whole text between added tokens is one piece */
  LH__TOK_PRE_GPT2, /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
  LH__TOK_PRE_LLAMA3, /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
                         ?[^\s\p{L}\p{N}]+[\r\n]*|... */
  LH__TOK_PRE_QWEN2,  /* as Llama-3 with \p{N} instead of \p{N}{1,3} */
} lh__tok_pre;

/* The pattern whose regex source is exactly `regex`, or LH__TOK_PRE_NONE. */
lh__tok_pre lh__tok_pre_from_regex(const char *regex);
/* End (exclusive) of the match that starts at code point i < n of cp/fl (fl: LH__TOK_* flags
 * of each code point); always > i. */
size_t lh__tok_pre_match(lh__tok_pre pre, const uint32_t *cp, const uint8_t *fl, size_t n,
                         size_t i);

/* ---------------------------------------------------------------- the tokenizer */

typedef enum {
  LH__TOK_DEC_JOIN = 0,  /* no decoder: tokens joined by " " (as Hugging Face does) */
  LH__TOK_DEC_FUSE,      /* tokens concatenated */
  LH__TOK_DEC_BYTELEVEL, /* through the inverse GPT-2 byte-to-unicode map */
} lh__tok_dec;

#define LH__TOK_ID_SPECIAL 1
#define LH__TOK_ID_ADDED   2

typedef struct lh__tok_merge {
  uint64_t pair; /* left id << 32 | right id */
  uint32_t rank; /* UINT32_MAX: empty slot */
  int32_t id;    /* the merged token */
} lh__tok_merge;

/* Byte trie of the added tokens (leftmost-longest matching). */
typedef struct lh__tok_trie_node {
  int32_t child;   /* first child, -1 if none */
  int32_t sibling; /* next sibling, -1 if none */
  int32_t added;   /* index into added[] when a token ends here, else -1 */
  uint8_t byte;
} lh__tok_trie_node;

typedef struct lh__tok_added {
  int32_t id;
  bool special;
  bool normalized; /* matched in a second pass, in the text between the other added tokens */
} lh__tok_added;

struct lh_tokenizer {
  char *what;        /* source named in messages */
  int32_t n_ids;     /* one more than the largest id */
  char **tok;        /* (n_ids) each id's string (NUL-terminated), NULL for holes */
  uint32_t *tok_len; /* (n_ids) */
  uint8_t *id_flags; /* (n_ids) LH__TOK_ID_* */
  int32_t *vocab;    /* (vocab_mask + 1) open addressing over model.vocab ids, -1 empty */
  uint32_t vocab_mask;
  lh__tok_merge *merges; /* (merge_mask + 1) open addressing, or NULL without merges */
  uint32_t merge_mask;
  size_t n_merges;
  lh__tok_added *added; /* (n_added) */
  size_t n_added;
  size_t n_added_normalized; /* how many of them are normalized: true */
  lh__tok_trie_node *trie;   /* (n_trie) nodes below the root; the root is trie_root */
  size_t n_trie;
  int32_t trie_root[256]; /* child of the root for each first byte, -1 if none */
  bool nfc;
  lh__tok_pre pre;
  bool byte_level; /* ByteLevel pre-tokenizer: BPE runs over bytes mapped to unicode */
  lh__tok_dec dec;
  bool ignore_merges;
  bool fuse_unk;
  int32_t unk_id;            /* -1 without unk_token */
  int32_t byte_id[256];      /* byte-level: id of each byte's character, -1 if absent */
  int16_t byte_of_cp[0x144]; /* inverse byte map: code point -> byte, -1 */
  uint32_t cp_of_byte[256];  /* the GPT-2 byte-to-unicode map */
};

/* Id of an exact model.vocab string (len bytes), or -1. */
int32_t lh__tok_vocab_find(const lh_tokenizer *t, const char *s, size_t len);
uint64_t lh__tok_hash(const char *s, size_t len);
/* Slot hash of a merge pair (left id << 32 | right id). */
static inline uint64_t lh__tok_pair_hash(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  return x ^ (x >> 33);
}

#endif
