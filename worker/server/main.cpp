// worker-orcd: the worker process, plus the tokenizer and generation tools as subcommands.
#include <cstring>

#include <cstdio>

#include "engine/engine_cli.h"
#include "engine/trace_cli.h"
#include "engine/verify_cli.h"
#include "server/cli.h"
#include "server/worker_main.h"
#include "tokenizer/tokenize_cli.h"

int main(int argc, char** argv) {
  if (argc > 1 && (!std::strcmp(argv[1], "tokenize") || !std::strcmp(argv[1], "detokenize")))
    return worker::tokenizer_cli_main(argc - 1, argv + 1);
  if (argc > 1 && !std::strcmp(argv[1], "generate"))
    return worker::engine_cli_main(argc - 1, argv + 1);
  if (argc > 1 && !std::strcmp(argv[1], "verify"))
    return worker::verify_cli_main(argc - 1, argv + 1);
  if (argc > 1 && !std::strcmp(argv[1], "trace")) return worker::trace_cli_main(argc - 1, argv + 1);
  if (argc == 2 && !std::strcmp(argv[1], "--version"))
    return std::fputs(worker::server::version_text().c_str(), stdout) < 0;
  return worker::server::worker_main(argc, argv);
}
