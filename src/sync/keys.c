/* longhaul sync: Ed25519 key pairs (libsodium) and their one-line text files (docs/PROTOCOL.md,
 * "Keys"), plus the module's hex helpers. Parsers accept exactly the documented line and say what
 * they found otherwise; secret bytes are wiped from every buffer that held them. */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/sync.h"
#include "sync_impl.h"

_Static_assert(LH_SYNC_PUBLIC_KEY_BYTES == crypto_sign_PUBLICKEYBYTES, "Ed25519 public key");
_Static_assert(sizeof(((lh_sync_secret_key *)0)->sk) == crypto_sign_SECRETKEYBYTES,
               "libsodium's expanded secret key");
_Static_assert(LH_SYNC_SEED_BYTES == crypto_sign_SEEDBYTES, "Ed25519 seed");
_Static_assert(LH_SYNC_SIGNATURE_BYTES == crypto_sign_BYTES, "Ed25519 signature");
_Static_assert(sizeof LH_SYNC_PUBLIC_KEY_PREFIX - 1 + 64 + 1 == LH_SYNC_KEY_TEXT_BYTES,
               "a key line is its prefix and 64 hex digits");
_Static_assert(sizeof LH_SYNC_SECRET_KEY_PREFIX == sizeof LH_SYNC_PUBLIC_KEY_PREFIX,
               "both prefixes have one length");

#define PREFIX_LEN (sizeof LH_SYNC_PUBLIC_KEY_PREFIX - 1)

/* ---------------------------------------------------------------- hex */

void lh__sync_sodium(void) {
  if (sodium_init() < 0) lh__fatal(__FILE__, __LINE__, "sodium_init", "libsodium cannot start");
}

void lh__sync_hex(const uint8_t *bytes, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  out[2 * n] = '\0';
}

static int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

lh_err lh__sync_unhex(const char *text, size_t len, uint8_t *out, size_t n, const char *what,
                      const char *field, size_t base) {
  if (len != 2 * n)
    return lh_errorf(LH_ERR_FORMAT, "%s: %s: expected %zu lowercase hex digits, found %zu bytes",
                     what, field, 2 * n, len);
  for (size_t i = 0; i < len; i++) {
    if (hex_value((unsigned char)text[i]) >= 0) continue;
    char shown[16];
    lh_escape(text + i, 1, shown, sizeof shown);
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: %s: byte %zu is \"%s\", expected a lowercase hex digit (0-9, a-f)", what,
                     field, base + i, shown);
  }
  for (size_t i = 0; i < n; i++)
    out[i] = (uint8_t)(hex_value((unsigned char)text[2 * i]) << 4 |
                       hex_value((unsigned char)text[2 * i + 1]));
  return LH_ERR_OK;
}

lh_err lh_sync_hash_parse(const char *hex, size_t len, const char *what,
                          uint8_t out[LH_HASH_BYTES]) {
  return lh__sync_unhex(hex, len, out, LH_HASH_BYTES, what, "hash", 0);
}

/* ---------------------------------------------------------------- key pairs */

lh_err lh_sync_keygen(lh_sync_secret_key *sk) {
  lh__sync_sodium();
  uint8_t pk[crypto_sign_PUBLICKEYBYTES];
  if (crypto_sign_keypair(pk, sk->sk) != 0)
    return lh_errorf(LH_ERR_IO, "cannot make an Ed25519 key pair");
  return LH_ERR_OK;
}

void lh_sync_key_from_seed(const uint8_t seed[LH_SYNC_SEED_BYTES], lh_sync_secret_key *sk) {
  lh__sync_sodium();
  uint8_t pk[crypto_sign_PUBLICKEYBYTES];
  LH_CHECK(crypto_sign_seed_keypair(pk, sk->sk, seed) == 0, "Ed25519 key from a seed");
}

void lh_sync_key_public(const lh_sync_secret_key *sk, lh_sync_public_key *pk) {
  crypto_sign_ed25519_sk_to_pk(pk->bytes, sk->sk);
}

void lh_sync_secret_key_wipe(lh_sync_secret_key *sk) {
  sodium_memzero(sk, sizeof *sk);
}

void lh_sync_public_key_text(const lh_sync_public_key *pk, char out[LH_SYNC_KEY_TEXT_BYTES]) {
  memcpy(out, LH_SYNC_PUBLIC_KEY_PREFIX, PREFIX_LEN);
  lh__sync_hex(pk->bytes, LH_SYNC_PUBLIC_KEY_BYTES, out + PREFIX_LEN);
}

void lh_sync_secret_key_text(const lh_sync_secret_key *sk, char out[LH_SYNC_KEY_TEXT_BYTES]) {
  uint8_t seed[crypto_sign_SEEDBYTES];
  crypto_sign_ed25519_sk_to_seed(seed, sk->sk);
  memcpy(out, LH_SYNC_SECRET_KEY_PREFIX, PREFIX_LEN);
  lh__sync_hex(seed, sizeof seed, out + PREFIX_LEN);
  sodium_memzero(seed, sizeof seed);
}

/* ---------------------------------------------------------------- parsing */

/* The 32 bytes of a key line "PREFIX<64 hex>" with an optional final "\n". `want` is the kind
 * asked for ("public" or "secret"), `other` the other kind's prefix. */
static lh_err parse_line(const char *text, size_t len, const char *what, const char *want,
                         const char *prefix, const char *other, uint8_t out[32]) {
  const char *wrong_kind =
      !strcmp(want, "public")
          ? "this is a secret key (" LH_SYNC_SECRET_KEY_PREFIX
            "...), expected a public key: give the FILE.pub that `longhaul keygen` wrote"
          : "this is a public key (" LH_SYNC_PUBLIC_KEY_PREFIX
            "...), expected the secret key: give the FILE without .pub";
  if (len == 0)
    return lh_errorf(LH_ERR_FORMAT, "%s: empty, expected one line \"%s<64 hex digits>\"", what,
                     prefix);
  if (text[len - 1] == '\n') len--;
  if (len > 0 && text[len - 1] == '\r')
    return lh_errorf(LH_ERR_FORMAT, "%s: the line ends with \"\\r\\n\", expected \"\\n\" alone",
                     what);
  const char *nl = memchr(text, '\n', len);
  if (nl)
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: more than one line (a newline at byte %zu); a key file is one line", what,
                     (size_t)(nl - text));
  if (len >= PREFIX_LEN && !memcmp(text, other, PREFIX_LEN))
    return lh_errorf(LH_ERR_FORMAT, "%s: %s", what, wrong_kind);
  if (len < PREFIX_LEN || memcmp(text, prefix, PREFIX_LEN)) {
    char shown[96];
    lh_escape(text, len < 40 ? len : 40, shown, sizeof shown);
    return lh_errorf(LH_ERR_FORMAT, "%s: expected a line starting \"%s\", found \"%s%s\"", what,
                     prefix, shown, len > 40 ? "..." : "");
  }
  char field[64];
  snprintf(field, sizeof field, "the %s key", want);
  return lh__sync_unhex(text + PREFIX_LEN, len - PREFIX_LEN, out, 32, what, field, PREFIX_LEN);
}

lh_err lh_sync_public_key_parse(const char *text, size_t len, const char *what,
                                lh_sync_public_key *pk) {
  memset(pk, 0, sizeof *pk);
  lh_err e = parse_line(text, len, what, "public", LH_SYNC_PUBLIC_KEY_PREFIX,
                        LH_SYNC_SECRET_KEY_PREFIX, pk->bytes);
  if (e) return e;
  lh__sync_sodium();
  if (!crypto_core_ed25519_is_valid_point(pk->bytes)) {
    memset(pk, 0, sizeof *pk);
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: not a valid Ed25519 public key (not a point of the main subgroup)", what);
  }
  return LH_ERR_OK;
}

lh_err lh_sync_secret_key_parse(const char *text, size_t len, const char *what,
                                lh_sync_secret_key *sk) {
  uint8_t seed[LH_SYNC_SEED_BYTES];
  memset(sk, 0, sizeof *sk);
  lh_err e = parse_line(text, len, what, "secret", LH_SYNC_SECRET_KEY_PREFIX,
                        LH_SYNC_PUBLIC_KEY_PREFIX, seed);
  if (e == LH_ERR_OK) lh_sync_key_from_seed(seed, sk);
  sodium_memzero(seed, sizeof seed);
  return e;
}

lh_err lh_sync_public_key_load(const char *path, lh_sync_public_key *pk) {
  memset(pk, 0, sizeof *pk);
  char *text = NULL;
  size_t len = 0;
  lh_err e = lh_file_read(path, LH_SYNC_KEY_FILE_MAX, &text, &len);
  if (e == LH_ERR_OK) e = lh_sync_public_key_parse(text, len, path, pk);
  free(text);
  return e;
}

lh_err lh_sync_secret_key_load(const char *path, lh_sync_secret_key *sk) {
  memset(sk, 0, sizeof *sk);
  int fd = -1;
  lh_err e = lh_file_open_read(path, &fd);
  if (e) return e;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    e = lh_errorf(LH_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    close(fd);
    return e;
  }
  close(fd);
  char *text = NULL;
  size_t len = 0;
  if ((e = lh_file_read(path, LH_SYNC_KEY_FILE_MAX, &text, &len))) return e;
  /* a public key given for the secret one is named as such, whatever its mode */
  bool is_public = len >= PREFIX_LEN && !memcmp(text, LH_SYNC_PUBLIC_KEY_PREFIX, PREFIX_LEN);
  if (!is_public && (st.st_mode & 077))
    e = lh_errorf(LH_ERR_INVAL,
                  "%s: mode %04o lets other users read or change this secret key, expected 0600 "
                  "(chmod 600 %s)",
                  path, (unsigned)(st.st_mode & 07777), path);
  else
    e = lh_sync_secret_key_parse(text, len, path, sk);
  sodium_memzero(text, len);
  free(text);
  return e;
}

/* ---------------------------------------------------------------- writing */

/* Whether path may be written: absent, or (with force) a regular file. */
static lh_err may_write(const char *path, bool force) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return LH_ERR_OK;
    return lh_errorf(LH_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
  }
  if (!force)
    return lh_errorf(LH_ERR_INVAL,
                     "%s exists; not replacing a key (remove it first, or pass --force)", path);
  if (!S_ISREG(st.st_mode))
    return lh_errorf(LH_ERR_INVAL, "%s: not a regular file; a key is written only as one", path);
  return LH_ERR_OK;
}

/* Writes text[0..len) to path atomically with the given mode, set before any byte is written. */
static lh_err write_file(const char *path, const char *text, size_t len, mode_t mode) {
  char *tmp = NULL;
  int fd = -1;
  lh_err e = lh_file_tmp_create(path, &tmp, &fd);
  if (e) return e;
  if (fchmod(fd, mode) != 0) {
    e = lh_errorf(LH_ERR_IO, "%s: cannot set mode %04o: %s", tmp, (unsigned)mode, strerror(errno));
    goto out;
  }
  for (size_t done = 0; done < len;) {
    ssize_t w = write(fd, text + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      e = lh_errorf(LH_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
      goto out;
    }
    done += (size_t)w;
  }
  if (fsync(fd) != 0) {
    e = lh_errorf(LH_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    goto out;
  }
  int rc = close(fd);
  fd = -1;
  if (rc != 0) {
    e = lh_errorf(LH_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    goto out;
  }
  e = lh_file_commit(tmp, path);
out:
  if (fd >= 0) close(fd);
  if (e) unlink(tmp);
  free(tmp);
  return e;
}

lh_err lh_sync_keys_write(const char *path, const lh_sync_secret_key *sk, bool force) {
  size_t plen = strlen(path);
  char *pub = malloc(plen + 5);
  if (!pub) return lh_errorf(LH_ERR_NOMEM, "cannot allocate a path");
  memcpy(pub, path, plen);
  memcpy(pub + plen, ".pub", 5);
  char line[LH_SYNC_KEY_TEXT_BYTES + 1];
  lh_err e = may_write(path, force);
  if (e == LH_ERR_OK) e = may_write(pub, force);
  if (e) goto out;
  lh_sync_secret_key_text(sk, line);
  strcat(line, "\n");
  e = write_file(path, line, strlen(line), 0600);
  sodium_memzero(line, sizeof line);
  if (e) goto out;
  lh_sync_public_key pk;
  lh_sync_key_public(sk, &pk);
  lh_sync_public_key_text(&pk, line);
  strcat(line, "\n");
  e = write_file(pub, line, strlen(line), 0644);
out:
  free(pub);
  return e;
}
