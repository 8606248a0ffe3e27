// Statistics of every dtype, layout and instruction set against ATen computed in float64 on a
// copy; NaN/inf placement around every SIMD width; accuracy on large randn; checksums against
// python's zlib; the device path (forced on CPU tensors) against the CPU kernels.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/stats/checksum.hpp>
#include <torchprobe/stats/cpu_stats.hpp>
#include <torchprobe/stats/device_stats.hpp>
#include <torchprobe/task/statistics.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "test_support.hpp"

namespace tp = torchprobe;
using tp::StatValue;
using tp::stats::KernelIsa;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Every instruction set this machine runs: the portable one always, AVX2/AVX-512 where present.
std::vector<KernelIsa> supported_isas() {
  std::vector<KernelIsa> out;
  for (KernelIsa isa : {KernelIsa::Portable, KernelIsa::Avx2, KernelIsa::Avx512})
    if (tp::stats::kernel_isa_supported(isa)) out.push_back(isa);
  return out;
}

// doctest prints a const char* as a pointer.
std::string name_of(KernelIsa isa) { return tp::stats::kernel_isa_name(isa); }

// A way to compute statistics: one instruction set's kernels for every size, or the probe's own
// entry point (the best kernels, and a plain loop for tiny contiguous tensors).
struct StatsPath {
  std::string name;
  std::function<tp::TensorStats(const at::Tensor&)> run;
};
StatsPath path_of(KernelIsa isa) {
  return {name_of(isa), [isa](const at::Tensor& t) { return tp::stats::cpu_stats(t, isa); }};
}
std::vector<StatsPath> stats_paths() {
  std::vector<StatsPath> out;
  for (KernelIsa isa : supported_isas()) out.push_back(path_of(isa));
  out.push_back({"default (tiny path)", [](const at::Tensor& t) { return tp::stats::cpu_stats(t); }});
  return out;
}

bool same_or_both_nan(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

void check_close(double got, double want, double rel, double scale = 1.0) {
  if (std::isnan(want) || std::isinf(want)) {
    CHECK(same_or_both_nan(got, want));
  } else {
    CHECK(std::abs(got - want) <= rel * std::max({1.0, std::abs(want), scale}));
  }
}

// The float64 reference: ATen on a float64 copy (|z| for complex), one reduction per statistic.
struct Reference {
  double max, min, mean, norm, max_abs;
};
Reference reference_of(const at::Tensor& t) {
  const at::Tensor d = t.is_complex() ? t.to(at::kComplexDouble).abs() : t.to(at::kDouble);
  return {d.max().item<double>(), d.min().item<double>(), d.mean().item<double>(), d.norm().item<double>(),
          d.abs().max().item<double>()};
}

void check_against_reference(const at::Tensor& t, const StatsPath& path) {
  CAPTURE(path.name);
  CAPTURE(t.scalar_type());
  CAPTURE(t.sizes());
  CAPTURE(t.strides());
  const tp::TensorStats s = path.run(t);
  const Reference r = reference_of(t);
  const bool integral = at::isIntegralType(t.scalar_type(), /*includeBool=*/false);
  CHECK(s.max.kind == (integral ? StatValue::Kind::Int : StatValue::Kind::Float));
  CHECK(s.min.kind == s.max.kind);
  if (t.scalar_type() == at::kLong) {  // exact in int64, beyond what a double holds
    const at::Tensor c = t.contiguous();
    CHECK(s.max.i == c.max().item<std::int64_t>());
    CHECK(s.min.i == c.min().item<std::int64_t>());
  } else if (t.is_complex()) {  // |z| as sqrt(re^2 + im^2) in double: within an ulp of hypot
    check_close(s.max.as_double(), r.max, 4e-16);
    check_close(s.min.as_double(), r.min, 4e-16);
  } else {  // Max/Min exact
    CHECK(same_or_both_nan(s.max.as_double(), r.max));
    CHECK(same_or_both_nan(s.min.as_double(), r.min));
  }
  // Mean: the error of a sum is relative to the elements' size, not to the (possibly tiny) result.
  check_close(s.mean.as_double(), r.mean, 1e-12, r.max_abs);
  check_close(s.norm.as_double(), r.norm, 1e-12);
}

void check_against_reference(const at::Tensor& t, KernelIsa isa) { check_against_reference(t, path_of(isa)); }

// Values spread over the dtype's range: randn * 50 for floating dtypes, the full range of
// small integer types, +-2^62 for int64.
at::Tensor sample(at::ScalarType dtype, std::int64_t n) {
  switch (dtype) {
    case at::kByte: return torch::randint(0, 256, {n}).to(dtype);
    case at::kChar: return torch::randint(-128, 128, {n}).to(dtype);
    case at::kShort: return torch::randint(-32768, 32768, {n}).to(dtype);
    case at::kInt:
      return torch::randint(std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max(), {n},
                            at::kLong)
          .to(dtype);
    case at::kLong: return torch::randint(-(std::int64_t(1) << 62), std::int64_t(1) << 62, {n}, at::kLong);
    case at::kBool: return torch::rand({n}) > 0.5;
    default: return (torch::randn({n}, at::kDouble) * 50).to(dtype);
  }
}

const std::vector<at::ScalarType> kNumericDtypes = {at::kFloat, at::kDouble,       at::kHalf,         at::kBFloat16,
                                                    at::kByte,  at::kChar,         at::kShort,        at::kInt,
                                                    at::kLong,  at::kComplexFloat, at::kComplexDouble};
const std::vector<at::ScalarType> kFloatDtypes = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};

// Lengths around every vector width and unrolled step (4..64 lanes) and around 4096.
const std::vector<std::int64_t> kLengths = {1,  2,  3,   4,   5,   7,   8,   9,   15,   16,   17,   31,   32,   33,  63,
                                            64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025, 4095, 4096, 4097};

}  // namespace

TEST_CASE("the CPU offers the portable kernels always, and the best supported set by default") {
  CHECK(tp::stats::kernel_isa_supported(KernelIsa::Portable));
  CHECK(tp::stats::kernel_isa_supported(tp::stats::best_kernel_isa()));
  MESSAGE("statistics kernels: " << name_of(tp::stats::best_kernel_isa()));
}

TEST_CASE(
    "every dtype, every length around the SIMD widths, every instruction set and the tiny path: equal to ATen in "
    "float64") {
  torch::manual_seed(7);
  for (at::ScalarType dtype : kNumericDtypes) {
    for (std::int64_t n : kLengths) {
      const at::Tensor t = sample(dtype, n);
      for (const StatsPath& path : stats_paths()) check_against_reference(t, path);
    }
  }
}

TEST_CASE("integer extremes keep exact Max/Min in every instruction set") {
  const auto i64 = std::numeric_limits<std::int64_t>::max();
  const std::vector<at::Tensor> tensors = {
      torch::tensor({-128, 127, 0, 5}, at::kChar),
      torch::tensor({0, 255, 7}, at::kByte),
      torch::tensor({-32768, 32767, 1}, at::kShort),
      torch::tensor({std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max()}, at::kInt),
      torch::tensor({-i64 - 1, i64, i64 - 1}, at::kLong),
      torch::tensor({std::int64_t(1) << 60, -(std::int64_t(1) << 59), std::int64_t(3)})};
  for (KernelIsa isa : supported_isas()) {
    for (const at::Tensor& base : tensors) {
      const at::Tensor t = base.repeat({37});  // long enough for the vector loops
      const tp::TensorStats s = tp::stats::cpu_stats(t, isa);
      CAPTURE(name_of(isa));
      CAPTURE(t.scalar_type());
      CHECK(s.max.i == t.max().item<std::int64_t>());
      CHECK(s.min.i == t.min().item<std::int64_t>());
      // The error of a mean is relative to the elements' size, as in check_against_reference:
      // ±1.3e-10 for int8, not a bound scaled for int64 that would accept a mean off by millions.
      const at::Tensor d = t.to(at::kDouble);
      check_close(s.mean.d, d.mean().item<double>(), 1e-12, d.abs().max().item<double>());
    }
  }
}

TEST_CASE("strided tensors are walked in place and give the statistics of their elements") {
  torch::manual_seed(8);
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kInt, at::kLong,
                               at::kComplexFloat, at::kComplexDouble}) {
    const at::Tensor m = sample(dtype, 300 * 70).view({300, 70});
    const at::Tensor wide = sample(dtype, 8 * 2100).view({8, 2100});
    const at::Tensor cube = sample(dtype, 2 * 3 * 5 * 7).view({2, 3, 5, 7});
    const std::vector<at::Tensor> views = {
        m.t(),                                // dense in another order: one run
        m.slice(0, 3, 290, 7),                // short rows, gathered
        m.select(1, 5),                       // one strided run
        m.slice(1, 1, 69, 3),                 // strided rows
        m.unsqueeze(0).expand({3, 300, 70}),  // stride 0: walked once, counted 3 times
        m.slice(0, 0, 10).unsqueeze(1).expand({10, 4, 70}),
        wide.slice(1, 7, 2090),                           // long contiguous rows, scanned in place
        cube.permute({2, 0, 3, 1}),                       // permuted
        cube.contiguous(at::MemoryFormat::ChannelsLast),  // channels-last
        m.as_strided({50, 20}, {3, 1}),                   // overlapping windows
        // Sliced in two outer dimensions: the walk carries over more than one index at once.
        cube.slice(1, 0, 3, 2).slice(2, 1, 5, 2),
        sample(dtype, 4 * 6 * 10).view({4, 6, 10}).slice(0, 1, 4, 2).slice(1, 0, 6, 2).slice(2, 1, 10, 3),
        // A gather buffer of float32 holds 4096 elements (16 KiB): 4097 leave exactly one for the
        // last flush, 4095 one short of a full buffer.
        sample(dtype, 8194).slice(0, 0, 8194, 2),
        sample(dtype, 8190).slice(0, 0, 8190, 2),
    };
    for (const at::Tensor& v : views) {
      for (KernelIsa isa : supported_isas()) check_against_reference(v, isa);
    }
  }
  const at::Tensor b = torch::rand({40, 30}) > 0.3;
  for (KernelIsa isa : supported_isas()) {
    for (const at::Tensor& v : {b.t(), b.slice(1, 2, 30, 4), b.select(1, 3), b.unsqueeze(0).expand({2, 40, 30})}) {
      const tp::TensorStats s = tp::stats::cpu_stats(v, isa);
      CHECK(s.max.b == v.any().item<bool>());
      CHECK(s.min.b == v.all().item<bool>());
    }
  }
}

TEST_CASE("large tensors split over threads give the same statistics, dense and strided") {
  // libtorch may default to one intra-op thread (it does on a 2-vCPU VM); use two here.
  struct Threads {
    int before = at::get_num_threads();
    Threads() { at::set_num_threads(2); }
    ~Threads() { at::set_num_threads(before); }
  } two_threads;
  torch::manual_seed(10);
  const at::Tensor x = torch::randn({1 << 22});
  const std::vector<at::Tensor> views = {x, x.view({2048, 2048}).t(), x.slice(0, 0, 1 << 22, 2),
                                         x.view({2048, 2048}).slice(1, 0, 2000),
                                         x.to(at::kBFloat16).slice(0, 1, 1 << 22, 3)};
  for (KernelIsa isa : supported_isas()) {
    for (const at::Tensor& v : views) check_against_reference(v, isa);
  }
}

TEST_CASE("a NaN at the first, a middle or the last index makes all four statistics NaN") {
  torch::manual_seed(11);
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kComplexFloat}) {
    for (std::int64_t n : kLengths) {
      for (std::int64_t at_index : {std::int64_t(0), n / 2, n - 1}) {
        at::Tensor t = sample(dtype, n);
        t[at_index] = std::nan("");
        for (const StatsPath& path : stats_paths()) {
          const tp::TensorStats s = path.run(t);
          CAPTURE(path.name);
          CAPTURE(dtype);
          CAPTURE(n);
          CAPTURE(at_index);
          CHECK(std::isnan(s.max.d));
          CHECK(std::isnan(s.min.d));
          CHECK(std::isnan(s.mean.d));
          CHECK(std::isnan(s.norm.d));
        }
      }
    }
  }
}

TEST_CASE("infinities follow torch: Max/Min are the infinity, Mean its sign (NaN for both), Norm inf") {
  torch::manual_seed(12);
  for (at::ScalarType dtype : kFloatDtypes) {
    for (std::int64_t n : kLengths) {
      for (std::int64_t at_index : {std::int64_t(0), n / 2, n - 1}) {
        at::Tensor pos = sample(dtype, n), neg = pos.clone(), both = pos.clone();
        pos[at_index] = kInf;
        neg[at_index] = -kInf;
        both[at_index] = kInf;
        both[(at_index + 1) % n] = -kInf;
        for (const StatsPath& path : stats_paths()) {
          CAPTURE(path.name);
          CAPTURE(dtype);
          CAPTURE(n);
          CAPTURE(at_index);
          const tp::TensorStats p = path.run(pos);
          CHECK(p.max.d == kInf);
          CHECK(p.mean.d == kInf);
          CHECK(p.norm.d == kInf);
          const tp::TensorStats m = path.run(neg);
          CHECK(m.min.d == -kInf);
          CHECK(m.mean.d == -kInf);
          CHECK(m.norm.d == kInf);
          if (n > 1) {
            const tp::TensorStats b = path.run(both);
            CHECK(b.max.d == kInf);
            CHECK(b.min.d == -kInf);
            CHECK(std::isnan(b.mean.d));
            CHECK(b.norm.d == kInf);
          }
        }
      }
    }
  }
  const tp::TensorStats neg = tp::stats::cpu_stats(torch::full({3}, -kInf, at::kHalf));
  CHECK(neg.max.d == -kInf);
  CHECK(neg.mean.d == -kInf);
  CHECK(neg.norm.d == kInf);
}

TEST_CASE("float values whose squares overflow fp32 still give a finite norm") {
  const at::Tensor big = torch::full({1000}, 1e30f);
  for (KernelIsa isa : supported_isas()) {
    const tp::TensorStats s = tp::stats::cpu_stats(big, isa);
    CHECK(s.mean.d == doctest::Approx(1e30).epsilon(1e-6));
    CHECK(s.norm.d == doctest::Approx(1e30 * std::sqrt(1000.0)).epsilon(1e-6));
  }
}

TEST_CASE("Mean and Norm are within 1e-9 of float64 on 8M randn, for every float dtype") {
  torch::manual_seed(13);
  // randn's mean is ~1/sqrt(n) of its elements: the sum cancels, which is what fp32 sums get wrong.
  const at::Tensor base = torch::randn({std::int64_t(8) << 20}, at::kDouble);
  for (at::ScalarType dtype : kFloatDtypes) {
    const at::Tensor t = base.to(dtype);
    const at::Tensor d = t.to(at::kDouble);
    const double mean = d.mean().item<double>(), norm = d.norm().item<double>();
    for (KernelIsa isa : supported_isas()) {
      const tp::TensorStats s = tp::stats::cpu_stats(t, isa);
      CAPTURE(name_of(isa));
      CAPTURE(dtype);
      CHECK(std::abs(s.mean.d - mean) <= 1e-9 * std::abs(mean));
      CHECK(std::abs(s.norm.d - norm) <= 1e-9 * norm);
    }
  }
}

TEST_CASE("fp16 statistics are accumulated in double, not in half precision") {
  // 60000 * 8 overflows fp16's range; ATen's own fp16 mean would too (libtorch-notes §6).
  const at::Tensor h = torch::full({8}, 60000.0, at::kHalf);
  for (KernelIsa isa : supported_isas()) {
    const tp::TensorStats s = tp::stats::cpu_stats(h, isa);
    CHECK(s.mean.d == doctest::Approx(60000.0));
    CHECK(s.norm.d == doctest::Approx(60000.0 * std::sqrt(8.0)));
  }
}

TEST_CASE("bool tensors: Max is any, Min is all, Mean and Norm are null") {
  for (KernelIsa isa : supported_isas()) {
    for (std::int64_t n : kLengths) {
      at::Tensor all_true = torch::ones({n}, at::kBool), one_false = all_true.clone(),
                 one_true = torch::zeros({n}, at::kBool);
      one_false[n - 1] = false;
      one_true[n / 2] = true;
      const tp::TensorStats a = tp::stats::cpu_stats(all_true, isa), f = tp::stats::cpu_stats(one_false, isa),
                            o = tp::stats::cpu_stats(one_true, isa);
      CAPTURE(n);
      CHECK(a.max.kind == StatValue::Kind::Bool);
      CHECK((a.max.b && a.min.b));
      CHECK((f.max.b == (n > 1) && !f.min.b));
      CHECK((o.max.b && o.min.b == (n == 1)));
      CHECK(a.mean.is_null());
      CHECK(a.norm.is_null());
    }
  }
}

TEST_CASE("lazily negated and conjugated views give the statistics of the values they show") {
  torch::manual_seed(14);
  const at::Tensor x = torch::randn({100});
  const tp::TensorStats neg = tp::stats::cpu_stats(at::_neg_view(x));
  const tp::TensorStats want = tp::stats::cpu_stats(-x);
  CHECK(neg.max.d == want.max.d);
  CHECK(neg.min.d == want.min.d);
  CHECK(neg.mean.d == doctest::Approx(want.mean.d));
  const at::Tensor z = torch::randn({64}, at::kComplexFloat);
  CHECK(tp::stats::cpu_stats(z.conj()).max.d == tp::stats::cpu_stats(z).max.d);
  // Statistics over |z| are the same for z and its conjugate, so they cannot show whether the conj
  // bit was honoured; checksums of the bytes can: they must be those of the values the view shows.
  // 63 elements: a sign flipped in every element changes the XOR of 64-bit words only in the bit
  // positions it is flipped in an odd number of words.
  const at::Tensor z63 = torch::randn({63}, at::kComplexFloat), x63 = torch::randn({63});
  const at::Tensor conj = z63.conj(), neg_view = at::_neg_view(x63);
  REQUIRE(conj.is_conj());
  REQUIRE(neg_view.is_neg());
  const std::vector<std::pair<at::Tensor, at::Tensor>> shown = {{conj, conj.resolve_conj()},
                                                                {neg_view, neg_view.resolve_neg()}};
  const std::vector<at::Tensor> bases = {z63, x63};
  for (std::size_t k = 0; k < shown.size(); ++k) {
    const at::Tensor &view = shown[k].first, &values = shown[k].second;
    CAPTURE(k);
    REQUIRE_FALSE((values.is_conj() || values.is_neg()));
    CHECK(tp::stats::crc32_hex(view) == tp::stats::crc32_hex(values));
    CHECK(tp::stats::xor64(view) == tp::stats::xor64(values));
    CHECK(tp::stats::crc32_hex(view) != tp::stats::crc32_hex(bases[k]));  // the base's bytes are other values
    CHECK(tp::stats::xor64(view) != tp::stats::xor64(bases[k]));
  }
}

TEST_CASE("a 0-d tensor shows its value in all four statistics, Norm keeping the sign") {
  const tp::TensorStats s = tp::stats::cpu_stats(torch::tensor(-3.0));
  CHECK(s.max.d == -3.0);
  CHECK(s.min.d == -3.0);
  CHECK(s.mean.d == -3.0);
  CHECK(s.norm.d == -3.0);
  const tp::TensorStats i = tp::stats::cpu_stats(torch::tensor(std::int64_t(5)));
  CHECK(i.max.kind == StatValue::Kind::Int);
  CHECK(i.max.i == 5);
  CHECK(i.norm.d == 5.0);
  const tp::TensorStats h = tp::stats::cpu_stats(torch::tensor(-2.5).to(at::kBFloat16));
  CHECK(h.norm.d == -2.5);
  const tp::TensorStats b = tp::stats::cpu_stats(torch::tensor(true));
  CHECK(b.max.b == true);
  CHECK(b.mean.is_null());
}

TEST_CASE("empty tensors and dtypes without a kernel get null statistics") {
  for (const at::Tensor& t :
       {torch::empty({0}), torch::empty({3, 0}, at::kHalf), torch::empty({0}, at::kBool),
        torch::empty({2, 2}, at::TensorOptions().device(at::kMeta)), torch::zeros({4}).to_sparse()}) {
    const tp::TensorStats s = tp::stats::cpu_stats(t);
    CHECK(s.max.is_null());
    CHECK(s.min.is_null());
    CHECK(s.mean.is_null());
    CHECK(s.norm.is_null());
  }
  CHECK_FALSE(tp::stats::has_cpu_kernel(at::kQInt8));
}

namespace {

void check_device_matches_cpu(const tp::TensorStats& got, const tp::TensorStats& want) {
  CHECK(got.max.kind == want.max.kind);
  CHECK(same_or_both_nan(got.max.as_double(), want.max.as_double()));
  CHECK(same_or_both_nan(got.min.as_double(), want.min.as_double()));
  CHECK(got.mean.kind == want.mean.kind);
  if (!want.mean.is_null()) {
    check_close(got.mean.d, want.mean.d, 1e-9);
    check_close(got.norm.d, want.norm.d, 1e-9);
  }
}

std::vector<at::Tensor> device_path_samples() {
  torch::manual_seed(9);
  return {torch::randn({100}),
          torch::randn({10, 10}).to(at::kHalf),
          torch::randn({5, 6}).to(at::kBFloat16).t(),
          torch::randint(-50, 50, {40}),
          torch::randint(0, 200, {33}).to(at::kByte),
          torch::randn({4}) > 0,
          torch::tensor(2.5),
          torch::tensor(std::int64_t(-4)),
          torch::randn({8}, at::kComplexFloat),
          torch::tensor({1.0f, NAN}),
          torch::tensor({1.0f, INFINITY, -2.0f}),
          torch::randn({3, 7}, at::kDouble)};
}

}  // namespace

TEST_CASE("the device path, forced on CPU tensors, agrees with the CPU kernels") {
  const std::vector<at::Tensor> tensors = device_path_samples();
  tp::stats::DeferredStats batch;
  for (const auto& t : tensors) batch.add(t);
  const std::vector<tp::TensorStats> got = batch.resolve();
  REQUIRE(got.size() == tensors.size());
  CHECK(batch.empty());
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    CAPTURE(k);
    check_device_matches_cpu(got[k], tp::stats::cpu_stats(tensors[k]));
  }
}

TEST_CASE("StatisticsTask::force_device_path defers the statistics and fills the same values at flush") {
  const std::vector<at::Tensor> tensors = device_path_samples();
  tp::Config config;
  tp::StatisticsTask cpu_task(config), device_task(config);
  device_task.force_device_path(true);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    CAPTURE(k);
    const tp::Site site{"/input_args/0", "input.0"};
    tp::Record cpu_record, device_record;
    const nlohmann::ordered_json want = cpu_task.describe(tensors[k], site, cpu_record);
    CHECK(cpu_record.pending.empty());
    device_record.body["input_args"] = nlohmann::ordered_json::array();
    device_record.body["input_args"].push_back(device_task.describe(tensors[k], site, device_record));
    REQUIRE(device_record.pending.size() == 1);
    CHECK(device_record.body["input_args"][0]["Max"].is_null());  // a placeholder until flush
    tp::stats::DeferredStats batch;
    const tp::PendingStats& p = device_record.pending[0];
    batch.add_reduced(p.values, p.dtype, p.zero_dim);
    const tp::TensorStats resolved = batch.resolve().at(0);
    tp::put_stats(device_record.body.at(nlohmann::ordered_json::json_pointer(p.pointer)), resolved);
    const nlohmann::ordered_json& got = device_record.body["input_args"][0];
    for (const char* key : {"type", "dtype", "shape", "requires_grad"}) CHECK(got[key] == want[key]);
    for (const char* key : {"Max", "Min"}) {
      CAPTURE(key);
      CHECK(got[key].type() == want[key].type());
      if (want[key].is_number())
        CHECK(same_or_both_nan(got[key].get<double>(), want[key].get<double>()));
      else
        CHECK(got[key] == want[key]);
    }
    for (const char* key : {"Mean", "Norm"}) {
      CAPTURE(key);
      if (want[key].is_null())
        CHECK(got[key].is_null());
      else
        check_close(got[key].get<double>(), want[key].get<double>(), 1e-9);
    }
  }
}

TEST_CASE("checksums: CRC-32 of the native bytes and the 64-bit XOR of little-endian words") {
  const at::Tensor t = torch::arange(10, at::kShort);  // 20 bytes: two full words and a padded one
  std::uint64_t want = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(t.data_ptr());
  for (int w = 0; w < 3; ++w) {
    std::uint64_t word = 0;
    for (int b = 0; b < 8 && w * 8 + b < 20; ++b) word |= std::uint64_t(p[w * 8 + b]) << (8 * b);
    want ^= word;
  }
  CHECK(tp::stats::xor64(t) == want);
  CHECK(tp::stats::xor64(t.t().contiguous()) == tp::stats::xor64(t));
  // Every length of the last word, 1 to 8 bytes, after zero to two full words: the same rule by hand.
  for (std::int64_t n = 1; n <= 24; ++n) {
    CAPTURE(n);
    const at::Tensor bytes = torch::randint(1, 256, {n}).to(at::kByte);
    const auto* q = bytes.data_ptr<std::uint8_t>();
    std::uint64_t by_hand = 0;
    for (std::int64_t k = 0; k < n; ++k) by_hand ^= std::uint64_t(q[k]) << (8 * (k % 8));
    CHECK(tp::stats::xor64(bytes) == by_hand);
  }
  // CRC-32 against python's zlib on the same bytes, for several dtypes including strided views.
  torch::manual_seed(15);
  const std::vector<at::Tensor> samples = {torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}),
                                           torch::arange(12, at::kLong).reshape({3, 4}).t(),
                                           torch::tensor({0.5, -1.5}, at::kBFloat16),
                                           torch::tensor({true, false, true}),
                                           torch::randn({6, 5}).to(at::kHalf).slice(1, 1, 5, 2),
                                           torch::randint(0, 255, {7, 3}).to(at::kByte).t()};
  std::string code = "import zlib\n";
  for (const auto& s : samples) {
    const at::Tensor c = s.contiguous();
    const auto* b = reinterpret_cast<const unsigned char*>(c.data_ptr());
    code += "print('%08x' % zlib.crc32(bytes([";
    for (std::int64_t k = 0; k < c.numel() * c.element_size(); ++k) code += std::to_string(b[k]) + ",";
    code += "])))\n";
  }
  int rc = 0;
  std::istringstream lines(tptest::run_python(code, &rc));
  REQUIRE(rc == 0);
  for (const auto& s : samples) {
    std::string want_hex;
    std::getline(lines, want_hex);
    CAPTURE(s.sizes());
    CHECK(tp::stats::crc32_hex(s) == want_hex);
  }
}

TEST_CASE("checksums of strided tensors hash the logical bytes without a copy, equal to the contiguous copy's") {
  torch::manual_seed(16);
  const at::Tensor m = torch::randn({300, 301});
  const std::vector<at::Tensor> views = {
      m.t(),
      m.slice(1, 3, 299, 2),
      m.select(1, 7),
      m.to(at::kBFloat16).slice(0, 1, 300, 3),
      m.slice(1, 0, 300),                                   // rows of 1200 bytes, gathered
      torch::randn({3, 2000}).slice(1, 0, 1500),            // rows of 6000 bytes: hashed in place
      torch::randn({2048, 4}).t(),                          // 2048 elements 16 bytes apart
      torch::randint(0, 100, {5, 1, 3}).expand({5, 4, 3}),  // stride 0 repeats bytes
      m.to(at::kDouble).slice(0, 0, 64).t(),
      m.to(at::kComplexFloat).slice(1, 0, 7).t(),
      torch::randint(0, 2, {33, 17}).to(at::kByte).t().slice(0, 0, 17, 3)};
  for (const at::Tensor& v : views) {
    CAPTURE(v.sizes());
    CAPTURE(v.strides());
    CHECK_FALSE(v.is_contiguous());
    const at::Tensor c = v.contiguous();
    CHECK(tp::stats::crc32_hex(v) == tp::stats::crc32_hex(c));
    CHECK(tp::stats::xor64(v) == tp::stats::xor64(c));
  }
  // One large case against python itself: 300x301 float32, transposed.
  const at::Tensor big = m.t();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("tp_crc_" + std::to_string(::getpid()) + ".bin")).string();
  {
    const at::Tensor c = big.contiguous();
    std::ofstream(path, std::ios::binary).write(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  }
  int rc = 0;
  const std::string out =
      tptest::run_python("import zlib\nprint('%08x' % zlib.crc32(open('" + path + "','rb').read()))\n", &rc);
  std::filesystem::remove(path);
  REQUIRE(rc == 0);
  CHECK(tp::stats::crc32_hex(big) + "\n" == out);
}
