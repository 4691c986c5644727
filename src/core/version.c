/* The library's version at run time (<tessera/version.h>, written by
 * configure, has the headers' version for compile time). */
#include "tsbuild.h"
#include "include/tessera/version.h"

int ts_version(void)
{
    return TESSERA_API_VERSION;
}

const char *ts_version_string(void)
{
    return TESSERA_VERSION_STRING;
}
