/* longhaul patch: making and applying lossless bf16 policy patches (patch.h). */
#include "longhaul/patch.h"
