// Sub-commands of the `cachetune` CLI; each registers its options on the app.
#pragma once

#include <CLI/CLI.hpp>

namespace ct::cli {

void register_generate(CLI::App& app);
void register_bench(CLI::App& app);
void register_ingest(CLI::App& app);
void register_cache(CLI::App& app);
void register_eval(CLI::App& app);
void register_calibrate(CLI::App& app);
void register_bench_tiers(CLI::App& app);
void register_serve(CLI::App& app);
void register_models(CLI::App& app);  // `models` and `pull`
void register_tokenize(CLI::App& app);

}  // namespace ct::cli
