#pragma once
// Checks of the worker's SSE contract (D6, M0-W-1310..1312) shared by the suites.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/http_client.h"

namespace conformance {

struct JobStream {
  std::vector<SseEvent> events;
  std::vector<nlohmann::json> payloads;  // data of each event (null if not JSON)
  std::vector<SseComment> comments;
  std::vector<std::string> violations;  // framing + D6 order/payload problems
  int status = 0;
  Clock::time_point sent_at, end_at;

  const nlohmann::json* started() const;
  const nlohmann::json* terminal() const;  // last event when it is end or error
  std::vector<const nlohmann::json*> tokens() const;
  std::string text() const;  // concatenated token t
  std::vector<std::string> pieces() const;
  // Token ids when the token events carry them ("id" or "token_id"); empty otherwise.
  std::vector<long long> token_ids() const;
  std::string describe() const;  // events as text, for failure messages
};

// Validates framing and D6 (order started, token*, one terminal; metrics only between;
// payload fields; data one-line JSON with "type" equal to the event name; token index
// counting from 0; every token text valid UTF-8 on its own). Returns violations.
std::vector<std::string> check_job_stream(const std::vector<SseEvent>& events);

// Runs one /execute request to the end.
JobStream run_job(int port, const nlohmann::json& request, const RequestOptions& opts = {},
                  const std::string& path = "/execute");
JobStream collect(SseStream& s, std::chrono::milliseconds timeout = std::chrono::seconds(120));

// A request with sensible defaults for the stories model.
nlohmann::json job_request(const std::string& prompt, int max_tokens, double temperature,
                           std::optional<unsigned long long> seed = std::nullopt);
std::string unique_job_id(const std::string& prefix = "job");

// Valid UTF-8 check independent of the worker's own helpers.
bool valid_utf8(const std::string& s);

}  // namespace conformance
