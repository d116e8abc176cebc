// The GPU decoder (backend/cuda/decoder.h) built from a loaded Model: its F32 weights uploaded,
// RoPE angles from the model's own table so both backends rotate identically. In a build without
// CUDA (backend/registry.h) make_cuda_decoder throws the "no CUDA backend" error.
#pragma once

#include <memory>
#include <vector>

#include "backend/cuda/decoder.h"
#include "model/model.h"

namespace ct {

// n_seq: the decoder's sequence slots (cuda::Decoder), n_ctx positions each.
std::unique_ptr<cuda::Decoder> make_cuda_decoder(const Model& m, int n_ctx, int n_seq = 1);

// cpu::prefill on the GPU: tokens at positions [pos0, pos0 + n) over a cache holding
// [0, pos0). Returns the last row's logits.
std::vector<float> cuda_prefill(cuda::Decoder& dec, const Model& m, const int32_t* tokens, int n,
                                int pos0);

// cuda::Decoder::decode_batch with the model's rotations: one token of each of n slots.
// Returns F32 [n][n_vocab].
std::vector<float> cuda_decode_batch(cuda::Decoder& dec, const Model& m, const int32_t* tokens,
                                     const int32_t* pos, const int32_t* seqs, int n);

}  // namespace ct
