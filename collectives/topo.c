/* Topology discovery: which ranks share a node (MPI_Comm_split_type with
 * MPI_COMM_TYPE_SHARED), node indices ordered by lowest rank, and the
 * communicators hierarchical algorithms need (node, peers, leaders).
 * TESSERA_RANKS_PER_NODE=k cuts each real node into fake nodes of k
 * consecutive ranks, so node-aware code is testable on one machine. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#include <stdlib.h>

int ts_topo_create(MPI_Comm comm, ts_topo *t)
{
    int err = 0, *leaders = NULL;
    MPI_Comm real = MPI_COMM_NULL;
    t->node_comm = t->peer_comm = t->leader_comm = MPI_COMM_NULL;
    TS_MPI(MPI_Comm_rank(comm, &t->rank));
    TS_MPI(MPI_Comm_size(comm, &t->size));
    TS_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, t->rank, MPI_INFO_NULL, &real));
    const char *fake = getenv("TESSERA_RANKS_PER_NODE");
    int k = 0;
    if (fake && *fake) {
        char *end;
        long v = strtol(fake, &end, 10);
        if (*end || v < 1)
            TS_FAIL(TS_ERR_ARG, "TESSERA_RANKS_PER_NODE='%s' is not a positive integer", fake);
        k = (int)v;
    }
    TS_MPI(MPI_Comm_size(real, &t->real_local_size));
    TS_MPI(MPI_Comm_rank(real, &t->real_local_rank));
    if (k > 0) {
        int rl = t->real_local_rank;
        TS_MPI(MPI_Comm_split(real, rl / k, rl, &t->node_comm));
        MPI_Comm_free(&real);
    } else {
        t->node_comm = real;
        real = MPI_COMM_NULL;
    }
    TS_MPI(MPI_Comm_rank(t->node_comm, &t->local_rank));
    TS_MPI(MPI_Comm_size(t->node_comm, &t->local_size));

    int leader = t->rank;
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, t->node_comm));
    leaders = malloc(sizeof *leaders * (size_t)t->size);
    if (!leaders) TS_FAIL(TS_ERR_NOMEM, "topology");
    TS_MPI(MPI_Allgather(&leader, 1, MPI_INT, leaders, 1, MPI_INT, comm));
    t->nnodes = 0;
    t->node = -1;
    for (int r = 0; r < t->size; r++)
        if (leaders[r] == r) { /* r leads a node; nodes are numbered by leader rank */
            if (r == leader) t->node = t->nnodes;
            t->nnodes++;
        }
    if (t->node < 0) TS_FAIL(TS_ERR_INTERNAL, "topology: node leader %d not found", leader);
    int mm[2] = {-t->local_size, t->local_size};
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_INT, MPI_MAX, comm));
    t->min_local = -mm[0];
    t->max_local = mm[1];
    t->equal_nodes = t->min_local == t->max_local;
    TS_MPI(MPI_Comm_split(comm, t->local_rank, t->node, &t->peer_comm));
    TS_MPI(MPI_Comm_split(comm, t->local_rank == 0 ? 0 : MPI_UNDEFINED, t->node, &t->leader_comm));
    TS_MPI(MPI_Comm_set_errhandler(t->node_comm, MPI_ERRORS_RETURN));
    TS_MPI(MPI_Comm_set_errhandler(t->peer_comm, MPI_ERRORS_RETURN));
cleanup:
    free(leaders);
    if (real != MPI_COMM_NULL) MPI_Comm_free(&real);
    if (err) ts_topo_free(t);
    return err;
}

void ts_topo_free(ts_topo *t)
{
    if (t->node_comm != MPI_COMM_NULL) MPI_Comm_free(&t->node_comm);
    if (t->peer_comm != MPI_COMM_NULL) MPI_Comm_free(&t->peer_comm);
    if (t->leader_comm != MPI_COMM_NULL) MPI_Comm_free(&t->leader_comm);
}

int ts_coll_node_info(MPI_Comm comm, int *node, int *nnodes, int *local_rank, int *local_size)
{
    ts_topo t;
    TS_TRY(ts_topo_create(comm, &t));
    *node = t.node;
    *nnodes = t.nnodes;
    *local_rank = t.local_rank;
    *local_size = t.local_size;
    ts_topo_free(&t);
    return 0;
}
