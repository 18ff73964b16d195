#include "engine/generation.h"
