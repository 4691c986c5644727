/* Makes bad inputs for tests/io/bad_input.sh.
 *   mkbad nan IMAGE.nii[.gz] OUT.nii.gz     copy of a float image with one NaN voxel
 *   mkbad corrupt-chunk DATA.h5             flips bytes inside the first chunk of /samples/000001/image
 *   mkbad drop-label DATA.h5                deletes /samples/000001/label
 *   mkbad label-dtype DATA.h5               replaces /samples/000001/label by a float32 dataset
 *   mkbad label-shape DATA.h5               replaces /samples/000001/label by one of another shape */
#include "tsbuild.h"
#include "io/nifti.h"
#include "src/core/error.h"

#include <fcntl.h>
#include <hdf5.h>
#include <nifti2_io.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(const char *what)
{
    fprintf(stderr, "mkbad: %s\n", what);
    return 1;
}

static int replace_label(const char *file, int dtype)
{
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) return fail("cannot open the file");
    hid_t d = H5Dopen2(f, "/samples/000001/label", H5P_DEFAULT);
    hid_t sp = H5Dget_space(d);
    hsize_t dims[3];
    H5Sget_simple_extent_dims(sp, dims, NULL);
    H5Sclose(sp);
    H5Dclose(d);
    if (H5Ldelete(f, "/samples/000001/label", H5P_DEFAULT) < 0) return fail("cannot delete the label");
    if (dtype) {
        if (dtype == 2) dims[0] += 1;
        sp = H5Screate_simple(3, dims, NULL);
        hid_t t = dtype == 1 ? H5T_IEEE_F32LE : H5T_STD_U8LE;
        d = H5Dcreate2(f, "/samples/000001/label", t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (d < 0) return fail("cannot create the replacement label");
        H5Dclose(d);
        H5Sclose(sp);
    }
    H5Fclose(f);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) return fail("usage: mkbad MODE ARGS (see the source)");
    const char *mode = argv[1];
    if (!strcmp(mode, "nan")) {
        if (argc < 4) return fail("nan IMAGE OUT");
        ts_nifti *n = NULL;
        if (ts_nifti_read(argv[2], &n)) return fail(ts_err_message());
        float *v = malloc((size_t)n->nvox * sizeof(float));
        if (ts_nifti_to_float(n, v)) return fail(ts_err_message());
        v[n->nvox / 2 + 7] = 0.0f / 0.0f;
        ts_nifti_geom g = {.dim = {n->dim[0], n->dim[1], n->dim[2], n->dim[3]},
                           .pixdim = {n->pixdim[0], n->pixdim[1], n->pixdim[2]},
                           .sform_code = n->sform_code, .qform_code = 0};
        memcpy(g.sform, n->sform, sizeof g.sform);
        memcpy(g.qform, n->sform, sizeof g.qform);
        if (ts_nifti_write(argv[3], &g, NIFTI_TYPE_FLOAT32, 1, v)) return fail(ts_err_message());
        free(v);
        ts_nifti_free(&n);
        return 0;
    }
    if (!strcmp(mode, "corrupt-chunk")) {
        hid_t f = H5Fopen(argv[2], H5F_ACC_RDONLY, H5P_DEFAULT);
        if (f < 0) return fail("cannot open the file");
        hid_t d = H5Dopen2(f, "/samples/000001/image", H5P_DEFAULT);
        hsize_t off[4];
        unsigned mask;
        haddr_t addr;
        hsize_t size;
        if (d < 0 || H5Dget_chunk_info(d, H5Dget_space(d), 0, off, &mask, &addr, &size) < 0)
            return fail("cannot locate the chunk");
        H5Dclose(d);
        H5Fclose(f);
        int fd = open(argv[2], O_RDWR);
        unsigned char b[8];
        off_t at = (off_t)addr + (off_t)(size / 2);
        if (fd < 0 || pread(fd, b, sizeof b, at) != (ssize_t)sizeof b) return fail("cannot read the chunk bytes");
        for (size_t k = 0; k < sizeof b; k++) b[k] ^= 0x55;
        if (pwrite(fd, b, sizeof b, at) != (ssize_t)sizeof b) return fail("cannot write the chunk bytes");
        close(fd);
        printf("flipped 8 bytes at offset %lld (chunk of %llu bytes at %llu)\n", (long long)at,
               (unsigned long long)size, (unsigned long long)addr);
        return 0;
    }
    if (!strcmp(mode, "drop-label")) return replace_label(argv[2], 0);
    if (!strcmp(mode, "label-dtype")) return replace_label(argv[2], 1);
    if (!strcmp(mode, "label-shape")) return replace_label(argv[2], 2);
    return fail("unknown mode");
}
