// The fixture generator against outside references (slower: runs python and llama.cpp):
//  - every generated file loads in llama.cpp (node-llama-cpp) and evaluates 4 tokens;
//  - the generator is byte-identical across runs;
//  - the C++ dequantization equals llama.cpp's own Python reference (gguf-py) bit for bit.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "gguf/gguf_file.h"
#include "gguf/model_config.h"
#include "test_util.h"

namespace worker {
namespace {

namespace fs = std::filesystem;

struct CmdResult {
  int status;
  std::string output;
};

CmdResult run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string src() {
  return WORKER_SOURCE_DIR;
}

std::vector<std::string> generated_files() {
  std::vector<std::string> files;
  const fs::path dir = test::generated_fixtures();
  if (fs::exists(dir)) {
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      // the standard set only (not the on-demand 0.5B models)
      if (std::regex_match(name, std::regex("(qwen2|llama)-g[127]-[a-z0-9_]+\\.gguf"))) {
        files.push_back(e.path().string());
      }
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) ADD_FAILURE() << "missing " << path << " (run ci/setup.sh)";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// llama_file_type_name's table against llama.cpp's own source: every llama_ftype value
// in llama.h and the name llama-quantize (tools/quantize) gives it.
// REQ: M0-W-1320 WRK-D12
TEST(GgufFixtureOracle, FileTypeNamesMatchLlamaQuantize) {
  const std::string root = src() + "/.deps/llama.cpp";
  std::map<std::string, uint64_t> value_of;  // "MOSTLY_Q4_K_M" -> 15
  const std::string header = read_text(root + "/include/llama.h");
  // One enum value a line; commented-out (removed) values do not match.
  const std::regex enum_line(R"(^\s*LLAMA_FTYPE_(\w+)\s*=\s*(\d+),)");
  std::istringstream lines(header);
  std::smatch m;
  for (std::string line; std::getline(lines, line);) {
    if (std::regex_search(line, m, enum_line)) value_of[m[1]] = std::stoull(m[2]);
  }
  ASSERT_GE(value_of.size(), 30u);
  EXPECT_EQ(value_of.count("MOSTLY_Q4_1_SOME_F16"), 0u);  // commented-out values are removed

  const std::string quantize = read_text(root + "/tools/quantize/quantize.cpp");
  const std::regex option(R"re(\{\s*"(\w+)",\s*LLAMA_FTYPE_(\w+),\s*"([^"]*)")re");
  std::set<uint64_t> named;
  for (std::sregex_iterator it(quantize.begin(), quantize.end(), option);
       it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1], ftype = (*it)[2], what = (*it)[3];
    if (what.starts_with("alias") || name == "COPY") continue;  // Q4_K -> Q4_K_M, ...
    ASSERT_TRUE(value_of.count(ftype)) << ftype;
    const uint64_t v = value_of[ftype];
    named.insert(v);
    // M0-W-1823 asks /health for "MXFP4" where llama-quantize says MXFP4_MOE.
    const std::string want = name == "MXFP4_MOE" ? "MXFP4" : name;
    EXPECT_EQ(llama_file_type_name(v).value_or("(none)"), want) << "llama_ftype " << v;
  }
  EXPECT_GE(named.size(), 30u);
  // Values llama.h defines without a quantize option still get a name; the rest none.
  for (const auto& [ftype, v] : value_of) {
    if (ftype == "GUESSED") continue;
    EXPECT_TRUE(llama_file_type_name(v).has_value()) << ftype;
  }
  std::set<uint64_t> defined;
  for (const auto& [ftype, v] : value_of) defined.insert(v);
  for (uint64_t v = 0; v < 2048; ++v) {
    if (!defined.count(v)) {
      EXPECT_FALSE(llama_file_type_name(v).has_value()) << v;
    }
  }
  EXPECT_FALSE(llama_file_type_name(1024).has_value());  // GUESSED alone is no type
}

TEST(GgufFixtureOracle, EveryGeneratedFileLoadsInLlamaCpp) {
  const auto files = generated_files();
  ASSERT_EQ(files.size(), 48u) << "run fixtures/generate_all.sh";
  std::string cmd = "cd '" + src() + "/fixtures/oracle' && node load_check.mjs";
  for (const auto& f : files) cmd += " '" + f + "'";
  const CmdResult r = run(cmd);
  EXPECT_EQ(r.status, 0) << r.output;
  size_t ok = 0;
  for (size_t pos = 0; (pos = r.output.find("\"ok\":true", pos)) != std::string::npos; ++pos) ++ok;
  EXPECT_EQ(ok, files.size()) << r.output;
}

TEST(GgufFixtureOracle, GeneratorIsByteIdenticalAcrossRuns) {
  const fs::path tmp = fs::path(::testing::TempDir()) / "gguf_gen_determinism";
  fs::remove_all(tmp);
  fs::create_directories(tmp / "a");
  fs::create_directories(tmp / "b");
  // One shape of each arch in every type, plus the K-quant fallback shape (g7).
  const std::string qv = src() + "/.deps/llama.cpp/models/ggml-vocab-qwen2.gguf";
  const std::string lv = test::shared_fixtures() + "/stories260K.gguf";
  std::vector<std::pair<std::string, std::string>> models;
  for (const char* t : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_0", "q6_k"}) {
    models.push_back({std::string("qwen2-g1-") + t + ".gguf",
                      "--arch qwen2 --n-embd 256 --n-head 4 --n-head-kv 4 --n-ff 512 --n-layer 2 "
                      "--type " +
                          std::string(t) + " --seed 1 --vocab " + qv + " --vocab-limit 2048"});
    models.push_back({std::string("llama-g1-") + t + ".gguf",
                      "--arch llama --n-embd 256 --n-head 4 --n-head-kv 4 --n-ff 512 --n-layer 2 "
                      "--type " +
                          std::string(t) + " --seed 1 --vocab " + lv});
  }
  models.push_back({"qwen2-g7-q4_k.gguf",
                    "--arch qwen2 --n-embd 896 --n-head 14 --n-head-kv 2 --n-ff 1024 --n-layer 2 "
                    "--type q4_k --seed 1 --vocab " +
                        qv + " --vocab-limit 2048"});
  for (const char* sub : {"a", "b"}) {
    std::ofstream list(tmp / (std::string(sub) + ".txt"));
    for (const auto& [name, args] : models)
      list << args << " --out " << (tmp / sub / name).string() << "\n";
  }
  for (const char* sub : {"a", "b"}) {
    const CmdResult r = run("/usr/bin/python3 '" + src() + "/fixtures/gen_model.py' --many '" +
                            (tmp / (std::string(sub) + ".txt")).string() + "'");
    ASSERT_EQ(r.status, 0) << r.output;
  }
  auto slurp = [](const fs::path& p) {
    std::string data(static_cast<size_t>(fs::file_size(p)), '\0');
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(p.c_str(), "rb"), &std::fclose);
    if (!f || std::fread(data.data(), 1, data.size(), f.get()) != data.size()) data.clear();
    return data;
  };
  for (const auto& [name, args] : models) {
    const std::string a = slurp(tmp / "a" / name), b = slurp(tmp / "b" / name);
    ASSERT_GT(a.size(), 100000u) << name;
    EXPECT_TRUE(a == b) << name << " differs between two runs";
    // ... and equals the copy generate_all.sh made (another process, maybe another day).
    const fs::path g = fs::path(test::generated_fixtures()) / name;
    if (fs::exists(g)) {
      EXPECT_TRUE(slurp(g) == a) << name << " differs from " << g;
    }
  }
  // A different seed gives different weights (the seed is really used).
  const CmdResult r =
      run("/usr/bin/python3 '" + src() + "/fixtures/gen_model.py' " + models[0].second +
          " --seed 2 --out '" + (tmp / "seed2.gguf").string() + "'");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(slurp(tmp / "seed2.gguf") == slurp(tmp / "a" / models[0].first));
  fs::remove_all(tmp);
}

// REQ: WRK-D2 M0-W-1201
TEST(GgufFixtureOracle, DequantizationEqualsLlamaCppReferenceBitForBit) {
  const fs::path dir = fs::path(::testing::TempDir()) / "gguf_dequant_dumps";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream manifest(dir / "MANIFEST");
  int n = 0;
  for (const char* arch : {"qwen2", "llama"}) {
    for (const char* shape : {"g1", "g7"}) {
      for (const char* type : {"f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_0", "q6_k"}) {
        const std::string path =
            test::generated_fixtures() + "/" + arch + "-" + shape + "-" + type + ".gguf";
        ASSERT_TRUE(fs::exists(path)) << path << " (run fixtures/generate_all.sh)";
        auto f = GgufFile::open(path);
        for (const char* name :
             {"token_embd.weight", "blk.1.ffn_down.weight", "blk.0.attn_k.weight"}) {
          const TensorInfo& t = f->tensor(name);
          std::vector<float> out(static_cast<size_t>(t.n_elements()));
          for (int64_t r = 0; r < t.rows(); ++r) {
            dequantize_row(t.type, t.row(r), out.data() + r * t.row_len(), t.row_len());
          }
          const std::string dump = "d" + std::to_string(n++) + ".f32";
          std::ofstream(dir / dump, std::ios::binary)
              .write(reinterpret_cast<const char*>(out.data()),
                     static_cast<std::streamsize>(out.size() * sizeof(float)));
          manifest << path << "\t" << name << "\t" << dump << "\n";
        }
      }
    }
  }
  manifest.close();
  const CmdResult r =
      run("/usr/bin/python3 '" + src() + "/fixtures/check_dequant.py' '" + dir.string() + "'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(std::to_string(n) + " tensors compared, 0 mismatches"), std::string::npos)
      << r.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace worker
