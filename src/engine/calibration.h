// Hardware-aware recompute ratio (paper Sec. 4.3, App. C.1-C.2, D.4): profile t_c, t_i and t_o
// for the loaded model and one cache tier, warm-start a golden-section search at the cost model's
// balance point, minimise the measured mean TTFT over a calibration set, persist the chosen r.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu_forward.h"
#include "engine/engine.h"
#include "reuse/pooled_chunk.h"
#include "sched/calibration_store.h"
#include "sched/cost_model.h"
#include "sched/golden_section.h"

namespace ct {

// One calibration request: documents reused as chunks and the question after them.
struct CalibrationRequest {
  std::vector<std::string> docs;
  std::string question;
};

// The first `limit` examples (> 0) of a task file (JSONL with "chunks" and "question", as in
// ../shared/data), or, for a directory, `limit` requests over its *.txt files (sorted), each one
// rotation of the document order further, with a fixed question: the same chunks at different
// positions, as chunk reuse sees them. Throws ct::Error naming the path and line when the file is
// unreadable or an example is malformed, or when a directory holds no .txt file.
std::vector<CalibrationRequest> load_calibration_requests(const std::string& path, int limit);

struct ProfileOptions {
  // Rows recomputed per timed layer: n_fixed + r*N for each r (the recompute path of the cost
  // model over the range a search explores most), at positions spread over the whole prompt so
  // attention sees a prompt-length context.
  std::vector<double> compute_ratios = {0.1, 0.2, 0.35, 0.5};
  // Rows loaded per timed layer: the complement (1-r)*N of every chunk for each r.
  std::vector<double> load_ratios = {0.0, 0.25, 0.5, 0.75};
  int repeats = 2;     // the minimum over repeats is kept: the least disturbed measurement
  int max_layers = 8;  // layers timed, spread evenly; all layers have the same shapes
};

// The calibration set made ready for timing: chunks stored in the engine's top tier, the tier
// under test (encoded first when absent; never timed), prompts laid out, one KV cache and
// workspace reused across runs so allocation stays out of the measurements. Prefills run where
// the engine's run (Engine::device(): the GPU of a CUDA engine, else the CPU). Lookups promote
// chunks to the top tier, so a lower tier is calibrated with an engine that has it on top (the
// CLI builds one holding only the tier under test).
class CalibrationWorkload {
 public:
  // Throws ct::Error when `requests` is empty or a chunk cannot be stored in the top tier.
  CalibrationWorkload(Engine& eng, const std::vector<CalibrationRequest>& requests);
  ~CalibrationWorkload();

  // Mean over the requests of selective prefill + first (greedy) token, in seconds; with
  // repeats > 1 each request's minimum is used. Throws ct::Error when a request does not fit
  // the device's sequence.
  double mean_ttft_seconds(const PolicyOptions& policy, int repeats = 1);

  // Mean token counts of the requests, as the cost model sees them.
  sched::PrefillShape mean_shape() const;

  // Times real layers and real complement loads of the first request, per layer; fit with
  // sched::fit_cost_model. The layers run through the engine's layer backend (the CPU's, or the
  // device's: make_cpu_layers, DeviceSequence::layers). A load is what the host does per layer:
  // the tier read, and on the CPU also the unpack to F32 and the deferred RoPE (a device unpacks
  // and rotates on the device, beside its layers).
  sched::ProfileSamples profile(const ProfileOptions& opt = {});

  size_t size() const { return reqs_.size(); }

 private:
  struct Prepared {
    std::vector<std::unique_ptr<PooledChunk>> chunks;
    ComposedRequest req;
    RequestLayout layout;
  };
  Engine& eng_;
  DeviceSequence* device_;  // Engine::device()
  std::vector<Prepared> reqs_;
  KVCache kv_;    // sized for the longest request
  Workspace ws_;  // warmed by the first run, then allocation-free
};

struct CalibrationRun;

struct CalibrateOptions {
  double r_min = 0.15;  // quality floor: nothing below is probed or chosen
  double r_max = 1.0;
  double eps = 0.01;  // the search stops when its bracket is narrower than this
  int repeats = 1;    // per request and candidate r (see mean_ttft_seconds)
  // Relative TTFT noise of this machine: closer comparisons are re-measured in paired rounds
  // (sched::GoldenSectionOptions::noise). 0 trusts every single measurement.
  double noise = 0.05;
  int paired_rounds = 2;
  bool force = false;  // recalibrate even when the store holds this key
  ProfileOptions profile;
  // Replaces the measured mean TTFT as the search objective (tests); profiling still runs.
  std::function<double(double)> objective;
  // Progress for the CLI: the run so far (profile, shape, analytic guess) before the search
  // starts, then each probe as it is measured.
  std::function<void(const CalibrationRun&)> on_profile;
  std::function<void(double r, double seconds)> on_probe;
};

struct CalibrationRun {
  sched::CalibrationEntry entry;  // what was stored (or found)
  bool reused = false;            // found in the store: nothing was measured, fields below empty
  sched::CostFit fit;
  sched::PrefillShape shape;
  sched::AnalyticRatio analytic;
  sched::GoldenSectionResult search;
  double seconds = 0;  // wall time of the whole calibration, chunk encoding included
};

// Calibrates the engine's top tier on `requests` and saves the entry under
// eng.calibration_key(0, eng.backend_name()) in eng.options().calibration_path (creating its directory). Without
// `force` an existing entry for the key is returned as is (reused = true) and nothing runs.
// Throws ct::Error for bounds outside 0 <= r_min < r_max <= 1 or eps <= 0, and on I/O failure.
CalibrationRun calibrate_top_tier(Engine& eng, const std::vector<CalibrationRequest>& requests,
                                  const CalibrateOptions& opt);

}  // namespace ct
