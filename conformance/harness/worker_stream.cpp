#include "harness/worker_stream.h"

#include <atomic>
#include <regex>
#include <sstream>

#include <unistd.h>

namespace conformance {

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

namespace {

bool is_rfc3339(const std::string& s) {
  static const std::regex re(R"(^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$)");
  return std::regex_match(s, re);
}

void need(std::vector<std::string>& v, bool ok, size_t idx, const std::string& what) {
  if (!ok) v.push_back("event #" + std::to_string(idx) + ": " + what);
}

}  // namespace

std::vector<std::string> check_job_stream(const std::vector<SseEvent>& events) {
  std::vector<std::string> v;
  if (events.empty()) {
    v.push_back("no events");
    return v;
  }
  int next_index = 0;
  size_t token_events = 0;
  for (size_t k = 0; k < events.size(); ++k) {
    const auto& e = events[k];
    need(v, e.has_event, k, "no 'event:' line");
    need(v, e.data_lines == 1, k,
         "data must be exactly one line, got " + std::to_string(e.data_lines));
    nlohmann::json d;
    try {
      d = nlohmann::json::parse(e.data);
    } catch (const std::exception&) {
      v.push_back("event #" + std::to_string(k) + ": data is not JSON: " + e.data);
      continue;
    }
    need(v, d.is_object(), k, "data is not a JSON object");
    if (!d.is_object()) continue;
    need(v, d.contains("type") && d["type"] == e.event, k,
         "data.type must equal the event name '" + e.event + "'");
    const bool first = k == 0, last = k + 1 == events.size();
    if (e.event == "started") {
      need(v, first, k, "'started' must be the first event only");
      need(v, d.contains("job_id") && d["job_id"].is_string(), k, "started.job_id missing");
      need(v, d.contains("model") && d["model"].is_string(), k, "started.model missing");
      need(v,
           d.contains("started_at") && d["started_at"].is_string() &&
               is_rfc3339(d["started_at"].get<std::string>()),
           k, "started.started_at missing or not RFC 3339");
      need(v, d.contains("seed") && d["seed"].is_number_unsigned(), k,
           "started.seed missing or not an unsigned integer");
      need(v, d.contains("prompt_tokens") && d["prompt_tokens"].is_number_integer(), k,
           "started.prompt_tokens missing");
    } else if (e.event == "token") {
      need(v, !first && !last, k, "'token' must be between started and the terminal event");
      need(v, d.contains("t") && d["t"].is_string(), k, "token.t missing");
      need(v, d.contains("i") && d["i"].is_number_integer(), k, "token.i missing");
      if (d.contains("t") && d["t"].is_string())
        need(v, valid_utf8(d["t"].get<std::string>()), k,
             "token.t is not valid UTF-8 on its own (partial sequence, D7)");
      if (d.contains("i") && d["i"].is_number_integer()) {
        need(v, d["i"].get<int>() == next_index, k,
             "token.i is " + d["i"].dump() + ", expected " + std::to_string(next_index));
        next_index = d["i"].get<int>() + 1;
      }
      ++token_events;
    } else if (e.event == "metrics") {
      need(v, !first && !last, k, "'metrics' only between started and the terminal event");
    } else if (e.event == "end") {
      need(v, last, k, "'end' must be the last event");
      need(v, d.contains("tokens_out") && d["tokens_out"].is_number_integer(), k,
           "end.tokens_out missing");
      need(v, d.contains("decode_time_ms") && d["decode_time_ms"].is_number(), k,
           "end.decode_time_ms missing");
      need(v, d.contains("first_token_ms") && d["first_token_ms"].is_number(), k,
           "end.first_token_ms missing");
      const std::string sr = d.value("stop_reason", "");
      need(v, sr == "max_tokens" || sr == "eos" || sr == "stop_sequence", k,
           "end.stop_reason invalid: '" + sr + "'");
      if (sr == "stop_sequence")
        need(v, d.contains("stop_sequence_matched") && d["stop_sequence_matched"].is_string(), k,
             "end.stop_sequence_matched missing");
      if (d.contains("tokens_out") && d["tokens_out"].is_number_integer())
        need(v, d["tokens_out"].get<size_t>() >= token_events, k,
             "end.tokens_out smaller than the number of token events");
    } else if (e.event == "error") {
      need(v, last, k, "'error' must be the last event");
      need(v, d.contains("code") && d["code"].is_string(), k, "error.code missing");
      need(v, d.contains("message") && d["message"].is_string(), k, "error.message missing");
      need(v, d.contains("retriable") && d["retriable"].is_boolean(), k, "error.retriable missing");
    } else {
      v.push_back("event #" + std::to_string(k) + ": unknown event type '" + e.event + "'");
    }
  }
  if (events.front().event != "started") v.push_back("first event is not 'started'");
  const auto& lastev = events.back().event;
  if (lastev != "end" && lastev != "error") v.push_back("stream has no terminal event");
  return v;
}

const nlohmann::json* JobStream::started() const {
  return !payloads.empty() && events.front().event == "started" ? &payloads.front() : nullptr;
}

const nlohmann::json* JobStream::terminal() const {
  if (events.empty()) return nullptr;
  const auto& e = events.back().event;
  return e == "end" || e == "error" ? &payloads.back() : nullptr;
}

std::vector<const nlohmann::json*> JobStream::tokens() const {
  std::vector<const nlohmann::json*> out;
  for (size_t k = 0; k < events.size(); ++k)
    if (events[k].event == "token") out.push_back(&payloads[k]);
  return out;
}

std::string JobStream::text() const {
  std::string s;
  for (const auto* t : tokens()) s += t->value("t", "");
  return s;
}

std::vector<std::string> JobStream::pieces() const {
  std::vector<std::string> out;
  for (const auto* t : tokens()) out.push_back(t->value("t", ""));
  return out;
}

std::vector<long long> JobStream::token_ids() const {
  std::vector<long long> out;
  for (const auto* t : tokens()) {
    if (t->contains("id") && (*t)["id"].is_number_integer())
      out.push_back((*t)["id"]);
    else if (t->contains("token_id") && (*t)["token_id"].is_number_integer())
      out.push_back((*t)["token_id"]);
    else
      return {};
  }
  return out;
}

std::string JobStream::describe() const {
  std::ostringstream o;
  o << "HTTP " << status << ", " << events.size() << " events";
  for (const auto& s : violations) o << "\n  violation: " << s;
  size_t shown = 0;
  for (const auto& e : events) {
    if (++shown > 12 && shown + 4 < events.size()) continue;
    o << "\n  " << e.event << ": " << e.data.substr(0, 300);
  }
  return o.str();
}

JobStream collect(SseStream& s, std::chrono::milliseconds timeout) {
  JobStream js;
  js.status = s.status();
  js.sent_at = s.sent_at();
  js.events = s.read_all(timeout);
  js.end_at = s.end_at();
  js.comments = s.parser().comments();
  js.violations = s.parser().violations();
  for (const auto& e : js.events) {
    try {
      js.payloads.push_back(nlohmann::json::parse(e.data));
    } catch (const std::exception&) {
      js.payloads.push_back(nullptr);
    }
  }
  for (auto& x : check_job_stream(js.events)) js.violations.push_back(std::move(x));
  return js;
}

JobStream run_job(int port, const nlohmann::json& request, const RequestOptions& opts,
                  const std::string& path) {
  SseStream s(port, path, request, opts);
  if (s.status() != 200) {
    JobStream js;
    js.status = s.status();
    js.violations.push_back("HTTP status " + std::to_string(s.status()) + ": " + s.read_body());
    return js;
  }
  return collect(s, opts.timeout);
}

nlohmann::json job_request(const std::string& prompt, int max_tokens, double temperature,
                           std::optional<unsigned long long> seed) {
  nlohmann::json r = {{"job_id", unique_job_id()},
                      {"prompt", prompt},
                      {"max_tokens", max_tokens},
                      {"temperature", temperature}};
  if (seed) r["seed"] = *seed;
  return r;
}

std::string unique_job_id(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

}  // namespace conformance
