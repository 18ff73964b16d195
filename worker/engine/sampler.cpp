#include "engine/sampler.h"
