/* `longhaul patch make|apply|stats`: lossless bf16 policy patches (include/longhaul/patch.h) from
 * the command line: make a patch between two model directories of one shape, apply one to a
 * model directory (hash-checked) writing a bf16 model directory, and print what a patch holds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "longhaul/patch.h"
#include "longhaul/tokenizer.h"

/* a patch is never larger than this many bytes per value, plus its table */
#define MAX_BYTES_PER_VALUE 16

/* ---------------------------------------------------------------- make */

static const lh__flag make_flags[] = {
    {"from", "DIR", true, "the parent policy: a model directory (or a run directory)"},
    {"to", "DIR", true, "the child policy: a model directory of the same shape"},
    {"out", "FILE", true, "where to write the patch"},
    {"from-version", "U", false, "the parent's version number, recorded in the patch (default 0)"},
    {"to-version", "V", false, "the child's version number (default: the parent's + 1)"},
};

static int patch_make(int argc, char **argv) {
  lh__args a = {.cmd = "patch make",
                .about = "Makes the lossless patch from one bf16 policy to the next (weights in "
                         "F32 are rounded to bf16 first, as the trainer publishes them).",
                .flags = make_flags,
                .n_flags = sizeof make_flags / sizeof make_flags[0]};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_model(&a, "from")) != LH__ARGS_CONTINUE ||
      (rc = lh__args_model(&a, "to")) != LH__ARGS_CONTINUE)
    return rc;
  uint64_t u, v;
  if ((rc = lh__args_u64(&a, "from-version", LH__SEED_MAX, 0, &u)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_u64(&a, "to-version", LH__SEED_MAX, u + 1, &v)) != LH__ARGS_CONTINUE)
    return rc;
  const char *from = lh__args_str(&a, "from", NULL), *to = lh__args_str(&a, "to", NULL);
  lh_config ca, cb;
  uint16_t *pa = NULL, *pb = NULL;
  uint8_t *patch = NULL;
  lh_patch_section *sec = NULL;
  size_t len = 0;
  rc = LH__EXIT_FAIL;
  char why[160];
  if (lh_model_load_bf16(from, &ca, &pa) || lh_model_load_bf16(to, &cb, &pb)) {
    rc = lh__cli_fail(a.cmd);
    goto out;
  }
  if (!lh_config_same_forward(&ca, &cb, why, sizeof why)) {
    rc = lh__cli_error(a.cmd, LH__EXIT_FAIL, "%s and %s are models of other shapes (%s)", from, to,
                       why);
    goto out;
  }
  uint64_t n = lh_config_n_params(&ca);
  int ns = lh_patch_sections(&ca, NULL, 0);
  sec = lh_xcalloc((size_t)ns, sizeof *sec);
  lh_patch_sections(&ca, sec, ns);
  double t0 = lh_time_now();
  if (lh_patch_make(pa, pb, n, sec, ns, (int64_t)u, (int64_t)v, &patch, &len) ||
      lh_file_write_atomic(lh__args_str(&a, "out", NULL), patch, len)) {
    rc = lh__cli_fail(a.cmd);
    goto out;
  }
  lh_patch_info info;
  if (lh_patch_read_info(patch, len, &info) == LH_ERR_OK) {
    fprintf(stderr,
            "patch make: %llu of %llu values changed (%.4f%%), %zu bytes (%.3f bits per change, "
            "%.1fx smaller than the bf16 policy), %.2f s\n",
            (unsigned long long)info.total_changed, (unsigned long long)n,
            100.0 * (double)info.total_changed / (double)n, len,
            info.total_changed ? 8.0 * (double)len / (double)info.total_changed : 0.0,
            (double)(2 * n) / (double)len, lh_time_now() - t0);
    lh_patch_info_free(&info);
  }
  rc = LH__EXIT_OK;
out:
  free(pa);
  free(pb);
  free(patch);
  free(sec);
  return rc;
}

/* ---------------------------------------------------------------- apply */

static const lh__flag apply_flags[] = {
    {"model", "DIR", true, "the parent policy: a model directory (or a run directory)"},
    {"patch", "FILE", true, "the patch (patch make, or a blob a trainer published)"},
    {"out", "DIR", true, "where to write the child: a bf16 model directory"},
};

static int patch_apply(int argc, char **argv) {
  lh__args a = {.cmd = "patch apply",
                .about = "Applies a patch to a policy: checks the policy's hash against the "
                         "patch's parent, and the result's against its child, and writes the "
                         "child as a bf16 model directory (with the parent's tokenizer.json and "
                         "generation_config.json).",
                .flags = apply_flags,
                .n_flags = sizeof apply_flags / sizeof apply_flags[0]};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_model(&a, "model")) != LH__ARGS_CONTINUE) return rc;
  const char *dir = lh__args_str(&a, "model", NULL);
  lh_config c;
  uint16_t *slab = NULL;
  char *patch = NULL;
  size_t len = 0;
  lh_model_files files = {0};
  rc = LH__EXIT_FAIL;
  if (lh_model_load_bf16(dir, &c, &slab)) {
    rc = lh__cli_fail(a.cmd);
    goto out;
  }
  uint64_t n = lh_config_n_params(&c);
  size_t max = (size_t)(n * MAX_BYTES_PER_VALUE) + LH_PATCH_HEADER +
               (size_t)LH_PATCH_MAX_SECTIONS * LH_PATCH_SECTION;
  double t0 = lh_time_now();
  if (lh_file_read(lh__args_str(&a, "patch", NULL), max, &patch, &len) ||
      lh_patch_apply(slab, n, (const uint8_t *)patch, len, NULL) ||
      lh_model_files_read(dir, &files) ||
      lh_model_dir_save_bf16(&c, slab, lh__args_str(&a, "out", NULL), &files)) {
    rc = lh__cli_fail(a.cmd);
    goto out;
  }
  fprintf(stderr, "patch apply: wrote %s (hash checked), %.2f s\n", lh__args_str(&a, "out", NULL),
          lh_time_now() - t0);
  rc = LH__EXIT_OK;
out:
  free(slab);
  free(patch);
  lh_model_files_free(&files);
  return rc;
}

/* ---------------------------------------------------------------- stats */

static const lh__flag stats_flags[] = {
    {"model", "DIR", false, "a model of the patch's shape: sections are named by its tensors"},
};

static int patch_stats(int argc, char **argv) {
  if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    printf("usage: longhaul patch stats FILE [--model DIR]\n\nPrints what a patch holds: "
           "versions, hashes, values changed, bytes and bits per change, per section.\n");
    return LH__EXIT_OK;
  }
  if (argc < 2 || argv[1][0] == '-')
    return lh__cli_error("patch stats", LH__EXIT_USAGE,
                         "usage: longhaul patch stats FILE [--model DIR]");
  const char *file = argv[1];
  lh__args a = {.cmd = "patch stats",
                .about = "Prints what a patch holds.",
                .flags = stats_flags,
                .n_flags = sizeof stats_flags / sizeof stats_flags[0]};
  int rc = lh__args_parse(&a, argc - 1, argv + 1);
  if (rc != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_model(&a, "model")) != LH__ARGS_CONTINUE) return rc;
  char *patch = NULL;
  size_t len = 0;
  lh_patch_info info = {0};
  lh_tensor_info *names = NULL;
  rc = LH__EXIT_FAIL;
  if (lh_file_read(file, (size_t)1 << 40, &patch, &len) ||
      lh_patch_read_info((const uint8_t *)patch, len, &info)) {
    rc = lh__cli_fail(a.cmd);
    goto out;
  }
  const char *mdir = lh__args_str(&a, "model", NULL);
  if (mdir) {
    lh_config c;
    if (lh_model_check(mdir, &c)) {
      rc = lh__cli_fail(a.cmd);
      goto out;
    }
    int nt = lh_model_tensors(&c, NULL, 0);
    if (nt != info.n_sections || lh_config_n_params(&c) != info.n_elements) {
      rc = lh__cli_error(a.cmd, LH__EXIT_FAIL,
                         "%s has %d tensors of %zu values, the patch %d "
                         "sections of %llu",
                         mdir, nt, lh_config_n_params(&c), info.n_sections,
                         (unsigned long long)info.n_elements);
      goto out;
    }
    names = lh_xcalloc((size_t)nt, sizeof *names);
    lh_model_tensors(&c, names, nt);
  }
  char ph[2 * LH_HASH_BYTES + 1], chh[2 * LH_HASH_BYTES + 1];
  lh_hash_hex(info.parent_hash, ph);
  lh_hash_hex(info.child_hash, chh);
  printf("patch %s: version %lld -> %lld, %llu values, %d sections\n", file,
         (long long)info.from_version, (long long)info.to_version,
         (unsigned long long)info.n_elements, info.n_sections);
  printf("  parent BLAKE2b %s\n  child  BLAKE2b %s\n", ph, chh);
  printf("  changed %llu (%.4f%%), %zu bytes: %.3f bits per change, %.1fx smaller than the bf16 "
         "policy\n",
         (unsigned long long)info.total_changed,
         100.0 * (double)info.total_changed / (double)info.n_elements, len,
         info.total_changed ? 8.0 * (double)len / (double)info.total_changed : 0.0,
         (double)(2 * info.n_elements) / (double)len);
  printf("  %-44s %12s %10s %10s %8s\n", "section", "values", "changed", "bytes", "bits/chg");
  for (int s = 0; s < info.n_sections; s++) {
    char label[64];
    if (names)
      snprintf(label, sizeof label, "%s", names[s].name);
    else
      snprintf(label, sizeof label, "%d", s);
    printf("  %-44s %12llu %10llu %10llu %8.3f\n", label, (unsigned long long)info.count[s],
           (unsigned long long)info.changed[s], (unsigned long long)info.bytes[s],
           info.changed[s] ? 8.0 * (double)info.bytes[s] / (double)info.changed[s] : 0.0);
  }
  rc = lh__cli_flush_stdout(a.cmd);
out:
  free(names);
  free(patch);
  lh_patch_info_free(&info);
  return rc;
}

/* ---------------------------------------------------------------- dispatch */

static const lh__subcommand subcommands[] = {
    {"make", patch_make, "make the patch from one policy to the next"},
    {"apply", patch_apply, "apply a patch to a policy (hash-checked)"},
    {"stats", patch_stats, "print what a patch holds"},
};

int lh__cmd_patch(int argc, char **argv) {
  return lh__subcommands("patch", subcommands, (int)(sizeof subcommands / sizeof subcommands[0]),
                         argc, argv);
}
