#include "common/daemon_shell.h"

#include <pthread.h>
#include <sys/resource.h>

#include <csignal>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/util.h"

// The flags both daemons share (docs/operations.md lists them under each daemon).
ABSL_FLAG(int32_t, http_max_connections, 64, "admin HTTP: most open connections");
ABSL_FLAG(int32_t, http_max_connections_per_peer, 16,
          "admin HTTP: most open connections from one IP address");
ABSL_FLAG(int64_t, http_request_timeout_ms, 2000,
          "admin HTTP: a request must arrive and its answer leave within this");
ABSL_FLAG(bool, auth, true,
          "authenticate every daemon-to-daemon call with the cluster secret (docs/security.md); "
          "false = an unauthenticated cluster, for benchmarks and single-user hosts");
ABSL_FLAG(std::string, cluster_secret_file, "",
          "the cluster secret file shared by mc-master, every mc-client and mc-admin (mode 0600; "
          "`mc-admin gen-secret FILE` makes one); needed unless --auth=false (or, on mc-client, "
          "--member_credential_file)");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error|off");

namespace mc::daemon {

namespace {

sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void Init(int argc, char** argv, const char* usage) {
  absl::SetProgramUsageMessage(usage);
  DisableMutexDeadlockDetection();
  signal(SIGPIPE, SIG_IGN);
  sigset_t stop = StopSignals();
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  absl::ParseCommandLine(argc, argv);
}

void Problems::AddStatus(std::string_view flag, const absl::Status& status) {
  Add(absl::StrCat(std::string(flag), ": ", std::string(status.message())));
}

bool Report(std::string_view daemon, const Problems& problems) {
  for (const std::string& p : problems.list()) {
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(daemon.size()), daemon.data(), p.c_str());
  }
  return problems.list().empty();
}

void ApplyLogLevel(std::string_view level, Problems& problems) {
  problems.Check(SetLogLevel(level), absl::StrCat("--log_level=", std::string(level),
                                                  " is not one of trace, debug, info, warn, "
                                                  "error, off"));
}

SharedOptions SharedFromFlags(Problems& problems, const std::string& member_credential_file) {
  ApplyLogLevel(absl::GetFlag(FLAGS_log_level), problems);
  SharedOptions shared;
  shared.cluster_keys = problems.Take(
      member_credential_file.empty() ? "--cluster_secret_file" : "--member_credential_file",
      auth::KeysFromFlags(absl::GetFlag(FLAGS_auth), absl::GetFlag(FLAGS_cluster_secret_file),
                          member_credential_file));
  shared.admin.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  shared.admin.max_connections_per_peer = absl::GetFlag(FLAGS_http_max_connections_per_peer);
  shared.admin.request_timeout_ms = absl::GetFlag(FLAGS_http_request_timeout_ms);
  return shared;
}

uint64_t RaiseFdLimit(std::string_view logger) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  uint64_t before = lim.rlim_cur;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  Logger(logger).info("file descriptors: {} (soft limit raised from {}; hard limit {})",
                      static_cast<uint64_t>(lim.rlim_cur), before,
                      static_cast<uint64_t>(lim.rlim_max));
  return lim.rlim_cur;
}

bool StartOrLog(std::string_view logger, const absl::Status& started) {
  if (started.ok()) return true;
  Logger(logger).error("cannot start: {}", started.ToString());
  return false;
}

int WaitForStopSignal(std::string_view logger) {
  sigset_t stop = StopSignals();
  int sig = 0;
  sigwait(&stop, &sig);
  Logger(logger).info("signal {}: shutting down", sig);
  return sig;
}

}  // namespace mc::daemon
