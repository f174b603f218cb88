// The master's HTML status page (/status.html and / on its admin endpoint): the cluster at a
// glance for an operator with a browser: role, capacity per tier, evictions, lost objects,
// corrupt replicas, refused callers and one row per client. Built from the service's snapshot,
// its client list and the master's metrics; the client table is bounded (kMaxClientRows).
// Thread-safe (as the service is).
#pragma once

#include <cstddef>
#include <string>

#include "common/clock.h"
#include "common/metrics.h"
#include "master/leader_election.h"
#include "master/metadata_service.h"

namespace mc::master {

inline constexpr size_t kMaxClientRows = 500;

// `election` may be null (a single master, no etcd).
std::string MasterStatusHtml(MetadataService& service, const LeaderElection* election,
                             const MetricsRegistry& metrics, const Clock& clock);

}  // namespace mc::master
