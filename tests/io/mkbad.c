/* Makes bad inputs for tests/io/bad_input.sh.
 *   mkbad nan IMAGE.nii[.gz] OUT.nii.gz     copy of a float image with one NaN voxel
 *   mkbad corrupt-chunk DATA.h5             flips bytes inside the first chunk of /samples/000001/image
 *   mkbad drop-label DATA.h5                deletes /samples/000001/label
 *   mkbad label-dtype DATA.h5               replaces /samples/000001/label by a float32 dataset
 *   mkbad label-shape DATA.h5               replaces /samples/000001/label by one of another shape
 *   mkbad image OUT.nii N NBAD              float32 image of N^3 voxels (values 0..4), NBAD of them
 *                                           non-finite (NaN, +Inf, -Inf in turn)
 *   mkbad label OUT.nii N                   uint8 label of N^3 voxels (0 and 1)
 *   mkbad vox-offset FILE.nii OFFSET        sets the vox_offset of an uncompressed NIfTI-1 header
 *   mkbad image-nan DATA.h5                 one NaN in the middle of every sample's /image */
#include "tsbuild.h"
#include "io/nifti.h"
#include "src/core/error.h"

#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
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

static int image_nan(const char *file)
{
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) return fail("cannot open the file");
    int n = 0;
    for (int i = 0;; i++) {
        char name[64];
        snprintf(name, sizeof name, "/samples/%06d/image", i);
        if (H5Lexists(f, "/samples", H5P_DEFAULT) <= 0 || H5Lexists(f, name, H5P_DEFAULT) <= 0) break;
        hid_t d = H5Dopen2(f, name, H5P_DEFAULT), sp = H5Dget_space(d);
        hsize_t dims[4], at[4] = {0, 0, 0, 0}, one[4] = {1, 1, 1, 1};
        H5Sget_simple_extent_dims(sp, dims, NULL);
        for (int k = 1; k < 4; k++) at[k] = dims[k] / 2;
        hid_t mem = H5Screate_simple(4, one, NULL);
        const float v = NAN;
        if (H5Sselect_hyperslab(sp, H5S_SELECT_SET, at, NULL, one, NULL) < 0 ||
            H5Dwrite(d, H5T_NATIVE_FLOAT, mem, sp, H5P_DEFAULT, &v) < 0)
            return fail("cannot write the NaN");
        H5Sclose(mem);
        H5Sclose(sp);
        H5Dclose(d);
        n++;
    }
    H5Fclose(f);
    printf("one NaN in each of %d images\n", n);
    return n ? 0 : fail("no /samples/NNNNNN/image");
}

static int write_volume(const char *path, int64_t n, int label, int64_t nbad)
{
    ts_nifti_geom g = {.dim = {n, n, n, 1}, .pixdim = {1, 1, 1},
                       .sform = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}, .sform_code = 1};
    const int64_t nv = n * n * n;
    float *img = malloc((size_t)nv * sizeof *img);
    uint8_t *lab = malloc((size_t)nv);
    if (!img || !lab) return fail("out of memory");
    for (int64_t v = 0; v < nv; v++) {
        img[v] = (float)(v % 5);
        lab[v] = (uint8_t)(v % 3 == 0);
    }
    for (int64_t k = 0; k < nbad && k < nv; k++) img[(k * 7 + nv / 3) % nv] = k % 3 == 0 ? NAN : k % 3 == 1 ? INFINITY : -INFINITY;
    int rc = label ? ts_nifti_write(path, &g, NIFTI_TYPE_UINT8, 1, lab) : ts_nifti_write(path, &g, NIFTI_TYPE_FLOAT32, 1, img);
    free(img);
    free(lab);
    return rc ? fail(ts_err_message()) : 0;
}

/* vox_offset (a float32 at byte 108 of a NIfTI-1 header, in the header's byte order) */
static int set_vox_offset(const char *path, float off)
{
    int fd = open(path, O_RDWR);
    int32_t sz = 0;
    if (fd < 0 || pread(fd, &sz, 4, 0) != 4) return fail("cannot read the header");
    uint32_t u;
    memcpy(&u, &off, 4);
    if (sz != 348) u = __builtin_bswap32(u);
    if (pwrite(fd, &u, 4, 108) != 4) return fail("cannot write vox_offset");
    close(fd);
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
    if (!strcmp(mode, "image") && argc >= 5) return write_volume(argv[2], atoll(argv[3]), 0, atoll(argv[4]));
    if (!strcmp(mode, "label") && argc >= 4) return write_volume(argv[2], atoll(argv[3]), 1, 0);
    if (!strcmp(mode, "vox-offset") && argc >= 4) return set_vox_offset(argv[2], (float)atof(argv[3]));
    if (!strcmp(mode, "image-nan")) return image_nan(argv[2]);
    if (!strcmp(mode, "drop-label")) return replace_label(argv[2], 0);
    if (!strcmp(mode, "label-dtype")) return replace_label(argv[2], 1);
    if (!strcmp(mode, "label-shape")) return replace_label(argv[2], 2);
    return fail("unknown mode");
}
