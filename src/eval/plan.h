// What an evaluation run consists of (eval/runner.h): its settings (a prompt layout with a
// ratio, an alpha and the policies to run), the key of one unit (example, setting, policy), and
// the layouts' edits of an example's prompt (a shuffled chunk order, filler context before it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/dataset.h"
#include "eval/runner.h"
#include "model/tokenizer.h"
#include "reuse/policy.h"

namespace ct::eval {

enum class Layout { kBase, kShuffle, kExtraContext };

struct Setting {
  std::string name;
  Layout layout = Layout::kBase;
  double ratio = 0.15;
  double alpha = 0.5;
  bool rerank = false;                  // records re-ranked with `alpha` (alpha sweep)
  std::vector<const Policy*> policies;  // `full` excluded: it is the layout's reference
};

// "base", "shuffle" or "prefix<N>": the name of a layout's reference setting.
std::string layout_setting_name(Layout l, const EvalOptions& o);
// The base setting, the r and alpha sweeps, and with robustness the two other layouts.
std::vector<Setting> make_settings(const EvalOptions& o);
std::string unit_key(const std::string& example, const std::string& setting,
                     const std::string& policy);

// A seeded permutation of n chunk positions; never the identity for n > 1.
std::vector<int> shuffled_order(int n, uint64_t seed, const std::string& example_id);
// Exactly n tokens of preceding context from the other examples of the same file.
std::vector<int32_t> filler_tokens(const Tokenizer& tok, const std::vector<EvalExample>& all,
                                   size_t self, int n);

}  // namespace ct::eval
