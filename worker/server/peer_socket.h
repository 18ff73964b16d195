#pragma once
// Disconnect detection for streams that are waiting (queued, or between slow tokens):
// cpp-httplib 0.11 does not expose the connection's socket, so we find it once per request
// by matching the request's address/port pair against this process's sockets, then poll it
// for a hang-up without reading. The socket stays open (owned by the HTTP thread that runs
// our handler) for as long as we use it.
#include <string>

namespace worker::server {

// The fd of the TCP connection local_port <- remote_addr:remote_port, or -1.
int find_connection_fd(const std::string& remote_addr, int remote_port, int local_port);
// True when the peer hung up or the socket errored (POLLRDHUP/POLLHUP/POLLERR); never blocks.
bool peer_closed(int fd);

}  // namespace worker::server
