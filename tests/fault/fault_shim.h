/* Control of the OpenCL fault-injection shim (fault_shim.c). */
#ifndef CLG_FAULT_SHIM_H
#define CLG_FAULT_SHIM_H
/* Stops injecting (counting goes on). */
void clg_fault_disarm(void);
/* 1 once the chosen call has been failed. */
int clg_fault_fired(void);
/* OpenCL objects created and not released so far (all types). */
long clg_fault_live(void);
/* Writes the counts to $CLG_FAULT_REPORT (when set). */
void clg_fault_report(void);
#endif
