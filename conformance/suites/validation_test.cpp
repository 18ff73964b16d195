// Request validation (M0-W-1302, D8): every rule, sent as a bad value, must give HTTP 400
// with {"error":{"code":"INVALID_REQUEST","details":[{field, constraint, message}]}} naming
// the field and the constraint, never echo the prompt, and never queue the job. Boundary
// values must be accepted. Plus 413, 415, 404, 405.
#include <gtest/gtest.h>

#include <set>

#include "harness/suite.h"

namespace conformance {
namespace {

class ValidationTest : public SharedWorkerTest<ValidationTest> {
 public:
  static WorkerOptions worker_options() {
    WorkerOptions o;
    o.model = stories_model();
    return o;
  }

 protected:
  static nlohmann::json base() {
    return {{"job_id", unique_job_id("v")}, {"prompt", "Once upon a time"}, {"max_tokens", 2}};
  }
  // Sends `req` and checks a 400 naming (field, constraint). Returns the body.
  nlohmann::json expect_invalid(const std::string& body, const std::string& field,
                                const std::string& constraint) {
    auto r = http_request(port(), "POST", "/execute", body);
    EXPECT_EQ(r.status, 400) << body.substr(0, 200) << " -> " << r.body.substr(0, 300);
    nlohmann::json j;
    try {
      j = r.json();
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      return nullptr;
    }
    EXPECT_EQ(j["error"]["code"], "INVALID_REQUEST") << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << r.body;
    bool found = false;
    for (const auto& d : j["error"]["details"]) {
      EXPECT_TRUE(d.contains("field") && d.contains("constraint") && d.contains("message")) << d;
      if (d.value("field", "") == field &&
          (constraint.empty() || d.value("constraint", "") == constraint))
        found = true;
    }
    EXPECT_TRUE(found) << "no detail {field: " << field << ", constraint: " << constraint << "} in "
                       << r.body;
    return j;
  }
  nlohmann::json expect_invalid(const nlohmann::json& req, const std::string& field,
                                const std::string& constraint) {
    return expect_invalid(req.dump(), field, constraint);
  }
  void expect_valid(const nlohmann::json& req) {
    JobStream js = run_job(port(), req);
    EXPECT_EQ(js.status, 200) << req.dump() << "\n" << js.describe();
    EXPECT_TRUE(js.violations.empty()) << js.describe();
  }
  static nlohmann::json with(const std::string& key, const nlohmann::json& v) {
    auto j = base();
    j[key] = v;
    return j;
  }
};

// REQ: M0-W-1302 WRK-D8
TEST_F(ValidationTest, JobId) {
  expect_invalid(with("job_id", ""), "job_id", "min_length");
  expect_invalid(with("job_id", std::string(129, 'a')), "job_id", "max_length");
  expect_invalid(with("job_id", "bad\x01id"), "job_id", "printable_ascii");
  expect_invalid(with("job_id", "caf\xC3\xA9"), "job_id", "printable_ascii");
  expect_invalid(with("job_id", 17), "job_id", "type");
  expect_valid(with("job_id", std::string(128, 'b')));
}

// REQ: M0-W-1302 WRK-D8
TEST_F(ValidationTest, Prompt) {
  auto j = base();
  j.erase("prompt");
  expect_invalid(j, "prompt", "required");
  expect_invalid(with("prompt", ""), "prompt", "min_length");
  expect_invalid(with("prompt", 5), "prompt", "type");
  // 32768 scalar values is the limit, counted in scalars (3-byte characters here), not bytes.
  std::string ok;
  for (int i = 0; i < 32768; ++i) ok += "\xE4\xB8\x80";
  expect_invalid(with("prompt", ok + "a"), "prompt", "max_length");
  // Invalid UTF-8 inside the JSON string.
  expect_invalid(
      std::string(R"({"job_id":"u1","prompt":"ab)") + "\xFF\xFE" + R"(","max_tokens":2})", "prompt",
      "utf8");
  // A lone surrogate escape is not a Unicode scalar value.
  expect_invalid(std::string(R"({"job_id":"u2","prompt":"a\ud800b","max_tokens":2})"), "prompt",
                 "utf8");
}

// The context check needs the prompt tokenized; a 32768-scalar prompt with a short token
// count is valid at the length rule and refused only by the context rule.
// REQ: M0-W-1302 WRK-D8
TEST_F(ValidationTest, ContextLength) {
  std::string p;
  for (int i = 0; i < 300; ++i) p += "the dog ran. ";
  auto j = with("prompt", p);
  j["max_tokens"] = 2048;
  expect_invalid(j, "max_tokens", "context_length");
  j["max_tokens"] = 1;
  std::string huge;
  for (int i = 0; i < 3000; ++i) huge += "dog ";
  j["prompt"] = huge;
  expect_invalid(j, "prompt", "context_length");
}

// Issue 15 row 5: temperature 1e-40 overflowed logit / temperature and streamed NUL bytes
// and U+FFFD. WRK-D27: below 1e-5 it is greedy, on /execute and on the OpenAI routes.
// REQ: WRK-D27 M0-W-1032
TEST_F(ValidationTest, TinyTemperatureIsGreedy) {
  auto req = [](double t) {
    auto j = base();
    j["max_tokens"] = 24;
    j["temperature"] = t;
    j["seed"] = 7;
    return j;
  };
  const JobStream greedy = run_job(port(), req(0));
  ASSERT_EQ(greedy.status, 200) << greedy.describe();
  ASSERT_TRUE(greedy.violations.empty()) << greedy.describe();
  ASSERT_FALSE(greedy.text().empty());
  for (double t : {1e-40, 1e-38, 1e-6}) {
    const JobStream js = run_job(port(), req(t));
    ASSERT_EQ(js.status, 200) << t << "\n" << js.describe();
    EXPECT_TRUE(js.violations.empty()) << js.describe();
    const std::string text = js.text();
    EXPECT_EQ(text.find('\0'), std::string::npos) << t;
    EXPECT_EQ(text.find("\xEF\xBF\xBD"), std::string::npos) << t;
    EXPECT_EQ(text, greedy.text()) << "temperature " << t;
  }
  // The repetition penalty divides logits too; below its minimum it is a 400.
  expect_invalid(with("repetition_penalty", 1e-40), "repetition_penalty", "range");
  // The OpenAI route shares the rule.
  const nlohmann::json oai = {{"model", "x"},
                              {"prompt", "Once upon a time"},
                              {"max_tokens", 24},
                              {"temperature", 1e-40},
                              {"seed", 7}};
  auto r = http_request(port(), "POST", "/v1/completions", oai.dump());
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 300);
  EXPECT_EQ(r.json()["choices"][0]["text"], greedy.text());
}

// REQ: M0-W-1302 WRK-D8
TEST_F(ValidationTest, MaxTokens) {
  expect_invalid(with("max_tokens", 0), "max_tokens", "range");
  expect_invalid(with("max_tokens", -1), "max_tokens", "range");
  expect_invalid(with("max_tokens", 2049), "max_tokens", "range");
  expect_invalid(with("max_tokens", 1.5), "max_tokens", "type");
  expect_invalid(with("max_tokens", "10"), "max_tokens", "type");
  expect_valid(with("max_tokens", 1));
}

// REQ: M0-W-1302 WRK-D8 M0-W-1032
TEST_F(ValidationTest, Temperature) {
  expect_invalid(with("temperature", -0.01), "temperature", "range");
  expect_invalid(with("temperature", 2.01), "temperature", "range");
  expect_invalid(with("temperature", "hot"), "temperature", "type");
  expect_valid(with("temperature", 0));
  expect_valid(with("temperature", 2.0));
}

// REQ: M0-W-1302 WRK-D8
TEST_F(ValidationTest, TopPTopKMinP) {
  expect_invalid(with("top_p", -0.1), "top_p", "range");
  expect_invalid(with("top_p", 1.1), "top_p", "range");
  expect_invalid(with("top_k", -1), "top_k", "range");
  expect_invalid(with("top_k", 2.5), "top_k", "type");
  expect_invalid(with("min_p", -0.1), "min_p", "range");
  expect_invalid(with("min_p", 1.5), "min_p", "range");
  expect_valid(with("top_p", 0.0));
  expect_valid(with("top_p", 1.0));
  expect_valid(with("top_k", 0));
  expect_valid(with("top_k", 100000));
  expect_valid(with("min_p", 1.0));
}

// REQ: M0-W-1302 WRK-D8
TEST_F(ValidationTest, RepetitionPenalty) {
  expect_invalid(with("repetition_penalty", 0), "repetition_penalty", "range");  // exclusive
  expect_invalid(with("repetition_penalty", -1), "repetition_penalty", "range");
  expect_invalid(with("repetition_penalty", 2.01), "repetition_penalty", "range");
  expect_valid(with("repetition_penalty", 2.0));
  expect_valid(with("repetition_penalty", 0.01));
}

// REQ: M0-W-1302 WRK-D8 M0-W-1422
TEST_F(ValidationTest, Stop) {
  expect_invalid(with("stop", {"a", "b", "c", "d", "e"}), "stop", "max_items");
  expect_invalid(with("stop", {"a", ""}), "stop[1]", "non_empty");
  expect_invalid(with("stop", {"a", 3}), "stop[1]", "type");
  expect_invalid(with("stop", "END"), "stop", "type");
  // > 32 tokens with the prompt tokenizer (each "zq" splits into several pieces)
  std::string long_stop;
  for (int i = 0; i < 40; ++i) long_stop += "zq ";
  expect_invalid(with("stop", {long_stop}), "stop[0]", "max_tokens");
  expect_valid(with("stop", {"a.", "b.", "c.", "d."}));
}

// REQ: M0-W-1302 WRK-D8 M0-W-1030
TEST_F(ValidationTest, SeedAndChat) {
  expect_invalid(with("seed", -1), "seed", "");
  expect_invalid(with("seed", 1.5), "seed", "");
  expect_invalid(with("seed", "42"), "seed", "type");
  expect_invalid(std::string(R"({"prompt":"a","seed":18446744073709551616})"), "seed", "");
  expect_invalid(with("chat", "yes"), "chat", "type");
  expect_valid(with("seed", 0));
}

// REQ: M0-W-1302 WRK-D8
TEST_F(ValidationTest, UnknownFieldIsRejected) {
  expect_invalid(with("temprature", 0.5), "temprature", "unknown_field");
}

// All violations are listed, and the prompt is never echoed back.
// REQ: M0-W-1302 WRK-D8
TEST_F(ValidationTest, AllViolationsListedPromptNotEchoed) {
  const std::string secret = "SECRET-PROMPT-TEXT-9f8e7d";
  nlohmann::json j = {{"prompt", secret}, {"temperature", 9}, {"top_p", 9}, {"max_tokens", 0}};
  auto r = http_request(port(), "POST", "/execute", j.dump());
  ASSERT_EQ(r.status, 400);
  EXPECT_EQ(r.body.find(secret), std::string::npos) << r.body;
  auto body = r.json();
  std::set<std::string> fields;
  for (const auto& d : body["error"]["details"]) fields.insert(d["field"].get<std::string>());
  EXPECT_EQ(fields, (std::set<std::string>{"temperature", "top_p", "max_tokens"})) << r.body;
}

// REQ: M0-W-1302 WRK-D8
TEST_F(ValidationTest, BodyMustBeAJsonObject) {
  expect_invalid(std::string("{not json"), "body", "json");
  expect_invalid(std::string("[1,2]"), "body", "type");
  expect_invalid(std::string(""), "body", "");
}

// Validation happens before admission: a rejected request never reaches the job runner.
// REQ: M0-W-1302 WRK-D8 M0-W-1350
TEST_F(ValidationTest, RejectedRequestsAreNotQueued) {
  const size_t starts = worker().log_events("execute_start").size();
  for (int i = 0; i < 5; ++i) expect_invalid(with("max_tokens", 0), "max_tokens", "range");
  auto h = http_get(port(), "/health").json();
  EXPECT_EQ(h["busy"], false);
  EXPECT_EQ(h["queue_depth"], 0);
  EXPECT_EQ(worker().log_events("execute_start").size(), starts);
}

// M0-W-1825's oversized request (10,000 "x", max_tokens 10,000) contradicts the 1..2048
// max_tokens rule; per D8 it is refused before admission (400, nothing allocated), the
// process survives, and the follow-up small request succeeds.
// REQ: M0-W-1825 WRK-D8 WRK-D11
TEST_F(ValidationTest, OversizedRequestIsRefusedAndTheWorkerServesTheNextOne) {
  nlohmann::json big = {
      {"job_id", unique_job_id("oom")}, {"prompt", std::string(10000, 'x')}, {"max_tokens", 10000}};
  expect_invalid(big, "max_tokens", "range");
  ASSERT_TRUE(worker().running());
  JobStream js = run_job(port(), job_request("Hello", 10, 0.0));
  EXPECT_TRUE(js.violations.empty()) << js.describe();
  EXPECT_EQ(js.events.back().event, "end");
  EXPECT_EQ((*js.terminal())["tokens_out"], 10);
  EXPECT_EQ(http_get(port(), "/health").json()["status"], "healthy");
}

// REQ: WRK-D8
TEST_F(ValidationTest, BodyOverOneMebibyteIs413) {
  auto j = base();
  j["prompt"] = std::string(1024 * 1024 + 10, 'a');
  auto r = http_request(port(), "POST", "/execute", j.dump());
  EXPECT_EQ(r.status, 413);
}

// REQ: WRK-D8
TEST_F(ValidationTest, WrongContentTypeIs415) {
  RequestOptions o;
  o.content_type = "text/plain";
  auto r = http_request(port(), "POST", "/execute", base().dump(), o);
  EXPECT_EQ(r.status, 415) << r.body;
}

// REQ: WRK-D5
TEST_F(ValidationTest, UnknownRouteIs404Json) {
  auto r = http_get(port(), "/no/such/route");
  EXPECT_EQ(r.status, 404);
  EXPECT_NO_THROW(r.json()) << r.body;
  auto r2 = http_request(port(), "POST", "/v1/models/load", "{}");
  EXPECT_EQ(r2.status, 404);  // no way to load a second model (M0-W-1001)
}

// REQ: WRK-D5
TEST_F(ValidationTest, WrongMethodIs405Json) {
  auto r = http_get(port(), "/execute");
  EXPECT_EQ(r.status, 405) << r.body;
  EXPECT_NO_THROW(r.json()) << r.body;
  auto r2 = http_request(port(), "POST", "/health", "{}");
  EXPECT_EQ(r2.status, 405) << r2.body;
}

}  // namespace
}  // namespace conformance
