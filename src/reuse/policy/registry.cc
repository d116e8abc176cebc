// The policy registry: one line per policy. A policy is a class in its own file in this folder
// (its name, summary and stage given to the Policy constructor) with a factory
// `const Policy& NAME()` in namespace ct::policies, usually `return instance<X>();` (policy.h:
// never destroyed, so a thread still running at exit can use it); adding it to CT_POLICIES below
// is the only other change (the order is that of listings such as `--policies all`). The factory
// is the policy's name with '-' written '_' (probe_shared for "probe-shared").
#include <string>

#include "core/error.h"
#include "reuse/policy.h"

#define CT_POLICIES(X) \
  X(full)              \
  X(reuse)             \
  X(cachetune)         \
  X(prefix)            \
  X(cacheblend)        \
  X(epic)              \
  X(random)            \
  X(l2)                \
  X(highfreq)          \
  X(lfonly)            \
  X(prophetkv)         \
  X(freq)              \
  X(head)              \
  X(probe)             \
  X(probe_shared)      \
  X(probe_pos)         \
  X(attn)              \
  X(probe_attn)        \
  X(probe_attn_shared) \
  X(oracle)            \
  X(oracle_shared)

namespace ct {
namespace policies {
#define CT_DECLARE_POLICY(f) const Policy& f();
CT_POLICIES(CT_DECLARE_POLICY)
#undef CT_DECLARE_POLICY
}  // namespace policies

const std::vector<const Policy*>& all_policies() {
#define CT_LIST_POLICY(f) &policies::f(),
  static const auto* all = new std::vector<const Policy*>{CT_POLICIES(CT_LIST_POLICY)};
#undef CT_LIST_POLICY
  return *all;
}

const Policy& default_policy() { return policies::cachetune(); }

std::string policy_names() {
  std::string s;
  for (const Policy* p : all_policies()) s += std::string(s.empty() ? "" : ", ") + p->name();
  return s;
}

const Policy& find_policy(std::string_view name) {
  for (const Policy* p : all_policies()) {
    if (name == p->name()) return *p;
  }
  CT_THROW("unknown policy '{}', expected one of: {}", name, policy_names());
}

}  // namespace ct
