/* examples/allreduce.c: tessera's allreduce inside the user's own MPI
 * program. The program owns MPI (it calls MPI_Init and MPI_Finalize); tessera
 * duplicates the communicator it is given. Each rank fills buffers of
 * several sizes (0, odd, a few MiB) with exact integers; the result of
 * ts_coll_allreduce must equal MPI_Allreduce's bit for bit, on every rank.
 * Build: mpicc allreduce.c $(pkg-config --cflags --libs tessera)
 * Run:   mpiexec -n 4 ./allreduce          (docs/library.md) */
#include <tessera/coll.h>
#include <tessera/error.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    int provided, rank, size, bad = 0;
    /* the collectives' progress thread (nonblocking calls) needs MPI_THREAD_MULTIPLE */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    ts_coll *c = NULL;
    if (ts_coll_create(MPI_COMM_WORLD, NULL, &c)) { /* collective; the error is the same on every rank */
        fprintf(stderr, "rank %d: %s\n", rank, ts_err_message());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const size_t counts[] = {0, 1, 7, 1001, 1 << 20};
    for (size_t t = 0; t < sizeof counts / sizeof counts[0]; t++) {
        size_t n = counts[t];
        float *x = malloc((n + 1) * sizeof *x), *mine = malloc((n + 1) * sizeof *mine),
              *ref = malloc((n + 1) * sizeof *ref);
        if (!x || !mine || !ref) MPI_Abort(MPI_COMM_WORLD, 1);
        for (size_t i = 0; i < n; i++) x[i] = (float)((i * 7 + (size_t)rank * 13) % 101) - 50.0f; /* exact sums */
        memcpy(mine, x, n * sizeof *x);
        /* in place: mine becomes the sum over ranks */
        int err = ts_coll_allreduce(c, TS_IN_PLACE, mine, n, TS_FLOAT32, TS_OP_SUM);
        if (err) {
            fprintf(stderr, "rank %d: ts_coll_allreduce: %s\n", rank, ts_err_message());
            bad = 1;
        }
        MPI_Allreduce(x, ref, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++) wrong += mine[i] != ref[i];
        if (wrong) {
            fprintf(stderr, "rank %d: %zu of %zu floats differ from MPI_Allreduce\n", rank, wrong, n);
            bad = 1;
        }
        /* TS_OP_MAX out of place, against MPI_MAX */
        if (!err && ts_coll_allreduce(c, x, mine, n, TS_FLOAT32, TS_OP_MAX)) bad = 1;
        MPI_Allreduce(x, ref, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
        if (n && memcmp(mine, ref, n * sizeof *ref)) {
            fprintf(stderr, "rank %d: max of %zu floats differs from MPI_Allreduce\n", rank, n);
            bad = 1;
        }
        if (rank == 0) printf("allreduce of %zu floats on %d ranks: %s\n", n, size, bad ? "WRONG" : "equal to MPI_Allreduce");
        free(x);
        free(mine);
        free(ref);
    }
    ts_coll_destroy(&c); /* collective */
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return bad ? 1 : 0;
}
