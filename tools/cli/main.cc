// Entry point of the `cachetune` command-line tool: dispatches to the sub-commands and turns
// ct::Error into a one-line message and exit status 1.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/blas_core.h"
#include "core/error.h"
#include "tools/cli/commands.h"

namespace {

// When OpenBLAS fell back to pre-AVX2 kernels on a CPU it does not know (backend/cpu/blas_core.h),
// starts this program again, same arguments and process id, with OPENBLAS_CORETYPE naming the
// right ones. Quiet: `cachetune bench` prints the core in use. A set OPENBLAS_CORETYPE is left
// alone (the restarted program sees its own), so this happens at most once. Only when
// /proc/self/exe is this program (not a loader or valgrind running it: their argv would not
// fit); CT_BLAS_RESTART carries the old core, so the restarted program can say when OpenBLAS
// did not take the new one.
void restart_with_the_right_blas_core(char** argv) {
  if (const char* old = std::getenv("CT_BLAS_RESTART")) {
    const std::string was = old, now = ct::cpu::blas_core_name();  // was: before the restart
    ::unsetenv("CT_BLAS_RESTART");
    if (!ct::cpu::better_blas_core(now, ct::cpu::host_blas_cpu()).empty()) {
      std::fprintf(stderr,
                   "cachetune: warning: OpenBLAS did not take OPENBLAS_CORETYPE=%s; it runs its "
                   "%s kernels as before the restart (%s); set OPENBLAS_CORETYPE to a core it "
                   "knows\n",
                   std::getenv("OPENBLAS_CORETYPE"), now.c_str(), was.c_str());
    }
    return;
  }
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || argv[0] == nullptr) return;
  const std::string core = ct::cpu::blas_core_name();
  const std::string better = ct::cpu::better_blas_core(core, ct::cpu::host_blas_cpu());
  if (better.empty()) return;
  char exe[4096];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) return;
  exe[len] = '\0';
  const char* exe_base = std::strrchr(exe, '/');
  const char* arg_base = std::strrchr(argv[0], '/');
  exe_base = exe_base ? exe_base + 1 : exe;
  arg_base = arg_base ? arg_base + 1 : argv[0];
  if (std::strcmp(exe_base, arg_base) != 0) return;
  ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  ::setenv("CT_BLAS_RESTART", core.c_str(), 1);
  ::execv(exe, argv);
  const int err = errno;
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv("CT_BLAS_RESTART");
  std::fprintf(stderr,
               "cachetune: warning: could not restart with OPENBLAS_CORETYPE=%s (%s); OpenBLAS "
               "stays on its %s kernels\n",
               better.c_str(), std::strerror(err), core.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  restart_with_the_right_blas_core(argv);
  CLI::App app{"cachetune: chunk-level KV-cache reuse for long-context LLM serving"};
  app.require_subcommand(1);
  ct::cli::register_generate(app);
  ct::cli::register_bench(app);
  ct::cli::register_ingest(app);
  ct::cli::register_cache(app);
  ct::cli::register_eval(app);
  ct::cli::register_calibrate(app);
  ct::cli::register_bench_tiers(app);
  ct::cli::register_serve(app);
  ct::cli::register_models(app);
  ct::cli::register_tokenize(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ct::Error& e) {
    std::fprintf(stderr, "cachetune: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
