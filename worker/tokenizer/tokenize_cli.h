#pragma once
// `worker-orcd tokenize|detokenize ...`: compare our tokenizers with llama.cpp by hand.
namespace worker {

// argv[0] is "tokenize" or "detokenize".
//   tokenize --model FILE [--tokenizer tokenizer.json] [--specials] [--no-bos] TEXT
//     prints the ids as a JSON array.
//   detokenize --model FILE [--tokenizer tokenizer.json] [--specials] ID...
//     prints the text.
// Returns the process exit status (0 ok, 1 runtime error, 2 usage error).
int tokenizer_cli_main(int argc, char** argv);

}  // namespace worker
