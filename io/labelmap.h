/* Label maps: a text file that groups source label values into classes, so
 * that an atlas becomes a segmentation task. One line per source value:
 *     source_value target_class [name ...]
 * `#` starts a comment; blank lines are ignored. Targets are 0..255; the
 * number of classes is the largest target + 1; a class takes the first name
 * given for it (class 0 defaults to "background"). A source value absent from
 * the map is an error when it occurs in a volume, never a silent class. */
#ifndef TS_IO_LABELMAP_H
#define TS_IO_LABELMAP_H

#include <stdint.h>

typedef struct ts_labelmap ts_labelmap;

/* Local. Parses a map; errors name the file and line. */
int ts_labelmap_load(const char *path, ts_labelmap **out);
/* Local. Parses map text (name is used in messages). */
int ts_labelmap_parse(const char *text, const char *name, ts_labelmap **out);
void ts_labelmap_destroy(ts_labelmap **m);

/* Local. Number of classes (largest target + 1). */
int ts_labelmap_classes(const ts_labelmap *m);
/* Local. The name of class k ("" if the map names none; class 0: "background"). */
const char *ts_labelmap_class_name(const ts_labelmap *m, int k);
/* Local. The path or name the map was read from. */
const char *ts_labelmap_path(const ts_labelmap *m);
/* Local. Target of a source value: 0 and *target set, or 1 if absent. */
int ts_labelmap_lookup(const ts_labelmap *m, int64_t source, int *target);

#endif
