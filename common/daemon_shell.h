// The shell mc-master and mc-client run in: the command line, logging, signals, the process's
// file-descriptor limit, starting the server, waiting for SIGINT/SIGTERM and stopping it. A
// daemon's main only declares its flags, turns them into its options struct, and asks the
// options to Validate() themselves (every problem at once, each naming its flag).
//
// Not for tools (mc-admin, mc-bench): they exit after one command. Thread-compatible: call from
// the main thread, in the order of the functions below.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/auth.h"
#include "common/http_admin.h"

namespace mc::daemon {

// First thing in main(): turns absl's mutex deadlock detection off (common/util.h), ignores
// SIGPIPE (a peer that closes while we write fails that write), blocks SIGINT and SIGTERM in
// every thread started later (Serve() waits for them), and parses the command line
// (--flagfile=FILE works).
void Init(int argc, char** argv, const char* usage);

// Every problem found in a daemon's flags, in the order found.
class Problems {
 public:
  void Add(std::string problem) { list_.push_back(std::move(problem)); }
  // Adds `problem` unless `ok`.
  void Check(bool ok, std::string problem) {
    if (!ok) Add(std::move(problem));
  }
  // The value of `parsed`, or T{} with "--flag: <its error>" recorded.
  template <typename T>
  T Take(std::string_view flag, absl::StatusOr<T> parsed) {
    if (parsed.ok()) return *std::move(parsed);
    AddStatus(flag, parsed.status());
    return T{};
  }
  void AddStatus(std::string_view flag, const absl::Status& status);
  void Append(const std::vector<std::string>& more) {
    list_.insert(list_.end(), more.begin(), more.end());
  }
  const std::vector<std::string>& list() const { return list_; }

 private:
  std::vector<std::string> list_;
};

// Prints each problem on its own line to stderr, prefixed with the daemon's name; true when
// there is none (the main then goes on; otherwise it exits 2).
bool Report(std::string_view daemon, const Problems& problems);

// Sets the log level ("trace" ... "off"), or records the problem under --log_level.
void ApplyLogLevel(std::string_view level, Problems& problems);

// What the flags both daemons share give (they are defined in daemon_shell.cc, once for both):
// --auth and --cluster_secret_file (the cluster keys), and the admin HTTP server's limits
// --http_max_connections, --http_max_connections_per_peer and --http_request_timeout_ms.
struct SharedOptions {
  auth::ClusterKeysPtr cluster_keys;  // null with --auth=false
  AdminServerOptions admin;           // limits only; the daemon sets host, port and metrics
};

// After Init(): applies --log_level, then reads the other shared flags; a flag that cannot be
// used is recorded in `problems` under its name. `member_credential_file` (mc-client's
// --member_credential_file; empty on mc-master) is the alternative to --cluster_secret_file.
SharedOptions SharedFromFlags(Problems& problems, const std::string& member_credential_file = "");

// Raises the soft RLIMIT_NOFILE to the hard limit (a daemon under systemd's default starts at
// 1,024) and logs the limit in force; returns it.
uint64_t RaiseFdLimit(std::string_view logger);

// What Serve() calls besides the server: `on_started` once Start() succeeded (start-up facts
// for the log), `exit_status` after the stop signal (default 0).
struct ServeHooks {
  std::function<void()> on_started;
  std::function<int()> exit_status;
};

// Runs a server (Start(), Shutdown()): starts it, waits for SIGINT/SIGTERM, stops it. Returns
// the exit status: 1 when Start failed (logged), else hooks.exit_status().
template <typename Server>
int Serve(std::string_view logger, Server& server, const ServeHooks& hooks = {});

// Serve's parts, for the template.
bool StartOrLog(std::string_view logger, const absl::Status& started);
int WaitForStopSignal(std::string_view logger);

template <typename Server>
int Serve(std::string_view logger, Server& server, const ServeHooks& hooks) {
  if (!StartOrLog(logger, server.Start())) return 1;
  if (hooks.on_started) hooks.on_started();
  WaitForStopSignal(logger);
  int status = hooks.exit_status ? hooks.exit_status() : 0;
  server.Shutdown();
  return status;
}

}  // namespace mc::daemon
