// libFuzzer target for the config loader (src/config): tandem YAML,
// Accelerate YAML (and JSON) and DeepSpeed JSON, all through
// parse_config_text(), which picks the format from the content.
//
// The contract checked, for any bytes:
//   * parsing, resolving and printing throw nothing but tandem::Error
//     (UsageError for bad input); any other exception escapes and libFuzzer
//     reports it, as it does crashes and sanitizer findings;
//   * a config that parses prints as JSON (resolved_config_json) and as
//     tandem YAML (to_tandem_yaml), and that YAML reads back to the same
//     settings, as config.h promises.
//
// The loader may read an Accelerate config's deepspeed_config_file,
// relative to the config's folder: here an empty temporary folder. (No
// chdir: libFuzzer takes the corpus paths relative to the working folder.)

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tandem/config/config.h"
#include "tandem/core/error.h"

namespace {

std::string g_dir;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_config_loader: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char templ[] = "/tmp/tandem_fuzz_config_XXXXXX";
  if (::mkdtemp(templ) == nullptr) fail("cannot make a temp folder", "");
  g_dir = templ;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tandem::Config config;
  try {
    config = tandem::parse_config_text(text, "fuzz.yaml", g_dir);
  } catch (const tandem::Error&) {
    return 0;  // bad input, reported the way tandem reports it
  }

  // The world size comes from the last byte, so that batch triples are
  // checked against more than one world.
  const int world_size = size > 0 ? 1 + data[size - 1] % 8 : 1;
  try {
    const tandem::Config resolved =
        tandem::resolve_config(config, tandem::ConfigEnv{}, {}, world_size);
    (void)tandem::resolved_config_json(resolved, world_size);
  } catch (const tandem::Error&) {
    // A contradiction only visible once resolved (a batch triple that does
    // not divide by the world size, ...).
  }

  const std::string yaml = tandem::to_tandem_yaml(config);
  tandem::Config again;
  try {
    again = tandem::parse_config_text(yaml, "roundtrip.yaml", g_dir);
  } catch (const tandem::Error& e) {
    fail("to_tandem_yaml() wrote a file the loader refuses", yaml + "\n" + e.what());
  }
  if (!tandem::same_settings(config, again)) {
    fail("to_tandem_yaml() does not read back to the same settings", yaml);
  }
  return 0;
}
