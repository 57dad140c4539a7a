// detail::accelerate_batch_shard (distributed_sampler.h): which samples HF
// Accelerate's prepared loaders give each rank, BatchSamplerShard's and
// DataLoaderDispatcher's rules, for DistributedLoaderOptions::Sharding
// kBatches and kDispatched. Checked index for index against vectors recorded
// with Accelerate (tests/data/test_accelerate_sharding.cpp).

#include <algorithm>
#include <cstddef>

#include "tandem/data/distributed_sampler.h"

namespace tandem {

namespace detail {
namespace {

using Indices = std::vector<int64_t>;

// `data` repeated until it holds at least `size` entries (Accelerate's
// "degenerate" case of fewer samples than one round needs).
Indices repeated_to(Indices data, size_t size) {
  const Indices once = data;
  while (!once.empty() && data.size() < size) data.insert(data.end(), once.begin(), once.end());
  return data;
}

// Whole batches, batch k to rank k % replicas (BatchSamplerShard without
// split_batches).
Indices deal_batches(const Indices& order, size_t bs, size_t replicas, size_t rank,
                     bool drop_last, bool even_batches) {
  std::vector<Indices> batches;
  for (size_t begin = 0; begin < order.size(); begin += bs) {
    const size_t end = std::min(begin + bs, order.size());
    if (drop_last && end - begin < bs) break;
    batches.emplace_back(order.begin() + begin, order.begin() + end);
  }
  Indices out, initial, pending;
  for (size_t k = 0; k < batches.size(); ++k) {
    if (!drop_last && k < replicas) initial.insert(initial.end(), batches[k].begin(), batches[k].end());
    if (k % replicas == rank) pending = batches[k];
    // A round is handed out once its last batch is full.
    if (k % replicas == replicas - 1 && batches[k].size() == bs) {
      out.insert(out.end(), pending.begin(), pending.end());
      pending.clear();
    }
  }
  if (drop_last || initial.empty()) return out;
  if (!even_batches) {
    out.insert(out.end(), pending.begin(), pending.end());
    return out;
  }
  if (pending.size() == bs) out.insert(out.end(), pending.begin(), pending.end());
  initial = repeated_to(initial, replicas * bs);
  // Complete the last batch and the round from the epoch's first samples.
  size_t k = batches.size() - 1;
  Indices batch = batches.back();
  if (batch.size() == bs) {
    batch.clear();
    ++k;
  }
  size_t cycle = 0;
  while (k % replicas != 0 || !batch.empty()) {
    const size_t end = cycle + bs - batch.size();
    batch.insert(batch.end(), initial.begin() + cycle, initial.begin() + end);
    if (k % replicas == rank) out.insert(out.end(), batch.begin(), batch.end());
    cycle = end;
    batch.clear();
    ++k;
  }
  return out;
}

// Slices of global batches (BatchSamplerShard with split_batches).
Indices split_batches(const Indices& order, size_t bs, size_t replicas, size_t rank,
                      bool drop_last, bool even_batches) {
  const size_t global = bs * replicas;
  auto slice = [&](const Indices& batch) {
    const size_t begin = std::min(rank * bs, batch.size());
    const size_t end = std::min(begin + bs, batch.size());
    return Indices(batch.begin() + begin, batch.begin() + end);
  };
  Indices out, last;
  for (size_t begin = 0; begin < order.size(); begin += global) {
    last.assign(order.begin() + begin, order.begin() + std::min(begin + global, order.size()));
    if (last.size() == global) {
      const Indices part = slice(last);
      out.insert(out.end(), part.begin(), part.end());
    }
  }
  if (drop_last || order.empty() || last.size() == global) return out;
  if (even_batches) {
    const Indices first(order.begin(), order.begin() + std::min(global, order.size()));
    const Indices filler = repeated_to(first, global);
    last.insert(last.end(), filler.begin(), filler.end());
  }
  const Indices part = slice(last);
  out.insert(out.end(), part.begin(), part.end());
  return out;
}

// DataLoaderDispatcher's: joins of `join` samples (R batches, or one global
// batch), each sliced into R equal parts; the short last join's parts are
// len / R long, one more when R does not divide len (the join completed
// with the first join's first R samples).
Indices dispatch(const Indices& order, size_t join, size_t replicas, size_t rank,
                 bool drop_last) {
  Indices out;
  const Indices first(order.begin(), order.begin() + std::min(replicas, order.size()));
  for (size_t begin = 0; begin < order.size(); begin += join) {
    Indices batch(order.begin() + begin, order.begin() + std::min(begin + join, order.size()));
    const bool last = begin + join >= order.size();
    if (drop_last && batch.size() < join) break;
    size_t part = batch.size() / replicas;
    if (last && !drop_last && batch.size() % replicas != 0) {
      batch.insert(batch.end(), first.begin(), first.end());
      ++part;
    }
    const size_t lo = std::min(rank * part, batch.size());
    const size_t hi = std::min(lo + part, batch.size());
    out.insert(out.end(), batch.begin() + lo, batch.begin() + hi);
  }
  return out;
}

}  // namespace

std::vector<int64_t> accelerate_batch_shard(const std::vector<int64_t>& order,
                                            int64_t batch_size, int64_t replicas, int64_t rank,
                                            bool dispatched, bool split, bool drop_last,
                                            bool even_batches) {
  const auto bs = static_cast<size_t>(batch_size);
  const auto world = static_cast<size_t>(replicas);
  const auto me = static_cast<size_t>(rank);
  if (dispatched) return dispatch(order, bs * world, world, me, drop_last);
  if (world == 1) {
    // One process: Accelerate's prepare_data_loader shards nothing (no
    // BatchSamplerShard), so the epoch is the plain loader's, its last batch
    // short rather than completed from the epoch's start.
    const size_t kept = drop_last ? order.size() / bs * bs : order.size();
    return Indices(order.begin(), order.begin() + kept);
  }
  return split ? split_batches(order, bs, world, me, drop_last, even_batches)
               : deal_batches(order, bs, world, me, drop_last, even_batches);
}

}  // namespace detail

}  // namespace tandem
