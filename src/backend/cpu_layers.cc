// The CPU LayerBackend (backend.h): cpu::forward_batch on host KVCaches, one sequence per pass or
// several (begin_batch), and the contract's defaults for backends of one sequence. The reused rows
// are read from their sources into a staging buffer, the placed ones put in the cache's type at
// their global positions and rotated there (deferred RoPE). With overlap, a loader thread works
// ahead of the layer loop and hands layers over through per-layer ready flags (the CPU
// counterpart of the paper's transfer stream and per-layer events); without, layer l is loaded on
// the calling thread.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "backend/backend.h"
#include "backend/cpu_forward.h"
#include "core/error.h"
#include "core/timer.h"

namespace ct {

void LayerBackend::begin_batch(const int32_t* tokens, const int32_t* pos, int n,
                               const std::vector<BatchSeq>& seqs) {
  CT_THROW_IF_NOT(seqs.size() == 1 && !seqs[0].kv && seqs[0].n == n,
                  "the {} backend runs one sequence per pass, on its own cache; this pass has {}",
                  caps().name, seqs.size());
  begin(tokens, pos, n);
}

void LayerBackend::set_reused_for(int seq, const ReusedRows& rows, int first_layer) {
  CT_THROW_IF_NOT(seq == 0, "the {} backend runs one sequence per pass, not sequence {}",
                  caps().name, seq);
  set_reused(rows, first_layer);
}

std::vector<float> LayerBackend::finish_batch() { return finish(); }

int ReusedRows::n_placed() const {
  int n = 0;
  for (int32_t g : pos) n += g >= 0;
  return n;
}

namespace {

class LayerLoader {
 public:
  LayerLoader(const Model& m, const ReusedRows& rows, KVCache& kv, const PipelineOptions& opt,
              int first_layer)
      : m_(m),
        rows_(rows),
        kv_(kv),
        opt_(opt),
        n_layer_(std::min(m.config().n_layer, kv.n_layer())),  // a cache of the first layers only
        first_layer_(first_layer),
        // A Q8_0 cache takes its reused keys rotated before they are packed (rotating placed
        // keys would round each twice), so the loader rotates them whatever the option says.
        // (F16 and F32 keep the option: rope_in_loader = false is an ablation, bench-tiers.)
        rope_in_loader_(opt.rope_in_loader || kv.dtype() == KvDtype::Q8_0),
        ready_(n_layer_, 0) {
    for (int l = 0; l < first_layer; ++l) ready_[l] = 1;
    for (int32_t g : rows_.pos) {
      if (g >= 0) pos_.push_back(g);
    }
    if (opt_.overlap) {
      thread_ = std::thread([this, first_layer] {
        omp_set_num_threads(1);  // the compute thread's OpenMP team owns the cores
        for (int l = first_layer; l < n_layer_ && !stop_; ++l) {
          try {
            load(l, rope_in_loader_);
          } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            error_ = std::current_exception();
            cv_.notify_all();
            return;
          }
          std::lock_guard<std::mutex> lock(mu_);
          ready_[l] = 1;
          cv_.notify_all();
        }
      });
    }
  }
  ~LayerLoader() {
    stop_ = true;
    join();
  }
  // Waits for the loader thread to end (after the last wait(), it has loaded every layer).
  void join() {
    if (thread_.joinable()) thread_.join();
  }

  // Blocks until layer l's rows are in the cache (rotated), loading it here when not overlapped.
  void wait(int l) {
    // Layers below first_layer keep what the cache holds (a layer-0 policy's fresh rows, or a
    // sliced CacheBlend's layer 0 from its selection pass): nothing to place or rotate.
    if (l < first_layer_) return;
    if (!opt_.overlap) {
      if (!ready_[l]) load(l, true);
      ready_[l] = 1;
      return;
    }
    Timer t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return ready_[l] || error_; });
      if (error_) std::rethrow_exception(error_);
    }
    if (!rope_in_loader_ && !rows_.rotated) {
      // RoPE on the compute thread is load work that the layer loop pays for in full.
      Timer rt;
      rope(l);
      rope_on_caller_ms_ += rt.ms();
    }
    wait_ms += t.ms();
  }

  // All load work (read, unpack, RoPE) on whichever thread did it; valid after the last wait().
  double load_ms() const { return loader_ms_ + rope_on_caller_ms_; }
  double wait_ms = 0;  // compute-side time spent waiting for, or doing, load work

 private:
  void load(int l, bool do_rope) {
    Timer t;
    const int KV = kv_.kv_dim();
    // Keys to rotate before they are packed: gathered as F32 in pos_'s order, values placed.
    const bool rotate_first = do_rope && !rows_.rotated && kv_.dtype() != KvDtype::F32;
    if (rotate_first) rope_rows_.resize(pos_.size() * KV);
    size_t r = 0, placed = 0;
    for (size_t s = 0; s < rows_.segments.size(); ++s) {
      const ReusedRows::Segment& seg = rows_.segments[s];
      const size_t row_bytes = kv_bytes(seg.dtype, KV);
      const size_t bytes = row_bytes * seg.n_rows;
      if (bytes == 0) continue;
      if (stage_k_.size() < bytes) {
        stage_k_.resize(bytes);
        stage_v_.resize(bytes);
      }
      rows_.read(l, (int)s, stage_k_.data(), stage_v_.data());
      for (int j = 0; j < seg.n_rows; ++j, ++r) {
        const int32_t g = rows_.pos[r];
        if (g < 0) continue;
        const uint8_t* k = stage_k_.data() + row_bytes * j;
        if (rotate_first) kv_unpack(seg.dtype, k, rope_rows_.data() + KV * placed++, KV);
        kv_.place_row(l, g, seg.dtype, rotate_first ? nullptr : k, stage_v_.data() + row_bytes * j);
      }
    }
    if (rotate_first) {
      angles();
      cpu::rotate_and_store_keys(m_, kv_, l, pos_.data(), (int)pos_.size(), rope_cos_.data(),
                                 rope_sin_.data(), rope_rows_.data());
    } else if (do_rope && !rows_.rotated) {
      rope(l);
    }
    loader_ms_ += t.ms();
  }
  // Only one thread ever calls angles() in a given loader (the loader thread with rope_in_loader_
  // and overlap, else the caller), so the tables filled on the first call need no lock.
  void angles() {
    if (rope_cos_.empty() && !pos_.empty()) {
      m_.rope().angle_table(pos_.data(), (int)pos_.size(), rope_cos_, rope_sin_);
    }
  }
  void rope(int l) {
    angles();
    cpu::rotate_placed_keys(m_, kv_, l, pos_.data(), (int)pos_.size(), rope_cos_.data(),
                            rope_sin_.data(), rope_rows_);
  }

  const Model& m_;
  const ReusedRows& rows_;
  KVCache& kv_;
  PipelineOptions opt_;
  int n_layer_;
  int first_layer_;
  bool rope_in_loader_;
  std::vector<char> ready_;
  // loader_ms_ is written by whichever thread runs load() (the loader thread, published to the
  // caller with ready_ under mu_); rope_on_caller_ms_ only by the caller.
  double loader_ms_ = 0;
  double rope_on_caller_ms_ = 0;
  std::vector<uint8_t> stage_k_, stage_v_;  // reusable staging buffers (loader thread only)
  std::vector<int32_t> pos_;  // global positions of the placed rows (same in every layer)
  std::vector<float> rope_cos_, rope_sin_;  // F32 [n_placed][n_rot/2]: their RoPE angles, once
  std::vector<float> rope_rows_;  // a non-F32 cache's keys in F32 while they are rotated
  std::mutex mu_;
  std::condition_variable cv_;
  std::exception_ptr error_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class CpuLayers final : public LayerBackend {
 public:
  CpuLayers(const Model& m, KVCache& kv, Workspace& ws, const PipelineOptions& opt)
      : m_(m), kv_(kv), ws_(ws), opt_(opt) {}
  ~CpuLayers() override { seqs_.clear(); }  // joins the loader threads before their rows go
  BackendCaps caps() const override { return {"cpu", true, true, 0}; }
  void begin(const int32_t* tokens, const int32_t* pos, int n) override {
    begin_batch(tokens, pos, n, {BatchSeq{&kv_, n, false}});
  }
  void begin_batch(const int32_t* tokens, const int32_t* pos, int n,
                   const std::vector<BatchSeq>& seqs) override {
    CT_THROW_IF_NOT(n > 0, "a pass needs at least one active row");
    CT_THROW_IF_NOT(!seqs.empty(), "a pass needs at least one sequence");
    retire_loaders();
    seqs_.clear();
    seqs_.resize(seqs.size());
    batch_.assign(seqs.begin(), seqs.end());
    int rows = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      CT_THROW_IF_NOT(seqs[s].kv && seqs[s].n > 0, "sequence {} of the pass: {} rows, {}", s,
                      seqs[s].n, seqs[s].kv ? "a cache" : "no cache");
      rows += seqs[s].n;
    }
    CT_THROW_IF_NOT(rows == n, "a pass of {} rows split into sequences of {} rows", n, rows);
    act_.assign(pos, pos + n);
    x_.resize((size_t)n * m_.config().n_embd);
    m_.embed(tokens, n, x_.data());
  }
  void set_reused(const ReusedRows& rows, int first_layer) override {
    set_reused_for(0, rows, first_layer);
  }
  void set_reused_for(int seq, const ReusedRows& rows, int first_layer) override {
    CT_THROW_IF_NOT(seq >= 0 && seq < (int)seqs_.size(), "sequence {} of a pass of {}", seq,
                    seqs_.size());
    Seq& q = seqs_[seq];
    retire_loader(q);
    q.rows = rows;
    q.loader = std::make_unique<LayerLoader>(m_, q.rows, *batch_[seq].kv, opt_, first_layer);
  }
  void layer(int l, LayerTap* tap) override {
    for (const BatchSeq& b : batch_) {
      CT_THROW_IF_NOT(l < b.kv->n_layer(), "layer {} on a cache of {} layers", l, b.kv->n_layer());
    }
    for (Seq& q : seqs_) {
      if (q.loader) q.loader->wait(l);
    }
    CT_THROW_IF_NOT(!tap || seqs_.size() == 1, "layer taps on a pass of {} sequences",
                    seqs_.size());
    Timer t;
    cpu::forward_batch(m_, l, x_.data(), act_.data(), (int)act_.size(), batch_.data(),
                       (int)batch_.size(), ws_, tap);
    times_.compute_ms += t.ms();
  }
  void keep_rows(const std::vector<int32_t>& to) override {
    CT_THROW_IF_NOT(seqs_.size() == 1, "keep_rows on a pass of {} sequences", seqs_.size());
    const int E = m_.config().n_embd;
    size_t w = 0;
    for (size_t i = 0; i < act_.size() && w < to.size(); ++i) {
      if (act_[i] != to[w]) continue;
      if (i != w) std::memmove(x_.data() + w * E, x_.data() + i * E, E * sizeof(float));
      ++w;
    }
    CT_ASSERT(w == to.size(), "active set is not a subset ({} of {})", w, to.size());
    x_.resize(w * E);
    act_ = to;
    batch_[0].n = (int)w;
  }
  void project_kv(int l, float* k, float* v) override {
    CT_THROW_IF_NOT(seqs_.size() == 1, "project_kv on a pass of {} sequences", seqs_.size());
    CT_THROW_IF_NOT(l >= 0 && l < m_.config().n_layer, "project_kv of layer {} of {}", l,
                    m_.config().n_layer);
    Timer t;
    cpu::project_kv(m_, l, x_.data(), (int)act_.size(), ws_, k, v);
    times_.compute_ms += t.ms();
  }
  std::vector<float> finish() override {
    CT_THROW_IF_NOT(seqs_.size() == 1, "finish() on a pass of {} sequences: use finish_batch()",
                    seqs_.size());
    return finish_batch();
  }
  // Each sequence's last row alone, or all of them through the decode head kernel, which
  // multiplies each row as it would alone (cpu::decode_logits).
  std::vector<float> finish_batch() override {
    retire_loaders();
    Timer t;
    const int E = m_.config().n_embd, V = m_.config().n_vocab, S = (int)batch_.size();
    std::vector<float> logits((size_t)S * V);
    if (S == 1) {
      cpu::logits(m_, x_.data() + (act_.size() - 1) * E, 1, logits.data(), ws_);
    } else {
      std::vector<float> last((size_t)S * E);
      for (int s = 0, row = 0; s < S; ++s) {
        row += batch_[s].n;
        std::memcpy(last.data() + (size_t)s * E, x_.data() + (size_t)(row - 1) * E,
                    E * sizeof(float));
      }
      cpu::decode_logits(m_, last.data(), S, logits.data(), ws_);
    }
    times_.logits_ms += t.ms();
    return logits;
  }

 private:
  struct Seq {
    ReusedRows rows;
    std::unique_ptr<LayerLoader> loader;
  };
  // Adds a finished loader's times and ends it.
  void retire_loader(Seq& q) {
    if (!q.loader) return;
    q.loader->join();
    times_.load_ms += q.loader->load_ms();
    times_.load_wait_ms += q.loader->wait_ms;
    if (!opt_.overlap) times_.load_wait_ms += q.loader->load_ms();
    q.loader.reset();
  }
  void retire_loaders() {
    for (Seq& q : seqs_) retire_loader(q);
  }
  const Model& m_;
  KVCache& kv_;
  Workspace& ws_;
  PipelineOptions opt_;
  std::vector<int32_t> act_;
  std::vector<float> x_;
  std::vector<BatchSeq> batch_;  // the pass's sequences (caches and row counts)
  std::vector<Seq> seqs_;        // their reused rows and loaders, in the same order
};

}  // namespace

std::unique_ptr<LayerBackend> make_cpu_layers(const Model& m, KVCache& kv, Workspace& ws,
                                              const PipelineOptions& opt) {
  return std::make_unique<CpuLayers>(m, kv, ws, opt);
}

}  // namespace ct
