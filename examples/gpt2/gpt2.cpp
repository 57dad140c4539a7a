// GPT-2 training through tandem::Accelerator: presets from the demo's size
// (tiny) to GPT-2 small (124m), bf16 autocast, fused AdamW, gradient
// clipping and accumulation, and, with --cuda-graph, the whole step captured
// as a CUDA graph (Accelerator::train_step).
//
//   build/bin/gpt2 --preset tiny --device cpu --max-steps 20
//   tandem launch --nproc-per-node 1 --mixed-precision bf16 build/bin/gpt2 --preset 124m --cuda-graph
//
// Tokens are synthetic (seeded arithmetic progressions, learnable) or read
// from --data, a file of uint16 tokens (nanoGPT's .bin, or llm.c's with its
// 1024-byte header). The run ends with one JSON line:
//   {"model": "gpt2", "preset", "params", "device", "precision", "cuda_graph",
//    "loss", "layer_norm", "residual_add", "steps", "tokens_per_s", "step_ms", "mfu", "flops_per_token",
//    "peak_tflops", "peak_memory_mb", "final_loss"[, "losses"]}
// MFU counts 6N + 12*L*C*T FLOPs per token (N: parameters without the
// position embedding) against the device's dense bf16 peak (a table of
// H100/H200/A100/L4, or --peak-tflops).

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include <ATen/DeviceAccelerator.h>
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#if defined(TANDEM_WITH_CUDA) && __has_include(<ATen/cuda/CUDAContext.h>)
#include <ATen/cuda/CUDAContext.h>
#define GPT2_DEVICE_NAMES 1
#endif

#include "gpt2_model.h"
#include "tandem/tandem.h"

namespace {

struct Args {
  std::string preset = "tiny";
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;  // 0: preset's
  int64_t batch_size = 8;  // sequences per micro-step per process
  int64_t max_steps = 50;  // timed optimizer steps
  int64_t warmup_measure = 5;  // untimed optimizer steps first
  int64_t accumulation = 0;    // 0: the config's
  double lr = 6e-4;
  int64_t warmup_steps = 10;
  double weight_decay = 0.1;
  double clip = 1.0;
  std::string mixed_precision;  // empty: the config's
  std::string device;           // cpu or cuda; empty: the Accelerator's choice
  std::string data_file;
  uint64_t seed = 1337;
  bool cuda_graph = false;
  std::string loss = "fused";  // fused: tandem::fused_cross_entropy; aten: LibTorch's
  // fused-add: each residual add fused with the LayerNorm after it
  // (tandem::fused_add_layer_norm); fused: tandem::fused_layer_norm alone;
  // aten: LibTorch's LayerNorm.
  std::string layer_norm = "fused-add";
  double peak_tflops = 0;
  bool losses = false;
  int64_t log_every = 0;
  std::string profile_dir;
};

Args parse_args(int argc, char** argv) {
  Args a;
  CLI::App app("GPT-2 training with tandem::Accelerator");
  app.add_option("--preset", a.preset, "model size")
      ->check(CLI::IsMember({"tiny", "small", "124m"}));
  app.add_option("--n-layer", a.n_layer, "blocks (overrides the preset)");
  app.add_option("--n-head", a.n_head, "attention heads (overrides the preset)");
  app.add_option("--n-embd", a.n_embd, "width (overrides the preset)");
  app.add_option("--block-size", a.block_size, "context length (overrides the preset)");
  app.add_option("--vocab-size", a.vocab_size, "vocabulary (overrides the preset)");
  app.add_option("--batch-size", a.batch_size, "sequences per micro-step per process")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-steps", a.max_steps, "timed optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup-measure", a.warmup_measure, "untimed optimizer steps before them")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--accumulation", a.accumulation,
                 "micro-steps per optimizer step (default: the config's)")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", a.lr, "peak learning rate (AdamW)")->check(CLI::PositiveNumber);
  app.add_option("--warmup-steps", a.warmup_steps, "linear learning-rate warmup steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--weight-decay", a.weight_decay, "AdamW weight decay")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--clip", a.clip, "gradient clipping norm (0: none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mixed-precision", a.mixed_precision, "no, bf16 or fp16 (default: the config's)")
      ->check(CLI::IsMember({"no", "bf16", "fp16"}));
  app.add_option("--device", a.device, "cpu or cuda (default: cuda when there is one)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--data", a.data_file, "uint16 token file (default: synthetic tokens)");
  app.add_option("--seed", a.seed, "seed for initialisation and synthetic tokens");
  app.add_flag("--cuda-graph", a.cuda_graph, "capture the whole step as a CUDA graph");
  app.add_option("--loss", a.loss,
                 "fused: tandem::fused_cross_entropy (tandem's kernels on CUDA, no fp32 logits); "
                 "aten: torch::nn::functional::cross_entropy, as Python's reference")
      ->check(CLI::IsMember({"fused", "aten"}));
  app.add_option("--layer-norm", a.layer_norm,
                 "fused-add: each residual add and the LayerNorm after it as one "
                 "tandem::fused_add_layer_norm; fused: tandem::fused_layer_norm, the adds "
                 "apart (both: tandem's kernels on CUDA, output in autocast's dtype); aten: "
                 "torch::nn::LayerNorm, as Python's reference")
      ->check(CLI::IsMember({"fused-add", "fused", "aten"}));
  app.add_option("--peak-tflops", a.peak_tflops, "the device's dense bf16 peak, for MFU")
      ->check(CLI::PositiveNumber);
  app.add_flag("--losses", a.losses, "add every step's loss to the JSON line");
  app.add_option("--log-every", a.log_every, "print the loss every N steps (0: never; a read "
                                             "of the loss waits for the device)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--profile", a.profile_dir,
                 "after the timed steps, record 3 more with the profiler: a Chrome trace "
                 "(profile_<rank>.json) in this folder");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return a;
}

// A flat stream of tokens; micro-batch i of rank r of w is the window at
// ((i * w + r) * B * T) modulo the stream, its targets shifted by one.
class Tokens {
 public:
  Tokens(const std::string& file, int64_t vocab, int64_t min_tokens, uint64_t seed) {
    if (file.empty()) {
      synthesize(vocab, min_tokens, seed);
    } else {
      read(file, vocab);
    }
  }

  std::vector<at::Tensor> batch(int64_t index, int rank, int world, int64_t b, int64_t t,
                                bool pin) const {
    const int64_t n = static_cast<int64_t>(tokens_.size());
    const int64_t offset = ((index * world + rank) * b * t) % (n - b * t - 1);
    auto window = torch::from_blob(const_cast<uint16_t*>(tokens_.data()) + offset, {b * t + 1},
                                   torch::kUInt16)
                      .to(torch::kLong);
    // One pinned copy of the window; inputs and targets are views of it,
    // each contiguous (as Python's reference pins one chunk per batch).
    if (pin) window = window.pin_memory();
    return {window.narrow(0, 0, b * t).view({b, t}), window.narrow(0, 1, b * t).view({b, t})};
  }

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  // Runs of 64 tokens, each an arithmetic progression modulo the vocabulary
  // from a random start with a random stride: learnable from two tokens.
  void synthesize(int64_t vocab, int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    tokens_.resize(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; i += 64) {
      const uint64_t start = rng() % static_cast<uint64_t>(vocab);
      const uint64_t stride = 1 + rng() % 16;
      for (int64_t j = i; j < std::min(n, i + 64); ++j) {
        tokens_[static_cast<std::size_t>(j)] =
            static_cast<uint16_t>((start + stride * static_cast<uint64_t>(j - i)) %
                                  static_cast<uint64_t>(vocab));
      }
    }
  }

  void read(const std::string& path, int64_t vocab) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("--data " + path + ": cannot open it");
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::size_t skip = 0;
    int32_t magic = 0;
    if (bytes.size() >= 1024) std::memcpy(&magic, bytes.data(), sizeof magic);
    if (magic == 20240520) skip = 1024;  // llm.c's header
    tokens_.resize((bytes.size() - skip) / 2);
    std::memcpy(tokens_.data(), bytes.data() + skip, tokens_.size() * 2);
    for (uint16_t token : tokens_) {
      if (token >= vocab) {
        throw std::runtime_error(fmt::format("--data {}: token {} is outside the vocabulary "
                                             "({}); raise --vocab-size",
                                             path, token, vocab));
      }
    }
  }

  std::vector<uint16_t> tokens_;
};

// Dense bf16 peak TFLOP/s by device name; 0 when unknown.
double peak_tflops_of(const std::string& name) {
  if (name.find("H200") != std::string::npos) return 989.0;
  if (name.find("H100") != std::string::npos) {
    return name.find("PCIe") != std::string::npos ? 756.0 : 989.0;
  }
  if (name.find("A100") != std::string::npos) return 312.0;
  if (name.find("L4") != std::string::npos && name.find("L40") == std::string::npos) return 121.0;
  return 0.0;
}

std::string device_name(const c10::Device& device) {
#if defined(GPT2_DEVICE_NAMES)
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  return device.str();
}

double peak_memory_mb(const c10::Device& device) {
  if (!device.is_cuda()) return -1;
  const auto stats = at::accelerator::getDeviceStats(device.index());
  const auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return static_cast<double>(stats.allocated_bytes[aggregate].peak) / (1024.0 * 1024.0);
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) at::accelerator::synchronizeDevice(device.index());
}

}  // namespace

int train(const Args& args) {
  gpt2::Gpt2Config config = gpt2::preset(args.preset);
  if (args.n_layer > 0) config.n_layer = args.n_layer;
  if (args.n_head > 0) config.n_head = args.n_head;
  if (args.n_embd > 0) config.n_embd = args.n_embd;
  if (args.block_size > 0) config.block_size = args.block_size;
  config.fused_layer_norm = args.layer_norm != "aten";
  config.fused_residual_add = args.layer_norm == "fused-add";
  if (args.vocab_size > 0) config.vocab_size = args.vocab_size;
  if (config.n_embd % config.n_head != 0) {
    std::fprintf(stderr, "gpt2: --n-embd (%ld) must be a multiple of --n-head (%ld)\n",
                 static_cast<long>(config.n_embd), static_cast<long>(config.n_head));
    return 2;
  }

  tandem::AcceleratorOptions options;
  if (!args.mixed_precision.empty()) {
    options.mixed_precision = tandem::parse_mixed_precision(args.mixed_precision);
  }
  if (args.accumulation > 0) options.gradient_accumulation_steps = args.accumulation;
  if (args.clip > 0) options.gradient_clipping = args.clip;
  options.cpu = args.device == "cpu";
  if (args.cuda_graph) {
    tandem::CudaGraphConfig graph;
    graph.enabled = true;
    options.cuda_graph = graph;
  }
  tandem::Accelerator accelerator(options);
  if (args.device == "cuda" && !accelerator.device().is_cuda()) {
    std::fprintf(stderr, "gpt2: --device cuda, but no CUDA device is available\n");
    return 2;
  }
  accelerator.set_seed(args.seed);
  const c10::Device device = accelerator.device();

  gpt2::Gpt2 model(config);
  auto adamw = std::make_shared<torch::optim::AdamW>(
      model->parameters(),
      torch::optim::AdamWOptions(args.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(
          args.weight_decay));
  accelerator.prepare_model(model);
  auto optimizer = accelerator.prepare_optimizer(adamw);
  const int64_t total_steps = args.warmup_measure + args.max_steps;
  // A prepared scheduler steps once per process per optimizer step, as
  // under HF Accelerate: a schedule in optimizer steps is scaled by it.
  const int64_t processes = accelerator.num_processes();
  tandem::WarmupCosineLROptions schedule;
  schedule.total_num_steps = total_steps * processes;
  schedule.warmup_num_steps = std::max<int64_t>(1, args.warmup_steps) * processes;
  schedule.warmup_type = tandem::WarmupType::kLinear;
  schedule.cos_min_ratio = 0.1;
  auto scheduler = accelerator.prepare_scheduler(
      std::make_shared<tandem::WarmupCosineLR>(*optimizer, schedule));

  const int64_t accumulation = accelerator.gradient_accumulation_steps();
  const int64_t b = args.batch_size, t = config.block_size;
  const int world = accelerator.num_processes(), rank = accelerator.process_index();
  const Tokens tokens(args.data_file, config.vocab_size,
                      std::max<int64_t>(1 << 20, 4 * b * t * world + 2), args.seed);
  TANDEM_CHECK_ARG(tokens.size() > b * t + 1, "--data {}: {} tokens, fewer than one batch ({})",
                   args.data_file, tokens.size(), b * t + 1);

  const int64_t vocab = config.vocab_size;
  const bool fused_loss = args.loss == "fused";
  auto step = accelerator.train_step(optimizer, [&](const std::vector<at::Tensor>& batch) {
    auto logits = model->forward(batch[0]).view({-1, vocab});
    auto targets = batch[1].view({-1});
    return fused_loss ? tandem::fused_cross_entropy(logits, targets)
                      : torch::nn::functional::cross_entropy(logits, targets);
  });
  // Which code the loss and the LayerNorms run: tandem's CUDA kernels, or
  // LibTorch's ops.
  auto code_of = [&](bool fused) -> std::string {
    if (!fused) return "aten";
    return device.is_cuda() && tandem::built_with_cuda_kernels() ? "tandem-kernels"
                                                                  : "fused-on-aten";
  };
  const std::string loss_code = code_of(fused_loss);
  const std::string layer_norm_code = code_of(config.fused_layer_norm);
  const std::string residual_add_code = code_of(config.fused_residual_add);

  const int64_t params = model->num_parameters();
  const double flops_per_token =
      6.0 * static_cast<double>(model->num_parameters(false)) +
      12.0 * static_cast<double>(config.n_layer * config.n_embd * config.block_size);
  const std::string name = device_name(device);
  const double peak = args.peak_tflops > 0 ? args.peak_tflops : peak_tflops_of(name);
  accelerator.print("gpt2: preset {} ({} layers x {}, {} heads, context {}, vocabulary {}), {} "
                    "parameters, {} process(es) on {}, batch {} x {} accumulation, mixed "
                    "precision {}, cuda graph {}, loss {}, layer norm {}, residual add {}",
                    args.preset, config.n_layer, config.n_embd, config.n_head, config.block_size,
                    vocab, params, world, name, b, accumulation,
                    tandem::to_string(accelerator.mixed_precision()),
                    args.cuda_graph ? "on" : "off", loss_code, layer_norm_code,
                    residual_add_code);

  const bool pin = device.is_cuda();
  std::vector<at::Tensor> losses;
  at::Tensor last_loss;
  int64_t micro = 0;
  auto clock = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < total_steps; ++s) {
    if (s == args.warmup_measure) {
      synchronize(device);
      clock = std::chrono::steady_clock::now();
    }
    at::Tensor loss_sum;
    for (int64_t m = 0; m < accumulation; ++m) {
      at::Tensor loss = step(tokens.batch(micro++, rank, world, b, t, pin));
      loss_sum = loss_sum.defined() ? loss_sum + loss : loss;
    }
    scheduler->step();
    last_loss = loss_sum / static_cast<double>(accumulation);
    if (args.losses) losses.push_back(last_loss);
    if (args.log_every > 0 && (s + 1) % args.log_every == 0) {
      accelerator.print("step {} loss {:.4f}", s + 1, last_loss.item<double>());
    }
  }
  synchronize(device);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - clock).count();
  if (!args.profile_dir.empty()) {  // untimed: where a step's time goes
    tandem::ProfileOptions profile;
    profile.output_trace_dir = args.profile_dir;
    auto session = accelerator.profile(profile);
    for (int64_t s = 0; s < 3; ++s) {
      for (int64_t m = 0; m < accumulation; ++m) step(tokens.batch(micro++, rank, world, b, t, pin));
    }
    synchronize(device);
    session.stop();
  }
  const double tokens_per_s =
      static_cast<double>(args.max_steps * accumulation * b * t * world) / seconds;
  const double mfu = peak > 0 ? flops_per_token * tokens_per_s / (peak * 1e12) : -1;

  nlohmann::json out;
  out["model"] = "gpt2";
  out["preset"] = args.preset;
  out["params"] = params;
  out["device"] = name;
  out["precision"] = tandem::to_string(accelerator.mixed_precision());
  out["cuda_graph"] = args.cuda_graph;
  out["graph_replayed"] = step.graphed();
  out["captures"] = step.captures();
  out["loss"] = loss_code;
  out["layer_norm"] = layer_norm_code;
  out["residual_add"] = residual_add_code;
  out["steps"] = args.max_steps;
  out["batch_size"] = b;
  out["accumulation"] = accumulation;
  out["processes"] = world;
  out["tokens_per_s"] = tokens_per_s;
  out["step_ms"] = 1000.0 * seconds / static_cast<double>(args.max_steps);
  out["flops_per_token"] = flops_per_token;
  out["mfu"] = mfu >= 0 ? nlohmann::json(mfu) : nlohmann::json(nullptr);
  out["peak_tflops"] = peak > 0 ? nlohmann::json(peak) : nlohmann::json(nullptr);
  const double memory = peak_memory_mb(device);
  out["peak_memory_mb"] = memory >= 0 ? nlohmann::json(memory) : nlohmann::json(nullptr);
  out["final_loss"] = last_loss.item<double>();
  if (args.losses) {
    auto all = torch::stack(losses).to(torch::kDouble).cpu();
    out["losses"] = std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  }
  accelerator.end_training();
  accelerator.print_line(out.dump());
  return 0;
}

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  try {
    return train(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt2: %s\n", e.what());
    return 1;
  }
}
