#pragma once
// Listening TCP sockets as the kernel lists them in /proc/net/tcp{,6}: for
// tests that check what a job listens on.

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tandem::testing {

struct TcpListener {
  std::string local;  // "0100007F:1F90": address and port in hex, as /proc shows them
  std::string inode;  // the socket's inode, as in /proc/<pid>/fd links "socket:[inode]"
  int port() const { return std::stoi(local.substr(local.find(':') + 1), nullptr, 16); }
};

inline std::vector<TcpListener> tcp_listeners() {
  std::vector<TcpListener> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state == "0A") found.push_back({local, inode});
    }
  }
  return found;
}

// True for 127.x.x.x, ::1 and ::ffff:127.x.x.x in /proc's hex notation.
inline bool is_loopback_listener(const TcpListener& listener) {
  const std::string host = listener.local.substr(0, listener.local.find(':'));
  if (host.size() == 8) return host.substr(6) == "7F";  // little-endian IPv4
  return host == "00000000000000000000000001000000" ||
         (host.substr(0, 24) == "0000000000000000FFFF0000" && host.substr(30) == "7F");
}

}  // namespace tandem::testing
