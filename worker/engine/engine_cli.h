#pragma once
// `worker-orcd generate ...`: runs the engine directly (no HTTP) for parity work and quick
// checks; prints one JSON object with the ids. main() dispatches argv[1] == "generate" here
// (argv[0] is then "generate").
//
//   generate --model F [--backend cpu|cuda] [--tokens 1,2,3 | --prompt TEXT [--chat]]
//            [--n 64] [--temp 0] [--seed S] [--top-k K] [--top-p P] [--min-p P]
//            [--repeat-penalty R] [--ctx N] [--gpu N] [--ignore-eos]
//            [--log-logits FILE [--log-values N] [--all-logits]] [--job-id ID]
//            [--dump-checkpoints FILE]
//
// --all-logits logs every prompt position (else only the last); --log-values N writes the
// first N logits per record (default: all of them, as tools/compare_logits.py needs).
// --dump-checkpoints (cpu backend) writes every layer checkpoint of every token as JSONL
// records {checkpoint: "blk.<i>.<name>" | "result_norm", token_idx, shape, values}.
namespace worker {
int engine_cli_main(int argc, char** argv);
}
