// mc-client's HTML status page (/status.html and / on its admin endpoint): this daemon at a
// glance for an operator with a browser: its status line as rows (id, registration, segments,
// data endpoint, buffers, leases, SSD tier), gets (hits and misses) and puts by outcome,
// checksum mismatches and refused callers. Built from the status line and the daemon's metrics
// only. Thread-safe.
#pragma once

#include <string>

#include "common/metrics.h"

namespace mc::client {

std::string ClientStatusHtml(const std::string& status_line, const MetricsRegistry& metrics);

}  // namespace mc::client
