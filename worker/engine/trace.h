#pragma once
// `worker-orcd trace`: runs one prompt (then a few greedy decode steps) through two engines
// side by side and names the first op whose output differs: the layer, the op, the position,
// the index and both values, and the op's largest |difference|. For people adding kernels.
//
//   trace --model F (--prompt TEXT | --tokens 1,2,3) [--a cpu --b cuda | --a cuda:exact
//         --b cuda:fast] [--kv-cache f16|f32] [--steps N] [--gpu N]
//
// Ops are the CPU reference's checkpoints (engine.h CheckpointSink); an op one side does not
// report is skipped, so fused kernels are compared at their outputs. Values compare bit for
// bit. Exit status: 0 identical, 1 a difference, 2 usage error or failure.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/cpu/cpu_engine.h"
#include "engine/trace_cli.h"

namespace worker {

struct TraceOptions {
  std::string model;
  std::vector<int32_t> tokens;        // the prompt, as ids
  std::string a = "cpu", b = "cuda";  // cpu | cuda | cuda:exact | cuda:fast
  bool kv_f16 = true;                 // the KV cache of both sides: FP16 (the product's) or F32
  int steps = 2;  // greedy decode steps after the prompt (A's choice fed to both)
  int gpu = 0;
  CpuEngineOptions perturb_b;  // test only: the perturb_* fields applied to side B (cpu)
};

struct TraceDiff {
  int step = 0;   // 0 = the prompt, k = decode step k
  int layer = 0;  // -1: after the last layer (result_norm, logits)
  std::string op;
  int32_t pos = 0;
  int64_t index = 0;       // in the row of that position
  int64_t flat_index = 0;  // in the op's output over this step's rows (row-major)
  float a = 0, b = 0;
  double max_abs_diff = 0;  // over every compared value of this op in this step
  int64_t n_diff = 0;       // values of this op that differ
};

struct TraceResult {
  std::optional<TraceDiff> diff;  // the first difference, if any
  int n_layers = 0;
  int steps_run = 0;                 // evals compared (prompt + decode steps)
  int64_t ops_compared = 0;          // (step, layer, op) outputs compared, logits included
  std::vector<std::string> skipped;  // ops one side did not report
};

TraceResult run_trace(const TraceOptions& options);
// One line per finding, as the CLI prints it.
std::string describe(const TraceResult& r, const TraceOptions& options);

}  // namespace worker
