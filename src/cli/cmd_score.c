/* `longhaul score`: reads lines of JSON token-id arrays, checks every line before any work, then
 * runs the model forward over packed batches and prints one {"logprobs":[...]} line per input
 * line, in order: log p(token i | tokens before it) for every token after the first. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "cli.h"
#include "longhaul/model.h"

#define CMD              "score"
#define BATCH_TOKENS     4096       /* tokens per forward pass, unless one line is longer */
#define MAX_LOGIT_FLOATS (1L << 26) /* keep the (tokens, V) logits of a batch near 256 MiB */
/* A line holds at most max_position_embeddings ids: this many bytes each ("151643, " is 8) and
 * a little for brackets and spaces. A longer line is refused as soon as its bytes pass that,
 * so an endless one (/dev/zero) costs no more memory. */
#define LINE_BYTES_PER_ID 12
#define LINE_SLACK        4096
/* Tokens of all lines together, which are held until every line is checked: 1 GiB of ids. */
#define MAX_TOTAL_TOKENS ((size_t)1 << 28)

static const lh__flag flags[] = {
    {"model", "DIR", true,
     "model directory (config.json + model.safetensors), or a run directory: its latest "
     "checkpoint"},
    {"input", "FILE", true, "JSON arrays of token ids, one per line (- for stdin)"},
    {"threads", "K", false, "threads for the forward pass (default: all cores)"},
};

/* Token ids of every input line, end to end; line i is tokens[start[i] .. start[i+1]). */
typedef struct lines {
  int32_t *tokens;
  size_t n_tokens, cap_tokens;
  size_t *start;
  size_t n_lines, cap_lines;
  int max_len;
} lines;

static void lines_push_token(lines *L, int32_t tok) {
  if (L->n_tokens == L->cap_tokens) {
    L->cap_tokens = L->cap_tokens ? 2 * L->cap_tokens : 4096;
    L->tokens = realloc(L->tokens, L->cap_tokens * sizeof *L->tokens);
    LH_CHECK(L->tokens, "out of memory holding %zu input tokens", L->cap_tokens);
  }
  L->tokens[L->n_tokens++] = tok;
}

static void lines_end_line(lines *L) {
  if (L->n_lines + 2 > L->cap_lines) {
    L->cap_lines = L->cap_lines ? 2 * L->cap_lines : 256;
    L->start = realloc(L->start, L->cap_lines * sizeof *L->start);
    LH_CHECK(L->start, "out of memory holding %zu input lines", L->cap_lines);
  }
  if (L->n_lines == 0) L->start[0] = 0;
  L->start[++L->n_lines] = L->n_tokens;
}

/* Parses and checks one line; returns LH__ARGS_CONTINUE or prints "FILE:LINE: ..." and
 * returns 1. */
static int parse_line(const char *path, size_t lineno, const char *text, size_t len,
                      const lh_config *cfg, lines *L) {
  char where[4200];
  snprintf(where, sizeof where, "%s:%zu", path, lineno);
  int32_t *ids;
  size_t n;
  int rc = lh__parse_id_array(CMD, where, text, len, cfg->vocab_size, cfg->max_positions, &ids, &n);
  if (rc != LH__ARGS_CONTINUE) return rc;
  for (size_t i = 0; i < n; i++)
    lines_push_token(L, ids[i]);
  free(ids);
  if ((int)n > L->max_len) L->max_len = (int)n;
  lines_end_line(L);
  return LH__ARGS_CONTINUE;
}

/* Reads every line of path (a regular file, or "-": standard input, which may be a pipe). */
static int read_lines(const char *path, const lh_config *cfg, lines *L) {
  bool is_stdin = !strcmp(path, "-");
  const char *name = is_stdin ? "<stdin>" : path;
  FILE *f = stdin;
  if (!is_stdin) {
    int fd = -1;
    if (lh_file_open_read(path, &fd) != LH_ERR_OK) return lh__cli_fail(CMD);
    if (!(f = fdopen(fd, "r"))) {
      close(fd);
      return lh__cli_error(CMD, LH__EXIT_FAIL, "%s: cannot open: %s", path, strerror(errno));
    }
  }
  size_t max_line = (size_t)cfg->max_positions * LINE_BYTES_PER_ID + LINE_SLACK;
  char *buf = NULL;
  size_t cap = 0, lineno = 0, got = 0;
  int rc = LH__ARGS_CONTINUE;
  while (rc == LH__ARGS_CONTINUE) {
    if (lh_file_getline(f, max_line, &buf, &cap, &got) != LH_ERR_OK) {
      rc = lh__cli_error(CMD, LH__EXIT_FAIL, "%s:%zu: %s", name, lineno + 1, lh_last_error());
      break;
    }
    if (got == 0) break;
    rc = parse_line(name, ++lineno, buf, got, cfg, L);
    if (rc == LH__ARGS_CONTINUE && L->n_tokens > MAX_TOTAL_TOKENS)
      rc = lh__cli_error(CMD, LH__EXIT_FAIL, "%s:%zu: more than %zu token ids in all lines", name,
                         lineno, MAX_TOTAL_TOKENS);
  }
  free(buf);
  if (!is_stdin) fclose(f);
  return rc;
}

static void print_logprobs(const float *lp, int n) {
  fputs("{\"logprobs\":[", stdout);
  for (int i = 0; i < n; i++) {
    if (i) fputc(',', stdout);
    if (isfinite(lp[i]))
      printf("%.9g", (double)lp[i]);
    else
      fputs("null", stdout);
  }
  fputs("]}\n", stdout);
}

/* Scores every line in order, packing consecutive lines into batches of <= max_tokens. */
static int score_lines(lh_model *m, const lines *L) {
  long budget = MAX_LOGIT_FLOATS / m->cfg.vocab_size;
  if (budget > BATCH_TOKENS) budget = BATCH_TOKENS;
  if (budget < L->max_len) budget = L->max_len;
  int max_tokens = (int)budget;
  lh_train *t = NULL;
  if (lh_train_create(m, max_tokens, L->max_len, &t) != LH_ERR_OK) return lh__cli_fail(CMD);
  int *seq_start = lh_xmalloc(((size_t)max_tokens + 1) * sizeof *seq_start);
  float *weight = lh_xmalloc((size_t)max_tokens * sizeof *weight);
  float *logprob = lh_xmalloc((size_t)max_tokens * sizeof *logprob);
  int rc = LH__EXIT_OK;
  for (size_t first = 0; first < L->n_lines;) {
    size_t base = L->start[first], last = first;
    while (last < L->n_lines && L->start[last + 1] - base <= (size_t)max_tokens)
      last++;
    int n_seqs = (int)(last - first);
    for (int s = 0; s <= n_seqs; s++)
      seq_start[s] = (int)(L->start[first + (size_t)s] - base);
    for (int s = 0; s < n_seqs; s++)
      for (int i = seq_start[s]; i < seq_start[s + 1]; i++)
        weight[i] = i == seq_start[s] ? 0.0f : 1.0f;
    lh_batch b = {.n_seqs = n_seqs,
                  .seq_start = seq_start,
                  .tokens = L->tokens + base,
                  .loss_weight = weight};
    if (lh_batch_validate(t, &b) != LH_ERR_OK) {
      rc = lh__cli_fail(CMD);
      break;
    }
    lh_train_forward(t, &b, logprob);
    for (int s = 0; s < n_seqs; s++)
      print_logprobs(logprob + seq_start[s] + 1, seq_start[s + 1] - seq_start[s] - 1);
    first = last;
  }
  free(seq_start);
  free(weight);
  free(logprob);
  lh_train_free(t);
  return rc;
}

int lh__cmd_score(int argc, char **argv) {
  lh__args a = {
      .cmd = CMD,
      .about = "Prints, for each input line (a JSON array of token ids), one line "
               "{\"logprobs\":[...]} with the\nlog-probability of every token after the first "
               "given the tokens before it, in input order.\nFILE is a regular file, or - for "
               "standard input (which may be a pipe). A line may be\n12 bytes per position of "
               "the model's context (max_position_embeddings) plus 4096 bytes\nlong; all lines "
               "together hold at most 2^28 ids.",
      .flags = flags,
      .n_flags = (int)(sizeof flags / sizeof flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_model(&a, "model")) != LH__ARGS_CONTINUE) return rc;
  long threads = 0;
  if ((rc = lh__args_int(&a, "threads", 0, 4096, 0, &threads)) != LH__ARGS_CONTINUE) return rc;
  const char *model_dir = lh__args_str(&a, "model", NULL);
  const char *input = lh__args_str(&a, "input", NULL);
  lh_set_threads((int)threads);

  lh_model *m = NULL;
  if (lh_model_load(model_dir, &m) != LH_ERR_OK) return lh__cli_fail(CMD);
  lines L = {0};
  rc = read_lines(input, &m->cfg, &L);
  if (rc == LH__ARGS_CONTINUE) rc = L.n_lines ? score_lines(m, &L) : LH__EXIT_OK;
  if (rc == LH__EXIT_OK) rc = lh__cli_flush_stdout(CMD);
  free(L.tokens);
  free(L.start);
  lh_model_free(m);
  return rc;
}
