// Accelerate's `distributed_type: FSDP` and its fsdp_config, mapped onto
// tandem's ZeRO and HSDP settings (src/config/accelerate_fsdp.cpp): every
// sharding strategy by name and number, FSDP1 and FSDP2, offload,
// activation checkpointing, prefetch, the keys tandem does not follow (a
// warning naming each), bad values and unknown keys (an error at the value's
// line and column).

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "config_testing.h"

namespace tandem {
namespace accelerate_fsdp_test {

using testing::contains;
using testing::parse_error;
using testing::warned_keys;

// An FSDP file with `body` as its fsdp_config entries (two-space indented).
std::string fsdp_file(const std::string& body, const std::string& top = "") {
  return "distributed_type: FSDP\nnum_processes: 4\n" + top + "fsdp_config:\n" + body;
}

Config fsdp(const std::string& body, const std::string& top = "") {
  return parse_config_text(fsdp_file(body, top), "a.yaml");
}

std::string fsdp_error(const std::string& body, const std::string& top = "") {
  return parse_error(fsdp_file(body, top), "a.yaml");
}

struct Strategy {
  std::string name;
  int number;
  int stage;
  int hpz;
};

const std::vector<Strategy> kStrategies = {{"FULL_SHARD", 1, 3, 1},
                                           {"SHARD_GRAD_OP", 2, 2, 1},
                                           {"NO_SHARD", 3, 0, 1},
                                           {"HYBRID_SHARD", 4, 3, kHpzRanksPerHost},
                                           {"HYBRID_SHARD_ZERO2", 5, 2, kHpzRanksPerHost}};

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

TEST(AccelerateFsdp, EachShardingStrategyMapsOntoAZeroStageByNameAnyCaseAndByNumber) {
  for (const auto& s : kStrategies) {
    for (const std::string& value :
         {s.name, lower(s.name), std::to_string(s.number), "'" + std::to_string(s.number) + "'"}) {
      const Config c = fsdp("  fsdp_sharding_strategy: " + value + "\n");
      EXPECT_EQ(c.distributed_type, DistributedType::kFsdp);
      EXPECT_EQ(c.zero.stage, s.stage) << value;
      EXPECT_EQ(c.zero.hpz_partition_size, s.hpz) << value;
      EXPECT_TRUE(c.warnings.empty()) << value << ": " << c.warnings.front();
    }
  }
  // torch's own name for the fifth.
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: _HYBRID_SHARD_ZERO2\n").zero.stage, 2);
  // No fsdp_config at all, or an empty one: FSDP1's default, FULL_SHARD.
  EXPECT_EQ(parse_config_text("distributed_type: FSDP\n", "a.yaml").zero.stage, 3);
  EXPECT_EQ(fsdp("  {}\n").zero.stage, 3);
}

// `accelerate config` writes FSDP1's strategy as fsdp_reshard_after_forward.
TEST(AccelerateFsdp, UnderFsdp1ReshardAfterForwardNamesTheStrategy) {
  for (const auto& s : kStrategies) {
    const Config c = fsdp("  fsdp_version: 1\n  fsdp_reshard_after_forward: " + s.name + "\n");
    EXPECT_EQ(c.zero.stage, s.stage) << s.name;
    EXPECT_EQ(c.zero.hpz_partition_size, s.hpz) << s.name;
  }
  EXPECT_EQ(fsdp("  fsdp_sharding_strategy: 2\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n")
                .zero.stage,
            2);
  const std::string both =
      fsdp_error("  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_reshard_after_forward: NO_SHARD\n");
  EXPECT_TRUE(contains(both, "a.yaml:5:31: fsdp_config.fsdp_reshard_after_forward: NO_SHARD "
                             "disagrees with fsdp_sharding_strategy: FULL_SHARD at a.yaml:4:27"))
      << both;
  const std::string flag = fsdp_error("  fsdp_reshard_after_forward: true\n");
  EXPECT_TRUE(contains(flag, "a.yaml:4:31: fsdp_config.fsdp_reshard_after_forward: under "
                             "fsdp_version 1 this names the sharding strategy"))
      << flag;
  EXPECT_TRUE(contains(flag, "write FULL_SHARD (what true means under FSDP2)")) << flag;
}

TEST(AccelerateFsdp, UnderFsdp2ReshardAfterForwardTrueIsZero3AndFalseZero2) {
  EXPECT_EQ(fsdp("  fsdp_version: 2\n").zero.stage, 3);  // FSDP2's default: true
  EXPECT_EQ(fsdp("  fsdp_version: 2\n  fsdp_reshard_after_forward: true\n").zero.stage, 3);
  EXPECT_EQ(fsdp("  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n").zero.stage, 2);
  const std::string name =
      fsdp_error("  fsdp_version: 2\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n");
  EXPECT_TRUE(contains(name, "a.yaml:5:31: fsdp_config.fsdp_reshard_after_forward: under "
                             "fsdp_version 2 this is true or false"))
      << name;
  EXPECT_TRUE(contains(name, "`accelerate to-fsdp2` rewrites a version 1 config")) << name;
  // FSDP1's strategy key means nothing to FSDP2 (Accelerate drops it).
  const Config c = fsdp("  fsdp_version: 2\n  fsdp_sharding_strategy: HYBRID_SHARD\n");
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.hpz_partition_size, 1);
  EXPECT_EQ(warned_keys(c), std::vector<std::string>{"fsdp_config.fsdp_sharding_strategy"});
}

TEST(AccelerateFsdp, HybridShardShardsInsideEachHostAndCheckPrintsTheMappedZeroSettings) {
  const Config c = fsdp("  fsdp_sharding_strategy: HYBRID_SHARD\n  fsdp_offload_params: true\n");
  const Config resolved = resolve_config(c, {}, {}, 4);
  EXPECT_TRUE(resolved.warnings.empty()) << resolved.warnings.front();
  const auto json = nlohmann::json::parse(resolved_config_json(resolved, 4));
  EXPECT_EQ(json["distributed_type"], "FSDP");
  EXPECT_EQ(json["zero_optimization"]["stage"], 3);
  EXPECT_EQ(json["zero_optimization"]["zero_hpz_partition_size"], "ranks_per_host");
  EXPECT_EQ(json["zero_optimization"]["offload_param"]["device"], "cpu");
  EXPECT_EQ(json["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  // At stage 2 too, without the note that DeepSpeed's hpZ is stage 3 only.
  const Config zero2 = resolve_config(fsdp("  fsdp_sharding_strategy: HYBRID_SHARD_ZERO2\n"), {},
                                      {}, 4);
  EXPECT_EQ(zero2.zero.stage, 2);
  EXPECT_TRUE(zero2.warnings.empty()) << zero2.warnings.front();
}

// FSDP2's HSDP: a 2-D mesh of dp_replicate_size copies of dp_shard_size
// shards (Accelerate's parallelism_config).
TEST(AccelerateFsdp, UnderFsdp2TheParallelismConfigsDataParallelSizesAskForHsdp) {
  const std::string mesh =
      "parallelism_config:\n  parallelism_config_dp_replicate_size: 2\n"
      "  parallelism_config_dp_shard_size: 2\n";
  const Config c = fsdp("  fsdp_version: 2\n", mesh);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.hpz_partition_size, 2);
  EXPECT_EQ(fsdp("  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n", mesh).zero.stage, 2);
  EXPECT_TRUE(contains(fsdp_error("  fsdp_version: 1\n", mesh),
                       "a.yaml:4:41: parallelism_config.parallelism_config_dp_replicate_size: "
                       "parallelism_config's data-parallel sizes apply to FSDP2 only"));
  EXPECT_TRUE(contains(
      fsdp_error("  fsdp_version: 2\n", "parallelism_config:\n  parallelism_config_dp_replicate_size: "
                                        "4\n  parallelism_config_dp_shard_size: 2\n"),
      "dp_replicate_size 4 * dp_shard_size 2 = 8, but num_processes is 4"));
  EXPECT_TRUE(contains(
      fsdp_error("  fsdp_version: 2\n", "parallelism_config:\n  parallelism_config_dp_replicate_size: 4\n"),
      "gives FSDP nothing to shard"));
  // One group of all the ranks is plain FSDP.
  EXPECT_EQ(fsdp("  fsdp_version: 2\n", "parallelism_config:\n  parallelism_config_dp_shard_size: 4\n")
                .zero.hpz_partition_size,
            1);
}

TEST(AccelerateFsdp, OffloadParamsOffloadsWhatTandemsZeroCanAtEachStage) {
  const Config full = fsdp("  fsdp_offload_params: true\n");
  EXPECT_EQ(full.zero.offload_param, OffloadDevice::kCpu);
  EXPECT_EQ(full.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_TRUE(full.warnings.empty());
  const Config grad_op = fsdp("  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_offload_params: true\n");
  EXPECT_EQ(grad_op.zero.offload_param, OffloadDevice::kNone);
  EXPECT_EQ(grad_op.zero.offload_optimizer, OffloadDevice::kCpu);
  ASSERT_EQ(grad_op.warnings.size(), 1u);
  EXPECT_TRUE(contains(grad_op.warnings[0], "a.yaml:5:24: 'fsdp_config.fsdp_offload_params' at "
                                            "ZeRO-2 (SHARD_GRAD_OP) keeps the optimizer state"));
  const Config none = fsdp("  fsdp_sharding_strategy: NO_SHARD\n  fsdp_offload_params: true\n");
  EXPECT_EQ(none.zero.offload_optimizer, OffloadDevice::kNone);
  EXPECT_EQ(warned_keys(none), std::vector<std::string>{"fsdp_config.fsdp_offload_params"});
  EXPECT_EQ(fsdp("  fsdp_offload_params: false\n").zero.offload_param, OffloadDevice::kNone);
}

TEST(AccelerateFsdp, ActivationCheckpointingTurnsOnTheMarkedBlocks) {
  EXPECT_TRUE(fsdp("  fsdp_activation_checkpointing: true\n").activation_checkpointing.enabled);
  EXPECT_FALSE(fsdp("  fsdp_activation_checkpointing: false\n").activation_checkpointing.enabled);
  EXPECT_FALSE(fsdp("  {}\n").activation_checkpointing.enabled);
  // Offloading the checkpointed inputs is FSDP2's, on top of checkpointing.
  EXPECT_TRUE(contains(fsdp_error("  fsdp_activation_checkpointing_offload: true\n"),
                       "needs fsdp_activation_checkpointing: true and fsdp_version: 2"));
  const Config offload = fsdp("  fsdp_version: 2\n  fsdp_activation_checkpointing: true\n"
                              "  fsdp_activation_checkpointing_offload: true\n");
  EXPECT_EQ(warned_keys(offload),
            std::vector<std::string>{"fsdp_config.fsdp_activation_checkpointing_offload"});
}

TEST(AccelerateFsdp, Fsdp1PrefetchKeysTurnTandemsPrefetchOnOrOff) {
  const int64_t on = ZeroConfig{}.stage3_prefetch_bucket_size;
  EXPECT_EQ(fsdp("  fsdp_backward_prefetch: BACKWARD_PRE\n").zero.stage3_prefetch_bucket_size, on);
  EXPECT_EQ(fsdp("  fsdp_backward_prefetch: 1\n").zero.stage3_prefetch_bucket_size, on);
  EXPECT_EQ(fsdp("  {}\n").zero.stage3_prefetch_bucket_size, on);
  const Config off = fsdp("  fsdp_backward_prefetch: NO_PREFETCH\n  fsdp_forward_prefetch: false\n");
  EXPECT_EQ(off.zero.stage3_prefetch_bucket_size, 0);
  EXPECT_TRUE(off.warnings.empty());
  const Config forward = fsdp("  fsdp_backward_prefetch: no_prefetch\n  fsdp_forward_prefetch: true\n");
  EXPECT_EQ(forward.zero.stage3_prefetch_bucket_size, on);
  EXPECT_EQ(warned_keys(forward), std::vector<std::string>{"fsdp_config.fsdp_backward_prefetch"});
  const Config post = fsdp("  fsdp_backward_prefetch: BACKWARD_POST\n");
  EXPECT_EQ(post.zero.stage3_prefetch_bucket_size, on);
  EXPECT_TRUE(contains(post.warnings.at(0), "(BACKWARD_PRE's timing)"));
  // FSDP2 drops both keys (Accelerate says so) and prefetches by itself.
  const Config v2 = fsdp("  fsdp_version: 2\n  fsdp_backward_prefetch: NO_PREFETCH\n");
  EXPECT_EQ(v2.zero.stage3_prefetch_bucket_size, on);
  EXPECT_EQ(warned_keys(v2), std::vector<std::string>{"fsdp_config.fsdp_backward_prefetch"});
  EXPECT_TRUE(contains(fsdp_error("  fsdp_backward_prefetch: 3\n"),
                       "a.yaml:4:27: fsdp_config.fsdp_backward_prefetch: expected BACKWARD_PRE, "
                       "BACKWARD_POST or NO_PREFETCH (any case, or the number of one of the first "
                       "2 (1-2)), got 3"));
}

TEST(AccelerateFsdp, CpuRamEfficientLoadingBuildsTheModelCutAtStage3) {
  EXPECT_TRUE(fsdp("  {}\n").zero.zero3_init);  // the launcher's default: true
  EXPECT_FALSE(fsdp("  fsdp_cpu_ram_efficient_loading: false\n").zero.zero3_init);
  const Config grad_op =
      fsdp("  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_cpu_ram_efficient_loading: true\n");
  EXPECT_FALSE(grad_op.zero.zero3_init);
  EXPECT_EQ(warned_keys(grad_op),
            std::vector<std::string>{"fsdp_config.fsdp_cpu_ram_efficient_loading"});
  // Accelerate's launcher refuses sync false while efficient loading is on.
  EXPECT_TRUE(contains(fsdp_error("  fsdp_sync_module_states: false\n"),
                       "a.yaml:4:28: fsdp_config.fsdp_sync_module_states: Accelerate's launcher "
                       "refuses fsdp_sync_module_states: false"));
  const Config no_sync =
      fsdp("  fsdp_cpu_ram_efficient_loading: false\n  fsdp_sync_module_states: false\n");
  EXPECT_EQ(warned_keys(no_sync), std::vector<std::string>{"fsdp_config.fsdp_sync_module_states"});
}

// What `accelerate config` writes for FSDP1 with every question answered
// away from tandem's behaviour: one warning per key tandem does not follow.
TEST(AccelerateFsdp, KeysTandemDoesNotFollowWarnOnceEachAndTheirDefaultsSayNothing) {
  const Config c = fsdp(
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
      "  fsdp_transformer_layer_cls_to_wrap: BertLayer,BertEmbeddings\n"
      "  fsdp_min_num_params: 100000000\n"
      "  fsdp_state_dict_type: FULL_STATE_DICT\n"
      "  fsdp_use_orig_params: false\n"
      "  fsdp_ignored_modules: 'encoder\\..*'\n"
      "  fsdp_cpu_ram_efficient_loading: false\n"
      "  fsdp_sync_module_states: false\n");
  EXPECT_EQ(warned_keys(c), (std::vector<std::string>{
                                "fsdp_config.fsdp_ignored_modules",
                                "fsdp_config.fsdp_state_dict_type",
                                "fsdp_config.fsdp_sync_module_states",
                                "fsdp_config.fsdp_use_orig_params"}));
  // The wrap policy is followed (the size is read only for SIZE_BASED_WRAP,
  // as Accelerate reads it).
  EXPECT_EQ(c.zero.auto_wrap_policy, "TRANSFORMER_BASED_WRAP");
  EXPECT_EQ(c.zero.auto_wrap_layer_types, (std::vector<std::string>{"BertLayer", "BertEmbeddings"}));
  const Config quiet = fsdp(
      "  fsdp_auto_wrap_policy: NO_WRAP\n"
      "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
      "  fsdp_use_orig_params: true\n"
      "  fsdp_sync_module_states: true\n"
      "  fsdp_activation_checkpointing_offload: false\n");
  EXPECT_TRUE(quiet.warnings.empty()) << quiet.warnings.front();
  // FSDP2 has no LOCAL_STATE_DICT: Accelerate refuses it, so does tandem.
  EXPECT_TRUE(contains(fsdp_error("  fsdp_version: 2\n  fsdp_state_dict_type: 2\n"),
                       "FSDP2 has no LOCAL_STATE_DICT"));
  EXPECT_EQ(warned_keys(fsdp("  fsdp_state_dict_type: LOCAL_STATE_DICT\n")),
            std::vector<std::string>{"fsdp_config.fsdp_state_dict_type"});
}

TEST(AccelerateFsdp, WrapPoliciesAsAccelerateReadsThem) {
  const Config size = fsdp("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n"
                           "  fsdp_min_num_params: 2000\n");
  EXPECT_EQ(size.zero.auto_wrap_policy, "SIZE_BASED_WRAP");
  EXPECT_EQ(size.zero.auto_wrap_min_num_params, 2000);
  EXPECT_TRUE(size.warnings.empty()) << size.warnings.front();
  EXPECT_EQ(fsdp("  fsdp_auto_wrap_policy: NO_WRAP\n").zero.auto_wrap_policy, "");
  // `accelerate config` for a transformers model: no layer names. A C++
  // model has no _no_split_modules to take them from: the Accelerator warns
  // when it shards (AcceleratorAutoWrap.*), and no unit comes of the policy.
  const Config unnamed = fsdp("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n");
  EXPECT_TRUE(unnamed.warnings.empty());
  EXPECT_TRUE(unnamed.zero.auto_wrap_layer_types.empty());
  // Names with spaces after the commas, as people write them.
  EXPECT_EQ(fsdp("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                 "  fsdp_transformer_layer_cls_to_wrap: 'Block, ns::LayerImpl'\n")
                .zero.auto_wrap_layer_types,
            (std::vector<std::string>{"Block", "ns::LayerImpl"}));
}

TEST(AccelerateFsdp, BadValuesNameTheirPlaceTheValidValuesAndTheFix) {
  const std::string name = fsdp_error("  fsdp_sharding_strategy: FULL\n");
  EXPECT_TRUE(contains(name, "a.yaml:4:27: fsdp_config.fsdp_sharding_strategy: expected "
                             "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or "
                             "HYBRID_SHARD_ZERO2 (any case, or the number of one of the first 5 "
                             "(1-5)), got \"FULL\"; did you mean FULL_SHARD?"))
      << name;
  EXPECT_TRUE(contains(fsdp_error("  fsdp_sharding_strategy: 6\n"), "got 6; write one of"));
  EXPECT_TRUE(contains(fsdp_error("  fsdp_version: 3\n"),
                       "a.yaml:4:17: fsdp_config.fsdp_version: expected an integer 1..2, got 3; "
                       "write 1 (FSDP1, Accelerate's default) or 2 (FSDP2)"));
  EXPECT_TRUE(contains(fsdp_error("  fsdp_offload_params: maybe\n"),
                       "fsdp_config.fsdp_offload_params: expected true or false"));
  EXPECT_TRUE(contains(fsdp_error("  fsdp_auto_wrap_policy: TRANSFORMER\n"),
                       "did you mean TRANSFORMER_BASED_WRAP?"));
  EXPECT_TRUE(contains(fsdp_error("  fsdp_transformer_layer_cls_to_wrap: [A, B]\n"),
                       "one comma-separated string"));
  EXPECT_TRUE(contains(fsdp_error("  fsdp_min_num_params: -1\n"), "fsdp_min_num_params: expected"));
  EXPECT_TRUE(contains(parse_error("distributed_type: FSDP\nfsdp_config: FULL_SHARD\n", "a.yaml"),
                       "a.yaml:2:14: fsdp_config: expected a mapping of keys"));
}

TEST(AccelerateFsdp, UnknownKeysGetADidYouMean) {
  const std::string typo = fsdp_error("  fsdp_sharding_stratgy: FULL_SHARD\n");
  EXPECT_TRUE(contains(typo, "a.yaml:4:3: fsdp_config.fsdp_sharding_stratgy: unknown key; did you "
                             "mean 'fsdp_sharding_strategy'?"))
      << typo;
  EXPECT_TRUE(contains(fsdp_error("  mixed_precision_policy: bf16\n"),
                       "fsdp_config.mixed_precision_policy: unknown key"));
}

// Accelerate's launcher reads fsdp_config's `x` as fsdp_x.
TEST(AccelerateFsdp, KeysWithoutTheFsdpPrefixReadAsAccelerateReadsThem) {
  const Config c = fsdp("  sharding_strategy: SHARD_GRAD_OP\n  offload_params: true\n"
                        "  use_orig_params: false\n");
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(warned_keys(c), (std::vector<std::string>{"fsdp_config.offload_params",
                                                      "fsdp_config.use_orig_params"}));
  EXPECT_TRUE(contains(fsdp_error("  fsdp_version: 2\n  version: 1\n"),
                       "a.yaml:5:12: fsdp_config.version: the same setting as "
                       "fsdp_config.fsdp_version at a.yaml:4:17"));
}

TEST(AccelerateFsdp, UnderAnotherTypeFsdpConfigIsIgnoredWithAWarning) {
  const Config c = parse_config_text(
      "distributed_type: MULTI_GPU\nfsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n",
      "a.yaml");
  EXPECT_EQ(c.zero.stage, 0);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(contains(c.warnings[0], "a.yaml:3:3: 'fsdp_config' is ignored because "
                                      "distributed_type is MULTI_GPU, not FSDP"))
      << c.warnings[0];
  // What `accelerate config` writes for other types says nothing.
  EXPECT_TRUE(parse_config_text("distributed_type: MULTI_GPU\nfsdp_config: {}\n", "a.yaml")
                  .warnings.empty());
}

TEST(AccelerateFsdp, UnderAnotherTypeTheDataParallelSizesAreCheckedAndAShardSizeWarns) {
  const std::string head = "distributed_type: MULTI_GPU\nnum_processes: 4\nparallelism_config:\n";
  // Replicas only: plain data parallel, what tandem does; nothing to say.
  const Config replicate =
      parse_config_text(head + "  parallelism_config_dp_replicate_size: 4\n", "a.yaml");
  EXPECT_TRUE(replicate.warnings.empty());
  EXPECT_EQ(replicate.zero.stage, 0);
  // A shard size has no effect outside FSDP: one warning at its place.
  const Config shard = parse_config_text(head + "  parallelism_config_dp_replicate_size: 2\n"
                                                "  parallelism_config_dp_shard_size: 2\n",
                                         "a.yaml");
  ASSERT_EQ(shard.warnings.size(), 1u);
  EXPECT_TRUE(contains(shard.warnings[0], "a.yaml:5:37: 'parallelism_config."
                                          "parallelism_config_dp_shard_size' shards only under "
                                          "distributed_type FSDP"))
      << shard.warnings[0];
  EXPECT_EQ(shard.zero.hpz_partition_size, 1);
  // Sizes that do not multiply to num_processes are refused, as Accelerate does.
  EXPECT_TRUE(contains(parse_error(head + "  parallelism_config_dp_replicate_size: 3\n", "a.yaml"),
                       "dp_replicate_size 3 * dp_shard_size 1 = 3, but num_processes is 4"));
}

TEST(AccelerateFsdp, TopLevelSettingsApplyAsForTheOtherTypes) {
  const Config c = fsdp("  fsdp_sharding_strategy: FULL_SHARD\n",
                        "mixed_precision: fp16\ngpu_ids: 0,1,2,3\nuse_cpu: false\n");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kFp16);
  EXPECT_EQ(c.gpu_ids, "0,1,2,3");
  EXPECT_EQ(c.num_processes, 4);
  // A deepspeed_config next to FSDP is ignored, as Accelerate ignores it.
  const Config ds = fsdp("  {}\n", "deepspeed_config:\n  zero_stage: 1\n");
  EXPECT_EQ(ds.zero.stage, 3);
  EXPECT_EQ(warned_keys(ds), std::vector<std::string>{"deepspeed_config"});
}

// tandem YAML writes and reads what HYBRID_SHARD maps to, so an FSDP
// config round-trips (DeepSpeed's JSON takes numbers only).
TEST(AccelerateFsdp, TandemYamlRoundTripsRanksPerHost) {
  const Config hybrid = fsdp("  fsdp_sharding_strategy: HYBRID_SHARD\n");
  const std::string written = to_tandem_yaml(hybrid);
  EXPECT_TRUE(contains(written, "zero_hpz_partition_size: ranks_per_host"));
  EXPECT_TRUE(contains(written, "distributed: FSDP"));
  const Config back = parse_config_text(written, "written.yaml");
  EXPECT_TRUE(same_settings(back, hybrid)) << written;
  EXPECT_FALSE(same_settings(back, fsdp("  fsdp_sharding_strategy: FULL_SHARD\n")));
  EXPECT_FALSE(parse_error(R"({"zero_optimization": {"zero_hpz_partition_size": "ranks_per_host"}})",
                           "ds.json")
                   .empty());
}

}  // namespace accelerate_fsdp_test
}  // namespace tandem
