/* `longhaul report --run RUN --out FILE.html [--eval-json FILE]`: one self-contained HTML page
 * of a run's plots (lh_report_write, report.h). Flags and the summary line only. */
#include <stdio.h>

#include "cli.h"
#include "longhaul/report.h"

#define CMD "report"

static const lh__flag flags[] = {
    {"run", "RUN", true,
     "run directory of rl or serve: run.json, metrics.jsonl, and ledger.sqlite when served"},
    {"out", "FILE", true, "the HTML page to write (replaced atomically)"},
    {"eval-json", "FILE", false,
     "also draw an evaluation with its intervals: the output of longhaul eval --json FILE"},
};

int lh__cmd_report(int argc, char **argv) {
  lh__args a = {
      .cmd = CMD,
      .about = "Writes one HTML file that needs nothing else to view (no scripts, fonts or "
               "images are loaded)\nwith SVG plots of a run: reward, accuracy, entropy, KL and "
               "clip fraction over steps (raw and\nsmoothed), held-out pass@1 over training "
               "(--eval-every), the staleness histogram, and for\nserve runs bytes per published "
               "version against a snapshot and each worker's groups (from the\nledger); with "
               "--eval-json, the evaluation with its 95% intervals. A plot whose data the run\n"
               "lacks says so. Hover a point for its value. Bad lines of metrics.jsonl are "
               "errors naming the\nfile and line.",
      .flags = flags,
      .n_flags = (int)(sizeof flags / sizeof flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  lh_report_config c = {.run_dir = lh__args_str(&a, "run", NULL),
                        .out_path = lh__args_str(&a, "out", NULL),
                        .eval_json = lh__args_str(&a, "eval-json", NULL)};
  lh_report_summary s;
  lh_err e = lh_report_write(&c, &s);
  if (e) return lh__cli_fail_err(CMD, e);
  printf("wrote %s (%zu bytes): %d plots, %d without data; %d updates, %d held-out evaluations",
         c.out_path, s.bytes, s.plots, s.absent, s.updates, s.evals);
  if (s.versions) printf(", %d versions, %d workers", s.versions, s.workers);
  printf("\n");
  return lh__cli_flush_stdout(CMD);
}
