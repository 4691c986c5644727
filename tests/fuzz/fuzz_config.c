/* Fuzz target: the config parser (src/core/config.c) and the label-map
 * parser (io/labelmap.c), the two text formats users hand to tessera.
 * The input is an INI file, optionally followed by a line "#--args" and
 * command-line overrides (section.key=value), one per line. It is loaded
 * with ts_config_load_file and ts_config_set_arg over every schema of
 * `tessera train`, then read by the modules' validators. Properties: no
 * crash; a failed load names the file and leaves the config as it was
 * (same hash); a loaded config written as INI loads again to the same hash
 * (when every value fits one INI line, see docs/testing.md); the same
 * input parsed as a label map either fails with a message or maps every
 * listed value to a class below the class count. */
#include "tsbuild.h"
#include "collectives/coll.h"
#include "io/labelmap.h"
#include "io/loader.h"
#include "src/core/config.h"
#include "src/model/unet.h"
#include "src/optim/optim.h"
#include "src/parallel/layout.h"
#include "src/train/trainer.h"
#include "tests/fuzz/fuzz_common.h"

static const ts_cfg_key *const tables[] = {ts_model_config_keys, ts_optim_config_keys, ts_io_config_keys,
                                           ts_train_config_keys, ts_layout_config_keys, ts_coll_config_keys, NULL};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_mpi_init();
    return 0;
}

/* Values longer than this may not survive a write and a reload: inih reads
 * lines of at most 199 characters (see docs/testing.md). */
static int short_values(const char *ini)
{
    for (const char *p = ini; *p;) {
        const char *e = strchr(p, '\n');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l > 150) return 0;
        p += l + (e != NULL);
    }
    return 1;
}

static char *config_text(const ts_config *c)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    FUZZ_REQUIRE(f, "open_memstream");
    int rc = ts_config_write(c, f);
    fclose(f);
    FUZZ_REQUIRE(rc == 0, "writing a loaded config failed");
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    FUZZ_REQUIRE(text, "malloc");
    memcpy(text, data, size);
    text[size] = '\0';
    /* the file part and the override lines */
    char *args = strstr(text, "#--args\n");
    size_t flen = args ? (size_t)(args - text) : size;
    const char *path = fuzz_write("fuzz.ini", text, flen);
    char file[1024];
    snprintf(file, sizeof file, "%s", path);

    ts_config *c = NULL, *c2 = NULL;
    FUZZ_REQUIRE(ts_config_create(tables, &c) == 0, "config_create: %s", ts_err_message());
    uint64_t h0 = ts_config_hash(c);
    ts_err_clear();
    int rc = ts_config_load_file(c, file);
    FUZZ_ERROR_HAS_MESSAGE(rc);
    if (rc) {
        FUZZ_REQUIRE(strstr(ts_err_message(), file) != NULL, "the error does not name the file: %s", ts_err_message());
        FUZZ_REQUIRE(ts_config_hash(c) == h0, "a failed load changed the config");
    }
    if (args) {
        for (char *save = NULL, *l = strtok_r(args + 8, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
            uint64_t h = ts_config_hash(c);
            ts_err_clear();
            int r = ts_config_set_arg(c, l);
            FUZZ_ERROR_HAS_MESSAGE(r);
            if (r) FUZZ_REQUIRE(ts_config_hash(c) == h, "a refused override changed the config");
        }
    }
    /* the consumers of the keys */
    {
        ts_unet_cfg u;
        ts_optim_cfg o;
        ts_loader_opts lo;
        ts_dataset_opts dso;
        ts_coll_opts co;
        ts_err_clear();
        FUZZ_ERROR_HAS_MESSAGE(ts_unet_cfg_from_config(c, &u));
        ts_err_clear();
        FUZZ_ERROR_HAS_MESSAGE(ts_optim_cfg_from_config(c, &o));
        ts_err_clear();
        FUZZ_ERROR_HAS_MESSAGE(ts_loader_opts_from_config(c, &lo));
        ts_err_clear();
        FUZZ_ERROR_HAS_MESSAGE(ts_dataset_opts_from_config(c, &dso));
        ts_coll_opts_default(&co);
        ts_err_clear();
        FUZZ_ERROR_HAS_MESSAGE(ts_coll_opts_from_config(c, &co));
    }
    /* round trip: the resolved config, written and read again */
    char *w = config_text(c);
    if (short_values(w)) {
        FUZZ_REQUIRE(ts_config_create(tables, &c2) == 0, "config_create");
        ts_err_clear();
        int r2 = ts_config_load_string(c2, w, "resolved");
        FUZZ_REQUIRE(r2 == 0, "the written config does not load again: %s\n--- written:\n%s", ts_err_message(), w);
        char *w2 = config_text(c2);
        FUZZ_REQUIRE(ts_config_hash(c2) == ts_config_hash(c), "the written config loads to another config:\n%s\n--- "
                     "reloaded:\n%s", w, w2);
        free(w2);
    }
    free(w);
    ts_config_destroy(&c);
    ts_config_destroy(&c2);

    /* the same text as a label map */
    {
        ts_labelmap *m = NULL;
        ts_err_clear();
        int r = ts_labelmap_parse(text, "fuzz.txt", &m);
        FUZZ_ERROR_HAS_MESSAGE(r);
        if (!r) {
            int K = ts_labelmap_classes(m);
            FUZZ_REQUIRE(K >= 1 && K <= 256, "label map with %d classes", K);
            for (int64_t s = -2; s < 300; s++) {
                int t = -1;
                if (!ts_labelmap_lookup(m, s, &t)) FUZZ_REQUIRE(t >= 0 && t < K, "value %lld maps to class %d of %d",
                                                               (long long)s, t, K);
            }
        }
        ts_labelmap_destroy(&m);
    }
    ts_err_clear();
    free(text);
    return 0;
}
