#pragma once
// The haiku anti-cheat check (D17, M0-W-1800): build the prompt from the UTC clock and a
// random nonce, stream it through the real worker, and verify the minute word appears
// exactly once. Shared by the conformance test and its mutation check.
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace conformance::haiku {

// 0 -> "zero", 21 -> "twenty-one", 59 -> "fifty-nine".
std::string minute_word(int minute);
// Non-overlapping, case-sensitive occurrences of `word` in `text`.
int count_occurrences(const std::string& text, const std::string& word);
// 8 characters of [A-Za-z0-9] from std::random_device.
std::string make_nonce();
std::string anti_cheat_prompt(const std::string& word, const std::string& nonce);

struct Attempt {
  std::string prompt, word, nonce, job_id;
  int minute_at_build = -1, minute_at_end = -1;
  uint64_t seed = 0;
  std::string text;
  int occurrences = 0;
  int token_events = 0;
  double total_ms = 0, first_token_ms = 0;
  std::string first_event, last_event;
  nlohmann::json end;                                   // terminal payload
  std::vector<std::string> failures;                    // empty: passed
  nlohmann::json transcript = nlohmann::json::array();  // one object per SSE event
  std::string started_at_utc;
};

// One check for a given minute word and seed, without the clock (the mutation test runs it
// for every minute word; run_anti_cheat() runs it with the clock's).
Attempt run_check(int port, int minute, uint64_t seed, const std::string& started_at_utc);

// Runs the anti-cheat check against a worker listening on `port`, with one retry only if
// the UTC minute changed during the run. Writes verification.json, sse_transcript.ndjson and
// report.md under <results>/<artifact_dir>/. Returns the attempts made (the last decides).
std::vector<Attempt> run_anti_cheat(int port, const std::string& model,
                                    const std::string& artifact_dir);

}  // namespace conformance::haiku
