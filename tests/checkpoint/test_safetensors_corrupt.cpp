// The safetensors reader on hostile input: every malformed, truncated or
// corrupt file must throw CheckpointError naming the file, when opened or
// at the latest when a tensor is read; never crash, never return wrong data.

#include <random>

#include "checkpoint/safetensors_test_util.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::le64;
using testing::read_bytes;
using testing::safetensors_bytes;
using testing::ScratchDir;
using testing::write_bytes;

// Opens `path` and reads every tensor. Returns the CheckpointError message,
// or "" when the file was accepted.
std::string open_and_read_all(const std::string& path) {
  try {
    SafetensorsReader reader(path);
    for (const auto& e : reader.entries()) reader.read(e.name);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

// Expects the bytes to be rejected with a message naming the file and
// holding `expected`.
void expect_rejected(const ScratchDir& dir, const std::string& bytes, const std::string& expected,
                     const std::string& context = "") {
  const std::string path = dir.file("corrupt.safetensors");
  write_bytes(path, bytes);
  const std::string message = open_and_read_all(path);
  ASSERT_FALSE(message.empty()) << "accepted: " << context;
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(expected), std::string::npos) << context << "\n" << message;
}

// A small tandem file with metadata and a few non-empty tensors.
std::string good_file(const ScratchDir& dir) {
  const std::string path = dir.file("good.safetensors");
  write_safetensors(path,
                    {{"w", testing::formula_tensor(at::kFloat, {2, 3})},
                     {"b", testing::formula_tensor(at::kHalf, {3})},
                     {"steps", testing::formula_tensor(at::kLong, {1})}},
                    {{"note", "x"}});
  return read_bytes(path);
}

TEST(SafetensorsCorrupt, TruncationAtEveryByteIsRejected) {
  ScratchDir dir;
  const std::string bytes = good_file(dir);
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    expect_rejected(dir, bytes.substr(0, cut), "", "cut at " + std::to_string(cut));
  }
  expect_rejected(dir, "", "only 0 bytes");
  expect_rejected(dir, bytes + "x", "trailing bytes");
}

TEST(SafetensorsCorrupt, EverySingleBitFlipIsRejected) {
  ScratchDir dir;
  const std::string bytes = good_file(dir);
  ASSERT_GT(bytes.size(), 100u);
  // Exhaustive over the header and the data: thousands of flips, ~1 s.
  for (std::size_t pos = 0; pos < bytes.size(); ++pos) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = bytes;
      flipped[pos] = static_cast<char>(flipped[pos] ^ (1 << bit));
      expect_rejected(dir, flipped, "",
                      "byte " + std::to_string(pos) + " bit " + std::to_string(bit));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(SafetensorsCorrupt, ChecksumMismatchNamesTheTensor) {
  ScratchDir dir;
  std::string bytes = good_file(dir);
  bytes[bytes.size() - 1] ^= 0x10;  // last byte of the last tensor in data order
  expect_rejected(dir, bytes, "the file is corrupt (bit flip or partial write)");
  const std::string message = open_and_read_all(dir.file("corrupt.safetensors"));
  EXPECT_NE(message.find("tensor 'steps'"), std::string::npos) << message;
}

TEST(SafetensorsCorrupt, HugeOrPastTheEndHeaderLengthsAreRejectedWithoutAllocating) {
  ScratchDir dir;
  expect_rejected(dir, le64(~uint64_t{0}) + "{}", "over the 100000000-byte limit");
  expect_rejected(dir, le64(uint64_t{1} << 40) + "{}", "over the 100000000-byte limit");
  expect_rejected(dir, le64(1000) + "{}", "only 2 follow it");
  expect_rejected(dir, le64(0), "too short for a JSON object");
}

TEST(SafetensorsCorrupt, PickleAndZipFilesAreRefusedNeverUnpickled) {
  ScratchDir dir;
  // The start of a legacy torch.save file: protocol 2, then the magic number.
  const std::string pickle = std::string("\x80\x02\x8a\x0a", 4) + "l\xfc\x9c" "F\xf9 j\xa8" "P\x19.";
  expect_rejected(dir, pickle,
                  "pickle/torch.save file, not safetensors; tandem loads no pickle directly");
  expect_rejected(dir, pickle, "tandem checkpoint import");
  expect_rejected(dir, std::string("PK\x03\x04\x00\x00\x08\x08\x00\x00archive/data.pkl", 26),
                  "pickle/torch.save file");
  expect_rejected(dir, std::string("\x80\x05", 2), "pickle/torch.save file");
}

TEST(SafetensorsCorrupt, NotJsonOrNotAnObjectIsRejected) {
  ScratchDir dir;
  expect_rejected(dir, safetensors_bytes("[1, 2]", ""), "does not start with '{'");
  expect_rejected(dir, safetensors_bytes("GGUF....", ""), "does not start with '{'");
  expect_rejected(dir, safetensors_bytes("{\"a\": ", ""), "not valid JSON");
  expect_rejected(dir, safetensors_bytes("{} {}", ""), "not valid JSON");
  expect_rejected(dir, safetensors_bytes("{\"\xff\": 1}", ""), "not valid JSON");  // not UTF-8
  expect_rejected(dir, le64(8) + std::string("{}\0\0\0\0\0\0", 8), "NUL byte");
}

struct BadHeader {
  const char* header;
  int data_bytes;
  const char* expected;
};

TEST(SafetensorsCorrupt, InvalidEntriesAreRejectedWithTheReason) {
  const BadHeader cases[] = {
      // duplicates: a DOM parser would silently keep the last one
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2, "names 'a' twice"},
      {R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, "field 'dtype' twice"},
      {R"({"__metadata__":{"k":"1","k":"2"}})", 0, "key 'k' twice"},
      {R"({"__metadata__":{},"__metadata__":{}})", 0, "twice"},
      // entry shape
      {R"({"a":[1,2]})", 0, "must be an object {dtype, shape, data_offsets}"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1}})", 1, "unknown field 'extra'"},
      {R"({"a":{"dtype":"U8","shape":[1]}})", 1, "has no 'data_offsets'"},
      // dtypes
      {R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1, "tandem does not read yet"},
      {R"({"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}})", 3, "tandem does not read yet"},
      {R"({"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8, "tandem does not read yet"},
      {R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,1]}})", 1, "needs 2 bytes but its data_offsets span 1"},
      {R"({"a":{"dtype":"U64","shape":[1],"data_offsets":[0,4]}})", 4, "needs 8 bytes but its data_offsets span 4"},
      {R"({"a":{"dtype":"X32","shape":[1],"data_offsets":[0,4]}})", 4, "unknown dtype 'X32'"},
      {R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4, "'dtype' must be a string"},
      // shapes
      {R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0, "negative 'shape'"},
      {R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1, "'shape' must be an array of non-negative integers"},
      {R"({"a":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})", 1, "'shape' must be an array"},
      {R"({"a":{"dtype":"U8","shape":"1","data_offsets":[0,1]}})", 1, "'shape' must be an array"},
      {R"({"a":{"dtype":"F64","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8, "overflows 64 bits"},
      {R"({"a":{"dtype":"F64","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})", 0, "overflows 64 bits"},
      {R"({"a":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,1]}})", 1, "non-integer"},
      // data_offsets
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1, "has 1 data_offsets"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 1, "more than two data_offsets"},
      {R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[1,0]}})", 1, "begin > end"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1, "negative 'data_offsets'"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "needs 8 bytes but its data_offsets span 4"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 2, "ends at byte 4 of a data section of 2"},
      // tiling: overlaps, holes, trailing bytes
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6, "overlap"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4, "overlap"},
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})", 6, "hole of 2 bytes"},
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 5, "trailing bytes"},
      // metadata
      {R"({"__metadata__":{"k":1}})", 0, "__metadata__ value 'k' must be a string"},
      {R"({"__metadata__":[]})", 0, "__metadata__ must be an object"},
      {R"({"__metadata__":{"k":{"x":"y"}}})", 0, "must be a string"},
      // tandem's checksums
      {R"({"__metadata__":{"tandem.crc32c":"{\"__header__\":\"00000000\",\"b\":\"00000000\"}"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, "checksum for tensor 'b', which the file does not hold"},
      {R"({"__metadata__":{"tandem.crc32c":"{\"__header__\":\"00000000\"}"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, "no checksum for tensor 'a'"},
      {R"({"__metadata__":{"tandem.crc32c":"{\"a\":\"0000000G\"}"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, "not 8 lowercase hex digits"},
      {R"({"__metadata__":{"tandem.crc32c":"[1]"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, "must be a JSON object of strings"},
      {R"({"__metadata__":{"tandem.crc32c":"{\"__header__\":\"00000000\",\"a\":\"00000000\"}"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, "header's checksum does not match"},
      {R"({"__metadata__":{"tandem/crc32c":"{}"}})", 0, "one bit away from 'tandem.crc32c'"},
  };
  ScratchDir dir;
  for (const auto& c : cases) {
    expect_rejected(dir, safetensors_bytes(c.header, std::string(c.data_bytes, '\1')), c.expected,
                    c.header);
  }
}

TEST(SafetensorsCorrupt, FilesFromOtherWritersHaveNoChecksumsAndReadUnchecked) {
  ScratchDir dir;
  const std::string path = dir.file("foreign.safetensors");
  write_bytes(path, safetensors_bytes(
                        R"({"__metadata__":{"format":"pt"},"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                        R"("a":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})",
                        std::string("\x01\x00\xff\xff", 4)));
  SafetensorsReader reader(path);
  EXPECT_FALSE(reader.has_checksums());
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  EXPECT_TRUE(at::equal(reader.read("a"), at::tensor({1, -1}, at::kShort)));
  EXPECT_EQ(reader.read("e").numel(), 0);
}

TEST(SafetensorsCorrupt, MissingFilesAndDirectoriesAreCheckpointErrors) {
  ScratchDir dir;
  const std::string missing = dir.file("nope.safetensors");
  std::string message = open_and_read_all(missing);
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  EXPECT_NE(message.find("No such file"), std::string::npos) << message;
  message = open_and_read_all(dir.path());
  EXPECT_NE(message.find("is not a regular file"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem
