#pragma once
// The runtime face of every Debugger instantiation: what PrecisionDebugger and ScopedDump drive.
#include <cstdint>
#include <optional>

#include <string>

#include "torchprobe/capture/model_ref.hpp"
#include "torchprobe/capture/token_window.hpp"
#include "torchprobe/config/types.hpp"
#include "torchprobe/core/save_value.hpp"

namespace torchprobe {

class DebuggerInterface {
 public:
  virtual ~DebuggerInterface() = default;
  // `tokens`: start(model, token_range), see capture/token_window.hpp.
  virtual void start_with(const ModelRef& model, std::optional<std::int64_t> rank_id,
                          std::optional<TokenRange> tokens = std::nullopt) = 0;
  virtual void stop() noexcept = 0;
  virtual void step() = 0;
  // Returns once every step handed over by stop()/step() is written; see Debugger::wait_written.
  virtual void wait_written() = 0;
  virtual void set_init_step(std::int64_t step) = 0;
  virtual std::int64_t current_step() const = 0;
  // msprobe's single-point save (debug.json); see Debugger::save.
  virtual void save(const SaveValue& value, const std::string& name, bool save_backward = true) = 0;
  virtual bool running() const = 0;
  virtual const Config& config() const = 0;
};

}  // namespace torchprobe
