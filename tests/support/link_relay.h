#pragma once
// One host's link of a TestCluster shaped in user space, for kernels without
// tc netem (test_cluster.h uses it; tests use TestCluster::shape()).
//
// The host's switch-side veth s<i> leaves the bridge, a new veth pair takes
// its place (b<i> on the bridge, r<i> beside it), and link_relay.py, run in
// the switch namespace, copies frames between s<i> and r<i>, holding and
// dropping them as the spec says:
//
//   host i: eth0 ==veth== s<i> <-relay-> r<i> ==veth== b<i> -- br0
//
// Not thread-safe; one object per shaped host, owned by its TestCluster.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace tandem::testing {

#ifndef TANDEM_SOURCE_DIR
#error "TANDEM_SOURCE_DIR must point at the source tree (for tests/support/link_relay.py)"
#endif
#ifndef TANDEM_PEER_PYTHON
#define TANDEM_PEER_PYTHON ""
#endif

// Reads `fd` until what it read contains `marker` or `timeout` passes, then
// closes it; what it read is in `log`. True when the marker came. For a
// child's "I am ready" line (the link relay's, sshd's), without sleeping.
inline bool read_until(int fd, const std::string& marker, std::chrono::milliseconds timeout,
                       std::string& log) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (log.find(marker) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd readable{fd, POLLIN, 0};
    char buffer[512];
    ssize_t got = 0;
    if (left.count() <= 0 || ::poll(&readable, 1, static_cast<int>(left.count())) != 1 ||
        (got = ::read(fd, buffer, sizeof buffer)) <= 0) {
      ::close(fd);
      return false;
    }
    log.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(fd);
  return true;
}

class LinkRelay {
 public:
  // Shapes host `host`'s link in switch namespace `sw` with `spec` ("delay
  // 50ms loss 1% rate 10mbit"); ok() once the relay runs with its sockets
  // bound, else why() says what went wrong and the link is left plain.
  LinkRelay(std::string sw, int host, const std::string& spec)
      : sw_(std::move(sw)),
        port_("s" + std::to_string(host)),
        relay_end_("r" + std::to_string(host)),
        bridge_end_("b" + std::to_string(host)) {
    const std::string ip = "ip -n " + sw_ + " link ";
    // Promiscuous: the relay must see frames for every address behind it.
    if (!run(ip + "add " + relay_end_ + " type veth peer name " + bridge_end_) ||
        !run(ip + "set " + port_ + " nomaster promisc on") ||
        !run(ip + "set " + relay_end_ + " promisc on up") ||
        !run(ip + "set " + bridge_end_ + " master br0 up")) {
      why_ = "cannot put a relay on " + port_ + " in " + sw_;
      restore();
      return;
    }
    why_ = start({port_, relay_end_, spec});
    if (!why_.empty()) restore();
  }

  // Kills the relay and puts the plain link back on the bridge.
  ~LinkRelay() { restore(); }

  LinkRelay(const LinkRelay&) = delete;
  LinkRelay& operator=(const LinkRelay&) = delete;

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }

  // "" when a relay can run in namespace `sw` (Python and AF_PACKET
  // sockets), else why not.
  static std::string why_not(const std::string& sw) {
    LinkRelay probe(sw);
    return probe.start({"--check"});
  }

 private:
  explicit LinkRelay(std::string sw) : sw_(std::move(sw)) {}

  static bool run(const std::string& command) {
    return std::system(("{ " + command + "; } >/dev/null 2>&1").c_str()) == 0;
  }

  static std::string python() {
    const std::string peer = TANDEM_PEER_PYTHON;
    return peer.empty() ? "python3" : peer;
  }

  // Starts link_relay.py with `args` in the switch namespace; "" once it
  // prints "ready", else what it printed (it exits 2 for a spec it cannot
  // follow). Its stdout and stderr are a pipe read here.
  std::string start(const std::vector<std::string>& args) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return "cannot make a pipe for the link relay";
    const std::string python = LinkRelay::python();
    const std::string script = std::string(TANDEM_SOURCE_DIR) + "/tests/support/link_relay.py";
    std::vector<const char*> argv = {"ip", "netns", "exec", sw_.c_str(), python.c_str(), "-u",
                                     script.c_str()};
    for (const auto& arg : args) argv.push_back(arg.c_str());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(out[1], 2);
      ::execvp("ip", const_cast<char* const*>(argv.data()));
      ::_exit(127);
    }
    ::close(out[1]);
    if (pid_ < 0) {
      ::close(out[0]);
      return "cannot fork the link relay";
    }
    std::string log;
    // The relay prints nothing after "ready".
    if (!read_until(out[0], "ready\n", std::chrono::seconds(10), log)) {
      stop();
      while (!log.empty() && log.back() == '\n') log.pop_back();
      return "the link relay (" + script + ") did not start: " +
             (log.empty() ? "it printed nothing in 10 s" : log);
    }
    return "";
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  void restore() {
    stop();
    if (port_.empty()) return;  // the --check probe shapes nothing
    run("ip -n " + sw_ + " link del " + relay_end_);  // and its peer b<i>
    run("ip -n " + sw_ + " link set " + port_ + " promisc off master br0");
  }

  std::string sw_;
  std::string port_;        // s<i>: the host's link, off the bridge while shaped
  std::string relay_end_;   // r<i>: the relay's end of the new pair
  std::string bridge_end_;  // b<i>: the new pair's end on the bridge
  std::string why_;
  pid_t pid_ = -1;
};

}  // namespace tandem::testing
