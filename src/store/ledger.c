/* longhaul store: the ledger (include/longhaul/ledger.h; the schema is in docs/ARCHITECTURE.md,
 * "The ledger"). One SQLite connection in WAL mode with synchronous=FULL behind one mutex for
 * the changes, four more for the hot reads (they read the last commit while one is fsynced);
 * every statement is prepared once at open from the table below; every transaction commits
 * (fsynced) or rolls back whole. The changes of the submission path and the training thread are
 * group-committed (submit): those that arrive while a commit runs wait in a list, in order, and
 * one of their threads then writes them all in one transaction (one fsync), each caller
 * returning once the commit holding its change is durable; the long changes of the training
 * thread (an update's marks, pruning) go one part per commit. */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "longhaul/ledger.h"

_Static_assert(LH_GROUP_EXPIRED + 1 == LH_GROUP__COUNT, "group states");

/* Version 1 of the schema: what every ledger starts from (a new one is given it and then each
 * migration below, so a new ledger and a migrated one are the same). Group states are the
 * lh_group_state numbers. */
static const char SCHEMA_1[] =
    "CREATE TABLE workers ("
    " id INTEGER PRIMARY KEY,"
    " key BLOB NOT NULL UNIQUE CHECK (length(key) = 32),"
    " name TEXT NOT NULL,"
    " hardware TEXT NOT NULL,"
    " registered_ms INTEGER NOT NULL,"
    " last_seen_ms INTEGER NOT NULL) STRICT;"
    "CREATE TABLE leases ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " worker INTEGER NOT NULL REFERENCES workers (id),"
    " leased_ms INTEGER NOT NULL,"
    " expires_ms INTEGER NOT NULL,"
    " n_groups INTEGER NOT NULL) STRICT;"
    "CREATE INDEX leases_worker ON leases (worker);"
    "CREATE TABLE groups ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " lease INTEGER NOT NULL REFERENCES leases (id),"
    " task_index INTEGER NOT NULL,"
    " spec BLOB NOT NULL,"
    " state INTEGER NOT NULL CHECK (state BETWEEN 0 AND 5),"
    " version_used INTEGER NOT NULL DEFAULT -1,"
    " trained_at INTEGER NOT NULL DEFAULT -1,"
    " reason TEXT NOT NULL DEFAULT '',"
    " received_ms INTEGER NOT NULL DEFAULT -1,"
    " meta TEXT) STRICT;"
    "CREATE INDEX groups_state ON groups (state, id);"
    "CREATE INDEX groups_lease ON groups (lease);"
    "CREATE INDEX groups_trained_at ON groups (trained_at) WHERE state IN (3, 4);"
    "CREATE TABLE bodies ("
    " grp INTEGER PRIMARY KEY REFERENCES groups (id),"
    " body BLOB NOT NULL) STRICT;"
    "CREATE TABLE rewinds ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " version INTEGER NOT NULL,"
    " groups_back INTEGER NOT NULL DEFAULT 0,"
    " versions_forgotten INTEGER NOT NULL DEFAULT 0) STRICT;"
    "CREATE TABLE training_log ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " version INTEGER NOT NULL,"
    " grp INTEGER NOT NULL REFERENCES groups (id),"
    " what INTEGER NOT NULL CHECK (what IN (3, 4)),"
    " undone_by INTEGER REFERENCES rewinds (id)) STRICT;"
    "CREATE INDEX training_log_grp ON training_log (grp);"
    "CREATE INDEX training_log_live ON training_log (version) WHERE undone_by IS NULL;"
    "CREATE TABLE versions ("
    " version INTEGER PRIMARY KEY CHECK (version >= 0),"
    " parent INTEGER NOT NULL,"
    " slab_hash BLOB NOT NULL CHECK (length(slab_hash) = 32),"
    " manifest BLOB NOT NULL,"
    " published_ms INTEGER NOT NULL) STRICT;"
    "CREATE TABLE blobs ("
    " version INTEGER NOT NULL REFERENCES versions (version) ON DELETE CASCADE,"
    " hash BLOB NOT NULL CHECK (length(hash) = 32),"
    " kind INTEGER NOT NULL CHECK (kind IN (0, 1)),"
    " from_version INTEGER NOT NULL,"
    " size INTEGER NOT NULL CHECK (size >= 1),"
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
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT;";

/* Version 1 -> 2: each worker's groups are counted by state in worker_counts, kept by triggers
 * in the transactions that change a group's state, so a worker's record (read on every signed
 * request) is one row, not a pass over every group it ever had. The covering index
 * groups_lease_state that servers of version 1 created at open for that pass goes: it cost a
 * page of the WAL on every change of state. Runs in the transaction that sets user_version 2. */
#define WORKER_OF_NEW "(SELECT l.worker FROM leases l WHERE l.id = NEW.lease)"
static const char MIGRATE_2[] =
    "CREATE TABLE worker_counts ("
    " worker INTEGER PRIMARY KEY REFERENCES workers (id),"
    " leased INTEGER NOT NULL DEFAULT 0, accepted INTEGER NOT NULL DEFAULT 0,"
    " rejected INTEGER NOT NULL DEFAULT 0, trained INTEGER NOT NULL DEFAULT 0,"
    " dropped INTEGER NOT NULL DEFAULT 0, expired INTEGER NOT NULL DEFAULT 0) STRICT;"
    "INSERT INTO worker_counts SELECT w.id,"
    " count(g.id) FILTER (WHERE g.state = 0), count(g.id) FILTER (WHERE g.state = 1),"
    " count(g.id) FILTER (WHERE g.state = 2), count(g.id) FILTER (WHERE g.state = 3),"
    " count(g.id) FILTER (WHERE g.state = 4), count(g.id) FILTER (WHERE g.state = 5)"
    " FROM workers w LEFT JOIN leases l ON l.worker = w.id LEFT JOIN groups g ON g.lease = l.id"
    " GROUP BY w.id;"
    "CREATE TRIGGER workers_count_row AFTER INSERT ON workers BEGIN"
    " INSERT INTO worker_counts (worker) VALUES (NEW.id); END;"
    "CREATE TRIGGER groups_worker_insert AFTER INSERT ON groups BEGIN"
    " UPDATE worker_counts SET leased = leased + (NEW.state = 0),"
    " accepted = accepted + (NEW.state = 1), rejected = rejected + (NEW.state = 2),"
    " trained = trained + (NEW.state = 3), dropped = dropped + (NEW.state = 4),"
    " expired = expired + (NEW.state = 5) WHERE worker = " WORKER_OF_NEW "; END;"
    "CREATE TRIGGER groups_worker_update AFTER UPDATE OF state ON groups"
    " WHEN OLD.state <> NEW.state BEGIN"
    " UPDATE worker_counts SET leased = leased + (NEW.state = 0) - (OLD.state = 0),"
    " accepted = accepted + (NEW.state = 1) - (OLD.state = 1),"
    " rejected = rejected + (NEW.state = 2) - (OLD.state = 2),"
    " trained = trained + (NEW.state = 3) - (OLD.state = 3),"
    " dropped = dropped + (NEW.state = 4) - (OLD.state = 4),"
    " expired = expired + (NEW.state = 5) - (OLD.state = 5) WHERE worker = " WORKER_OF_NEW "; END;"
    "DROP INDEX IF EXISTS groups_lease_state;";

/* The migrations, in order: MIGRATIONS[v - 2] takes a ledger from version v - 1 to v. */
static const char *const MIGRATIONS[] = {MIGRATE_2};
_Static_assert(sizeof MIGRATIONS / sizeof *MIGRATIONS == LH_LEDGER_SCHEMA_VERSION - 1,
               "a migration per schema version after the first");

/* The columns of one worker row with its group counts (WORKER_GET, WORKERS): one row of each. */
#define WORKER_COLUMNS                                                                             \
  "SELECT w.key, w.name, w.registered_ms, w.last_seen_ms, c.leased, c.accepted, c.rejected,"       \
  " c.trained, c.dropped, c.expired FROM workers w JOIN worker_counts c ON c.worker = w.id "

/* A worker's (key ?1) `window` (?2) latest groups among those whose state is in CLASS, counted
 * by state, and the rejections among them whose reason starts with ?3 (not ''). Read newest
 * first through the worker's leases (leases_worker, newest first) and each lease's groups
 * (groups_lease): a group of a later lease has a higher id, so this is the order of the ids and
 * needs no sort, and the LIMIT stops the reading once the window is full. */
#define WORKER_RECENT_SQL(class)                                                                   \
  "SELECT count(*), count(*) FILTER (WHERE state = 1), count(*) FILTER (WHERE state = 2),"         \
  " count(*) FILTER (WHERE state = 3), count(*) FILTER (WHERE state = 4),"                         \
  " count(*) FILTER (WHERE state = 5), count(*) FILTER (WHERE state = 2 AND ?3 <> '' AND"          \
  " substr(reason, 1, length(?3)) = ?3) FROM (SELECT g.state AS state, g.reason AS reason"         \
  " FROM leases l JOIN groups g ON g.lease = l.id"                                                 \
  " WHERE l.worker = (SELECT id FROM workers WHERE key = ?1) AND " class " ORDER BY l.id DESC, "   \
                                                                         "g.id DESC LIMIT ?2)"

/* Every statement, prepared once at open. */
#define LEDGER_STMTS(X)                                                                            \
  X(BEGIN, "BEGIN IMMEDIATE")                                                                      \
  X(BEGIN_READ, "BEGIN DEFERRED")                                                                  \
  X(COMMIT, "COMMIT")                                                                              \
  X(ROLLBACK, "ROLLBACK")                                                                          \
  X(WORKER_ID, "SELECT id FROM workers WHERE key = ?1")                                            \
  X(WORKER_INSERT, "INSERT INTO workers (key, name, hardware, registered_ms, last_seen_ms)"        \
                   " VALUES (?1, ?2, ?3, ?4, ?4)")                                                 \
  X(WORKER_UPDATE, "UPDATE workers SET name = ?2, hardware = ?3,"                                  \
                   " last_seen_ms = max(last_seen_ms, ?4) WHERE id = ?1")                          \
  X(WORKER_SEEN, "UPDATE workers SET last_seen_ms = max(last_seen_ms, ?2) WHERE key = ?1")         \
  X(WORKER_HARDWARE, "SELECT hardware FROM workers WHERE key = ?1")                                \
  X(WORKER_GET, WORKER_COLUMNS "WHERE w.key = ?1")                                                 \
  X(WORKERS, WORKER_COLUMNS "ORDER BY w.id")                                                       \
  X(WORKER_RECENT_SUBMITTED, WORKER_RECENT_SQL("g.state IN (1, 2, 3, 4)"))                         \
  X(WORKER_RECENT_SETTLED, WORKER_RECENT_SQL("g.state <> 0"))                                      \
  X(LEASE_INSERT, "INSERT INTO leases (worker, leased_ms, expires_ms, n_groups)"                   \
                  " VALUES (?1, ?2, ?3, ?4)")                                                      \
  X(GROUP_INSERT, "INSERT INTO groups (lease, task_index, spec, state) VALUES (?1, ?2, ?3, 0)")    \
  X(GROUP_GET, "SELECT g.id, g.lease, w.key, g.task_index, g.spec, g.state, g.version_used,"       \
               " g.trained_at, g.reason, g.meta,"                                                  \
               " (SELECT length(b.body) FROM bodies b WHERE b.grp = g.id),"                        \
               " l.leased_ms, l.expires_ms, g.received_ms"                                         \
               " FROM groups g JOIN leases l ON l.id = g.lease JOIN workers w ON w.id = l.worker"  \
               " WHERE g.id = ?1")                                                                 \
  X(GROUP_STATE, "SELECT state, trained_at FROM groups WHERE id = ?1")                             \
  X(GROUP_ACCEPT, "UPDATE groups SET state = 1, version_used = ?2, meta = ?3, received_ms = ?4"    \
                  " WHERE id = ?1")                                                                \
  X(BODY_PUT, "INSERT INTO bodies (grp, body) VALUES (?1, ?2)")                                    \
  X(GROUP_REJECT, "UPDATE groups SET state = 2, version_used = ?2, reason = ?3,"                   \
                  " received_ms = ?4 WHERE id = ?1")                                               \
  X(GROUP_REFUTE, "UPDATE groups SET state = 2, reason = ?2, received_ms = ?3"                     \
                  " WHERE id = ?1 AND state = 1")                                                  \
  X(BODY_GET, "SELECT body FROM bodies WHERE grp = ?1")                                            \
  X(EXPIRED_LIST, "SELECT g.id FROM groups g JOIN leases l ON l.id = g.lease"                      \
                  " WHERE g.state = 0 AND l.expires_ms < ?1 ORDER BY g.id")                        \
  X(GROUP_EXPIRE, "UPDATE groups SET state = 5 WHERE id = ?1 AND state = 0")                       \
  X(ACCEPTED_LIST, "SELECT id FROM groups WHERE state = 1 ORDER BY id")                            \
  X(GROUP_TRAIN, "UPDATE groups SET state = ?2, trained_at = ?3, reason = ?4"                      \
                 " WHERE id = ?1 AND state = 1")                                                   \
  X(LOG_INSERT, "INSERT INTO training_log (version, grp, what) VALUES (?1, ?2, ?3)")               \
  X(LOG_ALL, "SELECT seq, version, grp, what, coalesce(undone_by, 0) FROM training_log"            \
             " ORDER BY seq")                                                                      \
  X(REWIND_INSERT, "INSERT INTO rewinds (version) VALUES (?1)")                                    \
  X(REWIND_SET, "UPDATE rewinds SET groups_back = ?2, versions_forgotten = ?3 WHERE id = ?1")      \
  X(LOG_UNDO, "UPDATE training_log SET undone_by = ?2 WHERE undone_by IS NULL AND version > ?1")   \
  X(GROUPS_BACK, "UPDATE groups SET state = 1, trained_at = -1, reason = ''"                       \
                 " WHERE state IN (3, 4) AND trained_at > ?1")                                     \
  X(BLOBS_FORGET, "DELETE FROM blobs WHERE version > ?1")                                          \
  X(VERSIONS_FORGET, "DELETE FROM versions WHERE version > ?1")                                    \
  X(SETTING_GET, "SELECT value FROM settings WHERE key = ?1")                                      \
  X(SETTING_PUT, "INSERT INTO settings (key, value) VALUES (?1, ?2)"                               \
                 " ON CONFLICT (key) DO UPDATE SET value = excluded.value")                        \
  /* the bodies still there, not every trained group (CROSS JOIN: bodies is the outer loop); */    \
  /* ?2 of them at most */                                                                         \
  X(BODIES_PRUNE,                                                                                  \
    "DELETE FROM bodies WHERE grp IN (SELECT b.grp FROM bodies b CROSS JOIN groups g"              \
    " ON g.id = b.grp WHERE g.state IN (3, 4) AND g.trained_at <= ?1 LIMIT ?2)")                   \
  X(VERSION_GET, "SELECT parent, slab_hash, manifest FROM versions WHERE version = ?1")            \
  X(VERSION_INSERT, "INSERT INTO versions (version, parent, slab_hash, manifest, published_ms)"    \
                    " VALUES (?1, ?2, ?3, ?4, ?5)")                                                \
  X(BLOB_INSERT, "INSERT INTO blobs (version, hash, kind, from_version, size)"                     \
                 " VALUES (?1, ?2, ?3, ?4, ?5)")                                                   \
  X(VERSION_BLOBS, "SELECT hash, kind, from_version, size FROM blobs WHERE version = ?1"           \
                   " ORDER BY hash")                                                               \
  X(BLOB_FIND, "SELECT version, kind, from_version, size FROM blobs WHERE hash = ?1"               \
               " ORDER BY version LIMIT 1")                                                        \
  X(MAX_TASK, "SELECT MAX(task_index) FROM groups")                                                \
  X(LATEST, "SELECT max(version) FROM versions")                                                   \
  X(STATE_COUNTS, "SELECT state, n FROM state_counts")                                             \
  X(STATS, "SELECT (SELECT count(*) FROM workers), (SELECT count(*) FROM leases),"                 \
           " (SELECT count(*) FROM versions),"                                                     \
           " (SELECT coalesce(sum(size), 0) FROM (SELECT max(size) AS size FROM blobs"             \
           " GROUP BY hash)),"                                                                     \
           " (SELECT coalesce(sum(length(body)), 0) FROM bodies),"                                 \
           " (SELECT count(*) FROM rewinds)")                                                      \
  X(LOG_COUNTS, "SELECT count(*) FILTER (WHERE undone_by IS NULL),"                                \
                " count(*) FILTER (WHERE undone_by IS NOT NULL) FROM training_log")                \
  X(REASONS, "SELECT reason, count(*) AS n FROM groups WHERE state = 2 GROUP BY reason"            \
             " ORDER BY n DESC, reason LIMIT ?1")                                                  \
  X(AUDIT_COUNTS, "SELECT state, count(*) FROM groups GROUP BY state")                             \
  X(AUDIT_TWICE, "SELECT grp, count(*), min(version), max(version) FROM training_log"              \
                 " WHERE undone_by IS NULL GROUP BY grp HAVING count(*) > 1 ORDER BY grp LIMIT 1") \
  X(AUDIT_NO_EVENT, "SELECT g.id, g.state, g.trained_at FROM groups g WHERE g.state IN (3, 4)"     \
                    " AND NOT EXISTS (SELECT 1 FROM training_log t WHERE t.grp = g.id"             \
                    " AND t.undone_by IS NULL AND t.what = g.state AND t.version = g.trained_at)"  \
                    " ORDER BY g.id LIMIT 1")                                                      \
  X(AUDIT_STRAY_EVENT, "SELECT t.grp, t.what, t.version, coalesce(g.state, -1),"                   \
                       " coalesce(g.trained_at, -1) FROM training_log t"                           \
                       " LEFT JOIN groups g ON g.id = t.grp WHERE t.undone_by IS NULL"             \
                       " AND (g.id IS NULL OR g.state <> t.what OR g.trained_at <> t.version)"     \
                       " ORDER BY t.grp LIMIT 1")                                                  \
  X(AUDIT_BEYOND,                                                                                  \
    "SELECT id, state, trained_at FROM groups WHERE state IN (3, 4) AND trained_at > ?1"           \
    " ORDER BY id LIMIT 1")                                                                        \
  X(AUDIT_NO_BODY, "SELECT g.id FROM groups g WHERE g.state = 1"                                   \
                   " AND NOT EXISTS (SELECT 1 FROM bodies b WHERE b.grp = g.id)"                   \
                   " ORDER BY g.id LIMIT 1")                                                       \
  X(AUDIT_TRAINED_AT, "SELECT id, state, trained_at FROM groups WHERE CASE WHEN state IN (3, 4)"   \
                      " THEN trained_at < 0 ELSE trained_at <> -1 END ORDER BY id LIMIT 1")        \
  X(AUDIT_WORKER_COUNTS,                                                                           \
    "SELECT w.id, c.worker IS NULL, c.leased, c.accepted, c.rejected, c.trained, c.dropped,"       \
    " c.expired, coalesce(g.n0, 0), coalesce(g.n1, 0), coalesce(g.n2, 0), coalesce(g.n3, 0),"      \
    " coalesce(g.n4, 0), coalesce(g.n5, 0) FROM workers w"                                         \
    " LEFT JOIN worker_counts c ON c.worker = w.id LEFT JOIN (SELECT worker,"                      \
    " count(*) FILTER (WHERE state = 0) AS n0, count(*) FILTER (WHERE state = 1) AS n1,"           \
    " count(*) FILTER (WHERE state = 2) AS n2, count(*) FILTER (WHERE state = 3) AS n3,"           \
    " count(*) FILTER (WHERE state = 4) AS n4, count(*) FILTER (WHERE state = 5) AS n5"            \
    " FROM groups JOIN leases ON leases.id = groups.lease GROUP BY worker) g ON g.worker = w.id"   \
    " WHERE c.worker IS NULL"                                                                      \
    " OR c.leased <> coalesce(g.n0, 0) OR c.accepted <> coalesce(g.n1, 0)"                         \
    " OR c.rejected <> coalesce(g.n2, 0) OR c.trained <> coalesce(g.n3, 0)"                        \
    " OR c.dropped <> coalesce(g.n4, 0) OR c.expired <> coalesce(g.n5, 0) ORDER BY w.id LIMIT 1")

enum {
#define LEDGER_STMT_ENUM(name, sql) ST_##name,
  LEDGER_STMTS(LEDGER_STMT_ENUM)
#undef LEDGER_STMT_ENUM
      ST__COUNT
};

static const char *const STMT_SQL[ST__COUNT] = {
#define LEDGER_STMT_SQL(name, sql) sql,
    LEDGER_STMTS(LEDGER_STMT_SQL)
#undef LEDGER_STMT_SQL
};

#define SETTING_PRUNED_TO "pruned_to"

#define READERS 4 /* read connections (each behind its own mutex) */
/* WAL pages after which the WAL is checkpointed (SQLite's own automatic threshold) */
#define CHECKPOINT_PAGES 1000

typedef struct write_req write_req;
/* Writes a change, or its next part, inside the open transaction of a group commit; *more when
 * parts are left for the next commits. It checks what may refuse it before it writes anything,
 * and sets r->wrote before its first write: a failure before that fails this change alone, one
 * after it the whole commit (no savepoints: their statement journals cost more than the writes). */
typedef lh_err (*write_fn)(lh_ledger *l, write_req *r, bool *more);

/* One change waiting for a group commit, on its caller's stack (submit). */
struct write_req {
  write_fn write;
  void *arg;         /* what write reads, and fills in */
  bool accept;       /* an lh_ledger_group_accept (counted by lh_ledger_accept_stats) */
  char doing[96];    /* "accepting group 12", for its errors */
  bool more;         /* a part was written, more are to come (set under mu) */
  bool wrote;        /* this commit has written some of it (set by write) */
  lh_err e;          /* its result, set by the thread that committed it */
  char msg[1024];    /* and the error's message (lh_last_error is per thread) */
  bool done;         /* set under amu, once e is final */
  pthread_cond_t cv; /* signalled when done, or when it is its turn to commit */
  write_req *next;
};

struct lh_ledger {
  pthread_mutex_t mu; /* held for the whole of every call (the connection's) */
  sqlite3 *db;
  char *path;
  sqlite3_stmt *st[ST__COUNT];
  /* Connections for the hot reads (workers, groups, versions, blobs, stats): in WAL mode they
   * read the last commit while a commit is being written and fsynced on this one. A thread
   * always uses the same one (reader_of). None in a reader itself. */
  struct lh_ledger *readers[READERS];
  /* Checkpoints: not in the commits (SQLite's automatic checkpoint would copy the WAL into the
   * database and fsync it inside the commit that crosses the threshold, with every writer
   * waiting), but on a connection of their own after a change, by the thread that made it, once
   * mu is released (maybe_checkpoint): PASSIVE, so commits go on meanwhile. */
  struct lh_ledger *checkpointer;
  atomic_int wal_pages;      /* the WAL's pages after the last commit (wal_hook) */
  atomic_int checkpoint_at;  /* wal_pages when the last checkpoint began */
  atomic_bool checkpointing; /* one runs */
  pthread_mutex_t amu;       /* the changes waiting (below); never taken while holding mu */

  write_req *pending, **tail;      /* changes not yet taken by a commit, in arrival order */
  bool committing;                 /* a thread is writing a group commit */
  int64_t accept_commits, accepts; /* group commits holding accepts, and the accepts */
};

static const char *const STATE_NAMES[LH_GROUP__COUNT] = {"leased",  "accepted", "rejected",
                                                         "trained", "dropped",  "expired"};

const char *lh_group_state_name(lh_group_state s) {
  return (unsigned)s < LH_GROUP__COUNT ? STATE_NAMES[s] : "unknown";
}

static const char *state_name_i(int64_t s) {
  return s >= 0 && s < LH_GROUP__COUNT ? STATE_NAMES[s] : "unknown";
}

const char *lh_ledger_path(const lh_ledger *l) {
  return l->path;
}

/* ---------------------------------------------------------------- errors and statements */

static lh_err code_of(int rc) {
  switch (rc & 0xff) {
  case SQLITE_NOMEM:
    return LH_ERR_NOMEM;
  case SQLITE_NOTADB:
  case SQLITE_CORRUPT:
    return LH_ERR_FORMAT;
  case SQLITE_TOOBIG:
    return LH_ERR_LIMIT;
  case SQLITE_CONSTRAINT:
  case SQLITE_MISMATCH:
  case SQLITE_RANGE:
    return LH_ERR_INVAL;
  default:
    return LH_ERR_IO;
  }
}

/* "PATH: DOING: SQLite's message (its code)". */
static lh_err fail(lh_ledger *l, int rc, const char *doing) {
  const char *msg = l->db ? sqlite3_errmsg(l->db) : sqlite3_errstr(rc);
  if ((rc & 0xff) == SQLITE_BUSY)
    return lh_errorf(LH_ERR_IO, "%s: %s: %s (still locked by another process after %d ms)", l->path,
                     doing, msg, LH_LEDGER_BUSY_MS);
  return lh_errorf(code_of(rc), "%s: %s: %s (%s)", l->path, doing, msg, sqlite3_errstr(rc));
}

static void reset(sqlite3_stmt *s) {
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
}

/* Steps s once: *row says whether a row is there to read. On failure s is reset. */
static lh_err step(lh_ledger *l, sqlite3_stmt *s, bool *row, const char *doing) {
  *row = false;
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
    *row = rc == SQLITE_ROW;
    return LH_ERR_OK;
  }
  lh_err e = fail(l, rc, doing);
  reset(s);
  return e;
}

/* Runs s (bound already) to its end, then resets it. */
static lh_err run(lh_ledger *l, sqlite3_stmt *s, const char *doing) {
  bool row = true;
  lh_err e = LH_ERR_OK;
  while (row && !(e = step(l, s, &row, doing))) {
  }
  if (!e) reset(s);
  return e;
}

/* A failed sqlite3_bind_* (its code is the connection's latest). */
static lh_err bind_fail(lh_ledger *l, sqlite3_stmt *s, const char *doing) {
  lh_err e = fail(l, sqlite3_errcode(l->db), doing);
  reset(s);
  return e;
}

static lh_err begin(lh_ledger *l, const char *doing) {
  return run(l, l->st[ST_BEGIN], doing);
}

static lh_err commit(lh_ledger *l, const char *doing) {
  return run(l, l->st[ST_COMMIT], doing);
}

/* Undoes the open transaction, if any, keeping the caller's error message. */
static void rollback(lh_ledger *l) {
  if (sqlite3_get_autocommit(l->db)) return;
  sqlite3_step(l->st[ST_ROLLBACK]);
  sqlite3_reset(l->st[ST_ROLLBACK]);
}

/* Ends a call: commits when e is OK (returning the commit's error), else rolls back. */
static lh_err finish(lh_ledger *l, lh_err e, const char *doing) {
  if (!e) e = commit(l, doing);
  if (e) rollback(l);
  return e;
}

/* Bounded text from outside: NULL is "", more than max bytes is LH_ERR_LIMIT. */
static lh_err check_text(lh_ledger *l, const char *s, size_t max, const char *field, size_t *len) {
  size_t n = s ? strnlen(s, max + 1) : 0;
  if (n > max) return lh_errorf(LH_ERR_LIMIT, "%s: %s: more than %zu bytes", l->path, field, max);
  *len = n;
  return LH_ERR_OK;
}

static void key_hex(const uint8_t key[LH_LEDGER_KEY_BYTES], char hex[2 * LH_LEDGER_KEY_BYTES + 1]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < LH_LEDGER_KEY_BYTES; i++) {
    hex[2 * i] = digits[key[i] >> 4];
    hex[2 * i + 1] = digits[key[i] & 15];
  }
  hex[2 * LH_LEDGER_KEY_BYTES] = '\0';
}

/* Copies column c of s's row as a string into buf (cap bytes, truncated). */
static void column_text(sqlite3_stmt *s, int c, char *buf, size_t cap) {
  const unsigned char *t = sqlite3_column_text(s, c);
  size_t n = t ? (size_t)sqlite3_column_bytes(s, c) : 0;
  if (n >= cap) n = cap - 1;
  if (n) memcpy(buf, t, n);
  buf[n] = '\0';
}

/* A malloc'd copy of column c's bytes (*len of them) with a NUL after them; NULL for none. */
static lh_err column_copy(lh_ledger *l, sqlite3_stmt *s, int c, void **out, size_t *len,
                          const char *doing) {
  const void *p = sqlite3_column_blob(s, c);
  size_t n = (size_t)sqlite3_column_bytes(s, c);
  *out = NULL;
  *len = 0;
  if (!p) {
    if (sqlite3_errcode(l->db) == SQLITE_NOMEM) return fail(l, SQLITE_NOMEM, doing);
    return LH_ERR_OK;
  }
  char *copy = malloc(n + 1);
  if (!copy)
    return lh_errorf(LH_ERR_NOMEM, "%s: %s: cannot allocate %zu bytes", l->path, doing, n + 1);
  memcpy(copy, p, n);
  copy[n] = '\0';
  *out = copy;
  *len = n;
  return LH_ERR_OK;
}

/* Appends v to a growing array of int64_t. */
static lh_err push_id(lh_ledger *l, int64_t **a, int *n, int *cap, int64_t v, const char *doing) {
  if (*n == *cap) {
    if (*cap > INT_MAX / 2)
      return lh_errorf(LH_ERR_LIMIT, "%s: %s: more than %d rows", l->path, doing, INT_MAX / 2);
    int c = *cap ? 2 * *cap : 64;
    int64_t *p = realloc(*a, (size_t)c * sizeof *p);
    if (!p) return lh_errorf(LH_ERR_NOMEM, "%s: %s: cannot allocate %d ids", l->path, doing, c);
    *a = p;
    *cap = c;
  }
  (*a)[(*n)++] = v;
  return LH_ERR_OK;
}

/* Runs a statement whose first column is an id, collecting every row's id. */
static lh_err collect_ids(lh_ledger *l, sqlite3_stmt *s, int64_t **ids, int *n, int *cap,
                          const char *doing) {
  bool row;
  lh_err e;
  while (!(e = step(l, s, &row, doing)) && row) {
    if ((e = push_id(l, ids, n, cap, sqlite3_column_int64(s, 0), doing))) {
      reset(s);
      return e;
    }
  }
  if (!e) reset(s);
  return e;
}

/* ---------------------------------------------------------------- open and close */

static lh_err pragma_int(lh_ledger *l, const char *sql, int64_t *v, const char *doing) {
  sqlite3_stmt *s = NULL;
  int rc = sqlite3_prepare_v2(l->db, sql, -1, &s, NULL);
  if (rc != SQLITE_OK) return fail(l, rc, doing);
  bool row;
  lh_err e = step(l, s, &row, doing);
  if (!e) *v = row ? sqlite3_column_int64(s, 0) : 0;
  sqlite3_finalize(s);
  return e;
}

static lh_err exec(lh_ledger *l, const char *sql, const char *doing) {
  int rc = sqlite3_exec(l->db, sql, NULL, NULL, NULL);
  return rc == SQLITE_OK ? LH_ERR_OK : fail(l, rc, doing);
}

/* journal_mode=WAL, and that it took (a file system without shared memory refuses it). */
static lh_err set_wal(lh_ledger *l) {
  sqlite3_stmt *s = NULL;
  int rc = sqlite3_prepare_v2(l->db, "PRAGMA journal_mode = WAL", -1, &s, NULL);
  if (rc != SQLITE_OK) return fail(l, rc, "setting journal_mode=WAL");
  bool row;
  lh_err e = step(l, s, &row, "setting journal_mode=WAL");
  if (!e) {
    char mode[32] = "";
    if (row) column_text(s, 0, mode, sizeof mode);
    if (strcmp(mode, "wal"))
      e = lh_errorf(LH_ERR_UNSUPPORTED,
                    "%s: journal_mode=WAL did not take (the mode is \"%s\"): the ledger needs a "
                    "local file system with shared memory",
                    l->path, mode);
  }
  sqlite3_finalize(s);
  return e;
}

/* What the file is: *fresh for an empty database (to be given the schema); else a ledger of
 * schema version *version, 1 .. LH_LEDGER_SCHEMA_VERSION (an older one is migrated); anything
 * else refused. */
static lh_err identify(lh_ledger *l, bool *fresh, int64_t *version) {
  int64_t app = 0, ver = 0, tables = 0;
  lh_err e;
  if ((e = pragma_int(l, "PRAGMA application_id", &app, "reading the application id")) ||
      (e = pragma_int(l, "PRAGMA user_version", &ver, "reading the schema version")) ||
      (e = pragma_int(l, "SELECT count(*) FROM sqlite_schema", &tables, "reading the schema"))) {
    if (e != LH_ERR_FORMAT) return e;
    char why[256]; /* a copy: lh_errorf writes where lh_last_error points */
    snprintf(why, sizeof why, "%s", sqlite3_errmsg(l->db));
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: not a longhaul ledger: SQLite says \"%s\" (not an SQLite database, "
                     "or a damaged one)",
                     l->path, why);
  }
  *fresh = false;
  *version = ver;
  if (app == 0 && ver == 0 && tables == 0) {
    *fresh = true;
    return LH_ERR_OK;
  }
  if (app != LH_LEDGER_APPLICATION_ID)
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: an SQLite database of another program (application_id 0x%08" PRIx64
                     ", user_version %" PRId64 ", %" PRId64 " schema entries), not a longhaul "
                     "ledger (application_id 0x%08x)",
                     l->path, (uint64_t)app & 0xffffffffu, ver, tables, LH_LEDGER_APPLICATION_ID);
  if (ver < 1 || ver > LH_LEDGER_SCHEMA_VERSION)
    return lh_errorf(LH_ERR_UNSUPPORTED,
                     "%s: ledger schema version %" PRId64
                     ", this longhaul reads versions 1 .. %d (older ones migrated to %d)%s",
                     l->path, ver, LH_LEDGER_SCHEMA_VERSION, LH_LEDGER_SCHEMA_VERSION,
                     ver > LH_LEDGER_SCHEMA_VERSION ? " (written by a newer longhaul)" : "");
  return LH_ERR_OK;
}

/* fsyncs the directory that holds path, so a new file's name survives a crash. */
static lh_err sync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate its directory's name", path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  lh_err e = LH_ERR_OK;
  if (fd < 0 || fsync(fd) != 0)
    e = lh_errorf(LH_ERR_IO, "%s: cannot fsync its directory %s", path, dir);
  if (fd >= 0) close(fd);
  free(dir);
  return e;
}

/* Gives a fresh database the schema (version 1 and every migration), or takes an older ledger
 * to LH_LEDGER_SCHEMA_VERSION, in one transaction (another process may be doing the same: the
 * second sees the first's work once it has the write lock, and does nothing). */
static lh_err upgrade(lh_ledger *l) {
  const char *doing = "creating the schema";
  lh_err e = exec(l, "BEGIN IMMEDIATE", doing);
  if (e) return e;
  bool fresh = false;
  int64_t ver = 0;
  if (!(e = identify(l, &fresh, &ver)) && fresh) e = exec(l, SCHEMA_1, doing);
  if (!e && fresh) ver = 1;
  char what[96];
  for (int64_t v = ver + 1; !e && v <= LH_LEDGER_SCHEMA_VERSION; v++) {
    snprintf(what, sizeof what, "migrating the schema from version %" PRId64 " to %" PRId64, v - 1,
             v);
    e = exec(l, MIGRATIONS[v - 2], what);
  }
  if (!e && (fresh || ver < LH_LEDGER_SCHEMA_VERSION)) {
    char pragmas[128];
    snprintf(pragmas, sizeof pragmas, "PRAGMA application_id = %d; PRAGMA user_version = %d;",
             LH_LEDGER_APPLICATION_ID, LH_LEDGER_SCHEMA_VERSION);
    e = exec(l, pragmas, "setting the schema version");
  }
  if (!e) e = exec(l, "COMMIT", doing);
  if (e) {
    if (!sqlite3_get_autocommit(l->db)) sqlite3_exec(l->db, "ROLLBACK", NULL, NULL, NULL);
    return e;
  }
  return fresh ? sync_dir(l->path) : LH_ERR_OK;
}

static lh_err configure(lh_ledger *l) {
  int64_t fk = 0;
  lh_err e;
  bool fresh = false;
  int rc = sqlite3_busy_timeout(l->db, LH_LEDGER_BUSY_MS);
  if (rc != SQLITE_OK) return fail(l, rc, "setting the busy timeout");
  /* SQLite falls back to reading a file it may not write; the server must write */
  if (sqlite3_db_readonly(l->db, "main") == 1)
    return lh_errorf(LH_ERR_IO, "%s: cannot open the ledger for writing (only for reading)",
                     l->path);
  int64_t version = 0;
  if ((e = identify(l, &fresh, &version))) return e;
  if ((e = set_wal(l))) return e;
  if ((e = exec(l,
                "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;"
                " PRAGMA journal_size_limit = 67108864;",
                "setting synchronous=FULL and foreign_keys=ON")))
    return e;
  if ((e = pragma_int(l, "PRAGMA foreign_keys", &fk, "reading foreign_keys"))) return e;
  if (fk != 1)
    return lh_errorf(LH_ERR_UNSUPPORTED, "%s: this SQLite does not enforce foreign keys", l->path);
  if ((fresh || version < LH_LEDGER_SCHEMA_VERSION) && (e = upgrade(l))) return e;
  for (int i = 0; i < ST__COUNT; i++) {
    rc = sqlite3_prepare_v3(l->db, STMT_SQL[i], -1, SQLITE_PREPARE_PERSISTENT, &l->st[i], NULL);
    if (rc != SQLITE_OK) {
      char doing[96];
      snprintf(doing, sizeof doing, "preparing statement %d of the schema version %d", i,
               LH_LEDGER_SCHEMA_VERSION);
      return fail(l, rc, doing);
    }
  }
  return LH_ERR_OK;
}

static int wal_hook(void *ud, sqlite3 *db, const char *name, int pages) {
  (void)db;
  (void)name;
  atomic_store(&((lh_ledger *)ud)->wal_pages, pages);
  return SQLITE_OK;
}

/* After a change, with mu released: a PASSIVE checkpoint once the WAL has grown by
 * CHECKPOINT_PAGES since the last one began (or restarted since), unless one runs. A checkpoint
 * that fails is tried again after the next change (the WAL stays valid meanwhile). */
static void maybe_checkpoint(lh_ledger *l) {
  int pages = atomic_load(&l->wal_pages), at = atomic_load(&l->checkpoint_at);
  if (!l->checkpointer || (pages - at < CHECKPOINT_PAGES && pages >= at) ||
      atomic_exchange(&l->checkpointing, true))
    return;
  atomic_store(&l->checkpoint_at, pages);
  pthread_mutex_lock(&l->checkpointer->mu);
  int rc =
      sqlite3_wal_checkpoint_v2(l->checkpointer->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
  pthread_mutex_unlock(&l->checkpointer->mu);
  if (rc != SQLITE_OK) atomic_store(&l->checkpoint_at, 0);
  atomic_store(&l->checkpointing, false);
}

static lh_err open_conn(const char *path, bool reader, lh_ledger **out) {
  *out = NULL;
  lh_ledger *l = calloc(1, sizeof *l);
  if (!l || !(l->path = strdup(path))) {
    free(l);
    return lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate the ledger", path);
  }
  pthread_mutex_init(&l->mu, NULL);
  pthread_mutex_init(&l->amu, NULL);
  l->tail = &l->pending;
  int rc = sqlite3_open_v2(path, &l->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
  lh_err e;
  if (rc != SQLITE_OK) {
    e = lh_errorf(rc == SQLITE_NOMEM ? LH_ERR_NOMEM : LH_ERR_IO, "%s: cannot open the ledger: %s",
                  path, l->db ? sqlite3_errmsg(l->db) : sqlite3_errstr(rc));
  } else {
    sqlite3_extended_result_codes(l->db, 1);
    e = configure(l);
  }
  for (int i = 0; !e && !reader && i < READERS; i++)
    e = open_conn(path, true, &l->readers[i]);
  if (!e && !reader) e = open_conn(path, true, &l->checkpointer);
  if (!e && !reader) {
    sqlite3_wal_autocheckpoint(l->db, 0);
    sqlite3_wal_hook(l->db, wal_hook, l);
  }
  if (e) {
    lh_ledger_close(l);
    return e;
  }
  *out = l;
  return LH_ERR_OK;
}

/* The read connection of the calling thread: threads are spread over the readers in the order
 * they first read, so the HTTP threads rarely wait for one another. */
static lh_ledger *reader_of(lh_ledger *l) {
  static atomic_uint next_slot;
  static _Thread_local unsigned slot = UINT_MAX;
  if (!l->readers[0]) return l;
  if (slot == UINT_MAX) slot = atomic_fetch_add(&next_slot, 1u);
  return l->readers[slot % READERS];
}

lh_err lh_ledger_open(const char *path, lh_ledger **out) {
  return open_conn(path, false, out);
}

void lh_ledger_close(lh_ledger *l) {
  if (!l) return;
  for (int i = 0; i < READERS; i++)
    lh_ledger_close(l->readers[i]);
  lh_ledger_close(l->checkpointer);
  for (int i = 0; i < ST__COUNT; i++)
    sqlite3_finalize(l->st[i]);
  sqlite3_close(l->db);
  pthread_mutex_destroy(&l->mu);
  pthread_mutex_destroy(&l->amu);
  free(l->path);
  free(l);
}

/* ---------------------------------------------------------------- group commits */

/* Whether a change's failure leaves the transaction as it was (a refused change, nothing of it
 * written: a group in another state, an unknown worker), so that the commit goes on without it. */
static bool failed_alone(lh_ledger *l, const write_req *r, lh_err e) {
  return !r->wrote && !sqlite3_get_autocommit(l->db) && e != LH_ERR_IO && e != LH_ERR_NOMEM &&
         e != LH_ERR_FORMAT;
}

static void set_result(write_req *r, lh_err e) {
  r->e = e;
  if (e) snprintf(r->msg, sizeof r->msg, "%s", lh_last_error());
}

/* One group commit: each change of the list (or its next part), in one transaction. A change
 * refused before it wrote fails alone; any other failure fails every change of the list, and
 * none of them is written by this commit. Caller holds mu. */
static void write_batch(lh_ledger *l, write_req *list) {
  char doing[160];
  int n = 0;
  for (write_req *r = list; r; r = r->next)
    n++;
  if (n == 1)
    snprintf(doing, sizeof doing, "%s", list->doing);
  else
    snprintf(doing, sizeof doing, "%d changes in one commit (first: %s)", n, list->doing);
  lh_err e = begin(l, doing);
  for (write_req *r = list; !e && r; r = r->next) {
    r->more = r->wrote = false;
    lh_err ei = r->write(l, r, &r->more);
    if (ei && !failed_alone(l, r, ei)) {
      e = ei;
    } else if (ei) {
      set_result(r, ei);
      r->more = false;
    }
  }
  e = finish(l, e, doing);
  if (e) {
    char why[1024];
    snprintf(why, sizeof why, "%s", lh_last_error());
    for (write_req *r = list; r; r = r->next) {
      r->e = e;
      r->more = false;
      snprintf(r->msg, sizeof r->msg, "%s", why);
    }
  }
}

/* Writes r in a group commit and returns its result once the commit holding it (its last part)
 * is durable. The changes that arrive while a commit is being written wait in a list; the
 * thread first in line, once that commit ends, writes all of them in the next one, its own
 * among them, and wakes each whose change is done. A change in parts stays first in line until
 * its last part is written, one part per commit. */
static lh_err submit(lh_ledger *l, write_req *r) {
  r->e = LH_ERR_OK;
  r->done = r->more = false;
  r->next = NULL;
  pthread_cond_init(&r->cv, NULL);
  pthread_mutex_lock(&l->amu);
  *l->tail = r;
  l->tail = &r->next;
  while (!r->done) {
    if (l->committing) { /* woken when done, or first in line when that commit ends */
      pthread_cond_wait(&r->cv, &l->amu);
      continue;
    }
    write_req *list = l->pending;
    l->pending = NULL;
    l->tail = &l->pending;
    l->committing = true;
    pthread_mutex_unlock(&l->amu);
    pthread_mutex_lock(&l->mu);
    write_batch(l, list);
    pthread_mutex_unlock(&l->mu);
    pthread_mutex_lock(&l->amu);
    write_req *left = NULL, **left_tail = &left; /* changes with parts still to write */
    bool accepts = false;
    while (list) { /* a waiter returns (its write_req goes) once done is set and amu is free */
      write_req *next = list->next;
      if (list->more) {
        list->next = NULL;
        *left_tail = list;
        left_tail = &list->next;
      } else {
        accepts |= list->accept;
        l->accepts += list->accept && list->e == LH_ERR_OK;
        list->done = true;
        pthread_cond_signal(&list->cv);
      }
      list = next;
    }
    if (left) { /* first in line again, before what arrived meanwhile */
      *left_tail = l->pending;
      if (!l->pending) l->tail = left_tail;
      l->pending = left;
    }
    l->accept_commits += accepts;
    l->committing = false;
    if (l->pending) pthread_cond_signal(&l->pending->cv); /* the next commit is its thread's */
    pthread_mutex_unlock(&l->amu);
    maybe_checkpoint(l); /* the others are answered already */
    pthread_mutex_lock(&l->amu);
  }
  pthread_mutex_unlock(&l->amu);
  pthread_cond_destroy(&r->cv);
  if (r->e) return lh_errorf(r->e, "%s", r->msg);
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- workers */

/* The row id of a worker's key; LH_ERR_NOTFOUND naming it. */
static lh_err worker_id(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES], int64_t *id,
                        const char *doing) {
  sqlite3_stmt *s = l->st[ST_WORKER_ID];
  if (sqlite3_bind_blob(s, 1, key, LH_LEDGER_KEY_BYTES, SQLITE_STATIC))
    return bind_fail(l, s, doing);
  bool row;
  lh_err e = step(l, s, &row, doing);
  if (e) return e;
  if (row) *id = sqlite3_column_int64(s, 0);
  reset(s);
  if (!row) {
    char hex[2 * LH_LEDGER_KEY_BYTES + 1];
    key_hex(key, hex);
    return lh_errorf(LH_ERR_NOTFOUND, "%s: %s: no worker with key %s is registered", l->path, doing,
                     hex);
  }
  return LH_ERR_OK;
}

static lh_err worker_register(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES],
                              const char *name, const char *hardware, int64_t now_ms,
                              bool *is_new) {
  const char *doing = "registering a worker";
  size_t name_len = 0, hw_len = 0;
  lh_err e;
  if ((e = check_text(l, name, LH_LEDGER_NAME_MAX, "worker name", &name_len)) ||
      (e = check_text(l, hardware, LH_LEDGER_HARDWARE_MAX, "worker hardware", &hw_len)))
    return e;
  if ((e = begin(l, doing))) return e;
  int64_t id = 0;
  e = worker_id(l, key, &id, doing);
  bool fresh = e == LH_ERR_NOTFOUND;
  if (fresh) e = LH_ERR_OK;
  if (!e) {
    sqlite3_stmt *s = l->st[fresh ? ST_WORKER_INSERT : ST_WORKER_UPDATE];
    int rc = fresh ? sqlite3_bind_blob(s, 1, key, LH_LEDGER_KEY_BYTES, SQLITE_STATIC)
                   : sqlite3_bind_int64(s, 1, id);
    if (rc || sqlite3_bind_text(s, 2, name ? name : "", (int)name_len, SQLITE_STATIC) ||
        sqlite3_bind_text(s, 3, hardware ? hardware : "", (int)hw_len, SQLITE_STATIC) ||
        sqlite3_bind_int64(s, 4, now_ms))
      e = bind_fail(l, s, doing);
    else
      e = run(l, s, doing);
  }
  if ((e = finish(l, e, doing))) return e;
  if (is_new) *is_new = fresh;
  return LH_ERR_OK;
}

lh_err lh_ledger_worker_register(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES],
                                 const char *name, const char *hardware_json, int64_t now_ms,
                                 bool *is_new) {
  pthread_mutex_lock(&l->mu);
  lh_err e = worker_register(l, key, name, hardware_json, now_ms, is_new);
  pthread_mutex_unlock(&l->mu);
  maybe_checkpoint(l);
  return e;
}

static void worker_row(sqlite3_stmt *s, lh_ledger_worker *w) {
  memset(w, 0, sizeof *w);
  const void *k = sqlite3_column_blob(s, 0);
  if (k && sqlite3_column_bytes(s, 0) == LH_LEDGER_KEY_BYTES)
    memcpy(w->key, k, LH_LEDGER_KEY_BYTES);
  column_text(s, 1, w->name, sizeof w->name);
  w->registered_ms = sqlite3_column_int64(s, 2);
  w->last_seen_ms = sqlite3_column_int64(s, 3);
  for (int i = 0; i < LH_GROUP__COUNT; i++)
    w->groups[i] = sqlite3_column_int64(s, 4 + i);
}

lh_err lh_ledger_worker_get(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES],
                            lh_ledger_worker *out) {
  l = reader_of(l); /* a read: the last commit */
  const char *doing = "reading a worker";
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&l->mu);
  sqlite3_stmt *s = l->st[ST_WORKER_GET];
  bool row = false;
  lh_err e = LH_ERR_OK;
  if (sqlite3_bind_blob(s, 1, key, LH_LEDGER_KEY_BYTES, SQLITE_STATIC))
    e = bind_fail(l, s, doing);
  else if (!(e = step(l, s, &row, doing))) {
    if (row) worker_row(s, out);
    reset(s);
  }
  pthread_mutex_unlock(&l->mu);
  if (!e && !row) {
    char hex[2 * LH_LEDGER_KEY_BYTES + 1];
    key_hex(key, hex);
    e = lh_errorf(LH_ERR_NOTFOUND, "%s: no worker with key %s is registered", l->path, hex);
  }
  return e;
}

lh_err lh_ledger_worker_hardware(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES],
                                 char **hardware_json) {
  const char *doing = "reading a worker's hardware";
  *hardware_json = NULL;
  pthread_mutex_lock(&l->mu);
  sqlite3_stmt *s = l->st[ST_WORKER_HARDWARE];
  bool row = false;
  lh_err e = LH_ERR_OK;
  if (sqlite3_bind_blob(s, 1, key, LH_LEDGER_KEY_BYTES, SQLITE_STATIC))
    e = bind_fail(l, s, doing);
  else if (!(e = step(l, s, &row, doing))) {
    size_t n;
    void *p = NULL;
    if (row && !(e = column_copy(l, s, 0, &p, &n, doing)) && !p && !(p = strdup("")))
      e = lh_errorf(LH_ERR_NOMEM, "%s: %s: out of memory", l->path, doing);
    *hardware_json = p;
    reset(s);
  }
  pthread_mutex_unlock(&l->mu);
  if (!e && !row) {
    char hex[2 * LH_LEDGER_KEY_BYTES + 1];
    key_hex(key, hex);
    e = lh_errorf(LH_ERR_NOTFOUND, "%s: no worker with key %s is registered", l->path, hex);
  }
  return e;
}

lh_err lh_ledger_worker_seen(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES], int64_t now_ms) {
  const char *doing = "updating a worker's last_seen";
  pthread_mutex_lock(&l->mu);
  sqlite3_stmt *s = l->st[ST_WORKER_SEEN];
  lh_err e;
  if (sqlite3_bind_blob(s, 1, key, LH_LEDGER_KEY_BYTES, SQLITE_STATIC) ||
      sqlite3_bind_int64(s, 2, now_ms))
    e = bind_fail(l, s, doing);
  else
    e = run(l, s, doing);
  bool found = sqlite3_changes(l->db) > 0;
  pthread_mutex_unlock(&l->mu);
  maybe_checkpoint(l);
  if (!e && !found) {
    char hex[2 * LH_LEDGER_KEY_BYTES + 1];
    key_hex(key, hex);
    e = lh_errorf(LH_ERR_NOTFOUND, "%s: no worker with key %s is registered", l->path, hex);
  }
  return e;
}

static lh_err workers_all(lh_ledger *l, lh_ledger_worker **out, int *n) {
  const char *doing = "listing the workers";
  sqlite3_stmt *s = l->st[ST_WORKERS];
  lh_ledger_worker *a = NULL;
  int cap = 0;
  bool row;
  lh_err e;
  while (!(e = step(l, s, &row, doing)) && row) {
    if (*n == cap) {
      int c = cap ? 2 * cap : 16;
      lh_ledger_worker *p = c > 0 && c < INT_MAX / 2 ? realloc(a, (size_t)c * sizeof *a) : NULL;
      if (!p) {
        e = lh_errorf(LH_ERR_NOMEM, "%s: %s: cannot allocate %d workers", l->path, doing, c);
        reset(s);
        break;
      }
      a = p;
      cap = c;
    }
    worker_row(s, &a[(*n)++]);
  }
  if (!e) reset(s);
  if (e || !*n) {
    free(a);
    a = NULL;
    if (e) *n = 0;
  }
  *out = a;
  return e;
}

lh_err lh_ledger_worker_recent(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES], int window,
                               bool with_expired, const char *excused, lh_ledger_recent *out) {
  const char *doing = "counting a worker's recent groups";
  memset(out, 0, sizeof *out);
  if (window < 1)
    return lh_errorf(LH_ERR_INVAL, "%s: %s: a window of %d groups, expected >= 1", l->path, doing,
                     window);
  if (!excused) excused = "";
  pthread_mutex_lock(&l->mu);
  sqlite3_stmt *s = l->st[with_expired ? ST_WORKER_RECENT_SETTLED : ST_WORKER_RECENT_SUBMITTED];
  bool row = false;
  lh_err e = LH_ERR_OK;
  if (sqlite3_bind_blob(s, 1, key, LH_LEDGER_KEY_BYTES, SQLITE_STATIC) ||
      sqlite3_bind_int(s, 2, window) || sqlite3_bind_text(s, 3, excused, -1, SQLITE_STATIC))
    e = bind_fail(l, s, doing);
  else if (!(e = step(l, s, &row, doing))) {
    if (row) {
      out->n = sqlite3_column_int64(s, 0);
      for (int i = 1; i < LH_GROUP__COUNT; i++)
        out->groups[i] = sqlite3_column_int64(s, i);
      out->excused = sqlite3_column_int64(s, LH_GROUP__COUNT);
    }
    reset(s);
  }
  pthread_mutex_unlock(&l->mu);
  return e;
}

lh_err lh_ledger_workers(lh_ledger *l, lh_ledger_worker **out, int *n) {
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&l->mu);
  lh_err e = workers_all(l, out, n);
  pthread_mutex_unlock(&l->mu);
  return e;
}

/* ---------------------------------------------------------------- groups */

void lh_ledger_group_clear(lh_ledger_group *g) {
  if (!g) return;
  free(g->spec);
  free(g->meta);
  memset(g, 0, sizeof *g);
}

/* A group's state and trained_at; LH_ERR_NOTFOUND naming it. */
static lh_err group_state(lh_ledger *l, int64_t group, int64_t *state, int64_t *trained_at,
                          const char *doing) {
  sqlite3_stmt *s = l->st[ST_GROUP_STATE];
  if (sqlite3_bind_int64(s, 1, group)) return bind_fail(l, s, doing);
  bool row;
  lh_err e = step(l, s, &row, doing);
  if (e) return e;
  if (row) {
    *state = sqlite3_column_int64(s, 0);
    if (trained_at) *trained_at = sqlite3_column_int64(s, 1);
  }
  reset(s);
  if (!row)
    return lh_errorf(LH_ERR_NOTFOUND, "%s: %s: no group %" PRId64 " was ever leased", l->path,
                     doing, group);
  return LH_ERR_OK;
}

/* A lease to write: its arguments, and its ids once written. */
typedef struct lease_args {
  const uint8_t *worker;
  int64_t now_ms, expires_ms;
  int n;
  const lh_ledger_group_spec *specs;
  int64_t *lease_id, *group_ids;
} lease_args;

static lh_err write_lease(lh_ledger *l, write_req *r, bool *more) {
  const lease_args *a = r->arg;
  const char *doing = r->doing;
  *more = false;
  int64_t wid = 0, lid = 0;
  lh_err e = worker_id(l, a->worker, &wid, doing);
  if (!e) {
    r->wrote = true;
    sqlite3_stmt *s = l->st[ST_LEASE_INSERT];
    if (sqlite3_bind_int64(s, 1, wid) || sqlite3_bind_int64(s, 2, a->now_ms) ||
        sqlite3_bind_int64(s, 3, a->expires_ms) || sqlite3_bind_int64(s, 4, a->n))
      e = bind_fail(l, s, doing);
    else if (!(e = run(l, s, doing)))
      lid = sqlite3_last_insert_rowid(l->db);
  }
  for (int i = 0; i < a->n && !e; i++) {
    sqlite3_stmt *s = l->st[ST_GROUP_INSERT];
    /* a zero-length blob, not NULL, for an empty spec */
    const void *p = a->specs[i].spec_len ? a->specs[i].spec : "";
    if (sqlite3_bind_int64(s, 1, lid) ||
        sqlite3_bind_int64(s, 2, (int64_t)a->specs[i].task_index) ||
        sqlite3_bind_blob64(s, 3, p, a->specs[i].spec_len, SQLITE_STATIC))
      e = bind_fail(l, s, doing);
    else if (!(e = run(l, s, doing)))
      a->group_ids[i] = sqlite3_last_insert_rowid(l->db);
  }
  if (!e) *a->lease_id = lid;
  return e;
}

lh_err lh_ledger_lease(lh_ledger *l, const uint8_t worker[LH_LEDGER_KEY_BYTES], int64_t now_ms,
                       int64_t expires_ms, int n, const lh_ledger_group_spec *specs,
                       int64_t *lease_id, int64_t *group_ids) {
  const char *doing = "leasing groups";
  if (n < 1 || n > LH_LEDGER_LEASE_MAX)
    return lh_errorf(n < 1 ? LH_ERR_INVAL : LH_ERR_LIMIT,
                     "%s: %s: %d groups, expected 1 .. %d in one lease", l->path, doing, n,
                     LH_LEDGER_LEASE_MAX);
  if (expires_ms < now_ms)
    return lh_errorf(LH_ERR_INVAL,
                     "%s: %s: the lease expires at %" PRId64 " ms, before it starts (%" PRId64
                     " ms)",
                     l->path, doing, expires_ms, now_ms);
  for (int i = 0; i < n; i++) {
    if (specs[i].spec_len > LH_LEDGER_SPEC_MAX)
      return lh_errorf(LH_ERR_LIMIT, "%s: %s: spec %d has %zu bytes, more than %d", l->path, doing,
                       i, specs[i].spec_len, LH_LEDGER_SPEC_MAX);
    if (!specs[i].spec && specs[i].spec_len)
      return lh_errorf(LH_ERR_INVAL, "%s: %s: spec %d: NULL with %zu bytes", l->path, doing, i,
                       specs[i].spec_len);
  }
  lease_args a = {worker, now_ms, expires_ms, n, specs, lease_id, group_ids};
  write_req r = {.write = write_lease, .arg = &a};
  snprintf(r.doing, sizeof r.doing, "%s", doing);
  return submit(l, &r);
}

static lh_err group_row(lh_ledger *l, sqlite3_stmt *s, lh_ledger_group *g, const char *doing) {
  g->id = sqlite3_column_int64(s, 0);
  g->lease = sqlite3_column_int64(s, 1);
  const void *k = sqlite3_column_blob(s, 2);
  if (k && sqlite3_column_bytes(s, 2) == LH_LEDGER_KEY_BYTES)
    memcpy(g->worker, k, LH_LEDGER_KEY_BYTES);
  g->task_index = (uint64_t)sqlite3_column_int64(s, 3);
  g->state = (lh_group_state)sqlite3_column_int(s, 5);
  g->version_used = sqlite3_column_int64(s, 6);
  g->trained_at = sqlite3_column_int64(s, 7);
  column_text(s, 8, g->reason, sizeof g->reason);
  g->body_len = (size_t)sqlite3_column_int64(s, 10);
  g->leased_ms = sqlite3_column_int64(s, 11);
  g->expires_ms = sqlite3_column_int64(s, 12);
  g->received_ms = sqlite3_column_int64(s, 13);
  void *spec = NULL, *meta = NULL;
  size_t spec_len = 0, meta_len = 0;
  lh_err e = column_copy(l, s, 4, &spec, &spec_len, doing);
  if (!e && sqlite3_column_type(s, 9) != SQLITE_NULL)
    e = column_copy(l, s, 9, &meta, &meta_len, doing);
  if (!e && spec_len == 0) {
    free(spec);
    spec = NULL;
  }
  if (!e && sqlite3_column_type(s, 9) != SQLITE_NULL && !meta && !(meta = strdup("")))
    e = lh_errorf(LH_ERR_NOMEM, "%s: %s: out of memory", l->path, doing);
  g->spec = spec;
  g->spec_len = spec_len;
  g->meta = meta;
  return e;
}

lh_err lh_ledger_group_get(lh_ledger *l, int64_t group, lh_ledger_group *out) {
  l = reader_of(l); /* a read: the last commit */
  const char *doing = "reading a group";
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&l->mu);
  sqlite3_stmt *s = l->st[ST_GROUP_GET];
  bool row = false;
  lh_err e = LH_ERR_OK;
  if (sqlite3_bind_int64(s, 1, group))
    e = bind_fail(l, s, doing);
  else if (!(e = step(l, s, &row, doing))) {
    if (row) e = group_row(l, s, out, doing);
    reset(s);
  }
  pthread_mutex_unlock(&l->mu);
  if (e) lh_ledger_group_clear(out);
  if (!e && !row)
    e = lh_errorf(LH_ERR_NOTFOUND, "%s: no group %" PRId64 " was ever leased", l->path, group);
  return e;
}

/* The group is LEASED or EXPIRED, so a submission may settle it. */
static lh_err check_open(lh_ledger *l, int64_t group, const char *doing) {
  int64_t state = -1, trained_at = -1;
  lh_err e = group_state(l, group, &state, &trained_at, doing);
  if (e) return e;
  if (state == LH_GROUP_LEASED || state == LH_GROUP_EXPIRED) return LH_ERR_OK;
  if (state == LH_GROUP_TRAINED || state == LH_GROUP_DROPPED)
    return lh_errorf(LH_ERR_INVAL,
                     "%s: %s: the group is %s (at version %" PRId64 "), expected leased or expired",
                     l->path, doing, state_name_i(state), trained_at);
  return lh_errorf(LH_ERR_INVAL, "%s: %s: the group is %s, expected leased or expired", l->path,
                   doing, state_name_i(state));
}

/* An accept to write. */
typedef struct accept_args {
  int64_t group, version_used, now_ms;
  const void *body;
  size_t len;
  const char *meta;
  size_t meta_len;
} accept_args;

/* The checks of an accept that need no database. */
static lh_err accept_check(lh_ledger *l, const accept_args *a, const char *doing) {
  if (a->len < 1 || !a->body)
    return lh_errorf(LH_ERR_INVAL, "%s: %s: an empty body", l->path, doing);
  if (a->len > LH_LEDGER_BODY_MAX)
    return lh_errorf(LH_ERR_LIMIT, "%s: %s: a body of %zu bytes, more than %zu", l->path, doing,
                     a->len, LH_LEDGER_BODY_MAX);
  if (a->version_used < 0)
    return lh_errorf(LH_ERR_INVAL, "%s: %s: version_used %" PRId64 ", expected >= 0", l->path,
                     doing, a->version_used);
  return LH_ERR_OK;
}

static lh_err write_accept(lh_ledger *l, write_req *r, bool *more) {
  const accept_args *a = r->arg;
  const char *doing = r->doing;
  *more = false;
  lh_err e = check_open(l, a->group, doing);
  if (e) return e;
  r->wrote = true;
  sqlite3_stmt *s = l->st[ST_GROUP_ACCEPT];
  int rc = sqlite3_bind_int64(s, 1, a->group) || sqlite3_bind_int64(s, 2, a->version_used) ||
           sqlite3_bind_int64(s, 4, a->now_ms);
  if (!rc && a->meta) rc = sqlite3_bind_text(s, 3, a->meta, (int)a->meta_len, SQLITE_STATIC);
  if ((e = rc ? bind_fail(l, s, doing) : run(l, s, doing))) return e;
  s = l->st[ST_BODY_PUT];
  if (sqlite3_bind_int64(s, 1, a->group) ||
      sqlite3_bind_blob64(s, 2, a->body, a->len, SQLITE_STATIC))
    return bind_fail(l, s, doing);
  return run(l, s, doing);
}

lh_err lh_ledger_group_accept(lh_ledger *l, int64_t group, int64_t version_used, const void *body,
                              size_t len, const char *meta_json, int64_t now_ms) {
  accept_args a = {.group = group,
                   .version_used = version_used,
                   .now_ms = now_ms,
                   .body = body,
                   .len = len,
                   .meta = meta_json};
  write_req r = {.write = write_accept, .arg = &a, .accept = true};
  snprintf(r.doing, sizeof r.doing, "accepting group %" PRId64, group);
  lh_err e = accept_check(l, &a, r.doing);
  if (!e) e = check_text(l, meta_json, LH_LEDGER_META_MAX, "submission meta", &a.meta_len);
  if (e) return e;
  return submit(l, &r);
}

void lh_ledger_accept_stats(lh_ledger *l, int64_t *commits, int64_t *accepts) {
  pthread_mutex_lock(&l->amu);
  *commits = l->accept_commits;
  *accepts = l->accepts;
  pthread_mutex_unlock(&l->amu);
}

static lh_err group_reject(lh_ledger *l, int64_t group, int64_t version_used, const char *reason,
                           int64_t now_ms) {
  char doing[64];
  snprintf(doing, sizeof doing, "rejecting group %" PRId64, group);
  size_t reason_len = 0;
  lh_err e = check_text(l, reason, LH_LEDGER_REASON_MAX, "rejection reason", &reason_len);
  if (e) return e;
  if (reason_len == 0) return lh_errorf(LH_ERR_INVAL, "%s: %s: no reason given", l->path, doing);
  if (version_used < -1)
    return lh_errorf(LH_ERR_INVAL, "%s: %s: version_used %" PRId64 ", expected >= -1", l->path,
                     doing, version_used);
  if ((e = begin(l, doing))) return e;
  if (!(e = check_open(l, group, doing))) {
    sqlite3_stmt *s = l->st[ST_GROUP_REJECT];
    if (sqlite3_bind_int64(s, 1, group) || sqlite3_bind_int64(s, 2, version_used) ||
        sqlite3_bind_text(s, 3, reason, (int)reason_len, SQLITE_STATIC) ||
        sqlite3_bind_int64(s, 4, now_ms))
      e = bind_fail(l, s, doing);
    else
      e = run(l, s, doing);
  }
  return finish(l, e, doing);
}

lh_err lh_ledger_group_reject(lh_ledger *l, int64_t group, int64_t version_used, const char *reason,
                              int64_t now_ms) {
  pthread_mutex_lock(&l->mu);
  lh_err e = group_reject(l, group, version_used, reason, now_ms);
  pthread_mutex_unlock(&l->mu);
  maybe_checkpoint(l);
  return e;
}

static lh_err group_refute(lh_ledger *l, int64_t group, const char *reason, int64_t now_ms) {
  char doing[64];
  snprintf(doing, sizeof doing, "refuting group %" PRId64, group);
  size_t reason_len = 0;
  lh_err e = check_text(l, reason, LH_LEDGER_REASON_MAX, "rejection reason", &reason_len);
  if (e) return e;
  if (reason_len == 0) return lh_errorf(LH_ERR_INVAL, "%s: %s: no reason given", l->path, doing);
  if ((e = begin(l, doing))) return e;
  int64_t state = -1;
  if (!(e = group_state(l, group, &state, NULL, doing)) && state != LH_GROUP_ACCEPTED)
    e = lh_errorf(LH_ERR_INVAL, "%s: %s: the group is %s, expected accepted", l->path, doing,
                  state_name_i(state));
  if (!e) {
    sqlite3_stmt *s = l->st[ST_GROUP_REFUTE];
    if (sqlite3_bind_int64(s, 1, group) ||
        sqlite3_bind_text(s, 2, reason, (int)reason_len, SQLITE_STATIC) ||
        sqlite3_bind_int64(s, 3, now_ms))
      e = bind_fail(l, s, doing);
    else
      e = run(l, s, doing);
  }
  return finish(l, e, doing);
}

lh_err lh_ledger_group_refute(lh_ledger *l, int64_t group, const char *reason, int64_t now_ms) {
  pthread_mutex_lock(&l->mu);
  lh_err e = group_refute(l, group, reason, now_ms);
  pthread_mutex_unlock(&l->mu);
  maybe_checkpoint(l);
  return e;
}

static lh_err group_body(lh_ledger *l, int64_t group, void **body, size_t *len) {
  char doing[64];
  snprintf(doing, sizeof doing, "reading the body of group %" PRId64, group);
  sqlite3_stmt *s = l->st[ST_BODY_GET];
  if (sqlite3_bind_int64(s, 1, group)) return bind_fail(l, s, doing);
  bool row;
  lh_err e = step(l, s, &row, doing);
  if (e) return e;
  if (row) e = column_copy(l, s, 0, body, len, doing);
  reset(s);
  if (e || row) return e;
  int64_t state = -1;
  if ((e = group_state(l, group, &state, NULL, doing))) return e;
  return lh_errorf(LH_ERR_NOTFOUND, "%s: %s: the group is %s and has no body%s", l->path, doing,
                   state_name_i(state),
                   state == LH_GROUP_TRAINED || state == LH_GROUP_DROPPED ? " (pruned)" : "");
}

lh_err lh_ledger_group_body(lh_ledger *l, int64_t group, void **body, size_t *len) {
  l = reader_of(l); /* a read: the last commit */
  *body = NULL;
  *len = 0;
  pthread_mutex_lock(&l->mu);
  lh_err e = group_body(l, group, body, len);
  pthread_mutex_unlock(&l->mu);
  return e;
}

static lh_err expire(lh_ledger *l, int64_t now_ms, int64_t **groups, int *n) {
  const char *doing = "expiring leases";
  int cap = 0;
  lh_err e = begin(l, doing);
  if (e) return e;
  sqlite3_stmt *s = l->st[ST_EXPIRED_LIST];
  if (sqlite3_bind_int64(s, 1, now_ms))
    e = bind_fail(l, s, doing);
  else
    e = collect_ids(l, s, groups, n, &cap, doing);
  for (int i = 0; i < *n && !e; i++) {
    s = l->st[ST_GROUP_EXPIRE];
    e = sqlite3_bind_int64(s, 1, (*groups)[i]) ? bind_fail(l, s, doing) : run(l, s, doing);
  }
  return finish(l, e, doing);
}

lh_err lh_ledger_expire(lh_ledger *l, int64_t now_ms, int64_t **groups, int *n) {
  *groups = NULL;
  *n = 0;
  pthread_mutex_lock(&l->mu);
  lh_err e = expire(l, now_ms, groups, n);
  pthread_mutex_unlock(&l->mu);
  maybe_checkpoint(l);
  if (e || !*n) {
    free(*groups);
    *groups = NULL;
    *n = 0;
  }
  return e;
}

lh_err lh_ledger_accepted(lh_ledger *l, int64_t **groups, int *n) {
  *groups = NULL;
  *n = 0;
  int cap = 0;
  pthread_mutex_lock(&l->mu);
  lh_err e = collect_ids(l, l->st[ST_ACCEPTED_LIST], groups, n, &cap, "listing accepted groups");
  pthread_mutex_unlock(&l->mu);
  if (e || !*n) {
    free(*groups);
    *groups = NULL;
    *n = 0;
  }
  return e;
}

/* ---------------------------------------------------------------- training */

static int cmp_id(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* No id twice in the two lists. */
static lh_err check_distinct(lh_ledger *l, const int64_t *trained, int n_trained,
                             const int64_t *dropped, int n_dropped, const char *doing) {
  int n = n_trained + n_dropped;
  int64_t *all = malloc((size_t)n * sizeof *all);
  if (!all) return lh_errorf(LH_ERR_NOMEM, "%s: %s: cannot allocate %d ids", l->path, doing, n);
  if (n_trained) memcpy(all, trained, (size_t)n_trained * sizeof *all);
  if (n_dropped) memcpy(all + n_trained, dropped, (size_t)n_dropped * sizeof *all);
  qsort(all, (size_t)n, sizeof *all, cmp_id);
  lh_err e = LH_ERR_OK;
  for (int i = 1; i < n && !e; i++)
    if (all[i] == all[i - 1])
      e = lh_errorf(LH_ERR_INVAL, "%s: %s: group %" PRId64 " is listed twice", l->path, doing,
                    all[i]);
  free(all);
  return e;
}

/* LH_ERR_OK when the group is ACCEPTED; else the error naming its state (LH_ERR_NOTFOUND for an
 * id never issued). */
static lh_err check_accepted(lh_ledger *l, int64_t group, const char *doing) {
  int64_t state = -1, at = -1;
  lh_err e = group_state(l, group, &state, &at, doing);
  if (e || state == LH_GROUP_ACCEPTED) return e;
  if (state == LH_GROUP_TRAINED || state == LH_GROUP_DROPPED)
    return lh_errorf(LH_ERR_INVAL,
                     "%s: %s: group %" PRId64 " is %s already (at version %" PRId64
                     "), expected accepted",
                     l->path, doing, group, state_name_i(state), at);
  return lh_errorf(LH_ERR_INVAL, "%s: %s: group %" PRId64 " is %s, expected accepted", l->path,
                   doing, group, state_name_i(state));
}

/* ACCEPTED -> what (TRAINED or DROPPED) at version, with its log event. */
static lh_err train_one(lh_ledger *l, int64_t version, int64_t group, lh_group_state what,
                        const char *doing) {
  sqlite3_stmt *s = l->st[ST_GROUP_TRAIN];
  const char *reason = what == LH_GROUP_DROPPED ? "stale" : "";
  if (sqlite3_bind_int64(s, 1, group) || sqlite3_bind_int(s, 2, (int)what) ||
      sqlite3_bind_int64(s, 3, version) || sqlite3_bind_text(s, 4, reason, -1, SQLITE_STATIC))
    return bind_fail(l, s, doing);
  lh_err e = run(l, s, doing);
  if (e) return e;
  if (sqlite3_changes(l->db) != 1) {
    if ((e = check_accepted(l, group, doing))) return e;
    return lh_errorf(LH_ERR_INVAL, "%s: %s: group %" PRId64 " was not changed", l->path, doing,
                     group);
  }
  s = l->st[ST_LOG_INSERT];
  if (sqlite3_bind_int64(s, 1, version) || sqlite3_bind_int64(s, 2, group) ||
      sqlite3_bind_int(s, 3, (int)what))
    return bind_fail(l, s, doing);
  return run(l, s, doing);
}

/* An update's marks to write: the trained ids, then the dropped ones, `at` written so far. */
typedef struct train_args {
  int64_t version;
  const int64_t *trained, *dropped;
  int n_trained, n_dropped, at;
} train_args;

/* LH_LEDGER_TRAIN_PART marks per commit (lh_ledger_train checked every id before the first; a
 * part that fails, a group changed by another thread meanwhile, fails its commit). */
static lh_err write_train(lh_ledger *l, write_req *r, bool *more) {
  train_args *a = r->arg;
  int n = a->n_trained + a->n_dropped;
  lh_err e = LH_ERR_OK;
  int end = n - a->at > LH_LEDGER_TRAIN_PART ? a->at + LH_LEDGER_TRAIN_PART : n;
  r->wrote = true;
  for (int i = a->at; i < end && !e; i++)
    e = i < a->n_trained
            ? train_one(l, a->version, a->trained[i], LH_GROUP_TRAINED, r->doing)
            : train_one(l, a->version, a->dropped[i - a->n_trained], LH_GROUP_DROPPED, r->doing);
  if (!e) a->at = end;
  *more = !e && end < n;
  return e;
}

lh_err lh_ledger_train(lh_ledger *l, int64_t version, const int64_t *trained, int n_trained,
                       const int64_t *dropped, int n_dropped) {
  char doing[64];
  snprintf(doing, sizeof doing, "training version %" PRId64, version);
  if (version < 0)
    return lh_errorf(LH_ERR_INVAL, "%s: %s: expected a version >= 0", l->path, doing);
  if (n_trained < 0 || n_dropped < 0 || (n_trained && !trained) || (n_dropped && !dropped) ||
      n_trained + n_dropped < 1)
    return lh_errorf(LH_ERR_INVAL, "%s: %s: %d trained and %d dropped groups, expected some",
                     l->path, doing, n_trained, n_dropped);
  if (n_trained > LH_LEDGER_TRAIN_MAX || n_dropped > LH_LEDGER_TRAIN_MAX - n_trained)
    return lh_errorf(LH_ERR_LIMIT, "%s: %s: %d trained and %d dropped groups, more than %d",
                     l->path, doing, n_trained, n_dropped, LH_LEDGER_TRAIN_MAX);
  lh_err e = check_distinct(l, trained, n_trained, dropped, n_dropped, doing);
  if (e) return e;
  /* every id, on a read connection (the last commit), so that a call refused for its ids
   * changes nothing and the checks do not hold the writer */
  lh_ledger *rd = reader_of(l);
  pthread_mutex_lock(&rd->mu);
  for (int i = 0; i < n_trained + n_dropped && !e; i++)
    e = check_accepted(rd, i < n_trained ? trained[i] : dropped[i - n_trained], doing);
  pthread_mutex_unlock(&rd->mu);
  if (e) return e;
  train_args a = {version, trained, dropped, n_trained, n_dropped, 0};
  write_req r = {.write = write_train, .arg = &a};
  snprintf(r.doing, sizeof r.doing, "%s", doing);
  return submit(l, &r);
}

/* The setting `key` (the version bodies were pruned to), def when never set. */
static lh_err setting_get(lh_ledger *l, const char *key, int64_t def, int64_t *v,
                          const char *doing) {
  sqlite3_stmt *s = l->st[ST_SETTING_GET];
  if (sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC)) return bind_fail(l, s, doing);
  bool row;
  lh_err e = step(l, s, &row, doing);
  if (e) return e;
  *v = row ? sqlite3_column_int64(s, 0) : def;
  reset(s);
  return LH_ERR_OK;
}

static lh_err setting_put(lh_ledger *l, const char *key, int64_t v, const char *doing) {
  sqlite3_stmt *s = l->st[ST_SETTING_PUT];
  if (sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC) || sqlite3_bind_int64(s, 2, v))
    return bind_fail(l, s, doing);
  return run(l, s, doing);
}

/* Runs s bound to one version parameter and returns the rows it changed. */
static lh_err change_after(lh_ledger *l, int id, int64_t version, int64_t *changed,
                           const char *doing) {
  sqlite3_stmt *s = l->st[id];
  if (sqlite3_bind_int64(s, 1, version)) return bind_fail(l, s, doing);
  lh_err e = run(l, s, doing);
  if (!e && changed) *changed = sqlite3_changes64(l->db);
  return e;
}

static lh_err rewind_to(lh_ledger *l, int64_t version, int64_t *n_back) {
  char doing[64];
  snprintf(doing, sizeof doing, "rewinding to version %" PRId64, version);
  if (version < -1)
    return lh_errorf(LH_ERR_INVAL, "%s: %s: expected a version >= -1", l->path, doing);
  lh_err e = begin(l, doing);
  if (e) return e;
  int64_t pruned = -1, rid = 0, back = 0, forgotten = 0;
  if (!(e = setting_get(l, SETTING_PRUNED_TO, -1, &pruned, doing)) && version < pruned)
    e = lh_errorf(LH_ERR_INVAL,
                  "%s: %s: the bodies of groups trained up to version %" PRId64
                  " were pruned, so those groups cannot be trained again",
                  l->path, doing, pruned);
  if (!e && !(e = change_after(l, ST_REWIND_INSERT, version, NULL, doing)))
    rid = sqlite3_last_insert_rowid(l->db);
  if (!e) {
    sqlite3_stmt *s = l->st[ST_LOG_UNDO];
    if (sqlite3_bind_int64(s, 1, version) || sqlite3_bind_int64(s, 2, rid))
      e = bind_fail(l, s, doing);
    else
      e = run(l, s, doing);
  }
  if (!e) e = change_after(l, ST_GROUPS_BACK, version, &back, doing);
  if (!e) e = change_after(l, ST_BLOBS_FORGET, version, NULL, doing);
  if (!e) e = change_after(l, ST_VERSIONS_FORGET, version, &forgotten, doing);
  if (!e) {
    sqlite3_stmt *s = l->st[ST_REWIND_SET];
    if (sqlite3_bind_int64(s, 1, rid) || sqlite3_bind_int64(s, 2, back) ||
        sqlite3_bind_int64(s, 3, forgotten))
      e = bind_fail(l, s, doing);
    else
      e = run(l, s, doing);
  }
  if ((e = finish(l, e, doing))) return e;
  if (n_back) *n_back = back;
  return LH_ERR_OK;
}

lh_err lh_ledger_rewind(lh_ledger *l, int64_t version, int64_t *n_back) {
  if (n_back) *n_back = 0;
  pthread_mutex_lock(&l->mu);
  lh_err e = rewind_to(l, version, n_back);
  pthread_mutex_unlock(&l->mu);
  maybe_checkpoint(l);
  return e;
}

/* Bodies to prune: up to `version`, `gone` deleted so far. */
typedef struct prune_args {
  int64_t version, gone;
  int parts; /* written so far */
} prune_args;

/* The version pruned to is set in the first part, before any body goes (so no rewind can bring
 * back a group whose body is gone); then LH_LEDGER_PRUNE_PART bodies per commit. */
static lh_err write_prune(lh_ledger *l, write_req *r, bool *more) {
  prune_args *a = r->arg;
  *more = false;
  r->wrote = true; /* only the database can fail it */
  lh_err e = LH_ERR_OK;
  int64_t pruned = -1, gone = 0;
  if (a->parts++ == 0 && !(e = setting_get(l, SETTING_PRUNED_TO, -1, &pruned, r->doing)) &&
      a->version > pruned)
    e = setting_put(l, SETTING_PRUNED_TO, a->version, r->doing);
  sqlite3_stmt *s = l->st[ST_BODIES_PRUNE];
  if (e) return e;
  if (sqlite3_bind_int64(s, 1, a->version) || sqlite3_bind_int(s, 2, LH_LEDGER_PRUNE_PART))
    return bind_fail(l, s, r->doing);
  if ((e = run(l, s, r->doing))) return e;
  gone = sqlite3_changes64(l->db);
  a->gone += gone;
  *more = gone == LH_LEDGER_PRUNE_PART;
  return LH_ERR_OK;
}

lh_err lh_ledger_prune_bodies(lh_ledger *l, int64_t version, int64_t *n) {
  if (n) *n = 0;
  prune_args a = {version, 0, 0};
  write_req r = {.write = write_prune, .arg = &a};
  snprintf(r.doing, sizeof r.doing, "pruning bodies up to version %" PRId64, version);
  if (version < 0)
    return lh_errorf(LH_ERR_INVAL, "%s: %s: expected a version >= 0", l->path, r.doing);
  lh_err e = submit(l, &r);
  if (!e && n) *n = a.gone;
  return e;
}

static lh_err log_all(lh_ledger *l, lh_ledger_log_entry **out, int *n) {
  const char *doing = "reading the training log";
  sqlite3_stmt *s = l->st[ST_LOG_ALL];
  lh_ledger_log_entry *a = NULL;
  int cap = 0;
  bool row;
  lh_err e;
  while (!(e = step(l, s, &row, doing)) && row) {
    if (*n == cap) {
      int c = cap ? 2 * cap : 64;
      lh_ledger_log_entry *p = c > 0 && c < INT_MAX / 2 ? realloc(a, (size_t)c * sizeof *a) : NULL;
      if (!p) {
        e = lh_errorf(LH_ERR_NOMEM, "%s: %s: cannot allocate %d entries", l->path, doing, c);
        reset(s);
        break;
      }
      a = p;
      cap = c;
    }
    lh_ledger_log_entry *t = &a[(*n)++];
    t->seq = sqlite3_column_int64(s, 0);
    t->version = sqlite3_column_int64(s, 1);
    t->group = sqlite3_column_int64(s, 2);
    t->what = (lh_group_state)sqlite3_column_int(s, 3);
    t->undone_by = sqlite3_column_int64(s, 4);
  }
  if (!e) reset(s);
  if (e || !*n) {
    free(a);
    a = NULL;
    if (e) *n = 0;
  }
  *out = a;
  return e;
}

lh_err lh_ledger_log(lh_ledger *l, lh_ledger_log_entry **out, int *n) {
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&l->mu);
  lh_err e = log_all(l, out, n);
  pthread_mutex_unlock(&l->mu);
  return e;
}

/* ---------------------------------------------------------------- versions and blobs */

static int cmp_blob(const void *a, const void *b) {
  return memcmp(((const lh_ledger_blob *)a)->hash, ((const lh_ledger_blob *)b)->hash,
                LH_LEDGER_HASH_BYTES);
}

static lh_err check_blobs(lh_ledger *l, int64_t version, int n, const lh_ledger_blob *blobs,
                          lh_ledger_blob *sorted, const char *doing) {
  if (n < 0 || n > LH_LEDGER_MAX_BLOBS || (n && !blobs))
    return lh_errorf(n > LH_LEDGER_MAX_BLOBS ? LH_ERR_LIMIT : LH_ERR_INVAL,
                     "%s: %s: %d blobs, expected 0 .. %d", l->path, doing, n, LH_LEDGER_MAX_BLOBS);
  for (int i = 0; i < n; i++) {
    const lh_ledger_blob *b = &blobs[i];
    if (b->kind != 0 && b->kind != 1)
      return lh_errorf(LH_ERR_INVAL, "%s: %s: blob %d: kind %d, expected 0 (snapshot) or 1 (patch)",
                       l->path, doing, i, b->kind);
    if (b->kind == 0 ? b->from_version != -1 : b->from_version < 0 || b->from_version >= version)
      return lh_errorf(LH_ERR_INVAL, "%s: %s: blob %d: a %s from version %" PRId64 ", expected %s",
                       l->path, doing, i, b->kind ? "patch" : "snapshot", b->from_version,
                       b->kind ? "0 .. the version - 1" : "-1");
    if (b->size < 1 || b->size > (uint64_t)INT64_MAX)
      return lh_errorf(LH_ERR_INVAL, "%s: %s: blob %d: size %" PRIu64 ", expected >= 1", l->path,
                       doing, i, b->size);
  }
  if (n) memcpy(sorted, blobs, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_blob);
  for (int i = 1; i < n; i++)
    if (!cmp_blob(&sorted[i], &sorted[i - 1]))
      return lh_errorf(LH_ERR_INVAL, "%s: %s: one blob hash listed twice", l->path, doing);
  return LH_ERR_OK;
}

/* Reads a version's blobs (ordered by hash) into a (room for LH_LEDGER_MAX_BLOBS). */
static lh_err read_blobs(lh_ledger *l, int64_t version, lh_ledger_blob *a, int *n,
                         const char *doing) {
  sqlite3_stmt *s = l->st[ST_VERSION_BLOBS];
  if (sqlite3_bind_int64(s, 1, version)) return bind_fail(l, s, doing);
  bool row;
  lh_err e;
  *n = 0;
  while (!(e = step(l, s, &row, doing)) && row) {
    if (*n == LH_LEDGER_MAX_BLOBS) {
      reset(s);
      return lh_errorf(LH_ERR_FORMAT, "%s: %s: version %" PRId64 " has more than %d blobs", l->path,
                       doing, version, LH_LEDGER_MAX_BLOBS);
    }
    lh_ledger_blob *b = &a[(*n)++];
    memset(b, 0, sizeof *b);
    const void *h = sqlite3_column_blob(s, 0);
    if (h && sqlite3_column_bytes(s, 0) == LH_LEDGER_HASH_BYTES)
      memcpy(b->hash, h, LH_LEDGER_HASH_BYTES);
    b->kind = sqlite3_column_int(s, 1);
    b->from_version = sqlite3_column_int64(s, 2);
    b->size = (uint64_t)sqlite3_column_int64(s, 3);
  }
  if (!e) reset(s);
  return e;
}

/* A version already there: the same content is fine, anything else LH_ERR_MISMATCH. */
static lh_err same_version(lh_ledger *l, int64_t version, int64_t parent,
                           const uint8_t slab[LH_LEDGER_HASH_BYTES], const void *manifest,
                           size_t manifest_len, int n, const lh_ledger_blob *sorted,
                           sqlite3_stmt *s, const char *doing) {
  const char *what = NULL;
  const void *h = sqlite3_column_blob(s, 1);
  const void *m = sqlite3_column_blob(s, 2);
  if (sqlite3_column_int64(s, 0) != parent)
    what = "another parent";
  else if (!h || sqlite3_column_bytes(s, 1) != LH_LEDGER_HASH_BYTES ||
           memcmp(h, slab, LH_LEDGER_HASH_BYTES))
    what = "another slab hash";
  else if ((size_t)sqlite3_column_bytes(s, 2) != manifest_len || !m ||
           memcmp(m, manifest, manifest_len))
    what = "another manifest";
  reset(s);
  if (!what) {
    lh_ledger_blob old[LH_LEDGER_MAX_BLOBS];
    int n_old = 0;
    lh_err e = read_blobs(l, version, old, &n_old, doing);
    if (e) return e;
    if (n_old != n || (n && memcmp(old, sorted, (size_t)n * sizeof *old))) what = "other blobs";
  }
  if (what)
    return lh_errorf(LH_ERR_MISMATCH, "%s: %s: version %" PRId64 " is published already, with %s",
                     l->path, doing, version, what);
  return LH_ERR_OK;
}

/* A version to publish, its blobs sorted by hash. */
typedef struct version_args {
  int64_t version, parent, now_ms;
  const uint8_t *slab;
  const void *manifest;
  size_t manifest_len;
  int n;
  const lh_ledger_blob *sorted;
} version_args;

static lh_err write_version(lh_ledger *l, write_req *r, bool *more) {
  const version_args *a = r->arg;
  const char *doing = r->doing;
  *more = false;
  sqlite3_stmt *s = l->st[ST_VERSION_GET];
  bool row = false;
  lh_err e = LH_ERR_OK;
  if (sqlite3_bind_int64(s, 1, a->version))
    e = bind_fail(l, s, doing);
  else if (!(e = step(l, s, &row, doing)) && row)
    e = same_version(l, a->version, a->parent, a->slab, a->manifest, a->manifest_len, a->n,
                     a->sorted, s, doing);
  else if (!e)
    reset(s);
  r->wrote = !e && !row;
  if (!e && !row) {
    s = l->st[ST_VERSION_INSERT];
    if (sqlite3_bind_int64(s, 1, a->version) || sqlite3_bind_int64(s, 2, a->parent) ||
        sqlite3_bind_blob(s, 3, a->slab, LH_LEDGER_HASH_BYTES, SQLITE_STATIC) ||
        sqlite3_bind_blob64(s, 4, a->manifest, a->manifest_len, SQLITE_STATIC) ||
        sqlite3_bind_int64(s, 5, a->now_ms))
      e = bind_fail(l, s, doing);
    else
      e = run(l, s, doing);
  }
  for (int i = 0; i < a->n && !e && !row; i++) {
    const lh_ledger_blob *b = &a->sorted[i];
    s = l->st[ST_BLOB_INSERT];
    if (sqlite3_bind_int64(s, 1, a->version) ||
        sqlite3_bind_blob(s, 2, b->hash, LH_LEDGER_HASH_BYTES, SQLITE_STATIC) ||
        sqlite3_bind_int(s, 3, b->kind) || sqlite3_bind_int64(s, 4, b->from_version) ||
        sqlite3_bind_int64(s, 5, (int64_t)b->size))
      e = bind_fail(l, s, doing);
    else
      e = run(l, s, doing);
  }
  return e;
}

lh_err lh_ledger_version_put(lh_ledger *l, int64_t version, int64_t parent,
                             const uint8_t slab_hash[LH_LEDGER_HASH_BYTES], const void *manifest,
                             size_t manifest_len, int64_t now_ms, int n_blobs,
                             const lh_ledger_blob *blobs) {
  lh_ledger_blob sorted[LH_LEDGER_MAX_BLOBS];
  memset(sorted, 0, sizeof sorted);
  version_args a = {version, parent, now_ms, slab_hash, manifest, manifest_len, n_blobs, sorted};
  write_req r = {.write = write_version, .arg = &a};
  snprintf(r.doing, sizeof r.doing, "publishing version %" PRId64, version);
  const char *doing = r.doing;
  if (version < 0 || parent < -1 || parent >= version)
    return lh_errorf(LH_ERR_INVAL,
                     "%s: %s: parent %" PRId64 ", expected a version >= 0 and a parent -1 .. "
                     "version - 1",
                     l->path, doing, parent);
  if (manifest_len < 1 || !manifest || manifest_len > LH_LEDGER_MANIFEST_MAX)
    return lh_errorf(manifest_len > LH_LEDGER_MANIFEST_MAX ? LH_ERR_LIMIT : LH_ERR_INVAL,
                     "%s: %s: a manifest of %zu bytes, expected 1 .. %d", l->path, doing,
                     manifest_len, LH_LEDGER_MANIFEST_MAX);
  lh_err e = check_blobs(l, version, n_blobs, blobs, sorted, doing);
  return e ? e : submit(l, &r);
}

lh_err lh_ledger_version_get(lh_ledger *l, int64_t version, char **manifest, size_t *len) {
  l = reader_of(l); /* a read: the last commit */
  char doing[64];
  snprintf(doing, sizeof doing, "reading version %" PRId64, version);
  *manifest = NULL;
  *len = 0;
  pthread_mutex_lock(&l->mu);
  sqlite3_stmt *s = l->st[ST_VERSION_GET];
  bool row = false;
  lh_err e = LH_ERR_OK;
  if (sqlite3_bind_int64(s, 1, version))
    e = bind_fail(l, s, doing);
  else if (!(e = step(l, s, &row, doing))) {
    void *p = NULL;
    if (row) e = column_copy(l, s, 2, &p, len, doing);
    *manifest = p;
    reset(s);
  }
  pthread_mutex_unlock(&l->mu);
  if (!e && !row)
    e = lh_errorf(LH_ERR_NOTFOUND, "%s: version %" PRId64 " is not published", l->path, version);
  return e;
}

static lh_err version_blobs(lh_ledger *l, int64_t version, lh_ledger_blob **out, int *n) {
  char doing[64];
  snprintf(doing, sizeof doing, "reading the blobs of version %" PRId64, version);
  sqlite3_stmt *s = l->st[ST_VERSION_GET];
  if (sqlite3_bind_int64(s, 1, version)) return bind_fail(l, s, doing);
  bool row;
  lh_err e = step(l, s, &row, doing);
  if (e) return e;
  reset(s);
  if (!row)
    return lh_errorf(LH_ERR_NOTFOUND, "%s: version %" PRId64 " is not published", l->path, version);
  lh_ledger_blob a[LH_LEDGER_MAX_BLOBS];
  if ((e = read_blobs(l, version, a, n, doing)) || !*n) return e;
  if (!(*out = malloc((size_t)*n * sizeof **out)))
    return lh_errorf(LH_ERR_NOMEM, "%s: %s: out of memory", l->path, doing);
  memcpy(*out, a, (size_t)*n * sizeof **out);
  return LH_ERR_OK;
}

lh_err lh_ledger_version_blobs(lh_ledger *l, int64_t version, lh_ledger_blob **out, int *n) {
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&l->mu);
  lh_err e = version_blobs(l, version, out, n);
  pthread_mutex_unlock(&l->mu);
  if (e) *n = 0;
  return e;
}

lh_err lh_ledger_blob_find(lh_ledger *l, const uint8_t hash[LH_LEDGER_HASH_BYTES],
                           lh_ledger_blob *out, int64_t *version) {
  l = reader_of(l); /* a read: the last commit */
  const char *doing = "looking up a blob";
  pthread_mutex_lock(&l->mu);
  sqlite3_stmt *s = l->st[ST_BLOB_FIND];
  bool row = false;
  lh_err e = LH_ERR_OK;
  if (sqlite3_bind_blob(s, 1, hash, LH_LEDGER_HASH_BYTES, SQLITE_STATIC))
    e = bind_fail(l, s, doing);
  else if (!(e = step(l, s, &row, doing))) {
    if (row && version) *version = sqlite3_column_int64(s, 0);
    if (row && out) {
      memcpy(out->hash, hash, LH_LEDGER_HASH_BYTES);
      out->kind = sqlite3_column_int(s, 1);
      out->from_version = sqlite3_column_int64(s, 2);
      out->size = (uint64_t)sqlite3_column_int64(s, 3);
    }
    reset(s);
  }
  pthread_mutex_unlock(&l->mu);
  if (!e && !row) {
    char hex[2 * LH_LEDGER_HASH_BYTES + 1];
    key_hex(hash, hex);
    e = lh_errorf(LH_ERR_NOTFOUND, "%s: no published version has blob %s", l->path, hex);
  }
  return e;
}

/* The highest version, -1 when none. */
static lh_err latest(lh_ledger *l, int64_t *version, const char *doing) {
  sqlite3_stmt *s = l->st[ST_LATEST];
  bool row;
  lh_err e = step(l, s, &row, doing);
  if (e) return e;
  *version = row && sqlite3_column_type(s, 0) != SQLITE_NULL ? sqlite3_column_int64(s, 0) : -1;
  reset(s);
  return LH_ERR_OK;
}

lh_err lh_ledger_latest_version(lh_ledger *l, int64_t *version) {
  *version = -1;
  pthread_mutex_lock(&l->mu);
  lh_err e = latest(l, version, "reading the latest version");
  pthread_mutex_unlock(&l->mu);
  if (!e && *version < 0) e = lh_errorf(LH_ERR_NOTFOUND, "%s: no version is published", l->path);
  return e;
}

lh_err lh_ledger_next_task(lh_ledger *l, uint64_t *task) {
  *task = 0;
  pthread_mutex_lock(&l->mu);
  sqlite3_stmt *s = l->st[ST_MAX_TASK];
  bool row;
  lh_err e = step(l, s, &row, "reading the highest task leased");
  if (!e) {
    if (row && sqlite3_column_type(s, 0) != SQLITE_NULL)
      *task = (uint64_t)sqlite3_column_int64(s, 0) + 1;
    reset(s);
  }
  pthread_mutex_unlock(&l->mu);
  return e;
}

/* ---------------------------------------------------------------- status and audit */

/* Per-state counts from a (state, count) statement into c. */
static lh_err state_counts(lh_ledger *l, int id, int64_t c[LH_GROUP__COUNT], const char *doing) {
  sqlite3_stmt *s = l->st[id];
  bool row;
  lh_err e;
  memset(c, 0, LH_GROUP__COUNT * sizeof *c);
  while (!(e = step(l, s, &row, doing)) && row) {
    int64_t st = sqlite3_column_int64(s, 0);
    if (st >= 0 && st < LH_GROUP__COUNT) c[st] = sqlite3_column_int64(s, 1);
  }
  if (!e) reset(s);
  return e;
}

static lh_err log_counts(lh_ledger *l, int64_t *live, int64_t *undone, const char *doing) {
  sqlite3_stmt *s = l->st[ST_LOG_COUNTS];
  bool row;
  lh_err e = step(l, s, &row, doing);
  if (e) return e;
  *live = row ? sqlite3_column_int64(s, 0) : 0;
  *undone = row ? sqlite3_column_int64(s, 1) : 0;
  reset(s);
  return LH_ERR_OK;
}

static lh_err stats(lh_ledger *l, lh_ledger_stats_result *r) {
  const char *doing = "reading the status";
  lh_err e = run(l, l->st[ST_BEGIN_READ], doing);
  if (e) return e;
  if (!(e = state_counts(l, ST_STATE_COUNTS, r->groups, doing)) &&
      !(e = latest(l, &r->latest_version, doing)) &&
      !(e = log_counts(l, &r->log_live, &r->log_undone, doing))) {
    sqlite3_stmt *s = l->st[ST_STATS];
    bool row;
    if (!(e = step(l, s, &row, doing))) {
      if (row) {
        r->workers = sqlite3_column_int64(s, 0);
        r->leases = sqlite3_column_int64(s, 1);
        r->versions = sqlite3_column_int64(s, 2);
        r->blob_bytes = sqlite3_column_int64(s, 3);
        r->body_bytes = sqlite3_column_int64(s, 4);
        r->rewinds = sqlite3_column_int64(s, 5);
      }
      reset(s);
    }
  }
  if (!e) {
    sqlite3_stmt *s = l->st[ST_REASONS];
    bool row;
    if (sqlite3_bind_int(s, 1, LH_LEDGER_TOP_REASONS)) e = bind_fail(l, s, doing);
    while (!e && !(e = step(l, s, &row, doing)) && row && r->n_reasons < LH_LEDGER_TOP_REASONS) {
      lh_ledger_reason_count *c = &r->rejected[r->n_reasons++];
      column_text(s, 0, c->reason, sizeof c->reason);
      c->count = sqlite3_column_int64(s, 1);
    }
    if (!e) reset(s);
  }
  return finish(l, e, doing);
}

lh_err lh_ledger_stats(lh_ledger *l, lh_ledger_stats_result *out) {
  l = reader_of(l); /* a read: the last commit */
  memset(out, 0, sizeof *out);
  out->latest_version = -1;
  pthread_mutex_lock(&l->mu);
  lh_err e = stats(l, out);
  pthread_mutex_unlock(&l->mu);
  return e;
}

/* One invariant's first offender: runs s (bound already); a row's group id in column 0, and
 * keeps it in r when lower than what r has. `say` writes the problem from the row. */
/* A column as int64_t (sqlite3_int64 is long long), for printing with PRId64. */
static int64_t col(sqlite3_stmt *s, int c) {
  return (int64_t)sqlite3_column_int64(s, c);
}

typedef void (*audit_say)(sqlite3_stmt *s, char *buf, size_t cap);

static lh_err audit_check(lh_ledger *l, int id, int64_t param, bool bind, audit_say say,
                          lh_ledger_audit_result *r, const char *doing) {
  sqlite3_stmt *s = l->st[id];
  if (bind && sqlite3_bind_int64(s, 1, param)) return bind_fail(l, s, doing);
  bool row;
  lh_err e = step(l, s, &row, doing);
  if (e) return e;
  int64_t g = row ? sqlite3_column_int64(s, 0) : 0;
  if (row && (r->bad_group == 0 || g < r->bad_group)) {
    r->bad_group = g;
    say(s, r->problem, sizeof r->problem);
  }
  reset(s);
  return LH_ERR_OK;
}

static void say_twice(sqlite3_stmt *s, char *buf, size_t cap) {
  snprintf(buf, cap,
           "group %" PRId64 " has %" PRId64 " live training events (versions %" PRId64
           " .. %" PRId64 "), expected at most one",
           col(s, 0), col(s, 1), col(s, 2), col(s, 3));
}

static void say_no_event(sqlite3_stmt *s, char *buf, size_t cap) {
  snprintf(buf, cap,
           "group %" PRId64 " is %s at version %" PRId64
           ", but the live training log has no such event",
           col(s, 0), state_name_i(col(s, 1)), col(s, 2));
}

static void say_stray_event(sqlite3_stmt *s, char *buf, size_t cap) {
  int64_t st = col(s, 3);
  snprintf(buf, cap,
           "group %" PRId64 " has a live training event (%s at version %" PRId64
           "), but the group is %s (trained_at %" PRId64 ")",
           col(s, 0), state_name_i(col(s, 1)), col(s, 2), st < 0 ? "missing" : state_name_i(st),
           col(s, 4));
}

static void say_beyond(sqlite3_stmt *s, char *buf, size_t cap) {
  snprintf(buf, cap,
           "group %" PRId64 " was %s at version %" PRId64 ", beyond the latest published version",
           col(s, 0), state_name_i(col(s, 1)), col(s, 2));
}

static void say_no_body(sqlite3_stmt *s, char *buf, size_t cap) {
  snprintf(buf, cap, "group %" PRId64 " is accepted but has no body", col(s, 0));
}

static void say_trained_at(sqlite3_stmt *s, char *buf, size_t cap) {
  snprintf(buf, cap, "group %" PRId64 " is %s with trained_at %" PRId64, col(s, 0),
           state_name_i(col(s, 1)), col(s, 2));
}

/* The first worker whose kept counts (worker_counts) differ from its groups: *bad, and
 * r->problem says how. */
static lh_err audit_worker_counts(lh_ledger *l, lh_ledger_audit_result *r, bool *bad,
                                  const char *doing) {
  sqlite3_stmt *s = l->st[ST_AUDIT_WORKER_COUNTS];
  bool row;
  lh_err e = step(l, s, &row, doing);
  if (e) return e;
  *bad = row;
  size_t n = 0, cap = sizeof r->problem;
  if (row && sqlite3_column_int(s, 1))
    snprintf(r->problem, cap, "worker %" PRId64 " has no kept group counts", col(s, 0));
  else if (row)
    n = (size_t)snprintf(r->problem, cap, "worker %" PRId64 ": the kept counts say", col(s, 0));
  for (int i = 0; n > 0 && n < cap && i < LH_GROUP__COUNT; i++)
    if (col(s, 2 + i) != col(s, 8 + i))
      n += (size_t)snprintf(r->problem + n, cap - n, " %" PRId64 " %s (its groups %" PRId64 ")",
                            col(s, 2 + i), STATE_NAMES[i], col(s, 8 + i));
  reset(s);
  return LH_ERR_OK;
}

static lh_err audit(lh_ledger *l, lh_ledger_audit_result *r) {
  const char *doing = "auditing the ledger";
  int64_t kept[LH_GROUP__COUNT];
  lh_err e = run(l, l->st[ST_BEGIN_READ], doing);
  if (e) return e;
  if (!(e = state_counts(l, ST_AUDIT_COUNTS, r->groups, doing)) &&
      !(e = state_counts(l, ST_STATE_COUNTS, kept, doing)) &&
      !(e = log_counts(l, &r->log_live, &r->log_undone, doing)) &&
      !(e = latest(l, &r->latest_version, doing)) &&
      !(e = audit_check(l, ST_AUDIT_TWICE, 0, false, say_twice, r, doing)) &&
      !(e = audit_check(l, ST_AUDIT_NO_EVENT, 0, false, say_no_event, r, doing)) &&
      !(e = audit_check(l, ST_AUDIT_STRAY_EVENT, 0, false, say_stray_event, r, doing)) &&
      !(e = audit_check(l, ST_AUDIT_BEYOND, r->latest_version, true, say_beyond, r, doing)) &&
      !(e = audit_check(l, ST_AUDIT_NO_BODY, 0, false, say_no_body, r, doing)))
    e = audit_check(l, ST_AUDIT_TRAINED_AT, 0, false, say_trained_at, r, doing);
  bool bad_counts = false; /* a worker's, not a group's */
  if (!e && !r->bad_group) e = audit_worker_counts(l, r, &bad_counts, doing);
  if ((e = finish(l, e, doing))) return e;
  if (r->bad_group || bad_counts) return lh_errorf(LH_ERR_MISMATCH, "%s: %s", l->path, r->problem);
  for (int i = 0; i < LH_GROUP__COUNT; i++)
    if (kept[i] != r->groups[i]) {
      snprintf(r->problem, sizeof r->problem,
               "the state counts say %" PRId64 " %s groups, the groups %" PRId64, kept[i],
               STATE_NAMES[i], r->groups[i]);
      return lh_errorf(LH_ERR_MISMATCH, "%s: %s", l->path, r->problem);
    }
  return LH_ERR_OK;
}

lh_err lh_ledger_audit(lh_ledger *l, lh_ledger_audit_result *r) {
  memset(r, 0, sizeof *r);
  r->latest_version = -1;
  pthread_mutex_lock(&l->mu);
  lh_err e = audit(l, r);
  pthread_mutex_unlock(&l->mu);
  return e;
}
