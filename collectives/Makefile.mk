# collectives/: topology, algorithms (one file each), registry, tuning, async
libtessera_la_SOURCES += collectives/coll.c collectives/topo.c collectives/shm.c collectives/p2p.c \
	collectives/reduce_kernels.c collectives/registry.c collectives/tuning.c collectives/async.c \
	collectives/device.c collectives/ring.c collectives/cost_model.c collectives/compress.c collectives/bench.c \
	collectives/allreduce_ring.c collectives/allreduce_recursive_doubling.c \
	collectives/allreduce_rabenseifner.c collectives/allreduce_tree.c collectives/allreduce_shm.c \
	collectives/allreduce_hierarchical.c collectives/allreduce_hierarchical_nccl.c collectives/allreduce_mpi.c \
	collectives/reduce_scatter_ring.c collectives/reduce_scatter_shm.c collectives/reduce_scatter_mpi.c \
	collectives/allgather_ring.c collectives/allgather_shm.c collectives/allgather_mpi.c \
	collectives/bcast_binomial.c collectives/bcast_shm.c collectives/bcast_mpi.c
# public headers: installed as <tessera/NAME.h> (include/Makefile.mk, docs/library.md)
TS_PUBLIC_HDRS += collectives/coll.h collectives/compress.h
noinst_HEADERS += collectives/device.h collectives/device_impl.h collectives/check.h collectives/cost_model.h \
	collectives/coll_impl.h collectives/bench.h
EXTRA_DIST += collectives/cuda/kernels.cu
if HAVE_CUDA
libtessera_la_SOURCES += collectives/cuda/kernels.cu
endif
