// mc-client's flags -> ClientServerOptions -> ClientServer, in the daemon shell
// (common/daemon_shell.h). mc_client_main.cc is mc-client's main(); tests/fakes builds a
// variant on a fake CUDA device from the same flags (fakegpu_client_main.cc).
#include "client/client_main.h"

#include "absl/flags/flag.h"
#include "client/access/store_auth.h"
#include "client/client_server.h"
#include "common/checksum.h"
#include "common/daemon_shell.h"
#include "common/logging.h"
#include "common/util.h"
#include "proto/protobuf_log.h"

ABSL_FLAG(std::string, master, "127.0.0.1:50051",
          "mc-master gRPC HOST:PORT, or a comma list of the masters (standbys with etcd): calls "
          "follow the leader");
ABSL_FLAG(
    std::string, listen, "",
    "Store gRPC on TCP HOST:PORT (port 0 = free port); empty = off (the default: local "
    "applications use --unix_socket). Needs --store_token_file unless --store_tcp_auth=false");
ABSL_FLAG(std::string, tls_cert_file, "",
          "serve --listen over TLS with this certificate chain (PEM, leaf first; its "
          "subjectAltName must name the address applications dial); also this daemon's client "
          "certificate towards a TLS master. With --tls_key_file");
ABSL_FLAG(std::string, tls_key_file, "",
          "private key (PEM, mode 0600 or stricter) of --tls_cert_file");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "with --tls_cert_file: --listen requires every caller to present a certificate "
          "chaining to this CA bundle (PEM)");
ABSL_FLAG(std::string, master_tls_ca_file, "",
          "call the master over TLS; its certificate must chain to this CA bundle (PEM) and name "
          "each --master address (or --master_tls_server_name) in its subjectAltName");
ABSL_FLAG(std::string, master_tls_server_name, "",
          "with --master_tls_ca_file: check the master's certificate against this name instead "
          "of the host of the address dialled");
ABSL_FLAG(int64_t, grpc_handshake_timeout_ms, 5000,
          "Store gRPC (TCP and Unix socket): a connection that has not completed its HTTP/2 "
          "handshake within this is closed (100..120000)");
ABSL_FLAG(std::string, unix_socket, "",
          "serve Store gRPC on this Unix socket path (and the fd socket <path>.fd); callers are "
          "authorized by the socket file's mode and group");
ABSL_FLAG(std::string, unix_socket_mode, "0660",
          "octal mode of the Unix socket and the fd socket (owner needs rw; 0600 = daemon's user "
          "only, 0660 = also its group)");
ABSL_FLAG(std::string, unix_socket_group, "",
          "group name or gid of the Unix socket and the fd socket (default: the daemon's group)");
ABSL_FLAG(std::string, store_fd_socket, "",
          "the fd side-channel socket where applications pass buffers (default <unix_socket>.fd)");
ABSL_FLAG(std::string, store_token_file, "",
          "file holding the token (>= 32 characters; mode 0600 or stricter) TCP Store callers "
          "present as `authorization: Bearer <token>`");
ABSL_FLAG(bool, store_tcp_auth, true,
          "require the token of --store_token_file on the TCP Store listener; false serves it to "
          "anyone who can reach it (logged as a warning)");
ABSL_FLAG(bool, store_allow_named_buffers, false,
          "accept RegisterBuffer by shm_name, opened with the daemon's own rights (any caller "
          "could then map any object the daemon can open); off: buffers come as fds");
ABSL_FLAG(uint32_t, store_max_buffers_per_caller, 256, "registered buffers one caller may hold");
ABSL_FLAG(uint64_t, store_max_buffer_bytes_per_caller, 1ull << 40,
          "bytes of registered buffers one caller may hold");
ABSL_FLAG(uint64_t, store_max_buffer_bytes_total, 32ull << 40,
          "bytes of registered buffers the daemon maps in all (address space: 128 TiB)");
ABSL_FLAG(uint32_t, store_max_buffers_total, 4096,
          "registered (and staged) buffers the daemon holds in all");
ABSL_FLAG(uint32_t, store_max_buffers_per_uid, 1024,
          "registered buffers all sessions of one uid may hold together (below the total)");
ABSL_FLAG(uint64_t, store_max_buffer_bytes_per_uid, 8ull << 40,
          "bytes of registered buffers all sessions of one uid may hold (below the total)");
ABSL_FLAG(uint32_t, store_max_inflight_per_uid, 1024,
          "Store requests all callers of one uid may have in flight at once; 0 = unlimited");
ABSL_FLAG(uint64_t, store_max_inflight_slices, 16ull << 20,
          "slices (expanded items and block-layout runs, tens of bytes of daemon memory each) "
          "of every Store request in flight together");
ABSL_FLAG(uint64_t, store_max_inflight_slices_per_uid, 8ull << 20,
          "slices of the Store requests in flight of one uid (below the daemon's)");
ABSL_FLAG(uint32_t, store_max_leases_per_caller, 4096,
          "prefix leases one caller may hold at once; 0 = unlimited");
ABSL_FLAG(uint32_t, store_max_inflight_per_caller, 256,
          "Store requests one caller may have in flight at once; 0 = unlimited");
ABSL_FLAG(uint32_t, store_max_lease_ttl_ms, 600000, "longest prefix lease MatchPrefix grants");
ABSL_FLAG(uint64_t, store_max_request_slices, 4ull << 20,
          "most slices one BatchPut/BatchGet may name, block-layout runs x block items included");
ABSL_FLAG(int32_t, store_fd_max_connections, 128, "fd socket: most open sessions");
ABSL_FLAG(int32_t, store_fd_max_connections_per_uid, 32, "fd socket: most sessions of one uid");
ABSL_FLAG(bool, store_fast_channel, true,
          "with --unix_socket: serve Store calls without gRPC on the fast socket <path>.fast "
          "(same mode and group)");
ABSL_FLAG(int32_t, store_fast_max_connections, 128, "fast socket: most open connections");
ABSL_FLAG(int32_t, store_fast_max_connections_per_uid, 32,
          "fast socket: most connections of one uid");
ABSL_FLAG(uint32_t, store_fast_max_message_bytes, 262144,
          "fast socket: largest request or reply datagram (4096..4194304)");
ABSL_FLAG(std::string, http, "127.0.0.1:0", "admin HTTP HOST:PORT; empty = off");
ABSL_FLAG(std::string, data, "127.0.0.1:0", "data-plane HOST:PORT peers read and write through");
ABSL_FLAG(std::string, advertise_host, "", "host peers use to reach --data (default: its host)");
ABSL_FLAG(std::string, ready_file, "",
          "write {\"grpc\",\"http\",\"data\",\"unix_socket\"} JSON here once serving");
ABSL_FLAG(std::string, client_id, "", "stable id of this daemon (default: host-pid-random)");
ABSL_FLAG(uint64_t, segment_size, 256ull << 20, "bytes per memory segment; 0 = pure client");
ABSL_FLAG(int32_t, segments, 1, "number of memory segments");
ABSL_FLAG(bool, huge_pages, false, "map segments with MAP_HUGETLB when available");
ABSL_FLAG(bool, prefault, false, "fault every segment page in at start");
ABSL_FLAG(uint64_t, max_inline_bytes, 64ull << 20, "largest inline payload in a Store message");
ABSL_FLAG(uint32_t, replicas, 1, "memory replicas of a put that asks for 0");
ABSL_FLAG(uint32_t, get_lease_ttl_ms, 0, "read lease BatchGet asks for; 0 = master default");
ABSL_FLAG(int64_t, master_rpc_timeout_ms, 10000, "deadline of each call to the master");
ABSL_FLAG(bool, pack_master_keys, true,
          "MatchPrefix and gets send their lookups' keys (and the lease releases a lookup "
          "carries) to the master packed in one field and take the answer as columns (false: one "
          "by one, for a master older than the packed fields; it is also detected and worked "
          "around on its own)");
ABSL_FLAG(bool, master_lane, true,
          "send the hot master calls (lookups, puts, removes) over the master lane, TCP without "
          "gRPC, when the master offers one; with --master_tls_ca_file over TLS with the same "
          "files and checks as the gRPC channel");
ABSL_FLAG(int32_t, master_lane_connections, 4,
          "most master lane connections (1..64), opened as needed; a call finding all busy goes "
          "over gRPC");
ABSL_FLAG(int64_t, lease_release_delay_us, 1000,
          "a finished read's lease release waits this long for the next master lookup to carry "
          "it, then goes in an RPC of its own; 0 = always at once");
ABSL_FLAG(int64_t, put_no_space_wait_ms, 100,
          "retry put items answered NO_SPACE (memory leased or being written) this long; "
          "0 = no retry");
ABSL_FLAG(int64_t, put_write_back_wait_ms, 10000,
          "retry put items answered NO_SPACE because memory waits for write-back to an SSD tier "
          "this long (puts that outrun the disk wait for it); 0 = no retry");
ABSL_FLAG(int64_t, holder_backoff_ms, 2000,
          "a replica holder that refused a connection (its daemon is gone) is not dialled again "
          "for this long: gets read the key's other replicas at once, puts place around it, and "
          "the holder is reported to the master; 0 = always dial");
ABSL_FLAG(int32_t, connections_per_peer, 4, "tcp data-plane connections per peer");
ABSL_FLAG(int32_t, copy_threads, 2, "threads for large local copies");
ABSL_FLAG(uint64_t, tcp_frame_bytes, 4ull << 20,
          "a tcp data-plane request is cut into frames of at most this many bytes (1 B..1 GiB)");
ABSL_FLAG(
    int32_t, tcp_receive_threads, 2,
    "helper threads that drive a batch's tcp connections besides the caller (0 = caller only)");
ABSL_FLAG(int32_t, tcp_send_buffer_bytes, mc::transfer::tcp::kDataPlaneBuffers.send_bytes,
          "SO_SNDBUF of data-plane connections (0 = kernel autotuning)");
ABSL_FLAG(int32_t, tcp_receive_buffer_bytes, mc::transfer::tcp::kDataPlaneBuffers.receive_bytes,
          "SO_RCVBUF of data-plane connections (0 = kernel autotuning, starting from "
          "--tcp_receive_buffer_floor_bytes)");
ABSL_FLAG(int32_t, tcp_receive_buffer_floor_bytes,
          mc::transfer::tcp::kDataPlaneBuffers.receive_floor_bytes,
          "an autotuned data-plane receive buffer starts at this size (0 = net.ipv4.tcp_rmem's "
          "default)");
ABSL_FLAG(int32_t, tcp_socket_buffer_bytes, -1,
          "older form: >= 0 sets SO_SNDBUF and SO_RCVBUF both to this (0 = both autotuned from "
          "the kernel's defaults), overriding the three flags above; -1 = they decide");
ABSL_FLAG(std::string, data_encryption, "off",
          "with --auth: on = tcp data-plane connections are encrypted (AES-256-GCM) and this "
          "daemon's data plane refuses plaintext ones (and rdma: --transport=auto uses tcp); "
          "off = plaintext (a requester that asks is still answered encrypted). Ignored "
          "without --auth");
ABSL_FLAG(std::string, transport, "auto",
          "remote transport: auto (rdma to peers that accept an rdma connection, tcp otherwise), "
          "tcp, or rdma (no tcp fallback; start fails without a verbs device)");
ABSL_FLAG(std::string, rdma_device, "", "verbs device (default: the first with an active port)");
ABSL_FLAG(int32_t, rdma_port, 1, "port of the verbs device");
ABSL_FLAG(int32_t, rdma_gid_index, 1,
          "GID index (RoCEv2: the IPv4-mapped GID, 1 on rxe and usually 3 on mlx5; 0 on IB)");
ABSL_FLAG(int32_t, rdma_qps_per_peer, 2, "RC queue pairs per peer");
ABSL_FLAG(int32_t, cuda_device, -1,
          "CUDA ordinal whose memory applications may lend with GpuBuffers.RegisterGpuBuffer and "
          "name in BatchPut/BatchGet slices (docs/gpu.md); -1 = none (GpuBuffers not served)");
ABSL_FLAG(int32_t, cuda_streams, 4, "CUDA streams of the GPU mover (1..64), with --cuda_device");
ABSL_FLAG(uint64_t, gpu_put_staging_bytes, 256ull << 20,
          "pinned host memory that BatchPut items from GPU buffers are staged through, all "
          "requests together, allocated on the first staged GPU put (a larger item fails "
          "INVALID_ARGUMENT, one that does not fit beside others UNAVAILABLE); 1 MiB..1 TiB, "
          "with --cuda_device");
ABSL_FLAG(bool, gpu_put_direct, true,
          "write a BatchPut item that is one GPU slice straight from GPU memory into this "
          "daemon's segments (and to peers over GPUDirect RDMA), proved against the device's "
          "hash of the source, instead of staging it through host memory; with --cuda_device");
ABSL_FLAG(uint64_t, gpu_get_staging_bytes, 256ull << 20,
          "pinned host memory that BatchGet reads objects into before copying them into GPU "
          "buffers, when the object has no replica in this daemon's memory or further "
          "destinations in the batch; allocated on the first such get, all requests together "
          "(a larger object fails INVALID_ARGUMENT, one that does not fit beside others "
          "UNAVAILABLE); 1 MiB..1 TiB, with --cuda_device");
ABSL_FLAG(std::string, gpu_direct_rdma, "auto",
          "GPUDirect RDMA, with --cuda_device and the rdma transport: auto (GPU buffers are "
          "registered with the NIC as dma-bufs where the GPU, driver and NIC allow, and remote "
          "replicas are read straight into them; elsewhere staged, logged), off (always staged), "
          "on (required: no rdma transport fails the start, a GPU buffer the NIC cannot register "
          "is refused UNAVAILABLE)");
ABSL_FLAG(uint64_t, gpu_max_buffers, 1024,
          "GPU buffers (RegisterGpuBuffer) registered at once, all callers together; past it "
          "NO_SPACE (>= 1, with --cuda_device)");
ABSL_FLAG(uint64_t, gpu_max_buffers_per_caller, 256,
          "GPU buffers one caller (owner key) may hold registered at once; past it NO_SPACE "
          "(>= 1, with --cuda_device)");
ABSL_FLAG(uint64_t, rdma_buffer_bytes_total, 64ull << 30,
          "bytes of registered application buffers also registered with the rdma device (local "
          "access only; their pages stay pinned while registered); buffers past it move over tcp; "
          "0 = none");
ABSL_FLAG(std::string, offload_dir, "",
          "SSD tier directory (data files live here); empty = no SSD tier");
ABSL_FLAG(uint64_t, offload_capacity, 0, "SSD tier bytes (needed with --offload_dir)");
ABSL_FLAG(int32_t, offload_files, 4, "SSD tier data files");
ABSL_FLAG(int32_t, offload_queue_depth, 64, "io_uring queue depth of the SSD tier");
ABSL_FLAG(bool, offload_direct_io, true, "O_DIRECT for SSD data files (falls back when refused)");
ABSL_FLAG(bool, offload_force_posix, false, "pread/pwrite instead of io_uring");
ABSL_FLAG(double, offload_high_watermark, 1.0,
          "the SSD tier reclaims records when a write would take it above this fraction");
ABSL_FLAG(double, offload_low_watermark, 0.99,
          "and down to this one (the gap is the batch one reclaim round frees)");
ABSL_FLAG(bool, object_index, true,
          "keep an index of the objects in this daemon's memory segments (writers notify the "
          "owners of their replicas) and report it to the master after every registration, so "
          "a master restart or an expired session loses no object; false: no index, no "
          "notices, no report");
ABSL_FLAG(bool, get_speculative_local, true,
          "copy a get's keys that this daemon's object index places in its own segments into "
          "their destination while the master lookup is in flight, kept only when the answer "
          "names that replica and generation with a lease and the bytes match its checksum "
          "(needs --object_index)");
ABSL_FLAG(int64_t, get_speculative_max_keys, 64,
          "a get asking for more keys does not speculate (1..4096)");
ABSL_FLAG(uint64_t, get_speculative_max_bytes, 16ull << 20,
          "a get whose keys held here total more bytes does not speculate: larger gets keep "
          "the local transport's parallel copies, --copy_threads and the caller "
          "(4096..1073741824)");
ABSL_FLAG(bool, promote_on_hit, false,
          "write objects read from an SSD tier back into memory (best effort)");
ABSL_FLAG(uint64_t, promote_staging_bytes, 64ull << 20,
          "memory for the verified private copies one promotion round writes back (a larger "
          "object goes alone)");
ABSL_FLAG(int64_t, put_write_timeout_ms, 10000,
          "longest wait for a put's replica writes; an item not fully written by then fails");
ABSL_FLAG(int32_t, data_max_connections, 1024, "data-plane server: most open connections");
ABSL_FLAG(int64_t, capability_clock_skew_ms, 1000,
          "With --auth: ms a data-plane capability is still honoured past its expiry, for "
          "clock drift against the master between heartbeats (docs/security.md)");
ABSL_FLAG(int64_t, data_handshake_timeout_ms, 5000,
          "With --auth: a data-plane connection must finish its handshake within this");
ABSL_FLAG(int32_t, data_max_connections_per_peer, 256,
          "data-plane server: most open connections from one IP address");
ABSL_FLAG(int32_t, data_max_pending_connections, 128,
          "With --auth: data-plane connections still in the handshake, in all (a new one closes "
          "the oldest); they do not count against --data_max_connections");
ABSL_FLAG(int32_t, data_max_pending_per_peer, 32,
          "With --auth: data-plane connections still in the handshake from one IP address (a new "
          "one closes that address's oldest)");
ABSL_FLAG(int64_t, data_idle_timeout_ms, 300000,
          "data-plane server: close a connection idle this long between requests");
ABSL_FLAG(int64_t, data_io_timeout_ms, 30000,
          "data-plane server: close a connection whose frame stalls this long");
ABSL_FLAG(int64_t, offload_poll_ms, 100,
          "how often to take offload tasks from the master (at once again while tasks come)");
ABSL_FLAG(int32_t, offload_parallelism, 4, "OFFLOAD tasks written to the SSD tier at once (1..64)");
ABSL_FLAG(std::string, member_credential_file, "",
          "this client's member credential (mode 0600; `mc-admin issue-member --client_id ID` "
          "writes one): the recommended alternative to --cluster_secret_file (exactly one of "
          "them); it registers this client id only (docs/security.md)");

namespace mc::client {

namespace {

void StoreFromFlags(ClientServerOptions& o, daemon::Problems& problems) {
  o.listen = absl::GetFlag(FLAGS_listen);
  o.tls.cert_file = AbsolutePath(absl::GetFlag(FLAGS_tls_cert_file));
  o.tls.key_file = AbsolutePath(absl::GetFlag(FLAGS_tls_key_file));
  o.tls.client_ca_file = AbsolutePath(absl::GetFlag(FLAGS_tls_client_ca_file));
  // Relative paths are resolved against the working directory once, so the ready file and the
  // logs name absolute ones that hold from anywhere.
  o.unix_socket = AbsolutePath(absl::GetFlag(FLAGS_unix_socket));
  o.grpc_handshake_timeout_ms = absl::GetFlag(FLAGS_grpc_handshake_timeout_ms);
  o.unix_socket_mode =
      problems.Take("--unix_socket_mode", ParseSocketMode(absl::GetFlag(FLAGS_unix_socket_mode)));
  if (!absl::GetFlag(FLAGS_unix_socket_group).empty()) {
    o.unix_socket_group =
        problems.Take("--unix_socket_group", ParseGroup(absl::GetFlag(FLAGS_unix_socket_group)));
  }
  o.fd_socket = AbsolutePath(absl::GetFlag(FLAGS_store_fd_socket));
  o.store_tcp_auth = absl::GetFlag(FLAGS_store_tcp_auth);
  if (!absl::GetFlag(FLAGS_store_token_file).empty()) {
    o.store_token =
        problems.Take("--store_token_file", LoadStoreToken(absl::GetFlag(FLAGS_store_token_file)));
  }
  o.store.allow_named_buffers = absl::GetFlag(FLAGS_store_allow_named_buffers);
  o.store.max_leases_per_caller = absl::GetFlag(FLAGS_store_max_leases_per_caller);
  o.store.limits.max_inflight_per_caller = absl::GetFlag(FLAGS_store_max_inflight_per_caller);
  o.store.limits.max_inflight_per_account = absl::GetFlag(FLAGS_store_max_inflight_per_uid);
  o.store.limits.max_slices = absl::GetFlag(FLAGS_store_max_inflight_slices);
  o.store.limits.max_slices_per_account = absl::GetFlag(FLAGS_store_max_inflight_slices_per_uid);
  o.store.max_prefix_lease_ttl_ms = absl::GetFlag(FLAGS_store_max_lease_ttl_ms);
  o.store.max_request_slices = absl::GetFlag(FLAGS_store_max_request_slices);
  o.store.max_inline_bytes = absl::GetFlag(FLAGS_max_inline_bytes);
  o.store.default_replicas = absl::GetFlag(FLAGS_replicas);
  o.store.pack_master_keys = absl::GetFlag(FLAGS_pack_master_keys);
  o.buffers.max_buffers_per_owner = absl::GetFlag(FLAGS_store_max_buffers_per_caller);
  o.buffers.max_bytes_per_owner = absl::GetFlag(FLAGS_store_max_buffer_bytes_per_caller);
  o.buffers.max_bytes = absl::GetFlag(FLAGS_store_max_buffer_bytes_total);
  o.buffers.max_buffers = absl::GetFlag(FLAGS_store_max_buffers_total);
  o.buffers.max_buffers_per_account = absl::GetFlag(FLAGS_store_max_buffers_per_uid);
  o.buffers.max_bytes_per_account = absl::GetFlag(FLAGS_store_max_buffer_bytes_per_uid);
  o.buffers.max_rdma_bytes = absl::GetFlag(FLAGS_rdma_buffer_bytes_total);
  o.fd_channel.max_connections = absl::GetFlag(FLAGS_store_fd_max_connections);
  o.fd_channel.max_connections_per_uid = absl::GetFlag(FLAGS_store_fd_max_connections_per_uid);
  o.store_fast_channel = absl::GetFlag(FLAGS_store_fast_channel);
  o.fast_channel.max_connections = absl::GetFlag(FLAGS_store_fast_max_connections);
  o.fast_channel.max_connections_per_uid = absl::GetFlag(FLAGS_store_fast_max_connections_per_uid);
  o.fast_channel.max_message_bytes = absl::GetFlag(FLAGS_store_fast_max_message_bytes);
}

void ClusterFromFlags(ClientServerOptions& o) {
  o.master = absl::GetFlag(FLAGS_master);
  o.master_tls.ca_file = AbsolutePath(absl::GetFlag(FLAGS_master_tls_ca_file));
  o.master_tls.server_name = absl::GetFlag(FLAGS_master_tls_server_name);
  o.http = absl::GetFlag(FLAGS_http);
  o.data = absl::GetFlag(FLAGS_data);
  o.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  o.ready_file = AbsolutePath(absl::GetFlag(FLAGS_ready_file));
  o.client_id = absl::GetFlag(FLAGS_client_id);
  o.segments.segment_size = absl::GetFlag(FLAGS_segment_size);
  o.segments.segment_count = absl::GetFlag(FLAGS_segments);
  o.segments.huge_pages = absl::GetFlag(FLAGS_huge_pages);
  o.segments.prefault = absl::GetFlag(FLAGS_prefault);
  o.get_lease_ttl_ms = absl::GetFlag(FLAGS_get_lease_ttl_ms);
  o.master_rpc_timeout_ms = absl::GetFlag(FLAGS_master_rpc_timeout_ms);
  o.lease_release_delay_us = absl::GetFlag(FLAGS_lease_release_delay_us);
  o.master_lane = absl::GetFlag(FLAGS_master_lane);
  o.master_lane_connections = absl::GetFlag(FLAGS_master_lane_connections);
  o.put_no_space_wait_ms = absl::GetFlag(FLAGS_put_no_space_wait_ms);
  o.put_write_back_wait_ms = absl::GetFlag(FLAGS_put_write_back_wait_ms);
  o.put_write_timeout_ms = absl::GetFlag(FLAGS_put_write_timeout_ms);
  o.holder_backoff_ms = absl::GetFlag(FLAGS_holder_backoff_ms);
  o.capability_clock_skew_ms = absl::GetFlag(FLAGS_capability_clock_skew_ms);
  o.object_index = absl::GetFlag(FLAGS_object_index);
  o.get_speculative_local = absl::GetFlag(FLAGS_get_speculative_local);
  o.get_speculative_max_keys = absl::GetFlag(FLAGS_get_speculative_max_keys);
  o.get_speculative_max_bytes = absl::GetFlag(FLAGS_get_speculative_max_bytes);
}

void TransferFromFlags(ClientServerOptions& o) {
  o.transfer.tcp.connections_per_peer = absl::GetFlag(FLAGS_connections_per_peer);
  o.transfer.local.copy_threads = absl::GetFlag(FLAGS_copy_threads);
  o.transfer.tcp.frame_bytes = absl::GetFlag(FLAGS_tcp_frame_bytes);
  o.transfer.tcp.receive_threads = absl::GetFlag(FLAGS_tcp_receive_threads);
  o.transfer.tcp.socket_buffers = {
      .send_bytes = absl::GetFlag(FLAGS_tcp_send_buffer_bytes),
      .receive_bytes = absl::GetFlag(FLAGS_tcp_receive_buffer_bytes),
      .receive_floor_bytes = absl::GetFlag(FLAGS_tcp_receive_buffer_floor_bytes)};
  if (const int32_t both = absl::GetFlag(FLAGS_tcp_socket_buffer_bytes); both != -1) {
    // As before the split (negative: rejected below).
    o.transfer.tcp.socket_buffers = {.send_bytes = both, .receive_bytes = both};
  }
  o.transfer.transport = absl::GetFlag(FLAGS_transport);
  o.transfer.rdma.device = absl::GetFlag(FLAGS_rdma_device);
  o.transfer.rdma.port = absl::GetFlag(FLAGS_rdma_port);
  o.transfer.rdma.gid_index = absl::GetFlag(FLAGS_rdma_gid_index);
  o.transfer.rdma.qps_per_peer = absl::GetFlag(FLAGS_rdma_qps_per_peer);
  o.transfer.cuda.device = absl::GetFlag(FLAGS_cuda_device);
  o.transfer.cuda.streams = absl::GetFlag(FLAGS_cuda_streams);
  o.transfer.cuda.gpu_direct_rdma = absl::GetFlag(FLAGS_gpu_direct_rdma);
  o.data_server.max_connections = absl::GetFlag(FLAGS_data_max_connections);
  o.data_server.max_connections_per_peer = absl::GetFlag(FLAGS_data_max_connections_per_peer);
  o.data_server.handshake_timeout_ms = absl::GetFlag(FLAGS_data_handshake_timeout_ms);
  o.data_server.max_pending_connections = absl::GetFlag(FLAGS_data_max_pending_connections);
  o.data_server.max_pending_per_peer = absl::GetFlag(FLAGS_data_max_pending_per_peer);
  o.data_server.idle_timeout_ms = absl::GetFlag(FLAGS_data_idle_timeout_ms);
  o.data_server.io_timeout_ms = absl::GetFlag(FLAGS_data_io_timeout_ms);
}

void GpuAndTierFromFlags(ClientServerOptions& o) {
  o.gpu_put.max_staging_bytes = absl::GetFlag(FLAGS_gpu_put_staging_bytes);
  o.gpu_put.direct = absl::GetFlag(FLAGS_gpu_put_direct);
  o.gpu_get.pool_bytes = absl::GetFlag(FLAGS_gpu_get_staging_bytes);
  o.gpu_max_buffers = absl::GetFlag(FLAGS_gpu_max_buffers);
  o.gpu_max_buffers_per_caller = absl::GetFlag(FLAGS_gpu_max_buffers_per_caller);
  o.offload.dir = AbsolutePath(absl::GetFlag(FLAGS_offload_dir));
  o.offload.capacity = absl::GetFlag(FLAGS_offload_capacity);
  o.offload.num_files = absl::GetFlag(FLAGS_offload_files);
  o.offload.queue_depth = absl::GetFlag(FLAGS_offload_queue_depth);
  o.offload.direct_io = absl::GetFlag(FLAGS_offload_direct_io);
  o.offload.force_posix_io = absl::GetFlag(FLAGS_offload_force_posix);
  o.offload.high_watermark = absl::GetFlag(FLAGS_offload_high_watermark);
  o.offload.low_watermark = absl::GetFlag(FLAGS_offload_low_watermark);
  o.offload_poll_ms = absl::GetFlag(FLAGS_offload_poll_ms);
  o.offload_parallelism = absl::GetFlag(FLAGS_offload_parallelism);
  o.promote_on_hit = absl::GetFlag(FLAGS_promote_on_hit);
  o.promote_staging_bytes = absl::GetFlag(FLAGS_promote_staging_bytes);
}

}  // namespace

int RunClientMain(int argc, char** argv, const char* allocator,
                  const std::function<void(ClientServerOptions&)>& adjust) {
  daemon::Init(argc, argv, "mc-client: the mcstore per-host daemon. --flagfile=F works.");
  RouteProtobufLogs();  // no log line per request with a non-UTF-8 string field
  daemon::Problems problems;
  daemon::SharedOptions shared =
      daemon::SharedFromFlags(problems, absl::GetFlag(FLAGS_member_credential_file));
  ClientServerOptions o;
  o.cluster_keys = std::move(shared.cluster_keys);
  o.admin = shared.admin;
  StoreFromFlags(o, problems);
  ClusterFromFlags(o);
  if (o.client_id.empty() && o.cluster_keys != nullptr && o.cluster_keys->member().has_value()) {
    o.client_id = o.cluster_keys->member()->client_id;  // the id the credential registers
  }
  TransferFromFlags(o);
  o.transfer.tcp.encryption = problems.Take(
      "--data_encryption", transfer::ParseOnOff(absl::GetFlag(FLAGS_data_encryption)));
  GpuAndTierFromFlags(o);
  if (adjust) adjust(o);
  problems.Append(o.Validate());
  if (!daemon::Report("mc-client", problems)) return 2;
  daemon::RaiseFdLimit("client");
  ClientServer server(std::move(o));
  daemon::ServeHooks hooks;
  hooks.on_started = [&] {
    Logger("client").info("allocator: {}, checksums: {}", allocator, ChecksumImplementation());
  };
  return daemon::Serve("client", server, hooks);
}

}  // namespace mc::client
