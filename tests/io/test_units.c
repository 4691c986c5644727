/* Small units of io/: the Fletcher-32 of io/h5.c against the checksum HDF5's
 * own filter stores (chunks of odd and even sizes, across the 360-word fold),
 * label map parsing and its errors, NIfTI write/read round trips (NIfTI-1
 * and -2, .nii and .nii.gz, uint8/int16/float32, 3-D and 4-D) with geometry.
 * usage: test_units DIR */
#include "tsbuild.h"
#include "io/h5.h"
#include "io/labelmap.h"
#include "io/nifti.h"
#include "src/core/error.h"
#include "tests/tap.h"

#include <math.h>
#include <nifti2_io.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_fletcher(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/fl.h5", dir);
    ts_h5_init();
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const size_t sizes[] = {1, 2, 3, 7, 719, 720, 721, 722, 1439, 1440, 4096, 65537, 1 << 20};
    const int ns = (int)(sizeof sizes / sizeof sizes[0]);
    int ok = f >= 0, bigok = 1;
    unsigned char *buf = malloc((1 << 20) + 8), *raw = malloc((1 << 20) + 8);
    for (int k = 0; k < ns && ok; k++) {
        for (size_t t = 0; t < sizes[k]; t++) buf[t] = (unsigned char)(k % 2 ? (int)(255 - t * 7 % 13) : rand());
        hsize_t n = sizes[k];
        hid_t sp = H5Screate_simple(1, &n, NULL), p = H5Pcreate(H5P_DATASET_CREATE);
        H5Pset_chunk(p, 1, &n);
        H5Pset_fletcher32(p);
        char name[32];
        snprintf(name, sizeof name, "d%d", k);
        hid_t d = H5Dcreate2(f, name, H5T_NATIVE_UINT8, sp, H5P_DEFAULT, p, H5P_DEFAULT);
        ok &= H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0; /* HDF5's filter */
        hsize_t off = 0, st = 0;
        uint32_t mask = 0;
        ok &= H5Dget_chunk_storage_size(d, &off, &st) >= 0 && st == n + 4;
        ok &= H5Dread_chunk(d, H5P_DEFAULT, &off, &mask, raw) >= 0;
        uint32_t stored = raw[n] | (uint32_t)raw[n + 1] << 8 | (uint32_t)raw[n + 2] << 16 | (uint32_t)raw[n + 3] << 24;
        if (stored != ts_h5_fletcher32(buf, n)) {
            ts_diag("size %zu: HDF5 stored %08x, ts_h5_fletcher32 %08x", sizes[k], stored,
                    ts_h5_fletcher32(buf, n));
            bigok = 0;
        }
        H5Dclose(d);
        H5Pclose(p);
        H5Sclose(sp);
    }
    if (f >= 0) H5Fclose(f);
    ts_ok(ok && bigok, "Fletcher-32 equals the checksum HDF5 stores, for %d chunk sizes from 1 byte to 1 MiB", ns);
    free(buf);
    free(raw);
}

static void test_labelmap(void)
{
    ts_labelmap *m = NULL;
    int e = ts_labelmap_parse("# comment\n\n0 0 background\n1 1 left side # tail\n2 2\n300000 1 other\n-5 2 neg\n",
                              "t.txt", &m);
    int t1 = -1, t2 = -1, t3 = -1;
    int ok = !e && ts_labelmap_classes(m) == 3 && !ts_labelmap_lookup(m, 1, &t1) && t1 == 1 &&
             !ts_labelmap_lookup(m, 300000, &t2) && t2 == 1 && !ts_labelmap_lookup(m, -5, &t3) && t3 == 2 &&
             ts_labelmap_lookup(m, 3, &t1) == 1 && !strcmp(ts_labelmap_class_name(m, 1), "left side") &&
             !strcmp(ts_labelmap_class_name(m, 2), "neg") && !strcmp(ts_labelmap_class_name(m, 0), "background");
    ts_ok(ok, "label map: comments, names, large and negative source values, absent values");
    ts_labelmap_destroy(&m);
    e = ts_labelmap_parse("0 0\n1 x\n", "bad.txt", &m);
    ts_ok(e == TS_ERR_CONFIG && strstr(ts_err_message(), "bad.txt:2") && !m, "label map: a bad line names file:line");
    e = ts_labelmap_parse("0 0\n1 1\n1 2\n", "dup.txt", &m);
    ts_ok(e == TS_ERR_CONFIG && strstr(ts_err_message(), "mapped twice"), "label map: a source mapped twice");
    e = ts_labelmap_parse("0 0\n1 256\n", "big.txt", &m);
    ts_ok(e == TS_ERR_CONFIG && strstr(ts_err_message(), "big.txt:2"), "label map: target above 255");
    e = ts_labelmap_parse("0 0\n5 0\n", "one.txt", &m);
    ts_ok(e == TS_ERR_CONFIG, "label map: a map with a single class");
    e = ts_labelmap_load("/nonexistent/map.txt", &m);
    ts_ok(e == TS_ERR_IO && strstr(ts_err_message(), "/nonexistent/map.txt"), "label map: a missing file");
}

static void test_nifti(const char *dir)
{
    const int types[] = {NIFTI_TYPE_UINT8, NIFTI_TYPE_INT16, NIFTI_TYPE_FLOAT32};
    const char *exts[] = {".nii", ".nii.gz"};
    int ok = 1;
    for (int v = 1; v <= 2; v++)
        for (int t = 0; t < 3; t++)
            for (int x = 0; x < 2; x++) {
                int64_t nt = t == 2 ? 3 : 1;
                ts_nifti_geom g = {.dim = {7, 5, 4, nt}, .pixdim = {0.5, 1.5, 2.0}, .sform_code = 2, .qform_code = 1};
                double s[16] = {-0.5, 0, 0, 10, 0, 1.5, 0, -20, 0, 0, 2.0, 30, 0, 0, 0, 1};
                double q[16] = {0.5, 0, 0, 1, 0, 1.5, 0, 2, 0, 0, 2.0, 3, 0, 0, 0, 1};
                memcpy(g.sform, s, sizeof s);
                memcpy(g.qform, q, sizeof q);
                int64_t nv = 7 * 5 * 4 * nt;
                size_t es = types[t] == NIFTI_TYPE_UINT8 ? 1 : types[t] == NIFTI_TYPE_INT16 ? 2 : 4;
                unsigned char *data = malloc((size_t)nv * es);
                for (int64_t i = 0; i < nv; i++) {
                    if (es == 1) data[i] = (unsigned char)(i * 3);
                    else if (es == 2) ((int16_t *)data)[i] = (int16_t)(i * 37 - 500);
                    else ((float *)data)[i] = (float)i * 0.25f - 3.0f;
                }
                char path[600];
                snprintf(path, sizeof path, "%s/rt_v%d_t%d%s", dir, v, types[t], exts[x]);
                ts_nifti *n = NULL;
                int e = ts_nifti_write(path, &g, types[t], v, data);
                if (!e) e = ts_nifti_read(path, &n);
                int good = !e && n->version == v && n->datatype == types[t] && n->dim[0] == 7 && n->dim[1] == 5 &&
                           n->dim[2] == 4 && n->dim[3] == nt && !memcmp(n->data, data, (size_t)nv * es) &&
                           n->sform_code == 2 && n->qform_code == 1 && fabs(n->pixdim[1] - 1.5) < 1e-6;
                for (int k = 0; k < 12 && good; k++)
                    good = fabs(n->sform[k] - s[k]) < 1e-5 && fabs(n->qform[k] - q[k]) < 1e-4;
                if (!good) ts_diag("%s: %s", path, e ? ts_err_message() : "contents differ");
                ok &= good;
                if (good && es == 2) {
                    float *fl = malloc((size_t)nv * sizeof(float));
                    ok &= !ts_nifti_to_float(n, fl) && fl[3] == (float)(3 * 37 - 500);
                    free(fl);
                }
                ts_nifti_free(&n);
                free(data);
            }
    ts_ok(ok, "NIfTI-1 and -2, .nii and .nii.gz, uint8/int16/float32, 3-D and 4-D: written and read back with "
              "sform, qform and pixdim");
    ts_nifti *n = NULL;
    char p[600];
    snprintf(p, sizeof p, "%s/none.nii", dir);
    ts_ok(ts_nifti_read(p, &n) == TS_ERR_IO && !n, "a missing NIfTI file is an I/O error");
    snprintf(p, sizeof p, "%s/x.img", dir);
    ts_nifti_geom g = {.dim = {2, 2, 2, 1}, .pixdim = {1, 1, 1}};
    unsigned char d[8] = {0};
    ts_ok(ts_nifti_write(p, &g, NIFTI_TYPE_UINT8, 1, d) == TS_ERR_ARG, "writing needs a .nii or .nii.gz name");
}

int main(int argc, char **argv)
{
    int prov;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    test_fletcher(argv[1]);
    test_labelmap();
    test_nifti(argv[1]);
    int rc = ts_done();
    MPI_Finalize();
    return rc;
}
