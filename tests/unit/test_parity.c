/* Parity of the training forward, backward and AdamW against the PyTorch reference.
 * Each fixture in tests/fixtures/<variant>/ holds a model directory and reference.safetensors
 * computed by tests/ref/make_fixture.py (float64 torch); every tensor is compared and the
 * worst absolute and relative errors are printed. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"
#include "longhaul/model.h"
#include "longhaul/rl.h"
#include "near.h"

typedef struct {
  lh_model *m;
  lh_safetensors *ref;
  int n_seqs, N;
  int *seq_start;
  int32_t *tokens;
  float *weight;
} fixture;

static float *ref_f32(const fixture *f, const char *name, size_t numel) {
  return fixture_tensor(f->ref, name, LH_DTYPE_F32, (long)numel, NULL);
}

static void load_fixture(fixture *f, const char *variant) {
  char dir[512], path[600];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", LH_SOURCE_DIR, variant);
  lh_err err = lh_model_load(dir, &f->m);
  if (err) fail_msg("%s: %s", dir, lh_last_error());
  snprintf(path, sizeof path, "%s/reference.safetensors", dir);
  err = lh_safetensors_open(path, &f->ref);
  if (err) fail_msg("%s", lh_last_error());
  long n_starts;
  f->seq_start = fixture_tensor(f->ref, "seq_start", LH_DTYPE_I32, -1, &n_starts);
  f->n_seqs = (int)n_starts - 1;
  f->N = f->seq_start[f->n_seqs];
  f->tokens = fixture_tensor(f->ref, "tokens", LH_DTYPE_I32, f->N, NULL);
  f->weight = ref_f32(f, "loss_weight", (size_t)f->N);
}

static void free_fixture(fixture *f) {
  lh_model_free(f->m);
  lh_safetensors_close(f->ref);
  free(f->seq_start);
  free(f->tokens);
  free(f->weight);
}

/* Passes when every |got - want| <= atol + rtol * max|want| over the tensor. */
static void compare(const char *variant, const char *what, const float *got, const float *want,
                    size_t n, double atol, double rtol) {
  double worst = 0.0, scale = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++)
    scale = fmax(scale, fabs(want[i]));
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= worst)) worst = e, at = i;
  }
  double rel = scale > 0 ? worst / scale : worst;
  printf("  %-16s %-48s worst abs %.3e  rel %.3e  (max|ref| %.3e)\n", variant, what, worst, rel,
         scale);
  if (!(worst <= atol + rtol * scale))
    fail_msg("%s: %s: element %zu: got %.9g, reference %.9g (abs error %.3e > %.3e)", variant, what,
             at, got[at], want[at], worst, atol + rtol * scale);
}

static int max_seq_len(const fixture *f) {
  int mx = 0;
  for (int s = 0; s < f->n_seqs; s++)
    if (f->seq_start[s + 1] - f->seq_start[s] > mx) mx = f->seq_start[s + 1] - f->seq_start[s];
  return mx;
}

static void check_variant(const char *variant) {
  fixture f;
  load_fixture(&f, variant);
  const lh_config *c = &f.m->cfg;
  lh_batch b = {f.n_seqs, f.seq_start, f.tokens, f.weight};
  lh_train *t;
  assert_int_equal(lh_train_create(f.m, f.N, max_seq_len(&f), &t), LH_ERR_OK);
  assert_int_equal(lh_batch_validate(t, &b), LH_ERR_OK);
  size_t NV = (size_t)f.N * c->vocab_size;

  /* forward */
  float *logprob = malloc(f.N * sizeof(float));
  float loss = lh_train_forward(t, &b, logprob);
  float *want = ref_f32(&f, "logits", NV);
  compare(variant, "logits", lh_train_logits(t), want, NV, 1e-6, 1e-5);
  free(want);
  want = ref_f32(&f, "logprob", (size_t)f.N);
  compare(variant, "logprob", logprob, want, (size_t)f.N, 1e-5, 2e-5);
  free(want);
  want = ref_f32(&f, "loss", 1);
  compare(variant, "loss", &loss, want, 1, 1e-6, 2e-6);
  free(want);

  /* backward: every parameter's gradient */
  float loss2 = lh_train_ce_step(t, &b, logprob);
  assert_float_equal(loss, loss2, 0.0f);
  int nt = lh_model_tensors(c, NULL, 0);
  lh_tensor_info *ti = malloc(nt * sizeof *ti);
  lh_model_tensors(c, ti, nt);
  const float *grads = lh_train_grads(t);
  for (int i = 0; i < nt; i++) {
    char name[128];
    snprintf(name, sizeof name, "grad.%s", ti[i].name);
    want = ref_f32(&f, name, ti[i].numel);
    compare(variant, name, grads + ti[i].offset, want, ti[i].numel, 1e-7, 2e-5);
    free(want);
  }

  /* five AdamW steps on the same batch, then the loss once more */
  float *hp = ref_f32(&f, "adam.hparams", 6);
  lh_adamw_config ac = lh_adamw_defaults();
  ac.lr = hp[0], ac.beta1 = hp[1], ac.beta2 = hp[2], ac.eps = hp[3], ac.weight_decay = hp[4];
  ac.grad_clip = hp[5];
  free(hp);
  lh_adamw *opt;
  assert_int_equal(lh_adamw_create(c, &ac, &opt), LH_ERR_OK);
  float losses[6];
  for (int s = 0; s < 5; s++) {
    losses[s] = lh_train_ce_step(t, &b, logprob);
    lh_adamw_step(opt, f.m->params, lh_train_grads(t));
  }
  losses[5] = lh_train_forward(t, &b, logprob);
  want = ref_f32(&f, "adam.losses", 6);
  compare(variant, "adam.losses", losses, want, 6, 1e-5, 1e-4);
  assert_true(losses[5] < losses[0]); /* the optimiser made progress */
  free(want);

  lh_adamw_free(opt);
  free(ti);
  free(logprob);
  lh_train_free(t);
  free_fixture(&f);
}

static void test_qwen2_tied_gqa(void **state) {
  check_variant("qwen2_tied_gqa");
}
static void test_qwen2_untied_mha(void **state) {
  check_variant("qwen2_untied_mha");
}
static void test_llama_untied_gqa(void **state) {
  check_variant("llama_untied_gqa");
}
static void test_llama_tied_mqa(void **state) {
  check_variant("llama_tied_mqa");
}
/* sequences of 150 and 70 tokens: attention crosses its 64-row query blocks */
static void test_qwen2_long(void **state) {
  check_variant("qwen2_long");
}
/* Qwen3: per-head q/k RMSNorm before RoPE, no biases, head_dim 24 != hidden / heads */
static void test_qwen3_qknorm(void **state) {
  check_variant("qwen3_qknorm");
}
/* Llama 3.1 rope_scaling (factor 8, original context 32) on 150- and 70-token sequences */
static void test_llama3_ropescale(void **state) {
  check_variant("llama3_ropescale");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_qwen2_tied_gqa),   cmocka_unit_test(test_qwen2_untied_mha),
      cmocka_unit_test(test_llama_untied_gqa), cmocka_unit_test(test_llama_tied_mqa),
      cmocka_unit_test(test_qwen2_long),       cmocka_unit_test(test_qwen3_qknorm),
      cmocka_unit_test(test_llama3_ropescale),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
