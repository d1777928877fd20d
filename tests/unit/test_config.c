/* Model configuration: presets and parameter counts, Hugging Face config.json as shipped with
 * Qwen2.5-0.5B, Qwen3-0.6B and Llama-3.2-1B (with its llama3 rope_scaling), eos lists and
 * generation_config.json, defaults, wrong types and unsupported features with messages naming
 * the field, and save -> load round trips. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "longhaul/model.h"
#include "near.h"

/* config.json of Qwen/Qwen2.5-0.5B (494,032,768 parameters). */
static const char *qwen25_05b = "{\n"
                                "  \"architectures\": [\n    \"Qwen2ForCausalLM\"\n  ],\n"
                                "  \"attention_dropout\": 0.0,\n"
                                "  \"bos_token_id\": 151643,\n"
                                "  \"eos_token_id\": 151643,\n"
                                "  \"hidden_act\": \"silu\",\n"
                                "  \"hidden_size\": 896,\n"
                                "  \"initializer_range\": 0.02,\n"
                                "  \"intermediate_size\": 4864,\n"
                                "  \"max_position_embeddings\": 32768,\n"
                                "  \"max_window_layers\": 24,\n"
                                "  \"model_type\": \"qwen2\",\n"
                                "  \"num_attention_heads\": 14,\n"
                                "  \"num_hidden_layers\": 24,\n"
                                "  \"num_key_value_heads\": 2,\n"
                                "  \"rms_norm_eps\": 1e-06,\n"
                                "  \"rope_theta\": 1000000.0,\n"
                                "  \"sliding_window\": 32768,\n"
                                "  \"tie_word_embeddings\": true,\n"
                                "  \"torch_dtype\": \"bfloat16\",\n"
                                "  \"transformers_version\": \"4.40.1\",\n"
                                "  \"use_cache\": true,\n"
                                "  \"use_sliding_window\": false,\n"
                                "  \"vocab_size\": 151936\n"
                                "}\n";

/* config.json of meta-llama/Llama-3.2-1B with %s in place of rope_scaling and eos_token_id
 * (1,235,814,400 parameters). */
static const char *llama32_1b_fmt = "{\n"
                                    "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                                    "  \"attention_bias\": false,\n"
                                    "  \"attention_dropout\": 0.0,\n"
                                    "  \"bos_token_id\": 128000,\n"
                                    "  \"eos_token_id\": %s,\n"
                                    "  \"head_dim\": 64,\n"
                                    "  \"hidden_act\": \"silu\",\n"
                                    "  \"hidden_size\": 2048,\n"
                                    "  \"initializer_range\": 0.02,\n"
                                    "  \"intermediate_size\": 8192,\n"
                                    "  \"max_position_embeddings\": 131072,\n"
                                    "  \"mlp_bias\": false,\n"
                                    "  \"model_type\": \"llama\",\n"
                                    "  \"num_attention_heads\": 32,\n"
                                    "  \"num_hidden_layers\": 16,\n"
                                    "  \"num_key_value_heads\": 8,\n"
                                    "  \"pretraining_tp\": 1,\n"
                                    "  \"rms_norm_eps\": 1e-05,\n"
                                    "  \"rope_scaling\": %s,\n"
                                    "  \"rope_theta\": 500000.0,\n"
                                    "  \"tie_word_embeddings\": true,\n"
                                    "  \"torch_dtype\": \"bfloat16\",\n"
                                    "  \"transformers_version\": \"4.45.0.dev0\",\n"
                                    "  \"use_cache\": true,\n"
                                    "  \"vocab_size\": 128256\n"
                                    "}\n";

/* config.json of Qwen/Qwen3-0.6B (596,049,920 parameters, the tied embedding counted once). */
static const char *qwen3_06b = "{\n"
                               "  \"architectures\": [\n    \"Qwen3ForCausalLM\"\n  ],\n"
                               "  \"attention_bias\": false,\n"
                               "  \"attention_dropout\": 0.0,\n"
                               "  \"bos_token_id\": 151643,\n"
                               "  \"eos_token_id\": 151645,\n"
                               "  \"head_dim\": 128,\n"
                               "  \"hidden_act\": \"silu\",\n"
                               "  \"hidden_size\": 1024,\n"
                               "  \"initializer_range\": 0.02,\n"
                               "  \"intermediate_size\": 3072,\n"
                               "  \"max_position_embeddings\": 40960,\n"
                               "  \"max_window_layers\": 28,\n"
                               "  \"model_type\": \"qwen3\",\n"
                               "  \"num_attention_heads\": 16,\n"
                               "  \"num_hidden_layers\": 28,\n"
                               "  \"num_key_value_heads\": 8,\n"
                               "  \"rms_norm_eps\": 1e-06,\n"
                               "  \"rope_scaling\": null,\n"
                               "  \"rope_theta\": 1000000,\n"
                               "  \"sliding_window\": null,\n"
                               "  \"tie_word_embeddings\": true,\n"
                               "  \"torch_dtype\": \"bfloat16\",\n"
                               "  \"transformers_version\": \"4.51.0\",\n"
                               "  \"use_cache\": true,\n"
                               "  \"use_sliding_window\": false,\n"
                               "  \"vocab_size\": 151936\n"
                               "}\n";

/* rope_scaling of meta-llama/Llama-3.2-1B */
static const char *llama32_scaling = "{\"factor\": 32.0, \"high_freq_factor\": 4.0, "
                                     "\"low_freq_factor\": 1.0, "
                                     "\"original_max_position_embeddings\": 8192, "
                                     "\"rope_type\": \"llama3\"}";

static char *llama(const char *eos, const char *rope_scaling) {
  static char buf[4096];
  snprintf(buf, sizeof buf, llama32_1b_fmt, eos, rope_scaling);
  return buf;
}

static lh_err parse(const char *text, lh_config *c) {
  return lh_config_parse(text, strlen(text), "config.json", c);
}

/* Replaces the first occurrence of `from` in `text` by `to`. The result lives in one of two
 * static buffers used in turn, so edits can be nested once. */
static const char *edit(const char *text, const char *from, const char *to) {
  static char bufs[2][8192];
  static int turn;
  char *buf = bufs[turn ^= 1];
  const char *p = strstr(text, from);
  assert_non_null(p);
  char tmp[sizeof bufs[0]]; /* text may be the other buffer: build apart, then copy */
  snprintf(tmp, sizeof tmp, "%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
  memcpy(buf, tmp, sizeof tmp);
  return buf;
}

static void expect_error(const char *text, lh_err code, const char *needle) {
  lh_config c;
  memset(&c, 0x5a, sizeof c);
  lh_config before = c;
  lh_err e = parse(text, &c);
  if (e != code || !strstr(lh_last_error(), needle))
    fail_msg("got %s \"%s\", expected %s containing \"%s\"", lh_err_name(e), lh_last_error(),
             lh_err_name(code), needle);
  assert_memory_equal(&c, &before, sizeof c); /* output untouched on error */
  assert_non_null(strstr(lh_last_error(), "config.json"));
}

static void test_presets(void **state) {
  lh_config c;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_LLAMA, &c), LH_ERR_OK);
  assert_int_equal(c.arch, LH_ARCH_LLAMA);
  assert_int_equal(c.hidden_size, 128);
  assert_int_equal(c.n_layers, 4);
  assert_int_equal(c.n_heads, 4);
  assert_int_equal(c.n_kv_heads, 2);
  assert_int_equal(c.head_dim, 32);
  assert_int_equal(c.intermediate_size, 384);
  assert_int_equal(c.vocab_size, 256);
  assert_int_equal(c.max_positions, 2048);
  assert_true(c.tie_embeddings);
  assert_false(c.qkv_bias);
  assert_true(c.rope_theta == 10000.0f);
  assert_true(c.rms_eps == 1e-6f);
  assert_int_equal(c.bos_token_id, -1);
  assert_int_equal(c.eos_token_id, -1);
  assert_int_equal(lh_config_validate(&c), LH_ERR_OK);
  /* embed 256*128 + 4 * (2*128 + 3*128*128... ) + norm, worked out by hand */
  assert_int_equal(lh_config_n_params(&c), 820352);
  c.tie_embeddings = false;
  assert_int_equal(lh_config_n_params(&c), 820352 + 256 * 128);

  assert_int_equal(lh_config_preset("tiny", LH_ARCH_QWEN2, &c), LH_ERR_OK);
  assert_true(c.qkv_bias);
  assert_int_equal(lh_config_n_params(&c), 820352 + 4 * (128 + 64 + 64));

  /* Qwen3: q/k norms of head_dim each per layer, no biases */
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_QWEN3, &c), LH_ERR_OK);
  assert_int_equal(c.arch, LH_ARCH_QWEN3);
  assert_true(c.qk_norm);
  assert_false(c.qkv_bias);
  assert_int_equal(c.rope_scaling, LH_ROPE_DEFAULT);
  assert_int_equal(c.n_eos, 0);
  assert_int_equal(lh_config_validate(&c), LH_ERR_OK);
  assert_int_equal(lh_config_n_params(&c), 820352 + 4 * 2 * 32);
  lh_config bad = c;
  bad.qk_norm = false;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "q/k norms"));
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_LLAMA, &bad), LH_ERR_OK);
  bad.qk_norm = true; /* Llama has no q/k norms in config.json, so it cannot say so */
  assert_int_equal(lh_config_validate(&bad), LH_ERR_FORMAT);

  assert_int_equal(lh_config_preset("small", LH_ARCH_LLAMA, &c), LH_ERR_OK);
  assert_int_equal(c.vocab_size, 4096);
  assert_int_equal(c.hidden_size, 512);
  assert_int_equal(c.n_layers, 8);
  assert_int_equal(c.n_heads, 8);
  assert_int_equal(c.n_kv_heads, 4);
  assert_int_equal(c.head_dim, 64);
  assert_int_equal(c.intermediate_size, 1408);
  assert_true(c.tie_embeddings);
  assert_int_equal(lh_config_validate(&c), LH_ERR_OK);

  assert_int_equal(lh_config_preset("huge", LH_ARCH_LLAMA, &c), LH_ERR_INVAL);
  assert_non_null(strstr(lh_last_error(), "huge"));
  assert_int_equal(lh_config_preset(NULL, LH_ARCH_LLAMA, &c), LH_ERR_INVAL);
}

static void test_qwen25_05b(void **state) {
  lh_config c;
  assert_int_equal(parse(qwen25_05b, &c), LH_ERR_OK);
  assert_int_equal(c.arch, LH_ARCH_QWEN2);
  assert_int_equal(c.vocab_size, 151936);
  assert_int_equal(c.hidden_size, 896);
  assert_int_equal(c.intermediate_size, 4864);
  assert_int_equal(c.n_layers, 24);
  assert_int_equal(c.n_heads, 14);
  assert_int_equal(c.n_kv_heads, 2);
  assert_int_equal(c.head_dim, 64);
  assert_int_equal(c.max_positions, 32768);
  assert_true(c.rope_theta == 1000000.0f);
  assert_true(c.rms_eps == 1e-6f);
  assert_true(c.tie_embeddings);
  assert_true(c.qkv_bias);
  assert_false(c.o_bias);
  assert_int_equal(c.bos_token_id, 151643);
  assert_int_equal(c.eos_token_id, 151643);
  assert_int_equal(lh_config_n_params(&c), 494032768);
  /* Qwen2Attention: q/k/v biases and never an o_proj bias, whatever attention_bias says */
  for (int on = 0; on < 2; on++) {
    assert_int_equal(parse(edit(qwen25_05b, "\"attention_dropout\": 0.0,",
                                on ? "\"attention_bias\": true," : "\"attention_bias\": false,"),
                           &c),
                     LH_ERR_OK);
    assert_true(c.qkv_bias);
    assert_false(c.o_bias);
    assert_int_equal(lh_config_n_params(&c), 494032768);
  }
}

static void test_qwen3_06b(void **state) {
  lh_config c;
  assert_int_equal(parse(qwen3_06b, &c), LH_ERR_OK);
  assert_int_equal(c.arch, LH_ARCH_QWEN3);
  assert_int_equal(c.vocab_size, 151936);
  assert_int_equal(c.hidden_size, 1024);
  assert_int_equal(c.intermediate_size, 3072);
  assert_int_equal(c.n_layers, 28);
  assert_int_equal(c.n_heads, 16);
  assert_int_equal(c.n_kv_heads, 8);
  assert_int_equal(c.head_dim, 128); /* not 1024 / 16 */
  assert_int_equal(c.max_positions, 40960);
  assert_true(c.rope_theta == 1000000.0f); /* written as an integer */
  assert_true(c.rms_eps == 1e-6f);
  assert_true(c.tie_embeddings);
  assert_false(c.qkv_bias);
  assert_true(c.qk_norm);
  assert_int_equal(c.rope_scaling, LH_ROPE_DEFAULT);
  assert_int_equal(c.bos_token_id, 151643);
  assert_int_equal(c.eos_token_id, 151645);
  assert_int_equal(c.n_eos, 1);
  assert_int_equal(c.eos_ids[0], 151645);
  assert_int_equal(lh_config_n_params(&c), 596049920);
  /* the tensor table agrees: q_proj (2048, 1024), q_norm and k_norm (128) after the biases'
   * place, no lm_head */
  int n = lh_model_tensors(&c, NULL, 0);
  assert_int_equal(n, 1 + 28 * 11 + 1);
  lh_tensor_info *t = calloc((size_t)n, sizeof *t);
  lh_model_tensors(&c, t, n);
  size_t total = 0;
  for (int i = 0; i < n; i++)
    total += t[i].numel;
  assert_int_equal(total, 596049920);
  assert_string_equal(t[3].name, "model.layers.0.self_attn.k_proj.weight");
  assert_string_equal(t[5].name, "model.layers.0.self_attn.q_norm.weight");
  assert_string_equal(t[6].name, "model.layers.0.self_attn.k_norm.weight");
  assert_int_equal(t[5].ndim, 1);
  assert_int_equal(t[5].shape[0], 128);
  assert_int_equal(t[7].shape[1], 2048); /* o_proj (1024, 16*128) */
  assert_string_equal(t[n - 1].name, "model.norm.weight");
  free(t);

  /* model_type alone names it; attention_bias adds q/k/v and o_proj biases (Qwen3Attention
   * builds all four with bias=attention_bias); sliding windows refused */
  assert_int_equal(
      parse(edit(qwen3_06b, "\"Qwen3ForCausalLM\"", "\"Other\", \"Qwen3ForCausalLM\""), &c),
      LH_ERR_OK);
  assert_int_equal(c.arch, LH_ARCH_QWEN3);
  assert_int_equal(
      parse(edit(qwen3_06b, "\"attention_bias\": false", "\"attention_bias\": true"), &c),
      LH_ERR_OK);
  assert_true(c.qkv_bias && c.o_bias && c.qk_norm);
  assert_int_equal(lh_config_n_params(&c), 596049920 + 28 * (2048 + 2 * 1024 + 1024));
  expect_error(edit(qwen3_06b, "\"use_sliding_window\": false", "\"use_sliding_window\": true"),
               LH_ERR_UNSUPPORTED, "use_sliding_window");
  /* without max_position_embeddings: Qwen3Config's default */
  assert_int_equal(parse(edit(qwen3_06b, "\"max_position_embeddings\": 40960,", ""), &c),
                   LH_ERR_OK);
  assert_int_equal(c.max_positions, 32768);
}

static void test_llama32_1b(void **state) {
  lh_config c;
  assert_int_equal(parse(llama("128001", "null"), &c), LH_ERR_OK);
  assert_int_equal(c.arch, LH_ARCH_LLAMA);
  assert_int_equal(c.vocab_size, 128256);
  assert_int_equal(c.hidden_size, 2048);
  assert_int_equal(c.intermediate_size, 8192);
  assert_int_equal(c.n_layers, 16);
  assert_int_equal(c.n_heads, 32);
  assert_int_equal(c.n_kv_heads, 8);
  assert_int_equal(c.head_dim, 64);
  assert_int_equal(c.max_positions, 131072);
  assert_true(c.rope_theta == 500000.0f);
  assert_true(c.rms_eps == 1e-5f);
  assert_true(c.tie_embeddings);
  assert_false(c.qkv_bias);
  assert_int_equal(c.bos_token_id, 128000);
  assert_int_equal(c.eos_token_id, 128001);
  assert_int_equal(lh_config_n_params(&c), 1235814400);

  assert_int_equal(c.n_eos, 1);

  /* Llama 3.1-style eos list: kept whole, eos_token_id is its first; null means none */
  assert_int_equal(parse(llama("[128009, 128001, 128008]", "null"), &c), LH_ERR_OK);
  assert_int_equal(c.eos_token_id, 128009);
  assert_int_equal(c.n_eos, 3);
  assert_int_equal(c.eos_ids[0], 128009);
  assert_int_equal(c.eos_ids[1], 128001);
  assert_int_equal(c.eos_ids[2], 128008);
  assert_int_equal(parse(llama("null", "null"), &c), LH_ERR_OK);
  assert_int_equal(c.eos_token_id, -1);
  assert_int_equal(c.n_eos, 0);
  assert_int_equal(parse(llama("[]", "null"), &c), LH_ERR_OK);
  assert_int_equal(c.eos_token_id, -1);
  assert_int_equal(c.n_eos, 0);
  assert_int_equal(parse(llama("[1, 2, 3, 4, 5, 6, 7, 8]", "null"), &c), LH_ERR_OK);
  assert_int_equal(c.n_eos, LH_MAX_EOS);
  expect_error(llama("[1, 2, 3, 4, 5, 6, 7, 8, 9]", "null"), LH_ERR_LIMIT,
               "field eos_token_id: 9 ids, more than the limit of 8");
  expect_error(llama("[1, 128256]", "null"), LH_ERR_FORMAT, "eos_token_id[1] is 128256");
  expect_error(llama("[1, -1]", "null"), LH_ERR_LIMIT, "field eos_token_id[1]: -1 is out of range");

  assert_false(c.o_bias);
  /* attention_bias turns on q/k/v and o_proj biases for Llama (LlamaAttention) */
  assert_int_equal(
      parse(edit(llama("2", "null"), "\"attention_bias\": false", "\"attention_bias\": true"), &c),
      LH_ERR_OK);
  assert_true(c.qkv_bias);
  assert_true(c.o_bias);
  assert_int_equal(lh_config_n_params(&c), 1235814400 + 16 * (2048 + 2 * 512 + 2048));
  /* the tensor table: q/k/v biases after the three weights, o_proj.bias (hidden) after
   * o_proj.weight, inside each layer's block */
  int n = lh_model_tensors(&c, NULL, 0);
  assert_int_equal(n, 1 + 16 * 13 + 1);
  lh_tensor_info *t = calloc((size_t)n, sizeof *t);
  lh_model_tensors(&c, t, n);
  assert_string_equal(t[5].name, "model.layers.0.self_attn.q_proj.bias");
  assert_string_equal(t[8].name, "model.layers.0.self_attn.o_proj.weight");
  assert_string_equal(t[9].name, "model.layers.0.self_attn.o_proj.bias");
  assert_int_equal(t[9].ndim, 1);
  assert_int_equal(t[9].shape[0], 2048);
  assert_int_equal(t[9].offset, t[8].offset + t[8].numel);
  assert_string_equal(t[10].name, "model.layers.0.post_attention_layernorm.weight");
  assert_string_equal(t[9 + 13].name, "model.layers.1.self_attn.o_proj.bias");
  free(t);
}

/* Llama 3.1/3.2 rope_scaling is read and turned into Hugging Face's inv_freq; other types are
 * refused. */
static void test_rope_scaling(void **state) {
  lh_config c;
  assert_int_equal(parse(llama("128001", llama32_scaling), &c), LH_ERR_OK);
  assert_int_equal(c.rope_scaling, LH_ROPE_LLAMA3);
  assert_true(c.rope_factor == 32.0f);
  assert_true(c.rope_low_freq_factor == 1.0f);
  assert_true(c.rope_high_freq_factor == 4.0f);
  assert_int_equal(c.rope_original_max_positions, 8192);
  assert_int_equal(lh_config_n_params(&c), 1235814400);

  /* transformers' _compute_llama3_parameters in fp32 torch for this config (head_dim 64,
   * theta 500000): wavelengths below 8192/4 kept (i <= 14), above 8192 divided by 32
   * (i >= 18), between interpolated (15, 16, 17) */
  static const struct {
    int i;
    float want;
  } hf[] = {
      {0, 0x1p+0f},         {1, 0x1.53c38cp-1f},   {14, 0x1.a4ee4p-9f},   {15, 0x1.524f36p-10f},
      {16, 0x1.c26c4p-12f}, {17, 0x1.9731eep-14f}, {18, 0x1.46831ap-16f}, {31, 0x1.94836p-24f},
  };
  float inv[32];
  lh_config_rope_inv_freq(&c, inv);
  for (size_t k = 0; k < sizeof hf / sizeof hf[0]; k++) {
    float got = inv[hf[k].i], want = hf[k].want; /* powf may differ from torch by an ulp */
    if (!(fabsf(got - want) <= 2e-7f * want))
      fail_msg("inv_freq[%d] = %a, transformers gives %a", hf[k].i, (double)got, (double)want);
  }
  /* without rope_scaling: theta^(-2i/hd) */
  lh_config plain = c;
  plain.rope_scaling = LH_ROPE_DEFAULT;
  lh_config_rope_inv_freq(&plain, inv);
  assert_true(inv[0] == 1.0f);
  assert_float_equal(inv[18], powf(500000.0f, -36.0f / 64.0f), 1e-12);
  assert_float_equal(inv[18] / 32.0f, hf[6].want, 1e-13);

  /* the older "type" key names it too */
  assert_int_equal(parse(llama("1", "{\"type\": \"llama3\", \"factor\": 8.0, "
                                    "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                                    "\"original_max_position_embeddings\": 8192}"),
                         &c),
                   LH_ERR_OK);
  assert_int_equal(c.rope_scaling, LH_ROPE_LLAMA3);
  assert_true(c.rope_factor == 8.0f);

  expect_error(llama("1", "{\"type\": \"linear\", \"factor\": 2.0}"), LH_ERR_UNSUPPORTED,
               "rope_scaling type linear is not supported");
  expect_error(llama("1", "{\"type\": \"yarn\", \"factor\": 4.0}"), LH_ERR_UNSUPPORTED, "yarn");
  expect_error(llama("1", "{\"factor\": 4.0}"), LH_ERR_UNSUPPORTED, "(unnamed)");
  expect_error(llama("1", "\"yes\""), LH_ERR_FORMAT, "rope_scaling");
  expect_error(llama("1", edit(llama32_scaling, "\"factor\": 32.0, ", "")), LH_ERR_FORMAT,
               "field rope_scaling.factor: expected a number, found nothing");
  expect_error(llama("1", edit(llama32_scaling, "8192", "8192.5")), LH_ERR_FORMAT,
               "field rope_scaling.original_max_position_embeddings: expected an integer");
  expect_error(
      llama("1", edit(llama32_scaling, "\"high_freq_factor\": 4.0", "\"high_freq_factor\": 1.0")),
      LH_ERR_FORMAT, "low_freq_factor < high_freq_factor");
  expect_error(llama("1", edit(llama32_scaling, "32.0", "0.5")), LH_ERR_FORMAT,
               "rope_scaling.factor is 0.5");
  expect_error(llama("1", edit(llama32_scaling, "8192", "0")), LH_ERR_FORMAT,
               "rope_scaling.original_max_position_embeddings is 0");
  assert_int_equal(parse(llama("1", "{\"rope_type\": \"default\"}"), &c), LH_ERR_OK);
  assert_int_equal(c.rope_scaling, LH_ROPE_DEFAULT);

  /* transformers v5: rope_parameters holds rope_theta and the scaling (it read as theta 10000) */
  lh_config v4 = c, v5;
  assert_int_equal(parse(llama("128001", llama32_scaling), &v4), LH_ERR_OK);
  char v5_llama[4096];
  snprintf(v5_llama, sizeof v5_llama, "%s",
           edit(llama("128001", "null"), "\"rope_scaling\": null,\n  \"rope_theta\": 500000.0,",
                "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, "
                "\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, "
                "\"original_max_position_embeddings\": 8192},"));
  assert_int_equal(parse(v5_llama, &v5), LH_ERR_OK);
  assert_memory_equal(&v5, &v4, sizeof v4);
  const char *v5_qwen = edit(qwen3_06b, "\"rope_scaling\": null,\n  \"rope_theta\": 1000000,",
                             "\"rope_parameters\": {\"rope_type\": \"default\", "
                             "\"rope_theta\": 1000000},");
  assert_int_equal(parse(v5_qwen, &v5), LH_ERR_OK);
  assert_true(v5.rope_theta == 1e6f && v5.rope_scaling == LH_ROPE_DEFAULT);
  expect_error(edit(qwen3_06b, "\"rope_scaling\": null,",
                    "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5},"),
               LH_ERR_FORMAT, "both rope_theta and rope_parameters");
  expect_error(edit(llama("1", llama32_scaling), "\"rope_theta\": 500000.0,",
                    "\"rope_parameters\": {\"rope_type\": \"default\"},"),
               LH_ERR_FORMAT, "both rope_scaling and rope_parameters");
  expect_error(edit(qwen3_06b, "\"rope_scaling\": null,", "\"partial_rotary_factor\": 0.5,"),
               LH_ERR_UNSUPPORTED, "partial_rotary_factor 0.5");
  expect_error(edit(qwen3_06b, "\"rope_scaling\": null,\n  \"rope_theta\": 1000000,",
                    "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1, "
                    "\"partial_rotary_factor\": 0.25},"),
               LH_ERR_UNSUPPORTED, "partial_rotary_factor 0.25");
  /* parameters per layer type (Gemma's form) name no type */
  expect_error(edit(qwen3_06b, "\"rope_scaling\": null,\n  \"rope_theta\": 1000000,",
                    "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\"}},"),
               LH_ERR_UNSUPPORTED, "rope_parameters type (unnamed)");
}

/* generation_config.json: its eos list replaces config.json's; other fields are ignored. */
static void test_generation_config(void **state) {
  lh_config c, g;
  assert_int_equal(parse(qwen3_06b, &c), LH_ERR_OK);
  /* Qwen3-0.6B's generation_config.json */
  const char *qwen3_gen = "{\n  \"bos_token_id\": 151643,\n  \"do_sample\": true,\n"
                          "  \"eos_token_id\": [\n    151645,\n    151643\n  ],\n"
                          "  \"pad_token_id\": 151643,\n  \"temperature\": 0.6,\n"
                          "  \"top_k\": 20,\n  \"top_p\": 0.95,\n"
                          "  \"transformers_version\": \"4.51.0\"\n}\n";
  g = c;
  assert_int_equal(lh_config_parse_generation(qwen3_gen, strlen(qwen3_gen), "gen.json", &g),
                   LH_ERR_OK);
  assert_int_equal(g.n_eos, 2);
  assert_int_equal(g.eos_ids[0], 151645);
  assert_int_equal(g.eos_ids[1], 151643);
  assert_int_equal(g.eos_token_id, 151645);
  assert_int_equal(g.bos_token_id, 151643);
  assert_int_equal(lh_config_validate(&g), LH_ERR_OK);
  /* an integer; absent or null keeps config.json's */
  g = c;
  const char *one = "{\"eos_token_id\": 151643}";
  assert_int_equal(lh_config_parse_generation(one, strlen(one), "gen.json", &g), LH_ERR_OK);
  assert_int_equal(g.n_eos, 1);
  assert_int_equal(g.eos_token_id, 151643);
  g = c;
  const char *none = "{\"temperature\": 0.7, \"eos_token_id\": null}";
  assert_int_equal(lh_config_parse_generation(none, strlen(none), "gen.json", &g), LH_ERR_OK);
  assert_memory_equal(&g, &c, sizeof c);

  /* malformed: error names the file and the field, config untouched */
  static const struct {
    const char *text;
    lh_err code;
    const char *needle;
  } bad[] = {
      {"{\"eos_token_id\": \"</s>\"}", LH_ERR_FORMAT, "gen.json: field eos_token_id: expected"},
      {"{\"eos_token_id\": [151645, \"x\"]}", LH_ERR_FORMAT,
       "gen.json: field eos_token_id[1]: expected an integer, found string"},
      {"{\"eos_token_id\": [151936]}", LH_ERR_FORMAT, "gen.json: field eos_token_id: 151936"},
      {"{\"eos_token_id\": [1,2,3,4,5,6,7,8,9]}", LH_ERR_LIMIT, "gen.json: field eos_token_id"},
      {"{\"eos_token_id\": 1", LH_ERR_FORMAT, "gen.json: not valid JSON"},
      {"[151645]", LH_ERR_FORMAT, "gen.json: expected a JSON object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    g = c;
    lh_err e = lh_config_parse_generation(bad[i].text, strlen(bad[i].text), "gen.json", &g);
    if (e != bad[i].code || !strstr(lh_last_error(), bad[i].needle))
      fail_msg("%s: got %s \"%s\", expected %s containing \"%s\"", bad[i].text, lh_err_name(e),
               lh_last_error(), lh_err_name(bad[i].code), bad[i].needle);
    assert_memory_equal(&g, &c, sizeof c);
  }
}

static void test_defaults(void **state) {
  const char *min = "{\"model_type\": \"llama\", \"vocab_size\": 100, \"hidden_size\": 64,"
                    " \"intermediate_size\": 160, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 4}";
  lh_config c;
  assert_int_equal(parse(min, &c), LH_ERR_OK);
  assert_int_equal(c.arch, LH_ARCH_LLAMA);
  assert_int_equal(c.n_kv_heads, 4);
  assert_int_equal(c.head_dim, 16);
  assert_int_equal(c.max_positions, 2048);
  assert_true(c.rope_theta == 10000.0f);
  assert_true(c.rms_eps == 1e-6f);
  assert_false(c.tie_embeddings);
  assert_false(c.qkv_bias);
  assert_int_equal(c.bos_token_id, -1);
  assert_int_equal(c.eos_token_id, -1);

  /* model_type qwen2 alone: bias always on, Qwen2's default context */
  assert_int_equal(parse(edit(min, "\"llama\"", "\"qwen2\""), &c), LH_ERR_OK);
  assert_int_equal(c.arch, LH_ARCH_QWEN2);
  assert_true(c.qkv_bias);
  assert_int_equal(c.max_positions, 32768);
  /* explicit nulls count as absent */
  assert_int_equal(parse(edit(min, "\"vocab_size\"",
                              "\"num_key_value_heads\": null, "
                              "\"head_dim\": null, \"vocab_size\""),
                         &c),
                   LH_ERR_OK);
  assert_int_equal(c.n_kv_heads, 4);
  assert_int_equal(c.head_dim, 16);
  /* an architectures entry wins over model_type */
  assert_int_equal(
      parse(edit(min, "{", "{\"architectures\": [\"Foo\", \"Qwen2ForCausalLM\"], "), &c),
      LH_ERR_OK);
  assert_int_equal(c.arch, LH_ARCH_QWEN2);
}

static void test_bad_types(void **state) {
  expect_error(edit(qwen25_05b, "\"num_attention_heads\": 14", "\"num_attention_heads\": \"14\""),
               LH_ERR_FORMAT,
               "config.json: field num_attention_heads: expected an integer, found string");
  expect_error(edit(qwen25_05b, "\"hidden_size\": 896", "\"hidden_size\": 896.0"), LH_ERR_FORMAT,
               "field hidden_size: expected an integer, found real");
  expect_error(edit(qwen25_05b, "\"rope_theta\": 1000000.0", "\"rope_theta\": \"big\""),
               LH_ERR_FORMAT, "field rope_theta: expected a number, found string");
  expect_error(edit(qwen25_05b, "\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": [1e-06]"),
               LH_ERR_FORMAT, "field rms_norm_eps: expected a number, found array");
  expect_error(edit(qwen25_05b, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1"),
               LH_ERR_FORMAT, "field tie_word_embeddings: expected a boolean, found integer");
  expect_error(edit(qwen25_05b, "\"bos_token_id\": 151643", "\"bos_token_id\": \"<s>\""),
               LH_ERR_FORMAT, "field bos_token_id");
  expect_error(edit(qwen25_05b, "\"eos_token_id\": 151643", "\"eos_token_id\": [\"x\"]"),
               LH_ERR_FORMAT, "field eos_token_id");
  expect_error(edit(qwen25_05b, "[\n    \"Qwen2ForCausalLM\"\n  ]", "\"Qwen2ForCausalLM\""),
               LH_ERR_FORMAT, "field architectures");
  expect_error(edit(qwen25_05b, "\"vocab_size\": 151936", "\"vocab_size\": 99999999999"),
               LH_ERR_LIMIT, "field vocab_size");
  expect_error(edit(qwen25_05b, "\"hidden_size\": 896,", ""), LH_ERR_FORMAT,
               "field hidden_size is missing");
  expect_error("{\"model_type\": \"llama\", ", LH_ERR_FORMAT, "not valid JSON");
  expect_error("[1]", LH_ERR_FORMAT, "expected a JSON object");
  expect_error("", LH_ERR_FORMAT, "not valid JSON");
  expect_error(edit(qwen25_05b, "\"use_cache\": true", "\"use_cache\": true, \"use_cache\": 1"),
               LH_ERR_FORMAT, "duplicate");
}

static void test_unsupported(void **state) {
  expect_error(edit(qwen25_05b, "Qwen2ForCausalLM", "MistralForCausalLM"), LH_ERR_UNSUPPORTED,
               "architecture MistralForCausalLM is not supported");
  expect_error(edit(edit(qwen25_05b, "Qwen2ForCausalLM", "X"), "\"qwen2\"", "\"gpt2\""),
               LH_ERR_UNSUPPORTED, "architecture X");
  expect_error(edit(qwen25_05b, "\"silu\"", "\"gelu\""), LH_ERR_UNSUPPORTED,
               "hidden_act gelu is not supported");
  expect_error(edit(qwen25_05b, "\"use_sliding_window\": false", "\"use_sliding_window\": true"),
               LH_ERR_UNSUPPORTED, "use_sliding_window");
  expect_error(edit(llama("1", "null"), "\"mlp_bias\": false", "\"mlp_bias\": true"),
               LH_ERR_UNSUPPORTED, "mlp_bias");
}

/* What parsing costs is bounded before parsing: 65537 empty objects (~200 bytes each) */
static void test_json_cost(void **state) {
  size_t n = (1u << 16) + 1;
  char *text = malloc(3 * n + 64), *p = text + sprintf(text, "{\"x\": [");
  for (size_t i = 0; i < n; i++)
    p += sprintf(p, i ? ",{}" : "{}");
  sprintf(p, "]}");
  expect_error(text, LH_ERR_LIMIT, "opening an object or array");
  free(text);
}

static void test_invalid_values(void **state) {
  expect_error(edit(qwen25_05b, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"),
               LH_ERR_FORMAT, "num_key_value_heads");
  expect_error(edit(qwen25_05b, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 28"),
               LH_ERR_FORMAT, "num_key_value_heads is 28");
  expect_error(edit(qwen25_05b, "\"num_hidden_layers\": 24", "\"num_hidden_layers\": 0"),
               LH_ERR_FORMAT, "num_hidden_layers is 0");
  expect_error(edit(qwen25_05b, "\"num_hidden_layers\": 24", "\"num_hidden_layers\": 100000"),
               LH_ERR_LIMIT, "num_hidden_layers");
  expect_error(edit(qwen25_05b, "\"vocab_size\": 151936", "\"vocab_size\": -5"), LH_ERR_FORMAT,
               "vocab_size");
  expect_error(edit(qwen25_05b, "\"hidden_size\": 896", "\"hidden_size\": 897"), LH_ERR_FORMAT,
               "not a multiple of num_attention_heads");
  expect_error(edit(llama("1", "null"), "\"head_dim\": 64", "\"head_dim\": 63"), LH_ERR_FORMAT,
               "head_dim");
  expect_error(edit(qwen25_05b, "\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 0"), LH_ERR_FORMAT,
               "rms_norm_eps");
  expect_error(edit(qwen25_05b, "\"rope_theta\": 1000000.0", "\"rope_theta\": -1.0"), LH_ERR_FORMAT,
               "rope_theta");
  expect_error(edit(qwen25_05b, "\"rope_theta\": 1000000.0", "\"rope_theta\": 1e300"), LH_ERR_LIMIT,
               "rope_theta");
  expect_error(
      edit(qwen25_05b, "\"max_position_embeddings\": 32768", "\"max_position_embeddings\": 0"),
      LH_ERR_FORMAT, "max_position_embeddings");
  expect_error(edit(qwen25_05b, "\"eos_token_id\": 151643", "\"eos_token_id\": 151936"),
               LH_ERR_FORMAT, "eos_token_id");

  /* validate on structs directly: each message names the field */
  lh_config c;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_LLAMA, &c), LH_ERR_OK);
  lh_config bad = c;
  bad.n_kv_heads = 3;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "num_key_value_heads"));
  bad = c;
  bad.head_dim = 33;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "head_dim"));
  bad = c;
  bad.rms_eps = 0.0f;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "rms_norm_eps"));
  bad = c;
  bad.vocab_size = LH_MAX_VOCAB + 1;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "vocab_size"));
  bad = c;
  bad.intermediate_size = 0;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "intermediate_size"));
  /* each size within its limit, 3.4e14 parameters in all: over LH_MAX_PARAMS, refused before
   * anything tries to allocate them */
  bad = c;
  bad.vocab_size = LH_MAX_VOCAB;
  bad.hidden_size = LH_MAX_HIDDEN;
  bad.intermediate_size = 8 * LH_MAX_HIDDEN;
  bad.n_layers = LH_MAX_LAYERS;
  bad.n_heads = LH_MAX_HEADS;
  bad.n_kv_heads = 1;
  bad.head_dim = 4096;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_LIMIT);
  assert_non_null(strstr(lh_last_error(), "more than the limit of 1000000000000"));
  lh_model *none = NULL;
  assert_int_equal(lh_model_create(&bad, &none), LH_ERR_LIMIT);
  assert_null(none);
  /* Llama 3.1 405B's shape is within it */
  bad = c;
  bad.vocab_size = 128256;
  bad.hidden_size = 16384;
  bad.intermediate_size = 53248;
  bad.n_layers = 126;
  bad.n_heads = 128;
  bad.n_kv_heads = 8;
  bad.head_dim = 128;
  bad.tie_embeddings = false;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_OK);
  assert_true(lh_config_n_params(&bad) > 405000000000u);
  bad = c;
  bad.arch = LH_ARCH_QWEN2; /* Qwen2 without biases cannot be written as config.json */
  assert_int_equal(lh_config_validate(&bad), LH_ERR_FORMAT);
  /* neither can Qwen2 with an o_proj bias, nor Llama/Qwen3 with only some attention biases */
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_QWEN2, &bad), LH_ERR_OK);
  bad.o_bias = true;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "o_proj"));
  bad = c;
  bad.qkv_bias = true;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_FORMAT);
  assert_non_null(strstr(lh_last_error(), "attention_bias"));
  bad.o_bias = true;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_OK);
  bad.qkv_bias = false;
  assert_int_equal(lh_config_validate(&bad), LH_ERR_FORMAT);
}

/* lh_config_override: a config.json-style file over a preset, read as the loader reads it. */
static void test_override(void **state) {
  lh_config c, orig;
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_LLAMA, &orig), LH_ERR_OK);
  c = orig;
  const char *ok =
      "{\"hidden_size\": 128, \"num_attention_heads\": 8, \"num_key_value_heads\": 2,"
      " \"eos_token_id\": [2, 5], \"rope_theta\": 5000, \"torch_dtype\": \"bfloat16\"}";
  assert_int_equal(lh_config_override(ok, strlen(ok), "over.json", &c), LH_ERR_OK);
  assert_int_equal(c.hidden_size, 128);
  assert_int_equal(c.head_dim, 16); /* follows hidden_size / heads: the preset's is not kept */
  assert_int_equal(c.n_kv_heads, 2);
  assert_int_equal(c.n_eos, 2);
  assert_int_equal(c.eos_ids[1], 5);
  assert_float_equal(c.rope_theta, 5000.0f, 0.0f);
  assert_int_equal(c.n_layers, orig.n_layers); /* keys not given keep the preset's values */
  assert_int_equal(c.vocab_size, orig.vocab_size);
  /* transformers v5's rope_parameters in place of the preset's rope_theta */
  const char *v5 = "{\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5e5}}";
  assert_int_equal(lh_config_override(v5, strlen(v5), "over.json", &c), LH_ERR_OK);
  assert_true(c.rope_theta == 5e5f && c.rope_scaling == LH_ROPE_DEFAULT);
  /* architectures null: model_type (the preset's) says what the model is, as in Hugging Face */
  const char *null_archs = "{\"architectures\": null}";
  assert_int_equal(lh_config_override(null_archs, strlen(null_archs), "over.json", &c), LH_ERR_OK);
  assert_int_equal(c.arch, LH_ARCH_LLAMA);
  /* errors name the file and leave c as it was */
  static const struct {
    const char *json, *msg;
  } bad[] = {
      {"{\"num_layers\": 2}", "over.json: unknown key \"num_layers\""},
      {"{\"model_type\": \"qwen2\"}", "name Qwen2ForCausalLM, not LlamaForCausalLM"},
      {"{\"architectures\": [\"Qwen3ForCausalLM\"]}",
       "name Qwen3ForCausalLM, not LlamaForCausalLM"},
      {"{\"hidden_size\": 100, \"num_attention_heads\": 3}", "not a multiple"},
      {"{\"vocab_size\": \"big\"}", "vocab_size"},
      {"[1]", "expected a JSON object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    lh_config d = c;
    assert_int_not_equal(lh_config_override(bad[i].json, strlen(bad[i].json), "over.json", &d),
                         LH_ERR_OK);
    assert_non_null(strstr(lh_last_error(), bad[i].msg));
    assert_memory_equal(&d, &c, sizeof c);
  }
}

/* lh_config_same_forward: every field that changes the forward is compared and named. */
static void test_same_forward(void **state) {
  lh_config a, b;
  char why[160];
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_LLAMA, &a), LH_ERR_OK);
  b = a;
  assert_true(lh_config_same_forward(&a, &b, why, sizeof why));
  b.eos_token_id = b.eos_ids[0] = 3; /* generation stops elsewhere; the forward is the same */
  b.n_eos = 1;
  b.bos_token_id = 2;
  assert_true(lh_config_same_forward(&a, &b, NULL, 0));
  /* the reviewer's case: as many parameters, another head layout */
  b = a;
  b.n_heads = 8;
  b.n_kv_heads = 4;
  b.head_dim = 16;
  assert_int_equal(lh_config_n_params(&a), lh_config_n_params(&b));
  assert_false(lh_config_same_forward(&a, &b, why, sizeof why));
  assert_string_equal(why, "num_attention_heads: 4 vs 8");
  /* each field changed on its own is found and named */
  lh_config v[16];
  const char *names[16];
  int n = 0;
#define EDIT(name, stmt)                                                                           \
  do {                                                                                             \
    lh_config *c = &v[n];                                                                          \
    *c = a;                                                                                        \
    stmt;                                                                                          \
    names[n++] = name;                                                                             \
  } while (0)
  EDIT("architectures", c->arch = LH_ARCH_QWEN3);
  EDIT("vocab_size", c->vocab_size++);
  EDIT("hidden_size", c->hidden_size *= 2);
  EDIT("num_hidden_layers", c->n_layers++);
  EDIT("num_key_value_heads", c->n_kv_heads = 4);
  EDIT("head_dim", c->head_dim = 16);
  EDIT("intermediate_size", c->intermediate_size++);
  EDIT("max_position_embeddings", c->max_positions++);
  EDIT("rope_scaling", c->rope_scaling = LH_ROPE_LLAMA3);
  EDIT("tie_word_embeddings", c->tie_embeddings = false);
  EDIT("attention_bias (q/k/v)", c->qkv_bias = c->o_bias = true);
  EDIT("rope_theta", c->rope_theta = 500000.0f);
  EDIT("rms_norm_eps", c->rms_eps = 1e-5f);
#undef EDIT
  for (int i = 0; i < n; i++) {
    assert_false(lh_config_same_forward(&a, &v[i], why, sizeof why));
    if (strncmp(why, names[i], strlen(names[i])) != 0)
      fail_msg("changing %s: the difference named is \"%s\"", names[i], why);
  }
  /* o_proj bias alone, and the llama3 factors when both scale */
  b = a;
  b.o_bias = true;
  assert_false(lh_config_same_forward(&a, &b, why, sizeof why));
  assert_string_equal(why, "attention_bias (o_proj): no vs yes");
  a.rope_scaling = LH_ROPE_LLAMA3;
  a.rope_factor = 8.0f, a.rope_low_freq_factor = 1.0f, a.rope_high_freq_factor = 4.0f;
  a.rope_original_max_positions = 8192;
  b = a;
  assert_true(lh_config_same_forward(&a, &b, why, sizeof why));
  b.rope_factor = 32.0f;
  assert_false(lh_config_same_forward(&a, &b, why, sizeof why));
  assert_string_equal(why, "rope_scaling.factor: 8 vs 32");
  b = a;
  b.rope_original_max_positions = 4096;
  assert_false(lh_config_same_forward(&a, &b, why, sizeof why));
  assert_string_equal(why, "rope_scaling.original_max_position_embeddings: 8192 vs 4096");
}

static void check_same(const lh_config *a, const lh_config *b) {
  assert_int_equal(a->arch, b->arch);
  assert_int_equal(a->vocab_size, b->vocab_size);
  assert_int_equal(a->hidden_size, b->hidden_size);
  assert_int_equal(a->n_layers, b->n_layers);
  assert_int_equal(a->n_heads, b->n_heads);
  assert_int_equal(a->n_kv_heads, b->n_kv_heads);
  assert_int_equal(a->head_dim, b->head_dim);
  assert_int_equal(a->intermediate_size, b->intermediate_size);
  assert_int_equal(a->max_positions, b->max_positions);
  assert_true(a->rope_theta == b->rope_theta);
  assert_true(a->rms_eps == b->rms_eps);
  assert_int_equal(a->tie_embeddings, b->tie_embeddings);
  assert_int_equal(a->qkv_bias, b->qkv_bias);
  assert_int_equal(a->o_bias, b->o_bias);
  assert_int_equal(a->qk_norm, b->qk_norm);
  assert_int_equal(a->rope_scaling, b->rope_scaling);
  if (a->rope_scaling == LH_ROPE_LLAMA3) {
    assert_true(a->rope_factor == b->rope_factor);
    assert_true(a->rope_low_freq_factor == b->rope_low_freq_factor);
    assert_true(a->rope_high_freq_factor == b->rope_high_freq_factor);
    assert_int_equal(a->rope_original_max_positions, b->rope_original_max_positions);
  }
  assert_int_equal(a->bos_token_id, b->bos_token_id);
  assert_int_equal(a->eos_token_id, b->eos_token_id);
  assert_int_equal(a->n_eos, b->n_eos);
  assert_memory_equal(a->eos_ids, b->eos_ids, (size_t)a->n_eos * sizeof a->eos_ids[0]);
}

static void test_save_load_round_trip(void **state) {
  char dir[] = "/tmp/lh_test_cfg_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof path, "%s/config.json", dir);

  lh_config cases[9];
  assert_int_equal(lh_config_preset("tiny", LH_ARCH_LLAMA, &cases[0]), LH_ERR_OK);
  assert_int_equal(lh_config_preset("small", LH_ARCH_QWEN2, &cases[1]), LH_ERR_OK);
  assert_int_equal(parse(qwen25_05b, &cases[2]), LH_ERR_OK);
  assert_int_equal(parse(llama("128001", "null"), &cases[3]), LH_ERR_OK);
  cases[4] = cases[0];
  cases[4].tie_embeddings = false;
  cases[4].qkv_bias = cases[4].o_bias = true;
  cases[4].head_dim = 48; /* differs from hidden/heads: must be written */
  cases[4].rope_theta = 12345.678f;
  cases[4].rms_eps = 3.3e-7f;
  cases[5] = cases[1];
  cases[5].bos_token_id = 0;
  cases[5].eos_token_id = cases[5].eos_ids[0] = 4095;
  cases[5].n_eos = 1;
  assert_int_equal(parse(qwen3_06b, &cases[6]), LH_ERR_OK);
  assert_int_equal(parse(llama("[128009, 128001, 128008]", llama32_scaling), &cases[7]), LH_ERR_OK);
  cases[7].rope_factor = 7.3f; /* not a short decimal in binary */
  assert_int_equal(lh_config_preset("small", LH_ARCH_QWEN3, &cases[8]), LH_ERR_OK);
  cases[8].qkv_bias = cases[8].o_bias = true;
  for (int i = 0; i < 9; i++) {
    assert_int_equal(lh_config_save(path, &cases[i]), LH_ERR_OK);
    lh_config back;
    memset(&back, 0, sizeof back);
    assert_int_equal(lh_config_load(path, &back), LH_ERR_OK);
    check_same(&cases[i], &back);
  }

  /* the text is what Hugging Face tools expect */
  assert_int_equal(lh_config_save(path, &cases[2]), LH_ERR_OK);
  char *text = NULL;
  size_t len = 0;
  assert_int_equal(lh_file_read(path, 1 << 20, &text, &len), LH_ERR_OK);
  assert_non_null(strstr(text, "\"architectures\": [\n    \"Qwen2ForCausalLM\"\n  ]"));
  assert_non_null(strstr(text, "\"model_type\": \"qwen2\""));
  assert_non_null(strstr(text, "\"rms_norm_eps\": 1e-6"));
  assert_non_null(strstr(text, "\"rope_theta\": 1000000.0"));
  assert_non_null(strstr(text, "\"torch_dtype\": \"float32\""));
  assert_non_null(strstr(text, "\"hidden_act\": \"silu\""));
  assert_non_null(strstr(text, "\"use_cache\": true"));
  assert_non_null(strstr(text, "\"tie_word_embeddings\": true"));
  assert_non_null(strstr(text, "\"bos_token_id\": 151643"));
  assert_true(text[len - 1] == '\n');
  free(text);
  assert_int_equal(lh_config_save(path, &cases[0]), LH_ERR_OK);
  assert_int_equal(lh_file_read(path, 1 << 20, &text, &len), LH_ERR_OK);
  assert_non_null(strstr(text, "\"bos_token_id\": null"));
  assert_non_null(strstr(text, "\"attention_bias\": false"));
  assert_non_null(strstr(text, "\"rope_scaling\": null"));
  free(text);
  assert_int_equal(lh_config_save(path, &cases[6]), LH_ERR_OK);
  assert_int_equal(lh_file_read(path, 1 << 20, &text, &len), LH_ERR_OK);
  assert_non_null(strstr(text, "\"architectures\": [\n    \"Qwen3ForCausalLM\"\n  ]"));
  assert_non_null(strstr(text, "\"model_type\": \"qwen3\""));
  assert_non_null(strstr(text, "\"attention_bias\": false"));
  assert_non_null(strstr(text, "\"head_dim\": 128"));
  assert_non_null(strstr(text, "\"eos_token_id\": 151645,"));
  free(text);
  /* an eos list stays a list; rope_scaling as transformers writes it */
  cases[7].rope_factor = 32.0f;
  assert_int_equal(lh_config_save(path, &cases[7]), LH_ERR_OK);
  assert_int_equal(lh_file_read(path, 1 << 20, &text, &len), LH_ERR_OK);
  assert_non_null(strstr(text, "\"eos_token_id\": [\n    128009,\n    128001,\n    128008\n  ]"));
  assert_non_null(strstr(text, "\"rope_scaling\": {\n    \"factor\": 32.0,\n"
                               "    \"low_freq_factor\": 1.0,\n    \"high_freq_factor\": 4.0,\n"
                               "    \"original_max_position_embeddings\": 8192,\n"
                               "    \"rope_type\": \"llama3\"\n  }"));
  free(text);

  /* an invalid config is not written */
  lh_config bad = cases[0];
  bad.n_heads = 0;
  snprintf(path, sizeof path, "%s/bad.json", dir);
  assert_int_equal(lh_config_save(path, &bad), LH_ERR_FORMAT);
  lh_config back;
  assert_int_equal(lh_config_load(path, &back), LH_ERR_IO);
  assert_non_null(strstr(lh_last_error(), "bad.json"));

  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_presets),      cmocka_unit_test(test_qwen25_05b),
      cmocka_unit_test(test_qwen3_06b),    cmocka_unit_test(test_llama32_1b),
      cmocka_unit_test(test_rope_scaling), cmocka_unit_test(test_generation_config),
      cmocka_unit_test(test_defaults),     cmocka_unit_test(test_bad_types),
      cmocka_unit_test(test_unsupported),  cmocka_unit_test(test_invalid_values),
      cmocka_unit_test(test_json_cost),    cmocka_unit_test(test_save_load_round_trip),
      cmocka_unit_test(test_override),     cmocka_unit_test(test_same_forward),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
