#pragma once
// ProcessMesh: a group's ranks laid out as hosts x ranks per host, with a
// subgroup along each named dimension (torch's init_device_mesh in 2-D).
//
// Rank r sits at host r / ranks_per_host and local rank r % ranks_per_host
// (row-major, as launchers number ranks host by host). Along dimension 0
// ("host" by default) lie the ranks with this rank's local rank, one per
// host: the group that replicates across hosts in HSDP. Along dimension 1
// ("local") lie the ranks of this rank's host: the group that shards within
// it, carried by shared memory. A dimension of size 1 gives a group of one
// rank, whose collectives are local copies.
//
// Building a mesh is a collective of the parent group (two split_group
// calls): every rank builds it with the same shape, in the same order
// relative to its other collectives. Thread-safety: const methods may be
// called from any thread; each subgroup has ProcessGroup's rules. The mesh
// holds shared ownership of the parent and of its subgroups.

#include <array>
#include <memory>
#include <string>

#include "tandem/comm/process_group.h"

namespace tandem {

class ProcessMesh {
 public:
  // Lays out `parent`'s ranks as shape = {hosts, ranks_per_host}; throws
  // UsageError unless hosts * ranks_per_host == parent->world_size(), or on
  // equal or empty dimension names.
  ProcessMesh(std::shared_ptr<ProcessGroup> parent, std::array<int, 2> shape,
              std::array<std::string, 2> dim_names = {"host", "local"});
  // Derives the shape from which ranks share a host (ProcessGroup::host_id):
  // one row per host. Throws UsageError, naming the ranks and hosts, when the
  // hosts hold different numbers of ranks or a host's ranks are not
  // consecutive. One more collective (a gather of host ids) than the above.
  explicit ProcessMesh(std::shared_ptr<ProcessGroup> parent,
                       std::array<std::string, 2> dim_names = {"host", "local"});

  // The subgroup along dimension `dim` that holds this rank. Throws
  // UsageError naming the dimensions when `dim` is not one.
  std::shared_ptr<ProcessGroup> group(const std::string& dim) const;
  // This rank's index along `dim` (its host, or its rank within the host),
  // which is also its rank in group(dim).
  int coordinate(const std::string& dim) const;
  // Number of ranks along `dim`.
  int size(const std::string& dim) const;

  const std::array<int, 2>& shape() const { return shape_; }
  const std::array<std::string, 2>& dim_names() const { return names_; }
  ProcessGroup& parent() const { return *parent_; }

 private:
  void build();
  int index_of(const std::string& dim) const;

  std::shared_ptr<ProcessGroup> parent_;
  std::array<int, 2> shape_;
  std::array<std::string, 2> names_;
  std::array<std::shared_ptr<ProcessGroup>, 2> groups_;
};

}  // namespace tandem
