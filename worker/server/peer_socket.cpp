#include "server/peer_socket.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>

namespace worker::server {
namespace {

bool endpoint(int fd, bool peer, std::string& host, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  auto* sa = reinterpret_cast<sockaddr*>(&ss);
  if ((peer ? getpeername(fd, sa, &len) : getsockname(fd, sa, &len)) != 0) return false;
  if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return false;
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(sa, len, h, sizeof h, s, sizeof s, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(s);
  return true;
}

}  // namespace

// fstat/getpeername on descriptors other threads are using (the listening socket in
// accept(), other connections) is safe at the kernel level; a descriptor closed and reused
// during the scan can only match if it is this very connection.
int find_connection_fd(const std::string& remote_addr, int remote_port, int local_port) {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir("/proc/self/fd"), closedir);
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir.get())) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir.get())) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    std::string host;
    int port = -1, lport = -1;
    std::string lhost;
    if (!endpoint(static_cast<int>(fd), true, host, port) || port != remote_port) continue;
    if (!endpoint(static_cast<int>(fd), false, lhost, lport) || lport != local_port) continue;
    if (host != remote_addr) continue;
    if (found != -1) return -1;  // ambiguous: never guess
    found = static_cast<int>(fd);
  }
  return found;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace worker::server
