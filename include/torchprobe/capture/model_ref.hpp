#pragma once
// Whatever the user passes to start(model): a torch::nn module holder (`Net`, `torch::nn::Linear`),
// a std::shared_ptr to a module, a torch::jit::Module, or a list of them (msprobe's list of models).
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/csrc/jit/api/module.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "torchprobe/core/kinds.hpp"

namespace torchprobe {

struct ModelRef {
  std::vector<std::shared_ptr<torch::nn::Module>> nn;
  std::vector<torch::jit::Module> jit;
  bool empty() const { return nn.empty() && jit.empty(); }
  std::size_t size() const { return nn.size() + jit.size(); }
};

// The model a start() at `level` uses: the one given, else (L0 and mix, which dump a model's
// modules) the one of an earlier start(), as msprobe keeps it. Without either, L0 and mix throw
// std::invalid_argument with msprobe's message: they would dump no module entry at all.
inline const ModelRef& model_for_start(Level level, const ModelRef& given, const ModelRef& earlier) {
  if (!given.empty() || (level != Level::L0 && level != Level::Mix)) return given;
  if (!earlier.empty()) return earlier;
  throw std::invalid_argument("torchprobe: start(): missing the parameter 'model': level \"" +
                              std::string(level_name(level)) +
                              "\" dumps the modules of the model given to start(model); start() and start(rank_id) "
                              "without a model are for levels \"L1\", \"L2\" and \"debug\"");
}

namespace details {

template <class T, class = void>
struct is_module_holder : std::false_type {};
template <class T>
struct is_module_holder<T, std::void_t<typename T::ContainedType>>
    : std::is_base_of<torch::nn::Module, typename T::ContainedType> {};

template <class T>
struct is_shared_module : std::false_type {};
template <class T>
struct is_shared_module<std::shared_ptr<T>> : std::is_base_of<torch::nn::Module, T> {};

template <class T>
struct is_model_list : std::false_type {};
template <class T, class A>
struct is_model_list<std::vector<T, A>> : std::true_type {};

template <class M>
void add_model(ModelRef& ref, const M& m) {
  using T = std::decay_t<M>;
  if constexpr (std::is_same_v<T, torch::jit::Module>) {
    ref.jit.push_back(m);
  } else if constexpr (is_shared_module<T>::value) {
    ref.nn.push_back(m);
  } else if constexpr (is_module_holder<T>::value) {
    ref.nn.push_back(m.ptr());
  } else if constexpr (std::is_base_of_v<torch::nn::Module, T>) {
    ref.nn.push_back(const_cast<T&>(m).shared_from_this());
  } else if constexpr (is_model_list<T>::value) {
    for (const auto& item : m) add_model(ref, item);
  } else {
    static_assert(!std::is_same_v<T, T>,
                  "torchprobe: a model must be a torch::nn module (holder or shared_ptr), a torch::jit::Module, or a "
                  "std::vector of them");
  }
}

}  // namespace details

template <class M>
ModelRef to_model_ref(const M& model) {
  ModelRef ref;
  details::add_model(ref, model);
  return ref;
}
inline ModelRef to_model_ref(const ModelRef& ref) { return ref; }

}  // namespace torchprobe
