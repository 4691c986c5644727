/* <tessera/tessera.h>: the whole public API of libtessera. Include this, or
 * only the headers you use (<tessera/coll.h> for the collectives alone),
 * and build with `pkg-config --cflags --libs tessera` (docs/library.md).
 *
 * Conventions every public function follows unless its comment says
 * otherwise:
 * - Collective or local: each declaration's comment says which. A
 *   collective call must be made by every rank of the communicator (or of
 *   the object's group) in the same order; a local one involves no other
 *   rank. MPI must be initialised first (MPI_THREAD_MULTIPLE when the
 *   collectives' progress thread is used: nonblocking calls, the stepper).
 * - Errors: a function returning int returns 0 on success or a TS_ERR_*
 *   code (<tessera/error.h>); the message, with file, line and rank, is
 *   ts_err_message() of the calling thread. A collective call that fails
 *   fails on every rank when its comment says the error is agreed; else
 *   use ts_err_agree() before the next collective. The library never exits
 *   or aborts the job.
 * - Ownership: ts_x_create(..., &x) allocates, ts_x_destroy(&x) frees, takes
 *   NULL and sets the pointer to NULL. Pointers given to a function are
 *   borrowed for the call only, unless the comment says the object keeps
 *   them (then they must outlive it). Objects that use MPI duplicate the
 *   communicator they are given; the library never uses MPI_COMM_WORLD by
 *   itself. Returned const pointers stay owned by the object.
 * - Threads: OpenMP inside calls; one object is used by one thread at a
 *   time. */
#ifndef TESSERA_TESSERA_H
#define TESSERA_TESSERA_H

#include <tessera/version.h>

/* core: errors, logging, config (options database), dtypes, tensors, RNG streams, per-phase timers */
#include <tessera/error.h>
#include <tessera/log.h>
#include <tessera/config.h>
#include <tessera/dtype.h>
#include <tessera/tensor.h>
#include <tessera/rng.h>
#include <tessera/perf.h>

/* collectives: allreduce, reduce-scatter, allgather, broadcast; usable alone */
#include <tessera/coll.h>

/* io: datasets (read, write, synthetic phantoms), sampler, patches and augmentation, loader, NIfTI, checkpoints */
#include <tessera/dataset.h>
#include <tessera/writer.h>
#include <tessera/synth.h>
#include <tessera/sampler.h>
#include <tessera/patch.h>
#include <tessera/loader.h>
#include <tessera/nifti.h>
#include <tessera/checkpoint.h>

/* engine: layers, the parameter arena, the 3D U-Net, weights files, optimizers */
#include <tessera/layers.h>
#include <tessera/arena.h>
#include <tessera/unet.h>
#include <tessera/weights.h>
#include <tessera/optim.h>

/* parallelism: process grid, data-parallel gradient buckets, spatial split, pipeline schedules, the layout;
 * the model on them: pipeline stages, the spatial split's hooks */
#include <tessera/grid.h>
#include <tessera/buckets.h>
#include <tessera/spatial.h>
#include <tessera/pipe.h>
#include <tessera/layout.h>
#include <tessera/pipeline.h>
#include <tessera/split_model.h>

/* inference: `tessera infer` as a call */
#include <tessera/infer.h>

/* training: the data-parallel stepper, synthetic batches, the trainer (`tessera train`) */
#include <tessera/step.h>
#include <tessera/synthetic.h>
#include <tessera/trainer.h>

#endif
