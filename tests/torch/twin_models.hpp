// The C++ side of the compare-twins corpus: each model of tests/data/msprobe_twins/make_twins.py
// with the same children under the same names, and a forward that runs the same ops in the same
// order (so that outputs and gradients are bit-identical with the weights copied from twin.pt).
#pragma once
#include <torch/torch.h>
#include <torch/version.h>

#include <torchprobe/module_guard.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace twins {

namespace nn = torch::nn;
using torch::Tensor;
using Inputs = std::vector<Tensor>;

// A fault planted in the C++ twin's forward (compare_twins_test.cpp's planted faults): "bf16_fc1"
// runs the transformer block's fc1 in bfloat16, "gelu_tanh" its activation with the tanh approximation, "missing_relu"
// leaves out the attention block's ReLU. Empty: the faithful twin.
inline std::string& planted_fault() {
  static std::string fault;
  return fault;
}

// The root: named children and a forward function (neither msprobe nor TorchProbe dumps the root).
struct TwinImpl : nn::Module {
  std::function<Tensor(TwinImpl&, const Inputs&)> fn;
  Tensor forward(const Inputs& xs) { return fn(*this, xs); }
  template <class Holder>
  Holder at(const std::string& name) {
    return Holder(std::dynamic_pointer_cast<typename Holder::ContainedType>(named_children()[name]));
  }
};

// The transformer twin's block, a container without a ModuleGuard: construct.json infers it.
struct BlockImpl : nn::Module {
  explicit BlockImpl(int64_t d)
      : ln1(register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({d})))),
        fc1(register_module("fc1", nn::Linear(d, 2 * d))),
        act(register_module("act", nn::GELU())),
        fc2(register_module("fc2", nn::Linear(2 * d, d))),
        ln2(register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({d})))) {}
  Tensor forward(const Tensor& x) {
    const Tensor h = ln1(x);
    // The planted "bf16_fc1" (fc1's parameters made bfloat16 by the test): fc1 in bfloat16.
    const Tensor y = planted_fault() == "bf16_fc1" ? fc1(h.to(torch::kBFloat16)).to(torch::kFloat) : fc1(h);
    const Tensor a = planted_fault() == "gelu_tanh"
                         ? nn::functional::gelu(y, nn::functional::GELUFuncOptions().approximate("tanh"))
                         : act(y);
    return ln2(x + fc2(a));
  }
  nn::LayerNorm ln1;
  nn::Linear fc1;
  nn::GELU act;
  nn::Linear fc2;
  nn::LayerNorm ln2;
};
TORCH_MODULE(Block);

// A transformer encoder block with attention (head_dim 16); guarded, as the docs tell users.
struct AttnBlockImpl : nn::Module {
  explicit AttnBlockImpl(int64_t d)
      : ln1(register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({d})))),
        attn(register_module("attn", nn::MultiheadAttention(d, d / 16))),
        ln2(register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({d})))),
        ff1(register_module("ff1", nn::Linear(d, 2 * d))),
        act(register_module("act", nn::ReLU())),
        ff2(register_module("ff2", nn::Linear(2 * d, d))) {}
  Tensor forward(Tensor x) {
    torchprobe::ModuleGuard guard(this, x);
    const Tensor h = ln1(x);
    x = x + std::get<0>(attn(h, h, h));
    const Tensor h2 = ff1(ln2(x));
    return x + ff2(planted_fault() == "missing_relu" ? h2 : act(h2));
  }
  nn::LayerNorm ln1;
  nn::MultiheadAttention attn;
  nn::LayerNorm ln2;
  nn::Linear ff1;
  nn::ReLU act;
  nn::Linear ff2;
};
TORCH_MODULE(AttnBlock);

struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int64_t c_in, int64_t c_out, int64_t stride)
      : conv1(register_module("conv1",
                              nn::Conv2d(nn::Conv2dOptions(c_in, c_out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(c_out))),
        relu(register_module("relu", nn::ReLU())),
        conv2(
            register_module("conv2", nn::Conv2d(nn::Conv2dOptions(c_out, c_out, 3).stride(1).padding(1).bias(false)))),
        bn2(register_module("bn2", nn::BatchNorm2d(c_out))) {
    if (stride != 1 || c_in != c_out)
      downsample = register_module(
          "downsample", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(c_in, c_out, 1).stride(stride).bias(false)),
                                       nn::BatchNorm2d(c_out)));
  }
  Tensor forward(const Tensor& x) {
    torchprobe::ModuleGuard guard(this, x);
    const Tensor identity = downsample.is_empty() ? x : downsample->forward(x);
    Tensor out = relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    return relu(out + identity);
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::ReLU relu;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

struct Spec {
  std::function<void(TwinImpl&)> children;
  std::function<Tensor(TwinImpl&, const Inputs&)> fn;
  bool train = true;
};

inline const std::map<std::string, Spec>& specs() {
  using T = TwinImpl;
  static const std::map<std::string, Spec> kSpecs = {
    {"linear",
     {[](T& m) { m.register_module("fc", nn::Linear(16, 8)); },
      [](T& m, const Inputs& x) { return m.at<nn::Linear>("fc")(x[0]); }}},
    {"linear_3d",
     {[](T& m) { m.register_module("fc", nn::Linear(nn::LinearOptions(16, 8).bias(false))); },
      [](T& m, const Inputs& x) { return m.at<nn::Linear>("fc")(x[0]); }}},
    {"bilinear",
     {[](T& m) { m.register_module("bil", nn::Bilinear(8, 6, 4)); },
      [](T& m, const Inputs& x) { return m.at<nn::Bilinear>("bil")(x[0], x[1]); }}},
    {"conv1d",
     {[](T& m) { m.register_module("conv", nn::Conv1d(nn::Conv1dOptions(3, 4, 3).padding(1))); },
      [](T& m, const Inputs& x) { return m.at<nn::Conv1d>("conv")(x[0]); }}},
    {"conv2d",
     {[](T& m) { m.register_module("conv", nn::Conv2d(nn::Conv2dOptions(3, 4, 3).stride(2).padding(1))); },
      [](T& m, const Inputs& x) { return m.at<nn::Conv2d>("conv")(x[0]); }}},
    {"conv3d",
     {[](T& m) { m.register_module("conv", nn::Conv3d(nn::Conv3dOptions(2, 3, 3).padding(1))); },
      [](T& m, const Inputs& x) { return m.at<nn::Conv3d>("conv")(x[0]); }}},
    {"conv_transpose2d",
     {[](T& m) { m.register_module("deconv", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(4, 3, 3).stride(2))); },
      [](T& m, const Inputs& x) { return m.at<nn::ConvTranspose2d>("deconv")(x[0]); }}},
    {"batch_norm",
     {[](T& m) { m.register_module("bn", nn::BatchNorm2d(4)); },
      [](T& m, const Inputs& x) { return m.at<nn::BatchNorm2d>("bn")(x[0]); }}},
    {"instance_norm",
     {[](T& m) { m.register_module("norm", nn::InstanceNorm1d(nn::InstanceNorm1dOptions(4).affine(true))); },
      [](T& m, const Inputs& x) { return m.at<nn::InstanceNorm1d>("norm")(x[0]); }}},
    {"layer_norm",
     {[](T& m) { m.register_module("ln", nn::LayerNorm(nn::LayerNormOptions({16}))); },
      [](T& m, const Inputs& x) { return m.at<nn::LayerNorm>("ln")(x[0]); }}},
    {"group_norm",
     {[](T& m) { m.register_module("gn", nn::GroupNorm(2, 4)); },
      [](T& m, const Inputs& x) { return m.at<nn::GroupNorm>("gn")(x[0]); }}},
    {"embedding",
     {[](T& m) { m.register_module("emb", nn::Embedding(20, 8)); },
      [](T& m, const Inputs& x) { return m.at<nn::Embedding>("emb")(x[0]); }}},
    {"embedding_bag",
     {[](T& m) { m.register_module("bag", nn::EmbeddingBag(nn::EmbeddingBagOptions(20, 8).mode(torch::kMean))); },
      [](T& m, const Inputs& x) { return m.at<nn::EmbeddingBag>("bag")(x[0]); }}},
    {"rnn",
     {[](T& m) { m.register_module("rnn", nn::RNN(nn::RNNOptions(8, 16).batch_first(true))); },
      [](T& m, const Inputs& x) { return std::get<0>(m.at<nn::RNN>("rnn")(x[0])); }}},
    {"lstm",
     {[](T& m) { m.register_module("lstm", nn::LSTM(nn::LSTMOptions(8, 16).batch_first(true))); },
      [](T& m, const Inputs& x) { return std::get<0>(m.at<nn::LSTM>("lstm")(x[0])); }}},
    {"gru",
     {[](T& m) { m.register_module("gru", nn::GRU(nn::GRUOptions(8, 16).batch_first(true))); },
      [](T& m, const Inputs& x) { return std::get<0>(m.at<nn::GRU>("gru")(x[0])); }}},
    {"prelu",
     {[](T& m) { m.register_module("act", nn::PReLU(nn::PReLUOptions().num_parameters(4))); },
      [](T& m, const Inputs& x) { return m.at<nn::PReLU>("act")(x[0]); }}},
    {"multihead_attention",
     {[](T& m) { m.register_module("attn", nn::MultiheadAttention(32, 2)); },
      [](T& m, const Inputs& x) { return std::get<0>(m.at<nn::MultiheadAttention>("attn")(x[0], x[0], x[0])); }}},
    {"dropout_eval",
     {[](T& m) {
        m.register_module("fc", nn::Linear(16, 16));
        m.register_module("drop", nn::Dropout(0.5));
      },
      [](T& m, const Inputs& x) { return m.at<nn::Dropout>("drop")(m.at<nn::Linear>("fc")(x[0])); }, false}},
    {"activations",
     {[](T& m) {
        m.register_module("fc", nn::Linear(16, 16));
        m.register_module("relu", nn::ReLU());
        m.register_module("gelu", nn::GELU());
        m.register_module("silu", nn::SiLU());
        m.register_module("tanh", nn::Tanh());
        m.register_module("sigmoid", nn::Sigmoid());
        m.register_module("leaky", nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.1)));
        m.register_module("elu", nn::ELU());
        m.register_module("softplus", nn::Softplus());
        m.register_module("hardtanh", nn::Hardtanh());
        m.register_module("softmax", nn::Softmax(-1));
        m.register_module("logsoftmax", nn::LogSoftmax(-1));
      },
      [](T& m, const Inputs& x) {
        // One call a statement: C++ leaves the order of a sum's operands open, and the
        // order of the calls is the order autograd adds h's gradients in.
        const Tensor h = m.at<nn::Linear>("fc")(x[0]);
        Tensor out = m.at<nn::ReLU>("relu")(h);
        out = out + m.at<nn::GELU>("gelu")(h);
        out = out + m.at<nn::SiLU>("silu")(h);
        out = out + m.at<nn::Tanh>("tanh")(h);
        out = out + m.at<nn::Sigmoid>("sigmoid")(h);
        out = out + m.at<nn::LeakyReLU>("leaky")(h);
        out = out + m.at<nn::ELU>("elu")(h);
        out = out + m.at<nn::Softplus>("softplus")(h);
        out = out + m.at<nn::Hardtanh>("hardtanh")(h);
        out = out + m.at<nn::Softmax>("softmax")(h);
        return out + m.at<nn::LogSoftmax>("logsoftmax")(h);
      }}},
    {"pooling",
     {[](T& m) {
        m.register_module("conv", nn::Conv2d(nn::Conv2dOptions(2, 4, 3).padding(1)));
        m.register_module("maxpool", nn::MaxPool2d(2));
        m.register_module("avgpool", nn::AvgPool2d(2));
        m.register_module("adaptmax", nn::AdaptiveMaxPool2d(2));
        m.register_module("adapt", nn::AdaptiveAvgPool2d(1));
      },
      [](T& m, const Inputs& x) {
        const Tensor h = m.at<nn::MaxPool2d>("maxpool")(m.at<nn::Conv2d>("conv")(x[0]));
        Tensor out = m.at<nn::AvgPool2d>("avgpool")(h);
        out = out + m.at<nn::AdaptiveMaxPool2d>("adaptmax")(h);
        return out + m.at<nn::AdaptiveAvgPool2d>("adapt")(h);
      }}},
    {"losses",
     {[](T& m) {
        m.register_module("fc", nn::Linear(16, 5));
        m.register_module("mse", nn::MSELoss());
        m.register_module("ce", nn::CrossEntropyLoss());
        m.register_module("l1", nn::L1Loss());
        m.register_module("smooth", nn::SmoothL1Loss());
        m.register_module("bce", nn::BCEWithLogitsLoss());
        m.register_module("nll", nn::NLLLoss());
        m.register_module("logsm", nn::LogSoftmax(1));
      },
      [](T& m, const Inputs& x) {
        const Tensor h = m.at<nn::Linear>("fc")(x[0]);
        Tensor out = m.at<nn::MSELoss>("mse")(h, x[1]);
        out = out + m.at<nn::CrossEntropyLoss>("ce")(h, x[2]);
        out = out + m.at<nn::L1Loss>("l1")(h, x[1]);
        out = out + m.at<nn::SmoothL1Loss>("smooth")(h, x[1]);
        out = out + m.at<nn::BCEWithLogitsLoss>("bce")(h, x[3]);
        return out + m.at<nn::NLLLoss>("nll")(m.at<nn::LogSoftmax>("logsm")(h), x[2]);
      }}},
    {"transformer",
     {[](T& m) {
        m.register_module("emb", nn::Embedding(50, 32));
        m.register_module("block", Block(32));
        m.register_module("head", nn::Linear(32, 10));
      },
      [](T& m, const Inputs& x) {
        return m.at<nn::Linear>("head")(m.at<Block>("block")(m.at<nn::Embedding>("emb")(x[0])));
      }}},
    {"transformer_attention",
     {[](T& m) {
        m.register_module("emb", nn::Embedding(50, 32));
        m.register_module("block", AttnBlock(32));
        m.register_module("head", nn::Linear(32, 10));
      },
      [](T& m, const Inputs& x) {
        return m.at<nn::Linear>("head")(m.at<AttnBlock>("block")(m.at<nn::Embedding>("emb")(x[0])));
      }}},
    {"residual_cnn",
     {[](T& m) {
        m.register_module("conv", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).stride(1).padding(1).bias(false)));
        m.register_module("bn", nn::BatchNorm2d(8));
        m.register_module("relu", nn::ReLU());
        m.register_module("layer1", nn::Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2)));
        m.register_module("pool", nn::AdaptiveAvgPool2d(1));
        m.register_module("fc", nn::Linear(16, 10));
      },
      [](T& m, const Inputs& x) {
        Tensor h = m.at<nn::ReLU>("relu")(m.at<nn::BatchNorm2d>("bn")(m.at<nn::Conv2d>("conv")(x[0])));
        h = m.at<nn::Sequential>("layer1")->forward(h);
        return m.at<nn::Linear>("fc")(torch::flatten(m.at<nn::AdaptiveAvgPool2d>("pool")(h), 1));
      }}},
#if TORCH_VERSION_MAJOR >= 2  // the torch2.6 set only
    {"scaled_dot_product_attention",
     {[](T& m) { m.register_module("proj", nn::Linear(16, 48)); },
      [](T& m, const Inputs& x) {
        const auto qkv = m.at<nn::Linear>("proj")(x[0]).chunk(3, -1);
        return torch::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2]);
      }}},
#endif
  };
  return kSpecs;
}

inline std::vector<std::string> names() {
  std::vector<std::string> n;
  for (const auto& kv : specs()) n.push_back(kv.first);
  return n;
}

inline std::shared_ptr<TwinImpl> build(const std::string& name) {
  const Spec& s = specs().at(name);
  auto m = std::make_shared<TwinImpl>();
  s.children(*m);
  m->fn = s.fn;
  m->train(s.train);
  return m;
}

// As make_twins.py: the leading float inputs get a gradient (two for bilinear); targets and
// indices do not.
inline bool input_needs_grad(const std::string& name, int i) { return i < (name == "bilinear" ? 2 : 1); }

}  // namespace twins
