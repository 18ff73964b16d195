#pragma once
// `worker-orcd verify RECEIPT --model M.gguf`: replays a receipt (WRK-D18) on the CPU
// reference and prints "identical" or the first step whose logits hash or token differs,
// with both values. RECEIPT is a JSON file holding a receipt, an `end` event or an OpenAI
// response, or a saved SSE stream (its `end` event is used); "-" reads standard input.
// Exit status: 0 identical, 1 differs, 2 unusable input (bad arguments, unreadable or
// malformed receipt, model that cannot be loaded).
namespace worker {
int verify_cli_main(int argc, char** argv);
}
