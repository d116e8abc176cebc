// Entry point of the `cachetune` command-line tool: dispatches to the sub-commands and turns
// ct::Error into a one-line message and exit status 1.
#include <cstdio>

#include "core/error.h"
#include "tools/cli/commands.h"

int main(int argc, char** argv) {
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
