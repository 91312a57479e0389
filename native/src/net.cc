#include "rlpar/net.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "eigen_maps.h"
#include "rlpar/amx.h"
#include "rlpar/layers.h"
#include "rlpar/lstm.h"
#include "rlpar/thread_pool.h"

namespace rlpar {

using StridedMap = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
using ConstStridedMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << "(";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << (s.size() == 1 ? ",)" : ")");
  return o.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

void check_finite(const float* x, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      std::ostringstream o;
      o << what << " must be finite, but element " << i << " is " << x[i];
      throw std::invalid_argument(o.str());
    }
  }
}

LayerSpec LayerSpec::linear(int64_t out_features) {
  LayerSpec l;
  l.kind = LayerKind::Linear;
  l.out_features = out_features;
  return l;
}
LayerSpec LayerSpec::conv2d(int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding) {
  LayerSpec l;
  l.kind = LayerKind::Conv2d;
  l.out_channels = out_channels;
  l.kernel = kernel;
  l.stride = stride;
  l.padding = padding;
  return l;
}
LayerSpec LayerSpec::relu() {
  LayerSpec l;
  l.kind = LayerKind::ReLU;
  return l;
}
LayerSpec LayerSpec::tanh() {
  LayerSpec l;
  l.kind = LayerKind::Tanh;
  return l;
}
LayerSpec LayerSpec::flatten() {
  LayerSpec l;
  l.kind = LayerKind::Flatten;
  return l;
}
LayerSpec LayerSpec::external_layer(std::shared_ptr<ExternalLayer> layer) {
  LayerSpec l;
  l.kind = LayerKind::External;
  l.external = std::move(layer);
  return l;
}
LayerSpec LayerSpec::maxpool2d(int64_t kernel, int64_t stride, int64_t padding) {
  LayerSpec l;
  l.kind = LayerKind::MaxPool2d;
  l.kernel = kernel;
  l.stride = stride;
  l.padding = padding;
  return l;
}
LayerSpec LayerSpec::layernorm(int64_t features) {
  LayerSpec l;
  l.kind = LayerKind::LayerNorm;
  l.out_features = features;
  return l;
}
LayerSpec LayerSpec::residual(std::vector<LayerSpec> body) {
  LayerSpec l;
  l.kind = LayerKind::Residual;
  l.body = std::move(body);
  return l;
}
LayerSpec LayerSpec::concat(std::vector<Shape> branch_shapes,
                            std::vector<std::vector<LayerSpec>> branches) {
  LayerSpec l;
  l.kind = LayerKind::Concat;
  l.branch_shapes = std::move(branch_shapes);
  l.branches = std::move(branches);
  return l;
}
LayerSpec LayerSpec::embedding(int64_t num_embeddings, int64_t dim) {
  LayerSpec l;
  l.kind = LayerKind::Embedding;
  l.num_embeddings = num_embeddings;
  l.out_features = dim;
  return l;
}
HeadSpec HeadSpec::categorical(int64_t n) { return {HeadKind::Categorical, n}; }
HeadSpec HeadSpec::value() { return {HeadKind::Value, 1}; }
HeadSpec HeadSpec::gaussian(int64_t n) { return {HeadKind::Gaussian, n}; }

// ---------------------------------------------------------------------------------------------
// Workspaces: 64-byte aligned scratch buffers that only grow, pooled per net.

namespace {

constexpr size_t kAlign = 64;

struct AlignedBuffer {
  float* data = nullptr;
  size_t capacity = 0;  // floats
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept : data(o.data), capacity(o.capacity) {
    o.data = nullptr;
    o.capacity = 0;
  }
  ~AlignedBuffer() { std::free(data); }
};

const char* kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::Linear: return "linear";
    case LayerKind::Conv2d: return "conv2d";
    case LayerKind::ReLU: return "relu";
    case LayerKind::Tanh: return "tanh";
    case LayerKind::Flatten: return "flatten";
    case LayerKind::External: return "python layer";
    case LayerKind::MaxPool2d: return "maxpool2d";
    case LayerKind::LayerNorm: return "layernorm";
    case LayerKind::Residual: return "residual";
    case LayerKind::Concat: return "concat";
    case LayerKind::Embedding: return "embedding";
    case LayerKind::Slice: return "slice";
  }
  return "?";
}

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

}  // namespace

class WorkspacePool {
 public:
  std::unique_ptr<Workspace> acquire();
  void release(std::unique_ptr<Workspace> ws);
  WorkspaceStats stats();
  void add_bytes(int64_t b) {
    bytes_.fetch_add(b, std::memory_order_relaxed);
    allocations_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  // Held only to push or pop one pointer: never across a computation or a call into Python.
  std::mutex mu_;
  std::vector<std::unique_ptr<Workspace>> idle_;
  int64_t created_ = 0;
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> allocations_{0};
};

class Workspace {
 public:
  explicit Workspace(WorkspacePool* pool) : pool_(pool) {}

  // Buffer `slot`, grown (never shrunk) to hold at least `floats` values.
  float* get(size_t slot, size_t floats) {
    if (slot >= bufs_.size()) bufs_.resize(slot + 1);
    AlignedBuffer& b = bufs_[slot];
    if (b.capacity < floats) {
      const size_t bytes = (floats * sizeof(float) + kAlign - 1) / kAlign * kAlign;
      void* p = std::aligned_alloc(kAlign, bytes);
      if (p == nullptr) throw std::bad_alloc();
      std::free(b.data);
      pool_->add_bytes(static_cast<int64_t>(bytes) -
                       static_cast<int64_t>(b.capacity * sizeof(float)));
      b.data = static_cast<float*>(p);
      b.capacity = bytes / sizeof(float);
    }
    return b.data;
  }

  std::vector<float*> act;  // act[i]: input of layer i; act.back(): the torso's output
  float* feat = nullptr;    // what the heads read: the torso's output, or the LSTM's
  int64_t batch = 0;        // rows: T * N
  int64_t steps = 1;
  uint8_t* resets = nullptr;  // [T, N] copy of the call's episode starts, or null

 private:
  WorkspacePool* pool_;
  std::vector<AlignedBuffer> bufs_;
};

std::unique_ptr<Workspace> WorkspacePool::acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      auto ws = std::move(idle_.back());
      idle_.pop_back();
      return ws;
    }
    ++created_;
  }
  return std::make_unique<Workspace>(this);
}

void WorkspacePool::release(std::unique_ptr<Workspace> ws) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(ws));
}

WorkspaceStats WorkspacePool::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  WorkspaceStats s;
  s.workspaces = created_;
  s.idle = static_cast<int64_t>(idle_.size());
  s.bytes = bytes_.load();
  s.allocations = allocations_.load();
  return s;
}

namespace {
// Gives a workspace back to its pool at scope exit, including when a layer throws.
struct Lease {
  std::shared_ptr<WorkspacePool> pool;
  std::unique_ptr<Workspace> ws;
  explicit Lease(std::shared_ptr<WorkspacePool> p) : pool(std::move(p)), ws(pool->acquire()) {}
  ~Lease() {
    if (ws) pool->release(std::move(ws));
  }
};
}  // namespace

Tape::Tape(std::shared_ptr<WorkspacePool> pool, std::unique_ptr<Workspace> ws, int64_t batch)
    : pool_(std::move(pool)), ws_(std::move(ws)), batch_(batch) {}

Tape::~Tape() {
  if (ws_) pool_->release(std::move(ws_));
}

// ---------------------------------------------------------------------------------------------

struct Net::Layer {
  LayerKind kind;
  Shape in, out;
  int64_t w = -1, b = -1;  // parameter offsets
  layers::ConvShape conv{};
  // A ReLU right after a conv or linear layer is applied in that layer's epilogue; the ReLU
  // layer then shares its output (its backward still reads that output as y).
  bool relu_epilogue = false, fused_into_previous = false;
  std::shared_ptr<ExternalLayer> external;
  // This layer's input is also a Residual's skip input: kept intact (no ReLU fused into the
  // layer before it), and its gradient gets the skip's added.
  bool block_start = false;
  size_t skip = 0;  // Residual (the add): activation index of the skip input
  // Slice: the activation index of the Concat's input, the first of its columns taken, the
  // branch's number and the join's layer index.
  size_t src = 0, join = 0, branch = 0;
  int64_t off = 0;
  // Concat (the join): each branch's output activation, its size and its first output column.
  std::vector<size_t> branch_act;
  std::vector<int64_t> branch_size, branch_off;
  int64_t num_embeddings = 0;  // Embedding (its dim: out_features of the spec, out / in)
  std::string where;           // Embedding: named in the error on a bad index
};

// Workspace slot numbers: 0..L activations (slot i = output of layer i-1), then scratch.
namespace {
enum : size_t { kGradA = 0, kGradB = 1, kCol = 2, kActBase = 3 };
// Torso parts per call at most (a pool with more threads uses this many).
constexpr int64_t kMaxParts = 256;
}

// core_weights' snapshots: a few (owner, version) entries, replaced oldest first.
struct Net::CoreCache {
  struct Entry {
    std::weak_ptr<const void> owner;
    uint64_t version = 0;
    std::shared_ptr<const PackedCore> packed;
  };
  static constexpr size_t kEntries = 4;
  // Held only to look up or replace an entry: never while packing.
  std::mutex mu;
  Entry entries[kEntries];
  size_t next = 0;
};

Net::Net(NetSpec spec)
    : spec_(std::move(spec)),
      pool_(std::make_shared<WorkspacePool>()),
      core_cache_(std::make_shared<CoreCache>()) {
  check_input();
  Shape cur = spec_.input_shape;
  for (size_t i = 0; i < spec_.layers.size(); ++i) {
    const LayerSpec& ls = spec_.layers[i];
    const std::string where = "layer " + std::to_string(i) + " (" + kind_name(ls.kind) + ")";
    if (ls.kind == LayerKind::Residual) {
      add_residual(ls, i, "layers." + std::to_string(i) + ".", where, cur);
    } else if (ls.kind == LayerKind::Concat) {
      add_concat(ls, i, where, cur);
    } else {
      add_layer(ls, i, "layers." + std::to_string(i) + ".", where, cur);
    }
  }
  shapes_.push_back(cur);
  for (size_t i = 1; i < layers_.size(); ++i) {
    const LayerKind prev = layers_[i - 1].kind;
    // A ReLU whose input is a skip input must not overwrite it in the layer before.
    if (layers_[i].kind == LayerKind::ReLU && !layers_[i].block_start &&
        (prev == LayerKind::Conv2d || prev == LayerKind::Linear)) {
      layers_[i - 1].relu_epilogue = true;
      layers_[i].fused_into_previous = true;
    }
  }
  for (const Shape& s : shapes_) max_activation_ = std::max(max_activation_, shape_numel(s));
  build_core(cur);
  build_heads(recurrent() ? Shape{spec_.lstm_hidden} : cur);
}

void Net::build_core(const Shape& torso_out) {
  if (spec_.lstm_hidden < 0) {
    fail("lstm_hidden must be >= 0 (0: no LSTM core), got " + std::to_string(spec_.lstm_hidden));
  }
  if (spec_.lstm_bf16x3 && !recurrent()) fail("lstm_bf16x3 needs an LSTM core (lstm_hidden > 0)");
  if (spec_.lstm_bf16x3 && !amx::available()) {
    fail("the LSTM's bf16x3 matmul needs Intel AMX-BF16 tiles (Xeon Sapphire Rapids or newer, "
         "Linux 5.16+), and this CPU or OS has none (or RLPAR_DISABLE_AMX is set): use the "
         "float32 matmul");
  }
  if (!recurrent()) return;
  if (torso_out.size() != 1) {
    fail("the LSTM core expects flat features (F,), but the last layer outputs " +
         shape_str(torso_out) + ": add a Flatten layer before it");
  }
  const int64_t h = spec_.lstm_hidden, index = static_cast<int64_t>(spec_.layers.size());
  core_in_ = torso_out[0];
  core_wx_ = add_param("core.weight_ih", "weight", {core_in_, 4 * h}, index, false);
  core_wh_ = add_param("core.weight_hh", "weight", {h, 4 * h}, index, false);
  core_b_ = add_param("core.bias", "bias", {4 * h}, index, false);
  flops_per_sample_ += 2.0 * (core_in_ + h) * 4 * h + 12.0 * h;
  max_activation_ = std::max(max_activation_, h);
}

void Net::check_input() const {
  const Shape& in = spec_.input_shape;
  if (!(in.size() == 1 || in.size() == 3) ||
      std::any_of(in.begin(), in.end(), [](int64_t d) { return d <= 0; })) {
    fail("input_shape must be (D,) or (H, W, C) with positive sizes, got " + shape_str(in));
  }
  if (!std::isfinite(spec_.input_scale) || spec_.input_scale == 0.0f) {
    fail("input_scale must be a finite non-zero number, got " + std::to_string(spec_.input_scale));
  }
}

int64_t Net::add_param(const std::string& name, const std::string& role, Shape shape,
                       int64_t index, bool in_head) {
  ParamInfo p;
  p.name = name;
  p.role = role;
  p.offset = num_params_;
  p.shape = std::move(shape);
  p.index = index;
  p.in_head = in_head;
  num_params_ += shape_numel(p.shape);
  params_.push_back(p);
  return p.offset;
}

void Net::add_layer(const LayerSpec& ls, size_t index, const std::string& prefix,
                    const std::string& where, Shape& cur) {
  Layer L = build_layer(ls, index, prefix, where, cur);
  shapes_.push_back(cur);
  cur = L.out;
  layers_.push_back(std::move(L));
}

// A Residual runs as its body's layers, then an add of the block's input: y = x + body(x).
// Its body layer j's parameters are named prefix + "<j>.".
void Net::add_residual(const LayerSpec& ls, size_t index, const std::string& prefix,
                       const std::string& where, Shape& cur) {
  if (ls.body.empty()) fail(where + " needs at least one layer in its body, got none");
  const Shape in = cur;
  const size_t start = layers_.size();
  for (size_t j = 0; j < ls.body.size(); ++j) {
    const LayerSpec& inner = ls.body[j];
    const std::string inner_where = where + " body layer " + std::to_string(j) + " (" +
                                    kind_name(inner.kind) + ")";
    if (inner.kind == LayerKind::Residual) {
      fail(inner_where + ": residual blocks nest one level only (a body holds no Residual); "
           "place the blocks one after the other");
    }
    if (inner.kind == LayerKind::Concat) {
      fail(inner_where + ": a residual body holds no Concat; place the Concat before the block");
    }
    add_layer(inner, index, prefix + std::to_string(j) + ".", inner_where, cur);
  }
  if (cur != in) {
    fail(where + " must output its input's shape " + shape_str(in) +
         " (y = x + body(x)), but its body outputs " + shape_str(cur));
  }
  layers_[start].block_start = true;
  Layer add;
  add.kind = LayerKind::Residual;
  add.in = add.out = in;
  add.skip = start;
  flops_per_sample_ += static_cast<double>(shape_numel(in));
  shapes_.push_back(in);
  layers_.push_back(std::move(add));
}

// A Concat runs as, for each branch k, a slice of the block's input (its columns, viewed as the
// branch's shape) and the branch's layers, then a join that writes each branch's output, flat,
// into its columns of the block's output. The block's input activation stays intact: every
// slice reads it, and no layer writes it (a slice is never a ReLU's fused producer).
void Net::add_concat(const LayerSpec& ls, size_t index, const std::string& where, Shape& cur) {
  if (ls.branches.empty()) fail(where + " needs at least one branch, got none");
  if (ls.branches.size() != ls.branch_shapes.size()) {
    fail(where + " has " + std::to_string(ls.branches.size()) + " branches but " +
         std::to_string(ls.branch_shapes.size()) + " branch shapes");
  }
  if (cur.size() != 1) {
    fail(where + " expects a flat input (F,), got " + shape_str(cur) +
         ": add a Flatten layer before it");
  }
  int64_t taken = 0;
  std::string shapes;
  for (size_t k = 0; k < ls.branch_shapes.size(); ++k) {
    const Shape& s = ls.branch_shapes[k];
    if (!(s.size() == 1 || s.size() == 3) ||
        std::any_of(s.begin(), s.end(), [](int64_t d) { return d <= 0; })) {
      fail(where + " branch " + std::to_string(k) +
           " needs a shape (D,) or (H, W, C) with positive sizes, got " + shape_str(s));
    }
    taken += shape_numel(s);
    shapes += (k ? ", " : "") + shape_str(s);
  }
  if (taken != cur[0]) {
    fail(where + ": its branches' shapes " + shapes + " take " + std::to_string(taken) +
         " features, but its input is " + shape_str(cur));
  }
  const Shape in = cur;
  Layer join;
  join.kind = LayerKind::Concat;
  std::vector<size_t> slices;
  int64_t off = 0, total = 0;
  for (size_t k = 0; k < ls.branches.size(); ++k) {
    const std::string branch = where + " branch " + std::to_string(k);
    const std::string prefix = "layers." + std::to_string(index) + "." + std::to_string(k) + ".";
    Layer slice;
    slice.kind = LayerKind::Slice;
    slice.in = in;
    slice.out = ls.branch_shapes[k];
    slice.src = slices.empty() ? layers_.size() : layers_[slices.front()].src;
    slice.off = off;
    slice.branch = k;
    off += shape_numel(slice.out);
    cur = slice.out;
    slices.push_back(layers_.size());
    shapes_.push_back(in);
    layers_.push_back(std::move(slice));
    for (size_t j = 0; j < ls.branches[k].size(); ++j) {
      const LayerSpec& inner = ls.branches[k][j];
      const std::string inner_where =
          branch + " layer " + std::to_string(j) + " (" + kind_name(inner.kind) + ")";
      if (inner.kind == LayerKind::Concat) {
        fail(inner_where + ": a branch holds no Concat; give the outer Concat more branches");
      }
      if (inner.kind == LayerKind::Residual) {
        add_residual(inner, index, prefix + std::to_string(j) + ".", inner_where, cur);
      } else {
        add_layer(inner, index, prefix + std::to_string(j) + ".", inner_where, cur);
      }
    }
    join.branch_act.push_back(layers_.size());
    join.branch_size.push_back(shape_numel(cur));
    join.branch_off.push_back(total);
    total += shape_numel(cur);
  }
  for (size_t s : slices) layers_[s].join = layers_.size();
  join.in = cur;  // what the activation before the join holds: the last branch's output
  join.out = {total};
  flops_per_sample_ += static_cast<double>(in[0] + total);
  shapes_.push_back(join.in);
  layers_.push_back(std::move(join));
  cur = {total};
}

Net::Layer Net::build_layer(const LayerSpec& ls, size_t index, const std::string& prefix,
                            const std::string& where, const Shape& in) {
  Layer L;
  L.kind = ls.kind;
  L.in = in;
  switch (ls.kind) {
    case LayerKind::Linear:
      build_linear(L, ls, index, prefix, where);
      break;
    case LayerKind::Conv2d:
      build_conv(L, ls, index, prefix, where);
      break;
    case LayerKind::MaxPool2d:
      build_pool(L, ls, where);
      break;
    case LayerKind::LayerNorm:
      build_layernorm(L, ls, index, prefix, where);
      break;
    case LayerKind::Residual:
      fail(where + " is a residual block, which cannot appear here");
    case LayerKind::Concat:
      fail(where + " is a concat block, which cannot appear here");
    case LayerKind::Slice:
      fail(where + ": a slice is made by a Concat, not named in a spec");
    case LayerKind::Embedding:
      build_embedding(L, ls, index, prefix, where);
      break;
    case LayerKind::ReLU:
    case LayerKind::Tanh:
      L.out = in;
      flops_per_sample_ += static_cast<double>(shape_numel(in));
      break;
    case LayerKind::Flatten:
      L.out = {shape_numel(in)};
      break;
    case LayerKind::External:
      build_external(L, ls, where);
      break;
  }
  return L;
}

void Net::build_linear(Layer& L, const LayerSpec& ls, size_t i, const std::string& prefix,
                       const std::string& where) {
  const Shape& cur = L.in;
  if (cur.size() != 1) {
    fail(where + " expects a flat input (D,), got " + shape_str(cur) +
         ": add a Flatten layer before it");
  }
  if (ls.out_features <= 0) {
    fail(where + " needs out_features >= 1, got " + std::to_string(ls.out_features));
  }
  L.out = {ls.out_features};
  L.w = add_param(prefix + "weight", "weight", {cur[0], ls.out_features}, i, false);
  L.b = add_param(prefix + "bias", "bias", {ls.out_features}, i, false);
  flops_per_sample_ += 2.0 * cur[0] * ls.out_features;
}

void Net::build_conv(Layer& L, const LayerSpec& ls, size_t i, const std::string& prefix,
                     const std::string& where) {
  const Shape& cur = L.in;
  if (cur.size() != 3) fail(where + " expects an image input (H, W, C), got " + shape_str(cur));
  if (ls.out_channels <= 0 || ls.kernel <= 0 || ls.stride <= 0 || ls.padding < 0) {
    fail(where + " needs out_channels, kernel, stride >= 1 and padding >= 0, got " +
         "out_channels=" + std::to_string(ls.out_channels) +
         " kernel=" + std::to_string(ls.kernel) + " stride=" + std::to_string(ls.stride) +
         " padding=" + std::to_string(ls.padding));
  }
  const int64_t oh = layers::conv_out_size(cur[0], ls.kernel, ls.stride, ls.padding);
  const int64_t ow = layers::conv_out_size(cur[1], ls.kernel, ls.stride, ls.padding);
  if (oh <= 0 || ow <= 0) {
    fail(where + " with kernel " + std::to_string(ls.kernel) + ", stride " +
         std::to_string(ls.stride) + ", padding " + std::to_string(ls.padding) + " on input " +
         shape_str(cur) + " would have an empty output");
  }
  L.conv = {cur[0], cur[1], cur[2], oh, ow, ls.out_channels, ls.kernel, ls.stride, ls.padding};
  L.out = {oh, ow, ls.out_channels};
  L.w = add_param(prefix + "weight", "weight", {ls.kernel, ls.kernel, cur[2], ls.out_channels}, i,
                  false);
  L.b = add_param(prefix + "bias", "bias", {ls.out_channels}, i, false);
  flops_per_sample_ += 2.0 * oh * ow * L.conv.patch() * ls.out_channels;
}

void Net::build_pool(Layer& L, const LayerSpec& ls, const std::string& where) {
  const Shape& cur = L.in;
  if (cur.size() != 3) fail(where + " expects an image input (H, W, C), got " + shape_str(cur));
  if (ls.kernel <= 0 || ls.stride <= 0 || ls.padding < 0 || 2 * ls.padding > ls.kernel) {
    fail(where + " needs kernel, stride >= 1 and 0 <= padding <= kernel / 2, got kernel=" +
         std::to_string(ls.kernel) + " stride=" + std::to_string(ls.stride) +
         " padding=" + std::to_string(ls.padding));
  }
  const int64_t oh = layers::conv_out_size(cur[0], ls.kernel, ls.stride, ls.padding);
  const int64_t ow = layers::conv_out_size(cur[1], ls.kernel, ls.stride, ls.padding);
  if (oh <= 0 || ow <= 0) {
    fail(where + ": kernel " + std::to_string(ls.kernel) + " is larger than the input " +
         shape_str(cur) + " padded by " + std::to_string(ls.padding) + " on each side");
  }
  L.conv = {cur[0], cur[1], cur[2], oh, ow, cur[2], ls.kernel, ls.stride, ls.padding};
  L.out = {oh, ow, cur[2]};
  flops_per_sample_ += static_cast<double>(oh * ow * cur[2] * ls.kernel * ls.kernel);
}

void Net::build_layernorm(Layer& L, const LayerSpec& ls, size_t i, const std::string& prefix,
                          const std::string& where) {
  const Shape& cur = L.in;
  const int64_t d = cur.back();
  if (ls.out_features < 0 || (ls.out_features > 0 && ls.out_features != d)) {
    fail(where + " normalizes the last dimension, of size " + std::to_string(ls.out_features) +
         " as declared, but its input is " + shape_str(cur));
  }
  if (d < 2) {
    fail(where + " needs at least 2 features in the last dimension to normalize, got input " +
         shape_str(cur));
  }
  L.out = cur;
  L.w = add_param(prefix + "weight", "gain", {d}, i, false);
  L.b = add_param(prefix + "bias", "bias", {d}, i, false);
  flops_per_sample_ += 8.0 * static_cast<double>(shape_numel(cur));
}

void Net::build_embedding(Layer& L, const LayerSpec& ls, size_t i, const std::string& prefix,
                          const std::string& where) {
  const Shape& cur = L.in;
  if (cur.size() != 1) {
    fail(where + " expects a flat input (K,) of indices, got " + shape_str(cur) +
         ": add a Flatten layer before it, or give it a branch of shape (K,)");
  }
  if (ls.num_embeddings <= 0 || ls.out_features <= 0) {
    fail(where + " needs num_embeddings >= 1 and dim >= 1, got num_embeddings=" +
         std::to_string(ls.num_embeddings) + " dim=" + std::to_string(ls.out_features));
  }
  // Above 2^24 a float32 no longer holds every integer: indices would not be exact.
  if (ls.num_embeddings > (int64_t{1} << 24)) {
    fail(where + " holds at most 2^24 = 16777216 vectors (float32 indices are exact up to "
         "there), got num_embeddings=" + std::to_string(ls.num_embeddings));
  }
  L.out = {cur[0] * ls.out_features};
  L.num_embeddings = ls.num_embeddings;
  L.where = where;
  L.w = add_param(prefix + "weight", "weight", {ls.num_embeddings, ls.out_features}, i, false);
  flops_per_sample_ += static_cast<double>(L.out[0]);
}

void Net::build_external(Layer& L, const LayerSpec& ls, const std::string& where) {
  if (!ls.external) fail(where + " has no implementation");
  const Shape os = ls.external->output_shape(L.in);
  if (os.empty() || std::any_of(os.begin(), os.end(), [](int64_t d) { return d <= 0; })) {
    fail(where + " must declare an output shape with positive sizes, got " + shape_str(os));
  }
  L.out = os;
  L.external = ls.external;
  has_external_ = true;
}

void Net::build_heads(const Shape& features) {
  if (spec_.heads.empty()) {
    fail("a net needs at least one head (categorical, value or gaussian), got none");
  }
  if (features.size() != 1) {
    fail("heads expect flat features (F,), but the last layer outputs " + shape_str(features) +
         ": add a Flatten layer at the end");
  }
  feature_size_ = features[0];
  for (size_t h = 0; h < spec_.heads.size(); ++h) {
    const HeadSpec& hs = spec_.heads[h];
    const std::string prefix = "heads." + std::to_string(h) + ".";
    const std::string where = "head " + std::to_string(h);
    if (hs.size <= 0) fail(where + " needs size >= 1, got " + std::to_string(hs.size));
    if (hs.kind == HeadKind::Value && hs.size != 1) {
      fail(where + " (value) must have size 1, got " + std::to_string(hs.size));
    }
    head_weight_offset_.push_back(
        add_param(prefix + "weight", "weight", {feature_size_, hs.size}, h, true));
    head_bias_offset_.push_back(add_param(prefix + "bias", "bias", {hs.size}, h, true));
    flops_per_sample_ += 2.0 * feature_size_ * hs.size;
    const char* name = hs.kind == HeadKind::Categorical ? "logits"
                       : hs.kind == HeadKind::Value     ? "value"
                                                        : "mean";
    outputs_.push_back({name, static_cast<int64_t>(h), output_size_, hs.size, false});
    output_size_ += hs.size;
    if (hs.kind == HeadKind::Gaussian) {
      head_logstd_offset_.push_back(add_param(prefix + "log_std", "log_std", {hs.size}, h, true));
      outputs_.push_back({"log_std", static_cast<int64_t>(h), output_size_, hs.size, true});
      output_size_ += hs.size;
    } else {
      head_logstd_offset_.push_back(-1);
    }
  }
}

Net::~Net() = default;

size_t Net::core_slot(size_t k) const { return kActBase + layers_.size() + 1 + k; }

namespace {
// Workspace slots after the activations (Net::core_slot): the LSTM's, then the shared panels
// of a split Linear backward (torso_backward; the LSTM's backward uses kDxPanels before it),
// then the torso parts' scratch.
enum : size_t { kCoreH = 0, kCoreGates, kCoreHPrev, kCoreCPrev, kCoreC, kCoreTanhC, kCoreResets,
                kCoreDGates, kCoreDState, kCoreAmxA, kCoreAmxB, kDxPanels, kDyPanels,
                kSkipGrad, kNormStats, kConcatGrad, kConcatDx, kCoreSlots };

// A part gets at least this much work (flops, ~0.1 ms): waking the workers costs microseconds,
// so splitting a small batch costs more than it saves (measured: an MLP learner step of
// [20, 32] rows ran at x0.9 of one thread when split in two).
constexpr double kMinPartFlops = 1e7;

// From this many parts on, a Linear layer's backward packs its panels once for all parts
// (torso_backward). Every part reads the whole weight either way; packing on its own, each part
// also transposes all of it, into panels that stay in its L2, while shared panels (6.4 MB for
// the Nature torso's 3136 -> 512 weight) go out to memory and back. Measured on 2 cores for that
// layer: its split backward at 640 rows ran 3-5 % slower shared at 2 parts (16.4-23.0 ms own
// against 17.2-24.0); the data gradient of 40 rows (a 16th of 640) took 1.4-1.8 ms packing its
// own panels against 1.1-1.6 ms reading prepacked ones, and packing the whole weight 0.8 ms
// (0.05 ms a part at 16). Where between 2 and 16 the shared pack starts to pay needs a machine
// with the cores to measure; 4 is the estimate.
constexpr int64_t kSharedPanelParts = 4;

// How many of the last rows of out [rows, cols] are all zero (-0.0 included, NaN not).
int64_t trailing_zero_rows(const float* out, int64_t rows, int64_t cols) {
  int64_t r = rows;
  for (; r > 0; --r) {
    const float* row = out + (r - 1) * cols;
    bool zero = true;
    for (int64_t j = 0; j < cols && zero; ++j) zero = row[j] == 0.0f;
    if (!zero) break;
  }
  return rows - r;
}

// fn(0) on the calling thread when there is one part, else fn(0 .. parts - 1) on the pool (by
// reference: std::function keeps a reference_wrapper without allocating).
template <typename Fn>
void run_parts(ThreadPool* pool, int64_t parts, Fn& fn) {
  if (parts == 1) {
    fn(0);
  } else {
    pool->run(parts, std::ref(fn));
  }
}
}  // namespace

// Scratch of each torso part: part 0 uses kCol, part p > 0 its own slot after the core's.
void Net::part_scratch(Workspace& ws, int64_t parts, int64_t first_floats, int64_t floats,
                       float** scratch) const {
  scratch[0] = ws.get(kCol, first_floats);
  for (int64_t p = 1; p < parts; ++p) {
    scratch[p] = ws.get(core_slot(kCoreSlots) + static_cast<size_t>(p - 1), floats);
  }
}

int64_t Net::torso_parts(const ThreadPool* pool, int64_t batch) const {
  if (pool == nullptr || pool->threads() < 2 || has_external_ || layers_.empty()) return 1;
  const double work = 3.0 * flops_per_sample_ * static_cast<double>(batch);
  const auto by_work = static_cast<int64_t>(work / kMinPartFlops);
  return std::max<int64_t>(1, std::min({pool->threads(), batch, by_work, kMaxParts}));
}

// Floats of scratch one torso part of `rows` rows needs, for the forward or the backward.
int64_t Net::part_scratch_floats(int64_t rows, bool backward) const {
  int64_t n = 0;
  for (const Layer& l : layers_) {
    if (l.kind == LayerKind::Conv2d) {
      n = std::max(n, layers::conv2d_scratch_floats(l.conv, rows, backward));
    }
  }
  return n;
}

void Net::run_forward(const float* params, const void* input, const SeqArgs& seq, float* out,
                      Workspace& ws, ThreadPool* pool) const {
  if (seq.steps <= 0 || seq.seqs <= 0) {
    fail("a sequence needs steps >= 1 and seqs >= 1, got steps=" + std::to_string(seq.steps) +
         " seqs=" + std::to_string(seq.seqs));
  }
  ws.batch = seq.steps * seq.seqs;
  ws.steps = seq.steps;
  run_torso(params, input, ws, pool);
  ws.feat = ws.act[layers_.size()];
  if (recurrent()) run_core(params, seq, ws);
  run_heads(params, out, ws);
}

void Net::run_torso(const float* params, const void* input, Workspace& ws,
                    ThreadPool* pool) const {
  const int64_t batch = ws.batch;
  const size_t L = layers_.size();
  // Every buffer is taken before any part runs: Workspace::get is for one thread at a time.
  ws.act.resize(L + 1);
  ws.act[0] = ws.get(kActBase, batch * input_size());
  for (size_t i = 0; i < L; ++i) {
    const Layer& l = layers_[i];
    ws.act[i + 1] = (l.kind == LayerKind::Flatten || l.fused_into_previous)
                        ? ws.act[i]
                        : ws.get(kActBase + i + 1, batch * shape_numel(l.out));
  }
  const int64_t parts = torso_parts(pool, batch);
  const int64_t floats = part_scratch_floats((batch + parts - 1) / parts, false);
  float* scratch[kMaxParts];
  part_scratch(ws, parts, floats, floats, scratch);
  auto part = [&](int64_t p) {
    int64_t r0, r1;
    layers::split_range(batch, parts, p, &r0, &r1);
    torso_rows(params, input, ws, r0, r1, scratch[p]);
  };
  run_parts(pool, parts, part);
}

// The torso for batch rows [r0, r1): the input conversion, then each layer, on those rows of
// the activations that run_torso took.
void Net::torso_rows(const float* params, const void* input, Workspace& ws, int64_t r0,
                     int64_t r1, float* scratch) const {
  const int64_t rows = r1 - r0, in = input_size();
  // Input -> float activation 0 (uint8 frames are converted and scaled here, natively).
  const int64_t n_in = rows * in;
  float* x0 = ws.act[0] + r0 * in;
  const float scale = spec_.input_scale;
  if (spec_.input_uint8) {
    const uint8_t* src = static_cast<const uint8_t*>(input) + r0 * in;
    for (int64_t i = 0; i < n_in; ++i) x0[i] = static_cast<float>(src[i]) * scale;
  } else if (scale == 1.0f) {
    std::memcpy(x0, static_cast<const float*>(input) + r0 * in, sizeof(float) * n_in);
  } else {
    const float* src = static_cast<const float*>(input) + r0 * in;
    for (int64_t i = 0; i < n_in; ++i) x0[i] = src[i] * scale;
  }

  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    if (l.kind == LayerKind::Flatten || l.fused_into_previous) continue;
    const float* x = ws.act[l.kind == LayerKind::Slice ? l.src : i] + r0 * shape_numel(l.in);
    float* y = ws.act[i + 1] + r0 * shape_numel(l.out);
    const int64_t n_out = rows * shape_numel(l.out);
    switch (l.kind) {
      case LayerKind::Linear:
        layers::linear_forward(y, x, params + l.w, params + l.b, rows, l.in[0], l.out[0],
                               l.relu_epilogue);
        break;
      case LayerKind::Conv2d:
        layers::conv2d_forward(y, x, params + l.w, params + l.b, rows, l.conv, l.relu_epilogue,
                               scratch);
        break;
      case LayerKind::ReLU:
        layers::relu_forward(y, x, n_out);
        break;
      case LayerKind::Tanh:
        layers::tanh_forward(y, x, n_out);
        break;
      case LayerKind::External:
        l.external->forward(x, l.in, y, l.out, rows);
        break;
      case LayerKind::MaxPool2d:
        layers::maxpool2d_forward(y, x, rows, l.conv);
        break;
      case LayerKind::LayerNorm:
        layers::layernorm_forward(y, x, params + l.w, params + l.b, n_out / l.in.back(),
                                  l.in.back());
        break;
      case LayerKind::Residual:
        layers::add_forward(y, x, ws.act[l.skip] + r0 * shape_numel(l.in), n_out);
        break;
      case LayerKind::Slice:
        layers::copy_columns(y, x, rows, shape_numel(l.out), l.in[0], l.off);
        break;
      case LayerKind::Concat:
        for (size_t b = 0; b < l.branch_act.size(); ++b) {
          const int64_t n = l.branch_size[b];
          layers::put_columns(y, ws.act[l.branch_act[b]] + r0 * n, rows, n, l.out[0],
                              l.branch_off[b]);
        }
        break;
      case LayerKind::Embedding:
        layers::embedding_forward(y, x, params + l.w, rows, l.in[0], l.num_embeddings,
                                  l.out[0] / l.in[0], r0, l.where.c_str());
        break;
      case LayerKind::Flatten:
        break;
    }
  }
}

std::shared_ptr<const PackedCore> Net::pack_core(const float* params) const {
  if (!spec_.lstm_bf16x3) fail("pack_core: the net's LSTM does not use bf16x3 products");
  const int64_t h = spec_.lstm_hidden;
  auto packed = std::make_shared<PackedCore>();
  packed->w.resize(static_cast<size_t>(lstm::packed_weight_elems(core_in_, h)));
  lstm::pack_weights(packed->w.data(), params + core_wx_, params + core_wh_, core_in_, h);
  return packed;
}

std::shared_ptr<const PackedCore> Net::core_weights(const float* params,
                                                    const std::shared_ptr<const void>& owner,
                                                    uint64_t version, bool many_calls) const {
  if (!spec_.lstm_bf16x3) return nullptr;
  if (!owner) return many_calls ? pack_core(params) : nullptr;
  CoreCache& cache = *core_cache_;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    for (const CoreCache::Entry& e : cache.entries) {
      if (e.packed && e.version == version && e.owner.lock() == owner) return e.packed;
    }
  }
  std::shared_ptr<const PackedCore> packed = pack_core(params);
  std::lock_guard<std::mutex> lock(cache.mu);
  CoreCache::Entry& e = cache.entries[cache.next];
  cache.next = (cache.next + 1) % CoreCache::kEntries;
  e = {owner, version, packed};
  return packed;
}

// The LSTM's packed bf16x3 operands (spec.lstm_bf16x3), in workspace slots; none otherwise.
// `prepacked`: the weights come packed (forward only), so no B scratch.
lstm::AmxScratch Net::core_amx(const lstm::LstmDims& d, Workspace& ws, bool prepacked) const {
  if (!spec_.lstm_bf16x3) return {};
  const auto floats = [](int64_t elems) { return static_cast<size_t>((elems + 1) / 2); };
  lstm::AmxScratch amx;
  amx.a = reinterpret_cast<uint16_t*>(ws.get(core_slot(kCoreAmxA), floats(lstm::amx_a_elems(d))));
  if (!prepacked) {
    amx.b = reinterpret_cast<uint16_t*>(ws.get(core_slot(kCoreAmxB), floats(lstm::amx_b_elems(d))));
  }
  return amx;
}

void Net::run_core(const float* params, const SeqArgs& seq, Workspace& ws) const {
  const int64_t rows = ws.batch, h = spec_.lstm_hidden;
  const lstm::LstmDims d{seq.steps, seq.seqs, core_in_, h};
  const lstm::LstmTape tape{ws.get(core_slot(kCoreGates), rows * 4 * h),
                            ws.get(core_slot(kCoreHPrev), rows * h),
                            ws.get(core_slot(kCoreCPrev), rows * h),
                            ws.get(core_slot(kCoreC), rows * h),
                            ws.get(core_slot(kCoreTanhC), rows * h)};
  // The resets are copied: backward needs them after the caller's array may be gone.
  ws.resets = nullptr;
  if (seq.resets != nullptr) {
    ws.resets = reinterpret_cast<uint8_t*>(ws.get(core_slot(kCoreResets), (rows + 3) / 4));
    for (int64_t i = 0; i < rows; ++i) ws.resets[i] = seq.resets[i] != 0;
  }
  float* out_h = ws.get(core_slot(kCoreH), rows * h);
  lstm::AmxScratch amx = core_amx(d, ws, seq.packed_core != nullptr);
  if (amx.a != nullptr && seq.packed_core != nullptr) amx.w = seq.packed_core->w.data();
  lstm::forward(d, ws.act[layers_.size()], params + core_wx_, params + core_wh_, params + core_b_,
                seq.state0, ws.resets, out_h, tape, seq.state_out, amx);
  ws.feat = out_h;
}

void Net::run_heads(const float* params, float* out, Workspace& ws) const {
  // One GEMM each, written straight into their columns of `out`.
  const int64_t batch = ws.batch;
  ConstMatMap F(ws.feat, batch, feature_size_);
  for (const OutputInfo& o : outputs_) {
    StridedMap Y(out + o.begin, batch, o.size, Eigen::OuterStride<>(output_size_));
    if (o.log_std) {
      Y.rowwise() = Eigen::Map<const Eigen::RowVectorXf>(params + head_logstd_offset_[o.head], o.size);
      continue;
    }
    Y.noalias() = F * ConstMatMap(params + head_weight_offset_[o.head], feature_size_, o.size);
    Y.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(params + head_bias_offset_[o.head], o.size);
  }
}

void Net::forward(const float* params, const void* input, int64_t batch, float* out) const {
  SeqArgs seq;
  seq.seqs = batch;
  forward_seq(params, input, seq, out);
}

std::unique_ptr<Tape> Net::forward_train(const float* params, const void* input, int64_t batch,
                                         float* out) const {
  SeqArgs seq;
  seq.seqs = batch;
  return forward_train_seq(params, input, seq, out);
}

void Net::forward_seq(const float* params, const void* input, const SeqArgs& seq, float* out,
                      ThreadPool* pool) const {
  Lease lease(pool_);
  run_forward(params, input, seq, out, *lease.ws, pool);
}

std::unique_ptr<Tape> Net::forward_train_seq(const float* params, const void* input,
                                             const SeqArgs& seq, float* out,
                                             ThreadPool* pool) const {
  Lease lease(pool_);
  run_forward(params, input, seq, out, *lease.ws, pool);
  auto tape = std::make_unique<Tape>(pool_, std::move(lease.ws), seq.steps * seq.seqs);
  tape->steps_ = seq.steps;
  return tape;
}

void Net::backward(const float* params, const Tape& tape, const float* dout, float* grad,
                   bool accumulate, ThreadPool* pool) const {
  if (tape.pool_ != pool_) fail("this tape was recorded by another net");
  Workspace& ws = *tape.ws_;
  const int64_t batch = tape.batch_;
  if (!accumulate) std::memset(grad, 0, sizeof(float) * num_params_);
  float* g[2] = {ws.get(kGradA, batch * max_activation_), ws.get(kGradB, batch * max_activation_)};
  if (recurrent()) {
    heads_backward(params, dout, grad, g[0], ws, batch);
    if (core_backward(params, g[0], grad, layers_.empty() ? nullptr : g[1], ws) == nullptr) return;
    torso_backward(params, g[1], g[0], grad, ws, pool, batch);
  } else {
    // Rows of a feed-forward net are independent: trailing rows whose output gradient is all
    // zero (an actor-critic loss's bootstrap rows, the last time step of every column of a
    // [T + 1, N] batch) would only add zero products to each parameter's gradient, and nothing
    // reads their data gradients. They are left out: 1 / (T + 1) of the backward's work. A net
    // with a Python layer keeps them: its backward is promised the forward's rows.
    const int64_t rows =
        has_external_ ? batch : batch - trailing_zero_rows(dout, batch, output_size_);
    if (rows == 0) return;
    heads_backward(params, dout, grad, g[0], ws, rows);
    torso_backward(params, g[0], g[1], grad, ws, pool, rows);
  }
}

// Parameter gradients of the heads, and the feature gradient summed over heads into dfeat.
void Net::heads_backward(const float* params, const float* dout, float* grad, float* dfeat,
                         Workspace& ws, int64_t batch) const {
  ConstMatMap F(ws.feat, batch, feature_size_);
  Eigen::Map<RowMat> DF(dfeat, batch, feature_size_);
  DF.setZero();
  for (const OutputInfo& o : outputs_) {
    ConstStridedMap DY(dout + o.begin, batch, o.size, Eigen::OuterStride<>(output_size_));
    if (o.log_std) {
      layers::add_column_sums(grad + head_logstd_offset_[o.head], dout + o.begin, batch, o.size,
                              output_size_);
      continue;
    }
    const float* w = params + head_weight_offset_[o.head];
    Eigen::Map<RowMat>(grad + head_weight_offset_[o.head], feature_size_, o.size).noalias() +=
        F.transpose() * DY;
    layers::add_column_sums(grad + head_bias_offset_[o.head], dout + o.begin, batch, o.size,
                            output_size_);
    DF.noalias() += DY * ConstMatMap(w, feature_size_, o.size).transpose();
  }
}

// Backpropagation through time of the LSTM core; returns dx (the torso output's gradient), or
// null when there is no torso to continue into.
const float* Net::core_backward(const float* params, float* dh, float* grad, float* dx,
                                Workspace& ws) const {
  const int64_t rows = ws.batch, h = spec_.lstm_hidden, seqs = rows / ws.steps;
  const lstm::LstmDims d{ws.steps, seqs, core_in_, h};
  const lstm::LstmTape tape{ws.get(core_slot(kCoreGates), rows * 4 * h),
                            ws.get(core_slot(kCoreHPrev), rows * h),
                            ws.get(core_slot(kCoreCPrev), rows * h),
                            ws.get(core_slot(kCoreC), rows * h),
                            ws.get(core_slot(kCoreTanhC), rows * h)};
  const lstm::AmxScratch amx = core_amx(d, ws, false);
  float* dgates =
      ws.get(core_slot(kCoreDGates), lstm::backward_dgates_floats(d, amx.a != nullptr));
  float* dstate = ws.get(core_slot(kCoreDState), seqs * 2 * h);
  const int64_t panel_floats = amx.a != nullptr ? 0 : lstm::backward_panel_floats(d);
  float* panels = panel_floats > 0 ? ws.get(core_slot(kDxPanels), panel_floats) : nullptr;
  lstm::backward(d, ws.act[layers_.size()], params + core_wx_, params + core_wh_, ws.resets, tape,
                 dh, dgates, dstate, panels, dx, grad + core_wx_, grad + core_wh_,
                 grad + core_b_, amx);
  return dx;
}

// The torso, last layer first: dy holds the gradient of the torso's output [B, out], `other` is
// scratch of the same size; they swap roles layer by layer. With a pool each layer is split into
// parts that run at once: part p computes the data gradient (or the activation's backward) of
// its batch rows, and a contiguous slice of the layer's weight and bias gradients over the whole
// batch. Every float is then summed in the order of the unsplit call (one part), so the result is
// the same bit for bit whatever the pool (tested), and no part needs a gradient buffer.
void Net::torso_backward(const float* params, float* dy, float* other, float* grad, Workspace& ws,
                         ThreadPool* pool, int64_t batch) const {
  const int64_t parts = torso_parts(pool, batch);
  float* scratch[kMaxParts];
  // Part 0 may compute a GEMM path's whole weight gradient: scratch for the whole batch.
  part_scratch(ws, parts, part_scratch_floats(batch, true),
               part_scratch_floats((batch + parts - 1) / parts, true), scratch);
  float* g[2] = {dy, other};
  int cur = 0;  // g[cur] holds the gradient of the current layer's output
  // A Residual's add passes its gradient on to the body unchanged (same memory, as a Flatten),
  // and keeps a copy here until the backward reaches the block's input, where it is added.
  float* skip_grad = nullptr;
  for (size_t k = layers_.size(); k-- > 0;) {
    const Layer& l = layers_[k];
    if (k + 1 < layers_.size() && layers_[k + 1].block_start) {
      const int64_t n = batch * shape_numel(l.out);
      for (int64_t i = 0; i < n; ++i) g[cur][i] += skip_grad[i];
    }
    if (l.kind == LayerKind::Flatten) continue;  // same memory, same gradient
    if (l.kind == LayerKind::Concat || l.kind == LayerKind::Slice) {
      if (l.kind == LayerKind::Slice && l.branch == 0 && k == 0) break;  // the net's input
      concat_backward(l, g[cur], g[1 - cur], ws, batch);
      cur = 1 - cur;
      continue;
    }
    if (l.kind == LayerKind::Residual) {
      const int64_t n = batch * shape_numel(l.out);
      skip_grad = ws.get(core_slot(kSkipGrad), static_cast<size_t>(n));
      std::memcpy(skip_grad, g[cur], sizeof(float) * n);
      continue;
    }
    const bool need_dx = k > 0;
    // A ReLU right below a conv or linear layer (not the net's first layer) has its backward
    // in the same part, on the rows that part's data gradient just wrote: in place, while they
    // are in cache, and without a pass (and a wait for the pool) of its own. Its output is this
    // layer's input x. The same floats as the ReLU's own backward.
    // A Flatten between them shares the memory and the gradient.
    // Not across a Residual's input: its gradient takes the skip's before the ReLU's backward.
    size_t below = k - (k > 0 ? 1 : 0);
    while (below > 0 && layers_[below].kind == LayerKind::Flatten) --below;
    bool crosses_block = false;
    for (size_t j = below + 1; j <= k && below < k; ++j) crosses_block |= layers_[j].block_start;
    const bool relu_below = below > 0 && below < k && layers_[below].kind == LayerKind::ReLU &&
                            !crosses_block &&
                            (l.kind == LayerKind::Linear || l.kind == LayerKind::Conv2d);
    const int64_t out_n = shape_numel(l.out), in_n = shape_numel(l.in);
    const float* d = g[cur];
    float* dx = need_dx ? g[1 - cur] : nullptr;
    const float* x = ws.act[k];
    const float* y = ws.act[k + 1];
    // Split in many parts, a Linear layer first packs w's transposed panels and dy's panels
    // once, a slice per part, for every part to read: each part would otherwise copy the whole
    // weight (and all of dy) for its own rows.
    const float* dx_panels = nullptr;
    const float* dy_panels = nullptr;
    if (parts >= kSharedPanelParts && l.kind == LayerKind::Linear) {
      const int64_t in = l.in[0], out = l.out[0];
      const int64_t wt_floats = dx ? layers::linear_dx_panel_floats(in, out) : 0;
      const int64_t dy_floats = layers::linear_dy_panel_floats(batch, out);
      float* wt = wt_floats > 0 ? ws.get(core_slot(kDxPanels), wt_floats) : nullptr;
      float* dyp = dy_floats > 0 ? ws.get(core_slot(kDyPanels), dy_floats) : nullptr;
      if (wt != nullptr || dyp != nullptr) {
        auto pack = [&](int64_t p) {
          if (wt) layers::pack_linear_dx_panels(wt, params + l.w, in, out, p, parts);
          if (dyp) layers::pack_linear_dy_panels(dyp, d, batch, out, p, parts);
        };
        run_parts(pool, parts, pack);
      }
      dx_panels = wt;
      dy_panels = dyp;
    }
    // LayerNorm: each row's mean and 1 / std, for every part's weight-gradient slice.
    float* norm_stats = nullptr;
    if (l.kind == LayerKind::LayerNorm) {
      const int64_t d = l.in.back(), per_sample = in_n / d;
      norm_stats = ws.get(core_slot(kNormStats), static_cast<size_t>(2 * batch * per_sample));
      auto stats = [&](int64_t p) {
        int64_t r0, r1;
        layers::split_range(batch, parts, p, &r0, &r1);
        layers::layernorm_stats(norm_stats + 2 * r0 * per_sample, x + r0 * in_n,
                                (r1 - r0) * per_sample, d);
      };
      run_parts(pool, parts, stats);
    }
    auto part = [&](int64_t p) {
      int64_t r0, r1;
      layers::split_range(batch, parts, p, &r0, &r1);
      const int64_t n = r1 - r0;
      float* dx_rows = dx ? dx + r0 * in_n : nullptr;
      switch (l.kind) {
        case LayerKind::Linear:
          layers::linear_weight_grad(grad + l.w, grad + l.b, d, x, batch, l.in[0], l.out[0], p,
                                     parts, dy_panels);
          if (dx) {
            layers::linear_data_grad(dx_rows, d + r0 * out_n, params + l.w, n, l.in[0], l.out[0],
                                     dx_panels);
          }
          break;
        case LayerKind::Conv2d:
          layers::conv2d_weight_grad(grad + l.w, grad + l.b, d, x, batch, l.conv, p, parts,
                                     scratch[p]);
          if (dx) {
            layers::conv2d_data_grad(dx_rows, d + r0 * out_n, params + l.w, n, l.conv,
                                     scratch[p]);
          }
          break;
        case LayerKind::ReLU:
          if (dx) layers::relu_backward(dx_rows, d + r0 * out_n, y + r0 * out_n, n * out_n);
          break;
        case LayerKind::Tanh:
          if (dx) layers::tanh_backward(dx_rows, d + r0 * out_n, y + r0 * out_n, n * out_n);
          break;
        case LayerKind::External:
          // One part only (torso_parts). A Python layer has no native parameters: at the
          // bottom of the net nothing needs it.
          if (dx) {
            l.external->backward(x + r0 * in_n, y + r0 * out_n, d + r0 * out_n, dx_rows, l.in,
                                 l.out, n);
          }
          break;
        case LayerKind::MaxPool2d:
          if (dx) layers::maxpool2d_backward(dx_rows, d + r0 * out_n, x + r0 * in_n, n, l.conv);
          break;
        case LayerKind::LayerNorm: {
          const int64_t dim = l.in.back(), per_sample = in_n / dim;
          layers::layernorm_weight_grad(grad + l.w, grad + l.b, d, x, norm_stats,
                                        batch * per_sample, dim, p, parts);
          if (dx) {
            layers::layernorm_data_grad(dx_rows, d + r0 * out_n, x + r0 * in_n, params + l.w,
                                        norm_stats + 2 * r0 * per_sample, n * per_sample, dim);
          }
          break;
        }
        case LayerKind::Embedding:
          layers::embedding_weight_grad(grad + l.w, d, x, batch, l.in[0], l.num_embeddings,
                                        out_n / in_n, p, parts);
          if (dx) std::memset(dx_rows, 0, sizeof(float) * n * in_n);  // indices: no gradient
          break;
        case LayerKind::Flatten:
        case LayerKind::Residual:
        case LayerKind::Concat:
        case LayerKind::Slice:
          break;
      }
      if (relu_below) layers::relu_backward(dx_rows, dx_rows, x + r0 * in_n, n * in_n);
    };
    run_parts(pool, parts, part);
    if (!need_dx) break;
    cur = 1 - cur;
    if (relu_below) k = below;  // its backward is done (and the Flattens' nothing)
  }
}

// The backward of a Concat's join or slice, on the calling thread (copies): `dy` holds the
// gradient of the layer's output; `dnext` gets the gradient of the output of the layer run
// before it. The join keeps dy whole and passes on the last branch's columns; the slice of
// branch b writes its gradient into its columns of the block input's gradient, then passes on
// branch b - 1's columns of the join's dy, or, at branch 0, the block input's whole gradient
// (every column written: the branches' shapes take all the input).
void Net::concat_backward(const Layer& l, float* dy, float* dnext, Workspace& ws,
                          int64_t rows) const {
  const Layer& join = l.kind == LayerKind::Concat ? l : layers_[l.join];
  const int64_t total = join.out[0];
  float* djoin = ws.get(core_slot(kConcatGrad), static_cast<size_t>(rows * total));
  size_t next = join.branch_act.size() - 1;  // the branch whose output gradient comes next
  if (l.kind == LayerKind::Concat) {
    std::memcpy(djoin, dy, sizeof(float) * rows * total);
  } else {
    const int64_t in = l.in[0];
    float* dinput = ws.get(core_slot(kConcatDx), static_cast<size_t>(rows * in));
    layers::put_columns(dinput, dy, rows, shape_numel(l.out), in, l.off);
    if (l.branch == 0) {
      std::memcpy(dnext, dinput, sizeof(float) * rows * in);
      return;
    }
    next = l.branch - 1;
  }
  layers::copy_columns(dnext, djoin, rows, join.branch_size[next], total, join.branch_off[next]);
}

WorkspaceStats Net::workspace_stats() const { return pool_->stats(); }

}  // namespace rlpar
