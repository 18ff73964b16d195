#include "haiku/haiku_check.h"

#include <chrono>
#include <random>
#include <sstream>
#include <stdexcept>

#include "harness/test_env.h"
#include "harness/worker_stream.h"

namespace conformance::haiku {

std::string minute_word(int m) {
  static const char* ones[] = {"zero",    "one",     "two",       "three",    "four",
                               "five",    "six",     "seven",     "eight",    "nine",
                               "ten",     "eleven",  "twelve",    "thirteen", "fourteen",
                               "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"};
  static const char* tens[] = {"", "", "twenty", "thirty", "forty", "fifty"};
  if (m < 0 || m > 59) throw std::out_of_range("minute out of range");
  if (m < 20) return ones[m];
  std::string w = tens[m / 10];
  if (m % 10) w += std::string("-") + ones[m % 10];
  return w;
}

int count_occurrences(const std::string& text, const std::string& word) {
  if (word.empty()) return 0;
  int n = 0;
  for (size_t p = text.find(word); p != std::string::npos; p = text.find(word, p + word.size()))
    ++n;
  return n;
}

std::string make_nonce() {
  static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::uniform_int_distribution<int> pick(0, 61);
  std::string s;
  for (int i = 0; i < 8; ++i) s += alphabet[pick(rd)];
  return s;
}

std::string anti_cheat_prompt(const std::string& word, const std::string& nonce) {
  return "Write a haiku about GPU computing that includes the word \"" + word +
         "\" (nonce: " + nonce + ")";
}

namespace {

struct UtcNow {
  int minute;
  uint64_t unix_seconds;
  std::string iso;
};

UtcNow utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return {tm.tm_min, static_cast<uint64_t>(t), buf};
}

}  // namespace

Attempt run_check(int port, int minute, uint64_t seed, const std::string& started_at_utc) {
  Attempt a;
  a.minute_at_build = minute;
  a.word = minute_word(minute);
  a.nonce = make_nonce();
  a.prompt = anti_cheat_prompt(a.word, a.nonce);
  a.seed = seed;
  a.started_at_utc = started_at_utc;
  a.job_id = "haiku-" + a.nonce;
  const nlohmann::json req = {{"job_id", a.job_id}, {"prompt", a.prompt}, {"chat", true},
                              {"max_tokens", 100},  {"temperature", 0.7}, {"seed", a.seed}};
  const auto t0 = Clock::now();
  try {
    RequestOptions o;
    o.timeout = std::chrono::seconds(60);
    SseStream s(port, "/execute", req, o);
    if (s.status() != 200) {
      a.failures.push_back("HTTP " + std::to_string(s.status()) + ": " + s.read_body());
    } else {
      JobStream js = collect(s, std::chrono::seconds(60));
      for (size_t k = 0; k < js.events.size(); ++k)
        a.transcript.push_back({{"t_ms", ms_between(t0, js.events[k].arrival)},
                                {"event", js.events[k].event},
                                {"data", js.payloads[k]}});
      for (const auto& v : js.violations) a.failures.push_back("stream: " + v);
      if (!js.events.empty()) {
        a.first_event = js.events.front().event;
        a.last_event = js.events.back().event;
      }
      a.token_events = static_cast<int>(js.tokens().size());
      a.text = js.text();
      if (js.terminal()) a.end = *js.terminal();
      for (const auto& e : js.events)
        if (e.event == "token") {
          a.first_token_ms = ms_between(t0, e.arrival);
          break;
        }
    }
  } catch (const std::exception& e) {
    a.failures.push_back(std::string("request failed: ") + e.what());
  }
  a.total_ms = ms_between(t0, Clock::now());
  a.minute_at_end = minute;
  a.occurrences = count_occurrences(a.text, a.word);
  if (a.first_event != "started")
    a.failures.push_back("first event is '" + a.first_event + "', not started");
  if (a.token_events < 1) a.failures.push_back("no token event");
  if (a.last_event != "end") a.failures.push_back("last event is '" + a.last_event + "', not end");
  if (a.occurrences != 1)
    a.failures.push_back("minute word \"" + a.word + "\" occurs " + std::to_string(a.occurrences) +
                         " times (expected exactly 1)");
  if (a.total_ms > 30000)
    a.failures.push_back("took " + std::to_string(a.total_ms) + " ms (> 30 s)");
  return a;
}

namespace {

// D17's form: the minute word and the seed come from the clock when the request is built.
Attempt run_once(int port) {
  const UtcNow now = utc_now();
  Attempt a = run_check(port, now.minute, now.unix_seconds, now.iso);
  a.minute_at_end = utc_now().minute;
  return a;
}

nlohmann::json to_json(const Attempt& a) {
  return {{"prompt", a.prompt},
          {"minute_word", a.word},
          {"nonce", a.nonce},
          {"seed", a.seed},
          {"job_id", a.job_id},
          {"request_built_at_utc", a.started_at_utc},
          {"minute_at_build", a.minute_at_build},
          {"minute_at_end", a.minute_at_end},
          {"text", a.text},
          {"occurrences", a.occurrences},
          {"token_events", a.token_events},
          {"first_event", a.first_event},
          {"last_event", a.last_event},
          {"end", a.end},
          {"total_ms", a.total_ms},
          {"first_token_ms", a.first_token_ms},
          {"passed", a.failures.empty()},
          {"failures", a.failures}};
}

}  // namespace

std::vector<Attempt> run_anti_cheat(int port, const std::string& model,
                                    const std::string& artifact_dir) {
  std::vector<Attempt> attempts;
  attempts.push_back(run_once(port));
  // One retry, only when the UTC minute rolled over during the run (the word the model
  // was asked for and the clock's word then differ).
  if (attempts.back().minute_at_build != attempts.back().minute_at_end)
    attempts.push_back(run_once(port));
  const Attempt& last = attempts.back();

  nlohmann::json v = {{"test", "haiku anti-cheat (D17, M0-W-1800)"},
                      {"model", model},
                      {"backend", test_backend()},
                      {"passed", last.failures.empty()},
                      {"attempts", nlohmann::json::array()}};
  for (const auto& a : attempts) v["attempts"].push_back(to_json(a));
  write_result(artifact_dir + "/verification.json", v.dump(2) + "\n");

  std::string nd;
  for (size_t i = 0; i < attempts.size(); ++i)
    for (const auto& e : attempts[i].transcript) {
      nlohmann::json line = e;
      line["attempt"] = i + 1;
      nd += line.dump() + "\n";
    }
  write_result(artifact_dir + "/sse_transcript.ndjson", nd);

  std::ostringstream md;
  md << "# Haiku anti-cheat test\n\n"
     << "- Result: **" << (last.failures.empty() ? "PASS" : "FAIL") << "**\n"
     << "- Model: `" << model << "`\n- Backend: " << test_backend() << "\n"
     << "- Attempts: " << attempts.size()
     << (attempts.size() > 1 ? " (the UTC minute changed during the first run)" : "") << "\n"
     << "- Request built at (UTC): " << last.started_at_utc << "\n"
     << "- Prompt: `" << last.prompt << "`\n"
     << "- Minute word: `" << last.word << "`, occurrences: " << last.occurrences << "\n"
     << "- Seed: " << last.seed << ", temperature 0.7, max_tokens 100, chat true\n"
     << "- Token events: " << last.token_events << ", first token after " << last.first_token_ms
     << " ms, total " << last.total_ms << " ms (limit 30000)\n\n"
     << "## Output\n\n```\n"
     << last.text << "\n```\n";
  if (!last.failures.empty()) {
    md << "\n## Failures\n\n";
    for (const auto& f : last.failures) md << "- " << f << "\n";
  }
  write_result(artifact_dir + "/report.md", md.str());
  return attempts;
}

}  // namespace conformance::haiku
