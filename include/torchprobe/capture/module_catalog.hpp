#pragma once
// The modules of the model(s) given to start(model): their dotted paths, msprobe class names,
// entry-name prefixes and own parameters, and which module owns each parameter tensor.
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torchprobe/capture/model_ref.hpp"

namespace torchprobe::capture {

// msprobe's class name for a C++ module: no namespace, no trailing "Impl"
// ("torch::nn::LinearImpl" -> "Linear", "NetImpl" -> "Net").
inline std::string module_class_name(const std::string& cpp_name) {
  std::string s = cpp_name;
  const auto lt = s.find('<');  // templates: keep the outer name only
  if (lt != std::string::npos) s.erase(lt);
  const auto colon = s.rfind("::");
  if (colon != std::string::npos) s.erase(0, colon + 2);
  constexpr const char* kImpl = "Impl";
  if (s.size() > 4 && s.compare(s.size() - 4, 4, kImpl) == 0) s.erase(s.size() - 4);
  return s;
}

struct ModuleInfo {
  const void* key = nullptr;  // the torch::nn::Module, or the TorchScript module's object
  std::string path;           // "fc", "layer.0"
  std::string cls;            // "Linear"
  std::string prefix;         // "Module.fc.Linear." ("Module.1.fc.Linear." for the second model of a list)
  std::vector<std::pair<std::string, at::Tensor>> params;  // own parameters, in registration order
  bool leaf = false;                                       // no child modules
  // The enclosing module in the model given to start() (the module of the longest shorter path:
  // "block" for "block.fc1"); null directly under that model, which is not dumped.
  const ModuleInfo* parent = nullptr;

  std::string forward_name(std::int64_t n) const { return prefix + "forward." + std::to_string(n); }
  std::string backward_name(std::int64_t n) const { return prefix + "backward." + std::to_string(n); }
  std::string counter_key() const { return prefix; }
};

// A module's facts, the same way for both kinds of module. `path` is its dotted path under the
// model given to start(); `index_prefix` is "1." for the second model of a list, else empty.
inline std::unique_ptr<ModuleInfo> named_module_info(const void* key, const std::string& path, std::string cls,
                                                     const std::string& index_prefix, bool leaf) {
  auto info = std::make_unique<ModuleInfo>();
  info->key = key;
  info->path = path;
  info->cls = std::move(cls);
  info->prefix = "Module." + index_prefix + path + "." + info->cls + ".";
  info->leaf = leaf;
  return info;
}
inline std::unique_ptr<ModuleInfo> module_info(const torch::nn::Module& m, const std::string& path,
                                               const std::string& index_prefix) {
  auto info = named_module_info(&m, path, module_class_name(m.name()), index_prefix, m.children().empty());
  for (const auto& p : m.named_parameters(/*recurse=*/false)) info->params.emplace_back(p.key(), p.value());
  return info;
}
// TorchScript: named as Python names it, its class's unqualified name
// ("__torch__.torch.nn.modules.linear.Linear" -> "Linear").
inline std::unique_ptr<ModuleInfo> module_info(const torch::jit::Module& m, const std::string& path,
                                               const std::string& index_prefix) {
  const auto type_name = m.type()->name();
  auto info = named_module_info(m._ivalue().get(), path, type_name ? type_name->name() : std::string("Module"),
                                index_prefix, m.children().size() == 0);
  for (const auto& p : m.named_parameters(/*recurse=*/false)) info->params.emplace_back(p.name, p.value);
  return info;
}

// The class name (Module::name()) of probe_children()'s wrapper, module_guard.hpp.
inline constexpr const char* kWrapperName = "torchprobe::ProbedChildImpl";

class ModuleCatalog {
 public:
  ModuleCatalog() = default;
  explicit ModuleCatalog(const ModelRef& models) {
    const bool several = models.size() > 1;  // a list of models, of either kind
    for (std::size_t i = 0; i < models.nn.size(); ++i) add_tree(*models.nn[i], several ? std::to_string(i) + "." : "");
    for (std::size_t i = 0; i < models.jit.size(); ++i)
      add_script_tree(models.jit[i], several ? std::to_string(models.nn.size() + i) + "." : "");
  }

  const ModuleInfo* find(const void* key) const {
    auto it = by_module_.find(key);
    return it == by_module_.end() ? nullptr : it->second.get();
  }
  // The leaf module that owns this parameter tensor, if any: how ops are attributed to
  // Linear, Conv, norms, Embedding, RNNs without any hook in the module.
  const ModuleInfo* owner_of(const c10::TensorImpl* p) const {
    auto it = param_owner_.find(p);
    return it == param_owner_.end() ? nullptr : it->second;
  }
  bool empty() const { return by_module_.empty(); }
  std::vector<const ModuleInfo*> all() const {
    std::vector<const ModuleInfo*> v;
    for (const auto& kv : by_module_) v.push_back(kv.second.get());
    return v;
  }

 private:
  void add_tree(const torch::nn::Module& root, const std::string& index_prefix) {
    // The root given to start() is not dumped (msprobe skips it), only its descendants.
    // probe_children()'s wrappers are invisible: their child "inner" takes the wrapper's path.
    std::vector<std::string> wrappers;
    std::unordered_map<std::string, ModuleInfo*> tree;
    for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
      std::string path = item.key();
      if (item.value()->name() == kWrapperName) {
        wrappers.push_back(path);
        continue;
      }
      for (const std::string& w : wrappers) {
        const std::string inner = w + ".inner";
        if (path.compare(0, inner.size(), inner) == 0 && (path.size() == inner.size() || path[inner.size()] == '.')) {
          path = w + path.substr(inner.size());
          break;
        }
      }
      tree[path] = index(module_info(*item.value(), path, index_prefix));
    }
    link_parents(tree);
  }

  // TorchScript: every submodule, named as Python names it (its class's unqualified name:
  // "__torch__.torch.nn.modules.linear.Linear" -> "Linear"). Its calls are marked exactly by the
  // probes torchscript.hpp puts around them, so its parameters attribute nothing.
  void add_script_tree(const torch::jit::Module& root, const std::string& index_prefix) {
    std::unordered_map<std::string, ModuleInfo*> tree;
    for (const auto& item : root.named_modules()) {
      if (item.name.empty()) continue;  // the root
      auto info = module_info(item.value, item.name, index_prefix);
      tree[info->path] = info.get();
      by_module_[info->key] = std::move(info);
    }
    link_parents(tree);
  }

  // Each module's parent: the module whose path is the longest proper dotted prefix of its own.
  static void link_parents(const std::unordered_map<std::string, ModuleInfo*>& tree) {
    for (const auto& kv : tree) {
      std::string path = kv.first;
      for (auto dot = path.rfind('.'); dot != std::string::npos; dot = path.rfind('.')) {
        path.erase(dot);
        auto it = tree.find(path);
        if (it != tree.end()) {
          kv.second->parent = it->second;
          break;
        }
      }
    }
  }

  ModuleInfo* index(std::unique_ptr<ModuleInfo> info) {
    ModuleInfo* raw = info.get();
    if (raw->leaf) {
      for (const auto& p : raw->params) param_owner_[p.second.unsafeGetTensorImpl()] = raw;
      // Buffers (BatchNorm's running statistics and counter) belong to the module's own state,
      // not to its inputs: they attribute calls like parameters do.
      for (const auto& b : static_cast<const torch::nn::Module*>(raw->key)->named_buffers(/*recurse=*/false))
        if (b.value().defined()) param_owner_[b.value().unsafeGetTensorImpl()] = raw;
    }
    by_module_[raw->key] = std::move(info);
    return raw;
  }

  std::unordered_map<const void*, std::unique_ptr<ModuleInfo>> by_module_;
  std::unordered_map<const c10::TensorImpl*, const ModuleInfo*> param_owner_;
};

}  // namespace torchprobe::capture
