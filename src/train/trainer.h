/* Training runs (clg_train_run in the public header) and their outputs. */
#ifndef CLG_TRAIN_TRAINER_H
#define CLG_TRAIN_TRAINER_H

#include "core/core.h"

/* Writes the SVG plot (loss and accuracy per epoch, train and test) next
 * to a CSV log written by the trainer: "run.csv" -> "run.svg". */
CLG_INTERNAL clg_status clg_train_write_svg(clg_err *err, const char *csv_path, const char *title);

#endif
