/* Core behaviour that needs no reference fixture: bf16 rounding, lh_expf against libm, the
 * Philox known-answer vectors, RoPE inversion, the AdamW schedule and clipping computed by hand,
 * batch validation, gradient accumulation, and that longhaul's own reductions do not depend on
 * the thread count (on a batch small enough that OpenBLAS runs its products on one thread). */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "longhaul/model.h"
#include "longhaul/rl.h"
#include "longhaul/tensor.h"
#include "near.h"

static void test_bf16_rounding(void **state) {
  assert_int_equal(lh_bf16_from_f32(1.0f), 0x3f80);
  /* 1 + 2^-8 is exactly half way between bf16 1.0 and 1.0078125: ties to even (1.0) */
  assert_int_equal(lh_bf16_from_f32(1.00390625f), 0x3f80);
  /* 1 + 3*2^-8 is half way between 1.0078125 (odd) and 1.015625 (even): rounds up */
  assert_int_equal(lh_bf16_from_f32(1.01171875f), 0x3f82);
  assert_int_equal(lh_bf16_from_f32(-2.0f), 0xc000);
  assert_int_equal(lh_bf16_from_f32(INFINITY), 0x7f80);
  uint16_t nan = lh_bf16_from_f32(NAN);
  assert_true((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0);
  assert_true(lh_f32_from_bf16(0x3f82) == 1.015625f);
  /* the largest finite float rounds to infinity in bf16, as torch does */
  assert_int_equal(lh_bf16_from_f32(3.4028235e38f), 0x7f80);
}

/* lh_expf against libm's expf across the clamped range; NaN passes through (the float-to-int
 * cast must stay defined: make asan checks float-cast-overflow); the clamp ends behave as
 * tensor.h says. */
static void test_expf(void **state) {
  (void)state;
  float worst = 0.0f;
  for (float x = -87.0f; x <= 88.0f; x += 0.01171875f) {
    float want = expf(x), got = lh_expf(x);
    float rel = fabsf(got - want) / want;
    if (rel > worst) worst = rel;
  }
  printf("lh_expf: worst relative error %.3g\n", (double)worst);
  assert_true(worst < 5e-7f);
  assert_true(isnan(lh_expf(NAN)));
  assert_true(isnan(lh_expf(-NAN)));
  assert_true(lh_expf(-INFINITY) > 0.0f && lh_expf(-INFINITY) < 1e-37f);
  assert_true(lh_expf(INFINITY) == lh_expf(88.0f));
}

static void test_philox_known_answers(void **state) {
  /* Random123 known-answer vectors for philox4x32-10 */
  uint32_t r[4];
  lh_philox(0, 0, 0, r);
  assert_int_equal(r[0], 0x6627e8d5u);
  assert_int_equal(r[1], 0xe169c58du);
  assert_int_equal(r[2], 0xbc57ac4cu);
  assert_int_equal(r[3], 0x9b00dbd8u);
  lh_philox(UINT64_MAX, UINT64_MAX, UINT64_MAX, r);
  assert_int_equal(r[0], 0x408f276du);
  assert_int_equal(r[1], 0x41c83b0eu);
  assert_int_equal(r[2], 0xa20bc7c6u);
  assert_int_equal(r[3], 0x6d5451fdu);
  /* key (a4093822, 299f31d0), counter (243f6a88, 85a308d3, 13198a2e, 03707344) */
  lh_philox(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull, r);
  assert_int_equal(r[0], 0xd16cfe09u);
  assert_int_equal(r[1], 0x94fdccebu);
  assert_int_equal(r[2], 0x5001e420u);
  assert_int_equal(r[3], 0x24126ea1u);
  assert_true(lh_uniform_from_u32(0xffffffffu) < 1.0f);
  assert_true(lh_uniform_from_u32(0) == 0.0f);
}

static void test_rope_inverse(void **state) {
  float cs[16 * 4], sn[16 * 4], x[2 * 8], y[2 * 8], inv_freq[4];
  for (int i = 0; i < 4; i++)
    inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / 8.0f);
  lh_rope_tables(cs, sn, 16, 8, inv_freq);
  for (int i = 0; i < 16; i++)
    x[i] = y[i] = (float)i - 7.5f;
  lh_rope_apply(y, 2, 8, cs, sn, 11, 0);
  /* a rotation keeps the norm of each pair (i, i+hd/2) and position 0 is the identity */
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 4; i++) {
      float a = x[h * 8 + i], b = x[h * 8 + i + 4], c = y[h * 8 + i], d = y[h * 8 + i + 4];
      assert_float_equal(a * a + b * b, c * c + d * d, 1e-3);
    }
  assert_true(fabsf(y[1] - x[1]) > 1e-3f);
  lh_rope_apply(y, 2, 8, cs, sn, 11, 1);
  for (int i = 0; i < 16; i++)
    assert_float_equal(x[i], y[i], 1e-5);
  /* HF rotate-half at position p, pair 0: (a cos - b sin, b cos + a sin) with angle p */
  float z[8] = {1, 0, 0, 0, 2, 0, 0, 0};
  lh_rope_apply(z, 1, 8, cs, sn, 3, 0);
  assert_float_equal(z[0], cosf(3) - 2 * sinf(3), 1e-5);
  assert_float_equal(z[4], 2 * cosf(3) + sinf(3), 1e-5);
}

static lh_config small_cfg(void) {
  lh_config c;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_QWEN2, &c), LH_ERR_OK);
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 48;
  c.max_positions = 64;
  return c;
}

static void test_adamw_by_hand(void **state) {
  lh_adamw_config ac = lh_adamw_defaults();
  ac.lr = 1.0f;
  ac.schedule = LH_SCHEDULE_COSINE;
  ac.warmup_steps = 4;
  ac.total_steps = 14;
  ac.min_lr_ratio = 0.1f;
  assert_float_equal(lh_adamw_lr(&ac, 0), 0.25f, 1e-7);
  assert_float_equal(lh_adamw_lr(&ac, 3), 1.0f, 1e-7);
  assert_float_equal(lh_adamw_lr(&ac, 4), 1.0f, 1e-7);
  assert_float_equal(lh_adamw_lr(&ac, 9), 0.1f + 0.9f * 0.5f, 1e-6); /* half way: cos = 0 */
  assert_float_equal(lh_adamw_lr(&ac, 14), 0.1f, 1e-7);
  assert_float_equal(lh_adamw_lr(&ac, 100), 0.1f, 1e-7);

  /* one step: grads all 3 with clip 1 => scaled to 3/(norm+1e-6); Adam's first step moves
   * every parameter by lr * sign(g) (up to eps), matrices also decay by lr*wd */
  lh_config c = small_cfg();
  lh_model *m;
  assert_int_equal(lh_model_create(&c, &m), LH_ERR_OK);
  for (size_t i = 0; i < m->n_params; i++)
    m->params[i] = 0.5f;
  float *g = malloc(m->n_params * sizeof(float));
  for (size_t i = 0; i < m->n_params; i++)
    g[i] = 3.0f;
  ac = lh_adamw_defaults();
  ac.lr = 0.01f;
  ac.weight_decay = 0.1f;
  ac.grad_clip = 1.0f;
  lh_adamw *opt;
  assert_int_equal(lh_adamw_create(&c, &ac, &opt), LH_ERR_OK);
  float norm = lh_adamw_step(opt, m->params, g);
  assert_float_equal(norm, 3.0f * sqrtf((float)m->n_params), 1e-2 * norm);
  assert_float_equal(g[0], 3.0f / (norm + 1e-6f), 1e-9);
  /* embed is 2-D (decays), ln1 is 1-D (does not) */
  assert_float_equal(m->w.embed[0], 0.5f * (1 - 0.01f * 0.1f) - 0.01f, 1e-5);
  assert_float_equal(m->w.ln1[0], 0.5f - 0.01f, 1e-5);

  /* weight decay uses the scheduled rate, as torch's decay by (1 - lr_t * wd) does: the first
   * of 4 warmup steps runs at lr/4 */
  ac.warmup_steps = 4;
  lh_adamw *warm;
  assert_int_equal(lh_adamw_create(&c, &ac, &warm), LH_ERR_OK);
  float *p2 = malloc(m->n_params * sizeof(float));
  for (size_t i = 0; i < m->n_params; i++)
    p2[i] = 0.5f, g[i] = 3.0f;
  lh_adamw_step(warm, p2, g);
  assert_float_equal(p2[0], 0.5f * (1 - 0.0025f * 0.1f) - 0.0025f, 1e-6);
  free(p2);
  lh_adamw_free(warm);

  /* an inf gradient (its norm is inf; clipping would make every gradient NaN) changes nothing */
  float *before = malloc(m->n_params * sizeof(float));
  memcpy(before, m->params, m->n_params * sizeof(float));
  float m0 = opt->m[0], v0 = opt->v[0];
  for (size_t i = 0; i < m->n_params; i++)
    g[i] = 1.0f;
  g[7] = INFINITY;
  assert_true(isinf(lh_adamw_step(opt, m->params, g)));
  g[7] = NAN;
  assert_true(isnan(lh_adamw_step(opt, m->params, g)));
  assert_memory_equal(m->params, before, m->n_params * sizeof(float));
  assert_int_equal(opt->step, 1);
  assert_true(opt->m[0] == m0 && opt->v[0] == v0);
  free(before);
  lh_adamw_free(opt);
  free(g);
  lh_model_free(m);
}

/* A random batch of three sequences with partial loss weights. */
typedef struct {
  int seq_start[4];
  int32_t tokens[40];
  float weight[40];
} batch3;

static void make_batch(batch3 *bb, int vocab, lh_batch *b) {
  int lens[3] = {17, 5, 12};
  bb->seq_start[0] = 0;
  for (int s = 0; s < 3; s++)
    bb->seq_start[s + 1] = bb->seq_start[s] + lens[s];
  for (int i = 0; i < bb->seq_start[3]; i++) {
    uint32_t r[4];
    lh_philox(7, 0, (uint64_t)i, r);
    bb->tokens[i] = (int32_t)(r[0] % (uint32_t)vocab);
    bb->weight[i] = (r[1] & 3) ? 1.0f : 0.0f;
  }
  for (int s = 0; s < 3; s++)
    bb->weight[bb->seq_start[s]] = 0.0f;
  *b = (lh_batch){3, bb->seq_start, bb->tokens, bb->weight};
}

static void test_batch_validation(void **state) {
  lh_config c = small_cfg();
  lh_model *m;
  assert_int_equal(lh_model_create(&c, &m), LH_ERR_OK);
  lh_train *t;
  assert_int_equal(lh_train_create(m, 40, 20, &t), LH_ERR_OK);
  batch3 bb;
  lh_batch b;
  make_batch(&bb, c.vocab_size, &b);
  assert_int_equal(lh_batch_validate(t, &b), LH_ERR_OK);
  bb.tokens[3] = 64;
  assert_int_equal(lh_batch_validate(t, &b), LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "vocabulary"));
  bb.tokens[3] = 1;
  bb.weight[17] = 1.0f; /* first token of the second sequence */
  assert_int_equal(lh_batch_validate(t, &b), LH_ERR_INVAL);
  bb.weight[17] = 0.0f;
  bb.seq_start[1] = 0; /* empty sequence */
  assert_int_equal(lh_batch_validate(t, &b), LH_ERR_LIMIT);
  bb.seq_start[1] = 17;
  lh_train *t2;
  assert_int_equal(lh_train_create(m, 200, 100, &t2), LH_ERR_LIMIT); /* max_positions 64 */
  lh_train_free(t);
  lh_model_free(m);
}

/* Runs forward + backward at a given thread count; returns loss, fills grads. */
static float run_step(lh_model *m, lh_batch *b, int threads, float *grads_out) {
  lh_set_threads(threads);
  lh_train *t;
  assert_int_equal(lh_train_create(m, 40, 20, &t), LH_ERR_OK);
  float lp[40];
  float loss = lh_train_ce_step(t, b, lp);
  memcpy(grads_out, lh_train_grads(t), m->n_params * sizeof(float));
  lh_train_free(t);
  return loss;
}

static void test_thread_count_independent(void **state) {
  lh_config c = small_cfg();
  lh_model *m;
  assert_int_equal(lh_model_create(&c, &m), LH_ERR_OK);
  lh_model_init_random(m, 3);
  batch3 bb;
  lh_batch b;
  make_batch(&bb, c.vocab_size, &b);
  float *g1 = malloc(m->n_params * sizeof(float)), *g2 = malloc(m->n_params * sizeof(float));
  float l1 = run_step(m, &b, 1, g1);
  float l2 = run_step(m, &b, 2, g2);
  lh_set_threads(2);
  assert_true(l1 == l2);
  assert_memory_equal(g1, g2, m->n_params * sizeof(float));
  free(g1);
  free(g2);
  lh_model_free(m);
}

/* Sizes that do not fit saturate, and an allocation that cannot be made is an error with the
 * size, not an abort. */
static void test_size_checked_allocation(void **state) {
  assert_true(lh_size_mul(3, 5) == 15);
  assert_true(lh_size_mul(SIZE_MAX / 2, 3) == SIZE_MAX);
  assert_true(lh_size_mul(lh_size_mul((size_t)1 << 40, (size_t)1 << 40), 1) == SIZE_MAX);
  assert_null(lh_try_malloc_aligned(SIZE_MAX, "a thing"));
  assert_non_null(strstr(lh_last_error(), "a thing: cannot allocate"));
  assert_null(lh_try_malloc_aligned(SIZE_MAX - 10, "another")); /* rounding up would wrap */
  assert_non_null(strstr(lh_last_error(), "another: cannot allocate"));
  float *p = lh_try_malloc_aligned(100, "small");
  assert_non_null(p);
  assert_true(((uintptr_t)p & 63) == 0);
  free(p);
}

/* lh_try_malloc_huge: 2 MiB aligned, usable to its last byte, the same message as
 * lh_try_malloc_aligned when it cannot be had. */
static void test_huge_allocation(void **state) {
  size_t n = ((size_t)5 << 20) + 3;
  unsigned char *p = lh_try_malloc_huge(n, "weights");
  assert_non_null(p);
  assert_true(((uintptr_t)p & (((uintptr_t)2 << 20) - 1)) == 0);
  memset(p, 7, n);
  assert_int_equal(p[n - 1], 7);
  free(p);
  assert_null(lh_try_malloc_huge(SIZE_MAX, "the slab"));
  assert_non_null(strstr(lh_last_error(), "the slab: cannot allocate"));
}

/* lh_barrier: BAR_THREADS threads, each writes its slot with the round, waits, checks every
 * slot, waits again (so no slot moves on while another thread reads it); in some rounds one
 * thread arrives late, 2 ms after the others, so they spin out and sleep. A barrier that let a
 * thread through early would show an old round in some slot. */
enum { BAR_THREADS = 3, BAR_ROUNDS = 3000 };
typedef struct {
  lh_barrier bar;
  _Atomic int slot[BAR_THREADS];
  _Atomic int wrong;
} bar_test;
typedef struct {
  bar_test *b;
  int id;
} bar_arg;

static void *bar_thread(void *arg) {
  bar_arg *a = arg;
  bar_test *b = a->b;
  for (int r = 1; r <= BAR_ROUNDS; r++) {
    if (r % 500 == a->id) usleep(2000);
    atomic_store_explicit(&b->slot[a->id], r, memory_order_relaxed);
    lh_barrier_wait(&b->bar, BAR_THREADS);
    for (int i = 0; i < BAR_THREADS; i++)
      if (atomic_load_explicit(&b->slot[i], memory_order_relaxed) != r)
        atomic_fetch_add(&b->wrong, 1);
    lh_barrier_wait(&b->bar, BAR_THREADS);
  }
  return NULL;
}

static void test_barrier(void **state) {
  bar_test b = {0};
  bar_arg args[BAR_THREADS];
  pthread_t th[BAR_THREADS];
  for (int i = 0; i < BAR_THREADS; i++) {
    args[i] = (bar_arg){&b, i};
    assert_int_equal(pthread_create(&th[i], NULL, bar_thread, &args[i]), 0);
  }
  for (int i = 0; i < BAR_THREADS; i++)
    pthread_join(th[i], NULL);
  assert_int_equal(atomic_load(&b.wrong), 0);
  for (int i = 0; i < BAR_THREADS; i++)
    assert_int_equal(atomic_load(&b.slot[i]), BAR_ROUNDS);
  lh_barrier_wait(&b.bar, 1); /* a team of one never waits */
}

typedef struct {
  const char *path, *data;
  int fails;
} racer;

static void *write_many(void *arg) {
  racer *r = arg;
  for (int i = 0; i < 200; i++)
    r->fails += lh_file_write_atomic(r->path, r->data, 1 << 16) != LH_ERR_OK;
  return NULL;
}

/* lh_file_write_atomic: two processes writing one path at once both succeed (they once shared
 * PATH.tmp, and one's rename found it gone), the file is one of their contents whole, and a
 * failed commit (the path is a directory) leaves no temporary file. */
static void test_atomic_write(void **state) {
  (void)state;
  char dir[] = "/tmp/longhaul-test-atomic-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof path, "%s/f", dir);
  static char a[1 << 16], b[1 << 16];
  memset(a, 'a', sizeof a);
  memset(b, 'b', sizeof b);
  pid_t child = fork();
  assert_true(child >= 0);
  int fails = 0;
  for (int i = 0; i < 200; i++)
    fails += lh_file_write_atomic(path, child ? a : b, sizeof a) != LH_ERR_OK;
  if (child == 0) _exit(fails > 0);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_int_equal(fails, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char *got = NULL;
  size_t len = 0;
  assert_int_equal(lh_file_read(path, 1 << 20, &got, &len), LH_ERR_OK);
  assert_int_equal(len, sizeof a);
  assert_true(memcmp(got, a, len) == 0 || memcmp(got, b, len) == 0);
  free(got);
  assert_int_equal(unlink(path), 0);

  /* two threads of one process, while a third reads: every write succeeds (they once shared
   * PATH.tmp.PID and truncated each other's file) and every read sees one whole content */
  racer r[2] = {{path, a, 0}, {path, b, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, write_many, &r[i]), 0);
  int torn = 0;
  for (int i = 0; i < 300; i++) {
    if (lh_file_read(path, 1 << 20, &got, &len) != LH_ERR_OK) continue; /* between renames */
    torn += len != sizeof a || (memcmp(got, a, len) != 0 && memcmp(got, b, len) != 0);
    free(got);
  }
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_join(th[i], NULL), 0);
  assert_int_equal(r[0].fails + r[1].fails, 0);
  assert_int_equal(torn, 0);
  assert_int_equal(unlink(path), 0);

  assert_int_equal(mkdir(path, 0755), 0); /* a directory where the file should go */
  assert_int_equal(lh_file_write_atomic(path, "x", 1), LH_ERR_IO);
  assert_int_equal(rmdir(path), 0);
  DIR *d = opendir(dir); /* no temporary file left, whatever its name */
  assert_non_null(d);
  for (struct dirent *ent; (ent = readdir(d));)
    if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, ".."))
      fail_msg("left behind: %s", ent->d_name);
  closedir(d);
  assert_int_equal(rmdir(dir), 0);
}

static void put_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_true(fputs(text, f) >= 0);
  assert_int_equal(fclose(f), 0);
}

static int holds_text(const char *path, const char *text) {
  char *got = NULL;
  size_t len = 0;
  if (lh_file_read(path, 1 << 20, &got, &len) != LH_ERR_OK) return 0;
  int same = len == strlen(text) && memcmp(got, text, len) == 0;
  free(got);
  return same;
}

/* Writes "leftover" to PATH.tmp.PID.N for N in [from, from + count), as a killed writer that
 * had this PID would have left them, or checks (check != 0) they all still hold it. */
static void leftovers(const char *path, unsigned long from, int count, int check) {
  char name[256];
  for (int k = 0; k < count; k++) {
    snprintf(name, sizeof name, "%s.tmp.%ld.%lu", path, (long)getpid(), from + (unsigned long)k);
    if (!check)
      put_text(name, "leftover");
    else if (!holds_text(name, "leftover"))
      fail_msg("%s: changed or removed", name);
  }
}

/* Atomic writes skip temporary names that exist already (left by a killed writer with this
 * PID, as containers repeat PIDs) instead of failing with "cannot create: File exists", and
 * never touch those files, not even when every name they may try exists. */
static void test_atomic_write_leftovers(void **state) {
  (void)state;
  char dir[] = "/tmp/longhaul-test-leftover-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[128], st[128], prefix[192];
  snprintf(path, sizeof path, "%s/f", dir);
  snprintf(st, sizeof st, "%s/m.safetensors", dir);
  /* learn the counter: the name this call gets is N, so the next write tries N + 1 first */
  char *tmp = NULL;
  int fd = -1;
  assert_int_equal(lh_file_tmp_create(path, &tmp, &fd), LH_ERR_OK);
  assert_true(fd >= 0);
  assert_int_equal(close(fd), 0);
  snprintf(prefix, sizeof prefix, "%s.tmp.%ld.", path, (long)getpid());
  assert_int_equal(strncmp(tmp, prefix, strlen(prefix)), 0);
  unsigned long n = strtoul(tmp + strlen(prefix), NULL, 10);
  free(tmp);
  leftovers(path, n, 65, 0); /* N (the file just created) and the 64 names after it */
  assert_int_equal(lh_file_write_atomic(path, "new", 3), LH_ERR_OK);
  assert_true(holds_text(path, "new"));
  leftovers(path, n, 65, 1);
  /* the safetensors writer takes its names the same way: N + 66 .. N + 69 exist, N + 70 is its */
  leftovers(st, n + 66, 4, 0);
  assert_int_equal(lh_safetensors_write(st, NULL, 0), LH_ERR_OK);
  struct stat sb;
  assert_int_equal(stat(st, &sb), 0);
  assert_true(sb.st_size > 8);
  leftovers(st, n + 66, 4, 1);
  /* every one of the 1024 names the next write may try exists: it fails and removes none */
  leftovers(path, n + 71, 1024, 0);
  assert_int_equal(lh_file_write_atomic(path, "newer", 5), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "all exist"));
  leftovers(path, n + 71, 1024, 1);
  assert_true(holds_text(path, "new"));
  /* nothing else was created: the two files and the 65 + 4 + 1024 leftovers */
  DIR *d = opendir(dir);
  assert_non_null(d);
  int files = 0;
  char name[512];
  for (struct dirent *ent; (ent = readdir(d));) {
    if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
    snprintf(name, sizeof name, "%s/%s", dir, ent->d_name);
    assert_int_equal(unlink(name), 0);
    files++;
  }
  closedir(d);
  assert_int_equal(files, 2 + 65 + 4 + 1024);
  assert_int_equal(rmdir(dir), 0);
}

/* lh_json_check_cost(text, len) on an exact-size heap copy, so ASan sees a read past len. */
static lh_err json_cost(const char *text, size_t len, size_t max_open, size_t max_tokens) {
  char *copy = malloc(len ? len : 1);
  assert_non_null(copy);
  memcpy(copy, text, len);
  lh_err e = lh_json_check_cost(copy, len, max_open, max_tokens, "t.json");
  free(copy);
  return e;
}

/* lh_json_check_cost counts, outside strings, '{' and '[' (max_open) and those with ',' and ':'
 * (max_tokens): an escaped quote does not end a string, the limits are inclusive, and nothing
 * at or past len is read (a string cut by the end, a backslash as the last byte). */
static void test_json_check_cost(void **state) {
  (void)state;
  /* a string starting with an escaped quote, then 20 "{}" and a ',' and ':' inside it: only the
   * outer '[' counts (were the quote taken as the string's end, 20 more openings would) */
  char text[128];
  strcpy(text, "[\"\\\"");
  for (int i = 0; i < 20; i++)
    strcat(text, "{}");
  strcat(text, ",:\"]");
  assert_int_equal(json_cost(text, strlen(text), 1, 1), LH_ERR_OK);
  assert_int_equal(json_cost(text, strlen(text), 0, 1), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "t.json: 1 JSON brackets"));
  /* the end of the buffer inside a string, or right after a backslash: the bytes after len
   * ("[[[" and ",,") are not counted */
  assert_int_equal(lh_json_check_cost("[\"ab\\\"[[[", 5, 1, 1, "t.json"), LH_ERR_OK);
  assert_int_equal(json_cost("[\"ab\\", 5, 1, 1), LH_ERR_OK);
  assert_int_equal(lh_json_check_cost("[\"ab,,", 4, 1, 1, "t.json"), LH_ERR_OK);
  assert_int_equal(json_cost("[\"ab", 4, 1, 1), LH_ERR_OK);
  assert_int_equal(json_cost("\\", 1, 0, 0), LH_ERR_OK);
  /* "[0,0,...,0]" with 50 zeros: 1 opening and 49 commas, 50 tokens */
  strcpy(text, "[0");
  for (int i = 1; i < 50; i++)
    strcat(text, ",0");
  strcat(text, "]");
  assert_int_equal(json_cost(text, strlen(text), 1, 50), LH_ERR_OK);
  assert_int_equal(json_cost(text, strlen(text), 1, 49), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "50 JSON brackets and separators, 1 of them"));
  /* ':' counts too: '{' and '[', two ':' and a ',' */
  const char *obj = "{\"a\":0,\"b\":[]}";
  assert_int_equal(json_cost(obj, strlen(obj), 2, 5), LH_ERR_OK);
  assert_int_equal(json_cost(obj, strlen(obj), 2, 4), LH_ERR_LIMIT);
  assert_int_equal(json_cost(obj, strlen(obj), 1, 5), LH_ERR_LIMIT);
}

/* lh_file_read reads to the end, not to the size stat reports: /proc files say 0 bytes. A
 * directory and a file over the limit are errors. */
static void test_file_read(void **state) {
  (void)state;
  char *text = NULL;
  size_t len = 0;
  assert_int_equal(lh_file_read("/proc/self/status", 1 << 20, &text, &len), LH_ERR_OK);
  assert_true(len > 10 && strncmp(text, "Name:", 5) == 0 && text[len] == '\0');
  free(text);
  assert_int_equal(lh_file_read("/proc/self/status", 8, &text, &len), LH_ERR_LIMIT);
  assert_null(text);
  assert_int_equal(lh_file_read("/tmp", 1 << 20, &text, &len), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "directory"));
  char path[] = "/tmp/longhaul-test-read-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "0123456789", 10), 10);
  close(fd);
  assert_int_equal(lh_file_read(path, 10, &text, &len), LH_ERR_OK);
  assert_int_equal(len, 10);
  assert_string_equal(text, "0123456789");
  free(text);
  assert_int_equal(lh_file_read(path, 9, &text, &len), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "10 bytes, more than the limit of 9"));
  unlink(path);
}

/* lh_file_read refuses what is not a regular file, at once: a FIFO with no writer (it hung in
 * open), a character device (it read /dev/zero up to the limit); lh_file_open_read likewise. */
static void test_file_read_special(void **state) {
  (void)state;
  char dir[] = "/tmp/longhaul-test-special-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char fifo[128];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  assert_int_equal(mkfifo(fifo, 0644), 0);
  char *text = NULL;
  size_t len = 0;
  alarm(20); /* a hang fails the test instead of stalling the suite */
  assert_int_equal(lh_file_read(fifo, 1 << 20, &text, &len), LH_ERR_IO);
  alarm(0);
  assert_null(text);
  assert_non_null(strstr(lh_last_error(), "fifo: not a regular file (a FIFO)"));
  int fd = 7;
  assert_int_equal(lh_file_open_read(fifo, &fd), LH_ERR_IO);
  assert_int_equal(fd, -1);
  assert_int_equal(lh_file_read("/dev/zero", 1 << 20, &text, &len), LH_ERR_IO);
  assert_string_equal(lh_last_error(), "/dev/zero: not a regular file (a character device)");
  assert_int_equal(lh_file_read(dir, 1 << 20, &text, &len), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "not a regular file (a directory)"));
  /* a symbolic link to a regular file is read */
  char file[128], link[128];
  snprintf(file, sizeof file, "%s/file", dir);
  snprintf(link, sizeof link, "%s/link", dir);
  assert_int_equal(lh_file_write_atomic(file, "abc", 3), LH_ERR_OK);
  assert_int_equal(symlink("file", link), 0);
  assert_int_equal(lh_file_read(link, 16, &text, &len), LH_ERR_OK);
  assert_string_equal(text, "abc");
  free(text);
  assert_int_equal(lh_file_open_read(link, &fd), LH_ERR_OK);
  assert_true(fd >= 0);
  char c;
  assert_int_equal(read(fd, &c, 1), 1); /* blocking mode again */
  close(fd);
  unlink(link);
  unlink(file);
  unlink(fifo);
  assert_int_equal(rmdir(dir), 0);
}

/* The inode number of path (following links), or 0. */
static ino_t inode_of(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? sb.st_ino : 0;
}

/* lh_file_write_atomic by what the path names. A symbolic link is followed and its target
 * replaced (the link itself was replaced by a regular file); a dangling link creates its
 * target; a FIFO and character devices are written in place (they were replaced by regular
 * files: as root, /dev/full); /dev/fd/N writes to descriptor N; a directory is refused. Devices
 * are made in the test's directory (as root), never the real /dev ones. */
static void test_atomic_write_targets(void **state) {
  (void)state;
  char dir[] = "/tmp/longhaul-test-targets-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char p[6][192];
  struct stat sb;
#define P(i, name) snprintf(p[i], sizeof p[i], "%s/%s", dir, name)
  /* a link to a regular file: the target gets the content, the link stays a link */
  P(0, "target");
  P(1, "link");
  P(2, "sub");
  assert_int_equal(lh_file_write_atomic(p[0], "old", 3), LH_ERR_OK);
  assert_int_equal(symlink("target", p[1]), 0);
  assert_int_equal(lh_file_write_atomic(p[1], "new", 3), LH_ERR_OK);
  assert_int_equal(lstat(p[1], &sb), 0);
  assert_true(S_ISLNK(sb.st_mode));
  assert_true(holds_text(p[0], "new"));
  /* a chain of two links, the last dangling, into another directory: the name is created */
  assert_int_equal(mkdir(p[2], 0755), 0);
  P(3, "link2");
  assert_int_equal(symlink("sub/link3", p[3]), 0);
  P(4, "sub/link3");
  assert_int_equal(symlink("fresh", p[4]), 0); /* relative to sub/ */
  assert_int_equal(lh_file_write_atomic(p[3], "made", 4), LH_ERR_OK);
  assert_int_equal(lstat(p[3], &sb), 0);
  assert_true(S_ISLNK(sb.st_mode));
  assert_int_equal(lstat(p[4], &sb), 0);
  assert_true(S_ISLNK(sb.st_mode));
  P(5, "sub/fresh");
  assert_true(holds_text(p[5], "made"));
  unlink(p[5]);
  unlink(p[4]);
  unlink(p[3]);
  /* a loop of links is an error, not a hang */
  P(3, "loop");
  assert_int_equal(symlink("loop", p[3]), 0);
  assert_int_equal(lh_file_write_atomic(p[3], "x", 1), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "symbolic links"));
  unlink(p[3]);
  /* a FIFO: written in place (a reader is open), and still a FIFO */
  P(3, "fifo");
  assert_int_equal(mkfifo(p[3], 0644), 0);
  int rd = open(p[3], O_RDONLY | O_NONBLOCK);
  assert_true(rd >= 0);
  assert_int_equal(lh_file_write_atomic(p[3], "through", 7), LH_ERR_OK);
  char got[16] = {0};
  assert_int_equal(read(rd, got, sizeof got), 7);
  assert_string_equal(got, "through");
  close(rd);
  assert_int_equal(lstat(p[3], &sb), 0);
  assert_true(S_ISFIFO(sb.st_mode));
  unlink(p[3]);
  /* descriptors by name: written at the descriptor's offset, the file not replaced */
  P(3, "viafd");
  int fd = open(p[3], O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "head", 4), 4);
  ino_t ino = inode_of(p[3]);
  char name[64];
  snprintf(name, sizeof name, "/dev/fd/%d", fd);
  assert_int_equal(lh_file_write_atomic(name, "+tail", 5), LH_ERR_OK);
  snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
  assert_int_equal(lh_file_write_atomic(name, "+more", 5), LH_ERR_OK);
  close(fd);
  assert_true(holds_text(p[3], "head+tail+more"));
  assert_true(inode_of(p[3]) == ino);
  unlink(p[3]);
  /* character devices (null and full) made here: written in place; ENOSPC is reported */
  P(3, "null");
  P(4, "full");
  if (mknod(p[3], S_IFCHR | 0666, makedev(1, 3)) == 0 &&
      mknod(p[4], S_IFCHR | 0666, makedev(1, 7)) == 0) {
    assert_int_equal(lh_file_write_atomic(p[3], "gone", 4), LH_ERR_OK);
    assert_int_equal(lstat(p[3], &sb), 0);
    assert_true(S_ISCHR(sb.st_mode));
    assert_int_equal(lh_file_write_atomic(p[4], "nospace", 7), LH_ERR_IO);
    assert_non_null(strstr(lh_last_error(), "full: write failed: No space left on device"));
    assert_int_equal(lstat(p[4], &sb), 0);
    assert_true(S_ISCHR(sb.st_mode));
  } else if (geteuid() != 0) { /* not root: the real ones cannot be replaced, so use them */
    assert_int_equal(lh_file_write_atomic("/dev/null", "gone", 4), LH_ERR_OK);
    assert_int_equal(lh_file_write_atomic("/dev/full", "nospace", 7), LH_ERR_IO);
    assert_non_null(strstr(lh_last_error(), "/dev/full: write failed: No space left on device"));
  }
  unlink(p[3]);
  unlink(p[4]);
  /* a directory is refused, and so is a link to one */
  assert_int_equal(lh_file_write_atomic(p[2], "x", 1), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "sub: is a directory, expected a file"));
  P(3, "dirlink");
  assert_int_equal(symlink("sub", p[3]), 0);
  assert_int_equal(lh_file_write_atomic(p[3], "x", 1), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "is a directory"));
  unlink(p[3]);
  assert_int_equal(lh_file_out_check(p[2]), LH_ERR_IO);
  assert_int_equal(lh_file_out_check(p[1]), LH_ERR_OK);
  /* the streaming writer: many small writes and one large one make one file */
  lh_file_out *o = NULL;
  static char big[200000];
  memset(big, 'z', sizeof big);
  assert_int_equal(lh_file_out_open(p[1], &o), LH_ERR_OK);
  for (int i = 0; i < 1000; i++)
    assert_int_equal(lh_file_out_write(o, "0123456789", 10), LH_ERR_OK);
  assert_int_equal(lh_file_out_write(o, big, sizeof big), LH_ERR_OK);
  assert_true(holds_text(p[0], "new")); /* nothing replaced before the commit */
  assert_int_equal(lh_file_out_commit(o), LH_ERR_OK);
  lh_file_out_free(o);
  lh_file_out_free(NULL);
  assert_int_equal(stat(p[0], &sb), 0);
  assert_int_equal(sb.st_size, 10000 + sizeof big);
  /* abandoned: the file is unchanged and no temporary file is left */
  assert_int_equal(lh_file_out_open(p[1], &o), LH_ERR_OK);
  assert_int_equal(lh_file_out_write(o, "partial", 7), LH_ERR_OK);
  lh_file_out_free(o);
  assert_int_equal(stat(p[0], &sb), 0);
  assert_int_equal(sb.st_size, 10000 + sizeof big);
  unlink(p[1]);
  unlink(p[0]);
  assert_int_equal(rmdir(p[2]), 0);
  assert_int_equal(rmdir(dir), 0); /* nothing else left */
#undef P
}

/* A PID that is not running: a child that has exited and been reaped. */
static pid_t dead_pid(void) {
  pid_t c = fork();
  assert_true(c >= 0);
  if (c == 0) _exit(0);
  assert_int_equal(waitpid(c, NULL, 0), c);
  return c;
}

/* lh_file_clean_stale_tmp removes NAME.tmp.PID.N of dead PIDs and nothing else: not a live
 * process's file, not a near miss of the pattern, not a directory; and lh_file_write_atomic
 * removes its own target's stale files (and only those) before writing. */
static void test_clean_stale_tmp(void **state) {
  (void)state;
  char dir[] = "/tmp/longhaul-test-stale-XXXXXX";
  assert_non_null(mkdtemp(dir));
  long dead = (long)dead_pid(), me = (long)getpid();
  char name[64][96], path[6400];
  int n = 0;
  /* removed */
  snprintf(name[n++], 96, "a.tmp.%ld.0", dead);
  snprintf(name[n++], 96, "a.tmp.%ld.12", dead);
  snprintf(name[n++], 96, "b.c.tmp.%ld.7", dead);
  snprintf(name[n++], 96, "x.tmp.1.tmp.%ld.3", dead);
  int n_removed = n;
  /* kept: live processes (this one, init) */
  snprintf(name[n++], 96, "a.tmp.%ld.0", me);
  snprintf(name[n++], 96, "a.tmp.1.0");
  /* kept: not the pattern exactly */
  snprintf(name[n++], 96, ".tmp.%ld.0", dead);
  snprintf(name[n++], 96, "a.tmp.%ld.", dead);
  snprintf(name[n++], 96, "a.tmp.%ld", dead);
  snprintf(name[n++], 96, "a.tmp.%ld.0x", dead);
  snprintf(name[n++], 96, "a.tmp.0%ld.1", dead);
  snprintf(name[n++], 96, "a.tmp.%ld.01", dead);
  snprintf(name[n++], 96, "a.tmp.-%ld.0", dead);
  snprintf(name[n++], 96, "a.TMP.%ld.0", dead);
  snprintf(name[n++], 96, "a.tmp.%ld.0.bak", dead);
  snprintf(name[n++], 96, "a.tmp%ld.0", dead);
  snprintf(name[n++], 96, "a.tmp..0");
  snprintf(name[n++], 96, "a.tmp.0.0");
  for (int i = 0; i < n; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, name[i]);
    put_text(path, "leftover");
  }
  char sub[256], lnk[256];
  snprintf(sub, sizeof sub, "%s/d.tmp.%ld.0", dir, dead);
  assert_int_equal(mkdir(sub, 0755), 0);
  snprintf(lnk, sizeof lnk, "%s/l.tmp.%ld.0", dir, dead);
  assert_int_equal(symlink("a.tmp.1.0", lnk), 0);
  assert_int_equal(lh_file_clean_stale_tmp(dir), LH_ERR_OK);
  for (int i = 0; i < n; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, name[i]);
    if (i < n_removed && access(path, F_OK) == 0) fail_msg("%s: kept, expected removed", name[i]);
    if (i >= n_removed && !holds_text(path, "leftover")) fail_msg("%s: removed", name[i]);
  }
  struct stat sb;
  assert_int_equal(lstat(sub, &sb), 0);
  assert_int_equal(lstat(lnk, &sb), 0);
  /* the atomic writer of a/f removes f's stale files, not another name's */
  char f[256], g[256], fs[256], gs[256], fl[256];
  snprintf(f, sizeof f, "%s/f", dir);
  snprintf(g, sizeof g, "%s/g", dir);
  snprintf(fs, sizeof fs, "%s/f.tmp.%ld.5", dir, dead);
  snprintf(gs, sizeof gs, "%s/g.tmp.%ld.5", dir, dead);
  snprintf(fl, sizeof fl, "%s/f.tmp.%ld.5", dir, me);
  put_text(fs, "leftover");
  put_text(gs, "leftover");
  put_text(fl, "leftover");
  assert_int_equal(lh_file_write_atomic(f, "x", 1), LH_ERR_OK);
  assert_int_equal(access(fs, F_OK), -1);
  assert_true(holds_text(gs, "leftover"));
  assert_true(holds_text(fl, "leftover"));
  /* a directory that cannot be listed is an error naming it */
  char missing[256];
  snprintf(missing, sizeof missing, "%s/missing", dir);
  assert_int_equal(lh_file_clean_stale_tmp(missing), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "missing"));
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* lh_file_getline: lines with their newline, the last one without, NUL bytes kept, the end as
 * length 0; a line one byte over the limit (newline counted) is LH_ERR_LIMIT after reading at
 * most limit + 1 bytes. */
static void test_getline_limit(void **state) {
  (void)state;
  static const char text[] = "ab\nc\0d\n\n0123456789\n012345678\nlast";
  FILE *f = fmemopen((void *)text, sizeof text - 1, "r");
  assert_non_null(f);
  char *buf = NULL;
  size_t cap = 0, len = 99;
  assert_int_equal(lh_file_getline(f, 10, &buf, &cap, &len), LH_ERR_OK);
  assert_int_equal(len, 3);
  assert_memory_equal(buf, "ab\n", 3);
  assert_int_equal(lh_file_getline(f, 10, &buf, &cap, &len), LH_ERR_OK);
  assert_int_equal(len, 4);
  assert_memory_equal(buf, "c\0d\n", 4);
  assert_int_equal(lh_file_getline(f, 10, &buf, &cap, &len), LH_ERR_OK);
  assert_int_equal(len, 1);
  assert_int_equal(lh_file_getline(f, 10, &buf, &cap, &len), LH_ERR_LIMIT);
  assert_string_equal(lh_last_error(), "line longer than 10 bytes");
  assert_int_equal(ftell(f), 8 + 11); /* 10 bytes kept, the 11th read and refused */
  fclose(f);
  f = fmemopen((void *)(text + 19), sizeof text - 1 - 19, "r");
  assert_non_null(f);
  assert_int_equal(lh_file_getline(f, 10, &buf, &cap, &len), LH_ERR_OK);
  assert_int_equal(len, 10); /* exactly the limit */
  assert_true(cap <= 11);
  assert_int_equal(lh_file_getline(f, 10, &buf, &cap, &len), LH_ERR_OK);
  assert_int_equal(len, 4);
  assert_string_equal(buf, "last");
  assert_int_equal(lh_file_getline(f, 10, &buf, &cap, &len), LH_ERR_OK);
  assert_int_equal(len, 0);
  fclose(f);
  free(buf);
  /* an endless line costs the limit, not the input */
  f = fopen("/dev/zero", "r");
  assert_non_null(f);
  buf = NULL;
  cap = 0;
  assert_int_equal(lh_file_getline(f, 1 << 20, &buf, &cap, &len), LH_ERR_LIMIT);
  assert_true(cap <= (1 << 20) + 1);
  fclose(f);
  free(buf);
}

static void test_grad_accumulates(void **state) {
  lh_config c = small_cfg();
  lh_model *m;
  assert_int_equal(lh_model_create(&c, &m), LH_ERR_OK);
  lh_model_init_random(m, 5);
  batch3 bb;
  lh_batch b;
  make_batch(&bb, c.vocab_size, &b);
  lh_train *t;
  assert_int_equal(lh_train_create(m, 40, 20, &t), LH_ERR_OK);
  float lp[40], dlp[40];
  lh_train_ce_step(t, &b, lp);
  float *once = malloc(m->n_params * sizeof(float));
  memcpy(once, lh_train_grads(t), m->n_params * sizeof(float));
  /* a second backward with the same dlogprob doubles every gradient */
  double wsum = 0;
  for (int i = 0; i < 34; i++)
    wsum += bb.weight[i];
  for (int i = 0; i < 34; i++)
    dlp[i] = (float)(-bb.weight[i] / wsum);
  lh_train_forward(t, &b, lp);
  lh_train_backward(t, &b, dlp);
  const float *twice = lh_train_grads(t);
  double nz = 0;
  for (size_t i = 0; i < m->n_params; i++) {
    assert_float_equal(twice[i], 2.0f * once[i], 1e-6f + 1e-5f * fabsf(once[i]));
    nz += once[i] != 0.0f;
  }
  assert_true(nz > 0.9 * m->n_params); /* every parameter receives gradient */
  free(once);
  lh_train_free(t);
  lh_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_rounding),
      cmocka_unit_test(test_expf),
      cmocka_unit_test(test_philox_known_answers),
      cmocka_unit_test(test_rope_inverse),
      cmocka_unit_test(test_adamw_by_hand),
      cmocka_unit_test(test_batch_validation),
      cmocka_unit_test(test_thread_count_independent),
      cmocka_unit_test(test_grad_accumulates),
      cmocka_unit_test(test_size_checked_allocation),
      cmocka_unit_test(test_atomic_write),
      cmocka_unit_test(test_file_read),
      cmocka_unit_test(test_atomic_write_leftovers),
      cmocka_unit_test(test_json_check_cost),
      cmocka_unit_test(test_file_read_special),
      cmocka_unit_test(test_atomic_write_targets),
      cmocka_unit_test(test_clean_stale_tmp),
      cmocka_unit_test(test_getline_limit),
      cmocka_unit_test(test_huge_allocation),
      cmocka_unit_test(test_barrier),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
