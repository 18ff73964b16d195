#pragma once
// Connection handling under cpp-httplib's request parser (issue 15): Debian's 0.11 gives
// each request a fresh socket stream (pipelined bytes are lost), a fixed thread pool, only a
// per-read timeout and no header-count limit. GuardedServer keeps httplib's parsing and
// routing but owns the connection loop: one buffered stream per connection, a deadline for
// the whole request head and body, head size/count caps, a connection cap that closes the
// oldest idle connection first, and a thread pool that grows on demand.
#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_set>

namespace worker::server {

struct HttpLimits {
  std::chrono::milliseconds keep_alive{5000};     // wait for the next request's first byte
  std::chrono::milliseconds head_timeout{10000};  // the whole request head
  std::chrono::milliseconds body_timeout{30000};  // the whole body, after the head
  std::chrono::milliseconds write_timeout{5000};  // each write to a stalled reader
  size_t max_head_bytes = 16 * 1024;
  size_t max_header_count = 100;
  // Open connections; above it the oldest idle one is closed, or the new one refused when
  // none is idle. Kept under FD_SETSIZE: the library refuses sockets >= 1024 (select()).
  size_t max_connections = 768;
  size_t min_threads = 32;
  size_t max_threads = 1024;
};

class ConnStream;

// The connection a handler runs on; valid on that HTTP thread for the handler's duration.
class Connection {
 public:
  enum class Peer { Open, HalfClosed, Gone };
  // Gone: the peer reset or vanished. A FIN alone (HalfClosed) means either close() or
  // shutdown(SHUT_WR): callers then send a harmless probe (probe_due()); a closed peer
  // answers it with RST and the next peer() says Gone, a half-closed one keeps reading.
  Peer peer() const;
  bool probe_due() const;  // half-closed and not probed for a second
  void probed();
  // The probe before any response byte: an interim "100 Continue" (HTTP/1.1 clients must
  // accept unsolicited 1xx responses). False when the write failed.
  bool send_continue();
  // The response ends the connection (body not read, or limits hit).
  void close_after_response() { close_ = true; }
  bool closing() const { return close_; }

 private:
  friend class GuardedServer;
  explicit Connection(ConnStream& s) : strm_(s) {}
  ConnStream& strm_;
  bool close_ = false;
  std::chrono::steady_clock::time_point last_probe_{};
};

// The connection of the calling HTTP thread, or nullptr elsewhere.
Connection* current_connection();

class GuardedServer : public httplib::Server {
 public:
  // `error_json(status, message)`: the body for responses written before routing (431, 503).
  GuardedServer(HttpLimits limits, std::function<std::string(int, const std::string&)> error_json);
  const HttpLimits& limits() const { return limits_; }
  size_t open_connections() const;
  // After bind: httplib listens with a backlog of 5, so a burst of connects would wait for
  // SYN retransmits (1 s and more); raise it to the system maximum.
  void widen_backlog();

 private:
  struct Slot {
    int fd = -1;
    bool idle = true;
    bool evicted = false;
    std::chrono::steady_clock::time_point idle_since;
  };
  bool process_and_close_socket(socket_t sock) override;
  bool admit(Slot& slot);                // registers; false when over the cap with nothing to evict
  bool set_idle(Slot& slot, bool idle);  // false once evicted
  void release(Slot& slot);
  void reply_and_close(ConnStream& strm, int status, const std::string& message);

  HttpLimits limits_;
  std::function<std::string(int, const std::string&)> error_json_;
  mutable std::mutex mu_;
  std::unordered_set<Slot*> slots_;
};

}  // namespace worker::server
