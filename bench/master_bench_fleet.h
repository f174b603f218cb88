// The master at fleet scale, a part of mc_master_bench (bench/README.md "Master at fleet scale"):
// MC_BENCH_FLEET_CLIENTS clients (default 1,000) registered and heartbeating through gRPC,
// MC_BENCH_FLEET_KEYS keys (default 10,000,000) resident, leased lookups of 1,024 keys and their
// release from 1, 2 and 4 callers, over gRPC or the master lane, the release as an RPC of its own
// or carried in the next lookup. Registered only with MC_BENCH_FLEET=1.
#pragma once

namespace mc::master::bench {

// Adds BM_Fleet_GetReplicas/keys:1024/lane:{0,1}/carry:{0,1} at 1, 2 and 4 callers; the fleet
// is built on first use.
void RegisterFleetBenchmarks();
// Stops the fleet's heartbeats and master, if a fleet benchmark built one.
void StopFleetIfStarted();

}  // namespace mc::master::bench
