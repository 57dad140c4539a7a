// The main of tandem_unit_tests, the in-process areas' tests in one binary
// (tests/CMakeLists.txt): `--area=NAME` runs only the tests whose source
// file lies in tests/NAME/, so that each area stays its own ctest entry
// (tandem_NAME_tests) while the binary compiles as a few translation units
// instead of one per area. Without --area it runs every test; with it, a
// --gtest_filter selects within the area, and the other --gtest_* flags
// (sharding, repeat, shuffle) apply to what is selected.

#include <cstdio>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

namespace {

// gtest's filter syntax: '*' any run of characters, '?' any one character.
bool glob_matches(const char* pattern, const char* name) {
  if (*pattern == '\0') return *name == '\0';
  if (*pattern == '*') {
    return glob_matches(pattern + 1, name) || (*name != '\0' && glob_matches(pattern, name + 1));
  }
  return *name != '\0' && (*pattern == '?' || *pattern == *name) &&
         glob_matches(pattern + 1, name + 1);
}

bool any_matches(const std::string& patterns, const std::string& name) {
  size_t begin = 0;
  while (begin <= patterns.size()) {
    size_t end = patterns.find(':', begin);
    if (end == std::string::npos) end = patterns.size();
    const std::string pattern = patterns.substr(begin, end - begin);
    if (!pattern.empty() && glob_matches(pattern.c_str(), name.c_str())) return true;
    begin = end + 1;
  }
  return false;
}

// Whether `name` passes a --gtest_filter: POSITIVE[-NEGATIVE], each a
// ':'-separated list of patterns; an empty positive part passes every name.
bool filter_passes(const std::string& filter, const std::string& name) {
  const size_t dash = filter.find('-');
  const std::string positive = filter.substr(0, dash);
  const std::string negative = dash == std::string::npos ? "" : filter.substr(dash + 1);
  return (positive.empty() || any_matches(positive, name)) && !any_matches(negative, name);
}

// The filter naming every test defined in tests/<area>/ that `given` passes,
// or "" when there is none.
std::string area_filter(const std::string& area, const std::string& given) {
  const std::string folder = "/tests/" + area + "/";
  std::string filter;
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const testing::TestInfo& test = *suite.GetTestInfo(t);
      if (std::string(test.file()).find(folder) == std::string::npos) continue;
      const std::string name = std::string(suite.name()) + "." + test.name();
      if (!filter_passes(given, name)) continue;
      if (!filter.empty()) filter += ':';
      filter += name;
    }
  }
  return filter;
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  std::string area;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--area=", 7) == 0) {
      area = argv[i] + 7;
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s' (this binary takes --area=NAME and the "
                           "--gtest_* flags)\n", argv[0], argv[i]);
      return 2;
    }
  }
  if (!area.empty()) {
    const std::string given = GTEST_FLAG_GET(filter);
    const std::string in_area = area_filter(area, given);
    if (in_area.empty()) {
      std::fprintf(stderr, "%s: --area=%s with --gtest_filter=%s names no tests (the area's "
                           "tests are those in tests/%s/)\n",
                   argv[0], area.c_str(), given.c_str(), area.c_str());
      return 2;
    }
    GTEST_FLAG_SET(filter, in_area);
  }
  return RUN_ALL_TESTS();
}
