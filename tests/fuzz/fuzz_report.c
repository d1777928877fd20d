/* libFuzzer target for the report's readers of outside bytes: any bytes through
 * lh_report_metrics_parse (metrics.jsonl) and lh_report_eval_parse (eval --json). A refusal
 * names the input; what is accepted keeps the documented invariants (steps increasing, eval
 * points within their intervals, k increasing and bounded). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "longhaul/report.h"

#include "fuzz_util.h"

static void check_block(const lh_report_eval_block *b, double lo) {
  if (!b->present) return;
  CHECK(b->n_k >= 1 && b->n_k <= LH_REPORT_MAX_K);
  for (int i = 0; i < b->n_k; i++) {
    CHECK(b->k[i] >= 1 && (i == 0 || b->k[i] > b->k[i - 1]));
    CHECK(b->pass[i].lo >= lo && b->pass[i].hi <= 1 && b->pass[i].lo <= b->pass[i].hi);
  }
  CHECK(isfinite(b->mean_reward.mean));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lh_report_metrics m;
  lh_err e = lh_report_metrics_parse((const char *)data, size, "fuzz", &m);
  if (e) {
    CHECK(strncmp(lh_last_error(), "fuzz", 4) == 0);
    CHECK(m.n == 0 && m.step == NULL && m.n_eval == 0);
  } else {
    for (int i = 1; i < m.n; i++)
      CHECK(m.step[i] > m.step[i - 1]);
    for (int i = 0; i < m.n; i++)
      CHECK(m.step[i] >= 1);
    for (int i = 0; i < m.n_eval; i++) {
      CHECK(m.eval_lo[i] >= 0 && m.eval_lo[i] <= m.eval_pass1[i]);
      CHECK(m.eval_pass1[i] <= m.eval_hi[i] && m.eval_hi[i] <= 1 && m.eval_tasks[i] >= 1);
      CHECK(i == 0 || m.eval_step[i] >= m.eval_step[i - 1]);
    }
    for (int k = 0; k < LH_REPORT__COUNT; k++)
      CHECK(m.present[k] >= 0 && m.present[k] <= m.n);
  }
  lh_report_metrics_free(&m);
  lh_report_eval ev;
  e = lh_report_eval_parse((const char *)data, size, "fuzz", &ev);
  if (e) {
    CHECK(strncmp(lh_last_error(), "fuzz", 4) == 0);
    CHECK(ev.env == NULL && !ev.model.present);
  } else {
    CHECK(ev.model.present && ev.env && ev.split && ev.tasks >= 1 && ev.samples >= 1);
    check_block(&ev.model, 0);
    check_block(&ev.compare, 0);
    check_block(&ev.paired, -1);
  }
  lh_report_eval_free(&ev);
  return 0;
}
