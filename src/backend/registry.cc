// The backend registry (registry.h). The only file that tests CT_HAVE_CUDA: with CUDA it forwards
// to backend/cuda; without, it defines the GPU decoder's and band norms' members so that code
// using them still links, each throwing kNoCudaMessage (the constructor first, so no object can
// exist).
#include "backend/registry.h"

#include <memory>
#include <mutex>

#include "backend/cuda/band_norms.h"
#include "backend/cuda/decoder.h"
#include "core/error.h"

namespace ct::backend {

const char* const kNoCudaMessage =
    "this build has no CUDA backend; configure with -DCT_CUDA=ON (needs nvcc, cuBLAS and cuFFT)";

#ifdef CT_HAVE_CUDA

std::vector<std::string> built_backends() { return {"cpu", "cuda"}; }

bool backend_available(std::string_view name) {
  return name == "cpu" || (name == "cuda" && cuda::device_count() > 0);
}

namespace {
// Never destroyed (like cuFFT's plans): a static destructor could run after the CUDA runtime's.
std::mutex& band_norms_mutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::unique_ptr<cuda::BandNorms>& kept_band_norms() {
  static auto* kept = new std::unique_ptr<cuda::BandNorms>();
  return *kept;
}
}  // namespace

void release_cuda_band_norms() {
  std::lock_guard<std::mutex> lock(band_norms_mutex());
  kept_band_norms().reset();
}

std::vector<float> cuda_band_norms(const std::vector<const float*>& mats, int n_tok, int kv_dim,
                                   bool filter, int lo, int hi) {
  // The BandNorms of the last shape is kept (device buffers and cuFFT plans are most of a first
  // call's cost); a chunk of another length replaces it, so device memory stays bounded by one
  // shape. The lock serialises callers, which share one device anyway.
  const int n_mat = static_cast<int>(mats.size());
  std::lock_guard<std::mutex> lock(band_norms_mutex());
  auto& bn = kept_band_norms();
  if (!bn || bn->n_mat() != n_mat || bn->n_tok() != n_tok || bn->kv_dim() != kv_dim) {
    bn.reset();  // free the old shape's device memory before allocating the new one
    bn = std::make_unique<cuda::BandNorms>(n_mat, n_tok, kv_dim);
  }
  bn->upload(mats);
  return bn->run(filter, lo, hi);
}

#else

std::vector<std::string> built_backends() { return {"cpu"}; }

bool backend_available(std::string_view name) { return name == "cpu"; }

std::vector<float> cuda_band_norms(const std::vector<const float*>&, int, int, bool, int, int) {
  CT_THROW("{}", kNoCudaMessage);
}

void release_cuda_band_norms() {}

}  // namespace ct::backend

namespace ct::cuda {

// No Impl exists without CUDA: the constructor throws, so the other members are unreachable.
struct Decoder::Impl {};
Decoder::Decoder(const DecoderDims&, const DecoderWeights&, int, int) {
  CT_THROW("GPU decoder: {}", backend::kNoCudaMessage);
}
Decoder::~Decoder() = default;
#define CT_NO_DECODER                                  \
  ::ct::abort_invariant(__FILE__, __LINE__, "no CUDA", \
                        "a GPU decoder exists in a build without CUDA")
const DecoderDims& Decoder::dims() const { CT_NO_DECODER; }
int Decoder::n_ctx() const { CT_NO_DECODER; }
int Decoder::n_seq() const { CT_NO_DECODER; }
void Decoder::select(int) { CT_NO_DECODER; }
std::vector<float> Decoder::decode_batch(const int32_t*, const int32_t*, const int32_t*, int,
                                         const float*, const float*) {
  CT_NO_DECODER;
}
std::vector<float> Decoder::forward(const int32_t*, const int32_t*, int, const float*,
                                    const float*) {
  CT_NO_DECODER;
}
void Decoder::begin(const int32_t*, const int32_t*, int, const float*, const float*) {
  CT_NO_DECODER;
}
void Decoder::layer(int, const DecoderTap*) { CT_NO_DECODER; }
void Decoder::keep_rows(const int32_t*, int, const int32_t*, const float*, const float*) {
  CT_NO_DECODER;
}
void Decoder::project_kv(int, float*, float*) { CT_NO_DECODER; }
std::vector<float> Decoder::finish() { CT_NO_DECODER; }
void Decoder::set_reused_rows(RowType, const int32_t*, int, const float*, const float*) {
  CT_NO_DECODER;
}
std::pair<void*, void*> Decoder::reused_staging(int) { CT_NO_DECODER; }
void Decoder::write_reused(int) { CT_NO_DECODER; }
void Decoder::read_kv(int, int, float*, float*) const { CT_NO_DECODER; }
#undef CT_NO_DECODER

int device_count() { return 0; }

// Likewise for the ranking's band norms: the constructor throws.
struct BandNorms::Impl {};
BandNorms::BandNorms(int, int, int) { CT_THROW("GPU band norms: {}", backend::kNoCudaMessage); }
BandNorms::~BandNorms() = default;
#define CT_NO_BAND_NORMS                               \
  ::ct::abort_invariant(__FILE__, __LINE__, "no CUDA", \
                        "GPU band norms exist in a build without CUDA")
int BandNorms::n_mat() const { CT_NO_BAND_NORMS; }
int BandNorms::n_tok() const { CT_NO_BAND_NORMS; }
int BandNorms::kv_dim() const { CT_NO_BAND_NORMS; }
void BandNorms::upload(const std::vector<const float*>&) { CT_NO_BAND_NORMS; }
std::vector<float> BandNorms::run(bool, int, int) { CT_NO_BAND_NORMS; }
#undef CT_NO_BAND_NORMS

}  // namespace ct::cuda

namespace ct::backend {

#endif

bool backend_built(std::string_view name) {
  for (const std::string& b : built_backends())
    if (b == name) return true;
  return false;
}

}  // namespace ct::backend
