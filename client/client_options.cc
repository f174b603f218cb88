#include "client/client_options.h"

#include "absl/strings/str_cat.h"
#include "transfer/tcp/frame.h"

namespace mc::client {

namespace {

// Host memory budgets are bounded so that their sums and roundings cannot wrap.
constexpr uint64_t kMinStagingBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxStagingBytes = uint64_t{1} << 40;

class Checker {
 public:
  void operator()(bool ok, std::string problem) {
    if (!ok) problems_.push_back(std::move(problem));
  }
  std::vector<std::string> Take() { return std::move(problems_); }

 private:
  std::vector<std::string> problems_;
};

void ValidateStore(const ClientServerOptions& o, Checker& check) {
  check(o.listen.empty() || !o.store_tcp_auth || !o.store_token.empty(),
        absl::StrCat("--listen=", o.listen,
                     " serves the Store service over TCP, which needs a token: give "
                     "--store_token_file (or --store_tcp_auth=false to serve it without one, not "
                     "recommended)"));
  check(o.fd_channel.max_connections >= 1, "--store_fd_max_connections must be >= 1");
  check(o.fd_channel.max_connections_per_uid >= 1,
        "--store_fd_max_connections_per_uid must be >= 1");
  check(o.fast_channel.max_connections >= 1, "--store_fast_max_connections must be >= 1");
  check(o.fast_channel.max_connections_per_uid >= 1,
        "--store_fast_max_connections_per_uid must be >= 1");
  check(o.fast_channel.max_message_bytes >= fast::kMinMessageBytes &&
            o.fast_channel.max_message_bytes <= fast::kMaxMessageBytes,
        "--store_fast_max_message_bytes must be within 4096..4194304");
  check(o.buffers.max_buffers_per_owner >= 1, "--store_max_buffers_per_caller must be >= 1");
  // One uid's share stays below the daemon's: the others are never refused because one uid
  // (any number of its sessions) took everything.
  const BufferRegistryOptions& b = o.buffers;
  check(b.max_buffers_per_owner <= b.max_buffers_per_account &&
            b.max_buffers_per_account < b.max_buffers,
        absl::StrCat("need --store_max_buffers_per_caller (", b.max_buffers_per_owner,
                     ") <= --store_max_buffers_per_uid (", b.max_buffers_per_account,
                     ") < --store_max_buffers_total (", b.max_buffers, ")"));
  check(b.max_bytes_per_owner <= b.max_bytes_per_account && b.max_bytes_per_account < b.max_bytes,
        absl::StrCat("need --store_max_buffer_bytes_per_caller (", b.max_bytes_per_owner,
                     ") <= --store_max_buffer_bytes_per_uid (", b.max_bytes_per_account,
                     ") < --store_max_buffer_bytes_total (", b.max_bytes, ")"));
  const CallerLimitsOptions& l = o.store.limits;
  check(
      l.max_inflight_per_account == 0 || (l.max_inflight_per_caller != 0 &&
                                          l.max_inflight_per_caller <= l.max_inflight_per_account),
      absl::StrCat("need --store_max_inflight_per_caller (", l.max_inflight_per_caller,
                   ") <= --store_max_inflight_per_uid (", l.max_inflight_per_account,
                   ") unless the latter is 0 (unlimited)"));
  check(o.store.max_request_slices + o.store.max_batch_items <= l.max_slices_per_account &&
            l.max_slices_per_account < l.max_slices,
        absl::StrCat("need --store_max_request_slices (", o.store.max_request_slices,
                     ") + the items of a batch (", o.store.max_batch_items,
                     ") <= --store_max_inflight_slices_per_uid (", l.max_slices_per_account,
                     ") < --store_max_inflight_slices (", l.max_slices,
                     "): the largest request must fit one uid's budget, and one uid not the "
                     "daemon's"));
  check(o.store.max_prefix_lease_ttl_ms >= 1, "--store_max_lease_ttl_ms must be >= 1");
  check(o.store.max_request_slices >= 1, "--store_max_request_slices must be >= 1");
}

// The daemon's certificate serves --listen and, with --master_tls_ca_file, identifies it to the
// master; a certificate that does neither is a mistake worth naming.
void ValidateTls(const ClientServerOptions& o, std::vector<std::string>& problems) {
  const TlsFlagNames master_names{.cert = "--tls_cert_file",
                                  .key = "--tls_key_file",
                                  .ca = "--master_tls_ca_file",
                                  .server_name = "--master_tls_server_name"};
  for (std::string& p : TlsServerProblems(o.tls)) problems.push_back(std::move(p));
  if (o.tls.enabled() && o.listen.empty() && !o.master_tls.enabled()) {
    problems.push_back(
        "--tls_cert_file serves the TCP Store listener (--listen) and identifies this daemon to a "
        "TLS master (--master_tls_ca_file): give either, or drop it");
  }
  if (!o.tls.client_ca_file.empty() && o.listen.empty()) {
    problems.push_back("--tls_client_ca_file needs --listen (the Unix socket has no TLS)");
  }
  // The pair was checked above; here the CA and the server name.
  for (std::string& p : TlsChannelProblems(o.master_tls, master_names)) {
    problems.push_back(std::move(p));
  }
}

void ValidateMasterAndPuts(const ClientServerOptions& o, Checker& check) {
  // A member credential registers its own client id only (the master refuses any other).
  if (o.cluster_keys != nullptr && o.cluster_keys->member().has_value()) {
    const std::string& id = o.cluster_keys->member()->client_id;
    check(o.client_id.empty() || o.client_id == id,
          absl::StrCat("--client_id ", o.client_id,
                       " is not the client id of the member "
                       "credential (--member_credential_file is for ",
                       id, "); drop --client_id or issue a credential for it"));
  }
  check(o.lease_release_delay_us >= 0, "--lease_release_delay_us must be >= 0");
  check(o.master_lane_connections >= 1 && o.master_lane_connections <= 64,
        "--master_lane_connections must be in 1..64");
  check(o.put_no_space_wait_ms >= 0, "--put_no_space_wait_ms must be >= 0");
  check(o.put_write_back_wait_ms >= 0, "--put_write_back_wait_ms must be >= 0");
  check(o.put_write_timeout_ms >= 1, "--put_write_timeout_ms must be >= 1");
  check(o.holder_backoff_ms >= 0 && o.holder_backoff_ms <= 3'600'000,
        "--holder_backoff_ms must be in 0..3600000");
  check(o.get_speculative_max_keys >= 1 && o.get_speculative_max_keys <= 4096,
        "--get_speculative_max_keys must be in 1..4096");
  check(o.get_speculative_max_bytes >= 4096 && o.get_speculative_max_bytes <= (1ull << 30),
        "--get_speculative_max_bytes must be in 4096..1073741824");
}

void ValidateTransfer(const ClientServerOptions& o, Checker& check) {
  const transfer::TransferEngineOptions& t = o.transfer;
  check(t.tcp.frame_bytes >= 1 && t.tcp.frame_bytes <= transfer::tcp::kDefaultMaxFrameLength,
        absl::StrCat("--tcp_frame_bytes must be in 1..", transfer::tcp::kDefaultMaxFrameLength));
  check(t.tcp.receive_threads >= 0, "--tcp_receive_threads must be >= 0");
  check(t.local.copy_threads >= 0, "--copy_threads must be >= 0");
  const transfer::tcp::SocketBuffers& buffers = t.tcp.socket_buffers;
  check(buffers.send_bytes >= 0,
        "--tcp_send_buffer_bytes (or --tcp_socket_buffer_bytes) must be >= 0");
  check(buffers.receive_bytes >= 0,
        "--tcp_receive_buffer_bytes (or --tcp_socket_buffer_bytes) must be >= 0");
  check(buffers.receive_floor_bytes >= 0, "--tcp_receive_buffer_floor_bytes must be >= 0");
  check(t.transport == "auto" || t.transport == "tcp" || t.transport == "rdma",
        "--transport must be auto, tcp or rdma");
  // One-sided rdma moves plaintext (docs/security.md): an encrypted data plane refuses it.
  check(o.cluster_keys == nullptr || !t.tcp.encryption || t.transport != "rdma",
        "--transport=rdma is not encrypted: with --auth and --data_encryption=on use "
        "--transport=auto or tcp, or set --data_encryption=off");
  check(t.rdma.qps_per_peer >= 1 && t.rdma.qps_per_peer <= 64,
        "--rdma_qps_per_peer must be in 1..64");
  check(t.rdma.port >= 1, "--rdma_port must be >= 1");
  check(t.rdma.gid_index >= 0, "--rdma_gid_index must be >= 0");
  const auto& d = o.data_server;
  check(d.max_connections >= 1, "--data_max_connections must be >= 1");
  check(d.max_connections_per_peer >= 1, "--data_max_connections_per_peer must be >= 1");
  check(d.max_pending_connections >= 1, "--data_max_pending_connections must be >= 1");
  check(d.max_pending_per_peer >= 1, "--data_max_pending_per_peer must be >= 1");
  check(d.idle_timeout_ms >= 1, "--data_idle_timeout_ms must be >= 1");
  check(d.io_timeout_ms >= 1, "--data_io_timeout_ms must be >= 1");
  check(o.admin.max_connections >= 1, "--http_max_connections must be >= 1");
  check(o.admin.max_connections_per_peer >= 1, "--http_max_connections_per_peer must be >= 1");
  check(o.admin.request_timeout_ms >= 1, "--http_request_timeout_ms must be >= 1");
}

void ValidateGpu(const ClientServerOptions& o, Checker& check) {
  const transfer::TransferEngineOptions& t = o.transfer;
  check(t.cuda.device >= -1 && t.cuda.device <= 1023,
        "--cuda_device must be -1 (no GPU) or a CUDA ordinal in 0..1023");
  check(t.cuda.streams >= 1 && t.cuda.streams <= 64, "--cuda_streams must be in 1..64");
  if (absl::Status s = transfer::ParseGpuDirectRdma(t.cuda.gpu_direct_rdma).status(); !s.ok()) {
    check(false, absl::StrCat("--gpu_direct_rdma: ", s.message()));
  }
  check(o.gpu_put.max_staging_bytes >= kMinStagingBytes &&
            o.gpu_put.max_staging_bytes <= kMaxStagingBytes,
        "--gpu_put_staging_bytes must be in 1 MiB..1 TiB");
  check(o.gpu_get.pool_bytes >= kMinStagingBytes && o.gpu_get.pool_bytes <= kMaxStagingBytes,
        "--gpu_get_staging_bytes must be in 1 MiB..1 TiB");
  check(o.gpu_max_buffers >= 1, "--gpu_max_buffers must be >= 1");
  check(o.gpu_max_buffers_per_caller >= 1, "--gpu_max_buffers_per_caller must be >= 1");
}

void ValidateTier(const ClientServerOptions& o, Checker& check) {
  check(o.offload_parallelism >= 1 && o.offload_parallelism <= 64,
        "--offload_parallelism must be in 1..64");
  check(o.promote_staging_bytes > 0, "--promote_staging_bytes must be > 0");
  check(o.offload.dir.empty() || o.offload.capacity > 0, "--offload_dir needs --offload_capacity");
}

}  // namespace

std::vector<std::string> ClientServerOptions::Validate() const {
  Checker check;
  ValidateStore(*this, check);
  ValidateMasterAndPuts(*this, check);
  ValidateTransfer(*this, check);
  ValidateGpu(*this, check);
  ValidateTier(*this, check);
  std::vector<std::string> problems = check.Take();
  ValidateTls(*this, problems);
  return problems;
}

}  // namespace mc::client
