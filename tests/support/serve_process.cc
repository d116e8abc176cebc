// ServeProcess (see serve_process.h).
#include "support/serve_process.h"

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "support/chunk_fixtures.h"

namespace ct::test {

bool ServeProcess::start(const std::string& cli, const std::vector<std::string>& args,
                         const std::vector<std::pair<std::string, std::string>>& env,
                         const std::string& log_path, std::string* err, double timeout_s) {
  stop();
  log_path_ = log_path;
  port_ = pick_free_port(20000, 60000);
  std::vector<std::string> argv = {cli, "serve", "--port", std::to_string(port_)};
  argv.insert(argv.end(), args.begin(), args.end());
  pid_ = ::fork();
  if (pid_ < 0) {
    if (err) *err = "fork failed";
    return false;
  }
  if (pid_ == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDERR_FILENO);
      ::dup2(fd, STDOUT_FILENO);
    }
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execv(cli.c_str(), cargv.data());
    _exit(127);
  }
  httplib::Client c("127.0.0.1", port_);
  c.set_connection_timeout(1, 0);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds((int64_t)(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      if (err) *err = "cachetune serve exited before answering: " + log();
      return false;
    }
    auto h = c.Get("/health");
    if (h && h->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (err) *err = "cachetune serve did not answer /health in time: " + log();
  stop();
  return false;
}

void ServeProcess::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string ServeProcess::log() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
}

}  // namespace ct::test
