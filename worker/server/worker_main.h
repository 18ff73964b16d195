#pragma once
// The worker process: CLI -> startup (M0-W-1110, 1111) -> serve -> graceful shutdown
// (D13, M0-W-1340, 1630). Returns the process exit code.
namespace worker::server {
int worker_main(int argc, char** argv);
}
