// `cachetune serve` as a child process for tests that drive the real binary over loopback: the
// given arguments plus --port on a free port, optional environment, stderr kept in a file for
// failure messages; start() waits for /health, the destructor stops it (SIGTERM, then SIGKILL).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace ct::test {

class ServeProcess {
 public:
  ServeProcess() = default;
  ~ServeProcess() { stop(); }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  // Runs `cli serve --port P args...` with `env` added to this process's environment and stderr
  // written to log_path. True once GET /health answers 200 (within timeout_s); false with *err
  // (the log's tail) when the child exited or never answered.
  bool start(const std::string& cli, const std::vector<std::string>& args,
             const std::vector<std::pair<std::string, std::string>>& env,
             const std::string& log_path, std::string* err, double timeout_s = 120);
  void stop();
  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const;  // what the server wrote to stderr so far

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
};

}  // namespace ct::test
