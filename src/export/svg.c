/* longhaul report: the SVG the page draws with (report_impl.h): one line chart and one bar chart,
 * each with axes, ticks, a legend and a tooltip (<title>) on every data point, and the text
 * buffer they write into. Plain SVG 1.1: no script, no fonts, nothing fetched. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/base.h"
#include "report_impl.h"

/* ---------------------------------------------------------------- text */

void lh__sb_printf(lh__sb *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->len;
    int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, ap);
    va_end(ap);
    LH_CHECK(n >= 0, "vsnprintf failed");
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    b->cap = b->cap * 2 > b->len + (size_t)n + 1 ? b->cap * 2 : b->len + (size_t)n + 256;
    b->s = lh_xrealloc(b->s, b->cap);
  }
}

void lh__sb_html(lh__sb *b, const char *s) {
  for (const char *p = s; *p;) {
    size_t plain = strcspn(p, "&<>\"'");
    if (plain) lh__sb_printf(b, "%.*s", (int)plain, p);
    p += plain;
    if (!*p) break;
    switch (*p++) {
    case '&':
      lh__sb_printf(b, "&amp;");
      break;
    case '<':
      lh__sb_printf(b, "&lt;");
      break;
    case '>':
      lh__sb_printf(b, "&gt;");
      break;
    case '"':
      lh__sb_printf(b, "&quot;");
      break;
    default:
      lh__sb_printf(b, "&#39;");
      break;
    }
  }
}

void lh__sb_free(lh__sb *b) {
  free(b->s);
  memset(b, 0, sizeof *b);
}

void lh__smooth(const double *y, int n, double w, double *out) {
  double acc = 0, norm = 0;
  for (int i = 0; i < n; i++) {
    if (!isfinite(y[i])) {
      out[i] = NAN;
      continue;
    }
    acc = w * acc + (1 - w) * y[i];
    norm = w * norm + (1 - w);
    out[i] = acc / norm;
  }
}

/* ---------------------------------------------------------------- geometry */

#define W      640
#define H      300
#define LEFT   64
#define RIGHT  16
#define TOP    44
#define BOTTOM 46
#define PW     (W - LEFT - RIGHT)
#define PH     (H - TOP - BOTTOM)

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                      "#9467bd", "#8c564b", "#17becf", "#7f7f7f"};
#define N_COLORS ((int)(sizeof palette / sizeof palette[0]))

static const char *color(int i) {
  return palette[(i % N_COLORS + N_COLORS) % N_COLORS];
}

typedef struct axis {
  double lo, hi;
  bool log;
} axis;

static double tr(const axis *a, double v) {
  return a->log ? log10(v) : v;
}
static double px(const axis *a, double v) {
  return LEFT + (tr(a, v) - a->lo) / (a->hi - a->lo) * PW;
}
static double py(const axis *a, double v) {
  return TOP + PH - (tr(a, v) - a->lo) / (a->hi - a->lo) * PH;
}

/* 1, 2 or 5 times a power of ten, about span / 5. */
static double nice_step(double span) {
  double raw = span / 5, p = pow(10, floor(log10(raw))), f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

/* The axis over [lo, hi] (in data units), widened to ticks; a single value gets a unit span. */
static axis make_axis(double lo, double hi, bool log, bool exact) {
  axis a = {lo, hi, log};
  if (log) {
    a.lo = floor(log10(lo));
    a.hi = ceil(log10(hi));
    if (a.hi <= a.lo) a.hi = a.lo + 1;
    return a;
  }
  if (lo == 0 && hi == 0) { /* all zero: a unit range above it */
    a.hi = 1;
    return a;
  }
  if (!(hi > lo)) {
    double d = fabs(lo) > 0 ? fabs(lo) * 0.1 : 0.5;
    a.lo = lo - d;
    a.hi = hi + d;
  }
  if (!exact) {
    double st = nice_step(a.hi - a.lo);
    a.lo = floor(a.lo / st) * st;
    a.hi = ceil(a.hi / st) * st;
  }
  if (lo >= 0 && a.lo < 0) a.lo = 0; /* values that cannot be negative keep a zero floor */
  return a;
}

/* Tick labels: compact (%g, and k/M/G for large values). */
static void tick_text(double v, char *buf, size_t cap) {
  double m = fabs(v);
  if (m >= 1e9)
    snprintf(buf, cap, "%gG", v / 1e9);
  else if (m >= 1e6)
    snprintf(buf, cap, "%gM", v / 1e6);
  else if (m >= 1e4)
    snprintf(buf, cap, "%gk", v / 1e3);
  else
    snprintf(buf, cap, "%.4g", fabs(v) < 1e-12 ? 0.0 : v);
}

static void y_ticks(lh__sb *b, const axis *y) {
  if (y->log) {
    for (double e = y->lo; e <= y->hi + 1e-9; e++) {
      double v = pow(10, e), yy = py(y, v);
      char t[32];
      tick_text(v, t, sizeof t);
      lh__sb_printf(b,
                    "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>"
                    "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                    LEFT, yy, LEFT + PW, yy, LEFT - 6, yy + 4, t);
    }
    return;
  }
  double st = nice_step(y->hi - y->lo);
  for (double v = ceil(y->lo / st - 1e-9) * st; v <= y->hi + st * 1e-6; v += st) {
    double yy = py(y, v);
    char t[32];
    tick_text(v, t, sizeof t);
    lh__sb_printf(b,
                  "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>"
                  "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                  LEFT, yy, LEFT + PW, yy, LEFT - 6, yy + 4, t);
  }
}

static void frame(lh__sb *b, const lh__chart *c, int points) {
  lh__sb_printf(b,
                "<svg class=\"chart\" data-plot=\"%s\" data-points=\"%d\" viewBox=\"0 0 %d %d\" "
                "width=\"%d\" height=\"%d\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\">\n"
                "<text class=\"title\" x=\"%d\" y=\"18\">",
                c->id, points, W, H, W, H, LEFT);
  lh__sb_html(b, c->title);
  lh__sb_printf(b, "</text>\n");
}

static void axes_labels(lh__sb *b, const lh__chart *c) {
  lh__sb_printf(b,
                "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>"
                "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n",
                LEFT, TOP, LEFT, TOP + PH, LEFT, TOP + PH, LEFT + PW, TOP + PH);
  lh__sb_printf(b, "<text class=\"label\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">", LEFT + PW / 2,
                H - 6);
  lh__sb_html(b, c->xlabel ? c->xlabel : "");
  lh__sb_printf(b,
                "</text>\n<text class=\"label\" transform=\"translate(14 %d) rotate(-90)\" "
                "text-anchor=\"middle\">",
                TOP + PH / 2);
  lh__sb_html(b, c->ylabel ? c->ylabel : "");
  lh__sb_printf(b, "</text>\n");
}

/* The legend, in a row under the title; the reference line last. */
static void legend(lh__sb *b, const lh__chart *c, const lh__series *s, int n) {
  double x = LEFT;
  for (int i = 0; i <= n; i++) {
    const char *name = i < n ? s[i].name : c->ref_label;
    if (!name || (i == n && !isfinite(c->ref_y))) continue;
    const char *col = i < n ? color(s[i].color) : "#555";
    lh__sb_printf(b,
                  "<g class=\"legend\"><line x1=\"%.0f\" y1=\"31\" x2=\"%.0f\" y2=\"31\" "
                  "stroke=\"%s\" stroke-width=\"%s\"%s/><text x=\"%.0f\" y=\"35\">",
                  x, x + 16, col, i < n && !s[i].smooth ? "1.5" : "2.5",
                  i == n ? " stroke-dasharray=\"4 3\"" : "", x + 20);
    lh__sb_html(b, name);
    lh__sb_printf(b, "</text></g>\n");
    x += 20 + 6.2 * (double)strlen(name) + 14;
  }
}

static void ref_line(lh__sb *b, const lh__chart *c, const axis *y) {
  if (!isfinite(c->ref_y) || (y->log && c->ref_y <= 0)) return;
  double yy = py(y, c->ref_y);
  lh__sb_printf(b,
                "<line class=\"ref\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" "
                "stroke-dasharray=\"4 3\"><title>",
                LEFT, yy, LEFT + PW, yy);
  lh__sb_html(b, c->ref_label ? c->ref_label : "");
  lh__sb_printf(b, ": %g</title></line>\n", c->ref_y);
}

static bool drawable(const lh__chart *c, double v) {
  return isfinite(v) && (!c->log_y || v > 0);
}

/* ---------------------------------------------------------------- line chart */

void lh__svg_lines(lh__sb *b, const lh__chart *c, const lh__series *s, int n_series) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  int points = 0;
  bool any_smooth = false;
  for (int k = 0; k < n_series; k++) {
    any_smooth |= s[k].smooth;
    for (int i = 0; i < s[k].n; i++) {
      if (!drawable(c, s[k].y[i])) continue;
      if (!s[k].smooth) points++;
      x0 = fmin(x0, s[k].x[i]);
      x1 = fmax(x1, s[k].x[i]);
      double lo = s[k].lo && drawable(c, s[k].lo[i]) ? s[k].lo[i] : s[k].y[i];
      double hi = s[k].hi && drawable(c, s[k].hi[i]) ? s[k].hi[i] : s[k].y[i];
      y0 = fmin(y0, fmin(lo, s[k].y[i]));
      y1 = fmax(y1, fmax(hi, s[k].y[i]));
    }
  }
  if (drawable(c, c->ref_y)) {
    y0 = fmin(y0, c->ref_y);
    y1 = fmax(y1, c->ref_y);
  }
  frame(b, c, points);
  if (!isfinite(x0)) { /* the caller draws absent data as text, but be safe */
    lh__sb_printf(b, "<text class=\"label\" x=\"%d\" y=\"%d\">no data</text></svg>\n", LEFT,
                  TOP + PH / 2);
    return;
  }
  axis xa = make_axis(x0, x1, false, false);
  axis ya = c->has_y_range ? make_axis(c->y_min, c->y_max, false, true)
                           : make_axis(y0, y1, c->log_y, false);
  y_ticks(b, &ya);
  double st = nice_step(xa.hi - xa.lo);
  for (double v = xa.lo; v <= xa.hi + st * 1e-6; v += st) {
    char t[32];
    tick_text(v, t, sizeof t);
    lh__sb_printf(b,
                  "<line class=\"axis\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>"
                  "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                  px(&xa, v), TOP + PH, px(&xa, v), TOP + PH + 4, px(&xa, v), TOP + PH + 16, t);
  }
  axes_labels(b, c);
  ref_line(b, c, &ya);
  for (int k = 0; k < n_series; k++) {
    const lh__series *z = &s[k];
    lh__sb_printf(b, "<path class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s d=\"",
                  z->smooth ? "smooth" : "raw", color(z->color), z->smooth ? "2.2" : "1.2",
                  !z->smooth && any_smooth ? " stroke-opacity=\"0.35\"" : "");
    bool pen = false;
    for (int i = 0; i < z->n; i++) {
      if (!drawable(c, z->y[i])) {
        pen = false;
        continue;
      }
      lh__sb_printf(b, "%c%.1f %.1f", pen ? 'L' : 'M', px(&xa, z->x[i]), py(&ya, z->y[i]));
      pen = true;
    }
    lh__sb_printf(b, "\"/>\n");
    if (z->smooth) continue;
    double r = points > 300 ? 1.3 : 2.4;
    for (int i = 0; i < z->n; i++) {
      if (!drawable(c, z->y[i])) continue;
      double cx = px(&xa, z->x[i]), cy = py(&ya, z->y[i]);
      if (z->lo && z->hi && drawable(c, z->lo[i]) && drawable(c, z->hi[i]))
        lh__sb_printf(b,
                      "<line class=\"whisker\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                      "stroke=\"%s\"/>",
                      cx, py(&ya, z->lo[i]), cx, py(&ya, z->hi[i]), color(z->color));
      lh__sb_printf(b,
                    "<circle class=\"pt\" cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\"%s><title>",
                    cx, cy, r, color(z->color), any_smooth ? " fill-opacity=\"0.5\"" : "");
      lh__sb_html(b, z->name);
      lh__sb_printf(b, ", %s %g: %.4g", c->xlabel ? c->xlabel : "x", z->x[i], z->y[i]);
      if (z->lo && z->hi) lh__sb_printf(b, " [%.4g, %.4g]", z->lo[i], z->hi[i]);
      lh__sb_printf(b, "</title></circle>\n");
    }
  }
  legend(b, c, s, n_series);
  lh__sb_printf(b, "</svg>\n");
}

/* ---------------------------------------------------------------- bar chart */

void lh__svg_bars(lh__sb *b, const lh__chart *c, const char *const *labels, int n,
                  const lh__series *s, int n_series) {
  double y0 = 0, y1 = 0;
  for (int k = 0; k < n_series; k++)
    for (int i = 0; i < n && i < s[k].n; i++) {
      double lo = s[k].lo ? s[k].lo[i] : s[k].y[i], hi = s[k].hi ? s[k].hi[i] : s[k].y[i];
      if (isfinite(lo)) y0 = fmin(y0, lo);
      if (isfinite(hi)) y1 = fmax(y1, hi);
    }
  frame(b, c, n * n_series);
  axis ya = c->has_y_range ? make_axis(c->y_min, c->y_max, false, true)
                           : make_axis(y0, y1 > y0 ? y1 : y0 + 1, false, false);
  y_ticks(b, &ya);
  double band = (double)PW / (n > 0 ? n : 1), bw = band * 0.8 / (n_series > 0 ? n_series : 1);
  int every = n > 24 ? (n + 23) / 24 : 1; /* at most 24 category labels */
  /* a label wider than its room is cut (at a character boundary) with an ellipsis; the
   * tooltips hold it whole */
  size_t room = (size_t)(band * every / 6.5) > 4 ? (size_t)(band * every / 6.5) : 4;
  for (int i = 0; i < n; i++) {
    if (i % every) continue;
    lh__sb_printf(b, "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">",
                  LEFT + band * (i + 0.5), TOP + PH + 16);
    size_t len = strlen(labels[i]);
    if (len <= room) {
      lh__sb_html(b, labels[i]);
    } else {
      char cut[256];
      size_t k = room - 1 < sizeof cut - 1 ? room - 1 : sizeof cut - 1;
      while (k > 0 && ((unsigned char)labels[i][k] & 0xC0) == 0x80)
        k--; /* not inside a UTF-8 sequence */
      memcpy(cut, labels[i], k);
      cut[k] = '\0';
      lh__sb_html(b, cut);
      lh__sb_printf(b, "\xe2\x80\xa6"); /* U+2026 */
    }
    lh__sb_printf(b, "</text>\n");
  }
  axes_labels(b, c);
  ref_line(b, c, &ya);
  double base = py(&ya, ya.lo <= 0 && ya.hi >= 0 ? 0 : ya.lo);
  for (int k = 0; k < n_series; k++) {
    const lh__series *z = &s[k];
    for (int i = 0; i < n; i++) {
      double v = i < z->n ? z->y[i] : NAN, x = LEFT + band * i + band * 0.1 + bw * k;
      double yy = isfinite(v) ? py(&ya, v) : base;
      if (z->lo && z->hi) { /* a dot and its interval */
        double cx = x + bw / 2;
        if (isfinite(z->lo[i]) && isfinite(z->hi[i]))
          lh__sb_printf(b,
                        "<line class=\"whisker\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                        "stroke=\"%s\" stroke-width=\"2\"/>",
                        cx, py(&ya, z->lo[i]), cx, py(&ya, z->hi[i]), color(z->color));
        lh__sb_printf(b, "<circle class=\"pt\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"><title>",
                      cx, yy, color(z->color));
      } else {
        lh__sb_printf(b,
                      "<rect class=\"pt\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                      "fill=\"%s\"><title>",
                      x, fmin(yy, base), bw, fabs(base - yy), color(z->color));
      }
      lh__sb_html(b, z->name);
      lh__sb_printf(b, ", ");
      lh__sb_html(b, labels[i]);
      lh__sb_printf(b, ": %.4g", v);
      if (z->lo && z->hi) lh__sb_printf(b, " [%.4g, %.4g]", z->lo[i], z->hi[i]);
      lh__sb_printf(b, "</title></%s>\n", z->lo && z->hi ? "circle" : "rect");
    }
  }
  legend(b, c, s, n_series);
  lh__sb_printf(b, "</svg>\n");
}
