// `tandem launch` with a config file: what the file supplies, what flags
// override, what workers receive, and where the default file is found.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <torch/cuda.h>

#include "launch/config_cli_helpers.h"
#include "launch/cpu_affinity.h"
#include "launch/launch_options.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::bin;
using testing::file_exists;
using testing::run_process;
using testing::tandem_in;
using testing::TempDir;
using testing::write_text;

// fp16 gives --mixed-precision something to beat. Not use_cpu: true, which
// with fp16 is refused (the Accelerator refuses fp16 on the CPU).
std::string accelerate_yaml(int num_processes, const std::string& extra = "") {
  return "compute_environment: LOCAL_MACHINE\n"
         "distributed_type: MULTI_CPU\n"
         "num_processes: " +
         std::to_string(num_processes) +
         "\n"
         "num_machines: 1\n"
         "machine_rank: 0\n"
         "mixed_precision: fp16\n" +
         extra;
}

// Each worker prints "WORLD_SIZE LOCAL_WORLD_SIZE [TANDEM_CONFIG_FILE] [TANDEM_MIXED_PRECISION]".
std::vector<std::string> echo_env() {
  return {"--no-prefix", "/bin/sh", "-c",
          "echo $WORLD_SIZE $LOCAL_WORLD_SIZE [$TANDEM_CONFIG_FILE] [$TANDEM_MIXED_PRECISION]"};
}

// `launch FLAGS PROGRAM` on a free port, so tests (and other jobs on the
// machine) never compete for the default 29500.
std::vector<std::string> launch(std::vector<std::string> flags, const std::vector<std::string>& program) {
  flags.insert(flags.begin(), {"launch", "--master-port", "0"});
  flags.insert(flags.end(), program.begin(), program.end());
  return flags;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(LaunchConfig, TheFileSuppliesTheProcessCountAndWorkersGetItsPath) {
  TempDir home;
  const std::string path = home.path() + "/accelerate.yaml";
  write_text(path, accelerate_yaml(3));
  auto r = run_process(tandem_in(home.path(), launch({"--config-file", path}, echo_env())), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "3 3 [" + path + "] []\n"), 3) << r.out;
  EXPECT_NE(r.err.find("config " + path), std::string::npos) << "says which file: " << r.err;
}

// A key the file asks for and tandem ignores is said once per job: by the
// launcher, for any program (a shell or Python one has no Accelerator to
// say it), and not again by a tandem program's Accelerator.
TEST(LaunchConfig, TheFilesWarningsArePrintedOnceWhateverTheProgram) {
  TempDir home;
  const std::string path = home.path() + "/config.yaml";
  write_text(path,
             "distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\nmixed_precision: "
             "\"no\"\ndynamo_config:\n  dynamo_backend: INDUCTOR\n");
  const std::string warning = "'dynamo_config' asks for TorchDynamo";
  auto shell = run_process(tandem_in(home.path(), launch({"--config-file", path}, echo_env())), 60);
  ASSERT_EQ(shell.exit_code, 0) << shell.err;
  EXPECT_EQ(count(shell.err, warning), 1) << shell.err;
  auto accelerated = run_process(
      tandem_in(home.path(), launch({"--config-file", path},
                                    {bin("consistency_worker"), "config", home.path()})),
      120);
  ASSERT_EQ(accelerated.exit_code, 0) << accelerated.out << accelerated.err;
  EXPECT_EQ(count(accelerated.out + accelerated.err, warning), 1) << accelerated.err;
  // Alone, the Accelerator says it itself.
  auto alone = run_process({bin("consistency_worker"), "config", home.path()}, 120);
  ASSERT_EQ(alone.exit_code, 0) << alone.out << alone.err;
  EXPECT_EQ(count(alone.out + alone.err, warning), 1) << alone.err;
}

// MULTI_CPU with use_cpu false on a machine without CUDA: tandem starts
// every process the file counts, and tells Accelerate they run on CPUs, or
// each Python process would train alone (DistributedType.NO).
TEST(LaunchConfig, MultiCpuWithoutCudaTellsAccelerateTheJobIsOnCpus) {
  TempDir home;
  const std::string path = home.path() + "/config.yaml";
  write_text(path, "distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: false\n"
                   "mixed_precision: \"no\"\n");
  auto r = run_process(tandem_in(home.path(),
                                 launch({"--config-file", path},
                                        {"--no-prefix", "/bin/sh", "-c",
                                         "echo $WORLD_SIZE use_cpu=$ACCELERATE_USE_CPU"})),
                       60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string expected = torch::cuda::device_count() == 0 ? "True" : "False";
  EXPECT_EQ(count(r.out, "2 use_cpu=" + expected + "\n"), 2) << r.out;
}

TEST(LaunchConfig, ARelativePathIsExportedAbsolute) {
  TempDir home;
  write_text(home.path() + "/cfg/a.yaml", accelerate_yaml(2));
  std::string command = "cd '" + home.path() + "' && exec \"$@\"";
  std::vector<std::string> argv = {"/bin/sh", "-c", command, "sh"};
  for (const auto& a : tandem_in(home.path(), launch({"--config-file", "cfg/../cfg/a.yaml"}, echo_env()))) {
    argv.push_back(a);
  }
  auto r = run_process(argv, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "2 2 [" + home.path() + "/cfg/a.yaml] []\n"), 2) << r.out;
}

TEST(LaunchConfig, FlagsWinOverTheFile) {
  TempDir home;
  const std::string path = home.path() + "/accelerate.yaml";
  write_text(path, accelerate_yaml(3));
  auto r = run_process(tandem_in(home.path(), launch({"--config-file", path, "--nproc-per-node", "2",
                                                      "--mixed-precision", "bf16"},
                                                     echo_env())),
                       60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "2 2 [" + path + "] [bf16]\n"), 2) << r.out;
}

TEST(LaunchConfig, MixedPrecisionFlagBeatsTheFileInTheWorkers) {
  TempDir home;
  const std::string path = home.path() + "/accelerate.yaml";
  write_text(path, accelerate_yaml(2));  // says fp16
  auto from_file = run_process(
      tandem_in(home.path(), launch({"--config-file", path}, {bin("launch_test_worker"), "config"})), 60);
  ASSERT_EQ(from_file.exit_code, 0) << from_file.out << from_file.err;
  EXPECT_EQ(count(from_file.out, "/2 mixed_precision=fp16 file=" + path), 2) << from_file.out;

  auto flag = run_process(tandem_in(home.path(), launch({"--config-file", path, "--mixed-precision", "bf16"},
                                                        {bin("launch_test_worker"), "config"})),
                          60);
  ASSERT_EQ(flag.exit_code, 0) << flag.out << flag.err;
  EXPECT_EQ(count(flag.out, "/2 mixed_precision=bf16 file=" + path), 2) << flag.out;
}

TEST(LaunchConfig, MixedPrecisionWithoutAFileIsExported) {
  TempDir home;
  auto r = run_process(tandem_in(home.path(), launch({"--nproc-per-node", "2", "--mixed-precision", "FP16"},
                                                     echo_env())),
                       60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "2 2 [] [fp16]\n"), 2) << r.out;

  auto bad = run_process(tandem_in(home.path(), launch({"--mixed-precision", "fp8"}, echo_env())), 60);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("fp8"), std::string::npos) << bad.err;
}

TEST(LaunchConfig, GpuIdsBecomeCudaVisibleDevices) {
  TempDir home;
  const std::string path = home.path() + "/accelerate.yaml";
  write_text(path, accelerate_yaml(2, "gpu_ids: 1,3\n"));
  auto r = run_process(tandem_in(home.path(), launch({"--config-file", path}, {"--no-prefix", "/bin/sh", "-c",
                                                                               "echo gpus=$CUDA_VISIBLE_DEVICES"})),
                       60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "gpus=1,3\n"), 2) << r.out;
}

TEST(LaunchConfig, Fp16WithUseCpuExitsTwoBeforeAnyWorkerStartsUnlessTheFlagFixesIt) {
  TempDir home;
  const std::string path = home.path() + "/accelerate.yaml";
  write_text(path, accelerate_yaml(2, "use_cpu: true\n"));
  auto r = run_process(tandem_in(home.path(), launch({"--config-file", path}, echo_env())), 60);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(r.out.find("2 2"), std::string::npos) << "no worker may start: " << r.out;
  EXPECT_NE(r.err.find("mixed_precision fp16 with use_cpu: true"), std::string::npos) << r.err;

  auto fixed = run_process(tandem_in(home.path(), launch({"--config-file", path,
                                                          "--mixed-precision", "bf16"},
                                                         echo_env())),
                           60);
  ASSERT_EQ(fixed.exit_code, 0) << fixed.err;
  EXPECT_EQ(count(fixed.out, "2 2 [" + path + "] [bf16]\n"), 2) << fixed.out;
}

TEST(LaunchConfig, ARdzvBackendTandemRefusesExitsTwoAsConfigCheckDoes) {
  TempDir home;
  const std::string path = home.path() + "/accelerate.yaml";
  write_text(path, accelerate_yaml(2, "rdzv_backend: etcd\n"));
  auto launched = run_process(tandem_in(home.path(), launch({"--config-file", path}, echo_env())), 60);
  auto checked = run_process(tandem_in(home.path(), {"config", "check", path}), 60);
  EXPECT_EQ(launched.exit_code, 2) << launched.out;
  EXPECT_EQ(checked.exit_code, 2) << checked.out;
  for (const auto* r : {&launched, &checked}) {
    EXPECT_NE(r->err.find(":15: rdzv_backend: etcd is not supported by tandem"),
              std::string::npos)
        << r->err;
  }
}

TEST(LaunchConfig, ABadFileExitsTwoBeforeAnyWorkerStarts) {
  TempDir home;
  const std::string path = home.path() + "/bad.yaml";
  write_text(path, "distributed_type: MULTI_CPU\nnum_processes: two\n");
  const std::string marker = home.path() + "/started";
  auto r = run_process(tandem_in(home.path(), launch({"--config-file", path}, {"/bin/sh", "-c", "touch " + marker})),
                       60);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(path + ":2:"), std::string::npos) << r.err;
  EXPECT_FALSE(file_exists(marker));

  auto missing = run_process(
      tandem_in(home.path(), launch({"--config-file", home.path() + "/none.yaml"}, {"/bin/sh", "-c", "touch " + marker})),
      60);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_FALSE(file_exists(marker));
}

TEST(LaunchConfig, ProcessesMustSplitEvenlyOverTheMachines) {
  TempDir home;
  const std::string path = home.path() + "/accelerate.yaml";
  write_text(path,
             "distributed_type: MULTI_CPU\nnum_processes: 3\nnum_machines: 2\nmachine_rank: 0\n"
             "main_process_ip: 127.0.0.1\nmain_process_port: 29555\n");
  auto r = run_process(tandem_in(home.path(), launch({"--config-file", path}, echo_env())), 60);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("split evenly"), std::string::npos) << r.err;
}

TEST(LaunchConfig, FindsTandemsDefaultUnderXdgCacheHomeFirst) {
  TempDir home;
  const std::string cache = home.path() + "/xdg";
  const std::string tandem_default = cache + "/tandem/default_config.yaml";
  const std::string accelerate_default = cache + "/huggingface/accelerate/default_config.yaml";
  write_text(accelerate_default, accelerate_yaml(3));
  auto accelerate = run_process(
      tandem_in(home.path(), launch({}, echo_env()), {"XDG_CACHE_HOME=" + cache}), 60);
  ASSERT_EQ(accelerate.exit_code, 0) << accelerate.err;
  EXPECT_EQ(count(accelerate.out, "3 3 [" + accelerate_default + "] []\n"), 3) << accelerate.out;

  write_text(tandem_default, accelerate_yaml(2));
  auto tandem = run_process(tandem_in(home.path(), launch({}, echo_env()), {"XDG_CACHE_HOME=" + cache}), 60);
  ASSERT_EQ(tandem.exit_code, 0) << tandem.err;
  EXPECT_EQ(count(tandem.out, "2 2 [" + tandem_default + "] []\n"), 2) << tandem.out;
}

TEST(LaunchConfig, FallsBackToAcceleratesDefaultUnderHome) {
  TempDir home;
  const std::string path = home.path() + "/.cache/huggingface/accelerate/default_config.yaml";
  write_text(path, accelerate_yaml(2));
  auto r = run_process(tandem_in(home.path(), launch({}, echo_env())), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "2 2 [" + path + "] []\n"), 2) << r.out;

  TempDir empty;
  auto none = run_process(tandem_in(empty.path(), launch({}, echo_env())), 60);
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_EQ(none.out, "1 1 [] []\n") << "no config anywhere: one process, nothing exported";
}

// The merge itself, without processes.
cli::LaunchOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "launch");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  bool help = false;
  return cli::parse_launch_flags(static_cast<int>(argv.size()), argv.data(), &help);
}

Config two_machines() {
  Config config;
  config.source_path = "c.yaml";
  config.num_processes = 8;
  config.num_machines = 2;
  config.machine_rank = 1;
  config.main_process_ip = "10.0.0.1";
  config.main_process_port = 29600;
  config.gpu_ids = "0,1,2,3";
  return config;
}

TEST(LaunchConfigMerge, TheFileFillsWhatNoFlagGave) {
  auto opts = parse({"prog"});
  cli::apply_launch_config(two_machines(), 0, opts);
  cli::validate_launch_options(opts);
  EXPECT_EQ(opts.nproc_per_node, 4) << "num_processes counts both machines";
  EXPECT_EQ(opts.nnodes, 2);
  EXPECT_EQ(opts.node_rank, 1);
  EXPECT_EQ(opts.master_addr, "10.0.0.1");
  EXPECT_EQ(opts.master_port, 29600);
  EXPECT_EQ(opts.visible_devices, "0,1,2,3");
}

TEST(LaunchConfigMerge, FlagsWinOneByOne) {
  auto opts = parse({"--nnodes", "4", "--node_rank=3", "--master-addr", "head", "--master-port", "1234", "prog"});
  cli::apply_launch_config(two_machines(), 0, opts);
  cli::validate_launch_options(opts);
  EXPECT_EQ(opts.nproc_per_node, 2) << "the file's total split over the flag's nodes";
  EXPECT_EQ(opts.nnodes, 4);
  EXPECT_EQ(opts.node_rank, 3);
  EXPECT_EQ(opts.master_addr, "head");
  EXPECT_EQ(opts.master_port, 1234);

  auto endpoint = parse({"--rdzv-endpoint", "head:999", "--nproc-per-node", "3", "prog"});
  cli::apply_launch_config(two_machines(), 0, endpoint);
  EXPECT_EQ(endpoint.master_addr, "head");
  EXPECT_EQ(endpoint.master_port, 999);
  EXPECT_EQ(endpoint.nproc_per_node, 3);

  auto filtered = parse({"--include", "localhost:1", "prog"});
  cli::apply_launch_config(two_machines(), 0, filtered);
  EXPECT_TRUE(filtered.visible_devices.empty()) << "--include picks the GPUs";
  EXPECT_EQ(filtered.nproc_per_node, 1);

  auto standalone = parse({"--standalone", "prog"});
  cli::apply_launch_config(two_machines(), 0, standalone);
  cli::validate_launch_options(standalone);
  EXPECT_EQ(standalone.nnodes, 1);
  EXPECT_EQ(standalone.master_port, 0);
}

TEST(LaunchConfigMerge, AGpuConfigWithoutACountRunsOneProcessPerGpu) {
  Config gpu;
  gpu.distributed_type = DistributedType::kMultiGpu;
  auto all = parse({"prog"});
  cli::apply_launch_config(gpu, 4, all);
  EXPECT_EQ(all.nproc_per_node, 4);

  gpu.gpu_ids = "2,3";
  auto listed = parse({"prog"});
  cli::apply_launch_config(gpu, 4, listed);
  EXPECT_EQ(listed.nproc_per_node, 2);
  EXPECT_EQ(listed.visible_devices, "2,3");

  Config deepspeed_on_cpu;
  deepspeed_on_cpu.distributed_type = DistributedType::kDeepSpeed;
  deepspeed_on_cpu.use_cpu = true;
  auto cpu = parse({"prog"});
  cli::apply_launch_config(deepspeed_on_cpu, 4, cpu);
  EXPECT_EQ(cpu.nproc_per_node, 1);

  // FSDP, as `accelerate launch` runs it: one process per GPU.
  Config fsdp;
  fsdp.distributed_type = DistributedType::kFsdp;
  auto per_gpu = parse({"prog"});
  cli::apply_launch_config(fsdp, 4, per_gpu);
  EXPECT_EQ(per_gpu.nproc_per_node, 4);

  auto flag = parse({"--nproc-per-node", "3", "prog"});
  cli::apply_launch_config(gpu, 4, flag);
  EXPECT_EQ(flag.nproc_per_node, 3);
}

// The launch lines of torchrun, accelerate launch and deepspeed that a port
// brings along.
TEST(LaunchFlags, TorchrunAccelerateAndDeepSpeedSpellingsMeanWhatTheyDoThere) {
  const int cpus = static_cast<int>(cli::allowed_cpus().size());
  EXPECT_EQ(parse({"--nproc-per-node", "cpu", "prog"}).nproc_per_node, cpus);
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(parse({"--nproc_per_node=auto", "prog"}).nproc_per_node, cpus);
    EXPECT_THROW(parse({"--nproc-per-node", "gpu", "prog"}), UsageError);
  }
  EXPECT_THROW(parse({"--nproc-per-node", "many", "prog"}), UsageError);

  auto module = parse({"-m", "pkg.train", "--lr", "1"});
  EXPECT_TRUE(module.module);
  EXPECT_EQ(module.program, (std::vector<std::string>{"pkg.train", "--lr", "1"}));
  EXPECT_TRUE(parse({"--module", "pkg.train"}).module);  // deepspeed's spelling
  auto both = parse({"--no_python", "-m", "pkg.train"});
  EXPECT_THROW(cli::validate_launch_options(both), UsageError);
  auto run_path = parse({"--run_path", "train.py"});
  EXPECT_TRUE(run_path.run_path);
  cli::validate_launch_options(run_path);

  auto filtered = parse({"--nproc-per-node", "3", "--local_ranks_filter=0,2", "prog"});
  EXPECT_EQ(filtered.local_ranks_filter, (std::vector<int>{0, 2}));
  cli::validate_launch_options(filtered);
  auto beyond = parse({"--nproc-per-node", "2", "--local-ranks-filter", "2", "prog"});
  EXPECT_THROW(cli::validate_launch_options(beyond), UsageError);
  EXPECT_THROW(parse({"--local-ranks-filter", "0,x", "prog"}), UsageError);

  // accelerate launch --use_deepspeed: ZeRO stage 2 unless --zero_stage or
  // the config says.
  auto deepspeed = parse({"--use_deepspeed", "prog"});
  cli::default_zero_stage(nullptr, deepspeed);
  EXPECT_EQ(deepspeed.zero_stage, 2);
  Config stage3_file;
  stage3_file.zero.stage = 3;
  auto from_file = parse({"--use_deepspeed", "prog"});
  cli::default_zero_stage(&stage3_file, from_file);
  EXPECT_FALSE(from_file.zero_stage.has_value()) << "the file's stage stands";
  auto stage3 = parse({"--use_deepspeed", "--zero_stage", "3", "--offload_param_device", "cpu",
                       "--gradient_clipping", "0.5", "--gradient_accumulation_steps", "4",
                       "prog"});
  EXPECT_EQ(stage3.zero_stage, 3);
  EXPECT_EQ(stage3.offload_param_device, "cpu");
  EXPECT_EQ(stage3.gradient_clipping, 0.5);
  EXPECT_EQ(stage3.gradient_accumulation_steps, 4);
  EXPECT_THROW(parse({"--offload_param_device", "nvme", "prog"}), UsageError);
  auto bad_stage = parse({"--zero_stage", "4", "prog"});
  EXPECT_THROW(cli::validate_launch_options(bad_stage), UsageError);
  EXPECT_EQ(parse({"--deepspeed_config_file", "ds.json", "prog"}).config_file, "ds.json");

  // --gpu_ids: the visible GPUs and, without a count, one process per id;
  // a config's num_processes still counts.
  auto gpus = parse({"--gpu_ids", "1,3", "prog"});
  EXPECT_EQ(gpus.visible_devices, "1,3");
  EXPECT_EQ(gpus.nproc_per_node, 2);
  Config counted;
  counted.num_processes = 1;
  counted.gpu_ids = "0,1,2,3";
  cli::apply_launch_config(counted, 4, gpus);
  EXPECT_EQ(gpus.visible_devices, "1,3") << "the flag beats the file's gpu_ids";
  EXPECT_EQ(gpus.nproc_per_node, 1);
  EXPECT_TRUE(parse({"--gpu_ids", "all", "prog"}).visible_devices.empty());

  // deepspeed's core binding and --no_local_rank (tandem never passes one).
  auto bound = parse({"--bind_cores_to_rank", "--bind_core_list", "0,2-3", "--no_local_rank",
                      "prog"});
  EXPECT_TRUE(bound.cpu_affinity);
  EXPECT_EQ(bound.bind_core_list, (std::vector<int>{0, 2, 3}));
  auto unbound = parse({"--bind_core_list", "0-1", "prog"});
  EXPECT_THROW(cli::validate_launch_options(unbound), UsageError);
}

// accelerate launch --num_processes N with a file for 2 machines: N counts
// both machines' processes, as in accelerate, whichever gave the machines.
TEST(LaunchConfigMerge, NumProcessesFlagSplitsOverTheFilesMachines) {
  auto opts = parse({"--num_processes", "2", "prog"});
  cli::apply_launch_config(two_machines(), 0, opts);
  cli::validate_launch_options(opts);
  EXPECT_EQ(opts.nnodes, 2);
  EXPECT_EQ(opts.nproc_per_node, 1) << "2 processes over the file's 2 machines";

  auto uneven = parse({"--num_processes", "3", "prog"});
  cli::apply_launch_config(two_machines(), 0, uneven);
  try {
    cli::validate_launch_options(uneven);
    FAIL() << "3 processes over 2 machines was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--num_processes 3 counts the processes of all 2 nodes"),
              std::string::npos)
        << e.what();
  }
}

// `num_processes: auto` is decided at launch: one process per GPU for GPU
// jobs, one per CPU the launcher may use under MULTI_CPU.
TEST(LaunchConfigMerge, AutoProcessesUnderMultiCpuRunOnePerCpu) {
  Config cpu;
  cpu.source_path = "c.yaml";
  cpu.distributed_type = DistributedType::kMultiCpu;
  cpu.key_locations["num_processes"] = "c.yaml:2";  // given, as auto
  auto opts = parse({"prog"});
  cli::apply_launch_config(cpu, 0, opts);
  EXPECT_EQ(opts.nproc_per_node, static_cast<int>(cli::allowed_cpus().size()));
  Config unset = cpu;
  unset.key_locations.clear();
  auto one = parse({"prog"});
  cli::apply_launch_config(unset, 0, one);
  EXPECT_EQ(one.nproc_per_node, 1) << "no num_processes at all: one process";
  auto flag = parse({"--nproc-per-node", "1", "prog"});
  cli::apply_launch_config(cpu, 0, flag);
  EXPECT_EQ(flag.nproc_per_node, 1) << "the flag wins";
}

TEST(LaunchConfigMerge, UnevenProcessesNameTheFile) {
  Config config = two_machines();
  config.num_processes = 5;
  auto opts = parse({"prog"});
  try {
    cli::apply_launch_config(config, 0, opts);
    FAIL() << "5 processes over 2 machines was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("c.yaml: num_processes 5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
