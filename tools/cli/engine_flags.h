// Options shared by the sub-commands that use the engine: model, cache tiers, encoding settings.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/model_registry.h"
#include "engine/engine.h"

namespace ct::cli {

// A --ratio value: a number in [0, 1], "auto" (the calibrated ratio of the chunks' tier;
// *is_auto is set and the return value is r_min), or empty: r_min, the model's quality floor.
inline double parse_ratio_flag(const std::string& text, double r_min, bool* is_auto) {
  *is_auto = text == "auto";
  if (*is_auto || text.empty()) return r_min;
  size_t used = 0;
  double ratio = -1;
  try {
    ratio = std::stod(text, &used);
  } catch (const std::exception&) {
  }
  CT_THROW_IF_NOT(used == text.size() && ratio >= 0 && ratio <= 1,
                  "--ratio '{}': expected a number in [0, 1] or 'auto'", text);
  return ratio;
}

// -m/--model as every sub-command takes it: a registry name (`cachetune models`) or a GGUF path;
// empty means the default model. resolve_model() turns it into a path after parsing.
inline CLI::Option* add_model_option(CLI::App* c, std::string* model) {
  // Static help text: reading the registry here would run before main's error handling.
  return c->add_option("-m,--model", *model,
                       "Model: a name from `cachetune models` (installed by `cachetune pull "
                       "NAME`) or a GGUF path (default: the registry's default, smollm2-135m)");
}

// --rmin as generate, serve and calibrate take it; NaN (unset): the model's measured floor.
// --device: where prefills (and decoding) run.
inline CLI::Option* add_device_option(CLI::App* c, std::string* device) {
  return c
      ->add_option("--device", *device,
                   "Where prefill and decoding run: cpu, or cuda (a CT_CUDA build and a GPU; "
                   "a prompt longer than the GPU's sequence falls back to the CPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
}

// --kv-dtype: the element type of stored chunks' K/V (EncodeOptions::dtype).
inline CLI::Option* add_kv_dtype_option(CLI::App* c, std::string* dtype) {
  return c->add_option("--kv-dtype", *dtype, "Stored chunks' K/V type: f16, bf16, f32")
      ->capture_default_str();
}

// --cache-type: the element type of each request's live KV cache (EngineOptions::kv_type).
inline CLI::Option* add_cache_type_option(CLI::App* c, std::string* type) {
  return c
      ->add_option("--cache-type", *type,
                   "Element type of each sequence's live K/V cache: f16 (as llama.cpp's default: "
                   "half the memory and attention reads), q8_0 (blocks of 32 with one scale, "
                   "0.53x f16's bytes; llama.cpp's --cache-type-k/v q8_0) or f32 (unrounded)")
      ->check(CLI::IsMember({"f16", "q8_0", "f32"}))
      ->capture_default_str();
}

// --step-attn-keys: how the step budget (--prefill-chunk) counts a row (EngineOptions::
// step_attn_keys; negative: the model's estimate).
inline CLI::Option* add_step_attn_keys_option(CLI::App* c, double* keys) {
  return c->add_option("--step-attn-keys", *keys,
                       "How --prefill-chunk counts a row: a row at position p is 1 + (p + 1) / "
                       "this many rows of work (its attention beside its weights), so slices "
                       "late in a long prompt take fewer rows; 0: rows alone, else at least 1. "
                       "Default: estimated from the model's shapes; `cachetune bench "
                       "--step-block 512` measures it here");
}

inline CLI::Option* add_rmin_option(CLI::App* c, double* r_min) {
  return c->add_option("--rmin", *r_min,
                       "Quality floor r_min: the default --ratio; --ratio auto never goes below "
                       "it and uses it on a tier without calibration; calibrate searches from it "
                       "(default: the model's measured floor, R_MIN in `cachetune models`; 0.15 "
                       "where none was measured)");
}

struct EngineFlags {
  std::string model;
  std::vector<std::string> tiers;  // specs, e.g. device:2G host:8G disk:DIR[:CAP][:bw=100M]
  std::string dtype = "f16";
  std::string cache_type = kv_dtype_name(EngineOptions().kv_type);
  double alpha = 0.5;
  bool no_sink = false;
  std::string rank_device = "cpu";
  std::string device = "cpu";
  int gpu_seqs = EngineOptions().gpu_seqs;
  std::string rank = rank_mode_name(EncodeOptions().rank.mode);
  int probe_layers = 0;
  std::string probe_text = kDefaultProbeText;
  double r_min = std::nan("");  // NaN: the model's measured floor (model_r_min); --rmin

  // How new chunks are encoded and ranked (part of their ids): --no-sink, --rank, --probe-*.
  void add_encoding(CLI::App* c) {
    c->add_flag("--no-sink", no_sink, "Encode chunks from position 0 without a sink token");
    c->add_option(
         "--rank", rank,
         "Ranking stored with new chunks, which --policy cachetune recomputes the top "
         "of: lowfreq (the paper's), probe, head, highfreq, l2, attn (attention each token "
         "receives from the chunk's last 64 rows), probe-attn (probe drift times that)")
        ->check(CLI::IsMember({"lowfreq", "probe", "head", "highfreq", "l2", "attn", "probe-attn"}))
        ->capture_default_str();
    c->add_option("--probe-layers", probe_layers,
                  "Layers of the probe ranking's second pass (0: max(2, ceil(n_layer/5)))")
        ->capture_default_str();
    c->add_option("--probe-text", probe_text, "Probe context of the probe ranking");
  }

  void add(CLI::App* c) {
    add_model_option(c, &model);
    c->add_option(
        "--tiers", tiers,
        "Cache tiers, top first: device[:CAP] host[:CAP] disk[:DIR][:CAP][:bw=RATE] "
        "redis[:HOST[:PORT]] (default: device:2G host:8G disk:~/.cache/cachetune/chunks)");
    add_kv_dtype_option(c, &dtype);
    add_cache_type_option(c, &cache_type);
    c->add_option("--alpha", alpha, "Low-frequency fraction kept by the ranking")
        ->capture_default_str();
    add_encoding(c);
    add_device_option(c, &device);
    c->add_option("--gpu-seqs", gpu_seqs,
                  "With --device cuda: sequences the GPU holds at once (each 8,192 positions of F32 "
                  "K/V, or the model's context if shorter); their decode steps run as one batch, "
                  "and serve runs at most this many requests")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    c->add_option("--rank-device", rank_device,
                  "Where new chunks' frequency ranking runs: cpu (FFTW) or cuda (cuFFT; needs a "
                  "CT_CUDA build and a GPU)")
        ->check(CLI::IsMember({"cpu", "cuda"}))
        ->capture_default_str();
  }

  EngineOptions options() const {
    EngineOptions o;
    o.model_path = resolve_model(model);
    CT_THROW_IF_NOT(std::isnan(r_min) || (r_min >= 0 && r_min <= 1),
                    "--rmin {}: expected a number in [0, 1]", r_min);
    o.r_min = std::isnan(r_min) ? model_r_min(o.model_path) : r_min;
    for (const auto& t : tiers) o.tiers.push_back(parse_tier_spec(t));
    o.encode.dtype = parse_kv_dtype(dtype);
    o.kv_type = parse_kv_dtype(cache_type);
    o.encode.rank.alpha = alpha;
    o.encode.rank.mode = parse_rank_mode(rank);
    o.encode.probe.layers = probe_layers;
    o.encode.probe.text = probe_text;
    o.encode.sink = !no_sink;
    o.encode.rank.device = rank_device == "cuda" ? RankDevice::kCuda : RankDevice::kCpu;
    o.cuda = device == "cuda";
    o.gpu_seqs = gpu_seqs;
    return o;
  }
};

}  // namespace ct::cli
