// Receipts (WRK-D18) on the CPU reference: a generation's receipt replays as identical, and
// a receipt with one token or one logits hash altered, or replayed against a model with one
// weight changed, is rejected at exactly the step where the difference first shows.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <set>

#include "common/sha256.h"
#include "common/test_helpers.h"
#include "engine/cpu/cpu_engine.h"
#include "engine/engine.h"
#include "engine/generation.h"
#include "engine/receipt.h"
#include "gguf/gguf_file.h"
#include "gguf/model_config.h"
#include "tokenizer/tokenizer.h"

namespace worker {
namespace {
using nlohmann::json;

std::string stories_path() {
  return test::shared_fixtures() + "/stories260K.gguf";
}

struct Loaded {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::string hash;
};

Loaded load(const std::string& path) {
  Loaded l;
  l.model = load_model(path);
  l.tok = make_tokenizer(*l.model->file);
  l.hash = file_content_hash(path);
  return l;
}

std::unique_ptr<Engine> cpu_engine(const Loaded& l, bool kv_f16) {
  CpuEngineOptions o;
  o.kv_f16 = kv_f16;
  return make_cpu_engine(l.model, 256, nullptr, o);
}

json run_and_receipt(const Loaded& l, bool kv_f16, const GenerationRequest& req) {
  auto engine = cpu_engine(l, kv_f16);
  GenerationRequest with_ids = req;
  with_ids.prompt_tokens = tokenize_prompt(*l.tok, req.prompt, false);
  const GenerationResult res = generate(*engine, *l.tok, with_ids, {});
  ReceiptContext ctx;
  std::promise<std::string> p;
  p.set_value(l.hash);
  ctx.model_hash = p.get_future().share();
  ctx.model_name = "stories260K";
  ctx.backend = engine->info();
  ctx.tokenizer_kind = l.tok->kind();
  ctx.n_ctx = engine->n_ctx();
  ctx.worker_build = "test";
  // through text, as a client would hold it
  return json::parse(make_receipt(ctx, req, false, res).dump());
}

GenerationRequest request(uint64_t seed, float temp, float top_p, int top_k, float min_p,
                          float penalty) {
  GenerationRequest r;
  r.prompt = "Once upon a time, there was a little";
  r.max_tokens = 40;
  r.sampling = {temp, top_p, top_k, min_p, penalty, seed};
  return r;
}

VerifyOutcome verify(const Loaded& l, const json& receipt) {
  auto engine = cpu_engine(l, receipt["engine"]["kv_cache"] == "f16");
  return verify_receipt(receipt, *engine, *l.tok, l.hash);
}

// REQ: WRK-D18
TEST(Receipt, CpuGenerationsVerifyIdentical) {
  const Loaded l = load(stories_path());
  std::mt19937 g(18);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  int n = 0;
  for (bool kv_f16 : {false, true}) {
    for (int i = 0; i < 6; ++i) {
      const auto req =
          request(1000 + static_cast<uint64_t>(i), i == 0 ? 0.0f : 0.7f, 0.8f + 0.2f * u(g),
                  i % 3 == 0 ? 0 : 10 + i, 0.05f * u(g), 1.0f + 0.3f * u(g));
      const json r = run_and_receipt(l, kv_f16, req);
      ASSERT_EQ(r["tokens"].size(), r["logits_hashes"].size());
      ASSERT_FALSE(r["tokens"].empty());
      EXPECT_EQ(r["engine"]["kv_cache"], kv_f16 ? "f16" : "f32");
      EXPECT_EQ(r["request"]["seed"], 1000 + i);
      const VerifyOutcome v = verify(l, r);
      EXPECT_TRUE(v.identical) << v.problem;
      EXPECT_EQ(v.steps_checked, static_cast<int64_t>(r["tokens"].size()));
      ++n;
    }
  }
  EXPECT_EQ(n, 12);
}

// REQ: WRK-D18
TEST(Receipt, AlteredTokenOrHashIsRejectedAtItsStep) {
  const Loaded l = load(stories_path());
  const json r = run_and_receipt(l, true, request(7, 0.7f, 0.95f, 40, 0.0f, 1.1f));
  const int64_t n = static_cast<int64_t>(r["tokens"].size());
  ASSERT_GE(n, 20);
  for (int64_t k : {int64_t{0}, int64_t{9}, n - 1}) {
    json t = r;
    t["tokens"][static_cast<size_t>(k)] =
        (t["tokens"][static_cast<size_t>(k)].get<int>() + 1) % 512;
    VerifyOutcome v = verify(l, t);
    EXPECT_FALSE(v.identical);
    EXPECT_EQ(v.step, k) << v.problem;
    EXPECT_NE(v.problem.find("token"), std::string::npos) << v.problem;

    json h = r;
    std::string hs = h["logits_hashes"][static_cast<size_t>(k)];
    hs[0] = hs[0] == '0' ? '1' : '0';
    h["logits_hashes"][static_cast<size_t>(k)] = hs;
    v = verify(l, h);
    EXPECT_FALSE(v.identical);
    EXPECT_EQ(v.step, k) << v.problem;
    EXPECT_NE(v.problem.find("logits hash"), std::string::npos) << v.problem;
  }
  json s = r;
  s["request"]["seed"] = 8;  // another seed: the draws, so a token, differ
  EXPECT_FALSE(verify(l, s).identical);
  json p = r;
  p["request"]["prompt"] = "Once upon a time, there was a big";
  const VerifyOutcome vp = verify(l, p);
  EXPECT_FALSE(vp.identical);
  EXPECT_NE(vp.problem.find("prompt tokens"), std::string::npos) << vp.problem;
  json f = r;
  f["engine"]["numerics"] = "fast";
  EXPECT_FALSE(verify(l, f).identical);
  json bad = r;
  bad["tokens"].erase(0);
  EXPECT_THROW(verify(l, bad), std::invalid_argument);
}

// One weight changed: the embedding row of a token first generated at step k. Its logits
// only change from the step after it is fed back (k + 1), unless the LM head shares the
// embedding (then from step 0).
// REQ: WRK-D18
TEST(Receipt, ChangedWeightIsRejectedAtTheStepItFirstAffects) {
  const Loaded l = load(stories_path());
  const GenerationRequest req = request(11, 0.8f, 1.0f, 0, 0.0f, 1.0f);
  const json r = run_and_receipt(l, false, req);
  const auto tokens = r["tokens"].get<std::vector<int32_t>>();
  std::set<int32_t> seen;
  for (int32_t id : tokenize_prompt(*l.tok, req.prompt, false)) seen.insert(id);
  size_t k = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i >= 3 && !seen.count(tokens[i])) {
      k = i;
      break;
    }
    seen.insert(tokens[i]);
  }
  ASSERT_GT(k, 0u) << "no fresh token after step 3";
  ASSERT_LT(k + 1, tokens.size());

  const auto changed = std::filesystem::temp_directory_path() /
                       ("receipt_changed_" + std::to_string(::getpid()) + ".gguf");
  std::filesystem::copy_file(stories_path(), changed,
                             std::filesystem::copy_options::overwrite_existing);
  bool tied = true;
  size_t at = 0;
  {
    auto f = GgufFile::open(stories_path());
    const TensorInfo* emb = f->find_tensor("token_embd.weight");
    ASSERT_NE(emb, nullptr);
    tied = f->find_tensor("output.weight") == nullptr;
    ASSERT_EQ(emb->type, GgmlType::F32);
    at = f->data_offset() + emb->offset + static_cast<size_t>(tokens[k]) * emb->row_bytes() + 2;
  }
  {
    std::fstream io(changed, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);  // the top mantissa bit of one weight
    io.seekp(static_cast<std::streamoff>(at));
    io.write(&c, 1);
  }
  const Loaded other = load(changed.string());
  EXPECT_NE(other.hash, l.hash);
  const VerifyOutcome v = verify(other, r);
  std::filesystem::remove(changed);
  EXPECT_FALSE(v.identical);
  EXPECT_EQ(v.step, tied ? 0 : static_cast<int64_t>(k + 1)) << v.problem;
  EXPECT_NE(v.problem.find("logits hash"), std::string::npos) << v.problem;
}

// REQ: WRK-D18
TEST(Receipt, FoundInEndEventsAndOpenAiResponses) {
  const json receipt = {{"version", 1}, {"logits_hashes", json::array()}};
  EXPECT_EQ(&find_receipt(receipt), &receipt);
  const json end = {{"type", "end"}, {"receipt", receipt}};
  EXPECT_EQ(find_receipt(end), receipt);
  EXPECT_THROW(find_receipt(json{{"type", "end"}}), std::invalid_argument);
  EXPECT_THROW(find_receipt(json::array()), std::invalid_argument);
}

}  // namespace
}  // namespace worker
