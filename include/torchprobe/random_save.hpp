#pragma once
// random_save(output_path): msprobe's random_save for a libtorch program. From this call on, every
// outermost call of a random ATen operator (details::is_random_op: rand*, randn*, randint*,
// randperm, bernoulli*, multinomial, normal*, uniform_, the dropout family, ...) in any thread is
// one row of a CSV in output_path, written as the call returns, so two runs' sequences of random
// calls can be diffed. msprobe's file name and first columns: random_rank{id}_{timestamp}.csv
// (random_proc{pid}_{timestamp}.csv without a rank), api_name and stack, then TorchProbe's own
// columns. Columns and an example: docs/random_save.md. Nested random calls
// (randn's normal_, dropout's bernoulli_) are part of the outer row. random_save_stop() ends it;
// a second random_save() starts a new file (one of the same name, in the same second, is
// written anew). Each row costs one native stack capture, and one
// addr2line run per call site seen for the first time.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/record_function.h>

#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/details/session.hpp"
#include "torchprobe/io/call_stack_capture.hpp"
#include "torchprobe/io/python_csv.hpp"
#include "torchprobe/io/symbolizer.hpp"
#include "torchprobe/io/timestamp.hpp"
#include "torchprobe/seed.hpp"

namespace torchprobe {

namespace details {

// One symbolized frame, "File {path}, line {line}, in {function}, \n {text}" (io/symbol_names.hpp
// frame_text), in its parts; nullopt for a frame of another form.
struct FrameParts {
  std::string path, line, function, text;
};
inline std::optional<FrameParts> frame_parts(const std::string& f) {
  const std::size_t line_at = f.find(", line ");
  const std::size_t in_at = f.find(", in ", line_at == std::string::npos ? 0 : line_at);
  const std::size_t text_at = f.find(", \n ", in_at == std::string::npos ? 0 : in_at);
  if (f.rfind("File ", 0) != 0 || line_at == std::string::npos || in_at == std::string::npos ||
      text_at == std::string::npos)
    return std::nullopt;
  return FrameParts{f.substr(5, line_at - 5), f.substr(line_at + 7, in_at - line_at - 7),
                    f.substr(in_at + 5, text_at - in_at - 5), f.substr(text_at + 4)};
}

// The user's call site among symbolized frames (innermost first): the first frame that is not an
// inline libtorch wrapper (at::randn, torch::randn, torch::nn::functional::dropout, ...): its index
// (frames.size() when there is none), "file:line" with debug information, else
// "{object}+0x{offset}", and its function.
struct CallSite {
  std::size_t index;
  std::string where, function;
};
inline CallSite user_call_site(const std::vector<std::string>& frames) {
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const std::optional<FrameParts> p = frame_parts(frames[i]);
    if (!p || p->function.rfind("at::", 0) == 0 || p->function.rfind("torch::", 0) == 0) continue;
    return {i, p->line != "0" ? p->path + ":" + p->line : p->text, p->function};
  }
  return {frames.size(), "", ""};
}

inline std::string shape_text(const at::Tensor& t) {
  std::string s = "[";
  for (std::int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

class RandomSave {
 public:
  static RandomSave& instance() {
    static RandomSave* r = new RandomSave();  // leaked: callbacks may run during static destruction
    return *r;
  }

  // Returns the file's path.
  std::string start(const std::string& output_path, std::optional<std::int64_t> rank_id) {
    if (rank_id && *rank_id < 0)
      throw std::invalid_argument("torchprobe::random_save: rank_id " + std::to_string(*rank_id) +
                                  " is invalid; it must be >= 0");
    const std::optional<std::int64_t> rank = rank_id ? rank_id : launcher_rank();
    const std::string path = output_path + "/random_" +
                             (rank ? "rank" + std::to_string(*rank) : "proc" + std::to_string(::getpid())) + "_" +
                             io::compact_local_timestamp() + ".csv";
    std::lock_guard<std::mutex> lock(mu_);
    close_locked();
    ::mkdir(output_path.c_str(), 0750);  // an existing directory is fine; fopen reports the rest
    file_ = std::fopen(path.c_str(), "w");
    if (file_ == nullptr) throw std::runtime_error("torchprobe::random_save: cannot write " + path);
    rows_ = 0;
    write_locked({"api_name", "stack", "index", "call_site", "function", "shape", "dtype", "device"});
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(enter, leave).needsOutputs(true).scopes({at::RecordScope::FUNCTION}));
    return path;
  }

  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    close_locked();
  }

 private:
  struct Call : at::ObserverContext {
    CallStack stack;
  };

  static int& depth() {
    thread_local int d = 0;
    return d;
  }

  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
    if (!is_random_op(fn.name()) || depth()++ > 0) return nullptr;
    auto call = std::make_unique<Call>();
    call->stack = io::capture_call_stack(32);
    return call;
  }

  static void leave(const at::RecordFunction& fn, at::ObserverContext* ctx) {
    if (!is_random_op(fn.name())) return;
    if (depth() > 0) --depth();
    if (ctx == nullptr) return;
    try {
      instance().record(fn, static_cast<Call&>(*ctx));
    } catch (...) {  // the probe must not break the program: a row that cannot be made is left out
    }
  }

  void record(const at::RecordFunction& fn, const Call& call) {
    // api_name, stack (msprobe's), then index, call_site, function, shape, dtype, device
    std::vector<std::string> row = {fn.name(), "", "", "", "", "", "", ""};
    // The stack from the user's call site outwards, a frame a line as stack.json writes it.
    const std::vector<std::string> frames = io::symbolize(call.stack);
    const CallSite site = user_call_site(frames);
    for (std::size_t i = site.index; i < frames.size(); ++i) row[1] += (i > site.index ? "\n" : "") + frames[i];
    row[3] = site.where;
    row[4] = site.function;
    for (const c10::IValue& v : fn.outputs())
      if (v.isTensor() && v.toTensor().defined()) {
        const at::Tensor& t = v.toTensor();
        row[5] = shape_text(t);
        row[6] = dtype_name(t.scalar_type());
        row[7] = t.device().str();
        break;
      }
    std::lock_guard<std::mutex> lock(mu_);
    if (file_ == nullptr) return;
    row[2] = std::to_string(rows_++);
    write_locked(row);
  }

  void write_locked(const std::vector<std::string>& fields) {
    std::string line;
    io::append_csv_row(line, fields);
    std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);  // a crashed run keeps its rows
  }

  void close_locked() {
    if (handle_ != 0) at::removeCallback(handle_);
    handle_ = 0;
    if (file_ != nullptr) std::fclose(file_);
    file_ = nullptr;
  }

  std::mutex mu_;
  std::FILE* file_ = nullptr;
  std::uint64_t rows_ = 0;
  at::CallbackHandle handle_ = 0;
};

}  // namespace details

// Starts recording random calls into {output_path}/random_rank{id}_{YYYYmmddHHMMSS}.csv, the rank
// being rank_id, else the launcher's ($RANK, ...), else random_proc{pid}_{...}.csv (the directory is
// created if missing; an unwritable one throws std::runtime_error). Returns the file's path.
inline std::string random_save(const std::string& output_path = "./output",
                               std::optional<std::int64_t> rank_id = std::nullopt) {
  return details::RandomSave::instance().start(output_path, rank_id);
}

// Stops recording and closes the file.
inline void random_save_stop() { details::RandomSave::instance().stop(); }

}  // namespace torchprobe
