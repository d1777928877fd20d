/* The store module's ledger: a reopened ledger keeps everything, WAL on, foreign files and other
 * schema versions refused by name, workers registered and updated, the group life cycle (lease,
 * accept, reject, expire then a late accept, train, drop) with every refused move leaving the
 * ledger as it was, rewinds that restore exactly the groups trained after a checkpoint and
 * forget later versions, published versions, pruned bodies, the audit catching rows corrupted
 * behind the ledger's back (raw SQL on a second connection), two threads accepting and training
 * at once, and an accept that survives a kill -9 right after it returned. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>

#include "longhaul/ledger.h"

static void expect_err(lh_err e, lh_err code, const char *needle) {
  if (e != code || !strstr(lh_last_error(), needle))
    fail_msg("expected %s with \"%s\", got %s: %s", lh_err_name(code), needle, lh_err_name(e),
             lh_last_error());
}

#define OK(call)                                                                                   \
  do {                                                                                             \
    lh_err e_ = (call);                                                                            \
    if (e_) fail_msg("%s: %s: %s", #call, lh_err_name(e_), lh_last_error());                       \
  } while (0)

static char g_dir[256];

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "%s/lh_test_ledger.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  DIR *d = opendir(g_dir);
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char *p = lh_path_join(g_dir, e->d_name);
    unlink(p);
    free(p);
  }
  closedir(d);
  rmdir(g_dir);
  return 0;
}

/* g_dir/NAME, in a static buffer (one at a time). */
static const char *path_of(const char *name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", g_dir, name);
  return buf;
}

static void key_of(uint8_t tag, uint8_t key[LH_LEDGER_KEY_BYTES]) {
  for (int i = 0; i < LH_LEDGER_KEY_BYTES; i++)
    key[i] = (uint8_t)(tag * 17 + i);
}

/* Raw SQL on a second connection, behind the ledger's back. */
static void raw_exec(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  char *msg = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) fail_msg("%s: %s", sql, msg);
  sqlite3_close(db);
}

static int64_t raw_int(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) fail_msg("%s", sqlite3_errmsg(db));
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  int64_t v = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(db);
  return v;
}

static void raw_text(const char *path, const char *sql, char *out, size_t cap) {
  sqlite3 *db = NULL;
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) fail_msg("%s", sqlite3_errmsg(db));
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  snprintf(out, cap, "%s", (const char *)sqlite3_column_text(s, 0));
  sqlite3_finalize(s);
  sqlite3_close(db);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Leases n groups to worker `tag` (registered here if needed), task i + 100, spec "spec-i". */
static int64_t lease_n(lh_ledger *l, uint8_t tag, int n, int64_t now, int64_t expires,
                       int64_t *ids) {
  uint8_t key[LH_LEDGER_KEY_BYTES];
  key_of(tag, key);
  OK(lh_ledger_worker_register(l, key, "w", "{}", now, NULL));
  lh_ledger_group_spec specs[64];
  char text[64][16];
  assert_true(n <= 64);
  for (int i = 0; i < n; i++) {
    snprintf(text[i], sizeof text[i], "spec-%d", i);
    specs[i] = (lh_ledger_group_spec){(uint64_t)(100 + i), text[i], strlen(text[i])};
  }
  int64_t lease = 0;
  OK(lh_ledger_lease(l, key, now, expires, n, specs, &lease, ids));
  return lease;
}

static void accept_body(lh_ledger *l, int64_t group, int64_t version) {
  char body[64];
  snprintf(body, sizeof body, "body of group %lld", (long long)group);
  OK(lh_ledger_group_accept(l, group, version, body, strlen(body), "{\"ms\":1}", 5000 + group));
}

static lh_group_state state_of(lh_ledger *l, int64_t group) {
  lh_ledger_group g;
  OK(lh_ledger_group_get(l, group, &g));
  lh_group_state s = g.state;
  lh_ledger_group_clear(&g);
  return s;
}

static void put_version(lh_ledger *l, int64_t v) {
  uint8_t slab[32];
  memset(slab, (int)v + 1, sizeof slab);
  char manifest[64];
  snprintf(manifest, sizeof manifest, "{\"version\":%lld}", (long long)v);
  lh_ledger_blob b = {.kind = 0, .from_version = -1, .size = 1000 + (uint64_t)v};
  memset(b.hash, (int)v + 7, sizeof b.hash);
  OK(lh_ledger_version_put(l, v, v - 1, slab, manifest, strlen(manifest), 9000 + v, 1, &b));
}

/* ---------------------------------------------------------------- open */

static void test_open_reopen(void **state) {
  (void)state;
  const char *p = path_of("ledger.db");
  char path[512];
  snprintf(path, sizeof path, "%s", p);
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path, &l));
  assert_string_equal(lh_ledger_path(l), path);
  int64_t ids[3];
  int64_t lease = lease_n(l, 1, 3, 1000, 2000, ids);
  assert_int_equal(lease, 1);
  assert_int_equal(ids[0], 1);
  assert_int_equal(ids[2], 3);
  accept_body(l, 2, 0);
  put_version(l, 0);
  /* WAL while open: the mode and the -wal file, seen from another connection */
  char mode[16];
  raw_text(path, "PRAGMA journal_mode", mode, sizeof mode);
  assert_string_equal(mode, "wal");
  char wal[600];
  snprintf(wal, sizeof wal, "%s-wal", path);
  struct stat st;
  assert_int_equal(stat(wal, &st), 0);
  assert_int_equal(raw_int(path, "PRAGMA user_version"), LH_LEDGER_SCHEMA_VERSION);
  assert_int_equal(raw_int(path, "PRAGMA application_id"), LH_LEDGER_APPLICATION_ID);
  lh_ledger_close(l);
  lh_ledger_close(NULL);

  OK(lh_ledger_open(path, &l));
  uint8_t key[LH_LEDGER_KEY_BYTES];
  key_of(1, key);
  lh_ledger_worker w;
  OK(lh_ledger_worker_get(l, key, &w));
  assert_string_equal(w.name, "w");
  assert_int_equal(w.groups[LH_GROUP_LEASED], 2);
  assert_int_equal(w.groups[LH_GROUP_ACCEPTED], 1);
  lh_ledger_group g;
  OK(lh_ledger_group_get(l, 2, &g));
  assert_int_equal(g.state, LH_GROUP_ACCEPTED);
  assert_int_equal(g.lease, 1);
  assert_int_equal(g.task_index, 101);
  assert_int_equal(g.spec_len, 6);
  assert_memory_equal(g.spec, "spec-1", 6);
  assert_string_equal(g.meta, "{\"ms\":1}");
  assert_int_equal(g.received_ms, 5002);
  assert_int_equal(g.leased_ms, 1000);
  assert_int_equal(g.expires_ms, 2000);
  assert_memory_equal(g.worker, key, sizeof key);
  assert_int_equal(g.body_len, strlen("body of group 2"));
  lh_ledger_group_clear(&g);
  void *body = NULL;
  size_t len = 0;
  OK(lh_ledger_group_body(l, 2, &body, &len));
  assert_int_equal(len, strlen("body of group 2"));
  assert_memory_equal(body, "body of group 2", len);
  free(body);
  int64_t latest = -5;
  OK(lh_ledger_latest_version(l, &latest));
  assert_int_equal(latest, 0);
  char *m = NULL;
  OK(lh_ledger_version_get(l, 0, &m, &len));
  assert_string_equal(m, "{\"version\":0}");
  free(m);
  /* ids go on after a reopen, never reused */
  int64_t more[1];
  assert_int_equal(lease_n(l, 1, 1, 3000, 4000, more), 2);
  assert_int_equal(more[0], 4);
  lh_ledger_close(l);
}

static void test_open_refusals(void **state) {
  (void)state;
  char path[512];
  lh_ledger *l = NULL;
  /* a newer schema version */
  snprintf(path, sizeof path, "%s", path_of("newer.db"));
  OK(lh_ledger_open(path, &l));
  lh_ledger_close(l);
  raw_exec(path, "PRAGMA user_version = 99");
  expect_err(lh_ledger_open(path, &l), LH_ERR_UNSUPPORTED, "schema version 99");
  assert_null(l);
  assert_non_null(strstr(lh_last_error(), path));
  assert_non_null(strstr(lh_last_error(), "newer longhaul"));
  raw_exec(path, "PRAGMA user_version = 0");
  expect_err(lh_ledger_open(path, &l), LH_ERR_UNSUPPORTED, "schema version 0");

  /* not a database at all */
  snprintf(path, sizeof path, "%s", path_of("text.db"));
  char junk[2000];
  memset(junk, 'x', sizeof junk - 1);
  junk[sizeof junk - 1] = '\0';
  write_file(path, junk);
  expect_err(lh_ledger_open(path, &l), LH_ERR_FORMAT, "SQLite says \"file is not a database\"");
  assert_non_null(strstr(lh_last_error(), path));

  /* another program's database is refused and left as it was (not switched to WAL) */
  snprintf(path, sizeof path, "%s", path_of("other.db"));
  raw_exec(path, "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1)");
  expect_err(lh_ledger_open(path, &l), LH_ERR_FORMAT, "another program");
  assert_non_null(strstr(lh_last_error(), path));
  char mode[16];
  raw_text(path, "PRAGMA journal_mode", mode, sizeof mode);
  assert_string_equal(mode, "delete");
  raw_exec(path, "PRAGMA application_id = 7");
  expect_err(lh_ledger_open(path, &l), LH_ERR_FORMAT, "application_id 0x00000007");

  /* a directory that does not exist */
  snprintf(path, sizeof path, "%s/no/such/dir/ledger.db", g_dir);
  expect_err(lh_ledger_open(path, &l), LH_ERR_IO, path);

  /* an empty file is an empty database: it becomes a ledger */
  snprintf(path, sizeof path, "%s", path_of("empty.db"));
  write_file(path, "");
  OK(lh_ledger_open(path, &l));
  lh_ledger_close(l);
}

/* ---------------------------------------------------------------- workers */

static void test_workers(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("workers.db"), &l));
  uint8_t a[32], b[32], c[32];
  key_of(1, a);
  key_of(2, b);
  key_of(3, c);
  bool is_new = false;
  OK(lh_ledger_worker_register(l, a, "alpha", "{\"cpu\":4}", 100, &is_new));
  assert_true(is_new);
  OK(lh_ledger_worker_register(l, b, NULL, NULL, 150, &is_new));
  assert_true(is_new);
  OK(lh_ledger_worker_register(l, a, "alpha-2", "{\"cpu\":8}", 200, &is_new));
  assert_false(is_new);
  lh_ledger_worker w;
  OK(lh_ledger_worker_get(l, a, &w));
  assert_string_equal(w.name, "alpha-2");
  assert_int_equal(w.registered_ms, 100);
  assert_int_equal(w.last_seen_ms, 200);
  assert_memory_equal(w.key, a, 32);
  char *hw = NULL;
  OK(lh_ledger_worker_hardware(l, a, &hw));
  assert_string_equal(hw, "{\"cpu\":8}");
  free(hw);
  OK(lh_ledger_worker_hardware(l, b, &hw));
  assert_string_equal(hw, "");
  free(hw);
  OK(lh_ledger_worker_seen(l, a, 300));
  OK(lh_ledger_worker_seen(l, a, 250)); /* never backwards */
  OK(lh_ledger_worker_get(l, a, &w));
  assert_int_equal(w.last_seen_ms, 300);
  expect_err(lh_ledger_worker_get(l, c, &w), LH_ERR_NOTFOUND, "no worker with key 3334");
  expect_err(lh_ledger_worker_seen(l, c, 1), LH_ERR_NOTFOUND, "no worker");
  expect_err(lh_ledger_worker_hardware(l, c, &hw), LH_ERR_NOTFOUND, "no worker");
  assert_null(hw);

  /* limits: nothing written past them */
  char name[LH_LEDGER_NAME_MAX + 2];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  expect_err(lh_ledger_worker_register(l, c, name, "{}", 1, NULL), LH_ERR_LIMIT, "worker name");
  name[LH_LEDGER_NAME_MAX] = '\0'; /* exactly the limit is fine */
  char *big = malloc(LH_LEDGER_HARDWARE_MAX + 2);
  memset(big, ' ', LH_LEDGER_HARDWARE_MAX + 1);
  big[LH_LEDGER_HARDWARE_MAX + 1] = '\0';
  expect_err(lh_ledger_worker_register(l, c, name, big, 1, NULL), LH_ERR_LIMIT, "hardware");
  free(big);
  expect_err(lh_ledger_worker_get(l, c, &w), LH_ERR_NOTFOUND, "no worker");
  OK(lh_ledger_worker_register(l, c, name, "{}", 400, NULL));
  OK(lh_ledger_worker_get(l, c, &w));
  assert_int_equal(strlen(w.name), LH_LEDGER_NAME_MAX);

  /* all of them, in registration order, with their groups by state */
  int64_t ids[4];
  lease_n(l, 2, 4, 500, 600, ids);
  accept_body(l, ids[0], 0);
  OK(lh_ledger_group_reject(l, ids[1], 0, "bad tokens", 700));
  lh_ledger_worker *all = NULL;
  int n = 0;
  OK(lh_ledger_workers(l, &all, &n));
  assert_int_equal(n, 3);
  assert_memory_equal(all[0].key, a, 32);
  assert_memory_equal(all[1].key, b, 32);
  assert_memory_equal(all[2].key, c, 32);
  assert_string_equal(all[1].name, "w"); /* lease_n registered it again under that name */
  assert_int_equal(all[1].groups[LH_GROUP_LEASED], 2);
  assert_int_equal(all[1].groups[LH_GROUP_ACCEPTED], 1);
  assert_int_equal(all[1].groups[LH_GROUP_REJECTED], 1);
  assert_int_equal(all[0].groups[LH_GROUP_LEASED], 0);
  free(all);
  lh_ledger_close(l);
}

/* ---------------------------------------------------------------- groups */

static void test_lease_accept_train(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("life.db"), &l));
  int64_t ids[4];
  lease_n(l, 1, 4, 1000, 2000, ids);
  for (int i = 0; i < 4; i++)
    assert_int_equal(ids[i], i + 1);
  lh_ledger_group g;
  OK(lh_ledger_group_get(l, 1, &g));
  assert_int_equal(g.state, LH_GROUP_LEASED);
  assert_int_equal(g.version_used, -1);
  assert_int_equal(g.trained_at, -1);
  assert_int_equal(g.received_ms, -1);
  assert_string_equal(g.reason, "");
  assert_null(g.meta);
  assert_int_equal(g.body_len, 0);
  lh_ledger_group_clear(&g);
  expect_err(lh_ledger_group_get(l, 99, &g), LH_ERR_NOTFOUND, "no group 99");
  void *body = NULL;
  size_t len = 0;
  expect_err(lh_ledger_group_body(l, 1, &body, &len), LH_ERR_NOTFOUND, "leased and has no body");

  accept_body(l, 1, 0);
  accept_body(l, 2, 0);
  OK(lh_ledger_group_accept(l, 3, 1, "x", 1, NULL, 1500)); /* no meta */
  OK(lh_ledger_group_get(l, 3, &g));
  assert_null(g.meta);
  assert_int_equal(g.version_used, 1);
  lh_ledger_group_clear(&g);
  expect_err(lh_ledger_group_accept(l, 1, 0, "y", 1, NULL, 1600), LH_ERR_INVAL,
             "the group is accepted, expected leased or expired");
  expect_err(lh_ledger_group_accept(l, 99, 0, "y", 1, NULL, 1600), LH_ERR_NOTFOUND, "no group 99");
  expect_err(lh_ledger_group_accept(l, 4, 0, "y", 0, NULL, 1600), LH_ERR_INVAL, "empty body");
  expect_err(lh_ledger_group_accept(l, 4, -1, "y", 1, NULL, 1600), LH_ERR_INVAL, "version_used");
  expect_err(lh_ledger_group_accept(l, 4, 0, "y", LH_LEDGER_BODY_MAX + 1, NULL, 1600), LH_ERR_LIMIT,
             "more than");
  assert_int_equal(state_of(l, 4), LH_GROUP_LEASED);
  int64_t *acc = NULL;
  int n = 0;
  OK(lh_ledger_accepted(l, &acc, &n));
  assert_int_equal(n, 3);
  assert_int_equal(acc[0], 1);
  assert_int_equal(acc[2], 3);
  free(acc);

  /* refused training moves change nothing: a leased group, a repeated id, an unknown one */
  int64_t bad1[] = {1, 4};
  expect_err(lh_ledger_train(l, 1, bad1, 2, NULL, 0), LH_ERR_INVAL,
             "group 4 is leased, expected accepted");
  int64_t t1[] = {1}, d1[] = {1};
  expect_err(lh_ledger_train(l, 1, t1, 1, d1, 1), LH_ERR_INVAL, "group 1 is listed twice");
  int64_t bad2[] = {2, 77};
  expect_err(lh_ledger_train(l, 1, bad2, 2, NULL, 0), LH_ERR_NOTFOUND, "no group 77");
  expect_err(lh_ledger_train(l, 1, NULL, 0, NULL, 0), LH_ERR_INVAL, "expected some");
  assert_int_equal(state_of(l, 1), LH_GROUP_ACCEPTED);
  assert_int_equal(state_of(l, 2), LH_GROUP_ACCEPTED);
  lh_ledger_log_entry *log = NULL;
  OK(lh_ledger_log(l, &log, &n));
  assert_int_equal(n, 0);
  assert_null(log);

  int64_t tr[] = {1, 3}, dr[] = {2};
  OK(lh_ledger_train(l, 1, tr, 2, dr, 1));
  OK(lh_ledger_group_get(l, 1, &g));
  assert_int_equal(g.state, LH_GROUP_TRAINED);
  assert_int_equal(g.trained_at, 1);
  assert_string_equal(g.reason, "");
  lh_ledger_group_clear(&g);
  OK(lh_ledger_group_get(l, 2, &g));
  assert_int_equal(g.state, LH_GROUP_DROPPED);
  assert_int_equal(g.trained_at, 1);
  assert_string_equal(g.reason, "stale");
  lh_ledger_group_clear(&g);
  expect_err(lh_ledger_group_accept(l, 1, 0, "y", 1, NULL, 1700), LH_ERR_INVAL,
             "the group is trained (at version 1)");
  expect_err(lh_ledger_train(l, 2, tr, 1, NULL, 0), LH_ERR_INVAL,
             "group 1 is trained already (at version 1)");
  OK(lh_ledger_log(l, &log, &n));
  assert_int_equal(n, 3);
  assert_int_equal(log[0].seq, 1);
  assert_int_equal(log[0].group, 1);
  assert_int_equal(log[0].what, LH_GROUP_TRAINED);
  assert_int_equal(log[1].group, 3);
  assert_int_equal(log[2].group, 2);
  assert_int_equal(log[2].what, LH_GROUP_DROPPED);
  for (int i = 0; i < n; i++) {
    assert_int_equal(log[i].version, 1);
    assert_int_equal(log[i].undone_by, 0);
  }
  free(log);
  OK(lh_ledger_accepted(l, &acc, &n));
  assert_int_equal(n, 0);
  assert_null(acc);
  put_version(l, 0);
  put_version(l, 1);
  lh_ledger_audit_result r;
  OK(lh_ledger_audit(l, &r));
  assert_int_equal(r.groups[LH_GROUP_TRAINED], 2);
  assert_int_equal(r.groups[LH_GROUP_DROPPED], 1);
  assert_int_equal(r.groups[LH_GROUP_LEASED], 1);
  assert_int_equal(r.log_live, 3);
  assert_int_equal(r.bad_group, 0);
  assert_string_equal(r.problem, "");
  lh_ledger_close(l);
}

static void test_lease_refusals(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("lease.db"), &l));
  uint8_t key[32], stranger[32];
  key_of(1, key);
  key_of(9, stranger);
  OK(lh_ledger_worker_register(l, key, "w", "{}", 1, NULL));
  lh_ledger_group_spec spec = {5, "s", 1};
  int64_t lease = 0, ids[2];
  expect_err(lh_ledger_lease(l, stranger, 1, 2, 1, &spec, &lease, ids), LH_ERR_NOTFOUND,
             "no worker with key 999a");
  expect_err(lh_ledger_lease(l, key, 1, 2, 0, &spec, &lease, ids), LH_ERR_INVAL, "0 groups");
  expect_err(lh_ledger_lease(l, key, 1, 2, LH_LEDGER_LEASE_MAX + 1, &spec, &lease, ids),
             LH_ERR_LIMIT, "groups");
  expect_err(lh_ledger_lease(l, key, 5, 2, 1, &spec, &lease, ids), LH_ERR_INVAL,
             "before it starts");
  lh_ledger_group_spec big = {5, "s", LH_LEDGER_SPEC_MAX + 1};
  expect_err(lh_ledger_lease(l, key, 1, 2, 1, &big, &lease, ids), LH_ERR_LIMIT, "spec 0");
  lh_ledger_stats_result st;
  OK(lh_ledger_stats(l, &st));
  assert_int_equal(st.leases, 0);
  /* an empty spec is kept as empty */
  lh_ledger_group_spec empty = {(uint64_t)-1, NULL, 0};
  OK(lh_ledger_lease(l, key, 1, 2, 1, &empty, &lease, ids));
  lh_ledger_group g;
  OK(lh_ledger_group_get(l, ids[0], &g));
  assert_int_equal(g.spec_len, 0);
  assert_null(g.spec);
  assert_true(g.task_index == UINT64_MAX); /* all 64 bits survive */
  lh_ledger_group_clear(&g);
  lh_ledger_close(l);
}

static void test_expire_late_accept(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("expire.db"), &l));
  int64_t a[2], b[1];
  lease_n(l, 1, 2, 1000, 2000, a);
  lease_n(l, 2, 1, 1000, 5000, b);
  int64_t *gone = NULL;
  int n = -1;
  OK(lh_ledger_expire(l, 2000, &gone, &n)); /* expires_ms < now: not yet at 2000 */
  assert_int_equal(n, 0);
  assert_null(gone);
  accept_body(l, a[0], 0);
  OK(lh_ledger_expire(l, 2001, &gone, &n));
  assert_int_equal(n, 1);
  assert_int_equal(gone[0], a[1]);
  free(gone);
  assert_int_equal(state_of(l, a[1]), LH_GROUP_EXPIRED);
  assert_int_equal(state_of(l, b[0]), LH_GROUP_LEASED);
  OK(lh_ledger_expire(l, 2001, &gone, &n)); /* nothing twice */
  assert_int_equal(n, 0);
  /* a late submission of an expired group is still accepted */
  accept_body(l, a[1], 0);
  assert_int_equal(state_of(l, a[1]), LH_GROUP_ACCEPTED);
  OK(lh_ledger_expire(l, 9999, &gone, &n));
  assert_int_equal(n, 1);
  assert_int_equal(gone[0], b[0]);
  free(gone);
  lh_ledger_stats_result st;
  OK(lh_ledger_stats(l, &st));
  assert_int_equal(st.groups[LH_GROUP_ACCEPTED], 2);
  assert_int_equal(st.groups[LH_GROUP_EXPIRED], 1);
  assert_int_equal(st.groups[LH_GROUP_LEASED], 0);
  assert_int_equal(st.leases, 2);
  assert_int_equal(st.workers, 2);
  lh_ledger_close(l);
}

static void test_reject(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("reject.db"), &l));
  int64_t ids[6];
  lease_n(l, 1, 6, 1000, 2000, ids);
  OK(lh_ledger_group_reject(l, ids[0], 3, "reward mismatch", 1100));
  lh_ledger_group g;
  OK(lh_ledger_group_get(l, ids[0], &g));
  assert_int_equal(g.state, LH_GROUP_REJECTED);
  assert_string_equal(g.reason, "reward mismatch");
  assert_int_equal(g.version_used, 3);
  assert_int_equal(g.received_ms, 1100);
  assert_int_equal(g.body_len, 0);
  lh_ledger_group_clear(&g);
  OK(lh_ledger_group_reject(l, ids[1], -1, "malformed body", 1200));
  OK(lh_ledger_group_reject(l, ids[2], 0, "reward mismatch", 1300));
  int64_t *gone = NULL;
  int n = 0;
  OK(lh_ledger_expire(l, 5000, &gone, &n));
  free(gone);
  OK(lh_ledger_group_reject(l, ids[3], 0, "token mismatch", 6000)); /* expired -> rejected */
  expect_err(lh_ledger_group_reject(l, ids[0], 0, "again", 1), LH_ERR_INVAL, "is rejected");
  expect_err(lh_ledger_group_accept(l, ids[0], 0, "b", 1, NULL, 1), LH_ERR_INVAL, "is rejected");
  expect_err(lh_ledger_group_reject(l, ids[4], 0, "", 1), LH_ERR_INVAL, "no reason");
  char reason[LH_LEDGER_REASON_MAX + 2];
  memset(reason, 'r', sizeof reason - 1);
  reason[sizeof reason - 1] = '\0';
  expect_err(lh_ledger_group_reject(l, ids[4], 0, reason, 1), LH_ERR_LIMIT, "rejection reason");
  assert_int_equal(state_of(l, ids[4]), LH_GROUP_EXPIRED);
  lh_ledger_stats_result st;
  OK(lh_ledger_stats(l, &st));
  assert_int_equal(st.groups[LH_GROUP_REJECTED], 4);
  assert_int_equal(st.n_reasons, 3);
  assert_string_equal(st.rejected[0].reason, "reward mismatch");
  assert_int_equal(st.rejected[0].count, 2);
  assert_string_equal(st.rejected[1].reason, "malformed body"); /* ties by text */
  assert_string_equal(st.rejected[2].reason, "token mismatch");
  assert_int_equal(st.rejected[2].count, 1);
  lh_ledger_close(l);
}

/* A group stored (accepted) and then refused by verification: rejected with its reason, its
 * body kept, counted against its worker; only an accepted group can be refuted. */
static void test_refute(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("refute.db"), &l));
  int64_t ids[3];
  lease_n(l, 1, 3, 1000, 2000, ids);
  accept_body(l, ids[0], 2);
  OK(lh_ledger_group_refute(l, ids[0], "token: member 1 position 4: forged", 1500));
  lh_ledger_group g;
  OK(lh_ledger_group_get(l, ids[0], &g));
  assert_int_equal(g.state, LH_GROUP_REJECTED);
  assert_string_equal(g.reason, "token: member 1 position 4: forged");
  assert_int_equal(g.version_used, 2);
  assert_true(g.body_len > 0); /* the evidence stays */
  lh_ledger_group_clear(&g);
  expect_err(lh_ledger_group_refute(l, ids[1], "x", 1), LH_ERR_INVAL,
             "is leased, expected accepted");
  expect_err(lh_ledger_group_refute(l, ids[0], "x", 1), LH_ERR_INVAL, "is rejected");
  expect_err(lh_ledger_group_refute(l, 999, "x", 1), LH_ERR_NOTFOUND, "no group 999");
  expect_err(lh_ledger_train(l, 1, ids, 1, NULL, 0), LH_ERR_INVAL, "");
  lh_ledger_worker *all = NULL;
  int n = 0;
  OK(lh_ledger_workers(l, &all, &n));
  assert_int_equal(all[0].groups[LH_GROUP_REJECTED], 1);
  assert_int_equal(all[0].groups[LH_GROUP_ACCEPTED], 0);
  free(all);
  lh_ledger_close(l);
}

/* The reputation window: a worker's latest groups that are no longer leased, by state, newest
 * first; rejections with the excused prefix counted apart; expired groups only when asked;
 * another worker's groups never. */
static void test_worker_recent(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("recent.db"), &l));
  int64_t a[10], b[2];
  lease_n(l, 1, 10, 1000, 2000, a);
  lease_n(l, 2, 2, 1000, 9000, b);
  OK(lh_ledger_group_reject(l, a[0], 0, "token: member 0 position 1: forged", 1100));
  OK(lh_ledger_group_reject(l, a[1], 0, "env: the environment failed to score it", 1100));
  OK(lh_ledger_group_reject(l, a[2], 0, "prompt: changed", 1100));
  for (int i = 3; i < 7; i++)
    accept_body(l, a[i], 0);
  OK(lh_ledger_group_reject(l, b[0], 0, "shape: forged", 1100)); /* worker 2's */
  int64_t *gone = NULL;
  int n = 0;
  OK(lh_ledger_expire(l, 3000, &gone, &n)); /* a[7..9] expire, b[1] stays leased */
  assert_int_equal(n, 3);
  free(gone);
  uint8_t k1[LH_LEDGER_KEY_BYTES], k2[LH_LEDGER_KEY_BYTES], k3[LH_LEDGER_KEY_BYTES];
  key_of(1, k1);
  key_of(2, k2);
  key_of(3, k3);
  lh_ledger_recent r;
  OK(lh_ledger_worker_recent(l, k1, 100, false, "env:", &r));
  assert_int_equal(r.n, 7);
  assert_int_equal(r.groups[LH_GROUP_REJECTED], 3);
  assert_int_equal(r.excused, 1);
  assert_int_equal(r.groups[LH_GROUP_ACCEPTED], 4);
  assert_int_equal(r.groups[LH_GROUP_EXPIRED], 0);
  OK(lh_ledger_worker_recent(l, k1, 100, true, "env:", &r));
  assert_int_equal(r.n, 10);
  assert_int_equal(r.groups[LH_GROUP_EXPIRED], 3);
  /* the window holds the newest: a[3..6] accepted and a[2] rejected */
  OK(lh_ledger_worker_recent(l, k1, 5, false, "env:", &r));
  assert_int_equal(r.n, 5);
  assert_int_equal(r.groups[LH_GROUP_REJECTED], 1);
  assert_int_equal(r.groups[LH_GROUP_ACCEPTED], 4);
  assert_int_equal(r.excused, 0);
  OK(lh_ledger_worker_recent(l, k1, 6, false, NULL, &r)); /* no excused prefix */
  assert_int_equal(r.groups[LH_GROUP_REJECTED], 2);
  assert_int_equal(r.excused, 0);
  OK(lh_ledger_worker_recent(l, k2, 100, true, "env:", &r)); /* the leased one is not counted */
  assert_int_equal(r.n, 1);
  assert_int_equal(r.groups[LH_GROUP_REJECTED], 1);
  assert_int_equal(r.groups[LH_GROUP_LEASED], 0);
  OK(lh_ledger_worker_recent(l, k3, 100, true, "env:", &r)); /* never registered */
  assert_int_equal(r.n, 0);
  expect_err(lh_ledger_worker_recent(l, k1, 0, true, NULL, &r), LH_ERR_INVAL, "window of 0");
  lh_ledger_close(l);
}

/* ---------------------------------------------------------------- per-worker counts */

/* Worker `tag` (row id wid): its counts from lh_ledger_worker_get and lh_ledger_workers equal a
 * recount of its groups by state through their leases (raw SQL on a second connection). */
static void check_counts(lh_ledger *l, const char *path, uint8_t tag, int wid) {
  uint8_t key[LH_LEDGER_KEY_BYTES];
  key_of(tag, key);
  lh_ledger_worker w;
  OK(lh_ledger_worker_get(l, key, &w));
  lh_ledger_worker *all = NULL;
  int n = 0;
  OK(lh_ledger_workers(l, &all, &n));
  assert_true(wid >= 1 && wid <= n);
  for (int st = 0; st < LH_GROUP__COUNT; st++) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM groups g JOIN leases l ON l.id = g.lease"
             " WHERE l.worker = %d AND g.state = %d",
             wid, st);
    int64_t want = raw_int(path, sql);
    if (w.groups[st] != want || all[wid - 1].groups[st] != want)
      fail_msg("worker %d: %s: worker_get %lld, workers %lld, recount %lld", wid,
               lh_group_state_name((lh_group_state)st), (long long)w.groups[st],
               (long long)all[wid - 1].groups[st], (long long)want);
  }
  free(all);
}

/* The per-worker counts kept with every change (one row read per signed request) match a recount
 * after leases, accepts, rejects, expiries, a late accept, trains, drops, a refute, a rewind and
 * a reopen; the audit checks them too. */
static void test_worker_counts(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s", path_of("counts.db"));
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path, &l));
  int64_t a[6], b[4];
  lease_n(l, 1, 6, 1000, 2000, a);
  lease_n(l, 2, 4, 1000, 9000, b);
  check_counts(l, path, 1, 1);
  check_counts(l, path, 2, 2);
  for (int i = 0; i < 3; i++)
    accept_body(l, a[i], 0);
  accept_body(l, b[0], 0);
  OK(lh_ledger_group_reject(l, a[3], 0, "prompt: changed", 1100));
  OK(lh_ledger_group_reject(l, b[1], 0, "env: failed", 1100));
  check_counts(l, path, 1, 1);
  check_counts(l, path, 2, 2);
  int64_t *gone = NULL;
  int n = 0;
  OK(lh_ledger_expire(l, 3000, &gone, &n)); /* a[4], a[5]; b's lease runs to 9000 */
  assert_int_equal(n, 2);
  free(gone);
  check_counts(l, path, 1, 1);
  accept_body(l, a[4], 0); /* a late submission: expired -> accepted */
  check_counts(l, path, 1, 1);
  put_version(l, 0);
  int64_t t1[] = {a[0], b[0]}, d1[] = {a[1]};
  OK(lh_ledger_train(l, 1, t1, 2, d1, 1));
  put_version(l, 1);
  OK(lh_ledger_group_refute(l, a[2], "token: member 0 position 2: forged", 1200));
  check_counts(l, path, 1, 1);
  check_counts(l, path, 2, 2);
  uint8_t k1[LH_LEDGER_KEY_BYTES];
  key_of(1, k1);
  lh_ledger_worker w;
  OK(lh_ledger_worker_get(l, k1, &w));
  int64_t want1[LH_GROUP__COUNT] = {0, 1, 2, 1, 1, 1}; /* a4 | a2 a3 | a0 | a1 | a5 */
  assert_memory_equal(w.groups, want1, sizeof want1);
  lh_ledger_audit_result r;
  OK(lh_ledger_audit(l, &r));
  int64_t back = -1;
  OK(lh_ledger_rewind(l, 0, &back)); /* a0, a1 and b0 go back to accepted */
  assert_int_equal(back, 3);
  check_counts(l, path, 1, 1);
  check_counts(l, path, 2, 2);
  lh_ledger_close(l);

  OK(lh_ledger_open(path, &l));
  check_counts(l, path, 1, 1);
  check_counts(l, path, 2, 2);
  int64_t c[3];
  lease_n(l, 1, 3, 4000, 5000, c);
  accept_body(l, c[0], 0);
  check_counts(l, path, 1, 1);
  OK(lh_ledger_worker_get(l, k1, &w));
  int64_t want2[LH_GROUP__COUNT] = {2, 4, 2, 0, 0, 1};
  assert_memory_equal(w.groups, want2, sizeof want2);
  OK(lh_ledger_audit(l, &r));
  lh_ledger_close(l);
}

/* The schema of version 1, as the first longhaul wrote it (kept here, apart from the ledger's
 * code, to make the ledgers of earlier runs). */
static const char SCHEMA_V1[] =
    "CREATE TABLE workers (id INTEGER PRIMARY KEY, key BLOB NOT NULL UNIQUE CHECK (length(key) ="
    " 32), name TEXT NOT NULL, hardware TEXT NOT NULL, registered_ms INTEGER NOT NULL,"
    " last_seen_ms INTEGER NOT NULL) STRICT;"
    "CREATE TABLE leases (id INTEGER PRIMARY KEY AUTOINCREMENT, worker INTEGER NOT NULL"
    " REFERENCES workers (id), leased_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,"
    " n_groups INTEGER NOT NULL) STRICT;"
    "CREATE INDEX leases_worker ON leases (worker);"
    "CREATE TABLE groups (id INTEGER PRIMARY KEY AUTOINCREMENT, lease INTEGER NOT NULL"
    " REFERENCES leases (id), task_index INTEGER NOT NULL, spec BLOB NOT NULL, state INTEGER NOT"
    " NULL CHECK (state BETWEEN 0 AND 5), version_used INTEGER NOT NULL DEFAULT -1, trained_at"
    " INTEGER NOT NULL DEFAULT -1, reason TEXT NOT NULL DEFAULT '', received_ms INTEGER NOT NULL"
    " DEFAULT -1, meta TEXT) STRICT;"
    "CREATE INDEX groups_state ON groups (state, id);"
    "CREATE INDEX groups_lease ON groups (lease);"
    "CREATE INDEX groups_trained_at ON groups (trained_at) WHERE state IN (3, 4);"
    "CREATE TABLE bodies (grp INTEGER PRIMARY KEY REFERENCES groups (id), body BLOB NOT NULL)"
    " STRICT;"
    "CREATE TABLE rewinds (id INTEGER PRIMARY KEY AUTOINCREMENT, version INTEGER NOT NULL,"
    " groups_back INTEGER NOT NULL DEFAULT 0, versions_forgotten INTEGER NOT NULL DEFAULT 0)"
    " STRICT;"
    "CREATE TABLE training_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, version INTEGER NOT NULL,"
    " grp INTEGER NOT NULL REFERENCES groups (id), what INTEGER NOT NULL CHECK (what IN (3, 4)),"
    " undone_by INTEGER REFERENCES rewinds (id)) STRICT;"
    "CREATE INDEX training_log_grp ON training_log (grp);"
    "CREATE INDEX training_log_live ON training_log (version) WHERE undone_by IS NULL;"
    "CREATE TABLE versions (version INTEGER PRIMARY KEY CHECK (version >= 0), parent INTEGER NOT"
    " NULL, slab_hash BLOB NOT NULL CHECK (length(slab_hash) = 32), manifest BLOB NOT NULL,"
    " published_ms INTEGER NOT NULL) STRICT;"
    "CREATE TABLE blobs (version INTEGER NOT NULL REFERENCES versions (version) ON DELETE CASCADE,"
    " hash BLOB NOT NULL CHECK (length(hash) = 32), kind INTEGER NOT NULL CHECK (kind IN (0, 1)),"
    " from_version INTEGER NOT NULL, size INTEGER NOT NULL CHECK (size >= 1),"
    " PRIMARY KEY (version, hash)) STRICT;"
    "CREATE INDEX blobs_hash ON blobs (hash, version);"
    "CREATE TABLE state_counts (state INTEGER PRIMARY KEY, n INTEGER NOT NULL) STRICT;"
    "INSERT INTO state_counts VALUES (0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0);"
    "CREATE TRIGGER groups_count_insert AFTER INSERT ON groups BEGIN"
    " UPDATE state_counts SET n = n + 1 WHERE state = NEW.state; END;"
    "CREATE TRIGGER groups_count_update AFTER UPDATE OF state ON groups"
    " WHEN OLD.state <> NEW.state BEGIN"
    " UPDATE state_counts SET n = n - 1 WHERE state = OLD.state;"
    " UPDATE state_counts SET n = n + 1 WHERE state = NEW.state; END;"
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT;"
    /* what the servers of version 1 added at open */
    "CREATE INDEX groups_lease_state ON groups (lease, state);"
    "PRAGMA application_id = 1279806535; PRAGMA user_version = 1;";

/* A ledger of schema version 1 (made here with SQL, with groups in every state for two workers)
 * opens: it is migrated to the current version once, its workers' counts are right and kept
 * right by what follows, the reputation windows read it, and the audit passes. */
static void test_migrate_v1(void **state) {
  (void)state;
  char path[512], sql[4096], k1[2 * LH_LEDGER_KEY_BYTES + 1], k2[sizeof k1];
  snprintf(path, sizeof path, "%s", path_of("v1.db"));
  uint8_t key1[LH_LEDGER_KEY_BYTES], key2[LH_LEDGER_KEY_BYTES];
  key_of(1, key1);
  key_of(2, key2);
  for (int i = 0; i < LH_LEDGER_KEY_BYTES; i++) {
    snprintf(k1 + 2 * i, 3, "%02x", key1[i]);
    snprintf(k2 + 2 * i, 3, "%02x", key2[i]);
  }
  raw_exec(path, SCHEMA_V1);
  /* worker 1: lease 1 (a group in each state) and lease 3; worker 2: lease 2 */
  snprintf(
      sql, sizeof sql,
      "INSERT INTO workers VALUES (1, X'%s', 'w1', '{}', 10, 10), (2, X'%s', 'w2', '{}', 10, 10);"
      "INSERT INTO leases VALUES (1, 1, 100, 200, 6), (2, 2, 100, 200, 3), (3, 1, 300, 400, 4);"
      "INSERT INTO versions VALUES (0, -1, zeroblob(32), X'7b7d', 50);"
      "INSERT INTO groups (lease, task_index, spec, state, trained_at, reason) VALUES"
      " (1, 0, X'', 0, -1, ''), (1, 1, X'', 1, -1, ''), (1, 2, X'', 2, -1, 'prompt: x'),"
      " (1, 3, X'', 3, 0, ''), (1, 4, X'', 4, 0, 'stale'), (1, 5, X'', 5, -1, ''),"
      " (2, 6, X'', 1, -1, ''), (2, 7, X'', 1, -1, ''), (2, 8, X'', 2, -1, 'env: y'),"
      " (3, 9, X'', 0, -1, ''), (3, 10, X'', 5, -1, ''), (3, 11, X'', 2, -1, 'env: z'),"
      " (3, 12, X'', 3, 0, '');"
      "INSERT INTO bodies VALUES (2, X'01'), (7, X'02'), (8, X'03');"
      "INSERT INTO training_log (version, grp, what) VALUES (0, 4, 3), (0, 5, 4), (0, 13, 3);",
      k1, k2);
  raw_exec(path, sql);
  assert_int_equal(raw_int(path, "PRAGMA user_version"), 1);

  lh_ledger *l = NULL;
  OK(lh_ledger_open(path, &l));
  assert_int_equal(raw_int(path, "PRAGMA user_version"), LH_LEDGER_SCHEMA_VERSION);
  assert_int_equal(raw_int(path, "SELECT count(*) FROM sqlite_schema WHERE name = "
                                 "'groups_lease_state'"),
                   0);
  check_counts(l, path, 1, 1);
  check_counts(l, path, 2, 2);
  lh_ledger_worker w;
  OK(lh_ledger_worker_get(l, key1, &w));
  int64_t want1[LH_GROUP__COUNT] = {2, 1, 2, 2, 1, 2};
  assert_memory_equal(w.groups, want1, sizeof want1);
  OK(lh_ledger_worker_get(l, key2, &w));
  int64_t want2[LH_GROUP__COUNT] = {0, 2, 1, 0, 0, 0};
  assert_memory_equal(w.groups, want2, sizeof want2);
  lh_ledger_audit_result r;
  OK(lh_ledger_audit(l, &r));
  /* the windows read the migrated groups: worker 1's latest 3 submitted are 13 (trained),
   * 12 (rejected, excused) and 5 (dropped) */
  lh_ledger_recent rc;
  OK(lh_ledger_worker_recent(l, key1, 3, false, "env:", &rc));
  assert_int_equal(rc.n, 3);
  assert_int_equal(rc.groups[LH_GROUP_TRAINED], 1);
  assert_int_equal(rc.groups[LH_GROUP_DROPPED], 1);
  assert_int_equal(rc.groups[LH_GROUP_REJECTED], 1);
  assert_int_equal(rc.excused, 1);
  OK(lh_ledger_worker_recent(l, key1, 100, true, NULL, &rc));
  assert_int_equal(rc.n, 8);
  assert_int_equal(rc.groups[LH_GROUP_EXPIRED], 2);
  /* what comes next keeps them */
  int64_t ids[2];
  lease_n(l, 2, 2, 500, 600, ids);
  accept_body(l, ids[0], 0);
  OK(lh_ledger_group_accept(l, 10, 0, "late", 4, NULL, 700)); /* leased in version 1 */
  check_counts(l, path, 1, 1);
  check_counts(l, path, 2, 2);
  OK(lh_ledger_audit(l, &r));
  lh_ledger_close(l);
  /* opened again: nothing to migrate, the same counts */
  OK(lh_ledger_open(path, &l));
  check_counts(l, path, 1, 1);
  check_counts(l, path, 2, 2);
  lh_ledger_close(l);
}

/* ---------------------------------------------------------------- rewind */

static void test_rewind(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("rewind.db"), &l));
  int64_t ids[7];
  lease_n(l, 1, 7, 1000, 2000, ids);
  for (int i = 0; i < 6; i++)
    accept_body(l, ids[i], 0);
  put_version(l, 0);
  int64_t v1[] = {1, 2}, v2t[] = {3}, v2d[] = {4}, v3[] = {5};
  OK(lh_ledger_train(l, 1, v1, 2, NULL, 0));
  put_version(l, 1);
  OK(lh_ledger_train(l, 2, v2t, 1, v2d, 1));
  put_version(l, 2);
  OK(lh_ledger_train(l, 3, v3, 1, NULL, 0));
  put_version(l, 3);
  lh_ledger_audit_result r;
  OK(lh_ledger_audit(l, &r));

  /* a restart from the checkpoint at version 1 */
  int64_t back = -1;
  OK(lh_ledger_rewind(l, 1, &back));
  assert_int_equal(back, 3);
  for (int i = 1; i <= 7; i++) {
    lh_ledger_group g;
    OK(lh_ledger_group_get(l, i, &g));
    lh_group_state want = i <= 2 ? LH_GROUP_TRAINED : i <= 6 ? LH_GROUP_ACCEPTED : LH_GROUP_LEASED;
    assert_int_equal(g.state, want);
    assert_int_equal(g.trained_at, i <= 2 ? 1 : -1);
    assert_string_equal(g.reason, ""); /* group 4's "stale" went with its drop */
    assert_true(g.body_len > 0 || i == 7);
    lh_ledger_group_clear(&g);
  }
  int64_t latest = -1;
  OK(lh_ledger_latest_version(l, &latest));
  assert_int_equal(latest, 1);
  char *m = NULL;
  size_t len = 0;
  expect_err(lh_ledger_version_get(l, 2, &m, &len), LH_ERR_NOTFOUND, "version 2 is not published");
  uint8_t hash2[32];
  memset(hash2, 2 + 7, sizeof hash2);
  expect_err(lh_ledger_blob_find(l, hash2, NULL, NULL), LH_ERR_NOTFOUND, "no published version");
  int64_t *acc = NULL;
  int n = 0;
  OK(lh_ledger_accepted(l, &acc, &n));
  assert_int_equal(n, 4);
  assert_int_equal(acc[0], 3);
  assert_int_equal(acc[3], 6);
  free(acc);
  /* the log keeps every event; those after version 1 are undone by rewind 1 */
  lh_ledger_log_entry *log = NULL;
  OK(lh_ledger_log(l, &log, &n));
  assert_int_equal(n, 5);
  for (int i = 0; i < n; i++)
    assert_int_equal(log[i].undone_by, log[i].version > 1 ? 1 : 0);
  free(log);
  OK(lh_ledger_audit(l, &r));
  assert_int_equal(r.log_live, 2);
  assert_int_equal(r.log_undone, 3);
  assert_int_equal(r.groups[LH_GROUP_ACCEPTED], 4);

  /* trained again after the restart, at new versions 2 and 3 of other content */
  int64_t again[] = {3, 4, 5, 6};
  OK(lh_ledger_train(l, 2, again, 4, NULL, 0));
  uint8_t slab[32];
  memset(slab, 0x55, sizeof slab);
  OK(lh_ledger_version_put(l, 2, 1, slab, "new 2", 5, 1, 0, NULL));
  OK(lh_ledger_audit(l, &r));
  assert_int_equal(r.groups[LH_GROUP_TRAINED], 6);
  assert_int_equal(r.log_live, 6);
  /* a second restart from no checkpoint at all undoes everything */
  OK(lh_ledger_rewind(l, -1, &back));
  assert_int_equal(back, 6);
  expect_err(lh_ledger_latest_version(l, &latest), LH_ERR_NOTFOUND, "no version");
  OK(lh_ledger_log(l, &log, &n));
  assert_int_equal(n, 9);
  assert_int_equal(log[0].undone_by, 2);
  assert_int_equal(log[2].undone_by, 1); /* undone once, by the first rewind */
  assert_int_equal(log[8].undone_by, 2);
  free(log);
  lh_ledger_stats_result st;
  OK(lh_ledger_stats(l, &st));
  assert_int_equal(st.rewinds, 2);
  assert_int_equal(st.log_live, 0);
  assert_int_equal(st.log_undone, 9);
  assert_int_equal(st.groups[LH_GROUP_ACCEPTED], 6);
  OK(lh_ledger_audit(l, &r));
  expect_err(lh_ledger_rewind(l, -2, &back), LH_ERR_INVAL, "version >= -1");
  lh_ledger_close(l);
}

static void test_prune(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("prune.db"), &l));
  int64_t ids[3];
  lease_n(l, 1, 3, 1000, 2000, ids);
  for (int i = 0; i < 3; i++)
    accept_body(l, ids[i], 0);
  int64_t t1[] = {1}, t2[] = {2};
  OK(lh_ledger_train(l, 1, t1, 1, NULL, 0));
  put_version(l, 1);
  OK(lh_ledger_train(l, 2, t2, 1, NULL, 0));
  put_version(l, 2);
  int64_t n = -1;
  OK(lh_ledger_prune_bodies(l, 1, &n));
  assert_int_equal(n, 1);
  void *body = NULL;
  size_t len = 0;
  expect_err(lh_ledger_group_body(l, 1, &body, &len), LH_ERR_NOTFOUND, "trained and has no body");
  OK(lh_ledger_group_body(l, 2, &body, &len));
  free(body);
  expect_err(lh_ledger_rewind(l, 0, NULL), LH_ERR_INVAL, "pruned");
  assert_int_equal(state_of(l, 1), LH_GROUP_TRAINED);
  OK(lh_ledger_rewind(l, 1, &n));
  assert_int_equal(n, 1);
  lh_ledger_audit_result r;
  OK(lh_ledger_audit(l, &r));
  lh_ledger_stats_result st;
  OK(lh_ledger_stats(l, &st));
  assert_int_equal(st.body_bytes, (int64_t)(strlen("body of group 2") + strlen("body of group 3")));
  lh_ledger_close(l);
}

/* ---------------------------------------------------------------- versions */

static void test_versions(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("versions.db"), &l));
  int64_t latest = 0;
  expect_err(lh_ledger_latest_version(l, &latest), LH_ERR_NOTFOUND, "no version");
  uint8_t slab[32];
  memset(slab, 1, sizeof slab);
  lh_ledger_blob blobs[2] = {{.kind = 1, .from_version = 0, .size = 50},
                             {.kind = 0, .from_version = -1, .size = 900}};
  memset(blobs[0].hash, 0xbb, 32);
  memset(blobs[1].hash, 0xaa, 32);
  put_version(l, 0);
  OK(lh_ledger_version_put(l, 1, 0, slab, "manifest one", 12, 77, 2, blobs));
  /* again, blobs in the other order: the same version */
  lh_ledger_blob swapped[2] = {blobs[1], blobs[0]};
  OK(lh_ledger_version_put(l, 1, 0, slab, "manifest one", 12, 88, 2, swapped));
  expect_err(lh_ledger_version_put(l, 1, 0, slab, "manifest 1!", 11, 1, 2, blobs), LH_ERR_MISMATCH,
             "version 1 is published already, with another manifest");
  expect_err(lh_ledger_version_put(l, 1, -1, slab, "manifest one", 12, 1, 2, blobs),
             LH_ERR_MISMATCH, "another parent");
  expect_err(lh_ledger_version_put(l, 1, 0, slab, "manifest one", 12, 1, 1, blobs), LH_ERR_MISMATCH,
             "other blobs");
  uint8_t slab2[32];
  memset(slab2, 2, sizeof slab2);
  expect_err(lh_ledger_version_put(l, 1, 0, slab2, "manifest one", 12, 1, 2, blobs),
             LH_ERR_MISMATCH, "another slab hash");
  /* bad blobs and arguments */
  lh_ledger_blob bad = blobs[0];
  bad.from_version = 5;
  expect_err(lh_ledger_version_put(l, 5, 4, slab, "m", 1, 1, 1, &bad), LH_ERR_INVAL, "blob 0");
  bad = blobs[1];
  bad.kind = 2;
  expect_err(lh_ledger_version_put(l, 5, 4, slab, "m", 1, 1, 1, &bad), LH_ERR_INVAL, "kind 2");
  lh_ledger_blob twice[2] = {blobs[0], blobs[0]};
  expect_err(lh_ledger_version_put(l, 5, 4, slab, "m", 1, 1, 2, twice), LH_ERR_INVAL, "twice");
  expect_err(lh_ledger_version_put(l, 5, 5, slab, "m", 1, 1, 0, NULL), LH_ERR_INVAL, "parent");
  expect_err(lh_ledger_version_put(l, 5, 4, slab, "m", LH_LEDGER_MANIFEST_MAX + 1, 1, 0, NULL),
             LH_ERR_LIMIT, "manifest");
  OK(lh_ledger_latest_version(l, &latest));
  assert_int_equal(latest, 1);
  char *m = NULL;
  size_t len = 0;
  OK(lh_ledger_version_get(l, 1, &m, &len));
  assert_int_equal(len, 12);
  assert_string_equal(m, "manifest one");
  free(m);
  lh_ledger_blob *got = NULL;
  int n = 0;
  OK(lh_ledger_version_blobs(l, 1, &got, &n));
  assert_int_equal(n, 2);
  assert_int_equal(got[0].hash[0], 0xaa); /* by hash */
  assert_int_equal(got[0].kind, 0);
  assert_int_equal(got[0].from_version, -1);
  assert_int_equal(got[1].size, 50);
  free(got);
  expect_err(lh_ledger_version_blobs(l, 7, &got, &n), LH_ERR_NOTFOUND, "version 7");
  lh_ledger_blob found;
  int64_t fv = -1;
  OK(lh_ledger_blob_find(l, blobs[0].hash, &found, &fv));
  assert_int_equal(fv, 1);
  assert_int_equal(found.kind, 1);
  assert_int_equal(found.from_version, 0);
  assert_int_equal(found.size, 50);
  /* the same snapshot blob in a second version counts once in blob_bytes */
  OK(lh_ledger_version_put(l, 2, 1, slab, "manifest two", 12, 99, 1, &blobs[1]));
  lh_ledger_stats_result st;
  OK(lh_ledger_stats(l, &st));
  assert_int_equal(st.versions, 3);
  assert_int_equal(st.latest_version, 2);
  assert_int_equal(st.blob_bytes, 1000 + 50 + 900);
  lh_ledger_close(l);
}

/* ---------------------------------------------------------------- audit */

/* A small run: groups 1..6 accepted, 1 and 2 trained at 1, 3 dropped at 2, 4 trained at 2,
 * versions 0..2 published; 5 and 6 accepted, 7 leased. */
static lh_ledger *build_run(const char *name) {
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of(name), &l));
  int64_t ids[7];
  lease_n(l, 1, 7, 1000, 2000, ids);
  for (int i = 0; i < 6; i++)
    accept_body(l, ids[i], 0);
  put_version(l, 0);
  int64_t t1[] = {1, 2}, t2[] = {4}, d2[] = {3};
  OK(lh_ledger_train(l, 1, t1, 2, NULL, 0));
  put_version(l, 1);
  OK(lh_ledger_train(l, 2, t2, 1, d2, 1));
  put_version(l, 2);
  lh_ledger_audit_result r;
  OK(lh_ledger_audit(l, &r));
  return l;
}

static void expect_audit(const char *name, const char *sql, int64_t bad, const char *needle) {
  lh_ledger *l = build_run(name);
  char path[512];
  snprintf(path, sizeof path, "%s", path_of(name));
  raw_exec(path, sql);
  lh_ledger_audit_result r;
  lh_err e = lh_ledger_audit(l, &r);
  if (e != LH_ERR_MISMATCH || r.bad_group != bad || !strstr(r.problem, needle) ||
      !strstr(lh_last_error(), needle))
    fail_msg("%s: expected group %lld with \"%s\", got %s, group %lld: %s", sql, (long long)bad,
             needle, lh_err_name(e), (long long)r.bad_group, r.problem);
  lh_ledger_close(l);
}

static void test_audit(void **state) {
  (void)state;
  lh_ledger *l = build_run("clean.db");
  lh_ledger_audit_result r;
  OK(lh_ledger_audit(l, &r));
  assert_int_equal(r.groups[LH_GROUP_TRAINED], 3);
  assert_int_equal(r.groups[LH_GROUP_DROPPED], 1);
  assert_int_equal(r.groups[LH_GROUP_ACCEPTED], 2);
  assert_int_equal(r.groups[LH_GROUP_LEASED], 1);
  assert_int_equal(r.latest_version, 2);
  /* trained at 3 before version 3 is put: beyond the latest */
  int64_t t3[] = {5};
  OK(lh_ledger_train(l, 3, t3, 1, NULL, 0));
  assert_int_equal(lh_ledger_audit(l, &r), LH_ERR_MISMATCH);
  assert_int_equal(r.bad_group, 5);
  assert_non_null(strstr(r.problem, "beyond the latest published version"));
  put_version(l, 3);
  OK(lh_ledger_audit(l, &r));
  lh_ledger_close(l);

  /* a trained group put back to accepted without undoing its event */
  expect_audit("c1.db", "UPDATE groups SET state = 1, trained_at = -1 WHERE id = 2", 2,
               "group 2 has a live training event (trained at version 1), but the group is "
               "accepted");
  /* a group trained at a version past the latest */
  expect_audit("c2.db", "UPDATE groups SET trained_at = 9 WHERE id = 4", 4, "group 4");
  /* a second live event for one group */
  expect_audit("c3.db", "INSERT INTO training_log (version, grp, what) VALUES (2, 1, 3)", 1,
               "group 1 has 2 live training events (versions 1 .. 2)");
  /* a trained group whose event was marked undone */
  expect_audit("c4.db",
               "INSERT INTO rewinds (version) VALUES (0);"
               " UPDATE training_log SET undone_by = 1 WHERE grp = 3",
               3, "group 3 is dropped at version 2, but the live training log has no such event");
  /* an accepted group that lost its body */
  expect_audit("c5.db", "DELETE FROM bodies WHERE grp = 6", 6,
               "group 6 is accepted but has no body");
  /* a group marked trained with no event at all */
  expect_audit("c6.db", "UPDATE groups SET state = 3, trained_at = 2 WHERE id = 5", 5,
               "group 5 is trained at version 2, but the live training log has no such event");
  /* trained_at on a leased group */
  expect_audit("c7.db", "UPDATE groups SET trained_at = 1 WHERE id = 7", 7,
               "group 7 is leased with trained_at 1");
  /* the lowest offending id is named when several break */
  expect_audit("c8.db",
               "DELETE FROM bodies WHERE grp = 6; UPDATE groups SET trained_at = 9 WHERE id = 4", 4,
               "group 4");
  /* the counts behind lh_ledger_stats */
  expect_audit("c9.db", "UPDATE state_counts SET n = n + 1 WHERE state = 0", 0,
               "the state counts say 2 leased groups, the groups 1");
  /* the per-worker counts */
  expect_audit("c10.db", "UPDATE worker_counts SET accepted = accepted + 1", 0,
               "worker 1: the kept counts say 3 accepted (its groups 2)");
  expect_audit("c11.db", "DELETE FROM worker_counts", 0, "worker 1 has no kept group counts");
}

/* ---------------------------------------------------------------- threads and kill -9 */

#define THREAD_GROUPS 200

/* Runs fa and fb on two threads at once, on the same ledger; their results in *ra and *rb. */
static void run_both(void *(*fa)(void *), void *(*fb)(void *), lh_ledger *l, void **ra, void **rb) {
  pthread_t a, b;
  assert_int_equal(pthread_create(&a, NULL, fa, l), 0);
  assert_int_equal(pthread_create(&b, NULL, fb, l), 0);
  pthread_join(a, ra);
  pthread_join(b, rb);
}

static void *accept_thread(void *arg) {
  lh_ledger *l = arg;
  for (int i = 1; i <= THREAD_GROUPS; i++) {
    char body[32];
    snprintf(body, sizeof body, "rollout %d", i);
    if (lh_ledger_group_accept(l, i, 0, body, strlen(body), NULL, i))
      return (void *)lh_last_error();
  }
  return NULL;
}

static void *train_thread(void *arg) {
  lh_ledger *l = arg;
  int trained = 0;
  for (int64_t v = 1; trained < THREAD_GROUPS && v < 100000; v++) {
    int64_t *ids = NULL;
    int n = 0;
    if (lh_ledger_accepted(l, &ids, &n)) return (void *)lh_last_error();
    if (n == 0) {
      v--;
      usleep(200);
      continue;
    }
    /* every third one is dropped as stale */
    int64_t keep[THREAD_GROUPS], drop[THREAD_GROUPS];
    int nk = 0, nd = 0;
    for (int i = 0; i < n; i++) {
      if (ids[i] % 3 == 0)
        drop[nd++] = ids[i];
      else
        keep[nk++] = ids[i];
    }
    free(ids);
    if (lh_ledger_train(l, v, keep, nk, drop, nd)) return (void *)lh_last_error();
    uint8_t slab[32] = {0};
    char m[32];
    snprintf(m, sizeof m, "v%lld", (long long)v);
    if (lh_ledger_version_put(l, v, v - 1, slab, m, strlen(m), v, 0, NULL))
      return (void *)lh_last_error();
    trained += n;
    lh_ledger_stats_result st;
    if (lh_ledger_stats(l, &st)) return (void *)lh_last_error();
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("threads.db"), &l));
  uint8_t key[32];
  key_of(1, key);
  OK(lh_ledger_worker_register(l, key, "w", "{}", 0, NULL));
  lh_ledger_group_spec specs[THREAD_GROUPS];
  for (int i = 0; i < THREAD_GROUPS; i++)
    specs[i] = (lh_ledger_group_spec){(uint64_t)i, "s", 1};
  int64_t ids[THREAD_GROUPS], lease = 0;
  OK(lh_ledger_lease(l, key, 0, 1000, THREAD_GROUPS, specs, &lease, ids));
  assert_int_equal(ids[THREAD_GROUPS - 1], THREAD_GROUPS);
  void *ra = NULL, *rt = NULL;
  run_both(accept_thread, train_thread, l, &ra, &rt);
  if (ra) fail_msg("accepting: %s", (const char *)ra);
  if (rt) fail_msg("training: %s", (const char *)rt);
  lh_ledger_audit_result r;
  OK(lh_ledger_audit(l, &r));
  assert_int_equal(r.groups[LH_GROUP_TRAINED] + r.groups[LH_GROUP_DROPPED], THREAD_GROUPS);
  assert_int_equal(r.groups[LH_GROUP_DROPPED], THREAD_GROUPS / 3);
  assert_int_equal(r.log_live, THREAD_GROUPS);
  /* each group once in the log, no update lost */
  lh_ledger_log_entry *log = NULL;
  int n = 0;
  OK(lh_ledger_log(l, &log, &n));
  assert_int_equal(n, THREAD_GROUPS);
  char seen[THREAD_GROUPS + 1] = {0};
  for (int i = 0; i < n; i++) {
    assert_true(log[i].group >= 1 && log[i].group <= THREAD_GROUPS);
    assert_int_equal(seen[log[i].group], 0);
    seen[log[i].group] = 1;
    assert_int_equal(log[i].what, log[i].group % 3 == 0 ? LH_GROUP_DROPPED : LH_GROUP_TRAINED);
  }
  free(log);
  lh_ledger_close(l);
}

/* An update and a pruning longer than one part (LH_LEDGER_TRAIN_PART marks, LH_LEDGER_PRUNE_PART
 * bodies per group commit): a call refused for an id of its last part changes nothing; one that
 * succeeds marks every group once, in the order given; the pruning deletes every body, and
 * rewinds below it are refused. */
#define PART_GROUPS (2 * LH_LEDGER_TRAIN_PART + 9)
_Static_assert(PART_GROUPS > LH_LEDGER_PRUNE_PART, "pruning in two parts at least");

static void test_parts(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("parts.db"), &l));
  int64_t ids[PART_GROUPS + 1];
  for (int at = 0; at <= PART_GROUPS; at += 64)
    lease_n(l, 1, PART_GROUPS + 1 - at < 64 ? PART_GROUPS + 1 - at : 64, 1000, 2000, ids + at);
  for (int i = 0; i < PART_GROUPS; i++)
    accept_body(l, ids[i], 0);
  /* the offender (a leased group) is the last id: nothing of the earlier parts is written */
  expect_err(lh_ledger_train(l, 1, ids, PART_GROUPS + 1, NULL, 0), LH_ERR_INVAL,
             "is leased, expected accepted");
  lh_ledger_log_entry *log = NULL;
  int n = -1;
  OK(lh_ledger_log(l, &log, &n));
  assert_int_equal(n, 0);
  lh_ledger_stats_result st;
  OK(lh_ledger_stats(l, &st));
  assert_int_equal(st.groups[LH_GROUP_ACCEPTED], PART_GROUPS);
  /* trained, then dropped, every one once and in order */
  int n_drop = LH_LEDGER_TRAIN_PART + 3;
  OK(lh_ledger_train(l, 1, ids, PART_GROUPS - n_drop, ids + PART_GROUPS - n_drop, n_drop));
  OK(lh_ledger_log(l, &log, &n));
  assert_int_equal(n, PART_GROUPS);
  for (int i = 0; i < n; i++) {
    assert_int_equal(log[i].group, ids[i]);
    assert_int_equal(log[i].version, 1);
    assert_int_equal(log[i].what, i < PART_GROUPS - n_drop ? LH_GROUP_TRAINED : LH_GROUP_DROPPED);
  }
  free(log);
  put_version(l, 1);
  lh_ledger_audit_result r;
  OK(lh_ledger_audit(l, &r));
  assert_int_equal(r.groups[LH_GROUP_TRAINED], PART_GROUPS - n_drop);
  assert_int_equal(r.groups[LH_GROUP_DROPPED], n_drop);
  int64_t gone = -1;
  OK(lh_ledger_prune_bodies(l, 1, &gone));
  assert_int_equal(gone, PART_GROUPS);
  OK(lh_ledger_stats(l, &st));
  assert_int_equal(st.body_bytes, 0);
  expect_err(lh_ledger_rewind(l, 0, NULL), LH_ERR_INVAL, "pruned");
  OK(lh_ledger_audit(l, &r));
  lh_ledger_close(l);
}

/* Two threads accept the same groups at once: their accepts meet in group commits, and each
 * group is accepted once, the other accept of it refused alone (the commit goes on). */
static void *accept_again_thread(void *arg) {
  lh_ledger *l = arg;
  intptr_t refused = 0;
  for (int i = 1; i <= THREAD_GROUPS; i++) {
    char body[32];
    snprintf(body, sizeof body, "rollout %d", i);
    lh_err e = lh_ledger_group_accept(l, i, 0, body, strlen(body), NULL, i);
    if (e && (e != LH_ERR_INVAL || !strstr(lh_last_error(), "the group is accepted")))
      return (void *)-1;
    refused += e != LH_ERR_OK;
  }
  return (void *)refused;
}

static void test_accept_race(void **state) {
  (void)state;
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path_of("race.db"), &l));
  int64_t ids[64];
  for (int at = 0; at < THREAD_GROUPS; at += 64)
    lease_n(l, 1, THREAD_GROUPS - at < 64 ? THREAD_GROUPS - at : 64, 1000, 2000, ids);
  void *ra = NULL, *rb = NULL;
  run_both(accept_again_thread, accept_again_thread, l, &ra, &rb);
  assert_true((intptr_t)ra >= 0 && (intptr_t)rb >= 0);
  assert_int_equal((intptr_t)ra + (intptr_t)rb, THREAD_GROUPS);
  lh_ledger_audit_result r;
  OK(lh_ledger_audit(l, &r));
  assert_int_equal(r.groups[LH_GROUP_ACCEPTED], THREAD_GROUPS);
  int64_t commits = 0, accepts = 0;
  lh_ledger_accept_stats(l, &commits, &accepts);
  assert_int_equal(accepts, THREAD_GROUPS);
  lh_ledger_close(l);
}

static void test_kill9(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s", path_of("kill.db"));
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path, &l));
  int64_t ids[2];
  lease_n(l, 1, 2, 1000, 2000, ids);
  lh_ledger_close(l);
  static const char body[] = "the rollout bytes of group 1";
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* the child: the server that answers 202 and is killed at once */
    lh_ledger *c = NULL;
    if (lh_ledger_open(path, &c) ||
        lh_ledger_group_accept(c, 1, 0, body, sizeof body, "{\"k\":9}", 1500))
      _exit(3);
    raise(SIGKILL);
    _exit(4);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
  assert_int_equal(WTERMSIG(status), SIGKILL);
  OK(lh_ledger_open(path, &l));
  lh_ledger_group g;
  OK(lh_ledger_group_get(l, 1, &g));
  assert_int_equal(g.state, LH_GROUP_ACCEPTED);
  assert_string_equal(g.meta, "{\"k\":9}");
  lh_ledger_group_clear(&g);
  void *got = NULL;
  size_t len = 0;
  OK(lh_ledger_group_body(l, 1, &got, &len));
  assert_int_equal(len, sizeof body);
  assert_memory_equal(got, body, len);
  free(got);
  assert_int_equal(state_of(l, 2), LH_GROUP_LEASED);
  lh_ledger_audit_result r;
  OK(lh_ledger_audit(l, &r));
  lh_ledger_close(l);
}

/* A lock held by another process past the busy timeout: an error naming it, nothing changed,
 * and the same call succeeds once the lock is gone. */
static void test_busy(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s", path_of("busy.db"));
  lh_ledger *l = NULL;
  OK(lh_ledger_open(path, &l));
  int64_t ids[1];
  lease_n(l, 1, 1, 1000, 2000, ids);
  sqlite3 *other = NULL;
  assert_int_equal(sqlite3_open(path, &other), SQLITE_OK);
  assert_int_equal(sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
  expect_err(lh_ledger_group_accept(l, 1, 0, "b", 1, NULL, 1500), LH_ERR_IO,
             "accepting group 1: database is locked (still locked by another process after");
  assert_non_null(strstr(lh_last_error(), path));
  assert_int_equal(sqlite3_exec(other, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(other);
  assert_int_equal(state_of(l, 1), LH_GROUP_LEASED);
  accept_body(l, 1, 0);
  assert_int_equal(state_of(l, 1), LH_GROUP_ACCEPTED);
  lh_ledger_close(l);
  /* a ledger this process may only read is refused at open (root may write anything) */
  if (geteuid() != 0) {
    assert_int_equal(chmod(path, 0444), 0);
    expect_err(lh_ledger_open(path, &l), LH_ERR_IO, "for writing");
    chmod(path, 0644);
  }
}

static void test_state_names(void **state) {
  (void)state;
  assert_string_equal(lh_group_state_name(LH_GROUP_LEASED), "leased");
  assert_string_equal(lh_group_state_name(LH_GROUP_EXPIRED), "expired");
  assert_string_equal(lh_group_state_name((lh_group_state)6), "unknown");
  assert_string_equal(lh_group_state_name((lh_group_state)-1), "unknown");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_state_names),
      cmocka_unit_test_setup_teardown(test_open_reopen, setup, teardown),
      cmocka_unit_test_setup_teardown(test_open_refusals, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lease_accept_train, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lease_refusals, setup, teardown),
      cmocka_unit_test_setup_teardown(test_expire_late_accept, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reject, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refute, setup, teardown),
      cmocka_unit_test_setup_teardown(test_worker_recent, setup, teardown),
      cmocka_unit_test_setup_teardown(test_worker_counts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_migrate_v1, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rewind, setup, teardown),
      cmocka_unit_test_setup_teardown(test_prune, setup, teardown),
      cmocka_unit_test_setup_teardown(test_versions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_audit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_parts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_accept_race, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kill9, setup, teardown),
      cmocka_unit_test_setup_teardown(test_busy, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
