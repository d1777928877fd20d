/* Reads a Hugging Face tokenizer.json into an immutable lh_tokenizer: BPE model (vocab, merges
 * in either format), added tokens, NFC or no normalizer, the GPT-2/Llama-3/Qwen2 pre-tokenizers
 * and ByteLevel/Fuse decoders. Limits are checked before allocating; every error names the
 * source and the JSON path of the field, and unsupported features give LH_ERR_UNSUPPORTED. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

#define MAX_MERGES (LH_TOKENIZER_MAX_VOCAB * 2)

typedef struct loader {
  const char *what;
  lh_tokenizer *t;
  size_t trie_cap; /* nodes allocated at t->trie */
} loader;

static lh_err fail(const loader *L, lh_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static lh_err fail(const loader *L, lh_err code, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return lh_errorf(code, "%s: %s", L->what, msg);
}

/* A string quoted for a message, JSON-style, cut after about 48 bytes. */
static const char *quote(const char *s, size_t len, char *buf, size_t cap) {
  size_t o = 0;
  buf[o++] = '"';
  for (size_t i = 0; i < len && o + 12 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (i >= 48 && (c & 0xC0) != 0x80) {
      o += (size_t)snprintf(buf + o, cap - o, "...");
      break;
    }
    if (c == '"' || c == '\\')
      o += (size_t)snprintf(buf + o, cap - o, "\\%c", c);
    else if (c < 0x20 || c == 0x7F)
      o += (size_t)snprintf(buf + o, cap - o, "\\u%04x", c);
    else
      buf[o++] = (char)c;
  }
  buf[o++] = '"';
  buf[o] = '\0';
  return buf;
}
#define Q(s, b) quote((s), strlen(s), (b), sizeof(b))

uint64_t lh__tok_hash(const char *s, size_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++)
    h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

int32_t lh__tok_vocab_find(const lh_tokenizer *t, const char *s, size_t len) {
  uint32_t h = (uint32_t)lh__tok_hash(s, len) & t->vocab_mask;
  for (;; h = (h + 1) & t->vocab_mask) {
    int32_t id = t->vocab[h];
    if (id < 0) return -1;
    if (t->tok_len[id] == len && !memcmp(t->tok[id], s, len)) return id;
  }
}

static void vocab_insert(lh_tokenizer *t, int32_t id) {
  uint32_t h = (uint32_t)lh__tok_hash(t->tok[id], t->tok_len[id]) & t->vocab_mask;
  while (t->vocab[h] >= 0)
    h = (h + 1) & t->vocab_mask;
  t->vocab[h] = id;
}

static bool byte_prints(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t lh_tokenizer_byte_char(uint8_t b) {
  /* GPT-2: printable Latin-1 bytes map to themselves, the others to U+0100 onwards in order. */
  if (byte_prints(b)) return b;
  uint32_t next = 256;
  for (int c = 0; c < b; c++)
    next += !byte_prints(c);
  return next;
}

/* Fills cp_of_byte and byte_of_cp with the GPT-2 byte-to-unicode map. */
static void byte_map(lh_tokenizer *t) {
  for (int b = 0; b < 256; b++)
    t->cp_of_byte[b] = lh_tokenizer_byte_char((uint8_t)b);
  for (size_t c = 0; c < sizeof t->byte_of_cp / sizeof t->byte_of_cp[0]; c++)
    t->byte_of_cp[c] = -1;
  for (int b = 0; b < 256; b++)
    t->byte_of_cp[t->cp_of_byte[b]] = (int16_t)b;
}

/* ---------------------------------------------------------------- small field readers */

/* An optional boolean: absent or null gives def. */
static lh_err get_bool(const loader *L, const json_t *obj, const char *key, const char *path,
                       bool def, bool *out) {
  const json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return LH_ERR_OK;
  }
  if (!json_is_boolean(v))
    return fail(L, LH_ERR_FORMAT, "%s.%s: expected true or false, found %s", path, key,
                lh_json_type_name(v));
  *out = json_is_true(v);
  return LH_ERR_OK;
}

/* The "type" string of a component object at `path`, or an error. */
static lh_err get_type(const loader *L, const json_t *obj, const char *path, const char **out) {
  if (!json_is_object(obj))
    return fail(L, LH_ERR_FORMAT, "%s: expected an object or null, found %s", path,
                lh_json_type_name(obj));
  const json_t *ty = json_object_get(obj, "type");
  if (!json_is_string(ty))
    return fail(L, LH_ERR_FORMAT, "%s.type: expected a string, found %s", path,
                lh_json_type_name(ty));
  *out = json_string_value(ty);
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- model */

static lh_err check_id(const loader *L, const json_t *v, const char *path, const char *key,
                       int32_t *out) {
  char qb[128];
  if (!json_is_integer(v))
    return fail(L, LH_ERR_FORMAT, "%s[%s]: expected an integer id, found %s", path, Q(key, qb),
                lh_json_type_name(v));
  json_int_t id = json_integer_value(v);
  if (id < 0)
    return fail(L, LH_ERR_FORMAT, "%s[%s]: id %lld is negative", path, Q(key, qb), (long long)id);
  if (id >= LH_TOKENIZER_MAX_VOCAB)
    return fail(L, LH_ERR_LIMIT, "%s[%s]: id %lld is beyond the limit of %d tokens", path,
                Q(key, qb), (long long)id, LH_TOKENIZER_MAX_VOCAB);
  *out = (int32_t)id;
  return LH_ERR_OK;
}

/* Sizes the id tables from model.vocab and added_tokens, fills the strings. */
static lh_err load_vocab(const loader *L, const json_t *vocab, const json_t *added) {
  lh_tokenizer *t = L->t;
  char qa[128], qb[128];
  size_t nv = json_object_size(vocab);
  if (nv > LH_TOKENIZER_MAX_VOCAB)
    return fail(L, LH_ERR_LIMIT, "model.vocab: %zu tokens, more than the limit of %d", nv,
                LH_TOKENIZER_MAX_VOCAB);
  size_t na = added ? json_array_size(added) : 0;
  if (na > LH_TOKENIZER_MAX_VOCAB)
    return fail(L, LH_ERR_LIMIT, "added_tokens: %zu tokens, more than the limit of %d", na,
                LH_TOKENIZER_MAX_VOCAB);
  int32_t max_id = -1;
  const char *key;
  const json_t *v;
  lh_err e;
  json_object_foreach((json_t *)vocab, key, v) {
    int32_t id = 0;
    if ((e = check_id(L, v, "model.vocab", key, &id))) return e;
    if (id > max_id) max_id = id;
  }
  for (size_t i = 0; i < na; i++) {
    const json_t *a = json_array_get(added, i);
    if (!json_is_object(a))
      return fail(L, LH_ERR_FORMAT, "added_tokens[%zu]: expected an object, found %s", i,
                  lh_json_type_name(a));
    const json_t *jid = json_object_get(a, "id");
    const json_t *content = json_object_get(a, "content");
    if (!json_is_integer(jid))
      return fail(L, LH_ERR_FORMAT, "added_tokens[%zu].id: expected an integer, found %s", i,
                  lh_json_type_name(jid));
    if (json_integer_value(jid) < 0 || json_integer_value(jid) >= LH_TOKENIZER_MAX_VOCAB)
      return fail(L, json_integer_value(jid) < 0 ? LH_ERR_FORMAT : LH_ERR_LIMIT,
                  "added_tokens[%zu].id: %lld is outside [0, %d)", i,
                  (long long)json_integer_value(jid), LH_TOKENIZER_MAX_VOCAB);
    if (!json_is_string(content) || json_string_length(content) == 0)
      return fail(L, LH_ERR_FORMAT,
                  "added_tokens[%zu].content: expected a non-empty string, found %s", i,
                  json_is_string(content) ? "\"\"" : lh_json_type_name(content));
    if (json_string_length(content) > LH_TOKENIZER_MAX_ADDED)
      return fail(L, LH_ERR_LIMIT,
                  "added_tokens[%zu].content: %zu bytes, more than the limit of %d", i,
                  json_string_length(content), LH_TOKENIZER_MAX_ADDED);
    if ((int32_t)json_integer_value(jid) > max_id) max_id = (int32_t)json_integer_value(jid);
  }
  if (max_id < 0) return fail(L, LH_ERR_FORMAT, "model.vocab: empty, and no added_tokens");
  t->n_ids = max_id + 1;
  t->tok = calloc((size_t)t->n_ids, sizeof *t->tok);
  t->tok_len = calloc((size_t)t->n_ids, sizeof *t->tok_len);
  t->id_flags = calloc((size_t)t->n_ids, 1);
  uint32_t cap = 16;
  while (cap < nv * 2)
    cap *= 2;
  t->vocab = malloc(cap * sizeof *t->vocab);
  t->added = calloc(na ? na : 1, sizeof *t->added);
  if (!t->tok || !t->tok_len || !t->id_flags || !t->vocab || !t->added)
    return fail(L, LH_ERR_NOMEM, "out of memory for %d token ids", t->n_ids);
  t->vocab_mask = cap - 1;
  memset(t->vocab, 0xff, cap * sizeof *t->vocab);
  /* jansson keeps the strings alive as long as the document; they are copied here. */
  json_object_foreach((json_t *)vocab, key, v) {
    int32_t id = (int32_t)json_integer_value(v);
    if (t->tok[id])
      return fail(L, LH_ERR_FORMAT, "model.vocab[%s]: id %d is also %s", Q(key, qa), id,
                  Q(t->tok[id], qb));
    t->tok[id] = strdup(key);
    if (!t->tok[id]) return fail(L, LH_ERR_NOMEM, "out of memory copying model.vocab");
    t->tok_len[id] = (uint32_t)strlen(key);
    vocab_insert(t, id);
  }
  return LH_ERR_OK;
}

static lh_err split_merge(const loader *L, size_t i, const json_t *m, const char **a, size_t *al,
                          const char **b, size_t *bl) {
  if (json_is_string(m)) {
    const char *s = json_string_value(m);
    size_t n = json_string_length(m);
    const char *sp = memchr(s, ' ', n);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s))) {
      char qb[128];
      return fail(L, LH_ERR_FORMAT,
                  "model.merges[%zu]: expected \"a b\" (two tokens, one space), found %s", i,
                  quote(s, n, qb, sizeof qb));
    }
    *a = s, *al = (size_t)(sp - s), *b = sp + 1, *bl = n - *al - 1;
    return LH_ERR_OK;
  }
  if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
      json_is_string(json_array_get(m, 1))) {
    *a = json_string_value(json_array_get(m, 0)), *al = json_string_length(json_array_get(m, 0));
    *b = json_string_value(json_array_get(m, 1)), *bl = json_string_length(json_array_get(m, 1));
    return LH_ERR_OK;
  }
  return fail(L, LH_ERR_FORMAT, "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"], found %s",
              i, json_is_array(m) ? "another array" : lh_json_type_name(m));
}

static lh_err load_merges(const loader *L, const json_t *merges) {
  lh_tokenizer *t = L->t;
  if (!merges || json_is_null(merges)) return LH_ERR_OK;
  if (!json_is_array(merges))
    return fail(L, LH_ERR_FORMAT, "model.merges: expected an array, found %s",
                lh_json_type_name(merges));
  size_t n = json_array_size(merges);
  if (n > MAX_MERGES)
    return fail(L, LH_ERR_LIMIT, "model.merges: %zu merges, more than the limit of %d", n,
                MAX_MERGES);
  if (n == 0) return LH_ERR_OK;
  uint32_t cap = 16;
  while (cap < n + n / 2)
    cap *= 2;
  t->merges = malloc(cap * sizeof *t->merges);
  if (!t->merges) return fail(L, LH_ERR_NOMEM, "out of memory for %zu merges", n);
  t->merge_mask = cap - 1;
  for (uint32_t s = 0; s < cap; s++)
    t->merges[s].rank = UINT32_MAX;
  char *buf = NULL;
  size_t buf_cap = 0;
  lh_err e = LH_ERR_OK;
  char qa[128], qb[128];
  for (size_t i = 0; i < n && !e; i++) {
    const char *a = NULL, *b = NULL;
    size_t al = 0, bl = 0;
    if ((e = split_merge(L, i, json_array_get(merges, i), &a, &al, &b, &bl))) break;
    int32_t ia = lh__tok_vocab_find(t, a, al), ib = lh__tok_vocab_find(t, b, bl);
    if (ia < 0 || ib < 0) {
      e = fail(L, LH_ERR_FORMAT, "model.merges[%zu]: %s is not in model.vocab", i,
               ia < 0 ? quote(a, al, qa, sizeof qa) : quote(b, bl, qb, sizeof qb));
      break;
    }
    if (al + bl + 1 > buf_cap) {
      buf_cap = 2 * (al + bl + 1);
      char *nb = realloc(buf, buf_cap);
      if (!nb) {
        e = fail(L, LH_ERR_NOMEM, "out of memory reading model.merges");
        break;
      }
      buf = nb;
    }
    memcpy(buf, a, al);
    memcpy(buf + al, b, bl);
    int32_t id = lh__tok_vocab_find(t, buf, al + bl);
    if (id < 0) {
      e = fail(L, LH_ERR_FORMAT, "model.merges[%zu]: the merged token %s is not in model.vocab", i,
               quote(buf, al + bl, qa, sizeof qa));
      break;
    }
    uint64_t pair = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
    uint32_t h = (uint32_t)lh__tok_pair_hash(pair) & t->merge_mask;
    while (t->merges[h].rank != UINT32_MAX && t->merges[h].pair != pair)
      h = (h + 1) & t->merge_mask;
    if (t->merges[h].rank == UINT32_MAX) t->n_merges++;
    /* a repeated pair keeps its last rank, as Hugging Face's map does */
    t->merges[h] = (lh__tok_merge){.pair = pair, .rank = (uint32_t)i, .id = id};
  }
  free(buf);
  return e;
}

static lh_err load_model(const loader *L, const json_t *model, const json_t *added) {
  lh_tokenizer *t = L->t;
  char qb[128];
  lh_err e;
  if (!model) return fail(L, LH_ERR_FORMAT, "model: missing");
  const char *type = NULL;
  if ((e = get_type(L, model, "model", &type))) return e;
  if (strcmp(type, "BPE"))
    return fail(L, LH_ERR_UNSUPPORTED, "model.type: %s is not supported (only \"BPE\")",
                Q(type, qb));
  const json_t *dropout = json_object_get(model, "dropout");
  if (dropout && !json_is_null(dropout))
    return fail(L, LH_ERR_UNSUPPORTED, "model.dropout: only null is supported, found %s",
                lh_json_type_name(dropout));
  bool byte_fallback = false;
  if ((e = get_bool(L, model, "byte_fallback", "model", false, &byte_fallback))) return e;
  if (byte_fallback)
    return fail(L, LH_ERR_UNSUPPORTED, "model.byte_fallback: true is not supported");
  if ((e = get_bool(L, model, "ignore_merges", "model", false, &t->ignore_merges))) return e;
  if ((e = get_bool(L, model, "fuse_unk", "model", false, &t->fuse_unk))) return e;
  static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int k = 0; k < 2; k++) {
    const json_t *v = json_object_get(model, affixes[k]);
    if (!v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0)) continue;
    if (!json_is_string(v))
      return fail(L, LH_ERR_FORMAT, "model.%s: expected a string or null, found %s", affixes[k],
                  lh_json_type_name(v));
    return fail(L, LH_ERR_UNSUPPORTED, "model.%s: %s is not supported (only null or \"\")",
                affixes[k], Q(json_string_value(v), qb));
  }
  const json_t *vocab = json_object_get(model, "vocab");
  if (!json_is_object(vocab))
    return fail(L, LH_ERR_FORMAT, "model.vocab: expected an object of token -> id, found %s",
                lh_json_type_name(vocab));
  if ((e = load_vocab(L, vocab, added))) return e;
  const json_t *unk = json_object_get(model, "unk_token");
  t->unk_id = -1;
  if (unk && !json_is_null(unk)) {
    if (!json_is_string(unk))
      return fail(L, LH_ERR_FORMAT, "model.unk_token: expected a string or null, found %s",
                  lh_json_type_name(unk));
    t->unk_id = lh__tok_vocab_find(t, json_string_value(unk), json_string_length(unk));
    if (t->unk_id < 0)
      return fail(L, LH_ERR_FORMAT, "model.unk_token: %s is not in model.vocab",
                  Q(json_string_value(unk), qb));
  }
  return load_merges(L, json_object_get(model, "merges"));
}

/* ---------------------------------------------------------------- added tokens */

/* Adds an added token's content (at most LH_TOKENIZER_MAX_ADDED bytes) to the trie, which grows
 * by doubling. */
static lh_err trie_add(loader *L, const char *s, size_t len, int32_t added_index) {
  lh_tokenizer *t = L->t;
  int32_t node = -1; /* -1: the root, whose children are trie_root[] */
  for (size_t i = 0; i < len; i++) {
    uint8_t c = (uint8_t)s[i];
    int32_t child = node < 0 ? t->trie_root[c] : t->trie[node].child;
    if (node >= 0)
      while (child >= 0 && t->trie[child].byte != c)
        child = t->trie[child].sibling;
    if (child < 0) {
      if (t->n_trie == L->trie_cap) {
        size_t cap = L->trie_cap ? 2 * L->trie_cap : 256;
        lh__tok_trie_node *nt = realloc(t->trie, cap * sizeof *nt);
        if (!nt) return fail(L, LH_ERR_NOMEM, "out of memory for added_tokens");
        t->trie = nt, L->trie_cap = cap;
      }
      child = (int32_t)t->n_trie++;
      t->trie[child] = (lh__tok_trie_node){.child = -1, .sibling = -1, .added = -1, .byte = c};
      if (node < 0) {
        t->trie_root[c] = child;
      } else {
        t->trie[child].sibling = t->trie[node].child;
        t->trie[node].child = child;
      }
    }
    node = child;
  }
  if (t->trie[node].added >= 0) {
    char qb[128];
    return fail(L, LH_ERR_FORMAT, "added_tokens[%d].content: %s is also added_tokens[%d]",
                added_index, quote(s, len, qb, sizeof qb), t->trie[node].added);
  }
  t->trie[node].added = added_index;
  return LH_ERR_OK;
}

static lh_err load_added(loader *L, const json_t *added, bool nfc) {
  lh_tokenizer *t = L->t;
  char qa[128], qb[128];
  lh_err e;
  size_t n = json_array_size(added); /* each entry's shape was checked by load_vocab */
  for (size_t i = 0; i < n; i++) {
    const json_t *a = json_array_get(added, i);
    int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
    const json_t *jc = json_object_get(a, "content");
    const char *content = json_string_value(jc);
    size_t len = json_string_length(jc);
    char path[64];
    snprintf(path, sizeof path, "added_tokens[%zu]", i);
    bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
    if ((e = get_bool(L, a, "special", path, false, &special)) ||
        (e = get_bool(L, a, "single_word", path, false, &single_word)) ||
        (e = get_bool(L, a, "lstrip", path, false, &lstrip)) ||
        (e = get_bool(L, a, "rstrip", path, false, &rstrip)) ||
        (e = get_bool(L, a, "normalized", path, !special, &normalized)))
      return e;
    if (single_word || lstrip || rstrip)
      return fail(L, LH_ERR_UNSUPPORTED, "%s: token %s sets %s, which is not supported", path,
                  quote(content, len, qa, sizeof qa),
                  single_word ? "single_word"
                  : lstrip    ? "lstrip"
                              : "rstrip");
    if (normalized && nfc)
      return fail(L, LH_ERR_UNSUPPORTED,
                  "%s: token %s is matched after normalization (normalized: true) under an NFC "
                  "normalizer, which is not supported",
                  path, quote(content, len, qa, sizeof qa));
    int32_t in_vocab = lh__tok_vocab_find(t, content, len);
    if (in_vocab >= 0 && in_vocab != id)
      return fail(L, LH_ERR_FORMAT, "%s: token %s has id %d here but %d in model.vocab", path,
                  quote(content, len, qa, sizeof qa), id, in_vocab);
    if (t->tok[id] && (t->tok_len[id] != len || memcmp(t->tok[id], content, len)))
      return fail(L, LH_ERR_FORMAT, "%s: id %d is %s here but %s elsewhere", path, id,
                  quote(content, len, qa, sizeof qa), Q(t->tok[id], qb));
    if (!t->tok[id]) {
      t->tok[id] = strdup(content);
      if (!t->tok[id]) return fail(L, LH_ERR_NOMEM, "out of memory copying added_tokens");
      t->tok_len[id] = (uint32_t)len;
    }
    t->id_flags[id] |= LH__TOK_ID_ADDED | (special ? LH__TOK_ID_SPECIAL : 0);
    t->added[i] = (lh__tok_added){.id = id, .special = special, .normalized = normalized};
    t->n_added_normalized += normalized;
    if ((e = trie_add(L, content, len, (int32_t)i))) return e;
  }
  t->n_added = n;
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- pipeline components */

static lh_err load_normalizer(const loader *L, const json_t *norm) {
  char qb[128];
  const char *type = NULL;
  lh_err e;
  if (!norm || json_is_null(norm)) return LH_ERR_OK;
  if ((e = get_type(L, norm, "normalizer", &type))) return e;
  if (strcmp(type, "NFC"))
    return fail(L, LH_ERR_UNSUPPORTED, "normalizer.type: %s is not supported (only NFC or null)",
                Q(type, qb));
  L->t->nfc = true;
  return LH_ERR_OK;
}

/* A ByteLevel pre-tokenizer at `path`: add_prefix_space must be false; use_regex as given. */
static lh_err load_byte_level(const loader *L, const json_t *p, const char *path, bool *use_regex) {
  bool prefix = false;
  lh_err e;
  if ((e = get_bool(L, p, "add_prefix_space", path, true, &prefix))) return e;
  if (prefix)
    return fail(L, LH_ERR_UNSUPPORTED, "%s.add_prefix_space: true is not supported", path);
  if ((e = get_bool(L, p, "use_regex", path, true, use_regex))) return e;
  L->t->byte_level = true;
  return LH_ERR_OK;
}

static lh_err load_split(const loader *L, const json_t *p, const char *path) {
  char qb[128];
  const json_t *pat = json_object_get(p, "pattern");
  const json_t *re = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
  if (json_is_object(pat) && json_is_string(json_object_get(pat, "String")))
    return fail(L, LH_ERR_UNSUPPORTED, "%s.pattern: String patterns are not supported", path);
  if (!json_is_string(re))
    return fail(L, LH_ERR_FORMAT, "%s.pattern: expected {\"Regex\": \"...\"}, found %s", path,
                json_is_object(pat) ? "another object" : lh_json_type_name(pat));
  const json_t *beh = json_object_get(p, "behavior");
  if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated"))
    return fail(L, json_is_string(beh) ? LH_ERR_UNSUPPORTED : LH_ERR_FORMAT,
                "%s.behavior: only \"Isolated\" is supported, found %s", path,
                json_is_string(beh) ? Q(json_string_value(beh), qb) : lh_json_type_name(beh));
  bool invert = false;
  lh_err e;
  if ((e = get_bool(L, p, "invert", path, false, &invert))) return e;
  if (invert) return fail(L, LH_ERR_UNSUPPORTED, "%s.invert: true is not supported", path);
  L->t->pre = lh__tok_pre_from_regex(json_string_value(re));
  if (L->t->pre == LH__TOK_PRE_NONE)
    return fail(L, LH_ERR_UNSUPPORTED,
                "%s.pattern.Regex: unknown pattern %s (known: the GPT-2, Llama-3 and Qwen2 "
                "patterns)",
                path, Q(json_string_value(re), qb));
  return LH_ERR_OK;
}

static lh_err load_pre_tokenizer(const loader *L, const json_t *pre) {
  char qb[128];
  const char *type = NULL;
  lh_err e;
  lh_tokenizer *t = L->t;
  if (!pre || json_is_null(pre)) return LH_ERR_OK;
  if ((e = get_type(L, pre, "pre_tokenizer", &type))) return e;
  if (!strcmp(type, "ByteLevel")) {
    bool use_regex = true;
    if ((e = load_byte_level(L, pre, "pre_tokenizer", &use_regex))) return e;
    t->pre = use_regex ? LH__TOK_PRE_GPT2 : LH__TOK_PRE_NONE;
    return LH_ERR_OK;
  }
  if (!strcmp(type, "Split")) return load_split(L, pre, "pre_tokenizer");
  if (strcmp(type, "Sequence"))
    return fail(L, LH_ERR_UNSUPPORTED,
                "pre_tokenizer.type: %s is not supported (ByteLevel, Split or Sequence)",
                Q(type, qb));
  const json_t *seq = json_object_get(pre, "pretokenizers");
  if (!json_is_array(seq))
    return fail(L, LH_ERR_FORMAT, "pre_tokenizer.pretokenizers: expected an array, found %s",
                lh_json_type_name(seq));
  size_t n = json_array_size(seq);
  const char *t0 = NULL, *t1 = NULL;
  if (n >= 1 && (e = get_type(L, json_array_get(seq, 0), "pre_tokenizer.pretokenizers[0]", &t0)))
    return e;
  if (n >= 2 && (e = get_type(L, json_array_get(seq, 1), "pre_tokenizer.pretokenizers[1]", &t1)))
    return e;
  if (n != 2 || strcmp(t0, "Split") || strcmp(t1, "ByteLevel"))
    return fail(L, LH_ERR_UNSUPPORTED,
                "pre_tokenizer.pretokenizers: only [Split, ByteLevel] is supported, found %zu "
                "entries%s%s%s%s",
                n, n ? " starting with " : "", n ? t0 : "", n > 1 ? ", " : "", n > 1 ? t1 : "");
  if ((e = load_split(L, json_array_get(seq, 0), "pre_tokenizer.pretokenizers[0]"))) return e;
  bool use_regex = true;
  if ((e = load_byte_level(L, json_array_get(seq, 1), "pre_tokenizer.pretokenizers[1]",
                           &use_regex)))
    return e;
  if (use_regex)
    return fail(L, LH_ERR_UNSUPPORTED,
                "pre_tokenizer.pretokenizers[1].use_regex: true after a Split is not supported");
  return LH_ERR_OK;
}

static lh_err load_decoder(const loader *L, const json_t *dec) {
  char qb[128];
  const char *type = NULL;
  lh_err e;
  if (!dec || json_is_null(dec)) {
    L->t->dec = LH__TOK_DEC_JOIN;
    return LH_ERR_OK;
  }
  if ((e = get_type(L, dec, "decoder", &type))) return e;
  if (!strcmp(type, "ByteLevel"))
    L->t->dec = LH__TOK_DEC_BYTELEVEL;
  else if (!strcmp(type, "Fuse"))
    L->t->dec = LH__TOK_DEC_FUSE;
  else
    return fail(L, LH_ERR_UNSUPPORTED,
                "decoder.type: %s is not supported (ByteLevel, Fuse or null)", Q(type, qb));
  return LH_ERR_OK;
}

static lh_err check_byte_tokens(const loader *L) {
  lh_tokenizer *t = L->t;
  for (int b = 0; b < 256; b++) {
    uint8_t enc[4];
    size_t n = lh__tok_utf8_put(t->cp_of_byte[b], enc);
    t->byte_id[b] = lh__tok_vocab_find(t, (const char *)enc, n);
    if (t->byte_id[b] < 0)
      return fail(L, LH_ERR_FORMAT,
                  "model.vocab: no token \"%.*s\" for byte 0x%02X, which the ByteLevel "
                  "pre-tokenizer needs",
                  (int)n, (const char *)enc, b);
  }
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- entry points */

void lh_tokenizer_free(lh_tokenizer *t) {
  if (!t) return;
  if (t->tok)
    for (int32_t i = 0; i < t->n_ids; i++)
      free(t->tok[i]);
  free(t->tok);
  free(t->tok_len);
  free(t->id_flags);
  free(t->vocab);
  free(t->merges);
  free(t->added);
  free(t->trie);
  free(t->what);
  free(t);
}

lh_err lh_tokenizer_parse(const char *json, size_t len, const char *what, lh_tokenizer **out) {
  *out = NULL;
  if (!what) what = "tokenizer.json";
  loader L = {.what = what};
  if (len > LH_TOKENIZER_MAX_FILE)
    return fail(&L, LH_ERR_LIMIT, "%zu bytes, more than the limit of %u", len,
                LH_TOKENIZER_MAX_FILE);
  lh_err cost =
      lh_json_check_cost(json, len, LH_TOKENIZER_MAX_JSON_OPEN, LH_TOKENIZER_MAX_JSON_TOKENS, what);
  if (cost) return cost;
  json_error_t jerr;
  json_t *root = json_loadb(json, len, 0, &jerr);
  if (!root && json_error_code(&jerr) == json_error_out_of_memory)
    return fail(&L, LH_ERR_NOMEM, "out of memory while parsing");
  if (!root)
    return fail(&L, LH_ERR_FORMAT, "line %d, column %d: invalid JSON: %s", jerr.line, jerr.column,
                jerr.text);
  lh_tokenizer *t = calloc(1, sizeof *t);
  lh_err e = LH_ERR_OK;
  if (!t || !(t->what = strdup(what))) {
    e = fail(&L, LH_ERR_NOMEM, "out of memory");
    goto out;
  }
  L.t = t;
  memset(t->trie_root, 0xff, sizeof t->trie_root);
  memset(t->byte_id, 0xff, sizeof t->byte_id);
  t->unk_id = -1;
  byte_map(t);
  if (!json_is_object(root)) {
    e = fail(&L, LH_ERR_FORMAT, "expected a JSON object at the top level, found %s",
             lh_json_type_name(root));
    goto out;
  }
  const json_t *added = json_object_get(root, "added_tokens");
  if (added && json_is_null(added)) added = NULL;
  if (added && !json_is_array(added)) {
    e = fail(&L, LH_ERR_FORMAT, "added_tokens: expected an array, found %s",
             lh_json_type_name(added));
    goto out;
  }
  if ((e = load_model(&L, json_object_get(root, "model"), added))) goto out;
  if ((e = load_normalizer(&L, json_object_get(root, "normalizer")))) goto out;
  if (added && (e = load_added(&L, added, t->nfc))) goto out;
  if ((e = load_pre_tokenizer(&L, json_object_get(root, "pre_tokenizer")))) goto out;
  if ((e = load_decoder(&L, json_object_get(root, "decoder")))) goto out;
  if (t->byte_level && (e = check_byte_tokens(&L))) goto out;
out:
  json_decref(root);
  if (e) {
    lh_tokenizer_free(t);
    return e;
  }
  *out = t;
  return LH_ERR_OK;
}

lh_err lh_tokenizer_load(const char *path, lh_tokenizer **out) {
  *out = NULL;
  char *text = NULL;
  size_t len = 0;
  lh_err e = lh_file_read(path, LH_TOKENIZER_MAX_FILE, &text, &len);
  if (e) return e;
  e = lh_tokenizer_parse(text, len, path, out);
  free(text);
  return e;
}
