#pragma once
// Step numbering, rank, and whether the current step is dumped at all.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "torchprobe/config/types.hpp"
#include "torchprobe/io/console.hpp"

namespace torchprobe::details {

// The rank a launcher gave this process: $RANK (torchrun), $OMPI_COMM_WORLD_RANK (Open MPI),
// $PMI_RANK (MPICH, Intel MPI), $SLURM_PROCID (srun), $LOCAL_RANK (a one-node launcher that sets
// nothing else); a variable that is not a non-negative integer is skipped.
inline std::optional<std::int64_t> launcher_rank() {
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK"}) {
    const char* env = std::getenv(name);
    if (!env) continue;
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0' && v >= 0) return v;
  }
  return std::nullopt;
}

// "[1, 2, 3]", as a config shows the list (a long one cut after 8 values: "[0, 1, ..., 7, ...]").
inline std::string index_list(const std::vector<std::int64_t>& values) {
  std::string s = "[";
  for (std::size_t i = 0; i < values.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s + (values.size() > 8 ? ", ...]" : "]");
}

class Session {
 public:
  explicit Session(const Config& config) : config_(config) {}

  // Step number = set_init_step() value + number of step() calls since (msprobe's rule).
  std::int64_t step() const { return init_step_ + loop_; }
  void advance() { ++loop_; }
  void set_init_step(std::int64_t s) {
    if (s < 0)
      throw std::invalid_argument("torchprobe: set_init_step(" + std::to_string(s) + "): the step must be >= 0");
    init_step_ = s;
    loop_ = 0;
  }

  // The rank for this start(), the first of: the explicit rank_id (start(model, rank_id), or
  // start(model, pg): that group's rank); the rank of the process group given to
  // Options().process_group(pg); the launcher's environment (launcher_rank()). Else none: the
  // directory is then proc{pid}, as msprobe writes without torch.distributed.
  void resolve_rank(std::optional<std::int64_t> rank_id) {
    if (rank_id && *rank_id < 0)
      throw std::invalid_argument("torchprobe: start(): rank_id " + std::to_string(*rank_id) +
                                  " is invalid; it must be >= 0");
    rank_ = rank_id ? rank_id : config_.group_rank ? config_.group_rank : launcher_rank();
    if (!rank_ && !config_.rank.contains(0) && !warned_no_rank_) {
      // msprobe's guide: on one card "rank" must be []. A process without a rank counts as rank 0.
      warned_no_rank_ = true;
      io::tell_user("warning: config key \"rank\" is " + index_list(config_.rank.values()) +
                    ", but this process has no rank (no rank_id given to start(), no process group, none of $RANK, "
                    "$OMPI_COMM_WORLD_RANK, $PMI_RANK, $SLURM_PROCID, $LOCAL_RANK): it counts as rank 0, so nothing "
                    "is dumped; on one card leave \"rank\" empty ([])");
    }
  }
  std::optional<std::int64_t> rank() const { return rank_; }

  std::string rank_dir_name() const {
    return rank_ ? "rank" + std::to_string(*rank_) : "proc" + std::to_string(::getpid());
  }
  std::string step_directory() const {
    std::string base = config_.dump_path;
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    return base + "/step" + std::to_string(step()) + "/" + rank_dir_name();
  }

  // Past the last configured step nothing is dumped again.
  bool finished() const {
    const auto last = config_.step.max();
    return last && step() > *last;
  }
  // Is this step, on this rank, one to dump? A process without a rank counts as rank 0.
  bool dumps_now() const {
    return !finished() && config_.step.contains(step()) && config_.rank.contains(rank_.value_or(0));
  }

 private:
  const Config& config_;
  std::int64_t init_step_ = 0;
  std::int64_t loop_ = 0;
  std::optional<std::int64_t> rank_;
  bool warned_no_rank_ = false;
};

}  // namespace torchprobe::details
