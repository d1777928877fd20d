/* The KV-cache forward against the full-sequence training forward: on the same bf16 weights,
 * prefill, one-token decode, mixed batches of several slots and the tiled (many-row) and
 * streamed (few-row) products must all give the training forward's logits to fp32 tolerance. */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include "longhaul/gen.h"
#include "longhaul/infer.h"
#include "longhaul/model.h"
#include "longhaul/tensor.h"

#include "near.h"
#include "sanitized.h"

#define T 40

/* Under a sanitizer, allocations above its maximum (1 or 3 TiB) return NULL as plain malloc
 * does, instead of stopping the program: test_allocation_failures asks for more. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
  return "allocator_may_return_null=1";
}
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) {
  return "allocator_may_return_null=1";
}

typedef struct {
  lh_model *m;
  lh_infer *inf;
  int32_t tokens[3][T];
  float *ref[3]; /* (T, V) training-forward logits of each sequence */
} setup;

/* A random model whose fp32 weights are exactly bf16 values, so both paths see one model. */
/* attn_bias: Llama/Qwen3 attention_bias (q/k/v and o_proj biases). */
static void make_setup(setup *s, lh_arch arch, int tied, int kv_heads, int attn_bias) {
  lh_config c;
  assert_int_equal(lh_config_preset("tiny", arch, &c), LH_ERR_OK);
  c.vocab_size = 80;
  c.hidden_size = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = kv_heads;
  c.head_dim = 16;
  c.intermediate_size = 96;
  c.max_positions = 64;
  c.tie_embeddings = tied;
  if (attn_bias) c.qkv_bias = c.o_bias = true;
  assert_int_equal(lh_model_create(&c, &s->m), LH_ERR_OK);
  lh_model_init_random(s->m, 11);
  for (size_t i = 0; i < s->m->n_params; i++) {
    uint32_t r[4];
    lh_philox(99, 1, i, r);
    float v =
        s->m->params[i] * 10.0f + (float)(r[0] % 1000) * 1e-4f; /* biases, norms non-trivial */
    s->m->params[i] = lh_f32_from_bf16(lh_bf16_from_f32(v));
  }
  assert_int_equal(lh_infer_from_model(s->m, &s->inf), LH_ERR_OK);

  lh_train *t;
  assert_int_equal(lh_train_create(s->m, T, T, &t), LH_ERR_OK);
  for (int q = 0; q < 3; q++) {
    int seq_start[2] = {0, T};
    float w[T] = {0};
    float lp[T];
    for (int i = 0; i < T; i++) {
      uint32_t r[4];
      lh_philox(5, (uint64_t)q, (uint64_t)i, r);
      s->tokens[q][i] = (int32_t)(r[0] % (uint32_t)c.vocab_size);
    }
    lh_batch b = {1, seq_start, s->tokens[q], w};
    lh_train_forward(t, &b, lp);
    s->ref[q] = malloc((size_t)T * c.vocab_size * sizeof(float));
    memcpy(s->ref[q], lh_train_logits(t), (size_t)T * c.vocab_size * sizeof(float));
  }
  lh_train_free(t);
}

static void free_setup(setup *s) {
  for (int q = 0; q < 3; q++)
    free(s->ref[q]);
  lh_infer_free(s->inf);
  lh_model_free(s->m);
}

static void expect_row(const setup *s, int q, int pos, const float *got, const char *what) {
  int V = s->m->cfg.vocab_size;
  const float *want = s->ref[q] + (size_t)pos * V;
  double worst = 0, scale = 0;
  for (int j = 0; j < V; j++) {
    worst = near_worst(worst, fabs((double)got[j] - want[j]));
    scale = fmax(scale, fabs(want[j]));
  }
  if (!(worst <= 2e-5 * scale + 1e-6))
    fail_msg("%s: sequence %d position %d: worst logit error %.3e (max |logit| %.3e)", what, q, pos,
             worst, scale);
}

static void check_paths(lh_arch arch, int tied, int kv_heads, int attn_bias) {
  setup s;
  make_setup(&s, arch, tied, kv_heads, attn_bias);
  int V = s.m->cfg.vocab_size;
  float *logits = malloc((size_t)3 * T * V * sizeof(float));
  lh_kv *kv;
  assert_int_equal(lh_kv_create(s.inf, 3, T, 3 * T, &kv), LH_ERR_OK);
  lh_infer_row rows[3 * T];

  /* 1. whole sequence as one prefill (many rows: several row tiles), logits for every row */
  for (int i = 0; i < T; i++)
    rows[i] = (lh_infer_row){0, i, s.tokens[0][i], true};
  assert_int_equal(lh_infer_forward(s.inf, kv, rows, T, logits), LH_ERR_OK);
  for (int i = 0; i < T; i++)
    expect_row(&s, 0, i, logits + (size_t)i * V, "prefill");

  /* 2. prefill 10 tokens without logits but the last, then decode one token at a time */
  for (int i = 0; i < 10; i++)
    rows[i] = (lh_infer_row){1, i, s.tokens[1][i], i == 9};
  assert_int_equal(lh_infer_forward(s.inf, kv, rows, 10, logits), LH_ERR_OK);
  expect_row(&s, 1, 9, logits, "prefill last row");
  for (int i = 10; i < T; i++) {
    rows[0] = (lh_infer_row){1, i, s.tokens[1][i], true};
    assert_int_equal(lh_infer_forward(s.inf, kv, rows, 1, logits), LH_ERR_OK);
    expect_row(&s, 1, i, logits, "decode");
  }

  /* 3. three slots decoding together, with slot 2 prefilling in the same forward (chunked
   *    prefill alongside decode), then batches of 3 rows */
  for (int i = 0; i < 5; i++)
    rows[i] = (lh_infer_row){2, i, s.tokens[2][i], true};
  rows[5] = (lh_infer_row){0, 0, s.tokens[0][0], true}; /* slot 0 restarts its sequence */
  assert_int_equal(lh_infer_forward(s.inf, kv, rows, 6, logits), LH_ERR_OK);
  for (int i = 0; i < 5; i++)
    expect_row(&s, 2, i, logits + (size_t)i * V, "mixed prefill");
  expect_row(&s, 0, 0, logits + (size_t)5 * V, "mixed decode");
  for (int i = 1; i < T; i++) {
    int n = 0;
    rows[n++] = (lh_infer_row){0, i, s.tokens[0][i], true};
    if (i + 4 < T) rows[n++] = (lh_infer_row){2, i + 4, s.tokens[2][i + 4], true};
    assert_int_equal(lh_infer_forward(s.inf, kv, rows, n, logits), LH_ERR_OK);
    expect_row(&s, 0, i, logits, "batched decode");
    if (n > 1) expect_row(&s, 2, i + 4, logits + V, "batched decode");
  }

  /* 5 (below, after the refusals) repeats the prefill one row per forward */
  /* 4. bad rows are refused before anything is computed */
  rows[0] = (lh_infer_row){3, 0, 1, true};
  assert_int_equal(lh_infer_forward(s.inf, kv, rows, 1, logits), LH_ERR_LIMIT);
  rows[0] = (lh_infer_row){0, T, 1, true};
  assert_int_equal(lh_infer_forward(s.inf, kv, rows, 1, logits), LH_ERR_LIMIT);
  rows[0] = (lh_infer_row){0, 0, V, true};
  assert_int_equal(lh_infer_forward(s.inf, kv, rows, 1, logits), LH_ERR_LIMIT);
  assert_int_equal(lh_infer_forward(s.inf, kv, rows, 3 * T + 1, logits), LH_ERR_LIMIT);
  lh_kv *big;
  assert_int_equal(lh_kv_create(s.inf, 1, 65, 1, &big), LH_ERR_LIMIT); /* max_positions 64 */

  /* 5. weights stay bf16 at any row count, and a row's logits do not depend on the other rows
   *    of its forward (lh_bf16mm sums each row alone): slot 1's sequence in one forward equals
   *    it one row per forward, bit for bit (a verifier may batch differently from a worker) */
  size_t n_params = lh_config_n_params(&s.m->cfg);
  assert_int_equal(lh_infer_weight_bytes(s.inf), 2 * n_params);
  for (int i = 0; i < T; i++)
    rows[i] = (lh_infer_row){1, i, s.tokens[1][i], true};
  assert_int_equal(lh_infer_forward(s.inf, kv, rows, T, logits), LH_ERR_OK);
  for (int i = 0; i < T; i++)
    expect_row(&s, 1, i, logits + (size_t)i * V, "prefill again");
  float *alone = malloc((size_t)V * sizeof(float));
  for (int i = 0; i < T; i++) {
    assert_int_equal(lh_infer_forward(s.inf, kv, &rows[i], 1, alone), LH_ERR_OK);
    if (memcmp(alone, logits + (size_t)i * V, (size_t)V * sizeof(float)))
      fail_msg("position %d: logits of a row alone differ from the same row among %d", i, T);
  }
  free(alone);

  lh_kv_free(kv);
  free(logits);
  free_setup(&s);
}

static void test_qwen2_gqa_tied(void **state) {
  check_paths(LH_ARCH_QWEN2, 1, 2, 0);
}
static void test_llama_mha_untied(void **state) {
  check_paths(LH_ARCH_LLAMA, 0, 4, 0);
}
static void test_llama_mqa_tied(void **state) {
  check_paths(LH_ARCH_LLAMA, 1, 1, 0);
}
static void test_qwen3_qk_norm(void **state) {
  check_paths(LH_ARCH_QWEN3, 1, 2, 0);
}
/* attention_bias: q/k/v biases and the o_proj bias, added after the o product */
static void test_llama_attention_bias(void **state) {
  check_paths(LH_ARCH_LLAMA, 0, 2, 1);
}
static void test_qwen3_attention_bias(void **state) {
  check_paths(LH_ARCH_QWEN3, 1, 2, 1);
}

/* Loading a directory straight to bf16 (F32 file: rounded; BF16 file: copied) gives the same
 * policy as rounding the in-memory model. */
static void test_load_bf16(void **state) {
  setup s;
  make_setup(&s, LH_ARCH_QWEN2, 0, 2, 0);
  int V = s.m->cfg.vocab_size;
  char dir[] = "/tmp/longhaul-test-infer-XXXXXX";
  assert_non_null(mkdtemp(dir));
  float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
  lh_infer_row rows[T];
  for (int i = 0; i < T; i++)
    rows[i] = (lh_infer_row){0, i, s.tokens[0][i], i == T - 1};
  for (int dtype = 0; dtype < 2; dtype++) {
    assert_int_equal(lh_model_save(s.m, dir, dtype ? LH_SAVE_BF16 : LH_SAVE_F32), LH_ERR_OK);
    lh_infer *loaded;
    assert_int_equal(lh_infer_load(dir, &loaded), LH_ERR_OK);
    assert_int_equal(lh_infer_weight_bytes(loaded), lh_infer_weight_bytes(s.inf));
    lh_kv *k1, *k2;
    assert_int_equal(lh_kv_create(s.inf, 1, T, T, &k1), LH_ERR_OK);
    assert_int_equal(lh_kv_create(loaded, 1, T, T, &k2), LH_ERR_OK);
    assert_int_equal(lh_infer_forward(s.inf, k1, rows, T, a), LH_ERR_OK);
    assert_int_equal(lh_infer_forward(loaded, k2, rows, T, b), LH_ERR_OK);
    assert_memory_equal(a, b, (size_t)V * sizeof(float));
    lh_kv_free(k1);
    lh_kv_free(k2);
    lh_infer_free(loaded);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  free(a);
  free(b);
  free_setup(&s);
}

/* Generates 4 sampled completions of 12 tokens with a generator made while `made` OpenMP
 * threads were configured and run with `run`. */
static void generate_with(lh_infer *inf, int made, int run, int32_t out[4][12]) {
  lh_set_threads(made);
  lh_generator *g;
  assert_int_equal(lh_generator_create(inf, 4, 32, 0, &g), LH_ERR_OK);
  lh_set_threads(run);
  int32_t prompt[3] = {1, 2, 3};
  lh_gen_request reqs[4];
  lh_gen_output outs[4];
  float lp[4][12], lpm[4][12];
  for (int i = 0; i < 4; i++) {
    reqs[i] = (lh_gen_request){prompt, 3, (uint64_t)i};
    outs[i] = (lh_gen_output){out[i], lp[i], lpm[i], 0, 0};
  }
  lh_gen_config cfg = lh_gen_defaults();
  cfg.max_new = 12;
  cfg.seed = 5;
  assert_int_equal(lh_generate(g, &cfg, reqs, 4, outs, NULL), LH_ERR_OK);
  for (int i = 0; i < 4; i++)
    assert_int_equal(outs[i].n, 12);
  lh_generator_free(g);
}

/* Per-thread scratch (attention scores, sampler scratch, attention-backward dS) is sized by
 * the thread count when the cache, generator or training state is made; raising it with
 * lh_set_threads afterwards must neither overrun it (AddressSanitizer sees the overflow this
 * used to be) nor change a result. */
static void test_threads_raised_after_create(void **state) {
  int threads = lh_threads();
  setup s;
  make_setup(&s, LH_ARCH_QWEN2, 1, 2, 0);
  int V = s.m->cfg.vocab_size;
  float *a = malloc((size_t)T * V * sizeof(float)), *b = malloc((size_t)T * V * sizeof(float));
  lh_infer_row rows[T];
  for (int i = 0; i < T; i++)
    rows[i] = (lh_infer_row){0, i, s.tokens[0][i], true};
  lh_kv *k1, *k4;
  lh_set_threads(1);
  assert_int_equal(lh_kv_create(s.inf, 1, T, T, &k1), LH_ERR_OK);
  lh_set_threads(4);
  assert_int_equal(lh_kv_create(s.inf, 1, T, T, &k4), LH_ERR_OK);
  assert_int_equal(lh_infer_forward(s.inf, k1, rows, T, a), LH_ERR_OK);
  assert_int_equal(lh_infer_forward(s.inf, k4, rows, T, b), LH_ERR_OK);
  assert_memory_equal(a, b, (size_t)T * V * sizeof(float));
  lh_kv_free(k1);
  lh_kv_free(k4);

  int32_t g1[4][12], g4[4][12];
  generate_with(s.inf, 1, 4, g1);
  generate_with(s.inf, 4, 4, g4);
  assert_memory_equal(g1, g4, sizeof g1);

  /* three sequences so several (sequence, kv head) pairs run in the backward's loop */
  int seq_start[4] = {0, 12, 30, T};
  float w[T], lp[T];
  for (int i = 0; i < T; i++)
    w[i] = i == 0 || i == 12 || i == 30 ? 0.0f : 1.0f;
  lh_batch batch = {3, seq_start, s.tokens[1], w};
  lh_train *t1, *t4;
  lh_set_threads(1);
  assert_int_equal(lh_train_create(s.m, T, T, &t1), LH_ERR_OK);
  lh_set_threads(4);
  assert_int_equal(lh_train_create(s.m, T, T, &t4), LH_ERR_OK);
  float l1 = lh_train_ce_step(t1, &batch, lp), l4 = lh_train_ce_step(t4, &batch, lp);
  assert_true(l1 == l4);
  assert_memory_equal(lh_train_grads(t1), lh_train_grads(t4), s.m->n_params * sizeof(float));
  lh_train_free(t1);
  lh_train_free(t4);
  lh_set_threads(threads);
  free(a);
  free(b);
  free_setup(&s);
}

/* lh_infer_update takes only a model with the policy's forward: the same parameter count with
 * another head layout is refused, naming the field, and leaves the policy as it was. */
static void test_update_checks_config(void **state) {
  lh_config a, b;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_LLAMA, &a), LH_ERR_OK);
  b = a;
  b.n_heads = 8;
  b.n_kv_heads = 4;
  b.head_dim = 16;
  lh_model *ma, *mb, *ma2;
  assert_int_equal(lh_model_create(&a, &ma), LH_ERR_OK);
  assert_int_equal(lh_model_create(&b, &mb), LH_ERR_OK);
  assert_int_equal(lh_model_create(&a, &ma2), LH_ERR_OK);
  assert_int_equal(ma->n_params, mb->n_params);
  lh_model_init_random(ma, 1);
  lh_model_init_random(mb, 2);
  lh_model_init_random(ma2, 3);
  lh_infer *p, *want;
  assert_int_equal(lh_infer_from_model(ma, &p), LH_ERR_OK);
  assert_int_equal(lh_infer_update(p, mb), LH_ERR_MISMATCH);
  assert_non_null(strstr(lh_last_error(), "num_attention_heads: 4 vs 8"));
  assert_int_equal(lh_infer_config(p)->n_heads, 4);
  /* a model of the same config is taken: the policy becomes its rounding */
  assert_int_equal(lh_infer_update(p, ma2), LH_ERR_OK);
  assert_int_equal(lh_infer_from_model(ma2, &want), LH_ERR_OK);
  int V = a.vocab_size;
  float *x = malloc((size_t)V * sizeof(float)), *y = malloc((size_t)V * sizeof(float));
  lh_infer_row row = {0, 0, 7, true};
  lh_kv *k1, *k2;
  assert_int_equal(lh_kv_create(p, 1, 4, 1, &k1), LH_ERR_OK);
  assert_int_equal(lh_kv_create(want, 1, 4, 1, &k2), LH_ERR_OK);
  assert_int_equal(lh_infer_forward(p, k1, &row, 1, x), LH_ERR_OK);
  assert_int_equal(lh_infer_forward(want, k2, &row, 1, y), LH_ERR_OK);
  assert_memory_equal(x, y, (size_t)V * sizeof(float));
  lh_kv_free(k1);
  lh_kv_free(k2);
  free(x);
  free(y);
  lh_infer_free(p);
  lh_infer_free(want);
  lh_model_free(ma);
  lh_model_free(mb);
  lh_model_free(ma2);
}

/* A patch applied with lh_infer_set_range gives the other model's policy bit for bit, in the
 * bf16 slab and in the fp32 copy products of many rows read; a range outside the slab is
 * refused and changes nothing. */
static void test_set_range(void **state) {
  (void)state;
  lh_config c;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_QWEN2, &c), LH_ERR_OK);
  lh_model *ma, *mb;
  assert_int_equal(lh_model_create(&c, &ma), LH_ERR_OK);
  assert_int_equal(lh_model_create(&c, &mb), LH_ERR_OK);
  lh_model_init_random(ma, 1);
  memcpy(mb->params, ma->params, ma->n_params * sizeof(float));
  for (size_t i = 100; i < ma->n_params; i += 997) /* a sparse update, as an AdamW step is */
    mb->params[i] += 0.01f;
  lh_infer *p, *want;
  assert_int_equal(lh_infer_from_model(ma, &p), LH_ERR_OK);
  assert_int_equal(lh_infer_from_model(mb, &want), LH_ERR_OK);
  size_t n = 0, n2 = 0;
  const uint16_t *a = lh_infer_bf16(p, &n), *b = lh_infer_bf16(want, &n2);
  assert_int_equal(n, ma->n_params);
  assert_int_equal(n, n2);
  assert_int_equal(lh_infer_set_range(p, n - 2, b, 3), LH_ERR_INVAL);
  assert_int_equal(lh_infer_set_range(p, (size_t)-1, b, 2), LH_ERR_INVAL);
  size_t changed = 0;
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i]) {
      assert_int_equal(lh_infer_set_range(p, i, b + i, 1), LH_ERR_OK);
      changed++;
    }
  assert_true(changed > 100);
  assert_memory_equal(a, b, n * sizeof *a);
  /* 12 rows: several row tiles */
  enum { R = 12 };
  int V = c.vocab_size;
  float *x = malloc((size_t)R * V * sizeof(float)), *y = malloc((size_t)R * V * sizeof(float));
  lh_infer_row rows[R];
  for (int i = 0; i < R; i++)
    rows[i] = (lh_infer_row){0, i, (int32_t)(3 + 5 * i), true};
  lh_kv *k1, *k2;
  assert_int_equal(lh_kv_create(p, 1, R, R, &k1), LH_ERR_OK);
  assert_int_equal(lh_kv_create(want, 1, R, R, &k2), LH_ERR_OK);
  assert_int_equal(lh_infer_forward(p, k1, rows, R, x), LH_ERR_OK);
  assert_int_equal(lh_infer_forward(want, k2, rows, R, y), LH_ERR_OK);
  assert_memory_equal(x, y, (size_t)R * V * sizeof(float));
  lh_kv_free(k1);
  lh_kv_free(k2);
  free(x);
  free(y);
  lh_infer_free(p);
  lh_infer_free(want);
  lh_model_free(ma);
  lh_model_free(mb);
}

static void expect_nomem(lh_err got, const char *what) {
  assert_int_equal(got, LH_ERR_NOMEM);
  const char *msg = lh_last_error();
  if (!strstr(msg, what) || !strstr(msg, "cannot allocate"))
    fail_msg("message \"%s\" does not say that %s could not be allocated", msg, what);
}

/* Virtual memory the process holds now, in bytes. */
static size_t vm_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long pages = 0;
  assert_non_null(f);
  assert_int_equal(fscanf(f, "%lu", &pages), 1);
  fclose(f);
  return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

/* Sizes from a config or a caller that cannot be allocated are LH_ERR_NOMEM errors naming what
 * and how much, never an abort. The sizes asked for exceed any address space; without a
 * sanitizer the address space is also capped (RLIMIT_AS) so that no overcommit setting lets
 * them through, and the model slab and the bf16 policy are checked against that cap. */
static void test_allocation_failures(void **state) {
  lh_config c;
  assert_int_equal(lh_config_preset("small", LH_ARCH_QWEN2, &c), LH_ERR_OK);
  lh_model *m;
  assert_int_equal(lh_model_create(&c, &m), LH_ERR_OK); /* 28M parameters, 112 MB */
  lh_model_init_random(m, 1); /* starts the OpenMP threads before the cap */
  lh_infer *inf;
  assert_int_equal(lh_infer_from_model(m, &inf), LH_ERR_OK);
  struct rlimit old;
  assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
  if (!SANITIZED) {
    struct rlimit cap = old;
    cap.rlim_cur = (rlim_t)(vm_bytes() + (16u << 20));
    if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < cap.rlim_cur) cap.rlim_cur = old.rlim_cur;
    assert_int_equal(setrlimit(RLIMIT_AS, &cap), 0);
  }

  /* 8 layers x 2^30 slots x 2048 positions x 4*64 floats: 2^54 bytes of keys */
  lh_kv *kv = NULL;
  expect_nomem(lh_kv_create(inf, 1 << 30, 2048, 1, &kv),
               "kv cache: keys of 8 layers x 1073741824 slots x 2048 positions x 256 floats");
  assert_null(kv);
  lh_generator *g = NULL;
  expect_nomem(lh_generator_create(inf, 1 << 30, 2048, 0, &g), "kv cache: keys");
  assert_null(g);
  assert_int_equal(lh_generator_create(inf, INT_MAX, 2048, 0, &g), LH_ERR_LIMIT);
  /* 8 layers x 8 heads x 2^31 tokens x 2048 positions of softmax rows alone: 2^52 bytes */
  lh_train *t = NULL;
  expect_nomem(lh_train_create(m, INT_MAX, 2048, &t), "training state: activations");
  assert_null(t);
  if (!SANITIZED) {
    lh_model *m2 = NULL;
    expect_nomem(lh_model_create(&c, &m2), "model: parameter slab");
    assert_null(m2);
    lh_infer *inf2 = NULL;
    expect_nomem(lh_infer_from_model(m, &inf2), "infer: bf16 weights");
    assert_null(inf2);
    assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
  }
  /* what fits is still allocated */
  assert_int_equal(lh_kv_create(inf, 2, 64, 8, &kv), LH_ERR_OK);
  lh_kv_free(kv);
  lh_infer_free(inf);
  lh_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_qwen2_gqa_tied),
      cmocka_unit_test(test_llama_mha_untied),
      cmocka_unit_test(test_llama_mqa_tied),
      cmocka_unit_test(test_qwen3_qk_norm),
      cmocka_unit_test(test_llama_attention_bias),
      cmocka_unit_test(test_qwen3_attention_bias),
      cmocka_unit_test(test_load_bf16),
      cmocka_unit_test(test_allocation_failures),
      cmocka_unit_test(test_threads_raised_after_create),
      cmocka_unit_test(test_update_checks_config),
      cmocka_unit_test(test_set_range),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
