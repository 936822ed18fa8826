// The planner's speed targets (issue: at least 10,000 configurations
// evaluated per second; a full search for a 1T model on 3072 GPUs in under
// 10 s):
//   build/bench/planner_bench
// BM_Estimate's items_per_second is configurations per second for one
// layout; the searches report theirs as the counter "layouts_per_s".
#include <benchmark/benchmark.h>

#include "brigade/sim/model_presets.h"
#include "brigade/sim/search.h"
#include "brigade/sim/validation.h"

namespace brigade::sim {
namespace {

void BM_Estimate(benchmark::State& state) {
  const Workload job = preset_workload("1t");
  const Hardware& hw = hardware_by_name("a100-80g");
  const Layout layout = Layout::parse("tp=8,pp=64,dp=6,vp=2,zero=1,recompute=full,micro=1");
  for (auto _ : state) benchmark::DoNotOptimize(estimate(job, layout, hw));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Estimate);

void search(benchmark::State& state, const char* model, int64_t gpus, const char* device) {
  const Workload job = preset_workload(model);
  const Hardware& hw = hardware_by_name(device);
  int64_t layouts = 0;
  for (auto _ : state) {
    const SearchResult r = search_layouts(job, gpus, hw);
    layouts += r.evaluated + r.invalid;
    benchmark::DoNotOptimize(r);
  }
  state.counters["layouts_per_s"] =
      benchmark::Counter(static_cast<double>(layouts), benchmark::Counter::kIsRate);
}

void BM_Search1TOn3072A100(benchmark::State& state) {
  search(state, "1t", 3072, "a100-80g");
}
BENCHMARK(BM_Search1TOn3072A100)->Unit(benchmark::kMillisecond);

void BM_Search175BOn1024H100(benchmark::State& state) {
  search(state, "175b", 1024, "h100-80g");
}
BENCHMARK(BM_Search175BOn1024H100)->Unit(benchmark::kMillisecond);

void BM_SearchGpt2SmallOn16384H100(benchmark::State& state) {
  search(state, "gpt2-small", 16384, "h100-80g");
}
BENCHMARK(BM_SearchGpt2SmallOn16384H100)->Unit(benchmark::kMillisecond);

void BM_ValidateAllPublishedRows(benchmark::State& state) {
  const std::vector<PublishedRun> runs = parse_published_runs(builtin_published_csv());
  for (auto _ : state) benchmark::DoNotOptimize(validate(runs));
}
BENCHMARK(BM_ValidateAllPublishedRows)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace brigade::sim

BENCHMARK_MAIN();
