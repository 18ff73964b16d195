// Receipts (WRK-D18) through HTTP: every `end` event (and the OpenAI routes' final chunk or
// response) carries a receipt that `worker-orcd verify` replays on the CPU reference as
// identical; a receipt with one token altered, and one replayed against a model with one
// weight changed, are rejected at the step where the difference first shows. With
// WORKER_BACKEND=cuda (the GPU run) the receipts come from the CUDA backend: 50 seeded
// requests per fixture type; on the CPU (CI) fewer.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "gguf/gguf_file.h"
#include "harness/suite.h"

namespace conformance {
namespace {
using nlohmann::json;

bool on_gpu() {
  return test_backend() == "cuda";
}

struct Verified {
  int exit_code = -1;
  std::string out;
};

Verified run_verify(const std::string& receipt_file, const std::string& model) {
  const std::string cmd =
      "'" + worker_bin() + "' verify '" + receipt_file + "' --model '" + model + "' 2>&1";
  Verified v;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return v;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, p)) v.out.append(buf, n);
  const int st = pclose(p);
  v.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return v;
}

std::string save(const std::string& name, const json& j) {
  write_result("receipts/" + name, j.dump());
  return results_dir() + "/receipts/" + name;
}

// Random sampling parameters at temperature 0.7 (the acceptance's mix).
json random_sampling(std::mt19937_64& g) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  json j = {{"temperature", 0.7}, {"seed", g()}};
  if (u(g) < 0.7) j["top_k"] = 1 + static_cast<int>(u(g) * 100);
  if (u(g) < 0.7) j["top_p"] = 0.5 + 0.5 * u(g);
  if (u(g) < 0.5) j["min_p"] = 0.2 * u(g);
  if (u(g) < 0.6) j["repetition_penalty"] = 1.0 + 0.5 * u(g);
  return j;
}

// The models whose receipts are checked: three weight types, as the GPU run requires; CI
// (CPU) takes the real stories260K model and two quantized fixtures.
std::vector<std::string> receipt_models() {
  if (on_gpu())
    return {generated_fixture("qwen2-g2-f16.gguf"), generated_fixture("qwen2-g2-q8_0.gguf"),
            generated_fixture("qwen2-g2-q4_k.gguf")};
  return {stories_model(), generated_fixture("qwen2-g1-q8_0.gguf"),
          generated_fixture("llama-g1-q4_k.gguf")};
}

std::string stem(const std::string& path) {
  return std::filesystem::path(path).stem().string();
}

class ReceiptTest : public ::testing::TestWithParam<std::string> {};

// Seeded /execute requests and OpenAI chat requests (streamed and not): every receipt
// verifies on the CPU reference.
// REQ: WRK-D18 M0-W-1030 M0-W-1310
TEST_P(ReceiptTest, EveryReceiptVerifiesOnTheCpuReference) {
  const std::string model = GetParam();
  // Chat needs ChatML tokens: the qwen2 models (the llama ones have no chat template).
  const bool chatml = stem(model).rfind("qwen2", 0) == 0;
  const int n_execute = on_gpu() ? 50 : 8, n_chat = !chatml ? 0 : on_gpu() ? 50 : 4;
  const int max_tokens = on_gpu() ? 32 : 24;
  WorkerOptions o;
  o.model = model;
  WorkerProcess w(o);
  std::mt19937_64 g(std::hash<std::string>{}(stem(model)));
  std::vector<std::string> files;
  int tokens = 0;
  for (int i = 0; i < n_execute; ++i) {
    json req = random_sampling(g);
    req["job_id"] = unique_job_id("receipt");
    req["prompt"] = "Once upon a time";
    req["max_tokens"] = max_tokens;
    const JobStream s = run_job(w.port(), req);
    ASSERT_EQ(s.status, 200);
    ASSERT_TRUE(s.violations.empty()) << s.describe();
    const json* end = s.terminal();
    ASSERT_TRUE(end && (*end)["type"] == "end") << s.describe();
    ASSERT_TRUE(end->contains("receipt")) << end->dump();
    const json& r = (*end)["receipt"];
    EXPECT_EQ(r["engine"]["backend"], test_backend());
    EXPECT_EQ(r["engine"]["numerics"], "exact");
    EXPECT_EQ(r["request"]["seed"], req["seed"]);
    EXPECT_EQ(r["tokens"].size(), (*end)["tokens_out"].get<size_t>());
    tokens += static_cast<int>(r["tokens"].size());
    files.push_back(save(stem(model) + "-execute-" + std::to_string(i) + ".json", *end));
  }
  for (int i = 0; i < n_chat; ++i) {
    json req = random_sampling(g);
    req["model"] = "worker-orcd";
    req["messages"] = {{{"role", "system"}, {"content", "You write short stories."}},
                       {{"role", "user"}, {"content", "Tell me about a cat."}}};
    req["max_tokens"] = max_tokens;
    const bool stream = i % 2 == 0;
    req["stream"] = stream;
    json receipt;
    if (stream) {
      SseStream s(w.port(), "/v1/chat/completions", req);
      ASSERT_EQ(s.status(), 200);
      for (const auto& e : s.read_all()) {
        if (e.data == "[DONE]") continue;
        const json c = json::parse(e.data);
        if (c.contains("receipt")) receipt = c["receipt"];
      }
    } else {
      const HttpResponse r = http_post_json(w.port(), "/v1/chat/completions", req);
      ASSERT_EQ(r.status, 200) << r.body;
      receipt = r.json().value("receipt", json());
    }
    ASSERT_TRUE(receipt.is_object()) << "no receipt in the chat response (stream " << stream << ")";
    EXPECT_TRUE(receipt["request"]["prompt_is_template"].get<bool>());
    tokens += static_cast<int>(receipt["tokens"].size());
    files.push_back(save(stem(model) + "-chat-" + std::to_string(i) + ".json", receipt));
  }
  EXPECT_EQ(w.stop(), 0);

  int identical = 0;
  for (const auto& f : files) {
    const Verified v = run_verify(f, model);
    EXPECT_EQ(v.exit_code, 0) << f << ": " << v.out;
    EXPECT_NE(v.out.find("identical"), std::string::npos) << f << ": " << v.out;
    identical += v.exit_code == 0;
  }
  std::printf("receipts %s (%s): %d of %zu verified identical on the CPU reference, %d tokens\n",
              stem(model).c_str(), test_backend().c_str(), identical, files.size(), tokens);
  write_result("receipts/" + stem(model) + "-summary.json", json{{"model", stem(model)},
                                                                 {"backend", test_backend()},
                                                                 {"receipts", files.size()},
                                                                 {"identical", identical},
                                                                 {"tokens", tokens}}
                                                                .dump());
}

INSTANTIATE_TEST_SUITE_P(Models, ReceiptTest, ::testing::ValuesIn(receipt_models()),
                         [](const auto& param_info) {
                           std::string s = stem(param_info.param);
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// Flips a bit that matters in the first weight of row `row` of `tensor`: a high mantissa bit
// for float types, the block scale's for the quantized types that start with one.
void change_one_weight(const std::string& path, const std::string& tensor, int64_t row) {
  size_t at = 0;
  uint8_t mask = 0;
  {
    auto f = worker::GgufFile::open(path);
    const worker::TensorInfo* t = f->find_tensor(tensor);
    ASSERT_NE(t, nullptr) << tensor;
    at = f->data_offset() + t->offset + static_cast<size_t>(row) * t->row_bytes();
    switch (t->type) {
      case worker::GgmlType::F32: at += 2, mask = 0x40; break;
      case worker::GgmlType::BF16: mask = 0x40; break;
      default: at += 1, mask = 0x02; break;  // F16, and the f16 scale of Q8_0/Q4_0/Q5_0/Q4_K
    }
  }
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  io.seekp(static_cast<std::streamoff>(at));
  io.write(&c, 1);
}

// The receipt of one seeded request on `route` ("execute" or "chat": a streamed
// /v1/chat/completions request whose final chunk carries it), as a saved JSON document.
json one_receipt(int port, const std::string& route) {
  if (route == "execute") {
    const JobStream s = run_job(port, {{"job_id", unique_job_id("receipt")},
                                       {"prompt", "Once upon a time"},
                                       {"max_tokens", 24},
                                       {"temperature", 0.7},
                                       {"seed", 4242},
                                       {"top_k", 40}});
    EXPECT_TRUE(s.terminal() && s.terminal()->contains("receipt")) << s.describe();
    return s.terminal() ? *s.terminal() : json();
  }
  json req = {{"model", "worker-orcd"},
              {"messages",
               {{{"role", "system"}, {"content", "You write short stories."}},
                {{"role", "user"}, {"content", "Tell me about a cat."}}}},
              {"max_tokens", 24},
              {"temperature", 0.7},
              {"seed", 4242},
              {"top_k", 40},
              {"stream", true}};
  SseStream s(port, "/v1/chat/completions", req);
  json receipt;
  for (const auto& e : s.read_all()) {
    if (e.data == "[DONE]") continue;
    const json c = json::parse(e.data);
    if (c.contains("receipt")) receipt = c["receipt"];
  }
  EXPECT_TRUE(receipt.is_object()) << "no receipt in the chat stream";
  return receipt;
}

class TamperTest : public ::testing::TestWithParam<std::string> {};

// A receipt with one generated token altered is rejected at that step; replayed against a
// copy of the model with one weight changed, at the first step whose input holds the changed
// token. Both routes: /execute's end event and the OpenAI chat stream's final chunk.
// REQ: WRK-D18
TEST_P(TamperTest, AlteredTokenAndChangedWeightAreRejectedAtTheRightStep) {
  const std::string route = GetParam();
  const std::string model = receipt_models()[1];  // a qwen2 (ChatML) model
  WorkerOptions o;
  o.model = model;
  WorkerProcess w(o);
  const json doc = one_receipt(w.port(), route);
  EXPECT_EQ(w.stop(), 0);
  ASSERT_TRUE(doc.is_object());
  const json& r = doc.contains("receipt") ? doc["receipt"] : doc;
  const auto tokens = r["tokens"].get<std::vector<int>>();
  ASSERT_GE(tokens.size(), 12u);
  const auto tokens_path = [&](json& d) -> json& {
    return d.contains("receipt") ? d["receipt"]["tokens"] : d["tokens"];
  };

  const std::string good = save("tamper-" + route + "-original.json", doc);
  Verified v = run_verify(good, model);
  ASSERT_EQ(v.exit_code, 0) << v.out;

  // One generated token altered at step 7: the replay picks another id there.
  json altered = doc;
  tokens_path(altered)[7] = (tokens[7] + 1) % 1000;
  v = run_verify(save("tamper-" + route + "-token.json", altered), model);
  EXPECT_EQ(v.exit_code, 1) << v.out;
  EXPECT_NE(v.out.find("step 7: token"), std::string::npos) << v.out;

  // One weight changed: the embedding row of the first token generated after step 3 that
  // neither the prompt nor an earlier step used. Its logits change from the next step on
  // (from step 0 when the LM head shares the embedding). The prompt's ids come from the
  // worker's own tokenizer tool (BOS included; chat markup parsed as the route does).
  std::set<int> seen(tokens.begin(), tokens.begin() + 3);
  {
    const bool templated = r["request"]["prompt_is_template"].get<bool>();
    const std::string prompt_file = results_dir() + "/receipts/tamper-" + route + "-prompt.txt";
    write_result("receipts/tamper-" + route + "-prompt.txt",
                 r["request"]["prompt"].get<std::string>());
    // (read through the shell with its trailing newline kept: `$(...)` would drop it)
    const std::string cmd = "p=\"$(cat '" + prompt_file + "'; printf x)\"; '" + worker_bin() +
                            "' tokenize --model '" + model + "'" +
                            (templated ? " --specials" : "") + " -- \"${p%x}\"";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[256];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    ASSERT_EQ(pclose(p), 0) << out;
    const json ids = json::parse(out);
    ASSERT_EQ(ids.size(), r["prompt_tokens"]["count"].get<size_t>()) << out;
    for (const auto& id : ids) seen.insert(id.get<int>());
  }
  size_t k = 0;
  for (size_t i = 3; i + 1 < tokens.size(); ++i) {
    if (!seen.count(tokens[i])) {
      k = i;
      break;
    }
    seen.insert(tokens[i]);
  }
  ASSERT_GT(k, 0u) << "no fresh token after step 3";
  const std::string changed =
      results_dir() + "/receipts/changed-" + route + "-" + stem(model) + ".gguf";
  std::filesystem::copy_file(model, changed, std::filesystem::copy_options::overwrite_existing);
  change_one_weight(changed, "token_embd.weight", tokens[k]);
  bool tied = false;
  {
    auto f = worker::GgufFile::open(changed);
    tied = f->find_tensor("output.weight") == nullptr;
  }
  v = run_verify(good, changed);
  std::filesystem::remove(changed);
  EXPECT_EQ(v.exit_code, 1) << v.out;
  const std::string want = "step " + std::to_string(tied ? 0 : k + 1) + ": logits hash";
  EXPECT_NE(v.out.find(want), std::string::npos) << "expected '" << want << "': " << v.out;
  std::printf(
      "tamper (%s, %s): token altered at step 7 -> rejected; embedding row of token %d "
      "(first generated at step %zu) changed -> %s",
      route.c_str(), test_backend().c_str(), tokens[k], k, v.out.c_str());
}

INSTANTIATE_TEST_SUITE_P(Routes, TamperTest, ::testing::Values("execute", "chat"));

}  // namespace
}  // namespace conformance
