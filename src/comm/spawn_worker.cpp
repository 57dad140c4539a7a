#include "comm/spawn_worker.h"

#include <cxxabi.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <typeinfo>

#include <ATen/Parallel.h>

#include "tandem/core/error.h"
#include "tandem/core/error_file.h"
#include "tandem/core/file_system.h"
#include "tandem/core/rank_env.h"

namespace tandem::detail {
namespace {

std::string exception_type_name(const std::type_info& type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name != nullptr ? name : type.name();
  std::free(name);
  return out;
}

void write_report_bytes(int fd, const std::string& bytes) {
  // An error means the parent is gone: nobody to tell.
  (void)fs::write_all(fd, bytes.data(), bytes.size());
}

void flush_worker_output() {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
}

WorkerReport failure_report(const std::exception& e, bool comm_error) {
  WorkerReport report;
  report.comm_error = comm_error;
  report.time_ns = monotonic_ns();
  report.type = exception_type_name(typeid(e));
  report.message = e.what();
  // Uncaught-exception files for the record, as under `tandem launch`.
  record_error(e);
  return report;
}

}  // namespace

std::int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// "OK", or "ERR\n<comm 0|1>\n<time_ns>\n<type>\n<message>" (the message may
// hold newlines: it is everything after the fourth).
std::string encode_report(const WorkerReport& report) {
  if (report.ok) return "OK";
  std::string type = report.type;
  for (char& c : type) c = c == '\n' ? ' ' : c;
  return "ERR\n" + std::to_string(report.comm_error ? 1 : 0) + "\n" +
         std::to_string(report.time_ns) + "\n" + type + "\n" + report.message;
}

std::optional<WorkerReport> decode_report(const std::string& bytes) {
  WorkerReport report;
  if (bytes == "OK") {
    report.ok = true;
    return report;
  }
  if (bytes.rfind("ERR\n", 0) != 0) return std::nullopt;
  const size_t comm = 4;
  const size_t time = bytes.find('\n', comm) + 1;  // npos + 1 == 0
  const size_t type = time == 0 ? 0 : bytes.find('\n', time) + 1;
  const size_t message = type == 0 ? 0 : bytes.find('\n', type) + 1;
  if (message == 0) return std::nullopt;
  report.comm_error = bytes.compare(comm, time - 1 - comm, "1") == 0;
  report.time_ns = std::strtoll(bytes.substr(time, type - 1 - time).c_str(), nullptr, 10);
  report.type = bytes.substr(type, message - 1 - type);
  report.message = bytes.substr(message);
  return report;
}

void run_worker(const std::function<void(int)>& fn, int rank, int status_fd, int threads) {
  WorkerReport report;
  try {
    // OpenMP read OMP_NUM_THREADS when it was loaded, in the parent: the
    // count has to be set again here.
    if (threads > 0) at::set_num_threads(threads);
    // Parses the environment spawn() set and installs the handler that
    // writes an uncaught exception (in any thread) to TANDEM_ERROR_FILE.
    (void)RankEnv::from_environment();
    fn(rank);
    report.ok = true;
  } catch (const CommError& e) {
    report = failure_report(e, /*comm_error=*/true);
  } catch (const std::exception& e) {
    report = failure_report(e, /*comm_error=*/false);
  } catch (...) {
    report.time_ns = monotonic_ns();
    report.type = "unknown";
    report.message = "an exception of a type not derived from std::exception";
  }
  flush_worker_output();
  write_report_bytes(status_fd, encode_report(report));
  ::_exit(report.ok ? 0 : 1);
}

}  // namespace tandem::detail
