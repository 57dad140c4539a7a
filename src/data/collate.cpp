#include "tandem/data/collate.h"

#include <algorithm>

#include <ATen/Functions.h>
#include <c10/util/StringUtil.h>

#include "tandem/core/error.h"

namespace tandem {
namespace {

// Checks the samples' field counts and returns it.
size_t collate_field_count(const std::vector<Sample>& samples, const char* who) {
  TANDEM_CHECK_ARG(!samples.empty(), "{}: no samples to collate.", who);
  const size_t fields = samples[0].size();
  for (size_t i = 1; i < samples.size(); ++i) {
    TANDEM_CHECK_ARG(samples[i].size() == fields,
                     "{}: sample {} of the batch has {} fields but sample 0 has {}. Every "
                     "sample must have the same fields, in the same order.",
                     who, i, samples[i].size(), fields);
  }
  return fields;
}

std::vector<at::Tensor> collate_column(const std::vector<Sample>& samples, size_t f) {
  std::vector<at::Tensor> out;
  out.reserve(samples.size());
  for (const auto& s : samples) out.push_back(s[f]);
  return out;
}

}  // namespace

DistributedLoader::Batch stack_collate(const std::vector<Sample>& samples) {
  const size_t fields = collate_field_count(samples, "stack_collate");
  DistributedLoader::Batch batch;
  batch.reserve(fields);
  for (size_t f = 0; f < fields; ++f) {
    const auto col = collate_column(samples, f);
    for (size_t i = 0; i < col.size(); ++i) {
      TANDEM_CHECK_ARG(col[i].defined(), "stack_collate: field {} of sample {} is undefined.", f,
                       i);
      TANDEM_CHECK_ARG(col[i].sizes() == col[0].sizes(),
                       "stack_collate: field {} of sample {} has shape {} but sample 0's has "
                       "{}. Stacking needs equal shapes; for variable lengths use "
                       "tandem::PadCollate.",
                       f, i, c10::str(col[i].sizes()), c10::str(col[0].sizes()));
    }
    batch.push_back(at::stack(col));
  }
  return batch;
}

DistributedLoader::Batch PadCollate::operator()(const std::vector<Sample>& samples) const {
  const size_t fields = collate_field_count(samples, "PadCollate");
  const auto n = static_cast<int64_t>(samples.size());
  TANDEM_CHECK_ARG(!(mask || lengths) || mask_field < fields,
                   "PadCollate: mask_field is {} but samples have {} fields. Set mask_field to "
                   "the variable-length field the mask describes.",
                   mask_field, fields);
  DistributedLoader::Batch batch;
  batch.reserve(fields + 2);
  std::vector<int64_t> mask_lengths;
  for (size_t f = 0; f < fields; ++f) {
    const auto col = collate_column(samples, f);
    const at::Tensor& first = col[0];
    for (size_t i = 0; i < col.size(); ++i) {
      TANDEM_CHECK_ARG(col[i].defined(), "PadCollate: field {} of sample {} is undefined.", f, i);
      const bool same_rank = col[i].dim() == first.dim();
      const bool same_tail = same_rank && (first.dim() == 0 || col[i].sizes().slice(1) ==
                                                                   first.sizes().slice(1));
      TANDEM_CHECK_ARG(same_tail && col[i].scalar_type() == first.scalar_type(),
                       "PadCollate: field {} of sample {} is {} {} but sample 0's is {} {}. "
                       "Samples may differ only in dim 0 (the length), with the same dtype.",
                       f, i, c10::str(col[i].scalar_type()), c10::str(col[i].sizes()),
                       c10::str(first.scalar_type()), c10::str(first.sizes()));
    }
    if (first.dim() == 0) {
      TANDEM_CHECK_ARG(!((mask || lengths) && f == mask_field),
                       "PadCollate: mask_field {} is a 0-dim field, which has no length. Point "
                       "mask_field at a sequence field.",
                       f);
      batch.push_back(at::stack(col));
      continue;
    }
    int64_t longest = 0;
    for (const auto& t : col) longest = std::max(longest, t.size(0));
    std::vector<int64_t> shape = first.sizes().vec();
    shape.insert(shape.begin(), n);
    shape[1] = longest;
    at::Tensor out = at::full(shape, padding_value, first.options());
    for (int64_t i = 0; i < n; ++i) {
      const auto& t = col[static_cast<size_t>(i)];
      out.select(0, i).narrow(0, 0, t.size(0)).copy_(t);
    }
    if (f == mask_field) {
      for (const auto& t : col) mask_lengths.push_back(t.size(0));
    }
    batch.push_back(std::move(out));
  }
  if (mask || lengths) {
    const at::Tensor len = at::tensor(mask_lengths, at::kLong);
    if (mask) {
      const int64_t longest = batch[mask_field].size(1);
      batch.push_back(at::arange(longest, at::kLong).unsqueeze(0).lt(len.unsqueeze(1)));
    }
    if (lengths) batch.push_back(len);
  }
  return batch;
}

}  // namespace tandem
