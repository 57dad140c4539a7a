#pragma once
// DeepSpeed's hostfile ("worker-1 slots=4" per line) and the slots a
// `tandem launch --hostfile` job runs on each host after --include /
// --exclude (DeepSpeed's "host:0,1@host2" syntax over the hostfile's hosts),
// or after --num-nodes / --num-gpus (the first N hosts, the first N slots).

#include <optional>
#include <string>
#include <vector>

namespace tandem::cli {

struct HostfileHost {
  std::string name;
  int slots = 0;
};

// The hosts of `path` in file order. Blank lines and "#" comments are
// skipped. Throws UsageError naming the file and line for a line that is not
// "HOST slots=N" (N >= 1), a host listed twice, or a file with no host.
std::vector<HostfileHost> read_hostfile(const std::string& path);
// The same, from the file's text (`path` names it in errors).
std::vector<HostfileHost> parse_hostfile(const std::string& text, const std::string& path);

struct SelectedHost {
  std::string name;
  int pool = 0;            // the hostfile's slots: the host's slot ids are 0..pool-1
  std::vector<int> slots;  // the ones this job runs, ascending
};

// The hosts and slots the job runs, in hostfile order (also when --include
// names them in another order, as DeepSpeed's runner does). `num_nodes` keeps the first N hosts and `num_gpus` the
// first N slots of each; neither goes with --include/--exclude (DeepSpeed's
// rule). Hosts left with no slot are dropped. Throws UsageError when a
// filter names a host not in the hostfile or a slot beyond its slots, or
// nothing is left.
std::vector<SelectedHost> select_hostfile_slots(const std::vector<HostfileHost>& hosts,
                                                const std::string& include,
                                                const std::string& exclude,
                                                std::optional<int> num_nodes,
                                                std::optional<int> num_gpus,
                                                const std::string& path);

// The selection as one --include filter ("h1:0,1@h2:0") that every host's
// launcher is given, so that each finds its own slots and the world size.
std::string include_filter(const std::vector<SelectedHost>& hosts);

}  // namespace tandem::cli
