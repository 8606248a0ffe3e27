#pragma once
// msprobe's register_custom_api / restore_custom_api for C++: a plain function becomes an API of its
// own, so that a dump shows it as one entry, {Prefix}.{name}.{n}.forward and .backward, with its
// tensor arguments and outputs, and the ATen calls it makes are hidden inside it.
//
//   static auto block = TORCHPROBE_API("MyNet", block, [](const at::Tensor& x, const at::Tensor& w) {
//     return at::relu(x.matmul(w));
//   });
//   at::Tensor y = block(x, w);                      // MyNet.block.0.forward while a debugger runs
//   torchprobe::restore_custom_api("MyNet", "block");  // from now on a plain call, ATen ops visible
//
// How: the function is registered with the dispatcher as the operator {prefix}::{name} (a
// TORCH_LIBRARY fragment made at run time, schema inferred from the C++ signature, a composite
// kernel so that autograd goes through the ATen ops inside), and the returned object calls it
// through the dispatcher. The probe captures operators of custom namespaces as APIs of their own
// (capture/op_registry.hpp): no other hook is needed, and with no debugger running the cost is one
// dispatcher call. Arguments and results must be types the dispatcher knows (Tensor, int64_t,
// double, bool, std::vector<Tensor>, c10::optional<...>, ...).
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Metaprogramming.h>
#include <torch/library.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <typeindex>
#include <utility>

#include "torchprobe/capture/op_registry.hpp"

namespace torchprobe {

namespace details {

// What one registered name holds: whether calls go through the dispatcher (captured) or straight to
// the function (restored), and the function itself (replaced when the name is registered again).
struct CustomApiState {
  std::atomic<bool> captured{true};
  std::type_index signature;
  std::mutex mutex;
  std::shared_ptr<void> function;  // std::function<Sig>, read under `mutex`
  explicit CustomApiState(std::type_index sig) : signature(sig) {}
};

struct CustomApiRegistry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<CustomApiState>> states;
  std::map<std::string, std::unique_ptr<torch::Library>> libraries;  // operators live as long as these

  static CustomApiRegistry& instance() {
    static auto* r = new CustomApiRegistry();  // never destroyed: registered operators outlive statics
    return *r;
  }
};

inline bool is_identifier(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

}  // namespace details

template <class Sig>
class CustomApi;

// A registered function: call it as the function itself.
template <class Ret, class... Args>
class CustomApi<Ret(Args...)> {
 public:
  CustomApi(std::shared_ptr<details::CustomApiState> state, c10::TypedOperatorHandle<Ret(Args...)> op)
      : state_(std::move(state)), op_(std::move(op)) {}

  Ret operator()(Args... args) const {
    if (state_->captured.load(std::memory_order_acquire)) return op_.call(std::forward<Args>(args)...);
    return function(*state_)(std::forward<Args>(args)...);
  }

  // The operator's kernel: whatever function the name holds now.
  static void define(torch::Library& library, const std::string& name, std::shared_ptr<details::CustomApiState> state) {
    library.def(name.c_str(), [state](Args... args) -> Ret { return function(*state)(std::forward<Args>(args)...); });
  }

  static std::function<Ret(Args...)> function(details::CustomApiState& state) {
    std::lock_guard<std::mutex> lock(state.mutex);
    return *std::static_pointer_cast<std::function<Ret(Args...)>>(state.function);
  }

 private:
  std::shared_ptr<details::CustomApiState> state_;
  c10::TypedOperatorHandle<Ret(Args...)> op_;
};

// Registers `fn` as the API {prefix}.{name} (operator prefix::name); the dump names it with the
// prefix's first letter upper-cased, as every API family ("MyNet" stays "MyNet", "mynet" becomes
// "Mynet"). Registering a name again (after restore_custom_api, or from a second place) turns capture
// back on and makes `fn` the function called; its signature must be the same. Throws
// std::invalid_argument naming the problem: a prefix or name that is not an identifier, the aten or a
// libtorch-internal namespace, another signature.
template <class Fn>
auto register_custom_api(const std::string& prefix, const std::string& name, Fn fn) {
  using Sig = typename c10::guts::infer_function_traits_t<Fn>::func_type;
  using Api = CustomApi<Sig>;
  const std::string where = "torchprobe::register_custom_api(\"" + prefix + "\", \"" + name + "\")";
  if (!details::is_identifier(prefix) || !details::is_identifier(name))
    throw std::invalid_argument(where + ": prefix and name must be identifiers ([A-Za-z_][A-Za-z0-9_]*)");
  if (prefix == "aten" || capture::internal_namespace(prefix))
    throw std::invalid_argument(where + ": '" + prefix +
                                "' is a namespace of libtorch's own; choose another prefix (e.g. your project's name)");
  auto& registry = details::CustomApiRegistry::instance();
  const std::string qualified = prefix + "::" + name;
  std::shared_ptr<details::CustomApiState> state;
  {
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto& slot = registry.states[qualified];
    if (slot && slot->signature != std::type_index(typeid(Sig)))
      throw std::invalid_argument(where + ": registered before with another signature");
    if (!slot) {
      slot = std::make_shared<details::CustomApiState>(std::type_index(typeid(Sig)));
      slot->function = std::make_shared<std::function<Sig>>(fn);
      auto& library = registry.libraries[prefix];
      if (!library)
        library = std::make_unique<torch::Library>(torch::Library::FRAGMENT, prefix, c10::nullopt, __FILE__, __LINE__);
      Api::define(*library, name, slot);
    } else {
      std::lock_guard<std::mutex> fn_lock(slot->mutex);
      slot->function = std::make_shared<std::function<Sig>>(fn);
    }
    slot->captured.store(true, std::memory_order_release);
    state = slot;
  }
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(qualified.c_str(), "").template typed<Sig>();
  return Api(std::move(state), std::move(op));
}

// msprobe's restore_custom_api: calls of {prefix}.{name} go straight to the function again (not an
// entry; the ATen calls inside are recorded as any). Returns false when the name was never registered.
inline bool restore_custom_api(const std::string& prefix, const std::string& name) {
  auto& registry = details::CustomApiRegistry::instance();
  std::lock_guard<std::mutex> lock(registry.mutex);
  const auto it = registry.states.find(prefix + "::" + name);
  if (it == registry.states.end()) return false;
  it->second->captured.store(false, std::memory_order_release);
  return true;
}

}  // namespace torchprobe

// TORCHPROBE_API("MyNet", block, fn): register_custom_api with the name written as an identifier.
#define TORCHPROBE_API(prefix, name, fn) ::torchprobe::register_custom_api(prefix, #name, fn)
