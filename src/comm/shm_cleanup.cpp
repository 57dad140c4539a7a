#include "tandem/comm/shm_cleanup.h"

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <string>

namespace tandem {
namespace {

// The creator pid of a tandem segment's file name, or 0.
long creator_of(const char* name) {
  constexpr char kPrefix[] = "tandem-";
  const std::string text(name);
  if (text.rfind(kPrefix, 0) != 0) return 0;
  char* end = nullptr;
  const long pid = std::strtol(text.c_str() + sizeof kPrefix - 1, &end, 10);
  return end != nullptr && *end == '-' && pid > 0 ? pid : 0;
}

template <typename Remove>
int sweep(Remove should_remove) {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const long pid = creator_of(entry->d_name);
    if (pid == 0 || !should_remove(pid, entry->d_name)) continue;
    if (::shm_unlink((std::string("/") + entry->d_name).c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

}  // namespace

int remove_shared_memory_of(int pid) {
  return sweep([&](long creator, const char*) { return creator == pid; });
}

int remove_stale_shared_memory(double min_age_s) {
  const std::time_t now = std::time(nullptr);
  return sweep([&](long creator, const char* name) {
    if (::kill(static_cast<pid_t>(creator), 0) == 0 || errno != ESRCH) return false;
    struct stat info {};
    if (::stat((std::string("/dev/shm/") + name).c_str(), &info) != 0) return false;
    return std::difftime(now, info.st_mtime) >= min_age_s;
  });
}

}  // namespace tandem
