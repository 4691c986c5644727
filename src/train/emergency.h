/* Emergency state on a lost peer (docs/training.md, "Losing a node"):
 * when the watchdog finds that a peer is gone (a node that does not
 * answer, a rank of this node that died, a wait past fault.timeout), every
 * surviving rank writes what it holds at the last finished step (its
 * stage's parameters and buffers, their optimizer state, the loss scale,
 * the sampler position, the step) to one file of its own, without MPI,
 * and the process exits with TS_EXIT_PEER_LOST. A relaunched job assembles
 * the survivors' files into a regular checkpoint (ts_emergency_assemble)
 * and resumes from it on whatever grid it has.
 *
 * File: <ckpt.emergency_dir>/step-<S>/rank-<R>.bin, written as .tmp,
 * fsynced and renamed (one rank's file is whole or absent): the magic
 * "TSEMRG01", a uint32 length, a JSON header (step, partial, world rank
 * and size, grid, sampler position, loss scale, optimizer step, seed,
 * config hash, global batch, the time of the loss, why, the lost nodes,
 * entries [{name, offset, bytes}]), the entries' bytes, and the CRC-32 of
 * everything before it. A rank that was changing its parameters (the
 * optimizer update, an averaging of local SGD, ZeRO's all-gather) writes
 * a partial file: a header without entries.
 *
 * The state is the one after step S: ts_emergency_commit records it after
 * every update (a copy of the buffers, which the next forward changes).
 * This module does not use MPI. */
#ifndef TS_TRAIN_EMERGENCY_H
#define TS_TRAIN_EMERGENCY_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/config.h"
#include "src/model/arena.h"

/* the exit status of a rank that wrote its emergency state after a peer was lost */
#define TS_EXIT_PEER_LOST 76

typedef struct ts_emergency_cfg {
    const char *dir;            /* ckpt.emergency_dir, resolved */
    const ts_arena *arena;
    int e0, e1;                 /* the arena entries this rank holds (its pipeline stage) */
    int state_sharded;          /* parallel.zero = 1: the optimizer state is not kept (a shard exists once) */
    const char *const *state_names; /* nstate names: "momentum_buffer", "exp_avg", ... */
    int world_rank, world_size;
    int grid[6];                /* dp index, dp, pp index, pp, sp index, sp */
    uint64_t config_hash, seed;
    int64_t global_batch;       /* samples per optimizer step over all replicas */
} ts_emergency_cfg;

/* Local. Arms the emergency state for this process (copies cfg; the arena
 * must outlive it); the watchdog calls ts_emergency_write when it ends the
 * job. Errors: no memory. */
int ts_emergency_setup(const ts_emergency_cfg *cfg);
/* Local. The optimizer starts changing the parameters (until the commit;
 * a second call before it changes nothing). */
void ts_emergency_begin_update(void);
/* Local. The arena now holds the state after `step`: records it (copies the
 * buffers) with the sampler position, the optimizer's step and the loss
 * scale (0: none). */
void ts_emergency_commit(int64_t step, int64_t opt_step, int64_t sampler_position, double loss_scale,
                         int64_t loss_scale_good);
/* Local, from any thread, no MPI. Writes this rank's file; why and lost
 * (may be NULL) go into its header, and the time of the loss: now less
 * waited_s (how long the rank had waited for the lost peer). Returns 0 when written (or nothing was
 * armed: 1), else an error code (the message on stderr). */
int ts_emergency_write(const char *why, const char *lost, double waited_s);
/* Local. Disarms (the end of training). */
void ts_emergency_teardown(void);

/* What ts_emergency_assemble found. */
typedef struct ts_emergency_found {
    int64_t step;                  /* the step assembled, or -1 */
    int files, partial, world_size; /* rank files read, of them partial, ranks of the job that wrote them */
    double lost_at;                /* when the peer was lost (seconds since the epoch) */
    char lost[256];                /* the lost nodes, as the survivors named them */
    char why[512];                 /* why nothing was assembled (when step < 0 and there were files) */
    int64_t global_batch;
    int64_t stale;                 /* when step < 0: the newest state not newer than `after` (the
                                      checkpoint covers it; lost and lost_at are its), else -1 */
} ts_emergency_found;

/* Local. Scans `dir` for emergency states newer than `after` (the last
 * regular checkpoint's step; -1: none), newest first, and for the first
 * whose files together hold every name of items[0..n) with its size,
 * copies them into the items' views and fills the meta fields below;
 * f->step = -1 when none is complete (f->why says what was missing).
 * Returns an error code only for an unreadable directory. */
typedef struct ts_emergency_meta {
    int64_t step, opt_step, sampler_position, loss_scale_good;
    double loss_scale;
    uint64_t config_hash, seed;
} ts_emergency_meta;
struct ts_ckpt_item;
int ts_emergency_assemble(const char *dir, int64_t after, struct ts_ckpt_item *items, int n, ts_emergency_meta *meta,
                          ts_emergency_found *f);
/* Local. Removes dir/step-<step> (after it became a checkpoint). */
int ts_emergency_remove(const char *dir, int64_t step);
/* Local. Removes every dir/step-<S> with S <= upto (states a checkpoint covers). */
int ts_emergency_remove_upto(const char *dir, int64_t upto);

#endif
