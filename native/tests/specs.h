// Net specs shared by the native tests (each test_*.cc is its own program).
#pragma once

#include <cstdint>
#include <vector>

#include "rlpar/net.h"

namespace rlpar_test {

// Linear layers and LSTM gates of >= 512 outputs (600, 530 and 4 x 130), which the linear
// kernels read by batch: 1-3 rows in place, 4-32 rows (an actor's batch) by few-rows tiles with
// the weight prefetched, 33-63 in place, >= 64 through packed panels; the 530 outputs span two
// 512-output blocks and the 600 inputs end in a partial column tile.
inline rlpar::NetSpec wide_linear_spec() {
  using rlpar::HeadKind;
  using rlpar::LayerSpec;
  rlpar::NetSpec spec;
  spec.input_shape = {24};
  spec.layers = {LayerSpec::linear(600), LayerSpec::relu(), LayerSpec::linear(530),
                 LayerSpec::tanh()};
  spec.heads = {{HeadKind::Categorical, 3}, {HeadKind::Value, 1}};
  spec.lstm_hidden = 130;
  return spec;
}

// Every kind of block the net builds beyond a plain sequence: a padded max-pool, residual blocks
// of convs (the first opens with a ReLU right after a conv, which must not be fused into it), a
// LayerNorm over each pixel's channels and a pre-norm residual block of linear layers.
inline rlpar::NetSpec blocks_spec() {
  using rlpar::HeadKind;
  using rlpar::LayerSpec;
  const auto conv_block = LayerSpec::residual({LayerSpec::relu(), LayerSpec::conv2d(6, 3, 1, 1),
                                               LayerSpec::relu(), LayerSpec::conv2d(6, 3, 1, 1)});
  rlpar::NetSpec spec;
  spec.input_shape = {9, 9, 3};
  spec.layers = {LayerSpec::conv2d(6, 3, 1, 1), conv_block,
                 LayerSpec::maxpool2d(3, 2, 1), conv_block,
                 LayerSpec::layernorm(6), LayerSpec::relu(),
                 LayerSpec::flatten(), LayerSpec::linear(24),
                 LayerSpec::residual({LayerSpec::layernorm(), LayerSpec::linear(24),
                                      LayerSpec::relu()}),
                 LayerSpec::relu()};
  spec.heads = {{HeadKind::Categorical, 3}, {HeadKind::Value, 1}};
  return spec;
}

// Several encoders side by side on a Dict-like flat input of 55 features (concat_spec): a
// 5x5x2 image through a conv and a residual block that opens with a ReLU, 3 features through a
// linear layer and a ReLU (fused), and 2 indices into an embedding table; then a linear layer.
constexpr int64_t kConcatFeatures = 5 * 5 * 2 + 3 + 2;
inline rlpar::NetSpec concat_spec() {
  using rlpar::HeadKind;
  using rlpar::LayerSpec;
  rlpar::NetSpec spec;
  spec.input_shape = {kConcatFeatures};
  const auto block = LayerSpec::residual({LayerSpec::relu(), LayerSpec::conv2d(8, 3, 1, 1)});
  spec.layers = {
      LayerSpec::concat({{5, 5, 2}, {3}, {2}},
                        {{LayerSpec::conv2d(8, 3, 1, 1), block, LayerSpec::flatten()},
                         {LayerSpec::linear(16), LayerSpec::relu()},
                         {LayerSpec::embedding(7, 4)}}),
      LayerSpec::linear(32), LayerSpec::relu()};
  spec.heads = {{HeadKind::Categorical, 3}, {HeadKind::Value, 1}};
  return spec;
}

// Valid indices (0 to 6) in concat_spec's two embedding columns of obs [rows, kConcatFeatures].
inline void concat_indices(std::vector<float>& obs, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < 2; ++j) {
      obs[r * kConcatFeatures + kConcatFeatures - 2 + j] = static_cast<float>((3 * r + 5 * j) % 7);
    }
  }
}

}  // namespace rlpar_test
