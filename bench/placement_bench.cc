// Placement cost vs segments that have no room (junk or full segments must not slow
// every put). N clients each register 16 full 4 KiB segments; two clients have room. Each
// iteration places one 8 KiB replica and frees it. Prints ns per placement for each N; compare
// across N within one run (the figure should stay flat).
//   build/bench/mc_placement_bench [--benchmark_min_time=0.2]
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "master/segment_manager.h"

namespace {

void BM_PlaceWithFullSegments(benchmark::State& state) {
  mc::master::SegmentManager sm(64);
  const int junk_clients = static_cast<int>(state.range(0));
  for (int c = 0; c < junk_clients; ++c) {
    const std::string id = "junk" + std::to_string(c);
    for (int k = 0; k < 16; ++k) {
      sm.AddSegment(id, "j", 4096);
      if (!sm.Place(4096, 1, id).ok()) state.SkipWithError("could not fill a junk segment");
    }
  }
  sm.AddSegment("roomy", "r", 64 << 20);
  sm.AddSegment("roomier", "r2", 64 << 20);
  for (auto _ : state) {
    auto placed = sm.Place(8192, 1, "");
    if (!placed.ok()) {
      state.SkipWithError("placement failed");
      break;
    }
    sm.Free((*placed)[0]);
  }
  state.counters["segments"] = junk_clients * 16 + 2;
}
BENCHMARK(BM_PlaceWithFullSegments)->Arg(0)->Arg(100)->Arg(1000)->Arg(10000);

}  // namespace

BENCHMARK_MAIN();
