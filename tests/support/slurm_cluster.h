#pragma once
// A real Slurm cluster on one machine, for tests: a TestCluster whose hosts
// are nodes n0..n{N-1} (names that resolve on every host, and each host's
// own hostname), with munged and slurmctld on n0 and one slurmd per node
// (`slurmd -N nI`). Everything lives under /tmp/<cluster prefix>slurm/ and
// in the cluster's namespaces, and goes with the cluster: its destructor
// kills every daemon, step and task, and removes the folder. The machine's
// own cgroup mounts are never touched (proctrack/linuxproc, task/none).
//
//   SlurmCluster slurm(2);
//   if (!slurm.ok()) GTEST_SKIP() << slurm.why();  // no root, no slurm-wlm or munge
//   auto r = run_process(slurm.login({"srun", "-N2", "--ntasks-per-node=2", "hostname"}), 60);
//   const std::string job = slurm.submit(script_path);   // sbatch --parsable
//   slurm.wait_for_job(job, {"COMPLETED"}, 120);
//
// slurm.shared() is a folder every node sees (the cluster's shared file
// system); slurm.diagnostics() gives the daemons' logs for a failure message.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/subprocess.h"
#include "support/test_cluster.h"

namespace tandem::testing {

class SlurmCluster {
 public:
  // `cpus` per node as slurm.conf declares it (config_overrides: the
  // machine may have fewer); `kill_wait_s` is slurm.conf's KillWait, the
  // time between a job's SIGTERM and its SIGKILL.
  explicit SlurmCluster(int hosts, int cpus = 4, int kill_wait_s = 5) : cluster_(hosts) {
    if (!cluster_.ok()) {
      why_ = cluster_.why();
      return;
    }
    for (const char* tool : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged",
                             "/usr/bin/srun", "/usr/bin/sbatch"}) {
      if (::access(tool, X_OK) != 0) {
        why_ = std::string("no ") + tool +
               ": install Debian's slurm-wlm and munge (scripts/setup.sh does)";
        return;
      }
    }
    std::vector<std::string> names;
    for (int i = 0; i < hosts; ++i) names.push_back(node(i));
    dir_ = "/tmp/" + cluster_.prefix() + "slurm";
    if (!cluster_.set_host_names(names) ||
        !shell("rm -rf " + dir_ + " && mkdir -p " + dir_ + "/state " + dir_ + "/spool " + dir_ +
               "/shared && chmod 700 " + dir_ + " && chmod 777 " + dir_ + "/shared") ||
        !shell("head -c 1024 /dev/urandom > " + dir_ + "/munge.key && chmod 400 " + dir_ +
               "/munge.key")) {
      why_ = "cannot write the cluster's files under " + dir_ + " and /etc/netns";
      return;
    }
    conf_ = dir_ + "/slurm.conf";
    std::ostringstream conf;
    conf << "ClusterName=" << cluster_.prefix() << "\n"
         << "SlurmctldHost=n0(" << cluster_.address(0) << ")\n"
         << "SlurmUser=root\nSlurmdUser=root\nMailProg=/bin/true\n"
         << "AuthType=auth/munge\nCredType=cred/munge\n"
         << "AuthInfo=socket=" << dir_ << "/munge.socket\n"
         << "StateSaveLocation=" << dir_ << "/state\n"
         << "SlurmdSpoolDir=" << dir_ << "/spool/%n\n"
         << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\n"
         << "SlurmdPidFile=" << dir_ << "/slurmd-%n.pid\n"
         << "SlurmctldLogFile=" << dir_ << "/slurmctld.log\n"
         << "SlurmdLogFile=" << dir_ << "/slurmd-%n.log\n"
         << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
         << "SchedulerType=sched/builtin\nSelectType=select/cons_tres\n"
         << "SelectTypeParameters=CR_Core\nSlurmdParameters=config_overrides\n"
         << "ReturnToService=2\nJobCompType=jobcomp/none\n"
         << "AccountingStorageType=accounting_storage/none\n"
         << "JobAcctGatherType=jobacct_gather/none\n"
         << "KillWait=" << kill_wait_s << "\nMinJobAge=600\nInactiveLimit=0\n"
         << "SlurmctldTimeout=30\nSlurmdTimeout=30\nMessageTimeout=10\n";
    for (int i = 0; i < hosts; ++i) {
      conf << "NodeName=" << node(i) << " NodeAddr=" << cluster_.address(i) << " CPUs=" << cpus
           << " State=UNKNOWN\n";
    }
    conf << "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n";
    if (!write(conf_, conf.str()) || !write(dir_ + "/cgroup.conf", "CgroupPlugin=cgroup/v1\n")) {
      why_ = "cannot write " + conf_;
      return;
    }
    // The daemons fork into the background; they stay in their host's
    // namespace, where the cluster's destructor finds them.
    if (!shell(join(on(0, {"/usr/sbin/munged", "--force", "--socket=" + dir_ + "/munge.socket",
                           "--key-file=" + dir_ + "/munge.key",
                           "--pid-file=" + dir_ + "/munged.pid",
                           "--log-file=" + dir_ + "/munged.log",
                           "--seed-file=" + dir_ + "/munge.seed"})))) {
      why_ = "munged did not start: " + read_file(dir_ + "/munged.log");
      return;
    }
    if (!shell(join(on(0, {"/usr/sbin/slurmctld", "-f", conf_, "-i"})))) {
      why_ = "slurmctld did not start: " + diagnostics();
      return;
    }
    for (int i = 0; i < hosts; ++i) {
      if (!shell(join(on(i, {"/usr/sbin/slurmd", "-f", conf_, "-N", node(i)})))) {
        why_ = "slurmd on " + node(i) + " did not start: " + diagnostics();
        return;
      }
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::string states;
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = run_process(login({"sinfo", "-h", "-N", "-o", "%N %T"}), 20);
      states = r.out;
      int idle = 0;
      std::istringstream lines(states);
      for (std::string name, state; lines >> name >> state;) idle += state == "idle";
      if (idle == hosts) {
        ok_ = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    why_ = "the Slurm nodes did not become idle within 60 s (sinfo: " + states + "): " +
           diagnostics();
  }

  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  ~SlurmCluster() {
    // The namespaces' processes go with the cluster (declared first, so
    // destroyed last); the folder goes here, after them.
    kill_all();
    if (!dir_.empty()) shell("rm -rf " + dir_);
  }

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  int size() const { return cluster_.size(); }
  TestCluster& hosts() { return cluster_; }
  static std::string node(int i) { return "n" + std::to_string(i); }
  const std::string& conf() const { return conf_; }
  // A folder every node sees: the job's shared file system.
  std::string shared() const { return dir_ + "/shared"; }

  // argv run on node `host` with its hostname and SLURM_CONF, as on a
  // login shell there.
  std::vector<std::string> on(int host, const std::vector<std::string>& argv) const {
    std::vector<std::string> out = cluster_.on(
        host, {"unshare", "--uts", "sh", "-c",
               "hostname \"$0\" && SLURM_CONF=\"$1\" && export SLURM_CONF && shift && exec "
               "\"$@\"",
               node(host), conf_});
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }
  // argv run on n0, the login node.
  std::vector<std::string> login(const std::vector<std::string>& argv) const { return on(0, argv); }

  // sbatch --parsable SCRIPT ARGS... on the login node: the job id, or ""
  // (the error in *error).
  std::string submit(const std::vector<std::string>& sbatch_args, std::string* error = nullptr) {
    std::vector<std::string> argv = {"sbatch", "--parsable"};
    argv.insert(argv.end(), sbatch_args.begin(), sbatch_args.end());
    auto r = run_process(login(argv), 30);
    std::string id = r.out.substr(0, r.out.find_first_of(";\n"));
    if (r.exit_code != 0 || id.empty()) {
      if (error) *error = r.out + r.err;
      return "";
    }
    return id;
  }

  // The job's state as scontrol shows it (PENDING, RUNNING, COMPLETED,
  // FAILED, CANCELLED, REQUEUED, ...), "" when unknown.
  std::string job_state(const std::string& job) {
    return job_field(job, "JobState");
  }
  // One KEY=VALUE field of `scontrol show job`.
  std::string job_field(const std::string& job, const std::string& key) {
    auto r = run_process(login({"scontrol", "-o", "show", "job", job}), 20);
    const std::string needle = " " + key + "=";
    auto at = (" " + r.out).find(needle);
    if (at == std::string::npos) return "";
    const std::string rest = r.out.substr(at + needle.size() - 1);
    return rest.substr(0, rest.find_first_of(" \n"));
  }

  // Waits until the job reaches one of `states`; returns the state it
  // ended in (one of them, or the last seen at the deadline).
  std::string wait_for_job(const std::string& job, const std::set<std::string>& states,
                           double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    std::string state;
    while (std::chrono::steady_clock::now() < deadline) {
      state = job_state(job);
      if (states.count(state)) return state;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return state;
  }

  // What a job left on `host`: processes other than the daemons (munged,
  // slurmctld and its slurmscriptd, slurmd), and listening TCP ports other than Slurm's (6817,
  // 6818). "" when nothing is left.
  std::string leftovers(int host) const {
    std::string out;
    for (pid_t pid : const_cast<TestCluster&>(cluster_).pids(host)) {
      std::string comm = read_file("/proc/" + std::to_string(pid) + "/comm");
      if (!comm.empty() && comm.back() == '\n') comm.pop_back();
      if (comm.empty() || comm == "munged" || comm == "slurmctld" || comm == "slurmscriptd" ||
          comm == "slurmd") {
        continue;
      }
      out += "process " + std::to_string(pid) + " (" + comm + "): " +
             read_file("/proc/" + std::to_string(pid) + "/cmdline") + "\n";
    }
    auto r = run_process(cluster_.on(host, {"ss", "-Hltn"}), 20);
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream words(line);
      std::string state, recv, send, local;
      words >> state >> recv >> send >> local;
      const std::string port = local.substr(local.rfind(':') + 1);
      if (port != "6817" && port != "6818") out += "listening: " + line + "\n";
    }
    return out;
  }

  // The daemons' logs (their last lines), for a failure message.
  std::string diagnostics() const {
    std::string out;
    std::vector<std::string> logs = {dir_ + "/slurmctld.log"};
    for (int i = 0; i < cluster_.size(); ++i) logs.push_back(dir_ + "/slurmd-" + node(i) + ".log");
    for (const auto& path : logs) {
      const std::string text = read_file(path);
      out += "\n--- " + path + " (last lines)\n" +
             text.substr(text.size() > 3000 ? text.size() - 3000 : 0);
    }
    return out;
  }

 private:
  static bool shell(const std::string& command) {
    return std::system(("{ " + command + "; } >/dev/null 2>&1").c_str()) == 0;
  }
  static std::string join(const std::vector<std::string>& argv) {
    std::string out;
    for (const auto& a : argv) out += (out.empty() ? "'" : " '") + a + "'";
    return out;
  }
  static bool write(const std::string& path, const std::string& text) {
    std::ofstream out(path);
    out << text;
    return static_cast<bool>(out);
  }
  void kill_all() {
    for (int i = 0; i < cluster_.size(); ++i) cluster_.kill_host(i, SIGKILL);
  }

  TestCluster cluster_;
  std::string why_;
  bool ok_ = false;
  std::string dir_;
  std::string conf_;
};

}  // namespace tandem::testing
