// tandem's safetensors writer and reader: round trips, the stream writer's
// contract, and I/O failures. Corrupt input: test_safetensors_corrupt.cpp.

#include "tandem/checkpoint/safetensors.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_test_util.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::formula_specs;
using testing::formula_tensor;
using testing::ScratchDir;

bool exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

// Restores the default chunk size when a test shrinks it.
struct ChunkBytes {
  explicit ChunkBytes(int64_t bytes) : previous(detail::set_safetensors_chunk_bytes(bytes)) {}
  ~ChunkBytes() { detail::set_safetensors_chunk_bytes(previous); }
  int64_t previous;
};

TEST(Safetensors, RoundTripsEveryDtypeIncludingZeroDimAndEmpty) {
  ScratchDir dir;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& spec : formula_specs()) {
    tensors.emplace_back(spec.name, formula_tensor(spec.dtype, spec.shape));
  }
  const std::string path = dir.file("all.safetensors");
  const SafetensorsWriteResult written = write_safetensors(path, tensors);

  SafetensorsReader reader(path);
  EXPECT_TRUE(reader.has_checksums());
  EXPECT_EQ(reader.file_size(), written.bytes);
  EXPECT_EQ(reader.header_crc32c(), written.header_crc32c);
  ASSERT_EQ(reader.entries().size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    const SafetensorsEntry* entry = reader.find(name);
    ASSERT_NE(entry, nullptr) << name;
    EXPECT_EQ(entry->dtype, expected.scalar_type()) << name;
    EXPECT_EQ(entry->shape, expected.sizes().vec()) << name;
    EXPECT_EQ(entry->numel(), expected.numel()) << name;
    const at::Tensor got = reader.read(name);
    EXPECT_EQ(got.scalar_type(), expected.scalar_type()) << name;
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_TRUE(at::equal(got, expected)) << name;
  }
}

TEST(Safetensors, EntriesAreInDataOrderAndTileTheDataSection) {
  ScratchDir dir;
  const std::string path = dir.file("order.safetensors");
  write_safetensors(path, {{"z", at::ones({3})}, {"a", at::ones({2}, at::kDouble)}});
  SafetensorsReader reader(path);
  ASSERT_EQ(reader.entries().size(), 2u);
  EXPECT_EQ(reader.entries()[0].name, "z");
  EXPECT_EQ(reader.entries()[0].data_begin, 0);
  EXPECT_EQ(reader.entries()[0].data_end, 12);
  EXPECT_EQ(reader.entries()[1].data_begin, 12);
  EXPECT_EQ(reader.entries()[1].data_end, 28);
}

TEST(Safetensors, NonContiguousTensorsAreWrittenInRowMajorOrder) {
  ScratchDir dir;
  const at::Tensor base = formula_tensor(at::kFloat, {6, 10});
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"transposed", base.t()},
      {"strided", base.slice(1, 0, 10, 3)},
      {"expanded", at::arange(4, at::kLong).expand({5, 4})},
      {"big_contiguous", formula_tensor(at::kInt, {100})},
      {"fp8_transposed", formula_tensor(at::kFloat8_e4m3fn, {6, 10}).t()},
      {"u64_strided", formula_tensor(at::kUInt64, {6, 10}).slice(1, 0, 10, 3)},
  };
  // A 32-byte chunk makes the writer split rows, single rows and elements.
  for (int64_t chunk : {int64_t{32}, int64_t{64} << 20}) {
    ChunkBytes seam(chunk);
    const std::string path = dir.file("strided_" + std::to_string(chunk) + ".safetensors");
    write_safetensors(path, tensors);
    SafetensorsReader reader(path);
    for (const auto& [name, expected] : tensors) {
      EXPECT_TRUE(at::equal(reader.read(name), expected.contiguous())) << name << " chunk " << chunk;
    }
  }
}

TEST(Safetensors, HeaderIsSpacePaddedSoTheDataSectionIsEightByteAligned) {
  ScratchDir dir;
  const std::string path = dir.file("aligned.safetensors");
  for (int len = 1; len <= 9; ++len) {  // names of every length modulo 8
    write_safetensors(path, {{std::string(len, 'x'), at::ones({1}, at::kByte)}}, {{"k", "v"}});
    const std::string bytes = testing::read_bytes(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    EXPECT_EQ((8 + n) % 8, 0u);
    EXPECT_EQ(bytes.size(), 8 + n + 1);
    const std::string header = bytes.substr(8, n);
    const auto json = nlohmann::json::parse(header);  // trailing spaces are JSON whitespace
    const auto crcs = nlohmann::json::parse(json["__metadata__"]["tandem.crc32c"].get<std::string>());
    EXPECT_EQ(crcs[std::string(len, 'x')].get<std::string>().size(), 8u);
    EXPECT_EQ(json["__metadata__"]["k"], "v");
  }
}

TEST(Safetensors, UserMetadataRoundTripsAndTandemKeysAreReserved) {
  ScratchDir dir;
  const std::string path = dir.file("meta.safetensors");
  write_safetensors(path, {{"w", at::ones({2})}}, {{"format", "pt"}, {"step", "40"}});
  SafetensorsReader reader(path);
  EXPECT_EQ(reader.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"step", "40"}}));
  EXPECT_THROW(write_safetensors(dir.file("bad.safetensors"), {{"w", at::ones({2})}},
                                 {{"tandem.crc32c", "{}"}}),
               UsageError);
  EXPECT_FALSE(exists(dir.file("bad.safetensors")));
}

TEST(Safetensors, WriterRejectsReservedAndDuplicateNamesAndUnsupportedDtypes) {
  ScratchDir dir;
  const std::string path = dir.file("x.safetensors");
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", at::ones({1})}}), UsageError);
  EXPECT_THROW(write_safetensors(path, {{"a", at::ones({1})}, {"a", at::ones({1})}}), UsageError);
  EXPECT_THROW(write_safetensors(path, {{"c", at::ones({1}, at::kComplexFloat)}}), UsageError);
  EXPECT_THROW(write_safetensors(path, {{std::string("\xff\xfe"), at::ones({1})}}), UsageError);
  EXPECT_THROW(safetensors_dtype_name(at::kComplexDouble), UsageError);
  EXPECT_THROW(safetensors_dtype_name(at::kFloat4_e2m1fn_x2), UsageError);  // F4 counts halves
  EXPECT_THROW(safetensors_dtype_name(at::kUInt4), UsageError);
  EXPECT_STREQ(safetensors_dtype_name(at::kBFloat16), "BF16");
  EXPECT_STREQ(safetensors_dtype_name(at::kUInt16), "U16");
  EXPECT_STREQ(safetensors_dtype_name(at::kFloat8_e4m3fn), "F8_E4M3");
  EXPECT_STREQ(safetensors_dtype_name(at::kFloat8_e8m0fnu), "F8_E8M0");
  EXPECT_FALSE(exists(path));
}

TEST(SafetensorsStreamWriter, WrongNameOrderIsUsageErrorAndTheWriterCarriesOn) {
  ScratchDir dir;
  const std::string path = dir.file("stream.safetensors");
  SafetensorsStreamWriter writer(path, {{"a", at::kFloat, {2, 3}}, {"b", at::kLong, {4}}});
  EXPECT_THROW(writer.write("b", at::ones({4}, at::kLong)), UsageError);
  EXPECT_THROW(writer.write("a", at::ones({2, 3}, at::kDouble)), UsageError);  // dtype
  EXPECT_THROW(writer.write("a", at::ones({7})), UsageError);                 // numel
  EXPECT_THROW(writer.finish(), UsageError);                                  // incomplete
  writer.write("a", formula_tensor(at::kFloat, {6}));  // same numel, other shape
  writer.write("b", formula_tensor(at::kLong, {4}));
  EXPECT_THROW(writer.write("c", at::ones({1})), UsageError);
  writer.finish(/*sync=*/false);
  EXPECT_THROW(writer.finish(), UsageError);

  SafetensorsReader reader(path);
  EXPECT_EQ(reader.find("a")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(at::equal(reader.read("a"), formula_tensor(at::kFloat, {2, 3})));
  EXPECT_TRUE(at::equal(reader.read("b"), formula_tensor(at::kLong, {4})));
}

TEST(SafetensorsStreamWriter, UnfinishedWriterRemovesItsFile) {
  ScratchDir dir;
  const std::string path = dir.file("partial.safetensors");
  {
    SafetensorsStreamWriter writer(path, {{"a", at::kFloat, {1000}}, {"b", at::kFloat, {1}}});
    writer.write("a", at::ones({1000}));
    EXPECT_TRUE(exists(path));
  }
  EXPECT_FALSE(exists(path));
}

TEST(SafetensorsReader, ReadIntoFillsAMatchingTensorAndRejectsOthers) {
  ScratchDir dir;
  const std::string path = dir.file("into.safetensors");
  write_safetensors(path, {{"w", formula_tensor(at::kHalf, {4, 4})}});
  SafetensorsReader reader(path);
  at::Tensor dst = at::empty({16}, at::kHalf);
  reader.read_into("w", dst);
  EXPECT_TRUE(at::equal(dst, formula_tensor(at::kHalf, {16})));
  EXPECT_THROW(reader.read_into("w", at::empty({16}, at::kFloat)), UsageError);
  EXPECT_THROW(reader.read_into("w", at::empty({15}, at::kHalf)), UsageError);
  EXPECT_THROW(reader.read_into("w", at::empty({4, 8}, at::kHalf).slice(1, 0, 8, 2)), UsageError);
}

TEST(SafetensorsReader, MissingTensorErrorNamesTheFileAndSimilarNames) {
  ScratchDir dir;
  const std::string path = dir.file("names.safetensors");
  write_safetensors(path, {{"model.weight", at::ones({1})}, {"model.bias", at::ones({1})}});
  SafetensorsReader reader(path);
  EXPECT_EQ(reader.find("modle.weight"), nullptr);
  try {
    reader.read("model.wieght");
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'model.weight'"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsReader, IsMovableAndKeepsReading) {
  ScratchDir dir;
  const std::string path = dir.file("move.safetensors");
  write_safetensors(path, {{"w", at::ones({3})}});
  SafetensorsReader a(path);
  SafetensorsReader b(std::move(a));
  std::vector<SafetensorsReader> readers;
  readers.push_back(std::move(b));
  EXPECT_TRUE(at::equal(readers[0].read("w"), at::ones({3})));
}

// RLIMIT_FSIZE makes writes past 4 KiB fail with EFBIG (SIGXFSZ ignored), as a
// full disk fails them with ENOSPC: the same path through the writer.
TEST(SafetensorsStreamWriter, FileTooLargeIsCheckpointErrorAndLeavesNoFile) {
  ScratchDir dir;
  const std::string path = dir.file("big.safetensors");
  const at::Tensor big = at::ones({1 << 18});  // 1 MiB
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int code = 3;
    try {
      write_safetensors(path, {{"small", at::ones({4})}, {"big", big}});
      code = 2;
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      code = what.find(path) != std::string::npos && what.find("File too large") != std::string::npos
                 ? 0
                 : 4;
      if (code != 0) std::fprintf(stderr, "%s\n", e.what());
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: no error, 3: another exception, 4: unhelpful message";
  EXPECT_FALSE(exists(path));
}

TEST(SafetensorsStreamWriter, NonRegularTargetIsRefusedAndNotUnlinked) {
  EXPECT_THROW(write_safetensors("/dev/null", {{"w", at::ones({1})}}), CheckpointError);
  EXPECT_TRUE(exists("/dev/null"));
  ScratchDir dir;
  EXPECT_THROW(write_safetensors(dir.file("missing/x.safetensors"), {{"w", at::ones({1})}}),
               CheckpointError);
}

}  // namespace
}  // namespace tandem
