/* longhaul report: the HTML page of a run (report.h). Reads run.json, metrics.jsonl, the ledger
 * of a served run and an eval JSON, and writes one file that needs nothing else: the style is
 * inline, every plot is SVG drawn by svg.c, and there is no script. A plot whose data the run
 * lacks is a box that says so. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "longhaul/ledger.h"
#include "longhaul/report.h"
#include "report_impl.h"

static const char css[] =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;"
    "max-width:1340px;padding:0 16px;color:#222;background:#fff}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px "
    "solid #ddd;padding-bottom:4px}"
    ".grid{display:flex;flex-wrap:wrap;gap:12px}"
    "figure{margin:0;border:1px solid #e3e3e3;border-radius:4px;background:#fcfcfc}"
    "figure.absent{width:640px;min-height:120px;display:flex;flex-direction:column;"
    "justify-content:center;padding:0 20px;box-sizing:border-box;color:#777;background:#f6f6f6}"
    "figure.absent b{color:#444}"
    "svg.chart{display:block;max-width:100%;height:auto}"
    "svg .title{font-size:14px;font-weight:600;fill:#222}"
    "svg .tick{font-size:11px;fill:#555}svg .label{font-size:12px;fill:#333}"
    "svg .legend text{font-size:11px;fill:#333}"
    "svg .grid{stroke:#e6e6e6}svg .axis{stroke:#888}svg .ref{stroke:#555}"
    "svg .pt:hover{stroke:#000;stroke-width:1.5}"
    "table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 8px;"
    "text-align:left;font-size:13px}th{background:#f3f3f3}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}"
    ".meta{color:#555}code{font-size:12px;background:#f3f3f3;padding:1px 4px;"
    "word-break:break-all}";

typedef struct page {
  lh__sb b;
  lh_report_summary sum;
} page;

static void absent(page *p, const char *id, const char *title, const char *why) {
  lh__sb_printf(&p->b, "<figure class=\"absent\" data-plot=\"%s\" data-absent=\"1\"><b>", id);
  lh__sb_html(&p->b, title);
  lh__sb_printf(&p->b, "</b><p>");
  lh__sb_html(&p->b, why);
  lh__sb_printf(&p->b, "</p></figure>\n");
  p->sum.absent++;
}

static void figure_begin(page *p) {
  lh__sb_printf(&p->b, "<figure>\n");
}
static void figure_end(page *p) {
  lh__sb_printf(&p->b, "</figure>\n");
  p->sum.plots++;
}

/* Smoothing weight: stronger for longer runs (TensorBoard's slider, chosen by length). */
static double smooth_weight(int n) {
  return n >= 200 ? 0.95 : n >= 50 ? 0.9 : 0.7;
}

static bool all_zero(const double *v, int n) {
  for (int i = 0; i < n; i++)
    if (isfinite(v[i]) && v[i] != 0) return false;
  return true;
}

/* One or two metrics over steps (a second one that is 0 throughout is left out), each raw (points)
 * and smoothed (a line). */
static void over_steps(page *p, const lh_report_metrics *m, const char *id, const char *title,
                       const char *ylabel, const lh_report_key *keys, const char *const *names,
                       int n_keys, bool unit_range, const char *why_absent) {
  lh__series s[4];
  double *sm[2] = {NULL, NULL};
  int ns = 0;
  for (int i = 0; i < n_keys && i < 2; i++) {
    lh_report_key k = keys[i];
    if (m->present[k] == 0 || (i > 0 && all_zero(m->v[k], m->n))) continue;
    sm[i] = lh_xmalloc((size_t)m->n * sizeof *sm[i]);
    lh__smooth(m->v[k], m->n, smooth_weight(m->n), sm[i]);
    s[ns++] = (lh__series){.name = names[i], .x = m->step, .y = m->v[k], .n = m->n, .color = i};
    s[ns++] =
        (lh__series){.name = NULL, .x = m->step, .y = sm[i], .n = m->n, .smooth = true, .color = i};
  }
  if (ns == 0) {
    absent(p, id, title, why_absent);
    return;
  }
  /* the smoothed line is named after the raw one, in the legend */
  char names_s[2][96];
  for (int i = 0, j = 0; i < ns; i += 2, j++) {
    snprintf(names_s[j], sizeof names_s[j], "%s (smoothed)", s[i].name);
    s[i + 1].name = names_s[j];
  }
  lh__chart c = {.id = id, .title = title, .xlabel = "step", .ylabel = ylabel, .ref_y = NAN};
  if (unit_range) {
    c.has_y_range = true;
    c.y_min = 0;
    c.y_max = 1;
  }
  figure_begin(p);
  lh__svg_lines(&p->b, &c, s, ns);
  figure_end(p);
  free(sm[0]);
  free(sm[1]);
}

static void heldout(page *p, const lh_report_metrics *m) {
  if (m->n_eval == 0) {
    absent(p, "heldout", "Held-out pass@1 over training",
           "Not recorded: this run was trained without --eval-every (rl or serve --eval-every N "
           "evaluates greedy pass@1 on test tasks every N updates).");
    return;
  }
  lh__series s = {.name = "greedy pass@1 (95% interval)",
                  .x = m->eval_step,
                  .y = m->eval_pass1,
                  .n = m->n_eval,
                  .lo = m->eval_lo,
                  .hi = m->eval_hi,
                  .color = 2};
  char title[128];
  snprintf(title, sizeof title, "Held-out pass@1 over training (%d test tasks)",
           m->eval_tasks[m->n_eval - 1]);
  lh__chart c = {.id = "heldout",
                 .title = title,
                 .xlabel = "step",
                 .ylabel = "pass@1",
                 .has_y_range = true,
                 .y_min = 0,
                 .y_max = 1,
                 .ref_y = NAN};
  figure_begin(p);
  lh__svg_lines(&p->b, &c, &s, 1);
  figure_end(p);
}

/* A histogram of staleness values (0 .. LH_REPORT_MAX_STALENESS, the last bin holding more). */
static void staleness_hist(page *p, const int64_t *count, const char *what) {
  int top = 0;
  int64_t total = 0;
  for (int i = 0; i <= LH_REPORT_MAX_STALENESS; i++)
    if (count[i]) {
      top = i;
      total += count[i];
    }
  if (total == 0) {
    absent(p, "staleness", "Staleness",
           "Not recorded: no update line of metrics.jsonl holds \"staleness\".");
    return;
  }
  char labels_buf[LH_REPORT_MAX_STALENESS + 1][16];
  const char *labels[LH_REPORT_MAX_STALENESS + 1];
  double y[LH_REPORT_MAX_STALENESS + 1];
  for (int i = 0; i <= top; i++) {
    snprintf(labels_buf[i], sizeof labels_buf[i], "%d%s", i,
             i == LH_REPORT_MAX_STALENESS ? "+" : "");
    labels[i] = labels_buf[i];
    y[i] = (double)count[i];
  }
  lh__series s = {.name = what, .y = y, .n = top + 1, .color = 4};
  lh__chart c = {.id = "staleness",
                 .title = "Staleness histogram",
                 .xlabel = "versions behind",
                 .ylabel = "count",
                 .ref_y = NAN};
  figure_begin(p);
  lh__svg_bars(&p->b, &c, labels, top + 1, &s, 1);
  figure_end(p);
}

/* ---------------------------------------------------------------- the ledger (serve runs) */

typedef struct served {
  bool has;
  int n_versions;
  double *version, *patch, *snapshot; /* (n_versions) bytes, NAN where none */
  double full;                        /* the largest snapshot */
  lh_ledger_worker *workers;
  int n_workers;
  int64_t stale[LH_REPORT_MAX_STALENESS + 1]; /* trained groups by staleness */
  int64_t stale_total;
} served;

static void served_free(served *v) {
  free(v->version);
  free(v->patch);
  free(v->snapshot);
  free(v->workers);
}

static lh_err read_ledger(const char *path, served *v) {
  lh_ledger *l = NULL;
  lh_ledger_log_entry *log = NULL;
  int n_log = 0;
  int64_t latest = -1;
  lh_err e = lh_ledger_open(path, &l);
  if (!e) {
    e = lh_ledger_latest_version(l, &latest);
    if (e == LH_ERR_NOTFOUND) {
      latest = -1;
      e = LH_ERR_OK;
    }
  }
  if (!e && latest + 1 > LH_REPORT_MAX_VERSIONS)
    e = lh_errorf(LH_ERR_LIMIT, "%s: %lld versions, the report draws at most %d", path,
                  (long long)latest + 1, LH_REPORT_MAX_VERSIONS);
  v->has = true;
  v->full = NAN;
  if (!e && latest >= 0) {
    v->n_versions = (int)latest + 1;
    v->version = lh_xmalloc((size_t)v->n_versions * sizeof *v->version);
    v->patch = lh_xmalloc((size_t)v->n_versions * sizeof *v->patch);
    v->snapshot = lh_xmalloc((size_t)v->n_versions * sizeof *v->snapshot);
  }
  for (int i = 0; !e && i < v->n_versions; i++) {
    lh_ledger_blob *b = NULL;
    int nb = 0;
    v->version[i] = i;
    v->patch[i] = v->snapshot[i] = NAN;
    if ((e = lh_ledger_version_blobs(l, i, &b, &nb))) break;
    for (int j = 0; j < nb; j++) {
      double *slot = b[j].kind == 0 ? &v->snapshot[i] : &v->patch[i];
      *slot = (isfinite(*slot) ? *slot : 0) + (double)b[j].size;
      if (b[j].kind == 0 && !(b[j].size <= v->full)) v->full = (double)b[j].size;
    }
    free(b);
  }
  if (!e) e = lh_ledger_workers(l, &v->workers, &v->n_workers);
  if (!e && v->n_workers > LH_REPORT_MAX_WORKERS) v->n_workers = LH_REPORT_MAX_WORKERS;
  /* every group trained and standing: the update's version before it minus the version used */
  if (!e) e = lh_ledger_log(l, &log, &n_log);
  for (int i = 0; !e && i < n_log; i++) {
    if (log[i].undone_by || log[i].what != LH_GROUP_TRAINED) continue;
    lh_ledger_group g;
    if ((e = lh_ledger_group_get(l, log[i].group, &g))) break;
    int64_t k = log[i].version - 1 - g.version_used;
    lh_ledger_group_clear(&g);
    if (k < 0) k = 0;
    v->stale[k > LH_REPORT_MAX_STALENESS ? LH_REPORT_MAX_STALENESS : k]++;
    v->stale_total++;
  }
  free(log);
  lh_ledger_close(l);
  return e;
}

static void bytes_chart(page *p, const served *v) {
  if (!v->has || v->n_versions == 0) {
    absent(p, "bytes", "Bytes per version",
           v->has ? "No version was published in this run's ledger."
                  : "Not a served run: only `longhaul serve` publishes versions as patches "
                    "(RUN/ledger.sqlite).");
    return;
  }
  lh__series s[2] = {
      {.name = "patch bytes", .x = v->version, .y = v->patch, .n = v->n_versions, .color = 0},
      {.name = "snapshot bytes (keyframes)",
       .x = v->version,
       .y = v->snapshot,
       .n = v->n_versions,
       .color = 3}};
  lh__chart c = {.id = "bytes",
                 .title = "Bytes per published version",
                 .xlabel = "version",
                 .ylabel = "bytes (log)",
                 .log_y = true,
                 .ref_y = v->full,
                 .ref_label = "a full snapshot"};
  figure_begin(p);
  lh__svg_lines(&p->b, &c, s, 2);
  figure_end(p);
  p->sum.versions = v->n_versions;
}

static void workers_chart(page *p, const served *v) {
  if (!v->has || v->n_workers == 0) {
    absent(p, "workers", "Per-worker contribution",
           v->has ? "No worker registered in this run's ledger."
                  : "Not a served run: workers exist only in `longhaul serve` runs "
                    "(RUN/ledger.sqlite).");
    return;
  }
  int n = v->n_workers;
  static const lh_group_state states[4] = {LH_GROUP_TRAINED, LH_GROUP_DROPPED, LH_GROUP_REJECTED,
                                           LH_GROUP_EXPIRED};
  char(*names)[LH_LEDGER_NAME_MAX + 12] = lh_xmalloc((size_t)n * sizeof *names);
  const char **labels = lh_xmalloc((size_t)n * sizeof *labels);
  double *y = lh_xmalloc((size_t)n * 4 * sizeof *y);
  lh__series s[4];
  for (int i = 0; i < n; i++) {
    const lh_ledger_worker *w = &v->workers[i];
    if (w->name[0])
      snprintf(names[i], sizeof names[i], "%s", w->name);
    else
      snprintf(names[i], sizeof names[i], "%02x%02x%02x%02x", w->key[0], w->key[1], w->key[2],
               w->key[3]);
    labels[i] = names[i];
    for (int k = 0; k < 4; k++)
      y[k * n + i] = (double)w->groups[states[k]];
  }
  for (int k = 0; k < 4; k++)
    s[k] = (lh__series){.name = lh_group_state_name(states[k]),
                        .y = y + k * n,
                        .n = n,
                        .color = k == 0   ? 2
                                 : k == 1 ? 3
                                 : k == 2 ? 1
                                          : 7};
  lh__chart c = {.id = "workers",
                 .title = "Per-worker contribution (groups)",
                 .xlabel = "worker",
                 .ylabel = "groups",
                 .ref_y = NAN};
  figure_begin(p);
  lh__svg_bars(&p->b, &c, labels, n, s, 4);
  figure_end(p);
  p->sum.workers = n;
  free(names);
  free(labels);
  free(y);
}

/* ---------------------------------------------------------------- evaluation */

static void ci_cells(page *p, const lh_report_ci *c) {
  lh__sb_printf(&p->b, "<td class=\"num\">%.3f</td><td class=\"num\">[%.3f, %.3f]</td>", c->mean,
                c->lo, c->hi);
}

/* Row i of the evaluation (model's k[i], or the mean reward after them) of block blk; NAN
 * where blk lacks it. */
static lh_report_ci row_ci(const lh_report_eval_block *blk, const lh_report_eval_block *m, int i) {
  lh_report_ci c = {NAN, NAN, NAN, 0};
  if (!blk) return c;
  if (i == m->n_k) return blk->mean_reward;
  for (int j = 0; j < blk->n_k; j++)
    if (blk->k[j] == m->k[i]) c = blk->pass[j];
  return c;
}

static void eval_section(page *p, const lh_report_eval *ev, const char *path) {
  if (!ev) {
    absent(p, "eval", "Evaluation with intervals",
           "No evaluation given: pass the output of `longhaul eval --json FILE` with "
           "--eval-json FILE.");
    return;
  }
  const lh_report_eval_block *m = &ev->model, *cm = ev->compare.present ? &ev->compare : NULL;
  int n = m->n_k + 1;
  char(*lab)[24] = lh_xmalloc((size_t)n * sizeof *lab);
  const char **labels = lh_xmalloc((size_t)n * sizeof *labels);
  double *v = lh_xmalloc((size_t)6 * n * sizeof *v);
  for (int i = 0; i < n; i++) {
    if (i < m->n_k)
      snprintf(lab[i], sizeof lab[i], "pass@%d", m->k[i]);
    else
      snprintf(lab[i], sizeof lab[i], "mean reward");
    labels[i] = lab[i];
    for (int b = 0; b < 2; b++) {
      lh_report_ci r = row_ci(b ? cm : m, m, i);
      v[(3 * b + 0) * n + i] = r.mean;
      v[(3 * b + 1) * n + i] = r.lo;
      v[(3 * b + 2) * n + i] = r.hi;
    }
  }
  lh__series s[2] = {
      {.name = "model", .y = v, .n = n, .lo = v + n, .hi = v + 2 * n, .color = 0},
      {.name = "compare", .y = v + 3 * n, .n = n, .lo = v + 4 * n, .hi = v + 5 * n, .color = 7}};
  char title[160];
  snprintf(title, sizeof title, "Evaluation: %d %s tasks, %d sample%s each (95%% intervals)",
           ev->tasks, ev->split, ev->samples, ev->samples == 1 ? "" : "s");
  lh__chart c = {.id = "eval",
                 .title = title,
                 .xlabel = "",
                 .ylabel = "",
                 .has_y_range = true,
                 .y_min = 0,
                 .y_max = 1,
                 .ref_y = NAN};
  figure_begin(p);
  lh__svg_bars(&p->b, &c, labels, n, s, cm ? 2 : 1);
  figure_end(p);
  if (ev->paired.present) {
    const lh_report_eval_block *d = &ev->paired;
    double *dv = lh_xmalloc((size_t)3 * n * sizeof *dv);
    for (int i = 0; i < n; i++) {
      lh_report_ci ci = row_ci(d, m, i);
      dv[i] = ci.mean;
      dv[n + i] = ci.lo;
      dv[2 * n + i] = ci.hi;
    }
    lh__series ds = {
        .name = "model - compare", .y = dv, .n = n, .lo = dv + n, .hi = dv + 2 * n, .color = 1};
    lh__chart dc = {.id = "paired",
                    .title = "Paired difference, model - compare (95% intervals)",
                    .xlabel = "",
                    .ylabel = "",
                    .ref_y = 0,
                    .ref_label = "no difference"};
    figure_begin(p);
    lh__svg_bars(&p->b, &dc, labels, n, &ds, 1);
    figure_end(p);
    free(dv);
  }
  /* the numbers, as a table */
  lh__sb_printf(&p->b, "</div>\n<p class=\"meta\">From <code>");
  lh__sb_html(&p->b, path);
  lh__sb_printf(&p->b, "</code>: env <code>");
  lh__sb_html(&p->b, ev->env);
  lh__sb_printf(&p->b, "</code>, model <code>");
  lh__sb_html(&p->b, m->dir);
  if (cm) {
    lh__sb_printf(&p->b, "</code>, compare <code>");
    lh__sb_html(&p->b, cm->dir);
  }
  lh__sb_printf(&p->b, "</code>.</p>\n<table><tr><th></th><th>model</th><th>95%% interval</th>");
  if (cm) lh__sb_printf(&p->b, "<th>compare</th><th>95%% interval</th>");
  if (ev->paired.present) lh__sb_printf(&p->b, "<th>difference</th><th>95%% interval</th>");
  lh__sb_printf(&p->b, "</tr>\n");
  for (int i = 0; i < n; i++) {
    lh__sb_printf(&p->b, "<tr><td>%s</td>", labels[i]);
    for (int b = 0; b < (cm ? 2 : 1); b++) {
      lh_report_ci r = row_ci(b ? cm : m, m, i);
      ci_cells(p, &r);
    }
    if (ev->paired.present) {
      lh_report_ci r = row_ci(&ev->paired, m, i);
      ci_cells(p, &r);
    }
    lh__sb_printf(&p->b, "</tr>\n");
  }
  lh__sb_printf(&p->b, "</table>\n<div class=\"grid\">\n");
  free(lab);
  free(labels);
  free(v);
}

/* ---------------------------------------------------------------- the page */

/* A row of the settings table from run.json, when the key holds a string or a number. */
static void setting_row(page *p, const json_t *o, const char *key, const char *label) {
  json_t *v = json_object_get(o, key);
  char num[64];
  const char *text = NULL;
  if (json_is_string(v))
    text = json_string_value(v);
  else if (json_is_integer(v))
    snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v)), text = num;
  else if (json_is_real(v))
    snprintf(num, sizeof num, "%g", json_real_value(v)), text = num;
  if (!text) return;
  lh__sb_printf(&p->b, "<tr><th>%s</th><td><code>", label);
  lh__sb_html(&p->b, text);
  lh__sb_printf(&p->b, "</code></td></tr>\n");
}

static void settings_table(page *p, const json_t *run, const lh_report_metrics *m) {
  lh__sb_printf(&p->b, "<table>\n");
  setting_row(p, run, "command", "command");
  setting_row(p, run, "model", "starting model");
  setting_row(p, run, "env", "environment");
  setting_row(p, run, "started", "started (UTC)");
  setting_row(p, run, "longhaul_version", "longhaul");
  json_t *loss = json_object_get(run, "loss"), *opt = json_object_get(run, "opt");
  if (json_is_object(loss)) setting_row(p, loss, "kind", "loss");
  if (json_is_object(opt)) setting_row(p, opt, "lr", "learning rate");
  setting_row(p, run, "group", "completions per prompt");
  setting_row(p, run, "prompts", "prompts per update");
  setting_row(p, run, "staleness", "staleness (bound)");
  setting_row(p, run, "eval_every", "--eval-every");
  lh__sb_printf(
      &p->b, "<tr><th>updates recorded</th><td class=\"num\">%d (steps %.0f .. %.0f)</td></tr>\n",
      m->n, m->n ? m->step[0] : 0.0, m->n ? m->step[m->n - 1] : 0.0);
  lh__sb_printf(&p->b, "</table>\n");
}

static lh_err read_json_file(const char *path, json_t **out) {
  char *text = NULL;
  size_t len = 0;
  *out = NULL;
  lh_err e = lh_file_read(path, (size_t)1 << 20, &text, &len);
  if (e) return e;
  json_error_t je;
  json_t *o = json_loadb(text, len, 0, &je);
  free(text);
  if (!json_is_object(o)) {
    json_decref(o);
    return lh_errorf(LH_ERR_FORMAT, "%s: expected a JSON object (run settings)%s%s", path,
                     o ? "" : ": ", o ? "" : je.text);
  }
  *out = o;
  return LH_ERR_OK;
}

lh_err lh_report_write(const lh_report_config *c, lh_report_summary *summary) {
  page p = {0};
  lh_report_metrics m = {0};
  lh_report_eval ev = {0};
  served sv = {0};
  json_t *run = NULL;
  char *text = NULL;
  size_t len = 0;
  char *runjson = lh_path_join(c->run_dir, "run.json"),
       *metrics = lh_path_join(c->run_dir, "metrics.jsonl"),
       *ledger = lh_path_join(c->run_dir, "ledger.sqlite");
  bool has_eval = false;
  struct stat st;
  lh_err e = read_json_file(runjson, &run);
  if (!e) e = lh_file_read(metrics, LH_REPORT_MAX_FILE, &text, &len);
  if (!e) e = lh_report_metrics_parse(text, len, metrics, &m);
  free(text);
  text = NULL;
  if (!e && c->eval_json) {
    if (!(e = lh_file_read(c->eval_json, LH_REPORT_MAX_FILE, &text, &len)))
      e = lh_report_eval_parse(text, len, c->eval_json, &ev);
    free(text);
    has_eval = !e;
  }
  if (!e && stat(ledger, &st) == 0) e = read_ledger(ledger, &sv);
  if (e) goto out;

  lh__sb *b = &p.b;
  lh__sb_printf(b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
                   "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                   "<title>longhaul report: ");
  lh__sb_html(b, c->run_dir);
  lh__sb_printf(b,
                "</title>\n<style>%s</style></head><body>\n<h1>longhaul report</h1>\n"
                "<p class=\"meta\">Run <code>",
                css);
  lh__sb_html(b, c->run_dir);
  lh__sb_printf(b,
                "</code>%s. Points are the values of each update; lines are their "
                "exponential moving average. Hover a point for its value.</p>\n",
                sv.has ? " (served: ledger.sqlite read)" : "");
  settings_table(&p, run, &m);

  lh__sb_printf(b, "<h2>Training</h2>\n<div class=\"grid\">\n");
  static const char serve_lacks[] =
      "Not recorded: serve's metrics lines carry reward, accuracy, loss and staleness only.";
  const bool served_lines = m.present[LH_REPORT_ENTROPY] == 0 && m.present[LH_REPORT_CLIP] == 0;
  {
    lh_report_key k[1] = {LH_REPORT_REWARD};
    const char *nm[1] = {"reward"};
    over_steps(&p, &m, "reward", "Reward (mean of the update's completions)", "reward", k, nm, 1,
               false, "Not recorded: no update line holds a reward.");
  }
  {
    lh_report_key k[1] = {LH_REPORT_ACCURACY};
    const char *nm[1] = {"accuracy"};
    over_steps(&p, &m, "accuracy", "Accuracy (training completions)", "accuracy", k, nm, 1, true,
               "Not recorded: no update line holds an accuracy.");
  }
  {
    lh_report_key k[1] = {LH_REPORT_ENTROPY};
    const char *nm[1] = {"entropy"};
    over_steps(&p, &m, "entropy", "Entropy of the policy (nats per token)", "entropy", k, nm, 1,
               false,
               served_lines ? serve_lacks : "Not recorded: no update line holds an entropy.");
  }
  {
    lh_report_key k[2] = {LH_REPORT_KL_MU_PI, LH_REPORT_KL_REF};
    const char *nm[2] = {"KL behaviour to policy", "KL to the start"};
    over_steps(&p, &m, "kl", "KL divergence", "KL", k, nm, 2, false,
               served_lines ? serve_lacks : "Not recorded: no update line holds a KL.");
  }
  {
    lh_report_key k[1] = {LH_REPORT_CLIP};
    const char *nm[1] = {"clip fraction"};
    over_steps(&p, &m, "clip", "Clip fraction (tokens whose ratio was clipped)", "fraction", k, nm,
               1, false,
               served_lines ? serve_lacks : "Not recorded: no update line holds a clip_frac.");
  }
  lh__sb_printf(b, "</div>\n<h2>Held-out accuracy</h2>\n<div class=\"grid\">\n");
  heldout(&p, &m);
  lh__sb_printf(b, "</div>\n<h2>Staleness</h2>\n<div class=\"grid\">\n");
  {
    int64_t count[LH_REPORT_MAX_STALENESS + 1] = {0};
    const char *what = "updates";
    if (sv.has && sv.stale_total > 0) {
      memcpy(count, sv.stale, sizeof count);
      what = "trained groups (ledger)";
    } else {
      for (int i = 0; i < m.n; i++) {
        double s = m.v[LH_REPORT_STALENESS][i];
        if (!isfinite(s) || s < 0) continue;
        long k = lround(s);
        count[k > LH_REPORT_MAX_STALENESS ? LH_REPORT_MAX_STALENESS : k]++;
      }
    }
    staleness_hist(&p, count, what);
  }
  lh__sb_printf(b, "</div>\n<h2>Networked run</h2>\n<div class=\"grid\">\n");
  bytes_chart(&p, &sv);
  workers_chart(&p, &sv);
  lh__sb_printf(b, "</div>\n<h2>Evaluation</h2>\n<div class=\"grid\">\n");
  eval_section(&p, has_eval ? &ev : NULL, c->eval_json);
  {
    char now[40];
    lh_time_utc(now, sizeof now, 0);
    lh__sb_printf(b,
                  "</div>\n<p class=\"meta\">Written by longhaul %s on %s (UTC).</p>\n"
                  "</body></html>\n",
                  LH_VERSION, now);
  }
  e = lh_file_write_atomic(c->out_path, b->s, b->len);
  p.sum.updates = m.n;
  p.sum.evals = m.n_eval;
  p.sum.bytes = b->len;
  if (summary) *summary = p.sum;
out:
  lh__sb_free(&p.b);
  lh_report_metrics_free(&m);
  lh_report_eval_free(&ev);
  served_free(&sv);
  json_decref(run);
  free(runjson);
  free(metrics);
  free(ledger);
  return e;
}
