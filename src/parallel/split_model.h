/* The model's split hooks on a spatial group: ts_spatial_split_model
 * installs src/parallel/spatial.c's halo exchange and group sums as the
 * U-Net's split hooks (src/model/unet.h, ts_unet_split), so that a model
 * built for one rank's box runs as one piece of a split volume. Used by
 * training (the stepper), evaluation and inference alike. */
#ifndef TS_PARALLEL_SPLIT_MODEL_H
#define TS_PARALLEL_SPLIT_MODEL_H

#include "src/model/unet.h"
#include "src/parallel/spatial.h"

/* Local (the hooks it installs are collective on sp when used). Installs
 * sp's halo exchange and sums as m's split hooks (sp NULL or of one rank: no
 * split); m and sp borrowed, sp must outlive the hooks' use. Training gets
 * it through ts_stepper_create; evaluation and inference, which run the
 * model without a stepper, call it themselves. */
void ts_spatial_split_model(ts_unet *m, ts_spatial *sp);

#endif
