#pragma once
// The runtime face of every Debugger instantiation: what PrecisionDebugger and ScopedDump drive.
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "torchprobe/capture/model_ref.hpp"
#include "torchprobe/capture/token_window.hpp"
#include "torchprobe/config/types.hpp"
#include "torchprobe/core/save_value.hpp"
#include "torchprobe/io/console.hpp"

namespace torchprobe {

class DebuggerInterface {
 public:
  virtual ~DebuggerInterface() = default;

  // The ways to start, written once for every Debugger: each becomes a start_with().
  // Without a model: levels L1, L2 and debug (L0 and mix dump the model's modules and throw
  // std::invalid_argument without one, as msprobe does). start(rank_id) names the rank directory.
  void start() { start_with(ModelRef{}, std::nullopt); }
  void start(std::int64_t rank_id) { start_with(ModelRef{}, rank_id); }
  template <class Model, class = std::enable_if_t<!std::is_arithmetic_v<std::decay_t<Model>>>>
  void start(const Model& model, std::optional<std::int64_t> rank_id = std::nullopt) {
    start_with(to_model_ref(model), rank_id);
  }
  // Inference: only the forward calls `tokens.start`..`tokens.end` of `model` (counted from 0 at
  // each start(), so again in each step) are recorded. Throws std::invalid_argument without a
  // model or with a range that is not 0 <= start <= end.
  template <class Model, class = std::enable_if_t<!std::is_arithmetic_v<std::decay_t<Model>>>>
  void start(const Model& model, TokenRange tokens, std::optional<std::int64_t> rank_id = std::nullopt) {
    start_with(to_model_ref(model), rank_id, tokens);
  }
  // start(model, pg): the rank{R} directory is the rank of c10d process group `pg` (any pointer
  // with getRank()).
  template <class Model, class PG, class = decltype(std::declval<const PG&>()->getRank())>
  void start(const Model& model, const PG& pg) {
    start_with(to_model_ref(model), static_cast<std::int64_t>(pg->getRank()));
  }

  // `tokens`: start(model, token_range), see capture/token_window.hpp.
  virtual void start_with(const ModelRef& model, std::optional<std::int64_t> rank_id,
                          std::optional<TokenRange> tokens = std::nullopt) = 0;
  virtual void stop() noexcept = 0;
  // stop() under the name earlier msprobe releases gave it, which users' scripts still call.
  void forward_backward_dump_end() noexcept { stop(); }
  virtual void step() = 0;
  // Returns once every step handed over by stop()/step() is written; see Debugger::wait_written.
  virtual void wait_written() = 0;
  virtual void set_init_step(std::int64_t step) = 0;
  virtual std::int64_t current_step() const = 0;
  // msprobe's single-point save (debug.json); see Debugger::save.
  virtual void save(const SaveValue& value, const std::string& name, bool save_backward = true) = 0;
  virtual bool running() const = 0;
  virtual const Config& config() const = 0;
  // grad_probe's monitor(model) (msprobe's debugger.monitor): the model whose parameters'
  // gradients are recorded. A debugger of another task ignores it, and says so.
  virtual void monitor_model(const ModelRef&) {
    io::tell_user("monitor() is for task \"grad_probe\"; task \"" + std::string(config().task.str()) + "\" ignores it");
  }
};

}  // namespace torchprobe
