/* What the export module's files share inside it: a growing text buffer (the report's page and
 * the model card are written into one) and the two SVG charts the report page is made of. */
#ifndef LONGHAUL_REPORT_IMPL_H
#define LONGHAUL_REPORT_IMPL_H

#include <stdbool.h>
#include <stddef.h>

/* Text that grows as it is appended to (malloc'd; lh__sb_free accepts an empty one). */
typedef struct lh__sb {
  char *s;
  size_t len, cap;
} lh__sb;
void lh__sb_printf(lh__sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s with &, <, >, " and ' escaped for HTML text and attributes. */
void lh__sb_html(lh__sb *b, const char *s);
void lh__sb_free(lh__sb *b);

/* One series of a chart. */
typedef struct lh__series {
  const char *name;
  const double *x, *y; /* (n); a NAN y is a gap. Bar charts ignore x */
  int n;
  const double *lo, *hi; /* (n) or NULL: an interval drawn as a whisker at each point */
  bool smooth;           /* a line without points (a smoothed copy of another series) */
  int color;             /* index into the palette */
} lh__series;

typedef struct lh__chart {
  const char *id; /* data-plot="id" on the <svg> */
  const char *title, *xlabel, *ylabel;
  bool log_y;       /* logarithmic y (values <= 0 are not drawn) */
  bool has_y_range; /* fix y to [y_min, y_max] instead of the data's range */
  double y_min, y_max;
  double ref_y;          /* a dashed horizontal line at this y (NAN: none) */
  const char *ref_label; /* its legend text */
} lh__chart;

/* A line chart: every finite point of a series that is not `smooth` is a <circle class="pt">
 * with a <title> tooltip; axes with ticks, a legend. data-points="N" on the <svg> counts them. */
void lh__svg_lines(lh__sb *b, const lh__chart *c, const lh__series *s, int n_series);
/* A bar chart over n categories: each series is one bar per category side by side (its y), or,
 * with lo and hi, a dot with its interval; each is a class="pt" element with a tooltip. */
void lh__svg_bars(lh__sb *b, const lh__chart *c, const char *const *labels, int n,
                  const lh__series *s, int n_series);

/* Debiased exponential moving average of y (weight w on the past; NAN values are skipped and
 * stay NAN) into out, as TensorBoard's smoothing. */
void lh__smooth(const double *y, int n, double w, double *out);

#endif
