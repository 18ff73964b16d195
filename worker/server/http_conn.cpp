#include "server/http_conn.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <thread>
#include <vector>

namespace worker::server {
namespace {
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kProbeEvery = 1s;    // re-probe a half-closed peer this often
constexpr auto kStopCheck = 100ms;  // waits wake this often to notice server stop
constexpr auto kLinger = 500ms;     // drain after an early reply so the client can read it
constexpr size_t kLingerBytes = 1 << 20;
constexpr size_t kRecvChunk = 16 * 1024;

thread_local Connection* tl_connection = nullptr;

bool endpoint(int fd, bool peer, std::string& host, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  auto* sa = reinterpret_cast<sockaddr*>(&ss);
  if ((peer ? getpeername(fd, sa, &len) : getsockname(fd, sa, &len)) != 0) return false;
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(sa, len, h, sizeof h, s, sizeof s, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(s);
  return true;
}

int poll_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, kStopCheck.count()));
}

const char* reason(int status) {
  switch (status) {
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

// Grows to max_threads while every thread is busy (each connection holds one for its
// lifetime); threads above min_threads exit after 30 s idle.
class GrowingPool final : public httplib::TaskQueue {
 public:
  GrowingPool(size_t min_threads, size_t max_threads) : min_(min_threads), max_(max_threads) {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < min_; ++i) spawn();
  }
  ~GrowingPool() override = default;

  void enqueue(std::function<void()> fn) override {
    std::lock_guard lock(mu_);
    reap();
    jobs_.push_back(std::move(fn));
    if (idle_ < jobs_.size() && threads_.size() < max_) spawn();
    cv_.notify_one();
  }

  void shutdown() override {
    std::map<size_t, std::thread> threads;
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      threads.swap(threads_);
    }
    cv_.notify_all();
    for (auto& [id, t] : threads) t.join();
  }

 private:
  void spawn() {
    const size_t id = next_id_++;
    threads_.emplace(id, std::thread([this, id] { run(id); }));
  }
  // Joins threads that left on idle timeout (they hold no lock once listed).
  void reap() {
    for (size_t id : finished_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      it->second.join();
      threads_.erase(it);
    }
    finished_.clear();
  }
  void run(size_t id) {
    std::unique_lock lock(mu_);
    for (;;) {
      ++idle_;
      const bool woke = cv_.wait_for(lock, 30s, [&] { return stop_ || !jobs_.empty(); });
      --idle_;
      if (!jobs_.empty()) {
        auto fn = std::move(jobs_.front());
        jobs_.pop_front();
        lock.unlock();
        fn();
        fn = nullptr;
        lock.lock();
        continue;
      }
      if (stop_) return;
      if (!woke && threads_.size() - finished_.size() > min_) {
        finished_.push_back(id);
        return;
      }
    }
  }

  const size_t min_, max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::map<size_t, std::thread> threads_;
  std::vector<size_t> finished_;
  size_t next_id_ = 0;
  size_t idle_ = 0;
  bool stop_ = false;
};

}  // namespace

// One buffered stream per connection: bytes read past a request (pipelining) stay here for
// the next one, and every read obeys the current request's deadline.
class ConnStream final : public httplib::Stream {
 public:
  enum class Head { Ready, Closed, Timeout, TooLarge, TooManyHeaders };

  ConnStream(int fd, const HttpLimits& lim, std::function<bool()> stopping)
      : fd_(fd), lim_(lim), stopping_(std::move(stopping)) {}

  int fd() const { return fd_; }
  bool failed() const { return failed_; }

  // Buffers the next request head: up to keep_alive for its first byte, then head_timeout
  // for all of it.
  Head read_head() {
    buf_.erase(0, pos_);
    pos_ = 0;
    size_t scan = 0, lines = 0;
    Clock::time_point head_deadline{};
    const auto first_deadline = Clock::now() + lim_.keep_alive;
    for (;;) {
      // RFC 9112 2.2: empty lines before a request line are ignored.
      while (buf_.rfind("\r\n", 0) == 0) buf_.erase(0, 2);
      if (!buf_.empty() && head_deadline == Clock::time_point{})
        head_deadline = Clock::now() + lim_.head_timeout;
      for (scan = std::min(scan, buf_.size()); scan + 1 < buf_.size(); ++scan) {
        if (buf_[scan] != '\r' || buf_[scan + 1] != '\n') continue;
        if (scan >= 2 && buf_.compare(scan - 2, 2, "\r\n") == 0) {
          if (scan + 2 > lim_.max_head_bytes) return Head::TooLarge;
          body_deadline_ = Clock::now() + lim_.body_timeout;
          return Head::Ready;
        }
        if (++lines > lim_.max_header_count + 1) return Head::TooManyHeaders;
      }
      if (buf_.size() > lim_.max_head_bytes) return Head::TooLarge;
      if (!fill(buf_.empty() ? first_deadline : head_deadline))
        return buf_.empty() ? Head::Closed : Head::Timeout;
    }
  }

  bool is_readable() const override {
    if (pos_ < buf_.size()) return true;
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }
  bool is_writable() const override {
    pollfd p{fd_, POLLOUT, 0};
    return poll(&p, 1, static_cast<int>(lim_.write_timeout.count())) > 0 &&
           (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
  }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == buf_.size() && !fill(body_deadline_)) return eof_ ? 0 : -1;
    const size_t n = std::min(size, buf_.size() - pos_);
    std::copy_n(buf_.data() + pos_, n, ptr);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    size_t sent = 0;
    while (sent < size) {
      pollfd p{fd_, POLLOUT, 0};
      if (poll(&p, 1, static_cast<int>(lim_.write_timeout.count())) <= 0) return fail();
      const ssize_t n = ::send(fd_, ptr + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n <= 0) return fail();
      sent += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    endpoint(fd_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    endpoint(fd_, false, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  ssize_t fail() {
    failed_ = true;
    return -1;
  }
  // Appends what arrives before `deadline`; false on timeout, EOF, error or server stop.
  bool fill(Clock::time_point deadline) {
    if (pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    }
    for (;;) {
      if (stopping_()) return false;
      pollfd p{fd_, POLLIN, 0};
      const int r = poll(&p, 1, poll_ms(deadline));
      if (r < 0 && errno != EINTR) return false;
      if (r <= 0) {
        if (Clock::now() >= deadline) return false;
        continue;
      }
      char tmp[kRecvChunk];
      const ssize_t n = ::recv(fd_, tmp, sizeof tmp, MSG_DONTWAIT);
      if (n > 0) {
        buf_.append(tmp, static_cast<size_t>(n));
        return true;
      }
      if (n == 0) {
        eof_ = true;
        return false;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    }
  }

  const int fd_;
  const HttpLimits& lim_;
  std::function<bool()> stopping_;
  std::string buf_;
  size_t pos_ = 0;
  bool eof_ = false;
  bool failed_ = false;
  Clock::time_point body_deadline_{};
};

Connection* current_connection() {
  return tl_connection;
}

Connection::Peer Connection::peer() const {
  pollfd p{strm_.fd(), POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return Peer::Open;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return Peer::Gone;
  return (p.revents & POLLRDHUP) ? Peer::HalfClosed : Peer::Open;
}

bool Connection::probe_due() const {
  return peer() == Peer::HalfClosed && Clock::now() - last_probe_ >= kProbeEvery;
}

void Connection::probed() {
  last_probe_ = Clock::now();
}

bool Connection::send_continue() {
  probed();
  static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
  return strm_.write(kContinue, sizeof kContinue - 1) > 0;
}

GuardedServer::GuardedServer(HttpLimits limits,
                             std::function<std::string(int, const std::string&)> error_json)
    : limits_(limits), error_json_(std::move(error_json)) {
  new_task_queue = [this] { return new GrowingPool(limits_.min_threads, limits_.max_threads); };
  set_keep_alive_timeout(
      std::chrono::duration_cast<std::chrono::seconds>(limits_.keep_alive).count());
}

void GuardedServer::widen_backlog() {
  ::listen(svr_sock_, SOMAXCONN);
}

size_t GuardedServer::open_connections() const {
  std::lock_guard lock(mu_);
  return slots_.size();
}

bool GuardedServer::admit(Slot& slot) {
  std::lock_guard lock(mu_);
  if (slots_.size() >= limits_.max_connections) {
    Slot* oldest = nullptr;
    for (Slot* s : slots_)
      if (s->idle && !s->evicted && (!oldest || s->idle_since < oldest->idle_since)) oldest = s;
    if (!oldest) return false;
    // Wakes its owner's poll(); the owner unregisters before it closes the descriptor.
    oldest->evicted = true;
    ::shutdown(oldest->fd, SHUT_RDWR);
  }
  slot.idle_since = Clock::now();
  slots_.insert(&slot);
  return true;
}

bool GuardedServer::set_idle(Slot& slot, bool idle) {
  std::lock_guard lock(mu_);
  slot.idle = idle;
  if (idle) slot.idle_since = Clock::now();
  return !slot.evicted;
}

void GuardedServer::release(Slot& slot) {
  std::lock_guard lock(mu_);
  slots_.erase(&slot);
}

void GuardedServer::reply_and_close(ConnStream& strm, int status, const std::string& message) {
  const std::string body = error_json_(status, message);
  const std::string head =
      "HTTP/1.1 " + std::to_string(status) + " " + reason(status) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n";
  strm.write((head + body).data(), head.size() + body.size());
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  const auto stopping = [this] { return svr_sock_ == INVALID_SOCKET; };
  ConnStream strm(sock, limits_, stopping);
  Connection conn(strm);
  Slot slot;
  slot.fd = sock;
  bool linger = false;
  if (!admit(slot)) {
    reply_and_close(strm, 503, "too many open connections");
    linger = true;
  } else {
    tl_connection = &conn;
    while (!stopping()) {
      const auto head = strm.read_head();
      if (!set_idle(slot, false) || head == ConnStream::Head::Closed ||
          head == ConnStream::Head::Timeout)
        break;
      if (head != ConnStream::Head::Ready) {
        reply_and_close(
            strm, 431,
            head == ConnStream::Head::TooLarge
                ? "request head exceeds " + std::to_string(limits_.max_head_bytes) + " bytes"
                : "more than " + std::to_string(limits_.max_header_count) + " header fields");
        linger = true;
        break;
      }
      conn.close_ = false;
      bool closed = false;
      const bool ok = process_request(strm, false, closed, nullptr);
      if (!ok || closed || strm.failed() || conn.close_) {
        linger = ok && conn.close_;
        break;
      }
      if (!set_idle(slot, true)) break;
    }
    tl_connection = nullptr;
    release(slot);
  }
  if (linger) {
    // Unread request bytes would turn close() into a RST that can destroy the reply
    // before the client reads it: stop sending, drain briefly, then close.
    ::shutdown(sock, SHUT_WR);
    const auto until = Clock::now() + kLinger;
    size_t drained = 0;
    char tmp[kRecvChunk];
    while (drained < kLingerBytes && Clock::now() < until) {
      pollfd p{sock, POLLIN, 0};
      const int r = poll(&p, 1, poll_ms(until));
      if (r < 0) break;
      if (r == 0) continue;
      const ssize_t n = ::recv(sock, tmp, sizeof tmp, MSG_DONTWAIT);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return true;
}

}  // namespace worker::server
