// Prints every key the config readers accept, one per line, sorted:
//
//   FORMAT<TAB>KEY<TAB>DISPOSITION
//
// FORMAT is tandem_yaml, accelerate_yaml or deepspeed_json; KEY is the
// dotted path (zero_optimization.offload_param.device, a prefix ending in
// `*`); DISPOSITION is implemented, warn or refuse (tandem/config/
// config_keys.h). A key of several optimizer or scheduler types prints once.
// tests/docs/check_config_keys.sh compares this with docs/config.md's key
// index.

#include <cstdio>
#include <set>
#include <string>
#include <tuple>

#include "tandem/config/config_keys.h"

// One of the programs in tandem_test_workers (workers/main.cpp picks it by
// the name it runs under).
namespace print_config_keys {

int main(int, char**) {
  std::set<std::tuple<std::string, std::string, std::string>> lines;
  for (const auto& key : tandem::config_keys()) lines.emplace(key.dialect, key.key, key.disposition);
  for (const auto& [format, key, disposition] : lines) {
    std::printf("%s\t%s\t%s\n", format.c_str(), key.c_str(), disposition.c_str());
  }
  return lines.empty() ? 1 : 0;
}

}  // namespace print_config_keys
