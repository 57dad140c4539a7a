// The question engine of `tandem config` and the menu's key decoding,
// without a terminal.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config_wizard.h"
#include "config/menu_keys.h"
#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

// Answers each question in turn; fails the test on a refused answer.
void answer_all(ConfigWizard& wizard, const std::vector<std::string>& answers) {
  for (const auto& a : answers) {
    ASSERT_FALSE(wizard.done()) << "no question left for answer '" << a << "'";
    const std::string key = wizard.current().key;
    auto outcome = wizard.answer(a);
    ASSERT_TRUE(outcome.accepted) << key << " refused '" << a << "': " << outcome.message;
  }
}

std::vector<std::string> keys_asked(ConfigWizard& wizard, const std::string& fill = "") {
  std::vector<std::string> keys;
  while (!wizard.done()) {
    keys.push_back(wizard.current().key);
    if (!wizard.answer(fill).accepted) break;
  }
  return keys;
}

TEST(ConfigWizard, AsksOnlyTheBasicsWithoutDistributedTraining) {
  ConfigWizard wizard;
  EXPECT_EQ(keys_asked(wizard),
            (std::vector<std::string>{"compute_environment", "distributed_type", "mixed_precision",
                                      "gradient_accumulation_steps", "gradient_clipping"}));
  Config config = wizard.config();
  EXPECT_EQ(config.distributed_type, DistributedType::kNo);
  EXPECT_EQ(config.num_processes, 1);
  EXPECT_EQ(config.mixed_precision, MixedPrecision::kNo);
  EXPECT_EQ(config.zero.stage, 0);
  EXPECT_EQ(config.gradient_clipping, 0);
}

TEST(ConfigWizard, MultiNodeMultiGpuAsksEveryQuestion) {
  ConfigWizard wizard(WizardContext{4});
  answer_all(wizard, {"local", "multi-gpu", "2", "1", "10.0.0.1", "29600", "8", "0,1,2,3",
                      "bf16", "3", "cpu", "cpu", "4", "1.5"});
  ASSERT_TRUE(wizard.done());
  Config config = wizard.config();
  EXPECT_EQ(config.distributed_type, DistributedType::kMultiGpu);
  EXPECT_EQ(config.num_processes, 8);
  EXPECT_EQ(config.num_machines, 2);
  EXPECT_EQ(config.machine_rank, 1);
  EXPECT_EQ(config.main_process_ip, "10.0.0.1");
  EXPECT_EQ(config.main_process_port, 29600);
  EXPECT_EQ(config.gpu_ids, "0,1,2,3");
  EXPECT_EQ(config.mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(config.zero.stage, 3);
  EXPECT_EQ(config.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(config.zero.offload_param, OffloadDevice::kCpu);
  EXPECT_EQ(config.gradient_accumulation_steps, 4);
  EXPECT_DOUBLE_EQ(config.gradient_clipping, 1.5);
  EXPECT_FALSE(config.use_cpu);
}

TEST(ConfigWizard, ChoicesAcceptAnIndexANameOrALabelInAnyCase) {
  ConfigWizard wizard;
  answer_all(wizard, {"0", "MULTI_CPU"});
  EXPECT_EQ(wizard.answers().at("distributed_type"), "multi-cpu");
  EXPECT_EQ(wizard.current().key, "num_machines");
  Question q = ConfigWizard().current();
  EXPECT_EQ(match_choice(q, "1"), 1);
  EXPECT_EQ(match_choice(q, "this machine"), 0);
  EXPECT_EQ(match_choice(q, "Cluster"), 1);
  EXPECT_EQ(match_choice(q, "2"), -1);
  EXPECT_EQ(match_choice(q, "moon"), -1);
}

TEST(ConfigWizard, ZeroStageNumbersAreTheStages) {
  ConfigWizard wizard;
  answer_all(wizard, {"", "multi-cpu", "", "", "", "2"});
  EXPECT_EQ(wizard.answers().at("zero_stage"), "2");
  // Stage 2 offloads the optimizer states only; stage 3 also the parameters.
  EXPECT_EQ(wizard.current().key, "offload_optimizer_device");
  answer_all(wizard, {""});
  EXPECT_EQ(wizard.current().key, "gradient_accumulation_steps");
}

TEST(ConfigWizard, BadAnswersAreRefusedWithAReasonAndAskedAgain) {
  ConfigWizard wizard;
  answer_all(wizard, {"", "multi-cpu"});
  struct Case {
    std::string answer, reason;
  };
  auto refuse = [&](const Case& c) {
    const std::string key = wizard.current().key;
    auto outcome = wizard.answer(c.answer);
    EXPECT_FALSE(outcome.accepted) << key << " took '" << c.answer << "'";
    EXPECT_NE(outcome.message.find(c.reason), std::string::npos) << outcome.message;
    EXPECT_EQ(wizard.current().key, key) << "a refused answer must not move on";
  };
  refuse({"two", "not a whole number"});
  refuse({"0", "out of range"});
  answer_all(wizard, {"2"});
  refuse({"2", "out of range: answer a number from 0 to 1"});
  answer_all(wizard, {"0"});
  refuse({"", "an address is needed"});
  refuse({"10.0.0.1; rm", "not a host name"});
  refuse({"10.0.0.1:29500", "an address with a port"});
  refuse({"999.999.999.999", "not an IPv4 address"});
  refuse({":::", "not an IPv6 address"});
  refuse({"node..7", "empty part"});
  answer_all(wizard, {"node001"});
  refuse({"70000", "out of range"});
  refuse({"0", "out of range"});
  answer_all(wizard, {""});
  EXPECT_EQ(wizard.answers().at("main_process_port"), "29500");
  refuse({"3", "cannot be split evenly over 2 machines"});
  answer_all(wizard, {"4"});
  refuse({"fp32", "not one of the choices"});
  refuse({"2", "not one of the choices"});  // fp16 is not offered on CPUs
  refuse({"fp16", "fp16 needs a CUDA device, and a multi-CPU config trains on the CPU"});
  answer_all(wizard, {"bf16", "0"});
  refuse({"0", "out of range"});
  answer_all(wizard, {"2"});
  refuse({"-1", "negative"});
  refuse({"lots", "not a number"});
  answer_all(wizard, {"none"});
  ASSERT_TRUE(wizard.done());
  EXPECT_EQ(wizard.config().gradient_accumulation_steps, 2);
}

TEST(ConfigWizard, GpuIdsMustBeDistinctAndCoverEveryProcess) {
  ConfigWizard wizard(WizardContext{2});
  answer_all(wizard, {"", "multi-gpu", "1", ""});
  EXPECT_EQ(wizard.answers().at("num_processes"), "2") << "default: one process per local GPU";
  ASSERT_EQ(wizard.current().key, "gpu_ids");
  EXPECT_FALSE(wizard.answer("0,0").accepted);
  EXPECT_FALSE(wizard.answer("0,x").accepted);
  auto too_few = wizard.answer("1");
  EXPECT_FALSE(too_few.accepted);
  EXPECT_NE(too_few.message.find("name at least 2"), std::string::npos) << too_few.message;
  answer_all(wizard, {" 1, 3 "});
  EXPECT_EQ(wizard.answers().at("gpu_ids"), "1,3");
}

// As Accelerate's wizard: multi-GPU with one process on one machine is no
// distributed training, refused and never offered as the default.
TEST(ConfigWizard, OneGpuProcessOnOneMachineIsRefused) {
  ConfigWizard wizard(WizardContext{1});
  answer_all(wizard, {"", "multi-gpu", "1"});
  ASSERT_EQ(wizard.current().key, "num_processes");
  EXPECT_EQ(wizard.current().default_answer, "2");
  auto one = wizard.answer("1");
  EXPECT_FALSE(one.accepted);
  EXPECT_NE(one.message.find("choose 'no' distributed training"), std::string::npos)
      << one.message;
  ConfigWizard two_machines;
  answer_all(two_machines, {"", "multi-gpu", "2", "0", "10.0.0.1", ""});
  ASSERT_EQ(two_machines.current().key, "num_processes");
  EXPECT_TRUE(two_machines.answer("2").accepted);
}

TEST(ConfigWizard, ClusterSkipsTheMachineQuestionsWithANote) {
  ConfigWizard wizard;
  auto outcome = wizard.answer("cluster");
  ASSERT_TRUE(outcome.accepted);
  EXPECT_NE(outcome.message.find("srun"), std::string::npos) << outcome.message;
  answer_all(wizard, {"multi-gpu"});
  EXPECT_EQ(wizard.current().key, "num_processes");
  answer_all(wizard, {"16"});
  EXPECT_EQ(wizard.current().key, "mixed_precision");
}

// A file for the CPU (use_cpu) must not ask for fp16, which the Accelerator
// refuses there; a GPU machine's file may.
TEST(ConfigWizard, Fp16IsNotOfferedForTheCpu) {
  ConfigWizard cpu;
  answer_all(cpu, {"", "multi-cpu", "", "2"});
  ASSERT_EQ(cpu.current().key, "mixed_precision");
  EXPECT_EQ(cpu.current().choices.size(), 2u);
  EXPECT_FALSE(cpu.answer("fp16").accepted);
  ConfigWizard gpu;
  answer_all(gpu, {"", "multi-gpu", "", "2", ""});
  ASSERT_EQ(gpu.current().key, "mixed_precision");
  answer_all(gpu, {"fp16"});
  EXPECT_EQ(gpu.answers().at("mixed_precision"), "fp16");

  EXPECT_EQ(basic_config(1, MixedPrecision::kFp16).mixed_precision, MixedPrecision::kFp16);
  try {
    basic_config(0, MixedPrecision::kFp16);
    ADD_FAILURE() << "fp16 without a GPU was written";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a CUDA device"), std::string::npos) << e.what();
  }
}

TEST(ConfigWizard, BasicConfigFollowsTheLocalGpus) {
  Config none = basic_config(0, MixedPrecision::kBf16);
  EXPECT_EQ(none.distributed_type, DistributedType::kNo);
  EXPECT_TRUE(none.use_cpu);
  EXPECT_EQ(none.num_processes, 1);
  EXPECT_EQ(none.mixed_precision, MixedPrecision::kBf16);
  Config one = basic_config(1, MixedPrecision::kNo);
  EXPECT_EQ(one.distributed_type, DistributedType::kNo);
  EXPECT_FALSE(one.use_cpu);
  Config four = basic_config(4, MixedPrecision::kNo);
  EXPECT_EQ(four.distributed_type, DistributedType::kMultiGpu);
  EXPECT_EQ(four.num_processes, 4);
}

std::vector<KeyEvent> decode(const std::string& bytes) {
  KeyDecoder decoder;
  std::vector<KeyEvent> keys;
  for (unsigned char b : bytes) {
    if (auto k = decoder.feed(b)) keys.push_back(*k);
  }
  return keys;
}

TEST(MenuKeys, DecodesArrowsInBothCursorModesDigitsAndEnter) {
  auto keys = decode("\x1b[A\x1bOB\x1b[1;5A" "7\r\n\x04zq\x1b[C");
  std::vector<MenuKey> want = {MenuKey::kUp,    MenuKey::kDown,  MenuKey::kUp, MenuKey::kDigit,
                               MenuKey::kEnter, MenuKey::kEnter, MenuKey::kEof};
  ASSERT_EQ(keys.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(keys[i].key, want[i]) << i;
  EXPECT_EQ(keys[3].digit, 7);
}

TEST(MenuKeys, CursorWrapsAndDigitsJumpToExistingRows) {
  MenuCursor cursor(3, 0);
  EXPECT_TRUE(cursor.apply({MenuKey::kUp}));
  EXPECT_EQ(cursor.index(), 2);
  cursor.apply({MenuKey::kDown});
  EXPECT_EQ(cursor.index(), 0);
  cursor.apply({MenuKey::kDigit, 1});
  EXPECT_EQ(cursor.index(), 1);
  EXPECT_FALSE(cursor.apply({MenuKey::kDigit, 5}));
  EXPECT_EQ(cursor.index(), 1);
}

}  // namespace
}  // namespace tandem::cli
