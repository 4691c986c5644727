/* Fault injection for tests, compiled in always (docs/testing.md). The
 * environment variable TESSERA_FAULT holds a list of faults separated by
 * ';', each a kind and key=value options separated by ':':
 *   kill:rank=1:step=4        the rank kills itself (SIGKILL) when step 4 begins
 *   kill:rank=1:step=4:at=P   ... at point P of step 4 instead: forward (the
 *                             forward pass begins), backward (it begins),
 *                             reduce (the gradient reduction is waited for),
 *                             update (the optimizer step begins), ckpt (the
 *                             checkpoint written after step 4: rank 0 after
 *                             the first tensor, the others as it begins)
 *   hang:rank=1:op=allreduce:step=3
 *                             the rank stops in operation `op` (its name as the
 *                             watchdog reports it) at step 3, as a lost rank would
 *   nan:rank=0:step=2         the rank's loss and gradients at step 2 are NaN
 *   error:rank=1:step=3       the rank's step 3 fails with an injected error
 *   error:rank=1:at=window    the rank's next window forward (evaluation, tessera
 *                             infer) fails with an injected error instead
 *   overflow:rank=1:step=2    the rank's loss gradient at step 2 is infinite: its
 *                             gradients overflow, its loss stays finite (an fp16
 *                             loss-scale overflow)
 *   mpierr:rank=0:step=5      the rank's step 5 returns an MPI error as it
 *                             begins (as a broken connection does)
 *   nccl:rank=1:step=3        the rank's NCCL collectives of step 3 report
 *                             NCCL's remote error (a peer's process or the
 *                             network gone: collectives/device.c)
 *   hang:rank=1:op=nccl:step=3
 *                             ... never complete instead (as with a peer
 *                             that never arrives): their deadline ends them
 *   enospc:ckpt               checkpoint writes fail with ENOSPC
 *   corrupt:ckpt              the checkpoint file is corrupted after it is written
 * rank is the world rank (any rank when absent), step the 1-based training
 * step (every step when absent; step=N+ for N and every step after). A
 * malformed list is an error at start. */
#ifndef TS_CORE_FAULT_H
#define TS_CORE_FAULT_H

#include <stdint.h>

typedef enum { TS_FAULT_KILL = 0, TS_FAULT_HANG, TS_FAULT_NAN, TS_FAULT_ERROR, TS_FAULT_ENOSPC, TS_FAULT_CORRUPT,
               TS_FAULT_OVERFLOW, TS_FAULT_MPIERR, TS_FAULT_NCCL, TS_FAULT_KINDS } ts_fault_kind;

/* Local. Parses TESSERA_FAULT for this rank (errors name the entry); no
 * variable: no faults. Call once at start. */
int ts_fault_init(int world_rank);
/* Local. 1 if a fault of this kind is set for this rank at step (any step
 * matches a fault without step=) and, for hang, in operation op (NULL: any). */
int ts_fault_at(ts_fault_kind k, int64_t step, const char *op);
/* Local. The step the trainer is in (1-based), for the faults keyed on it. */
void ts_fault_set_step(int64_t step);
int64_t ts_fault_step(void);
/* Local. If a hang is set for op at the current step: never returns (the
 * watchdog or the launcher ends the process). If a kill is set for the
 * current step (and, with at=, op is its point): SIGKILL now. */
void ts_fault_point(const char *op);
/* Local. 1 if any fault is configured (for messages). */
int ts_fault_any(void);

#endif
