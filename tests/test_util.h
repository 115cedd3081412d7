// Shared test helpers: golden data, scratch directories, and a real expertd process.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace expertd::test {

namespace fs = std::filesystem;

inline std::string golden_dir() {
  return EXPERTD_GOLDEN_DIR;
}
inline std::string bin(const std::string& rel) {
  return std::string(EXPERTD_BIN_DIR) + "/" + rel;
}

// A case's folder: "quant/<id>" names one of the weight-type cases (golden/quant/), "<family>/<id>"
// one of this tree's (tests/data/<family>: synth recipes and llama.cpp's logits, for kimi-k3,
// deepseek4, qwen35, mistral3, dsa, minimax, ling, ling3, ernie, exaone, llama4, hy3, trinity,
// mimo, laguna, step), any other id (no folder) one of golden/cases/.
inline std::string golden_case_dir(const std::string& case_id) {
  if (!case_id.starts_with("quant/") && case_id.find('/') != std::string::npos)
    return std::string(EXPERTD_SOURCE_DIR) + "/tests/data/" + case_id;
  return golden_dir() + (case_id.starts_with("quant/") ? "/" : "/cases/") + case_id;
}
inline std::string golden_model(const std::string& case_id) {
  return golden_case_dir(case_id) + "/model.gguf";
}

inline std::vector<std::string> golden_cases() {
  std::vector<std::string> out;
  if (!fs::exists(golden_dir() + "/cases")) return out;
  for (const auto& e : fs::directory_iterator(golden_dir() + "/cases"))
    if (fs::exists(e.path() / "model.gguf")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Skips without ../shared/golden; CI builds with EXPERTD_REQUIRE_GOLDEN so a missing copy fails.
#define REQUIRE_GOLDEN()                                                                     \
  do {                                                                                       \
    if (!std::filesystem::exists(::expertd::test::golden_dir() + "/cases")) {                \
      if (EXPERTD_REQUIRE_GOLDEN)                                                            \
        FAIL() << "golden data required but not found at " << ::expertd::test::golden_dir(); \
      GTEST_SKIP() << "golden data not found at " << ::expertd::test::golden_dir();          \
    }                                                                                        \
  } while (0)

// A scratch directory on the same file system as the build (O_DIRECT capable), removed after.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "expertd-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& p, const std::string& data) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << data;
}

// Runs a command; returns {exit status, stdout+stderr}.
inline std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

inline bool socket_accepts(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// The daemon the tests start: expertd, or in a build against the CPU emulation of the CUDA
// runtime (tests/cuda_emu) the same daemon built against it, whose cuda arena it emulates.
#ifdef EXPERTD_CUDA_EMULATION
inline const std::string kEmuSuffix = "_emu";  // expertd_emu, expert-run_emu, expert-bench_emu
#else
inline const std::string kEmuSuffix;
#endif
inline const std::string kExpertdBin = "daemon/expertd" + kEmuSuffix;

// A real expertd process. start() waits until its socket accepts connections.
class Daemon {
 public:
  Daemon(std::string manifest, std::string socket, std::vector<std::string> extra = {})
      : manifest_(std::move(manifest)), socket_(std::move(socket)), extra_(std::move(extra)) {}
  ~Daemon() { stop(); }

  // Returns false (and the log) when the daemon exits before serving.
  bool start(std::string* log_out = nullptr) {
    log_path_ = socket_ + ".log";
    write_file(socket_ + ".conf", "# empty: the tests pass every setting as a flag\n");
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<std::string> args = {
          bin(kExpertdBin),  "--manifest",    manifest_, "--socket",      socket_, "--config",
          socket_ + ".conf", "--lock-memory", "false",   "--reserve-mib", "64"};
      args.insert(args.end(), extra_.begin(), extra_.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      FILE* f = std::fopen(log_path_.c_str(), "w");
      ::dup2(fileno(f), 1);
      ::dup2(fileno(f), 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 500; ++i) {
      if (socket_accepts(socket_)) return true;
      int st;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        exit_status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (log_out) *log_out = read_file(log_path_);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (log_out) *log_out = "timed out waiting for the socket\n" + read_file(log_path_);
    return false;
  }

  // SIGTERM and wait; returns the exit status.
  int stop() {
    if (pid_ <= 0) return exit_status_;
    ::kill(pid_, SIGTERM);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    exit_status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return exit_status_;
  }
  bool alive() const { return pid_ > 0 && ::kill(pid_, 0) == 0; }
  pid_t pid() const { return pid_; }
  std::string log() const { return read_file(log_path_); }
  int exit_status() const { return exit_status_; }

 private:
  std::string manifest_, socket_, log_path_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
  int exit_status_ = -1;
};

}  // namespace expertd::test
