#pragma once
// RAII: start on construction, stop on destruction, also when an exception unwinds the scope.
#include <cstdint>
#include <optional>
#include <type_traits>

#include "torchprobe/capture/model_ref.hpp"
#include "torchprobe/debugger_interface.hpp"

namespace torchprobe {

class ScopedDump {
 public:
  template <class D, class = std::enable_if_t<std::is_base_of_v<DebuggerInterface, D>>>
  explicit ScopedDump(D& debugger) : debugger_(debugger) {
    debugger_.start_with(ModelRef{}, std::nullopt);
  }
  template <class D, class Model, class = std::enable_if_t<std::is_base_of_v<DebuggerInterface, D>>>
  ScopedDump(D& debugger, const Model& model, std::optional<std::int64_t> rank_id = std::nullopt)
      : debugger_(debugger) {
    debugger_.start_with(to_model_ref(model), rank_id);
  }
  // start(model, token_range) ... stop().
  template <class D, class Model, class = std::enable_if_t<std::is_base_of_v<DebuggerInterface, D>>>
  ScopedDump(D& debugger, const Model& model, TokenRange tokens, std::optional<std::int64_t> rank_id = std::nullopt)
      : debugger_(debugger) {
    debugger_.start_with(to_model_ref(model), rank_id, tokens);
  }
  ScopedDump(const ScopedDump&) = delete;
  ScopedDump& operator=(const ScopedDump&) = delete;
  ~ScopedDump() { debugger_.stop(); }

 private:
  DebuggerInterface& debugger_;
};

}  // namespace torchprobe
