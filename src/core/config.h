/* Options database: INI files (inih) plus `section.key=value` overrides,
 * checked against schemas that the modules declare. An unknown key or a bad
 * value is an error naming the file and line (or "command line"). Ranks
 * compare a hash of the resolved config at start. */
#ifndef TS_CORE_CONFIG_H
#define TS_CORE_CONFIG_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    TS_CFG_INT,     /* range "min:max" (either side may be empty) */
    TS_CFG_FLOAT,   /* range "min:max" */
    TS_CFG_BOOL,    /* true/false, yes/no, on/off, 1/0 */
    TS_CFG_STRING,  /* anything */
    TS_CFG_ENUM,    /* choices "a|b|c" */
    TS_CFG_INTLIST, /* comma list of ints, each within range "min:max" */
    TS_CFG_ENUMLIST, /* one of the choices "a|b|c", or a comma list of them (one per channel, say) */
} ts_cfg_type;

/* One key of a schema. def NULL = unset unless given. A table ends with a
 * row whose key is NULL. */
typedef struct ts_cfg_key {
    const char *key;   /* "section.key" */
    ts_cfg_type type;
    const char *def;
    const char *spec;  /* range or choices, or NULL */
    const char *doc;
} ts_cfg_key;

typedef struct ts_config ts_config;

/* Local. A whole decimal integer (trailing spaces allowed); 0, or 1 when s
 * is not one or overflows (*v unchanged). */
int ts_parse_i64(const char *s, int64_t *v);

/* Local. Builds an empty config over the NULL-terminated list of schema
 * tables (borrowed: they must outlive the config). A key may appear in
 * several tables (modules that read the same key) if its type, default and
 * range agree; otherwise that is TS_ERR_INTERNAL. */
int ts_config_create(const ts_cfg_key *const *tables, ts_config **out);
void ts_config_destroy(ts_config **cfg);

/* Local. Reads an INI file; errors name file:line and the key. */
int ts_config_load_file(ts_config *cfg, const char *path);
/* Local. Parses INI text (name is used in messages). */
int ts_config_load_string(ts_config *cfg, const char *text, const char *name);
/* Local. Applies one "section.key=value" override. */
int ts_config_set_arg(ts_config *cfg, const char *arg);
/* Local. Sets one key to a value; where names the source for messages. */
int ts_config_set(ts_config *cfg, const char *key, const char *value, const char *where);

/* Local. Getters; the key must be in a schema (an unknown key is a bug and
 * returns TS_ERR_INTERNAL). Unset keys without default give TS_ERR_CONFIG
 * unless ts_config_isset() was checked. */
int ts_config_isset(const ts_config *cfg, const char *key);
/* Local. 1 when key's value was given (a config file or an override), not
 * its default. */
int ts_config_given(const ts_config *cfg, const char *key);
int ts_config_get_int(const ts_config *cfg, const char *key, int64_t *out);
int ts_config_get_float(const ts_config *cfg, const char *key, double *out);
int ts_config_get_bool(const ts_config *cfg, const char *key, int *out);
int ts_config_get_str(const ts_config *cfg, const char *key, const char **out);
/* Fills up to max values; *n gets the count. */
int ts_config_get_intlist(const ts_config *cfg, const char *key, int64_t *vals, int max, int *n);
/* Where the value came from ("default", "file.ini:12", "command line"). */
const char *ts_config_source(const ts_config *cfg, const char *key);

/* Local. Writes the resolved config as INI (set keys and defaults). */
int ts_config_write(const ts_config *cfg, FILE *f);
/* Local. FNV-1a hash of the resolved config. */
uint64_t ts_config_hash(const ts_config *cfg);
/* Collective on comm. Fails on every rank, naming the ranks that differ
 * from rank 0, if the resolved configs are not identical. */
int ts_config_check_ranks(const ts_config *cfg, MPI_Comm comm);
/* Collective on comm: the environment variables that change collective or
 * topology behaviour (TESSERA_COLL_*, TESSERA_RANKS_PER_NODE) must be alike
 * on every rank; a difference is TS_ERR_MISMATCH naming the variable, the
 * ranks and their values, on every rank. Part of ts_config_check_ranks. */
int ts_env_check_ranks(MPI_Comm comm);

/* Local. Prints every key of the schemas with type, default and doc. */
void ts_config_print_help(const ts_config *cfg, FILE *f);

#endif
