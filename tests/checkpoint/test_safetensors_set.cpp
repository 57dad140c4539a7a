// Range reads of one tensor, and SafetensorsSet: one file or a Hugging Face
// index of shards read as one, with the index checked before anything is
// read; the shard-writing helpers (sizes, split, index text).

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "checkpoint/safetensors_test_util.h"
#include "tandem/checkpoint/module_weights.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/safetensors_set.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem {
namespace {

using testing::ScratchDir;

// The message of the CheckpointError or UsageError `fn` throws ("" if none).
template <typename Error, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void write_text(const std::string& path, const std::string& text) {
  testing::write_bytes(path, text);
}

TEST(SafetensorsRangeRead, ReadsOnlyTheBytesOfTheRange) {
  ScratchDir dir;
  const auto w = torch::arange(1000, torch::kFloat).reshape({40, 25});
  write_safetensors(dir.file("a.safetensors"), {{"w", w}, {"b", torch::ones({7})}});
  SafetensorsReader reader(dir.file("a.safetensors"));
  auto dst = torch::empty({123});
  reader.read_range_into("w", 301, dst);
  EXPECT_TRUE(torch::equal(dst, torch::arange(301, 424, torch::kFloat)));
  EXPECT_EQ(reader.bytes_read(), 123 * 4);
  // Converted through the staging buffer, into a non-contiguous destination.
  auto doubles = torch::zeros({10, 4}, torch::kDouble).t();
  reader.read_range_into("w", 960, doubles);
  EXPECT_TRUE(torch::equal(doubles.contiguous().view({-1}),
                           torch::arange(960, 1000, torch::kDouble)));
  EXPECT_EQ(reader.bytes_read(), (123 + 40) * 4);
}

TEST(SafetensorsRangeRead, SmallStagingBufferStillConvertsEveryElement) {
  ScratchDir dir;
  const auto w = torch::randn({1001}).to(torch::kBFloat16);
  write_safetensors(dir.file("a.safetensors"), {{"w", w}});
  SafetensorsReader reader(dir.file("a.safetensors"));
  const int64_t previous = detail::set_safetensors_chunk_bytes(64);
  auto dst = torch::empty({999});
  reader.read_range_into("w", 1, dst);
  detail::set_safetensors_chunk_bytes(previous);
  EXPECT_TRUE(torch::equal(dst, w.narrow(0, 1, 999).to(torch::kFloat)));
  EXPECT_EQ(reader.bytes_read(), 999 * 2);
}

TEST(SafetensorsRangeRead, RefusesRangesOutsideTheTensorAndLossyKinds) {
  ScratchDir dir;
  write_safetensors(dir.file("a.safetensors"), {{"w", torch::ones({10})}});
  SafetensorsReader reader(dir.file("a.safetensors"));
  EXPECT_NE(error_of<UsageError>([&] { reader.read_range_into("w", 8, torch::empty({3})); })
                .find("lie outside"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>(
                [&] { reader.read_range_into("w", 0, torch::empty({3}, torch::kLong)); })
                .find("converts only between floating types"),
            std::string::npos);
  EXPECT_NE(error_of<CheckpointError>([&] { reader.read_range_into("x", 0, torch::empty({1})); })
                .find("has no tensor 'x'"),
            std::string::npos);
  EXPECT_EQ(reader.bytes_read(), 0);
}

// tandem's CRC-32C covers whole tensors: a whole-range read is verified, a
// partial one cannot be (documented in safetensors.h and docs/checkpoints.md).
TEST(SafetensorsRangeRead, WholeRangesAreChecksumVerifiedPartialOnesAreNot) {
  ScratchDir dir;
  const std::string path = dir.file("a.safetensors");
  write_safetensors(path, {{"w", torch::zeros({16})}});
  std::string bytes = testing::read_bytes(path);
  bytes[bytes.size() - 1] ^= 0x40;  // the last element's top byte
  testing::write_bytes(path, bytes);
  SafetensorsReader reader(path);
  EXPECT_NE(error_of<CheckpointError>([&] { reader.read_range_into("w", 0, torch::empty({16})); })
                .find("fails its checksum"),
            std::string::npos);
  auto part = torch::empty({4});
  reader.read_range_into("w", 12, part);  // unverified: returns what the disk holds
  EXPECT_NE(part[3].item<float>(), 0.0f);
}

// A set of three shards and its index, from one model's tensors.
struct ShardedFixture {
  ScratchDir dir;
  std::map<std::string, torch::Tensor> tensors = {{"a.weight", torch::randn({3, 5})},
                                                  {"a.bias", torch::randn({3})},
                                                  {"b.weight", torch::randn({4, 3})},
                                                  {"c", torch::arange(6, torch::kLong)}};
  std::map<std::string, std::string> weight_map = {
      {"a.weight", "model-00001-of-00003.safetensors"},
      {"a.bias", "model-00001-of-00003.safetensors"},
      {"b.weight", "model-00002-of-00003.safetensors"},
      {"c", "model-00003-of-00003.safetensors"}};

  ShardedFixture() {
    std::map<std::string, std::vector<std::pair<std::string, torch::Tensor>>> files;
    for (const auto& [name, file] : weight_map) files[file].emplace_back(name, tensors[name]);
    for (const auto& [file, part] : files) write_safetensors(dir.file(file), part);
    write_index(weight_map);
  }
  void write_index(const std::map<std::string, std::string>& map) const {
    write_text(dir.file(kSafetensorsIndexName), safetensors_index_json(map, 60 + 12 + 48 + 48));
  }
};

TEST(SafetensorsSet, ReadsAShardedSetByIndexOrDirectoryLikeOneFile) {
  ShardedFixture f;
  for (const std::string& path : {f.dir.file(kSafetensorsIndexName), f.dir.path()}) {
    SafetensorsSet set(path);
    EXPECT_TRUE(set.indexed());
    EXPECT_EQ(set.files().size(), 3u);
    ASSERT_EQ(set.entries().size(), 4u);
    for (const auto& [name, t] : f.tensors) EXPECT_TRUE(torch::equal(set.read(name), t)) << name;
    auto part = torch::empty({2});
    set.read_range_into("b.weight", 5, part);
    EXPECT_TRUE(torch::equal(part, f.tensors["b.weight"].view({-1}).narrow(0, 5, 2)));
  }
}

TEST(SafetensorsSet, ADirectoryPrefersModelSafetensorsAsTransformersDoes) {
  ShardedFixture f;
  write_safetensors(f.dir.file(kSafetensorsWeightsName), {{"only", torch::ones({2})}});
  SafetensorsSet set(f.dir.path());
  EXPECT_FALSE(set.indexed());
  ASSERT_EQ(set.entries().size(), 1u);
  EXPECT_EQ(set.entries().front()->name, "only");
}

TEST(SafetensorsSet, LoadSafetensorsTakesTheDirectoryOfAShardedSet) {
  ShardedFixture f;
  // Module paths "a.weight", "b.weight"; "c" is unexpected, so not strict.
  struct Model : torch::nn::Module {
    Model() {
      a = register_module("a", torch::nn::Linear(5, 3));
      b = register_module("b", torch::nn::Linear(torch::nn::LinearOptions(3, 4).bias(false)));
    }
    torch::nn::Linear a{nullptr}, b{nullptr};
  };
  Model model;
  LoadSafetensorsOptions options;
  options.strict = false;
  const LoadSafetensorsResult result = load_safetensors(model, f.dir.path(), options);
  EXPECT_EQ(result.unexpected, std::vector<std::string>{"c"});
  EXPECT_TRUE(torch::equal(model.a->weight, f.tensors["a.weight"]));
  EXPECT_TRUE(torch::equal(model.b->weight, f.tensors["b.weight"]));
  EXPECT_EQ(result.bytes_read, 60 + 12 + 48);
}

TEST(SafetensorsSet, AMissingShardIsNamedWithWhatToDo) {
  ShardedFixture f;
  fs::remove(f.dir.file("model-00002-of-00003.safetensors"));
  const std::string e =
      error_of<CheckpointError>([&] { SafetensorsSet set(f.dir.path()); });
  EXPECT_NE(e.find("model-00002-of-00003.safetensors (1 tensor(s), such as 'b.weight')"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("Copy or download every shard"), std::string::npos) << e;
}

TEST(SafetensorsSet, ANameMappedToAFileThatLacksItIsRefused) {
  ShardedFixture f;
  auto map = f.weight_map;
  map["b.weight"] = "model-00003-of-00003.safetensors";
  f.write_index(map);
  const std::string e =
      error_of<CheckpointError>([&] { SafetensorsSet set(f.dir.path()); });
  EXPECT_NE(e.find("'b.weight' -> model-00003-of-00003.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("regenerate it"), std::string::npos) << e;
}

TEST(SafetensorsSet, ShardPathsThatLeaveTheDirectoryAreRefused) {
  ShardedFixture f;
  for (const char* bad : {"../model-00001-of-00003.safetensors", "/etc/passwd",
                                 "sub/../../x.safetensors", ""}) {
    auto map = f.weight_map;
    map["a.bias"] = bad;
    f.write_index(map);
    const std::string e =
        error_of<CheckpointError>([&] { SafetensorsSet set(f.dir.path()); });
    EXPECT_NE(e.find("leaves the index's directory"), std::string::npos) << bad << ": " << e;
  }
}

TEST(SafetensorsSet, MalformedIndexesAndAmbiguousDirectoriesAreExplained) {
  ScratchDir dir;
  write_text(dir.file(kSafetensorsIndexName), "{\"weight_map\": ");
  EXPECT_NE(error_of<CheckpointError>([&] { SafetensorsSet set(dir.path()); })
                .find("is not valid JSON"),
            std::string::npos);
  write_text(dir.file(kSafetensorsIndexName), "{\"metadata\": {}}");
  EXPECT_NE(error_of<CheckpointError>([&] { SafetensorsSet set(dir.path()); })
                .find("no \"weight_map\""),
            std::string::npos);
  ScratchDir two;
  write_safetensors(two.file("x.safetensors"), {{"x", torch::ones({1})}});
  write_safetensors(two.file("y.safetensors"), {{"y", torch::ones({1})}});
  EXPECT_NE(error_of<CheckpointError>([&] { SafetensorsSet set(two.path()); })
                .find("ambiguous"),
            std::string::npos);
  EXPECT_NE(error_of<CheckpointError>([&] { SafetensorsSet set(two.file("nope")); })
                .find("does not exist"),
            std::string::npos);
}

TEST(SafetensorsShards, SizesAreReadAsHuggingFaceWritesThem) {
  EXPECT_EQ(parse_byte_size("2GB"), 2'000'000'000);
  EXPECT_EQ(parse_byte_size("500MB"), 500'000'000);
  EXPECT_EQ(parse_byte_size("10KB"), 10'000);
  EXPECT_EQ(parse_byte_size("1GiB"), int64_t{1} << 30);
  EXPECT_EQ(parse_byte_size("64mib"), int64_t{64} << 20);
  EXPECT_EQ(parse_byte_size("1000"), 1000);
  EXPECT_EQ(parse_byte_size("1000B"), 1000);
  for (const char* bad : {"", "GB", "0", "-1GB", "1.5GB", "2 GB", "2XB", "99999999999999999999"}) {
    EXPECT_NE(error_of<UsageError>([&] { parse_byte_size(bad); }).find("is not a size"),
              std::string::npos)
        << bad;
  }
}

TEST(SafetensorsShards, SplitFollowsHuggingFaceBigTensorsAlone) {
  // Limit 10: [4, 5] fit, 3 overflows, 12 goes alone while [3, 6] fills on.
  const auto shards = plan_safetensors_shards({4, 5, 3, 12, 6, 1}, 10);
  const std::vector<std::vector<std::size_t>> expected = {{0, 1}, {3}, {2, 4, 5}};
  EXPECT_EQ(shards, expected);
  EXPECT_EQ(safetensors_shard_file_name(2, 13), "model-00002-of-00013.safetensors");
  EXPECT_EQ(safetensors_index_json({{"b", "f2"}, {"a", "f1"}}, 7),
            "{\n  \"metadata\": {\n    \"total_size\": 7\n  },\n  \"weight_map\": {\n    \"a\": "
            "\"f1\",\n    \"b\": \"f2\"\n  }\n}\n");
}

}  // namespace
}  // namespace tandem
