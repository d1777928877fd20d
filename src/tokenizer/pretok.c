/* The pre-tokenizer split patterns of GPT-2, Llama-3 and Qwen2/Qwen3, each written out as a
 * matcher over code points that returns what the regex (leftmost alternative, greedy with
 * backtracking) would match at a position. Only these exact pattern strings are recognised. */
#include <string.h>

#include "tok_internal.h"

static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char llama3_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char qwen2_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

lh__tok_pre lh__tok_pre_from_regex(const char *regex) {
  if (!strcmp(regex, gpt2_regex)) return LH__TOK_PRE_GPT2;
  if (!strcmp(regex, llama3_regex)) return LH__TOK_PRE_LLAMA3;
  if (!strcmp(regex, qwen2_regex)) return LH__TOK_PRE_QWEN2;
  return LH__TOK_PRE_NONE;
}

#define IS_L(k) (fl[k] & LH__TOK_LETTER)
#define IS_N(k) (fl[k] & LH__TOK_NUMBER)
#define IS_S(k) (fl[k] & LH__TOK_SPACE)
/* [^\s\p{L}\p{N}]: anything else, including bytes of invalid UTF-8 */
#define IS_P(k) (!(fl[k] & (LH__TOK_LETTER | LH__TOK_NUMBER | LH__TOK_SPACE)))

static uint32_t ascii_lower(uint32_t c, bool icase) {
  return icase && c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d at i: its length, or 0. Case-insensitive for ASCII letters only, as
 * the JavaScript reference ([sS], [rR][eE], ...) does. */
static size_t contraction(const uint32_t *cp, size_t n, size_t i, bool icase) {
  if (cp[i] != '\'' || i + 1 >= n) return 0;
  uint32_t a = ascii_lower(cp[i + 1], icase);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= n) return 0;
  uint32_t b = ascii_lower(cp[i + 2], icase);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

/* \s+(?!\S)|\s+ at i (a white-space code point): the run, less its last code point when a
 * non-space follows and the run is longer than one. */
static size_t space_run(const uint8_t *fl, size_t n, size_t i) {
  size_t j = i;
  while (j < n && IS_S(j))
    j++;
  if (j == n || j - i == 1) return j;
  return j - 1;
}

static size_t match_gpt2(const uint32_t *cp, const uint8_t *fl, size_t n, size_t i) {
  size_t k = contraction(cp, n, i, false);
  if (k) return i + k;
  size_t s = i + (cp[i] == ' ' && i + 1 < n ? 1 : 0); /* ` ?` */
  if (IS_L(s)) {
    while (s < n && IS_L(s))
      s++;
    return s;
  }
  if (IS_N(s)) {
    while (s < n && IS_N(s))
      s++;
    return s;
  }
  if (IS_P(s)) {
    while (s < n && IS_P(s))
      s++;
    return s;
  }
  if (IS_S(i)) return space_run(fl, n, i);
  return i + 1; /* unreachable: every code point is L, N, space or other */
}

static size_t match_llama(const uint32_t *cp, const uint8_t *fl, size_t n, size_t i,
                          size_t max_digits) {
  size_t k = contraction(cp, n, i, true);
  if (k) return i + k;
  /* [^\r\n\p{L}\p{N}]?\p{L}+ */
  size_t s = i;
  if (!IS_L(i) && !IS_N(i) && cp[i] != '\r' && cp[i] != '\n' && i + 1 < n && IS_L(i + 1)) s++;
  if (IS_L(s)) {
    while (s < n && IS_L(s))
      s++;
    return s;
  }
  /* \p{N}{1,3} (Llama-3) or \p{N} (Qwen2) */
  if (IS_N(i)) {
    size_t j = i + 1;
    while (j < n && j - i < max_digits && IS_N(j))
      j++;
    return j;
  }
  /* ` ?[^\s\p{L}\p{N}]+[\r\n]*` */
  s = i + (cp[i] == ' ' && i + 1 < n && IS_P(i + 1) ? 1 : 0);
  if (IS_P(s)) {
    while (s < n && IS_P(s))
      s++;
    while (s < n && (cp[s] == '\r' || cp[s] == '\n'))
      s++;
    return s;
  }
  if (IS_S(i)) {
    /* \s*[\r\n]+ : up to and including the last \r or \n of the white-space run */
    size_t j = i, last_nl = SIZE_MAX;
    while (j < n && IS_S(j)) {
      if (cp[j] == '\r' || cp[j] == '\n') last_nl = j;
      j++;
    }
    if (last_nl != SIZE_MAX) return last_nl + 1;
    return space_run(fl, n, i);
  }
  return i + 1;
}

size_t lh__tok_pre_match(lh__tok_pre pre, const uint32_t *cp, const uint8_t *fl, size_t n,
                         size_t i) {
  switch (pre) {
  case LH__TOK_PRE_GPT2:
    return match_gpt2(cp, fl, n, i);
  case LH__TOK_PRE_LLAMA3:
    return match_llama(cp, fl, n, i, 3);
  case LH__TOK_PRE_QWEN2:
    return match_llama(cp, fl, n, i, 1);
  case LH__TOK_PRE_NONE:
    break;
  }
  return n;
}
