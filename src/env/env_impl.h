/* Internal contract between the environment front end (env.c) and each environment: a table of
 * operations, the per-split generation keys, and a small Philox-backed draw helper. */
#ifndef LONGHAUL_ENV_IMPL_H
#define LONGHAUL_ENV_IMPL_H

#include "longhaul/env.h"

typedef struct {
  lh_err (*task)(lh_env *env, lh_split split, uint64_t index, lh_env_task *task);
  lh_err (*score)(lh_env *env, const lh_env_task *task, const char *text, size_t len,
                  lh_env_result *out);
  uint64_t (*size)(const lh_env *env, lh_split split);
  void (*free)(lh_env *env);
} lh__env_ops;

struct lh_env {
  lh_env_config cfg;
  const lh__env_ops *ops;
  uint64_t key[2]; /* Philox key per split: hash of the config and the split */
  void *impl;
};

/* Draws from Philox(key, stream = task index, position = attempt * 2^32 + k). */
typedef struct {
  uint64_t key, stream, pos;
  uint32_t buf[4];
  int used;
} lh__env_rng;
void lh__env_rng_init(lh__env_rng *r, uint64_t key, uint64_t stream, uint64_t attempt);
/* Uniform integer in [lo, hi]. */
int64_t lh__env_rng_range(lh__env_rng *r, int64_t lo, int64_t hi);

uint64_t lh__env_hash(const void *data, size_t len, uint64_t h);
uint64_t lh__env_mix(uint64_t x);
/* Split of a built-in instance, from a hash of the env name and the prompt: 1 in 8 is test. */
lh_split lh__env_instance_split(const char *name, const char *prompt);
/* The completion up to the first "\n", without surrounding spaces, tabs and "\r". */
void lh__env_first_line(const char *text, size_t len, const char **start, size_t *n);
char *lh__env_strndup(const char *s, size_t n);
/* Text from outside (a spec, a file, a program's reply) for a message or log line: lh_escape into
 * a buffer that lives to the end of the enclosing block; paths get more room. */
#define LH__ENV_ESC(s, n)      lh_escape((s), (n), (char[160]){0}, 160)
#define LH__ENV_ESC_PATH(s, n) lh_escape((s), (n), (char[512]){0}, 512)

/* Generates task `index` of `split` for a built-in env: draws instances with `gen` (attempt
 * 0, 1, ...) until one belongs to `split` (lh__env_instance_split), so splits are disjoint. */
typedef lh_err (*lh__env_gen_fn)(lh_env *env, lh__env_rng *r, lh_env_task *task);
lh_err lh__env_builtin_task(lh_env *env, lh_split split, uint64_t index, lh_env_task *task,
                            lh__env_gen_fn gen);

extern const lh__env_ops lh__env_countdown_ops;
extern const lh__env_ops lh__env_jsonl_ops;
extern const lh__env_ops lh__env_exec_ops;
lh_err lh__env_jsonl_init(lh_env *env);
lh_err lh__env_exec_init(lh_env *env);

/* exec's readers of a reply's fields, outside exec.c for the fuzz target: a reply to
 * "generate" (out: lh_env_task) and to "score" (out: lh_env_result); LH_ERR_FORMAT names the
 * field. */
struct json_t;
lh_err lh__exec_take_task(lh_env *env, const char *what, struct json_t *reply, void *out);
lh_err lh__exec_take_result(lh_env *env, const char *what, struct json_t *reply, void *out);

#endif
