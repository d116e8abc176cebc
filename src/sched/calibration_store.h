// Persisted recompute-ratio calibrations (paper Sec. 5.5, App. D.4: calibrate once per hardware and
// storage configuration, then reuse the ratio). One JSON file holds one entry per
// (model fingerprint, backend, tier, machine) key and is replaced atomically on save.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sched/cost_model.h"
#include "sched/golden_section.h"

namespace ct::sched {

// Everything a calibration depends on; a change in any field means the stored ratio is stale.
struct CalibrationKey {
  std::string model_fingerprint;  // e.g. a hash of the model file or of its config and dtype
  std::string backend;            // e.g. "cpu" or "cuda:H200"; include the device name on GPUs
  std::string tier;               // cache medium: "device", "host", "disk", ...
  std::string machine;            // machine_identity() of the calibrating host
  std::string kv_dtype;           // stored K/V type ("f16", ...): it sets the bytes loaded per row
  std::string cache_type;         // live K/V cache type ("f16", "f32"): what a row is put into

  bool operator==(const CalibrationKey&) const = default;
};

struct CalibrationEntry {
  CalibrationKey key;
  CostParams profile;                      // fitted t_c, t_i, t_o
  double analytic_r = 0;                   // cost-model guess that warm-started the search
  double chosen_r = 0;                     // the ratio to deploy
  std::vector<GoldenSectionProbe> probes;  // every measured (r, mean TTFT), in order
  int64_t timestamp_unix = 0;              // seconds since the epoch; set by the caller
};

class CalibrationStore {
 public:
  // Reads `path`. A missing file is an empty store (nothing calibrated yet). Throws ct::Error
  // naming the file when it cannot be read, is not valid JSON, or does not match the schema.
  static CalibrationStore load(const std::string& path);

  // As load(), but an unreadable or corrupt file is treated as empty: the error message goes to
  // *error when given, else to stderr, so the fallback is never silent.
  static CalibrationStore load_or_empty(const std::string& path, std::string* error = nullptr);

  // Atomic replace: write a temp file beside `path`, fsync it, rename it over `path`, fsync the
  // directory. Readers see the old or the new file, never a torn one; of two concurrent savers the
  // last rename wins. Throws ct::Error on any I/O failure (the temp file is removed).
  void save(const std::string& path) const;

  // nullptr when no entry has exactly this key. The pointer is valid until the next store().
  const CalibrationEntry* find(const CalibrationKey& key) const;

  // Inserts, or replaces the entry with the same key.
  void store(CalibrationEntry entry);

  const std::vector<CalibrationEntry>& entries() const { return entries_; }

 private:
  std::vector<CalibrationEntry> entries_;
};

// Readable identity of this host: "host=<hostname>;cpu=<model name>;cores=<n>". Kept readable
// rather than hashed so a stale entry can be explained by looking at the file. Backend devices
// (GPUs) are not included: they belong in CalibrationKey::backend.
std::string machine_identity();

}  // namespace ct::sched
