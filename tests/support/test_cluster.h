#pragma once
// A cluster of N hosts on one machine, for multi-node tests: each host is a
// network namespace with one link (a veth pair) to a bridge in a "switch"
// namespace, so hosts reach each other at 10.231.0.1 .. 10.231.0.N and
// nothing else. The root namespace gets no interface, route or address, and
// no address outside the cluster is ever contacted.
//
//   TestCluster cluster(3);
//   if (!cluster.ok()) GTEST_SKIP() << cluster.why();   // no root or no iproute2
//   BackgroundProcess p(cluster.on(1, {bin("tandem"), "launch", ...}));
//   cluster.shape(2, "delay 50ms loss 1%");             // both directions: tc netem, or
//                                                       // a relay where the kernel has
//                                                       // no netem (why_no_shaping())
//   cluster.set_link(2, false);                         // host 2 unreachable
//   cluster.kill_host(0);                               // SIGKILL all it runs
//   cluster.start_ssh();                                // sshd on every host
//   run_process(cluster.on(0, cluster.ssh(1, {"hostname"})), 30);
//
// The destructor kills every process left in the cluster (link relays in the
// switch namespace too) and removes its namespaces. Namespaces are named
// after the owning process ("tnd<pid>c<k>h<i>", "tnd<pid>c<k>sw");
// constructing a cluster first removes those of processes that no longer
// exist, so even a test that crashed leaves nothing behind past the next run.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/link_relay.h"

namespace tandem::testing {

class TestCluster {
 public:
  explicit TestCluster(int hosts)
      : prefix_("tnd" + std::to_string(::getpid()) + "c" + std::to_string(next_id())) {
    if (!shell("command -v ip")) {
      why_ = "the ip tool (iproute2) is not installed; scripts/setup.sh installs it";
      return;
    }
    remove_stale();
    const std::string sw = switch_name();
    if (!shell("ip netns add " + sw)) {
      why_ = "cannot create network namespaces (needs root or CAP_SYS_ADMIN)";
      return;
    }
    namespaces_.push_back(sw);
    bool ok = shell("ip -n " + sw + " link add br0 type bridge") &&
              shell("ip -n " + sw + " link set br0 up") && shell("ip -n " + sw + " link set lo up");
    for (int i = 0; ok && i < hosts; ++i) {
      const std::string host = prefix_ + "h" + std::to_string(i);
      ok = shell("ip netns add " + host);
      if (!ok) break;
      namespaces_.push_back(host);
      hosts_.push_back(host);
      addresses_.push_back("10.231.0." + std::to_string(i + 1));
      const std::string port = "s" + std::to_string(i);
      ok = shell("ip -n " + sw + " link add " + port + " type veth peer name eth0 netns " + host) &&
           shell("ip -n " + sw + " link set " + port + " master br0 up") &&
           shell("ip -n " + host + " addr add " + addresses_.back() + "/24 dev eth0") &&
           shell("ip -n " + host + " link set eth0 up") &&
           shell("ip -n " + host + " link set lo up");
    }
    if (!ok) {
      why_ = "cannot build the bridge and veth links between namespaces";
      return;
    }
    ok_ = true;
  }

  ~TestCluster() {
    relays_.clear();
    for (std::size_t i = 0; i < hosts_.size(); ++i) kill_host(static_cast<int>(i), SIGKILL);
    if (!namespaces_.empty()) kill_namespace(switch_name(), SIGKILL, 10000);
    for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) {
      shell("ip netns del " + *it);
      if (names_given_) shell("rm -rf /etc/netns/" + *it);
    }
    if (!ssh_dir_.empty()) shell("rm -rf " + ssh_dir_);
  }

  TestCluster(const TestCluster&) = delete;
  TestCluster& operator=(const TestCluster&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  int size() const { return static_cast<int>(hosts_.size()); }
  const std::string& address(int host) const { return addresses_.at(host); }
  const std::string& name(int host) const { return hosts_.at(host); }

  // argv run on `host` (through `ip netns exec`).
  std::vector<std::string> on(int host, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"ip", "netns", "exec", hosts_.at(host)});
    return argv;
  }

  // "" when shape() can work, else why not: it needs the kernel's netem
  // qdisc (sch_netem; some VM kernels are built without it) or, failing
  // that, a Python that may open AF_PACKET sockets for the link relay.
  std::string why_no_shaping() const {
    if (has_netem()) return "";
    const std::string relay = LinkRelay::why_not(switch_name());
    if (relay.empty()) return "";
    return "this kernel has no tc netem qdisc (`tc qdisc add ... netem` says \"Specified qdisc "
           "kind is unknown\"; it needs CONFIG_NET_SCH_NETEM), and " + relay;
  }

  // Shapes `host`'s link in both directions with netem's words: "delay
  // 50ms", "loss 1%", "rate 10mbit", or several; "" restores the plain
  // link. Uses tc netem where the kernel has it, else a LinkRelay (a
  // process in the switch namespace, gone with the shaping or the
  // cluster). Returns "" once the link is shaped, else why not; any other
  // word (jitter, duplicate, ...) is refused, whichever shapes the link.
  std::string shape(int host, const std::string& spec) {
    std::istringstream words(spec);
    std::string key, value;
    while (words >> key) {
      if (key != "delay" && key != "loss" && key != "rate") {
        return "cannot shape a link with \"" + key + "\" (in \"" + spec +
               "\"): shape() takes delay, loss and rate only";
      }
      words >> value;
    }
    relays_.erase(host);
    const std::string link = "dev s" + std::to_string(host) + " root";
    if (!has_netem()) {
      if (spec.empty()) return "";
      auto relay = std::make_unique<LinkRelay>(switch_name(), host, spec);
      if (!relay->ok()) return relay->why();
      relays_[host] = std::move(relay);
      return "";
    }
    const std::string tc = " tc qdisc ";
    if (spec.empty()) {  // absent qdiscs make these fail: the link is plain either way
      shell("ip netns exec " + hosts_.at(host) + tc + "del dev eth0 root");
      shell("ip netns exec " + switch_name() + tc + "del " + link);
      return "";
    }
    if (!shell("ip netns exec " + hosts_.at(host) + tc + "replace dev eth0 root netem " + spec) ||
        !shell("ip netns exec " + switch_name() + tc + "replace " + link + " netem " + spec)) {
      return "tc netem refused \"" + spec + "\"";
    }
    return "";
  }

  // Starts an ssh server on every host, on port 22 of its own address, with
  // a host key and one authorized client key made for this cluster (and
  // removed with it). "" when they all listen, else why not (no sshd: the
  // Debian package openssh-server, which scripts/setup.sh installs).
  std::string start_ssh() {
    if (!shell("test -x /usr/sbin/sshd && command -v ssh-keygen && command -v ssh")) {
      return "no ssh server: install openssh-server and openssh-client (scripts/setup.sh does)";
    }
    ssh_dir_ = "/tmp/" + prefix_ + "ssh";
    const std::string d = ssh_dir_;
    if (!shell("rm -rf " + d + " && mkdir -p " + d + " /run/sshd && chmod 700 " + d) ||
        !shell("ssh-keygen -q -t ed25519 -N '' -f " + d + "/host_key") ||
        !shell("ssh-keygen -q -t ed25519 -N '' -f " + d + "/client_key") ||
        !shell("cp " + d + "/client_key.pub " + d + "/authorized_keys")) {
      return "cannot make ssh keys in " + d;
    }
    for (int i = 0; i < size(); ++i) {
      const std::string config = d + "/sshd_" + std::to_string(i) + ".conf";
      std::FILE* f = std::fopen(config.c_str(), "w");
      if (f == nullptr) return "cannot write " + config;
      std::fprintf(f,
                   "ListenAddress %s\nPort 22\nHostKey %s/host_key\n"
                   "AuthorizedKeysFile %s/authorized_keys\nPermitRootLogin prohibit-password\n"
                   "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                   "StrictModes no\nPidFile none\nAcceptEnv TANDEM_*\n",
                   addresses_[i].c_str(), d.c_str(), d.c_str());
      std::fclose(f);
      const std::string why = start_sshd(i, config);
      if (!why.empty()) return why;
    }
    return "";
  }

  // argv that runs `command` on `host` over ssh with the cluster's client
  // key (run it from a host: on(from, ssh(to, ...))). start_ssh() first.
  std::vector<std::string> ssh(int host, const std::vector<std::string>& command) const {
    std::vector<std::string> argv = {
        "ssh", "-i", ssh_dir_ + "/client_key", "-o", "BatchMode=yes", "-o",
        "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
        "-o", "ConnectTimeout=5", "root@" + addresses_.at(host)};
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
  }

  // Starts `host`'s ssh server again after kill_host() (a machine that comes
  // back). "" when it listens, else why not. start_ssh() first.
  std::string restart_ssh(int host) {
    return start_sshd(host, ssh_dir_ + "/sshd_" + std::to_string(host) + ".conf");
  }

  // The folder of the cluster's ssh keys ("" before start_ssh()).
  const std::string& ssh_dir() const { return ssh_dir_; }

  // Host names that resolve on every host: names[i] is host i's address.
  // Writes /etc/netns/<host>/hosts, which `ip netns exec` mounts over
  // /etc/hosts for every process it starts from then on (removed with the
  // cluster). False when it cannot be written.
  bool set_host_names(const std::vector<std::string>& names) {
    std::string text = "127.0.0.1 localhost\n";
    for (std::size_t i = 0; i < names.size() && i < addresses_.size(); ++i) {
      text += addresses_[i] + " " + names[i] + "\n";
    }
    names_given_ = true;
    for (const std::string& host : hosts_) {
      const std::string dir = "/etc/netns/" + host;
      if (!shell("mkdir -p " + dir)) return false;
      std::FILE* f = std::fopen((dir + "/hosts").c_str(), "w");
      if (f == nullptr) return false;
      std::fputs(text.c_str(), f);
      std::fclose(f);
    }
    return true;
  }

  // The prefix of every name this cluster owns ("tnd<pid>c<k>"): its
  // namespaces, and folders a fixture keeps under /tmp/<prefix>..., which
  // a later cluster removes once this process is gone.
  const std::string& prefix() const { return prefix_; }

  // Takes `host`'s link down (it neither sends nor receives) or up again.
  bool set_link(int host, bool up) {
    return shell("ip -n " + switch_name() + " link set s" + std::to_string(host) +
                 (up ? " up" : " down"));
  }

  // Every process running in `host`'s namespace.
  std::vector<pid_t> pids(int host) const { return namespace_pids(hosts_.at(host)); }

  // Every process in the switch namespace: the relays of links shaped in
  // user space (shape()), none otherwise.
  std::vector<pid_t> switch_pids() const { return namespace_pids(switch_name()); }

  // Sends `signal` to every process on `host` (a machine that dies at once)
  // and, for SIGKILL, waits up to `timeout_ms` for each to be gone (a pidfd
  // per process, polled for its exit). True when none is left.
  bool kill_host(int host, int signal = SIGKILL, int timeout_ms = 10000) {
    const bool gone = kill_namespace(hosts_.at(host), signal, timeout_ms);
    reap_sshd(host);
    return gone;
  }

 private:
  static bool shell(const std::string& command) {
    return std::system(("{ " + command + "; } >/dev/null 2>&1").c_str()) == 0;
  }

  // Every process running in namespace `name`.
  static std::vector<pid_t> namespace_pids(const std::string& name) {
    std::vector<pid_t> out;
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(
        ::popen(("ip netns pids " + name + " 2>/dev/null").c_str(), "r"), ::pclose);
    if (!pipe) return out;
    long pid = 0;
    while (std::fscanf(pipe.get(), "%ld", &pid) == 1) out.push_back(static_cast<pid_t>(pid));
    return out;
  }

  // kill_host() for any of the cluster's namespaces.
  static bool kill_namespace(const std::string& name, int signal, int timeout_ms) {
    std::vector<int> exits;
    for (pid_t pid : namespace_pids(name)) {
      const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      if (fd >= 0) exits.push_back(fd);
      ::kill(pid, signal);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    bool gone = true;
    for (int fd : exits) {
      pollfd exited{fd, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (signal == SIGKILL && ::poll(&exited, 1, std::max<int>(0, left.count())) != 1) {
        gone = false;
      }
      ::close(fd);
    }
    return gone;
  }

  // Whether the kernel has tc netem; asked once.
  bool has_netem() const {
    if (has_netem_ < 0) {
      const std::string lo = "ip netns exec " + switch_name() + " tc qdisc ";
      has_netem_ = shell(lo + "add dev lo root netem delay 1ms");
      if (has_netem_) shell(lo + "del dev lo root");
    }
    return has_netem_ == 1;
  }

  std::string switch_name() const { return prefix_ + "sw"; }

  // sshd in the foreground (a child of this process, reaped by kill_host):
  // it logs "Server listening on" to the pipe on stderr once it listens.
  std::string start_sshd(int host, const std::string& config) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return "cannot make a pipe for sshd";
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(out[1], 2);
      const char* argv[] = {"ip", "netns", "exec", hosts_[host].c_str(), "/usr/sbin/sshd", "-D",
                            "-e", "-f", config.c_str(), nullptr};
      ::execvp("ip", const_cast<char* const*>(argv));
      ::_exit(127);
    }
    ::close(out[1]);
    if (pid < 0) {
      ::close(out[0]);
      return "cannot fork sshd";
    }
    sshd_.emplace_back(host, pid);
    std::string log;
    // sshd ignores SIGPIPE: its later log lines are dropped.
    if (!read_until(out[0], "Server listening on", std::chrono::seconds(10), log)) {
      return "sshd on host " + std::to_string(host) + " did not start listening: " + log;
    }
    return "";
  }

  void reap_sshd(int host) {
    for (auto it = sshd_.begin(); it != sshd_.end();) {
      if (it->first != host) {
        ++it;
        continue;
      }
      ::kill(it->second, SIGKILL);
      ::waitpid(it->second, nullptr, 0);
      it = sshd_.erase(it);
    }
  }

  static int next_id() {
    static int id = 0;
    return id++;
  }

  // Namespaces "tnd<pid>..." of processes that are gone (a test that
  // crashed before its destructor ran), with whatever still runs in them.
  static void remove_stale() {
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen("ip netns list 2>/dev/null", "r"),
                                               ::pclose);
    if (!pipe) return;
    std::vector<std::string> stale;
    char line[256];
    while (std::fgets(line, sizeof line, pipe.get())) {
      std::istringstream words(line);
      std::string name;
      words >> name;
      if (name.rfind("tnd", 0) != 0) continue;
      const std::size_t end = name.find_first_not_of("0123456789", 3);
      if (end == 3 || end == std::string::npos) continue;
      const pid_t owner = static_cast<pid_t>(std::stol(name.substr(3, end - 3)));
      if (::kill(owner, 0) != 0) stale.push_back(name);
    }
    for (const auto& name : stale) {
      shell("ip netns pids " + name + " | xargs -r kill -9");
      shell("ip netns del " + name);
      shell("rm -rf /etc/netns/" + name);
      const std::size_t cluster_end = name.find_first_of("hs", 3);  // tnd<pid>c<k>
      if (cluster_end != std::string::npos) {
        shell("rm -rf /tmp/" + name.substr(0, cluster_end) + "ssh /tmp/" +
              name.substr(0, cluster_end) + "slurm");
      }
    }
  }

  std::string prefix_;
  std::string why_;
  bool ok_ = false;
  std::vector<std::string> namespaces_;  // the switch first, then the hosts
  std::vector<std::string> hosts_;
  std::vector<std::string> addresses_;
  std::string ssh_dir_;
  bool names_given_ = false;  // set_host_names() wrote /etc/netns/<host>/hosts
  std::vector<std::pair<int, pid_t>> sshd_;  // (host, pid) of each ssh server
  std::map<int, std::unique_ptr<LinkRelay>> relays_;  // by host: links shaped in user space
  mutable int has_netem_ = -1;                        // -1 until asked
};

}  // namespace tandem::testing
