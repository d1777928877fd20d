/* `longhaul manifest SUBCOMMAND`: signed policy manifests (docs/PROTOCOL.md, "Manifests").
 * `manifest sign` turns an unsigned manifest (JSON in any layout) into the canonical signed
 * bytes; `manifest verify` checks one against a pinned public key and prints what it lists, or
 * refuses it with one line saying why (exit code 1). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longhaul/sync.h"

#define SIGN_CMD   "manifest sign"
#define VERIFY_CMD "manifest verify"

static const lh__flag sign_flags[] = {
    {"key", "FILE", true, "the trainer's secret key (from longhaul keygen; mode 0600)"},
    {"in", "FILE", true, "unsigned manifest: JSON with every field but key and signature"},
    {"out", "FILE", true, "signed manifest to write (canonical JSON, no newline)"},
};

static const lh__flag verify_flags[] = {
    {"key", "FILE", true, "the pinned trainer public key (FILE.pub from longhaul keygen)"},
    {"manifest", "FILE", true, "signed manifest to check"},
};

static int manifest_sign(int argc, char **argv) {
  lh__args a = {.cmd = SIGN_CMD,
                .about = "Signs a manifest with the trainer's key. The input holds the fields of "
                         "docs/PROTOCOL.md\n(\"Manifests\") but key and signature, in any order "
                         "and layout; the output is the canonical\nsigned form that workers "
                         "verify.",
                .flags = sign_flags,
                .n_flags = (int)(sizeof sign_flags / sizeof sign_flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  const char *in = lh__args_str(&a, "in", NULL), *out = lh__args_str(&a, "out", NULL);
  lh_sync_secret_key sk;
  lh_sync_manifest m;
  char *text = NULL, *signed_text = NULL;
  size_t len = 0, slen = 0;
  lh_err e = lh_sync_secret_key_load(lh__args_str(&a, "key", NULL), &sk);
  if (e == LH_ERR_OK) e = lh_file_read(in, LH_SYNC_MANIFEST_MAX_BYTES, &text, &len);
  if (e == LH_ERR_OK) e = lh_sync_manifest_from_json(text, len, in, &m);
  if (e == LH_ERR_OK) e = lh_sync_manifest_sign(&m, &sk, &signed_text, &slen);
  if (e == LH_ERR_OK) e = lh_file_write_atomic(out, signed_text, slen);
  lh_sync_secret_key_wipe(&sk);
  free(text);
  free(signed_text);
  if (e) return lh__cli_fail(SIGN_CMD);
  printf("signed version %" PRId64 " (%d blobs) into %s\n", m.version, m.n_blobs, out);
  return lh__cli_flush_stdout(SIGN_CMD);
}

static void print_hash(const char *label, const uint8_t h[LH_HASH_BYTES]) {
  char hex[2 * LH_HASH_BYTES + 1];
  lh_hash_hex(h, hex);
  printf("%-10s %s\n", label, hex);
}

static int manifest_verify(int argc, char **argv) {
  lh__args a = {.cmd = VERIFY_CMD,
                .about = "Verifies a signed manifest against the pinned trainer public key and "
                         "prints its fields;\nrefuses (exit code 1, one line on stderr) one "
                         "signed by another key, altered after signing,\nnot canonical, too large "
                         "or of an unknown format.",
                .flags = verify_flags,
                .n_flags = (int)(sizeof verify_flags / sizeof verify_flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  lh_sync_public_key pk;
  lh_sync_manifest m;
  lh_err e = lh_sync_public_key_load(lh__args_str(&a, "key", NULL), &pk);
  if (e == LH_ERR_OK) e = lh_sync_manifest_load(lh__args_str(&a, "manifest", NULL), &pk, &m);
  if (e) return lh__cli_fail(VERIFY_CMD);
  printf("%-10s %" PRId64 "\n", "version", m.version);
  if (m.parent == LH_SYNC_NONE)
    printf("%-10s none\n", "parent");
  else
    printf("%-10s %" PRId64 "\n", "parent", m.parent);
  printf("%-10s %" PRIu64 " bf16 values\n", "elements", m.elements);
  print_hash("slab", m.slab);
  print_hash("config", m.config);
  if (m.has_tokenizer)
    print_hash("tokenizer", m.tokenizer);
  else
    printf("%-10s none\n", "tokenizer");
  for (int i = 0; i < m.n_blobs; i++) {
    const lh_sync_blob_ref *b = &m.blobs[i];
    char hex[2 * LH_HASH_BYTES + 1];
    lh_hash_hex(b->hash, hex);
    if (b->kind == LH_SYNC_SNAPSHOT)
      printf("%-10s snapshot %s %" PRIu64 " bytes\n", "blob", hex, b->size);
    else
      printf("%-10s patch from %" PRId64 " %s %" PRIu64 " bytes\n", "blob", b->from, hex, b->size);
  }
  printf("signature  verified with the pinned key\n");
  return lh__cli_flush_stdout(VERIFY_CMD);
}

static const lh__subcommand subcommands[] = {
    {"sign", manifest_sign, "sign an unsigned manifest with the trainer's secret key"},
    {"verify", manifest_verify, "check a signed manifest against the pinned public key"},
};

int lh__cmd_manifest(int argc, char **argv) {
  return lh__subcommands("manifest", subcommands, (int)(sizeof subcommands / sizeof subcommands[0]),
                         argc, argv);
}
