/* Encoding and decoding with a loaded tokenizer: added tokens (leftmost-longest, those with
 * normalized: false first), NFC, pre-tokenization, then BPE per piece with a heap of candidate
 * merges (lowest rank, then leftmost first), as Hugging Face tokenizers does. All scratch memory
 * belongs to the call, so one tokenizer serves any number of threads. Also the character
 * tokenizer's tokenizer.json. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* ---------------------------------------------------------------- accessors */

int lh_tokenizer_vocab_size(const lh_tokenizer *t) {
  return t->n_ids;
}

const char *lh_tokenizer_token(const lh_tokenizer *t, int32_t id) {
  return id >= 0 && id < t->n_ids ? t->tok[id] : NULL;
}

int32_t lh_tokenizer_find(const lh_tokenizer *t, const char *token) {
  size_t len = strlen(token);
  int32_t id = lh__tok_vocab_find(t, token, len);
  if (id >= 0 || len == 0) return id;
  /* added tokens: walk the trie along the whole string */
  const uint8_t *u = (const uint8_t *)token;
  int32_t node = t->trie_root[u[0]];
  for (size_t i = 1; node >= 0 && i < len; i++)
    for (node = t->trie[node].child; node >= 0 && t->trie[node].byte != u[i];)
      node = t->trie[node].sibling;
  return node >= 0 && t->trie[node].added >= 0 ? t->added[t->trie[node].added].id : -1;
}

bool lh_tokenizer_is_special(const lh_tokenizer *t, int32_t id) {
  return id >= 0 && id < t->n_ids && (t->id_flags[id] & LH__TOK_ID_SPECIAL);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

bool lh_tokenizer_is_added(const lh_tokenizer *t, int32_t id) {
  return id >= 0 && id < t->n_ids && (t->id_flags[id] & LH__TOK_ID_ADDED);
}

bool lh_tokenizer_byte_level(const lh_tokenizer *t) {
  return t->byte_level;
}

const char *lh_tokenizer_pretokenizer(const lh_tokenizer *t) {
  switch (t->pre) {
  case LH__TOK_PRE_GPT2:
    return "gpt2";
  case LH__TOK_PRE_LLAMA3:
    return "llama3";
  case LH__TOK_PRE_QWEN2:
    return "qwen2";
  case LH__TOK_PRE_NONE:
    break;
  }
  return "none";
}

size_t lh_tokenizer_merges(const lh_tokenizer *t, int32_t *left, int32_t *right, size_t cap) {
  if (cap == 0 || !t->merges) return t->n_merges;
  /* ranks are positions in the merges list, with gaps where a pair was listed again: sort the
   * table's entries by rank */
  size_t slots = (size_t)t->merge_mask + 1, n = 0;
  uint64_t *by = lh_xmalloc((t->n_merges ? t->n_merges : 1) * sizeof *by);
  for (size_t s = 0; s < slots; s++)
    if (t->merges[s].rank != UINT32_MAX) by[n++] = (uint64_t)t->merges[s].rank << 32 | s;
  qsort(by, n, sizeof *by, cmp_u64);
  for (size_t i = 0; i < n && i < cap; i++) {
    const lh__tok_merge *m = &t->merges[(uint32_t)by[i]];
    left[i] = (int32_t)(m->pair >> 32);
    right[i] = (int32_t)(uint32_t)m->pair;
  }
  free(by);
  return n;
}

/* ---------------------------------------------------------------- scratch of one call */

/* A candidate merge in the heap: rank << 32 | position of its left symbol, so the smallest key
 * is the lowest rank and, among equal ranks, the leftmost. A rank names one pair, so an entry
 * is current exactly when the pair now at its position still has that rank. */
typedef uint64_t heap_entry;
typedef struct scratch {
  int32_t *out; /* the ids produced so far */
  size_t n_out, cap_out;
  char *norm; /* NFC of the current section */
  size_t cap_norm;
  uint32_t *cp; /* code points of the current section */
  uint8_t *fl;  /* their LH__TOK_* flags */
  uint8_t *cl;  /* their lengths in bytes (1..4) */
  size_t cap_cp;
  int32_t *sym; /* BPE symbols: token id, or -1 once merged into the left neighbour */
  int32_t *prev, *next;
  size_t cap_sym;
  heap_entry *heap;
  size_t n_heap, cap_heap;
  char *bl; /* a piece in byte-level form (ignore_merges lookups) */
  size_t cap_bl;
} scratch;

static void scratch_free(scratch *s) {
  free(s->out);
  free(s->norm);
  free(s->cp);
  free(s->fl);
  free(s->cl);
  free(s->sym);
  free(s->prev);
  free(s->next);
  free(s->heap);
  free(s->bl);
}

/* Grows *p to hold at least n elements of size sz (amortised doubling). */
static bool grow(void *pp, size_t *cap, size_t n, size_t sz) {
  if (n <= *cap) return true;
  size_t c = *cap ? *cap : 64;
  while (c < n)
    c *= 2;
  void *q;
  memcpy(&q, pp, sizeof q); /* pp is the address of a T* for any T */
  q = realloc(q, c * sz);
  if (!q) return false;
  memcpy(pp, &q, sizeof q);
  *cap = c;
  return true;
}

static bool push_id(scratch *s, int32_t id) {
  if (!grow(&s->out, &s->cap_out, s->n_out + 1, sizeof *s->out)) return false;
  s->out[s->n_out++] = id;
  return true;
}

/* ---------------------------------------------------------------- BPE */

static const lh__tok_merge *merge_find(const lh_tokenizer *t, int32_t a, int32_t b) {
  if (!t->merges) return NULL;
  uint64_t pair = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  for (uint32_t h = (uint32_t)lh__tok_pair_hash(pair) & t->merge_mask;;
       h = (h + 1) & t->merge_mask) {
    const lh__tok_merge *m = &t->merges[h];
    if (m->rank == UINT32_MAX) return NULL;
    if (m->pair == pair) return m;
  }
}

/* A 4-ary min-heap: fewer levels than a binary heap, each level's children in one cache line. */
static void heap_push(scratch *s, heap_entry e) {
  /* capacity is reserved by bpe(): at most n - 1 + 2 * merges entries ever exist */
  size_t i = s->n_heap++;
  while (i > 0) {
    size_t p = (i - 1) / 4;
    if (s->heap[p] <= e) break;
    s->heap[i] = s->heap[p];
    i = p;
  }
  s->heap[i] = e;
}

static heap_entry heap_pop(scratch *s) {
  heap_entry top = s->heap[0], last = s->heap[--s->n_heap];
  size_t i = 0, n = s->n_heap;
  for (;;) {
    size_t c = 4 * i + 1;
    if (c >= n) break;
    size_t end = c + 4 < n ? c + 4 : n, best = c;
    for (size_t k = c + 1; k < end; k++)
      if (s->heap[k] < s->heap[best]) best = k;
    if (s->heap[best] >= last) break;
    s->heap[i] = s->heap[best];
    i = best;
  }
  if (n) s->heap[i] = last;
  return top;
}

static void try_pair(const lh_tokenizer *t, scratch *s, int32_t left) {
  int32_t right = s->next[left];
  if (right < 0) return;
  const lh__tok_merge *m = merge_find(t, s->sym[left], s->sym[right]);
  if (m) heap_push(s, (uint64_t)m->rank << 32 | (uint32_t)left);
}

/* Merges the n symbols in s->sym (ids; unknown pieces already resolved) and appends the
 * result to s->out. */
static bool bpe(const lh_tokenizer *t, scratch *s, size_t n) {
  if (n == 0) return true;
  if (n == 1 || !t->merges) {
    if (!grow(&s->out, &s->cap_out, s->n_out + n, sizeof *s->out)) return false;
    memcpy(s->out + s->n_out, s->sym, n * sizeof *s->sym);
    s->n_out += n;
    return true;
  }
  if (!grow(&s->heap, &s->cap_heap, 3 * n, sizeof *s->heap)) return false;
  s->n_heap = 0;
  for (size_t i = 0; i < n; i++) {
    s->prev[i] = (int32_t)i - 1;
    s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  for (size_t i = 0; i + 1 < n; i++)
    try_pair(t, s, (int32_t)i);
  while (s->n_heap) {
    heap_entry top = heap_pop(s);
    int32_t l = (int32_t)(uint32_t)top;
    if (s->sym[l] < 0) continue; /* merged away */
    int32_t r = s->next[l];
    if (r < 0) continue;
    const lh__tok_merge *m = merge_find(t, s->sym[l], s->sym[r]);
    if (!m || m->rank != (uint32_t)(top >> 32)) continue; /* the pair at l changed */
    s->sym[l] = m->id;
    s->sym[r] = -1;
    s->next[l] = s->next[r];
    if (s->next[r] >= 0) s->prev[s->next[r]] = l;
    if (s->prev[l] >= 0) try_pair(t, s, s->prev[l]);
    try_pair(t, s, l);
  }
  for (int32_t i = 0; i >= 0; i = s->next[i])
    if (!push_id(s, s->sym[i])) return false;
  return true;
}

static bool reserve_sym(scratch *s, size_t n) {
  size_t c = s->cap_sym;
  if (!grow(&s->sym, &c, n, sizeof *s->sym)) return false;
  c = s->cap_sym;
  if (!grow(&s->prev, &c, n, sizeof *s->prev)) return false;
  c = s->cap_sym;
  if (!grow(&s->next, &c, n, sizeof *s->next)) return false;
  s->cap_sym = c;
  return true;
}

/* One pre-token of a byte-level tokenizer: bytes b[0..n). */
static lh_err encode_bytes(const lh_tokenizer *t, scratch *s, const uint8_t *b, size_t n) {
  if (n == 1) return push_id(s, t->byte_id[b[0]]) ? LH_ERR_OK : LH_ERR_NOMEM;
  if (t->ignore_merges) {
    if (!grow(&s->bl, &s->cap_bl, 2 * n, 1)) return LH_ERR_NOMEM;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
      m += lh__tok_utf8_put(t->cp_of_byte[b[i]], (uint8_t *)s->bl + m);
    int32_t id = lh__tok_vocab_find(t, s->bl, m);
    if (id >= 0) return push_id(s, id) ? LH_ERR_OK : LH_ERR_NOMEM;
  }
  if (!reserve_sym(s, n)) return LH_ERR_NOMEM;
  for (size_t i = 0; i < n; i++)
    s->sym[i] = t->byte_id[b[i]];
  return bpe(t, s, n) ? LH_ERR_OK : LH_ERR_NOMEM;
}

/* One pre-token of a character-level tokenizer: code points [a, b) of the section at text,
 * which start at byte o and end at byte end (section_off: the section's byte offset in the
 * caller's text, for messages). */
static lh_err encode_chars(const lh_tokenizer *t, scratch *s, const char *text, size_t a, size_t b,
                           size_t o, size_t end, size_t section_off) {
  if (t->ignore_merges) {
    int32_t id = lh__tok_vocab_find(t, text + o, end - o);
    if (id >= 0) return push_id(s, id) ? LH_ERR_OK : LH_ERR_NOMEM;
  }
  if (!reserve_sym(s, b - a)) return LH_ERR_NOMEM;
  size_t n = 0;
  bool after_unk = false; /* the last symbol stands for unknown characters */
  for (size_t k = a; k < b; o += s->cl[k++]) {
    size_t len = s->cl[k];
    int32_t id = lh__tok_vocab_find(t, text + o, len);
    bool unknown = id < 0;
    if (unknown) {
      if (t->unk_id < 0) {
        if (s->cp[k] >= LH__TOK_RAW_BASE)
          return lh_errorf(LH_ERR_NOTFOUND,
                           "%s: no token for byte 0x%02X (not UTF-8) at byte %zu of the text",
                           t->what, (unsigned)(s->cp[k] - LH__TOK_RAW_BASE), section_off + o);
        return lh_errorf(LH_ERR_NOTFOUND, "%s: no token for \"%.*s\" (U+%04X) at byte %zu of %s",
                         t->what, (int)len, text + o, (unsigned)s->cp[k], section_off + o,
                         t->nfc ? "the normalized text" : "the text");
      }
      /* fuse_unk joins consecutive unknown characters only, not an unknown character and a
       * known one whose token happens to be unk_token (as Hugging Face does) */
      if (t->fuse_unk && after_unk) continue;
      id = t->unk_id;
    }
    after_unk = unknown;
    s->sym[n++] = id;
  }
  return bpe(t, s, n) ? LH_ERR_OK : LH_ERR_NOMEM;
}

/* Text between added tokens: normalize, pre-tokenize, BPE each piece. */
static lh_err encode_section(const lh_tokenizer *t, scratch *s, const char *text, size_t len,
                             size_t section_off) {
  if (len == 0) return LH_ERR_OK;
  if (t->nfc) {
    size_t n_norm = 0;
    if (!lh__tok_nfc(text, len, &s->norm, &s->cap_norm, &n_norm)) return LH_ERR_NOMEM;
    text = s->norm;
    len = n_norm;
  }
  const uint8_t *u = (const uint8_t *)text;
  if (t->byte_level && t->pre == LH__TOK_PRE_NONE) return encode_bytes(t, s, u, len);
  /* code points, their classes and lengths (6 bytes of scratch per byte of text) */
  size_t c1 = s->cap_cp, c2 = s->cap_cp, c3 = s->cap_cp;
  if (!grow(&s->cp, &c1, len, sizeof *s->cp) || !grow(&s->fl, &c2, len, 1) ||
      !grow(&s->cl, &c3, len, 1))
    return LH_ERR_NOMEM;
  s->cap_cp = c1 < c2 ? (c1 < c3 ? c1 : c3) : (c2 < c3 ? c2 : c3);
  size_t n = 0;
  for (size_t i = 0; i < len; n++) {
    if (u[i] < 0x80) { /* ASCII fast path */
      s->cp[n] = u[i++];
      s->cl[n] = 1;
    } else {
      s->cl[n] = (uint8_t)lh__tok_utf8_next(u + i, len - i, &s->cp[n]);
      i += s->cl[n];
    }
    s->fl[n] = lh__tok_uprop_of(s->cp[n]).flags;
  }
  lh_err e = LH_ERR_OK;
  size_t pos = 0; /* byte offset of code point i */
  for (size_t i = 0; i < n && !e;) {
    size_t j = t->pre == LH__TOK_PRE_NONE ? n : lh__tok_pre_match(t->pre, s->cp, s->fl, n, i);
    size_t end = pos;
    for (size_t k = i; k < j; k++)
      end += s->cl[k];
    if (t->byte_level)
      e = encode_bytes(t, s, u + pos, end - pos);
    else
      e = encode_chars(t, s, text, i, j, pos, end, section_off);
    i = j;
    pos = end;
  }
  return e;
}

/* The longest added token allowed at text[0..n) whose normalized flag is `normalized`, or -1;
 * *len gets its length. */
static int32_t match_added(const lh_tokenizer *t, const uint8_t *text, size_t n, bool allow_special,
                           bool normalized, size_t *len) {
  int32_t node = t->trie_root[text[0]], best = -1;
  size_t i = 1;
  while (node >= 0) {
    int32_t a = t->trie[node].added;
    if (a >= 0 && t->added[a].normalized == normalized && (allow_special || !t->added[a].special)) {
      best = t->added[a].id;
      *len = i;
    }
    if (i == n) break;
    uint8_t c = text[i++];
    for (node = t->trie[node].child; node >= 0 && t->trie[node].byte != c;)
      node = t->trie[node].sibling;
  }
  return best;
}

static lh_err split_added(const lh_tokenizer *t, scratch *s, const char *text, size_t len,
                          size_t off, bool allow_special, bool normalized);

/* Text between the added tokens of one pass: after the first pass it is split again by the
 * second, after the second it is encoded. */
static lh_err between(const lh_tokenizer *t, scratch *s, const char *text, size_t len, size_t off,
                      bool allow_special, bool normalized) {
  if (normalized) return encode_section(t, s, text, len, off);
  return split_added(t, s, text, len, off, allow_special, true);
}

/* Splits text[0..len) (at byte off of the caller's text) at the added tokens whose normalized
 * flag is `normalized`, leftmost-longest, and encodes what lies between them. As in Hugging
 * Face, tokens with normalized: false split the text first, then those with normalized: true
 * split the pieces left (the loader refuses the latter under a normalizer, so both passes see
 * the text as written). */
static lh_err split_added(const lh_tokenizer *t, scratch *s, const char *text, size_t len,
                          size_t off, bool allow_special, bool normalized) {
  size_t n_pass = normalized ? t->n_added_normalized : t->n_added - t->n_added_normalized;
  if (n_pass == 0) return between(t, s, text, len, off, allow_special, normalized);
  const uint8_t *u = (const uint8_t *)text;
  lh_err e = LH_ERR_OK;
  size_t start = 0, i = 0;
  while (i < len && !e) {
    size_t mlen = 0;
    int32_t id = match_added(t, u + i, len - i, allow_special, normalized, &mlen);
    if (id < 0) {
      i++;
      continue;
    }
    e = between(t, s, text + start, i - start, off + start, allow_special, normalized);
    if (!e && !push_id(s, id)) e = LH_ERR_NOMEM;
    i += mlen;
    start = i;
  }
  if (e) return e;
  return between(t, s, text + start, len - start, off + start, allow_special, normalized);
}

lh_err lh_tokenizer_encode(const lh_tokenizer *t, const char *text, size_t len, bool allow_special,
                           int32_t **ids, size_t *n) {
  *ids = NULL;
  *n = 0;
  scratch s = {0};
  lh_err e = split_added(t, &s, text, len, 0, allow_special, false);
  if (e == LH_ERR_NOMEM) lh_errorf(e, "%s: out of memory encoding %zu bytes", t->what, len);
  if (!e) {
    *ids = s.out ? s.out : malloc(sizeof(int32_t));
    s.out = NULL;
    if (!*ids) e = lh_errorf(LH_ERR_NOMEM, "%s: out of memory", t->what);
    *n = s.n_out;
  }
  scratch_free(&s);
  return e;
}

/* ---------------------------------------------------------------- decoding */

/* Output bytes: a growing malloc'd buffer, or (fixed) a caller's buffer that never grows. */
typedef struct bytes {
  char *p;
  size_t n, cap;
  bool fixed;
} bytes;

static bool reserve(bytes *b, size_t k) {
  if (b->fixed) return b->n + k + 1 <= b->cap;
  return grow(&b->p, &b->cap, b->n + k + 1, 1);
}

static bool put(bytes *b, const void *src, size_t k) {
  if (!reserve(b, k)) return false;
  memcpy(b->p + b->n, src, k);
  b->n += k;
  return true;
}

/* ByteLevel: each character back to its byte; a token with a character outside the map
 * contributes its own UTF-8 bytes, as Hugging Face's decoder does. Room is reserved for the
 * bytes written (one per character), not for the token's length, so a fixed buffer that holds
 * them is enough. */
static bool put_byte_level(const lh_tokenizer *t, bytes *b, const char *tok, size_t len) {
  const uint8_t *u = (const uint8_t *)tok;
  size_t m = 0; /* characters, each one byte out */
  for (size_t i = 0; i < len; m++) {
    uint32_t cp;
    i += lh__tok_utf8_next(u + i, len - i, &cp);
    if (cp >= sizeof t->byte_of_cp / sizeof t->byte_of_cp[0] || t->byte_of_cp[cp] < 0)
      return put(b, tok, len);
  }
  if (!reserve(b, m)) return false;
  for (size_t i = 0; i < len;) {
    uint32_t cp;
    i += lh__tok_utf8_next(u + i, len - i, &cp);
    b->p[b->n++] = (char)t->byte_of_cp[cp];
  }
  return true;
}

/* Appends the bytes of a valid id; `first`: no separator before it (the Join decoder). */
static bool put_token(const lh_tokenizer *t, bytes *b, int32_t id, bool first) {
  const char *tok = t->tok[id];
  size_t tl = t->tok_len[id];
  switch (t->dec) {
  case LH__TOK_DEC_BYTELEVEL:
    /* added tokens are text as written (as transformers.js does), so they round-trip */
    return (t->id_flags[id] & LH__TOK_ID_ADDED) ? put(b, tok, tl) : put_byte_level(t, b, tok, tl);
  case LH__TOK_DEC_JOIN:
    return (first || put(b, " ", 1)) && put(b, tok, tl);
  case LH__TOK_DEC_FUSE:
    return put(b, tok, tl);
  }
  return false;
}

static bool valid_id(const lh_tokenizer *t, int32_t id) {
  return id >= 0 && id < t->n_ids && t->tok[id];
}

lh_err lh_tokenizer_decode(const lh_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                           char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  bytes b = {0};
  bool ok = grow(&b.p, &b.cap, 64, 1);
  size_t emitted = 0;
  for (size_t i = 0; i < n && ok; i++) {
    int32_t id = ids[i];
    if (id < 0) {
      free(b.p);
      return lh_errorf(LH_ERR_INVAL, "%s: token id %d at position %zu is negative", t->what, id, i);
    }
    /* an id the model has but the tokenizer does not (Qwen pads vocab_size past its tokenizer,
     * and a sampler may pick those rows) decodes to nothing, as in Hugging Face */
    if (!valid_id(t, id)) continue;
    if (skip_special && (t->id_flags[id] & LH__TOK_ID_SPECIAL)) continue;
    ok = put_token(t, &b, id, emitted == 0);
    emitted++;
  }
  if (!ok) {
    free(b.p);
    return lh_errorf(LH_ERR_NOMEM, "%s: out of memory decoding %zu tokens", t->what, n);
  }
  b.p[b.n] = '\0';
  *text = b.p;
  *len = b.n;
  return LH_ERR_OK;
}

long lh_tokenizer_token_bytes(const lh_tokenizer *t, int32_t id, bool skip_special, char *buf,
                              size_t cap) {
  if (id < 0) return -1;
  if (!valid_id(t, id) || (skip_special && (t->id_flags[id] & LH__TOK_ID_SPECIAL))) return 0;
  bytes b = {buf, 0, cap, true};
  return put_token(t, &b, id, true) ? (long)b.n : -1;
}

/* ---------------------------------------------------------------- the character tokenizer */

char *lh_tokenizer_chars_json(void) {
  static const char *const specials[] = {"<|pad|>", "<|bos|>", "<|eos|>"};
  json_t *root = json_object();
  json_t *added = json_array();
  json_t *vocab = json_object();
  int id = 0;
  for (; id < 3; id++) {
    json_t *a = json_object();
    json_object_set_new(a, "id", json_integer(id));
    json_object_set_new(a, "content", json_string(specials[id]));
    json_object_set_new(a, "single_word", json_false());
    json_object_set_new(a, "lstrip", json_false());
    json_object_set_new(a, "rstrip", json_false());
    json_object_set_new(a, "normalized", json_false());
    json_object_set_new(a, "special", json_true());
    json_array_append_new(added, a);
    json_object_set_new(vocab, specials[id], json_integer(id));
  }
  for (int c = ' '; c <= '~'; c++) {
    char s[2] = {(char)c, 0};
    json_object_set_new(vocab, s, json_integer(id++));
  }
  json_object_set_new(vocab, "\n", json_integer(id++));
  json_t *model = json_object();
  json_object_set_new(model, "type", json_string("BPE"));
  json_object_set_new(model, "dropout", json_null());
  json_object_set_new(model, "unk_token", json_null());
  json_object_set_new(model, "continuing_subword_prefix", json_null());
  json_object_set_new(model, "end_of_word_suffix", json_null());
  json_object_set_new(model, "fuse_unk", json_false());
  json_object_set_new(model, "byte_fallback", json_false());
  json_object_set_new(model, "ignore_merges", json_false());
  json_object_set_new(model, "vocab", vocab);
  json_object_set_new(model, "merges", json_array());
  json_t *decoder = json_object();
  json_object_set_new(decoder, "type", json_string("Fuse"));
  json_object_set_new(root, "version", json_string("1.0"));
  json_object_set_new(root, "truncation", json_null());
  json_object_set_new(root, "padding", json_null());
  json_object_set_new(root, "added_tokens", added);
  json_object_set_new(root, "normalizer", json_null());
  json_object_set_new(root, "pre_tokenizer", json_null());
  json_object_set_new(root, "post_processor", json_null());
  json_object_set_new(root, "decoder", decoder);
  json_object_set_new(root, "model", model);
  char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(root);
  LH_CHECK(text, "out of memory writing the character tokenizer");
  /* json_dumps memory is released with free() under jansson's default allocator */
  size_t n = strlen(text);
  char *out = lh_xmalloc(n + 2);
  memcpy(out, text, n);
  out[n] = '\n';
  out[n + 1] = '\0';
  free(text);
  return out;
}
