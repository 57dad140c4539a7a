// The launch keys Accelerate's default_config.yaml and tandem YAML share.

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

#include "config/readers.h"
#include "tandem/core/error.h"

#include <fmt/format.h>

namespace tandem::config_detail {

DistributedType read_distributed_type(const Value& value) {
  DistributedTypeLookup found = lookup_distributed_type(value.as_string());
  if (!found.type) value.fail(found.what, found.fix);
  return *found.type;
}

MixedPrecision read_mixed_precision(const Value& value) {
  if (value.is_null()) return MixedPrecision::kNo;
  if (value.node().IsScalar() && (value.node().Scalar() == "fp8" || value.node().Scalar() == "FP8")) {
    value.fail("fp8 mixed precision is not supported by tandem", "use \"bf16\", \"fp16\" or \"no\"");
  }
  return parse_mixed_precision(value.as_choice({"no", "bf16", "fp16"}));
}

namespace {

// tandem's nodes meet at its own TCP store, which c10d and static both
// name; etcd and etcd-v2 ask for an etcd server tandem never talks to.
// Refused here, where the file is read, so that `tandem config check` and
// `tandem launch` give the same answer for one file.
std::string read_rdzv_backend(const Value& value) {
  if (value.is_null()) return "static";
  if (value.node().IsScalar()) {
    std::string lowered = value.node().Scalar();
    for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lowered == "etcd" || lowered == "etcd-v2") {
      value.fail(lowered + " is not supported by tandem: the nodes meet at tandem's own TCP "
                           "store (main_process_ip:main_process_port), not at an etcd server",
                 "set it to \"c10d\" (the nodes agree on their ranks at the store) or "
                 "\"static\" (each node gives its machine_rank)");
    }
  }
  return value.as_choice({"static", "c10d"});
}

}  // namespace

bool read_launch_key(const std::string& key, const Value& v, Config& config) {
  if (key == "num_processes") {
    // Accelerate counts processes on all machines together.
    config.num_processes = v.is_null() || v.is_auto() ? std::nullopt
                                                      : std::optional<int>(static_cast<int>(
                                                            v.as_int(1, 1 << 24)));
  } else if (key == "num_machines") {
    config.num_machines = static_cast<int>(v.as_int(1, 1 << 24));
  } else if (key == "machine_rank") {
    config.machine_rank = static_cast<int>(v.as_int(0, 1 << 24));
  } else if (key == "main_process_ip") {
    config.main_process_ip = v.is_null() ? "" : v.as_string();
    const std::string problem = host_address_problem(config.main_process_ip);
    if (!config.main_process_ip.empty() && !problem.empty()) {
      const auto semicolon = problem.find("; ");
      v.fail(problem.substr(0, semicolon),
             semicolon == std::string::npos ? "write the host name or IP address of machine rank 0"
                                            : problem.substr(semicolon + 2));
    }
  } else if (key == "main_process_port") {
    config.main_process_port = v.is_null() ? std::nullopt
                                            : std::optional<int>(static_cast<int>(
                                                  v.as_int(1, 65535, "set it to a free TCP port "
                                                                     "from 1 to 65535")));
  } else if (key == "gpu_ids") {
    config.gpu_ids = v.is_null() ? "all" : v.as_string();
  } else if (key == "use_cpu") {
    config.use_cpu = v.as_bool();
  } else if (key == "rdzv_backend") {
    config.rdzv_backend = read_rdzv_backend(v);
  } else if (key == "mixed_precision") {
    config.mixed_precision = read_mixed_precision(v);
  } else {
    return false;
  }
  return true;
}

std::string location_of(const Config& config, const std::string& path) {
  auto it = config.key_locations.find(path);
  return it != config.key_locations.end() ? it->second : config.source_path;
}

void check_launch_settings(const Config& config) {
  if (config.machine_rank >= config.num_machines) {
    TANDEM_THROW(UsageError,
                 "{}: machine_rank: {} is not below num_machines {}; machine ranks run from 0 "
                 "to num_machines - 1",
                 location_of(config, "machine_rank"), config.machine_rank, config.num_machines);
  }
  if (config.num_processes && *config.num_processes % config.num_machines != 0) {
    TANDEM_THROW(UsageError,
                 "{}: num_processes: {} processes do not split evenly over num_machines {}; "
                 "num_processes counts the processes of all machines together, so set it to a "
                 "multiple of num_machines",
                 location_of(config, "num_processes"), *config.num_processes,
                 config.num_machines);
  }
}

}  // namespace tandem::config_detail

namespace tandem {

std::string host_address_problem(const std::string& text) {
  if (text.empty()) return "no address given; write the host name or IP address of machine rank 0";
  const auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  in6_addr v6{};
  if (text.find(':') != std::string::npos) {
    if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) return "";
    const auto colon = text.rfind(':');
    const std::string port = text.substr(colon + 1);
    if (text.find(':') == colon && !port.empty() && std::all_of(port.begin(), port.end(), is_digit)) {
      return fmt::format("'{}' is an address with a port; give the address alone ('{}') and the "
                         "port as main_process_port (--main_process_port {})",
                         text, text.substr(0, colon), port);
    }
    return fmt::format("'{}' is not an IPv6 address; write it as 'fd00::1' (no brackets, no port)",
                       text);
  }
  const bool dotted_numbers = std::all_of(text.begin(), text.end(),
                                          [&](char c) { return is_digit(c) || c == '.'; });
  in_addr v4{};
  if (dotted_numbers) {
    if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return "";
    return fmt::format("'{}' is not an IPv4 address; write four numbers from 0 to 255 "
                       "('10.0.0.1')",
                       text);
  }
  // A host name: dot-separated labels of letters, digits, '-' and '_' (some
  // clusters' names have one), each 1-63 characters, 253 in all.
  const auto bad_name = [&](const std::string& why) {
    return fmt::format("'{}' is not a host name or IP address: {}", text, why);
  };
  if (text.size() > 253) return bad_name("a host name has at most 253 characters");
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('.', start);
    if (end == std::string::npos) end = text.size();
    const std::string label = text.substr(start, end - start);
    if (label.empty() && end == text.size() && start > 0) break;  // "node1." is fully qualified
    if (label.empty()) return bad_name("it has an empty part between dots");
    if (label.size() > 63) return bad_name("each dot-separated part has at most 63 characters");
    for (char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') {
        return bad_name(fmt::format("'{}' cannot be part of one", c));
      }
    }
    if (label.front() == '-' || label.back() == '-') {
      return bad_name("a part cannot begin or end with '-'");
    }
    start = end + 1;
  }
  return "";
}

}  // namespace tandem
