#pragma once
// One row of msprobe's compare table as compare keeps it: a tensor's or a scalar's statistics, its
// texts, and the entry it belongs to (rows.hpp makes them from a dump's entries).
#include <nlohmann/json.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

#include "torchprobe/analysis/compare/text_store.hpp"

namespace torchprobe::compare {

using Json = nlohmann::ordered_json;

// The entry a row belongs to, shared by the entry's rows (kept in the rows' TextStore).
struct RowEntry {
  std::string_view name;  // the dump.json entry
  std::string_view key;   // its name with the backward call number recounted
  std::size_t index = 0;  // its position in dump order
};

// What few rows have: a .pt file (tensor dumps), a stack (an entry's first row, with stack.json).
struct RowExtras {
  std::string_view data_name = "-1";
  std::optional<std::string_view> stack;  // str(list of frames)
};

// A row's texts are views: of the TextStore of its dump's rows (text_store.hpp), or of literals.
// A million entries a side make five million rows, so a row is kept small (120 bytes; it was 256,
// 1.3 GB of a large compare's 2.7): what is the entry's is shared by its rows, what few rows have
// lies beside them, short texts take 8 bytes (TextRef), and statistics that are plain floats (nearly
// all) are kept as doubles.
class Row {
 public:
  std::string_view name;  // NPU/Bench Name
  TextRef key;            // compare key: name with the backward call number recounted
  TextRef dtype, shape;   // str() of msprobe's values
  TextRef requires_grad = "N/A";
  TextRef md5;

  // The entry it belongs to: a RowEntry shared by the entry's rows, kept in their TextStore.
  const RowEntry& owner() const { return entry_ != nullptr ? *entry_ : no_entry(); }
  std::string_view entry() const { return owner().name; }
  std::string_view entry_key() const { return owner().key; }
  std::size_t entry_index() const { return owner().index; }
  void set_entry(const RowEntry* entry) { entry_ = entry; }

  // Max, Min, Mean, Norm (s = 0..3) as msprobe's table holds them ("None", "Nan" as strings).
  Json stat(int s) const { return cells_ != nullptr ? (*cells_)[s] : Json(values_[s]); }
  void set_stats(const std::array<Json, 4>& cells, TextStore& store) {
    cells_ = nullptr;
    for (int s = 0; s < 4; ++s) {
      if (!cells[s].is_number_float()) {
        cells_ = store.own(cells);
        return;
      }
      values_[s] = cells[s].get<double>();
    }
  }

  std::string_view data_name() const { return extras_ != nullptr ? extras_->data_name : "-1"; }
  std::optional<std::string_view> stack() const { return extras_ != nullptr ? extras_->stack : std::nullopt; }
  void set_data_name(std::string_view data_name, TextStore& store) { extras(store).data_name = data_name; }
  void set_stack(std::string_view stack, TextStore& store) { extras(store).stack = stack; }

  bool is_output() const { return name.find(".output.") != std::string_view::npos; }

  // input | output | parameters | parameters_grad, as the place of its rows within an entry (0..3).
  enum Place : unsigned char { kInput, kParameters, kOutput, kParametersGrad };
  Place place = kInput;

 private:
  static const RowEntry& no_entry() {
    static const RowEntry none;
    return none;
  }
  RowExtras& extras(TextStore& store) {
    if (extras_ == nullptr) extras_ = store.own(RowExtras{});
    return *extras_;
  }
  double values_[4] = {};
  const std::array<Json, 4>* cells_ = nullptr;  // when some statistic is not a float
  const RowEntry* entry_ = nullptr;
  RowExtras* extras_ = nullptr;  // the store's
};

}  // namespace torchprobe::compare
