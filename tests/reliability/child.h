// Running a tool as a child process: optional RLIMIT_FSIZE (with SIGXFSZ ignored, so that a write past
// the limit fails with EFBIG as on a full disk), stderr captured, or killed at a chosen instant.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace dlm::test {

struct ChildResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string err;
};

// Starts argv[0] with argv; stderr goes to `err_path`. `fsize_limit` 0: no limit.
inline pid_t spawn(const std::vector<std::string>& argv, const std::string& err_path, rlim_t fsize_limit = 0) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  const int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 2);
  const int null = ::open("/dev/null", O_WRONLY);
  ::dup2(null, 1);
  if (fsize_limit) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit r{fsize_limit, fsize_limit};
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  ::_exit(127);
}

inline ChildResult wait_child(pid_t pid, const std::string& err_path) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  ChildResult r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  std::ifstream in(err_path);
  std::stringstream s;
  s << in.rdbuf();
  r.err = s.str();
  return r;
}

// When `pid` ends by itself before `deadline`, the instant it was seen ended; nullopt when it still runs at
// `deadline`. The child is left unreaped, for wait_child.
inline std::optional<std::chrono::steady_clock::time_point> exit_time_before(pid_t pid,
                                                                            std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    siginfo_t info{};
    const auto now = std::chrono::steady_clock::now();
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) return now;
    if (now >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(deadline - now, std::chrono::microseconds(200)));
  }
}

inline ChildResult run(const std::vector<std::string>& argv, const std::string& err_path, rlim_t fsize_limit = 0) {
  return wait_child(spawn(argv, err_path, fsize_limit), err_path);
}

inline std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  if (std::filesystem::exists(dir))
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

// The pid of a running process named `comm` whose environment holds every entry of `env` ("NAME=value");
// 0 when there is none (a launcher's rank, found by its rank variable and a tag the test put in the job's
// environment).
inline pid_t process_with_environment(const std::string& comm, const std::vector<std::string>& env) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream comm_file(entry.path() / "comm");
    std::string c;
    std::getline(comm_file, c);
    if (c != comm) continue;
    std::ifstream env_file(entry.path() / "environ");
    const std::string z(1, '\0');
    const std::string all = z + std::string((std::istreambuf_iterator<char>(env_file)), std::istreambuf_iterator<char>());
    bool every = true;
    for (const auto& e : env) every = every && all.find(z + e + z) != std::string::npos;
    if (every) return static_cast<pid_t>(std::stoi(name));
  }
  return 0;
}

}  // namespace dlm::test
