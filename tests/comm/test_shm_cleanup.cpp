// Segments dead processes left in /dev/shm: removed by creator (what
// `tandem launch` does for each worker it reaps) and, past an age, for any
// creator that is gone; a live creator's segment is never touched.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "tandem/comm/shm_cleanup.h"

namespace tandem {
namespace {

// The pid of a process that has exited (and been reaped).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// /dev/shm/tandem-<pid>-<tag>, last written `age_s` ago.
std::string segment(pid_t pid, const std::string& tag, int age_s) {
  const std::string name = "tandem-" + std::to_string(pid) + "-cleanuptest" + tag;
  const int fd = ::shm_open(("/" + name).c_str(), O_CREAT | O_RDWR, 0600);
  EXPECT_GE(fd, 0);
  ::close(fd);
  timeval times[2];
  ::gettimeofday(&times[0], nullptr);
  times[0].tv_sec -= age_s;
  times[1] = times[0];
  ::utimes(("/dev/shm/" + name).c_str(), times);
  return name;
}

bool exists(const std::string& name) { return ::access(("/dev/shm/" + name).c_str(), F_OK) == 0; }

TEST(ShmCleanup, RemovesADeadCreatorsOldSegmentsAndNeverALiveOnes) {
  const pid_t dead = dead_pid();
  const pid_t live = ::fork();  // a creator that runs until the test ends
  if (live == 0) {
    ::pause();
    ::_exit(0);
  }
  const std::string old_dead = segment(dead, "a", 3600);
  const std::string new_dead = segment(dead, "b", 0);
  const std::string old_live = segment(live, "c", 3600);
  EXPECT_GE(remove_stale_shared_memory(600), 1);
  EXPECT_FALSE(exists(old_dead));
  EXPECT_TRUE(exists(new_dead)) << "younger than the age limit";
  EXPECT_TRUE(exists(old_live)) << "its creator runs";
  EXPECT_EQ(remove_shared_memory_of(dead), 1);
  EXPECT_FALSE(exists(new_dead));
  EXPECT_EQ(remove_shared_memory_of(live), 1);
  EXPECT_FALSE(exists(old_live));
  ::kill(live, SIGKILL);
  ::waitpid(live, nullptr, 0);
}

}  // namespace
}  // namespace tandem
