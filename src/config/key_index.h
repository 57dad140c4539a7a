#pragma once
// Every key the config readers accept, level by level and per format: the
// readers' own key tables (readers.h), each with the place in a file where
// it applies. Internal to the config layer. tests/docs/print_config_keys.cpp
// prints it, and the ctest Docs.ConfigKeysMatchTheParsers checks that
// docs/config.md's key index names the same keys.

#include <string>
#include <vector>

#include "config/yaml_reader.h"
#include "tandem/config/config.h"

namespace tandem::config_detail {

// One level of a config file and the table its reader checks it against.
struct KeyLevel {
  ConfigFormat format;   // kTandemYaml, kAccelerateYaml or kDeepSpeedJson
  std::string path;      // dotted path of the level; "" for the top level
  const KeyTable* keys;  // one of readers.h's static tables
  std::string type = "";  // optimizer/scheduler params: the type that picks the table
};

// Every level that has a key table, for the three formats. optimizer.params
// and scheduler.params appear once per type, since the type picks the
// table. Levels whose reader takes any key are absent: Accelerate's
// tp_config and parallelism_config, and DeepSpeed's
// tensor_parallel, where only the parallel sizes are checked
// (parallelism_keys.cpp). A reader that gains a table must add it here;
// tests/docs/check_config_keys.sh fails on a for_each_key() call whose table
// this file does not name.
std::vector<KeyLevel> key_levels();

}  // namespace tandem::config_detail
