#include "harness/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace conformance {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return {};
  const size_t b = s.find_last_not_of(" \t");
  return s.substr(a, b - a + 1);
}

}  // namespace

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::optional<std::string> HttpResponse::header(const std::string& name) const {
  auto it = headers.find(lower(name));
  if (it == headers.end()) return std::nullopt;
  return it->second;
}

nlohmann::json HttpResponse::json() const {
  try {
    return nlohmann::json::parse(body);
  } catch (const std::exception& e) {
    throw std::runtime_error("HTTP " + std::to_string(status) + " body is not JSON (" + e.what() +
                             "): " + body.substr(0, 500));
  }
}

HttpConnection::HttpConnection(const std::string& host, int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    throw std::runtime_error("bad IPv4 address " + host);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("connect to " + host + ":" + std::to_string(port) + ": " +
                             std::strerror(err));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

HttpConnection::~HttpConnection() {
  close();
}

void HttpConnection::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void HttpConnection::send_raw(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      // The server may answer (413) and close before reading everything: not our error.
      if (errno == EPIPE || errno == ECONNRESET) return;
      throw std::runtime_error(std::string("send: ") + std::strerror(errno));
    }
    sent += static_cast<size_t>(n);
  }
}

void HttpConnection::send_request(const std::string& method, const std::string& path,
                                  const std::string& body, const Headers& headers) {
  std::string req = method + " " + path + " HTTP/1.1\r\n";
  bool has_host = false, has_len = false, has_conn = false;
  for (const auto& [k, v] : headers) {
    const std::string lk = lower(k);
    has_host |= lk == "host";
    has_len |= lk == "content-length";
    has_conn |= lk == "connection";
    req += k + ": " + v + "\r\n";
  }
  if (!has_host) req += "Host: 127.0.0.1\r\n";
  if (!has_len && (!body.empty() || method == "POST"))
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  if (!has_conn) req += "Connection: close\r\n";
  req += "\r\n";
  req += body;
  resp_.sent_at = Clock::now();
  send_raw(req);
}

bool HttpConnection::fill(Clock::time_point deadline) {
  if (eof_) return false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw std::runtime_error("timed out waiting for the server");
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char tmp[65536];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) {
        eof_ = true;
        return false;
      }
      throw std::runtime_error(std::string("recv: ") + std::strerror(errno));
    }
    if (n == 0) {
      eof_ = true;
      return false;
    }
    last_arrival_ = Clock::now();
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
}

void HttpConnection::shutdown_write() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

void HttpConnection::read_head(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  size_t end;
  for (;;) {
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill(deadline))
        throw std::runtime_error("connection closed before the response head (got '" +
                                 buf_.substr(0, 200) + "')");
    }
    // Interim 1xx responses come before the final one (RFC 9110 15.2): skip them.
    if (buf_.rfind("HTTP/1.1 1", 0) != 0) break;
    ++interim_;
    buf_.erase(0, end + 4);
  }
  resp_.head_at = last_arrival_;
  const std::string head = buf_.substr(0, end);
  buf_.erase(0, end + 4);
  size_t pos = head.find("\r\n");
  const std::string status_line = head.substr(0, pos);
  if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12)
    throw std::runtime_error("bad status line: " + status_line);
  resp_.status = std::stoi(status_line.substr(9, 3));
  resp_.reason = status_line.size() > 13 ? status_line.substr(13) : "";
  while (pos != std::string::npos) {
    const size_t next = head.find("\r\n", pos + 2);
    const std::string line =
        head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
    pos = next;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) throw std::runtime_error("bad header line: " + line);
    resp_.headers[lower(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
  }
  auto te = resp_.header("transfer-encoding");
  chunked_ = te && lower(*te).find("chunked") != std::string::npos;
  if (!chunked_) {
    if (auto cl = resp_.header("content-length")) remaining_ = std::stoul(*cl);
  }
  if (resp_.status == 204 || resp_.status == 304) body_done_ = true;
}

std::optional<std::string> HttpConnection::read_body_piece(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  if (body_done_) return std::nullopt;
  if (!chunked_) {
    if (remaining_ && *remaining_ == 0) {
      body_done_ = true;
      return std::nullopt;
    }
    if (buf_.empty() && !fill(deadline)) {
      body_done_ = true;
      if (remaining_ && *remaining_ > 0)
        throw std::runtime_error("connection closed with " + std::to_string(*remaining_) +
                                 " body bytes missing");
      return std::nullopt;
    }
    size_t take = buf_.size();
    if (remaining_) take = std::min(take, *remaining_);
    std::string out = buf_.substr(0, take);
    buf_.erase(0, take);
    if (remaining_) *remaining_ -= take;
    return out;
  }
  for (;;) {
    if (chunk_left_ > 0) {
      if (buf_.empty() && !fill(deadline))
        throw std::runtime_error("connection closed inside a chunk");
      const size_t take = std::min(chunk_left_, buf_.size());
      std::string out = buf_.substr(0, take);
      buf_.erase(0, take);
      chunk_left_ -= take;
      if (chunk_left_ == 0) {
        // consume the CRLF after the chunk data (may arrive later)
        while (buf_.size() < 2)
          if (!fill(deadline)) throw std::runtime_error("connection closed after chunk data");
        if (buf_.compare(0, 2, "\r\n") != 0) throw std::runtime_error("chunk not followed by CRLF");
        buf_.erase(0, 2);
      }
      return out;
    }
    size_t eol;
    while ((eol = buf_.find("\r\n")) == std::string::npos)
      if (!fill(deadline)) throw std::runtime_error("connection closed before a chunk size line");
    const std::string size_line = buf_.substr(0, eol);
    buf_.erase(0, eol + 2);
    size_t sz = 0;
    try {
      sz = std::stoul(size_line, nullptr, 16);
    } catch (const std::exception&) {
      throw std::runtime_error("bad chunk size line: '" + size_line + "'");
    }
    if (sz == 0) {
      // trailers until the blank line
      for (;;) {
        while ((eol = buf_.find("\r\n")) == std::string::npos)
          if (!fill(deadline)) {
            body_done_ = true;
            return std::nullopt;
          }
        const bool blank = eol == 0;
        buf_.erase(0, eol + 2);
        if (blank) break;
      }
      body_done_ = true;
      return std::nullopt;
    }
    chunk_left_ = sz;
  }
}

namespace {
Headers with_content_type(const RequestOptions& opts) {
  Headers h = opts.headers;
  if (!opts.content_type.empty()) h.emplace_back("Content-Type", opts.content_type);
  return h;
}
}  // namespace

HttpResponse http_request(int port, const std::string& method, const std::string& path,
                          const std::string& body, const RequestOptions& opts) {
  HttpConnection c("127.0.0.1", port);
  c.send_request(method, path, body,
                 body.empty() && method == "GET" ? opts.headers : with_content_type(opts));
  c.read_head(opts.timeout);
  while (auto piece = c.read_body_piece(opts.timeout)) c.response().body += *piece;
  c.response().done_at = Clock::now();
  return c.response();
}

HttpResponse http_get(int port, const std::string& path, const RequestOptions& opts) {
  return http_request(port, "GET", path, {}, opts);
}

HttpResponse http_post_json(int port, const std::string& path, const nlohmann::json& body,
                            const RequestOptions& opts) {
  return http_request(port, "POST", path, body.dump(), opts);
}

SseStream::SseStream(int port, const std::string& path, const nlohmann::json& body,
                     const RequestOptions& opts)
    : conn_("127.0.0.1", port) {
  open(port, path, body.dump(), opts);
}

SseStream::SseStream(int port, const std::string& path, const std::string& raw_body,
                     const RequestOptions& opts)
    : conn_("127.0.0.1", port) {
  open(port, path, raw_body, opts);
}

void SseStream::open(int, const std::string& path, const std::string& body,
                     const RequestOptions& opts) {
  Headers h = with_content_type(opts);
  h.emplace_back("Accept", "text/event-stream");
  conn_.send_request("POST", path, body, h);
  sent_at_ = conn_.response().sent_at;
  conn_.read_head(opts.timeout);
}

std::optional<SseEvent> SseStream::next_event(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (pending_.empty()) {
    if (ended_) return std::nullopt;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw std::runtime_error("timed out waiting for an SSE event");
    auto piece = conn_.read_body_piece(left);
    if (!piece) {
      ended_ = true;
      end_at_ = Clock::now();
      parser_.finish();
    } else {
      parser_.feed(*piece, conn_.last_arrival());
    }
    for (auto& e : parser_.take_new_events()) pending_.push_back(std::move(e));
  }
  SseEvent e = std::move(pending_.front());
  pending_.erase(pending_.begin());
  return e;
}

const std::vector<SseEvent>& SseStream::read_all(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!ended_) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw std::runtime_error("timed out reading the SSE stream");
    next_event(left);
  }
  pending_.clear();
  return parser_.events();
}

std::string SseStream::read_body(std::chrono::milliseconds timeout) {
  std::string body;
  while (auto piece = conn_.read_body_piece(timeout)) body += *piece;
  ended_ = true;
  return body;
}

int find_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw std::runtime_error("bind(0) failed");
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace conformance
