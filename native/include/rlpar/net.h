// rlpar/net.h — one network object shared by every thread.
//
// A `Net` holds only the architecture: the layer list, the shapes, and where each parameter lives
// in one flat float32 buffer. It holds no parameters and no activations, so every method is const
// and any number of threads may call it at once:
//
//     rlpar::NetSpec spec;
//     spec.input_shape = {4};
//     spec.layers = {LayerSpec::linear(64), LayerSpec::tanh(), LayerSpec::linear(64), LayerSpec::tanh()};
//     spec.heads = {{HeadKind::Categorical, 2}, {HeadKind::Value, 1}};
//     rlpar::Net net(spec);
//     std::vector<float> params(net.num_params());           // filled by the caller (Python: init_params)
//     net.forward(params.data(), obs, batch, out);            // out: [B, net.output_size()]
//
//     auto tape = net.forward_train(params.data(), obs, batch, out);   // keeps activations
//     net.backward(params.data(), *tape, dout, grad, /*accumulate=*/false);
//
// Recurrent nets (spec.lstm_hidden > 0: an LSTM core between the torso and the heads, see
// rlpar/lstm.h) run sequences: `forward_seq` / `forward_train_seq` take T steps of N sequences
// (time-major rows [T N, ...]), the state at the start [N, state_size()] and the episode starts
// [T, N]; an actor runs T = 1 and carries the state from call to call. Feed-forward nets take
// the same calls (the state is ignored) and pay nothing for them.
//
// Intra-op parallelism: forward_seq / forward_train_seq / backward take an optional ThreadPool
// (rlpar/thread_pool.h). With one, the torso (every layer before the LSTM core and the heads) is
// split into parts that run at once: the forward by batch rows; the backward layer by layer, each
// part computing its rows' data gradient and a slice of the layer's weight and bias gradients
// over the whole batch. With the AVX-512 kernels every float is summed in the order of the call
// without a pool, so results are the same bit for bit whatever the pool (the portable GEMM path
// may differ in the last bits, but a given pool size repeats itself). The core and the heads,
// which are small next to a conv torso, run on the calling thread. Without a pool (or for a net
// with a Python layer) the call runs on the calling thread alone.
//
// Activations live in a `Workspace` taken from the net's pool for the duration of a call (or of a
// `Tape`) and given back afterwards, so steady-state calls allocate nothing and memory is bounded by
// (calls in flight) x (largest batch seen).
//
// Data layout: a sample is a vector {D} or an image {H, W, C} (channels last); batches are
// row-major [B, *shape]. Linear weights are [in, out], conv weights [KH, KW, C, OC], so both are
// one GEMM on row-major data.
//
// Errors: invalid specs and arguments throw std::invalid_argument whose message names what was
// expected and what came.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rlpar/lstm.h"

namespace rlpar {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// A layer implemented outside the core (the Python bindings implement it for rlpar.nn.PyLayer).
// Both calls are stateless: backward receives the forward's input and output again.
class ExternalLayer {
 public:
  virtual ~ExternalLayer() = default;
  // Per-sample output shape for a per-sample input shape (asked once, when the net is built).
  virtual Shape output_shape(const Shape& in_shape) = 0;
  // x: [B, *in_shape] -> y: [B, *out_shape]
  virtual void forward(const float* x, const Shape& in_shape, float* y, const Shape& out_shape,
                       int64_t batch) = 0;
  // dy: [B, *out_shape] -> dx: [B, *in_shape]
  virtual void backward(const float* x, const float* y, const float* dy, float* dx,
                        const Shape& in_shape, const Shape& out_shape, int64_t batch) = 0;
};

enum class LayerKind {
  Linear, Conv2d, ReLU, Tanh, Flatten, External, MaxPool2d, LayerNorm, Residual,
  Concat,     // the spec's block; as run, its slices, the branches' layers, then the join
  Embedding,
  Slice,      // as run only: one Concat branch's columns of the block's input
};
enum class HeadKind { Categorical, Value, Gaussian };

// MaxPool2d: k x k windows of an image, padded with -inf (torch.nn.MaxPool2d; padding <= k / 2).
// LayerNorm: normalizes the last dimension (the features of (D,), the channels of each pixel of
// (H, W, C)) with a learned gain (init 1) and bias (init 0), eps 1e-5; out_features > 0 states
// the size expected there (0: any).
// Residual: y = x + body(x); the body is a sequence of layers whose output shape is its input's.
// One level: a body holds no Residual.
// Concat: several encoders side by side on a flat input (F,). Branch k takes the columns
// [off_k, off_k + prod(branch_shapes[k])) (off_k: the sizes of the branches before it), viewed as
// branch_shapes[k] ({D} or {H, W, C}), runs branches[k] (empty: the slice as it is), and the
// branches' outputs, flattened, are concatenated: (sum of their sizes,). The shapes' sizes must
// add up to F. A branch holds no Concat; it may hold Residual blocks.
// Embedding: (K,) float indices, each an integer in [0, num_embeddings) -> (K * out_features,),
// column k's vector of the table weight [num_embeddings, out_features] at [k dim, (k + 1) dim).
// A value that is not such an integer throws (std::out_of_range for an integer out of range,
// std::invalid_argument otherwise), naming it, its row and its column.
struct LayerSpec {
  LayerKind kind = LayerKind::ReLU;
  int64_t out_features = 0;  // Linear; LayerNorm: the normalized size, 0 = any; Embedding: dim
  int64_t num_embeddings = 0;  // Embedding
  int64_t out_channels = 0;  // Conv2d
  int64_t kernel = 0;        // Conv2d, MaxPool2d
  int64_t stride = 1;
  int64_t padding = 0;
  std::shared_ptr<ExternalLayer> external;  // External
  std::vector<LayerSpec> body;              // Residual
  std::vector<Shape> branch_shapes;         // Concat: each branch's input shape
  std::vector<std::vector<LayerSpec>> branches;  // Concat: each branch's layers

  static LayerSpec linear(int64_t out_features);
  static LayerSpec conv2d(int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding);
  static LayerSpec relu();
  static LayerSpec tanh();
  static LayerSpec flatten();
  static LayerSpec external_layer(std::shared_ptr<ExternalLayer> layer);
  static LayerSpec maxpool2d(int64_t kernel, int64_t stride, int64_t padding);
  static LayerSpec layernorm(int64_t features = 0);
  static LayerSpec residual(std::vector<LayerSpec> body);
  static LayerSpec concat(std::vector<Shape> branch_shapes,
                          std::vector<std::vector<LayerSpec>> branches);
  static LayerSpec embedding(int64_t num_embeddings, int64_t dim);
};

// Categorical: `size` logits. Value: one scalar (size must be 1). Gaussian: `size` means followed
// by `size` log-stds; the log-std is one state-independent parameter per action dimension,
// broadcast over the batch.
struct HeadSpec {
  HeadKind kind = HeadKind::Value;
  int64_t size = 1;

  static HeadSpec categorical(int64_t n);
  static HeadSpec value();
  static HeadSpec gaussian(int64_t n);
};

struct NetSpec {
  Shape input_shape;          // per sample: {D} or {H, W, C}
  bool input_uint8 = false;   // uint8 inputs are converted to float and scaled natively
  float input_scale = 1.0f;   // applied to every input element
  std::vector<LayerSpec> layers;
  std::vector<HeadSpec> heads;
  int64_t lstm_hidden = 0;    // > 0: an LSTM core of this width after the layers, before the heads
  // The LSTM's products in bf16x3 on AMX tiles (rlpar/amx.h: ~1e-5 relative error per
  // product) instead of float32, in every call. The weights are packed into tiles per call,
  // unless the call brings them packed (SeqArgs::packed_core, from Net::core_weights). Needs
  // amx::available().
  bool lstm_bf16x3 = false;
};

// The LSTM core's weights of one params vector, packed for spec.lstm_bf16x3 (Net::core_weights):
// an actor packs them once per snapshot instead of on every step.
struct PackedCore {
  std::vector<uint16_t> w;  // [Wx; Wh] (lstm::pack_weights)
};

// One call's sequence layout. Rows of the input and output are time-major: row t * seqs + n.
struct SeqArgs {
  int64_t steps = 1;                // T
  int64_t seqs = 1;                 // N
  const float* state0 = nullptr;    // [N, state_size] state before step 0; null: zeros
  const uint8_t* resets = nullptr;  // [T, N] 1 where an episode starts (state zeroed first); null: none
  float* state_out = nullptr;       // [N, state_size] state after step T - 1; nullable, may alias state0
  // spec.lstm_bf16x3: the core's weights already packed from these params (nullable).
  const PackedCore* packed_core = nullptr;
};

struct ParamInfo {
  std::string name;   // e.g. "layers.0.weight", "heads.1.bias", "heads.2.log_std"
  std::string role;   // "weight" (Embedding: the table), "bias", "gain" (LayerNorm) or "log_std"
  int64_t offset = 0;
  Shape shape;        // Linear weight [in, out]; conv weight [KH, KW, C, OC]
  // Layer index (of spec.layers: a Residual's body layer j is named "layers.<index>.<j>.", a
  // Concat's branch k layer j "layers.<index>.<k>.<j>.", and a Residual's body layer m there
  // "layers.<index>.<k>.<j>.<m>."), or head index for head parameters.
  int64_t index = 0;
  bool in_head = false;
};

struct OutputInfo {
  std::string name;  // "logits", "value", "mean", "log_std"
  int64_t head = 0;
  int64_t begin = 0;  // first column in the [B, output_size] output
  int64_t size = 0;
  bool log_std = false;  // broadcast of a state-independent parameter, not a linear output
};

struct WorkspaceStats {
  int64_t workspaces = 0;  // created so far (bounded by calls in flight)
  int64_t idle = 0;        // currently in the pool
  int64_t bytes = 0;       // held by all workspaces
  int64_t allocations = 0; // buffer (re)allocations so far: constant in steady state
};

class Workspace;
class WorkspacePool;
class ThreadPool;

// Activations of one forward_train call, kept for backward. Neither copied nor moved (it is held
// by pointer); gives its workspace back to the pool when destroyed. It shares ownership of the
// pool, so it may outlive the Net that made it.
class Tape {
 public:
  Tape(std::shared_ptr<WorkspacePool> pool, std::unique_ptr<Workspace> ws, int64_t batch);
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;
  int64_t batch() const { return batch_; }
  int64_t steps() const { return steps_; }

 private:
  friend class Net;
  std::shared_ptr<WorkspacePool> pool_;
  std::unique_ptr<Workspace> ws_;
  int64_t batch_;
  int64_t steps_ = 1;
};

class Net {
 public:
  explicit Net(NetSpec spec);
  ~Net();
  Net(const Net&) = delete;
  Net& operator=(const Net&) = delete;

  const NetSpec& spec() const { return spec_; }
  int64_t num_params() const { return num_params_; }
  int64_t input_size() const { return shape_numel(spec_.input_shape); }
  int64_t output_size() const { return output_size_; }
  const std::vector<ParamInfo>& param_info() const { return params_; }
  const std::vector<OutputInfo>& outputs() const { return outputs_; }
  // Input shape of each layer as run (a Residual's body layers, then its add; a Concat's slice
  // of a branch, that branch's layers, ..., then its join), then the features. A slice's input
  // is the block's input; the join's, the concatenated output.
  const std::vector<Shape>& activation_shapes() const { return shapes_; }
  double flops_per_sample() const { return flops_per_sample_; }
  bool has_external() const { return has_external_; }
  // Floats in one sequence's recurrent state ([h, c] of the LSTM: 2 * lstm_hidden), 0 if none.
  int64_t state_size() const { return 2 * spec_.lstm_hidden; }
  bool recurrent() const { return spec_.lstm_hidden > 0; }

  // input: [B, input_size] float32 or uint8 (per spec.input_uint8); out: [B, output_size].
  void forward(const float* params, const void* input, int64_t batch, float* out) const;

  // Like forward, and keeps the activations for backward.
  std::unique_ptr<Tape> forward_train(const float* params, const void* input, int64_t batch,
                                      float* out) const;

  // input: [T N, input_size]; out: [T N, output_size]. A recurrent net runs its core through
  // time; backward of the tape is backpropagation through the T steps (none into state0).
  // forward / forward_train above are the one-step case from a zero state.
  // `pool` (nullable): run the torso's batch rows on the pool's threads (see above).
  void forward_seq(const float* params, const void* input, const SeqArgs& seq, float* out,
                   ThreadPool* pool = nullptr) const;
  std::unique_ptr<Tape> forward_train_seq(const float* params, const void* input,
                                          const SeqArgs& seq, float* out,
                                          ThreadPool* pool = nullptr) const;

  // The packed core weights calls on `params` bring along (SeqArgs::packed_core). The one place
  // that decides when to pack and what to keep; null unless spec.lstm_bf16x3. With an `owner`
  // (a snapshot store, held weakly) and its snapshot `version`: the first request packs, later
  // ones for that snapshot, from any thread, share the result (a few snapshots are kept, the
  // actors may be on different versions; an owner that is gone never matches again). Without
  // one: packed now when the caller makes `many_calls` on these params (an unroll's steps), else
  // null (a single call packs into its own workspace, no allocation).
  std::shared_ptr<const PackedCore> core_weights(const float* params,
                                                 const std::shared_ptr<const void>& owner,
                                                 uint64_t version, bool many_calls) const;

  // dout: [B, output_size] gradient of the loss w.r.t. the output; grad: [num_params].
  // `params` must be the buffer the tape was recorded with. A feed-forward net skips the last
  // rows of dout that are all zero (they add nothing to grad).
  void backward(const float* params, const Tape& tape, const float* dout, float* grad,
                bool accumulate, ThreadPool* pool = nullptr) const;

  // How many parts a call with `pool` splits `batch` torso rows into (1: no split).
  int64_t torso_parts(const ThreadPool* pool, int64_t batch) const;

  WorkspaceStats workspace_stats() const;

 private:
  struct Layer;
  // Construction steps, in order: check the input, build each layer, then the heads.
  void check_input() const;
  int64_t add_param(const std::string& name, const std::string& role, Shape shape, int64_t index,
                    bool in_head);
  void add_layer(const LayerSpec& ls, size_t index, const std::string& prefix,
                 const std::string& where, Shape& cur);
  void add_residual(const LayerSpec& ls, size_t index, const std::string& prefix,
                    const std::string& where, Shape& cur);
  void add_concat(const LayerSpec& ls, size_t index, const std::string& where, Shape& cur);
  void build_embedding(Layer& L, const LayerSpec& ls, size_t index, const std::string& prefix,
                       const std::string& where);
  void concat_backward(const Layer& l, float* dy, float* dnext, Workspace& ws,
                       int64_t rows) const;
  Layer build_layer(const LayerSpec& ls, size_t index, const std::string& prefix,
                    const std::string& where, const Shape& in);
  void build_linear(Layer& L, const LayerSpec& ls, size_t index, const std::string& prefix,
                    const std::string& where);
  void build_conv(Layer& L, const LayerSpec& ls, size_t index, const std::string& prefix,
                  const std::string& where);
  void build_pool(Layer& L, const LayerSpec& ls, const std::string& where);
  void build_layernorm(Layer& L, const LayerSpec& ls, size_t index, const std::string& prefix,
                       const std::string& where);
  void build_external(Layer& L, const LayerSpec& ls, const std::string& where);
  void build_core(const Shape& torso_out);
  void build_heads(const Shape& features);
  void run_forward(const float* params, const void* input, const SeqArgs& seq, float* out,
                   Workspace& ws, ThreadPool* pool) const;
  void run_torso(const float* params, const void* input, Workspace& ws, ThreadPool* pool) const;
  void torso_rows(const float* params, const void* input, Workspace& ws, int64_t r0, int64_t r1,
                  float* scratch) const;
  int64_t part_scratch_floats(int64_t rows, bool backward) const;
  void run_core(const float* params, const SeqArgs& seq, Workspace& ws) const;
  lstm::AmxScratch core_amx(const lstm::LstmDims& d, Workspace& ws, bool prepacked) const;
  void run_heads(const float* params, float* out, Workspace& ws) const;
  // The backward of the first `rows` rows of the tape's batch.
  void heads_backward(const float* params, const float* dout, float* grad, float* dfeat,
                      Workspace& ws, int64_t rows) const;
  const float* core_backward(const float* params, float* dh, float* grad, float* dx,
                             Workspace& ws) const;
  void torso_backward(const float* params, float* dy, float* other, float* grad, Workspace& ws,
                      ThreadPool* pool, int64_t rows) const;
  size_t core_slot(size_t k) const;
  void part_scratch(Workspace& ws, int64_t parts, int64_t first_floats, int64_t floats,
                    float** scratch) const;

  NetSpec spec_;
  // As run: a Residual is its body's layers, then an add; a Concat is, for each branch, a slice
  // then the branch's layers, then a join.
  std::vector<Layer> layers_;
  std::vector<Shape> shapes_;  // shapes_[i] = input of layer i; shapes_.back() = features
  std::vector<ParamInfo> params_;
  std::vector<OutputInfo> outputs_;
  std::vector<int64_t> head_weight_offset_, head_bias_offset_, head_logstd_offset_;
  int64_t num_params_ = 0;
  int64_t output_size_ = 0;
  int64_t feature_size_ = 0;
  int64_t core_in_ = 0;                       // LSTM input features (the torso's output)
  int64_t core_wx_ = -1, core_wh_ = -1, core_b_ = -1;  // LSTM parameter offsets
  int64_t max_activation_ = 0;  // largest per-sample activation
  double flops_per_sample_ = 0;
  bool has_external_ = false;
  std::shared_ptr<WorkspacePool> pool_;
  std::shared_ptr<const PackedCore> pack_core(const float* params) const;
  struct CoreCache;  // core_weights' snapshots (net.cc)
  std::shared_ptr<CoreCache> core_cache_;
};

// Raises std::invalid_argument naming `what` if any of the n values is NaN or infinite.
void check_finite(const float* x, int64_t n, const char* what);

}  // namespace rlpar
