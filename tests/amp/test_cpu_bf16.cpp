// Native bf16 on the CPU: the probe, the cap oneDNN honours, and the warning
// a user who trains in bf16 on an emulating CPU gets.

#include "tandem/amp/cpu_bf16.h"

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace tandem {
namespace cpu_bf16_test {

bool cpuinfo_has(const std::string& flag) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) {
      return (line + " ").find(" " + flag + " ") != std::string::npos;
    }
  }
  return false;
}

// Sets ONEDNN_MAX_CPU_ISA for the scope and restores what was there.
class IsaCap {
 public:
  explicit IsaCap(const char* value) {
    if (const char* old = std::getenv("ONEDNN_MAX_CPU_ISA")) old_ = old;
    setenv("ONEDNN_MAX_CPU_ISA", value, 1);
  }
  ~IsaCap() {
    if (old_) {
      setenv("ONEDNN_MAX_CPU_ISA", old_->c_str(), 1);
    } else {
      unsetenv("ONEDNN_MAX_CPU_ISA");
    }
  }

 private:
  std::optional<std::string> old_;
};

TEST(CpuBf16, NativeExactlyWhenTheCpuHasBf16Instructions) {
  if (const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA")) {
    GTEST_SKIP() << "ONEDNN_MAX_CPU_ISA=" << cap << " is set for this run";
  }
  const bool has = cpuinfo_has("avx512_bf16") || cpuinfo_has("amx_bf16") || cpuinfo_has("bf16");
  const CpuBf16Support support = cpu_bf16_support(/*measure=*/false);
  EXPECT_EQ(support.native, has) << support.reason;
  EXPECT_EQ(support.slowdown, 0.0);
  EXPECT_EQ(cpu_bf16_warning(support).empty(), has);
}

TEST(CpuBf16, AnIsaCapBelowBf16MakesItEmulatedWhateverTheCpu) {
  IsaCap cap("avx2");
  const CpuBf16Support support = cpu_bf16_support(/*measure=*/true);
  EXPECT_FALSE(support.native);
  EXPECT_TRUE(support.reason.find("ONEDNN_MAX_CPU_ISA=avx2") != std::string::npos ||
              support.reason.find("no avx512_bf16") != std::string::npos)
      << support.reason;
  EXPECT_GT(support.slowdown, 0.0);
}

TEST(CpuBf16, TheWarningGivesTheMeasuredFactorAndTheRemedy) {
  CpuBf16Support emulated;
  emulated.reason = "no avx512_bf16 or amx_bf16 in /proc/cpuinfo";
  emulated.slowdown = 41.25;
  const std::string warning = cpu_bf16_warning(emulated);
  EXPECT_NE(warning.find("41.2x its fp32 time"), std::string::npos) << warning;
  EXPECT_NE(warning.find("no avx512_bf16"), std::string::npos) << warning;
  EXPECT_NE(warning.find("Train in fp32 on this CPU"), std::string::npos) << warning;

  emulated.slowdown = 0.0;  // not measured: the known factor instead
  EXPECT_NE(cpu_bf16_warning(emulated).find("67x"), std::string::npos);

  CpuBf16Support native;
  native.native = true;
  EXPECT_TRUE(cpu_bf16_warning(native).empty());
}

}  // namespace cpu_bf16_test
}  // namespace tandem
