// mc-client-fakegpu: mc-client on the shm-backed fake CUDA device (shm_fake_cuda.h), for the
// Python and vLLM tests of GPU buffers on machines without a GPU. Tests only: not installed.
#include "client/client_main.h"
#include "common/logging.h"
#include "tests/fakes/shm_fake_cuda.h"

int main(int argc, char** argv) {
  return mc::client::RunClientMain(
      argc, argv, MC_MALLOC_NAME, [](mc::client::ClientServerOptions& o) {
        o.transfer.cuda.api_factory = [] { return mc::transfer::cuda::MakeShmFakeCudaApi(); };
        mc::Logger("client").warn("TEST BUILD: the CUDA device is a fake on host shared memory");
      });
}
