#include "transfer/rdma/handshake.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/status_macros.h"

namespace mc::transfer::rdma {

namespace {

constexpr size_t kQpBytes = 32;
constexpr size_t kSegmentBytes = 32;
constexpr uint64_t kMaxResponseBytes =
    8 + kMaxHandshakeQps * kQpBytes + uint64_t{kMaxHandshakeSegments} * kSegmentBytes;

template <typename T>
void Put(std::string& out, T v) {
  char b[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out.append(b, sizeof(T));
}

template <typename T>
T Get(const char*& p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<uint8_t>(p[i])) << (8 * i);
  p += sizeof(T);
  return v;
}

void PutQp(std::string& out, const QpAddress& a) {
  out.append(reinterpret_cast<const char*>(a.gid.data()), 16);
  Put<uint16_t>(out, a.lid);
  Put<uint16_t>(out, 0);
  Put<uint32_t>(out, a.qpn);
  Put<uint32_t>(out, a.psn);
  Put<uint32_t>(out, a.mtu);
}

QpAddress GetQp(const char*& p) {
  QpAddress a;
  std::memcpy(a.gid.data(), p, 16);
  p += 16;
  a.lid = Get<uint16_t>(p);
  Get<uint16_t>(p);
  a.qpn = Get<uint32_t>(p);
  a.psn = Get<uint32_t>(p);
  a.mtu = Get<uint32_t>(p);
  return a;
}

absl::Status Malformed(std::string_view what) {
  return McError(Code::kInvalidArgument, absl::StrCat("rdma handshake: ", std::string(what)));
}

}  // namespace

std::string EncodeConnectRequest(std::span<const QpAddress> qps,
                                 std::span<const uint32_t> retired) {
  std::string out;
  Put<uint32_t>(out, static_cast<uint32_t>(qps.size()));
  Put<uint32_t>(out, static_cast<uint32_t>(retired.size()));
  for (const QpAddress& a : qps) PutQp(out, a);
  for (uint32_t q : retired) Put<uint32_t>(out, q);
  return out;
}

absl::StatusOr<ConnectRequest> DecodeConnectRequest(std::string_view bytes) {
  if (bytes.size() < 8) return Malformed("short request");
  const char* p = bytes.data();
  const uint32_t qps = Get<uint32_t>(p);
  const uint32_t retired = Get<uint32_t>(p);
  if (qps > kMaxHandshakeQps || retired > kMaxHandshakeQps) return Malformed("too many QPs");
  if (bytes.size() != 8 + qps * kQpBytes + retired * 4u) return Malformed("request length");
  ConnectRequest out;
  for (uint32_t i = 0; i < qps; ++i) out.qps.push_back(GetQp(p));
  for (uint32_t i = 0; i < retired; ++i) out.retired.push_back(Get<uint32_t>(p));
  return out;
}

std::string EncodeHandshake(const PeerHandshake& handshake) {
  std::string out;
  Put<uint32_t>(out, static_cast<uint32_t>(handshake.qps.size()));
  Put<uint32_t>(out, static_cast<uint32_t>(handshake.segments.size()));
  for (const QpAddress& a : handshake.qps) PutQp(out, a);
  for (const auto& [id, seg] : handshake.segments) {
    Put<uint64_t>(out, id);
    Put<uint64_t>(out, seg.addr);
    Put<uint64_t>(out, seg.length);
    Put<uint32_t>(out, seg.rkey);
    Put<uint32_t>(out, 0);
  }
  return out;
}

absl::StatusOr<PeerHandshake> DecodeHandshake(std::string_view bytes) {
  if (bytes.size() < 8) return Malformed("short response");
  const char* p = bytes.data();
  const uint32_t qps = Get<uint32_t>(p);
  const uint32_t segments = Get<uint32_t>(p);
  if (qps > kMaxHandshakeQps) return Malformed("too many QPs");
  if (segments > kMaxHandshakeSegments) return Malformed("too many segments");
  if (bytes.size() != 8 + uint64_t{qps} * kQpBytes + uint64_t{segments} * kSegmentBytes) {
    return Malformed("response length");
  }
  PeerHandshake out;
  for (uint32_t i = 0; i < qps; ++i) out.qps.push_back(GetQp(p));
  for (uint32_t i = 0; i < segments; ++i) {
    const uint64_t id = Get<uint64_t>(p);
    RemoteSegment seg;
    seg.addr = Get<uint64_t>(p);
    seg.length = Get<uint64_t>(p);
    seg.rkey = Get<uint32_t>(p);
    Get<uint32_t>(p);
    if (seg.length > UINT64_MAX - seg.addr) return Malformed("segment wraps the address space");
    if (!out.segments.try_emplace(id, seg).second) return Malformed("duplicate segment");
  }
  return out;
}

absl::StatusOr<PeerHandshake> DataPlaneRdmaConnector::Connect(const std::string& endpoint,
                                                              std::span<const QpAddress> local,
                                                              std::span<const uint32_t> retired) {
  absl::StatusOr<std::string> answer = exchange_.Exchange(
      endpoint, DataOp::kRdmaConnect, EncodeConnectRequest(local, retired), kMaxResponseBytes);
  if (!answer.ok()) {
    return McError(ToCode(answer.status()),
                   absl::StrCat("rdma handshake: ", answer.status().message()));
  }
  return DecodeHandshake(*answer);
}

absl::Status ServeRdmaConnect(RdmaTransport& transport, const DataRequest& request,
                              RequestStream& stream) {
  constexpr uint64_t kMaxRequestBytes = 8 + 2 * kMaxHandshakeQps * kQpBytes;
  if (request.length > kMaxRequestBytes) {
    return Malformed("request too long");  // closes the connection
  }
  std::string body(request.length, '\0');
  MC_RETURN_IF_ERROR(stream.ReadExact(body.data(), body.size()));
  auto decoded = DecodeConnectRequest(body);
  if (!decoded.ok()) return decoded.status();
  auto answer = transport.Accept(decoded->qps, decoded->retired);
  if (!answer.ok()) return stream.Respond(Code::kUnavailable);
  std::string out = EncodeHandshake(*answer);
  iovec iov{out.data(), out.size()};
  return stream.Respond(Code::kOk, std::span<const iovec>(&iov, 1));
}

}  // namespace mc::transfer::rdma
