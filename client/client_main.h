// mc-client's main, as a function: parses mc-client's flags (client_main.cc), validates them,
// runs a ClientServer until SIGINT/SIGTERM. `allocator` names the malloc the binary links (for
// the start-up log); `adjust` (optional) changes the options after the flags and before
// validation: tests/fakes builds mc-client-fakegpu with it.
#pragma once

#include <functional>

#include "client/client_options.h"

namespace mc::client {

int RunClientMain(int argc, char** argv, const char* allocator,
                  const std::function<void(ClientServerOptions&)>& adjust = {});

}  // namespace mc::client
