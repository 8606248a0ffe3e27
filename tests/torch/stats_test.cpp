// Statistics of every dtype and layout against ATen computed in float64 on a copy.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/stats/cpu_stats.hpp>
#include <torchprobe/stats/device_stats.hpp>
#include <torchprobe/stats/checksum.hpp>

#include <cmath>
#include <sstream>

#include "test_support.hpp"

namespace tp = torchprobe;
using tp::StatValue;

namespace {

bool same_or_both_nan(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

void check_close(double got, double want, double rel = 1e-6) {
  if (std::isnan(want) || std::isinf(want)) {
    CHECK(same_or_both_nan(got, want));
  } else {
    CHECK(std::abs(got - want) <= rel * std::max(1.0, std::abs(want)));
  }
}

// The float64 reference: ATen on a float64 copy (|z| for complex), one reduction per statistic.
struct Reference {
  double max, min, mean, norm;
};
Reference reference_of(const at::Tensor& t) {
  at::Tensor d = t.is_complex() ? t.to(at::kComplexDouble).abs() : t.to(at::kDouble);
  return {d.max().item<double>(), d.min().item<double>(), d.mean().item<double>(), d.norm().item<double>()};
}

void check_against_reference(const at::Tensor& t) {
  CAPTURE(t.scalar_type());
  CAPTURE(t.sizes());
  const tp::TensorStats s = tp::stats::cpu_stats(t);
  const Reference r = reference_of(t);
  const bool integral = at::isIntegralType(t.scalar_type(), /*includeBool=*/false);
  CHECK(s.max.kind == (integral ? StatValue::Kind::Int : StatValue::Kind::Float));
  CHECK(same_or_both_nan(s.max.as_double(), r.max));  // Max/Min exact
  CHECK(same_or_both_nan(s.min.as_double(), r.min));
  check_close(s.mean.as_double(), r.mean);
  check_close(s.norm.as_double(), r.norm);
}

}  // namespace

TEST_CASE("statistics of every real and complex dtype equal ATen's in float64") {
  torch::manual_seed(7);
  const at::Tensor base = torch::randn({37, 29}) * 50;
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kComplexFloat, at::kComplexDouble}) {
    check_against_reference(base.to(dtype));
  }
  for (auto dtype : {at::kChar, at::kShort, at::kInt, at::kLong}) {
    check_against_reference(base.to(dtype));
  }
  check_against_reference(base.abs().clamp_max(255).to(at::kByte));
  // int64 values far beyond float range keep their exact Max/Min
  const at::Tensor big = torch::tensor({std::int64_t(1) << 60, -(std::int64_t(1) << 59), std::int64_t(3)});
  const tp::TensorStats s = tp::stats::cpu_stats(big);
  CHECK(s.max.i == (std::int64_t(1) << 60));
  CHECK(s.min.i == -(std::int64_t(1) << 59));
}

TEST_CASE("non-contiguous tensors give the statistics of their elements, not of their storage") {
  torch::manual_seed(8);
  const at::Tensor m = torch::randn({64, 48});
  for (const at::Tensor& v : {m.t(), m.slice(0, 3, 60, 7), m.select(1, 5), m.unsqueeze(0).expand({3, 64, 48})}) {
    CHECK_FALSE(v.is_contiguous());
    check_against_reference(v);
    check_against_reference(v.to(at::kBFloat16));
  }
}

TEST_CASE("a NaN anywhere makes all four statistics NaN, for every float dtype") {
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    for (std::int64_t n : {1, 7, 16, 33, 1000}) {
      for (std::int64_t at_index : {std::int64_t(0), n / 2, n - 1}) {
        at::Tensor t = torch::randn({n}).to(dtype);
        t[at_index] = std::nan("");
        const tp::TensorStats s = tp::stats::cpu_stats(t);
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

TEST_CASE("infinities follow torch: inf and -inf give Max inf, Min -inf, Mean NaN, Norm inf") {
  const tp::TensorStats s = tp::stats::cpu_stats(torch::tensor({INFINITY, -INFINITY, 1.0f}));
  CHECK(s.max.d == INFINITY);
  CHECK(s.min.d == -INFINITY);
  CHECK(std::isnan(s.mean.d));
  CHECK(s.norm.d == INFINITY);
  const tp::TensorStats neg = tp::stats::cpu_stats(torch::full({3}, -INFINITY, at::kHalf));
  CHECK(neg.max.d == -INFINITY);
  CHECK(neg.mean.d == -INFINITY);
  CHECK(neg.norm.d == INFINITY);
}

TEST_CASE("fp16 statistics are accumulated in double, not in half precision") {
  // 60000 * 8 overflows fp16's range; ATen's own fp16 mean would too (libtorch-notes §6).
  const at::Tensor h = torch::full({8}, 60000.0, at::kHalf);
  const tp::TensorStats s = tp::stats::cpu_stats(h);
  CHECK(s.mean.d == doctest::Approx(60000.0));
  CHECK(s.norm.d == doctest::Approx(60000.0 * std::sqrt(8.0)));
}

TEST_CASE("bool tensors: Max is any, Min is all, Mean and Norm are null") {
  const tp::TensorStats s = tp::stats::cpu_stats(torch::tensor({true, false, true}));
  CHECK(s.max.kind == StatValue::Kind::Bool);
  CHECK(s.max.b == true);
  CHECK(s.min.b == false);
  CHECK(s.mean.is_null());
  CHECK(s.norm.is_null());
  CHECK(tp::stats::cpu_stats(torch::tensor({true, true})).min.b == true);
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
}

TEST_CASE("empty tensors and dtypes without a kernel get null statistics") {
  for (const at::Tensor& t : {torch::empty({0}), torch::empty({3, 0}, at::kHalf), torch::empty({0}, at::kBool)}) {
    const tp::TensorStats s = tp::stats::cpu_stats(t);
    CHECK(s.max.is_null());
    CHECK(s.min.is_null());
    CHECK(s.mean.is_null());
    CHECK(s.norm.is_null());
  }
  CHECK(tp::stats::cpu_stats(torch::empty({2, 2}, at::TensorOptions().device(at::kMeta))).max.is_null());
}

TEST_CASE("the device path, forced on CPU tensors, agrees with the CPU kernels") {
  torch::manual_seed(9);
  std::vector<at::Tensor> tensors = {torch::randn({100}), torch::randn({10, 10}).to(at::kHalf),
                                     torch::randn({5, 6}).to(at::kBFloat16), torch::randint(-50, 50, {40}),
                                     torch::randn({4}) > 0, torch::tensor(2.5), torch::randn({8}, at::kComplexFloat),
                                     torch::tensor({1.0f, NAN})};
  tp::stats::DeferredStats batch;
  for (const auto& t : tensors) batch.add(t);
  const std::vector<tp::TensorStats> got = batch.resolve();
  REQUIRE(got.size() == tensors.size());
  CHECK(batch.empty());
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    CAPTURE(k);
    const tp::TensorStats want = tp::stats::cpu_stats(tensors[k]);
    CHECK(got[k].max.kind == want.max.kind);
    CHECK(same_or_both_nan(got[k].max.as_double(), want.max.as_double()));
    CHECK(same_or_both_nan(got[k].min.as_double(), want.min.as_double()));
    CHECK(got[k].mean.kind == want.mean.kind);
    if (!want.mean.is_null()) {
      check_close(got[k].mean.d, want.mean.d, 1e-9);
      check_close(got[k].norm.d, want.norm.d, 1e-9);
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
  // CRC-32 against python's zlib on the same bytes, for several dtypes including a strided view.
  const std::vector<at::Tensor> samples = {torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}), torch::arange(12, at::kLong).reshape({3, 4}).t(),
                                           torch::tensor({0.5, -1.5}, at::kBFloat16), torch::tensor({true, false, true})};
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
    std::string want;
    std::getline(lines, want);
    CHECK(tp::stats::crc32_hex(s) == want);
  }
}
