#pragma once
// `worker-orcd trace ...` (engine/trace.h): main() dispatches argv[1] == "trace" here (argv[0]
// is then "trace"). Exit status 0 identical, 1 a difference, 2 usage error or failure.
namespace worker {
int trace_cli_main(int argc, char** argv);
}
