#include "gguf/ggml_types.h"
