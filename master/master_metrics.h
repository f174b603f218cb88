// Metric families that more than one master component increments, each registered with its one
// help text here (the registry keeps the first help text it sees, so copies would drift
// silently). Pure helpers over MetricsRegistry; thread-safe as it is.
#pragma once

#include <string>

#include "common/metrics.h"

namespace mc::master {

// mc_objects_lost_total{reason}: acknowledged objects dropped with their last copy (Evictor:
// evicted_unpersisted; TieringService: ssd_reclaimed, corrupt; ReplicaRepair: corrupt).
inline Counter& ObjectsLostCounter(MetricsRegistry& metrics, const std::string& reason) {
  return metrics.GetCounter("mc_objects_lost_total",
                            "Acknowledged objects dropped with their last copy, by reason (every "
                            "tier that could hold them was full, failing or absent)",
                            {{"reason", reason}});
}

// mc_replicas_dropped_total{tier,reason}: replicas dropped because they failed verification when
// read (ReplicaRepair: memory; TieringService: disk).
inline Counter& ReplicasDroppedCounter(MetricsRegistry& metrics, const std::string& tier,
                                       const std::string& reason) {
  return metrics.GetCounter(
      "mc_replicas_dropped_total",
      "Replicas dropped because they failed verification when read, by tier and reason",
      {{"tier", tier}, {"reason", reason}});
}

}  // namespace mc::master
