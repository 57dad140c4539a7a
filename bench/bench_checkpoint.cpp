// Checkpoint save and load throughput against `dd` on the same disk, in one
// run. The state is a model of --params fp32 parameters after one Adam step
// (parameters + exp_avg + exp_avg_sq: 12 bytes per parameter; the default
// 89.5M parameters make 1.07 GB, "1 GB of state"), saved with
// Accelerator::save_state (safetensors, checksums, fsync, atomic commit) and
// loaded with load_state. The peer writes the same number of bytes with
// `dd bs=64M conv=fsync` and reads them back with `dd bs=64M`. Loads read
// from the page cache on both sides (the files were just written); the
// figures are the median of --reps. The last line is one JSON object.
//
//   build/bin/bench_checkpoint --dir /var/tmp/ckpt_bench --reps 3

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tandem/core/file_system.h"
#include "tandem/tandem.h"

namespace {

double seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void shell(const std::string& command) {
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "bench_checkpoint: `%s` failed\n", command.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = 89'478'485;  // 12 bytes each: 1 GiB
  int reps = 3;
  std::string dir = "/var/tmp/tandem_bench_checkpoint";
  CLI::App app("checkpoint save/load throughput vs dd");
  app.add_option("--params", params, "fp32 parameters (state is 12 bytes per parameter)");
  app.add_option("--reps", reps, "repetitions (median reported)");
  app.add_option("--dir", dir, "directory on the disk to measure (emptied first)");
  CLI11_PARSE(app, argc, argv);

  tandem::fs::remove_all(dir);
  tandem::fs::create_directories(dir);
  tandem::AcceleratorOptions options;
  options.cpu = true;
  tandem::Accelerator accelerator(options);
  const int64_t rows = 4096;
  auto model = torch::nn::Linear(torch::nn::LinearOptions(rows, params / rows).bias(false));
  auto adam = std::make_shared<torch::optim::Adam>(
      model->parameters(), torch::optim::AdamOptions(1e-3));
  accelerator.prepare_model(model);
  auto optimizer = accelerator.prepare_optimizer(adam);
  accelerator.backward(model->forward(torch::ones({1, rows})).sum());
  optimizer->step();

  const std::string ckpt = dir + "/ckpt";
  std::vector<double> save_s, load_s, dd_write_s, dd_read_s;
  int64_t bytes = 0;
  for (int r = 0; r < reps; ++r) {
    tandem::SaveStateOptions save;
    save.tag = "rep" + std::to_string(r);
    save.total_limit = 1;
    save_s.push_back(seconds([&] { accelerator.save_state(ckpt, save); }));
    load_s.push_back(seconds([&] { accelerator.load_state(ckpt); }));
    bytes = 0;
    for (const std::string& name : tandem::fs::list_directory(ckpt + "/" + save.tag)) {
      struct stat st {};
      if (::stat((ckpt + "/" + save.tag + "/" + name).c_str(), &st) == 0) bytes += st.st_size;
    }
    const std::string dd_file = dir + "/dd.bin";
    const int64_t blocks = (bytes + (64 << 20) - 1) / (64 << 20);
    dd_write_s.push_back(seconds([&] {
      shell("dd if=/dev/zero of=" + dd_file + " bs=64M count=" + std::to_string(blocks) +
            " conv=fsync status=none");
    }));
    dd_read_s.push_back(
        seconds([&] { shell("dd if=" + dd_file + " of=/dev/null bs=64M status=none"); }));
    tandem::fs::remove(dd_file);
  }
  tandem::fs::remove_all(dir);
  const double gb = static_cast<double>(bytes) / 1e9;
  const nlohmann::json result = {
      {"bytes", bytes},
      {"params", params},
      {"reps", reps},
      {"save_s", median(save_s)},
      {"load_s", median(load_s)},
      {"save_GBps", gb / median(save_s)},
      {"load_GBps", gb / median(load_s)},
      {"dd_write_GBps", gb / median(dd_write_s)},
      {"dd_read_GBps", gb / median(dd_read_s)},
      {"save_vs_dd", median(dd_write_s) / median(save_s)},
      {"load_vs_dd", median(dd_read_s) / median(load_s)}};
  std::printf("%s\n", result.dump().c_str());
  return 0;
}
