/* `longhaul snapshot SUBCOMMAND`: keyframe blobs (docs/PROTOCOL.md, "Snapshots"). `snapshot make`
 * writes a model directory's bf16 policy as a snapshot blob; `snapshot show` decodes one, checks
 * its slab hash and prints what a manifest would record of it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longhaul/infer.h"
#include "longhaul/sync.h"

#define MAKE_CMD "snapshot make"
#define SHOW_CMD "snapshot show"
/* 2^36 values (128 GiB of bf16): more than any model this reads, and a bound on a blob's claim */
#define MAX_ELEMENTS ((uint64_t)1 << 36)

static const lh__flag make_flags[] = {
    {"model", "DIR", true, "model directory (config.json + safetensors), a run or RUN/latest"},
    {"out", "FILE", true, "snapshot blob to write"},
    {"level", "N", false, "zstd level 1..19 (default 3)"},
};

static const lh__flag show_flags[] = {
    {"snapshot", "FILE", true, "snapshot blob to decode and check"},
};

static void print_summary(size_t n, const uint8_t slab[LH_HASH_BYTES], const void *blob,
                          size_t len) {
  char hex[2 * LH_HASH_BYTES + 1];
  uint8_t h[LH_HASH_BYTES];
  lh_hash_hex(slab, hex);
  printf("elements %zu\nslab     %s\n", n, hex);
  lh_hash256(blob, len, h);
  lh_hash_hex(h, hex);
  printf("blob     %s\nsize     %zu bytes (%.3f of the %zu-byte bf16 slab)\n", hex, len,
         (double)len / (2.0 * (double)n), 2 * n);
}

static int snapshot_make(int argc, char **argv) {
  lh__args a = {.cmd = MAKE_CMD,
                .about = "Writes the bf16 policy of a model directory as a snapshot blob: a "
                         "64-byte header (element\ncount, slab hash) and one zstd frame of the "
                         "slab's byte planes. Prints the slab hash (the\npolicy version's "
                         "identity) and the blob's hash and size (what a manifest lists).",
                .flags = make_flags,
                .n_flags = (int)(sizeof make_flags / sizeof make_flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_model(&a, "model")) != LH__ARGS_CONTINUE) return rc;
  long level = 0;
  rc = lh__args_int(&a, "level", 1, 19, LH_SYNC_SNAPSHOT_LEVEL, &level);
  if (rc != LH__ARGS_CONTINUE) return rc;
  const char *out = lh__args_str(&a, "out", NULL);
  lh_err e = lh_file_out_check(out);
  if (e) return lh__cli_fail(MAKE_CMD);
  lh_infer *m = NULL;
  uint8_t *blob = NULL;
  size_t len = 0, n = 0;
  if ((e = lh_infer_load(lh__args_str(&a, "model", NULL), &m))) return lh__cli_fail(MAKE_CMD);
  const uint16_t *slab = lh_infer_bf16(m, &n);
  e = lh_sync_snapshot_encode(slab, n, (int)level, &blob, &len);
  if (e == LH_ERR_OK) e = lh_file_write_atomic(out, blob, len);
  if (e == LH_ERR_OK) {
    uint8_t h[LH_HASH_BYTES];
    lh_sync_slab_hash(slab, n, h);
    print_summary(n, h, blob, len);
  }
  free(blob);
  lh_infer_free(m);
  if (e) return lh__cli_fail(MAKE_CMD);
  return lh__cli_flush_stdout(MAKE_CMD);
}

static int snapshot_show(int argc, char **argv) {
  lh__args a = {.cmd = SHOW_CMD,
                .about = "Decodes a snapshot blob, checks that the slab hashes to the header's "
                         "hash, and prints the\nelement count, the slab hash and the blob's hash "
                         "and size; refuses a damaged blob (exit code 1).",
                .flags = show_flags,
                .n_flags = (int)(sizeof show_flags / sizeof show_flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  const char *path = lh__args_str(&a, "snapshot", NULL);
  char *blob = NULL;
  size_t len = 0, n = 0;
  uint16_t *slab = NULL;
  lh_err e = lh_file_read(path, (size_t)(2 * MAX_ELEMENTS), &blob, &len);
  if (e == LH_ERR_OK)
    e = lh_sync_snapshot_decode((const uint8_t *)blob, len, (size_t)MAX_ELEMENTS, path, &slab, &n);
  if (e == LH_ERR_OK) {
    uint8_t h[LH_HASH_BYTES];
    lh_sync_slab_hash(slab, n, h);
    print_summary(n, h, blob, len);
  }
  free(slab);
  free(blob);
  if (e) return lh__cli_fail(SHOW_CMD);
  return lh__cli_flush_stdout(SHOW_CMD);
}

static const lh__subcommand subcommands[] = {
    {"make", snapshot_make, "write a model directory's bf16 policy as a snapshot blob"},
    {"show", snapshot_show, "decode and check a snapshot blob, print its hashes"},
};

int lh__cmd_snapshot(int argc, char **argv) {
  return lh__subcommands("snapshot", subcommands, (int)(sizeof subcommands / sizeof subcommands[0]),
                         argc, argv);
}
