// `tandem config` on a real pseudo-terminal: arrow keys and digits pick
// the choices, and the terminal's mode always comes back.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <string>
#include <vector>

#include "launch/config_cli_helpers.h"
#include "tandem/config/config.h"

namespace tandem {
namespace {

using testing::file_exists;
using testing::remaining_ms;
using testing::tandem_in;
using testing::TempDir;
using testing::wait_for_exit;

const char* kUp = "\x1b[A";
const char* kDown = "\x1b[B";
const char* kDownApp = "\x1bOB";  // down in application cursor mode

// A child process whose stdin, stdout and stderr are a pseudo-terminal.
// The test keeps its own handle on the terminal's slave side, so the
// terminal (and its mode) outlives the child and can be inspected after it
// exits.
class PtyProcess {
 public:
  explicit PtyProcess(const std::vector<std::string>& argv) {
    master_ = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master_ < 0 || ::grantpt(master_) != 0 || ::unlockpt(master_) != 0) return;
    const std::string name = ::ptsname(master_);
    slave_ = ::open(name.c_str(), O_RDWR | O_NOCTTY | O_CLOEXEC);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setsid();
      int tty = ::open(name.c_str(), O_RDWR);  // becomes the controlling terminal
      ::ioctl(tty, TIOCSCTTY, 0);
      ::dup2(tty, 0);
      ::dup2(tty, 1);
      ::dup2(tty, 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
  }
  ~PtyProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (slave_ >= 0) ::close(slave_);
    if (master_ >= 0) ::close(master_);
  }
  bool ok() const { return master_ >= 0 && slave_ >= 0 && pid_ > 0; }

  // Reads the child's output until `text` appears after everything matched
  // so far, or `timeout_s` passes. Blocks in poll(): no sleeping.
  bool expect(const std::string& text, double timeout_s = 30) {
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::duration<double>(timeout_s));
    for (;;) {
      auto at = output_.find(text, matched_);
      if (at != std::string::npos) {
        matched_ = at + text.size();
        return true;
      }
      pollfd p{master_, POLLIN, 0};
      if (::poll(&p, 1, remaining_ms(deadline)) <= 0) return false;
      char chunk[4096];
      ssize_t n = ::read(master_, chunk, sizeof(chunk));
      if (n <= 0) return false;
      output_.append(chunk, static_cast<size_t>(n));
    }
  }

  void type(const std::string& bytes) { (void)!::write(master_, bytes.data(), bytes.size()); }

  termios mode() const {
    termios t{};
    ::tcgetattr(slave_, &t);
    return t;
  }

  // Waits for the child; returns its wait status, or -1 on timeout.
  int wait(double timeout_s = 30) {
    int status = 0;
    if (!wait_for_exit(pid_, timeout_s)) return -1;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }

  const std::string& output() const { return output_; }

 private:
  int master_ = -1;
  int slave_ = -1;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string output_;
  size_t matched_ = 0;
};

bool raw(const termios& t) { return (t.c_lflag & (ICANON | ECHO)) == 0; }

void expect_same_mode(const termios& before, const termios& after) {
  EXPECT_EQ(before.c_lflag, after.c_lflag) << "local modes (ICANON, ECHO, ISIG) not restored";
  EXPECT_EQ(before.c_iflag, after.c_iflag);
  EXPECT_EQ(before.c_oflag, after.c_oflag);
  EXPECT_EQ(before.c_cc[VMIN], after.c_cc[VMIN]);
  EXPECT_EQ(before.c_cc[VTIME], after.c_cc[VTIME]);
}

TEST(ConfigWizardTty, ArrowKeysAndDigitsPickTheChoices) {
  TempDir home;
  const std::string path = home.path() + "/tandem.yaml";
  PtyProcess p(tandem_in(home.path(), {"config", "--config-file", path}));
  ASSERT_TRUE(p.ok());
  const termios before = p.mode();
  ASSERT_FALSE(raw(before));

  ASSERT_TRUE(p.expect("In which compute environment")) << p.output();
  ASSERT_TRUE(p.expect("This machine")) << p.output();
  EXPECT_TRUE(raw(p.mode())) << "a menu reads keys one by one";
  p.type("\r");  // the default: this machine

  ASSERT_TRUE(p.expect("Which type of machine")) << p.output();
  ASSERT_TRUE(p.expect("multi-GPU")) << p.output();
  p.type(std::string(kDown) + kDown + kUp + "\r");  // multi-CPU

  ASSERT_TRUE(p.expect("How many different machines")) << p.output();
  EXPECT_FALSE(raw(p.mode())) << "typed answers use the terminal's line editing";
  p.type("abc\r");
  ASSERT_TRUE(p.expect("'abc' is not a whole number")) << p.output();
  ASSERT_TRUE(p.expect("How many different machines")) << "asked again: " << p.output();
  p.type("\r");  // 1

  ASSERT_TRUE(p.expect("How many CPU processes")) << p.output();
  p.type("2\r");

  ASSERT_TRUE(p.expect("mixed precision")) << p.output();
  ASSERT_TRUE(p.expect("bf16")) << p.output();  // fp16 is not offered on CPUs
  p.type("1\r");  // a digit: bf16

  ASSERT_TRUE(p.expect("Which ZeRO stage")) << p.output();
  ASSERT_TRUE(p.expect("gradients and parameters")) << p.output();
  p.type(std::string(kDownApp) + kDown + "\r");  // stage 2

  ASSERT_TRUE(p.expect("optimizer states be offloaded")) << p.output();
  ASSERT_TRUE(p.expect("cpu")) << p.output();
  p.type(std::string(kUp) + "\r");  // wraps from none to cpu

  ASSERT_TRUE(p.expect("gradient accumulation")) << p.output();
  p.type("8\r");
  ASSERT_TRUE(p.expect("Clip gradients")) << p.output();
  p.type("0.5\r");

  ASSERT_TRUE(p.expect("saved at " + path)) << p.output();
  int status = p.wait();
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << p.output();
  expect_same_mode(before, p.mode());

  Config config = load_config_file(path);
  EXPECT_EQ(config.distributed_type, DistributedType::kMultiCpu);
  EXPECT_EQ(config.num_processes, 2);
  EXPECT_EQ(config.num_machines, 1);
  EXPECT_EQ(config.mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(config.zero.stage, 2);
  EXPECT_EQ(config.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(config.gradient_accumulation_steps, 8);
  EXPECT_DOUBLE_EQ(config.gradient_clipping, 0.5);
}

TEST(ConfigWizardTty, CtrlCInAMenuRestoresTheTerminalAndWritesNothing) {
  TempDir home;
  const std::string path = home.path() + "/tandem.yaml";
  PtyProcess p(tandem_in(home.path(), {"config", "--config-file", path}));
  ASSERT_TRUE(p.ok());
  const termios before = p.mode();
  ASSERT_TRUE(p.expect("This machine")) << p.output();
  ASSERT_TRUE(raw(p.mode()));
  p.type("\x03");  // the terminal turns Ctrl-C into SIGINT
  int status = p.wait();
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status << ": " << p.output();
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  expect_same_mode(before, p.mode());
  EXPECT_FALSE(file_exists(path));
}

TEST(ConfigWizardTty, CtrlDInAMenuExitsTwoAndRestoresTheTerminal) {
  TempDir home;
  const std::string path = home.path() + "/tandem.yaml";
  PtyProcess p(tandem_in(home.path(), {"config", "--config-file", path}));
  ASSERT_TRUE(p.ok());
  const termios before = p.mode();
  ASSERT_TRUE(p.expect("This machine")) << p.output();
  p.type("\r");
  ASSERT_TRUE(p.expect("multi-GPU")) << p.output();
  p.type(std::string(kDown) + "\x04");
  ASSERT_TRUE(p.expect("input ended")) << p.output();
  int status = p.wait();
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 2);
  expect_same_mode(before, p.mode());
  EXPECT_FALSE(file_exists(path));
}

}  // namespace
}  // namespace tandem
