/* examples/dataset_nifti.c: reading a tessera dataset from one's own code
 * and writing a sample as NIfTI. It first writes a small dataset of
 * synthetic phantoms (collective, each rank writing its share), opens it on
 * all ranks, then each rank takes its samples (i = rank, rank + size, ...),
 * reads the label volume and writes it as NIfTI, reads that file back and
 * checks it voxel for voxel against the dataset and against the class
 * counts stored in the dataset's index. Argument: a folder for the files
 * (default: the current one).
 * Build: mpicc dataset_nifti.c $(pkg-config --cflags --libs tessera) */
#include <tessera/tessera.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    int provided, rank, size, err = 0, bad = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *dir = argc > 1 ? argv[1] : ".";
    char path[1024], nii[1100];
    snprintf(path, sizeof path, "%s/example-phantoms.h5", dir);

    /* 5 phantoms of 24 x 20 x 16 voxels (D, H, W), 3 classes: collective, errors agreed */
    ts_synth_opts so = {.size = {24, 20, 16}, .channels = 1, .classes = 3, .seed = 11, .noise = 0.05};
    ts_dataset *ds = NULL;
    if (ts_synth_write(MPI_COMM_WORLD, path, &so, 5, 1, 16) || ts_dataset_open(MPI_COMM_WORLD, path, NULL, &ds)) {
        fprintf(stderr, "rank %d: %s\n", rank, ts_err_message());
        MPI_Finalize();
        return 1;
    }
    for (int64_t i = rank; i < ts_dataset_count(ds) && !err; i += size) {
        ts_sample_info in;
        ts_nifti *back = NULL;
        if ((err = ts_dataset_info(ds, i, &in))) break; /* local; in's pointers live until close */
        int64_t nv = in.shape[1] * in.shape[2] * in.shape[3], count[TS_IO_MAX_CLASSES] = {0};
        uint8_t *label = malloc((size_t)nv);
        if (!label) MPI_Abort(MPI_COMM_WORLD, 1);
        err = ts_dataset_read_sample(ds, i, NULL, label); /* local: independent reads; image not wanted */
        /* NIfTI's (i, j, k) is tessera's (W, H, D): the same bytes, no transpose */
        ts_nifti_geom g = {.dim = {in.shape[3], in.shape[2], in.shape[1], 1}, .pixdim = {1, 1, 1}};
        for (int k = 0; k < 4; k++) g.sform[k * 5] = g.qform[k * 5] = 1; /* identity affine */
        g.sform_code = g.qform_code = 1;
        snprintf(nii, sizeof nii, "%s/example-%s.nii.gz", dir, in.name);
        if (!err) err = ts_nifti_write(nii, &g, TS_NIFTI_UINT8, 1, label); /* local; checked after writing */
        if (!err) err = ts_nifti_read(nii, &back);
        for (int64_t v = 0; !err && v < nv; v++) {
            int x = (int)ts_nifti_get(back, v);
            bad |= x != label[v];
            if (x >= 0 && x < ts_dataset_classes(ds)) count[x]++;
        }
        for (int k = 0; !err && k < ts_dataset_classes(ds); k++) bad |= count[k] != in.class_voxels[k];
        if (!err) printf("rank %d: sample %lld (%s) -> %s: %s\n", rank, (long long)i, in.name, nii,
                         bad ? "DIFFERS" : "voxels and class counts match");
        ts_nifti_free(&back);
        free(label);
    }
    if (err) fprintf(stderr, "rank %d: %s\n", rank, ts_err_message());
    err = ts_err_agree(MPI_COMM_WORLD, err); /* collective: a local error reaches every rank */
    ts_dataset_close(&ds);                   /* collective */
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return err || bad ? 1 : 0;
}
