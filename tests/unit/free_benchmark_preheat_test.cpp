// free_benchmark's preheat (task/free_benchmark/preheat.hpp): which calls are sampled per step, and
// the per-API, per-dtype threshold schedule, against values worked out by hand from msprobe's
// PreheatHandler rules (msprobe-reference.md §7.3).
#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <string>

#include "torchprobe/task/free_benchmark/preheat.hpp"

using torchprobe::free_benchmark::Preheat;
using torchprobe::free_benchmark::Sample;

namespace {

// Runs `calls` calls of `api` in `step` and returns the 1-based numbers of those sampled.
std::set<std::int64_t> sampled_in(Preheat& p, std::int64_t step, const std::string& api, int calls) {
  p.set_step(step);
  std::set<std::int64_t> chosen;
  for (int n = 1; n <= calls; ++n)
    if (p.sample(api)) chosen.insert(n);
  return chosen;
}

// A sample of a one-sample-per-step API compared with the CPU in `step`.
Sample cpu_sample(std::int64_t step, std::int64_t sampled = 1, std::int64_t per_step = 1) {
  return Sample{step, true, sampled, per_step};
}

}  // namespace

TEST_CASE("preheat step 0 only counts; later steps sample (preheat_step*(i-1)+step) % total, k of them") {
  Preheat p(/*preheat_step=*/3, /*max_sample=*/2);
  CHECK(sampled_in(p, 0, "Aten.mul", 40).empty());
  CHECK(p.total_count("Aten.mul") == 40);
  CHECK(p.per_step("Aten.mul") == 2);  // min(ceil(40 / 3) = 14, 2)
  CHECK(sampled_in(p, 1, "Aten.mul", 40) == std::set<std::int64_t>{1, 4});
  CHECK(sampled_in(p, 2, "Aten.mul", 40) == std::set<std::int64_t>{2, 5});
  CHECK(sampled_in(p, 3, "Aten.mul", 40) == std::set<std::int64_t>{3, 6});   // past the preheat: still sampled
  CHECK(sampled_in(p, 41, "Aten.mul", 40) == std::set<std::int64_t>{1, 4});  // 41 % 40, 44 % 40
  // An API not called in step 0 is never sampled.
  CHECK(sampled_in(p, 4, "Aten.add", 10).empty());
}

TEST_CASE("preheat samples ceil(total / preheat_step) calls per step, at most max_sample") {
  Preheat p(15, 20);
  sampled_in(p, 0, "Aten.addmm", 40);
  CHECK(sampled_in(p, 1, "Aten.addmm", 40) == std::set<std::int64_t>{1, 16, 31});  // k = ceil(40 / 15) = 3
  Preheat few(15, 20);
  sampled_in(few, 0, "Aten.gelu", 5);
  CHECK(sampled_in(few, 1, "Aten.gelu", 5) == std::set<std::int64_t>{1});
  CHECK(sampled_in(few, 5, "Aten.gelu", 5) == std::set<std::int64_t>{5});  // 5 % 5 == 0 reads as 5
  CHECK(sampled_in(few, 7, "Aten.gelu", 5) == std::set<std::int64_t>{2});
  // Over preheat_step steps every call number is sampled once.
  Preheat cover(4, 20);
  sampled_in(cover, 0, "Aten.mm", 10);  // k = 3
  std::set<std::int64_t> seen;
  for (std::int64_t step = 1; step <= 4; ++step)
    for (std::int64_t n : sampled_in(cover, step, "Aten.mm", 10)) seen.insert(n);
  CHECK(seen.size() == 10);
}

TEST_CASE("a preheat sample is compared with the CPU in steps 1 to preheat_step - 1 only") {
  Preheat p(3, 20);
  sampled_in(p, 0, "Aten.mul", 1);
  for (std::int64_t step : {1, 2, 3, 4}) {
    p.set_step(step);
    const auto s = p.sample("Aten.mul");
    REQUIRE(s);
    CHECK(s->with_cpu == (step < 3));
    CHECK(s->sampled == 1);
    CHECK(s->per_step == 1);
  }
}

TEST_CASE("CPU-consistent samples halve thd - 1 from 2.05 each step, down to the dtype's default") {
  Preheat p(15, 20);
  // thd after each step: 1 + 1.05 / 2^n, until fp16's 1.002 (n = 10 would give 1.0010...).
  const double expected[] = {1.525,       1.2625,       1.13125,       1.065625, 1.0328125, 1.01640625,
                             1.008203125, 1.0041015625, 1.00205078125, 1.002,    1.002};
  CHECK(p.threshold("Aten.mul", "torch.float16") == 2.05);
  std::int64_t step = 1;
  for (double thd : expected) {
    p.learn("Aten.mul", cpu_sample(step++), "torch.float16", 1.002, /*max_ratio=*/1.0, /*cpu_consistent=*/true);
    CHECK(p.threshold("Aten.mul", "torch.float16") == doctest::Approx(thd).epsilon(1e-12));
  }
  // Each API and dtype has its own: fp32's default is 1.0002, reached after 13 halvings (1.000128...).
  for (std::int64_t s = 1; s <= 12; ++s) p.learn("Aten.add", cpu_sample(s), "torch.float32", 1.0002, 1.0, true);
  CHECK(p.threshold("Aten.add", "torch.float32") == doctest::Approx(1.0 + 1.05 / 4096).epsilon(1e-12));
  p.learn("Aten.add", cpu_sample(13), "torch.float32", 1.0002, 1.0, true);
  CHECK(p.threshold("Aten.add", "torch.float32") == 1.0002);
  CHECK(p.threshold("Aten.add", "torch.float16") == 2.05);
}

TEST_CASE("a CPU-consistent ratio above the threshold doubles thd - 1 (a miss)") {
  Preheat p(15, 20);
  p.learn("Aten.mul", cpu_sample(1), "torch.bfloat16", 1.004, 3.0, true);
  CHECK(p.threshold("Aten.mul", "torch.bfloat16") == doctest::Approx(3.1));  // 1 + 1.05 * 2
}

TEST_CASE("CPU-inconsistent samples set the threshold to their smallest ratio and end the preheat") {
  Preheat p(15, 20);
  p.learn("Aten.sum", cpu_sample(1), "torch.float16", 1.002, 1.5, false);
  CHECK(p.threshold("Aten.sum", "torch.float16") == 1.5);  // min(1.5, 2.05)
  CHECK_FALSE(p.preheating("Aten.sum", "torch.float16"));
  p.learn("Aten.sum", cpu_sample(2), "torch.float16", 1.002, 1.0, true);
  CHECK(p.threshold("Aten.sum", "torch.float16") == 1.5);  // no longer adapted

  // Both kinds in a step (k = 2): the smallest inconsistent ratio when above every consistent one...
  Preheat q(15, 20);
  q.learn("Aten.mm", cpu_sample(1, 1, 2), "torch.float16", 1.002, 1.1, true);
  CHECK(q.threshold("Aten.mm", "torch.float16") == 2.05);  // adapted after the step's k-th sample only
  q.learn("Aten.mm", cpu_sample(1, 2, 2), "torch.float16", 1.002, 1.8, false);
  CHECK(q.threshold("Aten.mm", "torch.float16") == 1.8);
  CHECK_FALSE(q.preheating("Aten.mm", "torch.float16"));
  // ...else unchanged, and still preheating.
  Preheat r(15, 20);
  r.learn("Aten.mm", cpu_sample(1, 1, 2), "torch.float16", 1.002, 1.9, true);
  r.learn("Aten.mm", cpu_sample(1, 2, 2), "torch.float16", 1.002, 1.2, false);
  CHECK(r.threshold("Aten.mm", "torch.float16") == 2.05);
  CHECK(r.preheating("Aten.mm", "torch.float16"));
}
