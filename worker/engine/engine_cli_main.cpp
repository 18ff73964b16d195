// Standalone `worker-generate` (same as `worker-orcd generate`), for parity scripts.
#include "engine/engine_cli.h"

int main(int argc, char** argv) {
  return worker::engine_cli_main(argc, argv);
}
