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
// alone (the restarted program sees its own), so this happens at most once.
void restart_with_the_right_blas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const std::string core = ct::cpu::blas_core_name();
  const std::string better = ct::cpu::better_blas_core(core, ct::cpu::host_blas_cpu());
  if (better.empty()) return;
  ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  std::fprintf(stderr,
               "cachetune: warning: could not restart with OPENBLAS_CORETYPE=%s (%s); OpenBLAS "
               "stays on its %s kernels\n",
               better.c_str(), std::strerror(errno), core.c_str());
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
