#pragma once
// A small HTTP/1.1 client on raw sockets, so tests see exactly what the worker sends:
// status line, headers, chunk boundaries and the arrival time of every byte. One request
// per connection (`Connection: close`).
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/sse_parser.h"

namespace conformance {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpResponse {
  int status = 0;
  std::string reason;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  Clock::time_point sent_at, head_at, done_at;

  std::optional<std::string> header(const std::string& name) const;
  // Parses the body as JSON; throws with the body in the message when it is not JSON.
  nlohmann::json json() const;
};

// One TCP connection carrying one request. Throws std::runtime_error on socket errors
// and on malformed HTTP.
class HttpConnection {
 public:
  HttpConnection(const std::string& host, int port);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // Sends the request line, headers (Host, Content-Length and Connection: close are added
  // unless given) and body.
  void send_request(const std::string& method, const std::string& path, const std::string& body,
                    const Headers& headers);
  // Sends raw bytes (for malformed-request tests).
  void send_raw(const std::string& bytes);
  // Reads up to the end of the response headers.
  void read_head(std::chrono::milliseconds timeout);
  // Next piece of decoded body (chunked or not) with its arrival time; nullopt at the end
  // of the body. Throws on timeout.
  std::optional<std::string> read_body_piece(std::chrono::milliseconds timeout);
  // Closes the socket now (client disconnect tests).
  void close();
  // shutdown(SHUT_WR): the request is complete, the response is still read (half-close).
  void shutdown_write();

  const HttpResponse& response() const { return resp_; }
  HttpResponse& response() { return resp_; }
  int interim_responses() const { return interim_; }
  Clock::time_point last_arrival() const { return last_arrival_; }

 private:
  // Reads more bytes into buf_; false at EOF.
  bool fill(Clock::time_point deadline);

  int fd_ = -1;
  int interim_ = 0;  // 1xx responses skipped
  std::string buf_;
  HttpResponse resp_;
  bool chunked_ = false;
  std::optional<size_t> remaining_;  // Content-Length left (not chunked)
  size_t chunk_left_ = 0;            // bytes left in the current chunk
  bool body_done_ = false;
  bool eof_ = false;
  Clock::time_point last_arrival_;
};

struct RequestOptions {
  Headers headers;
  std::string content_type = "application/json";  // empty: no Content-Type header
  std::chrono::milliseconds timeout{60000};
};

// Plain request: whole response read.
HttpResponse http_request(int port, const std::string& method, const std::string& path,
                          const std::string& body = {}, const RequestOptions& opts = {});
HttpResponse http_get(int port, const std::string& path, const RequestOptions& opts = {});
HttpResponse http_post_json(int port, const std::string& path, const nlohmann::json& body,
                            const RequestOptions& opts = {});

// An SSE response read incrementally. The request is sent by the constructor and the
// response head is read (status/headers available).
class SseStream {
 public:
  SseStream(int port, const std::string& path, const nlohmann::json& body,
            const RequestOptions& opts = {});
  SseStream(int port, const std::string& path, const std::string& raw_body,
            const RequestOptions& opts);

  int status() const { return conn_.response().status; }
  const HttpResponse& response() const { return conn_.response(); }
  Clock::time_point sent_at() const { return sent_at_; }

  // Waits for the next event; nullopt when the stream ended first.
  std::optional<SseEvent> next_event(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Reads to the end of the stream; returns all events (including those already taken).
  const std::vector<SseEvent>& read_all(
      std::chrono::milliseconds timeout = std::chrono::seconds(120));
  // Non-SSE body (error responses): the whole body.
  std::string read_body(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  void close() { conn_.close(); }
  void half_close() { conn_.shutdown_write(); }
  bool ended() const { return ended_; }

  const SseParser& parser() const { return parser_; }
  Clock::time_point end_at() const { return end_at_; }

 private:
  void open(int port, const std::string& path, const std::string& body, const RequestOptions& o);
  HttpConnection conn_;
  SseParser parser_;
  std::vector<SseEvent> pending_;
  Clock::time_point sent_at_, end_at_;
  bool ended_ = false;
};

// Binds port 0 on 127.0.0.1 and returns the port the kernel picked (then closes it).
int find_free_port();

double ms_between(Clock::time_point a, Clock::time_point b);

}  // namespace conformance
