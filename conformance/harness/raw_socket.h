#pragma once
// Raw client sockets and worker process probes for the hostile-client and soak suites
// (issue 15): connections that misbehave on purpose, and the worker's RSS / fd count.
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace conformance {

// Raises RLIMIT_NOFILE to its hard limit; returns the new soft limit.
long raise_fd_limit();
// TCP connection to 127.0.0.1:port; blocking unless `nonblocking` (then the connect may
// still be in progress). -1 on failure.
int connect_loopback(int port, bool nonblocking = false);
// Sends everything (MSG_NOSIGNAL); false on error.
bool send_all(int fd, const std::string& bytes);
// Reads until EOF, error or timeout; appends to `out`. True when EOF (or reset) was seen.
bool read_until_closed(int fd, std::string& out, std::chrono::milliseconds timeout);
// True when the peer closed (EOF or reset) within `timeout`; unread data is discarded.
bool peer_closes_within(int fd, std::chrono::milliseconds timeout);
// VmRSS of `pid` in bytes (0 when unreadable).
size_t process_rss(pid_t pid);
// Open descriptors of `pid`.
size_t process_fds(pid_t pid);
// p-th percentile (0..100) of `v` (sorted copy); 0 for an empty vector.
double percentile(std::vector<double> v, double p);

}  // namespace conformance
