#include "eval/plan.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "core/error.h"
#include "reuse/prompt.h"

namespace ct::eval {

namespace {
std::string num_name(double v) { return fmt::format("{:g}", v); }

std::vector<const Policy*> without_full(const std::vector<const Policy*>& in) {
  std::vector<const Policy*> out;
  for (const Policy* k : in) {
    if (k != &find_policy("full") && std::find(out.begin(), out.end(), k) == out.end()) {
      out.push_back(k);
    }
  }
  return out;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::string layout_setting_name(Layout l, const EvalOptions& o) {
  switch (l) {
    case Layout::kBase:
      return "base";
    case Layout::kShuffle:
      return "shuffle";
    case Layout::kExtraContext:
      return fmt::format("prefix{}", o.extra_context_tokens);
  }
  return "?";
}

std::vector<Setting> make_settings(const EvalOptions& o) {
  std::vector<Setting> s;
  const auto pol = without_full(o.policies), sweep = without_full(o.sweep_policies);
  s.push_back({"base", Layout::kBase, o.ratio, o.alpha, false, pol});
  std::set<std::string> seen = {"base"};
  for (double r : o.sweep_ratios) {
    CT_THROW_IF_NOT(r > 0 && r <= 1, "sweep ratio {} outside (0, 1]", r);
    Setting x{"r=" + num_name(r), Layout::kBase, r, o.alpha, false, sweep};
    if (seen.insert(x.name).second) s.push_back(x);
  }
  for (double a : o.sweep_alphas) {
    CT_THROW_IF_NOT(a > 0 && a <= 1, "sweep alpha {} outside (0, 1]", a);
    Setting x{"alpha=" + num_name(a), Layout::kBase, o.ratio, a, true, sweep};
    if (seen.insert(x.name).second) s.push_back(x);
  }
  if (o.robustness) {
    s.push_back(
        {layout_setting_name(Layout::kShuffle, o), Layout::kShuffle, o.ratio, o.alpha, false, pol});
    s.push_back({layout_setting_name(Layout::kExtraContext, o), Layout::kExtraContext, o.ratio,
                 o.alpha, false, pol});
  }
  return s;
}

std::string unit_key(const std::string& example, const std::string& setting,
                     const std::string& policy) {
  return example + "|" + setting + "|" + policy;
}

// A seeded permutation of n chunk positions; never the identity for n > 1 (a shuffle that
// changes nothing would not test anything).
std::vector<int> shuffled_order(int n, uint64_t seed, const std::string& example_id) {
  std::vector<int> p(n);
  std::iota(p.begin(), p.end(), 0);
  std::mt19937_64 rng(seed ^ fnv1a(example_id));
  std::shuffle(p.begin(), p.end(), rng);
  bool identity = true;
  for (int i = 0; i < n; ++i) identity = identity && p[i] == i;
  if (identity && n > 1) std::rotate(p.begin(), p.begin() + 1, p.end());
  return p;
}

// Exactly n tokens of preceding context: the chunks of the following examples of the same file
// (wrapping around, never the example itself), each tokenised as a stored chunk.
std::vector<int32_t> filler_tokens(const Tokenizer& tok, const std::vector<EvalExample>& all,
                                   size_t self, int n) {
  CT_THROW_IF_NOT(all.size() >= 2,
                  "{}: the extra-context setting takes its filler from other examples of the same "
                  "file, but the file has {} example",
                  all[self].file, all.size());
  std::vector<int32_t> out;
  for (size_t step = 1; (int)out.size() < n; ++step) {
    const size_t j = (self + step) % all.size();
    if (j == self) continue;
    for (const std::string& c : all[j].chunks) {
      const auto t = tokenize_chunk(tok, c);
      out.insert(out.end(), t.begin(), t.end());
      if ((int)out.size() >= n) break;
    }
    CT_ASSERT(step < 1000000, "filler text produced no tokens");
  }
  out.resize(n);
  return out;
}

}  // namespace ct::eval
