// `cachetune cache ls|stat|evict|verify`: what the pool holds and where, hit counts, eviction,
// and checksum verification of every stored chunk.
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "tools/cli/commands.h"
#include "tools/cli/engine_flags.h"

namespace ct::cli {
namespace {

struct CacheArgs {
  EngineFlags engine;
  std::string action;
  std::vector<std::string> ids;
};

std::string human(size_t b) {
  if (b >= (size_t)1 << 30) return fmt::format("{:.2f} GiB", b / 1073741824.0);
  if (b >= (size_t)1 << 20) return fmt::format("{:.1f} MiB", b / 1048576.0);
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

void run_cache(const CacheArgs& a) {
  Engine eng(a.engine.options());
  store::CachePool& pool = eng.pool();
  if (a.action == "ls" || a.action == "stat") {
    const store::PoolStat st = pool.stat();
    if (a.action == "stat") {
      for (const auto& t : st.tiers) {
        std::printf("%-7s %5zu chunks  %10s used of %s  hits %llu  demoted in %llu\n",
                    t.name.c_str(), t.n_chunks, human(t.used_bytes).c_str(),
                    t.capacity_bytes == SIZE_MAX ? "unlimited" : human(t.capacity_bytes).c_str(),
                    (unsigned long long)t.hits, (unsigned long long)t.demotions_in);
      }
      std::printf("misses %llu, dropped %llu\n", (unsigned long long)st.misses,
                  (unsigned long long)st.dropped);
    } else {
      for (const auto& c : st.chunks) {
        std::printf("%s  %-6s %5d tokens  %10s  hits %llu\n", c.id.c_str(), c.tier_name.c_str(),
                    c.n_tok, human(c.bytes).c_str(), (unsigned long long)c.hits);
      }
    }
  } else if (a.action == "evict") {
    CT_THROW_IF_NOT(!a.ids.empty(), "cache evict needs chunk ids (or id prefixes)");
    const store::PoolStat st = pool.stat();
    for (const auto& want : a.ids) {
      int n = 0;
      for (const auto& c : st.chunks) {
        if (c.id.rfind(want, 0) == 0 && pool.evict(c.id)) {
          std::printf("evicted %s\n", c.id.c_str());
          ++n;
        }
      }
      CT_THROW_IF_NOT(n > 0, "no cached chunk id starts with '{}'", want);
    }
  } else if (a.action == "verify") {
    const store::VerifyReport r = pool.verify_all();
    for (const auto& what : r.scan_rejects)
      std::printf("  removed at start-up: %s\n", what.c_str());
    std::printf("verified %zu chunks: %zu bad, %zu damaged records removed at start-up\n",
                r.n_checked, r.bad.size(), r.scan_rejects.size());
    for (const auto& id : r.bad)
      std::printf("  dropped %s (failed checksum or unreadable)\n", id.c_str());
    if (!r.bad.empty() || !r.scan_rejects.empty())
      throw Error(fmt::format("{} corrupt chunks were dropped and {} damaged records removed",
                              r.bad.size(), r.scan_rejects.size()));
  } else {
    CT_THROW("unknown cache action '{}', expected ls, stat, evict or verify", a.action);
  }
}

}  // namespace

void register_cache(CLI::App& app) {
  auto a = std::make_shared<CacheArgs>();
  CLI::App* c = app.add_subcommand("cache", "Inspect the chunk cache: ls, stat, evict, verify");
  a->engine.add(c);
  c->add_option("action", a->action, "ls | stat | evict | verify")->required();
  c->add_option("ids", a->ids, "Chunk ids or prefixes (evict)");
  c->callback([a] { run_cache(*a); });
}

}  // namespace ct::cli
