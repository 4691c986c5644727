/* The `tessera` command: sub-commands and the helpers they share. Only this
 * layer turns errors into exit codes. */
#ifndef TS_CLI_CLI_H
#define TS_CLI_CLI_H

#include <mpi.h>
#include <stdio.h>

typedef struct ts_cli_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the sub-command name */
} ts_cli_cmd;

int ts_cli_info(int argc, char **argv);
int ts_cli_train(int argc, char **argv);
int ts_cli_infer(int argc, char **argv);
/* Local. One key=value argument of infer's own (checkpoint=, input=, ...,
 * precision=, batch=) into o; 1 when a is not one of them; a bad value sets
 * *lerr (naming the option). `bench infer` takes the same. */
struct ts_infer_opts;
int ts_cli_infer_opt(const char *a, struct ts_infer_opts *o, int *lerr);

/* Every config key table of tessera (NULL-terminated). */
#include "src/core/config.h"
extern const ts_cfg_key *const ts_cli_all_keys[];
/* Collective on comm: config from path (may be NULL) and overrides, with
 * errors agreed and the ranks' resolved configs compared. */
int ts_cli_load_config(const char *path, int nover, char **over, MPI_Comm comm, ts_config **out);
int ts_cli_bench(int argc, char **argv);

/* 1 if argv has -h or --help (before a "--") */
int ts_cli_wants_help(int argc, char **argv);
/* World rank and size (MPI is initialised by main). */
int ts_cli_rank(void);
int ts_cli_size(void);

/* Parses a byte count with optional K/M/G suffix (powers of 1024) and an
 * optional B or iB: finite, >= 0 and at most 2^63 (8 EiB). 0 = ok. */
int ts_cli_parse_bytes(const char *s, size_t *out);

#endif
