/* `longhaul worker`: syncs the policy from a server, generates leased prompt groups and submits
 * them (lh_worker_run, node.h). Starts from nothing but the server's URL and the trainer's
 * public key; keeps going through server restarts and dropped connections. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longhaul/node.h"

#define CMD "worker"

static const lh__flag flags[] = {
    {"server", "URL", true, "the server, http://HOST:PORT (workers only dial out)"},
    {"key", "FILE", true, "this worker's Ed25519 secret key (made when missing)"},
    {"trust-key", "PUBKEY", true, "the trainer's public key file: manifests must be signed by it"},
    {"dir", "DIR", false,
     "working directory: blobs, policy, unsent groups (default longhaul-worker)"},
    {"name", "NAME", false, "name shown in the server's status (default: the host name)"},
    {"threads", "N", false, "generation threads (default: all cores)"},
    {"slots", "N", false, "sequences generated concurrently (default 16)"},
    {"max-groups", "N", false, "stop after submitting N groups (default 0: never)"},
    {"adversary", "MODE", false,
     "TESTING ONLY: cheat in this way, to test a server's defences (docs/SECURITY.md): "
     "other-model | quant4 | quant8 | prompt | tokens | temperature | top-p | best-of-n | "
     "drop-member | dup-member | logprobs | reward | replay | version | garbage | oversized | "
     "slowloris | selective (submits the most likely of every 4 groups, abandons the rest) | "
     "truncate (cuts completions short without a stop token)"},
};

int lh__cmd_worker(int argc, char **argv) {
  lh__args a = {.cmd = CMD,
                .about = "A rollout worker: registers its key, syncs the policy (signed manifests, "
                         "patches, snapshots), leases prompt groups, generates and submits them. "
                         "SIGINT or SIGTERM stops it; generated groups not yet answered are kept "
                         "in DIR/pending and sent on the next start. At exit it prints what it "
                         "submitted, its policy syncs (how many, versions and seconds each, how "
                         "far behind they ended, snapshots fetched) and the round trips of its "
                         "submissions (p50, p90, max); LONGHAUL_LOG=debug logs every sync.",
                .flags = flags,
                .n_flags = sizeof flags / sizeof flags[0]};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  lh_worker_config c = lh_worker_defaults();
  long threads, slots, max_groups;
  int adv = 0;
  if ((rc = lh__args_int(&a, "threads", 0, 1024, 0, &threads)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "slots", 1, 4096, c.slots, &slots)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_int(&a, "max-groups", 0, 1L << 40, 0, &max_groups)) != LH__ARGS_CONTINUE ||
      (rc = lh__args_choice(&a, "adversary", lh_node_adversary_names, 0, &adv)) !=
          LH__ARGS_CONTINUE)
    return rc;
  lh_set_threads((int)threads);
  c.server = lh__args_str(&a, "server", NULL);
  c.key_path = lh__args_str(&a, "key", NULL);
  c.trust_path = lh__args_str(&a, "trust-key", NULL);
  c.dir = lh__args_str(&a, "dir", c.dir);
  c.name = lh__args_str(&a, "name", NULL);
  c.threads = (int)threads;
  c.slots = (int)slots;
  c.max_groups = max_groups;
  c.adversary = (lh_node_adversary)adv;
  if (adv)
    fprintf(stderr, "worker: --adversary %s: a cheating worker, for testing only\n",
            lh_node_adversary_names[adv]);
  c.stop = &lh__stop;
  lh__stop_on_signals();
  lh_worker_result res;
  lh_err e = lh_worker_run(&c, &res);
  fprintf(stderr,
          "worker: %lld groups submitted, %lld refused, %lld blobs applied, %.1f MB "
          "downloaded\n",
          (long long)res.groups_submitted, (long long)res.groups_refused,
          (long long)res.versions_applied, (double)res.bytes_downloaded / 1e6);
  if (res.syncs > 0)
    fprintf(stderr,
            "worker: %lld policy syncs, %.1f versions and %.2f s each on average, %.2f newer "
            "versions known as each ended, %lld snapshots\n",
            (long long)res.syncs, (double)res.sync_versions / (double)res.syncs,
            res.sync_s / (double)res.syncs, (double)res.sync_behind / (double)res.syncs,
            (long long)res.snapshots_fetched);
  if (res.groups_submitted + res.groups_refused > 0)
    fprintf(stderr, "worker: submission round trip p50 %.0f ms, p90 %.0f ms, max %.0f ms\n",
            lh_worker_rtt_quantile(&res, 0.5), lh_worker_rtt_quantile(&res, 0.9),
            lh_worker_rtt_quantile(&res, 1.0));
  if (e) return lh__cli_fail_err(CMD, e);
  if (lh__stop) return lh__stop_exit_code();
  return LH__EXIT_OK;
}
