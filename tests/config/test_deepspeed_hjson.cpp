// DeepSpeed loads its config file with hjson (DeepSpeedConfig), so a file
// DeepSpeed trains with may have comments, trailing commas and line breaks
// for commas. tandem reads those as DeepSpeed does, keeps every position for
// its messages, and still refuses what hjson refuses. The corpus files
// ds_hjson_*.json run through DeepSpeed itself in tests/config/conformance.py.

#include <gtest/gtest.h>

#include "config_testing.h"

namespace tandem {
namespace {

using testing::config_data;
using testing::contains;
using testing::parse_error;

TEST(DeepSpeedHjson, TrailingCommasAreAcceptedAsDeepSpeedAcceptsThem) {
  const Config c = parse_config_text(R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "zero_optimization": {"stage": 2,},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.99,],},},
  "bf16": {"enabled": true},
}
)", "ds.json");
  EXPECT_EQ(c.format, ConfigFormat::kDeepSpeedJson);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.optimizer.beta2, 0.99);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kBf16);
  // A comma and a comment between the last value and the bracket.
  EXPECT_EQ(parse_config_text("{\"steps_per_print\": 10, // every ten\n}\n", "ds.json")
                .steps_per_print,
            10);
}

TEST(DeepSpeedHjson, HashSlashAndBlockCommentsAreIgnoredEvenBeforeTheBrace) {
  const Config c = parse_config_text(R"(# written by hand
// a second line of comment
/* and a block
   over two lines */
{
  # hash comment
  "train_micro_batch_size_per_gpu": 4, # after a value
  "tensorboard": {"enabled": true, "job_name": "run#1//a/*b*/"}, // after a block
  "zero_optimization": {"stage": /* inline */ 1}
}
)", "ds.json");
  // Read as DeepSpeed JSON, not as tandem YAML, though it starts with '#'.
  EXPECT_EQ(c.format, ConfigFormat::kDeepSpeedJson);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.tensorboard.job_name, "run#1//a/*b*/");  // not comments inside a string
  EXPECT_EQ(c.zero.stage, 1);
}

TEST(DeepSpeedHjson, ALineBreakSeparatesMembersAndElementsWithoutACommaAsInHjson) {
  const Config c = parse_config_text(R"({
  # hash comment
  "train_micro_batch_size_per_gpu": 4
  "gradient_accumulation_steps": 2
  "optimizer": {"type": "AdamW", "params": {"betas": [
    0.9
    0.95
  ]}}
  "zero_optimization": {"stage": 1}
  "wall_clock_breakdown": false
}
)", "ds.json");
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.zero.stage, 1);
  EXPECT_FALSE(c.wall_clock_breakdown);
}

TEST(DeepSpeedHjson, MessagesPointIntoTheFileAsWritten) {
  // The comma added after 4 and the blanked comments move no token.
  const std::string bad_value = parse_error(R"({
  "train_micro_batch_size_per_gpu": 4 # no comma here
  /* c */ "gradient_accumulation_steps": "two",
}
)", "ds.json");
  EXPECT_TRUE(contains(bad_value, "ds.json:3:42: gradient_accumulation_steps:")) << bad_value;
  const std::string typo = parse_error("{\n  # c\n  \"stpes_per_print\": 1,\n}\n", "ds.json");
  EXPECT_TRUE(contains(typo, "ds.json:3:3: stpes_per_print: unknown key")) << typo;
}

TEST(DeepSpeedHjson, WhatHjsonRefusesStaysMalformed) {
  // hjson 3.1 refuses each of these too.
  for (const char* text : {R"({,})", R"({"steps_per_print": 1,, "seed": 2})",
                           R"({, "steps_per_print": 1})",
                           R"({"optimizer": {"params": {"betas": [0.9,, 0.99]}}})",
                           R"({"steps_per_print": 1 "wall_clock_breakdown": true})"}) {
    EXPECT_TRUE(contains(parse_error(text, "ds.json"), "ds.json:1:")) << text;
    EXPECT_TRUE(contains(parse_error(text, "ds.json"), "malformed JSON")) << text;
  }
  // hjson's quoteless keys are not read: the message says what tandem reads.
  const std::string unquoted = parse_error("{\n  steps_per_print: 1\n}\n", "ds.json");
  EXPECT_TRUE(contains(unquoted, "ds.json:2:")) << unquoted;
  EXPECT_TRUE(contains(unquoted, "keys and strings in double quotes")) << unquoted;
  // An unterminated block comment is reported, not swallowed.
  EXPECT_TRUE(contains(parse_error("{\"steps_per_print\": 1 /* open\n}\n", "ds.json"),
                       "malformed JSON"));
}

TEST(DeepSpeedHjson, CorpusFilesReadLikeDeepSpeed) {
  const Config trailing = load_config_file(config_data("ds_hjson_trailing_commas.json"));
  EXPECT_EQ(trailing.zero.stage, 2);
  EXPECT_EQ(trailing.mixed_precision, MixedPrecision::kBf16);
  const Config comments = load_config_file(config_data("ds_hjson_comments_no_commas.json"));
  EXPECT_EQ(comments.format, ConfigFormat::kDeepSpeedJson);
  EXPECT_EQ(comments.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(comments.gradient_accumulation_steps, 2);
  EXPECT_EQ(comments.zero.stage, 1);
}

}  // namespace
}  // namespace tandem
