/* Tokenizer: every line of tests/fixtures/tokenizer/expected.jsonl (reference ids from
 * @lenml/tokenizers on the real Qwen3 and Llama-3 tokenizer.json) encodes to exactly those ids
 * and decodes back; arbitrary bytes round-trip through the byte-level tokenizers; NFC conforms
 * to NormalizationTest.txt when unicode-data is installed; the character tokenizer; malformed
 * tokenizer.json files give the right code and name the field; speed and thread safety. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dlfcn.h>
#include <jansson.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "longhaul/tokenizer.h"
#include "sanitized.h"

#define FIXTURES LH_SOURCE_DIR "/tests/fixtures/tokenizer"

static lh_tokenizer *qwen3, *llama3, *chars;
static lh_tokenizer *qwen3_gpt2; /* Qwen3's vocabulary, GPT-2's pre-tokenizer, no normalizer */

/* ---------------------------------------------------------------- helpers */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Output of a shell command (whole), or NULL. */
static char *run_capture(const char *cmd, size_t *len) {
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  size_t cap = 1 << 20, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + n, 1, cap - n, p)) > 0) {
    n += got;
    if (n == cap) buf = realloc(buf, cap *= 2);
  }
  int rc = pclose(p);
  if (!buf || rc != 0) {
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf) buf[n] = '\0';
  *len = buf ? (size_t)n : 0;
  return buf;
}

/* Decompresses a .zst fixture with libzstd (libzstd-dev is a build dependency; it is opened
 * at run time so the test links nothing extra), or else with the zstd command. */
static char *unzstd(const char *path, size_t *len) {
  size_t zlen = 0;
  char *z = read_file(path, &zlen);
  if (!z) return NULL;
  char *out = NULL;
  void *lib = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib) {
    unsigned long long (*frame_size)(const void *, size_t);
    size_t (*decompress)(void *, size_t, const void *, size_t);
    unsigned (*is_error)(size_t);
    *(void **)&frame_size = dlsym(lib, "ZSTD_getFrameContentSize");
    *(void **)&decompress = dlsym(lib, "ZSTD_decompress");
    *(void **)&is_error = dlsym(lib, "ZSTD_isError");
    unsigned long long n = frame_size && decompress && is_error ? frame_size(z, zlen) : 0;
    if (n > 0 && n < (1ull << 30) && (out = malloc((size_t)n + 1))) {
      size_t got = decompress(out, (size_t)n, z, zlen);
      if (is_error(got) || got != n) {
        free(out);
        out = NULL;
      } else {
        out[n] = '\0';
        *len = (size_t)n;
      }
    }
    dlclose(lib);
  }
  free(z);
  if (!out) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "zstd -dc -- '%s'", path);
    out = run_capture(cmd, len);
  }
  if (!out)
    fprintf(stderr,
            "test_tokenizer: cannot decompress %s: neither libzstd.so.1 nor the zstd "
            "command worked\n",
            path);
  return out;
}

/* Loads tests/fixtures/tokenizer/NAME.tokenizer.json.zst; with gpt2, its normalizer removed and
 * its pre-tokenizer replaced by GPT-2's (as tokenizer_ref.mjs does for "qwen3-gpt2"). */
static lh_tokenizer *load_fixture(const char *name, bool gpt2) {
  char path[512], what[64];
  snprintf(path, sizeof path, "%s/%s.tokenizer.json.zst", FIXTURES, name);
  size_t len = 0;
  char *json = unzstd(path, &len);
  if (!json) return NULL;
  if (gpt2) {
    json_t *root = json_loadb(json, len, 0, NULL);
    free(json);
    if (!root) return NULL;
    json_object_set_new(root, "normalizer", json_null());
    json_object_set_new(root, "pre_tokenizer",
                        json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space",
                                  0, "trim_offsets", 0, "use_regex", 1));
    json = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!json) return NULL;
    len = strlen(json);
  }
  snprintf(what, sizeof what, "%s%s.tokenizer.json", name, gpt2 ? "-gpt2" : "");
  lh_tokenizer *t = NULL;
  double t0 = now();
  lh_err e = lh_tokenizer_parse(json, len, what, &t);
  if (e)
    fprintf(stderr, "test_tokenizer: %s: %s\n", lh_err_name(e), lh_last_error());
  else
    fprintf(stderr, "loaded %s: %d ids in %.2f s\n", what, lh_tokenizer_vocab_size(t), now() - t0);
  free(json);
  return t;
}

static int setup(void **state) {
  (void)state;
  qwen3 = load_fixture("qwen3", false);
  llama3 = load_fixture("llama3", false);
  qwen3_gpt2 = load_fixture("qwen3", true);
  char *json = lh_tokenizer_chars_json();
  if (lh_tokenizer_parse(json, strlen(json), "chars", &chars) != LH_ERR_OK)
    fprintf(stderr, "test_tokenizer: chars: %s\n", lh_last_error());
  free(json);
  return qwen3 && llama3 && qwen3_gpt2 && chars ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  lh_tokenizer_free(qwen3);
  lh_tokenizer_free(llama3);
  lh_tokenizer_free(chars);
  lh_tokenizer_free(qwen3_gpt2);
  return 0;
}

static lh_tokenizer *parse_ok(const char *json) {
  lh_tokenizer *t = NULL;
  lh_err e = lh_tokenizer_parse(json, strlen(json), "test.json", &t);
  if (e) fprintf(stderr, "unexpected %s: %s\n", lh_err_name(e), lh_last_error());
  assert_int_equal(e, LH_ERR_OK);
  return t;
}

/* decode(encode(text)) */
static char *round_trip(const lh_tokenizer *t, const char *text, size_t len, bool special,
                        size_t *out_len) {
  int32_t *ids = NULL;
  size_t n = 0;
  lh_err e = lh_tokenizer_encode(t, text, len, special, &ids, &n);
  if (e) fprintf(stderr, "encode: %s\n", lh_last_error());
  assert_int_equal(e, LH_ERR_OK);
  char *back = NULL;
  assert_int_equal(lh_tokenizer_decode(t, ids, n, false, &back, out_len), LH_ERR_OK);
  free(ids);
  return back;
}

/* The GPT-2 byte-to-unicode map, written independently of the library's. */
static void byte_char(int b, char out[3]) {
  int cp = b, k = 0;
  bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  if (!keep) {
    int n = 0;
    for (int x = 0; x < b; x++)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
    cp = 256 + n;
  }
  if (cp < 0x80) {
    out[k++] = (char)cp;
  } else {
    out[k++] = (char)(0xC0 | (cp >> 6));
    out[k++] = (char)(0x80 | (cp & 0x3F));
  }
  out[k] = '\0';
}

/* A byte-level tokenizer.json: the 256 byte tokens, then the extra tokens and merges given
 * (JSON array of "a b" strings, in byte-level form), with the given normalizer and
 * pre_tokenizer (JSON text). */
static char *byte_level_json(const char *normalizer, const char *pre_tokenizer,
                             const char *const *extra, const char *merges) {
  json_t *vocab = json_object();
  for (int b = 0; b < 256; b++) {
    char s[3];
    byte_char(b, s);
    json_object_set_new(vocab, s, json_integer(b));
  }
  int id = 256;
  for (int i = 0; extra && extra[i]; i++)
    json_object_set_new(vocab, extra[i], json_integer(id++));
  json_t *model = json_pack("{s:s, s:o, s:o}", "type", "BPE", "vocab", vocab, "merges",
                            json_loads(merges, 0, NULL));
  json_t *root =
      json_pack("{s:o, s:o, s:o, s:{s:s}}", "model", model, "normalizer",
                json_loads(normalizer, JSON_DECODE_ANY, NULL), "pre_tokenizer",
                json_loads(pre_tokenizer, JSON_DECODE_ANY, NULL), "decoder", "type", "ByteLevel");
  assert_non_null(root);
  char *s = json_dumps(root, 0);
  json_decref(root);
  return s;
}

/* ---------------------------------------------------------------- reference fixtures */

static void print_ids(const char *label, const lh_tokenizer *t, const int32_t *ids, size_t n) {
  fprintf(stderr, "  %s (%zu):", label, n);
  for (size_t i = 0; i < n && i < 40; i++) {
    const char *s = lh_tokenizer_token(t, ids[i]);
    fprintf(stderr, " %d:%s", ids[i], s ? s : "?");
  }
  fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static void test_reference_ids(void **state) {
  (void)state;
  FILE *f = fopen(FIXTURES "/expected.jsonl", "r");
  assert_non_null(f);
  char *line = NULL;
  size_t cap = 0, lineno = 0, matched = 0, decoded_ok = 0, total = 0;
  ssize_t got;
  while ((got = getline(&line, &cap, f)) > 0) {
    lineno++;
    json_error_t jerr;
    json_t *o = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &jerr);
    assert_non_null(o);
    const char *name = json_string_value(json_object_get(o, "tokenizer"));
    json_t *jtext = json_object_get(o, "text"), *jids = json_object_get(o, "ids");
    json_t *jdec = json_object_get(o, "decoded");
    assert_non_null(name);
    assert_true(json_is_string(jtext) && json_is_array(jids) && json_is_string(jdec));
    const lh_tokenizer *t = !strcmp(name, "qwen3")        ? qwen3
                            : !strcmp(name, "llama3")     ? llama3
                            : !strcmp(name, "chars")      ? chars
                            : !strcmp(name, "qwen3-gpt2") ? qwen3_gpt2
                                                          : NULL;
    assert_non_null(t);
    size_t want_n = json_array_size(jids);
    int32_t *want = malloc((want_n + 1) * sizeof *want);
    for (size_t i = 0; i < want_n; i++)
      want[i] = (int32_t)json_integer_value(json_array_get(jids, i));
    int32_t *ids = NULL;
    size_t n = 0;
    total++;
    lh_err e =
        lh_tokenizer_encode(t, json_string_value(jtext), json_string_length(jtext), true, &ids, &n);
    if (e) fprintf(stderr, "line %zu: %s\n", lineno, lh_last_error());
    assert_int_equal(e, LH_ERR_OK);
    if (n == want_n && !memcmp(ids, want, n * sizeof *ids)) {
      matched++;
    } else {
      fprintf(stderr, "expected.jsonl:%zu (%s): ids differ for %s\n", lineno, name,
              json_dumps(jtext, JSON_ENCODE_ANY));
      print_ids("want", t, want, want_n);
      print_ids("got ", t, ids, n);
    }
    char *back = NULL;
    size_t back_len = 0;
    assert_int_equal(lh_tokenizer_decode(t, ids, n, false, &back, &back_len), LH_ERR_OK);
    if (back_len == json_string_length(jdec) && !memcmp(back, json_string_value(jdec), back_len))
      decoded_ok++;
    else
      fprintf(stderr, "expected.jsonl:%zu (%s): decode gives %.*s\n", lineno, name, (int)back_len,
              back);
    free(back);
    free(ids);
    free(want);
    json_decref(o);
  }
  free(line);
  fclose(f);
  fprintf(stderr, "reference: %zu/%zu lines encode to the expected ids, %zu/%zu decode back\n",
          matched, total, decoded_ok, total);
  assert_true(total >= 1800);
  assert_int_equal(matched, total);
  assert_int_equal(decoded_ok, total);
}

static void test_vocab_lookups(void **state) {
  (void)state;
  assert_int_equal(lh_tokenizer_vocab_size(qwen3), 151669);
  assert_int_equal(lh_tokenizer_vocab_size(llama3), 128256);
  assert_int_equal(lh_tokenizer_find(qwen3, "<|im_start|>"), 151644);
  assert_true(lh_tokenizer_is_special(qwen3, 151644));
  assert_int_equal(lh_tokenizer_find(qwen3, "<think>"), 151667);
  assert_false(lh_tokenizer_is_special(qwen3, 151667)); /* an added token, not special */
  assert_false(lh_tokenizer_is_special(qwen3, 100));
  assert_false(lh_tokenizer_is_special(qwen3, -1));
  assert_false(lh_tokenizer_is_special(qwen3, 1 << 30));
  assert_int_equal(lh_tokenizer_find(llama3, "<|begin_of_text|>"), 128000);
  int32_t the = lh_tokenizer_find(llama3, "\xc4\xa0the"); /* "Ġthe" */
  assert_true(the >= 0);
  assert_string_equal(lh_tokenizer_token(llama3, the), "\xc4\xa0the");
  assert_int_equal(lh_tokenizer_find(llama3, "no such token at all"), -1);
  assert_null(lh_tokenizer_token(llama3, -1));
  assert_null(lh_tokenizer_token(llama3, 128256));
}

/* lh_tokenizer_token_bytes gives, for every id of both real vocabularies, exactly the bytes of
 * lh_tokenizer_decode of that id alone (with and without skip_special), in a buffer of exactly
 * one byte more, and refuses a buffer that is too small or a negative id; an id past the
 * vocabulary gives no bytes, as its decode does. */
static void test_token_bytes(void **state) {
  (void)state;
  const lh_tokenizer *toks[] = {qwen3, llama3};
  char buf[512];
  for (int k = 0; k < 2; k++) {
    int V = lh_tokenizer_vocab_size(toks[k]);
    for (int32_t id = 0; id < V; id++) {
      for (int skip = 0; skip < 2; skip++) {
        char *text = NULL;
        size_t len = 0;
        if (lh_tokenizer_decode(toks[k], &id, 1, skip, &text, &len) != LH_ERR_OK) {
          assert_int_equal(lh_tokenizer_token_bytes(toks[k], id, skip, buf, sizeof buf), -1);
          continue;
        }
        long got = lh_tokenizer_token_bytes(toks[k], id, skip, buf, sizeof buf);
        if (got != (long)len || memcmp(buf, text, len) != 0) {
          print_error("tokenizer %d id %d skip %d: %ld bytes, decode gives %zu\n", k, id, skip, got,
                      len);
          fail();
        }
        /* cap - 1 bytes fit exactly (a byte-level token is longer than its bytes) */
        if (lh_tokenizer_token_bytes(toks[k], id, skip, buf, len + 1) != (long)len) {
          print_error("tokenizer %d id %d skip %d: %zu bytes do not fit in a buffer of %zu\n", k,
                      id, skip, len, len + 1);
          fail();
        }
        if (len > 0) assert_int_equal(lh_tokenizer_token_bytes(toks[k], id, skip, buf, len), -1);
        free(text);
      }
    }
    assert_int_equal(lh_tokenizer_token_bytes(toks[k], -1, false, buf, sizeof buf), -1);
    assert_int_equal(lh_tokenizer_token_bytes(toks[k], V, false, buf, sizeof buf), 0);
  }
}

static void test_special_tokens(void **state) {
  (void)state;
  const char *text = "<|im_start|>user\nhi<think></think><|im_end|>";
  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(lh_tokenizer_encode(qwen3, text, strlen(text), true, &ids, &n), LH_ERR_OK);
  assert_true(n >= 5);
  assert_int_equal(ids[0], 151644);
  assert_int_equal(ids[n - 1], 151645);
  free(ids);
  /* without allow_special the special tokens are plain text; added tokens that are not special
   * (Qwen3's <think>) are still recognised, as in Hugging Face */
  assert_int_equal(lh_tokenizer_encode(qwen3, text, strlen(text), false, &ids, &n), LH_ERR_OK);
  int thinks = 0;
  for (size_t i = 0; i < n; i++) {
    assert_false(lh_tokenizer_is_special(qwen3, ids[i]));
    thinks += ids[i] == 151667 || ids[i] == 151668;
  }
  assert_int_equal(thinks, 2);
  char *back = NULL;
  size_t len = 0;
  assert_int_equal(lh_tokenizer_decode(qwen3, ids, n, false, &back, &len), LH_ERR_OK);
  assert_string_equal(back, text);
  free(back);
  free(ids);
  /* skip_special leaves special tokens out of the text */
  int32_t chat[] = {151644, 872, 151645};
  assert_int_equal(lh_tokenizer_decode(qwen3, chat, 3, true, &back, &len), LH_ERR_OK);
  assert_string_equal(back, "user");
  free(back);
  assert_int_equal(lh_tokenizer_decode(qwen3, chat, 3, false, &back, &len), LH_ERR_OK);
  assert_string_equal(back, "<|im_start|>user<|im_end|>");
  free(back);
  /* ids the tokenizer does not have (Qwen3's config pads vocab_size to 151936, past the
   * tokenizer's 151669 ids): nothing, as Hugging Face decodes them; a negative id is an error */
  int32_t padded[] = {9707, 151669, 11, 151935}, plain[] = {9707, 11};
  char *want = NULL;
  assert_int_equal(lh_tokenizer_decode(qwen3, plain, 2, false, &want, &len), LH_ERR_OK);
  assert_int_equal(lh_tokenizer_decode(qwen3, padded, 4, false, &back, &len), LH_ERR_OK);
  assert_string_equal(back, want);
  assert_string_equal(back, "Hello,");
  free(back);
  free(want);
  char one[8];
  assert_int_equal(lh_tokenizer_token_bytes(qwen3, 151669, true, one, sizeof one), 0);
  int32_t neg[] = {5, -3};
  assert_int_equal(lh_tokenizer_decode(llama3, neg, 2, false, &back, &len), LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "position 1"));
  /* empty input */
  assert_int_equal(lh_tokenizer_encode(llama3, "", 0, true, &ids, &n), LH_ERR_OK);
  assert_int_equal(n, 0);
  free(ids);
  assert_int_equal(lh_tokenizer_decode(llama3, NULL, 0, false, &back, &len), LH_ERR_OK);
  assert_int_equal(len, 0);
  assert_string_equal(back, "");
  free(back);
}

/* ---------------------------------------------------------------- round trips */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 11);
}

/* Random bytes: raw bytes, ASCII words and whitespace, valid multi-byte characters, invalid
 * sequences and special-token text. */
static size_t random_text(char *buf, size_t cap) {
  static const char *const parts[] = {" ",
                                      "  ",
                                      "\n",
                                      "\r\n",
                                      "\t",
                                      "'s",
                                      "'LL",
                                      "the",
                                      "The",
                                      " word",
                                      "123",
                                      "4567890",
                                      "é",
                                      "e\xcc\x81",
                                      "中文",
                                      "한국",
                                      "🙂",
                                      "👨‍👩‍👧",
                                      "\xe2\x80\x8b",
                                      "<|im_start|>",
                                      "<|begin_of_text|>",
                                      "<think>",
                                      "\xff",
                                      "\xc0\xaf",
                                      "\xed\xa0\x80",
                                      "\xf4\x90\x80\x80",
                                      "\xe4\xb8",
                                      "\x80\x80",
                                      "\xc3",
                                      "!!",
                                      "?",
                                      "\xc2\xa0",
                                      "\xe3\x80\x80"};
  size_t n = 0, parts_n = sizeof parts / sizeof parts[0];
  size_t want = rnd() % (cap / 2);
  while (n < want) {
    if (rnd() % 3 == 0) {
      buf[n++] = (char)(rnd() & 0xFF);
    } else {
      const char *p = parts[rnd() % parts_n];
      size_t l = strlen(p);
      if (n + l > cap) break;
      memcpy(buf + n, p, l);
      n += l;
    }
  }
  return n;
}

static void check_exact_round_trip(const lh_tokenizer *t, const char *label, int iters) {
  char buf[512];
  for (int it = 0; it < iters; it++) {
    size_t n = random_text(buf, sizeof buf);
    for (int special = 0; special < 2; special++) {
      size_t back_len = 0;
      char *back = round_trip(t, buf, n, special, &back_len);
      if (back_len != n || memcmp(back, buf, n)) {
        fprintf(stderr, "%s: round trip %d (special %d) changed %zu bytes into %zu\n", label, it,
                special, n, back_len);
        fail();
      }
      free(back);
    }
  }
}

static void test_random_bytes_round_trip(void **state) {
  (void)state;
  check_exact_round_trip(llama3, "llama3", 1500);
  /* Qwen3 normalises to NFC, so decode(encode(x)) is NFC(x): check that it is stable, and
   * exact with the normalizer removed. */
  char buf[512];
  for (int it = 0; it < 1000; it++) {
    size_t n = random_text(buf, sizeof buf), l1 = 0, l2 = 0;
    char *once = round_trip(qwen3, buf, n, true, &l1);
    char *twice = round_trip(qwen3, once, l1, true, &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(once, twice, l1);
    free(once);
    free(twice);
  }
  size_t len = 0;
  char *json = unzstd(FIXTURES "/qwen3.tokenizer.json.zst", &len);
  assert_non_null(json);
  json_t *root = json_loadb(json, len, 0, NULL);
  free(json);
  assert_non_null(root);
  json_object_set_new(root, "normalizer", json_null());
  char *plain = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  lh_tokenizer *t = parse_ok(plain);
  free(plain);
  check_exact_round_trip(t, "qwen3 without NFC", 1000);
  check_exact_round_trip(qwen3_gpt2, "qwen3 vocabulary, gpt2 pattern", 1000);
  lh_tokenizer_free(t);

  /* a tiny GPT-2 style tokenizer (ByteLevel with its own regex) with a few merges */
  static const char *const extra[] = {"\xc4\xa0t", "he", "\xc4\xa0the", "\xc4\xa0\xc4\xa0", NULL};
  char *tiny =
      byte_level_json("null", "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}", extra,
                      "[\"\xc4\xa0 t\", \"h e\", \"\xc4\xa0t he\", \"\xc4\xa0 \xc4\xa0\"]");
  t = parse_ok(tiny);
  free(tiny);
  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(lh_tokenizer_encode(t, " the  the", 9, true, &ids, &n), LH_ERR_OK);
  /* " the", " ", " the" under \s+(?!\S) */
  assert_int_equal(n, 3);
  assert_int_equal(ids[0], 258);
  assert_int_equal(ids[1], 32);
  assert_int_equal(ids[2], 258);
  free(ids);
  check_exact_round_trip(t, "tiny gpt2", 1000);
  lh_tokenizer_free(t);
}

static void test_chars_tokenizer(void **state) {
  (void)state;
  /* the committed copy (which the reference implementation loads) is current */
  char *json = lh_tokenizer_chars_json();
  size_t len = 0;
  char *committed = read_file(FIXTURES "/chars.tokenizer.json", &len);
  assert_non_null(committed);
  assert_int_equal(len, strlen(json));
  assert_memory_equal(committed, json, len);
  free(committed);
  lh_tokenizer *t = parse_ok(json);
  free(json);
  assert_int_equal(lh_tokenizer_vocab_size(t), 99);
  assert_int_equal(lh_tokenizer_find(t, "<|pad|>"), 0);
  assert_int_equal(lh_tokenizer_find(t, "<|bos|>"), 1);
  assert_int_equal(lh_tokenizer_find(t, "<|eos|>"), 2);
  for (int i = 0; i < 3; i++)
    assert_true(lh_tokenizer_is_special(t, i));
  assert_false(lh_tokenizer_is_special(t, 3));
  assert_int_equal(lh_tokenizer_find(t, " "), 3);
  assert_int_equal(lh_tokenizer_find(t, "~"), 97);
  assert_int_equal(lh_tokenizer_find(t, "\n"), 98);

  const char *text = "<|bos|>12+34=46\nsort: b a c<|eos|>";
  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(lh_tokenizer_encode(t, text, strlen(text), true, &ids, &n), LH_ERR_OK);
  assert_int_equal(n, 2 + strlen("12+34=46\nsort: b a c"));
  assert_int_equal(ids[0], 1);
  assert_int_equal(ids[1], '1' - ' ' + 3);
  assert_int_equal(ids[9], 98);
  assert_int_equal(ids[n - 1], 2);
  char *back = NULL;
  assert_int_equal(lh_tokenizer_decode(t, ids, n, false, &back, &len), LH_ERR_OK);
  assert_string_equal(back, text);
  free(back);
  assert_int_equal(lh_tokenizer_decode(t, ids, n, true, &back, &len), LH_ERR_OK);
  assert_string_equal(back, "12+34=46\nsort: b a c");
  free(back);
  free(ids);
  /* without allow_special, "<|bos|>" is seven characters */
  assert_int_equal(lh_tokenizer_encode(t, "<|bos|>", 7, false, &ids, &n), LH_ERR_OK);
  assert_int_equal(n, 7);
  free(ids);
  /* every printable character round-trips */
  char all[97];
  for (int c = ' '; c <= '~'; c++)
    all[c - ' '] = (char)c;
  all[95] = '\n';
  all[96] = '\0';
  back = round_trip(t, all, 96, false, &len);
  assert_string_equal(back, all);
  free(back);
  /* unknown characters are named with their byte offset */
  assert_int_equal(lh_tokenizer_encode(t, "ab\xc3\xa9", 4, true, &ids, &n), LH_ERR_NOTFOUND);
  assert_non_null(strstr(lh_last_error(), "\xc3\xa9"));
  assert_non_null(strstr(lh_last_error(), "U+00E9"));
  assert_non_null(strstr(lh_last_error(), "byte 2"));
  assert_int_equal(lh_tokenizer_encode(t, "<|eos|>x\ty", 10, true, &ids, &n), LH_ERR_NOTFOUND);
  assert_non_null(strstr(lh_last_error(), "byte 8"));
  assert_int_equal(lh_tokenizer_encode(t, "ok\xff", 3, true, &ids, &n), LH_ERR_NOTFOUND);
  assert_non_null(strstr(lh_last_error(), "0xFF"));
  lh_tokenizer_free(t);

  /* with an unk_token, unknown characters become it (fused when fuse_unk is set) */
  const char *with_unk =
      "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"?\", \"fuse_unk\": true,"
      " \"vocab\": {\"?\": 0, \"a\": 1, \"b\": 2, \"ab\": 3}, \"merges\": [\"a b\"]},"
      " \"decoder\": {\"type\": \"Fuse\"}}";
  t = parse_ok(with_unk);
  assert_int_equal(lh_tokenizer_encode(t,
                                       "ab\xc3\xa9\xc3\xa9"
                                       "ba",
                                       8, true, &ids, &n),
                   LH_ERR_OK);
  assert_int_equal(n, 4);
  assert_int_equal(ids[0], 3);
  assert_int_equal(ids[1], 0);
  assert_int_equal(ids[2], 2);
  assert_int_equal(ids[3], 1);
  free(ids);
  /* only unknown characters are fused: a "?" in the text is the known token "?" (which is also
   * unk_token), and an unknown character after it or before it is a token of its own, as
   * Hugging Face gives ([0, 0, 3], [0, 0, 0]) */
  static const struct {
    const char *text;
    size_t n_ids;
    int32_t ids[3];
  } fuse_cases[] = {
      {"?\xc3\xa9\xc3\xa9"
       "ab",
       3,
       {0, 0, 3}},
      {"\xc3\xa9?\xc3\xa9", 3, {0, 0, 0}},
  };
  for (size_t c = 0; c < sizeof fuse_cases / sizeof fuse_cases[0]; c++) {
    assert_int_equal(
        lh_tokenizer_encode(t, fuse_cases[c].text, strlen(fuse_cases[c].text), true, &ids, &n),
        LH_ERR_OK);
    assert_int_equal(n, fuse_cases[c].n_ids);
    assert_memory_equal(ids, fuse_cases[c].ids, n * sizeof *ids);
    free(ids);
  }
  lh_tokenizer_free(t);
  /* no decoder: tokens joined by spaces, as Hugging Face does */
  t = parse_ok("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}}");
  back = round_trip(t, "abba", 4, true, &len);
  assert_string_equal(back, "a b b a");
  free(back);
  lh_tokenizer_free(t);
}

/* Added tokens with normalized: false split the text first; those with normalized: true are
 * matched only in the pieces left, so a longer normalized token that overlaps a non-normalized
 * one loses to it. Expected ids with allow_special are Hugging Face tokenizers 0.23.2's. */
static void test_added_two_passes(void **state) {
  (void)state;
  lh_tokenizer *t = parse_ok(
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": []},"
      " \"added_tokens\": ["
      "{\"id\": 3, \"content\": \"ab\", \"normalized\": false, \"special\": true},"
      "{\"id\": 4, \"content\": \"abc\", \"normalized\": true, \"special\": false},"
      "{\"id\": 5, \"content\": \"ca\", \"normalized\": true, \"special\": false}],"
      " \"decoder\": {\"type\": \"Fuse\"}}");
  static const struct {
    const char *text;
    bool special;
    size_t n;
    int32_t ids[4];
  } cases[] = {
      {"abc", true, 2, {3, 2}},           /* "ab" first, though "abc" is longer */
      {"cab", true, 2, {2, 3}},           /* "ca" overlaps "ab", which wins */
      {"caab", true, 2, {5, 3}},          /* "ca" in the piece before "ab" */
      {"abcabca", true, 4, {3, 2, 3, 5}}, /* ... and after it */
      {"abc", false, 1, {4}},             /* special "ab" is text: "abc" in the second pass */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(
        lh_tokenizer_encode(t, cases[c].text, strlen(cases[c].text), cases[c].special, &ids, &n),
        LH_ERR_OK);
    if (n != cases[c].n || memcmp(ids, cases[c].ids, n * sizeof *ids)) {
      print_ids("want", t, cases[c].ids, cases[c].n);
      print_ids("got ", t, ids, n);
      fail_msg("%s (allow_special %d)", cases[c].text, cases[c].special);
    }
    free(ids);
  }
  lh_tokenizer_free(t);
}

/* BPE order: lowest rank first, leftmost first among equal ranks; merges in both formats. */
static void test_merge_order(void **state) {
  (void)state;
  /* ranks: 0 "a b", 1 "a a", 2 "aa b", 3 "aa a" */
  const char *json =
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"aa\": 2, \"ab\": 3,"
      " \"aaa\": 4, \"aab\": 5}, \"merges\": [[\"a\", \"b\"], [\"a\", \"a\"], [\"aa\", \"b\"],"
      " \"aa a\"]}, \"decoder\": {\"type\": \"Fuse\"}}";
  lh_tokenizer *t = parse_ok(json);
  const struct {
    const char *text;
    int n;
    int32_t ids[4];
  } cases[] = {
      {"aaa", 1, {4}},     /* leftmost "a a" -> aa a, then "aa a" */
      {"aab", 2, {0, 3}},  /* "a b" (rank 0) before "a a" (rank 1) */
      {"aaab", 2, {2, 3}}, /* a a ab, then the leftmost "a a" */
      {"aaaa", 2, {2, 2}}, /* aa a a: "a a" (rank 1) before "aa a" (rank 3) */
      {"ba", 2, {1, 0}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(lh_tokenizer_encode(t, cases[i].text, strlen(cases[i].text), true, &ids, &n),
                     LH_ERR_OK);
    if ((int)n != cases[i].n || memcmp(ids, cases[i].ids, n * sizeof *ids)) {
      fprintf(stderr, "%s: got", cases[i].text);
      for (size_t k = 0; k < n; k++)
        fprintf(stderr, " %d", ids[k]);
      fprintf(stderr, "\n");
      fail();
    }
    free(ids);
  }
  lh_tokenizer_free(t);
}

/* ---------------------------------------------------------------- NFC */

/* NFC(x) through a byte-level tokenizer with no merges and no splitting. */
static lh_tokenizer *nfc_tokenizer(void) {
  char *json = byte_level_json("{\"type\": \"NFC\"}",
                               "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                               "\"use_regex\": false}",
                               NULL, "[]");
  lh_tokenizer *t = parse_ok(json);
  free(json);
  return t;
}

static void expect_nfc(const lh_tokenizer *t, const char *in, const char *want, const char *where) {
  size_t len = 0;
  char *got = round_trip(t, in, strlen(in), false, &len);
  if (strcmp(got, want)) {
    fprintf(stderr, "NFC %s: got \"%s\", want \"%s\"\n", where, got, want);
    fail();
  }
  free(got);
}

static void test_nfc_cases(void **state) {
  (void)state;
  lh_tokenizer *t = nfc_tokenizer();
  expect_nfc(t, "cafe\xcc\x81", "caf\xc3\xa9", "e + acute");
  expect_nfc(t, "\xe2\x84\xab", "\xc3\x85", "angstrom sign (singleton)");
  expect_nfc(t, "e\xcc\x81\xcc\xa7", "\xc8\xa9\xcc\x81", "reordering: e acute cedilla");
  expect_nfc(t, "\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81", "Hangul L V T");
  expect_nfc(t, "\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81", "Hangul LV + T");
  expect_nfc(t, "\xe0\xa5\x98", "\xe0\xa4\x95\xe0\xa4\xbc", "excluded composition U+0958");
  expect_nfc(t,
             "\xcc\x81"
             "a",
             "\xcc\x81"
             "a",
             "leading combining mark");
  expect_nfc(t, "\xef\xac\x81", "\xef\xac\x81", "compatibility ligature kept");
  expect_nfc(t,
             "a\xff"
             "e\xcc\x81\xc3",
             "a\xff\xc3\xa9\xc3", "invalid bytes pass through");
  lh_tokenizer_free(t);
}

/* A run of combining marks as long as the text (untrusted text can make one) is put in
 * canonical order stably and in linear time: "a" + (U+0301 U+0316 U+0308) * k becomes "\u00e1"
 * (a + acute, the first mark of class 230 after the class-220 ones) + U+0316 * k + U+0308 +
 * (U+0301 U+0308) * (k - 1), the equal classes 230 keeping their order. k is large enough that
 * the quadratic sort this replaced (an hour here) would run into the test's timeout. */
static void test_nfc_long_mark_run(void **state) {
  (void)state;
  lh_tokenizer *t = nfc_tokenizer();
  const size_t k = (size_t)1 << 19;
  char *in = malloc(1 + 6 * k), *want = malloc(6 * k);
  size_t n = 0, m = 0;
  in[n++] = 'a';
  for (size_t i = 0; i < k; i++) {
    memcpy(in + n, "\xcc\x81\xcc\x96\xcc\x88", 6);
    n += 6;
  }
  memcpy(want + m, "\xc3\xa1", 2);
  m += 2;
  for (size_t i = 0; i < k; i++, m += 2)
    memcpy(want + m, "\xcc\x96", 2);
  memcpy(want + m, "\xcc\x88", 2);
  m += 2;
  for (size_t i = 1; i < k; i++, m += 4)
    memcpy(want + m, "\xcc\x81\xcc\x88", 4);
  size_t len = 0;
  char *got = round_trip(t, in, n, false, &len);
  assert_int_equal(len, m);
  assert_memory_equal(got, want, m);
  free(got);
  free(want);
  free(in);
  lh_tokenizer_free(t);
}

/* Parses "0041 030A" into UTF-8; returns the length. */
static size_t hex_field(const char *s, char *out) {
  size_t n = 0;
  while (*s) {
    char *end;
    unsigned long cp = strtoul(s, &end, 16);
    if (end == s) break;
    if (cp < 0x80) {
      out[n++] = (char)cp;
    } else if (cp < 0x800) {
      out[n++] = (char)(0xC0 | (cp >> 6));
      out[n++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out[n++] = (char)(0xE0 | (cp >> 12));
      out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
      out[n++] = (char)(0x80 | (cp & 0x3F));
    } else {
      out[n++] = (char)(0xF0 | (cp >> 18));
      out[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
      out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
      out[n++] = (char)(0x80 | (cp & 0x3F));
    }
    s = end;
    while (*s == ' ')
      s++;
  }
  out[n] = '\0';
  return n;
}

static void test_nfc_conformance(void **state) {
  (void)state;
  const char *path = "/usr/share/unicode/NormalizationTest.txt.bz2";
  if (access(path, R_OK) != 0) {
    fprintf(stderr,
            "NFC conformance: %s not installed (apt-get install unicode-data); "
            "skipped\n",
            path);
    skip();
  }
  FILE *p = popen("bzcat /usr/share/unicode/NormalizationTest.txt.bz2", "r");
  assert_non_null(p);
  lh_tokenizer *t = nfc_tokenizer();
  char line[2048];
  size_t checked = 0, failed = 0;
  while (fgets(line, sizeof line, p)) {
    if (line[0] == '#' || line[0] == '@' || line[0] == '\n') continue;
    char *fields[5];
    char *s = line;
    for (int k = 0; k < 5; k++) {
      fields[k] = s;
      s = strchr(s, ';');
      if (!s) break;
      *s++ = '\0';
    }
    char c[5][256];
    size_t cl[5];
    for (int k = 0; k < 5; k++)
      cl[k] = hex_field(fields[k], c[k]);
    /* c2 == NFC(c1) == NFC(c2) == NFC(c3); c4 == NFC(c4) == NFC(c5) */
    static const int src[5] = {0, 1, 2, 3, 4}, want[5] = {1, 1, 1, 3, 3};
    for (int k = 0; k < 5; k++) {
      size_t len = 0;
      char *got = round_trip(t, c[src[k]], cl[src[k]], false, &len);
      checked++;
      if (len != cl[want[k]] || memcmp(got, c[want[k]], len)) {
        if (failed++ < 10)
          fprintf(stderr, "NFC conformance: c%d of %s;%s: wrong\n", k + 1, fields[0], fields[1]);
      }
      free(got);
    }
  }
  pclose(p);
  lh_tokenizer_free(t);
  fprintf(stderr, "NFC conformance: %zu checks, %zu failed\n", checked, failed);
  assert_true(checked > 50000);
  assert_int_equal(failed, 0);
}

/* ---------------------------------------------------------------- malformed files */

static void expect_error(const char *json, lh_err want, const char *const *needles) {
  lh_tokenizer *t = NULL;
  lh_err e = lh_tokenizer_parse(json, strlen(json), "bad.json", &t);
  const char *msg = lh_last_error();
  bool ok = e == want && !t && !strncmp(msg, "bad.json: ", 10);
  for (int i = 0; ok && needles[i]; i++)
    ok = strstr(msg, needles[i]) != NULL;
  if (!ok) {
    fprintf(stderr, "for %s\n  got %s: %s\n  want %s with", json, lh_err_name(e), msg,
            lh_err_name(want));
    for (int i = 0; needles[i]; i++)
      fprintf(stderr, " [%s]", needles[i]);
    fprintf(stderr, "\n");
    fail();
  }
  lh_tokenizer_free(t);
}
#define EXPECT(json, code, ...)                                                                    \
  expect_error(json, LH_ERR_##code, (const char *const[]){__VA_ARGS__, NULL})

#define M(vocab, merges)                                                                           \
  "{\"model\": {\"type\": \"BPE\", \"vocab\": " vocab ", \"merges\": " merges "}"

static void test_malformed(void **state) {
  (void)state;
  EXPECT("{\"model\": ", FORMAT, "invalid JSON", "line 1");
  EXPECT("[1, 2]", FORMAT, "top level", "array");
  EXPECT("{}", FORMAT, "model: missing");
  EXPECT("{\"model\": 3}", FORMAT, "model: expected an object", "integer");
  EXPECT("{\"model\": {\"vocab\": {}}}", FORMAT, "model.type");
  EXPECT("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", UNSUPPORTED, "model.type",
         "WordPiece");
  EXPECT("{\"model\": {\"type\": \"BPE\", \"vocab\": [\"a\"]}}", FORMAT, "model.vocab", "array");
  EXPECT(M("{\"a\": \"0\"}", "[]") "}", FORMAT, "model.vocab[\"a\"]", "string");
  EXPECT(M("{\"a\": -1}", "[]") "}", FORMAT, "model.vocab[\"a\"]", "negative");
  EXPECT(M("{\"a\": 99999999999}", "[]") "}", LIMIT, "model.vocab[\"a\"]", "99999999999");
  EXPECT(M("{\"a\": 0, \"b\": 0}", "[]") "}", FORMAT, "model.vocab[\"b\"]", "id 0 is also \"a\"");
  EXPECT(M("{}", "[]") "}", FORMAT, "model.vocab: empty");
  EXPECT(M("{\"a\": 0, \"b\": 1, \"ab\": 2}", "[\"a b\", \"a c\"]") "}", FORMAT, "model.merges[1]",
         "\"c\" is not in model.vocab");
  EXPECT(M("{\"a\": 0, \"b\": 1}", "[[\"a\", \"b\"]]") "}", FORMAT, "model.merges[0]",
         "merged token \"ab\"");
  EXPECT(M("{\"a\": 0, \"b\": 1, \"ab\": 2}", "[7]") "}", FORMAT,
         "model.merges[0]: expected \"a b\" or [\"a\", \"b\"], found integer");
  EXPECT(M("{\"a\": 0, \"b\": 1, \"ab\": 2}", "[\"a b c\"]") "}", FORMAT, "model.merges[0]");
  EXPECT(M("{\"a\": 0, \"b\": 1, \"ab\": 2}", "[\"ab\"]") "}", FORMAT, "model.merges[0]");
  EXPECT(M("{\"a\": 0}", "{}") "}", FORMAT, "model.merges: expected an array", "object");
  EXPECT("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"byte_fallback\": true}}",
         UNSUPPORTED, "model.byte_fallback");
  EXPECT("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"dropout\": 0.1}}", UNSUPPORTED,
         "model.dropout");
  EXPECT("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"ignore_merges\": 1}}", FORMAT,
         "model.ignore_merges", "true or false");
  EXPECT("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
         "\"continuing_subword_prefix\": \"##\"}}",
         UNSUPPORTED, "model.continuing_subword_prefix", "##");
  EXPECT("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"unk_token\": \"<unk>\"}}",
         FORMAT, "model.unk_token", "<unk>");
  /* added tokens */
  EXPECT(M("{\"a\": 0}", "[]") ", \"added_tokens\": {}}", FORMAT,
         "added_tokens: expected an array");
  EXPECT(M("{\"a\": 0}", "[]") ", \"added_tokens\": [{\"id\": 4194304, \"content\": \"x\"}]}",
         LIMIT, "added_tokens[0].id");
  EXPECT(M("{\"a\": 0}", "[]") ", \"added_tokens\": [{\"id\": \"1\", \"content\": \"x\"}]}", FORMAT,
         "added_tokens[0].id", "string");
  EXPECT(M("{\"a\": 0}", "[]") ", \"added_tokens\": [{\"id\": 1, \"content\": \"\"}]}", FORMAT,
         "added_tokens[0].content");
  EXPECT(M("{\"a\": 0}", "[]") ", \"added_tokens\": [{\"id\": 1, \"content\": \"<x>\", "
                               "\"lstrip\": true, \"special\": true}]}",
         UNSUPPORTED, "added_tokens[0]", "\"<x>\"", "lstrip");
  EXPECT(M("{\"a\": 0}", "[]") ", \"added_tokens\": [{\"id\": 1, \"content\": \"<x>\", "
                               "\"single_word\": true}]}",
         UNSUPPORTED, "added_tokens[0]", "single_word");
  EXPECT(M("{\"a\": 0}", "[]") ", \"added_tokens\": [{\"id\": 0, \"content\": \"<x>\"}]}", FORMAT,
         "added_tokens[0]", "id 0");
  EXPECT(M("{\"a\": 0}", "[]") ", \"added_tokens\": [{\"id\": 5, \"content\": \"a\"}]}", FORMAT,
         "added_tokens[0]", "0 in model.vocab");
  EXPECT(M("{\"a\": 0}", "[]") ", \"added_tokens\": [{\"id\": 5, \"content\": \"<x>\"}, "
                               "{\"id\": 6, \"content\": \"<x>\"}]}",
         FORMAT, "added_tokens[1]");
  EXPECT(M("{\"a\": 0}", "[]") ", \"normalizer\": {\"type\": \"NFC\"}, \"added_tokens\": "
                               "[{\"id\": 5, \"content\": \"<x>\", \"normalized\": true}]}",
         UNSUPPORTED, "added_tokens[0]", "normalized");
  /* an added token longer than LH_TOKENIZER_MAX_ADDED is refused; one at the limit is matched */
  {
    size_t max = LH_TOKENIZER_MAX_ADDED;
    char *long_tok = malloc(max + 2), *json = malloc(max + 256);
    memset(long_tok, 'a', max + 1);
    long_tok[max + 1] = '\0';
    snprintf(json, max + 256,
             M("{\"a\": 0}", "[]") ", \"added_tokens\": [{\"id\": 1, "
                                   "\"content\": \"%s\"}]}",
             long_tok);
    char bytes[64];
    snprintf(bytes, sizeof bytes, "%zu bytes, more than the limit of %zu", max + 1, max);
    expect_error(json, LH_ERR_LIMIT, (const char *const[]){"added_tokens[0].content", bytes, NULL});
    long_tok[max] = '\0';
    snprintf(json, max + 256,
             M("{\"a\": 0}", "[]") ", \"added_tokens\": [{\"id\": 1, \"content\": \"%s\"}], "
                                   "\"decoder\": {\"type\": \"Fuse\"}}",
             long_tok);
    lh_tokenizer *t = parse_ok(json);
    assert_int_equal(lh_tokenizer_find(t, long_tok), 1);
    /* "a" * (max + 1): the added token, then the model's "a" */
    long_tok[max] = 'a';
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(lh_tokenizer_encode(t, long_tok, max + 1, false, &ids, &n), LH_ERR_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 0);
    free(ids);
    lh_tokenizer_free(t);
    free(json);
    free(long_tok);
  }
  /* pipeline components */
  EXPECT(M("{\"a\": 0}", "[]") ", \"normalizer\": {\"type\": \"NFKC\"}}", UNSUPPORTED,
         "normalizer.type", "NFKC");
  EXPECT(M("{\"a\": 0}", "[]") ", \"normalizer\": {\"type\": 1}}", FORMAT, "normalizer.type");
  EXPECT(M("{\"a\": 0}", "[]") ", \"pre_tokenizer\": {\"type\": \"Whitespace\"}}", UNSUPPORTED,
         "pre_tokenizer.type", "Whitespace");
  EXPECT(M("{\"a\": 0}",
           "[]") ", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": "
                 "[{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+|[^\\\\w\\\\s]+\"},"
                 " \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", "
                 "\"add_prefix_space\": false, \"use_regex\": false}]}}",
         UNSUPPORTED, "pre_tokenizer.pretokenizers[0].pattern.Regex", "unknown pattern",
         "\"\\\\w+|[^\\\\w\\\\s]+\"");
  EXPECT(M("{\"a\": 0}", "[]") ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
                               "{\"String\": \" \"}, \"behavior\": \"Isolated\"}}",
         UNSUPPORTED, "pre_tokenizer.pattern", "String");
  EXPECT(M("{\"a\": 0}", "[]") ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
                               "{\"Regex\": \" \"}, \"behavior\": \"Removed\"}}",
         UNSUPPORTED, "pre_tokenizer.behavior", "Removed");
  EXPECT(M("{\"a\": 0}", "[]") ", \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
                               "\"add_prefix_space\": true}}",
         UNSUPPORTED, "pre_tokenizer.add_prefix_space");
  EXPECT(M("{\"a\": 0}", "[]") ", \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
                               "\"add_prefix_space\": false}}",
         FORMAT, "model.vocab", "byte 0x00");
  EXPECT(M("{\"a\": 0}", "[]") ", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": "
                               "[{\"type\": \"ByteLevel\"}]}}",
         UNSUPPORTED, "pre_tokenizer.pretokenizers", "ByteLevel");
  EXPECT(M("{\"a\": 0}", "[]") ", \"decoder\": {\"type\": \"WordPiece\"}}", UNSUPPORTED,
         "decoder.type", "WordPiece");
  EXPECT(M("{\"a\": 0}", "[]") ", \"decoder\": []}", FORMAT, "decoder", "array");

  /* sizes: the file limit is checked before anything is read */
  lh_tokenizer *t = NULL;
  assert_int_equal(lh_tokenizer_parse("{}", (size_t)LH_TOKENIZER_MAX_FILE + 1, "big.json", &t),
                   LH_ERR_LIMIT);
  assert_null(t);
  assert_non_null(strstr(lh_last_error(), "big.json"));
  /* so is what parsing will cost: 2^21 + 1 empty objects (6 MB) took ~500 MB to parse */
  size_t n_objs = (size_t)LH_TOKENIZER_MAX_JSON_OPEN + 1;
  char *objs = malloc(3 * n_objs + 64), *p = objs;
  p += sprintf(p, "{\"junk\": [");
  for (size_t i = 0; i < n_objs; i++)
    p += sprintf(p, i ? ",{}" : "{}");
  p += sprintf(p, "]}");
  assert_int_equal(lh_tokenizer_parse(objs, (size_t)(p - objs), "objs.json", &t), LH_ERR_LIMIT);
  assert_null(t);
  assert_non_null(strstr(lh_last_error(), "objs.json: "));
  assert_non_null(strstr(lh_last_error(), "2097155 of them opening an object or array"));
  free(objs);
  assert_int_equal(lh_tokenizer_load("/nonexistent/dir/tokenizer.json", &t) != LH_ERR_OK, 1);
  assert_null(t);
  assert_non_null(strstr(lh_last_error(), "/nonexistent/dir/tokenizer.json"));
}

/* ---------------------------------------------------------------- speed and threads */

/* About 1 MB of mixed English, code, numbers and CJK. */
static char *megabyte_text(size_t *len) {
  static const char *const parts[] = {
      "The quick brown fox jumps over the lazy dog. ",
      "It's 2024 and we've got 1234567 rows; ",
      "def f(x):\n    return x ** 2  # square\n",
      "中文分词测试，我们学习人工智能。",
      "Café naïve résumé — “quoted” text!\n",
      "    \t\n",
      "한국어 텍스트입니다. ",
      "🙂👍🏽 ",
  };
  size_t cap = 1 << 20, n = 0, k = 0;
  char *s = malloc(cap + 64);
  while (n < cap) {
    const char *p = parts[(k++ * 7) % (sizeof parts / sizeof parts[0])];
    size_t l = strlen(p);
    memcpy(s + n, p, l);
    n += l;
  }
  *len = n;
  return s;
}

/* limit_s: the slowest a non-sanitized build may be (generous: the suite shares the cores). */
static void time_encode(const lh_tokenizer *t, const char *label, const char *text, size_t len,
                        double limit_s) {
  int32_t *ids = NULL;
  size_t n = 0;
  double t0 = now();
  assert_int_equal(lh_tokenizer_encode(t, text, len, false, &ids, &n), LH_ERR_OK);
  double dt = now() - t0;
  fprintf(stderr, "encode %-22s %7.2f MB in %.3f s (%.1f MB/s), %zu tokens\n", label,
          (double)len / 1e6, dt, (double)len / 1e6 / dt, n);
  assert_true(n > 0);
  assert_true(dt < (SANITIZED ? 20.0 * limit_s : limit_s));
  free(ids);
}

static void test_speed(void **state) {
  (void)state;
  size_t len = 0;
  char *text = megabyte_text(&len);
  time_encode(llama3, "llama3 mixed 1 MB", text, len, 1.0);
  time_encode(qwen3, "qwen3 mixed 1 MB", text, len, 1.0);
  /* adversarial: one pre-token a megabyte long (BPE over a million symbols) */
  memset(text, 'a', len);
  time_encode(llama3, "llama3 'aaaa...' 1 MB", text, len, 3.0);
  memset(text, ' ', len);
  time_encode(qwen3, "qwen3 spaces 1 MB", text, len, 3.0);
  memset(text, 'x', len);
  time_encode(chars, "chars 1 MB", text, len, 1.0);
  free(text);
}

typedef struct job {
  const lh_tokenizer *t;
  const char *text;
  size_t len;
  int32_t *ids;
  size_t n;
  lh_err err;
} job;

static void *encode_job(void *arg) {
  job *j = arg;
  for (int r = 0; r < 3; r++) {
    free(j->ids);
    j->err = lh_tokenizer_encode(j->t, j->text, j->len, true, &j->ids, &j->n);
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  size_t len = 0;
  char *text = megabyte_text(&len);
  len /= 8;
  int32_t *ref = NULL;
  size_t ref_n = 0;
  assert_int_equal(lh_tokenizer_encode(qwen3, text, len, true, &ref, &ref_n), LH_ERR_OK);
  job jobs[4] = {{0}};
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (job){.t = qwen3, .text = text, .len = len};
    assert_int_equal(pthread_create(&th[i], NULL, encode_job, &jobs[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(jobs[i].err, LH_ERR_OK);
    assert_int_equal(jobs[i].n, ref_n);
    assert_memory_equal(jobs[i].ids, ref, ref_n * sizeof *ref);
    free(jobs[i].ids);
  }
  free(ref);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_ids),
      cmocka_unit_test(test_vocab_lookups),
      cmocka_unit_test(test_token_bytes),
      cmocka_unit_test(test_special_tokens),
      cmocka_unit_test(test_random_bytes_round_trip),
      cmocka_unit_test(test_chars_tokenizer),
      cmocka_unit_test(test_merge_order),
      cmocka_unit_test(test_added_two_passes),
      cmocka_unit_test(test_nfc_cases),
      cmocka_unit_test(test_nfc_long_mark_run),
      cmocka_unit_test(test_nfc_conformance),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_speed),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
