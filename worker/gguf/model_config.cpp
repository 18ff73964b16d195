#include "gguf/model_config.h"
