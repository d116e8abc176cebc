// The backend registry: the one place that knows which compute backends this build has. "cpu" is
// always built; "cuda" with -DCT_CUDA=ON. Callers ask here instead of testing CT_HAVE_CUDA, and get
// the GPU paths (decoder: gpu_decoder.h; band norms of the frequency ranking: below) through it.
// Without CUDA the GPU types still link: their constructors throw the "no CUDA backend" error.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ct::backend {

// Backends compiled into this build, reference first: {"cpu"} or {"cpu", "cuda"}.
std::vector<std::string> built_backends();
bool backend_built(std::string_view name);
// Built and usable on this machine now ("cuda": a device the process can use). Never throws.
bool backend_available(std::string_view name);

// The message every GPU entry point of a build without CUDA throws.
extern const char* const kNoCudaMessage;

// The band-limited per-token norms of the frequency ranking on the GPU (cuFFT), for n_mat
// matrices F32 [n_tok][kv_dim] given as host pointers: F32 [n_mat][n_tok] (see
// backend/cuda/band_norms.h for filter, lo and hi). The device buffers and plans of the last
// shape are kept; calls are serialised. Throws ct::Error (kNoCudaMessage without CUDA).
std::vector<float> cuda_band_norms(const std::vector<const float*>& mats, int n_tok, int kv_dim,
                                   bool filter, int lo, int hi);
// Frees what cuda_band_norms keeps (its last shape's device buffers and plans); the next call
// allocates again. For a program's orderly end, so that a leak checker (compute-sanitizer's
// memcheck, tools/gpu_check.sh) reports only real leaks. No-op without CUDA or nothing kept.
void release_cuda_band_norms();

}  // namespace ct::backend
