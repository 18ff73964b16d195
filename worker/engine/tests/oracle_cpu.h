#pragma once
// The llama.cpp oracle's CPU kernels, for the parity tests (parity_test.cpp,
// cpu_kv16_parity_test.cpp). node-llama-cpp loads the best-scoring libggml-cpu-<variant>.so the
// host supports; the CPU reference mirrors the AVX-512 variants (zen4 / icelake / skylakex ...,
// reports/cpu-parity.md). ci/setup.sh removes sapphirerapids, which an AMX host would load and
// whose AMX int8 and AVX512-FP16 kernels sum F16, Q8_0, Q4_K and Q6_K in other orders.
#include <filesystem>
#include <string>

#include "common/test_helpers.h"

namespace worker::test {

// "" when the oracle holds only the variants ci/setup.sh leaves, else what is wrong and the fix.
inline std::string oracle_cpu_variants_problem() {
  const std::string lib = source_dir() +
                          "/fixtures/oracle/node_modules/@node-llama-cpp/linux-x64/bins/"
                          "linux-x64/libggml-cpu-sapphirerapids.so";
  if (!std::filesystem::exists(lib)) return "";
  return lib +
         " is present: run ci/setup.sh, which removes it (on an AMX host llama.cpp would load it, "
         "and its AMX / AVX512-FP16 kernels sum in orders the CPU reference does not mirror)";
}

}  // namespace worker::test
