/* Shared by the engine commands (`tessera model`, `tessera bench step`):
 * the config schema they accept and its loading with overrides. */
#ifndef TS_CLI_ENGINE_H
#define TS_CLI_ENGINE_H

#include "src/core/config.h"

/* Loads path (NULL: defaults only) and applies each "section.key=value" of
 * over[0..nover); errors name file:line or the argument. */
int ts_cli_engine_config(const char *path, int nover, char **over, ts_config **out);

int ts_cli_model(int argc, char **argv);
int ts_cli_bench_step(int argc, char **argv);

#endif
