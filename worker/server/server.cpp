// HTTP server (owned by the worker-process work)
