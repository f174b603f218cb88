// FastStoreCalls: the Store calls the fast channel (fast_channel.h) serves, for a caller the
// channel identified at ATTACH instead of a grpc::ServerContext. StoreGrpcService implements it
// with the same admission (session liveness, account, CallerLimits) and the same handler bodies
// as its gRPC methods; tests and the fuzz target use fakes. Implementations are thread-safe.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "mcstore/v1/store.pb.h"

namespace mc::client {

// The caller of a fast-channel call: the owner token it attached with (an fd session's), or
// empty for the anonymous Unix caller ("anon:unix", as a gRPC call over the Unix socket without
// x-mc-owner). Whether the token's session is still live is checked at every call.
struct FastCaller {
  std::string token;
};

class FastStoreCalls {
 public:
  virtual ~FastStoreCalls() = default;
  virtual grpc::Status BatchPut(const FastCaller& caller, const mcstore::v1::BatchPutRequest* req,
                                mcstore::v1::BatchPutResponse* resp) = 0;
  virtual grpc::Status BatchGet(const FastCaller& caller, const mcstore::v1::BatchGetRequest* req,
                                mcstore::v1::BatchGetResponse* resp) = 0;
  virtual grpc::Status BatchExist(const FastCaller& caller,
                                  const mcstore::v1::BatchExistRequest* req,
                                  mcstore::v1::BatchExistResponse* resp) = 0;
  virtual grpc::Status MatchPrefix(const FastCaller& caller,
                                   const mcstore::v1::MatchPrefixRequest* req,
                                   mcstore::v1::MatchPrefixResponse* resp) = 0;
  virtual grpc::Status ReleaseLease(const FastCaller& caller,
                                    const mcstore::v1::ReleaseLeaseRequest* req,
                                    mcstore::v1::ReleaseLeaseResponse* resp) = 0;
  virtual grpc::Status BatchRemove(const FastCaller& caller,
                                   const mcstore::v1::BatchRemoveRequest* req,
                                   mcstore::v1::BatchRemoveResponse* resp) = 0;
};

}  // namespace mc::client
