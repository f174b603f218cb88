// The admin endpoint's HTML status page (/status.html and /): an operator's first look at a
// daemon in a browser. A page is a title, the daemon's one-line status (as /status serves it),
// sections of label/value rows and tables; RenderStatusPageHtml turns it into one
// self-contained document: no script, no external asset, inline CSS only, and a
// Content-Security-Policy that forbids anything else, so a value that slipped through escaping
// still could not run. Every text that comes from data (client ids, hosts, labels) is escaped.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/metrics.h"

namespace mc {

struct StatusPage {
  struct Row {
    std::string label;
    std::string value;
    bool alert = false;  // drawn as a problem (lost objects, mismatches, refusals)
  };
  struct Section {
    std::string title;
    std::vector<Row> rows;
  };
  struct Table {
    std::string title;
    std::vector<std::string> columns;
    std::vector<std::vector<std::string>> rows;
    size_t omitted = 0;  // rows left out to bound the page ("... and N more")
  };
  std::string title;        // e.g. "mc-master"
  std::string status_line;  // the daemon's /status line
  std::vector<Section> sections;
  std::vector<Table> tables;
  int refresh_seconds = 10;  // the browser reloads the page this often; 0 = never
};

// `s` with & < > " ' replaced by character references; control characters other than tab and
// newline become U+FFFD. Safe in element content and in quoted attribute values.
std::string HtmlEscape(std::string_view s);

// The complete HTML document of `page`.
std::string RenderStatusPageHtml(const StatusPage& page);

// The rows of a status line "Key: value | Key: value | ..." (the format of both daemons' /status
// lines); a part without ": " becomes a row labelled by its first word ("Client id-1" gives
// Client = id-1).
std::vector<StatusPage::Row> StatusLineRows(std::string_view line);

// Sums of a registry's series, for rows: `name` over the series whose labels include `match`.
// Integral values print without decimals.
std::string MetricValue(const MetricsRegistry& registry, const std::string& name,
                        const Labels& match = {});
// One row per series of `name` with a non-zero value, labelled "`prefix` <value of `label`>",
// plus a total row first; alert rows when `alert_if_nonzero`.
void AddMetricBreakdown(StatusPage::Section& section, const MetricsRegistry& registry,
                        const std::string& title, const std::string& name, const std::string& label,
                        bool alert_if_nonzero, const Labels& match = {});

}  // namespace mc
