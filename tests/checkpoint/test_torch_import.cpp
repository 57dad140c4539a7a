// `tandem checkpoint import` (tandem::import_torch_save): torch.save files
// made by the real torch (tests/checkpoint/torch_import_interop.py) import
// bit for bit, and the restricted pickle reader refuses what a weights-only
// load must refuse, executing nothing. Hand-made pickles need no Python.

#include <gtest/gtest.h>

#include <string>

#include "checkpoint/pickle_reader.h"
#include "checkpoint/safetensors_test_util.h"
#include "support/scratch_dir.h"
#include "tandem/checkpoint/torch_import.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem {
namespace {

int run_import_peer(const std::string& args, std::string& output) {
  return testing::run_peer_script("torch_import_interop.py", args, output);
}

std::string pickle_error(const std::string& bytes) {
  try {
    detail::read_pickle(bytes);
  } catch (const detail::PickleFormatError& e) {
    return e.what();
  }
  return "";
}

TEST(TorchImportInterop, TorchSaveFilesImportBitForBit) {
  if (!testing::peer_can_import("safetensors.torch")) GTEST_SKIP() << "no torch in the peer";
  testing::ScratchDir dir;
  std::string output;
  ASSERT_EQ(run_import_peer("write '" + dir.path() + "'", output), 0) << output;
  std::string pairs;
  for (const char* name : {"state_dict", "mixed"}) {
    const std::string source = dir.file(std::string(name) + ".pt");
    const std::string out = dir.file(std::string(name) + ".safetensors");
    const TorchImportResult r = import_torch_save(source, out);
    EXPECT_GT(r.tensors, 0);
    pairs += " '" + source + "' '" + out + "'";
  }
  output.clear();
  EXPECT_EQ(run_import_peer("check" + pairs, output), 0) << output;
  EXPECT_NE(output.find("state_dict.pt: ok "), std::string::npos) << output;
  EXPECT_NE(output.find("mixed.pt: ok "), std::string::npos) << output;
}

// DeepSpeed's own ZeRO-2 and ZeRO-3 checkpoint folders (2 CPU ranks, gloo;
// deepspeed_resume_reference.py's, which test_deepspeed_import.cpp turns
// into tandem checkpoints: AdamW, a scheduler, frozen and tied parameters):
// every file reads, its records (fragment_address, the scheduler's state)
// as data.
TEST(TorchImportInterop, DeepSpeedZeroFoldersReadBitForBit) {
  if (!testing::peer_can_import("deepspeed")) GTEST_SKIP() << "no deepspeed in the peer";
  testing::ScratchDir dir;
  int files = 0;
  std::string pairs;  // both stages' files, checked by one Python process
  for (int stage : {2, 3}) {
    std::string output;
    const testing::ScratchDir* reference = testing::deepspeed_reference_run(stage, output);
    ASSERT_NE(reference, nullptr) << output;
    const std::string tag = *reference / "ds/global_step3";
    int stage_files = 0;
    for (const auto& name : fs::list_directory(tag)) {
      const std::string source = tag + "/" + name;
      const std::string out = dir.file(std::to_string(stage) + "-" + name + ".safetensors");
      import_torch_save(source, out);
      pairs += " '" + source + "' '" + out + "'";
      ++stage_files;
    }
    EXPECT_EQ(stage_files, stage == 2 ? 3 : 4) << "stage " << stage;
    files += stage_files;
  }
  std::string output;
  EXPECT_EQ(run_import_peer("check" + pairs, output), 0) << output;
  int checked = 0;
  for (auto at = output.find(": ok "); at != std::string::npos; at = output.find(": ok ", at + 1)) {
    ++checked;
  }
  EXPECT_EQ(checked, files) << output;
}

TEST(TorchImportInterop, AHostilePickleIsRefusedNamingWhatItCallsAndNothingRuns) {
  if (!testing::peer_can_import("torch")) GTEST_SKIP() << "no torch in the peer";
  testing::ScratchDir dir;
  std::string output;
  ASSERT_EQ(run_import_peer("write '" + dir.path() + "'", output), 0) << output;
  try {
    import_torch_save(dir.file("hostile.pt"), dir.file("hostile.safetensors"));
    ADD_FAILURE() << "a pickle calling os.system was imported";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("system, which a weights-only read does not build"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.file("ran")));
  EXPECT_FALSE(fs::exists(dir.file("hostile.safetensors")));
}

TEST(PickleReader, ReadsADictOfNumbersAndStrings) {
  // protocol 2: {'a': 1, 'b': 'x'}
  const char raw[] = "\x80\x02}q\x00(X\x01\x00\x00\x00" "aK\x01X\x01\x00\x00\x00" "bX\x01\x00\x00\x00" "xu.";
  const std::string bytes(raw, sizeof raw - 1);
  detail::PickleRef v = detail::read_pickle(bytes);
  ASSERT_EQ(v->kind, detail::PickleValue::Kind::kDict);
  ASSERT_EQ(v->entries.size(), 2u);
  EXPECT_EQ(v->entries[0].second->integer, 1);
  EXPECT_EQ(v->entries[1].second->text, "x");
}

TEST(PickleReader, RefusesGlobalsOutsideTheWeightsOnlySetByName) {
  EXPECT_NE(pickle_error("cos\nsystem\n.").find("os.system"), std::string::npos);
  EXPECT_NE(pickle_error("cbuiltins\neval\n.").find("builtins.eval"), std::string::npos);
  // Allowed globals build only what they stand for.
  EXPECT_EQ(pickle_error("ccollections\nOrderedDict\n)R."), "");
  EXPECT_NE(pickle_error("ctorch\nFloatStorage\n)R.").find("does not call"), std::string::npos);
  // float8 and uint16-64 tensors: named, with the way around it.
  const std::string v3 = pickle_error("ctorch._utils\n_rebuild_tensor_v3\n.");
  EXPECT_NE(v3.find("float8, uint16, uint32 or uint64"), std::string::npos) << v3;
  EXPECT_NE(v3.find("safetensors.torch.save_file"), std::string::npos) << v3;
}

TEST(PickleReader, MalformedInputGetsAClearErrorNotACrash) {
  EXPECT_NE(pickle_error("\x80\x02}").find("ends before"), std::string::npos);
  EXPECT_NE(pickle_error(std::string("X\xff\xff\xff\x7f", 5)).find("runs past the end"),
            std::string::npos);
  EXPECT_NE(pickle_error("h\x05.").find("memo entry 5"), std::string::npos);
  EXPECT_NE(pickle_error("a.").find("empty stack"), std::string::npos);
  EXPECT_NE(pickle_error("\xfe.").find("opcode 0xfe"), std::string::npos);
  EXPECT_NE(pickle_error("K\x01K\x02.").find("2 item(s)"), std::string::npos);
  // A list that contains itself, and values nested past the limit.
  EXPECT_NE(pickle_error(std::string("]q\x00h\x00" "a.", 7)).find("contains itself"),
            std::string::npos);
  EXPECT_NE(pickle_error(std::string(100, ']') + std::string(99, 'a') + ".").find("deeper than 64"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
