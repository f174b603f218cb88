// mc-client: the mcstore per-host daemon (client_main.h).
#include "client/client_main.h"

int main(int argc, char** argv) { return mc::client::RunClientMain(argc, argv, MC_MALLOC_NAME); }
