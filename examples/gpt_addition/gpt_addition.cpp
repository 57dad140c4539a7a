// The tandem demo: a small GPT learns multi-digit addition, trained through
// tandem::Accelerator on as many ranks as you launch.
//
//   tandem launch --nproc-per-node 2 build/bin/gpt_addition
//   build/bin/gpt_addition --data FILE      # a char-level model on any text
//
// Rank 0 draws a progress bar (loss, tokens/s), writes metrics as JSON lines,
// and prints as its last stdout line:
//   {"step": s, "loss": l, "accuracy": a, "tokens_per_s": t, "peak_rss_mb": m}
// accuracy is exact-match on held-out sums (every digit right), or
// next-character accuracy on the held-out tail of --data; peak_rss_mb is rank
// 0's peak resident memory (getrusage's ru_maxrss), and on a GPU
// "peak_cuda_mb" is the most CUDA memory its tensors held at once.
// --activation-checkpointing
// recomputes each transformer block in backward instead of keeping its
// activations: the same loss, less memory, about a third more compute.

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <optional>

#include <ATen/DeviceAccelerator.h>
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "addition_data.h"
#include "gpt.h"
#include "tandem/tandem.h"
#include "text_data.h"

namespace {

struct Args {
  int64_t max_steps = 2000;
  int64_t batch_size = 64;  // per process
  uint64_t seed = 0;
  int64_t digits = 3;
  double lr = 1e-3;
  int64_t warmup_steps = 100;
  int64_t n_layer = 2, n_head = 4, n_embd = 128;
  int64_t train_size = 1 << 18;
  int64_t test_size = 2000;
  int64_t eval_every = 0;  // 0: only at the end
  double target_accuracy = 0;  // 0: train all max_steps
  int64_t log_every = 25;
  std::string metrics_file = "runs/gpt_addition/metrics.jsonl";
  std::string log_with;  // "tensorboard": event files next to the metrics file
  std::string checkpoint_dir;
  int64_t save_every = 0;
  int64_t stop_after = 0;
  int total_limit = 0;
  std::string data_file;
  int64_t block_size = 64;  // --data only
  bool activation_checkpointing = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  CLI::App app("tandem demo: a small GPT learns addition, trained with tandem::Accelerator");
  app.add_option("--max-steps", a.max_steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", a.batch_size, "samples per process per step")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "seed for data, initialisation and shuffling");
  app.add_option("--digits", a.digits, "digits per operand")->check(CLI::Range(1, 9));
  app.add_option("--lr", a.lr, "peak learning rate (AdamW)")->check(CLI::PositiveNumber);
  app.add_option("--warmup-steps", a.warmup_steps, "linear warmup steps");
  app.add_option("--n-layer", a.n_layer, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--n-head", a.n_head, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--n-embd", a.n_embd, "model width")->check(CLI::PositiveNumber);
  app.add_option("--train-size", a.train_size, "training samples generated")
      ->check(CLI::PositiveNumber);
  app.add_option("--test-size", a.test_size, "held-out samples")->check(CLI::PositiveNumber);
  app.add_option("--eval-every", a.eval_every, "evaluate every N steps (0: at the end only)");
  app.add_option("--target-accuracy", a.target_accuracy,
                 "stop at the first evaluation whose held-out accuracy reaches this (0-1; "
                 "evaluates every --eval-every steps, 100 when that is not given; the schedule "
                 "still spans --max-steps)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--log-every", a.log_every, "average the loss across ranks every N steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--metrics-file", a.metrics_file, "JSON-lines metrics (rank 0)");
  app.add_option("--log-with", a.log_with,
                 "also log to TensorBoard, in the metrics file's folder (tensorboard)")
      ->check(CLI::IsMember({"tensorboard"}));
  app.add_option("--checkpoint-dir", a.checkpoint_dir,
                 "checkpoint folder; a run resumes from its `latest` checkpoint when it has one");
  app.add_option("--save-every", a.save_every, "save a checkpoint every N steps (and at the end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--keep", a.total_limit, "keep only the newest N checkpoints (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--stop-after", a.stop_after,
                 "stop after this many steps as if interrupted (the schedule still spans "
                 "--max-steps); for trying out resume")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--data", a.data_file, "train a char-level model on this text file instead");
  app.add_option("--block-size", a.block_size, "context length with --data")
      ->check(CLI::PositiveNumber);
  app.add_flag("--activation-checkpointing", a.activation_checkpointing,
               "recompute each transformer block in backward instead of keeping its "
               "activations (also on with the config's activation_checkpointing block)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  if (a.n_embd % a.n_head != 0) {
    std::fprintf(stderr, "--n-embd (%ld) must be a multiple of --n-head (%ld)\n",
                 static_cast<long>(a.n_embd), static_cast<long>(a.n_head));
    std::exit(2);
  }
  if (a.target_accuracy > 0 && a.eval_every == 0) a.eval_every = 100;
  return a;
}

// Exact match: the model must produce every answer digit, greedily, from
// the prompt alone. Each rank decodes its shard of the held-out set;
// gather_for_metrics counts every sample once.
double addition_accuracy(tandem::Accelerator& accelerator, gpt::Gpt& model,
                         tandem::PreparedLoader& loader, int64_t answer_length) {
  torch::NoGradGuard no_grad;
  auto autocast = accelerator.autocast();
  model->eval();
  std::vector<torch::Tensor> correct;
  for (auto& batch : loader) {
    auto sequence = batch[0];
    for (int64_t i = 0; i < answer_length; ++i) {
      auto next = model->forward(sequence).select(1, -1).argmax(-1, /*keepdim=*/true);
      sequence = torch::cat({sequence, next}, 1);
    }
    auto answer = sequence.narrow(1, batch[0].size(1), answer_length);
    correct.push_back(accelerator.gather_for_metrics((answer == batch[1]).all(1).to(torch::kFloat)));
  }
  model->train();
  return torch::cat(correct).mean().item<double>();
}

// Next-character accuracy over the held-out windows.
double text_accuracy(tandem::Accelerator& accelerator, gpt::Gpt& model,
                     tandem::PreparedLoader& loader) {
  torch::NoGradGuard no_grad;
  auto autocast = accelerator.autocast();
  model->eval();
  std::vector<torch::Tensor> correct;
  for (auto& batch : loader) {
    auto hit = (model->forward(batch[0]).argmax(-1) == batch[1]).to(torch::kFloat).mean(1);
    correct.push_back(accelerator.gather_for_metrics(hit));
  }
  model->train();
  return torch::cat(correct).mean().item<double>();
}

// This process's peak resident memory so far, in MiB (Linux reports KiB).
double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// The most CUDA memory tensors held at once on `device`, in MiB: what
// Python's torch.cuda.max_memory_allocated() reports.
double peak_cuda_mb(const c10::Device& device) {
  const auto stats = at::accelerator::getDeviceStats(device.index());
  const auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return static_cast<double>(stats.allocated_bytes[aggregate].peak) / (1024.0 * 1024.0);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  tandem::AcceleratorOptions options;
  if (!args.log_with.empty()) options.log_with = {args.log_with};
  tandem::Accelerator accelerator(options);
  accelerator.set_seed(args.seed);  // the same model and data on every rank

  gpt::GptConfig config;
  config.n_layer = args.n_layer;
  config.n_head = args.n_head;
  config.n_embd = args.n_embd;
  gpt::AdditionTask task{args.digits};
  gpt::TokenData train;
  gpt::HeldOut held_out;
  gpt::TokenData text_test;
  const bool text = !args.data_file.empty();
  if (text) {
    auto data = gpt::make_text_data(args.data_file, args.block_size, args.train_size,
                                    args.test_size, args.seed);
    config.vocab_size = data.vocab_size;
    config.block_size = args.block_size;
    train = data.train;
    text_test = data.test;
  } else {
    auto data = gpt::make_addition_data(task, args.train_size, args.test_size, args.seed);
    config.vocab_size = gpt::kAdditionVocab;
    config.block_size = task.sequence_length();
    train = data.train;
    held_out = data.test;
  }
  if (args.save_every > 0 && args.checkpoint_dir.empty()) {
    std::fprintf(stderr, "--save-every needs --checkpoint-dir\n");
    return 2;
  }

  gpt::Gpt model(config);
  // The flag, or the config's activation_checkpointing block: each block
  // (a tandem::Checkpointed unit, gpt.h) is then recomputed in backward.
  std::size_t checkpointed_blocks = 0;
  if (args.activation_checkpointing) {
    checkpointed_blocks = tandem::set_activation_checkpointing(*model, true);
  }
  checkpointed_blocks = std::max(checkpointed_blocks,
                                 tandem::apply_activation_checkpointing(
                                     *model, accelerator.config().activation_checkpointing));
  auto adamw = std::make_shared<torch::optim::AdamW>(model->parameters(),
                            torch::optim::AdamWOptions(args.lr).weight_decay(0.1));
  tandem::DistributedLoaderOptions loader_options;
  loader_options.batch_size = args.batch_size;
  loader_options.seed = args.seed;
  auto [optimizer, loader] =
      accelerator.prepare(model, adamw, {train.inputs, train.targets}, loader_options);
  // As under HF Accelerate, a prepared scheduler steps once per process per
  // optimizer step (AcceleratorOptions::split_batches makes it once), so a
  // schedule in optimizer steps is scaled by the process count.
  const int64_t processes = accelerator.num_processes();
  tandem::WarmupCosineLROptions schedule;
  schedule.total_num_steps = args.max_steps * processes;
  schedule.warmup_num_steps = std::max<int64_t>(1, args.warmup_steps) * processes;
  schedule.warmup_type = tandem::WarmupType::kLinear;
  schedule.cos_min_ratio = 0.1;
  auto scheduler = accelerator.prepare_scheduler(
      std::make_shared<tandem::WarmupCosineLR>(*optimizer, schedule));

  tandem::DistributedLoaderOptions eval_options;
  eval_options.batch_size = 500;
  eval_options.shuffle = false;
  auto eval_loader = text ? accelerator.prepare_data_loader({text_test.inputs, text_test.targets},
                                                            eval_options)
                          : accelerator.prepare_data_loader({held_out.prompts, held_out.answers},
                                                            eval_options);
  auto evaluate = [&] {
    return text ? text_accuracy(accelerator, model, *eval_loader)
                : addition_accuracy(accelerator, model, *eval_loader, task.answer_length());
  };

  if (!args.checkpoint_dir.empty() && tandem::Accelerator::has_checkpoint(args.checkpoint_dir)) {
    accelerator.load_state(args.checkpoint_dir);
    accelerator.print("resumed from {} at step {} (epoch {})", args.checkpoint_dir,
                      accelerator.step(), loader->epoch());
  }
  const int64_t last_step = args.stop_after > 0 ? std::min(args.stop_after, args.max_steps)
                                                : args.max_steps;
  auto save = [&](int64_t step) {
    tandem::SaveStateOptions save_options;
    save_options.total_limit = args.total_limit;
    accelerator.save_state(args.checkpoint_dir, save_options);
    accelerator.print("saved {}/global_step{}", args.checkpoint_dir, step);
  };

  // The recipe, as hyperparameters (TensorBoard's HParams tab with --log-with).
  accelerator.init_trackers(
      args.metrics_file,
      {{"lr", args.lr}, {"batch_size", args.batch_size}, {"max_steps", args.max_steps},
       {"warmup_steps", args.warmup_steps}, {"n_layer", args.n_layer}, {"n_head", args.n_head},
       {"n_embd", args.n_embd}, {"seed", static_cast<double>(args.seed)},
       {"world_size", static_cast<double>(accelerator.num_processes())}});
  accelerator.print("gpt_addition: {} rank(s), {} parameters, batch {} per rank x {} step(s) of "
                    "accumulation, {} steps, mixed precision {}, activation checkpointing {}",
                    accelerator.num_processes(), [&] {
                      int64_t n = 0;
                      for (const auto& p : model->parameters()) n += p.numel();
                      return n;
                    }(),
                    args.batch_size, accelerator.gradient_accumulation_steps(), args.max_steps,
                    tandem::to_string(accelerator.mixed_precision()),
                    checkpointed_blocks > 0 ? "on" : "off");

  const int64_t tokens_per_micro_step =
      args.batch_size * accelerator.num_processes() * train.inputs.size(1);
  auto bar = accelerator.progress_bar(args.max_steps, "train");
  double train_seconds = 0, loss_value = 0;
  int64_t tokens = 0;
  auto clock = std::chrono::steady_clock::now();
  auto lap = [&] {
    auto now = std::chrono::steady_clock::now();
    train_seconds += std::chrono::duration<double>(now - clock).count();
    clock = now;
  };
  // The held-out accuracy of an evaluation that reached --target-accuracy;
  // every rank sees the same value (gather_for_metrics), so all stop together.
  std::optional<double> reached;
  for (int64_t epoch = loader->epoch(); accelerator.step() < last_step && !reached; ++epoch) {
    loader->set_epoch(epoch);
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      torch::Tensor loss;
      {
        auto autocast = accelerator.autocast();  // bf16/fp16 when configured
        auto logits = model->forward(batch[0]);
        loss = torch::nn::functional::cross_entropy(
            logits.view({-1, config.vocab_size}), batch[1].view({-1}),
            torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
      }
      accelerator.backward(loss);
      optimizer->step();
      scheduler->step();
      tokens += tokens_per_micro_step;
      // Micro-steps that only accumulate, and fp16 steps skipped for an
      // overflow, are not optimizer steps.
      if (!accelerator.sync_gradients() || optimizer->step_was_skipped()) continue;
      const int64_t step = accelerator.step();
      if (step % args.log_every == 0 || step >= last_step) {
        loss_value = accelerator.reduce(loss.detach(), tandem::ReduceOp::kAvg).item<double>();
        lap();
        const double rate = static_cast<double>(tokens) / train_seconds;
        bar.update(step - bar.count(), fmt::format("loss {:.4f} | {:.0f} tok/s", loss_value, rate));
        accelerator.log({{"loss", loss_value}, {"tokens_per_s", rate},
                         {"lr", adamw->param_groups()[0].options().get_lr()},
                         {"loss_scale", accelerator.loss_scale()},
                         {"skipped_steps", static_cast<double>(accelerator.skipped_steps())},
                         {"train_s", train_seconds}},
                        step);
      }
      if (args.eval_every > 0 && step % args.eval_every == 0 && step != args.max_steps) {
        lap();
        const double accuracy = evaluate();
        accelerator.log({{"accuracy", accuracy}, {"train_s", train_seconds}}, step);
        if (args.target_accuracy > 0 && accuracy >= args.target_accuracy) reached = accuracy;
        clock = std::chrono::steady_clock::now();  // evaluation is not training time
      }
      if (args.save_every > 0 && (step % args.save_every == 0 || step == last_step || reached)) {
        lap();
        save(step);
        clock = std::chrono::steady_clock::now();  // saving is not training time
      }
      if (step >= last_step || reached) break;
    }
  }
  lap();
  bar.close();
  if (reached) {
    accelerator.print("reached accuracy {:.4f} (--target-accuracy {}) at step {} after {:.1f} s "
                      "of training", *reached, args.target_accuracy, accelerator.step(),
                      train_seconds);
  }
  const double accuracy = reached ? *reached : evaluate();
  const double tokens_per_s = static_cast<double>(tokens) / train_seconds;
  if (!reached) {
    accelerator.log({{"accuracy", accuracy}, {"train_s", train_seconds}}, accelerator.step());
  }
  accelerator.end_training();
  const std::string cuda_memory =
      accelerator.device().is_cuda()
          ? fmt::format(", \"peak_cuda_mb\": {:.1f}", peak_cuda_mb(accelerator.device()))
          : "";
  accelerator.print("{{\"step\": {}, \"loss\": {:.6f}, \"accuracy\": {:.4f}, \"tokens_per_s\": {:.1f}, "
                    "\"peak_rss_mb\": {:.1f}{}}}",
                    accelerator.step(), loss_value, accuracy, tokens_per_s, peak_rss_mb(),
                    cuda_memory);
  return 0;
}
