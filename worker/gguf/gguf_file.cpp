#include "gguf/gguf_file.h"
