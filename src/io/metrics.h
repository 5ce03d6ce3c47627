/* The training log: one CSV row per epoch (written while training, read
 * back to plot) and the SVG plot beside it (loss and accuracy per epoch,
 * train and test). Plain data only: no OpenCL, no training types. */
#ifndef CLG_IO_METRICS_H
#define CLG_IO_METRICS_H

#include "core/core.h"

/* One epoch of the log. A test figure of -1 means "not evaluated". */
typedef struct clg_metrics_row {
    int epoch; /* 1-based */
    int64_t step;
    double train_loss, train_acc, test_loss, test_acc, lr, seconds, ips;
} clg_metrics_row;

/* The CSV's first line (with its newline). */
extern CLG_INTERNAL const char clg_metrics_csv_header[];

/* Opens the log for writing: appends to an existing file when `append`
 * (a resumed run), else truncates it and writes the header. */
CLG_INTERNAL clg_status clg_metrics_csv_open(clg_err *err, const char *path, int append, FILE **out);

/* Writes one row and flushes it. */
CLG_INTERNAL void clg_metrics_csv_write(FILE *f, const clg_metrics_row *r);

/* Reads every well-formed row of a log (the header and other lines are
 * skipped). *rows is malloc'd (NULL when there are none); free it. */
CLG_INTERNAL clg_status clg_metrics_csv_read(clg_err *err, const char *path, clg_metrics_row **rows, int *n);

/* The plot as SVG text (two panels: loss, accuracy %), title in both
 * panel headings. *out is malloc'd and NUL-terminated; free it. */
CLG_INTERNAL clg_status clg_metrics_svg(clg_err *err, const clg_metrics_row *rows, int n, const char *title,
                                        char **out, size_t *len);

/* Reads the CSV log at csv_path and writes its plot beside it, atomically:
 * "run.csv" -> "run.svg", any other name -> name + ".svg". */
CLG_INTERNAL clg_status clg_metrics_plot(clg_err *err, const char *csv_path, const char *title);

#endif
