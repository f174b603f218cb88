// mc-master: flags -> MasterServerOptions -> MasterServer, in the daemon shell
// (common/daemon_shell.h).
#include <signal.h>
#include <unistd.h>

#include <atomic>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "common/auth.h"
#include "common/daemon_shell.h"
#include "common/logging.h"
#include "common/util.h"
#include "master/master_server.h"
#include "proto/protobuf_log.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC HOST:PORT (port 0 = pick a free port)");
ABSL_FLAG(std::string, http, "127.0.0.1:0",
          "admin HTTP HOST:PORT (/metrics /status /healthz); empty = off");
ABSL_FLAG(std::string, ready_file, "",
          "write {\"grpc\":..., \"http\":..., \"lane\":...} here once serving");
ABSL_FLAG(int64_t, lease_ttl_ms, 5000, "default read-lease TTL");
ABSL_FLAG(int64_t, max_lease_ttl_ms, 600000, "longest read-lease TTL a caller may ask for");
ABSL_FLAG(int64_t, client_ttl_ms, 10000, "a client silent this long is dropped with its segments");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 1000, "heartbeat interval told to clients");
ABSL_FLAG(int64_t, put_timeout_ms, 60000,
          "a put neither ended nor revoked this long after PutStart is revoked; writers stop "
          "writing at half of it");
ABSL_FLAG(double, high_watermark, 0.95, "background eviction starts above this fraction used");
ABSL_FLAG(double, low_watermark, 0.90, "background eviction evicts down to this fraction");
ABSL_FLAG(double, offload_watermark, 0.5,
          "above this fraction of memory used, cold objects are persisted to clients' SSD tiers");
ABSL_FLAG(uint64_t, max_object_size, 1ull << 30, "largest object, bytes");
ABSL_FLAG(uint64_t, min_segment_size, 64 << 10, "smallest segment a client may register, bytes");
ABSL_FLAG(uint64_t, max_segment_size, 1ull << 46, "largest segment a client may register, bytes");
ABSL_FLAG(uint64_t, max_segments_per_client, 256, "most segments one client may register");
ABSL_FLAG(uint32_t, max_replicas, 8, "most memory replicas one put may ask for");
ABSL_FLAG(uint32_t, shards, 32, "object table shards");
ABSL_FLAG(int64_t, maintenance_interval_ms, 200,
          "period of liveness/timeout/lease/eviction sweeps");
ABSL_FLAG(uint64_t, max_batch_items, 100000, "most keys in one batched RPC");
ABSL_FLAG(int64_t, grpc_handshake_timeout_ms, 5000,
          "gRPC: a connection that has not completed its HTTP/2 handshake within this is closed "
          "(100..120000)");
ABSL_FLAG(int64_t, auth_max_clock_skew_ms, 60000,
          "a registration or admin proof is accepted while its time is within this of the "
          "master's clock (either way); its nonce is remembered for twice this");
ABSL_FLAG(std::string, revoked_members_file, "",
          "revoked member credentials, one `CLIENT_ID SERIAL` or `CLIENT_ID *` a line; re-read "
          "when it changes; a revoked member cannot register and its session ends at the next "
          "maintenance pass; unreadable = every member registration refused (docs/security.md)");
ABSL_FLAG(uint64_t, auth_replay_cache_entries, 100000,
          "most proof nonces remembered against replay; more proofs inside one window are refused");
ABSL_FLAG(int64_t, client_takeover_after_ms, 3000,
          "with --auth: a registration for a client id whose live session it cannot prove its own "
          "(a restarted daemon) waits until that session has missed heartbeats this long");
ABSL_FLAG(int64_t, object_report_timeout_ms, 30000,
          "a client that registers saying it will report its objects (after a master restart or "
          "its own return) gets no new placement in its segments until its report ends, or this "
          "long after its registration at the latest");
ABSL_FLAG(uint64_t, forget_batch, 65536,
          "most freed replica ranges one heartbeat answer hands their owner (more_forgotten: "
          "more remain)");
ABSL_FLAG(uint64_t, forget_queue_limit, 1048576,
          "most freed replica ranges queued per client between heartbeats; beyond it the oldest "
          "are dropped (mc_master_forget_dropped_total)");
ABSL_FLAG(std::string, etcd_endpoints, "",
          "standby masters: comma list of etcd http://HOST:PORT or https://HOST:PORT; the master "
          "holding the election "
          "key serves, the others answer UNAVAILABLE naming it; empty = no election, this master "
          "leads");
ABSL_FLAG(std::string, etcd_ca_file, "",
          "CA bundle that etcd's certificate must verify against (https:// endpoints); empty = "
          "the system's CAs");
ABSL_FLAG(std::string, etcd_cert_file, "",
          "client certificate (PEM) presented to etcd (etcd --client-cert-auth); with "
          "--etcd_key_file");
ABSL_FLAG(std::string, etcd_key_file, "", "private key (PEM) of --etcd_cert_file");
ABSL_FLAG(std::string, etcd_user, "",
          "etcd user to authenticate as (etcd auth enabled); its password is read from "
          "--etcd_password_file");
ABSL_FLAG(std::string, etcd_password_file, "",
          "file holding --etcd_user's password (one line; mode 0600 or stricter, else refused)");
ABSL_FLAG(std::string, etcd_prefix, "/mcstore/",
          "etcd key prefix; the election key is prefix+leader");
ABSL_FLAG(std::string, advertise_address, "",
          "the gRPC HOST:PORT clients reach this master at (the election key's value); empty = "
          "the bound --listen address; must name a host with --etcd_endpoints");
ABSL_FLAG(int64_t, leader_ttl_s, 3,
          "etcd lease TTL of the leadership: a dead leader is replaced about this long after it "
          "stopped; a leader whose lease refresh is overdue stops serving");
ABSL_FLAG(std::string, tls_cert_file, "",
          "serve gRPC over TLS with this certificate chain (PEM, leaf first; its subjectAltName "
          "must name the address clients dial); with --tls_key_file");
ABSL_FLAG(std::string, tls_key_file, "",
          "private key (PEM, mode 0600 or stricter) of --tls_cert_file");
ABSL_FLAG(bool, lane, true,
          "open the master lane: the daemons' hot calls (GetReplicas, ReleaseLeases, PutStart, "
          "PutEnd, PutRevoke, Exist, Remove) over TCP without gRPC; with --tls_cert_file over TLS "
          "with the same files and client-certificate rule");
ABSL_FLAG(std::string, lane_listen, "",
          "master lane HOST:PORT; empty = the host of --listen, any free port (advertised to "
          "clients when they register; set a fixed port behind a firewall)");
ABSL_FLAG(uint64_t, lane_max_connections, 4096,
          "most open master lane connections, a thread each; more are accepted, greeted \"full\" "
          "and closed at once (1..65536)");
ABSL_FLAG(uint64_t, lane_max_connections_per_address, 64,
          "most open master lane connections from one IP address (16 daemons x 4 each); more are "
          "accepted, greeted \"full\" and closed at once (1..65536)");
ABSL_FLAG(int64_t, lane_idle_timeout_ms, 60000,
          "a master lane connection silent this long, or a frame stalled half-way this long, is "
          "closed (100..3600000)");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "with --tls_cert_file: require every caller to present a certificate chaining to this "
          "CA bundle (PEM)");

namespace {

using mc::master::MasterServerOptions;

void ServerFromFlags(MasterServerOptions& opts) {
  opts.listen = absl::GetFlag(FLAGS_listen);
  opts.http = absl::GetFlag(FLAGS_http);
  opts.ready_file = mc::AbsolutePath(absl::GetFlag(FLAGS_ready_file));
  opts.maintenance_interval_ms = absl::GetFlag(FLAGS_maintenance_interval_ms);
  opts.max_batch_items = absl::GetFlag(FLAGS_max_batch_items);
  opts.grpc_handshake_timeout_ms = absl::GetFlag(FLAGS_grpc_handshake_timeout_ms);
  opts.lane = absl::GetFlag(FLAGS_lane);
  opts.lane_listen = absl::GetFlag(FLAGS_lane_listen);
  opts.lane_max_connections = absl::GetFlag(FLAGS_lane_max_connections);
  opts.lane_max_connections_per_address = absl::GetFlag(FLAGS_lane_max_connections_per_address);
  opts.lane_idle_timeout_ms = absl::GetFlag(FLAGS_lane_idle_timeout_ms);
  opts.tls.cert_file = mc::AbsolutePath(absl::GetFlag(FLAGS_tls_cert_file));
  opts.tls.key_file = mc::AbsolutePath(absl::GetFlag(FLAGS_tls_key_file));
  opts.tls.client_ca_file = mc::AbsolutePath(absl::GetFlag(FLAGS_tls_client_ca_file));
  opts.rpc_auth.max_clock_skew_ms = absl::GetFlag(FLAGS_auth_max_clock_skew_ms);
  opts.rpc_auth.replay_cache_entries = absl::GetFlag(FLAGS_auth_replay_cache_entries);
  opts.rpc_auth.revoked_members_file = absl::GetFlag(FLAGS_revoked_members_file);
}

void ElectionFromFlags(MasterServerOptions& opts, mc::daemon::Problems& problems) {
  for (absl::string_view e :
       absl::StrSplit(absl::GetFlag(FLAGS_etcd_endpoints), ',', absl::SkipWhitespace())) {
    opts.etcd_endpoints.emplace_back(absl::StripAsciiWhitespace(e));
  }
  opts.etcd_prefix = absl::GetFlag(FLAGS_etcd_prefix);
  opts.etcd_ca_file = mc::AbsolutePath(absl::GetFlag(FLAGS_etcd_ca_file));
  opts.etcd_cert_file = mc::AbsolutePath(absl::GetFlag(FLAGS_etcd_cert_file));
  opts.etcd_key_file = mc::AbsolutePath(absl::GetFlag(FLAGS_etcd_key_file));
  opts.etcd_user = absl::GetFlag(FLAGS_etcd_user);
  if (const std::string file = absl::GetFlag(FLAGS_etcd_password_file); !file.empty()) {
    std::string password = problems.Take("--etcd_password_file", mc::auth::ReadPrivateFile(file));
    opts.etcd_password = std::string(absl::StripTrailingAsciiWhitespace(password));
  }
  opts.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  opts.leader_ttl_s = absl::GetFlag(FLAGS_leader_ttl_s);
}

void MetadataFromFlags(mc::master::MasterOptions& m) {
  m.object_report_timeout_ms = absl::GetFlag(FLAGS_object_report_timeout_ms);
  m.forget_batch = absl::GetFlag(FLAGS_forget_batch);
  m.forget_queue_limit = absl::GetFlag(FLAGS_forget_queue_limit);
  m.client_takeover_after_ms = absl::GetFlag(FLAGS_client_takeover_after_ms);
  m.lease_ttl_ms = absl::GetFlag(FLAGS_lease_ttl_ms);
  m.max_lease_ttl_ms = absl::GetFlag(FLAGS_max_lease_ttl_ms);
  m.client_ttl_ms = absl::GetFlag(FLAGS_client_ttl_ms);
  m.heartbeat_interval_ms = absl::GetFlag(FLAGS_heartbeat_interval_ms);
  m.put_timeout_ms = absl::GetFlag(FLAGS_put_timeout_ms);
  m.max_object_size = absl::GetFlag(FLAGS_max_object_size);
  m.min_segment_size = absl::GetFlag(FLAGS_min_segment_size);
  m.max_segment_size = absl::GetFlag(FLAGS_max_segment_size);
  m.max_segments_per_client = absl::GetFlag(FLAGS_max_segments_per_client);
  m.max_replicas = absl::GetFlag(FLAGS_max_replicas);
  m.shards = absl::GetFlag(FLAGS_shards);
  m.eviction.high_watermark = absl::GetFlag(FLAGS_high_watermark);
  m.eviction.low_watermark = absl::GetFlag(FLAGS_low_watermark);
  m.offload.watermark = absl::GetFlag(FLAGS_offload_watermark);
}

std::atomic<bool> leadership_lost{false};

}  // namespace

int main(int argc, char** argv) {
  mc::daemon::Init(argc, argv, "mc-master: the mcstore metadata service. --flagfile=F works.");
  mc::RouteProtobufLogs();  // no log line per request with a non-UTF-8 string field
  mc::daemon::Problems problems;
  mc::daemon::SharedOptions shared = mc::daemon::SharedFromFlags(problems);
  MasterServerOptions opts;
  opts.cluster_keys = std::move(shared.cluster_keys);
  opts.admin = shared.admin;
  ServerFromFlags(opts);
  ElectionFromFlags(opts, problems);
  MetadataFromFlags(opts.master);
  opts.on_leadership_lost = [] {
    leadership_lost.store(true);
    kill(getpid(), SIGTERM);  // the shell's wait for a stop signal ends, and Serve shuts down
  };
  problems.Append(opts.Validate());
  if (!mc::daemon::Report("mc-master", problems)) return 2;
  mc::daemon::RaiseFdLimit("master");
  mc::master::MasterServer server(opts);
  mc::daemon::ServeHooks hooks;
  hooks.on_started = [] { mc::Logger("master").info("allocator: {}", MC_MALLOC_NAME); };
  hooks.exit_status = [] {
    if (!leadership_lost.load()) return 0;
    mc::Logger("master").error("exiting: this master lost its leadership (see above)");
    return 3;
  };
  return mc::daemon::Serve("master", server, hooks);
}
