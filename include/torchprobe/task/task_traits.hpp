#pragma once
// The task contract, written once: what a task class must have, what it may have, and how the
// rest of TorchProbe finds out. check_task<T>() stops the build with a message that names what a
// task lacks (as nlohmann/json's is_sax checks a SAX handler), before any deeper error.
//
// Must have:
//   static constexpr std::string_view name;            // config.json's "task", dump.json's "task"
//   static constexpr LevelSet levels;                  // the levels it supports
//   static constexpr std::array<std::string_view, N> config_keys;  // its section's keys it reads
//                                                      // besides scope, list and data_mode
//   static bool saves_tensors(const Config&);          // does the step get dump_tensor_data/?
//   explicit T(const Config&);  or  T(const Config&, TensorSaver);   // the latter saves tensors, through
//                                                      // the writer the Recorder owns (task/tensor_saver.hpp)
//   nlohmann::ordered_json describe(const at::Tensor&, const Site&, Record&, bool gradient = false);
//   bool keep(Record&);                                // every finished entry: kept or dropped
// May have (found by detection; each is used only where present):
//   bool summarize(const at::Tensor&, const Site&, Record&, TensorSummary&) const;  // compact CPU items
//   bool ended() const + std::string end_reason() const;   // the task ends the dump (overflow_nums)
//   bool decision_due() const + decide_held(commit);       // entries held until device values are read
//   step_files(const std::vector<const Record*>&, step)    // {name, JSON} files added to each step
//   step_text_files(step, rank)                            // {name, text} files added to each step
//   void set_step(step);                                   // the step whose calls come next
//   check_call(const OpInfo&, inputs, name) -> std::unique_ptr<CallCheck>   // re-runs calls instead
//   + check_call_end(CallCheck&, outputs);                                  // of recording them
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "torchprobe/config/types.hpp"
#include "torchprobe/core/kinds.hpp"
#include "torchprobe/core/op_info.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/core/site.hpp"
#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/task/tensor_saver.hpp"

namespace torchprobe {

// What a task that checks calls (check_call) keeps of one call from its start to its end.
struct CallCheck {
  virtual ~CallCheck() = default;
};

namespace task_traits {

template <class T, class = void>
struct has_name : std::false_type {};
template <class T>
struct has_name<T, std::enable_if_t<std::is_convertible_v<decltype(T::name), std::string_view>>> : std::true_type {};

template <class T, class = void>
struct has_levels : std::false_type {};
template <class T>
struct has_levels<T, std::enable_if_t<std::is_convertible_v<decltype(T::levels), LevelSet>>> : std::true_type {};

template <class T, class = void>
struct has_config_keys : std::false_type {};
template <class T>
struct has_config_keys<T,
                       std::enable_if_t<std::is_convertible_v<decltype(*std::begin(T::config_keys)), std::string_view>>>
    : std::true_type {};

template <class T, class = void>
struct has_saves_tensors : std::false_type {};
template <class T>
struct has_saves_tensors<
    T, std::enable_if_t<std::is_convertible_v<decltype(T::saves_tensors(std::declval<const Config&>())), bool>>>
    : std::true_type {};

template <class T, class = void>
struct has_describe : std::false_type {};
template <class T>
struct has_describe<
    T, std::enable_if_t<std::is_convertible_v<decltype(std::declval<T&>().describe(std::declval<const at::Tensor&>(),
                                                                                   std::declval<const Site&>(),
                                                                                   std::declval<Record&>())),
                                              nlohmann::ordered_json> &&
                        std::is_convertible_v<decltype(std::declval<T&>().describe(std::declval<const at::Tensor&>(),
                                                                                   std::declval<const Site&>(),
                                                                                   std::declval<Record&>(), bool())),
                                              nlohmann::ordered_json>>> : std::true_type {};

template <class T, class = void>
struct has_keep : std::false_type {};
template <class T>
struct has_keep<
    T, std::enable_if_t<std::is_convertible_v<decltype(std::declval<T&>().keep(std::declval<Record&>())), bool>>>
    : std::true_type {};

// --- optional hooks ---

template <class T, class = void>
struct summarizes : std::false_type {};
template <class T>
struct summarizes<T, std::void_t<decltype(std::declval<const T&>().summarize(
                         std::declval<const at::Tensor&>(), std::declval<const Site&>(), std::declval<Record&>(),
                         std::declval<TensorSummary&>()))>> : std::true_type {};

template <class T, class = void>
struct can_end : std::false_type {};
template <class T>
struct can_end<T, std::void_t<decltype(std::declval<const T&>().ended())>> : std::true_type {};

template <class T, class = void>
struct says_end_reason : std::false_type {};
template <class T>
struct says_end_reason<
    T, std::enable_if_t<std::is_convertible_v<decltype(std::declval<const T&>().end_reason()), std::string>>>
    : std::true_type {};

template <class T, class = void>
struct holds_entries : std::false_type {};
template <class T>
struct holds_entries<T, std::void_t<decltype(std::declval<const T&>().decision_due())>> : std::true_type {};

template <class T, class = void>
struct decides_held : std::false_type {};
template <class T>
struct decides_held<T, std::void_t<decltype(std::declval<T&>().decide_held(std::function<void(Record&&)>()))>>
    : std::true_type {};

template <class T, class = void>
struct adds_files : std::false_type {};
template <class T>
struct adds_files<T, std::void_t<decltype(std::declval<T&>().step_files(
                         std::declval<const std::vector<const Record*>&>(), std::int64_t()))>> : std::true_type {};

template <class T, class = void>
struct adds_text_files : std::false_type {};
template <class T>
struct adds_text_files<T, std::void_t<decltype(std::declval<T&>().step_text_files(std::int64_t(), std::int64_t()))>>
    : std::true_type {};

template <class T, class = void>
struct follows_steps : std::false_type {};
template <class T>
struct follows_steps<T, std::void_t<decltype(std::declval<T&>().set_step(std::int64_t()))>> : std::true_type {};

template <class T, class = void>
struct checks_calls : std::false_type {};
template <class T>
struct checks_calls<T, std::void_t<decltype(std::declval<T&>().check_call(
                           std::declval<const OpInfo&>(), std::declval<const std::vector<c10::IValue>&>(),
                           std::declval<const std::string&>()))>> : std::true_type {};

template <class T, class = void>
struct ends_checks : std::false_type {};
template <class T>
struct ends_checks<T, std::void_t<decltype(std::declval<T&>().check_call_end(
                          std::declval<CallCheck&>(), std::declval<const std::vector<c10::IValue>&>()))>>
    : std::true_type {};

// Is it given the Recorder's TensorSaver (a task that saves tensors)?
template <class T>
struct takes_saver : std::is_constructible<T, const Config&, TensorSaver> {};
template <class T>
struct is_constructible_task : std::bool_constant<std::is_constructible_v<T, const Config&> || takes_saver<T>::value> {
};

}  // namespace task_traits

// True when T is a complete task; check_task<T>() says what is missing.
template <class T>
inline constexpr bool is_task_v =
    task_traits::has_name<T>::value&& task_traits::has_levels<T>::value&& task_traits::has_config_keys<T>::value&&
        task_traits::has_saves_tensors<T>::value&& task_traits::is_constructible_task<T>::value&&
            task_traits::has_describe<T>::value&& task_traits::has_keep<T>::value &&
    (!task_traits::can_end<T>::value || task_traits::says_end_reason<T>::value) &&
    (!task_traits::holds_entries<T>::value || task_traits::decides_held<T>::value) &&
    (!task_traits::checks_calls<T>::value || task_traits::ends_checks<T>::value);

template <class T>
constexpr bool check_task() {
  using namespace task_traits;
  static_assert(has_name<T>::value,
                "torchprobe: a task needs `static constexpr std::string_view name` (its name in config.json and "
                "dump.json)");
  static_assert(has_levels<T>::value, "torchprobe: a task needs `static constexpr LevelSet levels` (its levels)");
  static_assert(has_config_keys<T>::value,
                "torchprobe: a task needs `static constexpr std::array<std::string_view, N> config_keys` (the keys "
                "of its config section it reads; {} for none)");
  static_assert(has_saves_tensors<T>::value,
                "torchprobe: a task needs `static bool saves_tensors(const Config&)` (does a step get "
                "dump_tensor_data/?)");
  static_assert(is_constructible_task<T>::value,
                "torchprobe: a task needs a constructor `T(const Config&)`, or `T(const Config&, TensorSaver)` "
                "when it saves tensors");
  static_assert(has_describe<T>::value,
                "torchprobe: a task needs `nlohmann::ordered_json describe(const at::Tensor&, const Site&, Record&, "
                "bool gradient = false)` (what a tensor becomes in dump.json)");
  static_assert(has_keep<T>::value,
                "torchprobe: a task needs `bool keep(Record&)` (whether a finished entry joins the step)");
  static_assert(!can_end<T>::value || says_end_reason<T>::value,
                "torchprobe: a task with `ended()` needs `std::string end_reason() const` (what the user is told)");
  static_assert(!holds_entries<T>::value || decides_held<T>::value,
                "torchprobe: a task with `decision_due()` needs `template <class Commit> void decide_held(Commit&&)`");
  static_assert(!checks_calls<T>::value || ends_checks<T>::value,
                "torchprobe: a task with `check_call(...)` needs `check_call_end(CallCheck&, const Values& outputs)`");
  return is_task_v<T>;
}

}  // namespace torchprobe
