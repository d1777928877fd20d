/* `longhaul keygen --out FILE`: makes the trainer's Ed25519 key pair (docs/PROTOCOL.md, "Keys"):
 * FILE holds the secret key (mode 0600), FILE.pub the public key that workers pin. An existing
 * key is never replaced without --force. */
#include <stdio.h>

#include "cli.h"
#include "longhaul/sync.h"

#define CMD "keygen"

static const lh__flag flags[] = {
    {"out", "FILE", true, "secret key file to write (mode 0600); the public key goes to FILE.pub"},
    {"force", NULL, false, "replace FILE and FILE.pub if they exist (the old key is lost)"},
};

int lh__cmd_keygen(int argc, char **argv) {
  lh__args a = {.cmd = CMD,
                .about = "Makes an Ed25519 key pair for signing policy manifests: FILE gets the "
                         "secret key (one line,\n\"" LH_SYNC_SECRET_KEY_PREFIX
                         "<64 hex digits>\", mode 0600), FILE.pub the public key\nthat workers "
                         "pin (\"" LH_SYNC_PUBLIC_KEY_PREFIX "<64 hex digits>\"). Prints the "
                         "public key.",
                .flags = flags,
                .n_flags = (int)(sizeof flags / sizeof flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  const char *out = lh__args_str(&a, "out", NULL);
  lh_sync_secret_key sk;
  lh_err e = lh_sync_keygen(&sk);
  if (e == LH_ERR_OK) e = lh_sync_keys_write(out, &sk, lh__args_has(&a, "force"));
  if (e) {
    lh_sync_secret_key_wipe(&sk);
    return lh__cli_fail(CMD);
  }
  lh_sync_public_key pk;
  lh_sync_key_public(&sk, &pk);
  lh_sync_secret_key_wipe(&sk);
  char line[LH_SYNC_KEY_TEXT_BYTES];
  lh_sync_public_key_text(&pk, line);
  printf("wrote %s (the secret key, mode 0600: keep it private) and %s.pub (the public key)\n%s\n",
         out, out, line);
  return lh__cli_flush_stdout(CMD);
}
