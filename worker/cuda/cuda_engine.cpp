// CUDA engine (owned by the CUDA backend work)
