/* longhaul tokenizer: byte-level BPE read from a Hugging Face tokenizer.json (GPT-2, Llama-3,
 * Qwen2/Qwen3 pre-tokenizers, added and special tokens), and the character-level tokenizer of
 * the built-in tasks, which is stored as a tokenizer.json too so every model directory is
 * self-describing. A tokenizer is immutable after loading and safe to share between threads. */
#ifndef LONGHAUL_TOKENIZER_H
#define LONGHAUL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

typedef struct lh_tokenizer lh_tokenizer;

#define LH_TOKENIZER_MAX_FILE  (64u << 20) /* bytes of tokenizer.json */
#define LH_TOKENIZER_MAX_VOCAB (1 << 22)
/* JSON objects and arrays, and brackets and separators in all, in a tokenizer.json (Qwen3's:
 * 151k and 0.8M): checked before the file is parsed, they keep the parse to about 1 GB of memory
 * whatever the file holds (lh_json_check_cost; 1.0 GB of RSS at both limits). */
#define LH_TOKENIZER_MAX_JSON_OPEN   (1u << 21)
#define LH_TOKENIZER_MAX_JSON_TOKENS (1u << 24)
/* Bytes of one added token's content (those of Qwen3 and Llama-3 are at most 30); a longer one
 * is refused with LH_ERR_LIMIT. It bounds the memory of the added-token trie and the work of
 * matching added tokens at each byte of the text: at most this many trie steps, each a scan of
 * up to 256 children (a tokenizer.json crafted for it costs ~150 us a byte; real ones cost
 * a step or two). */
#define LH_TOKENIZER_MAX_ADDED 1024

/* Reads a tokenizer.json. Errors name the file and the field ("tokenizer.json: model.merges[12]:
 * expected "a b" or ["a", "b"], found integer"). Sizes beyond the limits above give LH_ERR_LIMIT.
 * Unsupported features (another model type, an unknown pre-tokenizer pattern, a normalizer other
 * than NFC or none) give LH_ERR_UNSUPPORTED. The post_processor is not read: encoding never
 * adds tokens the text does not hold (no automatic bos, as Hugging Face with
 * add_special_tokens=False, which is how verl and prime-rl encode chat-formatted prompts); a
 * prompt that wants <|begin_of_text|> spells it, and special-token strings are recognised. */
lh_err lh_tokenizer_load(const char *path, lh_tokenizer **out);
/* The same from text in memory; `what` names the source in messages. */
lh_err lh_tokenizer_parse(const char *json, size_t len, const char *what, lh_tokenizer **out);
void lh_tokenizer_free(lh_tokenizer *t);

/* One more than the largest token id (vocabulary and added tokens). */
int lh_tokenizer_vocab_size(const lh_tokenizer *t);
/* The token's string as stored in the vocabulary (byte-level form), or NULL. */
const char *lh_tokenizer_token(const lh_tokenizer *t, int32_t id);
/* Id of an exact vocabulary or added-token string, or -1. */
int32_t lh_tokenizer_find(const lh_tokenizer *t, const char *token);
/* Whether the id is a special added token (e.g. <|im_end|>). */
bool lh_tokenizer_is_special(const lh_tokenizer *t, int32_t id);

/* What another format needs to re-create the tokenizer (the GGUF export): */
/* Whether the id is an added token (special or not: Qwen3's <think> is added, not special). */
bool lh_tokenizer_is_added(const lh_tokenizer *t, int32_t id);
/* Whether BPE runs over bytes mapped to unicode (a ByteLevel pre-tokenizer: GPT-2, Llama-3,
 * Qwen); false for the chars tokenizer, whose vocabulary holds the characters themselves. */
bool lh_tokenizer_byte_level(const lh_tokenizer *t);
/* The pre-tokenizer's split pattern: "gpt2", "llama3", "qwen2", or "none" (the text between
 * added tokens is one piece). */
const char *lh_tokenizer_pretokenizer(const lh_tokenizer *t);
/* The merges in rank order (a pair listed twice appears once, at its last rank, as Hugging
 * Face's map keeps it): left[i] and right[i] are the ids of merge i's parts. Returns the count;
 * writes at most cap pairs (call with cap 0 to count). */
size_t lh_tokenizer_merges(const lh_tokenizer *t, int32_t *left, int32_t *right, size_t cap);
/* The GPT-2 byte-to-unicode map a byte-level vocabulary spells bytes with: the code point that
 * stands for byte b. */
uint32_t lh_tokenizer_byte_char(uint8_t b);

/* Encodes UTF-8 text. With allow_special, special tokens that appear verbatim in the text become
 * their ids; without it they are encoded as ordinary text (added tokens that are not special,
 * such as Qwen3's <think>, are always recognised, as in Hugging Face). Added tokens are matched
 * leftmost-longest, as in Hugging Face those with normalized: false first, then those with
 * normalized: true in the text between them. Invalid UTF-8 is encoded byte by byte (byte-level
 * BPE can represent any bytes). *ids is malloc'd; the caller frees it. */
lh_err lh_tokenizer_encode(const lh_tokenizer *t, const char *text, size_t len, bool allow_special,
                           int32_t **ids, size_t *n);
/* Decodes ids to bytes (not necessarily valid UTF-8 if cut mid-character). An id the tokenizer
 * does not have decodes to nothing, as in Hugging Face (a model's vocab_size may be padded past
 * its tokenizer, as Qwen's is); a negative id gives LH_ERR_INVAL. skip_special leaves special
 * tokens out. *text is malloc'd and
 * NUL-terminated; *len excludes the NUL. */
lh_err lh_tokenizer_decode(const lh_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                           char **text, size_t *len);
/* The bytes of one token, exactly what lh_tokenizer_decode of that id alone gives, written to
 * buf (cap bytes; no NUL is added, one byte of room is kept for it). Returns the byte count (0
 * for a special token with skip_special, and for an id past the vocabulary, which decodes to
 * nothing), or -1 for a negative id or when the bytes do not fit in cap - 1. Allocates
 * nothing. */
long lh_tokenizer_token_bytes(const lh_tokenizer *t, int32_t id, bool skip_special, char *buf,
                              size_t cap);

/* The character-level tokenizer of the built-in tasks as tokenizer.json text (malloc'd):
 * special tokens <|pad|> = 0, <|bos|> = 1, <|eos|> = 2, then one token per printable ASCII
 * character and "\n". */
char *lh_tokenizer_chars_json(void);

#endif
