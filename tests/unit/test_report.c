/* The report's readers and page: metrics.jsonl lines of rl and serve (keys, nulls, eval lines),
 * each kind of bad line refused with the file and line, eval JSON blocks (k in order, intervals
 * checked), and a page written from a run directory made here: which plots hold how many
 * points, which say their data is absent, and that the page references nothing outside. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "longhaul/report.h"

static const char rl_lines[] =
    "{\"step\":1,\"staleness\":0,\"reward_mean\":0.25,\"accuracy\":0.5,\"entropy\":1.5,"
    "\"kl_mu_pi\":0.001,\"kl_loss\":0,\"clip_frac\":null,\"loss\":0.1}\n"
    "{\"kind\":\"eval\",\"step\":1,\"eval_pass1\":0.5,\"eval_lo\":0.25,\"eval_hi\":0.75,"
    "\"eval_tasks\":8,\"eval_s\":0.1}\n"
    "{\"step\":3,\"staleness\":1,\"reward_mean\":0.5,\"accuracy\":0.75,\"entropy\":1.25,"
    "\"kl_mu_pi\":0.002,\"kl_loss\":0,\"clip_frac\":0.125,\"loss\":0.2}\n";

static void test_metrics_rl_and_eval_lines(void **state) {
  (void)state;
  lh_report_metrics m;
  assert_int_equal(lh_report_metrics_parse(rl_lines, strlen(rl_lines), "m", &m), LH_ERR_OK);
  assert_int_equal(m.n, 2);
  assert_true(m.step[0] == 1 && m.step[1] == 3);
  assert_true(m.v[LH_REPORT_REWARD][1] == 0.5 && m.v[LH_REPORT_ENTROPY][0] == 1.5);
  assert_true(isnan(m.v[LH_REPORT_CLIP][0]) && m.v[LH_REPORT_CLIP][1] == 0.125);
  assert_int_equal(m.present[LH_REPORT_CLIP], 1);
  assert_int_equal(m.present[LH_REPORT_STALENESS], 2);
  assert_int_equal(m.n_eval, 1);
  assert_true(m.eval_pass1[0] == 0.5 && m.eval_lo[0] == 0.25 && m.eval_tasks[0] == 8);
  lh_report_metrics_free(&m);
  /* serve's lines name the reward "reward" and lack entropy */
  const char *serve = "{\"step\":1,\"reward\":0.75,\"accuracy\":0.5,\"staleness\":1.5}";
  assert_int_equal(lh_report_metrics_parse(serve, strlen(serve), "m", &m), LH_ERR_OK);
  assert_true(m.n == 1 && m.v[LH_REPORT_REWARD][0] == 0.75 && m.present[LH_REPORT_ENTROPY] == 0);
  lh_report_metrics_free(&m);
}

static void refused(const char *text, const char *want) {
  lh_report_metrics m;
  lh_err e = lh_report_metrics_parse(text, strlen(text), "run/metrics.jsonl", &m);
  if (e == LH_ERR_OK || !strstr(lh_last_error(), want)) {
    print_error("%s: got \"%s\", want \"%s\"\n", text, e ? lh_last_error() : "accepted", want);
    fail();
  }
  assert_int_equal(m.n, 0);
}

static void test_metrics_bad_lines(void **state) {
  (void)state;
  refused("{\"step\":1}\n{\"step\":2,\"entropy\":\"x\"}\n",
          "run/metrics.jsonl:2: \"entropy\": expected a number or null, found string");
  refused("{\"step\":2}\n{\"step\":2}\n", "run/metrics.jsonl:2: step 2 after step 2");
  refused("{\"step\":0}\n", "run/metrics.jsonl:1: \"step\": expected an integer >= 1, found 0");
  refused("{\"step\":1}\n\n{\"step\":2}\n", "run/metrics.jsonl:2: an empty line");
  refused("{\"step\":1}\n[1]\n", "run/metrics.jsonl:2: expected a JSON object, found array");
  refused("{\"step\":1,\n", "run/metrics.jsonl:1: column");
  refused("{\"kind\":\"other\",\"step\":1}", "\"kind\": expected \"eval\"");
  refused("{\"kind\":\"eval\",\"step\":1,\"eval_pass1\":0.9,\"eval_lo\":0.95,\"eval_hi\":1,"
          "\"eval_tasks\":3}",
          "expected eval_lo <= eval_pass1 <= eval_hi");
  refused("{\"kind\":\"eval\",\"step\":1,\"eval_pass1\":0.5,\"eval_lo\":0.25,\"eval_hi\":1.5,"
          "\"eval_tasks\":3}",
          "\"eval_hi\": expected a number in [0, 1], found 1.5");
}

static void test_metrics_line_being_written(void **state) {
  (void)state;
  /* a last line without its newline that does not parse is a write in progress: left out */
  const char *text = "{\"step\":1,\"reward_mean\":0.5}\n{\"step\":2,\"rew";
  lh_report_metrics m;
  assert_int_equal(lh_report_metrics_parse(text, strlen(text), "m", &m), LH_ERR_OK);
  assert_int_equal(m.n, 1);
  lh_report_metrics_free(&m);
}

static const char eval_json[] =
    "{\"command\":\"eval\",\"env\":\"arith\",\"split\":\"test\",\"tasks\":10,\"samples\":2,"
    "\"model\":{\"dir\":\"run\",\"pass_at_k\":{\"2\":{\"mean\":0.6,\"lo\":0.3,\"hi\":0.8,"
    "\"tasks\":10},\"1\":{\"mean\":0.5,\"lo\":0.2,\"hi\":0.8,\"tasks\":10}},"
    "\"mean_reward\":{\"mean\":0.5,\"lo\":0.2,\"hi\":0.8,\"tasks\":10}},"
    "\"paired\":{\"tasks\":10,\"pass_at_k\":{\"1\":{\"mean\":-0.1,\"lo\":-0.3,\"hi\":0.1,"
    "\"tasks\":10}},\"mean_reward\":{\"mean\":-0.1,\"lo\":-0.3,\"hi\":0.1,\"tasks\":10}}}";

static void test_eval_json(void **state) {
  (void)state;
  lh_report_eval ev;
  assert_int_equal(lh_report_eval_parse(eval_json, strlen(eval_json), "ev.json", &ev), LH_ERR_OK);
  assert_int_equal(ev.model.n_k, 2);
  assert_true(ev.model.k[0] == 1 && ev.model.k[1] == 2); /* in order, whatever the keys' */
  assert_true(ev.model.pass[1].mean == 0.6 && !ev.compare.present && ev.paired.present);
  assert_true(ev.paired.pass[0].lo == -0.3);
  assert_string_equal(ev.model.dir, "run");
  lh_report_eval_free(&ev);
  char *bad = strdup(eval_json);
  memcpy(strstr(bad, "\"lo\":0.2"), "\"lo\":0.7", 8); /* lo above the mean */
  assert_int_not_equal(lh_report_eval_parse(bad, strlen(bad), "ev.json", &ev), LH_ERR_OK);
  assert_non_null(strstr(lh_last_error(), "ev.json: model.pass_at_k.1: expected lo <= mean"));
  free(bad);
  const char *other = "{\"command\":\"rl\"}";
  assert_int_not_equal(lh_report_eval_parse(other, strlen(other), "x.json", &ev), LH_ERR_OK);
  assert_non_null(strstr(lh_last_error(), "x.json: \"command\": expected \"eval\""));
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* The points of the <svg data-plot="id">, or -1 without one; *absent when it says so. */
static int plot_points(const char *html, const char *id, int *absent) {
  char key[64];
  snprintf(key, sizeof key, "data-plot=\"%s\"", id);
  const char *p = strstr(html, key);
  if (!p) return -1;
  *absent = !strncmp(p + strlen(key), " data-absent=\"1\"", 16);
  const char *end = strstr(p, *absent ? "</figure>" : "</svg>");
  int n = 0;
  for (const char *q = strstr(p, "class=\"pt\""); q && q < end; q = strstr(q + 1, "class=\"pt\""))
    n++;
  return n;
}

static void test_page(void **state) {
  (void)state;
  char dir[] = "/tmp/lh_report_XXXXXX", path[256], out[256];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/run.json", dir);
  write_file(path, "{\"command\":\"longhaul rl <x>\",\"env\":\"arith\",\"group\":4}");
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  write_file(path, rl_lines);
  snprintf(out, sizeof out, "%s/page.html", dir);
  lh_report_config c = {.run_dir = dir, .out_path = out};
  lh_report_summary s;
  assert_int_equal(lh_report_write(&c, &s), LH_ERR_OK);
  assert_int_equal(s.updates, 2);
  assert_int_equal(s.evals, 1);
  char *html = NULL;
  size_t len = 0;
  assert_int_equal(lh_file_read(out, (size_t)1 << 24, &html, &len), LH_ERR_OK);
  assert_int_equal(len, s.bytes);
  int absent = 0;
  assert_int_equal(plot_points(html, "reward", &absent), 2);
  assert_false(absent);
  assert_int_equal(plot_points(html, "clip", &absent), 1); /* the null is a gap */
  assert_int_equal(plot_points(html, "kl", &absent), 2);   /* kl_loss, 0 throughout, left out */
  assert_int_equal(plot_points(html, "heldout", &absent), 1);
  assert_int_equal(plot_points(html, "staleness", &absent), 2); /* bins 0 and 1 */
  plot_points(html, "bytes", &absent);
  assert_true(absent);
  plot_points(html, "eval", &absent);
  assert_true(absent);
  free(html);
  /* with an eval JSON: pass@1, pass@2 and the mean reward, for the model and the difference */
  snprintf(path, sizeof path, "%s/ev.json", dir);
  write_file(path, eval_json);
  c.eval_json = path;
  assert_int_equal(lh_report_write(&c, &s), LH_ERR_OK);
  assert_int_equal(lh_file_read(out, (size_t)1 << 24, &html, &len), LH_ERR_OK);
  assert_int_equal(plot_points(html, "eval", &absent), 3);
  assert_false(absent);
  assert_int_equal(plot_points(html, "paired", &absent), 3);
  c.eval_json = NULL;
  assert_null(strstr(html, "src="));
  assert_null(strstr(html, "href="));
  assert_non_null(strstr(html, "longhaul rl &lt;x&gt;")); /* escaped */
  free(html);
  /* a bad line: no page */
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  write_file(path, "{\"step\":1}\n{\"step\":1}\n");
  unlink(out);
  assert_int_not_equal(lh_report_write(&c, &s), LH_ERR_OK);
  assert_non_null(strstr(lh_last_error(), "metrics.jsonl:2: step 1 after step 1"));
  assert_int_not_equal(access(out, F_OK), 0);
  snprintf(path, sizeof path, "rm -rf %s", dir);
  assert_int_equal(system(path), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_metrics_rl_and_eval_lines),
      cmocka_unit_test(test_metrics_bad_lines),
      cmocka_unit_test(test_metrics_line_being_written),
      cmocka_unit_test(test_eval_json),
      cmocka_unit_test(test_page),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
