// load_config_file() and parse_config_text(): pick the format from the
// content and hand the document to its reader.

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

#include "config/readers.h"
#include "tandem/core/error.h"

namespace tandem {

Config parse_config_text(const std::string& text, const std::string& name,
                         const std::string& base_dir) {
  using namespace config_detail;
  const bool json = looks_like_json(text);
  YAML::Node node = parse_document(text, name, json);

  Config config;
  config.source_path = name;
  ReadContext ctx{name, &config};
  Value root = Value::root(ctx, node);
  expect_map(root, json ? "a config is one JSON object: { \"key\": value, ... }"
                        : "a config is a mapping of `key: value` lines");

  const YAML::Node& top = node;  // const: operator[] must not add keys
  const bool accelerate = top["distributed_type"].IsDefined() ||
                          top["compute_environment"].IsDefined();
  if (accelerate) {
    config.format = ConfigFormat::kAccelerateYaml;
    read_accelerate_document(root, config, base_dir);
  } else if (json) {
    config.format = ConfigFormat::kDeepSpeedJson;
    read_deepspeed_document(root, config);
  } else {
    config.format = ConfigFormat::kTandemYaml;
    read_tandem_document(root, config);
  }
  config_detail::check_keys_read(ctx);
  return config;
}

Config load_config_file(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    TANDEM_THROW(UsageError, "{}: is a folder, not a config file; give the path of the YAML or "
                 "JSON file itself", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    TANDEM_THROW(UsageError,
                 "{}: cannot read the config file ({}); check the path given by --config_file "
                 "or TANDEM_CONFIG_FILE",
                 path, std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  size_t slash = path.rfind('/');
  std::string base_dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  return parse_config_text(text.str(), path, base_dir);
}

}  // namespace tandem
