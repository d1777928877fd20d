/* `longhaul tokenize`: encodes text with a tokenizer.json (or the built-in character tokenizer)
 * and prints the ids as one JSON array line, or decodes comma-separated ids and prints exactly
 * the bytes they stand for (no newline added). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "longhaul/tokenizer.h"

#define CMD            "tokenize"
#define MAX_TEXT_BYTES (256u << 20)

static const lh__flag flags[] = {
    {"tokenizer", "FILE|DIR|chars", true,
     "tokenizer.json, a model directory holding one, or chars (built-in)"},
    {"text", "S", false, "text to encode"},
    {"file", "F", false, "file whose bytes to encode (- for stdin)"},
    {"decode", "IDS", false, "comma-separated token ids to decode instead"},
    {"jsonl", NULL, false,
     "with --file: each line is a JSON string to encode; prints one id array per line"},
    {"no-special", NULL, false,
     "encode special-token text as plain text; with --decode, leave special tokens out"},
};

/* Loads FILE, DIR/tokenizer.json or the built-in "chars". */
static int load(const char *spec, lh_tokenizer **t) {
  if (!strcmp(spec, "chars")) {
    char *json = lh_tokenizer_chars_json();
    lh_err e = lh_tokenizer_parse(json, strlen(json), "chars tokenizer", t);
    free(json);
    return e == LH_ERR_OK ? LH__ARGS_CONTINUE : lh__cli_fail(CMD);
  }
  struct stat st;
  char *path = stat(spec, &st) == 0 && S_ISDIR(st.st_mode) ? lh_path_join(spec, "tokenizer.json")
                                                           : lh_xstrdup(spec);
  lh_err e = lh_tokenizer_load(path, t);
  free(path);
  return e == LH_ERR_OK ? LH__ARGS_CONTINUE : lh__cli_fail(CMD);
}

static int read_stdin(char **out, size_t *len) {
  size_t cap = 1 << 16, n = 0, got;
  char *buf = malloc(cap + 1);
  while (buf && (got = fread(buf + n, 1, cap - n, stdin)) > 0) {
    n += got;
    if (n > MAX_TEXT_BYTES) {
      free(buf);
      return lh__cli_error(CMD, LH__EXIT_FAIL, "<stdin>: more than %u bytes", MAX_TEXT_BYTES);
    }
    if (n == cap) {
      char *nb = realloc(buf, (cap *= 2) + 1);
      if (!nb) free(buf);
      buf = nb;
    }
  }
  if (!buf) return lh__cli_error(CMD, LH__EXIT_FAIL, "out of memory reading <stdin>");
  if (ferror(stdin)) {
    free(buf);
    return lh__cli_error(CMD, LH__EXIT_FAIL, "<stdin>: read error");
  }
  *out = buf;
  *len = n;
  return LH__ARGS_CONTINUE;
}

static int do_decode(const lh_tokenizer *t, const char *spec, bool skip_special) {
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = lh__parse_ids(CMD, "decode", spec, &ids, &n);
  if (rc != LH__ARGS_CONTINUE) return rc;
  for (size_t i = 0; i < n; i++) /* the library skips unknown ids; a typed one is a mistake */
    if (!lh_tokenizer_token(t, ids[i])) {
      rc = lh__cli_error(CMD, LH__EXIT_FAIL,
                         "--decode: token id %d at position %zu is not in the vocabulary (ids "
                         "0..%d)",
                         ids[i], i, lh_tokenizer_vocab_size(t) - 1);
      free(ids);
      return rc;
    }
  char *text = NULL;
  size_t len = 0;
  if (lh_tokenizer_decode(t, ids, n, skip_special, &text, &len) != LH_ERR_OK) {
    free(ids);
    return lh__cli_fail(CMD);
  }
  fwrite(text, 1, len, stdout);
  free(text);
  free(ids);
  return LH__EXIT_OK;
}

static int do_encode(const lh_tokenizer *t, const char *text, size_t len, bool allow_special) {
  int32_t *ids = NULL;
  size_t n = 0;
  if (lh_tokenizer_encode(t, text, len, allow_special, &ids, &n) != LH_ERR_OK)
    return lh__cli_fail(CMD);
  fputc('[', stdout);
  for (size_t i = 0; i < n; i++)
    printf(i ? ",%d" : "%d", ids[i]);
  fputs("]\n", stdout);
  free(ids);
  return LH__EXIT_OK;
}

/* --jsonl: encodes each line of text (a JSON string) as do_encode does. */
static int do_encode_lines(const lh_tokenizer *t, const char *path, const char *text, size_t len,
                           bool allow_special) {
  size_t line = 0;
  for (size_t i = 0; i < len; line++) {
    const char *nl = memchr(text + i, '\n', len - i);
    size_t end = nl ? (size_t)(nl - text) : len;
    json_error_t err;
    json_t *v = json_loadb(text + i, end - i, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    int rc = json_is_string(v)
                 ? do_encode(t, json_string_value(v), json_string_length(v), allow_special)
                 : lh__cli_error(CMD, LH__EXIT_FAIL, "%s:%zu: expected a JSON string, found %s",
                                 path, line + 1, v ? lh_json_type_name(v) : err.text);
    json_decref(v);
    if (rc != LH__EXIT_OK) return rc;
    i = end + 1;
  }
  return LH__EXIT_OK;
}

int lh__cmd_tokenize(int argc, char **argv) {
  lh__args a = {.cmd = CMD,
                .about = "Encodes text (--text or --file) and prints its token ids as one JSON "
                         "array line, or decodes\n--decode ids and prints the text's bytes "
                         "exactly. Special tokens written in the text (<|im_start|>)\nbecome "
                         "their ids unless --no-special.",
                .flags = flags,
                .n_flags = (int)(sizeof flags / sizeof flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  int sources = lh__args_has(&a, "text") + lh__args_has(&a, "file") + lh__args_has(&a, "decode");
  if (sources != 1)
    return lh__cli_error(CMD, LH__EXIT_USAGE,
                         "give exactly one of --text, --file or --decode (see longhaul %s --help)",
                         CMD);
  bool no_special = lh__args_has(&a, "no-special");
  if (lh__args_has(&a, "jsonl") && !lh__args_has(&a, "file"))
    return lh__cli_error(CMD, LH__EXIT_USAGE, "--jsonl reads lines of --file");

  lh_tokenizer *t = NULL;
  if ((rc = load(lh__args_str(&a, "tokenizer", NULL), &t)) != LH__ARGS_CONTINUE) return rc;
  if (lh__args_has(&a, "decode")) {
    rc = do_decode(t, lh__args_str(&a, "decode", NULL), no_special);
  } else if (lh__args_has(&a, "text")) {
    const char *text = lh__args_str(&a, "text", NULL);
    rc = do_encode(t, text, strlen(text), !no_special);
  } else {
    const char *path = lh__args_str(&a, "file", NULL);
    char *text = NULL;
    size_t len = 0;
    if (!strcmp(path, "-"))
      rc = read_stdin(&text, &len);
    else
      rc = lh_file_read(path, MAX_TEXT_BYTES, &text, &len) == LH_ERR_OK ? LH__ARGS_CONTINUE
                                                                        : lh__cli_fail(CMD);
    if (rc == LH__ARGS_CONTINUE)
      rc = lh__args_has(&a, "jsonl") ? do_encode_lines(t, path, text, len, !no_special)
                                     : do_encode(t, text, len, !no_special);
    free(text);
  }
  lh_tokenizer_free(t);
  if (rc == LH__EXIT_OK) rc = lh__cli_flush_stdout(CMD);
  return rc;
}
