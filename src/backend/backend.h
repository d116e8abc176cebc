// The per-layer compute seam: what the selective prefill's one layer loop (reuse/selective.cc)
// runs on. A LayerBackend holds one request's active rows (the recomputed tokens plus prefix and
// query) and its KV cache; per layer, the reused chunk rows are placed in the cache (unpacked,
// rotated to their global positions: deferred RoPE) before the layer computes the active rows over
// the whole, causally masked sequence. A pass may also hold the rows of several sequences, each
// with its own cache (begin_batch: the shape of a continuous-batching step, decode rows of some
// sequences beside prefill rows of others). Two implementations: the CPU (cpu::forward_layer on a host
// KVCache, with a loader thread working ahead of the loop) and the GPU (cuda::Decoder, the rows
// staged in pinned memory and unpacked on the device). caps() says what a backend supports; the
// loop asks it instead of testing which backend it has.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu_forward.h"
#include "model/model.h"
#include "store/chunk.h"

namespace ct {

namespace cuda {
class Decoder;
}

// How the reused rows are loaded on the CPU (paper App. B.2); the switches exist for the
// ablation benchmark. The GPU always reads the rows on the calling thread while the device
// computes the previous layer.
struct PipelineOptions {
  bool overlap = true;         // a loader thread prefetches layer l+1 while layer l computes
  bool sparse = true;          // read only the complement's contiguous rank-row suffix
  bool rope_in_loader = true;  // deferred RoPE on the loader thread (else on the compute thread)
};

// A request's reused rows, the same in every layer: segments of raw rows as stored (one per chunk
// occurrence read), concatenated; raw row r goes to global position pos[r], or nowhere when
// pos[r] < 0 (a recomputed token inside a range read whole).
struct ReusedRows {
  struct Segment {
    KvDtype dtype = KvDtype::F16;
    int n_rows = 0;
    std::string label;  // names the segment's source in errors (a chunk id)
  };
  std::vector<Segment> segments;
  std::vector<int32_t> pos;  // [sum of n_rows]
  // The keys are already rotated to their positions (a context encoded in place, as the probe
  // ranking's prefix): placed as they are, with no deferred RoPE.
  bool rotated = false;
  // Reads segment s's raw rows of layer l into k and v ([n_rows][kv_dim] of its dtype each).
  // Called from the backend's loader thread as well; throws what the source throws.
  std::function<void(int l, int s, void* k, void* v)> read;
  int n_placed() const;  // rows with pos >= 0
};

struct BackendCaps {
  const char* name = "";   // "cpu", "cuda"
  bool taps = false;       // layer() fills LayerTap (K/V before RoPE, query attention)
  bool keep_rows = false;  // keep_rows() and project_kv() (a selection made after layer 0)
  int max_seqs = 1;        // sequences one pass may hold (begin_batch); 0: any number
};

// Where a pass's time went, added up by the backend.
struct LayerTimes {
  double load_ms = 0;       // reading, unpacking and rotating the reused rows
  double load_wait_ms = 0;  // the part the layer loop waited for or did itself
  double compute_ms = 0;    // the layers (on the GPU: everything but load, logits included)
  double logits_ms = 0;
  double kv_to_host_ms = 0;  // GPU: the finished cache copied back to the host
};

class LayerBackend {
 public:
  virtual ~LayerBackend() = default;
  virtual BackendCaps caps() const = 0;
  // Starts a pass on n active rows of the backend's own sequence (the cache it was made with):
  // tokens at global positions pos (strictly increasing).
  virtual void begin(const int32_t* tokens, const int32_t* pos, int n) = 0;
  // Starts a pass over the rows of several sequences (continuous batching): rows [0, n) split
  // into seqs in order, each at increasing positions of its own cache, decode or prefill rows
  // (BatchSeq; every row's result is what its sequence alone would give). At most
  // caps().max_seqs sequences (0: any); a backend with max_seqs 1 takes one sequence on its own
  // cache (kv null). keep_rows() and attention taps need a pass of one sequence.
  virtual void begin_batch(const int32_t* tokens, const int32_t* pos, int n,
                           const std::vector<BatchSeq>& seqs);
  // The reused rows of layers [first_layer, n_layer): each layer's are in place when layer(l)
  // runs. Replaces rows set before (layers below first_layer are not touched again).
  virtual void set_reused(const ReusedRows& rows, int first_layer) = 0;
  // The same for sequence `seq` of a begin_batch pass (set_reused is sequence 0's).
  virtual void set_reused_for(int seq, const ReusedRows& rows, int first_layer);
  // One decoder layer on the active rows. tap: only with caps().taps (else null).
  virtual void layer(int l, LayerTap* tap) = 0;
  // Keeps the active rows whose positions are listed (a subset of the current ones, ascending).
  virtual void keep_rows(const std::vector<int32_t>& pos) = 0;
  // Layer l's keys before RoPE and values of every active row, F32 [n][kv_dim] each, from the
  // rows' residual stream as the layers before l left it: the layer's attention norm and K/V
  // products only. Nothing else changes (the cache, the rows, the next layer()). A selection
  // made from a layer's fresh K/V before that layer runs: CacheBlend's check layer. Only with
  // caps().keep_rows, on a pass of one sequence.
  virtual void project_kv(int l, float* k, float* v) = 0;
  // After the last layer: the last active row's logits, F32 [n_vocab].
  virtual std::vector<float> finish() = 0;
  // The same for every sequence of the pass: its last row's logits, F32 [n_seqs][n_vocab].
  virtual std::vector<float> finish_batch();
  const LayerTimes& times() const { return times_; }

 protected:
  LayerTimes times_;
};

// A device that keeps the K/V of n_seq() sequences in its own memory (the GPU), n_ctx()
// positions each. A request's selective prefill runs its layer loop there (layers()), and
// decoding then continues from that cache (prefill(), or decode_batch() for a row of each of
// several sequences at once). layers() and prefill() work on the selected sequence slot
// (select(); 0 at first). The engine holds one through this interface only (made by
// make_device), so it never names a device's own types.
class DeviceSequence {
 public:
  virtual ~DeviceSequence() = default;
  virtual const char* name() const = 0;  // "cuda"
  virtual int n_ctx() const = 0;         // positions each of the device's sequences holds
  virtual int n_seq() const = 0;         // sequence slots
  virtual void select(int slot) = 0;     // the slot layers() and prefill() work on
  // One token of each of n sequences: row i is tokens[i] of slot slots[i] (distinct) at
  // position pos[i], over that slot's cache rows [0, pos[i]). Returns F32 [n][n_vocab].
  virtual std::vector<float> decode_batch(const int32_t* tokens, const int32_t* pos,
                                          const int32_t* slots, int n) = 0;
  // The LayerBackend of a selective prefill on this device. With kv_to_host, finish() copies
  // the finished cache into it (which must hold the prompt); else the host cache is not touched.
  virtual std::unique_ptr<LayerBackend> layers(KVCache* kv_to_host) = 0;
  // Tokens at positions [pos0, pos0 + n) over the device's cache holding [0, pos0); returns the
  // last row's logits, F32 [n_vocab].
  virtual std::vector<float> prefill(const int32_t* tokens, int n, int pos0) = 0;
};

// All layers of tokens at positions [0, n) from an empty cache, every layer tapped through the
// layer contract: on `device` (its cache is overwritten; its layer backend refuses n beyond its
// n_ctx) or, when null, on the CPU. Keys before RoPE and values go to k and v (F32
// [n_layer][n][kv_dim] each); with probs_from_row >= 0, the attention of rows >= probs_from_row
// (averaged over heads, summed over rows and layers) is added into probs (F32 [n]). The isolated
// encoding of a chunk and the eval's capture of a full prefill both run this.
void tapped_prefill(const Model& m, const int32_t* tokens, int n, DeviceSequence* device, float* k,
                    float* v, float* probs = nullptr, int probs_from_row = -1);

// The same pass in row slices (chunked prefill of a tapped pass, for an encoding that shares
// engine steps with other requests): run(r) takes the next r rows through every layer over the
// rows before them, tapping into the same k, v and probs (which must outlive the pass). On the
// CPU the result is the whole pass's up to the rounding of the row blocks' products (the prefill
// of a cache in slices); a device pass runs whole (one run of every row). tapped_prefill is
// run(n) of one.
class TappedPass {
 public:
  TappedPass(const Model& m, const int32_t* tokens, int n, DeviceSequence* device, float* k,
             float* v, float* probs = nullptr, int probs_from_row = -1);
  ~TappedPass();
  int rows_left() const { return n_ - done_; }
  // The next `rows` rows (1 .. rows_left(); on a device all of them).
  void run(int rows);

 private:
  const Model& m_;
  std::vector<int32_t> tokens_, pos_;
  int n_ = 0, done_ = 0;
  DeviceSequence* device_;
  float *k_, *v_, *probs_;
  int probs_from_row_;
  KVCache kv_;  // the CPU's cache (holds the rows done); the device keeps its own
  Workspace ws_;
  std::unique_ptr<LayerBackend> be_;
};

// The device `name` ("cuda", the only one) for model m with n_seq sequences of n_ctx positions.
// Throws ct::Error naming the backend when this build lacks it (backend/registry.h) or it cannot
// start.
std::unique_ptr<DeviceSequence> make_device(const std::string& name, const Model& m, int n_ctx,
                                            int n_seq = 1);

// The CPU backend: the layers of m on the host cache kv (at least as long as the prompt); any
// number of sequences per pass (begin_batch), each on its own host cache.
std::unique_ptr<LayerBackend> make_cpu_layers(const Model& m, KVCache& kv, Workspace& ws,
                                              const PipelineOptions& opt);
// The GPU backend on dec (built from m, n_ctx >= the prompt; one K/V type per request). With
// kv_to_host, finish() copies the finished cache into it (which must hold the prompt); else the
// host cache is not touched. sparse: as PipelineOptions::sparse (the caller builds the rows).
std::unique_ptr<LayerBackend> make_cuda_layers(const Model& m, cuda::Decoder& dec,
                                               KVCache* kv_to_host);

}  // namespace ct
